"""The fleet's ``index.html``: every run in one sortable table, linking each run's own report.

It renders the two index tables as they are written to Parquet (``forensics.fleet.index_frames``),
so the page and the tables never disagree. Run ids, roots and errors are untrusted: all go
through :func:`reports.page.e`.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import polars as pl

from forensics.model import SCHEMA, TOOL_VERSION, iso
from reports.labels import run_labels
from reports.page import e, render_page, write_page

# Click a column header to sort by it (numbers as numbers); click again to reverse.
_SORT_JS = """<script>
(function () {
  'use strict';
  function key(row, i) {
    var cell = row.cells[i];
    var v = cell.hasAttribute('data-sort') ? cell.getAttribute('data-sort') : cell.textContent;
    var n = parseFloat(v);
    return v !== '' && isFinite(v) ? n : v.toLowerCase();
  }
  document.querySelectorAll('table.sortable').forEach(function (table) {
    table.querySelectorAll('th').forEach(function (th, i) {
      th.style.cursor = 'pointer';
      th.title = 'sort';
      th.addEventListener('click', function () {
        var body = table.tBodies[0];
        var down = th.getAttribute('data-dir') !== 'asc';
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = key(a, i), y = key(b, i);
          if (x === y) { return 0; }
          if (x === '' || y === '') { return x === '' ? 1 : -1; }
          if (typeof x !== typeof y) { return typeof x === 'number' ? -1 : 1; }
          return (x < y ? -1 : 1) * (down ? 1 : -1);
        });
        table.querySelectorAll('th').forEach(function (h) { h.removeAttribute('data-dir'); });
        th.setAttribute('data-dir', down ? 'asc' : 'desc');
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
  });
})();
</script>"""


def render_index_html(runs: pl.DataFrame, incidents: pl.DataFrame) -> str:
    """The index page of a fleet, from its runs and incidents tables."""
    rows = runs.to_dicts()
    labels = dict(zip(runs["slug"].to_list(), run_labels(runs["run_id"].to_list(), runs["root"].to_list()), strict=True))
    sick = sum(1 for r in rows if r["n_incidents"])
    failed = sum(1 for r in rows if r["error"])
    unsure = sum(1 for r in rows if not r["n_incidents"] and not r["error"] and r["caveat"])
    healthy = len(rows) - sick - failed - unsure
    status = "bad" if sick or failed else "ok"
    parts = [
        f"<h1>{len(rows)} run(s)</h1>",
        f'<div class="status {status}">{sick} with incidents · {healthy} healthy'
        + (f" · {unsure} not judged (no incident, but nothing or not all could be read)" if unsure else "")
        + (f" · {failed} could not be analyzed" if failed else "") + "</div>",
        _causes(incidents),
        '<h2 id="runs">Runs</h2>',
        _table(
            ["run", "framework", "steps", "incidents", "first incident", "onset step", "cause (confidence)",
             "checkpoint step", "lines (unparsed)", "seconds"],
            [_run_row(r, labels[r["slug"]]) for r in rows],
        ),
        '<h2 id="incidents">Incidents</h2>',
        _table(["run", "incident", "kind", "onset step", "onset time", "end step", "cause (confidence)", "wasted steps"],
               [_incident_row(i, labels.get(i["slug"], i["run_id"])) for i in incidents.to_dicts()])
        if incidents.height else "<p>No incident in any run.</p>",
        _SORT_JS,
    ]
    footer = (f"<h2>Provenance</h2><p>grpo-forensics {e(TOOL_VERSION)} · schema <code>{e(SCHEMA)}</code> · "
              "the same tables as Parquet: <code>index.parquet</code> (runs), <code>incidents.parquet</code></p>")
    nav = '<nav><a href="#runs">runs</a><a href="#incidents">incidents</a></nav>'
    return render_page(title=f"grpo-forensics · {len(rows)} runs", head_note=f"grpo-forensics fleet · {len(rows)} run(s)",
                       body="\n".join(parts), footer=footer, figures=[], nav=nav)


def write_index_html(runs: pl.DataFrame, incidents: pl.DataFrame, out_dir: Path) -> Path:
    """Write ``index.html`` into ``out_dir`` (created when missing) and return its path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "index.html"
    return write_page(path, render_index_html(runs, incidents))


def _causes(incidents: pl.DataFrame) -> str:
    if incidents.is_empty():
        return ""
    counts = Counter(incidents["cause"].to_list())
    runs = {c: len(set(incidents.filter(pl.col("cause") == c)["slug"])) for c in counts}
    items = "".join(f"<li><code>{e(c)}</code>: {n} incident(s) in {runs[c]} run(s)</li>" for c, n in counts.most_common())
    return f"<h2>Causes</h2><ul>{items}</ul>"


def _link(text: Any, href: str | None, title: str = "") -> str:
    label = e(text)
    tip = f' title="{e(title)}"' if title else ""
    return f'<a href="{e(href)}"{tip}>{label}</a>' if href else f"<span{tip}>{label}</span>"


def _cell(value: Any, css: str = "", sort: Any = None) -> tuple[str, str, Any]:
    return css, e(value if value is not None else ""), sort


def _run_row(r: dict[str, Any], label: str) -> list[tuple[str, str, Any]]:
    if r["error"]:
        return [("", _link(label, None, r["root"]), label),
                ("text", f'<span class="nr">not analyzed:</span> {e(r["error"])}', None), *[("", "", "")] * 8]
    steps = f"{r['first_step']}–{r['last_step']} ({r['step_count']})" if r["step_count"] else "none"
    first = (_link(r["first_kind"], r["report"] and f"{r['report']}#incident-1") if r["first_kind"]
             else f"— ({e(r['caveat'])})" if r["caveat"] else "—")
    lines = f"{r['lines']:,} ({r['unparsed_lines']:,})" if r["lines"] is not None else ""
    return [
        ("", _link(label, r["report"], r["root"]), label),
        _cell(r["framework"]),
        ("num", e(steps), r["last_step"]),
        ("num" + (" nr" if r["n_incidents"] else ""), e(r["n_incidents"]), r["n_incidents"]),
        ("", first, r["first_kind"] or ""),
        _cell(r["first_onset_step"], "num"),
        _cell(_cause(r["first_cause"], r["first_confidence"]), "", r["first_cause"] or ""),
        _cell(r["checkpoint_step"], "num"),
        ("num", e(lines), r["lines"]),
        _cell(f"{r['seconds']:.1f}", "num"),
    ]


def _incident_row(i: dict[str, Any], label: str) -> list[tuple[str, str, Any]]:
    run_href = i["report"].split("#")[0] if i["report"] else None
    return [
        ("", _link(label, run_href), label),
        ("nowrap", _link(i["id"], i["report"]), i["id"]),
        _cell(i["kind"]),
        _cell(i["onset_step"], "num"),
        _cell(iso(i["onset_time"]), "mono nowrap"),
        _cell("not recovered" if i["end_step"] is None else i["end_step"], "num",
              "" if i["end_step"] is None else i["end_step"]),
        _cell(_cause(i["cause"], i["confidence"]), "", i["cause"]),
        _cell(i["wasted_steps"], "num"),
    ]


def _cause(cause: str | None, confidence: float | None) -> str:
    return f"{cause} ({confidence:.2f})" if cause and confidence is not None else cause or ""


def _table(headers: list[str], rows: list[list[tuple[str, str, Any]]]) -> str:
    """``rows`` hold (css class, already-escaped html, sort key or None) cells."""
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(
            f'<td class="{c}"' + ("" if s is None else f' data-sort="{e(s)}"') + f">{v}</td>" for c, v, s in row
        ) + "</tr>"
        for row in rows
    )
    return f'<table class="sortable"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
