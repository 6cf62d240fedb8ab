"""An AReaL run's dumped ``config.yaml`` → flat ``{"rollout.request_timeout": 600, …}``.

Read with ``yaml.safe_load``: a config file is data, never code.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

__all__ = ["read_areal_config", "read_areal_version"]

_MAX_BYTES = 4 << 20


def read_areal_config(path: Path) -> dict[str, Any]:
    """Scalar settings of ``path`` by dotted key; empty when the file is missing or unreadable."""
    try:
        if path.stat().st_size > _MAX_BYTES:
            return {}
        data = yaml.safe_load(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, yaml.YAMLError):
        return {}
    flat: dict[str, Any] = {}
    _flatten(data, "", flat)
    return flat


def _flatten(node: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            _flatten(value, f"{prefix}{key}.", out)
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
