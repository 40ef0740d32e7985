"""The persistent analysis's gather as map (chunks of ranks) and reduce (blocks of slots): the same
tables, replays and report whatever the chunks and blocks, and the same as one fold of every rank."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from holmes.io import MemoryJob
from holmes.localize import localize
from holmes.localize.persistent import gather
from holmes.localize.persistent.gather import gather_folded
from holmes.localize.persistent.partials import replayed_iterations
from holmes.localize.persistent.rank import persistent_summaries, persistent_window
from holmes.localize.persistent.partials import fold
from holmes.localize.persistent.whatif import replay


@pytest.fixture(scope="module")
def job():
    from holmes.simulate import run_simulation

    # more iterations than the replays run on (whatif_iterations: 32): the program keeps only theirs
    return run_simulation(tp=2, pp=2, dp=4, iterations=40, seed=5, faults=["gpu:6@persistent:0-39*1.3"]).to_memory_job()


@pytest.fixture(scope="module")
def whole(job):
    win = persistent_window(job)
    return win, fold(persistent_summaries(job, win), job.communicators)


def _report(job) -> dict:
    d = json.loads(localize(job, analysis="persistent").dumps())
    d.pop("timing", None)
    return d


@settings(max_examples=6, deadline=None)
@given(chunk=st.integers(1, 16), nblocks=st.integers(1, 5), restricted=st.booleans())
def test_any_chunks_and_blocks_fold_the_tables_and_replays_of_one_fold(job, whole, chunk, nblocks, restricted):
    win, g = whole
    its = replayed_iterations(len(win))
    assert its is not None and len(its) < len(win)
    f, missing = gather_folded(job, win, job.communicators, chunk=chunk, nblocks=nblocks, program_its=its,
                               restricted=restricted)
    assert missing == {}
    for k in ("caused", "compute", "present", "X", "NB", "CNT"):
        assert np.array_equal(getattr(f, k), getattr(g, k)), k
    assert f.slot_info == g.slot_info
    want = replay(g.program, iterations=its)[its]
    got = replay(f.program) if restricted else replay(f.program, iterations=f.replay_its)[its]
    assert np.array_equal(got, want) and np.isfinite(want).all()
    # the ideal's transfers (per-type medians) and the rows' gaps at the rows the replays read
    rows = np.isin(g.row_it, its)
    assert np.array_equal(f.program.gap, g.program.gap[rows] if restricted else g.program.gap)
    assert np.array_equal(f.type_x[f.inst_type][f.program.inst],
                          (g.type_x[g.inst_type][g.program.inst])[rows if restricted else slice(None)])
    assert len(f.program.inst) == (int(rows.sum()) if restricted else len(g.program.inst))


def test_the_report_does_not_depend_on_the_chunks_or_blocks(job, monkeypatch):
    ref = _report(job)
    assert ref["devices"][0]["id"] == "gpu:6"
    monkeypatch.setattr(gather, "INPROCESS_CHUNK", 3)
    monkeypatch.setattr(gather, "INPROCESS_BLOCKS", 4)
    assert _report(job) == ref


def test_a_missing_rank_is_reported_whatever_its_chunk(job, monkeypatch):
    holed = MemoryJob(job.meta, {r: job.ops(r) for r in range(job.world_size) if r != 9})
    ref = _report(holed)
    assert "9" in ref["missing_ranks"] and any("unreadable" in a for a in ref["assumptions"])
    monkeypatch.setattr(gather, "INPROCESS_CHUNK", 5)
    monkeypatch.setattr(gather, "INPROCESS_BLOCKS", 3)
    assert _report(holed) == ref
    win = persistent_window(holed)
    _, missing = gather_folded(holed, win, holed.communicators, chunk=4, nblocks=2)
    assert list(missing) == [9]


def test_the_program_holds_only_the_replayed_iterations(job, whole):
    win, g = whole
    its = replayed_iterations(len(win))
    f, _ = gather_folded(job, win, job.communicators, program_its=its, restricted=True)
    assert f.program.num_iterations == len(its) and f.replay_its is None
    assert np.array_equal(np.unique(f.row_it), its) and f.gap_sum is not None
    assert len(f.program.x) < len(g.program.x)
