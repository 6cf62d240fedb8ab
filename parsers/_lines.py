"""Physical lines of a log file as a frame: ``line`` (1-based) and ``text``.

The fast path is Polars' native line scanner. Files it cannot take (gzip, invalid UTF-8)
go through a chunked reader that decodes lossily, so damaged logs still yield every line
with its true line number.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import polars as pl

CHUNK_BYTES = 64 << 20

#: Colour and cursor escape sequences (colorlog writes them into files too).
ANSI = r"\x1b\[[0-9;?]*[A-Za-z]"


def scan_lines(path: Path) -> pl.LazyFrame:
    """Lazily scan ``path`` as ``line`` (Int64, 1-based) and ``text`` columns (UTF-8 only)."""
    return pl.scan_lines(
        path, name="text", row_index_name="line", row_index_offset=1, glob=False
    ).with_columns(pl.col("line").cast(pl.Int64))


def iter_line_chunks(path: Path, chunk_bytes: int = CHUNK_BYTES) -> Iterator[pl.LazyFrame]:
    """Yield the lines of ``path`` in chunks, gzip-aware, undecodable bytes replaced."""
    first_line = 1
    rest = b""
    with _open(path) as fh:
        while True:
            block = fh.read(chunk_bytes)
            data = rest + block
            if not block:
                if data:
                    yield _chunk_frame(data, first_line)
                return
            cut = data.rfind(b"\n")
            if cut < 0:
                rest = data
                continue
            head, rest = data[: cut + 1], data[cut + 1 :]
            frame = _chunk_frame(head[:-1], first_line)
            first_line += head.count(b"\n")
            yield frame


def _chunk_frame(data: bytes, first_line: int) -> pl.LazyFrame:
    texts = data.decode("utf-8", errors="replace").split("\n")
    return (
        pl.LazyFrame({"text": texts})
        .with_row_index("line", offset=first_line)
        .with_columns(pl.col("line").cast(pl.Int64), pl.col("text").str.strip_suffix("\r"))
    )


class _GzipTolerant:
    """A gzip reader that ends quietly where the stream is torn (a log gzipped while being cut)."""

    def __init__(self, path: Path) -> None:
        self._fh = open(path, "rb")  # noqa: SIM115 - closed in __exit__
        self._inflate = zlib.decompressobj(47)  # gzip header, multi-member handled below
        self._done = False

    def read(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n and not self._done:
            raw = self._inflate.unconsumed_tail or self._fh.read(1 << 20)
            if not raw:
                self._done = True
                break
            try:
                out += self._inflate.decompress(raw, n - len(out))
            except zlib.error:  # corrupt or truncated member: keep what was inflated
                self._done = True
                break
            if self._inflate.eof:  # next gzip member, if any (concatenated .gz files)
                unused = self._inflate.unused_data
                self._inflate = zlib.decompressobj(47)
                if unused:
                    out += self._inflate.decompress(unused, max(1, n - len(out)))
        return bytes(out)

    def __enter__(self) -> _GzipTolerant:
        return self

    def __exit__(self, *exc: object) -> None:
        self._fh.close()


def _open(path: Path) -> Any:
    return _GzipTolerant(path) if _is_gzip(path) else open(path, "rb")  # noqa: SIM115


def _is_gzip(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == b"\x1f\x8b"


def collect_lines(
    path: Path, extract: Callable[[pl.LazyFrame], dict[str, pl.LazyFrame]]
) -> dict[str, pl.DataFrame]:
    """Run ``extract`` (line-local work only) over all lines of ``path``.

    ``extract`` maps a lines frame to named lazy results; on the fast path they are
    collected together, otherwise chunk by chunk and concatenated.
    """
    if not _is_gzip(path):
        parts = extract(scan_lines(path))
        try:
            frames = pl.collect_all(list(parts.values()))
            return dict(zip(parts, frames, strict=True))
        except pl.exceptions.ComputeError as exc:
            if "utf" not in str(exc).lower():
                raise
    pieces: dict[str, list[pl.DataFrame]] = {}
    for chunk in iter_line_chunks(path):
        parts = extract(chunk)
        for name, frame in zip(parts, pl.collect_all(list(parts.values())), strict=True):
            pieces.setdefault(name, []).append(frame)
    if not pieces:  # an empty gzip member: no chunk at all, but the extract's frames (empty) still
        empty = pl.LazyFrame(schema={"line": pl.Int64, "text": pl.String})
        parts = extract(empty)
        return dict(zip(parts, pl.collect_all(list(parts.values())), strict=True))
    return {name: pl.concat(frames) for name, frames in pieces.items()}


def sniff(path: Path, n_bytes: int = 1 << 20) -> str:
    """The first ``n_bytes`` of ``path`` (decompressed, lossily decoded) for format detection."""
    with _open(path) as fh:
        return fh.read(n_bytes).decode("utf-8", errors="replace")
