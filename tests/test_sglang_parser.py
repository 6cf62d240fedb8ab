"""``parsers.read_sglang_log`` on real SGLang excerpts and on logs written the way each SGLang
version (0.3 → 0.5.2x) writes them (``shared/formats/sglang.md`` §2–§7)."""

from __future__ import annotations

import gzip
import os
from datetime import datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from parsers import looks_like_areal, read_sglang_log
from parsers.schema import EVENT_SCHEMA, METRIC_SCHEMA
from parsers.sglang import HTTP_SCHEMA, SERVER_SCHEMA, looks_like_sglang

SAMPLES = Path(__file__).parents[2] / "shared" / "samples" / "real" / "sglang"


def kinds(log) -> list[tuple[int, str]]:
    return list(zip(log.events["line"].to_list(), log.events["kind"].to_list(), strict=True))


def series(log, key: str) -> list[float]:
    return log.metrics.filter(pl.col("key") == key).sort("line")["value"].to_list()


def write(tmp_path: Path, lines: list[str], name: str = "llm_server.log") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


# --- Real excerpts: the events a reader lists for each, and the stats where there are some -------

REAL = {
    # Startup at info level, then the warm-up request fails: ready, then the launch failure.
    "issue11949_v05_startup_uvicorn_warmup_failed.log": {
        "events": [(9, "server_ready"), (10, "server_launch_failed")],
        "metrics": {"sglang/max_total_num_tokens": [154231.0], "sglang/cuda_graph_capture_s": [3.21],
                    "mem/cuda_graph_gb": [0.93], "sglang/max_running_requests": [2409.0]},
    },
    # verl: torch_memory_saver cannot map memory on resume (GPU OOM), the trainer's resume calls time out.
    "issue14092_verl_resume_memory_occupation_oom.log": {
        "events": [(2, "cuda_oom"), (3, "request_timeout"), (4, "cuda_oom"), (5, "request_timeout"), (6, "request_timeout")],
        "metrics": {},
    },
    # Five decode lines in one second at 94% KV usage with a queue: no failure line.
    "issue14972_decode_high_usage_queue.log": {
        "events": [],
        "metrics": {"sglang/token_usage": [0.94], "sglang/running_req": [6.0], "sglang/queue_req": [5.0],
                    "sglang/gen_throughput": [445.73], "sglang/used_tokens": [1920.0], "sglang/decode_lines": [5.0]},
    },
    # The parent's sigquit line comes before the child's traceback (cut before its exception).
    "issue1969_ktransformers_sigquit_scheduler_exception.log": {
        "events": [(2, "child_crash"), (3, "scheduler_exception")],
        "metrics": {},
    },
    # Log-collector prefix; PD decode lines with speculative fields.
    "issue22511_pd_decode_collector_prefix.log": {
        "events": [],
        "metrics": {"sglang/token_usage": [0.22, 0.22], "sglang/running_req": [1.0, 1.0], "sglang/queue_req": [0.0, 0.0],
                    "sglang/gen_throughput": [0.39, 43.98], "sglang/accept_len": [2.10, 2.60], "sglang/retracted_req": [0.0, 0.0]},
    },
    # 0.5.13 prefill line with #pending-token and input throughput; image-processor warnings are no event.
    "issue26082_v0513_pending_token_ci.log": {
        "events": [],
        "metrics": {"sglang/new_seq": [1.0], "sglang/new_token": [11.0], "sglang/cached_token": [12.0],
                    "sglang/pending_token": [0.0], "sglang/input_throughput": [11.79], "sglang/cuda_graph": [0.0]},
    },
    # 0.4.x decode and prefill (cache hit rate) lines around access lines.
    "issue3424_decode_access_idle_prefill.log": {
        "events": [],
        "metrics": {"sglang/gen_throughput": [50.47, 50.41, 50.34, 46.21], "sglang/cache_hit_rate": [0.8075, 0.8076],
                    "sglang/new_token": [632.0, 170.0]},
    },
    # TP8 startup: every rank prints the capacity line; it counts once.
    "issue4161_capture_end_max_total_num_tokens_tp8.log": {
        "events": [],
        "metrics": {"sglang/max_total_num_tokens": [201681.0], "sglang/context_len": [163840.0]},
    },
    # 0.4.4 lines (largest-len, trailing comma), queue draining from 68.
    "issue4759_prefill_decode_v044_largest_len.log": {
        "events": [],
        "metrics": {"sglang/queue_req": [0.0, 0.0, 68.0, 68.0, 66.0, 63.0, 61.0, 54.0], "sglang/largest_len": [0.0],
                    "sglang/accept_len": [2.54]},
    },
    # Batch dump tail, py-spy missing, then the watchdog fires.
    "issue7553_watchdog_timeout.log": {
        "events": [(5, "watchdog_timeout")],
        "metrics": {},
    },
}


def test_every_real_excerpt_has_an_expectation() -> None:
    assert sorted(p.name for p in SAMPLES.glob("*.log")) == sorted(REAL)


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_excerpts(name: str) -> None:
    path = SAMPLES / name
    log = read_sglang_log(path)
    expected = REAL[name]
    assert kinds(log) == expected["events"]
    for key, values in expected["metrics"].items():
        assert series(log, key) == pytest.approx(values), key
    if not expected["metrics"]:
        assert log.metrics.filter(pl.col("key").cast(pl.String).str.starts_with("sglang/")).is_empty()
    assert log.lines == len(path.read_bytes().splitlines())
    assert log.unparsed_lines == 1  # the "# source:" header
    assert looks_like_sglang(path)
    assert dict(log.events.schema) == EVENT_SCHEMA and dict(log.metrics.schema) == METRIC_SCHEMA
    assert dict(log.http.schema) == HTTP_SCHEMA and dict(log.servers.schema) == SERVER_SCHEMA
    assert set(log.events["source"].to_list()) <= {"sglang"}
    assert log.metrics["time"].null_count() == 0 and log.metrics["step"].null_count() == log.metrics.height


def test_real_excerpt_details() -> None:
    log = read_sglang_log(SAMPLES / "issue3424_decode_access_idle_prefill.log")
    assert log.http.select("minute", "endpoint", "method", "status", "count").rows() == [
        (datetime(2025, 2, 9, 10, 14), "/v1/chat/completions", "POST", 200, 2)
    ]
    assert log.servers["version_hint"].to_list() == ["0.3.1-0.4.3"]
    assert read_sglang_log(SAMPLES / "issue4759_prefill_decode_v044_largest_len.log").servers["version_hint"].to_list() == ["0.4.4"]
    assert read_sglang_log(SAMPLES / "issue4161_capture_end_max_total_num_tokens_tp8.log").servers["version_hint"].to_list() == [
        "0.4.2-0.4.3"
    ]
    startup = read_sglang_log(SAMPLES / "issue11949_v05_startup_uvicorn_warmup_failed.log")
    assert startup.servers.select("instance", "first_line", "port").rows() == [(0, 2, 9316)]
    assert startup.events.filter(pl.col("kind") == "server_launch_failed")["severity"].to_list() == ["fatal"]
    collector = read_sglang_log(SAMPLES / "issue22511_pd_decode_collector_prefix.log")
    assert collector.metrics.filter(pl.col("key") == "sglang/token_usage")["time"].to_list() == [
        datetime(2026, 5, 16, 12, 44, 55), datetime(2026, 5, 16, 12, 44, 57)
    ]
    assert collector.http["count"].to_list() == [1]


# --- Stats lines of every version → the same keys ------------------------------------------------

VARIANTS = {
    "0.3.0 time-only": (
        "[16:43:29 TP0] Prefill batch. #new-seq: 2, #new-token: 70, #cached-token: 5, cache hit rate: 6.67%, #running-req: 0, #queue-req: 3",
        "[16:43:30 TP0] Decode batch. #running-req: 2, #token: 140, token usage: 0.01, gen throughput (token/s): 25.50, #queue-req: 3",
    ),
    "0.3.4 mixed chunk": (
        "[2024-10-01 16:43:29 TP0] Prefill batch(mixed #running-req: 2). #new-seq: 2, #new-token: 70, #cached-token: 5, cache hit rate: 6.67%, token usage: 0.01, #queue-req: 3",
        "[2024-10-01 16:43:30 TP0] Decode batch. #running-req: 2, #token: 140, token usage: 0.01, gen throughput (token/s): 25.50, #queue-req: 3",
    ),
    "0.4.3": (
        "[2025-02-09 11:06:40 TP0] Prefill batch. #new-seq: 2, #new-token: 70, #cached-token: 5, cache hit rate: 6.67%, token usage: 0.01, #running-req: 0, #queue-req: 3",
        "[2025-02-09 11:06:41 TP0] Decode batch. #running-req: 2, #token: 140, token usage: 0.01, gen throughput (token/s): 25.50, #queue-req: 3",
    ),
    "0.4.4 trailing comma": (
        "[2025-03-24 02:56:20 TP0] Prefill batch. #new-seq: 2, #new-token: 70, #cached-token: 5, token usage: 0.01, #running-req: 0, #queue-req: 3, ",
        "[2025-03-24 02:56:21 TP0] Decode batch. #running-req: 2, #token: 140, token usage: 0.01, accept len: 2.54, gen throughput (token/s): 25.50, largest-len: 0, #queue-req: 3, ",
    ),
    "0.4.7 cuda graph, no rank tag": (
        "[2025-06-01 10:00:00] Prefill batch. #new-seq: 2, #new-token: 70, #cached-token: 5, token usage: 0.01, #running-req: 0, #queue-req: 3",
        "[2025-06-01 10:00:01] Decode batch. #running-req: 2, #token: 140, token usage: 0.01, cuda graph: True, gen throughput (token/s): 25.50, #queue-req: 3",
    ),
    "0.4.9 prefill #token, hybrid SWA": (
        "[2025-07-01 10:00:00 TP1] Prefill batch. #new-seq: 2, #new-token: 70, #cached-token: 5, #token: 75, token usage: 0.01, #running-req: 0, #queue-req: 3",
        "[2025-07-01 10:00:01 TP1] Decode batch. #running-req: 2, #token: full=140, swa=90, token usage: full=0.01, swa=0.02, cuda graph: True, gen throughput (token/s): 25.50, #queue-req: 3",
    ),
    "0.5.4 forward counter": (
        "[2025-10-01 10:00:00 DP1 TP1 EP1] Prefill batch [101], #new-seq: 2, #new-token: 70, #cached-token: 5, token usage: 0.01, #running-req: 0, #queue-req: 3, ",
        "[2025-10-01 10:00:01 DP1 TP1 EP1] Decode batch [102], #running-req: 2, #token: 140, token usage: 0.01, cuda graph: True, gen throughput (token/s): 25.50, #queue-req: 3, ",
    ),
    "0.5.5 comma separator, ms": (
        "[2025-11-11 04:27:58.123] Prefill batch, #new-seq: 2, #new-token: 70, #cached-token: 5, token usage: 0.01, #running-req: 0, #queue-req: 3, ",
        "[2025-11-11 04:27:59.456] Decode batch, #running-req: 2, #token: 140, token usage: 0.01, cuda graph: True, gen throughput (token/s): 25.50, #queue-req: 3, ",
    ),
    "0.5.9 MFU suffix": (
        "[2026-01-10 10:00:00 PP0 TP1] Prefill batch, #new-seq: 2, #new-token: 70, #cached-token: 5, token usage: 0.01, #running-req: 0, #queue-req: 3, input throughput (token/s): 123.40, cuda graph: True",
        "[2026-01-10 10:00:01 PP0 TP1] Decode batch, #running-req: 2, #token: 140, token usage: 0.01, cuda graph: True, gen throughput (token/s): 25.50, #queue-req: 3, est. decode TFLOPS/s (per GPU): 12.30, est. read BW (GB/s per GPU): 900.10, est. write BW (GB/s per GPU): 10.20",
    ),
    "0.5.2x hybrid SWA, pending tokens": (
        "[2026-05-28 08:41:19] Prefill batch, #new-seq: 2, #new-token: 70, #cached-token: 5, full token usage: 0.01, swa token usage: 0.02, #running-req: 0, #queue-req: 3, #pending-token: 0, cuda graph: False, input throughput (token/s): 123.40",
        "[2026-05-28 08:41:20] Decode batch, #running-req: 2, #full token: 140, full token usage: 0.01, #swa token: 90, swa token usage: 0.02, cuda graph: True, gen throughput (token/s): 25.50, #queue-req: 3",
    ),
}


@pytest.mark.parametrize("version", sorted(VARIANTS))
def test_stats_lines_of_every_version_give_the_same_keys(tmp_path: Path, version: str) -> None:
    prefill, decode = VARIANTS[version]
    log = read_sglang_log(write(tmp_path, [prefill, decode]))
    assert series(log, "sglang/new_seq") == [2.0]
    assert series(log, "sglang/new_token") == [70.0]
    assert series(log, "sglang/cached_token") == [5.0]
    assert series(log, "sglang/queue_req") == [3.0, 3.0]
    assert series(log, "sglang/running_req") == ([2.0] if "mixed" in version else [0.0]) + [2.0]
    assert series(log, "sglang/token_usage")[-1] == 0.01
    assert series(log, "sglang/gen_throughput") == [25.5]
    assert series(log, "sglang/used_tokens")[-1] == 140.0
    assert log.unparsed_lines == 0 and log.events.is_empty()
    assert log.metrics["time"].null_count() == 0


def test_extra_stats_fields_keep_their_names(tmp_path: Path) -> None:
    prefill, decode = VARIANTS["0.5.9 MFU suffix"]
    log = read_sglang_log(write(tmp_path, [prefill, decode]))
    assert series(log, "sglang/input_throughput") == [123.4]
    assert series(log, "sglang/est_decode_tflops_s_per_gpu") == [12.3]
    assert series(log, "sglang/cuda_graph") == [1.0, 1.0]
    swa = read_sglang_log(write(tmp_path, list(VARIANTS["0.5.2x hybrid SWA, pending tokens"]), "swa.log"))
    assert series(swa, "sglang/swa_token_usage") == [0.02, 0.02]
    assert series(swa, "sglang/cache_hit_rate") == []
    # 0.4.9 paired the pools' values, ``full=…, swa=…``: the SWA ones are the same series as after.
    paired = read_sglang_log(write(tmp_path, list(VARIANTS["0.4.9 prefill #token, hybrid SWA"]), "paired.log"))
    assert (series(paired, "sglang/swa_token_usage"), series(paired, "sglang/swa_token")) == ([0.02], [90.0])
    # HiSparse keeps part of the KV cache on the CPU: its GPU share is the memory pressure.
    sparse = read_sglang_log(write(tmp_path, ["[2026-05-28 08:41:20] Decode batch, #running-req: 5, #gpu token: 500, gpu token "
                                              "usage: 0.31, #cpu token: 900, cpu token usage: 0.21, cuda graph: True, gen throughput "
                                              "(token/s): 99.99, #queue-req: 6"], "sparse.log"))
    assert (series(sparse, "sglang/token_usage"), series(sparse, "sglang/used_tokens")) == ([0.31], [500.0])
    assert series(sparse, "sglang/cpu_token_usage") == [0.21]
    old = read_sglang_log(write(tmp_path, list(VARIANTS["0.4.3"]), "old.log"))
    assert series(old, "sglang/cache_hit_rate") == [pytest.approx(0.0667)]


def test_busy_log_is_folded_per_second_and_rank(tmp_path: Path) -> None:
    decode = "[2025-11-11 10:00:{s:02d} DP{dp} TP0] Decode batch, #running-req: {r}, #token: 100, token usage: 0.50, cuda graph: True, gen throughput (token/s): 10.00, #queue-req: 0, "
    lines = [decode.format(s=s, dp=dp, r=i) for s in range(3) for i in range(50) for dp in (0, 1)]
    log = read_sglang_log(write(tmp_path, lines))
    running = log.metrics.filter(pl.col("key") == "sglang/running_req")
    assert running.height == 6  # 3 seconds x 2 DP ranks
    assert set(running["value"].to_list()) == {49.0}  # the last line of each second
    assert series(log, "sglang/decode_lines") == [50.0] * 6
    assert any("Decode/Prefill stats lines: 300, kept as 6 samples" in note for note in log.notes)


# --- Prefixes, dates, tqdm -----------------------------------------------------------------------

def test_time_only_prefix_takes_the_date_of_the_wrapper_line_and_rolls_over_midnight(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        [
            "20251111-23:59:57.100 SGLangServer Wrapper INFO: Launch command: python3 -m sglang.launch_server --port 30000",
            "[23:59:58 TP0] Decode batch. #running-req: 1, #token: 10, token usage: 0.01, gen throughput (token/s): 5.00, #queue-req: 0",
            "[23:59:59 TP0] Decode out of memory happened. #retracted_reqs: 1, #new_token_ratio: 0.0980 -> 0.9446",
            "[00:00:01 TP0] Decode batch. #running-req: 1, #token: 20, token usage: 0.02, gen throughput (token/s): 5.00, #queue-req: 0",
            "[00:00:02 TP0] Decode batch. #running-req: 1, #token: 30, token usage: 0.03, gen throughput (token/s): 5.00, #queue-req: 0",
        ],
    )
    log = read_sglang_log(path)
    times = log.metrics.filter(pl.col("key") == "sglang/token_usage")["time"].to_list()
    assert times == [datetime(2025, 11, 11, 23, 59, 58), datetime(2025, 11, 12, 0, 0, 1), datetime(2025, 11, 12, 0, 0, 2)]
    # the wrapper's launch line is an event too, read with AReaL's patterns and its own time
    assert kinds(log) == [(1, "server_launch"), (3, "kv_cache_retract")]
    assert log.events["time"].to_list() == [datetime(2025, 11, 11, 23, 59, 57, 100000), datetime(2025, 11, 11, 23, 59, 59)]
    assert log.events["source"].to_list() == ["areal", "sglang"]
    assert series(log, "sglang/new_token_ratio") == [0.9446]
    assert log.unparsed_lines == 0
    assert not any("modification time" in note for note in log.notes)
    assert log.servers.select("instance", "port", "launch_time").rows() == [(0, 30000, datetime(2025, 11, 11, 23, 59, 57, 100000))]


def test_time_only_prefix_without_any_date_uses_the_file_mtime(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        [
            "[23:59:59 TP0] Decode batch. #running-req: 1, #token: 10, token usage: 0.01, gen throughput (token/s): 5.00, #queue-req: 0",
            "[00:00:03 TP0] Decode batch. #running-req: 1, #token: 20, token usage: 0.02, gen throughput (token/s): 5.00, #queue-req: 0",
        ],
    )
    stamp = datetime(2024, 9, 3, 8, 0, 0).timestamp()
    os.utime(path, (stamp, stamp))
    log = read_sglang_log(path)
    times = log.metrics.filter(pl.col("key") == "sglang/token_usage")["time"].to_list()
    assert times == [datetime(2024, 9, 2, 23, 59, 59), datetime(2024, 9, 3, 0, 0, 3)]
    assert any("modification time (2024-09-03)" in note for note in log.notes)


def test_records_after_tqdm_bars_ray_docker_prefixes_and_ansi(tmp_path: Path) -> None:
    bar = "Capturing batches (bs=1 avail_mem=10.83 GB): 100%|██████████| 5/5 [00:01<00:00,  3.10it/s]"
    path = write(
        tmp_path,
        [
            bar + "\r" + bar + "\r[2025-11-11 09:00:10 TP0] Capture cuda graph end. Time elapsed: 1.50 s. mem usage=0.50 GB. avail mem=10.00 GB.",
            "Loading safetensors checkpoint shards: 100% Completed | 2/2 [00:01<00:00,  1.2it/s][2025-11-11 09:00:11 TP0] Watchdog timeout (self.watchdog_timeout=300)",
            bar + "\r[2025-11-11 09:00:12 TP0] Decode batch, #running-req: 3, #token: 30, token usage: 0.03, cuda graph: True, gen throughput (token/s): 5.00, #queue-req: 1, ",
            "(SGLangHttpServer pid=6612, ip=10.0.0.3) [2025-11-11 09:00:13 TP1] KV cache pool is full. Retract requests. #retracted_reqs: 2, #new_token_ratio: 0.1000 -> 0.5000",
            "sglang-1  | [2025-11-11 09:00:14] Health check failed. Server couldn't get a response from detokenizer for last 20 seconds. tic start time: 09:00:00. last_heartbeat time: 08:59:40",
            "\x1b[31m[2025-11-11 09:00:15] Received sigquit from a child process. It usually means the child failed.\x1b[0m",
            bar,
        ],
    )
    log = read_sglang_log(path)
    assert kinds(log) == [(2, "watchdog_timeout"), (4, "kv_cache_retract"), (5, "health_check_failed"), (6, "child_crash")]
    assert "\x1b" not in "".join(log.events["message"].to_list())
    assert series(log, "sglang/cuda_graph_capture_s") == [1.5]
    assert series(log, "sglang/queue_req") == [1.0]
    assert log.metrics.filter(pl.col("key") == "sglang/queue_req")["time"].to_list() == [datetime(2025, 11, 11, 9, 0, 12)]
    assert log.unparsed_lines == 0


def test_crlf_ray_prefixed_stats_and_access(tmp_path: Path) -> None:
    path = tmp_path / "llm_server.log"
    path.write_bytes(
        b"(SGLangHttpServer pid=12, ip=10.0.0.1) [2025-11-11 09:00:00 TP0] Decode batch, #running-req: 3, #token: 9, "
        b"token usage: 0.50, cuda graph: True, gen throughput (token/s): 5.00, #queue-req: 7\r\n"
        b'(SGLangHttpServer pid=12, ip=10.0.0.1) [2025-11-11 09:00:00] INFO:     1.2.3.4:5 - "POST /generate HTTP/1.1" 200 OK\r\n'
        b"(SGLangHttpServer pid=12, ip=10.0.0.1) [2025-11-11 09:00:01] Received sigquit from a child process. It usually means the child failed.\r\n"
    )
    log = read_sglang_log(path)
    assert series(log, "sglang/queue_req") == [7.0] and series(log, "sglang/token_usage") == [0.5]
    assert log.http["endpoint"].to_list() == ["/generate"]
    assert kinds(log) == [(3, "child_crash")]
    assert log.unparsed_lines == 0


def test_areal_wrapper_lines_are_read_with_areal_patterns(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        [
            "20251112-05:00:00.000 SGLangServer Wrapper INFO: Launch command: python3 -m sglang.launch_server --host 172.17.0.2 --port 30000 --log-level warning",
            "\x1b[1;38;2;180;140;80m(AReaL)\x1b[0m \x1b[92m20251112-05:00:40.000 SGLangServer Wrapper INFO: SGLang server launched at: http://172.17.0.2:30000\x1b[0m",
            "[2025-11-12 05:09:00] Received sigquit from a child process. It usually means the child failed.",
            "20251112-05:09:08.114 SGLangServer Wrapper INFO: SGLang server http://172.17.0.2:30000 exits, returncode=-9",
        ],
    )
    log = read_sglang_log(path)
    assert kinds(log) == [(1, "server_launch"), (2, "server_ready"), (3, "child_crash"), (4, "server_exit")]
    assert log.events["source"].to_list() == ["areal", "areal", "sglang", "areal"]
    assert log.events["severity"].to_list() == ["info", "info", "error", "error"]  # exit -9 is AReaL's error
    assert log.unparsed_lines == 0
    assert log.servers.select("instance", "port", "ready_time").rows() == [(0, 30000, datetime(2025, 11, 12, 5, 0, 40))]
    assert any("warning level" in note for note in log.notes)
    assert looks_like_sglang(path)


# --- Failures ------------------------------------------------------------------------------------

def test_scheduler_traceback_ending_in_cuda_oom_is_one_cuda_oom_event(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        [
            "[2025-11-12 05:08:59 TP0] Decode batch, #running-req: 8, #token: 900, token usage: 0.99, cuda graph: True, gen throughput (token/s): 10.00, #queue-req: 40, ",
            "[2025-11-12 05:09:00 TP0] Scheduler hit an exception: Traceback (most recent call last):",
            '  File "/sglang/python/sglang/srt/managers/scheduler.py", line 2714, in run_scheduler_process',
            "    scheduler.event_loop_overlap()",
            '  File "/usr/lib/python3/dist-packages/torch/utils/_contextlib.py", line 116, in decorate_context',
            "    return func(*args, **kwargs)",
            "           ^^^^^^^^^^^^^^^^^^^^^",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.14 GiB of which 1.02 GiB is free.",
            "",
            "[2025-11-12 05:09:00] Received sigquit from a child process. It usually means the child failed.",
            "Killed",
        ],
    )
    log = read_sglang_log(path)
    assert kinds(log) == [(2, "cuda_oom"), (10, "child_crash"), (11, "process_killed")]
    oom = log.events.row(0, named=True)
    assert oom["time"] == datetime(2025, 11, 12, 5, 9) and oom["severity"] == "error"
    assert "Scheduler hit an exception" in oom["message"] and "torch.OutOfMemoryError" in oom["message"]
    assert log.events.filter(pl.col("kind") == "process_killed")["time"].to_list() == [datetime(2025, 11, 12, 5, 9)]
    assert log.unparsed_lines == 0


def test_chained_and_standalone_tracebacks(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        [
            "[2025-11-12 05:00:00] ERROR:    Exception in ASGI application",
            "Traceback (most recent call last):",
            '  File "/sglang/srt/entrypoints/http_server.py", line 1, in generate',
            "ValueError: bad request",
            "[2025-11-12 05:00:05 TP0] Cache not flushed because there are pending requests. #queue-req: 0, #running-req: 3",
            "[2025-11-12 05:00:05 TP0] Scheduler hit an exception: Traceback (most recent call last):",
            '  File "/sglang/srt/managers/scheduler.py", line 10, in update_weights',
            "    assert flush_cache_success",
            "AssertionError",
            "",
            "During handling of the above exception, another exception occurred:",
            "",
            "Traceback (most recent call last):",
            '  File "/sglang/srt/managers/scheduler.py", line 12, in run',
            "AssertionError: Cache flush failed after updating weights",
            "[2025-11-12 05:00:06 TP0] Scheduler hit an exception: Traceback (most recent call last):",
            '  File "/sglang/srt/managers/schedule_batch.py", line 5, in alloc',
            "RuntimeError: Prefill out of memory. Try to lower your batch size.",
            "Try to allocate 4096 tokens.",
            "Available tokens: 12",
            "Traceback (most recent call last):",
            '  File "/x.py", line 1, in <module>',
            "KeyError: 'rid'",
        ],
    )
    log = read_sglang_log(path)
    assert kinds(log) == [(1, "traceback"), (5, "cache_flush_failed"), (6, "cache_flush_failed"), (16, "kv_cache_oom"), (21, "traceback")]
    assert log.events.filter(pl.col("line") == 5)["severity"].to_list() == ["error"]
    assert log.unparsed_lines == 0


def test_millions_of_lines_of_no_known_shape_are_counted_not_kept(tmp_path: Path, monkeypatch) -> None:
    """A server at NCCL_DEBUG=INFO: its chatter is counted as unparsed and let go batch by batch
    (each line held to the end cost half a kilobyte: 480 MB of it took 3.3 GB). Tracebacks among it
    keep their message lines, and every event, time and count is what it is with nothing let go."""
    from parsers import sglang

    chatter = [f"vm:1184:{n} [{n % 8}] NCCL INFO Channel {n % 32:02d}/32 : 0[{n % 8}] -> 1[{n % 8}] via P2P/IPC" for n in range(30_000)]
    tracebacks = [
        "Traceback (most recent call last):",
        '  File "/sglang/srt/managers/schedule_batch.py", line 5, in alloc',
        "RuntimeError: Prefill out of memory. Try to lower your batch size.",
        "Try to allocate 4096 tokens.",
        "[2025-11-12 05:00:06 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/x.py", line 1, in <module>',
        "KeyError: 'rid'",
    ]
    stats = "[2025-11-12 05:00:0{} TP0] Decode batch, #running-req: 8, #token: 900, token usage: 0.50, cuda graph: True, gen throughput (token/s): 10.00, #queue-req: 0, "
    path = write(tmp_path, [stats.format(1), *chatter, *tracebacks, *chatter, stats.format(9), "Killed", *chatter[:100]])
    sifted = read_sglang_log(path)
    monkeypatch.setattr(sglang, "_DULL_FLOOR", 10**9)
    whole = read_sglang_log(path)
    assert kinds(sifted) == kinds(whole) == [(30_002, "kv_cache_oom"), (30_006, "scheduler_exception"), (60_010, "process_killed")]
    assert sifted.events.drop("line").equals(whole.events.drop("line"))
    # (held whole, the chatter after the last traceback read as its message lines, all 30,000 of them)
    assert 60_100 - sglang._NEAR <= sifted.unparsed_lines <= 60_100 and whole.unparsed_lines == 30_100
    assert sifted.metrics.equals(whole.metrics)
    # On 2 M lines of chatter (190 MB), held whole at over 1 GB (about 510 MB let go: benchmarks/HISTORY.md),
    # the batches let all but a few go (what a process's peak memory shows varies with the machine's load).
    big = tmp_path / "big" / "llm_server.log"
    big.parent.mkdir()
    with big.open("w") as out:
        out.write(stats.format(1) + "\n")
        for _ in range(66):
            out.write("\n".join(chatter) + "\n")
        out.write(stats.format(9) + "\n")
    monkeypatch.undo()
    let_go, sift = [], sglang._without_dull

    def counted(kept, rules):
        kept, dull = sift(kept, rules)
        let_go.append(dull)
        return kept, dull

    monkeypatch.setattr(sglang, "_without_dull", counted)
    assert read_sglang_log(big).unparsed_lines == 66 * 30_000
    assert sum(let_go) >= 66 * 30_000 - 100 * len(let_go)


def test_failure_lines_of_all_kinds(tmp_path: Path) -> None:
    lines = {
        "[2026-01-05 10:00:00] Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)": "watchdog_timeout",
        "[2026-01-05 10:00:01] Subprocess scheduler_0 (pid=4242) crashed with exit code -9. Triggering SIGQUIT for cleanup...": "process_killed",
        "[2026-01-05 10:00:02] Subprocess detokenizer (pid=4243) crashed with exit code 1. Triggering SIGQUIT for cleanup...": "child_crash",
        "[2026-01-05 10:00:03] SIGQUIT received. signum=3, frame=None. It usually means one child failed.": "child_crash",
        "[rank2]:[E210 02:06:33.394775308 ProcessGroupNCCL.cpp:1595] [PG ID 2 PG GUID 3 Rank 2] Process group watchdog thread terminated with exception: [Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=_ALLGATHER_BASE, NumelIn=1, NumelOut=8, Timeout(ms)=600000) ran for 600094 milliseconds before timing out.": "nccl_timeout",
        "[2026-01-05 10:00:04 TP0] Failed to update parameter online: size mismatch. The full weights of the ModelRunner are partially updated. Please discard the whole weights.": "weight_update_failed",
        "[2026-01-05 10:00:05] [http_server] Error: Request is disconnected from the client side (type 1). Abort request obj.rid='3f2a9c'": "client_disconnected",
        "[2026-01-05 10:00:06] Initialization failed. warmup error: Connection refused": "server_launch_failed",
        "[2026-01-05 10:00:07] SIGTERM received. signum=15 frame=None. Draining requests and shutting down...": "server_exit",
        "[ 8123.456789] Out of memory: Killed process 12345 (python3) total-vm:123456789kB, anon-rss:98765432kB": "host_oom_kill",
        "/bin/bash: line 1: 31337 Killed                  python3 -m sglang.launch_server --port 30000": "process_killed",
        "[2026-01-05 10:00:08 TP3] Decode out of memory. Try to lower your batch size.": "kv_cache_oom",
    }
    log = read_sglang_log(write(tmp_path, list(lines)))
    assert [k for _, k in kinds(log)] == list(lines.values())
    assert log.unparsed_lines == 0
    assert log.servers["version_hint"].to_list() == [">=0.5.10"]


# --- HTTP access lines ---------------------------------------------------------------------------

def test_access_lines_are_counted_per_minute_endpoint_and_status(tmp_path: Path) -> None:
    lines = []
    for s in range(0, 120, 2):
        lines.append(f'[2025-11-11 10:{s // 60:02d}:{s % 60:02d}] INFO:     10.0.0.2:{40000 + s} - "POST /generate HTTP/1.1" 200 OK')
        lines.append(f'[2025-11-11 10:{s // 60:02d}:{s % 60:02d}] INFO:     10.0.0.2:{50000 + s} - "GET /health?probe=1 HTTP/1.1" 200 OK')
    lines.append('[2025-11-11 10:01:59] INFO:     10.0.0.2:45678 - "POST /update_weights_from_disk HTTP/1.1" 400 Bad Request')
    lines.append('INFO:     127.0.0.1:53412 - "POST /generate HTTP/1.1" 200 OK')  # 0.3.0: no timestamp
    log = read_sglang_log(write(tmp_path, lines))
    rows = log.http.select("minute", "endpoint", "status", "count").rows()
    ten, eleven = datetime(2025, 11, 11, 10, 0), datetime(2025, 11, 11, 10, 1)
    assert sorted(rows) == sorted(
        [(ten, "/generate", 200, 30), (ten, "/health", 200, 30), (eleven, "/generate", 200, 31),
         (eleven, "/health", 200, 30), (eleven, "/update_weights_from_disk", 400, 1)]
    )
    assert kinds(log) == [(121, "weight_update_failed")]
    assert log.unparsed_lines == 0 and log.metrics.is_empty()


def test_an_access_line_with_non_ascii_text_before_its_request_keeps_its_method(tmp_path: Path) -> None:
    # The request is cut where `` - "`` is found: a byte offset, on a line whose characters are wider.
    lines = [
        '[2025-11-11 10:00:01] INFO:     10.0.0.2:40000 - "POST /generate HTTP/1.1" 200 OK',
        '[2025-11-11 10:00:02] INFO:     hôte-ü:40001 - "POST /generate HTTP/1.1" 200 OK',
        '[2025-11-11 10:00:03] INFO:     hôte-ü:40002 - "POST /update_weights_from_disk HTTP/1.1" 500 Internal Server Error',
    ]
    log = read_sglang_log(write(tmp_path, lines))
    assert sorted(log.http.select("endpoint", "method", "status", "count").rows()) == [
        ("/generate", "POST", 200, 2), ("/update_weights_from_disk", "POST", 500, 1)
    ]
    assert kinds(log) == [(3, "weight_update_failed")] and log.unparsed_lines == 0


# --- Several servers in one file -----------------------------------------------------------------

def test_servers_relaunched_into_the_same_file_are_told_apart(tmp_path: Path) -> None:
    decode = "[2025-11-11 {t}] Decode batch, #running-req: 1, #token: 10, token usage: 0.01, cuda graph: True, gen throughput (token/s): 5.00, #queue-req: 0, "
    path = write(
        tmp_path,
        [
            "20251111-09:00:00.000 SGLangServer Wrapper INFO: Launch command: python3 -m sglang.launch_server --host 10.0.0.1 --port 30000",
            "[2025-11-11 09:00:05] server_args=ServerArgs(model_path='/m', host='10.0.0.1', port=30000, tp_size=1, log_level='info')",
            "[2025-11-11 09:00:20] Load weight begin. avail mem=78.50 GB",
            "[2025-11-11 09:00:30] Load weight end. type=Qwen2ForCausalLM, dtype=torch.bfloat16, avail mem=63.99 GB, mem usage=14.51 GB.",
            "[2025-11-11 09:00:31] KV Cache is allocated. #tokens: 812345, K size: 21.69 GB, V size: 21.69 GB",
            "[2025-11-11 09:00:39] INFO:     Uvicorn running on http://10.0.0.1:30000 (Press CTRL+C to quit)",
            "[2025-11-11 09:00:40] The server is fired up and ready to roll!",
            decode.format(t="09:01:00"),
            "Killed",
            "20251111-10:00:00.000 SGLangServer Wrapper INFO: Launch command: python3 -m sglang.launch_server --host 10.0.0.1 --port 30001",
            "[2025-11-11 10:00:05] server_args=ServerArgs(model_path='/m', host='10.0.0.1', port=30001, tp_size=1, log_level='info')",
            "[2025-11-11 10:00:39] INFO:     Uvicorn running on http://10.0.0.1:30001 (Press CTRL+C to quit)",
            "[2025-11-11 10:00:40] The server is fired up and ready to roll!",
            decode.format(t="10:01:00"),
        ],
    )
    log = read_sglang_log(path)
    assert log.servers.select("instance", "first_line", "last_line", "port", "concurrent").rows() == [
        (0, 1, 9, 30000, False), (1, 10, 14, 30001, False)
    ]
    assert log.servers["launch_time"].to_list() == [datetime(2025, 11, 11, 9), datetime(2025, 11, 11, 10)]
    assert log.servers["ready_time"].to_list() == [datetime(2025, 11, 11, 9, 0, 39), datetime(2025, 11, 11, 10, 0, 39)]
    assert [k for _, k in kinds(log)] == ["server_launch", "server_launch", "server_ready", "server_ready", "process_killed",
                                          "server_launch", "server_launch", "server_ready", "server_ready"]
    assert series(log, "mem/kv_cache_gb") == [43.38]
    assert series(log, "mem/weights_gb") == [14.51]
    assert series(log, "mem/available_gb") == [78.5, 63.99]
    assert series(log, "sglang/kv_cache_tokens") == [812345.0]
    assert not any("told apart" in note for note in log.notes)


def test_server_that_died_while_starting_is_not_concurrent_with_its_relaunch(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        [
            "20251111-09:00:00.000 SGLangServer Wrapper INFO: Launch command: python3 -m sglang.launch_server --host 10.0.0.1 --port 30000",
            "[2025-11-11 09:00:20] Scheduler hit an exception: Traceback (most recent call last):",
            "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
            "20251111-09:00:21.000 SGLangServer Wrapper INFO: SGLang server http://10.0.0.1:30000 exits, returncode=1",
            "20251111-09:01:00.000 SGLangServer Wrapper INFO: Launch command: python3 -m sglang.launch_server --host 10.0.0.1 --port 30000",
            "20251111-09:01:40.000 SGLangServer Wrapper INFO: SGLang server launched at: http://10.0.0.1:30000",
        ],
    )
    log = read_sglang_log(path)
    assert kinds(log) == [(1, "server_launch"), (2, "server_launch_failed"), (4, "server_exit"), (5, "server_launch"), (6, "server_ready")]
    assert log.servers.select("instance", "first_line", "last_line", "ready_time", "concurrent").rows() == [
        (0, 1, 4, None, False), (1, 5, 6, datetime(2025, 11, 11, 9, 1, 40), False)
    ]


def test_a_relaunch_on_the_same_port_ends_a_server_that_died_silently_while_starting(tmp_path: Path) -> None:
    # No exit line (the wrapper was killed too): the port tells a relaunch from a second server.
    path = write(
        tmp_path,
        [
            "20251111-09:00:00.000 SGLangServer Wrapper INFO: Launch command: python3 -m sglang.launch_server --host 10.0.0.1 --port 30000",
            "[2025-11-11 09:00:05] server_args=ServerArgs(model_path='/m', host='10.0.0.1', port=30000, tp_size=1, log_level='info')",
            "Killed",
            "20251112-09:00:00.000 SGLangServer Wrapper INFO: Launch command: python3 -m sglang.launch_server --host 10.0.0.1 --port 30000",
            "[2025-11-12 09:00:05] server_args=ServerArgs(model_path='/m', host='10.0.0.1', port=30000, tp_size=1, log_level='info')",
            "20251112-09:00:40.000 SGLangServer Wrapper INFO: SGLang server launched at: http://10.0.0.1:30000",
        ],
    )
    log = read_sglang_log(path)
    assert log.servers.select("instance", "first_line", "last_line", "ready_time", "concurrent").rows() == [
        (0, 1, 3, None, False), (1, 4, 6, datetime(2025, 11, 12, 9, 0, 40), False)
    ]
    assert not any("cannot be told apart" in note for note in log.notes)
    # The same without AReaL's wrapper: SGLang's own server_args line starts each instance.
    plain = read_sglang_log(write(tmp_path, [line for line in path.read_text().splitlines() if "Wrapper" not in line], "plain.log"))
    assert plain.servers.select("first_line", "last_line", "concurrent").rows() == [(1, 2, False), (3, 3, False)]


def test_servers_launched_together_are_flagged(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        [
            "20251111-09:00:00.000 SGLangServer Wrapper INFO: Launch command: python3 -m sglang.launch_server --host 10.0.0.1 --port 30000",
            "20251111-09:00:00.100 SGLangServer Wrapper INFO: Launch command: python3 -m sglang.launch_server --host 10.0.0.1 --port 30001",
            "[2025-11-11 09:00:30] Some warning from either server",
            "20251111-09:00:40.000 SGLangServer Wrapper INFO: SGLang server launched at: http://10.0.0.1:30001",
            "20251111-09:00:41.000 SGLangServer Wrapper INFO: SGLang server launched at: http://10.0.0.1:30000",
        ],
    )
    log = read_sglang_log(path)
    assert log.servers.select("instance", "first_line", "last_line", "port", "concurrent").rows() == [
        (0, 1, 5, 30000, True), (1, 2, 5, 30001, True)
    ]
    assert log.servers["ready_time"].to_list() == [datetime(2025, 11, 11, 9, 0, 41), datetime(2025, 11, 11, 9, 0, 40)]
    assert any("cannot be told apart" in note for note in log.notes)


# --- Damaged input -------------------------------------------------------------------------------

def test_gzip_and_invalid_utf8(tmp_path: Path) -> None:
    text = (
        b"[2025-11-12 05:08:59 TP0] Decode batch, #running-req: 8, #token: 900, token usage: 0.99, cuda graph: True, gen throughput (token/s): 10.00, #queue-req: 40, \n"
        b'[2025-11-12 05:08:59] INFO:     10.0.0.2:40000 - "POST /generate HTTP/1.1" 200 OK\n'
    )
    damaged = text + b"\xff\xfe garbage \x00\n" + b"[2025-11-12 05:09:00 TP0] Scheduler hit an exception: Traceback (most recent call last):\n" + (
        b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    )
    plain = tmp_path / "llm_server.log"
    plain.write_bytes(damaged)
    zipped = tmp_path / "llm_server.log.1.gz"
    zipped.write_bytes(gzip.compress(damaged))
    for path in (plain, zipped):
        log = read_sglang_log(path)
        assert kinds(log) == [(4, "cuda_oom")]
        assert series(log, "sglang/token_usage") == [0.99]
        assert log.http["count"].to_list() == [1]
        assert log.lines == 5 and log.unparsed_lines == 1
        assert looks_like_sglang(path)


def test_empty_binary_and_foreign_files_do_not_raise(tmp_path: Path) -> None:
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    junk = tmp_path / "junk.log"
    junk.write_bytes(bytes(range(256)) * 100)
    trainer = tmp_path / "trainer.log"
    trainer.write_text("20251111-11:37:11.251 StatsLogger INFO: Epoch 2/5 Step 5/935 Train step 940/4675 done.\n")
    log = read_sglang_log(empty)
    assert log.lines == 0 and log.events.is_empty() and log.metrics.is_empty() and log.servers.is_empty()
    assert read_sglang_log(junk).unparsed_lines > 0
    assert not looks_like_sglang(empty) and not looks_like_sglang(junk) and not looks_like_sglang(trainer)
    assert looks_like_areal(trainer)
    foreign = read_sglang_log(trainer)
    assert foreign.unparsed_lines == 0 and foreign.events.is_empty() and foreign.servers.is_empty()
    assert foreign.notes == ("no SGLang server lines in this file",)


# --- Busy logs: what is folded away still shows where it matters ---------------------------------

def test_failed_requests_stay_one_event_each(tmp_path: Path) -> None:
    ok = '[2025-11-11 10:00:{s:02d}] INFO:     10.0.0.2:{p} - "POST /generate HTTP/1.1" 200 OK'
    failed = '[2025-11-11 10:00:{s:02d}] INFO:     10.0.0.2:{p} - "POST /update_weights_from_disk HTTP/1.1" 400 Bad Request'
    lines = [ok.format(s=s, p=40000 + s) for s in range(50)] + [failed.format(s=s, p=50000 + s) for s in (51, 51, 52)]
    log = read_sglang_log(write(tmp_path, lines))
    assert kinds(log) == [(51, "weight_update_failed"), (52, "weight_update_failed"), (53, "weight_update_failed")]
    assert log.events["time"].to_list() == [datetime(2025, 11, 11, 10, 0, 51)] * 2 + [datetime(2025, 11, 11, 10, 0, 52)]
    assert sorted(log.http.select("endpoint", "status", "count", "first_line").rows()) == [
        ("/generate", 200, 50, 1), ("/update_weights_from_disk", 400, 3, 51)
    ]


def test_untimed_lines_take_the_time_of_the_line_just_before(tmp_path: Path) -> None:
    lines = []
    for s in range(40):
        lines.append(f"[2025-11-11 10:00:{s:02d}] Cache flushed successfully!")
        lines.append(f'[2025-11-11 10:00:{s:02d}] INFO:     10.0.0.2:{40000 + s} - "POST /generate HTTP/1.1" 200 OK')
    lines.append("Loading safetensors checkpoint shards: 100% Completed | 5/5 [00:01<00:00,  4.07it/s]")
    lines.append("Killed")
    log = read_sglang_log(write(tmp_path, lines))
    assert kinds(log) == [(82, "process_killed")]
    assert log.events["time"].to_list() == [datetime(2025, 11, 11, 10, 0, 39)]
    assert log.unparsed_lines == 0


def test_repeated_server_instances_get_the_same_version_hint(tmp_path: Path) -> None:
    lines = []
    for day in (11, 12, 13, 14):
        lines += [
            f"202511{day}-09:00:00.000 SGLangServer Wrapper INFO: Launch command: python3 -m sglang.launch_server --port 30000",
            f"[2025-11-{day} 09:00:05] server_args=ServerArgs(model_path='/m', port=30000, log_level='info')",
            f"[2025-11-{day} 09:00:40] The server is fired up and ready to roll!",
        ]
        lines += [
            f"[2025-11-{day} 09:01:{s:02d}] Decode batch. #running-req: 3, #token: 30, token usage: 0.03, "
            f"cuda graph: {s % 2 == 0}, gen throughput (token/s): 5.00, #queue-req: 1, "
            for s in range(30)
        ]
        lines.append(f"202511{day}-09:02:00.000 SGLangServer Wrapper INFO: SGLang server http://10.0.0.1:30000 exits, returncode=0")
    log = read_sglang_log(write(tmp_path, lines))
    assert log.servers.height == 4
    assert log.servers["version_hint"].n_unique() == 1 and log.servers["version_hint"][0] is not None


def _busy_log(dated: bool) -> list[str]:
    """A bit of everything, long enough to span many (shrunken) batches and fold blocks."""
    lines = ["20251111-23:50:00.000 SGLangServer Wrapper INFO: Launch command: python3 -m sglang.launch_server --port 30000"]
    start = datetime(2025, 11, 11, 23, 50)
    for i in range(400):
        s = (start + timedelta(seconds=10 * i)).strftime("%Y-%m-%d %H:%M:%S" if dated else "%H:%M:%S")
        lines += [
            f'[{s}] INFO:     10.0.0.2:{40000 + i} - "POST /generate HTTP/1.1" 200 OK',
            f"[{s} TP{i % 2}] Decode batch, #running-req: {i}, #token: 100, token usage: 0.50, cuda graph: True, "
            "gen throughput (token/s): 10.00, #queue-req: 0, ",
            f"[{s}] Prefill batch. #new-seq: 4, #new-token: {i}, #cached-token: 0, token usage: 0.31, #running-req: 2, #queue-req: 0, ",
            f"[{s}] Cache flushed successfully!",
        ]
        if i % 7 == 0:
            lines.append(f"[{s}] Update engine weights online from disk begin. avail mem={i / 10:.2f} GB")
            lines.append("Loading safetensors checkpoint shards: 100% Completed | 5/5 [00:01<00:00,  4.07it/s]")
        if i % 50 == 0:
            lines += [f"[{s} TP0] Scheduler hit an exception: Traceback (most recent call last):",
                      '  File "x.py", line 1, in f', "RuntimeError: CUDA error: out of memory", "Killed"]
        if i % 60 == 0:
            lines.append(f'[{s}] INFO:     10.0.0.2:5 - "POST /update_weights_from_disk HTTP/1.1" 400 Bad Request')
            lines.append(f"[{s}] Decode batch(mixed #running-req: 2). #running-req: 2, #token: 9, token usage: 0.01")
            lines.append(f"[{s}] Finish: obj=GenerateReqInput(text='hello')")
    return lines


def _same(a, b) -> None:
    for name in ("events", "http", "servers"):
        assert getattr(a, name).drop("file", strict=False).equals(getattr(b, name).drop("file", strict=False)), name
    assert a.metrics.drop("file").sort("line", "key").equals(b.metrics.drop("file").sort("line", "key"))
    assert (a.lines, a.unparsed_lines, a.notes) == (b.lines, b.unparsed_lines, b.notes)


@pytest.mark.parametrize("dated", [True, False])
@pytest.mark.parametrize("per_minute", [False, True])
def test_batches_do_not_change_the_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dated: bool, per_minute: bool) -> None:
    """... folded per minute or not: a minute on both sides of a batch's edge is folded as one."""
    import parsers.sglang as sglang

    path = write(tmp_path, _busy_log(dated))
    monkeypatch.setattr(sglang, "_FOLD_BLOCK", 8)
    whole = read_sglang_log(path, stats_per_minute=per_minute)
    assert whole.events.height > 10 and whole.metrics.height > (300 if per_minute else 1000) and whole.http.height > 5
    assert whole.metrics["time"].null_count() == 0 and whole.metrics["time"].max() > datetime(2025, 11, 12)
    monkeypatch.setattr(sglang, "_BATCH_LINES", 64)
    _same(read_sglang_log(path, stats_per_minute=per_minute), whole)
    zipped = tmp_path / "llm_server.log.gz"
    zipped.write_bytes(gzip.compress(path.read_bytes()))
    _same(read_sglang_log(zipped, stats_per_minute=per_minute), whole)


def test_an_instance_without_stats_takes_no_clue_from_its_neighbours_stats(tmp_path: Path) -> None:
    # Version clues are kept per kind of stats line between other lines, not per line: an
    # instance that died before any stats line must still get none from the instances around it.
    def instance(day: int, stats: bool) -> list[str]:
        lines = [
            f"202511{day}-09:00:00.000 SGLangServer Wrapper INFO: Launch command: python3 -m sglang.launch_server --port 30000",
            f"[2025-11-{day} 09:00:05] server_args=ServerArgs(model_path='/m', port=30000, log_level='info')",
        ]
        if stats:
            lines += [f"[2025-11-{day} 09:01:{s:02d}] Decode batch. #running-req: 3, #token: 30, token usage: 0.03, "
                      "cuda graph: True, gen throughput (token/s): 5.00, #queue-req: 1, " for s in range(5)]
        return lines + [f"202511{day}-09:02:00.000 SGLangServer Wrapper INFO: SGLang server http://10.0.0.1:30000 exits, returncode=1"]

    log = read_sglang_log(write(tmp_path, instance(11, True) + instance(12, False) + instance(13, True)))
    alone = read_sglang_log(write(tmp_path, instance(12, False), "alone.log"))
    hints = log.servers["version_hint"].to_list()
    assert hints[0] == hints[2] != alone.servers["version_hint"][0]
    assert hints[1] == alone.servers["version_hint"][0]
    assert "conflicting" not in hints[0]


def test_a_chained_scheduler_oom_re_raised_as_a_plain_error_is_an_oom(tmp_path: Path) -> None:
    """The scheduler's CUDA OOM, re-raised as a ``RuntimeError``: the chain's end names no kind, its
    root does, and the message names both (as AReaL's and Ray's readers do)."""
    stamp = "2025-11-10 09:42:44"
    lines = [f"[{stamp} TP0] Scheduler hit an exception: Traceback (most recent call last):",
             '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2912, in run_scheduler_process',
             "    scheduler.event_loop_overlap()",
             "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
             "",
             "The above exception was the direct cause of the following exception:",
             "",
             "Traceback (most recent call last):",
             '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2915, in run_scheduler_process',
             "    raise RuntimeError('scheduler failed')",
             "RuntimeError: scheduler failed",
             f"[{stamp}] Received sigquit from a child process. It usually means the child failed."]
    path = tmp_path / "llm_server.log"
    path.write_text("\n".join(lines) + "\n")
    events = read_sglang_log(path).events
    [oom] = events.filter(pl.col("kind") == "cuda_oom").rows(named=True)
    assert oom["line"] == 1 and "CUDA out of memory" in oom["message"] and oom["message"].endswith("RuntimeError: scheduler failed")
    plain = tmp_path / "plain.log"  # a plain error alone stays what it was
    plain.write_text("\n".join(lines[:3] + lines[10:]) + "\n")
    assert "cuda_oom" not in read_sglang_log(plain).events["kind"].to_list()
