"""Find the runs under the paths a user gives: which log files belong together, where their
checkpoints live. Read-only: it lists directories and sniffs file heads, nothing more.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from forensics.errors import NoRunsFound, PathNotFound
from parsers import looks_like_areal, looks_like_sglang

# Folders that hold weights, dumps or traces, never a run's text logs.
_SKIP_DIRS = {"checkpoints", "recover_checkpoint", "generated", "generated-eval", "rollout",
              "eval-rollout", "perf_tracer", "session_tracer", "memory_snapshots", "wandb",
              "__pycache__", ".git", "weight_update"}
_LOG_NAME = re.compile(r"^(?P<base>[\w.-]+?\.(?:log|out|err)|[a-z_]+-\d+)(?:\.(?P<rot>\d+))?(?:\.gz)?$")
_SERVER_LOGS = {"llm_server.log"}
_TRAINER_LOGS = {"trainer.log", "main.log", "merged.log", "master_worker-0"}


@dataclass(frozen=True)
class LogSource:
    """One log file of a run; ``order`` puts rotated copies oldest first."""

    path: Path
    kind: str
    order: int


@dataclass(frozen=True)
class RunLocation:
    """Where one run's files are."""

    run_id: str
    framework: str
    root: Path
    logs: tuple[LogSource, ...]
    checkpoint_dir: Path | None
    skipped: tuple[str, ...] = field(default=())


def find_runs(paths: Sequence[Path]) -> list[RunLocation]:
    """Every run under ``paths`` (folders are searched, files are taken as they are).

    Raises:
        PathNotFound: a path does not exist.
        NoRunsFound: nothing under the paths looks like a training run's log.
    """
    runs: list[RunLocation] = []
    for given in paths:
        if not os.path.lexists(given):
            raise PathNotFound(f"{given}: no such file or directory")
        if given.is_file():
            files, problems = [given], []
        else:
            files, problems = _walk(given)
        runs.extend(_group(given, files, problems))
    if not runs:
        shown = ", ".join(str(p) for p in paths)
        raise NoRunsFound(f"{shown}: no AReaL trainer log or SGLang server log found")
    return runs


def _walk(top: Path) -> tuple[list[Path], list[str]]:
    found: list[Path] = []
    problems: list[str] = []

    def on_error(exc: OSError) -> None:
        problems.append(f"{exc.filename}: {exc.strerror or exc}")

    for folder, dirs, names in os.walk(top, onerror=on_error, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
        for name in sorted(names):
            path = Path(folder, name)
            if _LOG_NAME.match(name) and path.is_file():
                found.append(path)
    return found, problems


def _group(given: Path, files: list[Path], problems: list[str]) -> list[RunLocation]:
    by_dir: dict[Path, list[LogSource]] = {}
    skipped = list(problems)
    for path in files:
        try:
            if path.stat().st_size == 0:
                continue
            kind = _kind(path)
        except OSError as exc:
            skipped.append(f"{path}: {exc.strerror or exc}")
            continue
        if kind is None:
            continue
        match = _LOG_NAME.match(path.name)
        rotation = int(match.group("rot") or 0) if match else 0
        by_dir.setdefault(path.parent, []).append(LogSource(path, kind, -rotation))
    runs = []
    for root, sources in sorted(by_dir.items()):
        sources = _drop_superseded(sources)
        runs.append(
            RunLocation(
                run_id=_run_id(given, root),
                framework="areal",
                root=root,
                logs=tuple(sorted(sources, key=lambda s: (s.path.name.split(".")[0], s.order))),
                checkpoint_dir=_checkpoint_dir(root),
                skipped=tuple(skipped),
            )
        )
    return runs


def _kind(path: Path) -> str | None:
    """What a log is, from its name and head; ``None`` for files this tool does not read."""
    match = _LOG_NAME.match(path.name)
    base = match.group("base") if match else path.name
    if base in _SERVER_LOGS:
        return "areal_server"
    if looks_like_areal(path):
        return "areal_trainer" if base in _TRAINER_LOGS else "areal_log"
    if looks_like_sglang(path):
        return "sglang_server"
    return None


def _drop_superseded(sources: list[LogSource]) -> list[LogSource]:
    """``merged.log`` already holds ``main.log`` and every role log: read it alone."""
    if not any(s.path.name.startswith("merged.log") for s in sources):
        return sources
    return [s for s in sources if s.path.name.startswith(("merged.log", "llm_server.log"))]


def _run_id(given: Path, root: Path) -> str:
    parts = root.parts
    if len(parts) >= 4 and parts[-4] == "logs":
        return f"{parts[-2]}/{parts[-1]}"
    try:
        rel = root.relative_to(given)
    except ValueError:
        rel = Path(root.name)
    return str(rel) if str(rel) != "." else root.resolve().name


def _checkpoint_dir(root: Path) -> Path | None:
    """AReaL pairs ``<fileroot>/logs/<user>/<exp>/<trial>`` with ``checkpoints/<user>/<exp>/<trial>``."""
    parts = root.parts
    if len(parts) >= 4 and parts[-4] == "logs":
        candidate = Path(*parts[:-4], "checkpoints", *parts[-3:])
        return candidate if candidate.is_dir() else None
    return None
