"""What the inference server was doing around an onset: its memory peak, its last sign of
life, and whether it kept answering. Read from the server's own metric lines (SGLang stats
and HTTP access counts), so it is only as visible as the server's log level allows.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import polars as pl

from forensics.model import Evidence

_STATS = ("sglang/gen_throughput", "sglang/running_req", "sglang/queue_req", "sglang/token_usage")
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
    server = metrics.filter((pl.col("source") == "sglang") & pl.col("step").is_not_null())
    if server.is_empty():
        blind = ("The server's own log has no stats or access lines here: its side is not visible.",)
        return ServerContext(blind if has_server_log else (), (), None)
    sentences: list[str] = []
    evidence: list[Evidence] = []

    near = server.filter(pl.col("step").is_between(onset_step - lookback, window[1]))
    peak = near.filter(pl.col("key") == "sglang/token_usage").sort("value", "time", descending=[True, False]).head(1)
    if peak.height and peak["value"][0] >= _PRESSURE:
        row = peak.row(0, named=True)
        sentences.append(f"KV cache token usage peaked at {row['value']:.2f} at {_hm(row['time'])} (step {row['step']}).")
        evidence.append(_evidence("memory_peak", row, f"sglang/token_usage = {row['value']:.2f} (peak near the onset)"))

    stats = server.filter(pl.col("key").is_in(_STATS))
    silent = False
    if onset_time is not None and stats.height:
        before = stats.filter(pl.col("time") <= onset_time)
        if before.height:
            last_time = before["time"].max()
            sample = before.filter(pl.col("time") == last_time)
            values = dict(zip(sample["key"].to_list(), sample["value"].to_list(), strict=True))
            gap = (onset_time - last_time).total_seconds()
            silent = gap > 60 and stats.filter(pl.col("time").is_between(last_time, onset_time, closed="none")).is_empty()
            described = ", ".join(f"{k.split('/')[-1]} {v:g}" for k, v in sorted(values.items()))
            sentences.append(f"Last server stats before the onset: {_hm(last_time)}, {gap / 60:.1f} min before it ({described}).")
            evidence.append(_evidence("last_server_activity", sample.row(0, named=True), f"last server stats line: {described}"))

    # Steps after the onset only: the onset step's own rollouts may predate the failure.
    after = server.filter(pl.col("step").is_between(onset_step + 1, window[1]))
    ok = after.filter(pl.col("key").str.contains(r"^sglang/http/generate/2\d\d$"))["value"].sum()
    throughput = after.filter(pl.col("key") == "sglang/gen_throughput")["value"]
    answering = bool(ok) and (throughput.is_empty() or float(throughput.max() or 0) > 0)
    if answering:
        sentences.append(f"The server kept answering after the onset (steps {onset_step + 1}–{window[1]}): {int(ok)} successful /generate responses.")
    else:
        sentences.append(f"The server logged no successful /generate response after the onset (steps {onset_step + 1}–{window[1]}).")
    return ServerContext(tuple(sentences), tuple(evidence), answering, silent)


def _hm(time: datetime | None) -> str:
    return time.isoformat(sep=" ", timespec="seconds") if time else "an unknown time"


def _evidence(kind: str, row: dict, text: str) -> Evidence:
    return Evidence(kind, row["time"], row["step"], row["file"], row["line"], text)
