"""The ``grpo-forensics`` command: process-wide settings first, then the command line.

Polars' allocator reads its settings when Polars is first imported, so they are made here, before
:mod:`forensics.cli` (and with it Polars) is imported; ``import forensics`` itself imports nothing heavy.
"""

from __future__ import annotations

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

    app()
