"""What a file or folder looked like when it was read, what code read it, and where the cache is.

The parse cache and the replay of a whole command (:mod:`forensics.rerun`) both ask "is this the
same input, read by the same code?". Only the standard library is imported here: the replay must
answer before Polars is loaded.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from functools import cache
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from forensics.errors import NoCacheDir
from parsers._walk import walk

#: Environment variable naming the cache folder (the CLI's ``--cache-dir`` wins over it).
CACHE_ENV = "GRPO_FORENSICS_CACHE"
#: Bytes hashed at the head of a file and just before its end.
EDGE = 64 << 10


def default_cache_dir() -> Path:
    """``$GRPO_FORENSICS_CACHE``, else ``$XDG_CACHE_HOME/grpo-forensics``, else ``~/.cache/grpo-forensics``.

    Raises:
        NoCacheDir: none is set and the user has no home folder (``docker run --user N``).
    """
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "grpo-forensics"
    try:
        return Path.home() / ".cache" / "grpo-forensics"
    except (RuntimeError, KeyError):  # (no HOME and no passwd entry)
        raise NoCacheDir(f"no user cache folder (the user has no home folder): set {CACHE_ENV} or XDG_CACHE_HOME") from None


@dataclass(frozen=True)
class Identity:
    """What a source looked like when it was parsed."""

    size: int
    mtime_ns: int
    inode: int
    head: str
    """Hash of the first ``EDGE`` bytes (a folder: of its file listing)."""
    end: str
    """Hash of the ``EDGE`` bytes before ``size``."""
    gzip: bool = False
    ctime_ns: int = 0
    """When the file was last written or renamed: an edit in its middle that kept its size and
    had its mtime set back still moves it (no program can set it)."""

    @staticmethod
    def of(path: Path) -> Identity:
        if path.is_dir():
            return _folder_identity(path)
        st = path.stat()
        with open(path, "rb") as fh:
            head = fh.read(EDGE)
            return Identity(st.st_size, st.st_mtime_ns, st.st_ino, _sha(head), _edge_before(fh, st.st_size),
                            head[:2] == b"\x1f\x8b", st.st_ctime_ns)

    @staticmethod
    def text_of(path: Path) -> str | None:
        """``path``'s identity as text to compare with a later one; ``None`` when it cannot be read (gone)."""
        try:
            return str(Identity.of(path))
        except OSError:
            return None

    def grew_from(self, old: Identity, path: Path) -> bool:
        """Whether this file is ``old`` with bytes appended (same head, same bytes at the old end)."""
        if self.gzip or old.gzip or self.size <= old.size or self.inode != old.inode:
            return False
        with open(path, "rb") as fh:
            if _sha(fh.read(min(EDGE, old.size))) != old.head:
                return False
            return _edge_before(fh, old.size) == old.end


def _folder_identity(folder: Path) -> Identity:
    """A folder (a Ray session, a W&B run dir, checkpoints) changes when any file in it does,
    in its linked folders too (``logs/`` or ``default/`` a symlink to another disk), as the readers follow them."""
    listing = hashlib.sha256()
    total = 0
    seen = {os.path.realpath(folder)}
    for root, dirs, files in walk(folder, followlinks=True):
        real = [(d, os.path.realpath(os.path.join(root, d))) for d in sorted(dirs)]
        dirs[:] = [d for d, r in real if r not in seen]  # (a link loop is walked once)
        seen.update(r for _, r in real)
        # (a folder with nothing in it yet is there all the same: a checkpoint being written; and
        # its own time is a checkpoint's, which the analysis reads)
        listing.update("".join(f"{os.path.relpath(os.path.join(root, d), folder)}/\0{_lstat_mtime(os.path.join(root, d))}\n"
                               for d in dirs).encode(errors="surrogateescape"))
        for name in sorted(files):
            try:
                st = os.stat(os.path.join(root, name))
            except OSError:
                continue
            total += st.st_size
            listing.update(f"{os.path.relpath(os.path.join(root, name), folder)}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\n"
                           .encode(errors="surrogateescape"))
    st = folder.stat()
    return Identity(total, st.st_mtime_ns, st.st_ino, listing.hexdigest(), "")


def _lstat_mtime(path: str) -> int | None:
    try:
        return os.lstat(path).st_mtime_ns
    except OSError:
        return None


def local_zone() -> str:
    """This machine's time zone: W&B's and TensorBoard's epoch times are read in it, so an entry
    parsed under one zone is not another's."""
    return f"{os.environ.get('TZ', '')}\0{time.tzname}\0{time.timezone}\0{time.altzone}"


def _edge_before(fh: Any, size: int) -> str:
    fh.seek(max(0, size - EDGE))
    return _sha(fh.read(min(EDGE, size)))


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@cache
def code_digest(whole_package: bool = False) -> str:
    """A digest of the parser code and format tables (with ``whole_package``, also of the analysis
    and the renderers): changed code never serves old entries."""
    # (found, not imported: ``reports`` imports Polars)
    forensics, parsers, reports = (_package_folder(name) for name in ("forensics", "parsers", "reports"))
    digest = hashlib.sha256()
    # (what shapes a parse entry: the readers, how the run loader calls them, how entries are spliced)
    roots = [parsers, *(forensics / name for name in ("parsed.py", "readers.py", "cache.py", "identity.py"))]
    if whole_package:
        roots += [forensics, reports]
    for root in roots:
        files = sorted(root.rglob("*")) if root.is_dir() else [root]
        for file in files:
            if file.suffix in (".py", ".json", ".html", ".js", ".css") and "__pycache__" not in file.parts:
                digest.update(file.name.encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()


def _package_folder(name: str) -> Path:
    spec = find_spec(name)
    assert spec is not None and spec.submodule_search_locations, name
    return Path(next(iter(spec.submodule_search_locations)))
