"""The ``grpo-forensics`` command: process-wide settings first, then the command line.

Polars' allocator reads its settings when Polars is first imported, so they are made here, before
:mod:`forensics.cli` (and with it Polars) is imported; ``import forensics`` itself imports nothing heavy.
Before all of it, a command run before on unchanged inputs is played back (:mod:`forensics.rerun`).
"""

from __future__ import annotations

import os
import sys

from forensics import rerun
from forensics.allocator import return_freed_memory_promptly, reuse_block_memory


def main() -> None:
    """Console-script entry point."""
    for stream in (sys.stdout, sys.stderr):  # an ASCII or Latin-1 terminal gets '?' for '–', not a crash
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")
    # (before the allocator's settings, which are in the environment a record is keyed by)
    played = rerun.played_back(sys.argv[1:])
    if played is not None:
        raise SystemExit(played)
    recording = rerun.record(sys.argv[1:])
    code = None
    try:
        code = _command()
    finally:
        if recording is not None:
            recording.stop(code)
    raise SystemExit(code)


def _command() -> int:
    """Run the command line; its exit code (help and usage errors raise ``SystemExit``)."""
    return_freed_memory_promptly()
    reuse_block_memory()
    from forensics.cli import app

    stdout = _identity(1)
    try:
        # Not standalone: click would print a usage error as a boxed panel of five lines.
        code = app(standalone_mode=False)
    except SystemExit as exc:
        # rich's and click's help end with 1 when the reader closed the pipe (``--help | head -1``),
        # stdout sent to /dev/null first: the reader had enough, which is no failure.
        asked_help = "--help" in sys.argv[1:]  # (not a command's own exit 1: --fail-on-incident | head)
        if exc.code == 1 and asked_help and stdout not in (None, _identity(1)) and _identity(1) == _identity(os.devnull):
            raise SystemExit(0) from None
        raise
    except Exception as exc:
        if _usage_error(exc):
            if str(exc.format_message()).strip():  # type: ignore[attr-defined]  # (no arguments at all: the help was printed)
                print(f"grpo-forensics: {_usage(exc)}", file=sys.stderr)
            raise SystemExit(2) from None
        if type(exc).__name__ == "Abort":  # (Ctrl-C, as click says it)
            print("Aborted!", file=sys.stderr)
            raise SystemExit(1) from None
        raise
    return code if isinstance(code, int) else 0


def _usage_error(exc: Exception) -> bool:
    """A wrong option or argument, as click raises it (its class is typer's vendored click's)."""
    return getattr(exc, "exit_code", None) == 2 and hasattr(exc, "format_message")


def _usage(exc: Exception) -> str:
    """One line for a usage error: the command, what is wrong, where help is."""
    context, names = getattr(exc, "ctx", None), []
    while context is not None and context.parent is not None:  # (the root's name is how it was run: python -m …)
        names.insert(0, context.info_name)
        context = context.parent
    if not names and len(sys.argv) > 1 and not sys.argv[1].startswith("-"):  # (some errors carry no context)
        names = [sys.argv[1]]
    command = " ".join(["grpo-forensics", *names])
    said = " ".join(str(exc.format_message()).split())  # type: ignore[attr-defined]
    return f"{' '.join(names) or 'usage'}: {said} (see {command} --help)"


def _identity(file: int | str) -> tuple[int, int] | None:
    """Which file a descriptor or path is (device, inode), or ``None``."""
    try:
        info = os.stat(file)
        return info.st_dev, info.st_ino
    except OSError:
        return None
