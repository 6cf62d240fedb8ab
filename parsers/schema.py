"""The frames every parser returns: their columns and dtypes.

These schemas are the seam between ``parsers`` (files → frames) and ``forensics``
(frames → analysis). Times are naive local wall-clock datetimes, as the logs print them.
"""

from __future__ import annotations

import re
from itertools import accumulate

import polars as pl

#: One row per event (a failure or a bookkeeping line that matters for the timeline).
#: ``source``, ``kind``, ``severity`` and ``file`` are categorical, as in :data:`METRIC_SCHEMA`: a
#: dead server's retries log millions of events with the same few names; exports write strings.
EVENT_SCHEMA: dict[str, pl.DataType] = {
    "time": pl.Datetime("ms"),
    "step": pl.Int64(),
    "source": pl.Categorical(),
    "kind": pl.Categorical(),
    "severity": pl.Categorical(),
    "file": pl.Categorical(),
    "line": pl.Int64(),
    "message": pl.String(),
}

#: The kinds a dead or overloaded server makes a client log over and over (each retry of each
#: request): a flood of millions. Past the first :data:`HELD_MESSAGES` of a kind in a batch of
#: lines, a reader may leave such an event's ``message`` null, where it is the line itself
#: (:func:`parsers._lines.cleaned`): it is read back from ``file`` and ``line`` when it is cited
#: or exported (:func:`parsers._lines.lines_at`). Counts, steps and times are all kept.
REPEATED_KINDS = frozenset({"request_timeout", "connection_refused", "connection_reset", "retries_exhausted",
                            "request_rejected", "workflow_failed"})
HELD_MESSAGES = 200

#: Long form, one row per value. NaN and ±Inf are kept as such. ``source`` is set by the
#: run loader from the parser that read the file (``areal``, ``sglang``, …).
#: ``key``, ``file`` and ``source`` repeat a few names over millions of rows: they are categorical
#: (4 bytes a row instead of a 16-byte string view and the key's bytes); exports write strings.
METRIC_SCHEMA: dict[str, pl.DataType] = {
    "step": pl.Int64(),
    "time": pl.Datetime("ms"),
    "key": pl.Categorical(),
    "value": pl.Float64(),
    "file": pl.Categorical(),
    "line": pl.Int64(),
    "source": pl.Categorical(),
}

#: One row per logged training step: when its header was written, and where.
STEP_SCHEMA: dict[str, pl.DataType] = {
    "step": pl.Int64(),
    "time": pl.Datetime("ms"),
    "file": pl.String(),
    "line": pl.Int64(),
}


#: One row per saved checkpoint folder, its step in log units.
#: The problem of a checkpoint folder a reader could not list (its row has no step).
UNLISTED = "cannot be listed"
#: The problem of a DCP checkpoint a shard of which was written after its ``.metadata`` (written
#: last): a later save, cut short, overwrote part of it. Judged by file times, which a copy resets:
#: the analysis drops it where the times are not the saves' (see ``forensics.analysis``).
REWRITTEN = "written after its .metadata"

CHECKPOINT_SCHEMA: dict[str, pl.DataType] = {
    "path": pl.String(),
    "step": pl.Int64(),
    "kind": pl.String(),
    "role": pl.String(),
    "complete": pl.Boolean(),
    "resumable": pl.Boolean(),
    "time": pl.Datetime("ms"),
    "problems": pl.List(pl.String()),
}


#: No run logs a quadrillion steps: a larger number where a step should be is a damaged line.
MAX_STEP = 10**15 - 1


def step_number(digits: pl.Expr) -> pl.Expr:
    """``digits`` read as a step: null, never an error, when they are not one (too many digits)."""
    step = digits.cast(pl.Int64, strict=False)
    return pl.when(step <= MAX_STEP).then(step)


def abandoned(step: pl.Expr) -> pl.Expr:
    """Over step copies in the order they were logged: whether a later copy goes back to this
    step or before it (a relaunch resumed from an earlier checkpoint), which abandons the attempt
    from there on — re-logged or not. Null steps (damaged numbers) are passed over, and so is a
    lone copy below the one before that the next does not follow on from (a digit lost from one
    header, ``Train step 10/`` between 99 and 101): a relaunch logs on from where it went back."""
    later = pl.when(~_stray(step)).then(step).reverse().cum_min().forward_fill().reverse().shift(-1)
    return (step >= later).fill_null(False)


def relaunches(step: pl.Expr) -> pl.Expr:
    """Over step copies in the order they were logged: whether a copy starts an attempt — it goes
    back to or below the one before it, and is no lone stray (see :func:`abandoned`)."""
    return ((step <= step.shift(1)) & ~_stray(step)).fill_null(False)


def _stray(step: pl.Expr) -> pl.Expr:
    nxt = step.shift(-1)
    return ((step <= step.shift(1)) & nxt.is_not_null() & (nxt != step + 1)).fill_null(False)


def abandoned_by_later_parts(rows: pl.DataFrame, part: str, within: str = "key") -> pl.Series:
    """Over the metric rows of a run written in parts (``part``: their order; a W&B run's resumed
    folders, a TensorBoard folder's event files, a log's rotated files): whether a later part of the
    same ``within`` group (a key; a log's stream) goes back to the row's step or before it —
    :func:`abandoned` with each part as one attempt, its steps rising.

    This is TensorBoard's own rule (it purges a tag's events from the step a restart went back to)
    and what a relaunch from an earlier checkpoint does: the attempt is abandoned from there on,
    whether or not the later part got as far.
    """
    spans = rows.group_by(part, within).agg(pl.col("step").min().alias("lowest"), pl.col("step").max().alias("highest"))
    later = pl.col("lowest").cum_min(reverse=True).backward_fill().shift(-1)  # (a part with no step passed over)
    back = spans.sort(part).with_columns(later.over(within).alias("back"))
    back = back.filter(pl.col("highest") >= pl.col("back")).select(part, within, "back")
    if back.is_empty():  # (no part goes back: nothing to join)
        return pl.repeat(False, rows.height, dtype=pl.Boolean, eager=True).alias("abandoned")
    joined = rows.select(part, within, "step").join(back, on=[part, within], how="left", maintain_order="left")
    return joined.select((pl.col("step") >= pl.col("back")).fill_null(False).alias("abandoned")).to_series()


#: A compressed log's suffixes: what logrotate's ``compresscmd`` may add; and as a regex.
COMPRESSIONS = (".gz", ".xz", ".bz2", ".zst")
COMPRESSED = "(?:" + "|".join(re.escape(z) for z in COMPRESSIONS) + ")"
#: The end of a rotated log's name: logrotate's number (``.1``) or date (``dateext``: ``-20251111``,
#: ``-2025111117``, ``-20251111-1762900000``), Python's ``TimedRotatingFileHandler``'s date
#: (``.2025-11-11``, ``.2025-11-11_17``, ``_17-05``, ``_17-05-00``), or ``.old``; then compression.
ROTATED = (r"(?:\.(?P<rot>\d+)|-(?P<date>\d{8}(?:\d{2})?(?:-\d+)?)"
           r"|\.(?P<timed>\d{4}-\d{2}-\d{2}(?:_\d{2}(?:-\d{2}){0,2})?)|(?P<old>\.old))?" + COMPRESSED + "?$")


def stream_of(file: pl.Expr) -> pl.Expr:
    """A log's name without a rotation's number or date or compression: ``trainer.log.2.gz`` and
    ``trainer.log-20251111.gz`` → ``trainer.log``. Only a log's own rotated parts are one run's
    attempts in order; two logs side by side are not."""
    return file.cast(pl.String).str.replace(ROTATED, "")


_CTRL_C = r"^\s*(?:\[rank\d+\]: )?KeyboardInterrupt\b"


def traceback_message(start: pl.Expr, first: pl.Expr, last: pl.Expr, root: pl.Expr | None = None) -> pl.Expr:
    """A traceback event's message: its first line, then its exception (the chain's last, ``…``
    between). A Ctrl-C in a chain is named before what followed it (a run stopped by hand, or
    one that raised and then hung until someone pressed it): the first exception too, then; and
    so is the first where ``root`` says the event's kind is its (see ``LogFormat.chain_kind``)."""
    named_first = first.str.contains(_CTRL_C).fill_null(False) != last.str.contains(_CTRL_C).fill_null(False)
    if root is not None:
        named_first = named_first | (root.fill_null(False) & (first != last).fill_null(False))
    return pl.concat_str(
        start,
        pl.when(named_first).then(pl.lit(" … ") + first).otherwise(pl.lit("")),
        pl.lit(" … "),
        last.fill_null("(no exception line)"),
    )


def empty(schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """An empty frame with ``schema``."""
    return pl.DataFrame(schema=schema)


def conform(frame: pl.DataFrame, schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """``frame`` with exactly the columns of ``schema``, in order, cast; missing ones null."""
    return frame.select(
        (pl.col(name) if name in frame.columns else pl.lit(None)).cast(dtype).alias(name)
        for name, dtype in schema.items()
    )


def with_keys(frame: pl.DataFrame, regex: str | None) -> pl.DataFrame:
    """The rows of a metric frame whose ``key`` ``regex`` finds something in (all for ``None``)."""
    kept = keys_kept(frame, regex)
    return frame if kept is None else frame.filter(pl.col("key").is_in(kept))


def keys_kept(frame: pl.DataFrame, regex: str | None) -> list[str] | None:
    """The keys of ``frame`` that ``regex`` finds something in; ``None`` when it finds all of them.

    The regex runs on the distinct keys, a few dozen, never on every row.
    """
    if regex is None or frame.is_empty():
        return None
    pattern = re.compile(regex)
    names = frame["key"].unique().drop_nulls().cast(pl.String).to_list()
    kept = [name for name in names if pattern.search(name)]
    return None if len(kept) == len(names) else kept


def later_lines_win(values: pl.DataFrame, repeated: pl.Series) -> pl.DataFrame:
    """Metric rows (with ``line``) where each key of a ``repeated`` step (one logged on more than
    one line: a restarted run appending) keeps only its latest line's value; in line order, or as
    given when no step was repeated.

    Only those steps' rows are deduplicated: a unique over every row of a long run costs gigabytes.
    """
    if repeated.is_empty():
        return values
    twice = pl.col("step").is_in(repeated.implode())
    latest = values.filter(twice).sort("line", maintain_order=True).unique(["step", "key"], keep="last", maintain_order=True)
    return pl.concat([values.filter(~twice), latest]).sort("line", maintain_order=True)


def in_order(frame: pl.DataFrame, column: str) -> pl.DataFrame:
    """``frame`` sorted by ``column``, ties in their order; frames kept in file or time order
    usually are already, and are then neither sorted nor copied."""
    return frame if frame[column].is_sorted() else frame.sort(column, maintain_order=True)


def sort_in_place(frame: pl.DataFrame, column: str) -> None:
    """:func:`in_order`, in place: a frame of millions of events that nothing else holds is never
    held twice (see :func:`gather_in_place`)."""
    if not frame[column].is_sorted():
        gather_in_place(frame, frame.select(pl.arg_sort_by(column, maintain_order=True)).to_series())


def gather_in_place(frame: pl.DataFrame, order: pl.Series) -> None:
    """Put ``frame``'s rows in ``order`` (row indices), a column at a time: each old column is let
    go as its reordered copy replaces it, unless something else holds it. Each is put in one chunk
    first: a text column gathered from several chunks has every text copied; from one, only its views."""
    for i, name in enumerate(frame.columns):
        frame.replace_column(i, frame[name].rechunk().gather(order))


def cut_alike(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with every column cut into chunks at the same rows, without copying a value.

    Polars copies a frame whose columns are cut differently whole at its next eager ``filter``,
    ``select`` or ``with_columns``; concatenated sources leave them so (a constant column, such as
    ``file``, in one chunk per source). Each column is re-cut at every column's boundaries: slices.
    """
    columns = frame.get_columns()
    if len({tuple(column.chunk_lengths()) for column in columns}) <= 1:
        return frame
    ends = sorted({end for column in columns for end in accumulate(column.chunk_lengths())})
    starts = [0, *ends[:-1]]
    return pl.DataFrame(
        [pl.concat([column.slice(a, b - a) for a, b in zip(starts, ends)], rechunk=False) for column in columns]
    )
