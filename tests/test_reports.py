"""Rendering tests: the HTML post-mortem and the terminal summary, from hand-built analyses."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from dataclasses import replace
from datetime import datetime, timedelta
from importlib import resources
from pathlib import Path

import polars as pl
import pytest
from rich.console import Console

from forensics.model import Analysis, Checkpoint, Evidence, Incident, Recommendation, RunAnalysis, SourceReport
from parsers.schema import EVENT_SCHEMA, METRIC_SCHEMA, STEP_SCHEMA, conform, empty
from reports import render_html, render_markdown, render_summary, write_html
from reports.page import plotly_js

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
    server: bool = False,
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
    if server:  # a busy SGLang log: one stats sample every 2 s, no step of its own
        for k in range(n_steps * 15):
            t = T0 + timedelta(seconds=2 * k + 31)
            rows += [(None, t, "sglang/running_req", float(k % 64), SERVER, 2000 + k),
                     (None, t, "sglang/queue_req", float(k % 7), SERVER, 2000 + k),
                     (None, t, "sglang/token_usage", 0.5 + 0.001 * (k % 100), SERVER, 2000 + k),
                     (None, t, "sglang/gen_throughput", 1500.0 + k % 300, SERVER, 2000 + k)]
    metrics = conform(pl.DataFrame(rows, schema=list(METRIC_SCHEMA)[:6], orient="row"), METRIC_SCHEMA)

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
            evidence=evidence, wasted_steps=n_steps - collapse,
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
        sources=[SourceReport(TRAINER, "areal_trainer", 10 * n_steps + 5, 3, ("no step times before step 1",),
                              bytes=12_345, digest="ab" * 32, digest_method="sha256-head-tail"),
                 SourceReport(SERVER, "sglang_server", 1000, 0, bytes=999, digest="cd" * 32, digest_method="sha256")],
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


def _traces(fig: dict, *names: str) -> list[dict]:
    return [tr for tr in fig["data"] if tr.get("name") in names]


def _without_plotlyjs(page: str) -> str:
    js = plotly_js()
    assert page.count(js) == 1
    return page.replace(js, "")


# --------------------------------------------------------------------------- HTML


def test_verdict_comes_before_any_chart(collapse_html: str) -> None:
    inc = collapse_html.index('id="incident-1"')
    ckpt = collapse_html.index('id="checkpoint"')
    first_plot = collapse_html.index('<div class="plot"')
    first_script = collapse_html.index("<script")
    assert inc < ckpt < first_plot < first_script
    verdict = collapse_html[collapse_html.index('<header class="verdict"'):first_plot]
    for expected in ("reward collapse", "step 120", "not recovered", "80 steps", "inference_server_unresponsive",
                     "0.90", "logs/trainer.log:1181", CKPT_100, "--recover-from", "optimizer state restarts",
                     "Reward fell from 0.55"):
        assert expected in verdict, expected
    assert "<pre><code>python -m areal.launcher" in verdict
    # 80 steps after the onset at 30 s each: 80 * 30 s = 0.67 h
    assert "80 steps (0.67 h)" in verdict


def test_a_recovered_incidents_card_says_where_it_ended_and_what_to_change() -> None:
    run = _run()
    run.incidents = [replace(run.incidents[0], end_step=150, recovered=True, wasted_steps=29,
                             suggestions=("Lower rollout.request_timeout.",))]
    page = render_html(Analysis(runs=[run]))
    card = page[page.index('id="incident-1"'):page.index('id="checkpoint"')]
    assert "step 150 (recovered)" in card and f"<dd>{run.incidents[0].wasted}</dd>" in card
    assert "What to change" in card and "Lower rollout.request_timeout." in card


def test_plotlyjs_basic_bundle_inlined_exactly_once(collapse_html: str) -> None:
    from plotly.offline import get_plotlyjs_version

    js = plotly_js()
    assert js.startswith("/**\n* plotly.js (basic - minified) v")
    assert f"v{get_plotlyjs_version()}" in js[:100]  # the version the Python plotly ships
    assert collapse_html.count(js) == 1
    assert collapse_html.count("<script") == collapse_html.count("</script>")
    # every trace type used exists in the basic bundle (scatter, bar, pie)
    assert {tr.get("type") for tr in _figures(collapse_html)[0]["data"]} == {"scatter"}


def test_nothing_loaded_from_the_network(collapse_html: str) -> None:
    assert not re.search(r"<(script|link|img|iframe|source|video|audio)\b[^>]*\b(src|href)\s*=\s*[\"']?\s*(https?:)?//",
                         collapse_html, re.I)
    rest = _without_plotlyjs(collapse_html)
    assert "http://" not in rest and "https://" not in rest
    assert "@import" not in rest and "url(" not in rest
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', rest).group(1)
    assert "default-src 'none'" in csp and "unsafe-eval" not in csp
    assert "showSendToCloud: false" in rest  # the modebar's "Share chart" would upload the figure


def test_untrusted_text_cannot_break_out(collapse_html: str) -> None:
    assert XSS not in collapse_html
    assert "<script>alert" not in collapse_html
    assert "<img src=x" not in collapse_html
    # shown as text in the verdict and the evidence table
    assert collapse_html.count("&lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;") >= 2
    figs = _figures(collapse_html)
    assert len(figs) == 1
    events = _traces(figs[0], "warning", "error", "fatal")
    hovers = [h for tr in events for h in tr["hovertext"]]
    xss_hover = [h for h in hovers if "alert(1)" in h]
    assert xss_hover and all("<script" not in h and "<img" not in h for h in xss_hover)
    # the click panel gets the raw line as data (the page sets it with textContent)
    clicks = [c for tr in events for c in tr["customdata"]]
    assert [c for c in clicks if c[3] == XSS and c[2] == f"{TRAINER}:1191"]
    page_js = resources.files("reports").joinpath("_page.js").read_text()
    assert "textContent" in page_js and "innerHTML" not in page_js


def test_timeline_lanes(collapse_html: str) -> None:
    fig = _figures(collapse_html)[0]
    names = [tr.get("name") for tr in fig["data"]]
    assert REWARD in names and "checkpoints" in names and "incident onset" in names
    [ck] = _traces(fig, "checkpoints")
    assert ck["x"] == [50, 100]
    assert "checkpoints/epoch0epochstep99globalstep99" in " ".join(ck["hovertext"])
    # every problem event is in the lane, one row per kind; the server exit has no step and is placed by time
    events = _traces(fig, "warning", "error", "fatal")
    assert {y for tr in events for y in tr["y"]} == {"kv_cache_retract", "request_timeout", "workflow_failed",
                                                     "server_exit"}
    [fatal] = _traces(fig, "fatal")
    assert fatal["x"] == [121]
    assert "device_used" in names and "device_total" in names
    assert "step duration s" in names
    # the primary line's hover reads the wall-clock time of each step
    [reward] = _traces(fig, REWARD)
    assert reward["customdata"][0] == "2025-11-11 10:00:30" and "%{customdata}" in reward["hovertemplate"]
    # ...and a second axis on top shows it
    top = [v for k, v in fig["layout"].items() if k.startswith("xaxis") and v.get("side") == "top"]
    assert top and top[0]["ticktext"][0].startswith("11-11 10:00")
    # the incident band runs from the onset to the last step (not recovered)
    rects = [s for s in fig["layout"]["shapes"] if s["type"] == "rect"]
    assert rects[0]["x0"] == 120 and rects[0]["x1"] == 200


def test_server_load_lane_only_with_server_stats() -> None:
    page = render_html(Analysis(runs=[_run()]))
    assert "no server stats" in page[page.index('id="timeline"'):page.index('<div class="plot"')]
    run = _run(server=True)
    run.sources = [replace(s, notes=()) for s in run.sources]
    fig = _figures(render_html(Analysis(runs=[run])))[0]
    names = [tr.get("name") for tr in fig["data"]]
    assert {"running requests", "queued requests", "KV token usage", "gen throughput"} <= set(names)
    [usage] = _traces(fig, "KV token usage")
    assert fig["layout"][usage["yaxis"].replace("y", "yaxis")]["tickformat"] == ".0%"
    # stats carry no step of their own: each is drawn at the step in progress when it was logged,
    # as the analysis places events (the first, 1 s after step 1's header, is step 2's)
    [running] = _traces(fig, "running requests")
    assert (min(running["x"]), max(running["x"])) == (2, 201)
    # the server's own note says why stats are missing
    quiet = _run()
    quiet.sources = [replace(quiet.sources[1], notes=("no server stats lines: SGLang ran at warning level",))]
    page = render_html(Analysis(runs=[quiet]))
    assert '<p class="lane-notes">no server stats lines: SGLang ran at warning level</p>' in page


def test_healthy_run(healthy_html: str) -> None:
    assert "No incident found" in healthy_html
    assert 'id="checkpoint"' in healthy_html and CKPT_100 in healthy_html
    assert 'id="incident-1"' not in healthy_html
    assert '<p class="lane-notes">no memory lines (mem/…) in the logs</p>' in healthy_html
    fig = _figures(healthy_html)[0]
    assert not [tr for tr in fig["data"] if (tr.get("name") or "").startswith("device")]


def test_anchors_for_deep_links(collapse_html: str) -> None:
    for anchor in ("incident-1", "checkpoint", "timeline", "evidence", "sources", "provenance"):
        assert collapse_html.count(f'id="{anchor}"') == 1, anchor


def test_print_css_and_provenance_footer(collapse_html: str) -> None:
    assert "@media print" in collapse_html and "beforeprint" in collapse_html
    footer = collapse_html[collapse_html.index('<footer id="provenance">'):]
    assert "0.1.0" in footer and "grpo-forensics/analysis/v1" in footer
    assert "collapse_drop" in footer and "window" in footer
    assert "12,345" in footer and "ab" * 32 in footer and "sha256-head-tail" in footer
    assert f"grpo-forensics analyze {ROOT}" in footer


def test_sources_and_evidence_tables(collapse_html: str) -> None:
    sources = collapse_html[collapse_html.index('id="sources"'):]
    assert "areal_trainer" in sources and "no step times before step 1" in sources
    assert "lines not understood" in sources
    evidence = collapse_html[collapse_html.index('id="evidence"'):collapse_html.index('id="sources"')]
    assert '<td class="">sglang</td><td class="">kv_cache_retract</td>' in evidence  # source from the events frame
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
    assert page.count('id="run-2-evidence"') == 1
    assert len(_figures(page)) == 2


def test_busy_5000_step_run_stays_under_budget(tmp_path: Path) -> None:
    run = _run(n_steps=5000, collapse=3000, n_events=20_000, server=True)
    assert run.metrics.height > 300_000
    path = write_html(Analysis(runs=[run]), tmp_path / "out" / "nested")
    assert path == tmp_path / "out" / "nested" / "report.html"
    size = path.stat().st_size
    print(f"5,000 steps, 20,000 events, busy server log: {size / 1e6:.2f} MB")
    assert size < 5_000_000
    fig = _figures(path.read_text(encoding="utf-8"))[0]
    event_markers = sum(len(tr["x"]) for tr in _traces(fig, "warning", "error", "fatal"))
    assert 0 < event_markers <= 1000
    assert all(len(tr["x"]) <= 5000 for tr in fig["data"])
    [ck] = _traces(fig, "checkpoints")
    assert ck["x"] == [50, 100]  # exact steps survive aggregation
    assert any(s["type"] == "rect" and s["x0"] == 3000 for s in fig["layout"]["shapes"])


def test_big_numeric_lane_is_bucketed() -> None:
    run = _run(n_steps=12_000, collapse=9000, memory=False)
    fig = _figures(render_html(Analysis(runs=[run])))[0]
    reward = [tr for tr in fig["data"] if (tr.get("name") or "").startswith(REWARD)]
    assert reward and all(len(tr["x"]) <= 5000 for tr in reward)
    assert "bucket" in reward[0]["name"]


@pytest.mark.parametrize("name", ["areal_seed000", "areal_seed001", "areal_healthy_sparse"])
def test_every_fixture_report_is_under_budget(fixture_run, tmp_path: Path, name: str) -> None:
    from forensics import analyze

    path = write_html(analyze([fixture_run(name)]), tmp_path)
    size = path.stat().st_size
    print(f"{name}: {size / 1e6:.2f} MB")
    assert size < 5_000_000


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


# --------------------------------------------------------------------------- Markdown


def test_markdown_summary() -> None:
    md = render_markdown(Analysis(runs=[_run()]))
    assert md.startswith("#### grpo-forensics: gsm8k-grpo/trial0 — 1 incident")
    assert "from step 120 (2025-11-11T11:00:00), **not recovered**; wasted 80 steps (0.67 h)" in md
    assert "Cause: `inference_server_unresponsive` (confidence 0.90)" in md
    assert "`logs/trainer.log:1181`" in md
    assert f"**Resume from step 100:** `{CKPT_100}`" in md
    assert f"```bash\npython -m areal.launcher --recover-from {CKPT_100}\n```" in md
    assert "optimizer state restarts" in md
    assert len(md.splitlines()) < 20


@pytest.mark.parametrize("hostile", [
    XSS,
    "[click me](javascript:alert(1))",
    "![img](http://evil.example/pixel.png)",
    "a ``` b ` c ```` d",
    "`starts and ends with a backtick`",
    "**bold** _it_ <b>tag</b> &lt; | a | b | @here #1 :smile: $x$",
])
def test_markdown_neutralises_log_text(hostile: str) -> None:
    from reports.markdown import code, text

    run = _run()
    evidence = (Evidence("workflow_failed", _t(119), 119, TRAINER, 1191, hostile),)
    run.incidents = [replace(run.incidents[0], evidence=evidence, id=hostile)]
    md = render_markdown(Analysis(runs=[run]))
    # log lines are code spans that nothing inside can close
    span = code(hostile)
    assert span in md
    fence = re.match(r"`+", span).group(0)
    assert len(fence) > max((len(r) for r in re.findall(r"`+", hostile)), default=0)
    assert span[len(fence):-len(fence)].strip() == hostile
    # as prose (the incident id here) no Markdown or HTML syntax survives unescaped
    prose = text(hostile)
    assert prose in md
    assert not re.search(r"(?<!\\)[<>\[\]`*_|]", prose)
    assert "](" not in prose.replace("\\]", "")


def test_cli_analyze_markdown(fixture_run, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from forensics.cli import app

    target = tmp_path / "summary.md"
    args = ["analyze", str(fixture_run("areal_seed000")), "--no-html", "--markdown"]
    result = CliRunner().invoke(app, [*args, str(target)])
    assert result.exit_code == 0, result.output
    md = target.read_text()
    assert "reward\\_collapse" in md and "from step 940" in md and "epoch0epochstep899globalstep899" in md
    assert re.search(r"`trainer\.log\.gz:\d+`", md)
    stdout = CliRunner().invoke(app, [*args, "-"])
    assert stdout.exit_code == 0 and stdout.stdout == md  # the terminal summary went to stderr
    both = CliRunner().invoke(app, [*args, "-", "--json", "-"])
    assert both.exit_code == 2 and len(both.stderr.strip().splitlines()) == 1


def test_a_stall_wastes_hours_not_steps(fixture_run) -> None:
    """seed 000's stall: no step for 13.4 h. Said as time with no step, not '0 steps (13.41 h)'."""
    from forensics import analyze

    stall = analyze(fixture_run("areal_seed000")).runs[0].incidents[-1]
    assert stall.kind == "stall" and stall.wasted == "13.41 h with no step logged"


def test_an_incident_seen_in_the_numbers_alone_is_not_called_no_incident() -> None:
    """A reward_pipeline collapse has no failure lines: the evidence table says so, not that no
    incident was found."""
    from forensics import analyze

    run = analyze([Path(__file__).parent / "fixtures" / "sglang_healthy_collapse" / "outputs"]).runs[0]
    stripped = replace(run, incidents=[replace(i, evidence=()) for i in run.incidents])
    page = render_html(Analysis(runs=[stripped]))
    assert "no incident was found" not in page
    assert "No failure lines: the incidents were seen in the numbers alone" in page


@pytest.mark.parametrize("columns", [60, 100])
def test_the_terminal_names_each_evidence_line_by_its_whole_file_and_line(tmp_path: Path, columns: int) -> None:
    """A Ray worker's log name is longer than a terminal is wide: its evidence line still shows the
    file and line whole (folded), only the line's text is cut."""
    from verl_builder import nccl_hang_run

    from forensics import analyze

    run = nccl_hang_run(tmp_path / "hang")
    analysis = analyze([run.root])
    [ran] = analysis.runs
    console = Console(file=io.StringIO(), width=columns, color_system=None)
    render_summary(analysis, console)
    shown = "".join(line.strip("│ ") for line in console.file.getvalue().splitlines())
    root = ran.root.rstrip("/") + "/"
    evidence = ran.incidents[0].evidence[:3]
    assert any(len(e.file) - len(root) > columns for e in evidence)  # (a name longer than the terminal)
    for e in evidence:
        assert f"{e.file.removeprefix(root)}:{e.line}" in shown


def test_the_timelines_labels_and_click_panel_show_control_characters_as_escapes(tmp_path: Path) -> None:
    """An error line with a right-to-left override and a NUL: the timeline's hover and click panel
    show them as their escapes, as the evidence table does (``/ckpt/bad.png`` reversed is not what
    the line says)."""
    from areal_builder import LogLine, RunSpec, healthy_reward, schedule, write_run

    from forensics import analyze
    from reports.timeline import timeline

    spec = RunSpec(last_step=40, reward=lambda s: 0.0 if s >= 30 else healthy_reward(s))
    at = {t.step: t.time for t in schedule(spec)}
    said = "saving to \u202egnp.dab\u202c failed:\x00 disk full"
    paths = write_run(tmp_path / "outputs", replace(spec, extra_lines=(
        LogLine(at[30] - timedelta(seconds=3), said, "/AReaL/areal/utils/saver.py", "ERROR"),)))
    [run] = analyze([paths.fileroot]).runs
    figure, _ = timeline(run)
    assert figure is not None
    shown = json.dumps([[t.get("hovertext"), t.get("customdata")] for t in figure["data"]], ensure_ascii=False)
    assert "\u202e" not in shown and "\x00" not in shown and "\\\\u202egnp.dab" in shown and "\\\\x00 disk full" in shown


def test_a_report_of_logs_with_no_step_lists_the_failures_they_hold() -> None:
    """A server log given alone: no step, so no incident, and the verdict says failures were logged
    ("see the events"): the report shows each kind's count and first line, where it is."""
    from conftest import FIXTURES, read_line

    from forensics import analyze

    [log] = (FIXTURES / "sglang_hang" / "outputs").rglob("llm_server.log*")
    analysis = analyze([log])
    [run] = analysis.runs
    assert not run.incidents and run.steps.is_empty()
    failures = run.failures_logged()
    assert failures["count"].sum() == run.events.filter(pl.col("severity").is_in(["error", "fatal"])).height
    page = render_html(analysis)
    assert "Failures logged" in page
    for f in failures.iter_rows(named=True):
        assert f"{f['kind']}</td><td class=\"num\">{f['count']:,}</td>" in page
        assert f">{log.name}</span>:{f['line']}<" in page and f["message"] == re.sub(r"\x1b\[[0-9;]*m", "", read_line(log, f["line"])).rstrip()


def test_an_incident_card_gives_the_analysis_own_numbers_only(tmp_path: Path) -> None:
    """A collapse that recovered: the card says where it ended and the steps wasted as the analysis
    counts them; no second count of its own (it said "lasted 30 steps" beside "wasted: 29 steps")."""
    from areal_builder import RunSpec, healthy_reward, write_run

    from forensics import analyze

    paths = write_run(tmp_path / "outputs", RunSpec(last_step=160, reward=lambda s: 0.0 if 100 <= s < 130 else healthy_reward(s)))
    analysis = analyze([paths.fileroot])
    [incident] = analysis.runs[0].incidents
    assert (incident.onset_step, incident.end_step) == (100, 130)
    page = render_html(analysis)
    assert "step 130 (recovered)" in page and "lasted" not in page and f"{incident.wasted_steps} steps" in page


def test_a_collapse_in_an_abandoned_attempt_is_drawn_on_that_attempts_values(tmp_path: Path) -> None:
    """The first attempt logged zeros from step 110 and was relaunched from step 100: the timeline
    draws the abandoned attempt's values (dotted) with the onset on them, at 0, not on the relaunch's
    healthy line over the same steps; the verdict list says where the collapse was."""
    from areal_builder import Relaunch, RunSpec, healthy_reward, write_run

    from forensics import analyze
    from reports.timeline import timeline

    spec = RunSpec(last_step=200, save_freq_steps=20, recover_mode="auto",
                   relaunch=Relaunch(stop_after=150, resume_from=100, first_reward=lambda s: 0.0 if s >= 110 else healthy_reward(s)))
    analysis = analyze([write_run(tmp_path / "outputs", spec).fileroot])
    [run] = analysis.runs
    [incident] = run.incidents
    assert (incident.kind, incident.onset_step, incident.redone) == ("reward_collapse", 110, True)
    figure, _ = timeline(run)
    assert figure is not None
    traces = {t.get("name"): t for t in figure["data"]}
    abandoned = traces[f"{run.primary_metric} (attempt a relaunch abandoned)"]
    assert dict(zip(abandoned["x"], abandoned["y"]))[110] == 0.0
    assert min(dict(zip(traces[run.primary_metric]["x"], traces[run.primary_metric]["y"]))[s] for s in range(110, 151)) > 0
    assert traces["incident onset"]["y"] == [0.0]
    assert "recovered at step 151 (in an attempt a relaunch abandoned)" in render_html(analysis)
    assert "recovered at step 151 (in an attempt a relaunch abandoned)" in render_markdown(analysis)  # (the ticket too)


def test_the_recommendations_reason_and_warnings_keep_their_paths_whole_when_piped() -> None:
    """Output piped to a file (80 columns) or a narrow terminal: the checkpoint paths the warnings
    name are each on one line, whole, as the checkpoint itself is (to be copied)."""
    from conftest import FIXTURES

    from forensics import analyze

    analysis = analyze([FIXTURES / "areal_seed000" / "outputs"])
    rec = analysis.runs[0].recommendation
    console = Console(file=io.StringIO(), width=60, color_system=None)
    render_summary(analysis, console)
    shown = console.file.getvalue()
    paths = set(re.findall(r"/\S+/recover_checkpoint", " ".join([rec.reason, *rec.warnings])))
    assert paths and all(p in shown for p in paths)


def test_markdown_cites_the_onset_line_where_no_failure_was_logged() -> None:
    """A reward-function collapse (cause `reward_pipeline`: no failure to cite, at most the server's
    last stats line): the ticket cited nothing of the onset (with no evidence, no file:line at all);
    it cites the onset's own line, which holds the collapsed step's table."""
    from forensics import analyze

    result = analyze([Path(__file__).parent / "fixtures" / "sglang_healthy_collapse" / "outputs"])
    [inc] = result.runs[0].incidents
    assert inc.cause == "reward_pipeline"
    md = render_markdown(result)
    ev = inc.onset_evidence
    cited = re.search(r"onset: `([^`]+):(\d+)`", md)
    assert cited and int(cited.group(2)) == ev.line and Path(ev.file).name == Path(cited.group(1)).name
    import gzip

    with (gzip.open if ev.file.endswith(".gz") else open)(ev.file, "rt", encoding="utf-8") as fh:
        line = next(text for n, text in enumerate(fh, 1) if n == ev.line)
    assert "task_reward/avg" in line


def test_the_step_duration_lane_is_seconds_a_step_for_a_log_written_every_tenth_step() -> None:
    """A loop logging every 10th step at 30 s a step: the lane says 30 s, not the 300 s between rows."""
    from types import SimpleNamespace

    from reports.timeline import Timeline

    start = datetime(2025, 11, 10, 9, 0)
    steps = pl.DataFrame({"step": list(range(10, 101, 10)), "time": [start + timedelta(seconds=30 * s) for s in range(10, 101, 10)]})
    durations = Timeline(SimpleNamespace(steps=steps)).durations()  # type: ignore[arg-type]
    assert durations["step"].to_list() == list(range(20, 101, 10)) and set(durations["value"].to_list()) == {30.0}


def test_a_code_span_keeps_a_paths_spaces_and_tabs_and_stays_on_one_line() -> None:
    """A sweep folder named with two spaces (or a tab) is that path still in the ticket; a line
    break in a log line does not break the ticket's line."""
    from reports.markdown import code

    assert code("/runs/sweep  lr 1e-6/ckpt") == "`/runs/sweep  lr 1e-6/ckpt`"
    assert code("a\tb") == "`a\tb`"
    assert code("first\nsecond\r\nthird") == "`first second third`"


def test_the_tickets_of_runs_sharing_an_id_are_headed_by_what_sets_their_folders_apart() -> None:
    """Two folders of one config (a sweep): the ticket heads each run as the index and the terminal
    label it, and a fleet's per-run summaries are relabelled so."""
    from reports.markdown import labelled

    first = replace(_run(), root="/runs/lr-1e-6/outputs/logs/root/exp/trial0")
    second = replace(_run(), root="/runs/lr-3e-6/outputs/logs/root/exp/trial0")
    heads = [line for line in render_markdown(Analysis(runs=[first, second])).splitlines() if line.startswith("####")]
    assert [h.split(" — ")[0] for h in heads] == [f"#### grpo-forensics: {first.run_id} (lr-1e-6)", f"#### grpo-forensics: {first.run_id} (lr-3e-6)"]
    alone = render_markdown(Analysis(runs=[first]))
    assert labelled(alone, first.run_id, f"{first.run_id} (lr-1e-6)").splitlines()[0].startswith(heads[0].split(" — ")[0])
