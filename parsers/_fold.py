"""Stats values folded per minute: the last value and the peak of each key.

An SGLang server at info level logs a stats sample every few seconds for days: millions of
values that nobody reads one by one, and that every later step (merge, step assignment, the
report) would pay for. Per minute and key, the last value keeps the time the stats stopped exact,
and the peak keeps what memory and load evidence cite; every row kept still points at its own
line. Counts of the lines behind samples (``…_lines``) add up.
"""

from __future__ import annotations

import polars as pl

__all__ = ["folded_across", "last_and_peak_per_minute"]


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


def folded_across(batches: list[pl.DataFrame], *, counts_suffix: str = "_lines") -> list[pl.DataFrame]:
    """``batches`` (each folded on its own, in line order, in file order) with the minutes two or more
    of them share folded again as one: the result does not depend on where batches were cut. A fold
    of folds is the fold: the last of the lasts, the peak of the peaks and lasts (ties: the latest
    row), the counts summed. Each batch keeps its own rows, in line order."""
    if len(batches) < 2:
        return batches
    minute = pl.col("time").cast(pl.Int64) // 60_000
    seen = pl.concat([b.lazy().select(minute.alias("minute")).drop_nulls().unique() for b in batches])
    shared = seen.group_by("minute").len().filter(pl.col("len") > 1).collect()["minute"]
    if shared.is_empty():
        return batches
    at_edge = minute.is_in(shared.implode()).fill_null(False)
    edges = [b.filter(at_edge) for b in batches]
    owner = pl.concat([pl.Series([i] * e.height, dtype=pl.UInt32) for i, e in enumerate(edges)])
    refolded = last_and_peak_per_minute(pl.concat(edges).with_columns(owner.alias("__batch")), counts_suffix=counts_suffix)
    out = []
    for i, batch in enumerate(batches):
        mine = refolded.filter(pl.col("__batch") == i).drop("__batch")
        rest = batch.filter(~at_edge)
        out.append(pl.concat([rest, mine]).sort("line", maintain_order=True) if mine.height else rest)
    return out
