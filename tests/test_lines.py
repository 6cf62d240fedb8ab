"""Blocks of whole lines (parsers._lines): positioned reads of plain files and the streaming
reader of gzipped ones give every byte, never cut a line, keep blocks near their size, and end
cleanly where a file being truncated or written now ends."""

from __future__ import annotations

import gzip
from pathlib import Path

import polars as pl
import pytest

import parsers._lines as lines

CONTENTS = {
    "plain": b"".join(b"line %d\n" % i for i in range(500)),
    "no final newline": b"a\nbb\nccc",
    "long line": b"x" * 10_000 + b"\nshort\n" + b"y" * 5_000,
    "crlf and junk": b"one\r\n\xff\xfe\x00two\r\n\n\nthree\n",
    "empty": b"",
}


@pytest.fixture(autouse=True, params=[None, 8], ids=["probe", "small probe"])
def probe(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test with the reader's own probe (as large as or larger than most blocks here) and with
    one smaller than the blocks, so a block is found by its probe and read to exactly its end."""
    if request.param is not None:
        monkeypatch.setattr(lines, "_PROBE", request.param)


def _blocks(path: Path, size: int) -> list[bytes]:
    return list(lines._line_blocks(path, size))


@pytest.mark.parametrize("name", sorted(CONTENTS))
@pytest.mark.parametrize("size", [1, 7, 4096, 1 << 20])
@pytest.mark.parametrize("packed", [False, True], ids=["plain", "gzip"])
def test_blocks_hold_whole_lines_and_every_byte(tmp_path: Path, name: str, size: int, packed: bool) -> None:
    data = CONTENTS[name]
    log = tmp_path / "trainer.log"
    log.write_bytes(gzip.compress(data) if packed else data)
    got = _blocks(log, size)
    assert b"".join(got) == data
    assert all(block.endswith(b"\n") for block in got[:-1])  # no line is ever cut
    longest = max((len(line) + 1 for line in data.split(b"\n")), default=0)
    assert all(len(block) <= size + longest for block in got)


@pytest.mark.parametrize("size", [4096, lines.BATCH_BYTES])
def test_a_corrupt_gzip_keeps_the_text_before_the_bad_byte(tmp_path: Path, size: int) -> None:
    """One flipped byte in the middle of a small .gz: zlib fails only at the end (the data check)
    or a little after the byte, in the same call that inflated the rest; the text before the bad
    spot is kept, whole lines only, and the damage is said."""
    data = b"".join(b"20251111-11:%02d:%02d.000 StatsLogger INFO: Train step %d/935 done. reward %d\n" % (i // 60 % 60, i % 60, i, i * 7919 % 1000)
                    for i in range(20_000))
    packed = bytearray(gzip.compress(data))
    packed[len(packed) // 2] ^= 0x01
    log = tmp_path / "trainer.log.gz"
    log.write_bytes(bytes(packed))
    got = b"".join(_blocks(log, size))
    kept = got.split(b"\n")
    assert len(kept) > 5_000 and data.startswith(b"\n".join(kept[:5_000]))
    assert all(len(block) <= size + 200 for block in _blocks(log, size))
    assert lines.stream_damage(log).startswith("gzip stream corrupt after ")


def test_a_file_cut_short_while_read_ends_at_its_new_end(tmp_path: Path) -> None:
    """A relaunch's ``tee`` without ``-a`` truncates the log while it is read: the read ends
    where the file now ends, with no error."""
    log = tmp_path / "trainer.log"
    data = b"".join(b"line %d\n" % i for i in range(5_000))
    log.write_bytes(data)
    blocks = lines._line_blocks(log, 64)
    first = next(blocks)
    with open(log, "r+b") as fh:
        fh.truncate(100)
    assert first == data[: len(first)] and b"".join(blocks) == data[len(first) : 100]


def test_a_file_growing_while_read_is_read_as_far_as_it_is_written(tmp_path: Path) -> None:
    log = tmp_path / "trainer.log"
    data = b"".join(b"line %d\n" % i for i in range(5_000))
    log.write_bytes(data[:1000])
    blocks = lines._line_blocks(log, 64)
    first = next(blocks)
    with open(log, "ab") as fh:
        fh.write(data[1000:])
    assert first + b"".join(blocks) == data


def test_each_batch_result_comes_in_one_chunk_per_column(tmp_path: Path) -> None:
    """Concatenated, the batches' results then have their columns cut alike: Polars would copy
    a frame whose columns are cut differently whole at each later eager filter."""
    import polars as pl

    log = tmp_path / "trainer.log"
    log.write_bytes(CONTENTS["plain"])
    pieces = lines.line_batch_pieces(log, lambda batch: {"ends": pl.concat([batch.head(2), batch.tail(2)])}, batch_bytes=300)
    assert len(pieces["ends"]) > 3
    assert all(column.n_chunks() == 1 for frame in pieces["ends"] for column in frame.get_columns())
    ends = pl.concat(pieces["ends"])
    assert ends["text"].to_list() == [f"line {n - 1}" for n in ends["line"]] and ends["line"][0] == 1


@pytest.mark.parametrize(
    ("fixture", "read"),
    [("areal_seed000/outputs/logs/root/gsm8k-grpo-full-local/trial0/trainer.log.gz", "read_areal_log"),
     ("sglang_hang/outputs/logs/root/gsm8k-grpo-hang/trial0/llm_server.log.gz", "read_sglang_log")],
)
@pytest.mark.parametrize("head", [b"\0" * 300_000, b"\xef\xbb\xbf"], ids=["copytruncate-hole", "byte-order-mark"])
def test_a_copytruncate_hole_or_a_byte_order_mark_before_the_first_line_is_skipped(tmp_path: Path, fixture: str, read: str, head: bytes) -> None:
    """``copytruncate`` leaves a writer going on at its old offset: the file starts with zeros. An
    editor's save may start it with a byte-order mark. Neither is part of the first line."""
    import gzip

    import parsers

    text = gzip.decompress((Path(__file__).parent / "fixtures" / fixture).read_bytes())
    plain, holed = tmp_path / "plain.log", tmp_path / "holed.log"
    plain.write_bytes(text)
    holed.write_bytes(head + text)
    a, b = getattr(parsers, read)(plain), getattr(parsers, read)(holed)
    assert (a.lines, a.unparsed_lines) == (b.lines, b.unparsed_lines)
    for name in ("metrics", "events"):
        assert getattr(a, name).drop("file", strict=False).equals(getattr(b, name).drop("file", strict=False)), name


@pytest.mark.parametrize("hole", [3 << 20, 20 << 20], ids=["past-the-sniffed-head", "past-a-block"])
@pytest.mark.parametrize("packed", [False, True], ids=["plain", "gzip"])
def test_a_run_whose_log_starts_with_a_hole_of_megabytes_is_read_whole(tmp_path: Path, hole: int, packed: bool) -> None:
    """A hole longer than the head read to tell a log's format (1 MiB) was taken for UTF-16 text
    and the log left unread; one longer than a block was read as a first line of zeros."""
    import gzip
    import shutil

    from conftest import FIXTURES

    from forensics import analyze

    tree = tmp_path / "run"
    shutil.copytree(FIXTURES / "sglang_hang", tree)
    trial = tree / "outputs" / "logs" / "root" / "gsm8k-grpo-hang" / "trial0"
    text = gzip.decompress((trial / "trainer.log.gz").read_bytes())
    (trial / "trainer.log.gz").unlink()
    if packed:
        (trial / "trainer.log.gz").write_bytes(gzip.compress(b"\0" * hole + text, compresslevel=1))
    else:
        with open(trial / "trainer.log", "wb") as fh:  # (sparse, as the writer's seek past the cut leaves it)
            fh.seek(hole)
            fh.write(text)
    [expected] = analyze([FIXTURES / "sglang_hang" / "outputs"]).runs
    [run] = analyze([tree / "outputs"]).runs
    [trainer] = [s for s in run.sources if "trainer.log" in s.path]
    assert (trainer.lines, trainer.unparsed_lines, trainer.notes) == (text.count(b"\n"), 0, ())
    assert run.step_range() == expected.step_range()
    assert [(i.kind, i.onset_step) for i in run.incidents] == [(i.kind, i.onset_step) for i in expected.incidents]


@pytest.mark.parametrize("size", [64, 700, 4096, 1 << 20])
@pytest.mark.parametrize("packed", [False, True], ids=["plain", "gzip"])
def test_a_line_longer_than_long_line_keeps_its_head_and_tail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int, packed: bool
) -> None:
    """A request payload dumped whole on one line: every reader keeps its head and tail, says how
    many bytes it left out, and numbers the lines after it as the file does — whether the line is
    longer than a block (cut as it is read) or within one (cut once split)."""
    monkeypatch.setattr(lines, "LONG_LINE", 1000)
    monkeypatch.setattr(lines, "LINE_HEAD", 100)
    monkeypatch.setattr(lines, "LINE_TAIL", 50)
    payload = b"ERROR: Workflow execution failed. Payload: [" + b"151644, " * 900 + b"]. Last error: TimeoutError()"
    last = b"z" * 1500  # long, and with no newline after it
    data = b"before\n" + payload + b"\nafter\n" + b"x" * 999 + b"\n" + last
    log = tmp_path / "trainer.log"
    log.write_bytes(gzip.compress(data) if packed else data)
    monkeypatch.setattr(lines, "BATCH_BYTES", size)

    def cut(raw: bytes) -> str:
        return (raw[:100] + f" … [{len(raw) - 150:,} bytes of this line left out] … ".encode() + raw[-50:]).decode()

    want = [(1, "before"), (2, cut(payload)), (3, "after"), (4, "x" * 999), (5, cut(last))]
    batched = lines.collect_lines(log, lambda found: {"lines": found})["lines"]
    assert list(batched.iter_rows()) == want
    for reader in (lines.line_frames(log, size), lines.iter_line_chunks(log, size)):
        frames = [frame.lazy().collect() for frame in reader]
        assert list(pl.concat(frames).select("line", "text").iter_rows()) == want


def test_a_long_line_that_is_not_utf8_is_cut_before_it_is_decoded() -> None:
    """A block Polars cannot take (bytes that are not UTF-8) is decoded by Python: a 12 MB line of
    them decoded whole took three times its size, as characters, before it was cut (a 60 MB one in
    a server log: 1 GB of peak RSS)."""
    import tracemalloc

    from parsers._lines import LONG_LINE, _texts

    block = b"first line\n" + b"\xff" * (12 << 20) + b"\nlast line\n"
    tracemalloc.start()
    texts = _texts(block)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert texts["text"].to_list()[0::2] == ["first line", "last line"]
    assert "bytes of this line left out" in texts["text"][1] and len(texts["text"][1].encode()) < LONG_LINE
    assert peak < 3 * len(block), peak  # (the block, its lines split; not 15 times it)
