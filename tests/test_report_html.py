"""The HTML report (issue #19): page content, the heatmap's data, bounded reads, the CLI.

What a browser makes of the page is checked in ``test_report_browser.py``.
"""

from __future__ import annotations

import re
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import holmes
from holmes.cli.main import main
from holmes.io import MemoryJob
from holmes.io.schema import ops_table
from holmes.localize.report import DeviceScore, Report
from holmes.report import rank_order, render_html, slowness_map, write_html
from holmes.report.heatmap import SlownessMap
from holmes.report.svg import png_bytes
from holmes.topology import ParallelLayout

ROOT = Path(__file__).resolve().parents[1]
SLOW_GPU = ROOT / "fixtures" / "gpu64-3d-slow-gpu"
CLEAN = ROOT / "fixtures" / "gpu16-clean"


@pytest.fixture(scope="module")
def slow():
    job = holmes.read_job(SLOW_GPU)
    report = holmes.localize(job, full_read=0)  # Algorithm 1: the path graph draws its search paths
    return job, report, render_html(report, job=job)


def _count(page: str, pattern: str) -> int:
    return len(re.findall(pattern, page))


def test_page_is_self_contained(slow):
    _, _, page = slow
    assert page.startswith("<!DOCTYPE html>")
    # nothing fetched: no external script, style sheet, image or font; the CSP forbids any fetch
    assert not re.search(r"<(script|img|link|iframe)[^>]*\s(src|href)=\"(?!data:)", page)
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "") and "https://" not in page
    assert "default-src 'none'" in page
    assert len(page) < 1_000_000


def test_summary_names_the_slow_gpu(slow):
    _, report, page = slow
    assert report.verdict == "culprit" and report.top.id == "gpu:21"
    assert 'data-verdict="culprit"' in page
    rows = re.findall(r'<tr data-device="([^"]+)">', page.split('id="devices"')[1].split("</table>")[0])
    assert rows == [d.id for d in report.devices]


def test_heatmap_marks_irregular_iterations_and_the_culprit(slow):
    _, report, page = slow
    heat = page.split('id="heatmap"')[1].split("</svg>")[0]
    assert _count(heat, 'class="irr-mark"') == len(set(report.irregular_iterations) & set(report.window))
    assert re.findall(r'class="rank-label" data-rank="(\d+)"', heat) == ["21"]
    assert _count(heat, 'class="cells"') == 1


def test_slowness_map_finds_the_slow_gpu(slow):
    job, report, _ = slow
    m = slowness_map(job, iterations=report.window)
    assert m.values.shape == (64, len(report.window)) and m.read == 64
    # rows follow the parallel groups: stages in order, each stage's 16 ranks together
    assert m.stage.tolist() == sorted(m.stage.tolist()) and np.bincount(m.stage).tolist() == [16] * 4
    row = int(np.flatnonzero(m.ranks == 21)[0])
    slow_its = [i for i in report.irregular_iterations if i >= 8]
    cols = np.isin(m.iterations, slow_its)
    others = np.delete(m.values[:, cols], row, axis=0)
    # the slow GPU computes longer than all its peers in the iterations it made irregular
    assert np.nanmin(m.values[row, cols]) > 1.2 > np.nanmax(np.nanmedian(others, axis=0))


def test_reads_are_bounded_and_the_focus_comes_first(slow):
    job, _, _ = slow
    m = slowness_map(job, max_ranks=10, focus=[21, 20, 5])
    assert m.read == 10 and {21, 20, 5} <= set(m.ranks.tolist())
    order, _ = rank_order(64, job.layout)
    pos = {int(r): i for i, r in enumerate(order)}
    assert [pos[r] for r in m.ranks.tolist()] == sorted(pos[r] for r in m.ranks.tolist())
    with pytest.raises(ValueError, match="max_ranks"):
        slowness_map(job, max_ranks=0)


def test_path_graph_follows_the_search(slow):
    _, report, page = slow
    graph = page.split('id="path-graph"')[1].split("</svg>")[0]
    edges = set(re.findall(r'data-from="(\d+)" data-to="(\d+)"', graph))
    # the fixture's causes go 0 -> 4 (dp) -> 20 (pp) -> 21 (tp) (and, in the iterations after the
    # fault's step, also 0 -> 1 -> 5 -> 21): every path from the pivot ends at the slow GPU
    assert {("0", "4"), ("4", "20"), ("20", "21")} <= edges
    sources, sinks = {a for a, _ in edges}, {b for _, b in edges}
    assert sources - sinks == {"0"} and sinks - sources == {"21"}, edges
    assert re.findall(r'class="node on-path culprit" data-rank="(\d+)"', graph) == ["21"]
    assert _count(graph, 'class="group"') == 16  # 4 stages x 4 replicas of tensor-parallel groups


def test_impact_bars():
    devs = [DeviceScore("gpu:3", "gpu", 0.7, impact_pct=12.5), DeviceScore("nic:3", "nic", 0.2),
            DeviceScore("host:0", "host", 0.1, impact_pct=1.5)]
    page = render_html(Report(devices=devs[:1], all_devices=devs, world_size=8, verdict="culprit"))
    impact = page.split('id="impact"')[1].split("</svg>")[0]
    assert re.findall(r'class="bar" data-device="([^"]+)"', impact) == ["gpu:3", "host:0"]
    assert "12.5%" in impact


def test_cluster(slow):
    _, report, page = slow
    topo = page.split('id="topology"')[1].split("</svg>")[0]
    assert re.findall(r'class="gpu named"[^>]*data-device="([^"]+)"', topo) == ["gpu:21"]
    assert _count(topo, 'class="host') == 8


def test_healthy_job_has_no_path_and_no_named_device():
    job = holmes.read_job(CLEAN)
    report = holmes.localize(job)
    page = report.to_html(job=job)
    assert report.verdict == "healthy" and 'data-verdict="healthy"' in page
    assert 'id="path-graph"' not in page and "No traced path" in page
    assert 'class="gpu named"' not in page and 'class="irr-mark"' not in page


def test_without_the_job_the_page_says_what_is_missing(slow):
    _, report, _ = slow
    page = report.to_html()
    assert 'id="heatmap"' not in page and "Pass the job" in page
    assert 'id="path-graph"' in page  # the paths come from the report itself
    assert "default rail-optimized cluster" in page


def _log(r: int, states: list[str], comm: str = "dp-0"):
    n = len(states)
    return ops_table(rank=[r] * n, iteration=list(range(n)), op_index=[0] * n, comm_id=[comm] * n,
                     seq=list(range(n)), op=["all_reduce"] * n, peer=[None] * n, nbytes=[8] * n,
                     start_ns=[10 * i for i in range(n)],
                     end_ns=[10 * i + 5 if s == "completed" else None for i, s in enumerate(states)], state=states)


def test_hang_table():
    meta = {"world_size": 3, "communicators": {"dp-0": {"kind": "dp", "ranks": [0, 1, 2]}}}
    c, s = "completed", "started"
    job = MemoryJob(meta, {0: _log(0, [c, c, s]), 1: _log(1, [c, c, s])})
    report = holmes.localize(job, analysis="hang")
    assert report.verdict == "hang"
    page = render_html(report, job=job)  # the in-flight ops and the rank without a log do not break it
    table = page.split('id="hang-table"')[1].split("</table>")[0]
    assert _count(table, "<tr><td>") == len(report.hang["communicators"]) == 1
    assert "<td>2</td>" in table  # rank 2 never arrived
    assert 'data-verdict="hang"' in page


def test_inconclusive_shows_candidates():
    r = Report(candidates=[DeviceScore("switch:leaf-1", "switch", 0.6, confidence=0.5)], world_size=16,
               verdict="inconclusive", all_devices=[DeviceScore("switch:leaf-1", "switch", 0.6, confidence=0.5)])
    page = render_html(r)
    assert "Candidates" in page and 'data-device="switch:leaf-1"' in page
    assert re.search(r'class="switch candidate" data-device="switch:leaf-1"', page)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4), st.sampled_from(["tp-dp-pp", "tp-pp-dp", "dp-tp-pp"]))
def test_rank_order_groups_stages_and_tensor_groups(tp, pp, dp, order):
    lay = ParallelLayout(tp=tp, pp=pp, dp=dp, order=order)
    ranks, stage = rank_order(lay.world_size, lay)
    assert sorted(ranks.tolist()) == list(range(lay.world_size))
    assert stage.tolist() == sorted(stage.tolist())
    assert all(stage[i] == lay.coords(int(r))["pp"] for i, r in enumerate(ranks))
    pos = {int(r): i for i, r in enumerate(ranks)}
    for g in lay.groups("tp"):  # a tensor-parallel group is one contiguous run of rows
        rows = sorted(pos[r] for r in g)
        assert rows == list(range(rows[0], rows[0] + len(g)))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 60), st.integers(1, 7), st.integers(1, 20), st.integers(0, 3))
def test_binning_keeps_the_maximum_and_the_stages(rows, cols, max_rows, seed):
    rng = np.random.default_rng(seed)
    vals = rng.uniform(0.5, 2.0, (rows, cols))
    vals[rng.random((rows, cols)) < 0.2] = np.nan
    stage = np.sort(rng.integers(0, 3, rows))
    m = SlownessMap(np.arange(rows), np.arange(rows), stage, np.arange(cols), vals, rows, rows)
    b = m.binned(max_rows)
    assert len(b.ranks) <= max(max_rows, len(np.unique(stage)) + max_rows)
    assert b.ranks[0] == 0 and b.last[-1] == rows - 1 and np.all(b.ranks[1:] == b.last[:-1] + 1)
    assert all(len(set(stage[a:z + 1].tolist())) == 1 for a, z in zip(b.ranks, b.last))
    for a, z, row in zip(b.ranks, b.last, b.values):
        block = vals[a:z + 1]
        want = np.where(np.all(np.isnan(block), axis=0), np.nan, np.nanmax(np.where(np.isnan(block), -np.inf, block), 0))
        np.testing.assert_array_equal(row, want)


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 9), st.integers(1, 9), st.integers(0, 255))
def test_png_encodes_the_pixels(h, w, fill):
    rgb = np.full((h, w, 3), fill, np.uint8)
    rgb[0, 0] = (1, 2, 3)
    data = png_bytes(rgb)
    assert struct.unpack(">II", data[16:24]) == (w, h)
    n = struct.unpack(">I", data[33:37])[0]
    raw = np.frombuffer(zlib.decompress(data[41:41 + n]), np.uint8).reshape(h, 1 + 3 * w)
    assert (raw[:, 0] == 0).all() and np.array_equal(raw[:, 1:].reshape(h, w, 3), rgb)


def test_cli_writes_the_page_and_refuses_to_overwrite(tmp_path, capsys):
    out = tmp_path / "report.html"
    assert main(["report", str(SLOW_GPU), "-o", str(out), "--analysis", "irregular", "--max-ranks", "16"]) == 0
    page = out.read_text()
    assert 'data-verdict="culprit"' in page and "16 of 64 ranks read" in page
    assert capsys.readouterr().out.strip() == str(out)
    before = out.read_bytes()
    assert main(["report", str(SLOW_GPU), "-o", str(out)]) == 2
    assert "exists" in capsys.readouterr().err and out.read_bytes() == before
    assert main(["report", str(SLOW_GPU), "-o", str(SLOW_GPU / "r.html")]) == 2
    assert not (SLOW_GPU / "r.html").exists()
    assert main(["report", str(SLOW_GPU), "-o", str(out), "--overwrite", "--max-ranks", "0"]) == 2
    assert main(["report", str(tmp_path / "nojob"), "-o", str(tmp_path / "x.html")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("holmes report: ") for line in err)
    assert "inside" in err[0] and "max-ranks" in err[1] and "not a job directory" in err[2]


def test_write_html_refuses_the_job_directory(slow, tmp_path):
    job, report, _ = slow
    with pytest.raises(holmes.ConfigError, match="inside"):
        write_html(report, SLOW_GPU / "r.html", job=job)
    p = write_html(report, tmp_path / "r.html", job=job, max_ranks=8)
    assert p.read_text().count('class="irr-mark"') == len(set(report.irregular_iterations) & set(report.window))


def test_a_named_nic_is_labelled_on_its_rank_row(slow):
    job, _, _ = slow
    r = Report(devices=[DeviceScore("nic:5", "nic", 1.0, confidence=0.99)], world_size=64, verdict="culprit",
               window=list(range(24)), irregular_iterations=[9])
    heat = render_html(r, job=job, max_ranks=8).split('id="heatmap"')[1].split("</svg>")[0]
    assert re.findall(r'data-rank="(\d+)">([^<]+)<', heat) == [("5", "nic:5")]
    assert _count(heat, 'class="irr-mark"') == 1
