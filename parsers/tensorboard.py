"""TensorBoard event files (``events.out.tfevents.*``) → a metric frame, without TensorFlow.

An event file is a TFRecord stream: ``<Q length><I masked crc32c of length><data><I masked
crc32c of data>``; each ``data`` is an ``Event`` protobuf. Only the fields a scalar needs are
decoded: ``Event{1 wall_time double, 2 step int64, 5 summary}``, ``Summary{1 value}``,
``Value{1 tag, 2 simple_value float, 8 tensor, 9 metadata{1 plugin_data{1 plugin_name}}}``.

Scalars come in two encodings: ``simple_value`` (tensorboardX, torch's default ``add_scalar``)
and a one-element tensor tagged with the ``scalars`` plugin (torch ``new_style=True``,
TF2 ``tf.summary.scalar``; TF2 writes the plugin metadata only with a tag's first value).
Histograms, text and images are skipped. Values are float32 as written (0.55 reads back as
0.550000011920929); NaN and ±Inf are kept.

A file is read 8 MiB at a time, so a long run's never is whole. The record nearly every scalar
is — one ``simple_value``, one-byte lengths — is recognised and decoded by Polars a window at a
time (:func:`_simple_scalar`); the others are decoded field by field here.

A restarted writer adds a new file to the same folder, going back to the step it resumed from:
files are ordered by their first ``wall_time``, and an earlier file's values of a tag from that
step on are an abandoned attempt's (``superseded``), as TensorBoard purges them. Events in a sub-folder (torch/
tensorboardX ``add_scalars``) get the folder as a key prefix: ``loss/train/loss``; discovery reads
them as the run of the logdir above them that holds event files too.
Keys are relative to the deepest folder holding all files read, so sibling run folders read
together are told apart by their folder name. ``line`` holds the 1-based record index in its file.

Example:
    >>> run = read_tensorboard(Path("tensorboard_log/gsm8k/exp1"))  # doctest: +SKIP
    >>> run.metrics.filter(pl.col("key") == "critic/score/mean")  # doctest: +SKIP
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl

from parsers._walk import walk
from parsers._wire import fields, varint
from parsers.schema import METRIC_SCHEMA, abandoned_by_later_parts, conform, empty, with_keys

__all__ = ["TensorboardRun", "find_event_files", "read_tensorboard"]

EVENT_FILE_MARK = "tfevents"
_F32, _F64, _U64 = struct.Struct("<f"), struct.Struct("<d"), struct.Struct("<Q")
_HEAD = struct.Struct("<QI")  # a record's length and its length's masked CRC32C
#: Bytes read at a time: a long run's event file is never held whole.
_WINDOW = 8 << 20
#: One event file's scalars, before they get their file and local times.
_FILE_SCHEMA = {"step": pl.Int64, "wall": pl.Float64, "key": pl.String, "value": pl.Float64, "line": pl.Int64}
# TensorProto dtype → (element size, struct format) for tensor_content
_DTYPES = {1: (4, "<f"), 2: (8, "<d"), 3: (4, "<i"), 9: (8, "<q"), 19: (2, "<e")}


@dataclass(frozen=True)
class TensorboardRun:
    """The scalars of one TensorBoard log folder (or one event file)."""

    path: str
    files: tuple[str, ...]
    metrics: pl.DataFrame
    notes: tuple[str, ...] = ()
    records_read: int = 0
    records_skipped: int = 0
    superseded: pl.DataFrame = field(default_factory=lambda: empty(METRIC_SCHEMA))
    """Scalars of attempts a restart abandoned: an earlier file's from the step a later one went back to."""


#: The folder ``add_hparams`` writes its record in: ``<logdir>/<time.time()>/``.
HPARAMS_FOLDER = re.compile(r"^\d{9,11}\.\d+$")


def find_event_files(root: Path | str) -> list[Path]:
    """Every ``*tfevents*`` file under ``root`` (or ``root`` itself), symlinks not followed; not
    the hyperparameter records ``add_hparams`` writes beside a run's own (one-off values, no series)."""
    root = Path(root)
    if root.is_file():
        return [root] if EVENT_FILE_MARK in root.name else []
    found = [
        Path(dirpath) / name
        for dirpath, _, names in walk(root)
        for name in names
        if EVENT_FILE_MARK in name and not name.endswith((".tmp", ".lock"))
    ]
    boards = {f.parent for f in found}
    return sorted(f for f in found if not (HPARAMS_FOLDER.match(f.parent.name) and f.parent.parent in boards))


def read_tensorboard(path_or_dir: Path | str, *, keys: str | None = None) -> TensorboardRun:
    """All scalars of an event file or of every event file under a folder; damage goes to ``notes``.

    Files are read a window at a time, so memory stays bounded however long the run. ``keys``: a
    regex; only scalars whose key it finds something in are kept. ``None`` keeps all.
    """
    root = Path(path_or_dir)
    files = find_event_files(root)
    # Keys are relative to the deepest folder holding every file: a run folder's own events get
    # bare tags whichever parent was given, add_scalars sub-folders and sibling runs a prefix.
    base = Path(os.path.commonpath([f.parent for f in files])) if files else root
    notes: list[str] = []
    frames: list[tuple[float, pl.DataFrame, pl.DataFrame]] = []
    read = skipped = 0
    plugins: dict[str, dict[str, str]] = {}
    for file in files:
        prefix = file.parent.relative_to(base).as_posix()
        prefix = "" if prefix == "." else prefix + "/"
        try:
            frame, steps, first_wall, done, bad = _read_file(file, prefix, plugins.setdefault(prefix, {}), notes, keys)
        except OSError as exc:
            notes.append(f"{file.name}: cannot read: {exc.strerror}")
            continue
        read, skipped = read + done, skipped + bad
        first = first_wall if first_wall is not None else float("inf")
        frames.append((first, frame.with_columns(pl.lit(str(file), pl.Categorical).alias("file")), steps))
    if not files:
        notes.append("no event files")
    frames.sort(key=lambda item: item[0])
    metrics, abandoned = _later_wins([f for _, f, _ in frames], [s for _, _, s in frames], notes)
    return TensorboardRun(str(root), tuple(str(f) for f in files), metrics, tuple(notes), read, skipped, abandoned)


def _later_wins(frames: list[pl.DataFrame], windows: list[pl.DataFrame], notes: list[str]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Every file's scalars in step order, and apart from them those of attempts a restart
    abandoned: as TensorBoard itself purges them, a tag's values from the step a later file went
    back to (see :func:`parsers.schema.abandoned_by_later_parts`). Within a file, a step and key
    written twice keeps its later value. ``windows``: per file, each window's scalars and keys per step.

    Only steps that may hold such a pair are looked at (a step in two windows, or with more
    scalars than keys in one): hashing every scalar of a long run costs hundreds of MB.
    """
    if not frames:
        return empty(METRIC_SCHEMA), empty(METRIC_SCHEMA)
    stacked = pl.concat([f.with_columns(pl.lit(i, pl.UInt32).alias("order")) for i, f in enumerate(frames)])
    abandoned = empty(METRIC_SCHEMA)
    if len(frames) > 1:
        gone = abandoned_by_later_parts(stacked, "order")
        if gone.any():
            abandoned = conform(stacked.filter(gone).sort("step", "order", "line"), METRIC_SCHEMA)
            stacked = stacked.filter(~gone)
            notes.append(f"{abandoned['step'].n_unique()} steps an earlier file logged from where a later one went back "
                         "(a restart) are an attempt the run abandoned: not the run's values")
    per_window = pl.concat(windows)
    suspect = per_window.group_by("step").agg(pl.len().alias("windows"), (pl.col("rows") > pl.col("keys")).any().alias("twice"))
    suspect = suspect.filter((pl.col("windows") > 1) | pl.col("twice"))["step"]
    again = stacked.filter(pl.col("step").is_in(suspect.implode()))
    counted = again.group_by("step").agg(pl.len().alias("rows"), pl.col("key").n_unique().alias("keys"))
    repeated = counted.filter(pl.col("rows") > pl.col("keys"))["step"]
    if repeated.is_empty():
        # Files come in order, and records within them: steps that never go back need no sort.
        return conform(stacked if stacked["step"].is_sorted() else stacked.sort("step", "order", "line"), METRIC_SCHEMA), abandoned
    twice = pl.col("step").is_in(repeated.implode())
    latest = again.filter(twice).unique(["step", "key"], keep="last", maintain_order=True)
    kept = pl.concat([stacked.filter(~twice), latest]).sort("step", "order", "line")
    return conform(kept, METRIC_SCHEMA), abandoned


def _local(wall: pl.Expr) -> pl.Expr:
    """Epoch seconds → naive local wall clock, as ``datetime.fromtimestamp``; null where it has none.

    A record a step, millions of them: Python works out the local clock's offset once per minute
    of the run (zones change offsets on whole minutes), Polars adds it to every time."""
    minute = (wall // 60).cast(pl.Int64, strict=False)
    # Microseconds as Python rounds them: the fraction alone, half to even.
    seconds = wall.floor()
    micros = seconds * 1_000_000 + ((wall - seconds) * 1_000_000).round(mode="half_to_even")
    utc = pl.from_epoch(micros.cast(pl.Int64, strict=False), time_unit="us")
    return utc + minute.map_batches(_offsets, return_dtype=pl.Duration("us"))


def _offsets(minutes: pl.Series) -> pl.Series:
    """The local clock's offset from UTC at each of ``minutes`` (epoch minutes); null where none."""
    offsets = {}
    for minute in minutes.drop_nulls().unique():
        try:
            offsets[minute] = datetime.fromtimestamp(minute * 60) - datetime(1970, 1, 1) - timedelta(minutes=minute)
        except (ValueError, OverflowError, OSError):
            offsets[minute] = None
    return minutes.replace_strict(offsets, default=None, return_dtype=pl.Duration("us"))


def _read_file(
    file: Path, prefix: str, plugins: dict[str, str], notes: list[str], keys: str | None
) -> tuple[pl.DataFrame, pl.DataFrame, float | None, int, int]:
    """One event file's scalars (``step``, ``time``, ``key``, ``value``, ``line``), each window's
    scalars and keys per step (``step``, ``rows``, ``keys``), the wall time of its first record
    read, and its records read and skipped. In each window of records the common one (a single
    ``simple_value``) is decoded by Polars, the others here."""
    frames, firsts, read, skipped, damaged = [], [], 0, 0, 0
    for window in _record_windows(file, notes):
        records = window.filter(_intact(window))
        damaged += window.height - records.height
        ok, decoded = _simple_scalar(pl.col("body"))
        records = records.with_columns(ok.alias("ok"))
        fast = _named(records.filter("ok").select("line", *decoded))
        rows = []
        for line, body in records.filter(~pl.col("ok")).select("line", "body").iter_rows():
            try:
                wall, step, values = _event(memoryview(body))
                found = list(_scalars(values, plugins))
            except (ValueError, IndexError, struct.error):
                skipped += 1
                continue
            read += 1
            firsts.append((line, wall))
            rows += [(step, wall, tag, value, line) for tag, value in found]
        read += fast.height
        if fast.height:
            firsts.append((fast["line"][0], fast["wall"][0]))
        slow = pl.DataFrame(rows, schema=_FILE_SCHEMA, orient="row")
        scalars = pl.concat([fast.select(list(_FILE_SCHEMA)), slow]).sort("line")
        scalars = with_keys(scalars.with_columns(pl.concat_str(pl.lit(prefix), pl.col("key")).alias("key")), keys)
        frames.append(_kept(scalars))
    if damaged:
        notes.append(f"{file.name}: {damaged} records failed their data checksum (a damaged value): skipped")
        skipped += damaged
    if not frames:
        frames = [_kept(pl.DataFrame(schema=_FILE_SCHEMA))]
    steps = pl.concat(f.group_by("step").agg(pl.len().alias("rows"), pl.col("key").n_unique().alias("keys")) for f in frames)
    return pl.concat(frames), steps, min(firsts)[1] if firsts else None, read, skipped


def _kept(scalars: pl.DataFrame) -> pl.DataFrame:
    """A window's scalars as kept: wall times made local times here, window by window, so the
    conversion's temporaries never span a whole run's scalars."""
    time = _local(pl.col("wall")).cast(METRIC_SCHEMA["time"])
    return scalars.select("step", time.alias("time"), pl.col("key").cast(pl.Categorical), "value", "line")


def _record_windows(file: Path, notes: list[str]) -> Iterator[pl.DataFrame]:
    """The records of ``file`` (``line``: 1-based index, ``body``: the ``Event`` bytes), about
    ``_WINDOW`` bytes of them at a time, with ``crc``, the data's checksum (see :func:`_intact`);
    stops at a torn or corrupt one, saying so. Each record's length is checked against its
    checksum; the checksums of the few lengths a file uses are computed once."""
    checked: dict[int, int] = {}
    index = offset = 0
    rest = b""
    with open(file, "rb") as fh:
        while True:
            more = fh.read(_WINDOW)
            data = rest + more if rest else more
            pos, starts, size = 0, [], len(data)
            while pos + 12 <= size:
                length, crc = _HEAD.unpack_from(data, pos)
                expected = checked.get(length)
                if expected is None:
                    expected = _masked_crc32c(memoryview(data)[pos : pos + 8])
                    if len(checked) < 4096:
                        checked[length] = expected
                if expected != crc:
                    notes.append(f"{file.name}: not a TFRecord stream from byte {offset + pos} on (bad length checksum); the rest was skipped")
                    more = b""
                    size = pos  # nothing after this point is a record
                    break
                if pos + 16 + length > size:
                    break
                starts.append(pos)
                pos += 16 + length
            if starts:
                ends = [*starts[1:], pos]
                yield pl.DataFrame({
                    "line": pl.int_range(index + 1, index + 1 + len(starts), eager=True, dtype=pl.Int64),
                    "body": [data[a + 12 : b - 4] for a, b in zip(starts, ends, strict=True)],
                    "crc": [data[b - 4 : b] for b in ends],
                })
                index += len(starts)
            if not more:
                left = size - pos
                if left and left < 12:
                    notes.append(f"{file.name}: torn last record ({left} bytes of its header)")
                elif left:
                    (length,) = _U64.unpack_from(data, pos)
                    notes.append(f"{file.name}: torn last record ({left - 12} of {length + 4} bytes; killed mid-write?)")
                return
            offset += pos
            rest = data[pos:]


def _named(fast: pl.DataFrame) -> pl.DataFrame:
    """``tag`` bytes → ``key``, each distinct tag decoded once (bad UTF-8 replaced, as elsewhere)."""
    tags = fast["tag"].unique()
    names = pl.DataFrame({"tag": tags, "key": [bytes(t).decode("utf-8", "replace") for t in tags]}, schema={"tag": pl.Binary, "key": pl.String})
    return fast.join(names, on="tag", how="left", maintain_order="left").drop("tag")


def _simple_scalar(body: pl.Expr) -> tuple[pl.Expr, list[pl.Expr]]:
    """Whether an ``Event`` is exactly
    ``{1 wall_time, 2 step (≤ 5 varint bytes, or absent: 0), 5 summary {1 value {1 tag, 2 simple_value}}}``
    with one-byte lengths — what tensorboardX and torch's ``add_scalar`` write — and, for those
    that are, its ``step``, ``wall``, ``tag`` (bytes) and ``value``. The others are decoded field by
    field."""
    def at(i: pl.Expr | int) -> pl.Expr:
        return body.bin.get(i, null_on_oob=True).cast(pl.Int64)

    size = body.bin.size().cast(pl.Int64)
    stepped = at(9) == 0x10
    # The step's varint: its length in bytes (null past five) and its value.
    lengths = pl.coalesce(*(pl.when(at(10 + j) < 0x80).then(j + 1) for j in range(5)))
    step = pl.sum_horizontal(
        pl.when(lengths > j).then((at(10 + j) & 0x7F) * (1 << (7 * j))).otherwise(0) for j in range(5)
    )
    p = pl.when(stepped).then(10 + lengths).otherwise(9)  # where the summary's tag is
    tag_size = at(p + 5)
    ok = (
        (at(0) == 0x09) & (~stepped | lengths.is_not_null()) & (at(p) == 0x2A) & (at(p + 1) == size - p - 2)
        & (at(p + 2) == 0x0A) & (at(p + 3) == size - p - 4) & (at(p + 4) == 0x0A) & (tag_size == size - p - 11)
        & (at(p + 6 + tag_size) == 0x15)
    ).fill_null(False)
    return ok, [
        pl.when(stepped).then(step).otherwise(0).alias("step"),
        body.bin.slice(1, 8).bin.reinterpret(dtype=pl.Float64, endianness="little").alias("wall"),
        body.bin.slice(p + 6, tag_size).alias("tag"),
        body.bin.slice(p + 7 + tag_size, 4).bin.reinterpret(dtype=pl.Float32, endianness="little").cast(pl.Float64).alias("value"),
    ]


def _event(record: memoryview) -> tuple[float, int, list[memoryview]]:
    wall, step, values = 0.0, 0, []
    for number, _, value in fields(record):
        if number == 1:
            wall = _F64.unpack(value)[0]
        elif number == 2:
            step = value - (1 << 64) if value >= 1 << 63 else value
        elif number == 5:
            values = [v for n, _, v in fields(value) if n == 1]
    return wall, step, values


def _scalars(values: list[memoryview], plugins: dict[str, str]) -> Iterator[tuple[str, float]]:
    """``(tag, value)`` of each scalar summary value; ``plugins`` remembers each tag's plugin."""
    for raw in values:
        tag, simple, tensor = "", None, None
        for number, _, value in fields(raw):
            if number == 1:
                tag = bytes(value).decode("utf-8", "replace")
            elif number == 2:
                simple = _F32.unpack(value)[0]
            elif number == 8:
                tensor = value
            elif number == 9:
                plugin = _first(_first(value, 1), 1)
                if plugin is not None:
                    plugins[tag] = bytes(plugin).decode("utf-8", "replace")
        if simple is not None:
            yield tag, simple
        elif tensor is not None and plugins.get(tag, "scalars") == "scalars":
            scalar = _tensor_scalar(tensor)
            if scalar is not None:
                yield tag, scalar


def _tensor_scalar(tensor: memoryview) -> float | None:
    """The value of a one-element float/int TensorProto, else None (strings, histograms…)."""
    found: dict[int, Any] = {}
    for number, _, value in fields(tensor):
        found.setdefault(number, value)
    dtype = found.get(1, 0)
    shape = found.get(2)
    if shape is not None and any(_first(dim, 1) not in (None, 1) for n, _, dim in fields(shape) if n == 2):
        return None
    if 4 in found:
        size, fmt = _DTYPES.get(dtype, (0, ""))
        return float(struct.unpack(fmt, found[4])[0]) if size and len(found[4]) == size else None
    for number, unpack in ((5, _F32), (6, _F64)):  # float_val, double_val: packed or not, bytes either way
        if number in found:
            return float(unpack.unpack_from(found[number])[0])
    for number in (7, 10):  # int_val, int64_val: packed varints or one varint
        if number in found:
            raw = found[number]
            value = varint(raw, 0)[0] if isinstance(raw, memoryview) else raw
            return float(value - (1 << 64) if value >= 1 << 63 else value)
    return None


def _first(message: memoryview | None, number: int) -> Any:
    if message is None:
        return None
    return next((value for n, _, value in fields(message) if n == number), None)


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC32C = _crc32c_table()


#: Records up to this size (every scalar event) have their data checksum checked; longer ones
#: (histograms, images, text: never read as metrics) are taken as they are.
_CHECKED_BYTES = 512


def _intact(records: pl.DataFrame) -> pl.Series:
    """Whether each record's ``body`` matches its ``crc`` (TFRecord's masked CRC32C of the data).
    Run for a window of records at once, a byte position at a time over every record that long:
    about half a second a million scalar records (a loop in Python: about a minute)."""
    size = records["body"].bin.size()
    checked = size <= _CHECKED_BYTES
    longest = int(size.filter(checked).max() or 0)
    table = pl.lit(pl.Series(_CRC32C, dtype=pl.UInt32))
    crc = pl.col("crc")
    frame = records.select("body", size.alias("size"), pl.lit(0xFFFFFFFF, pl.UInt32).alias("crc"))
    for i in range(longest):
        byte = pl.col("body").bin.get(i, null_on_oob=True).cast(pl.UInt32)
        frame = frame.with_columns(
            pl.when(pl.col("size") > i).then(table.gather((crc ^ byte) & 0xFF) ^ crc.floordiv(256)).otherwise(crc).alias("crc")
        )
    done = (crc ^ 0xFFFFFFFF).cast(pl.UInt64)
    masked = ((done.floordiv(1 << 15) | ((done * (1 << 17)) % (1 << 32))) + 0xA282EAD8) % (1 << 32)
    stored = records["crc"].bin.reinterpret(dtype=pl.UInt32, endianness="little").cast(pl.UInt64)
    return (frame.select(masked).to_series() == stored) | ~checked


def _masked_crc32c(data: memoryview) -> int:
    """TFRecord's masked CRC32C, in Python: run on the 8 length bytes (the data's: :func:`_intact`)."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
