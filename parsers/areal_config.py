"""An AReaL run's dumped ``config.yaml`` → flat ``{"rollout.request_timeout": 600, …}``.

Read with YAML's safe loader (libyaml's when PyYAML has it, a tenth of the time): a config file is
data, never code.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

__all__ = ["read_areal_config", "read_areal_version"]

_MAX_BYTES = 4 << 20
#: More settings than any real config has: aliases can make a small file a tree of millions of keys.
_MAX_KEYS = 100_000
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_areal_config(path: Path) -> dict[str, Any]:
    """Scalar settings of ``path`` by dotted key; empty when the file is missing or unreadable."""
    try:
        if path.stat().st_size > _MAX_BYTES:
            return {}
        data = yaml.load(path.read_text(encoding="utf-8", errors="replace"), Loader=_LOADER)  # noqa: S506 (safe)
    except (OSError, yaml.YAMLError, RecursionError):
        return {}
    flat: dict[str, Any] = {}
    _flatten(data, flat)
    return flat


def _flatten(data: Any, out: dict[str, Any]) -> None:
    """``out`` filled with the scalars under ``data`` by dotted key, up to ``_MAX_KEYS`` nodes."""
    todo, seen = [(data, "")], 0
    while todo and seen < _MAX_KEYS:
        node, prefix = todo.pop()
        seen += 1
        if isinstance(node, dict):
            todo += [(value, f"{prefix}{key}.") for key, value in reversed(node.items())]
        elif node is None or isinstance(node, str | int | float | bool):
            out[prefix[:-1]] = node


def read_areal_version(path: Path) -> tuple[int, ...] | None:
    """The AReaL release a run was launched with, from the ``version.json`` its launcher wrote
    beside its logs (``"version": "1.0.0"``); ``None`` when it is missing or says none."""
    try:
        if path.stat().st_size > _MAX_BYTES:
            return None
        data = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, ValueError):
        return None
    found = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", str(data.get("version", ""))) if isinstance(data, dict) else None
    return tuple(int(n) for n in found.groups() if n is not None) if found else None
