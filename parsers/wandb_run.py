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
    >>> from parsers.wandb_run import find_wandb_runs, read_wandb_run
    >>> runs = [read_wandb_run(d) for d in find_wandb_runs(Path("outputs"))]  # doctest: +SKIP
    >>> runs[0].metrics.filter(pl.col("key") == "grpo_actor/task_reward/avg")  # doctest: +SKIP
"""

from __future__ import annotations

import itertools
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
from typing import Any, BinaryIO, NamedTuple

import polars as pl

from parsers._walk import walk
from parsers._wire import fields
from parsers.schema import METRIC_SCHEMA, abandoned_by_later_parts, conform, empty, later_lines_win, with_keys

__all__ = [
    "WandbRun",
    "WandbUnavailable",
    "chain_wandb_runs",
    "find_wandb_runs",
    "merge_wandb_runs",
    "read_wandb_online",
    "read_wandb_run",
    "read_wandb_runs",
]

RUN_DIR = re.compile(r"^(?:offline-|dryrun-)?run-(?P<stamp>\d{8}_\d{6})-(?P<id>.+)$")
_MAGIC = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
_BLOCK, _HEADER = 32768, 7
#: Blocks read at a time (8 MiB): a long run's file is never held whole.
_WINDOW_BLOCKS = 256
#: History values held as Python strings before they become a frame.
_FLUSH_ITEMS = 1 << 19
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
    superseded: pl.DataFrame = field(default_factory=lambda: empty(METRIC_SCHEMA))
    """Values of attempts a resume abandoned: an earlier folder's from the step a later one went back to."""


def find_wandb_runs(root: Path | str) -> list[Path]:
    """W&B run folders (``wandb/run-*``, ``wandb/offline-run-*``) under ``root``, oldest first.

    Symlinks (``latest-run``) are not followed, so every run is listed once; ``root`` may itself
    be a run folder, such a symlink, or a run's ``.wandb`` file.
    """
    root = Path(root)
    if root.is_symlink():
        root = root.resolve()
    if root.is_file() and root.suffix == ".wandb" and RUN_DIR.match(root.parent.name):
        return [root.parent]  # (a run's ``.wandb`` file given: its folder)
    if not root.is_dir():
        return []
    if RUN_DIR.match(root.name):
        return [root]
    found = []
    for dirpath, dirnames, _ in walk(root):
        runs = [d for d in dirnames if RUN_DIR.match(d) and Path(dirpath).name == "wandb"]
        found += [Path(dirpath) / d for d in runs]
        dirnames[:] = [d for d in dirnames if d not in runs]
    return sorted(found, key=lambda p: (RUN_DIR.match(p.name)["stamp"], str(p)))  # type: ignore[index]


def read_wandb_runs(root: Path | str, *, keys: str | None = None, summary: bool = True) -> list[WandbRun]:
    """Every run under ``root``, folders of a resumed run (same id) merged (see :func:`merge_wandb_runs`).

    ``keys`` and ``summary`` as for :func:`read_wandb_run`.
    """
    by_id: dict[str, list[WandbRun]] = {}
    for folder in find_wandb_runs(root):
        run = read_wandb_run(folder, keys=keys, summary=summary)
        by_id.setdefault(run.run_id, []).append(run)
    return [merge_wandb_runs(parts) for parts in by_id.values()]


def read_wandb_run(run_dir: Path | str, *, keys: str | None = None, summary: bool = True) -> WandbRun:
    """Read one run folder (or its ``.wandb`` file). Damage is reported in ``notes``, never raised.

    The file is read a window of blocks at a time and its history values become frames a few
    hundred thousand at a time, so memory stays bounded however long the run. ``keys``: a regex;
    only metrics whose key it finds something in are kept. ``summary=False`` leaves the summary
    out: wandb-core rewrites it whole at every step, so its records are half of a long run's file
    and most of the time spent reading it.

    Raises:
        WandbUnavailable: the ``wandb`` package (for its protobuf classes) is not installed.
    """
    pb = _protos()
    path = Path(run_dir)
    match = RUN_DIR.match(path.name)
    run_id = match["id"] if match else path.name
    log = _log_of(path)
    if log is None:
        return WandbRun(run_id, (str(path),), empty(METRIC_SCHEMA), notes=("no run-<id>.wandb file in the run folder",))
    if log.name.startswith("run-") and log.suffix == ".wandb" and not match:
        run_id = log.stem[4:]
    if not log.is_file():  # a pipe would block the open until something writes to it
        return WandbRun(run_id, (str(log),), empty(METRIC_SCHEMA), notes=(f"cannot read {log.name}: a pipe, socket or device, not a file",))
    try:
        with open(log, "rb") as fh:
            framing = _Framing()
            size = os.fstat(fh.fileno()).st_size
            history = _History(keys)
            return _decode(pb, run_id, str(log), framing, framing.payloads(fh), history, summary, ends_on_block=size % _BLOCK == 0)
    except OSError as exc:
        return WandbRun(run_id, (str(log),), empty(METRIC_SCHEMA), notes=(f"cannot read: {exc.strerror}",))


def _log_of(path: Path) -> Path | None:
    """A run's ``.wandb`` file: ``path`` itself, or the one in the run folder ``path``."""
    return path if path.is_file() else next(iter(sorted(path.glob("run-*.wandb"))), None)


class RunHead(NamedTuple):
    """What a run's first records say of it: its display name (``wandb.init(name=…)``: verl passes
    its experiment's) and the sweep it is a trial of, if any."""

    name: str | None
    sweep_id: str | None


def wandb_run_head(run_dir: Path | str) -> RunHead | None:
    """:class:`RunHead` of one run folder (or its ``.wandb`` file), from the first records of its
    ``.wandb`` file; ``None`` when it holds no run record or cannot be read."""
    path = Path(run_dir)
    log = _log_of(path)
    try:
        pb = _protos()
        if log is None or not log.is_file():
            return None
        run_field = pb.Record.DESCRIPTOR.fields_by_name["run"].number
        with open(log, "rb") as fh:
            for _, payload in itertools.islice(_Framing().payloads(fh), _NAMED_WITHIN):
                if _record_field(payload, _kinds(pb)) == run_field:
                    run = pb.Record.FromString(payload).run
                    return RunHead(run.display_name or None, run.sweep_id or None)
    except Exception:  # (a file cut or junk: protobuf's DecodeError; no wandb; unreadable)
        return None
    return None


#: Records a run's own (its name, config) comes within: the header, then the run record.
_NAMED_WITHIN = 64


def merge_wandb_runs(parts: Sequence[WandbRun]) -> WandbRun:
    """One run from the folders of a resumed run, in order: an earlier folder's values from the
    step a later one went back to are an attempt the run abandoned (``superseded``), whether or
    not the later folder got as far (see :func:`parsers.schema.abandoned_by_later_parts`)."""
    if len(parts) == 1:
        return parts[0]
    notes = [f"{Path(p.paths[0]).parent.name}: {note}" for p in parts for note in p.notes]
    notes.append(f"resumed run: {len(parts)} folders share id {parts[0].run_id}")
    return _one_history(parts, notes, "an earlier folder logged from where a later one resumed")


def chain_wandb_runs(runs: Sequence[WandbRun]) -> WandbRun | None:
    """The runs of one ``wandb/`` folder as one history, in the order they began: a relaunch logs
    under a new id (verl's default), so a later run going back to a step abandons an earlier one's
    values from there on, as a resumed run's later folder does. Runs that never go back over each
    other's steps simply follow on."""
    if not runs:
        return None
    notes = [f"W&B run {r.run_id}: {note}" for r in runs for note in r.notes]
    if len(runs) == 1:
        return replace(runs[0], notes=tuple(notes))
    ids = ", ".join(r.run_id for r in runs)
    notes.append(f"{len(runs)} W&B runs in one folder ({ids}) are read as one history in the order they began")
    return _one_history(runs, notes, "an earlier W&B run logged from where a later one went back")


def _one_history(parts: Sequence[WandbRun], notes: list[str], abandoned_by: str) -> WandbRun:
    """``parts`` in order as one run: a later part going back abandons an earlier one's values
    from there on (``superseded``, with those the parts had already); ``abandoned_by`` says how."""
    stacked = pl.concat([p.metrics.with_columns(pl.lit(i).alias("part")) for i, p in enumerate(parts)])
    gone = abandoned_by_later_parts(stacked, "part")
    abandoned = stacked.filter(gone).drop("part")
    if abandoned.height:
        notes.append(f"{abandoned['step'].n_unique()} steps {abandoned_by} are an attempt the run abandoned: not the run's values")
    return replace(
        parts[-1],
        paths=tuple(path for p in parts for path in p.paths),
        metrics=stacked.filter(~gone).sort("step", maintain_order=True).drop("part"),
        superseded=pl.concat([*(p.superseded for p in parts), abandoned]).sort("step", maintain_order=True),
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


class _Framing:
    """The record payloads of a ``.wandb`` stream, read ``_WINDOW_BLOCKS`` blocks at a time (a
    chunk never crosses a block, so never a window); damage is counted and noted on the way."""

    def __init__(self) -> None:
        self.notes: list[str] = []
        self.skipped = 0
        self.count = 0

    def payloads(self, fh: BinaryIO) -> Iterator[tuple[int, bytes]]:
        """``(1-based index, payload)`` of each whole record, in order."""
        window = fh.read(_BLOCK * _WINDOW_BLOCKS)
        if window[: len(_MAGIC)] != _MAGIC:
            self.notes.append("not a W&B transaction log (bad file header)")
            return
        corrupt: list[int] = []
        parts: list[bytes] | None = None
        pos, base = len(_MAGIC), 0
        while window:
            size = len(window)
            while pos < size:
                room = _BLOCK - pos % _BLOCK
                if room < _HEADER:  # block trailer: zero padding
                    pos += room
                    continue
                if pos + _HEADER > size:  # only a file's last block can be short
                    self.notes.append(f"torn last block: {size - pos} bytes of a chunk header at the end were not readable")
                    window = b""
                    break
                crc, length, kind = struct.unpack_from("<IHB", window, pos)
                if crc == length == kind == 0:  # zero fill (preallocated or never-written space)
                    pos += room
                    continue
                end = pos + _HEADER + length
                sound = kind in (_FULL, _FIRST, _MIDDLE, _LAST) and length <= room - _HEADER
                if sound and end > size:
                    self.notes.append(f"torn last block: a record was cut off after {size - pos - _HEADER} of {length} bytes (killed mid-write?)")
                    parts, window = None, b""
                    break
                if not sound or zlib.crc32(window[pos + _HEADER : end], _TYPE_CRC[kind]) != crc:
                    self.skipped += 1
                    corrupt.append(base + pos)
                    parts = None
                    pos += room
                    continue
                body = window[pos + _HEADER : end]
                pos = end
                if kind in (_FULL, _FIRST) and parts is not None:  # a record left unfinished
                    self.skipped += 1
                    parts = None
                if kind == _FULL:
                    yield self._next(body)
                elif kind == _FIRST:
                    parts = [body]
                elif parts is not None:  # MIDDLE/LAST of a record whose start was lost are dropped
                    parts.append(body)
                    if kind == _LAST:
                        yield self._next(b"".join(parts))
                        parts = None
            if window:
                base += size
                pos, window = 0, fh.read(_BLOCK * _WINDOW_BLOCKS)
        if parts is not None:
            self.skipped += 1
            self.notes.append("the last record is incomplete (its final chunk was never written)")
        if corrupt:
            self.notes.insert(0, f"{len(corrupt)} corrupt chunks (first at byte {corrupt[0]}) skipped, each to the next 32 KiB block")

    def _next(self, payload: bytes) -> tuple[int, bytes]:
        self.count += 1
        return self.count + self.skipped, payload


def _decode(
    pb: Any, run_id: str, path: str, framing: _Framing, payloads: Iterable[tuple[int, bytes]], history: _History,
    with_summary: bool, ends_on_block: bool,
) -> WandbRun:
    config: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    latest: dict[tuple[str, ...], str | None] = {}
    info: dict[str, Any] = {"exit_code": None, "writer": None, "project": None, "name": None}
    read = histories = 0
    kinds, wanted = _kinds(pb), _wanted_fields(pb, with_summary)
    for index, payload in payloads:
        field = _record_field(payload, kinds)
        if field is not None and field not in wanted:  # console output, system stats, …: never decoded
            read += 1
            continue
        try:
            # A fresh message each time: one reused keeps every parse's memory (upb's arena).
            record = pb.Record.FromString(payload)
        except Exception:  # protobuf's DecodeError; junk that passed the checksum
            framing.skipped += 1
            continue
        read += 1
        which = record.WhichOneof("record_type")
        if which == "history":
            histories += 1
            history.add(record.history, index)
        elif which == "summary" and with_summary:
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
        elif which == "metric" and record.metric.step_metric and (record.metric.glob_name or record.metric.name):
            # ``define_metric("*", step_metric=…)`` (HF Trainer, TRL), or of some keys ("train/*",
            # "critic/*": W&B's docs): the run's step is that metric's, not W&B's count of log calls.
            history.step_metric = history.step_metric or record.metric.step_metric
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
    notes = framing.notes
    if info["exit_code"] is None and framing.count:
        cause = " and ends on a 32 KiB block boundary (killed before its last block was written?)" if ends_on_block else ""
        notes.append(f"no exit record: the run crashed, was killed, or is still running{cause}")
    elif info["exit_code"]:
        notes.append(f"exit code {info['exit_code']}")
    if not framing.count:
        notes.append("no records")
    elif not histories:
        notes.append("no history records")
    if history.step_metric:
        notes.append(f"steps are {history.step_metric} (the run's define_metric), not W&B's count of log calls")
    return WandbRun(
        run_id, (path,), history.metrics(path), config=config, summary=summary,
        notes=tuple(notes), records_read=read, records_skipped=framing.skipped, **info,
    )


def _kinds(pb: Any) -> frozenset[int]:
    """Numbers of the ``Record`` fields that say what a record is (wandb's own descriptor)."""
    return frozenset(f.number for f in pb.Record.DESCRIPTOR.oneofs_by_name["record_type"].fields)


def _wanted_fields(pb: Any, with_summary: bool) -> frozenset[int]:
    """Numbers of the kinds of record worth decoding."""
    names = {"history", "config", "run", "exit", "header", "metric"} | ({"summary"} if with_summary else set())
    return frozenset(f.number for f in pb.Record.DESCRIPTOR.oneofs_by_name["record_type"].fields if f.name in names)


def _record_field(payload: bytes, kinds: frozenset[int]) -> int | None:
    """The kind (field number) of a serialized ``Record``, read without decoding it: fields are
    skipped (``num``, ``control``, …) until one of ``kinds``. None when the bytes do not say."""
    try:
        return next((number for number, _, _ in fields(memoryview(payload)) if number in kinds), None)
    except (IndexError, ValueError):
        return None


class _History:
    """History values gathered record by record, as Python strings, and turned into metric rows
    ``_FLUSH_ITEMS`` at a time: the parsing of numbers, the key filter and the rest are Polars'."""

    def __init__(self, keys: str | None) -> None:
        self.regex = keys
        self.step_metric: str | None = None
        self._last_own: float | None = None  # (the step metric's last value, across flushes)
        self.frames: list[pl.DataFrame] = []
        self.steps: list[int] = []  # each history record's step, to find steps logged twice
        self._reset()

    def _reset(self) -> None:
        self.keys: list[str] = []
        self.texts: list[str] = []
        self.records: dict[str, list[Any]] = {"line": [], "step": [], "time": [], "n": []}

    def add(self, history: Any, index: int) -> None:
        """One history record's values; a record without a finite step is dropped whole."""
        items = history.item
        # upb builds a Python object at each access: one pass, and a one-part nested key taken whole.
        pairs = [(nk[0] if len(nk) == 1 else ".".join(nk) or i.key, i.value_json) for i in items for nk in (i.nested_key,)]
        keys, texts = [k for k, _ in pairs], [t for _, t in pairs]
        if "" in texts:  # typed values: declared in recent protos, written by no released writer yet
            texts = [t or _typed_text(i) for t, i in zip(texts, items, strict=True)]
        step = _json(texts[keys.index("_step")]) if "_step" in keys else None
        stamp = _json(texts[keys.index("_timestamp")]) if "_timestamp" in keys else None
        if step is None and history.HasField("step"):
            step = history.step.num
        if not isinstance(step, int | float) or not math.isfinite(step):
            return
        if "_type" in "\n".join(keys):  # wandb-core splits media into leaves: drop the whole value
            media = tuple(".".join(i.nested_key)[: -len("_type")] for i in items if i.nested_key and i.nested_key[-1] == "_type")
            if media:
                kept = [(k, t) for k, t in zip(keys, texts, strict=True) if not k.startswith(media)]
                keys, texts = [k for k, _ in kept], [t for _, t in kept]
        if not keys:  # nothing but media: no row (a record must add at least one, see _flush)
            return
        self.keys += keys
        self.texts += texts
        self.steps.append(int(step))
        for name, value in (("line", index), ("step", int(step)), ("time", _local_time(stamp)), ("n", len(keys))):
            self.records[name].append(value)
        if len(self.keys) >= _FLUSH_ITEMS:
            self._flush()

    def _flush(self) -> None:
        if not self.keys:
            return
        records = pl.DataFrame(self.records, schema={"line": pl.Int64, "step": pl.Int64, "time": pl.Datetime("ms"), "n": pl.Int64})
        values = pl.DataFrame({"key": self.keys, "text": self.texts}, schema={"key": pl.String, "text": pl.String})
        self._reset()
        values = values.hstack(records.select(pl.exclude("n").repeat_by("n").list.explode(keep_nulls=False)))
        values = values.filter(~pl.col("key").is_in(list(_BOOKKEEPING)) & ~pl.col("key").str.starts_with("_wandb."))
        text = pl.col("text")
        number = pl.when(text == "true").then(1.0).when(text == "false").then(0.0).otherwise(text.cast(pl.Float64, strict=False))
        values = values.with_columns(number.alias("value"))
        # The rest but strings, lists and null: nested objects (the legacy writer), odd spellings.
        nested = values.filter(
            pl.col("value").is_null() & ~text.str.starts_with('"') & ~text.str.starts_with("[") & (text != "null")
        )
        rows = [
            (line, step, time, key, float(value))
            for line, step, time, name, raw in nested.select("line", "step", "time", "key", "text").iter_rows()
            for key, value in _leaves([(name, _json(raw))])
            if isinstance(value, bool | int | float)
        ]
        found = pl.DataFrame(rows, schema={"line": pl.Int64, "step": pl.Int64, "time": pl.Datetime("ms"), "key": pl.String, "value": pl.Float64},
                             orient="row")
        frame = pl.concat([values.filter(pl.col("value").is_not_null()).select(found.columns), found]).sort("line", maintain_order=True)
        if self.step_metric:
            # Each record's step is its value of the step metric (kept whatever the key filter); a
            # record without it (a call logging keys of no pattern) is of the step last logged.
            steps = frame.filter(pl.col("key") == self.step_metric).select("line", pl.col("value").alias("own"))
            own = pl.col("own").fill_null(strategy="forward").fill_null(pl.lit(self._last_own, pl.Float64))
            frame = frame.join(steps, on="line", how="left", maintain_order="left").with_columns(own)
            if (known := frame["own"].drop_nulls()).len():
                self._last_own = known[-1]
            frame = frame.filter(pl.col("own").is_finite()).with_columns(pl.col("own").cast(pl.Int64).alias("step")).drop("own")
        frame = with_keys(frame, self.regex)
        self.frames.append(frame.with_columns(pl.col("key").cast(pl.Categorical)))

    def metrics(self, path: str) -> pl.DataFrame:
        """Every value gathered, as metric rows; a key logged twice for a step keeps its later value."""
        self._flush()
        if not self.frames:
            return empty(METRIC_SCHEMA)
        # (Records of one step-metric value — a train and an eval call — are one step.)
        steps = (pl.concat([f.select("line", "step").unique() for f in self.frames])["step"] if self.step_metric
                 else pl.Series(self.steps, dtype=pl.Int64))
        frame = later_lines_win(pl.concat(self.frames), steps.filter(steps.is_duplicated()).unique())
        return conform(frame.with_columns(pl.lit(path).alias("file")), METRIC_SCHEMA)


def _typed_text(item: Any) -> str:
    kind = item.WhichOneof("value") if "value" in item.DESCRIPTOR.oneofs_by_name else None
    try:
        return json.dumps(getattr(item, kind)) if kind else "null"
    except (TypeError, ValueError):  # bytes, messages: not numbers
        return "null"


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
