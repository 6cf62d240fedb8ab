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
    best, agreeing = 0, -1
    for offset in _OFFSETS:
        shifted = other.with_columns(pl.col("step") + offset)
        same = shifted.join(ref, on=["step", "key"], suffix="_ref").filter(pl.col("value") == pl.col("value_ref")).height
        if same > agreeing:
            best, agreeing = offset, same
    return best


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
