"""A run's frames, gathered from all of its sources and put on one step/time axis."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from forensics.align import assign_steps, step_clock
from forensics.discover import RunLocation
from forensics.fingerprint import fingerprint
from forensics.model import SourceReport
from parsers import read_areal_log, read_sglang_log
from parsers.areal_checkpoints import read_areal_checkpoints
from parsers.areal_config import read_areal_config
from parsers.schema import CHECKPOINT_SCHEMA, EVENT_SCHEMA, METRIC_SCHEMA, STEP_SCHEMA, conform, empty


@dataclass
class RunData:
    """Everything parsed for one run, before any judgement."""

    location: RunLocation
    steps: pl.DataFrame
    metrics: pl.DataFrame
    events: pl.DataFrame
    checkpoints: pl.DataFrame
    sources: list[SourceReport]
    facts: dict[str, str] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    """The run's dumped ``config.yaml``, flattened, when it is next to the logs."""


def load_run(location: RunLocation) -> RunData:
    """Parse every source of ``location``; a file that cannot be read becomes a note, not an error."""
    steps, metrics, events, sources = [], [], [], []
    facts: dict[str, str] = {}
    for rank, source in enumerate(location.logs):
        try:
            parsed = [_read(reader, source.path) for reader in _READERS[source.kind]]
        except (OSError, pl.exceptions.PolarsError) as exc:
            sources.append(SourceReport(str(source.path), source.kind, 0, 0, (f"not read: {exc}",)))
            continue
        identity = fingerprint(source.path)
        sources.append(
            SourceReport(
                str(source.path),
                source.kind,
                max(p.lines for p in parsed),
                # Each parser counts the other's lines as its own failures; a line neither
                # understood is unparsed by both, so the smaller count is the true one.
                min(p.unparsed_lines for p in parsed),
                tuple(note for p in parsed for note in p.notes),
                bytes=identity.size if identity else None,
                digest=identity.digest if identity else None,
                digest_method=identity.method if identity else None,
            )
        )
        for p in parsed:
            steps.append(p.steps.with_columns(pl.lit(rank).alias("rank")))
            metrics.append(p.metrics.with_columns(pl.lit(rank).alias("rank")))
            facts.update(p.facts)
        events.append(pl.concat([p.events for p in reversed(parsed)]).unique(["file", "line"], keep="first"))
    for problem in location.skipped:
        sources.append(SourceReport(problem.split(": ")[0], "unreadable", 0, 0, (problem,)))

    all_steps = pl.concat(steps) if steps else empty(STEP_SCHEMA).with_columns(pl.lit(0).alias("rank"))
    clock = step_clock(all_steps)
    metrics_frame = _latest_copy(pl.concat(metrics)) if metrics else empty(METRIC_SCHEMA)
    events_frame = pl.concat(events) if events else empty(EVENT_SCHEMA)
    checkpoints = read_areal_checkpoints(location.checkpoint_dir) if location.checkpoint_dir else empty(CHECKPOINT_SCHEMA)
    return RunData(
        location=location,
        steps=_latest_steps(all_steps),
        metrics=assign_steps(metrics_frame, clock),
        events=assign_steps(events_frame, clock).sort("time", "file", "line", nulls_last=True),
        checkpoints=checkpoints,
        sources=sources,
        facts=facts,
        config=read_areal_config(location.root / "config.yaml"),
    )


@dataclass(frozen=True)
class _Parsed:
    """What any log parser yields, in the shape the run loader merges."""

    steps: pl.DataFrame
    metrics: pl.DataFrame
    events: pl.DataFrame
    lines: int
    unparsed_lines: int
    notes: tuple[str, ...]
    facts: dict[str, str]


def _read(reader: str, path: Path) -> _Parsed:
    if reader == "areal":
        log = read_areal_log(path)
        return _Parsed(log.steps, log.metrics.with_columns(pl.lit("areal").alias("source")), log.events,
                       log.lines, log.unparsed_lines, log.notes, log.facts)
    server = read_sglang_log(path)
    http = server.http.select(
        pl.col("minute").alias("time"),
        pl.format("sglang/http/{}/{}", pl.col("endpoint").str.strip_prefix("/"), pl.col("status")).alias("key"),
        pl.col("count").cast(pl.Float64).alias("value"),
        pl.lit(str(path)).alias("file"),
        pl.col("first_line").alias("line"),
    )
    metrics = pl.concat([server.metrics, conform(http, METRIC_SCHEMA)]).with_columns(pl.lit("sglang").alias("source"))
    notes = server.notes
    if server.servers.height > 1:
        notes += (f"{server.servers.height} server instances in this log (launches or restarts)",)
    return _Parsed(empty(STEP_SCHEMA), metrics, server.events, server.lines, server.unparsed_lines, notes, {})


#: Which parsers read each kind of log. ``llm_server.log`` interleaves AReaL's wrapper lines
#: with SGLang's own output, so both read it.
_READERS: dict[str, tuple[str, ...]] = {
    "areal_trainer": ("areal",),
    "areal_log": ("areal",),
    "areal_server": ("areal", "sglang"),
    "sglang_server": ("sglang",),
}


def _latest_steps(steps: pl.DataFrame) -> pl.DataFrame:
    """One row per step: its latest copy (a relaunch re-logs steps after the recovered one)."""
    return (
        steps.sort("rank", "line")
        .unique("step", keep="last", maintain_order=True)
        .sort("step")
        .select(list(STEP_SCHEMA))
    )


def _latest_copy(metrics: pl.DataFrame) -> pl.DataFrame:
    """Table values from the newest file win for a step; line metrics (memory) are all kept."""
    tables = metrics.filter(pl.col("step").is_not_null())
    newest = tables.group_by("step").agg(pl.col("rank").max().alias("newest"))
    tables = tables.join(newest, on="step").filter(pl.col("rank") == pl.col("newest"))
    lines = metrics.filter(pl.col("step").is_null())
    return pl.concat([tables.select(list(METRIC_SCHEMA)), lines.select(list(METRIC_SCHEMA))]).sort(
        "step", "time", nulls_last=True
    )
