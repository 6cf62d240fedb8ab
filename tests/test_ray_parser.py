"""Ray sessions and consoles: the real Ray 2.60 sessions and issue excerpts in ``shared/samples``,
plus what the verl fixture builder writes. Expected kinds are what a reader of each file would list."""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import polars as pl
import pytest
from conftest import read_line, tree_state
from verl_builder import VerlRunSpec, nccl_hang_run, ray_oom_kill_run, write_verl_run, zero_score_run

from parsers.ray import RAY_EVENT_SCHEMA, find_ray_sessions, looks_like_ray_session, read_ray_console, read_ray_session
from parsers.schema import EVENT_SCHEMA, conform

SHARED = Path(__file__).resolve().parents[2] / "shared"
SAMPLES = SHARED / "samples" / "ray"
EXCERPTS = SHARED / "samples" / "real" / "ray_verl"
CONTRACT_KINDS = {
    "request_timeout", "connection_refused", "connection_reset", "retries_exhausted", "workflow_failed", "server_launch",
    "server_ready", "server_exit", "server_launch_failed", "health_check_failed", "watchdog_timeout", "scheduler_exception",
    "child_crash", "cuda_oom", "kv_cache_retract", "kv_cache_oom", "host_oom_kill", "nccl_timeout", "nccl_error",
    "illegal_memory_access", "segfault", "fatal_check", "actor_died", "worker_died", "node_dead", "gcs_unreachable",
    "raylet_died", "weight_update_failed", "cache_flush_failed", "traceback", "nan_inf", "overflow_skip",
    "checkpoint_saved", "run_resumed",
}

needs_samples = pytest.mark.skipif(not SAMPLES.is_dir(), reason="shared/samples not present")


def _session(name: str) -> Path:
    return next((SAMPLES / name).glob("session_*"))


def _without_steps(session: Path) -> Path:
    """``session`` with its TaskRunner's verl console (the worker output holding ``step:N``) gone."""
    for out in (session / "logs").glob("worker-*.out"):
        if "step:1 " in out.read_text(errors="replace"):
            out.unlink()
    return session


def _kinds(events: pl.DataFrame) -> set[str]:
    return set(events["kind"])


# ---------------------------------------------------------------------------------------------
# Issue excerpts: one file each, read as a console (they are pasted console or log text)

EXCERPT_KINDS = {
    "issue1158_nccl_alltoall_timeout.log": {"nccl_timeout"},  # two ranks' watchdog lines
    "issue18586_core_worker_log_actor_dead.log": {"actor_died"},  # DEAD notice, creation task raised
    "issue2828_cuda_oom.log": {"cuda_oom"},
    "issue2950_ray_oom_kill.log": {"host_oom_kill"},
    "issue3324_raytaskerror_ncclerror.log": {"nccl_error"},  # a traceback flattened onto one line
    "issue34695_raylet_oom_summary.log": {"host_oom_kill"},
    "issue41676_raylet_out_spilling.log": set(),  # spilling is pressure, not a failure
    "issue45041_agent_log_raylet_terminated.log": {"raylet_died"},
    "issue4921_actor_died_sigkill.log": {"actor_died"},
    "issue7412_step_timing_tail.log": set(),  # the tail of a metric line
}
EXCERPT_COUNTS = {"issue1158_nccl_alltoall_timeout.log": 2, "issue2950_ray_oom_kill.log": 1, "issue4921_actor_died_sigkill.log": 1,
                  "issue3324_raytaskerror_ncclerror.log": 1, "issue45041_agent_log_raylet_terminated.log": 2}


@needs_samples
def test_every_excerpt_has_an_expectation() -> None:
    assert {p.name for p in EXCERPTS.glob("*.log")} == set(EXCERPT_KINDS)


@needs_samples
@pytest.mark.parametrize("name", sorted(EXCERPT_KINDS))
def test_excerpt_yields_the_events_a_reader_would_list(name: str) -> None:
    log = read_ray_console(EXCERPTS / name)
    assert _kinds(log.events) == EXCERPT_KINDS[name]
    if name in EXCERPT_COUNTS:
        assert log.events.height == EXCERPT_COUNTS[name]
    for row in log.events.iter_rows(named=True):
        assert row["message"].strip() in read_line(EXCERPTS / name, row["line"]) or "…" in row["message"]
        assert row["kind"] in CONTRACT_KINDS


@needs_samples
def test_excerpt_details() -> None:
    nccl = read_ray_console(EXCERPTS / "issue1158_nccl_alltoall_timeout.log", year=2025)
    assert set(nccl.events["source"]) == {"torch"}
    assert [t.isoformat() for t in nccl.events["time"]] == ["2025-04-19T10:42:28.858000", "2025-04-19T10:42:28.883000"]
    # Without a year the watchdog's glog header cannot be dated.
    assert read_ray_console(EXCERPTS / "issue1158_nccl_alltoall_timeout.log").events["time"].null_count() == 2

    died = read_ray_console(EXCERPTS / "issue4921_actor_died_sigkill.log").events.row(0, named=True)
    assert died["detail"].startswith("SYSTEM_ERROR (unexpected): connection to the worker lost")

    oom = read_ray_console(EXCERPTS / "issue2950_ray_oom_kill.log").events.row(0, named=True)
    assert oom["severity"] == "fatal" and oom["pid"] == 4100606 and "memory monitor" in oom["detail"]

    flattened = read_ray_console(EXCERPTS / "issue3324_raytaskerror_ncclerror.log").events.row(0, named=True)
    assert flattened["worker"] == "TaskRunner" and flattened["pid"] == 1384013

    summary = read_ray_console(EXCERPTS / "issue34695_raylet_oom_summary.log").events.row(0, named=True)
    assert summary["time"].isoformat() == "2023-04-19T16:22:19.798000" and summary["severity"] == "fatal"

    assert read_ray_console(EXCERPTS / "issue18586_core_worker_log_actor_dead.log").events["detail"].to_list() == ["its constructor raised"]


# ---------------------------------------------------------------------------------------------
# Real Ray 2.60 sessions (shared/samples/ray/*/session_*)

SESSION_KINDS = {
    # os._exit(1) in WorkerDict rank 1: the raylet event, GCS exit and actor records, the owner's DEAD
    # notice; and the worker's own last line (each dead worker's, in every scenario with a death).
    "a_actor_exit": {"worker_died", "actor_died", "worker_last_output"},
    # SIGKILL from outside: Ray records the same shape as a); the signal is nowhere.
    "b_sigkill": {"worker_died", "actor_died", "worker_last_output"},
    # A Python exception: only the TaskRunner's stderr has it (the actors' later destruction is on purpose).
    "c_task_exception": {"traceback"},
    # SIGSEGV in RolloutWorker: its dump (stderr and core-worker log) plus the worker and actor deaths.
    "d_segfault": {"worker_died", "actor_died", "segfault", "worker_last_output"},
    # Ray's memory monitor kills two workers: the kill, and the two actors' deaths with OOM detail.
    "e_oom": {"host_oom_kill", "actor_died", "worker_last_output"},
}
#: What each dead worker printed last (README: a SIGKILL and an os._exit differ only there).
LAST_WORDS = {
    "a_actor_exit": {"[rank1] update_actor step 3: fatal error in collective, exiting"},
    "b_sigkill": {"[rank1] update_actor step 3: waiting for all-reduce"},
    "d_segfault": {"RolloutWorker.generate step 3: reading response buffer",  # its stdout; its stderr ends the dump
                   "Extension modules: msgpack._cmsgpack, google._upb._message, psutil._psutil_linux, charset_normalizer.md, "
                   "charset_normalizer.cd, requests.packages.charset_normalizer.md, requests.packages.chardet.md, "
                   "requests.packages.charset_normalizer.cd, requests.packages.chardet.cd, yaml._yaml, ray._raylet (total: 11)"},
}
SESSION_PIDS = {"a_actor_exit": 32666, "b_sigkill": 471, "d_segfault": 1060}


@needs_samples
@pytest.mark.parametrize("name", sorted(SESSION_KINDS))
def test_session_yields_the_events_a_reader_would_list(name: str) -> None:
    session = read_ray_session(_session(name))
    events = session.events
    assert _kinds(events) == SESSION_KINDS[name]
    assert list(events.columns) == list(RAY_EVENT_SCHEMA)
    assert conform(events, EVENT_SCHEMA).columns == list(EVENT_SCHEMA)
    assert set(events["source"]) == {"ray"}
    # Shutdown (ray.shutdown after the failure) destroys every actor and the node: no alarms from it.
    assert events.filter(pl.col("kind").is_in(["node_dead", "raylet_died", "gcs_unreachable", "log_error"])).is_empty()
    for row in events.iter_rows(named=True):
        if "/events/" not in row["file"]:
            assert row["message"][:60].strip() in read_line(row["file"], row["line"]) or "…" in row["message"]
    if name in SESSION_PIDS:
        deaths = events.filter(pl.col("kind").is_in(["worker_died", "actor_died"]))
        assert set(deaths["pid"]) == {SESSION_PIDS[name]}
        said = events.filter(pl.col("kind") == "worker_last_output")
        assert set(said["message"]) == LAST_WORDS[name] and set(said["pid"]) == {SESSION_PIDS[name]}
        assert (said["time"] == deaths["time"].min()).all() and set(said["severity"]) == {"info"}
        assert deaths["detail"].str.starts_with("SYSTEM_ERROR (unexpected): connection to the worker lost").all()
        assert deaths["time"].null_count() == 0
    assert session.name == _session(name).name and session.started.year == 2026
    assert session.facts["ray_version"] == "2.60.0"


@needs_samples
def test_session_specifics() -> None:
    d = read_ray_session(_session("d_segfault")).events
    crash = d.filter(pl.col("kind") == "segfault")
    # One crash per file, though each dump prints every line raw and again through Ray's logger.
    assert crash.height == 2 and crash["file"].n_unique() == 2
    assert set(crash["worker"]) == {"RolloutWorker"} and set(crash["detail"]) == {"SIGSEGV"}
    assert str(crash["time"].min()) == "2026-11-22 03:12:12.265000"

    e = read_ray_session(_session("e_oom")).events
    oom = e.filter(pl.col("kind") == "host_oom_kill")
    assert {Path(f).name for f in oom["file"]} == {"event_RAYLET.log", "raylet.out", "gcs_server.out"}
    assert set(oom["pid"].drop_nulls()) == {1388, 1389}
    dead = e.filter(pl.col("kind") == "actor_died")
    assert set(dead["worker"]) == {"RolloutWorker", "WorkerDict"}
    assert dead["detail"].str.contains("memory monitor").all()

    c = read_ray_session(_session("c_task_exception")).events.row(0, named=True)
    assert c["pid"] == 703 and c["worker"] == "WorkerDict" and "ZeroDivisionError" in c["message"]
    assert Path(c["file"]).name.endswith("-704.err")


@needs_samples
@pytest.mark.parametrize("zone", ["UTC", "America/Los_Angeles", "Asia/Tokyo"])
def test_a_memory_monitors_kill_is_dated_by_the_sessions_clock_whatever_this_machines_zone(zone: str, monkeypatch) -> None:
    """``events/`` records carry epoch stamps: the kill raylet.out tells at 03:12:27 is dated then in
    every zone the analysis runs in (west of UTC it fell 8 h before the run: a crash at step 1)."""
    import time

    monkeypatch.setenv("TZ", zone)
    time.tzset()
    try:
        events = read_ray_session(_session("e_oom")).events
    finally:
        monkeypatch.undo()
        time.tzset()
    kills = events.filter((pl.col("kind") == "host_oom_kill") & pl.col("file").str.ends_with("event_RAYLET.log"))
    assert [str(t) for t in kills["time"]] == ["2026-11-22 03:12:27"]


@needs_samples
def test_session_workers_and_sources() -> None:
    session = read_ray_session(_session("a_actor_exit"))
    workers = session.workers
    assert workers.height == 8
    assert dict(workers.filter(pl.col("stream") == "out").select("pid", "name").iter_rows()) == {
        32603: "WorkerDict", 32604: "TaskRunner", 32665: "RolloutWorker", 32666: "WorkerDict"
    }
    assert set(workers["name_kind"]) == {"actor"} and set(workers["job_id"]) == {"01000000", "ffffffff"}
    logs = _session("a_actor_exit") / "logs"
    every_file = {str(p) for p in logs.rglob("*") if p.is_file()}
    assert {s.path for s in session.sources} == every_file
    kinds = {Path(s.path).name: s.kind for s in session.sources}
    assert kinds["raylet.out"] == "ray_raylet" and kinds["gcs_server.out"] == "ray_gcs"
    assert kinds["event_RAYLET.log"] == "ray_events" and kinds["event_EXPORT_ACTOR.log"] == "ray_export_events"
    assert kinds["monitor.log"] == "ray_component" and kinds["debug_state.txt"] == "ray_debug_state"
    raylet = next(s for s in session.sources if s.path.endswith("raylet.out"))
    assert raylet.lines == 241 and raylet.unparsed_lines == 0


@needs_samples
@pytest.mark.parametrize(
    ("name", "kinds"),
    [
        ("a_actor_exit", {"worker_died", "actor_died"}),
        ("b_sigkill", {"worker_died", "actor_died"}),
        ("c_task_exception", {"traceback"}),
        ("d_segfault", {"worker_died", "actor_died", "segfault"}),
        ("e_oom", {"host_oom_kill"}),
    ],
)
def test_driver_console_of_each_session(name: str, kinds: set[str]) -> None:
    events = read_ray_console(SAMPLES / name / "driver.log").events
    assert _kinds(events) == kinds
    if name == "c_task_exception":
        # The driver's own traceback, and the one Ray reports from the TaskRunner for rank 1.
        assert events.height == 2 and set(events["worker"].drop_nulls()) == {"WorkerDict"}
    if name == "a_actor_exit":
        traceback = events.filter(pl.col("kind") == "actor_died").row(0, named=True)
        assert traceback["message"].startswith("Traceback (most recent call last): … ray.exceptions.ActorDiedError")
        assert traceback["detail"].startswith("SYSTEM_ERROR (unexpected)")
    if name == "e_oom":
        assert events.height == 1 and "2 worker(s) were killed" in events["message"][0]


@needs_samples
@pytest.mark.parametrize(
    ("name", "said"),
    [("a_actor_exit", "[rank1] update_actor step 3: fatal error in collective, exiting"),
     ("b_sigkill", "[rank1] update_actor step 3: waiting for all-reduce")],
)
def test_an_exit_and_a_sigkill_are_told_apart_by_the_dead_workers_last_line(name: str, said: str) -> None:
    """Ray writes both deaths alike (no signal, no exit code): the crash says what the worker printed last."""
    from forensics import analyze

    [run] = analyze([SAMPLES / name]).runs
    [crash] = [i for i in run.incidents if i.kind == "crash"]
    assert f"A worker process died. The last line it printed: “{said}” (worker-" in crash.summary
    [line] = [e for e in crash.evidence if e.kind == "worker_last_output"]
    assert line.text == said and read_line(line.file, line.line).strip() == said


@needs_samples
def test_each_dead_workers_last_line_is_quoted_as_a_terminal_shows_it(tmp_path: Path) -> None:
    """e_oom: both workers the memory monitor killed are quoted (the first to die was an idle one).
    b_sigkill with the killed worker's stderr ending in a progress bar its \\r updates rewrote, and
    a line that is an event already (a SIGSEGV banner): the bar's last state; the event kept."""
    from forensics import analyze

    [crash] = analyze([SAMPLES / "e_oom"]).runs[0].incidents
    assert "The last lines the dead workers printed: “RolloutWorker started, pid=1388”" in crash.summary
    assert "“[rank1] generate_sequences: building KV cache for step 3”" in crash.summary
    copy = tmp_path / "b"
    shutil.copytree(SAMPLES / "b_sigkill", copy)
    logs = next(copy.glob("session_*/logs"))
    next(logs.glob("worker-ce04*-471.out")).write_text(":job_id:01000000\n:actor_name:WorkerDict\n")
    err = next(logs.glob("worker-ce04*-471.err"))
    bar = "".join(f"\rProcessed prompts: {100 * i // 512:3d}%| {i}/512" for i in range(0, 400, 4))
    err.write_text(err.read_text() + "generating rollouts for step 3\n" + bar)
    [crash] = analyze([copy]).runs[0].incidents
    assert "The last line it printed: “Processed prompts:  77%| 396/512” (worker-ce04" in crash.summary
    err.write_text(err.read_text() + "\n[2026-11-22 03:11:50,400 E 471 471] logging.cc:474: *** SIGSEGV received at time=1795317110 on cpu 1 ***\n")
    run = analyze([copy]).runs[0]
    assert run.events.filter(pl.col("kind") == "segfault").height == 1
    assert "“Processed prompts:" not in run.incidents[0].summary  # its last line is the banner, an event already


@needs_samples
def test_inputs_are_not_touched(tmp_path: Path) -> None:
    copy = tmp_path / "b"
    shutil.copytree(SAMPLES / "b_sigkill", copy)
    before = tree_state(copy)
    read_ray_session(next(copy.glob("session_*")))
    read_ray_console(copy / "driver.log")
    assert tree_state(copy) == before


# ---------------------------------------------------------------------------------------------
# Discovery


@needs_samples
def test_find_ray_sessions_in_the_samples() -> None:
    found = find_ray_sessions(SAMPLES)
    assert [p.parent.name for p in found] == sorted(SESSION_KINDS)
    assert all(looks_like_ray_session(p) for p in found)


@needs_samples
def test_session_latest_counts_once(tmp_path: Path) -> None:
    source = _session("a_actor_exit")
    linked = tmp_path / "ray"
    shutil.copytree(source, linked / source.name)
    os.symlink(source.name, linked / "session_latest")
    assert find_ray_sessions(tmp_path) == [linked / source.name]
    # A copy made with links followed: session_latest is a real folder with the same logs.
    copied = tmp_path / "copied"
    shutil.copytree(linked, copied, symlinks=False)
    assert not (copied / "session_latest").is_symlink()
    assert find_ray_sessions(copied) == [copied / source.name]
    # Only session_latest survived: it is the session.
    alone = tmp_path / "alone"
    shutil.copytree(source, alone / "session_latest")
    assert find_ray_sessions(alone) == [alone / "session_latest"]
    assert read_ray_session(alone / "session_latest").events.height == read_ray_session(source).events.height
    # Pointing at the session itself, or at its logs folder.
    assert find_ray_sessions(linked / source.name) == [linked / source.name]
    assert find_ray_sessions(linked / source.name / "logs") == [linked / source.name]


@needs_samples
def test_logs_folder_without_its_session_name(tmp_path: Path) -> None:
    logs = tmp_path / "node3" / "logs"
    shutil.copytree(_session("b_sigkill") / "logs", logs)
    assert find_ray_sessions(tmp_path) == [logs]
    session = read_ray_session(logs)
    assert _kinds(session.events) == SESSION_KINDS["b_sigkill"]
    # (its name, and so its start, told by its own files: the object store's fallback folder)
    assert session.name == _session("b_sigkill").name and session.started == read_ray_session(_session("b_sigkill")).started


# ---------------------------------------------------------------------------------------------
# Line-format details


def test_console_prefixes_dedup_colours_and_nested_prefixes(tmp_path: Path) -> None:
    log = tmp_path / "driver.log"
    log.write_text(
        "\n".join(
            [
                "2026-01-05 10:00:00,000\tINFO worker.py:2038 -- Started a local Ray instance.",
                "\x1b[36m(WorkerDict pid=97397, ip=10.0.0.2)\x1b[0m [rank3]:[E105 10:20:00.941975491 ProcessGroupNCCL.cpp:632] [Rank 3] "
                "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=26, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
                "Timeout(ms)=600000) ran for 600007 milliseconds before timing out.\x1b[32m [repeated 3x across cluster] (Ray "
                "deduplicates logs by default. Set RAY_DEDUP_LOGS=0 to disable log deduplication, or see https://docs.ray.io/.)\x1b[0m",
                "[36m(VllmServer pid=222967, ip=10.66.3.172)[0m (EngineCore_DP0 pid=223561) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
                "(raylet, ip=10.0.0.128) [2022-07-25 08:35:14,805 C 157 212] (raylet) gcs_rpc_client.h:537: Check failed: Failed to connect to GCS within 60 seconds",
                '{"asctime":"2026-01-05 10:30:00,123","levelname":"ERROR","message":"Raylet is terminated. Termination is unexpected.","filename":"process_watcher.py","lineno":116}',
                "[2023-07-24 13:21:32,378] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 4294967296, reducing to 2147483648",
            ]
        )
        + "\n"
    )
    events = read_ray_console(log).events
    rows = {row["kind"]: row for row in events.iter_rows(named=True)}
    assert set(rows) == {"nccl_timeout", "cuda_oom", "gcs_unreachable", "raylet_died", "overflow_skip"}
    nccl = rows["nccl_timeout"]
    assert nccl["count"] == 3 and nccl["pid"] == 97397 and nccl["worker"] == "WorkerDict"
    assert nccl["time"].isoformat() == "2026-01-05T10:20:00.941000"  # the year of the file's first dated line
    assert "repeated" not in nccl["message"] and "\x1b" not in nccl["message"]
    assert rows["cuda_oom"]["worker"] == "VllmServer" and rows["cuda_oom"]["message"].startswith("torch.OutOfMemoryError")
    assert rows["gcs_unreachable"]["severity"] == "fatal" and rows["gcs_unreachable"]["time"].year == 2022
    assert rows["raylet_died"]["time"].isoformat() == "2026-01-05T10:30:00.123000"
    assert rows["overflow_skip"]["source"] == "torch" and rows["overflow_skip"]["severity"] == "warning"
    assert set(events.filter(pl.col("kind") != "overflow_skip")["source"]) == {"torch", "ray"}


def test_chained_traceback_is_one_event_kind_from_its_end(tmp_path: Path) -> None:
    log = tmp_path / "worker.err"
    log.write_text(
        "Traceback (most recent call last):\n"
        '  File "a.py", line 1, in f\n'
        "KeyError: 'x'\n"
        "\n"
        "During handling of the above exception, another exception occurred:\n"
        "\n"
        "Traceback (most recent call last):\n"
        '  File "a.py", line 3, in g\n'
        "RuntimeError: CUDA error: an illegal memory access was encountered\n"
        "CUDA kernel errors might be asynchronously reported at some other API call.\n"
        "other output\n"
        "Traceback (most recent call last):\n"
        '  File "b.py", line 9, in h\n'
        "ValueError: bad\n"
    )
    events = read_ray_console(log).events
    assert events.select("line", "kind").rows() == [(1, "illegal_memory_access"), (12, "traceback")]
    assert events["message"][1] == "Traceback (most recent call last): … ValueError: bad"


def test_gzipped_and_rotated_session_files(tmp_path: Path) -> None:
    logs = tmp_path / "session_2026-03-01_10-00-00_000001_42" / "logs"
    logs.mkdir(parents=True)
    line = "[2026-03-01 10:05:00,000 C 7 7] (raylet) node_manager.cc:170: This node has beem marked as dead."
    (logs / "raylet.out.1").write_text(line + "\n")
    with gzip.open(logs / "gcs_server.out.2.gz", "wt") as fh:
        fh.write("[2026-03-01 10:05:01,000 I 8 8] (gcs_server) gcs_node_manager.cc:734: , death reason = UNEXPECTED_TERMINATION, death message = lost\n")
    (logs / "worker-" f"{'a' * 56}-01000000-99.err").write_bytes(b":actor_name:WorkerDict\n\xff\xfe garbage\n[rank0]:[E301 10:04:59.000000001 ProcessGroupNCCL.cpp:1] NCCL error in: x, unhandled system error\n")
    session = read_ray_session(logs.parent)
    events = session.events
    assert events.select("kind", "severity").rows() == [("nccl_error", "error"), ("node_dead", "fatal"), ("node_dead", "fatal")]
    assert events["time"].to_list()[0].isoformat() == "2026-03-01T10:04:59"  # glog year from the session name
    assert events["worker"][0] == "WorkerDict" and events["pid"][0] == 99
    kinds = {Path(s.path).name: s.kind for s in session.sources}
    assert kinds == {"raylet.out.1": "ray_raylet", "gcs_server.out.2.gz": "ray_gcs", f"worker-{'a' * 56}-01000000-99.err": "ray_worker_err"}


def test_json_and_export_events(tmp_path: Path) -> None:
    logs = tmp_path / "session_2026-03-01_10-00-00_000001_42" / "logs"
    (logs / "events").mkdir(parents=True)
    (logs / "export_events").mkdir()
    removed = {"custom_fields": {"node_id": "ab"}, "event_id": "1", "host_name": "h", "label": "RAY_NODE_REMOVED",
               "message": "The node with node id: ab and address: 10.0.0.3 and node name: n has been marked dead because the detector has missed too many heartbeats from it.",
               "pid": "65", "severity": "ERROR", "source_type": "GCS", "timestamp": 1772359500}
    chatter = {**removed, "label": "RAY_JOB_STARTED", "message": "Job started", "severity": "INFO"}
    (logs / "events" / "event_GCS.log").write_text(json.dumps(chatter) + "\n" + json.dumps(removed) + "\nnot json\n")
    dead = {"event_data": {"actor_id": "x", "class_name": "WorkerDict", "pid": 4242, "state": "DEAD", "death_cause": {
        "actor_died_error_context": {"error_message": "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: Worker exits unexpectedly. Worker exits with an exit code 3..", "reason": "WORKER_DIED"}}},
        "event_id": "2", "source_type": "EXPORT_ACTOR", "timestamp": 1772359600}
    scoped = {"event_data": {"class_name": "A", "pid": 1, "state": "DEAD", "death_cause": {"actor_died_error_context": {"error_message": "all references removed", "reason": "OUT_OF_SCOPE"}}},
              "event_id": "3", "source_type": "EXPORT_ACTOR", "timestamp": 1772359601}
    alive = {**dead, "event_data": {**dead["event_data"], "state": "ALIVE"}}
    (logs / "export_events" / "event_EXPORT_ACTOR.log").write_text("\n".join(json.dumps(r) for r in (alive, dead, dead, scoped)) + "\n")
    task = {"event_data": {"state_updates": {"error_info": {"error_type": "TASK_EXECUTION_EXCEPTION", "error_message": "Traceback (most recent call last):\n  File \"x\"\ntorch.OutOfMemoryError: CUDA out of memory."}},
            "task_info": {"func_or_class_name": "WorkerDict.update_actor"}}, "event_id": "4", "source_type": "EXPORT_TASK", "timestamp": 1772359602}
    (logs / "export_events" / "event_EXPORT_TASK_4242.log").write_text(json.dumps(task) + "\n")
    session = read_ray_session(logs.parent)
    rows = session.events.select("kind", "pid", "detail", "line").rows()
    assert rows == [
        ("node_dead", None, None, 2),
        ("actor_died", 4242, "SYSTEM_ERROR (unexpected): exit code 3", 2),
        ("cuda_oom", None, None, 1),
    ]
    gcs = next(s for s in session.sources if s.path.endswith("event_GCS.log"))
    assert gcs.unparsed_lines == 1 and gcs.lines == 3
    assert any("epoch seconds" in note for note in session.notes)


# ---------------------------------------------------------------------------------------------
# Sessions the verl fixture builder writes


def test_nccl_hang_session(tmp_path: Path) -> None:
    paths = nccl_hang_run(tmp_path / "run")
    assert find_ray_sessions(tmp_path) == [paths.session]
    events = read_ray_session(paths.session).events
    assert _kinds(events) == {"nccl_timeout", "fatal_check", "worker_died", "actor_died", "worker_last_output"}
    timeout = events.filter(pl.col("kind") == "nccl_timeout").row(0, named=True)
    assert timeout["source"] == "torch" and timeout["worker"] == "WorkerDict"
    assert timeout["time"].isoformat() == "2026-11-22T03:28:41.648000"  # glog header dated from the session name
    abort = events.filter(pl.col("kind") == "fatal_check")
    assert abort.height == 1 and abort["detail"][0] == "SIGABRT"  # terminate, what() and *** SIGABRT are one abort
    deaths = events.filter(pl.col("kind").is_in(["worker_died", "actor_died"]))
    assert set(deaths["pid"]) == {timeout["pid"]} and deaths["time"].min() >= timeout["time"].replace(microsecond=0)


def test_oom_kill_session_and_wide_nccl_console(tmp_path: Path) -> None:
    paths = ray_oom_kill_run(tmp_path / "oom")
    events = read_ray_session(paths.session).events
    assert _kinds(events) == {"host_oom_kill", "actor_died"}
    assert events.filter(pl.col("kind") == "host_oom_kill")["detail"].drop_nulls().str.contains("memory monitor").all()
    wide = write_verl_run(tmp_path / "wide", VerlRunSpec(world_size=4, failure="nccl_hang", fail_at=5))
    console = read_ray_console(wide.train_log).events
    timeout = console.filter(pl.col("kind") == "nccl_timeout")
    assert timeout["count"].to_list() == [2]  # ranks 0–2 time out, one line carries "[repeated 2x across cluster]"


def test_glog_dates_cross_new_year(tmp_path: Path) -> None:
    logs = tmp_path / "session_2025-12-31_23-50-00_000001_42" / "logs"
    logs.mkdir(parents=True)
    (logs / f"worker-{'b' * 56}-01000000-7.err").write_text(
        "[rank0]:[E1231 23:59:59.000000001 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation timeout: x\n"
        "[rank0]:[E101 00:10:00.000000001 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation timeout: y\n"
    )
    times = read_ray_session(logs.parent).events["time"].to_list()
    assert [t.isoformat() for t in times] == ["2025-12-31T23:59:59", "2026-01-01T00:10:00"]


# ---------------------------------------------------------------------------------------------
# Batches: a file of any size is read in batches of lines; where they are cut changes nothing

INTERLEAVED = """\
junk before any dated line
2026-01-05 10:00:00,000\tINFO worker.py:2038 -- Started a local Ray instance.
(WorkerDict pid=1) [2026-01-05 10:00:01,000 I 1 1] (raylet) a dated line of stream 1
(WorkerDict pid=2) Traceback (most recent call last):
(WorkerDict pid=1) Traceback (most recent call last):
(WorkerDict pid=2)   File "a.py", line 1, in f
(WorkerDict pid=1)   File "b.py", line 2, in g
(WorkerDict pid=2)
(WorkerDict pid=2) During handling of the above exception, another exception occurred:
(WorkerDict pid=2) RuntimeError: CUDA error: an illegal memory access was encountered
(WorkerDict pid=1) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB
(WorkerDict pid=1) Memory on the node was 95% full when the task was killed
(raylet) [2026-01-05 10:02:00,000 E 7 7] (raylet) node_manager.cc:1: Worker exits with an exit code 1.
(WorkerDict pid=2) ActorDiedError: The actor died unexpectedly before finishing this task.
"""


def _same_log(got, want) -> None:
    assert got.events.equals(want.events) and got.markers.equals(want.markers)
    assert (got.lines, got.unparsed_lines, got.notes) == (want.lines, want.unparsed_lines, want.notes)


@needs_samples
@pytest.mark.parametrize("batch_bytes", [1, 600, 4096])
def test_batches_do_not_change_the_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch_bytes: int) -> None:
    """Batch cuts fall inside tracebacks, records and interleaved streams; every session, console
    and excerpt reads the same as in one pass (one batch: each is far smaller than a batch)."""
    import parsers._lines as lines

    console = tmp_path / "driver.log"
    console.write_text(INTERLEAVED * 3)
    consoles = [console, *sorted(EXCERPTS.glob("*.log")), *sorted(SAMPLES.glob("*/driver.log"))]
    sessions = [_session(name) for name in sorted(SESSION_KINDS)]
    whole = {path: read_ray_console(path) for path in consoles}
    whole_sessions = {path: read_ray_session(path) for path in sessions}
    assert whole[console].events.height >= 9 and whole[console].unparsed_lines == 0
    monkeypatch.setattr(lines, "BATCH_BYTES", batch_bytes)
    monkeypatch.setattr(lines, "HEAVY_BATCH_BYTES", batch_bytes)
    for path, want in whole.items():
        _same_log(read_ray_console(path), want)
    if batch_bytes == 1:  # a batch a line: the sessions' thousands of lines take long, the cuts are the same
        return
    for path, want in whole_sessions.items():
        got = read_ray_session(path)
        assert got.events.equals(want.events) and got.workers.equals(want.workers), path.name
        assert (got.sources, got.notes, got.facts) == (want.sources, want.notes, want.facts)


def _with_small_files(session: Path) -> tuple[list[Path], list[Path]]:
    """Worker and core logs added to a copied session: files without an event (a group's usual
    lot), and files with one, built so that files read as one would run into each other: a
    traceback cut at a file's end and its rest in the next file (plain and console-prefixed, the
    same prefix in both), a crash dump and, in the next core log, a stray frame line."""
    logs = session / "logs"
    worker = lambda k, ext: logs / f"worker-{k:056x}-01000000-{1000 + k}.{ext}"  # noqa: E731
    core = lambda k: logs / f"python-core-worker-{k:056x}_{1000 + k}.log"  # noqa: E731
    quiet = []
    for k in range(1, 41):
        out, err = worker(k, "out"), worker(k, "err")
        out.write_text(f":job_id:01000000\n:actor_name:Rollout{k % 3}\nstep {k} done\n\nplain print\n")
        err.write_text(f":task_name:score_{k}\n" if k % 2 else "")
        quiet += [out, err] if k % 2 else [out]
    core(7).write_text("preamble without a date\n[2026-11-22 03:12:00,000 I 1007 1007] core_worker.cc:1: Constructing\n")
    worker(41, "out").write_text(":actor_name:Console\n(Rollout pid=1041) hello\n(Rollout pid=1041) again\n")
    with gzip.open(logs / f"worker-{42:056x}-01000000-1042.out.1.gz", "wt") as fh:
        fh.write(":actor_name:Rotated\nold output\n")
    worker(43, "out").write_bytes(b":actor_name:Bytes\n\xff\xfe not UTF-8\n")
    quiet += [core(7), worker(41, "out"), logs / f"worker-{42:056x}-01000000-1042.out.1.gz", worker(43, "out")]

    worker(44, "err").write_text(':actor_name:Loud\nTraceback (most recent call last):\n  File "x.py", line 1, in <module>\nValueError: boom\n')
    worker(45, "err").write_text(':actor_name:Cut\nTraceback (most recent call last):\n  File "a.py", line 1, in <module>\n')
    worker(46, "err").write_text(':actor_name:Rest\n  File "b.py", line 2, in f\nKeyError: \'x\'\nTraceback (most recent call last):\n')
    prefix = "(Rollout pid=9) "
    worker(47, "out").write_text(f"{prefix}Traceback (most recent call last):\n{prefix}  File \"c.py\", line 3, in g\n")
    worker(48, "out").write_text(f"{prefix}  File \"d.py\", line 4, in h\n{prefix}RuntimeError: bad\n"
                                 f"{prefix}Traceback (most recent call last):\n{prefix}  File \"e.py\", line 5, in k\n{prefix}OSError: disk\n")
    stamp = "[2026-11-22 03:12:12,265 E 1050 1050] logging.cc:474: "
    core(50).write_text(f"{stamp}*** SIGSEGV received at time=1795317132 on cpu 1 ***\n{stamp}PC: @     0x7f2828f74219  (unknown)\n"
                        f"{stamp}    @     0x7f2828e5a050  (unknown)\n")
    core(51).write_text("[2026-11-22 03:12:30,000 E 1051 1051] logging.cc:474:     @     0x7f2828e5a050  (unknown)\n")
    return quiet, [worker(k, ext) for k, ext in ((44, "err"), (45, "err"), (46, "err"), (47, "out"), (48, "out"))] + [core(50), core(51)]


@needs_samples
def test_small_files_read_together_give_what_each_read_alone_gives(tmp_path: Path, monkeypatch) -> None:
    """A long session leaves thousands of small worker logs: they are read a group at a time,
    those with an event too (a pass per kind of file, each file's streams its own, when a kind has
    enough of them). Every file's events, counts, notes and markers, and the workers, are what
    reading each file alone gives."""
    import parsers.ray as ray

    session = tmp_path / _session("a_actor_exit").name
    shutil.copytree(_session("a_actor_exit"), session)
    quiet, eventful = _with_small_files(session)
    read_alone = []
    real = ray._read_text
    monkeypatch.setattr(ray, "_read_text", lambda path, *a: read_alone.append(path) or real(path, *a))
    few = read_ray_session(session)  # two or three files of a kind: each read alone
    assert set(eventful) <= set(read_alone) and not set(quiet) & set(read_alone)
    read_alone.clear()
    monkeypatch.setattr(ray, "_TOGETHER", 1)
    got = read_ray_session(session)
    assert read_alone == []  # the session's own files are small too
    monkeypatch.setattr(ray, "_small_files", lambda *a: {})  # every file read on its own
    want = read_ray_session(session)
    assert few.events.equals(want.events) and few.sources == want.sources
    assert got.events.equals(want.events) and got.workers.equals(want.workers)
    assert (got.sources, got.notes, got.facts) == (want.sources, want.notes, want.facts)
    sources = {Path(s.path).name: s for s in got.sources}
    assert sources[f"python-core-worker-{7:056x}_1007.log"].unparsed_lines == 1  # counted as alone
    assert sources[f"worker-{41:056x}-01000000-1041.out"].notes  # console lines without a time of their own
    assert {"Rollout1", "Console", "Rotated", "Bytes", "Loud"} <= set(got.workers["name"].drop_nulls())
    of = {name: got.events.filter(pl.col("file").str.ends_with(name)) for name in (p.name for p in eventful)}
    assert "ValueError: boom" in " ".join(of[eventful[0].name]["message"])
    assert "(no exception line)" in " ".join(of[eventful[1].name]["message"])  # not finished by the next file
    assert of[eventful[6].name]["kind"].to_list() == ["log_error"]  # a stray frame line, not part of the dump before
    assert of[eventful[5].name]["kind"].to_list() == ["segfault"]
    assert all(of[name].height for name in of)
    assert "(no exception line)" in " ".join(of[eventful[3].name]["message"])  # nor with a shared prefix


@needs_samples
def test_without_the_session_start_small_files_with_an_event_are_read_alone(tmp_path: Path, monkeypatch) -> None:
    """Each file then dates its glog lines by its own first dated line, so only files without an
    event are read together."""
    import re

    import parsers.ray as ray

    session = tmp_path / "copied"
    shutil.copytree(_session("a_actor_exit"), session)
    for named in (session / "logs" / name for name in ray._NAMING_FILES):  # (nor its files' word of its name)
        named.write_text(re.sub(ray.SESSION_NAME.pattern, "session_unknown", named.read_text()))
    quiet, eventful = _with_small_files(session)
    read_alone = []
    real = ray._read_text
    monkeypatch.setattr(ray, "_read_text", lambda path, *a: read_alone.append(path) or real(path, *a))
    monkeypatch.setattr(ray, "_TOGETHER", 1)
    got = read_ray_session(session)
    assert got.started is None and set(eventful) <= set(read_alone) and not set(quiet) & set(read_alone)
    monkeypatch.setattr(ray, "_small_files", lambda *a: {})
    want = read_ray_session(session)
    assert got.events.equals(want.events) and got.sources == want.sources


@needs_samples
def test_a_ray_session_alone_is_read_and_not_called_healthy(tmp_path: Path) -> None:
    """A session folder whose workers printed no step (no verl console in it): no metric, no step.
    Its events are read, and the verdict says nothing was judged (it was an internal error before,
    with no metric frame at all)."""
    from typer.testing import CliRunner

    from forensics.cli import app

    _without_steps(shutil.copytree(_session("a_actor_exit"), tmp_path / "bare" / _session("a_actor_exit").name))
    result = CliRunner().invoke(app, ["analyze", str(tmp_path / "bare"), "--out", str(tmp_path / "out"), "--no-cache",
                                      "--json", str(tmp_path / "doc.json"), "--markdown", str(tmp_path / "summary.md")],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "no training step was logged: no metric could be judged" in result.output and "looks healthy" not in result.output
    [run] = json.loads((tmp_path / "doc.json").read_text())["runs"]
    assert run["incidents"] == [] and run["steps"]["count"] == 0
    assert run["recommendation"]["reason"].startswith("No incident found, but no training step was logged")
    assert "nothing judged" in (tmp_path / "summary.md").read_text()
    page = (tmp_path / "out" / "report.html").read_text()
    assert "no metric could be judged" in page and "looks healthy" not in page
    assert len(run["sources"]) > 30 and all(s["kind"].startswith("ray_") for s in run["sources"])


@needs_samples
def test_a_session_folder_under_another_name_is_still_a_session(tmp_path: Path) -> None:
    """Copied as ``mysession_copy/`` (not ``session_<date>_…``): known by its ``logs/raylet.out``."""
    from forensics import analyze
    from forensics.analysis import locate

    shutil.copytree(_session("e_oom"), tmp_path / "run" / "mysession_copy")
    [run] = locate([tmp_path / "run"])
    assert run.run_id == "mysession_copy" and [s.path.name for s in run.logs if s.kind == "ray_session"] == ["mysession_copy"]
    [renamed] = analyze([tmp_path / "run"]).runs
    [named] = analyze([_session("e_oom")]).runs
    kinds = lambda r: sorted(r.events["kind"].to_list())  # noqa: E731
    assert kinds(renamed) == kinds(named) and "host_oom_kill" in kinds(renamed)
    # Dated by the name its own files give it (the steps' times are its start plus their durations):
    # the crash at step 3 as under its own name, not "healthy" with every death in no step.
    assert read_ray_session(tmp_path / "run" / "mysession_copy").started == read_ray_session(_session("e_oom")).started
    crashes = lambda r: [(i.kind, i.onset_step, i.cause) for i in r.incidents]  # noqa: E731
    assert crashes(renamed) == crashes(named) == [("crash", 3, "training_worker_crash")]


@needs_samples
def test_a_session_alone_with_deaths_says_them_in_the_verdict(tmp_path: Path) -> None:
    """No step to place them at (its workers printed none), so no incident: the verdict still
    names the failures logged."""
    from typer.testing import CliRunner

    from forensics.cli import app

    _without_steps(shutil.copytree(_session("e_oom"), tmp_path / "bare" / _session("e_oom").name))
    result = CliRunner().invoke(app, ["analyze", str(tmp_path / "bare"), "--no-html", "--no-cache",
                                      "--markdown", str(tmp_path / "s.md")], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "no metric could be judged; yet" in said and "host_oom_kill ×" in said and "see the events" in said
    assert "host\\_oom\\_kill ×" in (tmp_path / "s.md").read_text()


@pytest.mark.parametrize("moved", [False, True], ids=["another-day", "during-the-run"])
def test_a_ray_session_apart_from_the_run_in_time_is_another_jobs(tmp_path: Path, moved: bool) -> None:
    """A real session (two workers OOM-killed) copied into an AReaL run's log folder: a year after
    the run, its kills are another job's and left out, said in a note; its times moved into the
    run (and nothing else changed), they are the run's."""
    import re
    from datetime import datetime

    from forensics import analyze

    run = shutil.copytree(Path(__file__).parent / "fixtures" / "sglang_healthy_collapse" / "outputs", tmp_path / "outputs")
    trial = run / "logs/root/gsm8k-grpo-rewardbug/trial0"
    name = "session_2026-11-22_03-12-18_295500_1184"
    session = shutil.copytree(SAMPLES / "e_oom" / name, trial / "ray" / name, symlinks=True)
    if moved:  # 2025-11-24 12:12, inside the run's 10:12–13:56
        stamp = int(datetime(2025, 11, 24, 12, 12, 27).timestamp())
        for f in (p for p in session.rglob("*") if p.is_file() and not p.is_symlink()):
            text = f.read_bytes().replace(b"2026-11-22 03:1", b"2025-11-24 12:1").replace(b"2026-11-22_03-1", b"2025-11-24_12-1")
            f.write_bytes(re.sub(rb'"timestamp":\d+', b'"timestamp":%d' % stamp, text))
    result = analyze(run).runs[0]
    kinds = [(i.kind, i.cause) for i in result.incidents]
    apart = [n for n in result.notes if n.startswith(f"Ray session {name} (2026-11-22 03:12–")]
    if moved:
        assert ("crash", "training_worker_crash") in kinds and not apart
    else:
        assert kinds == [("reward_collapse", "reward_pipeline")]
        assert apart and apart[0].endswith("lies apart from the run's other logs (2025-11-24 10:09–2025-11-24 13:56): another job's; its events are left out")
        assert result.events.filter(pl.col("kind") == "host_oom_kill").is_empty()


@needs_samples
@pytest.mark.parametrize("name", ["a_actor_exit", "b_sigkill", "c_task_exception", "d_segfault", "e_oom"])
@pytest.mark.parametrize("given", ["session_latest/logs", "session_latest", "."])
def test_a_session_given_alone_is_the_session_with_its_steps(tmp_path: Path, name: str, given: str) -> None:
    """``session_latest/logs`` (where Ray's docs and a checklist point), the session, or Ray's temp
    folder: the session's failures and its TaskRunner's steps are one run, named after the session,
    the crash at step 3 as with the driver's log beside it — not the TaskRunner's two steps alone,
    called healthy (c_task_exception's traceback is undated, in the TaskRunner's .err)."""
    from forensics import analyze

    copy = shutil.copytree(_session(name), tmp_path / "r_1" / _session(name).name)
    (tmp_path / "r_1" / "session_latest").symlink_to(copy.name)
    [run] = analyze([tmp_path / "r_1" / given]).runs
    [beside] = analyze([SAMPLES / name]).runs
    assert run.run_id == copy.name
    assert run.step_range()["last"] == 2
    [crash] = [i for i in run.incidents if i.kind == "crash"]
    [expected] = [i for i in beside.incidents if i.kind == "crash"]
    assert (crash.onset_step, crash.cause) == (expected.onset_step, expected.cause) == (3, "training_worker_crash")
    if name == "c_task_exception":
        [cited] = crash.evidence
        assert (Path(cited.file).name, cited.line) == (next(copy.glob("logs/worker-*-704.err")).name, 3)
        assert "ZeroDivisionError" in crash.summary and "undated" in crash.summary
        assert crash.confidence < expected.confidence  # (its order against the steps inferred, not read)


@needs_samples
def test_sessions_given_beside_a_run_dated_by_nothing_else_are_said_to_be_taken_as_its(tmp_path: Path) -> None:
    """verl's console prints no times: with two sessions given beside it (a Ray temp folder) whose
    workers printed no step to pair them by, which is the run's cannot be told, and the run's notes
    say both were taken."""
    from forensics import analyze

    zero_score_run(tmp_path / "exp", ray_session=False)
    for name in ("b_sigkill", "e_oom"):
        _without_steps(shutil.copytree(_session(name), tmp_path / "ray" / _session(name).name))
    [run] = analyze([tmp_path / "exp", tmp_path / "ray"]).runs
    [doubt] = [n for n in run.notes if "are taken as this run's" in n]
    assert doubt.startswith(f"2 Ray sessions ({_session('b_sigkill').name}, {_session('e_oom').name})")
    [alone] = analyze([tmp_path / "exp", tmp_path / "ray" / _session("e_oom").name]).runs
    assert not [n for n in alone.notes if "are taken as this run's" in n]


@needs_samples
def test_a_session_whose_steps_are_not_in_the_runs_console_is_not_its(tmp_path: Path) -> None:
    """Beside one run, a Ray folder holding another job's session: its TaskRunner's steps are not
    in the run's console, so it is a run of its own, and the run's verdict is its own."""
    from forensics import analyze

    (tmp_path / "exp").mkdir()
    shutil.copyfile(SAMPLES / "b_sigkill" / "driver.log", tmp_path / "exp" / "train.log")
    shutil.copytree(_session("b_sigkill"), tmp_path / "ray" / _session("b_sigkill").name)
    shutil.copytree(_session("e_oom"), tmp_path / "ray_other" / _session("e_oom").name)
    [own] = analyze([tmp_path / "exp", tmp_path / "ray"]).runs
    runs = {r.run_id: r for r in analyze([tmp_path / "exp", tmp_path / "ray_other"]).runs}
    assert sorted(runs) == sorted(["exp", _session("e_oom").name])
    assert not any("e_oom" in s.path or _session("e_oom").name in s.path for s in runs["exp"].sources)
    assert any(_session("b_sigkill").name in s.path for s in own.sources)


@needs_samples
def test_a_gzipped_session_keeps_its_dead_workers_last_lines(tmp_path: Path) -> None:
    """A session archived with every file gzipped: the last line each dead worker printed is read
    through the gzip (it was dropped, as a rotated part's would be)."""
    import gzip

    copy = shutil.copytree(_session("d_segfault"), tmp_path / _session("d_segfault").name)
    for file in [p for p in (copy / "logs").rglob("*") if p.is_file()]:
        file.with_name(file.name + ".gz").write_bytes(gzip.compress(file.read_bytes()))
        file.unlink()
    said = lambda s: sorted(s.events.filter(pl.col("kind") == "worker_last_output")["message"].to_list())  # noqa: E731
    plain = said(read_ray_session(_session("d_segfault")))
    assert plain and said(read_ray_session(copy)) == plain


@needs_samples
@pytest.mark.parametrize("name", ["b_sigkill", "c_task_exception"])
def test_a_session_archived_gzipped_under_another_name_gives_its_verdict(tmp_path: Path, name: str) -> None:
    """Every file gzipped and the folder renamed: still a session (its raylet.out.gz), dated by its
    files, and c_task_exception's undated traceback still beside its steps (.err.gz by .out.gz)."""
    import gzip

    from forensics import analyze

    copy = shutil.copytree(_session(name), tmp_path / "archived")
    for file in [p for p in copy.rglob("*") if p.is_file() and p.stat().st_size]:
        file.with_name(file.name + ".gz").write_bytes(gzip.compress(file.read_bytes()))
        file.unlink()
    said = lambda r: [(i.kind, i.onset_step, i.cause, i.confidence) for i in r.incidents]  # noqa: E731
    [packed], [plain] = analyze([copy]).runs, analyze([_session(name)]).runs
    assert packed.run_id == "archived" and said(packed) == said(plain) and said(plain)[0][:3] == ("crash", 3, "training_worker_crash")


@needs_samples
def test_a_folder_of_sessions_is_a_run_for_each(tmp_path: Path) -> None:
    """``analyze /tmp/ray``: each session a run of its own, read as when given alone; a
    ``session_latest`` copied with links followed is not a third."""
    from forensics import analyze

    for name in ("b_sigkill", "c_task_exception"):
        shutil.copytree(_session(name), tmp_path / "ray" / _session(name).name)
    shutil.copytree(_session("c_task_exception"), tmp_path / "ray" / "session_latest")
    runs = analyze([tmp_path / "ray"]).runs
    assert sorted(r.run_id for r in runs) == sorted(_session(n).name for n in ("b_sigkill", "c_task_exception"))
    assert all([(i.kind, i.onset_step) for i in r.incidents] == [("crash", 3)] for r in runs)


@needs_samples
def test_a_session_given_as_its_own_path_beside_one_run_is_that_runs(tmp_path: Path) -> None:
    """Seed 004's checklist: the console tee'd to ``outputs/exp/train.log``, the session where Ray
    keeps it (``/tmp/ray``), both given: one run, whose crash cites the session's own lines — as
    with the session in the run's folder — not a second, unjudged run."""
    from forensics import analyze

    (tmp_path / "outputs" / "exp").mkdir(parents=True)
    shutil.copyfile(SAMPLES / "b_sigkill" / "driver.log", tmp_path / "outputs" / "exp" / "train.log")
    shutil.copytree(_session("b_sigkill"), tmp_path / "r_1" / _session("b_sigkill").name)
    [run] = analyze([tmp_path / "outputs" / "exp", tmp_path / "r_1"]).runs
    [alike] = analyze([tmp_path / "outputs" / "exp", tmp_path / "r_1" / _session("b_sigkill").name]).runs  # (the session itself)
    assert alike.sources == run.sources and alike.incidents == run.incidents
    [beside] = analyze([SAMPLES / "b_sigkill"]).runs
    [crash] = [i for i in run.incidents if i.kind == "crash"]
    [expected] = [i for i in beside.incidents if i.kind == "crash"]
    assert (crash.onset_step, crash.cause) == (expected.onset_step, expected.cause)
    assert any(str(tmp_path / "r_1") in e.file for e in crash.evidence)
    assert ({Path(e.file).name for e in crash.evidence} - {"train.log"}
            == {Path(e.file).name for e in expected.evidence} - {"driver.log"})  # (the console, by another name)


def test_a_chain_raised_again_as_a_plain_error_keeps_the_kind_of_its_cause(tmp_path: Path) -> None:
    """A worker's CUDA OOM re-raised as a plain RuntimeError: the OOM's event, named in its message."""
    log = tmp_path / "worker.err"
    log.write_text(
        "Traceback (most recent call last):\n"
        '  File "engine.py", line 512, in train_batch\n'
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
        "\n"
        "The above exception was the direct cause of the following exception:\n"
        "\n"
        "Traceback (most recent call last):\n"
        '  File "main.py", line 201, in main\n'
        "RuntimeError: train step 50 failed\n"
    )
    [event] = read_ray_console(log).events.to_dicts()
    assert (event["line"], event["kind"]) == (1, "cuda_oom")
    assert "CUDA out of memory" in event["message"] and event["message"].endswith("RuntimeError: train step 50 failed")
