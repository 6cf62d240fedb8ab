"""A log's rotated parts read as one where a rotation cut a stats table.

logrotate's ``copytruncate`` copies the log and empties it while the trainer writes: a step's
table may end one part (its header, its first rows) and open the next (its other rows, the reward
among them). Each part is parsed alone, so the run loader hands the rows the later part opens
with to the step the earlier one ended inside, cited where they are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

import polars as pl

from forensics.discover import LogSource
from forensics.model import SourceReport
from parsers.areal import cut_table_step, read_leading_rows
from parsers.schema import METRIC_SCHEMA, ROTATED, with_keys


@dataclass(frozen=True)
class OpenTable:
    """The step a part's last table belongs to, where the part ends inside it."""

    step: int
    time: datetime | None
    source: str


def open_table(steps: pl.DataFrame, notes: tuple[str, ...], source: str) -> OpenTable | None:
    """The step whose table a parse of one part (its ``steps``, its ``notes``) ends inside or before, if any."""
    step = cut_table_step(notes)
    if step is None:
        return None
    headers = steps.filter(pl.col("step") == step).sort("line")
    return OpenTable(step, headers["time"][-1] if headers.height else None, source)


def tables_across_parts(
    logs: list[LogSource], open_tables: dict[int, OpenTable], metrics: dict[str, list[tuple[int, pl.DataFrame]]],
    reports: list[SourceReport], keys: str | None = None,
) -> list[SourceReport]:
    """Give the rows a part opens with to the step the part before it (by rank in ``logs``: the
    same log, rotated oldest first) ended inside, in that part's frame of ``metrics``: a later
    part's rows of a step would otherwise stand in for all of the earlier part's. A key the step
    already has keeps its value; ``keys`` (a regex) keeps only the keys it finds something in, as
    the parse did. Returns ``reports`` with both parts' notes saying so."""
    said: dict[str, list[tuple[str, int]]] = {}
    for rank, table in open_tables.items():
        if rank + 1 >= len(logs) or not _one_log(logs[rank], logs[rank + 1]):
            continue
        after = logs[rank + 1].path
        try:
            rows = read_leading_rows(after)
        except (OSError, pl.exceptions.PolarsError):
            continue
        if rows.is_empty():
            continue
        frames = metrics.get(table.source, [])
        at = next((i for i, (r, _) in enumerate(frames) if r == rank), None)
        if at is None:
            continue
        before = frames[at][1]
        had = before.filter(pl.col("step") == table.step)["key"].cast(pl.String).unique()
        given = rows.filter(~pl.col("key").is_in(had.implode())).select(
            pl.lit(table.step, pl.Int64).alias("step"), pl.lit(table.time, pl.Datetime("ms")).alias("time"), "key", "value",
            pl.lit(str(after)).alias("file"), "line", pl.lit(table.source).alias("source"),
        ).cast(METRIC_SCHEMA)  # type: ignore[arg-type]
        frames[at] = (rank, pl.concat([before, with_keys(given, keys)]))
        ended = str(logs[rank].path)
        count = rows["line"].n_unique()
        said.setdefault(ended, []).append(
            (f"the log's last table (step {table.step}) goes on at the head of {after.name} (a rotation cut it): read as one", 0))
        said.setdefault(str(after), []).append(
            (f"its first {count} table rows are the rest of step {table.step}'s table in {Path(ended).name}: read as that step's", count))
    return [_resaid(report, said[report.path]) if report.path in said else report for report in reports]


def _one_log(earlier: LogSource, later: LogSource) -> bool:
    """Whether two sources are parts of one log (``trainer.log.2.gz``, then ``trainer.log.1.gz``)."""
    return earlier.kind == later.kind and earlier.path.parent == later.path.parent and (
        re.sub(ROTATED, "", earlier.path.name) == re.sub(ROTATED, "", later.path.name))


def _resaid(report: SourceReport, said: list[tuple[str, int]]) -> SourceReport:
    """``report`` with the notes ``said`` (each with the rows it gives a step) for its cut-off
    note, and those rows out of its count of rows that belong to no step."""
    rows = sum(given for _, given in said)
    notes = []
    for kept in report.notes:
        if cut_table_step([kept]) is not None:
            continue
        if rows and (orphans := re.fullmatch(r"([\d,]+)( table rows belong to no step header .*)", kept)):
            left = int(orphans[1].replace(",", "")) - rows
            kept = f"{left:,}{orphans[2]}" if left > 0 else ""
        if kept:
            notes.append(kept)
    return replace(report, notes=(*notes, *(note for note, _ in said)))
