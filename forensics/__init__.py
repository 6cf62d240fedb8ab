"""grpo-forensics: post-mortems for GRPO training runs, as a library.

    >>> from pathlib import Path
    >>> from forensics import analyze
    >>> run = analyze([Path("outputs/")]).runs[0]  # doctest: +SKIP
    >>> run.incidents[0].onset_step, run.recommendation.checkpoint  # doctest: +SKIP
"""

from forensics.analysis import analyze, analyze_run
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
    "analyze_run",
    "default_cache_dir",
]
