"""The persistent analysis: stragglers slow from iteration 0, role peers, what-if, the merged report."""

from __future__ import annotations

import json

import numpy as np
import pytest

from holmes.errors import ConfigError
from holmes.localize import LocalizeParams, localize
from holmes.localize.persistent.analysis import PersistentAnalysis
from holmes.localize.persistent.peers import Roles
from holmes.localize.pipeline import Localizer, merge_devices
from holmes.localize.report import DeviceScore, Report


def _job(fault=None, *, seed=2, tp=2, pp=2, dp=4, iterations=10):
    from holmes.simulate import run_simulation

    faults = [fault] if fault else []
    return run_simulation(tp=tp, pp=pp, dp=dp, iterations=iterations, seed=seed, faults=faults).to_memory_job()


@pytest.fixture(scope="module")
def slow_gpu():
    return _job("gpu:5@persistent:0-9*1.3")


def test_slow_gpu_from_iteration_0_is_named_with_impact(slow_gpu):
    r = localize(slow_gpu, analysis="persistent")
    assert r.irregular_iterations == [] and r.verdict == "culprit"
    top = r.top
    assert top.id == "gpu:5" and top.evidence == ("persistent",) and top.confidence >= 0.9
    assert 1.0 < top.impact_pct < 30.0
    assert r.slowdown is not None and r.slowdown > 1.0
    d = json.loads(r.dumps())
    assert d["slowdown"] == pytest.approx(r.slowdown, rel=1e-5) and d["devices"][0]["impact_pct"] > 0
    assert d["non_device_cause"] is None
    assert "impact" in r.to_text() and "slowdown" in r.to_text()


def test_weak_slow_gpu_is_named():
    r = localize(_job("gpu:9@persistent:0-9*1.12", seed=4), analysis="persistent")
    assert r.top is not None and r.top.id == "gpu:9"


def test_healthy_job_names_nothing():
    r = localize(_job(seed=3), analysis="persistent")
    assert r.verdict == "healthy" and r.devices == []


def test_slow_nic_is_in_the_top_two():
    r = localize(_job("nic:6@persistent:0-9*4", seed=5, tp=2, pp=2, dp=8), analysis="persistent")
    assert "nic:6" in [d.id for d in r.devices[:2]] or "link:nic:6|switch:leaf-6" in [d.id for d in r.devices[:2]]


def test_all_runs_both_analyses_and_reads_every_rank(slow_gpu):
    r = localize(slow_gpu)
    assert r.top.id == "gpu:5" and "persistent" in r.top.evidence
    assert len(r.fetched) == slow_gpu.world_size


def test_replay_reproduces_the_logged_steps(slow_gpu):
    run = Localizer(analysis="persistent").prepare(slow_gpu)
    a = PersistentAnalysis()
    ev = a.gather(run, a.select(run))
    _, dur = slow_gpu.iteration_times(0)
    assert ev.step_actual == pytest.approx(float(np.mean(dur)), rel=0.05)
    assert ev.step_ideal < ev.step_actual and set(ev.by_stage) == {0, 1}
    assert ev.by_replica[2] == max(ev.by_replica.values())  # gpu:5 lives in replica 2


def test_merge_keeps_impact_and_both_kinds_of_evidence():
    a = DeviceScore("gpu:3", "gpu", 0.9, confidence=0.99, evidence=("irregular",))
    b = DeviceScore("gpu:3", "gpu", 0.5, confidence=0.95, impact_pct=7.5, evidence=("persistent",))
    (m,) = merge_devices([[a], [b]])
    assert m.evidence == ("irregular", "persistent") and m.impact_pct == 7.5 and m.score == 0.9


def test_report_non_device_cause_in_json_and_text():
    r = Report(verdict="inconclusive", slowdown=1.18,
               non_device_cause={"kind": "pipeline_stage_imbalance", "stage": 3})
    d = r.to_json()
    assert d["slowdown"] == 1.18 and d["non_device_cause"]["stage"] == 3
    assert "pipeline stage imbalance (stage 3)" in r.to_text()


def test_roles_from_communicators():
    from holmes.topology import ParallelLayout

    roles = Roles.from_communicators(ParallelLayout(tp=2, pp=2, dp=2).communicators(), 8)
    assert roles.peers_of(0).tolist() == [0, 2] and int(roles.stage[4]) == 1
    lone = Roles.from_communicators({}, 3)
    assert lone.num_groups == 3 and lone.peers_of(1).tolist() == [1]


@pytest.mark.parametrize("kw", [dict(persistent_fraction=0), dict(persistent_z=-1), dict(imbalance_pct=float("nan")),
                                dict(analysis="persistents")])
def test_bad_parameters_are_config_errors(kw):
    with pytest.raises(ConfigError):
        LocalizeParams(**kw)


def test_impact_matches_the_cost_measured_against_a_fault_free_twin():
    from holmes.simulate import run_simulation

    kw = dict(tp=2, pp=2, dp=4, iterations=10, seed=6)
    job = run_simulation(faults=["gpu:10@persistent:0-9*1.5"], **kw).to_memory_job()
    twin = run_simulation(**kw).to_memory_job()
    r = localize(job, analysis="persistent")
    cost = 100 * (1 - np.mean(twin.iteration_times(0)[1]) / np.mean(job.iteration_times(0)[1]))
    assert r.top.id == "gpu:10" and r.top.impact_pct == pytest.approx(cost, abs=max(1.0, 0.25 * cost))


def _parts(job, ranks, win):
    from holmes.localize.mapreduce import merge_summaries, persistent_rank_summary

    return merge_summaries(*[persistent_rank_summary(job, r, win) for r in ranks])


def test_map_reduce_in_any_grouping_gives_the_in_process_report(slow_gpu):
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from holmes.localize.mapreduce import localize_summary, merge_summaries, persistent_window

    win = persistent_window(slow_gpu)
    ref = localize(slow_gpu, analysis="persistent").dumps()
    W = slow_gpu.world_size

    @settings(max_examples=4, deadline=None)
    @given(st.permutations(range(W)), st.integers(1, W - 1))
    def check(order, cut):
        a, b = _parts(slow_gpu, order[:cut], win), _parts(slow_gpu, order[cut:], win)
        assert localize_summary(slow_gpu, merge_summaries(b, a)).dumps() == ref

    check()
    assert json.loads(ref)["devices"][0]["id"] == "gpu:5"


def test_merge_rejects_a_rank_twice_and_keeps_missing_ranks(slow_gpu):
    from holmes.io import MemoryJob
    from holmes.localize.mapreduce import merge_summaries, persistent_rank_summary, persistent_window

    win = persistent_window(slow_gpu)
    with pytest.raises(ConfigError, match="twice"):
        merge_summaries(_parts(slow_gpu, [1, 2], win), _parts(slow_gpu, [2], win))
    holed = MemoryJob(slow_gpu.meta, {r: slow_gpu.ops(r) for r in range(slow_gpu.world_size) if r != 7})
    s = merge_summaries(*[persistent_rank_summary(holed, r, win) for r in range(holed.world_size)])
    assert 7 in s.missing and 7 not in s.ranks and len(s.ranks) == holed.world_size - 1
    r = localize(holed, analysis="persistent")
    assert r.top.id == "gpu:5" and any("unreadable" in a for a in r.assumptions)


def test_default_skips_the_persistent_pass_when_the_irregular_analysis_named_a_device():
    from holmes.simulate import run_simulation

    job = run_simulation(tp=2, pp=2, dp=4, iterations=16, seed=7, faults=["gpu:6@spike:10*4"]).to_memory_job()
    r = localize(job, detector="label", full_read=0)  # a job of <= full_read ranks runs every analysis
    assert r.top.id == "gpu:6" and r.top.evidence == ("irregular",)
    assert any("persistent analysis skipped" in a for a in r.assumptions) and r.slowdown is None
