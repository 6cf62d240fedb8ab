"""A run's problem events as markers on its steps: one each when few, grouped by kind and span when many."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

import polars as pl

from forensics.markers import event_markers
from parsers.schema import EVENT_SCHEMA, STEP_SCHEMA, conform

START = datetime(2025, 11, 10, 9)


def _steps(n: int) -> pl.DataFrame:
    return conform(pl.DataFrame({"step": range(1, n + 1), "time": [START + timedelta(minutes=s) for s in range(1, n + 1)],
                                 "file": "trainer.log", "line": [100 * s for s in range(1, n + 1)]}), STEP_SCHEMA)


def _events(rows: list[tuple[int, str, str]]) -> pl.DataFrame:
    """(second after the start, kind, severity) each, a line each, undated steps placed by their time."""
    rows = sorted(rows)
    return conform(pl.DataFrame({
        "time": [START + timedelta(seconds=s) for s, _, _ in rows],
        "step": [None] * len(rows),
        "source": "areal",
        "kind": [k for _, k, _ in rows],
        "severity": [v for _, _, v in rows],
        "file": "trainer.log",
        "line": range(1, len(rows) + 1),
        "message": [f"{k} at {s}" for s, k, _ in rows],
    }), EVENT_SCHEMA)


def test_few_events_are_a_marker_each_on_the_step_in_progress() -> None:
    events = _events([(90, "request_timeout", "warning"), (150, "oom", "fatal"), (170, "server_log_info", "info")])
    markers = event_markers(events, _steps(5), limit=10)
    assert markers.select("kind", "severity", "step", "last", "n", "line", "message").rows() == [
        ("request_timeout", "warning", 2, 2, 1, 1, "request_timeout at 90"),  # (step 2 was in progress: its header at 120 s)
        ("oom", "fatal", 3, 3, 1, 2, "oom at 150"),
    ]


def test_many_events_are_grouped_by_kind_and_span_until_they_fit() -> None:
    rng = random.Random(7)
    rows = [(rng.randrange(60, 6_000), "request_timeout", "warning") for _ in range(3_000)]
    rows += [(rng.randrange(60, 6_000), "connection_refused", "error") for _ in range(500)] + [(3_000, "request_timeout", "fatal")]
    events, steps = _events(rows), _steps(100)
    markers = event_markers(events, steps, limit=40)
    placed = markers["n"].sum()
    assert 0 < markers.height <= 40 and placed == len(rows)
    for kind, severity, first, last, n, line in markers.select("kind", "severity", "step", "last", "n", "line").iter_rows():
        from_events = (events.with_row_index("i").filter(pl.col("line") == line)
                       .join_asof(steps.select("time", "step").sort("time"), on="time", strategy="forward"))
        assert from_events["kind"].cast(pl.String).item() == kind and from_events["step_right"].item() == first
        assert first <= last and n >= 1 and severity in ("warning", "error", "fatal")
    # The one fatal timeout makes its group's marker fatal; the other timeout groups stay warnings.
    assert markers.filter(pl.col("kind") == "request_timeout")["severity"].value_counts().sort("severity").rows() == [
        ("fatal", 1), ("warning", markers.filter(pl.col("kind") == "request_timeout").height - 1)]
