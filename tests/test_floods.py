"""Logs flooded with events (a dead server's timeouts, millions of them): what is kept of them,
in what order, and what is cited."""

from __future__ import annotations

import gzip
import json
import random
import re
from datetime import datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from areal_builder import Outage, RunSpec, healthy_reward, schedule, write_run
from conftest import FIXTURES
from typer.testing import CliRunner

import forensics.readers
import forensics.texts
import parsers._lines
from forensics import analyze
from forensics.causes import _evidence, _later_evidence, _Windows
from forensics.cli import app
from forensics.parsed import rows_where
from forensics.run import _one_event_a_line, _sort_by_time
from forensics.texts import iter_with_messages, with_messages
from forensics.watch import replay
from parsers._lines import BATCH_BYTES, _positioned_blocks, lines_at
from parsers.areal import looks_like_areal, read_areal_log
from parsers.schema import EVENT_SCHEMA, HELD_MESSAGES, REPEATED_KINDS
from reports.timeline import MAX_EVENT_MARKERS

FLOOD = 200_000


def test_a_flood_of_timeouts_is_counted_whole_and_cited_from_its_first_line(tmp_path: Path) -> None:
    """A server hangs at step 30 and the trainer logs the same timeout two hundred thousand times
    in one millisecond: every one is an event, the cause is the hang, and the evidence cites the
    flood's first lines, in file order."""
    start = schedule(RunSpec(last_step=60))[28].time
    spec = RunSpec(last_step=60, request_timeout=120, reward=lambda s: 0.0 if s >= 30 else healthy_reward(s),
                   outages=(Outage(start=start, end=start + timedelta(hours=1), kind="timeout"),))
    paths = write_run(tmp_path / "outputs", spec)
    lines = paths.trainer_log.read_text().splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if "timed out after" in line)
    paths.trainer_log.write_text("".join(lines[: first + 1] + [lines[first]] * FLOOD + lines[first + 1 :]))

    [run] = analyze([paths.fileroot]).runs
    [incident] = [i for i in run.incidents if i.kind == "reward_collapse"]
    assert incident.cause == "inference_server_unresponsive"
    timeouts = run.events.filter(pl.col("kind") == "request_timeout")
    assert timeouts.height > FLOOD
    cited = [e.line for e in incident.evidence if e.kind == "request_timeout" and e.file.endswith("trainer.log")]
    assert cited[:3] == [first + 1, first + 2, first + 3]
    # The events stay in time, file and line order, the flood in the file's.
    assert run.events.equals(run.events.sort("time", "file", "line", nulls_last=True, maintain_order=True))
    # Their names are categories (4 bytes a row, not a copy of the name each).
    assert {run.events.schema[c] for c in ("source", "kind", "severity", "file")} == {pl.Categorical()}


def _events(n: int, seed: int) -> pl.DataFrame:
    """Events from three files, many at one moment, some with no time, in no order."""
    rng = random.Random(seed)
    t0 = datetime(2025, 11, 11, 11, 35)
    rows = []
    for i in range(n):
        time = None if rng.random() < 0.1 else t0 + timedelta(milliseconds=rng.choice([0, 0, 0, 1, 2, 50, 900]))
        rows.append({"time": time, "step": rng.choice([None, 3, 4]), "source": "areal",
                     "kind": rng.choice(["request_timeout", "connection_refused", "server_exit", "checkpoint_saved"]),
                     "severity": rng.choice(["warning", "error", "info"]), "file": rng.choice(["/r/b.log", "/r/a.log", "/r/c.log"]),
                     "line": i + 1, "message": f"line {i}"})
    frame = pl.DataFrame(rows, schema=EVENT_SCHEMA)
    return pl.concat([frame.slice(0, n // 3), frame.slice(n // 3)], rechunk=False)  # (in two chunks, as concatenated sources are)


@pytest.mark.parametrize("seed", range(5))
def test_events_sorted_in_place_match_a_sort_by_all_three_keys(seed: int) -> None:
    events = _events(3000, seed)
    expected = events.sort("time", "file", "line", nulls_last=True, maintain_order=True)
    _sort_by_time(events)
    assert events.equals(expected)
    _sort_by_time(events)  # (sorted already: left as it is)
    assert events.equals(expected)


def test_files_named_in_reverse_of_their_order_are_sorted_by_name() -> None:
    """A category's number is the order its name was first seen in, not the name's: the sort goes
    by the name."""
    names = [f"/r/{c * 3}-{random.random()}.log" for c in "zyx"]  # (names no test has seen: new numbers, z first)
    events = pl.concat([_events(600, 1).with_columns(pl.lit(name, pl.Categorical).alias("file")) for name in names])
    expected = events.sort("time", "file", "line", nulls_last=True, maintain_order=True)
    _sort_by_time(events)
    assert events.equals(expected)
    untimed = events.filter(pl.col("time").is_null())
    assert untimed["file"].cast(pl.String).unique(maintain_order=True).to_list() == sorted(names)


@pytest.mark.parametrize("seed", range(6))
def test_files_whose_rows_lie_together_are_sorted_as_by_all_three_keys(seed: int) -> None:
    """Each file's rows together in line order, as readers leave them (the files in any order):
    one sort by time over the files in name order. Judged a few rows at a time, as a flood is."""
    rng = random.Random(seed)
    names = rng.sample(["/r/b.log", "/r/a.log", "/r/c.log", "/r/d.log"], k=rng.randint(1, 4))
    events = pl.concat([_events(rng.randint(0, 400), seed + i).with_columns(pl.lit(name, pl.Categorical).alias("file"))
                        for i, name in enumerate(names)])
    expected = events.sort("time", "file", "line", nulls_last=True, maintain_order=True)
    _sort_by_time(events, rows=rng.choice([1, 7, 64, 1 << 20]))
    assert events.equals(expected)


@pytest.mark.parametrize("seed", range(6))
def test_rows_where_keeps_what_a_filter_keeps(seed: int) -> None:
    """One run of rows (sliced, not copied) or scattered ones, with nulls: the filter's rows."""
    rng = random.Random(seed)
    events = _events(500, seed)
    a, b = sorted(rng.sample(range(501), 2))
    steps = [rng.choice([None, 1, 2]) if rng.random() < 0.3 * (seed % 2) else (1 if a <= i < b else None) for i in range(500)]
    events = events.with_columns(pl.Series("step", steps, dtype=pl.Int64))
    for predicate in (pl.col("step").is_not_null(), pl.col("step") == 1, pl.col("kind") == "server_exit", pl.lit(False)):
        assert rows_where(events, predicate).equals(events.filter(predicate))


def test_one_parse_of_a_file_is_kept_as_read_and_two_keep_the_first_parses_line() -> None:
    events = _events(300, 0).sort("file", "line")
    assert _one_event_a_line([events]).equals(events)
    twice = pl.concat([events, events.slice(5, 1)])  # (one line told twice by one parse)
    assert _one_event_a_line([twice]).equals(events)
    other = events.head(10).with_columns(pl.lit("workflow_failed", pl.Categorical).alias("kind"))
    kept = _one_event_a_line([other, events])
    assert kept.height == events.height and kept.head(10)["kind"].to_list() == ["workflow_failed"] * 10


def _old_evidence_rows(window: pl.DataFrame, cause: str) -> list[int]:
    """The ranking :func:`forensics.causes._evidence` made by sorting the whole window."""
    ranked = (
        window.with_row_index("row").sort("time", "line", nulls_last=True, maintain_order=True)
        .with_columns((pl.col("cause") == cause).fill_null(False).alias("deciding"), pl.col("kind").cum_count().over("kind").alias("nth"))
        .sort(pl.col("deciding").not_(), pl.col("nth") > 1, pl.col("cause").is_null(), pl.col("severity") == "info", "time", "line",
              nulls_last=True, maintain_order=True)
        .head(16)
    )
    return ranked["row"].to_list()


@pytest.mark.parametrize("seed", range(8))
def test_evidence_is_ranked_as_a_full_sort_would_rank_it(seed: int) -> None:
    """Each kind's earliest line is found without sorting the window: ties in time and line, and
    lines with no time, rank as the full sort ranked them."""
    events = _events(2000, seed)
    rng = random.Random(seed)
    causes = ["inference_server_unresponsive", "inference_server_crash", None]
    window = events.with_columns(pl.Series("cause", [rng.choice(causes) for _ in range(events.height)]),
                                 pl.Series("line", [rng.randint(1, 40) for _ in range(events.height)]))
    expected = [window.row(i, named=True)["message"] for i in _old_evidence_rows(window, "inference_server_unresponsive")]
    assert [e.text for e in _evidence(window, "inference_server_unresponsive")] == expected


def test_a_kind_with_no_time_but_one_far_off_cites_the_dated_line_first() -> None:
    """Undated lines rank after every dated one, however late (no stand-in date for "no time")."""
    base = {"step": 1, "source": "areal", "severity": "error", "file": "/r/trainer.log", "cause": None}
    rows = [base | {"time": datetime(9999, 12, 31, 12), "kind": "log_error", "line": 5, "message": "dated"},
            base | {"time": None, "kind": "log_error", "line": 9, "message": "undated"}]
    rows += [base | {"time": datetime(2025, 1, 1), "kind": "connection_refused", "line": i, "message": f"refused {i}",
                     "cause": "inference_server_crash"} for i in range(20, 34)]
    window = pl.DataFrame(rows, schema=EVENT_SCHEMA | {"cause": pl.String})
    expected = [window.row(i, named=True)["message"] for i in _old_evidence_rows(window, "inference_server_crash")]
    cited = [e.text for e in _evidence(window, "inference_server_crash")]
    assert cited == expected and cited.index("dated") < cited.index("undated")


@pytest.mark.parametrize("seed", range(8))
def test_later_evidence_cites_each_kinds_earliest_line_as_a_full_sort_would(seed: int) -> None:
    """What followed the window: the earliest line of each kind, the four earliest of them, ties
    (one time, one line number, several files) in the events' order."""
    events = _events(2000, seed).with_columns(pl.lit(5, dtype=pl.Int64).alias("step"))
    rng = random.Random(seed)
    later = events.with_columns(pl.lit("inference_server_crash").alias("cause"), pl.col("step").alias("since"),
                                pl.lit(None, dtype=pl.String).alias("at"),
                                pl.Series("line", [rng.randint(1, 40) for _ in range(events.height)]))
    old = (later.with_row_index("row").sort("time", "line", nulls_last=True, maintain_order=True)
           .unique("kind", keep="first", maintain_order=True).head(4))
    expected = [later.row(i, named=True)["message"] for i in old["row"]]
    cited = _later_evidence(later, _Windows((0, 1), (0, 0)), "inference_server_unresponsive")
    assert [e.text for e in cited] == expected


#: What a server that hangs, and one that is gone, make the trainer log over and over.
_FLOODS = {"timeout": "timed out after", "refused": "Workflow execution failed"}


def _flooded(root: Path, flood: int = FLOOD, outage: str = "timeout") -> tuple[Path, int]:
    """The builder's run with its server hanging (or gone) at step 30 and the first line of the
    trainer's that says so repeated ``flood`` times right after it: the fileroot, and that line's number."""
    start = schedule(RunSpec(last_step=60))[28].time
    spec = RunSpec(last_step=60, request_timeout=120, reward=lambda s: 0.0 if s >= 30 else healthy_reward(s),
                   outages=(Outage(start=start, end=start + timedelta(hours=1), kind=outage),))
    paths = write_run(root / "outputs", spec)
    lines = paths.trainer_log.read_text().splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if _FLOODS[outage] in line)
    paths.trainer_log.write_text("".join(lines[: first + 1] + [lines[first]] * flood + lines[first + 1 :]))
    return paths.fileroot, first + 1


# (a failed workflow's line dumps its payload, 1.9 KB: 20,000 of them are 38 MB, batches of the parse as many)
@pytest.mark.parametrize(("outage", "kind", "flood"), [("timeout", "request_timeout", FLOOD), ("refused", "workflow_failed", 20_000)])
def test_a_floods_messages_are_not_held_but_read_back_wherever_they_are_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, outage: str, kind: str, flood: int) -> None:
    """Past the first few of a batch, a flood's failures keep their place, not their text: the
    analysis (what server they name, how long a request waited, what a failed workflow raised), its
    evidence and the export are what they are with every text held."""
    fileroot, first = _flooded(tmp_path, flood, outage=outage)
    assert next(fileroot.rglob("trainer.log")).stat().st_size > BATCH_BYTES  # (the flood spans batches)
    thin = analyze([fileroot])
    [run] = thin.runs
    flooded = run.events.filter(pl.col("kind") == kind)
    assert flooded["message"].null_count() > flood * 0.9
    # The evidence quotes the lines themselves.
    log = next(fileroot.rglob("trainer.log")).read_text().splitlines()
    [incident] = [i for i in run.incidents if i.kind == "reward_collapse"]
    quoted = [e for e in incident.evidence if e.kind == kind]
    assert quoted and all(e.text == re.sub(r"\x1b\[[0-9;]*m", "", log[e.line - 1]).rstrip()[:300] for e in quoted)
    assert max(e.line for e in quoted) > first + HELD_MESSAGES  # (one whose text was not held)

    monkeypatch.setattr(forensics.readers, "HELD_MESSAGES", None)
    whole = analyze([fileroot])
    assert whole.runs[0].events["message"].null_count() == 0
    assert thin.to_document() == whole.to_document()
    assert with_messages(run.events).equals(whole.runs[0].events)


def test_the_events_command_writes_every_message_of_a_flood(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fileroot, _ = _flooded(tmp_path, 20_000)
    runner = CliRunner()
    thin = runner.invoke(app, ["events", str(fileroot), "--no-cache", "--kind", "request_timeout"])
    monkeypatch.setattr(forensics.readers, "HELD_MESSAGES", None)
    whole = runner.invoke(app, ["events", str(fileroot), "--no-cache", "--kind", "request_timeout"])
    assert thin.exit_code == whole.exit_code == 0
    rows = [json.loads(line) for line in thin.stdout.splitlines()]
    assert len(rows) > 20_000 and all("timed out after" in row["message"] for row in rows)
    assert thin.stdout == whole.stdout


def test_a_line_read_back_is_the_message_a_reader_would_have_held(tmp_path: Path) -> None:
    """Every event of every AReaL log, its text let go and read back, is the event read whole:
    colours, a progress bar's carriage returns, bytes that are not UTF-8, a line too long to keep
    whole, Windows line ends, a gzipped copy."""
    fileroot, first = _flooded(tmp_path, 3000)
    trainer = next(fileroot.rglob("trainer.log"))
    lines = trainer.read_bytes().splitlines(keepends=True)
    timeout = lines[first - 1].rstrip(b"\n")
    warts = [b"\r 37%|###   | 3/8 \r" + timeout, timeout.replace(b"timed out", b"timed \xff\xfe out"),
             timeout[:-20] + b"x" * (3 << 20) + timeout[-20:], timeout + b"\r"]
    trainer.write_bytes(b"".join(lines[:first] + [w + b"\n" for w in warts] + lines[first:]))
    packed = tmp_path / "trainer.log.gz"
    packed.write_bytes(gzip.compress(trainer.read_bytes()))
    logs = [trainer, packed, *(p for p in FIXTURES.rglob("*") if p.is_file() and p.suffix in (".log", ".gz") and looks_like_areal(p))]
    assert len(logs) >= 4
    for log in logs:
        whole = read_areal_log(log).events
        thin = read_areal_log(log, held=0).events
        assert thin.select(pl.col("kind").is_in(list(REPEATED_KINDS)) & pl.col("message").is_null()).to_series().sum() > 0 or not (
            whole["kind"].is_in(list(REPEATED_KINDS)).any()), log
        assert with_messages(thin).equals(whole), log


def test_lines_are_read_back_across_blocks_and_past_the_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parsers._lines, "BATCH_BYTES", 64)  # (a block of a line or two)
    log = tmp_path / "a.log"
    log.write_bytes(b"".join(f"line {i} {'x' * (i % 50)}\n".encode() for i in range(1, 401)))
    wanted = pl.Series([400, 3, 3, 250, 401, 1, None])
    found = lines_at(log, wanted)
    assert found["line"].to_list() == [1, 3, 250, 400]
    assert [t.split()[1] for t in found["text"]] == ["1", "3", "250", "400"]
    assert lines_at(tmp_path / "gone.log", wanted).is_empty()


def test_lines_read_back_again_start_near_them_unless_the_file_was_rewritten(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second read of lines deep in a log starts at the block marked before them, not at the top;
    the same file rewritten in place (same inode, other lines) is read from the top."""
    monkeypatch.setattr(parsers._lines, "BATCH_BYTES", 256)
    log = tmp_path / "trainer.log"
    log.write_bytes(b"\0\0\xef\xbb\xbf" + b"".join(f"a {i:05d}\n".encode() for i in range(1, 2001)))
    assert lines_at(log, pl.Series([1900]))["text"].to_list() == ["a 01900"]
    [marks] = [m for key, m in parsers._lines._MARKS.items() if key == (log.stat().st_dev, log.stat().st_ino)]
    assert len(marks) > 10
    starts = []
    monkeypatch.setattr(parsers._lines, "_positioned_blocks",
                        lambda fd, size, offset=0: starts.append(offset) or _positioned_blocks(fd, size, offset))
    assert lines_at(log, pl.Series([1990, 1901, 1]))["text"].to_list() == ["a 00001", "a 01901", "a 01990"]
    assert lines_at(log, pl.Series([1999, 1950]))["text"].to_list() == ["a 01950", "a 01999"]
    line_1950 = 5 + 8 * 1949
    assert starts[0] == 0 and line_1950 - 256 <= starts[1] <= line_1950  # (from the block before 1950's, not the top)
    with open(log, "r+b") as fh:  # (rewritten in place: the bytes before each mark are others now)
        fh.write(b"".join(f"bb {i:05d}\n".encode() for i in range(1, 2001)))
    assert lines_at(log, pl.Series([1950]))["text"].to_list() == ["bb 01950"]


def test_calls_to_another_server_after_one_exits_are_not_calls_to_it_whether_their_text_is_held(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Server A exits; every refused call after it names server B. Held or not, a call's server is
    read from its line: no "server_down" for A."""
    start = schedule(RunSpec(last_step=60))[28].time
    spec = RunSpec(last_step=60, request_timeout=120,
                   outages=(Outage(start=start, end=start + timedelta(minutes=40), kind="refused", server_exit=True),))
    paths = write_run(tmp_path / "outputs", spec)
    out, flooded = [], False
    for line in paths.trainer_log.read_text().splitlines(keepends=True):
        if any(said in line for said in ("Cannot connect", "Workflow execution failed", "Failed after")):
            line = line.replace("172.17.0.2:30000", "172.17.0.9:30000").replace("'172.17.0.2', 30000", "'172.17.0.9', 30000")
            if "Cannot connect" in line and not flooded:
                out, flooded = out + [line] * 300, True
        out.append(line)
    paths.trainer_log.write_text("".join(out))
    thin = analyze([paths.fileroot])
    assert thin.runs[0].events.filter(pl.col("kind") == "connection_refused")["message"].null_count() > 0
    monkeypatch.setattr(forensics.readers, "HELD_MESSAGES", None)
    whole = analyze([paths.fileroot])
    assert "server_down" not in [i.kind for i in whole.runs[0].incidents]
    assert thin.to_document() == whole.to_document()


def test_a_flood_after_a_servers_exit_is_read_back_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The refused calls after a server's exit are read for what they say (the attribution) and the
    server they name (``server_down``) in one pass over their lines, not one each."""
    start = schedule(RunSpec(last_step=60))[28].time
    spec = RunSpec(last_step=60, request_timeout=120,
                   outages=(Outage(start=start, end=start + timedelta(minutes=40), kind="refused", server_exit=True),))
    paths = write_run(tmp_path / "outputs", spec)
    lines = paths.trainer_log.read_text().splitlines(keepends=True)
    i = next(i for i, line in enumerate(lines) if "Cannot connect" in line)
    paths.trainer_log.write_text("".join(lines[: i + 1] + [lines[i]] * 20_000 + lines[i + 1 :]))
    asked: list[int] = []

    def counted(path: str, numbers: pl.Series):
        asked.append(len(numbers))
        return parsers._lines.iter_lines_at(path, numbers)

    monkeypatch.setattr(forensics.texts, "iter_lines_at", counted)
    [run] = analyze([paths.fileroot]).runs
    unheld = run.events["message"].null_count()
    assert unheld > 19_000 and "server_down" in [i.kind for i in run.incidents]
    assert unheld <= sum(asked) < 1.1 * unheld  # (and the few lines quoted)


def test_a_replays_alarms_read_a_flood_back_once_between_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``watch --replay`` reads a flood's lines for what they say once for all its alarms (besides
    once to follow the run and once for the offline analysis it compares with), not once an alarm."""
    fileroot, _ = _flooded(tmp_path, 20_000)
    unheld = analyze([fileroot]).runs[0].events["message"].null_count()
    asked: list[int] = []

    def counted(path: str, numbers: pl.Series):
        asked.append(len(numbers))
        return parsers._lines.iter_lines_at(path, numbers)

    monkeypatch.setattr(forensics.texts, "iter_lines_at", counted)
    [result] = replay([fileroot])
    assert len(result.alarms) + len(result.folded) >= 3 and unheld > 19_000
    assert 3 * unheld <= sum(asked) < 3.1 * unheld  # (and the few lines quoted)


def test_the_timelines_markers_quote_a_floods_lines(tmp_path: Path) -> None:
    """Fewer problem events than markers: each its own marker, quoting its line."""
    fileroot, first = _flooded(tmp_path, 500, outage="refused")
    [run] = analyze([fileroot]).runs
    assert run.events["message"].null_count() > 0
    markers = run.event_markers(MAX_EVENT_MARKERS)
    assert markers.height <= MAX_EVENT_MARKERS and markers["message"].null_count() == 0
    log = next(fileroot.rglob("trainer.log")).read_text().splitlines()
    assert all(m == re.sub(r"\x1b\[[0-9;]*m", "", log[n - 1]).rstrip() for m, n in markers.select("message", "line").iter_rows())


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "gzip"])
def test_a_flood_read_back_a_slice_at_a_time_is_read_back_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, packed: bool) -> None:
    fileroot, _ = _flooded(tmp_path, 5000)
    if packed:
        log = next(fileroot.rglob("trainer.log"))
        log.with_suffix(".log.gz").write_bytes(gzip.compress(log.read_bytes()))
        log.unlink()
    monkeypatch.setattr(parsers._lines, "BATCH_BYTES", 64 << 10)  # (many blocks, many marks)
    [run] = analyze([fileroot]).runs
    parts = list(iter_with_messages(run.events, rows=700))
    assert len(parts) == (1 if packed else -(-run.events.height // 700))
    assert pl.concat(parts).equals(with_messages(run.events))
    assert pl.concat(parts).filter(pl.col("kind") == "request_timeout")["message"].null_count() == 0
