"""Healthy jobs of shapes the benchmarks do not use name no device, on both irregular paths (#36).

Before the one-off stall rule (``cause_filter.drop_stalls``), Algorithm 1 (``full_read=0``) named
``gpu:0`` at 0.97 on the first job (one compute gap of the pivot grew 4 ms in one iteration) and
``gpu:26``, ``gpu:31`` at 0.94 on the second; the healthy a1041 run of the always-on corpus named
``nvswitch:1`` from a stall in iteration 1 (the job's warm-up).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import holmes
from holmes.simulate import simulate

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture(scope="module", params=[(dict(tp=8, pp=2, dp=2), 100), (dict(tp=1, pp=4, dp=8), 102)],
                ids=["tp8-pp2-dp2-s100", "tp1-pp4-dp8-s102"])
def healthy_job(request, tmp_path_factory):
    cfg, seed = request.param
    return simulate(tmp_path_factory.mktemp("healthy") / "job", iterations=20, seed=seed, **cfg)


@pytest.mark.parametrize("full_read", [128, 0], ids=["whole-job", "algorithm-1"])
def test_a_healthy_job_of_an_unseen_shape_names_no_device(healthy_job, full_read):
    rep = holmes.localize(str(healthy_job), full_read=full_read).to_json()
    assert rep["devices"] == [] and rep["verdict"] != "culprit", rep["devices"][:3]


def test_a_stall_in_the_warm_up_names_nothing():
    rep = holmes.localize(str(FIXTURES / "real-always" / "a1041-healthy-tp2-pp4-dp1"))
    js = rep.to_json()
    assert js["devices"] == [] and js["verdict"] == "healthy", js["devices"][:3]
    assert any("warm-up" in a for a in js["assumptions"])
