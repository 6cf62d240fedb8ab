"""What ``watch`` does when an alarm fires besides printing it (reports/alarms.py): run the user's
command, alert W&B, write the report. Each action reports what it did in one line; none raises on a failure of its own.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from forensics.analysis import analyze_run
from forensics.detect import Thresholds
from forensics.model import Analysis, iso
from forensics.run import RunData
from forensics.watch import Alarm

_WANDB_RUN_DIR = re.compile(r"^run-\d{8}_\d{6}-(?P<id>[\w-]+)$")


def alarm_environment(alarm: Alarm, report: Path | None) -> dict[str, str]:
    """The ``GRPO_FORENSICS_*`` variables a user command receives."""
    return {
        "GRPO_FORENSICS_STEP": "" if alarm.step is None else str(alarm.step),
        "GRPO_FORENSICS_ONSET_STEP": "" if alarm.onset_step is None else str(alarm.onset_step),
        "GRPO_FORENSICS_KIND": alarm.kind,
        "GRPO_FORENSICS_CAUSE": alarm.cause,
        "GRPO_FORENSICS_TIME": iso(alarm.time) or "",
        "GRPO_FORENSICS_RUN_ID": alarm.run_id,
        "GRPO_FORENSICS_REPORT": str(report) if report else "",
    }


def run_command(command: str, alarm: Alarm, *, report: Path | None = None, timeout: float = 600.0) -> str:
    """Run ``command`` through the shell with the alarm as JSON on stdin and in the environment.
    What it prints goes to standard error: standard output is the alarms' (``watch --json | jq``)."""
    env = {**os.environ, **alarm_environment(alarm, report)}
    payload = json.dumps({**alarm.to_dict(), "report": str(report) if report else None})
    try:
        done = subprocess.run(command, shell=True, input=payload, text=True, env=env, timeout=timeout, check=False,
                              stdout=2)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"--on-alarm command failed: {exc}"
    return f"--on-alarm command exited {done.returncode}"


class Commands:
    """``--on-alarm`` commands, each started at its alarm and left to run while the watch polls on:
    one that hangs (a ``scancel`` waiting on a busy controller) holds up no later alarm, nor
    another run's command. ``wait`` lets those still running finish (each stopped after
    ``timeout`` seconds): a wrapper counts on the command having run once ``watch`` returns."""

    def __init__(self, command: str, say: Callable[[str], None], *, timeout: float = 600.0) -> None:
        self.command, self.say, self.timeout = command, say, timeout
        self._running: list[threading.Thread] = []

    def start(self, alarm: Alarm, report: Path | None) -> None:
        def run() -> None:
            self.say(f"{run_command(self.command, alarm, report=report, timeout=self.timeout)} "
                     f"({alarm.kind} of {alarm.run_id})")

        thread = threading.Thread(target=run, name=f"on-alarm {alarm.kind}", daemon=True)
        thread.start()
        self._running = [t for t in self._running if t.is_alive()] + [thread]

    def wait(self) -> None:
        running = [t for t in self._running if t.is_alive()]
        if running:
            self.say(f"waiting for {len(running)} --on-alarm command{'s' if len(running) > 1 else ''} still running "
                     f"(each stopped after {self.timeout:g} s)")
        for thread in running:
            thread.join()


def write_report(run: RunData, out_dir: Path, alarm: Alarm | None = None) -> tuple[Path | None, str]:
    """The HTML report of the run as it is now, and the line that says where, or why there is none
    (a full disk, a folder that cannot be made): the alarm goes on to be told all the same. Each
    alarm's report has a folder of its own in ``out_dir``: a later alarm, or another run's, does not
    overwrite the report an earlier alarm handed its command."""
    from reports import write_html

    if alarm is not None:
        out_dir = out_dir / report_folder(alarm)
    try:
        report = write_html(Analysis([analyze_run(run, Thresholds())]), out_dir)
    except OSError as exc:
        return None, f"--report-dir: no report written ({exc.strerror or exc}: {exc.filename or out_dir})"
    return report, f"report: {report}"


def report_folder(alarm: Alarm) -> str:
    """``<run id>.<kind>.step<onset>.<run>``, file-safe: one folder an alarm, the same after a
    restart; ``<run>`` (six hex digits of :attr:`Alarm.instance`) tells runs of one id apart."""
    step = alarm.onset_step if alarm.onset_step is not None else alarm.step
    name = f"{alarm.run_id}.{alarm.kind}.step{'' if step is None else step}"
    which = hashlib.sha256(alarm.instance.encode(errors="surrogateescape")).hexdigest()[:6]
    return f"{re.sub(r'[^A-Za-z0-9._-]+', '-', name).strip('-.')[:120] or 'alarm'}.{which}"


def post_wandb_alert(alarm: Alarm, run: RunData) -> str:
    """A W&B alert on the run's own W&B run, when it has one and a key is configured."""
    run_id = _wandb_run_id(run)
    if run_id is None:
        return "--wandb-alert: the run has no online W&B run folder; no alert sent"
    if not os.environ.get("WANDB_API_KEY"):
        return "--wandb-alert: WANDB_API_KEY is not set; no alert sent"
    project = _wandb_project(run)
    try:
        import wandb

        live = wandb.init(id=run_id, project=project, resume="allow", settings=wandb.Settings(silent=True))
        live.alert(title=f"grpo-forensics: {alarm.kind} at step {alarm.step}", text=alarm.summary[:1000],
                   level=wandb.AlertLevel.ERROR)
        live.finish()
    except Exception as exc:  # any failure of a third-party service is a note, never the watcher's end
        return f"--wandb-alert: failed ({type(exc).__name__}: {exc})"
    return f"--wandb-alert: alert sent to W&B run {run_id}"


def _wandb_run_id(run: RunData) -> str | None:
    """The newest online run id under the run's ``wandb/`` folder (offline runs were never uploaded)."""
    for source in run.location.logs:
        if source.kind != "wandb":
            continue
        found = sorted(p.name for p in Path(source.path).iterdir() if _WANDB_RUN_DIR.match(p.name))
        if found:
            return _WANDB_RUN_DIR.match(found[-1])["id"]  # type: ignore[index]
    return None


def _wandb_project(run: RunData) -> str | None:
    from parsers.wandb_run import read_wandb_runs

    for source in run.location.logs:
        if source.kind == "wandb":
            for found in read_wandb_runs(source.path):
                if found.project:
                    return found.project
    return None
