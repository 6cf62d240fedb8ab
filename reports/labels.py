"""Names that tell a fleet's runs apart when several share a run id.

Runs launched from one config share ``experiment/trial`` (``gsm8k-grpo/trial0`` in every folder),
so a run id alone names none of them. Such runs are labelled with the part of their root folder
the others do not share, as editors label two tabs of one file name:
``gsm8k-grpo/trial0 (lr-1e-6)`` beside ``gsm8k-grpo/trial0 (lr-3e-6)``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import PurePath

__all__ = ["run_labels"]


def run_labels(run_ids: Sequence[str], roots: Sequence[str]) -> list[str]:
    """One label per run: its id, followed by what sets its root apart when the id is not unique."""
    same: dict[str, list[int]] = defaultdict(list)
    for i, run_id in enumerate(run_ids):
        same[run_id].append(i)
    labels = list(run_ids)
    for run_id, members in same.items():
        if len(members) < 2:
            continue
        for n, (i, part) in enumerate(zip(members, _distinct_parts([roots[i] for i in members]), strict=True), 1):
            labels[i] = f"{run_id} ({part or f'copy {n}'})"
    return labels


def _distinct_parts(roots: list[str]) -> list[str]:
    """Each root without the leading and trailing folders all of them share (keeping at least
    one folder of each, unless the roots are all the same: then nothing is left)."""
    parts = [PurePath(root).parts for root in roots]
    if len(set(parts)) == 1:
        return ["" for _ in parts]
    keep = min(len(p) for p in parts) - 1
    lead = 0
    while lead < keep and len({p[lead] for p in parts}) == 1:
        lead += 1
    tail = 0
    while tail < keep - lead and len({p[-1 - tail] for p in parts}) == 1:
        tail += 1
    return [str(PurePath(*p[lead : len(p) - tail])) for p in parts]
