"""Job-wide pauses (holmes.localize.irregular.pauses): a moment in which the whole job stalled at
once names no device; a stall of one host still names the host; a faulty device's stall that a
pause coincided with still counts.

a1054 is a real healthy run whose whole machine stalled in its last iteration (a loaded box); the
other pauses are added to real captured runs (:func:`holmes.eval.perturb.job_wide_pause`). Each
case that the rule must change is checked with the rule off too (``pause_ratio=0``), so the tests
cannot pass vacuously. ``pause_ratio`` itself was chosen on the development split
(``benchmarks/pause_accuracy.py``); these cases only check the mechanism.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import holmes
from holmes.eval.perturb import job_wide_pause, warp_times

FIX = Path(__file__).resolve().parents[1] / "fixtures"
REAL = FIX / "real"
A1054 = FIX / "real-always" / "a1054-healthy-tp2-pp4-dp1"
SAID = "the whole job stalled at once"


@pytest.mark.parametrize("pause", [None, (15, 1)], ids=["as-captured", "a-second-pause"])
def test_a_job_wide_pause_names_no_device_and_says_so(pause):
    job = holmes.read_job(A1054)
    if pause is not None:
        job = job_wide_pause(job, pause[0], seed=pause[1])
    off = holmes.localize(job, pause_ratio=0)
    assert off.verdict == "culprit" and [d.id for d in off.devices] == ["switch:spine-0"]  # what the rule prevents
    rep = holmes.localize(job)
    assert rep.devices == [] and rep.verdict == "inconclusive"
    said = [a for a in rep.assumptions if SAID in a]
    assert len(said) == 1 and said[0].startswith("iteration(s) ") and "24" in said[0].split(":")[0]


def test_a_faulty_links_stall_that_a_pause_coincided_with_still_counts():
    job = job_wide_pause(holmes.read_job(REAL / "r010-p2p-fluctuation-tp2-pp2-dp2-sp-do"), 16, seed=0)
    rep = holmes.localize(job)
    assert rep.verdict == "culprit" and {"nic:3", "nic:7"} <= {d.id for d in rep.devices[:3]}


def test_a_pause_of_one_host_is_the_host_not_a_job_wide_pause():
    job = job_wide_pause(holmes.read_job(REAL / "r065-healthy-tp2-pp4-dp2"), 13, seed=0, hosts=[1])
    rep = holmes.localize(job)
    assert [d.id for d in rep.devices[:1]] == ["host:1"]
    assert not any(SAID in a for a in rep.assumptions)


def test_warp_times_is_monotone_and_keeps_nulls_and_other_columns():
    t = pa.table({"start_ns": pa.array([1_700_000_000_000_000_000 + i * 1000 for i in range(6)], pa.int64()),
                  "peer": pa.array([1, None, 2, None, 3, 4], pa.int32()),
                  "wait_ns": pa.array([None, 5, None, 1_700_000_000_000_004_000, None, None], pa.int64())})
    out = warp_times(t, 1_700_000_000_000_002_000, 2000, 3.0)
    s = out.column("start_ns").to_numpy()
    assert np.all(np.diff(s) > 0) and s[0] == t.column("start_ns")[0].as_py()
    assert s[-1] - t.column("start_ns")[-1].as_py() == 4000  # (3 - 1) x 2000 after the window
    assert out.column("peer").equals(t.column("peer"))
    assert out.column("wait_ns").null_count == 4 and out.column("wait_ns")[1].as_py() == 5
    assert out.schema == t.schema


def test_job_wide_pause_refuses_an_iteration_the_job_lacks():
    with pytest.raises(ValueError, match="no iteration 999"):
        job_wide_pause(holmes.read_job(REAL / "r065-healthy-tp2-pp4-dp2"), 999)


def test_a_pause_keeps_the_ranks_consistent_with_each_other():
    # every rank loses the same time: after the pause the ranks meet at their next collective, as
    # a real job's do (a first version let them drift apart by up to 400 ms: "shifted logs")
    job = holmes.read_job(REAL / "r026-gpu-persistent-tp2-pp2-dp4")
    paused = job_wide_pause(job, 15, seed=1)
    rep = holmes.localize(paused)
    assert not any("disagree on communicator" in a for a in rep.assumptions)
    end = {r: paused.ops(r).column("end_ns").to_numpy()[-1] - job.ops(r).column("end_ns").to_numpy()[-1]
           for r in job.available_ranks()}
    assert len(set(end.values())) == 1 and next(iter(end.values())) > 0
