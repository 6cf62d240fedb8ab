"""Weights & Biases runs → frames: offline run folders (``run-<id>.wandb``) and the public API.

A run folder's ``run-<id>.wandb`` is the source of truth (offline folders hold no history,
summary or config files). It is a LevelDB-log-style stream: a 7-byte file header
(``:W&B``, ``<H`` magic 0xBEE1, version 0), then 32 KiB blocks of chunks, each with a 7-byte
header ``<I crc><H length><B type>`` (FULL=1, FIRST=2, MIDDLE=3, LAST=4). Both writers (the
legacy Python one and wandb-core) checksum with ``zlib.crc32`` seeded by the type byte, despite
"crc32c" in the legacy docstring. Each reassembled record is a ``wandb_internal.Record``,
decoded with wandb's own protobuf classes (imported lazily).

The two writers differ in how a nested value is keyed: legacy writes ``key="actor"`` with a
JSON object as value, wandb-core one item per leaf with ``nested_key=["actor", "entropy"]``.
Both become the dotted key ``actor.entropy``; ``a/b`` keys are kept as they are. Media values
(dicts with ``_type``), strings and lists are not metrics and are skipped.

Example:
    >>> runs = [read_wandb_run(d) for d in find_wandb_runs(Path("outputs"))]  # doctest: +SKIP
    >>> runs[0].metrics.filter(pl.col("key") == "grpo_actor/task_reward/avg")  # doctest: +SKIP
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import polars as pl

from parsers.schema import METRIC_SCHEMA, conform, empty

__all__ = [
    "WandbRun",
    "WandbUnavailable",
    "find_wandb_runs",
    "merge_wandb_runs",
    "read_wandb_online",
    "read_wandb_run",
    "read_wandb_runs",
]

RUN_DIR = re.compile(r"^(?:offline-|dryrun-)?run-(?P<stamp>\d{8}_\d{6})-(?P<id>.+)$")
_MAGIC = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
_BLOCK, _HEADER = 32768, 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4
_TYPE_CRC = [zlib.crc32(bytes([t])) for t in range(5)]
_BOOKKEEPING = frozenset({"_step", "_timestamp", "_runtime", "_wandb"})
_ONLINE = re.compile(
    r"^(?:https?://[^/]+/)?(?P<entity>[^/\s]+)/(?P<project>[^/\s]+)/(?:runs/)?(?P<run>[^/\s?#]+)/?(?:[?#].*)?$"
)


class WandbUnavailable(ValueError):
    """W&B data cannot be had here: no ``wandb`` package, no API key, or no network."""


@dataclass(frozen=True)
class WandbRun:
    """What one W&B run holds (one folder, or several merged when a run was resumed)."""

    run_id: str
    paths: tuple[str, ...]
    metrics: pl.DataFrame
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    project: str | None = None
    name: str | None = None
    writer: str | None = None
    """``"wandb-core <version>"``, ``"legacy"`` (the Python writer), or None when unknown."""
    exit_code: int | None = None
    """None when the log has no exit record (crashed, killed, or still running)."""
    notes: tuple[str, ...] = ()
    records_read: int = 0
    records_skipped: int = 0


def find_wandb_runs(root: Path | str) -> list[Path]:
    """W&B run folders (``wandb/run-*``, ``wandb/offline-run-*``) under ``root``, oldest first.

    Symlinks (``latest-run``) are not followed, so every run is listed once; ``root`` may itself
    be a run folder or such a symlink.
    """
    root = Path(root)
    if root.is_symlink():
        root = root.resolve()
    if not root.is_dir():
        return []
    if RUN_DIR.match(root.name):
        return [root]
    found = []
    for dirpath, dirnames, _ in os.walk(root):
        runs = [d for d in dirnames if RUN_DIR.match(d) and Path(dirpath).name == "wandb"]
        found += [Path(dirpath) / d for d in runs]
        dirnames[:] = [d for d in dirnames if d not in runs]
    return sorted(found, key=lambda p: (RUN_DIR.match(p.name)["stamp"], str(p)))  # type: ignore[index]


def read_wandb_runs(root: Path | str) -> list[WandbRun]:
    """Every run under ``root``, folders of a resumed run (same id) merged, later folder winning."""
    by_id: dict[str, list[WandbRun]] = {}
    for folder in find_wandb_runs(root):
        run = read_wandb_run(folder)
        by_id.setdefault(run.run_id, []).append(run)
    return [merge_wandb_runs(parts) for parts in by_id.values()]


def read_wandb_run(run_dir: Path | str) -> WandbRun:
    """Read one run folder (or its ``.wandb`` file). Damage is reported in ``notes``, never raised.

    Raises:
        WandbUnavailable: the ``wandb`` package (for its protobuf classes) is not installed.
    """
    pb = _protos()
    path = Path(run_dir)
    match = RUN_DIR.match(path.name)
    run_id = match["id"] if match else path.name
    log = path if path.is_file() else next(iter(sorted(path.glob("run-*.wandb"))), None)
    if log is None:
        return WandbRun(run_id, (str(path),), empty(METRIC_SCHEMA), notes=("no run-<id>.wandb file in the run folder",))
    if log.name.startswith("run-") and log.suffix == ".wandb" and not match:
        run_id = log.stem[4:]
    try:
        data = log.read_bytes()
    except OSError as exc:
        return WandbRun(run_id, (str(log),), empty(METRIC_SCHEMA), notes=(f"cannot read: {exc.strerror}",))
    payloads, notes, skipped = _frames(data)
    return _decode(pb, run_id, str(log), payloads, notes, skipped, ends_on_block=len(data) % _BLOCK == 0)


def merge_wandb_runs(parts: Sequence[WandbRun]) -> WandbRun:
    """One run from the folders of a resumed run, in order; where steps overlap the later one wins."""
    if len(parts) == 1:
        return parts[0]
    frames = [p.metrics.with_columns(pl.lit(i).alias("part")) for i, p in enumerate(parts)]
    stacked = pl.concat(frames)
    spans = stacked.group_by("part").agg(pl.col("step").min().alias("lo"), pl.col("step").max().alias("hi")).sort("part")
    overlap = spans.select((pl.col("hi").shift(1) >= pl.col("lo")).fill_null(False).sum()).item()
    notes = [f"{Path(p.paths[0]).parent.name}: {note}" for p in parts for note in p.notes]
    notes.append(f"resumed run: {len(parts)} folders share id {parts[0].run_id}")
    if overlap:
        notes.append("resumed folders repeat some steps; the later folder's values are kept")
    metrics = stacked.sort("part", maintain_order=True).unique(["step", "key"], keep="last", maintain_order=True)
    last = parts[-1]
    return replace(
        last,
        paths=tuple(path for p in parts for path in p.paths),
        metrics=metrics.sort("step", maintain_order=True).drop("part"),
        config={k: v for p in parts for k, v in p.config.items()},
        summary={k: v for p in parts for k, v in p.summary.items()},
        notes=tuple(notes),
        records_read=sum(p.records_read for p in parts),
        records_skipped=sum(p.records_skipped for p in parts),
    )


def read_wandb_online(path: str) -> WandbRun:
    """A run's full, unsampled history from the W&B public API (``run.scan_history()``).

    ``path`` is ``ENTITY/PROJECT/RUN_ID``, ``ENTITY/PROJECT/runs/RUN_ID`` or the run's URL.

    Raises:
        WandbUnavailable: no ``wandb`` package, no API key, no network, or no such run.
        ValueError: ``path`` is not of one of those shapes.
    """
    match = _ONLINE.match(path.strip())
    if not match:
        raise ValueError(f"{path!r}: expected ENTITY/PROJECT/RUN_ID or a W&B run URL")
    try:
        import wandb
    except ImportError as exc:
        raise WandbUnavailable("reading W&B runs online needs the wandb package (pip install wandb)") from exc
    run_path = "/".join(match.group("entity", "project", "run"))
    try:
        run = wandb.Api(timeout=30).run(run_path)
        rows = list(run.scan_history())
        config, summary = dict(run.config), dict(run.summary)
    except Exception as exc:  # wandb raises its own errors and requests' ones; all mean "not here"
        raise WandbUnavailable(f"W&B run {run_path} unavailable: {type(exc).__name__}: {exc}") from exc
    columns: dict[str, list[Any]] = {"step": [], "time": [], "key": [], "value": [], "line": []}
    for index, row in enumerate(rows, 1):
        _add_row(columns, _leaves(row.items()), index, row.get("_step"), row.get("_timestamp"))
    metrics = _metric_frame(columns, f"wandb://{run_path}")
    return WandbRun(
        match["run"], (f"wandb://{run_path}",), metrics, config=config, summary=summary,
        project=match["project"], name=getattr(run, "name", None), records_read=len(rows),
        notes=() if rows else ("no history",),
    )


def _protos() -> Any:
    try:
        from wandb.proto import wandb_internal_pb2
    except ImportError as exc:
        raise WandbUnavailable("reading .wandb files needs the wandb package (pip install wandb)") from exc
    return wandb_internal_pb2


def _frames(data: bytes) -> tuple[list[tuple[int, bytes]], list[str], int]:
    """The record payloads (with their 1-based index), notes on damage, and records skipped."""
    if data[: len(_MAGIC)] != _MAGIC:
        return [], ["not a W&B transaction log (bad file header)"], 0
    payloads: list[tuple[int, bytes]] = []
    notes: list[str] = []
    corrupt: list[int] = []
    skipped = 0
    parts: list[bytes] | None = None
    pos, size = len(_MAGIC), len(data)
    while pos < size:
        room = _BLOCK - pos % _BLOCK
        if room < _HEADER:  # block trailer: zero padding
            pos += room
            continue
        if pos + _HEADER > size:
            notes.append(f"torn last block: {size - pos} bytes of a chunk header at the end were not readable")
            break
        crc, length, kind = struct.unpack_from("<IHB", data, pos)
        if crc == length == kind == 0:  # zero fill (preallocated or never-written space)
            pos += room
            continue
        end = pos + _HEADER + length
        sound = kind in (_FULL, _FIRST, _MIDDLE, _LAST) and length <= room - _HEADER
        if sound and end > size:
            notes.append(f"torn last block: a record was cut off after {size - pos - _HEADER} of {length} bytes (killed mid-write?)")
            parts = None
            break
        if not sound or zlib.crc32(data[pos + _HEADER : end], _TYPE_CRC[kind]) != crc:
            skipped += 1
            corrupt.append(pos)
            parts = None
            pos += room
            continue
        body = data[pos + _HEADER : end]
        pos = end
        if kind in (_FULL, _FIRST) and parts is not None:  # a record left unfinished
            skipped += 1
            parts = None
        if kind == _FULL:
            payloads.append((len(payloads) + skipped + 1, body))
        elif kind == _FIRST:
            parts = [body]
        elif parts is not None:  # MIDDLE/LAST of a record whose start was lost are dropped
            parts.append(body)
            if kind == _LAST:
                payloads.append((len(payloads) + skipped + 1, b"".join(parts)))
                parts = None
    if parts is not None:
        skipped += 1
        notes.append("the last record is incomplete (its final chunk was never written)")
    if corrupt:
        notes.insert(0, f"{len(corrupt)} corrupt chunks (first at byte {corrupt[0]}) skipped, each to the next 32 KiB block")
    return payloads, notes, skipped


def _decode(
    pb: Any, run_id: str, path: str, payloads: list[tuple[int, bytes]], notes: list[str], skipped: int, ends_on_block: bool
) -> WandbRun:
    columns: dict[str, list[Any]] = {"step": [], "time": [], "key": [], "value": [], "line": []}
    config: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    latest: dict[tuple[str, ...], str | None] = {}
    info: dict[str, Any] = {"exit_code": None, "writer": None, "project": None, "name": None}
    read = histories = 0
    record = pb.Record()
    for index, payload in payloads:
        try:
            record.ParseFromString(payload)
        except Exception:  # protobuf's DecodeError; junk that passed the checksum
            skipped += 1
            continue
        read += 1
        which = record.WhichOneof("record_type")
        if which == "history":
            histories += 1
            _history(record.history, index, columns)
        elif which == "summary":
            # wandb-core rewrites the whole summary at every step: keep the raw text of each
            # path's latest update (moved to the end, so order is last-write order), decode once.
            for item in record.summary.update:
                where = _path(item)
                latest.pop(where, None)
                latest[where] = item.value_json
            for item in record.summary.remove:
                where = _path(item)
                latest.pop(where, None)
                latest[where] = None
        elif which == "config":
            for item in record.config.update:
                _set(config, _path(item), _json(item.value_json))
            for item in record.config.remove:
                _unset(config, _path(item))
        elif which == "run":
            run = record.run
            for item in run.config.update:
                _set(config, _path(item), _json(item.value_json))
            run_id = run.run_id or run_id
            info.update(project=run.project or None, name=run.display_name or None)
        elif which == "exit":
            info["exit_code"] = record.exit.exit_code
        elif which == "header":
            producer = record.header.version_info.producer
            info["writer"] = f"wandb-core {producer}" if producer else "legacy"
    for where, text in latest.items():
        if text is None:
            _unset(summary, where)
        else:
            _set(summary, where, _json(text))
    config.pop("_wandb", None)
    summary.pop("_wandb", None)
    if info["exit_code"] is None and payloads:
        cause = " and ends on a 32 KiB block boundary (killed before its last block was written?)" if ends_on_block else ""
        notes.append(f"no exit record: the run crashed, was killed, or is still running{cause}")
    elif info["exit_code"]:
        notes.append(f"exit code {info['exit_code']}")
    if not payloads:
        notes.append("no records")
    elif not histories:
        notes.append("no history records")
    return WandbRun(
        run_id, (path,), _metric_frame(columns, path), config=config, summary=summary,
        notes=tuple(notes), records_read=read, records_skipped=skipped, **info,
    )


def _path(item: Any) -> tuple[str, ...]:
    return tuple(item.nested_key) or (item.key,)


def _history(history: Any, index: int, columns: dict[str, list[Any]]) -> None:
    """Append one history record's numeric values (bools as 0/1; strings, lists, media skipped)."""
    pairs: list[tuple[str, Any]] = []
    media: list[str] = []
    step = stamp = None
    for item in history.item:
        nested = item.nested_key
        key = ".".join(nested) if nested else item.key
        text = item.value_json
        if key in _BOOKKEEPING or key.startswith("_wandb."):
            if key == "_step":
                step = _json(text)
            elif key == "_timestamp":
                stamp = _json(text)
            continue
        if nested and nested[-1] == "_type":  # wandb-core splits media into leaves
            media.append(key[: -len("_type")])
            continue
        if not text:  # typed values: declared in recent protos, written by no released writer yet
            kind = item.WhichOneof("value") if "value" in item.DESCRIPTOR.oneofs_by_name else None
            pairs.append((key, getattr(item, kind) if kind else None))
            continue
        try:
            pairs.append((key, float(text)))  # the common case, NaN / Infinity included
        except ValueError:
            pairs.extend(_leaves([(key, _json(text))]))
    if media:
        pairs = [(k, v) for k, v in pairs if not k.startswith(tuple(media))]
    if step is None and history.HasField("step"):
        step = history.step.num
    _add_row(columns, pairs, index, step, stamp)


def _path(item: Any) -> tuple[str, ...]:
    return tuple(item.nested_key) or (item.key,)


def _json(text: str) -> Any:
    try:
        return float(text)  # numbers and the bare NaN / Infinity / -Infinity tokens
    except ValueError:
        pass
    try:
        return json.loads(text)
    except ValueError:
        return None


def _leaves(pairs: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    """Nested dicts flattened to dotted keys; media (dicts with ``_type``) dropped."""
    for key, value in pairs:
        if isinstance(value, dict):
            if "_type" not in value and key not in _BOOKKEEPING:
                yield from _leaves((f"{key}.{k}", v) for k, v in value.items())
        elif key not in _BOOKKEEPING:
            yield key, value


def _add_row(columns: dict[str, list[Any]], pairs: Iterable[tuple[str, Any]], index: int, step: Any, stamp: Any) -> None:
    """Append one history row's numeric values (bools as 0/1; strings, lists, None skipped)."""
    if not isinstance(step, int | float) or not math.isfinite(step):
        return
    numeric = [(k, float(v)) for k, v in pairs if isinstance(v, bool | int | float)]
    count = len(numeric)
    columns["step"] += [int(step)] * count
    columns["time"] += [_local_time(stamp)] * count
    columns["key"] += [k for k, _ in numeric]
    columns["value"] += [v for _, v in numeric]
    columns["line"] += [index] * count


def _local_time(stamp: Any) -> datetime | None:
    try:
        return datetime.fromtimestamp(float(stamp))
    except (TypeError, ValueError, OverflowError, OSError):
        return None


def _metric_frame(columns: dict[str, list[Any]], path: str) -> pl.DataFrame:
    frame = pl.DataFrame(
        columns, schema={"step": pl.Int64, "time": pl.Datetime("ms"), "key": pl.String, "value": pl.Float64, "line": pl.Int64}
    )
    frame = frame.unique(["step", "key"], keep="last", maintain_order=True).with_columns(pl.lit(path).alias("file"))
    return conform(frame, METRIC_SCHEMA)


def _set(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for part in path[:-1]:
        child = tree.get(part)
        if not isinstance(child, dict):
            child = tree[part] = {}
        tree = child
    tree[path[-1]] = value


def _unset(tree: dict[str, Any], path: tuple[str, ...]) -> None:
    for part in path[:-1]:
        tree = tree.get(part)  # type: ignore[assignment]
        if not isinstance(tree, dict):
            return
    tree.pop(path[-1], None)
