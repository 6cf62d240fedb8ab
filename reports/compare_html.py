"""``compare.html``: control (A) vs fix (B) on one page, in the same offline shell as the report.

The verdict first, then the numbers side by side, then both primary metrics (and step times)
on one step axis with each run's incident onsets, then each run's incidents.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import polars as pl

from forensics.compare import Comparison, RunStats
from forensics.model import RunAnalysis
from reports.page import e, figure_block, fmt_time, render_page, write_page
from reports.timeline import Lane, Timeline, per_step

COLORS = {"A": "#1f77b4", "B": "#2ca02c"}


def _num(value: float | None, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def _stats_table(ca: Comparison) -> str:
    def row(label: str, get: Any) -> str:
        return f"<tr><th>{label}</th><td>{get(ca.stats_a, ca.a)}</td><td>{get(ca.stats_b, ca.b)}</td></tr>"

    def incidents(_: RunStats, run: RunAnalysis) -> str:
        if not run.incidents:
            return "none"
        return "<br>".join(
            f"{e(i.kind)} at step {i.onset_step} ({e(fmt_time(i.onset_time))}), "
            f"{'recovered' if i.recovered else 'not recovered'} — {e(i.cause)}"
            for i in run.incidents
        )

    rows = [
        row("run", lambda s, r: f"<strong>{e(s.run_id)}</strong><br><code>{e(s.root)}</code>"),
        row("steps", lambda s, r: f"{s.first_step}–{s.last_step}" if s.last_step is not None else "none logged"),
        row("primary metric", lambda s, r: f"<code>{e(s.primary_metric or 'none')}</code>"),
        row("final metric (mean of last 20 steps)", lambda s, r: _num(s.final_metric, ".4f")),
        row("median step time", lambda s, r: _num(s.median_step_seconds, ".1f") + " s"),
        row("throughput (logged span)", lambda s, r: _num(s.steps_per_hour, ".1f") + " steps/h"),
        row("peak device memory used", lambda s, r: _num(s.peak_device_used_gb, ".1f") + " GB"),
        row("incidents", incidents),
    ]
    return ('<table class="side-by-side"><thead><tr><th></th><th>A (control)</th><th>B (fix)</th></tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table>")


def _figure(ca: Comparison) -> dict[str, Any] | None:
    lanes = {"metric": Lane("primary metric by step", 3.0), "duration": Lane("step duration (s)", 1.5)}
    shapes: list[dict[str, Any]] = []
    for tag, run in (("A", ca.a), ("B", ca.b)):
        t = Timeline(run)
        color = COLORS[tag]
        if run.primary_metric:
            series = per_step(run.metrics.filter(pl.col("key") == run.primary_metric), "mean")
            if not series.is_empty():
                lanes["metric"].traces += t.line(series, f"{tag}: {run.primary_metric}", color)
        durations = t.durations()
        if not durations.is_empty():
            lanes["duration"].traces += t.line(durations, f"{tag}: step duration s", color, fmt=".1f")
        for inc in run.incidents:
            shapes.append(dict(type="line", xref="x", yref="paper", x0=inc.onset_step, x1=inc.onset_step, y0=0, y1=1,
                               line=dict(color=color, width=1.5, dash="dash")))
    used = [lane for lane in lanes.values() if lane.traces]
    if not used:
        return None
    base = Timeline(ca.a)
    for lane in used:
        base.add(lane)
    annotations = [
        dict(x=i.onset_step, y=1.0, xref="x", yref="paper", yanchor="bottom", xanchor="left", showarrow=False,
             text=html.escape(f"{tag} {i.kind}", quote=False), font=dict(color=COLORS[tag], size=11))
        for tag, run in (("A", ca.a), ("B", ca.b)) for i in run.incidents
    ]
    return base.figure(shapes, annotations, time_axis=False)


def render_compare_html(ca: Comparison) -> str:
    """The comparison as one self-contained HTML document."""
    cls = {True: "ok", False: "bad", None: "neutral"}[ca.avoided]
    answer = {True: "B avoided A's incident.", False: "B did not avoid A's incident.",
              None: "Whether B avoided A's incident cannot be told." if ca.a.incidents
              else "A cannot be told healthy: nothing to compare B with." if ca.a.caveat() else "Nothing to avoid."}
    verdict = "".join(f"<li>{e(line)}</li>" for line in ca.verdict)
    figure = _figure(ca)
    body = (
        f"<h1>{e(ca.a.run_id)} <span class=\"fw\">(A, control)</span> vs {e(ca.b.run_id)} "
        '<span class="fw">(B, fix)</span></h1>'
        f'<div class="status compare-verdict {cls}" id="verdict">{e(answer[ca.avoided])}<ul>{verdict}</ul></div>'
        f'<section id="numbers">{_stats_table(ca)}</section>'
        '<section class="timeline" id="timeline"><h2>Primary metric and step time, by step</h2>'
        + ('<div class="plot" id="plot-1"></div>' if figure else '<p class="noplot">No step data to plot.</p>')
        + "</section>"
    )
    return render_page(
        title=f"grpo-forensics compare · {ca.a.run_id} vs {ca.b.run_id}",
        head_note="grpo-forensics comparison",
        body=body,
        footer=f"<p>grpo-forensics {e(ca.to_dict()['tool_version'])} · schema <code>grpo-forensics/compare/v1</code> · "
        f"reproduce: <code>grpo-forensics compare {e(ca.a.root)} {e(ca.b.root)}</code></p>",
        figures=[figure_block("plot-1", figure)] if figure else [],
    )


def write_compare_html(ca: Comparison, out_dir: Path, *, name: str = "compare.html") -> Path:
    """Write ``compare.html`` into ``out_dir`` (created when missing) and return its path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / name
    return write_page(path, render_compare_html(ca))
