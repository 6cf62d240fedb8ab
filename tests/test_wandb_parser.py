"""W&B offline runs written by the real ``wandb`` package (in a child process, offline, with a
throwaway HOME), read back by our own block reader: every value, damage, resumes, and the
online reader's refusal without an API key.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from datetime import datetime
from pathlib import Path

import polars as pl
import pytest

pytest.importorskip("wandb")

from wandb_frames import legacy_stream  # noqa: E402 - tests/fixtures, on the path via conftest

from forensics import analyze  # noqa: E402
from parsers.schema import METRIC_SCHEMA  # noqa: E402
from parsers.wandb_run import (  # noqa: E402
    WandbUnavailable,
    find_wandb_runs,
    read_wandb_online,
    read_wandb_run,
    read_wandb_runs,
)

RUN_ID = "grpoRun7"
STEPS = 60
COLLAPSE = 41
NAN_STEP, INF_STEP = 7, 50
BIG = "x" * 70_000  # a config value bigger than two 32 KiB blocks: FIRST/MIDDLE/LAST chunks

WRITER = textwrap.dedent(
    """
    import json, sys, wandb
    spec = json.loads(sys.argv[1])
    run = wandb.init(mode="offline", dir=spec["dir"], project="grpo-forensics-test", id=spec["id"],
                     resume="allow", config=spec["config"])
    for step in spec["steps"]:
        row = {k: (float(v) if isinstance(v, str) else v) for k, v in spec["rows"][str(step)].items()}
        row["text/note"] = "not a number"
        row["hist"] = wandb.Histogram([1, 2, 2, 3])
        run.log(row, step=step)
    run.summary["best_reward"] = spec["best"]
    wandb.finish()
    """
)


def expected_row(step: int, resumed: bool = False) -> dict:
    reward = 0.0 if step >= COLLAPSE else 0.25 + step / 100
    return {
        "grpo_actor/task_reward/avg": 0.9 if resumed else reward,
        "loss": "nan" if step == NAN_STEP else 1 / (step + 1),
        "grad_norm": "inf" if step == INF_STEP else 0.5 + step / 1000,
        "actor": {"entropy": 1.25 - step / 200, "kl": step * 1e-4},
        "update_successful": True,
    }


def flat(row: dict) -> dict[str, float]:
    out = {}
    for key, value in row.items():
        if isinstance(value, dict):
            out.update({f"{key}.{k}": float(v) for k, v in value.items()})
        else:
            out[key] = float(value)
    return out


def write_run(root: Path, steps: range, resumed: bool = False) -> None:
    spec = {
        "dir": str(root),
        "id": RUN_ID,
        "steps": list(steps),
        "rows": {str(s): expected_row(s, resumed) for s in steps},
        "config": {"lr": 1e-6, "model": {"name": "qwen2.5-1.5b"}, "big": BIG} if not resumed else {"lr": 2e-6},
        "best": 0.9 if resumed else 0.74,
    }
    home = root / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(
        HOME=str(home), WANDB_CONFIG_DIR=str(home / ".config"), WANDB_CACHE_DIR=str(home / ".cache"),
        WANDB_DIR=str(root), WANDB_SILENT="true", WANDB_MODE="offline", WANDB_DISABLE_GIT="true",
    )
    subprocess.run([sys.executable, "-c", WRITER, json.dumps(spec)], env=env, check=True, timeout=120)


@pytest.fixture(scope="module")
def wandb_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("wandb_runs")
    write_run(root, range(STEPS))
    return root


@pytest.fixture(scope="module")
def resumed_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("wandb_resumed")
    write_run(root, range(40))
    write_run(root, range(35, 45), resumed=True)
    return root


def wandb_file(run_dir: Path) -> Path:
    return next(run_dir.glob("run-*.wandb"))


def test_every_logged_value_reads_back(wandb_root: Path) -> None:
    (run_dir,) = find_wandb_runs(wandb_root)
    started = datetime.now()
    run = read_wandb_run(run_dir)

    assert run.run_id == RUN_ID and run.project == "grpo-forensics-test"
    assert run.writer and run.writer.startswith("wandb-core")
    assert run.exit_code == 0 and run.notes == () and run.records_skipped == 0
    assert run.metrics.schema == pl.Schema(METRIC_SCHEMA)
    got = {(r["step"], r["key"]): r["value"] for r in run.metrics.iter_rows(named=True)}
    want = {(s, k): v for s in range(STEPS) for k, v in flat(expected_row(s)).items()}
    assert got.keys() == want.keys()  # strings and media (histograms) are not metrics
    for where, value in want.items():
        assert got[where] == value or (math.isnan(value) and math.isnan(got[where])), where
    assert got[(COLLAPSE - 1, "grpo_actor/task_reward/avg")] > 0 and got[(COLLAPSE, "grpo_actor/task_reward/avg")] == 0.0
    assert math.isnan(got[(NAN_STEP, "loss")]) and got[(INF_STEP, "grad_norm")] == math.inf

    times = run.metrics["time"]
    assert times.null_count() == 0 and times.dtype == pl.Datetime("ms")
    assert abs((started - times.max()).total_seconds()) < 600  # naive local wall clock
    assert run.metrics["line"].min() > 1 and run.metrics["file"].unique().to_list() == [str(wandb_file(run_dir))]

    assert run.config["lr"] == 1e-6 and run.config["model"] == {"name": "qwen2.5-1.5b"} and run.config["big"] == BIG
    assert run.summary["best_reward"] == 0.74
    assert run.summary["grpo_actor/task_reward/avg"] == 0.0 and run.summary["actor"]["kl"] == (STEPS - 1) * 1e-4


def test_latest_run_symlink_is_counted_once(wandb_root: Path) -> None:
    runs = find_wandb_runs(wandb_root)
    assert len(runs) == 1 and (wandb_root / "wandb" / "latest-run").is_symlink()
    assert find_wandb_runs(wandb_root / "wandb" / "latest-run") == [runs[0].resolve()]
    assert find_wandb_runs(wandb_root / "nowhere") == []


@pytest.mark.parametrize("fraction", [0.6, 0.9])
def test_file_cut_mid_block_keeps_everything_before_the_cut(wandb_root: Path, tmp_path: Path, fraction: float) -> None:
    source = wandb_file(find_wandb_runs(wandb_root)[0])
    data = source.read_bytes()
    cut = tmp_path / "offline-run-20250101_000000-cut" / source.name
    cut.parent.mkdir()
    size = int(len(data) * fraction)
    assert size % 32768 not in (0, 7)
    cut.write_bytes(data[:size])

    whole, part = read_wandb_run(source.parent), read_wandb_run(cut.parent)
    assert any("torn last block" in n or "incomplete" in n for n in part.notes), part.notes
    assert any("no exit record" in n for n in part.notes) and part.exit_code is None
    assert 0 < part.metrics.height < whole.metrics.height
    last = part.metrics["step"].max()
    # Every row read is exactly the row the whole file has; the steps read are a prefix.
    joined = part.metrics.join(whole.metrics, on=["step", "key"], how="left", suffix="_whole")
    same = (pl.col("value") == pl.col("value_whole")) | (pl.col("value").is_nan() & pl.col("value_whole").is_nan())
    assert joined.filter(~same.fill_null(False)).is_empty()
    assert set(part.metrics["step"].unique()) == set(range(last + 1))


def test_corrupt_chunk_is_skipped_and_the_next_block_read(wandb_root: Path, tmp_path: Path) -> None:
    source = wandb_file(find_wandb_runs(wandb_root)[0])
    data = bytearray(source.read_bytes())
    assert len(data) > 3 * 32768
    data[32768 + 2000] ^= 0xFF  # inside block 1
    bad = tmp_path / source.name
    bad.write_bytes(bytes(data))
    run = read_wandb_run(bad)
    assert run.records_skipped >= 1 and any("corrupt chunks" in n for n in run.notes)
    assert run.exit_code == 0  # records after the damaged block are still read
    assert run.metrics["step"].max() == STEPS - 1


@pytest.mark.parametrize(
    "content",
    [b"", b"not a wandb file at all", b":W&B\xe1\xbe\x00" + bytes(range(256)) * 50, b":W&B\xe1\xbe\x00" + b"\x00" * 70000],
)
def test_junk_never_raises(tmp_path: Path, content: bytes) -> None:
    junk = tmp_path / "run-junk.wandb"
    junk.write_bytes(content)
    run = read_wandb_run(junk)
    assert run.metrics.is_empty() and run.metrics.schema == pl.Schema(METRIC_SCHEMA)
    assert run.notes


def test_folder_without_log_says_so(tmp_path: Path) -> None:
    folder = tmp_path / "wandb" / "offline-run-20250101_000000-abc"
    folder.mkdir(parents=True)
    run = read_wandb_run(folder)
    assert run.run_id == "abc" and run.metrics.is_empty() and "no run-<id>.wandb" in run.notes[0]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
def test_a_named_pipe_is_said_not_opened(tmp_path: Path) -> None:
    """A ``run-<id>.wandb`` that is a pipe is not opened (that waits for a writer forever): the
    run says why it holds nothing. In a child process, so a hang fails the test."""
    folder = tmp_path / "wandb" / "offline-run-20250101_000000-abc"
    folder.mkdir(parents=True)
    os.mkfifo(folder / "run-abc.wandb")
    script = f"from parsers.wandb_run import read_wandb_run; print(read_wandb_run({str(folder)!r}).notes)"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert "cannot read run-abc.wandb: a pipe, socket or device, not a file" in done.stdout, done.stderr


def test_resumed_run_merges_folders_later_wins(resumed_root: Path) -> None:
    folders = find_wandb_runs(resumed_root)
    # Both folders hold the run: wandb names the second "…-<id>-1" when it starts in the same second.
    assert len(folders) == 2 and {read_wandb_run(f).run_id for f in folders} == {RUN_ID}
    (run,) = read_wandb_runs(resumed_root)
    assert len(run.paths) == 2 and any("resumed" in n for n in run.notes)
    reward = dict(run.metrics.filter(pl.col("key") == "grpo_actor/task_reward/avg").select("step", "value").iter_rows())
    assert sorted(reward) == list(range(45))
    assert reward[34] == 0.25 + 34 / 100 and all(reward[s] == 0.9 for s in range(35, 45))
    assert run.metrics.select("step", "key").is_duplicated().sum() == 0
    assert run.config["lr"] == 2e-6 and run.config["model"] == {"name": "qwen2.5-1.5b"}
    assert run.summary["best_reward"] == 0.9
    # The first folder's 35–39 were abandoned by the resume from 35: kept apart, not dropped.
    gone = run.superseded.filter(pl.col("key") == "grpo_actor/task_reward/avg")
    assert gone["step"].to_list() == list(range(35, 40)) and gone["file"].cast(pl.String).str.contains(folders[0].name).all()


def test_a_resume_that_stopped_short_abandons_the_earlier_folders_later_steps(tmp_path: Path) -> None:
    """Steps 0–39, then a resume from step 20 that logged 20–29 and stopped: the run is 0–29; the
    first folder's 30–39 belong to the attempt the resume abandoned (later folder winning step by
    step would have kept them as the run's)."""
    write_run(tmp_path, range(40))
    write_run(tmp_path, range(20, 30), resumed=True)
    (run,) = read_wandb_runs(tmp_path)
    reward = dict(run.metrics.filter(pl.col("key") == "grpo_actor/task_reward/avg").select("step", "value").iter_rows())
    assert sorted(reward) == list(range(30)) and all(reward[s] == 0.9 for s in range(20, 30))
    assert run.metrics["step"].max() == 29
    assert sorted(run.superseded.filter(pl.col("key") == "loss")["step"].to_list()) == list(range(20, 40))
    assert "20 steps an earlier folder logged from where a later one resumed are an attempt the run abandoned: not the run's values" in run.notes




def test_windows_and_flushes_do_not_change_the_result(wandb_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file is read a window of blocks at a time and values become frames a batch at a time:
    a window of one block (the 70 KB config record spans three) and tiny batches read the same."""
    import parsers.wandb_run as reader

    run_dir = find_wandb_runs(wandb_root)[0]
    whole = read_wandb_run(run_dir)
    monkeypatch.setattr(reader, "_WINDOW_BLOCKS", 1)
    monkeypatch.setattr(reader, "_FLUSH_ITEMS", 7)
    small = read_wandb_run(run_dir)
    assert small.metrics.equals(whole.metrics) and small.config == whole.config and small.summary == whole.summary
    assert (small.notes, small.records_read, small.records_skipped) == (whole.notes, whole.records_read, whole.records_skipped)


def test_analysis_keys_without_the_summary(wandb_root: Path) -> None:
    """What ``analyze`` asks for: the keys it reads, no summary (half a long run's file); the rows
    kept are exactly the full read's rows of those keys."""
    run_dir = find_wandb_runs(wandb_root)[0]
    whole = read_wandb_run(run_dir)
    lean = read_wandb_run(run_dir, keys=r"task_reward|^actor\.", summary=False)
    assert set(lean.metrics["key"]) == {"grpo_actor/task_reward/avg", "actor.entropy", "actor.kl"}
    kept = whole.metrics.filter(pl.col("key").cast(pl.String).str.contains(r"task_reward|^actor\."))
    assert lean.metrics.equals(kept) and lean.summary == {} and lean.config == whole.config
    assert (lean.exit_code, lean.records_read, lean.notes) == (whole.exit_code, whole.records_read, whole.notes)


def test_legacy_writer_records_give_the_same_rows(wandb_root: Path, tmp_path: Path) -> None:
    from wandb.proto import wandb_internal_pb2 as pb

    core = read_wandb_run(find_wandb_runs(wandb_root)[0])
    records = [pb.Record(header=pb.HeaderRecord()).SerializeToString()]
    run = pb.Record(run=pb.RunRecord(run_id="legacy1", project="p"))
    run.run.config.update.add(key="model", value_json=json.dumps({"name": "qwen2.5-1.5b"}))
    records.append(run.SerializeToString())
    for step in range(STEPS):
        record = pb.Record()
        row = expected_row(step)
        for key, value in row.items():
            text = {"nan": "NaN", "inf": "Infinity"}.get(value, None) if isinstance(value, str) else json.dumps(value)
            record.history.item.add(key=key, value_json=text)
        record.history.item.add(key="hist", value_json=json.dumps({"_type": "histogram", "values": [1, 2], "bins": [0, 1, 2]}))
        record.history.item.add(key="_step", value_json=str(step))
        record.history.item.add(key="_timestamp", value_json="1735689600.5")
        records.append(record.SerializeToString())
    summary = pb.Record()
    summary.summary.update.add(key="best_reward", value_json="0.74")
    records.append(summary.SerializeToString())
    records.append(pb.Record(exit=pb.RunExitRecord(exit_code=1)).SerializeToString())
    path = tmp_path / "run-legacy1.wandb"
    path.write_bytes(legacy_stream(records))

    legacy = read_wandb_run(path)
    assert legacy.writer == "legacy" and legacy.run_id == "legacy1" and legacy.exit_code == 1
    assert legacy.config == {"model": {"name": "qwen2.5-1.5b"}} and legacy.summary == {"best_reward": 0.74}
    assert legacy.metrics["time"].unique().to_list() == [datetime.fromtimestamp(1735689600.5)]
    cols = ["step", "key", "value"]
    assert legacy.metrics.select(cols).sort(cols).equals(core.metrics.select(cols).sort(cols))


def test_online_without_api_key_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [k for k in os.environ if k.startswith("WANDB_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / ".config"))
    monkeypatch.setenv("NETRC", str(tmp_path / ".netrc"))
    with pytest.raises(WandbUnavailable, match="my-team/grpo/abc123") as info:
        read_wandb_online("https://wandb.ai/my-team/grpo/runs/abc123")
    assert isinstance(info.value, ValueError)
    with pytest.raises(ValueError, match="ENTITY/PROJECT/RUN_ID"):
        read_wandb_online("just-a-name")



def test_history_records_without_values(tmp_path: Path) -> None:
    """A record of media only, one with a step and no items, then a value: only the value is a row."""
    from wandb.proto import wandb_internal_pb2 as pb

    records = [pb.Record(header=pb.HeaderRecord()).SerializeToString()]
    media = pb.Record()
    media.history.item.add(nested_key=["img", "_type"], value_json='"image-file"')
    media.history.item.add(nested_key=["img", "path"], value_json='"x.png"')
    media.history.item.add(key="_step", value_json="2")
    empty = pb.Record()
    empty.history.step.num = 3
    value = pb.Record()
    value.history.item.add(key="_step", value_json="4")
    value.history.item.add(key="loss", value_json="0.5")
    records += [r.SerializeToString() for r in (media, empty, value)]
    path = tmp_path / "run-m.wandb"
    path.write_bytes(legacy_stream(records))
    run = read_wandb_run(path)
    assert run.metrics.select("step", "key", "value").rows() == [(4, "loss", 0.5)] and run.records_skipped == 0


TRAINER_WRITER = textwrap.dedent(
    """
    import json, sys, wandb
    spec = json.loads(sys.argv[1])
    run = wandb.init(mode="offline", dir=spec["dir"], project="trl", id="hfrun1")
    run.define_metric("train/global_step")
    run.define_metric("*", step_metric="train/global_step", step_sync=True)
    for gs in range(10, 401, 10):
        reward = 0.0 if gs >= 200 else 0.3 + (gs % 70) / 1000
        run.log({"train/reward": reward, "train/loss": 0.1 + gs / 1e4, "train/global_step": gs})
        if gs % 50 == 0:
            run.log({"eval/reward": reward, "train/global_step": gs})
    wandb.finish()
    """
)


def test_a_runs_declared_step_metric_is_its_step(tmp_path: Path) -> None:
    """HF Trainer and TRL log without ``step=`` and declare ``define_metric("*", step_metric=
    "train/global_step")``: W&B's own step counts log calls (an eval call is one more), the run's
    steps are the global step's values — read as such, the analysis keys alone too."""
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(HOME=str(home), WANDB_CONFIG_DIR=str(home / ".config"), WANDB_CACHE_DIR=str(home / ".cache"),
               WANDB_SILENT="true", WANDB_MODE="offline", WANDB_DISABLE_GIT="true")
    subprocess.run([sys.executable, "-c", TRAINER_WRITER, json.dumps({"dir": str(tmp_path)})], env=env, check=True, timeout=120)
    for keys in (None, "reward"):
        [run] = read_wandb_runs(tmp_path, keys=keys)
        reward = run.metrics.filter(pl.col("key") == "train/reward").sort("step")
        assert reward["step"].to_list() == list(range(10, 401, 10))
        assert reward.filter(pl.col("step") == 200)["value"].item() == 0.0
        evals = run.metrics.filter(pl.col("key") == "eval/reward")["step"].to_list()
        assert evals == list(range(50, 401, 50))
        assert "steps are train/global_step (the run's define_metric), not W&B's count of log calls" in run.notes


GLOB_WRITER = textwrap.dedent(
    """
    import json, sys, wandb
    spec = json.loads(sys.argv[1])
    run = wandb.init(mode="offline", dir=spec["dir"], project="gsm8k", id="globrun")
    run.define_metric("global_step")
    run.define_metric("critic/*", step_metric="global_step")
    run.define_metric("actor/*", step_metric="global_step")
    for step in range(1, 101):
        score = 0.0 if step >= 60 else 0.5
        run.log({"global_step": step, "critic/score/mean": score})  # two calls a training step, as many loops log
        run.log({"global_step": step, "actor/pg_loss": 0.01})
        run.log({"perf/throughput": float(step)})  # keys of no pattern: the step last logged
    wandb.finish()
    """
)


def test_a_step_metric_declared_for_some_keys_is_the_runs_step(tmp_path: Path) -> None:
    """W&B's docs declare ``define_metric("critic/*", step_metric="global_step")``: steps are the
    global step's values, not W&B's count of three log calls a step (onset 60, not 178)."""
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(HOME=str(home), WANDB_CONFIG_DIR=str(home / ".config"), WANDB_CACHE_DIR=str(home / ".cache"),
               WANDB_SILENT="true", WANDB_MODE="offline", WANDB_DISABLE_GIT="true")
    subprocess.run([sys.executable, "-c", GLOB_WRITER, json.dumps({"dir": str(tmp_path)})], env=env, check=True, timeout=120)
    [run] = read_wandb_runs(tmp_path)
    score = run.metrics.filter(pl.col("key") == "critic/score/mean").sort("step")
    assert score["step"].to_list() == list(range(1, 101))
    assert score.filter(pl.col("value") == 0.0)["step"].min() == 60
    perf = run.metrics.filter(pl.col("key") == "perf/throughput").sort("step")
    assert perf["step"].to_list() == perf["value"].cast(pl.Int64).to_list() == list(range(1, 101))
    assert "steps are global_step (the run's define_metric), not W&B's count of log calls" in run.notes
    [analysed] = analyze([tmp_path]).runs
    assert [(i.kind, i.onset_step) for i in analysed.incidents] == [("reward_collapse", 60)]


CONSOLE_WRITER = textwrap.dedent(
    """
    import json, sys, wandb
    spec = json.loads(sys.argv[1])
    run = wandb.init(mode="offline", dir=spec["dir"], project="gsm8k", name="exp")
    for s in range(1, 101):
        v = 0.0 if s >= 60 else 0.5 + 0.01 * (s % 3)
        print(f"step:{s} - critic/score/mean:{v:.3f} - critic/score/std:{0.0 if v == 0 else 0.3:.3f}", flush=True)
        if s == 59:
            print("[2025-11-10 10:00:00,123 E 1234 1234] ProcessGroupNCCL.cpp:1234: [Rank 0] Watchdog caught collective "
                  "operation timeout: WorkNCCL(SeqNum=12345, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) "
                  "ran for 600011 milliseconds before timing out.", file=sys.stderr, flush=True)
        run.log({"critic/score/mean": v}, step=s)
    run.finish()
    """
)


def test_the_console_w_and_b_captured_is_read_where_the_run_has_no_other(tmp_path: Path) -> None:
    """W&B writes what the loop printed to ``files/output.log``: with no console of its own beside
    it, that is the run's text log, and the NCCL watchdog line in it names the cause."""
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(HOME=str(home), WANDB_CONFIG_DIR=str(home / ".config"), WANDB_CACHE_DIR=str(home / ".cache"),
               WANDB_SILENT="true", WANDB_MODE="offline", WANDB_DISABLE_GIT="true", WANDB_CONSOLE="wrap")
    subprocess.run([sys.executable, "-c", CONSOLE_WRITER, json.dumps({"dir": str(tmp_path)})], env=env, check=True,
                   timeout=120, capture_output=True)
    [console] = tmp_path.glob("wandb/offline-run-*/files/output.log")
    assert "Watchdog caught collective operation timeout" in console.read_text()
    [run] = analyze([tmp_path]).runs
    assert {Path(s.path).name: s.kind for s in run.sources} == {"output.log": "verl_log", "wandb": "wandb"}
    incident = run.incidents[0]
    assert (incident.kind, incident.onset_step, incident.cause) == ("reward_collapse", 60, "nccl_timeout")
    assert any(Path(e.file) == console for e in incident.evidence)


SWEEP_WRITER = textwrap.dedent(
    """
    import json, sys, time, wandb
    spec = json.loads(sys.argv[1])
    for trial, lr in enumerate([1e-6, 1e-5, 3e-7]):  # (a wandb agent's trials: WANDB_SWEEP_ID set for each)
        run = wandb.init(mode="offline", dir=spec["dir"], project="gsm8k", group="lr-sweep", name=f"trial{trial}",
                         config={"lr": lr})
        for step in range(1, 61):
            run.log({"critic/score/mean": 0.0 if trial == 1 and step >= 40 else 0.5 + 0.01 * (step % 3)}, step=step)
        run.finish()
        time.sleep(1.1)  # (run folders are named by the second they began)
    """
)


def test_the_trials_of_a_sweep_in_one_folder_are_runs_of_their_own(tmp_path: Path) -> None:
    """Three trials of a sweep in one ``wandb/``: three runs, not one run relaunched twice whose
    collapsed middle trial is an abandoned attempt that "recovered"."""
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(HOME=str(home), WANDB_CONFIG_DIR=str(home / ".config"), WANDB_CACHE_DIR=str(home / ".cache"),
               WANDB_SILENT="true", WANDB_MODE="offline", WANDB_DISABLE_GIT="true", WANDB_SWEEP_ID="lrsweep1")
    subprocess.run([sys.executable, "-c", SWEEP_WRITER, json.dumps({"dir": str(tmp_path)})], env=env, check=True, timeout=180)
    runs = {r.run_id.rsplit("/", 1)[-1]: r for r in analyze([tmp_path]).runs}
    assert sorted(runs) == ["trial0", "trial1", "trial2"]
    assert [(i.kind, i.onset_step, i.recovered) for i in runs["trial1"].incidents] == [("reward_collapse", 40, False)]
    assert runs["trial0"].incidents == [] == runs["trial2"].incidents
    assert all(r.step_range() == {"first": 1, "last": 60, "count": 60} for r in runs.values())


def test_one_w_and_b_run_given_by_its_folder_its_link_or_its_file_is_that_run(wandb_root: Path) -> None:
    """`analyze wandb/latest-run` (the link W&B's docs point at), the run's folder, or its `.wandb`
    file: each exited 2, "no training run found"; only the `wandb/` above them was read."""
    from forensics import analyze

    [run_dir] = find_wandb_runs(wandb_root)
    whole = analyze([wandb_root / "wandb"]).runs[0]
    for given in (wandb_root / "wandb" / "latest-run", run_dir, wandb_file(run_dir)):
        [run] = analyze([given]).runs
        assert run.step_range() == whole.step_range() and run.step_range()["count"] == STEPS
        assert run.metrics.height == whole.metrics.height
