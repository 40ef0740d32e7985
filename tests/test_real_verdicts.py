"""Verdicts on real multi-process PyTorch runs (development splits only).

``fixtures/real`` was captured on an otherwise idle 2-core machine (its 8-16 gloo ranks keep the
load at 4-5): jobs this small are read whole and compared cell by cell (:mod:`holmes.localize.irregular.cells`).
``fixtures/real-loaded`` was captured while other work kept the load at 6-16: its jobs are mostly
too noisy for the cells, and Algorithm 1 from the pivot with the compute-straggler and transfer
rules runs instead. A slow device must be named, and a healthy run must name nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from holmes import localize, read_job
from holmes.localize.irregular.analysis import IrregularAnalysis
from holmes.localize.irregular.cause_filter import components
from holmes.localize.irregular.transfer import TransferTimes
from holmes.localize.pipeline import Localizer

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real"
LOADED = REAL.parent / "real-loaded"


def _run(name: str, root: Path = REAL) -> Path:
    p = root / name
    if not p.is_dir():
        pytest.skip(f"{p} missing (python scripts/real_runs.py corpus --out fixtures/real)")
    return p


@pytest.mark.parametrize("run,device", [
    ("r024-gpu-spike-tp2-pp4-dp2", "gpu:4"),          # one iteration, 1.76x more work on rank 4
    ("r037-gpu-fluctuation-tp2-pp4-dp2", "gpu:5"),
    ("r015-host-spike-tp2-pp2-dp3-do", "host:1"),     # one iteration, every rank of host 1
    ("r026-gpu-persistent-tp2-pp2-dp4", "gpu:9"),      # 1.83x over the last 29 of 40 iterations
    ("r017-host-persistent-tp2-pp2-dp4-ep2-sp", "host:1"),  # 1.61x over 22 of 32 iterations
])
def test_compute_fault_is_named_first(run, device):
    r = localize(_run(run))
    assert r.verdict == "culprit" and r.devices[0].id == device, [(d.id, d.confidence) for d in r.all_devices[:4]]
    assert any("compared with the job's own noise" in a for a in r.assumptions)


@pytest.mark.parametrize("run,nic", [("r043-nic-fluctuation-tp2-pp2-dp3-do", 0), ("r030-nic-spike-tp2-pp2-dp4-ep2-sp", 1),
                                     ("r019-nic-fluctuation-tp2-pp4-dp2", 7),   # 2.3x in 14 scattered iterations
                                     ("r032-nic-persistent-tp2-pp2-dp2-ep2", 1)])  # 5.2x over 21 of 40
def test_slow_nic_is_in_the_top_two(run, nic):
    r = localize(_run(run))
    assert r.verdict == "culprit"
    assert any(d.id in (f"nic:{nic}", f"link:nic:{nic}|switch:leaf-{nic // 4}") for d in r.devices[:2]), \
        [d.id for d in r.devices]


@pytest.mark.parametrize("run", ["r061-healthy-tp2-pp2-dp3-do", "r067-healthy-tp2-pp2-dp4",
                                 "r072-healthy-tp2-pp2-dp4", "r074-healthy-tp2-pp2-dp2-sp-do"])
def test_healthy_run_names_nothing(run):
    r = localize(_run(run))
    assert r.devices == [] and r.verdict == "healthy", [(d.id, d.confidence) for d in r.all_devices[:4]]


def test_a_job_noisier_than_cell_noise_falls_back_to_the_search():
    # captured at load 6-16; its compute noise (~2.7% of its compute) is over a cell_noise of 1%
    r = localize(_run("r037-gpu-fluctuation-tp2-pp4-dp2", LOADED), cell_noise=0.01)
    assert any("not compared cell by cell" in a for a in r.assumptions), r.assumptions
    r = localize(_run("r037-gpu-fluctuation-tp2-pp4-dp2", LOADED))
    assert any("compared with the job's own noise" in a for a in r.assumptions), r.assumptions


def test_transfer_times_find_the_slow_pair():
    # nic:1 4.8x slower in iteration 25 only: the pipeline pair 1 <-> 5 is the slowest channel
    job = read_job(_run("r054-nic-spike-tp2-pp2-dp2"))
    loc = Localizer(analysis="irregular")
    run = loc.prepare(job)
    for r in range(job.world_size):
        run.search.rank_ops(r)
    t = TransferTimes(run.search.graph.ranks, run.search.graph.members)
    ex, _ = t.excess(25)
    top = max(ex, key=ex.get)
    assert set(t.ranks_of(top)) == {1, 5}
    ex24, _ = t.excess(24)
    assert ex24[top] < ex[top] / 5


def test_common_mode_iterations_are_not_blamed_on_a_device():
    # a loaded machine slows ranks of every host together: such iterations explain no device
    job = read_job(_run("r024-gpu-spike-tp2-pp4-dp2", LOADED))
    loc = Localizer(analysis="irregular", cell_noise=0.0)
    run = loc.prepare(job)
    a = IrregularAnalysis()
    sel = a.select(run)
    ev = a.gather(run, sel)
    assert 18 not in ev.common and all(c.ranks == (4,) for c in ev.causes if c.iteration == 18)
    assert len(ev.common) >= 5 and len({c.iteration for c in ev.causes}) <= 2


def test_components_group_by_shared_members():
    assert components([{1, 5}, {2, 3}, {5, "nic:5"}]) == [[0, 2], [1]]


def test_a_persistent_pair_fault_is_on_the_pairs_path():
    # p2p:1>5 3.4x slower from iteration 9 to the end (26 of 35 iterations): the channel's usual
    # level and spread come from its healthy iterations, not from the slowed majority
    r = localize(_run("r023-p2p-persistent-tp2-pp2-dp2-sp-do"))
    path = {"nic:1", "link:nic:1|switch:leaf-1", "switch:leaf-1", "link:nic:5|switch:leaf-1", "nic:5"}
    assert r.verdict == "culprit" and {d.id for d in r.devices[:2]} & path, [d.id for d in r.devices]


def test_a_single_stalled_all_reduce_is_not_an_nvswitch_fault():
    # r041 (development split, a 1.74x host from iteration 6): in iteration 6 one intra-host
    # all-reduce of ranks 1 and 3 took 90 ms instead of 2 ms while every other transfer through
    # nvswitch:0 ran as usual -- a one-off stall of gloo's TCP, seen in healthy runs too; it used
    # to be named second
    r = localize(REAL / "r041-host-persistent-tp2-pp2-dp2")
    assert [d.id for d in r.devices] == ["host:0"]
    assert any("one-off stall" in a and "nvswitch:0" in a for a in r.assumptions), r.assumptions


def test_a_host_hiccup_is_a_stall_and_a_slower_host_is_not():
    # r063 (development split, healthy): in iteration 23 the four ranks of host 0 each spent
    # ~15 ms more at one point of their compute while the rest of it ran as usual (the shared
    # CPUs' operating system); r015 (development split): host 1 had 1.6x more work in
    # iteration 5, stretching all of each rank's compute
    from holmes.cog.graph import CommOpGraph
    from holmes.localize.irregular.cells import CellEvidence

    def host_events(name):
        job = read_job(_run(name))
        g = CommOpGraph(job.communicators)
        for rank in range(job.world_size):
            g.add_rank(rank, job.ops(rank))
        cells = CellEvidence(g.ranks, g.members, job.topology.host_of)
        events = cells.events(job.topology, min_pvalue=0.3)
        return cells, [e for e in events if e.kind == "host"]

    cells, events = host_events("r063-healthy-tp2-pp2-dp2-ep2")
    hiccup = [e for e in events if e.iteration == 23]
    assert hiccup and hiccup[0].devices == ["host:0"] and cells.spread_ratio(hiccup[0]) < 0.25
    cells, events = host_events("r015-host-spike-tp2-pp2-dp3-do")
    slower = [e for e in events if e.iteration == 5]
    assert slower and slower[0].devices == ["host:1"] and cells.spread_ratio(slower[0]) > 0.5
    r = localize(_run("r063-healthy-tp2-pp2-dp2-ep2"))
    assert r.verdict == "healthy" and any("one-off stall" in a and "host:0" in a for a in r.assumptions), r.assumptions


def test_a_single_device_is_judged_on_its_own_calibration():
    # r006: a NIC slow in one iteration (family-wise p = 1e-6): a single device's cells are judged
    # against every other channel, and named from p = 1e-5 (``point_calibration``); judged as a
    # host or NVSwitch is (``tail_calibration``, named from 1e-7) it would not be
    # (the analysis's own evidence: calibration=None; the shipped calibration puts 0.989 at 0.86)
    run = _run("r006-nic-spike-tp4-pp2-dp2")
    r = Localizer(calibration=None).localize(run)
    assert r.verdict == "culprit" and r.devices[0].id in ("nic:10", "link:nic:10|switch:leaf-2")
    r = localize(run, point_calibration=1e6)
    assert r.verdict != "culprit" and r.devices == []
    # the strongest single device of a healthy development run (gpu:3, p = 2e-4) stays unnamed
    r = localize(_run("r071-healthy-tp2-pp2-dp4-ep2-sp"))
    assert r.verdict == "healthy" and r.devices == [], [(d.id, d.confidence) for d in r.all_devices[:3]]


def test_an_evenly_slower_gpu_is_judged_without_the_machines_one_off_stalls():
    # loaded r013: gpu:0 1.9x in scattered iterations of a machine at load 6-16, whose other ranks
    # stall single operators often; against those stalls its even slowdowns stood at p ~ 1e-4 each
    # and the run read inconclusive
    job = _run("r013-gpu-fluctuation-tp2-pp2-dp2", LOADED)
    r = localize(job)
    assert r.verdict == "culprit" and r.devices[0].id == "gpu:0", [(d.id, d.confidence) for d in r.all_devices[:3]]


def test_algorithm_1_lists_the_nics_no_cause_tells_apart_as_one_suspicion():
    # loaded r007: nic:14 fluctuates; on Algorithm 1's path every cause of the slow dp all-reduce
    # implicates nic:12 and nic:14 (and their cables) alike. nic:12 read 0.99 and nic:14 0.57 only
    # because chance crosses them differently, and nic:12 alone was named: a wrong answer at 0.99
    # Since noise_mad_floor (its fluctuating iterations weigh less on this loaded run) the group
    # reads 0.52 there: a candidate, not named; the grouping is what this test is about
    r = localize(_run("r007-nic-fluctuation-tp2-pp2-dp4-ep2-sp", LOADED), full_read=0)
    top = r.all_devices
    first = top[0]
    assert "nic:14" in (first.id, *first.alike), [(d.id, d.confidence) for d in top[:5]]
    group = [d for d in top if d.id in (first.id, *first.alike)]
    assert len(group) >= 2 and len({round(d.confidence, 6) for d in group}) == 1  # one suspicion, one probability
