"""Hand-rolled loops: the seed 003 log, and a trainer read through a user-declared TOML format."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import polars as pl
from conftest import read_line
from typer.testing import CliRunner

from forensics import analyze
from forensics.cli import app

FIXTURES = Path(__file__).parent / "fixtures"
FORMAT = FIXTURES / "custom_format_example.toml"
runner = CliRunner()


def test_seed003_dead_batches_with_reward_std_evidence_and_slow_second_iteration() -> None:
    [run] = analyze([FIXTURES / "seed003"]).runs
    assert run.framework == "custom"
    [incident] = run.incidents
    assert (incident.kind, incident.onset_step, incident.cause) == ("zero_variance", 1, "reward_pipeline")
    assert incident.metric == "reward/std"
    # Iteration 3 was cut short by the Ctrl-C: its zero rewards count, said as such, not as a step the run logged.
    assert "3 steps in a row (the last, step 3, unfinished when the log ends)" in incident.summary
    assert run.step_range()["last"] == 2 and incident.wasted_steps == 1
    assert not any("AReaL" in s for s in incident.suggestions)  # a hand-rolled loop gets no AReaL setting
    assert any(e.kind == "zero_advantages" and "rewards_grouped=[[0.0" in e.text for e in incident.evidence)
    # The onset's own line, quoted as it is (the loop's, not dressed as a line AReaL would print).
    onset = incident.onset_evidence
    assert onset is not None and onset.text == read_line(Path(onset.file), onset.line).strip()
    assert onset.text.startswith("[Micro 0] 3. Samples scored:") and "rewards=0.0000±0.0000" in onset.text
    std = run.metrics.filter((pl.col("key") == "reward/std") & (pl.col("step") >= 1))["value"]
    assert (std == 0).all()
    [slow] = run.observations
    assert "step 1 103.6 s" in slow and "21.7 s for step 0" in slow and "samples_generated" in slow


def write_toy_log(path: Path, steps: int = 60, collapse: int = 40) -> None:
    lines = []
    for step in range(1, steps + 1):
        reward, std = (0.0, 0.0) if step >= collapse else (0.3 + (step % 7) / 20, 0.25 + (step % 3) / 20)
        loss, grad = ("0.0000", "0.00") if step >= collapse else (f"{-0.01 - step / 1000:.4f}", f"{0.5 + step / 100:.2f}")
        minute, second = divmod(step * 37, 60)
        stamp = f"2025-06-01 {14 + minute // 60:02d}:{minute % 60:02d}:{second:02d}"
        lines.append(f"{stamp} | step {step} | reward={reward:.4f} reward_std={std:.4f} loss={loss} grad_norm={grad}")
    path.write_text("\n".join(lines) + "\n")


def test_a_collapse_in_an_attempt_a_restart_abandoned_is_an_incident(tmp_path: Path) -> None:
    """A loop that collapsed at step 40 was restarted into the same log from its step-30 checkpoint
    and logged 31-50, healthy, and stopped: 51-60 of the first attempt are not the run's (each
    key's later value winning kept them: a collapse never recovered from), its collapse is told."""
    first = tmp_path / "first.log"
    write_toy_log(first)
    healthy = tmp_path / "healthy.log"
    write_toy_log(healthy, collapse=999)
    again = [line.replace("2025-06-01 1", "2025-06-02 1") for line in healthy.read_text().splitlines(keepends=True)[30:50]]
    log = tmp_path / "run" / "train.log"
    log.parent.mkdir()
    log.write_text(first.read_text() + "".join(again))
    [run] = analyze([log.parent], custom_format=FORMAT).runs
    assert int(run.steps["step"].max()) == 50
    [incident] = run.incidents
    assert (incident.kind, incident.onset_step, incident.recovered) == ("reward_collapse", 40, True)
    assert ("exactly zero from step 40 to step 60, the attempt's last, in an attempt the run abandoned at step 60: "
            "a relaunch from step 30 took the run on from step 31") in incident.summary
    onset = incident.onset_evidence
    assert "| step 40 | reward=0.0000" in log.read_text().splitlines()[onset.line - 1] and onset.line == 40
    assert incident.wasted_steps == 20


def test_user_format_is_read_by_metrics_and_analyze(tmp_path: Path) -> None:
    log = tmp_path / "run" / "train.log"
    log.parent.mkdir()
    write_toy_log(log)
    out = tmp_path / "m.csv"
    result = runner.invoke(app, ["metrics", str(tmp_path / "run"), "--log-format", str(FORMAT), "--output", str(out)])
    assert result.exit_code == 0, result.output
    rewards = pl.read_csv(out).filter(pl.col("key").str.contains("reward"))
    assert rewards.height >= 60
    doc_path = tmp_path / "a.json"
    result = runner.invoke(app, ["analyze", str(tmp_path / "run"), "--log-format", str(FORMAT), "--json", str(doc_path), "--no-html"])
    assert result.exit_code == 0, result.output
    [run] = json.loads(doc_path.read_text())["runs"]
    assert run["incidents"][0]["onset_step"] == 40
    assert run["incidents"][0]["onset_time"] == "2025-06-01T14:24:40"
    # best-checkpoint and compare read it too (exit 4: no checkpoint before the incident; not 2, no run found)
    best = runner.invoke(app, ["best-checkpoint", str(tmp_path / "run"), "--log-format", str(FORMAT)])
    assert best.exit_code == 4, best.output
    both = runner.invoke(app, ["compare", str(tmp_path / "run"), str(tmp_path / "run"), "--log-format", str(FORMAT), "--no-html"])
    assert both.exit_code == 0, both.output


def test_without_the_format_the_log_is_not_a_run(tmp_path: Path) -> None:
    write_toy_log(tmp_path / "train.log")
    result = runner.invoke(app, ["analyze", str(tmp_path), "--no-html"])
    assert result.exit_code == 2


def test_broken_format_file_is_a_one_line_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\nregex = "(?P<step>\\\\d+"\nevil = "__import__(\'os\')"\n')
    write_toy_log(tmp_path / "train.log")
    result = runner.invoke(app, ["analyze", str(tmp_path), "--log-format", str(bad), "--no-html"])
    assert result.exit_code == 2
    assert result.stderr.count("bad.toml") == 1 and "Traceback" not in result.output
    missing = runner.invoke(app, ["analyze", str(tmp_path), "--log-format", str(tmp_path / "none.toml"), "--no-html"])
    assert missing.exit_code == 2 and missing.stderr.strip() == f"grpo-forensics: {tmp_path / 'none.toml'}: No such file or directory"


def test_hosted_wandb_run_without_key_is_a_clear_error(tmp_path: Path, monkeypatch) -> None:
    for name in [k for k in __import__("os").environ if k.startswith("WANDB_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / ".config"))
    result = runner.invoke(app, ["analyze", "--wandb", "entity/project/run123", "--no-html"])
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "entity/project/run123" in result.stderr


def test_a_format_without_a_reward_is_not_called_healthy(tmp_path: Path) -> None:
    """Steps but no reward series: no incident can be found, and none of the renderings says healthy."""
    log = tmp_path / "run" / "train.log"
    log.parent.mkdir()
    write_toy_log(log)
    fmt = tmp_path / "f.toml"
    fmt.write_text('name = "steps-only"\nregex = \'step (?P<step>\\d+) \\| reward=(?P<r>\\S+)\'\n')
    out = tmp_path / "out"
    result = runner.invoke(app, ["analyze", str(log), "--log-format", str(fmt), "--no-cache", "--out", str(out),
                                 "--json", str(out / "a.json"), "--markdown", str(out / "a.md")])
    assert result.exit_code == 0, result.output
    [run] = json.loads((out / "a.json").read_text())["runs"]
    assert run["steps"]["count"] == 60 and run["primary_metric"] is None and run["incidents"] == []
    said = " ".join(result.output.split())
    assert "no reward series was found" in said and "looks healthy" not in said
    assert "nothing judged" in (out / "a.md").read_text()
    page = (out / "report.html").read_text()
    assert "no reward series was found" in page and "looks healthy" not in page
    assert run["recommendation"]["reason"].startswith("No incident found, but no reward series was found")


def test_a_collapse_seen_after_unlogged_steps_gives_its_bounds(tmp_path: Path) -> None:
    """Steps 30–39 missing (a lost stretch), zero from 40: it began somewhere in 30–40."""
    log = tmp_path / "run" / "train.log"
    log.parent.mkdir()
    write_toy_log(log)
    log.write_text("".join(line for line in log.read_text().splitlines(keepends=True)
                           if not 30 <= int(line.split("| step ")[1].split()[0]) <= 39))
    [run] = analyze([log], custom_format=FORMAT).runs
    [incident] = [i for i in run.incidents if i.kind == "reward_collapse"]
    assert incident.onset_step == 40
    assert "steps 30–39 logged no reward/mean, so it began between steps 30 and 40" in incident.summary


def test_a_time_format_that_parses_no_time_is_warned(tmp_path: Path) -> None:
    log = tmp_path / "run" / "train.log"
    log.parent.mkdir()
    write_toy_log(log)
    fmt = tmp_path / "f.toml"
    fmt.write_text("name = \"bad-time\"\nregex = '^(?P<time>\\S+ \\S+) \\| step (?P<step>\\d+) \\| reward=(?P<reward>\\S+)'\n"
                   "time_format = \"%d/%m/%Y %H:%M\"\n")
    result = runner.invoke(app, ["analyze", str(log), "--log-format", str(fmt), "--no-cache", "--no-html"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "warning: train.log: no time parsed with time_format '%d/%m/%Y %H:%M': times are null" in result.output


def test_a_loop_whose_loss_diverges_names_the_loss(tmp_path: Path) -> None:
    """A plain ``loss`` key (no ``…/loss`` prefix) going NaN, the reward finite: the incident and
    its events name what diverged and come from the loop's own log (source ``custom``)."""
    log = tmp_path / "train.log"
    log.write_text("".join(
        f"2025-06-01 14:{s:02d}:12 | step {s} | reward=0.{50 + s} reward_std=0.3125 loss={'nan' if s >= 30 else -s / 100} grad_norm=0.87\n"
        for s in range(1, 41)
    ))
    [run] = analyze([log], custom_format=FORMAT).runs
    [incident] = run.incidents
    assert (incident.kind, incident.metric, incident.onset_step, incident.cause) == ("nan_inf", "loss", 30, "numerical_divergence")
    events = run.events.filter(pl.col("kind") == "nan_inf")
    assert events.height == 11 and set(events["source"]) == {"custom"} and events["message"][0] == "step 30: loss = NaN"


def _loop_iteration(n: int, dead: bool = False) -> list[str]:
    """One iteration of seed 003's loop as it prints it: four micro-batches, then the iteration's
    line. Dead: every group's rewards identical (all right or all wrong), so the loss is 0."""
    lines = []
    for m in range(4):
        reward, spread = (float(n % 2), 0.0) if dead else (0.3 + (n + m) % 5 / 20, 0.3)
        lines += [f"[Micro {m}] 1. Iteration start: mem=16104.8 MB, time=0.000s",
                  f"[Micro {m}] 2. Samples generated: mem=18239.4 MB, time=2.{n:03d}s",
                  f"[Micro {m}] 3. Samples scored: mem=18411.7 MB, time=2.5{m}0s, rewards={reward:.4f}±{spread:.4f}",
                  f"[Micro {m}] 4. Loss computed: mem=21381.4 MB, time=3.0{m}0s, pg_loss={0 if dead else 0.02:.6f}, kl=0.000000, "
                  f"total={0 if dead else 0.02:.6f}"]
    loss = 0.0 if dead else 0.1 + n / 1000
    return [*lines, "5. Optimizer step finished: mem=16012.0 MB, time=25.000s total",
            f"iter {n}: loss {loss:.4f} (main {loss:.4f}, critic 0.0000), time 2500{n % 10}.00ms"]


def test_a_restarted_loop_ends_in_the_restarts_step_not_the_first_attempts(tmp_path: Path) -> None:
    """Iterations 0-29, a restart from 18 that logs 18-23 with dead batches from 19, and the log
    ends in the middle of iteration 24: the values after the last line, and the traceback, are
    iteration 24's (the first attempt reached 29, but the run is at 23)."""
    lines = [line for n in range(30) for line in _loop_iteration(n)] + ["Resuming training from out/ckpt.pt (iter 18)"]
    lines += [line for n in range(18, 24) for line in _loop_iteration(n, dead=n >= 19)]
    lines += _loop_iteration(24, dead=True)[:8] + ["Traceback (most recent call last):", '  File "train_grpo.py", line 412, in <module>',
                                             "ValueError: reward model returned an empty batch"]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "train.log").write_text("\n".join(lines) + "\n")
    [run] = analyze([tmp_path / "run"]).runs
    assert int(run.steps["step"].max()) == 23
    summaries = {i.kind: i.summary for i in run.incidents}
    assert "(the last, step 24, unfinished when the log ends)" in summaries["zero_variance"]
    assert run.events.filter(pl.col("kind") == "traceback")["step"].to_list() == [24]
    assert summaries["crash"].startswith("an uncaught exception during step 24")


def test_a_format_printing_the_step_on_every_micro_line_is_no_relaunch(tmp_path: Path) -> None:
    """A declared format whose micro-step lines carry the step number: one copy of each step, none abandoned."""
    fmt = tmp_path / "micro.toml"
    fmt.write_text('name = "micro"\n'
                   "regex = '^step (?P<step>\\d+) micro (?P<micro>\\d+) \\| reward=(?P<reward>\\S+)'\n"
                   '[values]\nreward = "reward/mean"\n')
    lines = [f"step {s} micro {m} | reward={0.0 if s >= 40 else 0.25 + (s * 7 + m * 3) % 11 / 20:.4f}" for s in range(1, 61) for m in range(4)]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "train.log").write_text("\n".join(lines) + "\n")
    from parsers.custom import load_custom_format, read_custom_log

    log = read_custom_log(tmp_path / "run" / "train.log", load_custom_format(fmt))
    assert log.superseded.is_empty() and log.steps["step"].to_list() == list(range(1, 61))
    [run] = analyze([tmp_path / "run"], custom_format=fmt).runs
    assert [(i.kind, i.onset_step) for i in run.incidents] == [("reward_collapse", 40)]
    result = runner.invoke(app, ["watch", "--replay", str(tmp_path / "run"), "--log-format", str(fmt), "--json"])
    assert [(a["kind"], a["onset_step"], a["step"]) for a in json.loads(result.stdout)["alarms"]] == [("reward_collapse", 40, 44)]


def test_a_loop_ending_in_a_cuda_oom_traceback_is_a_crash(tmp_path: Path) -> None:
    """The loop's last act was an uncaught CUDA OOM (a ``cuda_oom`` event): a crash in the step after its last."""
    log = tmp_path / "run" / "train.log"
    log.parent.mkdir()
    write_toy_log(log, steps=7, collapse=999)
    log.write_text(log.read_text() + 'Traceback (most recent call last):\n  File "train.py", line 200, in <module>\n'
                   "    loss.backward()\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.31 GiB.\n")
    [run] = analyze([log.parent], custom_format=FORMAT).runs
    [incident] = run.incidents
    assert (incident.kind, incident.onset_step, incident.cause) == ("crash", 8, "training_worker_crash")
    assert "torch.OutOfMemoryError: CUDA out of memory" in incident.summary


def _loop_log(path: Path, dead_from: int | None, warn: bool = True) -> None:
    """Seed 003's loop, 4 micro-steps an iteration, rewards varying within each group; from
    ``dead_from`` on the policy loss is exactly 0 and the loop warns its log-probs are zero."""
    import random

    rng = random.Random(1)
    lines = ["Overriding config with config/grpo_config.py:", "batch_size = 1", "group_size = 8", "compile = False"]
    for it in range(30):
        dead = dead_from is not None and it >= dead_from
        total = 0.0
        for m in range(4):
            k = rng.randint(1, 7)
            mean, pg = k / 8, 0.0 if dead else rng.uniform(0.01, 0.05)
            lines += [f"[Micro {m}] 1. Iteration start: mem=16104.8 MB, time=0.000s",
                      f"[Micro {m}] 3. Samples scored: mem=18412.6 MB, time=2.418s, rewards={mean:.4f}±{(mean * (1 - mean)) ** 0.5:.4f}"]
            if dead and warn:
                lines.append("WARNING: All sequence_log_probs are near zero! num_masked=0.0")
            lines.append(f"[Micro {m}] 4. Loss computed: mem=21381.0 MB, time=3.012s, pg_loss={pg:.6f}, kl=0.000000, total={pg:.6f}")
            total += pg
        lines += ["5. Optimizer step finished: mem=16011.7 MB, time=12.000s total",
                  f"iter {it}: loss {total:.4f} (main {total:.4f}, critic 0.0000), time 12000.00ms"]
    path.mkdir(parents=True, exist_ok=True)
    (path / "train.log").write_text("\n".join(lines) + "\n")


def test_a_loss_exactly_zero_while_rewards_vary_is_a_dead_loss(tmp_path: Path) -> None:
    """Seed 003's second cause: the rewards still differ within each group, yet the loss is exactly
    0 from iteration 10 (the log-probs are zeroed): "if loss is exactly 0, something is broken".
    Not dead batches (the rewards were not identical), not healthy; the loop's own warning is the evidence."""
    _loop_log(tmp_path / "broken", dead_from=10)
    [run] = analyze([tmp_path / "broken"]).runs
    [incident] = run.incidents
    assert (incident.kind, incident.onset_step, incident.end_step, incident.cause) == ("dead_loss", 10, None, "loss_computation")
    assert "20 steps in a row with pg_loss exactly 0 while reward/std did not" in incident.summary
    assert incident.evidence and all(e.kind == "zero_logprobs" for e in incident.evidence)
    assert any("log-probs and the loss mask" in s for s in incident.suggestions)
    _loop_log(tmp_path / "healthy", dead_from=None)
    assert analyze([tmp_path / "healthy"]).runs[0].incidents == []
    # GRPO's on-policy surrogate can print 0 from the first step (ratio 1, advantages summing to 0 in
    # each group) with a live gradient: only a loss that was live and went dead is told.
    _loop_log(tmp_path / "surrogate", dead_from=0, warn=False)
    assert analyze([tmp_path / "surrogate"]).runs[0].incidents == []


def test_a_declared_formats_events_carry_their_lines_time_and_a_stopped_loop_is_a_stall(tmp_path: Path) -> None:
    """The loop stops stepping at step 40 and logs a CUDA OOM every 10 minutes for two hours: its
    events had no time (the metric regex alone read one), so nothing told the steps had stopped."""
    log = tmp_path / "train.log"
    write_toy_log(log, steps=40, collapse=99)
    last = log.read_text().splitlines()[-1][:19]
    from datetime import datetime, timedelta

    t = datetime.fromisoformat(last)
    oom = [f"{t + timedelta(minutes=10 * k):%Y-%m-%d %H:%M:%S} ERROR torch.OutOfMemoryError: CUDA out of memory. "
           "Tried to allocate 2.00 GiB" for k in range(1, 13)]
    traceback = ["Traceback (most recent call last):", '  File "loop.py", line 9, in <module>',
                 "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"]
    with open(log, "a") as fh:
        fh.write("\n".join(traceback + oom) + "\n")
    [run] = analyze([log], custom_format=FORMAT).runs
    ooms = run.events.filter(pl.col("kind") == "cuda_oom").sort("line")
    assert ooms["time"].to_list() == [t, *(t + timedelta(minutes=10 * k) for k in range(1, 13))]  # (the traceback: its step line's)
    assert [(i.kind, i.onset_step) for i in run.incidents] == [("stall", 41)]


def test_a_loops_save_line_is_said_where_no_checkpoint_is_read(tmp_path: Path) -> None:
    """nanoGPT prints ``saving checkpoint to out`` at an eval, before that iteration's own line, and
    overwrites ``out/ckpt.pt`` each time: no checkpoint the tool reads, but the logs say one was
    saved, so ``best-checkpoint`` does not answer "none was found" (exit 4) but names the save
    line and cannot choose (exit 2), as for any run whose saves are not where it looks."""
    from conftest import FIXTURES

    lines = (FIXTURES / "seed003" / "train.log").read_text().splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if line.startswith("iter 0:"))
    run = tmp_path / "grpo_run"
    run.mkdir()
    (run / "train.log").write_text("".join([*lines[:first], "step 0: train loss 0.1300, val loss 0.1400\n",
                                            "saving checkpoint to out-grpo\n", *lines[first:]]))
    (run / "out-grpo").mkdir()
    (run / "out-grpo" / "ckpt.pt").write_bytes(b"\x80\x02}q\x00.")
    [analysed] = analyze([run]).runs
    [save] = analysed.events.filter(pl.col("kind") == "checkpoint_saved").iter_rows(named=True)
    assert (save["line"], save["step"]) == (first + 2, 0)
    result = runner.invoke(app, ["best-checkpoint", str(run), "--json", "--no-cache"])
    assert result.exit_code == 2, result.output
    [warning] = json.loads(result.stdout)["warnings"]
    assert f"train.log:{first + 2}: saving checkpoint to out-grpo" in warning
    # (the folder it names is there, beside the log: not to be looked for elsewhere)
    assert f"to {run / 'out-grpo'}, which is there: in a form the tool does not read" in warning
    assert "find them where the run's working folder was" not in warning


def test_dead_batches_in_an_attempt_a_rerun_appended_to_the_log_abandoned_are_an_incident(tmp_path: Path) -> None:
    """Seed 003's quick test: its log (dead batches from iteration 1, then Ctrl-C), then a rerun
    from iteration 0 appended to the same log (``tee -a``), healthy. The first attempt's dead
    batches are its values no longer, but they happened: an incident, in the attempt abandoned."""
    rerun = [line for n in range(10) for line in _loop_iteration(n)]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "train.log").write_text((FIXTURES / "seed003" / "train.log").read_text() + "\n".join(rerun) + "\n")
    [run] = analyze([tmp_path / "run"]).runs
    [dead] = [i for i in run.incidents if i.kind == "zero_variance"]
    assert (dead.onset_step, dead.redone) == (1, True)
    assert "in an attempt the run abandoned at step 2: the run was started again from its first step" in dead.summary


def _relaunched_loop(log: Path, between: Callable[[datetime], list[str]], pause: timedelta) -> None:
    """A loop in the example format: steps 1–57, the lines ``between`` gives from the time of step
    57's line, then, ``pause`` after it, a relaunch from step 40 appending steps 41–120."""
    import random

    rng, at, lines = random.Random(4), datetime(2025, 6, 1, 14, 0), []

    def step(s: int) -> None:
        nonlocal at
        at += timedelta(seconds=150 + rng.uniform(-10, 10))
        lines.append(f"{at:%Y-%m-%d %H:%M:%S} | step {s} | reward={0.3 + s / 400 + rng.uniform(-.05, .05):.4f} "
                     f"reward_std=0.3000 loss={rng.uniform(-.02, .02):.4f} grad_norm={rng.uniform(.2, .9):.2f}")
    for s in range(1, 58):
        step(s)
    lines += between(at)
    at += pause
    for s in range(41, 121):
        step(s)
    log.write_text("\n".join(lines) + "\n")


def test_a_loops_crash_before_a_relaunch_into_its_log_is_the_abandoned_attempts(tmp_path: Path) -> None:
    """A hand-rolled loop (the README's example format) died of a CUDA OOM during step 58 and was
    relaunched by hand from its step-40 checkpoint, appending to the same log. The crash is the
    abandoned attempt's, in the step it died in, not the relaunch's first step nor nothing."""
    _relaunched_loop(tmp_path / "train.log", lambda at: [
        f"{at + timedelta(seconds=60):%Y-%m-%d %H:%M:%S} ERROR step failed", "Traceback (most recent call last):",
        '  File "train.py", line 200, in <module>', "    loss.backward()", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
        f"{at + timedelta(seconds=660):%Y-%m-%d %H:%M:%S} INFO resuming from checkpoints/step_40"], timedelta(seconds=660))
    [run] = analyze([tmp_path], custom_format=FORMAT).runs
    assert run.events.filter(pl.col("kind") == "cuda_oom")["step"].to_list() == [58]
    [crash] = run.incidents
    assert (crash.kind, crash.onset_step, crash.cause) == ("crash", 58, "training_worker_crash")
    assert "in an attempt the run abandoned: a relaunch from step 40 took the run on from step 41" in crash.summary
    assert [(e.kind, e.line) for e in crash.evidence][:1] == [("cuda_oom", 59)]


def test_a_relaunchs_handled_error_while_resuming_is_the_relaunchs(tmp_path: Path) -> None:
    """Killed without a word during step 58, the loop was relaunched by hand from step 40 into its
    log; resuming, the relaunch logged an error and its traceback (a handled one) and trained on.
    That traceback is the relaunch's, in its first step, not the dead attempt's uncaught crash."""
    _relaunched_loop(tmp_path / "train.log", lambda at: [
        f"{at + timedelta(minutes=15):%Y-%m-%d %H:%M:%S} INFO resuming from checkpoints/step_40",
        f"{at + timedelta(minutes=15, seconds=5):%Y-%m-%d %H:%M:%S} ERROR could not load optimizer state, starting a fresh optimizer",
        "Traceback (most recent call last):", '  File "train.py", line 80, in load', "    opt.load_state_dict(state)",
        "ValueError: loaded state dict contains a parameter group that doesn't match the size of optimizer's group"],
        timedelta(minutes=15))
    [run] = analyze([tmp_path], custom_format=FORMAT).runs
    raised = run.events.filter(pl.col("message").str.contains("Traceback", literal=True))
    assert raised["step"].to_list() == [41]
    assert not [i for i in run.incidents if i.kind == "crash" and "ValueError" in i.summary]
