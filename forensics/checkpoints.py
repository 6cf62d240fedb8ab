"""Which checkpoint to go back to: the newest complete one strictly before the first
incident, with what a user needs to know before resuming from it.
"""

from __future__ import annotations

import itertools
import os
import shlex
from pathlib import Path

import polars as pl

from forensics.model import Checkpoint, Incident, Recommendation, kind_words
from parsers.areal_config import read_areal_config, read_areal_version
from parsers.verl_checkpoints import resume_args
from parsers.verl_checkpoints import resume_command as verl_resume_command

_HF_WARNING = (
    "HF exports hold model weights only: resuming from one starts a fresh optimizer (Adam moments "
    "reset), a new step counter and LR schedule, and the dataloader from its beginning."
)


def to_checkpoints(frame: pl.DataFrame) -> list[Checkpoint]:
    """Checkpoint records from a parser's checkpoint frame (the policy's: AReaL ``default``/``actor``,
    verl's whole ``global_step_N`` — one without its actor, or the one its tracker names and that is
    gone, included: incomplete, they are passed over with their reason said)."""
    policy = pl.col("role").str.contains(r"^(?:default|actor)").fill_null(False) | (pl.col("kind") == "verl")
    rows = frame.filter(pl.col("step").is_not_null() & policy)
    return [
        Checkpoint(
            path=r["path"],
            step=int(r["step"]),
            kind=r["kind"],
            complete=bool(r["complete"]),
            resumable=bool(r["resumable"]),
            time=r["time"],
            problems=tuple(r["problems"] or ()),
        )
        for r in rows.sort("step", "path").iter_rows(named=True)
    ]


def recommend(checkpoints: list[Checkpoint], incidents: list[Incident], facts: dict[str, str], log_dir: Path,
              *, caveat: str | None = None, judged: bool = True, read_to: int | None = None,
              read_from: int | None = None, abandoned: frozenset[str] = frozenset(),
              foreign: frozenset[str] = frozenset()) -> Recommendation:
    """The checkpoint to resume from, or ``None`` with the reason. ``caveat``: why finding no
    incident does not make the run healthy (nothing judged, logs not read), when it does not;
    ``judged``: false when nothing could be judged (no step, no reward series), so that no
    checkpoint is called healthy — the newest is named in the reason, not chosen.
    ``read_to``: the last step read, when the run may have logged steps after it that could not be
    read — a checkpoint past it was saved in steps nothing judged (never chosen, said).
    ``read_from``: the first step read — a state already under way there (a collapse) may have begun
    before the logs do, so no checkpoint before it is known healthy.
    ``abandoned``: paths of checkpoints an attempt a relaunch abandoned saved; ``foreign``: of those
    another run left in the folder (never chosen either)."""
    complete = [c for c in checkpoints if c.complete and c.path not in abandoned | foreign]
    skipped = [c for c in checkpoints if not c.complete or c.path in abandoned | foreign]
    warnings = [f"skipped {'' if c.complete else 'incomplete '}checkpoint {c.path}: {'; '.join(c.problems)}" for c in skipped]
    redone = [i for i in incidents if i.redone]
    incidents = [i for i in incidents if not i.redone]  # a relaunch from before them re-ran their steps
    if not incidents:
        found = f"No incident found, but {caveat}" if caveat else "No incident found"
        if redone:
            onsets = sorted({i.onset_step for i in redone})
            found = ("No incident in the run's final history (" + (
                f"the incident at step {onsets[0]} was in an attempt a relaunch abandoned" if len(redone) == 1 else
                f"the {len(redone)} incidents, at step {', '.join(map(str, onsets))}, were in attempts relaunches abandoned")
                + ")" + (f", but {caveat}" if caveat else ""))
        if not complete:
            theirs, others = (sum(1 for c in checkpoints if c.path in paths) for paths in (abandoned, foreign))
            none = ("no complete checkpoint was found" + (f" but the {theirs} an attempt a relaunch abandoned saved" if theirs else "")
                    + (f"{' or' if theirs else ' but'} the {others} an earlier run left in the folder" if others else ""))
            reason = f"{found}; {none}." if caveat or redone else f"The run looks healthy, but {none}."
            return Recommendation(None, None, reason, None, tuple(warnings))
        unjudged = [c for c in complete if read_to is not None and c.step > read_to]
        if unjudged:
            complete = [c for c in complete if c not in unjudged]
            warnings.append(f"{len(unjudged)} checkpoint{'s' if len(unjudged) > 1 else ''} after step {read_to}, the last step "
                            f"that could be read (up to step {max(c.step for c in unjudged)}), "
                            f"{'were' if len(unjudged) > 1 else 'was'} not considered: no step after it was judged")
            if not complete:
                return Recommendation(None, None, f"{found}; no complete checkpoint was saved by step {read_to}, the last "
                                                  "step that could be read.", None, tuple(warnings))
        best = max(complete, key=lambda c: (c.step, c.resumable))
        if not judged:
            return Recommendation(None, None, f"{found}, so no checkpoint can be called healthy; the newest complete "
                                              f"one is step {best.step} ({best.path}).", None, tuple(warnings))
        reason = f"{found}; step {best.step} is the newest complete checkpoint."
        command = _resume_command(best, facts, log_dir)
        return Recommendation(best.path, best.step, reason, command, tuple(warnings + _no_command(best, command, log_dir) + _kind_warnings(best)))

    first = min(incidents, key=lambda i: i.onset_step)
    before = [c for c in complete if c.step < first.onset_step]
    # (a recover checkpoint saved after an incident ended holds the recovered run: not broken)
    for c in checkpoints:
        during = _during(c.step, incidents) if c.kind == "recover" else None
        if during is not None:
            warnings.append(
                f"The recover checkpoint {c.path} was overwritten at step {c.step}, during the {kind_words(during.kind)} "
                f"from step {during.onset_step}: an automatic resume (recover.mode) would continue from the broken state."
            )
    if not before:
        reason = f"No complete checkpoint was saved before the first incident's onset at step {first.onset_step}."
        if not checkpoints:
            reason = f"No checkpoint was found, so none before the first incident's onset at step {first.onset_step}."
        if complete:
            reason += f" The oldest one (step {min(c.step for c in complete)}) is already after it."
        # (one saved after the incident ended is still worth naming: the only resume point there is)
        return Recommendation(None, None, reason, None, tuple(warnings + _after_recovery(complete, incidents)))
    if first.began_after is not None:
        unknown = [c for c in before if c.step > first.began_after]
        before = [c for c in before if c.step <= first.began_after]
        warnings += [f"skipped checkpoint {c.path}: saved at step {c.step}, after step {first.began_after}, the last step "
                     f"known healthy before the onset, where the {kind_words(first.kind)} may already have begun"
                     for c in unknown]
        if not before:
            return Recommendation(None, None, f"No complete checkpoint was saved by step {first.began_after}, the last step "
                                              f"known healthy before the {kind_words(first.kind)} (it began between steps "
                                              f"{first.began_after + 1} and {first.onset_step}).", None, tuple(warnings))
    best = max(before, key=lambda c: (c.step, c.resumable))
    if read_from is not None and first.onset_step <= read_from and first.kind not in ("crash", "stall"):
        reason = (f"The {kind_words(first.kind)} was already under way at step {read_from}, the first step the "
                  "logs hold: it may have begun before them, so no checkpoint is known healthy. The newest before it is "
                  f"step {best.step} ({best.path}); find the run's earlier logs (an older rotated trainer.log, its W&B "
                  "run) to tell whether it is.")
        return Recommendation(None, None, reason, None, tuple(warnings))
    lost = first.onset_step - best.step - 1
    reason = (
        f"Step {best.step} is the newest complete checkpoint before the {kind_words(first.kind)} "
        f"at step {first.onset_step}; resuming from it redoes {lost} healthy step{'s' if lost != 1 else ''}."
    )
    if first.began_after is not None:
        lost = first.began_after - best.step
        reason = (f"Step {best.step} is the newest complete checkpoint before the {kind_words(first.kind)}, which began "
                  f"between steps {first.began_after + 1} and {first.onset_step} (the log does not tell when in "
                  f"those steps: see the incident); resuming from it redoes {lost} step{'s' if lost != 1 else ''} known healthy.")
    warnings += _after_recovery(complete, incidents)
    command = _resume_command(best, facts, log_dir)
    return Recommendation(best.path, best.step, reason, command, tuple(warnings + _no_command(best, command, log_dir) + _kind_warnings(best)))


def _during(step: int, incidents: list[Incident]) -> Incident | None:
    """The incident going on at ``step``, if any."""
    return next((i for i in incidents if i.onset_step <= step and (i.end_step is None or step < i.end_step)), None)


def _after_recovery(complete: list[Checkpoint], incidents: list[Incident]) -> list[str]:
    """The newest checkpoint saved after an incident ended and before the next began: a closer
    resume point than the one before the first incident, if those steps did the weights no harm."""
    ordered = sorted(incidents, key=lambda i: i.onset_step)
    newest: tuple[Checkpoint, Incident, Incident | None] | None = None
    for n, incident in enumerate(ordered):
        if incident.end_step is None:
            break
        following = ordered[n + 1] if n + 1 < len(ordered) else None
        saved = [c for c in complete if c.step >= incident.end_step and (following is None or c.step < following.onset_step)]
        if saved:
            newest = (max(saved, key=lambda c: (c.step, c.resumable)), incident, following)
    if newest is None:
        return []
    chosen, ended, following = newest
    span = f"healthy again until the {kind_words(following.kind)} at step {following.onset_step}" if following else "healthy since"
    return [f"The {kind_words(ended.kind)} at step {ended.onset_step} ended at step {ended.end_step} and the run was "
            f"{span}: step {chosen.step} ({chosen.path}), saved after it, is newer — it holds what the incident's "
            f"steps ({ended.onset_step}–{ended.end_step - 1}) did to the weights; resume from it only if they did no harm."]


def _no_command(chosen: Checkpoint, command: str | None, log_dir: Path) -> list[str]:
    """Why no resume command is given, and what to relaunch with."""
    if command is not None:
        return []
    if chosen.kind == "verl":
        return [f"No resume command: the logs hold neither the run's launch line nor its overrides (Hydra prints them only "
                f"when the job raises); relaunch it as it was launched, adding {shlex.join(resume_args(Path(chosen.path)))}."]
    if chosen.kind in ("hf_export", "recover"):
        return [_NO_LAUNCH_LINE.format(how=_launcher(log_dir)[1] if chosen.kind == "recover" else f"actor.path={chosen.path}")]
    return []


def _launcher(log_dir: Path) -> tuple[str, str]:
    """AReaL's local launcher module and the override that resumes from the recover checkpoint, as
    of the release the run's ``version.json`` names: v1.0 moved the launcher under ``areal.infra``
    and took ``resume`` out of ``recover.mode`` (``on`` recovers)."""
    if (read_areal_version(log_dir / "version.json") or (0,)) >= (1,):
        return "areal.infra.launcher.local", "recover.mode=on"
    return "areal.launcher.local", "recover.mode=resume"


_NO_LAUNCH_LINE = ("No resume command: the trainer log has no launcher line (AReaL's 'Starting local process with "
                   "command'), so the training script is not known; relaunch it as it was launched, with {how}.")


def _kind_warnings(chosen: Checkpoint) -> list[str]:
    if chosen.kind == "hf_export":
        return [_HF_WARNING]
    if chosen.kind == "verl" and not chosen.resumable:
        missing = [what for what in ("optimizer", "scheduler/RNG") if any(f"no {what} state" in p for p in chosen.problems)]
        lacks = " or ".join(missing) or "optimizer"
        return [f"This verl checkpoint has no {lacks} state (the run's checkpoint.save_contents left it out): resuming "
                f"restarts {'them' if len(missing) > 1 else 'it'}."]
    if chosen.kind == "trl" and not chosen.resumable:
        return ["This checkpoint has no optimizer or scheduler state (optimizer.pt, scheduler.pt): resuming restarts them."]
    return []


def _resume_command(chosen: Checkpoint, facts: dict[str, str], log_dir: Path) -> str | None:
    """A launch line that starts from ``chosen``: verl's resume flags, or AReaL's launcher when the
    log says how the run was started."""
    if chosen.kind == "verl":  # the run's own overrides, when Hydra printed them (a job that raised)
        overrides = shlex.split(facts.get("launch_overrides", ""))
        if not overrides:
            return None
        kept = [w for w in overrides if not w.startswith(("trainer.resume_mode=", "trainer.resume_from_path="))]
        return verl_resume_command(Path(chosen.path), shlex.join(["python3", "-m", "verl.trainer.main_ppo", *kept]))
    if chosen.kind == "trl":  # the training script's own call (or its --resume_from_checkpoint argument)
        return f"trainer.train(resume_from_checkpoint={chosen.path!r})"
    script = _trainer_script(facts.get("launch_command", ""))
    if script is None:
        return None
    config = log_dir / "config.yaml"
    config_arg = str(config) if config.is_file() else script[1]
    if config_arg is None:
        return None
    experiment = facts.get("experiment_name")
    trial = facts.get("trial_name")
    launcher, resume = _launcher(log_dir)
    args = ["python3", "-m", launcher, script[0], "--config", config_arg]
    if experiment:
        args.append(f"experiment_name={experiment}")
    settings = read_areal_config(config) if config.is_file() else {}
    if chosen.kind == "recover":
        if trial:
            args.append(f"trial_name={trial}")
        args.append(resume)
    else:
        new_trial = _unused_trial(f"{trial or 'trial'}-from-step{chosen.step}", chosen, trial, log_dir)
        args += [f"trial_name={new_trial}", f"actor.path={chosen.path}"]
        args += _fresh_start(chosen, settings, trial, new_trial)
    args += _moved_fileroot(chosen, settings)
    return shlex.join(args)


def _unused_trial(name: str, chosen: Checkpoint, trial: str | None, log_dir: Path) -> str:
    """``name``, or ``name-2``, ``-3``… where a trial of that name is already on disk (this
    command run once before): launched into it, AReaL would find that trial's recover checkpoint
    and resume its state, and write over its logs and saves."""
    trials = [log_dir.parent] + [p.parent for p in Path(chosen.path).parents if trial and p.name == trial][:1]
    for n in itertools.count(1):
        candidate = name if n == 1 else f"{name}-{n}"
        if not any(os.path.lexists(folder / candidate) for folder in trials):
            return candidate
    raise AssertionError("unreachable")


def _fresh_start(chosen: Checkpoint, config: dict[str, object], trial: str | None, new_trial: str) -> list[str]:
    """Overrides that make a launch from an export a new trial in every section of the dumped
    config, which holds each section's ``trial_name`` resolved: left as they were, the saver would
    write into the analyzed trial's folders and ``recover.mode=auto`` would find its recover
    checkpoint (saved after the onset) and resume the broken state. The inference server loads
    the export too: its ``model_path`` is a copy of the original ``actor.path``, and until the
    first weight update it would generate with the base model."""
    base = _same_model(config.get("actor.path"))
    renamed = [f"{key}={new_trial}" for key, value in config.items() if key.endswith(".trial_name") and trial and value == trial]
    served = [f"{key}={chosen.path}" for key, value in config.items()
              if key.endswith(".model_path") and key.split(".", 1)[0] in ("sglang", "vllm") and base and _same_model(value) == base]
    return renamed + served


def _same_model(path: object) -> str | None:
    """A model's path as written in a config, for comparing two: ``/models/Qwen/`` is ``/models/Qwen``."""
    return str(path).rstrip("/") or str(path) if isinstance(path, str) and path else None


def _moved_fileroot(chosen: Checkpoint, config: dict[str, object]) -> list[str]:
    """Overrides for a tree that no longer lives where its config says (copied to another machine):
    AReaL finds its recover checkpoint, and writes its logs, under ``cluster.fileroot``; the dumped
    config holds that path resolved in every section, so each is set."""
    old = config.get("cluster.fileroot")
    here = next((p.parent for p in Path(chosen.path).parents if p.name == "checkpoints"), None)
    if not isinstance(old, str) or here is None or Path(old) == here:
        return []
    return [f"{key}={here}" for key, value in config.items() if key.endswith(".fileroot") and value == old]


def _trainer_script(command: str) -> tuple[str, str | None] | None:
    """The training script and its ``--config`` from the launcher's ``Starting local process`` line."""
    try:
        words = shlex.split(command.split(" 2>&1")[0])
    except ValueError:
        return None
    scripts = [w for w in words if w.endswith(".py")]
    if not scripts:
        return None
    config = None
    if "--config" in words[:-1]:
        config = words[words.index("--config") + 1]
    return scripts[-1], config
