"""One axis for every source: each step gets the wall-clock time of its header, each timed
record gets the step it fell in (the step in progress when it was written).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

import polars as pl

from parsers.areal import DATED_ABOVE
from parsers.schema import relaunches


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


def past_their_headers(events: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """``events`` (steps assigned by time) with those of lines that have no time of their own,
    dated by the line above them, at one of their log's step headers' very time but on a later
    line in the next step: printed after that step ended (a bare ``Killed`` after a run's last step
    and its table), where by time alone they fell in it."""
    headers = steps.filter(pl.col("time").is_not_null()).select(
        "time", pl.col("file").alias("header_file"), pl.col("line").alias("header"), pl.col("step").alias("header_step"))
    if headers.is_empty() or events.is_empty():
        return events
    tied = events.select(pl.col("time").is_in(headers["time"].implode()).fill_null(False)).to_series().arg_true()
    if not tied.len():
        return events
    later = (
        events[tied].with_row_index("row").filter(DATED_ABOVE.fill_null(False)).with_columns(pl.col("file").cast(pl.String))
        .join(headers, on="time")
        .filter((pl.col("file") == pl.col("header_file")) & (pl.col("line") > pl.col("header"))
                & (pl.col("step") == pl.col("header_step")))
        .group_by("row").agg((pl.col("header_step").max() + 1).alias("step"))
    )
    if later.is_empty():
        return events
    return events.with_columns(events["step"].clone().scatter(tied.gather(later["row"]), later["step"]))


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


def reconstruct_times(steps: pl.DataFrame, metrics: pl.DataFrame, starts: list[datetime], earlier: pl.DataFrame | None = None) -> pl.DataFrame:
    """Times for a step log that prints none (verl's console): a start plus the summed per-step
    durations the log does print (``timing_s/step``), copy after copy in log order (``rank``, then
    ``line``): an attempt a restart abandoned (its values in ``earlier``) took its time too, and its
    copies come before the restart's. ``starts``: the run's Ray sessions' starts, as read; when there
    is one for each attempt (a restart launches Ray anew), each attempt's copies count from its own
    session's start, else all from the last session read. Unchanged without durations."""
    timing = pl.col("key") == "timing_s/step"
    by_step = metrics.filter(timing & pl.col("step").is_not_null()).group_by("step").agg(pl.col("value").last().alias("by_step"))
    if by_step.is_empty() or not starts:
        return steps
    # Each copy's own duration where it is on the copy's line; else the step's (a copy of the run's numbers).
    rows = metrics if earlier is None else pl.concat([metrics, earlier], how="vertical_relaxed")
    own = rows.filter(timing).select(pl.col("file").cast(pl.String), "line", pl.col("value").alias("own")).unique(["file", "line"], keep="last")
    order = [c for c in ("rank", "line") if c in steps.columns]
    copies = steps.with_row_index("at").sort(order, nulls_last=True).with_columns(relaunches(pl.col("step")).cum_sum().alias("attempt"))
    sessions = sorted(starts)
    if len(sessions) == (copies["attempt"].max() or 0) + 1:
        begun = pl.col("attempt").replace_strict(dict(enumerate(sessions)), return_dtype=pl.Datetime("us"))
    else:
        begun, copies = pl.lit(starts[-1]), copies.with_columns(pl.lit(0, dtype=pl.UInt32).alias("attempt"))
    return (
        copies.join(own, on=["file", "line"], how="left", maintain_order="left")
        .join(by_step, on="step", how="left", maintain_order="left")
        .with_columns((pl.coalesce("own", "by_step").cum_sum().over("attempt") * 1000).cast(pl.Int64).alias("elapsed_ms"))
        .with_columns((begun + pl.duration(milliseconds=pl.col("elapsed_ms"))).cast(pl.Datetime("ms")).alias("time"))
        .sort("at")
        .select(steps.columns)
    )


def relaunch_gaps(copies: pl.DataFrame) -> pl.DataFrame:
    """Each relaunch among the timed step copies (the run's and its abandoned attempts'):
    ``died_in``, the step the attempt before it never finished; ``first``, the attempt's first step
    the relaunch logged again; ``after``, that attempt's last header time; ``resumed``, the
    relaunch's first step; ``before``, its header time."""
    clock = copies.filter(pl.col("time").is_not_null()).sort("time", "line")
    attempts = clock.with_columns(relaunches(pl.col("step")).cum_sum().alias("attempt"))
    began = attempts.group_by("attempt").agg(pl.col("step").min().alias("began"))
    return (
        attempts.with_columns((pl.col("step").shift(1) + 1).alias("died_in"), pl.col("time").shift(1).alias("after"),
                              pl.col("attempt").shift(1).alias("dying"))
        .filter(relaunches(pl.col("step")))
        .join(began, left_on="dying", right_on="attempt", how="left", maintain_order="left")
        .select("died_in", pl.max_horizontal("step", "began").alias("first"), "after",
                pl.col("step").alias("resumed"), pl.col("time").alias("before"))
    )


def into_dying_attempts(events: pl.DataFrame, gaps: pl.DataFrame, launches: Sequence[datetime] = ()) -> pl.DataFrame:
    """Failures logged after an attempt's last step and before the relaunch's resume line
    (``run_resumed``) take the step the attempt died in: by time they fall in the relaunch's first
    step, but they are what ended the attempt before it. Where the resume line has no time (verl's
    console), the relaunch's Ray session start (``launches``) in the gap is the cut. Without either
    there is no telling where one attempt ends and the next begins: left as they are."""
    if gaps.is_empty() or events.is_empty():
        return events
    placed = pl.col("step")
    for gap in gaps.iter_rows(named=True):
        within = pl.col("time").is_between(gap["after"], gap["before"], closed="right")
        resume = events.filter(within & (pl.col("kind") == "run_resumed")).sort("time", "line")
        began = [t for t in launches if gap["after"] is not None and gap["before"] is not None and gap["after"] < t <= gap["before"]]
        if resume.is_empty() and not began:
            continue
        if resume.is_empty():
            before_it = pl.col("time") < min(began)
        else:
            cut = resume.row(0, named=True)
            before_it = (pl.col("time") < cut["time"]) | ((pl.col("time") == cut["time"]) & (pl.col("file") == cut["file"])
                                                         & (pl.col("line") < cut["line"]))
        placed = pl.when(within & before_it & (pl.col("severity") != "info")).then(pl.lit(gap["died_in"])).otherwise(placed)
    return events.with_columns(placed.alias("step"))


#: A copy's clock is put on the step log's when the two differ by a time zone's offset: a whole
#: quarter hour, give or take this, at most fourteen hours (epoch times read in the analyzing
#: machine's zone, the log printed in the training host's).
_QUARTER = timedelta(minutes=15)
_ZONE_SLACK = timedelta(minutes=2)
_ZONE_MAX = timedelta(hours=14)


def zone_offset(steps: pl.DataFrame, copy: pl.DataFrame) -> timedelta | None:
    """How far ``copy``'s clock is from the step log's (``steps``, its timed rows): the median gap
    between the two's times of the steps both hold, when it is a time zone's offset; else ``None``."""
    logged = steps.filter(pl.col("time").is_not_null()).group_by("step").agg(pl.col("time").max().alias("logged"))
    copied = copy.filter(pl.col("time").is_not_null() & pl.col("step").is_not_null()).group_by("step").agg(pl.col("time").max())
    gaps = copied.join(logged, on="step").select((pl.col("time") - pl.col("logged")).dt.total_milliseconds())
    if gaps.height < 3:
        return None
    gap = timedelta(milliseconds=float(gaps.to_series().median()))  # type: ignore[arg-type]
    zone = round(gap / _QUARTER) * _QUARTER
    if not zone or abs(zone) > _ZONE_MAX or abs(gap - zone) > _ZONE_SLACK:
        return None
    return zone


#: A server log is off the run's clock when almost none of its lines fall in the run's steps (a
#: server idling on after a hung trainer still has as many in them as after it).
_OFF_CLOCK = 0.2
_ON_CLOCK = 0.9
_SPAN_SLACK = timedelta(minutes=10)
_ORDER_SLACK = timedelta(seconds=60)
#: Among offsets that all fit: the best lines the log's ends up with the run's within this, and
#: better than the next best by at least the margin.
_ENDS_APART = timedelta(hours=1)
_ENDS_MARGIN = timedelta(minutes=10)


def server_zone(step_times: pl.Series, own: pl.DataFrame, others: pl.DataFrame) -> tuple[timedelta | None, bool]:
    """Whether a server log's own lines (``own``: ``line``, ``time``) are on another clock than the
    run's steps (``step_times``), and the time zone offset that puts them on it, when one does and
    only one: ``(offset, off_clock)``. ``others``: the same file's lines written on the run's clock
    (AReaL's wrapper lines), whose order among the server's bounds the offset."""
    times = own["time"].drop_nulls().sort()
    steps = step_times.drop_nulls()
    if times.len() < 10 or steps.is_empty():
        return None, False
    start, end = steps.min() - _SPAN_SLACK, steps.max() + _SPAN_SLACK  # type: ignore[operator]

    def inside(shift: timedelta) -> float:
        lo, hi = times.search_sorted(start - shift, "left"), times.search_sorted(end - shift, "right")
        return (int(hi) - int(lo)) / times.len()

    low, high = _order_bounds(own, others)
    # On the run's clock: among its steps and in order with the file's wrapper lines (a clock hours
    # ahead can leave most lines among a long run's steps, never in order with the wrapper's).
    if inside(timedelta(0)) >= _OFF_CLOCK and low <= timedelta(0) <= high:
        return None, False
    fits = [k * _QUARTER for k in range(-56, 57)
            if k and low <= k * _QUARTER <= high and inside(k * _QUARTER) >= _ON_CLOCK]
    if len(fits) <= 1:
        return (fits[0] if fits else None), True
    if (died := _died_then_exited(own, others)) is not None:
        # A server dying on its own is seen exiting by its wrapper at once: only one quarter hour
        # puts its last line (the crash) just before the exit line (a log at warning level has too
        # few lines left for its ends to tell).
        crashed, exited = died
        prompt = [shift for shift in fits if -_ORDER_SLACK <= exited - (crashed + shift) <= _EXITED_AT_ONCE]
        if len(prompt) == 1:
            return prompt[0], True
    # The slack around the steps lets offsets beside the true one fit too: the one that lines the
    # log's first and last lines up with the run's (a server launched just before the first step,
    # busy until the last) is it, when it does so clearly better than any other.
    def misfit(shift: timedelta) -> timedelta:
        return abs(times[0] + shift - steps.min()) + abs(times[-1] + shift - steps.max())  # type: ignore[operator]

    first, second = sorted(fits, key=misfit)[:2]
    clear = misfit(first) < _ENDS_APART and misfit(second) - misfit(first) >= _ENDS_MARGIN
    return (first if clear else None), True


#: A server's own lines that mean it died (a scheduler's crash, a child's sigquit, a fatal signal),
#: and how soon after them its wrapper logs the exit.
_DYING = ("child_crash", "scheduler_exception", "segfault", "fatal_check", "process_killed", "host_oom_kill")
_EXITED_AT_ONCE = timedelta(minutes=2)


def _died_then_exited(own: pl.DataFrame, others: pl.DataFrame) -> tuple[datetime, datetime] | None:
    """The server's dying line and its wrapper's exit line right below it (``own`` and ``others``
    with ``kind``), as their times on their two clocks: ``(crashed, exited)``; else ``None``."""
    if "kind" not in own.columns or "kind" not in others.columns:
        return None
    exits = others.filter((pl.col("kind") == "server_exit") & pl.col("time").is_not_null()).sort("line")
    if exits.is_empty():
        return None
    exit_line, exited = exits["line"][0], exits["time"][0]
    above = own.filter((pl.col("line") < exit_line) & pl.col("time").is_not_null()).sort("line").tail(1)
    if above.is_empty() or above["kind"][0] not in _DYING:
        return None
    return above["time"][0], exited


#: A server's exit and the first call the trainer found refused after it: on one clock, within this.
_REFUSED_WITHIN = timedelta(minutes=10)
#: Under the offset that puts them together, this close.
_REFUSED_AT_ONCE = timedelta(minutes=2)


def exit_offset(exited: datetime, refused: pl.Series) -> timedelta | None:
    """A server log's whole clock (its wrapper lines too: a server host in another zone) read off its
    exit (``exited``) and the trainer's refused calls to it (``refused``, on the run's clock): when
    none follows the exit within minutes, and exactly one time zone's offset puts the first refusal
    after it right away, that offset; else ``None`` (on the clock, or nothing tells)."""
    times = refused.drop_nulls().sort()
    if times.is_empty():
        return None
    # Refusals go on for as long as the trainer calls: only where a burst of them begins can the
    # exit be (one in the middle of a burst was refused before it exited: another clock).
    begins = times.filter(times.diff().fill_null(_REFUSED_WITHIN) >= _REFUSED_WITHIN)

    def fits(shift: timedelta, within: timedelta) -> bool:
        lag = begins - (exited + shift)
        return bool(((lag >= -_ORDER_SLACK) & (lag <= within)).any())

    if fits(timedelta(0), _REFUSED_WITHIN):
        return None
    shifts = [k * _QUARTER for k in range(-56, 57) if k and fits(k * _QUARTER, _REFUSED_AT_ONCE)]
    return shifts[0] if len(shifts) == 1 else None


#: A server's death and the first call the trainer found dropped mid-request: one moment on one
#: clock, give or take this. Further apart (within ``_REFUSED_WITHIN``), the server host's clock is
#: off by the gap (NTP skew between nodes).
_SKEW_MIN = timedelta(seconds=30)
#: A call dropped as the server died is followed by one refused, this soon, and by none before it.
_THEN_REFUSED = timedelta(minutes=1)


def exit_skew(exited: datetime, dropped: pl.Series, refused: pl.Series) -> timedelta | None:
    """A server log's whole clock off the run's by seconds to minutes, read off its exit (``exited``)
    and the trainer's calls to it (on the run's clock): the first dropped mid-request (``dropped``:
    the server went away under it) that is followed by a refused one within a minute (``refused``),
    with no refusal in the minutes before it, is the moment it died. Their gap, when more than
    seconds; else ``None`` (on the clock, or no call was in flight when it died)."""
    dropped, refused = dropped.drop_nulls().sort(), refused.drop_nulls().sort()
    if dropped.is_empty() or refused.is_empty():
        return None
    if any(((calls >= exited - _SKEW_MIN) & (calls <= exited + _SKEW_MIN)).any() for calls in (dropped, refused)):
        return None
    after = refused.search_sorted(dropped, "right")
    follows = refused.gather(after.clip(upper_bound=refused.len() - 1)) - dropped
    quiet_before = refused.search_sorted(dropped, "left") == refused.search_sorted(dropped - _REFUSED_WITHIN, "left")
    died = dropped.filter((after < refused.len()) & (follows > timedelta(0)) & (follows <= _THEN_REFUSED) & quiet_before)
    if died.is_empty():
        return None
    skew = timedelta(seconds=round((died[0] - exited).total_seconds()))
    return skew if _SKEW_MIN < abs(skew) <= _REFUSED_WITHIN else None


def _order_bounds(own: pl.DataFrame, others: pl.DataFrame) -> tuple[timedelta, timedelta]:
    """The offsets under which the file's lines stay in time order: each line on the run's clock
    comes after the server's line above it and before the one below it."""
    low, high = timedelta.min, timedelta.max
    marks = others.filter(pl.col("time").is_not_null()).select("line", pl.col("time").alias("at")).sort("line")
    if marks.is_empty():
        return low, high
    own = own.filter(pl.col("time").is_not_null()).select("line", "time").sort("line")
    above = marks.join_asof(own, on="line", strategy="backward", allow_exact_matches=False)
    below = marks.join_asof(own, on="line", strategy="forward", allow_exact_matches=False)
    if (room := (above["at"] - above["time"]).drop_nulls()).len():
        high = room.min() + _ORDER_SLACK  # type: ignore[operator]
    if (room := (below["at"] - below["time"]).drop_nulls()).len():
        low = room.max() - _ORDER_SLACK  # type: ignore[operator]
    return low, high
