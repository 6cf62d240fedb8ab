"""Rendering tests: the HTML post-mortem and the terminal summary, from hand-built analyses."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from rich.console import Console

from forensics.model import Analysis, Checkpoint, Evidence, Incident, Recommendation, RunAnalysis, SourceReport
from parsers.schema import EVENT_SCHEMA, METRIC_SCHEMA, STEP_SCHEMA, empty
from reports import render_html, render_summary, write_html

ROOT = "/data/runs/gsm8k-grpo/trial0"
TRAINER = f"{ROOT}/logs/trainer.log"
SERVER = f"{ROOT}/logs/llm_server.log"
REWARD = "grpo_actor/task_reward/avg"
XSS = "</script><script>alert(1)</script><img src=x onerror=alert(2)>"
CKPT_100 = f"{ROOT}/checkpoints/epoch0epochstep99globalstep99"
T0 = datetime(2025, 11, 11, 10, 0, 0)


def _t(step: int) -> datetime:
    return T0 + timedelta(seconds=30 * step)


def _run(
    n_steps: int = 200,
    collapse: int | None = 120,
    n_events: int | None = None,
    memory: bool = True,
    run_id: str = "gsm8k-grpo/trial0",
) -> RunAnalysis:
    steps = pl.DataFrame(
        {
            "step": list(range(1, n_steps + 1)),
            "time": [_t(s) for s in range(1, n_steps + 1)],
            "file": [TRAINER] * n_steps,
            "line": [10 * s for s in range(1, n_steps + 1)],
        },
        schema=STEP_SCHEMA,
    )
    rows: list[tuple] = []
    for s in range(1, n_steps + 1):
        healthy = collapse is None or s < collapse
        rows.append((s, _t(s), REWARD, (0.55 + 0.001 * (s % 7)) if healthy else 0.02, TRAINER, 10 * s + 1))
        if memory:
            rows.append((s, _t(s), "mem/device_used_gb", 60.0 + (s % 5), TRAINER, 10 * s + 2))
            rows.append((s, _t(s), "mem/device_total_gb", 80.0, TRAINER, 10 * s + 3))
    metrics = pl.DataFrame(rows, schema=METRIC_SCHEMA, orient="row")

    events = [
        (_t(60), 60, "sglang", "kv_cache_retract", "warning", SERVER, 500, "KV cache pool is full. Retract requests."),
        (_t(118), 118, "areal", "request_timeout", "error", TRAINER, 1181, "Request timed out after 600s [bold]x[/bold]"),
        (_t(119), 119, "areal", "workflow_failed", "error", TRAINER, 1191, XSS),
        (_t(121), None, "sglang", "server_exit", "fatal", SERVER, 900, "server exited with code -9"),
        (_t(5), 5, "areal", "checkpoint_saved", "info", TRAINER, 51, "saved"),
    ]
    if n_events:
        kinds = ["request_timeout", "connection_refused", "retries_exhausted", "kv_cache_retract", "workflow_failed"]
        events += [
            (_t(i % n_steps), 1 + i % n_steps, "areal", kinds[i % len(kinds)], ("warning", "error")[i % 2],
             TRAINER, 100_000 + i, f"event {i}: " + "lorem ipsum dolor sit amet " * 8)
            for i in range(n_events)
        ]
    events_df = pl.DataFrame(events, schema=list(EVENT_SCHEMA), orient="row").cast(EVENT_SCHEMA)

    checkpoints = [
        Checkpoint(path=f"{ROOT}/checkpoints/epoch0epochstep49globalstep49", step=50, kind="hf_export",
                   complete=True, resumable=False, time=_t(50)),
        Checkpoint(path=CKPT_100, step=100, kind="hf_export", complete=True, resumable=False, time=_t(100)),
    ]
    incidents = []
    if collapse is not None:
        evidence = (
            Evidence("request_timeout", _t(118), 118, TRAINER, 1181, "Request timed out after 600s [bold]x[/bold]"),
            Evidence("workflow_failed", _t(119), 119, TRAINER, 1191, XSS),
            Evidence("server_exit", _t(121), None, SERVER, 900, "server exited with code -9"),
            Evidence("kv_cache_retract", _t(60), 60, SERVER, 500, "KV cache pool is full. Retract requests."),
        )
        incidents.append(Incident(
            id="incident-1", kind="reward_collapse", metric=REWARD, onset_step=collapse, onset_time=_t(collapse),
            end_step=None, recovered=False, cause="inference_server_unresponsive", confidence=0.9,
            evidence=evidence, wasted_steps=n_steps - collapse + 1,
            wasted_hours=(n_steps - collapse) * 30 / 3600,
            summary="Reward fell from 0.55 to 0.02 at step 120 after inference requests started timing out.",
        ))
        rec = Recommendation(
            checkpoint=CKPT_100, step=100, reason="Newest complete checkpoint before the collapse at step 120.",
            resume_command=f"python -m areal.launcher --recover-from {CKPT_100}",
            warnings=("hf_export checkpoints hold weights only; optimizer state restarts",),
        )
    else:
        rec = Recommendation(checkpoint=CKPT_100, step=100, reason="Healthy run: newest complete checkpoint.",
                             resume_command=None)
    return RunAnalysis(
        run_id=run_id, framework="areal", root=ROOT,
        sources=[SourceReport(TRAINER, "areal_trainer", 10 * n_steps + 5, 3, ("no step times before step 1",)),
                 SourceReport(SERVER, "sglang_server", 1000, 0)],
        primary_metric=REWARD, incidents=incidents, checkpoints=checkpoints, recommendation=rec,
        metrics=metrics, events=events_df, steps=steps,
        thresholds={"collapse_drop": 0.5, "min_steps": 10, "window": {"size": 20}},
    )


@pytest.fixture(scope="module")
def collapse_html() -> str:
    return render_html(Analysis(runs=[_run()]))


@pytest.fixture(scope="module")
def healthy_html() -> str:
    return render_html(Analysis(runs=[_run(collapse=None, memory=False)]))


def _figures(page: str) -> list[dict]:
    blocks = re.findall(r'<script type="application/json" data-plot="[^"]+">(.*?)</script>', page, re.S)
    return [json.loads(b) for b in blocks]


def _without_plotlyjs(page: str) -> str:
    from plotly.offline import get_plotlyjs

    js = get_plotlyjs().replace("</script", "<\\/script")
    assert page.count(js) == 1
    return page.replace(js, "")


# --------------------------------------------------------------------------- HTML


def test_verdict_comes_before_any_chart(collapse_html: str) -> None:
    inc = collapse_html.index('id="incident-1"')
    ckpt = collapse_html.index('id="checkpoint"')
    first_plot = collapse_html.index('<div class="plot"')
    first_script = collapse_html.index("<script")
    assert inc < ckpt < first_plot < first_script
    verdict = collapse_html[inc:first_plot]
    for expected in ("reward collapse", "step 120", "not recovered", "81 steps", "inference_server_unresponsive",
                     "0.90", "logs/trainer.log:1181", CKPT_100, "--recover-from", "optimizer state restarts"):
        assert expected in verdict, expected
    assert "<pre><code>python -m areal.launcher" in verdict
    # 81 steps at 30 s each from onset to the last step: 80 * 30 s = 0.67 h
    assert "0.67 h wall clock" in verdict


def test_plotlyjs_inlined_exactly_once(collapse_html: str) -> None:
    from plotly.offline import get_plotlyjs

    head = get_plotlyjs()[:300]
    assert collapse_html.count(head) == 1
    assert collapse_html.count("<script") == collapse_html.count("</script>")


def test_nothing_loaded_from_the_network(collapse_html: str) -> None:
    assert not re.search(r"<(script|link|img|iframe|source|video|audio)\b[^>]*\b(src|href)\s*=\s*[\"']?\s*(https?:)?//",
                         collapse_html, re.I)
    assert 'src="http' not in collapse_html
    assert '<link href="http' not in collapse_html
    rest = _without_plotlyjs(collapse_html)
    assert "http://" not in rest and "https://" not in rest
    assert "@import" not in rest and "url(" not in rest


def test_untrusted_text_cannot_break_out(collapse_html: str) -> None:
    assert XSS not in collapse_html
    assert "<script>alert" not in collapse_html
    assert "<img src=x" not in collapse_html
    # shown as text in the verdict and the evidence table
    assert "&lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in collapse_html
    # in the figure JSON the message is data, and its hover text has no live tags
    figs = _figures(collapse_html)
    assert len(figs) == 1
    hovers = [h for tr in figs[0]["data"] for h in (tr.get("hovertext") or []) if isinstance(h, str)]
    xss_hover = [h for h in hovers if "alert(1)" in h]
    assert xss_hover and all("<script" not in h and "<img" not in h for h in xss_hover)


def test_timeline_lanes(collapse_html: str) -> None:
    fig = _figures(collapse_html)[0]
    names = [tr.get("name") for tr in fig["data"]]
    assert REWARD in names and "checkpoints" in names and "incident onset" in names
    ck = next(tr for tr in fig["data"] if tr.get("name") == "checkpoints")
    assert ck["x"] == [50, 100]
    assert CKPT_100 in " ".join(ck["hovertext"])
    # the event with a null step is not in the event lane; the others are, one row per kind
    kinds = {y for tr in fig["data"] if tr.get("name") in ("warning", "error", "fatal") for y in tr["y"]}
    assert kinds == {"kv_cache_retract", "request_timeout", "workflow_failed"}
    assert "device used GB (max over devices)" in names and "device total GB" in names
    assert "step duration s" in names
    # incident band runs from the onset to the last step (not recovered)
    rects = [s for s in fig["layout"]["shapes"] if s["type"] == "rect"]
    assert rects[0]["x0"] == 120 and rects[0]["x1"] == 200


def test_healthy_run(healthy_html: str) -> None:
    assert "No incident found" in healthy_html
    assert 'id="checkpoint"' in healthy_html and CKPT_100 in healthy_html
    assert 'id="incident-1"' not in healthy_html
    fig = _figures(healthy_html)[0]
    notes = [a["text"] for a in fig["layout"]["annotations"]]
    assert "no memory lines in the logs" in notes


def test_print_css_and_footer(collapse_html: str) -> None:
    assert "@media print" in collapse_html
    footer = collapse_html[collapse_html.index("<footer>"):]
    assert "0.1.0" in footer and "grpo-forensics/analysis/v1" in footer
    assert "collapse_drop" in footer and "window" in footer


def test_sources_and_evidence_tables(collapse_html: str) -> None:
    assert "Sources (parse coverage)" in collapse_html
    assert "areal_trainer" in collapse_html and "no step times before step 1" in collapse_html
    evidence = collapse_html[collapse_html.index("<h2>Evidence</h2>"):]
    assert "sglang/kv_cache_retract" in evidence  # source looked up from the events frame
    assert "logs/llm_server.log</span>:500" in evidence


def test_no_checkpoint_recommendation() -> None:
    run = _run()
    run.recommendation = Recommendation(checkpoint=None, step=None, resume_command=None,
                                        reason="No checkpoint was saved before step 120.")
    page = render_html(Analysis(runs=[run]))
    card = page[page.index('id="checkpoint"'):]
    assert "<strong>none</strong>" in card[:400] and "No checkpoint was saved before step 120." in card


def test_two_runs_get_unique_anchors() -> None:
    page = render_html(Analysis(runs=[_run(), _run(run_id="gsm8k-grpo/trial1")]))
    assert page.count('id="incident-1"') == 1 and page.count('id="run-2-incident-1"') == 1
    assert page.count('id="checkpoint"') == 1 and page.count('id="run-2-checkpoint"') == 1
    assert len(_figures(page)) == 2


def test_big_run_stays_small(tmp_path: Path) -> None:
    run = _run(n_steps=5000, collapse=3000, n_events=20_000)
    path = write_html(Analysis(runs=[run]), tmp_path / "out" / "nested")
    assert path == tmp_path / "out" / "nested" / "report.html"
    size = path.stat().st_size
    print(f"5,000 steps / 20,000 events: {size / 1e6:.2f} MB")
    assert size < 6_000_000
    page = path.read_text(encoding="utf-8")
    fig = _figures(page)[0]
    event_markers = sum(len(tr["x"]) for tr in fig["data"] if tr.get("name") in ("warning", "error", "fatal"))
    assert 0 < event_markers <= 1000
    ck = next(tr for tr in fig["data"] if tr.get("name") == "checkpoints")
    assert ck["x"] == [50, 100]  # exact steps survive aggregation
    assert any(s["type"] == "rect" and s["x0"] == 3000 for s in fig["layout"]["shapes"])


def test_big_numeric_lane_is_bucketed() -> None:
    run = _run(n_steps=12_000, collapse=9000, memory=False)
    fig = _figures(render_html(Analysis(runs=[run])))[0]
    reward = [tr for tr in fig["data"] if (tr.get("name") or "").startswith(REWARD)]
    assert reward and all(len(tr["x"]) <= 5000 for tr in reward)
    assert "bucket" in reward[0]["name"]


def test_import_is_lazy() -> None:
    code = "import sys, reports; assert 'plotly' not in sys.modules, 'plotly imported at start-up'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])


# --------------------------------------------------------------------------- terminal


def _summary(analysis: Analysis) -> str:
    buf = io.StringIO()
    render_summary(analysis, Console(file=buf, width=100, no_color=True))
    return buf.getvalue()


def test_terminal_summary() -> None:
    out = _summary(Analysis(runs=[_run()]))
    assert "\x1b[" not in out
    assert "step 120" in out
    assert "inference_server_unresponsive (confidence 0.90)" in out
    assert "NOT RECOVERED" in out
    assert CKPT_100 in out
    assert "[bold]x[/bold]" in out
    assert "logs/trainer.log:1181" in out
    assert "warning: hf_export checkpoints" in out
    assert all(len(line) <= 100 for line in out.splitlines() if "checkpoint " not in line and "resume " not in line)
    assert out == _summary(Analysis(runs=[_run()]))  # deterministic


def test_terminal_healthy() -> None:
    out = _summary(Analysis(runs=[_run(collapse=None)]))
    assert "No incident found" in out
    assert CKPT_100 in out


def test_empty_run_renders() -> None:
    run = RunAnalysis(
        run_id="empty", framework="unknown", root="/x", sources=[], primary_metric=None, incidents=[],
        checkpoints=[], recommendation=Recommendation(None, None, "No checkpoint found.", None),
        metrics=empty(METRIC_SCHEMA), events=empty(EVENT_SCHEMA), steps=empty(STEP_SCHEMA),
    )
    page = render_html(Analysis(runs=[run]))
    assert "No incident found" in page and 'id="checkpoint"' in page and "No step data to plot" in page
    assert _figures(page) == []
    out = _summary(Analysis(runs=[run]))
    assert "No incident found" in out and "none" in out
