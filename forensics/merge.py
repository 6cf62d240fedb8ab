"""One metric frame from several copies of a run's numbers (console log, W&B, TensorBoard).

Copies are put in the console log's step units first (AReaL hands W&B and TensorBoard its
0-based global step while its log prints it 1-based): the offset is the one under which the
copies agree on the most exact values. Then each series is taken from the copy that holds
the most steps of it, and the choice is reported.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import polars as pl

from parsers.schema import METRIC_SCHEMA, empty

_OFFSETS = range(-2, 3)
#: On a tie, text logs win: their rows point at a file and line a reader can open.
_PREFERENCE = {"areal": 0, "verl": 1, "custom": 2, "verl_jsonl": 3, "tensorboard": 4, "wandb": 5}


@dataclass(frozen=True)
class Merged:
    metrics: pl.DataFrame
    series_sources: dict[str, str]
    """Which source each key was taken from (only keys present in more than one source)."""
    notes: tuple[str, ...]


def step_offset(reference: pl.DataFrame, copy: pl.DataFrame) -> int:
    """The shift to add to ``copy``'s steps so its values line up with ``reference``'s."""
    ref = reference.filter(pl.col("step").is_not_null()).select("step", "key", "value")
    other = copy.filter(pl.col("step").is_not_null()).select("step", "key", "value")
    if ref.is_empty() or other.is_empty():
        return 0
    # Agreeing as printed: a console rounds to 3 decimals what a copy keeps whole (exact equality
    # never held there, and a tie of none went to the first shift tried: -2).
    close = (pl.col("value") - pl.col("value_ref")).abs() <= 5e-4 * (1 + pl.col("value_ref").abs())
    best, agreeing = 0, 0
    for offset in sorted(_OFFSETS, key=abs):  # (a tie goes to the smaller shift, none at all to 0)
        shifted = other.with_columns(pl.col("step") + offset)
        same = shifted.join(ref, on=["step", "key"], suffix="_ref").filter(close).height
        if same > agreeing:
            best, agreeing = offset, same
    return best


@dataclass(frozen=True)
class StepUnits:
    """How a copy's steps map to the text log's: ``step // scale + offset``. A scale above one is
    a copy logged per micro-step (a loop's ``global_step`` counting gradient accumulation steps)."""

    scale: int = 1
    offset: int = 0

    def of(self, step: pl.Expr) -> pl.Expr:
        return step // self.scale + self.offset if self.scale > 1 else step + self.offset


#: Micro-steps to a step tried, at most; and how many of the log's values their mean must match.
_SCALES = range(2, 17)
_SCALED_AGREEMENT = 0.6


def step_units(reference: pl.DataFrame, copy: pl.DataFrame) -> StepUnits:
    """The mapping under which ``copy``'s values line up with ``reference``'s: a shift (exact
    values agreeing most), or — for a copy with several times the log's steps — micro-steps,
    when their mean matches the log's value (a loop averages its micro-steps into the step it
    prints) far better than any shift does."""
    units = StepUnits(offset=step_offset(reference, copy))
    ratio = copy["step"].drop_nulls().n_unique() / max(reference["step"].drop_nulls().n_unique(), 1)
    if ratio < 1.5:
        return units
    ref = reference.filter(pl.col("step").is_not_null()).select("step", pl.col("key").cast(pl.String), "value")
    other = copy.filter(pl.col("step").is_not_null()).select("step", pl.col("key").cast(pl.String), "value")
    shared = set(ref["key"].unique()) & set(other["key"].unique())
    if not shared:
        return units
    ref, other = ref.filter(pl.col("key").is_in(shared)), other.filter(pl.col("key").is_in(shared))
    best, matched = units, _matching(ref, other, units)
    for scale in (k for k in _SCALES if k <= ratio + 1):
        for offset in (-1, 0, 1):
            tried = StepUnits(scale, offset)
            share = _matching(ref, other, tried)
            if share >= _SCALED_AGREEMENT and share > matched:
                best, matched = tried, share
    return best


#: Keys AReaL's actor puts in a step's first minibatch record only: the batch's, not an update's.
_BATCH_KEYS = r"task_reward|^rollout/|^timeperf/"


def areal_copy_units(copy: pl.DataFrame) -> StepUnits:
    """An AReaL copy's steps with no log to compare against. StatsLogger hands W&B and TensorBoard
    the 0-based global step (its log and checkpoints count from 1); with k minibatches it logs a
    step's k updates at steps k·g … k·g+k−1, the batch's own keys (rewards, timers) only at the
    first, so their steps' stride is k while the updates' fill the steps between."""
    stepped = copy.filter(pl.col("step").is_not_null())
    batch = stepped.filter(pl.col("key").cast(pl.String).str.contains(_BATCH_KEYS))["step"].unique().sort()
    strides = batch.diff().drop_nulls()
    k = int(strides.min()) if strides.len() else 1
    minibatches = (k > 1 and (batch % k == 0).all() and (strides % k == 0).all()
                   and stepped["step"].n_unique() >= 1.5 * batch.len())
    return StepUnits(scale=k, offset=1) if minibatches else StepUnits(offset=1)


def _matching(ref: pl.DataFrame, other: pl.DataFrame, units: StepUnits) -> float:
    """The share of the log's values the copy's (their mean, per step) match, to the log's printed precision."""
    means = other.group_by(units.of(pl.col("step")).alias("step"), "key").agg(pl.col("value").mean())
    pairs = means.join(ref, on=["step", "key"], suffix="_ref").filter(pl.col("value").is_finite() & pl.col("value_ref").is_finite())
    if pairs.height < 10:
        return 0.0
    close = (pl.col("value") - pl.col("value_ref")).abs() <= 5e-4 + 1e-3 * pl.col("value_ref").abs()
    return pairs.filter(close).height / pairs.height


def per_log_step(copy: pl.DataFrame, units: StepUnits) -> pl.DataFrame:
    """``copy`` in the log's steps: shifted, and micro-steps averaged into their step (the first
    record's time and place kept as the step's)."""
    if units.scale == 1:
        return copy.with_columns(units.of(pl.col("step")))
    stepped = copy.filter(pl.col("step").is_not_null()).with_columns(units.of(pl.col("step")))
    averaged = stepped.group_by("step", "key", maintain_order=True).agg(
        pl.col("value").mean(), *(pl.col(c).first() for c in copy.columns if c not in ("step", "key", "value")))
    return pl.concat([averaged.select(copy.columns), copy.filter(pl.col("step").is_null())])


def merge_sources(frames: dict[str, pl.DataFrame]) -> Merged:
    """Merge per-source metric frames (same schema, ``source`` column set) by (step, key)."""
    frames = {name: frame for name, frame in frames.items() if not frame.is_empty()}
    if len(frames) <= 1:
        only = next(iter(frames.values()), None)
        return Merged(only if only is not None else empty(METRIC_SCHEMA), {}, ())
    stepped_keys = pl.collect_all(
        [
            frame.lazy().group_by("key").agg(pl.col("step").is_not_null().any().alias("stepped")).filter("stepped")
            for frame in frames.values()
        ],
        engine="streaming",
    )
    if _disjoint(set(found["key"].to_list()) for found in stepped_keys):
        # No series in two copies (a trainer log beside a server log): nothing to choose, nothing copied.
        return Merged(pl.concat(list(frames.values()), rechunk=False), {}, ())
    # Lazy over the sources as they are: only the rows kept are ever copied (a join would copy
    # every stepped row once more, and the sources can be tens of millions of rows).
    every = pl.concat(list(frames.values())).lazy()
    stepped = every.filter(pl.col("step").is_not_null())
    counts = stepped.group_by("key", "source").agg(pl.col("step").n_unique().alias("steps")).collect(engine="streaming").sort("key", "source")
    preference = pl.col("source").replace_strict(_PREFERENCE, default=len(_PREFERENCE), return_dtype=pl.Int64)
    chosen = (
        counts.with_columns(preference.alias("rank"))
        .sort("steps", "rank", descending=[True, False])
        .unique("key", keep="first", maintain_order=True)
    )
    shared = counts.group_by("key").len().filter(pl.col("len") > 1)["key"]
    notes = []
    for row in counts.join(chosen.select("key", pl.col("steps").alias("best")), on="key").filter(
        (pl.col("steps") < pl.col("best")) & pl.col("key").is_in(shared.implode())
    ).group_by("source").agg(pl.len().alias("keys"), (pl.col("steps") / pl.col("best")).min().alias("share")).iter_rows(named=True):
        notes.append(f"{row['source']} holds fewer steps than another copy for {row['keys']} series (down to {row['share']:.0%}): not used for them")
    taken_from = dict(chosen.select("key", "source").iter_rows())
    taken = pl.col("key").replace_strict(taken_from, default=None, return_dtype=pl.String) == pl.col("source")
    kept = pl.concat([stepped.filter(taken), every.filter(pl.col("step").is_null())]).collect()
    sources = dict(chosen.filter(pl.col("key").is_in(shared.implode())).select("key", "source").iter_rows())
    return Merged(kept, sources, tuple(notes))


def _disjoint(key_sets: Iterable[set[str]]) -> bool:
    seen: set[str] = set()
    for keys in key_sets:
        if not seen.isdisjoint(keys):
            return False
        seen |= keys
    return True
