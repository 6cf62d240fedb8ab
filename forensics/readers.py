"""The readers a run's sources are parsed by, as one table: what each is called, how it reads a
file into a :class:`~forensics.parsed.Parsed`, and what the run loader and the parse cache must
know of it. Adding a reader means adding one row here (and the kinds of source it reads).

Example:
    >>> parsed = READERS["sglang"].read(Path("llm_server.log"), None, None)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import polars as pl

from forensics.cache import Splice
from forensics.model import SourceReport
from forensics.parsed import Parsed
from parsers import areal, sglang, verl
from parsers._lines import stream_damage
from parsers.custom import CustomFormat, read_custom_log
from parsers.ray import read_ray_session
from parsers.schema import EVENT_SCHEMA, HELD_MESSAGES, METRIC_SCHEMA, STEP_SCHEMA, conform, empty, with_keys
from parsers.tensorboard import read_tensorboard
from parsers.trl_state import read_trainer_state
from parsers.verl import read_verl_log
from parsers.wandb_run import chain_wandb_runs, read_wandb_runs

#: A reader's parse: the file, the metric keys to keep (a regex; ``None``: all), a user's log format.
Read = Callable[[Path, str | None, CustomFormat | None], Parsed]


@dataclass(frozen=True)
class Reader:
    """One reader: its parse and the facts about it the loader and the cache go by."""

    name: str
    read: Read
    filters_keys: bool = False
    """It drops unwanted metric keys as it reads (the bulk of its rows); the others' are filtered after."""
    lineage: bool = False
    """A step log a relaunch appends to, listing every copy of a step: a later copy going back to a
    step abandons the attempt before it from there on (see :func:`parsers.schema.abandoned`)."""
    copies: bool = False
    """It reads copies of a run's numbers (W&B, TensorBoard), not a step log of its own."""
    splice: Splice | None = None
    """How a grown log is parsed from a cut and joined to the old parse; ``None``: parsed afresh."""


def _areal(path: Path, keys: str | None, _: CustomFormat | None) -> Parsed:
    log = areal.read_areal_log(path, keys=keys, held=HELD_MESSAGES)
    return Parsed("areal", log.steps, log.metrics, log.events, log.lines, log.unparsed_lines, log.notes, log.facts,
                  superseded=log.superseded, restart_lines=log.restart_lines, reading=log.reading)


def _sglang(path: Path, keys: str | None, _: CustomFormat | None) -> Parsed:
    server = sglang.read_sglang_log(path, stats_per_minute=True, keys=keys)
    http = server.http.select(
        pl.col("minute").alias("time"),
        pl.format("sglang/http/{}/{}", pl.col("endpoint").str.strip_prefix("/"), pl.col("status")).alias("key"),
        pl.col("count").cast(pl.Float64).alias("value"),
        pl.lit(str(path)).alias("file"),
        pl.col("first_line").alias("line"),
    )
    notes = server.notes
    if server.servers.height > 1:
        notes += (f"{server.servers.height} server instances in this log (launches or restarts)",)
    # In time order, as the run's frames are kept (the values have no step yet); the counts of
    # endpoints no analysis reads are dropped first (a long log has one or more a minute).
    metrics = pl.concat([server.metrics, with_keys(conform(http, METRIC_SCHEMA), keys)]).sort("time", nulls_last=True, maintain_order=True)
    return Parsed("sglang", empty(STEP_SCHEMA), metrics, server.events, server.lines, server.unparsed_lines, notes,
                  restart_lines=server.restart_lines)


def _custom(path: Path, _: str | None, custom_format: CustomFormat | None) -> Parsed:
    loop = read_custom_log(path, custom_format)
    return Parsed("custom", loop.steps, loop.metrics, loop.events, loop.lines, loop.unparsed_lines, loop.notes,
                  superseded=loop.superseded)


def _verl(name: str) -> Read:
    def read(path: Path, keys: str | None, _: CustomFormat | None) -> Parsed:
        log = read_verl_log(path, keys=keys)
        steps = log.steps if name == "verl" else empty(STEP_SCHEMA)  # (a JSONL file's steps are its values')
        return Parsed(name, steps, log.metrics, conform(log.events, EVENT_SCHEMA), log.lines, log.unparsed_lines,
                      log.notes, log.facts, superseded=log.superseded)
    return read


def _console(path: Path, _: str | None, __: CustomFormat | None) -> Parsed:
    """Ray's and torch's failures in a console log verl did not write: verl's reader, Ray's events."""
    log = read_verl_log(path)
    events = log.events.with_columns(pl.col("source").replace({"verl": "ray"}))
    return Parsed("console", empty(STEP_SCHEMA), empty(METRIC_SCHEMA), conform(events, EVENT_SCHEMA), log.lines,
                  log.unparsed_lines, tuple(n for n in log.notes if not n.startswith("no verl step")))


def _ray(path: Path, _: str | None, __: CustomFormat | None) -> Parsed:
    session = read_ray_session(path)
    reports = tuple(SourceReport(r.path, r.kind, r.lines, r.unparsed_lines, r.notes) for r in session.sources)
    facts = {"ray_session_started": session.started.isoformat()} if session.started else {}
    return Parsed("ray", empty(STEP_SCHEMA), empty(METRIC_SCHEMA), conform(session.events, EVENT_SCHEMA),
                  sum(r.lines for r in reports), sum(r.unparsed_lines for r in reports), session.notes, facts, reports)


def _wandb(path: Path, keys: str | None, _: CustomFormat | None) -> Parsed:
    chained = chain_wandb_runs(read_wandb_runs(path, keys=keys, summary=False))  # the summary is never read here
    if chained is None:
        return Parsed("wandb", empty(STEP_SCHEMA), empty(METRIC_SCHEMA), empty(EVENT_SCHEMA), 0, 0, ())
    return Parsed("wandb", empty(STEP_SCHEMA), chained.metrics, empty(EVENT_SCHEMA), chained.records_read,
                  chained.records_skipped, chained.notes, superseded=chained.superseded)


def _trl_state(path: Path, _: str | None, __: CustomFormat | None) -> Parsed:
    state = read_trainer_state(path)
    return Parsed("trl_state", empty(STEP_SCHEMA), state.metrics, empty(EVENT_SCHEMA), state.lines, state.unparsed_lines, state.notes)


def _tensorboard(path: Path, keys: str | None, _: CustomFormat | None) -> Parsed:
    board = read_tensorboard(path, keys=keys)
    return Parsed("tensorboard", empty(STEP_SCHEMA), board.metrics, empty(EVENT_SCHEMA), board.records_read,
                  board.records_skipped, board.notes, superseded=board.superseded)


#: The server log's stats and access counts are folded per minute (in blocks of lines), and it
#: counts its launches over the whole file: see :class:`~forensics.cache.Splice`.
_SERVER_LOG = Splice(aligned_lines=sglang.ALIGNED_LINES, minute_folds=True, record_keys=sglang.record_keys(),
                     whole_file_kinds=frozenset({"server_launch"}), restart_lines_kept=sglang.RESTART_MINUTES)

READERS: dict[str, Reader] = {r.name: r for r in (
    Reader("areal", _areal, filters_keys=True, lineage=True,
           splice=Splice(later_copy="header", restart_lines_kept=areal.RESTART_LINES, end_notes=areal.END_NOTES)),
    Reader("sglang", _sglang, filters_keys=True, splice=_SERVER_LOG),
    Reader("verl", _verl("verl"), filters_keys=True, lineage=True,
           splice=Splice(later_copy="lineage", first_facts=True, later_facts=verl.LATER_FACTS)),
    Reader("custom", _custom, lineage=True, splice=Splice(later_copy="lineage")),
    Reader("console", _console),
    Reader("ray", _ray),
    Reader("wandb", _wandb, filters_keys=True, copies=True),
    Reader("tensorboard", _tensorboard, filters_keys=True, copies=True),
    Reader("verl_jsonl", _verl("verl_jsonl"), filters_keys=True, copies=True, splice=Splice(later_copy="key")),
    Reader("trl_state", _trl_state, copies=True),
)}

#: Which readers read each kind of source. ``llm_server.log`` interleaves AReaL's wrapper lines
#: with SGLang's own output, so both read it.
SOURCE_READERS: dict[str, tuple[str, ...]] = {
    "areal_trainer": ("areal",),
    "areal_log": ("sglang", "areal"),  # a realhf worker's or merged log may carry the server's own lines too
    "areal_server": ("sglang",),  # the SGLang parser reads the wrapper lines with AReaL's patterns
    "sglang_server": ("sglang",),
    "custom_log": ("custom",),
    "wandb": ("wandb",),
    "tensorboard": ("tensorboard",),
    "verl_log": ("verl",),
    "console_log": ("console",),
    "verl_jsonl": ("verl_jsonl",),
    "ray_session": ("ray",),
    "trl_state": ("trl_state",),
}

#: Readers of copies of a run's numbers (no step log of their own).
COPY_SOURCES = tuple(r.name for r in READERS.values() if r.copies)
#: Readers of step logs a relaunch appends to (see :attr:`Reader.lineage`).
LINEAGE = tuple(r.name for r in READERS.values() if r.lineage)


def read(reader: str, path: Path, custom_format: CustomFormat | None = None, keys: str | None = None) -> Parsed:
    """``path`` parsed by ``reader`` (a filtering one keeping the metric keys ``keys`` finds
    something in), with a note where a torn or corrupt ``.gz`` read as a shorter log."""
    parsed = READERS[reader].read(path, keys, custom_format)
    damage = stream_damage(path)
    return replace(parsed, notes=(*parsed.notes, damage)) if damage else parsed
