"""Follow a live run and raise an alarm when an incident starts; replay a finished run as if live.

The offline detectors judge a whole run at once. Here the same ideas run online, one log
record at a time, in the order the run wrote them:

- ``reward_collapse``: the primary reward stuck at one exact value (zero, or any constant) for
  ``zero_steps`` steps in a row, and improbable under the run's recent healthy history;
- ``zero_variance``: loss and everything driving it exactly zero (dead batches);
- ``dead_loss``: a loss that was live exactly zero while what drives it is not (log-probs or the
  loss mask zeroed);
- ``nan_inf``: a non-finite loss, gradient norm or reward for several steps;
- ``server_errors``: a burst of refused/reset connections or of request timeouts;
- ``server_down``: the inference server exited, the trainer kept calling it, and no new server
  came up within ``server_down_minutes``;
- ``stall``: no new step for far longer than the run's own step time;
- ``crash``: a training process died or a collective hung, or the run raised an exception of its
  own after its newest step and logged no step in about two of its steps since.

Each rule is latched once it fires and re-armed only when the run looks healthy again, so one
incident is one alarm. A :class:`Watcher` polls the run's files (through the parse cache, so
each new line is parsed once); :func:`replay` feeds a finished run's records through the same
rules and says where each alarm would have fired.

Example:
    >>> results = replay([Path("tests/fixtures/areal_seed001/outputs")])  # doctest: +SKIP
    >>> results[0].alarms[0].step, results[0].last_step  # doctest: +SKIP
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
import math
import os
import re
import statistics
import time as _time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl

from forensics.analysis import analyze_run, planned_steps, timeouts_not_due, unseen_at_onset
from forensics.cache import ParseCache, default_cache_dir, folders_beyond
from forensics.causes import CAUSE_OF_KIND, TOGETHER_SECONDS, Attribution, explain
from forensics.detect import (
    CRASH_KINDS,
    CTRL_C,
    RUN_TRACEBACK,
    Finding,
    Thresholds,
    choose_primary,
    finite_value,
    first_key,
    improbable,
    learning_signals,
    metric_keys,
    reward_drops,
    same_value,
    saturated,
    server_in,
    uncaught_summary,
    value_token,
)
from forensics.discover import LEFT_BESIDE, PathArg, RunLocation, analyzed_tree, find_runs, within
from forensics.errors import NoCacheDir, NoRunsFound, PathNotFound, UnusableInput
from forensics.identity import Identity
from forensics.keys import ANALYSIS_KEYS
from forensics.model import FROM_THE_NUMBERS, Cause, Evidence, iso
from forensics.run import RunData, load_run, other_logs
from forensics.texts import iter_with_messages, table_row
from parsers._lines import ends_mid_line
from parsers.areal import NON_FINITE_ROW
from parsers.custom import CustomFormat
from parsers.schema import stream_of

ALARM_KINDS = ("reward_collapse", "reward_drop", "zero_variance", "dead_loss", "nan_inf", "server_errors", "server_down", "stall", "crash")
_REFUSALS = frozenset({"connection_refused", "connection_reset"})
_TIMEOUTS = frozenset({"request_timeout"})
_SERVER_UP = frozenset({"server_launch", "server_ready"})
_TRAINER_CALLING = _REFUSALS | _TIMEOUTS | {"workflow_failed", "retries_exhausted"}
#: A client's retry of a request that timed out (AReaL: ``… timed out after 600.00s (attempt 2/3)``;
#: verl: ``… timed out (attempt 2)``): the same request again, not another one failing.
_RETRY = re.compile(r"\(attempt ([2-9]|\d{2,})(?:/\d+)?\)")


@dataclass(frozen=True)
class WatchSettings:
    """The online rules' knobs; the defaults come from the seeds (see README, "Watching a live run")."""

    zero_steps: int = 5
    """The primary reward at one exact value this many steps in a row (at least) is a collapse."""
    warmup_steps: int = 10
    """A reward that has not varied since the run's first step is judged only after this many steps."""
    server_down_minutes: float = 5.0
    """A server gone this long with no relaunch, while the trainer still calls it."""
    refusal_burst: int = 5
    """Refused or reset connections within ``refusal_window_s`` that make a burst..."""
    refusal_window_s: float = 120.0
    timeout_burst: int = 3
    """...and request timeouts within ``timeout_window_s``."""
    timeout_window_s: float = 1800.0
    history_steps: int = 1000
    """The reward rule compares against at most this many recent healthy steps (memory stays flat)."""
    thresholds: Thresholds = field(default_factory=Thresholds)
    """Shared with the offline detectors: improbability, stall factor and floor, NaN run, recovery window."""

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "thresholds"}
        return {**out, **self.thresholds.to_dict()}


def alarm_key(run_id: str, kind: str, onset_step: int | None, instance: str = "") -> str:
    """What makes an alarm the same one after a restart of ``watch`` (see :func:`run_instance`)."""
    return f"{run_id}|{kind}|{onset_step}" + (f"|{instance}" if instance else "")


def run_instance(run: RunData) -> str:
    """Which run of its id ``run`` is: its folder and when it logged its first step. Two runs of one
    config in two folders, or a run launched anew where an earlier one's logs were deleted, fail
    at the same step each: each is alarmed."""
    first = run.steps["time"].min() if not run.steps.is_empty() else None
    return f"{run.location.root}|{iso(first) if first is not None else ''}"  # type: ignore[arg-type]


@dataclass(frozen=True)
class Alarm:
    """An incident that has started: what, at which step and time, why, and the lines that show it."""

    run_id: str
    kind: str
    step: int | None
    """The step at which the alarm fired (the step in progress for a log line)."""
    time: datetime | None
    onset_step: int | None
    """Where the incident began: the first zero step of a collapse, the step of the server's exit."""
    cause: Cause
    summary: str
    evidence: tuple[Evidence, ...] = ()
    confidence: float | None = None
    instance: str = ""
    """Which run of its id (:func:`run_instance`)."""

    @property
    def key(self) -> str:
        """What makes an alarm the same one after a restart of ``watch``."""
        return alarm_key(self.run_id, self.kind, self.onset_step, self.instance)

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "time": iso(self.time),
            "kind": self.kind,
            "cause": self.cause,
            "run_id": self.run_id,
            "onset_step": self.onset_step,
            "summary": self.summary,
            "confidence": self.confidence,
            "evidence": [e.to_dict() for e in self.evidence],
        }


@dataclass(frozen=True)
class ReplayResult:
    """One finished run replayed: the alarms in firing order, against the offline analysis."""

    run_id: str
    alarms: list[Alarm]
    last_step: int | None
    offline_onsets: list[tuple[str, int]]
    """``(kind, onset_step)`` of each incident the offline analysis found."""
    folded: list[Alarm] = field(default_factory=list)
    """Alarms not raised: their incident's alarms had already told their cause."""
    not_read: list[str] = field(default_factory=list)
    """The run's files that could not be read (``path: why``): no alarm could come from them."""

    def to_dict(self) -> dict[str, Any]:
        first = self.alarms[0].step if self.alarms else None
        return {
            "run_id": self.run_id,
            "first_alarm_step": first,
            "last_step": self.last_step,
            "offline_onsets": [{"kind": k, "onset_step": s} for k, s in self.offline_onsets],
            "folded": [{"kind": a.kind, "step": a.step, "onset_step": a.onset_step, "cause": a.cause} for a in self.folded],
            "not_read": self.not_read,
        }


def replay(
    paths: PathArg | Iterable[PathArg], *, settings: WatchSettings | None = None, custom_format: CustomFormat | None = None
) -> list[ReplayResult]:
    """Every run under ``paths`` replayed as if followed live: which alarms would have fired, where.

    Raises:
        PathNotFound, NoRunsFound: nothing usable at ``paths``.
    """
    s = settings or WatchSettings()
    results = []
    for location in find_runs(paths, custom_format=custom_format):
        run = load_run(location, custom_format=custom_format, keys=ANALYSIS_KEYS)
        follower = _Follower(location.run_id, s)
        triggers = follower.feed(run) + follower.at_end(run)
        alarms, folded, attributed = [], [], Attribution(_own_events(run))
        for trigger in triggers:
            alarm = _alarm(run, trigger, as_of_trigger=True, attributed=attributed)
            (alarms if follower.new_news(trigger, alarm) else folded).append(alarm)
        alarms = list({a.key: a for a in reversed(alarms)}.values())[::-1]  # as the watcher: once per key
        offline = analyze_run(run, s.thresholds)
        last = int(run.steps["step"].max()) if not run.steps.is_empty() else None
        results.append(ReplayResult(location.run_id, alarms, last, [(i.kind, i.onset_step) for i in offline.incidents], folded,
                                    _not_read(location)))
    return results


class Watcher:
    """Follows the runs under ``path``: each :meth:`poll` reads what the logs grew by and returns
    the alarms that are new. Alarms already raised (kept in ``state_dir``) are never raised again.

    On its first poll a watcher reads the run's history; an incident found there alarms only when
    it is still going on (a reward still collapsed, a server still down), not when it is over.
    """

    def __init__(
        self,
        path: PathArg,
        *,
        settings: WatchSettings | None = None,
        state_dir: PathArg | None = None,
        custom_format: CustomFormat | None = None,
        clock: Callable[[], float] = _time.monotonic,
    ) -> None:
        self.path = Path(path)
        self.settings = settings or WatchSettings()
        self.state_dir = Path(state_dir) if state_dir is not None else default_state_dir(self.path)
        _refuse_inside(self.state_dir, self.path)
        self._custom_format = custom_format
        self._cache = ParseCache(self.state_dir / "cache")
        self._clock = clock
        self._followers: dict[str, _Follower] = {}
        self._runs: dict[str, RunData] = {}
        self._loaded: dict[tuple[str, str], tuple[str, RunData]] = {}
        self._state = _State(self.state_dir / "alarms.json")
        self.folded: list[Alarm] = []
        """Alarms not raised: their incident's alarms had already told their cause."""
        self.notices: list[str] = []
        """What the last poll could not read, each said once (a log it may not read, a pipe, no run
        there yet): a watch that reads nothing guards nothing, and must say so."""
        self._said: set[str] = set()

    def poll(self) -> list[Alarm]:
        """Read what is new and return the alarms raised by it (nothing while no run is there yet)."""
        self.notices = []
        try:
            locations = find_runs([self.path], custom_format=self._custom_format)
        except (NoRunsFound, PathNotFound) as exc:
            self._notice(f"{exc} (looking again at each poll)")
            return []
        for location in locations:
            for problem in _not_read(location):
                self._notice(f"not read: {problem}")
        raised: list[Alarm] = []
        for location in locations:
            run = self._load(location)
            instance = run_instance(run)
            self._runs[instance] = run
            follower = self._followers.get(instance)
            catching_up = follower is None
            if follower is None:
                follower = self._followers[instance] = _Follower(location.run_id, self.settings)
            triggers = follower.feed(run, live_now=self._clock())
            current = triggers
            if catching_up:  # of the history, only the incidents still going on: the last of each kind, if open
                last = {t.kind: t for t in triggers}
                current = [t for t in last.values() if follower.still_open(t.kind)]
            attributed = Attribution(_own_events(run))
            for trigger in triggers:
                if not any(trigger is t for t in current):
                    # (history a watch before this one raised: what it told folds what follows, as it did then)
                    if self._state.has(alarm_key(location.run_id, trigger.kind, trigger.onset_step, instance)):
                        follower.new_news(trigger, _alarm(run, trigger, as_of_trigger=False, attributed=attributed))
                    continue
                alarm = _alarm(run, trigger, as_of_trigger=False, attributed=attributed)
                if not follower.new_news(trigger, alarm):
                    if alarm.key not in {a.key for a in self.folded}:  # (each once, as raised ones are)
                        self.folded.append(alarm)
                elif self._state.add(alarm):
                    raised.append(alarm)
        return raised

    def _load(self, location: RunLocation) -> RunData:
        """``location``'s run as the last poll loaded it when nothing it read has changed since (most
        polls of most runs: a parse cache's frames need not be read again), or loaded anew."""
        where = (location.run_id, str(location.root))
        key = self._cache.inputs_key([location])
        kept = self._loaded.get(where)
        if kept is not None and kept[0] == key + _folders_key(location, kept[1]):
            return kept[1]
        run = load_run(location, custom_format=self._custom_format, cache=self._cache, keys=ANALYSIS_KEYS)
        self._loaded[where] = (key + _folders_key(location, run), run)
        return run

    def _notice(self, said: str) -> None:
        if said not in self._said:
            self._said.add(said)
            self.notices.append(said)

    def run(self, alarm: Alarm) -> RunData | None:
        """The frames of ``alarm``'s run as of the last poll (for a report written at alarm time)."""
        return self._runs.get(alarm.instance)

    def follow(self, on_alarm: Callable[[Alarm], bool], *, interval: float = 30.0, timeout: float | None = None,
               on_notice: Callable[[str], None] | None = None) -> int:
        """Poll every ``interval`` seconds; hand each alarm to ``on_alarm``, stop after a poll one of
        whose alarms it returned ``False`` for, or after ``timeout`` seconds. Every alarm of that
        poll is handed over all the same: the state has them as raised, and a restarted watch does
        not raise them again. Each of :attr:`notices` goes to ``on_notice``. Returns how many
        alarms were raised."""
        started = self._clock()
        count = 0
        while True:
            go_on = True
            alarms = self.poll()
            for notice in self.notices if on_notice is not None else ():
                on_notice(notice)
            for alarm in alarms:
                count += 1
                go_on = on_alarm(alarm) and go_on
            if not go_on:
                return count
            if timeout is not None and self._clock() - started + interval > timeout:
                return count
            _time.sleep(interval)


def _folders_key(location: RunLocation, run: RunData) -> str:
    """The identity of the folders ``run``'s checkpoints were listed in outside the checkpoint
    folder found beside its logs (a save folder a log named): an inputs key does not cover them."""
    keyed = [location.checkpoint_dir] if location.checkpoint_dir else []
    folders = folders_beyond(run.checkpoints["path"].to_list(), keyed, [run.save_folder_named])
    return "".join(f"\0{folder}\0{Identity.text_of(folder)}" for folder in folders)


def _not_read(location: RunLocation) -> list[str]:
    """The files of a run found that could not be read (``path: why``); not those only left beside
    a log given by name."""
    return [problem for problem in location.skipped if LEFT_BESIDE not in problem]


def default_state_dir(path: Path) -> Path:
    """``<cache dir>/watch/<hash of the resolved path>/``: never inside the watched tree."""
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    try:
        return default_cache_dir() / "watch" / digest
    except NoCacheDir as exc:
        raise NoCacheDir(f"{exc}, or give --state-dir") from None


# -- online rules ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Trigger:
    """A rule that fired, before its cause is named."""

    kind: str
    step: int | None
    time: datetime | None
    onset_step: int | None
    summary: str
    evidence: tuple[Evidence, ...]
    metric: str | None = None
    incident: int = 0
    """Which incident it tells of: a rule firing while another's alarm is still going on tells of
    the same one (a hang's timeouts after its collapse), and says something new only by its cause."""
    non_finite: tuple[str, ...] = ()
    """For ``nan_inf``: the keys non-finite at its first step."""
    fell_by: int | None = None
    """For ``reward_drop``: the step by which a slow decline had fallen (:attr:`Finding.fell_by`)."""


@dataclass(frozen=True)
class _Roles:
    """Which metric keys the step rules read."""

    primary: str | None
    loss: str | None
    signals: tuple[str, ...]
    """What drives the loss: gradient norm, advantages, the reward spread in a group."""
    grad: str | None

    @property
    def keys(self) -> list[str]:
        return sorted({k for k in (self.primary, self.loss, self.grad, *self.signals) if k})


@dataclass(frozen=True)
class _Step:
    step: int
    time: datetime | None
    file: str
    line: int
    values: dict[str, float]
    where: dict[str, tuple[str, int]]
    written: datetime | None = None
    """When its line was written, as well as its log tells: the newest time the log had stamped
    by then (a clock set back stamps later lines earlier)."""


@dataclass
class _Flags:
    """Steps flagged or not (dead batches, a dead loss), fed one at a time: the streak going on,
    the flags of the steps before it (not while an alarm on them is going on), and how many steps
    were not flagged."""

    history: deque[bool]
    streak: _Streak = field(default_factory=lambda: _Streak())
    unflagged: int = 0

    def see(self, flagged: bool, row: _Step, alarmed: bool) -> None:
        if self.streak.length and not same_value(flagged, self.streak.value) and not alarmed:
            self.history.extend([bool(self.streak.value)] * self.streak.length)
        self.streak.extend(flagged, row)
        self.unflagged += not flagged

    def improbable(self, chance: float) -> bool:
        """The streak going on, improbable under the history's rate of flagged steps."""
        return improbable(sum(self.history), len(self.history), self.streak.length, chance)


@dataclass
class _Streak:
    """Consecutive steps sharing one property (one exact value, or "dead", or "non-finite")."""

    value: Any = None
    length: int = 0
    first: _Step | None = None

    def extend(self, value: Any, row: _Step) -> None:
        if self.length and same_value(value, self.value):
            self.length += 1
        else:
            self.value, self.length, self.first = value, 1, row


class _Level:
    """The primary reward's last values in the attempt being followed (``kept`` of them: memory
    stays flat), where each was logged, and what the drop rule's quick look needs: the best mean of
    three windows, the spread of one value from the next."""

    def __init__(self, kept: int, window: int) -> None:
        self.kept, self.window = kept, window
        self.wide = 3 * window  # (the detector's widest window, as :class:`forensics.detect._Levels` takes it)
        self.rows: deque[_Step] = deque(maxlen=kept)
        self._last: deque[float] = deque(maxlen=self.wide)
        self._best = -math.inf
        self._low = 0.0  # the lowest level seen, as far as it is under zero: a reward's scale
        self._squares = 0.0
        self._seen = 0
        self._judged_at = 0

    def add(self, row: _Step, key: str) -> None:
        value = row.values[key]
        if self._last:
            self._squares += (value - self._last[-1]) ** 2
        # (only what the evidence needs of the step: its values of other keys would weigh on memory)
        self.rows.append(_Step(row.step, row.time, row.file, row.line, {key: value}, {key: row.where[key]} if key in row.where else {}))
        self._last.append(value)
        self._seen += 1
        if len(self._last) == self.wide:
            self._best = max(self._best, sum(self._last) / self.wide)
        if len(self._last) >= self.window:
            self._low = min(self._low, self._mean(self.window))

    def forget_from(self, step: int, key: str) -> None:
        kept = [r for r in self.rows if r.step < step]
        self.__init__(self.kept, self.window)  # type: ignore[misc]
        for r in kept:
            self.add(r, key)

    def frame(self, key: str) -> pl.DataFrame:
        return pl.DataFrame({"step": [r.step for r in self.rows], "value": [r.values[key] for r in self.rows]},
                            schema={"step": pl.Int64, "value": pl.Float64})

    def _mean(self, last: int) -> float:
        return statistics.fmean(itertools.islice(reversed(self._last), last))

    def _fallen(self, share: float) -> bool:
        return self._mean(self.window) - self._low < share * (self._best - self._low)

    def worth_judging(self, t: Thresholds) -> bool:
        """Could the detector find a drop under way: the last window's mean under the drop's share of
        the best, by about as much noise as a drop needs? A short series is always judged; a long
        one at most every fifth step."""
        n = self._seen
        if n < 4 * 8:
            return False
        if n >= self.wide:
            noise = math.sqrt(self._squares / (n - 1) / 2 / self.window)
            if not self._fallen(t.drop_level) or self._best - self._mean(self.window) < 0.5 * t.drop_noise * noise:
                return False
            if n - self._judged_at < 5:
                return False
        self._judged_at = n
        return True

    def back(self, t: Thresholds) -> bool:
        """The last window's mean is back over the share of the best a drop recovers at."""
        return self._seen >= self.wide and not self._fallen(t.drop_recovery)


#: How far back from the newest step fed the steps fed are remembered (the watcher's memory stays
#: bounded): a clock set back goes an hour, a rotated copy's steps are older.
_FED_KEPT = timedelta(days=1)


class _Follower:
    """The online rules for one run, fed records in the order the run wrote them."""

    def __init__(self, run_id: str, settings: WatchSettings) -> None:
        self.run_id = run_id
        self.s = settings
        self.t = settings.thresholds
        # where the feed stopped
        self._last_step_time: datetime | None = None
        self._last_step: int | None = None
        self._last_row: _Step | None = None
        self._held: tuple[int, int] | None = None
        self._held_time: datetime | None = None
        """The newest step's time while its table is held back: the run was alive then."""
        self._held_where: tuple[str, int] | None = None
        """The held step's header (file, line): the last thing the run logged."""
        self._recent: dict[tuple[Any, ...], datetime | None] = {}
        self._event_marks: dict[str, datetime] = {}
        """Each log's (its rotated parts one) newest event time fed: a log synced from a server's
        node arrives minutes behind the trainer's, and its lines are no older for it."""
        # the clock: the newest log time, moved on by wall time while the logs are silent
        self._log_now: datetime | None = None
        self._log_now_at: float | None = None
        self._wall: float | None = None
        # rules
        self._latched: dict[str, Any] = {}
        self._incidents = 0
        self.told: dict[int, set[str]] = {}
        """What each incident's alarms have told: their causes, and ``numbers`` once one was on the numbers."""
        self._roles = _Roles(None, None, (), None)
        self._reward = _Streak()
        self._history: deque[Any] = deque(maxlen=settings.history_steps)
        self._best_of: tuple[Any, int] | None = None  # (the streak, the history's length) _best was judged for
        self._best = False
        self._history_counts: Counter[Any] = Counter()
        self._varied = False
        self._since_collapse = 0
        self._collapse_onset: int | None = None
        """The step the latched reward collapse began at."""
        self._level = _Level(settings.history_steps, settings.thresholds.drop_window)
        self._collapses: list[Finding] = []
        """This attempt's reward collapses, as the drop rule passes over them (offline's, as alarmed)."""
        self._dead = _Flags(deque(maxlen=settings.history_steps))
        self._dead_loss = _Flags(deque(maxlen=settings.history_steps))
        self._bad = _Streak()
        self._durations: deque[float] = deque(maxlen=200)
        self._step_times: deque[tuple[datetime, int]] = deque(maxlen=2000)
        """Recent steps' times, to name the step an alarm's time fell in: live, steps logged after
        that time may already have been read when the clock gets there."""
        self._steps_seen = 0
        self._refusals: deque[tuple[datetime, Evidence]] = deque()
        self._timeouts: deque[tuple[datetime, Evidence]] = deque()
        self._requests_timed_out: deque[datetime] = deque()  # (first attempts only: see _burst)
        self._errors_quiet_since: datetime | None = None
        self._exit: Evidence | None = None
        self._called_after_exit = False
        self._launching = False
        self._raised: tuple[Evidence, bool] | None = None
        """The first traceback of the run's own after its newest step, and whether it was a Ctrl-C."""
        self._finished = False
        self._planned: int | None = None
        self._stopped_by_hand = False
        """A Ctrl-C's traceback after the last step: the silence after it is no stall."""
        """The run logged every step it was launched for: a traceback after it is its teardown."""
        self._fed = pl.DataFrame(schema={"step": pl.Int64, "time": pl.Datetime("ms")})
        """The timed steps fed, by number and time stamp."""
        self._dormant = False
        """Its logs were last written long ago (a trial stopped days ago beside the live one): over,
        not stalled, until it writes again."""

    # -- feeding ----------------------------------------------------------------------------------

    def feed(self, run: RunData, *, live_now: float | None = None) -> list[_Trigger]:
        """Feed what ``run`` holds that was not fed before; ``live_now`` (a monotonic clock) makes
        silence count while the logs say nothing, and holds back the newest step until its table
        is surely complete."""
        self._wall = live_now
        catching_up = live_now is not None and self._steps_seen == 0 and self._log_now is None
        # (a few stats a poll: written to again, a dormant run is watched as a live one)
        silent = _silent_for(run) if live_now is not None else 0.0
        self._dormant = silent > DORMANT_AFTER.total_seconds()
        if not run.steps.is_empty():
            last = int(run.steps["step"].max())
            self._planned = planned_steps(run.facts, last)
            self._finished = self._planned is not None and last >= self._planned
        steps = self._new_steps(run, live=live_now is not None)
        events = self._new_events(_own_events(run).with_columns(RUN_TRACEBACK.alias("own"), CTRL_C.alias("ctrl_c")))
        fired: list[_Trigger] = []
        for kind, record in _in_log_order(steps, events):
            if kind == "step":
                fired += self._told(self._on_step, record)
            else:
                fired += self._told(self._on_event, record)
        if catching_up and self._log_now_at is not None and not self._dormant:
            # (a watch started, or started again, on a run already silent: the silence began when its
            # logs were last written, not when this watch first read them)
            self._log_now_at -= silent
        if live_now is not None:
            fired += self._told(self._tick, self._now(live_now))
        return fired

    def _told(self, rule: Callable[[Any], list[_Trigger]], record: Any) -> list[_Trigger]:
        """What ``rule`` fires on ``record``, each trigger marked with the incident it tells of:
        a new one when no alarm was going on, else the one going on."""
        going_on = bool(self._latched)
        fired = rule(record)
        if fired and not going_on:
            self._incidents += 1
        return [replace(t, incident=self._incidents) for t in fired]

    def at_end(self, run: RunData | None = None) -> list[_Trigger]:
        """The logs are over (a replay): a traceback of the run's own with no step after it ended
        the run; else the clock runs on to the last line ``run``'s other logs wrote (a server
        answering on after the trainer went silent is a stall, as offline)."""
        if self._raised is not None and not self._raised[1] and "crash" not in self._latched:
            return self._told(self._uncaught, self._raised[0].time)
        seen = other_logs(run)["time"].max() if run is not None else None
        if seen is None or (self._log_now is not None and seen <= self._log_now):
            return []
        return self._told(self._tick, seen)

    def new_news(self, trigger: _Trigger, alarm: Alarm) -> bool:
        """Whether ``alarm`` says something its incident's alarms have not: a cause new to it (a
        server seen down after a hang is; the hang's timeouts after its collapse are not), or the
        first word of what the numbers did (a collapse after the server errors that caused it)."""
        told = self.told.setdefault(trigger.incident, set())
        news = {alarm.cause} | ({"numbers"} if alarm.kind in FROM_THE_NUMBERS else set())
        if news <= told:
            return False
        told |= news
        return True

    def still_open(self, kind: str) -> bool:
        """Whether the incident behind the last alarm of ``kind`` is still going on."""
        return kind in self._latched

    def _new_steps(self, run: RunData, *, live: bool) -> list[_Step]:
        # Every copy of a step, as the run wrote them: an attempt a relaunch abandoned went by live too.
        steps = run.step_copies
        if steps["time"].null_count() == 0:
            # Told apart by what they say, not by where the clock was: a clock set back (an NTP
            # step, a DST fall-back) stamps new steps before ones fed, and a rotated copy is no new step.
            steps = _in_write_order(steps)
            if self._fed.height:
                # (kept for a day back from the newest: a clock goes back an hour, not days; older
                # steps are of a rotated copy, fed long ago)
                floor = self._fed["time"].max() - _FED_KEPT
                steps = steps.filter(pl.col("time") >= floor).join(self._fed, on=["step", "time"], how="anti", maintain_order="left")
        else:
            # A log without times is fed in its own order (an attempt a relaunch abandoned before the relaunch).
            steps = steps.sort("file", "line").with_columns(pl.lit(None, pl.Datetime("ms")).alias("written"))
            if self._last_step is not None:
                steps = steps.filter(pl.col("step") > self._last_step)
        self._roles = _roles(run.metrics)
        if live and steps.height:
            # The newest step's table may still be arriving: wait until a later step or the next poll,
            # for as long as its log ends inside a line (a block-buffered writer's half-written
            # line, ``critic/score/mean:0.`` of ``0.3125``, read now would be a wrong value), and
            # while it holds none of the values watched (its table not written yet: a slow disk).
            newest = steps.row(-1, named=True)
            ident = (newest["step"], newest["line"])
            unread = not _values(run.metrics, self._roles.keys, steps["step"].tail(1)).get(newest["step"], ({}, {}))[0]
            if self._held != ident or ends_mid_line(newest["file"]) or unread:
                self._held, self._held_time, self._held_where = ident, newest["time"], (newest["file"], newest["line"])
                steps = steps.head(steps.height - 1)
        if steps.is_empty():
            return []
        fed = pl.concat([self._fed, steps.filter(pl.col("time").is_not_null()).select("step", "time")])
        self._fed = fed.filter(pl.col("time") >= fed["time"].max() - _FED_KEPT) if fed.height else fed
        values = _values(run.metrics, self._roles.keys, steps["step"])
        earlier = _values(run.superseded, self._roles.keys, steps["step"], by_line=True) if run.superseded.height else {}
        return [
            _Step(r["step"], r["time"], r["file"], r["line"],
                  *earlier.get((r["step"], r["file"], r["line"]), values.get(r["step"], ({}, {}))), r["written"])
            for r in steps.iter_rows(named=True)
        ]

    def _new_events(self, events: pl.DataFrame) -> list[dict[str, Any]]:
        """Events not fed before, told apart by content so a rotated or recompressed copy of a log
        is not fed twice; records older than their log's high-water mark by more than a slack are old."""
        slack = timedelta(minutes=10)
        events = events.with_columns(stream_of(pl.col("file")).alias("_stream"))
        if self._event_marks:
            marks = pl.DataFrame({"_stream": list(self._event_marks), "_mark": list(self._event_marks.values())},
                                 schema={"_stream": pl.String, "_mark": pl.Datetime("ms")})
            events = (events.join(marks, on="_stream", how="left", maintain_order="left")
                      .filter(pl.col("time").is_null() | pl.col("_mark").is_null() | (pl.col("time") >= pl.col("_mark") - slack))
                      .drop("_mark"))
        fresh = []
        for row in (row for part in iter_with_messages(events) for row in part.iter_rows(named=True)):
            log = row.pop("_stream")
            key = (row["time"], row["kind"], row["message"]) if row["time"] else (Path(row["file"]).name, row["line"])
            if key in self._recent:
                continue
            self._recent[key] = row["time"]
            fresh.append(row)
            if row["time"] and (log not in self._event_marks or row["time"] > self._event_marks[log]):
                self._event_marks[log] = row["time"]
        if self._event_marks and len(self._recent) > 10_000:
            floor = min(self._event_marks.values()) - slack
            self._recent = {k: t for k, t in self._recent.items() if t is None or t >= floor}
            if len(self._recent) > 100_000:  # untimed records only: keep the newest
                self._recent = dict(list(self._recent.items())[-50_000:])
        return fresh

    def _now(self, wall: float) -> datetime | None:
        if self._log_now is None or self._log_now_at is None:
            return self._log_now
        return self._log_now + timedelta(seconds=max(0.0, wall - self._log_now_at))

    def _advance(self, when: datetime | None) -> None:
        if when is not None and (self._log_now is None or when > self._log_now):
            self._log_now, self._log_now_at = when, self._wall

    # -- steps ------------------------------------------------------------------------------------

    def _on_step(self, row: _Step) -> list[_Trigger]:
        fired = self._tick(row.time) if row.time else []
        if self._stopped_by_hand and self._raised is not None and (row.time is None or self._raised[0].time is None
                                                                   or row.time > self._raised[0].time):
            self._stopped_by_hand = False  # (a step after the Ctrl-C, not one held back from before it: relaunched)
        if row.time is not None and row.written is not None and row.time < row.written:
            # Its log's clock was set back: the clock goes back with it (the steps after stamped
            # earlier are no silence)
            self._log_now, self._log_now_at = row.time, self._wall
        self._advance(row.time)
        if row.time and self._last_step_time and row.time > self._last_step_time:
            self._durations.append((row.time - self._last_step_time).total_seconds())
        self._last_step_time = row.time or self._last_step_time
        relaunched = row.step is not None and self._last_step is not None and row.step <= self._last_step
        if self._collapse_onset is not None and row.step is not None and row.step <= self._collapse_onset and "reward_collapse" in self._latched:
            # A relaunch went back to before the collapse (a checkpoint saved before it): a new
            # attempt, watched afresh; one from a checkpoint saved during it carries it on.
            del self._latched["reward_collapse"]
            self._reward = _Streak()
        self._last_step, self._last_row = row.step, row
        if row.time is not None and row.step is not None:
            self._step_times.append((row.time, row.step))
        self._steps_seen += 1
        self._latched.pop("stall", None)  # the run logged a step: it is moving again
        # ... and past a crash only with a step after the one it failed in: Ray forwards a worker's
        # output late, so the step the crash ended can reach the console after the death did.
        # A relaunch going back is a new attempt: its own crash is a new one.
        crashed = self._latched.get("crash")
        if row.step is None or crashed is None or crashed < row.step or relaunched:
            self._latched.pop("crash", None)
        if self._exit is not None:
            self._called_after_exit = True
        if self._raised is not None and _logged_after(row, self._raised[0]):
            self._raised = None  # the run went on from it
        primary = self._roles.primary
        if primary is not None and primary in row.values:
            fired += self._reward_rule(row, primary)
            fired += self._drop_rule(row, primary)
        fired += self._dead_rule(row)
        fired += self._dead_loss_rule(row)
        fired += self._nan_rule(row)
        return fired

    def _reward_rule(self, row: _Step, key: str) -> list[_Trigger]:
        value = row.values[key]
        streak = self._reward
        if streak.length and not same_value(value, streak.value):
            self._varied = True
            if "reward_collapse" not in self._latched:
                for _ in range(streak.length):
                    self._remember(streak.value)
        streak.extend(value, row)
        collapsed = self._latched.get("reward_collapse")
        if collapsed is not None:
            self._since_collapse = 0 if same_value(value, collapsed) else self._since_collapse + 1
            if self._since_collapse >= self.t.recovery_window:
                del self._latched["reward_collapse"]
                if self._collapses and row.step is not None:
                    self._collapses[-1] = replace(self._collapses[-1], end_step=row.step - self.t.recovery_window + 1)
                self._history.clear()
                self._history_counts.clear()
            return []
        if not (finite_value(value) and streak.length >= self.s.zero_steps):
            return []
        if self._varied:
            seen = self._history_counts[value_token(value)]
            if self._at_best():
                return []
            if not improbable(seen, len(self._history), streak.length, self.t.chance):
                return []
            # ...and under the last steps' rate: a rising reward's common value is rarer in all its history.
            recent = [value_token(v) for v in itertools.islice(reversed(self._history), self.t.recent_steps)]
            if not improbable(recent.count(value_token(value)), len(recent), streak.length, self.t.chance):
                return []
        elif streak.length < self.s.warmup_steps:
            return []
        self._latched["reward_collapse"] = value
        self._since_collapse = 0
        first = streak.first or row
        self._collapse_onset = first.step
        if first.step is not None:
            self._collapses.append(Finding("reward_collapse", key, first.step, None, ""))
        described = "exactly zero" if value == 0 else f"stuck at {value:.4g}"
        summary = f"{key} {described} for {streak.length} steps in a row (steps {first.step}–{row.step})"
        if not self._varied:
            summary += ", and it has not varied since the run's first step"
        evidence = (_metric_evidence(first, key), _metric_evidence(row, key)) if first is not row else (_metric_evidence(row, key),)
        return [_Trigger("reward_collapse", row.step, row.time, first.step, summary, evidence, key)]

    def _drop_rule(self, row: _Step, key: str) -> list[_Trigger]:
        """The reward's level fell well under its best and has stayed there to this step: judged as
        offline (:func:`reward_drops`) on this attempt's values, whenever a cheap look at its last
        values allows one. A collapse going on tells it already; a relaunch going back forgets the steps it logs again."""
        value = row.values[key]
        if row.step is None or not finite_value(value):
            return []
        level = self._level
        if level.rows and row.step <= level.rows[-1].step:
            level.forget_from(row.step, key)
            self._collapses = [c for c in self._collapses if c.onset_step < row.step]
            if self._latched.get("reward_drop", -1) >= row.step:
                del self._latched["reward_drop"]
        level.add(row, key)
        dropped = self._latched.get("reward_drop")
        if dropped is not None:
            if level.back(self.t):
                del self._latched["reward_drop"]
            return []
        if "reward_collapse" in self._latched or not level.worth_judging(self.t):
            return []
        found = [f for f in reward_drops(level.frame(key), key, self.t, self._collapses) if f.end_step is None]
        if not found:
            return []
        drop = found[-1]
        self._latched["reward_drop"] = drop.onset_step
        first = next((r for r in level.rows if r.step == drop.onset_step), None)
        evidence = (_metric_evidence(first, key), _metric_evidence(row, key)) if first is not None else (_metric_evidence(row, key),)
        summary = drop.summary.replace(", and never recovered", f", and is still there at step {row.step}")
        return [_Trigger("reward_drop", row.step, row.time, drop.onset_step, summary, evidence, key, fell_by=drop.fell_by)]

    def _at_best(self) -> bool:
        """The reward held at the best it had reached (every rollout right): a solved task, whose
        batches all scoring alike are no collapse and no dead batches. Judged once a streak: the
        history does not change while it lasts."""
        streak = self._reward
        if streak.value != 1.0 or not self._varied:
            return False
        if self._best_of != (streak.first, len(self._history)):
            recent = [v for v in itertools.islice(reversed(self._history), 4 * self.t.recovery_window) if finite_value(v)]
            best = max((v for v in self._history if finite_value(v)), default=math.inf)
            self._best_of, self._best = (streak.first, len(self._history)), saturated(1.0, best, recent[: self.t.recovery_window])
        return self._best

    def _remember(self, value: Any) -> None:
        if len(self._history) == self._history.maxlen:
            self._history_counts[value_token(self._history[0])] -= 1
        self._history.append(value)
        self._history_counts[value_token(value)] += 1

    def _dead_rule(self, row: _Step) -> list[_Trigger]:
        roles = self._roles
        loss = row.values.get(roles.loss) if roles.loss else None
        signals = [row.values.get(k) for k in roles.signals]
        if loss is None or not signals or None in signals:
            return []
        dead = loss == 0 and all(v == 0 for v in signals)
        flags = self._dead
        flags.see(dead, row, "zero_variance" in self._latched)
        if not dead:
            self._latched.pop("zero_variance", None)
            return []
        if "zero_variance" in self._latched or "reward_collapse" in self._latched or self._at_best():
            return []  # dead batches are what a collapsed reward looks like: one alarm is enough
        # Never a live step since the first update: no learning signal at all, not a warm-up effect.
        # Dead from the very first step, a sparse task may just not have earned anything yet: as a
        # reward constant from the start, judged after the warm-up.
        streak = flags.streak
        never_live = (flags.unflagged == 1 and streak.length >= 2) or (
            flags.unflagged == 0 and streak.length >= max(2, self.s.warmup_steps))
        if not (never_live or (streak.length >= self.t.min_run and flags.improbable(self.t.chance))):
            return []
        summary = (f"{streak.length} steps in a row (from step {(streak.first or row).step}) with the loss and everything "
                   "driving it exactly 0: every reward in a group identical, nothing to learn from")
        return [self._loss_alarm("zero_variance", row, streak, summary, None)]

    def _dead_loss_rule(self, row: _Step) -> list[_Trigger]:
        """As offline: the loss exactly 0 while what drives it (not a gradient norm) is not, after
        ``min_run`` steps of a live loss (GRPO's surrogate can print 0 from the start), for
        ``min_run`` steps and improbably under the run's history."""
        roles = self._roles
        loss = row.values.get(roles.loss) if roles.loss else None
        drivers = [row.values[k] for k in roles.signals if k in row.values and not k.endswith("grad_norm")]
        if loss is None or not drivers:
            return []
        gradient = any(row.values[k] != 0 for k in roles.signals if k in row.values and k.endswith("grad_norm"))
        dead = loss == 0 and any(v != 0 for v in drivers) and not gradient
        flags = self._dead_loss
        flags.see(dead, row, "dead_loss" in self._latched)
        if not dead:
            self._latched.pop("dead_loss", None)
            return []
        streak = flags.streak
        if "dead_loss" in self._latched or flags.unflagged < self.t.min_run or streak.length < self.t.min_run:
            return []
        if not flags.improbable(self.t.chance):
            return []
        summary = (f"{roles.loss} exactly 0 for {streak.length} steps in a row (from step {(streak.first or row).step}) "
                   "while the rewards still differed: the loss itself is dead (log-probs or the loss mask zeroed)")
        return [self._loss_alarm("dead_loss", row, streak, summary, roles.loss)]

    def _loss_alarm(self, kind: str, row: _Step, streak: _Streak, summary: str, metric: str | None) -> _Trigger:
        """``kind`` latched, and its trigger: the loss's rows at the streak's first step and this one as evidence."""
        self._latched[kind] = True
        first = streak.first or row
        loss = self._roles.loss
        return _Trigger(kind, row.step, row.time, first.step, summary, (_metric_evidence(first, loss), _metric_evidence(row, loss)), metric)

    def _nan_rule(self, row: _Step) -> list[_Trigger]:
        roles = self._roles
        watched = [row.values[k] for k in (roles.loss, roles.grad, roles.primary) if k in row.values]
        if not watched:
            return []
        bad = not all(finite_value(v) for v in watched)
        self._bad.extend(bad, row)
        if not bad:
            self._latched.pop("nan_inf", None)
            return []
        if "nan_inf" in self._latched or self._bad.length < self.t.nan_run:
            return []
        self._latched["nan_inf"] = True
        first = self._bad.first or row
        # (named and cited as offline: the reward when it went non-finite, else the first other by name)
        went = sorted(k for k in {roles.loss, roles.grad, roles.primary} if k in first.values and not finite_value(first.values[k]))
        named = roles.primary if roles.primary in went else went[0] if went else roles.loss or roles.primary
        return [_Trigger("nan_inf", row.step, row.time, first.step,
                         f"non-finite {', '.join(went) or 'loss/gradient/reward'} for {self._bad.length} steps from step {first.step}",
                         (_metric_evidence(first, named),), roles.primary, non_finite=tuple(went))]

    # -- events -----------------------------------------------------------------------------------

    def _on_event(self, row: dict[str, Any]) -> list[_Trigger]:
        when = row["time"]
        fired = self._tick(when) if when else []
        self._advance(when)
        kind = row["kind"]
        evidence = _event_evidence(row)
        if kind in _SERVER_UP:
            gone, up = (server_in(self._exit.text) if self._exit else None), server_in(row["message"])
            if gone and up and gone != up:
                return fired  # another server came up: the dead one is still dead, still called (as offline)
            # A new server: what the old one refused says nothing about it, and clients are refused
            # while it loads.
            self._launching = kind == "server_launch"
            self._exit = None
            self._called_after_exit = False
            self._refusals.clear()
            self._timeouts.clear()
            self._requests_timed_out.clear()
            for latched in ("server_down", "server_errors"):
                self._latched.pop(latched, None)
            return fired
        if kind == "server_exit":
            if self._exit is None and "server_down" not in self._latched:
                self._exit, self._called_after_exit = evidence, False
            return fired
        if kind in _TRAINER_CALLING and self._exit is not None:
            self._called_after_exit = True
        if kind in _TRAINER_CALLING and self._raised is not None and row["file"] == self._raised[0].file:
            self._raised = None  # the process that printed the traceback is still at work: it caught it
        if kind in CRASH_KINDS:
            return fired + self._crash(row, evidence)
        if row["own"] and self._steps_seen and self._raised is None and not self._finished:
            self._raised = (evidence, row["ctrl_c"])
            self._stopped_by_hand = bool(row["ctrl_c"])
        if when is not None and kind in _REFUSALS | _TIMEOUTS:
            fired += self._burst(kind, when, row, evidence)
        return fired

    def _crash(self, row: dict[str, Any], evidence: Evidence) -> list[_Trigger]:
        if "crash" in self._latched:
            return []
        if self._after_the_end(row):
            return []
        self._latched["crash"] = row["step"]
        summary = f"a training process failed during step {row['step']} ({row['kind']})"
        return [_Trigger("crash", row["step"], row["time"], row["step"], summary, (evidence,))]

    def _after_the_end(self, row: dict[str, Any]) -> bool:
        """Whether ``row`` comes after every step the run was launched for, once they are all logged
        (the newest held back too): its teardown (a server stopped under clients still calling it), as offline."""
        latest = self._latest_step()[1]
        return (self._planned is not None and latest is not None and latest >= self._planned
                and row["step"] is not None and row["step"] > latest)

    def _uncaught(self, at: datetime | None) -> list[_Trigger]:
        assert self._raised is not None
        evidence, self._raised = self._raised[0], None
        step = (self._latest_step()[1] or 0) + 1
        self._latched["crash"] = step
        return [_Trigger("crash", step, at, step, uncaught_summary(step, evidence.text), (evidence,))]

    def _burst(self, kind: str, when: datetime, row: dict[str, Any], evidence: Evidence) -> list[_Trigger]:
        if self._after_the_end(row):
            return []
        refused = kind in _REFUSALS
        window = self._refusals if refused else self._timeouts
        seconds = self.s.refusal_window_s if refused else self.s.timeout_window_s
        needed = self.s.refusal_burst if refused else self.s.timeout_burst
        self._errors_quiet_since = when
        window.append((when, evidence))
        while window and (when - window[0][0]).total_seconds() > seconds:
            window.popleft()
        # One slow request retried is one request timing out: a burst of timeouts is of two requests
        # at least. (A refusal retried is the server still not there, which is the point.)
        requests = self._requests_timed_out
        if not refused and not _RETRY.search(row["message"] or ""):
            requests.append(when)
        while requests and (when - requests[0]).total_seconds() > seconds:
            requests.popleft()
        if self._steps_seen == 0 or self._launching or "server_errors" in self._latched or len(window) < needed:
            return []  # before the first step, or while a server loads, clients are refused by design
        if not refused and len(requests) < 2:
            return []
        self._latched["server_errors"] = True
        what = "refused/reset connections" if refused else "request timeouts"
        first = window[0][1]
        summary = f"{len(window)} {what} within {_span(seconds)} (first at {iso(first.time)}, step {first.step})"
        return [_Trigger("server_errors", row["step"], when, first.step, summary, tuple(e for _, e in list(window)[:10]))]

    # -- the passing of time ------------------------------------------------------------------------

    def _latest_step(self) -> tuple[datetime | None, int | None]:
        """The newest step's time and number, counting one held back (its table may still be
        arriving): it was logged all the same, and the logs after it are no silence after the one before."""
        if self._held is not None and self._held_time is not None and (
                self._last_step_time is None or self._held_time > self._last_step_time):
            return self._held_time, self._held[0]
        return self._last_step_time, self._last_step

    def _step_before(self, at: datetime) -> int | None:
        """The newest step logged before ``at`` (the one an alarm at ``at`` came after), as a
        replay would have it; the newest step read when none is that old."""
        found = next(((when, step) for when, step in reversed(self._step_times) if when < at), None)
        held = self._held_time
        if self._held is not None and held is not None and held < at and (found is None or held > found[0]):
            return self._held[0]  # logged, its table maybe still arriving
        return found[1] if found is not None else self._latest_step()[1]

    def _tick(self, now: datetime | None) -> list[_Trigger]:
        if now is None:
            return []
        fired: list[_Trigger] = []
        if "server_errors" in self._latched and self._errors_quiet_since is not None:
            if (now - self._errors_quiet_since).total_seconds() > 2 * max(self.s.timeout_window_s, self.s.refusal_window_s):
                del self._latched["server_errors"]
        if self._exit is not None and self._exit.time is not None and self._called_after_exit and not self._after_the_end(
                {"step": self._exit.step}):
            down = (now - self._exit.time).total_seconds()
            if down >= self.s.server_down_minutes * 60 and "server_down" not in self._latched:
                self._latched["server_down"] = True
                at = self._exit.time + timedelta(minutes=self.s.server_down_minutes)
                summary = (f"the inference server exited at {iso(self._exit.time)} and no server came back within "
                           f"{_span(self.s.server_down_minutes * 60)} while the trainer kept calling it")
                last = self._step_before(at)
                step = last + 1 if last is not None else self._exit.step
                fired.append(_Trigger("server_down", step, at, self._exit.step, summary, (self._exit,)))
                self._exit = None
        if self._raised is not None and not self._raised[1] and self._raised[0].time is not None and "crash" not in self._latched:
            # A process that raised and died writes nothing more; one that caught it logs its next
            # step within about a step's time.
            wait = max(2 * statistics.median(self._durations), 120.0) if self._durations else self.t.stall_min_seconds
            if (now - self._raised[0].time).total_seconds() >= wait:
                fired += self._uncaught(self._raised[0].time + timedelta(seconds=wait))
        # (A run that logged every step it was launched for has nothing left to stall on.)
        if (self._last_step_time is not None and len(self._durations) >= 3 and "stall" not in self._latched and not self._finished
                and not self._dormant and not self._stopped_by_hand):
            typical = statistics.median(self._durations)
            limit = max(self.t.stall_factor * typical, self.t.stall_min_seconds)
            alive, last = self._latest_step()
            silent = (now - alive).total_seconds()
            if silent > limit:
                self._latched["stall"] = True
                step = (last or 0) + 1
                summary = (f"no step after step {last} for {_span(limit)} "
                           f"({limit / typical:.0f}× the run's median step of {typical:.0f} s)")
                at = alive + timedelta(seconds=limit)
                shown = (_metric_evidence(self._last_row, None),) if self._last_row else ()
                if last is not None and last != self._last_step and self._held_where is not None:  # (the step held back)
                    shown = (Evidence("metric", alive, last, *self._held_where, f"step {last} logged"),)
                fired.append(_Trigger("stall", step, at, step, summary, shown))
        return fired


#: How long before a live watch first reads a run its logs may have been written last for the run to
#: be one still going on: a run silent longer is over (stopped, preempted, finished without saying).
DORMANT_AFTER = timedelta(hours=24)


def _silent_for(run: RunData) -> float:
    """Seconds since any log of ``run`` was last written (by the files' times); 0 when unknown."""
    times = []
    for source in run.location.logs:
        try:
            times.append(os.stat(source.path).st_mtime)
        except OSError:
            continue
    return max(0.0, _time.time() - max(times)) if times else 0.0


# -- from a trigger to an alarm ---------------------------------------------------------------------


def _own_events(run: RunData) -> pl.DataFrame:
    """The run's logged events, not the table rows a reader quoted for a non-finite value: the
    watcher reads the values themselves."""
    return run.events.filter(~NON_FINITE_ROW.fill_null(False))


def _alarm(run: RunData, trigger: _Trigger, *, as_of_trigger: bool, attributed: Attribution) -> Alarm:
    """Name the trigger's cause as the offline analysis would, from what was logged up to it
    (for a crash, up to seconds after it: failures that land together are told apart as offline).
    ``attributed``: the run's events attributed, shared by the alarms of one poll or replay."""
    events, metrics, kept = attributed.events, run.metrics, None
    if as_of_trigger:
        horizon = trigger
        if trigger.kind == "crash" and trigger.time is not None:
            horizon = replace(trigger, time=trigger.time + timedelta(seconds=TOGETHER_SECONDS))
        kept = events.select(_logged_by(horizon, borrow=True)).to_series()
        events, metrics = events.filter(kept), _up_to(metrics, trigger)
    onset = trigger.onset_step if trigger.onset_step is not None else trigger.step
    finding_kind = trigger.kind if trigger.kind in ("stall", "crash", "nan_inf", "dead_loss", "reward_drop") else "reward_collapse"
    if onset is None:
        return Alarm(run.location.run_id, trigger.kind, trigger.step, trigger.time, onset, "unknown", trigger.summary,
                     trigger.evidence, instance=run_instance(run))
    # The copy of the onset step logged last before the alarm (a relaunch logs it again later).
    copies = run.step_copies.filter(pl.col("step") == onset)
    if trigger.time is not None:
        copies = copies.filter(pl.col("time").is_null() | (pl.col("time") <= trigger.time))
    copies = copies.sort("time", nulls_last=False)
    onset_time = copies["time"][-1] if copies.height else trigger.time
    has_server_log = any(s.kind in ("areal_server", "sglang_server") for s in run.location.logs)
    # (a crash told by the run's own traceback: that line, dated or not, is what stopped it, as offline)
    raised = next(((e.file, e.line) for e in trigger.evidence if e.kind == "traceback"), None) if trigger.kind == "crash" else None
    finding = Finding(finding_kind, trigger.metric, onset, None, trigger.summary, non_finite=trigger.non_finite, fell_by=trigger.fell_by,
                      raised=raised)
    # (as offline: where no log could have shown a failure at the onset, finding none is no finding)
    verdict = explain(finding, events, metrics, onset_time, has_server_log=has_server_log,
                      unseen=unseen_at_onset(run, finding, onset_time, events),
                      not_due=timeouts_not_due(run, finding, onset_time, events, trigger.time if as_of_trigger else None),
                      attributed=attributed.frame if kept is None else attributed.rows(kept))
    cause = verdict.cause
    if trigger.kind in ("server_errors", "server_down", "crash") and cause in ("unknown", "reward_pipeline"):
        cause = CAUSE_OF_KIND.get(trigger.evidence[0].kind, "unknown") if trigger.evidence else "unknown"
    if trigger.kind == "zero_variance" and cause == "unknown":
        cause = "reward_pipeline"
    shown = {(e.file, e.line) for e in trigger.evidence}
    extra = tuple(e for e in verdict.evidence if (e.file, e.line) not in shown)
    evidence = (trigger.evidence + extra)[:12]
    summary = trigger.summary if not verdict.explanation else f"{trigger.summary}. {verdict.explanation}"
    return Alarm(run.location.run_id, trigger.kind, trigger.step, trigger.time, trigger.onset_step, cause, summary,
                 evidence, verdict.confidence, run_instance(run))


def _up_to(frame: pl.DataFrame, trigger: _Trigger) -> pl.DataFrame:
    """The rows logged by the time of ``trigger``."""
    return frame.filter(_logged_by(trigger))


def _logged_by(trigger: _Trigger, *, borrow: bool = False) -> pl.Expr:
    """Whether a row was logged by the time of ``trigger``. ``borrow``: a row with no time of its own
    was logged after the dated line above it in its file, so is later than the trigger when that line is."""
    if trigger.time is not None:
        when = pl.col("time")
        if borrow:
            when = pl.coalesce(when, when.forward_fill().over("file", order_by="line"))
        return when.is_null() | (when <= trigger.time)
    if trigger.step is not None:
        return pl.col("step").is_null() | (pl.col("step") <= trigger.step)
    return pl.repeat(True, pl.len())


class _State:
    """Alarms raised so far for one watched path, kept as JSON in the state folder."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            self._raised: dict[str, dict[str, Any]] = json.loads(path.read_text(encoding="utf-8"))["raised"]
        except (OSError, ValueError, KeyError, TypeError):
            self._raised = {}

    def has(self, key: str) -> bool:
        """Whether the alarm of ``key`` (:attr:`Alarm.key`) was raised before."""
        return key in self._raised

    def add(self, alarm: Alarm) -> bool:
        """Record ``alarm``; ``False`` when it was raised before."""
        if alarm.key in self._raised:
            return False
        self._raised[alarm.key] = alarm.to_dict()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        staging = self.path.with_suffix(f".tmp-{os.getpid()}")
        staging.write_text(json.dumps({"raised": self._raised}, indent=1), encoding="utf-8")
        staging.replace(self.path)
        return True


def _refuse_inside(state_dir: Path, watched: Path) -> None:
    if within(state_dir, analyzed_tree(watched)):
        raise UnusableInput(f"--state-dir {state_dir} is inside the watched path {watched}; nothing is written there")


# -- small helpers ----------------------------------------------------------------------------------


def _in_write_order(copies: pl.DataFrame) -> pl.DataFrame:
    """Timed step copies in the order they were written, each with ``written``: the newest time its
    log had stamped by its line. A clock set back stamps the steps after it earlier than those
    before; by their own times they would fall among steps logged long before them."""
    return (copies.sort("file", "line")
            .with_columns(pl.col("time").cum_max().over("file").alias("written"))
            .sort("written", "step", "line"))


def _in_log_order(steps: list[_Step], events: list[dict[str, Any]]) -> Iterator[tuple[str, Any]]:
    """Steps and events merged in the order they were written: by time, else steps as given (in
    log order: a relaunch's copies after the attempt it abandoned) and each event just before the
    first step logged at or past its own (it belongs to the step in progress)."""
    header_time = {s.step: s.written or s.time for s in steps if s.time is not None}
    timed = bool(header_time)
    reached = list(itertools.accumulate((s.step if s.step is not None else -1 for s in steps), max))

    def key(item: tuple[int, str, Any]) -> tuple[Any, ...]:
        at, kind, r = item
        step = r.step if kind == "step" else r["step"]
        when = (r.written or r.time) if kind == "step" else r["time"]
        if timed:
            when = when or header_time.get(step) or datetime.max
            return (when, kind == "step")
        if kind == "step":
            return (at, 1)
        return (bisect.bisect_left(reached, step) if step is not None else math.inf, 0)

    items = [(i, "step", s) for i, s in enumerate(steps)] + [(0, "event", e) for e in events]
    return iter((kind, r) for _, kind, r in sorted(items, key=key))


def _logged_after(row: _Step, evidence: Evidence) -> bool:
    """Whether step ``row`` was logged after the line of ``evidence`` (in another file at the same
    or no time: taken as after, so that no crash is claimed from an order not known)."""
    if row.time is not None and evidence.time is not None and row.time != evidence.time:
        return row.time > evidence.time
    return row.file != evidence.file or row.line > evidence.line


def _roles(metrics: pl.DataFrame) -> _Roles:
    primary, _ = choose_primary(metrics)
    keys = metric_keys(metrics)[1]
    loss, signals = learning_signals(keys)
    return _Roles(primary, loss, tuple(signals), first_key(keys, ("grad_norm",)))


def _values(
    metrics: pl.DataFrame, keys: list[str], steps: pl.Series, *, by_line: bool = False
) -> dict[Any, tuple[dict[str, float], dict[str, tuple[str, int]]]]:
    """``{step: (values, (file, line) of each)}`` for the given steps (the latest copy of each
    value); ``by_line``: ``{(step, file, line): …}``, one entry per copy of a step (its header's line)."""
    if not keys:
        return {}
    rows = (
        metrics.filter(pl.col("key").is_in(keys) & pl.col("step").is_in(steps.implode()))
        .group_by("step", *(("file", "line") if by_line else ()), "key")
        .agg(pl.col("value").last(), pl.col("file").last().alias("at_file"), pl.col("line").last().alias("at_line"))
        .select("step", "key", "value", pl.col("at_file").cast(pl.String), "at_line")
    )
    out: dict[Any, tuple[dict[str, float], dict[str, tuple[str, int]]]] = {}
    for step, key, value, file, line in rows.iter_rows():
        values, where = out.setdefault((step, file, line) if by_line else step, ({}, {}))
        values[key], where[key] = value, (file, line)
    return out


def _metric_evidence(row: _Step, key: str | None) -> Evidence:
    file, line = row.where.get(key, (row.file, row.line)) if key else (row.file, row.line)
    value = row.values.get(key) if key else None
    text = f"step {row.step}: {key} = {value:.4e}" if value is not None else f"step {row.step} logged"
    return Evidence("metric", row.time, row.step, file, table_row(file, line, key) if key and value is not None else line, text)


def _event_evidence(row: dict[str, Any]) -> Evidence:
    return Evidence(row["kind"], row["time"], row["step"], row["file"], row["line"], row["message"] or "")


def _span(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"
