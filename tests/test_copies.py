"""The same run read from its console log, a real offline W&B run, and a real TensorBoard file."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterable
from datetime import datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from areal_builder import RunSpec, healthy_reward, write_run

from forensics import analyze
from forensics.keys import ANALYSIS_KEYS
from parsers import read_areal_log

pytest.importorskip("wandb")
tensorboardX = pytest.importorskip("tensorboardX")

ONSET = 70
KEYS = ("grpo_actor/task_reward/avg", "grpo_actor/actor_loss/avg", "grpo_actor/grad_norm")

WANDB_WRITER = textwrap.dedent(
    """
    import json, sys, wandb
    spec = json.loads(sys.argv[1])
    run = wandb.init(mode="offline", dir=spec["dir"], project="copies", id=spec.get("id", "copyrun1"))
    for step, row in spec["rows"]:
        run.log(row, step=step)
    wandb.finish()
    """
)


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("console") / "outputs"
    paths = write_run(root, RunSpec(last_step=100, reward=lambda s: 0.0 if s >= ONSET else healthy_reward(s)))
    metrics = read_areal_log(paths.trainer_log).metrics.filter(pl.col("key").is_in(KEYS))
    # AReaL hands W&B and TensorBoard its 0-based global step; its log prints it 1-based.
    rows = [
        (step - 1, dict(zip(group["key"], group["value"], strict=True)))
        for (step,), group in metrics.sort("step").group_by("step", maintain_order=True)
    ]
    return paths, rows


def write_wandb(target: Path, rows: list, run_id: str = "copyrun1") -> None:
    home = target / ".home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(HOME=str(home), WANDB_CONFIG_DIR=str(home / ".config"), WANDB_CACHE_DIR=str(home / ".cache"),
               WANDB_SILENT="true", WANDB_MODE="offline", WANDB_DISABLE_GIT="true")
    spec = json.dumps({"dir": str(target), "rows": rows, "id": run_id})
    subprocess.run([sys.executable, "-c", WANDB_WRITER, spec], env=env, check=True, timeout=180)


def onset_of(path: Path) -> tuple[int, str]:
    [run] = analyze([path]).runs
    [incident] = [i for i in run.incidents if i.kind == "reward_collapse"]
    return incident.onset_step, run.framework


def write_tensorboard(folder: Path, rows: list, wall=None) -> None:
    """The copy's rows as TensorBoard scalars (``wall``: a step's wall time, else now)."""
    writer = tensorboardX.SummaryWriter(str(folder))
    for step, row in rows:
        for key, value in row.items():
            writer.add_scalar(key, value, step, walltime=wall(step) if wall else None)
    writer.close()


def cut_at_step_50(console, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the console run whose trainer log stops before step 51 (its tee died): the tree, the log."""
    paths, _ = console
    tree = tmp_path / "outputs"
    shutil.copytree(paths.fileroot, tree)
    log = tree / paths.trainer_log.relative_to(paths.fileroot)
    lines = log.read_text().splitlines(keepends=True)
    log.write_text("".join(lines[: next(i for i, line in enumerate(lines) if "Train step 51/" in line)]))
    return tree, log


def test_console_log_onset(console) -> None:
    paths, _ = console
    assert onset_of(paths.fileroot) == (ONSET, "areal")


def test_wandb_copy_alone_gives_the_same_onset(console, tmp_path: Path) -> None:
    _, rows = console
    write_wandb(tmp_path / "wandb-only", rows)
    assert onset_of(tmp_path / "wandb-only") == (ONSET, "areal")
    [run] = analyze([tmp_path / "wandb-only"]).runs  # the shift to the trainer log's numbering is said
    assert any(note.startswith("wandb steps are shown +1 (AReaL logs its 0-based global_step") for note in run.notes)
    # Its times are epoch stamps in this machine's zone: said, with the zone, as no log gives the host's.
    zone = datetime.now().astimezone().strftime("%Z, UTC%z")
    assert f"times are W&B's epoch stamps shown in this machine's time zone ({zone}): no log of the run's own gives" in " ".join(run.notes)


def test_tensorboard_copy_alone_gives_the_same_onset(console, tmp_path: Path) -> None:
    _, rows = console
    write_tensorboard(tmp_path / "tb", rows)
    assert onset_of(tmp_path / "tb") == (ONSET, "areal")
    [run] = analyze([tmp_path / "tb"]).runs
    [collapse] = [i for i in run.incidents if i.kind == "reward_collapse"]
    assert collapse.cause == "unknown" and "No text log was found, only copies of the run's numbers" in collapse.summary


def as_minibatches(rows: list, k: int) -> list:
    """AReaL's StatsLogger with ``k`` minibatches a step: each update's record at a step of its
    own (``log_step = max(global_step, last + 1)``, then ``log_step + i``), the batch's reward in
    the first only (areal/utils/stats_logger.py, areal/engine/ppo/actor.py at v0.4.0)."""
    out, last = [], -1
    for global_step, row in rows:
        updates = [{key: value + (i - (k - 1) / 2) / 100 for key, value in row.items() if "task_reward" not in key} for i in range(k)]
        updates[0] |= {key: value for key, value in row.items() if "task_reward" in key}
        at = max(global_step, last + 1)
        out += [(at + i, update) for i, update in enumerate(updates)]
        last = at + k - 1
    return out


@pytest.mark.parametrize("copy", ["wandb", "tensorboard"])
def test_an_areal_copy_with_minibatches_alone_is_read_in_training_steps(console, tmp_path: Path, copy: str) -> None:
    """Four minibatches a step put a step's updates at four W&B/TensorBoard steps: the copy is
    steps 1-100 with the collapse at its step, not 400 steps with it at step 277."""
    _, rows = console
    spread = as_minibatches(rows, 4)
    (write_wandb if copy == "wandb" else write_tensorboard)(tmp_path / "copy", spread)
    [run] = analyze([tmp_path / "copy"]).runs
    assert run.step_range()["first"] == 1 and run.step_range()["last"] == 100
    assert [i.onset_step for i in run.incidents if i.kind == "reward_collapse"] == [ONSET]
    assert any(n.startswith(f"{copy} steps are minibatch updates, 4 to each training step") for n in run.notes), run.notes
    loss = run.metrics.filter(pl.col("key") == "grpo_actor/actor_loss/avg").sort("step")
    expected = dict(rows)[9]["grpo_actor/actor_loss/avg"]  # (the four updates' mean: the step's value)
    assert loss.filter(pl.col("step") == 10)["value"].item() == pytest.approx(expected)


def test_add_scalars_sub_folders_are_series_of_their_logdirs_run(tmp_path: Path) -> None:
    """``add_scalars("response_length", {...})`` writes each series in ``<logdir>/response_length/<name>/``:
    they are the logdir's run's series, not runs of their own (best-checkpoint refused the folder
    as three runs)."""
    logdir = tmp_path / "tensorboard_log" / "proj" / "exp"
    writer = tensorboardX.SummaryWriter(str(logdir))
    for step in range(1, 61):
        writer.add_scalar("critic/score/mean", 0.0 if step >= 40 else 0.55 + step % 7 / 50, step)
        writer.add_scalars("response_length", {"mean": 300.0 + step, "max": 1024.0}, step)
    writer.close()
    [run] = analyze([logdir]).runs
    keys = set(run.metrics["key"].cast(pl.String).unique())
    assert {"response_length/mean/response_length", "response_length/max/response_length"} < keys
    assert [i.onset_step for i in run.incidents if i.kind == "reward_collapse"] == [40]


def test_a_nan_in_a_copy_alone_is_no_log_that_went_on(console, tmp_path: Path) -> None:
    """A NaN gradient norm after the onset, told from the copy's own numbers, was taken for a log
    going on past it: "no failure was logged … the reward pipeline", with no log to show one."""
    _, rows = console
    rows = [(step, {**row, "grpo_actor/grad_norm": math.nan} if step == ONSET + 10 else row) for step, row in rows]
    write_tensorboard(tmp_path / "tb", rows)
    [run] = analyze([tmp_path / "tb"]).runs
    [collapse] = [i for i in run.incidents if i.kind == "reward_collapse"]
    assert collapse.cause == "unknown" and "No text log was found, only copies of the run's numbers" in collapse.summary
    assert "nan_inf" in run.events["kind"].cast(pl.String).to_list()


def test_log_and_wandb_copy_merge_with_the_log_preferred(console, tmp_path: Path) -> None:
    paths, rows = console
    import shutil

    tree = tmp_path / "outputs"
    shutil.copytree(paths.fileroot, tree)
    log_dir = tree / paths.log_dir.relative_to(paths.fileroot)
    write_wandb(log_dir, rows[: len(rows) // 2])  # a W&B copy killed halfway through the run
    [run] = analyze([tree]).runs
    assert any(s.kind == "wandb" for s in run.sources)
    assert run.series_sources["grpo_actor/task_reward/avg"] == "areal"
    assert run.incidents[0].onset_step == ONSET
    assert any("fewer steps" in note for note in run.notes)
    assert any(note.startswith("wandb steps are shown +1 (so that its values line up") for note in run.notes)


def test_log_and_wandb_copy_analyze_the_same_with_only_the_analysis_keys(console, tmp_path: Path) -> None:
    """The copies are merged key by key: keeping only the analysis keys changes nothing else."""
    paths, rows = console
    tree = tmp_path / "outputs"
    shutil.copytree(paths.fileroot, tree)
    write_wandb(tree / paths.log_dir.relative_to(paths.fileroot), rows[: len(rows) // 2])
    [full], [kept] = analyze([tree]).runs, analyze([tree], keys=ANALYSIS_KEYS).runs
    assert [i.to_dict() for i in kept.incidents] == [i.to_dict() for i in full.incidents]
    assert kept.series_sources == {k: v for k, v in full.series_sources.items() if k in KEYS}
    assert set(KEYS) <= set(kept.series_sources)
    assert kept.metrics.height < full.metrics.height


@pytest.fixture(scope="module")
def relaunched(tmp_path_factory: pytest.TempPathFactory):
    """Seed 002's shape, stopped short: the first attempt logged 1–80 with the reward at 0 from
    step 60; a relaunch from step 50 logged 51–75, healthy, and the run ends there. Each attempt's
    values as AReaL hands them to W&B and TensorBoard (0-based), one part an attempt."""
    from areal_builder import Relaunch

    base = RunSpec(last_step=120, save_freq_steps=20, recover_mode="auto", recover_freq_steps=50,
                   relaunch=Relaunch(stop_after=80, resume_from=50, pause=200.0,
                                     first_reward=lambda s: 0.0 if s >= 60 else healthy_reward(s)))
    paths = write_run(tmp_path_factory.mktemp("relaunched") / "outputs", base)
    lines = paths.trainer_log.read_text().splitlines(keepends=True)
    h75 = [i for i, line in enumerate(lines) if "Train step 75/" in line][-1]
    paths.trainer_log.write_text("".join(lines[: next(i for i in range(h75, len(lines)) if lines[i].startswith("\u2558")) + 1]))
    log = read_areal_log(paths.trainer_log)

    def rows(frame: pl.DataFrame) -> list:
        frame = frame.filter(pl.col("key").is_in(KEYS)).sort("step")
        return [(step - 1, dict(zip(g["key"], g["value"], strict=True))) for (step,), g in frame.group_by("step", maintain_order=True)]

    first = rows(pl.concat([log.metrics.filter(pl.col("step") <= 50), log.superseded]))
    again = rows(log.metrics.filter(pl.col("step") > 50))
    assert (first[-1][0], again[0][0], again[-1][0]) == (79, 50, 74)
    return paths, first, again


def _one_abandoned_collapse(tree: Path) -> None:
    [run] = analyze([tree]).runs
    assert int(run.steps["step"].max()) == 75  # 76–80 are the abandoned attempt's, in every copy
    [incident] = run.incidents
    assert (incident.onset_step, incident.end_step, incident.recovered) == (60, 81, True)
    assert "in an attempt the run abandoned at step 80: a relaunch from step 50 took the run on from step 51" in incident.summary


def test_a_relaunched_runs_wandb_copy_holds_no_abandoned_values(relaunched, tmp_path: Path) -> None:
    """Beside the log, the W&B copy (two resumed folders) no longer brings back the abandoned steps
    76–80 as a collapse the run never recovered from; alone, it tells the abandoned collapse itself."""
    paths, first, again = relaunched
    tree = tmp_path / "outputs"
    shutil.copytree(paths.fileroot, tree)
    log_dir = tree / paths.log_dir.relative_to(paths.fileroot)
    write_wandb(log_dir, first)
    write_wandb(log_dir, again)
    _one_abandoned_collapse(tree)
    (log_dir / paths.trainer_log.name).unlink()
    _one_abandoned_collapse(tree)


def test_a_relaunch_logging_under_a_new_wandb_id_is_read_as_the_same_history(relaunched, tmp_path: Path) -> None:
    """verl (and many loops) call ``wandb.init`` without an id: each launch is a new run in the same
    ``wandb/`` folder. Read in the order they began, the relaunch going back abandons the first
    launch's steps from there, as a resumed run's folders do (they had been mixed, later values winning)."""
    import time

    paths, first, again = relaunched
    tree = tmp_path / "outputs"
    shutil.copytree(paths.fileroot, tree)
    log_dir = tree / paths.log_dir.relative_to(paths.fileroot)
    (log_dir / paths.trainer_log.name).unlink()
    write_wandb(log_dir, first, run_id="launch1")
    time.sleep(1.1)  # (a run folder's name holds its start to the second)
    write_wandb(log_dir, again, run_id="launch2")
    _one_abandoned_collapse(tree)
    [run] = analyze([tree]).runs
    notes = [n for s in run.sources for n in s.notes]
    assert "2 W&B runs in one folder (launch1, launch2) are read as one history in the order they began" in notes


def test_a_relaunched_runs_tensorboard_copy_holds_no_abandoned_values(relaunched, tmp_path: Path) -> None:
    paths, first, again = relaunched
    tree = tmp_path / "outputs"
    shutil.copytree(paths.fileroot, tree)
    log_dir = tree / paths.log_dir.relative_to(paths.fileroot)
    for suffix, part in ((".first", first), (".again", again)):
        writer = tensorboardX.SummaryWriter(str(log_dir / "tb"), filename_suffix=suffix)
        for step, row in part:
            for key, value in row.items():
                writer.add_scalar(key, value, step)
        writer.close()
    _one_abandoned_collapse(tree)
    (log_dir / paths.trainer_log.name).unlink()
    _one_abandoned_collapse(tree)


def test_a_collapse_in_the_middle_attempt_of_three_in_a_tensorboard_copy_is_told(tmp_path: Path) -> None:
    """Resumed twice: 0-79 healthy; from 49, 50-69 with the reward 0 from 55; from 39, 40-99 healthy.
    The middle attempt's copies of its steps are its own (one copy per step had hidden them)."""
    from areal_builder import healthy_reward

    def rows(lo: int, hi: int, zero_from: int | None = None) -> list:
        return [(s, {KEYS[0]: 0.0 if zero_from is not None and s >= zero_from else healthy_reward(s + 1),
                     KEYS[1]: -0.01 - s / 1e4, KEYS[2]: 0.3 + (s % 7) / 10}) for s in range(lo, hi + 1)]

    for i, part in enumerate([rows(0, 79), rows(50, 69, zero_from=55), rows(40, 99)]):
        writer = tensorboardX.SummaryWriter(str(tmp_path / "tb"), filename_suffix=f".part{i}")
        for step, row in part:
            for key, value in row.items():
                writer.add_scalar(key, value, step)
        writer.close()
        time.sleep(0.05)  # each file's first record a later wall time
    [run] = analyze([tmp_path / "tb"]).runs
    assert [(i.kind, i.onset_step, i.end_step) for i in run.incidents] == [("reward_collapse", 56, 71)]
    assert "in an attempt the run abandoned at step 70: a relaunch from step 40 took the run on from step 41" in run.incidents[0].summary


def test_a_copy_logged_every_tenth_step_counts_every_step_a_collapse_wasted(tmp_path: Path) -> None:
    """Scalars every 10 steps, the reward 0 from step 110 to the last, 300 (AReaL's 0-based steps:
    111 and 301 in log units): 191 steps went by, not the 20 logged, and the onset is bounded."""
    from areal_builder import healthy_reward

    writer = tensorboardX.SummaryWriter(str(tmp_path / "tb"))
    for step in range(10, 301, 10):
        writer.add_scalar(KEYS[0], 0.0 if step >= 110 else healthy_reward(step), step)
        writer.add_scalar(KEYS[1], -0.01 - step / 1e4, step)
    writer.close()
    [run] = analyze([tmp_path / "tb"]).runs
    [collapse] = run.incidents
    assert (collapse.onset_step, collapse.end_step, collapse.wasted_steps) == (111, None, 190)
    assert "so it began between steps 102 and 111" in collapse.summary


def test_a_step_log_cut_short_goes_on_in_its_copy(console, tmp_path: Path) -> None:
    """The trainer log stops at step 50 (its tee died), a TensorBoard copy holds all 100 steps: the
    run's steps are 1-100, the collapse at 70 never recovered and wasted 30 steps after it, and no note says
    steps after 50 could not be read."""
    tree, log = cut_at_step_50(console, tmp_path)
    write_tensorboard(log.parent / "tensorboard", console[1])
    [run] = analyze([tree]).runs
    assert run.step_range()["last"] == 100
    [collapse] = [i for i in run.incidents if i.kind == "reward_collapse"]
    assert (collapse.onset_step, collapse.end_step, collapse.wasted_steps) == (ONSET, None, 30)
    assert "never recovered" in collapse.summary
    assert "the step log ends at step 50; steps 51–100 are known only from its copy (tensorboard)" in run.notes
    # No log saw step 70: that no failure was logged there says nothing, so no cause is claimed.
    assert collapse.cause == "unknown" and "No failure of any kind" not in collapse.summary
    assert "No log covers the onset: the step log ends at step 50 and nothing else was logged after it" in collapse.summary
    assert not [n for n in run.notes if "could not be read" in n]


def test_a_copy_logged_per_micro_step_is_read_in_the_loops_steps(tmp_path: Path) -> None:
    """A hand-rolled loop prints iterations 0-59 of four micro-steps each (seed 003's format) and
    writes TensorBoard scalars per micro-step (global step 4·iteration + micro); rewards are 0 from
    iteration 30. The copy is read in iterations — its micro-steps averaged, as the log averages
    them — so the run is steps 0-59 and the collapse begins at 30, not at micro-step 120."""
    lines, writer = [], tensorboardX.SummaryWriter(str(tmp_path / "run" / "runs" / "grpo"))
    for n in range(60):
        for m in range(4):
            reward = 0.0 if n >= 30 else 0.25 + (n * 7 + m * 3) % 11 / 20
            spread = 0.0 if n >= 30 else 0.3 + m / 100
            lines += [f"[Micro {m}] 1. Iteration start: mem=16104.8 MB, time=0.000s",
                      f"[Micro {m}] 3. Samples scored: mem=18411.7 MB, time=2.5{m}0s, rewards={reward:.4f}±{spread:.4f}"]
            writer.add_scalar("reward/mean", reward, 4 * n + m)
            writer.add_scalar("reward/std", spread, 4 * n + m)
        lines.append(f"iter {n}: loss {0.1 + n / 1000:.4f} (main {0.1 + n / 1000:.4f}, critic 0.0000), time 25000.00ms")
    writer.close()
    (tmp_path / "run" / "train.log").write_text("\n".join(lines) + "\n")
    [run] = analyze([tmp_path / "run"]).runs
    assert run.step_range()["last"] == 59
    assert [(i.kind, i.onset_step) for i in run.incidents if i.kind == "reward_collapse"] == [("reward_collapse", 30)]
    assert any(n.startswith("tensorboard steps are micro-steps, 4 to each of the text log's steps") for n in run.notes), run.notes


def test_a_copy_read_in_another_time_zone_is_put_on_the_logs_clock(console, tmp_path: Path) -> None:
    """The trainer log stops at step 50; a TensorBoard copy of all 100 steps whose wall times, read
    in this machine's zone, are 8 h ahead of the log's (a cluster in UTC, a laptop in UTC+8): its
    steps past the log are on the log's clock, so the collapse at 70 begins when the run was there,
    not 8 h later, and its hours are the run's."""
    paths, rows = console
    tree, log = cut_at_step_50(console, tmp_path)
    at = dict(analyze([paths.fileroot]).runs[0].steps.select("step", "time").iter_rows())
    write_tensorboard(log.parent / "tensorboard", rows, wall=lambda step: (at[step + 1] + timedelta(hours=8, seconds=0.5)).timestamp())
    [run] = analyze([tree]).runs
    assert "tensorboard times were 8 h ahead of the step log's (epoch times read in this machine's time zone, " \
           "the log printed in the training host's): put on the log's clock" in run.notes
    [collapse] = [i for i in run.incidents if i.kind == "reward_collapse"]
    assert abs((collapse.onset_time - at[ONSET]).total_seconds()) < 2
    assert collapse.wasted_hours is not None and collapse.wasted_hours < 2


def test_a_verl_run_known_only_from_wandb_finds_its_checkpoints_beside_it(tmp_path: Path) -> None:
    """verl's W&B copy alone in its working folder, the checkpoints at ``checkpoints/<project>/<exp>``
    beside ``wandb/``: they are read as verl's, and the one before the collapse is chosen."""
    from verl_builder import write_checkpoint

    rows = [(s, {"critic/score/mean": 0.0 if s >= 30 else 0.3 + s % 7 / 50, "actor/pg_loss": 0.01 + s % 5 / 100,
                 "actor/grad_norm": 0.5 + s % 3 / 10}) for s in range(1, 41)]
    write_wandb(tmp_path / "run", rows)
    for step in (10, 20, 30, 40):
        write_checkpoint(tmp_path / "run" / "checkpoints" / "copies" / "exp" / f"global_step_{step}", world_size=2)
    [run] = analyze([tmp_path / "run"]).runs
    assert [(i.kind, i.onset_step) for i in run.incidents] == [("reward_collapse", 30)]
    assert [c.step for c in run.checkpoints] == [10, 20, 30, 40] and {c.kind for c in run.checkpoints} == {"verl"}
    # No log holds the run's launch line or overrides: no command to paste, the flags to add are said.
    assert run.recommendation.step == 20 and run.recommendation.resume_command is None
    assert any(w.startswith("No resume command:") and "trainer.resume_from_path=" in w for w in run.recommendation.warnings)


def test_a_hugging_face_trainers_checkpoints_beside_its_tensorboard_runs_are_chosen_from(console, tmp_path: Path) -> None:
    """A TRL/``Trainer`` run: TensorBoard under ``output_dir/runs/…``, ``checkpoint-N/`` in
    ``output_dir``. The newest complete one before the collapse is chosen (a damaged one skipped,
    one without its optimizer said so), with the call that resumes from it."""
    import json as json_

    from test_areal_checkpoints import safetensors_bytes

    out = tmp_path / "output_dir"
    write_tensorboard(out / "runs" / "Nov27_10-00-00_node1", console[1])
    for step in (20, 40, 60, 80):
        folder = out / f"checkpoint-{step}"
        folder.mkdir()
        (folder / "config.json").write_text("{}")
        (folder / "model.safetensors").write_bytes(safetensors_bytes(2))
        (folder / "trainer_state.json").write_text(json_.dumps({"global_step": step}))
        if step != 40:
            (folder / "optimizer.pt").write_bytes(b"x")
            (folder / "scheduler.pt").write_bytes(b"x")
    (out / "checkpoint-60" / "model.safetensors").write_bytes(safetensors_bytes(2)[:-3])  # torn while saving
    [run] = analyze([out]).runs
    assert run.framework == "trl"  # (its checkpoints say so: the contract's framework, not "unknown")
    kinds = {(c.step, c.complete, c.resumable) for c in run.checkpoints}
    assert kinds == {(20, True, True), (40, True, False), (60, False, False), (80, True, True)}
    rec = run.recommendation
    assert (rec.step, Path(rec.checkpoint).name) == (40, "checkpoint-40")
    assert rec.resume_command == f"trainer.train(resume_from_checkpoint={str(out / 'checkpoint-40')!r})"
    assert any("no optimizer or scheduler state" in w for w in rec.warnings)


def test_a_trainers_wandb_run_finds_the_checkpoints_of_the_output_dir_beside_it(tmp_path: Path) -> None:
    """TRL's own layout: ``wandb/`` in the working folder, ``output_dir/checkpoint-N/`` below it. The
    W&B run's collapse at step 30 and checkpoint-20 before it, not "no complete checkpoint was saved"."""
    import json as json_

    from test_areal_checkpoints import safetensors_bytes

    rows = [(s, {"train/reward": 0.0 if s >= 30 else 0.4 + s % 7 / 50, "train/loss": 0.01 + s % 5 / 100}) for s in range(1, 41)]
    write_wandb(tmp_path / "proj", rows)
    for step in (10, 20, 30, 40):
        folder = tmp_path / "proj" / "out" / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
        (folder / "model.safetensors").write_bytes(safetensors_bytes(2))
        (folder / "trainer_state.json").write_text(json_.dumps({"global_step": step}))
        (folder / "optimizer.pt").write_bytes(b"x")
        (folder / "scheduler.pt").write_bytes(b"x")
    [run] = analyze([tmp_path / "proj"]).runs
    assert [(i.kind, i.onset_step) for i in run.incidents] == [("reward_collapse", 30)]
    assert (run.framework, run.recommendation.step, Path(run.recommendation.checkpoint).name) == ("trl", 20, "checkpoint-20")


def _trainer_checkpoints(out: Path, steps: Iterable[int], history: list[dict], *, max_steps: int, **state: object) -> None:
    """``out/checkpoint-N/`` as a Trainer saves it at each of ``steps``: weights, optimizer and
    scheduler, and ``trainer_state.json`` holding the log history to that step (written as
    transformers writes it: ``json.dumps(asdict(state), indent=2, sort_keys=True)``)."""
    from test_areal_checkpoints import safetensors_bytes

    for step in steps:
        folder = out / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
        (folder / "model.safetensors").write_bytes(safetensors_bytes(2))
        (folder / "optimizer.pt").write_bytes(b"x")
        (folder / "scheduler.pt").write_bytes(b"x")
        saved = {"global_step": step, "epoch": step / max_steps, "log_history": [h for h in history if h["step"] <= step],
                 "max_steps": max_steps, "logging_steps": 10, **state}
        (folder / "trainer_state.json").write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")

def test_a_trainers_checkpoints_alone_are_read_for_their_log_history(tmp_path: Path) -> None:
    """Only ``output_dir/checkpoint-N/`` is left (``report_to="none"``, or the W&B folder not kept).
    Each checkpoint's ``trainer_state.json`` holds the Trainer's log history to its save (written as
    transformers writes it: ``json.dumps(asdict(state), indent=2, sort_keys=True)``); the newest is
    read: the collapse at step 120 is found and cited at its entry's line, checkpoint-100 chosen."""
    out = tmp_path / "out"
    history = [{"step": s, "epoch": s / 200, "loss": 0.01 + s % 7 / 1000, "grad_norm": 0.5 + s % 3 / 10, "learning_rate": 1e-6,
                "reward": 0.0 if s >= 120 else 0.3 + s % 9 / 40, "reward_std": 0.0 if s >= 120 else 0.25} for s in range(10, 201, 10)]
    _trainer_checkpoints(out, (50, 100, 150, 200), history, max_steps=200, best_metric=None)
    [run] = analyze([out]).runs
    assert run.framework == "trl" and [(s.kind, Path(s.path).name) for s in run.sources] == [("trl_state", "trainer_state.json")]
    assert "checkpoint-200" in run.sources[0].path
    [incident] = run.incidents
    assert (incident.kind, incident.onset_step, incident.metric) == ("reward_collapse", 120, "train/reward")
    cited = incident.onset_evidence
    assert cited is not None and (out / "checkpoint-200" / "trainer_state.json").read_text().splitlines()[cited.line - 1].strip() == '"step": 120'
    assert (run.recommendation.step, Path(run.recommendation.checkpoint).name) == (100, "checkpoint-100")


def test_a_trainers_checkpoints_alone_say_no_text_log_could_show_the_cause(tmp_path: Path) -> None:
    """``trainer_state.json`` is a copy of the numbers: with no text log beside it, no failure
    could have been logged, so the cause is unknown, not the reward pipeline's."""
    out = tmp_path / "out"
    history = [{"step": s, "loss": 0.01, "reward": 0.0 if s >= 120 else 0.3 + s % 9 / 40} for s in range(10, 201, 10)]
    _trainer_checkpoints(out, (50, 100, 150, 200), history, max_steps=200)
    [incident] = analyze([out]).runs[0].incidents
    assert incident.cause == "unknown" and "No text log was found" in incident.summary


def test_grpo_trainers_total_reward_is_judged_not_its_first_reward_function(tmp_path: Path) -> None:
    """``reward_funcs=[format_reward, math_reward]``: TRL logs each function's mean and their sum
    as ``reward``. The math reward went to exactly zero at step 120, the format reward stayed near
    1: the run is judged by the sum, not by the function named first, and the part that collapsed
    (which the sum only shows as a fall) is the incident."""
    out = tmp_path / "out"
    history = [{"step": s, "loss": 0.01, "rewards/format_reward/mean": 0.95 + s % 3 / 100,
                "rewards/math_reward/mean": 0.0 if s >= 120 else 0.4 + s % 9 / 40} for s in range(10, 201, 10)]
    for entry in history:
        entry["reward"] = entry["rewards/format_reward/mean"] + entry["rewards/math_reward/mean"]
    _trainer_checkpoints(out, (50, 100, 150, 200), history, max_steps=200)
    [run] = analyze([out]).runs
    assert run.primary_metric == "train/reward"
    assert [(i.metric, i.onset_step) for i in run.incidents] == [("train/rewards/math_reward/mean", 120)]
    assert run.recommendation.step == 100


def test_a_custom_loops_reward_is_judged_before_a_reward_named_after_a_word(tmp_path: Path) -> None:
    """Of ``reward/mean`` and ``format_reward/mean``, the run's reward is the first."""
    from forensics.detect import choose_primary

    metrics = pl.DataFrame({"key": ["format_reward/mean", "reward/mean", "rewards/a_reward/mean"], "step": [1, 1, 1],
                            "value": [1.0, 0.5, 0.2]}).with_columns(pl.col("key").cast(pl.Categorical))
    assert choose_primary(metrics)[0] == "reward/mean"
    # a validation series logged every tenth step is not the run's reward, however short its name
    rows = [("policy/reward", s) for s in range(1, 101)] + [("val/reward", s) for s in range(10, 101, 10)]
    rows += [("evaluation/reward", s) for s in range(1, 101)]
    metrics = pl.DataFrame({"key": [k for k, _ in rows], "step": [s for _, s in rows], "value": [0.5] * len(rows)})
    assert choose_primary(metrics.with_columns(pl.col("key").cast(pl.Categorical)))[0] == "policy/reward"


def test_a_trainers_newest_state_cut_short_is_passed_over_for_the_one_before(tmp_path: Path) -> None:
    """The job was killed as ``checkpoint-200/trainer_state.json`` was written: half of it is on
    disk. ``checkpoint-150``'s is read instead (the collapse at 120 found, checkpoint-100 chosen),
    and the cut one is said."""
    out = tmp_path / "out"
    history = [{"step": s, "loss": 0.01, "reward": 0.0 if s >= 120 else 0.3 + s % 9 / 40} for s in range(10, 201, 10)]
    _trainer_checkpoints(out, (50, 100, 150, 200), history, max_steps=200)
    newest = out / "checkpoint-200" / "trainer_state.json"
    whole = newest.read_bytes()
    for cut in (whole[: len(whole) // 2], whole[: whole.rindex(b"}", 0, len(whole) - 3) + 1]):  # (the second ends in a nested "}")
        newest.write_bytes(cut)
        [run] = analyze([out]).runs
        assert [i.onset_step for i in run.incidents] == [120] and run.recommendation.step == 100
        assert any(line.startswith("trainer_state.json: cut off (no whole JSON document): checkpoint-150's is read")
                   for line in run.data_lost())


def test_a_trainers_windowed_mean_already_down_before_the_zeros_bounds_the_collapse_before_it(tmp_path: Path) -> None:
    """``logging_steps=10``: each logged reward is the mean of the ten steps up to it. Every step
    from 163 on scored 0, so step 170's mean is already a fraction of the level before it, and
    180's is 0: the collapse began in steps 161–170, and checkpoint-170 (saved after it began) is
    passed over for checkpoint-160."""
    per_step = {s: 0.0 if s >= 163 else 0.45 + s % 7 / 50 for s in range(1, 251)}
    history = [{"step": s, "epoch": s / 250, "loss": 0.01, "grad_norm": 0.5, "learning_rate": 1e-6,
                "reward": round(sum(per_step[k] for k in range(s - 9, s + 1)) / 10, 4)} for s in range(10, 251, 10)]
    out = tmp_path / "out"
    _trainer_checkpoints(out, range(50, 251, 10), history, max_steps=250, save_steps=10)
    [run] = analyze([out]).runs
    [incident] = run.incidents
    assert (incident.onset_step, incident.began_after) == (180, 160)
    assert ("train/reward logged at step 170 (0.092) was already far below its level before (0.512), and the other steps "
            "logged none, so it began between steps 161 and 180") in incident.summary
    assert (run.recommendation.step, Path(run.recommendation.checkpoint).name) == (160, "checkpoint-160")
    assert any("checkpoint-170: saved at step 170, after step 160, the last step known healthy" in w for w in run.recommendation.warnings)


def _trainer_copies(proj: Path, outputs: list[str]) -> list:
    """A Trainer's ``report_to=["wandb", "tensorboard"]`` in ``proj``: ``wandb/`` there, each of
    ``outputs`` (an ``output_dir``) with TensorBoard's files under ``runs/``."""
    rows = [(s, {"train/reward": 0.0 if s >= 30 else 0.4 + s % 7 / 50, "train/loss": 0.01 + s % 5 / 100}) for s in range(1, 41)]
    write_wandb(proj, rows)
    for i, out in enumerate(outputs):
        write_tensorboard(proj / out / "runs" / f"Nov27_1{i}-00-00_node1", rows)
    return rows


def test_a_wandb_run_and_tensorboard_files_below_it_are_each_analyzed_on_their_own(tmp_path: Path) -> None:
    """Which copy is whose cannot be told from the folders: a Trainer's own two copies are two runs,
    each with the collapse; another job's TensorBoard files below a W&B run (``old_baseline/tb/``)
    do not hide the W&B run's collapse behind their healthy numbers, as a merge would."""
    _trainer_copies(tmp_path / "proj", ["out"])
    runs = analyze([tmp_path / "proj"]).runs
    assert sorted((run.sources[0].kind, [(i.kind, i.onset_step) for i in run.incidents]) for run in runs) == [
        ("tensorboard", [("reward_collapse", 30)]), ("wandb", [("reward_collapse", 30)])]

    rows = _trainer_copies(tmp_path / "exp", [])
    write_tensorboard(tmp_path / "exp" / "old_baseline" / "tb", [(s, {**r, "train/reward": 0.45 + s % 5 / 50}) for s, r in rows])
    runs = analyze([tmp_path / "exp"]).runs
    assert sorted((run.sources[0].kind, [(i.kind, i.onset_step) for i in run.incidents]) for run in runs) == [
        ("tensorboard", []), ("wandb", [("reward_collapse", 30)])]


@pytest.mark.parametrize("restarted", [False, True], ids=["one-events-file", "restarted-into-the-logdir"])
@pytest.mark.parametrize("metrics", [{}, {"train/reward": 0.3}], ids=["as-transformers", "with-a-metric"])
def test_a_trainers_hyperparameter_record_is_no_run_and_no_series(tmp_path: Path, metrics: dict, restarted: bool) -> None:
    """``add_hparams`` (transformers' TensorBoardCallback calls it with ``metric_dict={}`` as training
    starts) writes its own event file in ``runs/<date>_<host>/<time.time()>/``: not a second, empty
    run, nor, with a metric in it, a one-off series taken for the reward; said as not read — also
    where a restart wrote a second events file in the logdir (the logdir is then read as one)."""
    import time

    rows = [(s, {"train/reward": 0.0 if s >= 30 else 0.4 + s % 7 / 50, "train/loss": 0.01 + s % 5 / 100}) for s in range(1, 41)]
    logdir = tmp_path / "out" / "runs" / "Nov27_10-00-00_node1"
    writer = tensorboardX.SummaryWriter(str(logdir))
    writer.add_hparams({"learning_rate": 1e-6, "output_dir": "out"}, metric_dict=metrics)
    for step, row in rows:
        if restarted and step == 21:
            writer.close()
            time.sleep(1.1)  # (the events file is named by the second it was opened in)
            writer = tensorboardX.SummaryWriter(str(logdir))
        for key, value in row.items():
            writer.add_scalar(key, value, step)
    writer.close()
    [record] = [p for p in logdir.rglob("events.*") if p.parent != logdir]
    [run] = analyze([tmp_path / "out"]).runs
    assert [(i.kind, i.onset_step, i.metric) for i in run.incidents] == [("reward_collapse", 30, "train/reward")]
    assert sorted(run.metrics["key"].cast(pl.String).unique()) == ["train/loss", "train/reward"]
    assert any(str(record) in s.path and s.kind == "unreadable" for s in run.sources)


def test_a_step_log_cut_short_with_a_server_log_going_on_past_it_is_not_said_to_be_all(console, tmp_path: Path) -> None:
    """As above, with the server's log going on a few steps past the step log's end (and ending before
    the onset): "nothing else was logged after it" would be false; when the other logs end is said."""
    tree, log = cut_at_step_50(console, tmp_path)
    write_tensorboard(log.parent / "tensorboard", console[1])
    last = datetime.strptime(re.findall(r"(\d{8}-\d{2}:\d{2}:\d{2})\.\d{3} StatsLogger", log.read_text())[-1], "%Y%m%d-%H:%M:%S")
    later = last + timedelta(minutes=3)
    (log.parent / "llm_server.log").open("a").write(f"[{later:%Y-%m-%d %H:%M:%S}] Prefill batch. #new-seq: 1, #new-token: 120\n")
    [run] = analyze([tree]).runs
    [collapse] = [i for i in run.incidents if i.kind == "reward_collapse"]
    assert collapse.cause == "unknown"
    assert (f"No log covers the onset: the step log ends at step 50; the other logs end at {later:%Y-%m-%dT%H:%M:%S}"
            in collapse.summary), collapse.summary
    assert "nothing else was logged after it" not in collapse.summary


@pytest.mark.parametrize("layout", ["zero2", "zero3", "fsdp", "empty_optimizer"])
def test_a_trainers_checkpoints_under_deepspeed_or_fsdp_are_resumable(tmp_path: Path, layout: str) -> None:
    """transformers' Trainer saves the optimizer (and a scheduler DeepSpeed owns) through the engine:
    ``global_stepN/*_optim_states.pt`` under DeepSpeed, with no weights at the top under ZeRO-3
    (``zero_pp_rank_*_model_states.pt`` hold them); ``optimizer.bin`` and ``pytorch_model_fsdp_0/``
    under FSDP. Those resume; an empty ``optimizer.pt`` (a disk that filled during the save) does not."""
    import json as json_

    from test_areal_checkpoints import safetensors_bytes

    from parsers.trl_checkpoints import read_trl_checkpoints

    folder = tmp_path / "out" / "checkpoint-100"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "trainer_state.json").write_text(json_.dumps({"global_step": 100}))
    if layout != "zero3" and layout != "fsdp":
        (folder / "model.safetensors").write_bytes(safetensors_bytes(2))
    if layout.startswith("zero"):
        engine = folder / "global_step100"
        engine.mkdir()
        (folder / "latest").write_text("global_step100")
        for rank in range(2):
            (engine / f"bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").write_bytes(b"x")
            if layout == "zero3":
                (engine / f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt").write_bytes(b"x")
        if layout == "zero2":
            (engine / "mp_rank_00_model_states.pt").write_bytes(b"x")
    elif layout == "fsdp":
        (folder / "pytorch_model_fsdp_0").mkdir()
        (folder / "pytorch_model_fsdp_0" / "__0_0.distcp").write_bytes(b"x")
        (folder / "optimizer.bin").write_bytes(b"x")
        (folder / "scheduler.pt").write_bytes(b"x")
    else:
        (folder / "optimizer.pt").write_bytes(b"")
        (folder / "scheduler.pt").write_bytes(b"x")
    row = read_trl_checkpoints(tmp_path / "out").row(0, named=True)
    if layout == "empty_optimizer":
        assert (row["complete"], row["resumable"], row["problems"]) == (False, False, ["optimizer.pt is empty (0 bytes)"])
    else:
        assert (row["complete"], row["resumable"], row["problems"]) == (True, True, []), row


def test_a_copys_step_shift_is_read_from_values_as_printed_and_none_is_no_shift() -> None:
    """A verl console prints `:.3f`, its W&B copy keeps whole floats: no value agreed exactly under
    any shift, and the tie went to the first tried, -2 (a copy two steps back: onset 59 for 61,
    the checkpoint after the collapse). Values agree as printed; with nothing agreeing, no shift."""
    import random

    from forensics.merge import step_offset

    rng = random.Random(1)
    whole = [(step, key, rng.uniform(0.2, 0.7)) for step in range(1, 51) for key in ("critic/score/mean", "actor/grad_norm")]
    copy = pl.DataFrame(whole, schema=["step", "key", "value"], orient="row")
    printed = copy.with_columns(pl.col("value").round(3))
    assert step_offset(printed, copy) == 0
    assert step_offset(printed, copy.with_columns(pl.col("step") - 1)) == 1  # (a 0-based copy)
    other = copy.with_columns(pl.col("value") + 10)
    assert step_offset(printed, other) == 0
