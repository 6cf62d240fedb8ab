"""Why the reward died, told from both sides: the trainer's retries and the server's own log."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from conftest import read_line
from typer.testing import CliRunner

from forensics.cli import app

runner = CliRunner()
DERIVED = {"memory_peak", "last_server_activity", "metric", "last_step"}


def first_incident(path: Path, tmp_path: Path) -> dict:
    out = tmp_path / "a.json"
    result = runner.invoke(app, ["analyze", str(path), "--json", str(out), "--no-html"])
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text())["runs"][0]["incidents"][0]


@pytest.mark.parametrize(
    ("fixture", "onset", "cause"),
    [
        ("sglang_hang", 250, "inference_server_unresponsive"),
        ("sglang_oom", 180, "inference_server_oom"),
        ("sglang_healthy_collapse", 120, "reward_pipeline"),
    ],
)
def test_each_server_fixture_names_its_cause(fixture_run, tmp_path: Path, fixture: str, onset: int, cause: str) -> None:
    incident = first_incident(fixture_run(fixture), tmp_path)
    assert (incident["onset_step"], incident["cause"]) == (onset, cause)
    assert incident["confidence"] >= 0.75
    assert incident["suggestions"]
    for item in incident["evidence"]:
        if item["kind"] in DERIVED:
            continue
        line = re.sub(r"\x1b\[[0-9;]*m", "", read_line(item["file"], item["line"])).rstrip()
        assert item["text"][:120] in line or item["text"].startswith(line)


def test_hang_evidence_comes_from_both_logs(fixture_run, tmp_path: Path) -> None:
    incident = first_incident(fixture_run("sglang_hang"), tmp_path)
    files = {Path(e["file"]).name for e in incident["evidence"]}
    assert {"trainer.log.gz", "llm_server.log.gz"} <= files
    kinds = {e["kind"] for e in incident["evidence"]}
    assert "request_timeout" in kinds and "last_server_activity" in kinds
    assert "stayed up" in incident["summary"] or "down only later" in incident["summary"]


def test_oom_shows_the_memory_peak_and_the_crash(fixture_run, tmp_path: Path) -> None:
    incident = first_incident(fixture_run("sglang_oom"), tmp_path)
    kinds = {e["kind"] for e in incident["evidence"]}
    assert {"kv_cache_retract", "cuda_oom", "memory_peak"} <= kinds
    assert "0.99" in incident["summary"]
    assert any("mem_fraction_static=0.9" in s for s in incident["suggestions"])


def test_healthy_server_is_not_blamed(fixture_run, tmp_path: Path) -> None:
    incident = first_incident(fixture_run("sglang_healthy_collapse"), tmp_path)
    assert not incident["cause"].startswith("inference_server")
    assert "kept answering" in incident["summary"]


def test_server_metrics_are_on_the_step_axis(fixture_run) -> None:
    import polars as pl

    from forensics import analyze

    run = analyze([fixture_run("sglang_oom")]).runs[0]
    usage = run.metrics.filter(pl.col("key") == "sglang/token_usage")
    assert usage.height > 100 and usage["step"].null_count() == 0
    assert set(usage["source"].unique()) == {"sglang"}
    near = usage.filter(pl.col("step").is_between(170, 180))["value"]
    assert near.max() >= 0.95
    http = run.metrics.filter(pl.col("key").cast(pl.String).str.starts_with("sglang/http/generate/200"))
    assert http["value"].sum() > 0


def test_warning_level_server_log_says_what_it_could_not_see(fixture_run) -> None:
    from forensics import analyze

    run = analyze([fixture_run("areal_seed000")]).runs[0]
    server = next(s for s in run.sources if s.path.endswith("llm_server.log"))
    assert any("warning level" in note for note in server.notes)


def test_a_stall_names_its_one_step_and_claims_nothing_after_it(fixture_run) -> None:
    """The hang fixture stops at step 420; the stall is step 421, after which nothing was logged."""
    from forensics import analyze

    stall = analyze(fixture_run("sglang_hang")).runs[0].incidents[-1]
    assert stall.onset_step == 421 and "73 connection_refused in step 421 vs 0 in the 50 steps before" in stall.summary
    assert "–421" not in stall.summary and "after the onset" not in stall.summary
    assert "(p<1e-15)" in stall.summary and "(p=0)" not in stall.summary  # a tail below float precision


def test_brief_returns_are_told_with_the_relaunches_behind_them(fixture_run) -> None:
    """seed 001: after step 188 the reward came back for a few steps five times, each time a
    relaunched server answered until it died again. Said, not hidden in 'never recovered'."""
    from forensics import analyze

    [collapse] = analyze(fixture_run("areal_seed001")).runs[0].incidents
    assert collapse.onset_step == 188 and not collapse.recovered
    assert "It came back briefly 5 times: steps 683–686 (up to 0.4375), steps 731–734" in collapse.summary
    assert "5 of them right after the server or the run was relaunched, 5 ending as the server exited again" in collapse.summary
    # recover.mode relaunched the run from its recover checkpoint, saved long after the onset (StepInfo global_step=680)
    assert ("The run was relaunched once after the onset (at 2025-11-13T03:27:53.940, trainer.log.gz:39020), resuming "
            "from a checkpoint saved after it (step 680): the relaunch carried the broken state on.") in collapse.summary


def _server_idles_on(run: Path, hours: float, traceback: bool = False) -> Path:
    """The reward-bug fixture's trainer stops after step 200 (4,675 planned) while its server
    answers health checks every 30 s for ``hours`` more; with ``traceback``, the trainer raised first."""
    import gzip
    from datetime import timedelta

    trial = run / "logs/root/gsm8k-grpo-rewardbug/trial0"
    server = trial / "llm_server.log.gz"
    last = datetime(2025, 11, 24, 13, 56, 1)
    probes = "".join(
        f'[{last + timedelta(seconds=30 * i):%Y-%m-%d %H:%M:%S}] INFO:     127.0.0.1:44812 - "GET /health HTTP/1.1" 200 OK\n'
        for i in range(1, int(hours * 120) + 1)
    )
    server.write_bytes(gzip.compress(gzip.decompress(server.read_bytes()) + probes.encode()))
    if traceback:
        log = trial / "trainer.log.gz"
        raised = ("20251124-13:56:30.000 RayWorker ERROR: x\nTraceback (most recent call last):\n"
                  '  File "train.py", line 9, in <module>\ntorch.OutOfMemoryError: CUDA out of memory.\n')
        log.write_bytes(gzip.compress(gzip.decompress(log.read_bytes()) + raised.encode()))
    return trial / "llm_server.log.gz"


def test_a_trainer_silent_while_its_server_answers_on_is_a_stall(fixture_run, tmp_path: Path) -> None:
    """No warning or error after the last step, only a server answering its health checks for
    two hours: the step log stopped, not the logs. Said so offline and in a replay, the server's
    last line as evidence; a run that logged no more than that much of it was not stalled."""
    import shutil

    from forensics import analyze
    from forensics.watch import replay

    run = shutil.copytree(fixture_run("sglang_healthy_collapse"), tmp_path / "outputs")
    assert [i.kind for i in analyze(run).runs[0].incidents] == ["reward_collapse"]  # the fixture as built
    server = _server_idles_on(run, hours=2)
    collapse, stalled = analyze(run).runs[0].incidents
    assert (stalled.kind, stalled.onset_step, stalled.cause) == ("stall", 201, "unknown")
    assert "no step after step 200 for 2.0 h while llm_server.log.gz went on logging, with no warning or error" in stalled.summary
    [seen] = [e for e in stalled.evidence if e.kind == "metric"]
    assert (seen.file, seen.text) == (str(server), "sglang/http/health/200 = 1, logged 120.0 min after the last step")
    # (The server's answers are counted a minute at a time: the row is its last minute's, the line its last.)
    assert read_line(server, seen.line).startswith("[2025-11-24 15:56:01]") and seen.time == datetime(2025, 11, 24, 15, 56)
    [result] = replay([run])
    assert [(a.kind, a.step) for a in result.alarms][-1] == ("stall", 201)

    short = shutil.copytree(fixture_run("sglang_healthy_collapse"), tmp_path / "short")
    _server_idles_on(short, hours=0.1)  # 6 minutes: within a stall's floor (10 min)
    assert [i.kind for i in analyze(short).runs[0].incidents] == ["reward_collapse"]
    assert [a.kind for a in replay([short])[0].alarms] == [a.kind for a in replay([fixture_run("sglang_healthy_collapse")])[0].alarms]


def test_a_trainer_that_raised_and_died_is_a_crash_though_its_server_answers_on(fixture_run, tmp_path: Path) -> None:
    import shutil

    from forensics import analyze

    run = shutil.copytree(fixture_run("sglang_healthy_collapse"), tmp_path / "outputs")
    _server_idles_on(run, hours=2, traceback=True)
    incidents = analyze(run).runs[0].incidents
    assert [(i.kind, i.onset_step) for i in incidents] == [("reward_collapse", 120), ("crash", 201)]
    assert "torch.OutOfMemoryError" in incidents[-1].summary


@pytest.mark.parametrize(("first", "cause"), [(10, "reward_pipeline"), (117, "inference_server_unresponsive")])
def test_failures_the_run_logged_all_along_do_not_explain_a_collapse(tmp_path: Path, first: int, cause: str) -> None:
    """A request timing out every 8 steps since step ``first`` and a reward exactly 0 from step 120:
    timeouts as common before the onset as around it are the run's noise, not the cause (the
    rewards went to 0 on their own); a timeout new at the onset still explains it."""
    from areal_builder import LogLine, RunSpec, healthy_reward, write_run

    from forensics import analyze

    def timeout(step: int, at: datetime) -> list[LogLine]:
        said = "HTTP request to 172.17.0.2:30000/generate timed out after 600.00s (attempt 1/3)"
        return [LogLine(at - timedelta(seconds=20), said, "/AReaL/areal/utils/http.py", "WARNING")] if step >= first and step % 8 == first % 8 else []

    spec = RunSpec(last_step=160, reward=lambda step: 0.0 if step >= 120 else healthy_reward(step), step_lines=timeout)
    write_run(tmp_path / "outputs", spec)
    collapse = analyze(tmp_path / "outputs").runs[0].incidents[0]
    assert (collapse.kind, collapse.onset_step, collapse.cause) == ("reward_collapse", 120, cause)
    if cause == "reward_pipeline":
        # (one logged at step 126 was sent at 117: its 600 s ran through the onset)
        assert ("The only failures around the onset were of kinds the run had logged all along (2 request_timeout in "
                "steps 117–122 vs 6 in the 50 steps before (p=0.2)), not what changed; the rewards themselves went constant") in collapse.summary


#: What an SGLang log at ``sglang.log_level: warning`` (AReaL's default) keeps of the OOM fixture's:
#: the KV retractions, the scheduler's traceback and the sigquit.
_WARNED = (b"KV cache pool is full", b"Scheduler hit an exception", b"Received sigquit")


def _at_warning_level(text: bytes) -> bytes:
    kept, in_traceback = [], False
    for line in text.split(b"\n"):
        own = line.startswith(b"[")
        if (in_traceback and not own) or any(said in line for said in _WARNED) or re.match(rb"^(\x1b\[\d+m)?\d{8}-", line):
            kept.append(line)
            in_traceback = in_traceback and not own or b"Scheduler hit" in line
        else:
            in_traceback = False
    return b"\n".join(kept)


@pytest.mark.parametrize("level", ["info", "warning"])
def test_a_server_log_on_another_time_zones_clock_is_moved_onto_the_runs(fixture_run, tmp_path: Path, level: str) -> None:
    """The OOM fixture with SGLang's own lines 8 h behind the trainer's (the server in UTC, the
    trainer's host in UTC+8), AReaL's wrapper lines in the same file on the trainer's clock: the
    file's line order tells the offset, the lines are moved onto the run's clock and the cause
    is the server's OOM, as with one clock; the note says so. At warning level the server's few
    lines fit among the wrapper's under many quarter hours: only 8 h puts its sigquit right
    before the wrapper's exit line, two seconds later."""
    import gzip
    import shutil

    tree = tmp_path / "outputs"
    shutil.copytree(fixture_run("sglang_oom"), tree)
    [log] = tree.rglob("llm_server.log.gz")
    stamp = re.compile(rb"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\]", re.MULTILINE)

    def behind(match: re.Match[bytes]) -> bytes:
        when = datetime.strptime(match[1].decode(), "%Y-%m-%d %H:%M:%S") - timedelta(hours=8)
        return b"[" + when.strftime("%Y-%m-%d %H:%M:%S").encode() + b"]"

    text = gzip.decompress(log.read_bytes())
    log.with_suffix("").write_bytes(stamp.sub(behind, text if level == "info" else _at_warning_level(text)))
    log.unlink()
    out = tmp_path / "a.json"
    assert runner.invoke(app, ["analyze", str(tree), "--json", str(out), "--no-html", "--no-cache"]).exit_code == 0
    [run] = json.loads(out.read_text())["runs"]
    incident = run["incidents"][0]
    assert (incident["onset_step"], incident["cause"]) == (180, "inference_server_oom") and incident["confidence"] >= 0.75
    assert "Then the failures it leads to: 6 connection_refused (p=" in incident["summary"]
    assert ("llm_server.log: the server's own lines are 8 h behind the run's clock (another time zone, the one offset "
            "the file's wrapper lines leave): moved onto it") in run["notes"]


@pytest.mark.parametrize("minutes", [-3, 3])
def test_a_server_hosts_clock_minutes_off_is_read_off_its_exit_and_the_calls_it_dropped(fixture_run, tmp_path: Path,
                                                                                       minutes: int) -> None:
    """The OOM fixture with the server's host clock 3 minutes behind or ahead of the trainer's (NTP
    skew between nodes), its wrapper lines too. As written, the server exited in step 178 (or 182):
    the trainer logged steps 178 and 179 as healthy and first found a call dropped mid-request,
    then refused, at step 180. That drop is the moment the server died: the log is moved by the
    gap, and the server's exit, its OOM and its silence fall where the trainer saw them."""
    import gzip
    import shutil

    tree = tmp_path / "outputs"
    shutil.copytree(fixture_run("sglang_oom"), tree)
    [log] = tree.rglob("llm_server.log.gz")
    sglang = re.compile(rb"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\]", re.MULTILINE)
    wrapper = re.compile(rb"^((?:\x1b\[\d+m)?)(\d{8}-\d\d:\d\d:\d\d)", re.MULTILINE)

    def moved(text: bytes, form: str) -> bytes:
        return (datetime.strptime(text.decode(), form) + timedelta(minutes=minutes)).strftime(form).encode()

    text = sglang.sub(lambda m: b"[" + moved(m[1], "%Y-%m-%d %H:%M:%S") + b"]", gzip.decompress(log.read_bytes()))
    log.write_bytes(gzip.compress(wrapper.sub(lambda m: m[1] + moved(m[2], "%Y%m%d-%H:%M:%S"), text)))
    out = tmp_path / "a.json"
    assert runner.invoke(app, ["analyze", str(tree), "--json", str(out), "--no-html", "--no-cache"]).exit_code == 0
    [run] = json.loads(out.read_text())["runs"]
    first = run["incidents"][0]
    assert (first["kind"], first["onset_step"], first["cause"]) == ("reward_collapse", 180, "inference_server_oom")
    assert "kept answering after the onset" not in first["summary"]
    assert run["recommendation"]["step"] == 150
    off = {-3: "3 min 3 s behind", 3: "2 min 57 s ahead of"}[minutes]  # (the drop came 2.6 s after the death)
    assert (f"llm_server.log.gz: the whole log, its wrapper lines too, is {off} the run's clock (the server host's clock "
            "is off: its exit and the first call the trainer found dropped mid-request, refused ones right after, are "
            "that far apart): moved onto it") in run["notes"]


def test_a_server_its_watchdog_killed_hung_first(tmp_path: Path) -> None:
    """SGLang's scheduler hangs in step 80's rollout; 300 s later its watchdog fires (one line),
    the server is killed and the trainer's requests are refused from then on. The refused
    connections stand out far more than the one watchdog line, but the hang came first: the cause
    is an unresponsive server, the watchdog line is cited, and the refusals are what it led to."""
    from areal_builder import Outage, RunSpec, healthy_reward, schedule, write_run
    from sglang_lines import sglang_line

    spec = RunSpec(last_step=120, reward=lambda s: 0.0 if s >= 80 else healthy_reward(s))
    at = {t.step: t.time for t in schedule(spec)}
    fired = at[79] + timedelta(seconds=20)
    down = Outage(start=fired + timedelta(seconds=5), end=at[120], kind="refused", server_exit=True, in_flight=3)
    paths = write_run(tmp_path / "outputs", RunSpec(**{**spec.__dict__, "outages": (down,),
                                                       "extra_lines": (sglang_line(fired, "Watchdog timeout (self.watchdog_timeout=300)"),)}))
    incident = first_incident(paths.fileroot, tmp_path)
    assert (incident["onset_step"], incident["cause"]) == (80, "inference_server_unresponsive")
    assert "first: watchdog_timeout" in incident["summary"] and "Then the failures it leads to: " in incident["summary"]
    assert any("Watchdog timeout" in e["text"] for e in incident["evidence"])


def test_a_server_log_from_another_node_in_a_folder_below_the_run_is_the_runs(fixture_run, tmp_path: Path) -> None:
    """The OOM fixture's server log copied from its node into ``trial0/node2/``: one run, and the
    server's OOM is still the cause, cited in that file."""
    import shutil

    tree = tmp_path / "outputs"
    shutil.copytree(fixture_run("sglang_oom"), tree)
    [log] = tree.rglob("llm_server.log.gz")
    (log.parent / "node2").mkdir()
    log.rename(log.parent / "node2" / log.name)
    out = tmp_path / "a.json"
    assert runner.invoke(app, ["analyze", str(tree), "--json", str(out), "--no-html", "--no-cache"]).exit_code == 0
    [run] = json.loads(out.read_text())["runs"]
    incident = run["incidents"][0]
    assert incident["cause"] == "inference_server_oom"
    assert any("/node2/llm_server.log" in e["file"] for e in incident["evidence"])


@pytest.mark.parametrize("given", ["file", "folder"])
def test_a_server_log_given_apart_from_its_run_is_the_runs(fixture_run, tmp_path: Path, given: str) -> None:
    """The OOM fixture's server log copied off its node into a folder of its own and given beside the
    run (``analyze outputs/ sglang_logs/llm_server.log.gz``): one run, its cause the server's OOM, as
    with the log in place. Beside two runs it stays a run of its own (whose it is cannot be told)."""
    import shutil

    tree = tmp_path / "outputs"
    shutil.copytree(fixture_run("sglang_oom"), tree)
    [log] = tree.rglob("llm_server.log.gz")
    apart = tmp_path / "sglang_logs"
    apart.mkdir()
    log.rename(apart / log.name)
    server = apart / log.name if given == "file" else apart
    out = tmp_path / "a.json"
    assert runner.invoke(app, ["analyze", str(tree), str(server), "--json", str(out), "--no-html", "--no-cache"]).exit_code == 0
    [run] = json.loads(out.read_text())["runs"]
    assert run["incidents"][0]["cause"] == "inference_server_oom"
    assert any(e["file"] == str(apart / log.name) for e in run["incidents"][0]["evidence"])

    other = tmp_path / "other"
    shutil.copytree(fixture_run("areal_healthy_sparse"), other)
    assert runner.invoke(app, ["analyze", str(tree), str(other), str(server), "--json", str(out), "--no-html", "--no-cache"]).exit_code == 0
    assert len(json.loads(out.read_text())["runs"]) == 3


def test_a_bare_killed_in_a_warning_level_server_log_is_dated_at_the_exit_it_precedes(tmp_path: Path) -> None:
    """SGLang at AReaL's default warning level: the launch lines, then hours later the shell's
    ``Killed`` and the wrapper's exit line. ``Killed`` has no time of its own; it is the death,
    dated at the exit line after it (not at the launch), cited, with where to look for why."""
    from datetime import datetime, timedelta

    from areal_builder import Outage, RunSpec, healthy_reward, write_run

    from forensics import analyze

    start = datetime(2025, 11, 10, 9)
    paths = write_run(tmp_path / "outputs", RunSpec(
        experiment="killed", last_step=40, anchors={1: start, 30: start + timedelta(minutes=33)},
        reward=lambda s: 0.0 if s >= 30 else healthy_reward(s),
        outages=(Outage(start=start + timedelta(minutes=32.4), end=start + timedelta(hours=3), kind="refused", server_exit=True),)))
    server = paths.log_dir / "llm_server.log"
    lines = server.read_text().splitlines()
    exit_at = next(i for i, line in enumerate(lines) if "exits, returncode=-9" in line)
    lines.insert(exit_at, "Killed")
    server.write_text("\n".join(lines) + "\n")
    [run] = analyze([paths.fileroot]).runs
    [killed] = run.events.filter(pl.col("kind") == "process_killed").to_dicts()
    [exited] = run.events.filter(pl.col("kind") == "server_exit").to_dicts()
    assert killed["time"] == exited["time"] and killed["line"] == exit_at + 1
    [collapse] = [i for i in run.incidents if i.kind == "reward_collapse"]  # (and the stall after it)
    assert collapse.cause == "inference_server_crash"
    assert any(e.kind == "process_killed" for e in collapse.evidence)
    assert any("OOM killer" in s for s in collapse.suggestions)


@pytest.mark.parametrize(("waited", "cause"), [(3600.0, "inference_server_unresponsive"), (60.0, "reward_pipeline")])
def test_a_timeout_counts_from_when_its_request_was_sent(tmp_path: Path, waited: float, cause: str) -> None:
    """Seed 000's hypothesis: the server stops answering at step 120 and AReaL logs each request's
    ``timed out after 3600.00s`` only when it runs out, an hour (60 steps) later. Those requests
    were sent at the onset: they explain it. The same lines after a 60 s timeout were sent long
    after it, and explain nothing."""
    from areal_builder import LogLine, RunSpec, healthy_reward, write_run

    from forensics import analyze

    def timeout(step: int, at: datetime) -> list[LogLine]:
        said = f"HTTP request to 172.17.0.2:30000/generate timed out after {waited:.2f}s (attempt 1/3)"
        return [LogLine(at, said, "/AReaL/areal/utils/http.py", "WARNING")] if step in (180, 181) else []

    spec = RunSpec(last_step=200, step_seconds=(60.0, 60.0), step_lines=timeout,
                   reward=lambda step: 0.0 if step >= 120 else healthy_reward(step))
    write_run(tmp_path / "outputs", spec)
    collapse = analyze(tmp_path / "outputs").runs[0].incidents[0]
    assert (collapse.kind, collapse.onset_step, collapse.cause) == ("reward_collapse", 120, cause)
    if cause == "inference_server_unresponsive":
        assert "All 2 request_timeout were logged only when the 3600 s timeout ran out (from step 180): their requests were sent in steps 117–122." in collapse.summary
        assert [e.step for e in collapse.evidence if e.kind == "request_timeout"] == [180, 181]


@pytest.mark.parametrize("hours", [3, 5])
def test_a_server_log_hours_ahead_of_the_runs_clock_is_moved_back_by_its_wrapper_lines(fixture_run, tmp_path: Path, hours: int) -> None:
    """The hang fixture with SGLang's own lines in UTC, 3 or 5 h ahead of the trainer's host (US
    time): most of them still fall among the long run's steps, but not in order with AReaL's wrapper
    lines in the same file (the launch above them, the kill below): moved back, and the verdict is the
    unshifted one's — never a hung server 'kept answering' with lines from hours before."""
    import gzip
    import shutil

    plain = first_incident(fixture_run("sglang_hang"), tmp_path / "plain")
    tree = tmp_path / "outputs"
    shutil.copytree(fixture_run("sglang_hang"), tree)
    [log] = tree.rglob("llm_server.log.gz")
    stamp = re.compile(rb"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\]", re.MULTILINE)

    def ahead(match: re.Match[bytes]) -> bytes:
        when = datetime.strptime(match[1].decode(), "%Y-%m-%d %H:%M:%S") + timedelta(hours=hours)
        return b"[" + when.strftime("%Y-%m-%d %H:%M:%S").encode() + b"]"

    log.write_bytes(gzip.compress(stamp.sub(ahead, gzip.decompress(log.read_bytes()))))
    out = tmp_path / "a.json"
    assert runner.invoke(app, ["analyze", str(tree), "--json", str(out), "--no-html", "--no-cache"]).exit_code == 0
    [run] = json.loads(out.read_text())["runs"]
    incident = run["incidents"][0]
    assert (incident["onset_step"], incident["cause"], incident["confidence"]) == (plain["onset_step"], plain["cause"], plain["confidence"])
    assert incident["summary"] == plain["summary"] and "kept answering" not in incident["summary"]
    assert any(f"the server's own lines are {hours} h ahead of the run's clock" in note for note in run["notes"])


def test_another_servers_later_exit_is_not_the_hung_servers(tmp_path: Path) -> None:
    """Two servers: 172.17.0.2:30000 hangs from step 80 (every timeout names it); at step 100 the
    other one, :30001, exits. The hang is not said to have ended in that exit, nor is its line cited."""
    from areal_builder import LogLine, Outage, RunSpec, healthy_reward, schedule, write_run

    spec = RunSpec(last_step=120, reward=lambda s: 0.0 if s >= 80 else healthy_reward(s), request_timeout=60.0)
    at = {t.step: t.time for t in schedule(spec)}
    hang = Outage(start=at[79] + timedelta(seconds=5), end=at[120], kind="timeout")
    other = LogLine(at[100], "SGLang server http://172.17.0.2:30001 exits, returncode=-9", "SGLangServer Wrapper", file="llm_server")
    paths = write_run(tmp_path / "outputs", RunSpec(**{**spec.__dict__, "outages": (hang,), "extra_lines": (other,)}))
    incident = first_incident(paths.fileroot, tmp_path)
    assert (incident["onset_step"], incident["cause"]) == (80, "inference_server_unresponsive")
    assert "seen down only later" not in incident["summary"]
    assert not any("30001" in e["text"] for e in incident["evidence"])


@pytest.mark.parametrize("back_after_minutes", [None, 2.0])
def test_a_server_gone_while_the_trainer_kept_calling_it_is_an_incident_though_the_reward_held(
        tmp_path: Path, back_after_minutes: float | None) -> None:
    """Two servers (gen_dp_size 2): 172.17.0.2:30000 is killed at step 80 and the trainer calls it
    in vain to the end, while the other keeps answering — the reward does not move. Not a healthy
    run: the server is down from step 80, the crash its cause, and no checkpoint after it is called
    healthy. A server the launcher brings back within minutes (seed 001's) is no such incident."""
    from areal_builder import LogLine, Outage, RunSpec, schedule, write_run

    spec = RunSpec(last_step=120, save_freq_steps=20)
    at = {t.step: t.time for t in schedule(spec)}
    start = at[79] + timedelta(seconds=20)
    end = start + timedelta(minutes=back_after_minutes) if back_after_minutes else at[120]
    down = Outage(start=start, end=end, kind="refused", server_exit=True, server_restart=back_after_minutes is not None)
    other = (LogLine(at[1] - timedelta(minutes=3), "SGLang server launched at: http://172.17.0.2:30001", "SGLangServer Wrapper",
                     file="llm_server"),)
    paths = write_run(tmp_path / "outputs", RunSpec(**{**spec.__dict__, "outages": (down,), "extra_lines": other}))
    out = tmp_path / "a.json"
    assert runner.invoke(app, ["analyze", str(paths.fileroot), "--json", str(out), "--no-html", "--no-cache"]).exit_code == 0
    [run] = json.loads(out.read_text())["runs"]
    if back_after_minutes:
        assert [i["kind"] for i in run["incidents"]] == []
        return
    [incident] = run["incidents"]
    assert (incident["kind"], incident["onset_step"], incident["cause"], incident["recovered"]) == (
        "server_down", 80, "inference_server_crash", False)
    assert "172.17.0.2:30000 exited during step 80 and the trainer kept calling it" in incident["summary"]
    assert incident["evidence"][0]["kind"] == "server_exit"
    assert run["recommendation"]["step"] == 60


def two_nodes(tmp_path: Path):
    """Two nodes, a server log each (``trial0/node1/``, ``trial0/node2/``): node2's server hangs
    before step 80 and every timeout names it; node1's keeps decoding and is stopped at step 100."""
    import random

    from areal_builder import LogLine, RunSpec, _Style, healthy_reward, schedule, write_run
    from sglang_lines import Client, Server, rollout_traffic, sglang_line, startup_lines, steady_load

    spec = RunSpec(last_step=110, reward=lambda s: 0.0 if s >= 80 else healthy_reward(s), request_timeout=600.0,
                   server_addr="172.17.0.3:30000")
    at = {t.step: t.time for t in schedule(spec)}
    hang, hung = at[80] - timedelta(seconds=150), "172.17.0.4:30000"
    calls, t = [], hang + timedelta(seconds=60)
    while t + timedelta(seconds=610) < at[110]:
        calls.append(LogLine(t, f"HTTP request to {hung}/generate timed out after 600.00s (attempt 1/3)", "/AReaL/areal/utils/http.py", "WARNING"))
        t += timedelta(seconds=90)
    paths = write_run(tmp_path / "outputs", RunSpec(**{**spec.__dict__, "extra_lines": tuple(calls)}))
    launched = at[1] - timedelta(seconds=200)
    for node, ip in ((1, "172.17.0.3"), (2, "172.17.0.4")):
        server, rng = Server(host=ip, port=30000, pid=31877 + node), random.Random(f"node{node}")
        lines = [*startup_lines(server, launched, launched + timedelta(seconds=40), seed=f"n{node}"),
                 LogLine(launched + timedelta(seconds=40), f"SGLang server launched at: http://{ip}:30000", "SGLangServer Wrapper", file="llm_server")]
        until = hang if node == 2 else at[100]
        lines += rollout_traffic(server, Client("172.17.0.1", f"c{node}"), launched + timedelta(seconds=100), until, steady_load(server), rng,
                                 completions=600, groups=60)
        if node == 1:  # node1's healthy server stopped at step 100: its own lines, naming no address
            lines.append(sglang_line(at[100] + timedelta(seconds=5), "SIGTERM received. signum=15 frame=None. Draining requests and shutting down..."))
        (paths.log_dir / f"node{node}").mkdir()
        (paths.log_dir / f"node{node}" / "llm_server.log").write_text(_Style(spec).text(sorted(lines, key=lambda line: line.time)))
    return paths


def test_with_a_server_log_per_node_the_context_is_the_hung_servers_own(tmp_path: Path) -> None:
    """node2's server hangs (:func:`two_nodes`). The server context is node2's — its last stats
    just before the onset, no answer after — not node1's healthy traffic told as the hung server's
    ("kept answering", then "stopped answering")."""
    paths = two_nodes(tmp_path)
    incident = first_incident(paths.fileroot, tmp_path)
    assert (incident["onset_step"], incident["cause"]) == (80, "inference_server_unresponsive")
    assert "kept answering" not in incident["summary"] and "logged no successful /generate response" in incident["summary"]
    [last] = [e for e in incident["evidence"] if e["kind"] == "last_server_activity"]
    assert "/node2/llm_server.log" in last["file"]
    # node1's stop at step 100 is node1's, not the hung server "seen down only later".
    assert "seen down only later" not in incident["summary"] and not any("/node1/" in e["file"] for e in incident["evidence"])


def test_the_timeline_draws_each_servers_load_and_throughput_apart(tmp_path: Path) -> None:
    """With a server log per node, the hung one's throughput is its own line, ending before the
    onset, not averaged into its healthy peer's (which goes on to step 100)."""
    from forensics import analyze
    from reports.timeline import timeline

    paths = two_nodes(tmp_path)
    [run] = analyze([paths.fileroot]).runs
    figure, _ = timeline(run)
    assert figure is not None
    lines = {tr["name"]: tr["x"] for tr in figure["data"] if tr.get("name", "").endswith(": gen throughput")}
    assert sorted(lines) == ["node1/llm_server.log: gen throughput", "node2/llm_server.log: gen throughput"]
    assert max(lines["node2/llm_server.log: gen throughput"]) < 80 <= 99 <= max(lines["node1/llm_server.log: gen throughput"])
    running = [tr["name"] for tr in figure["data"] if tr.get("name", "").endswith(": running requests")]
    assert sorted(running) == ["node1/llm_server.log: running requests", "node2/llm_server.log: running requests"]


def test_a_rotated_server_log_is_one_server_not_a_peer(fixture_run, tmp_path: Path) -> None:
    """The hang fixture's server log rotated in two (``llm_server.log.1`` holding the launch lines,
    ``llm_server.log`` the rest), beside the trainer's launcher line naming the same address: one
    server, whose last stats before the onset are those a whole log gives."""
    import gzip
    import shutil

    tree = tmp_path / "outputs"
    shutil.copytree(fixture_run("sglang_hang"), tree)
    [log] = tree.rglob("llm_server.log.gz")
    lines = gzip.decompress(log.read_bytes()).splitlines(keepends=True)
    log.unlink()
    (log.parent / "llm_server.log.1").write_bytes(b"".join(lines[: len(lines) // 3]))
    (log.parent / "llm_server.log").write_bytes(b"".join(lines[len(lines) // 3 :]))
    whole, rotated = (first_incident(root, tmp_path)["summary"] for root in (fixture_run("sglang_hang"), tree))
    said = re.compile(r"Last server stats before the onset: [^,]+")
    assert said.search(rotated) and said.search(rotated)[0] == said.search(whole)[0]


def test_a_server_that_exits_once_every_step_was_logged_is_teardown_not_down(tmp_path: Path) -> None:
    """The run logged all 60 steps it was launched for; its server exits 30 s later and the rollouts
    still in flight are refused for 8 minutes: the run's teardown, no incident."""
    from areal_builder import Outage, RunSpec, schedule, write_run

    spec = RunSpec(last_step=60, save_freq_steps=20, steps_per_epoch=60, total_epochs=1)
    at = {t.step: t.time for t in schedule(spec)}
    down = Outage(start=at[60] + timedelta(seconds=30), end=at[60] + timedelta(minutes=9), kind="refused", server_exit=True)
    paths = write_run(tmp_path / "outputs", RunSpec(**{**spec.__dict__, "outages": (down,)}))
    out = tmp_path / "a.json"
    assert runner.invoke(app, ["analyze", str(paths.fileroot), "--json", str(out), "--no-html", "--no-cache"]).exit_code == 0
    [run] = json.loads(out.read_text())["runs"]
    assert run["incidents"] == [] and run["recommendation"]["step"] == 60


def test_a_server_log_no_offset_places_is_not_judged_by_its_own_times(fixture_run, tmp_path: Path) -> None:
    """The healthy-collapse fixture's server log as plain SGLang writes it (no wrapper lines), up a
    day before the run (another job's traffic first) and 5.5 h ahead: no one offset lines it up, so
    it is off the clock — and then not judged by its times: no stall after the run's last step from
    its lines, no "no successful /generate response" of a server that answered all along."""
    import gzip
    import shutil
    from datetime import datetime

    tree = tmp_path / "outputs"
    shutil.copytree(fixture_run("sglang_healthy_collapse"), tree)
    [log] = tree.rglob("llm_server.log.gz")
    stamp = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\]")

    def moved(line: str, by: timedelta) -> str:
        return stamp.sub(lambda m: f"[{datetime.strptime(m[1], '%Y-%m-%d %H:%M:%S') + by:%Y-%m-%d %H:%M:%S}]", line)

    own = [moved(line, timedelta(hours=5, minutes=30)) for line in gzip.decompress(log.read_bytes()).decode().splitlines(keepends=True)
           if "SGLangServer Wrapper" not in line]
    earlier = [moved(line, -timedelta(hours=20)) for line in own if stamp.match(line)][:400]
    log.unlink()
    (log.parent / "llm_server.log").write_text("".join(earlier + own))
    out = tmp_path / "a.json"
    assert runner.invoke(app, ["analyze", str(tree), "--json", str(out), "--no-html", "--no-cache"]).exit_code == 0
    [run] = json.loads(out.read_text())["runs"]
    assert [(i["kind"], i["onset_step"], i["cause"]) for i in run["incidents"]] == [("reward_collapse", 120, "reward_pipeline")]
    assert "no successful /generate response" not in run["incidents"][0]["summary"]
    assert any("not placed among the steps" in n for n in run["notes"])


def test_one_node_stopped_early_is_not_down_by_the_calls_to_another(tmp_path: Path) -> None:
    """node1's server stopped (``SIGTERM received``, a line naming no address) during step 47 and no
    call ever went to it; node2's hangs before step 80, every timeout naming node2. Its stop was a
    `server_down` at step 47 "kept calling it for 60 min" with node2's timeouts, and the checkpoint
    fell back before it: the exit is of the server its own log launched (172.17.0.3)."""
    paths = two_nodes(tmp_path)
    log = paths.log_dir / "node1" / "llm_server.log"
    stop = "2025-11-10 09:50:40"  # (during step 47)
    kept = [line for line in log.read_text().splitlines() if not (line.startswith("[2025") and line[1:20] > stop) and "SIGTERM" not in line]
    log.write_text("\n".join([*kept, f"[{stop}] SIGTERM received. signum=15 frame=None. Draining requests and shutting down..."]) + "\n")
    incident = first_incident(paths.fileroot, tmp_path)
    assert (incident["kind"], incident["onset_step"], incident["cause"]) == ("reward_collapse", 80, "inference_server_unresponsive")


@pytest.mark.parametrize("hours", [-1, 1])
def test_a_server_log_wholly_on_another_zones_clock_is_moved_by_its_exit_and_the_first_refusal(
        fixture_run, tmp_path: Path, hours: int) -> None:
    """The OOM fixture's server on a host an hour behind (or ahead of) the trainer's, its wrapper
    lines written there too, so they stay in order with the server's own: its exit fell at step
    127, a made-up `server_down` 53 healthy steps early (ahead: "the server kept answering after
    the onset") and the checkpoint went back to 100. The exit and the trainer's first refused call
    to it are an hour apart, and no refusal follows the exit as written: moved, and said."""
    import gzip
    import re
    import shutil

    tree = tmp_path / "outputs"
    shutil.copytree(fixture_run("sglang_oom"), tree)
    [log] = tree.rglob("llm_server.log.gz")
    shift = timedelta(hours=hours)

    def moved(fmt: str, prefix: str = ""):
        return lambda m: prefix + (m[1] or "") + (datetime.strptime(m[2], fmt) + shift).strftime(fmt)

    text = gzip.decompress(log.read_bytes()).decode()
    text = re.sub(r"^(\[)(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)", moved("%Y-%m-%d %H:%M:%S"), text, flags=re.M)
    text = re.sub(r"^(\x1b\[\d+m)?(\d{8}-\d\d:\d\d:\d\d)", moved("%Y%m%d-%H:%M:%S"), text, flags=re.M)
    log.write_bytes(gzip.compress(text.encode()))
    out = tmp_path / "a.json"
    assert runner.invoke(app, ["analyze", str(tree), "--json", str(out), "--no-html", "--no-cache"]).exit_code == 0
    run = json.loads(out.read_text())["runs"][0]
    first = run["incidents"][0]
    assert (first["kind"], first["onset_step"], first["cause"]) == ("reward_collapse", 180, "inference_server_oom")
    assert "kept answering" not in first["summary"]
    assert run["recommendation"]["step"] == 150
    assert any(f"the whole log, its wrapper lines too, is 1 h {'ahead of' if hours > 0 else 'behind'} the run's clock" in note
               for note in run["notes"])


def test_a_server_log_without_dates_copied_off_the_cluster_takes_its_day_from_the_run(fixture_run, tmp_path: Path) -> None:
    """The OOM fixture's SGLang started by hand (no AReaL wrapper lines) with time-only prefixes
    (`[16:38:28 TP0]`: SGLang 0.2.15/0.3.0), copied off the cluster today and given beside the run:
    its lines were dated the copy's day, lay outside the run, and the OOM was never linked (cause
    `inference_server_crash`). The times of day fall among the run's steps a whole number of days
    before: dated so, and said."""
    import gzip
    import shutil

    shutil.copytree(fixture_run("sglang_oom"), tmp_path / "run" / "outputs")
    [log] = (tmp_path / "run").rglob("llm_server.log.gz")
    scheduler = ("Prefill batch", "Decode batch", "KV cache pool", "Scheduler hit", "Load weight", "KV Cache is", "Memory pool")
    kept = []
    for line in gzip.decompress(log.read_bytes()).decode().split("\n"):
        if re.match(r"^(\x1b\[\d+m)?\d{8}-\d\d:\d\d:\d\d", line):
            continue  # (no wrapper: started by hand)
        if m := re.match(r"^\[\d{4}-\d\d-\d\d (\d\d:\d\d:\d\d)\] ", line):
            line = f"[{m[1]}{' TP0' if line[m.end():].startswith(scheduler) else ''}] {line[m.end():]}"
        kept.append(line)
    log.unlink()
    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang" / "sglang.log").write_text("\n".join(kept))
    out = tmp_path / "a.json"
    result = runner.invoke(app, ["analyze", str(tmp_path / "run" / "outputs"), str(tmp_path / "sglang" / "sglang.log"),
                                 "--json", str(out), "--no-html", "--no-cache"])
    assert result.exit_code == 0, result.output
    run = json.loads(out.read_text())["runs"][0]
    assert (run["incidents"][0]["onset_step"], run["incidents"][0]["cause"]) == (180, "inference_server_oom")
    assert any(note.startswith("sglang.log: its lines give no date; dated from the run's steps") for note in run["notes"])


def test_a_single_controller_runs_merged_log_carries_its_servers_own_lines(tmp_path: Path) -> None:
    """AReaL ≥ v0.5.2 single-controller: SGLang runs inside the rollout worker, its lines in
    rollout.log and, `[rollout] `-prefixed, in merged.log, which is read alone. Its scheduler's
    exception and sigquit went unread: `reward_pipeline` (check the reward function) for a server
    that died. The prefixed traceback is read as the server's own: it ran out of memory."""
    from areal_builder import RunSpec, healthy_reward, write_run

    paths = write_run(tmp_path / "outputs", RunSpec(era="v0.5", last_step=60, merged_log=True, save_freq_steps=10,
                                                    reward=lambda s: 0.0 if s >= 40 else healthy_reward(s)))
    folder = paths.log_dir
    (folder / "trainer.log").rename(folder / "main.log")
    if paths.llm_server_log:
        paths.llm_server_log.unlink()
    stamp = f"{paths.step_times[39]:%Y-%m-%d %H:%M:%S}"
    server = [f"[{stamp} TP0] Scheduler hit an exception: Traceback (most recent call last):",
              '  File "/usr/local/lib/python3.12/site-packages/sglang/srt/managers/scheduler.py", line 2912, in run_scheduler_process',
              "    scheduler.event_loop_overlap()",
              "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB",
              f"[{stamp}] Received sigquit from a child process. It usually means the child failed."]
    (folder / "rollout.log").write_text("\n".join(server) + "\n")
    with open(folder / "merged.log", "a") as fh:
        fh.write("\n".join("[rollout] " + line for line in server) + "\n")
    incident = first_incident(tmp_path / "outputs", tmp_path)
    assert (incident["onset_step"], incident["cause"]) == (40, "inference_server_oom")
    assert {"cuda_oom", "child_crash"} <= {e["kind"] for e in incident["evidence"]}


def test_a_collapse_with_no_failure_logged_cites_its_onset_line_as_evidence(tmp_path: Path) -> None:
    """The reward pipeline's collapse: nothing failed, so the onset's own table row is the evidence
    (in ``evidence``, where the contract's readers look), said once in the ticket."""
    from areal_builder import RunSpec, write_run

    from forensics import analyze
    from reports import render_markdown

    paths = write_run(tmp_path / "outputs", RunSpec(last_step=60, save_freq_steps=10, reward=lambda s: 0.0 if s >= 30 else 0.5 + 0.01 * (s % 5)))
    result = analyze(paths.fileroot)
    [incident] = result.runs[0].incidents
    assert (incident.onset_step, incident.cause) == (30, "reward_pipeline")
    [cited] = incident.evidence
    assert cited == incident.onset_evidence and cited.step == 30
    assert "task_reward/avg" in read_line(Path(cited.file), cited.line)
    assert render_markdown(result).count(f":{cited.line}`") == 1


@pytest.mark.parametrize(("timeout", "cause"), [(3600, "unknown"), (600, "reward_pipeline")])
def test_a_collapse_as_steps_slow_before_a_hung_servers_timeouts_could_be_logged_is_not_blamed_on_rewards(
        tmp_path: Path, timeout: int, cause: str) -> None:
    """The reward falls to 0 at step 30 and the steps slow from about a minute to ten (rollouts
    waiting on a server), with no failure logged: with ``rollout.request_timeout: 3600`` none could
    be yet (the log ends 50 minutes on), so finding none is no finding, and the summary says when
    one would show. With 600 s, timeouts would have been logged by then: the rewards themselves
    went constant. Steps going on at their pace would say the server answered (see above)."""
    from datetime import timedelta

    from areal_builder import RunSpec, healthy_reward, write_run

    from forensics import analyze

    start = datetime(2025, 11, 10, 9, 0)
    slowed = start + timedelta(seconds=28 * 65)
    spec = RunSpec(last_step=34, request_timeout=timeout, reward=lambda s: 0.0 if s >= 30 else healthy_reward(s),
                   anchors={1: start, 29: slowed, 34: slowed + timedelta(minutes=50)})
    [run] = analyze([write_run(tmp_path / "outputs", spec).fileroot]).runs
    [collapse] = [i for i in run.incidents if i.kind == "reward_collapse"]
    assert (collapse.onset_step, collapse.cause) == (30, cause)
    said = "none could have been yet if the server hung: a request sent then fails only when rollout.request_timeout (3600 s) runs out"
    assert (said in collapse.summary) == (timeout == 3600)


def test_the_onset_line_is_quoted_where_its_cell_is_in_a_wide_table_row(fixture_run) -> None:
    """AReaL prints several key-value pairs a table row: the onset's quote is the part of its row
    from the reward's cell, its value with it, not the row's first 300 characters."""
    from forensics import analyze

    [incident] = analyze([fixture_run("sglang_healthy_collapse")]).runs[0].incidents
    quoted = incident.onset_evidence
    assert quoted is not None and "│ grpo_actor/task_reward/avg" in quoted.text and "│ 0.0000e+00 │" in quoted.text
    assert quoted.text.strip("…") in read_line(Path(quoted.file), quoted.line)
