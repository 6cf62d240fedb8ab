"""A real local Ray run: actors die for real, and the parser must find it in the fresh session.

Ray runs in a subprocess with its own ``HOME`` (Ray 2.60 writes ``~/.ray/auth_token``) and a
short temp dir (unix socket paths are limited to ~107 bytes). One actor calls ``sys.exit(3)``,
one is SIGKILLed from the driver; Ray writes the rest. About 10–15 s.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import polars as pl
import pytest

from parsers.ray import find_ray_sessions, read_ray_session

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None, reason="ray is not installed (pip install 'ray==2.60.0' into the venv)"
)

SCRIPT = textwrap.dedent(
    """
    import json, os, signal, sys, time
    import ray

    ray.init(_temp_dir=sys.argv[1], num_cpus=3, include_dashboard=False, log_to_driver=True)

    @ray.remote(max_restarts=0)
    class WorkerDict:
        def pid(self):
            return os.getpid()

        def exit_with(self, code):
            print(f"[rank0] exiting with {code}", flush=True)
            sys.exit(code)

        def sleep(self):
            time.sleep(60)

    exiting, killed = WorkerDict.remote(), WorkerDict.remote()
    pids = {"exited": ray.get(exiting.pid.remote()), "killed": ray.get(killed.pid.remote())}
    try:
        ray.get(exiting.exit_with.remote(3))
    except Exception as error:
        print("caught", type(error).__name__, flush=True)
    pending = killed.sleep.remote()
    time.sleep(0.5)
    os.kill(pids["killed"], signal.SIGKILL)
    try:
        ray.get(pending)
    except Exception as error:
        print("caught", type(error).__name__, flush=True)
    time.sleep(1.5)
    ray.shutdown()
    print("PIDS " + json.dumps(pids), flush=True)
    """
)


@pytest.fixture
def ray_run(tmp_path: Path):
    """Run the script; yield (temp root, pids, driver output); remove the temp root afterwards."""
    temp_root = Path(tempfile.mkdtemp(prefix="rf-", dir="/tmp"))
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "RAY_USAGE_STATS_ENABLED": "0", "RAY_enable_export_api_write": "1"}
    script = tmp_path / "die.py"
    script.write_text(SCRIPT)
    try:
        done = subprocess.run(
            [sys.executable, str(script), str(temp_root)], env=env, capture_output=True, text=True, timeout=180, cwd=tmp_path
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        pids = json.loads(next(ln for ln in done.stdout.splitlines() if ln.startswith("PIDS "))[5:])
        yield temp_root, pids, done.stdout + done.stderr
    finally:
        shutil.rmtree(temp_root, ignore_errors=True)


def test_real_ray_actor_deaths_are_found_with_their_exit_detail(ray_run, tmp_path: Path) -> None:
    temp_root, pids, output = ray_run
    sessions = find_ray_sessions(temp_root)
    assert len(sessions) == 1, sessions  # the session folder and session_latest are one session

    session = read_ray_session(sessions[0])
    events = session.events
    died = events.filter(pl.col("kind") == "actor_died")
    assert not died.is_empty(), events

    exited = died.filter(pl.col("pid") == pids["exited"])
    assert exited["detail"].str.contains("exit code 3").any(), exited
    assert exited["detail"].str.contains("SYSTEM_ERROR (unexpected)", literal=True).any(), exited
    killed = died.filter(pl.col("pid") == pids["killed"])
    assert killed["detail"].str.contains("connection to the worker lost").any(), killed
    assert set(died.filter(pl.col("pid").is_in(list(pids.values())))["worker"].drop_nulls()) == {"WorkerDict"}

    # Every death is also seen as a worker failure, and shutdown leaves no false alarms.
    assert set(events.filter(pl.col("kind") == "worker_died")["pid"]) >= set(pids.values())
    assert events.filter(pl.col("kind").is_in(["node_dead", "raylet_died", "gcs_unreachable", "host_oom_kill"])).is_empty()
    # The export API (enabled here) records the deaths too.
    exported = died.filter(pl.col("file").str.contains("export_events"))
    assert exported.height >= 2 and set(exported["pid"]) >= set(pids.values())

    workers = session.workers.filter(pl.col("pid").is_in(list(pids.values())))
    assert set(workers["name"]) == {"WorkerDict"} and set(workers["name_kind"]) == {"actor"}
    assert session.facts.get("ray_version", "").startswith("2.")
    assert all(source.lines >= 0 for source in session.sources)

    # The driver's own console, as a user would have captured it.
    console = tmp_path / "driver.log"
    console.write_text(output)
    from parsers.ray import read_ray_console

    kinds = set(read_ray_console(console).events["kind"])
    assert {"worker_died", "actor_died"} <= kinds
