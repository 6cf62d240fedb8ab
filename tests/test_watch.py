"""``watch``: alarms on a run that grows while it is followed, and ``watch --replay`` on every incident."""

from __future__ import annotations

import gzip
import heapq
import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from conftest import tree_state
from typer.testing import CliRunner
from verl_builder import nccl_hang_run, ray_oom_kill_run, zero_score_run

from forensics import analyze
from forensics.cli import app
from forensics.watch import Alarm, Watcher, WatchSettings, replay

FIXTURES = Path(__file__).parent / "fixtures"
SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "samples" / "ray"
SETTINGS = WatchSettings()
runner = CliRunner()


def stopped_days_ago(name: str, tmp_path: Path, into: str | None = None) -> Path:
    """A copy of fixture ``name``'s outputs last written two days ago: a run over, whose silence is
    no stall (a checkout an hour old is a run silent for an hour: stalled, by the rules)."""
    import os
    import shutil

    copy = shutil.copytree(FIXTURES / name / "outputs", tmp_path / (into or name) / "outputs")
    then = time.time() - 2 * 86400
    for folder, _, files in os.walk(copy):
        for file in files:
            os.utime(Path(folder, file), (then, then))
    return copy


def trial_dir(name: str) -> Path:
    [log] = (FIXTURES / name / "outputs" / "logs").glob("*/*/*/trainer.log*")
    return log.parent


# -- replay ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "onset", "kind"),
    [
        ("areal_seed000", 940, "reward_collapse"),
        ("areal_seed001", 188, "server_errors"),
        ("sglang_hang", 250, "reward_collapse"),
        ("sglang_oom", 180, "server_errors"),
        ("sglang_healthy_collapse", 120, "reward_collapse"),
    ],
)
def test_replay_fires_within_the_configured_steps_after_the_offline_onset(name: str, onset: int, kind: str) -> None:
    [result] = replay([FIXTURES / name / "outputs"])
    assert onset in [step for _, step in result.offline_onsets]
    first = result.alarms[0]
    assert first.kind == kind
    assert onset <= first.step <= onset + SETTINGS.zero_steps - 1
    assert first.time is not None and first.evidence and first.evidence[0].line > 0
    assert first.step < result.last_step


def test_one_incident_raises_one_alarm_per_thing_it_tells(tmp_path: Path) -> None:
    """Seed 000: the collapse (the server unresponsive) alarms; its timeouts' server_errors a few
    steps later tell nothing new and are folded; the server's death at 1870 is news (a crash), the
    trainer's silence after it is not."""
    [result] = replay([FIXTURES / "areal_seed000" / "outputs"])
    assert [(a.kind, a.cause) for a in result.alarms] == [("reward_collapse", "inference_server_unresponsive"),
                                                          ("server_down", "inference_server_crash")]
    assert {a.kind for a in result.folded} == {"server_errors", "stall"}


def test_a_sparse_tasks_dead_first_steps_raise_no_alarm(tmp_path: Path) -> None:
    """Nothing earned, nothing to learn from, in steps 1–3, then a healthy run: a warm-up, as
    ``analyze`` has it — not dead batches alarmed at step 2 (which would have stopped the job)."""
    from areal_builder import RunSpec, healthy_reward, write_run

    def dead_until_4(step: int, stats: dict[str, float]) -> None:
        if step <= 3:
            for key in list(stats):
                if key.endswith(("actor_loss/avg", "grad_norm", "advantages/avg", "advantages/min", "advantages/max")):
                    stats[key] = 0.0

    paths = write_run(tmp_path / "outputs", RunSpec(last_step=60, stats_tweak=dead_until_4,
                                                    reward=lambda s: 0.0 if s <= 3 else healthy_reward(s)))
    [result] = replay([paths.fileroot])
    assert result.alarms == [] and result.offline_onsets == []


_STOPPED = ('Traceback (most recent call last):\n  File "/AReaL/examples/math/gsm8k_grpo.py", line 210, in <module>\n'
            "    main(sys.argv[1:])\nKeyboardInterrupt")


def test_a_run_stopped_by_ctrl_c_while_its_server_answers_on_is_no_stall(tmp_path: Path) -> None:
    """The user pressed Ctrl-C after step 60 of a long run; the SGLang server, launched on its own,
    goes on answering its health probes for three hours. Whoever pressed it stopped the run: no
    stall offline, in a replay, nor live once the silence is long."""
    import random

    import build
    from areal_builder import LogLine, RunSpec, healthy_reward, write_run
    from build import COLLAPSE_SERVER, Client, builder_timeline, finish_server_log

    server = COLLAPSE_SERVER
    spec = RunSpec(last_step=60, reward=healthy_reward, seed=12, save_freq_steps=10, server_addr=f"{server.host}:{server.port}",
                   max_concurrent_rollouts=32, mem_fraction_static=server.mem_fraction_static)
    timeline = builder_timeline(spec)
    end = max(timeline.headers.values())
    trainer = Client(server.host, f"{spec.seed}:trainer")
    lines = build._started(spec, server, timeline, trainer) + build._bursts(spec, server, timeline, trainer, random.Random(1))
    lines += [*build._probes(spec, server, timeline, end + timedelta(hours=3)), LogLine(end + timedelta(seconds=70), _STOPPED)]
    paths = write_run(tmp_path / "outputs", replace(spec, extra_lines=tuple(lines)))
    finish_server_log(paths, server, None)
    assert analyze(paths.fileroot).runs[0].incidents == []
    [result] = replay([paths.fileroot])
    assert result.alarms == []
    now = [time.time() + 4 * 3600]
    watcher = Watcher(paths.fileroot, state_dir=tmp_path / "state", clock=lambda: now[0])
    assert watcher.poll() + watcher.poll() == []


def test_a_finished_runs_teardown_raises_no_alarm(tmp_path: Path) -> None:
    """The run logged every step it was launched for (60 of 60) and said ``Training completes!``;
    the launcher then stopped the server under clients still calling it. ``analyze`` finds no
    incident (teardown), and neither the refusals nor the server's exit are an alarm."""
    from areal_builder import Outage, RunSpec, write_run

    spec = RunSpec(last_step=60, steps_per_epoch=30, total_epochs=2, save_freq_steps=10, step_seconds=(60.0, 60.0), finished=True)
    end = write_run(tmp_path / "first", spec).step_times[60]
    teardown = Outage(start=end + timedelta(seconds=40), end=end + timedelta(minutes=30), kind="refused", server_exit=True)
    paths = write_run(tmp_path / "outputs", replace(spec, outages=[teardown]))
    assert analyze(paths.fileroot).runs[0].incidents == []
    [result] = replay([paths.fileroot])
    assert result.alarms == []


def test_replay_of_a_nan_loss_names_the_divergence_as_analyze_does(tmp_path: Path) -> None:
    """The loss and gradient norm go NaN from step 60, the reward stays alive: the alarm's cause is
    the numbers' divergence, as ``analyze`` says, never a reward pipeline that did not go constant."""
    import math

    from areal_builder import RunSpec, write_run

    from forensics import analyze

    def nan_from_60(step: int, stats: dict[str, float]) -> None:
        if step >= 60:
            stats["grpo_actor/actor_loss/avg"] = stats["grpo_actor/grad_norm"] = math.nan

    paths = write_run(tmp_path / "outputs", RunSpec(last_step=80, stats_tweak=nan_from_60))
    [incident] = [i for i in analyze(paths.fileroot).runs[0].incidents if i.kind == "nan_inf"]
    [result] = replay([paths.fileroot])
    [alarm] = [a for a in result.alarms if a.kind == "nan_inf"]
    assert (alarm.cause, incident.cause) == ("numerical_divergence", "numerical_divergence")


def test_a_live_loss_gone_dead_while_rewards_vary_alarms_as_analyze_finds_it(tmp_path: Path) -> None:
    """Seed 003's second cause, online: the rewards still differ, the loss is exactly 0 from iteration
    10 (log-probs zeroed). ``analyze`` finds a dead loss there; the alarm names the same onset and
    cause after ``min_run`` steps. A surrogate printing 0 from the first step is not one."""
    from test_custom_runs import _loop_log

    _loop_log(tmp_path / "broken", dead_from=10)
    [incident] = analyze([tmp_path / "broken"]).runs[0].incidents
    [result] = replay([tmp_path / "broken"])
    assert [(a.kind, a.onset_step, a.step, a.cause) for a in result.alarms] == [("dead_loss", 10, 14, "loss_computation")]
    assert (incident.kind, incident.onset_step, incident.cause) == ("dead_loss", 10, "loss_computation")
    _loop_log(tmp_path / "surrogate", dead_from=0, warn=False)
    assert replay([tmp_path / "surrogate"])[0].alarms == []


def test_another_server_coming_up_does_not_revive_the_dead_one(tmp_path: Path) -> None:
    """Two servers: :30000 is killed in step 41 and called in vain to the end; its peer :30001 exits
    and is relaunched on its own address minutes later. The peer's launch is not the dead server
    back: replay tells the server down (offline: ``server_down`` at 41), in one alarm or folded."""
    from datetime import timedelta

    from areal_builder import LogLine, Outage, RunSpec, schedule, write_run

    spec = RunSpec(last_step=90)
    at = {t.step: t.time for t in schedule(spec)}
    down = Outage(start=at[40] + timedelta(seconds=20), end=at[90], kind="refused", server_exit=True)
    wrapper = "SGLangServer Wrapper"
    peer = (LogLine(at[1] - timedelta(minutes=3), "SGLang server launched at: http://172.17.0.2:30001", wrapper, file="llm_server"),
            LogLine(at[41] + timedelta(seconds=30), "SGLang server http://172.17.0.2:30001 exits, returncode=-9", wrapper, file="llm_server"),
            LogLine(at[44], "SGLang server launched at: http://172.17.0.2:30001", wrapper, file="llm_server"))
    paths = write_run(tmp_path / "outputs", RunSpec(**{**spec.__dict__, "outages": (down,), "extra_lines": peer}))
    assert [(i.kind, i.onset_step) for i in analyze(paths.fileroot).runs[0].incidents] == [("server_down", 41)]
    [result] = replay([paths.fileroot])
    told = [a.kind for a in (*result.alarms, *result.folded)]
    assert "server_down" in told and [a.kind for a in result.alarms].count("server_errors") <= 1, told


def test_one_stuck_requests_retries_are_no_burst_of_timeouts(tmp_path: Path) -> None:
    """A healthy run where one request hangs once: its three attempts time out 10 min apart, then its
    workflow fails. One request, not three: no ``server_errors`` alarm (a ``--on-alarm scancel``
    would kill a healthy job); offline finds no incident either. Three requests stuck at once still alarm."""
    from dataclasses import replace
    from datetime import timedelta

    from areal_builder import Outage, RunSpec, healthy_reward, schedule, write_run

    base = RunSpec(last_step=120, reward=healthy_reward, request_timeout=600, request_retries=3, finished=True)
    at = {t.step: t.time for t in schedule(base)}
    for requests, alarmed in ((1, False), (3, True)):
        one = Outage(start=at[60], end=at[60] + timedelta(seconds=1300), kind="timeout",
                     burst_every=(5000.0, 6000.0), requests_per_burst=(requests, requests))
        paths = write_run(tmp_path / f"r{requests}" / "outputs", replace(base, outages=(one,)))
        timeouts = analyze(paths.fileroot).runs[0].events.filter(pl.col("kind") == "request_timeout")
        assert timeouts.height == 3 * requests
        [result] = replay([paths.fileroot])
        assert ("server_errors" in [a.kind for a in result.alarms]) is alarmed, (requests, result.alarms)


def test_replay_of_seed001_names_the_server_crash_and_the_collapse() -> None:
    [result] = replay([FIXTURES / "areal_seed001" / "outputs"])
    # One incident (the reward never recovered): the server's errors, then the collapse they caused;
    # the server's deaths at each relaunch tell no new cause, and are folded into it.
    assert [a.kind for a in result.alarms] == ["server_errors", "reward_collapse"]
    by_kind = {a.kind: a for a in reversed(result.alarms + result.folded)}
    collapse = by_kind["reward_collapse"]
    assert (collapse.onset_step, collapse.step, collapse.cause) == (188, 192, "inference_server_crash")
    assert by_kind["server_down"].evidence[0].kind == "server_exit" and by_kind["server_down"].cause == collapse.cause


def test_a_copy_alone_replayed_names_no_cause_it_cannot_see(tmp_path: Path) -> None:
    """verl's file-logger JSONL alone, the score 0 from step 15: no text log could show a failure,
    so the cause is unknown, as offline; the replay said reward_pipeline ("no failure was logged")."""
    from verl_builder import VerlRunSpec, healthy_score, write_verl_run

    paths = write_verl_run(tmp_path / "run", VerlRunSpec(steps=25, save_freq=5, score=lambda s: 0.0 if s >= 15 else healthy_score(s)))
    [run] = analyze([paths.jsonl]).runs
    [result] = replay([paths.jsonl])
    assert [(i.kind, i.onset_step, i.cause) for i in run.incidents] == [("reward_collapse", 15, "unknown")]
    assert [(a.kind, a.onset_step, a.cause) for a in result.alarms] == [("reward_collapse", 15, "unknown")]
    assert "No text log was found" in result.alarms[0].summary


def test_a_worker_death_after_a_verl_run_logged_every_step_raises_no_alarm(tmp_path: Path) -> None:
    """A run that logged every step it was launched for, then Ray told of a worker dying at
    shutdown: analyze calls it teardown, the replay paged a crash at step 13."""
    from verl_builder import VerlRunSpec, write_verl_run

    paths = write_verl_run(tmp_path / "run", VerlRunSpec(steps=12, save_freq=4))
    lines = [line for line in paths.train_log.read_text().split("\n") if line]
    lines.insert(3, "\x1b[36m(TaskRunner pid=32604)\x1b[0m Total training steps: 12")
    lines.append("\x1b[33m(raylet)\x1b[0m A worker died or was killed while executing a task by an unexpected system error. "
                 "Worker exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error code 2.")
    paths.train_log.write_text("\n".join(lines) + "\n")
    [run] = analyze([tmp_path / "run"]).runs
    [result] = replay([tmp_path / "run"])
    assert run.incidents == [] and result.alarms == []
    assert "worker_died" in run.events["kind"].cast(pl.String).to_list()


@pytest.mark.parametrize(
    ("build", "onset", "kind"),
    [(nccl_hang_run, 8, "stall"), (ray_oom_kill_run, 6, "crash"), (zero_score_run, 1, "reward_collapse")],
)
def test_replay_of_verl_runs(tmp_path: Path, build, onset: int, kind: str) -> None:
    build(tmp_path / "run")
    [result] = replay([tmp_path / "run"])
    first = result.alarms[0]
    assert first.kind == kind
    # a score constant since the first step waits out the warm-up
    assert onset <= first.step <= onset + max(SETTINGS.zero_steps, SETTINGS.warmup_steps)
    assert any(a.kind == "crash" for a in result.alarms) == (build is not zero_score_run)
    for alarm in result.alarms:  # named from what was logged by then: no line from after the alarm
        assert all(e.time is None or e.time <= alarm.time for e in alarm.evidence if alarm.kind != "crash"), alarm
    if build is nccl_hang_run:  # a collective hang, as analyze says, not the worker deaths it caused
        stall, crash = result.alarms
        assert (stall.cause, crash.cause) == ("unknown", "nccl_timeout"), (stall.summary, crash.summary)
        assert not [e for e in stall.evidence if e.kind in ("worker_died", "actor_died")]


def test_replay_of_the_hand_rolled_loop_catches_dead_batches_at_the_second_dead_step() -> None:
    [result] = replay([FIXTURES / "seed003"])
    [alarm] = result.alarms
    assert (alarm.kind, alarm.onset_step, alarm.step, alarm.cause) == ("zero_variance", 1, 2, "reward_pipeline")
    # at the run's last logged step: an alarm, but no step it would have saved
    table = runner.invoke(app, ["watch", "--replay", str(FIXTURES / "seed003")]).stdout
    assert "instead of" not in table and "would have come at step 2, its last logged step: no step saved" in table


def test_healthy_sparse_rewards_never_alarm() -> None:
    [result] = replay([FIXTURES / "areal_healthy_sparse" / "outputs"])
    assert result.alarms == []


@pytest.mark.parametrize(("experiment", "trial"), [("grpo[lr=1e-6]", "trial0"), ("grpo[x", "y]")])
def test_a_run_id_with_brackets_is_named_whole_in_alarms(tmp_path: Path, experiment: str, trial: str) -> None:
    """Run ids are folder names, a sweep's hold brackets: the alarm and the replay name the run
    as it is (not ``grpo/trial0`` for every variant, nor ``grpo`` for ``grpo[x/y]``)."""
    from dataclasses import replace
    from datetime import timedelta

    from areal_builder import Outage, RunSpec, healthy_reward, schedule, write_run

    spec = RunSpec(experiment=experiment, trial=trial, last_step=100, reward=lambda s: 0.0 if s >= 80 else healthy_reward(s))
    at = {t.step: t.time for t in schedule(spec)}
    spec = replace(spec, outages=(Outage(start=at[79] + timedelta(seconds=8), end=at[100], kind="refused", server_exit=True),))
    tree = write_run(tmp_path / "outputs", spec).fileroot
    run_id = f"{experiment}/{trial}"
    replayed = runner.invoke(app, ["watch", str(tree), "--replay"], env={"COLUMNS": "200"})
    assert replayed.exit_code == 0 and replayed.stdout.splitlines()[0].startswith(f"{run_id}: offline incidents"), replayed.output
    live = runner.invoke(app, ["watch", str(tree), "--interval", "0.1", "--state-dir", str(tmp_path / "state")], env={"COLUMNS": "200"})
    assert live.exit_code == 0, live.output
    assert next(line for line in live.stdout.splitlines() if "ALARM" in line).startswith(f"ALARM {run_id}  ")


def test_replay_json_is_the_contract_document(tmp_path: Path) -> None:
    before = tree_state(FIXTURES / "areal_seed001")
    result = runner.invoke(app, ["watch", str(FIXTURES / "areal_seed001" / "outputs"), "--replay", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    first = doc["alarms"][0]
    assert (first["step"], first["kind"], first["cause"]) == (188, "server_errors", "inference_server_crash")
    assert first["time"] == "2025-11-12T20:44:32.548"
    assert doc["runs"][0]["last_step"] == 900
    healthy = runner.invoke(app, ["watch", str(FIXTURES / "areal_healthy_sparse" / "outputs"), "--replay", "--json"])
    assert healthy.exit_code == 0 and json.loads(healthy.stdout)["alarms"] == []
    table = runner.invoke(app, ["watch", str(FIXTURES / "areal_seed001" / "outputs"), "--replay"])
    assert "would have stopped" in table.stdout and "at step 188 instead of 900" in table.stdout
    assert tree_state(FIXTURES / "areal_seed001") == before


# -- following a growing run ----------------------------------------------------------------------

_STAMP = re.compile(rb"(\d{8}-\d{2}:\d{2}:\d{2}\.\d{3})")


def _timed_lines(path: Path) -> Iterator[tuple[bytes, int, str, bytes]]:
    """A log's lines keyed by the time they were written (untimed lines inherit the previous one)."""
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    stamp = b""
    for number, line in enumerate(data.splitlines(keepends=True)):
        found = _STAMP.search(line[:40])
        stamp = found.group(1) if found else stamp
        yield stamp, number, path.name.removesuffix(".gz"), line


class Writer(threading.Thread):
    """Writes a fixture's trainer and server logs into ``target`` in the order they were written,
    a few hundred lines at a time; ``rotate_at`` renames trainer.log to trainer.log.1 after that many lines."""

    def __init__(self, source: Path, target: Path, *, stop_after: bytes | None = None, rotate_at: int | None = None,
                 chunk: int = 200, pause: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.pause = pause
        self.source, self.target, self.stop_after, self.rotate_at, self.chunk = source, target, stop_after, rotate_at, chunk
        self.halt = threading.Event()

    def run(self) -> None:
        self.target.mkdir(parents=True, exist_ok=True)
        logs = [_timed_lines(p) for p in sorted(self.source.glob("*.log*"))]
        handles: dict[str, object] = {}
        written = 0
        for stamp, _, name, line in heapq.merge(*logs):
            if self.halt.is_set() or (self.stop_after and stamp > self.stop_after):
                break
            if name not in handles:
                handles[name] = open(self.target / name, "ab")  # noqa: SIM115
            handles[name].write(line)  # type: ignore[attr-defined]
            written += 1
            if self.rotate_at and written == self.rotate_at:
                handles.pop("trainer.log").close()  # type: ignore[attr-defined]
                (self.target / "trainer.log").rename(self.target / "trainer.log.1")
            if written % self.chunk == 0:
                for h in handles.values():
                    h.flush()  # type: ignore[attr-defined]
                time.sleep(self.pause)
        for h in handles.values():
            h.close()  # type: ignore[attr-defined]


def follow_until_alarm(watcher: Watcher, writer: Writer, *, limit: float = 40.0) -> list:
    writer.start()
    alarms: list = []
    polls = 0
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        done = not writer.is_alive()
        alarms += watcher.poll()
        polls += 1
        if alarms or done:
            break
        time.sleep(0.05)
    writer.halt.set()
    writer.join()
    assert polls >= 3, "the run should have been read while it grew"
    return alarms


def test_a_growing_run_alarms_within_the_configured_steps_and_a_restart_does_not_repeat_it(tmp_path: Path) -> None:
    run = tmp_path / "outputs" / "logs" / "root" / "exp" / "trial0"
    state = tmp_path / "state"
    # stop writing a while after the onset: the alarm must come from what was written by then
    writer = Writer(trial_dir("areal_seed001"), run, stop_after=b"20251112-21:05:00.000")
    alarms = follow_until_alarm(Watcher(tmp_path / "outputs", state_dir=state), writer)
    assert alarms, "no alarm while the run collapsed"
    first = alarms[0]
    assert first.kind == "server_errors" and 188 <= first.step <= 188 + SETTINGS.zero_steps
    assert any(e.file.endswith("trainer.log") and e.line > 0 for e in first.evidence)
    assert (state / "cache").is_dir()  # new lines were parsed through the parse cache
    assert (state / "alarms.json").is_file() and not any(p.name == "alarms.json" for p in tmp_path.joinpath("outputs").rglob("*"))

    # a restarted watch with the same state resumes without repeating the alarms raised
    again = Watcher(tmp_path / "outputs", state_dir=state)
    repeated = again.poll()
    assert first.key not in {a.key for a in repeated}
    # the collapse still going on is one alarm, and only once
    assert all(a.kind != "server_errors" or a.onset_step != first.onset_step for a in repeated)
    assert Watcher(tmp_path / "outputs", state_dir=state).poll() == []


def test_two_runs_of_one_config_in_two_folders_are_each_alarmed_with_their_own_report(tmp_path: Path) -> None:
    """One AReaL config launched in two folders (the same experiment and trial names): both collapse
    at step 30. Each raises its alarm, citing its own log, and the frames an alarm's report is
    written from are its own run's."""
    from areal_builder import RunSpec, write_run

    collapse = lambda s: 0.0 if s >= 30 else 0.5 + 0.01 * (s % 5)  # noqa: E731
    for folder, seed in (("lr-1e-6", 0), ("lr-3e-6", 3)):
        write_run(tmp_path / "jobs" / folder / "outputs", RunSpec(last_step=60, save_freq_steps=10, reward=collapse, seed=seed))
    watcher = Watcher(tmp_path / "jobs", state_dir=tmp_path / "state")
    alarms = [a for a in watcher.poll() if a.kind == "reward_collapse"]
    assert sorted(a.onset_step for a in alarms) == [30, 30] and len({a.key for a in alarms}) == 2
    for alarm in alarms:
        [folder] = {Path(e.file).relative_to(tmp_path / "jobs").parts[0] for e in alarm.evidence}
        run = watcher.run(alarm)
        assert run is not None and run.location.root.is_relative_to(tmp_path / "jobs" / folder)


def test_a_run_launched_anew_where_an_earlier_ones_logs_were_deleted_is_alarmed_again(tmp_path: Path) -> None:
    """A run collapsed at step 30 and was alarmed; its logs deleted, the same config launched again
    days later in the same folder collapses at step 30 too: a watch with the same state raises it."""
    import shutil

    from areal_builder import RunSpec, write_run

    collapse = lambda s: 0.0 if s >= 30 else 0.5 + 0.01 * (s % 5)  # noqa: E731
    outputs = tmp_path / "outputs"
    write_run(outputs, RunSpec(last_step=40, reward=collapse, start=datetime(2025, 11, 10, 9, 0)))
    [first] = [a for a in Watcher(outputs, state_dir=tmp_path / "state").poll() if a.kind == "reward_collapse"]
    shutil.rmtree(outputs)
    write_run(outputs, RunSpec(last_step=40, reward=collapse, start=datetime(2025, 11, 14, 9, 0)))
    [again] = [a for a in Watcher(outputs, state_dir=tmp_path / "state").poll() if a.kind == "reward_collapse"]
    assert (again.run_id, again.onset_step) == (first.run_id, first.onset_step) and again.key != first.key


@pytest.mark.parametrize("option", ["--report-dir", "--state-dir"])
def test_a_report_or_state_folder_among_the_runs_checkpoints_is_refused(tmp_path: Path, option: str) -> None:
    """The run watched by its log folder: its checkpoints, read from beside it, are what the user
    will resume from — a report or the watch's state there is refused (exit 2), nothing written."""
    from areal_builder import RunSpec, write_run

    paths = write_run(tmp_path / "outputs", RunSpec(last_step=30, save_freq_steps=10))
    [trial] = (paths.fileroot / "checkpoints").rglob("trial0")
    before = tree_state(trial)
    result = CliRunner().invoke(app, ["watch", str(paths.log_dir), option, str(trial / "alarms"), "--timeout", "1", "--interval", "0.2"])
    assert result.exit_code == 2 and "nothing is written there" in result.stderr, result.output
    assert tree_state(trial) == before


def test_a_healthy_run_followed_to_its_end_never_alarms(tmp_path: Path) -> None:
    writer = Writer(trial_dir("areal_healthy_sparse"), tmp_path / "outputs" / "logs" / "root" / "c" / "trial1", chunk=300, pause=0.03)
    watcher = Watcher(tmp_path / "outputs", state_dir=tmp_path / "state")
    assert follow_until_alarm(watcher, writer) == []
    assert watcher.poll() == []  # the last step, held back while its table might be arriving
    [run] = watcher._runs.values()
    assert run.location.run_id == "c/trial1" and int(run.steps["step"].max()) == 300


def test_rotation_neither_replays_old_lines_nor_loses_the_alarm(tmp_path: Path) -> None:
    run = tmp_path / "outputs" / "logs" / "root" / "exp" / "trial0"
    writer = Writer(trial_dir("sglang_healthy_collapse"), run, rotate_at=6000)
    watcher = Watcher(tmp_path / "outputs", state_dir=tmp_path / "state")
    alarms = follow_until_alarm(watcher, writer)
    assert (run / "trainer.log.1").is_file() and (run / "trainer.log").is_file()
    [first, *_] = alarms
    assert (first.kind, first.onset_step) == ("reward_collapse", 120)
    assert 120 <= first.step <= 120 + SETTINGS.zero_steps
    assert first.cause == "reward_pipeline"


def test_a_watch_started_late_alarms_on_what_is_still_going_on_only(tmp_path: Path) -> None:
    watcher = Watcher(FIXTURES / "areal_seed001" / "outputs", state_dir=tmp_path / "s1")
    alarms = watcher.poll()
    told = alarms + watcher.folded
    by_kind = {a.kind: a for a in told}
    # the reward never recovered from step 188: one alarm, dated at its onset
    assert by_kind["reward_collapse"].onset_step == 188 and by_kind["reward_collapse"] in alarms
    # the server that died at step 188 was relaunched since: only its last death is news (and that
    # of the same incident, with the same cause: folded into its alarm)
    assert len(told) == len(by_kind)
    assert by_kind["server_down"].onset_step == 851
    healthy = Watcher(FIXTURES / "areal_healthy_sparse" / "outputs", state_dir=tmp_path / "s2").poll()
    assert healthy == []


def test_stopping_at_the_first_alarm_hands_over_every_alarm_of_its_poll(tmp_path: Path) -> None:
    # A watch started on seed 000 after the fact raises two at once (the collapse, the dead server).
    # Stopping at the first must not lose the second: the state has both as raised, and a restarted
    # watch would never say it.
    outputs = FIXTURES / "areal_seed000" / "outputs"
    handed: list[Alarm] = []
    watcher = Watcher(outputs, state_dir=tmp_path / "state")
    assert watcher.follow(lambda alarm: handed.append(alarm) and False, interval=0.1, timeout=5) == 2
    assert [a.kind for a in handed] == ["reward_collapse", "server_down"]
    assert Watcher(outputs, state_dir=tmp_path / "state").poll() == []


def test_a_step_line_half_written_for_several_polls_is_not_judged_until_it_is_whole(tmp_path: Path) -> None:
    # ``python … | tee train.log`` writes verl's console in 8 KB blocks: a step's line can stay cut
    # after ``critic/score/mean:0.`` for more than one poll. Read then, a healthy 0.39 is 0.0, and
    # ten such steps made a collapse from step 1.
    from verl_builder import VerlRunSpec, write_verl_run

    spec = VerlRunSpec(steps=20, era="fixed", file_logger=False,
                       score=lambda s: 0.0 if s >= 12 else 0.3 + 0.2 * ((s * 37) % 11) / 11)
    log = write_verl_run(tmp_path / "run", spec).train_log
    lines = log.read_bytes().splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if b"critic/score/mean" in line and b"step:" in line]
    log.write_bytes(b"".join(lines[:starts[0]]))
    watcher = Watcher(tmp_path / "run", state_dir=tmp_path / "state")
    fired = watcher.poll()
    for n, i in enumerate(starts):
        chunk = b"".join(lines[i:starts[n + 1] if n + 1 < len(starts) else len(lines)])
        cut = chunk.index(b"critic/score/mean:") + len(b"critic/score/mean:") + 2
        for part, polls in ((chunk[:cut], 2), (chunk[cut:], 1)):
            with log.open("ab") as out:
                out.write(part)
            for _ in range(polls):
                fired += watcher.poll()
    [replayed] = replay([tmp_path / "run"])
    assert [(a.kind, a.onset_step) for a in fired] == [(a.kind, a.onset_step) for a in replayed.alarms] == [("reward_collapse", 12)]


def test_a_server_log_synced_minutes_late_still_has_its_lines_fed() -> None:
    # A server log copied from its node every few minutes arrives behind the trainer's: its lines
    # are older than the trainer's newest when they come, not old news (nor a rotated copy's).
    from forensics.watch import _Follower
    from parsers.schema import EVENT_SCHEMA

    def events(file: str, minutes: list[int], kind: str) -> pl.DataFrame:
        t0 = datetime(2025, 11, 18, 16, 0)
        rows = [(t0 + timedelta(minutes=m), None, "sglang", kind, "error", file, n + 1, f"{kind} at {m}")
                for n, m in enumerate(minutes)]
        return pl.DataFrame(rows, schema=list(EVENT_SCHEMA), orient="row").cast(EVENT_SCHEMA)

    follower = _Follower("run", WatchSettings())
    assert len(follower._new_events(events("/r/trainer.log", [0, 30, 60], "request_timeout"))) == 3
    late = events("/r/llm_server.log", [0, 1, 2], "server_exit")
    assert [e["line"] for e in follower._new_events(late)] == [1, 2, 3]
    assert follower._new_events(late) == []  # (fed once)
    assert follower._new_events(events("/r/trainer.log.1", [0, 30], "request_timeout")) == []  # a rotated copy's lines


def _written_at(line: bytes, before: datetime) -> datetime:
    """When a line was logged: its AReaL or SGLang stamp, else the line's before it."""
    if found := re.search(rb"(\d{8}-\d{2}:\d{2}:\d{2})", line[:40]):
        return datetime.strptime(found.group(1).decode(), "%Y%m%d-%H:%M:%S")
    if found := re.search(rb"^\[(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})", line):
        return datetime.strptime(found.group(1).decode(), "%Y-%m-%d %H:%M:%S")
    return before


def test_a_restarted_watch_folds_what_the_watch_before_it_would_have(tmp_path: Path) -> None:
    # seed 001: followed to step 260 (the server's errors and the collapse at 188, alarmed), stopped,
    # started again at the run's end. The server dying again at 851 is the same incident, its cause
    # told already: folded, as a watch that never stopped (and --replay) folds it — not paged again.
    source, run = trial_dir("areal_seed001"), tmp_path / "outputs" / "logs" / "root" / "exp" / "trial0"
    run.mkdir(parents=True)
    parts: dict[str, list[tuple[datetime, bytes]]] = {}
    for log in sorted(source.glob("*.log*")):
        data = log.read_bytes()
        when = datetime.min
        for line in (gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data).splitlines(keepends=True):
            when = _written_at(line, when)
            parts.setdefault(log.name.removesuffix(".gz"), []).append((when, line))
    cut = next(when for when, line in parts["trainer.log"] if b"Train step 260/" in line)

    def write(upto: bool) -> None:
        for name, lines in parts.items():
            with (run / name).open("ab") as out:
                out.writelines(line for when, line in lines if (when <= cut) == upto)

    write(True)
    before = Watcher(tmp_path / "outputs", state_dir=tmp_path / "state").poll()
    assert {a.kind for a in before} >= {"reward_collapse"}
    write(False)
    again = Watcher(tmp_path / "outputs", state_dir=tmp_path / "state").poll()
    assert again == [], [(a.kind, a.onset_step) for a in again]


def test_state_dir_inside_the_run_is_refused(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    result = runner.invoke(app, ["watch", str(tmp_path / "run"), "--state-dir", str(tmp_path / "run" / "s")])
    assert result.exit_code == 2 and "inside the watched path" in result.stderr


def test_cli_runs_the_alarm_command_writes_the_report_and_exits_5_when_asked(tmp_path: Path) -> None:
    outputs = stopped_days_ago("sglang_healthy_collapse", tmp_path)
    before = tree_state(outputs)
    command = f'cat > {tmp_path}/alarm.json; echo "$GRPO_FORENSICS_KIND $GRPO_FORENSICS_STEP" > {tmp_path}/env.txt'
    watch = [sys.executable, "-m", "forensics", "watch", str(outputs), "--interval", "0.2", "--timeout", "30"]
    done = subprocess.run(
        [*watch, "--state-dir", str(tmp_path / "state"), "--on-alarm", command, "--report-dir", str(tmp_path / "report"),
         "--wandb-alert", "--fail-on-alarm"],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 5, done.stderr + done.stdout
    # Unasked, an alarm is no error (the contract keeps non-zero codes for bad input and bugs).
    quiet = subprocess.run([*watch, "--state-dir", str(tmp_path / "again")], capture_output=True, text=True, timeout=60)
    assert quiet.returncode == 0 and "reward_collapse" in quiet.stdout, quiet.stderr + quiet.stdout
    alarm = json.loads((tmp_path / "alarm.json").read_text())
    assert (alarm["kind"], alarm["onset_step"], alarm["cause"]) == ("reward_collapse", 120, "reward_pipeline")
    assert (tmp_path / "env.txt").read_text().split() == ["reward_collapse", str(alarm["step"])]
    report = Path(alarm["report"])
    assert report.parent.parent == tmp_path / "report" and report.name == "report.html"
    assert re.fullmatch(r"gsm8k-grpo-rewardbug-trial0\.reward_collapse\.step120\.[0-9a-f]{6}", report.parent.name)
    assert Path(alarm["report"]).is_file()
    assert "no online W&B run folder" in done.stdout + done.stderr
    assert tree_state(outputs) == before
    # the same state: nothing new to say, exit 0 when the timeout ends the watch
    quiet = runner.invoke(app, ["watch", str(outputs), "--interval", "0.1", "--timeout", "0.3",
                                "--state-dir", str(tmp_path / "state")])
    assert quiet.exit_code == 0, quiet.output


def test_an_alarm_whose_report_cannot_be_written_is_still_told_and_acted_on(tmp_path: Path) -> None:
    # --report-dir below a regular file (a typo, a read-only mount, a full disk): the alarm was lost
    # (exit 2, never printed, --on-alarm never run, and recorded as raised). What the command prints
    # stays off the JSON lines on stdout.
    outputs = stopped_days_ago("sglang_healthy_collapse", tmp_path)
    (tmp_path / "file").write_text("")
    done = subprocess.run(
        [sys.executable, "-m", "forensics", "watch", str(outputs), "--interval", "0.2", "--timeout", "30", "--json",
         "--state-dir", str(tmp_path / "state"), "--report-dir", str(tmp_path / "file" / "report"),
         "--on-alarm", f"cat > {tmp_path}/alarm.json; echo hook says hello"],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    [alarm] = [json.loads(line) for line in done.stdout.splitlines()]
    assert (alarm["kind"], alarm["onset_step"], alarm["report"]) == ("reward_collapse", 120, None)
    assert json.loads((tmp_path / "alarm.json").read_text())["kind"] == "reward_collapse"
    assert "--report-dir: no report written" in done.stderr and "hook says hello" in done.stderr


@pytest.mark.parametrize("option", [("--interval", "-1"), ("--interval", "nan"), ("--timeout", "nan"), ("--timeout", "-5"),
                                    ("--zero-steps", "0"), ("--server-down-minutes", "inf")])
def test_watch_numbers_that_mean_nothing_are_bad_input(option: tuple[str, str]) -> None:
    """A negative or NaN poll interval crashed the sleep (exit 70); a NaN timeout never ended."""
    bounded = [] if option[0] == "--timeout" else ["--timeout", "1"]  # (a regression must not follow forever)
    result = runner.invoke(app, ["watch", str(trial_dir("areal_healthy_sparse")), *bounded, *option, "--state-dir", "/tmp/unused-watch-state"])
    assert result.exit_code == 2 and option[0] in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1


def test_logs_that_stop_growing_raise_a_stall_once_the_run_s_own_step_time_is_exceeded(tmp_path: Path) -> None:
    Writer(trial_dir("sglang_healthy_collapse"), tmp_path / "logs", stop_after=b"20251124-11:40:00.000", pause=0).run()
    now = [1000.0]
    watcher = Watcher(tmp_path / "logs", state_dir=tmp_path / "state", clock=lambda: now[0])
    assert watcher.poll() == [] and watcher.poll() == []
    now[0] += 300  # silent for 5 min: within ten minutes, the floor
    assert watcher.poll() == []
    now[0] += 600
    [stall] = watcher.poll()
    assert stall.kind == "stall" and stall.evidence[0].kind == "metric"
    now[0] += 3600
    assert watcher.poll() == []  # one silence, one alarm


def test_a_watch_begun_on_a_silent_run_cites_its_last_steps_line(tmp_path: Path) -> None:
    """The trainer hung after step 60 (steps of 60 s) and has been silent for 15 min when ``watch``
    begins: the stall is after step 60, cited at step 60's header (held back as its table may
    still be arriving), not at step 59's."""
    from areal_builder import RunSpec, write_run

    start = datetime.now() - timedelta(minutes=59 + 15)
    paths = write_run(tmp_path / "outputs", RunSpec(last_step=60, save_freq_steps=10, step_seconds=(60.0, 60.0), start=start))
    header = next(i for i, line in enumerate(paths.trainer_log.read_text().splitlines(), 1) if "Train step 60/" in line)
    [stall] = [a for a in Watcher(tmp_path / "outputs", state_dir=tmp_path / "state").poll() if a.kind == "stall"]
    assert stall.onset_step == 61 and [(e.line, e.text) for e in stall.evidence] == [(header, "step 60 logged")]


def test_a_steps_table_arriving_polls_after_its_header_is_judged_with_it(tmp_path: Path) -> None:
    """A slow disk (or a buffered copy) brings each step's table two polls after its header: the
    step is held until its values are there, never judged without them, and the collapse alarms
    at the step a replay names."""
    from areal_builder import RunSpec, healthy_reward, write_run

    paths = write_run(tmp_path / "src", RunSpec(last_step=30, reward=lambda s: 0.0 if s >= 18 else healthy_reward(s)))
    text = paths.trainer_log.read_bytes()
    headers = [m.start() for m in re.finditer(rb"[^\n]*Train step \d+/", text)]
    live = tmp_path / "live" / paths.log_dir.relative_to(tmp_path / "src")
    live.mkdir(parents=True)
    log = live / "trainer.log"
    log.write_bytes(text[: headers[0]])
    watcher = Watcher(tmp_path / "live", state_dir=tmp_path / "state")
    fired = watcher.poll()
    for n, at in enumerate(headers):
        end = headers[n + 1] if n + 1 < len(headers) else len(text)
        table = text.rindex(b"\n", 0, text.index(b"Stats (1/", at)) + 1  # (the header's line whole)
        for part, polls in ((text[at:table], 2), (text[table:end], 1)):
            with log.open("ab") as out:
                out.write(part)
            for _ in range(polls):
                fired += watcher.poll()
    [replayed] = replay([tmp_path / "src"])
    assert [(a.kind, a.onset_step) for a in fired if a.kind == "reward_collapse"] == [
        (a.kind, a.onset_step) for a in replayed.alarms if a.kind == "reward_collapse"] == [("reward_collapse", 18)]


def test_a_step_held_back_with_later_logs_in_one_poll_is_not_a_stall_before_it(tmp_path: Path) -> None:
    """Step 1869's header and table arrive in one poll with ten minutes of refusals after them: the
    step is held back a poll (its table may still be arriving), but the run was alive at its time —
    the refusals are no silence after step 1868. One stall, after step 1869, as the replay says."""
    source, target = trial_dir("areal_seed000"), tmp_path / "logs"
    cut = b"20251112-05:08:50.000"  # just before step 1869's header
    Writer(source, target, stop_after=cut, pause=0).run()
    now = [1000.0]
    watcher = Watcher(target, state_dir=tmp_path / "state", clock=lambda: now[0])
    alarms = watcher.poll() + watcher.poll()
    handles: dict[str, object] = {}
    for stamp, _, name, line in heapq.merge(*[_timed_lines(p) for p in sorted(source.glob("*.log*"))]):
        if stamp > cut:
            handles.setdefault(name, open(target / name, "ab")).write(line)  # type: ignore[attr-defined]  # noqa: SIM115
    for handle in handles.values():
        handle.close()  # type: ignore[attr-defined]
    for _ in range(3):
        alarms += watcher.poll()
        now[0] += 700
    alarms += watcher.folded  # (the stall tells the server's death again: folded into its alarm)
    stalls = [a for a in alarms if a.kind == "stall"]
    assert [a.onset_step for a in stalls] == [1870], [a.summary for a in stalls]
    assert [a.step for a in alarms if a.kind == "server_down"] == [1870]


_RAISED = (
    b"Traceback (most recent call last):\n"
    b'  File "/AReaL/examples/countdown/train.py", line 210, in <module>\n'
    b"    main(sys.argv[1:])\n"
    b"ValueError: reward function returned None\n"
)


@pytest.mark.parametrize("went_on", [False, True])
def test_a_run_s_own_exception_after_its_newest_step_alarms_once_no_step_follows(tmp_path: Path, went_on: bool) -> None:
    """The trainer raised after step 61 (its traceback borrows step 61's time). Live, no alarm until
    about two of the run's steps passed with no step; then a crash at step 62, as ``analyze`` says.
    A run that logged step 62 after it had caught it: no alarm."""
    [source] = trial_dir("areal_healthy_sparse").glob("trainer.log*")
    lines = gzip.decompress(source.read_bytes()).splitlines(keepends=True)
    header = [i for i, line in enumerate(lines) if b"Train step 62/300 done" in line or b"Train step 63/300 done" in line]
    target = tmp_path / "logs"
    target.mkdir()
    (target / "trainer.log").write_bytes(b"".join(lines[: header[0]]) + _RAISED
                                          + (b"".join(lines[header[0]: header[1]]) if went_on else b""))
    now = [1000.0]
    watcher = Watcher(target, state_dir=tmp_path / "state", clock=lambda: now[0])
    alarms = watcher.poll() + watcher.poll()
    now[0] += 60  # within two median steps (~30 s each) and the two-minute floor
    alarms += watcher.poll()
    assert alarms == []
    now[0] += 120
    alarms += watcher.poll() + watcher.poll()
    if went_on:
        assert alarms == []
        return
    [crash] = alarms
    assert (crash.kind, crash.step, crash.onset_step, crash.cause) == ("crash", 62, 62, "training_worker_crash")
    assert "ValueError: reward function returned None" in crash.summary
    assert crash.evidence[0].kind == "traceback" and crash.evidence[0].file.endswith("trainer.log")
    assert [(i.kind, i.onset_step) for i in analyze([target]).runs[0].incidents] == [("crash", 62)]


@pytest.mark.skipif(not SAMPLES.is_dir(), reason="shared/samples not present")
def test_replay_of_a_run_ended_by_its_own_exception_alarms_where_analyze_puts_the_crash() -> None:
    """Real Ray session: the driver died of a ZeroDivisionError after step 2 of 5."""
    [result] = replay([SAMPLES / "c_task_exception"])
    [alarm] = result.alarms
    assert (alarm.kind, alarm.step, alarm.cause) == ("crash", 3, "training_worker_crash")
    assert result.offline_onsets == [("crash", 3)]
    assert (Path(alarm.evidence[0].file).name, alarm.evidence[0].line) == ("driver.log", 10)


@pytest.mark.skipif(not SAMPLES.is_dir(), reason="shared/samples not present")
def test_replay_of_the_session_alone_names_the_cause_analyze_names() -> None:
    """The same session given alone: its traceback is undated, in the TaskRunner's ``.err``. The
    replay said "Nothing in the logs explains it" (cause unknown) while citing the exception."""
    [session] = sorted((SAMPLES / "c_task_exception").glob("session_*"))
    [result] = replay([session])
    [incident] = analyze([session]).runs[0].incidents
    assert [(a.kind, a.step, a.cause) for a in result.alarms] == [("crash", 3, "training_worker_crash")]
    assert (incident.kind, incident.onset_step, incident.cause) == ("crash", 3, "training_worker_crash")


@pytest.mark.skipif(not SAMPLES.is_dir(), reason="shared/samples not present")
def test_one_death_forwarded_late_to_the_console_is_one_crash_alarm() -> None:
    """Real Ray session: a RolloutWorker segfaults in step 3; the driver's console shows the death
    after step 1 and step 2's line after it (Ray forwards worker output late), then the session's
    own lines tell of the same death in step 3. One crash, one alarm."""
    [result] = replay([SAMPLES / "d_segfault"])
    assert [(a.kind, a.step) for a in result.alarms] == [("crash", 2)]


def test_a_relaunch_that_crashes_again_is_a_second_crash_alarm(tmp_path: Path) -> None:
    """recover.mode auto: the first attempt logs steps 1-80 and dies on an uncaught exception; the
    relaunch from step 50 logs 51-60 and dies the same way. Each death is an alarm (the crash latch
    had waited for a step past 81)."""
    from datetime import timedelta

    from areal_builder import LogLine, Relaunch, RunSpec, schedule, write_run

    traceback = ('Traceback (most recent call last):\n  File "/AReaL/examples/math/gsm8k_grpo.py", line 180, in main\n'
                 "    stats = actor.ppo_update(batch)\nValueError: bad batch")
    base = RunSpec(last_step=80, save_freq_steps=10, recover_mode="auto", recover_freq_steps=50,
                   relaunch=Relaunch(stop_after=80, resume_from=50, pause=200.0))
    first = {t.step: t.time for t in schedule(base) if t.attempt == 0}
    paths = write_run(tmp_path / "outputs", RunSpec(**{**base.__dict__, "extra_lines": (LogLine(first[80] + timedelta(seconds=40), traceback),)}))
    lines = paths.trainer_log.read_text().splitlines(keepends=True)
    h60 = [i for i, line in enumerate(lines) if "Train step 60/" in line][-1]
    end = next(i for i in range(h60 + 1, len(lines)) if lines[i].startswith("\u2558")) + 1
    paths.trainer_log.write_text("".join(lines[:end]) + traceback + "\n")
    [result] = replay([paths.fileroot])
    assert [(a.kind, a.onset_step) for a in result.alarms] == [("crash", 81), ("crash", 61)]
    assert sorted(result.offline_onsets) == [("crash", 61), ("crash", 81)]  # (the first attempt's death is its crash offline too)


def test_replay_exits_5_when_asked_and_an_alarm_would_have_fired() -> None:
    outputs = str(FIXTURES / "sglang_healthy_collapse" / "outputs")
    assert runner.invoke(app, ["watch", outputs, "--replay"]).exit_code == 0
    assert runner.invoke(app, ["watch", outputs, "--replay", "--fail-on-alarm"]).exit_code == 5
    assert runner.invoke(app, ["watch", str(FIXTURES / "areal_healthy_sparse" / "outputs"), "--replay", "--fail-on-alarm"]).exit_code == 0


def test_a_traceback_the_trainer_went_on_from_is_no_crash_alarm(tmp_path: Path) -> None:
    """A caught exception's traceback after step 30, then a 15-minute step while the server times
    requests out: the trainer that printed it is still logging, so no crash alarm, as analyze says."""
    from datetime import datetime, timedelta

    from areal_builder import LogLine, Outage, RunSpec, schedule, write_run

    ticks = schedule(RunSpec(last_step=60))
    t30 = ticks[29].time
    anchors = {1: datetime(2025, 11, 10, 9), 30: t30, 31: t30 + timedelta(minutes=15), 60: ticks[59].time + timedelta(minutes=15)}
    traceback = ('Traceback (most recent call last):\n  File "/AReaL/areal/utils/evaluator.py", line 88, in evaluate\n'
                 "    score = reward_fn(sample)\nValueError: reward function returned None")
    spec = RunSpec(last_step=60, anchors=anchors, request_timeout=120, extra_lines=(LogLine(t30 + timedelta(seconds=10), traceback),),
                   outages=(Outage(start=t30 + timedelta(seconds=30), end=t30 + timedelta(minutes=13), kind="timeout",
                                   burst_every=(60.0, 90.0)),))
    paths = write_run(tmp_path / "outputs", spec)
    [result] = replay([paths.fileroot])
    assert not [a for a in result.alarms if a.kind == "crash"], [a.summary for a in result.alarms]
    assert not [i for i in analyze([paths.fileroot]).runs[0].incidents if i.kind == "crash"]


def test_a_live_alarm_names_the_step_a_replay_names(tmp_path: Path) -> None:
    """The server dies at step 30 and stays dead while the trainer goes on: live, the logs after
    the alarm's time may already be read when the clock reaches it, yet the alarm names the step it
    fell in, as ``--replay`` does, not the newest step read."""
    from datetime import datetime, timedelta

    from areal_builder import Outage, RunSpec, healthy_reward, write_run

    start = datetime(2025, 11, 10, 9)
    spec = RunSpec(experiment="cr30", last_step=60, anchors={1: start, 30: start + timedelta(minutes=33)},
                   reward=lambda s: 0.0 if s >= 30 else healthy_reward(s),
                   outages=(Outage(start=start + timedelta(minutes=32.4), end=start + timedelta(hours=3), kind="refused",
                                   server_exit=True),))
    paths = write_run(tmp_path / "src" / "outputs", spec)
    [replayed] = replay([paths.fileroot])
    want = {a.kind: a.step for a in replayed.alarms + replayed.folded}
    assert "server_down" in want

    writer = Writer(paths.log_dir, tmp_path / "live" / "outputs" / "logs" / "root" / "cr30" / "trial0", chunk=150, pause=0.05)
    watcher = Watcher(tmp_path / "live" / "outputs", state_dir=tmp_path / "state")
    writer.start()
    alarms = []
    while writer.is_alive():
        alarms += watcher.poll()
        time.sleep(0.02)
    alarms += watcher.poll()
    got = {a.kind: a.step for a in alarms + watcher.folded}
    assert got["server_down"] == want["server_down"], (got, want)


def test_a_trial_stopped_long_ago_beside_the_live_one_raises_no_stall(tmp_path: Path) -> None:
    """``watch outputs/`` where last week's trial stopped at step 50 (its files a week old) beside
    today's healthy one written live: no alarm for the old trial's silence (a stall page would
    scancel the healthy job). Written to now, the same silence is a stall, as documented."""
    import os
    from datetime import datetime

    from areal_builder import RunSpec, write_run

    def watch(old_files: bool) -> list[Alarm]:
        root = tmp_path / ("old" if old_files else "fresh")
        old = write_run(root / "outputs", RunSpec(trial="trial0", last_step=50, start=datetime(2025, 11, 3, 9)))
        written = time.time() - (7 * 86400 if old_files else 0)  # (the builder dates them by their lines)
        for path in old.log_dir.iterdir():
            os.utime(path, (written, written))
        src = write_run(root / "src" / "outputs", RunSpec(trial="trial1", last_step=20, start=datetime(2025, 11, 10, 9)))
        live = root / "outputs" / "logs" / "root" / "gsm8k-grpo" / "trial1"
        live.mkdir(parents=True)
        lines = src.trainer_log.read_bytes().splitlines(keepends=True)
        heads = [i for i, line in enumerate(lines) if b"Train step " in line and b" done" in line] + [len(lines)]
        now = [1000.0]
        watcher = Watcher(root / "outputs", state_dir=root / "state", clock=lambda: now[0])
        alarms, done = [], 0
        for end in heads[1:]:  # one step a ~65 s, polled every ~30 s
            with open(live / "trainer.log", "ab") as fh:
                fh.writelines(lines[done:end])
            done = end
            for _ in range(2):
                alarms += watcher.poll()
                now[0] += 32.5
        return alarms

    assert watch(old_files=True) == []
    assert [(a.run_id, a.kind) for a in watch(old_files=False)] == [("gsm8k-grpo/trial0", "stall")]


def test_steps_sharing_a_time_stamp_are_all_fed_live(tmp_path: Path) -> None:
    """A W&B offline run, the only source, growing ~1 KB a poll, whose steps are logged faster than
    its clock's resolution (several steps a stamp): live, every step is fed, as in a replay (those
    sharing the newest stamp seen were dropped: the collapse alarmed late, at another onset)."""
    import os
    import shutil
    import textwrap

    script = textwrap.dedent(f"""
        import random, wandb
        run = wandb.init(mode="offline", dir={str(tmp_path / 'src')!r}, project="p", id="liveRun1")
        rng = random.Random(0)
        for step in range(1, 91):
            r = 0.0 if step >= 60 else 0.3 + 0.3 * rng.random()
            run.log({{"grpo_actor/task_reward/avg": r, "grpo_actor/actor_loss/avg": 0.0 if r == 0 else rng.uniform(-0.02, 0.02),
                     "grpo_actor/grad_norm": 0.0 if r == 0 else rng.uniform(0.2, 0.4)}}, step=step)
        wandb.finish()
    """)
    (tmp_path / "src").mkdir()
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env |= {"HOME": str(home), "WANDB_CONFIG_DIR": str(home / ".config"), "WANDB_CACHE_DIR": str(home / ".cache"),
            "WANDB_DIR": str(tmp_path / "src"), "WANDB_SILENT": "true", "WANDB_MODE": "offline", "WANDB_DISABLE_GIT": "true"}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=180)
    src = next((tmp_path / "src" / "wandb").glob("offline-run-*"))
    live = tmp_path / "live" / "wandb" / src.name
    shutil.copytree(src, live, ignore=shutil.ignore_patterns("*.wandb"))
    data = (src / "run-liveRun1.wandb").read_bytes()
    now = [1000.0]
    watcher = Watcher(tmp_path / "live", state_dir=tmp_path / "state", clock=lambda: now[0])
    alarms = []
    for k in range(0, len(data), 997):  # (records cut mid-write)
        with open(live / "run-liveRun1.wandb", "ab") as fh:
            fh.write(data[k:k + 997])
        alarms += [(a.kind, a.step, a.onset_step) for a in watcher.poll()]
        now[0] += 30
    for _ in range(3):
        alarms += [(a.kind, a.step, a.onset_step) for a in watcher.poll()]
        now[0] += 30
    [run] = analyze([tmp_path / "live"]).runs
    assert run.steps.group_by("time").len()["len"].max() > 1  # (stamps shared, as the case is)
    assert alarms == [(a.kind, a.step, a.onset_step) for r in replay([tmp_path / "live"]) for a in r.alarms]


def test_a_watch_started_again_on_a_silent_run_counts_the_silence_from_its_last_write(tmp_path: Path) -> None:
    """A trainer hung after step 40; the watch restarted (same state dir) half an hour into the
    silence pages the stall at its first poll: the silence began when the log was last written,
    not when this watch first read it (restarted every 9 min, it never paged). A log written just
    now is no silence yet."""
    import os

    from areal_builder import RunSpec, write_run

    src = write_run(tmp_path / "src" / "outputs", RunSpec(last_step=60))
    lines = src.trainer_log.read_bytes().splitlines(keepends=True)
    heads = [i for i, line in enumerate(lines) if b"Train step " in line and b" done" in line]
    live = tmp_path / "outputs" / "logs" / "root" / "gsm8k-grpo" / "trial0"
    live.mkdir(parents=True)
    now = [1000.0]
    watcher = Watcher(tmp_path / "outputs", state_dir=tmp_path / "state", clock=lambda: now[0])
    done = 0
    for end in [*heads[1:41], heads[40]]:  # steps 1–40, then nothing more
        with open(live / "trainer.log", "ab") as fh:
            fh.writelines(lines[done:end])
        done = end
        assert watcher.poll() == []
        now[0] += 65

    def restarted() -> list[Alarm]:
        return Watcher(tmp_path / "outputs", state_dir=tmp_path / "state", clock=lambda: now[0]).poll()

    assert restarted() == []  # (written just now)
    half_an_hour_ago = time.time() - 1800
    os.utime(live / "trainer.log", (half_an_hour_ago, half_an_hour_ago))
    assert [(a.kind, a.step) for a in restarted()] == [("stall", 41)]


def test_a_trainer_clock_set_back_loses_no_step_live_and_pages_no_stall(tmp_path: Path) -> None:
    """The trainer's clock goes back an hour after step 20 (a DST fall-back in a local-time log, an
    NTP step), just as the rewards fall to zero: live, every step is fed in the order it was written,
    the collapse is alarmed at the onset `analyze` finds, as a replay does, and the steps stamped
    earlier than the ones before them are no silence (they were dropped: a stall paged on a moving
    run, the collapse found at another onset)."""
    from areal_builder import RunSpec, write_run

    src = write_run(tmp_path / "src" / "outputs", RunSpec(last_step=40, reward=lambda s: 0.0 if s >= 21 else 0.3 + 0.01 * (s % 7)))
    text = src.trainer_log.read_text()
    cut = text.rfind("\n", 0, text.index("Train step 21/")) + 1

    def an_hour_back(m: re.Match[str]) -> str:
        return f"{datetime.strptime(m.group(0), '%Y%m%d-%H:%M:%S') - timedelta(hours=1):%Y%m%d-%H:%M:%S}"

    lines = (text[:cut] + re.sub(r"\d{8}-\d\d:\d\d:\d\d", an_hour_back, text[cut:])).encode().splitlines(keepends=True)
    heads = [i for i, line in enumerate(lines) if b"Train step " in line and b" done" in line]
    live = tmp_path / "outputs" / "logs" / "root" / "gsm8k-grpo" / "trial0"
    live.mkdir(parents=True)
    now = [1000.0]
    watcher = Watcher(tmp_path / "outputs", state_dir=tmp_path / "state", clock=lambda: now[0])
    alarms, done = [], 0
    for end in [*heads[1:], len(lines), len(lines)]:
        with open(live / "trainer.log", "ab") as fh:
            fh.writelines(lines[done:end])
        done = end
        alarms += [(a.kind, a.step, a.onset_step) for a in watcher.poll()]
        now[0] += 65
    [incident] = analyze([tmp_path / "outputs"]).runs[0].incidents
    assert incident.onset_step == 21
    assert [(kind, onset) for kind, _, onset in alarms] == [("reward_collapse", 21)]
    assert alarms == [(a.kind, a.step, a.onset_step) for r in replay([tmp_path / "outputs"]) for a in r.alarms]


def test_a_slow_alarm_command_holds_up_no_later_alarm_and_is_waited_for_at_the_end(tmp_path: Path) -> None:
    """One run's `--on-alarm` command hangs (a `scancel` on a busy controller): the watch polls on
    and raises another run's alarm when it comes, not once the command is over (it ran the command
    and waited up to 10 min before its next poll); each alarm's report has a folder of its own (a
    later alarm's overwrote the one an earlier alarm handed its command); when the watch ends it
    waits for the commands still running, so a wrapper knows they ran."""
    import shutil

    runs = tmp_path / "runs"
    stopped_days_ago("sglang_healthy_collapse", runs, into="a")
    hook = f'read -r alarm; echo "$GRPO_FORENSICS_RUN_ID $GRPO_FORENSICS_REPORT" >> {tmp_path}/ran.txt; sleep 12'
    watch = subprocess.Popen(
        [sys.executable, "-m", "forensics", "watch", str(runs), "--keep-going", "--json", "--interval", "0.2", "--timeout", "5",
         "--state-dir", str(tmp_path / "state"), "--report-dir", str(tmp_path / "reports"), "--on-alarm", hook],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    first = json.loads(watch.stdout.readline())
    told = time.monotonic()
    stopped_days_ago("sglang_hang", tmp_path / "b", into="b")
    shutil.move(tmp_path / "b" / "b", runs / "b")
    second = json.loads(watch.stdout.readline())
    assert time.monotonic() - told < 9  # (the first command still sleeping)
    assert [first["run_id"], second["run_id"]] == ["gsm8k-grpo-rewardbug/trial0", "gsm8k-grpo-hang/trial0"]
    out, err = watch.communicate(timeout=60)
    assert watch.returncode == 0, err
    assert re.search(r"waiting for \d+ --on-alarm commands? still running", err), err
    alarms = [first, second, *map(json.loads, out.splitlines())]
    ran = sorted((tmp_path / "ran.txt").read_text().splitlines())
    assert ran == sorted(f"{a['run_id']} {a['report']}" for a in alarms)
    assert len({a["report"] for a in alarms}) == len(alarms) and all(Path(a["report"]).is_file() for a in alarms)


def test_a_watch_that_cannot_read_the_runs_log_says_so(tmp_path: Path) -> None:
    """A trainer.log that is a pipe (or one another account's job may not be read by this one): the
    watch guards nothing, and says so once, live and in the replay alike, as ``analyze`` does; a
    folder with no run yet is said once too, not at every poll."""
    import os
    import shutil

    outputs = stopped_days_ago("areal_seed000", tmp_path)
    [packed] = outputs.glob("logs/*/*/*/trainer.log.gz")
    packed.unlink()
    os.mkfifo(packed.with_name("trainer.log"))
    state = ["--state-dir", str(tmp_path / "state")]
    live = runner.invoke(app, ["watch", str(outputs), "--interval", "0.2", "--timeout", "1", *state])
    said = [line for line in live.output.splitlines() if line.startswith("warning: not read: ")]
    assert live.exit_code == 0 and len(said) == 1 and said[0].endswith("trainer.log: a named pipe, not a file: not read "
                                                                          "(reading would take what a writer sends)"), live.output
    replayed = runner.invoke(app, ["watch", "--replay", str(outputs)])
    assert "from what could be read (1 not read, below)" in replayed.output
    assert "warning: not read: " in replayed.output and "trainer.log: a named pipe" in replayed.output
    doc = json.loads(runner.invoke(app, ["watch", "--replay", "--json", str(outputs)]).stdout)
    assert [Path(p.split(": ")[0]).name for p in doc["runs"][0]["not_read"]] == ["trainer.log"]

    empty = tmp_path / "not-yet"
    empty.mkdir()
    waiting = runner.invoke(app, ["watch", str(empty), "--interval", "0.2", "--timeout", "1", *state])
    assert waiting.exit_code == 0
    assert waiting.output.count("no training run found") == 1 and "looking again at each poll" in waiting.output
    shutil.rmtree(empty)


def test_a_poll_of_a_run_nothing_was_written_to_loads_none_of_it_again(tmp_path: Path) -> None:
    """Polled every 30 s, most runs of a fleet are unchanged: their frames are not read back from the
    parse cache again (seconds a poll for a run of gigabytes). Anything the run reads changing is
    read: a checkpoint saved, the config rewritten."""
    import os
    import shutil

    outputs = stopped_days_ago("sglang_hang", tmp_path)
    watcher = Watcher(outputs, state_dir=tmp_path / "state")
    [alarm, *_] = watcher.poll()
    first = watcher.run(alarm)
    assert first is not None and watcher.poll() == [] and watcher.run(alarm) is first

    saves = first.location.checkpoint_dir / "default"
    shutil.copytree(saves / "epoch0epochstep399globalstep399", saves / "epoch0epochstep449globalstep449")
    assert watcher.poll() == []
    again = watcher.run(alarm)
    assert again is not first and 450 in again.checkpoints["step"].to_list()
    assert 450 not in first.checkpoints["step"].to_list()  # (global step 449 is step 450)
    assert watcher.poll() == [] and watcher.run(alarm) is again

    [config] = outputs.rglob("config.yaml")
    config.write_text(config.read_text().replace("request_timeout: 180", "request_timeout: 900"))
    os.utime(config, (time.time() - 86400, time.time() - 86400))
    assert watcher.poll() == []
    assert watcher.run(alarm) is not again and watcher.run(alarm).config["rollout.request_timeout"] == 900


def test_a_checkpoint_removed_from_the_save_folder_a_watched_log_named_is_seen(tmp_path: Path) -> None:
    """A verl console copied off the box names its checkpoints' folder, outside the watched tree:
    a change there is a change of the run, though no file under the tree changed."""
    import shutil

    from verl_builder import VerlRunSpec, healthy_score, write_verl_run

    paths = write_verl_run(tmp_path / "train", VerlRunSpec(steps=40, file_logger=False, score=lambda s: 0.0 if s >= 25 else healthy_score(s)))
    logs = tmp_path / "logs_copy"
    logs.mkdir()
    shutil.copy2(paths.train_log, logs / "train.log")
    watcher = Watcher(logs, state_dir=tmp_path / "state")
    [alarm, *_] = watcher.poll()
    first = watcher.run(alarm)
    saved = first.checkpoints["path"].to_list()
    assert saved and all(str(tmp_path / "train") in path for path in saved)
    assert watcher.poll() == [] and watcher.run(alarm) is first
    shutil.rmtree(saved[-1])
    assert watcher.poll() == []
    gone = watcher.run(alarm).checkpoints.filter(pl.col("path") == saved[-1])
    assert gone["complete"].to_list() == [False]  # (its tracker names it: a row, incomplete)
