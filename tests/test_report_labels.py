"""The HTML figures' text labels never overlap, on a one-host job and a large one (issue #37).

Boxes are estimated from the page's fonts (system-ui, 0.62 em per character, 0.66 bold: an upper
bound for digits and lowercase), so this runs without a browser."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

import holmes
from holmes.localize.report import DeviceScore, Report
from holmes.report.html import render_html

FIX = Path(__file__).resolve().parents[1] / "fixtures"
SIZE = {"axis": 12.0, "sw-label": 10.0, "node-label": 9.0}


def _boxes(svg: str) -> list[tuple[str, float, float, float, float]]:
    out = []
    for attrs, text in re.findall(r"<text([^>]*)>([^<]*)</text>", svg):
        a = dict(re.findall(r'([\w-]+)="([^"]*)"', attrs))
        if "x" not in a or "y" not in a or "transform" in a:
            continue
        cls = a.get("class", "").split()
        size = next((SIZE[c] for c in cls if c in SIZE), 11.0)
        t = html.unescape(text)
        w = len(t) * size * (0.66 if "rank-label" in cls else 0.62)
        x, y = float(a["x"]), float(a["y"])
        anchor = a.get("text-anchor", "start")
        x0 = x - w / 2 if anchor == "middle" else x - w if anchor == "end" else x
        out.append((t, x0, y - 0.8 * size, x0 + w, y + 0.2 * size))
    return out


def _overlaps(svg: str) -> list[tuple[str, str]]:
    b = _boxes(svg)
    return [(p[0], q[0]) for i, p in enumerate(b) for q in b[i + 1:]
            if p[1] < q[3] and q[1] < p[3] and p[2] < q[4] and q[2] < p[4]]


def _figure(page: str, fid: str) -> str:
    return page.split(f'id="{fid}"')[1].split("</svg>")[0]


def _small_page(tmp_path) -> tuple[str, Report]:
    from holmes.simulate import simulate

    job = simulate(tmp_path / "job", tp=2, pp=1, dp=4, iterations=16, seed=2, faults=["gpu:5@persistent*3"])
    report = holmes.localize(job)
    return render_html(report, job=holmes.read_job(job)), report


def test_one_host_job_labels_do_not_overlap(tmp_path):
    page, report = _small_page(tmp_path)
    assert report.verdict == "culprit" and report.devices[0].id == "gpu:5"
    heat = _figure(page, "heatmap")
    assert _overlaps(heat) == []
    # every row is named by its rank, the culprit's label beside its row
    assert sorted(int(x) for x in re.findall(r'data-row="(\d+)"', heat)) == list(range(8))
    assert 'data-rank="5">gpu:5<' in heat
    topo = _figure(page, "topology")
    assert _overlaps(topo) == []
    # one host: no switch carries its traffic, none drawn
    assert 'class="switch' not in topo and "one host: no switch carries its traffic" in topo


def test_label_column_keeps_the_legend_clear():
    r = Report(devices=[DeviceScore("gpu:1", "gpu", 1.0, confidence=0.99)], verdict="culprit", world_size=16,
               window=list(range(20)), irregular_iterations=[4])
    path = FIX / "gpu16-clean"
    if not (path / "job.json").is_file():
        pytest.skip("fixture gpu16-clean not present")
    heat = _figure(render_html(r, job=holmes.read_job(path)), "heatmap")
    assert _overlaps(heat) == []
    assert "compute / peers" in heat and 'data-rank="1">gpu:1<' in heat


def test_large_job_labels_do_not_overlap():
    path = FIX / "gpu128-4d-slow-leaf"
    if not (path / "job.json").is_file():
        pytest.skip("fixture gpu128-4d-slow-leaf not present")
    job = holmes.read_job(path)
    page = render_html(holmes.localize(job), job=job)
    for fid in ("heatmap", "topology"):
        assert _overlaps(_figure(page, fid)) == [], fid
