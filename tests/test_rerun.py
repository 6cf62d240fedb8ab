"""The very same ``analyze`` again is played back from its record (``forensics/rerun.py``), run by
the real entry point in a process of its own: whether Polars was imported tells a played-back run
from one that ran (``python -X importtime`` writes every import to stderr, past the recording)."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXTURES, tree_state

HANG = FIXTURES / "sglang_hang" / "outputs"


def analyze(*args: str | Path, cache: Path, env: dict[str, str] | None = None, cwd: Path | None = None,
            command: str = "analyze") -> tuple[int, bytes, bytes, bool]:
    """Exit code, stdout, stderr (the imports taken out) and whether Polars was imported."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "forensics", command, *map(str, args)],
                          capture_output=True, timeout=300, cwd=cwd,
                          env={**os.environ, "GRPO_FORENSICS_CACHE": str(cache), **(env or {})})
    lines = done.stderr.splitlines(keepends=True)
    imports = b"".join(line for line in lines if line.startswith(b"import time:"))
    said = b"".join(line for line in lines if not line.startswith(b"import time:"))
    return done.returncode, done.stdout, said, b" polars\n" in imports


@pytest.fixture
def run(tmp_path: Path) -> Path:
    shutil.copytree(HANG, tmp_path / "outputs", symlinks=True)
    return tmp_path / "outputs"


def test_the_same_command_again_prints_and_writes_what_it_did_without_loading_polars(tmp_path: Path, run: Path) -> None:
    out, cache = tmp_path / "report", tmp_path / "cache"
    args = (run, "--out", out, "--json", tmp_path / "a.json", "--markdown", tmp_path / "a.md", "--fail-on-incident")
    first = analyze(*args, cache=cache)
    assert first[0] == 1 and first[3]  # (an incident: exit 1, with --fail-on-incident)
    written = {p: p.read_bytes() for p in (out / "report.html", tmp_path / "a.json", tmp_path / "a.md")}
    for path in written:
        path.unlink()
    before = tree_state(run)
    again = analyze(*args, cache=cache)
    assert again[:3] == first[:3] and not again[3]
    assert {p: p.read_bytes() for p in written} == written
    assert tree_state(run) == before
    assert json.loads(written[tmp_path / "a.json"])["runs"][0]["incidents"]


def _grow_a_log(run: Path) -> None:
    [log] = run.rglob("llm_server.log.gz")
    with gzip.open(log, "ab") as fh:  # (a second gzip member: read on as one stream)
        fh.write(b"[2025-11-12 05:10:00] The server is fired up and ready to roll!\n")


def _new_checkpoint_folder(run: Path) -> None:
    [default] = run.rglob("default")
    (default / "epoch0epochstep449globalstep449").mkdir()


def _checkpoint_time(run: Path) -> None:
    [default] = run.rglob("default")
    saved = default / "epoch0epochstep99globalstep99"
    os.utime(saved, (saved.stat().st_atime, saved.stat().st_mtime + 3600))


def _new_file(run: Path) -> None:
    (run / "notes.txt").write_text("looked at this on monday\n")


def _another_file_rewritten(run: Path) -> None:
    """A file no log is read from (discovery looked at it all the same)."""
    [version] = run.rglob("version.json")
    version.write_text(version.read_text() + " ")


def _a_new_link(run: Path) -> None:
    [default] = run.rglob("default")
    (default / "latest").symlink_to("epoch0epochstep99globalstep99")


@pytest.mark.parametrize("change", [_grow_a_log, _new_checkpoint_folder, _checkpoint_time, _new_file, _another_file_rewritten, _a_new_link])
def test_a_change_anywhere_in_the_analyzed_tree_runs_the_command_again(tmp_path: Path, run: Path, change) -> None:
    """What the run's tree holds changed after the record: the command runs, and says what a run
    with no cache at all says."""
    args = (run, "--no-html", "--json", tmp_path / "a.json")
    cache = tmp_path / "cache"
    assert analyze(*args, cache=cache)[0] == 0
    assert not analyze(*args, cache=cache)[3]  # (played back while nothing changed)
    change(run)
    again = analyze(*args, cache=cache)
    assert again[0] == 0 and again[3]
    document = json.loads((tmp_path / "a.json").read_text())
    assert analyze(run, "--no-html", "--json", tmp_path / "fresh.json", "--no-cache", cache=cache)[0] == 0
    fresh = json.loads((tmp_path / "fresh.json").read_text())
    assert document["runs"] == fresh["runs"]


@pytest.mark.parametrize("env", [{"COLUMNS": "100"}, {"NO_COLOR": "1"}, {"TZ": "Asia/Tokyo"}])
def test_another_terminal_or_setting_runs_the_command_again(tmp_path: Path, run: Path, env: dict[str, str]) -> None:
    cache = tmp_path / "cache"
    first = analyze(run, "--no-html", cache=cache)
    assert not analyze(run, "--no-html", cache=cache)[3]
    code, stdout, _, ran = analyze(run, "--no-html", cache=cache, env=env)
    assert code == 0 and ran
    if "COLUMNS" in env:  # (the summary's panels as wide as the terminal said)
        assert stdout != first[1]


def test_a_checkpoint_removed_from_the_save_folder_a_log_named_runs_the_command_again(tmp_path: Path) -> None:
    """A verl console copied off the box names its checkpoints' folder, outside the tree analyzed:
    the recommended checkpoint gone, the command runs and recommends another."""
    from verl_builder import VerlRunSpec, healthy_score, write_verl_run

    paths = write_verl_run(tmp_path / "train", VerlRunSpec(steps=40, file_logger=False, score=lambda s: 0.0 if s >= 25 else healthy_score(s)))
    logs = tmp_path / "logs_copy"
    logs.mkdir()
    shutil.copy2(paths.train_log, logs / "train.log")
    args, cache = (logs, "--no-html", "--json", tmp_path / "a.json"), tmp_path / "cache"

    def recommended() -> str | None:
        return json.loads((tmp_path / "a.json").read_text())["runs"][0]["recommendation"]["checkpoint"]

    analyze(*args, cache=cache)
    first = recommended()
    assert first and str(tmp_path / "train") in first
    assert not analyze(*args, cache=cache)[3]
    shutil.rmtree(first)
    assert analyze(*args, cache=cache)[3]
    assert recommended() != first


def test_an_output_folder_made_a_link_into_the_run_since_is_never_written_through(tmp_path: Path, run: Path) -> None:
    out, cache = tmp_path / "report", tmp_path / "cache"
    analyze(run, "--out", out, cache=cache)
    shutil.rmtree(out)
    out.symlink_to(run)
    before = tree_state(run)
    code, _, said, ran = analyze(run, "--out", out, cache=cache)
    assert (code, ran) == (2, True) and b"inside the analyzed path" in said
    assert tree_state(run) == before


@pytest.mark.parametrize("how", ["--no-cache", "a file", "nothing found", "two runs"])
def test_what_is_not_played_back_is_not_recorded(tmp_path: Path, run: Path, how: str) -> None:
    cache = tmp_path / "cache"
    if how == "--no-cache":
        args: tuple = (run, "--no-html", "--no-cache")
    elif how == "a file":
        [log] = run.rglob("trainer.log.gz")
        args = (log, "--no-html")
    elif how == "nothing found":
        (tmp_path / "empty").mkdir()
        args = (tmp_path / "empty", "--no-html")
    else:
        shutil.copytree(HANG, tmp_path / "other", symlinks=True)
        args = (run, tmp_path / "other", "--out", tmp_path / "fleet")
    first = analyze(*args, cache=cache)
    assert first[3]
    assert not (cache / "reruns").exists() or not any((cache / "reruns").iterdir())
    assert analyze(*args, cache=cache)[3]


def test_a_damaged_record_runs_the_command(tmp_path: Path, run: Path) -> None:
    cache = tmp_path / "cache"
    first = analyze(run, "--no-html", cache=cache)
    [record] = (cache / "reruns").iterdir()
    (record / "manifest.json").write_text("{not json")
    again = analyze(run, "--no-html", cache=cache)
    assert again[3] and again[:3] == first[:3]


def test_run_from_another_folder_it_is_another_command(tmp_path: Path, run: Path) -> None:
    """``--out rep`` names another folder from elsewhere: not played back there."""
    cache = tmp_path / "cache"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    analyze(run, "--out", "rep", cache=cache, cwd=tmp_path / "a")
    played = analyze(run, "--out", "rep", cache=cache, cwd=tmp_path / "a")
    elsewhere = analyze(run, "--out", "rep", cache=cache, cwd=tmp_path / "b")
    assert not played[3] and elsewhere[3]
    assert (tmp_path / "b" / "rep" / "report.html").read_bytes() == (tmp_path / "a" / "rep" / "report.html").read_bytes()


def test_best_checkpoint_again_is_played_back_until_its_checkpoint_is_gone(tmp_path: Path, run: Path) -> None:
    cache = tmp_path / "cache"
    first = analyze(run, cache=cache, command="best-checkpoint")
    checkpoint = Path(first[1].decode().strip())
    assert first[0] == 0 and checkpoint.is_dir() and first[3]
    again = analyze(run, cache=cache, command="best-checkpoint")
    assert again[:3] == first[:3] and not again[3]
    shutil.rmtree(checkpoint)
    after = analyze(run, cache=cache, command="best-checkpoint")
    assert after[3] and after[0] == 0 and Path(after[1].decode().strip()) != checkpoint
