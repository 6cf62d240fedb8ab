"""Sources → frames. Pure functions: a path in, Polars frames out, nothing written.

One module per source: ``areal`` (AReaL/realhf text logs), ``areal_checkpoints``,
``areal_config``, ``sglang`` (``llm_server.log``), ``ray`` (session folders and driver
consoles), ``verl`` and ``verl_checkpoints``, ``wandb_run``, ``tensorboard``, ``custom``
(hand-rolled loops and user TOML formats). Line formats are data in ``parsers/formats/``.
"""

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
