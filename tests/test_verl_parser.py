"""verl console logs (both value eras), the JSONL file logger, restarts, and checkpoints."""

from __future__ import annotations

import gzip
import json
import math
import shutil
from pathlib import Path

import polars as pl
import pytest
from conftest import tree_state
from typer.testing import CliRunner
from verl_builder import (
    VerlRunSpec,
    metric_line,
    nccl_hang_run,
    ray_oom_kill_run,
    write_checkpoint,
    write_verl_run,
    zero_score_run,
)

from forensics import analyze
from forensics.cli import app
from parsers.schema import CHECKPOINT_SCHEMA, METRIC_SCHEMA, STEP_SCHEMA
from parsers.verl import looks_like_verl_log, read_verl_log
from parsers.verl_checkpoints import (
    find_verl_checkpoint_roots,
    latest_checkpointed_iteration,
    read_verl_checkpoints,
    resume_args,
    resume_command,
)

SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "samples"
EXCERPTS = SAMPLES / "real" / "ray_verl"
needs_samples = pytest.mark.skipif(not SAMPLES.is_dir(), reason="shared/samples not present")


def _value(log, step: int, key: str) -> float:
    return log.metrics.filter((pl.col("step") == step) & (pl.col("key") == key))["value"].item()


# ---------------------------------------------------------------------------------------------
# Console


def test_pformat_era_console(tmp_path: Path) -> None:
    paths = write_verl_run(tmp_path / "run", VerlRunSpec(steps=10, save_freq=5, nan_steps=frozenset({4})))
    log = read_verl_log(paths.train_log)
    assert log.steps["step"].to_list() == list(range(1, 11))
    assert list(log.steps.columns) == list(STEP_SCHEMA) and list(log.metrics.columns) == list(METRIC_SCHEMA)
    assert log.steps["time"].null_count() == 10 and any("no time" in n for n in log.notes)
    # np.float64(…) wrappers, ints, 1e-06, nan all read as numbers.
    assert _value(log, 4, "actor/grad_norm") != _value(log, 4, "actor/grad_norm")  # NaN kept as NaN
    assert _value(log, 3, "training/global_step") == 3.0 and _value(log, 3, "actor/lr") == 1e-06
    assert 0.3 < _value(log, 10, "critic/score/mean") < 0.7
    # The validation run before training is step 0: metrics, not a training step.
    assert log.metrics.filter(pl.col("step") == 0)["key"].to_list() == ["val-core/openai/gsm8k/reward/mean@1"]
    assert any("step 0 holds only the validation" in n for n in log.notes)
    assert set(log.metrics["source"]) == {"verl"} and log.metrics["time"].null_count() == log.metrics.height
    kinds = log.events.select("kind", "step").rows()
    assert ("nan_inf", 4) in kinds and ("checkpoint_saved", 5) in kinds and ("checkpoint_saved", 10) in kinds
    assert set(log.events.filter(pl.col("kind") == "checkpoint_saved")["source"]) == {"verl"}
    assert log.facts["project_name"] == "verl_grpo_example_gsm8k" and log.facts["save_freq"] == "5" and log.kind == "verl_console"
    assert log.facts["default_local_dir"] == str(paths.ckpt_root)
    assert log.unparsed_lines == 0


@pytest.mark.parametrize("era", ["fixed", "pformat"])
@pytest.mark.parametrize("packed", [False, True], ids=["cut-off", "torn-gzip"])
def test_a_log_ending_inside_its_last_metric_line_skips_the_value_it_may_cut(tmp_path: Path, era: str, packed: bool) -> None:
    """A log cut at ``critic/score/mean:0.`` (a copy taken mid-write, a torn .gz): the cut value
    was read as 0, with nothing said; the values before it on the line are whole."""
    paths = write_verl_run(tmp_path / "run", VerlRunSpec(steps=10, era=era))
    text = paths.train_log.read_bytes()
    last = text.rindex(b"step:10 - ")
    cut = text[: text.index(b"critic/score/mean:", last) + len(b"critic/score/mean:0")] + (b"." if era == "fixed" else b"")
    whole = read_verl_log(paths.train_log)
    if packed:
        (tmp_path / "train.log.gz").write_bytes(gzip.compress(text)[: len(gzip.compress(cut)) - 12])
        log = read_verl_log(tmp_path / "train.log.gz")
    else:
        paths.train_log.write_bytes(cut)
        log = read_verl_log(paths.train_log)
    ten = log.metrics.filter(pl.col("step") == 10)
    assert "critic/score/mean" not in ten["key"].to_list() and ten.height >= 1
    kept = whole.metrics.filter(pl.col("step") == 10).join(ten.select("key"), on="key", how="semi")
    assert ten.select("key", "value").equals(kept.select("key", "value"))
    assert any(n.startswith("the log's last line has no newline after it (cut off while it was written): its last value was skipped")
               for n in log.notes), log.notes


def test_a_log_ending_inside_a_step_number_reads_no_step_from_it(tmp_path: Path) -> None:
    """A live console read while ``step:15`` was half written (``step:1``): that is no step 1 logged
    again (a restart, said in a note), and the log read again once grown, through the cache, says
    what a fresh read says."""
    paths = write_verl_run(tmp_path / "run", VerlRunSpec(steps=30, file_logger=False))
    data = paths.train_log.read_bytes()
    cut = data.index(b"step:15 ") + len(b"step:1")
    paths.train_log.write_bytes(data[:cut])
    log = read_verl_log(paths.train_log)
    assert int(log.steps["step"].max()) == 14 and log.steps["step"].is_unique().all()
    assert not [n for n in log.notes if "more than once" in n], log.notes
    cache, runner = ["--cache-dir", str(tmp_path / "cache")], CliRunner()
    assert runner.invoke(app, ["analyze", str(paths.root), "--no-html", *cache]).exit_code == 0
    with open(paths.train_log, "ab") as fh:
        fh.write(data[cut:])
    grown, fresh = (runner.invoke(app, ["analyze", str(paths.root), "--json", "-", "--no-html", *options]) for options in (cache, ["--no-cache"]))
    assert grown.exit_code == fresh.exit_code == 0
    assert json.loads(grown.stdout)["runs"] == json.loads(fresh.stdout)["runs"]


def test_fixed_era_console_with_main_task_prefix(tmp_path: Path) -> None:
    paths = write_verl_run(tmp_path / "old", VerlRunSpec(steps=6, era="fixed", prefix="main_task", colour=False, save_freq=0))
    log = read_verl_log(paths.train_log)
    assert log.steps["step"].to_list() == [1, 2, 3, 4, 5, 6]
    assert _value(log, 5, "actor/lr") == 0.0  # ":.3f" of 1e-06
    assert "actor/entropy_loss" in set(log.metrics["key"])
    assert looks_like_verl_log(paths.train_log)


def test_value_spellings() -> None:
    line = metric_line(3, {"a": 0.5, "b": 7, "c": float("nan")}, "pformat")
    assert line == "step:3 - a:0.5 - b:7 - c:nan"
    assert metric_line(3, {"a": 0.5, "b": float("inf")}, "fixed") == "step:3 - a:0.500 - b:inf"


FULL_LINE = (
    "step:7 - actor/pg_loss:np.float64(-0.25) - actor/grad_norm:inf - critic/score/mean:np.float32(0.125) - "
    "training/flag:True - perf/x:-inf - response_length/mean:3.5e+02 - timing_s/adv:0.036577751860022545 - timing_s/step:12.5"
)
# A terminal copy hard-wraps the line anywhere, even inside a number (verl issue 7412).
WRAPPED = "\n".join(
    ["(TaskRunner pid=1) step:6 - actor/pg_loss:0.1 - timing_s/step:10.0", *[FULL_LINE[i : i + 70] for i in range(0, len(FULL_LINE), 70)],
     "(TaskRunner pid=1) step:8 - actor/pg_loss:0.2"]
)


def test_odd_values_wrapped_lines_and_gzip(tmp_path: Path) -> None:
    text = WRAPPED
    plain = tmp_path / "train.log"
    plain.write_text(text + "\n")
    packed = tmp_path / "train.log.gz"
    with gzip.open(packed, "wt") as fh:
        fh.write(text + "\n")
    for path in (plain, packed):
        log = read_verl_log(path)
        assert log.steps["step"].to_list() == [6, 7, 8]
        row = dict(log.metrics.filter(pl.col("step") == 7).select("key", "value").iter_rows())
        assert row["actor/pg_loss"] == -0.25 and row["actor/grad_norm"] == math.inf and row["perf/x"] == -math.inf
        assert row["critic/score/mean"] == 0.125 and row["training/flag"] == 1.0 and row["response_length/mean"] == 350.0
        assert row["timing_s/adv"] == 0.036577751860022545 and row["timing_s/step"] == 12.5
        assert log.unparsed_lines == 0


def test_torch_tensor_values_read_as_numbers(tmp_path: Path) -> None:
    """A metric left a torch tensor prints as ``tensor(0.5000, device='cuda:0')``: still a number."""
    log_path = tmp_path / "train.log"
    log_path.write_text("step:1 - actor/grad_norm:tensor(0.5000, device='cuda:0') - actor/entropy:tensor(nan, device='cuda:0')"
                        " - critic/score/mean:tensor(3.) - actor/lr:np.float64(1e-06)\n")
    log = read_verl_log(log_path)
    row = dict(log.metrics.select("key", "value").iter_rows())
    assert row["actor/grad_norm"] == 0.5 and math.isnan(row["actor/entropy"]) and row["critic/score/mean"] == 3.0
    assert row["actor/lr"] == 1e-06 and log.unparsed_lines == 0


def test_records_that_met_on_one_line_are_read_apart(tmp_path: Path) -> None:
    """A print that lost its newline runs into the next record: each keeps its own step's values."""
    scores = ["0.5", "np.float64(0.25)", "nan", "True", "0.75", "1e-05"]
    records = [f"step:{step} - actor/pg_loss:{step / 10} - training/global_step:{step} - critic/score/mean:{score}"
               for step, score in enumerate(scores, 1)]
    apart, met = tmp_path / "apart.log", tmp_path / "met.log"
    apart.write_text("".join(f"(TaskRunner pid=7) {r}\n" for r in records) + "(TaskRunner pid=7) RuntimeError: CUDA error: an illegal memory access was encountered\n")
    # Run together with and without the second record's prefix, after a number, a repr, nan and True.
    met.write_text(f"(TaskRunner pid=7) {records[0]}(TaskRunner pid=7) {records[1]}{records[2]}\n"
                   f"(TaskRunner pid=7) {records[3]}{records[4]}(TaskRunner pid=7) {records[5]}"
                   "(TaskRunner pid=7) RuntimeError: CUDA error: an illegal memory access was encountered\n")
    expected, log = read_verl_log(apart), read_verl_log(met)
    columns = ["step", "key", "value"]
    assert log.metrics.select(columns).equals(expected.metrics.select(columns), null_equal=True)
    assert log.steps["step"].to_list() == list(range(1, 7)) and log.unparsed_lines == 0
    assert not any("restart" in note for note in log.notes) and log.events.filter(pl.col("kind") == "run_resumed").is_empty()
    assert log.events.filter(pl.col("kind") == "illegal_memory_access")["step"].to_list() == [7]


@needs_samples
def test_metric_tail_without_its_head_is_unparsed() -> None:
    log = read_verl_log(EXCERPTS / "issue7412_step_timing_tail.log")
    assert log.steps.is_empty() and log.unparsed_lines == 2 and log.events.is_empty()


def test_restart_into_the_same_log_later_copy_wins(tmp_path: Path) -> None:
    spec = VerlRunSpec(steps=12, save_freq=4, restart=(10, 8), test_freq=0)
    paths = write_verl_run(tmp_path / "run", spec)
    log = read_verl_log(paths.train_log)
    assert log.steps["step"].to_list() == [*range(1, 11), *range(9, 13)]  # every copy, in log order
    # Steps 9 and 10 ran twice; the second attempt's values win and point at its lines.
    assert log.metrics["step"].unique().sort().to_list() == list(range(0, 13))  # step 0: validation before training
    assert log.superseded["step"].unique().sort().to_list() == [9, 10]
    lines = dict(log.metrics.filter(pl.col("key") == "critic/score/mean").select("step", "line").iter_rows())
    assert lines[9] > lines[12 - 4] and lines[10] > lines[9]
    first_attempt = [ln for ln in paths.train_log.read_text().splitlines() if "step:9 -" in ln][0]
    assert lines[9] != paths.train_log.read_text().splitlines().index(first_attempt) + 1
    resumed = log.events.filter(pl.col("kind") == "run_resumed")
    assert resumed.height == 1 and "Load from checkpoint folder" in resumed["message"][0]
    assert any("logged more than once" in n for n in log.notes)


def test_restart_without_a_resume_line_is_marked(tmp_path: Path) -> None:
    log_path = tmp_path / "train.log"
    rows = [metric_line(s, {"critic/score/mean": 0.5, "timing_s/step": 1.0}, "pformat") for s in (1, 2, 3, 4, 2, 3, 4, 5)]
    log_path.write_text("\n".join(f"(TaskRunner pid=9) {r}" for r in rows) + "\n")
    log = read_verl_log(log_path)
    assert log.steps["step"].to_list() == [1, 2, 3, 4, 2, 3, 4, 5]
    marks = log.events.filter(pl.col("kind") == "run_resumed")
    assert marks.select("line", "step", "source").rows() == [(5, 2, "verl")]
    assert log.metrics.filter(pl.col("key") == "critic/score/mean").select("step", "line").rows() == [(1, 1), (2, 5), (3, 6), (4, 7), (5, 8)]
    assert log.superseded.filter(pl.col("key") == "critic/score/mean").select("step", "line").rows() == [(2, 2), (3, 3), (4, 4)]


def test_a_restart_that_stopped_short_abandons_the_attempt_before_it(tmp_path: Path) -> None:
    """Steps 1–6, then a restart from step 2 that logged 3–4 and stopped: steps 5–6 are the
    abandoned attempt's, not the run's (each key's later value winning had kept them)."""
    log_path = tmp_path / "train.log"
    score = {1: 0.5, 2: 0.5, 3: 0.5, 4: 0.0, 5: 0.0, 6: 0.0}
    rows = [metric_line(s, {"critic/score/mean": score[s], "timing_s/step": 1.0}, "pformat") for s in range(1, 7)]
    rows += [metric_line(2, {"val-core/openai/gsm8k/reward/mean@1": 0.5}, "pformat")]  # val_before_train: goes back nowhere
    rows += [metric_line(s, {"critic/score/mean": 0.75, "timing_s/step": 1.0}, "pformat") for s in (3, 4)]
    log_path.write_text("\n".join(f"(TaskRunner pid=9) {r}" for r in rows) + "\n")
    log = read_verl_log(log_path)
    run = dict(log.metrics.filter(pl.col("key") == "critic/score/mean").select("step", "value").iter_rows())
    assert run == {1: 0.5, 2: 0.5, 3: 0.75, 4: 0.75}
    assert log.superseded.filter(pl.col("key") == "critic/score/mean")["step"].to_list() == [3, 4, 5, 6]
    assert log.steps["step"].to_list() == [1, 2, 3, 4, 5, 6, 3, 4]


def test_jsonl_file_logger(tmp_path: Path) -> None:
    paths = write_verl_run(tmp_path / "run", VerlRunSpec(steps=5, nan_steps=frozenset({2}), save_freq=0))
    assert paths.jsonl == tmp_path / "run" / "verl_grpo_example_gsm8k" / "qwen2_7b_function_rm.jsonl"
    first = json.loads(paths.jsonl.read_text().splitlines()[1])
    assert first["step"] == 1 and isinstance(first["data"], dict)
    with paths.jsonl.open("a") as fh:
        fh.write('{"step": 6, "data": {"x": "text", "y": [1, 2], "critic/score/mean": 0.5}}\n')
        # damaged steps: not numbers any run reaches, counted as unparsed lines, never an error
        fh.write('{"step": 1e400, "data": {}}\n{"step": 99999999999999999999, "data": {"a": 1}}\n{"step": 7, "da')
    log = read_verl_log(paths.jsonl)
    assert log.steps["step"].to_list() == [1, 2, 3, 4, 5, 6]
    assert math.isnan(_value(log, 2, "actor/grad_norm"))  # written as null
    assert _value(log, 6, "critic/score/mean") == 0.5
    assert log.unparsed_lines == 3 and log.lines == 10 and log.kind == "verl_jsonl"
    assert any("null" in n for n in log.notes) and any("not numbers" in n for n in log.notes)
    assert log.facts == {"project_name": "verl_grpo_example_gsm8k", "experiment_name": "qwen2_7b_function_rm"}
    console = read_verl_log(paths.train_log)
    both = console.metrics.join(log.metrics, on=["step", "key"], suffix="_jsonl").filter(pl.col("step") < 6)
    assert both.height > 50 and both.filter(~pl.col("value").is_nan()).select((pl.col("value") == pl.col("value_jsonl")).all()).item()


def _file_logger_lines() -> list[str]:
    """File-logger lines with everything the Polars decoder must hand on or count: NaN written as
    null, strings, lists, a nested object, keys that are a number (or a boolean) in one line and a
    string or a list in another, keys in another order, a step logged again, a float step and a
    line cut short."""
    lines = []
    for step in range(1, 301):
        data: dict = {"actor/pg_loss": step / 100, "critic/score/mean": step % 7, "flag": step % 2 == 0}
        if step % 10 == 0:
            data["val-core/acc"] = 0.5
        if step % 97 == 0:
            data["actor/grad_norm"] = None
        if step % 50 == 0:
            data |= {"note": "text", "lst": [1, 2], "nested": {"q": 1}}
        if step > 200:
            data["mixed"] = "0.5" if step == 250 else 0.25
        if step in (20, 21):  # a list, then a number; a string, then a boolean
            data |= {"shape": [1, 2] if step == 20 else 3, "kind": "s" if step == 20 else True}
        if step % 3 == 0:
            data = dict(reversed(list(data.items())))
        lines.append(json.dumps({"step": step, "data": data}))
        if step == 150:
            lines += [json.dumps({"step": 150, "data": {"actor/pg_loss": 9.0}}), json.dumps({"step": 151.0, "data": {}}), ""]
    return [*lines, '{"step": 301, "da']


@pytest.mark.parametrize("batch_bytes", [61, 4096, 1 << 20])
def test_file_logger_decoders_and_batches_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch_bytes: int) -> None:
    """Polars decodes the file logger's lines a batch at a time and hands the ones it cannot type
    for sure to a line-by-line reader: every line read by that reader alone, and any batch size,
    give the same frames, counts and notes."""
    import parsers._lines as lines
    import parsers.verl as reader

    path = tmp_path / "proj" / "exp.jsonl"
    path.parent.mkdir()
    path.write_text("\n".join(_file_logger_lines()) + "\n")
    want = read_verl_log(path)
    assert want.steps["step"].to_list() == list(range(1, 301)) and want.unparsed_lines == 1  # the cut line
    assert _value(want, 150, "actor/pg_loss") == 9.0 and math.isnan(_value(want, 97, "actor/grad_norm"))
    assert _value(want, 10, "flag") == 1.0 and _value(want, 260, "mixed") == 0.25
    assert _value(want, 21, "shape") == 3.0 and _value(want, 21, "kind") == 1.0
    assert want.metrics.filter(pl.col("key") == "mixed").height == 99  # "0.5" at step 250 is a string
    assert any("3 values were null" in n for n in want.notes) and any("21 values were not numbers" in n for n in want.notes)
    monkeypatch.setattr(lines, "HEAVY_BATCH_BYTES", batch_bytes)
    got = read_verl_log(path)
    monkeypatch.setattr(reader, "_decoded", lambda rows: (_ for _ in ()).throw(reader._Mixed()))
    careful = read_verl_log(path)
    for log in (got, careful):
        assert log.metrics.equals(want.metrics) and log.steps.equals(want.steps)
        assert (log.lines, log.unparsed_lines, log.notes) == (want.lines, want.unparsed_lines, want.notes)


# ---------------------------------------------------------------------------------------------
# Scenarios


def test_zero_score_scenario(tmp_path: Path) -> None:
    log = read_verl_log(zero_score_run(tmp_path / "zero").train_log)
    score = log.metrics.filter((pl.col("key") == "critic/score/mean") & (pl.col("step") >= 1))
    assert score.height == 12 and score["value"].to_list() == [0.0] * 12
    assert set(log.events["kind"]) <= {"checkpoint_saved"}


def test_nccl_hang_scenario_console(tmp_path: Path) -> None:
    paths = nccl_hang_run(tmp_path / "hang")
    log = read_verl_log(paths.train_log)
    assert log.steps["step"].max() == 7
    events = log.events
    assert set(events["kind"]) == {"checkpoint_saved", "nccl_timeout", "fatal_check", "worker_died", "actor_died"}
    failures = events.filter(pl.col("kind") != "checkpoint_saved")
    assert set(failures["step"]) == {8}  # after step:7, during step 8
    assert events.filter(pl.col("kind") == "nccl_timeout")["message"][0].count("Timeout(ms)=600000") == 1
    assert read_verl_checkpoints(paths.ckpt_root)["step"].to_list() == [4]


def test_oom_kill_scenario_console(tmp_path: Path) -> None:
    log = read_verl_log(ray_oom_kill_run(tmp_path / "oom").train_log)
    assert log.steps["step"].max() == 5
    oom = log.events.filter(pl.col("kind") == "host_oom_kill")
    assert oom.height == 1 and oom["step"][0] == 6 and oom["severity"][0] == "fatal"


@needs_samples
def test_sample_driver_console_has_steps_and_failure() -> None:
    log = read_verl_log(SAMPLES / "ray" / "a_actor_exit" / "driver.log")
    assert log.steps["step"].to_list() == [1, 2]
    assert set(log.events["kind"]) == {"worker_died", "actor_died"} and set(log.events["step"]) == {3}


def test_inputs_are_not_touched(tmp_path: Path) -> None:
    paths = nccl_hang_run(tmp_path / "hang")
    before = tree_state(paths.root)
    read_verl_log(paths.train_log)
    read_verl_log(paths.jsonl)
    read_verl_checkpoints(paths.ckpt_root)
    assert tree_state(paths.root) == before


# ---------------------------------------------------------------------------------------------
# Checkpoints


def test_checkpoints_complete_and_resumable(tmp_path: Path) -> None:
    paths = write_verl_run(tmp_path / "run", VerlRunSpec(steps=12, save_freq=4))
    frame = read_verl_checkpoints(paths.ckpt_root)
    assert frame.schema == pl.Schema(CHECKPOINT_SCHEMA)
    assert frame.select("step", "kind", "role", "complete", "resumable").rows() == [
        (4, "verl", "actor", True, True), (8, "verl", "actor", True, True), (12, "verl", "actor", True, True)
    ]
    assert frame["problems"].to_list() == [[], [], []] and frame["time"].null_count() == 0
    assert latest_checkpointed_iteration(paths.ckpt_root) == 12
    assert find_verl_checkpoint_roots(tmp_path) == [paths.ckpt_root]


def test_checkpoint_problems(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    for step in (10, 20, 30, 40, 50, 60):
        write_checkpoint(root / f"global_step_{step}", 4, hf_weights=step == 60)
    (root / "global_step_20" / "actor" / "model_world_size_4_rank_3.pt").unlink()
    (root / "global_step_20" / "actor" / "model_world_size_4_rank_2.pt").unlink()
    for rank in range(4):
        (root / "global_step_30" / "actor" / f"optim_world_size_4_rank_{rank}.pt").unlink()
    (root / "global_step_40" / "actor" / "fsdp_config.json").unlink()
    (root / "global_step_50" / "actor" / "extra_state_world_size_4_rank_0.pt").write_bytes(b"")
    weights = root / "global_step_60" / "actor" / "huggingface" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-2])
    (root / "global_step_70").mkdir()
    (root / "latest_checkpointed_iteration.txt").write_text("50")
    frame = read_verl_checkpoints(root)
    rows = {row["step"]: row for row in frame.iter_rows(named=True)}
    assert not rows[20]["complete"] and "actor/model shards missing for ranks 2-3 (2 of 4 present)" in rows[20]["problems"]
    # (every other save has its optimizer state: this one did not finish, and verl's loader would fail on it)
    assert not rows[30]["complete"] and "actor/no optimizer state (optim_world_size_*), which other saves of this run have: " \
        "the save did not finish" in rows[30]["problems"]
    assert not rows[40]["complete"] and "actor/fsdp_config.json missing: the save did not finish" in rows[40]["problems"]
    assert not rows[50]["complete"] and "actor/extra_state_world_size_4_rank_0.pt is empty (0 bytes)" in rows[50]["problems"]
    assert not rows[60]["complete"] and any("model.safetensors is truncated" in p for p in rows[60]["problems"])
    assert any("newer than latest_checkpointed_iteration.txt (50)" in p for p in rows[60]["problems"])
    assert rows[70]["problems"][0] == "actor/ missing" and not rows[70]["complete"] and rows[70]["role"] is None
    assert rows[10]["complete"] and rows[10]["resumable"]


def test_tracker_naming_a_missing_folder_and_megatron_layout(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    actor = root / "global_step_5" / "actor"
    (actor / "dist_ckpt").mkdir(parents=True)
    (actor / "huggingface").mkdir()
    (actor / "huggingface" / "config.json").write_text("{}")
    (actor / "dist_ckpt" / "__0_0.distcp").write_bytes(b"x" * 8)
    (actor / "dist_ckpt" / ".metadata").write_bytes(b"x" * 8)
    (root / "global_step_5" / "data.pt").write_bytes(b"x")
    broken = root / "global_step_6" / "actor" / "dist_ckpt"
    broken.mkdir(parents=True)
    (broken / "__0_0.distcp").write_bytes(b"x")
    (root / "latest_checkpointed_iteration.txt").write_text("7")
    rows = read_verl_checkpoints(root).select("step", "complete", "resumable", "problems").rows()
    assert rows[0][:3] == (5, True, True)
    assert rows[1][:3] == (6, False, False) and "actor/dist_ckpt/.metadata missing: the save did not finish" in rows[1][3]
    assert rows[2] == (7, False, False, ["latest_checkpointed_iteration.txt names global_step_7, which is missing: "
                                         "trainer.resume_mode=auto would train from scratch"])


def test_state_the_run_never_saves_leaves_its_checkpoints_complete_not_resumable(tmp_path: Path) -> None:
    """``checkpoint.save_contents`` without ``extra``: no save has extra state, so none is
    unfinished for lacking it — each is complete, and cannot resume in full."""
    root = tmp_path / "ckpt"
    for step in (10, 20):
        write_checkpoint(root / f"global_step_{step}", 2)
        for rank in range(2):
            (root / f"global_step_{step}" / "actor" / f"extra_state_world_size_2_rank_{rank}.pt").unlink()
    rows = read_verl_checkpoints(root).select("complete", "resumable", "problems").rows()
    assert [r[:2] for r in rows] == [(True, False), (True, False)]
    assert all(any("checkpoint.save_contents left it out" in p for p in r[2]) for r in rows)


def test_resume_args(tmp_path: Path) -> None:
    paths = write_verl_run(tmp_path / "run", VerlRunSpec(steps=8, save_freq=4))
    step = paths.checkpoints[-1]
    assert resume_args(step) == ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={step}"]
    assert resume_args(paths.ckpt_root) == ["trainer.resume_mode=auto", f"trainer.default_local_dir={paths.ckpt_root}"]
    assert resume_command(step, "python3 -m verl.trainer.main_ppo data.train_files=x").endswith(f"trainer.resume_from_path={step}")
    with pytest.raises(ValueError):
        resume_args(tmp_path)


def test_empty_and_missing_roots(tmp_path: Path) -> None:
    assert read_verl_checkpoints(tmp_path / "nope").is_empty()
    assert read_verl_checkpoints(tmp_path).schema == pl.Schema(CHECKPOINT_SCHEMA)
    shutil.rmtree(tmp_path)


def test_neighbouring_lines_are_not_glued_to_a_metric_line(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    path.write_text(
        "(TaskRunner pid=1) step:1 - actor/pg_loss:0.1 - timing_s/step:10.0\n"
        "(WorkerDict pid=2) done\n"
        "(TaskRunner pid=1) step:2 - actor/pg_loss:0.2 - timing_s/step:11.0\n"
        "validation - generation end\n"
        "(TaskRunner pid=1) step:3 - actor/pg_loss:0.3 - timing_s/step:12.0\n"
    )
    log = read_verl_log(path)
    assert log.metrics.filter(pl.col("key") == "timing_s/step")["value"].to_list() == [10.0, 11.0, 12.0]
    assert log.unparsed_lines == 0


@needs_samples
@pytest.mark.parametrize("batch_bytes", [1, 61, 4096])
def test_batches_do_not_change_the_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch_bytes: int) -> None:
    """Batch cuts fall between a metric line and its wrapped pieces, or before a lone token that
    only counts right under one; every console reads the same as in one pass."""
    import parsers._lines as lines

    wrapped = tmp_path / "wrapped.log"
    # A lone token under an ordinary line (not a piece: left out), and one under a metric line.
    lone = ["(TaskRunner pid=1) some output", "ep:3", "(TaskRunner pid=1) step:9 - actor/pg_loss:0.3 - timing_s/ad", "v:1.5"]
    wrapped.write_text("\n".join([WRAPPED, *lone]) + "\n")
    hang = nccl_hang_run(tmp_path / "hang").train_log
    oom = ray_oom_kill_run(tmp_path / "oom").train_log
    paths = [wrapped, hang, oom, *sorted((SAMPLES / "ray").glob("*/driver.log"))]
    whole = {path: read_verl_log(path) for path in paths}
    assert whole[wrapped].steps["step"].to_list() == [6, 7, 8, 9] and whole[wrapped].unparsed_lines == 0
    assert _value(whole[wrapped], 9, "timing_s/adv") == 1.5
    monkeypatch.setattr(lines, "BATCH_BYTES", batch_bytes)
    monkeypatch.setattr(lines, "HEAVY_BATCH_BYTES", batch_bytes)
    for path, want in whole.items():
        got = read_verl_log(path)
        for frame in ("steps", "metrics", "events"):
            assert getattr(got, frame).equals(getattr(want, frame)), (path.name, frame)
        assert (got.lines, got.unparsed_lines, got.notes, got.facts) == (want.lines, want.unparsed_lines, want.notes, want.facts)


def _slices_log(tmp_path: Path) -> Path:
    """Wrapped lines, records that met on one line, numpy and torch reprs, validation alone and a
    restart that stopped short: every record shape the console reader splits into slices."""
    met = (f"(TaskRunner pid=7) {metric_line(5, {'critic/score/mean': 0.5, 'timing_s/step': 1.0}, 'pformat')}"
           f"{metric_line(6, {'critic/score/mean': 0.25, 'timing_s/step': 1.0}, 'pformat')}")
    rows = [WRAPPED, met, "(TaskRunner pid=7) step:2 - val-core/openai/gsm8k/reward/mean@1:np.float64(0.5)",
            "(TaskRunner pid=7) step:3 - critic/score/mean:np.int64(1) - actor/grad_norm:tensor(0.5000, device='cuda:0')"
            " - training/flag:np.True_ - actor/x:oops - timing_s/step:np.float64(2.5)",
            "(TaskRunner pid=7) step:4 - critic/score/mean:np.float64(0.75) - timing_s/step:np.float64(2.5)"]
    path = tmp_path / "slices.log"
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.mark.parametrize("slice_bytes", [1, 61, 4096])
def test_slices_do_not_change_the_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slice_bytes: int) -> None:
    """Metric lines are split into values a slice at a time (a long log's hundred values a line
    are rows only while their slice is read): the cuts, anywhere between records, change nothing."""
    import parsers.verl as verl

    paths = [_slices_log(tmp_path), nccl_hang_run(tmp_path / "hang").train_log,
             write_verl_run(tmp_path / "restart", VerlRunSpec(steps=12, save_freq=4, restart=(10, 8), test_freq=3)).train_log]
    whole = {path: read_verl_log(path) for path in paths}
    log = whole[paths[0]]
    assert log.steps["step"].to_list() == [6, 7, 8, 5, 6, 3, 4] and log.unparsed_lines == 1  # actor/x:oops
    assert _value(log, 3, "critic/score/mean") == 1.0 and _value(log, 3, "actor/grad_norm") == 0.5
    assert _value(log, 3, "training/flag") == 1.0 and _value(log, 4, "timing_s/step") == 2.5
    assert log.superseded.filter(pl.col("key") == "critic/score/mean")["step"].to_list() == [7, 5, 6]
    monkeypatch.setattr(verl, "_SLICE_BYTES", slice_bytes)
    for path, want in whole.items():
        got = read_verl_log(path)
        for frame in ("steps", "metrics", "superseded", "events"):
            assert getattr(got, frame).equals(getattr(want, frame)), (path.name, frame)
        assert (got.lines, got.unparsed_lines, got.notes, got.facts) == (want.lines, want.unparsed_lines, want.notes, want.facts)


def test_kept_keys_leave_the_steps_as_they_were(tmp_path: Path) -> None:
    """Only the keys asked for are kept, as the values are read; which lines train (not validation
    alone), and so the steps and what a restart abandoned, are still told from every key."""
    paths = write_verl_run(tmp_path / "run", VerlRunSpec(steps=12, save_freq=4, restart=(10, 8), test_freq=3))
    every, kept = read_verl_log(paths.train_log), read_verl_log(paths.train_log, keys="^critic/score/mean$")
    assert kept.steps.equals(every.steps) and kept.events.equals(every.events) and kept.notes == every.notes
    for frame in ("metrics", "superseded"):
        want = getattr(every, frame).filter(pl.col("key") == "critic/score/mean")
        assert not want.is_empty() and getattr(kept, frame).equals(want), frame


@needs_samples
@pytest.mark.parametrize(
    ("name", "kind"),
    [("issue1158_nccl_alltoall_timeout.log", "nccl_timeout"), ("issue2828_cuda_oom.log", "cuda_oom"),
     ("issue2950_ray_oom_kill.log", "host_oom_kill"), ("issue4921_actor_died_sigkill.log", "actor_died")],
)
def test_a_console_excerpt_given_alone_is_read_for_its_failures(name: str, kind: str) -> None:
    """A driver's output pasted without metric lines, given by name: its failures are events (it was
    "no training run found", exit 2); in a folder such a file is not a run of its own."""
    result = CliRunner().invoke(app, ["events", str(EXCERPTS / name)])
    assert result.exit_code == 0, result.output
    events = [json.loads(line) for line in result.stdout.splitlines()]
    assert kind in {e["kind"] for e in events} and {e["source"] for e in events} <= {"ray", "torch"}
    [run] = analyze([EXCERPTS / name]).runs
    assert run.framework == "unknown" and run.sources[0].kind == "console_log" and run.sources[0].unparsed_lines == 0
    assert "failure" in (run.unjudged() or "")


def test_a_console_log_in_a_folder_is_no_run(tmp_path: Path) -> None:
    (tmp_path / "notes.log").write_text("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\nValueError: x\n")
    assert CliRunner().invoke(app, ["events", str(tmp_path)]).exit_code == 2
    assert CliRunner().invoke(app, ["events", str(tmp_path / "notes.log")]).exit_code == 0


def test_the_planned_steps_are_the_trainers_count_not_the_configs_none(tmp_path: Path) -> None:
    """verl prints its config (``'total_training_steps': None`` by default), then the count it
    computed: the count is the planned number of steps."""
    log = tmp_path / "train.log"
    log.write_text("(TaskRunner pid=1) {'trainer': {'total_training_steps': None, 'total_epochs': 2}}\n"
                   "(TaskRunner pid=1) Total training steps: 12\n"
                   "(TaskRunner pid=1) step:1 - critic/score/mean:0.5 - timing_s/step:1.0\n")
    assert read_verl_log(log).facts["total_training_steps"] == "12"


def test_a_file_that_is_no_log_is_not_read_as_one_even_given_by_name(tmp_path: Path) -> None:
    """Prose about failures (a README) names them without any having happened."""
    notes = tmp_path / "README.md"
    notes.write_text("If you see `Traceback (most recent call last):` or `CUDA out of memory`, lower the batch.\n")
    assert CliRunner().invoke(app, ["events", str(notes)]).exit_code == 2
