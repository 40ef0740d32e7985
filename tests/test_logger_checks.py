"""Capture checks: job.json says what looks missing from a captured job, and the report repeats it."""

from __future__ import annotations

import json

import holmes
from holmes.logger import CommOpsRecorder, finalize_job


def _capture(tmp_path, skip=lambda r, it: False, p2p_skip=lambda r, it: False, iters=8, world=4):
    """A dp all_reduce per step on 4 ranks, plus a ring of send/recv; ``skip`` drops a rank's
    collective in an iteration, ``p2p_skip`` its receive."""
    out = tmp_path / "job"
    for r in range(world):
        rec = CommOpsRecorder(out, rank=r, world_size=world)
        rec.add_communicator("dp-0", range(world), kind="dp")
        rec.add_communicator("pp-0", range(world), kind="pp")
        for it in range(iters):
            rec.step(it)
            t = 1_000_000 * it
            if not skip(r, it):
                rec.record("dp-0", "all_reduce", nbytes=8, start_ns=t, end_ns=t + 10)
            rec.record("pp-0", "send", peer=(r + 1) % world, nbytes=8, start_ns=t + 20, end_ns=t + 30)
            if not p2p_skip(r, it):
                rec.record("pp-0", "recv", peer=(r - 1) % world, nbytes=8, start_ns=t + 20, end_ns=t + 30)
        rec.close()
    finalize_job(out)
    return out, json.loads((out / "job.json").read_text())["source"]["warnings"]


def test_a_complete_capture_has_no_warning(tmp_path):
    _, warnings = _capture(tmp_path)
    assert warnings == []


def test_a_rank_silent_in_some_steps_is_a_warning_in_job_json_and_in_the_report(tmp_path):
    out, warnings = _capture(tmp_path, skip=lambda r, it: r == 2 and it >= 5,
                             p2p_skip=lambda r, it: r == 2 and it >= 5)
    # rank 2 logs only its sends after step 5: still some operator, but its collectives are missing
    assert any("communicator dp-0" in w and "3 iteration(s)" in w and "rank 2: 0" in w for w in warnings), warnings
    assert any("rank 1 -> rank 2" in w for w in warnings), warnings
    report = holmes.localize(out).to_json()
    assert any(a.startswith("capture: communicator dp-0") for a in report["assumptions"])


def test_a_rank_with_no_operator_in_a_step_is_named(tmp_path):
    out = tmp_path / "job"
    for r in range(2):
        rec = CommOpsRecorder(out, rank=r, world_size=2)
        rec.add_communicator("dp-0", [0, 1], kind="dp")
        for it in range(8):
            rec.step(it)
            if not (r == 1 and it in (4, 5)):
                rec.record("dp-0", "all_reduce", nbytes=8, start_ns=100 * it, end_ns=100 * it + 5)
        rec.close()
    finalize_job(out)
    warnings = json.loads((out / "job.json").read_text())["source"]["warnings"]
    assert "rank 1 logged no operator in 2 marked step(s) after the first 2 (iteration 4-5)" in warnings


def test_a_job_with_no_row_at_all_says_so(tmp_path):
    out, warnings = _capture(tmp_path, skip=lambda r, it: True, p2p_skip=lambda r, it: True, iters=0)
    assert len(warnings) == 1 and warnings[0].startswith("no rank logged any communication operator")
