"""Detectors: where a run's numbers stopped meaning anything.

Each detector returns :class:`Finding` s — what happened and over which steps — and leaves
the *why* to :mod:`forensics.causes`. Judgements are made against the run's own healthy
behaviour: a value that was common before (zero reward in a sparse-reward task) has to
repeat for much longer before it counts as a collapse than one never seen before.
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import polars as pl

from forensics.texts import from_lines
from parsers.schema import relaunches

#: Keys tried in order for the primary metric, then any key that ends like them.
PRIMARY_CANDIDATES = (
    "grpo_actor/task_reward/avg",
    "ppo_actor/task_reward/avg",
    "actor/task_reward/avg",
    "critic/score/mean",
    "critic/rewards/mean",
    "rollout/reward",
    "train/reward",  # TRL's GRPOTrainer: the reward functions' weighted sum (``rewards/<func>/mean`` are its parts)
)
PRIMARY_SUFFIXES = ("task_reward/avg", "score/mean", "reward/avg", "reward/mean", "reward")
#: Series of held-out data (``eval/…``, verl's ``val-core/…``, ``test/…``): never the run's reward.
_HELD_OUT = re.compile(r"^(?:eval|evaluation|val|validation|test)(?:[-_/]|$)", re.IGNORECASE)
#: One reward function's mean of several the run's reward sums (TRL's ``rewards/<func>/mean``).
REWARD_PARTS = r"(?:^|/)rewards/[^/]+/mean$"


@dataclass(frozen=True)
class Thresholds:
    """Every knob the detectors use, reported in the output so a verdict can be reproduced."""

    min_run: int = 5
    """A collapse needs at least this many steps in a row at the collapsed value."""
    chance: float = 1e-4
    """...and that run must be this unlikely under the run's healthy behaviour."""
    recovery_window: int = 10
    """Steps that must look healthy again, in a row, for a recovery."""
    recovery_level: float = 0.5
    """Recovered values must reach this share of the healthy median (measured from the lowest value
    seen where a reward goes below zero)."""
    recent_steps: int = 50
    """A collapse must be improbable under the last this many steps' rate of its value too (a rising
    reward's common value is rarer in its whole history than of late)."""
    end_run: int = 3
    """At the end of the log, where no more steps can follow, this many steps in a row can be a collapse."""
    drop_window: int = 20
    """A reward's level is the mean of this many logged values around each step (a quarter of a
    shorter series, down to 8), its best so far the highest mean of three times as many (or of a
    sixth of the series, if fewer, but one window at least)..."""
    drop_level: float = 0.6
    """...and it dropped where that level fell under this share of its best (from zero, or from the
    lowest level for a reward that goes below zero)..."""
    decline_level: float = 0.4
    """...or this share, for a slow slide (no one step explains most of the fall), unless it stays
    under ``drop_level`` for ``decline_lasting`` logged values..."""
    decline_lasting: int = 200
    drop_noise: float = 6.0
    """...by this many standard errors of the level or more (a coarse or low reward's noise is no drop)..."""
    drop_recovery: float = 0.8
    """...and stayed under this share of its best for a whole window; back over it, it recovered."""
    failing_drop_level: float = 0.9
    """Where infrastructure failures stand out around it (one of several servers hung: its share of
    the rollouts failing), a fall under this share of the best is a drop, sudden or slow."""
    stall_factor: float = 5.0
    """Silence after the last step longer than this many median step times is a stall..."""
    stall_min_seconds: float = 600.0
    """...and never shorter than this."""
    nan_run: int = 3
    """Non-finite loss or gradient for this many steps in a row is a divergence."""
    server_down_minutes: float = 5.0
    """An inference server gone this long while the trainer kept calling it, none launched in its place, is down."""

    def to_dict(self) -> dict[str, float | int]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True)
class Finding:
    """A detected stretch: what, where it began and ended, and a one-line description."""

    kind: str
    metric: str | None
    onset_step: int
    end_step: int | None
    summary: str
    value: float | None = None
    last_step_time: datetime | None = None
    until: datetime | None = None
    """For a stall: the last thing logged after the last step; for a collapse in an abandoned
    attempt: when the attempt logged its last collapsed step; for a crash in one: when the run was
    back where it failed."""
    failed_at: datetime | None = None
    """For a failure in a step never logged: when it was seen."""
    redone: tuple[int, int] | None = None
    """For a collapse or crash in an attempt a relaunch abandoned: the attempt's abandoned steps (first, last)."""
    onset_row: dict[str, Any] | None = None
    """The abandoned attempt's row at the onset (``time``, ``file``, ``line``, ``value``): the run's
    own rows at that step are the relaunch's."""
    seen: dict[str, Any] | None = None
    """For a stall only other logs' lines went on through: the last of them (a metric row)."""
    began_after: int | None = None
    """For a collapse first seen after steps that logged no value: the last step that did (it may
    have begun in any step after it)."""
    said: str | None = None
    """For a reward drop: what its summary says of it, without the metric and how long it lasted
    (an abandoned attempt's drop is told in those words, and where the attempt ended)."""
    raised: tuple[str, int] | None = None
    """For a crash the run's own exception ended, whose traceback no time or line places after the
    last step (undated, in the stderr beside the steps' stdout): its ``file`` and ``line``."""
    non_finite: tuple[str, ...] = ()
    """For non-finite values: the keys non-finite at the onset."""
    fell_by: int | None = None
    """For a reward's slow decline: the step by which it had fallen (the onset, where it began, is
    found from wide means, and may be some steps early)."""

    @property
    def diverged(self) -> bool:
        """Non-finite values in the training numbers (loss, gradient norm), not only in the reward
        (a reward function's NaN, or the mean of a batch with no reward). A finding made without
        its keys is taken to be."""
        return self.kind == "nan_inf" and (not self.non_finite or any(re.search(NUMERIC_HEALTH, k) for k in self.non_finite))


_keys_of: tuple[weakref.ref[pl.DataFrame], int, set[str], set[str]] | None = None


def metric_keys(metrics: pl.DataFrame) -> tuple[set[str], set[str]]:
    """Every key of ``metrics``, and those with a step. Several detectors and the report ask for
    them; on a long frame one hash pass costs as much as a detector, so the last answer is kept."""
    global _keys_of
    if _keys_of is not None and _keys_of[0]() is metrics and _keys_of[1] == metrics.height:
        return _keys_of[2], _keys_of[3]
    # The streaming engine keeps one small table per thread; in memory, group_by would index every row.
    found = metrics.lazy().group_by("key").agg(pl.col("step").is_not_null().any().alias("stepped")).collect(engine="streaming")
    every, stepped = set(found["key"].to_list()), set(found.filter("stepped")["key"].to_list())
    _keys_of = (weakref.ref(metrics), metrics.height, every, stepped)
    return every, stepped


def keys_matching(metrics: pl.DataFrame, regex: str) -> list[str]:
    """The keys of ``metrics`` that ``regex`` finds something in (keys are categorical: a regex
    runs on the few distinct names, never on every row)."""
    pattern = re.compile(regex)
    return sorted(k for k in metric_keys(metrics)[0] if pattern.search(k))


def choose_primary(metrics: pl.DataFrame) -> tuple[str | None, str]:
    """The metric to judge the run by, and a sentence saying why it was chosen."""
    keys = metric_keys(metrics)[1]
    for key in PRIMARY_CANDIDATES:
        if key in keys:
            return key, f"{key} is the run's task reward"
    for suffix in PRIMARY_SUFFIXES:
        found = [k for k in keys if k.endswith(suffix) and not _HELD_OUT.match(k)]
        if len(found) > 1:
            # (``reward/mean`` before ``format_reward/mean``: a whole name's end before a word's; then
            # the series of most steps, the training one, not one logged every tenth step; the shortest)
            counts = dict(metrics.filter(pl.col("key").is_in(found) & pl.col("step").is_not_null())
                          .group_by(pl.col("key").cast(pl.String)).agg(pl.col("step").n_unique()).iter_rows())
            found.sort(key=lambda k: (k != suffix and not k.endswith("/" + suffix), -counts.get(k, 0), len(k), k))
        if found:
            return found[0], f"no standard task reward key; {found[0]} is the closest reward series"
    return None, "no reward metric in the logs"


def series(metrics: pl.DataFrame, key: str) -> pl.DataFrame:
    """``(step, value)`` of one table metric, one row per step."""
    return (
        metrics.lazy()  # lazy: only the columns read are gathered, not all seven of every row kept
        .filter((pl.col("key") == key) & pl.col("step").is_not_null())
        .group_by("step")
        .agg(pl.col("value").last())
        .sort("step")
        .collect()
    )


def reward_collapses(frame: pl.DataFrame, key: str, t: Thresholds) -> list[Finding]:
    """Sustained runs of one exact value (zero, or any constant) that the healthy history
    makes improbable; each lasts until the metric looks healthy again for a whole window.

    Only runs of a finite value at least ``t.min_run`` long can be one (``t.end_run`` long where the
    log ends): they are found vectorized, and only they are weighed against the history before them.
    """
    steps = frame["step"].to_list()
    values = frame["value"].to_list()
    exact = frame["value"] + 0.0  # -0.0 and 0.0 as one value, as ``==`` has it
    counts = _Occurrences(exact)
    findings: list[Finding] = []
    healthy_from = resumed = 0
    runs = _long_runs(exact, t.min_run)
    last = _last_run(values, t)
    before = _Before(values)
    for start, length in [*runs, *last]:
        if start + length <= resumed:  # passed over while recovering from the finding before
            continue
        if start < resumed:  # the scan resumed inside this run: only its rest counts
            start, length = resumed, start + length - resumed
            if length < (t.end_run if start + length == len(values) else t.min_run):
                continue
        value = values[start]
        # Constant from the first step to the last: never healthy, nothing to compare with.
        never_varied = start == 0 and length == len(values)
        if not never_varied and _warm_up(steps, values, start, length, t):
            healthy_from = start + length  # (its value, common in it, is no healthy one)
            continue
        if not never_varied and before.saturated(start, t.recovery_window):
            continue
        recent = max(healthy_from, start - t.recent_steps)
        if not (never_varied or (improbable(counts.between(value, healthy_from, start), start - healthy_from, length, t.chance)
                                 and improbable(counts.between(value, recent, start), start - recent, length, t.chance))):
            continue
        end = _recovery(values, start + length, value, values[healthy_from:start], t)
        onset, end_step = steps[start], (steps[end] if end is not None else None)
        # Stuck at one value, then at another (a degraded server, then none): each is said.
        stuck = [(start, value)]
        for at, _ in runs:
            if start + length <= at < (end if end is not None else len(values)) and values[at] != stuck[-1][1]:
                stuck.append((at, values[at]))
        described = ", then ".join([f"{_stuck(v)} from step {steps[at]}" for at, v in stuck[:3]] + ["…"] * (len(stuck) > 3))
        span = f"until step {end_step}" if end_step is not None else "and never recovered"
        if (start, length) in last:
            span = f"to the last step logged, where the log ends ({length} steps)"
        if never_varied:  # not a collapse from something healthy: the reward was never anything else
            described, span = f"{_stuck(value)} at every step from the first (step {onset})", "and never took another value"
        findings.append(Finding("reward_collapse", key, onset, end_step, f"{key} {described} {span}", value))
        if end is None:
            break
        resumed = healthy_from = end
    return findings


def reward_drops(frame: pl.DataFrame, key: str, t: Thresholds, collapses: Sequence[Finding] = ()) -> list[Finding]:
    """Sustained falls of the reward's level (a running mean) well under its best so far: a
    reward that halves and stays there (one of several servers hung, its rollouts failing), or one
    that declines to nothing. A run of one value is a collapse (``collapses``, found already): a
    drop beginning with one is that collapse, though a reward that came back from it only part of
    the way dropped from where the collapse ended."""
    values = frame.filter(pl.col("value").is_finite())
    w = min(t.drop_window, values.height // 4)
    if w < 8:
        return []
    levels = _Levels(values, w, collapses)
    findings: list[Finding] = []
    resumed = 0
    for i in levels.lost(t.drop_level):
        if i < resumed:
            continue
        drop = levels.drop_at(i, resumed, t)
        if drop is None:
            continue
        if drop.told:  # (by a collapse, all of it)
            resumed = drop.end
            continue
        n, steps, best = levels.n, levels.steps, levels.peak[i]
        how = (f"came back only to {drop.level:.4g} after the collapse that ended at step {steps[drop.onset]}" if drop.after_collapse
               else f"dropped to {drop.level:.4g} at step {steps[drop.onset]}" if drop.sudden
               else f"declined from step {steps[drop.onset]} to {drop.level:.4g} by step {steps[i]}"
                    f" ({(drop.level - levels.floor) / (levels.best[i] - levels.floor):.0%} of its best)")
        span = f"until step {steps[drop.end]}" if drop.end < n else "and never recovered"
        said = f"{how}, from a best of {best:.4g} (the highest mean of {levels.wide_w} logged steps)"
        findings.append(Finding("reward_drop", key, steps[drop.onset], steps[drop.end] if drop.end < n else None,
                                f"{key} {said}, {span}", drop.level, said=said,
                                fell_by=None if drop.sudden or drop.after_collapse else steps[i]))
        if drop.end >= n:
            break
        resumed = drop.end
    return findings


@dataclass(frozen=True)
class _Drop:
    onset: int
    end: int
    """Where the level was back (the series' length if never)."""
    level: float
    """The mean of what the reward scored once it had fallen."""
    sudden: bool = False
    after_collapse: bool = False
    told: bool = False
    """A collapse tells all of it."""


class _Levels:
    """One reward series (finite values, by index) with what judging a drop reads: its level (the
    mean of ``w`` values about each), a wide level (of ``wide_w``), its best so far, the noise of a level."""

    def __init__(self, values: pl.DataFrame, w: int, collapses: Sequence[Finding]) -> None:
        x = values["value"]
        self.w, self.n, self.steps, self.values = w, values.height, values["step"].to_list(), x.to_list()
        self._level = x.rolling_mean(w, center=True, min_samples=w)
        # (three windows, as a short or sparsely logged series allows: a window as wide as a sixth of
        # it, at least one; wider, every wide mean would take in a fall in it)
        self.wide_w = max(w, min(3 * w, self.n // 6))
        wide = x.rolling_mean(self.wide_w, center=True, min_samples=self.wide_w)
        self.level, self.wide = self._level.to_list(), wide.to_list()
        # (from the lowest level, not the lowest value: one stray -1 in a reward of 0 to 1 is no scale)
        self.floor = min(0.0, self._level.min() or 0.0)  # type: ignore[operator]
        self._sums = list(itertools.accumulate(self.values, initial=0.0))
        # How much a window's mean before each index exceeds the window's after it: a step down is where it peaks.
        self._fall = [self.mean(s - w, s) - self.mean(s, s + w) if 0 < s < self.n else -math.inf for s in range(self.n)]
        self.spans = [(bisect.bisect_left(self.steps, c.onset_step),
                       self.n if c.end_step is None else bisect.bisect_left(self.steps, c.end_step)) for c in collapses]
        inside = [False] * self.n
        for a, b in self.spans:
            inside[a:b] = [True] * (b - a)
        off = [(v - m) ** 2 for v, m, gone in zip(self.values, self.level, inside, strict=True) if m is not None and not gone]
        self.error = math.sqrt(sum(off) / len(off) / w) if off else math.inf
        """The standard error of a level, from how far values stray from theirs (outside collapses)."""
        # The best so far is a wider window's (the highest of many short means is their noise as much as
        # the reward's), and even that is above the reward's best by about two of its standard errors:
        # how far it fell is measured from under it, where it began from it (``peak``).
        peak = wide.cum_max().forward_fill()
        self._best = peak - 2 * self.error * math.sqrt(w / self.wide_w) if off else peak
        self.peak, self.best = peak.to_list(), self._best.to_list()
        self._began: tuple[float, int, int] | None = None  # (near, scanned to, last index near the best)

    def lost(self, share: float) -> list[int]:
        """Where the level is under ``share`` of the best so far."""
        return (self._level - self.floor < share * (self._best - self.floor)).fill_null(False).arg_true().to_list()

    def mean(self, a: int, b: int) -> float:
        a, b = max(a, 0), min(b, self.n)
        return (self._sums[b] - self._sums[a]) / (b - a)

    def drop_at(self, i: int, resumed: int, t: Thresholds) -> _Drop | None:
        """The drop the level's fall at ``i`` is part of, judged from ``resumed`` on; None for a dip or noise."""
        w, floor = self.w, self.floor
        for a, b in self.spans:
            if a <= i < b:  # (a collapse: the level after it is judged from its end)
                return _Drop(i, b, 0.0, told=True)
        top = self.best[i] - floor
        back = self._back(i, min(i + 2 * w, self.n), t.drop_recovery * top)
        if back - i < w:  # (a dip)
            return None
        fallen = self.mean(i, back)
        if self.best[i] - fallen < t.drop_noise * self.error:  # (a fall no deeper than noise)
            return None
        end = self._back(back, self.n, t.drop_recovery * top) if back == i + 2 * w else back
        # Just after a collapse, or where it went to one value as it fell: the collapse tells the fall,
        # as far as it lasted, and what the reward came back to after it is judged as a fall of its own.
        ended = [b for a, b in self.spans if b <= i <= b + w]
        if ended:
            return self._after_collapse(max(ended), end, top, t)
        # Where it began: after the last wide level still near the best (within noise, or a tenth of it)...
        near = self.peak[i] - max(3 * self.error, 0.1 * top)
        onset = self._began_after(i, near, resumed)
        # ...or, where it fell in one step, at that step: where the means of a window either side differ
        # most, the two windows' means before it still at the best and after it already as low as it
        # fell, within their noise, and most of the fall between them (a slide's, even a noisy one's,
        # are part of the way down).
        at = max(range(max(onset - 2 * w, i - 8 * w, resumed + 1), min(i + w, end - 1) + 1), key=self._fall.__getitem__)
        before, after = self.mean(max(at - w, resumed), at), self.mean(at, min(at + 2 * w, end))
        sudden = (before >= self.best[i] - 3 * self.error and after <= fallen + 2.5 * self.error / math.sqrt(2)
                  and before - after >= 0.75 * (self.best[i] - fallen))
        onset = at if sudden else onset
        told = [b for a, b in self.spans if onset - w <= a <= onset + 2]
        if told:
            return self._after_collapse(max(told), end, top, t)
        # A slow slide must go deeper, or stay down long: a reward swings slowly with its data (an epoch ordered by difficulty).
        deep = t.drop_level if sudden or end - i >= t.decline_lasting else t.decline_level
        if fallen - floor >= deep * top:
            return None
        return _Drop(onset, end, fallen, sudden=sudden)

    def _after_collapse(self, onset: int, end: int, top: float, t: Thresholds) -> _Drop:
        """What the reward came back to after a collapse ending at ``onset``: a drop, or all the collapse's (``told``)."""
        if end - onset < self.w or self.mean(onset, min(end, onset + 2 * self.w)) - self.floor >= t.drop_level * top:
            return _Drop(onset, end, 0.0, told=True)
        return _Drop(onset, end, self.mean(onset, min(end, onset + 2 * self.w)), after_collapse=True)

    def _back(self, i: int, until: int, bar: float) -> int:
        """The first index from ``i`` (before ``until``) where the level is back over ``bar``, else ``until``."""
        for j in range(i, until):
            if self.level[j] is not None and self.level[j] - self.floor >= bar:
                return j
        return until

    def _began_after(self, i: int, near: float, resumed: int) -> int:
        """The index after the last wide level ``near`` the best before ``i`` (not before ``resumed``).
        The fall's later indices ask again: what was scanned for the same ``near`` is not scanned again."""
        if self._began is not None and self._began[0] == near and self._began[1] <= i:
            _, start, last = self._began
        else:
            last = resumed - 1
            for k in range(i - 1, resumed - 1, -1):
                if self.wide[k] is not None and self.wide[k] >= near:
                    last = k
                    break
            start = i
        for k in range(start, i):
            if self.wide[k] is not None and self.wide[k] >= near:
                last = k
        self._began = (near, i, last)
        return max(last + 1, resumed)


def _last_run(values: list[float], t: Thresholds) -> list[tuple[int, int]]:
    """``(start, length)`` of the run of one finite value the log ends in, if ``t.end_run`` to
    ``t.min_run`` steps long (a longer one is among the long runs already)."""
    length = _tail_length(values)
    return [(len(values) - length, length)] if finite_value(values[-1] if values else None) and t.end_run <= length < t.min_run else []


def _tail_length(values: list[float]) -> int:
    """How many of the last ``values`` are one value (0 for none)."""
    length = 0
    while length < len(values) and same_value(values[-1 - length], values[-1]):
        length += 1
    return length


def collapse_before_stop(frame: pl.DataFrame, key: str, t: Thresholds) -> Finding | None:
    """The run of one exact value the reward ends in, two steps or more but shorter than
    ``t.end_run``, where the steps then stopped (a stall, a crash): the failure that stopped them
    began in it — a hung server's last batches all timed out. Weighed at its place only (``p **
    length`` under ``t.chance``, the value's smoothed rate before it): the stop says where to look,
    no search of the history does. Only a value at or under the lowest before it: a fine-grained
    reward repeating a middling value twice tells of nothing."""
    values = frame["value"].to_list()
    if not values or not finite_value(values[-1]):
        return None
    length = _tail_length(values)
    start, value = len(values) - length, values[-1]
    history = [v for v in values[:start] if finite_value(v)]
    if not 2 <= length < t.end_run or not history or value > min(history):
        return None
    seen = sum(same_value(v, value) for v in values[:start])
    if ((seen + 0.5) / (start + 1.0)) ** length >= t.chance:
        return None
    onset = frame["step"][start]
    return Finding("reward_collapse", key, onset, None, f"{key} {_stuck(value)} from step {onset} to the last step logged "
                   f"({length} steps), then the steps stopped", value)


def first_steps(steps: list[int]) -> bool:
    """Does ``steps`` begin at the run's first step: 0 or 1, or N for a log written every N steps?"""
    return bool(steps) and (steps[0] <= 1 or (len(steps) > 1 and steps[0] <= steps[1] - steps[0]))


#: Before a warm-up's first long run, the run scored under this share of what it scored after it.
_NEXT_TO_NOTHING = 0.1


def _warm_up(steps: list[int], values: list[float], start: int, length: int, t: Thresholds) -> bool:
    """Is the run of one value at ``start`` the run's first steps, before the task earned anything:
    from the log's first step where that is the run's (the first a log written every N steps has
    is N), or after steps that scored next to nothing against what the run scored after it (a lucky
    1/32 at step 1) — fewer than ``t.min_run``, or more where most of them scored this same value
    too (a hard task's lucky hits between its zeros)? A log that begins later (a resumed run) has no warm-up."""
    if not first_steps(steps):
        return False
    if start == 0:
        return True
    after = sorted(v for v in values[start + length:] if finite_value(v) and not same_value(v, values[start]))
    before = [v for v in values[:start] if finite_value(v)]
    nothing = bool(after and before) and max(before) < _NEXT_TO_NOTHING * after[len(after) // 2]
    return nothing and (start < t.min_run or 2 * sum(same_value(v, values[start]) for v in values[:start]) >= start)


def warm_up(frame: pl.DataFrame, t: Thresholds) -> tuple[int, int] | None:
    """``(first step, last step)`` of the reward's warm-up (:func:`_warm_up`), if it had one — its
    runs of one value with the few lucky steps between them: its batches had nothing to learn from,
    which is no incident either."""
    steps, values = frame["step"].to_list(), frame["value"].to_list()
    found = None
    for start, length in _long_runs(frame["value"] + 0.0, t.min_run):
        if start + length >= len(values) or not _warm_up(steps, values, start, length, t):
            break
        found = (found[0] if found else steps[start], steps[start + length - 1])
    return found


def ceilings(frame: pl.DataFrame, t: Thresholds) -> list[tuple[int, int, float]]:
    """``(first step, last step, value)`` of each stretch of at least ``t.min_run`` steps where the
    reward held at the best it had reached (:func:`saturated`): a task solved on its data, whose
    batches have nothing left to learn from, not a collapse."""
    steps, values = frame["step"].to_list(), frame["value"].to_list()
    before = _Before(values)
    return [(steps[start], steps[start + length - 1], values[start]) for start, length in _long_runs(frame["value"] + 0.0, t.min_run)
            if start and before.saturated(start, t.recovery_window)]


def abandoned_collapses(values: pl.DataFrame, earlier: pl.DataFrame, copies: pl.DataFrame, key: str, t: Thresholds) -> list[Finding]:
    """Collapses and drops in attempts the run abandoned: a relaunch from an earlier checkpoint went
    back to steps they had logged, so ``values`` (``series`` of the run) holds the run's own copies only.
    ``earlier``: the abandoned copies' metric rows; ``copies``: every step row (``step``, ``time``,
    ``file``, ``line``), the run's and the abandoned ones, which tell the attempts apart.

    Each attempt is judged as the run would have been had it gone on: the run's values before
    its first abandoned step, then its own.
    """
    rows = earlier.filter((pl.col("key") == key) & pl.col("step").is_not_null())
    if rows.is_empty():
        return []
    findings = []
    for attempt, first, last, relaunch in _attempts(rows, copies):
        judged = pl.concat([values.filter(pl.col("step") < first).select("step", "value"), attempt.select("step", "value")])
        # (the attempt's last steps are not the log's end: the relaunch went on from them)
        collapses = reward_collapses(judged, key, replace(t, end_run=t.min_run))
        for found in [*collapses, *reward_drops(judged, key, t, collapses)]:
            if found.onset_step < first:
                continue
            row = attempt.filter(pl.col("step") == found.onset_step).row(0, named=True)
            ended = found.end_step if found.end_step is not None and found.end_step <= last else last + 1
            span = f"until step {found.end_step}" if ended == found.end_step else f"to step {last}, the attempt's last,"
            taken = (f"a relaunch from step {relaunch} took the run on from step {relaunch + 1}" if relaunch > 0
                     else "the run was started again from its first step")
            what = f"{_stuck(found.value or 0.0)} from step {found.onset_step}" if found.kind == "reward_collapse" else found.said
            summary = f"{key} {what} {span} in an attempt the run abandoned at step {last}: {taken}"
            until = attempt.filter(pl.col("step") == ended - 1)["time"]
            findings.append(replace(found, end_step=ended, summary=summary, redone=(first, last), onset_row=row,
                                    until=until[0] if len(until) else None))
    return findings


def _attempts(rows: pl.DataFrame, copies: pl.DataFrame) -> Iterator[tuple[pl.DataFrame, int, int, int]]:
    """``rows`` (an abandoned attempt's metric rows) by the attempt that logged them, in order, each
    with its first and last step and the step the relaunch after it resumed after."""
    # An attempt runs while its steps go up; a relaunch going back starts the next.
    attempts = (
        copies.sort("time", "line", nulls_last=True)
        .with_columns(relaunches(pl.col("step")).cum_sum().alias("attempt"))
        .select(pl.col("file").cast(pl.String), "line", "attempt", "step")
    )
    restarts = attempts.group_by("attempt").agg(pl.col("step").first().alias("resumed")).sort("attempt")
    rows = rows.with_columns(pl.col("file").cast(pl.String))
    by_line = rows.join(attempts.drop("step"), on=["file", "line"], how="inner")
    # A copy's values are records of their own (TensorBoard's, one a scalar): found by file and
    # step instead, where the file holds one copy of the step.
    single = attempts.filter(pl.len().over("file", "step") == 1).select("file", "step", "attempt")
    by_step = rows.join(attempts.select("file", "line"), on=["file", "line"], how="anti").join(single, on=["file", "step"], how="inner")
    for (number,), attempt in pl.concat([by_line, by_step]).sort("attempt", "step").group_by("attempt", maintain_order=True):
        attempt = attempt.sort("step")
        first, last = int(attempt["step"][0]), int(attempt["step"][-1])
        after = restarts.filter(pl.col("attempt") > number)["resumed"]
        yield attempt, first, last, int(after[0]) - 1 if len(after) else first - 1


def abandoned_dead_batches(metrics: pl.DataFrame, earlier: pl.DataFrame, copies: pl.DataFrame, t: Thresholds) -> list[Finding]:
    """Dead batches and a dead loss (:func:`dead_learning`) in attempts the run abandoned (see
    :func:`abandoned_collapses`): each attempt judged on the run's rows before its first step, then its own."""
    rows = earlier.filter(pl.col("step").is_not_null())
    if rows.is_empty():
        return []
    findings = []
    for attempt, first, last, relaunch in _attempts(rows, copies):
        judged = pl.concat([metrics.filter(pl.col("step") < first).select(earlier.columns),
                            attempt.select(earlier.columns).with_columns(pl.col("file").cast(earlier.schema["file"]))])
        taken = (f"a relaunch from step {relaunch} took the run on from step {relaunch + 1}" if relaunch > 0
                 else "the run was started again from its first step")
        for found in dead_learning(judged, t, last_step=last):
            if found.onset_step < first:
                continue
            ended = found.end_step if found.end_step is not None and found.end_step <= last else last + 1
            at = attempt.filter(pl.col("step") == found.onset_step).sort(pl.col("key") != found.metric)
            row = at.row(0, named=True) if at.height else None
            findings.append(replace(found, end_step=ended, redone=(first, last), onset_row=row,
                                    summary=f"{found.summary}, in an attempt the run abandoned at step {last}: {taken}"))
    return findings


def _stuck(value: float) -> str:
    return "exactly zero" if value == 0 else f"stuck at {value:.4g}"


def _long_runs(values: pl.Series, min_run: int) -> list[tuple[int, int]]:
    """``(start, length)`` of every run of one finite value at least ``min_run`` long, in order."""
    runs = (
        pl.DataFrame({"value": values})
        .with_row_index("at")
        .group_by(pl.col("value").rle_id().alias("run"), maintain_order=True)
        .agg(pl.col("at").first().alias("start"), pl.len().alias("length"), pl.col("value").first())
        .filter((pl.col("length") >= min_run) & pl.col("value").is_finite())
    )
    return list(zip(runs["start"].to_list(), runs["length"].to_list(), strict=True))


class _Occurrences:
    """How often a finite value occurs in any stretch of the series (positions found once per value)."""

    def __init__(self, values: pl.Series) -> None:
        self._values = values
        self._at: dict[float, list[int]] = {}

    def between(self, value: float, start: int, stop: int) -> int:
        if value not in self._at:
            self._at[value] = (self._values == value).arg_true().to_list()
        at = self._at[value]
        return bisect.bisect_left(at, stop) - bisect.bisect_left(at, start)


def value_token(value: float | None) -> object:
    return "nan" if value is not None and math.isnan(value) else value


def learning_signals(keys: set[str]) -> tuple[str | None, list[str]]:
    """Among ``keys``: the loss, and what drives it (gradient norm, advantages, the reward spread
    in a group), sorted. All exactly zero at a step means a dead batch."""
    loss = first_key(keys, ("actor_loss/avg", "pg_loss", "/loss", "loss"))
    signals = sorted(
        k
        for k in keys
        if k.endswith("grad_norm")
        or ("advantages/" in k and k.rsplit("/", 1)[-1] in {"avg", "min", "max", "mean"})
        or k.endswith(("reward/std", "score/std"))
    )
    return loss, signals


def dead_learning(metrics: pl.DataFrame, t: Thresholds, last_step: int | None = None) -> list[Finding]:
    """Steps with no learning signal, of two kinds, from one pass over the loss and what drives it:

    - dead batches (``zero_variance``): the loss is exactly zero and so is everything that would
      drive it (gradient norm, advantages, the spread of rewards in a group). A zero loss with a
      live gradient is cosmetic and not reported.
    - a dead loss (``dead_loss``): the loss exactly zero though what drives it is alive (rewards
      that differ within a group, advantages not zero) and no gradient norm says it is live: the
      loss itself is broken — log-probs or a loss mask zeroed (seed 003: "if loss is exactly 0,
      something is broken").

    A stretch counts when it is improbable under the run's history, or when the run never had
    a live step again after its first (a short hand-rolled run that died at iteration 1). A step
    past ``last_step``, the run's last logged one, is one the log ends in the middle of (a loop
    printing a step's line when it is done): it counts, and is said to be unfinished.
    """
    loss, signals = learning_signals(metric_keys(metrics)[0])
    if not (loss and signals):
        return []
    grads = [k for k in signals if k.endswith("grad_norm")]
    drivers = [k for k in signals if k not in grads]
    value, key = pl.col("value"), pl.col("key")
    wide = (
        metrics.lazy()
        .filter(key.is_in([loss, *signals]) & pl.col("step").is_not_null())
        .group_by("step")
        .agg((value == 0).all().alias("dead"), key.n_unique().alias("n"),
             ((key == loss) & (value == 0)).any().alias("zero"), (key == loss).any().alias("logged"),
             (key.is_in(grads) & (value != 0)).any().alias("gradient"), (key.is_in(drivers) & (value != 0)).any().alias("driven"))
        .sort("step")
        .collect()
    )
    batches = wide.filter(pl.col("n") == 1 + len(signals))
    shown = next((k for k in sorted(signals) if k.endswith("reward/std")), loss)
    said = (f"{loss} and {', '.join(sorted(signals))} all exactly 0 (dead batches: every reward in a group identical, "
            "nothing to learn from)")
    found = _streaks(_flags(batches["dead"]), batches["step"].to_list(), t, last_step, "zero_variance", shown, said)
    if not drivers:
        return found
    losses = wide.filter("logged")
    said = f"{loss} exactly 0 while {', '.join(drivers)} did not: the loss itself is dead (log-probs or the loss mask zeroed)"
    # Only as a change from a live loss: GRPO's on-policy surrogate can print 0 from the start by
    # construction (ratio 1, advantages summing to 0 in each group) while its gradient is live.
    dead = losses.select(pl.col("zero") & pl.col("driven") & ~pl.col("gradient")).to_series()
    return found + _streaks(_flags(dead), losses["step"].to_list(), t, last_step, "dead_loss", loss, said, live_before=t.min_run)


def _flags(dead: pl.Series) -> list[float]:
    return [1.0 if d else 0.0 for d in dead.to_list()]


def _streaks(flags: list[float], steps: list[int], t: Thresholds, last_step: int | None, kind: str, metric: str,
             said: str, live_before: int = 0) -> list[Finding]:
    """A finding per stretch of flagged steps improbable under the run's history, or never followed
    by an unflagged step after the first (a short run that died at iteration 1); with
    ``live_before``, only a stretch after that many unflagged steps."""
    dead_before = [0, *itertools.accumulate(int(f) for f in flags)]
    findings = []
    i = 0
    while i < len(flags):
        run = _run_length(flags, i)
        never_again = i <= 1 and i + run == len(flags) and run >= 2 and not live_before
        live = i - dead_before[i] >= live_before
        warmup = i == 0 and run < len(flags) and first_steps(steps)  # the run's first steps, live after: as a collapse's
        if flags[i] == 1.0 and live and not warmup and (never_again or (run >= t.min_run and improbable(dead_before[i], i, run, t.chance))):
            final = steps[i + run - 1]
            unfinished = f" (the last, step {final}, unfinished when the log ends)" if last_step is not None and final > last_step else ""
            end = steps[i + run] if i + run < len(steps) else None
            findings.append(Finding(kind, metric, steps[i], end, f"{run} steps in a row{unfinished} with {said}"))
        i += run
    return findings


#: The keys whose non-finite values mean the training numbers diverged (besides the reward).
NUMERIC_HEALTH = r"grad_norm$|actor_loss/avg$|pg_loss$|(?:^|/)loss$"
#: Those keys named in a line that quotes one (a table row, ``step N: key = nan``, ``pg_loss=nan``).
NUMERIC_HEALTH_IN_TEXT = r"(?:grad_norm|actor_loss/avg|pg_loss|(?:^|[\s/│|])loss)(?:[\s│|=:,]|$)"
#: A reward named in such a line.
REWARD_IN_TEXT = r"(?i)reward|score"


def non_finite(metrics: pl.DataFrame, primary: str | None, t: Thresholds) -> list[Finding]:
    """Loss, gradient norm or reward non-finite for several steps in a row."""
    keys = [k for k in sorted(metric_keys(metrics)[0]) if k == primary or re.search(NUMERIC_HEALTH, k)]
    if not keys:
        return []
    flags_frame = (
        metrics.lazy()
        .filter(pl.col("key").is_in(keys) & pl.col("step").is_not_null())
        .group_by("step")
        .agg((~pl.col("value").is_finite()).any().alias("bad"), pl.col("key").filter(~pl.col("value").is_finite()).unique().alias("bad_keys"))
        .sort("step")
        .collect()
    )
    flags = [1.0 if b else 0.0 for b in flags_frame["bad"].to_list()]
    steps = flags_frame["step"].to_list()
    i = 0
    while i < len(flags):
        run = _run_length(flags, i)
        if flags[i] == 1.0 and run >= t.nan_run:
            end = steps[i + run] if i + run < len(steps) else None
            # Named after what went non-finite: the reward when it did, else the first of the others by name.
            bad = sorted(str(k) for k in flags_frame["bad_keys"][i])
            metric = primary if primary in bad else bad[0]
            went = ", ".join(bad)
            return [Finding("nan_inf", metric, steps[i], end, f"non-finite {went} for {run} steps from step {steps[i]}",
                            non_finite=tuple(bad))]
        i += run
    return []


def stall(steps: pl.DataFrame, events: pl.DataFrame, durations: pl.DataFrame, t: Thresholds,
          others: pl.DataFrame | None = None) -> Finding | None:
    """The step log stopped while other logs went on: the silence after the last step is far
    longer than the run's own step time, and something was logged in it — a warning or an error,
    or any timed line of ``others`` (metric rows of logs that log no step: a server still answering
    its health checks while the trainer hangs says as much as one timing out).
    """
    if steps.is_empty() or steps["time"].null_count() == steps.height:
        return None
    last = steps.filter(pl.col("time").is_not_null()).sort("step").row(-1, named=True)
    typical = float(durations["seconds"].median()) if not durations.is_empty() else 0.0
    limit = max(t.stall_factor * typical, t.stall_min_seconds)
    after = events.filter(pl.col("time") > last["time"])
    failures = after.filter(pl.col("severity").is_in(["warning", "error", "fatal"]))
    if failures.height and (after["time"].max() - last["time"]).total_seconds() > limit:
        until, said, seen = after["time"].max(), f"while {failures.height} warnings/errors were logged", None
    else:
        went_on = others.filter(pl.col("time") > last["time"]) if others is not None else None
        if went_on is None or went_on.is_empty():
            return None
        seen = went_on.sort("time", "line").row(-1, named=True)
        until = seen["time"]
        said = f"while {Path(str(seen['file'])).name} went on logging" + ("" if failures.height else ", with no warning or error")
    silence = (until - last["time"]).total_seconds()
    if silence <= limit:
        return None
    return Finding(
        "stall",
        None,
        int(last["step"]) + 1,
        None,
        f"no step after step {last['step']} for {silence / 3600:.1f} h {said}",
        last_step_time=last["time"],
        until=until,
        seen=seen,
    )


#: The server a line names: ``10.0.0.5:30002/generate``, ``http://10.0.0.5:30002``, ``('10.0.0.5', 30002)``.
_ADDRESS = r"(\d{1,3}(?:\.\d{1,3}){3}|localhost)(?::|'?,\s*)(\d{2,5})\b"


def server_named(message: pl.Expr) -> pl.Expr:
    """``host:port`` of the server ``message`` names, or null."""
    return pl.concat_str(message.str.extract(_ADDRESS, 1), pl.lit(":"), message.str.extract(_ADDRESS, 2))


def launches(events: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame:
    """The server launch and ready lines of ``events``, each with ``at``: the ``host:port`` it
    names (null where none), the server its log launched. The launcher's line listing every
    server (``AREAL_LLM_SERVER_ADDRS=``) names none of them."""
    lines = events.lazy().filter(pl.col("kind").is_in(["server_launch", "server_ready"])
                                 & ~pl.col("message").str.contains("AREAL_LLM_SERVER_ADDRS=", literal=True).fill_null(False))
    return lines.with_columns(server_named(pl.col("message")).alias("at")).collect()


def server_in(text: str) -> str | None:
    """``host:port`` of the server one line names, or ``None`` (as :func:`server_named`)."""
    found = re.search(_ADDRESS, text)
    return f"{found[1]}:{found[2]}" if found else None


#: What the trainer logs when it calls a server that is not there.
_CALLING = ("connection_refused", "connection_reset", "retries_exhausted", "workflow_failed", "request_timeout")


def servers_down(events: pl.DataFrame, t: Thresholds, steps: pl.DataFrame | None = None, planned: int | None = None,
                 named: Callable[[], pl.Series] | None = None) -> list[Finding]:
    """An inference server that exited while the trainer went on calling it — for at least
    ``t.server_down_minutes``, no server launched on its address in that time. With several
    servers the reward falls only part of the way, or not at all: no number shows it, the logs do.
    One finding per exit; it ends at the step the server came back in, if it did. Once the run
    logged all ``planned`` steps (its ``steps``), an exit after the last is its teardown.

    ``named``: gives the server each of ``events`` names, where the caller reads it for more than
    this (a flood's lines are read once); asked only once a server exited. Without it, the calls
    after an exit are read for it."""
    at = server_named(pl.col("message")).alias("at")
    dated = events.lazy().filter(pl.col("time").is_not_null())
    exits = dated.filter((pl.col("kind") == "server_exit") & pl.col("step").is_not_null()).sort("time").with_columns(at).collect()
    if steps is not None and steps.height and planned is not None and int(steps["step"].max()) >= planned:
        exits = exits.filter(~_after(_logged_last(steps)))
    if exits.is_empty():
        return []
    up = launches(dated)
    # An exit line naming no server (``SIGTERM received``) is of the server its own log launched: the
    # calls to another node's server are not calls to it.
    launched = up.filter(pl.col("at").is_not_null()).select(pl.col("file").cast(pl.String), "time", pl.col("at").alias("launched"))
    if launched.height and exits["at"].null_count():
        exits = (exits.with_columns(pl.col("file").cast(pl.String).alias("_file")).sort("time")
                 .join_asof(launched.sort("time"), on="time", by_left="_file", by_right="file", strategy="backward",
                            check_sortedness=False)  # (both sorted by time above)
                 .with_columns(pl.coalesce("at", "launched").alias("at")).drop("_file", "launched"))
    # (only calls after an exit are read for the server they name: a flood before it can be millions)
    calls = events.lazy().with_row_index("row").filter(pl.col("time").is_not_null() & pl.col("kind").is_in(_CALLING)
                                                      & (pl.col("time") > exits["time"].min()))
    if named:  # (a flood after an exit is millions of calls: only their time and server are kept)
        calls = calls.select("row", "time").collect()
        calls = calls.with_columns(named()[calls["row"]].alias("at"))
    else:
        calls = calls.collect()
        calls = calls.with_columns(_servers_called(calls))
    found: list[Finding] = []
    for death in exits.iter_rows(named=True):
        same = pl.lit(True) if death["at"] is None else pl.col("at").is_null() | (pl.col("at") == death["at"])
        back = up.filter(same & (pl.col("time") > death["time"])).sort("time").head(1)
        until = back["time"][0] if back.height else None
        called = calls.filter(same & (pl.col("time") > death["time"]) & ((pl.col("time") < until) if until else pl.lit(True)))
        if called.is_empty() or any(f.onset_step <= death["step"] and (f.end_step is None or death["step"] < f.end_step) for f in found):
            continue
        gone = (called["time"].max() - death["time"]).total_seconds()  # type: ignore[operator]
        if gone < t.server_down_minutes * 60:
            continue
        server = f"the inference server {death['at']}" if death["at"] else "the inference server"
        end = int(back["step"][0]) if back.height and back["step"][0] is not None else None
        found.append(Finding("server_down", None, int(death["step"]), end,
                             f"{server} exited during step {death['step']} and the trainer kept calling it for "
                             f"{gone / 60:.0f} min ({called.height} failed calls logged), "
                             + (f"until a server came up again in step {end}" if end is not None else "with no server launched in its place"),
                             failed_at=death["time"]))
    return found


def servers_named(events: pl.DataFrame, read: pl.Series | None, where: pl.Expr | None = None) -> pl.Series:
    """The server each of ``events`` names (categorical, null for none), ``where`` it is asked for:
    in its message, or in its line where a flood's text was not held (``read``: :func:`server_named`
    over the lines read back, see :func:`forensics.texts.from_lines`). Only held messages are
    searched: a column of a flood's millions of null texts costs hundreds of megabytes a step."""
    asked = events.select((pl.lit(True) if where is None else where).fill_null(False)).to_series()
    held = asked & events["message"].is_not_null()
    found = events.filter(held).select(server_named(pl.col("message")).cast(pl.Categorical)).to_series()
    named = pl.repeat(None, events.height, dtype=pl.Categorical, eager=True).alias("at").scatter(held.arg_true(), found)
    if read is None:
        return named
    return named.fill_null(read if where is None else pl.select(pl.when(asked).then(read)).to_series())


def _servers_called(calls: pl.DataFrame) -> pl.Series:
    """The server each call names, its lines read back where their text was not held."""
    read = from_lines(calls, {"at": server_named(pl.col("message")).cast(pl.Categorical)})
    return servers_named(calls, None if read is None else read["at"])


#: Events that mean a training process died or a collective hung for good.
CRASH_KINDS = (
    "actor_died", "worker_died", "host_oom_kill", "segfault", "fatal_check", "illegal_memory_access",
    "nccl_timeout", "nccl_error", "raylet_died", "node_dead", "gcs_unreachable", "job_exit",
)
#: Killed with no word of why (a shell's bare ``Killed``): a crash when the trainer's own log says
#: it; an inference server's is that server's failure, told by its cause.
_KILLED = "process_killed"
_SERVER_FILES = ("llm_server", "sglang", "vllm")


_SCHEDULER = "] Scheduler hit an exception"


def from_server(kinds: Sequence[str]) -> pl.Expr:
    """Whether an event of one of ``kinds`` was logged by an inference server (its file's name, or
    its reader's); false for other kinds. Only those rows' file names are read as text: a flood's
    millions of other rows would each have theirs copied out of the category."""
    mine = pl.col("kind").is_in(kinds)
    # (by the file's own name: a run kept under /data/sglang-exps/ is no server's log for it)
    named = pl.when(mine).then(pl.col("file")).cast(pl.String).str.extract(r"([^/\\]*)$").str.contains("|".join(_SERVER_FILES))
    # (SGLang's scheduler in a console it shares: verl's rollout server actor forwarded by Ray)
    scheduler = pl.when(mine).then(pl.col("message")).str.contains(_SCHEDULER, literal=True)
    return mine & (named.fill_null(False) | (pl.col("source") == "sglang") | scheduler.fill_null(False))


def crashes(steps: pl.DataFrame, events: pl.DataFrame, planned: int | None = None) -> list[Finding]:
    """A training worker died (or a collective hung), reported even when no metric moved.

    One finding per step in which a crash happened; a crash in or after the last logged step ended
    the run, one before it was survived (the run logged steps again). Once the run logged all
    ``planned`` steps, failures after the last are its teardown, and one in the last was survived.
    """
    dead = events.filter((pl.col("kind").is_in(CRASH_KINDS) | ((pl.col("kind") == _KILLED) & ~from_server([_KILLED])))
                         & pl.col("step").is_not_null())
    last = int(steps["step"].max()) if not steps.is_empty() else None
    finished = planned is not None and last is not None and last >= planned
    if finished:
        dead = dead.filter(~_after(_logged_last(steps)))
    if dead.is_empty():
        return []
    # A failure placed in the last logged step and one after it are the same one placed by line
    # order (verl prints a step's line after its workers' output got through): one finding, at the
    # step the run did not finish, not a survived crash and a fatal one.
    crashed: list[tuple[int, set[str], bool]] = []
    for step, kinds in dead.group_by("step").agg(pl.col("kind").unique()).sort("step").iter_rows():
        kinds, ended = set(kinds), not finished and (last is None or step >= last)
        if ended and crashed and crashed[-1][2]:
            crashed[-1] = (int(step), crashed[-1][1] | kinds, True)
        else:
            crashed.append((int(step), kinds, ended))
    fate = {True: "and the run logged no step after it", False: "and the run went on"}
    return [
        Finding("crash", None, step, None if ended else (min(step + 1, last) if finished else step + 1),
                f"a training process failed during step {step} ({', '.join(sorted(kinds))}) "
                + ("and the run still logged every step it was launched for" if finished and step == last else fate[ended]))
        for step, kinds, ended in crashed
    ]


def died_before_relaunch(finding: Finding, steps: pl.DataFrame, gaps: pl.DataFrame, events: pl.DataFrame) -> Finding:
    """A crash in the step an attempt died in, a relaunch then going back to an earlier step
    (``gaps``: :func:`forensics.align.relaunch_gaps`): the attempt's, not the run's own history —
    the relaunch logged that step again. Told as such, its abandoned steps in ``redone``, and
    ``until`` when the run (``steps``, its own copies) was back where it failed."""
    if finding.kind != "crash":
        return finding
    for gap in (gaps.filter(pl.col("died_in") == finding.onset_step).iter_rows(named=True) if gaps.height else ()):
        failed = events.filter((pl.col("step") == finding.onset_step) & pl.col("severity").is_in(["error", "fatal"])
                               & pl.col("time").is_between(gap["after"], gap["before"], closed="right"))
        kinds = ", ".join(sorted(set(failed.filter(pl.col("kind").is_in(CRASH_KINDS))["kind"])))
        if not kinds:
            continue
        first, resumed = int(gap["first"]), int(gap["resumed"])
        back = steps.filter(pl.col("step") == finding.onset_step - 1)["time"].drop_nulls()
        return _abandoned_by(finding, kinds, first, resumed, failed_at=failed["time"].min(), last_step_time=gap["after"],
                             until=back.max() if len(back) else None)
    return _died_before_a_resume_line(finding, events)


def _died_before_a_resume_line(finding: Finding, events: pl.DataFrame) -> Finding:
    """Where the step log has no times (a verl console), by line order: the crash's own lines, then
    in the same log a resume line (``run_resumed``, its step the first the relaunch logged) going
    back to the step the attempt died in or before it."""
    failed = events.filter((pl.col("step") == finding.onset_step) & pl.col("time").is_null() & pl.col("kind").is_in(CRASH_KINDS))
    resumes = events.filter((pl.col("kind") == "run_resumed") & (pl.col("step") <= finding.onset_step))
    for (file,), lines in failed.group_by("file", maintain_order=True):
        resume = resumes.filter((pl.col("file") == file) & (pl.col("line") > lines["line"].max())).sort("line").head(1)
        if resume.height:
            resumed = int(resume["step"][0])
            return _abandoned_by(finding, ", ".join(sorted(set(lines["kind"].cast(pl.String)))), resumed, resumed)
    return finding


def _abandoned_by(finding: Finding, kinds: str, first: int, resumed: int, **when: Any) -> Finding:
    """``finding``, a crash in an attempt a relaunch from before it abandoned: the relaunch took the
    run on from step ``resumed`` and logged steps ``first``… up to the one it died in again."""
    taken = (f"a relaunch from step {resumed - 1} took the run on from step {resumed}" if resumed > 1
             else "the run was started again from its first step")
    lost = (f"logged steps {first}–{finding.onset_step - 1} again" if finding.onset_step - 1 > first
            else f"logged step {first} again")
    return replace(finding, end_step=finding.onset_step + 1, redone=(first, finding.onset_step - 1), **when,
                   summary=f"a training process failed during step {finding.onset_step} ({kinds}) in an attempt "
                           f"the run abandoned: {taken} and {lost}")


#: How a traceback event's message starts: Python's first line, or Ray's for a task's error.
_TRACEBACK_START = r"^(?:\[rank\d+\]: )?(?:Traceback \(most recent call last\)|Unhandled error \(suppress with|Possible unhandled error from worker)"
#: A traceback the run's own processes printed (the inference server's are its own failures),
#: whatever it ended in: one ending in an error the readers know takes that error's kind
#: (``cuda_oom``, ``nccl_error``, …) and keeps its first line as its message...
RUN_TRACEBACK = (
    ((pl.col("kind") == "traceback") | pl.col("message").str.contains(_TRACEBACK_START))
    & (pl.col("source") != "sglang")
).fill_null(False)
#: ...and one begun by a Ctrl-C (a message names the exceptions after ``… ``, the first first):
#: whoever pressed it stopped the run, whatever it raised next.
CTRL_C = pl.col("message").str.contains(r"^[^…]*… (?:\[rank\d+\]: )?KeyboardInterrupt\b").fill_null(False)


def ended_by_exception(steps: pl.DataFrame, events: pl.DataFrame, planned: int | None = None) -> Finding | None:
    """The run's last logged act was the trainer's own uncaught exception: a traceback after the
    step it logged last, no step after it. Tracebacks a run logged and went on from are events,
    not this; nor is a Ctrl-C (and what it raised while stopping), the server's traceback, or one
    once the run logged all ``planned`` steps."""
    if steps.is_empty() or (planned is not None and int(steps["step"].max()) >= planned):
        return None
    last = _logged_last(steps)
    raised = events.filter(RUN_TRACEBACK & _after(last)).sort("time", "line", nulls_last=True)
    beside = raised.is_empty() and (raised := events.filter(RUN_TRACEBACK & _undated_beside(last)).sort("line")).height > 0
    if raised.is_empty() or raised.select(CTRL_C.first()).item():
        return None
    step, first = last["step"] + 1, raised.row(0, named=True)
    summary = uncaught_summary(step, first["message"])
    if beside:
        summary += (f" (its traceback is undated, in {Path(first['file']).name}, the stderr of the process whose stdout "
                    "holds the steps: taken as that process's last act)")
    return Finding("crash", None, step, None, summary, failed_at=first["time"] or last["time"],
                   raised=(first["file"], first["line"]) if beside else None)


def stopped_by_hand(steps: pl.DataFrame, events: pl.DataFrame) -> bool:
    """Whether the run's last act was a Ctrl-C (a ``KeyboardInterrupt`` traceback of its own after
    the step it logged last): whoever pressed it stopped the run, and the silence after is no stall."""
    if steps.is_empty():
        return False
    raised = events.filter(RUN_TRACEBACK & _after(_logged_last(steps)))
    return raised.height > 0 and raised.select(CTRL_C.any()).item()


def abandoned_by_exception(steps: pl.DataFrame, events: pl.DataFrame, gaps: pl.DataFrame) -> list[Finding]:
    """Attempts whose last act was the trainer's own uncaught exception, a relaunch then going back
    to an earlier step (``gaps``: :func:`forensics.align.relaunch_gaps`): a crash in the step each
    died in, the attempt's (as :func:`ended_by_exception` tells the run's own last)."""
    found = []
    for gap in gaps.iter_rows(named=True) if gaps.height else ():
        died = int(gap["died_in"])
        last_words = events.filter(RUN_TRACEBACK & (pl.col("step") == died)
                                   & pl.col("time").is_between(gap["after"], gap["before"], closed="both")).sort("time", "line")
        if last_words.is_empty() or last_words.select(CTRL_C.first()).item():
            continue
        first = last_words.row(0, named=True)
        back = steps.filter(pl.col("step") == died - 1)["time"].drop_nulls()
        crash = Finding("crash", None, died, None, uncaught_summary(died, first["message"]))
        kind = str(first["kind"]) if first["kind"] != "traceback" else "an uncaught exception"  # (the exception is told after)
        found.append(_abandoned_by(crash, kind, int(gap["first"]), int(gap["resumed"]),
                                   failed_at=first["time"], last_step_time=gap["after"], until=back.max() if len(back) else None))
    return found


def raised(message: str | None) -> str:
    """The exception a traceback event's message names: what follows its first line (both of a
    Ctrl-C chain's, the Ctrl-C first; see :func:`parsers.schema.traceback_message`)."""
    return re.sub(r"^\[rank\d+\]: ", "", (message or "").split("… ", 1)[-1].strip())  # (torchrun's prefix is no part of it)


def uncaught_summary(step: int, message: str | None) -> str:
    """What a run ended by its own exception during ``step`` is told, the exception named."""
    exception = raised(message)[:160] or "a traceback"
    return f"an uncaught exception during step {step} ({exception}), and the run logged no step after it"


def _after(last: dict[str, Any]) -> pl.Expr:
    """Events logged after the step row ``last``: later than it, or below its line in its file (an
    undated line borrows the time of the dated one above it, which may be that step's own)."""
    after = (pl.col("file") == last["file"]) & (pl.col("line") > last["line"])
    return after | (pl.col("time") > last["time"]).fill_null(False) if last["time"] is not None else after


def _undated_beside(last: dict[str, Any]) -> pl.Expr:
    """Undated events in the stderr twin (``.err``) of the ``.out`` that holds the step row ``last``
    (a Ray worker's two streams): one process's output, in no order against each other."""
    out = str(last["file"] or "").removesuffix(".gz")
    if not out.endswith(".out"):
        return pl.lit(False)
    err = out.removesuffix(".out") + ".err"
    return pl.col("file").is_in([err, err + ".gz"]) & pl.col("time").is_null()


def _logged_last(steps: pl.DataFrame) -> dict[str, Any]:
    """The row of the step logged last (a relaunch logs lower steps after higher ones)."""
    return steps.sort("time", "line", nulls_last=False).row(-1, named=True)


def _run_length(values: list[float], i: int) -> int:
    n = 1
    while i + n < len(values) and same_value(values[i + n], values[i]):
        n += 1
    return n


def same_value(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return a == b or (math.isnan(a) and math.isnan(b))


def finite_value(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


#: A reward climbed to 1.0 when the median of its last steps before it (a window) was this high.
_CLIMBED = 0.75


def saturated(value: float, best: float, recent: Sequence[float]) -> bool:
    """Is a reward held at ``value`` at its ceiling rather than collapsed: 1.0, every rollout right
    (the ceiling of the mean of 0/1 scores), never beaten (``best``: the highest finite value before
    it), and climbed to — the median of ``recent`` (the last values before it) ``_CLIMBED`` or more?
    A jump to it from far below stays suspect (a reward function returning 1 whatever), though a
    coarse reward touched 1.0 by chance before, and so does any other value held: where another
    reward's ceiling lies is not known."""
    if value != 1.0 or not recent or value < best:
        return False
    last = sorted(recent)
    return last[len(last) // 2] >= _CLIMBED


class _Before:
    """What came before each position of a series: its best finite value, and its last finite values."""

    def __init__(self, values: list[float]) -> None:
        self._values = values
        self.best: list[float] = []
        running = -math.inf
        for v in values:
            self.best.append(running)
            if finite_value(v):
                running = max(running, v)

    def recent(self, at: int, window: int) -> list[float]:
        found: list[float] = []
        for v in reversed(self._values[max(0, at - 4 * window) : at]):  # (a few non-finite ones may be skipped)
            if finite_value(v):
                found.append(v)
                if len(found) == window:
                    break
        return found

    def saturated(self, at: int, window: int) -> bool:
        """Is the run of one value starting at ``at`` a reward at its ceiling (:func:`saturated`)?"""
        value = self._values[at]
        return value == 1.0 and saturated(value, self.best[at], self.recent(at, window))


def improbable(seen: int, history: int, run: int, chance: float) -> bool:
    """Would ``run`` consecutive repeats of a value seen ``seen`` times in ``history`` healthy
    steps be rarer than ``chance``, anywhere in them?

    The healthy frequency is smoothed (half a pseudo-observation) so a short history cannot
    make a value look impossible or certain. Such a run could have begun at any of the history's
    steps: a coarse metric (the mean of a few 0/1 rewards) repeats a common value eight times
    somewhere in thousands of steps by chance alone, a real collapse stays improbable whatever the count.
    """
    p = (seen + 0.5) / (history + 1.0)
    return p**run * max(history, 1) < chance


def _recovery(values: list[float], start: int, value: float, history: list[float], t: Thresholds) -> int | None:
    """Index of the first step of a full window that looks like the healthy history again: its
    values other than the collapsed one back ``t.recovery_level`` of the way from zero to the healthy
    median (from the lowest value seen, for a reward that goes below zero), the collapsed value no
    more frequent than in the history. A lone non-finite value (a glitch in the log) does not hold it back."""
    healthy = [v for v in history if finite_value(v) and not same_value(v, value)]
    # With no history (a log that begins collapsed), what the run scored after it is the measure.
    healthy = healthy or [v for v in values[start:] if finite_value(v) and not same_value(v, value)]
    if not healthy:
        return None
    median = sorted(healthy)[len(healthy) // 2]
    floor = min(0.0, value, min(healthy))
    level = floor + t.recovery_level * (median - floor)
    p = sum(1 for v in history if same_value(v, value)) / max(len(history), 1)
    allowed = math.floor(p * t.recovery_window + 2 * math.sqrt(max(p * (1 - p) * t.recovery_window, 0.0)))
    for j in range(start, len(values) - t.recovery_window + 1):
        window = values[j : j + t.recovery_window]
        if same_value(window[0], value) or not finite_value(window[0]) or sum(not finite_value(v) for v in window) > 1:
            continue
        stuck = sum(1 for v in window if same_value(v, value))
        others = [v for v in window if finite_value(v) and not same_value(v, value)]
        if stuck <= allowed and sum(others) / len(others) >= level:
            return j
    return None


def first_key(keys: set[str], suffixes: tuple[str, ...]) -> str | None:
    for suffix in suffixes:
        found = sorted(k for k in keys if k.endswith(suffix))
        if found:
            return found[0]
    return None
