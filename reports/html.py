"""The self-contained HTML post-mortem: verdict first, then one timeline per run, then tables.

Everything that came from a log or a path is untrusted: it goes through :func:`html.escape`
in markup, and into plotly only as JSON data with ``<``, ``>`` and ``&`` escaped (plotly hover
text interprets a few tags, so hover strings are HTML-escaped too). plotly is imported lazily.
"""

from __future__ import annotations

import html
import json
import math
import re
import textwrap
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any

import polars as pl

from forensics.model import SCHEMA, Analysis, Incident, RunAnalysis, iso

#: A numeric lane with more points than this is bucketed by step for display.
MAX_POINTS = 5_000
#: Buckets used when a numeric lane is bucketed (mean line + min/max band).
BUCKETS = 2_000
#: The event lane carries ~400 bytes of hover text per marker: above this many markers,
#: events are grouped by (kind, step bucket), keeping a count, the worst severity and the
#: first message, so that a 20,000-event run adds well under 1 MB to the page.
MAX_EVENT_MARKERS = 1_000
HOVER_CHARS = 200
PROBLEM_SEVERITIES = ("warning", "error", "fatal")
SEVERITY_COLOR = {"warning": "#e8a400", "error": "#d62728", "fatal": "#6b0000"}
MEMORY_KEYS = ("mem/device_used_gb", "mem/device_total_gb")

_JSON_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def e(value: Any) -> str:
    """Text for HTML (element content or a quoted attribute)."""
    return html.escape("" if value is None else str(value), quote=True)


def _script_json(text: str) -> str:
    """JSON that cannot end the ``<script>`` element it is embedded in."""
    return re.sub("[<>&\u2028\u2029]", lambda m: _JSON_ESCAPES[m.group(0)], text)


def _hover(text: str | None, limit: int = HOVER_CHARS) -> str:
    """Untrusted text for a plotly hover label: truncated, wrapped, tags neutralised."""
    text = (text or "").replace("\r", " ")
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    lines = textwrap.wrap(text, 100, break_long_words=True, replace_whitespace=True) or [""]
    return "<br>".join(html.escape(line, quote=True) for line in lines)


def _fmt_time(t: datetime | None) -> str:
    return iso(t) or "time unknown"


def _short(path: str, root: str) -> str:
    """``path`` relative to the run root when it lies inside it."""
    root = root.rstrip("/")
    if root and path.startswith(root + "/"):
        return path[len(root) + 1 :]
    return path


# --------------------------------------------------------------------------- public API


def render_html(analysis: Analysis) -> str:
    """The whole report as one self-contained HTML document."""
    from plotly.offline import get_plotlyjs

    template = resources.files("reports").joinpath("_page.html").read_text(encoding="utf-8")
    many = len(analysis.runs) > 1
    body: list[str] = []
    figures: list[str] = []
    if many:
        items = "".join(
            f'<li><a href="#run-{k + 1}">{e(r.run_id)}</a> — '
            f"{len(r.incidents)} incident(s)</li>"
            for k, r in enumerate(analysis.runs)
        )
        body.append(f'<nav class="runs-nav"><strong>{len(analysis.runs)} runs</strong><ul>{items}</ul></nav>')
    if not analysis.runs:
        body.append('<p class="status ok">No runs in this analysis.</p>')
    for k, run in enumerate(analysis.runs):
        # Anchors of the first run are exactly the incident ids / "checkpoint" (ticket links);
        # later runs get a "run-N-" prefix so ids stay unique.
        prefix = f"run-{k + 1}-" if k else ""
        plot_id = f"plot-{k + 1}"
        fig_json = _timeline_json(run)
        body.append(
            f'<section class="run" id="run-{k + 1}">'
            + _verdict(run, prefix)
            + '<section class="timeline"><h2>Timeline</h2>'
            + (f'<div class="plot" id="{plot_id}"></div>' if fig_json else '<p class="noplot">No step data to plot.</p>')
            + "</section>"
            + _tables(run, prefix)
            + "</section>"
        )
        if fig_json:
            figures.append(f'<script type="application/json" data-plot="{plot_id}">{_script_json(fig_json)}</script>')
    values = {
        "title": e("grpo-forensics · " + ", ".join(r.run_id for r in analysis.runs[:3])),
        "generated_for": e(f"{len(analysis.runs)} run(s)"),
        "tool_version": e(analysis.tool_version),
        "body": "\n".join(body),
        "footer": _footer(analysis),
        "figure_data": "\n".join(figures),
        "plotly_js": get_plotlyjs().replace("</script", "<\\/script"),
    }
    # One pass: text substituted in is never scanned for placeholders again.
    return re.sub(r"\{\{(\w+)\}\}", lambda m: values[m.group(1)], template)


def write_html(analysis: Analysis, out_dir: Path, *, name: str = "report.html") -> Path:
    """Write the report into ``out_dir`` (created when missing) and return its path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / name
    path.write_text(render_html(analysis), encoding="utf-8")
    return path


# --------------------------------------------------------------------------- verdict


def _verdict(run: RunAnalysis, prefix: str) -> str:
    rng = run.step_range()
    steps = f"steps {rng['first']}–{rng['last']} ({rng['count']} logged)" if rng["count"] else "no steps logged"
    parts = [
        '<header class="verdict">',
        f'<h1>{e(run.run_id)} <span class="fw">{e(run.framework)}</span></h1>',
        f'<p class="meta">{e(steps)} · primary metric <code>{e(run.primary_metric or "none")}</code>'
        f" · root <code>{e(run.root)}</code></p>",
    ]
    if run.incidents:
        parts.append(f'<div class="status bad">{len(run.incidents)} incident(s) found</div>')
    else:
        parts.append('<div class="status ok">No incident found — the run looks healthy.</div>')
    for inc in run.incidents:
        parts.append(_incident_card(run, inc, prefix))
    parts.append(_recommendation_card(run, prefix))
    parts.append("</header>")
    return "\n".join(parts)


def _incident_card(run: RunAnalysis, inc: Incident, prefix: str) -> str:
    end = (
        f"step {inc.end_step} (recovered)" if inc.recovered and inc.end_step is not None
        else f"step {inc.end_step}" if inc.end_step is not None
        else None
    )
    hours = inc.wasted_hours
    wasted = f"{inc.wasted_steps} steps" + (f" · {hours:.2f} h wall clock" if hours is not None else "")
    rows = [
        ("metric", f"<code>{e(inc.metric or '—')}</code>"),
        ("onset", f"step {inc.onset_step} · {e(_fmt_time(inc.onset_time))}"),
        ("end", e(end) if end else '<span class="nr">not recovered</span>'),
        ("wasted", e(wasted)),
        ("cause", f"<strong>{e(inc.cause)}</strong> (confidence {inc.confidence:.2f})"),
    ]
    facts = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows)
    evidence = "".join(
        f'<li><code class="loc" title="{e(ev.file)}:{ev.line}">{e(_short(ev.file, run.root))}:{ev.line}</code>'
        f"<span>{e(ev.text[:300])}</span></li>"
        for ev in inc.evidence[:3]
    )
    onset = ""
    if inc.onset_evidence is not None:
        ev = inc.onset_evidence
        onset = (
            f'<p class="summary">Onset line: <code class="loc">{e(_short(ev.file, run.root))}:{ev.line}</code> '
            f"{e(ev.text[:300])}</p>"
        )
    more = f" ({len(inc.evidence) - 3} more in the evidence table)" if len(inc.evidence) > 3 else ""
    return (
        f'<article class="card incident" id="{e(prefix + inc.id)}">'
        f"<h2>{e(inc.id)} · {e(inc.kind.replace('_', ' '))}</h2>"
        f'<dl class="facts">{facts}</dl>'
        + (f'<p class="summary">{e(inc.summary)}</p>' if inc.summary else "")
        + onset
        + (f"<h3>Top evidence{e(more)}</h3><ol class=\"evidence\">{evidence}</ol>" if evidence else "<p>No evidence lines.</p>")
        + (f"<h3>What to change</h3><ul>{''.join(f'<li>{e(s)}</li>' for s in inc.suggestions)}</ul>" if inc.suggestions else "")
        + "</article>"
    )


def _recommendation_card(run: RunAnalysis, prefix: str) -> str:
    rec = run.recommendation
    if rec.checkpoint:
        head = f"<code>{e(rec.checkpoint)}</code>"
    else:
        head = "<strong>none</strong>"
    rows = [("checkpoint", head), ("step", e(rec.step if rec.step is not None else "—")), ("reason", e(rec.reason))]
    facts = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows)
    command = (
        f"<h3>Resume command</h3><pre><code>{e(rec.resume_command)}</code></pre>"
        if rec.resume_command
        else "<p>No resume command.</p>"
    )
    warnings = (
        '<h3>Warnings</h3><ul class="warnings">' + "".join(f"<li>{e(w)}</li>" for w in rec.warnings) + "</ul>"
        if rec.warnings
        else ""
    )
    cls = "card recommendation" + ("" if rec.checkpoint else " none")
    return (
        f'<article class="{cls}" id="{prefix}checkpoint"><h2>Last healthy checkpoint</h2>'
        f'<dl class="facts">{facts}</dl>{command}{warnings}</article>'
    )


# --------------------------------------------------------------------------- tables


def _table(headers: list[str], rows: list[list[tuple[str, str]]]) -> str:
    """``rows`` hold (css class, already-escaped html) cells."""
    head = "".join(f"<th>{h}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f'<td class="{c}">{v}</td>' for c, v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _event_sources(run: RunAnalysis) -> dict[tuple[str, int], str]:
    """(file, line) → event source, for the evidence lines."""
    keys = {(ev.file, ev.line) for inc in run.incidents for ev in inc.evidence}
    if not keys or run.events.is_empty():
        return {}
    hits = run.events.filter(
        pl.col("file").is_in([k[0] for k in keys]) & pl.col("line").is_in([k[1] for k in keys])
    ).select("file", "line", "source")
    return {(f, ln): s for f, ln, s in hits.iter_rows()}


def _tables(run: RunAnalysis, prefix: str) -> str:
    out: list[str] = []
    sources = _event_sources(run)
    ev_rows = [
        [
            ("", f'<a href="#{e(prefix + inc.id)}">{e(inc.id)}</a>'),
            ("mono", e(iso(ev.time) or "")),
            ("num", e(ev.step if ev.step is not None else "")),
            ("", e("/".join(x for x in (sources.get((ev.file, ev.line)), ev.kind) if x))),
            ("loc mono", f'<span title="{e(ev.file)}">{e(_short(ev.file, run.root))}</span>:{ev.line}'),
            ("text mono", e(ev.text[:300])),
        ]
        for inc in run.incidents
        for ev in inc.evidence
    ]
    out.append("<h2>Evidence</h2>")
    out.append(
        _table(["incident", "time", "step", "source/kind", "file:line", "text"], ev_rows)
        if ev_rows
        else "<p>No evidence: no incident was found.</p>"
    )
    if run.checkpoints:
        rec = run.recommendation.checkpoint
        ck_rows = [
            [
                ("loc mono", e(c.path) + (" <strong>(recommended)</strong>" if c.path == rec else "")),
                ("num", e(c.step)),
                ("", e(c.kind)),
                ("", "yes" if c.complete else "no"),
                ("", "yes" if c.resumable else "no"),
                ("mono", e(iso(c.time) or "")),
                ("text", e("; ".join(c.problems))),
            ]
            for c in sorted(run.checkpoints, key=lambda c: c.step)
        ]
        out.append("<h2>Checkpoints</h2>")
        out.append(_table(["path", "step", "kind", "complete", "resumable", "time", "problems"], ck_rows))
    src_rows = [
        [
            ("loc mono", e(s.path)),
            ("", e(s.kind)),
            ("num", f"{s.lines:,}"),
            ("num", f"{s.unparsed_lines:,}" + (f" ({s.unparsed_lines / s.lines:.1%})" if s.lines else "")),
            ("text", e("; ".join(s.notes))),
        ]
        for s in run.sources
    ]
    out.append("<h2>Sources (parse coverage)</h2>")
    out.append(_table(["path", "kind", "lines", "unparsed lines", "notes"], src_rows) if src_rows else "<p>No sources.</p>")
    if run.notes:
        out.append("<h3>Notes</h3><ul>" + "".join(f"<li>{e(n)}</li>" for n in run.notes) + "</ul>")
    return "\n".join(out)


def _footer(analysis: Analysis) -> str:
    parts = [f"<p>grpo-forensics {e(analysis.tool_version)} · schema <code>{e(SCHEMA)}</code></p>"]
    for run in analysis.runs:
        if not run.thresholds:
            continue
        rows = [
            [("mono", e(k)), ("mono", e(v if isinstance(v, (str, int, float)) else json.dumps(v, default=str)))]
            for k, v in sorted(run.thresholds.items())
        ]
        label = f" ({e(run.run_id)})" if len(analysis.runs) > 1 else ""
        parts.append(f"<h3>Thresholds{label}</h3>" + _table(["threshold", "value"], rows))
    return "\n".join(parts)


# --------------------------------------------------------------------------- timeline


def _finite(col: str = "value") -> pl.Expr:
    return pl.when(pl.col(col).is_finite()).then(pl.col(col)).otherwise(None)


def _per_step(frame: pl.DataFrame, how: str) -> pl.DataFrame:
    """(step, value) with one row per step, non-finite values dropped."""
    agg = {"mean": _finite().mean(), "max": _finite().max()}[how]
    return (
        frame.filter(pl.col("step").is_not_null())
        .group_by("step")
        .agg(agg.alias("value"))
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
        .sort("bucket")
        .rename({"bucket": "step"})
    )
    return out, True


def _num(values: list[Any]) -> list[Any]:
    return [None if v is None else float(f"{v:.6g}") for v in values]


def _line(go: Any, fig: Any, series: pl.DataFrame, row: int, name: str, color: str, dash: str | None = None) -> None:
    """A line for (step, value), bucketed to mean + min/max band for big series."""
    data, bucketed = _bucket(series)
    x = data["step"].to_list()
    label = html.escape(name)
    if bucketed:
        band = dict(x=x, mode="lines", line=dict(width=0, color=color), hoverinfo="skip",
                    showlegend=False, legendgroup=label)
        fig.add_trace(go.Scatter(y=_num(data["hi"].to_list()), **band), row=row, col=1)
        fig.add_trace(go.Scatter(y=_num(data["lo"].to_list()), fill="tonexty", opacity=0.3, **band), row=row, col=1)
        label += " (bucket mean, min–max band)"
    fig.add_trace(
        go.Scatter(x=x, y=_num(data["value"].to_list()), mode="lines", name=label, legendgroup=label,
                   line=dict(color=color, width=1.5, dash=dash)),
        row=row, col=1,
    )


def _note(fig: Any, row: int, text: str) -> None:
    fig.add_annotation(text=html.escape(text), xref="x domain", yref="y domain", x=0.5, y=0.5,
                       showarrow=False, font=dict(color="#5f6368"), row=row, col=1)


def _with_steps(frame: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """Give rows that have a time but no step the step logged last before that time."""
    missing = frame.filter(pl.col("step").is_null() & pl.col("time").is_not_null())
    if missing.is_empty():
        return frame
    clock = steps.filter(pl.col("time").is_not_null()).select("time", pl.col("step").alias("_s")).sort("time")
    if clock.is_empty():
        return frame
    mapped = (
        missing.sort("time").join_asof(clock, on="time", strategy="backward")
        .with_columns(pl.col("_s").alias("step")).drop("_s")
    )
    return pl.concat([frame.filter(pl.col("step").is_not_null()), mapped.select(frame.columns)])


def _event_markers(run: RunAnalysis) -> pl.DataFrame:
    """Warning/error/fatal events with a step, grouped by (kind, step bucket) when there are many."""
    rank = {s: i for i, s in enumerate(PROBLEM_SEVERITIES)}
    ev = (
        run.events.filter(pl.col("severity").is_in(PROBLEM_SEVERITIES) & pl.col("step").is_not_null())
        .with_columns(pl.col("severity").replace_strict(rank, return_dtype=pl.Int8).alias("rank"))
        .sort("step", "time", "line", nulls_last=True)
    )
    if ev.height <= MAX_EVENT_MARKERS:
        return ev.with_columns(pl.lit(1).alias("n"), pl.col("step").alias("last"))
    width = 1
    while True:
        grouped = (
            ev.with_columns((pl.col("step") // width).alias("bucket"))
            .group_by("kind", "bucket", maintain_order=True)
            .agg(
                pl.len().alias("n"), pl.col("step").first(), pl.col("step").max().alias("last"),
                pl.col("rank").max(), pl.col("time").first(), pl.col("file").first(),
                pl.col("line").first(), pl.col("message").first(),
            )
        )
        if grouped.height <= MAX_EVENT_MARKERS:
            return grouped
        width *= 2


def _timeline_json(run: RunAnalysis) -> str | None:
    """The run's timeline figure as plotly JSON, or None when there is nothing on a step axis."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    rng = run.step_range()
    primary = (
        _per_step(run.metrics.filter(pl.col("key") == run.primary_metric), "mean")
        if run.primary_metric else pl.DataFrame(schema={"step": pl.Int64, "value": pl.Float64})
    )
    if rng["count"] == 0 and primary.is_empty():
        return None
    last_step = rng["last"] if rng["last"] is not None else int(primary["step"].max())

    fig = make_subplots(
        rows=4, cols=1, shared_xaxes=True, vertical_spacing=0.045, row_heights=[0.37, 0.23, 0.2, 0.2],
        subplot_titles=[
            html.escape(run.primary_metric or "primary metric"),
            "warning / error / fatal events",
            "device memory (GB)",
            "step duration (s)",
        ],
    )

    # (a) primary metric, incident bands, checkpoints
    if primary.is_empty():
        _note(fig, 1, "no values for the primary metric" if run.primary_metric else "no primary metric")
        y_top = 1.0
    else:
        _line(go, fig, primary, 1, run.primary_metric or "", "#1f77b4")
        y_top = float(primary["value"].max())
    shapes: list[dict[str, Any]] = []
    for inc in run.incidents:
        end = inc.end_step if inc.end_step is not None else last_step
        shapes.append(dict(type="rect", xref="x", yref="paper", x0=inc.onset_step, x1=max(end, inc.onset_step + 0.5),
                           y0=0, y1=1, fillcolor="rgba(214,39,40,0.10)", line=dict(width=0), layer="below"))
        shapes.append(dict(type="line", xref="x", yref="paper", x0=inc.onset_step, x1=inc.onset_step, y0=0, y1=1,
                           line=dict(color="#d62728", width=1.5, dash="dash")))
        fig.add_annotation(x=inc.onset_step, y=1.0, xref="x", yref="paper", yanchor="bottom", showarrow=False,
                           text=html.escape(inc.id), font=dict(color="#d62728", size=11))
    if run.incidents:
        at = {s: v for s, v in primary.iter_rows()} if not primary.is_empty() else {}
        fig.add_trace(go.Scatter(
            x=[i.onset_step for i in run.incidents],
            y=[_num([at.get(i.onset_step, y_top)])[0] for i in run.incidents],
            mode="markers", name="incident onset", marker=dict(symbol="x", size=11, color="#d62728"),
            hoverinfo="text",
            hovertext=[
                f"<b>{html.escape(i.id)}</b> {html.escape(i.kind)} from step {i.onset_step}"
                f" to {i.end_step if i.end_step is not None else 'end (not recovered)'}"
                f"<br>cause: {html.escape(i.cause)} ({i.confidence:.2f})<br>{_hover(i.summary)}"
                for i in run.incidents
            ],
        ), row=1, col=1)
    if run.checkpoints:
        cks = sorted(run.checkpoints, key=lambda c: c.step)
        rec = run.recommendation.checkpoint
        for c in cks:
            shapes.append(dict(type="line", xref="x", yref="y domain", x0=c.step, x1=c.step, y0=0, y1=1,
                               line=dict(color="#1b7f3b" if c.path == rec else "#9aa0a6", width=1, dash="dot")))
        fig.add_trace(go.Scatter(
            x=[c.step for c in cks], y=[_num([y_top])[0]] * len(cks), mode="markers", name="checkpoints",
            marker=dict(symbol="triangle-down", size=10,
                        color=["#1b7f3b" if c.path == rec else ("#5f6368" if c.complete else "#dadce0") for c in cks],
                        line=dict(color="#202124", width=0.5)),
            hoverinfo="text",
            hovertext=[
                f"<b>checkpoint step {c.step}</b>{' (recommended)' if c.path == rec else ''}<br>"
                f"{_hover(c.path, 400)}<br>{html.escape(c.kind)} · complete: {c.complete} · resumable: {c.resumable}"
                for c in cks
            ],
        ), row=1, col=1)

    # (b) warning/error/fatal events, one row per kind
    markers = _event_markers(run)
    if markers.is_empty():
        _note(fig, 2, "no warning/error events with a step")
    else:
        for r, severity in enumerate(PROBLEM_SEVERITIES):
            part = markers.filter(pl.col("rank") == r)
            if part.is_empty():
                continue
            hover = [
                (f"<b>{n} × {html.escape(kind)}</b> (steps {step}–{last})<br>first: " if n > 1
                 else f"<b>{html.escape(kind)}</b> · {severity} · step {step}<br>")
                + f"{html.escape(_fmt_time(t))} · {_hover(f'{_short(file, run.root)}:{line}', 300)}<br>{_hover(msg)}"
                for kind, step, last, n, t, file, line, msg in part.select(
                    "kind", "step", "last", "n", "time", "file", "line", "message").iter_rows()
            ]
            sizes = [min(18, 7 + 2 * math.log2(n)) for n in part["n"].to_list()]
            fig.add_trace(go.Scatter(
                x=part["step"].to_list(), y=[html.escape(k) for k in part["kind"].to_list()], mode="markers",
                name=severity, marker=dict(color=SEVERITY_COLOR[severity], size=sizes, symbol="line-ns-open",
                                           line=dict(width=2, color=SEVERITY_COLOR[severity])),
                hoverinfo="text", hovertext=hover,
            ), row=2, col=1)
        fig.update_yaxes(type="category", categoryorder="category descending", row=2, col=1)

    # (c) device memory
    mem = run.metrics.filter(pl.col("key").is_in(MEMORY_KEYS))
    if not mem.is_empty():
        mem = _with_steps(mem, run.steps)
    used = _per_step(mem.filter(pl.col("key") == MEMORY_KEYS[0]), "max")
    total = _per_step(mem.filter(pl.col("key") == MEMORY_KEYS[1]), "max")
    if used.is_empty() and total.is_empty():
        _note(fig, 3, "no memory lines in the logs")
    else:
        if not used.is_empty():
            _line(go, fig, used, 3, "device used GB (max over devices)", "#9467bd")
        if not total.is_empty():
            _line(go, fig, total, 3, "device total GB", "#5f6368", dash="dash")

    # (d) seconds between consecutive logged steps
    dur = (
        run.steps.filter(pl.col("step").is_not_null() & pl.col("time").is_not_null())
        .sort("step", "time").unique("step", keep="first", maintain_order=True)
        .with_columns((pl.col("time").diff().dt.total_milliseconds() / 1000).alias("value"))
        .filter(pl.col("value").is_not_null())
        .select("step", "value")
    )
    if dur.is_empty():
        _note(fig, 4, "no step times in the logs")
    else:
        _line(go, fig, dur, 4, "step duration s", "#ff7f0e")

    fig.update_xaxes(title_text="step", row=4, col=1)
    fig.update_xaxes(showspikes=True, spikemode="across", spikethickness=1)
    fig.update_layout(
        shapes=shapes, height=900, hovermode="closest", template="plotly_white",
        margin=dict(l=70, r=20, t=50, b=60),
        legend=dict(orientation="h", yanchor="top", y=-0.06, x=0),
        hoverlabel=dict(align="left"),
    )
    return fig.to_json()
