"""Blocks of whole lines (parsers._lines): the memory-mapped reader of settled files and the plain
reader of files still being written both give every byte, never cut a line, and keep blocks
near their size."""

from __future__ import annotations

import gzip
import os
import time
from pathlib import Path

import pytest

import parsers._lines as lines

CONTENTS = {
    "plain": b"".join(b"line %d\n" % i for i in range(500)),
    "no final newline": b"a\nbb\nccc",
    "long line": b"x" * 10_000 + b"\nshort\n" + b"y" * 5_000,
    "crlf and junk": b"one\r\n\xff\xfe\x00two\r\n\n\nthree\n",
    "empty": b"",
}


def _blocks(path: Path, size: int) -> list[bytes]:
    return list(lines._line_blocks(path, size))


@pytest.mark.parametrize("name", sorted(CONTENTS))
@pytest.mark.parametrize("size", [1, 7, 4096, 1 << 20])
def test_settled_and_fresh_files_give_whole_lines(tmp_path: Path, name: str, size: int) -> None:
    data = CONTENTS[name]
    fresh, settled = tmp_path / "fresh.log", tmp_path / "settled.log"
    fresh.write_bytes(data)
    settled.write_bytes(data)
    past = time.time() - 2 * lines.SETTLED_SECONDS
    os.utime(settled, (past, past))
    assert not lines._settled(fresh) and lines._settled(settled)
    for got in (_blocks(settled, size), _blocks(fresh, size)):
        assert b"".join(got) == data
        assert all(block.endswith(b"\n") for block in got[:-1])  # no line is ever cut
        longest = max((len(line) + 1 for line in data.split(b"\n")), default=0)
        assert all(len(block) <= size + longest for block in got)


def test_gzip_is_read_plainly_and_a_missing_file_is_not_settled(tmp_path: Path) -> None:
    zipped = tmp_path / "trainer.log.gz"
    zipped.write_bytes(gzip.compress(CONTENTS["plain"]))
    past = time.time() - 2 * lines.SETTLED_SECONDS
    os.utime(zipped, (past, past))
    assert b"".join(_blocks(zipped, 97)) == CONTENTS["plain"]
    assert not lines._settled(tmp_path / "gone.log")


def test_a_file_cut_short_while_mapped_stops_without_touching_it(tmp_path: Path) -> None:
    """A relaunch's ``tee`` without ``-a`` truncates the log while it is read: touching a mapped
    page past the new end would kill the process; the reader stops at the block before."""
    log = tmp_path / "trainer.log"
    data = b"".join(b"line %d\n" % i for i in range(5_000))  # several pages
    log.write_bytes(data)
    past = time.time() - 2 * lines.SETTLED_SECONDS
    os.utime(log, (past, past))
    blocks = lines._line_blocks(log, 64)
    first = next(blocks)
    with open(log, "r+b") as fh:
        fh.truncate(100)
    assert first == data[: len(first)] and list(blocks) == []
