"""The parse cache: unchanged files are not parsed again, grown logs only where they grew, and the
result is always what a fresh parse of the same bytes gives."""

from __future__ import annotations

import gzip
import os
import re
import shutil
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from areal_builder import Outage, RunSpec, healthy_reward, schedule, write_run
from conftest import FIXTURES, tree_state
from typer.testing import CliRunner

import forensics.cache
from forensics.analysis import analyze
from forensics.cache import ParseCache, wait_for_writes
from forensics.cli import app
from forensics.discover import find_runs
from forensics.run import RunData, load_run
from forensics.texts import with_messages
from parsers.custom import load_custom_format

SEED000_TRIAL = FIXTURES / "areal_seed000/outputs/logs/root/gsm8k-grpo-full-local/trial0"
OOM_TRIAL = FIXTURES / "sglang_oom/outputs/logs/root/gsm8k-grpo-oom/trial0"


def unpacked(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def load(root: Path, cache: ParseCache | None) -> RunData:
    [location] = find_runs([root])
    return load_run(location, cache=cache)


def assert_same_run(a: RunData, b: RunData) -> None:
    for name in ("steps", "metrics", "events", "superseded", "superseded_steps"):
        left, right = getattr(a, name), getattr(b, name)
        if name == "events":  # (a flood's messages a parse in parts held where a whole one did not, and back)
            left, right = with_messages(left), with_messages(right)
        order = [c for c in ("file", "line", "key", "kind") if c in left.columns]
        assert left.sort(order).equals(right.sort(order)), name
    coverage = lambda run: sorted((s.path, s.lines, s.unparsed_lines) for s in run.sources)  # noqa: E731
    assert coverage(a) == coverage(b)
    assert a.facts == b.facts  # (where the run saved its checkpoints, its names)


def test_second_load_is_served_from_the_cache(tmp_path: Path) -> None:
    cache = ParseCache(tmp_path / "cache")
    root = FIXTURES / "areal_seed000" / "outputs"
    cold = load(root, cache)
    assert set(cache.outcomes.values()) == {"parsed"}
    warm = load(root, cache)
    assert set(cache.outcomes.values()) == {"hit"} and len(cache.outcomes) == 2
    assert_same_run(cold, warm)
    fresh = analyze([root]).to_document()
    assert analyze([root], cache=cache).to_document() == fresh


@pytest.mark.parametrize(
    ("trial", "log", "fractions"),
    [
        (SEED000_TRIAL, "trainer.log.gz", (0.3, 0.6137, 0.9)),  # 0.6137: cut inside a stats table
        (OOM_TRIAL, "llm_server.log.gz", (0.25, 0.5, 0.75)),
        (SEED000_TRIAL, "llm_server.log", (0.5,)),
        (FIXTURES / "seed003", "train.log", (0.4,)),  # "… belong to step 1, unfinished …": a step, not a count
    ],
)
def test_a_growing_log_is_parsed_only_where_it_grew(tmp_path: Path, trial: Path, log: str, fractions: tuple) -> None:
    live = tmp_path / "run"
    shutil.copytree(trial, live)
    data = unpacked(trial / log)
    target = live / log.removesuffix(".gz")
    (live / log).unlink(missing_ok=True)
    cache = ParseCache(tmp_path / "cache")
    for fraction in (*fractions, 1.0):
        cut = int(len(data) * fraction)  # mid-line on purpose: a writer caught half-way
        with open(target, "ab") as fh:
            fh.write(data[target.stat().st_size if target.exists() else 0 : cut])
        grown = load(live, cache)
        if fraction != fractions[0]:
            assert cache.outcomes[str(target)] == "grown"
        fresh = load(live, None)
        assert_same_run(grown, fresh)
        # ... and say of it what a fresh parse says (a table cut off mid-row is not, once completed;
        # a server's counts are pieced together, and may be a few lines off where a line was cut)
        notes = lambda run: sorted((s.path, tuple(re.sub(r"\d{1,3}(?:,\d{3})+(?!\d)|\d+", "#", n) for n in s.notes)) for s in run.sources)  # noqa: E731
        assert notes(grown) == notes(fresh)


def _hung(root: Path, last_step: int) -> tuple[Any, list[str], int]:
    """The builder's run with its server hanging for an hour ten steps before its end (the reward 0
    from there on): its paths, its trainer.log's lines and the index of the first timeout among them."""
    hang = last_step - 10
    start = schedule(RunSpec(last_step=last_step))[hang - 2].time
    spec = RunSpec(last_step=last_step, request_timeout=120, reward=lambda s: 0.0 if s >= hang else healthy_reward(s),
                   outages=(Outage(start=start, end=start + timedelta(hours=1), kind="timeout"),))
    paths = write_run(root / "outputs", spec)
    lines = paths.trainer_log.read_text().splitlines(keepends=True)
    return paths, lines, next(i for i, line in enumerate(lines) if "timed out after" in line)


def test_a_flood_after_the_last_step_is_read_again_from_near_its_old_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hung run's trainer.log grows by request timeouts and no step (what ``watch`` polls): each
    growth is read from the last lines before the old end, not from the last step header; the
    run resuming is read as a fresh parse reads it."""
    paths, lines, first = _hung(tmp_path, 40)
    resumed = next(i for i in range(first, len(lines)) if "Train step" in lines[i])
    flood = lines[first:resumed]  # (a timeout, weights loaded, …: the run's own lines during the hang)
    growths = ["".join(lines[: first + 1]), "".join(flood[1:3] + flood[:1] * 3000), "".join(flood[:1] * 3000),
               "".join(flood[3:] + lines[resumed:])]
    read_from = []
    real = forensics.cache._parse_range
    monkeypatch.setattr(forensics.cache, "_parse_range", lambda path, start, *rest: read_from.append(start) or real(path, start, *rest))
    cache = ParseCache(tmp_path / "cache")
    for i, growth in enumerate(growths):
        old_size = paths.trainer_log.stat().st_size if i else 0
        with open(paths.trainer_log, "a" if i else "w") as fh:
            fh.write(growth)
        grown = load(paths.fileroot, cache)
        assert cache.outcomes[str(paths.trainer_log)] == ("parsed" if i == 0 else "grown")
        assert_same_run(grown, load(paths.fileroot, None))
        if 0 < i < 3:  # (each time a few hundred bytes before the old end at most)
            assert old_size - read_from[-1] < 2_000


@pytest.mark.parametrize("lands", ["before the table", "inside the table"])
def test_a_step_header_written_before_its_table_is_spliced_not_parsed_afresh(tmp_path: Path, lands: str) -> None:
    """A poll between a step's header and its table, or in the middle of the table (``watch`` every
    30 s on a live run): the grown part ends in a step cut off, which the part re-read did not say.
    That is how the log ends, not a cut in the wrong place: it was read afresh, the whole log at
    every such poll."""
    paths = write_run(tmp_path / "outputs", RunSpec(last_step=14))
    text = paths.trainer_log.read_text()
    headers = [text.rfind("\n", 0, m.start()) + 1 for m in re.finditer(r"Train step \d+/", text)]
    cuts = []
    for at in headers[9:12]:
        table = text.index("Stats (1/", at)
        cuts += [at, text.rfind("\n", 0, table) + 1 if lands == "before the table" else text.index("\n", table + 3000) + 1]
    cache = ParseCache(tmp_path / "cache")
    done = 0
    for i, cut in enumerate([*cuts, len(text)]):
        with open(paths.trainer_log, "a" if i else "w") as fh:
            fh.write(text[done:cut])
        done = cut
        grown = load(paths.fileroot, cache)
        wait_for_writes()
        assert cache.outcomes[str(paths.trainer_log)] == ("parsed" if i == 0 else "grown"), i
        fresh = load(paths.fileroot, None)
        assert_same_run(grown, fresh)
        assert [s.notes for s in grown.sources] == [s.notes for s in fresh.sources]
        cut_off = any("cut off" in note for s in grown.sources for note in s.notes)
        assert cut_off == (i % 2 == 1)  # (said while the log ends at a header, not once its table is there)


def test_a_step_table_arriving_in_parts_re_reads_no_part_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step's header, then its table a few rows a poll (a slow disk, a buffered copy): every
    growth is cut at that header, and the part before the old end, which the last splice read as
    its grown part, is not parsed again; each result is a fresh parse's."""
    paths = write_run(tmp_path / "outputs", RunSpec(last_step=12))
    text = paths.trainer_log.read_text()
    header = text.rfind("\n", 0, text.index("Train step 10/")) + 1
    rows = [m.end() for m in re.finditer(r"\n", text[header:text.index("Train step 11/")])][2::6]
    parts = [text[:header + rows[0]], *(text[header + a:header + b] for a, b in zip(rows, rows[1:])), text[header + rows[-1]:]]
    assert len(parts) >= 4
    ranges: list[tuple[int, int | None]] = []
    real = forensics.cache._parse_range
    monkeypatch.setattr(forensics.cache, "_parse_range", lambda path, start, stop, *rest: ranges.append((start, stop)) or real(path, start, stop, *rest))
    cache = ParseCache(tmp_path / "cache")
    for i, part in enumerate(parts):
        with open(paths.trainer_log, "a" if i else "w") as fh:
            fh.write(part)
        before = len(ranges)
        grown = load(paths.fileroot, cache)
        wait_for_writes()
        assert cache.outcomes[str(paths.trainer_log)] == ("parsed" if i == 0 else "grown")
        assert_same_run(grown, load(paths.fileroot, None))
        if i >= 2:  # (the first splice reads the old part and the new; the later ones, the new only)
            assert ranges[before:] == [(ranges[-1][0], None)] and ranges[-1][0] == ranges[2][0]


def test_a_traceback_being_printed_amid_a_flood_is_read_whole(tmp_path: Path) -> None:
    """Another thread's timeouts logged between a traceback's lines, the log read mid-traceback: the
    grown part is read from before the traceback, whose exception line names its kind (cuda_oom)."""
    paths, lines, first = _hung(tmp_path, 30)
    frames = ["Traceback (most recent call last):\n", '  File "/AReaL/areal/trainer/rl.py", line 311, in train\n',
              "    stats = self.actor.ppo_update(batch)\n"]
    paths.trainer_log.write_text("".join(lines[: first + 1] + lines[first : first + 1] * 300 + frames + lines[first : first + 1] * 2))
    cache = ParseCache(tmp_path / "cache")
    load(paths.fileroot, cache)
    with open(paths.trainer_log, "a") as fh:
        fh.write("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n" + lines[first] * 50)
    grown = load(paths.fileroot, cache)
    assert cache.outcomes[str(paths.trainer_log)] == "grown"
    assert_same_run(grown, load(paths.fileroot, None))
    assert "cuda_oom" in grown.events["kind"].cast(pl.String).to_list()


def test_a_log_growing_by_lines_its_head_did_not_prefix_is_parsed_as_a_fresh_parse_reads_it(tmp_path: Path) -> None:
    """The reader judges the prefixes it strips from a file's head: a part of it judged alone (its
    lines all Ray-prefixed) would be read otherwise than the whole file, which is parsed again."""
    paths, lines, first = _hung(tmp_path, 30)
    paths.trainer_log.write_text("".join(lines[: first + 1] + lines[first : first + 1] * 300))
    cache = ParseCache(tmp_path / "cache")
    load(paths.fileroot, cache)
    with open(paths.trainer_log, "a") as fh:
        fh.write(("(RolloutWorker pid=4242) " + lines[first]) * 100)
    assert_same_run(load(paths.fileroot, cache), load(paths.fileroot, None))
    assert cache.outcomes[str(paths.trainer_log)] == "parsed"


@pytest.mark.parametrize(("era", "shown"), [("v0.4", 2), ("v0.4", 3), ("v0.5", 2), ("realhf", 1), ("realhf", 2)])
def test_a_log_read_between_a_step_header_and_its_table_is_spliced_as_a_fresh_parse_reads_it(
        tmp_path: Path, era: str, shown: int) -> None:
    """A step's header and the lines announcing its table written, the table not yet (AReaL-lite), or
    realhf's table announced before its header: the grown part is not read from a line that leaves
    the table apart from its header."""
    paths = write_run(tmp_path / "outputs", RunSpec(last_step=8, era=era))
    data = paths.trainer_log.read_bytes()
    lines = data.splitlines(keepends=True)
    marker = b"Train step 6/" if era != "realhf" else b"(global step 5) finishes"
    at = next(i for i, line in enumerate(lines) if marker in line)
    paths.trainer_log.write_bytes(b"".join(lines[: at + shown]))
    cache = ParseCache(tmp_path / "cache")
    load(paths.fileroot, cache)
    with open(paths.trainer_log, "ab") as fh:
        fh.write(b"".join(lines[at + shown :]))
    assert_same_run(load(paths.fileroot, cache), load(paths.fileroot, None))
    assert cache.outcomes[str(paths.trainer_log)] == "grown"  # (realhf's from its last step's tables: above its header)


def test_a_realhf_log_read_inside_its_first_table_is_read_again_whole(tmp_path: Path) -> None:
    """realhf prints a step's table before its header: read mid-table before the first header,
    the rows belong to no step yet. Once the header comes, they are its step's values."""
    paths = write_run(tmp_path / "outputs", RunSpec(last_step=4, era="realhf"))
    lines = paths.trainer_log.read_bytes().splitlines(keepends=True)
    top = next(i for i, line in enumerate(lines) if line.startswith("╒".encode()))
    assert lines[top + 5].startswith("│".encode())
    paths.trainer_log.write_bytes(b"".join(lines[: top + 5]) + lines[top + 5][:30])  # (a row cut mid-write)
    cache = ParseCache(tmp_path / "cache")
    assert load(paths.fileroot, cache).metrics.filter(pl.col("step") == 1).is_empty()
    with open(paths.trainer_log, "ab") as fh:
        fh.write(b"".join([lines[top + 5][30:], *lines[top + 6 :]]))
    grown = load(paths.fileroot, cache)
    assert_same_run(grown, load(paths.fileroot, None))
    assert not grown.metrics.filter(pl.col("step") == 1).is_empty()


@pytest.mark.parametrize("ending", ["blank line", "indent being written", "table rule"])
def test_a_log_whose_last_line_is_not_text_is_spliced_at_its_next_growth(tmp_path: Path, ending: str) -> None:
    """A read that ends in a blank line, the indent of a line being written or a table's inner rule:
    the reader counts those lines too, so the next growth is spliced, not parsed afresh."""
    if ending == "table rule":
        paths = write_run(tmp_path / "outputs", RunSpec(last_step=8, era="v0.5"))
        lines = paths.trainer_log.read_bytes().splitlines(keepends=True)
        at = max(i for i, line in enumerate(lines) if line.startswith("├".encode()))
    else:
        paths, text, at = _hung(tmp_path, 20)
        lines = [line.encode() for line in text]
        lines[at] += b"\n" if ending == "blank line" else b"    "
        # (the indented line goes on as such: a logger line after it on the same line would be another writer's)
        lines[at + 1] = (b"" if ending == "blank line" else b"a continued message\n") + lines[at + 1]
    paths.trainer_log.write_bytes(b"".join(lines[: at + 1]))
    cache = ParseCache(tmp_path / "cache")
    load(paths.fileroot, cache)
    with open(paths.trainer_log, "ab") as fh:
        fh.write(b"".join(lines[at + 1 :]))
    assert_same_run(load(paths.fileroot, cache), load(paths.fileroot, None))
    assert cache.outcomes[str(paths.trainer_log)] == "grown"


@pytest.mark.parametrize(
    ("trial", "log", "skipped", "first"),
    [
        (SEED000_TRIAL, "trainer.log.gz", 9, 3),  # torchrun started by hand: no launcher lines, no step yet
        (OOM_TRIAL, "llm_server.log.gz", 30, 5),  # stats lines only
        (FIXTURES / "seed003", "train.log", 0, 25),  # a hand-rolled loop's config, before its first "iter N"
    ],
)
def test_a_log_first_read_before_its_first_step_or_event_is_spliced_as_a_fresh_parse_reads_it(
        tmp_path: Path, trial: Path, log: str, skipped: int, first: int) -> None:
    live = tmp_path / "run"
    shutil.copytree(trial, live)
    lines = unpacked(trial / log).splitlines(keepends=True)[skipped:]
    target = live / log.removesuffix(".gz")
    (live / log).unlink(missing_ok=True)
    cache = ParseCache(tmp_path / "cache")
    target.write_bytes(b"".join(lines[:first]))
    early = load(live, cache)
    assert early.events.filter(pl.col("file") == str(target)).is_empty()
    with open(target, "ab") as fh:
        fh.write(b"".join(lines[first:]))
    grown = load(live, cache)
    assert cache.outcomes[str(target)] == "grown"
    assert_same_run(grown, load(live, None))


def test_a_grown_server_log_of_many_batches_is_folded_as_a_fresh_parse_folds_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stats are folded per minute within batches of lines, and samples per second within blocks:
    a minute on both sides of a batch's edge is folded as one, and the grown part's lines are read
    where they are in the log, so its blocks are the whole log's (shrunken here to many of each)."""
    import parsers.sglang as sglang

    monkeypatch.setattr(sglang, "_FOLD_BLOCK", 8)
    monkeypatch.setattr(sglang, "_BATCH_LINES", 64)
    lines = ["20251111-23:50:00.000 SGLangServer Wrapper INFO: Launch command: python3 -m sglang.launch_server --port 30000"]
    for i in range(1500):  # three samples a second, each with its own values
        s = f"2025-11-12 00:{i // 3 // 60:02d}:{i // 3 % 60:02d}"
        lines.append(f"[{s} TP0] Decode batch, #running-req: {i % 17}, #token: {i % 101}, token usage: 0.{i % 89:02d}, "
                     "cuda graph: True, gen throughput (token/s): 10.00, #queue-req: 0, ")
    data = "".join(line + "\n" for line in lines).encode()
    live = tmp_path / "run"
    live.mkdir()
    target = live / "llm_server.log"
    cache = ParseCache(tmp_path / "cache")
    for cut in (len(data) * 2 // 5, len(data) * 3 // 4, len(data)):
        with open(target, "ab") as fh:
            fh.write(data[target.stat().st_size if target.exists() else 0 : cut])
        grown = load(live, cache)
        fresh = load(live, None)
        assert_same_run(grown, fresh)
        assert [s.notes for s in grown.sources] == [s.notes for s in fresh.sources]
    assert cache.outcomes[str(target)] == "grown"
    monkeypatch.setattr(sglang, "_BATCH_LINES", 10**6)  # (and as one batch folds it)
    assert_same_run(load(live, None), fresh)


def _server(start: datetime, seconds: int, *, first: int = 0, prefix: str = "", dated: bool = True,
            launch: bool = False, port: int = 30000) -> list[str]:
    """An SGLang server's lines: a launch, then three stats samples a second, a prefill now and then,
    and an access line every other sample."""
    def at(t: datetime) -> str:
        return f"{prefix}[{t:%Y-%m-%d %H:%M:%S}]" if dated else f"{prefix}[{t:%H:%M:%S} TP0]"
    lines = [f"{start:%Y%m%d-%H:%M:%S}.000 SGLangServer Wrapper INFO: Launch command: python3 -m sglang.launch_server --port {port}",
             f"{at(start)} server_args=ServerArgs(model_path='m', port={port}, log_level='info')"] if launch else []
    for i in range(first, first + 3 * seconds):
        t = start + timedelta(seconds=i // 3 - first // 3)
        lines.append(f"{at(t)} Decode batch. #running-req: {i % 17 + 1}, #token: {1000 + i * 37 % 4001}, token usage: 0.{i * 7 % 97:02d}, "
                     f"cuda graph: True, gen throughput (token/s): {100 + i * 13 % 900}.00, #queue-req: {i % 5}, ")
        if i % 7 == 0:
            lines.append(f"{at(t)} Prefill batch. #new-seq: {i % 4 + 1}, #new-token: {i * 31 % 900 + 10}, #cached-token: 0, "
                         f"token usage: 0.{i * 3 % 97:02d}, #running-req: {i % 17}, #queue-req: {i % 3}, ")
        if i % 2 == 0:
            lines.append(f'{at(t)} INFO:     10.0.0.2:{39000 + i % 1000} - "POST /generate HTTP/1.1" 200 OK')
    return lines


_T0 = datetime(2025, 11, 20, 13, 13, 59)
_GROWN_SERVER_LOGS = {
    # An event near the old end, in the minute before its last: the cut is a minute's first line before it.
    "event before the last minute": ("grown",
        _server(_T0, 230, launch=True) + ["[2025-11-20 13:17:49] KV cache pool is full. Retract requests. #retracted_reqs: 42"]
        + _server(datetime(2025, 11, 20, 13, 17, 50), 25, first=5000), _server(datetime(2025, 11, 20, 13, 18, 15), 60, first=9000)),
    # A relaunch whose clock is behind: the minutes it logs again are folded with the old ones.
    "relaunch logged earlier": ("parsed",
        _server(_T0, 240, launch=True), _server(datetime(2025, 11, 20, 13, 14, 40), 200, first=7000, launch=True, port=30001)),
    # Time-only prefixes, dated by the wrapper's line: a part read alone has no date.
    "time-only prefixes": ("parsed",
        _server(_T0, 240, launch=True, dated=False), _server(datetime(2025, 11, 20, 13, 17, 59), 200, first=7000, dated=False)),
    # Ray's prefix on every line: access lines counted per second and block.
    "Ray prefixes": ("parsed",
        _server(_T0, 240, prefix="(GenerationServer pid=661592) "),
        _server(datetime(2025, 11, 20, 13, 17, 59), 200, first=7000, prefix="(GenerationServer pid=661592) ")),
    # A traceback without a time near the old end: its time is the line's above it.
    "untimed traceback": ("grown",
        _server(_T0, 240, launch=True) + ["Exception in thread Thread-3 (watchdog):", "Traceback (most recent call last):",
                                          '  File "threading.py", line 1075, in _bootstrap_inner', "RuntimeError: NCCL communicator was aborted."]
        + _server(datetime(2025, 11, 20, 13, 18, 40), 20, first=8000), _server(datetime(2025, 11, 20, 13, 19, 0), 30, first=9000)),
    # A line of the minute before, written after the next one's first (two processes writing one log).
    "a late line of the minute before": ("parsed",
        _server(_T0, 241, launch=True) + _server(datetime(2025, 11, 20, 13, 18, 0), 1, first=723)[:1],
        _server(datetime(2025, 11, 20, 13, 17, 59), 1, first=7000)[:1] + _server(datetime(2025, 11, 20, 13, 18, 0), 60, first=724)),
    # Records with a value in the cut's minute on both sides: a row a line, spliced.
    "records in the cut's minute": ("grown",
        _server(_T0, 241, launch=True) + ["[2025-11-20 13:18:00] Update engine weights online from disk begin. avail mem=26.66 GB"]
        + _server(datetime(2025, 11, 20, 13, 18, 0), 1, first=723)[:1],
        _server(datetime(2025, 11, 20, 13, 18, 1), 20, first=726)
        + ["[2025-11-20 13:18:20] Update engine weights online from disk begin. avail mem=25.10 GB"]
        + _server(datetime(2025, 11, 20, 13, 18, 21), 40, first=786)),
    # A relaunch in the grown part: server instances are counted in the whole file.
    "a relaunch": ("parsed",
        _server(_T0, 240, launch=True), _server(datetime(2025, 11, 20, 13, 19, 0), 60, first=9000, launch=True)),
    # Two servers launched together: the note on their interleaved lines is the whole file's.
    "servers launched together": ("grown",
        [line for pair in zip(_server(_T0, 0, launch=True), _server(_T0, 0, launch=True, port=30001)) for line in pair]
        + _server(_T0, 240, first=3), _server(datetime(2025, 11, 20, 13, 18, 0), 60, first=9000)),
    # A server at warning level (no stats, no minutes to cut at), read just after an undated line: a
    # part read from that line would date it from the line after it, not the one above.
    "an undated event at the old end of a warning-level log": ("parsed",
        [*_server(_T0, 0, launch=True)[:1], "[2025-11-20 13:14:00] server_args=ServerArgs(model_path='m', port=30000, log_level='warning')",
         "[2025-11-20 13:15:00] WARNING: some warning", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
         "[2025-11-20 14:40:00] WARNING: another warning, 85 minutes later"],
        ["[2025-11-20 15:40:00] WARNING: a warning two and a half hours later"]),
    # The old end's last minute only access lines: the grown part alone would say "no launch line".
    "access lines at the old end": ("parsed",
        _server(_T0, 240, launch=True) + ['[2025-11-20 13:18:30] INFO:     10.0.0.2:39000 - "POST /generate HTTP/1.1" 200 OK'],
        _server(datetime(2025, 11, 20, 13, 18, 31), 60, first=9000)),
}


@pytest.mark.parametrize("shape", list(_GROWN_SERVER_LOGS))
def test_a_grown_server_log_is_spliced_as_a_fresh_parse_reads_it_or_parsed_afresh(tmp_path: Path, shape: str) -> None:
    """Where a part read from a cut would not be read as the whole file reads it, the file is parsed again."""
    outcome, old, grown = _GROWN_SERVER_LOGS[shape]
    live = tmp_path / "run"
    live.mkdir()
    target = live / "llm_server.log"
    target.write_text("".join(line + "\n" for line in old))
    cache = ParseCache(tmp_path / "cache")
    load(live, cache)
    with open(target, "a") as fh:
        fh.write("".join(line + "\n" for line in grown))
    spliced, fresh = load(live, cache), load(live, None)
    assert cache.outcomes[str(target)] == outcome
    assert_same_run(spliced, fresh)
    assert [s.notes for s in spliced.sources] == [s.notes for s in fresh.sources]


def test_a_grown_server_logs_stats_count_is_the_whole_files(tmp_path: Path) -> None:
    """The hang fixture's server log read at 93 % and again once complete: the stats lines its note
    counts are the whole file's, as a fresh parse says (the grown part, none of whose lines shared
    a second, had said nothing, and the first look's count stood)."""
    trial = FIXTURES / "sglang_hang" / "outputs" / "logs" / "root" / "gsm8k-grpo-hang" / "trial0"
    live = tmp_path / "run"
    shutil.copytree(trial, live)
    data = unpacked(live / "llm_server.log.gz")
    (live / "llm_server.log.gz").unlink()
    target = live / "llm_server.log"
    target.write_bytes(data[: len(data) * 93 // 100])
    cache = ParseCache(tmp_path / "cache")
    load(live, cache)
    with open(target, "ab") as fh:
        fh.write(data[len(data) * 93 // 100 :])
    counted = lambda run: [n for s in run.sources for n in s.notes if n.startswith("Decode/Prefill stats lines:")]  # noqa: E731
    grown = load(live, cache)
    assert cache.outcomes[str(target)] == "grown"
    assert counted(grown) == counted(load(live, None)) and counted(grown)


def test_a_rewritten_or_shrunk_file_is_parsed_afresh(tmp_path: Path) -> None:
    live = tmp_path / "run"
    shutil.copytree(SEED000_TRIAL, live)
    log = live / "llm_server.log"
    cache = ParseCache(tmp_path / "cache")
    load(live, cache)
    original = log.read_bytes()
    log.write_bytes(original.replace(b"Decode batch", b"Decode batcH", 1))  # same size, new content
    assert_same_run(load(live, cache), load(live, None))
    assert cache.outcomes[str(log)] == "parsed"
    log.write_bytes(original[: len(original) // 2])  # truncated
    assert_same_run(load(live, cache), load(live, None))
    assert cache.outcomes[str(log)] == "parsed"


def test_an_edit_in_the_middle_with_the_mtime_set_back_is_parsed_afresh(tmp_path: Path) -> None:
    """Same size, same inode, bytes changed where no head or tail hash looks, the mtime restored:
    the ctime still moved (no program can set it back), so the file is parsed again."""
    live = tmp_path / "run"
    shutil.copytree(SEED000_TRIAL, live)
    log = live / "trainer.log"
    log.write_bytes(unpacked(live / "trainer.log.gz"))
    (live / "trainer.log.gz").unlink()
    cache = ParseCache(tmp_path / "cache")
    load(live, cache)
    before, data = log.stat(), log.read_bytes()
    middle = data.index(b"task_reward/avg", len(data) // 2)
    value = re.compile(rb"\d\.\d{4}e[+-]\d\d").search(data, middle)
    assert value is not None
    with open(log, "r+b") as fh:
        fh.seek(value.start())
        fh.write(b"7" if data[value.start():value.start() + 1] != b"7" else b"3")
    os.utime(log, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert log.stat().st_size == before.st_size and log.stat().st_mtime_ns == before.st_mtime_ns
    assert_same_run(load(live, cache), load(live, None))
    assert cache.outcomes[str(log)] == "parsed"


def test_a_relaunch_appending_to_the_log_is_spliced(tmp_path: Path) -> None:
    """``tee -a``: the second launch starts its step numbers again, after the first launch's lines."""
    live = tmp_path / "run"
    shutil.copytree(SEED000_TRIAL, live)
    data = unpacked(SEED000_TRIAL / "trainer.log.gz")
    (live / "trainer.log.gz").unlink()
    log = live / "trainer.log"
    log.write_bytes(data[: len(data) // 3])
    cache = ParseCache(tmp_path / "cache")
    load(live, cache)
    with open(log, "ab") as fh:
        fh.write(b"\n" + data[: len(data) // 5])
    assert_same_run(load(live, cache), load(live, None))
    assert cache.outcomes[str(log)] == "grown"


@pytest.mark.parametrize("reader", ["verl", "custom"])
def test_a_relaunch_is_spliced_by_each_readers_own_rule(tmp_path: Path, reader: str) -> None:
    """verl abandons the attempt before a relaunch from the step it went back to (validation
    alone goes back nowhere), a declared format keeps a re-logged step's latest value per key: the
    splice must set apart exactly the earlier copies a fresh parse of the whole log does, keys the
    relaunch did not log again included."""
    if reader == "verl":
        from verl_builder import zero_score_run

        log, fmt = zero_score_run(tmp_path / "run", steps=40, file_logger=False, restart=(30, 20)).train_log, None
        lines = log.read_bytes().splitlines(keepends=True)
        relaunch = next(i for i, line in enumerate(lines) if b"Load from checkpoint" in line)
        # The second attempt's first re-logged steps without two of their keys.
        lines[relaunch:relaunch + 6] = [re.sub(rb" - actor/(?:lr|entropy):[^ ]+", b"", line) for line in lines[relaunch:relaunch + 6]]
    else:
        from test_custom_runs import FORMAT, write_toy_log

        log, fmt = tmp_path / "run" / "train.log", load_custom_format(FORMAT)
        log.parent.mkdir()
        write_toy_log(log)
        first = log.read_bytes().splitlines(keepends=True)
        # A relaunch re-logging steps 20-33 with other losses, after a first launch that reached step 30.
        lines = first[:30] + [re.sub(rb"loss=\S+", b"loss=-0.5000", line) for line in first[19:33]] + first[33:]
    data = b"".join(lines)
    log.write_bytes(b"")
    cache = ParseCache(tmp_path / "cache")

    def loaded(with_cache: ParseCache | None) -> RunData:
        [location] = find_runs([tmp_path / "run"], custom_format=fmt)
        return load_run(location, custom_format=fmt, cache=with_cache)

    outcomes = []
    for fraction in (0.3, 0.45, 0.5, 0.62, 0.8, 1.0):  # some cuts mid-line: a writer caught half-way
        with open(log, "ab") as fh:
            fh.write(data[log.stat().st_size : int(len(data) * fraction)])
        spliced, fresh = loaded(cache), loaded(None)
        assert_same_run(spliced, fresh)
        assert [s.notes for s in spliced.sources] == [s.notes for s in fresh.sources]  # ("N steps were logged more than once")
        outcomes.append(cache.outcomes[str(log)])
    # A relaunch is parsed afresh when it arrives (a loop's values may sit above their step line, on
    # both sides of the cut; verl's validation line at the resumed step holds that step's values),
    # and while it logs again steps logged before the cut (counted over the whole log); spliced from then on.
    assert outcomes[1:] == (["grown", "grown", "parsed", "parsed", "grown"] if reader == "verl" else ["parsed"] * 3 + ["grown"] * 2), outcomes


def test_a_relaunchs_config_naming_another_save_folder_is_spliced_as_a_fresh_parse_keeps_it(tmp_path: Path) -> None:
    """A verl relaunch appending to the log prints its own config, saving elsewhere; read after that
    and before its first step (loading its checkpoint), the grown log keeps the first config's
    facts, as a fresh parse does (verl's reader keeps the first printed)."""
    from verl_builder import zero_score_run

    log = zero_score_run(tmp_path / "run", steps=40, file_logger=False, restart=(30, 20)).train_log
    lines = log.read_bytes().splitlines(keepends=True)
    config = next(i for i, line in enumerate(lines) if b"'default_local_dir'" in line)
    relaunch = next(i for i, line in enumerate(lines) if b"Load from checkpoint" in line)
    elsewhere = re.sub(rb"('default_local_dir': ')([^']+)'", rb"\1\2_v2'", lines[config])
    assert elsewhere != lines[config]
    lines[relaunch:relaunch] = [lines[0], elsewhere]
    cache = ParseCache(tmp_path / "cache")
    for end in (relaunch - 5, relaunch + 2):  # (before the relaunch; then just after its config)
        log.write_bytes(b"".join(lines[:end]))
        spliced, fresh = load(tmp_path / "run", cache), load(tmp_path / "run", None)
        assert_same_run(spliced, fresh)
    assert cache.outcomes[str(log)] == "grown" and "_v2" not in fresh.facts["default_local_dir"]


def test_a_warning_a_worker_logs_each_step_is_spliced_as_a_fresh_parse_reads_it(tmp_path: Path) -> None:
    """verl's workers warn ``grad_norm is not finite`` in each of steps 8–12: each is its own event
    (not the first one retold), so a console cached at step 9 and grown reads as a fresh parse does."""
    from verl_builder import VerlRunSpec, write_verl_run

    log = write_verl_run(tmp_path / "run", VerlRunSpec(steps=20, nan_steps=frozenset(range(8, 13)))).train_log
    data = log.read_bytes()
    log.write_bytes(data[: int(len(data) * 0.45)])
    cache = ParseCache(tmp_path / "cache")
    load(tmp_path / "run", cache)
    with open(log, "ab") as fh:
        fh.write(data[int(len(data) * 0.45) :])
    grown, fresh = load(tmp_path / "run", cache), load(tmp_path / "run", None)
    assert cache.outcomes[str(log)] == "grown"
    assert_same_run(grown, fresh)
    warned = fresh.events.filter(pl.col("message").str.contains("grad_norm is not finite"))
    assert warned.height == 5


def test_a_corrupt_entry_is_ignored(tmp_path: Path) -> None:
    cache = ParseCache(tmp_path / "cache")
    root = FIXTURES / "sglang_hang" / "outputs"
    cold = load(root, cache)
    wait_for_writes()  # (entries are written on a background thread)
    for parquet in (tmp_path / "cache").rglob("metrics.parquet"):
        parquet.write_bytes(b"PAR1 torn")
    assert_same_run(load(root, cache), cold)
    assert set(cache.outcomes.values()) == {"parsed"}
    # Readable, but not the frame written there (a bad sync of a shared cache): a miss too, not a crash.
    for events in (tmp_path / "cache").rglob("events.parquet"):
        shutil.copy(events.with_name("steps.parquet"), events)
    assert_same_run(load(root, cache), cold)
    assert set(cache.outcomes.values()) == {"parsed"}


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="giving a file to another user takes root")
def test_a_parsed_entry_another_user_wrote_is_not_trusted(tmp_path: Path) -> None:
    """Parsed frames, as results: only what this user wrote is loaded (another account with write
    access to a shared cache could otherwise change what the analysis sees)."""
    cache = ParseCache(tmp_path / "cache")
    root = FIXTURES / "sglang_hang" / "outputs"
    cold = load(root, cache)
    wait_for_writes()
    for path in (tmp_path / "cache" / "parsed").rglob("*"):
        os.chown(path, 65534, 65534)
    assert_same_run(load(root, cache), cold)
    assert set(cache.outcomes.values()) == {"parsed"}


def test_an_unwritable_cache_is_skipped(tmp_path: Path) -> None:
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        pytest.skip("root writes through permissions")
    blocked = tmp_path / "cache"
    blocked.mkdir()
    blocked.chmod(0o500)
    try:
        run = load(FIXTURES / "sglang_hang" / "outputs", ParseCache(blocked))
        assert run.steps.height > 0
    finally:
        blocked.chmod(0o700)


def test_cli_uses_the_cache_outside_the_tree(tmp_path: Path) -> None:
    root = FIXTURES / "areal_seed001" / "outputs"
    before = tree_state(root)
    runner = CliRunner()
    args = ["metrics", str(root), "--cache-dir", str(tmp_path / "c")]
    first = runner.invoke(app, args)
    second = runner.invoke(app, args)
    assert first.exit_code == second.exit_code == 0 and first.stdout == second.stdout
    assert any((tmp_path / "c" / "parsed").iterdir())
    assert runner.invoke(app, [*args[:2], "--no-cache"]).stdout == first.stdout
    assert tree_state(root) == before
    assert pl.read_csv(first.stdout.encode()).height > 1000


def test_a_user_with_no_home_folder_is_analyzed_without_a_cache(tmp_path: Path, monkeypatch) -> None:
    """``docker run --user N``: no HOME, no passwd entry, so no ``~/.cache``. The analysis runs
    uncached (it ended in an internal error, exit 70); ``watch``, which must keep state, says what to set."""
    import pwd

    for name in ("HOME", "XDG_CACHE_HOME", "GRPO_FORENSICS_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: (_ for _ in ()).throw(KeyError(f"getpwuid(): uid not found: {uid}")))
    with pytest.raises(RuntimeError):
        Path.home()  # (the environment this test is about)
    runner = CliRunner()
    root = FIXTURES / "areal_seed001" / "outputs"
    done = runner.invoke(app, ["analyze", str(root), "--no-html", "--json", str(tmp_path / "a.json"), "--out", str(tmp_path / "out")])
    assert done.exit_code == 0, done.output
    watched = runner.invoke(app, ["watch", str(root), "--timeout", "0"])
    assert watched.exit_code == 2 and "set GRPO_FORENSICS_CACHE or XDG_CACHE_HOME, or give --state-dir" in watched.stderr


def test_unchanged_inputs_reuse_the_finished_analysis(tmp_path: Path) -> None:
    """The second ``analyze`` of the same files writes the same document, report and Markdown
    without analyzing again; touching one input (here the checkpoints) analyzes afresh."""
    live = tmp_path / "outputs"
    shutil.copytree(FIXTURES / "sglang_hang" / "outputs", live)
    runner = CliRunner()

    def run(n: int) -> tuple[str, bytes, str]:
        out = tmp_path / f"out{n}"
        out.mkdir()
        args = ["analyze", str(live), "--json", str(out / "a.json"), "--out", str(out), "--cache-dir", str(tmp_path / "c"),
                "--markdown", str(out / "a.md")]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        return (out / "a.json").read_text(), (out / "report.html").read_bytes(), (out / "a.md").read_text()

    first = run(1)
    results = tmp_path / "c" / "results"
    [entry] = list(results.iterdir())
    assert run(2) == first
    assert list(results.iterdir()) == [entry]
    checkpoint = next(p for p in live.rglob("*") if "checkpoints" in p.parts and p.is_file())
    checkpoint.write_bytes(b"")  # a zero-length shard: the recommendation may change
    run(3)
    assert len(list(results.iterdir())) == 2


def test_rows_where_is_a_filter_that_keeps_few_runs_as_slices() -> None:
    import random

    from forensics.parsed import rows_where

    rng = random.Random(7)
    for size, runs in [(0, 1), (1, 1), (1000, 1), (1000, 5), (1000, 300)]:
        cuts = sorted(rng.sample(range(size), min(size, runs))) if size else []
        kept = [sum(1 for c in cuts if c <= i) % 2 == 0 for i in range(size)]
        keep = [None if i % 97 == 5 else k for i, k in enumerate(kept)]
        frame = pl.DataFrame({"line": range(size), "keep": keep}, schema={"line": pl.Int64, "keep": pl.Boolean})
        got = rows_where(frame, pl.col("keep"))
        assert got.equals(frame.filter(pl.col("keep"))), (size, runs)
        true_runs = sum(1 for i, k in enumerate(keep) if k and (i == 0 or not keep[i - 1]))
        if 0 < true_runs <= 64:
            assert got.n_chunks() == true_runs, "a few runs are slices, not a copy"
        else:
            assert got.n_chunks() <= 1


def test_a_log_growing_while_it_is_parsed_is_not_kept_as_parsed_to_its_first_size(tmp_path: Path) -> None:
    """A live server log grows during the parse: what was read lies between two sizes, so nothing
    is kept under either — the next read gives what a fresh parse of the file gives, not lines
    past its end."""
    from forensics.readers import read

    def read_sglang_log(path: Path):  # (what the run loader caches: a Parsed, not the reader's own frames)
        return read("sglang", path)

    live = tmp_path / "llm_server.log"
    data = unpacked(OOM_TRIAL / "llm_server.log.gz")
    half = data.rindex(b"\n", 0, len(data) // 2) + 1
    live.write_bytes(data[:half])
    cache = ParseCache(tmp_path / "cache")

    def parse_while_growing(path: Path):
        parsed = read_sglang_log(path)
        with open(path, "ab") as fh:  # the server wrote on while the parser read
            fh.write(data[half:])
        return parsed

    cache.parsed("sglang", live, parse_while_growing)
    again = cache.parsed("sglang", live, read_sglang_log)
    fresh = read_sglang_log(live)
    assert again.lines == fresh.lines and again.events.equals(fresh.events)


def test_a_file_read_by_another_path_is_cited_by_the_path_asked_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Read first as ``../run`` from one folder, then by its absolute path: the evidence names the
    file as asked for now (the entry is the same file's), a path that exists from here."""
    root = tmp_path / "run"
    shutil.copytree(FIXTURES / "sglang_hang" / "outputs", root)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    cache = ParseCache(tmp_path / "cache")
    load(Path("../run"), cache)
    cache.outcomes.clear()
    run = load(root.resolve(), cache)
    assert set(cache.outcomes.values()) == {"hit"}
    files = set(run.events["file"].cast(pl.String)) | set(run.metrics["file"].cast(pl.String))
    assert files and all(Path(f).is_absolute() and Path(f).exists() for f in files), files


def test_a_folder_changes_when_a_file_in_a_linked_subfolder_does(tmp_path: Path) -> None:
    """A Ray session whose ``logs/`` (or checkpoints whose ``default/``) is a link to another disk:
    the readers follow it, so the folder's identity does; a link loop is walked once."""
    from forensics.cache import Identity

    disk = tmp_path / "disk" / "logs"
    disk.mkdir(parents=True)
    (disk / "raylet.out").write_text("one\n")
    session = tmp_path / "session"
    session.mkdir()
    (session / "logs").symlink_to(disk, target_is_directory=True)
    (disk / "loop").symlink_to(session, target_is_directory=True)
    before = Identity.of(session)
    with open(disk / "raylet.out", "a") as fh:
        fh.write("two\n")
    assert Identity.of(session) != before


def test_a_damaged_finished_analysis_is_analyzed_again(tmp_path: Path) -> None:
    """An entry of finished outputs cut short (a full disk, a killed process) is a miss, not an
    internal error on every later run."""
    runner = CliRunner()
    args = ["analyze", str(FIXTURES / "sglang_hang" / "outputs"), "--no-html", "--cache-dir", str(tmp_path / "c"),
            "--json", str(tmp_path / "a.json")]
    assert runner.invoke(app, args).exit_code == 0
    first = (tmp_path / "a.json").read_text()
    [pickled] = (tmp_path / "c" / "results").rglob("analysis.pickle")
    pickled.write_bytes(pickled.read_bytes()[:100])
    again = runner.invoke(app, args)
    assert again.exit_code == 0, again.output
    assert _without_times((tmp_path / "a.json").read_text()) == _without_times(first)


def _without_times(document: str) -> str:
    return re.sub(r'"(?:generated_at|elapsed_seconds)": [^,}]+', "", document)


def test_a_cached_verdict_of_a_run_with_no_step_still_names_its_failures(tmp_path: Path) -> None:
    """A server log alone: nothing to judge, but the failures logged are said — on the second
    run, from the finished analysis kept, as on the first."""
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "llm_server.log").write_bytes(unpacked(OOM_TRIAL / "llm_server.log.gz"))
    runner = CliRunner()
    args = ["analyze", str(alone), "--no-html", "--cache-dir", str(tmp_path / "c")]
    first, second = runner.invoke(app, args, env={"COLUMNS": "200"}), runner.invoke(app, args, env={"COLUMNS": "200"})
    said = lambda result: " ".join(result.output.split())  # noqa: E731
    assert "failures were logged" in said(first) and said(second) == said(first)


def test_a_gzipped_copy_beside_its_log_is_read_once(tmp_path: Path) -> None:
    """``trainer.log`` and ``trainer.log.gz`` holding the same lines (a copy made for the ticket):
    one read, each failure counted once, the copy named as such — not data lost."""
    live = tmp_path / "outputs"
    shutil.copytree(FIXTURES / "areal_seed001" / "outputs", live)
    [packed] = live.rglob("trainer.log.gz")
    packed.with_suffix("").write_bytes(gzip.decompress(packed.read_bytes()))
    [run] = analyze([live]).runs
    [alone] = analyze([FIXTURES / "areal_seed001" / "outputs"]).runs
    assert run.events.height == alone.events.height
    [copy] = [s for s in run.sources if s.path == str(packed)]
    assert copy.kind == "copy" and run.caveat() is None


def test_a_traceback_still_being_written_when_cached_is_one_event_once_it_ends(tmp_path: Path) -> None:
    """The server log was read (a live watch) while a CUDA OOM traceback was being written; it
    then grew by the traceback's end. One event at the traceback's start, of the kind its
    exception names — as a fresh parse gives — not the half traceback and the exception apart."""
    lines = unpacked(OOM_TRIAL / "llm_server.log.gz").split(b"\n")
    start = next(i for i, line in enumerate(lines) if b"Scheduler hit an exception: Traceback" in line)
    end = next(i for i in range(start, len(lines)) if lines[i].startswith(b"torch.OutOfMemoryError"))
    live = tmp_path / "run" / "llm_server.log"
    live.parent.mkdir()
    launch = b"\x1b[37m20251120-16:30:00.000 SGLangServer Wrapper INFO: SGLang server launched at: http://172.20.0.2:21765\x1b[0m"
    live.write_bytes(b"\n".join([launch, *lines[start:end]]) + b"\n")  # cut before its exception line
    cache = ParseCache(tmp_path / "cache")
    load(live.parent, cache)
    with open(live, "ab") as fh:
        fh.write(b"\n".join(lines[end : end + 8]) + b"\n")
    grown, fresh = load(live.parent, cache), load(live.parent, None)
    assert cache.outcomes[str(live)] == "grown"
    assert_same_run(grown, fresh)
    assert "cuda_oom" in fresh.events["kind"].to_list()


def test_an_entry_parsed_in_one_time_zone_is_not_served_in_another(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """W&B's and TensorBoard's epoch times are read in the machine's zone: a cache shared by a
    laptop in Tokyo and a cluster in UTC keeps an entry for each."""
    import time

    cache = ParseCache(tmp_path / "cache")
    log = SEED000_TRIAL / "trainer.log.gz"
    entries = []
    try:
        for zone in ("UTC", "Asia/Tokyo"):
            monkeypatch.setenv("TZ", zone)
            time.tzset()
            entries.append(cache._entry("tensorboard", log, ""))
            entries.append(cache.inputs_key(find_runs([SEED000_TRIAL])))
    finally:
        monkeypatch.undo()
        time.tzset()
    assert entries[0] != entries[2] and entries[1] != entries[3]


def _recommended(path: Path, *options: str) -> dict:
    import json

    result = CliRunner().invoke(app, ["analyze", str(path), "--json", "-", "--no-html", *options])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["runs"][0]


def test_a_remembered_analysis_is_stale_once_a_checkpoint_folder_a_log_named_changes(tmp_path: Path) -> None:
    """A verl console copied off the box: its checkpoints are found where it says it saved them (an
    absolute ``default_local_dir``), outside what the cache key covers. One deleted after a first
    analyze is not recommended again from the cache."""
    from verl_builder import VerlRunSpec, healthy_score, write_verl_run

    paths = write_verl_run(tmp_path / "train", VerlRunSpec(steps=40, file_logger=False, score=lambda s: 0.0 if s >= 25 else healthy_score(s)))
    logs = tmp_path / "logs_copy"
    logs.mkdir()
    shutil.copy2(paths.train_log, logs / "train.log")
    cache = ["--cache-dir", str(tmp_path / "cache")]
    first = _recommended(logs, *cache)["recommendation"]
    assert first["checkpoint"] and str(tmp_path / "train") in first["checkpoint"]
    shutil.rmtree(first["checkpoint"])
    again, fresh = _recommended(logs, *cache), _recommended(logs, "--no-cache")
    assert again["recommendation"] == fresh["recommendation"] and again["recommendation"]["checkpoint"] != first["checkpoint"]


@pytest.mark.parametrize("fleet", [False, True])
def test_a_remembered_analysis_is_stale_once_the_save_folder_a_log_named_appears(tmp_path: Path, fleet: bool) -> None:
    """The same console, analyzed before its absolute ``default_local_dir`` is there (the share not
    mounted yet, the checkpoints still syncing): no checkpoint, rightly. Once the folder is there,
    the remembered answer is stale — the run's alone, or its outcome in a fleet."""
    from verl_builder import VerlRunSpec, healthy_score, write_verl_run

    paths = write_verl_run(tmp_path / "train", VerlRunSpec(steps=40, file_logger=False, score=lambda s: 0.0 if s >= 25 else healthy_score(s)))
    logs = tmp_path / "logs_copy"
    logs.mkdir()
    shutil.copy2(paths.train_log, logs / "train.log")
    given = [str(logs)] + ([str(write_run(tmp_path / "other" / "outputs", RunSpec(last_step=20)).fileroot)] if fleet else [])
    away = paths.ckpt_root.with_name("not_mounted_yet")
    paths.ckpt_root.rename(away)

    def answer(*options: str) -> list:
        import json

        out = tmp_path / "a.json"
        result = CliRunner().invoke(app, ["analyze", *given, "--json", str(out), "--no-html", *options])
        assert result.exit_code == 0, result.output
        return [run["recommendation"]["checkpoint"] for run in json.loads(out.read_text())["runs"]]

    cache = ["--cache-dir", str(tmp_path / "cache")]
    assert answer(*cache)[0] is None
    away.rename(paths.ckpt_root)
    again, fresh = answer(*cache), answer("--no-cache")
    assert again == fresh and fresh[0] is not None and str(paths.ckpt_root) in fresh[0]


def test_a_checkpoint_folders_own_time_changed_makes_a_remembered_analysis_stale(tmp_path: Path) -> None:
    """A checkpoint's time is its folder's own (an editor's swap file made and removed in it, a
    ``touch -d`` setting a copy's date back, leave every file as it was): a remembered analysis
    that read the old time is stale."""
    paths = write_run(tmp_path / "run" / "outputs", RunSpec(last_step=50, save_freq_steps=10))
    cache = ["--cache-dir", str(tmp_path / "cache")]
    _recommended(paths.fileroot, *cache)
    [default] = paths.fileroot.rglob("default")
    saved = default / "epoch0epochstep29globalstep29"
    os.utime(saved, (saved.stat().st_atime, saved.stat().st_mtime + 3600))
    again, fresh = _recommended(paths.fileroot, *cache), _recommended(paths.fileroot, "--no-cache")
    assert again == fresh


def test_a_file_name_that_is_not_utf8_in_a_checkpoint_folder_is_no_error(tmp_path: Path) -> None:
    """A stray file with a Latin-1 name beside the checkpoints (copied from an old box): the run is
    analyzed with the cache as without it."""
    paths = write_run(tmp_path / "run" / "outputs", RunSpec(last_step=30, save_freq_steps=10))
    [default] = paths.fileroot.rglob("default")
    with open(os.path.join(os.fsencode(default), b"notes-\xe9t\xe9.txt"), "wb") as stray:
        stray.write(b"x")
    cache = ["--cache-dir", str(tmp_path / "cache")]
    assert _recommended(paths.fileroot, *cache) == _recommended(paths.fileroot, "--no-cache")


def test_a_new_empty_checkpoint_folder_makes_a_remembered_analysis_stale(tmp_path: Path) -> None:
    """A save begun after a first analyze (its folder there, no file in it yet): the cached answer
    is the fresh one, which sees the folder (steps past the log's end)."""
    paths = write_run(tmp_path / "run" / "outputs", RunSpec(last_step=50, save_freq_steps=10))
    cache = ["--cache-dir", str(tmp_path / "cache")]
    before = _recommended(paths.fileroot, *cache)
    [default] = paths.fileroot.rglob("default")
    (default / "epoch0epochstep59globalstep59").mkdir()
    again, fresh = _recommended(paths.fileroot, *cache), _recommended(paths.fileroot, "--no-cache")
    assert again == fresh and len(fresh["checkpoints"]) == len(before["checkpoints"]) + 1


@pytest.mark.parametrize("module", ["parsers/areal.py", "forensics/readers.py", "forensics/cache.py"])
def test_a_change_to_the_code_that_shapes_a_parse_entry_makes_old_entries_stale(tmp_path: Path, module: str) -> None:
    """The parse cache's code digest covers every module that shapes what an entry holds: the
    readers, and how the loader calls them (``forensics/readers.py``: which messages a flood holds)."""
    import subprocess
    import sys

    root = Path(forensics.cache.__file__).parent.parent
    for package in ("forensics", "parsers", "reports"):
        shutil.copytree(root / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))

    def digest() -> str:
        return subprocess.run([sys.executable, "-c", "from forensics.identity import code_digest; print(code_digest())"],
                              env={**os.environ, "PYTHONPATH": str(tmp_path)}, cwd=tmp_path, capture_output=True, text=True, check=True).stdout

    before = digest()
    with open(tmp_path / module, "a") as fh:
        fh.write("\n# changed\n")
    assert digest() != before


def test_a_cache_set_for_the_environment_is_not_written_into_the_checkpoint_folder_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run given by its log folder, its checkpoints read from beside it: a cache the environment
    puts in that checkpoint folder is dropped (as one in the analyzed tree is), never written there."""
    paths = write_run(tmp_path / "outputs", RunSpec(last_step=30, save_freq_steps=10))
    trial = paths.fileroot / "checkpoints" / "root" / "gsm8k-grpo" / "trial0"
    assert trial.is_dir()
    before = tree_state(trial)
    monkeypatch.setenv(forensics.cache.CACHE_ENV, str(trial / ".cache"))
    result = CliRunner().invoke(app, ["analyze", str(paths.log_dir), "--no-html"])
    assert result.exit_code == 0, result.output
    assert tree_state(trial) == before


def test_a_cache_set_in_the_checkpoint_folder_a_log_named_is_refused_or_dropped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The folder a verl console names is known only from the parse the cache keeps: it is read
    from the console's first config before, so a cache set there is refused (``--cache-dir``, exit 2)
    or dropped (the environment's), and nothing is written there."""
    from verl_builder import VerlRunSpec, healthy_score, write_verl_run

    paths = write_verl_run(tmp_path / "train", VerlRunSpec(steps=20, file_logger=False, score=healthy_score))
    logs = tmp_path / "logs_copy"
    logs.mkdir()
    shutil.copy2(paths.train_log, logs / "train.log")
    before = tree_state(paths.ckpt_root)
    result = CliRunner().invoke(app, ["analyze", str(logs), "--no-html", "--cache-dir", str(paths.ckpt_root / ".cache")])
    assert result.exit_code == 2 and f"inside the analyzed path {paths.ckpt_root};" in result.stderr, result.output
    monkeypatch.setenv(forensics.cache.CACHE_ENV, str(paths.ckpt_root / ".cache"))
    result = CliRunner().invoke(app, ["analyze", str(logs), "--no-html"])
    assert result.exit_code == 0 and "global_step_20" in result.stdout, result.output
    assert tree_state(paths.ckpt_root) == before


def test_the_save_folder_a_console_names_is_found_without_a_parse(tmp_path: Path) -> None:
    """``first_fact`` keeps the first printed config's value, as the parse does, across its chunks
    and in a gzipped console; a console naming none has none."""
    from parsers.verl import first_fact, read_verl_log

    config = "(TaskRunner pid=7) {'trainer': {'default_local_dir': '/ckpt/%s',\n"
    body = "".join(f"(TaskRunner pid=7) step:{i} - critic/score/mean:0.5\n" for i in range(1, 400))
    log = tmp_path / "train.log"
    log.write_text("x" * 5000 + "\n" + config % "first" + body + config % "second")
    assert first_fact(log, "default_local_dir", chunk_bytes=64) == "/ckpt/first"
    assert read_verl_log(log).facts["default_local_dir"] == "/ckpt/first"
    zipped = tmp_path / "train.log.1.gz"
    zipped.write_bytes(gzip.compress(log.read_bytes()))
    assert first_fact(zipped, "default_local_dir", chunk_bytes=100) == "/ckpt/first"
    log.write_text(body)
    assert first_fact(log, "default_local_dir") is None
    assert first_fact(tmp_path / "gone.log", "default_local_dir") is None


def test_an_output_inside_the_checkpoint_folder_a_log_named_is_refused(tmp_path: Path) -> None:
    """The checkpoints a verl console names where it saved them are read: an output there is
    refused (exit 2), nothing written, as one in a checkpoint folder found beside the logs is."""
    from verl_builder import VerlRunSpec, healthy_score, write_verl_run

    paths = write_verl_run(tmp_path / "train", VerlRunSpec(steps=20, file_logger=False, score=healthy_score))
    logs = tmp_path / "logs_copy"
    logs.mkdir()
    shutil.copy2(paths.train_log, logs / "train.log")
    before = tree_state(paths.ckpt_root)
    inside = paths.ckpt_root / "report"
    for option in (["--out", str(inside)], ["--json", str(paths.ckpt_root / "a.json"), "--no-html"]):
        result = CliRunner().invoke(app, ["analyze", str(logs), "--no-cache", *option])
        assert result.exit_code == 2 and "nothing is written there" in result.stderr, result.output
    assert tree_state(paths.ckpt_root) == before
