"""The checkpoints a Hugging Face ``Trainer`` (TRL's ``GRPOTrainer`` among them) left on disk.

Layout (``transformers.Trainer._save_checkpoint``), under ``TrainingArguments.output_dir``::

    checkpoint-<N>/                  state after global step N (the step TensorBoard and W&B log)
        model.safetensors            or model-0000i-of-0000n.safetensors + model.safetensors.index.json,
                                     pytorch_model.bin, or adapter_model.safetensors (PEFT)
        trainer_state.json           {"global_step": N, "log_history": [...]}
        optimizer.pt, scheduler.pt   what ``resume_from_checkpoint`` needs besides the weights

The model files are checked as an HF export's are (:func:`parsers._checkpoint_files.check_hf_model`).
Judged from names, sizes and JSON headers only: nothing is unpickled, nothing is written, and
unreadable files become ``problems``. A checkpoint is ``resumable`` when it is complete and holds
the optimizer and scheduler state.
"""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl

from parsers._checkpoint_files import check_hf_model, entries, is_dir, mtime, read_json
from parsers.schema import CHECKPOINT_SCHEMA

__all__ = ["is_trl_checkpoint_root", "read_trl_checkpoints"]

_STEP_FOLDER = re.compile(r"checkpoint-(\d{1,15})")


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
        problems = _problems(folder, int(found.group(1)))
        complete = not problems
        resumable = complete and all((folder / name).is_file() for name in ("optimizer.pt", "scheduler.pt"))
        rows.append((str(folder), int(found.group(1)), "trl", "actor", complete, resumable, mtime(folder), problems))
    return pl.DataFrame(rows, schema=CHECKPOINT_SCHEMA, orient="row").sort("step", "path", nulls_last=True)


def _problems(folder: Path, step: int) -> list[str]:
    names = {entry.name: entry for entry in entries(folder)}
    state, problem = read_json(folder / "trainer_state.json")
    if problem:
        problems = [problem]
    else:
        saved = state.get("global_step") if isinstance(state, dict) else None
        problems = [f"trainer_state.json says global step {saved}, its folder {step}"] if saved not in (None, step) else []
    return problems + (check_hf_model(names) if names else ["folder is empty"])
