"""Why a finding happened: compare what the logs said around its onset with what they said
before, and name the first kind of failure that stands out.

The comparison is a log-rate test per event kind: events in a window of steps around the
onset against a baseline window before it, scored with a Poisson tail probability.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import polars as pl

from forensics.align import assign_steps
from forensics.detect import (
    NUMERIC_HEALTH_IN_TEXT,
    REWARD_IN_TEXT,
    Finding,
    from_server,
    launches,
    raised,
    server_named,
    servers_named,
)
from forensics.model import Cause, Evidence, step_span
from forensics.parsed import rows_where
from forensics.server_context import ServerContext, server_context
from forensics.texts import from_lines, with_messages
from parsers.schema import stream_of

#: Event kinds grouped by the cause they point to. Order breaks ties between equal times.
CAUSE_OF_KIND: dict[str, Cause] = {
    "kv_cache_oom": "inference_server_oom",
    "kv_cache_retract": "inference_server_oom",
    "server_exit": "inference_server_crash",
    "connection_refused": "inference_server_crash",
    "connection_reset": "inference_server_crash",
    "child_crash": "inference_server_crash",
    "scheduler_exception": "inference_server_crash",
    "server_launch_failed": "inference_server_crash",
    "request_timeout": "inference_server_unresponsive",
    "client_disconnected": "inference_server_unresponsive",
    "watchdog_timeout": "inference_server_unresponsive",
    "health_check_failed": "inference_server_unresponsive",
    "nccl_timeout": "nccl_timeout",
    "nccl_error": "nccl_timeout",
    "actor_died": "training_worker_crash",
    "worker_died": "training_worker_crash",
    "node_dead": "training_worker_crash",
    "raylet_died": "training_worker_crash",
    "segfault": "training_worker_crash",
    "illegal_memory_access": "training_worker_crash",
    "fatal_check": "training_worker_crash",
    "host_oom_kill": "training_worker_crash",
    "job_exit": "training_worker_crash",
    "process_killed": "training_worker_crash",
    "cuda_oom": "training_worker_crash",
    "nan_inf": "numerical_divergence",
    "zero_advantages": "reward_pipeline",
    "zero_logprobs": "loss_computation",
}
#: Failures whose cause is in their text: a rollout gave up after a timeout, or a refusal.
_CAUSE_IN_MESSAGE: tuple[tuple[str, Cause], ...] = (
    (r"Connect call failed|Cannot connect|ConnectionRefused|Connection refused", "inference_server_crash"),
    (r"ServerDisconnected|Server disconnected|Connection reset", "inference_server_crash"),
    (r"TimeoutError|timed out", "inference_server_unresponsive"),
)
_AMBIGUOUS = {"workflow_failed", "retries_exhausted", "traceback", "log_error"}
#: A failure kind logged this often in the baseline, and no more often around the onset than
#: there, is the run's usual noise (a slow request timing out now and then): it explains nothing.
_USUAL = 3


@dataclass(frozen=True)
class Verdict:
    cause: Cause
    confidence: float
    evidence: tuple[Evidence, ...]
    explanation: str
    seen: dict[str, int] = field(default_factory=dict)
    """Events of each kind in the window around the onset."""


@dataclass(frozen=True)
class _Windows:
    window: tuple[int, int]
    baseline: tuple[int, int]


def explain(
    finding: Finding,
    events: pl.DataFrame,
    metrics: pl.DataFrame,
    onset_time: datetime | None,
    *,
    has_server_log: bool = True,
    unseen: str | None = None,
    not_due: str | None = None,
    clock: pl.DataFrame | None = None,
    attributed: pl.DataFrame | None = None,
    window_before: int = 3,
    window_after: int = 2,
    baseline: int = 50,
) -> Verdict:
    """Name the cause of ``finding`` from ``events`` and the server's metrics (steps assigned).
    ``unseen`` says why no log could show a failure at the onset: then finding none is no finding;
    ``not_due``, why a hung server's could not show yet: then neither, unless the server's own log
    shows it answering.
    With the run's step ``clock`` (``time, step``), a timeout logged when it ran out counts at every
    step its request was waiting in: one sent at the onset and logged an hour later is the onset's.
    ``attributed``: :func:`attribute` of ``events`` and ``clock``, made once for a run's incidents."""
    onset = finding.onset_step
    if finding.kind == "stall":
        spans = _Windows((onset, onset), (max(onset - baseline, 0), onset - 1))
    else:
        first = max(onset - window_before, 0)
        # (a slow decline's failures may begin anywhere in it: its window runs to where it had fallen)
        last = max(onset + window_after, finding.fell_by or onset)
        spans = _Windows((first, last), (max(first - baseline, 0), first - 1))
    if clock is not None and not clock.is_empty():
        spans = _within_the_log(spans, int(clock["step"].min()))
    attributed = attributed if attributed is not None else attribute(events, clock)
    # (slices where the rows lie together: a flood's window copied whole took half a gigabyte)
    in_window = rows_where(attributed, _during(spans.window))
    in_baseline = rows_where(attributed, _during(spans.baseline) & ~_during(spans.window))
    scores = _rate_test(in_window, in_baseline, spans)
    standing_out = scores.filter(pl.col("p_value") < 0.01)
    seen = dict(_failures(in_window, "kind").iter_rows())
    server = server_context(_failing_servers_rows(metrics, events, in_window), onset, onset_time, spans.window,
                            has_server_log=has_server_log)

    if finding.diverged:
        return Verdict(
            "numerical_divergence",
            0.85,
            _evidence(in_window, "numerical_divergence"),
            "The training numbers themselves went non-finite; the optimizer cannot recover from that on its own.",
            seen,
        )
    if finding.kind == "dead_loss":  # what the numbers show is the cause; the lines around it say how
        return Verdict(
            "loss_computation",
            0.8,
            _evidence(in_window, "loss_computation"),
            "Rewards still differed, so the advantages were live, yet the loss was exactly 0: the loss computation "
            "dropped them (sequence log-probs zeroed, an empty loss mask, a loss multiplied by 0), not the rewards "
            "and not the infrastructure.",
            seen,
        )
    usual = scores.filter((pl.col("in_baseline") >= _USUAL) & (pl.col("p_value") >= 0.01))
    # A root failure decides even when seen once (a server's watchdog firing on its hang, then
    # its exit and a flood of refused connections that stand out far more).
    roots = pl.col("kind").is_in(_ROOT_KINDS) & ~pl.col("kind").is_in(usual["kind"].implode())
    deciding = in_window.filter(pl.col("cause").is_not_null() & (pl.col("kind").is_in(standing_out["kind"].implode()) | roots))
    if deciding.is_empty():  # none stands out: a rare failure still decides, the run's usual ones do not
        deciding = in_window.filter(pl.col("cause").is_not_null() & ~pl.col("kind").is_in(usual["kind"].implode()))
    if deciding.is_empty() and (unseen or (not_due if server.answering is not True else None)):
        return Verdict("unknown", 0.2, server.evidence, " ".join([unseen or not_due or "", *server.sentences]), seen)
    if deciding.is_empty():
        return _no_fault(finding, in_window, spans, seen, server, scores, _undated(events))

    cause = _root_cause(deciding)
    first = _by_time(in_window.filter(pl.col("cause") == cause), 1).row(0, named=True)
    if cause == "inference_server_crash" and _memory_first(in_window, first):
        cause = "inference_server_oom"
    kinds = scores.filter(pl.col("cause") == cause)
    # (what the cause brings about counts for it: a server that ran out of memory then refused connections)
    brought = scores.filter(pl.col("cause").is_in(_BRINGS_ABOUT.get(cause, ())))
    best_p = float(pl.concat([kinds, brought])["p_value"].min()) if kinds.height + brought.height else 1.0
    rivals = standing_out.filter(pl.col("cause").is_not_null() & (pl.col("cause") != cause) & (pl.col("cause") != "inference_server_oom"))
    confidence = 0.9 if best_p < 1e-3 else 0.75 if best_p < 0.01 else 0.55
    if cause == "inference_server_unresponsive" and not rivals.is_empty():
        confidence -= 0.1
    if cause == "inference_server_unresponsive" and server.silent_before_onset:
        confidence += 0.1
    if finding.kind == "crash":
        confidence = max(confidence, 0.85)  # a process death is seen, not inferred
    parts = [_explain_rates(kinds, spans, first), _logged_later(in_window, spans, cause), _brought_about(brought), _what_died(in_window), *server.sentences, _escalation(attributed, spans, cause)]
    explanation = " ".join(p for p in parts if p)
    deciding_lines = _evidence(in_window, cause)
    evidence = deciding_lines[:12] + server.evidence + _later_evidence(attributed, spans, cause) + deciding_lines[12:]
    return Verdict(cause, round(min(confidence, 0.95), 2), evidence[:20], explanation.strip(), seen)


#: When failures land together, the one that explains the others: a hung collective or an
#: exhausted memory kills workers, not the other way round.
_ROOT_FIRST: tuple[Cause, ...] = ("nccl_timeout", "inference_server_oom", "numerical_divergence")
TOGETHER_SECONDS = 10.0
#: Failures that are a cause by nature, not a consequence: each one decides, however rare.
_ROOT_KINDS = ("watchdog_timeout", "nccl_timeout", "cuda_oom", "kv_cache_oom")
#: The failures each root cause brings about, which tell of it too.
_BRINGS_ABOUT: dict[str, tuple[str, ...]] = {
    "inference_server_oom": ("inference_server_crash", "inference_server_unresponsive"),
    "inference_server_unresponsive": ("inference_server_crash",),  # (a hung server killed by its watchdog)
    "nccl_timeout": ("training_worker_crash",),
}


def _root_cause(deciding: pl.DataFrame) -> Cause:
    """The earliest failure's cause, unless a root cause landed within seconds of it."""
    first = _by_time(deciding, 1).row(0, named=True)
    if first["time"] is not None:
        near = deciding.filter(
            (pl.col("time") - first["time"]).dt.total_milliseconds().abs() <= TOGETHER_SECONDS * 1000
        )["cause"].unique().to_list()
        for cause in _ROOT_FIRST:
            if cause in near:
                return cause
    return first["cause"]


def attribute(events: pl.DataFrame, clock: pl.DataFrame | None = None, read: dict[str, pl.Series] | None = None) -> pl.DataFrame:
    """``events`` with a step, each with the cause it points to (``cause``, null for bookkeeping),
    the step it began in (``since``: a timed-out request's, when it was sent; see :func:`explain`)
    and the server a failure names (``at``; null for bookkeeping). ``cause`` and ``at`` are
    categorical: a flood's millions of rows name a few causes and servers. ``read``: what
    :func:`read_said` read for ``events``, where the caller has it already."""
    read = read if read is not None else read_said(events)
    if read is not None:
        events = events.with_columns(series.alias(f"read_{name}") for name, series in read.items())
    attributed = _waiting_since(_attribute(events, read), clock, read)
    at = servers_named(attributed, attributed["read_at"] if read else None, where=pl.col("cause").is_not_null())
    return attributed.with_columns(at).drop([f"read_{name}" for name in read or ()])


class Attribution:
    """``events`` attributed to causes (:func:`attribute`, with the step ``clock`` if given) and the
    servers their lines name (:func:`~forensics.detect.servers_named`), each made once, when first
    asked for, for every incident or alarm that asks: a log may hold millions of events. What a
    flood's lines say is read back once for both, and let go once both are made."""

    def __init__(self, events: pl.DataFrame, clock: pl.DataFrame | None = None) -> None:
        self.events, self.clock = events, clock
        self._read: dict[str, pl.Series] | None = None
        self._was_read = False
        self._frame: pl.DataFrame | None = None
        self._servers: pl.Series | None = None

    @property
    def frame(self) -> pl.DataFrame:
        """:func:`attribute` of the events: those with a step, in their order."""
        if self._frame is None:
            self._frame = attribute(self.events, self.clock, self._said())
            self._let_go()
        return self._frame

    @property
    def servers(self) -> pl.Series:
        """The server each event's line names, aligned with the events (null where none)."""
        if self._servers is None:
            read = self._said()
            self._servers = servers_named(self.events, None if read is None else read["at"])
            self._let_go()
        return self._servers

    def rows(self, kept: pl.Series) -> pl.DataFrame:
        """The attribution of the events ``kept`` marks (a mask aligned with the events)."""
        return self.frame.filter(kept.filter(self.events["step"].is_not_null()))

    def _said(self) -> dict[str, pl.Series] | None:
        if not self._was_read:
            self._read, self._was_read = read_said(self.events), True
        return self._read

    def _let_go(self) -> None:
        """(what was read is a few columns of millions of rows: kept only until both are made)"""
        if self._frame is not None and self._servers is not None:
            self._read = None


def read_said(events: pl.DataFrame) -> dict[str, pl.Series] | None:
    """What the attribution reads in the messages of ``events`` a reader did not hold (a flood's),
    read from their lines: ``cause``, ``at`` and ``waited`` (see :func:`_said`), one series each,
    aligned with ``events`` and null at held rows. ``None`` when every message is held."""
    return from_lines(events, _said(pl.col("message")))


def _said(message: pl.Expr) -> dict[str, pl.Expr]:
    """What the attribution reads in a message: the cause its words name (in an event of an
    ambiguous kind), the server it names, and how long a timed-out request waited."""
    text = pl.when(pl.col("kind").is_in(list(_AMBIGUOUS))).then(message)  # (only these lines' text is read: the regexes skip nulls)
    by_text: pl.Expr = pl.lit(None, dtype=pl.Categorical)
    for regex, cause in reversed(_CAUSE_IN_MESSAGE):
        by_text = pl.when(text.str.contains(regex)).then(pl.lit(cause, pl.Categorical)).otherwise(by_text)
    waited = pl.when(pl.col("kind") == "request_timeout").then(message).str.extract(_TIMED_OUT_AFTER, 1).cast(pl.Float64, strict=False)
    return {"cause": by_text, "at": server_named(message).cast(pl.Categorical), "waited": waited}


def _or_read(held: pl.Expr, name: str, read: dict | None, where: pl.Expr | None = None) -> pl.Expr:
    """``held`` (from the messages held), else what was read from the line (``where`` it applies)."""
    if read is None:
        return held
    from_line = pl.col(f"read_{name}")
    return pl.coalesce(held, from_line if where is None else pl.when(where).then(from_line))


def _attribute(events: pl.DataFrame, read: dict | None = None) -> pl.DataFrame:
    """Events with the cause each points to (null for bookkeeping). Built as categories throughout:
    a text column of a cause's name a row is 45 bytes a row of a flood's millions."""
    def named(cause: str) -> pl.Expr:
        return pl.lit(cause, pl.Categorical)

    by_kind = pl.col("kind").replace_strict(CAUSE_OF_KIND, default=None, return_dtype=pl.Categorical)
    cause = (
        pl.when(from_server(["cuda_oom"]))
        .then(named("inference_server_oom"))
        .when(from_server(["process_killed", "host_oom_kill", "segfault", "fatal_check"]))
        .then(named("inference_server_crash"))
        .when(pl.col("kind").is_in(list(_AMBIGUOUS)))
        .then(_or_read(_said(pl.col("message"))["cause"], "cause", read))
        # (a reward alone non-finite is no divergence: a reward function's NaN, a batch with no reward)
        .when((pl.col("kind") == "nan_inf") & pl.col("message").str.contains(REWARD_IN_TEXT)
              & ~pl.col("message").str.contains(NUMERIC_HEALTH_IN_TEXT))
        .then(pl.lit(None, pl.Categorical))
        .otherwise(by_kind)
    )
    return rows_where(events, pl.col("step").is_not_null()).with_columns(cause.alias("cause"))


#: AReaL's client: ``HTTP request to … timed out after 3600.00s (attempt 1/3)``, logged when it ran out.
_TIMED_OUT_AFTER = r"timed out after (\d+(?:\.\d+)?) ?s\b"


def _waiting_since(events: pl.DataFrame, clock: pl.DataFrame | None, read: dict | None = None) -> pl.DataFrame:
    """``events`` with ``since``: the step a timed-out request was sent in (its own step for
    any other event)."""
    since = pl.col("step").alias("since")
    if clock is None or clock.is_empty() or events.is_empty():
        return events.with_columns(since)
    seconds = _or_read(_said(pl.col("message"))["waited"], "waited", read)
    sent = pl.col("time") - pl.duration(milliseconds=(seconds * 1000).round().cast(pl.Int64))
    waited = events.select(sent.alias("time"), pl.lit(None, dtype=pl.Int64).alias("step"))
    sent_step = assign_steps(waited, clock.select("time", pl.col("step").cast(pl.Int64)))["step"]
    return events.with_columns(pl.min_horizontal(pl.col("step"), sent_step.alias("since")).alias("since"))


def _during(span: tuple[int, int]) -> pl.Expr:
    """The event's time, from when it began (``since``) to when it was logged, overlaps ``span``."""
    return (pl.col("since") <= span[1]) & (pl.col("step") >= span[0])


def _logged_later(window: pl.DataFrame, spans: _Windows, cause: Cause) -> str:
    late = window.filter((pl.col("cause") == cause) & (pl.col("step") > spans.window[1]))
    if late.is_empty():
        return ""
    first = with_messages(_by_time(late, 1)).row(0, named=True)
    waited = re.search(_TIMED_OUT_AFTER, first["message"] or "")
    how_long = f" {float(waited.group(1)):g} s" if waited else ""
    n, of = late.height, window.filter(pl.col("kind") == first["kind"]).height
    which = (f"The {first['kind']} was" if of == 1 else f"All {n} {first['kind']} were" if n == of
             else f"{n} of the {of} {first['kind']} {'was' if n == 1 else 'were'}")
    return (f"{which} logged only when the{how_long} timeout ran out (from step {first['step']}):"
            f" {'its request was' if n == 1 else 'their requests were'} sent in {step_span(*spans.window)}.")


def _within_the_log(spans: _Windows, first_logged: int) -> _Windows:
    """``spans`` begun no earlier than the first step a log read holds: steps before it (rotated
    away, never copied) are no baseline of zero failures, and no part of the window."""
    window = (max(spans.window[0], first_logged), spans.window[1])
    return _Windows(window, (max(spans.baseline[0], first_logged), min(spans.baseline[1], window[0] - 1)))


def _rate_test(window: pl.DataFrame, baseline: pl.DataFrame, spans: _Windows) -> pl.DataFrame:
    """Per kind: counts in both windows and the chance of the window count under the baseline rate."""
    w_len = spans.window[1] - spans.window[0] + 1
    b_len = max(spans.baseline[1] - spans.baseline[0] + 1, 1)
    # Kinds in order of first appearance: ties in p-value then read the same in every process.
    counts = _failures(window, "kind", "cause").rename({"len": "in_window"})
    base = _failures(baseline, "kind").rename({"len": "in_baseline"})
    rows = counts.join(base, on="kind", how="left", maintain_order="left").with_columns(pl.col("in_baseline").fill_null(0))
    p_values = [
        _poisson_tail(k, (b + 0.5) / b_len * w_len) for k, b in zip(rows["in_window"], rows["in_baseline"], strict=True)
    ]
    return rows.with_columns(pl.Series("p_value", p_values, dtype=pl.Float64))


def _failures(events: pl.DataFrame, *by: str) -> pl.DataFrame:
    """How many failures of each ``by`` group ``events`` show, groups in order of first appearance.

    Ray tells of one failure in several files (the raylet's event log, the GCS log, the driver, the
    worker's own log; a worker's torch watchdog line in its ``.err`` and, forwarded, in the driver's
    console): such a group counts as many as the one file (rotated parts together) that saw the
    most of it. Any other source's lines count one each.
    """
    told_twice = pl.col("source").is_in(["ray", "torch"]).fill_null(False).alias("twice")
    # Each group's lines per file first, their keys as categories: grouping millions of lines by
    # several text columns encodes every line's texts; the few files are then read for their streams.
    keys = [pl.col(key).cast(pl.Categorical) for key in (*by, "file")]
    per_file = (events.lazy().group_by(*keys, told_twice, maintain_order=True).len()
                .with_columns(pl.col(key).cast(pl.String) for key in (*by, "file")).collect())
    per_stream = per_file.group_by(*by, "twice", stream_of(pl.col("file")).alias("stream")).agg(pl.col("len").sum())
    counts = pl.concat([
        per_stream.filter("twice").group_by(*by).agg(pl.col("len").max()),
        per_stream.filter(~pl.col("twice")).group_by(*by).agg(pl.col("len").sum()),
    ]).group_by(*by).agg(pl.col("len").sum().cast(pl.UInt32))
    order = per_file.select(*by).unique(maintain_order=True)  # (in order of first appearance)
    return order.join(counts, on=list(by), how="left", maintain_order="left", nulls_equal=True)


def _poisson_tail(k: int, lam: float) -> float:
    """P(X ≥ k) for X ~ Poisson(lam)."""
    if k <= 0:
        return 1.0
    term = math.exp(-lam)
    below = term
    for i in range(1, k):
        term *= lam / i
        below += term
    return max(0.0, 1.0 - below)


def _memory_first(window: pl.DataFrame, first: dict) -> bool:
    """The server ran out of memory at or before its first crash sign."""
    oom = window.filter(pl.col("cause") == "inference_server_oom")
    return not oom.is_empty() and oom["time"].min() <= first["time"]


def _explain_rates(kinds: pl.DataFrame, spans: _Windows, first: dict | None = None) -> str:
    parts = []
    before = spans.baseline[1] - spans.baseline[0] + 1
    for row in kinds.sort("p_value", maintain_order=True).iter_rows(named=True):
        seen = f"{row['in_window']} {row['kind']} in {step_span(*spans.window)}"
        p = row["p_value"]
        chance = _chance(p)
        # With no step before the window there is nothing to compare with: the count alone.
        parts.append(f"{seen} vs {row['in_baseline']} in the {before} steps before ({chance})" if before > 0 else seen)
    said = "; ".join(parts)
    return f"{said}; first: {first['kind']} at {_when(first['time'])} (step {first['step']})." if first else said


def _chance(p: float) -> str:
    return "p<1e-15" if p < 1e-15 else f"p={p:.1g}"  # a tail too small for a float reads 0: not "p=0"


def _brought_about(brought: pl.DataFrame) -> str:
    """The failures the cause brings about, those that stand out, in a line."""
    brought = brought.filter(pl.col("p_value") < 0.01).sort("p_value", maintain_order=True)
    if brought.is_empty():
        return ""
    listed = ", ".join(f"{r['in_window']} {r['kind']} ({_chance(r['p_value'])})" for r in brought.head(4).iter_rows(named=True))
    return f"Then the failures it leads to: {listed}."


def _when(time: datetime | None) -> str:
    return time.isoformat(sep=" ", timespec="seconds") if time else "an unknown time"


def _what_died(window: pl.DataFrame) -> str:
    """How a training run's processes failed, in the terms a reader would look for."""
    kinds = set(window["kind"].unique().to_list())  # (a flooded window's rows are millions)
    if "nccl_timeout" in kinds:
        return ("It looks like a hang in a collective: the NCCL watchdog fired (its default timeout is 600 s), "
                "then the processes aborted — not a slow step.")
    if "host_oom_kill" in kinds:
        return "A worker was killed for host memory (Ray's memory monitor or the kernel's OOM killer)." + _last_words(window)
    if kinds & {"actor_died", "worker_died"}:
        return "A worker process died." + _last_words(window)
    return ""


def _last_words(window: pl.DataFrame, most: int = 3) -> str:
    """What each worker that died printed last (its stdout before its stderr): Ray records no signal
    or exit code, and a SIGKILL in a hung all-reduce reads like an exit on an error but for it."""
    said = window.filter(pl.col("kind") == "worker_last_output").sort(
        "time", ~pl.col("file").cast(pl.String).str.ends_with(".out"), "file", nulls_last=True, maintain_order=True)
    rows = said.unique(pl.col("file").cast(pl.String).str.replace(r"\.(?:out|err)$", ""), keep="first", maintain_order=True).rows(named=True)
    quotes = [f"“{_tail(r['message'])}” ({Path(r['file']).name}:{r['line']})" for r in rows[:most]]
    if len(quotes) == 1:
        return f" The last line it printed: {quotes[0]}."
    more = f"; and {len(rows) - most} more" if len(rows) > most else ""
    return f" The last lines the dead workers printed: {'; '.join(quotes)}{more}." if quotes else ""


def _tail(text: str, most: int = 300) -> str:
    return text if len(text) <= most else "…" + text.lstrip("…")[-(most - 1):]


def _same_servers(later: pl.DataFrame, events: pl.DataFrame, spans: _Windows, cause: Cause) -> pl.DataFrame:
    """Of ``later``, the lines of the servers the window's ``cause`` lines name: with several
    servers, another one's exit is not the hung one's. A line naming no server is its log's (a
    node's ``SIGTERM received``): not the hung one's when that log's launch lines name another."""
    named = _servers_named(events.lazy().filter(_during(spans.window) & (pl.col("cause") == cause)).select("at").collect())
    if named.is_empty():
        return later
    named = named.implode()
    peers = (_server_logs(events).group_by("log").agg(pl.col("at").is_in(named).any().alias("ours"))
             .filter(~pl.col("ours"))["log"].implode())
    at = pl.col("at")
    return later.filter((at.is_null() & ~stream_of(pl.col("file")).is_in(peers)) | at.is_in(named))


def _servers_named(events: pl.DataFrame) -> pl.Series:
    """The servers (``host:port``) ``events``' lines name (their ``at``), each once."""
    return events["at"].drop_nulls().unique()


def _server_logs(events: pl.DataFrame) -> pl.DataFrame:
    """``log`` (a log's stream: its rotated pieces one), ``at``: the server each launch line in it
    names — one server's own log, not the launcher's line listing them all."""
    return launches(events).select(stream_of(pl.col("file")).alias("log"), "at").drop_nulls()


def _failing_servers_rows(metrics: pl.DataFrame, events: pl.DataFrame, in_window: pl.DataFrame) -> pl.DataFrame:
    """With one server log per node: ``metrics`` of the logs of the servers the window's failures
    name (by the address each log's launch lines give), so that a healthy peer's stats are not
    told as the failing server's. All of them where that cannot be told."""
    named = _servers_named(in_window.lazy().filter(pl.col("cause").is_not_null()).select("at").collect())
    if named.is_empty():
        return metrics
    # Each server log (its rotated pieces one), among the logs with server stats: not the trainer's launcher lines.
    files = metrics.lazy().filter(pl.col("source") == "sglang").select(pl.col("file").cast(pl.String).unique()).collect()
    files = files.with_columns(stream_of(pl.col("file")).alias("log"))
    launched = _server_logs(events).filter(pl.col("log").is_in(files["log"].implode()))
    if launched["log"].n_unique() < 2:
        return metrics
    logs = launched.filter(pl.col("at").is_in(named.implode()))["log"].unique()
    if logs.is_empty():
        return metrics
    theirs = files.filter(pl.col("log").is_in(logs.implode()))["file"]
    return metrics.filter(pl.col("file").cast(pl.String).is_in(theirs.implode()) | (pl.col("source") != "sglang"))


def _escalation(events: pl.DataFrame, spans: _Windows, cause: Cause) -> str:
    """What the same failure turned into later (a hang that ended in a crash)."""
    if cause != "inference_server_unresponsive":
        return ""
    crash = _same_servers(_narrow(events, (pl.col("step") > spans.window[1]) & (pl.col("cause") == "inference_server_crash")),
                          events, spans, cause)
    if crash.is_empty():
        return "No refused connection or server exit followed: the server stayed up but stopped answering."
    row = _by_time(crash, 1).row(0, named=True)
    return f"The server was seen down only later: {row['kind']} at {_when(row['time'])} (step {row['step']})."


def _by_time(frame: pl.DataFrame, head: int) -> pl.DataFrame:
    """The first ``head`` rows of ``frame`` by time, then line (no time last; ties in ``frame``'s
    order: the file order of lines logged at once, by ranks), found without sorting it all: a
    window of a flooded log holds millions of lines."""
    return frame.lazy().sort("time", "line", nulls_last=True, maintain_order=True).head(head).collect()


#: What ranking a window's lines for evidence reads of them (their text is gathered for the chosen few only).
_RANKED = ("time", "line", "kind", "cause", "severity")


def _ranked(frame: pl.DataFrame) -> pl.LazyFrame:
    """What ranking ``frame``'s lines reads of them, with each one's ``row`` in ``frame``."""
    return frame.lazy().select(*_RANKED, pl.int_range(pl.len(), dtype=pl.UInt32).alias("row"))


def _evidence(window: pl.DataFrame, cause: str) -> tuple[Evidence, ...]:
    """The deciding lines first (earliest of each kind, then more of them), then the rest."""
    rows = _ranked(window)
    firsts = rows.group_by("kind").agg(_earliest()).collect()["row"]
    ranked = (
        rows.with_columns((pl.col("cause") == cause).fill_null(False).alias("deciding"), pl.col("row").is_in(firsts.implode()).alias("first"))
        # (bookkeeping, a checkpoint saved or a server ready, after every failure)
        .sort(pl.col("deciding").not_(), pl.col("first").not_(), pl.col("cause").is_null(), pl.col("severity") == "info", "time", "line",
              nulls_last=True, maintain_order=True)
        .head(16)
        .collect()
    )
    return _cited(window[ranked["row"]])


def _earliest() -> pl.Expr:
    """In a group of ranked rows, the ``row`` that sorts first by time (none last), then line, then
    ``row``: found in one pass, where a sort of a flooded window costs hundreds of megabytes."""
    time = pl.col("time")
    # (no time sorts last: the group's untimed rows come first only when it has no timed one)
    at_first = (time == time.min()).fill_null(False) | (time.is_null() & ~time.is_not_null().any())
    first_line = pl.col("line") == pl.col("line").filter(at_first).min()
    return pl.coalesce(pl.col("row").filter(at_first & first_line).min(), pl.col("row").filter(at_first).min())


def _later_evidence(events: pl.DataFrame, spans: _Windows, cause: Cause) -> tuple[Evidence, ...]:
    later = _narrow(events, (pl.col("step") > spans.window[1]) & ~_during(spans.window) & pl.col("cause").is_not_null())
    later = _same_servers(later, events, spans, cause)
    # Each kind's earliest line, then the four earliest of those: a flood after the window is not
    # sorted whole (the rows kept in frame order, so that ties stay in it).
    earliest = later.lazy().group_by("kind").agg(_earliest()).collect()["row"].sort()
    return _cited(_by_time(events[earliest], 4))


#: What the lines after a window are judged by (their text and the rest are read for the few cited).
_NARROW = ("row", "time", "step", "line", "kind", "cause", "severity", "at", "file")


def _narrow(events: pl.DataFrame, where: pl.Expr) -> pl.DataFrame:
    """The rows of ``events`` ``where`` holds, with their ``row`` in it, in :data:`_NARROW`'s
    columns only: a flood after a window copied whole took a gigabyte."""
    return events.lazy().with_row_index("row").filter(where).select(_NARROW).collect()


def _undated(events: pl.DataFrame) -> pl.DataFrame:
    """Errors logged with no time of their own, so in no step (a Ray worker's ``.err``: its
    traceback lines carry none): when they happened is unknown, that they happened is not."""
    return events.filter(pl.col("step").is_null() & pl.col("time").is_null() & pl.col("severity").is_in(["error", "fatal"])
                         ).sort("file", "line")


def _no_fault(finding: Finding, in_window: pl.DataFrame, spans: _Windows, seen: dict[str, int], server: ServerContext,
              scores: pl.DataFrame, undated: pl.DataFrame) -> Verdict:
    if finding.kind in ("reward_collapse", "zero_variance", "nan_inf"):
        # A server seen answering makes "not the infrastructure" a finding, not a default.
        confidence = {True: 0.8, None: 0.6, False: 0.45}[server.answering]
        usual = scores.filter(pl.col("cause").is_not_null())
        # Errors naming no infrastructure fault (a reward function's AttributeError in a failed
        # workflow): the pipeline's own, cited.
        own = in_window.filter(pl.col("cause").is_null() & pl.col("kind").is_in(list(_AMBIGUOUS))
                               & pl.col("severity").is_in(["error", "fatal"]))
        cited: tuple[Evidence, ...] = ()
        if usual.is_empty() and own.height:
            first = with_messages(_by_time(own, 1)).row(0, named=True)
            exception = re.sub(r"^.*?\b(?:ERROR|CRITICAL): ", "", raised(first["message"]))[:160]
            found = (f"No infrastructure fault was logged in {step_span(*spans.window)}, but {own.height} "
                     f"error{'s' if own.height > 1 else ''} naming none {'were' if own.height > 1 else 'was'} "
                     f"({', '.join(sorted(set(own['kind'])))}; first: {exception}, at step {first['step']}):")
            cited = _cited(_by_time(own, 8))
        elif usual.is_empty() and undated.height:  # (not "no failure of any kind": these may be the onset's)
            first = with_messages(undated.head(1)).row(0, named=True)
            found = (f"No dated failure was logged in {step_span(*spans.window)}, but {undated.height} error"
                     f"{'s' if undated.height > 1 else ''} with no time of {'their' if undated.height > 1 else 'its'} own "
                     f"{'were' if undated.height > 1 else 'was'} ({', '.join(sorted(set(undated['kind'])))}; first: "
                     f"{raised(first['message'])[:160]}, {Path(first['file']).name}:{first['line']}), so when is unknown;")
            cited = _cited(undated.head(8))
            confidence -= 0.1
        elif usual.is_empty():
            found = f"No failure of any kind was logged in {step_span(*spans.window)}:"
        else:  # (failures as common before as in the window: not what changed)
            confidence -= 0.1
            found = (f"The only failures around the onset were of kinds the run had logged all along "
                     f"({_explain_rates(usual, spans)}), not what changed;")
        return Verdict(
            "reward_pipeline",
            confidence,
            cited + server.evidence,
            " ".join(
                [
                    f"{found} the rewards themselves went {'non-finite' if finding.kind == 'nan_inf' else 'constant'} "
                    "(reward function, parser or data), not the infrastructure.",
                    *server.sentences,
                ]
            ),
            seen,
        )
    if finding.kind == "reward_drop":
        usual = scores.filter(pl.col("cause").is_not_null())
        found = (f"No infrastructure failure was logged in {step_span(*spans.window)}" if usual.is_empty() else
                 f"The only failures around the onset were of kinds the run had logged all along ({_explain_rates(usual, spans)})")
        return Verdict(
            "unknown",
            0.4,
            server.evidence,
            " ".join([f"{found}: nothing says its rollouts failed. A reward that falls while they are served is the policy's "
                      "or the data's: a policy that degraded (entropy or KL running away, a learning rate too high), harder "
                      "data, or a changed reward function; the logs do not tell these apart.", *server.sentences]),
            seen,
        )
    if finding.kind == "crash":
        cited = _evidence(in_window.filter(pl.col("kind") == "traceback"), "training_worker_crash")
        placed = not cited and finding.raised is not None  # (in no step: undated, its order inferred by the finding)
        if placed:
            file, line = finding.raised
            cited = _cited(undated.filter((pl.col("file") == file) & (pl.col("line") == line)))
        if cited:
            # The run ended in its own exception: the traceback is what stopped it.
            return Verdict(
                "training_worker_crash",
                0.6 if placed else 0.7,
                cited + server.evidence,
                "The training process raised an exception it did not catch and stopped; the traceback "
                "says where. No infrastructure failure was logged around it.",
                seen,
            )
    return Verdict("unknown", 0.3, server.evidence, " ".join(["Nothing in the logs explains it.", *server.sentences]), seen)


def _cited(rows: pl.DataFrame) -> tuple[Evidence, ...]:
    """``rows`` as evidence, in order, their messages read back where a flood left them unheld."""
    return tuple(_to_evidence(r) for r in with_messages(rows).iter_rows(named=True))


def _to_evidence(row: dict) -> Evidence:
    return Evidence(
        kind=row["kind"],
        time=row["time"],
        step=row["step"],
        file=row["file"],
        line=row["line"],
        text=(row["message"] or "")[:300],
    )
