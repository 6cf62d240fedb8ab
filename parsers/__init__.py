"""Sources → frames. Pure functions: a path in, Polars frames out, nothing written."""

from parsers.areal import AReaLLog, looks_like_areal, read_areal_log
from parsers.schema import EVENT_SCHEMA, METRIC_SCHEMA, STEP_SCHEMA
from parsers.sglang import SGLangLog, looks_like_sglang, read_sglang_log  # noqa: F401

__all__ = [
    "EVENT_SCHEMA",
    "METRIC_SCHEMA",
    "STEP_SCHEMA",
    "AReaLLog",
    "looks_like_areal",
    "read_areal_log",
]
