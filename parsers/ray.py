"""Ray session directories and Ray driver consoles → event frames.

A session (``session_<date>_<time>_<us>_<pid>/logs/``) holds C++ component logs (``raylet.out``,
``gcs_server.out``, ``python-core-worker-*.log``: ``[time L pid tid] (component) file:line: msg``),
Python component logs (``monitor.log``, ``dashboard*.log``: ``time<TAB>LEVEL file:line -- msg``),
worker stdout/stderr (``worker-<id>-<job>-<pid>.out|.err``, free-form application output tagged
with ``:actor_name:``/``:task_name:`` markers), and JSON Lines event files (``events/``,
``export_events/``). A console (driver output, ``job-driver-*.log``, verl's ``train.log``) has the
``(Name pid=N, ip=…)`` prefixes and ``[repeated Nx across cluster]`` summaries Ray adds when it
forwards worker output. See ``shared/formats/ray_verl.md``.

Work is split as in :mod:`parsers.areal`: :func:`scan_parts` is one lazy pass over a batch of
lines (strip colours and prefixes, tag lines with cheap checks, keep only event candidates,
traceback runs, the time headers they need and markers), :func:`stitch_parts` joins the batches'
rows, :func:`assemble_events` turns the few kept rows into events. A file of any size is read
in bounded memory.

Event frames have the :data:`~parsers.schema.EVENT_SCHEMA` columns plus ``count`` (how many
occurrences one row stands for: ``[repeated 4x across cluster]`` is one row with count 4),
``pid`` and ``worker`` (the process the event is about, and its actor/task name when known) and
``detail`` (a worker's exit type and what its exit detail means, e.g. ``SYSTEM_ERROR
(unexpected): exit code 3``). Its ``source``, ``kind``, ``severity`` and ``file`` are strings, not
categories: a session's events are few and this reader works on their text.
``conform(frame, EVENT_SCHEMA)`` drops the extra columns and makes those categories.

Example:
    >>> session = read_ray_session(Path("/tmp/ray/session_2026-11-22_03-11-31_648770_32459"))  # doctest: +SKIP
    >>> session.events.filter(pl.col("kind") == "actor_died")  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

import polars as pl

from parsers._formats import LogFormat, load_format
from parsers._lines import ANSI, HEAVY_BATCH_BYTES, collect_lines, lines_of_blocks, only_block, open_log, sniff
from parsers._walk import files_under, walk
from parsers.schema import EVENT_SCHEMA, traceback_message

__all__ = [
    "RAY_EVENT_SCHEMA",
    "WORKER_SCHEMA",
    "RayLog",
    "RaySession",
    "RaySource",
    "assemble_events",
    "find_ray_sessions",
    "has_prefixes",
    "looks_like_ray_session",
    "read_ray_console",
    "read_ray_session",
    "scan_parts",
    "stitch_parts",
]

#: Events with the extra columns this parser fills (see the module docstring).
RAY_EVENT_SCHEMA: dict[str, pl.DataType] = {
    **EVENT_SCHEMA,
    **dict.fromkeys(("source", "kind", "severity", "file"), pl.String()),
    "count": pl.Int64(),
    "pid": pl.Int64(),
    "worker": pl.String(),
    "detail": pl.String(),
}

#: One row per worker ``.out``/``.err`` file: whose output it is.
WORKER_SCHEMA: dict[str, pl.DataType] = {
    "file": pl.String(),
    "stream": pl.String(),
    "worker_id": pl.String(),
    "job_id": pl.String(),
    "pid": pl.Int64(),
    "name": pl.String(),
    "name_kind": pl.String(),
    "names": pl.List(pl.String()),
    "lines": pl.Int64(),
}

#: A file's ``:actor_name:``-style marker lines.
_MARKER_SCHEMA = {"line": pl.Int64, "text": pl.String}
#: The events an ``events/`` or ``export_events/`` file yields, before their common columns.
_JSON_EVENT_SCHEMA = {"time": pl.Datetime("ms"), "kind": pl.String, "severity": pl.String, "line": pl.Int64, "message": pl.String, "worker_id": pl.String}

SESSION_NAME = re.compile(r"session_(\d{4}-\d\d-\d\d)_(\d\d-\d\d-\d\d)_(\d{6})_(\d+)")
_WORKER_FILE = re.compile(r"(?:io-)?worker-([0-9a-f]{56})-(?:([0-9a-f]{8})-)?(\d+)\.(out|err)(?:\.\d+)?(?:\.gz)?")
_CORE_FILE = re.compile(r"python-core-(worker|driver)-([0-9a-f]{56})_(\d+)\.log(?:\.\d+)?(?:\.gz)?")
_HEADER_START = r"^(?:\[\d{4}-\d\d-\d\d |\d{4}-\d\d-\d\d \d\d:|(?:\[rank\d+\]:)?\[?[IWEF]\d{3,4} \d\d:)"
_ERROR_LEVEL = (
    r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [EC] |^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\s+(?:ERROR|CRITICAL) "
    r"|^\[\d{4}-\d\d-\d\d [^\]]*\] \[(?:ERROR|CRITICAL)\]"
)
_CHAIN = r"^(?:During handling of the above exception|The above exception was the direct cause)"
_REPEATED = r" \[repeated (\d+)x across cluster\]"
_MARKER = r"^:(actor_name|task_name|job_id):(.*)$"
_HEAD_CHARS = 400
_MESSAGE_CHARS = 2000
#: Lines after a traceback's exception line that still belong to its message (Ray appends
#: ``\tclass_name: …`` and the death cause there).
_TRACEBACK_TAIL = 12
#: A SIGSEGV dump prints each line raw and again through Ray's logger: one crash, one event.
_DUMP_SPAN = 40
#: Small files of one kind with an event, in a group, that are read in one pass rather than each alone.
_TOGETHER = 8
_FREE_FORM = {"ray_worker_out", "ray_worker_err", "ray_console", "ray_job_driver", "ray_debug_state", "verl_console"}
_STRUCTURED = {"ray_raylet", "ray_gcs", "ray_core_worker", "ray_core_driver", "ray_component"}


class RaySource(NamedTuple):
    """One file that was read: what it is and how much of it was understood."""

    path: str
    kind: str
    lines: int
    unparsed_lines: int
    notes: tuple[str, ...]


@dataclass(frozen=True)
class RayLog:
    """What one text log (a session file or a console) holds."""

    path: str
    kind: str
    events: pl.DataFrame
    lines: int
    unparsed_lines: int
    markers: pl.DataFrame
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class RaySession:
    """Everything read from one Ray session directory."""

    path: str
    name: str | None
    started: datetime | None
    events: pl.DataFrame
    workers: pl.DataFrame
    sources: list[RaySource]
    notes: tuple[str, ...] = ()
    facts: dict[str, str] = field(default_factory=dict)


@cache
def _extras() -> dict[str, Any]:
    """Parts of ``formats/ray.json`` the shared loader does not model."""
    data = json.loads((resources.files("parsers") / "formats" / "ray.json").read_text(encoding="utf-8"))
    return {"torch": frozenset(data["sources"]["torch"]), "ray": frozenset(e["kind"] for e in data["events"])}


def source_of(kind: pl.Expr, default: str) -> pl.Expr:
    """``torch`` for PyTorch/NCCL/CUDA kinds, ``ray`` for Ray's own, ``default`` otherwise."""
    extras = _extras()
    return (
        pl.when(kind.is_in(list(extras["torch"])))
        .then(pl.lit("torch"))
        .when(kind.is_in(list(extras["ray"] - extras["torch"])))
        .then(pl.lit("ray"))
        .otherwise(pl.lit(default))
    )


# ---------------------------------------------------------------------------------------------
# The lazy, line-local pass


#: What is left of a colour code when a copy lost its ESC byte: "[36m(TaskRunner pid=…)[0m …".
_RESIDUE = r"^\[[0-9;]+m"
#: Any line the clean-up would change: colours (or their residue), carriage returns, Ray's dedup
#: suffixes, structured (JSON) records. Two tests: with the anchored one in the alternation, lines
#: that open with ``[`` cost 4× as much.
_UNCLEAN = (r'\x1b|\r$|\[repeated |"asctime"', _RESIDUE)


def _normalized(lines: pl.LazyFrame, fmt: LogFormat, prefixed: bool) -> pl.LazyFrame:
    """Colours, console prefixes and dedup suffixes removed; ``stream`` is the prefix, if any.

    A batch whose lines need no clean-up (most of a raylet.out or a worker's .err, many consoles)
    skips it: two tests a line instead of a dozen (Polars evaluates every branch of a ``when`` on
    every line). Console prefixes are looked for only in files that have them.
    """
    text = pl.col("text")
    unclean = lines.select(pl.any_horizontal(text.str.contains(r).any() for r in _UNCLEAN)).collect().item()
    if unclean:
        cleaned = (
            pl.when(text.str.contains("\x1b", literal=True))
            .then(text.str.replace_all(ANSI, ""))
            .when(text.str.contains(_RESIDUE))
            .then(text.str.replace_all(r"\[[0-9;]+m", ""))
            .otherwise(text)
        )
        structured = text.str.starts_with("{") & text.str.contains('"asctime"', literal=True)
        as_header = pl.format(
            "[{} {} 0 0] {}",
            text.str.extract(r'"asctime":\s*"([^"]+)"', 1),
            text.str.extract(r'"levelname":\s*"(\w)', 1),
            text.str.extract(r'"message":\s*"((?:[^"\\]|\\.)*)"', 1).str.replace_all(r'\\"', '"'),
        )
        lines = lines.with_columns(text.str.strip_suffix("\r")).with_columns(
            pl.when(structured).then(as_header).otherwise(cleaned).alias("text")
        )
    stream = pl.lit("")
    if prefixed:
        prefix_regex = "^(?:" + "|".join(f"(?:{p.lstrip('^')})" for p in fmt.prefixes.values()) + ")"
        prefix = pl.when(text.str.starts_with("(")).then(text.str.extract(f"({prefix_regex})", 1))
        lines = lines.with_columns(prefix.alias("stream")).with_columns(
            pl.when(pl.col("stream").is_not_null()).then(text.str.slice(pl.col("stream").str.len_chars())).otherwise(text).alias("text"),
        )
        stream = pl.col("stream").str.strip_chars().fill_null("")
    if not unclean:
        return lines.with_columns(stream.alias("stream"), pl.lit(1, pl.Int64).alias("count"))
    repeated = pl.when(text.str.contains("[repeated ", literal=True)).then(text.str.extract(_REPEATED, 1).cast(pl.Int64, strict=False))
    return lines.with_columns(stream.alias("stream"), repeated.alias("count")).with_columns(
        pl.when(pl.col("count").is_not_null()).then(text.str.replace(r" \[repeated \d+x across cluster\].*$", "")).otherwise(text).alias("text"),
        pl.col("count").fill_null(1),
    )


def _tags(fmt: LogFormat) -> list[pl.Expr]:
    """What each line is, one column a test (Polars does not share a subexpression between
    contexts: as columns, later expressions read each test's result instead of running it again)."""
    text = pl.col("text")
    is_start = text.str.contains(fmt.traceback_start)
    return [
        is_start.alias("is_start"),
        text.str.contains(fmt.traceback_exception).alias("is_exc"),
        (text.str.starts_with(" ") | text.str.starts_with("\t")).alias("indented"),
        text.str.contains(r"^\s*$").alias("blank"),
        text.str.contains(_CHAIN).alias("chain"),
        text.str.contains(_HEADER_START).alias("header"),
        (text.str.starts_with(":") & text.str.contains(_MARKER)).alias("marker"),
        # A line that may become an event: a file without one has none.
        (text.str.contains(fmt.any_event) | is_start | text.str.contains(_ERROR_LEVEL)).alias("candidate"),
    ]


#: A file's (or a batch's) counts from its tagged lines (see :func:`_tags`).
_STATS = [
    pl.col("line").max().alias("lines"),
    # Text after a dated line continues that record (state dumps, OOM reports); only lines
    # before the first dated line belong to none.
    (~pl.col("header") & (pl.col("header").cast(pl.Int8).cum_max() == 0) & ~pl.col("blank") & ~pl.col("marker"))
    .sum()
    .alias("unparsed"),
    (pl.col("stream") != "").sum().alias("prefixed"),
    pl.col("text").filter(pl.col("header")).first().str.head(64).alias("first_dated"),
]


def scan_parts(
    lines: pl.LazyFrame,
    fmt: LogFormat,
    extra: Callable[[pl.LazyFrame], dict[str, pl.LazyFrame]] | None = None,
    *,
    prefixed: bool = True,
    apart: bool = False,
) -> dict[str, pl.LazyFrame]:
    """The lazy queries over one batch of lines whose results, joined by :func:`stitch_parts`,
    :func:`assemble_events` reads (``extra`` adds more over the same lines).

    Every line is tagged with cheap anchored checks; only event candidates, traceback runs, the
    dated lines they borrow a time from, Ray's markers and where each stream stands at the end
    leave the pass. ``prefixed=False`` (see :func:`has_prefixes`) skips console prefixes, so
    running state is kept per file rather than per prefix. ``apart``: the lines of several files,
    told apart by a ``file`` column and numbered on from one to the next; each file's streams are
    its own (the file's index follows the prefix in ``stream``, after a NUL).
    """
    norm = _normalized(lines, fmt, prefixed)
    if apart:
        norm = norm.with_columns(pl.concat_str(pl.col("stream"), pl.lit("\x00"), pl.col("file").cast(pl.String)).alias("stream"))
    per_stream = (lambda e: e.over("stream")) if prefixed or apart else (lambda e: e)  # noqa: E731
    text = pl.col("text")
    tagged = norm.with_columns(_tags(fmt)).with_columns(
        pl.any_horizontal("indented", "blank", "is_start", "is_exc", "chain").alias("tbish"),
    ).with_columns(
        per_stream((~pl.col("tbish")).cast(pl.Int64).cum_sum()).alias("run"),
        # The last dated line of the stream so far: where an undated event borrows its time.
        per_stream(pl.when(pl.col("header")).then(pl.col("line")).forward_fill()).alias("dated_line"),
        # A record: a line and the indented or blank lines after it.
        per_stream((~(pl.col("indented") | pl.col("blank"))).cast(pl.Int64).cum_sum()).alias("record"),
    )
    candidates = tagged.filter(pl.col("candidate")).select("line", "stream", "count", "dated_line", "record", text.str.head(_MESSAGE_CHARS))
    # Where each stream stands at the batch's end: what the next batch counts on from (see stitch_parts).
    tail = tagged.group_by("stream").agg(
        pl.col("run", "record", "dated_line").max(), text.filter(pl.col("header")).last().str.head(64).alias("dated_text")
    )
    runs = (
        tagged.filter(pl.col("tbish"))
        .group_by("stream", "run")
        .agg(
            pl.col("line").filter(pl.col("is_start")).min().alias("start"),
            text.filter(pl.col("is_start")).first().str.head(_MESSAGE_CHARS).alias("start_text"),
            pl.col("line").filter(pl.col("is_exc")).max().alias("exc_line"),
            text.filter(pl.col("is_exc")).last().str.head(_MESSAGE_CHARS).alias("exc_text"),
            text.filter(pl.col("is_exc")).first().str.head(_MESSAGE_CHARS).alias("first_exc"),
            pl.col("line").max().alias("end"),
            pl.col("dated_line").filter(pl.col("is_start")).first().alias("dated_line"),
            pl.col("record").filter(pl.col("is_start")).first().alias("record"),
        )
        # Run 0 continues the batch before's last run: kept, in case it is a traceback's rest.
        .filter(pl.col("start").is_not_null() | (pl.col("run") == 0))
    )
    # Only the dated lines an event may borrow its time from (each stream's last is in ``tail``,
    # for the next batch): never every line of a raylet.out.
    borrowed = pl.col("line").is_in(pl.col("dated_line").filter(pl.col("candidate")).implode())
    parts = {
        "candidates": candidates,
        "runs": runs,
        "tail": tail,
        "markers": tagged.filter(pl.col("marker")).select("line", "text"),
        "dated": tagged.filter(pl.col("header") & borrowed).select("line", text.str.head(64)),
        "stats": tagged.select(_STATS),
    }
    if extra is not None:
        parts.update(extra(norm))
    return parts


def stitch_parts(pieces: dict[str, list[pl.DataFrame]]) -> dict[str, pl.DataFrame]:
    """The batches' :func:`scan_parts` (each part's frames in file order) → those of one pass.

    A batch counts its runs and records from zero and cannot see the dated lines before it: its
    counts are moved on by the batches' before (per stream), its undated lines take the stream's
    last dated line so far, and a traceback run cut by a batch boundary is made whole again.
    Text before a file's first dated line is unparsed only in the batches up to that line.
    """
    carry = pl.DataFrame(schema={"stream": pl.String, "run0": pl.Int64, "record0": pl.Int64, "dated0": pl.Int64})
    candidates, runs, lasts = [], [], []
    for found, run, tail in zip(pieces.pop("candidates"), pieces.pop("runs"), pieces.pop("tail"), strict=True):
        candidates.append(_moved_on(found, carry))
        runs.append(_moved_on(run, carry))
        lasts.append(tail.select(pl.col("dated_line").alias("line"), pl.col("dated_text").alias("text")).drop_nulls())
        carry = (
            tail.join(carry, on="stream", how="full", coalesce=True)
            .select(
                "stream",
                (pl.col("run0").fill_null(0) + pl.col("run").fill_null(0)).alias("run0"),
                (pl.col("record0").fill_null(0) + pl.col("record").fill_null(0)).alias("record0"),
                pl.coalesce("dated_line", "dated0").alias("dated0"),
            )
        )
    whole = (
        pl.concat(runs)
        .group_by("stream", "run", maintain_order=True)
        .agg(
            pl.col("start").min(),
            pl.col("start_text").drop_nulls().first(),
            pl.col("exc_line").max(),
            pl.col("exc_text").drop_nulls().last(),
            pl.col("first_exc").drop_nulls().first(),
            pl.col("end").max(),
            pl.col("dated_line").drop_nulls().first(),
            pl.col("record").drop_nulls().first(),
        )
        .filter(pl.col("start").is_not_null())
        .drop("run")
    )
    stats = pl.concat(pieces.pop("stats"))
    after_first_dated = pl.col("first_dated").is_not_null().cum_sum().shift(1, fill_value=0) > 0
    stats = stats.with_columns(pl.when(after_first_dated).then(0).otherwise(pl.col("unparsed")).alias("unparsed"))
    dated = pl.concat([*pieces.pop("dated"), *lasts]).unique("line").sort("line")
    rest = {name: pl.concat(frames) for name, frames in pieces.items()}
    return {"candidates": pl.concat(candidates), "runs": whole, "stats": stats, "dated": dated, **rest}


def _moved_on(frame: pl.DataFrame, carry: pl.DataFrame) -> pl.DataFrame:
    """A batch's rows with run and record numbers counted from the file's start, and the dated
    line before the batch where they have none in it (a run's only where it starts)."""
    starts = pl.col("start").is_not_null() if "start" in frame.columns else pl.lit(True)
    moved = frame.join(carry, on="stream", how="left", maintain_order="left").with_columns(
        (pl.col("record") + pl.col("record0").fill_null(0)).alias("record"),
        pl.when(starts).then(pl.coalesce("dated_line", "dated0")).alias("dated_line"),
    )
    if "run" in frame.columns:
        moved = moved.with_columns(pl.col("run") + pl.col("run0").fill_null(0))
    return moved.select(frame.columns)


# ---------------------------------------------------------------------------------------------
# Eager assembly of the few kept rows


def _parsed_head(frame: pl.DataFrame, fmt: LogFormat, year: int | None, since: datetime | None = None) -> pl.DataFrame:
    """``time``, ``level`` and ``message`` of each row's ``text`` (lines without a header keep it all)."""
    if frame.is_empty():
        return frame.with_columns(
            pl.lit(None, pl.Datetime("ms")).alias("time"), pl.lit(None, pl.String).alias("level"), pl.col("text").alias("message")
        )
    groups = frame.with_columns(pl.col("text").str.head(_HEAD_CHARS).str.extract_groups(fmt.line_regex).alias("g")).unnest("g")
    long_time = pl.coalesce("time", "ptime", "dtime").str.strptime(pl.Datetime("ms"), fmt.timestamp_format, strict=False)
    glog_time = pl.format(
        "{}-{}-{} {}",
        pl.lit(year, pl.Int64),
        pl.col("gdate").str.head(pl.col("gdate").str.len_chars() - 2),
        pl.col("gdate").str.tail(2),
        pl.col("gtime"),
    ).str.strptime(pl.Datetime("ms"), "%Y-%m-%d %H:%M:%S%.f", strict=False)
    if since is not None:
        # A run that crosses New Year: a month-day before the session began is in the next year.
        glog_time = pl.when(glog_time < pl.lit(since - timedelta(days=1))).then(glog_time.dt.offset_by("1y")).otherwise(glog_time)
    # The message is everything after the header; the header regex never fails, so a line it
    # cannot read whole keeps its text (a long line cut at _HEAD_CHARS is re-joined here).
    header_chars = pl.col("text").str.head(_HEAD_CHARS).str.len_chars() - pl.col("message").str.len_chars()
    return groups.select(
        *frame.columns,
        pl.coalesce(long_time, glog_time).alias("time"),
        pl.coalesce("level", "plevel", "dlevel", "glevel").alias("level"),
        pl.col("text").str.slice(header_chars).alias("message"),
    ).drop("text")


def _year_of(stats: pl.DataFrame) -> int | None:
    """The year of the file's first dated line, when that line has one (glog lines do not)."""
    found = stats.select(pl.col("first_dated").str.extract(r"(\d{4})-\d\d-\d\d", 1).cast(pl.Int64, strict=False).drop_nulls().first()).item()
    return int(found) if found is not None else None


def assemble_events(
    path: str,
    kind: str,
    parts: dict[str, pl.DataFrame],
    fmt: LogFormat,
    *,
    year: int | None = None,
    since: datetime | None = None,
    source: str = "ray",
) -> RayLog:
    """Events, line counts and markers of one file from the rows :func:`scan_parts` kept.

    ``year`` dates glog lines (``[E419 10:42:28…]`` carry none), or ``since`` (the session start:
    its year, and the next one for dates before it); without either the file's own first dated
    line lends its year, else those times stay null.
    """
    year = since.year if since is not None and year is None else year
    total, unparsed, notes, year = _tally(parts["stats"], kind, year)
    free_form = kind in _FREE_FORM

    lines = _parsed_head(parts["candidates"], fmt, year, since)
    classified = lines.with_columns(fmt.classify(pl.col("message")).alias("kind"))
    is_error = pl.col("level").is_in(["E", "ERROR", "CRITICAL", "C"])
    if kind in _STRUCTURED:
        # A record's text after its dated first line restates it (OOM reports, error_message: …).
        classified = classified.filter(pl.col("level").is_not_null())
    named = classified.filter(pl.col("kind").is_not_null() | is_error).with_columns(
        pl.col("kind").fill_null(pl.when(pl.col("level") == "C").then(pl.lit("fatal_check")).otherwise(pl.lit("log_error")))
    )
    tracebacks = _tracebacks(parts["runs"], fmt, year, since)
    named, tracebacks = _fold_into_tracebacks(_with_detail(named), _with_detail(tracebacks))
    events = pl.concat(
        [
            named.select("line", "stream", "count", "dated_line", "record", "time", "level", "kind", "message", "pid", "worker_id", "detail"),
            tracebacks.select("line", "stream", "count", "dated_line", "record", "time", "level", "kind", "message", "pid", "worker_id", "detail"),
        ],
        how="vertical_relaxed",
    ).sort("line")
    events = _merge_restatements(_collapse_dumps(events))
    events = _backfill_times(events, parts["dated"], fmt, year, since, within=3 if free_form else None)
    prefix_pid = pl.col("stream").str.extract(r"pid=(\d+)", 1).cast(pl.Int64, strict=False)
    # The process an event is about: the one its text names, else the one that printed it.
    named_worker = pl.col("message").str.extract(r"ray::([\w<>.]+?)\.\w+\(\) \(pid=", 1)
    prefix_worker = pl.when(pl.col("pid").is_null() | (pl.col("pid") == prefix_pid)).then(
        pl.col("stream").str.extract(r"^\((?:([^()]*?) )?pid=", 1)
    )
    events = events.with_columns(
        fmt.severity_of(pl.col("kind"), pl.col("level").fill_null("")).alias("severity"),
        source_of(pl.col("kind"), source).alias("source"),
        pl.lit(path).alias("file"),
        pl.lit(None, pl.Int64).alias("step"),
        pl.coalesce(named_worker, prefix_worker).alias("worker"),
        pl.coalesce(pl.col("pid"), prefix_pid).alias("pid"),
    )
    return RayLog(
        path=path,
        kind=kind,
        events=events.select(*RAY_EVENT_SCHEMA, "worker_id"),
        lines=total,
        unparsed_lines=unparsed,
        markers=parts["markers"],
        notes=tuple(notes),
    )


def _tally(stats: pl.DataFrame, kind: str, year: int | None) -> tuple[int, int, list[str], int | None]:
    """A file's line count, unparsed lines, notes and the year its glog lines are dated in, from
    its batches' stats (see :func:`scan_parts`)."""
    total = int(stats["lines"].max() or 0)
    free_form = kind in _FREE_FORM
    unparsed = 0 if free_form else int(stats["unparsed"].sum() or 0)
    notes = []
    year = year if year is not None else _year_of(stats)
    if year is None and stats["first_dated"].drop_nulls().len():
        notes.append("glog lines without a year and no dated line to borrow one from: their times are null")
    if free_form and int(stats["prefixed"].sum() or 0):
        notes.append("console lines carry no time of their own: times are null unless a dated line of the same stream precedes them")
    return total, unparsed, notes, year


def _tracebacks(runs: pl.DataFrame, fmt: LogFormat, year: int | None, since: datetime | None) -> pl.DataFrame:
    """One event per traceback run, at its first line; kind from the last exception in the run."""
    runs = runs.with_columns(
        pl.when(pl.col("exc_line") >= pl.col("start")).then(pl.col("exc_text")).alias("exc_text")
    ).with_columns(
        # A traceback flattened onto one line (pasted copies) names its exception on that line.
        pl.coalesce("exc_text", "start_text").alias("exception"),
        pl.col("start_text").alias("text"),
    )
    parsed = _parsed_head(runs.select("start", "text"), fmt, year, since).rename({"start": "line"})
    return (
        runs.rename({"start": "line"})
        .join(parsed.select("line", "time", "level"), on="line", how="left")
        .with_columns(fmt.traceback_kind(pl.col("exception").fill_null("")).alias("end_kind"))
        .with_columns(fmt.chain_kind(pl.col("first_exc"), pl.col("end_kind")).alias("kind"), pl.lit(1, pl.Int64).alias("count"))
        .with_columns(
            traceback_message(pl.col("start_text"), pl.col("first_exc"), pl.col("exc_text"),
                              pl.col("kind") != pl.col("end_kind")).alias("message"),  # (the root's kind: named too)
        )
        .drop("first_exc", "end_kind")
        .with_columns(pl.lit("ERROR").alias("level"))
    )


_EXIT_TYPE = r"(?:Worker exit type: |exit_type = |exits, type=|Owner worker exit type: |exit_type=)([A-Z_]+)"
_PID = r"(?:Worker PID: |\bpid=|\bpid: |\(pid=)(\d+)"
_WORKER_ID = r"(?:worker[ _]id ?[=:] ?|Worker ID: |on worker )([0-9a-f]{56})"


def _with_detail(frame: pl.DataFrame) -> pl.DataFrame:
    """``detail`` (exit type and what the exit detail means), ``pid`` and ``worker_id`` named in the text."""
    text = pl.col("message")
    meaning = (
        pl.when(text.str.contains("connection error code 2"))
        .then(pl.lit("connection to the worker lost (SIGKILL, kernel OOM killer, segfault or os._exit)"))
        .when(text.str.contains(r"exit code -?\d+"))
        .then(pl.format("exit code {}", text.str.extract(r"exit code (-?\d+)", 1)))
        .when(text.str.contains("running low on memory|NODE_OUT_OF_MEMORY|OOMContext|memory pressure"))
        .then(pl.lit("killed by the Ray memory monitor (host memory)"))
        .when(text.str.contains(r"SIGTERM|exit code None"))
        .then(pl.lit("SIGTERM"))
        .when(text.str.contains(r"\*\*\* SIG[A-Z]+ received"))
        .then(text.str.extract(r"\*\*\* (SIG[A-Z]+) received", 1))
        .when(text.str.contains(r"killed by `ray\.kill`"))
        .then(pl.lit("killed by ray.kill"))
        .when(text.str.contains(r"exit_actor\(\) is called"))
        .then(pl.lit("exit_actor() called"))
        .when(text.str.contains("its owner has died"))
        .then(pl.lit("its owner died"))
        .when(text.str.contains("its node has died"))
        .then(pl.lit("its node died"))
        .when(text.str.contains(r"error raised in its creation task|creation_task_exception=1"))
        .then(pl.lit("its constructor raised"))
    )
    exit_type = text.str.extract(_EXIT_TYPE, 1)
    intent = pl.when(exit_type.str.starts_with("INTENDED")).then(pl.lit(" (intended)")).when(exit_type.is_not_null()).then(pl.lit(" (unexpected)"))
    typed = pl.concat_str(exit_type, intent.fill_null(""))
    return frame.with_columns(
        pl.when(exit_type.is_not_null() | meaning.is_not_null())
        .then(pl.concat_str(typed, meaning, separator=": ", ignore_nulls=True))
        .alias("detail"),
        pl.when(text.str.count_matches(_PID) == 1).then(text.str.extract(_PID, 1).cast(pl.Int64, strict=False)).alias("pid"),
        text.str.extract(_WORKER_ID, 1).alias("worker_id"),
    )


def _fold_into_tracebacks(named: pl.DataFrame, tracebacks: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Line events that only repeat their traceback's kind join it (their detail too)."""
    if named.is_empty() or tracebacks.is_empty():
        return named, tracebacks
    blocks = tracebacks.select(
        "stream", pl.col("line").alias("tb_line"), pl.col("end").alias("tb_end"), pl.col("kind").alias("tb_kind")
    ).sort("tb_line")
    placed = named.sort("line").join_asof(blocks, left_on="line", right_on="tb_line", by="stream", strategy="backward", check_sortedness=False)
    inside = (pl.col("line") <= pl.col("tb_end") + _TRACEBACK_TAIL) & (pl.col("kind") == pl.col("tb_kind"))
    folded = placed.filter(inside.fill_null(False))
    kept = placed.filter(~inside.fill_null(False)).drop("tb_line", "tb_end", "tb_kind")
    # Not the pid: inside a traceback it names the caller as often as the process that died.
    moved = folded.group_by("stream", "tb_line").agg(
        pl.col("detail").drop_nulls().first().alias("moved_detail"),
        pl.col("worker_id").drop_nulls().first().alias("moved_worker_id"),
    )
    tracebacks = (
        tracebacks.join(moved, left_on=["stream", "line"], right_on=["stream", "tb_line"], how="left")
        .with_columns(
            pl.coalesce("detail", "moved_detail").alias("detail"),
            pl.coalesce("worker_id", "moved_worker_id").alias("worker_id"),
        )
        .drop("moved_detail", "moved_worker_id")
    )
    return kept, tracebacks


def _backfill_times(
    events: pl.DataFrame, dated: pl.DataFrame, fmt: LogFormat, year: int | None, since: datetime | None, *, within: int | None
) -> pl.DataFrame:
    """An event without a time of its own takes the last dated line of its stream before it.

    ``within`` limits how many lines back that line may be (free-form output interleaves
    processes, so an older dated line there says little about when the event happened).
    """
    if events.is_empty():
        return events
    needed = dated.filter(pl.col("line").is_in(events["dated_line"].drop_nulls().implode()))
    stamps = _parsed_head(needed, fmt, year, since).select(pl.col("line").alias("dated_line"), pl.col("time").alias("dated_time"))
    near = pl.lit(True) if within is None else (pl.col("line") - pl.col("dated_line") <= within)
    joined = events.join(stamps, on="dated_line", how="left", maintain_order="left")
    return joined.with_columns(pl.coalesce("time", pl.when(near).then(pl.col("dated_time"))).alias("time")).drop("dated_time")


def _merge_restatements(events: pl.DataFrame) -> pl.DataFrame:
    """An undated line that restates the event just above it (same kind and stream, in that
    event's record or the next one, no other process or rank named) continues it: ``Memory on
    the node …`` after ``OutOfMemoryError: Task was killed …``, the death cause after
    ``ActorDiedError``'s indented context, ``what():`` and ``*** SIGABRT`` after ``terminate called …``.
    The very same line again is not: a warning a worker logs each step happened each time."""
    if events.height < 2:
        return events
    rank = pl.col("message").str.extract(r"\[[Rr]ank ?(\d+)\]", 1)
    ordered = events.with_columns(rank.alias("rank")).sort("stream", "kind", "line")
    keys = ["stream", "kind"]
    same = lambda col: (pl.col(col).is_null() | pl.col(col).shift(1).over(keys).is_null() | (pl.col(col) == pl.col(col).shift(1).over(keys)))  # noqa: E731
    # The same rank named again a few lines on is the same failure retold (``what():`` of an abort).
    retold = (pl.col("rank") == pl.col("rank").shift(1).over(keys)) & (pl.col("line") - pl.col("line").shift(1).over(keys) <= _TRACEBACK_TAIL)
    # The very same line again is the failure happening again (a warning each step), not a retelling.
    again = pl.col("message") == pl.col("message").shift(1).over(keys)
    restates = (
        pl.col("level").is_null()
        & ~again.fill_null(False)
        & ((pl.col("record") - pl.col("record").shift(1).over(keys) <= 1) | retold.fill_null(False))
        & same("pid")
        & same("worker_id")
        & same("rank")
    ).fill_null(False)
    grouped = ordered.with_columns((~restates).cum_sum().alias("merged"))
    first = [pl.col(c).first() for c in ("line", "stream", "count", "dated_line", "record", "time", "level", "kind", "message")]
    known = [pl.col(c).drop_nulls().first() for c in ("pid", "worker_id", "detail")]
    merged = grouped.group_by("merged", maintain_order=True).agg(*first, *known)
    return merged.select(events.columns).sort("line")


def _collapse_dumps(events: pl.DataFrame) -> pl.DataFrame:
    """A crash dump is one event: its ``PC: @ 0x…``/frame lines, re-logged copies included."""
    frame_line = (pl.col("kind") == "log_error") & pl.col("message").str.contains(r"(?:PC: )?@ +0x[0-9a-f]+")
    in_dump = (pl.col("kind") == "segfault") | frame_line
    dumps = events.filter(in_dump).sort("line")
    if dumps.is_empty() or (dumps["kind"] == "segfault").sum() == 0:
        return events
    dumps = dumps.with_columns(
        ((pl.col("line") - pl.col("line").shift(1).over("stream")).fill_null(_DUMP_SPAN + 1) > _DUMP_SPAN)
        .cum_sum()
        .over("stream")
        .alias("dump")
    )
    crash = pl.col("kind") == "segfault"
    merged = dumps.group_by("stream", "dump", maintain_order=True).agg(
        pl.col("line").filter(crash).first(),
        pl.col("count").first(),
        pl.col("dated_line").first(),
        pl.col("record").first(),
        pl.col("time").drop_nulls().first(),
        pl.col("level").drop_nulls().first(),
        pl.col("kind").filter(crash).first(),
        pl.col("message").filter(crash).first(),
        pl.col("pid").drop_nulls().first(),
        pl.col("worker_id").drop_nulls().first(),
        pl.col("detail").drop_nulls().first(),
    )
    rest = events.filter(~in_dump)
    merged = merged.filter(pl.col("kind").is_not_null())
    # Frame lines far from any crash line stay what they were (dumps are counted per stream).
    stray = dumps.join(merged.select("stream", "dump"), on=["stream", "dump"], how="anti", maintain_order="left").drop("dump")
    return pl.concat([rest, stray.select(rest.columns), merged.select(rest.columns)], how="vertical_relaxed").sort("line")


# ---------------------------------------------------------------------------------------------
# Files


def read_ray_console(path: Path, *, year: int | None = None) -> RayLog:
    """Events of a Ray driver console (captured stdout, ``job-driver-*.log``), plain or gzipped.

    ``year`` dates glog lines (NCCL watchdog headers carry no year) when the file has no dated line.
    """
    return _read_text(Path(path), "ray_console", year, None)


_SNIFF_BYTES = 256 << 10


def has_prefixes(path: Path, fmt: LogFormat) -> bool:
    """Whether the head of ``path`` has Ray console prefixes (``(Name pid=N)``, ``(raylet)``)."""
    return _prefixed_head(sniff(path, _SNIFF_BYTES), fmt)


def _prefixed_head(head: str, fmt: LogFormat) -> bool:
    """:func:`has_prefixes` of a file's first :data:`_SNIFF_BYTES`, decoded: a prefix at the start
    of one of its first 5,000 lines, after colours (or their residue)."""
    if "\x1b" in head:
        head = re.sub(ANSI, "", head)
    prefix = _prefix_after_colours(tuple(fmt.prefixes.values()))  # compiled once: thousands of small files
    return any(prefix.match(line) for line in head.splitlines()[:5000])


@cache
def _prefix_after_colours(prefixes: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile(r"(?:\[[0-9;]+m)*(?:" + "|".join(f"(?:{p.lstrip('^')})" for p in prefixes) + ")")


def _read_text(path: Path, kind: str, year: int | None, since: datetime | None) -> RayLog:
    fmt = load_format("ray")
    prefixed = has_prefixes(path, fmt)
    parts = collect_lines(path, lambda lines: scan_parts(lines, fmt, prefixed=prefixed), stitch_parts, heavy=True)
    return assemble_events(str(path), kind, parts, fmt, year=year, since=since)


def _file_kind(path: Path) -> str | None:
    name = re.sub(r"\.\d+$", "", path.name)
    parent = path.parent.name
    if parent in ("events", "export_events") and name.startswith("event_"):
        return "ray_export_events" if parent == "export_events" else "ray_events"
    if match := _WORKER_FILE.fullmatch(path.name):
        return f"ray_worker_{match[4]}"
    if match := _CORE_FILE.fullmatch(path.name):
        return f"ray_core_{match[1]}"
    for prefix, kind in (("raylet.", "ray_raylet"), ("gcs_server.", "ray_gcs"), ("job-driver-", "ray_job_driver"), ("debug_state", "ray_debug_state")):
        if name.startswith(prefix):
            return kind
    if name.endswith((".log", ".out", ".err", ".txt", ".gz")):
        return "ray_component"
    return None


def _logs_dir(session_dir: Path) -> Path:
    return session_dir / "logs" if (session_dir / "logs").is_dir() else session_dir


def looks_like_ray_session(path: Path) -> bool:
    """True for a session folder (or its ``logs/``) that holds Ray's component logs."""
    logs = _logs_dir(Path(path))
    return any((logs / name).exists() for name in ("raylet.out", "gcs_server.out", "events")) or bool(
        SESSION_NAME.fullmatch(Path(path).name) and logs.is_dir()
    )


def find_ray_sessions(root: Path) -> list[Path]:
    """Every Ray session folder under ``root`` (or ``root`` itself), each once, sorted.

    Session folders are recognised by name (``session_<date>_<time>_<us>_<pid>``), whether or not
    a ``session_latest`` link points at one; a ``session_latest`` that is a real folder (a copy
    made with links followed) counts only when no named sibling holds the same logs. A ``logs``
    folder of Ray component logs whose session folder lost its name is found too.
    """
    root = Path(root)
    if root.name == "logs" and SESSION_NAME.fullmatch(root.parent.name):
        return [root.parent]
    found: dict[str, Path] = {}
    latest: list[Path] = []
    for folder, dirs, _files in walk(root):
        here = Path(folder)
        if SESSION_NAME.fullmatch(here.name) or (here == root and looks_like_ray_session(here) and here.name != "logs"):
            found.setdefault(os.path.realpath(here), here)
            dirs[:] = []
            continue
        if here.name == "logs" and (here / "raylet.out").exists() and not SESSION_NAME.fullmatch(here.parent.name):
            found.setdefault(os.path.realpath(here), here)
            dirs[:] = []
            continue
        for name in list(dirs):
            candidate = here / name
            if name == "session_latest":
                latest.append(candidate)
                dirs.remove(name)
            elif candidate.is_symlink():
                dirs.remove(name)
    for link in latest:
        target = os.path.realpath(link)
        if target in found or not os.path.isdir(target) or Path(target).name in {p.name for p in found.values()}:
            continue
        siblings = [p for p in found.values() if p.parent == link.parent]
        if link.is_symlink() or not any(_same_listing(link, s) for s in siblings):
            found[target] = link
    return sorted(found.values())


def _same_listing(a: Path, b: Path) -> bool:
    def listing(session: Path) -> set[tuple[str, int]]:
        logs = _logs_dir(session)
        try:
            return {(e.name, e.stat().st_size) for e in os.scandir(logs) if e.is_file()}
        except OSError:
            return set()

    return listing(a) == listing(b)


#: Files whose first lines name the session (``session_name: session_…``, the object store's
#: ``fallback /tmp/ray/session_…``): a session copied under another name is still dated by them.
_NAMING_FILES = ("monitor.log", "raylet.out", "gcs_server.out")


def _named_inside(logs: Path) -> re.Match[str] | None:
    for name in (*_NAMING_FILES, *(name + ".gz" for name in _NAMING_FILES)):
        try:
            head = sniff(logs / name, 64 << 10)
        except OSError:
            continue
        if match := SESSION_NAME.search(head):
            return match
    return None


def read_ray_session(session_dir: Path) -> RaySession:
    """Parse every file of one Ray session folder (or its ``logs/`` folder) into frames."""
    session_dir = Path(session_dir)
    logs = _logs_dir(session_dir)
    match = SESSION_NAME.search(session_dir.name) or SESSION_NAME.search(str(session_dir.resolve())) or _named_inside(logs)
    started = datetime.strptime(f"{match[1]} {match[2]}.{match[3]}", "%Y-%m-%d %H-%M-%S.%f") if match else None
    fmt = load_format("ray")
    text_files: list[tuple[Path, str]] = []
    json_files: list[tuple[Path, str]] = []
    for path in sorted(p for p in files_under(logs) if p.is_file() and not p.is_symlink()):
        kind = _file_kind(path)
        if kind in ("ray_events", "ray_export_events"):
            json_files.append((path, kind))
        elif kind is not None:
            text_files.append((path, kind))

    sizes = [path.stat().st_size for path, _ in text_files]

    def read(i: int) -> RayLog:
        path, kind = text_files[i]
        if sizes[i] == 0:
            return RayLog(str(path), kind, _empty_events(), 0, 0, pl.DataFrame(schema=_MARKER_SCHEMA))
        return _read_text(path, kind, None, started)

    # A file of more than one batch keeps both cores busy on its own (two batches in flight); the
    # many smaller ones are read a group at a time, and any left out two at a time (Polars
    # releases the GIL). Never both at once: that would hold four batches.
    large = [size > HEAVY_BATCH_BYTES for size in sizes]
    read_alone = {i: read(i) for i in range(len(text_files)) if large[i]}
    small = [i for i in range(len(text_files)) if not large[i] and sizes[i]]
    grouped = _small_files({i: text_files[i] for i in small}, fmt, started)
    with ThreadPoolExecutor(2) as pool:
        rest = [i for i in range(len(text_files)) if not large[i] and i not in grouped]
        read_now = dict(zip(rest, pool.map(read, rest), strict=True))
    texts = [read_alone.get(i) or grouped.get(i) or read_now[i] for i in range(len(text_files))]
    workers = _workers(texts)
    text_events = _attribute(texts, workers)
    text_events = _drop_unconfirmed_deaths(text_events, [t for t in texts if t.kind == "ray_gcs" and t.lines])
    offset, how = _epoch_offset(text_events, json_files)
    json_logs = [_read_json_events(path, kind, fmt, offset) for path, kind in json_files]
    events = pl.concat([text_events, *[log.events for log in json_logs]], how="vertical_relaxed")
    events = _fill_exit_details(events).with_columns(
        pl.coalesce("worker", pl.col("pid").replace_strict(_pid_names(workers), default=None, return_dtype=pl.String)).alias("worker")
    )
    events = events.sort("time", "file", "line", nulls_last=True).select(*RAY_EVENT_SCHEMA)
    events = pl.concat([events, _last_words(events, workers)]).sort("time", "file", "line", nulls_last=True)
    sources = [RaySource(log.path, log.kind, log.lines, log.unparsed_lines, log.notes) for log in [*texts, *json_logs]]
    notes = []
    if any(not log.events.is_empty() for log in json_logs):
        notes.append(f"events/ and export_events/ times are epoch seconds shown as local time, UTC{_signed(offset)} ({how})")
    if not any(t.kind == "ray_gcs" for t in texts):
        notes.append("no gcs_server.out: not the head node's session, or copied without it")
    free = sum(1 for t in texts if t.kind in ("ray_worker_out", "ray_worker_err") and t.lines)
    if free:
        notes.append(f"{free} worker .out/.err files are free-form application output: only recognised lines count")
    return RaySession(
        path=str(session_dir),
        name=match[0] if match else None,
        started=started,
        events=events,
        workers=workers,
        sources=sources,
        notes=tuple(notes),
        facts=_facts(texts),
    )


def _small_files(files: dict[int, tuple[Path, str]], fmt: LogFormat, since: datetime | None) -> dict[int, RayLog]:
    """The small ``files`` read a group at a time, as :func:`_read_text` would read each. Those
    left out are to be read on their own: a file that inflates past a batch, and files with an
    event when the session's start is unknown or their kind has fewer than :data:`_TOGETHER` of
    them in the group.

    A long session leaves thousands of worker logs, and each read on its own costs milliseconds of
    fixed work. Each file is read once; a group's lines (files cleaned alike: all with console
    prefixes, or none; up to a batch) go through one pass that cleans and tags them as
    :func:`scan_parts` does and counts them file by file; the files with an event candidate then
    go through :func:`scan_parts` and :func:`assemble_events` together, a pass per kind of file,
    each file's streams its own. Two groups are at work while the next are read.
    """
    found: dict[int, RayLog] = {}
    filling: dict[bool, tuple[dict[int, bytes], int]] = {}
    with ThreadPoolExecutor(2) as pool:
        pending: list[Future[dict[int, RayLog]]] = []

        def submit(prefixed: bool, blocks: dict[int, bytes]) -> None:
            pending.append(pool.submit(_small_group, blocks, files, fmt, since, prefixed))
            if len(pending) > 2:
                found.update(pending.pop(0).result())

        for i, (path, _) in files.items():
            block = only_block(path, HEAVY_BATCH_BYTES)
            if block is None:
                continue
            # Cleaned as the file's own batch would be: console prefixes or not.
            prefixed = _prefixed_head(block[:_SNIFF_BYTES].decode("utf-8", errors="replace"), fmt)
            blocks, size = filling.get(prefixed, ({}, 0))
            if blocks and size + len(block) > HEAVY_BATCH_BYTES:
                submit(prefixed, blocks)
                blocks, size = {}, 0
            blocks[i] = block
            filling[prefixed] = (blocks, size + len(block))
        for prefixed, (blocks, _) in filling.items():
            submit(prefixed, blocks)
        for done in pending:
            found.update(done.result())
    return found


def _small_group(blocks: dict[int, bytes], files: dict[int, tuple[Path, str]], fmt: LogFormat, since: datetime | None,
                 prefixed: bool) -> dict[int, RayLog]:
    """The files of one group (see :func:`_small_files`), by their index in ``files``."""
    lines = lines_of_blocks(blocks)
    tagged = _normalized(lines.lazy(), fmt, prefixed).with_columns(_tags(fmt))
    stats, markers = pl.collect_all([
        tagged.group_by("file").agg(pl.col("candidate").any().alias("eventful"), *_STATS),
        tagged.filter(pl.col("marker")).select("file", "line", "text"),
    ])
    markers = markers.partition_by("file", as_dict=True, include_key=False)
    year = since.year if since is not None else None
    no_events, no_markers = _empty_events(), pl.DataFrame(schema=_MARKER_SCHEMA)  # shared: thousands of files
    events: dict[int, pl.DataFrame] = {}
    # Without the session's start, each file would date its glog lines by its own first dated line.
    candidates = stats.filter("eventful")["file"].to_list() if since is not None else []
    kinds = {kind: [i for i in candidates if files[i][1] == kind] for kind in sorted({files[i][1] for i in candidates})}
    # A pass for a few files costs what reading them side by side does: only many are worth one.
    kinds = {kind: members for kind, members in kinds.items() if len(members) >= _TOGETHER}
    eventful = [i for members in kinds.values() for i in members]
    for kind, members in kinds.items():
        events |= _events_apart(lines.filter(pl.col("file").is_in(members)), kind, {i: str(files[i][0]) for i in members},
                                fmt, since, prefixed)
    found = {}
    for (i,), own in stats.filter(~pl.col("eventful") | pl.col("file").is_in(eventful)).drop("eventful").partition_by(
        "file", as_dict=True, include_key=False
    ).items():
        path, kind = files[i]
        total, unparsed, notes, _ = _tally(own, kind, year)
        found[i] = RayLog(str(path), kind, events.get(i, no_events), total, unparsed, markers.get((i,), no_markers), tuple(notes))
    return found


def _events_apart(lines: pl.DataFrame, kind: str, paths: dict[int, str], fmt: LogFormat, since: datetime,
                  prefixed: bool) -> dict[int, pl.DataFrame]:
    """The events of several files of one ``kind`` (``file``/``line``/``text`` rows, each file's
    lines in order) from one pass, as :func:`assemble_events` gives each file's: the lines are
    numbered on from file to file, each file's streams kept apart, then numbered back."""
    numbered = lines.with_columns(pl.int_range(1, pl.len() + 1, dtype=pl.Int64).alias("at"))
    # Lines before each file's first: its line n is line offset + n of the pass.
    offsets = numbered.group_by("file").agg((pl.col("at") - pl.col("line")).first().alias("offset")).sort("offset")
    queries = scan_parts(numbered.lazy().select("file", pl.col("at").alias("line"), "text"), fmt, prefixed=prefixed, apart=True)
    parts = stitch_parts({name: [frame] for name, frame in zip(queries, pl.collect_all(list(queries.values())), strict=True)})
    found = assemble_events("", kind, parts, fmt, since=since).events
    if found.is_empty():
        return {}
    owned = (
        found.sort("line", maintain_order=True)
        .with_columns((pl.col("line") - 1).alias("before"))
        .join_asof(offsets.rename({"file": "index"}), left_on="before", right_on="offset", strategy="backward")
        .with_columns((pl.col("line") - pl.col("offset")).alias("line"), pl.col("index").replace_strict(paths, return_dtype=pl.String).alias("file"))
    )
    return {i: frame.select(found.columns) for (i,), frame in owned.partition_by("index", as_dict=True).items()}


def _empty_events() -> pl.DataFrame:
    return pl.DataFrame(schema={**RAY_EVENT_SCHEMA, "worker_id": pl.String()})


def _workers(texts: list[RayLog]) -> pl.DataFrame:
    """Worker files → worker id, job, pid, and the actor/task names Ray wrote into them."""
    owned = [(k, match) for k, log in enumerate(texts) if (match := _WORKER_FILE.fullmatch(os.path.basename(log.path)))]
    # Every worker file's markers read at once: a long session has thousands of worker files.
    marked = [k for k, _ in owned if texts[k].markers.height]
    said: dict[int, list[tuple[str | None, str | None]]] = {}
    if marked:
        owner = pl.DataFrame({"k": marked, "n": [texts[k].markers.height for k in marked]}, schema={"k": pl.Int64, "n": pl.UInt32})
        markers = pl.concat([texts[k].markers for k in marked]).select("text")
        found = pl.concat([owner.select(pl.col("k").repeat_by("n")).explode("k"), markers], how="horizontal")
        found = found.select("k", pl.col("text").str.extract_groups(_MARKER).alias("m")).unnest("m")
        for k, what, value in found.iter_rows():
            said.setdefault(k, []).append((what, value))
    rows = []
    for k, match in owned:
        names = [(what, value.strip()) for what, value in said.get(k, []) if what in ("actor_name", "task_name") and value is not None]
        job = [value for what, value in said.get(k, []) if what == "job_id"]
        values = [value for _, value in names]
        rows.append(
            {
                "file": texts[k].path,
                "stream": match[4],
                "worker_id": match[1],
                "job_id": match[2] or (job[0] if job else None),
                "pid": int(match[3]),
                "name": values[0] if values else None,
                "name_kind": names[0][0].split("_")[0] if names else None,
                "names": list(dict.fromkeys(values)),
                "lines": texts[k].lines,
            }
        )
    return pl.DataFrame(rows, schema=WORKER_SCHEMA)


def _pid_names(workers: pl.DataFrame) -> dict[int, str]:
    return {pid: name for pid, name in workers.select("pid", "name").drop_nulls().unique("pid").iter_rows()}


def _attribute(texts: list[RayLog], workers: pl.DataFrame) -> pl.DataFrame:
    """All text events, each with the pid it is about (from its text, its worker id, or its file)."""
    logs = [log for log in texts if not log.events.is_empty()]
    if not logs:
        return _empty_events()
    by_id = dict(workers.select("worker_id", "pid").unique("worker_id").iter_rows())
    named = pl.DataFrame({"worker_id": list(by_id), "named_pid": list(by_id.values())}, schema={"worker_id": pl.String, "named_pid": pl.Int64})
    owners = []
    for log in logs:
        name = os.path.basename(log.path)
        own = _WORKER_FILE.fullmatch(name) or _CORE_FILE.fullmatch(name)
        owners.append((log.path, int(own[3]) if own else None, log.kind.startswith("ray_worker")))
    owner = pl.DataFrame(owners, schema={"file": pl.String, "file_pid": pl.Int64, "worker_output": pl.Boolean}, orient="row")
    events = pl.concat([log.events for log in logs], how="vertical_relaxed")
    # Worker output is the worker's own; a core-worker log mostly talks about other processes,
    # except for the crash dumps of its own process. One join for all files: a long session has thousands.
    own_event = pl.col("worker_output") | pl.col("kind").is_in(["segfault", "fatal_check"])
    return (
        events.join(owner, on="file", how="left", maintain_order="left")
        .join(named, on="worker_id", how="left", maintain_order="left")
        .with_columns(pl.coalesce("pid", "named_pid", pl.when(own_event).then(pl.col("file_pid"))).alias("pid"))
        .select(events.columns)
    )


def _drop_unconfirmed_deaths(events: pl.DataFrame, gcs: list[RayLog]) -> pl.DataFrame:
    """An owner's ``state: DEAD`` notice counts only when the GCS saw that worker fail.

    Owners are notified of every actor death, also of actors destroyed on purpose (references
    dropped, ``ray.kill``, shutdown); the GCS log, when present, tells the two apart.
    """
    if not gcs or events.is_empty():
        return events
    failed = events.filter(
        pl.col("kind").is_in(["worker_died", "host_oom_kill", "actor_died"]) & pl.col("file").is_in([g.path for g in gcs])
    )["worker_id"].drop_nulls()
    notice = pl.col("message").str.contains("received notification on actor, state: DEAD", literal=True)
    return events.filter(~notice | pl.col("worker_id").is_in(failed.implode()))


#: Deaths after which the worker's own last output is read: Ray records no signal or exit code (a
#: SIGKILL and an ``os._exit`` read alike), and what the application printed last often tells.
_DEATHS = ("worker_died", "host_oom_kill", "actor_died", "segfault")
#: Bytes read from the end of a dead worker's output for its last line.
_TAIL_BYTES = 64 << 10


def _last_words(events: pl.DataFrame, workers: pl.DataFrame) -> pl.DataFrame:
    """A ``worker_last_output`` event per output file of each worker that died: the last line it
    printed (neither blank nor one of Ray's ``:job_id:``-style markers), at the time of its death."""
    dead = (
        events.filter(pl.col("kind").is_in(_DEATHS) & pl.col("pid").is_not_null())
        .group_by("pid")
        .agg(pl.col("time").min())
    )
    files = workers.join(dead, on="pid", how="inner").sort("time", "file", nulls_last=True)
    if files.is_empty():
        return pl.DataFrame(schema=RAY_EVENT_SCHEMA)
    told = set(events.filter(pl.col("file").is_in(files["file"].implode())).select("file", "line").iter_rows())
    rows = []
    for file, pid, name, lines, time in files.select("file", "pid", "name", "lines", "time").iter_rows():
        found = _last_line(Path(file), lines)
        if found is not None and (file, found[0]) not in told:  # (a line that is an event already is cited as one)
            line, text = found
            rows.append({"time": time, "source": "ray", "kind": "worker_last_output", "severity": "info", "file": file,
                         "line": line, "message": text, "count": 1, "pid": pid, "worker": name})
    return pl.DataFrame(rows, schema=RAY_EVENT_SCHEMA) if rows else pl.DataFrame(schema=RAY_EVENT_SCHEMA)


#: A gzipped worker output larger than this is not read through for its last line.
_GZIP_TAIL_LIMIT = 64 << 20


def _last_line(path: Path, lines: int) -> tuple[int, str] | None:
    """The last line of ``path`` (of ``lines`` lines) that says something, and its number."""
    if lines <= 0:
        return None
    try:
        if path.suffix == ".gz":  # (a session gzipped whole: the tail is found by reading it through)
            if path.with_suffix("").exists() or path.stat().st_size > _GZIP_TAIL_LIMIT:
                return None
            with open_log(path) as fh:
                kept, total = b"", 0
                while chunk := fh.read(1 << 20):
                    total += len(chunk)
                    kept = (kept + chunk)[-_TAIL_BYTES:]
            start, tail = total - len(kept), kept.decode("utf-8", "replace")
        else:
            with open(path, "rb") as fh:
                start = max(0, fh.seek(0, os.SEEK_END) - _TAIL_BYTES)
                fh.seek(start)
                tail = fh.read().decode("utf-8", "replace")
    except OSError:
        return None
    parts = tail.removesuffix("\n").split("\n")
    for back, text in enumerate(reversed(parts)):
        # What a terminal shows of a line a progress bar rewrote with carriage returns: its last state.
        said = next((piece for piece in reversed(re.sub(ANSI, "", text).split("\r")) if piece.strip()), "").strip()
        if said and not re.match(_MARKER, said):
            cut = len(said) > _MESSAGE_CHARS or (start and back == len(parts) - 1)  # (the first piece may be a longer line's end)
            return lines - back, "…" + said[-_MESSAGE_CHARS:] if cut else said
    return None


def _fill_exit_details(events: pl.DataFrame) -> pl.DataFrame:
    """Death events without a detail of their own take the exit record of the same worker."""
    deaths = ["worker_died", "host_oom_kill", "actor_died", "segfault"]
    exits = (
        events.filter(pl.col("kind").is_in(deaths) & pl.col("detail").is_not_null())
        .sort("time", nulls_last=True)
        .group_by("worker_id", maintain_order=True)
        .agg(pl.col("detail").first())
        .drop_nulls("worker_id")
    )
    by_worker = dict(exits.iter_rows())
    by_pid = dict(
        events.filter(pl.col("kind").is_in(deaths) & pl.col("detail").is_not_null() & pl.col("pid").is_not_null())
        .group_by("pid", maintain_order=True)
        .agg(pl.col("detail").first())
        .iter_rows()
    )
    fill = pl.coalesce(
        pl.col("worker_id").replace_strict(by_worker, default=None, return_dtype=pl.String),
        pl.col("pid").replace_strict(by_pid, default=None, return_dtype=pl.String),
    )
    return events.with_columns(
        pl.when(pl.col("kind").is_in(deaths) & pl.col("detail").is_null()).then(fill).otherwise(pl.col("detail")).alias("detail")
    )


# ---------------------------------------------------------------------------------------------
# JSON event files


_LABEL_KINDS = {
    "RAY_WORKER_FAILURE": "worker_died",
    "RAY_NODE_REMOVED": "node_dead",
    "RAYLET_MARKED_DEAD": "node_dead",
    "RAY_FATAL_CHECK_FAILED": "fatal_check",
    "Out of Memory": "host_oom_kill",
}
#: A literal every interesting line of an export file contains.
_EXPORT_FILTER = {"ACTOR": '"DEAD"', "NODE": '"DEAD"', "TASK": "TASK_EXECUTION_EXCEPTION"}


def _read_json_events(path: Path, kind: str, fmt: LogFormat, offset: timedelta) -> RayLog:
    """``events/`` (``label``/``message``) and ``export_events/`` (state records) → events."""
    family = re.sub(r"^event_(?:EXPORT_)?([A-Z]+).*", r"\1", path.name)
    # Export files are mostly state updates: only lines with the literal are decoded there.
    keep = pl.col("text").str.contains(_EXPORT_FILTER.get(family, "{"), literal=True) if kind == "ray_export_events" else pl.col("text").str.strip_chars() != ""
    patterns = [(p.kind, re.compile(p.regex)) for p in fmt.events]

    def decoded(parts: dict[str, pl.DataFrame]) -> dict[str, pl.DataFrame]:
        """One batch's kept lines → its events (few) and the count of lines that are not JSON."""
        rows, broken = [], 0
        for line, text in parts["rows"].iter_rows():
            try:
                record = json.loads(text)
            except ValueError:
                broken += 1
                continue
            if not isinstance(record, dict):  # a bare number or list: JSON, but no event record
                broken += 1
                continue
            found = _json_event(record, kind, patterns, fmt)
            if found:
                event_kind, severity, message = found
                stamp = record.get("timestamp")
                when = datetime.fromtimestamp(stamp, UTC).replace(tzinfo=None) + offset if isinstance(stamp, (int, float)) else None
                fields = record.get("custom_fields") or {}
                rows.append((when, event_kind, severity, line, message, fields.get("worker_id")))
        events = pl.DataFrame(rows, schema=_JSON_EVENT_SCHEMA, orient="row")
        return {"events": events, "stats": parts["stats"].with_columns(pl.lit(broken, pl.Int64).alias("broken"))}

    # Decoded batch by batch: an events file is never held whole.
    parts = collect_lines(
        path, lambda lines: {"rows": lines.filter(keep), "stats": lines.select(pl.col("line").max().alias("lines"))}, finish=decoded
    )
    frame, broken = parts["events"], int(parts["stats"]["broken"].sum())
    # The GCS exports an actor's final state more than once; an actor dies once.
    frame = frame.unique(["kind", "message"] if kind == "ray_export_events" else ["time", "kind", "message"], keep="first", maintain_order=True)
    frame = _with_detail(frame).with_columns(
        pl.lit(None, pl.Int64).alias("step"),
        source_of(pl.col("kind"), "ray").alias("source"),
        pl.lit(str(path)).alias("file"),
        pl.lit(1, pl.Int64).alias("count"),
        pl.lit(None, pl.String).alias("worker"),
        pl.coalesce("worker_id", pl.col("message").str.extract(_WORKER_ID, 1)).alias("worker_id"),
    )
    total = int(parts["stats"]["lines"].max() or 0)
    notes = (f"{broken} lines are not JSON",) if broken else ()
    return RayLog(str(path), kind, frame.select(*RAY_EVENT_SCHEMA, "worker_id"), total, broken, pl.DataFrame(schema=_MARKER_SCHEMA), notes)


def _json_event(record: dict[str, Any], kind: str, patterns: list[tuple[str, re.Pattern[str]]], fmt: LogFormat) -> tuple[str, str, str] | None:
    severities = {p.kind: p.severity for p in fmt.events}
    if kind == "ray_events":
        message = str(record.get("message", "")).replace("\\n", "\n")
        label = str(record.get("label", ""))
        event_kind = next((k for k, rx in patterns if rx.search(message)), None) or _LABEL_KINDS.get(label)
        level = str(record.get("severity", "")).upper()
        if event_kind is None and level in ("ERROR", "FATAL"):
            event_kind = "log_error"
        if event_kind is None:
            return None
        severity = severities.get(event_kind) or ("fatal" if level == "FATAL" else "error")
        return event_kind, severity, f"{label}: {message}"[:_MESSAGE_CHARS]
    data = record.get("event_data") or {}
    source = str(record.get("source_type", ""))
    if source == "EXPORT_ACTOR" and data.get("state") == "DEAD":
        cause = data.get("death_cause") or {}
        if "oom_context" in cause:
            return "host_oom_kill", "fatal", f"actor {data.get('class_name')} (pid={data.get('pid')}) DEAD: {cause['oom_context'].get('error_message', '')}"[:_MESSAGE_CHARS]
        context = cause.get("actor_died_error_context") or {}
        message = str(context.get("error_message", ""))
        if "creation_task_failure_context" in cause:
            message = "The actor died because of an error raised in its creation task"
        if context.get("reason") in ("OUT_OF_SCOPE", "REF_DELETED", "RAY_KILL") or "INTENDED" in message or not (message or cause):
            return None
        event_kind = "node_dead" if context.get("reason") == "NODE_DIED" else "actor_died"
        return event_kind, severities.get(event_kind, "error"), f"actor {data.get('class_name')} (pid={data.get('pid')}) DEAD: {message}"[:_MESSAGE_CHARS]
    if source == "EXPORT_NODE" and data.get("state") == "DEAD":
        info = data.get("death_info") or {}
        if info.get("reason") in (None, "EXPECTED_TERMINATION"):
            return None
        return "node_dead", "fatal", f"node {data.get('node_name')} DEAD: {info.get('reason')} {info.get('reason_message', '')}"
    if source == "EXPORT_TASK":
        error = (data.get("state_updates") or {}).get("error_info") or {}
        if error.get("error_type") != "TASK_EXECUTION_EXCEPTION":
            return None
        message = str(error.get("error_message", ""))
        exception = next((ln for ln in reversed(message.splitlines()) if re.match(fmt.traceback_exception, ln)), message)
        event_kind = next((k for k, rx in fmt.traceback_kinds if re.search(rx, exception)), "traceback")
        name = (data.get("task_info") or {}).get("func_or_class_name", "task")
        return event_kind, "error", f"{name} raised: {exception}"[:_MESSAGE_CHARS]
    return None


#: What the memory monitor's kill says of the node, in raylet.out and in its ``events/`` record alike.
_OOM_KILL = re.compile(r"Memory on the node \(IP: [^,]+, ID: \w+\) was [\d.]+GB used / [\d.]+GB limit \([\d.]+\)")


def _epoch_offset(events: pl.DataFrame, json_files: list[tuple[Path, str]]) -> tuple[timedelta, str]:
    """The session's UTC offset, so epoch stamps read as the local times the text logs print.

    Lines that print both (``*** SIGSEGV received at time=…`` dumps) decide first; then the same
    failure seen in a text log and in ``events/`` (a worker's, by its id; a memory monitor's kill, by
    the node's memory it quotes); else this machine's own zone.
    """
    pairs: list[tuple[datetime, float]] = []
    dumps = events.filter(pl.col("message").str.contains("received at time=") & pl.col("time").is_not_null())
    for when, message in dumps.select("time", "message").iter_rows():
        pairs.append((when, float(re.search(r"received at time=(\d+)", message)[1])))
    how = "from crash dumps that print both"
    if not pairs and json_files:
        timed = events.filter(pl.col("time").is_not_null())
        local = dict(timed.filter(pl.col("worker_id").is_not_null()).group_by("worker_id").agg(pl.col("time").min()).iter_rows())
        kills = dict(timed.select(pl.col("message").str.extract(f"({_OOM_KILL.pattern})", 1).alias("said"), "time")
                     .drop_nulls("said").group_by("said").agg(pl.col("time").min()).iter_rows())
        for path, kind in json_files:
            if kind != "ray_events" or path.stat().st_size == 0:
                continue
            with path.open(encoding="utf-8", errors="replace") as lines:  # line by line: never held whole
                for text in lines:
                    if "worker_id" not in text and "GB limit" not in text:
                        continue
                    try:
                        record = json.loads(text)
                    except ValueError:
                        continue
                    if not isinstance(record, dict) or not isinstance(record.get("timestamp"), (int, float)):
                        continue
                    worker = (record.get("custom_fields") or {}).get("worker_id")
                    said = _OOM_KILL.search(str(record.get("message", "")))
                    when = local.get(worker) if worker in local else kills.get(said[0]) if said else None
                    if when is not None:
                        pairs.append((when, float(record["timestamp"])))
        how = "from failures seen in both text and JSON logs"
    quarter = 15 * 60
    offsets = sorted(round((when - datetime.fromtimestamp(stamp, UTC).replace(tzinfo=None)).total_seconds() / quarter) * quarter for when, stamp in pairs)
    if offsets:
        return timedelta(seconds=offsets[len(offsets) // 2]), how
    zone = datetime.now().astimezone().utcoffset() or timedelta(0)
    return zone, "this machine's time zone: nothing in the session ties the two clocks"


def _signed(offset: timedelta) -> str:
    minutes = int(offset.total_seconds() // 60)
    return f"{'+' if minutes >= 0 else '-'}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def _facts(texts: list[RayLog]) -> dict[str, str]:
    """The Ray version (``monitor.log`` prints it at start), when present."""
    for log in texts:
        if Path(log.path).name.startswith("monitor.log") and log.lines:
            with open(log.path, "rb") as fh:
                head = fh.read(64 << 10).decode("utf-8", errors="replace")
            if found := re.search(r"Ray version: (\S+)", head):
                return {"ray_version": found[1]}
    return {}
