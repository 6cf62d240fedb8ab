"""verl training logs → frames: the console metric lines and the JSON Lines file logger.

Console (``train.log``, a Ray ``job-driver-*.log``, the TaskRunner's ``worker-*.out``): verl prints
one ``step:N - key:value - …`` line per global step through Ray, so it usually carries a
``(TaskRunner pid=N)`` prefix (``(main_task pid=N)`` before March 2025). Values are ``:.3f``
strings up to July 2025 and ``pprint.pformat`` reprs after (``0.0424``, ``np.float64(0.5)``,
``nan``, ``True``). ``step:0`` holds only the validation run before training; a restart that
appends to the same log prints steps again, and the later value wins. Lines a terminal copy
wrapped are re-joined. Console lines carry no time stamp: ``time`` is null (``timing_s/step``
is a metric, not a clock). Everything else in the console (Ray failures, tracebacks, NCCL and
CUDA errors) is read by :mod:`parsers.ray` in the same pass, plus verl's own lines
(``formats/verl.json``: checkpoint saves, resumes, non-finite grad norms).

File logger (``trainer.logger=['console','file']``): ``{"step": N, "data": {key: value}}`` per
line, at ``$VERL_FILE_LOGGER_PATH`` or ``${VERL_FILE_LOGGER_ROOT:-.}/<project>/<experiment>.jsonl``.
NaN and ±Inf were written as ``null``: they come back as NaN.

Example:
    >>> log = read_verl_log(Path("outputs/train.log"))  # doctest: +SKIP
    >>> log.metrics.filter(pl.col("key") == "critic/score/mean")  # doctest: +SKIP
"""

from __future__ import annotations

import ast
import json
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from functools import cache, partial
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

import polars as pl

from parsers._formats import LogFormat, load_format
from parsers._lines import ANSI, collect_lines, ends_mid_line, open_log, sniff, stream_damage
from parsers.ray import RAY_EVENT_SCHEMA, assemble_events, has_prefixes, scan_parts, stitch_parts
from parsers.schema import (
    MAX_STEP,
    METRIC_SCHEMA,
    STEP_SCHEMA,
    abandoned,
    conform,
    keys_kept,
    later_lines_win,
    step_number,
    with_keys,
)

__all__ = ["VerlLog", "first_fact", "looks_like_ray_console", "looks_like_verl_log", "read_verl_log"]


@dataclass(frozen=True)
class VerlLog:
    """What one verl log holds."""

    path: str
    kind: str
    """``verl_console`` or ``verl_jsonl`` (the file logger)."""
    steps: pl.DataFrame
    """A console log's every copy of a step (a restart's and the attempt's it abandoned); the file logger's latest."""
    metrics: pl.DataFrame
    events: pl.DataFrame
    lines: int
    unparsed_lines: int
    notes: tuple[str, ...] = ()
    facts: dict[str, str] = field(default_factory=dict)
    superseded: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=METRIC_SCHEMA))
    """Values of attempts a restart abandoned (from the step it went back to on): not in ``metrics``."""


@cache
def _config() -> dict[str, Any]:
    """The parts of ``formats/verl.json`` the shared format loader does not model."""
    data = json.loads((resources.files("parsers") / "formats" / "verl.json").read_text(encoding="utf-8"))
    return {"step": data["step_line"], "facts": data["facts"]}


@cache
def _console_format() -> LogFormat:
    """Ray's console format with verl's own events tried first."""
    ray, verl = load_format("ray"), load_format("verl")
    return replace(ray, name="verl", source="verl", events=verl.events + ray.events)


def looks_like_verl_log(path: Path) -> bool:
    """True when the head of ``path`` has verl metric lines, verl's trainer prefix or file-logger records."""
    head = re.sub(ANSI, "", sniff(Path(path), 1 << 20))
    return bool(re.search(r"(?m)(?:^|\) )step:\d+ - [^\s:]+:|\((?:TaskRunner|main_task) pid=\d+\)|^\{\"step\": ?\d+, ?\"data\"", head))


def looks_like_ray_console(path: Path) -> bool:
    """True when the head of ``path`` holds a failure this reader's console rules know (a Ray or
    torch error, a traceback): a driver's or worker's console pasted or saved without metric lines."""
    lines = re.sub(ANSI, "", sniff(Path(path), 1 << 20)).splitlines()
    if not lines:
        return False
    fmt = _console_format()
    text = pl.Series(lines, dtype=pl.String)
    for prefix in fmt.prefixes.values():
        text = text.str.replace(prefix, "")
    return bool(text.str.contains(fmt.any_event).any() or text.str.contains(fmt.traceback_start).any())


def read_verl_log(path: Path, *, keys: str | None = None) -> VerlLog:
    """Parse a verl console log or file-logger JSONL (plain or gzipped) into frames.

    ``keys``: a regex; only metrics whose key it finds something in are kept (the file logger's
    other values are dropped batch by batch). ``None`` keeps every key.
    """
    path = Path(path)
    first = next((ln for ln in sniff(path, 64 << 10).splitlines() if ln.strip()), "")
    if first.lstrip().startswith("{") and '"step"' in first:
        return _read_jsonl(path, keys)
    return _read_console(path, keys)


# ---------------------------------------------------------------------------------------------
# Console


def _step_parts(norm: pl.LazyFrame) -> dict[str, pl.LazyFrame]:
    """Metric lines (and the pieces a wrapped copy split them into), config facts."""
    cfg = _config()
    text = pl.col("text")
    is_step = text.str.starts_with(cfg["step"]["start"])
    # A piece of a wrapped copy has no prefix of its own and holds "key:value" text; pieces are
    # kept wherever they are, _joined decides which follow a metric line.
    loose = ~is_step & (pl.col("stream") == "") & text.str.contains(r":|^[\d.eE+-]+$")
    piece = loose & text.str.contains(" - ", literal=True) & text.str.contains(cfg["step"]["continuation"])
    # A wrap can also leave a lone token ("ep:12.5") right under the rest of its line; on a batch's
    # first line the line above is unseen: the token is kept until _stitched knows.
    above = (is_step | piece).shift(1)
    lone = loose & text.str.contains(r"^\S+$")
    return {
        "step_lines": norm.filter(is_step | piece | (lone & above.fill_null(True))).select(
            "line", "text", is_step.alias("is_step"), (is_step | piece).alias("opens"), (lone & above.is_null()).alias("unsure")
        ),
        "facts": norm.filter(text.str.contains(cfg["facts"]) | text.str.contains("Total training steps: ", literal=True)
                             | text.str.contains(_OVERRIDES, literal=True)).select("line", "text"),
    }


def _stitched(pieces: dict[str, list[pl.DataFrame]]) -> dict[str, pl.DataFrame]:
    """:func:`stitch_parts`, and a batch's first-line token kept only under a metric line or piece."""
    parts = stitch_parts(pieces)
    rows = parts["step_lines"]
    opening = rows.filter(pl.col("opens"))["line"] + 1
    kept = rows.filter(~pl.col("unsure") | pl.col("line").is_in(opening.implode()))
    return {**parts, "step_lines": kept.drop("opens", "unsure")}


def _read_console(path: Path, keys: str | None = None) -> VerlLog:
    fmt = _console_format()
    prefixed = has_prefixes(path, fmt)
    parts = collect_lines(path, lambda lines: scan_parts(lines, fmt, extra=_step_parts, prefixed=prefixed), _stitched,
                          heavy=True, finish=partial(_read_batch, keys=keys))
    log = assemble_events(str(path), "verl_console", parts, fmt, source="verl")
    step_lines, cut = _without_a_cut_value(parts.pop("step_lines"), path, log.lines)
    # What the batches read, and the records their edges cut, read now that they are whole again.
    read = _metrics([parts, _read_records(_joined(step_lines), keys)], str(path))
    joined, metrics, superseded, steps = read.records, read.metrics, read.superseded, read.steps
    orphans, bad = read.orphans, read.bad
    events, notes = _resumes(joined, _with_steps(log.events, joined), str(path))
    events = _resumed_into(events, pl.concat([metrics, superseded]))
    if not joined.is_empty() and joined["step"].min() == 0 and steps.filter(pl.col("step") == 0).is_empty():
        notes.append("step 0 holds only the validation run before training (val_before_train)")
    if orphans:
        notes.append(f"{orphans} lines look like pieces of a wrapped metric line but follow none")
    if bad:
        notes.append(f"{bad} metric values were not numbers and were skipped")
    if cut:
        notes.append("the log's last line has no newline after it (cut off while it was written): its last value was skipped")
    if steps.height:
        notes.append("console lines carry no time: step and metric times are null (timing_s/step holds each step's duration)")
    else:
        notes.append("no verl step:N metric lines")
    return VerlLog(
        path=str(path),
        kind="verl_console",
        steps=steps,
        metrics=metrics,
        events=events,
        lines=log.lines,
        unparsed_lines=orphans + bad,
        notes=tuple([*(n for n in log.notes if not n.startswith("console lines carry no time")), *notes]),
        facts=_facts(parts["facts"]),
        superseded=superseded,
    )


def _without_a_cut_value(step_lines: pl.DataFrame, path: Path, last_line: int) -> tuple[pl.DataFrame, bool]:
    """``step_lines`` without the last ``key:value`` of a metric line the log ends inside (no newline
    after it, or a torn .gz): it may be cut inside its number (``critic/score/mean:0.`` read as 0);
    and whether one was cut off."""
    at_the_end = pl.col("line") == last_line
    if not (ends_mid_line(path) or stream_damage(path)) or not step_lines.select(at_the_end.any()).item():
        return step_lines, False
    paired = pl.col("text").str.contains(" - ", literal=True)
    last_pair = pl.col("text").str.extract(r"^(.*) - ", 1)  # (greedy: up to the last separator)
    # (a line cut before its first pair, ``step:1`` of ``step:15``, may be cut inside its step: not read)
    return (step_lines.filter(~(at_the_end & ~paired))
            .with_columns(pl.when(at_the_end).then(last_pair).otherwise(pl.col("text")).alias("text"))), True


#: Where another print starts inside a metric line: a Ray worker prefix or ``step:N - `` right after
#: a value's last character (a key such as ``global_step`` ends in a letter or ``_``).
_MET = r"([\d)]|nan|inf|True|False)(\((?:[^()]*? )?pid=\w+(?:, ip=[\d.]+)?\) ?|step:\d+ - )"
_LATER_PREFIX = r"^\((?:[^()]*? )?pid=\w+(?:, ip=[\d.]+)?\) ?"
#: Bytes of metric-line text read into records and tokens at a time.
_SLICE_BYTES = 4 << 20


def _joined(rows: pl.DataFrame) -> Iterator[pl.DataFrame]:
    """Metric records, a slice of about :data:`_SLICE_BYTES` of text at a time: each metric line
    with the pieces that directly follow it appended, ``line, step, rest`` (``step`` null where a
    line's step is damaged). Pieces with no metric line above come as a slice of their own, ``line``
    only."""
    rows = rows.sort("line").with_columns(
        # A block of consecutive lines; a piece belongs to the metric line that opens its block.
        (pl.col("line") != pl.col("line").shift(1) + 1).fill_null(True).cum_sum().alias("block"),
        pl.col("is_step").cum_sum().alias("record"),
    )
    attached = pl.col("is_step") | (pl.col("is_step").cast(pl.Int32).cum_sum().over("block") > 0)
    rows = rows.with_columns(attached.alias("attached"))
    yield rows.filter(~pl.col("attached")).select("line")
    rows = rows.filter("attached")
    if rows.is_empty():
        return
    # Slices end where a record does: a record's first row starts a new slice once the text
    # before it fills one (the rows are a view of the batch's text, sliced without a copy).
    filled = rows.select("record", (pl.col("text").str.len_bytes().cum_sum() // _SLICE_BYTES).alias("slice"))
    starts = filled.select(pl.col("slice").first().over("record")).with_row_index()
    cuts = starts.filter(pl.col("slice") != pl.col("slice").shift(1).fill_null(-1))["index"].to_list()
    for begin, end in zip(cuts, [*cuts[1:], rows.height], strict=True):
        yield _records(rows.slice(begin, end - begin))


def _records(rows: pl.DataFrame) -> pl.DataFrame:
    """Whole records of metric lines and their pieces → ``line, step, rest``."""
    # A hard wrap cuts anywhere, even inside a number: glue the pieces back as they were.
    frame = rows.group_by("record", maintain_order=True).agg(pl.col("line").first(), pl.col("text").str.join(""))
    # Prints that met on one line (a metric line lost its newline): each record is read on its own,
    # else the next one's values would overwrite these under this step; other prints are the
    # event reader's (it reads the whole line).
    frame = (
        frame.with_columns(pl.col("text").str.replace_all(_MET, "$1\n$2").str.split("\n"))
        .explode("text")
        .with_columns(pl.col("text").str.replace(_LATER_PREFIX, ""), pl.int_range(pl.len()).over("record").alias("piece"))
        .filter((pl.col("piece") == 0) | pl.col("text").str.starts_with(_config()["step"]["start"]))
    )
    # ``step:N``, then nothing or `` - key:value…``: split, not one regex capturing the whole line.
    start, separator = _config()["step"]["start"], _config()["step"]["separator"]
    text = pl.col("text").str.strip_chars_end()
    digits = text.str.extract(f"^{re.escape(start)}(\\d+)")
    rest = text.str.slice(len(start) + digits.str.len_chars())
    whole = digits.is_not_null() & ((rest == "") | rest.str.starts_with(separator))
    return frame.select("line", step_number(pl.when(whole).then(digits)).alias("step"), pl.when(whole).then(rest).alias("rest"))


def _read_batch(done: dict[str, pl.DataFrame], keys: str | None) -> dict[str, pl.DataFrame]:
    """A batch's metric records read into values in the batch's own thread (see
    :func:`_read_records`), but for those its edges may cut: the rows before its first metric line
    and its last record stay text, for :func:`_stitched` to join with the batches' around it."""
    rows = done["step_lines"]
    record = rows["is_step"].cum_sum()
    inner = (record > 0) & (record < (record.max() or 0))
    # The edges' text copied: a filtered view would keep the whole batch's text alive to the end.
    edges = rows.filter(~inner).with_columns(pl.concat_str(pl.col("text"), pl.lit("")))
    return {**done, "step_lines": edges, **_read_records(_joined(rows.filter(inner)), keys)}


def _read_records(slices: Iterator[pl.DataFrame], keys: str | None) -> dict[str, pl.DataFrame]:
    """Record slices (:func:`_joined`) → ``records`` (``line, step``), ``copies`` (whether each
    record trains: not validation alone), ``values`` of the keys ``keys`` (a regex) finds something
    in (all for ``None``), and ``counts`` of what could not be read: lines that follow no metric
    line or have a damaged step (``orphans``) and values that are not numbers (``bad``)."""
    validation = _config()["step"]["validation_keys"]
    orphans = next(slices).height
    records, copies, values, bad = [_NO_RECORDS], [_NO_COPIES], [_NO_VALUES], 0
    # A slice at a time: a line's hundred tokens are rows only while its slice is read, and only
    # the kept keys' values outlive it.
    for part in slices:
        orphans += part["step"].null_count()
        part = part.filter(pl.col("step").is_not_null())
        records.append(part.select("line", "step"))
        tokens = _tokens(part)
        bad += tokens["value"].null_count()
        tokens = tokens.filter(pl.col("value").is_not_null())
        checks = keys_kept(tokens, validation)  # (None: every key is one)
        trains = ~pl.col("key").is_in(checks) if checks is not None else pl.lit(False)
        copies.append(tokens.group_by("line", "step", maintain_order=True).agg(trains.any().alias("trains")))
        values.append(with_keys(tokens, keys))
    counts = pl.DataFrame({"orphans": [orphans], "bad": [bad]}, schema={"orphans": pl.Int64, "bad": pl.Int64})
    return {"records": pl.concat(records), "copies": pl.concat(copies), "values": pl.concat(values), "counts": counts}


_NO_RECORDS = pl.DataFrame(schema={"line": pl.Int64, "step": pl.Int64})
_NO_COPIES = pl.DataFrame(schema={"line": pl.Int64, "step": pl.Int64, "trains": pl.Boolean})
_NO_VALUES = pl.DataFrame(schema={"line": pl.Int64, "step": pl.Int64, "key": pl.Categorical, "value": pl.Float64})


class _Read(NamedTuple):
    records: pl.DataFrame
    """``line, step`` of every metric record, in log order."""
    metrics: pl.DataFrame
    superseded: pl.DataFrame
    steps: pl.DataFrame
    orphans: int
    """Pieces of wrapped lines that follow no metric line, and metric lines with a damaged step."""
    bad: int
    """Values that are not numbers."""


def _metrics(reads: list[dict[str, pl.DataFrame]], path: str) -> _Read:
    """What :func:`_read_records` read, in parts of the log → the run's metric rows, those of
    attempts a restart abandoned, every training step's copies, and the counts of what could not
    be read.

    A restart appending to the log goes back to the step it resumed from: the lines of the attempt
    before it that log that step or a later one are abandoned (see :func:`parsers.schema.abandoned`),
    whether or not the restart got as far. Validation alone (``val_before_train`` at the resumed
    step) goes back nowhere. Of what is left, a step's key logged twice keeps its later value.
    """
    def whole(name: str) -> pl.DataFrame:  # (records that met on one line keep their order)
        return pl.concat([read[name] for read in reads]).sort("line", maintain_order=True)

    orphans, bad = pl.concat([read["counts"] for read in reads]).sum().row(0)
    # (Records that met on one line are each a copy of their own step.)
    copy = (
        whole("copies")
        .group_by("line", "step", maintain_order=True)
        .agg(pl.col("trains").any())
        .filter("trains")
        .with_columns(abandoned(pl.col("step")).alias("abandoned"))
    )
    values = whole("values")
    gone = copy.filter("abandoned").select("line", "step")
    kept, superseded = values, values.clear()
    if gone.height:  # (no restart, nothing to join: a long run's values are not copied)
        kept = values.join(gone, on=["line", "step"], how="anti", maintain_order="left")
        superseded = values.join(gone, on=["line", "step"], how="semi", maintain_order="left")
    kept = kept.unique(["step", "key"], keep="last", maintain_order=True).sort("step", "line")
    steps = copy.select("step", "line", pl.lit(path).alias("file"))
    return _Read(whole("records"), _rows(kept, path), _rows(superseded, path), conform(steps, STEP_SCHEMA), orphans, bad)


def _tokens(part: pl.DataFrame) -> pl.DataFrame:
    """A slice of metric lines as one row per ``key:value`` token: ``line, step, key, value``
    (null where the value is not a number)."""
    tokens = (
        part.lazy()
        .select("line", "step", pl.col("rest").str.split(_config()["step"]["separator"]).list.slice(1).alias("token"))
        .explode("token")
        .filter(pl.col("token").is_not_null() & (pl.col("token") != ""))
        .select("line", "step", pl.col("token").str.splitn(":", 2).struct.rename_fields(["key", "raw"]).alias("kv"))
        .unnest("kv")
        .select("line", "step", pl.col("key").cast(pl.Categorical), pl.col("raw").str.strip_chars())
        .collect()
    )
    raw = tokens["raw"]
    value = _number(raw)
    # numpy's other scalars and torch's tensors (``np.int64(3)``, ``tensor(0.5, device='cuda:0')``):
    # the regex runs on what the plain reading left, a few tokens, not on every one.
    odd = (value.is_null() & raw.str.ends_with(")")).arg_true()
    if odd.len():
        value = value.scatter(odd, _number(raw.gather(odd).str.replace(_config()["step"]["numpy_scalar"], "$1")))
    return tokens.select("line", "step", "key", value.alias("value"))


def _number(raw: pl.Series) -> pl.Series:
    """A value's text as a number: a float, ``True``/``False``, or ``np.float64(…)`` (verl's
    ``pprint`` reprs since July 2025); null otherwise."""
    inner = raw.str.strip_prefix("np.float64(").str.strip_suffix(")")
    scalar = raw.str.starts_with("np.float64(") & raw.str.ends_with(")")
    return pl.select(
        pl.when(raw.is_in(["True", "np.True_"]))
        .then(pl.lit(1.0))
        .when(raw.is_in(["False", "np.False_"]))
        .then(pl.lit(0.0))
        .when(scalar)
        .then(inner.cast(pl.Float64, strict=False))
        .otherwise(raw.cast(pl.Float64, strict=False))
    ).to_series()


def _rows(values: pl.DataFrame, path: str) -> pl.DataFrame:
    """``line, step, key, value`` rows as the metric schema's, from ``path``."""
    return conform(values.with_columns(pl.lit(path).alias("file"), pl.lit("verl").alias("source")), METRIC_SCHEMA)


def _training(metrics: pl.DataFrame) -> pl.DataFrame:
    """The training values of ``metrics``: not the validation run's (a validation-only line is no step)."""
    return metrics.filter(~pl.col("key").cast(pl.String).str.contains(_config()["step"]["validation_keys"]))


def _steps(metrics: pl.DataFrame, path: str) -> pl.DataFrame:
    """Training steps (a validation-only line is not one), each at the last line that logged it."""
    rows = _training(metrics).group_by("step").agg(pl.col("line").max()).sort("step")
    return conform(rows.with_columns(pl.lit(path).alias("file")), STEP_SCHEMA)


def _with_steps(events: pl.DataFrame, joined: pl.DataFrame) -> pl.DataFrame:
    """Events between the ``step:N`` line and the next happened during step N + 1 (verl prints a
    step's metrics when the step is over)."""
    if events.is_empty() or joined.is_empty():
        return events
    marks = joined.select(pl.col("line").alias("step_line"), (pl.col("step") + 1).alias("during")).sort("step_line", maintain_order=True)
    placed = events.sort("line").join_asof(marks, left_on="line", right_on="step_line", strategy="backward")
    return placed.with_columns(pl.coalesce("step", "during").alias("step")).select(events.columns)


def _resumed_into(events: pl.DataFrame, values: pl.DataFrame) -> pl.DataFrame:
    """A resume's step: the first training step logged after its line, the one it resumed into (as
    a relaunch's resume line is, by time, in a timed log), not the step the attempt it ended had in
    progress. ``values``: every metric row of the log, an abandoned attempt's too."""
    if not (events["kind"] == "run_resumed").any():
        return events
    trained = _training(values).group_by("line").agg(pl.col("step").first().alias("into")).sort("line")
    placed = (events.with_row_index("_at").sort("line")
              .join_asof(trained.select(pl.col("line").alias("_line"), "into"), left_on="line", right_on="_line", strategy="forward")
              .sort("_at"))
    resumed = (pl.col("kind") == "run_resumed") & pl.col("into").is_not_null()
    return placed.with_columns(pl.when(resumed).then(pl.col("into")).otherwise(pl.col("step")).alias("step")).select(events.columns)


def _resumes(joined: pl.DataFrame, events: pl.DataFrame, path: str) -> tuple[pl.DataFrame, list[str]]:
    """A step that is not above the one logged before it means the run restarted into the same log.

    Where verl's own resume line is missing between the two, a ``run_resumed`` event marks it.
    """
    if joined.height < 2:
        return events, []
    ordered = joined.sort("line", maintain_order=True).with_columns(
        pl.col("step").shift(1).alias("before"), pl.col("line").shift(1).alias("previous_line")
    )
    # Training only moves forward; a step at or below the one just logged (the validation line
    # at the resumed step included) is where a restart begins.
    restarts = ordered.filter(pl.col("step") <= pl.col("before"))
    if restarts.is_empty():
        return events, []
    explicit = events.filter(pl.col("kind") == "run_resumed")["line"]
    marks = []
    for line, step, before, previous in restarts.select("line", "step", "before", "previous_line").iter_rows():
        if not explicit.filter((explicit > previous) & (explicit < line)).is_empty():
            continue
        marks.append(
            {
                "time": None,
                "step": step,
                "source": "verl",
                "kind": "run_resumed",
                "severity": "warning",
                "file": path,
                "line": line,
                "message": f"step:{step} logged again after step:{before}: the run restarted and appended to this log",
                "count": 1,
            }
        )
    added = pl.DataFrame(marks, schema={k: v for k, v in RAY_EVENT_SCHEMA.items() if k in marks[0]} if marks else None)
    merged = pl.concat([events, added], how="diagonal_relaxed").sort("line") if marks else events
    repeated = joined.group_by("step").len().filter(pl.col("len") > 1).height
    note = (f"{repeated} steps were logged more than once (restarts appending to this log): an attempt's values from "
            "the step a restart went back to are the abandoned attempt's, not the run's")
    return merged.select(events.columns), [note]


#: Facts a later line sets over an earlier one's; of the rest, the first printed config's are kept
#: (a relaunch appending to the log prints its own).
LATER_FACTS = frozenset({"total_training_steps", "launch_overrides"})


def _facts(rows: pl.DataFrame) -> dict[str, str]:
    """Run settings from the config verl prints at start (``pprint`` of the resolved config): see :data:`LATER_FACTS`."""
    facts: dict[str, str] = {}
    regex = re.compile(_config()["facts"])
    for text in rows.sort("line")["text"]:
        for key, value in regex.findall(text):
            facts.setdefault(key, value.strip("'"))
        if found := re.search(r"Total training steps: (\d+)", text):
            # What the trainer computed wins over the config's own (``None``: "from the epochs").
            facts["total_training_steps"] = found[1]
        if _OVERRIDES in text and (overrides := _listed(text.split(_OVERRIDES, 1)[1])) is not None:
            facts["launch_overrides"] = shlex.join(overrides)
    return facts


#: Hydra's line when the job raised: the command line's overrides, as a Python list.
_OVERRIDES = "Error executing job with overrides: "


def first_fact(path: Path, name: str, chunk_bytes: int = 8 << 20) -> str | None:
    """The first value of the config fact ``name`` (``default_local_dir``) the console at ``path``
    printed, as :func:`read_verl_log` keeps it, found by a byte search instead of a parse (what a
    caller must know before the log is parsed); ``None`` where none is, or the file cannot be read."""
    wanted, regex = f"'{name}': ".encode(), re.compile(_config()["facts"])
    try:
        with open_log(path) as fh:
            carry = b""
            while chunk := fh.read(chunk_bytes):
                data, at = carry + chunk, 0
                while (at := data.find(wanted, at)) >= 0:
                    start, end = data.rfind(b"\n", 0, at) + 1, data.find(b"\n", at)
                    if end < 0:  # (the line goes on in the next chunk)
                        break
                    line = data[start:end].decode("utf-8", errors="replace")
                    if value := next((v.strip("'") for k, v in regex.findall(line) if k == name), None):
                        return value
                    at = end
                carry = data[data.rfind(b"\n") + 1:]
                if len(carry) > chunk_bytes:  # (one line longer than a chunk: no config line)
                    carry = b""
            line = carry.decode("utf-8", errors="replace")
            return next((v.strip("'") for k, v in regex.findall(line) if k == name), None)
    except OSError:
        return None


def _listed(text: str) -> list[str] | None:
    """``['a=1', 'b=x']`` → its strings; ``None`` when the text is not such a list."""
    try:
        value = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, list) and all(isinstance(v, str) for v in value) else None


# ---------------------------------------------------------------------------------------------
# File logger


_VALUES = {"step": pl.Int64, "line": pl.Int64, "key": pl.String, "value": pl.Float64}


class _Mixed(Exception):
    """A batch whose values Polars cannot be trusted to have typed."""


def _file_logger_values(parts: dict[str, pl.DataFrame], keys: str | None) -> dict[str, pl.DataFrame]:
    """One batch of ``{"step": N, "data": {…}}`` lines → metric rows of ``keys`` (``values``) and counts.

    Polars decodes the lines; those it cannot type for sure — lines with a ``null`` (a NaN or ±Inf
    written as null must stay apart from a key not logged), and a batch with a line that is not
    JSON or a value that is not a number or a boolean — are read line by line here.
    """
    rows = parts["rows"]
    has_null = rows["text"].str.contains("null", literal=True)
    careful = rows.filter(has_null)
    try:
        values = _decoded(rows.filter(~has_null))
    except (pl.exceptions.PolarsError, _Mixed):
        values, careful = pl.DataFrame(schema=_VALUES), rows
    records, nulls, skipped, broken = _line_by_line(careful)
    counts = pl.DataFrame({"nulls": [nulls], "skipped": [skipped], "broken": [broken], "last": [rows["line"].max()]})
    values = with_keys(pl.concat([values, pl.DataFrame(records, schema=_VALUES, orient="row")]), keys)
    return {
        "values": values.with_columns(pl.col("key").cast(pl.Categorical)),
        "steps": values.select("line", "step").unique(),  # which step each line logged
        "counts": counts,
    }


def _decoded(rows: pl.DataFrame) -> pl.DataFrame:
    """Lines without a ``null`` whose values are all numbers or booleans → metric rows."""
    if rows.is_empty():
        return pl.DataFrame(schema=_VALUES)
    # The Series method infers the types from every line (a key first logged late is still seen).
    records = rows.select("line").with_columns(rows["text"].str.json_decode(infer_schema_length=None).alias("r")).unnest("r")
    if "data" not in records.columns or "step" not in records.columns:
        raise _Mixed
    if not (records.schema["step"].is_integer() and isinstance(records.schema["data"], pl.Struct)):
        raise _Mixed
    if records.select(pl.col("step").is_null().any() | pl.col("data").is_null().any()).item():
        raise _Mixed
    fields = records.schema["data"].fields
    # Only numbers and booleans are typed for sure: Polars makes a list of a number logged where a
    # list was, a string of a boolean logged where a string was.
    if not all(f.dtype.is_numeric() or f.dtype == pl.Boolean for f in fields):
        raise _Mixed
    data = records.select("line", "step", pl.col("data").struct.unnest())  # a key named line or step: an error, the careful path
    numbers = [f.name for f in fields]
    long = data.select("line", "step", *(pl.col(n).cast(pl.Float64) for n in numbers)).unpivot(
        index=["line", "step"], variable_name="key", value_name="value"
    )
    return long.filter(pl.col("value").is_not_null()).select(list(_VALUES))


def _line_by_line(rows: pl.DataFrame) -> tuple[list[tuple[int, int, str, float]], int, int, int]:
    """Lines read one by one: metric rows, and the counts of null values, values that are not
    numbers and lines that are not records."""
    records: list[tuple[int, int, str, float]] = []
    broken = nulls = skipped = 0
    for line, text in rows.iter_rows():
        try:
            record = json.loads(text)
            step, data = int(record["step"]), record["data"]
            if not isinstance(data, dict) or not 0 <= step <= MAX_STEP:
                raise TypeError
        except (ValueError, KeyError, TypeError, OverflowError):
            broken += 1
            continue
        for key, value in data.items():
            if value is None:
                nulls += 1
                records.append((step, line, key, float("nan")))
            elif isinstance(value, (bool, int, float)):
                records.append((step, line, key, float(value)))
            else:
                skipped += 1
    return records, nulls, skipped, broken


def _read_jsonl(path: Path, keys: str | None) -> VerlLog:
    parts = collect_lines(
        path, lambda lines: {"rows": lines.filter(pl.col("text").str.strip_chars() != "")}, heavy=True, finish=partial(_file_logger_values, keys=keys)
    )
    counts = parts["counts"]
    nulls, skipped, broken = (int(counts[name].sum() or 0) for name in ("nulls", "skipped", "broken"))
    last = int(counts["last"].max() or 0)
    again = parts["steps"].filter(pl.col("step").is_duplicated())["step"].unique()
    values = later_lines_win(parts.pop("values"), again)
    # In step order, each line's values by key (the order a line lists them is not kept by Polars' decoder).
    metrics = values.sort("step", "line", pl.col("key").cast(pl.String)).with_columns(
        pl.lit(str(path)).alias("file"), pl.lit("verl").alias("source")
    )
    metrics = conform(metrics, METRIC_SCHEMA)
    notes = ["the file logger writes no time: step and metric times are null"]
    if nulls:
        notes.append(f"{nulls} values were null (the file logger writes NaN and ±Inf as null): read as NaN")
    if skipped:
        notes.append(f"{skipped} values were not numbers (strings, lists) and were skipped")
    if broken:
        notes.append(f"{broken} lines are not {{\"step\": N, \"data\": {{…}}}} records (a write cut short?)")
    facts = {"project_name": path.parent.name, "experiment_name": path.name.removesuffix(".gz").removesuffix(".jsonl")}
    return VerlLog(
        path=str(path),
        kind="verl_jsonl",
        steps=_steps(metrics, str(path)),
        metrics=metrics,
        events=pl.DataFrame(schema=RAY_EVENT_SCHEMA),
        lines=last,
        unparsed_lines=broken,
        notes=tuple(notes),
        facts=facts,
    )
