"""Messages read back from their lines.

A flood's events keep their place (``file``, ``line``) but not their text (see
:data:`parsers.schema.REPEATED_KINDS`): millions of request timeouts cost a few bytes each. What
the analysis reads in them, it reads from their lines, a block at a time (:func:`from_lines`);
the few messages it quotes, and those a user exports, are read back whole (:func:`with_messages`).
Either way a line is cleaned as the readers clean it, and a pass over a file stops after the
last line wanted (and starts at the block before the first, where an earlier pass marked it).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import polars as pl

from parsers._lines import IN_FLIGHT, cleaned, is_compressed, iter_lines_at, lines_at
from parsers.schema import REPEATED_KINDS

#: A row whose message a reader did not hold (and can be read back).
UNHELD = (pl.col("message").is_null() & pl.col("kind").is_in(list(REPEATED_KINDS))
          & pl.col("file").is_not_null() & pl.col("line").is_not_null())


def with_messages(events: pl.DataFrame) -> pl.DataFrame:
    """``events`` (any frame with ``kind``, ``file``, ``line`` and ``message``) with the messages
    left unheld read back, in the same row order. A line its file no longer has stays null."""
    read = from_lines(events, {"message": pl.col("message")})
    return events if read is None else events.with_columns(pl.coalesce(pl.col("message"), read["message"]))


def iter_with_messages(events: pl.DataFrame, rows: int = 500_000) -> Iterator[pl.DataFrame]:
    """``events`` a slice of ``rows`` at a time, each :func:`with_messages`: an export of a flood
    holds one slice's texts at a time. Each slice's lines are read from the block before them (what
    one pass read is marked: see :data:`parsers._lines._MARKS`); a gzipped log cannot be read from
    the middle, and a flood in one is read back whole at once."""
    unheld = events["file"].filter(events.select(UNHELD.fill_null(False)).to_series()).unique().drop_nulls()
    if any(_packed(str(file)) for file in unheld):
        rows = max(rows, events.height)
    for start in range(0, events.height, rows):
        yield with_messages(events.slice(start, rows))


def _packed(path: str) -> bool:
    try:
        return is_compressed(Path(path))
    except OSError:
        return False


def from_lines(events: pl.DataFrame, columns: dict[str, pl.Expr]) -> dict[str, pl.Series] | None:
    """``columns`` (expressions of ``message`` and the event's other columns) evaluated for the
    rows whose message was not held, over their lines read back; one series a column, aligned with
    ``events``, null at the other rows. ``None`` when every message is held.

    Lines are read a block at a time and only the columns' values are kept: a flood's texts are
    never held together."""
    unheld = events.select(UNHELD.fill_null(False)).to_series()
    if not unheld.any():
        return None
    needed = sorted({name for expr in columns.values() for name in expr.meta.root_names()} - {"message"} | {"line"})
    probe = events.head(0).select(*needed, pl.lit(None, dtype=pl.String).alias("message")).select(**columns)
    out = {name: pl.repeat(None, events.height, dtype=probe.schema[name], eager=True).alias(name) for name in columns}
    files = events["file"].filter(unheld).unique().drop_nulls()
    given = events.select(needed)

    def evaluated(mine: pl.DataFrame, block: pl.DataFrame) -> pl.DataFrame:
        lo, hi = mine["line"].search_sorted(block["line"][0]), mine["line"].search_sorted(block["line"][-1], side="right")
        here = mine.slice(lo, hi - lo).join(block.select("line", cleaned(pl.col("text")).alias("message")), on="line")
        return given[here["row"]].with_columns(here["message"]).select(here["row"], **columns)

    def keep(values: pl.DataFrame) -> None:
        for name in columns:  # (in place: one column a name, whatever the flood)
            out[name].scatter(values["row"], values[name])

    # Two blocks at a time, as the readers parse them (Polars lets go of the GIL): both cores busy.
    with ThreadPoolExecutor(IN_FLIGHT) as pool:
        for file in files:
            mine = events.select(pl.int_range(pl.len(), dtype=pl.UInt32).alias("row"), "line").filter(unheld & (events["file"] == file))
            if not mine["line"].is_sorted():  # (a flood's lines, in time order, are in line order already)
                mine = mine.sort("line")
            in_flight: list[Future[pl.DataFrame]] = []
            for block in iter_lines_at(str(file), mine["line"]):
                in_flight.append(pool.submit(evaluated, mine, block))
                if len(in_flight) == IN_FLIGHT:
                    keep(in_flight.pop(0).result())
            for done in in_flight:
                keep(done.result())
    return out


def table_row(file: str, line: int, key: str, within: int = 400) -> int:
    """The line of ``key``'s row in the table whose values are cited at ``line`` (AReaL cites a
    table's values at its step header): the first of the ``within`` lines from ``line`` with a
    ``│ key │`` cell. ``line`` itself when none has (a value logged on its own line), or when
    ``file`` is none or a copy's binary records (W&B, TensorBoard: their "lines" are records)."""
    return cited_row(file, line, key, within)[0]


def cited_row(file: str, line: int, key: str, within: int = 400) -> tuple[int, str | None]:
    """:func:`table_row`, and that line's text as the readers read it (``None`` for a copy's
    records, which have no text, or a line the file no longer has)."""
    if not file or line is None or file.endswith(".wandb") or "tfevents" in Path(file).name:
        return line, None
    cell = rf"(?:^|│)\s*{re.escape(key)}\s*│"
    near = lines_at(file, pl.int_range(line, line + within, eager=True)).with_columns(cleaned(pl.col("text")).alias("text"))
    found = near.filter(pl.col("text").str.contains(cell))
    at = int(found["line"][0]) if found.height else line
    text = near.filter(pl.col("line") == at)["text"]
    return at, (text[0] if len(text) else None)
