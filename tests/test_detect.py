"""Detectors and causes on runs written by the fixture builder, through the public API."""

from __future__ import annotations

import json
import math
import re
import shutil
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import polars as pl
import pytest
from areal_builder import LogLine, Outage, Relaunch, RunSpec, binomial_reward, healthy_reward, schedule, write_run
from conftest import FIXTURES, read_line
from typer.testing import CliRunner
from verl_builder import VerlRunSpec, healthy_score, write_verl_run

from forensics import analyze
from forensics.cli import app
from forensics.watch import replay

runner = CliRunner()


def only_run(root: Path):
    [run] = analyze([root]).runs
    return run


def zero_learning(steps: range, keys: tuple[str, ...]):
    def tweak(step: int, stats: dict[str, float]) -> None:
        if step in steps:
            for key in stats:
                if key.endswith(keys):
                    stats[key] = 0.0

    return tweak


def test_collapse_with_no_fault_is_blamed_on_the_reward_pipeline(tmp_path: Path) -> None:
    spec = RunSpec(last_step=120, reward=lambda s: 0.0 if s >= 70 else healthy_reward(s), save_freq_steps=25)
    run = only_run(write_run(tmp_path / "outputs", spec).fileroot)
    [incident] = run.incidents
    assert (incident.kind, incident.onset_step, incident.cause) == ("reward_collapse", 70, "reward_pipeline")
    assert run.recommendation.step == 50


def test_a_sparse_task_earning_nothing_in_its_first_steps_is_a_warm_up(tmp_path: Path) -> None:
    """Reward exactly 0 for steps 1–30 (with nothing to learn from: every group's rewards alike),
    then earned at every step to 120: no collapse (nothing healthy came before it), no dead batches,
    and the newest checkpoint is healthy. A reward 0 from the first step to the last still counts."""
    def learning_from_31(step: int, stats: dict[str, float]) -> None:
        if step <= 30:
            for key in list(stats):
                if key.endswith(("actor_loss/avg", "grad_norm", "advantages/avg", "advantages/min", "advantages/max")):
                    stats[key] = 0.0

    spec = RunSpec(last_step=120, reward=lambda s: 0.0 if s <= 30 else healthy_reward(s), save_freq_steps=25,
                   stats_tweak=learning_from_31)
    run = only_run(write_run(tmp_path / "outputs", spec).fileroot)
    assert run.incidents == [] and run.recommendation.step == 100
    never = only_run(write_run(tmp_path / "never", replace(spec, reward=lambda s: 0.0)).fileroot)
    assert [(i.kind, i.onset_step) for i in never.incidents][:1] == [("reward_collapse", 1)]


def test_a_reward_climbing_to_every_rollout_right_and_staying_there_is_saturated_not_collapsed(tmp_path: Path) -> None:
    """The reward climbs to 1.0, touching it now and then (or rising smoothly to it), then holds it:
    the task is solved on its data. Its batches all scoring alike have nothing to learn from (dead batches), which is no
    incident either: the run is healthy, said in a note, and its newest checkpoint is the answer.
    A jump to 1.0 never reached before is still suspect (a reward function returning 1 whatever)."""
    climb = RunSpec(last_step=200, reward=lambda s: binomial_reward(s, min(0.6 + s / 150, 1.0)), save_freq_steps=25)
    run = only_run(write_run(tmp_path / "climb", climb).fileroot)
    assert run.incidents == [] and run.recommendation.step == 200
    [held] = [n for n in run.notes if "held at its best" in n]
    assert "held at its best value, 1, in steps 59–200: saturated" in held
    [result] = replay([tmp_path / "climb"])
    assert result.alarms == []
    smooth = replace(climb, reward=lambda s: round(min(0.5 + s / 100, 1.0), 2))  # never 1.0 before it stays there
    assert only_run(write_run(tmp_path / "smooth", smooth).fileroot).incidents == []
    # (a coarse reward, the mean of 4, touches 1.0 by chance now and then: a jump from 0.5 is one still)
    coarse = {s: (1.0 if s >= 200 else binomial_reward(s, 0.5, n=4, salt="a")) for s in range(1, 351)}
    assert 1.0 in [coarse[s] for s in range(1, 200)] and _judged(coarse)[:1] == [(200, None)]
    jump = replace(climb, reward=lambda s: healthy_reward(s) if s < 80 else 1.0)
    [incident] = only_run(write_run(tmp_path / "jump", jump).fileroot).incidents
    assert (incident.kind, incident.onset_step, incident.cause) == ("reward_collapse", 80, "reward_pipeline")
    assert "stuck at 1 from step 80" in incident.summary


def test_recovery_ends_the_incident(tmp_path: Path) -> None:
    spec = RunSpec(last_step=150, reward=lambda s: 0.0 if 60 <= s < 90 else healthy_reward(s))
    [incident] = only_run(write_run(tmp_path / "outputs", spec).fileroot).incidents
    assert (incident.onset_step, incident.end_step, incident.recovered) == (60, 90, True)
    assert incident.wasted_steps == 29


def test_collapse_to_a_nonzero_constant(tmp_path: Path) -> None:
    spec = RunSpec(last_step=100, reward=lambda s: 0.5 if s >= 40 else healthy_reward(s))
    [incident] = only_run(write_run(tmp_path / "outputs", spec).fileroot).incidents
    assert incident.onset_step >= 40 and incident.onset_step <= 41
    assert "0.5" in incident.summary


def test_stuck_then_zero_names_both(tmp_path: Path) -> None:
    """A reward held at one value, then dropped to zero: the summary says both, not only the first."""
    spec = RunSpec(last_step=120, reward=lambda s: healthy_reward(s) if s < 50 else 0.5 if s < 58 else 0.0)
    [incident] = only_run(write_run(tmp_path / "outputs", spec).fileroot).incidents
    assert incident.onset_step == 50 and incident.end_step is None
    assert "stuck at 0.5 from step 50, then exactly zero from step 58 and never recovered" in incident.summary
    assert "came back" not in incident.summary  # the zeros after the stuck value are no return of the reward


def test_sparse_rewards_with_short_zero_runs_raise_nothing(tmp_path: Path) -> None:
    spec = RunSpec(last_step=300, reward=lambda s: binomial_reward(s, 0.03, n=16))
    run = only_run(write_run(tmp_path / "outputs", spec).fileroot)
    rewards = run.metrics.filter(run.metrics["key"] == run.primary_metric)["value"]
    assert (rewards == 0).sum() > 100  # many isolated zero steps
    assert run.incidents == []


def test_dead_batches_without_reward_collapse(tmp_path: Path) -> None:
    keys = ("actor_loss/avg", "actor_loss/min", "actor_loss/max", "grad_norm", "advantages/avg", "advantages/min", "advantages/max")
    spec = RunSpec(last_step=100, stats_tweak=zero_learning(range(50, 80), keys))
    [incident] = only_run(write_run(tmp_path / "outputs", spec).fileroot).incidents
    assert (incident.kind, incident.onset_step, incident.end_step) == ("zero_variance", 50, 80)


def test_zero_loss_with_a_live_gradient_is_not_an_incident(tmp_path: Path) -> None:
    spec = RunSpec(last_step=100, stats_tweak=zero_learning(range(50, 80), ("actor_loss/avg",)))
    assert only_run(write_run(tmp_path / "outputs", spec).fileroot).incidents == []


def test_non_finite_gradients(tmp_path: Path) -> None:
    def nan_from_60(step: int, stats: dict[str, float]) -> None:
        if step >= 60:
            stats["grpo_actor/grad_norm"] = math.nan
            stats["grpo_actor/update_successful"] = 0.0
        if step == 20:  # a number the analysis does not watch: no event of its own
            stats["grpo_actor/clip_ratio/avg"] = math.nan

    run = only_run(write_run(tmp_path / "outputs", RunSpec(last_step=80, stats_tweak=nan_from_60)).fileroot)
    [incident] = [i for i in run.incidents if i.kind == "nan_inf"]
    assert (incident.onset_step, incident.cause) == (60, "numerical_divergence")
    # The evidence is the table row with the NaN in it, quoted: not the step's header, not a paraphrase.
    cited = next(e for e in incident.evidence if e.kind == "nan_inf")
    row = read_line(cited.file, cited.line)
    assert cited.step == 60 and "grpo_actor/grad_norm" in row and " nan " in row and cited.text == row
    assert run.events.filter(pl.col("kind") == "nan_inf")["step"].min() == 60
    # Named after what went non-finite (the gradient, not the finite reward), as its events are.
    assert incident.metric == "grpo_actor/grad_norm" and "non-finite grpo_actor/grad_norm for" in incident.summary
    assert {"nan_inf", "overflow_skip"} <= set(run.events["kind"].to_list())
    assert set(run.events.filter(pl.col("kind") == "nan_inf")["source"]) == {"areal"}


def test_a_reward_alone_non_finite_is_no_divergence(tmp_path: Path) -> None:
    # A reward function returning NaN from step 30, the loss and gradients finite: the contract's
    # numerical_divergence is NaN/Inf in the loss or gradients; this is the reward pipeline's.
    root = tmp_path / "run"
    write_verl_run(root, VerlRunSpec(steps=60, save_freq=10, ray_session=True,
                                     score=lambda s: math.nan if s >= 30 else healthy_score(s)))
    run = only_run(root)
    [incident] = run.incidents
    assert (incident.kind, incident.onset_step, incident.cause) == ("nan_inf", 30, "reward_pipeline")
    assert "went non-finite" in incident.summary and "optimizer cannot recover" not in incident.summary
    assert run.recommendation.step == 20
    [alarm] = replay([root])[0].alarms  # watch names it alike
    assert (alarm.kind, alarm.onset_step, alarm.cause) == ("nan_inf", 30, "reward_pipeline")
    assert "non-finite critic/score/mean for" in alarm.summary


def test_a_dead_servers_batches_averaging_no_reward_are_its_incident(tmp_path: Path) -> None:
    # The server killed before step 120: every rollout fails, the batch's reward stats are means of
    # nothing (NaN). One incident, the server's, not a second one blamed on divergence.
    def empty(step: int, stats: dict[str, float]) -> None:
        if step >= 120:
            for key in stats:
                if "task_reward" in key:
                    stats[key] = math.nan

    spec = RunSpec(last_step=220, save_freq_steps=25, seed=82, stats_tweak=empty,
                   reward=lambda s: 0.0 if s >= 120 else healthy_reward(s))
    at = {k.step: k.time for k in schedule(spec)}
    spec = replace(spec, outages=(Outage(start=at[119] + timedelta(seconds=8), end=at[220], kind="refused", server_exit=True),))
    run = only_run(write_run(tmp_path / "outputs", spec).fileroot)
    assert [(i.onset_step, i.cause) for i in run.incidents] == [(120, "inference_server_crash")]
    assert run.recommendation.step == 100


def test_a_reward_zero_for_two_steps_before_the_steps_stopped_is_where_the_incident_began(tmp_path: Path) -> None:
    # The server hangs before step 199: steps 199 and 200 still log, their rollouts all timed out
    # (reward 0), step 200 saves, then the trainer blocks for an hour. Two zero steps are too few for
    # a collapse anywhere in the run, but not right before the steps stopped: the checkpoint saved
    # after two failed batches is no healthy one.
    spec = RunSpec(last_step=200, save_freq_steps=10, seed=99, steps_per_epoch=1000, total_epochs=1, request_timeout=180,
                   reward=lambda s: 0.0 if s >= 199 else healthy_reward(s))
    at = {k.step: k.time for k in schedule(spec)}
    spec = replace(spec, outages=(Outage(start=at[198] + timedelta(seconds=6), end=at[200] + timedelta(hours=1), kind="timeout",
                                         burst_every=(60, 120)),))
    run = only_run(write_run(tmp_path / "outputs", spec).fileroot)
    assert [(i.kind, i.onset_step, i.cause) for i in run.incidents] == [
        ("reward_collapse", 199, "inference_server_unresponsive"), ("stall", 201, "inference_server_unresponsive")]
    assert "then the steps stopped" in run.incidents[0].summary
    assert run.recommendation.step == 190
    # The same two steps with the run going on after them are noise, not an incident.
    healthy = replace(spec, last_step=260, outages=(), reward=lambda s: 0.0 if s in (199, 200) else healthy_reward(s))
    assert only_run(write_run(tmp_path / "on", healthy).fileroot).incidents == []


def test_a_slow_decline_is_explained_by_the_failures_logged_as_it_fell(tmp_path: Path) -> None:
    # An overloaded server: from step 100 a growing share of rollouts time out, the reward slides over
    # 30 steps to zero. Its onset is found from wide means, some steps early; the timeouts began inside
    # the decline, not around that onset, and they are what explains it.
    def reward(s: int) -> float:
        return binomial_reward(s, 0.6, salt="sl") if s < 100 else 0.0 if s >= 130 else binomial_reward(s, 0.6 * (130 - s) / 31, salt="sl")

    spec = RunSpec(last_step=260, save_freq_steps=5, seed=120, request_timeout=120, reward=reward)
    at = {k.step: k.time for k in schedule(spec)}
    spec = replace(spec, outages=(Outage(start=at[99] + timedelta(seconds=5), end=at[260], kind="timeout", burst_every=(20, 60)),))
    run = only_run(write_run(tmp_path / "outputs", spec).fileroot)
    drop = next(i for i in run.incidents if i.kind == "reward_drop")
    assert drop.onset_step < 100 and drop.cause == "inference_server_unresponsive"
    assert "request_timeout in steps" in drop.summary and "nothing says its rollouts failed" not in drop.summary
    assert run.recommendation.step < drop.onset_step


def test_an_incident_from_the_first_step_names_the_checkpoint_saved_after_it_ended(tmp_path: Path) -> None:
    # The server refused from before step 1 until step 20, then answered: no checkpoint precedes the
    # incident (exit 4), but the ones saved after it ended are the only resume points there are: said.
    spec = RunSpec(last_step=120, save_freq_steps=10, seed=72, reward=lambda s: 0.0 if s <= 20 else healthy_reward(s))
    at = {k.step: k.time for k in schedule(spec)}
    spec = replace(spec, outages=(Outage(start=at[1] - timedelta(seconds=30), end=at[20] + timedelta(seconds=5), kind="refused",
                                         server_exit=True, server_restart=True),))
    run = only_run(write_run(tmp_path / "outputs", spec).fileroot)
    [incident] = run.incidents
    assert (incident.onset_step, incident.end_step, incident.recovered) == (1, 21, True)
    assert run.recommendation.checkpoint is None
    [said] = [w for w in run.recommendation.warnings if "saved after it" in w]
    assert "ended at step 21 and the run was healthy since: step 120 (" in said


def test_steps_stop_while_refusals_go_on_is_a_stall(tmp_path: Path) -> None:
    base = RunSpec(last_step=60, step_seconds=(60, 60))
    end = schedule(base)[-1].time
    spec = RunSpec(
        last_step=60,
        step_seconds=(60, 60),
        outages=(Outage(end + timedelta(seconds=30), end + timedelta(hours=3), kind="refused", server_exit=True),),
    )
    run = only_run(write_run(tmp_path / "outputs", spec).fileroot)
    [stall] = [i for i in run.incidents if i.kind == "stall"]
    assert stall.onset_step == 61
    assert stall.cause == "inference_server_crash"
    assert stall.evidence[0].kind == "server_exit"


def test_a_run_that_logged_every_planned_step_has_no_stall(tmp_path: Path) -> None:
    """``Train step 60/60``: the run is done; a server going away afterwards is no stall of it."""
    base = RunSpec(last_step=60, step_seconds=(60, 60), steps_per_epoch=30, total_epochs=2)
    end = schedule(base)[-1].time
    outage = Outage(end + timedelta(seconds=30), end + timedelta(hours=3), kind="refused", server_exit=True)
    run = only_run(write_run(tmp_path / "outputs", replace(base, outages=(outage,))).fileroot)
    assert not [i for i in run.incidents if i.kind == "stall"]


@pytest.mark.parametrize(("planned", "crashed"), [(60, False), (90, True)])
@pytest.mark.parametrize("raised", ["ValueError: bad batch shape", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"])
def test_a_bare_traceback_after_the_last_step_ends_a_run_cut_short(tmp_path: Path, planned: int, crashed: bool, raised: str) -> None:
    """An uncaught exception printed to the trainer log after step 60 (it borrows step 60's time):
    a crash at step 61 when the run was launched for more steps, teardown noise when it was not.
    One the reader knows by name (a CUDA OOM: a ``cuda_oom`` event) is no less the run's end."""
    paths = write_run(tmp_path / "outputs", RunSpec(last_step=60, steps_per_epoch=30, total_epochs=planned // 30))
    paths.trainer_log.write_text(paths.trainer_log.read_text() + "Traceback (most recent call last):\n"
                                 f'  File "train.py", line 9, in <module>\n{raised}\n')
    run = only_run(paths.fileroot)
    if not crashed:
        assert run.incidents == []
        return
    [incident] = run.incidents
    assert (incident.kind, incident.onset_step, incident.cause) == ("crash", 61, "training_worker_crash")
    assert raised[:40] in incident.summary and incident.wasted == "0 steps"
    assert incident.onset_time == run.steps.filter(run.steps["step"] == 60)["time"][0]


def test_an_exception_logged_with_its_traceback_as_the_last_act_ends_a_run_cut_short(tmp_path: Path) -> None:
    """``logger.error(..., exc_info=True)`` after step 60 of 90, then nothing: the error line and
    its traceback are one failure, a RuntimeError the run died of — a crash, not a healthy run."""
    paths = write_run(tmp_path / "outputs", RunSpec(last_step=60, steps_per_epoch=30, total_epochs=3))
    last = only_run(paths.fileroot).steps["time"].max()
    said = f"{last + timedelta(seconds=20):%Y%m%d-%H:%M:%S}.000 [FSDP Engine Rank 0] ERROR: ppo update failed"
    paths.trainer_log.write_text(paths.trainer_log.read_text() + f"{said}\nTraceback (most recent call last):\n"
                                 '  File "train.py", line 9, in <module>\nRuntimeError: NCCL communicator was aborted on rank 0.\n')
    run = only_run(paths.fileroot)
    [incident] = run.incidents
    assert (incident.kind, incident.onset_step, incident.cause) == ("crash", 61, "training_worker_crash")
    assert "RuntimeError: NCCL communicator was aborted on rank 0." in incident.summary


@pytest.mark.parametrize("where", ["trainer", "completed", "server"])
def test_teardown_failures_of_a_finished_run_and_a_servers_traceback_are_no_crash(tmp_path: Path, where: str) -> None:
    """A run that logged all 60 of its 60 steps (or said ``Training completes!`` at 60 of 90), then
    an actor died at shutdown: teardown. A run cut short at 60 of 90 whose only traceback after it
    is the server's own: not the trainer's exception."""
    planned = 60 if where == "trainer" else 90
    spec = RunSpec(last_step=60, steps_per_epoch=30, total_epochs=planned // 30, finished=where == "completed")
    paths = write_run(tmp_path / "outputs", spec)
    end = only_run(paths.fileroot).steps["time"].max()
    if where != "server":
        paths.trainer_log.write_text(paths.trainer_log.read_text() + "Traceback (most recent call last):\n"
                                     '  File "train.py", line 9, in <module>\n'
                                     "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n")
    else:
        stamp = (end + timedelta(seconds=20)).strftime("[%Y-%m-%d %H:%M:%S]")
        server = paths.log_dir / "llm_server.log"
        server.write_text(server.read_text() + f"{stamp} Exception in ASGI application\nTraceback (most recent call last):\n"
                          '  File "uvicorn/protocols/http/h11_impl.py", line 403, in run_asgi\nValueError: bad request\n')
    run = only_run(paths.fileroot)
    assert run.events.filter(pl.col("kind").is_in(["actor_died", "traceback"])).height == 1
    assert not [i for i in run.incidents if i.kind == "crash"]


def test_the_first_attempts_traceback_is_not_the_end_of_a_relaunched_run(tmp_path: Path) -> None:
    """Steps 1–20 logged, a traceback, a relaunch from step 15 that logs 16–17 and stops there: the
    run went on after the traceback (at lower step numbers), so that traceback did not end it: it
    ended the attempt the relaunch abandoned, a crash of that attempt's."""
    spec = RunSpec(last_step=20, steps_per_epoch=10, total_epochs=3, recover_mode="auto",
                   relaunch=Relaunch(stop_after=20, resume_from=15))
    paths = write_run(tmp_path / "outputs", spec)
    lines = paths.trainer_log.read_text().splitlines(keepends=True)
    headers = [i for i, line in enumerate(lines) if "Train step " in line]
    launch = next(i for i in range(headers[19], len(lines)) if "LocalLauncher" in lines[i])
    traceback = ["Traceback (most recent call last):\n", '  File "train.py", line 9, in <module>\n', "ValueError: bad batch\n"]
    paths.trainer_log.write_text("".join(lines[:launch] + traceback + lines[launch:headers[22]]))  # ends after the relaunch's 17
    run = only_run(paths.fileroot)
    assert run.events.filter(pl.col("kind") == "traceback").height == 1
    [crash] = [i for i in run.incidents if i.kind == "crash"]
    assert (crash.onset_step, crash.redone, crash.end_step) == (21, True, 22)
    assert "in an attempt the run abandoned: a relaunch from step 15 took the run on from step 16" in crash.summary


@pytest.mark.parametrize(
    ("spec", "code"),
    [
        (RunSpec(last_step=60, reward=lambda s: 0.0 if s >= 30 else healthy_reward(s), save_freq_steps=40), 4),
        (RunSpec(last_step=30), 3),
    ],
    ids=["none-before-incident", "healthy-without-checkpoints"],
)
def test_best_checkpoint_exit_codes(tmp_path: Path, spec: RunSpec, code: int) -> None:
    root = write_run(tmp_path / "outputs", spec).fileroot
    result = runner.invoke(app, ["best-checkpoint", str(root)])
    assert result.exit_code == code
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1


def test_an_nccl_watchdog_on_the_trainers_stderr_is_the_crashs_cause(tmp_path: Path) -> None:
    """torch's own C++ lines among AReaL's logger lines in trainer.log (rank 1's NCCL watchdog after
    10 minutes of a hung all-reduce): read as ``nccl_timeout`` at their own glog time, cited, and
    named the cause of the crash — not counted as unparsed."""
    spec = RunSpec(last_step=40)
    hung = schedule(spec)[-1].time + timedelta(minutes=10, seconds=5)
    watchdog = (f"[rank1]:[E{hung:%m%d %H:%M:%S}.394775308 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective "
                "operation timeout: WorkNCCL(SeqNum=48213, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran "
                "for 600094 milliseconds before timing out.\nterminate called after throwing an instance of 'c10::DistBackendError'")
    paths = write_run(tmp_path / "outputs", replace(spec, extra_lines=(LogLine(hung - timedelta(minutes=9), watchdog),)))
    run = only_run(paths.fileroot)
    [crash] = [i for i in run.incidents if i.kind == "crash"]
    assert (crash.onset_step, crash.cause) == (41, "nccl_timeout")
    cited = [e for e in crash.evidence if "Watchdog caught collective operation timeout" in e.text]
    assert cited and cited[0].time is not None and abs((cited[0].time - hung).total_seconds()) < 1
    assert "Watchdog caught" in paths.trainer_log.read_text().splitlines()[cited[0].line - 1]


def test_a_torn_log_names_no_checkpoint_past_its_last_step_read(tmp_path: Path) -> None:
    """A trainer.log.gz torn halfway through a run that collapsed at step 70 and saved every 10
    steps to 100: the checkpoints after the last step read were saved in steps nothing judged —
    not chosen, and said; the newest before it is."""
    import gzip

    paths = write_run(tmp_path / "outputs", RunSpec(last_step=100, save_freq_steps=10,
                                                    reward=lambda s: 0.0 if s >= 70 else healthy_reward(s)))
    data = gzip.compress(paths.trainer_log.read_bytes())
    paths.trainer_log.unlink()
    (paths.log_dir / "trainer.log.gz").write_bytes(data[: len(data) * 55 // 100])
    run = only_run(paths.fileroot)
    last = run.step_range()["last"]
    assert last is not None and last < 70 and run.incidents == []
    rec = run.recommendation
    assert rec.step is not None and rec.step <= last
    assert any(w.startswith(f"5 checkpoints after step {last}, the last step that could be read (up to step 100)")
               for w in rec.warnings), rec.warnings


def test_a_log_torn_inside_a_steps_table_before_its_reward_names_no_checkpoint_of_that_step(tmp_path: Path) -> None:
    """A trainer.log.gz torn inside step 70's table, after its header and before its reward row, in
    a run whose reward collapsed at step 70: step 70 was not judged, and its checkpoint is not chosen."""
    import zlib

    paths = write_run(tmp_path / "outputs", RunSpec(last_step=100, save_freq_steps=10,
                                                    reward=lambda s: 0.0 if s >= 70 else healthy_reward(s)))
    lines = paths.trainer_log.read_bytes().splitlines(keepends=True)
    header = next(i for i, line in enumerate(lines) if b"Train step 70/" in line)
    reward = next(i for i in range(header, len(lines)) if b"task_reward/avg" in lines[i])
    packer = zlib.compressobj(wbits=31)  # (gzip, flushed where the copy will end: it reads to there)
    kept = packer.compress(b"".join(lines[:reward])) + packer.flush(zlib.Z_FULL_FLUSH)
    paths.trainer_log.unlink()
    (paths.log_dir / "trainer.log.gz").write_bytes(kept + packer.compress(b"".join(lines[reward:]))[:100])
    run = only_run(paths.fileroot)
    assert run.step_range()["last"] == 70 and run.incidents == []
    assert run.recommendation.step == 60
    assert any(w.startswith("4 checkpoints after step 69, the last step that could be read (up to step 100)") for w in run.recommendation.warnings), run.recommendation.warnings


def test_errors_naming_no_fault_at_a_collapse_are_the_reward_pipelines_evidence(tmp_path: Path) -> None:
    """The reward function raising in every workflow from step 40 (AReaL's ``Workflow execution
    failed: …`` ERROR lines naming no infrastructure fault), the reward 0 from there: the cause
    is the reward pipeline, and those lines are cited — not "no failure of any kind"."""
    spec = RunSpec(last_step=80, reward=lambda s: 0.0 if s >= 40 else healthy_reward(s))
    at = {t.step: t.time for t in schedule(spec)}
    failed = tuple(LogLine(at[s] - timedelta(seconds=20), "Workflow execution failed: 'NoneType' object has no attribute 'group'",
                           "[Remote Inference Engine Rank 0]", "ERROR") for s in range(40, 43))
    [incident] = only_run(write_run(tmp_path / "outputs", replace(spec, extra_lines=failed)).fileroot).incidents
    assert (incident.onset_step, incident.cause) == (40, "reward_pipeline")
    assert "but 3 errors naming none were (workflow_failed; first: Workflow execution failed: 'NoneType'" in incident.summary
    assert [e.kind for e in incident.evidence] == ["workflow_failed"] * 3


def test_two_jobs_teeing_into_one_log_are_said_not_hidden(tmp_path: Path) -> None:
    """Two jobs launched under the same names write into one trainer.log, step by step in turn
    (one healthy, one whose reward is 0 from step 30): one value per step survives, so the
    collapse cannot be seen — the tool says why, and does not call the run healthy."""
    a = write_run(tmp_path / "a" / "outputs", RunSpec(last_step=60, seed=1))
    b = write_run(tmp_path / "b" / "outputs", RunSpec(last_step=60, seed=2, reward=lambda s: 0.0 if s >= 30 else healthy_reward(s)))

    def chunks(text: str) -> list[str]:
        lines = text.splitlines(keepends=True)
        cuts = [i for i, line in enumerate(lines) if "Train step " in line]
        return ["".join(lines[i:j]) for i, j in zip([0, *cuts], [*cuts, len(lines)], strict=True)]

    ours, theirs = chunks(a.trainer_log.read_text()), chunks(b.trainer_log.read_text())
    a.trainer_log.write_text(ours[0] + "".join(x + y for x, y in zip(ours[1:], theirs[1:], strict=True)))
    run = only_run(a.fileroot)
    [note] = [n for s in run.sources for n in s.notes if "two runs seem to write into it" in n]
    assert note.startswith("its steps go back 60 times in 120 step lines")
    assert run.caveat() is not None


def test_a_run_whose_reward_could_not_be_judged_names_no_checkpoint_healthy(tmp_path: Path) -> None:
    """Checkpoints, steps, but no reward series (renamed in the log): ``analyze`` recommends none —
    naming the newest in its reason — as ``best-checkpoint`` refuses to, both for the same reason."""
    paths = write_run(tmp_path / "outputs", RunSpec(last_step=40, save_freq_steps=20))
    paths.trainer_log.write_text(paths.trainer_log.read_text().replace("reward", "signal"))
    run = only_run(paths.fileroot)
    assert run.primary_metric is None and run.incidents == []
    rec = run.recommendation
    assert rec.checkpoint is None and rec.step is None
    assert rec.reason.startswith("No incident found, but no reward series was found: the reward could not be judged, "
                                 "so no checkpoint can be called healthy; the newest complete one is step 40 (")
    result = runner.invoke(app, ["best-checkpoint", str(paths.fileroot), "--json", "--no-cache"])
    assert result.exit_code == 2 and json.loads(result.stdout)["checkpoint"] is None
    assert "no checkpoint can be called healthy" in result.stderr


def test_incomplete_checkpoint_is_skipped_with_a_warning(tmp_path: Path) -> None:
    spec = RunSpec(
        last_step=80,
        reward=lambda s: 0.0 if s >= 70 else healthy_reward(s),
        save_freq_steps=20,
        broken_checkpoints={60: "missing_shard"},
    )
    rec = only_run(write_run(tmp_path / "outputs", spec).fileroot).recommendation
    assert rec.step == 40
    assert any("incomplete" in w and "globalstep59" in w for w in rec.warnings)


def test_a_trial_folder_a_single_log_and_a_tree_of_runs(tmp_path: Path) -> None:
    a = write_run(tmp_path / "runs" / "a" / "outputs", RunSpec(experiment="exp-a", last_step=10, save_freq_steps=5))
    write_run(tmp_path / "runs" / "b" / "outputs", RunSpec(experiment="exp-b", last_step=12))
    assert [r.run_id for r in analyze([tmp_path / "runs"]).runs] == ["exp-a/trial0", "exp-b/trial0"]
    [trial] = analyze([a.log_dir]).runs
    assert trial.run_id == "exp-a/trial0" and trial.recommendation.step == 10
    [single] = analyze([a.trainer_log]).runs
    assert single.step_range()["last"] == 10
    assert [s.path for s in single.sources if s.kind != "not_given"] == [str(a.trainer_log)]
    assert [Path(s.path).name for s in single.sources if s.kind == "not_given"] == ["llm_server.log"]  # (said, not read)


def test_a_collapse_in_an_attempt_a_relaunch_logged_again_is_an_incident(tmp_path: Path) -> None:
    """Seed 002's "just rerun, it auto-resumes": the server died at step 60 and the reward sat at 0
    to step 80; the launcher relaunched from the recover checkpoint of step 50 and steps 51–120 are
    healthy. The later copies win the run's series, but the abandoned attempt's collapse is told,
    with its own lines, and the checkpoint choice passes over it (the relaunch re-ran its steps)."""
    base = RunSpec(last_step=120, save_freq_steps=20, recover_mode="auto", recover_freq_steps=50,
                   relaunch=Relaunch(stop_after=80, resume_from=50, pause=200.0,
                                     first_reward=lambda s: 0.0 if s >= 60 else healthy_reward(s)))
    first = {t.step: t.time for t in schedule(base) if t.attempt == 0}
    down = Outage(start=first[60] - timedelta(seconds=20), end=first[80] + timedelta(seconds=2), server_exit=True, in_flight=2)
    paths = write_run(tmp_path / "outputs", replace(base, outages=(down,)))
    run = only_run(paths.fileroot)
    [incident] = run.incidents
    assert (incident.kind, incident.onset_step, incident.end_step, incident.recovered) == ("reward_collapse", 60, 81, True)
    assert incident.cause == "inference_server_crash" and incident.wasted_steps == 20
    assert ("exactly zero from step 60 to step 80, the attempt's last, in an attempt the run abandoned at step 80: "
            "a relaunch from step 50 took the run on from step 51") in incident.summary
    assert "came back" not in incident.summary  # the relaunch's healthy values are no return from it
    onset = incident.onset_evidence
    lines = paths.trainer_log.read_text().splitlines()
    assert onset is not None and onset.text == lines[onset.line - 1].strip()  # (the table row itself, quoted)
    header = next(line for line in reversed(lines[: onset.line]) if "Train step" in line)  # (its table's)
    assert "grpo_actor/task_reward/avg " in lines[onset.line - 1] and "Train step 60/" in header
    assert abs((onset.time - first[60]).total_seconds()) < 0.001  # the first attempt's, not the relaunch's
    assert run.recommendation.step == 120 and "was in an attempt a relaunch abandoned" in run.recommendation.reason
    # Replayed as if live: the first attempt's steps go by in their time; no stall at the relaunch.
    result = runner.invoke(app, ["watch", "--replay", str(paths.fileroot), "--json"])
    alarms = [(a["kind"], a["onset_step"]) for a in json.loads(result.stdout)["alarms"]]
    assert alarms[0] == ("server_errors", 60) and ("reward_collapse", 60) in alarms
    assert not [a for a in alarms if a[0] == "stall"], alarms


def test_a_crash_the_launcher_relaunched_from_an_earlier_checkpoint_is_the_abandoned_attempts(tmp_path: Path) -> None:
    """A trainer OOM during step 121, ``recover.mode`` relaunching from the recover checkpoint of
    step 100, steps 101-200 healthy: the crash is the first attempt's, during its step 121 (not the
    relaunch's 101, where its time alone puts it), it cost the 20 steps logged again and the one it
    died in, it ran as long as a step does (not stuck), and the run's final checkpoint is the one."""
    oom = ("Traceback (most recent call last):\n  File \"/AReaL/examples/math/gsm8k_grpo.py\", line 200, in main\n"
           "    stats = actor.ppo_update(batch)\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB.")
    base = RunSpec(last_step=200, save_freq_steps=50, recover_mode="auto", recover_freq_steps=100,
                   relaunch=Relaunch(stop_after=120, resume_from=100, pause=300.0))
    first = {t.step: t.time for t in schedule(base) if t.attempt == 0}
    died = first[120] + timedelta(seconds=20)
    lines = (LogLine(died, "ppo update failed", "[FSDP Engine Rank 0]", "ERROR"), LogLine(died, oom),
             LogLine(died + timedelta(seconds=5), "JobException: Job exp_trial0:trainer JobState.FAILED at node local",
                     "Local Scheduler", "ERROR"))
    run = only_run(write_run(tmp_path / "outputs", replace(base, extra_lines=lines)).fileroot)
    [incident] = run.incidents
    assert (incident.kind, incident.onset_step, incident.cause, incident.redone) == ("crash", 121, "training_worker_crash", True)
    assert "It raised torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB." in incident.summary
    assert incident.wasted_steps == 21 and incident.onset_time == died
    assert ("in an attempt the run abandoned: a relaunch from step 100 took the run on from step 101 and logged "
            "steps 101–120 again") in incident.summary
    assert "not stuck" in incident.summary, incident.summary
    assert incident.onset_evidence is not None and abs((incident.onset_evidence.time - first[120]).total_seconds()) < 0.001
    assert run.recommendation.step == 200 and "was in an attempt a relaunch abandoned" in run.recommendation.reason
    assert not [w for w in run.recommendation.warnings if "overwritten" in w]


def test_a_relaunch_from_before_a_collapse_that_collapsed_again(tmp_path: Path) -> None:
    """The first attempt collapsed at step 60; the relaunch from step 50 was healthy for four steps
    and collapsed again at 55, for good. One incident, the run's, telling the first attempt's; and
    replayed live, an alarm for each attempt: the relaunch went back to before the first collapse."""
    spec = RunSpec(last_step=120, save_freq_steps=20, recover_mode="auto", recover_freq_steps=50,
                   reward=lambda s: 0.0 if s >= 55 else healthy_reward(s),
                   relaunch=Relaunch(stop_after=80, resume_from=50, pause=200.0,
                                     first_reward=lambda s: 0.0 if s >= 60 else healthy_reward(s)))
    paths = write_run(tmp_path / "outputs", spec)
    [incident] = only_run(paths.fileroot).incidents
    assert (incident.onset_step, incident.end_step) == (55, None)
    assert ("exactly zero from step 55 and never recovered. Earlier, grpo_actor/task_reward/avg exactly zero from step 60 "
            "to step 80, the attempt's last, in an attempt the run abandoned at step 80: a relaunch from step 50 took "
            "the run on from step 51.") in incident.summary
    result = runner.invoke(app, ["watch", "--replay", str(paths.fileroot), "--json"])
    alarms = [(a["kind"], a["onset_step"]) for a in json.loads(result.stdout)["alarms"]]
    assert [a for a in alarms if a[0] == "reward_collapse"] == [("reward_collapse", 60), ("reward_collapse", 55)]


def test_an_abandoned_attempt_past_where_the_relaunch_got_is_not_the_run(tmp_path: Path) -> None:
    """The first attempt collapsed at step 60 and saved step 80's export (collapsed weights); the
    relaunch from step 50 logged steps 51–75, healthy, and the log ends there. The run's steps end
    at 75 (76–80 are the abandoned attempt's, not a collapse going on); one incident; the step-80
    export is never chosen, nor taken as a sign the run went on."""
    base = RunSpec(last_step=120, save_freq_steps=20, recover_mode="auto", recover_freq_steps=50,
                   relaunch=Relaunch(stop_after=80, resume_from=50, pause=200.0,
                                     first_reward=lambda s: 0.0 if s >= 60 else healthy_reward(s)))
    paths = write_run(tmp_path / "outputs", base)
    lines = paths.trainer_log.read_text().splitlines(keepends=True)
    h75 = [i for i, line in enumerate(lines) if "Train step 75/" in line][-1]
    cut = next(i for i in range(h75 + 1, len(lines)) if lines[i].startswith("\u2558")) + 1
    paths.trainer_log.write_text("".join(lines[:cut]))
    for folder in (paths.checkpoint_root / "default").glob("*globalstep*"):
        if int(folder.name.rsplit("globalstep", 1)[1]) + 1 > 80:
            shutil.rmtree(folder)
    info = paths.checkpoint_root / "recover_info" / "step_info.json"  # the relaunch's last recover save: step 50
    info.write_text(json.dumps({"epoch": 0, "epoch_step": 49, "global_step": 49, "steps_per_epoch": 935}))
    run = only_run(paths.fileroot)
    assert int(run.steps["step"].max()) == 75
    [incident] = run.incidents
    assert (incident.onset_step, incident.end_step, incident.recovered, incident.wasted_steps) == (60, 81, True, 20)
    assert "abandoned at step 80: a relaunch from step 50 took the run on from step 51" in incident.summary
    assert run.recommendation.step == 60 and any("saved by an attempt a relaunch abandoned" in w for w in run.recommendation.warnings)
    assert not any("could not be read" in n for n in run.notes)


def test_a_checkpoint_saved_just_before_a_hang_is_no_sign_the_run_went_on(tmp_path: Path) -> None:
    """AReaL saves step 40's export before it logs step 40: a run that hung between the two has a
    checkpoint one step past its last logged step, and an hour of request timeouts after it."""
    t40 = schedule(RunSpec(last_step=40))[39].time
    spec = RunSpec(last_step=40, save_freq_steps=10, request_timeout=120,
                   outages=(Outage(start=t40 + timedelta(seconds=60), end=t40 + timedelta(minutes=70), kind="timeout"),))
    paths = write_run(tmp_path / "outputs", spec)
    lines = paths.trainer_log.read_text().splitlines(keepends=True)
    header = next(i for i, line in enumerate(lines) if "Train step 40/" in line)
    end = next(i for i in range(header + 1, len(lines)) if lines[i].startswith("\u2558")) + 1
    paths.trainer_log.write_text("".join(lines[:header] + lines[end:]))  # step 40 never logged
    run = only_run(paths.fileroot)
    assert 40 in [c.step for c in run.checkpoints]
    assert [(i.kind, i.onset_step) for i in run.incidents] == [("stall", 40)]
    assert not any("could not be read" in n for n in run.notes)


_CTRL_C = ('Traceback (most recent call last):\n  File "/AReaL/examples/math/gsm8k_grpo.py", line 210, in <module>\n'
           "    main(sys.argv[1:])\nKeyboardInterrupt")
_CLEANUP = ('Traceback (most recent call last):\n  File "/AReaL/examples/math/gsm8k_grpo.py", line 215, in <module>\n'
            "    engine.destroy()\nRuntimeError: cleanup failed")
_DURING = "\n\nDuring handling of the above exception, another exception occurred:\n\n"


@pytest.mark.parametrize(("chain", "crash"), [(_CTRL_C + _DURING + _CLEANUP, False), (_CLEANUP + _DURING + _CTRL_C, True)])
def test_a_ctrl_c_that_began_a_chain_in_trainer_log_is_no_crash(tmp_path: Path, chain: str, crash: bool) -> None:
    """Stopped by hand after step 40, raising again while stopping: no crash. Raised, then hung until
    a Ctrl-C: a crash, named after what it raised."""
    spec = RunSpec(last_step=40, save_freq_steps=10)
    spec = replace(spec, extra_lines=(LogLine(schedule(spec)[-1].time + timedelta(seconds=5), chain),))
    run = only_run(write_run(tmp_path / "outputs", spec).fileroot)
    crashes = [(i.kind, i.onset_step) for i in run.incidents if i.kind == "crash"]
    assert crashes == ([("crash", 41)] if crash else [])
    if crash:
        assert "RuntimeError: cleanup failed … KeyboardInterrupt" in run.incidents[-1].summary


def _attempts(*spans: tuple[int, int], reward) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """Step copies, in log order, of attempts each logging ``first..last`` (a relaunch going back
    to its ``first``): the run's series, the abandoned copies' rows, and every copy."""
    from datetime import datetime

    from parsers.schema import abandoned

    rows, line = [], 0
    for number, (first, last) in enumerate(spans):
        for step in range(first, last + 1):
            line += 10
            rows.append({"step": step, "time": datetime(2025, 1, 1) + timedelta(minutes=line), "file": "trainer.log",
                         "line": line, "key": "reward", "value": reward(number, step)})
    frame = pl.DataFrame(rows).with_columns(abandoned(pl.col("step")).alias("gone"))
    values = frame.filter(~pl.col("gone")).select("step", "value").sort("step")
    return values, frame.filter("gone").drop("gone"), frame.select("step", "time", "file", "line")


def test_attempts_are_told_apart_by_where_each_relaunch_went_back() -> None:
    """Three attempts: 1–80, a relaunch from 50 to 100, one from 90 on. Each abandoned attempt had
    only three zero steps (78–80, 91–93): no collapse, though read as one attempt they make six."""
    from forensics.detect import Thresholds, abandoned_collapses

    def dips(attempt: int, step: int) -> float:
        zero = (attempt == 0 and 78 <= step <= 80) or (attempt == 1 and 91 <= step <= 93)
        return 0.0 if zero else binomial_reward(step, 0.4)

    values, earlier, copies = _attempts((1, 80), (51, 100), (91, 150), reward=dips)
    assert sorted(set(earlier["step"])) == [*range(51, 81), *range(91, 101)]
    assert abandoned_collapses(values, earlier, copies, "reward", Thresholds()) == []

    def again(attempt: int, step: int) -> float:  # the first two attempts both collapse at 60
        return 0.0 if attempt < 2 and step >= 60 else binomial_reward(step, 0.4)

    values, earlier, copies = _attempts((1, 80), (51, 66), (41, 150), reward=again)
    found = abandoned_collapses(values, earlier, copies, "reward", Thresholds())
    assert [(f.onset_step, f.end_step) for f in found] == [(60, 81), (60, 67)]
    assert "a relaunch from step 50 took the run on from step 51" in found[0].summary
    assert "a relaunch from step 40 took the run on from step 41" in found[1].summary


@pytest.mark.parametrize("damage", ["digit", "unreadable", "midrow", "stale checkpoints"])
def test_damage_inside_the_log_is_no_relaunch_nor_a_sign_the_run_went_on(tmp_path: Path, damage: str) -> None:
    """sglang_hang stalls after step 420. A digit lost from step 400's header (read as 40), an
    unreadable step number, a table row cut in half, or exports at steps 500 and 600 left by an
    earlier run (dated a week before the log): none abandons steps, and the stall is still told."""
    import gzip
    import os
    from datetime import datetime

    from conftest import FIXTURES

    outputs = tmp_path / "outputs"
    shutil.copytree(FIXTURES / "sglang_hang" / "outputs", outputs)
    log = next(outputs.rglob("trainer.log.gz"))
    text = gzip.decompress(log.read_bytes()).decode()
    if damage == "digit":
        text = text.replace("Train step 400/", "Train step 40/", 1)
    elif damage == "unreadable":
        text = text.replace("Train step 5/", "Train step 99999999999999999999/", 1)
    elif damage == "midrow":
        lines = text.split("\n")
        header = next(i for i, line in enumerate(lines) if "Train step 100/" in line)
        row = next(j for j in range(header, len(lines)) if lines[j].startswith("\u2502"))
        lines[row] = lines[row][: len(lines[row]) // 2]
        text = "\n".join(lines)
    else:
        exports = sorted(next(outputs.rglob("default")).glob("epoch*"))
        week_before = datetime(2025, 11, 10, 12).timestamp()
        for global_step in (499, 599):
            copy = exports[-1].with_name(f"epoch0epochstep{global_step}globalstep{global_step}")
            shutil.copytree(exports[-1], copy)
            for folder, _, files in os.walk(copy):
                for name in [*files, "."]:
                    os.utime(os.path.join(folder, name), (week_before, week_before))
    log.write_bytes(gzip.compress(text.encode()))
    run = only_run(outputs)
    assert [(i.kind, i.onset_step) for i in run.incidents] == [("reward_collapse", 250), ("stall", 421)]
    assert not any("could not be read" in n for n in run.notes) and int(run.steps["step"].max()) == 420
    assert not any("abandoned" in i.summary for i in run.incidents)


def test_two_runs_logs_side_by_side_abandon_nothing_of_each_other(tmp_path: Path) -> None:
    """Two AReaL logs in one folder, not one log's rotated parts: the second starting again at
    step 1 is no relaunch of the first, whichever name sorts first: two runs, named by their logs."""
    (tmp_path / "logs").mkdir()
    from datetime import datetime

    first = RunSpec(experiment="expA", last_step=200, reward=lambda s: 0.0 if s >= 100 else healthy_reward(s))
    second = RunSpec(experiment="expB", last_step=60, start=datetime(2025, 11, 12, 9))
    for name, spec in (("a.log", first), ("b.log", second)):
        shutil.copy(write_run(tmp_path / name, spec).trainer_log, tmp_path / "logs" / name)
    runs = {r.run_id: r for r in analyze([tmp_path / "logs"]).runs}
    assert set(runs) == {"logs/a.log", "logs/b.log"}
    run = runs["logs/a.log"]
    assert [(i.kind, i.onset_step, i.recovered) for i in run.incidents][:1] == [("reward_collapse", 100, False)]
    assert not any("abandoned" in i.summary for r in runs.values() for i in r.incidents)


def test_a_checkpoint_an_abandoned_attempt_saved_is_told_by_its_time(tmp_path: Path) -> None:
    """The relaunch from step 50 logged steps 51–79: step 80's export, one step past them, is dated
    by the first attempt's collapse (10 min into it), before the relaunch logged step 79."""
    import os

    base = RunSpec(last_step=120, save_freq_steps=20, recover_mode="auto", recover_freq_steps=50,
                   relaunch=Relaunch(stop_after=80, resume_from=50, pause=200.0,
                                     first_reward=lambda s: 0.0 if s >= 60 else healthy_reward(s)))
    first = {t.step: t.time for t in schedule(base) if t.attempt == 0}
    paths = write_run(tmp_path / "outputs", base)
    lines = paths.trainer_log.read_text().splitlines(keepends=True)
    h79 = [i for i, line in enumerate(lines) if "Train step 79/" in line][-1]
    paths.trainer_log.write_text("".join(lines[: next(i for i in range(h79 + 1, len(lines)) if lines[i].startswith("\u2558")) + 1]))
    for folder in (paths.checkpoint_root / "default").glob("*globalstep*"):
        step = int(folder.name.rsplit("globalstep", 1)[1]) + 1
        if step > 80:
            shutil.rmtree(folder)
        elif step == 80:
            for where, _, files in os.walk(folder):
                for name in [*files, "."]:
                    os.utime(os.path.join(where, name), (first[80].timestamp(),) * 2)
    info = paths.checkpoint_root / "recover_info" / "step_info.json"
    info.write_text(json.dumps({"epoch": 0, "epoch_step": 49, "global_step": 49, "steps_per_epoch": 935}))
    run = only_run(paths.fileroot)
    assert run.recommendation.step == 60, run.recommendation.reason
    assert any("epoch0epochstep79globalstep79: saved by an attempt a relaunch abandoned" in w for w in run.recommendation.warnings)


def test_a_relaunch_from_a_checkpoint_saved_during_a_collapse_is_said(tmp_path: Path) -> None:
    """The reward sat at 0 from step 60; the launcher relaunched from the recover checkpoint of step
    70, saved during it, and the reward came back. The collapse ends there, and says how."""
    spec = RunSpec(last_step=120, recover_mode="auto", recover_freq_steps=70,
                   relaunch=Relaunch(stop_after=80, resume_from=70, pause=200.0,
                                     first_reward=lambda s: 0.0 if s >= 60 else healthy_reward(s)))
    [incident] = only_run(write_run(tmp_path / "outputs", spec).fileroot).incidents
    assert (incident.onset_step, incident.recovered) == (60, True)
    assert "resuming from a checkpoint saved after it (step 70); the reward came back at step" in incident.summary
    assert "carried the broken state on" not in incident.summary


@pytest.mark.parametrize("seed", range(4))
def test_a_coarse_reward_repeating_a_common_value_somewhere_in_a_long_run_is_no_collapse(seed: int) -> None:
    """The mean of 4 rewards takes five values: over 3,000 healthy steps one of them repeats eight
    times in a row somewhere by chance alone. The same run with 12 steps of exact zeros is a collapse."""
    import random

    from forensics.detect import Thresholds, reward_collapses

    rng = random.Random(seed)
    scores = [sum(rng.random() < 0.3 + 0.4 * s / 3000 for _ in range(4)) / 4 for s in range(1, 3001)]
    frame = pl.DataFrame({"step": range(1, 3001), "value": scores}, schema={"step": pl.Int64, "value": pl.Float64})
    assert reward_collapses(frame, "score", Thresholds()) == []
    broken = frame.with_columns(pl.when(pl.col("step").is_between(2001, 2012)).then(0.0).otherwise(pl.col("value")).alias("value"))
    assert [f.onset_step for f in reward_collapses(broken, "score", Thresholds())] == [2001]


def _judged(rewards: dict[int, float]):
    from forensics.detect import Thresholds, reward_collapses

    frame = pl.DataFrame({"step": list(rewards), "value": list(rewards.values())}, schema={"step": pl.Int64, "value": pl.Float64})
    return [(f.onset_step, f.end_step) for f in reward_collapses(frame, "reward", Thresholds())]


def test_a_rising_coarse_reward_repeating_its_common_value_of_late_is_no_collapse() -> None:
    """Accuracy rising 0.2 → 0.9 over 400 steps, the mean of 32 0/1 rewards: 0.75 five times in a
    row at step 288 is rare in all the steps before (their reward was lower), common of late."""
    curve = {s: binomial_reward(s, 0.2 + 0.7 * min(s, 400) / 400, n=32, salt="q5") for s in range(1, 1501)}
    assert [curve[s] for s in range(288, 293)] == [0.75] * 5
    assert _judged(curve) == []
    assert _judged({**curve, **dict.fromkeys(range(600, 612), 0.0)}) == [(600, 612)]


def test_a_warm_up_is_one_however_the_steps_are_logged() -> None:
    """Nothing earned to step 300, then learned: logged every 10th step (TRL's logging_steps), or
    with one lucky 1/32 at step 1, it is a warm-up as when logged every step from 0."""
    learned = {s: (0.0 if s <= 300 else binomial_reward(s, 0.5)) for s in range(1, 1001)}
    assert _judged(learned) == []
    assert _judged({s: v for s, v in learned.items() if s % 10 == 0}) == []
    assert _judged({**learned, 1: 1 / 32}) == []
    # ...but steps that scored before the zeros are no warm-up, nor is a log starting mid-run
    # (a resumed run), from its first step or after a couple.
    assert _judged({**learned, 1: 0.5, 2: 0.5, 3: 0.5})[:1] == [(4, 301)]
    assert _judged({**learned, 1: 0.19, 2: 0.19, 3: 0.19})[:1] == [(4, 301)]
    assert _judged({s: v for s, v in learned.items() if s >= 100 and s % 10 == 0})[:1] == [(100, 310)]
    resumed = {s: (0.34 if s < 502 else 0.0 if s < 560 else v) for s, v in learned.items() if s >= 500}
    assert _judged(resumed)[:1] == [(502, 560)]


def test_a_warm_ups_zeros_are_no_healthy_history() -> None:
    """Zero in steps 1–100 (a warm-up), then learned: ten zeros mid-run or at the log's end were
    judged against a history where zero was common, and passed."""
    learned = {s: (0.0 if s <= 100 else max(binomial_reward(s, 0.7), 1 / 32)) for s in range(1, 401)}
    assert _judged(learned) == []
    assert _judged({**learned, **dict.fromkeys(range(391, 401), 0.0)}) == [(391, None)]
    assert _judged({**learned, **dict.fromkeys(range(300, 310), 0.0)}) == [(300, 310)]


def test_dead_batches_after_a_live_first_step_with_the_reward_earned_are_an_incident(tmp_path: Path) -> None:
    """Loss, gradient and advantages all 0 in steps 2–80 while the reward was earned all along: no
    warm-up (that is a reward earning nothing yet), dead batches."""
    keys = ("actor_loss/avg", "grad_norm", "advantages/avg", "advantages/min", "advantages/max")
    spec = RunSpec(last_step=200, reward=healthy_reward, save_freq_steps=25, stats_tweak=zero_learning(range(2, 81), keys))
    [incident] = only_run(write_run(tmp_path / "outputs", spec).fileroot).incidents
    assert (incident.kind, incident.onset_step, incident.end_step) == ("zero_variance", 2, 81)


@pytest.mark.parametrize("scale", [lambda a: a, lambda a: a - 1.0, lambda a: 2 * a - 1])
def test_a_recovery_is_found_on_any_reward_scale(scale) -> None:
    """Collapsed in steps 100–129 to the scale's floor, healthy again from 130 (one NaN logged in
    the recovery does not hold it back)."""
    curve = {s: scale(0.0 if 100 <= s < 130 else binomial_reward(s, 0.3)) for s in range(1, 301)}
    assert _judged(curve) == [(100, 130)]
    assert _judged({**curve, 133: math.nan}) == [(100, 130)]


def test_a_reward_gone_to_zero_in_the_logs_last_steps_is_a_collapse(tmp_path: Path) -> None:
    """Zero in the last three steps of 200, never before: too few for a collapse mid-run, but no
    more steps can follow; the checkpoint saved in the zeros is not the answer."""
    curve = {s: (0.0 if s >= 198 else max(binomial_reward(s, 0.6), 1 / 32)) for s in range(1, 201)}
    assert _judged(curve) == [(198, None)]
    assert _judged({**curve, 200: 0.5}) == []
    spec = RunSpec(last_step=200, reward=lambda s: curve[s], save_freq_steps=50)
    run = only_run(write_run(tmp_path / "outputs", spec).fileroot)
    assert [(i.kind, i.onset_step) for i in run.incidents] == [("reward_collapse", 198)]
    assert "to the last step logged, where the log ends (3 steps)" in run.incidents[0].summary
    assert run.recommendation.step == 150


def test_a_recover_checkpoint_saved_again_without_its_step_info_is_not_used(tmp_path: Path) -> None:
    """The recover checkpoint was saved again during step 150, inside the collapse (from 120), and
    the process died before it rewrote recover_info (still step 100's): its weights are step 150's.
    The choice passes over it, citing the save line, for the export of step 100."""
    spec = RunSpec(last_step=150, save_freq_steps=20, recover_mode="auto", recover_freq_steps=50,
                   reward=lambda s: 0.0 if s >= 120 else healthy_reward(s))
    paths = write_run(tmp_path / "outputs", spec)
    info = paths.checkpoint_root / "recover_info" / "step_info.json"
    assert json.loads(info.read_text())["global_step"] == 149
    info.write_text(json.dumps({"epoch": 0, "epoch_step": 99, "global_step": 99, "steps_per_epoch": 935}))
    run = only_run(paths.fileroot)
    assert run.recommendation.step == 100 and "globalstep99" in run.recommendation.checkpoint
    [warning] = [w for w in run.recommendation.warnings if "recover_checkpoint" in w]
    save = int(warning.split("trainer.log:")[1].split(")")[0])
    assert "saved again during step 150 (trainer.log:" in warning and "Saved recover checkpoint" in paths.trainer_log.read_text().splitlines()[save - 1]


def _drops(rewards: dict[int, float]):
    from forensics.detect import Thresholds, reward_collapses, reward_drops

    frame = pl.DataFrame({"step": list(rewards), "value": list(rewards.values())}, schema={"step": pl.Int64, "value": pl.Float64})
    t = Thresholds()
    return [(f.onset_step, f.end_step) for f in reward_drops(frame, "reward", t, reward_collapses(frame, "reward", t))]


def test_a_reward_that_halves_and_stays_there_is_a_drop(tmp_path: Path) -> None:
    """The mean of 32 rewards climbs to ~0.6 by step 150, then falls in one step to ~0.3 and stays
    there (no one value repeated: no collapse). Resuming from step 300's weights would resume a run
    whose reward halved: a reward_drop at the step it fell, the checkpoint before it. No failure was
    logged, so the cause is unknown — said as what can lower a reward while rollouts are served."""
    def curve(s: int) -> float:
        return binomial_reward(s, 0.2 + 0.4 * min(s, 150) / 150 if s < 150 else 0.3, salt="half")

    spec = RunSpec(last_step=300, reward=curve, save_freq_steps=10)
    run = only_run(write_run(tmp_path / "outputs", spec).fileroot)
    [incident] = run.incidents
    assert incident.kind == "reward_drop" and 147 <= incident.onset_step <= 150 and not incident.recovered
    assert "dropped to 0.29" in incident.summary and "never recovered" in incident.summary
    assert incident.cause == "unknown" and "No infrastructure failure was logged" in incident.summary
    assert run.recommendation.step == 140
    # Live, once the level has stayed down for a window or so: one alarm, told from where it fell.
    [alarm] = replay([tmp_path / "outputs"])[0].alarms
    assert (alarm.kind, alarm.cause) == ("reward_drop", "unknown") and 147 <= alarm.onset_step <= 152 and alarm.step <= 190
    # Back at its level after 60 steps: recovered there. Kept by a hung server: its timeouts say so.
    back = only_run(write_run(tmp_path / "back", replace(spec, reward=lambda s: binomial_reward(s, 0.6) if s >= 210 else curve(s))).fileroot)
    assert [(i.kind, i.recovered) for i in back.incidents] == [("reward_drop", True)]
    assert 208 <= back.incidents[0].end_step <= 215
    t = schedule(spec)
    hung = replace(spec, request_timeout=300, outages=(Outage(t[148].time, t[-1].time, kind="timeout", burst_every=(30.0, 60.0)),))
    [incident] = only_run(write_run(tmp_path / "hung", hung).fileroot).incidents
    assert (incident.kind, incident.cause) == ("reward_drop", "inference_server_unresponsive")


def test_one_hung_server_of_four_is_a_drop_its_timeouts_explain(tmp_path: Path) -> None:
    """One of four servers hangs at step 150: its quarter of the rollouts time out, the mean of 64
    rewards falls from 0.8 to 0.6 — not under 60 % of its best, but the timeouts standing out around
    it make the smaller fall an incident, named for them; the checkpoint before it is the answer.
    The same fall with nothing failing is no incident."""
    def curve(s: int) -> float:
        return binomial_reward(s, 0.8 * (0.75 if s >= 150 else 1), n=64, salt="quarter")

    spec = RunSpec(last_step=350, reward=curve, save_freq_steps=10, request_timeout=300)
    t = schedule(spec)
    hung = replace(spec, outages=(Outage(t[149].time, t[-1].time, kind="timeout", burst_every=(30.0, 60.0)),))
    run = only_run(write_run(tmp_path / "hung", hung).fileroot)
    [incident] = run.incidents
    assert (incident.kind, incident.cause) == ("reward_drop", "inference_server_unresponsive") and 148 <= incident.onset_step <= 150
    assert "a fall this small counts where the infrastructure failed around it and on" in incident.summary
    assert run.recommendation.step == 140
    assert only_run(write_run(tmp_path / "quiet", spec).fileroot).incidents == []
    # A reward swinging slowly (±8 %) with a burst of timeouts on its way down, the server fine after
    # them: the failures do not last through the fall, so no incident.
    swing = RunSpec(last_step=600, reward=lambda s: binomial_reward(s, 0.6 + 0.08 * math.sin(2 * math.pi * (s - 100) / 300), n=1024, salt="sw"),
                    save_freq_steps=10, request_timeout=60)
    t = schedule(swing)
    burst = replace(swing, outages=(Outage(t[239].time, t[243].time, kind="timeout", burst_every=(20, 40)),))
    assert [i.kind for i in only_run(write_run(tmp_path / "burst", burst).fileroot).incidents] == []


def test_a_drop_in_an_attempt_a_relaunch_abandoned_is_told(tmp_path: Path) -> None:
    """The first attempt's reward halves from step 250; stopped at 330, the run is relaunched from
    step 200 and the relaunch is healthy: the attempt's drop is an incident, told at its own lines
    and recovered (its steps were run again), and the newest checkpoint is still the answer."""
    spec = RunSpec(last_step=500, reward=lambda s: binomial_reward(s, 0.6, salt="rl"), save_freq_steps=50, recover_mode="auto",
                   relaunch=Relaunch(stop_after=330, resume_from=200, first_reward=lambda s: binomial_reward(s, 0.3 if s >= 250 else 0.6, salt="rl1")))
    run = only_run(write_run(tmp_path / "outputs", spec).fileroot)
    [incident] = run.incidents
    assert (incident.kind, incident.redone, incident.recovered) == ("reward_drop", True, True) and 245 <= incident.onset_step <= 252
    assert "in an attempt the run abandoned at step 330: a relaunch from step 200 took the run on from step 201" in incident.summary
    # The drop's own words, then where the attempt ended: "<key> dropped to … at step …, from a best of … to step 330, …"
    assert re.match(rf"{re.escape(incident.metric)} dropped to [\d.]+ at step \d+, from a best of [\d.]+ \(the highest mean of \d+ "
                    r"logged steps\) to step 330, the attempt's last, in an attempt", incident.summary)
    assert run.recommendation.step == 500


def test_a_reward_declining_to_nothing_is_a_drop_from_where_it_began(tmp_path: Path) -> None:
    """From its best, ~0.45 at step 150, the reward slides to 0 by step 350: the drop began where the
    slide did, not where the noise first touched 0, and the checkpoint at the best is the answer."""
    def curve(s: int) -> float:
        p = 0.15 + 0.3 * s / 150 if s <= 150 else max(0.45 * (350 - s) / 200, 0.0)
        return binomial_reward(s, p, salt="slide")

    spec = RunSpec(last_step=400, reward=curve, save_freq_steps=10)
    run = only_run(write_run(tmp_path / "outputs", spec).fileroot)
    assert run.incidents[0].kind == "reward_drop" and 150 <= run.incidents[0].onset_step <= 190
    assert "declined from step" in run.incidents[0].summary
    assert run.recommendation.step is not None and 150 <= run.recommendation.step < run.incidents[0].onset_step


def test_healthy_rewards_coarse_or_fine_rising_or_flat_drop_nothing() -> None:
    """Noise is no drop, however coarse (the mean of 4 rewards) or low (a sparse task), nor is a
    slow swing with the data (±0.1 about 0.5), nor a climb; a jump to zero is a collapse, told once."""
    curves = {
        **{f"flat {n} {p}": (lambda s, n=n, p=p: binomial_reward(s, p, n=n, salt=f"f{n}{p}"))
           for n in (4, 16, 64) for p in (0.03, 0.1, 0.5, 0.9)},
        **{f"rise {n}": (lambda s, n=n: binomial_reward(s, 0.1 + 0.8 * min(s, 600) / 600, n=n, salt=f"r{n}")) for n in (4, 16, 64)},
        **{f"swing {n}": (lambda s, n=n: binomial_reward(s, 0.5 + 0.1 * math.sin(s / 40), n=n, salt=f"w{n}")) for n in (8, 32)},
    }
    for name, f in curves.items():
        for steps in (range(1, 1201), range(10, 1201, 10)):
            assert _drops({s: f(s) for s in steps}) == [], name
    collapse = {s: (0.0 if s >= 600 else curves["rise 16"](s)) for s in range(1, 1201)}
    assert _drops(collapse) == [] and _judged(collapse) == [(600, None)]
    # Back from the zeros only half way: the drop is told from where the collapse ended.
    partial = {**collapse, **{s: binomial_reward(s, 0.35, n=16, salt="p") for s in range(700, 1201)}}
    assert _judged(partial) == [(600, 700)] and _drops(partial) == [(700, None)]
    sparse = {s: v for s, v in partial.items() if s % 5 == 0}
    assert _judged(sparse) == [(600, 700)] and _drops(sparse) == [(700, None)]


def test_a_slide_must_go_deep_or_stay_down_and_a_short_series_is_judged_too() -> None:
    """An epoch ordered by difficulty slides the mean of 8 rewards from 0.75 to 0.35 and jumps back:
    noise makes no step of the slide (no drop). A slide to half that stays there for a thousand
    steps is one, from where it began; so is a clean halving in a series of 50 or of 70 values (a
    verl run of 50 steps, a copy logged every 10th step)."""
    epochs = {s: binomial_reward(s, 0.75 - 0.4 * ((s % 250) / 250), n=8, salt="d08") for s in range(1, 1001)}
    assert _drops(epochs) == []
    slide = {s: binomial_reward(s, 0.7 - 0.35 * min(max(s - 300, 0), 200) / 200, salt="slide") for s in range(1, 1501)}
    [(onset, end)] = _drops(slide)
    assert 300 <= onset <= 360 and end is None
    # (the mean of 4,096 rewards: next to no noise, yet no value held, which would be a collapse)
    assert _drops({s: binomial_reward(s, 0.6 if s < 25 else 0.3, n=4096) for s in range(1, 51)}) == [(25, None)]
    clean = {s: binomial_reward(s, (0.2 + 0.4 * min(s, 200) / 200) * (0.5 if s >= 400 else 1), n=4096) for s in range(10, 701, 10)}
    assert _drops(clean) == [(400, None)]


def test_an_onset_is_cited_at_the_table_row_that_holds_its_value() -> None:
    """AReaL's tables hold a step's values below its header: the onset's evidence, offline and in a
    replay's alarm, is the row with the metric's cell, not the header."""
    root = FIXTURES / "sglang_hang" / "outputs"
    [run] = analyze([root]).runs
    incident = run.incidents[0]
    cell = rf"│\s*{re.escape(incident.metric)}\s*│\s*0\.0000e\+00"
    evidence = incident.onset_evidence
    assert evidence is not None and re.search(cell, read_line(evidence.file, evidence.line))
    [result] = replay([root])
    cited = [e for a in result.alarms for e in a.evidence if e.kind == "metric" and incident.metric in e.text]
    assert cited and all(re.search(rf"│\s*{re.escape(incident.metric)}\s*│", read_line(e.file, e.line)) for e in cited)


def test_a_run_resumed_across_areals_key_rename_is_judged_on_one_reward_series(tmp_path: Path) -> None:
    """Resumed after an upgrade past AReaL v0.4.1 (#556), the run logged `grpo_actor/…` up to step 30
    and `ppo_actor/…` after: the old reward series, ending at step 30, was judged alone (healthy) and
    the collapse at 45 unseen. One series under the new names, and said."""
    run = write_run(tmp_path / "outputs", RunSpec(last_step=60, reward=lambda s: 0.0 if s >= 45 else 0.4 + 0.01 * (s % 9)))
    text = run.trainer_log.read_text()
    cut = text.index("Train step 31/")
    run.trainer_log.write_text(text[:cut] + text[cut:].replace("grpo_actor/", "ppo_actor/"))
    [result] = analyze([tmp_path / "outputs"]).runs
    assert result.primary_metric == "ppo_actor/task_reward/avg"
    assert [(i.kind, i.onset_step) for i in result.incidents] == [("reward_collapse", 45)]
    assert any("AReaL renamed them in v0.4.1" in note for note in result.notes)


def test_an_untimed_traceback_tells_no_step_duration(tmp_path: Path) -> None:
    """The trainer's last act is a Python traceback teed from stderr, two hours after step 60's
    header, with no time of its own (it takes the header's): how long step 61 ran is not known,
    and is not said to be "0 s … not stuck"."""
    from areal_builder import LogLine

    spec = RunSpec(last_step=60, save_freq_steps=10)
    end = write_run(tmp_path / "first", spec).step_times[60]
    raised = ('Traceback (most recent call last):\n  File "/AReaL/areal/core/workflow_executor.py", line 412, in wait\n'
              '    raise TimeoutError("Timed out waiting for 32 rollouts, only received 0.")\n'
              "TimeoutError: Timed out waiting for 32 rollouts, only received 0.")
    paths = write_run(tmp_path / "outputs", RunSpec(last_step=60, save_freq_steps=10, extra_lines=[LogLine(end + timedelta(hours=2), raised)]))
    [crash] = [i for i in only_run(paths.fileroot).incidents if i.kind == "crash"]
    assert crash.onset_step == 61 and "How long step 61 had run when it failed is not known" in crash.summary
    assert "not stuck" not in crash.summary


@pytest.mark.parametrize("lucky", [(12,), (12, 25), (30,)])
def test_a_hard_tasks_warm_up_with_lucky_hits_is_no_collapse(tmp_path: Path, lucky: tuple[int, ...]) -> None:
    """A hard task: every batch of 256 scored exactly 0 for its first 40 steps but for a lucky
    1/256 here and there, then the run learned. That is a warm-up, not a collapse after the lucky
    step, and the newest checkpoint is the one to resume from."""
    def reward(step: int) -> float:
        if step <= 40:
            return 1 / 256 if step in lucky else 0.0
        return min(0.6, 0.02 * (step - 40)) + (step % 7) / 100

    paths = write_run(tmp_path / "outputs", RunSpec(last_step=150, save_freq_steps=25, reward=reward))
    run = only_run(paths.fileroot)
    assert run.incidents == [] and run.recommendation.step == 150
