"""The ``metrics`` export: every run's metric frame in long form, written one run at a time.

Each run is loaded, written a slice at a time and let go before the next is read: a team's
hundreds of runs need the memory of their largest, and keys become strings a slice at a time.

Example:
    >>> from pathlib import Path
    >>> rows = write_metrics(metric_rows([Path("outputs/")]), "csv", Path("metrics.csv"))  # doctest: +SKIP
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import IO, Any

import polars as pl

from forensics.analysis import framework_of, load_each
from forensics.cache import ParseCache
from forensics.discover import PathArg
from forensics.run import RunData

#: The exported columns (CONTRACT's metric frame) and their types.
EXPORT_SCHEMA: dict[str, pl.DataType] = {
    "run_id": pl.String(),
    "source": pl.String(),
    "step": pl.Int64(),
    "time": pl.Datetime("ms"),
    "key": pl.String(),
    "value": pl.Float64(),
    "root": pl.String(),  # (the run's folder: runs sharing a run id, one config launched twice, apart)
    "file": pl.String(),  # (the log it was read from: one server's series apart from another's)
}
FORMATS = ("csv", "jsonl", "parquet")
#: Rows converted and written at once: the strings of a slice, not of a run, are held.
SLICE_ROWS = 1 << 18


def metric_rows(
    paths: PathArg | Iterable[PathArg],
    *,
    custom_format: PathArg | None = None,
    wandb_runs: Sequence[str] = (),
    cache: ParseCache | None = None,
    keys: str | None = None,
    before: Callable[[RunData], None] | None = None,
) -> Iterator[pl.DataFrame]:
    """Every run's metrics in export form (:data:`EXPORT_SCHEMA`), in slices of at most
    :data:`SLICE_ROWS` rows, the runs in ``analyze``'s order.

    A run is read only when the previous one's slices are consumed. Arguments as for
    :func:`forensics.analyze`; nothing is judged. ``before`` sees each run before its rows (the
    command refuses there an output inside a checkpoint folder a log named).
    """
    for run in load_each(paths, custom_format=custom_format, wandb_runs=wandb_runs, cache=cache, keys=keys):
        if before is not None:
            before(run)
        yield from _export_form(run)


def write_metrics(frames: Iterable[pl.DataFrame], fmt: str, target: IO[Any] | str | os.PathLike[str]) -> int:
    """Write ``frames`` (export form, as :func:`metric_rows` yields them) to ``target`` as one CSV,
    JSONL or Parquet file, and return the number of rows written.

    An empty export is still a valid file: a CSV header, an empty JSONL, a Parquet file with the schema.
    """
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    if isinstance(target, str | os.PathLike):  # one handle for every slice (a path would be written over each time)
        with open(target, "wb") as handle:
            return write_metrics(frames, fmt, handle)
    written = 0
    if fmt == "parquet":
        import pyarrow.parquet as pq  # here only: importing it costs every command 40 MB and 0.1 s

        with pq.ParquetWriter(target, pl.DataFrame(schema=EXPORT_SCHEMA).to_arrow().schema) as writer:
            for part in frames:
                writer.write_table(part.to_arrow())
                written += part.height
        return written
    first = True
    for part in frames:
        # Times as the analysis document gives them: ISO 8601, milliseconds only when there are some.
        part = part.with_columns(pl.col("time").dt.to_string("%Y-%m-%dT%H:%M:%S%.3f").str.strip_suffix(".000"))
        if fmt == "csv":
            part.write_csv(target, include_header=first)
        else:
            part.select(_json_line()).write_csv(target, include_header=False, quote_style="never")
        first, written = False, written + part.height
    if first and fmt == "csv":
        pl.DataFrame(schema=EXPORT_SCHEMA).write_csv(target)
    return written


def _json_line() -> pl.Expr:
    """Each row as one JSON object. JSON has no NaN or infinity: those values are the strings
    ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (what ``float()`` reads back), not ``null``."""
    value = pl.col("value")
    token = (
        pl.when(value.is_nan()).then(pl.lit('"NaN"'))
        .when(value == math.inf).then(pl.lit('"Infinity"'))
        .when(value == -math.inf).then(pl.lit('"-Infinity"'))
        .otherwise(value.cast(pl.String))
        .fill_null("null")
    )
    # (the columns in the export's order: those before ``value``, it, then the rest)
    names = list(EXPORT_SCHEMA)
    before, after = names[: names.index("value")], names[names.index("value") + 1:]
    head = pl.struct(before).struct.json_encode().str.strip_suffix("}")
    tail = pl.struct(after).struct.json_encode().str.strip_prefix("{")
    return pl.concat_str(head, pl.lit(',"value":'), token, pl.lit(","), tail)


def _export_form(run: RunData) -> Iterator[pl.DataFrame]:
    """The run's rows with its id and plain strings (categorical inside the tool, strings outside)."""
    framework = framework_of(run)
    for part in run.metrics.iter_slices(SLICE_ROWS):
        yield part.select(
            pl.lit(run.location.run_id, pl.String).alias("run_id"),
            pl.col("source").cast(pl.String).replace({"trl_state": "trl"}).fill_null(framework),
            "step",
            "time",
            pl.col("key").cast(pl.String),
            "value",
            pl.lit(str(run.location.root), pl.String).alias("root"),
            pl.col("file").cast(pl.String),
        )
