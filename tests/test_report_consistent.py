"""The text report says nothing that contradicts itself (issue #37): devices in the order of the
figures shown, signed ranges, iterations no longer than the usual not called longer, no detector
assumption where no operator label was used, a hang-only analysis of a job that did not hang."""

from __future__ import annotations

from pathlib import Path

import pytest

import holmes
from holmes.cli.main import main
from holmes.localize.evidence.search import RootCause
from holmes.localize.report import DeviceScore, Report
from holmes.localize.report_text import device_figures, signed_span

FIX = Path(__file__).resolve().parents[1] / "fixtures"
MS = 1_000_000


def _cause(it: int, gap_ms: float) -> RootCause:
    op = {"rank": 3, "iteration": it, "op_index": 1, "op": "all_reduce", "comm_id": "dp-0", "seq": it,
          "duration_ns": 5 * MS}
    return RootCause(it, "compute", (3,), 3, 0, op, [{"op": "all_reduce", "rank": 0},
                                                     dict(op, gap_excess_ns=int(gap_ms * MS))], rate=0.9)


def _report(**kw) -> Report:
    durs = {i: 100 * MS for i in range(20)}
    durs.update({5: 98 * MS, 8: 116.9 * MS, 9: 112 * MS})
    base = dict(devices=[DeviceScore("gpu:3", "gpu", 0.2, confidence=0.99, coverage=0.9, causes=3),
                         DeviceScore("gpu:4", "gpu", 0.7, confidence=0.99, coverage=0.4, causes=2)],
                verdict="culprit", world_size=8, fetched=list(range(8)), window=list(range(20)), pivots=[0],
                irregular_iterations=[5, 8, 9], iteration_ns=durs, usual_iteration_ns=100 * MS,
                root_causes=[_cause(5, -1.04), _cause(8, 16.9), _cause(9, 12.0)], params={"delta": 1.1})
    base.update(kw)
    return Report(**base)


def test_devices_show_the_figures_they_are_ordered_by():
    text = _report().to_text()
    first, second = (ln for ln in text.splitlines() if ln.startswith(("  1.", "  2.")))
    assert "gpu:3" in first and "coverage 90%" in first and "gpu:4" in second and "coverage 40%" in second
    # the order is read off the line: confidence first, then coverage, score last
    assert first.index("confidence") < first.index("coverage") < first.index("score")
    assert "by confidence, then coverage" in text
    assert device_figures(DeviceScore("nic:1", "nic", 0.5)) == "no confidence  score 0.500"


def test_ranges_of_differences_carry_each_sign():
    text = _report().to_text()
    assert "+-" not in text and "-1.0 to +16.9 ms compute before it" in text
    assert signed_span(-2 * MS, -1 * MS) == "-2.0 to -1.0 ms"


def test_an_iteration_under_the_usual_is_not_called_longer():
    text = _report().to_text()
    head = next(ln for ln in text.splitlines() if ln.startswith("Iterations"))
    assert "1.12-1.17x the usual (+12.0 to +16.9 ms)" in head and "0.98" not in head
    assert "1 more flagged iteration(s) (5) are not longer than the usual on this pivot (0.98x)" in text


def test_hang_analysis_of_a_job_that_did_not_hang():
    path = FIX / "gpu16-clean"
    if not (path / "job.json").is_file():
        pytest.skip("fixture gpu16-clean not present")
    text = holmes.localize(path, analysis="hang").to_text()
    assert "the job did not hang" in text and "nothing irregular to explain" not in text


def test_no_detector_assumption_where_no_operator_label_was_used(tmp_path, capsys):
    from holmes.simulate import simulate

    job = simulate(tmp_path / "job", tp=2, pp=2, dp=2, iterations=20, seed=3, faults=["gpu:5@persistent*3"])
    r = holmes.localize(job, analysis="irregular")
    assert any("read whole" in a for a in r.assumptions)  # 8 ranks: compared cell by cell, no labels
    assert not any("abnormal operators flagged by" in a for a in r.assumptions)
    # the search from the pivot (a job above full_read) does use the detector's flags, and says so
    r = holmes.localize(job, analysis="irregular", full_read=0, detector="robust")
    assert r.irregular_iterations
    assert any("abnormal operators flagged by RobustDetector" in a for a in r.assumptions)
    assert not any("abnormal operators flagged by" in a for a in holmes.localize(job, analysis="hang").assumptions)
