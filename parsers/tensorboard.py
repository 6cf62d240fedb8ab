"""TensorBoard event files (``events.out.tfevents.*``) → a metric frame, without TensorFlow.

An event file is a TFRecord stream: ``<Q length><I masked crc32c of length><data><I masked
crc32c of data>``; each ``data`` is an ``Event`` protobuf. Only the fields a scalar needs are
decoded: ``Event{1 wall_time double, 2 step int64, 5 summary}``, ``Summary{1 value}``,
``Value{1 tag, 2 simple_value float, 8 tensor, 9 metadata{1 plugin_data{1 plugin_name}}}``.

Scalars come in two encodings: ``simple_value`` (tensorboardX, torch's default ``add_scalar``)
and a one-element tensor tagged with the ``scalars`` plugin (torch ``new_style=True``,
TF2 ``tf.summary.scalar``; TF2 writes the plugin metadata only with a tag's first value).
Histograms, text and images are skipped. Values are float32 as written (0.55 reads back as
0.550000011920929); NaN and ±Inf are kept.

A restarted writer adds a new file to the same folder, repeating steps: files are ordered by
their first ``wall_time`` and the later file's value wins. Events in a sub-folder (torch/
tensorboardX ``add_scalars``) get the folder as a key prefix: ``loss/train/loss``.
Keys are relative to the deepest folder holding all files read, so sibling run folders read
together are told apart by their folder name. ``line`` holds the 1-based record index in its file.

Example:
    >>> run = read_tensorboard(Path("tensorboard_log/gsm8k/exp1"))  # doctest: +SKIP
    >>> run.metrics.filter(pl.col("key") == "critic/score/mean")  # doctest: +SKIP
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import polars as pl

from parsers.schema import METRIC_SCHEMA, conform, empty

__all__ = ["TensorboardRun", "find_event_files", "read_tensorboard"]

EVENT_FILE_MARK = "tfevents"
_F32, _F64, _U64 = struct.Struct("<f"), struct.Struct("<d"), struct.Struct("<Q")
# TensorProto dtype → (element size, struct format) for tensor_content
_DTYPES = {1: (4, "<f"), 2: (8, "<d"), 3: (4, "<i"), 9: (8, "<q"), 19: (2, "<e")}


@dataclass(frozen=True)
class TensorboardRun:
    """The scalars of one TensorBoard log folder (or one event file)."""

    path: str
    files: tuple[str, ...]
    metrics: pl.DataFrame
    notes: tuple[str, ...] = ()
    records_read: int = 0
    records_skipped: int = 0


def find_event_files(root: Path | str) -> list[Path]:
    """Every ``*tfevents*`` file under ``root`` (or ``root`` itself), symlinks not followed."""
    root = Path(root)
    if root.is_file():
        return [root] if EVENT_FILE_MARK in root.name else []
    found = [
        Path(dirpath) / name
        for dirpath, _, names in os.walk(root)
        for name in names
        if EVENT_FILE_MARK in name and not name.endswith((".tmp", ".lock"))
    ]
    return sorted(found)


def read_tensorboard(path_or_dir: Path | str) -> TensorboardRun:
    """All scalars of an event file or of every event file under a folder; damage goes to ``notes``."""
    root = Path(path_or_dir)
    files = find_event_files(root)
    # Keys are relative to the deepest folder holding every file: a run folder's own events get
    # bare tags whichever parent was given, add_scalars sub-folders and sibling runs a prefix.
    base = Path(os.path.commonpath([f.parent for f in files])) if files else root
    notes: list[str] = []
    frames: list[tuple[float, pl.DataFrame]] = []
    read = skipped = 0
    plugins: dict[str, dict[str, str]] = {}
    for file in files:
        prefix = file.parent.relative_to(base).as_posix()
        prefix = "" if prefix == "." else prefix + "/"
        columns: dict[str, list[Any]] = {"step": [], "wall": [], "key": [], "value": [], "line": []}
        first_wall = None
        try:
            data = file.read_bytes()
        except OSError as exc:
            notes.append(f"{file.name}: cannot read: {exc.strerror}")
            continue
        for index, record in _records(data, file.name, notes):
            try:
                wall, step, values = _event(record)
                found = list(_scalars(values, plugins.setdefault(prefix, {})))
            except (ValueError, IndexError, struct.error):
                skipped += 1
                continue
            read += 1
            first_wall = wall if first_wall is None else first_wall
            for tag, value in found:
                columns["step"].append(step)
                columns["wall"].append(wall)
                columns["key"].append(prefix + tag)
                columns["value"].append(value)
                columns["line"].append(index)
        frame = pl.DataFrame(
            columns, schema={"step": pl.Int64, "wall": pl.Float64, "key": pl.String, "value": pl.Float64, "line": pl.Int64}
        ).with_columns(pl.lit(str(file)).alias("file"))
        frames.append((first_wall if first_wall is not None else float("inf"), frame))
    if not files:
        notes.append("no event files")
    frames.sort(key=lambda item: item[0])
    metrics = _later_wins([f for _, f in frames], notes)
    return TensorboardRun(str(root), tuple(str(f) for f in files), metrics, tuple(notes), read, skipped)


def _later_wins(frames: list[pl.DataFrame], notes: list[str]) -> pl.DataFrame:
    if not frames:
        return empty(METRIC_SCHEMA)
    stacked = pl.concat([f.with_columns(pl.lit(i).alias("order")) for i, f in enumerate(frames)])
    repeated = stacked.filter(pl.col("order").n_unique().over("step", "key") > 1).select("step").n_unique()
    if repeated:
        notes.append(f"{repeated} steps were written again by a later file (a restart); the later values are kept")
    kept = stacked.unique(["step", "key"], keep="last", maintain_order=True).sort("step", "order", "line")
    walls = kept["wall"].unique()
    times = pl.DataFrame({"wall": walls, "time": pl.Series([_local(w) for w in walls], dtype=pl.Datetime("us"))})
    return conform(kept.join(times, on="wall", how="left", maintain_order="left"), METRIC_SCHEMA)


def _local(wall: float) -> datetime | None:
    try:
        return datetime.fromtimestamp(wall)
    except (ValueError, OverflowError, OSError):
        return None


def _records(data: bytes, name: str, notes: list[str]) -> Iterator[tuple[int, memoryview]]:
    """``(1-based index, data)`` of each record; stops at a torn or corrupt one, saying so."""
    view = memoryview(data)
    pos = index = 0
    while pos < len(data):
        if pos + 12 > len(data):
            notes.append(f"{name}: torn last record ({len(data) - pos} bytes of its header)")
            return
        header = view[pos : pos + 8]
        if _masked_crc32c(header) != int.from_bytes(view[pos + 8 : pos + 12], "little"):
            notes.append(f"{name}: not a TFRecord stream from byte {pos} on (bad length checksum); the rest was skipped")
            return
        (length,) = _U64.unpack_from(header)
        if pos + 16 + length > len(data):
            notes.append(f"{name}: torn last record ({len(data) - pos - 12} of {length + 4} bytes; killed mid-write?)")
            return
        index += 1
        yield index, view[pos + 12 : pos + 12 + length]
        pos += 16 + length


def _event(record: memoryview) -> tuple[float, int, list[memoryview]]:
    wall, step, values = 0.0, 0, []
    for number, _, value in _fields(record):
        if number == 1:
            wall = _F64.unpack(value)[0]
        elif number == 2:
            step = value - (1 << 64) if value >= 1 << 63 else value
        elif number == 5:
            values = [v for n, _, v in _fields(value) if n == 1]
    return wall, step, values


def _scalars(values: list[memoryview], plugins: dict[str, str]) -> Iterator[tuple[str, float]]:
    """``(tag, value)`` of each scalar summary value; ``plugins`` remembers each tag's plugin."""
    for raw in values:
        tag, simple, tensor = "", None, None
        for number, _, value in _fields(raw):
            if number == 1:
                tag = bytes(value).decode("utf-8", "replace")
            elif number == 2:
                simple = _F32.unpack(value)[0]
            elif number == 8:
                tensor = value
            elif number == 9:
                plugin = _first(_first(value, 1), 1)
                if plugin is not None:
                    plugins[tag] = bytes(plugin).decode("utf-8", "replace")
        if simple is not None:
            yield tag, simple
        elif tensor is not None and plugins.get(tag, "scalars") == "scalars":
            scalar = _tensor_scalar(tensor)
            if scalar is not None:
                yield tag, scalar


def _tensor_scalar(tensor: memoryview) -> float | None:
    """The value of a one-element float/int TensorProto, else None (strings, histograms…)."""
    fields: dict[int, Any] = {}
    for number, _, value in _fields(tensor):
        fields.setdefault(number, value)
    dtype = fields.get(1, 0)
    shape = fields.get(2)
    if shape is not None and any(_first(dim, 1) not in (None, 1) for n, _, dim in _fields(shape) if n == 2):
        return None
    if 4 in fields:
        size, fmt = _DTYPES.get(dtype, (0, ""))
        return float(struct.unpack(fmt, fields[4])[0]) if size and len(fields[4]) == size else None
    for number, unpack in ((5, _F32), (6, _F64)):  # float_val, double_val: packed or not, bytes either way
        if number in fields:
            return float(unpack.unpack_from(fields[number])[0])
    for number in (7, 10):  # int_val, int64_val: packed varints or one varint
        if number in fields:
            raw = fields[number]
            value = _varint(raw, 0)[0] if isinstance(raw, memoryview) else raw
            return float(value - (1 << 64) if value >= 1 << 63 else value)
    return None


def _first(message: memoryview | None, number: int) -> Any:
    if message is None:
        return None
    return next((value for n, _, value in _fields(message) if n == number), None)


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
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


def _fields(buf: memoryview) -> Iterator[tuple[int, int, Any]]:
    """``(field number, wire type, value)``: ints for varints, memoryviews for the rest."""
    pos, end = 0, len(buf)
    while pos < end:
        tag, pos = _varint(buf, pos)
        wire = tag & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos : pos + 8], pos + 8
        elif wire == 2:
            size, pos = _varint(buf, pos)
            value, pos = buf[pos : pos + size], pos + size
        elif wire == 5:
            value, pos = buf[pos : pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if pos > end:
            raise ValueError("field runs past the end of its message")
        yield tag >> 3, wire, value


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC32C = _crc32c_table()


def _masked_crc32c(data: memoryview) -> int:
    """TFRecord's masked CRC32C; only run on the 8 length bytes (the data CRC is not checked)."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
