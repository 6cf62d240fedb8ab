"""Rotated and compressed parts of a trainer log, by every name the tools that rotate logs give
them: logrotate (``dateext``, ``compresscmd`` xz, bzip2 or zstd), Python's ``TimedRotatingFileHandler``,
a copy moved aside as ``.old``. Each is the run's earlier steps, read before the live log; a part
that cannot be read is named, never dropped without a word. A log given by name is judged by its
content, whatever its name.
"""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import shutil
import subprocess
from pathlib import Path

import polars as pl
import pytest
from areal_builder import RunSpec, healthy_reward, write_run
from typer.testing import CliRunner

from forensics import analyze
from forensics.cli import app

runner = CliRunner()
ZSTD = shutil.which("zstd")


def _zstd(data: bytes) -> bytes:
    return subprocess.run([ZSTD or "zstd", "-q", "-c"], input=data, capture_output=True, check=True).stdout


COMPRESS = {".xz": lzma.compress, ".bz2": bz2.compress, ".gz": gzip.compress, ".zst": _zstd, "": bytes}


def _rotated_run(tmp_path: Path, names: tuple[str, str]):
    """A run collapsing at step 30, its log rotated before steps 21 and 41 into ``names``."""
    paths = write_run(tmp_path / "outputs", RunSpec(last_step=60, save_freq_steps=10,
                                                    reward=lambda s: 0.0 if s >= 30 else healthy_reward(s)))
    text = paths.trainer_log.read_bytes()
    cuts = [text.rindex(b"\n", 0, text.index(f"Train step {n}/".encode())) + 1 for n in (21, 41)]
    parts = [text[: cuts[0]], text[cuts[0] : cuts[1]], text[cuts[1] :]]
    for name, part in zip(names, parts[:2], strict=True):
        (paths.log_dir / name).write_bytes(COMPRESS[next((z for z in COMPRESS if z and name.endswith(z)), "")](part))
    paths.trainer_log.write_bytes(parts[2])
    return paths


@pytest.mark.parametrize("names", [
    ("trainer.log-20251109.gz", "trainer.log-20251110"),  # (logrotate's dateext, the default on Debian and RHEL)
    ("trainer.log-2025110923.gz", "trainer.log-2025111001.gz"),
    ("trainer.log.2.xz", "trainer.log.1.xz"),
    ("trainer.log.2.bz2", "trainer.log.1.bz2"),
    pytest.param(("trainer.log.2.zst", "trainer.log.1.zst"), marks=pytest.mark.skipif(ZSTD is None, reason="no zstd program")),
    ("trainer.log.2025-11-09", "trainer.log.2025-11-10"),
    ("trainer.log.2025-11-10_08", "trainer.log.2025-11-10_09.xz"),
    ("trainer.log.2025-11-10_08-15-00.gz", "trainer.log.old"),
])
def test_rotated_parts_by_any_tools_names_are_the_runs_earlier_steps(tmp_path: Path, names: tuple[str, str]) -> None:
    paths = _rotated_run(tmp_path, names)
    [run] = analyze([paths.fileroot]).runs
    trainer = [Path(s.path).name for s in run.sources if s.kind == "areal_trainer"]
    assert trainer == [*names, "trainer.log"]
    assert run.step_range() == {"first": 1, "last": 60, "count": 60}
    assert [(i.kind, i.onset_step) for i in run.incidents] == [("reward_collapse", 30)]
    assert run.recommendation.step == 20


def test_a_whole_log_compressed_with_xz_is_read(tmp_path: Path) -> None:
    paths = write_run(tmp_path / "outputs", RunSpec(last_step=40, reward=lambda s: 0.0 if s >= 30 else healthy_reward(s)))
    packed = paths.trainer_log.with_name("trainer.log.xz")
    packed.write_bytes(lzma.compress(paths.trainer_log.read_bytes()))
    paths.trainer_log.unlink()
    [run] = analyze([paths.fileroot]).runs
    assert [Path(s.path).name for s in run.sources if s.kind == "areal_trainer"] == ["trainer.log.xz"]
    assert [(i.kind, i.onset_step) for i in run.incidents] == [("reward_collapse", 30)]
    # the onset cites the compressed file's own line, read back from it
    onset = run.incidents[0].onset_evidence
    assert Path(onset.file).name == "trainer.log.xz" and onset.text
    line = lzma.decompress(packed.read_bytes()).decode().split("\n")[onset.line - 1]
    assert "task_reward/avg" in onset.text and "task_reward/avg" in line and "0.0000e+00" in line


@pytest.mark.parametrize("suffix", [".xz", ".bz2"])
def test_a_torn_compressed_part_reads_as_a_shorter_log_and_says_so(tmp_path: Path, suffix: str) -> None:
    paths = _rotated_run(tmp_path, (f"trainer.log.2{suffix}", f"trainer.log.1{suffix}"))
    torn = paths.log_dir / f"trainer.log.1{suffix}"
    torn.write_bytes(torn.read_bytes()[: torn.stat().st_size * 2 // 3])
    [run] = analyze([paths.fileroot]).runs
    [source] = [s for s in run.sources if Path(s.path).name == torn.name]
    codec = {".xz": "xz", ".bz2": "bzip2"}[suffix]
    assert any(note.startswith(f"{codec} stream cut off after ") for note in source.notes), source.notes
    assert run.step_range()["last"] == 60


def test_a_zstd_part_with_no_zstd_program_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Python 3.11 reads no zstd: the ``zstd`` program does. Without it the part is named as
    skipped, and the run is not judged as if the live log were all of it without a word."""
    paths = _rotated_run(tmp_path, ("trainer.log.2", "trainer.log.1"))
    for name in ("trainer.log.2", "trainer.log.1"):  # (zstd's magic: what a zstd file starts with)
        (paths.log_dir / f"{name}.zst").write_bytes(b"\x28\xb5\x2f\xfd" + b"\0" * 64)
        (paths.log_dir / name).unlink()
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    out = tmp_path / "report"
    result = runner.invoke(app, ["analyze", str(paths.fileroot), "--no-cache", "--out", str(out), "--json", str(out / "a.json")])
    said = " ".join(result.output.split())
    assert "trainer.log.1.zst: compressed with zstd, and no zstd program is installed here" in said
    [run] = json.loads((out / "a.json").read_text())["runs"]
    [skipped] = [s for s in run["sources"] if Path(s["path"]).name == "trainer.log.2.zst"]
    assert skipped["kind"] == "unreadable" and "compressed with zstd" in skipped["notes"][0]


@pytest.mark.parametrize("name", ["trainer (1).log", "trainer.log.bak", "trainer.log.2025-11-11", "run-7 copy.txt"])
def test_a_log_given_by_name_is_read_whatever_its_name(tmp_path: Path, name: str) -> None:
    paths = write_run(tmp_path / "outputs", RunSpec(last_step=40, reward=lambda s: 0.0 if s >= 30 else healthy_reward(s)))
    given = tmp_path / "downloads" / name
    given.parent.mkdir()
    shutil.copyfile(paths.trainer_log, given)
    result = runner.invoke(app, ["events", str(given), "--no-cache", "--kind", "reward_zero"])
    assert result.exit_code == 0, result.output
    [run] = analyze([given]).runs
    assert [(i.kind, i.onset_step) for i in run.incidents] == [("reward_collapse", 30)]


def test_a_document_quoting_a_log_given_by_name_is_no_run(tmp_path: Path) -> None:
    """A README that quotes a run's log lines is a document, not a log, though given by name."""
    paths = write_run(tmp_path / "outputs", RunSpec(last_step=40, reward=lambda s: 0.0 if s >= 30 else healthy_reward(s)))
    readme = tmp_path / "README.md"
    readme.write_text("# What happened\n\n" + paths.trainer_log.read_text())
    result = runner.invoke(app, ["events", str(readme), "--no-cache"])
    assert result.exit_code == 2 and "no training run found" in result.output


@pytest.mark.parametrize(("cut", "what"), [
    (1, "after step 30's header, cut off before its table"),  # (the header alone)
    (3, "after step 30's header, cut off before its table"),  # (its table announced, not begun)
    (7, "inside step 30's table"),  # (before the reward's row)
    (18, "inside step 30's table"),  # (after it)
])
def test_a_table_a_rotation_cut_is_read_as_one(tmp_path: Path, cut: int, what: str) -> None:
    """logrotate's ``copytruncate`` cuts the log within a step's header and table: the rest opens
    the next part. The step keeps all its values, so the collapse starts at its step, cited at
    the reward's own row; neither part is said to be cut off or to hold rows of no step."""
    paths = write_run(tmp_path / "outputs", RunSpec(last_step=40, save_freq_steps=10,
                                                    reward=lambda s: 0.0 if s >= 30 else healthy_reward(s)))
    lines = paths.trainer_log.read_text().splitlines(keepends=True)
    header = next(i for i, line in enumerate(lines) if "Train step 30/" in line)
    reward = next(i for i in range(header, len(lines)) if "task_reward/avg" in lines[i])
    (paths.log_dir / "trainer.log.1.gz").write_bytes(gzip.compress("".join(lines[: header + cut]).encode()))
    paths.trainer_log.write_text("".join(lines[header + cut :]))
    [run] = analyze([paths.fileroot]).runs
    [incident] = run.incidents
    assert incident.onset_step == 30 and run.recommendation.step == 20
    where = incident.onset_evidence
    cited = ("trainer.log.1.gz", reward + 1) if header + cut > reward else ("trainer.log", reward - header - cut + 1)
    assert (Path(where.file).name, where.line) == cited and "task_reward/avg" in where.text
    notes = {Path(s.path).name: s.notes for s in run.sources}
    assert notes["trainer.log.1.gz"] == ("the log's last table (step 30) goes on at the head of trainer.log (a rotation cut it): read as one",)
    assert len(notes["trainer.log"]) == 1 and notes["trainer.log"][0].endswith("are the rest of step 30's table in trainer.log.1.gz: read as that step's")
    whole = analyze([write_run(tmp_path / "whole", RunSpec(last_step=40, reward=lambda s: 0.0 if s >= 30 else healthy_reward(s))).fileroot]).runs[0]
    assert run.metrics.filter(pl.col("step") == 30).height == whole.metrics.filter(pl.col("step") == 30).height
    # the part alone says where it ends
    from parsers.areal import read_areal_log
    assert f"the log ends {what}" in " ".join(read_areal_log(paths.log_dir / "trainer.log.1.gz").notes)


def test_a_gzipped_copy_holding_more_than_the_log_beside_it_is_the_one_read(tmp_path: Path) -> None:
    """``trainer.log.gz`` holds the whole run (80 steps, the collapse at 60), ``trainer.log`` its
    first 30 (a wrapper gzipped the log and began it again): the copy holding more is read, the
    other said; an identical copy is read once, from the log. A copy appearing after a cached
    analysis is seen."""
    paths = write_run(tmp_path / "outputs", RunSpec(last_step=80, save_freq_steps=10,
                                                    reward=lambda s: 0.0 if s >= 60 else healthy_reward(s)))
    whole = paths.trainer_log.read_bytes()
    paths.trainer_log.write_bytes(whole[: whole.index(b"Train step 31/")].rsplit(b"\n", 1)[0] + b"\n")
    cache = tmp_path / "cache"
    first = runner.invoke(app, ["analyze", str(paths.fileroot), "--no-html", "--json", "-", "--cache-dir", str(cache)])
    assert json.loads(first.stdout)["runs"][0]["steps"]["last"] == 30
    (paths.log_dir / "trainer.log.gz").write_bytes(gzip.compress(whole))
    done = runner.invoke(app, ["analyze", str(paths.fileroot), "--no-html", "--json", "-", "--cache-dir", str(cache)])
    run = json.loads(done.stdout)["runs"][0]
    assert run["steps"]["last"] == 80 and [i["onset_step"] for i in run["incidents"]] == [60]
    assert {Path(s["path"]).name: s["kind"] for s in run["sources"]}["trainer.log"] == "copy"
    paths.trainer_log.write_bytes(whole)
    [again] = analyze([paths.fileroot]).runs
    assert {Path(s.path).name: s.kind for s in again.sources}["trainer.log.gz"] == "copy"
    # ``gzip -c trainer.log > trainer.log.gz; : > trainer.log`` at step 40, training going on into
    # the log: no copy, the log's earlier part (larger, yet beginning elsewhere): both read, in order.
    cut = whole.rindex(b"\n", 0, whole.index(b"Train step 41/")) + 1
    (paths.log_dir / "trainer.log.gz").write_bytes(gzip.compress(whole[:cut]))
    paths.trainer_log.write_bytes(whole[cut:])
    [parts] = analyze([paths.fileroot]).runs
    assert [Path(s.path).name for s in parts.sources if s.kind == "areal_trainer"] == ["trainer.log.gz", "trainer.log"]
    assert parts.step_range()["last"] == 80 and [i.onset_step for i in parts.incidents] == [60]
