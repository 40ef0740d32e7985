"""Job-wide pauses (holmes.localize.irregular.pauses): a moment in which the whole job stalled at
once names no device; a stall of one host still names the host.

The pauses are added to real captured healthy runs of the development split
(:func:`holmes.eval.perturb.job_wide_pause`); the cases are ones where, with the rule turned off
(``pause_ratio=0``), a GPU is named at 0.98 -- checked here too, so the tests cannot pass vacuously.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import holmes
from holmes.eval.perturb import job_wide_pause, warp_times

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real"
PAUSED = [("r065-healthy-tp2-pp4-dp2", 13, 1), ("r065-healthy-tp2-pp4-dp2", 19, 7), ("r067-healthy-tp2-pp2-dp4", 17, 5)]
SAID = "the whole job stalled at once"


@pytest.mark.parametrize(("name", "iteration", "seed"), PAUSED)
def test_a_job_wide_pause_names_no_device_and_says_so(name, iteration, seed):
    job = job_wide_pause(holmes.read_job(REAL / name), iteration, seed=seed)
    off = holmes.localize(job, pause_ratio=0)
    assert off.verdict == "culprit" and off.devices[0].kind == "gpu"  # what the rule prevents
    rep = holmes.localize(job)
    assert rep.devices == [] and rep.verdict != "culprit"
    said = [a for a in rep.assumptions if SAID in a]
    assert len(said) == 1 and said[0].startswith(f"iteration(s) {iteration}:")


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
