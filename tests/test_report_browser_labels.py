"""In headless Chromium, no two text labels of the HTML figures overlap, on a one-host job and a large
one (issue #37); the boxes are the browser's own (``getBoundingClientRect``). Skipped without Chromium."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import holmes
from holmes.report import write_html

from test_report_browser import _chromium, _DevTools

FIX = Path(__file__).resolve().parents[1] / "fixtures"

_OVERLAPS = """
JSON.stringify(['heatmap', 'topology', 'path-graph', 'series'].map(id => {
  const svg = document.getElementById(id);
  if (!svg) return [id, 0, []];
  const boxes = Array.from(svg.querySelectorAll('text')).map(t => [t.textContent, t.getBoundingClientRect()])
    .filter(([s, r]) => r.width > 0 && r.height > 0);
  const hits = [];
  for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
    const a = boxes[i][1], b = boxes[j][1], e = 0.5;
    if (a.left < b.right - e && b.left < a.right - e && a.top < b.bottom - e && b.top < a.bottom - e)
      hits.push([boxes[i][0], boxes[j][0]]);
  }
  return [id, boxes.length, hits];
}))
"""


def _overlaps(page: Path, tmp: Path) -> dict[str, tuple[int, list]]:
    exe = _chromium()
    if exe is None:
        pytest.skip("no chromium on PATH (Debian: apt-get install chromium; .ci/run installs it when it can)")
    dt = _DevTools(exe, tmp / "profile")
    try:
        target = dt.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        sid = dt.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        dt.call("Page.enable", session=sid)
        dt.call("Emulation.setDeviceMetricsOverride", {"width": 1280, "height": 900, "deviceScaleFactor": 1,
                                                        "mobile": False}, session=sid)
        dt.call("Page.navigate", {"url": page.as_uri()}, session=sid)
        dt.wait_event("Page.loadEventFired")
        got = dt.call("Runtime.evaluate", {"expression": _OVERLAPS, "returnByValue": True}, session=sid)
    finally:
        dt.close()
    return {fid: (n, hits) for fid, n, hits in json.loads(got["result"]["value"])}


def test_one_host_job(tmp_path):
    from holmes.simulate import simulate

    job = holmes.read_job(simulate(tmp_path / "job", tp=2, pp=1, dp=4, iterations=16, seed=2,
                                   faults=["gpu:5@persistent*3"]))
    page = write_html(holmes.localize(job), tmp_path / "small.html", job=job)
    got = _overlaps(page, tmp_path)
    assert got["heatmap"][0] >= 8 + 3  # the 8 rows' labels, the legend
    assert all(hits == [] for _, hits in got.values()), got


def test_large_job(tmp_path):
    path = FIX / "gpu128-4d-slow-leaf"
    if not (path / "job.json").is_file():
        pytest.skip("fixture gpu128-4d-slow-leaf not present")
    job = holmes.read_job(path)
    page = write_html(holmes.localize(job), tmp_path / "large.html", job=job)
    got = _overlaps(page, tmp_path)
    assert got["topology"][0] > 10
    assert all(hits == [] for _, hits in got.values()), got
