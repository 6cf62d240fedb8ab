"""The results of an analysis, as small immutable records.

Frames (metrics, events, step times) stay Polars frames; everything the tool *claims*
(incidents, checkpoints, the recommendation) is a frozen dataclass that turns into the
CONTRACT's JSON document with :func:`Analysis.to_document`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import polars as pl

from forensics.markers import event_markers
from forensics.texts import with_messages

SCHEMA = "grpo-forensics/analysis/v1"
TOOL_VERSION = "0.1.0"
#: Source notes that say part of a source could not be read: shown wherever the verdict is, since
#: a collapse may sit in what is missing.
_LOST = re.compile(r"^not read|cannot read|corrupt|torn |cut off|incomplete|the rest (?:of \w+ )*(?:was|were) skipped|no readable"
                   r"|not a W&B transaction log|\bno records$|no time parsed with|failed their data checksum")

Framework = Literal["areal", "verl", "trl", "custom", "unknown"]
IncidentKind = Literal["reward_collapse", "reward_drop", "zero_variance", "dead_loss", "stall", "crash", "nan_inf", "server_down"]
#: The incidents the training numbers themselves show (beside a process's or a server's failure).
FROM_THE_NUMBERS: tuple[IncidentKind, ...] = ("reward_collapse", "reward_drop", "zero_variance", "dead_loss", "nan_inf")
_KIND_WORDS = {"zero_variance": "dead batches (zero variance)", "nan_inf": "non-finite values (NaN/Inf)",
               "server_down": "inference server down",
               "dead_loss": "dead loss (exactly 0, rewards live)"}


def kind_words(kind: str) -> str:
    """An incident kind in words: ``reward collapse``, ``non-finite values (NaN/Inf)``."""
    return _KIND_WORDS.get(kind, kind.replace("_", " "))

Cause = Literal[
    "inference_server_unresponsive",
    "inference_server_crash",
    "inference_server_oom",
    "training_worker_crash",
    "nccl_timeout",
    "reward_pipeline",
    "numerical_divergence",
    "loss_computation",
    "unknown",
]
CheckpointKind = Literal["hf_export", "recover", "verl", "trl"]


def step_span(first: int, last: int) -> str:
    """``step 7`` or ``steps 7–9``, as a summary names a stretch of steps."""
    return f"step {first}" if first == last else f"steps {first}–{last}"


def iso(t: datetime | None) -> str | None:
    """ISO 8601 local wall-clock text, milliseconds kept only when present."""
    if t is None:
        return None
    text = t.isoformat(timespec="milliseconds")
    return text[:-4] if text.endswith(".000") else text


@dataclass(frozen=True)
class Evidence:
    """One log line that supports a claim."""

    kind: str
    time: datetime | None
    step: int | None
    file: str
    line: int
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "time": iso(self.time),
            "step": self.step,
            "file": self.file,
            "line": self.line,
            "text": self.text[:300],
        }


@dataclass(frozen=True)
class Incident:
    """A stretch of a run that went wrong, with its cause and the lines that show it."""

    id: str
    kind: IncidentKind
    metric: str | None
    onset_step: int
    onset_time: datetime | None
    end_step: int | None
    recovered: bool
    cause: Cause
    confidence: float
    evidence: tuple[Evidence, ...]
    wasted_steps: int
    wasted_hours: float | None = None
    summary: str = ""
    onset_evidence: Evidence | None = None
    suggestions: tuple[str, ...] = ()
    redone: bool = False
    """In an attempt a relaunch from an earlier checkpoint abandoned and logged again: not in the
    run's final history (the checkpoint choice passes over it)."""
    began_after: int | None = None
    """The last step known healthy when the steps before the onset logged no value: the incident
    may have begun in any step after it (no checkpoint saved in them is known healthy)."""

    @property
    def wasted(self) -> str:
        """What the incident cost, in words: steps learned from garbage, and the wall clock; a
        stall wastes time with no step (``13.41 h with no step logged``)."""
        hours = f"{self.wasted_hours:.2f} h" if self.wasted_hours is not None else None
        if self.wasted_steps == 0:
            return f"{hours} with no step logged" if self.wasted_hours and self.wasted_hours >= 0.005 else "0 steps"
        unit = "step" if self.wasted_steps == 1 else "steps"
        return f"{self.wasted_steps} {unit}" + (f" ({hours})" if hours else "")

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "metric": self.metric,
            "onset_step": self.onset_step,
            "onset_time": iso(self.onset_time),
            "end_step": self.end_step,
            "recovered": self.recovered,
            "cause": self.cause,
            "confidence": round(self.confidence, 2),
            "evidence": [e.to_dict() for e in self.evidence[:20]],
            "wasted_steps": self.wasted_steps,
            "wasted_hours": None if self.wasted_hours is None else round(self.wasted_hours, 2),
            "summary": self.summary,
            "onset_evidence": self.onset_evidence.to_dict() if self.onset_evidence else None,
            "suggestions": list(self.suggestions),
        }


@dataclass(frozen=True)
class Checkpoint:
    """A saved model state, with its step in log units and whether it can be used."""

    path: str
    step: int
    kind: CheckpointKind
    complete: bool
    resumable: bool
    time: datetime | None = None
    problems: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "step": self.step,
            "kind": self.kind,
            "complete": self.complete,
            "resumable": self.resumable,
            "time": iso(self.time),
            "problems": list(self.problems),
        }


@dataclass(frozen=True)
class Recommendation:
    """Which checkpoint to go back to, and why."""

    checkpoint: str | None
    step: int | None
    reason: str
    resume_command: str | None
    warnings: tuple[str, ...] = ()
    unlisted: tuple[str, ...] = ()
    """Checkpoint folders that could not be looked into (a newer checkpoint may be in them)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "checkpoint": self.checkpoint,
            "step": self.step,
            "reason": self.reason,
            "resume_command": self.resume_command,
            "warnings": list(self.warnings),
        }


@dataclass(frozen=True)
class SourceReport:
    """One file the tool read, how much of it it understood, and what it noticed missing."""

    path: str
    kind: str
    lines: int
    unparsed_lines: int
    notes: tuple[str, ...] = ()
    bytes: int | None = None
    digest: str | None = None
    digest_method: str | None = None
    """``sha256`` of the whole file, or ``sha256-head-tail`` (size, first and last MiB) for big logs."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "kind": self.kind,
            "lines": self.lines,
            "unparsed_lines": self.unparsed_lines,
            "notes": list(self.notes),
            "bytes": self.bytes,
            "digest": self.digest,
            "digest_method": self.digest_method,
        }


#: How the run's note begins that says steps after the last read may have been logged.
STEPS_UNREAD = "steps after step "
#: The caveat of a run part of whose logs could not be read.
LOGS_UNREAD = "part of the logs could not be read"


def unjudged(no_steps: bool, primary_metric: str | None) -> str | None:
    """Why finding no incident says nothing of a run's health, or ``None`` when it does."""
    if no_steps:
        return "no training step was logged: no metric could be judged"
    if primary_metric is None:
        return "no reward series was found: the reward could not be judged"
    return None


def data_lost(sources: list[SourceReport]) -> list[str]:
    """``file: note`` for every note of ``sources`` saying part of a source could not be read."""
    lost = []
    for s in sources:
        name = Path(s.path).name
        for note in s.notes:
            if s.kind in ("unreadable", "not_given") or _LOST.search(note):
                lost.append(f"{name}: {note.removeprefix(f'{s.path}: ').removeprefix(f'{name}: ')}")
    return lost


def nothing_read(sources: list[SourceReport]) -> str | None:
    """Why nothing of a run was read, where none of its ``sources`` gave a line or a record (a W&B
    run killed before its first flush, an events file that is no TFRecord stream); ``None`` where one did."""
    if any(s.lines for s in sources):
        return None
    said = [note if note.startswith(Path(s.path).name) else f"{Path(s.path).name}: {note}" for s in sources for note in s.notes][:3]
    return "nothing readable in it" + (f" ({'; '.join(said)})" if said else "")


@dataclass
class RunAnalysis:
    """Everything found about one run: its frames and the claims made from them."""

    run_id: str
    framework: Framework
    root: str
    sources: list[SourceReport]
    primary_metric: str | None
    incidents: list[Incident]
    checkpoints: list[Checkpoint]
    recommendation: Recommendation
    metrics: pl.DataFrame = field(repr=False)
    events: pl.DataFrame = field(repr=False)
    steps: pl.DataFrame = field(repr=False)
    notes: list[str] = field(default_factory=list)
    thresholds: dict[str, Any] = field(default_factory=dict)
    series_sources: dict[str, str] = field(default_factory=dict)
    """For a series found in several copies (log, W&B, TensorBoard), the copy it was taken from."""
    observations: list[str] = field(default_factory=list)
    """Findings that are not incidents (e.g. steps getting slower instead of faster)."""
    superseded: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(), repr=False)
    """Metric rows of attempts a relaunch abandoned (the run's own are in ``metrics``): where an
    incident in such an attempt (``redone``) is seen."""
    save_folder_named: str | None = None
    """Where a log said the run saves its checkpoints, outside the folders found beside it (looked
    in, whether or not it held any)."""
    stopped_short: str | None = None
    """With no incident: the run logged fewer steps than planned, with a worker's death logged
    undated (why it is not healthy all the same)."""

    def __repr__(self) -> str:  # the dataclass's would print every source, incident and piece of evidence
        rng = self.step_range()
        steps = f"{rng['first']}-{rng['last']}" if rng["count"] else "none"
        found = ", ".join(f"{i.kind}@{i.onset_step}" for i in self.incidents)
        return (f"<RunAnalysis {self.run_id!r} {self.framework} steps {steps} incidents [{found}] "
                f"resume step {self.recommendation.step}>")

    def unjudged(self) -> str | None:
        """Why the run cannot be called healthy when no incident was found, or ``None`` when it can
        (with the failures logged all the same, when there is no step to place them at)."""
        why = unjudged(self.steps.is_empty(), self.primary_metric)
        if why and self.steps.is_empty() and not self.events.is_empty():
            failed = self.events.filter(pl.col("severity").is_in(["error", "fatal"]))["kind"].value_counts(sort=True)
            if failed.height:
                kinds = ", ".join(f"{kind} ×{n}" for kind, n in failed.head(4).iter_rows())
                n = failed["count"].sum()
                why += f"; yet {n} {'failure was' if n == 1 else 'failures were'} logged ({kinds}): see the events"
        return why or (self.stopped_short if not self.incidents else None)

    def caveat(self) -> str | None:
        """Why no incident would not make this run healthy: nothing judged, or logs left unread."""
        return self.unjudged() or (LOGS_UNREAD if self.data_lost() else None)

    def data_lost(self) -> list[str]:
        """``file: note`` for every source note saying part of a source could not be read, and the
        run's note that steps after the last read may have been logged (checkpoints went on)."""
        return data_lost(self.sources) + [note for note in self.notes if note.startswith(STEPS_UNREAD)]

    def event_markers(self, limit: int) -> pl.DataFrame:
        """The run's warnings, errors and fatal events as at most ``limit`` markers on its steps,
        their first lines' texts read back from the logs (see :func:`forensics.markers.event_markers`)."""
        return event_markers(self.events, self.steps, limit)

    def failures_logged(self) -> pl.DataFrame:
        """Each kind of failure (error, fatal) the run's logs hold, in the order they began: how many,
        and the first one's ``time``, ``step``, ``file``, ``line`` and ``message`` (read back where a
        flood's was not held) — what a run with no step to place an incident at shows of them."""
        failed = self.events.filter(pl.col("severity").is_in(["error", "fatal"]))
        firsts = (failed.lazy().sort("time", "line", nulls_last=True, maintain_order=True)
                  .group_by("kind", maintain_order=True)
                  .agg(pl.len().alias("count"), *(pl.col(c).first() for c in ("time", "step", "file", "line", "message")))
                  .collect())
        return with_messages(firsts.with_columns(pl.col("kind", "file").cast(pl.String)))

    def step_range(self) -> dict[str, int | None]:
        if self.steps.is_empty():
            return {"first": None, "last": None, "count": 0}
        col = self.steps["step"]
        return {"first": int(col.min()), "last": int(col.max()), "count": col.n_unique()}

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "framework": self.framework,
            "root": self.root,
            "sources": [s.to_dict() for s in self.sources],
            "steps": self.step_range(),
            "primary_metric": self.primary_metric,
            "incidents": [i.to_dict() for i in self.incidents],
            "checkpoints": [c.to_dict() for c in self.checkpoints],
            "recommendation": self.recommendation.to_dict(),
            "notes": list(self.notes),
            "thresholds": dict(self.thresholds),
            "series_sources": dict(sorted(self.series_sources.items())),
            "observations": list(self.observations),
        }


@dataclass
class Analysis:
    """The result of ``analyze``: one entry per run found under the given paths."""

    runs: list[RunAnalysis]
    tool_version: str = TOOL_VERSION

    def __repr__(self) -> str:
        return f"<Analysis of {len(self.runs)} run(s): {', '.join(map(repr, self.runs))}>"

    def to_document(self) -> dict[str, Any]:
        """The CONTRACT's ``grpo-forensics/analysis/v1`` document."""
        return {
            "schema": SCHEMA,
            "tool_version": self.tool_version,
            "runs": [r.to_dict() for r in self.runs],
        }

    @property
    def has_incident(self) -> bool:
        return any(r.incidents for r in self.runs)
