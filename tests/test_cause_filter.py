"""Which root causes stand (:mod:`holmes.localize.irregular.cause_filter`): of unrelated ones the one that
cost most (``drop_diffuse``); none that cost its rank a trifle of the iteration's excess (``drop_minor``);
in a candidate iteration only those standing out of their own rank's noise (``drop_unproven``)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from holmes.cog import RankOps
from holmes.localize.evidence.search import COMPUTE, NETWORK, RootCause
from holmes.localize.irregular.analysis import Evidence
from holmes.localize.irregular.cause_filter import (cause_cost, cause_z, computed_longer, drop_diffuse, drop_minor,
                                                    drop_unproven, drop_usual_compute, proven_devices)

OPS, ITS = 40, 6


def _rank(rank: int, gap_ns, dur_ns) -> RankOps:
    """One rank of ``ITS`` iterations x ``OPS`` tensor-parallel all-reduces; ``gap_ns`` and
    ``dur_ns`` are (ITS, OPS) arrays: the compute before each operator and its duration."""
    gap, dur = np.asarray(gap_ns, np.int64).ravel(), np.asarray(dur_ns, np.int64).ravel()
    start = np.cumsum(gap + np.r_[0, dur[:-1]])
    n = ITS * OPS
    t = pa.table({"rank": np.full(n, rank, np.int32), "iteration": np.repeat(np.arange(ITS), OPS),
                  "op_index": np.tile(np.arange(OPS, dtype=np.int32), ITS),
                  "comm_id": [f"tp-{rank}"] * n, "seq": np.arange(n), "op": ["all_reduce"] * n,
                  "peer": pa.array([None] * n, pa.int32()), "nbytes": np.full(n, 1 << 20),
                  "start_ns": start, "end_ns": start + dur, "abnormal": np.zeros(n, bool)})
    return RankOps(rank, t, {f"tp-{rank}": rank}.__getitem__)


def _cause(it: int, kind: str, rank: int, row: int) -> RootCause:
    return RootCause(it, kind, (rank,), rank, row, {}, [], None)


def _jitter(rng, base: float, shape=(ITS, OPS)) -> np.ndarray:
    return base * (1 + 0.02 * rng.random(shape))


def _slow_group_and_gap(seed: int, gap_extra: float):
    """Rank 8 (host 1): in iteration 3 each of its 40 collectives took 0.3 ms longer (a slower
    NVSwitch): 12 ms in all; rank 0 (host 0): one compute gap ``gap_extra`` ns longer in
    iteration 3. Returns the ranks and a network cause on rank 8, a compute cause on that gap."""
    rng = np.random.default_rng(seed)
    dur8 = _jitter(rng, 1e6)
    dur8[3] += 3e5
    gap0 = _jitter(rng, 2e6)
    gap0[3, 7] += gap_extra
    ranks = {8: _rank(8, _jitter(rng, 2e6), dur8), 0: _rank(0, gap0, _jitter(rng, 1e6))}
    return ranks, _cause(3, NETWORK, 8, 3 * OPS + 5), _cause(3, COMPUTE, 0, 3 * OPS + 7)


def test_a_group_slowed_a_little_at_every_collective_outweighs_one_longer_gap():
    ranks, net, comp = _slow_group_and_gap(0, gap_extra=1e6)
    assert cause_cost(ranks[8], net.row, compute=False) > 10e6
    assert 0.9e6 < cause_cost(ranks[0], comp.row, compute=True) < 2e6
    ev = Evidence(causes=[net, comp], implicated=[["nvswitch:1"], ["gpu:0", "host:0"]])
    drop_diffuse(ev, ranks, lambda r: r // 8)
    assert ev.causes == [net] and ev.common == []


def _two_stragglers(seed: int, slow0: tuple[int, int, float], slow8: tuple[int, int, float]):
    """Ranks 0 and 8, each with one compute gap ``(iteration, op, extra ns)`` grown, and a
    compute cause on each of those gaps."""
    rng = np.random.default_rng(seed)
    gaps = {0: _jitter(rng, 2e6), 8: _jitter(rng, 2e6)}
    causes = []
    for r, (it, op, extra) in ((0, slow0), (8, slow8)):
        gaps[r][it, op] += extra
        causes.append(_cause(it, COMPUTE, r, it * OPS + op))
    return {r: _rank(r, g, _jitter(rng, 1e6)) for r, g in gaps.items()}, causes


def test_unrelated_causes_of_similar_cost_are_a_common_mode_slowdown():
    ranks, (a, b) = _two_stragglers(1, (2, 3, 5e6), (2, 9, 6e6))
    ev = Evidence(causes=[a, b], implicated=[["gpu:0", "host:0"], ["gpu:8", "host:1"]])
    drop_diffuse(ev, ranks, lambda r: r // 8)
    assert ev.causes == [] and ev.common == [2]


def test_a_cause_about_as_long_as_usual_does_not_explain_a_slow_iteration():
    # iteration 4 of the pivot was 6 ms too long; the search ended on a compute gap of rank 0
    # 0.4 ms longer than usual (jitter: the delay was spread over many ranks), and in iteration 2
    # on rank 8's gap 5 ms longer (a real straggler)
    ranks, (weak, real) = _two_stragglers(2, (4, 11, 4e5), (2, 9, 5e6))
    ev = Evidence(causes=[real, weak], implicated=[["gpu:8"], ["gpu:0", "host:0"]])
    drop_minor(ev, ranks, {2: 6e6, 4: 6e6}, share=0.3)
    assert ev.causes == [real] and ev.implicated == [["gpu:8"]] and ev.without_cause == [4]


def test_a_persistent_slowdown_is_measured_against_the_regular_iterations():
    rng = np.random.default_rng(3)
    # rank 8's collectives 0.2 ms slower from iteration 2 on (8 ms per iteration): against its
    # median iteration (a slow one) the cause cost nothing, against the regular ones 8 ms
    dur8 = _jitter(rng, 1e6)
    dur8[2:] += 2e5
    ranks = {8: _rank(8, _jitter(rng, 2e6), dur8)}
    c = _cause(4, NETWORK, 8, 4 * OPS + 5)
    assert cause_cost(ranks[8], c.row, compute=False) < 1e6
    assert cause_cost(ranks[8], c.row, compute=False, usual=np.array([0, 1])) > 7e6
    ev = Evidence(causes=[c], implicated=[["nvswitch:1"]])
    drop_minor(ev, ranks, {4: 8e6}, share=0.3)
    assert ev.causes == []
    ev = Evidence(causes=[c], implicated=[["nvswitch:1"]])
    drop_minor(ev, ranks, {4: 8e6}, share=0.3, usual=np.array([0, 1]))
    assert ev.causes == [c] and ev.without_cause == []


def test_a_candidates_cause_counts_only_when_its_own_work_stood_out():
    # iteration 3 is a candidate (a few sigmas out on the pivot): rank 8's collectives took
    # 0.3 ms longer each (12 ms: its own time in the group far out of its 2% jitter), rank 0's
    # gap that the search also ended on grew 0.2 ms (within its compute's jitter over 40 gaps)
    ranks, net, comp = _slow_group_and_gap(4, gap_extra=2e5)
    usual = np.array([0, 1, 2, 4, 5])
    assert cause_z(ranks[8], net.row, False, usual) > 20
    assert cause_z(ranks[0], comp.row, True, usual) < 4
    ev = Evidence(causes=[net, comp], implicated=[["nvswitch:1"], ["gpu:0", "host:0"]])
    assert proven_devices(ev, ranks, [3], own_z=4, usual=usual) == {"nvswitch:1"}
    assert proven_devices(ev, ranks, [2], own_z=4, usual=usual) == set()   # 3 is no candidate
    drop_unproven(ev, ranks, [3], own_z=4, usual=usual)
    assert ev.causes == [net] and ev.without_cause == []
    # the gap alone: the candidate is left without a cause
    ev = Evidence(causes=[comp], implicated=[["gpu:0", "host:0"]])
    drop_unproven(ev, ranks, [3], own_z=4, usual=usual)
    assert ev.causes == [] and ev.without_cause == [3]
    # outside the candidates nothing is dropped
    ev = Evidence(causes=[comp], implicated=[["gpu:0", "host:0"]])
    drop_unproven(ev, ranks, [1], own_z=4, usual=usual)
    assert ev.causes == [comp]


def test_a_compute_cause_counts_only_when_its_rank_computed_longer():
    # iteration 2: rank 8's gap 5 ms longer (a real straggler); iteration 4: the search ended on
    # rank 0's gap 0.2 ms longer (its compute as usual: the delay came in elsewhere)
    ranks, (usual_c, real) = _two_stragglers(5, (4, 11, 2e5), (2, 9, 5e6))
    usual = np.array([0, 1, 3, 5])
    net = _cause(4, NETWORK, 0, 4 * OPS + 3)
    assert cause_z(ranks[8], real.row, True, usual) > 10
    assert cause_z(ranks[0], usual_c.row, True, usual) < 3
    assert computed_longer(ranks[0], net, 3.0, usual)            # no compute cause: not judged
    assert computed_longer(ranks[0], usual_c, 0.0, usual)        # 0 keeps every compute cause
    assert computed_longer(ranks[0], usual_c, 3.0, usual[:2])    # too few usual iterations to judge
    ev = Evidence(causes=[real, usual_c, net], implicated=[["gpu:8"], ["gpu:0", "host:0"], ["nvswitch:0"]])
    drop_usual_compute(ev, ranks, 3.0, usual)
    assert ev.causes == [real, net] and ev.implicated == [["gpu:8"], ["nvswitch:0"]] and ev.without_cause == []
    ev = Evidence(causes=[real, usual_c], implicated=[["gpu:8"], ["gpu:0", "host:0"]])
    drop_usual_compute(ev, ranks, 3.0, usual)
    assert ev.causes == [real] and ev.without_cause == [4]
