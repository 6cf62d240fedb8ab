"""Control vs fix: two analysed runs side by side, and whether the fix avoided the control's incidents.

``compare(a, b)`` reads only what the analysis already holds (the metric and step frames, the
incidents); rendering lives in :mod:`reports`.

Example:
    >>> from forensics import analyze
    >>> a = analyze([Path("control/outputs")]).runs[0]  # doctest: +SKIP
    >>> compare(a, analyze([Path("fix/outputs")]).runs[0]).verdict  # doctest: +SKIP
    ('B has no reward_collapse; A collapsed at step 940.',)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from forensics.detect import Thresholds
from forensics.model import TOOL_VERSION, Incident, RunAnalysis, unjudged
from forensics.observations import step_seconds

SCHEMA = "grpo-forensics/compare/v1"
#: The primary metric's "final" value is its mean over this many last logged steps.
FINAL_STEPS = 20
_VERB = {
    "reward_collapse": "collapsed",
    "reward_drop": "dropped",
    "zero_variance": "had zero-variance batches",
    "dead_loss": "had a dead loss",
    "stall": "stalled",
    "crash": "crashed",
    "nan_inf": "went non-finite",
    "server_down": "lost an inference server",
}


@dataclass(frozen=True)
class RunStats:
    """The numbers a comparison puts side by side, for one run."""

    run_id: str
    root: str
    primary_metric: str | None
    first_step: int | None
    last_step: int | None
    final_metric: float | None
    """Mean of the primary metric over the last ``FINAL_STEPS`` logged steps."""
    median_step_seconds: float | None
    steps_per_hour: float | None
    """Steps per wall-clock hour over the whole logged span (stalls included), logged or not (a run
    logged every 10th step made 10 steps a row)."""
    peak_device_used_gb: float | None

    def to_dict(self) -> dict[str, Any]:
        def r(v: float | None, n: int) -> float | None:
            return None if v is None else round(v, n)

        return {
            "run_id": self.run_id,
            "root": self.root,
            "primary_metric": self.primary_metric,
            "steps": {"first": self.first_step, "last": self.last_step},
            "final_metric": r(self.final_metric, 4),
            "median_step_seconds": r(self.median_step_seconds, 2),
            "steps_per_hour": r(self.steps_per_hour, 2),
            "peak_device_used_gb": r(self.peak_device_used_gb, 2),
        }


@dataclass(frozen=True)
class Comparison:
    """Run A (control) against run B (fix)."""

    a: RunAnalysis
    b: RunAnalysis
    stats_a: RunStats
    stats_b: RunStats
    avoided: bool | None
    """True when B has none of A's incident kinds, False when it has one, None when A had none."""
    verdict: tuple[str, ...]
    """Plain sentences, the first one the answer."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "tool_version": TOOL_VERSION,
            "avoided": self.avoided,
            "verdict": list(self.verdict),
            "a": {**self.stats_a.to_dict(), "incidents": [i.to_dict() for i in self.a.incidents]},
            "b": {**self.stats_b.to_dict(), "incidents": [i.to_dict() for i in self.b.incidents]},
        }


def _finite(frame: pl.DataFrame) -> pl.Series:
    return frame.filter(pl.col("value").is_finite())["value"]


def run_stats(run: RunAnalysis) -> RunStats:
    """The side-by-side numbers of one run."""
    rng = run.step_range()
    primary = (
        run.metrics.filter((pl.col("key") == (run.primary_metric or "")) & pl.col("step").is_not_null())
        .group_by("step").agg(pl.col("value").mean()).sort("step")
    )
    tail = _finite(primary.tail(FINAL_STEPS))
    clock = (
        run.steps.filter(pl.col("step").is_not_null() & pl.col("time").is_not_null())
        .group_by("step").agg(pl.col("time").min()).sort("step")
    )
    # Per step, not per logged row: a run logged every 10th step takes a tenth of its rows' gaps a step.
    seconds = (clock["time"].diff().dt.total_milliseconds() / 1000 / clock["step"].diff()).drop_nulls()
    span_h = (clock["time"].max() - clock["time"].min()).total_seconds() / 3600 if clock.height > 1 else 0
    stepped = clock["step"].max() - clock["step"].min() if clock.height > 1 else 0
    if seconds.is_empty():  # (a console with no times — verl's, its Ray session not given — logs each step's duration)
        seconds = step_seconds(run.metrics, run.steps)["seconds"].drop_nulls()
        span_h, stepped = (float(seconds.sum()) / 3600, len(seconds)) if len(seconds) else (0, 0)
    # The device memory the run logged: AReaL's and the server's, else verl's reserved peak per step.
    used = next((found for key in ("mem/device_used_gb", "perf/max_memory_reserved_gb")
                 if len(found := _finite(run.metrics.filter(pl.col("key") == key)))), pl.Series([], dtype=pl.Float64))
    return RunStats(
        run_id=run.run_id,
        root=run.root,
        primary_metric=run.primary_metric,
        first_step=rng["first"],
        last_step=rng["last"],
        final_metric=float(tail.mean()) if len(tail) else None,  # type: ignore[arg-type]
        median_step_seconds=float(seconds.median()) if len(seconds) else None,  # type: ignore[arg-type]
        steps_per_hour=stepped / span_h if span_h > 0 else None,
        peak_device_used_gb=float(used.max()) if len(used) else None,  # type: ignore[arg-type]
    )


def _first_of_each_kind(run: RunAnalysis) -> dict[str, Incident]:
    first: dict[str, Incident] = {}
    for inc in sorted(run.incidents, key=lambda i: i.onset_step):
        first.setdefault(inc.kind, inc)
    return first


#: Kinds that tell one thing of the reward: it stopped teaching. A fix whose reward fell 70 % where
#: the control's collapsed to zero did not avoid it.
_REWARD_FELL = ("reward_collapse", "reward_drop", "zero_variance")
#: How many of B's primary values, from A's onset on, a kind needs to show (its detector's least):
#: fewer, and B not having it says nothing. Kinds not listed need B to have reached A's onset.
_VALUES_NEEDED = {"reward_collapse": "end_run", "zero_variance": "end_run", "dead_loss": "end_run",
                  "nan_inf": "nan_run", "reward_drop": "drop_window"}


def _match(kind: str, first_b: dict[str, Incident]) -> Incident | None:
    """B's incident that is A's ``kind``: the same kind, else one of the same family."""
    if kind in first_b:
        return first_b[kind]
    family = [first_b[k] for k in _REWARD_FELL if kind in _REWARD_FELL and k in first_b]
    return min(family, key=lambda i: i.onset_step) if family else None


def _values_from(run: RunAnalysis, step: int) -> int:
    """How many steps from ``step`` on the run logged its primary metric at."""
    if run.primary_metric is None:
        return 0
    mine = run.metrics.filter((pl.col("key") == run.primary_metric) & (pl.col("step") >= step) & pl.col("value").is_not_null())
    return mine["step"].n_unique()


def _needed(run: RunAnalysis, kind: str) -> int | None:
    name = _VALUES_NEEDED.get(kind)
    if name is None:
        return None
    return int(run.thresholds.get(name, getattr(Thresholds(), name)))


def _verdict(a: RunAnalysis, b: RunAnalysis, sa: RunStats, sb: RunStats) -> tuple[bool | None, tuple[str, ...]]:
    first_a, first_b = _first_of_each_kind(a), _first_of_each_kind(b)
    lines: list[str] = []
    caveat_a = a.caveat()
    if not first_a and caveat_a:
        lines.append(f"A cannot be told healthy: {caveat_a}.")  # (no incident of A's is no clean control)
    elif not first_a:
        lines.append("Neither run has an incident." if not first_b else "A has no incident to avoid.")
    unseen = []  # (A's incidents B stopped before: it cannot show whether it has them)
    matched: set[str] = set()  # (B's kinds that answer one of A's)
    unjudged_b = unjudged(b.steps.is_empty(), b.primary_metric)  # (no step or no reward read in B: none of A's can be looked for)
    for kind, inc in first_a.items():
        verb = _VERB.get(kind, f"had {kind}")
        other = _match(kind, first_b)
        needed = _needed(b, kind)
        shown = _values_from(b, inc.onset_step) if needed is not None else None
        if other is None and unjudged_b:
            unseen.append(inc.onset_step)
            lines.append(f"Whether B has {kind} cannot be told ({unjudged_b}); A {verb} at step {inc.onset_step}.")
        elif other is None and sb.last_step is not None and sb.last_step < inc.onset_step:
            unseen.append(inc.onset_step)
            lines.append(f"B was logged only up to step {sb.last_step}, before A {verb} at step {inc.onset_step}: "
                         f"whether B has {kind} cannot be told.")
        elif other is None and needed is not None and shown is not None and shown < needed:
            unseen.append(inc.onset_step)
            lines.append(f"B logged {b.primary_metric} at only {shown} step{'s' if shown != 1 else ''} from step "
                         f"{inc.onset_step} on, where A {verb} ({needed} are needed to show {kind}): "
                         f"whether B has it cannot be told.")
        elif other is None:
            lines.append(f"B has no {kind}; A {verb} at step {inc.onset_step}.")
        else:
            matched.add(other.kind)
            when = ("later than" if other.onset_step > inc.onset_step
                    else "earlier than" if other.onset_step < inc.onset_step else "at the same step as")
            also = f"B also has {kind}" if other.kind == kind else f"B has {other.kind}"
            lines.append(f"{also}: at step {other.onset_step}, {when} A ({verb} at step {inc.onset_step}).")
    for kind, inc in first_b.items():
        if kind in first_a or kind in matched:
            continue
        if caveat_a and not first_a:
            lines.append(f"B has {kind} at step {inc.onset_step}; whether A has it cannot be told.")
        elif sa.last_step is not None and sa.last_step < inc.onset_step:
            lines.append(f"B has {kind} at step {inc.onset_step}; A was logged only up to step {sa.last_step}, "
                         f"so whether A has it cannot be told.")
        else:
            lines.append(f"B has {kind} at step {inc.onset_step}, which A does not.")
    avoided_onsets = [i.onset_step for k, i in first_a.items() if _match(k, first_b) is None]
    avoided = None if not first_a else len(avoided_onsets) == len(first_a)
    # Not seeing A's incident in B is no avoidance where B could not show it: cannot be told.
    if unseen:
        avoided = None if avoided else avoided
    caveat = b.caveat()
    if avoided_onsets and caveat and not unjudged_b:
        lines.append(f"B cannot show it either way: {caveat}.")
        avoided = None if avoided else avoided
    if a.primary_metric != b.primary_metric:
        lines.append(f"The runs report different primary metrics: A {a.primary_metric or 'none'}, B {b.primary_metric or 'none'}.")
    return avoided, tuple(lines)


def compare(a: RunAnalysis, b: RunAnalysis) -> Comparison:
    """Compare run ``a`` (the control) with run ``b`` (the fix)."""
    sa, sb = run_stats(a), run_stats(b)
    avoided, verdict = _verdict(a, b, sa, sb)
    return Comparison(a=a, b=b, stats_a=sa, stats_b=sb, avoided=avoided, verdict=verdict)
