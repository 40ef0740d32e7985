"""Watch parity (issue #37): real runs replayed as parts; what the watcher emits against offline reports.

``benchmarks/watch_parity.py`` runs the whole of ``fixtures/real`` and ``fixtures/real-loaded``;
these tests take a few runs each: offline culprits the watcher used to miss behind a long episode
or outside any episode, healthy runs, and every event's report against :func:`holmes.localize`
of the same iterations of the finished job."""

from __future__ import annotations

from pathlib import Path

import pyarrow.compute as pc
import pytest

import holmes
from holmes.io import MemoryJob
from holmes.localize import Localizer
from holmes.watch import Watcher
from holmes.watch.replay import replay_as_parts, watch_parity

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real"
LOADED = REAL.parent / "real-loaded"


def _run(root: Path, name: str) -> Path:
    p = root / name
    if not (p / "job.json").is_file():
        pytest.skip(f"{p} missing (python scripts/real_runs.py corpus)")
    return p


@pytest.mark.parametrize("root,name", [
    (REAL, "r026-gpu-persistent-tp2-pp2-dp4"),      # before: irregular 6 healthy, straggler 12 healthy, nothing after
    (REAL, "r008-nic-persistent-tp2-pp2-dp4"),      # before: irregular 4 healthy, straggler 12 healthy
    (REAL, "r003-host-spike-tp2-pp2-dp4"),          # before: irregular 9 inconclusive, straggler 14 healthy
    (LOADED, "r050-gpu-persistent-tp2-pp2-dp2-ep2"),  # before: irregular 5 healthy, straggler 13 healthy
])
def test_offline_culprit_is_an_event_naming_the_same_device(root, name, tmp_path):
    p = watch_parity(_run(root, name), tmp_path, per_part=5)
    assert p.offline_verdict == "culprit"
    assert p.caught, (p.offline_device, p.events)


@pytest.mark.parametrize("root,name", [
    (REAL, "r061-healthy-tp2-pp2-dp3-do"), (REAL, "r067-healthy-tp2-pp2-dp4"),
    (LOADED, "r061-healthy-tp2-pp2-dp3-do"),  # before the warm-up rule: irregular 5 culprit switch:leaf-0, leaf-2
    (LOADED, "r072-healthy-tp2-pp2-dp4"),     # before the warm-up rule: irregular 7 culprit host:3
    # before the episode's window had the job before it as context: irregular 27 culprit nic:3
    # (iterations 14-27 alone), irregular 26 culprit gpu:0 (17-26 alone)
    (LOADED, "r068-healthy-tp2-pp2-dp2-ep2"), (LOADED, "r049-gpu-fluctuation-tp2-pp2-dp4"),
    # before early episodes waited for the monitor's window: irregular 3 culprit nvswitch:2 (iterations 0-3)
    (REAL, "r021-p2p-spike-tp2-pp2-dp4"),
])
def test_healthy_run_gets_no_culprit_event(root, name, tmp_path):
    p = watch_parity(_run(root, name), tmp_path, per_part=5)
    # offline names nothing (r049, a 1.53x GPU fluctuation the loaded machine hides, reads
    # inconclusive with the right GPU a candidate since session 17's even null; healthy before)
    assert p.offline_verdict in ("healthy", "inconclusive") and p.offline_device is None
    assert not [e for e in p.events if e[2] in ("culprit", "hang")], p.events


def _window(job, lo: int, hi: int) -> MemoryJob:
    ops = {}
    for r in range(job.world_size):
        t = job.ops(r)
        it = t.column("iteration")
        ops[r] = t.filter(pc.and_(pc.greater_equal(it, lo), pc.less_equal(it, hi)))
    return MemoryJob(job.meta, ops, topology=job.topology)


def test_each_event_is_the_offline_report_of_its_window(tmp_path):
    """An event's report is holmes.localize of the same iterations of the finished job."""
    src = _run(REAL, "r026-gpu-persistent-tp2-pp2-dp4")
    job = holmes.read_job(src)
    live = replay_as_parts(src, tmp_path / "live", per_part=5)
    w = Watcher(live, once=True)
    events = [e for e in w if e.report and "verdict" in e.report]
    assert any(e.report["verdict"] == "culprit" for e in events)
    for e in events:
        lo, hi = e.detail["window"]
        params = w.params.replace(analysis=e.report["params"]["analysis"], window=max(2, hi - lo + 1),
                                  search_from=e.report["params"]["search_from"])
        off = Localizer(params).localize(_window(job, lo, hi))
        assert off.verdict == e.report["verdict"], (e.event, e.iteration, off.verdict, e.report["verdict"])
        assert [d.id for d in off.devices] == [d["id"] for d in e.report["devices"]]


def test_replay_refuses_an_existing_directory(tmp_path):
    from holmes.errors import ConfigError

    src = _run(REAL, "r061-healthy-tp2-pp2-dp3-do")
    replay_as_parts(src, tmp_path / "live", per_part=10)
    with pytest.raises(ConfigError, match="exists"):
        replay_as_parts(src, tmp_path / "live")
    with pytest.raises(ConfigError, match="per_part"):
        replay_as_parts(src, tmp_path / "other", per_part=0)


def test_a_rank_that_died_before_writing_lands_no_part_and_the_hang_is_caught(tmp_path):
    # rank 3 of this job exited before its first write (no log): the replay used to raise
    # MissingRankError, so the hang corpus could not be watched at all
    job = _run(REAL.parent / "real-hang", "h004-exit-send-tp1-pp4-dp4-s0")
    p = watch_parity(job, tmp_path, per_part=5)
    assert not (tmp_path / "live" / "ranks" / "rank-00003").exists()
    assert (tmp_path / "live" / "ranks" / "rank-00002").is_dir()
    assert p.offline_verdict == "hang" and p.caught
    assert any(e[0] == "hang" and e[3][:1] == (p.offline_device,) for e in p.events), p.events


def test_healthy_run_silent_and_faulted_run_caught_by_the_same_mechanisms(tmp_path):
    """A healthy replayed run gets no culprit event, while a faulted run whose fault shows in its
    first iterations still does, naming offline's device once the monitor's window is full, and
    a later episode is still searched (the job before it only as context)."""
    healthy = watch_parity(_run(LOADED, "r068-healthy-tp2-pp2-dp2-ep2"), tmp_path / "h", per_part=5)
    assert healthy.offline_verdict == "healthy"
    assert not [e for e in healthy.events if e[2] == "culprit"], healthy.events
    src = _run(REAL, "r042-nic-spike-tp2-pp4-dp2")
    faulted = watch_parity(src, tmp_path / "f", per_part=5)
    assert faulted.offline_verdict == "culprit" and faulted.caught
    named = [e for e in faulted.events if e[2] == "culprit"]
    assert named and all(e[3][0] == faulted.offline_device for e in named), faulted.events
    assert named[0][1] < 20  # the early episode, judged over the job's first 20 iterations
    live = replay_as_parts(src, tmp_path / "live", per_part=5)
    ev = [e for e in Watcher(live, once=True) if e.event == "irregular"]
    assert ev[0].detail["judged_at"] >= 19 and ev[0].detail["window"][0] == 0
    later = [e for e in ev[1:] if "searched_from" in e.detail]
    assert later and all(e.detail["window"][0] < e.detail["searched_from"] <= e.iteration for e in later)


def test_search_from_keeps_earlier_iterations_as_context():
    """``search_from``: a spike before it is context (not searched, no device), after it is named."""
    from holmes.simulate import run_simulation

    job = run_simulation(tp=2, pp=2, dp=2, iterations=40, seed=3, faults=["gpu:5@spike:12*3"]).to_memory_job()
    full = holmes.localize(job, analysis="irregular")
    assert full.devices and full.devices[0].id == "gpu:5"
    ctx = holmes.localize(job, analysis="irregular", search_from=20)
    assert "gpu:5" not in [d.id for d in ctx.all_devices]
    assert any("context (search_from=20)" in a for a in ctx.assumptions)
    assert ctx.verdict != "culprit"
