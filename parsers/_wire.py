"""The protobuf wire format, read without generated classes: varints and a message's fields.

TensorBoard's event files are decoded with these alone; the W&B reader uses them to tell a
record's kind before deciding to decode it with wandb's own classes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["fields", "varint"]


def varint(buf: memoryview | bytes, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and where the next field begins.

    Raises:
        IndexError: the buffer ends inside it. ValueError: longer than 64 bits.
    """
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def fields(buf: memoryview) -> Iterator[tuple[int, int, Any]]:
    """``(field number, wire type, value)`` of each field of a message: ints for varints,
    memoryviews for the rest.

    Raises:
        IndexError, ValueError: the bytes are no protobuf message (cut short, a group, junk).
    """
    pos, end = 0, len(buf)
    while pos < end:
        tag, pos = varint(buf, pos)
        wire = tag & 7
        if wire == 0:
            value, pos = varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos : pos + 8], pos + 8
        elif wire == 2:
            size, pos = varint(buf, pos)
            value, pos = buf[pos : pos + size], pos + size
        elif wire == 5:
            value, pos = buf[pos : pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if pos > end:
            raise ValueError("field runs past the end of its message")
        yield tag >> 3, wire, value
