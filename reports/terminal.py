"""Terminal renderings: an analysis (one header per run, one panel per incident, the checkpoint), a comparison, a fleet.

Log text is only ever put into ``rich.text.Text`` objects, so ``[bold]`` or ``:smile:`` in a log
line prints literally.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from forensics.model import Analysis, Incident, RunAnalysis, iso
from reports.labels import run_labels

if TYPE_CHECKING:
    import polars as pl
    from rich.console import Console

    from forensics.compare import Comparison

MAX_SOURCES = 6


def _short(path: str, root: str) -> str:
    root = root.rstrip("/")
    return path[len(root) + 1 :] if root and path.startswith(root + "/") else path


def render_summary(analysis: Analysis, console: Console) -> None:
    """Print a compact summary of every run in ``analysis`` to ``console``."""
    if not analysis.runs:
        console.print("No runs found.", markup=False, highlight=False)
    for k, run in enumerate(analysis.runs):
        if k:
            console.print()
        _run(run, console)


def _run(run: RunAnalysis, console: Console) -> None:
    from rich.text import Text

    rng = run.step_range()
    steps = f"steps {rng['first']}-{rng['last']} ({rng['count']})" if rng["count"] else "no steps logged"
    header = Text.assemble(("run ", "bold"), (run.run_id, "bold cyan"), f"  {run.framework}  {steps}")
    if run.primary_metric:
        header.append(f"  metric {run.primary_metric}", style="dim")
    console.print(header, highlight=False)

    lines = sum(s.lines for s in run.sources)
    unparsed = sum(s.unparsed_lines for s in run.sources)
    console.print(
        Text(f"sources: {len(run.sources)} file(s), {_lines(lines)}, {unparsed:,} unparsed", style="dim"),
        highlight=False,
    )
    for s in run.sources[:MAX_SOURCES]:
        console.print(
            Text(f"  {_short(s.path, run.root)}  {s.kind}  {_lines(s.lines)}, {s.unparsed_lines:,} unparsed",
                 style="dim", no_wrap=True, overflow="ellipsis"),
            highlight=False,
        )
    if len(run.sources) > MAX_SOURCES:
        console.print(Text(f"  ... and {len(run.sources) - MAX_SOURCES} more", style="dim"), highlight=False)

    lost = run.data_lost()
    for note in lost[:MAX_SOURCES]:
        console.print(Text(f"warning: {note}", style="yellow"), highlight=False)
    if len(lost) > MAX_SOURCES:
        console.print(Text(f"warning: ... and {len(lost) - MAX_SOURCES} more unread parts, listed in the report", style="yellow"),
                      highlight=False)
    if not run.incidents and (why := run.unjudged()):
        console.print(Text(f"No incident found, but {why}.", style="bold yellow"), highlight=False)
    elif not run.incidents and lost:
        console.print(Text("No incident found in what could be read (see the warnings above).", style="bold yellow"), highlight=False)
    elif not run.incidents:
        console.print(Text("No incident found: the run looks healthy.", style="bold green"), highlight=False)
    for inc in run.incidents:
        console.print(_incident(run, inc))
    for text in run.observations:
        console.print(Text(f"observation: {text}", style="yellow"), highlight=False)
    _recommendation(run, console)


def _lines(n: int) -> str:
    return f"{n:,} line{'' if n == 1 else 's'}"


def _incident(run: RunAnalysis, inc: Incident):  # -> rich Panel
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="dim", no_wrap=True)
    grid.add_column()
    if inc.metric:
        grid.add_row("metric", Text(inc.metric))
    grid.add_row("onset", Text(f"step {inc.onset_step} at {iso(inc.onset_time) or 'unknown time'}"
                               + (" (in an attempt a relaunch abandoned)" if inc.redone else "")))
    if inc.end_step is not None:
        grid.add_row("end", Text(f"step {inc.end_step}" + (" (recovered)" if inc.recovered else "")))
    else:
        grid.add_row("end", Text("NOT RECOVERED", style="bold red"))
    grid.add_row("wasted", Text(inc.wasted))
    grid.add_row("cause", Text.assemble((inc.cause, "bold"), f" (confidence {inc.confidence:.2f})"))
    if inc.summary:
        grid.add_row("summary", Text(inc.summary))
    for i, advice in enumerate(inc.suggestions):
        grid.add_row("advice" if i == 0 else "", Text(advice))
    parts = [grid]
    if inc.evidence:
        parts.append(Text("evidence", style="dim"))
        for ev in inc.evidence[:3]:
            text = " ".join(ev.text.split())
            # The file and line whole (folded if they must be: a Ray worker's log name is longer than
            # a terminal), the line's text cut to what is left.
            parts.append(Text(f"  {_short(ev.file, run.root)}:{ev.line}", style="cyan", overflow="fold"))
            parts.append(Text(f"    {text}", no_wrap=True, overflow="ellipsis"))
        if len(inc.evidence) > 3:
            parts.append(Text(f"  ... {len(inc.evidence) - 3} more in the HTML report", style="dim"))
    title = Text.assemble((inc.id, "bold"), "  ", (inc.kind, "bold red"))
    return Panel(Group(*parts), title=title, title_align="left", border_style="red")


def _recommendation(run: RunAnalysis, console: Console) -> None:
    from rich.text import Text

    rec = run.recommendation
    console.print(Text("Recommendation", style="bold"), highlight=False)
    # Path and command are printed unwrapped so they stay copy-pasteable.
    if rec.checkpoint:
        console.print(Text.assemble(("  checkpoint  ", "dim"), (rec.checkpoint, "bold green")),
                      soft_wrap=True, highlight=False)
    else:
        console.print(Text.assemble(("  checkpoint  ", "dim"), ("none", "bold yellow")), highlight=False)
    if rec.step is not None:
        console.print(Text.assemble(("  step        ", "dim"), str(rec.step)), highlight=False)
    # (the reason and warnings name paths too: not broken across lines either)
    console.print(Text.assemble(("  reason      ", "dim"), rec.reason), soft_wrap=True, highlight=False)
    if rec.resume_command:
        console.print(Text.assemble(("  resume      ", "dim"), rec.resume_command), soft_wrap=True, highlight=False)
    for w in rec.warnings:
        console.print(Text(f"  warning: {w}", style="yellow"), soft_wrap=True, highlight=False)


def render_comparison(ca: Comparison, console: Console) -> None:
    """Control (A) and fix (B) side by side, then the verdict."""
    from rich.table import Table
    from rich.text import Text

    def num(value: float | None, fmt: str, unit: str = "") -> str:
        return "—" if value is None else format(value, fmt) + unit

    def incidents(run: RunAnalysis) -> Text:
        if not run.incidents:
            return Text("none", style="green")
        return Text("\n".join(f"{i.kind} at step {i.onset_step} ({i.cause})" for i in run.incidents), style="red")

    sa, sb = ca.stats_a, ca.stats_b
    table = Table(title=None, show_lines=False, header_style="bold")
    table.add_column("", style="dim", no_wrap=True)
    table.add_column("A (control)", overflow="fold")
    table.add_column("B (fix)", overflow="fold")
    rows = [
        ("run", sa.run_id, sb.run_id),
        ("steps", *(f"{s.first_step}-{s.last_step}" if s.last_step is not None else "none logged" for s in (sa, sb))),
        ("primary metric", sa.primary_metric or "none", sb.primary_metric or "none"),
        ("final metric", num(sa.final_metric, ".4f"), num(sb.final_metric, ".4f")),
        ("median step", num(sa.median_step_seconds, ".1f", " s"), num(sb.median_step_seconds, ".1f", " s")),
        ("throughput", num(sa.steps_per_hour, ".1f", " steps/h"), num(sb.steps_per_hour, ".1f", " steps/h")),
        ("peak device mem", num(sa.peak_device_used_gb, ".1f", " GB"), num(sb.peak_device_used_gb, ".1f", " GB")),
    ]
    for label, a, b in rows:
        table.add_row(label, Text(a), Text(b))
    table.add_row("incidents", incidents(ca.a), incidents(ca.b))
    console.print(table)
    style = {True: "bold green", False: "bold red", None: "bold"}[ca.avoided]
    for k, line in enumerate(ca.verdict):
        console.print(Text(line, style=style if k == 0 else ""), highlight=False)


def render_fleet_summary(runs: pl.DataFrame, console: Console) -> None:
    """One row per run of a fleet (the runs table of its index): incidents, first cause, checkpoint."""
    from rich.table import Table
    from rich.text import Text

    table = Table(header_style="bold", show_edge=False, pad_edge=False)
    table.add_column("run", overflow="fold", min_width=12)
    table.add_column("steps", justify="right", no_wrap=True)
    table.add_column("incidents: first", overflow="fold")
    table.add_column("cause", overflow="fold")
    table.add_column("checkpoint", justify="right", no_wrap=True)
    labels = run_labels(runs["run_id"].to_list(), runs["root"].to_list())
    for r, label in zip(runs.iter_rows(named=True), labels, strict=True):
        if r["error"]:
            table.add_row(Text(label), "", Text("not analyzed: " + r["error"], style="bold red"), "", "")
            continue
        incidents = Text(str(r["n_incidents"]), style="bold red" if r["n_incidents"] else "yellow" if r["caveat"] else "green")
        if r["first_kind"]:
            incidents.append(f": {r['first_kind']} @ {r['first_onset_step']}")
        elif r["caveat"]:
            incidents.append(", not judged")
        table.add_row(
            Text(label, style="bold cyan"),
            f"{r['first_step']}-{r['last_step']}" if r["step_count"] else "none",
            incidents,
            Text(r["first_cause"] or "") if r["first_cause"] or not r["caveat"] else Text(r["caveat"], style="yellow"),
            "none" if r["checkpoint_step"] is None else f"step {r['checkpoint_step']}",
        )
    console.print(table)
