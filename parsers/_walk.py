"""Walking a folder tree without recursion, and whether a path lies in one.

Python 3.11's ``os.walk`` and ``Path.rglob`` recurse once per level: a tree a thousand folders deep
(a runaway job's, or a hostile one's) raises ``RecursionError`` and stops the whole analysis.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path


def walk(top: str | os.PathLike[str], onerror: Callable[[OSError], None] | None = None,
         followlinks: bool = False, links: list[str] | None = None) -> Iterator[tuple[str, list[str], list[str]]]:
    """``os.walk(top)`` top-down, as it yields (``dirs`` may be pruned in place), at any depth.
    Links to folders not followed are added to ``links``, when given."""
    stack = [os.fspath(top)]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as listing:
                entries = list(listing)
        except OSError as exc:
            if onerror is not None:
                onerror(exc)
            continue
        dirs, files = [], []
        for entry in entries:
            try:
                is_dir = entry.is_dir()  # (a link to a folder is listed as one, as os.walk does)
            except OSError:
                is_dir = False
            (dirs if is_dir else files).append(entry.name)
        yield folder, dirs, files
        below = [os.path.join(folder, name) for name in dirs]
        linked = [] if followlinks else [path for path in below if os.path.islink(path)]
        if links is not None:
            links += linked
        stack += reversed([path for path in below if path not in linked])


def files_under(top: Path) -> Iterator[Path]:
    """Every file below ``top`` (links to folders not followed), at any depth."""
    for folder, _dirs, names in walk(top):
        yield from (Path(folder, name) for name in names)


def within(path: str | os.PathLike[str], given: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is ``given`` or lies under it (a folder: anywhere in it; a file: only itself).
    Symlinks are resolved; a loop does not raise."""
    root = os.path.realpath(given)
    return under(os.path.realpath(path), root, os.path.isdir(root))


def under(target: str, root: str, folder: bool) -> bool:
    """:func:`within` for resolved paths: a string test, cheap for many targets against one root."""
    return target == root or (folder and target.startswith(root.rstrip(os.sep) + os.sep))
