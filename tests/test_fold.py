"""Server stats per minute (parsers._fold), and the order check that spares the run loader a sort."""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from forensics.run import _in_step_time_order
from parsers import read_sglang_log
from parsers._fold import last_and_peak_per_minute

FIXTURES = Path(__file__).parent / "fixtures"
T0 = datetime(2025, 11, 20, 16, 0, 0)


def _values(rows: list[tuple[int, int, str, float]]) -> pl.DataFrame:
    """(line, seconds after T0, key, value) → metric rows as the SGLang reader leaves them."""
    return pl.DataFrame(
        [(line, T0 + timedelta(seconds=s), key, value, "llm_server.log") for line, s, key, value in rows],
        schema={"line": pl.Int64, "time": pl.Datetime("ms"), "key": pl.String, "value": pl.Float64, "file": pl.String},
        orient="row",
    )


def test_each_minute_keeps_its_last_value_and_its_peak_with_their_lines() -> None:
    values = _values([
        (1, 0, "sglang/token_usage", 0.2),
        (2, 0, "sglang/decode_lines", 40.0),
        (3, 10, "sglang/token_usage", 0.9),  # the minute's peak
        (4, 10, "sglang/decode_lines", 40.0),
        (5, 50, "sglang/token_usage", 0.4),  # the minute's last value
        (6, 50, "sglang/decode_lines", 40.0),
        (7, 61, "sglang/token_usage", 0.5),  # alone in the next minute
    ])
    got = last_and_peak_per_minute(values)
    assert got.columns == values.columns
    assert got.select("line", "key", "value").rows() == [
        (3, "sglang/token_usage", 0.9),
        (5, "sglang/token_usage", 0.4),
        (6, "sglang/decode_lines", 120.0),  # lines behind the samples add up, on the last row
        (7, "sglang/token_usage", 0.5),
    ]
    assert got.filter(pl.col("line") == 3)["time"].item() == T0 + timedelta(seconds=10)


def test_values_without_a_time_are_kept_and_nothing_is_lost_when_there_is_nothing_to_fold() -> None:
    values = _values([(1, 0, "sglang/token_usage", 0.1), (2, 60, "sglang/token_usage", 0.2)])
    untimed = values.with_columns(pl.lit(None, pl.Datetime("ms")).alias("time"))
    assert last_and_peak_per_minute(values).equals(values)
    assert last_and_peak_per_minute(untimed).equals(untimed)
    assert last_and_peak_per_minute(values.clear()).is_empty()


def test_a_real_server_log_keeps_its_peaks_counts_and_last_sample() -> None:
    """The OOM fixture: what the analysis reads of the server is the same after the fold."""
    server = read_sglang_log(next((FIXTURES / "sglang_oom").rglob("llm_server.log*")))
    stats = server.metrics.filter(pl.col("time").is_not_null())
    folded = last_and_peak_per_minute(server.metrics)
    assert folded.height < server.metrics.height
    assert _by_key(folded).equals(_by_key(stats))
    # Each kept row is a row of the log, unchanged (the counts aside).
    kept = folded.filter(~pl.col("key").cast(pl.String).str.ends_with("_lines")).join(server.metrics, on=["line", "key"], how="anti")
    assert kept.is_empty()


@pytest.mark.parametrize("fixture", ["sglang_oom", "sglang_hang", "sglang_healthy_collapse"])
def test_the_server_reader_folds_batch_by_batch_to_the_same_peaks_and_last_samples(fixture: str) -> None:
    path = next((FIXTURES / fixture).rglob("llm_server.log*"))
    every, folded = read_sglang_log(path), read_sglang_log(path, stats_per_minute=True)
    stats = lambda log: log.metrics.filter(pl.col("key").cast(pl.String).str.starts_with("sglang/") & pl.col("time").is_not_null())  # noqa: E731
    assert folded.metrics.height < every.metrics.height
    assert _by_key(stats(folded)).equals(_by_key(stats(every)))
    for frame in ("events", "http", "servers"):
        assert getattr(folded, frame).equals(getattr(every, frame)), frame
    assert any("kept as" in note and "per minute" in note for note in folded.notes)


def _by_key(frame: pl.DataFrame) -> pl.DataFrame:
    counted = pl.col("key").cast(pl.String).str.ends_with("_lines")
    return frame.group_by("key").agg(
        pl.col("value").filter(~counted).max().alias("peak"),
        pl.col("value").filter(counted).sum().alias("lines"),
        pl.col("time").max().alias("last_time"),
        pl.col("line").max().alias("last_line"),
    ).sort("key")


def test_step_time_order_is_told_exactly() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        rows = [
            (rng.choice([None, 1, 2, 3]), rng.choice([None, T0 + timedelta(seconds=rng.randint(0, 3))]))
            for _ in range(rng.randint(0, 6))
        ]
        frame = pl.DataFrame(rows, schema={"step": pl.Int64, "time": pl.Datetime("ms")}, orient="row")
        ordered = frame.equals(frame.sort("step", "time", nulls_last=True))
        # Checked a few rows at a time too: a disorder across two slices' seam is still seen.
        assert _in_step_time_order(frame) == ordered == _in_step_time_order(frame, rng.randint(1, 3)), rows
