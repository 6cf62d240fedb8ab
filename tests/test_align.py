"""One step axis: records placed in the step they fell in, without copying a long run's frame."""

from __future__ import annotations

import bisect
import random
from datetime import datetime, timedelta
from pathlib import Path

import polars as pl

from forensics.align import assign_steps, exit_skew, reconstruct_times, server_zone
from forensics.discover import find_runs
from forensics.run import load_run
from parsers.schema import METRIC_SCHEMA, STEP_SCHEMA, cut_alike

FIXTURES = Path(__file__).parent / "fixtures"
T0 = datetime(2025, 11, 20, 16, 0, 0)


def _placed(step: int | None, time: datetime | None, clock: list[tuple[datetime, int]]) -> int | None:
    """The step a record belongs to, row by row: its own, else the first header at or after it."""
    if step is not None or time is None:
        return step
    at = bisect.bisect_left([t for t, _ in clock], time)
    return clock[at][1] if at < len(clock) else max(s for _, s in clock) + 1


def _cut(frame: pl.DataFrame) -> list[list[int]]:
    return [column.chunk_lengths() for column in frame.get_columns()]


def test_step_less_records_take_the_step_in_progress_chunk_by_chunk() -> None:
    rng = random.Random(7)
    for _ in range(500):
        # Header times may repeat (two copies of a step): the first one at or after a record wins.
        clock = sorted((T0 + timedelta(seconds=rng.randint(0, 20)), rng.randint(1, 9)) for _ in range(rng.randint(1, 6)))
        pieces = []
        for _ in range(rng.randint(1, 4)):
            rows = [
                (rng.choice([None, None, rng.randint(1, 9)]), rng.choice([None, T0 + timedelta(seconds=rng.randint(-3, 25))]), float(i))
                for i in range(rng.randint(0, 6))
            ]
            pieces.append(pl.DataFrame(rows, schema={"step": pl.Int64, "time": pl.Datetime("ms"), "value": pl.Float64}, orient="row"))
        frame = pl.concat(pieces, rechunk=False)
        given = frame.clone()
        got = assign_steps(frame, pl.DataFrame(clock, schema={"time": pl.Datetime("ms"), "step": pl.Int64}, orient="row"))
        assert got["step"].to_list() == [_placed(s, t, clock) for s, t in zip(frame["step"], frame["time"])]
        assert got.drop("step").equals(frame.drop("step")) and frame.equals(given)
        # The filled column is cut like the others: Polars would copy the whole frame otherwise.
        assert len(set(map(tuple, _cut(got)))) == 1 or len(set(map(tuple, _cut(frame)))) > 1


def test_columns_cut_differently_are_recut_alike_without_changing_a_value() -> None:
    a = pl.DataFrame({"x": [1, 2, 3], "y": ["a", "b", "c"]}).with_columns(pl.lit("one").alias("file"))
    b = pl.DataFrame({"x": [4, 5], "y": ["d", "e"]}).with_columns(pl.lit("two").alias("file"))
    frame = pl.concat([a, pl.concat([b, b], rechunk=False)], rechunk=False)
    assert len(set(map(tuple, _cut(frame)))) > 1  # `file`: one chunk per constant
    alike = cut_alike(frame)
    assert alike.equals(frame) and alike.schema == frame.schema
    assert len(set(map(tuple, _cut(alike)))) == 1
    assert cut_alike(alike) is alike


def test_a_run_with_a_trainer_and_a_server_log_has_its_metric_columns_cut_alike() -> None:
    [location] = find_runs([FIXTURES / "sglang_hang" / "outputs"])
    run = load_run(location)
    assert {"areal", "sglang"} <= set(run.metrics["source"].cast(pl.String).unique())
    assert len(set(map(tuple, _cut(run.metrics)))) == 1


def test_times_rebuilt_attempt_by_attempt_from_each_ray_session() -> None:
    """A console without times: each copy at its session's start plus the durations summed so far,
    an attempt (a copy going back) from its own session when there is one for each; no steps, no error."""
    steps = pl.DataFrame({"step": [1, 2, 3, 2, 3], "time": [None] * 5, "file": ["t.log"] * 5, "line": [1, 2, 3, 4, 5], "rank": [0] * 5},
                         schema={**STEP_SCHEMA, "rank": pl.Int32})
    metrics = pl.DataFrame({"step": [1, 2, 3, 2, 3], "time": [None] * 5, "key": ["timing_s/step"] * 5, "value": [10.0, 20.0, 30.0, 1.0, 2.0],
                            "file": ["t.log"] * 5, "line": [1, 2, 3, 4, 5], "source": ["verl"] * 5}, schema=METRIC_SCHEMA)
    later = T0 + timedelta(hours=5)
    seconds = lambda frame: [(t - T0).total_seconds() for t in frame["time"]]  # noqa: E731
    assert seconds(reconstruct_times(steps, metrics, [later, T0])) == [10, 30, 60, 5 * 3600 + 1, 5 * 3600 + 3]
    assert seconds(reconstruct_times(steps, metrics, [T0])) == [10, 30, 60, 61, 63]  # one session: one clock
    assert reconstruct_times(steps.clear(), metrics, [T0]).is_empty()


def _minutes(times: range, hours: float = 0.0) -> pl.Series:
    return pl.Series("time", [T0 + timedelta(minutes=m, hours=hours) for m in times])


def test_a_server_log_a_time_zone_away_is_put_on_the_run_clock_only_when_one_offset_does() -> None:
    """Steps for 3 h; the server's own lines 8 h behind for its first 100 minutes. With AReaL's
    wrapper lines around them in the file (launched before, exited after), one offset keeps the
    file in order: 8 h. Without them, any of several quarter hours would fit: none is taken, and
    the log is said to be off the clock. A server on the run's clock, or idling on after it, is neither."""
    steps = _minutes(range(0, 180))
    own = pl.DataFrame({"line": range(2, 102), "time": _minutes(range(0, 100), hours=-8)})
    wrapper = pl.DataFrame({"line": [1, 102], "time": [T0 - timedelta(seconds=30), T0 + timedelta(minutes=99, seconds=20)]})
    assert server_zone(steps, own, wrapper) == (timedelta(hours=8), True)
    assert server_zone(steps, own, wrapper.clear()) == (None, True)
    assert server_zone(steps, own.with_columns(pl.col("time") + timedelta(hours=8)), wrapper) == (None, False)
    idle = pl.DataFrame({"line": range(2, 362), "time": _minutes(range(0, 360))})  # 3 h on past the last step
    assert server_zone(steps, idle, wrapper.clear()) == (None, False)



def test_a_server_log_at_warning_level_is_moved_by_the_offset_that_puts_its_crash_just_before_its_exit() -> None:
    """Steps for 3 h; at warning level the server (8 h behind) logged only its last 10 minutes:
    retractions, then the sigquit of its crash. Its wrapper launched it before the first step and
    logged the exit 2 s after the sigquit. Every quarter hour from 8 h back to the launch keeps the
    file in order, but only 8 h puts the crash just before the exit. Where the line above the
    exit is no crash (a server stopped at the end of the run), nothing tells which."""
    steps = _minutes(range(0, 180))
    kinds = ["kv_cache_retract"] * 10 + ["child_crash"]
    own = pl.DataFrame({"line": range(3, 14), "time": _minutes(range(170, 181), hours=-8), "kind": kinds})
    wrapper = pl.DataFrame({"line": [1, 2, 14], "kind": ["server_launch", "server_ready", "server_exit"],
                            "time": [T0 - timedelta(minutes=5), T0 - timedelta(minutes=4), T0 + timedelta(minutes=180, seconds=2)]})
    assert server_zone(steps, own, wrapper) == (timedelta(hours=8), True)
    assert server_zone(steps, own.drop("kind"), wrapper) == (None, True)
    stopped = own.with_columns(pl.lit("kv_cache_retract").alias("kind"))
    assert server_zone(steps, stopped, wrapper) == (None, True)


def test_a_server_log_a_zone_away_that_spans_the_run_is_moved_by_the_offset_lining_up_its_ends() -> None:
    """No wrapper lines (a plain SGLang log from a UTC container): a server launched 4 minutes
    before the first step and busy to the last, 8 h behind. Offsets a quarter hour or more beside
    8 h still put nine lines in ten among the steps; only 8 h lines the log's ends up with the
    run's. A log reaching past both ends of the run lines up no better one way than another: none."""
    steps = _minutes(range(0, 340))
    spans = pl.DataFrame({"line": range(1, 346), "time": _minutes(range(-4, 341), hours=-8)})
    assert server_zone(steps, spans, spans.clear()) == (timedelta(hours=8), True)
    wider = pl.DataFrame({"line": range(1, 371), "time": _minutes(range(-15, 355), hours=-8)})
    assert server_zone(steps, wider, wider.clear()) == (None, True)


def test_a_server_hosts_clock_minutes_off_is_the_gap_between_its_exit_and_the_first_call_it_dropped() -> None:
    """A server dies with calls in flight: the trainer finds one dropped mid-request, then the next
    refused. Seconds after the exit as written, the log is on the clock; minutes after, its host's
    clock is off by the gap. A drop no refusal follows (a network blip), or one inside a burst of
    refusals (a server already down), is not the moment it died; an hour is no skew."""
    exited = T0 + timedelta(minutes=60)

    def skew(drop_after: timedelta, *, refused_after: list[timedelta] | None = None) -> timedelta | None:
        drops = pl.Series([exited + drop_after])
        refusals = [exited + drop_after + timedelta(seconds=1)] if refused_after is None else [exited + d for d in refused_after]
        return exit_skew(exited, drops, pl.Series(refusals, dtype=pl.Datetime("us")))

    assert skew(timedelta(seconds=3)) is None
    assert skew(timedelta(minutes=3, seconds=2)) == timedelta(minutes=3, seconds=2)
    assert skew(-timedelta(minutes=3)) == -timedelta(minutes=3)
    assert skew(timedelta(minutes=3), refused_after=[]) is None
    assert skew(timedelta(minutes=3), refused_after=[timedelta(minutes=5)]) is None
    assert skew(timedelta(minutes=3), refused_after=[timedelta(minutes=2), timedelta(minutes=3, seconds=1)]) is None
    assert skew(timedelta(hours=1)) is None
