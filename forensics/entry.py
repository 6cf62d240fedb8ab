"""The ``grpo-forensics`` command: process-wide settings first, then the command line.

Polars' allocator reads its settings when Polars is first imported, so they are made here, before
:mod:`forensics.cli` (and with it Polars) is imported; ``import forensics`` itself imports nothing heavy.
"""

from __future__ import annotations

from forensics.allocator import return_freed_memory_promptly, reuse_block_memory


def main() -> None:
    """Console-script entry point."""
    return_freed_memory_promptly()
    reuse_block_memory()
    from forensics.cli import app

    app()
