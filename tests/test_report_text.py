"""The text report (issue #19, item 5): durations against the usual, seq of each cause, repeated
causes folded with a count, ``--all``, the time each device costs, the largest stretch when nothing
is irregular, missing ranks first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import holmes
from holmes._ranges import parse_int_ranges
from holmes.cli.main import main
from holmes.localize.evidence.search import RootCause
from holmes.localize.report import DeviceScore, Report
from holmes.localize.report_text import fmt_ns, int_ranges

FIX = Path(__file__).resolve().parents[1] / "fixtures"
MS = 1_000_000


def _cause(it: int, seq: int, rank: int = 21, comm: str = "tp-5", gap_ms: float = 3.0) -> RootCause:
    op = {"rank": rank, "iteration": it, "op_index": 4, "op": "reduce_scatter", "comm_id": comm, "seq": seq,
          "duration_ns": 5 * MS}
    step = dict(op, gap_excess_ns=int(gap_ms * MS))
    return RootCause(it, "compute", (rank,), rank, 0, op, [{"op": "reduce_scatter", "rank": 0}, step], rate=0.98)


def _report(**kw) -> Report:
    durs = {i: 100 * MS for i in range(20)}
    durs.update({8: 120 * MS, 9: 118 * MS, 10: 125 * MS, 15: 111 * MS})
    base = dict(devices=[DeviceScore("gpu:21", "gpu", 1.0, confidence=1.0, causes=5)], verdict="culprit",
                world_size=64, fetched=list(range(10)), window=list(range(20)), pivots=[0],
                irregular_iterations=[8, 9, 10, 15], iteration_ns=durs, usual_iteration_ns=100 * MS,
                root_causes=[_cause(8, 40), _cause(9, 45), _cause(10, 50), _cause(10, 51, comm="tp-5"),
                             _cause(15, 75, rank=3, comm="dp-0")],
                device_cost={"gpu:21": {"excess_ns": 63 * MS, "iterations": 3}}, params={"delta": 1.1})
    base.update(kw)
    return Report(**base)


def test_repeated_causes_fold_into_one_line_with_count_seq_and_stretch():
    text = _report().to_text()
    lines = text.splitlines()
    folded = [ln for ln in lines if "4x compute on rank(s) 21" in ln]
    assert len(folded) == 1, text
    line = folded[0]
    assert "seq 40-51" in line and "iteration(s) 8-10" in line
    assert "118.0-125.0 ms" in line and "1.18-1.25x the usual" in line and "+18.0 to +25.0 ms" in line
    assert "+3.0 ms compute before it" in line
    assert sum("1x compute on rank(s) 3" in ln and "seq 75" in ln for ln in lines) == 1
    assert "Root causes (5 in 4 iteration(s), 2 distinct" in text


def test_all_lists_every_cause_with_its_iteration_duration():
    text = _report().to_text(show_all=True)
    each = [ln for ln in text.splitlines() if ln.startswith("  iter ")]
    assert len(each) == 5
    assert each[0].startswith("  iter 8 (120.0 ms, 1.20x the usual (+20.0 ms))") and "seq 40" in each[0]


def test_folded_lines_are_capped_and_all_lifts_the_cap():
    causes = [_cause(i, i, rank=i, comm=f"tp-{i}") for i in range(15)]
    r = _report(root_causes=causes)
    assert "... 5 more distinct cause(s) (--all lists each)" in r.to_text()
    assert sum(ln.startswith("  iter ") for ln in r.to_text(show_all=True).splitlines()) == 15


def test_device_cost_and_usual_iteration():
    text = _report().to_text()
    assert "Iterations (pivot rank 0): usual 100.0 ms; the irregular ones took 111.0-125.0 ms" in text
    assert "costs 63.0 ms over 3 irregular iteration(s) (21.0 ms each, 21.0% of the usual step)" in text


def test_missing_ranks_come_first_with_their_reasons():
    r = _report(missing={7: "ranks/rank-00007.parquet: file not found", 3: "ranks/rank-00003.parquet: not parquet"})
    lines = r.to_text().splitlines()
    assert lines[1] == "Missing or unreadable ranks (2): 3,7"
    assert lines[2] == "  rank 3: ranks/rank-00003.parquet: not parquet"
    assert lines.index(next(ln for ln in lines if ln.startswith("Verdict"))) > 3


def test_healthy_report_says_the_largest_stretch_and_the_delta_it_would_take():
    durs = {i: 100 * MS for i in range(30)}
    durs[12] = 102 * MS
    r = Report(verdict="healthy", world_size=8192, window=list(range(30)), pivots=[0], iteration_ns=durs,
               usual_iteration_ns=100 * MS, params={"delta": 1.1})
    text = r.to_text()
    assert "No anomalous device found: no iteration was irregular." in text
    assert ("The longest iteration, 12, took 102.0 ms: 1.020x the usual 100.0 ms (+2.0%); it would take "
            "--delta below 1.020 to flag it, now 1.1.") in text


def test_healthy_with_irregular_iterations_within_noise():
    r = _report(verdict="healthy", devices=[], root_causes=[], device_cost={})
    text = r.to_text()
    assert "4 iteration(s) were above delta 1.1 but within the job's own noise" in text
    assert "The longest iteration, 10, took 125.0 ms: 1.250x the usual" in text and "--delta below" not in text


def test_a_bare_report_still_renders():
    assert "Verdict: healthy" in Report().to_text()
    assert Report(devices=[DeviceScore("gpu:1", "gpu", 1.0)], verdict="culprit").to_text().count("gpu:1") == 1


@given(st.lists(st.integers(0, 500), max_size=40))
def test_int_ranges_round_trips(values):
    text = int_ranges(values, limit=10**6)
    assert (parse_int_ranges(text, lo=0) if text else []) == sorted(set(values))


@pytest.mark.parametrize("ns,text", [(0, "0.00 ms"), (450_000, "0.45 ms"), (12_345_678, "12.3 ms"), (2.5e9, "2.50 s")])
def test_fmt_ns(ns, text):
    assert fmt_ns(ns) == text


def test_fixture_report_folds_and_costs():
    r = holmes.localize(FIX / "gpu64-3d-slow-gpu")
    assert r.top.id == "gpu:21"
    cost = r.device_cost["gpu:21"]
    usual = r.usual_iteration_ns
    expected = sum(max(r.iteration_ns[i] - usual, 0) for i in {c.iteration for c in r.root_causes})
    assert cost["iterations"] == len({c.iteration for c in r.root_causes})
    assert cost["excess_ns"] == pytest.approx(expected)
    js = r.to_json()
    assert js["timing"]["device_cost"]["gpu:21"]["iterations"] == cost["iterations"]
    assert set(js) >= {"verdict", "devices", "root_causes", "irregular_iterations", "fetched_ranks", "world_size",
                       "assumptions", "slowdown", "hang"}
    text = r.to_text()
    groups = [ln for ln in text.splitlines() if "x compute on rank(s) 21" in ln]
    assert groups and sum(int(ln.split("x", 1)[0]) for ln in groups) == sum(c.ranks == (21,) for c in r.root_causes)


def test_cli_all_and_healthy_text(capsys):
    assert main(["localize", str(FIX / "gpu16-clean")]) == 0
    out = capsys.readouterr().out
    assert "The longest iteration" in out and "--delta below" in out
    assert main(["localize", str(FIX / "gpu64-3d-slow-gpu"), "--all", "--analysis", "irregular"]) == 0
    out = capsys.readouterr().out
    r = holmes.localize(FIX / "gpu64-3d-slow-gpu", analysis="irregular")
    assert sum(ln.startswith("  iter ") for ln in out.splitlines()) == len(r.root_causes)
    assert main(["localize", str(FIX / "gpu64-3d-slow-gpu"), "--format", "json", "--all"]) == 0
    assert json.loads(capsys.readouterr().out)["devices"][0]["id"] == "gpu:21"


def test_a_non_device_cause_beside_named_devices_does_not_say_no_device_explains():
    nd = {"kind": "pipeline_stage_imbalance", "stage": 2, "stage_slowdown": 1.15, "slowdown": 1.17}
    text = _report(non_device_cause=nd).to_text()
    assert "Also measured: pipeline stage imbalance (stage 2)" in text and "no device explains" not in text
    alone = _report(non_device_cause=nd, devices=[], verdict="inconclusive").to_text()
    assert "Non-device cause: pipeline stage imbalance (stage 2); no device explains the slowdown" in alone


def test_alike_devices_are_said_once_with_the_group_confidence():
    group = ("nic:9", "link:nic:7|switch:leaf-3")
    devs = [DeviceScore("nic:7", "nic", 0.3, confidence=0.99, alike=group),
            DeviceScore("nic:9", "nic", 0.3, confidence=0.99, alike=("nic:7", "link:nic:7|switch:leaf-3"))]
    text = _report(devices=devs).to_text()
    assert text.count("cannot tell") == 1
    assert "the logs cannot tell nic:7 apart from nic:9, link:nic:7|switch:leaf-3" in text
    assert _report(devices=devs).to_json()["devices"][0]["alike"] == list(group)
