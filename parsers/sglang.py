"""SGLang server logs (AReaL's ``llm_server.log``, verl/Ray worker output, plain server logs) → frames.

Covers SGLang 0.3 → 0.5.2x (see ``shared/formats/sglang.md``): the ``[time rank-tags] message``
prefix in all its forms (time-only ``[16:43:29 TP0]``, dated, with milliseconds, any rank tags
or none), records that start after a tqdm bar on the same physical line, Ray/docker/collector
prefixes, ANSI colours, AReaL wrapper lines in between (understood, left to the AReaL parser),
tracebacks, NCCL/C++ output and bare ``Killed`` lines.

Work is split in two:

- :func:`_reduce` shrinks one batch of lines (a quarter million, two batches at a time in
  threads) to what matters, with literal checks and slices before any regex. HTTP access
  lines become counts per minute and request (failed requests stay single lines: they are
  events), read every few batches into times, methods, endpoints and statuses.
  ``Decode batch``/``Prefill batch`` lines are sampled to the last line per second and
  rank prefix, and the samples are parsed by line shape straight into metric values. Dated
  records that can only tell the time are kept once per block, tqdm bars not at all. The rest
  (startup, failures, tracebacks, AReaL wrapper lines) is kept whole, plus the timed line just
  before each untimed one, so an info-level log of gigabytes leaves a few hundred thousand rows
  besides the metric values.
- :func:`_assemble` parses those rows eagerly: record fields, dates for time-only prefixes,
  tracebacks, server instances, metrics and events.

Example:
    >>> log = read_sglang_log(Path("outputs/logs/root/exp/trial0/llm_server.log"))  # doctest: +SKIP
    >>> log.metrics.filter(pl.col("key") == "sglang/token_usage")  # doctest: +SKIP
"""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import polars as pl

from parsers._fold import folded_across, last_and_peak_per_minute
from parsers._formats import LogFormat, MetricPattern, load_format
from parsers._lines import ANSI, is_compressed, iter_line_chunks, line_frames, sniff
from parsers.schema import EVENT_SCHEMA, METRIC_SCHEMA, conform, in_order, with_keys

__all__ = ["HTTP_SCHEMA", "SERVER_SCHEMA", "SGLangLog", "looks_like_sglang", "read_sglang_log"]

#: Access lines counted per minute, endpoint and status.
HTTP_SCHEMA: dict[str, pl.DataType] = {
    "minute": pl.Datetime("ms"),
    "endpoint": pl.String(),
    "method": pl.String(),
    "status": pl.Int64(),
    "count": pl.Int64(),
    "first_line": pl.Int64(),
}

#: One row per server instance found in the file.
SERVER_SCHEMA: dict[str, pl.DataType] = {
    "instance": pl.Int64(),
    "first_line": pl.Int64(),
    "last_line": pl.Int64(),
    "launch_time": pl.Datetime("ms"),
    "ready_time": pl.Datetime("ms"),
    "port": pl.Int64(),
    "version_hint": pl.String(),
    "concurrent": pl.Boolean(),
}

_STATS = r"(?:Decode|Prefill) batch"
_ACCESS_HINT = r'HTTP/1\.\d" \d'
_REQUEST_LOG = r"\] (?:Receive|Finish): obj="
#: Samples (and access lines without a date) are folded per second within blocks of this many
#: lines, so a time-only prefix that repeats a day later never lands in the same fold. Batches hold
#: whole blocks, so no such fold spans two batches (a minute's does: see :func:`folded_across`).
_FOLD_BLOCK = 4096
_BATCH_LINES = 64 * _FOLD_BLOCK
#: A part of a log read on its own is read as the whole log reads it when its line numbers count
#: from a multiple of this, plus one: its blocks are then the whole log's.
ALIGNED_LINES = _FOLD_BLOCK
_WORKERS = 2
#: Batches whose access groups are read together (each read has a fixed cost of a few ms).
_READ_EVERY = 8
#: Stats line layouts learnt per batch; lines of further layouts go to the generic parser.
_MAX_SHAPES = 8
_ROLLOVER_MS = 3_600_000
_PYLOG_TIME = r"^(?P<pylevel>DEBUG|INFO|WARNING|ERROR|CRITICAL):(?P<pytime>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}),(?P<pyms>\d{3}):"
_RECORD_ANYWHERE = r"\[(?:\d{4}-\d{2}-\d{2} )?\d{2}:\d{2}:\d{2}(?:\.\d{1,6})?(?: [A-Z_]+\d+)*\] ?"
#: A line that carries its own time: a record prefix at its start.
_TIMED_AT_START = r"^\[(?:\d{4}-\d{2}-\d{2} )?\d{2}:\d{2}:\d{2}"
_LEVEL = r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL):\s+"
#: The AReaL logger's line head (``(AReaL) 20251111-09:00:01.200 name LEVEL: ``): its timestamp.
_AREAL_HEAD = r"^(?:\(AReaL\) )?(\d{8}-\d{2}:\d{2}:\d{2}\.\d{3}) \S"
_DOTTED_EXCEPTION = r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+: "
_ACCESS = r'^(?P<client>\S+) - "(?P<method>[A-Z]+) (?P<target>\S+) HTTP/[\d.]+" (?P<status>\d{3})(?: |$)'
_REQUEST = r'^(?P<method>[A-Z]+) (?P<target>\S+) HTTP/[\d.]+" (?P<status>\d{3})(?: |$)'
_STATS_HEAD = r"^(?:Prefill|Decode) batch(?:\(mixed (#running-req: \d+)\))?(?: \[\d+\])?[.,]?\s*"


@dataclass(frozen=True)
class SGLangLog:
    """What one SGLang server log holds."""

    path: str
    metrics: pl.DataFrame
    events: pl.DataFrame
    http: pl.DataFrame
    servers: pl.DataFrame
    lines: int
    unparsed_lines: int
    notes: tuple[str, ...] = ()
    restart_lines: tuple[int, ...] | None = None
    """The first lines of the last few minutes (:data:`RESTART_MINUTES`) its stats samples and access
    lines were logged in (what it counts and folds per minute), in line order: the log read from one
    of them on reads those minutes whole. Empty where a sample or access line has no date to tell
    its minute by; ``None`` where there is none."""


@cache
def _extras() -> dict[str, Any]:
    """The parts of ``formats/sglang.json`` that the shared format loader does not model."""
    data = json.loads((resources.files("parsers") / "formats" / "sglang.json").read_text(encoding="utf-8"))
    return {"understood": data.get("understood", {}), "stats": data.get("stats", {}), "head": data["line"]["head"]}


def looks_like_sglang(path: Path) -> bool:
    """True when the head of ``path`` has SGLang server records or SGLang-specific output."""
    head = re.sub(ANSI, "", sniff(path, 256 << 10))
    record = re.compile(
        r"\[(?:\d{4}-\d{2}-\d{2} )?\d{2}:\d{2}:\d{2}(?:\.\d{1,6})?(?: (?:DP|PP|ATTN_CP|MOE_DP|CP|TP|EP)\d+)*\] "
        r"(?:Decode batch|Prefill batch|server_args=|Load weight|max_total_num_tokens=|The server is fired up|"
        r"Scheduler hit an exception|Received sigquit|Init torch distributed|KV Cache is allocated|Capture cuda graph|"
        r"Memory pool end|[Ww]atchdog timeout|Health check failed|KV cache pool is full|Decode out of memory|"
        r"INFO: +(?:Started server process|Uvicorn running|Waiting for application|Application startup|\S+ - \"))"
    )
    if record.search(head) or re.search(r"\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d{3})?(?: (?:DP|PP|TP|EP)\d+)+\] ", head):
        return True
    if re.search(r"\((?:SGLang\w*|GenerationServer) pid=\d+|Launch command: .*sglang\.launch_server|sglang/srt/", head):
        return True
    # A warning-level server log: mostly bare ``[date time] message`` records.
    lines = [line for line in head.splitlines()[:400] if line.strip()]
    prefixed = sum(1 for line in lines if re.match(r"\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d{3})?\] ", line))
    return bool(lines) and prefixed >= max(3, len(lines) // 2)


def read_sglang_log(path: Path, *, stats_per_minute: bool = False, keys: str | None = None) -> SGLangLog:
    """Parse one SGLang server log (plain or gzipped, any version 0.3 → 0.5.2x) into frames.

    ``stats_per_minute`` keeps, of the stats values, the last and the peak per minute and key (see
    :mod:`parsers._fold`), batch by batch, so a server log of days never holds every sample.
    ``keys``: a regex; only metrics whose key it finds something in are kept (stats values are
    dropped batch by batch, before they are folded). ``None`` keeps every key.
    """
    path = Path(path)
    fmt = load_format("sglang")
    rules = replace(_Rules.of(fmt), keys=keys)
    try:
        parts = _reduce_all(_batches(path, fast=True), rules, stats_per_minute)
    except pl.exceptions.ComputeError as exc:
        if "utf" not in str(exc).lower():
            raise
        parts = _reduce_all(_batches(path, fast=False), rules, stats_per_minute)
    log = _assemble(path, parts, fmt, stats_per_minute)
    return replace(log, metrics=with_keys(log.metrics, keys))


# ---------------------------------------------------------------------------------------------
# Batches of lines, each shrunk on its own


def _batches(path: Path, fast: bool) -> Iterator[pl.DataFrame]:
    """``line``/``text`` frames of whole fold blocks (``_BATCH_LINES`` lines), in file order.

    The fast path splits blocks of whole lines with Polars (UTF-8 only); otherwise gzip-aware
    chunks that replace undecodable bytes (see :mod:`parsers._lines`).
    """
    if fast and not is_compressed(path):
        frames: Iterable[pl.DataFrame] = line_frames(path)
    else:
        frames = (chunk.collect() for chunk in iter_line_chunks(path))
    pending: list[pl.DataFrame] = []
    size = 0
    # Lines count from 1 and blocks from line 0: the first batch is one line short.
    want = _BATCH_LINES - 1
    for frame in frames:
        pending.append(frame)
        size += frame.height
        while size >= want:
            joined = pl.concat(pending) if len(pending) > 1 else pending[0]
            yield joined.slice(0, want)
            rest = joined.slice(want)
            pending, size, want = ([rest] if rest.height else []), rest.height, _BATCH_LINES
    if size:
        yield pl.concat(pending) if len(pending) > 1 else pending[0]


def _reduce_all(batches: Iterator[pl.DataFrame], rules: _Rules, fold: bool) -> _Parts:
    """Reduce every batch, two at a time (Polars releases the GIL), keeping file order.

    Every few batches, their parts are merged and their access groups read (see
    :func:`_access_rows`), so the groups' texts are never all kept, and reading them costs a few
    calls per ``_READ_EVERY`` batches rather than per batch.
    """
    done: list[_Parts] = []
    pending: list[_Parts] = []

    def take(part: _Parts) -> None:
        pending.append(part)
        if len(pending) == _READ_EVERY:
            done.append(_read_access(pending, rules.fmt))
            pending.clear()

    with ThreadPoolExecutor(max_workers=_WORKERS) as pool:
        running: deque = deque()
        for batch in batches:
            running.append(pool.submit(_reduce, batch, rules, fold))
            if len(running) >= _WORKERS:
                take(running.popleft().result())
        for future in running:
            take(future.result())
    if pending or not done:
        pending = pending or [_reduce(pl.DataFrame(schema={"line": pl.Int64, "text": pl.String}), rules, fold)]
        done.append(_read_access(pending, rules.fmt))
    return _Parts.merge(done)


def _read_access(parts: list[_Parts], fmt: LogFormat) -> _Parts:
    """``parts`` merged, their access groups read into rows."""
    merged = _Parts.merge(parts)
    merged.access = _access_rows(merged.access, fmt)
    return merged


@dataclass(frozen=True)
class _Rules:
    """Regexes and literals the batches need, built once per format."""

    any_event: str
    #: Metric and version-rule literals: a record holding one is worth keeping.
    literals: list[str]
    markers: str
    tqdm: str
    head: str
    #: The format the rules come from (access lines are read with its prefixes).
    fmt: LogFormat
    #: Metric keys to keep (a regex; ``None``: all).
    keys: str | None = None

    @staticmethod
    def of(fmt: LogFormat) -> _Rules:
        _, version_rules = _version_rules()
        records = {lit for scope, lit, _, _ in version_rules if scope == "record" and lit}
        markers = "|".join(f"(?:{regex})" for _, column, regex, _ in _MARKERS if column == "message")
        extras = _extras()
        literals = sorted({p.literal for p in fmt.metrics} | records)
        return _Rules(fmt.any_event, literals, markers, extras["understood"]["tqdm"], extras["head"], fmt)


@dataclass
class _Parts:
    """What the batches leave (frames concatenated in file order) and their counts.

    Stats values stay one frame per batch (``metrics``, each in line order, the batch ending at
    line ``ends[i]``): the few values found later are merged in batch by batch. ``samples`` are
    the stats samples the timeline may need (see :func:`_clock`), ``clues`` what tells versions
    apart (see :class:`_Clues`). ``access`` holds a batch's access groups, and once
    :func:`_reduce_all` has read them, their rows (see :func:`_access_rows`).
    """

    other: pl.DataFrame
    anchors: pl.DataFrame
    access: pl.DataFrame
    samples: pl.DataFrame
    stats_rest: pl.DataFrame
    clues: pl.DataFrame
    metrics: list[pl.DataFrame]
    ends: list[int]
    first_sample: int | None = None
    last_line: int = 0
    request_logs: int = 0
    stats_lines: int = 0
    sample_count: int = 0
    stats_unparsed: int = 0
    stats_values: int = 0
    dull: int = 0
    """Lines of no known shape counted in their batch and let go (see :func:`_without_dull`)."""
    minute_starts: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema={"minute": pl.Datetime("ms"), "line": pl.Int64}))
    """The last few minutes dated samples and access lines were logged in, and each one's first line."""
    undated_minutes: bool = False
    """A sample or access line whose minute cannot be told from it alone."""

    @staticmethod
    def merge(parts: list[_Parts]) -> _Parts:
        frames = {name: pl.concat([getattr(p, name) for p in parts]) for name in _FRAMES}
        counts = {name: sum(getattr(p, name) for p in parts) for name in _COUNTS}
        return _Parts(
            **frames,
            metrics=[m for p in parts for m in p.metrics],
            ends=[e for p in parts for e in p.ends],
            first_sample=min((p.first_sample for p in parts if p.first_sample is not None), default=None),
            last_line=max(p.last_line for p in parts),
            **counts,
            minute_starts=_latest_starts(pl.concat([p.minute_starts for p in parts])),
            undated_minutes=any(p.undated_minutes for p in parts),
        )


_FRAMES = ("other", "anchors", "access", "samples", "stats_rest", "clues")
_COUNTS = ("request_logs", "stats_lines", "sample_count", "stats_unparsed", "stats_values", "dull")


def _copy(column: str) -> pl.Expr:
    """A compact copy of a string column. Rows picked out of a batch still point into it: kept
    rows would pin the batch in memory, and rows read many times are read faster compact."""
    return pl.concat_str(pl.col(column), pl.lit("")).alias(column)


def _reduce(batch: pl.DataFrame, rules: _Rules, fold: bool) -> _Parts:
    """Sort one batch's lines into access, request-log, stats and other lines; fold the bulk."""
    batch = batch.select(pl.col("line").cast(pl.Int64), "text")
    access, rest = _split_access(batch)
    rest = rest.filter(pl.col("text").str.len_bytes() > 0)
    is_request_log = _matches(rest["text"], ": obj=", _REQUEST_LOG)
    rest, request_logs = rest.filter(~is_request_log), int(is_request_log.sum())
    is_stats = _matches(rest["text"], " batch", _STATS)
    stats, other = rest.filter(is_stats), rest.filter(~is_stats)
    kept, quiet, bars = _sort_other(other, rules)
    kept, dull = _without_dull(kept, rules)
    fast, slow = _stats_samples(stats, rules)
    metrics, clues, left, unparsed = _parse_samples(fast)
    metrics = with_keys(metrics, rules.keys)
    values = metrics.height
    if fold:  # dated samples fold here; time-only ones once their dates are known (see _metrics)
        metrics = last_and_peak_per_minute(metrics)
    metrics = metrics.with_columns(pl.col("key").cast(pl.Categorical))  # kept to the end: 4 bytes a key
    last_line = int(batch["line"][-1]) if batch.height else 0
    firsts = [int(f["line"][0]) for f in (fast, slow) if f.height]
    groups = _access_groups(access)
    minutes = _minutes_of(groups)
    return _Parts(
        other=pl.concat([kept, quiet]).sort("line").with_columns(_copy("text")),
        anchors=_anchors(batch, kept, bars),
        access=groups,
        samples=_clock(fast),
        stats_rest=pl.concat([slow, fast[left].select(slow.columns)]).sort("line").with_columns(_copy("text")),
        clues=_distinct_clues(clues, kept["line"]),
        metrics=[metrics],
        ends=[last_line],
        first_sample=min(firsts, default=None),
        last_line=last_line,
        request_logs=request_logs,
        stats_lines=stats.height,
        sample_count=fast.height + slow.height,
        stats_unparsed=unparsed,
        stats_values=values,
        dull=dull,
        minute_starts=_minute_starts(fast, groups, minutes),
        undated_minutes=fast["dt"].null_count() > 0 or minutes["at"].null_count() > 0,
    )


def _minutes_of(access: pl.DataFrame) -> pl.DataFrame:
    """The distinct minutes of access lines (or their groups: see :func:`_access_groups`) —
    ``minute``: ``[YYYY-MM-DD HH:MM:`` — and when each is (``at``; null where the prefix is another)."""
    minutes = access["text"].str.slice(0, 18).unique()
    at = minutes.str.slice(1, 16).str.to_datetime("%Y-%m-%d %H:%M", strict=False, time_unit="ms", cache=False)
    return pl.DataFrame({"minute": minutes, "at": at})


@cache
def record_keys() -> frozenset[str]:
    """Keys of the values read from records (startup and memory lines): a row a line, never folded."""
    return frozenset(key for pattern in load_format("sglang").metrics for key in pattern.keys.values())


#: Minutes whose first lines a log keeps, for a grown log to be read again from (see ``restart_lines``).
RESTART_MINUTES = 30


def _minute_starts(samples: pl.DataFrame, access: pl.DataFrame, minutes: pl.DataFrame) -> pl.DataFrame:
    """The last few minutes dated samples or access lines of one batch were logged in, each with its
    first line (a sample's: the first of the lines behind it). ``access``: the batch's access groups,
    each at its first line; ``minutes``: :func:`_minutes_of` them."""
    starts = minutes.drop_nulls().join(
        access.select(pl.col("text").str.slice(0, 18).alias("minute"), "line"), on="minute").select(
        pl.col("at").alias("minute"), "line")
    dated = samples.filter(pl.col("dt").is_not_null()).select(pl.col("dt").dt.truncate("1m").alias("minute"), pl.col("first").alias("line"))
    return _latest_starts(pl.concat([dated, starts]))


def _latest_starts(starts: pl.DataFrame) -> pl.DataFrame:
    """Of minutes and lines in them, the last :data:`RESTART_MINUTES` minutes, each at its first line."""
    return starts.group_by("minute").agg(pl.col("line").min()).sort("minute").tail(RESTART_MINUTES)


def _distinct_clues(clues: pl.DataFrame, between: pl.Series) -> pl.DataFrame:
    """The first sample of each kind (example, rank tags, date) between two of the ``between``
    lines, instead of every sample: a run's clues then grow with its server's restarts and
    telling lines, not with its stats lines. Exact for :meth:`_Clues.hints` when ``between``
    holds every line a launch marker can be on (the kept lines: a quiet record or a tqdm bar is
    never one), so no group spans two server instances."""
    stretch = between.sort().search_sorted(clues["line"]).alias("between")
    kind = ("example", "untagged", "dated")
    first = clues.group_by(stretch, *kind, maintain_order=True).agg(pl.col("line").first()).select("line", *kind)
    # A batch has an example per line shape, repeated on every row: 4 bytes a row, not the message.
    return first.with_columns(pl.col("example").cast(pl.Categorical))


def _clock(samples: pl.DataFrame) -> pl.DataFrame:
    """The samples the timeline may need: those whose time lacks a date, and the first and last
    dated one of each block (the dates around them)."""
    block = pl.col("line") // _FOLD_BLOCK
    ends = block.is_first_distinct() | block.is_last_distinct()
    undated = pl.col("stamp").is_not_null()
    return samples.filter(undated | (pl.col("dt").is_not_null() & ends)).select("line", "stamp", "dt")


def _split_access(batch: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """HTTP access lines (with ``minute``: their first 18 characters, and ``request``: what
    follows the first `` - "``) and a compact copy of the other lines.

    Slices over the whole batch are cheap, over lines picked out of it dearer: requests are cut
    from the whole batch and tested once per distinct request.
    """
    texts = batch["text"]
    request = _after(texts, ' - "')
    requests = request.unique().drop_nulls()
    http = requests.filter(requests.str.contains(_ACCESS_HINT)).implode()
    is_access = request.is_in(http).fill_null(False)
    access = batch.with_columns(texts.str.slice(0, 18).alias("minute"), request.alias("request")).filter(is_access)
    rest = batch.filter(~is_access).with_columns(_copy("text"))
    # The hint elsewhere in a line: an access line that does not parse.
    hinted = rest["text"].str.contains(_ACCESS_HINT)
    if hinted.any():
        odd = rest.filter(hinted)
        odd = odd.with_columns(pl.col("text").str.slice(0, 18).alias("minute"), _after(odd["text"], ' - "').alias("request"))
        access, rest = pl.concat([access, odd]).sort("line"), rest.filter(~hinted)
    return access, rest


def _after(texts: pl.Series, literal: str) -> pl.Series:
    """What follows the first ``literal`` (ASCII) in each text; null where there is none."""
    # ``find`` counts bytes, ``slice`` characters: the same on ASCII lines, which nearly all are.
    after = texts.str.slice(texts.str.find(literal, literal=True) + len(literal))
    wide = texts.str.len_chars() != texts.str.len_bytes()
    if wide.any():
        after = after.scatter(wide.arg_true(), texts.filter(wide).str.splitn(literal, 2).struct.field("field_1"))
    return after


def _matches(texts: pl.Series, literal: str, regex: str) -> pl.Series:
    """Where ``regex`` matches, tried only on the texts that hold ``literal``."""
    hit = texts.str.contains(literal, literal=True)
    if hit.any():
        hit = hit.scatter(hit.arg_true(), texts.filter(hit).str.contains(regex))
    return hit


def _sort_other(other: pl.DataFrame, rules: _Rules) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """Split the remaining lines into kept lines, quiet records (one kept per block) and tqdm bars.

    A quiet record is a ``[YYYY-MM-DD HH:MM:SS] message`` line whose message is no event,
    metric, server marker, version clue, traceback start or logger level: it can only tell the
    time. A bar is a tqdm line with no record, event, level or timestamp in it.
    """
    texts = other["text"]
    plain = texts.str.slice(0, 22).str.contains(r"^\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\] $")
    is_record = plain & ~texts.str.contains("\x1b", literal=True)
    records, rest = other.filter(is_record), other.filter(~is_record)
    messages = records["text"].str.slice(22).str.strip_chars_end()
    # Records repeat a handful of messages: the regexes run on the distinct ones.
    distinct = messages.unique()
    telling = distinct.filter(
        distinct.str.contains(rules.any_event)
        | distinct.str.contains_any(rules.literals)
        | distinct.str.contains(rules.markers)
        | distinct.str.ends_with("Traceback (most recent call last):")
        | distinct.str.contains(r"^[A-Z]+:|\x1b")
    )
    is_quiet = ~messages.is_in(telling.implode())
    quiet = (
        records.filter(is_quiet)
        .with_columns((pl.col("line") // _FOLD_BLOCK).alias("block"))
        .unique("block", keep="first", maintain_order=True)
        .drop("block")
    )
    is_bar = rest["text"].str.contains(rules.tqdm)
    if is_bar.any():
        bars = rest["text"].filter(is_bar)
        telling = (
            bars.str.contains(_RECORD_ANYWHERE)
            | bars.str.contains(rules.any_event)
            | bars.str.contains(r"^[\d(\x1b]|^(?:DEBUG|INFO|WARNING):|ERROR|CRITICAL")
        )
        is_bar = is_bar.scatter(is_bar.arg_true(), ~telling)
    kept = pl.concat([records.filter(~is_quiet), rest.filter(~is_bar)])
    return kept, quiet, rest.filter(is_bar)


#: A batch holding fewer kept lines than this keeps them all (an ordinary log has a few hundred).
_DULL_FLOOR = 20_000
#: Lines kept after anything a traceback may go on from (its message can run on in them), and at a
#: batch's start (a traceback in the batch before).
_NEAR = 64


def _without_dull(kept: pl.DataFrame, rules: _Rules) -> tuple[pl.DataFrame, int]:
    """``kept`` less the lines of no known shape nothing reads, and their count (unparsed lines).

    A server at ``NCCL_DEBUG=INFO``, or junk, writes millions of them: kept to the end, each cost
    half a kilobyte (a 480 MB log took 3.3 GB). Only a batch with many kept lines is sifted."""
    if kept.height < _DULL_FLOOR:
        return kept, 0
    fmt = rules.fmt
    rows = _classify(_fields(kept.select("line", "text"), fmt), fmt).sort("line")
    first = int(rows["line"][0])
    starts = rows.filter(pl.col("tb_start") | pl.col("exception") | pl.col("chain") | pl.col("indented"))["line"]
    near = pl.col("line") < first + _NEAR
    if starts.len():  # after the nearest start at or before each line
        reach = rows.select("line").join_asof(pl.DataFrame({"line": starts, "start": starts}), on="line", strategy="backward")
        rows = rows.with_columns(reach["start"])
        near = near | (pl.col("start").is_not_null() & (pl.col("line") - pl.col("start") < _NEAR))
    message = pl.col("message")
    dull = rows.filter(
        _shapeless() & ~near & ~message.str.contains(rules.markers) & ~message.str.contains_any(rules.literals)
    ).select("line")
    return (kept.join(dull, on="line", how="anti") if dull.height else kept), dull.height


def _anchors(batch: pl.DataFrame, kept: pl.DataFrame, bars: pl.DataFrame) -> pl.DataFrame:
    """The timed line just before each untimed kept line (and the batch's last timed line, for
    the next batch): where an untimed line takes its time from, when that line is not kept."""
    if batch.is_empty():
        return batch.select("line", "text")
    first = int(batch["line"][0])
    kept_at = kept["line"] - first
    waiting = kept_at.filter(~kept["text"].str.contains(_TIMED_AT_START))
    untimed = (batch["text"].str.len_bytes() == 0).scatter(pl.concat([bars["line"] - first, waiting]), True)
    timed = (~untimed).arg_true()
    if timed.is_empty():
        return batch.clear().select("line", "text")
    before = timed.search_sorted(waiting.cast(timed.dtype)).cast(pl.Int64) - 1
    picks = pl.concat([timed.gather(before.filter(before >= 0)), timed.tail(1)]).unique()
    picks = picks.filter(~picks.is_in(kept_at.cast(picks.dtype).implode()))
    return batch[picks].select("line", _copy("text"))


def _access_groups(access: pl.DataFrame) -> pl.DataFrame:
    """Access lines counted per minute and request; failed requests stay single lines.

    ``minute`` is right for ``[YYYY-MM-DD HH:MM:SS…]`` lines; lines with other prefixes
    (time-only, Ray, none) are counted per whole prefix (per second) and block.
    """
    text = pl.col("text")
    count = (pl.col("line").min(), text.first(), pl.len().alias("n"))
    # Neighbouring lines mostly share minute and request: each stretch of equal ones is counted
    # first (comparing neighbours is cheaper than hashing every line), then the stretches.
    stretches = access.group_by(pl.struct("minute", "request").rle_id().alias("stretch"), maintain_order=True).agg(
        pl.col("minute").first(), pl.col("request").first(), *count
    )
    groups = stretches.group_by("minute", "request").agg(pl.col("line").min(), text.first(), pl.col("n").sum())
    minutes = groups["minute"].unique()
    odd = minutes.filter(~minutes.str.contains(r"^\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:$")).implode()
    requests = groups["request"].unique().drop_nulls().to_list()
    failed = pl.Series([r for r in requests if _status(r) >= 400], dtype=pl.String).implode()
    single = access.filter(pl.col("request").is_in(failed)).with_columns(pl.lit(1, pl.UInt32).alias("n"))
    groups = groups.filter(~pl.col("request").is_in(failed) & ~pl.col("minute").is_in(odd))
    if odd.list.len().item():
        lines = access.filter(pl.col("minute").is_in(odd) & ~pl.col("request").is_in(failed))
        prefix = text.str.slice(0, text.str.find("INFO:", literal=True))
        lines = lines.with_columns(prefix.alias("minute"), (pl.col("line") // _FOLD_BLOCK).alias("block"))
        groups = pl.concat([groups, lines.group_by("minute", "request", "block").agg(*count).drop("block")])
    columns = ["line", "text", "request", "n"]
    groups = pl.concat([groups.select(columns), single.select(columns)]).sort("line")
    return groups.with_columns(_copy("text"), _copy("request"))


def _status(request: str) -> int:
    match = re.match(_REQUEST, request)
    return int(match.group("status")) if match else 0


def _stats_samples(stats: pl.DataFrame, rules: _Rules) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The last stats line per second and rank prefix (within a block), with the count behind it.

    Returns the samples whose record prefix opens the line (``line``, ``n``, ``text``, ``time``,
    ``tags``, ``message``, ``dt``, ``first``: the first line behind it, and ``stamp`` where the
    time has no date) and the rest (``line``, ``text``, ``n``).
    """
    text = pl.col("text")
    keys = stats.select(
        text.str.slice(0, text.str.find(" batch", literal=True)).alias("key"),
        (pl.col("line") // _FOLD_BLOCK).alias("block"),
        pl.int_range(pl.len(), dtype=pl.UInt32).alias("row"),
    )
    last = keys.group_by("key", "block").agg(pl.col("row").last(), pl.col("row").first().alias("first"), pl.len().alias("n")).sort("row")
    samples = stats[last["row"]].with_columns(last["n"], stats["line"].gather(last["first"]).alias("first"))
    # Most samples open with ``[YYYY-MM-DD HH:MM:SS] `` and nothing else in the brackets.
    plain = samples.with_columns(text.str.slice(1, 19).alias("time"))
    plain = plain.with_columns(_dated(pl.col("time"), fraction=False).alias("dt"))
    is_plain = (plain["text"].str.slice(20, 2) == "] ") & plain["dt"].is_not_null() & plain["text"].str.starts_with("[")
    fast = plain.filter(is_plain).select(
        "line", "n", "text", "time", pl.lit("").alias("tags"), text.str.slice(22).alias("message"), "dt", "first"
    )
    parsed = samples.filter(~is_plain).with_columns(text.str.extract_groups(rules.head).alias("g")).unnest("g")
    headed = parsed.filter(pl.col("time").is_not_null()).select(
        "line",
        "n",
        "text",
        "time",
        pl.col("tags").str.strip_chars(),
        text.str.replace(rules.head, "").alias("message"),
        _dated(pl.col("time")).alias("dt"),
        "first",
    )
    fast = pl.concat([fast, headed]).sort("line")
    fast = fast.with_columns(pl.when(pl.col("dt").is_null()).then(pl.col("time")).alias("stamp"))
    return fast, parsed.filter(pl.col("time").is_null()).select("line", "text", "n")


# ---------------------------------------------------------------------------------------------
# Stats samples → metric values, by line shape


@dataclass(frozen=True)
class _Shape:
    """One layout of a stats line: its head (``Prefill batch. ``), the text before each value
    (``#new-seq: ``; None for a part without one), the names of the values and how the line
    ends (on ``, `` or on a comma at all)."""

    what: str
    head: str
    prefixes: tuple[str | None, ...]
    names: tuple[str, ...]
    trailing: bool
    comma_end: bool

    @staticmethod
    def of(message: str) -> _Shape | None:
        """The shape of one message, as the generic parser would read it; None where only that
        parser will do (mixed chunks, forward counters, no value at all)."""
        head = re.match(_STATS_HEAD, message)
        if head is None or head.group(1) or "[" in head.group(0):
            return None
        parts = message[head.end() :].split(", ")
        trailing = len(parts) > 1 and re.fullmatch(r"[\s,]*", parts[-1]) is not None
        if trailing:
            parts.pop()
        prefixes: list[str | None] = []
        names: list[str] = []
        previous = ""
        for part in parts:
            prefix, name, bare = _value_prefix(part), part.strip(" ,").split(": ", 1)[0], part.lstrip(" ,")
            if prefix is None and bare.startswith("swa=") and ": full=" in previous:
                # 0.4.9's hybrid SWA pairs, ``#token: full=500, swa=300``: the second value is the
                # SWA pool's, named as 0.4.10+ name it (``#swa token``, ``swa token usage``).
                prefix = part[: len(part) - len(bare)] + "swa="
                name = "#swa " + names[-1][1:] if names[-1].startswith("#") else "swa " + names[-1]
            prefixes.append(prefix)
            if prefix:
                names.append(name)
            previous = part
        if not any(prefixes):
            return None
        comma_end = re.search(r",\s*$", message) is not None
        return _Shape(head.group(0).split(" ", 1)[0].lower(), head.group(0), tuple(prefixes), tuple(names), trailing, comma_end)

    def take(self, messages: pl.Series) -> tuple[pl.Series, pl.DataFrame]:
        """Which of ``messages`` have this shape (their positions), and their raw values (one
        column per name, in order)."""
        k = len(self.prefixes)
        at = messages.str.starts_with(self.head).arg_true()
        parts = messages.gather(at).str.slice(len(self.head)).str.splitn(", ", k + 1).struct.unnest()
        field = [pl.col(f"field_{i}") for i in range(k + 1)]
        fits = [
            f.str.starts_with(p) if p else f.is_not_null() & ~f.str.contains(": ", literal=True)
            for f, p in zip(field, self.prefixes)
        ]
        if self.trailing:
            fits.append(field[k].str.contains(r"^[\s,]*$"))
        else:
            fits.append(field[k].is_null() & (field[k - 1].str.contains(r",\s*$") == self.comma_end))
        # One query per shape, not one per field: a batch's few samples make each call's fixed cost count.
        valued = [f.str.slice(len(p)) for f, p in zip(field, self.prefixes) if p]
        raw = parts.select(pl.all_horizontal(fits).fill_null(False).alias("ok"), *(v.alias(str(i)) for i, v in enumerate(valued)))
        if not raw["ok"].all():
            at, raw = at.filter(raw["ok"]), raw.filter("ok")
        return at, raw.drop("ok")


def _value_prefix(part: str) -> str | None:
    """``" #new-seq: "`` for the part ``" #new-seq: 4"`` (what comes before its value)."""
    item = part.strip(" ,")
    if ": " not in item:
        return None
    return part[: len(part) - len(part.lstrip(" ,"))] + item.split(": ", 1)[0] + ": "


def _number(raw: pl.Expr) -> pl.Expr:
    """A value the plain cast missed: ``full=0.5``, ``80.75%``, ``True``/``False``."""
    clean = raw.str.strip_chars(" ,").str.strip_chars().str.strip_prefix("full=").str.strip_suffix("%")
    flag = clean.replace_strict({"True": 1.0, "False": 0.0}, default=None, return_dtype=pl.Float64)
    return clean.cast(pl.Float64, strict=False).fill_null(flag)


def _numbers(raw: pl.DataFrame, scales: list[float]) -> pl.DataFrame:
    """Stats values as numbers (columns as in ``raw``): plain numbers, ``full=0.5``, ``80.75%``,
    ``True``/``False``; each column times its scale."""
    values = raw.select(pl.all().cast(pl.Float64, strict=False))
    lost = [name for name, n in zip(raw.columns, (values.null_count() - raw.null_count()).row(0), strict=True) if n]
    if lost:
        values = values.with_columns(raw.select(_number(pl.col(name)) for name in lost))
    scaled = [pl.col(name) * scale for name, scale in zip(raw.columns, scales, strict=True) if scale != 1.0]
    return values.with_columns(scaled) if scaled else values


def _parse_samples(rows: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame, pl.Series, int]:
    """Samples → (metric rows, version clues, positions of the rows left to the generic parser,
    lines behind samples without any value).

    The clues name, for each parsed sample, a message of its shape (what the version rules
    look at), whether it has rank tags and whether its time has a date.

    Shapes are learnt from the rows themselves: the first row not yet placed names one, every
    row of that layout is parsed with plain slices, and so on.
    """
    config = _extras()["stats"]
    aliases: dict[str, str] = config.get("aliases", {})
    percent = set(config.get("percent_as_fraction", []))
    messages = rows["message"]
    is_stats = messages.str.starts_with("Prefill batch") | messages.str.starts_with("Decode batch")
    pending, left = is_stats.arg_true(), [(~is_stats).arg_true()]
    placed: list[pl.DataFrame] = []  # per shape: its rows
    pieces: list[pl.DataFrame] = []  # metric rows, one frame per shape
    for _ in range(_MAX_SHAPES):
        if pending.is_empty():
            break
        picked = messages.gather(pending)
        shape = _Shape.of(picked[0])
        at, raw = shape.take(picked) if shape is not None else (pending.clear(), [])
        if at.is_empty():
            left.append(pending.head(1))
            pending = pending.slice(1)
            continue
        hit = pending.gather(at)
        pending = pending.filter(~pl.int_range(len(pending), dtype=at.dtype, eager=True).is_in(at.implode()))
        example = picked[0].rstrip()
        placed.append(pl.DataFrame({"row": hit, "example": pl.repeat(example, len(hit), eager=True)}))
        keys = [_normal_key(name, aliases) for name in shape.names] + [f"sglang/{shape.what}_lines"]
        values = _numbers(raw, [0.01 if name in percent else 1.0 for name in shape.names])
        # The lines behind a sample count only where it has a value.
        counted = pl.when(pl.any_horizontal(pl.all().is_not_null())).then(rows["n"].gather(hit).cast(pl.Float64))
        values = values.with_columns(counted.alias(str(len(keys) - 1)))
        wide = rows[hit].select("line", pl.col("dt").alias("time")).hstack(values)
        long = wide.unpivot(index=["line", "time"], variable_name="key", value_name="value")
        named = pl.col("key").replace_strict({str(i): key for i, key in enumerate(keys)}, return_dtype=pl.String)
        pieces.append(long.filter(pl.col("value").is_not_null()).with_columns(named).select(_EMPTY_LONG.columns))
    left.append(pending)
    metrics = _EMPTY_LONG
    if pieces:
        # Stable sort: a sample's values keep their order within the line.
        metrics = pl.concat(pieces).sort("line", maintain_order=True)
    shapes = pl.concat(placed).sort("row") if placed else pl.DataFrame(schema={"row": pl.UInt32, "example": pl.String})
    samples = rows[shapes["row"]].select(
        "line",
        "n",
        shapes["example"],
        (pl.col("tags") == "").alias("untagged"),
        pl.col("time").str.contains(r"^\d{4}-").alias("dated"),
    )
    unparsed = int(samples.filter(~pl.col("line").is_in(metrics["line"].implode()))["n"].sum() or 0)
    return metrics, samples.drop("n"), pl.concat(left).sort(), unparsed


#: Said in a source's notes when its time-only prefixes took their dates from the file's time (a
#: copy's is the day it was copied): the run's steps may date them better.
MTIME_DATED = "time-only prefixes dated from the file's modification time"


_EMPTY_LONG = pl.DataFrame(schema={"line": pl.Int64, "time": pl.Datetime("ms"), "key": pl.String, "value": pl.Float64})


def _normal_key(name: str, aliases: dict[str, str]) -> str:
    if name in aliases:
        return "sglang/" + aliases[name]
    return "sglang/" + re.sub(r"[^a-z0-9]+", "_", name.lower().lstrip("#")).strip("_")


def _dated(stamp: pl.Expr, fraction: bool = True) -> pl.Expr:
    """``YYYY-MM-DD HH:MM:SS[.ffffff]`` → datetime (ms); null for time-only stamps."""
    seconds = stamp.str.slice(0, 19).str.to_datetime("%Y-%m-%d %H:%M:%S", strict=False, time_unit="ms", cache=False)
    if not fraction:
        return seconds
    digits = stamp.str.slice(20, 3).str.pad_end(3, "0").cast(pl.Int64, strict=False)
    millis = pl.when(stamp.str.slice(19, 1) == ".").then(digits).fill_null(0)
    return (seconds + pl.duration(milliseconds=millis)).cast(pl.Datetime("ms"))


# ---------------------------------------------------------------------------------------------
# Eager assembly on the few kept rows


def _assemble(path: Path, parts: _Parts, fmt: LogFormat, fold: bool) -> SGLangLog:
    file = str(path)
    notes: list[str] = []
    total = parts.last_line

    other = _classify(_fields(parts.other, fmt), fmt)
    rest = _fields(parts.stats_rest, fmt)
    access = parts.access
    anchors = _fields(parts.anchors, fmt).filter(pl.col("record"))

    timeline, dated_from_mtime = _timeline(_time_points(other, rest, access, anchors), parts.samples, path)
    if dated_from_mtime:
        notes.append(
            f"no date anywhere in the file: {MTIME_DATED} ({dated_from_mtime})"
        )

    other = _rank_copies(other)
    copies = int(other["rank_copy"].sum())
    if copies:
        notes.append(f"{copies} records repeated by several ranks (same time and text) were counted once")

    tracebacks, members, owners = _tracebacks(other, fmt)
    events = _events(file, other, tracebacks, members, owners, access, timeline, fmt)
    metrics, rest_unparsed = _metrics(file, other, parts, rest, timeline, fmt, fold)
    http, access_unparsed = _http(access, timeline)
    stats_lines = parts.stats_lines
    samples = parts.sample_count
    first_stats = min((line for line in (parts.first_sample, rest["line"].min()) if line is not None), default=None)
    servers, server_notes = _servers(other, first_stats, _Clues.of(other, parts.clues, rest), timeline, total)
    notes.extend(server_notes)

    seen = bool(other["record"].any()) or samples > 0 or access.height > 0 or servers.height > 0
    if not seen:
        notes.append("no SGLang server lines in this file")
    elif stats_lines == 0:
        if other.filter(pl.col("record") & pl.col("message").str.contains(r"^(?:server_args=|Load weight begin|max_total_num_tokens=)")).height:
            notes.append(
                "no server stats lines although SGLang logged at info level (no Decode/Prefill batch was logged): "
                "token usage and queue depth are not visible"
            )
        else:
            notes.append("no server stats lines: SGLang ran at warning level; token usage and queue depth are not visible")
    else:  # (said even when none was folded: a grown log's count is pieced together from its parts' notes)
        notes.append(
            f"Decode/Prefill stats lines: {stats_lines}, kept as {samples} samples (the last line per second and "
            "rank prefix); sglang/decode_lines and sglang/prefill_lines count the lines behind each sample"
        )
    if fold and parts.stats_values:  # (said even when none was folded, as the lines' count is)
        kept = metrics.select(pl.col("key").cat.starts_with("sglang/").sum()).item()
        notes.append(f"{parts.stats_values} server stats values kept as {kept}: per minute and key, the last value and the peak")
    if parts.request_logs:
        notes.append(f"{parts.request_logs} request log lines (Receive/Finish: obj=…) were skipped")
    if access_unparsed:
        notes.append(f"{access_unparsed} lines looked like HTTP access lines but were not")

    unparsed = _unparsed(other, members) + parts.stats_unparsed + rest_unparsed + access_unparsed + parts.dull
    return SGLangLog(
        path=file,
        metrics=metrics,
        events=events,
        http=http,
        servers=servers,
        lines=total,
        unparsed_lines=unparsed,
        notes=tuple(notes),
        restart_lines=() if parts.undated_minutes else tuple(sorted(parts.minute_starts["line"])) or None,
    )


def _fields(frame: pl.DataFrame, fmt: LogFormat) -> pl.DataFrame:
    """Raw lines → ``clean`` (no ANSI), ``bare`` (no Ray/docker/collector prefix) and record fields
    (``time``, ``tags``, ``level``, ``message``; ``record`` when the line carries an SGLang record)."""
    clean = pl.col("text")
    if frame["text"].str.contains("\x1b", literal=True).any():
        clean = clean.str.replace_all(ANSI, "")
    frame = frame.with_columns(clean.alias("clean"))
    # Prefixes come off before trailing blanks do: a Ray prefix alone on a line ends with a space.
    frame = frame.with_columns(
        _strip_prefixes(frame["clean"], fmt.prefixes.values()).str.strip_chars_end().alias("bare"),
        pl.col("clean").str.strip_chars_end(),
    )
    # Fast path: the record prefix opens the line (nearly every line of a busy log).
    head = _extras()["head"]
    parsed = frame.with_columns(pl.col("bare").str.extract_groups(head).alias("g")).unnest("g")
    at_start = pl.col("time").is_not_null()
    pieces = [
        parsed.filter(at_start).with_columns(pl.col("bare").str.replace(head, "").alias("message"), pl.lit(False).alias("inline"))
    ]
    rest = parsed.filter(~at_start).drop("time", "tags", "level")
    # A record after a tqdm bar (or other junk) on the same line: the full line regex, only where
    # a record prefix occurs at all.
    inside = rest["bare"].str.contains(_RECORD_ANYWHERE)
    if inside.any():
        pieces.append(
            rest.filter(inside)
            .with_columns(pl.col("bare").str.extract_groups(fmt.line_regex).alias("g"))
            .unnest("g")
            .drop("junk")
            .with_columns(pl.lit(True).alias("inline"))
        )
    plain = rest.filter(~inside) if inside.any() else rest
    pieces.append(
        plain.with_columns(
            pl.lit(None, pl.String).alias("time"),
            pl.lit(None, pl.String).alias("tags"),
            pl.col("bare").str.extract(_LEVEL, 1).alias("level"),
            pl.col("bare").str.replace(_LEVEL, "").alias("message"),
            pl.lit(False).alias("inline"),
        )
    )
    columns = pieces[0].columns
    return (
        pl.concat([p.select(columns) for p in pieces])
        .sort("line")
        .with_columns(
            pl.col("time").is_not_null().alias("record"),
            pl.col("message").fill_null(""),
            pl.col("tags").fill_null("").str.strip_chars(),
        )
    )


def _strip_prefixes(column: pl.Series, prefixes) -> pl.Expr:
    """Remove each prefix once from the start, testing first (most files use none of them)."""
    expr = pl.col(column.name)
    # Lines opening with a record (``[2025-…``, ``[16:43:29 …``) cannot have one: a prefix starts
    # with a letter, a parenthesis, or a role's name in brackets (AReaL's merged.log: ``[rollout] ``).
    maybe = column.filter(~column.str.contains(r"^\[\d"))
    for regex in prefixes:
        if maybe.str.contains(regex).any():
            expr = expr.str.replace(regex, "")
    return expr


def _access_rows(access: pl.DataFrame, fmt: LogFormat) -> pl.DataFrame:
    """Access groups (:func:`_access_groups`) → what the assembly reads of them: ``line``, ``n``,
    the time (``dt``, or ``stamp`` where it has no date, as :func:`_timeline` takes it),
    ``method``, ``endpoint``, ``status`` (null where the line is no access line after all) and, for
    failed requests (events), the ``clean`` text. Read while the batches are (see
    :func:`_reduce_all`), so the groups' texts are never all kept: a long run holds a few numbers
    per minute."""
    rows = _fields(access, fmt)
    requests = pl.DataFrame({"request": rows["request"].unique().drop_nulls()})
    requests = requests.with_columns(pl.col("request").str.extract_groups(_REQUEST).alias("r")).unnest("r")
    rows = rows.join(requests, on="request", how="left").sort("line")
    valid = pl.col("message").str.contains(_ACCESS)
    status = pl.when(valid).then(pl.col("status").cast(pl.Int64))
    dt = pl.when(pl.col("record")).then(_dated(pl.col("time")))
    return rows.select(
        "line",
        "n",
        dt.alias("dt"),
        pl.when(dt.is_null()).then(pl.col("time")).alias("stamp"),
        pl.when(valid).then(pl.col("method")).alias("method"),
        pl.when(valid).then(pl.col("target").str.replace(r"\?.*$", "")).alias("endpoint"),
        status.alias("status"),
        pl.when(status >= _FAILED).then(pl.col("clean")).alias("clean"),
    ).with_columns(_copy("stamp"), _copy("method"), _copy("endpoint"), _copy("clean"))


def _classify(other: pl.DataFrame, fmt: LogFormat) -> pl.DataFrame:
    """Flags and event kinds for the rows that are neither stats nor access lines."""
    areal = load_format("areal")
    understood = "|".join(f"(?:{r})" for r in _extras()["understood"].values())
    message = pl.col("message")
    maybe_wrapper = ~pl.col("record") | pl.col("inline")
    records = other.filter(~maybe_wrapper).with_columns(
        pl.lit(None, pl.String).alias("areal_time"),
        pl.lit(None, pl.String).alias("areal_text"),
        pl.lit(None, pl.String).alias("pytime"),
        *(pl.lit(False).alias(flag) for flag in ("areal", "chain", "indented", "exception", "understood")),
    )
    # Lines without a record: AReaL wrapper lines, Python logging lines, traceback parts, C++ output.
    rest = other.filter(maybe_wrapper)
    wrapper = _strip_prefixes(rest["clean"], areal.prefixes.values())
    rest = (
        rest.with_columns(wrapper.str.extract(_AREAL_HEAD, 1).alias("areal_time"), wrapper.alias("areal_text"))
        .with_columns(pl.col("areal_time").is_not_null().alias("areal"), pl.col("bare").str.extract_groups(_PYLOG_TIME).alias("py"))
        .unnest("py")
        .with_columns(
            pl.when(pl.col("pytime").is_not_null()).then(pl.concat_str("pytime", pl.lit("."), "pyms")).alias("pytime"),
            pl.coalesce("level", "pylevel").alias("level"),
            # An AReaL wrapper line is the wrapper's, even if its message quotes a server record.
            (pl.col("record") & pl.col("areal_time").is_null()).alias("record"),
        )
        .drop("pyms", "pylevel")
    )
    unprefixed = ~pl.col("areal") & ~pl.col("record")
    rest = rest.with_columns(
        (message.str.starts_with("During handling of the above exception") | message.str.starts_with("The above exception was the direct cause")).alias("chain"),
        (pl.col("bare").str.starts_with(" ") | pl.col("bare").str.starts_with("\t")).alias("indented"),
        (message.str.contains(fmt.traceback_exception) | message.str.contains(_DOTTED_EXCEPTION)).alias("exception"),
        message.str.contains(understood).alias("understood"),
    ).with_columns(*(pl.col(flag) & unprefixed for flag in ("chain", "indented", "exception", "understood")))
    other = pl.concat([records, rest.select(records.columns)]).sort("line")
    other = other.with_columns(
        message.str.strip_chars_end().str.ends_with("Traceback (most recent call last):").alias("tb_start")
    )
    # Event kinds: one combined regex first, the ordered per-pattern checks only on its hits.
    error_level = pl.col("level").is_in(["ERROR", "CRITICAL"])
    candidates = other.filter(
        (~pl.col("areal") & (message.str.contains(fmt.any_event) | error_level))
        | (pl.col("areal") & pl.col("areal_text").str.contains(areal.any_event))
    )
    # AReaL's wrapper and launcher lines (server launch, ready, exit) are read with AReaL's patterns.
    kinds = candidates.select(
        "line",
        pl.when(pl.col("areal"))
        .then(areal.classify(pl.col("areal_text")))
        .otherwise(pl.coalesce(fmt.classify(message), pl.when(error_level).then(pl.lit("log_error"))))
        .alias("kind"),
    )
    return other.join(kinds, on="line", how="left")


def _rank_copies(other: pl.DataFrame) -> pl.DataFrame:
    """Flag records that several ranks printed identically at the same time (all but the first)."""
    tagged = other.filter(pl.col("record") & (pl.col("tags") != ""))
    copies = tagged.filter(pl.col("tags") != pl.col("tags").first().over("time", "message"))["line"]
    return other.with_columns(pl.col("line").is_in(copies.implode()).alias("rank_copy"))


# ---------------------------------------------------------------------------------------------
# Time


def _time_points(other: pl.DataFrame, rest: pl.DataFrame, access: pl.DataFrame, anchors: pl.DataFrame) -> pl.DataFrame:
    """Every kept line that tells a time (``other`` with its AReaL and Python logging lines, the
    records among ``rest`` and ``anchors``, the timed access rows): ``line``, ``stamp`` (a record's
    or Python logging time, maybe without a date) and ``dt`` (a full timestamp, where known)."""
    areal_format = load_format("areal").timestamp_format
    areal_time = pl.col("areal_time").str.strptime(pl.Datetime("ms"), areal_format, strict=False)
    no_dt, no_stamp = pl.lit(None, pl.Datetime("ms")).alias("dt"), pl.lit(None, pl.String).alias("stamp")
    python_logging = ~pl.col("record") & pl.col("pytime").is_not_null()
    return pl.concat(
        [
            other.filter(pl.col("record")).select("line", pl.col("time").alias("stamp"), no_dt),
            other.filter(pl.col("areal")).select("line", no_stamp, areal_time.alias("dt")),
            other.filter(python_logging).select("line", pl.col("pytime").alias("stamp"), no_dt),
            rest.filter(pl.col("record")).select("line", pl.col("time").alias("stamp"), no_dt),
            access.filter(pl.col("dt").is_not_null() | pl.col("stamp").is_not_null()).select("line", "stamp", "dt"),
            anchors.filter(pl.col("record")).select("line", pl.col("time").alias("stamp"), no_dt),
        ]
    )


def _timeline(points: pl.DataFrame, samples: pl.DataFrame, path: Path) -> tuple[pl.DataFrame, str | None]:
    """Every timed line → its full timestamp; time-only prefixes get their date resolved.

    The date of a time-only line comes from the nearest dated line before it (an SGLang
    record with a date, an AReaL wrapper line, a Python logging line), plus one day for each
    time the clock went back by more than an hour since. Before the first dated line the first
    one after it is used; with no dated line at all, the file's modification date is the date
    of its last line. Stats samples (``samples``) only join when some prefix lacks a date.
    """
    tl = points.with_columns(pl.coalesce("dt", _dated(pl.col("stamp"))).alias("dt"))
    undated = pl.col("dt").is_null() & pl.col("stamp").is_not_null()
    if not (tl.filter(undated).height or samples["stamp"].is_not_null().any()):
        tl = tl.filter(pl.col("dt").is_not_null()).unique("line", keep="first", maintain_order=True).sort("line")
        return tl.select("line", pl.col("dt").alias("time")), None
    tl = pl.concat([tl, samples.select(tl.columns)]).unique("line", keep="first", maintain_order=True).sort("line")
    clock = pl.concat_str(pl.lit("1970-01-01 "), pl.col("stamp")).str.strptime(
        pl.Datetime("ms"), "%Y-%m-%d %H:%M:%S%.f", strict=False
    )
    tl = tl.with_columns(clock.alias("clock"))
    tl = tl.with_columns(
        pl.coalesce(
            (pl.col("dt") - pl.col("dt").dt.truncate("1d")).dt.total_milliseconds(),
            pl.col("clock").dt.epoch("ms"),
        ).alias("tod")
    ).filter(pl.col("tod").is_not_null())
    time_only = tl.filter(pl.col("dt").is_null())
    if time_only.is_empty():
        return tl.select("line", pl.col("dt").alias("time")), None
    tl = tl.with_columns(
        (pl.col("tod") < pl.col("tod").shift(1) - _ROLLOVER_MS).fill_null(False).cast(pl.Int64).cum_sum().alias("k")
    )
    zero = (pl.col("dt").dt.truncate("1d") - pl.duration(days=pl.col("k"))).alias("zero")
    tl = tl.with_columns(zero).with_columns(pl.col("zero").forward_fill().backward_fill())
    from_mtime = None
    if tl["zero"].is_null().all():
        last_day = datetime.fromtimestamp(path.stat().st_mtime).date()
        from_mtime = last_day.isoformat()
        first_day = datetime.combine(last_day, datetime.min.time()) - timedelta(days=int(tl["k"].max() or 0))
        tl = tl.with_columns(pl.lit(first_day).cast(pl.Datetime("ms")).alias("zero"))
    resolved = pl.coalesce(
        "dt", pl.col("zero") + pl.duration(days=pl.col("k")) + pl.duration(milliseconds=pl.col("tod"))
    )
    return tl.select("line", resolved.alias("time")), from_mtime


def _time_at(frame: pl.DataFrame, timeline: pl.DataFrame, exact: bool = False) -> pl.DataFrame:
    """``frame`` with a ``time`` column: its own line's time, else the nearest timed line before it
    (after it for lines above the first timed line)."""
    if "time" in frame.columns:
        frame = frame.drop("time")
    frame, tl = (in_order(f.with_columns(pl.col("line").cast(pl.Int64)), "line") for f in (frame, timeline))
    if exact:
        return frame.join(tl, on="line", how="left")
    back = frame.join_asof(tl, on="line", strategy="backward")
    if not back["time"].null_count():  # only lines above the first timed one look forward
        return back
    fwd = frame.join_asof(tl, on="line", strategy="forward").select(pl.col("time").alias("_fwd"))
    return back.with_columns(pl.coalesce("time", fwd["_fwd"]).alias("time"))


# ---------------------------------------------------------------------------------------------
# Tracebacks and events


@dataclass
class _Traceback:
    start: int
    owner: tuple[int, str | None, bool, str] | None  # line, kind, rank copy, text
    members: list[int]
    exception: str | None = None
    after_exception: bool = False
    roots: list[str] = field(default_factory=list)  # the chain's exceptions before the last, first first


def _tracebacks(other: pl.DataFrame, fmt: LogFormat) -> tuple[list[dict[str, Any]], set[int], set[int]]:
    """One entry per traceback (chained ones are one), with the lines that belong to it.

    A traceback starts at ``Traceback (most recent call last):``, either at the end of a record
    (``Scheduler hit an exception: Traceback …``) or on its own line (then an error record on the
    line just above owns it). Indented lines, chain markers, the exception line at column 0 and
    the unindented message lines right after it belong to it. Records of other processes may be
    interleaved (a sigquit line in the middle): they stay records of their own.
    """
    if not other["tb_start"].any():
        return [], set(), set()
    first = int(other.filter(pl.col("tb_start"))["line"].min())
    owners_above = {
        line: (line, kind, copy, text)
        for line, kind, copy, text in other.filter(
            pl.col("record") & (pl.col("kind").is_not_null() | pl.col("level").is_in(["ERROR", "CRITICAL"]))
        ).select("line", "kind", "rank_copy", "clean").iter_rows()
    }
    rows = other.filter(
        (pl.col("line") >= first) & (pl.col("tb_start") | (~pl.col("record") & ~pl.col("areal") & ~pl.col("understood")))
    ).select("line", "record", "rank_copy", "tb_start", "chain", "indented", "exception", "kind", "clean")
    found: list[_Traceback] = []
    cur: _Traceback | None = None
    prev_chain = False
    for line, record, copy, start, chain, indented, exception, kind, clean in rows.iter_rows():
        if start:
            if cur is not None and prev_chain:
                cur.members.append(line)
                cur.after_exception = False
            else:
                owner = (line, kind, copy, clean) if record else owners_above.get(line - 1)
                cur = _Traceback(start=line, owner=owner, members=[] if record else [line])
                found.append(cur)
        elif cur is None:
            pass
        elif chain or indented:
            cur.members.append(line)
            if chain:
                cur.after_exception = False
        elif exception and not cur.after_exception:
            if cur.exception is not None:
                cur.roots.append(cur.exception)
            cur.exception = clean
            cur.members.append(line)
            cur.after_exception = True
        elif cur.after_exception and kind is None and cur.members and line == cur.members[-1] + 1:
            cur.members.append(line)  # a multi-line exception message
        else:
            cur = None
        prev_chain = bool(chain) and cur is not None

    severity = {p.kind: p.severity for p in fmt.events}
    out = []
    members: set[int] = set()
    owners: set[int] = set()

    def kind_of(exception: str) -> str | None:
        kind = next((k for k, regex in fmt.traceback_kinds if re.search(regex, exception)), None)
        hit = next((p for p in fmt.events if re.search(p.regex, exception)), None) if kind is None else None
        return hit.kind if hit is not None and hit.severity in ("error", "fatal") else kind

    for tb in found:
        members.update(tb.members)
        exc_kind = kind_of(tb.exception) if tb.exception else None
        # A chain whose last exception is of no kind (a CUDA OOM re-raised as a plain error) is its root's.
        root, root_kind = next(((r, k) for r in tb.roots if (k := kind_of(r))), (None, None)) if exc_kind is None else (None, None)
        exc_kind = exc_kind or root_kind
        owner_kind = tb.owner[1] if tb.owner else None
        kind = exc_kind or (owner_kind if owner_kind not in (None, "log_error") else "traceback")
        if tb.owner:
            owners.add(tb.owner[0])
            if tb.owner[2]:
                continue  # the same traceback from another rank
        first_text = tb.owner[3] if tb.owner else "Traceback (most recent call last):"
        message = f"{first_text} … {tb.exception}" if tb.exception else first_text
        message = f"{first_text} … {root} … {tb.exception}" if root else message
        line = tb.owner[0] if tb.owner else tb.start
        out.append({"line": line, "kind": kind, "severity": severity.get(kind, "error"), "message": message})
    return out, members, owners


_ACCESS_EVENTS = (
    (r"^/(?:update_weights\w*|init_weights_update_group)", 400, "weight_update_failed", "error"),
    (r"^/flush_cache", 400, "cache_flush_failed", "error"),
    (r"^/health(?:_generate)?$", 500, "health_check_failed", "error"),
)
#: The least status an access event needs: only such access rows keep their text.
_FAILED = min(status for _, status, _, _ in _ACCESS_EVENTS)


def _events(
    file: str,
    other: pl.DataFrame,
    tracebacks: list[dict[str, Any]],
    members: set[int],
    owners: set[int],
    access: pl.DataFrame,
    timeline: pl.DataFrame,
    fmt: LogFormat,
) -> pl.DataFrame:
    severity = {p.kind: p.severity for p in fmt.events} | {"log_error": "error"}
    member_list = pl.Series(sorted(members), dtype=pl.Int64)
    owner_list = pl.Series(sorted(owners), dtype=pl.Int64)
    plain = other.filter(
        pl.col("kind").is_not_null()
        & ~pl.col("areal")
        & ~pl.col("rank_copy")
        & ~pl.col("line").is_in(owner_list.implode())
        & (pl.col("record") | (~pl.col("line").is_in(member_list.implode()) & ~pl.col("indented")))
    ).select(
        "line",
        "kind",
        pl.col("kind").replace_strict(severity, default="error").alias("severity"),
        pl.col("clean").alias("message"),
    )
    areal = load_format("areal")
    wrapper = other.filter(pl.col("kind").is_not_null() & pl.col("areal")).select(
        "line",
        "kind",
        pl.col("kind").replace_strict({p.kind: p.severity for p in areal.events}, default="error").alias("severity"),
        pl.col("clean").alias("message"),
        pl.lit(areal.source).alias("source"),
    )
    frames = [plain.with_columns(pl.lit(fmt.source).alias("source")), wrapper]
    if tracebacks:
        tb = pl.DataFrame(tracebacks, schema={"line": pl.Int64, "kind": pl.String, "severity": pl.String, "message": pl.String})
        frames.append(tb.with_columns(pl.lit(fmt.source).alias("source")))
    for endpoint, status, kind, level in _ACCESS_EVENTS:
        hit = access.filter(pl.col("endpoint").str.contains(endpoint) & (pl.col("status") >= status))
        if hit.height:
            frames.append(hit.select("line", pl.lit(kind).alias("kind"), pl.lit(level).alias("severity"),
                                     pl.col("clean").alias("message"), pl.lit(fmt.source).alias("source")))
    events = pl.concat([f.with_columns(pl.col("line").cast(pl.Int64)) for f in frames])
    events = _killed_when_told(_time_at(events, timeline), timeline).with_columns(pl.lit(file).alias("file"))
    return conform(events.sort("line"), EVENT_SCHEMA)


def _killed_when_told(events: pl.DataFrame, timeline: pl.DataFrame) -> pl.DataFrame:
    """A bare ``Killed`` has no time of its own: the shell printed it as the process died, just
    before the next timed line (the wrapper's ``exits, returncode=-9``) — not at the last line
    before it, which at warning level can be the launch, hours earlier."""
    if events.is_empty() or not (events["kind"] == "process_killed").any():  # (the usual case: no timeline test)
        return events
    bare = (pl.col("kind") == "process_killed") & ~pl.col("line").is_in(timeline["line"].implode())
    tl = in_order(timeline.with_columns(pl.col("line").cast(pl.Int64)), "line").rename({"time": "_next"})
    after = in_order(events, "line").join_asof(tl, on="line", strategy="forward")
    return after.with_columns(pl.when(bare & pl.col("_next").is_not_null()).then("_next").otherwise("time").alias("time")).drop("_next")


def _shapeless() -> pl.Expr:
    """A classified row (:func:`_classify`) of no known shape: not blank, a record, wrapper or
    logging line, traceback part, event, or known output."""
    return (
        ~pl.col("record") & ~pl.col("areal") & pl.col("pytime").is_null() & pl.col("level").is_null()
        & pl.col("kind").is_null() & ~pl.col("tb_start") & ~pl.col("chain") & ~pl.col("indented")
        & ~pl.col("understood") & (pl.col("bare").str.strip_chars() != "")
    )


def _unparsed(other: pl.DataFrame, members: set[int]) -> int:
    """Rows of no known shape (:func:`_shapeless`) that are no traceback's message lines."""
    member_list = pl.Series(sorted(members), dtype=pl.Int64)
    return other.select(_shapeless() & ~pl.col("line").is_in(member_list.implode())).sum().item()  # counted, not copied




# ---------------------------------------------------------------------------------------------
# Metrics


def _metrics(
    file: str, other: pl.DataFrame, parts: _Parts, rest: pl.DataFrame, timeline: pl.DataFrame, fmt: LogFormat, fold: bool
) -> tuple[pl.DataFrame, int]:
    """Stats values the batches parsed, plus the samples left to :func:`_generic_stats` and the
    records' startup/memory values → long-form metric rows; also the left samples without any
    value."""
    sampled = _generic_stats(rest)
    lined = _line_metrics(other.filter(pl.col("record") & ~pl.col("rank_copy")), fmt.metrics)
    few = _time_at(pl.concat([sampled, lined]), timeline, exact=True).select(_EMPTY_LONG.columns).with_columns(
        pl.col("key").cast(pl.Categorical)
    )
    # Each batch's few more rows go into its frame: sorting one small frame at a time is cheap.
    which = pl.Series(parts.ends).search_sorted(few["line"], side="left")
    batches = parts.metrics
    for i, batch in enumerate(batches):
        if batch["time"].null_count():  # time-only samples take their date from the timeline
            batch = _time_at(batch, timeline, exact=True).select(_EMPTY_LONG.columns).sort("line", maintain_order=True)
            batches[i] = last_and_peak_per_minute(batch) if fold else batch
    if fold:  # (a minute on both sides of a batch's edge, as if no batch had been cut there)
        batches[:] = folded_across(batches)
    for i, batch in enumerate(batches):
        extra = few.filter(which == i)
        batches[i] = pl.concat([batch, extra]).sort("line", maintain_order=True) if extra.height else batch
    metrics = pl.concat(batches).with_columns(pl.lit(file).alias("file"))
    parsed = sampled["line"].unique().implode()
    unparsed = int(rest.filter(~pl.col("line").is_in(parsed))["n"].sum() or 0) if rest.height else 0
    return conform(metrics, METRIC_SCHEMA), unparsed


def _line_metrics(records: pl.DataFrame, patterns: Iterable[MetricPattern]) -> pl.DataFrame:
    """Values that the format's metric patterns name in records' ``message`` → ``line``, ``key``,
    ``value``."""
    frames = []
    literals = sorted({p.literal for p in patterns})
    records = records.filter(pl.col("message").str.contains_any(literals))
    found = pl.col("message").str.contains
    present = {}
    if records.height:
        present = records.select(found(lit, literal=True).any().alias(lit) for lit in literals).row(0, named=True)
    for pattern in (p for p in patterns if present.get(p.literal)):
        groups = records.filter(found(pattern.literal, literal=True))
        groups = groups.select("line", pl.col("message").str.extract_groups(pattern.regex).alias("g")).unnest("g")
        for key in dict.fromkeys(pattern.keys.values()):
            numbers = [pl.col(g).cast(pl.Float64, strict=False) for g, k in pattern.keys.items() if k == key]
            # Groups that name the same key add up (K size + V size = KV cache size).
            value = pl.when(pl.any_horizontal(n.is_not_null() for n in numbers)).then(pl.sum_horizontal(numbers))
            frames.append(groups.select(pl.col("line").cast(pl.Int64), pl.lit(key).alias("key"), value.alias("value")))
    if not frames:
        return pl.DataFrame(schema={"line": pl.Int64, "key": pl.String, "value": pl.Float64})
    lined = pl.concat(frames).drop_nulls("value")
    # Patterns may overlap (two name the same value on one line): the first one wins.
    return lined.unique(["line", "key"], keep="first", maintain_order=True) if len(frames) > 1 else lined


def _generic_stats(stats: pl.DataFrame) -> pl.DataFrame:
    """Samples no shape fitted (mixed chunks, forward counters, records after a tqdm bar) → one
    row per field, found by field name."""
    empty = pl.DataFrame(schema={"line": pl.Int64, "key": pl.String, "value": pl.Float64})
    if stats.is_empty():
        return empty
    config = _extras()["stats"]
    aliases: dict[str, str] = config.get("aliases", {})
    percent: list[str] = config.get("percent_as_fraction", [])
    head = r"^(?:Prefill|Decode) batch(?:\(mixed (#running-req: \d+)\))?(?: \[\d+\])?[.,]?\s*"
    rows = stats.filter(pl.col("message").str.contains(r"^(?:Prefill|Decode) batch")).select(
        "line",
        "n",
        pl.col("message").str.extract(r"^(Prefill|Decode)", 1).str.to_lowercase().alias("what"),
        pl.concat_str(
            pl.col("message").str.extract(head, 1).fill_null(""),
            pl.lit(", "),
            pl.col("message").str.replace(head, ""),
        ).alias("body"),
    )
    items = (
        rows.select("line", pl.col("body").str.split(", ").alias("item"))
        .explode("item")
        .with_columns(pl.col("item").str.strip_chars(" ,"))
        .filter(pl.col("item") != "")
        .with_columns(pl.col("item").str.split_exact(": ", 1).alias("kv"))
        .unnest("kv")
        .rename({"field_0": "name", "field_1": "raw"})
        .filter(pl.col("raw").is_not_null())
    )
    if items.is_empty():  # stats heads with no fields (a line cut right after "Decode batch")
        return pl.DataFrame(schema={"line": pl.Int64, "key": pl.String, "value": pl.Float64})
    names = items["name"].unique().to_list()
    key_of = {n: _normal_key(n, aliases) for n in names}
    scale = {n: (0.01 if n in percent else 1.0) for n in names}
    raw = pl.col("raw").str.strip_chars().str.strip_prefix("full=").str.strip_suffix("%")
    items = items.with_columns(raw.alias("raw"))
    number = pl.col("raw").cast(pl.Float64, strict=False)
    flag = pl.col("raw").replace_strict({"True": 1.0, "False": 0.0}, default=None, return_dtype=pl.Float64)
    fields = items.select(
        "line",
        pl.col("name").replace_strict(key_of, return_dtype=pl.String).alias("key"),
        (pl.coalesce(number, flag) * pl.col("name").replace_strict(scale, return_dtype=pl.Float64)).alias("value"),
    ).drop_nulls("value")
    lines = rows.filter(pl.col("line").is_in(fields["line"].implode())).select(
        "line", pl.concat_str(pl.lit("sglang/"), "what", pl.lit("_lines")).alias("key"), pl.col("n").cast(pl.Float64).alias("value")
    )
    return pl.concat([fields, lines]).with_columns(pl.col("line").cast(pl.Int64))


# ---------------------------------------------------------------------------------------------
# HTTP access lines


def _http(access: pl.DataFrame, timeline: pl.DataFrame) -> tuple[pl.DataFrame, int]:
    if access.is_empty():
        return pl.DataFrame(schema=HTTP_SCHEMA), 0
    bad = int(access.filter(pl.col("status").is_null())["n"].sum() or 0)
    # Only the columns counted, the names as categories: a long log has millions of access groups,
    # and grouping them by strings, their texts copied along, took six times their size.
    good = access.filter(pl.col("status").is_not_null()).select(
        "line", "n", pl.col("endpoint").cast(pl.Categorical), pl.col("method").cast(pl.Categorical), "status"
    )
    http = (
        _time_at(good, timeline)
        .lazy()
        .with_columns(pl.col("time").dt.truncate("1m").alias("minute"))
        .group_by("minute", "endpoint", "method", "status")
        .agg(pl.col("n").sum().alias("count"), pl.col("line").min().alias("first_line"))
        .sort("minute", "first_line")
        .collect(engine="streaming")
    )
    return conform(http, HTTP_SCHEMA), bad


# ---------------------------------------------------------------------------------------------
# Server instances


_MARKERS = (
    ("launch", "areal_text", r"Launch command: .*launch_server", r"--port[ =](\d+)"),
    ("ready", "areal_text", r"SGLang server launched at", r":(\d+)/?\s*$"),
    ("args", "message", r"^server_args=ServerArgs\(", r"\bport=(\d+)"),
    ("ready", "message", r"^Uvicorn running on ", r"^Uvicorn running on \S+:(\d+)"),
    ("ready", "message", r"The server is fired up and ready to roll", None),
    ("startup", "message", r"^(?:Init torch distributed begin|Load weight begin)", None),
    ("exit", "areal_text", r"SGLang server \S+ exits, returncode=|SGLang server process\S* terminated", r":(\d+)\S* (?:exits|terminated)"),
    ("exit", "message", r"^Finished server process", None),
)


@dataclass
class _Instance:
    first_line: int
    port: int | None
    group: int
    args: bool = False
    ready_line: int | None = None
    launched: bool = True


def _markers(other: pl.DataFrame) -> list[tuple[int, str, int | None]]:
    """Launch, startup and ready lines in file order: (line, what, port)."""
    found = []
    for what, column, regex, port_regex in _MARKERS:
        source = pl.col("areal") if column == "areal_text" else pl.col("record") & ~pl.col("rank_copy")
        hit = other.filter(source & pl.col(column).str.contains(regex))
        if what == "startup":
            hit = hit.filter(~pl.col("tags").str.contains(r"[1-9]"))  # rank 0 (or no rank tag) only
        port = pl.col(column).str.extract(port_regex, 1).cast(pl.Int64, strict=False) if port_regex else pl.lit(None, pl.Int64)
        found.extend((int(line), what, p) for line, p in hit.select("line", port).iter_rows())
    return sorted(found)


def _instances(markers: list[tuple[int, str, int | None]]) -> list[_Instance]:
    """Tell server instances apart: each launch starts one; startup and ready lines join the
    instance still starting (same port when the line names one)."""
    out: list[_Instance] = []
    running: list[_Instance] = []  # not ended, in launch order

    def start(line: int, port: int | None, launched: bool = True) -> None:
        for stale in [i for i in running if i.ready_line is None and port is not None and i.port == port]:
            running.remove(stale)  # one server binds a port at a time: a start on it means this one died starting
        starting = [i for i in running if i.ready_line is None]
        group = starting[0].group if starting else (out[-1].group + 1 if out else 0)
        out.append(_Instance(first_line=line, port=port, group=group, launched=launched))
        running.append(out[-1])

    def fits(inst: _Instance, port: int | None) -> bool:
        return port is None or inst.port is None or inst.port == port

    for line, what, port in markers:
        starting = [i for i in running if i.ready_line is None and fits(i, port)]
        if what == "exit":
            alive = [i for i in running if fits(i, port)]
            if alive:
                running.remove(next((i for i in alive if port is not None and i.port == port), alive[-1]))
        elif what == "launch":
            start(line, port)
        elif what == "args":
            pending = [i for i in starting if not i.args]
            if pending:
                inst = next((i for i in pending if i.port == port), pending[0])
                inst.args = True
                inst.port = inst.port or port
            else:
                start(line, port)
                out[-1].args = True
        elif what == "startup":
            if not starting:
                start(line, None)
        else:  # ready
            if starting:
                inst = next((i for i in starting if port is not None and i.port == port), starting[0])
                inst.port = inst.port or port
                inst.ready_line = line
            elif out and fits(out[-1], port):
                out[-1].port = out[-1].port or port
            else:
                start(line, port, launched=False)
                out[-1].ready_line = line
    return out


def _servers(
    other: pl.DataFrame,
    first_stats: int | None,
    clues: _Clues,
    timeline: pl.DataFrame,
    total: int,
) -> tuple[pl.DataFrame, list[str]]:
    """One row per server instance, its line range, port and a version range from line shapes."""
    notes: list[str] = []
    instances = _instances(_markers(other))
    firsts = [int(other.filter(pl.col("record"))["line"].min() or 0) or None, first_stats]
    first_sglang = min((line for line in firsts if line is not None), default=None)
    if first_sglang is None and not instances:
        return pl.DataFrame(schema=SERVER_SCHEMA), notes
    if not instances:
        notes.append(
            "no server launch lines (server_args, AReaL 'Launch command', Uvicorn startup): all lines are "
            "taken as one server; several servers writing to this file could not be told apart"
        )
        instances = [_Instance(first_line=first_sglang or 1, port=None, group=0, launched=False)]
    elif first_sglang is not None and first_sglang < instances[0].first_line:
        # The file starts in the middle of a server's life: that server is instance 0.
        if instances[0].launched:
            for inst in instances:
                inst.group += 1
            instances.insert(0, _Instance(first_line=first_sglang, port=None, group=0, launched=False))
        else:
            instances[0].first_line = first_sglang
    groups: dict[int, list[_Instance]] = {}
    for inst in instances:
        groups.setdefault(inst.group, []).append(inst)
    order = sorted(groups)
    ends = [groups[g][0].first_line - 1 for g in order[1:]] + [total]
    spans = [(groups[g][0].first_line, end) for g, end in zip(order, ends, strict=True)]
    rows = []
    for g, (begin, end), hint in zip(order, spans, clues.hints(spans), strict=True):
        members = groups[g]
        if len(members) > 1:
            ports = ", ".join(str(i.port) for i in members if i.port is not None) or "unknown"
            # (the last group's end is the file's, said as such: a log grown since says the same)
            lines = f"lines {begin}–{end}" if g != order[-1] else f"from line {begin} on"
            notes.append(
                f"{len(members)} server instances launched together ({lines}, ports {ports}) write "
                "interleaved lines: their stats and events cannot be told apart"
            )
        for inst in members:
            rows.append(
                {
                    "launch_line": inst.first_line if inst.launched else None,
                    "first_line": inst.first_line,
                    "last_line": end,
                    "ready_line": inst.ready_line,
                    "port": inst.port,
                    "version_hint": hint,
                    "concurrent": len(members) > 1,
                }
            )
    frame = pl.DataFrame(
        rows,
        schema={"launch_line": pl.Int64, "first_line": pl.Int64, "last_line": pl.Int64, "ready_line": pl.Int64, "port": pl.Int64,
                "version_hint": pl.String, "concurrent": pl.Boolean},
    ).with_row_index("instance")
    launch = _time_at(frame.filter(pl.col("launch_line").is_not_null()).select("instance", pl.col("launch_line").alias("line")), timeline).select(
        "instance", pl.col("time").alias("launch_time")
    )
    ready = _time_at(frame.filter(pl.col("ready_line").is_not_null()).select("instance", pl.col("ready_line").alias("line")), timeline, exact=True).select(
        "instance", pl.col("time").alias("ready_time")
    )
    frame = frame.join(launch, on="instance", how="left").join(ready, on="instance", how="left").sort("instance")
    return conform(frame, SERVER_SCHEMA), notes


@cache
def _version_rules() -> tuple[list[str], list[tuple[str, str, str, frozenset[int]]]]:
    """Version rules from ``formats/sglang.json``: (scope, literal, regex, versions allowed)."""
    data = json.loads((resources.files("parsers") / "formats" / "sglang.json").read_text(encoding="utf-8"))["versions"]
    known: list[str] = data["known"]
    index = {v: i for i, v in enumerate(known)}
    rules = []
    for rule in data["rules"]:
        allowed = frozenset(i for lo, hi in rule["ranges"] for i in range(index[lo], index[hi] + 1))
        rules.append((rule["scope"], rule.get("literal", ""), rule["regex"], allowed))
    return known, rules


@dataclass(frozen=True)
class _Clues:
    """What can tell SGLang versions apart: records holding a rule's literal (``records``:
    ``line``, ``message``), the times of records (``stamps``: ``line``, ``time``), and for every
    stats sample a message of its shape, whether it has rank tags and whether its time has a
    date (``stats``: ``line``, ``example``, ``untagged``, ``dated``)."""

    records: pl.DataFrame
    stamps: pl.DataFrame
    stats: pl.DataFrame

    @staticmethod
    def of(other: pl.DataFrame, samples: pl.DataFrame, rest: pl.DataFrame) -> _Clues:
        _, rules = _version_rules()
        literals = sorted({lit for scope, lit, _, _ in rules if scope == "record" and lit})
        records = other.filter(pl.col("record") & pl.col("message").str.contains_any(literals))
        # The samples left to the generic parser are their own examples.
        left = rest.filter(pl.col("record")).select(
            "line",
            pl.col("message").cast(pl.Categorical).alias("example"),
            (pl.col("tags") == "").alias("untagged"),
            pl.col("time").str.contains(r"^\d{4}-").alias("dated"),
        )
        stamps = other.filter(pl.col("record")).select("line", "time")
        return _Clues(records.select("line", "message"), stamps, pl.concat([samples, left]))

    def hints(self, spans: list[tuple[int, int]]) -> list[str | None]:
        """For each line range ``(begin, end)`` (in order, not overlapping): the SGLang versions
        whose line shapes match those seen there."""
        known, rules = _version_rules()
        begins = pl.Series([b for b, _ in spans], dtype=pl.Int64)
        ends = pl.Series([e for _, e in spans], dtype=pl.Int64)

        def per_span(frame: pl.DataFrame, *aggs: pl.Expr) -> dict[int, dict[str, Any]]:
            span = begins.search_sorted(frame["line"], side="right").cast(pl.Int64) - 1
            inside = (span >= 0) & (frame["line"] <= ends.gather(span.clip(0)))
            found = frame.with_columns(span.alias("span")).filter(inside).group_by("span").agg(*aggs)
            return {row["span"]: row for row in found.iter_rows(named=True)}

        records = per_span(self.records, pl.col("message").unique())
        time = pl.col("time").str
        stamps = per_span(self.stamps, time.contains(r"^\d{2}:").any().alias("time_only"), time.contains(r"^\d{4}-").any().alias("dated"))
        stats = per_span(
            self.stats,
            pl.col("example").unique(),
            pl.col("untagged").any(),
            pl.col("dated").any(),
            (~pl.col("dated")).any().alias("time_only"),
        )
        out = []
        for i in range(len(spans)):
            times, samples = stamps.get(i, {}), stats.get(i, {})
            flags = {
                "time_only": bool(times.get("time_only") or samples.get("time_only")),
                "dated": bool(times.get("dated") or samples.get("dated")),
                "untagged_stats": bool(samples.get("untagged")),
            }
            hits = set(_flag_rules(flags)).union(
                *(_rule_hits("record", m) for m in records.get(i, {}).get("message", [])),
                *(_rule_hits("stats", m) for m in samples.get("example", [])),
            )
            possible = set(range(len(known)))
            for rule in hits:
                possible &= rules[rule][3]
            out.append(_version_range(possible, known) if hits else None)
        return out


def _flag_rules(flags: dict[str, bool]) -> list[int]:
    """The version rules that hold for a line range through its flags (dated, time-only, …)."""
    _, rules = _version_rules()
    return [i for i, (scope, _, _, _) in enumerate(rules) if flags.get(scope, False)]


@cache
def _rule_hits(kind: str, message: str) -> frozenset[int]:
    """The version rules one record (``kind="record"``) or stats message matches."""
    _, rules = _version_rules()
    scopes = {"record"} if kind == "record" else {"stats", "decode" if message.startswith("Decode") else "", "prefill" if message.startswith("Prefill") else ""}
    return frozenset(
        i for i, (scope, literal, regex, _) in enumerate(rules) if scope in scopes and literal in message and re.search(regex, message)
    )


def _version_range(possible: set[int], known: list[str]) -> str | None:
    """``0.4.10-0.5.3``, ``>=0.5.10``, ``0.3.1-0.4.3 or 0.4.7`` … for a set of version indexes."""
    if len(possible) == len(known):
        return None
    if not possible:
        return "conflicting (several versions?)"
    runs: list[list[int]] = []
    for i in sorted(possible):
        if runs and runs[-1][-1] == i - 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    last = len(known) - 1
    parts = []
    for run in runs:
        lo, hi = known[run[0]], known[run[-1]]
        if run[0] == run[-1]:
            parts.append(lo)
        elif run[-1] == last:
            parts.append(f">={lo}")
        elif run[0] == 0:
            parts.append(f"<={hi}")
        else:
            parts.append(f"{lo}-{hi}")
    return " or ".join(parts)
