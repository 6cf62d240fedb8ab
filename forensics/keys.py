"""The metric keys an analysis reads, as one regex: ``analyze`` keeps only these.

An AReaL table prints about a hundred values a step, an SGLang stats line about ten; the
detectors, causes, observations and reports read about twenty of the first (the reward, loss,
gradient norm, advantages and reward spread, optimizer skips, step timings), four of the second
(token usage, running and queued requests, generation throughput), the server's counts of
requests answered (``/generate``, and any other: a server still answering health checks after
the last step shows the trainer stopped, not the logs) and every memory (``mem/…``) series. Keeping only those, from the moment
they are read, is most of what a long run's metric frames would otherwise add to the peak memory.
``grpo-forensics metrics`` and the library's ``analyze(keys=None)`` keep every key.

Whoever makes a detector or a report read a new key adds its pattern here;
``tests/test_keys.py`` analyzes every fixture run both ways and fails if anything differs.
"""

from __future__ import annotations

import re

from forensics.detect import PRIMARY_CANDIDATES, PRIMARY_SUFFIXES
from forensics.server_context import ANSWERED, SERVER_STATS

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
    *SERVER_STATS,
    "time_ms",  # step durations (observations.slow_start, align.reconstruct_times)
    "timing_s/step",
    "perf/time_per_step",
    "perf/max_memory_reserved_gb",  # verl's device memory (compare's peak)
)
_PREFIXES = ("phase/", "timing_s/", "timeperf/", "mem/")

#: Every key a detector, cause, observation or report of ``analyze`` reads.
ANALYSIS_KEYS = "|".join(
    [
        "(?:" + "|".join(re.escape(e) for e in _ENDINGS) + ")$",
        "^(?:" + "|".join(re.escape(w) for w in _WHOLE) + ")$",
        "^(?:" + "|".join(re.escape(p) for p in _PREFIXES) + ")",
        r"advantages/(?:.*/)?(?:avg|min|max|mean)$",  # detect.learning_signals
        ANSWERED,
        r"^sglang/http/",  # any request the server answered: it went on (detect.stall)
    ]
)
