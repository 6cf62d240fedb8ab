"""``watch`` on the terminal: an alarm as it fires, and a replay's alarms against the offline verdict."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from forensics.model import iso
from forensics.watch import Alarm, ReplayResult


def print_alarm(alarm: Alarm, console: Console) -> None:
    """The alarm, its cause and where the logs show it."""
    # (run ids and file names are folder names: ``grpo[lr=1e-6]`` is text, not markup)
    console.print(Text.assemble(("ALARM", "bold red"), f" {alarm.run_id}  {alarm.kind}  step {alarm.step}  at {iso(alarm.time) or '?'}"))
    console.print(f"  cause    {alarm.cause}" + (f" (confidence {alarm.confidence:.2f})" if alarm.confidence else ""))
    console.print(f"  onset    step {alarm.onset_step}")
    console.print(f"  summary  {alarm.summary}", markup=False)
    for e in alarm.evidence[:6]:
        console.print(f"    {Path(e.file).name}:{e.line}  {e.text[:100]}", markup=False, highlight=False)


def render_replay(results: list[ReplayResult], console: Console) -> None:
    """One table per run: each alarm's step and time against the offline onset and the last step."""
    for result in results:
        onsets = ", ".join(f"{kind} at step {step}" for kind, step in result.offline_onsets) or "none"
        table = Table(title=Text(f"{result.run_id}: offline incidents {onsets}; last step {result.last_step}"), title_justify="left")
        for column in ("step", "time", "kind", "cause", "onset", "evidence"):
            table.add_column(column, overflow="fold")
        for a in result.alarms:
            where = f"{Path(a.evidence[0].file).name}:{a.evidence[0].line}" if a.evidence else ""
            table.add_row(str(a.step), iso(a.time) or "", a.kind, a.cause, str(a.onset_step), Text(where))
        console.print(table)
        if result.alarms and result.last_step is not None:
            first = result.alarms[0]
            if first.step is not None and first.step < result.last_step:
                said = f"would have stopped {result.run_id} at step {first.step} instead of {result.last_step} ({first.kind})"
            else:  # the run had stopped logging steps by then: an alarm, but no step saved
                when = "its last logged step" if first.step == result.last_step else f"after its last logged step, {result.last_step}"
                said = f"{result.run_id}'s first alarm ({first.kind}) would have come at step {first.step}, {when}: no step saved"
            console.print(said, markup=False, soft_wrap=True)
        else:
            unread = f", from what could be read ({len(result.not_read)} not read, below)" if result.not_read else ""
            console.print(f"no alarm would have fired for {result.run_id}{unread}", markup=False, soft_wrap=True)
        for problem in result.not_read:
            console.print(f"warning: not read: {problem}", markup=False, soft_wrap=True)
        if result.folded:
            said = ", ".join(f"{a.kind} at step {a.step}" for a in result.folded)
            console.print(f"folded into their incident's alarms (no new cause): {said}", markup=False, soft_wrap=True)
