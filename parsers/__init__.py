"""Sources → frames. Pure functions: a path in, Polars frames out, nothing written.

One module per source: ``areal`` (AReaL/realhf text logs), ``areal_checkpoints``,
``areal_config``, ``sglang`` (``llm_server.log``), ``ray`` (session folders and driver
consoles), ``verl`` and ``verl_checkpoints``, ``wandb_run``, ``tensorboard``, ``custom``
(hand-rolled loops and user TOML formats). Line formats are data in ``parsers/formats/``.

The names below are imported on first use: ``import parsers`` (as the import of any one module
of it does) loads no parser, and no Polars.
"""

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from parsers.areal import AReaLLog, looks_like_areal, read_areal_log
    from parsers.areal_checkpoints import read_areal_checkpoints
    from parsers.custom import CustomLog, load_custom_format, looks_like_custom_loop, read_custom_log
    from parsers.ray import RaySession, find_ray_sessions, read_ray_console, read_ray_session
    from parsers.schema import CHECKPOINT_SCHEMA, EVENT_SCHEMA, METRIC_SCHEMA, STEP_SCHEMA
    from parsers.sglang import SGLangLog, looks_like_sglang, read_sglang_log
    from parsers.tensorboard import TensorboardRun, read_tensorboard
    from parsers.verl import VerlLog, looks_like_verl_log, read_verl_log
    from parsers.verl_checkpoints import read_verl_checkpoints
    from parsers.wandb_run import WandbRun, WandbUnavailable, read_wandb_online, read_wandb_runs

_HOMES = {
    "areal": ("AReaLLog", "looks_like_areal", "read_areal_log"),
    "areal_checkpoints": ("read_areal_checkpoints",),
    "custom": ("CustomLog", "load_custom_format", "looks_like_custom_loop", "read_custom_log"),
    "ray": ("RaySession", "find_ray_sessions", "read_ray_console", "read_ray_session"),
    "schema": ("CHECKPOINT_SCHEMA", "EVENT_SCHEMA", "METRIC_SCHEMA", "STEP_SCHEMA"),
    "sglang": ("SGLangLog", "looks_like_sglang", "read_sglang_log"),
    "tensorboard": ("TensorboardRun", "read_tensorboard"),
    "verl": ("VerlLog", "looks_like_verl_log", "read_verl_log"),
    "verl_checkpoints": ("read_verl_checkpoints",),
    "wandb_run": ("WandbRun", "WandbUnavailable", "read_wandb_online", "read_wandb_runs"),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}

__all__ = [
    "CHECKPOINT_SCHEMA",
    "EVENT_SCHEMA",
    "METRIC_SCHEMA",
    "STEP_SCHEMA",
    "AReaLLog",
    "CustomLog",
    "RaySession",
    "SGLangLog",
    "TensorboardRun",
    "VerlLog",
    "WandbRun",
    "WandbUnavailable",
    "find_ray_sessions",
    "load_custom_format",
    "looks_like_areal",
    "looks_like_custom_loop",
    "looks_like_sglang",
    "looks_like_verl_log",
    "read_areal_checkpoints",
    "read_areal_log",
    "read_custom_log",
    "read_ray_console",
    "read_ray_session",
    "read_sglang_log",
    "read_tensorboard",
    "read_verl_checkpoints",
    "read_verl_log",
    "read_wandb_online",
    "read_wandb_runs",
]


def __getattr__(name: str) -> _typing.Any:
    if name not in _HOME_OF:
        raise AttributeError(f"module 'parsers' has no attribute {name!r}")
    value = getattr(_importlib.import_module(f"parsers.{_HOME_OF[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
