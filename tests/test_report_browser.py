"""The HTML report in a real browser: headless Chromium opens the fixture's page.

Chromium is driven over the DevTools protocol through a pipe (``--remote-debugging-pipe``: JSON
messages separated by NUL bytes on file descriptors 3 and 4), so no extra Python package is
needed. The test asserts that the page logs no console error and throws no exception, fetches
nothing from the network, that the verdict, the heatmap (a non-blank image with the expected
marks) and the traced path are drawn with the expected element counts (checked through the DOM),
and keeps a full-page screenshot as a CI artifact: ``build/report.png``.

Skipped, with the reason, when no Chromium is installed (``.ci/run`` installs Debian's
``chromium`` when it can).
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path

import pytest

import holmes
from holmes.report import write_html
from holmes.report.figures import cause_paths

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "fixtures" / "gpu64-3d-slow-gpu"
BUILD = ROOT / "build"


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


class _DevTools:
    """A minimal DevTools-protocol client over Chromium's debugging pipe."""

    def __init__(self, exe: str, profile: Path) -> None:
        to_child_r, self._w = os.pipe()
        self._r, from_child_w = os.pipe()
        # the child must see them as fds 3 (commands in) and 4 (replies out)
        hi_r = fcntl.fcntl(to_child_r, fcntl.F_DUPFD, 10)
        hi_w = fcntl.fcntl(from_child_w, fcntl.F_DUPFD, 10)
        os.close(to_child_r)
        os.close(from_child_w)

        def child_fds() -> None:
            os.dup2(hi_r, 3)
            os.dup2(hi_w, 4)

        args = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe", "--no-first-run",
                "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
                "--disable-dev-shm-usage", f"--user-data-dir={profile}", "about:blank"]
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, preexec_fn=child_fds, pass_fds=(3, 4))
        os.close(hi_r)
        os.close(hi_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict] = []

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no reply from chromium")
            ready, _, _ = select.select([self._r], [], [], left)
            if ready:
                chunk = os.read(self._r, 1 << 20)
                if not chunk:
                    raise RuntimeError("chromium closed the debugging pipe")
                self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 60.0) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            got = self._read(deadline)
            if got.get("id") == self._id:
                if "error" in got:
                    raise RuntimeError(f"{method}: {got['error']}")
                return got.get("result", {})
            self.events.append(got)

    def wait_event(self, method: str, timeout: float = 60.0) -> dict:
        for e in self.events:
            if e.get("method") == method:
                return e
        deadline = time.monotonic() + timeout
        while True:
            got = self._read(deadline)
            self.events.append(got)
            if got.get("method") == method:
                return got

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=10)
        except Exception:  # noqa: BLE001 - the process is killed below anyway
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._w)
        os.close(self._r)


# evaluated in the page once loaded: the figures' element counts, sizes, and whether the heatmap's
# cells image holds colour (drawn into a canvas, the pixels that are neither white nor grey counted)
_CHECKS = """
(async () => {
  const q = (s) => document.querySelectorAll(s);
  const box = (s) => { const e = document.querySelector(s); if (!e) return null;
                       const r = e.getBoundingClientRect(); return [r.width, r.height]; };
  const img = document.querySelector('#heatmap image.cells');
  let coloured = -1, pixels = 0;
  if (img) {
    const im = new Image();
    im.src = img.getAttribute('href');
    await im.decode();
    const c = document.createElement('canvas');
    c.width = im.naturalWidth; c.height = im.naturalHeight;
    const ctx = c.getContext('2d');
    ctx.drawImage(im, 0, 0);
    const d = ctx.getImageData(0, 0, c.width, c.height).data;
    coloured = 0; pixels = c.width * c.height;
    for (let i = 0; i < d.length; i += 4) {
      const spread = Math.max(d[i], d[i+1], d[i+2]) - Math.min(d[i], d[i+1], d[i+2]);
      if (spread > 60) coloured++;
    }
  }
  return JSON.stringify({
    verdict: (document.getElementById('verdict') || {dataset: {}}).dataset.verdict || null,
    verdictText: (document.getElementById('verdict') || {}).textContent || '',
    devices: Array.from(q('#devices tbody tr')).map(r => r.dataset.device),
    heatmapBox: box('#heatmap'), heatmapImages: q('#heatmap image.cells').length,
    heatmapWidth: img ? img.getBBox().width : 0, heatmapRows: img ? (img.getBBox().height) : 0,
    irrMarks: q('#heatmap .irr-mark').length, rankLabels: Array.from(q('#heatmap .rank-label')).map(e => e.textContent),
    coloured, pixels,
    seriesPoints: q('#series .irr-point').length, seriesLine: q('#series polyline.pivot').length,
    thresholds: q('#series line.threshold').length,
    pathBox: box('#path-graph'), edges: Array.from(q('#path-graph .edge.followed')).map(e =>
      [Number(e.dataset.from), Number(e.dataset.to), e.getTotalLength()]),
    nodes: q('#path-graph .node').length, culprits: Array.from(q('#path-graph .node.culprit')).map(e => Number(e.dataset.rank)),
    topoNamed: Array.from(q('#topology .named')).map(e => e.dataset.device),
    impactBars: Array.from(q('#impact .bar')).map(e => e.dataset.device),
  });
})()
"""


@pytest.fixture(scope="module")
def browser_page(tmp_path_factory):
    exe = _chromium()
    if exe is None:
        pytest.skip("no chromium on PATH (Debian: apt-get install chromium; .ci/run installs it when it can)")
    tmp = tmp_path_factory.mktemp("browser")
    job = holmes.read_job(FIXTURE)
    report = holmes.localize(job)
    page = tmp / "report.html"
    write_html(report, page, job=job)
    dt = _DevTools(exe, tmp / "profile")
    try:
        target = dt.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        sid = dt.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Page", "Network"):
            dt.call(f"{domain}.enable", session=sid)
        dt.call("Emulation.setDeviceMetricsOverride", {"width": 1280, "height": 900, "deviceScaleFactor": 1,
                                                        "mobile": False}, session=sid)
        dt.call("Page.navigate", {"url": page.as_uri()}, session=sid)
        dt.wait_event("Page.loadEventFired")
        got = dt.call("Runtime.evaluate", {"expression": _CHECKS, "awaitPromise": True, "returnByValue": True},
                      session=sid)
        if "exceptionDetails" in got:
            raise AssertionError(f"the checks threw: {got['exceptionDetails']}")
        checks = json.loads(got["result"]["value"])
        shot = dt.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, session=sid)
        BUILD.mkdir(exist_ok=True)
        png = base64.b64decode(shot["data"])
        (BUILD / "report.png").write_bytes(png)
        events = list(dt.events)
    finally:
        dt.close()
    return report, checks, events, png


def test_no_console_error_and_no_network(browser_page):
    _, _, events, _ = browser_page
    errors = [e for e in events if e.get("method") == "Runtime.exceptionThrown"
              or (e.get("method") == "Runtime.consoleAPICalled" and e["params"].get("type") in ("error", "assert"))
              or (e.get("method") == "Log.entryAdded" and e["params"]["entry"].get("level") == "error")]
    assert errors == []
    fetched = [e["params"]["request"]["url"] for e in events if e.get("method") == "Network.requestWillBeSent"]
    assert [u for u in fetched if not u.startswith(("file:", "data:", "about:"))] == []


def test_verdict_and_devices_in_the_dom(browser_page):
    report, checks, _, _ = browser_page
    assert checks["verdict"] == report.verdict == "culprit"
    assert "gpu:21" in checks["verdictText"]
    assert checks["devices"] == [d.id for d in report.devices]


def test_heatmap_rendered(browser_page):
    report, checks, _, _ = browser_page
    assert checks["heatmapImages"] == 1
    w, h = checks["heatmapBox"]
    assert w > 300 and h > 200
    assert checks["pixels"] == 64 * len(report.window)  # one pixel per rank and iteration
    assert 0 < checks["coloured"] < checks["pixels"]    # not blank, not all slow
    assert checks["irrMarks"] == len(set(report.irregular_iterations) & set(report.window))
    assert checks["rankLabels"] == ["gpu:21"]


def test_series_rendered(browser_page):
    report, checks, _, _ = browser_page
    assert checks["seriesLine"] == 1 and checks["thresholds"] == 1
    assert checks["seriesPoints"] == len(report.irregular_iterations)


def test_path_graph_rendered(browser_page):
    report, checks, _, _ = browser_page
    paths = cause_paths(report.root_causes, {d.id for d in report.devices})
    expected = {(a, b) for p in paths for (a, _), (b, _) in zip(p, p[1:]) if a != b}
    assert {(a, b) for a, b, _ in checks["edges"]} == expected
    assert all(length > 10 for _, _, length in checks["edges"])  # drawn, not degenerate
    assert checks["nodes"] == 64 and checks["culprits"] == [21]
    w, h = checks["pathBox"]
    assert w > 200 and h > 100


def test_topology_and_impact(browser_page):
    report, checks, _, _ = browser_page
    assert "gpu:21" in checks["topoNamed"]
    assert checks["impactBars"] == [d.id for d in report.all_devices if d.impact_pct is not None][:12]


def test_screenshot_kept(browser_page):
    _, _, _, png = browser_page
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert (BUILD / "report.png").stat().st_size == len(png) > 20_000
