"""Sources → frames. Pure functions: a path in, Polars frames out, nothing written."""

from parsers.areal import AReaLLog, looks_like_areal, read_areal_log
from parsers.schema import EVENT_SCHEMA, METRIC_SCHEMA, STEP_SCHEMA
from parsers.sglang import SGLangLog, looks_like_sglang, read_sglang_log

__all__ = [
    "EVENT_SCHEMA",
    "METRIC_SCHEMA",
    "STEP_SCHEMA",
    "AReaLLog",
    "SGLangLog",
    "looks_like_areal",
    "looks_like_sglang",
    "read_areal_log",
    "read_sglang_log",
]
