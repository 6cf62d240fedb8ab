"""``grpo-forensics analyze`` and friends on the incident fixtures, as a user runs them."""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from conftest import FIXTURES, read_line, tree_state
from typer.testing import CliRunner

from forensics.cli import app

runner = CliRunner()


def run_json(path: Path, tmp_path: Path, *extra: str) -> dict:
    out = tmp_path / "analysis.json"
    result = runner.invoke(app, ["analyze", str(path), "--json", str(out), "--out", str(tmp_path / "report"), *extra])
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text())


def test_seed000_onset_cause_and_checkpoint(fixture_run, tmp_path: Path) -> None:
    doc = run_json(fixture_run("areal_seed000"), tmp_path)
    assert doc["schema"] == "grpo-forensics/analysis/v1"
    [run] = doc["runs"]
    assert run["run_id"] == "gsm8k-grpo-full-local/trial0"
    assert run["primary_metric"] == "grpo_actor/task_reward/avg"
    assert run["steps"] == {"first": 1, "last": 1869, "count": 1869}
    first = run["incidents"][0]
    assert first["kind"] == "reward_collapse"
    assert first["onset_step"] == 940
    assert first["onset_time"] == "2025-11-11T11:37:11.251"
    assert first["recovered"] is False and first["end_step"] is None
    assert first["cause"] == "inference_server_unresponsive"
    assert first["wasted_steps"] == 929
    assert first["evidence"] and first["evidence"][0]["kind"] == "request_timeout"
    rec = run["recommendation"]
    assert rec["checkpoint"].endswith("default/epoch0epochstep899globalstep899")
    assert rec["step"] == 900
    assert any("recover checkpoint" in w and "overwritten" in w for w in rec["warnings"])
    assert "actor.path=" in rec["resume_command"]
    # The fixture's config says /workspace/outputs/grpo: the tree is elsewhere now, and AReaL looks there.
    root = str(fixture_run("areal_seed000"))
    assert f"cluster.fileroot={root}" in rec["resume_command"] and f"recover.fileroot={root}" in rec["resume_command"]
    # A new trial in every section the dumped config names one (else the saver writes into trial0 and
    # recover.mode=auto resumes its recover checkpoint, saved after the onset), and the server loads the export.
    words = shlex.split(rec["resume_command"])
    for section in ("saver", "recover", "stats_logger", "evaluator"):
        assert f"{section}.trial_name=trial0-from-step900" in words
    assert f"sglang.model_path={rec['checkpoint']}" in words


def test_every_evidence_line_is_in_its_file(fixture_run, tmp_path: Path) -> None:
    for name in ("areal_seed000", "areal_seed001"):
        doc = run_json(fixture_run(name), tmp_path)
        for incident in doc["runs"][0]["incidents"]:
            assert incident["evidence"], incident["id"]
            for item in incident["evidence"]:
                line = re.sub(r"\x1b\[[0-9;]*m", "", read_line(item["file"], item["line"])).rstrip()
                assert item["text"][:120] in line or item["text"].startswith(line)


def test_seed000_server_crash_later_is_a_second_incident(fixture_run, tmp_path: Path) -> None:
    doc = run_json(fixture_run("areal_seed000"), tmp_path)
    stall = doc["runs"][0]["incidents"][1]
    assert stall["kind"] == "stall"
    assert stall["onset_step"] == 1870
    assert stall["cause"] == "inference_server_crash"
    kinds = {e["kind"] for e in stall["evidence"]}
    assert {"server_exit", "connection_refused"} <= kinds


def test_seed001_spikes_are_not_a_recovery(fixture_run, tmp_path: Path) -> None:
    doc = run_json(fixture_run("areal_seed001"), tmp_path)
    [run] = doc["runs"]
    first = run["incidents"][0]
    assert (first["onset_step"], first["recovered"]) == (188, False)
    assert first["cause"] == "inference_server_crash"
    assert run["recommendation"]["step"] == 150
    assert len(run["incidents"]) == 1


def test_seed001_relaunch_later_copy_wins(fixture_run, tmp_path: Path) -> None:
    from forensics import analyze

    run = analyze([fixture_run("areal_seed001")]).runs[0]
    resumed = run.events.filter(pl.col("kind") == "run_resumed")
    assert resumed.height == 1
    resume_line = resumed["line"][0]
    relogged = run.metrics.filter((pl.col("key") == "grpo_actor/task_reward/avg") & pl.col("step").is_between(681, 700))
    assert relogged.height == 20
    assert (relogged["line"] > resume_line).all()
    assert run.steps.height == 900


def test_healthy_sparse_run_has_no_incident(fixture_run, tmp_path: Path) -> None:
    doc = run_json(fixture_run("areal_healthy_sparse"), tmp_path)
    [run] = doc["runs"]
    assert run["incidents"] == []
    rec = run["recommendation"]
    assert rec["step"] == 300
    assert rec["checkpoint"] is not None


def test_healthy_fixture_really_has_isolated_zero_steps(fixture_run) -> None:
    from forensics import analyze

    run = analyze([fixture_run("areal_healthy_sparse")]).runs[0]
    rewards = run.metrics.filter(pl.col("key") == run.primary_metric).sort("step")["value"]
    assert (rewards == 0).sum() >= 30


def test_best_checkpoint_prints_the_path_alone(fixture_run) -> None:
    result = runner.invoke(app, ["best-checkpoint", str(fixture_run("areal_seed000"))])
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert len(lines) == 1
    assert lines[0].endswith("epoch0epochstep899globalstep899")
    assert Path(lines[0]).is_dir()


def test_best_checkpoint_json_is_the_recommendation(fixture_run) -> None:
    result = runner.invoke(app, ["best-checkpoint", str(fixture_run("areal_healthy_sparse")), "--json"])
    assert result.exit_code == 0
    rec = json.loads(result.stdout)
    assert set(rec) >= {"checkpoint", "step", "reason", "resume_command", "warnings"}
    assert rec["step"] == 300


def test_html_report_opens_with_the_verdict(fixture_run, tmp_path: Path) -> None:
    run_json(fixture_run("areal_seed000"), tmp_path)
    page = (tmp_path / "report" / "report.html").read_text()
    verdict = page.index('id="incident-1"')
    assert verdict < page.index('id="checkpoint"') < page.index('<div class="plot"')
    assert "940" in page[verdict : verdict + 3000]
    assert page.count("Plotly.newPlot") == 1
    assert not re.search(r"""<(?:script|link|img)[^>]+(?:src|href)=["']https?://""", page)


def test_analyze_writes_nothing_into_the_tree(fixture_run, tmp_path: Path) -> None:
    root = fixture_run("areal_seed001")
    before = tree_state(root)
    run_json(root, tmp_path)
    runner.invoke(app, ["best-checkpoint", str(root)])
    runner.invoke(app, ["events", str(root)])
    runner.invoke(app, ["metrics", str(root)])
    assert tree_state(root) == before


def test_fail_on_incident_exit_codes(fixture_run, tmp_path: Path) -> None:
    sick = runner.invoke(app, ["analyze", str(fixture_run("areal_seed000")), "--no-html", "--fail-on-incident"])
    well = runner.invoke(app, ["analyze", str(fixture_run("areal_healthy_sparse")), "--no-html", "--fail-on-incident"])
    assert (sick.exit_code, well.exit_code) == (1, 0)


@pytest.mark.parametrize("make", ["missing", "empty_dir", "junk_file"])
def test_unusable_input_is_exit_2_with_one_line(make: str, tmp_path: Path) -> None:
    target = tmp_path / "target"
    if make == "empty_dir":
        target.mkdir()
    elif make == "junk_file":
        target.write_bytes(b"\x00\xff binary junk\n" * 10)
    for command in (["analyze", "--no-html"], ["best-checkpoint"], ["events"], ["metrics"]):
        result = runner.invoke(app, [*command, str(target)])
        assert result.exit_code == 2, (command, result.output)
        assert "Traceback" not in result.output
        assert len(result.stderr.strip().splitlines()) == 1


def test_out_inside_the_analyzed_tree_is_refused(fixture_run) -> None:
    root = fixture_run("areal_healthy_sparse")
    result = runner.invoke(app, ["analyze", str(root), "--out", str(root / "report")])
    assert result.exit_code == 2
    assert not (root / "report").exists()
    result = runner.invoke(app, ["metrics", str(root), "--output", str(root / "metrics.csv")])
    assert result.exit_code == 2 and "--output" in result.output
    assert not (root / "metrics.csv").exists()


def test_the_temp_report_folder_inside_the_analyzed_tree_is_refused_too(fixture_run, tmp_path: Path, monkeypatch) -> None:
    """From inside the tree, the default ./grpo-forensics-report is refused for this user's temp
    folder; with TMPDIR pointed into the tree that lies inside too: exit 2 before any work, nothing written."""
    import shutil
    import tempfile

    root = tmp_path / "outputs"
    shutil.copytree(fixture_run("areal_healthy_sparse"), root)
    temp = root / "logs" / "tmp"
    temp.mkdir()
    monkeypatch.chdir(root / "logs")
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # (read again from TMPDIR)
    before = tree_state(root)
    for command in (["analyze", "."], ["compare", ".", "."]):
        result = runner.invoke(app, command)
        assert result.exit_code == 2 and "give --out a folder outside it" in result.output, (command, result.output)
    assert tree_state(root) == before


def test_a_log_given_by_name_is_read_with_its_folder_which_gets_nothing(fixture_run, tmp_path: Path, monkeypatch) -> None:
    """``cd run && grpo-forensics analyze train.log``: the run read is the folder (its checkpoints,
    its config), so the default report goes elsewhere and outputs put there are refused."""
    import shutil

    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(FIXTURES / "seed003" / "train.log", run / "train.log")
    monkeypatch.chdir(run)
    monkeypatch.setenv("GRPO_FORENSICS_CACHE", str(tmp_path / "cache"))
    before = tree_state(run)
    result = runner.invoke(app, ["analyze", "train.log"])
    assert result.exit_code == 0, result.output
    assert tree_state(run) == before
    for option, target in (("--json", "a.json"), ("--out", "report")):
        refused = runner.invoke(app, ["analyze", "train.log", option, target])
        assert refused.exit_code == 2 and "inside the analyzed path" in refused.output
    assert tree_state(run) == before


def test_events_jsonl_filtered_by_kind(fixture_run) -> None:
    result = runner.invoke(app, ["events", str(fixture_run("areal_seed000")), "--kind", "server_exit"])
    assert result.exit_code == 0
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert rows and {r["kind"] for r in rows} == {"server_exit"}
    assert set(rows[0]) >= {"time", "step", "source", "kind", "severity", "file", "line", "message"}
    assert rows[0]["time"].startswith("2025-11-12T05:09")


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_metrics_in_every_format(fixture_run, tmp_path: Path, fmt: str) -> None:
    out = tmp_path / f"metrics.{fmt}"
    result = runner.invoke(app, ["metrics", str(fixture_run("areal_healthy_sparse")), "--format", fmt, "--output", str(out)])
    assert result.exit_code == 0, result.output
    frame = {"csv": pl.read_csv, "jsonl": pl.read_ndjson, "parquet": pl.read_parquet}[fmt](out)
    assert frame.columns == ["run_id", "source", "step", "time", "key", "value", "root", "file"]
    reward = frame.filter(pl.col("key") == "ppo_actor/task_reward/avg")
    assert reward.height == 300


def test_metrics_of_some_keys_are_those_rows_of_the_whole_export(fixture_run, tmp_path: Path) -> None:
    run = str(fixture_run("sglang_hang"))
    every, some = tmp_path / "every.parquet", tmp_path / "some.parquet"
    for out, extra in ((every, []), (some, ["--keys", "task_reward|^sglang/token"])):
        result = runner.invoke(app, ["metrics", run, "--format", "parquet", "--output", str(out), *extra])
        assert result.exit_code == 0, result.output
    whole, kept = pl.read_parquet(every), pl.read_parquet(some)
    wanted = whole.filter(pl.col("key").str.contains("task_reward|^sglang/token"))
    assert {"grpo_actor/task_reward/avg", "sglang/token_usage"} <= set(kept["key"]) < set(whole["key"])
    assert kept.sort(pl.all()).equals(wanted.sort(pl.all()))
    bad = runner.invoke(app, ["metrics", run, "--keys", "reward(", "--output", str(tmp_path / "x.csv")])
    assert bad.exit_code == 2 and "--keys" in bad.output


@pytest.mark.parametrize("command", ["metrics", "events"])
def test_a_reader_that_stops_early_is_not_an_error(fixture_run, command: str) -> None:
    """``grpo-forensics metrics run/ | head``: the closed pipe ends the command quietly, exit 0."""
    child = subprocess.Popen([sys.executable, "-m", "forensics", command, str(fixture_run("areal_seed000"))],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert child.stdout is not None and child.stderr is not None
    assert child.stdout.readline()
    child.stdout.close()  # far more than a pipe's buffer is still to come
    assert child.wait(timeout=120) == 0
    assert child.stderr.read() == b""


@pytest.mark.parametrize("command", [["analyze", "--no-html"], ["compare", "--no-html"], ["watch", "--replay"]])
def test_a_summary_into_a_closed_pipe_still_does_the_rest(fixture_run, tmp_path: Path, command: list[str]) -> None:
    """``grpo-forensics analyze run/ --json a.json | head -1``: rich's console would exit 1 (an
    incident, to CI) when the reader has gone; the summary goes nowhere and the rest is done."""
    run = str(fixture_run("areal_seed000"))
    args = [command[0], run, *([run] if command[0] == "compare" else []), *command[1:]]
    if command[0] != "watch":
        args += ["--json", str(tmp_path / "a.json"), "--no-cache"]
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line
    done = subprocess.run([sys.executable, "-m", "forensics", *args], stdout=write_end, stderr=subprocess.PIPE, timeout=300)
    os.close(write_end)
    assert (done.returncode, done.stderr) == (0, b"")
    if command[0] != "watch":
        assert json.loads((tmp_path / "a.json").read_text())


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the malloc settings are glibc's")
def test_the_command_line_keeps_freed_blocks_in_the_heap() -> None:
    """The settings that spare each 16 MB block a fresh memory map take (in a process of its own:
    they are process-wide)."""
    code = "from forensics.allocator import reuse_block_memory; print(reuse_block_memory())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "True"


HEAP_RETURN = """
import os
from forensics.allocator import hand_back_heap, reuse_block_memory
reuse_block_memory()
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20
blocks = [b"x" * (8 << 20) for _ in range(12)]  # read blocks (written): kept in the heap once freed
keep = b"y" * (1 << 20)  # a live object above them, so the heap's top cannot shrink on its own
del blocks
held = rss()
print(hand_back_heap(), held - rss())
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the heap is glibc's")
def test_the_heap_kept_for_read_blocks_is_given_back_once_reading_is_done() -> None:
    done = subprocess.run([sys.executable, "-c", HEAP_RETURN], capture_output=True, text=True, check=True)
    took, returned = done.stdout.split()
    assert took == "True" and int(returned) >= 80  # of 96 MB freed


PROMPT_RETURN = """
import os, sys, time
from forensics.allocator import return_freed_memory_promptly
took = return_freed_memory_promptly()
import polars as pl
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20
before = rss()
frames = [pl.select((pl.int_range(0, 40_000, dtype=pl.Int64) * i).alias("a")) for i in range(1000)]
held = rss()
del frames
time.sleep(1.0)
for i in range(200):  # the next work, whose allocations hand the freed pages back
    pl.select((pl.int_range(0, 40_000, dtype=pl.Int64) * i).alias("a"))
threads = {open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")}
print(took, "jemalloc_bg_thd" in threads, (held - rss()) / (held - before))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_polars_gives_freed_memory_back_as_it_goes_on() -> None:
    """Set before Polars loads, its allocator's own threads return freed frames (Polars' build
    otherwise starts a background thread for it, which falls behind on busy cores); a user's
    own setting is left alone. How much lower the peaks are, the benchmark measures."""
    done = subprocess.run([sys.executable, "-c", PROMPT_RETURN], capture_output=True, text=True, check=True)
    took, background, returned = done.stdout.split()
    # Which arenas the next work touches varies: 0.67-0.96 of ~300 MB came back in trials.
    assert took == "True" and background == "False" and float(returned) > 0.5
    env = {**os.environ, "_RJEM_MALLOC_CONF": "dirty_decay_ms:10000"}
    done = subprocess.run([sys.executable, "-c", PROMPT_RETURN], capture_output=True, text=True, check=True, env=env)
    assert done.stdout.split()[:2] == ["False", "True"]


def test_the_entry_point_imports_no_polars_before_setting_the_allocator() -> None:
    code = "import sys, forensics, forensics.entry; print('polars' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_the_commands_do_not_import_pyarrow_until_one_writes_parquet() -> None:
    """pyarrow costs every command ~40 MB and a tenth of a second to import: only a Parquet export needs it."""
    code = "import sys, forensics.cli; print('pyarrow' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_a_run_given_twice_is_analyzed_once(fixture_run, tmp_path: Path) -> None:
    run = fixture_run("areal_seed000")
    trial = run / "logs/root/gsm8k-grpo-full-local/trial0"
    once = runner.invoke(app, ["metrics", str(run), "--no-cache"])
    twice = runner.invoke(app, ["metrics", str(run), str(run), str(trial), "--no-cache"])
    assert twice.exit_code == 0 and twice.stdout == once.stdout
    result = runner.invoke(app, ["analyze", str(run), str(trial), "--no-cache", "--no-html", "--json", str(tmp_path / "a.json")])
    assert result.exit_code == 0 and len(json.loads((tmp_path / "a.json").read_text())["runs"]) == 1
    # A log given with its run's folder (either order): the run, once, with all its logs.
    log = next(trial.glob("trainer.log*"))
    for given in ([log, run], [run, log]):
        result = runner.invoke(app, ["analyze", *map(str, given), "--no-cache", "--no-html", "--json", str(tmp_path / "b.json")])
        [whole] = json.loads((tmp_path / "b.json").read_text())["runs"]
        assert result.exit_code == 0 and len(whole["sources"]) > 1


def test_a_terminal_that_cannot_spell_the_output_gets_it_anyway(fixture_run) -> None:
    """An ASCII or Latin-1 locale: the summary with '?' for what it cannot show, the exports in UTF-8;
    the JSONL's times are ISO 8601, as the CSV's."""
    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    run = str(fixture_run("areal_seed000"))
    for args in (["analyze", run, "--no-html", "--no-cache", "--markdown", "-"], ["metrics", run, "--no-cache", "--format", "jsonl"]):
        done = subprocess.run([sys.executable, "-m", "forensics", *args], capture_output=True, env=env, timeout=300)
        assert done.returncode == 0 and b"internal error" not in done.stderr and b"Traceback" not in done.stderr, done.stderr[-500:]
        assert done.stdout.strip()
    first = json.loads(done.stdout.split(b"\n", 1)[0])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}", first["time"])


def test_events_of_a_kind_never_found_are_said_so(fixture_run) -> None:
    result = runner.invoke(app, ["events", str(fixture_run("areal_seed000")), "--kind", "server_exitt", "--no-cache"])
    assert result.exit_code == 0 and result.stdout == ""
    assert "no event of kind server_exitt; found: " in result.stderr and "server_exit" in result.stderr
    found = runner.invoke(app, ["events", str(fixture_run("areal_seed000")), "--kind", "server_exit", "--no-cache"])
    assert found.stdout.count("\n") >= 1 and found.stderr == ""


def test_metrics_and_events_say_a_path_holding_no_run(fixture_run, tmp_path: Path) -> None:
    """A folder with no run beside a run: its rows are written, then exit 2 naming the folder (as analyze)."""
    (tmp_path / "empty").mkdir()
    for command in (["metrics"], ["events"]):
        result = runner.invoke(app, [*command, str(fixture_run("areal_healthy_sparse")), str(tmp_path / "empty"), "--no-cache"])
        assert result.exit_code == 2 and result.stdout and f"{tmp_path / 'empty'}: no training run found" in result.stderr


@pytest.mark.parametrize("name", ["sweep[lr=3e-6]", "rep[/b]"])
def test_the_report_path_is_printed_as_written_whatever_its_brackets(tmp_path: Path, name: str) -> None:
    """A sweep's folder names hold brackets: the path printed is the report's, not rich markup read
    out of it (``sweep/report.html``, which does not exist, or a crash after the report was written)."""
    out = tmp_path / name
    result = runner.invoke(app, ["analyze", str(FIXTURES / "areal_healthy_sparse" / "outputs"), "--out", str(out), "--no-cache"])
    assert result.exit_code == 0, result.output
    [printed] = [line.removeprefix("report: ") for line in result.stdout.splitlines() if line.startswith("report: ")]
    assert printed == str(out / "report.html") and Path(printed).is_file()
