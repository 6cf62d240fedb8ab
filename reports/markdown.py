"""A short Markdown summary to paste into a GitHub issue or a Jira ticket.

Per run: the verdict in one line per incident, its top evidence with file:line, and the
recommended checkpoint with its resume command. Untrusted text never passes as Markdown:

- prose (run ids, reasons, summaries) has every Markdown-significant character backslash-escaped,
  so ``<script>``, ``[x](javascript:…)`` and ``![img](http://…)`` come out as literal text;
- log lines and paths go into code spans whose backtick fence is longer than any backtick run
  inside them, so nothing in them is Markdown or HTML at all;
- the resume command goes into a fenced block with a fence longer than any backtick run in it.
"""

from __future__ import annotations

import re

from forensics.model import Analysis, Incident, RunAnalysis, iso
from reports.labels import run_labels
from reports.page import short
from reports.visible import visible

TOP_EVIDENCE = 3
#: What Markdown (GFM) could read as syntax mid-line: emphasis, links and images, raw HTML and
#: entities, tables, strikethrough, issue refs, mentions, emoji shortcodes, math.
_SPECIAL = re.compile(r"([\\`*_\[\]<>#|~&:$@])")


def text(value: object) -> str:
    """Untrusted text as literal Markdown: one line, every special character escaped."""
    flat = " ".join(str(value).split())
    return _SPECIAL.sub(r"\\\1", flat)


#: What ends a line, in Python's reading and Markdown's.
_LINE_BREAKS = re.compile(r"[\r\n\v\f\x1c-\x1e\x85\u2028\u2029]+")


def code(value: object) -> str:
    """Untrusted text as an inline code span that nothing inside can close, on one line; its spaces
    and tabs kept (a span keeps them: a path with two spaces in it is still that path)."""
    flat = _LINE_BREAKS.sub(" ", str(value))
    longest = max((len(run) for run in re.findall(r"`+", flat)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if flat.startswith("`") or flat.endswith("`") or not flat.strip() else ""
    return f"{fence}{pad}{flat}{pad}{fence}"


def block(value: str, lang: str = "") -> str:
    """A fenced code block that no backtick run inside can close."""
    longest = max((len(run) for run in re.findall(r"`+", value)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{lang}\n{value}\n{fence}"


def _incident(run: RunAnalysis, inc: Incident) -> list[str]:
    end = (f"recovered at step {inc.end_step}" if inc.recovered and inc.end_step is not None
           else f"ended at step {inc.end_step}" if inc.end_step is not None else "**not recovered**")
    end += " (in an attempt a relaunch abandoned)" if inc.redone else ""
    lines = [
        f"- **{text(inc.id)} · {text(inc.kind)}** from step {inc.onset_step} ({iso(inc.onset_time) or 'time unknown'}),"
        f" {end}; wasted {inc.wasted}. Cause: {code(inc.cause)} (confidence {inc.confidence:.2f})."
    ]
    if (ev := inc.onset_evidence) is not None and (ev.file, ev.line) not in {(x.file, x.line) for x in inc.evidence}:
        lines.append(f"  - onset: {code(f'{short(ev.file, run.root)}:{ev.line}')} {code(ev.text[:300])}")
    for ev in inc.evidence[:TOP_EVIDENCE]:
        lines.append(f"  - {code(f'{short(ev.file, run.root)}:{ev.line}')} {code(ev.text[:300])}")
    if len(inc.evidence) > TOP_EVIDENCE:
        lines.append(f"  - … {len(inc.evidence) - TOP_EVIDENCE} more in the HTML report")
    return lines


def labelled(markdown: str, run_id: str, label: str) -> str:
    """One run's summary (:func:`render_markdown`) headed by ``label`` instead of its id: a fleet's
    runs of one id, told apart by their folders as the index tells them."""
    return markdown.replace(f"#### grpo-forensics: {text(run_id)} —", f"#### grpo-forensics: {text(label)} —", 1)


def _run(run: RunAnalysis, label: str) -> list[str]:
    rng = run.step_range()
    steps = f"steps {rng['first']}–{rng['last']}" if rng["count"] else "no steps logged"
    n = len(run.incidents)
    lost, why = run.data_lost(), run.unjudged()
    head = (f"{n} incident{'s' if n != 1 else ''}" if n else "no incident, nothing judged" if why
            else "no incident in what could be read" if lost else "healthy, no incident")
    out = [f"#### grpo-forensics: {text(label)} — {head}", "",
           f"{text(run.framework)}, {steps}, primary metric {code(run.primary_metric or 'none')}", ""]
    if not n and why:
        out += [f"No incident found, but {text(why)}.", ""]
    if lost:
        out += [f"- ⚠ not read: {code(note)}" for note in lost[:TOP_EVIDENCE * 2]]
        out += [f"- … {len(lost) - TOP_EVIDENCE * 2} more in the HTML report"] if len(lost) > TOP_EVIDENCE * 2 else []
        out.append("")
    for inc in run.incidents:
        out += _incident(run, inc)
    rec = run.recommendation
    out.append("")
    if rec.checkpoint:
        out.append(f"**Resume from step {rec.step}:** {code(rec.checkpoint)}. {text(rec.reason)}")
    else:
        out.append(f"**No checkpoint to resume from.** {text(rec.reason)}")
    if rec.resume_command:
        out += ["", block(rec.resume_command, "bash")]
    if rec.warnings:
        out += [""] + [f"- ⚠ {text(w)}" for w in rec.warnings]
    return out


def render_markdown(analysis: Analysis) -> str:
    """The Markdown summary of every run in ``analysis``."""
    parts: list[str] = []
    labels = run_labels([run.run_id for run in analysis.runs], [run.root for run in analysis.runs])
    for run, label in zip(analysis.runs, labels, strict=True):
        parts += _run(run, label) + [""]
    if not analysis.runs:
        parts.append("grpo-forensics: no runs found.")
    return visible("\n".join(parts).rstrip() + "\n")  # (pasted or printed: a log's escape codes must not act)
