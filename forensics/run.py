"""A run's frames, gathered from all of its sources and put on one step/time axis."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl

from forensics.align import (
    assign_steps,
    exit_offset,
    exit_skew,
    into_dying_attempts,
    past_their_headers,
    reconstruct_times,
    relaunch_gaps,
    server_zone,
    step_clock,
    zone_offset,
)
from forensics.allocator import hand_back_heap
from forensics.cache import ParseCache
from forensics.detect import keys_matching, launches, server_named
from forensics.discover import LEFT_BESIDE, UTF16_NOTE, LogSource, RunLocation, not_utf8, shown_name, utf16
from forensics.errors import UnusableInput
from forensics.fingerprint import fingerprint
from forensics.merge import StepUnits, areal_copy_units, merge_sources, per_log_step, step_units
from forensics.model import SourceReport
from forensics.parsed import Parsed
from forensics.parts import OpenTable, open_table, tables_across_parts
from forensics.readers import COPY_SOURCES, LINEAGE, READERS, SOURCE_READERS, read
from parsers._formats import load_format
from parsers.areal_checkpoints import read_areal_checkpoints
from parsers.areal_config import read_areal_config
from parsers.custom import CustomFormat
from parsers.schema import (
    CHECKPOINT_SCHEMA,
    COMPRESSIONS,
    EVENT_SCHEMA,
    METRIC_SCHEMA,
    STEP_SCHEMA,
    abandoned,
    abandoned_by_later_parts,
    cut_alike,
    empty,
    gather_in_place,
    relaunches,
    stream_of,
    with_keys,
)
from parsers.sglang import MTIME_DATED
from parsers.trl_checkpoints import is_trl_checkpoint_root, read_trl_checkpoints
from parsers.verl import first_fact
from parsers.verl_checkpoints import is_verl_checkpoint_root, read_verl_checkpoints
from parsers.wandb_run import WandbUnavailable, read_wandb_online


@dataclass
class RunData:
    """Everything parsed for one run, before any judgement."""

    location: RunLocation
    steps: pl.DataFrame
    metrics: pl.DataFrame
    events: pl.DataFrame
    checkpoints: pl.DataFrame
    sources: list[SourceReport]
    facts: dict[str, str] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    """The run's dumped ``config.yaml``, flattened, when it is next to the logs."""
    series_sources: dict[str, str] = field(default_factory=dict)
    """For series found in several copies, the copy each was taken from."""
    notes: list[str] = field(default_factory=list)
    estimated_step_times: bool = False
    """Step times are the Ray session's start plus the summed step durations (the log has none):
    late by however long the run took to start."""
    superseded: pl.DataFrame = field(default_factory=lambda: empty(METRIC_SCHEMA))
    """Table values of attempts a relaunch abandoned (from the step it went back to on), kept
    apart from ``metrics``, which holds the run's own."""
    superseded_steps: pl.DataFrame = field(default_factory=lambda: empty(STEP_SCHEMA))
    """The step rows of those attempts."""
    save_folder_named: Path | None = None
    """Where a log said the run saves its checkpoints, outside the folders found beside it: looked
    in whether or not it held any (it may be mounted, or synced, later)."""

    @property
    def step_copies(self) -> pl.DataFrame:
        """Every copy of every step logged: the run's own and those of attempts it abandoned."""
        return pl.concat([self.steps, self.superseded_steps]) if self.superseded_steps.height else self.steps


def load_run(
    location: RunLocation,
    *,
    custom_format: CustomFormat | None = None,
    cache: ParseCache | None = None,
    keys: str | None = None,
) -> RunData:
    """Parse every source of ``location``; a file that cannot be read becomes a note, not an error.

    With a ``cache``, unchanged sources are read from it and grown logs parsed only where they grew.
    ``keys`` (a regex, e.g. :data:`forensics.keys.ANALYSIS_KEYS`) keeps only the metrics whose key
    it finds something in; ``None`` keeps all.
    """
    if (bad := not_utf8(location)) is not None:
        raise UnusableInput(f"{shown_name(str(bad))}: the name is not valid UTF-8, which the tool's tables cannot hold; "
                            "rename it (e.g. convmv -f latin1 -t utf8 -r --notest)")
    steps, events, sources = [], [], []
    metrics: dict[str, list[tuple[int, pl.DataFrame]]] = {}
    abandoned: dict[str, list[pl.DataFrame]] = {}  # per parser, the rows of attempts a relaunch abandoned
    facts: dict[str, str] = {}
    sessions: dict[int, datetime | None] = {}  # each Ray session's events (their index) and its start, as read
    open_tables: dict[int, OpenTable] = {}  # a part's last table, which a rotation may have cut
    for rank, source in enumerate(location.logs):
        try:
            parsed = parse_source(source, custom_format=custom_format, cache=cache, keys=keys)
        except (OSError, pl.exceptions.PolarsError, ValueError) as exc:
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]  # Polars' errors run to many lines
            sources.append(SourceReport(str(source.path), source.kind, 0, 0, (f"not read: {reason}",)))
            continue
        sources.extend(_coverage(source, parsed))
        for p in parsed:
            steps.append(p.steps.with_columns(pl.lit(rank).alias("rank"), pl.lit(p.source in LINEAGE).alias("lineage")))
            # Every parse's rows are filtered here (the filtering readers' bulk already is, as they read;
            # SGLang's HTTP counts become metrics only in ``forensics.readers``): a pass over distinct keys.
            metrics.setdefault(p.source, []).append((rank, with_keys(p.metrics, keys)))
            if p.superseded.height:
                abandoned.setdefault(p.source, []).append(with_keys(p.superseded, keys))
            facts.update(p.facts)
            if p.source == "areal" and (table := open_table(p.steps, p.notes, p.source)) is not None:
                open_tables[rank] = table
            if p.source == "ray":
                started = p.facts.get("ray_session_started")
                sessions[len(events)] = datetime.fromisoformat(started) if started else None
        events.append(_one_event_a_line([p.events for p in reversed(parsed)]))
    parsed = p = None  # (the last source's frames, let go: the events' sort frees each column as it replaces it)
    for problem in location.skipped:
        path, _, why = problem.partition(": ")
        sources.append(SourceReport(path, "not_given" if why.startswith(LEFT_BESIDE) else "unreadable", 0, 0, (problem,)))
    for twin in location.twins:
        said = (f"a compressed copy of {twin.stem} beside it: read once, from {twin.stem}" if twin.suffix in COMPRESSIONS
                else "its gzipped copy beside it holds more: read from that, not from this")
        sources.append(SourceReport(str(twin), "copy", 0, 0, (said,)))
    hand_back_heap()

    sources = tables_across_parts(location.logs, open_tables, metrics, sources, keys)
    latest = {}
    for name in list(metrics):  # each parser's frames are let go as soon as they are merged
        latest[name], older = _latest_copy(metrics.pop(name), lineage=name in LINEAGE)
        abandoned.setdefault(name, []).append(older)
    shifted, shifts, units = _in_log_units(latest)
    del latest
    all_steps = pl.concat(steps) if steps else empty(STEP_SCHEMA).with_columns(pl.lit(0).alias("rank"), pl.lit(False).alias("lineage"))
    zones = _on_the_logs_clock(shifted, all_steps)
    for name, zone in zones.items():
        shifts.append(f"{name} times were {_ahead_or_behind(zone)} the step log's (epoch times read in this machine's time "
                      "zone, the log printed in the training host's): put on the log's clock")
    superseded = [
        per_log_step(pl.concat(frames), units.get(name, StepUnits()))
        .with_columns(pl.lit(name).cast(pl.Categorical).alias("source"), pl.col("time") - zones.get(name, timedelta(0)))
        for name, frames in abandoned.items()
    ]
    earlier = pl.concat(superseded, how="vertical_relaxed").select(list(METRIC_SCHEMA)) if superseded else empty(METRIC_SCHEMA)
    stamped = [name for name in ("wandb", "tensorboard") if name in shifted and shifted[name]["time"].is_not_null().any()]
    merged = merge_sources(shifted)
    del shifted
    abandoned_steps = empty(STEP_SCHEMA)
    epoch_zone = []
    if all_steps.is_empty() and not merged.metrics.is_empty():
        # A run known only from copies: its steps from their values, an abandoned attempt's from its own.
        all_steps = _steps_from_metrics(merged.metrics)
        abandoned_steps = _steps_from_metrics(earlier, per_file=True)
        epoch_zone = _epoch_zone_note(stamped)
    notes = shifts + epoch_zone + list(merged.notes)
    sources = _interleaved(sources, all_steps)
    events, starts, apart = _own_sessions(events, sessions, [all_steps["time"], merged.metrics["time"]])
    notes += apart
    estimated = False
    if all_steps["time"].null_count() == all_steps.height and starts:
        all_steps = reconstruct_times(all_steps, merged.metrics, starts, earlier)
        estimated = all_steps["time"].null_count() < all_steps.height
        if estimated:
            notes.append("the step log carries no times: step times are the Ray session start plus the summed timing_s/step")
    all_steps, past = _copied_past_the_log(all_steps, merged.metrics, rank=len(location.logs))
    notes += past
    clock = step_clock(all_steps)
    metrics_frame = cut_alike(merged.metrics) if not merged.metrics.is_empty() else empty(METRIC_SCHEMA)
    metrics_frame, renamed = _one_name_across_a_rename(metrics_frame)
    notes += renamed
    events_frame = pl.concat(events) if events else empty(EVENT_SCHEMA)
    del events  # (the frame holds their rows now: each column is let go as the sort below replaces it)
    undated = [s.path for s in sources if any(MTIME_DATED in note for note in s.notes)]
    events_frame, metrics_frame, redated = _dated_by_the_steps(events_frame, metrics_frame, all_steps["time"], undated)
    notes += redated
    events_frame, metrics_frame, zoned = _servers_on_the_runs_clock(events_frame, metrics_frame, all_steps["time"])
    notes += zoned
    named = _save_folder_named(location, facts) if location.checkpoint_dir is None else None
    if named is not None and is_verl_checkpoint_root(named):
        location = replace(location, checkpoint_dir=named)
    if location.checkpoint_dir is None:
        checkpoints = empty(CHECKPOINT_SCHEMA)
    elif location.framework == "verl" or is_verl_checkpoint_root(location.checkpoint_dir):  # (a copy-only run's)
        checkpoints = read_verl_checkpoints(location.checkpoint_dir)
    elif is_trl_checkpoint_root(location.checkpoint_dir):
        checkpoints = read_trl_checkpoints(location.checkpoint_dir)
    else:
        checkpoints = read_areal_checkpoints(location.checkpoint_dir)
    latest_steps = _latest_steps(all_steps)
    events_frame = into_dying_attempts(past_their_headers(assign_steps(events_frame, clock), all_steps), relaunch_gaps(all_steps),
                                       starts if estimated else ())
    _sort_by_time(events_frame)
    metrics_frame, earlier = _copied_from_abandoned_steps(metrics_frame, earlier, all_steps, latest_steps)
    if estimated and earlier.height:  # an abandoned attempt's values take their step copy's estimated time
        copy_time = all_steps.select(pl.col("file").cast(pl.String), "line", pl.col("time").alias("copy_time"))
        earlier = (earlier.with_columns(pl.col("file").cast(pl.String).alias("path"))
                   .join(copy_time, left_on=["path", "line"], right_on=["file", "line"], how="left", maintain_order="left")
                   .with_columns(pl.coalesce("time", "copy_time").alias("time")).select(list(METRIC_SCHEMA)))
    return RunData(
        location=location,
        steps=latest_steps,
        metrics=assign_steps(metrics_frame, clock),
        events=events_frame,
        checkpoints=checkpoints,
        sources=sources,
        facts=facts,
        config=read_areal_config(location.root / "config.yaml"),
        series_sources=merged.series_sources,
        notes=notes,
        estimated_step_times=estimated,
        save_folder_named=named,
        superseded=earlier,
        superseded_steps=pl.concat([all_steps.select(list(STEP_SCHEMA)).join(latest_steps, on=["step", "file", "line"], how="anti"),
                                    abandoned_steps]),
    )


def _save_folder_named(location: RunLocation, facts: dict[str, str]) -> Path | None:
    """The folder a verl run's console names as its ``default_local_dir``, where it is absolute:
    a Ray session or its TaskRunner's output given alone names where the run saved, though nothing
    beside them is (read where it holds checkpoints; looked at, and so watched, in any case)."""
    named = facts.get("default_local_dir")
    if location.framework != "verl" or not named or not Path(named).is_absolute():
        return None
    return Path(named)


def save_folders_named(location: RunLocation) -> list[Path]:
    """The folders ``location``'s verl consoles name as their ``default_local_dir`` (see
    :func:`_save_folder_named`), from the first config each printed, before the run is parsed:
    a folder the analysis will read, so no place for what it writes (a parse cache set there)."""
    if location.checkpoint_dir is not None:
        return []
    values = (first_fact(s.path, "default_local_dir") for s in location.logs if s.kind == "verl_log")
    return [named for value in values if value and (named := _save_folder_named(location, {"default_local_dir": value}))]


def _one_event_a_line(frames: list[pl.DataFrame]) -> pl.DataFrame:
    """The events of one source's parses, one a line: where two parses cite one line, the first
    frame's. One parse whose lines rise within each file has none twice, and is not copied (a
    flooded log's millions of events would be, twice: to find duplicates and to drop them)."""
    events = pl.concat(frames)
    if len(frames) == 1 and events.select(_lines_rise()).item():
        return events
    return events.unique(["file", "line"], keep="first", maintain_order=True)


def _lines_rise() -> pl.Expr:
    """Whether each file's rows are together and their lines rise (nulls never do)."""
    file, line = pl.col("file"), pl.col("line")
    rising = ((file != file.shift()) | (line > line.shift())).fill_null(False) | (pl.int_range(pl.len()) == 0)
    together = file.rle_id().max() + 1 == file.n_unique()
    return (rising.all() & line.is_not_null().all() & together).fill_null(True)


def _sort_by_time(events: pl.DataFrame, rows: int = 1 << 20) -> None:
    """Sort ``events`` in place by time (untimed last), file and line: a sorted copy of a flooded
    log's millions of events would hold them twice. One already so is left."""
    ranks = _file_rank(events["file"])
    keys = events.select("time", ranks, "line")  # (the frame's own columns, not copies)
    if _holds(keys, _after_the_row_before(), rows):
        return
    blocks = ranks.rle().struct.unnest()  # (a row a stretch of one file's rows)
    if blocks.height == blocks["value"].n_unique() and not ranks.has_nulls() and _holds(keys, _file_lines_rise(), rows):
        # Each file's rows together, in line order (as its reader left them): one stable sort by
        # time, over the files put in name order, is the whole sort.
        order = _files_by_name(blocks)
        times = keys["time"] if order is None else keys["time"].gather(order)
        by_time = times.to_frame().select(pl.arg_sort_by("time", nulls_last=True, maintain_order=True)).to_series()
        order = by_time if order is None else order.gather(by_time)
    else:
        # One key at a time, least telling first, each sort stable: a sort by all three at once
        # encodes every row's keys together (hundreds of megabytes for a flood).
        order = None
        for key in ("line", "file", "time"):
            column = keys[key] if order is None else keys[key].gather(order)
            step = column.to_frame().select(pl.arg_sort_by(key, nulls_last=True, maintain_order=True)).to_series()
            order = step if order is None else order.gather(step)
    del keys, ranks, blocks
    gather_in_place(events, order)


def _holds(keys: pl.DataFrame, test: pl.Expr, rows: int) -> bool:
    """Whether ``test`` (of a row and the one before) holds at every row of ``keys`` but the
    first, judged ``rows`` at a time: its shifted columns for all of a flood's rows at once would
    cost more than the events' own."""
    for start in range(0, keys.height, rows):
        part = keys.slice(max(start - 1, 0), rows + (start > 0))
        if not part.select((test.fill_null(False) | (pl.int_range(pl.len()) == 0)).all()).item():
            return False
    return True


def _after_the_row_before() -> pl.Expr:
    """A row's place in time order (untimed last, then file and line) after the row before."""
    time, before = pl.col("time"), pl.col("time").shift()
    return (
        pl.when(time.is_null() & before.is_null()).then(_later_line())
        .when(before.is_null()).then(False)
        .when(time.is_null()).then(True)
        .otherwise((time > before) | ((time == before) & _later_line()))
    )


def _later_line() -> pl.Expr:
    file, line = pl.col("file"), pl.col("line")
    return (file > file.shift()) | ((file == file.shift()) & (line > line.shift()))


def _file_lines_rise() -> pl.Expr:
    """A row of another file than the row before, or of the same one at a later line."""
    file, line = pl.col("file"), pl.col("line")
    return line.is_not_null() & ((file != file.shift()) | (line > line.shift()))


def _files_by_name(blocks: pl.DataFrame) -> pl.Series | None:
    """The row order that puts files whose rows lie together (``blocks``, their ranks' run
    lengths) in name order; ``None`` if they are."""
    if blocks["value"].is_sorted():
        return None
    starts = blocks["len"].cum_sum() - blocks["len"]
    ordered = blocks.with_columns(starts.alias("start")).sort("value")
    return pl.concat([pl.int_range(start, start + length, dtype=pl.UInt32, eager=True)
                      for start, length in ordered.select("start", "len").iter_rows()])


def _file_rank(files: pl.Series) -> pl.Series:
    """Each row's file as its rank among the few files by name: compared as text, a categorical
    column has every row's path copied out (hundreds of megabytes for a flood). Looked up by each
    row's category number (``replace_strict`` over a flood's rows costs eight times its output)."""
    names = files.unique().drop_nulls()
    numbers = names.to_physical()
    ranks = names.cast(pl.String).rank("ordinal").cast(pl.UInt32) - 1
    rank_of = pl.repeat(None, int(numbers.max() or 0) + 1, dtype=pl.UInt32, eager=True).scatter(numbers, ranks)
    return rank_of.gather(files.to_physical()).alias("file")


#: How far from the rest of a run's logs a Ray session may lie and still be the run's (Ray starts
#: before the trainer logs anything; a relaunch appends to the trainer's log as it starts).
_SESSION_SLACK = timedelta(hours=1)


def _own_sessions(events: list[pl.DataFrame], sessions: dict[int, datetime | None],
                  times: list[pl.Series]) -> tuple[list[pl.DataFrame], list[datetime], list[str]]:
    """The events without those of Ray sessions that lie wholly apart from the run's other logs in
    time (another job's session, copied or left beside them), the starts of the sessions kept, and a
    note for each left out. With nothing else timed, every session is kept."""
    others = [frame["time"] for i, frame in enumerate(events) if i not in sessions] + times
    bounds = [(t.min(), t.max()) for t in others if t.null_count() < len(t)]
    if not bounds or not sessions:
        # (with nothing else dated, a session cannot be told apart from another job's: said when there is a choice)
        names = sorted({_session_name(str(events[i]["file"][0])) for i in sessions if events[i].height})
        doubt = [f"{len(names)} Ray sessions ({', '.join(names)}) are taken as this run's: nothing else in its logs is dated "
                 "to tell another job's apart; give the run's own session if they are not all its"] if len(names) > 1 else []
        return events, [start for start in sessions.values() if start is not None], doubt
    first, last = min(lo for lo, _ in bounds), max(hi for _, hi in bounds)
    kept, starts, notes = [], [], []
    for i, frame in enumerate(events):
        if i not in sessions:
            kept.append(frame)
            continue
        seen, start = frame["time"].drop_nulls(), sessions[i]
        # (A session that logged nothing timed is kept: a cluster started long before the job is the job's.)
        if len(seen):
            ends = [t for t in (seen.min(), seen.max(), start) if t is not None]
            if min(ends) > last + _SESSION_SLACK or max(ends) < first - _SESSION_SLACK:
                notes.append(f"Ray session {_session_name(str(frame['file'][0]))} ({min(ends):%Y-%m-%d %H:%M}–{max(ends):%Y-%m-%d %H:%M}) "
                             f"lies apart from the run's other logs ({first:%Y-%m-%d %H:%M}–{last:%Y-%m-%d %H:%M}): another "
                             "job's; its events are left out")
                continue
        kept.append(frame)
        if start is not None:
            starts.append(start)
    return kept, starts, notes


def _session_name(path: Path | str) -> str:
    """The ``session_…`` folder a session's file lies in."""
    parts = [part for part in Path(path).parts if part.startswith("session_")]
    return parts[-1] if parts else str(path)


#: A line of the server's own (an SGLang record, a role's prefix before it in merged.log): what it
#: tells is the server's, though AReaL's patterns have a kind of that name (a scheduler's CUDA OOM).
_SERVER_RECORD = r"^(?:\[[a-z_]+\] )?\[(?:\d{4}-\d{2}-\d{2} )?\d{2}:\d{2}:\d{2}"


def parse_source(
    source: LogSource, *, custom_format: CustomFormat | None = None, cache: ParseCache | None = None,
    keys: str | None = None,
) -> list[Parsed]:
    """One source's frames, one per parser that reads its kind (through ``cache`` when given).

    ``keys`` is passed to the parsers that drop other metrics as they read (AReaL's tables,
    SGLang's stats lines); the others' frames are whole (``load_run`` filters every parse's).

    Raises:
        OSError, polars.exceptions.PolarsError, ValueError: the source cannot be read.
    """
    parsed = [_read_through(cache, reader, source.path, custom_format, keys) for reader in SOURCE_READERS[source.kind]]
    if source.kind == "areal_log":  # the server's lines only: AReaL's own are its reader's to tell
        areal = load_format("areal").kinds
        own = ~pl.col("kind").is_in(areal) | pl.col("message").str.contains(_SERVER_RECORD).fill_null(False)
        parsed = [replace(p, events=p.events.filter(own)) if p.source == "sglang" else p for p in parsed]
    return parsed


def _coverage(source: LogSource, parsed: list[Parsed]) -> list[SourceReport]:
    """What was read of one source: per file for a Ray session, else one line for the file."""
    per_file = [r for p in parsed for r in p.reports]
    if per_file:
        return per_file
    identity = fingerprint(source.path) if source.path.is_file() else None
    return [
        SourceReport(
            str(source.path),
            source.kind,
            max(p.lines for p in parsed),
            # Each parser counts the other's lines as its own failures; a line neither
            # understood is unparsed by both, so the smaller count is the true one.
            min(p.unparsed_lines for p in parsed),
            (*(note for p in parsed for note in p.notes), *((UTF16_NOTE,) if source.kind not in _BINARY and utf16(source.path) else ())),
            bytes=identity.size if identity else None,
            digest=identity.digest if identity else None,
            digest_method=identity.method if identity else None,
        )
    ]


#: Sources whose files are binary by design (NULs are no sign of UTF-16 there).
_BINARY = ("wandb", "tensorboard", "ray_session")


def load_online_wandb(name: str, *, keys: str | None = None) -> RunData:
    """A hosted W&B run's full history as a run (``ENTITY/PROJECT/RUN_ID``); ``keys`` as for :func:`load_run`.

    Raises:
        UnusableInput: no ``wandb`` package, no API key, no network, or no such run.
    """
    try:
        hosted = read_wandb_online(name)
    except (WandbUnavailable, ValueError) as exc:
        raise UnusableInput(f"--wandb {name}: {exc}") from exc
    shifted, shifts, _ = _in_log_units({"wandb": hosted.metrics})
    metrics = with_keys(shifted["wandb"], keys)
    steps = _steps_from_metrics(metrics)
    location = RunLocation(name, "unknown", Path(name), (), None)
    source = SourceReport(f"wandb:{name}", "wandb_online", hosted.records_read, hosted.records_skipped, hosted.notes)
    return RunData(location, steps.drop("rank"), metrics, empty(EVENT_SCHEMA), empty(CHECKPOINT_SCHEMA), [source],
                   config={f"wandb.{k}": v for k, v in hosted.config.items() if not isinstance(v, dict | list)}, notes=shifts)


def _read_through(
    cache: ParseCache | None, reader: str, path: Path, custom_format: CustomFormat | None, keys: str | None
) -> Parsed:
    keys = keys if READERS[reader].filters_keys else None
    if cache is None:
        return read(reader, path, custom_format, keys)
    variant = repr(custom_format) if reader == "custom" and custom_format is not None else ""
    if keys is not None:
        variant += f"\0keys={keys}"
    return cache.parsed(reader, path, lambda p: read(reader, p, custom_format, keys), variant=variant,
                        splice=READERS[reader].splice)


def other_logs(run: RunData) -> pl.DataFrame:
    """The timed metric rows of logs that log no step (a server's): what went on while the steps
    stopped. Copies of the run's numbers are the trainer's own, not other logs."""
    stepped = run.step_copies["file"].cast(pl.String).unique().to_list()
    # (Categorical columns compared with their names as they are: no string copy of millions of rows.)
    return run.metrics.filter(
        pl.col("time").is_not_null() & ~pl.col("source").is_in(list(COPY_SOURCES)) & ~pl.col("file").is_in(stepped)
    ).select("time", "step", "file", "line", "key", "value")


def _in_log_units(frames: dict[str, pl.DataFrame]) -> tuple[dict[str, pl.DataFrame], list[str], dict[str, StepUnits]]:
    """Copies (W&B, TensorBoard) put in the text log's step numbers, a note per change, and each
    copy's mapping.

    With a text log to compare against, the mapping is the one under which values agree (a shift,
    or micro-steps averaged into steps); without one, AReaL's copies (``grpo_actor/…``,
    ``ppo_actor/…`` keys) are 0-based and move up by one.
    """
    reference = next((frames[s] for s in ("areal", "verl", "custom") if s in frames), None)
    out, notes, mapped = dict(frames), [], {}
    for name in COPY_SOURCES:
        if name not in frames:
            continue
        copy = frames[name]
        if reference is not None:
            units = step_units(reference, copy)
            why = "so that its values line up with the text log's"
        else:
            units = areal_copy_units(copy) if keys_matching(copy, r"^(?:grpo|ppo)_actor/") else StepUnits()
            why = "AReaL logs its 0-based global_step there; its trainer log and checkpoints count from 1"
        if units.scale > 1 and reference is None:
            notes.append(f"{name} steps are minibatch updates, {units.scale} to each training step (AReaL logs a step's "
                         f"{units.scale} updates at steps of their own, its rewards at the first): shown as that step "
                         f"(step // {units.scale} {units.offset:+d}, their values averaged, as its log averages them)")
        elif units.scale > 1:
            notes.append(f"{name} steps are micro-steps, {units.scale} to each of the text log's steps: shown as that step "
                         f"(step // {units.scale}{f' {units.offset:+d}' if units.offset else ''}, their values averaged, "
                         "as the log averages them)")
        elif units.offset:
            notes.append(f"{name} steps are shown {units.offset:+d} ({why})")
        out[name] = per_log_step(copy, units)
        mapped[name] = units
    renamed = {name: frame.with_columns(pl.lit(name).cast(pl.Categorical).alias("source")) for name, frame in out.items()}
    return renamed, notes, mapped


#: Validation values (verl's ``val-core/…``, a loop's ``val/…``): a step with only these trained nothing.
_VALIDATION = r"^(?:val-core|val-aux|val)/"


def _steps_from_metrics(metrics: pl.DataFrame, *, per_file: bool = False) -> pl.DataFrame:
    """Step rows for a run known only from copies: each step's earliest training value (``per_file``:
    in each file, its copy of the step — the parts of a resumed run each hold one; no ``rank``)."""
    steps = (
        metrics.filter(pl.col("step").is_not_null() & ~pl.col("key").cast(pl.String).str.contains(_VALIDATION))
        .with_columns(pl.col("file").cast(pl.String))
        .sort("time", nulls_last=True)
        .group_by("step", *(("file",) if per_file else ()), maintain_order=True)
        .agg(pl.col("time").first(), *(() if per_file else (pl.col("file").first(),)), pl.col("line").first())
        .select(list(STEP_SCHEMA))
    )
    return steps if per_file else steps.with_columns(pl.lit(0).alias("rank"))


def _epoch_zone_note(copies: list[str]) -> list[str]:
    """Times known only from epoch stamps (W&B, TensorBoard) are this machine's wall clock: say in
    which zone, since no log of the run's gives its own."""
    if not copies:
        return []
    zone = datetime.now().astimezone().strftime("%Z, UTC%z")
    named = " and ".join({"wandb": "W&B", "tensorboard": "TensorBoard"}[c] for c in copies)
    return [f"times are {named}'s epoch stamps shown in this machine's time zone ({zone}): no log of the "
            "run's own gives the training host's (set TZ to it to match that host's logs)"]


def _on_the_logs_clock(frames: dict[str, pl.DataFrame], steps: pl.DataFrame) -> dict[str, timedelta]:
    """Copies whose clock is a time zone away from the step log's, moved onto it (in place), and by how much."""
    zones = {}
    for name in COPY_SOURCES:
        zone = zone_offset(steps, frames[name]) if name in frames else None
        if zone:
            frames[name] = frames[name].with_columns(pl.col("time") - zone)
            zones[name] = zone
    return zones


def _servers_on_the_runs_clock(events: pl.DataFrame, metrics: pl.DataFrame,
                               step_times: pl.Series) -> tuple[pl.DataFrame, pl.DataFrame, list[str]]:
    """Server logs whose own lines lie off the run's steps: moved onto the run's clock when a time
    zone's offset does it and only one (:func:`forensics.align.server_zone`), else said."""
    if step_times.null_count() == step_times.len():
        return events, metrics, []
    start, end = step_times.min(), step_times.max()
    server = pl.col("source") == "sglang"  # (categorical or not, compared as it is: no copy of millions of rows)
    # One pass over the server's rows first: most logs are on the run's clock.
    counts: dict[str, list[int]] = {}
    for frame in (events, metrics):
        inside = frame.lazy().filter(server).group_by("file").agg(pl.col("time").is_between(start, end).sum().alias("in"), pl.len())
        for file, n_in, n in inside.collect().iter_rows():
            counts.setdefault(str(file), [0, 0])[0] += n_in
            counts[str(file)][1] += n
    notes = []
    # (the few refusals first: a flood's millions of other rows never have their file names copied out)
    refused = (events.filter(pl.col("kind").is_in(["connection_refused", "connection_reset"]))
               .filter(~server & ~pl.col("file").cast(pl.String).is_in(list(counts))))
    for file, (n_in, n) in counts.items():
        mine = server & (pl.col("file") == file)
        if (moved := _host_clock(events, file, refused)) is not None:
            # (the whole file, its wrapper lines too: written on the server host's clock)
            shift, why = moved
            events, metrics = _moved(pl.col("file") == file, shift, events, metrics)
            notes.append(f"{Path(file).name}: the whole log, its wrapper lines too, is {_ahead_or_behind(-shift)} the run's "
                         f"clock ({why}): moved onto it")
            continue
        others = events.filter((pl.col("file") == file) & (pl.col("source") != "sglang"))
        if n_in >= 0.5 * n and others.is_empty():  # (with wrapper lines, their order tells a clock hours ahead too)
            continue
        no_kind = pl.lit(None, dtype=events.schema["kind"]).alias("kind")
        own = pl.concat([events.filter(mine).select("line", "time", "kind"), metrics.filter(mine).select("line", "time", no_kind)])
        zone, off = server_zone(step_times, own, others)
        if not off:
            continue
        name = Path(file).name
        if zone is None:
            # Their times say nothing of the run's steps: judged by them, a server answering all along
            # looked silent at the onset and busy long after the last step (a stall).
            unknown = pl.when(mine).then(None).otherwise(pl.col("time")).alias("time")
            events, metrics = events.with_columns(unknown), metrics.with_columns(unknown)
            notes.append(f"{name}: the server's own lines lie outside the run's steps (another clock, or another run's "
                         "log) and no one time zone's offset puts them in: they are not placed among the steps (their "
                         "times are left out of the judgment; the lines keep their own)")
            continue
        events, metrics = _moved(mine, zone, events, metrics)
        how = "the file's wrapper lines leave" if others.height else "putting them among the steps"
        notes.append(f"{name}: the server's own lines are {_ahead_or_behind(-zone)} the run's clock (another time zone, "
                     f"the one offset {how}): moved onto it")
    return events, metrics, notes


def _moved(rows: pl.Expr, by: timedelta, events: pl.DataFrame, metrics: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``events`` and ``metrics`` with the times of their ``rows`` (a file's) moved ``by``: onto the run's clock."""
    moved = pl.when(rows).then(pl.col("time") + by).otherwise(pl.col("time")).alias("time")
    return events.with_columns(moved), metrics.with_columns(moved)


#: AReaL renamed its actor's statistics (v0.4.1, #556): a run resumed across the upgrade logged the
#: old names up to a step and the new ones after it.
_RENAMED = ("grpo_actor/", "ppo_actor/")


def _one_name_across_a_rename(metrics: pl.DataFrame) -> tuple[pl.DataFrame, list[str]]:
    """Series logged under AReaL's old names up to a step and its new names after it, read as one
    series under the new names (the old one's reward ended halfway: a collapse after it unseen)."""
    old, new = _RENAMED
    keys = (metrics.lazy().group_by("key").agg(pl.col("step").min().alias("first"), pl.col("step").max().alias("last"))
            .collect().with_columns(pl.col("key").cast(pl.String)))  # (the keys' texts, not every row's)
    olds = keys.filter(pl.col("key").str.starts_with(old))
    news = keys.filter(pl.col("key").str.starts_with(new))
    if olds.is_empty() or news.is_empty() or olds["last"].max() is None or news["first"].min() is None:
        return metrics, []
    if not olds["last"].max() < news["first"].min():  # type: ignore[operator]
        return metrics, []  # (both at once: two models' statistics, not a rename)
    dtype = metrics.schema["key"]
    renamed = pl.col("key").cast(pl.String).str.replace(f"^{old}", new).cast(dtype)
    note = (f"the actor's statistics were logged as {old}… up to step {olds['last'].max()} and as {new}… from step "
            f"{news['first'].min()} (AReaL renamed them in v0.4.1: a run resumed across the upgrade): read as one series each")
    return metrics.with_columns(renamed), [note]


def _dated_by_the_steps(events: pl.DataFrame, metrics: pl.DataFrame, step_times: pl.Series,
                        undated: list[str]) -> tuple[pl.DataFrame, pl.DataFrame, list[str]]:
    """Logs with no date anywhere (time-only prefixes, dated by the parser from the file's time: a
    copy's is the day it was copied) moved by whole days onto the run's steps, where one move puts
    almost all their lines among them: the times of day are the server's, the day is the run's."""
    steps = step_times.drop_nulls()
    notes: list[str] = []
    if steps.is_empty():
        return events, metrics, notes
    start, end = steps.min() - timedelta(minutes=10), steps.max() + timedelta(minutes=10)  # type: ignore[operator]
    for file in undated:
        mine = pl.col("file").cast(pl.String) == file
        times = pl.concat([events.filter(mine)["time"], metrics.filter(mine)["time"]]).drop_nulls()
        if times.is_empty():
            continue
        days = round((steps.median() - times.median()) / timedelta(days=1))  # type: ignore[operator]
        shift = timedelta(days=days)
        if not days or (times + shift).is_between(start, end).mean() < 0.9:  # type: ignore[operator]
            continue
        events, metrics = _moved(mine, shift, events, metrics)
        notes.append(f"{Path(file).name}: its lines give no date; dated from the run's steps, whose times of day they "
                     f"fall among ({abs(days)} day{'s' if abs(days) != 1 else ''} {'before' if days < 0 else 'after'} "
                     "the file's modification time)")
    return events, metrics, notes


def _host_clock(events: pl.DataFrame, file: str, calls: pl.DataFrame) -> tuple[timedelta, str] | None:
    """The offset of a server log's whole clock, read off its first exit and the trainer's failed
    calls to its address, and why: another time zone (:func:`forensics.align.exit_offset`) or a
    clock minutes off (:func:`forensics.align.exit_skew`); else ``None``."""
    mine = events.filter(pl.col("file") == file)
    exits = mine.filter((pl.col("kind") == "server_exit") & pl.col("time").is_not_null())
    if exits.is_empty() or calls.is_empty():
        return None
    launched = launches(mine)["at"].drop_nulls()
    calls = calls.with_columns(server_named(pl.col("message")).alias("at"))
    if launched.len():  # (calls naming another server are not to this one)
        calls = calls.filter(pl.col("at").is_null() | pl.col("at").is_in(launched.unique().implode()))
    exited = exits["time"].min()
    if (zone := exit_offset(exited, calls["time"])) is not None:  # type: ignore[arg-type]
        return zone, ("the server's host in another time zone: its exit and the trainer's first refused call to it "
                      "are that far apart, and no refusal followed the exit as written")
    refused = calls.filter(pl.col("kind") == "connection_refused")["time"]
    if (skew := exit_skew(exited, calls.filter(pl.col("kind") == "connection_reset")["time"], refused)) is not None:  # type: ignore[arg-type]
        return skew, ("the server host's clock is off: its exit and the first call the trainer found dropped mid-request, "
                      "refused ones right after, are that far apart")
    return None


#: A log whose steps go back this often is two runs writing into it at once, not relaunches.
_INTERLEAVED = 0.2


def _interleaved(sources: list[SourceReport], steps: pl.DataFrame) -> list[SourceReport]:
    """Step logs whose steps go back again and again (two jobs teeing into one file): said, as a
    loss — only the last copy of each step is judged, and the other job's cannot be told apart."""
    if steps.is_empty():
        return sources
    back = (steps.sort("line").group_by("file", maintain_order=True)
            .agg(relaunches(pl.col("step")).sum().alias("back"), pl.len().alias("copies"))
            .filter((pl.col("back") >= 5) & (pl.col("back") >= _INTERLEAVED * pl.col("copies"))))
    said = {str(file): (f"its steps go back {n} times in {copies} step lines: two runs seem to write into it at once; "
                        "one cannot read their steps apart, so only the last copy of each step is judged")
            for file, n, copies in back.iter_rows()}
    return [replace(s, notes=(*s.notes, said[s.path])) if s.path in said else s for s in sources]


def _ahead_or_behind(delta: timedelta) -> str:
    seconds = round(delta.total_seconds())
    minutes, rest = divmod(abs(seconds), 60)
    size = (f"{abs(seconds) / 3600:g} h" if not seconds % 900 else
            f"{minutes} min {rest} s" if minutes and rest else f"{minutes} min" if minutes else f"{rest} s")
    return f"{size} {'ahead of' if seconds > 0 else 'behind'}"


def _copied_past_the_log(steps: pl.DataFrame, metrics: pl.DataFrame, *, rank: int) -> tuple[pl.DataFrame, list[str]]:
    """Step rows for the steps a copy (W&B, TensorBoard) holds past the step log's last: the log
    stopped (its tee died, the file was cut) and the run went on, as the copy shows."""
    if steps.is_empty():
        return steps, []
    last = int(steps["step"].max())
    copied = metrics.filter(pl.col("source").is_in(list(COPY_SOURCES)) & (pl.col("step") > last))
    if copied.is_empty():
        return steps, []
    past = _steps_from_metrics(copied).with_columns(pl.lit(rank).alias("rank"), pl.lit(False).alias("lineage"))
    if past.is_empty():
        return steps, []
    sources = ", ".join(sorted(set(copied["source"].cast(pl.String))))
    note = (f"the step log ends at step {last}; steps {last + 1}–{past['step'].max()} are known only from its copy "
            f"({sources})")
    return pl.concat([steps, past.select(steps.columns)], how="vertical_relaxed"), [note]


def _copied_from_abandoned_steps(metrics: pl.DataFrame, earlier: pl.DataFrame, steps: pl.DataFrame,
                                 latest: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """A copy's values for steps past the run's last that only an attempt a relaunch abandoned
    logged (the relaunch went back in the step log; the copy, not told, holds the attempt's): the
    attempt's, with its other values — not the run's going on past the relaunch."""
    lineage = steps.filter("lineage") if "lineage" in steps.columns else steps.clear()
    if lineage.is_empty() or latest.is_empty():
        return metrics, earlier
    last, reached = int(latest["step"].max()), int(lineage["step"].max())
    if reached <= last:
        return metrics, earlier
    theirs = pl.col("step").is_between(last + 1, reached) & pl.col("source").is_in(list(COPY_SOURCES))
    return metrics.filter(~theirs), pl.concat([earlier, metrics.filter(theirs).select(list(METRIC_SCHEMA))], how="vertical_relaxed")


def _latest_steps(steps: pl.DataFrame) -> pl.DataFrame:
    """One row per step: its latest copy (a relaunch re-logs steps after the recovered one); of an
    AReaL log's, none an abandoned attempt logged past where a relaunch went back to."""
    ordered = steps.sort("rank", "line")
    if "lineage" not in ordered.columns:  # step rows made from a copy's metrics
        ordered = ordered.with_columns(pl.lit(False).alias("lineage"))
    lineage = ordered.filter("lineage")
    kept = lineage.filter(~abandoned(pl.col("step")).over(stream_of(pl.col("file")))) if lineage.height else lineage
    return (
        pl.concat([kept, ordered.filter(~pl.col("lineage"))])
        .sort("rank", "line")
        .unique("step", keep="last", maintain_order=True)
        .sort("step")
        .select(list(STEP_SCHEMA))
    )


def _latest_copy(ranked: list[tuple[int, pl.DataFrame]], *, lineage: bool = False) -> tuple[pl.DataFrame, pl.DataFrame]:
    """One parser's frames (with the rank of their file): table values from the newest file win
    for a step, the others' are returned apart (a relaunch logging into a rotated log's successor);
    line metrics (memory) are all kept. ``lineage``: a later file's steps going back abandon an
    earlier file's from there on, re-logged or not (see :func:`parsers.schema.abandoned`)."""
    older = empty(METRIC_SCHEMA)
    if len(ranked) == 1:
        metrics = ranked[0][1].select(list(METRIC_SCHEMA))
    else:
        metrics = pl.concat(frame.with_columns(pl.lit(rank).alias("rank")) for rank, frame in ranked)
        if lineage:  # the same log's later rotated parts going back abandon an earlier part's steps from there on
            files = pl.DataFrame({"rank": [r for r, f in ranked if f.height], "file": [str(f["file"][0]) for _, f in ranked if f.height]})
            streams = dict(files.select("rank", stream_of(pl.col("file"))).iter_rows())  # (a file's, not each row's)
            stream = pl.col("rank").replace_strict(streams, default=None, return_dtype=pl.String).alias("stream")
            gone = abandoned_by_later_parts(metrics.with_columns(stream), "rank", "stream")
            older, metrics = metrics.filter(gone), metrics.filter(~gone)
        # Of what each file keeps (logs of different names: a relaunch into a new file), the newest file's step wins.
        newest = pl.col("step").is_null() | (pl.col("rank") == pl.col("rank").max().over("step"))
        older = pl.concat([older.select(list(METRIC_SCHEMA)), metrics.filter(~newest).select(list(METRIC_SCHEMA))])
        metrics = metrics.filter(newest).select(list(METRIC_SCHEMA))
    # A table parser's values are in time order within each step: a stable sort by step alone
    # (several times cheaper than by two columns) is then the whole sort.
    if not _in_step_time_order(metrics):
        metrics = metrics.sort("step", nulls_last=True, maintain_order=True)
    if not _in_step_time_order(metrics):
        metrics = metrics.sort("step", "time", nulls_last=True, multithreaded=True)
    return metrics, older


def _in_step_time_order(frame: pl.DataFrame, rows: int = 1 << 18) -> bool:
    """Whether ``frame`` is sorted by ``step`` then ``time``, nulls last in both.

    Checked ``rows`` at a time (each slice overlapping the next by one row): the shifted copies
    the test makes then cost a slice, not a long run's every value.
    """
    step, time = pl.col("step"), pl.col("time")
    next_step, next_time = step.shift(-1), time.shift(-1)
    time_ok = next_time.is_null() | (time.is_not_null() & (next_time >= time))
    step_ok = (
        pl.when(next_step.is_null())
        .then(step.is_not_null() | time_ok)
        .when(step.is_null())
        .then(False)
        .otherwise((next_step > step) | ((next_step == step) & time_ok))
    )
    # A slice's last row is compared with nothing (always passes); the next slice starts with it.
    return all(
        frame.slice(start, rows + 1).select(step_ok.all()).item() for start in range(0, max(frame.height - 1, 1), rows)
    )
