"""A run's problem events on its step axis, few enough to draw.

A flood is millions of events; a picture holds a few hundred marks. Above ``limit``, the events of
one kind in one span of steps are one marker (how many, the worst severity, the first one's place
and text), the spans widened until the markers fit. Only the markers' texts are read back from
their lines (a flood's are not held: see :mod:`forensics.texts`).
"""

from __future__ import annotations

import polars as pl

from forensics.align import assign_steps, step_clock
from forensics.texts import with_messages

#: The severities drawn, mildest first.
PROBLEM_SEVERITIES = ("warning", "error", "fatal")

_COLUMNS = ("kind", "severity", "step", "last", "n", "time", "file", "line", "message")


def event_markers(events: pl.DataFrame, steps: pl.DataFrame, limit: int) -> pl.DataFrame:
    """At most ``limit`` markers of ``events``' warnings, errors and fatal ones that fall on a step
    of ``steps``: ``kind``, ``severity`` (the worst), ``step`` to ``last`` (the span), ``n`` (the
    events), and the first event's ``time``, ``file``, ``line`` and ``message``; in step order."""
    rank = {s: i for i, s in enumerate(PROBLEM_SEVERITIES)}
    problems = events.filter(pl.col("severity").is_in(PROBLEM_SEVERITIES))
    placed = (
        assign_steps(problems, step_clock(steps))
        .filter(pl.col("step").is_not_null())
        .with_columns(pl.col("severity").cast(pl.String).replace_strict(rank, return_dtype=pl.Int8).alias("rank"))
        .sort("step", "time", "line", nulls_last=True)
    )
    if placed.height <= limit:
        return _named(with_messages(placed.with_columns(pl.lit(1, pl.UInt32).alias("n"), pl.col("step").alias("last"))))
    width = 1
    while True:
        grouped = (
            placed.with_columns((pl.col("step") // width).alias("bucket"))
            .group_by("kind", "bucket", maintain_order=True)
            .agg(
                pl.len().alias("n"), pl.col("step").first(), pl.col("step").max().alias("last"),
                pl.col("rank").max(), pl.col("time").first(), pl.col("file").first(),
                pl.col("line").first(), pl.col("message").first(),
            )
        )
        if grouped.height <= limit:
            return _named(with_messages(grouped))
        width *= 2


def _named(markers: pl.DataFrame) -> pl.DataFrame:
    severity = pl.col("rank").replace_strict(dict(enumerate(PROBLEM_SEVERITIES)), return_dtype=pl.String)
    return markers.with_columns(severity.alias("severity")).select(_COLUMNS)
