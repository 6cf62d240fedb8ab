"""Things worth knowing that are not incidents: a run whose steps get slower instead of
faster after the first (recompilation at every step), with the phase that grew the most.
"""

from __future__ import annotations

import polars as pl

from forensics.align import step_durations
from forensics.detect import keys_matching

#: Per-step duration keys a log may carry, with the factor that turns them into seconds.
_DURATION_KEYS = {"time_ms": 1e-3, "timing_s/step": 1.0, "perf/time_per_step": 1.0}
_PHASE_PREFIXES = ("phase/", "timing_s/", "timeperf/")


def slow_start(metrics: pl.DataFrame, steps: pl.DataFrame, *, factor: float = 1.5, early: int = 5) -> list[str]:
    """Early steps that took ``factor`` times longer than the first one, with the phase behind it."""
    durations = step_seconds(metrics, steps)
    if durations.height < 2:
        return []
    first = durations.row(0, named=True)
    if first["seconds"] <= 0:
        return []
    slow = [r for r in durations.slice(1, early - 1).iter_rows(named=True) if r["seconds"] > factor * first["seconds"]]
    if not slow:
        return []
    worst = max(slow, key=lambda r: r["seconds"])
    listed = ", ".join(f"step {r['step']} {r['seconds']:.1f} s" for r in slow)
    text = (
        f"steps got slower instead of faster after the first: {listed}, against {first['seconds']:.1f} s for step "
        f"{first['step']} (up to {worst['seconds'] / first['seconds']:.1f}×; recompilation at every step?)"
    )
    phase = _grown_phase(metrics, first["step"], worst["step"], worst["seconds"])
    return [f"{text}; {phase}" if phase else text]


def step_seconds(metrics: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """``(step, seconds)``: each step's duration as the run logged it (``timing_s/step``, ``time_ms``),
    else from its steps' times."""
    for key, scale in _DURATION_KEYS.items():
        rows = metrics.lazy().filter((pl.col("key") == key) & pl.col("step").is_not_null()).select("step", "value").collect()
        if rows.height:
            return rows.group_by("step").agg((pl.col("value").last() * scale).alias("seconds")).sort("step")
    return step_durations(steps)


def _grown_phase(metrics: pl.DataFrame, base: int, slow: int, slow_seconds: float) -> str:
    """The phase that grew most between two steps (a phase as long as the whole step is a total)."""
    phase = pl.col("key").is_in(keys_matching(metrics, "^(?:" + "|".join(_PHASE_PREFIXES) + ")"))
    at = metrics.filter(phase & pl.col("step").is_in([base, slow])).pivot("step", index="key", values="value", aggregate_function="last")
    if str(base) not in at.columns or str(slow) not in at.columns:
        return ""
    grown = (
        at.filter(pl.col(str(slow)) < 0.95 * slow_seconds)
        .with_columns((pl.col(str(slow)) - pl.col(str(base))).alias("delta"))
        .sort("delta", descending=True, nulls_last=True)
    )
    if grown.is_empty() or grown["delta"][0] is None or grown["delta"][0] <= 0:
        return ""
    top = grown.row(0, named=True)
    return f"the phase that grew most is {top['key']}: {top[str(base)]:.2f} → {top[str(slow)]:.2f}"
