"""The files of a checkpoint folder, checked without trusting them: shared by the AReaL and verl
checkpoint readers. Nothing here raises on a bad file; each check says what is wrong in a phrase.
"""

from __future__ import annotations

import json
import os
import re
import stat
import struct
from datetime import datetime
from pathlib import Path
from typing import Any

from parsers.schema import UNLISTED

MAX_HEADER = 100_000_000  # the safetensors format's own limit on header size
#: How a model folder with no weights is said (a reader whose weights lie elsewhere passes over it).
NO_WEIGHTS = "no weight files"


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


#: ``torch.save`` (PyTorch >= 1.6) writes a zip archive: its end record, within this many bytes of
#: the end (22 and a comment of up to 65,535), is written last.
_ZIP_HEAD, _ZIP_END, _ZIP_TAIL = b"PK\x03\x04", b"PK\x05\x06", 22 + 65_535


def check_torch_file(path: Path) -> str | None:
    """A readable ``.pt`` file (:func:`check_file`) that, in ``torch.save``'s zip container, ends in
    the zip's end record: one cut short (a save killed mid-write) does not. (The older pickle format
    has no end to check.)"""
    if problem := check_file(path):
        return problem
    try:
        size = path.stat().st_size
        with path.open("rb") as file:
            if file.read(4) != _ZIP_HEAD:
                return None
            file.seek(max(size - _ZIP_TAIL, 0))
            tail = file.read()
    except OSError as error:
        return f"{path.name} cannot be read: {why(error)}"
    if _ZIP_END not in tail:
        return f"{path.name} is cut short ({size_phrase(size)}: a torch.save archive with no end record, its write did not finish)"
    return None

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


def unlisted(folder: Path) -> str | None:
    """``cannot be listed: <why>`` for a folder the reader could not look into, else ``None``."""
    try:
        with os.scandir(folder):
            return None
    except FileNotFoundError:
        # (not there, unless a link on the way is: storage not mounted, or not copied with the logs)
        link = dangling_link(folder)
        return None if link is None else f"{UNLISTED}: {link} links to {os.readlink(link)}, which does not exist"
    except OSError as exc:
        return f"{UNLISTED}: {exc.strerror or exc}"


def dangling_link(path: Path, within: int = 4) -> Path | None:
    """``path``, or one of the ``within`` folders above it, when it is a link to nothing."""
    for candidate in [path, *path.parents][: within + 1]:
        if os.path.islink(candidate) and not os.path.exists(candidate):
            return candidate
    return None


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


_WEIGHTS = re.compile(r".+\.safetensors|(pytorch_model|adapter_model).*\.bin")
_SHARD = re.compile(r"(.+)-\d+-of-(\d+)\.(safetensors|bin)")
_MAX_JSON = 100_000_000


def check_hf_model(names: dict[str, Path]) -> list[str]:
    """The problems of a Hugging Face model folder (``save_pretrained``'s, listed as ``names``): config,
    weights with readable headers, and a complete shard set (LoRA adapters count)."""
    lora = "adapter_config.json" in names and any(n.startswith("adapter_model.") for n in names)
    problems = _check_config(names, "adapter_config.json" if lora else "config.json")
    weights = {path for name, path in names.items() if _WEIGHTS.fullmatch(name)}
    for name in sorted(names):
        if name.endswith(".index.json"):
            index_problems, shards = _check_index(names[name])
            problems += index_problems
            weights |= set(shards)
    if not weights:
        problems.append(f"{NO_WEIGHTS} (*.safetensors or pytorch_model*.bin)")
    for path in sorted(weights):
        check = check_safetensors if path.name.endswith(".safetensors") else check_file
        if problem := check(path):
            problems.append(problem)
    return problems + _check_shard_set(names)


def _check_config(names: dict[str, Path], config: str) -> list[str]:
    if config not in names:
        return [f"{config} missing"]
    _, problem = read_json(names[config])
    return [problem] if problem else []


def _check_index(index: Path) -> tuple[list[str], list[Path]]:
    """Every shard in the index's weight_map must exist; returns the problems and those shards."""
    data, problem = read_json(index)
    if problem:
        return [problem], []
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict):
        return [f"{index.name} has no weight_map"], []
    problems: list[str] = []
    shards: list[Path] = []
    for shard in sorted({str(value) for value in weight_map.values()}):
        relative = Path(shard)
        if relative.is_absolute() or ".." in relative.parts:
            problems.append(f"{shard} listed in {index.name} points outside the checkpoint")
        elif os.path.lexists(index.parent / relative):
            shards.append(index.parent / relative)
        else:
            problems.append(f"{shard} listed in {index.name} is missing")
    return problems, shards


def _check_shard_set(names: dict[str, Path]) -> list[str]:
    """Numbered shards need their index: without it nothing can load them."""
    groups: dict[str, tuple[int, int]] = {}
    for name in names:
        if match := _SHARD.fullmatch(name):
            index = f"{match[1]}.{match[3]}.index.json"
            total = int(match[2])
            groups[index] = (total, groups.get(index, (total, 0))[1] + 1)
    return [
        f"{index} missing ({found} of {total} shards present)"
        for index, (total, found) in sorted(groups.items())
        if index not in names
    ]


def ranges(numbers: list[int]) -> str:
    """Sorted rank numbers as spans: ``[0, 1, 2, 5]`` → ``0-2, 5`` (the ranks a checkpoint's shards miss)."""
    spans: list[list[int]] = []
    for n in numbers:
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in spans)


def read_json(path: Path) -> tuple[Any, str | None]:
    """The parsed file, or why it could not be had."""
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            return None, f"{path.name} is not a regular file"
        if info.st_size > _MAX_JSON:
            return None, f"{path.name} is implausibly large ({size_phrase(info.st_size)} file)"
        return json.loads(path.read_bytes()), None
    except OSError as error:
        return None, f"{path.name} cannot be read: {why(error)}"
    except (ValueError, RecursionError) as error:
        return None, f"{path.name} does not parse: {error}"
