"""Server stats at the resolution the analysis reads: per minute, the last value and the peak.

An SGLang server at info level logs a stats sample every few seconds for days: millions of
values that nobody reads one by one, and that would make every later step of the analysis (merge,
step assignment, the report) pay for them. Per minute and key, the last value keeps the time the
stats stopped exact, and the peak keeps what the memory and load evidence cite; every row kept
still points at its own line. Counts of the lines behind samples (``…_lines``) add up.
"""

from __future__ import annotations

import polars as pl

__all__ = ["last_and_peak_per_minute"]


def last_and_peak_per_minute(values: pl.DataFrame, *, counts_suffix: str = "_lines") -> pl.DataFrame:
    """``values`` (metric rows in line order) reduced per minute and key; rows without a time kept.

    The result has ``values``' columns, in line order.
    """
    timed = values.filter(pl.col("time").is_not_null())
    if timed.is_empty():
        return values
    counted = pl.col("key").str.ends_with(counts_suffix)
    peak_at = pl.col("value").arg_max()
    reduced = (
        timed.lazy()
        .with_columns(pl.col("time").dt.truncate("1m").alias("__minute"))
        .group_by("__minute", "key", maintain_order=True)
        .agg(
            pl.all().exclude("value").last(),
            pl.when(counted.first()).then(pl.col("value").sum()).otherwise(pl.col("value").last()).alias("value"),
            pl.col("line").get(peak_at).alias("__peak_line"),
            pl.col("time").get(peak_at).alias("__peak_time"),
            pl.col("value").max().alias("__peak"),
            counted.first().alias("__counted"),
        )
        .collect()
    )
    peaks = reduced.filter(~pl.col("__counted") & (pl.col("__peak_line") != pl.col("line"))).with_columns(
        pl.col("__peak_line").alias("line"), pl.col("__peak_time").alias("time"), pl.col("__peak").alias("value")
    )
    untimed = values.filter(pl.col("time").is_null())
    return pl.concat([reduced.select(values.columns), peaks.select(values.columns), untimed]).sort("line", maintain_order=True)
