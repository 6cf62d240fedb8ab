"""Walking a folder tree without recursion.

Python 3.11's ``os.walk`` and ``Path.rglob`` recurse once per level: a tree a thousand folders deep
(a runaway job's, or a hostile one's) raises ``RecursionError`` and stops the whole analysis.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path


def walk(top: str | os.PathLike[str], onerror: Callable[[OSError], None] | None = None,
         followlinks: bool = False, links_out: bool = False) -> Iterator[tuple[str, list[str], list[str]]]:
    """``os.walk(top)`` top-down, as it yields (``dirs`` may be pruned in place), at any depth.

    ``links_out``: links to folders outside the tree are followed too, each target once (a folder
    of links to runs kept elsewhere); a link into the tree is not (``session_latest``: walked anyway).
    """
    stack = [os.fspath(top)]
    walked = [os.path.realpath(top), os.path.abspath(top)]
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
        stack += reversed([path for path in below if followlinks or not os.path.islink(path) or (links_out and _new_tree(path, walked))])


def _new_tree(link: str, walked: list[str]) -> bool:
    """Whether ``link`` leads out of every tree ``walked`` so far (then it is one of them): where it
    points, and where that leads in the end (``latest -> trial0`` is walked as ``trial0``)."""
    try:
        points = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(link)), os.readlink(link)))
    except OSError:
        return False
    target = os.path.realpath(link)
    if any(path == tree or path.startswith(tree.rstrip(os.sep) + os.sep) for tree in walked for path in (points, target)):
        return False
    walked.append(target)
    return True


def files_under(top: Path) -> Iterator[Path]:
    """Every file below ``top`` (links to folders not followed), at any depth."""
    for folder, _dirs, names in walk(top):
        yield from (Path(folder, name) for name in names)
