"""The HTML reports in real headless Chromium, driven over the DevTools protocol (stdlib only).

Checks what only a browser can: the page runs without console errors, requests nothing but its
own file, shows the verdict above the fold of a 1280×900 window, draws its charts, shows a
clicked event's line as text, and renders a hostile log line as text. Screenshots and a PDF
print go to ``test-artifacts/`` at the repository root (git-ignored) for a human to look at.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from forensics import analyze
from forensics.compare import compare
from forensics.model import Analysis, Evidence
from parsers.schema import EVENT_SCHEMA
from reports import write_compare_html, write_html

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
WIDTH, FOLD = 1280, 900
START_TIMEOUT = 120
HOSTILE = '</script><script>window.__pwned=1</script><img src=x onerror="window.__pwned=2"> [x](javascript:alert(1))'


def _chromium() -> str | None:
    for name in (os.environ.get("CHROMIUM", ""), "chromium", "chromium-browser", "google-chrome-stable", "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


CHROMIUM = _chromium()
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (CI installs it: .ci/run)")


def _high(fds: tuple[int, int]) -> tuple[int, int]:
    out = []
    for fd in fds:
        out.append(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10))
        os.close(fd)
    return out[0], out[1]


class Browser:
    """A headless Chromium and one page, over --remote-debugging-pipe (fd 3 in, fd 4 out, NUL-framed JSON)."""

    def __init__(self, exe: str, profile: Path) -> None:
        # Chromium's ends are moved to fd 10 and above first, so that they never collide with 3 or 4.
        to_chrome_r, self._out = _high(os.pipe())
        self._in, from_chrome_w = _high(os.pipe())
        args = [
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-extensions", "--disable-dev-shm-usage", "--remote-debugging-pipe", f"--user-data-dir={profile}",
            f"--window-size={WIDTH},{FOLD}", "about:blank",
        ]
        # A tiny Python trampoline puts our pipe ends on fds 3 and 4, then becomes Chromium.
        trampoline = "import os,sys; os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4); os.execv(sys.argv[3], sys.argv[3:])"
        profile.mkdir(exist_ok=True)
        self._log = open(profile / "chromium.log", "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", trampoline, str(to_chrome_r), str(from_chrome_w), exe, *args],
            pass_fds=(to_chrome_r, from_chrome_w), stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log,
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf = b""
        self._next = 0
        self.events: list[dict[str, Any]] = []
        try:
            # A first start on a cold, loaded machine can take long (fonts, profile, D-Bus retries).
            target = self.call("Target.createTarget", url="about:blank", timeout=START_TIMEOUT)["targetId"]
            self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
            for domain in ("Page", "Runtime", "Log", "Network"):
                self.page(f"{domain}.enable")
            self.page("Emulation.setDeviceMetricsOverride", width=WIDTH, height=FOLD, deviceScaleFactor=1, mobile=False)
        except BaseException:
            self.close()
            raise

    # -- protocol
    def _read(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._in], [], [], left)[0]:
                raise TimeoutError(f"no answer from chromium in {timeout:.0f} s{self._said()}")
            chunk = os.read(self._in, 1 << 20)
            if not chunk:
                raise RuntimeError(f"chromium closed the pipe{self._said()}")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def _said(self) -> str:
        """Whether Chromium still runs, and the end of what it printed: a failed start is told, not guessed."""
        state = "running" if self.proc.poll() is None else f"exited {self.proc.returncode}"
        self._log.flush()
        lines = [line for line in Path(self._log.name).read_text(errors="replace").splitlines() if "dbus" not in line]
        return f" (chromium {state}; its last lines:\n" + "\n".join(lines[-25:]) + ")"

    def call(self, method: str, session: str | None = None, timeout: float = 30, **params: Any) -> dict[str, Any]:
        self._next += 1
        message: dict[str, Any] = {"id": self._next, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read(timeout)
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def page(self, method: str, **params: Any) -> dict[str, Any]:
        return self.call(method, self.session, **params)

    def wait_event(self, method: str, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        seen = len(self.events)
        while True:
            for ev in self.events[seen:]:
                if ev.get("method") == method:
                    return ev
            seen = len(self.events)
            self.events.append(self._read(max(0.01, deadline - time.monotonic())))

    def js(self, expression: str) -> Any:
        result = self.page("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=5)
        except Exception:  # noqa: BLE001 - closing anyway
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._in)
        os.close(self._out)
        self._log.close()

    # -- page helpers
    def open(self, path: Path) -> str:
        """Load ``path``; wait until every chart is drawn. Returns its file:// URL."""
        self.events.clear()
        url = path.resolve().as_uri()
        self.page("Page.navigate", url=url)
        self.wait_event("Page.loadEventFired")
        deadline = time.monotonic() + 30
        while not self.js("Array.from(document.querySelectorAll('.plot')).every(p => p.dataset.drawn === 'true')"):
            assert time.monotonic() < deadline, "charts were not drawn"
            time.sleep(0.1)
        return url

    def problems(self) -> list[str]:
        """Console errors, uncaught exceptions and failed loads seen since the last open()."""
        out = []
        for ev in self.events:
            method, params = ev.get("method"), ev.get("params", {})
            if method == "Runtime.exceptionThrown":
                out.append(json.dumps(params["exceptionDetails"])[:500])
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert", "warning"):
                out.append(json.dumps(params.get("args"))[:500])
            elif method == "Log.entryAdded" and params["entry"].get("level") in ("error", "warning"):
                out.append(params["entry"].get("text", "")[:500])
            elif method == "Network.loadingFailed":
                out.append(f"load failed: {params.get('errorText')}")
        return out

    def requests(self) -> list[str]:
        return [ev["params"]["request"]["url"] for ev in self.events if ev.get("method") == "Network.requestWillBeSent"]

    def screenshot(self, name: str, full: bool = False, width: int = WIDTH) -> Path:
        params: dict[str, Any] = {"format": "png"}
        if full:
            height = self.js("document.documentElement.scrollHeight")
            params.update(captureBeyondViewport=True, clip=dict(x=0, y=0, width=width, height=height, scale=1))
        data = base64.b64decode(self.page("Page.captureScreenshot", **params)["data"])
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / name
        path.write_bytes(data)
        return path

    def click(self, x: float, y: float) -> None:
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            extra = {} if kind == "mouseMoved" else {"button": "left", "clickCount": 1}
            self.page("Input.dispatchMouseEvent", type=kind, x=x, y=y, **extra)
            time.sleep(0.15)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with tempfile.TemporaryDirectory(prefix="grpo-forensics-chromium-") as root:
        try:
            b = Browser(CHROMIUM, Path(root, "first"))  # type: ignore[arg-type]
        except (TimeoutError, RuntimeError) as first:
            # Once more with a new profile; a second failure is the test's, with both starts' output.
            print(f"chromium did not start, trying again: {first}", file=sys.stderr)
            b = Browser(CHROMIUM, Path(root, "second"))  # type: ignore[arg-type]
        try:
            yield b
        finally:
            b.close()


def _hostile(run):
    """The seed000 run with one more server line, written by an attacker, that is also evidence."""
    onset = run.incidents[0]
    when = onset.onset_time + timedelta(seconds=5)
    trainer = next(s.path for s in run.sources if "trainer" in s.path)
    row = pl.DataFrame([{"time": when, "step": onset.onset_step, "source": "areal", "kind": "scheduler_exception",
                         "severity": "fatal", "file": trainer, "line": 999_999, "message": HOSTILE}],
                       schema=EVENT_SCHEMA)
    run.events = pl.concat([run.events, row])
    evidence = Evidence("scheduler_exception", when, onset.onset_step, trainer, 999_999, HOSTILE)
    run.incidents = [replace(onset, evidence=(evidence, *onset.evidence)), *run.incidents[1:]]
    return run


@pytest.fixture(scope="module")
def seed000_report(tmp_path_factory) -> Path:
    here = Path(__file__).parent / "fixtures"
    run = _hostile(analyze([here / "areal_seed000" / "outputs"]).runs[0])
    return write_html(Analysis(runs=[run]), tmp_path_factory.mktemp("report"))


def _assert_clean(browser: Browser, url: str) -> None:
    assert browser.problems() == []
    assert browser.requests() == [url], "the page requested something besides itself"


def test_report_loads_offline_with_the_verdict_above_the_fold(browser: Browser, seed000_report: Path) -> None:
    url = browser.open(seed000_report)
    browser.screenshot("report-seed000.png")
    browser.screenshot("report-seed000-full.png", full=True)
    _assert_clean(browser, url)
    box = browser.js("""(() => {
        const r = (sel) => { const b = document.querySelector(sel).getBoundingClientRect(); return [b.top, b.bottom]; };
        return {status: r('.status'), onset: r('#incident-1 dl.facts'), card: r('#checkpoint h2'),
                command: r('#checkpoint pre'), plot: r('.plot')};
    })()""")
    for name in ("status", "onset", "card", "command"):
        assert box[name][1] <= FOLD, (name, box)
    assert box["plot"][0] > box["onset"][1]  # verdict before any chart
    buttons = browser.js("Array.from(document.querySelectorAll('.modebar-btn')).map(b => b.dataset.title)")
    assert buttons and not [b for b in buttons if "Share" in b or "Cloud" in b]  # nothing uploads the chart
    text = browser.js("document.querySelector('.verdict').innerText")
    for expected in ("step 940", "not recovered", "929 steps", "inference_server_unresponsive", "globalstep899"):
        assert expected in text


def test_hostile_log_line_stays_text(browser: Browser, seed000_report: Path) -> None:
    browser.open(seed000_report)
    literal = json.dumps("<script>window.__pwned=1</script>")
    page = browser.js("""({
        pwned: window.__pwned === undefined ? null : window.__pwned,
        imgs: document.querySelectorAll('img').length,
        scripts: document.querySelectorAll('script').length,
        blocks: document.querySelectorAll('script[type="application/json"]').length,
        shown: document.body.innerText.split(LITERAL).length - 1,
    })""".replace("LITERAL", literal))
    assert page["pwned"] is None and page["imgs"] == 0
    assert page["scripts"] == page["blocks"] + 2  # plotly.js and the page script, nothing injected
    assert page["shown"] >= 2  # in the incident card and in the evidence table


def test_clicking_an_event_marker_shows_its_line(browser: Browser, seed000_report: Path) -> None:
    browser.open(seed000_report)
    where = browser.js("""(() => {
        const gd = document.getElementById('plot-1');
        gd.scrollIntoView({block: 'center'});
        for (let i = 0; i < gd.calcdata.length; i++) {
            const tr = gd._fullData[i];
            const k = (tr.customdata || []).findIndex(c => Array.isArray(c) && String(c[3]).includes('__pwned'));
            if (k < 0) continue;
            const xa = gd._fullLayout[tr.xaxis.replace('x', 'xaxis')], ya = gd._fullLayout[tr.yaxis.replace('y', 'yaxis')];
            const pt = gd.calcdata[i][k], box = gd.getBoundingClientRect();
            return {x: box.left + xa._offset + xa.c2p(pt.x), y: box.top + ya._offset + ya.c2p(pt.y)};
        }
        return null;
    })()""")
    assert where is not None, "the hostile event has no marker"
    browser.click(where["x"], where["y"])
    panel = browser.js("""(() => {
        const p = document.getElementById('plot-1-line');
        return {text: p.querySelector('pre').textContent, where: p.querySelector('code').textContent,
                elements: p.querySelectorAll('pre *').length, filled: p.classList.contains('filled')};
    })()""")
    browser.js("document.getElementById('plot-1-line').scrollIntoView({block: 'end'}); true")
    browser.screenshot("report-seed000-clicked.png")
    assert panel["filled"], panel
    assert panel["text"] == HOSTILE and panel["elements"] == 0
    assert panel["where"].endswith("trainer.log.gz:999999")
    assert browser.js("window.__pwned === undefined")


def test_report_prints_to_pdf(browser: Browser, seed000_report: Path) -> None:
    browser.open(seed000_report)
    pdf = base64.b64decode(browser.page("Page.printToPDF", printBackground=True)["data"])
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "report-seed000.pdf").write_bytes(pdf)
    assert pdf.startswith(b"%PDF") and len(pdf) > 10_000
    # what the first printed page looks like: print media, charts fitted to the paper
    browser.page("Emulation.setEmulatedMedia", media="print")
    browser.page("Emulation.setDeviceMetricsOverride", width=794, height=1123, deviceScaleFactor=1, mobile=False)  # A4
    try:
        browser.js("window.dispatchEvent(new Event('beforeprint')); true")
        width = browser.js("document.querySelector('.plot .main-svg').getAttribute('width')")
        assert float(width) <= 720
        browser.screenshot("report-seed000-print.png", full=True, width=794)
    finally:
        browser.js("window.dispatchEvent(new Event('afterprint')); true")
        browser.page("Emulation.setEmulatedMedia", media="")
        browser.page("Emulation.setDeviceMetricsOverride", width=WIDTH, height=FOLD, deviceScaleFactor=1, mobile=False)


@pytest.mark.parametrize("name", ["areal_seed001", "areal_healthy_sparse"])
def test_other_fixtures_load_cleanly(browser: Browser, tmp_path: Path, name: str) -> None:
    result = analyze([Path(__file__).parent / "fixtures" / name / "outputs"])
    url = browser.open(write_html(result, tmp_path))
    browser.screenshot(f"report-{name}.png")
    _assert_clean(browser, url)
    assert browser.js("document.querySelector('.status').getBoundingClientRect().bottom") <= FOLD


def test_compare_page_loads_cleanly(browser: Browser, tmp_path: Path) -> None:
    here = Path(__file__).parent / "fixtures"
    a = analyze([here / "areal_seed000" / "outputs"]).runs[0]
    b = analyze([here / "areal_healthy_sparse" / "outputs"]).runs[0]
    url = browser.open(write_compare_html(compare(a, b), tmp_path))
    browser.screenshot("compare.png")
    _assert_clean(browser, url)
    assert browser.js("document.querySelector('.compare-verdict').getBoundingClientRect().bottom") <= FOLD
    assert "whether B has reward_collapse cannot be told" in browser.js("document.querySelector('.compare-verdict').innerText")
