"""The metric keys an analysis reads, as one regex: ``analyze`` keeps only those of a log's tables.

An AReaL table prints about a hundred values a step; the detectors, causes, observations and
reports read about twenty of them (the reward, loss, gradient norm, advantages and reward spread,
optimizer skips, step timings) plus every server (``sglang/…``) and memory (``mem/…``) series.
Keeping only those is most of the difference between a long run's metric frame growing by
gigabytes and by a few hundred megabytes. ``grpo-forensics metrics`` and the library's
``analyze(keys=None)`` keep every key.

Whoever makes a detector or a report read a new key adds its pattern here;
``tests/test_keys.py`` analyzes every fixture run both ways and fails if anything differs.
"""

from __future__ import annotations

import re

from forensics.detect import PRIMARY_CANDIDATES, PRIMARY_SUFFIXES

_ENDINGS = (
    *PRIMARY_SUFFIXES,
    "loss",  # the loss (detect.learning_signals), non-finite values (detect.non_finite)
    "actor_loss/avg",
    "grad_norm",
    "reward/std",  # a group's reward spread: all zero in a dead batch
    "score/std",
    "update_successful",  # a skipped optimizer step
)
_WHOLE = (
    *PRIMARY_CANDIDATES,
    "time_ms",  # step durations (observations.slow_start, align.reconstruct_times)
    "timing_s/step",
    "perf/time_per_step",
)
_PREFIXES = ("phase/", "timing_s/", "timeperf/", "mem/", "sglang/")

#: Every key a detector, cause, observation or report of ``analyze`` reads.
ANALYSIS_KEYS = "|".join(
    [
        "(?:" + "|".join(re.escape(e) for e in _ENDINGS) + ")$",
        "^(?:" + "|".join(re.escape(w) for w in _WHOLE) + ")$",
        "^(?:" + "|".join(re.escape(p) for p in _PREFIXES) + ")",
        r"advantages/(?:.*/)?(?:avg|min|max|mean)$",  # detect.learning_signals
    ]
)
