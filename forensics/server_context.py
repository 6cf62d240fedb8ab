"""What the inference server was doing around an onset: its memory peak, its last sign of
life, and whether it kept answering. Read from the server's own metric lines (SGLang stats
and HTTP access counts), so it is only as visible as the server's log level allows.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from datetime import datetime

import polars as pl

from forensics.detect import keys_matching
from forensics.model import Evidence, step_span
from parsers.schema import in_order

#: The server's stats series read around an onset (and drawn on the report's timeline).
SERVER_STATS = ("sglang/gen_throughput", "sglang/running_req", "sglang/queue_req", "sglang/token_usage")
#: Successful ``/generate`` responses, counted per minute from the access lines.
ANSWERED = r"^sglang/http/generate/2\d\d$"
#: Token usage worth calling a memory peak (the KV cache more than this full).
_PRESSURE = 0.8


@dataclass(frozen=True)
class ServerContext:
    sentences: tuple[str, ...]
    evidence: tuple[Evidence, ...]
    answering: bool | None
    """True: the server answered normally throughout the window; None: its side is not visible."""
    silent_before_onset: bool = False
    """The server's stats stopped before the onset step ended."""


def server_context(
    metrics: pl.DataFrame,
    onset_step: int,
    onset_time: datetime | None,
    window: tuple[int, int],
    *,
    has_server_log: bool = True,
    lookback: int = 10,
) -> ServerContext:
    """Describe the server between ``onset_step - lookback`` and the end of ``window``."""
    index = _index_of(metrics)
    if not index.any_rows:
        blind = ("The server's own log has no stats or access lines here: its side is not visible.",)
        return ServerContext(blind if has_server_log else (), (), None)
    sentences: list[str] = []
    evidence: list[Evidence] = []

    near = index.by_step(metrics, onset_step - lookback, window[1])
    peak = near.filter(pl.col("key") == "sglang/token_usage").sort("value", "time", descending=[True, False]).head(1)
    if peak.height and peak["value"][0] >= _PRESSURE:
        row = peak.row(0, named=True)
        sentences.append(f"KV cache token usage peaked at {row['value']:.2f} at {_hm(row['time'])} (step {row['step']}).")
        evidence.append(_evidence("memory_peak", row, f"sglang/token_usage = {row['value']:.2f} (peak near the onset)"))

    silent = False
    times = index.stats["time"]
    upto = times.search_sorted(onset_time, side="right") if onset_time is not None else 0
    if onset_time is not None and upto:
        last_time = times[upto - 1]
        sample = _gather(metrics, index.stats["row"][times.search_sorted(last_time, side="left") : upto])
        values = dict(zip(sample["key"].to_list(), sample["value"].to_list(), strict=True))
        gap = (onset_time - last_time).total_seconds()
        between = times.search_sorted(onset_time, side="left") - times.search_sorted(last_time, side="right")
        silent = gap > 60 and between <= 0
        described = ", ".join(f"{k.split('/')[-1]} {v:g}" for k, v in sorted(values.items()))
        sentences.append(f"Last server stats before the onset: {_hm(last_time)}, {gap / 60:.1f} min before it ({described}).")
        evidence.append(_evidence("last_server_activity", sample.row(0, named=True), f"last server stats line: {described}"))

    # Steps after the onset only: the onset step's own rollouts may predate the failure.
    if window[1] <= onset_step:  # the run logged nothing after it: whether the server answered is unknown
        return ServerContext(tuple(sentences), tuple(evidence), None, silent)
    after = index.by_step(metrics, onset_step + 1, window[1])
    ok = after.filter(pl.col("key").is_in(keys_matching(metrics, ANSWERED)))["value"].sum()
    throughput = after.filter(pl.col("key") == "sglang/gen_throughput")["value"]
    answering = bool(ok) and (throughput.is_empty() or float(throughput.max() or 0) > 0)
    if answering:
        sentences.append(f"The server kept answering after the onset ({step_span(onset_step + 1, window[1])}): {int(ok)} successful /generate responses.")
    else:
        sentences.append(f"The server logged no successful /generate response after the onset ({step_span(onset_step + 1, window[1])}).")
    return ServerContext(tuple(sentences), tuple(evidence), answering, silent)


@dataclass(frozen=True)
class _Index:
    """Positions of the server rows read here: by step (the keys read per step window) and the
    stats rows by time. A run with many incidents asks once per incident; server rows can be
    most of a run's rows, so they are sorted once rather than filtered on every call."""

    any_rows: bool
    steps: pl.DataFrame
    """``row``, ``step`` of token usage, throughput and /generate successes, by step."""
    stats: pl.DataFrame
    """``row``, ``time`` of the stats rows with a time, by time."""

    def by_step(self, metrics: pl.DataFrame, first: int, last: int) -> pl.DataFrame:
        """The indexed rows with ``first <= step <= last``, in the frame's order."""
        steps = self.steps["step"]
        lo, hi = steps.search_sorted(first, side="left"), steps.search_sorted(last, side="right")
        return _gather(metrics, self.steps["row"][lo:hi])


_indexed: tuple[weakref.ref[pl.DataFrame], int, _Index] | None = None


def _index_of(metrics: pl.DataFrame) -> _Index:
    global _indexed
    if _indexed is not None and _indexed[0]() is metrics and _indexed[1] == metrics.height:
        return _indexed[2]
    # Positions of the few rows wanted, not a row number for every row (40 MB at 10 M rows).
    key, server = pl.col("key"), (pl.col("source") == "sglang") & pl.col("step").is_not_null()
    read = key.is_in(["sglang/token_usage", "sglang/gen_throughput"]) | key.is_in(keys_matching(metrics, ANSWERED))
    stat = key.is_in(SERVER_STATS) & pl.col("time").is_not_null()
    read_rows, stats_rows = (metrics.select(pl.arg_where(server & wanted).alias("row")).to_series() for wanted in (read, stat))
    # Positions ascend, so a stable sort by step or time orders ties by position.
    steps = in_order(pl.DataFrame([read_rows, metrics["step"].gather(read_rows)]), "step")
    stats = in_order(pl.DataFrame([stats_rows, metrics["time"].gather(stats_rows)]), "time")
    index = _Index(bool(metrics.select(server.any()).item()), steps, stats)
    _indexed = (weakref.ref(metrics), metrics.height, index)
    return index


def _gather(metrics: pl.DataFrame, rows: pl.Series) -> pl.DataFrame:
    return metrics[rows.sort()]


def _hm(time: datetime | None) -> str:
    return time.isoformat(sep=" ", timespec="seconds") if time else "an unknown time"


def _evidence(kind: str, row: dict, text: str) -> Evidence:
    return Evidence(kind, row["time"], row["step"], row["file"], row["line"], text)
