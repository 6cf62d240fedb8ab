"""AReaL and realhf text logs (``trainer.log``, ``llm_server.log``, ``main.log``, …) → frames.

Handles every StatsLogger era: the ``Train step g/G done.`` header followed by one or more
``Stats (i/N):`` fancy_grid tables (AReaL-lite, v0.3-lite … HEAD), realhf's ``RPC name …
returns`` tables closed by ``(global step g) finishes.``, tables with any number of key/value
pairs per row, blank cells, ``nan``/``inf``. Around the text: ANSI colours, the ``(AReaL)``
header, ``merged.log`` role prefixes, Ray ``(Name pid=N)`` prefixes, and relaunches that append
to the same file (the later copy of a step wins).

Work is split in two: :func:`_extract` does line-local filtering and splitting (vectorized,
streamable), :func:`_assemble` links the few extracted rows (headers, tables, tracebacks).

Example:
    >>> log = read_areal_log(Path("outputs/logs/root/exp/trial0/trainer.log"))  # doctest: +SKIP
    >>> log.metrics.filter(pl.col("key") == "grpo_actor/task_reward/avg")  # doctest: +SKIP
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path

import polars as pl

from parsers._formats import LogFormat, load_format
from parsers._lines import ANSI, cleaned, line_batch_pieces, sniff
from parsers.schema import (
    EVENT_SCHEMA,
    METRIC_SCHEMA,
    REPEATED_KINDS,
    STEP_SCHEMA,
    abandoned,
    conform,
    keys_kept,
    sort_in_place,
    step_number,
    traceback_message,
    with_keys,
)

__all__ = ["AReaLLog", "cut_table_step", "looks_like_areal", "read_areal_log", "read_leading_rows"]

_SKIPPED = ["│", "├", "╞"]
_HEAD_CHARS = 320
_LITE_HEADER = r"INFO: Epoch (\d+)/(\d+) Step (\d+)/(\d+) Train step (\d+)/(\d+) done\."
_REALHF_HEADER = r"INFO: Epoch (\d+)/(\d+) step (\d+)/(\d+) \(global step (\d+)\) finishes\."
_STATS_ANCHOR = r"INFO: Stats \(\d+/\d+\):|INFO: RPC name \S+ returns"
#: ``i`` of ``Stats (i/N)``: a step's tables count 1 … N (one per PPO minibatch in v0.4.0).
_STATS_PART = r"INFO: Stats \((\d+)/\d+\):"
_TIME_TABLE_ANCHOR = r"Detailed time stats:"
_FACT_LINES = r"Launcher|Local Scheduler|LocalScheduler"
# (torchrun prefixes a rank's stderr lines with ``[rank0]: ``: a crash's lines, never the head a file's prefixes are judged from)
_CHAIN_MARKER = r"^(?:\[rank\d+\]: )?(?:During handling of the above exception|The above exception was the direct cause)"
_TRACEBACK_CONTEXT = r"^(?:\[rank\d+\]: )?(?:\s|During handling of the above exception|The above exception was the direct cause)"
#: Timed logger lines after the last step a log keeps, for a grown log to be read again from.
RESTART_LINES = 30


@dataclass(frozen=True)
class AReaLLog:
    """What one AReaL log file holds."""

    path: str
    steps: pl.DataFrame
    metrics: pl.DataFrame
    events: pl.DataFrame
    lines: int
    unparsed_lines: int
    notes: tuple[str, ...] = ()
    facts: dict[str, str] = field(default_factory=dict)
    superseded: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=METRIC_SCHEMA))
    """Table values of attempts a relaunch abandoned (from the step it went back to on): not in ``metrics``."""
    reading: str = ""
    """How the file was read, judged from its head: the line prefixes stripped, the pairs a table row holds."""
    restart_lines: tuple[int, ...] | None = None
    """Lines the rest of the log can be read from as the whole log reads it (no table or header
    before one is left for a line after it). AReaL-lite prints a step's tables after its header: its
    last header, and the last few timed logger lines (:data:`RESTART_LINES`) after the last table —
    none where a table is announced and not begun. realhf prints them before: timed logger lines after
    one of its last two headers, up to the next table's announcement. Never inside a traceback still
    being printed (see :func:`_out_of_tracebacks`). A grown log, such as a flood of request timeouts
    with no step since, is then read again from near its old end, not from its last step. No line
    (``()``) where tables have no header yet: the whole log is read again. With neither, every line
    is read alone: the last timed ones (``None`` if none is timed: the cache's own rules)."""


def looks_like_areal(path: Path) -> bool:
    """True when the head of ``path`` has AReaL/realhf logger lines."""
    fmt = load_format("areal")
    head = re.sub(ANSI, "", sniff(path, 256 << 10))
    pattern = re.compile(fmt.line_regex)
    prefixes = [re.compile(p) for p in fmt.prefixes.values()]
    for line in head.splitlines()[:2000]:
        for prefix in prefixes:
            line = prefix.sub("", line, count=1)
        if pattern.match(line):
            return True
    return False


def read_areal_log(path: Path, *, keys: str | None = None, held: int | None = None) -> AReaLLog:
    """Parse one AReaL/realhf log file (plain or gzipped) into frames.

    ``keys``: a regex; only metrics whose key it finds something in are kept (table cells are
    dropped batch by batch, so the others never take memory). ``None`` keeps every key.
    ``held``: how many messages of a repeated kind a batch of lines keeps, the others left null
    (see :data:`~parsers.schema.REPEATED_KINDS`); ``None`` keeps all.
    """
    fmt = load_format("areal")
    head = re.sub(ANSI, "", sniff(path, 256 << 10)).splitlines()[:5000]
    prefixes = _prefixes_in(head, fmt)
    pairs = _pairs_per_row(head, prefixes)
    held = None if prefixes else held  # (a line read back would still have the prefix its message lost)

    def finish(parts: dict[str, pl.DataFrame]) -> dict[str, pl.DataFrame]:
        parts = {**parts, "timed": _classified(parts["timed"], fmt, held)}
        kept = keys_kept(parts["cells"], keys)
        if kept is None:
            return parts
        # Cells that are not numbers stay: they are counted (in a note) once their table's step is known.
        return {**parts, "cells": parts["cells"].filter(pl.col("key").is_in(kept) | pl.col("value").is_null())}

    pieces = line_batch_pieces(path, lambda lines: _extract(lines, fmt, prefixes, pairs), finish=finish)
    # Most of the rows (table cells, memory lines) are turned into metrics batch by batch.
    cells = pieces.pop("cells")
    lined = [pieces.pop(f"metric{i}") for i in range(len(fmt.metrics))]
    log = _assemble(str(path), {name: pl.concat(frames) for name, frames in pieces.items()}, cells, lined, fmt, pairs)
    # The events share the batches' columns until those are let go: sorted after, in place, a flood
    # of millions is never held twice.
    del pieces, cells, lined
    sort_in_place(log.events, "line")
    return replace(log, metrics=with_keys(log.metrics, keys), superseded=with_keys(log.superseded, keys),
                   reading=f"prefixes={prefixes} pairs={pairs}")


#: The note of a log whose last line is inside a stats table.
ENDS_INSIDE_A_TABLE = "the log ends inside a table, cut off while it was written: its rows so far are read"
#: The notes of a log that ends before a step's table is whole: the step is said (a rotation's next
#: part may open with the rest, see :func:`read_leading_rows`).
_STEP_TABLE_CUT = "the log ends inside step {step}'s table, cut off while it was written: its rows so far are read"
_STEP_TABLE_ANNOUNCED = "the log ends after step {step}'s header, cut off before its table"
#: The notes that say how the log ends, not what it holds (a splice of a grown log takes them from the grown part).
END_NOTES = frozenset({_STEP_TABLE_ANNOUNCED.format(step=1), _STEP_TABLE_CUT.format(step=1)})
_TABLE_CUT_AT = re.compile(r"the log ends (?:inside|after) step (\d+)'s (?:table|header)")


def cut_table_step(notes: tuple[str, ...] | list[str]) -> int | None:
    """The step whose table a log's ``notes`` say it ends inside or before, if any."""
    return next((int(found[1]) for note in notes if (found := _TABLE_CUT_AT.match(note))), None)


def read_leading_rows(path: Path, n_bytes: int = 1 << 20) -> pl.DataFrame:
    """The whole table rows ``path`` opens with, before any other line but those announcing them
    (``Stats (1/N):``): (``line``, ``key``, ``value``), empty where it opens otherwise. A rotation
    (logrotate's ``copytruncate``) may cut a step's stats table, or fall between its header and its
    table: the rest opens the next part, the header is in the part before, and :func:`read_areal_log`
    reads each alone. Their step is the run loader's to give."""
    fmt = load_format("areal")
    head = re.sub(ANSI, "", sniff(path, n_bytes)).splitlines()
    prefixes = _prefixes_in(head[:5000], fmt)
    announcing = re.compile(fmt.fields["time"] + r".+? INFO:(?: Stats \(\d+/\d+\):)?\s*$")
    leading: list[str] = []
    for text in head[:-1]:  # (the last may be cut by the read)
        for regex in prefixes:
            text = re.sub(regex, "", text, count=1)
        if text.startswith(_INSIDE_A_TABLE):
            leading.append(text)
        elif any(leading) or len(leading) > 2 or not announcing.match(text):
            break  # (before the rows, only the lines announcing them: the part before ended at the step's header)
        else:
            leading.append("")
    if not any(leading):
        return pl.DataFrame(schema={"line": pl.Int64, "key": pl.String, "value": pl.Float64})
    lines = pl.LazyFrame({"line": range(1, len(leading) + 1), "text": leading}, schema={"line": pl.Int64, "text": pl.String})
    cells = _extract(lines, fmt, [], _pairs_per_row(head[:5000], prefixes))["cells"]
    return cells.select("line", pl.col("key").cast(pl.String), "value").collect()


def _prefixes_in(head: list[str], fmt: LogFormat) -> list[str]:
    """The prefix patterns this file uses, judged from its head (so clean files pay nothing)."""
    used = []
    for regex in fmt.prefixes.values():
        pattern = re.compile(regex)
        if sum(1 for line in head if pattern.match(line)) >= max(1, len(head) // 20):
            used.append(regex)
    return used


def _pairs_per_row(head: list[str], prefixes: list[str]) -> int:
    """Key/value pairs per table row: AReaL prints 4, and fewer in a table of fewer values (realhf's
    time tables of 2 or 3, often a log's first); more only where a border in the head shows more."""
    widest = 4
    for line in head:
        for regex in prefixes:
            line = re.sub(regex, "", line, count=1)
        if line.startswith("╒"):
            widest = max(widest, (line.count("╤") + 1) // 2)
    return widest


def _extract(lines: pl.LazyFrame, fmt: LogFormat, prefixes: list[str], pairs: int) -> dict[str, pl.LazyFrame]:
    """Line-local work on one batch of lines, reduced to what :func:`_assemble` reads.

    Table rows (most of the bytes) are split by field, never matched by a regex. Table rules
    and blank lines are dropped unread; only the remaining lines are cleaned of colour codes
    (colorlog colours a message's first line, never a table row) and read with the logger regex.
    Results must not depend on where batches are cut (see ``line_batch_pieces``).
    """
    text = pl.col("text")
    for regex in prefixes:
        text = text.str.replace(regex, "")
    lines = lines.with_columns(text.alias("text")) if prefixes else lines
    fields = pl.col("text").str.split_exact("│", 2 * pairs + 1)
    columns = []
    for j in range(pairs):
        key, raw = pl.col(f"field_{2 * j + 1}"), pl.col(f"field_{2 * j + 2}")
        columns += [
            key.str.strip_chars().cast(pl.Categorical).alias(f"k{j}"),
            raw.str.strip_chars().cast(pl.Float64, strict=False).alias(f"v{j}"),
        ]
    split = (
        lines.filter(pl.col("text").str.starts_with("│"))
        # (a row with bytes that are not UTF-8 in it is damaged: a key read through them would be a new one)
        .with_columns((pl.col("text").str.strip_chars_end().str.ends_with("│") & ~pl.col("text").str.contains("\ufffd", literal=True)
                       & ~pl.col("text").str.contains("\0", literal=True)).alias("complete"))
        .select("line", "complete", fields.alias("f"))
        .unnest("f")
        .select("line", "complete", *columns, (pl.col(f"field_{2 * pairs + 1}").str.strip_chars() != "").fill_null(False).alias("overflow"))
        .collect()
        .lazy()
    )
    # The rows holding a non-finite value (a NaN loss) keep their text: their events quote them.
    odd = split.filter(pl.col("complete") & pl.any_horizontal(~pl.col(f"v{j}").is_finite() for j in range(pairs))).select("line")
    odd_rows = lines.join(odd, on="line", how="semi").select("line", pl.col("text").str.replace_all(ANSI, "").str.strip_chars_end())
    # One cell per key/value pair of a whole row, row by row (a stable sort of this batch's pairs
    # by line): the file's cells then come out in line order, and a run needs no sort of them.
    whole = split.filter("complete")
    cells = pl.concat(
        whole.select("line", pl.col(f"k{j}").alias("key"), pl.col(f"v{j}").alias("value")) for j in range(pairs)
    ).filter(pl.col("key").is_not_null() & (pl.col("key") != "")).sort("line", maintain_order=True)
    first = pl.col("text").str.head(1)
    base = (
        lines.filter(~first.is_in(_SKIPPED) & (pl.col("text") != ""))
        # (a progress bar's ``\r`` redraws before a line, as a terminal shows it: only what follows the last)
        .with_columns(cleaned(pl.col("text")))
        .filter(pl.col("text") != "")
        .with_columns(pl.col("text").str.head(_HEAD_CHARS).alias("head"))
        .with_columns(pl.col("head").str.contains(fmt.line_regex).alias("logged"))
        # A logger line after another writer's partial one (two processes tee'd into one log, no
        # newline between): read from where it starts, and said.
        .with_columns(pl.when(~pl.col("logged")).then(pl.col("text").str.extract(f"({fmt.line_regex.removeprefix('^')})", 1)).alias("after"))
        .with_columns(pl.col("after").is_not_null().alias("joined"))
        .with_columns(pl.coalesce("after", "text").alias("text"))
        .with_columns(pl.when("joined").then(pl.col("text").str.head(_HEAD_CHARS)).otherwise("head").alias("head"),
                      pl.col("logged") | pl.col("joined"))
        .select(
            "line",
            "text",
            "joined",
            "logged",  # a logger line, even when its time is not a date (a damaged digit): null time
            pl.when("logged").then(pl.col("head").str.extract(fmt.fields["time"], 1)).str.strptime(
                pl.Datetime("ms"), fmt.timestamp_format, strict=False).alias("time"),
            pl.when("logged").then(pl.col("head").str.extract(fmt.fields["level"], 1)).alias("level"),
        )
    )
    base = base.collect().lazy()  # one batch: read once, used by several results
    # What the assembly needs of most lines (headers, table anchors, borders, traceback markers)
    # is read here, so their text is not kept: only lines whose text is read again keep it.
    text, logged = pl.col("text"), pl.col("logged")
    border = first.is_in(["╒", "╘"])
    untimed = ~logged & ~border
    bare = (untimed & text.str.contains(fmt.any_untimed_event)) if fmt.untimed_events else pl.lit(False)
    flags = base.with_columns(
        (logged & text.str.contains(fmt.any_event)).alias("event"),
        (untimed & text.str.contains(fmt.traceback_start)).alias("start"),
        (untimed & text.str.contains(fmt.traceback_exception)).alias("exc"),
        bare.alias("bare"),  # (a library's own line among the logger's: torch's NCCL watchdog)
    ).with_columns(
        pl.when((logged & (pl.col("level").is_in(["ERROR", "CRITICAL"]) | text.str.contains(_FACT_LINES)))
                | pl.col("event") | pl.col("start") | pl.col("exc") | pl.col("bare"))
        .then(text).alias("kept")
    )
    # Kept texts are copied out: a view into the batch would pin the whole batch in memory.
    kept = pl.concat_str(pl.col("kept"), pl.lit("")).alias("text")
    timed = flags.filter(logged).select(
        "line",
        kept,
        "time",
        "level",
        "event",  # (classified batch by batch, once collected: see :func:`_classified`)
    )
    # The few logger lines that mark steps and tables, apart: as columns of every logger line,
    # their mostly empty values would cost a flood's millions of lines 40 bytes each.
    # (a header whose logger prefix is damaged, a bad byte in its level, is read by its step words)
    marks = flags.filter(logged | text.str.contains("Train step ", literal=True) | text.str.contains("(global step ", literal=True)).select(
        "line",
        "time",
        pl.when(text.str.contains("Train step ", literal=True)).then(_header_step(text, _LITE_HEADER, r"Train step (\d+)/\d+ done\.", " done.")).alias("lite_step"),
        # ``Train step g/G``: G, the steps the run was launched for (a traceback after the last is teardown).
        pl.when(text.str.contains("Train step ", literal=True)).then(text.str.extract(_LITE_HEADER, 6)).alias("planned"),
        text.str.contains("Training completes! Total time elapsed", literal=True).alias("completes"),
        pl.when(text.str.contains("(global step ", literal=True)).then(_header_step(text, _REALHF_HEADER, r"\(global step (\d+)\) finishes\.", " finishes.")).alias("realhf_step"),
        (text.str.contains(_STATS_ANCHOR) | text.str.contains(_TIME_TABLE_ANCHOR)).alias("anchor"),
        text.str.extract(_STATS_PART, 1).cast(pl.Int32, strict=False).alias("part"),
    ).filter(pl.any_horizontal(pl.col("lite_step", "planned", "realhf_step").is_not_null()) | pl.col("completes") | pl.col("anchor"))
    # Untimed lines matter as traceback starts and exceptions, and through their neighbours among
    # the untimed lines (is the traceback chained?): those, and each batch's first and last untimed
    # line (neighbours across the cut), are kept; the rest are only counted.
    traced = pl.col("start") | pl.col("exc")
    position = pl.int_range(pl.len())
    untimed_rows = (
        flags.filter(untimed)
        .filter(traced | traced.shift(1) | traced.shift(-1) | pl.col("bare") | (position == 0) | (position == pl.len() - 1))
        .select("line", kept, "start", "exc", "bare", text.str.contains(_CHAIN_MARKER).alias("chain"))
    )
    counts = pl.concat([
        # (every line, blank lines and rules too: the cache finds a line's place by counting them)
        lines.select(pl.col("line").max().alias("last")),
        # (the last line with text: a table's row or inner rule there is a table the log ends inside)
        lines.filter(pl.col("text").str.strip_chars() != "").select(pl.col("text").str.head(1).last().alias("ends_in"),
                                                                      pl.col("line").last().alias("ends_at")),
        flags.select(
            (untimed & ~pl.col("start") & ~pl.col("exc") & ~pl.col("bare") & ~text.str.contains(_TRACEBACK_CONTEXT)).sum().alias("unexplained"),
            (logged & pl.col("time").is_null()).sum().alias("undated"),
            pl.col("joined").sum().alias("joined"),
        ),
    ], how="horizontal")
    # Whole rows are kept as runs (one per table, or per part of a table cut by the batch), which
    # is all that counting the rows before the first owned table needs; cut-off rows as counts.
    tops = base.filter(first == "╒").select(pl.col("line").alias("top"))
    # Lines holding NUL bytes: pages a crash left zeroed, which may have swallowed a step's header
    # and its table's top border; rows below one are no table's above it.
    zeroed = lines.filter(pl.col("text").str.contains("\0", literal=True)).select("line")
    runs = (
        whole.select("line")
        .join_asof(pl.concat([tops, zeroed.select(pl.col("line").alias("top"))]).sort("top"),
                   left_on="line", right_on="top", strategy="backward")
        .group_by("top", maintain_order=True)
        .agg(pl.col("line").first().alias("first"), pl.len().alias("rows"))
        .select("first", "rows")
    )
    row_counts = split.select(
        pl.len().alias("rows"),
        pl.col("complete").sum().alias("whole"),
        (pl.col("complete") & pl.col("overflow")).sum().alias("overflow"),
    )
    parts = {
        "runs": runs,
        "zeroed": zeroed,
        "row_counts": row_counts,
        "cells": cells,
        "timed": timed,
        "marks": marks,
        "untimed": untimed_rows,
        "tops": tops,
        "counts": counts,
        "odd": odd_rows,
    }
    for i, pattern in enumerate(fmt.metrics):
        found = base.filter(logged & text.str.contains(pattern.literal, literal=True))
        groups = found.select("line", "time", text.str.extract_groups(pattern.regex).alias("g")).unnest("g")
        parts[f"metric{i}"] = groups.with_columns(pl.col(group).cast(pl.Float64, strict=False) for group in pattern.keys)
    return parts


def _classified(timed: pl.DataFrame, fmt: LogFormat, held: int | None) -> pl.DataFrame:
    """One batch's logger lines with the ``kind`` of those an event pattern found (only they are
    classified), their texts let go past the first ``held`` of a repeated kind."""
    at = timed["event"].arg_true()
    kinds = timed.select(fmt.classify(pl.col("text").gather(at)).alias("kind"))["kind"]
    unnamed = pl.repeat(None, timed.height, dtype=pl.String, eager=True).alias("kind")
    # (a flood's millions of lines: a name costs 4 bytes as a category, 16 as a string)
    timed = timed.drop("event").with_columns((unnamed.scatter(at, kinds) if at.len() else unnamed).cast(pl.Categorical),
                                             pl.col("level").cast(pl.Categorical))
    if held is None:
        return timed
    gone = (pl.col("kind").is_in(list(REPEATED_KINDS)) & (pl.int_range(pl.len()).over("kind") >= held)).fill_null(False)
    # The texts kept are copied out: views into the batch's texts would pin them all.
    return timed.with_columns(pl.concat_str(pl.when(~gone).then(pl.col("text")), pl.lit("")).alias("text"))


def _assemble(
    path: str, parts: dict[str, pl.DataFrame], cells: list[pl.DataFrame], lined: list[list[pl.DataFrame]], fmt: LogFormat, pairs: int
) -> AReaLLog:
    runs, row_counts, logged, untimed, counts = parts["runs"], parts["row_counts"], parts["timed"], parts["untimed"], parts["counts"]
    total_lines = int(counts["last"].max() or 0)
    tops = parts["tops"]

    marks = parts["marks"]
    headers = _headers(marks)
    damaged = int((headers["step"] == _DAMAGED).sum())
    steps = conform(headers.filter(pl.col("step") != _DAMAGED).with_columns(pl.lit(path).alias("file")), STEP_SCHEMA)
    zeroed = parts["zeroed"]
    metrics, superseded, orphans, headless, bad_values = _table_metrics(path, runs, cells, tops, marks, headers, zeroed)
    memory = _line_metrics(path, lined, fmt)
    events = pl.concat([_events(path, untimed, logged, fmt), _non_finite_rows(path, parts["odd"], logged, fmt)])  # (sorted by the caller)

    broken = int(row_counts["rows"].sum()) - int(row_counts["whole"].sum())
    notes = _ends_in_a_table(headers, marks, tops, counts["ends_in"].drop_nulls(), counts["ends_at"].max())
    notes += [
        f"{count} {what}"
        for count, what in (
            (orphans, "table rows belong to no step header (pasted or cut-off tables)"),
            (damaged, "step headers carry no readable step number (a damaged line): their tables were skipped"),
            (zeroed.height, "lines hold NUL bytes (pages left zeroed by a crash, or a torn copy): table rows below them "
                            "with no step header of their own were skipped"),
            (headless, "stats tables follow a step's own with no step header of their own (a header line lost to "
                       "damage: NUL bytes, another writer's bytes): skipped, not counted as the step above's"),
            (broken, "table rows cut off mid-row were skipped"),
            (bad_values, "table values were not numbers"),
            (int(counts["undated"].sum()), "logger lines carry a time that is no date (a damaged digit): read without a time"),
            (int(counts["joined"].sum()), "logger lines began after other output on the same line (two writers, no newline "
                                          "between): read from where they begin"),
            (int(row_counts["overflow"].sum()), f"table rows had more than {pairs} key/value pairs; the rest were skipped"),
        )
        if count
    ]
    if steps.is_empty():
        notes.append("no StatsLogger step headers")
    unexplained = int(counts["unexplained"].sum())
    return AReaLLog(
        path=path,
        steps=steps,
        metrics=pl.concat([metrics, memory]),
        events=events,
        lines=total_lines,
        unparsed_lines=unexplained + broken + damaged,
        notes=tuple(notes),
        facts=_facts(logged, marks),
        superseded=superseded,
        restart_lines=_restart_lines(logged, headers, marks, tops, untimed),
    )


def _ends_in_a_table(headers: pl.DataFrame, marks: pl.DataFrame, tops: pl.DataFrame, ends_in: pl.Series, ends_at: int | None) -> list[str]:
    """A note where the log ends inside a table (``ends_in``: its last text line's first character,
    ``ends_at`` that line), naming the step where it is the last header's (AReaL-lite prints a
    step's tables after its header); also where it ends after the last header, its table at most
    announced (``Stats (1/N):`` and the logger line the table is the message of)."""
    inside = bool(ends_in.len()) and ends_in[-1] in _INSIDE_A_TABLE
    last = headers.row(-1, named=True) if headers.height else None
    if last is None or last["era"] != "lite" or last["step"] == _DAMAGED:
        return [ENDS_INSIDE_A_TABLE] if inside else []
    table = tops["top"].max()
    if inside:
        return [_STEP_TABLE_CUT.format(step=last["step"]) if table is not None and table > last["line"] else ENDS_INSIDE_A_TABLE]
    announced = marks.filter(pl.col("part").is_not_null() & (pl.col("line") > last["line"]))["line"].max()
    if (table is None or table < last["line"]) and ends_at is not None and ends_at <= (announced or last["line"]) + 1:
        return [_STEP_TABLE_ANNOUNCED.format(step=last["step"])]
    return []


def _restart_lines(logged: pl.DataFrame, headers: pl.DataFrame, marks: pl.DataFrame, tops: pl.DataFrame,
                   untimed: pl.DataFrame) -> tuple[int, ...] | None:
    """See :attr:`AReaLLog.restart_lines`."""
    anchors = marks.filter("anchor")["line"]  # (``Stats (i/N):``, ``RPC name … returns``: a table follows)
    table, announced = tops["top"].max(), anchors.max()
    if headers.is_empty() and (table is not None or announced is not None):
        return ()  # (tables no header owns yet: whose they will be depends on the era; read it all again)
    # Lazy: a flood after the last step is millions of lines; the last few are read.
    timed = logged.lazy().filter(pl.col("time").is_not_null() & _out_of_tracebacks(logged, untimed)).select("line")
    if headers.is_empty():  # (every line is read alone; none timed: the cache's own rules)
        return _last_lines(timed) or None
    last = headers.row(-1, named=True)
    after = pl.col("line") > last["line"]
    if last["era"] == "realhf":  # its tables come before their header: a line after a header, up to the next table's announcement
        def announcing(header: int) -> pl.Expr:
            pending = anchors.filter(anchors > header).min()
            return (pl.col("line") > header) & (pl.col("line") <= pending if pending is not None else pl.lit(True))

        before = headers["line"][-2] if headers.height > 1 else 0  # (the last step's own tables: read again from them)
        return _last_lines(timed.filter(announcing(before) | announcing(last["line"])))
    # AReaL-lite's tables come after their header: the header itself, or a line after its tables
    if announced is not None and announced > max(last["line"], table or 0):
        return (last["line"],)  # (a table announced, not begun)
    return (last["line"], *_last_lines(timed.filter(after & (pl.col("line") > (table or 0)))))


def _out_of_tracebacks(logged: pl.DataFrame, untimed: pl.DataFrame) -> pl.Expr:
    """Logger lines no traceback may still be going on around: before the first traceback's start,
    or a second past the time of the last one's lines (another thread's lines interleave with a
    traceback being printed, which ends, chained or not, within milliseconds)."""
    marks = untimed.filter(pl.col("start") | pl.col("exc") | pl.col("chain"))["line"]
    if marks.is_empty():
        return pl.lit(True)
    first, last = marks.min(), marks.max()
    then = logged.lazy().filter((pl.col("line") < last) & pl.col("time").is_not_null()).select(pl.col("time").max()).collect().item()
    later = pl.col("time") >= then + timedelta(seconds=1) if then is not None else pl.lit(False)
    return (pl.col("line") < first) | ((pl.col("line") > last) & later)


def _last_lines(lines: pl.LazyFrame) -> tuple[int, ...]:
    return tuple(lines.tail(RESTART_LINES).collect()["line"])


#: The step of a header whose number is damaged (too many digits): its table is owned, then dropped.
_DAMAGED = -1


def _header_step(text: pl.Expr, header: str, step_alone: str, ending: str) -> pl.Expr:
    """The step a header line names; one damaged elsewhere (a NUL in ``Epoch``) by its step part
    alone; ``_DAMAGED`` for one that ends like a header but names no readable step: its table must
    not join the step above's."""
    digits = pl.coalesce(text.str.extract(header, 5), text.str.extract(step_alone, 1))
    damaged = digits.is_not_null() | text.str.contains(ending, literal=True)
    return pl.coalesce(step_number(digits), pl.when(damaged).then(pl.lit(_DAMAGED, pl.Int64)))


def _headers(marks: pl.DataFrame) -> pl.DataFrame:
    """Step header lines: ``step`` in log units (1-based), ``era`` telling tables' direction."""
    lite = marks.filter(pl.col("lite_step").is_not_null()).select(
        "line", "time", pl.col("lite_step").alias("step"), pl.lit("lite").alias("era")
    )
    realhf = marks.filter(pl.col("realhf_step").is_not_null()).select(
        "line", "time", pl.col("realhf_step").alias("step"), pl.lit("realhf").alias("era")
    )
    return pl.concat([lite, realhf]).sort("line")


#: How far below its ``Stats (i/N):`` line a table may start (lines of other writers between).
_TABLE_AFTER = 200


def _table_metrics(
    path: str, runs: pl.DataFrame, cells: list[pl.DataFrame], tops: pl.DataFrame, marks: pl.DataFrame, headers: pl.DataFrame,
    zeroed: pl.DataFrame,
) -> tuple[pl.DataFrame, pl.DataFrame, int, int, int]:
    """Whole table rows' cells (one frame per batch, in file order, let go as they are read)
    → (step, key, value); an attempt a relaunch abandoned is kept apart. ``runs``: the whole rows, one
    run (``first`` line, ``rows``) per table and batch; ``tops``: the tables' top borders (``top``);
    ``zeroed``: lines holding NUL bytes, below which no row is a table's above them.

    Returns the metrics, the abandoned attempts' values, the number of rows that belong to no
    step, of tables whose step header was lost, and of non-numeric values.
    """
    if runs.is_empty():
        return pl.DataFrame(schema=METRIC_SCHEMA), pl.DataFrame(schema=METRIC_SCHEMA), 0, 0, 0
    tops = tops.sort("top")
    anchors = marks.filter("anchor").select(pl.col("line").alias("anchor"), "part").sort("anchor")
    # A table belongs to the stats anchor above its top border when it is the first table after it:
    # other writers' lines may come between (the rollout thread's timeouts in a flood, ranks tee'd
    # into one log, merged.log's streams), up to a bound. AReaL-lite prints tables after their step
    # header, realhf before it (its RPCs' time stats too).
    tables = tops.join_asof(anchors, left_on="top", right_on="anchor", strategy="backward").filter(
        (pl.col("top") - pl.col("anchor") <= _TABLE_AFTER)
        & (pl.col("top").shift(1).is_null() | (pl.col("top").shift(1) < pl.col("anchor")))
    )
    by_era = {era: headers.filter(pl.col("era") == era).select(pl.col("line").alias("header"), "step", "time") for era in ("lite", "realhf")}
    owned = (
        pl.concat(
            [
                tables.join_asof(by_era["lite"], left_on="anchor", right_on="header", strategy="backward"),
                tables.join_asof(by_era["realhf"], left_on="anchor", right_on="header", strategy="forward"),
            ]
        )
        .filter(pl.col("step").is_not_null())
        .sort("top")
        .join(_current(headers), on="header", how="left")
        # (of a step's copies the run still holds, the latest: a stray damaged header's twin too)
        .with_columns(pl.col("latest") & (pl.col("header") == pl.col("header").max().over("step")))
    )
    # A step's tables count Stats (1/N) … (N/N): a (1/N) after the first under one header is the
    # next step's, whose header was lost (a NUL page, a flipped byte, another writer's bytes). It
    # and the tables after it are no step's: skipped and counted, not averaged into the step above.
    restarts = (pl.col("part") == 1) & (pl.int_range(pl.len()).over("header") > 0)
    owned = owned.with_columns(restarts.fill_null(False).cum_max().over("header").alias("headless"))
    headless = int(owned["headless"].sum())
    owned = owned.with_columns(pl.when(pl.col("headless")).then(pl.lit(_DAMAGED, pl.Int64)).otherwise("step").alias("step"))
    owners = owned.select("top", "header", "step", "time", pl.col("latest") & (pl.col("step") != _DAMAGED))
    # A stats table no header owns (yet: realhf prints a step's before its header, and a log may end
    # between them) owns nothing: its rows are not the table's above it.
    waiting = tables.join(owners, on="top", how="anti").select("top")
    breaks = zeroed.select(pl.col("line").alias("top"))
    owners = pl.concat([owners, waiting, breaks], how="diagonal").sort("top")
    # A row has an owner when an owned table starts above it, and its own table is not one waiting.
    owner_of_runs = runs.sort("first").join_asof(owners.select("top", "step"), left_on="first", right_on="top", strategy="backward")
    orphans = int(owner_of_runs.filter(pl.col("step").is_null())["rows"].sum())
    several = (owned.filter(pl.col("latest") & ~pl.col("headless")).group_by("header").len()["len"].max() or 0) > 1
    if several:  # a step's tables may straddle two batches: their cells are averaged together
        cells[:] = [pl.concat(cells)]
    out, earlier, bad = [], [], 0
    while cells:  # each batch's cells are let go once turned into rows: they never coexist with all the rows
        metrics, superseded, nulls = _owned_cells(path, cells.pop(0), owners, several)
        out.append(metrics)
        earlier.append(superseded)
        bad += nulls
    return pl.concat(out, rechunk=False), pl.concat(earlier), orphans, headless, bad


#: The events of :func:`_non_finite_rows`: a table row quoted, whatever value in it went non-finite.
NON_FINITE_ROW = (pl.col("kind") == "nan_inf") & pl.col("message").str.starts_with("│")
#: Events of lines with no time of their own (a traceback, a bare ``Killed``), dated by the logger
#: line above them: their messages are not logger lines (a flood's, left unheld, are).
DATED_ABOVE = ((pl.col("source") == load_format("areal").source) & pl.col("message").is_not_null()
               & ~pl.col("message").str.contains(load_format("areal").line_regex) & ~NON_FINITE_ROW)


def _non_finite_rows(path: str, rows: pl.DataFrame, logged: pl.DataFrame, fmt: LogFormat) -> pl.DataFrame:
    """A ``nan_inf`` event at each table row holding a non-finite value, the row its message, at
    the time of the logger line above it (the analysis keeps those of the numbers it watches)."""
    timed = logged.select(pl.col("line").alias("timed_line"), "time").sort("timed_line")
    events = rows.sort("line").join_asof(timed, left_on="line", right_on="timed_line", strategy="backward").select(
        "time", pl.lit("nan_inf").alias("kind"), pl.lit("warning").alias("severity"), "line", pl.col("text").alias("message"),
        pl.lit(fmt.source).alias("source"), pl.lit(path).alias("file"))
    return conform(events, EVENT_SCHEMA)


def _current(headers: pl.DataFrame) -> pl.DataFrame:
    """``header`` line → ``latest``: whether the step copy it heads is the run's, not one of an
    attempt a relaunch abandoned (see :func:`parsers.schema.abandoned`)."""
    step = pl.when(pl.col("step") != _DAMAGED).then(pl.col("step"))
    return headers.sort("line").select(pl.col("line").alias("header"), (~abandoned(step)).alias("latest"))


def _owned_cells(path: str, cells: pl.DataFrame, owners: pl.DataFrame, several: bool) -> tuple[pl.DataFrame, pl.DataFrame, int]:
    """One batch's cells joined to the step owning their table → metric rows of each step's
    latest copy, those of its earlier copies, and the count of non-numeric values."""
    owned = (
        cells.lazy()
        .join_asof(owners.lazy(), left_on="line", right_on="top")
        .filter(pl.col("step").is_not_null() & (pl.col("step") != _DAMAGED))
        .select("step", "time", "key", "value", pl.col("header").alias("line"), pl.col("line").alias("row"), "latest")
    )
    bad = owned.filter(pl.col("latest") & pl.col("value").is_null()).select(pl.len())
    owned = owned.filter(pl.col("value").is_not_null())

    def rows(query: pl.LazyFrame, cite_rows: bool = False) -> pl.LazyFrame:
        if several:
            # Several Stats (i/N) tables per step (PPO minibatches): one value per key, their mean.
            query = query.group_by("line", "key", maintain_order=True).agg(
                pl.col("step").first(), pl.col("time").first(), pl.col("value").mean(),
                pl.col("row").filter(~pl.col("value").is_finite()).first(),
            )
        if cite_rows:  # a non-finite value is cited at its own row, which its event quotes; the rest at the step's header
            query = query.with_columns(pl.when(pl.col("value").is_finite()).then("line").otherwise(pl.coalesce("row", "line")).alias("line"))
        query = query.with_columns(pl.lit(path).alias("file"))
        present = query.collect_schema().names()
        return query.select(
            (pl.col(name) if name in present else pl.lit(None)).cast(dtype).alias(name) for name, dtype in METRIC_SCHEMA.items()
        )

    metrics, superseded, bad_frame = pl.collect_all([rows(owned.filter("latest"), cite_rows=True), rows(owned.filter(~pl.col("latest"))), bad])
    return _aligned(metrics), superseded, int(bad_frame.item())


def _line_metrics(path: str, found: list[list[pl.DataFrame]], fmt: LogFormat) -> pl.DataFrame:
    """Metrics carried by ordinary log lines (memory), one row per value, step left to alignment.

    ``found`` holds each pattern's matches, one frame per batch; a batch's matches are let go as
    they are turned into rows, so the wide and the long form of all of them never coexist.
    """
    out = []
    while found and found[0]:
        frames = []
        for pattern, batches in zip(fmt.metrics, found, strict=True):
            lines = batches.pop(0)
            frames += [
                lines.select("time", "line", pl.lit(key).alias("key"), pl.col(group).cast(pl.Float64, strict=False).alias("value"))
                for group, key in pattern.keys.items()
            ]
        # In line order (each line's values in turn), as the table cells are.
        values = pl.concat(frames).sort("line", maintain_order=True)
        # Steps are null until alignment: a column of nulls, not a constant, which would span all
        # batches while the other columns are cut per batch (see :func:`_aligned`).
        nulls = pl.Series("step", dtype=pl.Int64).extend_constant(None, values.height)
        out.append(_aligned(conform(values.with_columns(nulls, pl.lit(path).alias("file")), METRIC_SCHEMA)))
    # (An empty frame first would turn the constant ``file`` and ``source`` into full columns.)
    return pl.concat(out, rechunk=False) if out else pl.DataFrame(schema=METRIC_SCHEMA)


def _aligned(piece: pl.DataFrame) -> pl.DataFrame:
    """One batch's metric rows with every column in one piece. Concatenated, the run's columns
    are then cut alike: Polars copies a frame whose columns are cut differently whole, at the
    next ``select`` or ``with_columns`` (the run loader's), and a long run's metrics are ~100 MB."""
    return piece.rechunk()


def _events(path: str, untimed: pl.DataFrame, logged: pl.DataFrame, fmt: LogFormat) -> pl.DataFrame:
    """Logger lines of known kinds, unrecognised errors, and uncaught tracebacks (the logger
    lines first, then the others: see :func:`read_areal_log`)."""
    # (the lines an event pattern found were classified batch by batch: see :func:`_classified`)
    is_error = pl.col("level").is_in(["ERROR", "CRITICAL"])
    # (lazy: a flood's millions of event lines are copied once, into the events)
    named = logged.lazy().filter(pl.col("kind").is_not_null() | is_error).with_columns(
        pl.col("kind").fill_null("log_error")
    ).with_columns(fmt.severity_of(pl.col("kind"), pl.col("level")).cast(pl.Categorical).alias("severity"))
    # The logger lines' times, for the lines between them (in line order already: batches are in file order).
    clock = logged.select(pl.col("line").alias("timed_line"), "time").set_sorted("timed_line")

    # A chained traceback is one event; its kind comes from the exception at its very end.
    untimed = untimed.sort("line").with_columns(
        pl.col("chain").shift(1, fill_value=False).alias("chained"), pl.col("chain").shift(-1, fill_value=False).alias("continues")
    )
    starts = untimed.filter(pl.col("start") & ~pl.col("chained"))
    exceptions = untimed.filter(pl.col("exc") & ~pl.col("continues")).select(
        pl.col("line").alias("exc_line"), pl.col("text").alias("exc_text")
    )
    firsts = untimed.filter("exc").select(pl.col("line").alias("first_line"), pl.col("text").alias("first_exc"))
    # ``logger.exception``: an error line, then its traceback — one failure, one event: the line
    # when it is of a known kind, else the traceback (its exception says what failed: a ``cuda_oom``,
    # or a RuntimeError a run that went no further died of).
    errors_at = named.filter(is_error).select(
        (pl.col("line") + 1).alias("line"), (pl.col("kind") != "log_error").alias("told"), pl.col("text").alias("said")).collect()
    # (a traceback cut off before its exception line, the next one's start after it, has none: not the next one's)
    mine = pl.col("next_start").is_null() | (pl.col("exc_line") < pl.col("next_start"))
    tracebacks = (
        starts.with_columns(pl.col("line").shift(-1).alias("next_start"))
        .join_asof(exceptions, left_on="line", right_on="exc_line", strategy="forward")
        .join_asof(firsts, left_on="line", right_on="first_line", strategy="forward")
        .with_columns(pl.when(mine).then(pl.col(name)).alias(name) for name in ("exc_line", "exc_text", "first_exc"))
        .join_asof(clock, left_on="line", right_on="timed_line", strategy="backward")
        .with_columns(fmt.traceback_kind(pl.col("exc_text").fill_null("")).alias("end_kind"))
        .with_columns(fmt.chain_kind(pl.col("first_exc"), pl.col("end_kind")).alias("kind"))
        .join(errors_at, on="line", how="left", maintain_order="left")
        .filter(~pl.col("told").fill_null(False))
        .with_columns(
            pl.lit("error").alias("severity"),
            # (an untyped one is told by the error line, with what it raised, and cited there)
            traceback_message(pl.when(pl.col("kind") == "traceback").then(pl.coalesce("said", "text")).otherwise("text"),
                              pl.col("first_exc"), pl.col("exc_text"),
                              pl.col("kind") != pl.col("end_kind")).alias("message"),  # (the root's kind: named too)
            pl.when((pl.col("kind") == "traceback") & pl.col("said").is_not_null()).then(pl.col("line") - 1).otherwise("line").alias("cited"),
        )
    )
    named = named.filter((pl.col("kind") != "log_error") | ~(pl.col("line") + 1).is_in(tracebacks["line"].implode()))
    # A library's own lines (torch's NCCL watchdog on stderr): the time of the logger line above them;
    # a traceback's own exception line is the traceback's event, not one of its own.
    bare = (
        untimed.filter(pl.col("bare") & ~pl.col("line").is_in(tracebacks["exc_line"].drop_nulls().implode()))
        .join_asof(clock, left_on="line", right_on="timed_line", strategy="backward")
        .with_columns(pl.coalesce(_glog_time(pl.col("text"), pl.col("time")), "time").alias("time"),
                      fmt.classify(pl.col("text"), untimed=True).alias("kind"))
        .with_columns(pl.col("kind").replace_strict({p.kind: p.severity for p in fmt.untimed_events}, default="error").alias("severity"))
    )
    events = pl.concat(
        [
            named.select("time", "kind", "severity", "line", pl.col("text").alias("message")),
            tracebacks.lazy().select("time", *_as_categories("kind", "severity"), pl.col("cited").alias("line"), "message"),
            bare.lazy().select("time", *_as_categories("kind", "severity"), "line", pl.col("text").alias("message")),
        ]
    ).with_columns(pl.lit(fmt.source, pl.Categorical).alias("source"), pl.lit(path, pl.Categorical).alias("file"))
    return conform(events.collect(), EVENT_SCHEMA)


def _as_categories(*columns: str) -> list[pl.Expr]:
    """Names as categories, as a flood's are from the start (see :func:`_classified`)."""
    return [pl.col(c).cast(pl.Categorical) for c in columns]


#: What a table's rows and inner rules begin with (its top border too: a table with no row yet).
_INSIDE_A_TABLE = ("│", "├", "╞", "╒")


#: glog's prefix, as torch's C++ logs it: ``[E1201 11:36:35.394775308 …`` (month, day, time; no year).
_GLOG = r"^(?:\[rank\d+\]:)?\[[EWIF](\d{2})(\d{2}) (\d{2}:\d{2}:\d{2})(?:\.(\d{1,6}))?"


def _glog_time(text: pl.Expr, near: pl.Expr) -> pl.Expr:
    """A glog line's own time, in the year of ``near`` (the logger line above it); null if none."""
    parts = text.str.extract_groups(_GLOG)
    stamp = pl.concat_str(near.dt.year().cast(pl.String), parts.struct[0], parts.struct[1], pl.lit(" "), parts.struct[2],
                          pl.lit("."), parts.struct[3].fill_null("0").str.pad_end(6, "0"))
    return stamp.str.strptime(pl.Datetime("ms"), "%Y%m%d %H:%M:%S%.f", strict=False)


_FACTS = {
    "launch_command": r"Starting local process with command: (.*?\btee -a \S*trainer\.log)",
    "experiment_name": r"experiment_name=([^,\s]+)",
    "trial_name": r"trial_name=([^,\s]+)",
    "fileroot": r"fileroot=([^,\s]+)",
    "server_addrs": r"AREAL_LLM_SERVER_ADDRS=(\S+)",
}


def _facts(logged: pl.DataFrame, marks: pl.DataFrame) -> dict[str, str]:
    """Launcher facts worth knowing later (the command that started the trainer, names)."""
    launcher = logged.filter(pl.col("text").str.contains(r"Launcher|Local Scheduler|LocalScheduler", literal=False))
    facts = {}
    for name, regex in _FACTS.items():
        found = launcher.select(pl.col("text").str.extract(regex, 1)).drop_nulls().to_series()
        if len(found):
            facts[name] = str(found[-1])
    planned = marks["planned"].drop_nulls()
    if len(planned):
        facts["total_training_steps"] = str(planned[-1])
    if marks["completes"].any():  # StatsLogger.close: the run ended as launched, whatever came after
        facts["training_completed"] = "yes"
    return facts
