"""grpo-forensics: post-mortems for GRPO training runs, as a library.

    >>> from pathlib import Path
    >>> from forensics import analyze
    >>> run = analyze([Path("outputs/")]).runs[0]  # doctest: +SKIP
    >>> run.incidents[0].onset_step, run.recommendation.checkpoint  # doctest: +SKIP

The names below are imported on first use, so ``import forensics`` (and the command's entry point,
which must configure Polars' allocator before Polars loads) imports nothing heavy.
"""

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from forensics.analysis import analyze, analyze_each, analyze_run
    from forensics.cache import ParseCache, default_cache_dir
    from forensics.detect import Thresholds
    from forensics.errors import (
        ForensicsError,
        NoCheckpoint,
        NoCheckpointBeforeIncident,
        NoCheckpointSaved,
        NoRunsFound,
        PathNotFound,
        UnusableInput,
    )
    from forensics.model import Analysis, Checkpoint, Evidence, Incident, Recommendation, RunAnalysis
    from forensics.texts import with_messages

_HOMES = {
    "analysis": ("analyze", "analyze_each", "analyze_run"),
    "cache": ("ParseCache", "default_cache_dir"),
    "detect": ("Thresholds",),
    "errors": ("ForensicsError", "NoCheckpoint", "NoCheckpointBeforeIncident", "NoCheckpointSaved", "NoRunsFound",
               "PathNotFound", "UnusableInput"),
    "model": ("Analysis", "Checkpoint", "Evidence", "Incident", "Recommendation", "RunAnalysis"),
    "texts": ("with_messages",),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}

__all__ = [
    "Analysis",
    "Checkpoint",
    "Evidence",
    "ForensicsError",
    "Incident",
    "NoCheckpoint",
    "NoCheckpointBeforeIncident",
    "NoCheckpointSaved",
    "NoRunsFound",
    "ParseCache",
    "PathNotFound",
    "Recommendation",
    "RunAnalysis",
    "Thresholds",
    "UnusableInput",
    "analyze",
    "analyze_each",
    "analyze_run",
    "default_cache_dir",
    "with_messages",
]


def __getattr__(name: str) -> _typing.Any:
    if name not in _HOME_OF:
        raise AttributeError(f"module 'forensics' has no attribute {name!r}")
    value = getattr(_importlib.import_module(f"forensics.{_HOME_OF[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
