"""File identity for provenance (and, later, the parse cache): size and a content hash.

Small files get a full SHA-256. Multi-gigabyte logs get a SHA-256 of their size, first and
last megabyte: it changes when a log grows, is rotated or rewritten, and costs no full read.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import NamedTuple

FULL_HASH_LIMIT = 64 << 20
EDGE = 1 << 20


class Fingerprint(NamedTuple):
    size: int
    digest: str
    method: str
    """``sha256`` (whole file) or ``sha256-head-tail`` (size + first and last MiB)."""


def fingerprint(path: Path) -> Fingerprint | None:
    """Size and hash of ``path``, or ``None`` when it cannot be read."""
    try:
        size = path.stat().st_size
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            if size <= FULL_HASH_LIMIT:
                while block := fh.read(1 << 20):
                    digest.update(block)
                return Fingerprint(size, digest.hexdigest(), "sha256")
            digest.update(str(size).encode())
            digest.update(fh.read(EDGE))
            fh.seek(size - EDGE)
            digest.update(fh.read(EDGE))
            return Fingerprint(size, digest.hexdigest(), "sha256-head-tail")
    except OSError:
        return None
