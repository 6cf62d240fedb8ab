"""One run's timeline as a plotly figure (plain dicts, drawn by the inlined plotly.js basic bundle).

Lanes share one step axis: the primary metric with incident bands and checkpoint markers, the
warning/error events by kind, server load, generation throughput, memory and step duration. A lane
appears only when it has data; otherwise :func:`timeline` returns a one-line note instead.

Budget: numeric lanes are aggregated per step and then bucketed above ``MAX_POINTS``; events are
grouped by (kind, step bucket) above ``MAX_EVENT_MARKERS``. Checkpoints, incidents and event
markers keep exact steps. Only ``scatter`` traces are used (the basic bundle has no ``scattergl``).

Untrusted text: trace names and hover text are HTML-escaped (plotly renders a few tags in them);
an event's full line travels in ``customdata`` (control characters as their escapes, as everywhere
on the page) and the page script shows it with ``textContent`` only.
"""

from __future__ import annotations

import html
import math
import textwrap
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from forensics.align import assign_steps, step_clock
from forensics.detect import metric_keys
from forensics.markers import PROBLEM_SEVERITIES
from forensics.model import RunAnalysis, iso
from parsers.schema import stream_of
from reports.page import fmt_time, short
from reports.visible import visible

MAX_POINTS = 5_000
BUCKETS = 2_000
MAX_EVENT_MARKERS = 1_000
HOVER_CHARS = 160
#: A clicked event shows its whole line, up to this many characters.
CLICK_CHARS = 4_000
SEVERITY_COLOR = {"warning": "#e8a400", "error": "#d62728", "fatal": "#6b0000"}
SERVER_KEYS = {"sglang/running_req": "running requests", "sglang/queue_req": "queued requests"}
USAGE_KEY = "sglang/token_usage"
THROUGHPUT_KEY = "sglang/gen_throughput"
PALETTE = ("#9467bd", "#5f6368", "#8c564b", "#17becf", "#bcbd22", "#e377c2", "#7f7f7f")


def hover(text: str | None, limit: int = HOVER_CHARS) -> str:
    """Untrusted text for a plotly hover label: truncated, wrapped, tags neutralised."""
    text = (text or "").replace("\r", " ")
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    lines = textwrap.wrap(text, 100, break_long_words=True, replace_whitespace=True) or [""]
    return "<br>".join(_esc(line) for line in lines)


def _esc(text: str) -> str:
    """Text for plotly's pseudo-HTML labels: no tags, control characters shown as their escapes (as
    everywhere on the page: see :mod:`reports.visible`); quotes stay (plotly shows ``&quot;`` literally)."""
    return visible(html.escape(text, quote=False))


def _label(text: str) -> str:
    """A trace name: escaped, and no ``%{`` for plotly's hover templates to expand."""
    return _esc(text).replace("%{", "%\u200b{")


# --------------------------------------------------------------------------- frames


def _finite() -> pl.Expr:
    return pl.when(pl.col("value").is_finite()).then(pl.col("value")).otherwise(None)


def per_step(frame: pl.DataFrame, how: str) -> pl.DataFrame:
    """(step, value) with one row per step, non-finite values dropped."""
    agg = {"mean": _finite().mean(), "max": _finite().max()}[how]
    return (
        frame.filter(pl.col("step").is_not_null())
        .group_by("step").agg(agg.alias("value"))
        .filter(pl.col("value").is_not_null())
        .sort("step")
    )


def _bucket(series: pl.DataFrame) -> tuple[pl.DataFrame, bool]:
    """Above MAX_POINTS, (bucket start step, mean, min, max) per step bucket."""
    if series.height <= MAX_POINTS:
        return series, False
    lo, hi = series["step"].min(), series["step"].max()
    width = max(1, math.ceil((hi - lo + 1) / BUCKETS))
    out = (
        series.with_columns(((pl.col("step") - lo) // width * width + lo).alias("bucket"))
        .group_by("bucket")
        .agg(pl.col("value").mean().alias("value"), pl.col("value").min().alias("lo"), pl.col("value").max().alias("hi"))
        .sort("bucket").rename({"bucket": "step"})
    )
    return out, True


def _num(values: list[Any]) -> list[Any]:
    return [None if v is None else float(f"{v:.6g}") for v in values]


# --------------------------------------------------------------------------- figure assembly


@dataclass
class Lane:
    """One horizontal band of the figure: its traces share a y axis (and maybe a right-hand one)."""

    title: str
    weight: float
    traces: list[dict[str, Any]] = field(default_factory=list)
    yaxis: dict[str, Any] = field(default_factory=dict)
    y2: dict[str, Any] | None = None  # a right-hand axis for a second unit


class Timeline:
    """Collects lanes; :meth:`figure` stacks them on one shared step axis."""

    def __init__(self, run: RunAnalysis) -> None:
        self.run = run
        #: (step, time) of every logged step with a time: the step ↔ wall-clock mapping.
        self.clock = (
            run.steps.filter(pl.col("step").is_not_null() & pl.col("time").is_not_null())
            .group_by("step").agg(pl.col("time").min()).sort("step")
        )
        self.lanes: list[Lane] = []
        self.notes: list[str] = []

    def times(self, steps: list[int]) -> list[str]:
        """Wall-clock time of each step ("" when unknown): the hover's time axis."""
        if self.clock.is_empty():
            return [""] * len(steps)
        frame = pl.DataFrame({"step": steps}, schema={"step": pl.Int64}).with_row_index("_i")
        joined = frame.sort("step").join_asof(self.clock, on="step", strategy="backward").sort("_i")
        return [(iso(t) or "").replace("T", " ") for t in joined["time"].to_list()]

    def line(self, series: pl.DataFrame, name: str, color: str, *, dash: str | None = None,
             axis: str = "y", fmt: str = ".4g") -> list[dict[str, Any]]:
        """A line for (step, value), bucketed to mean + min/max band for big series."""
        data, bucketed = _bucket(series)
        x = data["step"].to_list()
        label = _label(name)
        out: list[dict[str, Any]] = []
        if bucketed:
            band = dict(type="scatter", x=x, mode="lines", line=dict(width=0, color=color), hoverinfo="skip",
                        showlegend=False, legendgroup=label, yaxis=axis)
            out.append(dict(band, y=_num(data["hi"].to_list())))
            out.append(dict(band, y=_num(data["lo"].to_list()), fill="tonexty", opacity=0.3))
            label += " (bucket mean, min–max band)"
        out.append(dict(
            type="scatter", x=x, y=_num(data["value"].to_list()), mode="lines", name=label, legendgroup=label,
            line=dict(color=color, width=1.5, dash=dash), yaxis=axis, customdata=self.times(x),
            hovertemplate=f"{label}: %{{y:{fmt}}}<br>step %{{x}} · %{{customdata}}<extra></extra>",
        ))
        return out

    def durations(self) -> pl.DataFrame:
        """(step, seconds a step took since the previous logged step: a log written every k steps
        spreads the time between its rows over the k steps)."""
        steps = pl.col("step").diff()
        seconds = pl.col("time").diff().dt.total_milliseconds() / 1000
        return (
            self.clock.with_columns(pl.when(steps > 0).then(seconds / steps).alias("value"))
            .filter(pl.col("value").is_not_null()).select("step", "value")
        )

    def add(self, lane: Lane) -> None:
        self.lanes.append(lane)

    def figure(self, shapes: list[dict[str, Any]], annotations: list[dict[str, Any]], *,
               time_axis: bool = True) -> dict[str, Any]:
        """The lanes stacked top to bottom, heights by weight, x axes all matched to the first."""
        gap, unit, top_px, bottom_px = 0.035, 95, 70, 100
        total = sum(lane.weight for lane in self.lanes)
        plot_px = total * unit
        usable = 1 - gap * (len(self.lanes) - 1)
        layout: dict[str, Any] = {}
        data: list[dict[str, Any]] = []
        top, n = 1.0, len(self.lanes)
        for i, lane in enumerate(self.lanes, 1):
            suffix = str(i) if i > 1 else ""
            domain = [max(0.0, top - usable * lane.weight / total), top]
            top = domain[0] - gap
            layout[f"xaxis{suffix}"] = dict(
                anchor=f"y{suffix}", domain=[0, 1], showticklabels=i == n, showspikes=True, spikemode="across",
                spikethickness=1, spikecolor="#9aa0a6", gridcolor="#eceff1", zeroline=False,
                **({"matches": "x"} if i > 1 else {}), **({"title": {"text": "step"}} if i == n else {}),
            )
            layout[f"yaxis{suffix}"] = dict(anchor=f"x{suffix}", domain=domain, gridcolor="#eceff1", zeroline=False,
                                            **lane.yaxis)
            annotations.append(dict(text=lane.title, xref="paper", yref="paper", x=0, y=domain[1], xanchor="left",
                                    yanchor="bottom", showarrow=False, font=dict(size=12, color="#202124")))
            axes = {"y": f"y{suffix}"}
            if lane.y2 is not None:
                axes["y2"] = f"y{n + 10 + i}"
                layout[f"yaxis{n + 10 + i}"] = dict(anchor=f"x{suffix}", overlaying=f"y{suffix}", side="right",
                                                    showgrid=False, zeroline=False, **lane.y2)
            data += [dict(tr, xaxis=f"x{suffix}", yaxis=axes[tr.get("yaxis", "y")]) for tr in lane.traces]
        if time_axis:
            self._time_axis(layout, data, n)
        layout.update(
            shapes=shapes, annotations=annotations, height=round(plot_px + top_px + bottom_px),
            hovermode="closest", paper_bgcolor="#fff", plot_bgcolor="#fff", font=dict(size=11),
            margin=dict(l=70, r=60, t=top_px, b=bottom_px), hoverlabel=dict(align="left"),
            legend=dict(orientation="h", yanchor="top", y=-50 / plot_px, x=0),
        )
        return {"data": data, "layout": layout}

    def _time_axis(self, layout: dict[str, Any], data: list[dict[str, Any]], n: int) -> None:
        """A second reading of the step axis on top of the first lane: wall-clock time at a few steps."""
        if self.clock.height < 2:
            return
        rows = self.clock.gather(sorted({round(k * (self.clock.height - 1) / 6) for k in range(7)}))
        picks = rows["step"].to_list()
        labels = [t.strftime("%m-%d %H:%M") for t in rows["time"].to_list()]
        name = f"xaxis{n + 1}"
        # Labels stand off the axis so that the lane title and incident labels fit beneath them.
        layout[name] = dict(overlaying="x", side="top", matches="x", anchor="y", tickvals=picks, ticktext=labels,
                            showgrid=False, zeroline=False, ticks="", ticklabelstandoff=18,
                            tickfont=dict(size=10, color="#5f6368"))
        data.append(dict(type="scatter", x=[picks[0], picks[-1]], y=[None, None], xaxis=f"x{n + 1}", yaxis="y",
                         mode="markers", hoverinfo="skip", showlegend=False))


# --------------------------------------------------------------------------- lanes


def _primary_lane(t: Timeline, primary: pl.DataFrame, last_step: int) -> tuple[list[dict], list[dict]]:
    run = t.run
    lane = Lane(_esc(run.primary_metric or "primary metric"), 3.0)
    shapes: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    rng_first = run.step_range()["first"] or 0
    if primary.is_empty():
        t.notes.append("no values for the primary metric" if run.primary_metric else "no primary metric")
        y_top = 1.0
    else:
        lane.traces += t.line(primary, run.primary_metric or "", "#1f77b4")
        y_top = float(primary["value"].max())
    for inc in run.incidents:
        end = inc.end_step if inc.end_step is not None else last_step
        shapes.append(dict(type="rect", xref="x", yref="paper", x0=inc.onset_step, x1=max(end, inc.onset_step + 0.5),
                           y0=0, y1=1, fillcolor="rgba(214,39,40,0.10)", line=dict(width=0), layer="below"))
        shapes.append(dict(type="line", xref="x", yref="paper", x0=inc.onset_step, x1=inc.onset_step, y0=0, y1=1,
                           line=dict(color="#d62728", width=1.5, dash="dash")))
        if inc.end_step is not None:
            shapes.append(dict(type="line", xref="x", yref="paper", x0=inc.end_step, x1=inc.end_step, y0=0, y1=1,
                               line=dict(color="#1b7f3b", width=1.5, dash="dash")))
        right_half = inc.onset_step > (rng_first + last_step) / 2
        annotations.append(dict(x=inc.onset_step, y=1.0, xref="x", yref="paper", yanchor="bottom", showarrow=False,
                                xanchor="right" if right_half else "left", text=_esc(f" {inc.id} "),
                                font=dict(color="#d62728", size=11)))
    # An incident in an attempt a relaunch abandoned is on that attempt's values, not on the
    # relaunch's that logged its steps again: they are drawn too, dotted.
    abandoned = per_step(run.superseded, "mean") if any(i.redone for i in run.incidents) and run.superseded.height else None
    if abandoned is not None:
        lane.traces += t.line(abandoned, f"{run.primary_metric} (attempt a relaunch abandoned)", "#d62728", dash="dot")
    if run.incidents:
        at = dict(primary.iter_rows()) if not primary.is_empty() else {}
        redone_at = dict(abandoned.iter_rows()) if abandoned is not None else {}
        lane.traces.append(dict(
            type="scatter", x=[i.onset_step for i in run.incidents],
            y=_num([(redone_at if i.redone and i.onset_step in redone_at else at).get(i.onset_step, y_top) for i in run.incidents]),
            mode="markers", name="incident onset", marker=dict(symbol="x", size=11, color="#d62728"),
            hoverinfo="text",
            hovertext=[
                f"<b>{_esc(i.id)}</b> {_esc(i.kind)} from step {i.onset_step}"
                f" to {i.end_step if i.end_step is not None else 'end (not recovered)'}"
                f"{' in an attempt a relaunch abandoned' if i.redone else ''}"
                f"<br>{_esc(fmt_time(i.onset_time))}"
                f"<br>cause: {_esc(i.cause)} ({i.confidence:.2f})"
                for i in run.incidents
            ],
        ))
    if run.checkpoints:
        cks = sorted(run.checkpoints, key=lambda c: c.step)
        rec = run.recommendation.checkpoint
        for c in cks:
            shapes.append(dict(type="line", xref="x", yref="y domain", x0=c.step, x1=c.step, y0=0, y1=1,
                               line=dict(color="#1b7f3b" if c.path == rec else "#9aa0a6", width=1, dash="dot")))
        lane.traces.append(dict(
            type="scatter", x=[c.step for c in cks], y=_num([y_top] * len(cks)), mode="markers", name="checkpoints",
            marker=dict(symbol="triangle-down", size=10,
                        color=["#1b7f3b" if c.path == rec else ("#5f6368" if c.complete else "#dadce0") for c in cks],
                        line=dict(color="#202124", width=0.5)),
            hoverinfo="text",
            hovertext=[
                f"<b>checkpoint step {c.step}</b>{' (recommended)' if c.path == rec else ''}<br>"
                f"{hover(short(c.path, run.root), 300)}<br>{_esc(fmt_time(c.time))}<br>"
                f"{_esc(c.kind)} · complete: {c.complete} · resumable: {c.resumable}"
                for c in cks
            ],
            customdata=[[f"checkpoint step {c.step}", iso(c.time) or "", visible(c.path), visible("; ".join(c.problems))]
                        for c in cks],
        ))
    t.add(lane)
    return shapes, annotations


def _events_lane(t: Timeline) -> None:
    run = t.run
    markers = run.event_markers(MAX_EVENT_MARKERS)
    if markers.is_empty():
        t.notes.append("no warning/error events")
        return
    kinds = markers["kind"].unique().to_list()
    lane = Lane("warning / error events by kind (click a marker for its line)", 0.6 + 0.3 * len(kinds),
                 yaxis=dict(type="category", categoryorder="category descending", automargin=True))
    for severity in PROBLEM_SEVERITIES:
        part = markers.filter(pl.col("severity") == severity)
        if part.is_empty():
            continue
        hovers, clicks = [], []
        for kind, step, last, n, tm, file, line, msg in part.select(
                "kind", "step", "last", "n", "time", "file", "line", "message").iter_rows():
            where = f"{short(file, run.root)}:{line}"
            head = f"{n} × {kind} (steps {step}–{last}), the first" if n > 1 else f"{kind} · {severity} · step {step}"
            hovers.append(f"<b>{_esc(head)}</b><br>{_esc(fmt_time(tm))} · {hover(where, 200)}"
                          f"<br>{hover(msg)}<br><i>click for the whole line</i>")
            text = msg or ""
            if len(text) > CLICK_CHARS:
                text = text[:CLICK_CHARS] + f" … ({len(msg) - CLICK_CHARS:,} more characters in the file)"
            clicks.append([visible(head), iso(tm) or "", visible(f"{file}:{line}"), visible(text)])
        sizes = [round(min(18, 9 + 2 * math.log2(n)), 1) for n in part["n"].to_list()]
        lane.traces.append(dict(
            type="scatter", x=part["step"].to_list(), y=[_esc(k) for k in part["kind"].to_list()],
            mode="markers", name=severity, hoverinfo="text", hovertext=hovers, customdata=clicks,
            marker=dict(color=SEVERITY_COLOR[severity], size=sizes, symbol="line-ns-open",
                        line=dict(width=2, color=SEVERITY_COLOR[severity])),
        ))
    t.add(lane)


def _metric(t: Timeline, keys: list[str], how: str) -> dict[str, pl.DataFrame]:
    return _per_key(_rows(t, keys), keys, how)


def _rows(t: Timeline, keys: list[str], *extra: pl.Expr) -> pl.DataFrame:
    """The metric rows of ``keys`` (``key``, ``step``, ``time``, ``value`` and ``extra``), a row with a
    time and no step (an analysis built by hand) placed as the analysis places it."""
    # Lazy: only the columns read are gathered (memory lines alone are ~12 rows a step).
    frame = t.run.metrics.lazy().filter(pl.col("key").is_in(keys)).select("key", "step", "time", "value", *extra).collect()
    return assign_steps(frame, step_clock(t.run.steps))


def _per_key(frame: pl.DataFrame, keys: list[str], how: str) -> dict[str, pl.DataFrame]:
    """``frame``'s rows of each of ``keys`` aggregated per step (keys with none left out)."""
    out = {k: per_step(frame.filter(pl.col("key") == k), how) for k in keys}
    return {k: v for k, v in out.items() if not v.is_empty()}


def _server_note(run: RunAnalysis) -> str:
    for s in run.sources:
        for note in s.notes:
            if note.startswith("no server stats"):
                return note
    return "no server stats (sglang/token_usage, running_req, queue_req) in the logs"


def _server_lanes(t: Timeline) -> None:
    rows = _rows(t, [*SERVER_KEYS, USAGE_KEY, THROUGHPUT_KEY], stream_of(pl.col("file")).alias("server"))
    servers = _per_server(t, rows)
    if servers:
        _lanes_per_server(t, servers)
        return
    load = _per_key(rows, [*SERVER_KEYS, USAGE_KEY], "mean")
    if load:
        lane = Lane("server load", 1.6, yaxis=dict(title=dict(text="requests"), rangemode="tozero"))
        for (key, name), color in zip(SERVER_KEYS.items(), ("#2ca02c", "#d62728")):
            if key in load:
                lane.traces += t.line(load[key], name, color, fmt=".0f")
        if USAGE_KEY in load:
            lane.y2 = dict(title=dict(text="KV token usage"), tickformat=".0%", rangemode="tozero")
            lane.traces += t.line(load[USAGE_KEY], "KV token usage", "#9467bd", dash="dot", axis="y2", fmt=".1%")
        t.add(lane)
    else:
        t.notes.append(_server_note(t.run))
    throughput = _per_key(rows, [THROUGHPUT_KEY], "mean")
    if throughput:
        t.add(Lane("generation throughput (token/s)", 1.2, traces=t.line(throughput[THROUGHPUT_KEY], "gen throughput",
                                                                            "#17becf", fmt=".0f")))


#: Up to this many servers get a line each; more are drawn as their mean (said in a note).
MAX_SERVER_LINES = len(PALETTE)


def _per_server(t: Timeline, rows: pl.DataFrame) -> dict[str, dict[str, pl.DataFrame]] | None:
    """With two or more server logs among ``rows`` (their ``server``: one a node, a log's rotated
    pieces one): each one's series (its name → key → per-step values), so that a hung server is
    not hidden in the mean of the healthy ones. ``None`` with one, or with more than
    :data:`MAX_SERVER_LINES` (said)."""
    logs = sorted(rows["server"].drop_nulls().unique().to_list()) if not rows.is_empty() else []
    if len(logs) < 2:
        return None
    if len(logs) > MAX_SERVER_LINES:
        t.notes.append(f"{len(logs)} server logs: the server lanes show their mean, not a line each")
        return None
    keys = [*SERVER_KEYS, USAGE_KEY, THROUGHPUT_KEY]
    return {name: _per_key(rows.filter(pl.col("server") == log), keys, "mean")
            for log, name in zip(logs, _server_names(logs), strict=True)}


def _server_names(logs: list[str]) -> list[str]:
    """Each server log's shortest path ending that no other shares (``node2/llm_server.log``)."""
    parts = [log.split("/") for log in logs]
    for n in range(1, max(len(p) for p in parts) + 1):
        names = ["/".join(p[-n:]) for p in parts]
        if len(set(names)) == len(names):
            return names
    return logs


def _lanes_per_server(t: Timeline, servers: dict[str, dict[str, pl.DataFrame]]) -> None:
    """The server lanes with a line per server: its colour throughout, a key's dash."""
    colors = dict(zip(servers, PALETTE, strict=False))
    load = Lane("server load (a line per server)", 1.6, yaxis=dict(title=dict(text="requests"), rangemode="tozero"))
    throughput = Lane("generation throughput (token/s, a line per server)", 1.2)
    for name, series in servers.items():
        for (key, what), dash in zip(SERVER_KEYS.items(), (None, "dash"), strict=True):
            if key in series:
                load.traces += t.line(series[key], f"{name}: {what}", colors[name], dash=dash, fmt=".0f")
        if USAGE_KEY in series:
            load.y2 = dict(title=dict(text="KV token usage"), tickformat=".0%", rangemode="tozero")
            load.traces += t.line(series[USAGE_KEY], f"{name}: KV token usage", colors[name], dash="dot", axis="y2", fmt=".1%")
        if THROUGHPUT_KEY in series:
            throughput.traces += t.line(series[THROUGHPUT_KEY], f"{name}: gen throughput", colors[name], fmt=".0f")
    if load.traces:
        t.add(load)
    else:
        t.notes.append(_server_note(t.run))
    if throughput.traces:
        t.add(throughput)


def _memory_lane(t: Timeline) -> None:
    keys = sorted(k for k in metric_keys(t.run.metrics)[0] if k.startswith("mem/") and k.endswith("_gb"))
    mem = _metric(t, keys, "max")
    if not mem:
        t.notes.append("no memory lines (mem/…) in the logs")
        return
    order = sorted(mem, key=lambda k: (k != "mem/device_used_gb", k != "mem/device_total_gb", k))
    lane = Lane("memory (GB, max over devices)", 1.5, yaxis=dict(rangemode="tozero"))
    for k, color in zip(order, PALETTE * 3):
        lane.traces += t.line(mem[k], k.removeprefix("mem/").removesuffix("_gb"), color,
                              dash="dash" if k == "mem/device_total_gb" else None, fmt=".1f")
    t.add(lane)


def _duration_lane(t: Timeline) -> None:
    dur = t.durations()
    if dur.is_empty():
        t.notes.append("no step times in the logs")
        return
    t.add(Lane("step duration (s)", 1.2, traces=t.line(dur, "step duration s", "#ff7f0e", fmt=".1f"),
                yaxis=dict(rangemode="tozero")))


def timeline(run: RunAnalysis) -> tuple[dict[str, Any] | None, list[str]]:
    """The run's timeline figure (None when nothing is on a step axis) and notes on lanes left out."""
    rng = run.step_range()
    primary = (
        per_step(run.metrics.filter(pl.col("key") == run.primary_metric), "mean")
        if run.primary_metric else pl.DataFrame(schema={"step": pl.Int64, "value": pl.Float64})
    )
    if rng["count"] == 0 and primary.is_empty():
        return None, []
    last_step = rng["last"] if rng["last"] is not None else int(primary["step"].max())
    t = Timeline(run)
    shapes, annotations = _primary_lane(t, primary, last_step)
    _events_lane(t)
    _server_lanes(t)
    _memory_lane(t)
    _duration_lane(t)
    return t.figure(shapes, annotations), t.notes
