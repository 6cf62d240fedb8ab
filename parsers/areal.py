"""AReaL and realhf text logs (``trainer.log``, ``llm_server.log``, ``main.log``, …) → frames.

Handles every StatsLogger era: the ``Train step g/G done.`` header followed by one or more
``Stats (i/N):`` fancy_grid tables (AReaL-lite, v0.3-lite … HEAD), realhf's ``RPC name …
returns`` tables closed by ``(global step g) finishes.``, tables with any number of key/value
pairs per row, blank cells, ``nan``/``inf``. Around the text: ANSI colours, the ``(AReaL)``
header, ``merged.log`` role prefixes, Ray ``(Name pid=N)`` prefixes, and relaunches that append
to the same file (the later copy of a step wins).

Work is split in two: :func:`_extract` does line-local filtering and splitting (vectorized,
streamable), :func:`_assemble` links the few extracted rows (headers, tables, tracebacks).

Example:
    >>> log = read_areal_log(Path("outputs/logs/root/exp/trial0/trainer.log"))  # doctest: +SKIP
    >>> log.metrics.filter(pl.col("key") == "grpo_actor/task_reward/avg")  # doctest: +SKIP
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from parsers._formats import LogFormat, load_format
from parsers._lines import ANSI, collect_lines, sniff
from parsers.schema import EVENT_SCHEMA, METRIC_SCHEMA, STEP_SCHEMA, conform

__all__ = ["AReaLLog", "read_areal_log", "looks_like_areal"]

_TABLE_CHARS = ["│", "├", "╒", "╘", "╞"]
_TABLE_RULES = ["├", "╞"]
_LITE_HEADER = r"^Epoch (\d+)/(\d+) Step (\d+)/(\d+) Train step (\d+)/(\d+) done\."
_REALHF_HEADER = r"^Epoch (\d+)/(\d+) step (\d+)/(\d+) \(global step (\d+)\) finishes\."
_STATS_ANCHOR = r"^Stats \((\d+)/(\d+)\):|^RPC name \S+ returns(?: \((\d+)/(\d+)\))?"
_TIME_TABLE_ANCHOR = r"Detailed time stats:"
_CHAIN_MARKER = r"^(?:During handling of the above exception|The above exception was the direct cause)"
_TRACEBACK_CONTEXT = r"^(?:\s|During handling of the above exception|The above exception was the direct cause)"


@dataclass(frozen=True)
class AReaLLog:
    """What one AReaL log file holds."""

    path: str
    steps: pl.DataFrame
    metrics: pl.DataFrame
    events: pl.DataFrame
    lines: int
    unparsed_lines: int
    notes: tuple[str, ...] = ()
    facts: dict[str, str] = field(default_factory=dict)


def looks_like_areal(path: Path) -> bool:
    """True when the head of ``path`` has AReaL/realhf logger lines."""
    fmt = load_format("areal")
    head = re.sub(ANSI, "", sniff(path, 256 << 10))
    pattern = re.compile(fmt.line_regex)
    prefixes = [re.compile(p) for p in fmt.prefixes.values()]
    for line in head.splitlines()[:2000]:
        for prefix in prefixes:
            line = prefix.sub("", line, count=1)
        if pattern.match(line):
            return True
    return False


def read_areal_log(path: Path) -> AReaLLog:
    """Parse one AReaL/realhf log file (plain or gzipped) into frames."""
    fmt = load_format("areal")
    prefixes = _prefixes_in(path, fmt)
    parts = collect_lines(path, lambda lines: _extract(lines, fmt, prefixes))
    return _assemble(str(path), parts, fmt)


def _prefixes_in(path: Path, fmt: LogFormat) -> list[str]:
    """The prefix patterns this file uses, judged from its head (so clean files pay nothing)."""
    head = re.sub(ANSI, "", sniff(path, 256 << 10)).splitlines()[:5000]
    used = []
    for regex in fmt.prefixes.values():
        pattern = re.compile(regex)
        if sum(1 for line in head if pattern.match(line)) >= max(1, len(head) // 20):
            used.append(regex)
    return used


def _extract(lines: pl.LazyFrame, fmt: LogFormat, prefixes: list[str]) -> dict[str, pl.LazyFrame]:
    """One pass over the file: keep all lines but blanks and table rules (most of the bytes)."""
    text = pl.col("text")
    for regex in prefixes:
        text = text.str.replace(regex, "")
    kept = (
        lines.with_columns(text.alias("text"))
        .with_columns(pl.col("text").str.head(1).alias("first"))
        .filter((pl.col("text") != "") & ~pl.col("first").is_in(_TABLE_RULES))
    )
    return {"counts": lines.select(pl.col("line").max().alias("last_line")), "kept": kept}


def _split(kept: pl.DataFrame, fmt: LogFormat) -> dict[str, pl.DataFrame]:
    """Kept lines → table cells, table tops, and everything else with logger fields.

    Table rows carry no colour codes (colorlog colours only a message's first line), so only
    the other lines are cleaned of them.
    """
    is_row = pl.col("first") == "│"
    rest = (
        kept.filter(~is_row)
        .with_columns(pl.col("text").str.replace_all(ANSI, "").str.strip_chars_end())
        .with_columns(pl.col("text").str.head(1).alias("first"))
    )
    tops = rest.filter(pl.col("first") == "╒").select("line", pl.col("text").str.count_matches("╤", literal=True).alias("n"))
    width = 2 * ((int(tops["n"].max()) + 2) // 2) if tops.height else 8
    rows = kept.filter(is_row).with_columns(pl.col("text").str.strip_chars_end().str.ends_with("│").alias("complete"))
    split = (
        rows.filter(pl.col("complete"))
        .select("line", pl.col("text").str.split_exact("│", width + 1).alias("s"))
        .unnest("s")
    )
    fields = split.columns[2:]
    cells = pl.concat(
        split.select(
            "line",
            pl.col(key).str.strip_chars().alias("key"),
            pl.col(raw).str.strip_chars().alias("raw"),
        )
        for key, raw in zip(fields[0::2], fields[1::2], strict=False)
    ).filter(pl.col("key").is_not_null() & (pl.col("key") != "") & pl.col("raw").is_not_null())
    other = (
        rest.filter(~pl.col("first").is_in(_TABLE_CHARS) & (pl.col("text") != ""))
        .with_columns(pl.col("text").str.extract_groups(fmt.line_regex).alias("g"))
        .unnest("g")
    )
    return {
        "cells": cells.with_columns(pl.col("raw").cast(pl.Float64, strict=False).alias("value")).sort("line"),
        "broken_rows": rows.filter(~pl.col("complete")).select("line"),
        "tops": tops.select("line"),
        "other": other.select("line", "text", "time", "logger", "level", "message"),
    }


def _assemble(path: str, parts: dict[str, pl.DataFrame], fmt: LogFormat) -> AReaLLog:
    total_lines = int(parts["counts"]["last_line"].max() or 0)
    parts = _split(parts["kept"], fmt)
    other = parts["other"].with_columns(
        pl.col("time").str.strptime(pl.Datetime("ms"), fmt.timestamp_format, strict=False),
        pl.col("message").fill_null(""),
    )
    logged = other.filter(pl.col("time").is_not_null())
    notes: list[str] = []

    headers = _headers(logged)
    steps = conform(headers.with_columns(pl.lit(path).alias("file")), STEP_SCHEMA)
    metrics, orphan_rows = _table_metrics(path, parts, logged, headers)
    if orphan_rows:
        notes.append(f"{orphan_rows} table rows belong to no step header (pasted or cut-off tables)")
    memory = _line_metrics(path, logged, fmt)
    events, traceback_lines = _events(path, other, logged, fmt)

    unparsed_values = parts["cells"].filter(pl.col("value").is_null() & (pl.col("raw") != "")).height
    broken = parts["broken_rows"].height
    if broken:
        notes.append(f"{broken} table rows cut off mid-row were skipped")
    if unparsed_values:
        notes.append(f"{unparsed_values} table values were not numbers")
    unexplained = other.filter(
        pl.col("time").is_null()
        & ~pl.col("line").is_in(traceback_lines.implode())
        & ~pl.col("text").str.contains(_TRACEBACK_CONTEXT)
    ).height
    if steps.is_empty():
        notes.append("no StatsLogger step headers")
    return AReaLLog(
        path=path,
        steps=steps,
        metrics=pl.concat([metrics, memory]),
        events=events,
        lines=total_lines,
        unparsed_lines=unexplained + broken,
        notes=tuple(notes),
        facts=_facts(logged),
    )


def _headers(logged: pl.DataFrame) -> pl.DataFrame:
    """Step header lines: ``step`` in log units (1-based), ``era`` telling tables' direction."""
    lite = logged.filter(pl.col("message").str.contains(_LITE_HEADER)).select(
        "line", "time", pl.col("message").str.extract(_LITE_HEADER, 5).cast(pl.Int64).alias("step"),
        pl.lit("lite").alias("era"),
    )
    realhf = logged.filter(pl.col("message").str.contains(_REALHF_HEADER)).select(
        "line", "time", pl.col("message").str.extract(_REALHF_HEADER, 5).cast(pl.Int64).alias("step"),
        pl.lit("realhf").alias("era"),
    )
    return pl.concat([lite, realhf]).sort("line")


def _table_metrics(
    path: str, parts: dict[str, pl.DataFrame], logged: pl.DataFrame, headers: pl.DataFrame
) -> tuple[pl.DataFrame, int]:
    """Table cells → (step, key, value) rows; the later copy of a repeated step wins."""
    cells = parts["cells"].filter(pl.col("value").is_not_null()).sort("line")
    if cells.is_empty():
        return pl.DataFrame(schema=METRIC_SCHEMA), 0
    tops = parts["tops"].sort("line").with_columns(pl.col("line").alias("top"))
    anchors = (
        logged.filter(pl.col("message").str.contains(_STATS_ANCHOR) | pl.col("message").str.contains(_TIME_TABLE_ANCHOR))
        .select(
            pl.col("line").alias("anchor"),
            pl.col("message").str.contains(_TIME_TABLE_ANCHOR).alias("timing_table"),
        )
        .sort("anchor")
    )
    # A table belongs to the stats anchor just above its top border (a few lines at most).
    tables = tops.join_asof(anchors, left_on="top", right_on="anchor", strategy="backward").filter(
        (pl.col("top") - pl.col("anchor") <= 3) & ~pl.col("timing_table")
    )
    lite = headers.filter(pl.col("era") == "lite").select(pl.col("line").alias("header"), "step", "time")
    realhf = headers.filter(pl.col("era") == "realhf").select(pl.col("line").alias("header"), "step", "time")
    owned = pl.concat(
        [
            tables.join_asof(lite, left_on="anchor", right_on="header", strategy="backward"),
            tables.join_asof(realhf, left_on="anchor", right_on="header", strategy="forward"),
        ]
    ).filter(pl.col("step").is_not_null()).sort("top")
    # The later copy of a re-logged step wins: keep only tables under its newest header.
    owned = owned.with_columns((pl.col("header") == pl.col("header").max().over("step")).alias("latest"))
    placed = cells.join_asof(owned.select("top", "header", "step", "time", "latest"), left_on="line", right_on="top")
    orphans = placed.filter(pl.col("step").is_null()).height
    metrics = placed.filter(pl.col("latest").fill_null(False)).select(
        "step", "time", "key", "value", pl.col("header").alias("line")
    )
    if owned.filter(pl.col("latest")).group_by("header").len()["len"].max() > 1:
        # Several Stats (i/N) tables per step (PPO minibatches): one value per key, their mean.
        metrics = metrics.group_by("step", "key", maintain_order=True).agg(
            pl.col("time").first(), pl.col("value").mean(), pl.col("line").first()
        )
    metrics = metrics.with_columns(pl.lit(path).alias("file"))
    return conform(metrics, METRIC_SCHEMA), orphans


def _line_metrics(path: str, logged: pl.DataFrame, fmt: LogFormat) -> pl.DataFrame:
    """Metrics carried by ordinary log lines (memory), one row per value, step left to alignment."""
    frames = []
    for pattern in fmt.metrics:
        found = logged.filter(pl.col("message").str.contains(pattern.regex)).with_columns(
            pl.col("message").str.extract_groups(pattern.regex).alias("g")
        ).unnest("g")
        for group, key in pattern.keys.items():
            frames.append(
                found.select(
                    "time", "line", pl.lit(key).alias("key"), pl.col(group).cast(pl.Float64, strict=False).alias("value")
                )
            )
    if not frames:
        return pl.DataFrame(schema=METRIC_SCHEMA)
    return conform(pl.concat(frames).with_columns(pl.lit(path).alias("file")), METRIC_SCHEMA)


def _events(
    path: str, other: pl.DataFrame, logged: pl.DataFrame, fmt: LogFormat
) -> tuple[pl.DataFrame, pl.Series]:
    """Logger lines of known kinds, unrecognised errors, and uncaught tracebacks."""
    classified = logged.with_columns(fmt.classify(pl.col("message")).alias("kind"))
    is_error = pl.col("level").is_in(["ERROR", "CRITICAL"])
    named = classified.filter(pl.col("kind").is_not_null() | is_error).with_columns(
        pl.col("kind").fill_null("log_error")
    ).with_columns(fmt.severity_of(pl.col("kind"), pl.col("level")).alias("severity"))

    # A chained traceback is one event; its kind comes from the exception at its very end.
    chain = pl.col("text").str.contains(_CHAIN_MARKER)
    untimed = (
        other.filter(pl.col("time").is_null())
        .select("line", "text")
        .sort("line")
        .with_columns(chain.shift(1, fill_value=False).alias("chained"), chain.shift(-1, fill_value=False).alias("continues"))
    )
    starts = untimed.filter(pl.col("text").str.contains(fmt.traceback_start) & ~pl.col("chained"))
    exceptions = untimed.filter(pl.col("text").str.contains(fmt.traceback_exception) & ~pl.col("continues")).select(
        pl.col("line").alias("exc_line"), pl.col("text").alias("exc_text")
    )
    errors_at = named.filter(is_error).select((pl.col("line") + 1).alias("line"))
    tracebacks = (
        starts.join_asof(exceptions, left_on="line", right_on="exc_line", strategy="forward")
        .join_asof(
            logged.select(pl.col("line").alias("timed_line"), "time").sort("timed_line"),
            left_on="line",
            right_on="timed_line",
            strategy="backward",
        )
        .filter(~pl.col("line").is_in(errors_at["line"].implode()))
        .with_columns(
            fmt.traceback_kind(pl.col("exc_text").fill_null("")).alias("kind"),
            pl.lit("error").alias("severity"),
            pl.coalesce(pl.col("exc_text"), pl.col("text")).alias("message"),
        )
    )
    traceback_lines = pl.concat(
        [untimed.filter(pl.col("text").str.contains(fmt.traceback_start))["line"],
         untimed.filter(pl.col("text").str.contains(fmt.traceback_exception))["line"]]
    )
    events = pl.concat(
        [
            named.select("time", "kind", "severity", "line", pl.col("text").alias("message")),
            tracebacks.select("time", "kind", "severity", "line", "message"),
        ]
    ).with_columns(pl.lit(fmt.source).alias("source"), pl.lit(path).alias("file"))
    return conform(events.sort("line"), EVENT_SCHEMA), traceback_lines


_FACTS = {
    "launch_command": r"Starting local process with command: (.*?\btee -a \S*trainer\.log)",
    "experiment_name": r"experiment_name=([^,\s]+)",
    "trial_name": r"trial_name=([^,\s]+)",
    "fileroot": r"fileroot=([^,\s]+)",
    "server_addrs": r"AREAL_LLM_SERVER_ADDRS=(\S+)",
}


def _facts(logged: pl.DataFrame) -> dict[str, str]:
    """Launcher facts worth knowing later (the command that started the trainer, names)."""
    launcher = logged.filter(pl.col("logger").str.contains("Launcher|Scheduler"))
    facts = {}
    for name, regex in _FACTS.items():
        found = launcher.select(pl.col("message").str.extract(regex, 1)).drop_nulls().to_series()
        if len(found):
            facts[name] = str(found[-1])
    return facts
