"""The ``grpo-forensics`` command: a thin layer over :func:`forensics.analyze`.

Each command resolves its arguments, calls the library, renders the result and maps the
library's errors to CONTRACT exit codes (2: unusable input, 3/4: no checkpoint).
"""

from __future__ import annotations

import errno
import hashlib
import io
import itertools
import json
import math
import os
import pickle
import re
import sys
import tempfile
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console, ConsoleOptions, ConsoleRenderable, RenderHook
from rich.segment import Segment

from forensics import rerun
from forensics.allocator import reuse_block_memory
from forensics.analysis import analyze as analyze_paths
from forensics.analysis import analyze_each, locate, read_log_format
from forensics.cache import ParseCache, folders_beyond, read_by
from forensics.discover import RunLocation, analyzed_tree, find_runs, why_no_run, within, without_runs
from forensics.errors import (
    ForensicsError,
    NoCacheDir,
    NoCheckpointBeforeIncident,
    NoCheckpointSaved,
    NoRunsFound,
    PathNotFound,
    UnusableInput,
)
from forensics.export import FORMATS, metric_rows, write_metrics
from forensics.fleet import FleetResult, FleetRun, analyze_fleet
from forensics.identity import CACHE_ENV, default_cache_dir
from forensics.keys import ANALYSIS_KEYS
from forensics.model import Analysis, RunAnalysis, iso, nothing_read
from forensics.run import RunData, save_folders_named
from forensics.texts import iter_with_messages


def run_analysis(paths: list[Path], **options: Any) -> Analysis:
    """``analyze`` as the commands run it: only the metric keys an analysis reads are kept
    (``metrics``, which prints every key, keeps them all)."""
    return analyze_paths(paths, keys=ANALYSIS_KEYS, **options)


app = typer.Typer(
    help="Post-mortems for GRPO training runs: when the reward collapsed, why, and the last healthy checkpoint.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

EXIT_INCIDENT, EXIT_BAD_INPUT, EXIT_NO_CHECKPOINT, EXIT_NONE_BEFORE = 1, 2, 3, 4
EXIT_BUG = 70

# (``readable=False``: a path that cannot be read is answered by the tool in one line, not by Click's usage box)
Paths = Annotated[list[Path], typer.Argument(readable=False, help="Run folders (AReaL fileroot, outputs/, a trial log folder) or log files.")]
Debug = Annotated[bool, typer.Option("--debug", help="Show the full traceback of an error.")]
LogFormat = Annotated[
    Path | None,
    typer.Option("--log-format", help="A TOML file declaring how to read a hand-rolled trainer's log (see README)."),
]
Wandb = Annotated[
    list[str] | None,
    typer.Option("--wandb", help="A hosted W&B run, ENTITY/PROJECT/RUN_ID (repeatable; needs network and a key)."),
]
OptionalPaths = Annotated[
    list[Path] | None,
    typer.Argument(readable=False, help="Run folders (AReaL fileroot, outputs/, a trial log folder) or log files."),
]
CacheDir = Annotated[
    Path | None,
    typer.Option("--cache-dir", help="Where parsed frames are kept between runs (default $GRPO_FORENSICS_CACHE, else $XDG_CACHE_HOME/grpo-forensics, else ~/.cache/grpo-forensics)."),
]
NoCache = Annotated[bool, typer.Option("--no-cache", help="Parse every file afresh and keep nothing.")]
T = TypeVar("T")


def _warn_lost(runs: list[FleetRun], most: int = 10) -> None:
    """What of the fleet's logs could not be read, on stderr, each once: a folder none of the runs
    could be read from is every run's note (it may have held one)."""
    lost: dict[str, list[str]] = {}
    ids = Counter(r.run_id for r in runs)
    for r in runs:
        for note in r.lost:
            # (runs of one config share an id: the folder tells which one lost a log)
            lost.setdefault(note, []).append(r.run_id if ids[r.run_id] == 1 else f"{r.run_id} ({r.root})")
    for note, names in list(lost.items())[:most]:
        whose = f"{names[0]}: " if len(names) == 1 and len(runs) > 1 else ""
        typer.echo(_visible(f"grpo-forensics: warning: {whose}{note}"), err=True)
    if len(lost) > most:
        typer.echo(f"grpo-forensics: warning: ... and {len(lost) - most} more unread parts, listed in the runs' reports", err=True)


def _need_stdout(what: str) -> None:
    """Refuse to run with standard output closed (``>&-``), where rich would print ``what`` nowhere and exit 0."""
    if sys.stdout is None:
        raise UnusableInput(f"standard output is closed: nowhere to write {what}")


def _guard(debug: bool, action: Callable[[], T]) -> T:
    """Run ``action``; turn known errors into one line on stderr and their exit code."""
    try:
        return action()
    except typer.Exit:
        raise
    except NoCheckpointSaved as exc:
        typer.echo(_visible(f"grpo-forensics: {exc}"), err=True)
        raise typer.Exit(EXIT_NO_CHECKPOINT) from None
    except NoCheckpointBeforeIncident as exc:
        typer.echo(_visible(f"grpo-forensics: {exc}"), err=True)
        raise typer.Exit(EXIT_NONE_BEFORE) from None
    except (ForensicsError, OSError) as exc:
        if isinstance(exc, OSError) and _reader_gone(exc):  # `... | head`: the reader had enough
            _stdout_to_devnull()
            raise typer.Exit(0) from None
        if debug:
            traceback.print_exc()
        typer.echo(_visible(f"grpo-forensics: {exc}"), err=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None
    except Exception as exc:  # a bug: say so plainly, show the traceback only on request
        if sys.stdout is None and isinstance(exc, AttributeError):  # (run with stdout closed, ``>&-``: Python leaves None, not a stream)
            typer.echo("grpo-forensics: standard output is closed: nowhere to write", err=True)
            raise typer.Exit(EXIT_BAD_INPUT) from None
        if debug:
            traceback.print_exc()
        typer.echo(_visible(f"grpo-forensics: internal error ({type(exc).__name__}: {exc}); rerun with --debug"), err=True)
        raise typer.Exit(EXIT_BUG) from None


class _Console(Console):
    """rich's console, but a reader that closes the pipe (``| head``) is no error: what is left to
    print goes nowhere and the command's other work (``--json FILE``, the report) still happens.
    And a log's or a folder name's control characters are shown, never sent to the terminal."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if self.width < 20:  # ``COLUMNS=0`` (some CI runners) is taken literally: nothing would print
            self.width = 80
        self.push_render_hook(_ShowControls())

    def on_broken_pipe(self) -> None:
        self.quiet = True
        _stdout_to_devnull()


class _ShowControls(RenderHook):
    def process_renderables(self, renderables: list[ConsoleRenderable]) -> list[ConsoleRenderable]:
        return [_Shown(r) for r in renderables]


class _Shown:
    """A renderable whose text segments have their control characters shown (rich drops a BEL,
    which leaves an escape sequence open, and passes ESC through)."""

    def __init__(self, inner: ConsoleRenderable) -> None:
        self.inner = inner

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Segment]:
        for segment in console.render(self.inner, options):
            yield segment if segment.control else Segment(_visible(segment.text), segment.style)


def _visible(text: str) -> str:
    from reports.visible import visible  # (the renderers are imported only when something is rendered)

    return visible(text)


def _reader_gone(exc: OSError) -> bool:
    """Whether ``exc`` says stdout's reader closed the pipe (Polars' writers raise a bare OSError)."""
    return isinstance(exc, BrokenPipeError) or str(exc).endswith(f"(os error {errno.EPIPE})")


def _stdout_to_devnull() -> None:
    """Whatever is still buffered for a closed pipe goes nowhere, not into a traceback at exit."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError, io.UnsupportedOperation):
        pass


@app.command()
def analyze(
    paths: OptionalPaths = None,
    json_out: Annotated[str | None, typer.Option("--json", help="Write the analysis document to FILE, or '-' for stdout.")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Folder for the HTML report (default ./grpo-forensics-report, never inside PATH).")] = None,
    html: Annotated[bool, typer.Option("--html/--no-html", help="Write the HTML report.")] = True,
    fail_on_incident: Annotated[bool, typer.Option("--fail-on-incident", help="Exit 1 when an incident is found.")] = False,
    markdown: Annotated[str | None, typer.Option("--markdown", help="Write a Markdown summary (for a GitHub/Jira ticket) to FILE, or '-' for stdout.")] = None,
    log_format: LogFormat = None,
    wandb: Wandb = None,
    cache_dir: CacheDir = None,
    no_cache: NoCache = False,
    ray: Annotated[bool, typer.Option("--ray", help="Many runs: one task per run on a Ray cluster (RAY_ADDRESS, else the one started on this machine, else a new local Ray).")] = False,
    ray_address: Annotated[str | None, typer.Option("--ray-address", help="The Ray cluster for --ray (implies it): HOST:PORT, ray://HOST:10001, auto or local.")] = None,
    workers: Annotated[int | None, typer.Option("--workers", min=1, help="Many runs: local processes in parallel (default: one per CPU, at most one per GB of available memory).")] = None,
    debug: Debug = False,
) -> None:
    """Find incidents, their causes and the last healthy checkpoint; print a summary and write the report.

    Several runs (or --ray/--workers) go in parallel: a report each in --out/runs/, index.html, index.parquet.

    Example: grpo-forensics analyze outputs/ --json analysis.json
    """
    from reports import render_markdown, render_summary, write_html
    from reports.page import write_page

    def work() -> Analysis | FleetResult:
        _need_stdout("the summary")
        if json_out == "-" and markdown == "-":
            raise UnusableInput("--json - and --markdown - cannot both write to stdout")
        if not paths and not wandb:
            raise UnusableInput("give a PATH to analyze, or --wandb ENTITY/PROJECT/RUN_ID")
        _refuse_inside(paths or [], json=json_out, markdown=markdown, out=out)
        found = locate(paths, custom_format=log_format) if paths else []
        # (the runs' checkpoint folders are read too, wherever their logs were given from)
        checkpoint_dirs = [r.checkpoint_dir for r in found if r.checkpoint_dir]
        _refuse_inside(checkpoint_dirs, json=json_out, markdown=markdown, out=out)
        cache = _cache(cache_dir, no_cache, paths or [], log_format, found=found)
        if ray or ray_address or workers or len(found) + len(wandb or []) > 1:
            return _fleet(paths or [], out=out, json_out=json_out, markdown=markdown, html=html, log_format=log_format,
                          wandb=wandb or [], cache=cache, ray=ray, ray_address=ray_address, workers=workers, debug=debug)
        barren = without_runs(paths or [], found)  # beside a run: said, and exit 2 once the run is done
        folder = _report_dir(out, paths or [], found) if html else None  # (refused before the analysis, not after)
        key = cache.inputs_key(found, _digest(log_format)) if cache and not wandb else None
        if key and folder in (None, out or Path("grpo-forensics-report")):  # (not a temp folder of its own)
            _may_play_back(cache, paths or [], found, log_format)
        kept = _recall(cache, key, html)
        result = _unpickled(kept) if kept is not None else None
        if result is None:  # (a damaged entry is a miss: analyzed again, and kept anew)
            kept = None
            result = run_analysis(paths or [], custom_format=log_format, wandb_runs=wandb or (), cache=cache)
        # (checkpoints a log named where it saved them are read too: found only now, refused only now)
        named = folders_beyond((c.path for run in result.runs for c in run.checkpoints), checkpoint_dirs,
                               (run.save_folder_named for run in result.runs))
        _refuse_inside(named, json=json_out, markdown=markdown, out=out)
        rerun.also_read(named)
        console = _Console(stderr="-" in (json_out, markdown))
        render_summary(result, console)
        if json_out is not None:
            _write_json(result.to_document(), json_out)
        if markdown is not None:
            _write_text(render_markdown(result), markdown)
        report = None
        if folder is not None:
            if kept is not None:
                folder.mkdir(parents=True, exist_ok=True)
                report = folder / "report.html"
                write_page(report, kept["report.html"])
            else:
                report = write_html(result, folder)
            console.print(f"report: {report}", markup=False, highlight=False, soft_wrap=True)  # (a sweep's folder: ``run[lr=3e-6]``)
            rerun.wrote(report, whole=True)
        if key and kept is None:
            parts = {"analysis.pickle": pickle.dumps(_summary_only(result))}
            cache.remember(key, parts | ({"report.html": report.read_bytes()} if report else {}), watched=named)
        said = [why_no_run(path, read_log_format(log_format)) for path in barren] + _read_nothing(result.runs)
        if said:
            raise UnusableInput("; ".join(said))
        return result

    result = _guard(debug, work)
    if isinstance(result, FleetResult) and (result.failed or result.read_nothing):
        raise typer.Exit(EXIT_BUG if any(not r.unusable for r in result.failed) else EXIT_BAD_INPUT)
    if fail_on_incident and result.has_incident:
        raise typer.Exit(EXIT_INCIDENT)


def _fleet(paths: list[Path], *, out: Path | None, json_out: str | None, markdown: str | None, html: bool,
           log_format: Path | None, wandb: list[str], cache: ParseCache | None, ray: bool, ray_address: str | None,
           workers: int | None, debug: bool) -> FleetResult:
    """Many runs at once: in parallel, a report per run and the index in ``--out``, a table in the terminal."""
    from reports import render_fleet_summary
    from reports.labels import run_labels
    from reports.markdown import labelled

    folder = _report_dir(out, paths)
    # (each run's report goes in runs/<its name>: a runs/ folder of the runs analyzed is no place for them)
    if holds := next((tree for tree in _trees(paths) if within(tree, folder / "runs")), None):
        raise UnusableInput(f"--out {folder}: the runs' reports would go in {folder / 'runs'}, which holds the analyzed "
                            f"path {holds}; nothing is written there (give --out another folder)")
    result = analyze_fleet(paths, folder, workers=workers, use_ray=ray, ray_address=ray_address,
                           custom_format=log_format, wandb_runs=wandb, cache=cache, html=html,
                           markdown=markdown is not None, progress=_show_progress)
    console = _Console(stderr="-" in (json_out, markdown))
    render_fleet_summary(result.runs_table, console)
    sick = sum(1 for r in result.runs if r.run and r.run["incidents"])
    unsure = sum(1 for r in result.runs if r.run and not r.run["incidents"] and r.caveat)
    console.print(f"{len(result.runs)} run(s), {sick} with incidents, " + (f"{unsure} not judged, " if unsure else "")
                  + f"{len(result.failed)} not analyzed; "
                  f"{result.seconds:.1f} s on {result.backend}", markup=False, highlight=False)
    if json_out is not None:
        _write_json(result.to_document(), json_out)
    if markdown is not None:
        labels = run_labels([r.run_id for r in result.runs], [r.root for r in result.runs])
        _write_text("\n".join(labelled(r.markdown, r.run_id, label) for r, label in zip(result.runs, labels, strict=True) if r.markdown)
                    or "grpo-forensics: no runs analyzed.\n", markdown)
    console.print(f"index: {result.page or result.index}", markup=False, highlight=False)
    _warn_lost(result.runs)
    for r in result.failed:
        reason = r.error if r.unusable else f"internal error ({r.error}); rerun with --debug"
        typer.echo(_visible(f"grpo-forensics: {r.run_id}: {reason}"), err=True)
    for run_id, why in result.read_nothing:  # (unusable input, as for one run alone: exit 2)
        typer.echo(_visible(f"grpo-forensics: {run_id}: {why}"), err=True)
        if debug and r.detail:
            typer.echo(r.detail, err=True)
    return result


def _show_progress(run: FleetRun, done: int, total: int) -> None:
    """One line on stderr as each run of a fleet is done: a long fleet is never silent."""
    if run.error is not None:
        what = "not analyzed"
    else:
        incidents = (run.run or {}).get("incidents", [])
        what = f"{len(incidents)} incident(s)" + (f", first {incidents[0]['kind']} @ {incidents[0]['onset_step']}" if incidents else "")
    where = f" → {run.report}" if run.report else ""
    typer.echo(_visible(f"[{done}/{total}] {run.run_id}: {what} ({run.seconds:.1f} s){where}"), err=True)


@app.command("best-checkpoint")
def best_checkpoint(
    path: Annotated[Path, typer.Argument(readable=False, help="One run's folder or log file.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the recommendation object as JSON.")] = False,
    log_format: LogFormat = None,
    cache_dir: CacheDir = None,
    no_cache: NoCache = False,
    debug: Debug = False,
) -> None:
    """Print the last healthy checkpoint's path alone on stdout (exit 3: none saved, 4: none before the incident).

    Example: cp -r "$(grpo-forensics best-checkpoint outputs/)" /backup/
    """

    def work() -> None:
        cache = _cache(cache_dir, no_cache, [path], log_format)
        found = _may_play_back(cache, [path], None, log_format)
        run = _single_run(path, cache, log_format)
        if found is not None:  # (checkpoints a log named where it saved them are read too)
            rerun.also_read(folders_beyond((c.path for c in run.checkpoints), [r.checkpoint_dir for r in found if r.checkpoint_dir],
                                           [run.save_folder_named]))
        rec = run.recommendation
        if as_json:
            typer.echo(json.dumps(rec.to_dict(), indent=2))
        why = run.unjudged()
        if why and not run.incidents:  # the newest checkpoint is not thereby a healthy one
            raise UnusableInput(f"{run.run_id}: {why}, so no checkpoint can be called healthy")
        if rec.checkpoint and not as_json:  # (the path as it is for $(...); shown, on a terminal)
            typer.echo(_visible(rec.checkpoint) if sys.stdout.isatty() else rec.checkpoint)
        if rec.checkpoint is None and rec.unlisted:  # (what they hold was not seen: neither 3 nor 4 is known)
            raise UnusableInput(f"{run.run_id}: {rec.reason}")
        if rec.checkpoint is None:
            if any(not i.redone for i in run.incidents):  # (one a relaunch re-ran is not in the run's history)
                raise NoCheckpointBeforeIncident(rec.reason)
            raise NoCheckpointSaved(rec.reason)

    _guard(debug, work)


@app.command()
def events(
    paths: Paths,
    kind: Annotated[list[str] | None, typer.Option("--kind", help="Only events of this kind (repeatable).")] = None,
    log_format: LogFormat = None,
    cache_dir: CacheDir = None,
    no_cache: NoCache = False,
    debug: Debug = False,
) -> None:
    """Every event found, as JSON Lines on stdout.

    Example: grpo-forensics events outputs/ --kind connection_refused
    """

    def work() -> None:
        seen: set[str] = set()
        empty: list[RunAnalysis] = []
        # A run at a time: each run's events are written and its frames let go before the next is read.
        for run in analyze_each(paths, keys=ANALYSIS_KEYS, custom_format=log_format, cache=_cache(cache_dir, no_cache, paths, log_format)):
            empty += [run] if nothing_read(run.sources) else []
            frame = run.events
            seen.update(frame["kind"].unique().drop_nulls())
            if kind:
                frame = frame.filter(frame["kind"].is_in(kind))
            for part in iter_with_messages(frame):  # (a flood's texts a slice at a time)
                for row in part.iter_rows(named=True):
                    row["time"] = iso(row["time"])
                    sys.stdout.write(json.dumps({"run_id": run.run_id, **row}) + "\n")
        if kind and not seen & set(kind):  # a typo must not look like a clean run
            typer.echo(f"grpo-forensics: no event of kind {', '.join(kind)}; found: {', '.join(sorted(seen)) or 'none'}", err=True)
        _no_run_under(paths, log_format, empty)

    _guard(debug, work)


def _no_run_under(paths: list[Path], log_format: Path | None, runs: Sequence[RunAnalysis | RunData] = ()) -> None:
    """A path given beside others that holds no run, and a run of which nothing could be read
    (``runs``): said, exit 2, once the others are written (as ``analyze``)."""
    barren = without_runs(paths, locate(paths, custom_format=log_format)) if paths else []
    said = [why_no_run(path, read_log_format(log_format)) for path in barren] + _read_nothing(runs)
    if said:
        raise UnusableInput("; ".join(said))


def _read_nothing(runs: Sequence[RunAnalysis | RunData]) -> list[str]:
    """``root: why`` of each of ``runs`` that nothing could be read of."""
    return [f"{_root(run)}: {why}" for run in runs if (why := nothing_read(list(run.sources)))]


def _root(run: RunAnalysis | RunData) -> str:
    return run.root if isinstance(run, RunAnalysis) else str(run.location.root)


@app.command()
def metrics(
    paths: OptionalPaths = None,
    fmt: Annotated[str, typer.Option("--format", help="csv, jsonl or parquet.")] = "csv",
    output: Annotated[Path | None, typer.Option("--output", help="Write to FILE instead of stdout (required for parquet).")] = None,
    keys: Annotated[
        str | None,
        typer.Option("--keys", metavar="REGEX", help="Only the keys this regex finds something in (e.g. 'reward|loss'); "
                     "the others are dropped as they are read, so a long run's export needs memory only for these."),
    ] = None,
    log_format: LogFormat = None,
    wandb: Wandb = None,
    cache_dir: CacheDir = None,
    no_cache: NoCache = False,
    debug: Debug = False,
) -> None:
    """The metric frame in long form: run_id, source, step, time, key, value.

    Example: grpo-forensics metrics outputs/ --format parquet --output metrics.parquet
    """

    def work() -> None:
        if fmt not in FORMATS:
            raise UnusableInput(f"--format must be csv, jsonl or parquet, not {fmt!r}")
        if fmt == "parquet" and (output is None or str(output) == "-"):
            raise UnusableInput("--format parquet needs --output FILE")
        if not paths and not wandb:
            raise UnusableInput("give a PATH, or --wandb ENTITY/PROJECT/RUN_ID")
        _refuse_inside(paths or [], output=output)
        checkpoint_dirs = _checkpoint_dirs(paths, log_format) if paths and (output is not None or cache_dir is not None) else []
        _refuse_inside(checkpoint_dirs, output=output)
        if keys is not None:
            try:
                re.compile(keys)
            except re.error as exc:
                raise UnusableInput(f"--keys is not a regular expression: {exc}") from None
        cache = _cache(cache_dir, no_cache, paths or [], log_format)
        to_file = output is not None and str(output) != "-"  # (``-`` is stdout, as for --json and --markdown)
        made: list[Path] = []
        empty: list[RunData] = []

        def refuse_named(run: RunData) -> None:
            empty.extend([run] if nothing_read(run.sources) else [])
            # (checkpoints a log named where it saved them are read too: known only once the run is read)
            named = folders_beyond(run.checkpoints["path"].to_list(), checkpoint_dirs, [run.save_folder_named])
            if to_file and any(within(output, folder) for folder in named):
                for file in made:  # (an earlier run's rows: no part of an export is left there)
                    file.unlink(missing_ok=True)
                _refuse_inside(named, output=output)

        rows = metric_rows(paths or [], custom_format=log_format, wandb_runs=wandb or (), cache=cache, keys=keys,
                           before=refuse_named)
        first = next(rows, None)  # runs are found (or refused) before an output file is made
        if to_file:
            try:
                output.parent.mkdir(parents=True, exist_ok=True)  # (as --json and --markdown do)
            except OSError as exc:
                raise UnusableInput(f"--output {output}: {exc.strerror or exc}") from None
            made.append(output)
        written = write_metrics(itertools.chain([] if first is None else [first], rows), fmt,
                                output if to_file else sys.stdout.buffer)
        if keys is not None and not written:  # a typo must not look like a run that logged nothing
            typer.echo(f"grpo-forensics: no metric key matched --keys {keys!r} (without it, every key is written)", err=True)
        _no_run_under(paths or [], log_format, empty)

    _guard(debug, work)


@app.command()
def compare(
    run_a: Annotated[Path, typer.Argument(readable=False, help="The control run (one run's folder or log file).")],
    run_b: Annotated[Path, typer.Argument(readable=False, help="The fix run (one run's folder or log file).")],
    out: Annotated[Path | None, typer.Option("--out", help="Folder for compare.html (default ./grpo-forensics-report, never inside a RUN).")] = None,
    json_out: Annotated[str | None, typer.Option("--json", help="Write the comparison as JSON to FILE, or '-' for stdout.")] = None,
    html: Annotated[bool, typer.Option("--html/--no-html", help="Write compare.html.")] = True,
    log_format: LogFormat = None,
    cache_dir: CacheDir = None,
    no_cache: NoCache = False,
    debug: Debug = False,
) -> None:
    """Control vs fix side by side: metric, step time, memory, incidents, and whether B avoided A's incident.

    Example: grpo-forensics compare control/outputs fix/outputs --out /tmp/cmp
    """
    from forensics.compare import compare as compare_runs
    from reports import render_comparison, write_compare_html

    def work() -> None:
        _need_stdout("the comparison")
        _refuse_inside([run_a, run_b], json=json_out, out=out)
        # (as analyze: the runs' checkpoint folders are read too, and the folder a run is read from
        # is no place for the default report folder)
        found = locate([run_a, run_b], custom_format=log_format)
        checkpoint_dirs = [r.checkpoint_dir for r in found if r.checkpoint_dir]
        _refuse_inside(checkpoint_dirs, json=json_out, out=out)
        folder = _report_dir(out, [run_a, run_b], found) if html else None  # (refused before the analysis, not after)
        cache = _cache(cache_dir, no_cache, [run_a, run_b], log_format, found=found)
        a, b = _single_run(run_a, cache, log_format), _single_run(run_b, cache, log_format)
        _refuse_inside(folders_beyond((c.path for run in (a, b) for c in run.checkpoints), checkpoint_dirs,
                                      (a.save_folder_named, b.save_folder_named)), json=json_out, out=out)
        result = compare_runs(a, b)
        console = _Console(stderr=json_out == "-")
        render_comparison(result, console)
        if json_out is not None:
            _write_json(result.to_dict(), json_out)
        if folder is not None:
            console.print(f"report: {write_compare_html(result, folder)}", markup=False, highlight=False, soft_wrap=True)

    _guard(debug, work)


EXIT_ALARM = 5


@app.command()
def watch(
    path: Annotated[Path, typer.Argument(readable=False, help="The run's folder or log file, as for analyze (read only, never written).")],
    replay: Annotated[bool, typer.Option("--replay", help="Replay a finished run as if live: where each alarm would have fired.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print alarms as JSON (with --replay: the {\"alarms\": [...]} document).")] = False,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between polls of the logs.")] = 30.0,
    timeout: Annotated[float | None, typer.Option("--timeout", help="Stop following after this many seconds (exit 0 if nothing fired).")] = None,
    zero_steps: Annotated[int, typer.Option("--zero-steps", help="Steps in a row at one exact reward (e.g. 0) that make a collapse.")] = 5,
    warmup_steps: Annotated[int, typer.Option("--warmup-steps", help="A reward constant since the first step is judged only after this many steps.")] = 10,
    server_down_minutes: Annotated[float, typer.Option("--server-down-minutes", help="A server gone this long, with no relaunch, raises an alarm.")] = 5.0,
    stop: Annotated[bool, typer.Option("--exit/--keep-going", help="Stop at the first alarm (and the others of its poll), or keep following.")] = True,
    fail_on_alarm: Annotated[bool, typer.Option("--fail-on-alarm", help="Exit 5 when an alarm fired (for a wrapper script).")] = False,
    on_alarm: Annotated[str | None, typer.Option("--on-alarm", help="Shell command run at each alarm: alarm JSON on stdin, GRPO_FORENSICS_* variables.")] = None,
    wandb_alert: Annotated[bool, typer.Option("--wandb-alert", help="Post a W&B alert to the run's W&B run (needs WANDB_API_KEY).")] = False,
    report_dir: Annotated[Path | None, typer.Option("--report-dir", help="Write the HTML report here when an alarm fires.")] = None,
    state_dir: Annotated[Path | None, typer.Option("--state-dir", help="Where alarms raised and parsed logs are kept (default: the user cache dir).")] = None,
    log_format: LogFormat = None,
    debug: Debug = False,
) -> None:
    """Follow a live run and raise an alarm when an incident starts.

    Alarms: reward_collapse, reward_drop, zero_variance, dead_loss, nan_inf, server_errors, server_down, stall, crash.
    Exit codes: 0 done (an alarm raised or not), 2 unusable input; with --fail-on-alarm, 5 when an
    alarm fired (with --replay: when one would have).

    Example: grpo-forensics watch outputs/ --on-alarm 'scancel "$SLURM_JOB_ID"' --report-dir /tmp/alarm
    """
    from forensics import alarms as act
    from forensics.watch import Watcher, WatchSettings
    from forensics.watch import replay as replay_run
    from reports.alarms import print_alarm, render_replay

    settings = WatchSettings(zero_steps=zero_steps, warmup_steps=warmup_steps, server_down_minutes=server_down_minutes)
    console = _Console(stderr=as_json)

    def work() -> int:
        _refuse_inside([path], report_dir=report_dir)
        _usable_numbers(interval=interval, timeout=timeout, zero_steps=zero_steps, warmup_steps=warmup_steps,
                        server_down_minutes=server_down_minutes)
        fmt = read_log_format(log_format)
        try:  # (the checkpoints beside the logs are read too: nothing is written among them either)
            saved = [run.checkpoint_dir for run in find_runs([path], custom_format=fmt) if run.checkpoint_dir]
        except (NoRunsFound, PathNotFound):  # (no run there yet: a watch waits for one)
            saved = []
        _refuse_inside(saved, report_dir=report_dir, state_dir=state_dir)
        if replay:
            _need_stdout("the replay")  # (live, an --on-alarm command or the exit code may be all a wrapper wants)
            results = replay_run([path], settings=settings, custom_format=fmt)
            if as_json:
                alarms = [{**a.to_dict(), "offline_onsets": r.to_dict()["offline_onsets"], "last_step": r.last_step}
                          for r in results for a in r.alarms]
                _write_json({"alarms": alarms, "runs": [r.to_dict() for r in results]}, "-")
            else:
                render_replay(results, console)
            return EXIT_ALARM if fail_on_alarm and any(r.alarms for r in results) else 0
        if not path.exists():
            raise UnusableInput(f"{path}: no such file or directory")
        watcher = Watcher(path, settings=settings, state_dir=state_dir, custom_format=fmt)
        fired = []
        commands = act.Commands(on_alarm, lambda said: console.print(said, markup=False)) if on_alarm else None

        def handle(alarm: Any) -> bool:
            fired.append(alarm)
            run = watcher.run(alarm)
            report, said = act.write_report(run, report_dir, alarm) if report_dir is not None and run is not None else (None, None)
            if as_json:
                sys.stdout.write(json.dumps({**alarm.to_dict(), "report": str(report) if report else None}) + "\n")
                sys.stdout.flush()
            print_alarm(alarm, console)
            if said:
                console.print(said, markup=False)
            if commands is not None:
                commands.start(alarm, report)
            if wandb_alert and run is not None:
                console.print(act.post_wandb_alert(alarm, run), markup=False)
            return not stop

        console.print(f"watching {path} every {interval:g} s (state: {watcher.state_dir})", markup=False)
        try:
            watcher.follow(handle, interval=interval, timeout=timeout,
                           on_notice=lambda said: console.print(f"warning: {said}", markup=False, soft_wrap=True))
        except KeyboardInterrupt:
            pass
        finally:
            if commands is not None:
                commands.wait()
        return EXIT_ALARM if fired and fail_on_alarm else 0

    code = _guard(debug, work)
    if code:
        raise typer.Exit(code)


def _single_run(path: Path, cache: ParseCache | None = None, log_format: Path | None = None) -> RunAnalysis:
    """The one run at ``path``; several runs there is unusable input for this command."""
    runs = run_analysis([path], cache=cache, custom_format=log_format).runs
    if len(runs) != 1:
        names = ", ".join(r.run_id for r in runs)
        raise UnusableInput(f"{path}: {len(runs)} runs found ({names}); point at exactly one run")
    return runs[0]


def _may_play_back(cache: ParseCache | None, paths: list[Path], found: list[RunLocation] | None,
                   log_format: Path | None) -> list[RunLocation] | None:
    """Offer this run to be played back when run again (:mod:`forensics.rerun`): with a cache, of
    folders (a log file's whole folder is not listed). The runs found there, or ``None`` when not offered."""
    if cache is None or not all(path.is_dir() for path in paths):
        return None
    found = locate(paths, custom_format=log_format) if found is None else found
    rerun.offer(cache.directory, paths, [p for r in found for _, p in read_by(r)] + ([log_format] if log_format else []))
    return found


def _recall(cache: ParseCache | None, key: str | None, html: bool) -> dict[str, bytes] | None:
    """What an earlier ``analyze`` of the very same inputs produced, when it holds all that is asked for."""
    kept = cache.recall(key) if cache is not None and key else None
    if kept is None or "analysis.pickle" not in kept or (html and "report.html" not in kept):
        return None
    return kept


def _summary_only(result: Analysis) -> Analysis:
    """``result`` without the big frames: what the summary, the JSON document and Markdown need
    (a run that could not be judged keeps its events: its verdict names the failures logged)."""
    runs = [replace(r, metrics=r.metrics.clear(), superseded=r.superseded.clear(),
                    events=r.events if r.unjudged() else r.events.clear()) for r in result.runs]
    return replace(result, runs=runs)


def _unpickled(kept: dict[str, bytes]) -> Analysis | None:
    try:
        result = pickle.loads(kept["analysis.pickle"])  # noqa: S301 - our own file, in the user's private cache
    except Exception:  # noqa: BLE001 - cut short, emptied, or from another version: a miss
        return None
    return result if isinstance(result, Analysis) else None


def _digest(path: Path | None) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest() if path else ""
    except OSError:
        return "unreadable"


def _cache(cache_dir: Path | None, no_cache: bool, paths: list[Path], log_format: Path | None = None, *,
           found: list[RunLocation] | None = None) -> ParseCache | None:
    """The parse cache, never inside an analyzed tree (an explicit one there is refused, a default one
    dropped), nor in a checkpoint folder the runs found there are read from (``found``, where the
    caller has them; else found here for an explicit one)."""
    if no_cache:
        return None
    try:
        chosen = cache_dir or default_cache_dir()
    except NoCacheDir:  # (no home folder: parsed afresh each time, as with --no-cache)
        return None
    read = _trees(paths)
    # (the usual default is never in a run's checkpoint folder; one set for the environment may be,
    # or in the one a verl console names: written in the parse, so found before it)
    if cache_dir is not None or os.environ.get(CACHE_ENV):
        if found is None:
            found = locate(paths, custom_format=log_format) if paths else []
        read += [r.checkpoint_dir for r in found if r.checkpoint_dir]
        read += [folder for location in found for folder in save_folders_named(location)]
    if inside := next((given for given in read if within(chosen, given)), None):
        if cache_dir is not None:
            raise UnusableInput(f"--cache-dir {cache_dir} is inside the analyzed path {inside}; nothing is written there")
        return None
    return ParseCache(chosen)


def _trees(paths: list[Path]) -> list[Path]:
    return [analyzed_tree(path) for path in paths]


def _checkpoint_dirs(paths: list[Path], log_format: Path | None) -> list[Path]:
    """The checkpoint folders the runs at ``paths`` are read from, wherever their logs were given from."""
    return [run.checkpoint_dir for run in locate(paths, custom_format=log_format) if run.checkpoint_dir]


#: The files ``--out`` holds: a report, a comparison, a fleet's index.
_REPORT_FILES = frozenset({"report.html", "compare.html", "index.html", "index.parquet", "incidents.parquet"})
#: Outputs that are one file each (``--out`` and ``--report-dir`` are folders).
_FILE_OPTIONS = ("json", "markdown", "output")


def _refuse_inside(paths: list[Path], **outputs: str | Path | None) -> None:
    """Refuse, before any work, an output (``--json FILE``, ``--out DIR``, …) under an analyzed tree,
    an ``--out`` folder that is a file, and a file (``--json``, ``--markdown``, ``--output``) that is
    a folder."""
    paths = _trees(paths)
    given = {option: Path(os.path.abspath(target)) for option, target in outputs.items() if target is not None and str(target) != "-"}
    for (one, a), (other, b) in itertools.combinations(given.items(), 2):
        if a == b:  # (one would be written over the other, or fail as a folder after the whole analysis)
            raise UnusableInput(f"--{one.replace('_', '-')} and --{other.replace('_', '-')} are both {outputs[one]}; give each its own")
    for option, target in given.items():
        if option in _FILE_OPTIONS and "out" in given and target.parent == given["out"] and target.name in _REPORT_FILES:
            raise UnusableInput(f"--{option} {outputs[option]} is the {target.name} --out writes; give it another name")
    for option, target in outputs.items():
        if target is None or str(target) == "-":
            continue
        if option == "out" and Path(target).exists() and not Path(target).is_dir():
            raise UnusableInput(f"--out {target} is a file; give a folder for the report")
        if option in _FILE_OPTIONS and Path(target).is_dir():
            raise UnusableInput(f"--{option} {target} is a folder; give a file to write (or - for stdout)")
        for given in paths:
            if within(Path(target), given):
                raise UnusableInput(f"--{option.replace('_', '-')} {target} is inside the analyzed path {given}; nothing is written there")


def _write_text(text: str, target: str) -> None:
    """``text`` to the file ``target`` (its folder made when missing), or to stdout for ``-``."""
    if target == "-":
        sys.stdout.write(text)
    else:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        Path(target).write_text(text, encoding="utf-8")
        rerun.wrote(Path(target), whole=False)


def _write_json(document: dict[str, Any], target: str) -> None:
    _write_text(json.dumps(document, indent=2) + "\n", target)


def _usable_numbers(**numbers: float | None) -> None:
    """Each of ``watch``'s numbers finite and not negative (``zero_steps`` at least 1), or exit 2."""
    for name, value in numbers.items():
        least = 1 if name == "zero_steps" else 0
        if value is not None and not (math.isfinite(value) and value >= least):
            raise UnusableInput(f"--{name.replace('_', '-')} {value}: must be a number of at least {least}")


def _report_dir(out: Path | None, paths: list[Path], runs: Sequence[RunLocation] = ()) -> Path:
    """Where reports go: ``--out``, else ``./grpo-forensics-report``, else this user's temp folder
    — never inside an analyzed tree. The default is not put in the folder the ``runs`` found there
    read from either (their logs' and checkpoints' common folder: a verl experiment's, given its
    ``<project>/<experiment>.jsonl``)."""
    trees = _trees(paths) + ([_read_from(run) for run in runs] if out is None else [])
    chosen = out or Path("grpo-forensics-report")
    given = next((tree for tree in trees if within(chosen, tree)), None)
    if given is None and (out is not None or _can_write(chosen)):
        return _writable(chosen)
    if out is not None:
        raise UnusableInput(f"--out {out} is inside the analyzed path {given}; reports never go there")
    # (here, the current folder is inside an analyzed tree, or not this user's to write in)
    # The folder tempfile would choose, found first without its search (which writes a probe file in it).
    named = [Path(v) for v in (os.environ.get(k) for k in ("TMPDIR", "TEMP", "TMP")) if v and Path(v).is_dir()]
    temp = named[0] if named else Path("/tmp")
    if not any(within(temp, tree) for tree in trees):
        temp = Path(tempfile.gettempdir())
    if inside := next((tree for tree in trees if within(temp / "grpo-forensics-report", tree)), None):
        # (the temp folder itself analyzed, or TMPDIR pointed into the tree)
        raise UnusableInput(f"the default report folders ./grpo-forensics-report and {temp}/grpo-forensics-report-… are "
                            f"inside the analyzed path {inside}; give --out a folder outside it")
    return _own_temp_dir(temp)


def _read_from(run: RunLocation) -> Path:
    """The run's folder, or the one its logs share with its ``checkpoints/`` where the framework
    puts them side by side (AReaL's fileroot, verl's working folder)."""
    if run.checkpoint_dir is None:
        return run.root
    saved = Path(os.path.abspath(run.checkpoint_dir))
    both = Path(os.path.commonpath([os.path.abspath(run.root), saved]))
    return both if both / "checkpoints" in (saved, *saved.parents) else run.root


def _writable(folder: Path) -> Path:
    """``folder``, if this user can write it (or make it): refused before the analysis, not after it."""
    if not _can_write(folder):
        raise UnusableInput(f"--out {folder} cannot be written: permission denied")
    return folder


def _can_write(folder: Path) -> bool:
    there = folder
    while not there.exists() and there.parent != there:
        there = there.parent
    return there.is_dir() and os.access(there, os.W_OK | os.X_OK)


def _own_temp_dir(temp: Path) -> Path:
    """This user's report folder in the temp folder ``temp``, made private: one shared name would be
    another user's to own (the write then fails), to read, or to replace with a link. A folder of
    that name that is not this user's own is passed over for a fresh one."""
    uid = os.getuid() if hasattr(os, "getuid") else None
    folder = temp / f"grpo-forensics-report-{uid if uid is not None else os.getpid()}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        info = folder.lstat()
        if folder.is_dir() and not folder.is_symlink() and (uid is None or info.st_uid == uid):
            return folder
    except OSError:
        pass
    return Path(tempfile.mkdtemp(prefix="grpo-forensics-report-", dir=temp))


def main() -> None:
    """The command line in this process (the console script is :func:`forensics.entry.main`,
    which also sets Polars' allocator up before Polars is imported)."""
    reuse_block_memory()
    app()


if __name__ == "__main__":
    main()
