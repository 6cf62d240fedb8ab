"""The numbers a Hugging Face ``Trainer`` (TRL's ``GRPOTrainer`` among them) keeps in each checkpoint.

``checkpoint-<N>/trainer_state.json`` holds ``log_history``: every dict the Trainer logged up to
step N (``{"step": 10, "reward": 0.68, "reward_std": 0.21, "loss": 0.01, …}``), written with
``indent=2``. The newest checkpoint's is the run's whole history to its save, and often what is left
when the W&B or TensorBoard folder was not kept. Keys are named as the Trainer's W&B and TensorBoard
callbacks name them (``train/reward``, ``eval/…``), so a copy beside it is the same series; the
Trainer logs no times.

Example:
    >>> state = read_trainer_state(Path("out/checkpoint-200/trainer_state.json"))  # doctest: +SKIP
    >>> state.metrics.filter(pl.col("key") == "train/reward")  # doctest: +SKIP
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from parsers.schema import METRIC_SCHEMA

__all__ = ["TrainerState", "read_trainer_state"]

#: The run's totals the Trainer logs once at its end: not series.
_TOTALS = frozenset({"total_flos", "train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss"})
_STEP = re.compile(rb'^\s*"step": (\d+),?\s*$', re.MULTILINE)


@dataclass(frozen=True)
class TrainerState:
    metrics: pl.DataFrame
    """:data:`~parsers.schema.METRIC_SCHEMA` rows: ``step`` the Trainer's global step, ``line`` the
    ``"step"`` line of the entry in the file, ``time`` null (the Trainer logs none)."""
    lines: int
    unparsed_lines: int
    notes: tuple[str, ...]


def read_trainer_state(path: Path) -> TrainerState:
    """The ``log_history`` of one ``trainer_state.json``.

    Raises:
        OSError: the file cannot be read.
    """
    data = Path(path).read_bytes()
    lines = data.count(b"\n") + (not data.endswith(b"\n") and bool(data))
    try:
        history = json.loads(data).get("log_history")
    except (ValueError, AttributeError):
        return TrainerState(_empty(), lines, lines, ("not a trainer_state.json that could be read (invalid JSON): no value read",))
    if not isinstance(history, list):
        return TrainerState(_empty(), lines, 0, ("no log_history in it: no value read",))
    # The entry's "step" line, as json.dump(indent=2) writes it: the n-th such line is the n-th entry's.
    at = [data.count(b"\n", 0, m.start()) + 1 for m in _STEP.finditer(data)]
    rows: list[tuple[int, str, float, int | None]] = []
    skipped = 0
    for n, entry in enumerate(history):
        step = entry.get("step") if isinstance(entry, dict) else None
        if not isinstance(step, int):
            skipped += 1
            continue
        line = at[n] if n < len(at) else None
        for key, value in entry.items():
            if key == "step" or key in _TOTALS or isinstance(value, bool) or not isinstance(value, int | float):
                continue
            rows.append((step, f"eval/{key[5:]}" if key.startswith("eval_") else f"train/{key}", float(value), line))
    frame = pl.DataFrame(rows, schema={"step": pl.Int64, "key": pl.String, "value": pl.Float64, "line": pl.Int64}, orient="row")
    metrics = frame.select(
        "step", pl.lit(None, pl.Datetime("ms")).alias("time"), "key", "value",
        pl.lit(str(path)).alias("file"), "line", pl.lit("trl_state").alias("source"),
    ).cast(METRIC_SCHEMA)
    notes = [f"{skipped} log_history entries with no step were skipped"] if skipped else []
    if rows and not any(math.isfinite(v) for _, _, v, _ in rows):
        notes.append("no finite value in log_history")
    return TrainerState(metrics.select(list(METRIC_SCHEMA)), lines, 0, tuple(notes))


def _empty() -> pl.DataFrame:
    return pl.DataFrame(schema=METRIC_SCHEMA)
