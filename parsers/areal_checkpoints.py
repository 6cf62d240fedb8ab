"""The checkpoints an AReaL (or legacy realhf) trial left on disk, and whether each is usable.

Layouts (``shared/formats/areal.md`` §3), under ``<fileroot>/checkpoints/<user>/<exp>/<trial>``:

* AReaL-lite (v0.3-lite … HEAD): ``<role>/epoch{E}epochstep{S}globalstep{G}/`` are HF exports with
  0-based counters, so their log step is ``G + 1``. ``<role>/recover_checkpoint/`` is the recover
  checkpoint (DCP since v0.4, HF weights + optimizer shards before), overwritten at every save; its
  step is the 0-based ``global_step`` of ``recover_info/step_info.json``, plus one.
* realhf (≤ v0.3): the same folder names counted from 1 (log step ``G`` as printed). A
  recover-only save is ``<role>/recover_checkpoint/`` plus a step-named symlink to it, and the
  run's recover info is ``<fileroot>/recover/<user>/<exp>/<trial>/recover_info.pkl``.

Everything is judged from names, sizes and file headers: no weights are loaded, nothing is
unpickled, nothing is written, and unreadable or junk files become ``problems``, never exceptions.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import NamedTuple

import polars as pl

from parsers._checkpoint_files import (
    check_file,
    check_hf_model,
    check_torch_file,
    entries,
    is_dir,
    mtime,
    ranges,
    read_json,
    unlisted,
    why,
)
from parsers.schema import CHECKPOINT_SCHEMA, REWRITTEN

__all__ = ["read_areal_checkpoints"]


_STEP_FOLDER = re.compile(r"epoch(\d{1,15})epochstep(\d{1,15})globalstep(\d{1,15})")  # more digits: not a step
_OPTIMIZER_SHARD = re.compile(r"optim_world_size_(\d+)_rank_(\d+)\.pt")
#: How long after its ``.metadata`` a shard may be dated (file systems' clocks, a slow rank's write).
_TORN_AFTER = timedelta(seconds=60)
#: A DCP shard: ``__<rank>_<n>.distcp``.
_DCP_SHARD = re.compile(r"__(\d+)_\d+\.distcp")

_Check = Callable[[dict[str, Path]], list[str]]


class _Checkpoint(NamedTuple):
    path: str
    step: int | None
    kind: str
    role: str
    complete: bool
    resumable: bool
    time: datetime | None
    problems: list[str]


def read_areal_checkpoints(trial_dir: Path) -> pl.DataFrame:
    """One row per checkpoint folder of an AReaL or realhf trial, sorted by step then path.

    Args:
        trial_dir: ``<fileroot>/checkpoints/<user>/<exp>/<trial>``.

    Returns:
        Columns ``path, step, kind, role, complete, resumable, time, problems``; ``step`` is in log
        units (``…globalstep899`` of AReaL-lite is step 900). Empty when nothing is found, also
        when ``trial_dir`` does not exist.
    """
    trial_dir = Path(trial_dir)
    folders = [folder for folder in entries(trial_dir) if folder.name != "recover_info" and is_dir(folder)]
    roles = {folder.name: entries(folder) for folder in folders}
    rows_of = _realhf_rows if _is_realhf(trial_dir, roles) else _areal_rows
    rows = [row for role, entries in roles.items() for row in rows_of(trial_dir, role, entries)]
    # A folder that could not be looked into: a row with no step, that says so.
    rows += [_row(f, None, "hf_export", f.name if f != trial_dir else "", [problem], False)
             for f in (trial_dir, *folders) if (problem := unlisted(f))]
    frame = pl.DataFrame(rows, schema=CHECKPOINT_SCHEMA, orient="row")
    return frame.sort("step", "path", nulls_last=True)


def _areal_rows(trial_dir: Path, role: str, entries: list[Path]) -> list[_Checkpoint]:
    rows: list[_Checkpoint] = []
    for entry in entries:
        if match := _STEP_FOLDER.fullmatch(entry.name):
            problems = _inspect(entry, check_hf_model)
            rows.append(_row(entry, int(match[3]) + 1, "hf_export", role, problems, False))
        elif entry.name == "recover_checkpoint":
            problems = _inspect(entry, _check_recover)
            step, info_problems = _recover_step(trial_dir)
            resumable = step is not None
            rows.append(_row(entry, step, "recover", role, problems, resumable, info_problems))
    return rows


def _realhf_rows(trial_dir: Path, role: str, entries: list[Path]) -> list[_Checkpoint]:
    rows: list[_Checkpoint] = []
    linked = False
    for entry in entries:
        if not (match := _STEP_FOLDER.fullmatch(entry.name)):
            continue
        step = int(match[3])
        if _links_to_recover_checkpoint(entry):
            linked = True
            # The link target is absolute, so in a copied tree it points elsewhere; the sibling
            # recover_checkpoint is the folder the link meant.
            problems = _inspect(entry.parent / "recover_checkpoint", check_hf_model)
            info_problem = _realhf_recover_info_problem(trial_dir)
            info_problems = [info_problem] if info_problem else []
            resumable = not info_problems
            rows.append(_row(entry, step, "recover", role, problems, resumable, info_problems))
        else:
            problems = _inspect(entry, check_hf_model)
            rows.append(_row(entry, step, "hf_export", role, problems, False))
    recover = [entry for entry in entries if entry.name == "recover_checkpoint"]
    if recover and not linked:
        problems = _inspect(recover[0], check_hf_model)
        unknown = "step unknown: no step-named link points here, and recover_info.pkl is not read"
        rows.append(_row(recover[0], None, "recover", role, problems, False, [unknown]))
    return rows


def _row(
    folder: Path,
    step: int | None,
    kind: str,
    role: str,
    problems: list[str],
    resumable_if_complete: bool,
    notes: list[str] | None = None,
) -> _Checkpoint:
    """A row; ``problems`` decide completeness, ``notes`` (recover info) only resumability."""
    complete = not problems
    return _Checkpoint(
        str(folder),
        step,
        kind,
        role,
        complete,
        complete and resumable_if_complete,
        mtime(folder),
        problems + (notes or []),
    )


def _is_realhf(trial_dir: Path, roles: dict[str, list[Path]]) -> bool:
    """Whether folder names count from 1 (realhf ≤ v0.3) rather than from 0 (AReaL-lite)."""
    counters = [
        (int(m[1]), int(m[2]), int(m[3]))
        for entries in roles.values()
        for entry in entries
        if (m := _STEP_FOLDER.fullmatch(entry.name))
    ]
    if any(epoch == 0 or epoch_step == 0 for epoch, epoch_step, _ in counters):
        return False
    # In AReaL-lite epoch1 starts after a whole epoch, so globalstep > epochstep there.
    if any(epoch == 1 and epoch_step == global_step for epoch, epoch_step, global_step in counters):
        return True
    if is_dir(trial_dir / "recover_info"):
        return False
    info = _realhf_recover_info(trial_dir)
    return "actor" in roles or (info is not None and os.path.lexists(info))


def _realhf_recover_info(trial_dir: Path) -> Path | None:
    trial_dir = trial_dir.absolute()
    if len(trial_dir.parents) < 4:
        return None
    return trial_dir.parents[3].joinpath("recover", *trial_dir.parts[-3:], "recover_info.pkl")


def _realhf_recover_info_problem(trial_dir: Path) -> str | None:
    path = _realhf_recover_info(trial_dir)
    if path is None:
        return "recover_info.pkl cannot be located: trial_dir is not <fileroot>/checkpoints/…"
    if not os.path.lexists(path):
        return f"recover_info.pkl missing ({path}), so realhf cannot resume"
    return check_file(path)


#: A step past any run's, where a file records one (a damaged file).
_MAX_STEP = 10**12


def _recover_step(trial_dir: Path) -> tuple[int | None, list[str]]:
    """Log step of the AReaL-lite recover checkpoint: step_info.json's 0-based global_step + 1."""
    path = trial_dir / "recover_info" / "step_info.json"
    if not os.path.lexists(path):
        return None, ["recover_info/step_info.json missing"]
    data, problem = read_json(path)
    if problem:
        return None, [problem]
    global_step = data.get("global_step") if isinstance(data, dict) else None
    if not isinstance(global_step, int) or isinstance(global_step, bool):
        return None, ["step_info.json has no integer global_step"]
    if global_step < 0:
        return None, [f"step_info.json records no finished step (global_step {global_step})"]
    if global_step >= _MAX_STEP:  # (a damaged file: no run takes that many steps, and a frame's integers end)
        return None, [f"step_info.json records an impossible global_step ({str(global_step)[:40]})"]
    return global_step + 1, []


def _inspect(folder: Path, check: _Check) -> list[str]:
    """The problems of one checkpoint folder; an unlistable folder is a problem, not an error."""
    try:
        names = {entry.name: Path(entry.path) for entry in os.scandir(folder)}
    except OSError as error:
        return [f"{folder.name} cannot be listed: {why(error)}"]
    return check(names) if names else ["folder is empty"]


def _check_recover(names: dict[str, Path]) -> list[str]:
    """DCP (``.metadata`` + ``*.distcp``), or the older HF weights + ``optim_world_size_*``."""
    if ".metadata" in names or any(name.endswith(".distcp") for name in names):
        return _check_dcp(names)
    optimizer = [path for name, path in names.items() if _OPTIMIZER_SHARD.fullmatch(name)]
    problems = check_hf_model(names) + [p for p in map(check_torch_file, sorted(optimizer)) if p]
    if not optimizer:
        problems.append(
            "no optimizer state (.metadata + *.distcp, or optim_world_size_*_rank_*.pt)"
        )
    # (each rank writes its own shard, the world size in its name: one missing cannot be resumed from)
    worlds: dict[int, set[int]] = {}
    for path in optimizer:
        world, rank = map(int, _OPTIMIZER_SHARD.fullmatch(path.name).groups())  # type: ignore[union-attr]
        worlds.setdefault(world, set()).add(rank)
    problems += [f"optimizer shards missing for ranks {ranges(sorted(set(range(world)) - ranks))} of {world}"
                 for world, ranks in sorted(worlds.items()) if set(range(world)) - ranks]
    return problems


#: A DCP .metadata is a pickle whose storage entries name their shard files (``relative_path``);
#: read as bytes, never unpickled. One larger than this is not searched.
_METADATA_READ = 256 * 2**20
_SHARD_NAMED = re.compile(rb"__\d+_\d+\.distcp")


def _shards_named(metadata: Path) -> set[str]:
    """The shard files a DCP ``.metadata`` names (none where it cannot be read, or names none)."""
    try:
        with metadata.open("rb") as file:
            data = file.read(_METADATA_READ + 1)
    except OSError:
        return set()
    return set() if len(data) > _METADATA_READ else {name.decode() for name in _SHARD_NAMED.findall(data)}


def _check_dcp(names: dict[str, Path]) -> list[str]:
    # DCP writes .metadata last, after every rank's shards: without it the save did not finish.
    problems: list[str] = []
    if ".metadata" not in names:
        problems.append(".metadata missing: the DCP save did not finish")
    elif problem := check_file(names[".metadata"]):
        problems.append(problem)
    shards = sorted(path for name, path in names.items() if name.endswith(".distcp"))
    if not shards:
        problems.append("no *.distcp shard files")
    # (every rank writes its own ``__<rank>_0.distcp``: a gap in their numbers is a rank's lost shard;
    # the .metadata, written last, names every shard file, the last ranks' too)
    ranks = {int(m[1]) for path in shards if (m := _DCP_SHARD.fullmatch(path.name))}
    named = _shards_named(names[".metadata"]) if ".metadata" in names else set()
    if lost := sorted(named - {path.name for path in shards}):
        problems.append(f"{len(lost)} of the {len(named)} shard files its .metadata names missing ({', '.join(lost[:4])}"
                        f"{', …' if len(lost) > 4 else ''}): a rank's save did not arrive")
    elif ranks and (gaps := set(range(max(ranks) + 1)) - ranks):
        problems.append(f"shards missing for ranks {ranges(sorted(gaps))} of at least {max(ranks) + 1}")
    # (recover_checkpoint is overwritten in place: a save the process died in leaves new shards
    # beside the earlier save's .metadata, which is written last)
    written = mtime(names[".metadata"]) if ".metadata" in names else None
    later = [(path, when) for path in shards if written and (when := mtime(path)) and when - written > _TORN_AFTER]
    if later:
        path, when = max(later, key=lambda pair: pair[1])
        problems.append(f"{path.name} {REWRITTEN} by {(when - written).total_seconds() / 60:.0f} min: a later save, "
                        "cut short, overwrote part of it (its shards are of two saves)")
    return problems + [p for p in map(check_file, shards) if p]



def _links_to_recover_checkpoint(entry: Path) -> bool:
    try:
        return entry.is_symlink() and Path(os.readlink(entry)).name == "recover_checkpoint"
    except OSError:
        return False
