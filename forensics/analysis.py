"""``analyze(paths)``: files → frames → incidents, causes and a checkpoint recommendation.

Example:
    >>> from pathlib import Path
    >>> result = analyze([Path("tests/fixtures/areal_seed000/outputs")])  # doctest: +SKIP
    >>> result.runs[0].incidents[0].onset_step  # doctest: +SKIP
    940
"""

from __future__ import annotations

import math
import os
import re
import statistics
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import polars as pl

from forensics.advice import suggest
from forensics.align import relaunch_gaps, step_clock, step_durations
from forensics.cache import ParseCache
from forensics.causes import Attribution, explain
from forensics.checkpoints import recommend, to_checkpoints
from forensics.detect import (
    CRASH_KINDS,
    NUMERIC_HEALTH,
    REWARD_PARTS,
    RUN_TRACEBACK,
    Finding,
    Thresholds,
    abandoned_by_exception,
    abandoned_collapses,
    abandoned_dead_batches,
    ceilings,
    choose_primary,
    collapse_before_stop,
    crashes,
    dead_learning,
    died_before_relaunch,
    ended_by_exception,
    keys_matching,
    non_finite,
    raised,
    reward_collapses,
    reward_drops,
    series,
    servers_down,
    stall,
    stopped_by_hand,
    warm_up,
)
from forensics.discover import PathArg, RunLocation, as_paths, find_runs
from forensics.errors import UnusableInput
from forensics.model import (
    FROM_THE_NUMBERS,
    LOGS_UNREAD,
    STEPS_UNREAD,
    Analysis,
    Checkpoint,
    Evidence,
    Incident,
    Recommendation,
    RunAnalysis,
    data_lost,
    iso,
    step_span,
    unjudged,
)
from forensics.observations import slow_start
from forensics.readers import COPY_SOURCES
from forensics.run import RunData, load_online_wandb, load_run, other_logs
from forensics.texts import cited_row, with_messages
from parsers._formats import FormatDefinitionError
from parsers.areal import DATED_ABOVE, NON_FINITE_ROW
from parsers.custom import CustomFormat, load_custom_format
from parsers.schema import EVENT_SCHEMA, METRIC_SCHEMA, REWRITTEN, UNLISTED, conform, relaunches


def analyze(
    paths: PathArg | Iterable[PathArg],
    *,
    thresholds: Thresholds | None = None,
    custom_format: PathArg | None = None,
    wandb_runs: Sequence[str] = (),
    cache: ParseCache | None = None,
    keys: str | None = None,
) -> Analysis:
    """Analyze every run found under ``paths`` (one path or several, ``str`` or ``Path``), and
    hosted W&B runs by ``ENTITY/PROJECT/RUN_ID``.

    ``custom_format`` is a TOML file declaring how to read a hand-rolled trainer's log. With a
    ``cache`` (a folder outside the analyzed tree), unchanged files are not parsed again. ``keys``
    (a regex) keeps only the metrics whose key it finds something in: with
    :data:`~forensics.keys.ANALYSIS_KEYS`, as the command line does, the same findings from a
    fraction of a long run's rows; ``None`` keeps every metric in the runs' frames.

    Raises:
        PathNotFound, NoRunsFound: nothing usable at ``paths``.
        UnusableInput: a W&B run cannot be fetched (no package, key or network), or
            ``custom_format`` is malformed.
    """
    return Analysis(list(analyze_each(paths, thresholds=thresholds, custom_format=custom_format, wandb_runs=wandb_runs,
                                      cache=cache, keys=keys)))


def analyze_each(
    paths: PathArg | Iterable[PathArg],
    *,
    thresholds: Thresholds | None = None,
    custom_format: PathArg | None = None,
    wandb_runs: Sequence[str] = (),
    cache: ParseCache | None = None,
    keys: str | None = None,
) -> Iterator[RunAnalysis]:
    """:func:`analyze`, a run at a time: each run is read and judged only once the one before is
    consumed, so a caller that lets each go holds one run's frames, not every run's.

    Arguments and errors as for :func:`analyze`; the runs are found (or refused) at the first ``next``.
    """
    t = thresholds or Thresholds()
    for run in load_each(paths, custom_format=custom_format, wandb_runs=wandb_runs, cache=cache, keys=keys):
        yield analyze_run(run, t)


def load_each(
    paths: PathArg | Iterable[PathArg],
    *,
    custom_format: PathArg | None = None,
    wandb_runs: Sequence[str] = (),
    cache: ParseCache | None = None,
    keys: str | None = None,
) -> Iterator[RunData]:
    """Every run :func:`analyze` would judge, read (not judged) one at a time, in its order: a run
    is read only once the one before is consumed. Arguments and errors as for :func:`analyze`."""
    paths, wandb_runs = as_paths(paths), [wandb_runs] if isinstance(wandb_runs, str) else wandb_runs
    fmt = read_log_format(custom_format)
    locations = find_runs(paths, custom_format=fmt) if paths or not wandb_runs else []
    for location in locations:
        yield load_run(location, custom_format=fmt, cache=cache, keys=keys)
    for name in wandb_runs:
        yield load_online_wandb(name, keys=keys)


def locate(paths: PathArg | Iterable[PathArg], *, custom_format: PathArg | None = None) -> list[RunLocation]:
    """The runs ``analyze(paths)`` would analyze, found but not read (cheap: file heads only)."""
    return find_runs(paths, custom_format=read_log_format(custom_format))


def read_log_format(path: PathArg | None) -> CustomFormat | None:
    """The custom log format declared in the TOML file ``path`` (``None`` for none).

    Raises:
        UnusableInput: the file cannot be read or is not a valid format.
    """
    try:
        return load_custom_format(path) if path else None
    except FormatDefinitionError as exc:  # its message names the file already
        raise UnusableInput(str(exc)) from exc
    except OSError as exc:
        raise UnusableInput(f"{path}: {exc.strerror or exc}") from exc


def _caveat(run: RunData, primary: str | None, unread: str | None, stopped: str | None) -> str | None:
    """Why no incident would not make ``run`` healthy: nothing judged, part of its logs unread, or
    it stopped short with a worker's failure logged (``stopped``: :func:`_stopped_short`)."""
    return unjudged(run.steps.is_empty(), primary) or stopped or (LOGS_UNREAD if data_lost(run.sources) or unread else None)


def _stopped_short(run: RunData, events: pl.DataFrame) -> str | None:
    """A run that logged fewer steps than it planned, with a worker's death logged where no time
    places it (a Ray worker's ``.err`` traceback): it may be what stopped the run — no step of
    it is judged, and no incident is found, yet the run is not healthy. Said, with the line."""
    if run.steps.is_empty():
        return None
    last = int(run.steps["step"].max())
    planned = planned_steps(run.facts, last)
    undated = events.filter(pl.col("time").is_null() & pl.col("step").is_null() & pl.col("kind").is_in(list(CRASH_KINDS)))
    if planned is None or last >= planned or undated.is_empty():
        return None
    first = with_messages(undated.sort("file", "line").head(1)).row(0, named=True)
    n = undated.height
    return (f"it logged {last} of its {planned} planned steps, and {n} worker failure{'s were' if n > 1 else ' was'} "
            f"logged with no time of its own ({first['kind']}, {Path(first['file']).name}:{first['line']}: "
            f"{first['message'][-160:]}): one may be what stopped it")


def analyze_run(run: RunData, t: Thresholds) -> RunAnalysis:
    """Detect, explain and recommend for one loaded run."""
    primary, why_primary = choose_primary(run.metrics)
    events = _with_metric_events(run.events, run.metrics, primary)
    unread = unread_steps(run)
    values = series(run.metrics, primary) if primary else None
    held = ceilings(values, t) if values is not None else []
    early = warm_up(values, t) if values is not None else None
    attribution = Attribution(events, step_clock(run.steps))
    findings = _findings(run, primary, values, [(a, b) for a, b, _ in held] + ([early] if early else []), events, t, unread, attribution)
    incidents = [_incident(i, f, run, events, t, attribution) for i, f in enumerate(sorted(findings, key=lambda f: f.onset_step), 1)]
    checkpoints = _rewrites_undated(_recover_saved_again(to_checkpoints(run.checkpoints), run), run)
    told = _saves_before_relaunches(run, checkpoints)
    checkpoints, abandoned = _abandoned_checkpoints(checkpoints, run, told)
    checkpoints, foreign = _earlier_runs(checkpoints, run)
    stopped = None if incidents else _stopped_short(run, events)
    recommendation = recommend(checkpoints, incidents, run.facts, run.location.root, caveat=_caveat(run, primary, unread, stopped),
                               judged=unjudged(run.steps.is_empty(), primary) is None, abandoned=abandoned, foreign=foreign,
                               read_to=_judged_to(run, values) if unread else None,
                               read_from=int(run.steps["step"].min()) if not run.steps.is_empty() else None)
    notes = [f"primary metric: {why_primary}", *run.notes, *([f"not healthy: {stopped}"] if stopped else [])]
    # (said where it lasted to the end: a coarse reward sits at 1.0 for a few steps now and then)
    notes += [f"{primary} held at its best value, {value:.4g}, in steps {first}–{last}: saturated (every batch scored "
              "alike, nothing left to learn from), not a collapse; dead batches there are no incident"
              for first, last, value in held[-1:] if values is not None and last == values["step"].max()]
    if run.series_sources:
        taken = sorted(set(run.series_sources.values()))
        notes.append(f"{len(run.series_sources)} series were found in several copies; taken from: {', '.join(taken)}")
    if run.steps.is_empty():
        notes.append("no training steps found: events are reported, no metric could be judged")
    if unread:
        last = int(run.steps["step"].max())
        notes.append(f"{STEPS_UNREAD}{last} could not be read ({unread}): the run may have gone on, so whether it "
                     "stalled, crashed or recovered after it cannot be told")
    return RunAnalysis(
        run_id=run.location.run_id,
        framework=framework_of(run),  # type: ignore[arg-type]
        root=str(run.location.root),
        sources=run.sources,
        primary_metric=primary,
        incidents=incidents,
        checkpoints=checkpoints,
        recommendation=_saves_gone(_saved_elsewhere(_unlisted(_maybe_abandoned(recommendation, checkpoints, run, told), run.checkpoints), run),
                                   run, incidents),
        metrics=run.metrics,
        events=events,
        steps=run.steps,
        notes=notes,
        thresholds=t.to_dict(),
        series_sources=run.series_sources,
        observations=slow_start(run.metrics, run.steps),
        # (the primary metric's only: what an abandoned attempt's incident is drawn on)
        superseded=run.superseded.filter(pl.col("key") == primary) if primary else run.superseded.clear(),
        save_folder_named=str(run.save_folder_named) if run.save_folder_named else None,
        stopped_short=stopped,
    )


def framework_of(run: RunData) -> str:
    """The discovered framework, or one recognised from a copy-only run's checkpoints (a Trainer's
    ``checkpoint-N/``) or metric names."""
    if run.location.framework != "unknown":
        return run.location.framework
    if (run.checkpoints["kind"] == "trl").any():
        return "trl"
    if run.metrics.is_empty():
        return "unknown"
    if keys_matching(run.metrics, r"^(?:grpo|ppo)_actor/"):
        return "areal"
    if keys_matching(run.metrics, r"^(?:critic|actor)/"):
        return "verl"
    if keys_matching(run.metrics, r"^train/(?:reward|rewards/|reward_std$)"):  # (TRL's GRPOTrainer, through W&B or TensorBoard)
        return "trl"
    return "unknown"


def _findings(run: RunData, primary: str | None, values: pl.DataFrame | None, alike: list[tuple[int, int]],
              events: pl.DataFrame, t: Thresholds, unread: str | None, attribution: Attribution) -> list[Finding]:
    """Every incident's finding. ``values``: the ``primary`` reward's series; ``alike``: its stretches
    (first and last step) at its ceiling (:func:`ceilings`) or in its warm-up (:func:`warm_up`), where
    batches all scoring alike are a solved task's, or one that has earned nothing yet."""
    found: list[Finding] = []
    last = int(run.steps["step"].max()) if not run.steps.is_empty() else 0
    if primary and values is not None:
        found += [_read_to(_after_gap(f, values), last, unread) for f in reward_collapses(values, primary, t)]
        # An attempt a relaunch abandoned and logged again: its collapse is no longer in the run's series.
        for earlier in abandoned_collapses(values, run.superseded, run.step_copies, primary, t):
            within = [i for i, f in enumerate(found) if f.redone is None and f.onset_step <= earlier.onset_step < (f.end_step or last + 1)]
            if not within:
                found.append(earlier)
                continue
            # The relaunch went back to before it and the reward collapsed again: one incident, the
            # run's, which tells the attempt that collapsed first.
            i = within[0]
            found[i] = replace(found[i], summary=f"{found[i].summary}. Earlier, {earlier.summary}")
        found += [_read_to(_after_gap(f, part), last, unread) for f, part in _parts_collapsed(run.metrics, primary, t, found)]
        collapses = [f for f in found if f.redone is None]
        found += [_read_to(f, last, unread) for f in reward_drops(values, primary, t, collapses)]
        found += [_read_to(f, last, unread) for f in _failing_drops(run, values, primary, t, found, attribution, last)]
    spans = [(f.onset_step, f.end_step or last + 1) for f in found]
    solved = [(a, b + 1) for a, b in alike]
    # A step past the step log's last is one the log ended in (a copy's steps past it are the run's: see load_run).
    found += [d for d in dead_learning(run.metrics, t, last if run.steps.height else None)
              if not any(a <= d.onset_step < b for a, b in spans + (solved if d.kind == "zero_variance" else []))]
    # (an attempt a relaunch abandoned, its rows no longer the run's: its dead batches are told as its
    # collapses are — where no incident tells of those steps already)
    told = [(f.onset_step, f.end_step or last + 1) for f in found]
    found += [d for d in abandoned_dead_batches(run.metrics, run.superseded, run.step_copies, t)
              if not any(a <= d.onset_step < b for a, b in told)]
    # A reward alone non-finite where an incident already tells of the reward (a dead server's batches
    # with no reward to average) is that incident.
    spans = [(f.onset_step, f.end_step or last + 1) for f in found]
    found += [f for f in non_finite(run.metrics, primary, t) if f.diverged or not any(a <= f.onset_step < b for a, b in spans)]
    planned = planned_steps(run.facts, last)
    gaps = relaunch_gaps(run.step_copies)
    crashed = [died_before_relaunch(f, run.steps, gaps, events) for f in crashes(run.steps, events, planned)]
    crashed += [f for f in abandoned_by_exception(run.steps, events, gaps) if not any(c.onset_step == f.onset_step for c in crashed)]
    found += crashed
    # A run that logged every step it was launched for has nothing left to stall on; where the
    # steps could not all be read, silence after the last is the copy's end, not the run's.
    stalled = (stall(run.steps, events, step_durations(run.steps), t, other_logs(run))
               if (planned is None or last < planned) and not unread else None)
    ended = ended_by_exception(run.steps, events, planned)
    if stalled and ((stalled.seen and ended) or stopped_by_hand(run.steps, events)):
        stalled = None  # (a server idling on after the trainer raised and died, or after a Ctrl-C stopped it)
    if stalled and not any(c.onset_step == stalled.onset_step for c in crashed):
        found.append(stalled)
    # (an attempt a relaunch abandoned died at a later step number than the run's own end: another death)
    if ended and not any(f.onset_step >= ended.onset_step for f in [*crashed, *([stalled] if stalled else [])] if f.redone is None):
        found.append(ended)
    # Steps that stopped right after a reward stuck for fewer steps than a collapse needs: it began there.
    stops = [f for f in (*crashed, stalled, ended) if f is not None]
    tail = collapse_before_stop(values, primary, t) if primary and values is not None and stops else None
    if tail and any(f.onset_step > values["step"].max() for f in stops) and not any(
            a <= tail.onset_step < b for a, b in [(f.onset_step, f.end_step or last + 1) for f in found]):
        found.append(tail)
    # A server gone while the run went on: an incident of its own where nothing else tells of it.
    spans = [(f.onset_step, f.end_step or last + 1) for f in found]
    found += [d for d in servers_down(events, t, run.steps, planned, lambda: attribution.servers) if not any(a - 1 <= d.onset_step < max(b, a + 1) for a, b in spans)]
    return found


def _parts_collapsed(metrics: pl.DataFrame, primary: str, t: Thresholds, found: list[Finding]) -> list[tuple[Finding, pl.DataFrame]]:
    """Collapses to exactly zero of one reward function of several (TRL's ``rewards/<func>/mean``),
    positive before, where the run's reward (their sum) only fell: a verifier or judge that broke,
    which the sum alone may hide. Each with the part's series; none where an incident tells of its steps."""
    spans = [(f.onset_step, f.end_step) for f in found]
    out = []
    for key in keys_matching(metrics, REWARD_PARTS):
        if key == primary:
            continue
        part = series(metrics, key)
        for finding in reward_collapses(part, key, t):
            level = part.filter(pl.col("step") < finding.onset_step)["value"].median()
            overlaps = any(a <= finding.onset_step and (b is None or finding.onset_step < b) for a, b in spans)
            if finding.value == 0 and level is not None and level > 0 and not overlaps:  # type: ignore[operator]
                out.append((finding, part))
                spans.append((finding.onset_step, finding.end_step))
    return out


def _failing_drops(run: RunData, values: pl.DataFrame, primary: str, t: Thresholds, found: list[Finding],
                   attribution: Attribution, last: int) -> list[Finding]:
    """Smaller falls of the reward (under ``t.failing_drop_level`` of its best) that infrastructure
    failures standing out around their onset, and still logged in the last third of the fall,
    explain: one of several servers hung, its share of the rollouts failing. Not where an incident
    already tells of the reward. ``last``: the run's last logged step."""
    level = t.failing_drop_level
    loose = replace(t, drop_level=level, decline_level=level, drop_recovery=max(t.drop_recovery, (1 + level) / 2))
    told = [(f.onset_step, f.end_step or last + 1) for f in found if f.kind in ("reward_collapse", "reward_drop") and f.redone is None]
    candidates = [f for f in reward_drops(values, primary, loose, [f for f in found if f.kind == "reward_collapse" and f.redone is None])
                  if not any(a <= f.onset_step < b or f.onset_step <= a < (f.end_step or last + 1) for a, b in told)]
    kept = []
    for f in candidates:
        onset = run.steps.filter(pl.col("step") == f.onset_step)["time"]
        verdict = explain(f, attribution.events, run.metrics, onset[0] if len(onset) else None, clock=attribution.clock,
                          attributed=attribution.frame)
        if verdict.cause in ("unknown", "reward_pipeline", "loss_computation") or verdict.confidence < 0.75:
            continue
        # ...and went on failing while the reward stayed down: a burst at an ordinary dip explains no fall.
        end = f.end_step if f.end_step is not None else last + 1
        late = attribution.frame.filter((pl.col("cause") == verdict.cause) & pl.col("step").is_between(f.onset_step + (end - f.onset_step) * 2 // 3, end - 1))
        if late.height:
            kept.append(replace(f, summary=f"{f.summary} (a fall this small counts where the infrastructure failed around it and on)"))
    return kept


def planned_steps(facts: dict[str, str], last: int) -> int | None:
    """The steps the run was launched for; a run that said it completed planned the ones it logged."""
    if facts.get("training_completed"):
        return last
    planned = facts.get("total_training_steps", "")
    return int(planned) if planned.isdigit() else None


#: A value logged just before a collapse first seen after steps with none that is under this share
#: of the level before it (measured from the collapse's value) is already part of the collapse.
_FALLEN_SHARE = 0.5
#: The logged values before it that give that level.
_LEVEL_POINTS = 10


def _after_gap(finding: Finding, values: pl.DataFrame) -> Finding:
    """A collapse first seen right after steps with no value (a copy's corrupt chunk skipped, a
    log's lost stretch, a log written every k steps) may have begun in them: said, with the bounds.
    A value logged there already far below the level before it (a mean over a window the
    collapse began in: a Trainer's ``logging_steps``) moves the bound back before it."""
    before = values.filter(pl.col("step") < finding.onset_step).drop_nulls("value").sort("step")
    if before.is_empty() or finding.onset_step - int(before["step"][-1]) <= 1:
        return finding
    steps, logged = before["step"].to_list(), before["value"].to_list()
    floor = finding.value if finding.value is not None and math.isfinite(finding.value) else 0.0
    fallen = []
    while len(steps) > 1 and len(fallen) < _LEVEL_POINTS:
        level = statistics.median(logged[-1 - _LEVEL_POINTS:-1])
        if not (math.isfinite(logged[-1]) and level > floor and logged[-1] - floor < _FALLEN_SHARE * (level - floor)):
            break
        fallen.append((steps.pop(), logged.pop()))
    last = int(steps[-1])
    gap = f"steps {last + 1}–{finding.onset_step - 1}" if finding.onset_step - last > 2 else f"step {last + 1}"
    said = (f"{gap} logged no {finding.metric}" if not fallen else
            f"{finding.metric} logged at step{'s' if len(fallen) > 1 else ''} "
            f"{', '.join(f'{step} ({value:.3g})' for step, value in reversed(fallen))} was already far below its level "
            f"before ({statistics.median(logged[-_LEVEL_POINTS:]):.3g}), and the other steps logged none")
    return replace(finding, began_after=last, summary=f"{finding.summary}; {said}, so it began "
                                                      f"between steps {last + 1} and {finding.onset_step}")


def _abandoned_checkpoints(checkpoints: list[Checkpoint], run: RunData,
                           told: dict[str, bool]) -> tuple[list[Checkpoint], frozenset[str]]:
    """Checkpoints an attempt a relaunch abandoned saved, which the run's own steps never saved
    again: past its own last step, saved (by their time) before the run's own copy of the step
    they follow was logged, or last saved before a relaunch that went back (``told``, by path:
    see :func:`_saves_before_relaunches`). Said so, and never chosen."""
    if run.superseded_steps.is_empty() or run.steps.is_empty():
        return checkpoints, frozenset()
    last, reached = int(run.steps["step"].max()), int(run.superseded_steps["step"].max())
    own = dict(run.steps.select("step", "time").iter_rows())
    gone = set(run.superseded_steps["step"].to_list())
    dated = _saves_dated(checkpoints, run)

    def older(c: Checkpoint) -> bool:
        if last + 1 < c.step <= reached + 1 or told.get(c.path):
            return True
        # AReaL saves step s's export while it runs step s, after step s - 1 was logged
        before = own.get(c.step - 1)
        return bool(dated and c.time and before and c.time < before and ({c.step - 1, c.step} & gone))

    gone_paths = frozenset(c.path for c in checkpoints if older(c))
    said = "saved by an attempt a relaunch abandoned (the run's own steps never saved it again)"
    return [replace(c, problems=(*c.problems, said)) if c.path in gone_paths else c for c in checkpoints], gone_paths


#: A checkpoint dated this long before the run's first step was logged cannot be a save of a step after it.
_BEFORE_THE_RUN = timedelta(minutes=10)


def _earlier_runs(checkpoints: list[Checkpoint], run: RunData) -> tuple[list[Checkpoint], frozenset[str]]:
    """Checkpoints of steps after the run's first logged one, yet dated well before it was logged:
    an earlier run's saves left in the folder (its experiment and trial names reused, its logs
    cleared), not this run's. Said so, and never chosen (where the files' times are the saves')."""
    timed = run.steps.drop_nulls("time")
    if timed.is_empty() or not _saves_dated(checkpoints, run):
        return checkpoints, frozenset()
    first = timed.sort("time", "step").row(0, named=True)
    behind = _files_behind(run)
    earlier = [c for c in checkpoints
               if c.time is not None and c.step > first["step"] and c.time + behind < first["time"] - _BEFORE_THE_RUN]
    said = (f"before the run logged its first step ({first['step']}, at {first['time']:%Y-%m-%d %H:%M:%S}, "
            f"{Path(first['file']).name}:{first['line']}), yet of a later step: an earlier run's save left in the folder (its "
            "experiment and trial names reused), not this run's")
    paths = frozenset(c.path for c in earlier)
    return [replace(c, problems=(*c.problems, f"dated {c.time:%Y-%m-%d %H:%M:%S}, {said}")) if c.path in paths else c
            for c in checkpoints], paths


def _files_behind(run: RunData) -> timedelta:
    """How far this machine's reading of file times lags the logs' clock: a step log last written
    before its own last step was logged can only be one whose times are of a zone ahead of this
    machine's (a cluster in UTC, the tree copied with its times to a workstation in New York).
    Checkpoints' file times lag as much; zero where nothing says so."""
    lag = timedelta(0)
    for (file,), steps in run.step_copies.drop_nulls("time").group_by("file"):
        try:
            written = datetime.fromtimestamp(os.stat(str(file)).st_mtime)
        except OSError:
            continue
        last = steps["time"].max()
        if last is not None and written < last - _BEFORE_THE_RUN:  # type: ignore[operator]
            lag = max(lag, last - written)  # type: ignore[operator]
    return lag


#: How long after the logs' last line a checkpoint's files may still be written (a final save).
_SAVE_AFTER_LOGS = timedelta(minutes=30)


def _saves_dated(checkpoints: list[Checkpoint], run: RunData) -> bool:
    """Whether the checkpoints' file times may be when they were saved: not when one of them is
    later than anything the logs say by more than a final save takes (a copy — ``cp -r``, rsync
    without ``-t``, an unpacked archive — dates every file when it was made)."""
    logged = [t for t in (run.steps["time"].max(), run.events["time"].max()) if t is not None]
    saved = [c.time for c in checkpoints if c.time is not None]
    return not (logged and saved) or max(saved) <= max(logged) + _SAVE_AFTER_LOGS  # type: ignore[operator]


def _saved_elsewhere(recommendation: Recommendation, run: RunData) -> Recommendation:
    """No checkpoint found, yet the logs say checkpoints were saved: they are not where the tool
    looks (a relative save folder under ``ray job submit``'s working-dir copy, a moved output_dir).
    Said with the save line, and the choice is unknown rather than "none" (``unlisted``)."""
    if recommendation.checkpoint is not None or not run.checkpoints.is_empty():
        return recommendation
    saves = run.events.filter(pl.col("kind") == "checkpoint_saved").sort("time", "line", nulls_last=True)
    if saves.is_empty():
        return recommendation
    last = saves.row(-1, named=True)
    logged = (f"the logs say {saves.height} {'was' if saves.height == 1 else 'were'} saved (the last at step {last['step']}, "
              f"{Path(last['file']).name}:{last['line']}: {last['message'][-160:]})")
    if (there := _save_folder_there(last["message"], Path(last["file"]))) is not None:
        said = (f"checkpoints not read: {logged}, to {there}, which is there: in a form the tool does not read (it reads "
                "AReaL's, verl's and Hugging Face Trainer's checkpoint folders); judge them by the step each was saved at")
    else:
        said = (f"checkpoints not found: {logged}, and none is where the tool looks (beside the logs); find them where the "
                "run's working folder was")
    where = run.location.checkpoint_dir or run.location.root
    return replace(recommendation, reason=f"{recommendation.reason} Yet the logs say checkpoints were saved (see the warnings).",
                   warnings=(*recommendation.warnings, said), unlisted=(*recommendation.unlisted, str(where)))


def _saves_gone(recommendation: Recommendation, run: RunData, incidents: list[Incident]) -> Recommendation:
    """No checkpoint before the first incident is on disk, yet the logs say some were saved before
    it, to folders that are gone (a rotation, ``max_actor_ckpt_to_keep``, deleted them; they were
    moved): said, with the last save line — a copy elsewhere (a backup) of that one is the one to
    resume from."""
    onsets = [i.onset_step for i in incidents if not i.redone]
    if recommendation.checkpoint is not None or not onsets or run.checkpoints.is_empty():
        return recommendation
    saves = run.events.filter((pl.col("kind") == "checkpoint_saved") & (pl.col("step") < min(onsets))).sort("step", "line")
    kept = {Path(p).name for p in run.checkpoints["path"].to_list()}
    gone = [row for row in saves.iter_rows(named=True)
            if (named := _SAVED_TO.search(row["message"] or "") or re.search(r"(\S*global_step_\d+)\s*$", row["message"] or ""))
            and Path(named[1]).name not in kept]
    if not gone:
        return recommendation
    last = gone[-1]
    said = (f"the logs say {len(gone)} checkpoint{'s were' if len(gone) > 1 else ' was'} saved before the onset at step "
            f"{min(onsets)} that {'are' if len(gone) > 1 else 'is'} no longer on disk (the last at step {last['step']}, "
            f"{Path(last['file']).name}:{last['line']}: {last['message'][-160:]}): a rotation deleted them or they were "
            "moved — a copy kept elsewhere (a backup, HDFS) of the last is the one to resume from")
    rest = recommendation.reason.split(". ", 1)[1] if ". " in recommendation.reason else ""
    reason = (f"No checkpoint saved before the first incident's onset at step {min(onsets)} is on disk: the logs say "
              f"{len(gone)} {'were' if len(gone) > 1 else 'was'}, the last at step {last['step']} (see the warnings). {rest}")
    return replace(recommendation, reason=reason.strip(), warnings=(*recommendation.warnings, said))


#: The folder or file a save line ends by naming (``saving checkpoint to out-grpo``).
_SAVED_TO = re.compile(r"\b(?:to|into|in|at)\s+['\"]?([^\s'\"]+?)['\"]?\s*$")


def _save_folder_there(message: str, log: Path) -> Path | None:
    """What a save line says it saved to, where that is beside the log (its working folder
    there, or above it); else ``None``."""
    named = _SAVED_TO.search(message or "")
    if named is None:
        return None
    path = Path(named[1])
    for base in ((Path("/"),) if path.is_absolute() else (log.parent, log.parent.parent)):
        if (base / path).exists():
            return base / path
    return None


def _unlisted(recommendation: Recommendation, frame: pl.DataFrame) -> Recommendation:
    """Checkpoint folders the readers could not look into, said: the choice saw none of theirs."""
    rows = frame.filter(pl.col("step").is_null() & pl.col("problems").list.eval(pl.element().str.starts_with(UNLISTED)).list.any())
    if rows.is_empty():
        return recommendation
    said = tuple(f"checkpoints not read: {r['path']} {r['problems'][0]}; the choice saw none of its checkpoints"
                 for r in rows.iter_rows(named=True))
    reason = recommendation.reason
    if recommendation.checkpoint is None:
        reason += f" The checkpoint folder {rows['path'][0]} could not be listed: one may be there."
    return replace(recommendation, reason=reason, warnings=(*recommendation.warnings, *said), unlisted=tuple(rows["path"]))


def _rewrites_undated(checkpoints: list[Checkpoint], run: RunData) -> list[Checkpoint]:
    """A recover checkpoint's shards dated after its ``.metadata`` (an overwrite the process died in)
    is a finding only where the files' times are the saves': a copy (``cp -r``) dates each file when
    it was copied, a large shard minutes after the metadata. There, it is no problem."""
    if _saves_dated(checkpoints, run):
        return checkpoints
    out = []
    for c in checkpoints:
        kept = tuple(p for p in c.problems if REWRITTEN not in p)
        if len(kept) == len(c.problems):
            out.append(c)
        elif kept:
            out.append(replace(c, problems=kept))
        else:  # (that was all: complete, and resumable as a recover checkpoint with its step is)
            out.append(replace(c, problems=kept, complete=True, resumable=c.kind == "recover" and c.step is not None))
    return out


def _recover_saved_again(checkpoints: list[Checkpoint], run: RunData) -> list[Checkpoint]:
    """AReaL's recover checkpoint whose last save line comes steps after the step its
    ``recover_info`` names: the weights were written again and the step info was not (a process
    that died in between) — resuming would pair later weights with earlier counters and data.
    Not usable, said with the save line. (One save at the step after it is AReaL's own order.)"""
    saves = run.events.filter((pl.col("kind") == "checkpoint_saved") & pl.col("message").str.contains("recover_checkpoint", literal=True)
                              & pl.col("step").is_not_null())
    if saves.is_empty():
        return checkpoints
    last = saves.sort("step", "time", "line", nulls_last=True).row(-1, named=True)
    said = (f"saved again during step {last['step']} ({Path(last['file']).name}:{last['line']}), after the step its "
            "recover_info names, which was not rewritten: its weights are not that step's")
    return [replace(c, complete=False, problems=(*c.problems, said)) if c.kind == "recover" and last["step"] > c.step + 1 else c
            for c in checkpoints]


def _saves_before_relaunches(run: RunData, checkpoints: list[Checkpoint]) -> dict[str, bool]:
    """For each checkpoint a save line names (``checkpoint_saved``, its folder's name), by path:
    whether its last save came before a relaunch in the same log that went back to its step or
    below — the abandoned attempt's weights, by line order, which is all a log without times
    (verl's console) tells."""
    saves = run.events.filter(pl.col("kind") == "checkpoint_saved").select("file", "line", "message")
    if saves.is_empty() or run.superseded_steps.is_empty():
        return {}
    copies = run.step_copies.select(pl.col("file").cast(pl.String), "line", "step").sort("file", "line")
    starts = copies.filter(relaunches(pl.col("step")).over("file"))  # each attempt's first step copy
    told = {}
    for c in checkpoints:
        named = saves.filter(pl.col("message").str.contains(re.escape(Path(c.path).name) + r"(?:$|\W)"))
        if named.height:
            file, line, _ = named.sort("file", "line").row(-1)
            back = starts.filter((pl.col("file") == file) & (pl.col("line") > line) & (pl.col("step") <= c.step))
            told[c.path] = not back.is_empty()
    return told


def _maybe_abandoned(recommendation: Recommendation, checkpoints: list[Checkpoint], run: RunData,
                     told: dict[str, bool]) -> Recommendation:
    """The chosen checkpoint's step was also reached by an attempt a relaunch abandoned, and
    neither times nor a save line tell which attempt saved it: said, for it may hold that attempt's weights."""
    chosen = next((c for c in checkpoints if c.path == recommendation.checkpoint), None)
    gone = run.superseded_steps["step"]
    if chosen is None or not (gone == chosen.step).any() or chosen.path in told:
        return recommendation
    own = run.steps.filter(pl.col("step") == chosen.step - 1)["time"].drop_nulls()
    dated = _saves_dated(checkpoints, run)
    if chosen.time is not None and len(own) and dated:  # (the times judged it: see _abandoned_checkpoints)
        return recommendation
    name = Path(chosen.path).name
    untold = (f"which attempt saved {name} cannot be told: the checkpoints' files are dated after every log line (a "
              "copy's times, not the saves'), and no save line names it" if chosen.time is not None and not dated
              else f"neither the logs' times nor a save line tell which attempt saved {name}")
    warning = (f"Step {chosen.step} was also reached by an attempt a relaunch abandoned (steps {gone.min()}–{gone.max()}), "
               f"and {untold}: if the abandoned one did, it holds that attempt's weights — check its time in the "
               "original tree against the relaunch's.")
    return replace(recommendation, warnings=(*recommendation.warnings, warning))


#: A note that the copy of a log stops before the log did (a torn or corrupt .gz).
_COPY_ENDS_EARLY = re.compile(r"the rest of the (?:log|file)")


def unread_steps(run: RunData) -> str | None:
    """Why the run may have logged steps after the last one read: the step log's copy stops early
    (a torn .gz), or checkpoints were saved past it — after it, and more than the one step past it
    that AReaL saves before it logs that step (a run can hang right after that save)."""
    if run.steps.is_empty():
        return None
    last = run.steps.sort("step").row(-1, named=True)
    why = [n for n in data_lost([s for s in run.sources if s.path == last["file"]]) if _COPY_ENDS_EARLY.search(n)][-1:]
    # (past an abandoned attempt's steps too: its own saves, not a sign the run went on; and not
    # one dated before the last step: an earlier run's, left in the folder)
    reached = max([last["step"], *run.superseded_steps["step"].to_list()])
    later = run.checkpoints.filter((pl.col("step") > reached + 1)
                                   & (pl.col("time").is_null() | (pl.col("time") >= last["time"]) if last["time"] else True))["step"]
    if len(later):
        why.append(f"checkpoints were saved up to step {later.max()}")
    return "; ".join(why) or None


def _judged_to(run: RunData, values: pl.DataFrame | None) -> int:
    """The last step read, or before it the last with a reward read (a log cut off inside a step's
    table has its header and not its reward: that step was not judged)."""
    last = int(run.steps["step"].max())
    judged = values["step"].max() if values is not None and values.height else None
    return min(last, int(judged)) if judged is not None else last


def _read_to(finding: Finding, last: int, unread: str | None) -> Finding:
    """A collapse the steps that could be read never came back from: said as far as they go."""
    if unread is None or finding.end_step is not None:
        return finding
    return replace(finding, summary=finding.summary.replace(
        " and never recovered", f" and had not recovered by step {last}, the last step that could be read"))


def _incident(number: int, finding: Finding, run: RunData, events: pl.DataFrame, t: Thresholds,
              attribution: Attribution) -> Incident:
    onset_row = run.steps.filter(pl.col("step") == finding.onset_step)
    onset_time = (finding.onset_row["time"] if finding.onset_row else finding.failed_at if finding.redone
                  else onset_row["time"][0] if onset_row.height
                  else finding.failed_at or finding.last_step_time or _first_failure(finding, events))
    has_server_log = any(s.kind in ("areal_server", "sglang_server") for s in run.location.logs)
    verdict = explain(finding, events, run.metrics, onset_time, has_server_log=has_server_log,
                      unseen=unseen_at_onset(run, finding, onset_time, events), not_due=timeouts_not_due(run, finding, onset_time, events),
                      clock=attribution.clock, attributed=attribution.frame)
    last = int(run.steps["step"].max()) if not run.steps.is_empty() else finding.onset_step
    end = finding.end_step if finding.end_step is not None else last + 1
    # The steps run after the onset while it lasted, logged or not (a copy may hold every tenth: the
    # steps between ran too). The contract's example: onset 940, last step 1869, 929 wasted.
    wasted = max(0, min(end - 1, last) - finding.onset_step) if not run.steps.is_empty() else 0
    if finding.redone and finding.kind == "crash":  # the attempt's steps the relaunch logged again, and the one it died in
        wasted = finding.redone[1] - finding.redone[0] + 2
    elif finding.redone and finding.onset_row:  # the abandoned attempt's own steps, not the run's
        row = finding.onset_row
        # Its copies from the onset on: by time, or (a log printing none, verl's console) by line in the onset's file.
        ours = (pl.col("time").is_between(row["time"], finding.until or datetime.max) if row["time"] is not None
                else (pl.col("file").cast(pl.String) == str(row["file"])) & (pl.col("line") >= row["line"]))
        wasted = run.superseded_steps.filter(pl.col("step").is_between(finding.onset_step + 1, end - 1) & ours)["step"].n_unique()
    until = finding.until or _last_time(run.steps.filter(pl.col("step") <= (finding.end_step or last)))
    hours = (until - onset_time).total_seconds() / 3600 if until and onset_time and until >= onset_time else None
    onset_evidence = _onset_evidence(finding, run)
    return Incident(
        id=f"incident-{number}",
        kind=finding.kind,  # type: ignore[arg-type]
        metric=finding.metric,
        onset_step=finding.onset_step,
        onset_time=onset_time,
        end_step=finding.end_step,
        recovered=finding.end_step is not None,
        cause=verdict.cause,
        confidence=verdict.confidence,
        # (a cause with no failure logged, the reward pipeline's: the onset's own line is its evidence)
        evidence=(*verdict.evidence, *_went_on(finding)) or tuple(e for e in (onset_evidence,) if e is not None),
        wasted_steps=wasted,
        wasted_hours=hours,
        summary=" ".join(p for p in (f"{finding.summary}.", _what_it_raised(finding, events), _brief_returns(finding, run, events, t.min_run),
                                     _relaunches(finding, events), _step_in_progress(finding, run, events), verdict.explanation) if p),
        onset_evidence=onset_evidence,
        suggestions=suggest(verdict.cause, run.config, verdict.seen, framework_of(run), finding.kind),
        redone=finding.redone is not None,
        began_after=finding.began_after,
    )


def _text_steps(run: RunData) -> tuple[list[str], pl.DataFrame]:
    """The run's text logs (not its numbers' copies: W&B, TensorBoard, verl's JSONL, a Trainer's
    ``trainer_state.json``) and the step copies they logged: where a failure could have been written."""
    texts = [str(s.path) for s in run.location.logs if s.kind not in COPY_SOURCES]
    return texts, run.step_copies.filter(pl.col("file").cast(pl.String).is_in(texts))

def unseen_at_onset(run: RunData, finding: Finding, onset_time: datetime | None, events: pl.DataFrame) -> str | None:
    """Why no log could have shown a failure at the onset, when none could: the text logs ended
    before it (the steps after are known only from a W&B or TensorBoard copy), or there are none."""
    if finding.kind not in ("reward_collapse", "reward_drop", "zero_variance"):
        return None
    texts, steps = _text_steps(run)
    first = max(finding.onset_step - 3, 0)
    if steps.height and int(steps["step"].max()) >= first:
        return None
    # (what a copy's own numbers tell, a NaN in them, is no log going on past the onset)
    logged = events.filter(~pl.col("source").is_in(list(COPY_SOURCES)))["time"].max()
    seen = [t for t in (logged, other_logs(run)["time"].max(), steps["time"].max()) if t is not None]
    if seen and onset_time is not None and max(seen) >= onset_time:  # type: ignore[type-var]
        return None  # (a server's or Ray's log went on past it)
    if not texts:
        return ("No text log was found, only copies of the run's numbers (W&B, TensorBoard, a Trainer's trainer_state.json): "
                "nothing shows what failed.")
    if steps.is_empty():
        return "No text log covers the onset: the cause cannot be told from what is here."
    # (another log may go on past the step log's end and still end before the onset: a server's)
    ended = steps["time"].max()
    others = f"; the other logs end at {iso(max(seen))}, before it" if seen and ended is not None and max(seen) > ended else ""  # type: ignore[operator]
    return (f"No log covers the onset: the step log ends at step {int(steps['step'].max())}{others or ' and nothing else was logged after it'}; "
            "the steps since are known only from a copy of the run's numbers (W&B, TensorBoard). "
            "Fetch the trainer's and the inference server's logs of those steps to tell the cause.")


def timeouts_not_due(run: RunData, finding: Finding, onset_time: datetime | None, events: pl.DataFrame,
                     as_of: datetime | None = None) -> str | None:
    """Why a hung server's failures could not show yet, when they could not: a request is logged
    as failed only when its ``rollout.request_timeout`` runs out, and the text logs end (as of
    ``as_of``, an alarm's time) before one sent when the reward fell would have — and the steps
    since slowed or stopped, as they do while rollouts wait on a server (steps going on at their
    pace were fed rollouts that completed: the server answered)."""
    timeout = run.config.get("rollout.request_timeout")
    if (finding.kind not in ("reward_collapse", "reward_drop", "zero_variance") or onset_time is None
            or not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0):
        return None
    # (the client logs its failed calls: the logs that log the steps, not the server's own)
    _, steps = _text_steps(run)
    clients = steps["file"].cast(pl.String).unique().to_list()
    logged = [events.filter(pl.col("file").cast(pl.String).is_in(clients))["time"], steps["time"]]
    seen = [t for t in (column.filter(column <= as_of).max() if as_of else column.max() for column in logged) if t is not None]
    # (sent as the window began: its steps are where a failure would count)
    began = steps.filter(pl.col("step") >= finding.onset_step - 3)["time"].min() or onset_time
    due = min(began, onset_time) + timedelta(seconds=float(timeout))  # type: ignore[type-var]
    if not seen or max(seen) >= due or _kept_pace(run.steps, finding.onset_step, as_of):  # type: ignore[type-var]
        return None
    return (f"No failure was logged around the onset, but none could have been yet if the server hung: a request sent "
            f"then fails only when rollout.request_timeout ({timeout:g} s) runs out, at about {iso(due)}, and the logs "
            f"end at {iso(max(seen))}. Look again after that, or at the server itself.")  # type: ignore[type-var]


#: Steps after the onset at most this many times as long as before it kept their pace.
_PACE_KEPT = 2.0


def _kept_pace(steps: pl.DataFrame, onset: int, as_of: datetime | None) -> bool:
    """Whether three steps or more were logged after ``onset`` (by ``as_of``) at the pace of the 20 before it."""
    timed = steps.filter(pl.col("time").is_not_null() & ((pl.col("time") <= as_of) if as_of else pl.lit(True)))
    durations = step_durations(timed)
    before = durations.filter(pl.col("step").is_between(onset - 20, onset - 1))["seconds"].median()
    after = durations.filter(pl.col("step") > onset)["seconds"]
    return before is not None and after.len() >= 3 and float(after.median()) <= _PACE_KEPT * float(before)  # type: ignore[arg-type]


#: The step a resume line names the checkpoint of, in log units: AReaL logs the 0-based step it
#: goes on with (``Recovering from {last_step_info.next()}``), the checkpoint's in log units;
#: verl the ``global_step_N`` folder it loads.
_RESUMED_FROM = re.compile(r"global_step[=_](\d+)")


def _relaunches(finding: Finding, events: pl.DataFrame) -> str:
    """The run relaunched (automatic recovery) while its numbers were broken: from where, and so
    whether the relaunch carried the broken state on (seed 001: recover.mode resumed after the onset)."""
    if finding.kind not in FROM_THE_NUMBERS or finding.redone:
        return ""
    # (a resume line belongs to the step in progress: the relaunch's first, the recovery's own)
    stop = finding.end_step if finding.end_step is not None else math.inf
    resumed = events.filter((pl.col("kind") == "run_resumed") & (pl.col("step") > finding.onset_step) & (pl.col("step") <= stop))
    if resumed.is_empty():
        return ""
    first = resumed.row(0, named=True)
    froms = [int(m[1]) for m in (_RESUMED_FROM.search(r or "") for r in resumed["message"]) if m]
    n = resumed.height
    where = f"{iso(first['time']) + ', ' if first['time'] else ''}{Path(first['file']).name}:{first['line']}"
    text = f"The run was relaunched once after the onset (at {where})" if n == 1 else \
        f"The run was relaunched {n} times after the onset (first at {where})"
    if froms and len(froms) == n and min(froms) >= finding.onset_step:
        steps = f"step{'s' if n > 1 else ''} {', '.join(str(s) for s in froms[:5])}{', …' if n > 5 else ''}"
        text += f", {'each ' if n > 1 else ''}resuming from a checkpoint saved after it ({steps})"
        if finding.end_step is None:
            text += f": the relaunch{'es' if n > 1 else ''} carried the broken state on"
        else:  # saved during the collapse, and the reward came back: the weights were not what broke
            text += f"; the reward came back at step {finding.end_step} all the same"
    return text + "."


def _what_it_raised(finding: Finding, events: pl.DataFrame) -> str:
    """For a crash a launcher's exit tells of: the exception the run's own process raised in that
    step (disk full, an OOM), which says why — the exit only says that."""
    if finding.kind != "crash" or finding.summary.startswith("an uncaught exception"):
        return ""
    tracebacks = events.filter((pl.col("step") == finding.onset_step) & RUN_TRACEBACK).sort("time", "line", nulls_last=True)
    if tracebacks.is_empty():
        return ""
    exception = raised(tracebacks["message"][0])
    exception = exception if len(exception) <= 160 else exception[:159] + "…"
    return f"It raised {exception.rstrip('.')}." if exception else ""


def _first_failure(finding: Finding, events: pl.DataFrame) -> datetime | None:
    first = _first_failures(finding, events)
    return first["time"][0] if first.height else None


def _first_failures(finding: Finding, events: pl.DataFrame) -> pl.DataFrame:
    """The failures logged first in the step ``finding`` began in (several where they share a time)."""
    failed = events.filter((pl.col("step") == finding.onset_step) & pl.col("severity").is_in(["error", "fatal"]))
    if finding.kind == "crash" and failed["kind"].is_in(CRASH_KINDS).any():  # (not a request failing as it hung)
        failed = failed.filter(pl.col("kind").is_in(CRASH_KINDS))
    failed = failed.filter(pl.col("time").is_not_null())
    return failed.filter(pl.col("time") == pl.col("time").min())


#: How close a return of the reward must follow a server coming back (or precede it going down) to be put down to it.
_NEAR_STEPS = 3


def _brief_returns(finding: Finding, run: RunData, events: pl.DataFrame, min_run: int) -> str:
    """A collapse the reward came back from for a few steps at a time, too briefly to count as
    recovered: when, and whether each return followed the server coming back (seed 001's spikes)."""
    if finding.kind != "reward_collapse" or finding.metric is None or finding.value is None or finding.redone:
        return ""  # (an abandoned attempt's steps were logged again: the run's series there is the relaunch's)
    stop = finding.end_step if finding.end_step is not None else math.inf
    values = series(run.metrics, finding.metric).filter((pl.col("step") > finding.onset_step) & (pl.col("step") < stop))
    # Stuck is any value held for min_run steps or more (zero, or the value before it); the rest came back.
    held = pl.len().over(pl.col("value").rle_id()) >= min_run
    off = values.filter(pl.col("value").is_finite() & ~held & (pl.col("value") + 0.0 != finding.value + 0.0))
    if off.is_empty():
        return ""
    stretches = (
        off.with_columns((pl.col("step").diff() != 1).fill_null(True).cum_sum().alias("stretch"))
        .group_by("stretch", maintain_order=True)
        .agg(pl.col("step").min().alias("first"), pl.col("step").max().alias("last"), pl.col("value").max().alias("peak"))
    )
    came_back = events.filter(pl.col("kind").is_in(["server_ready", "run_resumed"]))["step"].drop_nulls().to_list()
    went_down = events.filter(pl.col("kind") == "server_exit")["step"].drop_nulls().to_list()
    rows = list(stretches.iter_rows(named=True))
    listed = [f"{step_span(r['first'], r['last'])} (up to {r['peak']:.4g})" for r in rows[:4]]
    after = sum(any(r["first"] - _NEAR_STEPS <= s <= r["first"] for s in came_back) for r in rows)
    ended = sum(any(r["last"] <= s <= r["last"] + _NEAR_STEPS for s in went_down) for r in rows)
    n = len(rows)
    text = f"It came back briefly {n} {'time' if n == 1 else 'times'}: {', '.join(listed)}{', …' if n > 4 else ''}"
    if after:
        text += (f"; {after} of them right after the server or the run was relaunched"
                 + (f", {ended} ending as the server exited again" if ended else ""))
    return text + "."


def _step_in_progress(finding: Finding, run: RunData, events: pl.DataFrame) -> str:
    """For a run that stopped: how long the unfinished step had run, against the run's own steps,
    which tells a hang from a step that is merely slow."""
    if finding.kind not in ("stall", "crash"):
        return ""
    earlier = run.steps.filter(pl.col("step") < finding.onset_step)
    if earlier.is_empty():
        return ("No step had finished yet: an oversized first step looks the same as a deadlock, so compare "
                "with the first step of a healthy run before calling it one.")
    before = earlier.filter(pl.col("time").is_not_null())
    first = _first_failures(finding, events) if not finding.redone else None
    if first is not None and first.height and first.select(DATED_ABOVE.fill_null(False).all()).item():
        return (f"How long step {finding.onset_step} had run when it failed is not known: its failure's lines carry no "
                "time of their own (they take the time of the logger line above them).")
    failed_at = finding.failed_at if finding.redone else (first["time"][0] if first is not None and first.height else finding.until)
    durations = step_durations(run.steps)
    if before.is_empty() or failed_at is None or durations.is_empty():
        return ""
    # (an attempt a relaunch abandoned died after its own last step: the run's copy of it is the relaunch's)
    ran = (failed_at - (finding.last_step_time if finding.redone and finding.last_step_time else before["time"].max())).total_seconds()
    typical = float(durations["seconds"].median())
    if typical <= 0 or ran < 0:
        return ""
    # Estimated step times leave out the run's start-up: the step ran at most this long, which can
    # show it was not stuck but never that it was.
    at_most = "at most " if run.estimated_step_times else ""
    if at_most and ran > 3 * typical:
        return (f"Step {finding.onset_step} had run at most {_duration(ran)} when it failed ({ran / typical:.1f}× the "
                f"run's median step, {_duration(typical)}), by step times estimated from the Ray session's start: "
                "whether it hung cannot be told from them.")
    verdict = ("far longer than a step takes: stuck, not slow" if ran > 3 * typical
               else "within a normal step's time: not stuck")
    return (f"Step {finding.onset_step} had run {at_most}{_duration(ran)} when it failed, {ran / typical:.1f}× the run's "
            f"median step ({_duration(typical)}): {verdict}.")


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def _last_time(steps: pl.DataFrame) -> datetime | None:
    times = steps["time"].drop_nulls()
    return times.max() if len(times) else None  # type: ignore[return-value]


def _went_on(finding: Finding) -> list[Evidence]:
    """For a stall only other logs went on through: the last line they logged."""
    row = finding.seen
    if row is None or finding.last_step_time is None:
        return []
    after = _duration((row["time"] - finding.last_step_time).total_seconds())
    text = f"{row['key']} = {row['value']:.4g}, logged {after} after the last step"
    return [Evidence("metric", row["time"], row["step"], row["file"], row["line"], text)]


def _onset_evidence(finding: Finding, run: RunData) -> Evidence | None:
    """The line that shows the onset itself: the metric's row at the onset step."""
    if finding.metric is None:
        copies = run.steps
        if finding.redone and finding.last_step_time is not None:
            copies = run.step_copies.filter(pl.col("time") == finding.last_step_time)
        elif finding.redone:  # (a log with no times: the abandoned attempt's copy is the one logged first)
            copies = run.step_copies.sort("line").unique("step", keep="first", maintain_order=True)
        last = copies.filter(pl.col("step") == finding.onset_step - 1)
        if last.is_empty():
            return None
        row = last.row(0, named=True)
        return Evidence("last_step", row["time"], row["step"], row["file"], row["line"], f"last step logged: {row['step']}")
    hit = run.metrics.filter((pl.col("step") == finding.onset_step) & (pl.col("key") == finding.metric))
    if finding.onset_row is None and hit.is_empty():
        return None
    row = finding.onset_row or hit.row(0, named=True)
    # The line itself, as evidence quotes lines (AReaL's table row, a loop's line); what it logged,
    # said, where there is no line (a copy's record).
    line, quoted = cited_row(row["file"], row["line"], row["key"])
    text = _quoted_around(quoted.strip(), row["key"]) if quoted else f"step {row['step']}: {row['key']} = {row['value']:.4g}"
    return Evidence("metric", row["time"], row["step"], row["file"], line, text)


def _quoted_around(line: str, key: str, width: int = 300) -> str:
    """The first ``width`` characters of ``line``, or, where the cell of ``key`` and the value after
    it lie past them (AReaL prints several key-value pairs a row), the part of the line from that cell."""
    at = line.find(key)
    end = line.find("│", line.find("│", at + len(key)) + 1) if at >= 0 else -1
    if at < 0 or (end if end >= 0 else len(line)) < width:
        return line[:width]
    start = line.rfind("│", 0, at)
    return "…" + line[max(start, 0):][:width - 2] + ("…" if len(line) - max(start, 0) > width - 2 else "")


def _with_metric_events(events: pl.DataFrame, metrics: pl.DataFrame, primary: str | None) -> pl.DataFrame:
    """``events`` (in time order) with those the numbers themselves show, still in time order: non-finite
    values of the numbers watched (the loss, gradient norm, reward; a reader that quoted the row
    keeps its event, the others are told from the value), skipped optimizer steps."""
    watched = pl.col("key").is_in(keys_matching(metrics, NUMERIC_HEALTH))
    if primary:
        watched = watched | (pl.col("key") == primary)
    # One filter each, straight on the frame: a copy of all stepped rows costs gigabytes on long runs.
    stepped = pl.col("step").is_not_null()
    bad = metrics.filter(stepped & ~pl.col("value").is_finite() & watched).with_columns(
        pl.lit("nan_inf").alias("kind"), pl.lit("warning").alias("severity")
    )
    at = [pl.col("file").cast(pl.String), pl.col("line")]
    is_row = NON_FINITE_ROW.fill_null(False)
    quoted = events.filter(is_row).with_columns(*at)
    cited = bad.select(*at).unique()
    kept = quoted.join(cited, on=["file", "line"], how="semi", nulls_equal=False)
    bad = bad.with_columns(*at).join(quoted.select("file", "line").unique(), on=["file", "line"], how="anti")
    told = _metric_events(bad, metrics)
    if quoted.is_empty() and told.is_empty():  # (nothing to add: a log of millions of events is not copied and sorted again)
        return events
    return pl.concat([conform(events.filter(~is_row), EVENT_SCHEMA), conform(kept, EVENT_SCHEMA), told]).sort("time", "file", "line", nulls_last=True)


def _metric_events(bad: pl.DataFrame, metrics: pl.DataFrame) -> pl.DataFrame:
    """Events told from metric values: ``bad`` (non-finite, watched, no row quoted) and skipped optimizer steps."""
    stepped = pl.col("step").is_not_null()
    skipped = metrics.filter(stepped & (pl.col("value") == 0) & pl.col("key").is_in(keys_matching(metrics, "update_successful$"))).with_columns(
        pl.lit("overflow_skip").alias("kind"), pl.lit("warning").alias("severity")
    )
    rows = pl.concat([conform(bad, METRIC_SCHEMA | {"kind": pl.String, "severity": pl.String}),
                      conform(skipped, METRIC_SCHEMA | {"kind": pl.String, "severity": pl.String})]).with_columns(
        # The parser that read the value, in the contract's names (verl's JSONL copy is verl's).
        pl.col("source").cast(pl.String).replace({"verl_jsonl": "verl", "trl_state": "trl"}).alias("source"),
        pl.format("step {}: {} = {}", pl.col("step"), pl.col("key"), pl.col("value")).alias("message"),
    )
    return conform(rows, EVENT_SCHEMA)
