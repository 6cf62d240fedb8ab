"""The checkpoints a Hugging Face ``Trainer`` (TRL's ``GRPOTrainer`` among them) left on disk.

Layout (``transformers.Trainer._save_checkpoint``), under ``TrainingArguments.output_dir``::

    checkpoint-<N>/                  state after global step N (the step TensorBoard and W&B log)
        model.safetensors            or model-0000i-of-0000n.safetensors + model.safetensors.index.json,
                                     pytorch_model.bin, or adapter_model.safetensors (PEFT)
        trainer_state.json           {"global_step": N, "log_history": [...]}
        optimizer.pt, scheduler.pt   what ``resume_from_checkpoint`` needs besides the weights
        global_step<N>/              under DeepSpeed instead: the engine's ``*_optim_states.pt`` (the
                                     scheduler too) and ``*model_states.pt`` — under ZeRO-3 without
                                     gathered weights, the only weights (``zero_to_fp32.py`` beside)
        optimizer.bin, optimizer_0/  under FSDP (weights in ``pytorch_model_fsdp_0/``)

The model files are checked as an HF export's are (:func:`parsers._checkpoint_files.check_hf_model`).
Judged from names, sizes and JSON headers only: nothing is unpickled, nothing is written, and
unreadable files become ``problems``. A checkpoint is ``resumable`` when it is complete and holds
the optimizer and scheduler state.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

import polars as pl

from parsers._checkpoint_files import NO_WEIGHTS, check_hf_model, check_torch_file, entries, is_dir, mtime, read_json
from parsers.schema import CHECKPOINT_SCHEMA

__all__ = ["is_trl_checkpoint_root", "read_trl_checkpoints"]

_STEP_FOLDER = re.compile(r"checkpoint-(\d{1,15})")
#: DeepSpeed's engine state in a Trainer checkpoint: ``global_step<N>/``.
_ENGINE_FOLDER = re.compile(r"global_step\d{1,15}")


def is_trl_checkpoint_root(folder: Path) -> bool:
    """Whether ``folder`` holds ``checkpoint-N/`` folders with a ``trainer_state.json``."""
    return any(_STEP_FOLDER.fullmatch(p.name) and (p / "trainer_state.json").exists() for p in entries(folder) if is_dir(p))


def read_trl_checkpoints(output_dir: Path) -> pl.DataFrame:
    """One :data:`~parsers.schema.CHECKPOINT_SCHEMA` row per ``checkpoint-N/`` of ``output_dir``
    (kind ``trl``, role ``actor``: the policy; step N, the Trainer's global step, the unit its logs use)."""
    rows = []
    for folder in entries(Path(output_dir)):
        found = _STEP_FOLDER.fullmatch(folder.name)
        if not found or not is_dir(folder):
            continue
        names = {entry.name: entry for entry in entries(folder)}
        engine = _engine_state(folder, names)
        problems = _problems(folder, int(found.group(1)), names, engine)
        complete = not problems
        # (the engine's own state, DeepSpeed's or FSDP's, holds the optimizer and the scheduler)
        resumable = complete and (engine is not None or all(name in names for name in ("optimizer.pt", "scheduler.pt")))
        rows.append((str(folder), int(found.group(1)), "trl", "actor", complete, resumable, mtime(folder), problems))
    return pl.DataFrame(rows, schema=CHECKPOINT_SCHEMA, orient="row").sort("step", "path", nulls_last=True)


def _problems(folder: Path, step: int, names: dict[str, Path], engine: _Engine | None) -> list[str]:
    state, problem = read_json(folder / "trainer_state.json")
    if problem:
        problems = [problem]
    else:
        saved = state.get("global_step") if isinstance(state, dict) else None
        problems = [f"trainer_state.json says global step {saved}, its folder {step}"] if saved not in (None, step) else []
    if not names:
        return [*problems, "folder is empty"]
    model = check_hf_model(names)
    if engine is not None and engine.weights:  # (ZeRO-3 or FSDP: the weights are the engine's, none at the top)
        model = [p for p in model if not p.startswith(NO_WEIGHTS)]
    # (a save the disk filled during: an empty optimizer.pt fails resume_from_checkpoint)
    state_files = [names[n] for n in ("optimizer.pt", "scheduler.pt") if n in names] + (engine.files if engine else [])
    return problems + model + [p for p in map(check_torch_file, state_files) if p] + (engine.problems if engine else [])


class _Engine(NamedTuple):
    """A DeepSpeed or FSDP checkpoint's own state files, and whether they hold the weights."""

    files: list[Path]
    weights: bool
    problems: list[str]


def _engine_state(folder: Path, names: dict[str, Path]) -> _Engine | None:
    if "optimizer.bin" in names or is_dir(folder / "optimizer_0"):  # FSDP
        return _Engine([names["optimizer.bin"]] if "optimizer.bin" in names else [], is_dir(folder / "pytorch_model_fsdp_0"), [])
    steps = [path for name, path in names.items() if _ENGINE_FOLDER.fullmatch(name) and is_dir(path)]
    if not steps:
        return None
    latest = folder / "latest"
    named = latest.read_text(errors="replace").strip() if latest.is_file() else None
    chosen = next((p for p in steps if p.name == named), None) or max(steps, key=lambda p: int(p.name.removeprefix("global_step")))
    files = sorted(entries(chosen))
    optim = [p for p in files if p.name.endswith("optim_states.pt")]
    model = [p for p in files if p.name.endswith("model_states.pt")]
    problems = [] if optim else [f"{chosen.name}/ holds no optimizer state (*_optim_states.pt)"]
    return _Engine(optim + model, any("zero_pp_rank" in p.name for p in model), problems)
