"""Find the runs under the paths a user gives: which sources belong together, where their
checkpoints live. Read-only: it lists directories and sniffs file heads, nothing more.

A run is rooted at the folder holding its text logs (AReaL's ``logs/<user>/<exp>/<trial>``);
copies of its numbers elsewhere under it (a ``wandb/`` folder, TensorBoard event files) are
attached to it. Copies with no text log above them form a run of their own.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from forensics.errors import NoRunsFound, PathNotFound
from parsers import looks_like_areal, looks_like_sglang
from parsers._checkpoint_files import dangling_link
from parsers._lines import head_bytes, open_log
from parsers._walk import under, walk
from parsers._walk import within as within  # (where the CLI and the watcher look for it)
from parsers.custom import CustomFormat, looks_like_custom_loop
from parsers.ray import find_ray_sessions
from parsers.schema import COMPRESSED, COMPRESSIONS, ROTATED
from parsers.tensorboard import HPARAMS_FOLDER
from parsers.trl_checkpoints import is_trl_checkpoint_root
from parsers.verl import first_fact, looks_like_ray_console, looks_like_verl_log
from parsers.verl_checkpoints import find_verl_checkpoint_roots
from parsers.wandb_run import RUN_DIR, find_wandb_runs, wandb_run_head

# Folders that hold weights, dumps or traces, never a run's logs.
_SKIP_DIRS = {"checkpoints", "recover_checkpoint", "generated", "generated-eval", "rollout",
              "eval-rollout", "perf_tracer", "session_tracer", "memory_snapshots",
              "__pycache__", ".git", "weight_update", "node_modules"}
#: A log's name: its base, then a rotation's number or date and compression (:data:`parsers.schema.ROTATED`).
#: (spaces and brackets too: a browser's second download is ``trainer (1).log``)
_LOG_NAME = re.compile(r"^(?P<base>[\w .()+,@-]+?\.(?:log|out|err|txt)|[a-z_]+-\d+)" + ROTATED)
#: A name a log may have beyond :data:`_LOG_NAME` (``trainer.log.bak``, ``stdout``), not a document's
#: (``README.md`` quotes log lines; given by name, it is still no log).
_LOGGISH = re.compile(r"\.(?:log|out|err|txt)\b|^[^.]+$")
_WANDB_FILE = re.compile(r"^run-[\w-]+\.wandb$")
_RAY_SESSION = re.compile(r"^session_\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2}_\d+_\d+$")
_SERVER_LOGS = {"llm_server.log"}
#: (verl's console is whatever its launch tee'd to: its quickstart's name, and the usual one)
_TRAINER_LOGS = {"trainer.log", "main.log", "merged.log", "master_worker-0", "train.log", "verl_demo.log"}
#: Sources that attach to the run whose text logs sit above them: copies of its numbers
#: (W&B, TensorBoard, verl's JSONL logger) and the Ray session its workers ran in.
COPY_KINDS = {"wandb", "tensorboard", "verl_jsonl", "ray_session", "trl_state"}

#: What the library takes where it takes paths: one path, or several.
PathArg = str | os.PathLike[str]


def as_paths(paths: PathArg | Iterable[PathArg]) -> list[Path]:
    """``paths`` as a list of :class:`~pathlib.Path`: one path (a string too) or an iterable of them."""
    if isinstance(paths, str | os.PathLike):
        return [Path(paths)]
    return [Path(p) for p in paths]


@dataclass(frozen=True)
class LogSource:
    """One source of a run; ``order`` puts rotated copies oldest first."""

    path: Path
    kind: str
    order: int = 0


@dataclass(frozen=True)
class RunLocation:
    """Where one run's files are."""

    run_id: str
    framework: str
    root: Path
    logs: tuple[LogSource, ...]
    checkpoint_dir: Path | None
    skipped: tuple[str, ...] = field(default=())
    twins: tuple[Path, ...] = field(default=())
    """Gzipped copies of a log kept beside it (``trainer.log`` and ``trainer.log.gz``): not read twice."""


def find_runs(paths: PathArg | Iterable[PathArg], *, custom_format: CustomFormat | None = None) -> list[RunLocation]:
    """Every run under ``paths`` (folders are searched, files are taken as they are).

    With ``custom_format``, logs it reads are runs too.

    Raises:
        PathNotFound: a path does not exist.
        NoRunsFound: nothing under the paths looks like a training run's log.
    """
    paths = as_paths(paths)
    runs: list[RunLocation] = []
    skipped: list[str] = []
    apart: list[Path] = []  # (folders given that held no run: a run's checkpoints kept apart?)
    links: list[str] = []  # (links out of the folders given, not followed: said if no run is found)
    for given in paths:
        if not os.path.lexists(given):
            raise PathNotFound(f"{given}: no such file or directory")
    # Logs given by name (a file, or a pipe) are grouped as in their folder: one run's rotated
    # parts, its server log or a .gz twin beside it are that run's, not runs of their own.
    files = {given: _home_of(given) for given in paths if not given.is_dir()}
    done: set[Path] = set()
    for given in paths:
        if given not in files:
            sources, problems = _walk(given, custom_format, links)
            side_by_side = _logs_of_runs_side_by_side(sources)
        elif files[given] in done:
            continue
        else:
            done.add(files[given])
            mine = [f for f, home in files.items() if home == files[given]]
            sources, problems = _classify(mine, custom_format, given=True)
            problems += _left_beside(mine)
            side_by_side = _logs_of_runs_side_by_side(sources)  # (as in their folder)
        if side_by_side:  # (runA_trainer.log and runB_trainer.log, downloaded side by side)
            logs = _by_log([s for s in sources if s.kind not in COPY_KINDS])
            copies, strays = _copies_by_log([s for s in sources if s.kind in COPY_KINDS], logs)
            for base, log in logs.items():
                # (each named by its log too: one folder's runs are otherwise told apart by nothing)
                runs.extend(replace(run, run_id=f"{run.run_id}/{base}") for run in _group(
                    log[0].path, log + copies.get(base, []), [p for p in problems if any(p.startswith(f"{s.path}: ") for s in log)]))
            runs.extend(_group(given, strays, []) if strays else [])
            skipped += problems
            continue
        found = _group(given, sources, problems)
        runs.extend(found)
        skipped += problems
        if not found and given not in files:
            apart.append(given)
    if not runs:
        shown = ", ".join(str(p) for p in paths)
        why = "".join(f"; skipped {problem}" for problem in skipped[:3])
        if links:
            why += (f"; links to folders are not followed: {', '.join(links[:3])}{' …' if len(links) > 3 else ''}"
                    " (give them as paths: analyze DIR/*)")
        raise NoRunsFound(
            f"{shown}: no training run found (looked for AReaL, SGLang and loop logs, W&B runs, TensorBoard files, a Trainer's checkpoints){why}"
        )
    runs = _with_servers_given_apart(_once(_with_sessions_given_apart(_once(runs), custom_format)))
    return _with_checkpoints_given_apart(runs, apart)


_SERVERS = ("areal_server", "sglang_server")


def _with_servers_given_apart(runs: list[RunLocation]) -> list[RunLocation]:
    """Server logs given apart from one run (``analyze outputs/ node3/llm_server.log.gz``: copied off
    the node that served it) are that run's, as one copied into a folder below it would be: its
    OOM is the cause of the run's collapse, not a run of its own. Beside several runs, or none, each
    stays a run of its own (which run a server served cannot be told from its log)."""
    apart = [run for run in runs if run.logs and all(s.kind in _SERVERS for s in run.logs)]
    others = [run for run in runs if run not in apart]
    if not apart or len(others) != 1:
        return runs
    run = others[0]
    servers = tuple(s for r in apart for s in r.logs)
    return [replace(run, logs=tuple(sorted((*run.logs, *servers), key=_log_order)), skipped=(*run.skipped, *(p for r in apart for p in r.skipped)))]


def _with_checkpoints_given_apart(runs: list[RunLocation], folders: list[Path]) -> list[RunLocation]:
    """A run's checkpoints given as a folder of their own beside its logs (``analyze logs_copy/
    /mnt/ckpt/``): the run's, when it is the one run with none found."""
    lacking = [run for run in runs if run.checkpoint_dir is None]
    if len(lacking) != 1:
        return runs
    run = lacking[0]
    parts = Path(os.path.abspath(run.root)).parts
    trial, areal = parts[-3:], len(parts) >= 4 and parts[-4] == "logs"  # (AReaL: logs/<user>/<exp>/<trial>)
    # Another run named alike (``analyze runs/*`` over one config's runs) could own them as well:
    # whose they are cannot be told, and a run handed another's checkpoints resumes from weights it never saved.
    if any(other is not run and Path(os.path.abspath(other.root)).parts[-len(trial):] == trial for other in runs):
        return runs
    for folder in folders:
        # AReaL's checkpoints/ or a folder below it, down to the trial's (default/, recover_info/):
        # the one named as the run's logs are, else the only one...
        trials = []
        for here, dirs, _ in walk(folder):
            if "default" in dirs or "recover_info" in dirs:
                trials.append(Path(here))
                dirs[:] = []
            elif len(Path(here).relative_to(folder).parts) >= 3:  # (not into the weights' folders)
                dirs[:] = []
        # (a copy's folders may have lost the user and experiment: its trial's name must still be the same)
        named = [t for t in trials if t.parts[-len(trial):] == trial] or (
            [t for t in trials if t.name == trial[-1]] if len(trials) == 1 and not areal else [])
        if len(named) == 1:
            return [replace(r, checkpoint_dir=named[0]) if r is run else r for r in runs]
        # ...or the one folder of verl's global_step_N/ below it, beside that run alone (they bear no run's name).
        if run.framework == "verl" and len(runs) == 1 and len(found := find_verl_checkpoint_roots(folder)) == 1:
            return [replace(r, checkpoint_dir=found[0]) if r is run else r for r in runs]
    return runs


def _once(runs: list[RunLocation]) -> list[RunLocation]:
    """A path given twice, a run's folder with the folder above it, or a log with its run's folder:
    each run once, as first found (a run whose logs another's include is that run). A Ray session
    read as given (its files, and the session) is the run that has the session as its own."""
    alone = [_sessions_only(run) for run in runs]
    logs = [frozenset(_real(s) for s in run.logs if not alone[i] or s.kind == "ray_session") for i, run in enumerate(runs)]
    return [run for i, run in enumerate(runs)
            if not any(logs[i] < other or (logs[i] == other and j < i) for j, other in enumerate(logs) if j != i)]


#: How a run's log beside the ones given by name, and not given, is said.
LEFT_BESIDE = "not read: beside the log given"


def _several_runs(sources: list[LogSource]) -> bool:
    """Whether logs given by name from one folder are several runs': two of one kind that are not
    parts of one log (its rotated parts, its .gz)."""
    bases: dict[str, set[str]] = {}
    for source in sources:
        bases.setdefault(source.kind, set()).add(_base(source))
    return any(len(names) > 1 for kind, names in bases.items() if kind not in COPY_KINDS)


def _base(source: LogSource) -> str:
    """A log's name without a rotation's number or date or compression: its parts' one name."""
    match = _LOG_NAME.match(source.path.name)
    return match.group("base") if match else _uncompressed(source.path.name)


_COMPRESSED_END = re.compile(COMPRESSED + "$")


def _uncompressed(name: str) -> str:
    """``name`` without a compressed log's suffix (``.gz``, ``.xz``, ``.bz2``, ``.zst``)."""
    return _COMPRESSED_END.sub("", name)


def _by_log(sources: list[LogSource]) -> dict[str, list[LogSource]]:
    """``sources`` by the log each is a part of."""
    logs: dict[str, list[LogSource]] = {}
    for source in sources:
        logs.setdefault(_base(source), []).append(source)
    return logs


#: A training step's line, as a run's own log prints them (AReaL-lite, realhf, verl): its step.
_STEP_PRINTED = re.compile(rb"Train step (\d+)/|\(global step (\d+)\)|\bstep:(\d+) - ")


def _logs_of_runs_side_by_side(sources: list[LogSource]) -> bool:
    """Whether a folder's logs are several runs' downloaded side by side (``dl/runA_trainer.log
    dl/runB_trainer.log``), as the same logs given by name are: nothing but logs in one folder,
    two of one kind that are not parts of one log, each printing training steps of its own from
    the first. (A realhf run's ``model_worker-N`` logs print none: its master worker's does; a run
    restarted by hand into a new log begins that log at the step it resumed from: one run.)"""
    logs = [s for s in sources if s.kind not in COPY_KINDS]
    if any(s.kind not in _NAMED_COPIES for s in sources if s.kind in COPY_KINDS):
        return False
    if len({s.path.parent for s in logs}) != 1 or not _several_runs(logs):
        return False
    by_log = _by_log(logs)
    # (a verl console names its experiment: two names are two runs, one dead before its first step too)
    named = {first_fact(log[0].path, "experiment_name") for log in by_log.values() if log[0].kind == "verl_log"}
    if len(named - {None}) > 1:
        return True
    return all(any(_from_the_first_step(s.path) for s in log) for log in by_log.values())


#: Copies that name the experiment they are of (a W&B run's name, TensorBoard's folder: verl's
#: ``tensorboard_log/<project>/<experiment>/``): told to one of several runs side by side by it.
_NAMED_COPIES = ("wandb", "tensorboard")


def _copies_by_log(copies: list[LogSource], logs: dict[str, list[LogSource]]) -> tuple[dict[str, list[LogSource]], list[LogSource]]:
    """Copies of several runs' numbers kept in one folder (verl's working folder: one ``wandb/``
    for every experiment launched there), each given to the log its experiment's name is (a
    console ``<experiment>.log``); those naming none stay apart, runs of their own, never
    merged into a run they may not be of."""
    stems = {_log_stem(log[0].path): base for base, log in logs.items()}
    mine: dict[str, list[LogSource]] = {}
    strays: list[LogSource] = []
    for folder in _wandb_folders(copies):
        base = stems.get(getattr(wandb_run_head(folder), "name", None) or "")
        (mine.setdefault(base, []) if base else strays).append(LogSource(folder, "wandb"))
    for copy in (c for c in copies if c.kind != "wandb"):
        base = next((stems[part] for part in reversed(copy.path.parent.parts) if part in stems), None)
        (mine.setdefault(base, []) if base else strays).append(copy)
    return mine, strays


def _wandb_folders(copies: list[LogSource]) -> list[Path]:
    """The W&B run folders of ``copies`` (a ``wandb/`` folder's runs, oldest first, or one run's)."""
    return [folder for copy in copies if copy.kind == "wandb" for folder in find_wandb_runs(copy.path)]


#: A run's resume from a checkpoint, as AReaL's and verl's logs say it (see their formats' ``run_resumed``).
_RESUMED = re.compile(rb"Recovering from StepInfo\(|Load from checkpoint folder: |Resuming from \S*global_step_\d")


def _from_the_first_step(path: Path, most: int = 8 << 20) -> bool:
    """Whether ``path``'s head prints training steps from step 1 (verl's validation before
    training, ``step:0``, is none) and no resume from a checkpoint: a run of its own."""
    try:
        head = head_bytes(path, most)
    except OSError:
        return False
    steps = (int(next(g for g in found.groups() if g is not None)) for found in _STEP_PRINTED.finditer(head))
    return next((step for step in steps if step >= 1), None) == 1 and _RESUMED.search(head) is None


def _left_beside(given: list[Path]) -> list[str]:
    """The trainer and server logs beside logs given by name that were not given: not read, and
    said (a server log's OOM names a cause the trainer's log alone cannot)."""
    # (a given log's compressed twin, or the plain log of a given .gz, is a copy of it: read once, not left)
    named = {os.path.realpath(form) for f in given
             for form in (f, f.with_name(_uncompressed(f.name)), *(f.with_name(f.name + z) for z in COMPRESSIONS))}
    boards = any("tfevents" in f.name for f in given)  # (a TensorBoard file's restart writes another beside it)
    left = []
    for folder in dict.fromkeys(f.parent for f in given):
        try:
            beside = sorted(folder.iterdir())
        except OSError:
            continue
        left += [f"{path}: {LEFT_BESIDE} (give the folder to read the run's logs together)"
                 for path in beside if (_named_like_a_runs_log(path) or (boards and "tfevents" in path.name))
                 and os.path.realpath(path) not in named and path.is_file()]
    return left


def _real(source: LogSource) -> str:
    """The source's path resolved; a Ray session's own folder for its ``logs/`` (either may be given)."""
    path = source.path.parent if source.kind == "ray_session" and source.path.name == "logs" else source.path
    return os.path.realpath(path)


def _home_of(file: Path) -> Path:
    """The folder whose run a log given by name belongs to (verl's ``<project>/<experiment>.jsonl``
    is its working folder's, beside ``train.log``)."""
    folder = Path(os.path.abspath(file)).parent
    return folder.parent if file.name.endswith((".jsonl", ".jsonl.gz")) else folder


def _with_sessions_given_apart(runs: list[RunLocation], custom_format: CustomFormat | None) -> list[RunLocation]:
    """Ray sessions given beside one run (``analyze outputs/exp /tmp/ray/session_latest``, or
    ``/tmp/ray``: Ray keeps them in its own temp folder) are that run's, as sessions inside its
    folder would be. With no such run, each session is a run of its own, read as when given alone
    (``analyze /tmp/ray``: its TaskRunner's output holds the steps)."""
    apart = [run for run in runs if _sessions_only(run)]
    others = [run for run in runs if run not in apart]
    paired: _Paired = _steps_held(apart, others) if apart and others else ([], {})
    if len(others) == 1 and apart and not any(s.kind == "ray_session" for s in others[0].logs) and not _strangers(others[0], paired):
        run, sessions = others[0], [s for r in apart for s in r.logs if s.kind == "ray_session"]
        return [replace(run, logs=(*run.logs, *sessions), skipped=(*run.skipped, *(p for r in apart for p in r.skipped)))]
    if apart and others:
        runs = _sessions_by_console(runs, apart, others, paired)
    found = []
    for run in runs:
        if all(s.kind == "ray_session" for s in run.logs):  # (a folder of sessions, given)
            # (each once: a session_latest copied with links followed is a named one's copy)
            once = {os.path.realpath(p.parent if p.name == "logs" else p) for p in find_ray_sessions(run.root)}
            for session in (s.path for s in run.logs if s.path.name != "session_latest" or os.path.realpath(s.path) in once):
                found += _group(session, *_walk(session, custom_format))
        else:
            found.append(run)
    return found


#: Each session given apart (its run, the session, an early step line its TaskRunner printed), and
#: for each other run (by ``id``) the lines its consoles hold.
_Paired = tuple[list[tuple[RunLocation, LogSource, bytes | None]], dict[int, set[bytes]]]


def _steps_held(apart: list[RunLocation], others: list[RunLocation]) -> _Paired:
    """What pairs sessions given apart with runs: Ray forwards a worker's output to the driver's
    console as it was printed, so a run's console holds its TaskRunner's step lines."""
    sessions = [(run, s, _early_step_line(s.path)) for run in apart for s in run.logs if s.kind == "ray_session"]
    lines = {line for _, _, line in sessions if line}
    # (each console read once for every session's line)
    held = {id(run): set().union(*(_held(s.path, lines) for s in run.logs if s.kind in ("verl_log", "console_log")))
            for run in others if lines and not any(s.kind == "ray_session" for s in run.logs)}
    return sessions, held


def _strangers(run: RunLocation, paired: _Paired) -> bool:
    """Whether a session given beside ``run`` printed steps its console does not hold (another job's)."""
    sessions, held = paired
    consoles = any(s.kind in ("verl_log", "console_log") for s in run.logs)
    return consoles and any(line and line not in held.get(id(run), ()) for _, _, line in sessions)


def _sessions_by_console(runs: list[RunLocation], apart: list[RunLocation], others: list[RunLocation],
                         paired: _Paired) -> list[RunLocation]:
    """Sessions given apart from runs (``analyze outputs/* /tmp/r_*/session_latest``): each to the
    one run whose console holds its early step line; one no console, or several, hold stays apart."""
    sessions, held = paired
    given: dict[int, list[LogSource]] = {}
    for run, session, line in sessions:
        owners = [o for o in others if line in held.get(id(o), ())]
        if len(owners) == 1:
            given.setdefault(id(owners[0]), []).append(session)
            given.setdefault(id(run), [])
    out = []
    for run in runs:
        if run in apart and id(run) in given:
            left = [s for s in run.logs if s.kind == "ray_session" and not any(s is g for gs in given.values() for g in gs)]
            if left:
                out.append(replace(run, logs=tuple(left)))
        else:
            out.append(replace(run, logs=(*run.logs, *given[id(run)])) if given.get(id(run)) else run)
    return out


#: verl's step line, from its step on (Ray's ``(TaskRunner pid=…)`` prefix and colours before it).
_STEP_LINE = re.compile(rb"step:\d+ - [^\r\n\x1b]+")


def _early_step_line(session: Path, most: int = 4 << 20) -> bytes | None:
    """An early step line a worker of ``session`` printed (its TaskRunner's ``.out``): the third,
    or the last if fewer (validation before training, ``step:0``, is alike for runs of one model)."""
    logs = session if session.name == "logs" else session / "logs"
    try:
        outs = sorted(p for p in logs.iterdir() if p.name.startswith("worker-") and p.name.endswith(".out"))
    except OSError:
        return None
    for out in outs:
        try:
            with open_log(out) as fh:
                if lines := [m.group(0).rstrip() for _, m in zip(range(3), _STEP_LINE.finditer(fh.read(most)))]:
                    return lines[-1]
        except OSError:
            continue
    return None


def _held(path: Path, lines: set[bytes], most: int = 256 << 20) -> set[bytes]:
    """Which of ``lines`` the first ``most`` bytes of ``path`` (gzipped or not) hold."""
    found: set[bytes] = set()
    longest = max(map(len, lines), default=0)
    try:
        with open_log(path) as fh:
            seen, tail = 0, b""
            while seen < most and len(found) < len(lines) and (chunk := fh.read(8 << 20)):
                window = tail + chunk
                found |= {line for line in lines - found if line in window}
                seen, tail = seen + len(chunk), window[-longest:]
    except OSError:
        pass
    return found


def _sessions_only(run: RunLocation) -> bool:
    """Whether ``run`` is Ray sessions alone: their folders, and the files of one given as the path."""
    sessions = [str(s.path).rstrip(os.sep) + os.sep for s in run.logs if s.kind == "ray_session"]
    return bool(sessions) and all(s.kind == "ray_session" or str(s.path).startswith(tuple(sessions)) for s in run.logs)


def without_runs(paths: Iterable[PathArg], locations: Iterable[RunLocation]) -> list[Path]:
    """The given ``paths`` that none of ``locations`` was found under: a folder of a team's runs may
    hold nothing readable, and it must be said, not left out."""
    locations = list(locations)
    logs = [os.path.realpath(path) for location in locations for path in (*(s.path for s in location.logs), *location.twins)]
    # (a run's checkpoint folder or Ray session, or a folder in one, given beside the run: the run's)
    read = [os.path.realpath(p) for location in locations
            for p in (location.checkpoint_dir, *(s.path for s in location.logs if s.path.is_dir())) if p is not None]
    barren = []
    for path in as_paths(paths):
        root = os.path.realpath(path)
        folder = os.path.isdir(root)
        if not any(under(log, root, folder) for log in logs) and not any(
                under(root, place, True) or under(place, root, folder) for place in read):
            barren.append(path)
    return barren


def why_no_run(path: PathArg, custom_format: CustomFormat | None = None) -> str:
    """Why ``path`` (one of :func:`without_runs`) holds no run, as :func:`find_runs` alone would say
    it: what was looked for, and what was skipped there and why (a damaged log, a pipe)."""
    try:
        find_runs([path], custom_format=custom_format)
    except (NoRunsFound, PathNotFound) as exc:
        return str(exc)
    return f"{path}: no training run found"


def analyzed_tree(path: PathArg) -> Path:
    """The tree an analysis of ``path`` reads: a folder as given, a log file's folder (the run's:
    its checkpoints and config are read from there). Nothing is written into it."""
    path = Path(path)
    return path.parent if path.is_file() else path


def _walk(top: Path, custom_format: CustomFormat | None, links: list[str] | None = None) -> tuple[list[LogSource], list[str]]:
    """The sources under ``top``; links to folders are not followed (one to ``/`` or to a sibling
    run would take in what was not given), those leading out of it are added to ``links``."""
    files: list[Path] = []
    sources: list[LogSource] = []
    problems: list[str] = []

    def on_error(exc: OSError) -> None:
        problems.append(f"{exc.filename}: {exc.strerror or exc}")

    linked: list[str] = []
    for folder, dirs, names in walk(top, onerror=on_error, links=linked):
        if Path(folder).name == "wandb" and any(RUN_DIR.match(d) for d in dirs):
            sources.append(LogSource(Path(folder), "wandb"))
            dirs[:] = []
            continue
        if folder == str(top) and RUN_DIR.match(Path(os.path.realpath(folder)).name) and any(_WANDB_FILE.match(n) for n in names):
            # One W&B run's folder given (or wandb/latest-run, the link W&B's docs point at): that run.
            sources.append(LogSource(Path(folder), "wandb"))
            dirs[:] = []
            continue
        if _RAY_SESSION.match(Path(folder).name) or _holds_ray_logs(Path(folder), dirs):
            sources.append(LogSource(Path(folder), "ray_session"))
            dirs[:] = []
            if folder == str(top) and os.path.isdir(logs := os.path.join(folder, "logs")):
                # The session itself given: read its logs/ as when that is given (a TaskRunner's
                # output is verl's console, with the steps), not only as the run's Ray companion.
                files += [Path(logs, name) for name in sorted(_names(logs)) if _CONSOLE.match(name)]
            continue
        if folder == str(top) and any(name in names for name in _RAY_LOGS):
            # A session's own logs/ given (Ray's docs point there): the session, and its consoles
            # as when the session is given.
            sources.append(LogSource(Path(folder), "ray_session"))
            files += [Path(folder, name) for name in sorted(names) if _CONSOLE.match(name)]
            dirs[:] = []
            continue
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
        files += [Path(folder, name) for name in sorted(names)]
        # (a botched copy, ``cp -r`` of a folder named like the log: said, as a pipe in its place is)
        problems += [f"{Path(folder, d)}: a folder, not a log: read as any folder is" for d in dirs
                     if _named_like_a_runs_log(Path(d))]
    found, more = _classify(files, custom_format)
    if links is not None:
        inside = os.path.realpath(top)
        links += [link for link in linked if not under(os.path.realpath(link), inside, True)]
    kept, torn = _newest_trainer_state(sources + found)
    return kept, problems + more + torn


def _newest_trainer_state(sources: list[LogSource]) -> tuple[list[LogSource], list[str]]:
    """A Trainer's checkpoints each hold its whole log history to their save: the newest one's
    ``trainer_state.json`` is read, and only when nothing else of the run is there (a W&B or
    TensorBoard copy, a log) — it is what is left when those were not kept. A newer one cut
    short (the job killed, the disk full as it was written) is passed over, and said."""
    states = [s for s in sources if s.kind == "trl_state"]
    rest = [s for s in sources if s.kind != "trl_state"]
    if not states or rest:
        return rest, []
    def step(state: LogSource) -> int:  # (its ``checkpoint-N`` folder's N)
        return int(state.path.parent.name.split("-")[1])

    by_output: dict[Path, list[LogSource]] = {}
    for state in sorted(states, key=step, reverse=True):
        by_output.setdefault(state.path.parent.parent, []).append(state)
    kept, torn = [], []
    for newest_first in by_output.values():
        whole = next((s for s in newest_first if _ends_whole(s.path)), newest_first[0])
        kept.append(whole)
        torn += [f"{s.path}: cut off (no whole JSON document): {whole.path.parent.name}'s is read"
                 for s in newest_first[:newest_first.index(whole)]]
    return kept, torn


def _ends_whole(state: Path) -> bool:
    """Whether a ``trainer_state.json`` ends as the Trainer writes one (``json.dumps(indent=2)``: its
    object closed at the line's start; one written on one line closed at all), its last bytes read:
    one cut inside a nested object ends in an indented ``}``."""
    try:
        with open(state, "rb") as fh:
            fh.seek(max(fh.seek(0, os.SEEK_END) - 64, 0))
            tail = fh.read().rstrip()
    except OSError:
        return False
    return tail.endswith(b"\n}") or (b"\n" not in tail and tail.endswith(b"}"))


def _names(folder: str) -> list[str]:
    try:
        return [e.name for e in os.scandir(folder) if e.is_file()]
    except OSError:
        return []


#: Files only a Ray session's ``logs/`` holds: a session folder copied under another name is one still.
_RAY_LOGS = tuple(name + gz for name in ("raylet.out", "gcs_server.out", "event_RAYLET.log") for gz in ("", ".gz"))


#: A session's files that may be a verl console (its TaskRunner's stdout, a submitted job's driver):
#: read for their steps when the session is given; the rest are the Ray reader's.
_CONSOLE = re.compile(r"^(?:worker-.+\.out|job-driver-.+\.log)(?:\.\d+)?(?:\.gz)?$")


def _holds_ray_logs(folder: Path, dirs: list[str]) -> bool:
    return "logs" in dirs and _ray_logs_folder(folder / "logs")


def _ray_logs_folder(folder: Path) -> bool:
    """Whether ``folder`` is a Ray session's ``logs/`` (by the files only it holds)."""
    return any(os.path.isfile(folder / name) for name in _RAY_LOGS)


def _classify(files: list[Path], custom_format: CustomFormat | None, *, given: bool = False) -> tuple[list[LogSource], list[str]]:
    """The sources among ``files``. A file ``given`` by name is also read as a console log when it
    holds a failure (a driver's output saved or pasted); in a folder such files are left alone."""
    sources, problems, unknown = [], [], []
    for path in files:
        try:
            if not path.is_file():
                if _LOG_NAME.match(path.name) and (special := _special(path)):
                    problems.append(f"{path}: a {special}, not a file: not read (reading would take what a writer sends)")
                continue
            if path.stat().st_size == 0:
                if _named_like_a_runs_log(path, servers=False):  # (a quiet server may well log nothing)
                    problems.append(f"{path}: empty: nothing to read")
                continue
            kind = _kind(path, custom_format, given=given)
            if kind is None and given and _LOG_NAME.match(path.name) and looks_like_ray_console(path):
                kind = "console_log"
        except OSError as exc:
            problems.append(f"{path}: {exc.strerror or exc}")
            continue
        if kind is None:
            unknown.append(path)
            continue
        match = _LOG_NAME.match(path.name)
        sources.append(LogSource(path, kind, _rotation_order(match)))
    logs: dict[tuple[Path, str], set[str]] = {}  # (folder, log's base) -> the kinds its parts were read as
    for source in sources if unknown else ():
        if m := _LOG_NAME.match(source.path.name):
            logs.setdefault((source.path.parent, m.group("base")), set()).add(source.kind)
    for path in unknown:
        match = _LOG_NAME.match(path.name)
        if match and (part := _rotated_part_of(path, match, logs.get((path.parent, match.group("base")), set()))) is not None:
            sources.append(part)
        elif match and utf16(path):  # a Windows tool's copy: say how to read it
            problems.append(f"{path}: {UTF16_NOTE}")
        elif _named_like_a_runs_log(path):  # by its name a run's log: say why it is left out
            problems.append(f"{path}: named like a trainer or server log, but no format this tool reads (binary,"
                            " damaged or another tool's log): not read")
    return sources, problems


def _rotated_part_of(path: Path, match: re.Match[str], kinds: set[str]) -> LogSource | None:
    """A rotated part whose head no format knows (a rotation cut it inside a traceback) read as the
    parts beside it of the same log are (``kinds``), when it is text."""
    if len(kinds) != 1 or utf16(path):
        return None
    try:
        head = head_bytes(path, 4096)
    except (OSError, EOFError):
        return None
    if b"\0" in head:
        return None
    return LogSource(path, next(iter(kinds)), _rotation_order(match))


def _named_like_a_runs_log(path: Path, *, servers: bool = True) -> bool:
    match = _LOG_NAME.match(path.name)
    return bool(match) and match.group("base") in (_TRAINER_LOGS | _SERVER_LOGS if servers else _TRAINER_LOGS)


UTF16_NOTE = "not read: the file is UTF-16 text (convert it with iconv -f UTF-16 -t UTF-8)"


def utf16(path: Path) -> bool:
    """Whether ``path`` is UTF-16 text (a Windows tool's copy, PowerShell's ``>``): the readers read
    UTF-8 bytes, and every other byte of it is a NUL."""
    try:
        head = head_bytes(path, 4096)  # (past a ``copytruncate`` hole of zeros: no sign of UTF-16)
    except (OSError, EOFError):
        return False
    return head[:2] in (b"\xff\xfe", b"\xfe\xff") or (len(head) >= 64 and head.count(0) > len(head) // 3)


def _rotation_order(match: re.Match[str] | None) -> int:
    """Rotated copies before the live log, oldest first: ``.2`` before ``.1``; dated ones by date;
    ``.old`` (the copy a relaunch moved aside) as ``.1``."""
    if match is None:
        return 0
    if dated := match.group("date") or match.group("timed"):
        return int(re.sub(r"\D", "", dated)[:14].ljust(14, "0")) - 10**15
    return -1 if match.group("old") else -int(match.group("rot") or 0)


def _special(path: Path) -> str | None:
    """What ``path`` is when it is a pipe, socket or device rather than a file or folder."""
    mode = path.stat().st_mode
    for test, name in ((stat.S_ISFIFO, "named pipe"), (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "device"), (stat.S_ISBLK, "device")):
        if test(mode):
            return name
    return None


#: Text-log sniffers, most specific first: the first that recognises a file names its kind.
_SNIFFERS: tuple[tuple[str, Callable[[Path], bool]], ...] = (
    ("areal", looks_like_areal),
    ("verl_log", looks_like_verl_log),
    ("custom_log", looks_like_custom_loop),
    ("sglang_server", looks_like_sglang),
)


def _kind(path: Path, custom_format: CustomFormat | None = None, *, given: bool = False) -> str | None:
    """What a file is, from its name and head; ``None`` for files this tool does not read. A log
    ``given`` by name under a name of its own (``trainer.log.bak``) is judged by its head."""
    if "tfevents" in path.name:
        return "tensorboard"
    if _WANDB_FILE.match(path.name) and RUN_DIR.match(path.parent.name):
        return "wandb"
    if path.name == "trainer_state.json" and re.fullmatch(r"checkpoint-\d+", path.parent.name):
        return "trl_state"
    if path.name.endswith((".jsonl", ".jsonl.gz")):
        return "verl_jsonl" if looks_like_verl_log(path) else None
    match = _LOG_NAME.match(path.name)
    if not match and not (given and _LOGGISH.search(path.name)):
        return None
    if custom_format is not None and custom_format.matches(path):
        return "custom_log"
    base = match.group("base") if match else path.name
    if base in _SERVER_LOGS:
        return "areal_server"
    for kind, sniff in _SNIFFERS:
        if sniff(path):
            if kind == "areal":
                # (merged.log holds every role's stream: the rollout worker's SGLang server's own lines too)
                return "areal_trainer" if base in _TRAINER_LOGS and base != "merged.log" else "areal_log"
            return kind
    return None


def _group(given: Path, sources: list[LogSource], problems: list[str]) -> list[RunLocation]:
    sources, problems = _without_hparams_records(sources, problems)
    by_root: dict[Path, list[LogSource]] = {}
    for source in sources:
        if source.kind not in COPY_KINDS:
            by_root.setdefault(source.path.parent, []).append(source)
    # A server's log copied into a folder of its own below a run's (``trial0/node2/llm_server.log``)
    # is that run's: the server served it.
    for root in sorted(by_root, key=lambda r: -len(r.parts)):
        if all(s.kind in _SERVERS for s in by_root[root]):
            above = next((r for r in sorted(by_root, key=lambda r: -len(r.parts))
                          if r in root.parents and any(s.kind not in _SERVERS for s in by_root[r])), None)
            if above is not None:
                by_root[above].extend(by_root.pop(root))
    roots = sorted(by_root)
    boards = {s.path.parent for s in sources if s.kind == "tensorboard"}
    for source in sources:
        if source.kind in COPY_KINDS:
            # ``wandb/`` sits in the run's log folder; event files anywhere below it; a Trainer's
            # state in its output_dir's checkpoint-N/.
            home = source.path.parent.parent if source.kind == "trl_state" else source.path.parent
            if source.kind == "tensorboard":  # (add_scalars writes ``<logdir>/<tag>/<name>/``: the logdir's)
                home = next((folder for folder in reversed(home.parents) if folder in boards), home)
            # (a session given as the path: its own logs/, read as given, is the run)
            owner = next((r for r in reversed(roots) if r in (home, source.path) or r in home.parents or source.path in r.parents), home)
            by_root.setdefault(owner, []).append(source)
    runs = []
    owners = {problem: _owner(Path(problem.split(": ")[0]), list(by_root)) for problem in problems}
    for root, members in sorted(by_root.items()):
        members = _drop_superseded(members)
        skipped = tuple(p for p in problems if owners[p] in (None, root))  # (one in no run's folder: any run's)
        copies_only = all(s.kind in COPY_KINDS for s in members)
        for trial, of_trial in (_sweep_trials(members) if copies_only else {}).items() or [(None, members)]:
            if copies_only:
                of_trial = of_trial + _captured_consoles(of_trial)
            location = _location(given, root, of_trial, skipped)
            runs.append(replace(location, run_id=f"{location.run_id}/{trial}") if trial else location)
    return _verl_jsonl_per_experiment(_tensorboard_per_folder(_tensorboard_per_experiment(runs)))


def _location(given: Path, root: Path, members: list[LogSource], skipped: tuple[str, ...]) -> RunLocation:
    plain = {s.path for s in members}
    pairs = [(s.path, s.path.with_suffix("")) for s in members if s.path.suffix in COMPRESSIONS and s.path.with_suffix("") in plain]
    twins: tuple[Path, ...] = ()
    for packed, log in pairs:
        if not _same_head(packed, log):  # (no copy: the log gzipped away and begun anew, its earlier part)
            members = [replace(s, order=min(s.order, -1)) if s.path == packed else s for s in members]
            continue
        # (of a log and its compressed copy, the one read is the one holding more: the copy, where it does)
        twins += (packed if not _holds_more(packed, log) else log,)
    members = [s for s in members if s.path not in twins]
    return RunLocation(
        run_id=_run_id(given, root),
        framework=_framework(members),
        root=root,
        logs=tuple(sorted(members, key=_log_order)),
        checkpoint_dir=_checkpoint_dir(root) or _verl_checkpoint_dir(root, members) or _trl_checkpoint_dir(root, given),
        skipped=skipped,
        twins=twins,
    )


def _same_head(packed: Path, log: Path, n_bytes: int = 64 << 10) -> bool:
    """Whether the compressed ``packed`` begins as the plain ``log`` beside it does (a copy of it,
    whole or in part), not with later lines (the log's earlier part, gzipped away)."""
    try:
        with open(log, "rb") as fh:
            mine = fh.read(n_bytes)
        theirs = head_bytes(packed, len(mine))
    except OSError:
        return True
    return theirs == mine or not mine


def _holds_more(packed: Path, log: Path) -> bool:
    """Whether the gzipped ``packed`` holds more text than the plain ``log`` beside it (the whole log
    gzipped, a new one begun), told by gzip's trailer, which gives its last member's size modulo
    4 GiB (the rest is not decompressed to tell): other compressions, and equal heads' doubt, read the log."""
    try:
        size = log.stat().st_size
        with open(packed, "rb") as fh:
            if fh.read(2) != b"\x1f\x8b" or size >= 1 << 32:
                return False
            fh.seek(-4, os.SEEK_END)
            return int.from_bytes(fh.read(4), "little") > size
    except OSError:
        return False


def _sweep_trials(copies: list[LogSource]) -> dict[str, list[LogSource]]:
    """The trials of a W&B sweep kept in one ``wandb/`` folder (``wandb agent``), each a run of its
    own by its name, not relaunches of one run: their records name the sweep. Empty for anything
    else (a run relaunched under new ids is one run, its attempts in order)."""
    folders = _wandb_folders(copies)
    heads = [wandb_run_head(folder) for folder in folders]
    if len(folders) < 2 or not any(head and head.sweep_id for head in heads):
        return {}
    trials: dict[str, list[LogSource]] = {}
    for folder, head in zip(folders, heads, strict=True):
        trials.setdefault((head and head.name) or folder.name, []).append(LogSource(folder, "wandb"))
    rest = [copy for copy in copies if copy.kind != "wandb"]  # (another copy beside them is none of theirs)
    return trials | ({"other copies": rest} if rest else {})


def _captured_consoles(copies: list[LogSource]) -> list[LogSource]:
    """The consoles W&B captured beside its runs (``files/output.log``, oldest run first), read as
    a run's text log where it has no other: the steps a loop printed and its failures (an NCCL
    watchdog's line), which no ``.wandb`` record is decoded for."""
    found = []
    for folder in _wandb_folders(copies):
        console = folder / "files" / "output.log"
        try:
            if not console.is_file() or not console.stat().st_size:
                continue
            kind = _kind(console, given=True) or ("console_log" if looks_like_ray_console(console) else None)
        except OSError:
            continue
        if kind is not None and kind not in COPY_KINDS:
            found.append(LogSource(console, kind))
    return [replace(source, order=i - len(found)) for i, source in enumerate(found)]


def _log_order(source: LogSource) -> tuple:
    """A run's logs in order: text logs before copies, by name, a log's rotated parts oldest first."""
    return source.kind in COPY_KINDS, source.path.name.split(".")[0], source.order, str(source.path)


def _verl_jsonl_per_experiment(runs: list[RunLocation]) -> list[RunLocation]:
    """verl's file logger writes ``<project>/<experiment>.jsonl``: experiments of one project share
    its folder. Found with nothing else, each is a run of its own (``project/experiment``), not one
    series of two runs' values."""
    out = []
    for run in runs:
        jsonls = [s for s in run.logs if s.kind == "verl_jsonl"]
        if len(jsonls) < 2 or len(jsonls) != len(run.logs):
            out.append(run)
            continue
        for jsonl in jsonls:
            experiment = jsonl.path.name.removesuffix(".gz").removesuffix(".jsonl")
            out.append(replace(run, run_id=shown_name(f"{jsonl.path.parent.name}/{experiment}"), logs=(jsonl,),
                               checkpoint_dir=_verl_checkpoint_dir(run.root, [jsonl])))
    return out


def _owner(path: Path, roots: list[Path]) -> Path | None:
    """The run folder ``path`` is in (the deepest holding it), if any."""
    holding = [r for r in roots if r == path or r in path.parents]
    return max(holding, key=lambda r: len(r.parts)) if holding else None


def _without_hparams_records(sources: list[LogSource], problems: list[str]) -> tuple[list[LogSource], list[str]]:
    """``add_hparams`` (a Hugging Face Trainer calls it as training starts) writes an event file of
    hyperparameters in ``<logdir>/<time.time()>/``: not a run of its own (an empty one, or its
    one-off values taken for the run's series), and not read; said."""
    boards = {s.path.parent for s in sources if s.kind == "tensorboard"}
    records = [s for s in sources if s.kind == "tensorboard" and HPARAMS_FOLDER.match(s.path.parent.name) and s.path.parent.parent in boards]
    if not records:
        return sources, problems
    said = [f"{s.path}: TensorBoard's hyperparameter record of {s.path.parent.parent.name} (add_hparams), not its numbers: not read"
            for s in records]
    return [s for s in sources if s not in records], [*problems, *said]


#: verl's config as it prints it at launch, and the command line's override: the experiment's name.
_EXPERIMENT = re.compile(rb"""'experiment_name': '([^']+)'|trainer\.experiment_name=(\S+)""")


def _tensorboard_per_experiment(runs: list[RunLocation]) -> list[RunLocation]:
    """verl's TensorBoard logger writes ``tensorboard_log/<project>/<experiment>/``: a run's console
    beside several experiments' folders keeps the one its config names; the others are runs of
    their own (another experiment's later, longer series is no copy of this one's)."""
    out = []
    for run in runs:
        by_experiment: dict[str, list[LogSource]] = {}
        for source in (s for s in run.logs if s.kind == "tensorboard"):
            parts = source.path.parts
            at = parts.index("tensorboard_log") if "tensorboard_log" in parts else -1
            if 0 <= at < len(parts) - 3:
                by_experiment.setdefault(parts[at + 2], []).append(source)
        consoles = [s.path for s in run.logs if s.kind == "verl_log"]
        if len(by_experiment) < 2 or not consoles:
            out.append(run)
            continue
        named = _experiment_named(consoles[0])
        others = {exp: files for exp, files in by_experiment.items() if exp != named}
        moved = {s.path for files in others.values() for s in files}
        out.append(replace(run, logs=tuple(s for s in run.logs if s.path not in moved)))
        out += [replace(run, run_id=f"{run.run_id}/{exp}", framework="unknown", logs=tuple(files), checkpoint_dir=None,
                        skipped=(), twins=()) for exp, files in others.items()]
    return out


def _experiment_named(console: Path, most: int = 4 << 20) -> str | None:
    """The experiment a verl console's config names (``trainer.experiment_name``), from its head."""
    try:
        found = _EXPERIMENT.search(head_bytes(console, most))
    except (OSError, EOFError):
        return None
    return (found[1] or found[2]).decode(errors="replace") if found else None


def _tensorboard_per_folder(runs: list[RunLocation]) -> list[RunLocation]:
    """One TensorBoard source per run: the folder holding all of its event files."""
    out = []
    for run in runs:
        events = [s for s in run.logs if s.kind == "tensorboard"]
        if len(events) > 1:
            common = Path(os.path.commonpath([str(s.path.parent) for s in events]))
            rest = tuple(s for s in run.logs if s.kind != "tensorboard")
            run = replace(run, logs=(*rest, LogSource(common, "tensorboard")))
        out.append(run)
    return out


def _framework(members: list[LogSource]) -> str:
    kinds = {s.kind for s in members}
    if kinds & {"areal_trainer", "areal_log", "areal_server"}:
        return "areal"
    if "verl_log" in kinds or "verl_jsonl" in kinds:
        return "verl"
    if "custom_log" in kinds:
        return "custom"
    return "unknown"


def _drop_superseded(sources: list[LogSource]) -> list[LogSource]:
    """``merged.log`` already holds ``main.log`` and every role log: read it alone."""
    if not any(s.path.name.startswith("merged.log") for s in sources):
        return sources
    return [s for s in sources if s.kind in COPY_KINDS or s.path.name.startswith(("merged.log", "llm_server.log"))]


def _run_id(given: Path, root: Path) -> str:
    full = Path(os.path.abspath(root))
    if full.name == "logs" and _ray_logs_folder(full):
        # (a Ray session's logs/: the run is the session's, ``session_latest`` by its real name)
        session, at = full.parent, Path(os.path.abspath(given))
        if session == at or session in at.parents:
            return shown_name(session.resolve().name)
        root = root.parent
    parts = root.parts
    if len(parts) >= 4 and parts[-4] == "logs":
        return shown_name(f"{parts[-2]}/{parts[-1]}")
    try:
        rel = root.relative_to(given)
    except ValueError:
        rel = Path(root.name)
    return shown_name(str(rel) if str(rel) != "." else root.resolve().name)


def shown_name(name: str) -> str:
    """``name`` as text: a byte that is not UTF-8 in a file name (``tri\\xe9l0``, a Latin-1 tool's)
    written as its escape, not carried as a lone surrogate that no table or writer takes."""
    return os.fsencode(name).decode("utf-8", "backslashreplace")


def not_utf8(location: RunLocation) -> Path | None:
    """The first of ``location``'s paths whose name is not UTF-8, if any."""
    for path in (location.root, *(s.path for s in location.logs), location.checkpoint_dir):
        if path is not None and shown_name(str(path)) != str(path):
            return path
    return None


def _verl_checkpoint_dir(root: Path, members: list[LogSource]) -> Path | None:
    """verl saves ``global_step_N/`` under ``trainer.default_local_dir`` (``checkpoints/<project>/<exp>``).
    A run known only from a W&B or TensorBoard copy may be verl's too: its folder's one such
    checkpoint folder, when there is exactly one (several would be a guess)."""
    copies_only = bool(members) and all(s.kind in ("wandb", "tensorboard") for s in members)
    if not copies_only and not any(s.kind in ("verl_log", "verl_jsonl") for s in members):
        return None
    found = find_verl_checkpoint_roots(root)
    if copies_only:
        # verl's TensorBoard logger writes <cwd>/tensorboard_log/<project>/<experiment>, its
        # checkpoints <cwd>/checkpoints/<project>/<experiment>: beside, not under it.
        for events in (s.path for s in members if s.kind == "tensorboard" and not found):
            folder = events if events.is_dir() else events.parent
            if folder.parent.parent.name == "tensorboard_log":
                beside = folder.parent.parent.parent / "checkpoints" / folder.parent.name / folder.name
                found = find_verl_checkpoint_roots(beside) if beside.is_dir() else []
        return found[0] if len(found) == 1 else None
    # The file logger writes <cwd>/<project>/<experiment>.jsonl, the checkpoints go to
    # <cwd>/checkpoints/<project>/<experiment>: beside the JSONL's folder, not under it.
    for jsonl in (s.path for s in members if s.kind == "verl_jsonl" and not found):
        beside = jsonl.parent.parent / "checkpoints" / jsonl.parent.name / jsonl.name.removesuffix(".gz").removesuffix(".jsonl")
        found = find_verl_checkpoint_roots(beside) if beside.is_dir() else []
    # Under ``ray job submit --working-dir``, a relative ``default_local_dir`` is in Ray's copy of
    # the working folder, inside the session: runtime_resources/working_dir_files/_ray_pkg_*/.
    for session in (s.path.parent if s.path.name == "logs" else s.path for s in members if s.kind == "ray_session" and not found):
        for copy in _subfolders(session / "runtime_resources" / "working_dir_files"):
            found = found or find_verl_checkpoint_roots(copy)
    if len(found) > 1:
        # Experiments side by side (one working folder, a console each): the one named as the log
        # is; else none here — the log's own save lines name it (another experiment's is no guess).
        named = [f for f in found if any(_log_stem(s.path) == f.name for s in members)]
        return named[0] if len(named) == 1 else None
    return found[0] if found else None


def _log_stem(path: Path) -> str:
    """``qwen2_7b_lr_fix`` of ``qwen2_7b_lr_fix.log.1.gz``."""
    return re.sub(r"(?:\.log)?(?:\.\d+)?" + COMPRESSED + "?$", "", path.name)


def _trl_checkpoint_dir(root: Path, given: Path) -> Path | None:
    """A Hugging Face Trainer's ``output_dir`` (``checkpoint-N/`` folders): the run's folder, or one
    above it within the path given (its TensorBoard files go to ``output_dir/runs/…``), or the one
    such folder just below it (W&B writes ``wandb/`` in the working folder, ``output_dir`` beside it)."""
    top = given.resolve() if given.is_dir() else given.resolve().parent
    for folder in (root, *root.parents):
        if is_trl_checkpoint_root(folder):
            return folder
        if folder.resolve() == top or top not in folder.resolve().parents:
            break
    below = [folder for folder in _subfolders(root) if folder.name not in _SKIP_DIRS and is_trl_checkpoint_root(folder)]
    return below[0] if len(below) == 1 else None


def _subfolders(folder: Path) -> list[Path]:
    try:
        return sorted(Path(e.path) for e in os.scandir(folder) if e.is_dir(follow_symlinks=False))
    except OSError:
        return []


def _checkpoint_dir(root: Path) -> Path | None:
    """AReaL pairs ``<fileroot>/logs/<user>/<exp>/<trial>`` with ``checkpoints/<user>/<exp>/<trial>``:
    by the path as given, or made absolute when it is too short to tell (``.``, ``../trial0``). A
    folder that cannot be searched is still the run's (its checkpoints are said unreadable)."""
    for form in (root, Path(os.path.abspath(root))):
        parts = form.parts
        if len(parts) >= 4 and parts[-4] == "logs":
            candidate = Path(*parts[:-4], "checkpoints", *parts[-3:])
            # (a link on the way to nothing, storage not mounted, is the run's too: said unlistable)
            return candidate if _is_dir_or_hidden(candidate) or dangling_link(candidate, within=3) else None
    return None


def _is_dir_or_hidden(path: Path) -> bool:
    """A folder, or a path whose folder above cannot be searched (``is_dir`` raises on EACCES)."""
    try:
        return path.is_dir()
    except PermissionError:
        return True
    except OSError:
        return False
