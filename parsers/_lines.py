"""Physical lines of a log file as frames: ``line`` (1-based) and ``text``.

Files are read in blocks of whole lines, a few in flight at a time, so no file is ever held
whole; Polars splits each block into lines. Blocks it cannot take (invalid UTF-8) are decoded
lossily, and compressed logs (gzip, xz, bzip2, zstd: what logrotate's ``compresscmd`` may be)
are inflated as they are read, so damaged logs still yield every line with its true line number.
A line longer than :data:`LONG_LINE` (a request payload dumped whole) keeps only its head and
tail, joined by a marker that says how much was left out, so one line never costs more memory
than a block.
"""

from __future__ import annotations

import bz2
import contextlib
import lzma
import os
import re
import shutil
import subprocess
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import polars as pl

CHUNK_BYTES = 64 << 20
#: Bytes per batch of :func:`line_batch_pieces`: small enough that memory stays flat as files
#: grow, large enough that the per-batch overhead is noise.
BATCH_BYTES = 16 << 20
#: For passes that hold several copies of a batch's text at once (Ray's tagging pass): half, so
#: a session's peak stays below what reading its files whole took, at the same speed.
HEAVY_BATCH_BYTES = 8 << 20
IN_FLIGHT = 2
#: The end of a block read first, to find where its last whole line ends: the block itself is
#: then read to exactly there, not read whole and sliced (a copy made holding the GIL).
_PROBE = 64 << 10
FrameT = TypeVar("FrameT", pl.DataFrame, pl.LazyFrame)

#: Lines longer than this keep their first ``LINE_HEAD`` and last ``LINE_TAIL`` bytes: a line's
#: time, level and message lead, and the error a payload dump ends with ("Last error: …").
LONG_LINE = 1 << 20
LINE_HEAD = 64 << 10
LINE_TAIL = 16 << 10
#: Terminal escape sequences (colorlog writes colours into files too): colours and cursor moves
#: (CSI), titles and links (OSC, to BEL or ST, or the line's end), and the two-byte ones.
ANSI = r"\x1b(?:\[[0-9;?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])"


def cleaned(text: pl.Expr) -> pl.Expr:
    """A line as a message: colour codes and trailing blanks out, and of a line a progress bar
    redrew with ``\\r``, only what follows the last (as a terminal shows it)."""
    return text.str.replace_all(ANSI, "").str.strip_chars_end().str.replace(r"^.*\r", "")


def lines_at(path: Path | str, numbers: pl.Series) -> pl.DataFrame:
    """``line`` and ``text`` of the lines of ``path`` numbered ``numbers`` (see :func:`iter_lines_at`)."""
    return pl.concat([pl.DataFrame(schema={"line": pl.Int64, "text": pl.String}), *iter_lines_at(path, numbers)])


def iter_lines_at(path: Path | str, numbers: pl.Series) -> Iterator[pl.DataFrame]:
    """``line`` and ``text`` of the lines of ``path`` numbered ``numbers``, a block of the file at
    a time, as the readers read them (gzip-aware, invalid bytes replaced, long lines cut), in one
    pass that stops after the last one wanted. Lines the file no longer has (gone, shorter) are
    not yielded."""
    wanted = numbers.cast(pl.Int64).drop_nulls().unique().sort()
    if wanted.is_empty():
        return
    last = int(wanted[-1])
    try:
        with contextlib.closing(_numbered_blocks(Path(path), int(wanted[0]))) as blocks:
            for first, data in blocks:
                # (a block holding no wanted line is only counted)
                n = _line_count(data)
                lo, hi = wanted.search_sorted(first), wanted.search_sorted(first + n - 1, side="right")
                if hi > lo:
                    texts = _numbered(_texts(data), first)
                    yield texts.join(wanted.slice(lo, hi - lo).to_frame("line"), on="line", how="semi")
                if first + n > last:
                    return
    except OSError:
        return  # (what was read stands; the rest is missing)


#: Where blocks of plain logs began when lines were read back: per file (device and inode), each
#: block's first line → its offset and the bytes just before it. A line deep in a log of gigabytes is
#: then read from near it, not from the top (each poll of ``watch``, each line an analysis quotes);
#: a rewritten file no longer has those bytes there, and is read from the top.
_MARKS: dict[tuple[int, int], dict[int, tuple[int, bytes]]] = {}
_MARK_BYTES = 64


def _numbered_blocks(path: Path, line: int) -> Iterator[tuple[int, bytes]]:
    """The blocks of ``path`` as :func:`_line_blocks` reads them, each with its first line's
    number: of a plain file, from the last block marked (see :data:`_MARKS`) at or before ``line``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if _codec(os.pread(fd, _MAGIC_BYTES, 0)):  # (compressed: no seeking, from the top)
            first = 1
            for data in _line_blocks(path, BATCH_BYTES):
                yield first, data
                first += _line_count(data)
            return
        stat = os.fstat(fd)
        marks = _MARKS.setdefault((stat.st_dev, stat.st_ino), {})
        first, offset = 1, 0
        for at_line in sorted((m for m in marks if m <= line), reverse=True):
            at, before = marks[at_line]
            if os.pread(fd, len(before), at - len(before)) == before:
                first, offset = at_line, at
                break
        for at, data in _positioned_blocks(fd, BATCH_BYTES, offset):
            if at == 0:
                data = _file_start(data)
            elif at >= _MARK_BYTES and first not in marks:
                marks[first] = (at, os.pread(fd, _MARK_BYTES, at - _MARK_BYTES))
            yield first, data
            first += _line_count(data)
    finally:
        os.close(fd)


def _line_count(data: bytes) -> int:
    """The lines of a block as Polars splits them (a last one without its newline counts)."""
    return data.count(b"\n") + (not data.endswith(b"\n"))


def iter_line_chunks(path: Path, chunk_bytes: int = CHUNK_BYTES) -> Iterator[pl.LazyFrame]:
    """Yield the lines of ``path`` in chunks, gzip-aware, undecodable bytes replaced."""
    first = 1
    for data in _line_blocks(path, chunk_bytes):
        texts = _texts(data)
        yield _numbered(texts.lazy(), first)
        first += texts.height


#: What was wrong with a compressed log's stream when it was last read, by path (see :func:`stream_damage`).
_damage: dict[str, str] = {}


def ends_mid_line(path: Path | str | None) -> bool:
    """Whether the plain log at ``path`` ends inside a line: no newline after its last one (still
    being written, or cut off while it was). A compressed log is written whole (see :func:`stream_damage`)."""
    try:
        with open(path or "", "rb") as log:
            if _codec(log.read(_MAGIC_BYTES)):
                return False
            size = log.seek(0, os.SEEK_END)
            if not size:
                return False
            log.seek(size - 1)
            return log.read(1) != b"\n"
    except OSError:
        return False


def stream_damage(path: Path | str) -> str | None:
    """Why reading compressed ``path`` stopped before its end the last time it was read to the end
    (cut off mid-stream, corrupt), or ``None``: whole, or not compressed."""
    return _damage.get(str(path))


class _Tolerant:
    """What the readers of compressed logs share: a text position, bytes read ahead, damage said."""

    _codec = ""
    _path = ""
    _text = 0
    _salvaged = b""  # inflated beyond what the last read asked for, handed out first

    def read(self, n: int) -> bytes:
        raise NotImplementedError

    def skip_zeros(self) -> None:
        """Go past the zeros the text starts with (a ``copytruncate`` hole, compressed with its log)."""
        while chunk := self.read(1 << 20):
            if rest := chunk.lstrip(b"\0"):
                self._salvaged, self._text = rest + self._salvaged, self._text - len(rest)
                return

    def _say(self, what: str) -> None:
        _damage[self._path] = f"{self._codec} stream {what}"

    def _cut_off(self, text: int) -> None:
        self._say(f"cut off after {text:,} bytes of text (the file ends mid-stream): the rest of the log is missing")

    def _corrupt(self, text: int) -> None:
        self._say(f"corrupt after {text:,} bytes of text: the rest of the file was skipped")

    def __enter__(self) -> _Tolerant:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        raise NotImplementedError


class _GzipTolerant(_Tolerant):
    """A gzip reader that ends quietly where the stream is torn or corrupt (a log gzipped while
    being cut), and says so in :func:`stream_damage`."""

    _codec = "gzip"

    def __init__(self, path: Path) -> None:
        self._path = str(path)
        self._fh = open(path, "rb")  # noqa: SIM115 - closed in close()
        self._inflate = zlib.decompressobj(47)  # gzip header, multi-member handled below
        self._fed = False  # the current member has had bytes: the file must not end before its end
        self._next = b""  # bytes after a member's end: the next member, if any
        self._text = 0
        self._salvaged = b""  # inflated before a corrupt spot, beyond what the last read asked for
        self._done = False
        _damage.pop(self._path, None)

    def read(self, n: int) -> bytes:
        out, self._salvaged = bytearray(self._salvaged[:n]), self._salvaged[n:]
        while len(out) < n and not self._done:
            raw = self._inflate.unconsumed_tail or self._next or self._fh.read(1 << 20)
            self._next = b""
            if not raw:
                self._done = True
                if self._fed:
                    self._cut_off(self._text + len(out))
                break
            self._fed = True
            before = self._inflate.copy()
            try:
                out += self._inflate.decompress(raw, n - len(out))
            except zlib.error:  # corrupt: keep what was inflated before the bad bytes
                self._done = True
                rest, take = _inflate_until_error(before, raw), n - len(out)
                self._corrupt(self._text + len(out) + len(rest))
                out += rest[:take]
                self._salvaged = rest[take:]
                break
            if self._inflate.eof:  # next gzip member, if any (concatenated .gz files); zeros pad some
                self._next = self._inflate.unused_data.lstrip(b"\0")
                self._inflate = zlib.decompressobj(47)
                self._fed = False
        self._text += len(out)
        return bytes(out)

    def close(self) -> None:
        self._fh.close()


class _StreamTolerant(_Tolerant):
    """An xz, bzip2 or zstd reader that ends quietly where the stream is torn or corrupt, and says
    so in :func:`stream_damage`. zstd is read by the ``zstd`` program (Python 3.11 has no module
    for it); where none is installed, opening raises ``OSError`` saying so."""

    _PIECE = 1 << 16  # (a failed read loses what it had inflated: read in small pieces)

    def __init__(self, path: Path, codec: str) -> None:
        self._path, self._codec, self._done, self._text, self._proc = str(path), codec, False, 0, None
        _damage.pop(self._path, None)
        if codec == "zstd":
            program = shutil.which("zstd")
            if program is None:
                raise OSError(0, "compressed with zstd, and no zstd program is installed here to read it (zstd -d it first)")
            self._proc = subprocess.Popen([program, "-dcq", "--", self._path], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            self._fh: Any = self._proc.stdout
        else:
            self._fh = (lzma.open if codec == "xz" else bz2.open)(path, "rb")  # (both read concatenated streams)

    def read(self, n: int) -> bytes:
        out, self._salvaged = bytearray(self._salvaged[:n]), self._salvaged[n:]
        while len(out) < n and not self._done:
            try:
                piece = self._fh.read(min(self._PIECE, n - len(out)))
            except EOFError:  # (lzma, bz2: the file ends mid-stream)
                self._done = True
                self._cut_off(self._text + len(out))
                break
            except (lzma.LZMAError, OSError):
                self._done = True
                self._corrupt(self._text + len(out))
                break
            if not piece:
                self._done = True
                if self._proc is not None and self._proc.wait() != 0:
                    why = self._proc.stderr.read().decode(errors="replace").strip().splitlines()
                    self._say(f"unreadable after {self._text + len(out):,} bytes of text ({why[-1] if why else 'zstd failed'}): the rest of the file was skipped")
                break
            out += piece
        self._text += len(out)
        return bytes(out)

    def close(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc.stderr.close()
        self._fh.close()


def _inflate_until_error(inflate: Any, raw: bytes, piece: int = 4096) -> bytes:
    """What ``inflate`` makes of ``raw`` fed a piece at a time, up to the piece zlib fails on: a
    failed call returns nothing, so one call for the whole chunk would lose all it had inflated."""
    out = bytearray()
    for start in range(0, len(raw), piece):
        try:
            out += inflate.decompress(raw[start : start + piece])
        except zlib.error:
            break
        if inflate.eof:
            break
    return bytes(out)


def open_log(path: Path) -> Any:
    """``path`` opened for bytes, plain or compressed (known by its magic bytes, read up to a tear)."""
    codec = compression(path)
    if codec is None:
        return open(path, "rb")  # noqa: SIM115
    return _GzipTolerant(path) if codec == "gzip" else _StreamTolerant(path, codec)


#: Compressed logs by their first bytes: what logrotate's ``compresscmd`` may be (bzip2's block
#: magic after its level, so a line starting "BZh" is no bzip2 stream).
_MAGIC = {"gzip": re.compile(rb"\x1f\x8b"), "xz": re.compile(rb"\xfd7zXZ\x00"),
          "bzip2": re.compile(rb"BZh[1-9]1AY&SY"), "zstd": re.compile(rb"\x28\xb5\x2f\xfd")}
_MAGIC_BYTES = 10


def _codec(head: bytes) -> str | None:
    return next((codec for codec, magic in _MAGIC.items() if magic.match(head)), None)


def compression(path: Path) -> str | None:
    """How ``path`` is compressed (``gzip``, ``xz``, ``bzip2``, ``zstd``), or ``None`` for a plain
    file (raises ``OSError`` when it cannot be read)."""
    with open(path, "rb") as fh:
        return _codec(fh.read(_MAGIC_BYTES))


def is_compressed(path: Path) -> bool:
    """Whether ``path`` is compressed: read from the top, never from the middle."""
    return compression(path) is not None


def collect_lines(
    path: Path,
    extract: Callable[[pl.LazyFrame], dict[str, pl.LazyFrame]],
    stitch: Callable[[dict[str, list[pl.DataFrame]]], dict[str, pl.DataFrame]] | None = None,
    *,
    heavy: bool = False,
    finish: Callable[[dict[str, pl.DataFrame]], dict[str, pl.DataFrame]] | None = None,
) -> dict[str, pl.DataFrame]:
    """Run ``extract`` over the lines of ``path`` (plain or gzipped, of any size), batch by batch.

    Memory is bounded by the batches in flight and what ``extract`` keeps, never by the file (a
    worker's ``.err`` can reach gigabytes). Line-local results are concatenated in file order. An
    ``extract`` that carries state from line to line (runs, forward fills) within its batch
    passes ``stitch``: it gets each part's frames, one per batch in file order, and joins them as
    one pass over the whole file would have. ``heavy`` extracts get smaller batches; ``finish``
    reduces each batch's results further, in its own thread (see :func:`line_batch_pieces`).
    """
    pieces = line_batch_pieces(path, extract, HEAVY_BATCH_BYTES if heavy else None, finish)
    if stitch is not None:
        return stitch(pieces)
    return {name: pl.concat(frames) for name, frames in pieces.items()}


def line_batch_pieces(
    path: Path,
    extract: Callable[[pl.LazyFrame], dict[str, pl.LazyFrame]],
    batch_bytes: int | None = None,
    finish: Callable[[dict[str, pl.DataFrame]], dict[str, pl.DataFrame]] | None = None,
) -> dict[str, list[pl.DataFrame]]:
    """Like :func:`collect_lines`, in batches of whole lines: ``extract``'s results for each
    batch, in file order (a list per result), so a caller can let them go one by one. Besides the
    two batches in flight, only those (reduced) results are held, so the file's text never is at once.
    ``finish`` may shrink each batch's collected results further, in the batch's own thread.

    ``extract`` must be line-local: batch boundaries fall between any two lines. Two batches are
    in flight at a time (Polars releases the GIL), which keeps both cores busy where one batch's
    plan would not.
    """
    size = batch_bytes or BATCH_BYTES
    pieces: dict[str, list[pl.DataFrame]] = {}

    def run(data: bytes, before: Future[int] | None, after: Future[int]) -> dict[str, pl.DataFrame]:
        # A batch learns its first line number from the batch before it, as soon as that one has
        # split its lines: counting newlines up front would cost a pass over the bytes under the GIL.
        try:
            texts = _texts(data)
            first = before.result() if before is not None else 1
        except BaseException as exc:
            after.set_exception(exc)
            raise
        after.set_result(first + texts.height)
        return reduced(_numbered(texts.lazy(), first))

    def reduced(lines: pl.LazyFrame) -> dict[str, pl.DataFrame]:
        parts = extract(lines)
        # Each result in one chunk: concatenated, a result's columns are then cut alike, which
        # spares every later eager filter a copy of the whole (Polars' threads cut them apart).
        done = {name: frame.rechunk() for name, frame in zip(parts, pl.collect_all(list(parts.values())), strict=True)}
        return finish(done) if finish is not None else done

    def keep(done: Future[dict[str, pl.DataFrame]]) -> None:
        for name, frame in done.result().items():
            pieces.setdefault(name, []).append(frame)

    with ThreadPoolExecutor(IN_FLIGHT) as pool:
        in_flight: list[Future[dict[str, pl.DataFrame]]] = []
        before: Future[int] | None = None
        for data in _line_blocks(path, size):
            after: Future[int] = Future()
            in_flight.append(pool.submit(run, data, before, after))
            before = after
            if len(in_flight) == IN_FLIGHT:
                keep(in_flight.pop(0))
        for done in in_flight:
            keep(done)
    if not pieces:  # an empty file: no batch at all, but the extract's (empty) frames still
        return {name: [frame] for name, frame in reduced(pl.LazyFrame(schema={"line": pl.Int64, "text": pl.String})).items()}
    return pieces


def line_frames(path: Path, batch_bytes: int | None = None) -> Iterator[pl.DataFrame]:
    """The lines of ``path`` as ``line``/``text`` frames of about ``batch_bytes`` each, in order
    (UTF-8 only: invalid bytes raise ``ComputeError``; :func:`line_batch_pieces` decodes them lossily)."""
    first = 1
    for data in _line_blocks(path, batch_bytes or BATCH_BYTES):
        texts = _shortened(pl.read_lines(data, name="text"))
        yield _numbered(texts, first)
        first += texts.height


def only_block(path: Path, size: int) -> bytes | None:
    """All of ``path`` (decompressed) when it is one block of at most ``size`` bytes, as
    :func:`line_batch_pieces` would read it; ``None`` when it is more (or nothing)."""
    with contextlib.closing(_line_blocks(path, size)) as found:
        block = next(found, None)
        return None if block is None or next(found, None) is not None else block


def lines_of_blocks(blocks: dict[int, bytes]) -> pl.DataFrame:
    """``file`` (the key), ``line`` and ``text`` of whole files' blocks (see :func:`only_block`),
    split as a batch of :func:`line_batch_pieces` is but in one call.

    Thousands of small files (a long Ray session's worker logs) then cost a read each, not a
    frame each.
    """
    if not blocks:
        return pl.DataFrame(schema={"file": pl.Int64, "line": pl.Int64, "text": pl.String})
    ended = [block if block.endswith(b"\n") else block + b"\n" for block in blocks.values()]  # split as the file's own
    try:
        texts = pl.read_lines(b"".join(ended), name="text")
    except pl.exceptions.ComputeError as exc:  # some file is not UTF-8: each decoded on its own
        if "utf" not in str(exc).lower():
            raise
        texts = pl.concat([_texts(block) for block in ended])
    else:
        texts = _shortened(texts)
    owner = pl.DataFrame({"file": list(blocks), "n": [block.count(b"\n") for block in ended]},
                         schema={"file": pl.Int64, "n": pl.UInt32})
    owner = owner.select(pl.col("file").repeat_by("n")).explode("file")
    return pl.concat([owner, texts], how="horizontal").select(
        "file", pl.int_range(1, pl.len() + 1, dtype=pl.Int64).over("file").alias("line"), "text"
    )


def _numbered(texts: FrameT, first: int) -> FrameT:
    """``texts`` with its ``line`` numbers (Int64), counting from ``first``."""
    return texts.with_row_index("line", offset=first).with_columns(pl.col("line").cast(pl.Int64))


def _texts(data: bytes) -> pl.DataFrame:
    """The lines of ``data`` (whole lines) as a ``text`` column; undecodable bytes replaced."""
    try:
        return _shortened(pl.read_lines(data, name="text"))
    except pl.exceptions.ComputeError as exc:
        if "utf" not in str(exc).lower():
            raise
    body = data[:-1] if data.endswith(b"\n") else data
    if len(body) > LONG_LINE:  # (cut before decoding: a long line not UTF-8 decodes to three times its size)
        lines = body.split(b"\n")
        if max(map(len, lines)) > LONG_LINE:
            body = b"\n".join(_left_out(line[:LINE_HEAD], len(line), line[-LINE_TAIL:]) if len(line) > LONG_LINE else line
                              for line in lines)
        del lines
    texts = body.decode("utf-8", errors="replace").split("\n")
    return _shortened(pl.DataFrame({"text": texts}).with_columns(pl.col("text").str.strip_suffix("\r")))


def _left_out(head: bytes, size: int, tail: bytes) -> bytes:
    return head + f" … [{size - len(head) - len(tail):,} bytes of this line left out] … ".encode() + tail


def _shortened(texts: pl.DataFrame) -> pl.DataFrame:
    """``texts`` with every line longer than :data:`LONG_LINE` cut to its head and tail (a line
    longer than a block was already cut as it was read: see :class:`_Line`)."""
    sizes = texts["text"].str.len_bytes()
    if texts.is_empty() or (sizes.max() or 0) <= LONG_LINE:
        return texts
    where = (sizes > LONG_LINE).arg_true()
    cut = []
    for text in texts["text"].gather(where):  # a few lines at most
        raw = text.encode()
        cut.append(_left_out(raw[:LINE_HEAD], len(raw), raw[-LINE_TAIL:]).decode(errors="replace"))
    return texts.with_columns(texts["text"].scatter(where, cut))


class _Line:
    """One line's bytes as they are read, which may span many blocks: whole up to
    :data:`LONG_LINE`, then only its head and tail (with the count of bytes between)."""

    def __init__(self) -> None:
        self.size = 0
        self._whole: bytearray | None = bytearray()
        self._head = b""
        self._tail = b""

    @property
    def cut(self) -> bool:
        return self._whole is None

    def add(self, data: bytes) -> None:
        self.size += len(data)
        if self._whole is not None:
            self._whole += data
            if len(self._whole) <= LONG_LINE:
                return
            data, self._whole = bytes(self._whole), None
            self._head = data[:LINE_HEAD]
        self._tail = (self._tail + data[-LINE_TAIL:])[-LINE_TAIL:]

    def take(self) -> bytes:
        """The line as read (shortened if long), and start a new one."""
        if self._whole is not None:
            out = bytes(self._whole)
        else:
            out = _left_out(self._head, self.size, self._tail)
        self.__init__()  # type: ignore[misc]
        return out


def _line_blocks(path: Path, size: int) -> Iterator[bytes]:
    """Blocks of about ``size`` bytes that end after a newline (the last one may not).

    NUL bytes at the very start are dropped: ``logrotate``'s ``copytruncate`` leaves the writer
    going on at its old offset, and the file then starts with a hole of zeros before its first line.
    So is a UTF-8 byte-order mark (an editor's or Windows tool's save), which is no part of line 1.
    """
    blocks = _blocks(path, size)
    first = next(blocks, None)
    if first is not None:
        yield _file_start(first)
        yield from blocks


def _file_start(block: bytes) -> bytes:
    """A file's first block without what comes before its first line (see :func:`_line_blocks`)."""
    block = block.lstrip(b"\0") if block[:1] == b"\0" else block
    return block[3:] if block[:3] == b"\xef\xbb\xbf" else block


def _blocks(path: Path, size: int) -> Iterator[bytes]:
    fd = os.open(path, os.O_RDONLY)  # opened once: a session's thousands of small files
    try:
        if not _codec(os.pread(fd, _MAGIC_BYTES, 0)):
            for _, block in _positioned_blocks(fd, size, _data_start(fd)):
                yield block
            return
    finally:
        os.close(fd)
    rest = _Line()  # the line a read ended in, to be finished by the next
    with open_log(path) as fh:
        fh.skip_zeros()
        while block := fh.read(size):
            cut = block.rfind(b"\n") + 1
            if not cut:
                rest.add(block)
                continue
            if rest.cut:  # a long line ends in this block: it goes alone
                first = block.index(b"\n") + 1
                rest.add(block[: first - 1])
                yield rest.take() + b"\n"
                if cut > first:
                    yield block[first:cut]
            else:
                yield rest.take() + block[:cut] if rest.size else block[:cut]
            rest.add(block[cut:])
    if rest.size:
        yield rest.take()


def _positioned_blocks(fd: int, size: int, offset: int = 0) -> Iterator[tuple[int, bytes]]:
    """:func:`_line_blocks` of a plain file (open as ``fd``) by positioned reads, from ``offset``,
    each with the offset it starts at: each block is read from where the last whole line of the one
    before ended, so a cut-off line is read again, never joined. A file that stops short
    (truncated, or still being written) just ends the read there."""
    while True:
        end = _last_line_end(fd, offset, size)
        if end is not None:  # read to exactly there: one copy, made by the kernel outside the GIL
            block = os.pread(fd, end, offset)
            if block:
                yield offset, block
            if len(block) < end:  # cut short since the probe
                return
            offset += end
            continue
        block = os.pread(fd, size, offset)
        if len(block) < size:  # the end of the file, as far as it is written
            if block:
                yield offset, block
            return
        cut = block.rfind(b"\n") + 1
        if not cut:  # a line longer than a block: read on to its end, keeping its head and tail
            line, end = _Line(), -1
            line.add(block)
            while more := os.pread(fd, size, offset + line.size):
                end = more.find(b"\n")
                line.add(more if end < 0 else more[:end])
                if end >= 0:
                    break
            taken = line.size + (end >= 0)
            yield offset, line.take() + (b"\n" if end >= 0 else b"")
            offset += taken
            continue
        yield offset, block if cut == len(block) else block[:cut]
        offset += cut


def _last_line_end(fd: int, offset: int, size: int) -> int | None:
    """Where the last line that ends within ``size`` bytes of ``offset`` ends, from the block's
    last few KiB; ``None`` when the file ends sooner or that tail holds no newline."""
    probe = min(_PROBE, size)
    tail = os.pread(fd, probe, offset + size - probe)
    newline = tail.rfind(b"\n")
    if len(tail) < probe or newline < 0:
        return None
    return size - probe + newline + 1


def sniff(path: Path, n_bytes: int = 1 << 20) -> str:
    """The first ``n_bytes`` of ``path`` (decompressed, lossily decoded) for format detection."""
    return head_bytes(path, n_bytes).decode("utf-8", errors="replace").removeprefix("\ufeff")


def head_bytes(path: Path, n_bytes: int) -> bytes:
    """The first ``n_bytes`` of ``path`` (decompressed) past a hole of zeros at its start (see
    :func:`_line_blocks`: a hole of gigabytes would hide every line from a head read at 0)."""
    with open_log(path) as fh:
        if isinstance(fh, _Tolerant):
            fh.skip_zeros()
        else:
            fh.seek(_data_start(fh.fileno()))
        return fh.read(n_bytes)


def _data_start(fd: int) -> int:
    """Where a plain file's bytes begin past a hole of zeros at its start; 0 for nearly all."""
    if os.pread(fd, 1, 0) != b"\0":
        return 0
    try:
        offset = os.lseek(fd, 0, os.SEEK_DATA)  # (a sparse hole is skipped unread where the filesystem tells)
    except OSError:
        offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        zeros = len(chunk) - len(chunk.lstrip(b"\0"))
        if zeros < len(chunk):
            return offset + zeros
        offset += len(chunk)
    return offset

