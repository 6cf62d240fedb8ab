"""``analyze`` over many runs: in parallel on local processes and on a real local Ray, one index.

The same set of runs — incident fixtures, a healthy run and a copy of it (one run id twice), the
seed 003 loop and a run whose experiment name is an HTML payload — goes through both backends
once per module; each backend's index must agree with a plain single-run ``analyze --json``.
Ray runs as a user runs it: the CLI in a subprocess, with its own ``HOME`` and a short temp dir
(see ``test_real_ray.py``). About 10 s for Ray.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
from areal_builder import RunSpec, healthy_reward, write_run
from conftest import FIXTURES, tree_state
from typer.testing import CliRunner

from forensics.cli import app
from forensics.model import iso

REPO = Path(__file__).resolve().parents[1]
HOSTILE = "<img src=x onerror=alert(1)>&\"'"
HAS_RAY = importlib.util.find_spec("ray") is not None
runner = CliRunner()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The fleet's paths: fixtures relative to the repository (as a user types them), built runs absolute."""
    built = tmp_path_factory.mktemp("runs")
    write_run(built / "hostile" / "outputs", RunSpec(experiment=HOSTILE, last_step=40, save_freq_steps=10,
                                                     reward=lambda s: 0.0 if s >= 30 else healthy_reward(s)))
    shutil.copytree(FIXTURES / "areal_healthy_sparse" / "outputs", built / "copy" / "outputs")
    fixtures = [Path("tests/fixtures", name, "outputs") for name in ("areal_seed000", "areal_seed001",
                                                                     "areal_healthy_sparse", "sglang_oom")]
    return [*fixtures, Path("tests/fixtures/seed003"), built / "copy" / "outputs", built / "hostile" / "outputs"]


@pytest.fixture(scope="module")
def before(runs: list[Path]) -> dict[str, tuple[str, int, int]]:
    return {k: v for path in runs for k, v in tree_state(REPO / path).items()}


@pytest.fixture(scope="module")
def singles(runs: list[Path], before, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Each path through a plain single-run ``analyze --json``: run object by root."""
    out = tmp_path_factory.mktemp("single")
    found = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(REPO)
        for k, path in enumerate(runs):
            doc = out / f"{k}.json"
            result = runner.invoke(app, ["analyze", str(path), "--json", str(doc), "--no-html", "--no-cache"])
            assert result.exit_code == 0, result.output
            [run] = json.loads(doc.read_text())["runs"]
            found[run["root"]] = run
    return found


@pytest.fixture(scope="module", params=["processes", pytest.param("ray", marks=pytest.mark.skipif(not HAS_RAY, reason="ray is not installed"))])
def fleet(request: pytest.FixtureRequest, runs: list[Path], before, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict, str]]:
    """(out dir, --json document, terminal output) of one fleet run on each backend."""
    out = tmp_path_factory.mktemp(request.param)
    args = ["analyze", *map(str, runs), "--out", str(out / "report"), "--json", str(out / "doc.json"), "--no-cache"]
    if request.param == "processes":
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(REPO)
            result = runner.invoke(app, [*args, "--workers", "2"], env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        yield out / "report", json.loads((out / "doc.json").read_text()), result.output
        return
    temp_root = Path(tempfile.mkdtemp(prefix="rf-", dir="/tmp"))  # unix socket paths are limited to ~107 bytes
    home = out / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env |= {"HOME": str(home), "RAY_TMPDIR": str(temp_root), "RAY_USAGE_STATS_ENABLED": "0", "COLUMNS": "200"}
    try:
        done = subprocess.run([sys.executable, "-m", "forensics", *args, "--ray"], env=env, cwd=REPO,
                              capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        yield out / "report", json.loads((out / "doc.json").read_text()), done.stdout
    finally:
        shutil.rmtree(temp_root, ignore_errors=True)


def test_index_rows_match_single_run_analysis(fleet, singles: dict[str, dict]) -> None:
    out, _, _ = fleet
    index = pl.read_parquet(out / "index.parquet")
    assert index.height == len(singles) and index["error"].null_count() == index.height
    assert index["slug"].n_unique() == index.height
    for row in index.iter_rows(named=True):
        single = singles[row["root"]]
        incidents = single["incidents"]
        assert row["run_id"] == single["run_id"]
        assert row["n_incidents"] == len(incidents)
        assert (row["first_onset_step"], row["first_cause"]) == (
            (incidents[0]["onset_step"], incidents[0]["cause"]) if incidents else (None, None))
        assert (row["checkpoint"], row["checkpoint_step"]) == (single["recommendation"]["checkpoint"], single["recommendation"]["step"])
        assert (row["first_step"], row["last_step"], row["step_count"]) == tuple(single["steps"].values())
    by_root = dict(zip(index["slug"], index["root"]))
    incidents = pl.read_parquet(out / "incidents.parquet")
    assert incidents.height == sum(len(s["incidents"]) for s in singles.values())
    for row in incidents.iter_rows(named=True):
        [expected] = [i for i in singles[by_root[row["slug"]]]["incidents"] if i["id"] == row["id"]]
        for key in ("kind", "metric", "onset_step", "end_step", "recovered", "cause", "confidence", "wasted_steps"):
            assert row[key] == expected[key], key
        assert iso(row["onset_time"]) == expected["onset_time"]


def test_known_verdicts_in_the_index(fleet) -> None:
    out, _, _ = fleet
    index = pl.read_parquet(out / "index.parquet")
    got = {r["root"]: (r["first_onset_step"], r["first_cause"]) for r in index.iter_rows(named=True)}
    expected = {"areal_seed000": (940, "inference_server_unresponsive"), "areal_seed001": (188, "inference_server_crash"),
                "sglang_oom": (180, "inference_server_oom"), "areal_healthy_sparse": (None, None),
                "seed003": (1, "reward_pipeline")}
    for name, verdict in expected.items():
        [hit] = [v for root, v in got.items() if f"{root}/".startswith(f"tests/fixtures/{name}/")]
        assert hit == verdict, name


def test_json_document_holds_every_run_as_a_single_analysis_would(fleet, singles: dict[str, dict]) -> None:
    _, doc, _ = fleet
    assert doc["schema"] == "grpo-forensics/analysis/v1"
    assert {r["root"]: r for r in doc["runs"]} == singles


def test_index_html_links_every_run_to_its_written_report(fleet) -> None:
    out, _, output = fleet
    page = (out / "index.html").read_text()
    index = pl.read_parquet(out / "index.parquet")
    links = set(re.findall(r'href="([^"#]+)(?:#([^"]*))?"', page))
    reports = {href for href, _ in links if href.startswith("runs/")}
    assert reports == set(index["report"]) and len(reports) == index.height
    for href, anchor in links:
        if not href.startswith("runs/"):
            continue
        target = (out / href).read_text()
        assert target.startswith("<!DOCTYPE html>")
        assert not anchor or f'id="{anchor}"' in target
    assert not re.search(r"""<(?:script|link|img)[^>]+(?:src|href)=["']https?://""", page)
    assert 'http-equiv="Content-Security-Policy"' in page
    assert "seed003" in output and "inference_server_oom" in output  # the terminal table


def test_hostile_run_name_is_text_everywhere(fleet) -> None:
    out, _, output = fleet
    index = pl.read_parquet(out / "index.parquet")
    [row] = index.filter(pl.col("run_id").str.starts_with("<img")).iter_rows(named=True)
    assert row["run_id"] == f"{HOSTILE}/trial0"
    assert re.fullmatch(r"[A-Za-z0-9._-]+", row["slug"])
    page = (out / "index.html").read_text()
    assert "<img src=x" not in page and "&lt;img src=x onerror=alert(1)&gt;&amp;&quot;&#x27;/trial0" in page
    assert "<img src=x" not in (out / row["report"]).read_text()
    assert f"{HOSTILE}/trial0" in output  # printed as text


def test_copies_of_one_run_get_their_own_reports(fleet, runs: list[Path]) -> None:
    out, _, output = fleet
    index = pl.read_parquet(out / "index.parquet").filter(pl.col("run_id") == "countdown-grpo/trial1")
    assert sorted(index["slug"]) == ["countdown-grpo-trial1", "countdown-grpo-trial1-2"]
    assert all((out / report).is_file() for report in index["report"])
    # Named apart by the folders that differ, in the terminal and on the index page.
    copy = runs[-2].parent
    page = (out / "index.html").read_text()
    for label in ("countdown-grpo/trial1 (tests/fixtures/areal_healthy_sparse)", f"countdown-grpo/trial1 ({copy})"):
        assert label in output and f">{label}</a>" in page


def test_run_labels_name_runs_that_share_an_id_by_what_sets_their_folders_apart() -> None:
    from reports.labels import run_labels

    ids = ["gsm8k/trial0", "gsm8k/trial0", "other/trial0", "gsm8k/trial0"]
    roots = ["/runs/lr-1e-6/outputs/logs/gsm8k/trial0", "/runs/lr-3e-6/outputs/logs/gsm8k/trial0",
             "/runs/x/outputs/logs/other/trial0", "/elsewhere/lr-1e-6/outputs/logs/gsm8k/trial0"]
    assert run_labels(ids, roots) == ["gsm8k/trial0 (runs/lr-1e-6)", "gsm8k/trial0 (runs/lr-3e-6)",
                                      "other/trial0", "gsm8k/trial0 (elsewhere/lr-1e-6)"]
    assert run_labels(ids[:2], roots[:2]) == ["gsm8k/trial0 (lr-1e-6)", "gsm8k/trial0 (lr-3e-6)"]
    assert run_labels(["a/t", "a/t"], ["runs/a/t", "runs/a/t"]) == ["a/t (copy 1)", "a/t (copy 2)"]
    assert run_labels(["a/t", "a/t"], ["runs/a/t", "/abs/runs/a/t"]) == ["a/t (runs)", "a/t (/abs/runs)"]
    assert run_labels(["a/t", "a/t"], ["/r/a/t", "/r/a/t/more/a/t"]) == ["a/t (t)", "a/t (t/more/a/t)"]


def test_fleet_writes_nothing_in_the_analyzed_trees(fleet, runs: list[Path], before) -> None:
    assert {k: v for path in runs for k, v in tree_state(REPO / path).items()} == before


def test_no_html_markdown_and_fail_on_incident(fixture_run, tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["analyze", str(fixture_run("areal_healthy_sparse")), str(fixture_run("sglang_oom")), "--out", str(out),
            "--no-html", "--markdown", "-", "--no-cache", "--workers", "2"]
    sick = runner.invoke(app, [*args, "--fail-on-incident"])
    assert sick.exit_code == 1, sick.output
    assert "countdown-grpo/trial1" in sick.stdout and "gsm8k-grpo-oom/trial0" in sick.stdout
    assert sorted(p.name for p in out.iterdir()) == ["incidents.parquet", "index.parquet"]
    healthy = runner.invoke(app, ["analyze", str(fixture_run("areal_healthy_sparse")), "--workers", "1", "--out",
                                  str(tmp_path / "one"), "--no-cache", "--fail-on-incident"])
    assert healthy.exit_code == 0, healthy.output  # --workers makes even one run a fleet
    assert (tmp_path / "one" / "runs" / "countdown-grpo-trial1" / "report.html").is_file()


def test_a_run_that_cannot_be_read_is_a_row_not_the_end(fixture_run, tmp_path: Path, monkeypatch) -> None:
    for name in [k for k in os.environ if k.startswith("WANDB_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / ".config"))
    result = runner.invoke(app, ["analyze", str(fixture_run("areal_healthy_sparse")), "--wandb", "entity/project/run123",
                                 "--out", str(tmp_path / "out"), "--no-cache"])
    assert result.exit_code == 2, result.output
    assert "entity/project/run123" in result.stderr and "Traceback" not in result.output
    index = pl.read_parquet(tmp_path / "out" / "index.parquet")
    assert index["error"].null_count() == 1 and index.height == 2
    assert (tmp_path / "out" / "runs" / "countdown-grpo-trial1" / "report.html").is_file()


def test_a_path_with_no_run_is_said_not_left_out(fixture_run, tmp_path: Path) -> None:
    """One folder of a team's runs holds nothing readable: a failed row of the index (fleet) or a
    line on stderr (one run beside it), exit 2 — the runs found are still analyzed."""
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "trainer.log").write_bytes(bytes(range(256)) * 64)
    (tmp_path / "empty").mkdir()
    runs = [str(fixture_run("areal_healthy_sparse")), str(fixture_run("sglang_hang"))]
    fleet = runner.invoke(app, ["analyze", *runs, str(tmp_path / "junk"), str(tmp_path / "empty"), "--workers", "1",
                                "--out", str(tmp_path / "out"), "--no-cache", "--no-html"])
    assert fleet.exit_code == 2, fleet.output
    index = pl.read_parquet(tmp_path / "out" / "index.parquet")
    failed = index.filter(pl.col("error").is_not_null())
    assert index.height == 4 and sorted(failed["run_id"]) == [str(tmp_path / "empty"), str(tmp_path / "junk")]
    # Each row says why, as the path given alone would: the junk log is named.
    why = dict(failed.select("run_id", "error").iter_rows())
    assert why[str(tmp_path / "empty")].startswith("no training run found (looked for AReaL")
    assert f"skipped {tmp_path / 'junk' / 'trainer.log'}: named like a trainer or server log" in why[str(tmp_path / "junk")]
    one = runner.invoke(app, ["analyze", runs[0], str(tmp_path / "empty"), "--no-cache", "--no-html",
                              "--json", str(tmp_path / "one.json")])
    assert one.exit_code == 2 and f"{tmp_path / 'empty'}: no training run found" in one.stderr
    assert len(json.loads((tmp_path / "one.json").read_text())["runs"]) == 1


def test_a_run_with_nothing_to_judge_is_not_counted_healthy(fixture_run, tmp_path: Path) -> None:
    """A log with a CUDA OOM and no training step: no incident can be placed, but the run is not
    healthy either — the index, its page and the terminal say 'not judged' and why."""
    console = tmp_path / "console" / "driver.log"
    console.parent.mkdir()
    console.write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n")
    result = runner.invoke(app, ["analyze", str(fixture_run("areal_healthy_sparse")), str(console), "--workers", "1",
                                 "--out", str(tmp_path / "out"), "--no-cache"])
    assert result.exit_code == 0, result.output
    index = pl.read_parquet(tmp_path / "out" / "index.parquet").sort("run_id")
    assert index["n_incidents"].to_list() == [0, 0]
    [caveat] = index["caveat"].drop_nulls().to_list()
    assert "no training step was logged" in caveat and "cuda_oom" in caveat
    page = (tmp_path / "out" / "index.html").read_text()
    assert "0 with incidents · 1 healthy · 1 not judged" in page
    assert "1 not judged" in " ".join(result.output.split())


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the workers through /proc")
def test_a_killed_worker_fails_no_run_but_its_own(fixture_run, tmp_path: Path) -> None:
    """The OOM killer takes one worker: the pool breaks and every run still in it would fail. The
    runs go again, each in a pool of its own; here nothing was wrong with them, so all are analyzed."""
    import signal
    import subprocess
    import sys
    import time

    runs = [str(fixture_run(name)) for name in ("areal_seed000", "areal_healthy_sparse", "sglang_hang", "sglang_oom")]
    child = subprocess.Popen([sys.executable, "-m", "forensics", "analyze", *runs, "--workers", "2", "--no-cache",
                              "--no-html", "--out", str(tmp_path / "out")], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline, killed = time.monotonic() + 60, None
    while killed is None and child.poll() is None and time.monotonic() < deadline:
        workers = [p for p in _children(child.pid) if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]
        if workers:
            os.kill(workers[0], signal.SIGKILL)
            killed = workers[0]
        time.sleep(0.01)
    _, stderr = child.communicate(timeout=300)
    assert killed is not None, "no worker seen"
    assert child.returncode == 0, stderr.decode()[-2000:]
    index = pl.read_parquet(tmp_path / "out" / "index.parquet")
    assert index.height == 4 and index["error"].null_count() == 4


def test_a_fleet_from_a_folder_workers_cannot_start_in_runs_in_this_process(fixture_run, tmp_path: Path) -> None:
    """Spawned workers start in the caller's folder: one deleted (or one the user cannot enter, as
    after ``su nobody`` from /root) killed every worker, each run misreported as out of memory."""
    gone, runs = tmp_path / "gone", [str(fixture_run("areal_seed000")), str(fixture_run("areal_healthy_sparse"))]
    gone.mkdir()
    script = ("import os, sys; os.chdir(sys.argv[1]); os.rmdir(sys.argv[1]); from forensics.cli import app; "
              "app(sys.argv[2:], prog_name='grpo-forensics')")
    done = subprocess.run([sys.executable, "-c", script, str(gone), "analyze", *runs, "--workers", "2", "--no-cache",
                           "--no-html", "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "on this process (worker processes could not start in the current folder)" in " ".join(done.stdout.split())
    index = pl.read_parquet(tmp_path / "out" / "index.parquet")
    assert index.height == 2 and index["error"].null_count() == 2


def test_custom_format_reaches_the_workers(tmp_path: Path) -> None:
    from forensics.fleet import analyze_fleet

    for name in ("a", "b"):
        lines = [f"2025-06-01 14:{s // 60:02d}:{s % 60:02d} | step {s} | reward={0.0 if s >= 30 else 0.4 + s % 5 / 10:.4f} "
                 f"reward_std=0.2000 loss=-0.0100 grad_norm=0.50" for s in range(1, 41)]
        (tmp_path / name).mkdir()
        (tmp_path / name / "train.log").write_text("\n".join(lines) + "\n")
    result = analyze_fleet([tmp_path / "a", tmp_path / "b"], tmp_path / "out", workers=2, html=False,
                           custom_format=FIXTURES / "custom_format_example.toml")
    assert [r.run["incidents"][0]["onset_step"] for r in result.runs if r.run] == [30, 30]
    assert result.page is None and result.index.is_file()


def test_ray_missing_is_a_one_line_error(fixture_run, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)
    result = runner.invoke(app, ["analyze", str(fixture_run("areal_healthy_sparse")), "--ray", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "ray" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


@pytest.mark.skipif(not HAS_RAY, reason="ray is not installed")
def test_unreachable_ray_address_fails_fast(fixture_run, tmp_path: Path) -> None:
    result = runner.invoke(app, ["analyze", str(fixture_run("areal_healthy_sparse")), "--ray-address", "127.0.0.1:1",
                                 "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "no Ray cluster at 127.0.0.1:1" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


@pytest.mark.skipif(not HAS_RAY, reason="ray is not installed")
def test_an_unreachable_ray_address_left_in_the_environment_fails_fast(fixture_run, tmp_path: Path, monkeypatch) -> None:
    """``--ray`` with RAY_ADDRESS left from a cluster torn down: said at once, as for ``--ray-address``."""
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    started = time.monotonic()
    result = runner.invoke(app, ["analyze", str(fixture_run("areal_healthy_sparse")), "--ray", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and time.monotonic() - started < 30
    assert "no Ray cluster at 127.0.0.1:1 (RAY_ADDRESS)" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_an_out_whose_runs_folder_holds_the_analyzed_runs_is_refused(tmp_path: Path, monkeypatch) -> None:
    """``analyze runs/* --out .`` from the folder holding ``runs/``: each run's report would go in
    ``runs/<its name>/`` — inside the run just read. Refused before any work; nothing written."""
    for name in ("exp1", "exp2"):
        (tmp_path / "runs" / name).mkdir(parents=True)
        shutil.copy(FIXTURES / "seed003" / "train.log", tmp_path / "runs" / name)
    before = tree_state(tmp_path / "runs")
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["analyze", "runs/exp1", "runs/exp2", "--out", ".", "--no-cache"])
    assert result.exit_code == 2 and "which holds the analyzed path" in result.stderr, result.output
    assert tree_state(tmp_path / "runs") == before and not (tmp_path / "index.html").exists()


def test_out_inside_an_analyzed_tree_is_refused(fixture_run, tmp_path: Path) -> None:
    from forensics.errors import UnusableInput
    from forensics.fleet import analyze_fleet

    root = fixture_run("areal_healthy_sparse")
    with pytest.raises(UnusableInput):
        analyze_fleet([root, fixture_run("sglang_oom")], root / "fleet")
    assert not (root / "fleet").exists()


def test_runs_start_largest_first_and_the_index_keeps_the_given_order(tmp_path: Path) -> None:
    from forensics.discover import find_runs
    from forensics.fleet import analyze_fleet, largest_first

    paths = []
    for name, last in (("short", 20), ("long", 200), ("middle", 60)):
        write_run(tmp_path / name / "outputs", RunSpec(trial=name, last_step=last, save_freq_steps=10))
        paths.append(tmp_path / name / "outputs")
    locations = [loc for path in paths for loc in find_runs([path])]
    assert [loc.run_id.split("/")[-1] for loc in locations] == ["short", "long", "middle"]
    # A long run started last would finish alone; ties and runs without files keep their place.
    assert largest_first(locations) == [1, 2, 0]
    assert largest_first([None, locations[0], None, locations[0]]) == [1, 3, 0, 2]
    result = analyze_fleet(paths, tmp_path / "out", workers=1, html=False)
    assert [r.run_id.split("/")[-1] for r in result.runs] == ["short", "long", "middle"]
    assert pl.read_parquet(result.index)["run_id"].str.split("/").list.last().to_list() == ["short", "long", "middle"]


SPLIT = """
import json, sys
from pathlib import Path
import ray
from forensics.cache import ParseCache
from forensics.fleet import analyze_fleet
out, *caches = sys.argv[1:4]
paths = sys.argv[4:]
ray.init(include_dashboard=False, log_to_driver=False)  # (one Ray for both fleets: a fleet joins a Ray already up)
for k, cache in enumerate(caches):
    result = analyze_fleet([Path(p) for p in paths], Path(out) / str(k), use_ray=True, cache=ParseCache(cache), split_bytes=1, html=False)
    print(json.dumps({"backend": result.backend, "document": result.to_document()}))
"""


@pytest.mark.skipif(not HAS_RAY, reason="ray is not installed")
def test_on_ray_a_runs_large_logs_are_parsed_in_tasks_of_their_own(singles: dict[str, dict], tmp_path: Path) -> None:
    """... handed over through the cache: where it cannot be written, each would be parsed twice,
    and a run stays one task."""
    temp_root = Path(tempfile.mkdtemp(prefix="rs-", dir="/tmp"))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env |= {"HOME": str(tmp_path), "RAY_TMPDIR": str(temp_root), "RAY_USAGE_STATS_ENABLED": "0"}
    paths = ["tests/fixtures/areal_seed000/outputs", "tests/fixtures/sglang_oom/outputs", "tests/fixtures/seed003"]
    (tmp_path / "a file").write_text("not a folder")
    writable, unwritable = tmp_path / "cache", tmp_path / "a file" / "cache"
    try:
        done = subprocess.run([sys.executable, "-c", SPLIT, str(tmp_path / "out"), str(writable), str(unwritable), *paths],
                              env=env, cwd=REPO, capture_output=True, text=True, timeout=180)
    finally:
        shutil.rmtree(temp_root, ignore_errors=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    split, whole = (json.loads(line) for line in done.stdout.strip().splitlines()[-2:])
    # Trainer and server log of each AReaL run; seed003's loop has one log, so it stays whole.
    assert split["backend"] == "Ray (4 large logs parsed in tasks of their own)"
    assert whole["backend"] == f"Ray (the cache {unwritable} cannot be written: each run parsed in its own task)"
    for found in (split, whole):
        assert {r["root"]: r for r in found["document"]["runs"]} == {root: run for root, run in singles.items()
                                                                     if root.startswith(tuple(paths))}
    assert len(list((writable / "parsed").iterdir())) >= 4


def test_each_run_is_reported_on_stderr_as_it_finishes(fixture_run, tmp_path: Path) -> None:
    result = runner.invoke(app, ["analyze", str(fixture_run("areal_healthy_sparse")), str(fixture_run("sglang_oom")),
                                 "--out", str(tmp_path / "out"), "--no-cache", "--workers", "2"])
    assert result.exit_code == 0, result.output
    progress = [line for line in result.stderr.splitlines() if line.startswith("[")]
    assert sorted(line[:5] for line in progress) == ["[1/2]", "[2/2]"]
    [oom] = [line for line in progress if "gsm8k-grpo-oom/trial0" in line]
    assert "1 incident(s), first reward_collapse @ 180" in oom and oom.endswith("→ runs/gsm8k-grpo-oom-trial0/report.html")
    [healthy] = [line for line in progress if "countdown-grpo/trial1" in line]
    assert "0 incident(s)" in healthy
    assert "[1/2]" not in result.stdout  # stdout keeps the table (and --json -) clean


def test_ctrl_c_ends_a_fleet_and_its_workers_quietly(tmp_path: Path) -> None:
    import gzip
    import signal

    # A run with a 150 MB server log, so that one worker is still reading it when Ctrl-C comes.
    shutil.copytree(FIXTURES / "sglang_oom" / "outputs", tmp_path / "big" / "outputs")
    server = next((tmp_path / "big").rglob("llm_server.log.gz"))
    text = gzip.decompress(server.read_bytes())
    server.unlink()
    with open(server.with_suffix(""), "wb") as fh:
        for _ in range(150_000_000 // len(text)):
            fh.write(text)
    small = [f"tests/fixtures/{name}/outputs" for name in ("areal_seed000", "areal_seed001", "areal_healthy_sparse")]
    fleet = subprocess.Popen([sys.executable, "-m", "forensics", "analyze", str(tmp_path / "big" / "outputs"), *small,
                              "--out", str(tmp_path / "out"), "--no-cache", "--workers", "2"], cwd=REPO, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                             # as from a terminal: a suite started in the background (``cmd &``) has Ctrl-C ignored, and so would the fleet
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    first = fleet.stderr.readline()  # a small run is done, the big one still being read: Ctrl-C reaches them all
    os.killpg(fleet.pid, signal.SIGINT)
    interrupted = time.perf_counter()
    _, rest = fleet.communicate(timeout=60)
    assert first.startswith("[1/4]") and "gsm8k-grpo-oom" not in first, first + rest
    assert fleet.returncode == 130 and time.perf_counter() - interrupted < 5
    assert "Traceback" not in rest and "KeyboardInterrupt" not in rest, rest
    for _ in range(50):  # the workers end too (one that ended may linger as a zombie until reaped)
        states = subprocess.run(["ps", "-o", "stat=", "-g", str(fleet.pid)], capture_output=True, text=True).stdout.split()
        if all(state.startswith("Z") for state in states):
            break
        time.sleep(0.1)
    assert all(state.startswith("Z") for state in states), states


def test_default_workers_are_one_per_cpu_within_the_available_memory() -> None:
    from forensics.fleet import WORKER_BYTES, default_workers

    assert default_workers(cpus=8, available=64 * WORKER_BYTES) == 8
    assert default_workers(cpus=64, available=10 * WORKER_BYTES + 5) == 10  # a big box shared with training
    assert default_workers(cpus=4, available=WORKER_BYTES // 2) == 1  # always at least one
    assert 1 <= default_workers() <= (os.cpu_count() or 1)  # this machine, as the CLI would see it


def test_the_caller_lets_go_of_each_runs_report_once_it_is_written(tmp_path: Path) -> None:
    import tracemalloc

    from forensics.fleet import analyze_fleet

    # A team's hundreds of runs: the calling process must not keep every rendered report to the end
    # (it held all the workers' results, ~3 MB a run, until the last one was in).
    paths = []
    for k in range(8):
        shutil.copytree(FIXTURES / "areal_healthy_sparse" / "outputs", tmp_path / f"r{k}" / "outputs")
        paths.append(tmp_path / f"r{k}" / "outputs")
    held: list[int] = []
    tracemalloc.start()
    try:
        result = analyze_fleet(paths, tmp_path / "out", workers=1,
                               progress=lambda run, done, total: held.append(tracemalloc.get_traced_memory()[0]))
    finally:
        tracemalloc.stop()
    report = max(p.stat().st_size for p in (tmp_path / "out" / "runs").glob("*/report.html"))
    assert len(result.runs) == len(held) == 8 and report > 1_000_000
    assert held[-1] - held[1] < 2 * report, (held, report)


def test_a_glob_over_runs_of_one_config_hands_no_run_another_folders_checkpoints(tmp_path: Path) -> None:
    """``analyze runs/*``: b's checkpoints were purged, and c's were kept apart with its logs gone;
    all three are one config's runs (``root/gsm8k-grpo/trial0``). Whose c's checkpoints are cannot
    be told: b is not handed them (it recommended a step it never saved). Given with b alone, the
    user says they are b's, and they are."""
    from forensics.discover import find_runs

    runs = tmp_path / "runs"
    collapse = lambda s: 0.0 if s >= 40 else healthy_reward(s)  # noqa: E731
    write_run(runs / "a" / "outputs", RunSpec(last_step=50, save_freq_steps=10, reward=collapse))
    write_run(runs / "b" / "outputs", RunSpec(last_step=60, save_freq_steps=10, reward=collapse, seed=2))
    shutil.rmtree(runs / "b" / "outputs" / "checkpoints")
    write_run(runs / "c" / "outputs", RunSpec(last_step=70, save_freq_steps=7, seed=5))
    shutil.move(runs / "c" / "outputs" / "checkpoints", runs / "c-checkpoints")
    shutil.rmtree(runs / "c")
    found = {Path(r.root).parts[-6]: r for r in find_runs(sorted(runs.iterdir()))}
    assert set(found) == {"a", "b"} and found["b"].checkpoint_dir is None
    out = tmp_path / "fleet.json"
    # (c-checkpoints/ holds no run: said, exit 2, the runs analyzed all the same)
    assert runner.invoke(app, ["analyze", *map(str, sorted(runs.iterdir())), "--json", str(out), "--no-html", "--no-cache"]).exit_code == 2
    b = next(r for r in json.loads(out.read_text())["runs"] if "/runs/b/" in r["root"])
    assert b["recommendation"]["checkpoint"] is None
    [alone] = find_runs([runs / "b", runs / "c-checkpoints"])
    assert alone.checkpoint_dir is not None and "c-checkpoints" in str(alone.checkpoint_dir)


@pytest.mark.skipif(not HAS_RAY, reason="ray is not installed")
def test_ray_is_joined_whatever_bytes_a_run_folders_name_holds(tmp_path: Path) -> None:
    """Ray records the driver's command line as UTF-8 (it failed ``--ray`` for the whole fleet on a
    folder named in Latin-1): what it records while joining is that line with the bytes replaced."""
    script = ("import ray, ray._private.utils as u; from forensics.fleet import _utf8_entrypoint\n"
              "try:\n    u.get_entrypoint_name().encode('utf-8'); print('plain ok')\nexcept UnicodeEncodeError:\n    print('plain fails')\n"
              "with _utf8_entrypoint(ray):\n    print('recorded', u.get_entrypoint_name().encode('utf-8').decode().split()[-1])\n")
    done = subprocess.run([sys.executable, "-c", script, os.fsdecode(b"runs/caf\xe9")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.stdout.splitlines() == ["plain fails", "recorded runs/caf\ufffd"], done.stdout + done.stderr


def test_runs_whose_logs_lie_in_one_folder_are_named_by_their_logs_in_the_index(tmp_path: Path) -> None:
    """``analyze dl/runA_trainer.log dl/runB_trainer.log`` (downloaded side by side): a run each, and
    the index says which is which (both were "dl", labelled copy 1 and copy 2)."""
    a = write_run(tmp_path / "a" / "outputs", RunSpec(last_step=60, reward=lambda s: 0.0 if s >= 40 else healthy_reward(s)))
    b = write_run(tmp_path / "b" / "outputs", RunSpec(last_step=50))
    dl = tmp_path / "dl"
    dl.mkdir()
    shutil.copy(a.trainer_log, dl / "runA_trainer.log")
    shutil.copy(b.trainer_log, dl / "runB_trainer.log")
    out = tmp_path / "out"
    result = runner.invoke(app, ["analyze", str(dl / "runA_trainer.log"), str(dl / "runB_trainer.log"), "--out", str(out), "--no-cache"])
    assert result.exit_code == 0, result.output
    index = pl.read_parquet(out / "index.parquet")
    assert dict(zip(index["run_id"], index["n_incidents"])) == {"dl/runA_trainer.log": 1, "dl/runB_trainer.log": 0}
    assert "dl/runA_trainer.log" in (out / "index.html").read_text()


def test_a_runs_outcome_is_kept_and_used_again_until_its_inputs_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fleet run again over unchanged runs does not analyze them again (an unchanged re-run of a
    few runs took as long as the analysis; it is the time to start the workers now): the outcome,
    report and Markdown kept are the ones made. A log that grew, or a checkpoint deleted, is analyzed again."""
    import forensics.fleet as fleet
    from forensics.cache import ParseCache
    from forensics.detect import Thresholds
    from forensics.discover import find_runs

    paths = write_run(tmp_path / "outputs", RunSpec(last_step=60, save_freq_steps=10, reward=lambda s: 0.0 if s >= 40 else healthy_reward(s)))
    [location] = find_runs([paths.fileroot])
    task = fleet._Task("r", location, None, None, Thresholds(), True, True, ParseCache(tmp_path / "cache"))
    first = fleet._analyze_one(task)
    assert first.get("error") is None and first["run"]["incidents"]

    def refused(*_: object) -> None:
        raise RuntimeError("analyzed again")

    monkeypatch.setattr(fleet, "analyze_run", refused)
    again = fleet._analyze_one(task)
    assert {k: v for k, v in again.items() if k != "seconds"} == {k: v for k, v in first.items() if k != "seconds"}
    [newest] = [c["path"] for c in first["run"]["checkpoints"] if c["step"] == 60]
    shutil.rmtree(newest)
    assert "analyzed again" in fleet._analyze_one(task)["error"]


def test_a_fleet_warning_names_the_folder_of_the_run_that_lost_a_log(tmp_path: Path) -> None:
    """Three runs of one config (one run id): the one whose trainer.log is a dangling link is named
    by its folder in the warning, not by the id the three share."""
    for name in ("lr-1e-6", "lr-2e-6", "lr-5e-6"):
        write_run(tmp_path / "runs" / name / "outputs", RunSpec(last_step=30, save_freq_steps=10))
    [log] = (tmp_path / "runs" / "lr-2e-6").rglob("trainer.log")
    log.unlink()
    os.symlink("/nonexistent/trainer.log", log)
    result = runner.invoke(app, ["analyze", *map(str, sorted((tmp_path / "runs").iterdir())), "--out", str(tmp_path / "out"), "--no-cache"])
    warned = [line for line in result.stderr.splitlines() if "warning" in line]
    assert warned and all("/runs/lr-2e-6/" in line for line in warned), warned


def test_a_folder_of_runs_logs_side_by_side_is_those_runs_as_their_logs_by_name_are(tmp_path: Path) -> None:
    """``analyze dl/`` over two runs' trainer logs downloaded side by side: two runs, as
    ``analyze dl/*.log`` gives (it was one made-up run, B's steps read as a relaunch of A's). A
    run's rotated part stays with its log; a realhf run's worker logs (no steps of their own) stay one run."""
    from forensics.discover import find_runs

    a = write_run(tmp_path / "a" / "outputs", RunSpec(last_step=60, reward=lambda s: 0.0 if s >= 40 else healthy_reward(s)))
    b = write_run(tmp_path / "b" / "outputs", RunSpec(last_step=50))
    dl = tmp_path / "dl"
    dl.mkdir()
    lines = a.trainer_log.read_text().splitlines(keepends=True)
    (dl / "runA_trainer.log.1").write_text("".join(lines[: len(lines) // 2]))
    (dl / "runA_trainer.log").write_text("".join(lines[len(lines) // 2:]))
    shutil.copy(b.trainer_log, dl / "runB_trainer.log")
    as_folder = {r.run_id: sorted(s.path.name for s in r.logs) for r in find_runs([dl])}
    by_name = {r.run_id: sorted(s.path.name for s in r.logs) for r in find_runs(sorted(dl.iterdir()))}
    assert as_folder == by_name == {"dl/runA_trainer.log": ["runA_trainer.log", "runA_trainer.log.1"], "dl/runB_trainer.log": ["runB_trainer.log"]}
    # A realhf run's logs: its master worker prints the steps, its model workers none: one run.
    realhf = tmp_path / "realhf"
    realhf.mkdir()
    shutil.copy(b.trainer_log, realhf / "master_worker-0")
    worker = "".join(line for line in lines if "Train step" not in line)
    (realhf / "model_worker-0").write_text(worker)
    (realhf / "model_worker-1").write_text(worker)
    [run] = find_runs([realhf])
    assert sorted(s.path.name for s in run.logs) == ["master_worker-0", "model_worker-0", "model_worker-1"]
    # A run restarted by hand into a new log, which begins where it resumed: one run either way.
    restarted = tmp_path / "restarted"
    restarted.mkdir()
    cut = next(i for i, line in enumerate(lines) if "Train step 31/" in line)
    (restarted / "first_attempt.log").write_text("".join(lines[:cut]))
    (restarted / "resumed.log").write_text("".join(lines[cut:]))
    as_folder = [sorted(s.path.name for s in r.logs) for r in find_runs([restarted])]
    assert as_folder == [sorted(s.path.name for s in r.logs) for r in find_runs(sorted(restarted.iterdir()))]
    assert as_folder == [["first_attempt.log", "resumed.log"]]
    # Two verl experiments' consoles, one dead before its first step: two runs by their names.
    from verl_builder import VerlRunSpec, write_verl_run

    consoles = tmp_path / "consoles"
    consoles.mkdir()
    for name, steps in (("baseline", 20), ("lr_fix", 20)):
        log = write_verl_run(tmp_path / name, VerlRunSpec(steps=steps, file_logger=False, experiment=name)).train_log
        text = log.read_text().splitlines(keepends=True)
        first = next(i for i, line in enumerate(text) if "step:1 " in line)
        (consoles / f"{name}.log").write_text("".join(text if name == "baseline" else text[:first]))
    for given in ([consoles], sorted(consoles.iterdir())):
        assert sorted(r.run_id for r in find_runs(given)) == ["consoles/baseline.log", "consoles/lr_fix.log"]
