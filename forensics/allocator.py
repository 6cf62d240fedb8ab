"""glibc's malloc, set once per process for reading logs in blocks of megabytes.

By default glibc hands each block (a ``bytes`` of 16 MB) a fresh memory map, whose pages the
kernel zero-fills and faults in, and unmaps it when freed: more time than the read itself. With
the map threshold at its maximum (32 MiB) and the trim threshold above two blocks, a freed block's
memory stays in the heap for the next one. Polars allocates with its own jemalloc: unaffected.

The library leaves process-wide settings to whoever owns the process: the command line and the
fleet's worker processes call :func:`reuse_block_memory`.
"""

from __future__ import annotations

import ctypes
import sys

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD = 32 << 20  # glibc's ceiling for this setting on 64-bit systems
_TRIM_THRESHOLD = 64 << 20


def reuse_block_memory() -> bool:
    """Keep freed read blocks in the heap (glibc only); whether the settings took."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))
