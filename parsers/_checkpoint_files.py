"""The files of a checkpoint folder, checked without trusting them: shared by the AReaL and verl
checkpoint readers. Nothing here raises on a bad file; each check says what is wrong in a phrase.
"""

from __future__ import annotations

import json
import os
import stat
import struct
from datetime import datetime
from pathlib import Path

MAX_HEADER = 100_000_000  # the safetensors format's own limit on header size


def check_file(path: Path) -> str | None:
    """A non-empty regular file that can be opened (opening a FIFO would block, hence the stat)."""
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            return f"{path.name} is not a regular file"
        if info.st_size == 0:
            return f"{path.name} is empty (0 bytes)"
        with path.open("rb"):
            return None
    except OSError as error:
        return f"{path.name} cannot be read: {why(error)}"


def check_safetensors(path: Path) -> str | None:
    """A u64 little-endian header length N, N bytes of JSON, then the tensor data it describes."""
    name = path.name
    if problem := check_file(path):
        return problem
    try:
        size = path.stat().st_size
        with path.open("rb") as file:
            head = file.read(8)
            if len(head) < 8:
                return f"{name} is too short for a safetensors header ({size_phrase(size)} file)"
            (length,) = struct.unpack("<Q", head)
            if length > size - 8 or length > MAX_HEADER:
                declared = f"declared {size_phrase(length)} header in a {size_phrase(size)} file"
                return f"{name} header is unreadable ({declared})"
            header = json.loads(file.read(length))
    except OSError as error:
        return f"{name} cannot be read: {why(error)}"
    except (ValueError, RecursionError):
        return f"{name} header is unreadable (not valid JSON)"
    if not isinstance(header, dict):
        return f"{name} header is unreadable (not a JSON object)"
    try:
        tensors = [entry for key, entry in header.items() if key != "__metadata__"]
        end = max((int(entry["data_offsets"][1]) for entry in tensors), default=0)
    except (TypeError, KeyError, IndexError, ValueError):
        return f"{name} header is unreadable (malformed tensor entries)"
    present = size - 8 - length
    if end > present:
        return f"{name} is truncated ({present:,} of the {end:,} data bytes its header describes)"
    return None


def entries(folder: Path) -> list[Path]:
    try:
        return sorted(Path(entry.path) for entry in os.scandir(folder))
    except OSError:
        return []


def is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:  # is_dir() itself swallows only "not found"-like errors, not EACCES
        return False


def mtime(path: Path) -> datetime | None:
    try:
        return datetime.fromtimestamp(os.lstat(path).st_mtime)
    except (OSError, ValueError, OverflowError):
        return None


def size_phrase(n: int) -> str:
    """Sizes as they read in a sentence: ``312-byte``, ``9 GB``."""
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= scale:
            value = n / scale
            return f"{value:.3g} {unit}" if value < 1000 else f"{value:,.0f} {unit}"
    return f"{n}-byte"


def why(error: OSError) -> str:
    return error.strerror or type(error).__name__
