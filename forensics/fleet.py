"""Many runs at once: one task per run on local processes or a Ray cluster, gathered into one index.

Runs are found in the calling process; each task loads and analyzes one run and hands back its
contract run object and its rendered report (text, not frames), which the calling process writes
under ``out_dir`` as results arrive. The index is two Parquet tables — ``index.parquet`` (one row
per run) and ``incidents.parquet`` (one row per incident) — and ``index.html`` linking every
run's ``runs/<slug>/report.html``.

Example:
    >>> from pathlib import Path
    >>> result = analyze_fleet([Path("runs/a"), Path("runs/b")], Path("/tmp/fleet"))  # doctest: +SKIP
    >>> [r.slug for r in result.runs]  # doctest: +SKIP
    ['gsm8k-grpo-trial0', 'gsm8k-grpo-trial0-2']
"""

from __future__ import annotations

import functools
import io
import json
import logging
import multiprocessing
import os
import re
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import polars as pl

from forensics.allocator import reuse_block_memory
from forensics.analysis import analyze_run, read_log_format
from forensics.cache import ParseCache, folders_beyond, wait_for_writes
from forensics.detect import Thresholds
from forensics.discover import (
    LogSource,
    PathArg,
    RunLocation,
    as_paths,
    find_runs,
    shown_name,
    why_no_run,
    without_runs,
)
from forensics.errors import ForensicsError, UnusableInput
from forensics.keys import ANALYSIS_KEYS
from forensics.model import SCHEMA, TOOL_VERSION, Analysis, RunAnalysis, SourceReport, nothing_read
from forensics.run import load_online_wandb, load_run, parse_source
from parsers._walk import files_under
from parsers.custom import CustomFormat
from reports import render_html, render_markdown
from reports.index_html import write_index_html
from reports.page import write_page

#: What one worker may take at its peak: cold ``analyze`` of the benchmark's 3 GB run peaks at ~0.6 GB
#: (its logs' table and stats values beyond the analysis keys are not kept), leaving room for more.
WORKER_BYTES = 1 << 30

#: On Ray, a run with two or more logs at least this large has each parsed in a task of its own:
#: a cluster then reads a big run's trainer log, server log and Ray session side by side.
SPLIT_BYTES = 256 << 20

RUN_COLUMNS: dict[str, Any] = {
    "slug": pl.String, "run_id": pl.String, "framework": pl.String, "root": pl.String,
    "first_step": pl.Int64, "last_step": pl.Int64, "step_count": pl.Int64, "primary_metric": pl.String,
    "n_incidents": pl.Int64, "first_kind": pl.String, "first_onset_step": pl.Int64,
    "first_onset_time": pl.Datetime("ms"), "first_cause": pl.String, "first_confidence": pl.Float64,
    "first_recovered": pl.Boolean, "checkpoint": pl.String, "checkpoint_step": pl.Int64,
    "report": pl.String, "sources": pl.Int64, "lines": pl.Int64, "unparsed_lines": pl.Int64,
    "seconds": pl.Float64, "error": pl.String, "caveat": pl.String,
}
INCIDENT_COLUMNS: dict[str, Any] = {
    "slug": pl.String, "run_id": pl.String, "id": pl.String, "kind": pl.String, "metric": pl.String,
    "onset_step": pl.Int64, "onset_time": pl.Datetime("ms"), "end_step": pl.Int64, "recovered": pl.Boolean,
    "cause": pl.String, "confidence": pl.Float64, "wasted_steps": pl.Int64, "wasted_hours": pl.Float64,
    "report": pl.String,
}


@dataclass(frozen=True)
class FleetRun:
    """One run of a fleet: its contract run object, or why it could not be analyzed."""

    slug: str
    """Unique within the fleet; the run's folder under ``runs/``."""
    run_id: str
    root: str
    run: dict[str, Any] | None
    report: str | None
    """The run's report, relative to the fleet's ``out_dir``."""
    markdown: str | None = None
    error: str | None = None
    detail: str | None = None
    """The traceback of ``error``, when it was a bug."""
    unusable: bool = False
    """``error`` was unusable input (exit 2), not a bug."""
    seconds: float = 0.0
    caveat: str | None = None
    """Why a run with no incident is not called healthy (nothing could be judged, logs unread)."""
    lost: tuple[str, ...] = ()
    """``file: note`` for what of the run's logs could not be read (a single run's warnings)."""


@dataclass
class FleetResult:
    """What a fleet run wrote, and each run's outcome in the order the runs were found."""

    out_dir: Path
    runs: list[FleetRun]
    index: Path
    incidents: Path
    page: Path | None
    runs_table: pl.DataFrame = field(repr=False)
    incidents_table: pl.DataFrame = field(repr=False)
    seconds: float = 0.0
    backend: str = ""

    @property
    def failed(self) -> list[FleetRun]:
        return [r for r in self.runs if r.error is not None]

    @property
    def read_nothing(self) -> list[tuple[str, str]]:
        """``(run_id, why)`` of each run analyzed though none of its sources gave a line or a record."""
        found = []
        for r in self.runs:
            sources = [SourceReport(s["path"], s["kind"], s["lines"], s["unparsed_lines"], tuple(s["notes"])) for s in r.run["sources"]] if r.run else []
            if r.run and (why := nothing_read(sources)):
                found.append((r.run_id, why))
        return found

    @property
    def has_incident(self) -> bool:
        return any(r.run and r.run["incidents"] for r in self.runs)

    def to_document(self) -> dict[str, Any]:
        """The CONTRACT's analysis document, with every run that was analyzed."""
        return {"schema": SCHEMA, "tool_version": TOOL_VERSION, "runs": [r.run for r in self.runs if r.run]}


@dataclass(frozen=True)
class _Task:
    """What a worker needs for one run; small and picklable."""

    slug: str
    location: RunLocation | None
    wandb: str | None
    custom_format: CustomFormat | None
    thresholds: Thresholds
    html: bool
    markdown: bool
    cache: ParseCache | None = None
    keys: str | None = ANALYSIS_KEYS
    cwd: str = field(default_factory=lambda: _current_folder() or "")


def analyze_fleet(
    paths: PathArg | Iterable[PathArg],
    out_dir: PathArg,
    *,
    workers: int | None = None,
    ray_address: str | None = None,
    use_ray: bool = False,
    custom_format: PathArg | None = None,
    wandb_runs: Sequence[str] = (),
    thresholds: Thresholds | None = None,
    cache: ParseCache | None = None,
    html: bool = True,
    markdown: bool = False,
    split_bytes: int = SPLIT_BYTES,
    progress: Callable[[FleetRun, int, int], None] | None = None,
    keys: str | None = ANALYSIS_KEYS,
) -> FleetResult:
    """Analyze every run under ``paths`` in parallel; write per-run reports and the index to ``out_dir``.

    Local processes by default (``workers``, default :func:`default_workers`); with ``use_ray`` or a
    ``ray_address`` one Ray task per run (no address: ``RAY_ADDRESS``, else the cluster started
    on this machine, else a new local Ray). ``cache`` is shared by the workers (its entries are
    renamed into place, so none sees another's half-written one). On Ray, with a ``cache``, a run
    with two or more logs of at least ``split_bytes`` has each parsed in a task of its own first;
    its run task then reads them from the cache (on a cluster, put the cache on the shared file
    system). A run that fails is a row with its ``error``; the others are still written.
    ``progress(run, done, total)`` is called as each run's outcome is written. ``keys`` is the
    regex of metric keys kept while the runs are read (see :mod:`forensics.keys`; ``None``: all).

    Raises:
        PathNotFound, NoRunsFound: nothing usable at ``paths``.
        UnusableInput: ``out_dir`` inside an analyzed path, a malformed ``custom_format``, no
            ``ray`` package, no Ray cluster at the address.
    """
    started = time.perf_counter()
    paths = as_paths(paths)
    fmt = read_log_format(custom_format)
    locations = find_runs(paths, custom_format=fmt) if paths or not wandb_runs else []
    barren = without_runs(paths, locations)
    names = [loc.run_id for loc in locations] + list(wandb_runs) + [str(p) for p in barren]
    slugs = _slugs(names)
    t = thresholds or Thresholds()
    tasks = [_Task(s, loc, None, fmt, t, html, markdown, cache, keys) for s, loc in zip(slugs, locations)]
    tasks += [_Task(s, None, name, fmt, t, html, markdown, keys=keys) for s, name in zip(slugs[len(locations):], wandb_runs)]

    out_dir = Path(out_dir)
    for given in paths:
        root = given.resolve() if given.is_dir() else given.resolve().parent
        if out_dir.resolve() == root or root in out_dir.resolve().parents:
            raise UnusableInput(f"{out_dir} is inside the analyzed path {given}; nothing is written there")
    ray = _import_ray() if use_ray or ray_address else None
    started_ray = _connect(ray, ray_address) if ray else False
    done: dict[str, FleetRun] = {}
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        size = functools.cache(_source_bytes)  # each log's bytes, walked once for the order and the split
        queue = [tasks[i] for i in largest_first([task.location for task in tasks], size=size)]
        if ray is not None:
            # (a parse task hands its frames over through the cache: with none to write, a run stays one task)
            unwritable = f"the cache {cache.directory} cannot be written" if cache is not None and not cache.writable() else None
            split = {task.slug: [] if unwritable else _split_sources(task, split_bytes, size) for task in queue}
            files = sum(map(len, split.values()))
            backend = "Ray" + (f" ({files} large logs parsed in tasks of their own)" if files
                               else f" ({unwritable}: each run parsed in its own task)" if unwritable else "")
            outcomes = _on_ray(ray, queue, split)
        elif not _enterable(_current_folder()):
            # (worker processes start in the caller's folder: ``su nobody`` from /root, or one deleted)
            backend, outcomes = "this process (worker processes could not start in the current folder)", map(_analyze_one, queue)
        else:
            count = max(1, min(workers or default_workers(), len(tasks)))
            backend, outcomes = f"{count} process(es)", _on_processes(queue, count)
        for outcome in outcomes:
            run = done[outcome["slug"]] = _store(outcome, out_dir)
            if progress is not None:
                progress(run, len(done), len(tasks))
    finally:
        if started_ray:
            ray.shutdown()
    runs = [done[task.slug] for task in tasks]
    runs += [FleetRun(slug, str(path), str(path), None, None, error=why_no_run(path, fmt).removeprefix(f"{path}: "), unusable=True)
             for slug, path in zip(slugs[len(tasks):], barren)]
    runs_frame, incidents_frame = index_frames(runs)
    index, incidents = out_dir / "index.parquet", out_dir / "incidents.parquet"
    for frame, path in ((runs_frame, index), (incidents_frame, incidents)):  # (put in place whole, as the pages)
        buffer = io.BytesIO()
        frame.write_parquet(buffer)
        write_page(path, buffer.getvalue())
    page = write_index_html(runs_frame, incidents_frame, out_dir) if html else None
    return FleetResult(out_dir, runs, index, incidents, page, runs_frame, incidents_frame,
                       time.perf_counter() - started, backend)


def default_workers(cpus: int | None = None, available: int | None = None) -> int:
    """One process per CPU, but no more than fit in the memory available now (``WORKER_BYTES``
    each): on a big machine shared with a training job, a fleet must not be what runs it out of memory."""
    cpus = cpus or os.cpu_count() or 1
    available = available if available is not None else _available_memory()
    return max(1, min(cpus, available // WORKER_BYTES)) if available is not None else cpus


def _available_memory() -> int | None:
    """Bytes the kernel could hand out without swapping (Linux ``MemAvailable``), or None."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def largest_first(
    locations: Sequence[RunLocation | None], *, size: Callable[[LogSource], int] | None = None
) -> list[int]:
    """The order to start runs in: by the bytes of their logs (``size`` of each, default: read
    from disk), largest first (ties and runs without files, such as hosted W&B runs, in the given
    order). A long run started last would finish alone while the other workers idle."""
    size = size or _source_bytes

    def log_bytes(location: RunLocation | None) -> int:
        return sum(size(source) for source in location.logs) if location is not None else 0

    return sorted(range(len(locations)), key=lambda i: -log_bytes(locations[i]))


def _source_bytes(source: LogSource) -> int:
    total = 0
    for file in files_under(source.path) if source.path.is_dir() else [source.path]:
        try:
            total += file.stat().st_size if file.is_file() else 0
        except OSError:
            continue
    return total


def _split_sources(task: _Task, split_bytes: int, size: Callable[[LogSource], int]) -> list[LogSource]:
    """The logs of ``task``'s run worth a task of their own: its large ones, when there are two or
    more (with one, the run's task would only wait for it) and a cache to hand them over through."""
    if task.cache is None or task.location is None:
        return []
    large = [source for source in task.location.logs if size(source) >= split_bytes]
    return large if len(large) >= 2 else []


def index_frames(runs: Sequence[FleetRun]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The runs table (one row per run) and the incidents table (one row per incident)."""
    rows, incident_rows = [], []
    for r in runs:
        doc = r.run or {}
        incidents = doc.get("incidents", [])
        first = incidents[0] if incidents else {}
        steps = doc.get("steps", {})
        rec = doc.get("recommendation", {})
        sources = doc.get("sources", [])
        rows.append({
            "slug": r.slug, "run_id": doc.get("run_id", r.run_id), "framework": doc.get("framework"),
            "root": doc.get("root", shown_name(r.root)), "first_step": steps.get("first"), "last_step": steps.get("last"),
            "step_count": steps.get("count"), "primary_metric": doc.get("primary_metric"),
            "n_incidents": len(incidents) if r.run else None, "first_kind": first.get("kind"),
            "first_onset_step": first.get("onset_step"), "first_onset_time": _time(first.get("onset_time")),
            "first_cause": first.get("cause"), "first_confidence": first.get("confidence"),
            "first_recovered": first.get("recovered"), "checkpoint": rec.get("checkpoint"),
            "checkpoint_step": rec.get("step"), "report": r.report,
            "sources": len(sources) if r.run else None, "lines": sum(s["lines"] for s in sources) if r.run else None,
            "unparsed_lines": sum(s["unparsed_lines"] for s in sources) if r.run else None,
            "seconds": round(r.seconds, 3), "error": r.error, "caveat": None if incidents else r.caveat,
        })
        for inc in incidents:
            incident_rows.append({
                "slug": r.slug, "run_id": doc["run_id"],
                **{k: inc[k] for k in ("id", "kind", "metric", "onset_step", "end_step", "recovered", "cause",
                                       "confidence", "wasted_steps", "wasted_hours")},
                "onset_time": _time(inc["onset_time"]),
                "report": f"{r.report}#{inc['id']}" if r.report else None,
            })
    return pl.DataFrame(rows, schema=RUN_COLUMNS), pl.DataFrame(incident_rows, schema=INCIDENT_COLUMNS)


# --------------------------------------------------------------------------- the work of one run


def _analyze_one(task: _Task) -> dict[str, Any]:
    """Load, analyze and render one run; never raises, so one bad run cannot sink the fleet. A run
    whose inputs are unchanged since the cache kept its outcome is not analyzed again."""
    started = time.perf_counter()
    try:
        _to_callers_folder(task)
        key = _outcome_key(task)
        if key is not None and (kept := _kept_outcome(task, key)) is not None:
            return {**kept, "slug": task.slug, "seconds": time.perf_counter() - started}
        if task.wandb:
            data = load_online_wandb(task.wandb, keys=task.keys)
        else:
            data = load_run(task.location, custom_format=task.custom_format, cache=task.cache, keys=task.keys)  # type: ignore[arg-type]
        run = analyze_run(data, task.thresholds)
        single = Analysis([run])
        page = render_html(single) if task.html else None
        markdown = render_markdown(single) if task.markdown else None
        outcome = {"slug": task.slug, "run_id": run.run_id, "root": run.root, "run": single.to_document()["runs"][0],
                   "html": page, "markdown": markdown, "caveat": run.caveat(), "lost": tuple(run.data_lost()),
                   "seconds": time.perf_counter() - started}
        if key is not None:
            _keep_outcome(task, key, outcome, run)
        return outcome
    except Exception as exc:  # reported as the run's error; the caller decides the exit code
        return _failure(task, exc, time.perf_counter() - started)
    finally:
        wait_for_writes()  # a Ray worker outlives its task: the run's cache entries are on disk when it ends


def _outcome_key(task: _Task) -> str | None:
    """The cache key of a run's outcome: its inputs (as ``analyze`` keys them), and how it is
    analyzed and rendered. None for a hosted W&B run (its inputs are not files) or no cache."""
    if task.cache is None or task.location is None:
        return None
    how = json.dumps([task.thresholds.to_dict(), task.html, task.markdown, task.keys, repr(task.custom_format)], default=str)
    return task.cache.inputs_key([task.location], "fleet-outcome", how)


_OUTCOME, _PAGE, _NOTES = "outcome.json", "report.html", "report.md"


def _kept_outcome(task: _Task, key: str) -> dict[str, Any] | None:
    kept = task.cache.recall(key) if task.cache is not None else None
    if not kept or _OUTCOME not in kept or (task.html and _PAGE not in kept) or (task.markdown and _NOTES not in kept):
        return None
    try:
        outcome = json.loads(kept[_OUTCOME])
    except ValueError:  # (a damaged entry: analyzed again, and kept anew)
        return None
    return {**outcome, "lost": tuple(outcome["lost"]), "html": kept[_PAGE].decode() if task.html else None,
            "markdown": kept[_NOTES].decode() if task.markdown else None}


def _keep_outcome(task: _Task, key: str, outcome: dict[str, Any], run: RunAnalysis) -> None:
    assert task.cache is not None and task.location is not None
    parts = {_OUTCOME: json.dumps({k: v for k, v in outcome.items() if k not in ("html", "markdown", "slug", "seconds")}).encode()}
    parts |= {_PAGE: outcome["html"].encode()} if outcome["html"] is not None else {}
    parts |= {_NOTES: outcome["markdown"].encode()} if outcome["markdown"] is not None else {}
    keyed = [task.location.checkpoint_dir] if task.location.checkpoint_dir else []
    task.cache.remember(key, parts, watched=folders_beyond((c.path for c in run.checkpoints), keyed, [run.save_folder_named]))


def _analyze_on_ray(task: _Task, *_parsed: str | None) -> dict[str, Any]:
    """``_parsed``: the outcomes of the run's own parse tasks, which Ray finishes before this starts."""
    reuse_block_memory()  # the task's worker process is Ray's: set once per process, cheap to repeat
    return _analyze_one(task)


def _parse_on_ray(task: _Task, source: LogSource) -> str | None:
    """Parse one log of a run into the cache; never raises: on failure the run's task parses it
    again and reports what went wrong there, as it would without this task."""
    reuse_block_memory()
    try:
        _to_callers_folder(task)
        parse_source(source, custom_format=task.custom_format, cache=task.cache, keys=task.keys)
        return None
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        wait_for_writes()


def _current_folder() -> str | None:
    try:
        return os.getcwd()
    except OSError:  # (deleted)
        return None


def _enterable(folder: str | None) -> bool:
    return folder is not None and os.path.isdir(folder) and os.access(folder, os.X_OK)


def _to_callers_folder(task: _Task) -> None:
    # Ray workers need not start in the caller's folder, and paths may be relative to it.
    if task.cwd and _current_folder() != task.cwd and os.path.isdir(task.cwd):
        os.chdir(task.cwd)


def _failure(task: _Task, exc: BaseException, seconds: float = 0.0) -> dict[str, Any]:
    unusable = isinstance(exc, ForensicsError | OSError)
    name = task.location.run_id if task.location else (task.wandb or task.slug)
    root = str(task.location.root) if task.location else (task.wandb or "")
    return {"slug": task.slug, "run_id": name, "root": root, "run": None, "html": None, "markdown": None,
            "error": str(exc) if unusable else f"{type(exc).__name__}: {exc}", "unusable": unusable,
            "detail": None if unusable else "".join(traceback.format_exception(exc)), "seconds": seconds}


def _store(outcome: dict[str, Any], out_dir: Path) -> FleetRun:
    """Write the run's report under ``out_dir`` and keep only what the index needs."""
    report = None
    if outcome.get("html") is not None:
        folder = out_dir / "runs" / outcome["slug"]
        folder.mkdir(parents=True, exist_ok=True)
        write_page(folder / "report.html", outcome["html"])
        report = f"runs/{outcome['slug']}/report.html"
    return FleetRun(
        slug=outcome["slug"], run_id=outcome["run_id"], root=outcome["root"], run=outcome["run"], report=report,
        markdown=outcome.get("markdown"), error=outcome.get("error"), detail=outcome.get("detail"),
        unusable=outcome.get("unusable", False), seconds=outcome.get("seconds", 0.0), caveat=outcome.get("caveat"),
        lost=outcome.get("lost", ()),
    )


# --------------------------------------------------------------------------- where the tasks run


def _on_processes(tasks: list[_Task], workers: int) -> Iterator[dict[str, Any]]:
    broken: list[_Task] = []
    yield from _in_pool(tasks, workers, broken)
    # A worker that dies (the OOM killer) takes the pool and every run still in it down: those runs
    # go again, each in a pool of its own, so that only the run that kills its worker fails.
    for task in broken:
        yield from _in_pool([task], 1, None)


def _in_pool(tasks: list[_Task], workers: int, broken: list[_Task] | None) -> Iterator[dict[str, Any]]:
    """``tasks`` on ``workers`` processes; those lost with a dead worker go to ``broken`` (or fail)."""
    # spawn, not fork: a forked Polars thread pool can deadlock the child.
    context = multiprocessing.get_context("spawn")
    died = "its worker process died (killed: out of memory?)"
    lost: list[_Task] = []
    with ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_worker_setup) as pool:
        futures = {}
        with _ctrl_c_ignored():  # the workers start with Ctrl-C ignored, until they can end quietly on it
            for task in tasks:
                try:
                    futures[pool.submit(_analyze_one, task)] = task
                except (BrokenProcessPool, OSError):  # a worker died while the runs were handed out
                    lost.append(task)
                except ValueError as exc:  # ... while the next was being started: its pipes closed under it
                    if "fds_to_keep" not in str(exc):
                        raise
                    lost.append(task)
        for future in as_completed(futures):
            # Let go of each future as its result is taken: a done future holds its run's rendered
            # report, and a fleet of hundreds would otherwise keep them all to the end.
            task = futures.pop(future)
            try:
                outcome = future.result()
            except BrokenProcessPool:
                lost.append(task)
                continue
            except Exception as exc:
                outcome = _failure(task, exc)
            del future
            yield outcome
        if lost:
            # The executor's own clean-up of a broken pool can wait forever on a surviving worker
            # blocked on its queue (CPython 3.11): every worker left is ended here.
            for process in multiprocessing.active_children():
                process.kill()
    if broken is None:
        yield from (_failure(task, RuntimeError(died)) for task in lost)
    else:
        broken.extend(lost)


def _worker_setup() -> None:
    reuse_block_memory()
    # Ctrl-C reaches the workers too: they end at once, without a traceback each; the caller exits 130.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextmanager
def _ctrl_c_ignored() -> Iterator[None]:
    """SIGINT ignored while worker processes are started: they inherit it, so one arriving while a
    worker still imports is not a KeyboardInterrupt traceback there (Python keeps an inherited SIG_IGN)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UnusableInput("--ray needs the ray package in this environment (pip install 'ray[default]')") from None
    return ray


def _connect(ray: Any, address: str | None) -> bool:
    """Join (or start) Ray unless the caller already did; True when this call did, so it shuts down too."""
    if ray.is_initialized():
        return False
    _check_reachable(address) if address else _check_reachable(os.environ.get("RAY_ADDRESS"), " (RAY_ADDRESS)")
    options: dict[str, Any] = {} if address and address.startswith("ray://") else {
        "include_dashboard": False, "logging_level": logging.WARNING, "log_to_driver": False}
    try:
        with _utf8_entrypoint(ray):
            ray.init(address=address, ignore_reinit_error=True, **options)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        raise UnusableInput(f"no Ray cluster at {address or 'RAY_ADDRESS/local'}: {exc}") from None
    return True


@contextmanager
def _utf8_entrypoint(ray: Any) -> Iterator[None]:
    """Ray records the driver's command line (read from the process) as UTF-8 and fails on a run
    folder's name that is not: a name the local processes analyze (or say why not) must not fail
    the whole fleet. Its record shows such bytes as replacement characters instead."""
    utils = getattr(getattr(ray, "_private", None), "utils", None)
    named = getattr(utils, "get_entrypoint_name", None)
    if named is None:
        yield
        return
    utils.get_entrypoint_name = lambda: os.fsencode(named()).decode("utf-8", "replace")
    try:
        yield
    finally:
        utils.get_entrypoint_name = named


def _on_ray(ray: Any, tasks: list[_Task], split: dict[str, list[LogSource]]) -> Iterator[dict[str, Any]]:
    analyze, parse = ray.remote(num_cpus=1)(_analyze_on_ray), ray.remote(num_cpus=1)(_parse_on_ray)
    pending = {}
    for task in tasks:
        parsed = [parse.remote(task, source) for source in split[task.slug]]
        # The parse tasks' results are the run task's arguments: Ray starts it once they are done.
        pending[analyze.remote(task, *parsed)] = task
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        for ref in ready:
            task = pending.pop(ref)
            try:
                yield ray.get(ref)
            except Exception as exc:  # the task's worker or node died
                yield _failure(task, exc)


# --------------------------------------------------------------------------- helpers


def _check_reachable(address: str | None, named_by: str = "") -> None:
    """Fail fast on a wrong ``HOST:PORT`` (given, or ``named_by`` the environment: one left from a
    cluster torn down): Ray itself retries an unreachable head for many minutes."""
    match = re.fullmatch(r"(?:ray://)?\[?([^\]]+?)\]?:(\d+)", address or "")
    if not match:
        return  # None, "auto", "local": Ray resolves these itself
    try:
        socket.create_connection((match.group(1), int(match.group(2))), timeout=10).close()
    except OSError as exc:
        raise UnusableInput(f"no Ray cluster at {address}{named_by}: {exc.strerror or exc}") from None


def _slugs(names: Sequence[str]) -> list[str]:
    """File-safe, unique folder names in the order given (copies of one run get ``-2``, ``-3``…)."""
    seen: set[str] = set()
    out = []
    for name in names:
        base = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")[:80] or "run"
        slug, n = base, 1
        while slug.lower() in seen:  # case-insensitive file systems
            n += 1
            slug = f"{base}-{n}"
        seen.add(slug.lower())
        out.append(slug)
    return out


def _time(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None
