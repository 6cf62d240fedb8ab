"""``parsers.read_areal_log`` on logs written the way AReaL writes them (tables by tabulate)."""

from __future__ import annotations

import gzip
import math
import shutil
from datetime import datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from areal_builder import LogLine, Relaunch, RunSpec, schedule, tabulate_stats, write_run

from parsers import read_areal_log

SAMPLES = Path(__file__).parents[2] / "shared" / "samples" / "real" / "areal"
GREEN, RESET = "\x1b[92m", "\x1b[0m"


def stats_block(step: int, tables: list[dict[str, float]], time: str = "20251111-11:37:11.251", total: int = 4675) -> str:
    """One StatsLogger commit as AReaL v0.4 prints it: header, then ``Stats (i/N)`` tables."""
    epoch, in_epoch = divmod(step - 1, 935)
    lines = [f"{GREEN}{time} StatsLogger INFO: Epoch {epoch + 1}/5 Step {in_epoch + 1}/935 Train step {step}/{total} done.{RESET}"]
    for i, table in enumerate(tables, 1):
        lines.append(f"{GREEN}{time} StatsLogger INFO: Stats ({i}/{len(tables)}):{RESET}")
        lines.append(f"{GREEN}{time} StatsLogger INFO: \n{tabulate_stats(table)}{RESET}")
    return "\n".join(lines) + "\n"


def values(log, key: str) -> dict[int, float]:
    rows = log.metrics.filter(pl.col("key") == key).sort("step")
    return dict(zip(rows["step"].to_list(), rows["value"].to_list(), strict=True))


def test_seed_header_line_parses(tmp_path: Path) -> None:
    path = tmp_path / "trainer.log"
    path.write_text(stats_block(940, [{"grpo_actor/task_reward/avg": 0.0, "rollout/reward": 0.0}]))
    log = read_areal_log(path)
    assert log.steps.row(0, named=True)["step"] == 940
    assert str(log.steps["time"][0]) == "2025-11-11 11:37:11.251000"
    assert values(log, "grpo_actor/task_reward/avg") == {940: 0.0}
    assert log.unparsed_lines == 0


def test_minibatch_tables_nan_inf_blank_cells_and_missing_keys(tmp_path: Path) -> None:
    first = {f"grpo_actor/k{i}": float(i) for i in range(9)} | {"grpo_actor/grad_norm": math.nan, "x/inf": math.inf}
    second = {"grpo_actor/k0": 3.0, "grpo_actor/k1": -1.0}
    text = stats_block(1, [first, second]) + stats_block(2, [{"grpo_actor/k0": 7.0}], time="20251111-11:38:11.251")
    path = tmp_path / "trainer.log"
    path.write_text(text)
    log = read_areal_log(path)
    assert values(log, "grpo_actor/k0") == {1: 1.5, 2: 7.0}
    assert values(log, "grpo_actor/k1") == {1: 0.0}
    assert values(log, "grpo_actor/k8") == {1: 8.0}
    assert math.isnan(values(log, "grpo_actor/grad_norm")[1])
    assert values(log, "x/inf")[1] == math.inf
    assert log.metrics.filter(pl.col("step") == 2).height == 1


def test_one_pair_per_row_paste(tmp_path: Path) -> None:
    rows = ["│ grpo_actor/task_reward/avg      │ 0.0000e+00 │", "│ rollout/reward                  │ 0.0000e+00 │"]
    path = tmp_path / "pasted.log"
    path.write_text(
        "20251111-11:37:11.251 StatsLogger INFO: Epoch 2/5 Step 5/935 Train step 940/4675 done.\n"
        "20251111-11:37:11.251 StatsLogger INFO: Stats (1/1):\n20251111-11:37:11.251 StatsLogger INFO: \n"
        "╒═════════════════════════════════╤════════════╕\n"
        + "\n├─────────────────────────────────┼────────────┤\n".join(rows)
        + "\n╘═════════════════════════════════╧════════════╛\n"
    )
    log = read_areal_log(path)
    assert values(log, "rollout/reward") == {940: 0.0}
    assert values(log, "grpo_actor/task_reward/avg") == {940: 0.0}


@pytest.mark.parametrize("era", ["v0.4", "v0.5", "realhf"])
def test_every_era_yields_every_step_and_reward(tmp_path: Path, era: str) -> None:
    spec = RunSpec(era=era, last_step=12, reward=lambda s: 0.25 if s % 3 else 0.5)
    paths = write_run(tmp_path / "outputs", spec)
    log = read_areal_log(paths.trainer_log)
    assert log.steps["step"].to_list() == list(range(1, 13))
    key = "grpo_actor/task_reward/avg" if era == "v0.4" else "ppo_actor/task_reward/avg"
    assert values(log, key) == {s: (0.25 if s % 3 else 0.5) for s in range(1, 13)}
    assert log.unparsed_lines == 0


def test_a_traceback_cut_off_before_its_exception_line_does_not_take_the_next_ones(tmp_path: Path) -> None:
    """A traceback whose process died mid-print, then, later, a whole one: the first has no exception."""
    spec = RunSpec(last_step=4)
    lines = write_run(tmp_path / "outputs", spec).trainer_log.read_text().splitlines(keepends=True)
    frames = ["Traceback (most recent call last):\n", '  File "/AReaL/areal/trainer/rl.py", line 311, in train\n',
              "    stats = self.actor.ppo_update(batch)\n"]
    log = tmp_path / "trainer.log"
    log.write_text("".join(lines[:-5] + frames + lines[-5:] + frames + ["torch.OutOfMemoryError: CUDA out of memory.\n"]))
    tracebacks = read_areal_log(log).events.filter(pl.col("message").str.starts_with("Traceback")).sort("line")
    assert tracebacks["kind"].cast(pl.String).to_list() == ["traceback", "cuda_oom"]


@pytest.mark.parametrize("rows", [0, 5, 20])
def test_a_realhf_table_its_header_has_not_followed_yet_is_no_steps_before(tmp_path: Path, rows: int) -> None:
    """realhf prints a step's table before its header: a log ending between them (a run killed, a
    live log read mid-write) holds a table no step owns yet, not more values of the step above."""
    spec = RunSpec(era="realhf", last_step=6, reward=lambda s: 0.1 * s)
    whole = write_run(tmp_path / "outputs", spec).trainer_log
    lines = whole.read_text().splitlines(keepends=True)
    last_header = max(i for i, line in enumerate(lines) if "(global step 6) finishes" in line)
    returns = max(i for i in range(last_header) if "RPC name actor_train returns" in lines[i])
    top = next(i for i in range(returns, last_header) if lines[i].lstrip("\x1b[0123456789m").startswith("╒"))
    cut = tmp_path / "trainer.log"
    cut.write_text("".join(lines[: top + 1 + rows]))
    log = read_areal_log(cut)
    assert log.steps["step"].to_list() == [1, 2, 3, 4, 5]
    assert not log.metrics.filter(pl.struct("step", "key").is_duplicated()).height
    assert values(log, "ppo_actor/task_reward/avg") == {s: pytest.approx(0.1 * s) for s in range(1, 6)}
    header_5 = max(i for i, line in enumerate(lines) if "(global step 5) finishes" in line)
    # (the step's tables before its header: the generation's time stats, then the cut one; fancy_grid rules between rows)
    written = sum(line.startswith("│") for line in lines[header_5 : top + 1 + rows])
    orphans = [n for n in log.notes if "belong to no step header" in n]
    assert orphans == [f"{written} table rows belong to no step header (pasted or cut-off tables)"]


def test_realhf_time_tables_are_their_steps_and_leave_the_stats_tables_whole(tmp_path: Path) -> None:
    """realhf prints each RPC's time stats (2 or 3 values: a narrower table, often a log's first)
    before the step's header, as it does the step's stats: each is its own step's, and the stats
    tables after it are read whole, 4 pairs a row."""
    lines = []
    for step in range(1, 6):
        t = f"20250101-10:{step:02d}:00.000"
        lines += [
            f"{GREEN}{t} realhf.system.model_function_call INFO: Model rpc actor_gen finished. "
            f"Request-reply time 1.0000s. Detailed time stats:{RESET}",
            tabulate_stats({"timeperf/actor_generate/pre-data_transfer": 0.1,
                            "timeperf/actor_generate/main": 10.0 + step}, floatfmt=".2f") + ".",
            f"{GREEN}{t} realhf.system.model_function_call INFO: RPC name actor_train returns{RESET}",
            tabulate_stats({f"ppo_actor/key{i}": step + i / 100 for i in range(16)}),
            f"{GREEN}{t} master worker INFO: Epoch 1/1 step {step}/5 (global step {step}) finishes. "
            f"#End to end# execution time: *1.000*s. Total time consumption: 1.000s. {RESET}",
        ]
    path = tmp_path / "master_worker-0"
    path.write_text("\n".join(lines) + "\n")
    log = read_areal_log(path)
    assert values(log, "timeperf/actor_generate/main") == {s: 10.0 + s for s in range(1, 6)}
    for i in range(16):
        assert values(log, f"ppo_actor/key{i}") == {s: pytest.approx(s + i / 100) for s in range(1, 6)}
    assert log.notes == ()


@pytest.mark.parametrize("actor", ["MasterWorker", "master_worker/0", "\x1b[36mMasterWorker"])
def test_ray_prefix_and_merged_log_prefixes(tmp_path: Path, actor: str) -> None:
    # (AReaL's tutorial shows the second; Ray colours its prefix in a file too: every table row was lost)
    colour, actor = ("\x1b[36m", actor[5:]) if actor.startswith("\x1b") else ("", actor)
    prefix = f"{colour}({actor} pid=11559, ip=10.1.2.3){chr(27) + '[0m' if colour else ''}"
    ray = write_run(tmp_path / "a", RunSpec(era="realhf", last_step=5, ray_prefix=prefix))
    log = read_areal_log(ray.trainer_log)
    assert len(log.steps) == 5
    assert log.metrics.filter(pl.col("key").cast(pl.String).str.ends_with("task_reward/avg")).height == 5
    merged = write_run(tmp_path / "b", RunSpec(era="v0.5", last_step=5, merged_log=True))
    assert merged.merged_log is not None
    log = read_areal_log(merged.merged_log)
    assert log.steps["step"].to_list() == [1, 2, 3, 4, 5]
    assert log.metrics.filter(pl.col("key") == "ppo_actor/task_reward/avg").height == 5


def test_relaunch_appended_later_copy_wins_and_resume_is_an_event(tmp_path: Path) -> None:
    spec = RunSpec(
        last_step=30,
        reward=lambda s: 0.5,
        recover_mode="auto",
        recover_freq_steps=10,
        relaunch=Relaunch(stop_after=25, resume_from=20, first_reward=lambda s: 0.125),
    )
    paths = write_run(tmp_path / "outputs", spec)
    log = read_areal_log(paths.trainer_log)
    rewards = values(log, "grpo_actor/task_reward/avg")
    assert sorted(rewards) == list(range(1, 31))
    assert all(rewards[s] == 0.5 for s in range(21, 26))
    assert log.events.filter(pl.col("kind") == "run_resumed").height == 1
    # The first attempt's copies of steps 21–25 are kept apart, at their own header lines.
    earlier = log.superseded.filter(pl.col("key") == "grpo_actor/task_reward/avg").sort("line")
    assert earlier["step"].to_list() == list(range(21, 26)) and set(earlier["value"]) == {0.125}
    headers = log.steps.filter(pl.col("step").is_between(21, 25)).sort("line")["line"].to_list()
    assert earlier["line"].to_list() == headers[:5] and not set(earlier["line"]) & set(log.metrics["line"])


def test_failure_lines_become_events_with_their_lines(tmp_path: Path) -> None:
    def timeout(step: int, header: datetime) -> list[LogLine]:
        message = "HTTP request to 172.17.0.2:30000/generate timed out after 600.00s (attempt 1/3)"
        return [LogLine(header - timedelta(seconds=5), message, "/AReaL/areal/utils/http.py", "WARNING")] if step == 3 else []

    spec = RunSpec(last_step=4, step_lines=timeout)
    paths = write_run(tmp_path / "outputs", spec)
    log = read_areal_log(paths.trainer_log)
    timeouts = log.events.filter(pl.col("kind") == "request_timeout")
    assert timeouts.height == 1
    row = timeouts.row(0, named=True)
    text = paths.trainer_log.read_text().splitlines()[row["line"] - 1]
    assert "timed out after 600.00s" in text
    assert row["severity"] == "warning" and row["source"] == "areal"


def test_memory_lines_are_metrics(tmp_path: Path) -> None:
    paths = write_run(tmp_path / "outputs", RunSpec(last_step=3))
    log = read_areal_log(paths.trainer_log)
    used = log.metrics.filter(pl.col("key") == "mem/device_used_gb")
    assert used.height >= 3
    assert used["value"].is_between(133.0, 134.0).all()
    assert (log.metrics.filter(pl.col("key") == "mem/device_total_gb")["value"] == 139.8).all()


def test_gzip_crlf_invalid_utf8_and_cut_off_table(tmp_path: Path) -> None:
    text = stats_block(1, [{"a/b": 1.0, "c/d": 2.0}]) + stats_block(2, [{"a/b": 3.0, "c/d": 4.0}])
    damaged = text.replace("\n", "\r\n").encode() + b"\xff\xfe junk \x00\n" + stats_block(3, [{"a/b": 5.0}]).encode()
    cut = damaged[: damaged.rindex(b"0000e+00") + 3]  # the last table ends mid-value
    plain = tmp_path / "trainer.log"
    plain.write_bytes(cut)
    zipped = tmp_path / "trainer.log.1.gz"
    zipped.write_bytes(gzip.compress(cut))
    for path in (plain, zipped):
        log = read_areal_log(path)
        assert values(log, "a/b") == {1: 1.0, 2: 3.0}
        assert log.unparsed_lines == 2
        assert any("cut off" in note for note in log.notes)


def test_empty_and_binary_files_do_not_raise(tmp_path: Path) -> None:
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    junk = tmp_path / "junk.log"
    junk.write_bytes(bytes(range(256)) * 100)
    assert read_areal_log(empty).steps.is_empty()
    log = read_areal_log(junk)
    assert log.steps.is_empty() and log.unparsed_lines > 0


def test_traceback_is_one_event_with_the_kind_of_its_last_exception(tmp_path: Path) -> None:
    path = tmp_path / "trainer.log"
    path.write_text(
        stats_block(1, [{"a": 1.0}])
        + "Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\nValueError: inner\n\n"
        "During handling of the above exception, another exception occurred:\n\n"
        "Traceback (most recent call last):\n  File \"y.py\", line 2, in f\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    )
    events = read_areal_log(path).events
    assert events["kind"].to_list() == ["cuda_oom"]
    assert events["line"][0] == path.read_text().splitlines().index("Traceback (most recent call last):") + 1


def test_a_chain_raised_again_as_a_plain_error_keeps_the_kind_of_its_cause(tmp_path: Path) -> None:
    """A CUDA OOM re-raised by the loop as ``RuntimeError: train step 1 failed``: the chain's end says
    nothing of its own, so the event is the OOM's (it was a `traceback` whose message left the OOM
    out: `events --kind cuda_oom` found nothing, the crash's advice never said memory), named in
    its message; a chain ending in an exception of a kind of its own keeps that kind (above)."""
    path = tmp_path / "trainer.log"
    path.write_text(
        stats_block(1, [{"a": 1.0}])
        + "Traceback (most recent call last):\n  File \"engine.py\", line 512, in train_batch\n    loss.backward()\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n\n"
        "The above exception was the direct cause of the following exception:\n\n"
        "Traceback (most recent call last):\n  File \"gsm8k_grpo.py\", line 201, in main\n"
        "    raise RuntimeError(f\"train step {global_step} failed\") from e\nRuntimeError: train step 1 failed\n"
    )
    [event] = read_areal_log(path).events.to_dicts()
    assert event["kind"] == "cuda_oom"
    assert event["line"] == path.read_text().splitlines().index("Traceback (most recent call last):") + 1
    assert "CUDA out of memory" in event["message"] and event["message"].endswith("RuntimeError: train step 1 failed")


@pytest.mark.parametrize(
    ("said", "raised", "kind", "at"),
    [
        # The exception says what failed: the traceback's kind, at its line.
        ("Training step failed", "torch.OutOfMemoryError: CUDA out of memory.", "cuda_oom", "Traceback (most recent call last):"),
        # The line says it (a kind of its own): the line.
        ("HTTP request to 10.0.0.5:17243/generate timed out after 3600.00s (attempt 3/3)", "torch.OutOfMemoryError: CUDA out of memory.",
         "request_timeout", "ERROR"),
        # Neither does: a traceback, told by the line and what it raised (a run that died of it
        # crashed), cited at that line, as its message begins with it.
        ("Error cleaning up worker actor/0: 'psutil'", "KeyError: 'psutil'", "traceback", "ERROR"),
    ],
)
def test_an_error_line_and_its_traceback_are_one_event(tmp_path: Path, said: str, raised: str, kind: str, at: str) -> None:
    """``logger.exception``: an error line, then the traceback it prints."""
    path = tmp_path / "trainer.log"
    path.write_text(
        stats_block(1, [{"a": 1.0}])
        + f"20250115-10:00:05.000 RayWorker ERROR: {said}\n"
        f"Traceback (most recent call last):\n  File \"y.py\", line 2, in f\n{raised}\n"
    )
    events = read_areal_log(path).events
    assert events["kind"].to_list() == [kind]
    assert at in path.read_text().splitlines()[events["line"][0] - 1]
    assert events["time"][0] == datetime(2025, 1, 15, 10, 0, 5)
    if kind == "traceback":
        assert events["message"][0] == f"20250115-10:00:05.000 RayWorker ERROR: {said} … {raised}"


@pytest.mark.parametrize(
    ("said", "kind", "severity"),
    [
        # The client gave up: that is the line's news, whatever the last attempt's error was.
        ("ERROR: Failed after 3 retries each. Payload: {}. Addr: 10.0.0.5:17243. Endpoint: /generate. "
         "Last error: ServerDisconnectedError('Server disconnected')", "retries_exhausted", "error"),
        ("ERROR: Failed after 3 retries each. Payload: {}. Addr: 10.0.0.5:17243. Endpoint: /generate. Last error: "
         "ClientConnectorError(ConnectionKey(host='10.0.0.5'), ConnectionRefusedError(111, \"Connect call failed ('10.0.0.5', 17243)\"))",
         "retries_exhausted", "error"),
        # The server answered, with an error status (a prompt longer than its context).
        ("WARNING: HTTP request to 10.0.0.5:17243/generate failed with ClientResponseError: 400, message='Bad Request', "
         "url='http://10.0.0.5:17243/generate' (attempt 1/3)", "request_rejected", "warning"),
    ],
)
def test_a_clients_last_word_on_a_request_is_its_own_kind(tmp_path: Path, said: str, kind: str, severity: str) -> None:
    path = tmp_path / "trainer.log"
    path.write_text(stats_block(1, [{"a": 1.0}]) + f"20251111-11:40:00.000 HTTPUtils {said}\n")
    [event] = read_areal_log(path).events.iter_rows(named=True)
    assert (event["kind"], event["severity"]) == (kind, severity)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("issue1020_statslogger_header.log", {"steps": [1]}),
        ("issue1065_local_scheduler_cleanup_error.log", {"kinds": {"traceback"}}),
        ("issue145_realhf_gserver_weight_update_crash.log", {"kinds": set()}),
        ("issue355_update_weights_from_disk_timeout.log", {"kinds": {"traceback"}}),
    ],
)
def test_real_areal_excerpts(name: str, expected: dict) -> None:
    log = read_areal_log(SAMPLES / name)
    if "steps" in expected:
        assert log.steps["step"].to_list() == expected["steps"]
    if "kinds" in expected:
        assert expected["kinds"] <= set(log.events["kind"].to_list())
    assert log.lines == len((SAMPLES / name).read_bytes().splitlines())


@pytest.mark.parametrize("batch_bytes", [1, 3000, 4096])
def test_batches_do_not_change_the_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch_bytes: int) -> None:
    """Batch cuts fall inside tables, tracebacks and relaunches; lines stay numbered as in the file.
    (One byte makes every line a batch of its own: a short run, checked in its damaged copy alone,
    which holds all its lines and more; 3000 and 4096 bytes cut the tables at other lines.)"""
    import parsers._lines as lines

    def timeout(step: int, header: datetime) -> list[LogLine]:
        message = "HTTP request to 172.17.0.2:30000/generate timed out after 600.00s (attempt 1/3)"
        return [LogLine(header - timedelta(seconds=5), message, "/AReaL/areal/utils/http.py", "WARNING")] if step % 7 == 3 else []

    spec = RunSpec(last_step=7, step_lines=timeout, recover_mode="auto", recover_freq_steps=4,
                   relaunch=Relaunch(stop_after=6, resume_from=4, first_reward=lambda s: 0.125))
    log_path = write_run(tmp_path / "outputs", spec).trainer_log
    damaged = tmp_path / "damaged.log"
    damaged.write_bytes(log_path.read_bytes().replace(b"\n", b"\r\n", 40) + b"\xff\xfe junk\nTraceback (most recent call last):\n  x\nValueError: y")
    zipped = tmp_path / "trainer.log.gz"
    zipped.write_bytes(gzip.compress(log_path.read_bytes()))
    whole = {path: read_areal_log(path) for path in (log_path, damaged)}
    assert whole[log_path].metrics.height > 500 and whole[log_path].events.height > 3
    monkeypatch.setattr(lines, "BATCH_BYTES", batch_bytes)
    checked = [*whole.items(), (zipped, whole[log_path])]
    if batch_bytes == 1:
        checked = [(damaged, whole[damaged])]
    for path, expected in checked:
        log = read_areal_log(path)
        for frame in ("steps", "metrics", "events"):
            got, want = getattr(log, frame), getattr(expected, frame)
            if path is zipped:
                got, want = got.drop("file"), want.drop("file")
            assert got.equals(want), (path.name, frame)
        assert (log.lines, log.unparsed_lines, log.notes, log.facts) == (
            expected.lines, expected.unparsed_lines, expected.notes, expected.facts)
        # Table and memory rows, batch by batch, have their columns cut alike: the run loader's
        # next column (``source``) is added without the frame being copied whole.
        chunks = log.metrics["time"].n_chunks()
        assert chunks > 1 and log.metrics.filter(pl.col("key") == "mem/device_used_gb").height > 0
        assert log.metrics.with_columns(pl.lit("areal").alias("source"))["time"].n_chunks() == chunks


@pytest.mark.parametrize(("damage", "joined"), [
    (lambda line: b"[rollout worker 3] progress 17%" + line, True),  # another writer's partial line, no newline between
    (lambda line: b"\0" * 64 + line, True),
    (lambda line: b"\x89\xfe\x01\x02" + line, True),
    (lambda line: line.replace(b"INFO", b"IN\xffFO", 1), False),  # its logger prefix damaged: read by its step words
], ids=["partial-line", "nuls", "binary", "bad-level"])
def test_a_step_header_after_junk_on_its_line_keeps_its_step_and_table(tmp_path: Path, damage, joined: bool) -> None:
    """The header's table went to the step above (two tables averaged into one step's value that
    was never logged) and the step was gone, with nothing said."""
    source = Path(__file__).parent / "fixtures/sglang_hang/outputs/logs/root/gsm8k-grpo-hang/trial0/trainer.log.gz"
    lines = gzip.decompress(source.read_bytes()).split(b"\n")
    at = next(i for i, line in enumerate(lines) if b"Train step 250/" in line)
    (tmp_path / "plain.log").write_bytes(b"\n".join(lines))
    lines[at] = damage(lines[at])
    (tmp_path / "damaged.log").write_bytes(b"\n".join(lines))
    plain, hurt = read_areal_log(tmp_path / "plain.log"), read_areal_log(tmp_path / "damaged.log")
    assert hurt.steps["step"].to_list() == plain.steps["step"].to_list()
    values = ["step", "key", "value"]
    assert hurt.metrics.select(values).equals(plain.metrics.select(values))
    said = [n for n in hurt.notes if "began after other output on the same line" in n]
    assert (said, hurt.unparsed_lines) == ((["1 logger lines began after other output on the same line (two writers, no "
                                             "newline between): read from where they begin"], plain.unparsed_lines)
                                           if joined else ([], plain.unparsed_lines + 1))


@pytest.mark.parametrize("said", ["Killed", "Traceback (most recent call last):\n  File \"/AReaL/x.py\", line 3, in f\n"
                                  "ValueError: bad thing"], ids=["bare-killed", "traceback"])
def test_an_untimed_failure_after_the_last_steps_table_is_in_the_next_step(tmp_path: Path, said: str) -> None:
    """Dated by the line above it, the header's or its table's, a bare ``Killed`` fell in step 30
    by time: the crash was said to be during step 30, and step 30's checkpoint passed over."""
    from dataclasses import replace

    from forensics import analyze

    spec = RunSpec(last_step=30, save_freq_steps=10)
    # (no line of its own after the table: the failure is dated by the lines above it)
    paths = write_run(tmp_path / "outputs", replace(spec, extra_lines=[LogLine(time=schedule(spec)[-1].time, message=said)]))
    [run] = analyze([paths.fileroot]).runs
    [failure] = run.events.filter(pl.col("severity").is_in(["error", "fatal"])).rows(named=True)
    assert failure["time"] == run.steps["time"].max() and failure["step"] == 31
    assert [(i.kind, i.onset_step) for i in run.incidents] == [("crash", 31)]
    assert run.recommendation.step == 30


@pytest.mark.parametrize(("raised", "kind"), [
    ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, "
     "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5", "nccl_error"),
    ("RuntimeError: CUDA error: an illegal memory access was encountered", "illegal_memory_access"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", "cuda_oom"),
])
def test_a_traceback_ending_in_a_torch_error_is_one_event_of_its_kind(tmp_path: Path, raised: str, kind: str) -> None:
    """torch says ``NCCL error in:`` (the traceback was untyped, its exception line an event of its
    own), and an illegal memory access was told twice: by the traceback and by its last line."""
    from dataclasses import replace

    spec = RunSpec(last_step=10)
    said = f'Traceback (most recent call last):\n  File "/AReaL/areal/trainer/rl.py", line 311, in train\n{raised}'
    paths = write_run(tmp_path / "outputs", replace(spec, extra_lines=[LogLine(time=schedule(spec)[4].time, message=said)]))
    log = read_areal_log(paths.trainer_log)
    start = next(i for i, line in enumerate(paths.trainer_log.read_text().splitlines(), 1) if line.startswith("Traceback"))
    assert log.events.filter(pl.col("line").is_between(start, start + 2)).select(pl.col("kind").cast(pl.String), "line").rows() == [(kind, start)]


def test_a_ranks_traceback_with_torchruns_prefix_is_its_crash(tmp_path: Path) -> None:
    """torchrun prints a rank's uncaught exception with ``[rank0]: `` on every line: one event of
    the exception's kind at the traceback's first line, and the run's crash (not "healthy"); a
    ``[rank0]: KeyboardInterrupt`` is still a Ctrl-C, no crash."""
    from dataclasses import replace

    from forensics import analyze

    spec = RunSpec(last_step=45, save_freq_steps=10)
    lines = ['Traceback (most recent call last):', '  File "/AReaL/examples/math/gsm8k_grpo.py", line 262, in <module>',
             '    main(sys.argv[1:])', '  File "/AReaL/areal/engine/fsdp_engine.py", line 512, in train_batch', '    loss.backward()',
             'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB']
    said = "\n".join("[rank0]: " + line for line in lines)
    paths = write_run(tmp_path / "outputs", replace(spec, extra_lines=[LogLine(time=schedule(spec)[-1].time, message=said)]))
    start = next(i for i, line in enumerate(paths.trainer_log.read_text().splitlines(), 1) if line.startswith("[rank0]: Traceback"))
    log = read_areal_log(paths.trainer_log)
    assert log.events.filter(pl.col("line") >= start).select(pl.col("kind").cast(pl.String), "line").rows() == [("cuda_oom", start)]
    [run] = analyze([paths.fileroot]).runs
    [crash] = run.incidents
    assert (crash.kind, crash.onset_step, crash.cause) == ("crash", 46, "training_worker_crash")
    assert "torch.OutOfMemoryError: CUDA out of memory" in crash.summary and "[rank0]" not in crash.summary
    stopped = "\n".join("[rank0]: " + line for line in [*lines[:5], "KeyboardInterrupt"])
    paths = write_run(tmp_path / "stopped", replace(spec, extra_lines=[LogLine(time=schedule(spec)[-1].time, message=stopped)]))
    assert not analyze([paths.fileroot]).runs[0].incidents


def test_a_logger_line_whose_time_is_no_date_keeps_its_step(tmp_path: Path) -> None:
    """A damaged digit (month 13) makes a header's time no date: the step is still read, without a
    time, and the lines so read are said."""
    import re

    source = Path(__file__).parent / "fixtures/areal_seed000/outputs/logs/root/gsm8k-grpo-full-local/trial0/trainer.log.gz"
    text = gzip.decompress(source.read_bytes()).decode()
    start, end = text.index("Train step 500/"), text.index("Train step 510/")
    start = text.rindex("\n", 0, start)
    damaged = text[:start] + re.sub(r"(?<!\d)(\d{4})\d\d(\d\d-\d\d:\d\d:\d\d\.\d{3})", r"\g<1>13\2", text[start:end]) + text[end:]
    (tmp_path / "plain.log").write_text(text)
    (tmp_path / "damaged.log").write_text(damaged)
    plain, hurt = read_areal_log(tmp_path / "plain.log"), read_areal_log(tmp_path / "damaged.log")
    assert hurt.steps["step"].to_list() == plain.steps["step"].to_list()
    undated = hurt.steps.filter(pl.col("time").is_null())["step"].to_list()
    assert set(range(501, 510)) <= set(undated) <= set(range(499, 512)), undated  # the lines cut around steps 500-510
    assert hurt.unparsed_lines == plain.unparsed_lines
    assert any("no date" in note for note in hurt.notes)
    values = ["step", "key", "value"]
    assert hurt.metrics.filter(pl.col("step").is_not_null()).select(values).equals(
        plain.metrics.filter(pl.col("step").is_not_null()).select(values))


@pytest.mark.parametrize(
    ("damage", "steps"),
    [
        ("progress bar", [1, 2, 3]),  # tqdm's redraws and ``\r`` before the header: as a terminal shows it
        ("nul in Epoch", [1, 2, 3]),  # the step part is whole: the step is read
        ("letter for a digit", [1, 3]),  # no readable step: its table is skipped, and said
    ],
)
def test_a_damaged_step_header_never_lends_its_table_to_the_step_above(tmp_path: Path, damage: str, steps: list[int]) -> None:
    """One damaged character in step 2's header: step 1 keeps its own values, never the mean of
    its table and step 2's (as two ``Stats`` tables of one step would be)."""
    text = "".join(stats_block(step, [{"grpo_actor/task_reward/avg": step / 10}], time=f"20251111-11:3{step}:11.251") for step in (1, 2, 3))
    start = text.index("20251111-11:32:11.251 StatsLogger INFO: Epoch")
    header = text.index("Train step 2/", start)
    text = {
        "progress bar": text[:start] + "rollout  42%|####      | 13/32\rrollout  44%|####      | 14/32\r" + text[start:],
        "nul in Epoch": text[:start] + text[start:].replace("Epoch", "Ep\0och", 1),
        "letter for a digit": text[:header] + "Train step O/" + text[header + len("Train step 2/"):],
    }[damage]
    (tmp_path / "trainer.log").write_text(text)
    log = read_areal_log(tmp_path / "trainer.log")
    assert log.steps["step"].to_list() == steps
    assert values(log, "grpo_actor/task_reward/avg") == {step: step / 10 for step in steps}
    if damage == "letter for a digit":
        assert "1 step headers carry no readable step number (a damaged line): their tables were skipped" in log.notes
        assert log.unparsed_lines == 1


@pytest.mark.skipif(not SAMPLES.is_dir(), reason="shared/samples not present")
def test_a_worker_log_carrying_the_servers_lines_has_their_failures() -> None:
    """A realhf generation-server worker's log holds SGLang's own lines: the server's scheduler
    exception and failed cache flush are events of the run, as in an llm_server.log."""
    from forensics import analyze

    [run] = analyze(SAMPLES / "issue145_realhf_gserver_weight_update_crash.log").runs
    assert run.sources[0].kind == "areal_log"
    by_line = dict(run.events.select("line", "kind").iter_rows())
    assert by_line[10] == "cache_flush_failed" and by_line[11] == "scheduler_exception"


def test_a_worker_log_is_not_read_twice_for_areals_own_lines(tmp_path: Path) -> None:
    """A worker log in AReaL's format is read by both readers; the SGLang reader adds only the
    server's own kinds, so AReaL's retries are not counted again as refused connections."""
    from forensics import analyze

    trainer = next((Path(__file__).parent / "fixtures" / "areal_seed001" / "outputs" / "logs").rglob("trainer.log.gz"))
    (tmp_path / "as_trainer").mkdir()
    (tmp_path / "as_worker").mkdir()
    shutil.copy(trainer, tmp_path / "as_trainer" / "trainer.log.gz")
    shutil.copy(trainer, tmp_path / "as_worker" / "model_worker-0.gz")
    [alone], [worker] = (analyze(tmp_path / name).runs for name in ("as_trainer", "as_worker"))
    assert worker.sources[0].kind == "areal_log"

    def counted(run):
        return sorted(run.events.select("line", "kind").iter_rows())

    assert counted(worker) == counted(alone) and worker.events.height > 1000


def test_a_table_row_with_bytes_that_are_not_utf8_is_unparsed_not_a_new_key(tmp_path: Path) -> None:
    """``\\xff\\xfe`` before a key's name: the cell was filed under a key no run has
    (``grpo_actor/��task_reward/avg``) and nothing said so. The row is damaged: counted unparsed."""
    text = stats_block(1, [{"grpo_actor/task_reward/avg": 0.5, "grpo_actor/grad_norm": 0.3}]) + stats_block(
        2, [{"grpo_actor/task_reward/avg": 0.625, "grpo_actor/grad_norm": 0.2}], time="20251111-11:38:11.251")
    raw = text.encode()
    at = raw.rindex(b"task_reward/avg")
    path = tmp_path / "trainer.log"
    path.write_bytes(raw[:at] + b"\xff\xfe" + raw[at:])
    log = read_areal_log(path)
    assert sorted(set(log.metrics["key"].cast(pl.String))) == ["grpo_actor/grad_norm", "grpo_actor/task_reward/avg"]
    assert values(log, "grpo_actor/task_reward/avg") == {1: 0.5}
    assert log.unparsed_lines == 1


def test_lines_of_other_writers_between_a_stats_line_and_its_table_leave_it_its_step(tmp_path: Path) -> None:
    """In a timeout flood the rollout thread's warnings land between `Stats (1/1):` and its table:
    the tables of steps 36–45 went to step 35 (its value the last of theirs: a collapse "from step
    35", a healthy step), none of theirs read."""
    run = write_run(tmp_path, RunSpec(last_step=60, reward=lambda s: 0.0 if s >= 40 else 0.5 + 0.01 * (s % 9)))
    lines, step, out = run.trainer_log.read_text().splitlines(keepends=True), 0, []
    for line in lines:
        out.append(line)
        if " Train step " in line and " done" in line:
            step += 1
        if "Stats (1/1):" in line and 36 <= step <= 45:
            stamp = line.split(" ", 1)[0]
            out += [f"{stamp} /AReaL/areal/utils/http.py WARNING: HTTP request to 172.17.0.2:30000/generate timed out "
                    f"after 600.00s (attempt {k}/3)\n" for k in (1, 2)]
    run.trainer_log.write_text("".join(out))
    log = read_areal_log(run.trainer_log)
    reward = log.metrics.filter(pl.col("key") == "grpo_actor/task_reward/avg").sort("step")
    assert reward["step"].to_list() == list(range(1, 61))
    assert reward.filter(pl.col("value") == 0)["step"].min() == 40


@pytest.mark.parametrize("damage", [b"Train st\xe5p", b"Trai\x00\x00 step", b"{'loss': 0.1}"])
def test_a_step_whose_header_was_lost_is_not_averaged_into_the_step_above(tmp_path: Path, damage: bytes) -> None:
    """A flipped byte, a NUL or another writer's bytes in step 21's header: its table follows step
    20's own under one header. It is step 21's, skipped and said, never averaged into step 20's
    (a second ``Stats (1/1)`` is no minibatch: those count ``(1/k)`` … ``(k/k)``)."""
    paths = write_run(tmp_path / "outputs", RunSpec(last_step=40, reward=lambda s: 0.25 if s % 2 else 0.75))
    text = paths.trainer_log.read_bytes()
    at = text.index(b"Train step 21/")
    paths.trainer_log.write_bytes(text[:at] + damage + text[at + len(b"Train step"):])
    log = read_areal_log(paths.trainer_log)
    reward = values(log, "grpo_actor/task_reward/avg")
    assert reward[20] == 0.75 and 21 not in reward and reward[22] == 0.75
    assert any(note.startswith("1 stats tables follow a step's own with no step header of their own") for note in log.notes), log.notes


def test_zeroed_pages_that_swallowed_a_header_leave_the_rows_below_them_to_no_step(tmp_path: Path) -> None:
    """A crash leaves two 4 KiB pages of zeros in place across step 30's header (ext4, XFS): the
    rows of step 30's table below them are no step's; step 29 keeps its own values, and the
    NUL bytes are said."""
    paths = write_run(tmp_path / "outputs", RunSpec(last_step=40, reward=lambda s: 0.0 if s >= 30 else 0.5))
    text = paths.trainer_log.read_bytes()
    header = text.rindex(b"\n", 0, text.index(b"Train step 30/")) + 1
    start = (header - 2500) // 4096 * 4096
    paths.trainer_log.write_bytes(text[:start] + b"\0" * 8192 + text[start + 8192:])
    log = read_areal_log(paths.trainer_log)
    reward = values(log, "grpo_actor/task_reward/avg")
    assert reward.get(29, 0.5) == 0.5 and 30 not in reward and reward[31] == 0.0
    assert any("lines hold NUL bytes" in note for note in log.notes), log.notes


def test_minibatch_tables_one_to_k_under_one_header_are_one_steps(tmp_path: Path) -> None:
    """v0.4.0 with ``ppo_n_minibatches: 2``: ``Stats (1/2)`` and ``(2/2)`` are one step's; a
    ``(1/2)`` again under that header is the next step's, its header lost."""
    text = stats_block(1, [{"grpo_actor/k0": 1.0}, {"grpo_actor/k0": 3.0}])
    lost = stats_block(2, [{"grpo_actor/k0": 10.0}, {"grpo_actor/k0": 30.0}]).split("\n", 1)[1]  # (its header gone)
    path = tmp_path / "trainer.log"
    path.write_text(text + lost + stats_block(3, [{"grpo_actor/k0": 5.0}, {"grpo_actor/k0": 7.0}]))
    log = read_areal_log(path)
    assert values(log, "grpo_actor/k0") == {1: 2.0, 3: 6.0}
    assert any(note.startswith("2 stats tables follow") for note in log.notes), log.notes


def test_a_config_is_read_by_dotted_key_and_a_hostile_one_in_bounded_time(tmp_path: Path, fixture_run) -> None:
    """Aliases can make a 2 KB config.yaml a tree of 2**40 keys: it is read no further than any
    real config reaches, and a nesting deeper than the parser goes is no config, not a crash."""
    import time

    from parsers.areal_config import read_areal_config

    [config] = fixture_run("areal_seed000").rglob("config.yaml")
    settings = read_areal_config(config)
    assert settings["experiment_name"] == "gsm8k-grpo-full-local" and settings["cluster.name_resolve.type"] == "nfs"
    assert settings["rollout.request_timeout"] == 600

    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("a0: &a0 {x: 1, y: 2}\n" + "".join(f"a{i}: &a{i} {{p: *a{i - 1}, q: *a{i - 1}}}\n" for i in range(1, 41)))
    started = time.monotonic()
    read = read_areal_config(bomb)
    assert time.monotonic() - started < 10 and 0 < len(read) <= 100_000
    assert read["a1.p.x"] == 1  # (what was read is the file's)
    deep = tmp_path / "deep.yaml"
    deep.write_text("a: " + "{b: " * 50_000 + "1" + "}" * 50_000)
    assert read_areal_config(deep) == {}
