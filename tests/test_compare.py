"""``compare``: control vs fix, as a library call and as a command, on the fixture runs."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from areal_builder import RunSpec, healthy_reward, write_run
from typer.testing import CliRunner

from forensics import analyze
from forensics.cli import app
from forensics.compare import compare
from reports import render_compare_html

runner = CliRunner()


@pytest.fixture(scope="module")
def runs():
    here = Path(__file__).parent / "fixtures"
    return {name: analyze([here / name / "outputs"]).runs[0]
            for name in ("areal_seed000", "areal_seed001", "areal_healthy_sparse")}


def test_fix_without_the_incident(runs) -> None:
    avoided = compare(runs["areal_seed001"], runs["areal_healthy_sparse"])  # B went on past A's onset at 188
    assert avoided.avoided is True and avoided.verdict[0] == "B has no reward_collapse; A collapsed at step 188."
    result = compare(runs["areal_seed000"], runs["areal_healthy_sparse"])
    assert result.avoided is None  # B stopped at 300, before A's onset at 940: it cannot show it
    # B stopped at step 300: of each of A's incidents, that it cannot be told whether B has it
    assert result.verdict[:2] == (
        "B was logged only up to step 300, before A collapsed at step 940: whether B has reward_collapse cannot be told.",
        "B was logged only up to step 300, before A stalled at step 1870: whether B has stall cannot be told.")
    assert any("different primary metrics" in line for line in result.verdict)
    a, b = result.stats_a, result.stats_b
    assert (a.first_step, a.last_step, b.last_step) == (1, 1869, 300)
    assert a.median_step_seconds and 30 < a.median_step_seconds < 120
    assert a.steps_per_hour and b.steps_per_hour and b.steps_per_hour > a.steps_per_hour
    assert a.final_metric == 0.0 and b.final_metric is not None
    assert b.peak_device_used_gb is not None


def test_a_fix_that_stopped_between_the_controls_incidents_avoided_only_what_it_reached(tmp_path: Path) -> None:
    # A collapsed at 940 and stalled at 1870; B, healthy, was logged to step 1000: it shows it has no
    # collapse, not that it has no stall.
    fix = write_run(tmp_path / "fix", RunSpec(last_step=1000, reward=healthy_reward, save_freq_steps=250))
    [a] = analyze([Path(__file__).parent / "fixtures" / "areal_seed000" / "outputs"]).runs
    [b] = analyze([fix.fileroot]).runs
    result = compare(a, b)
    assert result.avoided is None
    assert "B has no reward_collapse; A collapsed at step 940." in result.verdict
    assert ("B was logged only up to step 1000, before A stalled at step 1870: whether B has stall cannot be told."
            in result.verdict)
    assert not any(line.startswith("B has no stall") for line in result.verdict)


def test_both_collapsed(runs) -> None:
    result = compare(runs["areal_seed000"], runs["areal_seed001"])
    assert result.avoided is False
    assert result.verdict[0] == "B also has reward_collapse: at step 188, earlier than A (collapsed at step 940)."
    assert "B was logged only up to step 900, before A stalled at step 1870: whether B has stall cannot be told." in result.verdict


def test_control_without_incident(runs) -> None:
    result = compare(runs["areal_healthy_sparse"], runs["areal_seed000"])
    assert result.avoided is None
    assert result.verdict[0] == "A has no incident to avoid."
    # (A, logged up to step 300, cannot say it has no collapse at 940)
    assert ("B has reward_collapse at step 940; A was logged only up to step 300, so whether A has it cannot be told."
            in result.verdict)
    reached = compare(runs["areal_healthy_sparse"], runs["areal_seed001"])  # (A went on past 188: it would have shown one)
    assert "B has reward_collapse at step 188, which A does not." in reached.verdict
    same = compare(runs["areal_healthy_sparse"], runs["areal_healthy_sparse"])
    assert same.verdict == ("Neither run has an incident.",)


def test_compare_document(runs) -> None:
    doc = compare(runs["areal_seed000"], runs["areal_healthy_sparse"]).to_dict()
    assert doc["schema"] == "grpo-forensics/compare/v1" and doc["avoided"] is None
    assert doc["a"]["incidents"][0]["onset_step"] == 940 and doc["b"]["incidents"] == []
    assert set(doc["a"]) >= {"run_id", "steps", "final_metric", "median_step_seconds", "steps_per_hour",
                             "peak_device_used_gb"}
    json.dumps(doc)


def test_compare_page(runs) -> None:
    page = render_compare_html(compare(runs["areal_seed000"], runs["areal_healthy_sparse"]))
    head = page[:page.index('<div class="plot"')]
    assert "B was logged only up to step 300, before A collapsed at step 940: whether B has reward_collapse cannot be told." in head
    assert "Whether B avoided A&#x27;s incident cannot be told." in head
    assert "steps/h" in head and "GB" in head and "median step time" in head
    [block] = re.findall(r'<script type="application/json" data-plot="plot-1">(.*?)</script>', page, re.S)
    names = {tr.get("name") for tr in json.loads(block)["data"]}
    assert {"A: grpo_actor/task_reward/avg", "B: ppo_actor/task_reward/avg"} <= names
    assert not re.search(r"<(script|link|img)\b[^>]*\b(src|href)\s*=", page)


def test_cli_compare(tmp_path: Path) -> None:
    here = Path(__file__).parent / "fixtures"
    out = tmp_path / "cmp"
    result = runner.invoke(app, ["compare", str(here / "areal_seed000" / "outputs"),
                                 str(here / "areal_healthy_sparse" / "outputs"), "--out", str(out), "--json", "-"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["verdict"][0] == "B was logged only up to step 300, before A collapsed at step 940: whether B has reward_collapse cannot be told."
    assert "A (control)" in result.stderr and "whether B has reward_collapse cannot be told" in " ".join(result.stderr.split())
    assert (out / "compare.html").stat().st_size < 5_000_000


def test_cli_compare_needs_exactly_one_run_each(tmp_path: Path) -> None:
    here = Path(__file__).parent / "fixtures"
    both = tmp_path / "both"
    for name in ("areal_seed001", "areal_healthy_sparse"):
        shutil.copytree(here / name / "outputs", both / name)
    result = runner.invoke(app, ["compare", str(both), str(here / "areal_seed000" / "outputs"), "--no-html"])
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "2 runs found" in result.stderr
    missing = runner.invoke(app, ["compare", str(tmp_path / "nope"), str(both), "--no-html"])
    assert missing.exit_code == 2 and "Traceback" not in missing.output


def test_a_fix_whose_reward_could_not_be_judged_avoided_nothing_that_can_be_told(runs, tmp_path: Path) -> None:
    """B is a server log alone (no step, no reward series), or a log that could not be read: not
    seeing A's collapse in it is no avoidance; ``avoided`` is null, and the verdict says of each of
    A's incidents that whether B has it cannot be told, and why (it said "B has no …")."""
    server = next((Path(__file__).parent / "fixtures" / "sglang_oom" / "outputs").rglob("llm_server.log.gz"))
    (tmp_path / "b").mkdir()
    shutil.copy(server, tmp_path / "b" / server.name)
    [b] = analyze([tmp_path / "b"]).runs
    result = compare(runs["areal_seed001"], b)
    assert result.avoided is None
    kinds = {i.kind for i in runs["areal_seed001"].incidents}
    told = [line for line in result.verdict if line.startswith("Whether B has ")]
    assert {line.split()[3] for line in told} == kinds, result.verdict
    assert all("cannot be told (no training step was logged: no metric could be judged); A " in line for line in told)
    assert not any(line.startswith("B has no ") for line in result.verdict), result.verdict


def test_a_control_that_could_not_be_judged_is_not_called_incident_free(runs, tmp_path: Path) -> None:
    """A is a server log alone: that no incident was found in it says nothing; the verdict says
    A could not be judged, not that it had no incident to avoid."""
    server = next((Path(__file__).parent / "fixtures" / "sglang_oom" / "outputs").rglob("llm_server.log.gz"))
    (tmp_path / "a").mkdir()
    shutil.copy(server, tmp_path / "a" / server.name)
    [a] = analyze([tmp_path / "a"]).runs
    result = compare(a, runs["areal_seed000"])
    assert result.avoided is None
    assert result.verdict[0].startswith("A cannot be told healthy: no training step was logged"), result.verdict
    assert "A has no incident to avoid." not in result.verdict


def test_verl_runs_compare_their_device_memory(tmp_path: Path) -> None:
    """verl logs its device memory as ``perf/max_memory_reserved_gb`` each step: the comparison's
    peak is that, not a dash (seed 004's control and fix)."""
    from verl_builder import VerlRunSpec, healthy_score, write_verl_run

    write_verl_run(tmp_path / "control", VerlRunSpec(steps=30, score=lambda s: 0.0))
    write_verl_run(tmp_path / "fix", VerlRunSpec(steps=30, score=healthy_score))
    result = runner.invoke(app, ["compare", str(tmp_path / "control"), str(tmp_path / "fix"), "--no-html", "--json", "-"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    peaks = [doc[side]["peak_device_used_gb"] for side in ("a", "b")]
    assert all(p is not None and 60 <= p <= 70 for p in peaks), peaks


def test_compare_writes_nothing_where_the_runs_are_read_from(tmp_path: Path, monkeypatch) -> None:
    """The control's checkpoint folder (given its trial's log folder, the checkpoints are found
    beside it), the `outputs/` folder its logs and checkpoints share, and a verl checkpoint folder
    its console names on another disk: `compare` wrote its report and JSON into each; `analyze`
    refuses them."""
    from verl_builder import VerlRunSpec, write_verl_run

    control = write_run(tmp_path / "control" / "outputs", RunSpec(last_step=40, save_freq_steps=10))
    write_run(tmp_path / "fix" / "outputs", RunSpec(last_step=40))
    trial = control.trainer_log.parent
    [checkpoints] = [p for p in (tmp_path / "control" / "outputs").iterdir() if p.name != "logs"]
    before = sorted(p for p in (tmp_path / "control").rglob("*"))
    inside = next(checkpoints.rglob("*globalstep*")).parent
    for option in (["--out", str(inside / "rep")], ["--json", str(inside / "cmp.json"), "--no-html"]):
        result = runner.invoke(app, ["compare", str(trial), str(tmp_path / "fix" / "outputs"), *option, "--no-cache"])
        assert result.exit_code == 2 and "nothing is written there" in result.output, result.output
    monkeypatch.chdir(tmp_path / "control" / "outputs")
    result = runner.invoke(app, ["compare", str(trial), str(tmp_path / "fix" / "outputs"), "--no-cache"])
    assert result.exit_code == 0, result.output
    assert sorted(p for p in (tmp_path / "control").rglob("*")) == before

    for name in ("verl_run", "verl_fix"):
        write_verl_run(tmp_path / name, VerlRunSpec(steps=30, save_freq=4))
    shutil.move(tmp_path / "verl_run" / "checkpoints", tmp_path / "disk")
    log = tmp_path / "verl_run" / "train.log"
    log.write_text(log.read_text().replace(str(tmp_path / "verl_run" / "checkpoints"), str(tmp_path / "disk")))
    kept = sorted((tmp_path / "disk").rglob("*"))
    [experiment] = {p.parent for p in (tmp_path / "disk").rglob("global_step_*")}
    result = runner.invoke(app, ["compare", str(tmp_path / "verl_run"), str(tmp_path / "verl_fix"), "--out", str(experiment / "rep"), "--no-cache"])
    assert result.exit_code == 2 and "nothing is written there" in result.output, result.output
    assert sorted((tmp_path / "disk").rglob("*")) == kept


def _collapsed_at_60(s: int) -> float:
    return 0.0 if s >= 60 else healthy_reward(s)


@pytest.mark.parametrize(
    ("spec", "avoided", "says"),
    [
        # B at the same fault, only two steps past A's onset: too few to show a collapse
        (RunSpec(last_step=61, reward=_collapsed_at_60), None,
         "B logged grpo_actor/task_reward/avg at only 2 steps from step 60 on, where A collapsed (3 are needed to show "
         "reward_collapse): whether B has it cannot be told."),
        # B's reward fell by 70 % at A's step: a drop, not a collapse, and no avoidance
        (RunSpec(last_step=120, reward=lambda s: healthy_reward(s) * 0.3 if s >= 60 else healthy_reward(s)), False,
         "B has reward_drop: at step 60, at the same step as A (collapsed at step 60)."),
        (RunSpec(last_step=120), True, "B has no reward_collapse; A collapsed at step 60."),
    ],
)
def test_a_fix_avoided_the_collapse_only_where_it_could_have_shown_it(tmp_path: Path, spec: RunSpec, avoided, says: str) -> None:
    """`avoided: true` was said of a fix two steps past the control's onset at the same zeros (a
    collapse at a log's end needs three), and of one whose reward fell 70 % at that very step."""
    write_run(tmp_path / "a" / "outputs", RunSpec(last_step=120, reward=_collapsed_at_60))
    write_run(tmp_path / "b" / "outputs", spec)
    control, fix = (analyze([tmp_path / side / "outputs"]).runs[0] for side in "ab")
    result = compare(control, fix)
    assert (result.avoided, result.verdict[0]) == (avoided, says)


def test_a_fix_whose_reward_is_no_longer_logged_did_not_avoid_anything(tmp_path: Path) -> None:
    """B's steps go on to 120 but its reward was last logged at step 50 (W&B, real offline runs):
    it cannot show A's collapse at 60 (it was said to have avoided it)."""
    import os
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import random, sys, wandb
        random.seed(1)
        def run(folder, reward_until, zero_from=None):
            r = wandb.init(project="p", dir=folder, mode="offline")
            for s in range(1, 121):
                x = {"actor/pg_loss": 0.1 + random.random() * 0.01, "timing_s/step": 60.0}
                if s <= reward_until:
                    x["critic/score/mean"] = 0.0 if zero_from and s >= zero_from else 0.3 + random.random() * 0.2
                r.log(x, step=s)
            r.finish()
        run(sys.argv[1], 120, zero_from=60)
        run(sys.argv[2], 50)
    """)
    for side in "ab":
        (tmp_path / side).mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")} | {
        "HOME": str(tmp_path), "WANDB_SILENT": "true", "WANDB_MODE": "offline", "WANDB_DISABLE_GIT": "true"}
    subprocess.run([sys.executable, "-c", script, str(tmp_path / "a"), str(tmp_path / "b")], env=env, check=True, timeout=180)
    result = compare(analyze([tmp_path / "a"]).runs[0], analyze([tmp_path / "b"]).runs[0])
    assert result.avoided is None
    assert result.verdict[0].startswith("B logged critic/score/mean at only 0 steps from step 60 on")


def test_step_time_and_throughput_are_per_step_for_a_run_logged_every_tenth_step(tmp_path: Path) -> None:
    """A TensorBoard run (real writer) logged every 10th step at 6 s a step: 6 s and 600 steps/h,
    not a logged row's 60 s and 60/h (read as ten times slower than it ran)."""
    from tensorboardX import SummaryWriter

    from forensics.compare import run_stats

    writer = SummaryWriter(str(tmp_path / "runs" / "Nov28_10-00-00_host"))
    for step in range(10, 1210, 10):
        for tag, value in (("train/reward", 0.3 + 0.01 * (step % 7)), ("train/loss", 0.05)):
            writer.add_scalar(tag, value, step, walltime=1764324000.0 + step * 6.0)
    writer.close()
    stats = run_stats(analyze([tmp_path / "runs"]).runs[0])
    assert (stats.first_step, stats.last_step) == (10, 1200)
    assert stats.median_step_seconds == pytest.approx(6.0) and stats.steps_per_hour == pytest.approx(600.0)


def test_verl_runs_without_their_ray_sessions_compare_the_step_time_they_logged(tmp_path: Path) -> None:
    """verl's console prints no time of day, but each step line logs ``timing_s/step``: without the
    Ray session (kept under /tmp, not given) the comparison's step time and throughput are those."""
    from verl_builder import VerlRunSpec, healthy_score, write_verl_run

    for name in ("control", "fix"):
        write_verl_run(tmp_path / name, VerlRunSpec(steps=30, score=healthy_score))
    result = runner.invoke(app, ["compare", str(tmp_path / "control"), str(tmp_path / "fix"), "--no-html", "--json", "-"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    for side in ("a", "b"):
        seconds, per_hour = doc[side]["median_step_seconds"], doc[side]["steps_per_hour"]
        assert seconds is not None and per_hour is not None and 0.5 < per_hour * seconds / 3600 < 2, doc[side]
