"""The checkpoints a verl run left on disk, whether each is complete, and how to resume from one.

Layout (``shared/formats/ray_verl.md`` §5.6; verl ``ray_trainer._save_checkpoint``,
``fsdp_checkpoint_manager.py``, ``megatron_checkpoint_manager.py``), under
``trainer.default_local_dir`` (default ``checkpoints/<project>/<experiment>``)::

    latest_checkpointed_iteration.txt      the step of the last finished save (not with async_save)
    global_step_<N>/                       state after logged step N (verl counts steps from 1)
        data.pt                            dataloader state
        actor/  (critic/ when a critic is trained)
            model_world_size_<W>_rank_<R>.pt, optim_…, extra_state_…   FSDP: one of each per rank
            fsdp_config.json               {"FSDP_version", "world_size"}, written after the shards
            huggingface/                   config + tokenizer (+ weights with contents=hf_model)
            dist_ckpt/, transformer_config.json                     Megatron instead

Judged from names, sizes and JSON headers only: nothing is unpickled, nothing is written, and
unreadable or junk files become ``problems``, never exceptions. A checkpoint is ``resumable``
when it is complete and holds optimizer and extra (scheduler, RNG) state for every role.

verl resumes with ``trainer.resume_mode=auto`` (the folder ``latest_checkpointed_iteration.txt``
names under ``trainer.default_local_dir``) or ``trainer.resume_mode=resume_path
trainer.resume_from_path=…/global_step_N``; :func:`resume_args` gives those overrides.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path
from typing import Any

import polars as pl

from parsers._checkpoint_files import (
    check_file,
    check_safetensors,
    check_torch_file,
    entries,
    is_dir,
    mtime,
    ranges,
    why,
)
from parsers._walk import walk
from parsers.schema import CHECKPOINT_SCHEMA

__all__ = [
    "TRACKER",
    "find_verl_checkpoint_roots",
    "latest_checkpointed_iteration",
    "read_verl_checkpoints",
    "resume_args",
    "resume_command",
]

TRACKER = "latest_checkpointed_iteration.txt"
_STEP_FOLDER = re.compile(r"global_step_(\d{1,15})")  # more digits: not a step
_SHARD = re.compile(r"(model|optim|extra_state)_world_size_(\d+)_rank_(\d+)\.pt")
_ROLES = ("actor", "critic")
_MAX_JSON = 10_000_000


def find_verl_checkpoint_roots(root: Path) -> list[Path]:
    """Folders under ``root`` (``root`` included) that hold ``global_step_N/`` folders or a tracker file."""
    found = []
    for folder, dirs, files in walk(Path(root)):
        steps = [d for d in dirs if _STEP_FOLDER.fullmatch(d)]
        if steps or TRACKER in files:
            found.append(Path(folder))
        dirs[:] = [d for d in dirs if not _STEP_FOLDER.fullmatch(d)]
    return sorted(found)


def is_verl_checkpoint_root(folder: Path) -> bool:
    """Whether ``folder`` holds verl's ``global_step_N/`` folders or its tracker file."""
    try:
        return any(_STEP_FOLDER.fullmatch(p.name) or p.name == TRACKER for p in Path(folder).iterdir())
    except OSError:
        return False


def latest_checkpointed_iteration(ckpt_root: Path) -> int | None:
    """The step ``latest_checkpointed_iteration.txt`` names, or None when it is missing or unreadable."""
    try:
        text = (Path(ckpt_root) / TRACKER).read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() and len(text) <= 15 else None


def read_verl_checkpoints(ckpt_root: Path) -> pl.DataFrame:
    """One row per ``global_step_N`` folder under ``ckpt_root``, sorted by step.

    Returns:
        :data:`~parsers.schema.CHECKPOINT_SCHEMA` rows: ``step`` N (log units), ``kind``
        ``verl``, ``role`` the roles saved (``actor``, ``actor+critic``). A tracker that names a
        folder that is gone adds a row for that folder, incomplete. Empty when nothing is found.
    """
    ckpt_root = Path(ckpt_root)
    folders = {int(m[1]): ckpt_root / m[0] for e in entries(ckpt_root) if (m := _STEP_FOLDER.fullmatch(e.name)) and is_dir(e)}
    tracker = latest_checkpointed_iteration(ckpt_root)
    tracker_exists = os.path.lexists(ckpt_root / TRACKER)
    # What other saves of the run wrote tells what a save of this verl version writes.
    layout = {name: any((f / role / name).exists() for f in folders.values() for role in _ROLES) for name in ("fsdp_config.json", "huggingface")}
    saved = {m[1] for f in folders.values() for role in _ROLES for e in entries(f / role) if (m := _SHARD.fullmatch(e.name))}
    layout |= {part: part in saved for part in ("optim", "extra_state")}
    rows = []
    for step, folder in sorted(folders.items()):
        problems, notes, roles, resumable = _inspect(folder, layout)
        if tracker is not None and step > tracker:
            notes.append(f"newer than {TRACKER} ({tracker}): trainer.resume_mode=auto would not pick it")
        complete = not problems
        rows.append((str(folder), step, "verl", "+".join(roles) or None, complete, complete and resumable, mtime(folder), problems + notes))
    if tracker is not None and tracker not in folders:
        missing = ckpt_root / f"global_step_{tracker}"
        rows.append((str(missing), tracker, "verl", None, False, False, None, [f"{TRACKER} names global_step_{tracker}, which is missing: trainer.resume_mode=auto would train from scratch"]))
    elif tracker is None and tracker_exists:
        for row in rows:
            row[-1].append(f"{TRACKER} is unreadable or not a step number")
    frame = pl.DataFrame(rows, schema=CHECKPOINT_SCHEMA, orient="row")
    return frame.sort("step", "path", nulls_last=True)


def _inspect(folder: Path, layout: dict[str, bool]) -> tuple[list[str], list[str], list[str], bool]:
    """(problems, notes, roles present, whether every role holds optimizer and extra state)."""
    problems: list[str] = []
    notes: list[str] = []
    roles = [role for role in _ROLES if is_dir(folder / role)]
    if "actor" not in roles:
        problems.append("actor/ missing")
    resumable = bool(roles)
    for role in roles:
        role_problems, role_resumable, role_notes = _inspect_role(folder / role, layout)
        problems += [f"{role}/{p}" for p in role_problems]
        notes += [f"{role}/{n}" for n in role_notes]
        resumable = resumable and role_resumable
    if not os.path.lexists(folder / "data.pt"):
        notes.append("data.pt missing: a resume restarts the dataloader from the beginning")
    elif problem := check_torch_file(folder / "data.pt"):
        problems.append(problem)
    return problems, notes, roles, resumable


def _inspect_role(role_dir: Path, layout: dict[str, bool]) -> tuple[list[str], bool, list[str]]:
    names = {e.name: Path(e.path) for e in _scandir(role_dir)}
    problems: list[str] = []
    notes: list[str] = []
    if "dist_ckpt" in names:
        problems += _check_dist_ckpt(names["dist_ckpt"])
        resumable = True
        notes.append("dist_ckpt/: optimizer state assumed inside (not checked without loading it)")
    elif any(_SHARD.fullmatch(n) for n in names) or "fsdp_config.json" in names:
        shard_problems, resumable, shard_notes = _check_fsdp_shards(names, layout)
        problems += shard_problems
        notes += shard_notes
    else:
        return ["no model state (model_world_size_*_rank_*.pt or dist_ckpt/)"], False, notes
    if "huggingface" in names:
        problems += _check_huggingface(names["huggingface"])
    elif layout["huggingface"]:
        problems.append("huggingface/ missing (other saves of this run have it)")
    return problems, resumable and not problems, notes


def _check_fsdp_shards(names: dict[str, Path], layout: dict[str, bool]) -> tuple[list[str], bool, list[str]]:
    """Every rank's model shard, the optimizer and extra state of every rank or of none — and
    none only where no other save of the run has them (the run's ``checkpoint.save_contents``
    left them out; a save missing what the others have did not finish, and verl's loader, which
    loads what the config names, would fail on it)."""
    problems: list[str] = []
    notes: list[str] = []
    shards: dict[str, dict[int, Path]] = {"model": {}, "optim": {}, "extra_state": {}}
    sizes = set()
    for name, path in names.items():
        if match := _SHARD.fullmatch(name):
            shards[match[1]][int(match[3])] = path
            sizes.add(int(match[2]))
    world = None
    if "fsdp_config.json" in names:
        data, problem = _read_json(names["fsdp_config.json"])
        if problem:
            problems.append(problem)
        elif isinstance(data, dict) and isinstance(data.get("world_size"), int):
            world = data["world_size"]
    elif layout["fsdp_config.json"]:
        # verl writes fsdp_config.json after every rank's shards: without it the save did not finish.
        problems.append("fsdp_config.json missing: the save did not finish")
    if len(sizes) > 1:
        problems.append(f"shards from different world sizes: {sorted(sizes)}")
    world = world or (max(sizes) if sizes else None)
    if world is None:
        return problems + ["no model shards"], False, notes
    present = {}
    for part, ranks in shards.items():
        missing = sorted(set(range(world)) - set(ranks))
        present[part] = len(ranks)
        if ranks and missing:
            problems.append(f"{part} shards missing for ranks {ranges(missing)} ({len(ranks)} of {world} present)")
        problems += [p for p in (check_torch_file(path) for _, path in sorted(ranks.items())) if p]
    if not present["model"]:
        problems.append(f"no model shards (model_world_size_{world}_rank_*.pt)")
    resumable = True
    for part, what in (("optim", "optimizer"), ("extra_state", "scheduler/RNG")):
        if present[part]:
            continue
        resumable = False
        if layout[part]:
            problems.append(f"no {what} state ({part}_world_size_*), which other saves of this run have: the save did not finish")
        elif problems:  # (a save cut short: what it would have held cannot be told)
            notes.append(f"no {what} state ({part}_world_size_*)")
        else:
            notes.append(f"no {what} state ({part}_world_size_*): checkpoint.save_contents left it out, so it cannot resume")
    return problems, resumable, notes


def _check_dist_ckpt(folder: Path) -> list[str]:
    names = {e.name: Path(e.path) for e in _scandir(folder)}
    if not names:
        return ["dist_ckpt/ is empty"]
    problems = []
    # torch_dist writes .metadata after all ranks' shards; metadata.json is Megatron's own marker.
    if ".metadata" not in names and "metadata.json" not in names:
        problems.append("dist_ckpt/.metadata missing: the save did not finish")
    shards = sorted(path for name, path in names.items() if name.endswith(".distcp"))
    if ".metadata" in names and not shards:
        problems.append("dist_ckpt/ has no *.distcp shards")
    return problems + [f"dist_ckpt/{p}" for p in map(check_file, shards) if p]


def _check_huggingface(folder: Path) -> list[str]:
    """config.json, and any weights it holds whole: every indexed shard, readable headers."""
    names = {e.name: Path(e.path) for e in _scandir(folder)}
    problems = []
    if "config.json" not in names:
        problems.append("huggingface/config.json missing")
    elif problem := _read_json(names["config.json"])[1]:
        problems.append(f"huggingface/{problem}")
    for name in sorted(names):
        if name.endswith(".index.json"):
            data, problem = _read_json(names[name])
            weight_map = data.get("weight_map") if isinstance(data, dict) else None
            if problem or not isinstance(weight_map, dict):
                problems.append(f"huggingface/{problem or name + ' has no weight_map'}")
                continue
            for shard in sorted({str(v) for v in weight_map.values()}):
                if shard not in names:
                    problems.append(f"huggingface/{shard} listed in {name} is missing")
    for name, path in sorted(names.items()):
        if name.endswith(".safetensors") and (problem := check_safetensors(path)):
            problems.append(f"huggingface/{problem}")
    return problems


def resume_args(path: Path) -> list[str]:
    """The verl overrides that resume from ``path``.

    ``…/global_step_N`` → ``trainer.resume_mode=resume_path trainer.resume_from_path=<it>``;
    a checkpoint root → ``trainer.resume_mode=auto trainer.default_local_dir=<it>`` (verl then
    loads the folder ``latest_checkpointed_iteration.txt`` names). Paths are made absolute: with
    ``ray job submit --working-dir`` a relative one resolves inside Ray's working-dir copy.
    """
    path = Path(path).absolute()
    if _STEP_FOLDER.fullmatch(path.name):
        return ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={path}"]
    if any(_STEP_FOLDER.fullmatch(e.name) for e in entries(path)) or (path / TRACKER).exists():
        return ["trainer.resume_mode=auto", f"trainer.default_local_dir={path}"]
    raise ValueError(f"{path} is neither a global_step_N folder nor a verl checkpoint root")


def resume_command(path: Path, launch: str) -> str:
    """A command line that resumes from ``path``: ``launch`` (the run's own command) plus :func:`resume_args`."""
    return f"{launch} {shlex.join(resume_args(path))}"


def _read_json(path: Path) -> tuple[Any, str | None]:
    if problem := check_file(path):
        return None, problem
    try:
        if path.stat().st_size > _MAX_JSON:
            return None, f"{path.name} is implausibly large"
        return json.loads(path.read_bytes()), None
    except OSError as error:
        return None, f"{path.name} cannot be read: {why(error)}"
    except (ValueError, RecursionError):
        return None, f"{path.name} does not parse as JSON"


def _scandir(folder: Path) -> list[os.DirEntry[str]]:
    try:
        return list(os.scandir(folder))
    except OSError:
        return []
