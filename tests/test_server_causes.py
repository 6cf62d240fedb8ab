"""Why the reward died, told from both sides: the trainer's retries and the server's own log."""

from __future__ import annotations

import json
import re
from pathlib import Path

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
