"""Logs of hand-rolled training loops → frames, by a bundled format or one the user declares.

The bundled ``formats/custom_loop.json`` reads nanoGPT-style GRPO loops (seed 003)::

    [Micro 0] 3. Samples scored: mem=18410.2 MB, time=10.034s, rewards=0.3750±0.4841
    WARNING: All advantages are near zero! rewards_grouped=[[0.0, 0.0, …]]
    5. Optimizer step finished: mem=16011.7 MB, time=21.702s total
    iter 0: loss 0.1235 (main 0.1235, critic 0.0000), time 21747.97ms

A line whose pattern has a ``step`` group starts a step's row (``iter N``); every other
matched line belongs to the step whose line comes next (``step_line_at = "end"``: the loop
prints its summary after the work) or last (``"start"``). Lines after the last step line
belong to the step still in progress. Several values of one key in one step (micro-steps,
phases) are averaged; each one is kept in ``detail`` with its ``micro`` index. A key may name
string groups, ``phase/{phase}_s`` → ``phase/samples_generated_s``.

A user format is a TOML file (data only, never code), documented by
``tests/fixtures/custom_format_example.toml``: ``regex`` with named groups ``step``, optional
``time`` (with ``time_format``, a chrono/strftime format) and values (every other group, or as
mapped by ``[values]``), and optional ``[[events]]``. Unknown keys are rejected.

Example:
    >>> log = read_custom_log(Path("train.log"))  # doctest: +SKIP
    >>> log = read_custom_log(Path("train.log"), load_custom_format(Path("loop.toml")))  # doctest: +SKIP
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field, replace
from datetime import date, datetime, timedelta
from functools import cache
from pathlib import Path
from typing import Any

import polars as pl

from parsers._formats import EventPattern, FormatDefinitionError, load_format
from parsers._lines import ANSI, collect_lines, lines_at, sniff
from parsers.schema import EVENT_SCHEMA, METRIC_SCHEMA, STEP_SCHEMA, abandoned, conform, step_number

__all__ = [
    "DETAIL_SCHEMA",
    "CustomFormat",
    "CustomLog",
    "ValuePattern",
    "custom_loop_format",
    "load_custom_format",
    "looks_like_custom_loop",
    "read_custom_log",
]

#: One row per value before averaging (per micro-step, per phase).
DETAIL_SCHEMA: dict[str, pl.DataType] = {
    "step": pl.Int64(),
    "micro": pl.Int64(),
    "key": pl.String(),
    "value": pl.Float64(),
    "file": pl.String(),
    "line": pl.Int64(),
}
SEVERITIES = ("info", "warning", "error", "fatal")
_TOP_KEYS = {"name", "description", "regex", "literal", "time_format", "step_line_at", "samples", "values", "events"}
_EVENT_KEYS = {"kind", "severity", "regex", "samples"}
_RESERVED_GROUPS = {"step", "time", "micro"}
_TEMPLATE = re.compile(r"\{(\w+)\}")
_LOOP_HINT = re.compile(r"^(?:iter \d+: loss |\[Micro \d+\] \d+\. )", re.MULTILINE)


@dataclass(frozen=True)
class ValuePattern:
    """A kind of line that carries values: ``values`` maps a regex group to a key template."""

    name: str
    regex: str
    values: dict[str, str]
    literal: str | None = None
    time_format: str | None = None

    @property
    def groups(self) -> set[str]:
        return set(re.compile(self.regex).groupindex)


@dataclass(frozen=True)
class CustomFormat:
    name: str
    origin: str
    patterns: tuple[ValuePattern, ...]
    events: tuple[EventPattern, ...] = ()
    step_line_at: str = "end"
    source: str = "custom"

    def matches(self, path: Path) -> bool:
        """True when a line in the head of ``path`` is one this format reads."""
        head = re.sub(ANSI, "", sniff(path, 256 << 10))
        return any(re.search(p.regex, head, re.MULTILINE) for p in self.patterns)


@dataclass(frozen=True)
class CustomLog:
    """What one custom-loop log holds."""

    path: str
    format: str
    steps: pl.DataFrame
    """Every copy of a step, at its last line, in log order (a restart's and the attempt's it abandoned)."""
    metrics: pl.DataFrame
    events: pl.DataFrame
    detail: pl.DataFrame
    lines: int
    unparsed_lines: int
    notes: tuple[str, ...] = ()
    superseded: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=METRIC_SCHEMA))
    """Values of attempts a restart abandoned (from the step it went back to on): not in ``metrics``."""


def looks_like_custom_loop(path: Path) -> bool:
    """True when the head of ``path`` has the bundled loop's ``iter N: loss`` or ``[Micro k]`` lines."""
    return bool(_LOOP_HINT.search(re.sub(ANSI, "", sniff(path, 256 << 10))))


@cache
def custom_loop_format() -> CustomFormat:
    """The bundled ``formats/custom_loop.json`` as a :class:`CustomFormat`."""
    fmt = load_format("custom_loop")
    patterns = tuple(ValuePattern(m.name, m.regex, dict(m.keys), m.literal) for m in fmt.metrics)
    return CustomFormat(fmt.name, "formats/custom_loop.json", patterns, fmt.events, "end", fmt.source)


def read_custom_log(path: Path, fmt: CustomFormat | None = None) -> CustomLog:
    """Parse one log (plain or gzipped) with ``fmt`` (default: the bundled custom-loop format)."""
    fmt = fmt or custom_loop_format()
    parts = collect_lines(Path(path), lambda lines: _extract(lines, fmt))
    return _on_the_calendar(_assemble(str(path), parts, fmt), fmt, Path(path))


#: strftime directives that give a year (``%D`` is ``%m/%d/%y``, ``%F`` ``%Y-%m-%d``), and a day.
_YEAR = ("%Y", "%y", "%G", "%D", "%F", "%c", "%s", "%+")
_DAY = (*_YEAR, "%d", "%e", "%j", "%b", "%B", "%h", "%m")
#: The year a time of a format with none is parsed in: a leap year, so 29 February is a date.
_NO_YEAR = 2000


def parsed_time(text: pl.Expr, time_format: str) -> pl.Expr:
    """``text`` parsed with ``time_format``; one that gives no year is parsed in :data:`_NO_YEAR`
    (see :func:`_on_the_calendar`, which puts it on the calendar)."""
    if any(d in time_format for d in _YEAR):
        return text.str.strptime(pl.Datetime("ms"), time_format, strict=False)
    return pl.concat_str(pl.lit(f"{_NO_YEAR} "), text).str.strptime(pl.Datetime("ms"), f"%Y {time_format}", strict=False)


#: How far a clock may go back before it is read as the next day (or year): threads' lines interleave.
_ROLLOVER = timedelta(hours=1)


def _on_the_calendar(log: CustomLog, fmt: CustomFormat, path: Path) -> CustomLog:
    """``log`` with times its format gives no year or no date of (``[23:55:00] iter 12 …``; a
    syslog-style ``Jun 01 23:55:00``), parsed in :data:`_NO_YEAR`, put on the calendar: the last timed line
    in the file's modification year or on its day, a year or a day added wherever the clock goes back."""
    formats = {p.time_format for p in fmt.patterns if p.time_format}
    if not formats or all(any(d in f for d in _YEAR) for f in formats):
        return log
    dated = any(d in f for f in formats for d in _DAY)
    timed = pl.concat([frame.select("line", "time") for frame in (log.steps, log.events)]).drop_nulls().unique("line").sort("line")
    try:
        modified = datetime.fromtimestamp(path.stat().st_mtime)
    except OSError:
        return log
    if timed.is_empty():
        return log
    turns = timed.select("line", (pl.col("time") < pl.col("time").shift(1) - _ROLLOVER).fill_null(False).cast(pl.Int64).cum_sum().alias("turns"))
    last, after = timed["time"][-1], int(turns["turns"][-1])
    if dated:
        year = modified.year
        if _valid_in(last, year) and last.replace(year=year) > modified + timedelta(days=1):
            year -= 1  # (December's lines, the file last written in January)
        moved = pl.col("time").dt.offset_by(pl.format("{}y", pl.lit(year - _NO_YEAR - after) + pl.col("turns")))
        how = f"no year: the file's modification year ({year}) is its last line's"
    else:
        # (a last line later in the day than the file's time, by more than clocks differ: the day before's)
        later = datetime.combine(modified.date(), last.time()) > modified + _ROLLOVER
        last_day = modified.date() - timedelta(days=int(later))
        first_day = last_day - timedelta(days=after)
        moved = pl.col("time") + pl.lit(first_day - date(_NO_YEAR, 1, 1)) + pl.duration(days=pl.col("turns"))
        how = f"no date: the file's modification time puts its last line on {last_day.isoformat()}"

    def on_it(frame: pl.DataFrame) -> pl.DataFrame:
        if frame.is_empty():
            return frame
        at = frame.with_row_index("_row").sort("line").join_asof(turns, on="line", strategy="backward")
        at = at.with_columns(pl.col("turns").fill_null(0)).sort("_row")
        return frame.with_columns(at.select(moved.alias("time"))["time"])

    note = f"times carry {how}, a {'year' if dated else 'day'} added wherever the clock goes back"
    return replace(log, steps=on_it(log.steps), metrics=on_it(log.metrics), superseded=on_it(log.superseded),
                   events=on_it(log.events), detail=on_it(log.detail), notes=(*log.notes, note))


def _valid_in(moment: datetime, year: int) -> bool:
    try:
        moment.replace(year=year)
    except ValueError:  # (29 February)
        return False
    return True


def _extract(lines: pl.LazyFrame, fmt: CustomFormat) -> dict[str, pl.LazyFrame]:
    """Line-local work: each pattern's cheap literal filter, then its regex on the few survivors."""
    text = pl.col("text").str.replace_all(ANSI, "")
    parts = {}
    for i, pattern in enumerate(fmt.patterns):
        found = lines.filter(pl.col("text").str.contains(pattern.literal, literal=True)) if pattern.literal else lines
        parts[f"p{i}"] = (
            found.with_columns(text)
            .filter(pl.col("text").str.contains(pattern.regex))
            .select("line", pl.col("text").str.extract_groups(pattern.regex).alias("g"))
        )
    tb = load_format("custom_loop")
    marks = [tb.traceback_start, tb.traceback_exception] + ([_any(fmt.events)] if fmt.events else [])
    parts["marked"] = lines.filter(pl.col("text").str.contains("|".join(f"(?:{m})" for m in marks))).select("line", text)
    parts["count"] = lines.select(pl.len().alias("lines"), (pl.col("text").str.strip_chars() == "").sum().alias("blank"))
    return parts


def _assemble(path: str, parts: dict[str, pl.DataFrame], fmt: CustomFormat) -> CustomLog:
    notes: list[str] = []
    rows = pl.concat(
        [_values(parts[f"p{i}"], p) for i, p in enumerate(fmt.patterns)], how="vertical_relaxed"
    )
    # A step group that caught no whole number (``12/60``, ``abc``): not a step line, nor the next
    # step's values — unread, and said.
    misread = pl.col("step_text").is_not_null() & pl.col("step").is_null()
    bad = rows.filter(misread)
    if bad.height:
        notes.append(f"{bad['line'].n_unique()} lines matched a pattern with a step group that caught no whole number "
                     f"(e.g. {bad['step_text'][0][:40]!r}): not read")
        rows = rows.filter(~misread)
    rows = rows.drop("step_text")
    steps = rows.filter(pl.col("step").is_not_null()).select("line", "step", "time").unique("line").sort("line")
    if steps.is_empty() and not bad.height:
        notes.append("no step lines (no line matched a pattern with a step group)")
    formats = sorted({p.time_format for p in fmt.patterns if p.time_format})
    if formats and steps.height and steps["time"].null_count() == steps.height:  # a format without samples to check it
        notes.append(f"no time parsed with time_format {' or '.join(map(repr, formats))}: times are null")
    owned = _own(rows, steps, fmt.step_line_at, notes)
    detail = owned.filter(pl.col("micro").is_not_null())
    # One value per (step line, key): micro-steps and phases averaged. A restarted loop appending
    # to the same file goes back to the step it resumed from: the step lines of the attempt before
    # it from there on are abandoned (see :func:`parsers.schema.abandoned`), whether or not the
    # restart got as far; their values are kept apart, cited at their step line (which tells the
    # attempts apart).
    values = (
        owned.group_by("anchor", "key", maintain_order=True)
        # (a mean of the group's values in line order: a grouped mean's sum order, and its last bits,
        # change with the frame's size)
        .agg(pl.col("step").first(), pl.col("time").first(), pl.col("value").implode().list.mean(), pl.col("line").min())
        .sort("anchor")
    )
    # A copy of a step is a run of lines carrying its number (a format may print it on each micro-step).
    copies = (
        steps.group_by(pl.col("step").rle_id().alias("copy"), maintain_order=True)
        .agg(pl.col("step").first(), pl.col("line"), pl.col("time").last())
        .with_columns(abandoned(pl.col("step")).alias("abandoned"))
    )
    gone = copies.filter("abandoned").explode("line")["line"].implode()
    metrics = values.filter(~pl.col("anchor").is_in(gone)).unique(["step", "key"], keep="last", maintain_order=True)
    superseded = values.filter(pl.col("anchor").is_in(gone)).with_columns(pl.col("anchor").alias("line"))
    events, event_lines = _events(parts["marked"], steps, fmt, path)
    counts = parts["count"].sum().row(0, named=True)  # one row per chunk on the chunked path
    matched = pl.concat([rows["line"], event_lines]).n_unique()
    file = pl.lit(path).alias("file")
    return CustomLog(
        path=path,
        format=fmt.name,
        steps=conform(copies.with_columns(pl.col("line").list.last(), file), STEP_SCHEMA),
        metrics=conform(metrics.with_columns(file), METRIC_SCHEMA),
        superseded=conform(superseded.with_columns(file), METRIC_SCHEMA),
        events=conform(events.with_columns(file, pl.lit(fmt.source).alias("source")), EVENT_SCHEMA),
        detail=conform(detail.with_columns(file), DETAIL_SCHEMA),
        lines=int(counts["lines"]),
        unparsed_lines=int(counts["lines"] - counts["blank"] - matched),
        notes=tuple(notes),
    )


def _values(found: pl.DataFrame, pattern: ValuePattern) -> pl.DataFrame:
    """One row per (line, value group): line, step, time, micro, key, value."""
    groups = pattern.groups
    field = pl.col("g").struct.field

    def optional(name: str, expr: pl.Expr, dtype: pl.DataType) -> pl.Expr:
        return (expr if name in groups else pl.lit(None)).cast(dtype).alias(name)

    when = parsed_time(field("time"), pattern.time_format) if pattern.time_format else None
    base = [
        pl.col("line"),
        optional("step", step_number(field("step")), pl.Int64()),
        (field("step") if "step" in groups else pl.lit(None)).cast(pl.String).alias("step_text"),
        optional("time", when if when is not None else pl.lit(None), pl.Datetime("ms")),
        optional("micro", field("micro").cast(pl.Int64, strict=False), pl.Int64()),
    ]
    frames = [
        found.select(*base, _key(template).alias("key"), field(group).cast(pl.Float64, strict=False).alias("value"))
        for group, template in pattern.values.items()
    ]
    return pl.concat(frames).filter(pl.col("value").is_not_null())


def _key(template: str) -> pl.Expr:
    """``phase/{phase}_s`` → an expression filling each ``{group}`` with its slugged text."""
    pieces = _TEMPLATE.split(template)
    exprs = [
        pl.col("g").struct.field(piece).str.to_lowercase().str.replace_all(r"[^a-z0-9]+", "_").str.strip_chars("_")
        if i % 2
        else pl.lit(piece)
        for i, piece in enumerate(pieces)
        if piece or i % 2
    ]
    return pl.concat_str(exprs) if len(exprs) > 1 else exprs[0]


def _own(rows: pl.DataFrame, steps: pl.DataFrame, at: str, notes: list[str]) -> pl.DataFrame:
    """Each value row with the ``step`` and ``anchor`` (the step line's number) it belongs to."""
    rows = rows.sort("line")
    lines = steps.select(pl.col("line").alias("step_line"), pl.col("step").alias("owner"), pl.col("time").alias("owner_time"))
    owned = rows.join_asof(lines, left_on="line", right_on="step_line", strategy="forward" if at == "end" else "backward")
    own_line = pl.col("step").is_not_null()
    owned = owned.with_columns(
        pl.when(own_line).then(pl.col("line")).otherwise(pl.col("step_line")).alias("step_line"),
        pl.coalesce("step", "owner").alias("step"),
        pl.coalesce("time", "owner_time").alias("time"),
    )
    loose = owned.filter(pl.col("step").is_null())
    if loose.is_empty():
        return owned.with_columns(pl.col("step_line").alias("anchor"))
    if at == "end":
        current = _in_progress(steps)
        notes.append(f"{loose['line'].n_unique()} lines after the last step line belong to step {current}, unfinished when the log ends")
        owned = owned.with_columns(pl.col("step").fill_null(current))
    else:
        notes.append(f"{loose['line'].n_unique()} lines before the first step line were skipped")
        owned = owned.filter(pl.col("step").is_not_null())
    return owned.with_columns(pl.col("step_line").fill_null(rows["line"].max() + 1).alias("anchor"))


def _in_progress(steps: pl.DataFrame) -> int:
    """The step after the last step line (in log order: a restart's, not the highest number)."""
    return int(steps.sort("line")["step"][-1]) + 1 if not steps.is_empty() else 0


def _events(marked: pl.DataFrame, steps: pl.DataFrame, fmt: CustomFormat, path: str) -> tuple[pl.DataFrame, pl.Series]:
    """Event lines (first matching pattern wins) and uncaught tracebacks, with their step."""
    tb = load_format("custom_loop")
    kind: Any = pl.lit(None, dtype=pl.String)
    severity: Any = pl.lit(None, dtype=pl.String)
    for pattern in reversed(fmt.events):
        hit = pl.col("text").str.contains(pattern.regex)
        kind = pl.when(hit).then(pl.lit(pattern.kind)).otherwise(kind)
        severity = pl.when(hit).then(pl.lit(pattern.severity)).otherwise(severity)
    named = marked.with_columns(kind.alias("kind"), severity.alias("severity"), pl.col("text").alias("message"))
    exceptions = marked.filter(pl.col("text").str.contains(tb.traceback_exception)).select(
        pl.col("line").alias("exc_line"), pl.col("text").alias("exc_text")
    )
    starts = marked.filter(pl.col("text").str.contains(tb.traceback_start))
    tracebacks = starts.join_asof(exceptions, left_on="line", right_on="exc_line", strategy="forward")
    # An exception line that closes a traceback is part of that one event, not an event of its own.
    named = named.filter(pl.col("kind").is_not_null() & ~pl.col("line").is_in(tracebacks["exc_line"].drop_nulls().implode()))
    used = pl.concat([named["line"], tracebacks["line"], tracebacks["exc_line"].drop_nulls()])
    tracebacks = tracebacks.select(
        "line",
        tb.traceback_kind(pl.col("exc_text").fill_null("")).alias("kind"),
        pl.lit("error").alias("severity"),
        pl.concat_str(pl.col("text"), pl.lit(" … "), pl.col("exc_text").fill_null("(no exception line)")).alias("message"),
    )
    events = pl.concat([named.select("line", "kind", "severity", "message"), tracebacks]).sort("line")
    lines = steps.select(pl.col("line").alias("step_line"), "step")
    strategy = "forward" if fmt.step_line_at == "end" else "backward"
    events = events.join_asof(lines, left_on="line", right_on="step_line", strategy=strategy)
    if fmt.step_line_at == "end" and not steps.is_empty():
        # Where the next step line goes back (a relaunch appending to the log), the event is the
        # dying attempt's, in the step it had begun — unless the relaunch had begun before it.
        above = steps.select(pl.col("line").alias("above_line"), pl.col("step").alias("above"), pl.col("time").alias("above_time"))
        below = steps.select(pl.col("line").alias("below_line"), pl.col("time").alias("below_time"))
        events = (events.join_asof(above, left_on="line", right_on="above_line", strategy="backward")
                  .join_asof(below, left_on="line", right_on="below_line", strategy="forward"))
        begun = _relaunch_begun(path, events.filter(pl.col("step") < pl.col("above")), fmt)
        dying = (pl.col("step") < pl.col("above")) & ~pl.col("line").is_in(begun)
        events = (events.with_columns(pl.when(dying).then(pl.col("above") + 1).otherwise("step").fill_null(_in_progress(steps)).alias("step"))
                  .drop("above_line", "above", "above_time", "below_line", "below_time"))
    return _dated(events, marked, steps, fmt), used


#: How many lines above an event between two attempts are read for a sign the relaunch had begun.
_RELAUNCH_LOOK_BACK = 200


def _relaunch_begun(path: str, between: pl.DataFrame, fmt: CustomFormat) -> list[int]:
    """Of the events ``between`` a dying attempt's last step line and a relaunch's first, those
    after a line of the relaunch's own: a line above them (up to :data:`_RELAUNCH_LOOK_BACK`) whose
    time is nearer the relaunch's first step than the attempt's last (``resuming from …``, then the
    relaunch's handled error). Read back from the file: such events are few."""
    leads = [(lead, p.time_format) for p in fmt.patterns if p.time_format and (lead := _leading_time(p.regex))]
    rows = between.filter(pl.col("above_time").is_not_null() & pl.col("below_time").is_not_null())
    if not leads or rows.is_empty() or not Path(path).is_file():
        return []
    spans = [(r["line"], range(max(r["above_line"] + 1, r["line"] - _RELAUNCH_LOOK_BACK), r["line"])) for r in rows.iter_rows(named=True)]
    try:
        texts = lines_at(path, pl.Series(sorted({n for _, span in spans for n in span}), dtype=pl.Int64))
    except OSError:
        return []
    when: Any = pl.lit(None, dtype=pl.Datetime("ms"))
    for lead, time_format in leads:
        read = parsed_time(pl.col("text").str.extract_groups(lead).struct.field("time"), time_format)
        when = pl.coalesce(when, read)
    timed = texts.select("line", when.alias("time")).drop_nulls("time")
    begun = []
    for line, above_time, below_time in rows.select("line", "above_time", "below_time").iter_rows():
        own = timed.filter(pl.col("line").is_between(max(line - _RELAUNCH_LOOK_BACK, 0), line - 1))["time"]
        if any(t - above_time > below_time - t for t in own):
            begun.append(line)
    return begun


def _dated(events: pl.DataFrame, marked: pl.DataFrame, steps: pl.DataFrame, fmt: CustomFormat) -> pl.DataFrame:
    """``events`` with a ``time``: the line's own, where it starts with the time a metric line
    starts with (``2025-06-01 14:03:12 ERROR …``), else the nearest timed step line's above it (a
    traceback's lines carry none)."""
    own: Any = pl.lit(None, dtype=pl.Datetime("ms"))
    for pattern in fmt.patterns:
        if pattern.time_format and (lead := _leading_time(pattern.regex)):
            read = parsed_time(pl.col("text").str.extract_groups(lead).struct.field("time"), pattern.time_format)
            own = pl.coalesce(own, read)
    texts = marked.select(pl.col("line"), own.alias("own"))
    above = steps.filter(pl.col("time").is_not_null()).select(pl.col("line").alias("timed_line"), pl.col("time").alias("above"))
    return (events.join(texts, on="line", how="left", maintain_order="left")
            .join_asof(above.sort("timed_line"), left_on="line", right_on="timed_line", strategy="backward")
            .with_columns(pl.coalesce("own", "above").alias("time"))
            .drop("own", "timed_line", "above"))


def _leading_time(regex: str) -> str | None:
    """A metric regex up to the end of its ``time`` group, when the time is what its lines begin
    with (``^(?P<time>…) | step …``): the other lines the loop prints begin so too."""
    start = regex.find("(?P<time>")
    if not regex.startswith("^") or start < 0 or "(" in regex[:start].replace("\\(", ""):
        return None
    depth, i, in_class = 0, start, False
    while i < len(regex):
        c = regex[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return regex[: i + 1]
        i += 1
    return None


def _any(events: tuple[EventPattern, ...]) -> str:
    return "|".join(f"(?:{re.sub(r'[(][?]P<[^>]+>', '(?:', p.regex)})" for p in events)


# --- user-declared formats (TOML) -------------------------------------------------------------


def load_custom_format(toml_path: Path | str) -> CustomFormat:
    """Read and check a user's TOML format file.

    Raises:
        FormatDefinitionError: unreadable TOML, an unknown or mistyped key, a bad regex, a
            sample that does not parse; the message names the file and the key.
    """
    where = str(toml_path)
    try:
        data = tomllib.loads(Path(toml_path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise FormatDefinitionError(f"{where}: {exc.strerror or exc}") from exc
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise FormatDefinitionError(f"{where}: {exc}") from exc
    _known(data, _TOP_KEYS, where, "")
    name = _typed(data, "name", str, where, required=True)
    regex = _regex(_typed(data, "regex", str, where, required=True), where, "regex")
    groups = list(re.compile(regex).groupindex)
    if "step" not in groups:
        raise FormatDefinitionError(f"{where}: key 'regex' needs a named group (?P<step>…) for the step number")
    time_format = _typed(data, "time_format", str, where)
    if ("time" in groups) != (time_format is not None):
        raise FormatDefinitionError(f"{where}: key 'time_format' is needed exactly when 'regex' has a (?P<time>…) group")
    values = _typed(data, "values", dict, where)
    if values is None:
        values = {g: g for g in groups if g not in _RESERVED_GROUPS}
    for group, key in values.items():
        if group not in groups:
            raise FormatDefinitionError(f"{where}: key 'values.{group}' names no group of 'regex'")
        if not isinstance(key, str) or not key:
            raise FormatDefinitionError(f"{where}: key 'values.{group}' must be a metric name (a string)")
        for used in _TEMPLATE.findall(key):
            if used not in groups:
                raise FormatDefinitionError(f"{where}: key 'values.{group}' uses {{{used}}}, no group of 'regex'")
    if not values:
        raise FormatDefinitionError(f"{where}: key 'regex' has no value group besides step/time/micro")
    at = _typed(data, "step_line_at", str, where) or "end"
    if at not in ("end", "start"):
        raise FormatDefinitionError(f"{where}: key 'step_line_at' must be \"end\" or \"start\", not {at!r}")
    pattern = ValuePattern(name, regex, dict(values), _typed(data, "literal", str, where), time_format)
    for sample in _strings(data, "samples", where):
        _check_sample(pattern, sample, where)
    events = []
    for i, item in enumerate(_typed(data, "events", list, where) or []):
        here = f"events[{i}]"
        if not isinstance(item, dict):
            raise FormatDefinitionError(f"{where}: key '{here}' must be a table ([[events]])")
        _known(item, _EVENT_KEYS, where, here + ".")
        kind = _typed(item, "kind", str, where, required=True, prefix=here + ".")
        if not re.fullmatch(r"[a-z][a-z0-9_]*", kind):
            raise FormatDefinitionError(f"{where}: key '{here}.kind' must be snake_case, not {kind!r}")
        severity = _typed(item, "severity", str, where, prefix=here + ".") or "warning"
        if severity not in SEVERITIES:
            raise FormatDefinitionError(f"{where}: key '{here}.severity' must be one of {', '.join(SEVERITIES)}")
        event_regex = _regex(_typed(item, "regex", str, where, required=True, prefix=here + "."), where, here + ".regex")
        samples = _strings(item, "samples", where, here + ".")
        for sample in samples:
            if not re.search(event_regex, sample):
                raise FormatDefinitionError(f"{where}: key '{here}.samples': {sample!r} does not match its regex")
        events.append(EventPattern(kind, severity, event_regex, tuple(samples)))
    return CustomFormat(name, where, (pattern,), tuple(events), at)


def _known(data: dict[str, Any], allowed: set[str], where: str, prefix: str) -> None:
    for key in data:
        if key not in allowed:
            raise FormatDefinitionError(f"{where}: unknown key '{prefix}{key}' (allowed: {', '.join(sorted(allowed))})")


def _typed(data: dict[str, Any], key: str, kind: type, where: str, *, required: bool = False, prefix: str = "") -> Any:
    if key not in data:
        if required:
            raise FormatDefinitionError(f"{where}: missing key '{prefix}{key}'")
        return None
    if not isinstance(data[key], kind):
        raise FormatDefinitionError(f"{where}: key '{prefix}{key}' must be a {kind.__name__}")
    return data[key]


def _strings(data: dict[str, Any], key: str, where: str, prefix: str = "") -> list[str]:
    found = _typed(data, key, list, where, prefix=prefix) or []
    if not all(isinstance(s, str) for s in found):
        raise FormatDefinitionError(f"{where}: key '{prefix}{key}' must be a list of strings")
    return found


def _regex(regex: str, where: str, key: str) -> str:
    """``regex`` if both Python and Polars (Rust regex: no look-around, no backreferences) take it."""
    try:
        re.compile(regex)
        pl.select(pl.lit("").str.contains(regex))
    except (re.error, pl.exceptions.PolarsError) as exc:
        # Rust's message is several lines, its reason on the one starting "error:"
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        reason = next((line.removeprefix("error: ") for line in lines if line.startswith("error:")), lines[0] if lines else "")
        raise FormatDefinitionError(f"{where}: key '{key}' is not a usable regex: {reason}") from exc
    return regex


def _check_sample(pattern: ValuePattern, sample: str, where: str) -> None:
    match = re.search(pattern.regex, sample)
    problem = None
    if not match:
        problem = "does not match 'regex'"
    elif pattern.literal and pattern.literal not in sample:
        problem = f"does not contain the literal {pattern.literal!r}"
    elif not match["step"].strip().lstrip("-").isdigit():
        problem = f"step {match['step']!r} is not an integer"
    else:
        for group in pattern.values:
            try:
                float(match[group])
            except (TypeError, ValueError):
                problem = f"group {group!r} = {match[group]!r} is not a number"
        if pattern.time_format and problem is None:
            parsed = pl.select(parsed_time(pl.lit(match["time"]), pattern.time_format)).item()
            if parsed is None:
                problem = f"time {match['time']!r} does not parse with time_format {pattern.time_format!r}"
    if problem:
        raise FormatDefinitionError(f"{where}: key 'samples': {sample!r} {problem}")
