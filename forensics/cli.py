"""The ``grpo-forensics`` command: a thin layer over :func:`forensics.analyze`.

Each command resolves its arguments, calls the library, renders the result and maps the
library's errors to CONTRACT exit codes (2: unusable input, 3/4: no checkpoint).
"""

from __future__ import annotations

import json
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from forensics.analysis import analyze as run_analysis
from forensics.cache import ParseCache, default_cache_dir
from forensics.errors import ForensicsError, NoCheckpointBeforeIncident, NoCheckpointSaved, UnusableInput
from forensics.model import Analysis, RunAnalysis, iso

app = typer.Typer(
    help="Post-mortems for GRPO training runs: when the reward collapsed, why, and the last healthy checkpoint.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

EXIT_INCIDENT, EXIT_BAD_INPUT, EXIT_NO_CHECKPOINT, EXIT_NONE_BEFORE = 1, 2, 3, 4
EXIT_BUG = 70

Paths = Annotated[list[Path], typer.Argument(help="Run folders (AReaL fileroot, outputs/, a trial log folder) or log files.")]
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
    typer.Argument(help="Run folders (AReaL fileroot, outputs/, a trial log folder) or log files."),
]
CacheDir = Annotated[
    Path | None,
    typer.Option("--cache-dir", help="Where parsed frames are kept between runs (default $GRPO_FORENSICS_CACHE or ~/.cache/grpo-forensics).",
                 envvar="GRPO_FORENSICS_CACHE"),
]
NoCache = Annotated[bool, typer.Option("--no-cache", help="Parse every file afresh and keep nothing.")]
T = TypeVar("T")


def _guard(debug: bool, action: Callable[[], T]) -> T:
    """Run ``action``; turn known errors into one line on stderr and their exit code."""
    try:
        return action()
    except typer.Exit:
        raise
    except NoCheckpointSaved as exc:
        typer.echo(f"grpo-forensics: {exc}", err=True)
        raise typer.Exit(EXIT_NO_CHECKPOINT) from None
    except NoCheckpointBeforeIncident as exc:
        typer.echo(f"grpo-forensics: {exc}", err=True)
        raise typer.Exit(EXIT_NONE_BEFORE) from None
    except (ForensicsError, OSError) as exc:
        if debug:
            traceback.print_exc()
        typer.echo(f"grpo-forensics: {exc}", err=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None
    except Exception as exc:  # a bug: say so plainly, show the traceback only on request
        if debug:
            traceback.print_exc()
        typer.echo(f"grpo-forensics: internal error ({type(exc).__name__}: {exc}); rerun with --debug", err=True)
        raise typer.Exit(EXIT_BUG) from None


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
    debug: Debug = False,
) -> None:
    """Find incidents, their causes and the last healthy checkpoint; print a summary and write the report.

    Example: grpo-forensics analyze outputs/ --json analysis.json
    """
    from reports import render_markdown, render_summary, write_html

    def work() -> Analysis:
        if json_out == "-" and markdown == "-":
            raise UnusableInput("--json - and --markdown - cannot both write to stdout")
        if not paths and not wandb:
            raise UnusableInput("give a PATH to analyze, or --wandb ENTITY/PROJECT/RUN_ID")
        cache = _cache(cache_dir, no_cache, paths or [])
        result = run_analysis(paths or [], custom_format=log_format, wandb_runs=wandb or (), cache=cache)
        console = Console(stderr="-" in (json_out, markdown))
        render_summary(result, console)
        if json_out is not None:
            _write_json(result.to_document(), json_out)
        if markdown is not None:
            _write_text(render_markdown(result), markdown)
        if html:
            folder = _report_dir(out, paths or [])
            written = write_html(result, folder)
            console.print(f"report: {written}")
        return result

    result = _guard(debug, work)
    if fail_on_incident and result.has_incident:
        raise typer.Exit(EXIT_INCIDENT)


@app.command("best-checkpoint")
def best_checkpoint(
    path: Annotated[Path, typer.Argument(help="One run's folder or log file.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the recommendation object as JSON.")] = False,
    cache_dir: CacheDir = None,
    no_cache: NoCache = False,
    debug: Debug = False,
) -> None:
    """Print the last healthy checkpoint's path alone on stdout (exit 3: none saved, 4: none before the incident).

    Example: cp -r "$(grpo-forensics best-checkpoint outputs/)" /backup/
    """

    def work() -> None:
        run = _single_run(path, _cache(cache_dir, no_cache, [path]))
        rec = run.recommendation
        if as_json:
            typer.echo(json.dumps(rec.to_dict(), indent=2))
        elif rec.checkpoint:
            typer.echo(rec.checkpoint)
        if rec.checkpoint is None:
            if run.incidents:
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
        for run in run_analysis(paths, custom_format=log_format, cache=_cache(cache_dir, no_cache, paths)).runs:
            frame = run.events
            if kind:
                frame = frame.filter(frame["kind"].is_in(kind))
            for row in frame.iter_rows(named=True):
                row["time"] = iso(row["time"])
                sys.stdout.write(json.dumps({"run_id": run.run_id, **row}) + "\n")

    _guard(debug, work)


@app.command()
def metrics(
    paths: OptionalPaths = None,
    fmt: Annotated[str, typer.Option("--format", help="csv, jsonl or parquet.")] = "csv",
    output: Annotated[Path | None, typer.Option("--output", help="Write to FILE instead of stdout (required for parquet).")] = None,
    log_format: LogFormat = None,
    wandb: Wandb = None,
    cache_dir: CacheDir = None,
    no_cache: NoCache = False,
    debug: Debug = False,
) -> None:
    """The metric frame in long form: run_id, source, step, time, key, value.

    Example: grpo-forensics metrics outputs/ --format parquet --output metrics.parquet
    """
    import polars as pl

    def work() -> None:
        if fmt not in ("csv", "jsonl", "parquet"):
            raise UnusableInput(f"--format must be csv, jsonl or parquet, not {fmt!r}")
        if fmt == "parquet" and output is None:
            raise UnusableInput("--format parquet needs --output FILE")
        if not paths and not wandb:
            raise UnusableInput("give a PATH, or --wandb ENTITY/PROJECT/RUN_ID")
        cache = _cache(cache_dir, no_cache, paths or [])
        result = run_analysis(paths or [], custom_format=log_format, wandb_runs=wandb or (), cache=cache)
        frame = pl.concat(
            [
                r.metrics.select(
                    pl.lit(r.run_id).alias("run_id"),
                    pl.col("source").fill_null(r.framework),
                    "step",
                    "time",
                    "key",
                    "value",
                )
                for r in result.runs
            ]
        )
        target: Any = output if output is not None else sys.stdout
        if fmt == "csv":
            frame.write_csv(target)
        elif fmt == "jsonl":
            frame.write_ndjson(target)
        else:
            frame.write_parquet(output)  # type: ignore[arg-type]

    _guard(debug, work)


@app.command()
def compare(
    run_a: Annotated[Path, typer.Argument(help="The control run (one run's folder or log file).")],
    run_b: Annotated[Path, typer.Argument(help="The fix run (one run's folder or log file).")],
    out: Annotated[Path | None, typer.Option("--out", help="Folder for compare.html (default ./grpo-forensics-report, never inside a RUN).")] = None,
    json_out: Annotated[str | None, typer.Option("--json", help="Write the comparison as JSON to FILE, or '-' for stdout.")] = None,
    html: Annotated[bool, typer.Option("--html/--no-html", help="Write compare.html.")] = True,
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
        cache = _cache(cache_dir, no_cache, [run_a, run_b])
        result = compare_runs(_single_run(run_a, cache), _single_run(run_b, cache))
        console = Console(stderr=json_out == "-")
        render_comparison(result, console)
        if json_out is not None:
            _write_json(result.to_dict(), json_out)
        if html:
            console.print(f"report: {write_compare_html(result, _report_dir(out, [run_a, run_b]))}")

    _guard(debug, work)


def _single_run(path: Path, cache: ParseCache | None = None) -> RunAnalysis:
    """The one run at ``path``; several runs there is unusable input for this command."""
    runs = run_analysis([path], cache=cache).runs
    if len(runs) != 1:
        names = ", ".join(r.run_id for r in runs)
        raise UnusableInput(f"{path}: {len(runs)} runs found ({names}); point at exactly one run")
    return runs[0]


def _cache(cache_dir: Path | None, no_cache: bool, paths: list[Path]) -> ParseCache | None:
    """The parse cache, never inside an analyzed tree (an explicit one there is refused, a default one dropped)."""
    if no_cache:
        return None
    chosen = cache_dir or default_cache_dir()
    if any(_inside(chosen, given) for given in paths):
        if cache_dir is not None:
            raise UnusableInput(f"--cache-dir {cache_dir} is inside the analyzed path; nothing is written there")
        return None
    return ParseCache(chosen)


def _inside(target: Path, given: Path) -> bool:
    root = given.resolve()
    root = root if root.is_dir() else root.parent
    resolved = target.resolve()
    return resolved == root or root in resolved.parents


def _write_text(text: str, target: str) -> None:
    if target == "-":
        sys.stdout.write(text)
    else:
        Path(target).write_text(text, encoding="utf-8")


def _write_json(document: dict[str, Any], target: str) -> None:
    text = json.dumps(document, indent=2)
    if target == "-":
        sys.stdout.write(text + "\n")
    else:
        Path(target).write_text(text + "\n", encoding="utf-8")


def _report_dir(out: Path | None, paths: list[Path]) -> Path:
    """Where reports go: ``--out``, else ``./grpo-forensics-report`` — never inside an analyzed tree."""
    chosen = out or Path("grpo-forensics-report")
    for given in paths:
        if _inside(chosen, given):
            if out is not None:
                raise UnusableInput(f"--out {out} is inside the analyzed path {given}; reports never go there")
            return Path(tempfile.gettempdir()) / "grpo-forensics-report"
    return chosen


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
