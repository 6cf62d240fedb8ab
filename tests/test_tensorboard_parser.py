"""TensorBoard event files written by the real ``tensorboardX`` writer (AReaL's; verl's torch
writer emits the same records), read back without TensorFlow: both scalar encodings, float32,
restarts, add_scalars sub-folders, torn and junk files.
"""

from __future__ import annotations

import math
import struct
import time
from datetime import datetime
from pathlib import Path

import polars as pl
import pytest

tensorboardX = pytest.importorskip("tensorboardX")

from tensorboardX.proto.summary_pb2 import Summary, SummaryMetadata  # noqa: E402
from tensorboardX.proto.tensor_pb2 import TensorProto  # noqa: E402
from tensorboardX.proto.tensor_shape_pb2 import TensorShapeProto  # noqa: E402

from parsers.schema import METRIC_SCHEMA  # noqa: E402
from parsers.tensorboard import find_event_files, read_tensorboard  # noqa: E402

STEPS, COLLAPSE, NAN_STEP = 40, 25, 9
DT_FLOAT, DT_DOUBLE, DT_STRING = 1, 2, 7


def f32(value: float) -> float:
    return struct.unpack("<f", struct.pack("<f", value))[0]


def reward(step: int) -> float:
    return 0.0 if step >= COLLAPSE else 0.3 + step / 100


def _tensor_scalar(writer, tag: str, tensor: TensorProto, step: int, with_metadata: bool) -> None:
    """A tensor scalar as torch ``add_scalar(new_style=True)`` / TF2 ``tf.summary.scalar`` write it."""
    metadata = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="scalars")) if with_metadata else None
    writer.file_writer.add_summary(Summary(value=[Summary.Value(tag=tag, tensor=tensor, metadata=metadata)]), step)


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tb") / "run"
    writer = tensorboardX.SummaryWriter(str(root), filename_suffix=".first")
    for step in range(STEPS):
        writer.add_scalar("grpo_actor/task_reward/avg", reward(step), step)
        writer.add_scalar("grpo_actor/grad_norm", math.nan if step == NAN_STEP else 0.55, step)
        writer.add_histogram("weights", [1.0, 2.0, 3.0], step)
        writer.add_text("sample", f"completion {step}", step)
        # torch new_style: float_val, metadata on every value
        _tensor_scalar(writer, "new_style/kl", TensorProto(dtype=DT_FLOAT, float_val=[step * 0.5]), step, True)
        # TF2: tensor_content, rank 0, metadata only with the first value of the tag
        content = TensorProto(dtype=DT_DOUBLE, tensor_content=struct.pack("<d", step / 3), tensor_shape=TensorShapeProto())
        _tensor_scalar(writer, "tf2/entropy", content, step, step == 0)
        _tensor_scalar(writer, "text_tensor", TensorProto(dtype=DT_STRING, string_val=[b"hi"]), step, False)
    writer.add_scalars("loss", {"actor": 0.25, "critic": 0.5}, 0)
    writer.close()
    time.sleep(0.05)  # the restart's first record must carry a later wall_time
    restart = tensorboardX.SummaryWriter(str(root), filename_suffix=".restart")
    for step in range(30, 45):
        restart.add_scalar("grpo_actor/task_reward/avg", 0.75, step)
    restart.close()
    return root


def test_scalars_of_both_encodings_read_back(logdir: Path) -> None:
    run = read_tensorboard(logdir)
    assert run.metrics.schema == pl.Schema(METRIC_SCHEMA)
    assert run.records_skipped == 0
    series = {
        key: dict(frame.select("step", "value").iter_rows())
        for (key,), frame in run.metrics.partition_by("key", as_dict=True).items()
    }
    assert set(series) == {
        "grpo_actor/task_reward/avg", "grpo_actor/grad_norm", "new_style/kl", "tf2/entropy",
        "loss/actor/loss", "loss/critic/loss",
    }  # histograms and text are not scalars
    assert series["grpo_actor/grad_norm"][0] == f32(0.55) == 0.550000011920929
    assert math.isnan(series["grpo_actor/grad_norm"][NAN_STEP])
    assert series["new_style/kl"] == {s: s * 0.5 for s in range(STEPS)}
    assert series["tf2/entropy"] == {s: s / 3 for s in range(STEPS)}
    assert series["loss/actor/loss"] == {0: 0.25} and series["loss/critic/loss"] == {0: 0.5}

    rewards = series["grpo_actor/task_reward/avg"]
    assert sorted(rewards) == list(range(45))
    assert all(rewards[s] == f32(reward(s)) for s in range(30))
    assert rewards[COLLAPSE - 1] > 0 and rewards[COLLAPSE] == 0.0
    # the restart repeated steps 30–39: its values win
    assert all(rewards[s] == 0.75 for s in range(30, 45))
    assert [n for n in run.notes if "later" in n] == [
        "10 steps an earlier file logged from where a later one went back (a restart) are an attempt the run abandoned: not the run's values"
    ]
    assert run.superseded["step"].to_list() == list(range(30, 40))  # the first file's, kept apart
    assert set(run.superseded["key"].cast(pl.String)) == {"grpo_actor/task_reward/avg"}  # a tag is purged alone, as TensorBoard does

    assert run.metrics["time"].null_count() == 0 and run.metrics["line"].min() >= 2
    assert run.metrics.select("step", "key").is_duplicated().sum() == 0


def test_a_restart_that_stopped_short_abandons_the_earlier_files_later_steps(tmp_path: Path) -> None:
    """Steps 0–39, then a restart from step 20 that wrote 20–29 and stopped: TensorBoard purges the
    first file's 20–39, so the run is 0–29 (later file winning step by step kept 30–39)."""
    first = tensorboardX.SummaryWriter(str(tmp_path), filename_suffix=".first")
    for step in range(40):
        first.add_scalar("reward", 0.0 if step >= 30 else 0.5, step)
    first.close()
    time.sleep(0.05)
    again = tensorboardX.SummaryWriter(str(tmp_path), filename_suffix=".restart")
    for step in range(20, 30):
        again.add_scalar("reward", 0.75, step)
    again.close()
    run = read_tensorboard(tmp_path)
    assert run.metrics["step"].to_list() == list(range(30))
    assert run.metrics.filter(pl.col("step") >= 20)["value"].to_list() == [0.75] * 10
    assert run.superseded["step"].to_list() == list(range(20, 40)) and run.superseded["file"].cast(pl.String).str.ends_with(".first").all()


def test_an_event_file_given_alone_names_the_restarts_file_beside_it(tmp_path: Path) -> None:
    """The first file of a restarted run given by name: the restart's file beside it, which would
    abandon the collapse it holds, is named as not read, not left out without a word."""
    from forensics import analyze

    first = tensorboardX.SummaryWriter(str(tmp_path), filename_suffix=".first")
    for step in range(1, 71):
        first.add_scalar("reward", 0.0 if step >= 55 else 0.5 + 0.01 * (step % 3), step)
    first.close()
    time.sleep(0.05)
    again = tensorboardX.SummaryWriter(str(tmp_path), filename_suffix=".restart")
    for step in range(50, 101):
        again.add_scalar("reward", 0.5 + 0.01 * (step % 3), step)
    again.close()
    [given] = tmp_path.glob("*.first")
    [run] = analyze([given]).runs
    [left] = [s for s in run.sources if s.kind == "not_given"]
    assert left.path.endswith(".restart") and "not read: beside the log given" in left.notes[0]


@pytest.mark.parametrize("window", [64, 1 << 20])
def test_a_step_written_twice_in_one_file_keeps_its_later_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, window: int) -> None:
    """Also when the two copies are in different windows of the file (64 bytes: a record each)."""
    import parsers.tensorboard as reader

    monkeypatch.setattr(reader, "_WINDOW", window)
    writer = tensorboardX.SummaryWriter(str(tmp_path))
    for step in range(4):
        writer.add_scalar("reward", step, step)
        writer.add_scalar("loss", -step, step)
    writer.add_scalar("reward", 9.0, 2)  # step 2 again, in the same file
    writer.close()
    run = read_tensorboard(tmp_path)
    assert run.metrics.select("step", "key", "value").rows() == [
        (0, "reward", 0.0), (0, "loss", 0.0), (1, "reward", 1.0), (1, "loss", -1.0),
        (2, "loss", -2.0), (2, "reward", 9.0), (3, "reward", 3.0), (3, "loss", -3.0),
    ]
    assert not any("later file" in n for n in run.notes)


def test_a_value_damaged_inside_its_record_is_skipped_and_said(tmp_path: Path) -> None:
    """A flipped bit inside a scalar (its length and framing intact) fails the record's data
    checksum: the record is skipped and counted, not read as 2e38. The checksums of a whole file
    agree with TensorFlow's (every record of a real writer's file passes)."""
    import struct

    writer = tensorboardX.SummaryWriter(str(tmp_path / "tb"))
    for step in range(50):
        writer.add_scalar("grpo_actor/task_reward/avg", 0.5, step)
    writer.close()
    [events] = find_event_files(tmp_path / "tb")
    whole = read_tensorboard(events)
    assert whole.records_skipped == 0 and whole.metrics.height == 50
    data = bytearray(events.read_bytes())
    value = struct.pack("<f", 0.5)
    at = data.index(value, len(data) // 2)
    data[at + 3] ^= 0x40  # the exponent: 0.5 → ~2e19
    events.write_bytes(bytes(data))
    hurt = read_tensorboard(events)
    assert hurt.metrics.height == 49 and hurt.metrics["value"].max() == 0.5
    assert hurt.records_skipped == 1 and any("1 records failed their data checksum" in n for n in hurt.notes)


def test_find_event_files_and_read_one_file(logdir: Path) -> None:
    files = find_event_files(logdir)
    assert len(files) == 4 and all("tfevents" in f.name for f in files)
    assert find_event_files(logdir.parent) == files
    first = next(f for f in files if f.name.endswith(".first"))
    single = read_tensorboard(first)
    assert single.files == (str(first),)
    assert single.metrics.filter(pl.col("key") == "grpo_actor/task_reward/avg")["step"].max() == STEPS - 1


def test_parent_folder_gives_the_same_keys(logdir: Path) -> None:
    assert read_tensorboard(logdir.parent).metrics.equals(read_tensorboard(logdir).metrics)


def test_torn_last_record(logdir: Path, tmp_path: Path) -> None:
    source = next(f for f in find_event_files(logdir) if f.name.endswith(".first"))
    data = source.read_bytes()
    torn = tmp_path / source.name
    torn.write_bytes(data[: len(data) - 5])
    whole, part = read_tensorboard(source), read_tensorboard(torn)
    assert any("torn last record" in n for n in part.notes)
    assert part.records_read == whole.records_read - 1
    assert part.metrics.join(whole.metrics, on=["step", "key"], how="anti").is_empty()
    assert whole.metrics.join(part.metrics, on=["step", "key"], how="anti").height <= 1  # at most the cut record


@pytest.mark.parametrize("content", [b"", b"garbage that is not a tfrecord", bytes(range(256)) * 40])
def test_junk_never_raises(tmp_path: Path, content: bytes) -> None:
    junk = tmp_path / "events.out.tfevents.1700000000.host"
    junk.write_bytes(content)
    run = read_tensorboard(tmp_path)
    assert run.metrics.is_empty() and run.metrics.schema == pl.Schema(METRIC_SCHEMA)
    if content:
        assert run.notes


def test_empty_folder(tmp_path: Path) -> None:
    run = read_tensorboard(tmp_path)
    assert run.metrics.is_empty() and run.notes == ("no event files",)


def test_windows_and_the_decoders_do_not_change_the_result(logdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file is read a window at a time and its common records are decoded by Polars, the rest
    field by field: tiny windows, and every record decoded field by field, read the same. The
    extra file has what the Polars decoder must hand on: a tag longer than a one-byte length,
    steps of 0, 2^40 and -5."""
    import parsers.tensorboard as reader

    writer = tensorboardX.SummaryWriter(str(tmp_path / "odd"))
    for step in (0, 1, 300, 2**40, -5):
        writer.add_scalar("a/" + "x" * 130, step * 0.5, step)
        writer.add_scalar("short", 1.5, step)
    writer.close()
    whole = {path: read_tensorboard(path) for path in (logdir, tmp_path / "odd")}
    assert set(whole[tmp_path / "odd"].metrics["step"]) == {0, 1, 300, 2**40, -5}
    polars_decoder = reader._simple_scalar
    for window, decoder in ((64, polars_decoder), (1 << 20, lambda body: (pl.lit(False), polars_decoder(body)[1]))):
        monkeypatch.setattr(reader, "_WINDOW", window)
        monkeypatch.setattr(reader, "_simple_scalar", decoder)
        for path, want in whole.items():
            got = read_tensorboard(path)
            assert got.metrics.equals(want.metrics), (path.name, window)
            assert (got.notes, got.records_read, got.records_skipped) == (want.notes, want.records_read, want.records_skipped)


@pytest.mark.parametrize("zone", ["America/New_York", "Australia/Lord_Howe", "Asia/Kolkata"])
def test_local_times_are_python_s_across_clock_changes(monkeypatch: pytest.MonkeyPatch, zone: str) -> None:
    """Times are ``datetime.fromtimestamp``'s, to the microsecond, also where the clock jumps
    (New York: an hour; Lord Howe: half an hour) and in a zone off by half an hour."""
    import parsers.tensorboard as reader

    monkeypatch.setenv("TZ", zone)
    time.tzset()
    try:
        changes = [1772953200, 1793512800, 1775314800, 1791039600]  # 2026 DST starts/ends around these
        walls = [t + d + frac for t in changes for d in range(-7200, 7200, 997) for frac in (0.0, 0.2500005, 0.9999996)]
        got = pl.select(reader._local(pl.lit(pl.Series(walls))).alias("t"))["t"].to_list()
        assert got == [datetime.fromtimestamp(w) for w in walls]
    finally:
        monkeypatch.undo()
        time.tzset()
