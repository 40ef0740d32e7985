"""The cell-by-cell comparison of a job read whole (holmes.localize.irregular.cells)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import holmes
from holmes.cog.graph import CommOpGraph
from holmes.localize.irregular.cells import CellEvidence, Event, device_pvalues
from holmes.localize.irregular.tails import gpd_fit, tail_pvalue
from holmes.simulate import simulate


def _cells(path):
    job = holmes.read_job(path)
    g = CommOpGraph(job.communicators)
    for r in range(job.world_size):
        g.add_rank(r, job.ops(r))
    return CellEvidence(g.ranks, g.members, job.topology.host_of), job.topology


@given(st.lists(st.floats(0, 50, allow_nan=False), min_size=30, max_size=200), st.floats(0, 60), st.floats(0, 60))
@settings(max_examples=60, deadline=None)
def test_tail_pvalue_is_a_probability_falling_with_z(cells, a, b):
    lo, hi = sorted((a, b))
    p_lo, p_hi = tail_pvalue(np.array(cells), lo), tail_pvalue(np.array(cells), hi)
    assert 0.0 <= p_hi <= p_lo <= 1.0


def test_the_predictive_tail_is_not_fooled_by_a_scale_from_few_cells():
    # 40 null cells: the exponential tail's scale is the mean of ~4 of them. A z whose true
    # tail probability is 1e-6 read p < 1e-8 in 2 of 3 draws under the fitted scale; under the
    # predictive tail (the scale's own uncertainty) in none
    z = -np.log(1e-6)
    plain = pred = 0
    for seed in range(300):
        x = np.random.default_rng(seed).standard_exponential(40)
        plain += tail_pvalue(x, z, n=1) < 1e-8
        pred += tail_pvalue(x, z, n=1, predictive=True) < 1e-8
    assert plain > 150 and pred == 0
    # with many cells the two agree
    x = np.random.default_rng(0).standard_exponential(20000)
    assert np.isclose(tail_pvalue(x, 12.0, n=1), tail_pvalue(x, 12.0, n=1, predictive=True), rtol=0.2)


def test_predictive_below_switches_the_tail_by_the_cells_its_scale_rests_on():
    z = -np.log(1e-6)
    few = np.random.default_rng(1).standard_exponential(30)    # the scale rests on ~2 cells
    many = np.random.default_rng(1).standard_exponential(400)  # on ~36
    for x in (few, many):
        plain, pred = tail_pvalue(x, z, n=1), tail_pvalue(x, z, n=1, predictive=True)
        assert pred > plain
        assert tail_pvalue(x, z, n=1, predictive_below=0) == plain
    assert tail_pvalue(few, z, n=1, predictive_below=10) == tail_pvalue(few, z, n=1, predictive=True)
    assert tail_pvalue(many, z, n=1, predictive_below=10) == tail_pvalue(many, z, n=1)


def test_a_repeated_event_is_stronger_than_one():
    one = [Event(5, "gpu", (3,), 8.0, 1e-3, 1e7, devices=["gpu:3"])]
    two = one + [Event(9, "gpu", (3,), 8.0, 1e-3, 1e7, devices=["gpu:3"])]
    rows = {"gpu": 16, "host": 16, "network": 40}
    assert device_pvalues(two, rows, 40)["gpu:3"] < device_pvalues(one, rows, 40)["gpu:3"] / 100


def test_a_spiking_gpu_is_the_only_event(tmp_path):
    path = simulate(tmp_path / "job", tp=2, pp=2, dp=2, gpus_per_host=4, iterations=30, seed=3,
                    faults=["gpu:5@spike:12*1.8"])
    cells, topo = _cells(path)
    events = cells.events(topo, min_cost_ns=0.0)
    # the simulator's heavy-tailed jitter leaves a few cells beyond the noise (a 6.5 ms blip of
    # rank 7 at p ~ 1e-10, which the cost rule drops in localize); the fault is far beyond them
    strong = [e for e in events if e.pvalue < 1e-20]
    assert [(e.iteration, e.devices) for e in strong] == [(12, ["gpu:5"])], strong
    assert max(events, key=lambda e: e.z).devices == ["gpu:5"]


def test_a_one_off_stall_of_one_kernel_is_said_not_counted(tmp_path):
    # the simulator's heavy-tailed kernels: rank 7 spent 6.5 ms more in one gap of iteration 20
    # (p ~ 1e-10) while its other work ran as usual; the 1.8x GPU stretched all of its work
    path = simulate(tmp_path / "job", tp=2, pp=2, dp=2, gpus_per_host=4, iterations=30, seed=3,
                    faults=["gpu:5@spike:12*1.8"])
    cells, topo = _cells(path)
    events = cells.events(topo, min_cost_ns=0.0, transient=0.25)
    assert [(e.iteration, e.devices) for e in events if e.pvalue < 1e-3] == [(12, ["gpu:5"])]
    stalls = {(e.iteration, e.devices[0]) for e in cells.transients}
    assert (20, "gpu:7") in stalls
    fault = [e for e in events if e.iteration == 12][0]
    assert cells.spread_ratio(fault) > 0.5 > 0.25 > max(cells.spread_ratio(e) for e in cells.transients)
    # without the rule the stall is an event of its own
    assert (20, ["gpu:7"]) in [(e.iteration, e.devices) for e in cells.events(topo, min_cost_ns=0.0)]


def test_a_slow_host_is_its_ranks_together(tmp_path):
    path = simulate(tmp_path / "job", tp=2, pp=2, dp=2, gpus_per_host=4, iterations=30, seed=4,
                    faults=["host:1@spike:15*1.8"])
    cells, topo = _cells(path)
    strong = [e for e in cells.events(topo) if e.pvalue < 1e-6]
    assert strong and all(e.kind == "host" and e.devices == ["host:1"] and e.iteration == 15 for e in strong)
    assert set(strong[0].ranks) == {4, 5, 6, 7}


def test_localize_names_the_spiking_gpu_and_a_clean_job_is_healthy(tmp_path):
    bad = simulate(tmp_path / "bad", tp=2, pp=2, dp=2, gpus_per_host=4, iterations=30, seed=3,
                   faults=["gpu:5@spike:12*1.8"])
    r = holmes.localize(bad)
    assert r.verdict == "culprit" and r.devices[0].id == "gpu:5"
    assert r.root_causes[0].iteration == 12 and "sigmas of the job's noise" in (r.root_causes[0].note or "")
    clean = simulate(tmp_path / "clean", tp=2, pp=2, dp=2, gpus_per_host=4, iterations=30, seed=3)
    assert holmes.localize(clean).verdict == "healthy"


def test_on_a_single_host_each_rank_is_judged_against_the_others(tmp_path):
    # no other host to take the null from: a rank slow in a quarter of the iterations must not
    # hide in a null that holds its own cells
    path = simulate(tmp_path / "job", tp=2, pp=2, dp=2, gpus_per_host=8, iterations=32, seed=5,
                    faults=["gpu:5@spike:3,7,11,15,19,23,27,31*1.8"])
    cells, topo = _cells(path)
    strong = [e for e in cells.events(topo) if e.pvalue < 1e-6]
    assert strong and {e.devices[0] for e in strong} == {"gpu:5"}


def test_row_spread_ignores_a_level_shift_over_most_iterations():
    from holmes.localize.irregular.cells import _row_spread
    rng = np.random.default_rng(1)
    x = 10.0 + rng.normal(0, 0.3, (3, 40))
    x[0, 12:] += 15.0  # slowed from a third of the run to the end
    s = _row_spread(x)
    assert s[0] < 0.6 and abs(s[0] - s[1]) < 0.3, s


def test_a_host_is_judged_against_the_other_hosts(tmp_path):
    path = simulate(tmp_path / "job", tp=2, pp=2, dp=4, gpus_per_host=4, iterations=30, seed=5,
                    faults=["host:2@spike:14*1.6"])
    cells, topo = _cells(path)
    hp = cells.host_pvalues()
    col = int(np.searchsorted(cells.iterations, 14))
    assert hp[cells._host_index[2], col] < 1e-6
    assert np.delete(hp[:, col], cells._host_index[2]).min() > 1e-3


def test_a_host_is_slow_only_when_every_one_of_its_ranks_is(tmp_path):
    # three of host 1's four ranks slowed together (processes stalled by something else on the
    # machine) is not the host slowing down: the host is judged by its slowest-growing rank
    # (here 3.4 sigmas, against 120 for the others; judged by the median, as strong as the host)
    kw = dict(tp=2, pp=2, dp=4, gpus_per_host=4, iterations=30, seed=5)
    whole = simulate(tmp_path / "whole", faults=["host:1@spike:14*1.6"], **kw)
    some = simulate(tmp_path / "some", faults=[f"gpu:{g}@spike:14*1.6" for g in (4, 5, 6)], **kw)
    p = {}
    for name, path in (("whole", whole), ("some", some)):
        cells, _ = _cells(path)
        p[name] = cells.host_pvalues()[cells._host_index[1], int(np.searchsorted(cells.iterations, 14))]
    assert p["whole"] < 1e-100 and p["some"] > 1e-9, p


def test_a_heavy_null_tail_makes_a_far_cell_less_surprising_under_the_gpd():
    rng = np.random.default_rng(3)
    light, heavy = rng.standard_exponential(3000), rng.pareto(2.5, 3000)
    assert gpd_fit(light)[2] < 0.1 < gpd_fit(heavy)[2]
    z = float(np.quantile(heavy, 0.999)) * 3
    assert tail_pvalue(heavy, z, n=1, model="gpd") > 100 * tail_pvalue(heavy, z, n=1)
    # on a light (exponential) null the two models agree within an order of magnitude
    z = float(np.quantile(light, 0.999))
    ratio = tail_pvalue(light, z, n=1, model="gpd") / tail_pvalue(light, z, n=1)
    assert 0.1 < ratio < 10


def test_only_the_devices_that_best_explain_an_event_take_its_evidence():
    # a slow DP all-reduce lists every NIC of the ring; only nic:0 (and its cable) had all of its
    # channels slow: the other NICs are alternatives and gain nothing from the repetition
    ring = ["nic:0", "link:nic:0|switch:leaf-0", "nic:6", "nic:4"]
    events = [Event(i, "network", (0, 2, 4, 6), 30.0, 1e-6, 1e8, devices=ring, cell_pvalue=1e-9, best=2)
              for i in (5, 6, 7)]
    pv = device_pvalues(events, {"gpu": 16, "host": 4, "network": 40}, 40)
    assert set(pv) == {"nic:0", "link:nic:0|switch:leaf-0"} and pv["nic:0"] < 1e-15


def test_a_host_event_carries_its_own_ranks_excess_not_another_hosts(tmp_path):
    # two of host 0's four ranks and one rank of host 1 grew together, host 1's most: the event is
    # host 0's (half its ranks), so its size is host 0's strongest cell, not rank 7's
    path = simulate(tmp_path / "job", tp=2, pp=2, dp=2, gpus_per_host=4, iterations=30, seed=3,
                    faults=["gpu:0@spike:14*1.5", "gpu:1@spike:14*1.5", "gpu:7@spike:14*1.8"])
    cells, topo = _cells(path)
    e = [e for e in cells.events(topo, min_cost_ns=0.0) if e.iteration == 14 and e.kind != "network"][0]
    col = int(np.searchsorted(cells.iterations, 14))
    assert e.devices == ["host:0"] and set(e.ranks) == {0, 1}
    own = cells.compute_excess[[0, 1], col].max()
    assert e.excess_ns == own < cells.compute_excess[7, col]


def test_two_unrelated_slow_places_in_one_iteration_are_two_events(tmp_path):
    # host 0's NVSwitch and nic:5 slow in the same iteration: the P2P pair 1 <-> 5 shares rank 1
    # with host 0's collectives but no device, so it is not absorbed into the NVSwitch's event
    path = simulate(tmp_path / "job", tp=2, pp=2, dp=2, gpus_per_host=4, iterations=30, seed=3,
                    faults=["nvswitch:0@spike:12*3", "nic:5@spike:12*3"])
    cells, topo = _cells(path)
    at12 = [e for e in cells.events(topo, min_cost_ns=0.0) if e.iteration == 12]
    best = [set(e.best_devices) for e in at12]
    assert len(at12) == 2 and {"nvswitch:0"} in best and any("nic:5" in b for b in best), at12
