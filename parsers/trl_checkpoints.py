"""The checkpoints a Hugging Face ``Trainer`` (TRL's ``GRPOTrainer`` among them) left on disk.

Layout (``transformers.Trainer._save_checkpoint``), under ``TrainingArguments.output_dir``::

    checkpoint-<N>/                  state after global step N (the step TensorBoard and W&B log)
        model.safetensors            or model-0000i-of-0000n.safetensors + model.safetensors.index.json,
                                     pytorch_model.bin, or adapter_model.safetensors (PEFT)
        trainer_state.json           {"global_step": N, "log_history": [...]}
        optimizer.pt, scheduler.pt   what ``resume_from_checkpoint`` needs besides the weights

Judged from names, sizes and JSON headers only: nothing is unpickled, nothing is written, and
unreadable files become ``problems``. A checkpoint is ``resumable`` when it is complete and holds
the optimizer and scheduler state.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl

from parsers._checkpoint_files import check_file, check_safetensors, entries, is_dir, mtime
from parsers.schema import CHECKPOINT_SCHEMA

__all__ = ["is_trl_checkpoint_root", "read_trl_checkpoints"]

_STEP_FOLDER = re.compile(r"checkpoint-(\d{1,15})")
_WEIGHTS = ("model.safetensors", "adapter_model.safetensors", "pytorch_model.bin", "adapter_model.bin")
_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


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
    problems = []
    state = folder / "trainer_state.json"
    if problem := check_file(state):
        problems.append(problem)
    else:
        try:
            saved = json.loads(state.read_text(encoding="utf-8")).get("global_step")
        except (OSError, ValueError, AttributeError):
            problems.append("trainer_state.json is not valid JSON")
        else:
            if saved is not None and saved != step:
                problems.append(f"trainer_state.json says global step {saved}, its folder {step}")
    problems += _weight_problems(folder)
    return problems


def _weight_problems(folder: Path) -> list[str]:
    for index in (folder / name for name in _INDEXES):
        if index.exists():
            try:
                shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                return [f"{index.name} is not a valid index"]
            check = check_safetensors if index.name.startswith("model.safetensors") else check_file
            return [p for p in (check(folder / shard) if (folder / shard).exists() else f"{shard} is missing"
                                for shard in shards) if p]
    for weights in (folder / name for name in _WEIGHTS):
        if weights.exists():
            problem = check_safetensors(weights) if weights.suffix == ".safetensors" else check_file(weights)
            return [problem] if problem else []
    return ["no model weights (model.safetensors, pytorch_model.bin or an adapter)"]
