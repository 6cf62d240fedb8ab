"""The process's two allocators, set once per process for reading logs of gigabytes.

glibc's malloc holds the read blocks. By default it hands each block (a ``bytes`` of 16 MB) a
fresh memory map, whose pages the kernel zero-fills and faults in, and unmaps it when freed: more
time than the read itself. With the map threshold at its maximum (32 MiB) and the trim threshold
above two blocks, a freed block's memory stays in the heap for the next one
(:func:`reuse_block_memory`).

Polars allocates its frames with its own jemalloc, which Polars sets to hand freed pages back
after half a second, lazily (``MADV_FREE``: they stay in the process's resident memory until the
kernel is short of it), so the leftovers of one source's parse still count while the next one's
parse peaks. Handed back for good (``MADV_DONTNEED``) after the same half second, the peak of the
benchmark's 3 GB run falls by about a seventh at the same speed. Handed back by the threads that
allocate rather than by jemalloc's background thread (Polars' build starts one), by another
10-20 %, for 5-10 % more time: the parses keep both cores busy, the background thread falls
behind, and a parse's resident memory then climbs with its length (and its peak with how the
threads happen to be scheduled) although what it holds does not
(:func:`return_freed_memory_promptly`). jemalloc reads its settings once, when Polars is
imported: this must happen before.

The library leaves process-wide settings to whoever owns the process: the command line
(``forensics.entry``) and the fleet's worker processes call these.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD = 32 << 20  # glibc's ceiling for this setting on 64-bit systems
_TRIM_THRESHOLD = 64 << 20


def _glibc(name: str, *argtypes: type) -> Callable[..., int] | None:
    """glibc's function ``name`` (returning an int), or ``None`` where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None
    function.argtypes, function.restype = list(argtypes), ctypes.c_int
    return function


def reuse_block_memory() -> bool:
    """Keep freed read blocks in the heap (glibc only); whether the settings took."""
    mallopt = _glibc("mallopt", ctypes.c_int, ctypes.c_int)
    if mallopt is None:
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))


def hand_back_heap() -> bool:
    """Give glibc's freed heap memory back to the system (the read blocks kept for reuse while
    logs were read, tens of MB, and the holes between live objects); whether any was given back.

    Called once the reading is done, so an analysis' peak does not carry the reading's leftovers.
    """
    malloc_trim = _glibc("malloc_trim", ctypes.c_size_t)
    return malloc_trim is not None and bool(malloc_trim(0))


#: Polars' jemalloc settings: freed pages are handed back for good after 500 ms by the threads
#: that go on allocating (100 ms lowers the peak more but costs ~8 % more time in page faults).
POLARS_MALLOC_CONF = "background_thread:false,dirty_decay_ms:500,muzzy_decay_ms:0"
_POLARS_MALLOC_ENV = "_RJEM_MALLOC_CONF"  # jemalloc's MALLOC_CONF under the prefix Polars builds it with
#: What ``import polars`` puts there when it finds nothing (a child of a process that imported
#: Polars inherits it): not a user's choice. Polars appends a user's setting to it, so ours wins.
_POLARS_DEFAULT = "dirty_decay_ms:500,muzzy_decay_ms:1000"


def return_freed_memory_promptly() -> bool:
    """Have Polars' allocator give freed memory back for good within a second, as the process goes
    on allocating (a process that only sleeps keeps some); whether it will.

    Only before Polars is first imported (later the setting is not read) and only when the user
    has not configured it. Child processes (the fleet's workers) inherit it.
    """
    if "polars" in sys.modules or os.environ.get(_POLARS_MALLOC_ENV, _POLARS_DEFAULT) != _POLARS_DEFAULT:
        return False
    os.environ[_POLARS_MALLOC_ENV] = POLARS_MALLOC_CONF
    return True
