"""A run's frames, gathered from all of its sources and put on one step/time axis."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from forensics.align import assign_steps, step_clock
from forensics.discover import RunLocation
from forensics.fingerprint import fingerprint
from forensics.model import SourceReport
from parsers import read_areal_log
from parsers.areal_config import read_areal_config
from parsers.areal_checkpoints import read_areal_checkpoints
from parsers.schema import CHECKPOINT_SCHEMA, EVENT_SCHEMA, METRIC_SCHEMA, STEP_SCHEMA, empty


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
            log = read_areal_log(source.path)
        except (OSError, pl.exceptions.PolarsError) as exc:
            sources.append(SourceReport(str(source.path), source.kind, 0, 0, (f"not read: {exc}",)))
            continue
        identity = fingerprint(source.path)
        sources.append(
            SourceReport(
                log.path, source.kind, log.lines, log.unparsed_lines, log.notes,
                bytes=identity.size if identity else None,
                digest=identity.digest if identity else None,
                digest_method=identity.method if identity else None,
            )
        )
        steps.append(log.steps.with_columns(pl.lit(rank).alias("rank")))
        metrics.append(log.metrics.with_columns(pl.lit(rank).alias("rank")))
        events.append(log.events)
        facts.update(log.facts)
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
