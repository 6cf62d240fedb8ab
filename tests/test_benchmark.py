"""The benchmark command, run as the README gives it, on a set small enough for the suite.

Its numbers are not judged here (speed targets live in the benchmark, not in timed tests): the
test holds the command to running from a clean checkout and printing every table it promises.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_benchmark_prints_every_table_on_a_small_set(tmp_path: Path) -> None:
    report = tmp_path / "report.md"
    # (blocks of 600 steps, not 1870: the blocks are built with tabulate, a third of the time)
    command = [sys.executable, "benchmarks/bench.py", "--size-gb", "0.1", "--scaling", "0.05,0.1", "--busy-scaling", "0.05,0.1",
               "--worker-scaling", "0.01,0.02,0.05", "--fleet-scaling", "2,4", "--files-scaling", "20,40", "--flood-scaling", "0.01,0.02",
               "--dir", str(tmp_path / "sets"), "--skip-lnav", "--loop-mb", "5", "--copy-steps", "200", "--block-steps", "600",
               "--report", str(report)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    text = report.read_text()

    assert "is not the cold run's" not in text
    for row in ("`grep -cE", "analyze --no-html` cold (empty cache)", "analyze --no-html` again (cached)", "another `--json FILE`",
                "cold, with the HTML report", "skipped (--skip-lnav)", "line-by-line Python regex parser"):
        assert row in text, row
    assert "| target | measured | met | the least Polars parse alone |" in text
    assert "| cold analyze ≥ 50 % of grep's throughput |" in text and "| peak RSS < 1.5 GB |" in text
    # The analysis found the incident the set was built with, and only it (the healthy blocks,
    # repeated, join without a fall).
    [(onset, end)] = re.findall(r"incidents: reward_collapse@(\d+)→(\d+) \(inference_server_unresponsive\);", text)
    assert int(end) - int(onset) == 100 and int(onset) % 600 == 600 - 470  # (in the blocks of 600 steps asked for)
    for row in ("AReaL parser, trainer.log", "SGLang parser, llm_server.log", "Ray parser, session folder", "Polars floor",
                "W&B reader on a copy of the run's metrics", "TensorBoard reader on a copy", "verl JSONL reader on a copy"):
        assert f"| {row}" in text, row
    assert "The least Polars parse (`LEAST`" in text and "every run pays to start Python" in text
    # The three growth tables, each with its verdicts on time and memory.
    assert "### Growth with the run's length" in text and "### Growth with the server's traffic" in text
    assert "### Growth with one file" in text
    assert text.count("Time: s/GB") == 3 and text.count("Memory: peak RSS") == 3
    # (0.01 and 0.02 GB are both one block of steps: the second is said and skipped, not divided by)
    assert text.count("the same set as a size before") == 1
    # And a fleet's: the calling process's peak at each number of runs, and its verdict.
    assert "### Growth with a fleet's number of runs" in text and "| 4 | " in text and "Calling process: ×" in text
    assert "### Growth with a Ray session's number of files" in text and text.count("ms a file at") == 1
    assert "### Growth with the events a log holds" in text and "| 20,000 | " in text and "bytes more an event" in text
    assert not (tmp_path / "sets").exists() or not any((tmp_path / "sets").iterdir())  # no --keep: the sets are gone


def test_reuse_takes_only_a_set_this_version_of_the_script_wrote(tmp_path: Path) -> None:
    """A set kept before the generator changed (its healthy blocks a learning curve, which fell back
    at every block) would be timed as if it were today's: it is written again instead."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench  # noqa: PLC0415

    assert bench.kept_set(tmp_path) is None
    (tmp_path / "set.json").write_text('{"size_gb": 3.0, "bytes": {"trainer": 1}}')  # (before sets had a version)
    assert bench.kept_set(tmp_path) is None
    (tmp_path / "set.json").write_text(f'{{"size_gb": 3.0, "bytes": {{"trainer": 1}}, "version": {bench.SET_VERSION}}}')
    assert bench.kept_set(tmp_path) == {"size_gb": 3.0, "bytes": {"trainer": 1}, "version": bench.SET_VERSION}
    # A set of blocks of another size is another set (its steps, incident and checkpoints differ).
    (tmp_path / "set.json").write_text(f'{{"size_gb": 3.0, "version": {bench.SET_VERSION}, "block_steps": 600}}')
    assert bench.kept_set(tmp_path) is None
    assert bench.kept_set(tmp_path, 600) == {"size_gb": 3.0, "version": bench.SET_VERSION, "block_steps": 600}
