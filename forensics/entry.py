"""The ``grpo-forensics`` command: process-wide settings first, then the command line.

Polars' allocator reads its settings when Polars is first imported, so they are made here, before
:mod:`forensics.cli` (and with it Polars) is imported; ``import forensics`` itself imports nothing heavy.
"""

from __future__ import annotations

import os
import sys

from forensics.allocator import return_freed_memory_promptly, reuse_block_memory


def main() -> None:
    """Console-script entry point."""
    return_freed_memory_promptly()
    reuse_block_memory()
    for stream in (sys.stdout, sys.stderr):  # an ASCII or Latin-1 terminal gets '?' for '–', not a crash
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")
    from forensics.cli import app

    stdout = _identity(1)
    try:
        app()
    except SystemExit as exc:
        # rich's and click's help end with 1 when the reader closed the pipe (``--help | head -1``),
        # stdout sent to /dev/null first: the reader had enough, which is no failure.
        asked_help = "--help" in sys.argv[1:]  # (not a command's own exit 1: --fail-on-incident | head)
        if exc.code == 1 and asked_help and stdout not in (None, _identity(1)) and _identity(1) == _identity(os.devnull):
            raise SystemExit(0) from None
        raise


def _identity(file: int | str) -> tuple[int, int] | None:
    """Which file a descriptor or path is (device, inode), or ``None``."""
    try:
        info = os.stat(file)
        return info.st_dev, info.st_ino
    except OSError:
        return None
