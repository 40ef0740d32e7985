"""Which of the pivot's iterations the irregular analysis explains (delta rule and stretch_z)."""

from __future__ import annotations

import numpy as np

import holmes
from holmes.localize.irregular.analysis import IrregularAnalysis
from holmes.localize.irregular.iteration_rules import flag_iterations
from holmes.localize.params import LocalizeParams
from holmes.localize.pipeline import Localizer
from holmes.simulate import simulate


def _selection(path, **params):
    params.setdefault("full_read", 0)  # jobs read whole keep the delta rule alone
    loc = Localizer(analysis="irregular", **params)
    run = loc.prepare(holmes.read_job(path))
    return IrregularAnalysis().select(run)


def test_a_stretch_under_delta_but_far_out_of_the_noise_is_irregular(tmp_path):
    # a 1.12x GPU in iteration 12 stretches the step by a few percent: under delta=1.1, yet many
    # healthy sigmas above the usual step of a quiet job
    path = simulate(tmp_path / "job", tp=2, pp=2, dp=2, gpus_per_host=4, iterations=30, seed=7,
                    faults=["gpu:5@spike:12*1.12"])
    sel = _selection(path)
    i = int(np.flatnonzero(sel.window == 12)[0])
    ref = np.percentile(sel.durations, 10)
    stretch = sel.durations[i] / ref - 1
    assert 0.03 < stretch < 0.10, stretch
    assert 12 in sel.irregular.tolist()
    assert 12 not in _selection(path, stretch_z=0).irregular.tolist()  # the paper's delta rule alone
    assert set(sel.irregular.tolist()) <= {12, 13}


def test_clean_jobs_name_nothing_though_a_blip_may_be_flagged(tmp_path):
    # with 30 iterations the fast side's sigma is itself noisy: a clean job's +3.8% blip can stand
    # 6 sigmas out (seed 8); the search from the pivot then finds no device beyond chance
    for seed in (8, 12):
        path = simulate(tmp_path / f"clean{seed}", tp=2, pp=2, dp=2, gpus_per_host=4, iterations=30, seed=seed)
        sel = _selection(path, repeat_z=0)  # the stretch rule alone (the repeat rule: below)
        assert sel.irregular.size <= 1
        r = holmes.localize(path, full_read=0)
        assert r.devices == [] and r.verdict in ("healthy", "inconclusive"), [(d.id, d.confidence) for d in r.all_devices[:3]]


def test_a_job_read_whole_keeps_the_delta_rule(tmp_path):
    path = simulate(tmp_path / "job", tp=2, pp=2, dp=2, gpus_per_host=4, iterations=30, seed=7,
                    faults=["gpu:5@spike:12*1.12"])
    assert 12 not in _selection(path, full_read=64).irregular.tolist()


def test_a_device_slow_from_some_iteration_on_is_a_step_of_the_pivots_iterations(tmp_path):
    # a 1.1x GPU from iteration 15 on: each step only a few percent longer (under delta, and a
    # few of the window's own sigmas, which the step widens); the step itself stands far out
    path = simulate(tmp_path / "job", tp=2, pp=2, dp=2, gpus_per_host=4, iterations=30, seed=5,
                    faults=["gpu:5@persistent:15*1.1"])
    sel = _selection(path)
    assert set(range(17, 30)) <= set(sel.irregular.tolist()), sel.irregular
    assert not set(sel.irregular.tolist()) & set(range(1, 14))
    assert set(sel.chosen.tolist()) & set(range(15, 30))      # searched, not left as noise
    off = _selection(path, shift_z=0)
    assert len(off.irregular) < 5, off.irregular                # without the step rule: at most a blip or two
    r = holmes.localize(path, full_read=0)
    assert r.devices and r.devices[0].id == "gpu:5", [(d.id, d.confidence) for d in r.all_devices[:3]]


def test_level_shift_finds_no_step_in_clean_jobs(tmp_path):
    from holmes.detect import IrregularityRule

    for seed in (8, 12, 21):
        path = simulate(tmp_path / f"clean{seed}", tp=2, pp=2, dp=2, gpus_per_host=4, iterations=30, seed=seed)
        d = _selection(path).durations
        assert IrregularityRule().level_shift(d)[1] < LocalizeParams().t.shift_z


def test_a_small_step_counts_when_it_stands_out_and_reaches_min_shift():
    # a device slow from iteration 14 on, each step 2.6% longer (under min_stretch's 3%, a few of
    # the window's sigmas): the step's evidence is every iteration after it
    rng = np.random.default_rng(3)
    d = 500e6 * (1 + rng.normal(0, 0.006, 30))
    d[14:] += 0.026 * 500e6
    its = np.arange(30)
    flags = flag_iterations(its, d, LocalizeParams(stretch_z=0, repeat_z=0), whole=False)
    assert set(np.flatnonzero(flags.irregular).tolist()) <= set(range(14, 30))
    assert len(np.flatnonzero(flags.irregular)) >= 12
    assert not flag_iterations(its, d, LocalizeParams(stretch_z=0, repeat_z=0, min_shift=0.03), whole=False).irregular.any()
    assert not flag_iterations(its, d, LocalizeParams(stretch_z=0, repeat_z=0, shift_z=0), whole=False).irregular.any()
    # the same noise without the step: nothing
    healthy = d.copy()
    healthy[14:] -= 0.026 * 500e6
    assert not flag_iterations(its, healthy, LocalizeParams(stretch_z=0, repeat_z=0), whole=False).irregular.any()


def test_a_slow_drift_of_the_whole_job_is_no_step(tmp_path):
    # every rank's compute grows 0.4% per iteration (load, thermals): the later iterations are
    # longer, but a straight line explains them better than a step; no device is accused
    path = simulate(tmp_path / "job", tp=2, pp=2, dp=2, gpus_per_host=4, iterations=30, seed=1, drift=0.004)
    sel = _selection(path)
    from holmes.detect import IrregularityRule

    assert IrregularityRule().level_shift(sel.durations) == (0, 0.0, 0.0)
    assert len(sel.irregular) < 5, sel.irregular
    r = holmes.localize(path, full_read=0)
    assert r.devices == [], [(d.id, d.confidence) for d in r.all_devices[:3]]


def test_a_fault_that_returns_a_few_percent_each_time_is_found_by_its_repeats(tmp_path):
    # a 1.08x GPU in four iterations: each stretches the step 3-5%, two of them 3+ sigmas, none
    # beyond stretch_z 5: without the repeat rule (and candidates) the job reads healthy
    path = simulate(tmp_path / "job", tp=2, pp=2, dp=2, gpus_per_host=4, iterations=30, seed=7,
                    faults=["gpu:5@fluctuation:6,13,20,27*1.08"])
    alone = dict(stretch_z=5, candidate_z=0)
    assert _selection(path, repeat_z=0, **alone).irregular.size == 0
    sel = _selection(path, repeat_z=3, **alone)
    assert set(sel.irregular.tolist()) == {13, 27} and sel.min_hits == 2
    assert holmes.localize(path, full_read=0, repeat_z=0, **alone).devices == []
    r = Localizer(calibration=None, full_read=0, repeat_z=3, **alone).localize(path)  # the analysis's own evidence
    assert [d.id for d in r.devices] == ["gpu:5"], [(d.id, d.confidence) for d in r.all_devices[:3]]
    assert any("explains two of them" in a for a in r.assumptions)
    # at stretch_z 4 iteration 27 (4.8 sigmas) stands out alone: searched alone, the GPU is the
    # only candidate, short of the confidence an 8-GPU job's chance level asks
    r = holmes.localize(path, full_read=0, stretch_z=4, candidate_z=0)
    assert r.irregular_iterations == [27] and r.verdict == "inconclusive"
    assert [d.id for d in r.all_devices] == ["gpu:5"] and r.devices == []
    # the defaults: 27 is a candidate (3.5-5 sigmas) among the repeats; the GPU explains both
    sel = _selection(path)
    assert sel.candidates.tolist() == [27] and sel.min_hits == 2
    assert [d.id for d in Localizer(calibration=None, full_read=0).localize(path).devices] == ["gpu:5"]


def test_a_candidate_counts_only_through_a_cause_standing_out_of_its_own_noise(tmp_path):
    # one 1.07x GPU spike stretches iteration 27 by 5%, 4.2 sigmas (no repeat): a candidate; the GPU's
    # own compute stands far out of its noise, so its cause counts alone
    path = simulate(tmp_path / "job", tp=2, pp=2, dp=2, gpus_per_host=4, iterations=30, seed=7,
                    faults=["gpu:5@spike:27*1.07"])
    sel = _selection(path, repeat_z=0)
    assert sel.candidates.tolist() == [27], sel.z
    r = holmes.localize(path, full_read=0, repeat_z=0, point_calibration=1)
    assert r.all_devices and r.all_devices[0].id == "gpu:5", r.all_devices
    # demanding more of the cause than it stands out (own_z 1000) leaves the candidate
    # unexplained: the job's noise, not "inconclusive"
    r = holmes.localize(path, full_read=0, repeat_z=0, own_z=1000)
    assert r.all_devices == [] and r.verdict == "healthy", r.all_devices
    assert 27 in r.iterations_without_cause


def test_the_repeat_rule_names_nothing_in_clean_jobs(tmp_path):
    # seed 12: two iterations 3+ sigmas out by chance are searched; no device explains both, and
    # iterations each within the noise make no "inconclusive"
    for seed in (8, 12):
        path = simulate(tmp_path / f"clean{seed}", tp=2, pp=2, dp=2, gpus_per_host=4, iterations=30, seed=seed)
        r = holmes.localize(path, full_read=0, repeat_z=3)
        assert r.devices == [] and r.verdict == "healthy", [(d.id, d.confidence) for d in r.all_devices[:3]]
    assert _selection(path, repeat_z=3).irregular.tolist() == [0, 9]
    assert "2 iteration(s) stood out (1.03-1.04x the usual) but no device explains them" in r.to_text()


def test_an_iteration_is_weighed_in_the_same_sigmas_as_the_stretch_rules():
    # a healthy 256-GPU job's 20 steps (ms): the fast side (q02-q20) spans 0.7 ms of a 2.6 ms spread,
    # so its 1.10x step stood 7.5 fast-side sigmas out; in the window's MAD sigmas it is 2.1
    d = np.array([59.1, 57.2, 56.3, 57.2, 60.6, 64.7, 60.5, 61.5, 56.9, 59.4, 58.3, 57.7, 55.0, 58.8, 55.7,
                  59.8, 55.1, 55.4, 58.9, 54.6]) * 1e6
    its = np.arange(d.size)
    fast = flag_iterations(its, d, LocalizeParams(thresholds={"noise_mad_floor": False}), whole=False)
    both = flag_iterations(its, d, LocalizeParams(thresholds={"noise_mad_floor": True}), whole=False)
    assert np.flatnonzero(both.irregular).tolist() == np.flatnonzero(fast.irregular).tolist() == [4, 5, 7]
    assert fast.z[4] > 7 and 1.5 < both.z[4] < 3  # the same step, a noise-level distance
    assert both.z[5] > 3  # the 1.17x one still stands out
    assert (both.z <= fast.z).all()
