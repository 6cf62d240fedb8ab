"""The self-contained HTML post-mortem: the verdict first, then one timeline per run, then tables.

Stable anchors for ticket links: ``#incident-1``, ``#checkpoint``, ``#timeline``, ``#evidence``,
``#sources``, ``#provenance`` (later runs of a multi-run report get a ``run-N-`` prefix). Every
piece of text from a log or a path goes through :func:`reports.page.e`.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from forensics.model import SCHEMA, Analysis, Incident, RunAnalysis, iso, kind_words
from reports.page import e, figure_block, fmt_time, render_page, short, write_page
from reports.timeline import timeline

TOP_EVIDENCE = 3


def render_html(analysis: Analysis) -> str:
    """The whole report as one self-contained HTML document."""
    body: list[str] = []
    figures: list[str] = []
    if len(analysis.runs) > 1:
        items = "".join(
            f'<li><a href="#run-{k + 1}">{e(r.run_id)}</a> — {len(r.incidents)} incident(s)</li>'
            for k, r in enumerate(analysis.runs)
        )
        body.append(f'<nav class="runs-nav"><strong>{len(analysis.runs)} runs</strong><ul>{items}</ul></nav>')
    if not analysis.runs:
        body.append('<p class="status ok">No runs in this analysis.</p>')
    for k, run in enumerate(analysis.runs):
        # The first run's anchors are exactly "incident-1", "checkpoint"… (ticket links);
        # later runs get a "run-N-" prefix so ids stay unique.
        prefix = f"run-{k + 1}-" if k else ""
        figure, notes = timeline(run)
        plot_id = f"plot-{k + 1}"
        if figure is not None:
            figures.append(figure_block(plot_id, figure))
        body.append(
            f'<section class="run" id="run-{k + 1}">'
            + _verdict(run, prefix)
            + _timeline_section(prefix, plot_id if figure is not None else None, notes)
            + _tables(run, prefix)
            + "</section>"
        )
    nav = "<nav>" + "".join(
        f'<a href="#{a}">{a}</a>' for a in ("checkpoint", "timeline", "evidence", "sources", "provenance")
    ) + "</nav>" if analysis.runs else ""
    return render_page(
        title="grpo-forensics · " + ", ".join(r.run_id for r in analysis.runs[:3]),
        head_note=f"grpo-forensics post-mortem · {len(analysis.runs)} run(s)",
        body="\n".join(body), footer=_footer(analysis), figures=figures, nav=nav,
    )


def write_html(analysis: Analysis, out_dir: Path, *, name: str = "report.html") -> Path:
    """Write the report into ``out_dir`` (created when missing) and return its path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / name
    return write_page(path, render_html(analysis))


# --------------------------------------------------------------------------- verdict


def _verdict(run: RunAnalysis, prefix: str) -> str:
    rng = run.step_range()
    steps = f"steps {rng['first']}–{rng['last']} ({rng['count']} logged)" if rng["count"] else "no steps logged"
    lost = run.data_lost()
    if run.incidents:
        items = "".join(
            f'<li><a href="#{e(prefix + i.id)}">{e(i.id)}</a> {e(kind_words(i.kind))} at step {i.onset_step}, '
            f"{'recovered at step ' + str(i.end_step) if i.recovered else 'not recovered'}"
            f"{' (in an attempt a relaunch abandoned)' if i.redone else ''} — {e(i.cause)}</li>"
            for i in run.incidents
        )
        status = f'<div class="status bad">{len(run.incidents)} incident(s) found<ul>{items}</ul></div>'
    elif why := run.unjudged():
        status = f'<div class="status neutral">No incident found, but {e(why)}.</div>'
    elif lost:
        status = '<div class="status neutral">No incident found in what could be read (below: what could not).</div>'
    else:
        status = '<div class="status ok">No incident found — the run looks healthy.</div>'
    if lost:
        status += ('<div class="status neutral">Part of the logs could not be read:<ul>'
                   + "".join(f"<li><code>{e(note)}</code></li>" for note in lost) + "</ul></div>")
    cards = "".join(_incident_card(run, inc, prefix) for inc in run.incidents)
    return (
        '<header class="verdict">'
        f'<h1>{e(run.run_id)} <span class="fw">{e(run.framework)}</span></h1>'
        f'<p class="meta">{e(steps)} · primary metric <code>{e(run.primary_metric or "none")}</code>'
        f" · root <code>{e(run.root)}</code></p>"
        + status
        + (f'<div class="verdict-grid"><div>{cards}</div><div>{_recommendation_card(run, prefix)}</div></div>'
           if cards else _recommendation_card(run, prefix))
        + "</header>"
    )


def _end(run: RunAnalysis, inc: Incident) -> str:
    if inc.end_step is None:
        last = run.step_range()["last"]
        return '<span class="nr">not recovered</span>' + (f" (the log ends at step {last})" if last else "")
    return f"step {inc.end_step}{' (recovered)' if inc.recovered else ''}"


def _incident_card(run: RunAnalysis, inc: Incident, prefix: str) -> str:
    rows = [
        ("onset", f"<strong>step {inc.onset_step}</strong> · {e(fmt_time(inc.onset_time))}"),
        ("end", _end(run, inc)),
        ("wasted", e(inc.wasted)),
        ("cause", f"<strong>{e(inc.cause)}</strong> (confidence {inc.confidence:.2f})"),
        ("metric", f"<code>{e(inc.metric or '—')}</code>"),
    ]
    facts = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows)
    evidence = "".join(
        f'<li title="{e(ev.text[:300])}"><code class="loc">{e(short(ev.file, run.root))}:{ev.line}</code>'
        f"{e(ev.text[:300])}</li>"
        for ev in inc.evidence[:TOP_EVIDENCE]
    )
    more = (f' · <a href="#{prefix}evidence">all {len(inc.evidence)} lines</a>'
            if len(inc.evidence) > TOP_EVIDENCE else "")
    onset = ""
    if (ev := inc.onset_evidence) is not None and (ev.file, ev.line) not in {(x.file, x.line) for x in inc.evidence}:
        onset = (f'<p class="onset">Onset line: <code class="loc">{e(short(ev.file, run.root))}:{ev.line}</code>'
                 f"{e(ev.text[:300])}</p>")
    advice = "".join(f"<li>{e(s)}</li>" for s in inc.suggestions)
    return (
        f'<article class="card incident" id="{e(prefix + inc.id)}">'
        f"<h2>{e(inc.id)} · {e(kind_words(inc.kind))}</h2>"
        f'<dl class="facts">{facts}</dl>'
        + (f'<p class="summary">{e(inc.summary)}</p>' if inc.summary else "")
        + (f'<h3>Top evidence{more}</h3><ol class="evidence">{evidence}</ol>' if evidence else "<p>No evidence lines.</p>")
        + onset
        + (f'<h3>What to change</h3><ul class="advice">{advice}</ul>' if advice else "")
        + "</article>"
    )


def _recommendation_card(run: RunAnalysis, prefix: str) -> str:
    rec = run.recommendation
    rows = [
        ("checkpoint", f"<code>{e(rec.checkpoint)}</code>" if rec.checkpoint else "<strong>none</strong>"),
        ("step", e(rec.step if rec.step is not None else "—")),
        ("why", e(rec.reason)),
    ]
    facts = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows)
    command = (f"<h3>Resume command</h3><pre><code>{e(rec.resume_command)}</code></pre>"
               if rec.resume_command else "<p>No resume command.</p>")
    warnings = "".join(f"<li>{e(w)}</li>" for w in rec.warnings)
    return (
        f'<article class="card recommendation{"" if rec.checkpoint else " none"}" id="{prefix}checkpoint">'
        f'<h2>Last healthy checkpoint</h2><dl class="facts">{facts}</dl>{command}'
        + (f'<h3>Warnings</h3><ul class="warnings">{warnings}</ul>' if warnings else "")
        + "</article>"
    )


# --------------------------------------------------------------------------- timeline and tables


def _timeline_section(prefix: str, plot_id: str | None, notes: list[str]) -> str:
    if plot_id is None:
        return f'<section class="timeline" id="{prefix}timeline"><h2>Timeline</h2><p class="noplot">No step data to plot.</p></section>'
    note = "".join(f'<p class="lane-notes">{e(n)}</p>' for n in notes)
    panel = (
        f'<div class="event-line" id="{plot_id}-line" aria-live="polite">'
        '<strong data-field="0">Click an event marker to show its log line here.</strong>'
        '<span class="where mono" data-field="1"></span> <code class="where" data-field="2"></code>'
        '<pre data-field="3" class="mono"></pre></div>'
    )
    return (f'<section class="timeline" id="{prefix}timeline"><h2>Timeline</h2>{note}'
            f'<div class="plot" id="{plot_id}"></div>{panel}</section>')


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
    sources = _event_sources(run)
    ev_rows = [
        [
            ("", f'<a href="#{e(prefix + inc.id)}">{e(inc.id)}</a>'),
            ("mono nowrap", e(iso(ev.time) or "")),
            ("num", e(ev.step if ev.step is not None else "")),
            ("", e(sources.get((ev.file, ev.line), ""))),
            ("", e(ev.kind)),
            ("loc mono", f'<span title="{e(ev.file)}">{e(short(ev.file, run.root))}</span>:{ev.line}'),
            ("text mono", e(ev.text[:300])),
        ]
        for inc in run.incidents
        for ev in inc.evidence
    ]
    out = [f'<h2 id="{prefix}evidence">Evidence</h2>']
    out.append(_table(["incident", "time", "step", "source", "kind", "file:line", "text"], ev_rows)
               if ev_rows else "<p>No evidence: no incident was found.</p>" if not run.incidents
               else "<p>No failure lines: the incidents were seen in the numbers alone (each one's metric line is in its card).</p>")
    if not run.incidents and run.steps.is_empty():
        out.append(_failures_logged(run, prefix))
    if run.checkpoints:
        rec = run.recommendation.checkpoint
        ck_rows = [
            [
                ("loc mono", e(c.path) + (" <strong>(recommended)</strong>" if c.path == rec else "")),
                ("num", e(c.step)), ("", e(c.kind)), ("", "yes" if c.complete else "no"),
                ("", "yes" if c.resumable else "no"), ("mono", e(iso(c.time) or "")), ("text", e("; ".join(c.problems))),
            ]
            for c in sorted(run.checkpoints, key=lambda c: c.step)
        ]
        out.append(f'<h2 id="{prefix}checkpoints">Checkpoints</h2>')
        out.append(_table(["path", "step", "kind", "complete", "resumable", "time", "problems"], ck_rows))
    src_rows = [
        [
            ("loc mono", e(short(s.path, run.root))), ("", e(s.kind)), ("num", f"{s.lines:,}"),
            ("num", f"{s.unparsed_lines:,}" + (f" ({s.unparsed_lines / s.lines:.1%})" if s.lines else "")),
            ("text", e("; ".join(s.notes))),
        ]
        for s in run.sources
    ]
    out.append(f'<h2 id="{prefix}sources">Sources (parse coverage)</h2>')
    out.append(_table(["file", "kind", "lines read", "lines not understood", "notes (what was not found)"], src_rows)
               if src_rows else "<p>No sources.</p>")
    if run.observations:
        out.append("<h3>Observations</h3><ul>" + "".join(f"<li>{e(n)}</li>" for n in run.observations) + "</ul>")
    if run.notes:
        out.append("<h3>Notes</h3><ul>" + "".join(f"<li>{e(n)}</li>" for n in run.notes) + "</ul>")
    return "\n".join(out)


def _failures_logged(run: RunAnalysis, prefix: str) -> str:
    """With no step to place an incident at, the failures the logs hold: each kind's first line."""
    failures = run.failures_logged()
    if failures.is_empty():
        return ""
    rows = [
        [
            ("", e(f["kind"])), ("num", f"{f['count']:,}"), ("mono nowrap", e(iso(f["time"]) or "")),
            ("loc mono", f'<span title="{e(f["file"])}">{e(short(f["file"], run.root))}</span>:{f["line"]}'),
            ("text mono", e((f["message"] or "")[:300])),
        ]
        for f in failures.iter_rows(named=True)
    ]
    return (f'<h2 id="{prefix}failures">Failures logged</h2><p>No training step was logged, so no incident '
            "can be placed; each kind of failure the logs hold, with its first line:</p>"
            + _table(["kind", "count", "first at", "file:line", "text"], rows))


def _footer(analysis: Analysis) -> str:
    parts = [f"<h2>Provenance</h2><p>grpo-forensics {e(analysis.tool_version)} · schema <code>{e(SCHEMA)}</code></p>"]
    for run in analysis.runs:
        label = f" — {e(run.run_id)}" if len(analysis.runs) > 1 else ""
        parts.append(f"<p>Reproduce{label}: <code>grpo-forensics analyze {e(run.root)}</code></p>")
        rows = [
            [("loc mono", e(s.path)), ("num", "" if s.bytes is None else f"{s.bytes:,}"),
             ("mono", e(s.digest or "")), ("", e(s.digest_method or ""))]
            for s in run.sources
        ]
        if rows:
            parts.append(f"<h3>Inputs{label}</h3>" + _table(["file", "bytes", "digest", "method"], rows))
        if run.thresholds:
            rows = [
                [("mono", e(k)), ("mono", e(v if isinstance(v, (str, int, float)) else json.dumps(v, default=str)))]
                for k, v in sorted(run.thresholds.items())
            ]
            parts.append(f"<h3>Thresholds{label}</h3>" + _table(["threshold", "value"], rows))
    return "\n".join(parts)
