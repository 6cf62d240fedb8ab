"""Property-based fuzzing of every parser: random bytes and mutated real log lines must never
raise, every ``line`` a parser reports must be a physical line of the file, and valid records
around a damaged part must still be read.

``GRPO_FUZZ_EXAMPLES=N`` multiplies nothing and sets every test's ``max_examples`` to N
(default: a small number so the file runs in well under a minute). A long developer run:
``GRPO_FUZZ_EXAMPLES=5000 pytest tests/test_fuzz.py -q``.
"""

from __future__ import annotations

import gzip
import os
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wandb_frames import MAGIC, legacy_stream

from parsers import (
    read_areal_log,
    read_custom_log,
    read_ray_console,
    read_sglang_log,
    read_tensorboard,
    read_verl_log,
    read_wandb_runs,
)

FIXTURES = Path(__file__).parent / "fixtures"
REAL = Path("/work/shared/samples/real")
EXAMPLES = int(os.environ.get("GRPO_FUZZ_EXAMPLES", "0") or 0)


def fuzz_settings(default: int) -> settings:
    return settings(
        max_examples=EXAMPLES or default,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
        derandomize=not EXAMPLES,  # the quick run is reproducible in CI; a long run explores
    )


# --------------------------------------------------------------------------------------------
# Seed corpora: real lines, per parser


def _read_lines(path: Path, start: int = 0, count: int | None = None) -> list[bytes]:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    lines = data.split(b"\n")
    return lines[start : None if count is None else start + count]


SEED000 = FIXTURES / "areal_seed000/outputs/logs/root/gsm8k-grpo-full-local/trial0"


def _areal_lines() -> list[bytes]:
    trainer = SEED000 / "trainer.log.gz"
    lines = _read_lines(trainer, 0, 120)
    lines += _read_lines(trainer, 46900, 200)  # the step-940 collapse with request timeouts around it
    for sample in sorted((REAL / "areal").glob("*.log")):
        lines += _read_lines(sample, 0, 200)
    return [line for line in lines if line.strip()]


def _sglang_lines() -> list[bytes]:
    lines = _read_lines(SEED000 / "llm_server.log")
    for name in ("sglang_hang", "sglang_oom"):
        for server in (FIXTURES / name).rglob("llm_server.log*"):
            lines += _read_lines(server, 0, 150)
    for sample in sorted((REAL / "sglang").glob("*.log")):
        lines += _read_lines(sample, 0, 150)
    return [line for line in lines if line.strip()]


def _verl_lines() -> list[bytes]:
    lines: list[bytes] = []
    for sample in sorted((REAL / "ray_verl").glob("*.log")):
        lines += _read_lines(sample, 0, 150)
    try:
        import verl_builder

        with tempfile.TemporaryDirectory() as tmp:
            paths = verl_builder.write_verl_run(Path(tmp) / "run", verl_builder.VerlRunSpec(steps=6, nan_steps=frozenset({3})))
            lines += _read_lines(paths.train_log)
    except Exception:  # the builder is a convenience; the real samples suffice
        pass
    return [line for line in lines if line.strip()]


def _custom_lines() -> list[bytes]:
    return [line for line in _read_lines(FIXTURES / "seed003/train.log") if line.strip()]


def _ray_lines() -> list[bytes]:
    lines: list[bytes] = []
    for sample in sorted((REAL / "ray_verl").glob("*.log")):
        lines += _read_lines(sample, 0, 200)
    return [line for line in lines if line.strip()]


CORPORA: dict[str, list[bytes]] = {}


def corpus(name: str) -> list[bytes]:
    if name not in CORPORA:
        CORPORA[name] = {"areal": _areal_lines, "sglang": _sglang_lines, "verl": _verl_lines,
                         "custom": _custom_lines, "ray": _ray_lines}[name]()
        assert CORPORA[name], f"no seed lines for {name}"
    return CORPORA[name]


# --------------------------------------------------------------------------------------------
# Mutations

JUNK = st.sampled_from([b"\x00", b"\x00" * 17, b"\xff\xfe", b"\xc3(", b"\xed\xa0\x80", b"\r", b"\r\n", b"\x1b[31m",
                        b"\x1b[", "\u2028".encode(), b"\xe2\x94", "\u2502 \u2550".encode(), b"\t", b"nan", b"inf",
                        b"-1e309", b"9" * 40, b"|", b"\xe2\x94\x82"])


@st.composite
def mutated_document(draw: st.DrawFn, name: str) -> bytes:
    """A slice of real lines of one kind, damaged in several ways, as the bytes of a file."""
    lines = corpus(name)
    start = draw(st.integers(0, max(0, len(lines) - 1)))
    size = draw(st.integers(1, 80))
    doc = list(lines[start : start + size])
    for _ in range(draw(st.integers(0, 8))):
        if not doc:
            doc.append(b"")
        at = draw(st.integers(0, len(doc) - 1))
        line = doc[at]
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate", "junk", "crlf", "long", "dup", "drop",
                                   "splice", "random"]))
        if op == "flip" and line:
            i = draw(st.integers(0, len(line) - 1))
            line = line[:i] + bytes([line[i] ^ (1 << draw(st.integers(0, 7)))]) + line[i + 1 :]
        elif op == "insert":
            i = draw(st.integers(0, len(line)))
            line = line[:i] + draw(st.binary(min_size=1, max_size=8)) + line[i:]
        elif op == "delete" and line:
            i = draw(st.integers(0, len(line) - 1))
            line = line[:i] + line[i + draw(st.integers(1, 16)) :]
        elif op == "truncate":
            line = line[: draw(st.integers(0, len(line)))]
        elif op == "junk":
            i = draw(st.integers(0, len(line)))
            line = line[:i] + draw(JUNK) + line[i:]
        elif op == "crlf":
            line = line + b"\r"
        elif op == "long":
            line = line + draw(st.sampled_from([b"x", b"\xe2\x94\x80", b"0.5 ", b"\x00"])) * draw(st.integers(1000, 300_000))
        elif op == "dup":
            doc.insert(at, line)
        elif op == "drop":
            doc.pop(at)
            continue
        elif op == "splice":  # two processes' lines interleaved mid-line
            other = draw(st.sampled_from(lines))
            i = draw(st.integers(0, len(line)))
            line = line[:i] + other + line[i:]
        elif op == "random":
            line = draw(st.binary(max_size=200))
        doc[at] = line
    data = b"\n".join(doc)
    if draw(st.booleans()):
        data += b"\n"
    if draw(st.integers(0, 9)) == 0:  # cut mid-line anywhere
        data = data[: draw(st.integers(0, len(data)))]
    return data


def physical_lines(data: bytes) -> int:
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def write(folder: Path, name: str, data: bytes, packed: bool = False) -> Path:
    path = folder / (name + (".gz" if packed else ""))
    path.write_bytes(gzip.compress(data) if packed else data)
    return path


FRAMES = ("steps", "metrics", "events", "http", "servers", "markers", "detail")


def check_lines(result: Any, n_lines: int) -> None:
    """Every ``line`` column of every frame the parser returned is a physical line of the file."""
    for attr in FRAMES:
        frame = getattr(result, attr, None)
        if not isinstance(frame, pl.DataFrame) or "line" not in frame.columns or frame.is_empty():
            continue
        lines = frame["line"].drop_nulls()
        if lines.len():
            assert 1 <= lines.min() and lines.max() <= n_lines, (attr, lines.min(), lines.max(), n_lines)
    if hasattr(result, "lines"):
        assert 0 <= result.lines <= n_lines, (result.lines, n_lines)
    if hasattr(result, "unparsed_lines"):
        assert 0 <= result.unparsed_lines <= max(result.lines, n_lines)


TEXT_READERS: dict[str, tuple[str, Callable[[Path], Any]]] = {
    "areal": ("trainer.log", read_areal_log),
    "sglang": ("llm_server.log", read_sglang_log),
    "verl": ("train.log", read_verl_log),
    "custom": ("train.log", read_custom_log),
    "ray": ("job-driver-raysubmit_1.log", read_ray_console),
}


def run_text(name: str, data: bytes, packed: bool, reader: str | None = None) -> Any:
    filename, read = TEXT_READERS[reader or name]
    with tempfile.TemporaryDirectory() as tmp:
        path = write(Path(tmp), filename, data, packed)
        result = read(path)
        check_lines(result, physical_lines(data))
        return result


# --------------------------------------------------------------------------------------------
# Text parsers


@pytest.mark.parametrize("name", sorted(TEXT_READERS))
@fuzz_settings(40)
@given(data=st.data())
def test_mutated_real_lines(name: str, data: st.DataObject) -> None:
    doc = data.draw(mutated_document(name))
    run_text(name, doc, packed=data.draw(st.integers(0, 5)) == 0)


@pytest.mark.parametrize("name", sorted(TEXT_READERS))
@fuzz_settings(25)
@given(doc=st.binary(max_size=4096), packed=st.booleans())
def test_random_bytes(name: str, doc: bytes, packed: bool) -> None:
    run_text(name, doc, packed)


@pytest.mark.parametrize("reader", sorted(TEXT_READERS))
@fuzz_settings(15)
@given(data=st.data())
def test_other_formats_fed_to_each_reader(reader: str, data: st.DataObject) -> None:
    """Each reader given another framework's (mutated) log: no exception, lines in range."""
    source = data.draw(st.sampled_from(sorted(TEXT_READERS)))
    run_text(source, data.draw(mutated_document(source)), packed=False, reader=reader)


def _areal_step_blocks() -> list[bytes]:
    """The first three complete AReaL step blocks of the seed000 trainer log (header to table end)."""
    lines = _read_lines(SEED000 / "trainer.log.gz", 0, 400)
    starts = [i for i, line in enumerate(lines) if b"Train step " in line and b" done." in line]
    blocks = []
    for a, b in zip(starts, starts[1:], strict=False):
        blocks.append(b"\n".join(lines[a:b]) + b"\n")
    return blocks[:3]


def _damage(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["bytes", "nul", "cut_table", "long", "utf8"]))
    if kind == "bytes":
        junk = draw(st.binary(min_size=1, max_size=2000)).replace(b"Train step", b"")
    elif kind == "nul":
        junk = b"\x00" * draw(st.integers(1, 5000))
    elif kind == "cut_table":
        block = _areal_step_blocks()[2].replace(b"Train step 3/", b"Train step 77/")
        junk = block[: draw(st.integers(1, len(block) - 1))]
    elif kind == "long":
        junk = b"\xe2\x94\x80" * draw(st.integers(10_000, 400_000))
    else:
        junk = b"\xff\xfe\xc3(\xed\xa0\x80" * draw(st.integers(1, 100))
    return junk + b"\n"


@fuzz_settings(30)
@given(data=st.data())
def test_areal_steps_survive_damage_between_them(data: st.DataObject) -> None:
    first, second, _ = _areal_step_blocks()
    doc = first + data.draw(st.composite(_damage)()) + second
    log = run_text("areal", doc, packed=data.draw(st.booleans()))
    steps = set(log.steps["step"].to_list())
    assert {1, 2} <= steps, steps
    rewards = log.metrics.filter(pl.col("key") == "grpo_actor/task_reward/avg")
    assert {1, 2} <= set(rewards["step"].to_list())


@fuzz_settings(30)
@given(junk=st.binary(min_size=1, max_size=3000), packed=st.booleans())
def test_custom_iters_survive_damage_between_them(junk: bytes, packed: bool) -> None:
    lines = _custom_lines()
    iters = [line for line in lines if line.startswith(b"iter ")]
    first, last = iters[0], iters[-1]
    doc = first + b"\n" + junk.replace(b"iter", b"") + b"\n" + last + b"\n"
    log = run_text("custom", doc, packed)
    want = {int(first.split()[1].rstrip(b":")), int(last.split()[1].rstrip(b":"))}
    assert want <= set(log.steps["step"].to_list())


@fuzz_settings(30)
@given(junk=st.binary(min_size=1, max_size=3000), packed=st.booleans())
def test_verl_steps_survive_damage_between_them(junk: bytes, packed: bool) -> None:
    import verl_builder

    values = {"critic/score/mean": 0.5, "actor/entropy": 1.25, "training/global_step": 0}
    one = verl_builder.metric_line(1, {**values, "training/global_step": 1}, "pformat").encode()
    two = verl_builder.metric_line(2, {**values, "training/global_step": 2}, "pformat").encode()
    doc = one + b"\n" + junk.replace(b"step:", b"") + b"\n" + two + b"\n"
    log = run_text("verl", doc, packed)
    assert {1, 2} <= set(log.steps["step"].to_list())


@fuzz_settings(30)
@given(junk=st.binary(min_size=1, max_size=3000))
def test_sglang_records_survive_damage_between_them(junk: bytes) -> None:
    decode = [line for line in _sglang_lines() if b"Decode batch" in line]
    assert len(decode) >= 2
    clean = run_text("sglang", decode[0] + b"\n" + decode[-1] + b"\n", packed=False)
    doc = decode[0] + b"\n" + junk + b"\n" + decode[-1] + b"\n"
    damaged = run_text("sglang", doc, packed=False)
    keys = set(clean.metrics["key"].to_list())
    assert keys and keys <= set(damaged.metrics["key"].to_list())
    assert damaged.metrics["line"].max() == physical_lines(doc)


def test_sglang_bare_decode_batch_line() -> None:
    """Found by the long fuzz run: a ``Decode batch`` record with nothing after it."""
    log = run_text("sglang", b"[2025-11-18 08:01:41] Decode batch\n", packed=False)
    assert log.metrics.filter(pl.col("key").cast(pl.String).str.contains("running")).is_empty() and log.unparsed_lines == 1


# --------------------------------------------------------------------------------------------
# Binary readers: TensorBoard event files and W&B transaction logs


def _masked_crc(data: bytes) -> int:
    crc = _crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def _tb_event(step: int, tag: str, value: float) -> bytes:
    """An ``Event{wall_time, step, summary{value{tag, simple_value}}}`` protobuf, hand-encoded."""
    tag_b = tag.encode()
    val = b"\x0a" + bytes([len(tag_b)]) + tag_b + b"\x15" + struct.pack("<f", value)
    summary = b"\x0a" + bytes([len(val)]) + val
    return b"\x09" + struct.pack("<d", 1.7e9 + step) + b"\x10" + bytes([step]) + b"\x2a" + bytes([len(summary)]) + summary


def _tfrecord(payload: bytes) -> bytes:
    head = struct.pack("<Q", len(payload))
    return head + struct.pack("<I", _masked_crc(head)) + payload + struct.pack("<I", _masked_crc(payload))


TB_FILE = b"".join(_tfrecord(_tb_event(s, "grpo_actor/task_reward/avg", 0.5 - s / 100)) for s in range(1, 21))


def _mutate_binary(draw: st.DrawFn, data: bytes) -> bytes:
    for _ in range(draw(st.integers(0, 6))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate", "zero"]))
        i = draw(st.integers(0, max(0, len(data) - 1)))
        if op == "flip" and data:
            data = data[:i] + bytes([data[i] ^ (1 << draw(st.integers(0, 7)))]) + data[i + 1 :]
        elif op == "insert":
            data = data[:i] + draw(st.binary(min_size=1, max_size=64)) + data[i:]
        elif op == "delete":
            data = data[:i] + data[i + draw(st.integers(1, 64)) :]
        elif op == "truncate":
            data = data[:i]
        elif op == "zero":
            data = data[:i] + b"\x00" * draw(st.integers(1, 64)) + data[i + 64 :]
    return data


def check_binary_lines(metrics: pl.DataFrame, records: int) -> None:
    if not metrics.is_empty():
        assert metrics["line"].min() >= 1 and metrics["line"].max() <= max(records, 1)


@fuzz_settings(60)
@given(data=st.data())
def test_tensorboard_mutated(data: st.DataObject) -> None:
    doc = data.draw(st.one_of(st.binary(max_size=2048), st.composite(lambda d: _mutate_binary(d, TB_FILE))()))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "run"
        folder.mkdir()
        (folder / "events.out.tfevents.1700000000.host").write_bytes(doc)
        run = read_tensorboard(folder)
        # a record index is at most the number of length headers that could fit
        check_binary_lines(run.metrics, len(doc) // 16 + 1)


def test_tensorboard_seed_reads_back() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "events.out.tfevents.1700000000.host"
        path.write_bytes(TB_FILE)
        run = read_tensorboard(path)
        assert sorted(run.metrics["step"].to_list()) == list(range(1, 21)), run.notes




def _wandb_seed() -> bytes | None:
    try:
        from wandb.proto import wandb_internal_pb2 as pb
    except ImportError:
        return None
    records = []
    header = pb.Record()
    header.header.version_info.producer = "0.31.0"
    records.append(header.SerializeToString())
    run = pb.Record()
    run.run.run_id, run.run.project = "fuzz1", "grpo"
    records.append(run.SerializeToString())
    for step in range(1, 31):
        rec = pb.Record()
        for key, value in (("_step", step), ("_timestamp", 1.7e9 + step), ("reward", 0.5 - step / 100),
                           ("big", "y" * (3000 if step == 7 else 1))):
            item = rec.history.item.add()
            item.key, item.value_json = key, str(value) if not isinstance(value, str) else f'"{value}"'
        records.append(rec.SerializeToString())
    end = pb.Record()
    end.exit.exit_code = 0
    records.append(end.SerializeToString())
    return legacy_stream(records)


WANDB_FILE = _wandb_seed()
needs_wandb = pytest.mark.skipif(WANDB_FILE is None, reason="wandb's protobuf classes are not installed")


def _wandb_run(tmp: str, doc: bytes) -> list[Any]:
    folder = Path(tmp) / "wandb" / "run-20251110_175955-fuzz1"
    folder.mkdir(parents=True)
    (folder / "run-fuzz1.wandb").write_bytes(doc)
    return read_wandb_runs(Path(tmp))


@needs_wandb
def test_wandb_seed_reads_back() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        [run] = _wandb_run(tmp, WANDB_FILE)
        assert sorted(run.metrics["step"].unique().to_list()) == list(range(1, 31)), run.notes
        assert run.exit_code == 0 and run.records_skipped == 0


@needs_wandb
@fuzz_settings(60)
@given(data=st.data())
def test_wandb_mutated(data: st.DataObject) -> None:
    assert WANDB_FILE is not None
    doc = data.draw(st.one_of(
        st.binary(max_size=2048).map(lambda b: MAGIC + b),
        st.binary(max_size=512),
        st.composite(lambda d: _mutate_binary(d, WANDB_FILE))(),
    ))
    with tempfile.TemporaryDirectory() as tmp:
        runs = _wandb_run(tmp, doc)
        for run in runs:
            check_binary_lines(run.metrics, run.records_read + run.records_skipped + 1)
