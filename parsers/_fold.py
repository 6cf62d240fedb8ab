"""Stats values folded per minute: the last value and the peak of each key.

An SGLang server at info level logs a stats sample every few seconds for days: millions of
values that nobody reads one by one, and that every later step (merge, step assignment, the
report) would pay for. Per minute and key, the last value keeps the time the stats stopped exact,
and the peak keeps what memory and load evidence cite; every row kept still points at its own
line. Counts of the lines behind samples (``…_lines``) add up.
"""

from __future__ import annotations

import polars as pl

__all__ = ["last_and_peak_per_minute"]


def last_and_peak_per_minute(values: pl.DataFrame, *, counts_suffix: str = "_lines") -> pl.DataFrame:
    """``values`` (metric rows in line order) reduced per minute and key; rows without a time kept.

    The result has ``values``' columns, in line order.
    """
    if values["time"].null_count() == values.height:
        return values
    rows = values.with_row_index("__row")
    picked = (
        rows.lazy()
        .filter(pl.col("time").is_not_null())
        .group_by(pl.col("time").cast(pl.Int64) // 60_000, "key")
        .agg(
            pl.col("__row").last().alias("last"),
            pl.col("__row").sort_by("value", "__row").last().alias("peak"),  # ties: the latest row, every time
            pl.col("value").sum().alias("total"),
        )
        .with_columns(pl.col("key").cast(pl.String).str.ends_with(counts_suffix).alias("counted"))
        .collect()
    )
    last = picked.select(pl.col("last").alias("__row"), pl.when("counted").then(pl.col("total")).alias("__total"))
    peaks = picked.filter(~pl.col("counted") & (pl.col("peak") != pl.col("last"))).select(pl.col("peak").alias("__row"))
    untimed = rows.filter(pl.col("time").is_null()).select("__row")
    kept = pl.concat([last, peaks, untimed], how="diagonal").sort("__row")
    reduced = rows[kept["__row"]].with_columns(kept["__total"])
    return reduced.with_columns(pl.col("__total").fill_null(pl.col("value")).alias("value")).drop("__row", "__total")
