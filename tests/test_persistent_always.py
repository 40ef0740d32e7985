"""Slow all the time: peers for any layout, always-on network faults, and the verdict's one story.

Unit tests of the mechanisms (work peers, the faster-half reference, the separation rule, whole
slow stages on one host, channel classes by locality) and verdicts on the development split of
``fixtures/real-always`` (real gloo runs, faults active in every logged iteration; the test split
is only reported, by ``benchmarks/real_accuracy.py``).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from holmes import localize
from holmes.errors import ConfigError
from holmes.localize.pipeline import Localizer
from holmes.localize.persistent.peers import Roles
from holmes.localize.persistent.suspects import _separated, compute_suspects, slot_classes, stage_hosts
from holmes.topology import ParallelLayout

ALWAYS = Path(__file__).resolve().parents[1] / "fixtures" / "real-always"


def _run(name: str) -> Path:
    p = ALWAYS / name
    if not p.is_dir():
        pytest.skip(f"{p} missing (python scripts/real_runs.py corpus --plan always --out fixtures/real-always)")
    return p


# ---------------------------------------------------------------------------------------- peers
def test_work_peers_are_the_whole_stage_for_any_number_of_replicas():
    for (tp, pp, dp), size in (((2, 2, 2), 4), ((1, 4, 2), 2), ((4, 2, 1), 4), ((2, 2, 4), 8)):
        W = tp * pp * dp
        roles = Roles.from_communicators(ParallelLayout(tp=tp, pp=pp, dp=dp).communicators(), W)
        assert [len(m) for m in roles.work_members] == [size] * pp
        for m in roles.work_members:
            assert len(set(roles.stage[m].tolist())) == 1


def _work(W: int, T: int, seed: int = 0, noise: float = 0.03) -> np.ndarray:
    return 100e6 * np.exp(np.random.default_rng(seed).normal(0, noise, (W, T)))


def test_two_replicas_one_slow_rank_is_a_straggler():
    roles = Roles.from_communicators({"dp": ("dp", [0, 1])}, 2)   # tp 1, pp 1, dp 2: one peer
    work = _work(2, 25)
    work[1] *= 1.15
    caused = np.zeros((2, 25))
    caused[1] = 5e6
    res = compute_suspects(roles, caused, work, z=4.0, fraction=0.6, min_effect=0.08)
    assert [s.ranks for s in res.suspects] == [[1]]
    assert res.effect[1] == pytest.approx(0.15, abs=0.03)


def test_healthy_pair_and_a_continuum_name_nobody():
    roles = Roles.from_communicators({"dp": ("dp", [0, 1])}, 2)
    res = compute_suspects(roles, np.ones((2, 25)), _work(2, 25, 1), z=4.0, fraction=0.6, min_effect=0.08)
    assert res.suspects == []
    # eight peers with persistent offsets of 0-9 %, evenly spread: no one stands apart
    roles8 = Roles.from_communicators({"dp": ("dp", list(range(8)))}, 8)
    work = _work(8, 25, 2, noise=0.01) * (1 + np.linspace(0, 0.09, 8))[:, None]
    res = compute_suspects(roles8, np.arange(8.0)[:, None] * np.ones((8, 25)), work, z=4.0, fraction=0.6,
                           min_effect=0.08)
    assert res.suspects == []


def test_a_slow_host_that_is_half_the_stage_is_found_whole():
    roles = Roles.from_communicators({"dp": ("dp", [0, 1, 2, 3])}, 4)
    work = _work(4, 25, 3)
    work[2:] *= 1.14                       # ranks 2 and 3: one host, half the replicas
    caused = np.zeros((4, 25))
    caused[2:] = 4e6
    res = compute_suspects(roles, caused, work, z=4.0, fraction=0.6, min_effect=0.08)
    assert sorted(s.ranks[0] for s in res.suspects) == [2, 3]


def test_separated_takes_at_most_half_the_group():
    assert _separated(np.array([0.0, 0.0, 0.2, 0.2]), 0.06).tolist() == [False, False, True, True]
    assert not _separated(np.array([0.0, 0.2, 0.2, 0.2]), 0.06).any()   # three of four slow: no peer majority
    assert not _separated(np.array([0.1]), 0.06).any()


def test_a_host_that_is_one_whole_stage_is_ambiguous():
    comms = {"pp0": ("pp", [0, 4]), "pp1": ("pp", [1, 5]), "pp2": ("pp", [2, 6]), "pp3": ("pp", [3, 7]),
             "dp0": ("dp", [0, 1, 2, 3]), "dp1": ("dp", [4, 5, 6, 7])}
    roles = Roles.from_communicators(comms, 8)
    work = _work(8, 20, 4, noise=0.01)
    work[:4] *= 1.3                        # host 0 = stage 0 (every replica)
    found = stage_hosts(roles, work, lambda r: r // 4, z=4.0, fraction=0.6, min_effect=0.08)
    assert [(h.host, h.stages, h.ambiguous) for h in found] == [(0, [0], True)]
    # a middle stage, built like its neighbours: the host is the simpler story
    comms3 = {f"pp{i}": ("pp", [i, 4 + i, 8 + i]) for i in range(4)}
    comms3.update({f"dp{s}": ("dp", [4 * s + j for j in range(4)]) for s in range(3)})
    roles3 = Roles.from_communicators(comms3, 12)
    work3 = _work(12, 20, 5, noise=0.01)
    work3[4:8] *= 1.3                      # host 1 = stage 1 of 3
    found3 = stage_hosts(roles3, work3, lambda r: r // 4, z=4.0, fraction=0.6, min_effect=0.08)
    assert [(h.host, h.stages, h.ambiguous) for h in found3] == [(1, [1], False)]
    # a stage spread over two hosts is no host's
    assert stage_hosts(roles, work, lambda r: r % 2, z=4.0, fraction=0.6, min_effect=0.08) == []


def test_channel_classes_keep_nvswitch_and_nic_transfers_apart():
    info = [("p", "pp", (0, 4), "pp0"), ("p", "pp", (1, 5), "pp1"), ("p", "pp", (2, 3), "pp2"),
            ("p", "pp", (4, 0), "pp0")]
    comms = {"pp0": ("pp", [0, 4]), "pp1": ("pp", [1, 5]), "pp2": ("pp", [2, 3])}
    stage = np.array([0, 0, 0, 1, 1, 1, 1, 1])
    ones = np.ones(4)
    classes = slot_classes(info, stage, ones, ones, host_of=lambda r: r // 4, communicators=comms)
    assert sorted(sorted(c.tolist()) for c in classes) == [[0, 1], [2], [3]]


# ------------------------------------------------------------------------------------- verdicts
@pytest.mark.parametrize("run,device", [
    ("a1008-gpu-wire-tp4-pp2-dp1", "gpu:2"),        # 1.14x, one replica: peers are the TP positions
    ("a1024-gpu-wire-tp1-pp4-dp2", "gpu:3"),        # 1.21x, two replicas: one peer
    ("a1017-host-wire-tp2-pp2-dp4", "host:3"),      # 1.14x, the host is half of stage 1's replicas
    ("a1001-host-wire-tp1-pp4-dp2", "host:0"),      # 1.15x, the host is stages 0 and 1 whole
])
def test_always_slow_compute_is_named_first(run, device):
    r = localize(_run(run))
    assert r.verdict == "culprit" and r.devices[0].id == device, [(d.id, d.confidence) for d in r.all_devices[:4]]


@pytest.mark.parametrize("run,path", [
    ("a1010-nic-wire-tp2-pp4-dp2", {"nic:9", "link:nic:9|switch:leaf-1"}),
    ("a1035-nic-sender-tp2-pp2-dp4", {"nic:2", "link:nic:2|switch:leaf-2"}),          # a late sender
    ("a1028-p2p-wire-tp2-pp4-dp2", {"nic:4", "link:nic:4|switch:leaf-0", "switch:leaf-0",
                                     "link:nic:8|switch:leaf-0", "nic:8"}),            # one direction
    ("a1030-switch-wire-tp2-pp2-dp4", {"switch:leaf-1"}),
    # one direction whose NICs also carry a cross-host dp all-reduce and the other direction: one
    # of each NIC's three transfers is slow, in every iteration (named from two dp all-reduce
    # spikes' links while a device needed half of its traffic slow)
    ("a1012-p2p-wire-tp2-pp2-dp4", {"nic:7", "link:nic:7|switch:leaf-3", "switch:leaf-3",
                                     "link:nic:15|switch:leaf-3", "nic:15"}),
])
def test_always_on_network_fault_is_in_the_top_two(run, path):
    # the analyses' own evidence (calibration=None); named under the calibration or not is what
    # benchmarks/calibration.py measures (a1028's two NICs share the evidence: each below 0.9)
    r = Localizer(calibration=None).localize(_run(run))
    assert r.verdict == "culprit" and any(d.id in path for d in r.devices[:2]), [d.id for d in r.all_devices[:4]]


@pytest.mark.parametrize("run", ["a1040-healthy-tp2-pp2-dp4", "a1042-healthy-tp1-pp4-dp2",
                                 "a1046-healthy-tp2-pp4-dp2", "a1053-healthy-tp2-pp2-dp4"])
def test_healthy_always_corpus_run_names_nothing(run):
    r = localize(_run(run))
    assert r.devices == [], [(d.id, d.confidence) for d in r.all_devices[:4]]


def test_a_host_that_is_the_first_stage_is_named_when_the_stages_hold_equal_layers():
    # host:0 is every GPU of stage 0; every stage reduces the same gradient volume (equal layers), so
    # "the first stage is heavier by design" (an embedding would show as a larger volume) is ruled out
    r = localize(_run("a1033-host-wire-tp2-pp4-dp2"))
    assert r.verdict == "culprit" and [d.id for d in r.devices][:1] == ["host:0"]
    assert any("exactly host:0's GPUs" in a for a in r.assumptions)
    assert not any("cannot be told apart" in a for a in r.assumptions)


def _stage0_slow(volume):
    from holmes.localize.persistent.peers import Roles
    from holmes.localize.persistent.suspects import stage_hosts

    roles = Roles.from_communicators({"pp0": ("pp", [0, 4]), "pp1": ("pp", [1, 5]), "pp2": ("pp", [2, 6]),
                                      "pp3": ("pp", [3, 7]), "dp0": ("dp", [0, 1, 2, 3]),
                                      "dp1": ("dp", [4, 5, 6, 7])}, 8)
    work = 100.0 * np.exp(np.random.default_rng(3).normal(0, 0.01, (8, 20)))
    work[:4] *= 1.4                                    # host 0 = ranks 0-3 = all of stage 0
    out = stage_hosts(roles, work, lambda r: r // 4, z=4.0, fraction=0.6, min_effect=0.08, volume=volume)
    assert [(h.host, h.stages) for h in out] == [(0, [0])]
    return out[0].ambiguous


def test_an_edge_stage_host_is_ambiguous_unless_the_volumes_say_equal_layers():
    assert _stage0_slow(None)                                            # volumes unknown
    assert _stage0_slow(np.array([1.5e6, 1e6]))                          # stage 0 holds more (embedding)
    assert not _stage0_slow(np.array([1.01e6, 1e6]))                     # equal layers
    assert _stage0_slow(np.array([np.nan, 1e6]))


def test_unexplained_slowdown_is_inconclusive_not_healthy():
    run = _run("a1042-healthy-tp1-pp4-dp2")
    r = localize(run)
    assert r.verdict == "healthy" and r.slowdown is not None and r.slowdown < 1.25
    r2 = localize(run, unexplained_slowdown=1.0)
    assert r2.verdict == "inconclusive" and r2.devices == []
    assert any("no device or imbalance explains" in a for a in r2.assumptions)
    with pytest.raises(ConfigError):
        localize(run, unexplained_slowdown=0.5)


# -------------------------------------------------------------------------------------- harness
def test_late_sender_wire_model_delays_only_the_sender():
    from holmes.eval.realrun import build_topology
    from holmes.eval.realrun_worker import WireModel

    topo = build_topology(8, 4)
    factors = np.full((1, 3), 3.0)
    wire = WireModel(topo, {"intra_bw": 4e8, "inter_bw": 2.5e7, "intra_lat": 3e-5, "inter_lat": 1.5e-4},
                     [{"kind": "nic", "device": "nic:1", "pair": None}], factors)
    ring = (1, 5, 6)  # hops 1 -> 5 (leaves by nic:1), 5 -> 6 (inside host 1), 6 -> 1 (enters by nic:1)
    base = wire.collective("all_reduce", ring, 3 << 20, -1)
    slow = wire.collective("all_reduce", ring, 3 << 20, 0)
    assert slow == pytest.approx(3 * base)
    assert wire.collective_sender_delay("all_reduce", ring, 3 << 20, 0, 1) == pytest.approx(slow - base)
    assert wire.collective_sender_delay("all_reduce", ring, 3 << 20, 0, 5) == 0.0   # its hop is healthy
    assert wire.collective_sender_delay("all_reduce", ring, 3 << 20, -1, 1) == 0.0  # warm-up: no fault


def test_harness_rejects_an_unknown_fault_side():
    from holmes.eval.realrun import RealRunConfig

    with pytest.raises(ConfigError, match="fault_side"):
        RealRunConfig(tp=2, pp=2, dp=2, fault_side="receiver").validate()
    assert RealRunConfig(fault_side="sender").layout_name.endswith("-sender")


def test_always_plan_has_every_cell_in_both_splits():
    from holmes.eval.realrun_corpus import ALWAYS_CELLS, always_plan

    plan = always_plan(5, 10)
    assert len(plan) == 5 * len(ALWAYS_CELLS) + 10
    for kind, side in ALWAYS_CELLS:
        splits = {p["split"] for p in plan if p["name"].split("-")[1:3] == [kind, side]}
        assert splits == {"dev", "test"}, (kind, side)
    dps = {p["config"].dp for p in plan}
    assert dps == {1, 2, 4}
    assert all("persistent:0" in p["config"].faults[0] for p in plan if p["config"].faults)
    assert math.isfinite(sum(p["config"].iterations for p in plan))


def test_one_slow_p2p_direction_names_its_path_though_its_nics_carry_other_traffic():
    # 16 ranks, 4 per host, 2 stages: rank r's P2P partner is r + 8; each NIC also carries a
    # cross-host dp all-reduce and the other direction. Only 0 -> 8 is slow (3x, every iteration):
    # a third of nic:0's traffic, never half, yet every slow transfer it carries is slow throughout
    from holmes.localize.persistent.suspects import network_suspects
    from holmes.topology import default_topology

    topo = default_topology(16, gpus_per_host=4)
    info = [("p", "pp", (r, r + 8), f"pp{r}") for r in range(8)] + \
           [("p", "pp", (r + 8, r), f"pp{r}") for r in range(8)] + \
           [("c", "dp", (r, r + 4), f"dp{r}") for r in (0, 1, 2, 3, 8, 9, 10, 11)]
    comms = {f"pp{r}": ("pp", [r, r + 8]) for r in range(8)}
    comms.update({f"dp{r}": ("dp", [r, r + 4]) for r in (0, 1, 2, 3, 8, 9, 10, 11)})
    stage = np.array([0] * 8 + [1] * 8)
    ones = np.ones(len(info))
    classes = slot_classes(info, stage, ones, ones, host_of=topo.host_of, communicators=comms)
    T = 25
    X = 1e6 * np.exp(np.random.default_rng(4).normal(0, 0.03, (len(info), T)))
    X[0] *= 3.0
    out = network_suspects(info, X, classes, topo, z=4.0, fraction=0.6, min_excess=0.2)
    named = {s.devices[0] for s in out.suspects}
    assert {"nic:0", "nic:8"} <= named
    assert out.device_hits["nic:0"][0] == T and out.device_hits["nic:0"][1] == pytest.approx(1 / 3)
