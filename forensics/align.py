"""One axis for every source: each step gets the wall-clock time of its header, each timed
record gets the step it fell in (the step in progress when it was written).
"""

from __future__ import annotations

from datetime import datetime

import polars as pl


def step_clock(steps: pl.DataFrame) -> pl.DataFrame:
    """``(time, step)`` of every step header, all copies kept, sorted by time.

    Every copy of a re-logged step is kept: a record written during the first attempt of a
    step belongs to that attempt's step, even though the metrics come from the later copy.
    """
    return steps.filter(pl.col("time").is_not_null()).select("time", "step").sort("time")


def assign_steps(frame: pl.DataFrame, clock: pl.DataFrame) -> pl.DataFrame:
    """Fill ``frame``'s null ``step`` from its ``time``: the first step whose header is at or
    after that time; after the last header, the step that never finished (last + 1).
    """
    if frame.is_empty() or clock.is_empty():
        return frame
    headers = clock["time"]
    # The step of index len(clock): a time after the last header.
    after = min(int(clock["step"].max()) + 1, 2**63 - 1)  # a damaged source's step can be Int64's last
    steps = pl.concat([clock["step"], pl.Series([after], dtype=clock["step"].dtype)])
    pieces, start = [], 0
    # Chunk by chunk, each like the frame's other columns: a column chunked unlike the rest makes
    # Polars copy the whole (large) frame at its next ``select``. Chunks with every step are kept.
    for chunk in frame["step"].get_chunks():
        if chunk.null_count():
            times = frame["time"].slice(start, chunk.len())
            placed = steps.gather(headers.search_sorted(times, "left"))
            chunk = chunk.zip_with(chunk.is_not_null() | times.is_null(), placed)
        pieces.append(chunk)
        start += chunk.len()
    return frame.with_columns(pl.concat(pieces, rechunk=False))


def step_durations(steps: pl.DataFrame) -> pl.DataFrame:
    """``(step, seconds)``: wall-clock time from the previous step's header to this one's."""
    return (
        steps.filter(pl.col("time").is_not_null())
        .sort("step")
        .select(
            "step",
            (pl.col("time").diff().dt.total_milliseconds() / 1000.0).alias("seconds"),
        )
        .filter(pl.col("seconds").is_not_null() & (pl.col("seconds") >= 0))
    )


def reconstruct_times(steps: pl.DataFrame, metrics: pl.DataFrame, start: datetime) -> pl.DataFrame:
    """Times for a step log that prints none (verl's console): ``start`` plus the summed
    per-step durations the log does print (``timing_s/step``). Unchanged without them."""
    durations = (
        metrics.filter((pl.col("key") == "timing_s/step") & pl.col("step").is_not_null())
        .group_by("step")
        .agg(pl.col("value").last())
        .sort("step")
        .select("step", (pl.col("value").cum_sum() * 1000).cast(pl.Int64).alias("elapsed_ms"))
    )
    if durations.is_empty():
        return steps
    return (
        steps.drop("time")
        .join(durations, on="step", how="left")
        .with_columns((pl.lit(start) + pl.duration(milliseconds=pl.col("elapsed_ms"))).cast(pl.Datetime("ms")).alias("time"))
        .drop("elapsed_ms")
        .select(steps.columns)
    )
