"""SGLang server logs (AReaL's ``llm_server.log``, verl/Ray worker output, plain server logs) → frames.

Covers SGLang 0.3 → 0.5.2x (see ``shared/formats/sglang.md``): the ``[time rank-tags] message``
prefix in all its forms (time-only ``[16:43:29 TP0]``, dated, with milliseconds, any rank tags
or none), records that start after a tqdm bar on the same physical line, Ray/docker/collector
prefixes, ANSI colours, AReaL wrapper lines in between (understood, left to the AReaL parser),
tracebacks, NCCL/C++ output and bare ``Killed`` lines.

Work is split in two, as in :mod:`parsers.areal`:

- :func:`_extract` is one lazy, line-local pass. Cheap checks sort every line into stats
  lines (``Decode batch``/``Prefill batch``), HTTP access lines, and the rest. Stats lines are
  folded to the last line per second and rank prefix, access lines are counted per second,
  endpoint and status, so an info-level log of gigabytes shrinks to a few thousand rows before
  any regex runs.
- :func:`_assemble` parses those rows eagerly: record fields, dates for time-only prefixes,
  tracebacks, server instances, metrics and events.

Example:
    >>> log = read_sglang_log(Path("outputs/logs/root/exp/trial0/llm_server.log"))  # doctest: +SKIP
    >>> log.metrics.filter(pl.col("key") == "sglang/token_usage")  # doctest: +SKIP
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import polars as pl

from parsers._formats import LogFormat, load_format
from parsers._lines import ANSI, collect_lines, sniff
from parsers.schema import EVENT_SCHEMA, METRIC_SCHEMA, conform

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
#: Stats lines are folded within blocks of this many lines, so a time-only prefix that
#: repeats a day later never lands in the same fold.
_FOLD_BLOCK = 4096
_ROLLOVER_MS = 3_600_000
_PYLOG_TIME = r"^(?P<pylevel>DEBUG|INFO|WARNING|ERROR|CRITICAL):(?P<pytime>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}),(?P<pyms>\d{3}):"
_RECORD_ANYWHERE = r"\[(?:\d{4}-\d{2}-\d{2} )?\d{2}:\d{2}:\d{2}(?:\.\d{1,6})?(?: [A-Z_]+\d+)*\] ?"
_LEVEL = r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL):\s+"
#: The AReaL logger's line head (``(AReaL) 20251111-09:00:01.200 name LEVEL: ``): its timestamp.
_AREAL_HEAD = r"^(?:\(AReaL\) )?(\d{8}-\d{2}:\d{2}:\d{2}\.\d{3}) \S"
_DOTTED_EXCEPTION = r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+: "
_ACCESS = r'^(?P<client>\S+) - "(?P<method>[A-Z]+) (?P<target>\S+) HTTP/[\d.]+" (?P<status>\d{3})(?: |$)'


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


def read_sglang_log(path: Path) -> SGLangLog:
    """Parse one SGLang server log (plain or gzipped, any version 0.3 → 0.5.2x) into frames."""
    path = Path(path)
    fmt = load_format("sglang")
    parts = collect_lines(path, _extract)
    return _assemble(path, parts, fmt)


# ---------------------------------------------------------------------------------------------
# The lazy, line-local pass


def _extract(lines: pl.LazyFrame) -> dict[str, pl.LazyFrame]:
    """Sort lines by cheap checks (regexes with literal prefilters); fold the bulk (stats and
    access lines) right away."""
    text = pl.col("text")
    # Request logs (``--log-requests``, huge lines) ride along with the stats lines: one pass
    # less over the file, and they fold the same way (sorted out again in _assemble).
    sort = (
        pl.when(text.str.contains(f"{_STATS}|{_REQUEST_LOG}"))
        .then(pl.lit(1, pl.Int8))
        .when(text.str.contains(_ACCESS_HINT))
        .then(pl.lit(2, pl.Int8))
        .otherwise(pl.lit(0, pl.Int8))
    )
    sorted_lines = lines.with_columns(sort.alias("sort"))
    block = (pl.col("line") // _FOLD_BLOCK).alias("block")
    stats = (
        sorted_lines.filter(pl.col("sort") == 1)
        .group_by(text.str.head(text.str.find(" batch", literal=True)).alias("key"), block)
        .agg(
            pl.col("line").max().alias("line"),
            text.max_by("line").alias("text"),
            pl.len().alias("n"),
        )
    )
    access = (
        sorted_lines.filter(pl.col("sort") == 2)
        .group_by(
            text.str.head(text.str.find("INFO:", literal=True)).alias("pre"),
            text.str.slice(text.str.find(' - "', literal=True) + 4).alias("request"),
            block,
        )
        .agg(
            pl.col("line").min().alias("line"),
            text.min_by("line").alias("text"),
            pl.len().alias("n"),
        )
    )
    other = sorted_lines.filter((pl.col("sort") == 0) & (text.str.len_bytes() > 0)).select("line", "text")
    counts = sorted_lines.select(pl.col("line").max().alias("last_line"))
    return {"stats": stats, "access": access, "other": other, "counts": counts}


# ---------------------------------------------------------------------------------------------
# Eager assembly on the few kept rows


def _assemble(path: Path, parts: dict[str, pl.DataFrame], fmt: LogFormat) -> SGLangLog:
    file = str(path)
    notes: list[str] = []
    counts = parts["counts"]
    total = int(counts["last_line"].max() or 0)

    other = _classify(_fields(parts["other"].sort("line"), fmt), fmt)
    stats = _refold(parts["stats"], ["key", "block"], last=True)
    stats = _fields(stats, fmt)
    is_request_log = pl.col("message").str.contains(r"^(?:Receive|Finish): obj=")
    request_logs = int(stats.filter(is_request_log)["n"].sum() or 0)
    stats = stats.filter(~is_request_log)
    access = _refold(parts["access"], ["pre", "request", "block"], last=False)
    access = _fields(access, fmt)

    timeline, dated_from_mtime = _timeline(other, stats, access, path)
    if dated_from_mtime:
        notes.append(
            f"no date anywhere in the file: time-only prefixes dated from the file's modification time ({dated_from_mtime})"
        )

    other = _rank_copies(other)
    copies = int(other["rank_copy"].sum())
    if copies:
        notes.append(f"{copies} records repeated by several ranks (same time and text) were counted once")

    tracebacks, members, owners = _tracebacks(other, fmt)
    events = _events(file, other, tracebacks, members, owners, access, timeline, fmt)
    metrics, stats_unparsed, stats_lines = _metrics(file, other, stats, timeline, fmt)
    http, access_unparsed = _http(access, timeline)
    servers, server_notes = _servers(other, stats, timeline, total)
    notes.extend(server_notes)

    seen = bool(other["record"].any()) or stats.height > 0 or access.height > 0 or servers.height > 0
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
    elif stats_lines > stats.height:
        notes.append(
            f"{stats_lines} Decode/Prefill stats lines kept as {stats.height} samples (the last line per second and "
            "rank prefix); sglang/decode_lines and sglang/prefill_lines count the lines behind each sample"
        )
    if request_logs:
        notes.append(f"{request_logs} request log lines (Receive/Finish: obj=…) were skipped")
    if access_unparsed:
        notes.append(f"{access_unparsed} lines looked like HTTP access lines but were not")

    unparsed = _unparsed(other, members) + stats_unparsed + access_unparsed
    return SGLangLog(
        path=file,
        metrics=metrics,
        events=events,
        http=http,
        servers=servers,
        lines=total,
        unparsed_lines=unparsed,
        notes=tuple(notes),
    )


def _refold(frame: pl.DataFrame, keys: list[str], last: bool) -> pl.DataFrame:
    """Merge folds that a chunked read split in two (a no-op on the fast path)."""
    if frame.is_empty():
        return frame.select("line", "text", "n")
    pick = pl.col("line").arg_max() if last else pl.col("line").arg_min()
    return (
        frame.group_by(keys)
        .agg(
            (pl.col("line").max() if last else pl.col("line").min()).alias("line"),
            pl.col("text").get(pick).alias("text"),
            pl.col("n").sum().alias("n"),
        )
        .select("line", "text", "n")
        .sort("line")
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
    for regex in prefixes:
        if column.str.contains(regex).any():
            expr = expr.str.replace(regex, "")
    return expr


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
    candidates = other.filter(~pl.col("areal") & (message.str.contains(fmt.any_event) | error_level))
    kinds = candidates.select(
        "line",
        pl.coalesce(fmt.classify(message), pl.when(error_level).then(pl.lit("log_error"))).alias("kind"),
    )
    return other.join(kinds, on="line", how="left")


def _rank_copies(other: pl.DataFrame) -> pl.DataFrame:
    """Flag records that several ranks printed identically at the same time (all but the first)."""
    tagged = other.filter(pl.col("record") & (pl.col("tags") != ""))
    copies = tagged.filter(pl.col("tags") != pl.col("tags").first().over("time", "message"))["line"]
    return other.with_columns(pl.col("line").is_in(copies.implode()).alias("rank_copy"))


# ---------------------------------------------------------------------------------------------
# Time


def _timeline(other: pl.DataFrame, stats: pl.DataFrame, access: pl.DataFrame, path: Path) -> tuple[pl.DataFrame, str | None]:
    """Every timed line → its full timestamp; time-only prefixes get their date resolved.

    The date of a time-only line comes from the nearest dated line before it (an SGLang
    record with a date, an AReaL wrapper line, a Python logging line), plus one day for each
    time the clock went back by more than an hour since. Before the first dated line the first
    one after it is used; with no dated line at all, the file's modification date is the date
    of its last line.
    """
    areal_fmt = load_format("areal")
    parts = [
        other.filter(pl.col("record")).select("line", pl.col("time").alias("stamp"), pl.lit(None, pl.Datetime("ms")).alias("dt")),
        other.filter(pl.col("areal")).select(
            "line",
            pl.lit(None, pl.String).alias("stamp"),
            pl.col("areal_time").str.strptime(pl.Datetime("ms"), areal_fmt.timestamp_format, strict=False).alias("dt"),
        ),
        other.filter(~pl.col("record") & pl.col("pytime").is_not_null()).select(
            "line", pl.col("pytime").alias("stamp"), pl.lit(None, pl.Datetime("ms")).alias("dt")
        ),
        stats.filter(pl.col("record")).select("line", pl.col("time").alias("stamp"), pl.lit(None, pl.Datetime("ms")).alias("dt")),
        access.filter(pl.col("record")).select("line", pl.col("time").alias("stamp"), pl.lit(None, pl.Datetime("ms")).alias("dt")),
    ]
    tl = pl.concat(parts).unique("line", keep="first").sort("line")
    dated = pl.col("stamp").str.strptime(pl.Datetime("ms"), "%Y-%m-%d %H:%M:%S%.f", strict=False)
    clock = pl.concat_str(pl.lit("1970-01-01 "), pl.col("stamp")).str.strptime(
        pl.Datetime("ms"), "%Y-%m-%d %H:%M:%S%.f", strict=False
    )
    tl = tl.with_columns(pl.coalesce("dt", dated).alias("dt"), clock.alias("clock"))
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
    frame = frame.with_columns(pl.col("line").cast(pl.Int64)).sort("line")
    tl = timeline.with_columns(pl.col("line").cast(pl.Int64)).sort("line")
    if exact:
        return frame.join(tl, on="line", how="left")
    back = frame.join_asof(tl, on="line", strategy="backward")
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
    for tb in found:
        members.update(tb.members)
        exc_kind = None
        if tb.exception:
            exc_kind = next((k for k, regex in fmt.traceback_kinds if re.search(regex, tb.exception)), None)
            if exc_kind is None:
                hit = next((p for p in fmt.events if re.search(p.regex, tb.exception)), None)
                if hit is not None and hit.severity in ("error", "fatal"):
                    exc_kind = hit.kind
        owner_kind = tb.owner[1] if tb.owner else None
        kind = exc_kind or (owner_kind if owner_kind not in (None, "log_error") else "traceback")
        if tb.owner:
            owners.add(tb.owner[0])
            if tb.owner[2]:
                continue  # the same traceback from another rank
        first_text = tb.owner[3] if tb.owner else "Traceback (most recent call last):"
        message = f"{first_text} … {tb.exception}" if tb.exception else first_text
        line = tb.owner[0] if tb.owner else tb.start
        out.append({"line": line, "kind": kind, "severity": severity.get(kind, "error"), "message": message})
    return out, members, owners


_ACCESS_EVENTS = (
    (r"^/(?:update_weights\w*|init_weights_update_group)", 400, "weight_update_failed", "error"),
    (r"^/flush_cache", 400, "cache_flush_failed", "error"),
    (r"^/health(?:_generate)?$", 500, "health_check_failed", "error"),
)


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
    frames = [plain]
    if tracebacks:
        frames.append(pl.DataFrame(tracebacks, schema={"line": pl.Int64, "kind": pl.String, "severity": pl.String, "message": pl.String}))
    parsed = access.with_columns(pl.col("message").str.extract_groups(_ACCESS).alias("a")).unnest("a")
    for endpoint, status, kind, level in _ACCESS_EVENTS:
        hit = parsed.filter(
            pl.col("target").str.replace(r"\?.*$", "").str.contains(endpoint)
            & (pl.col("status").cast(pl.Int64, strict=False) >= status)
        )
        if hit.height:
            frames.append(hit.select("line", pl.lit(kind).alias("kind"), pl.lit(level).alias("severity"), pl.col("clean").alias("message")))
    events = pl.concat([f.with_columns(pl.col("line").cast(pl.Int64)) for f in frames])
    events = _time_at(events, timeline).with_columns(pl.lit(fmt.source).alias("source"), pl.lit(file).alias("file"))
    return conform(events.sort("line"), EVENT_SCHEMA)


def _unparsed(other: pl.DataFrame, members: set[int]) -> int:
    """Rows of no known shape: not a record, wrapper line, traceback part, event, or known output."""
    member_list = pl.Series(sorted(members), dtype=pl.Int64)
    return other.filter(
        ~pl.col("record")
        & ~pl.col("areal")
        & pl.col("pytime").is_null()
        & pl.col("level").is_null()
        & pl.col("kind").is_null()
        & ~pl.col("tb_start")
        & ~pl.col("chain")
        & ~pl.col("indented")
        & ~pl.col("understood")
        & ~pl.col("line").is_in(member_list.implode())
        & (pl.col("bare").str.strip_chars() != "")
    ).height


# ---------------------------------------------------------------------------------------------
# Metrics


def _metrics(
    file: str, other: pl.DataFrame, stats: pl.DataFrame, timeline: pl.DataFrame, fmt: LogFormat
) -> tuple[pl.DataFrame, int, int]:
    """Stats samples (by field name) and startup/memory lines → long-form metric rows."""
    sampled = _stats_metrics(stats)
    frames = []
    records = other.filter(pl.col("record") & ~pl.col("rank_copy"))
    for pattern in fmt.metrics:
        found = records.filter(pl.col("message").str.contains(pattern.literal, literal=True))
        if found.is_empty():
            continue
        found = found.with_columns(pl.col("message").str.extract_groups(pattern.regex).alias("g")).unnest("g")
        values = pl.concat(
            found.select("line", pl.lit(key).alias("key"), pl.col(group).cast(pl.Float64, strict=False).alias("value"))
            for group, key in pattern.keys.items()
        ).drop_nulls("value")
        # Groups that name the same key add up (K size + V size = KV cache size).
        frames.append(values.group_by("line", "key", maintain_order=True).agg(pl.col("value").sum()))
    lined = pl.concat([f.with_columns(pl.col("line").cast(pl.Int64)) for f in frames]) if frames else sampled.clear()
    # Patterns may overlap (two name the same value on one line): the first one wins.
    lined = lined.unique(["line", "key"], keep="first", maintain_order=True)
    metrics = pl.concat([sampled, lined])
    metrics = _time_at(metrics, timeline, exact=True).with_columns(pl.lit(file).alias("file"))
    stats_lines = int(stats["n"].sum() or 0) if stats.height else 0
    parsed = sampled["line"].unique().implode()
    unparsed = int(stats.filter(~pl.col("line").is_in(parsed))["n"].sum() or 0) if stats.height else 0
    return conform(metrics.sort("line"), METRIC_SCHEMA), unparsed, stats_lines


def _normal_key(name: str, aliases: dict[str, str]) -> str:
    if name in aliases:
        return "sglang/" + aliases[name]
    return "sglang/" + re.sub(r"[^a-z0-9]+", "_", name.lower().lstrip("#")).strip("_")


def _stats_metrics(stats: pl.DataFrame) -> pl.DataFrame:
    """``Decode batch``/``Prefill batch`` samples → one row per field, found by field name."""
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
    parsed = access.with_columns(pl.col("message").str.extract_groups(_ACCESS).alias("a")).unnest("a")
    bad = int(parsed.filter(pl.col("status").is_null())["n"].sum() or 0)
    good = _time_at(parsed.filter(pl.col("status").is_not_null()), timeline)
    http = (
        good.with_columns(
            pl.col("time").dt.truncate("1m").alias("minute"),
            pl.col("target").str.replace(r"\?.*$", "").alias("endpoint"),
            pl.col("status").cast(pl.Int64),
        )
        .group_by("minute", "endpoint", "method", "status")
        .agg(pl.col("n").sum().alias("count"), pl.col("line").min().alias("first_line"))
        .sort("minute", "first_line")
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
    ended: bool = False


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

    def start(line: int, port: int | None, launched: bool = True) -> None:
        starting = [i for i in out if i.ready_line is None and not i.ended]
        group = starting[0].group if starting else (out[-1].group + 1 if out else 0)
        out.append(_Instance(first_line=line, port=port, group=group, launched=launched))

    def fits(inst: _Instance, port: int | None) -> bool:
        return port is None or inst.port is None or inst.port == port

    for line, what, port in markers:
        starting = [i for i in out if i.ready_line is None and not i.ended and fits(i, port)]
        if what == "exit":
            alive = [i for i in out if not i.ended and fits(i, port)]
            if alive:
                next((i for i in alive if port is not None and i.port == port), alive[-1]).ended = True
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
    other: pl.DataFrame, stats: pl.DataFrame, timeline: pl.DataFrame, total: int
) -> tuple[pl.DataFrame, list[str]]:
    """One row per server instance, its line range, port and a version range from line shapes."""
    notes: list[str] = []
    instances = _instances(_markers(other))
    sglang_lines = pl.concat([other.filter(pl.col("record")).select("line"), stats.select("line")])["line"]
    first_sglang = int(sglang_lines.min()) if len(sglang_lines) else None
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
    evidence = _version_evidence(other, stats)
    groups: dict[int, list[_Instance]] = {}
    for inst in instances:
        groups.setdefault(inst.group, []).append(inst)
    order = sorted(groups)
    rows = []
    for gi, g in enumerate(order):
        members = groups[g]
        end = groups[order[gi + 1]][0].first_line - 1 if gi + 1 < len(order) else total
        begin = members[0].first_line
        hint = _version_hint(evidence, other, begin, end)
        if len(members) > 1:
            ports = ", ".join(str(i.port) for i in members if i.port is not None) or "unknown"
            notes.append(
                f"{len(members)} server instances launched together (lines {begin}–{end}, ports {ports}) write "
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


def _version_evidence(other: pl.DataFrame, stats: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The few lines that can tell versions apart: records holding a rule's literal, and one
    stats line per shape (numbers blanked) and rank-tag presence."""
    _, rules = _version_rules()
    literals = sorted({lit for scope, lit, _, _ in rules if scope == "record" and lit})
    records = other.filter(pl.col("record") & pl.col("message").str.contains_any(literals)).select("line", "message")
    shapes = (
        stats.filter(pl.col("record"))
        .select("line", "message", "time", (pl.col("tags") == "").alias("untagged"))
        .with_columns(pl.col("message").str.replace_all(r"\d+(?:\.\d+)?", "0").alias("shape"))
    )
    # One stats line per shape is enough, but keep each shape's first and last line so that a
    # file holding two servers' ranges still sees the shape in both.
    shapes = pl.concat([shapes.unique(["shape", "untagged"], keep="first"), shapes.unique(["shape", "untagged"], keep="last")])
    return records, shapes.unique("line")


def _version_hint(evidence: tuple[pl.DataFrame, pl.DataFrame], other: pl.DataFrame, begin: int, end: int) -> str | None:
    """The SGLang versions whose line shapes match those seen in lines ``begin``–``end``."""
    known, rules = _version_rules()
    records, shapes = evidence
    inside = pl.col("line").is_between(begin, end)
    record_messages = records.filter(inside)["message"].to_list()
    samples = shapes.filter(inside)
    stats_messages = samples["message"].to_list()
    stamps = pl.concat([other.filter(inside & pl.col("record"))["time"], samples["time"]])
    scopes = {
        "record": record_messages,
        "stats": stats_messages,
        "decode": [m for m in stats_messages if m.startswith("Decode")],
        "prefill": [m for m in stats_messages if m.startswith("Prefill")],
    }
    flags = {
        "time_only": bool(stamps.str.contains(r"^\d{2}:").any()),
        "dated": bool(stamps.str.contains(r"^\d{4}-").any()),
        "untagged_stats": bool(samples["untagged"].any()),
    }
    possible = set(range(len(known)))
    seen = False
    for scope, literal, regex, allowed in rules:
        if scope in flags:
            hit = flags[scope]
        else:
            pattern = re.compile(regex)
            hit = any(pattern.search(m) for m in scopes[scope] if literal in m)
        if hit:
            seen = True
            possible &= allowed
    if not seen or len(possible) == len(known):
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
