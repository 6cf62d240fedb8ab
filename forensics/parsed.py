"""What one parser yields for one source, in the shape the run loader merges (and the cache stores)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import polars as pl

from forensics.model import SourceReport
from parsers.schema import METRIC_SCHEMA, empty

#: The frames of a parse, each with ``file`` and ``line`` columns.
FRAMES = ("steps", "metrics", "events", "superseded")


@dataclass(frozen=True)
class Parsed:
    """One parser's frames for one source, and how much of it was understood."""

    source: str
    steps: pl.DataFrame
    metrics: pl.DataFrame
    events: pl.DataFrame
    lines: int
    unparsed_lines: int
    notes: tuple[str, ...]
    facts: dict[str, str] = field(default_factory=dict)
    reports: tuple[SourceReport, ...] = ()
    """Per-file coverage when one source is many files (a Ray session)."""
    superseded: pl.DataFrame = field(default_factory=lambda: empty(METRIC_SCHEMA))
    """Metric rows of attempts a relaunch abandoned (``metrics`` has the run's own)."""
    restart_lines: tuple[int, ...] | None = None
    """Lines the reader says its file can be read again from with nothing carried over, where it
    knows better than its rows tell (a server log's last minutes, whose rows are folded); empty
    where it knows no line is (a grown file is then parsed afresh); ``None``: it says nothing."""
    reading: str = ""
    """How the reader chose to read this file from its head (the line prefixes it strips, a table's
    width): a part of a file read alone is read as the whole is only where it chooses the same."""

    def frames(self) -> dict[str, pl.DataFrame]:
        return {name: getattr(self, name) for name in FRAMES}

    def meta(self) -> dict[str, Any]:
        """Everything but the frames, as JSON-ready values."""
        return {
            "source": self.source,
            "lines": self.lines,
            "unparsed_lines": self.unparsed_lines,
            "notes": list(self.notes),
            "facts": self.facts,
            "reports": [r.to_dict() for r in self.reports],
            "restart_lines": None if self.restart_lines is None else list(self.restart_lines),
            "reading": self.reading,
        }

    @staticmethod
    def from_parts(meta: dict[str, Any], frames: dict[str, pl.DataFrame]) -> Parsed:
        reports = tuple(SourceReport(**{**r, "notes": tuple(r["notes"])}) for r in meta["reports"])
        return Parsed(meta["source"], frames["steps"], frames["metrics"], frames["events"], meta["lines"],
                      meta["unparsed_lines"], tuple(meta["notes"]), dict(meta["facts"]), reports, frames["superseded"],
                      None if meta.get("restart_lines") is None else tuple(meta["restart_lines"]), meta.get("reading", ""))

    def before(self, line: int) -> Parsed:
        """The rows that come from lines before ``line`` (counts are the caller's to fix)."""
        kept = {name: rows_where(frame, pl.col("line") < line) for name, frame in self.frames().items()}
        return replace(self, **kept)

    def shifted(self, lines: int, file: str) -> Parsed:
        """Rows of a parse of a file's tail moved to the whole file's line numbers and name."""
        moved = {
            name: frame.with_columns((pl.col("line") + lines).alias("line"), pl.lit(file).cast(frame.schema["file"]).alias("file"))
            for name, frame in self.frames().items()
        }
        return replace(self, **moved)

    def moved(self, old: str, new: str) -> Parsed:
        """The parse with file paths under ``old`` (the path it was read by) named under ``new``:
        one file read by two paths (relative, then absolute) is cited as it is asked for now."""
        if old == new:
            return self
        renamed = {}
        for name, frame in self.frames().items():
            file = pl.col("file").cast(pl.String)
            renamed[name] = frame.with_columns(
                pl.when(file.str.starts_with(old)).then(pl.lit(new) + file.str.slice(len(old))).otherwise(file)
                .cast(frame.schema["file"]).alias("file"))
        return replace(self, **renamed)


def rows_where(frame: pl.DataFrame, predicate: pl.Expr, *, most_runs: int = 64) -> pl.DataFrame:
    """``frame.filter(predicate)``, as slices of ``frame`` when the kept rows lie in a few runs.

    A grown log's cached rows are kept but for their last few: a filter would copy a long run's
    every value, slices copy none (they share the frame's buffers).
    """
    mask = frame.select(predicate.fill_null(False)).to_series()
    runs = mask.rle().struct.unnest().with_columns(pl.col("len").cum_sum().shift(1, fill_value=0).alias("start"))
    kept = runs.filter(pl.col("value"))
    if kept.height > most_runs:
        return frame.filter(predicate)
    parts = [frame.slice(start, length) for start, length in kept.select("start", "len").iter_rows()]
    return pl.concat(parts, rechunk=False) if parts else frame.clear()
