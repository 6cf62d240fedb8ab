"""verl runs on Ray, end to end: the NCCL hang, the score that is zero from step 1, the OOM kill."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import polars as pl
import pytest
from conftest import read_line
from typer.testing import CliRunner
from verl_builder import nccl_hang_run, ray_oom_kill_run, zero_score_run

from forensics import analyze
from forensics.cli import app

runner = CliRunner()


def only(root: Path):
    [run] = analyze([root]).runs
    assert run.framework == "verl"
    return run


def test_nccl_hang_then_death_is_a_collective_hang(tmp_path: Path) -> None:
    nccl_hang_run(tmp_path / "run")
    run = only(tmp_path / "run")
    [incident] = run.incidents
    assert (incident.kind, incident.onset_step, incident.cause) == ("crash", 8, "nccl_timeout")
    assert "hang in a collective" in incident.summary
    # The console has no times: step times are estimated from the session's start, which leaves out
    # the start-up, so the step's time in progress is an upper bound and proves no hang by itself.
    assert "had run at most 10.2 min" in incident.summary and "stuck, not slow" not in incident.summary
    files = {Path(e.file).name for e in incident.evidence}
    assert "train.log" in files and any(name.startswith("worker-") for name in files)
    assert run.recommendation.checkpoint.endswith("global_step_4")
    # The run's own overrides, which Hydra printed when the job raised, with the resume flags.
    words = shlex.split(run.recommendation.resume_command)
    assert words[:3] == ["python3", "-m", "verl.trainer.main_ppo"] and "trainer.save_freq=4" in words
    assert words[-2:] == ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={Path(run.recommendation.checkpoint).absolute()}"]
    result = runner.invoke(app, ["best-checkpoint", str(tmp_path / "run")])
    assert result.exit_code == 0 and result.stdout.strip().endswith("global_step_4")


def test_ranks_failing_at_the_same_moment_are_cited_in_file_order_every_time(tmp_path: Path) -> None:
    """Sixteen ranks log the NCCL watchdog at the same millisecond, each on line 3 of its own
    worker log: the evidence cites them in the order of their files, the same on every run (the
    evidence is picked without sorting every line: a tie must not fall to chance)."""
    paths = nccl_hang_run(tmp_path / "run", world_size=8, steps=30, fail_at=20)
    source = next(p for p in paths.root.rglob("worker-*.err") if "Watchdog caught" in p.read_text())
    text, (worker, job, _) = source.read_text(), source.stem.split("-")[1:]
    for k in range(1, 16):
        (source.parent / f"worker-{worker[:-2]}{k:02x}-{job}-{40000 + k}.err").write_text(
            text.replace("[rank0]", f"[rank{k}]").replace("Rank 0]", f"Rank {k}]"))

    def cited() -> list[str]:
        [incident] = only(tmp_path / "run").incidents
        return [Path(e.file).name for e in incident.evidence if e.file.endswith(".err")]

    first = cited()
    assert len(first) > 2 and first == sorted(first) and cited() == first


def test_score_zero_from_the_first_step_is_reward_wiring(tmp_path: Path) -> None:
    zero_score_run(tmp_path / "run")
    run = only(tmp_path / "run")
    [incident] = run.incidents
    assert (incident.kind, incident.onset_step, incident.cause) == ("reward_collapse", 1, "reward_pipeline")
    assert run.primary_metric == "critic/score/mean"
    assert "exactly zero at every step from the first (step 1) and never took another value" in incident.summary
    # verl's own way to keep the rollouts, not AReaL's
    assert any("trainer.rollout_data_dir" in s for s in incident.suggestions)
    assert not any("AReaL" in s for s in incident.suggestions)
    result = runner.invoke(app, ["best-checkpoint", str(tmp_path / "run")])
    assert result.exit_code == 4


def test_ray_memory_monitor_kill_is_a_worker_crash(tmp_path: Path) -> None:
    ray_oom_kill_run(tmp_path / "run")
    run = only(tmp_path / "run")
    [incident] = run.incidents
    assert (incident.kind, incident.onset_step, incident.cause) == ("crash", 6, "training_worker_crash")
    assert any(e.kind == "host_oom_kill" for e in incident.evidence)
    assert incident.confidence >= 0.85
    assert run.recommendation.step == 4


def test_a_hang_in_the_first_step_is_not_called_a_deadlock_outright(tmp_path: Path) -> None:
    nccl_hang_run(tmp_path / "run", fail_at=1)
    [run] = analyze([tmp_path / "run"]).runs
    [incident] = run.incidents
    assert incident.kind == "crash" and incident.cause == "nccl_timeout"
    assert "No step had finished yet" in incident.summary


def test_a_run_with_only_its_jsonl_finds_its_checkpoints(tmp_path: Path) -> None:
    """The file logger writes <cwd>/<project>/<experiment>.jsonl, the checkpoints
    <cwd>/checkpoints/<project>/<experiment>/: found beside the JSONL's folder."""
    paths = nccl_hang_run(tmp_path / "run")
    whole = sorted(c.path for c in only(tmp_path / "run").checkpoints)
    paths.train_log.unlink()
    [run] = [r for r in analyze([tmp_path / "run"]).runs if any(s.kind == "verl_jsonl" for s in r.sources)]
    assert whole and sorted(c.path for c in run.checkpoints) == whole
    # Gzipped (a run archived): the same run, its checkpoints found by the experiment's name.
    import gzip

    paths.jsonl.with_name(paths.jsonl.name + ".gz").write_bytes(gzip.compress(paths.jsonl.read_bytes()))
    paths.jsonl.unlink()
    [packed] = analyze([tmp_path / "run"]).runs
    assert [s.kind for s in packed.sources if s.path.endswith(".jsonl.gz")] == ["verl_jsonl"]
    said = lambda r: [(i.kind, i.onset_step, i.cause) for i in r.incidents]  # noqa: E731
    assert sorted(c.path for c in packed.checkpoints) == whole and said(packed) == said(run)


def test_a_verl_experiment_is_one_run_however_its_parts_are_given(tmp_path: Path) -> None:
    """The run's own session (as the folder, its ``logs/``, through ``session_latest``), its
    checkpoints folder, or its console and JSONL given by name: the experiment's one run and exit
    0. The session had been a second run, the checkpoints 'no training run found' (exit 2), the
    console and JSONL two runs with opposite verdicts."""
    import os
    import subprocess
    import sys

    paths = nccl_hang_run(tmp_path / "exp")

    def runs(*given: Path, cwd: Path = tmp_path) -> list[tuple]:
        # (with the session's parse cache, a user's default: the same logs are read eleven ways)
        done = subprocess.run([sys.executable, "-m", "forensics", "analyze", *map(str, given), "--json", "-"],
                              cwd=cwd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
        assert done.returncode == 0, done.stderr
        return [(r["run_id"], [(i["kind"], i["onset_step"], i["cause"]) for i in r["incidents"]], r["recommendation"]["step"])
                for r in json.loads(done.stdout)["runs"]]

    [whole] = runs(paths.root)
    assert whole[1] and whole[2] is not None
    latest = paths.session.parent / "session_latest"
    for beside in (paths.session, paths.session / "logs", latest, latest / "logs", paths.root / "checkpoints"):
        assert runs(paths.root, beside) == [whole], beside
    assert runs(paths.train_log, paths.jsonl) == [whole]
    # The session's logs/ given as ``.``: named after the session, as given by its whole path.
    assert runs(Path("."), cwd=paths.session / "logs")[0][0] == runs(paths.session / "logs")[0][0] == paths.session.name
    # Given its JSONL from inside the experiment, whose checkpoints it reads, the default report is not put there.
    runs(paths.jsonl.relative_to(paths.root), cwd=paths.root)
    assert not (paths.root / "grpo-forensics-report").exists()


def test_a_rotated_consoles_live_part_is_read_as_its_earlier_part(tmp_path: Path) -> None:
    """Rotated by size inside the final traceback, the live ``train.log`` starts with no line a
    format knows: read as ``train.log.1`` is (it was 'no format this tool reads … not read')."""
    paths = ray_oom_kill_run(tmp_path / "exp")
    lines = paths.train_log.read_text().splitlines(keepends=True)
    cut = max(i for i, line in enumerate(lines) if "Traceback" in line) + 2
    paths.train_log.with_name("train.log.1").write_text("".join(lines[:cut]))
    paths.train_log.write_text("".join(lines[cut:]))
    [run] = analyze([paths.root]).runs
    parts = {Path(s.path).name: s.kind for s in run.sources if Path(s.path).name.startswith("train.log")}
    assert parts == {"train.log.1": "verl_log", "train.log": "verl_log"}


def test_several_runs_and_their_sessions_kept_apart_are_paired_by_what_they_printed(tmp_path: Path) -> None:
    """Seed 004's checklist for its six cases: ``outputs/<exp>/train.log`` and
    ``/tmp/r_*/session_latest/logs``. Each session is the run whose console holds the steps its
    TaskRunner printed (they had been runs of their own, the runs analyzed without them)."""
    from datetime import timedelta

    inside = {}
    for name, make, seed, hours in (("expA", nccl_hang_run, 1, 0), ("expB", ray_oom_kill_run, 2, 3)):
        paths = make(tmp_path / "outputs" / name, seed=seed, ray_session=True,
                     start=datetime(2026, 11, 22, 3, 11, 31) + timedelta(hours=hours))
        [inside[name]] = [(i.kind, i.onset_step, i.cause) for i in analyze([paths.root]).runs[0].incidents if i.kind == "crash"]
        (paths.root / "ray_tmp").rename(tmp_path / f"r_{name}")
    given = [tmp_path / "outputs" / "expA", tmp_path / "outputs" / "expB",
             tmp_path / "r_expA" / "session_latest" / "logs", tmp_path / "r_expB" / "session_latest" / "logs"]
    runs = {r.run_id: r for r in analyze(given).runs}
    assert sorted(runs) == ["expA", "expB"]
    for name, run in runs.items():
        assert any(f"r_{name}" in s.path for s in run.sources) and not any(f"r_{other}" in s.path for s in run.sources
                                                                         for other in set(runs) - {name})
        assert [(i.kind, i.onset_step, i.cause) for i in run.incidents if i.kind == "crash"] == [inside[name]]


def test_two_experiments_of_one_project_are_two_runs(tmp_path: Path) -> None:
    """``<project>/<experiment>.jsonl`` for two experiments launched from one folder: a run each,
    named by its experiment, one's zero score not pinned on the other (they had been one series)."""
    zero_score_run(tmp_path / "cwd", experiment="exp_zero")
    nccl_hang_run(tmp_path / "cwd", experiment="exp_hang")
    (tmp_path / "cwd" / "train.log").unlink()
    project = tmp_path / "cwd" / "verl_grpo_example_gsm8k"
    for given in ([project], sorted(project.glob("*.jsonl"))):
        runs = {r.run_id: r for r in analyze(given).runs}
        assert sorted(runs) == ["verl_grpo_example_gsm8k/exp_hang", "verl_grpo_example_gsm8k/exp_zero"]
        assert [i.kind for i in runs["verl_grpo_example_gsm8k/exp_zero"].incidents] == ["reward_collapse"]
        assert "reward_collapse" not in [i.kind for i in runs["verl_grpo_example_gsm8k/exp_hang"].incidents]
        assert all(len(r.sources) == 1 for r in runs.values())


SHARED_WANDB = """
import json, os, sys, time
os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_CONSOLE="off", WANDB_DISABLE_GIT="true")
import wandb
spec = json.loads(sys.argv[1])
os.chdir(spec["cwd"])
for name, records in spec["runs"]:  # verl's Tracking: wandb.init(project=, name=experiment_name), log(data, step=)
    run = wandb.init(project="verl_grpo_example_gsm8k", name=name)
    for record in records:
        run.log({k: v for k, v in record["data"].items() if v is not None}, step=record["step"])
    run.finish()
    time.sleep(1.1)  # (W&B names run folders by the second)
"""


def test_one_wandb_folder_of_two_experiments_is_told_to_each_by_its_runs_name(tmp_path: Path) -> None:
    """verl's working folder: two experiments' consoles (``nohup … > <experiment>.log``) and the
    ``wandb/`` W&B writes there for both. Each W&B run is its experiment's copy (its name is the
    experiment's); they are not one run whose longer healthy copy hides the other's collapse.
    A W&B run naming neither is a run of its own."""
    import os
    import shutil
    import subprocess
    import sys

    from verl_builder import VerlRunSpec, healthy_score, write_verl_run

    cwd = tmp_path / "verl"
    cwd.mkdir()
    runs = []
    for name, steps, collapse in (("qwen_function_rm", 60, 40), ("qwen_lr_fix", 100, None)):
        spec = VerlRunSpec(steps=steps, save_freq=10, experiment=name,
                           score=lambda s, c=collapse: 0.0 if c and s >= c else healthy_score(s))
        paths = write_verl_run(tmp_path / "tmp" / name, spec)
        (cwd / f"{name}.log").write_text(paths.train_log.read_text().replace(f"{paths.root}/checkpoints", "checkpoints"))
        shutil.copytree(paths.root / "checkpoints", cwd / "checkpoints", dirs_exist_ok=True)
        runs.append((name, [json.loads(line) for line in paths.jsonl.read_text().splitlines()]))
    runs.append(("someone-elses-sweep", runs[1][1][:5]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")} | {"HOME": str(tmp_path / "home")}
    subprocess.run([sys.executable, "-c", SHARED_WANDB, json.dumps({"cwd": str(cwd), "runs": runs})], env=env, check=True, timeout=180)
    found = {r.run_id: r for r in analyze([cwd]).runs}
    collapsed, healthy = found["verl/qwen_function_rm.log"], found["verl/qwen_lr_fix.log"]
    assert [(i.kind, i.onset_step) for i in collapsed.incidents] == [("reward_collapse", 40)]
    assert healthy.incidents == [] and healthy.step_range()["last"] == 100
    assert "qwen_function_rm" not in str(healthy.recommendation.checkpoint)
    copies = {run_id: [Path(s.path).name for s in r.sources if s.kind == "wandb"] for run_id, r in found.items()}
    assert len(copies["verl/qwen_function_rm.log"]) == len(copies["verl/qwen_lr_fix.log"]) == 1
    assert copies["verl/qwen_function_rm.log"] != copies["verl/qwen_lr_fix.log"]
    [stray] = [r for run_id, r in found.items() if run_id not in ("verl/qwen_function_rm.log", "verl/qwen_lr_fix.log")]
    assert stray.step_range()["last"] == max(record["step"] for record in runs[2][1])


SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "samples" / "ray"


@pytest.mark.skipif(not SAMPLES.is_dir(), reason="shared/samples not present")
def test_a_run_ended_by_its_own_exception_is_a_crash() -> None:
    """Real Ray session: the driver died of a ZeroDivisionError after step 2 of 5; no Ray failure."""
    [run] = analyze([SAMPLES / "c_task_exception"]).runs
    [incident] = run.incidents
    assert (incident.kind, incident.onset_step, incident.end_step, incident.cause) == ("crash", 3, None, "training_worker_crash")
    assert "ZeroDivisionError: float division by zero" in incident.summary
    assert (Path(incident.evidence[0].file).name, incident.evidence[0].line) == ("driver.log", 10)
    result = runner.invoke(app, ["analyze", str(SAMPLES / "c_task_exception"), "--no-html", "--fail-on-incident"])
    assert result.exit_code == 1


@pytest.mark.parametrize(
    ("tail", "after"),
    [
        ("Traceback (most recent call last):\n  File \"x.py\", line 3, in <module>\nValueError: bad sample\n", True),
        ("Traceback (most recent call last):\n  File \"x.py\", line 3, in <module>\nKeyboardInterrupt\n", False),
        # a Ctrl-C and what the run raised while it stopped: stopped by hand all the same
        ("Traceback (most recent call last):\n  File \"x.py\", line 3, in <module>\nKeyboardInterrupt\n\n"
         "During handling of the above exception, another exception occurred:\n\n"
         "Traceback (most recent call last):\n  File \"x.py\", line 5, in <module>\nRuntimeError: cleanup failed\n", False),
    ],
)
def test_a_caught_exception_or_a_ctrl_c_is_no_crash(tmp_path: Path, tail: str, after: bool) -> None:
    lines = [f"step:{s} - critic/score/mean:0.{s} - timing_s/step:1.0\n" for s in (1, 2, 3)]
    (tmp_path / "train.log").write_text("".join(lines[:2]) + tail + (lines[2] if after else ""))
    [run] = analyze([tmp_path / "train.log"]).runs
    assert run.incidents == [] and len(run.events.filter(pl.col("kind") == "traceback")) == 1


def test_an_exception_then_a_ctrl_c_while_it_hung_is_a_crash(tmp_path: Path) -> None:
    lines = "".join(f"step:{s} - critic/score/mean:0.{s} - timing_s/step:1.0\n" for s in (1, 2))
    raised = "Traceback (most recent call last):\n  File \"x.py\", line 3, in <module>\nValueError: bad sample\n"
    ctrl_c = "Traceback (most recent call last):\n  File \"x.py\", line 9, in <module>\nKeyboardInterrupt\n"
    (tmp_path / "train.log").write_text(lines + raised + ctrl_c)
    [incident] = analyze([tmp_path / "train.log"]).runs[0].incidents
    assert (incident.kind, incident.onset_step) == ("crash", 3) and "ValueError: bad sample" in incident.summary


@pytest.mark.parametrize("start", ["Traceback (most recent call last):",
                                   "Unhandled error (suppress with 'RAY_IGNORE_UNHANDLED_ERRORS=1'): ray::WorkerDict.update_actor()"])
def test_a_console_ending_in_a_cuda_oom_traceback_is_a_crash(tmp_path: Path, start: str) -> None:
    """The driver's last act was an uncaught CUDA OOM (a ``cuda_oom`` event, not a bare traceback),
    its own or a Ray task's: the run ended of it during step 3, as of any exception it did not catch."""
    lines = "".join(f"(TaskRunner pid=9) step:{s} - critic/score/mean:0.{s} - timing_s/step:1.0\n" for s in (1, 2))
    raised = (f"(TaskRunner pid=9) {start}\n"
              '(TaskRunner pid=9)   File "verl/workers/actor/dp_actor.py", line 321, in update_policy\n'
              "(TaskRunner pid=9) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.31 GiB.\n")
    (tmp_path / "train.log").write_text(lines + raised)
    [run] = analyze([tmp_path / "train.log"]).runs
    assert run.events.filter(pl.col("kind") == "cuda_oom").height == 1
    [incident] = run.incidents
    assert (incident.kind, incident.onset_step, incident.cause) == ("crash", 3, "training_worker_crash")
    assert "torch.OutOfMemoryError: CUDA out of memory" in incident.summary


def test_a_traceback_after_the_planned_last_step_is_no_crash(tmp_path: Path) -> None:
    text = "".join(f"step:{s} - critic/score/mean:0.{s} - timing_s/step:1.0\n" for s in (1, 2, 3))
    tail = "Traceback (most recent call last):\n  File \"x.py\", line 3, in <module>\nRuntimeError: teardown\n"
    (tmp_path / "train.log").write_text("Total training steps: 3\n" + text + tail)
    assert analyze([tmp_path / "train.log"]).runs[0].incidents == []
    (tmp_path / "train.log").write_text("Total training steps: 5\n" + text + tail)
    [incident] = analyze([tmp_path / "train.log"]).runs[0].incidents
    assert (incident.kind, incident.onset_step) == ("crash", 4) and "RuntimeError: teardown" in incident.summary


@pytest.mark.skipif(not SAMPLES.is_dir(), reason="shared/samples not present")
def test_a_segfault_printed_before_the_last_step_line_is_one_crash() -> None:
    """Real Ray session: the worker died during step 3, but Ray forwarded its lines to driver.log
    before TaskRunner's ``step:2`` line. One fatal crash at step 3, not a survived one at step 2 too;
    step times are estimates (the console has none), so no hang is claimed from them."""
    [run] = analyze([SAMPLES / "d_segfault"]).runs
    [incident] = run.incidents
    assert (incident.kind, incident.onset_step, incident.end_step, incident.cause) == ("crash", 3, None, "training_worker_crash")
    assert "segfault" in incident.summary and "had run at most 3 s" in incident.summary
    assert "stuck, not slow" not in incident.summary


@pytest.mark.skipif(not SAMPLES.is_dir(), reason="shared/samples not present")
@pytest.mark.parametrize(("name", "counted"), [("a_actor_exit", "1 worker_died in steps 1–5; 1 actor_died"),
                                               ("e_oom", "2 host_oom_kill in steps 1–5; 2 actor_died")])
def test_one_failure_told_by_several_ray_files_is_counted_once(name: str, counted: str) -> None:
    """Real Ray sessions: one worker's death is in the raylet's event log, the GCS log and the
    driver (a_actor_exit); the memory monitor killed two workers, each told of in several files (e_oom)."""
    [incident] = analyze([SAMPLES / name]).runs[0].incidents
    assert counted in incident.summary
    assert len({Path(e.file).name for e in incident.evidence}) >= 3  # every file that told of it is still cited


def test_steps_without_times_are_not_called_unfinished(tmp_path: Path) -> None:
    lines = [f"step:{s} - critic/score/mean:0.{s} - timing_s/step:1.0\n" for s in (1, 2)]
    fault = "[rank0]:[E419 03:28:41.000000000 ProcessGroupNCCL.cpp:632] Watchdog caught collective operation timeout\n"
    (tmp_path / "train.log").write_text("".join(lines) + fault)
    [incident] = analyze([tmp_path / "train.log"]).runs[0].incidents
    assert (incident.kind, incident.onset_step) == ("crash", 3)
    assert "No step had finished yet" not in incident.summary


@pytest.mark.parametrize("ray_session", [False, True], ids=["console-only", "with-ray-session"])
def test_a_collapse_in_an_attempt_a_restart_abandoned_is_an_incident(tmp_path: Path, ray_session: bool) -> None:
    """The score went to 0 at step 32; verl was restarted into the same log (``tee -a``), resumed
    from global_step_30, and steps 31–60 are healthy. The later copies are the run's; the abandoned
    attempt's collapse is told, at its own line, and the checkpoint choice passes over it."""
    from verl_builder import VerlRunSpec, healthy_score, write_verl_run

    spec = VerlRunSpec(steps=60, save_freq=10, test_freq=0, restart=(45, 30), ray_session=ray_session,
                       first_score=lambda s: 0.0 if s >= 32 else healthy_score(s))
    paths = write_verl_run(tmp_path / "run", spec)
    run = only(tmp_path / "run")
    [incident] = run.incidents
    assert (incident.kind, incident.onset_step, incident.end_step, incident.recovered) == ("reward_collapse", 32, 46, True)
    assert incident.wasted_steps == 13
    assert ("exactly zero from step 32 to step 45, the attempt's last, in an attempt the run abandoned at step 45: "
            "a relaunch from step 30 took the run on from step 31") in incident.summary
    onset = incident.onset_evidence
    line = paths.train_log.read_text().splitlines()[onset.line - 1]
    assert "step:32 - " in line and "critic/score/mean:np.float64(0.0)" in line
    assert run.metrics.filter((pl.col("key") == "critic/score/mean") & (pl.col("step") == 40))["value"].item() > 0
    assert run.recommendation.step == 60 and "was in an attempt a relaunch abandoned" in run.recommendation.reason
    # The resume line is at the step it resumed into (31), not the one the abandoned attempt had in progress (46).
    [resumed] = run.events.filter(pl.col("kind") == "run_resumed").rows(named=True)
    assert "global_step_30" in read_line(resumed["file"], resumed["line"]) and resumed["step"] == 31
    if ray_session:  # step times rebuilt copy after copy: the abandoned attempt's steps came first
        assert onset.time is not None and onset.time < run.steps.filter(pl.col("step") == 31)["time"].item()
        assert incident.wasted_hours is not None and 0.2 < incident.wasted_hours < 0.25


def _restarted(root: Path, **changes):
    """The first attempt's score 0 from step 32; verl restarted from global_step_30; 31-60 healthy."""
    from verl_builder import VerlRunSpec, healthy_score, write_verl_run

    spec = VerlRunSpec(steps=60, save_freq=10, test_freq=0, restart=(45, 30), first_score=lambda s: 0.0 if s >= 32 else healthy_score(s))
    return write_verl_run(root, replace(spec, **changes))


@pytest.mark.parametrize("say_saves", [True, False], ids=["saves-logged", "saves-not-logged"])
def test_checkpoints_only_an_abandoned_attempt_saved_are_not_chosen(tmp_path: Path, say_saves: bool) -> None:
    """The first attempt saved global_step_40 inside its collapse (score 0 from step 32); the
    restart from global_step_30 saves only every 100 steps, so 40 on disk is the abandoned attempt's
    though the run's own steps went past it. The console has no times: its save lines tell which
    attempt saved what; without them, the choice says it cannot tell."""
    paths = _restarted(tmp_path / "run", restart_save_freq=100, say_saves=say_saves)
    assert (paths.ckpt_root / "global_step_40").is_dir()
    recommendation = only(tmp_path / "run").recommendation
    if say_saves:
        assert recommendation.step == 30
        assert any("global_step_40: saved by an attempt a relaunch abandoned" in w for w in recommendation.warnings)
    else:
        assert recommendation.step == 40
        assert any(w.startswith("Step 40 was also reached by an attempt a relaunch abandoned (steps 31–45), and neither "
                                "the logs' times nor a save line tell which attempt saved global_step_40") for w in recommendation.warnings)


def test_each_attempt_is_timed_from_its_own_ray_session(tmp_path: Path) -> None:
    """The restart launched Ray anew three hours after the first attempt began (a second session
    folder beside the first): the restart's steps count from the second session's start, the
    abandoned attempt's from the first's (all had counted from the last session read)."""
    import shutil
    from datetime import timedelta

    paths = _restarted(tmp_path / "run", ray_session=True)
    first = paths.session
    later = datetime.strptime(first.name[8:34], "%Y-%m-%d_%H-%M-%S_%f") + timedelta(hours=3)
    second = first.parent / f"session_{later:%Y-%m-%d_%H-%M-%S_%f}_{first.name.rsplit('_', 1)[1]}"
    shutil.copytree(first, second, symlinks=True)
    (second / "logs" / "monitor.log").write_text("")  # (not the first's listing: no copy of it)
    run = only(tmp_path / "run")
    restarted = run.steps.filter(pl.col("step") == 31)["time"].item()
    assert later < restarted < later + timedelta(minutes=5)
    [incident] = run.incidents
    assert incident.onset_evidence.time is not None and incident.onset_evidence.time < later - timedelta(hours=2)
    assert run.steps.filter(pl.col("step") == 30)["time"].item() < later  # step 30: the first attempt's, kept


def test_a_restart_into_a_new_console_log_keeps_one_copy_of_each_step(tmp_path: Path) -> None:
    """Restarted by hand into train_resume.log beside train.log: each step's value is the newest file's
    (both files' had been kept, two values for steps 31-45, and the collapse went unsaid)."""
    paths = _restarted(tmp_path / "run", file_logger=False)
    lines = paths.train_log.read_text().splitlines(keepends=True)
    split = next(i for i, line in enumerate(lines) if "Load from checkpoint" in line)
    paths.train_log.write_text("".join(lines[:split]))
    (tmp_path / "run" / "train_resume.log").write_text("".join(lines[:8]) + "".join(lines[split:]))
    run = only(tmp_path / "run")
    score = run.metrics.filter(pl.col("key") == "critic/score/mean")
    assert score["step"].is_duplicated().sum() == 0 and score.filter(pl.col("step") == 40)["value"].item() > 0
    assert [(i.kind, i.recovered) for i in run.incidents] == [("reward_collapse", True)]
    assert "in an attempt the run abandoned at step 45" in run.incidents[0].summary


def test_a_restart_in_a_console_without_times_is_replayed_in_log_order(tmp_path: Path) -> None:
    """No Ray session, so no step times: the replay feeds the copies as the log has them (by step,
    the two attempts' copies alternated and no alarm fired); the restart's own collapse is a second."""
    from verl_builder import healthy_score

    _restarted(tmp_path / "run", file_logger=False, score=lambda s: 0.0 if s >= 33 else healthy_score(s))
    result = runner.invoke(app, ["watch", "--replay", str(tmp_path / "run"), "--json"])
    alarms = [(a["kind"], a["onset_step"]) for a in json.loads(result.stdout)["alarms"]]
    assert alarms == [("reward_collapse", 32), ("reward_collapse", 33)]


def test_steps_a_copy_holds_whole_are_not_unfinished(tmp_path: Path) -> None:
    """The console was copied at step 40; the file logger's JSONL goes on to 60, dead batches from 45."""
    from verl_builder import VerlRunSpec, write_verl_run

    paths = write_verl_run(tmp_path / "run", VerlRunSpec(steps=60, save_freq=10, test_freq=0))
    records = [json.loads(line) for line in paths.jsonl.read_text().splitlines()]
    for record in records:
        if record["step"] >= 45:
            record["data"].update({"actor/pg_loss": 0.0, "actor/grad_norm": 0.0, "critic/advantages/mean": 0.0,
                                   "critic/score/mean": float(record["step"] % 2), "critic/rewards/mean": float(record["step"] % 2)})
    paths.jsonl.write_text("".join(json.dumps(r) + "\n" for r in records))
    lines = paths.train_log.read_text().splitlines(keepends=True)
    paths.train_log.write_text("".join(lines[: next(i for i, line in enumerate(lines) if "step:41 - " in line)]))
    [dead] = [i for i in only(tmp_path / "run").incidents if i.kind == "zero_variance"]
    assert dead.onset_step == 45 and "unfinished" not in dead.summary


def test_a_workers_traceback_with_no_time_is_cited_not_denied(tmp_path: Path) -> None:
    """Seed 004's checklist: the reward worker's traceback sits in its ``.err`` in the Ray session,
    with no time (Ray writes none there), so in no step. The zero score's verdict cites it and says
    when is unknown — never "no failure of any kind was logged"."""
    from verl_builder import VerlRunSpec, write_verl_run

    paths = write_verl_run(tmp_path / "run", VerlRunSpec(steps=40, save_freq=20, score=lambda s: 0.0, ray_session=True))
    err = sorted((paths.session / "logs").glob("worker-*-01000000-*.err"))[0]
    with err.open("a") as handle:
        handle.write("Traceback (most recent call last):\n  File \"reward.py\", line 12, in __call__\n"
                     "TypeError: compute_score() got an unexpected keyword argument 'format_score'\n")
    [incident] = analyze(tmp_path / "run").runs[0].incidents
    assert incident.cause == "reward_pipeline" and "No failure of any kind" not in incident.summary
    assert "1 error with no time of its own was (traceback; first: TypeError: compute_score()" in incident.summary
    assert [(Path(e.file).name, e.kind) for e in incident.evidence][:1] == [(err.name, "traceback")]


def test_a_copy_holds_the_abandoned_attempts_steps_past_a_relaunch_not_the_runs(tmp_path: Path) -> None:
    """verl's console logs steps 1–60 (the score 0 from step 30), then steps 5 and 6 again (a
    relaunch appended to it went back); its JSONL copy, not told, holds 1–60. The run is steps
    1–6; the copy's 7–60 are the abandoned attempt's: one collapse, in that attempt — not also an
    unrecovered one of the run's past its last step."""
    from verl_builder import VerlRunSpec, write_verl_run

    paths = write_verl_run(tmp_path / "run", VerlRunSpec(steps=60, save_freq=10, score=lambda s: 0.0 if s >= 30 else 0.5 + 0.001 * s))
    lines = paths.train_log.read_text().splitlines(keepends=True)
    paths.train_log.write_text("".join(lines) + "".join(line for line in lines if "step:5 " in line or "step:6 " in line))
    [run] = analyze(tmp_path / "run").runs
    assert run.step_range()["last"] == 6
    assert [(i.onset_step, i.recovered, i.redone) for i in run.incidents] == [(30, True, True)]
    assert run.metrics.filter(pl.col("step") > 6).is_empty()
    assert "6 an attempt a relaunch abandoned saved" in run.recommendation.reason


def test_saves_passed_over_are_said_whatever_they_lack(tmp_path: Path) -> None:
    """The tracker names global_step_45, which is gone (verl's resume_mode=auto would train from
    scratch); global_step_20 holds only critic/; global_step_15 lacks the extra state every other
    save has. Each is passed over and said, not dropped unseen."""
    from verl_builder import VerlRunSpec, write_verl_run

    paths = write_verl_run(tmp_path / "run", VerlRunSpec(steps=40, save_freq=5, score=lambda s: 0.0 if s >= 23 else 0.5))
    (paths.ckpt_root / "latest_checkpointed_iteration.txt").write_text("45")
    (paths.ckpt_root / "global_step_20" / "actor").rename(paths.ckpt_root / "global_step_20" / "critic")
    for extra in (paths.ckpt_root / "global_step_15" / "actor").glob("extra_state_*"):
        extra.unlink()
    rec = only(tmp_path / "run").recommendation
    assert rec.step == 10
    said = "\n".join(rec.warnings)
    assert "global_step_45: latest_checkpointed_iteration.txt names global_step_45, which is missing: trainer.resume_mode=auto" in said
    assert "global_step_20: actor/ missing" in said
    assert "global_step_15: actor/no scheduler/RNG state (extra_state_world_size_*), which other saves of this run have" in said


def test_a_save_killed_mid_write_is_not_chosen_though_it_is_the_only_one_left(tmp_path: Path) -> None:
    """``max_actor_ckpt_to_keep=1``: verl removed global_step_30 before writing global_step_40, and
    the job was killed while each rank wrote its model shard (``torch.save``'s zip, cut before its
    end record); the tracker still names 30. With no other save to compare against, the torn shards
    alone tell that global_step_40 never finished: no checkpoint is chosen, and both are said."""
    import os
    import shutil

    from verl_builder import VerlRunSpec, torch_save, write_verl_run

    paths = write_verl_run(tmp_path / "run", VerlRunSpec(steps=39, save_freq=10))
    for step in (10, 20, 30):
        shutil.rmtree(paths.ckpt_root / f"global_step_{step}")
    actor = paths.ckpt_root / "global_step_40" / "actor"
    actor.mkdir(parents=True)
    for rank in range(2):
        shard = actor / f"model_world_size_2_rank_{rank}.pt"
        torch_save(shard, os.urandom(8192))
        shard.write_bytes(shard.read_bytes()[:4096])
    rec = only(tmp_path / "run").recommendation
    assert rec.checkpoint is None
    said = "\n".join(rec.warnings)
    assert "global_step_30: latest_checkpointed_iteration.txt names global_step_30, which is missing" in said
    assert ("global_step_40: actor/model_world_size_2_rank_0.pt is cut short (4.1 kB: a torch.save archive with no end "
            "record, its write did not finish)") in said
    assert "save_contents" not in said  # (a save cut short: not what the config left out)


def test_a_ray_session_given_as_the_path_is_read_as_its_logs_folder_is(tmp_path: Path) -> None:
    """``analyze /tmp/ray/session_latest``: the session's TaskRunner output holds the steps, as when
    its ``logs/`` is given — not a session with no step and no incident."""
    import glob

    nccl_hang_run(tmp_path / "run")
    [session] = map(Path, glob.glob(str(tmp_path / "run" / "**" / "session_2*"), recursive=True))
    told = [[(i.kind, i.onset_step, i.cause) for i in only(path).incidents] for path in (session, session / "logs")]
    assert told[0] == told[1] == [("crash", 8, "nccl_timeout")]


def test_checkpoints_in_rays_copy_of_the_working_folder_are_found(tmp_path: Path) -> None:
    """``ray job submit --working-dir .`` with a relative ``default_local_dir``: verl saves into
    Ray's copy of the working folder, inside the session. Found there; and where they are found
    nowhere, the logs' own save lines say they exist: best-checkpoint exits 2, not 4 ("none saved")."""
    import shutil

    paths = nccl_hang_run(tmp_path / "run")
    copy = paths.session / "runtime_resources" / "working_dir_files" / "_ray_pkg_0123456789abcdef"
    copy.mkdir(parents=True)
    shutil.move(paths.root / "checkpoints", copy / "checkpoints")
    rec = only(tmp_path / "run").recommendation
    assert rec.checkpoint is not None and rec.checkpoint.startswith(str(copy)) and rec.checkpoint.endswith("global_step_4")

    shutil.rmtree(copy / "checkpoints")
    rec = only(tmp_path / "run").recommendation
    assert rec.checkpoint is None and rec.unlisted
    assert any(w.startswith("checkpoints not found: the logs say") for w in rec.warnings)
    result = runner.invoke(app, ["best-checkpoint", str(tmp_path / "run"), "--no-cache"])
    assert result.exit_code == 2, result.output


def test_a_crash_in_an_attempt_a_relaunch_abandoned_is_passed_over_with_no_times(tmp_path: Path) -> None:
    """Attempt one OOM-killed during step 7; a relaunch from global_step_4, appended to the same
    console, healthy to step 16. A verl console has no times, so the relaunch was not seen by time:
    the crash was the run's, and best-checkpoint went back to global_step_4 (a collapse in such an
    attempt was passed over already)."""
    import shutil

    from verl_builder import VerlRunSpec, write_verl_run

    first = write_verl_run(tmp_path / "a", VerlRunSpec(steps=16, save_freq=4, failure="oom_kill", fail_at=7))
    again = write_verl_run(tmp_path / "b", VerlRunSpec(steps=16, save_freq=4, restart=(6, 4), seed=1))
    lines = again.train_log.read_text().split("\n")
    resume = next(i for i, line in enumerate(lines) if "Load from checkpoint" in line)
    relaunch = [line for line in lines[:resume] if "step:" not in line and "local_global_step_folder" not in line] + lines[resume:]
    run = tmp_path / "run"
    run.mkdir()
    (run / "train.log").write_text((first.train_log.read_text() + "\n".join(relaunch)).replace(str(tmp_path / "b"), str(run))
                                   .replace(str(tmp_path / "a"), str(run)))
    shutil.copytree(tmp_path / "b" / "checkpoints", run / "checkpoints")
    [analysis] = analyze([run / "train.log"]).runs
    assert [(i.kind, i.onset_step, i.redone) for i in analysis.incidents] == [("crash", 7, True)]
    assert "in an attempt the run abandoned: a relaunch from step 4 took the run on from step 5" in analysis.incidents[0].summary
    assert analysis.recommendation.step == 16


def test_a_ray_session_given_alone_finds_the_checkpoints_its_console_names(tmp_path: Path) -> None:
    """The TaskRunner's output in the session is verl's console; it prints ``default_local_dir`` as
    an absolute path, where the run saved global_step_4: best-checkpoint exited 2 ("checkpoints not
    found … find them where the run's working folder was")."""
    paths = nccl_hang_run(tmp_path / "run")
    done = runner.invoke(app, ["best-checkpoint", str(paths.session), "--no-cache"])
    assert (done.exit_code, done.stdout.strip()) == (0, str(paths.ckpt_root / "global_step_4"))


def test_a_dead_attempts_ray_records_stay_in_the_step_it_died_in_beside_the_relaunchs(tmp_path: Path) -> None:
    """Attempt one OOM-killed during step 7 (its Ray session's records timed then), a relaunch with a
    Ray of its own from global_step_4, healthy to 16, both sessions beside the appended console. By
    the step times estimated from each session's start, the dead attempt's records fell in the
    relaunch's first step: a second, phantom crash at step 5 (the console alone: one, at 7)."""
    import shutil
    from datetime import timedelta

    from verl_builder import VerlRunSpec, write_verl_run

    first = write_verl_run(tmp_path / "a", VerlRunSpec(steps=16, save_freq=4, ray_session=True, failure="oom_kill", fail_at=7))
    start = VerlRunSpec().start + timedelta(seconds=10 + 7 * 60 + 120)
    again = write_verl_run(tmp_path / "b", VerlRunSpec(steps=16, save_freq=4, restart=(6, 4), ray_session=True, start=start,
                                                       pid=41000, seed=1))
    lines = again.train_log.read_text().split("\n")
    resume = next(i for i, line in enumerate(lines) if "Load from checkpoint" in line)
    relaunch = [line for line in lines[:resume] if "step:" not in line and "local_global_step_folder" not in line] + lines[resume:]
    run = tmp_path / "run"
    run.mkdir()
    (run / "train.log").write_text(first.train_log.read_text() + "\n".join(relaunch))
    shutil.copytree(tmp_path / "b" / "checkpoints", run / "checkpoints")
    for session in (first.session, again.session):
        shutil.copytree(session, run / "ray_tmp" / session.name)
    [analysis] = analyze([run]).runs
    assert [(i.kind, i.onset_step, i.redone) for i in analysis.incidents] == [("crash", 7, True)]
    kills = analysis.events.filter(pl.col("kind") == "host_oom_kill")
    assert kills.height > 1 and kills["step"].to_list() == [7] * kills.height
    assert analysis.recommendation.step == 16


def test_the_rollout_servers_oom_in_a_verl_console_is_the_servers_not_a_folders_name(tmp_path: Path) -> None:
    """verl's SGLang rollout server (its Ray actor's lines in the console) ran out of memory in its
    scheduler and its parent saw the child die; the score went to zero. The OOM was a training
    worker's (`training_worker_crash`, "a training worker died") and the sigquit no event. The same
    OOM in a training worker's lines, in a run kept under a folder named for SGLang, is the worker's
    (a file's whole path was read for a server's name)."""
    import random

    rng = random.Random(6)
    runner_ = "\x1b[36m(TaskRunner pid=222265)\x1b[0m "
    server = "\x1b[36m(SGLangHttpServer pid=250977, ip=10.0.0.3)\x1b[0m "
    out = []
    for s in range(1, 61):
        score = 0.0 if s >= 40 else 0.5 + 0.2 * rng.random()
        out.append(runner_ + f"step:{s} - actor/pg_loss:{rng.uniform(-.1, .1)!r} - actor/grad_norm:{rng.random()!r} - "
                             f"critic/score/mean:{score!r} - timing_s/step:{60 + rng.random()!r}")
        if s == 39:
            out += [server + "[2025-11-28 16:00:45 TP0] Scheduler hit an exception: Traceback (most recent call last):",
                    server + '  File "/usr/local/lib/python3.12/site-packages/sglang/srt/managers/scheduler.py", line 2912, in run_scheduler_process',
                    server + "    scheduler.event_loop_overlap()",
                    server + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which 1.00 GiB is free.",
                    server + "[2025-11-28 16:00:45] Received sigquit from a child process. It usually means the child failed."]
    (tmp_path / "train.log").write_text("\n".join(out) + "\n")
    [run] = analyze([tmp_path / "train.log"]).runs
    assert [(i.kind, i.onset_step, i.cause) for i in run.incidents] == [("reward_collapse", 40, "inference_server_oom")]
    assert "child_crash" in run.events["kind"].cast(pl.String).to_list()
    worker = "\x1b[36m(WorkerDict pid=97397, ip=10.0.0.3)\x1b[0m "
    mine = [line for line in out if not line.startswith(server)]
    at = next(i for i, line in enumerate(mine) if line.startswith(runner_ + "step:39 "))
    mine.insert(at + 1, worker + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.")
    (tmp_path / "sglang-exps").mkdir()
    (tmp_path / "sglang-exps" / "train.log").write_text("\n".join(mine) + "\n")
    [run] = analyze([tmp_path / "sglang-exps" / "train.log"]).runs
    assert [(i.kind, i.onset_step, i.cause) for i in run.incidents] == [("reward_collapse", 40, "training_worker_crash")]


def test_refused_connections_in_a_verl_console_are_the_servers_failure(tmp_path: Path) -> None:
    """The agent loop's rollout server (or a remote reward judge) died at step 35: vLLM's engine
    said so, and every step after logs refused connections in the contract's words. Those are
    events, and the cause is the server's crash, not "no failure was logged"."""
    import random

    rng = random.Random(7)
    runner_ = "\x1b[36m(TaskRunner pid=32604)\x1b[0m "
    loop = "\x1b[36m(AgentLoopWorker pid=4101)\x1b[0m "
    out = []
    for s in range(1, 61):
        if s == 35:
            out.append("\x1b[36m(vLLMHttpServer pid=3999)\x1b[0m ERROR 11-22 03:45:10 [core_client.py:564] "
                       "Engine core proc EngineCore_0 died unexpectedly, shutting down client.")
        if s >= 35:
            out += [loop + "aiohttp.client_exceptions.ClientConnectorError: Cannot connect to host 10.0.0.2:41235 ssl:default "
                           "[Connect call failed ('10.0.0.2', 41235)] [repeated 63x across cluster]",
                    runner_ + "WARNING:verl.utils.reward_score:reward request failed: HTTPConnectionPool(host='10.0.0.2', port=8080): "
                              "Max retries exceeded with url: /score (Caused by NewConnectionError('<urllib3.connection.HTTPConnection "
                              "object at 0x7f2c>: Failed to establish a new connection: [Errno 111] Connection refused'))"]
        score = 0.0 if s >= 35 else 0.5 + 0.2 * rng.random()
        out.append(runner_ + f"step:{s} - actor/pg_loss:{rng.uniform(-.1, .1)!r} - critic/score/mean:{score!r} - "
                             f"timing_s/step:{60 + rng.random()!r}")
    (tmp_path / "train.log").write_text("\n".join(out) + "\n")
    [run] = analyze([tmp_path / "train.log"]).runs
    assert [(i.kind, i.onset_step, i.cause) for i in run.incidents] == [("reward_collapse", 35, "inference_server_crash")]
    kinds = run.events["kind"].cast(pl.String).value_counts().rows()
    assert ("connection_refused", 2 * 26) in kinds and ("server_exit", 1) in kinds
    [evidence] = [e for e in run.incidents[0].evidence if e.kind == "server_exit"][:1]
    assert read_line(tmp_path / "train.log", evidence.line).endswith("died unexpectedly, shutting down client.")


def test_w_and_bs_own_refused_connections_are_no_servers_failure(tmp_path: Path) -> None:
    """The TaskRunner holds W&B's tracker: behind a proxy its uploads are refused (``api.wandb.ai``,
    ``[Errno 111] Connection refused``) as the score goes to zero for a reason of its own. That is
    no refused rollout or reward server: no event, and no server crash for a cause."""
    import random

    rng = random.Random(8)
    runner_ = "\x1b[36m(TaskRunner pid=32604)\x1b[0m "
    out = []
    for s in range(1, 61):
        if s == 35:
            out.append(runner_ + "wandb: Network error (ConnectionError), entering retry loop.")
            out.append(runner_ + "requests.exceptions.ConnectionError: HTTPSConnectionPool(host='api.wandb.ai', port=443): Max retries "
                                 "exceeded with url: /graphql (Caused by NewConnectionError('<urllib3.connection.HTTPSConnection object at "
                                 "0x7f3a>: Failed to establish a new connection: [Errno 111] Connection refused'))")
        score = 0.0 if s >= 35 else 0.5 + 0.2 * rng.random()
        out.append(runner_ + f"step:{s} - actor/pg_loss:{rng.uniform(-.1, .1)!r} - critic/score/mean:{score!r} - "
                             f"timing_s/step:{60 + rng.random()!r}")
    (tmp_path / "train.log").write_text("\n".join(out) + "\n")
    [run] = analyze([tmp_path / "train.log"]).runs
    assert "connection_refused" not in run.events["kind"].cast(pl.String).to_list()
    [incident] = run.incidents
    assert incident.onset_step == 35 and incident.cause != "inference_server_crash"


def test_experiments_side_by_side_in_one_working_folder_each_get_their_own_checkpoints(tmp_path: Path) -> None:
    """Two experiments launched from one folder (a console each, `checkpoints/<project>/<experiment>`
    each): the healthy one was given the other's checkpoint folder (the first found), and its
    recommendation was a save of the experiment that collapsed, taken alone or beside the other."""
    import shutil

    from verl_builder import VerlRunSpec, healthy_score, write_verl_run

    repo = tmp_path / "verl"
    repo.mkdir()
    for name, steps, collapse in (("qwen2_7b_function_rm", 60, 40), ("qwen2_7b_lr_fix", 100, None)):
        spec = VerlRunSpec(steps=steps, save_freq=10, experiment=name, file_logger=False,
                           score=(lambda s, c=collapse: 0.0 if c and s >= c else healthy_score(s)))
        paths = write_verl_run(tmp_path / "tmp" / name, spec)
        (repo / f"{name}.log").write_text(paths.train_log.read_text().replace(str(paths.root / "checkpoints"), "checkpoints"))
        shutil.copytree(paths.root / "checkpoints", repo / "checkpoints", dirs_exist_ok=True)
    shutil.rmtree(tmp_path / "tmp")
    runs = {Path(r.run_id).name: r for r in analyze([repo]).runs}
    chosen = {name: Path(r.recommendation.checkpoint) for name, r in runs.items()}
    assert chosen == {"qwen2_7b_function_rm.log": repo / "checkpoints/verl_grpo_example_gsm8k/qwen2_7b_function_rm/global_step_30",
                      "qwen2_7b_lr_fix.log": repo / "checkpoints/verl_grpo_example_gsm8k/qwen2_7b_lr_fix/global_step_100"}
    [alone] = analyze([repo / "qwen2_7b_lr_fix.log"]).runs
    assert Path(alone.recommendation.checkpoint).parent.name == "qwen2_7b_lr_fix"


def test_another_experiments_tensorboard_folder_is_no_copy_of_this_run(tmp_path: Path) -> None:
    """verl's ``tensorboard_log/<project>/`` holds this experiment's folder and a later one's: the
    run keeps its own (its config names it), and the other's longer healthy series neither extends
    its steps nor shortens its waste; it is a run of its own."""
    import tensorboardX
    from verl_builder import VerlRunSpec, healthy_score, write_verl_run

    spec = VerlRunSpec(steps=60, save_freq=10, score=lambda s: 0.0 if s >= 40 else healthy_score(s))
    paths = write_verl_run(tmp_path / "verl", spec)
    records = [json.loads(line) for line in paths.jsonl.read_text().splitlines()]
    paths.jsonl.unlink()
    boards = tmp_path / "verl" / "tensorboard_log" / spec.project
    own = tensorboardX.SummaryWriter(str(boards / spec.experiment))
    for record in records:
        for key, value in record["data"].items():
            if value is not None:
                own.add_scalar(key, value, record["step"])
    own.close()
    later = tensorboardX.SummaryWriter(str(boards / "qwen2_7b_lr_fix"))
    for step in range(1, 101):
        later.add_scalar("critic/score/mean", healthy_score(step), step)
    later.close()
    runs = {r.run_id: r for r in analyze([tmp_path / "verl"]).runs}
    assert sorted(runs) == ["verl", "verl/qwen2_7b_lr_fix"]
    run = runs["verl"]
    assert run.step_range()["last"] == 60
    assert [(i.kind, i.onset_step) for i in run.incidents] == [("reward_collapse", 40)]
    assert all("qwen2_7b_lr_fix" not in s.path for s in run.sources)


def test_a_tensorboard_copys_checkpoints_are_found_beside_it(tmp_path: Path) -> None:
    """``trainer.logger=['console','tensorboard']``, the console not kept: verl wrote
    ``tensorboard_log/<project>/<experiment>/`` and ``checkpoints/<project>/<experiment>/`` in its
    working folder. The checkpoints are found there (as beside a JSONL copy), not "none was found"."""
    import tensorboardX
    from verl_builder import VerlRunSpec, healthy_score, write_verl_run

    spec = VerlRunSpec(steps=60, save_freq=10, score=lambda s: 0.0 if s >= 35 else healthy_score(s))
    paths = write_verl_run(tmp_path / "verl", spec)
    records = [json.loads(line) for line in paths.jsonl.read_text().splitlines()]
    paths.jsonl.unlink()
    paths.train_log.unlink()
    board = tensorboardX.SummaryWriter(str(tmp_path / "verl" / "tensorboard_log" / spec.project / spec.experiment))
    for record in records:
        for key, value in record["data"].items():
            if value is not None:
                board.add_scalar(key, value, record["step"])
    board.close()
    done = CliRunner().invoke(app, ["best-checkpoint", str(tmp_path / "verl"), "--no-cache"])
    assert done.exit_code == 0 and done.stdout.strip() == str(paths.ckpt_root / "global_step_30"), done.output


def test_a_run_stopped_short_with_a_workers_undated_fatal_error_is_not_called_healthy(tmp_path: Path) -> None:
    """Planned for 60 steps, the console logged 3 and nothing more; a worker's ``.err`` in the Ray
    session ends in a CUDA illegal-memory-access traceback, which no time places in a step. No
    incident can be drawn, but the run is not healthy either: the verdict says so, with the line."""
    from verl_builder import VerlRunSpec, write_verl_run

    paths = write_verl_run(tmp_path / "outputs" / "grpo", VerlRunSpec(steps=3, save_freq=20, ray_session=True))
    paths.train_log.write_text(paths.train_log.read_text().replace("'total_training_steps': 3", "'total_training_steps': 60"))
    [err] = sorted(p for p in (tmp_path / "outputs" / "grpo").rglob("worker-*.err"))[:1]
    with err.open("a") as out:
        out.write('Traceback (most recent call last):\n  File "/verl/verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py", '
                  'line 312, in generate_sequences\n    output = self.inference_engine.generate(prompts=vllm_inputs)\n'
                  "RuntimeError: CUDA error: an illegal memory access was encountered\n")
    run = only(tmp_path / "outputs" / "grpo")
    assert run.incidents == []
    why = run.unjudged()
    assert why is not None and why.startswith("it logged 3 of its 60 planned steps, and 1 worker failure was logged with no time")
    assert f"illegal_memory_access, {err.name}:" in why and run.recommendation.reason.startswith("No incident found, but it logged 3")


def test_saves_a_rotation_deleted_before_the_onset_are_told_with_their_lines(tmp_path: Path) -> None:
    """``max_actor_ckpt_to_keep=2``: the saves of steps 10–60 are gone, 70 and 80 kept; the score
    is 0 from step 50. None on disk precedes the onset, but the console says four were saved
    before it: the reason says so (not that none was saved), and the last one's line is cited."""
    import shutil

    from verl_builder import VerlRunSpec, write_verl_run

    paths = write_verl_run(tmp_path / "exp", VerlRunSpec(steps=80, save_freq=10, score=lambda s: 0.0 if s >= 50 else 0.5 + (s % 3) / 100))
    for step in range(10, 61, 10):
        shutil.rmtree(paths.ckpt_root / f"global_step_{step}")
    result = runner.invoke(app, ["best-checkpoint", str(tmp_path / "exp"), "--json", "--no-cache"])
    assert result.exit_code == 4, result.output
    rec = json.loads(result.stdout)
    assert rec["reason"].startswith("No checkpoint saved before the first incident's onset at step 50 is on disk: the logs say 4 were, "
                                    "the last at step 40")
    [said] = [w for w in rec["warnings"] if "no longer on disk" in w]
    line = int(said.split("train.log:")[1].split(":")[0])
    assert read_line(paths.train_log, line).rstrip().endswith("global_step_40")
