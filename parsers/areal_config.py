"""An AReaL run's dumped ``config.yaml`` → flat ``{"rollout.request_timeout": 600, …}``.

Read with ``yaml.safe_load``: a config file is data, never code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

__all__ = ["read_areal_config"]

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
