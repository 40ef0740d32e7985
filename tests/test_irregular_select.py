"""Which of the pivot's iterations the irregular analysis explains (delta rule and stretch_z)."""

from __future__ import annotations

import numpy as np

import holmes
from holmes.localize.irregular import IrregularAnalysis
from holmes.localize.pipeline import Localizer
from holmes.simulate import simulate


def _selection(path, **params):
    loc = Localizer(analysis="irregular", **params)
    run = loc.prepare(holmes.read_job(path))
    return IrregularAnalysis().select(run)


def test_a_stretch_under_delta_but_far_out_of_the_noise_is_irregular(tmp_path):
    # a 1.08x GPU in iteration 12 stretches the step by a few percent: under delta=1.1, yet many
    # healthy sigmas above the usual step of a quiet job
    path = simulate(tmp_path / "job", tp=2, pp=2, dp=2, gpus_per_host=4, iterations=30, seed=7,
                    faults=["gpu:5@spike:12*1.08"])
    sel = _selection(path)
    i = int(np.flatnonzero(sel.window == 12)[0])
    ref = np.percentile(sel.durations, 10)
    stretch = sel.durations[i] / ref - 1
    assert 0.03 < stretch < 0.10, stretch
    assert 12 in sel.irregular.tolist()
    assert 12 not in _selection(path, stretch_z=0).irregular.tolist()  # the paper's delta rule alone
    assert set(sel.irregular.tolist()) <= {12, 13}


def test_a_clean_job_has_no_stretched_iteration(tmp_path):
    path = simulate(tmp_path / "clean", tp=2, pp=2, dp=2, gpus_per_host=4, iterations=30, seed=8)
    assert _selection(path).irregular.size == 0

