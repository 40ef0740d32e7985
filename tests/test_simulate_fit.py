"""The simulator's defaults are fitted to reality (docs/simulator-fit.md, issue #14 part 3).

At the default shapes (default Workload, micro_batches = 4 x pp): compute is the largest share
of a healthy step, the iteration CV is in a GPU-cluster band, a 1.3x slower GPU stretches its
iterations by >= 10% wherever it sits in the pipeline, and its stage becomes the 1F1B
bottleneck (the other stages wait on it every micro-batch).
"""

from __future__ import annotations

import numpy as np
import pytest

from holmes.simulate import Workload, run_simulation
from holmes.simulate.program import RECV, SEND, default_micro_batches
from holmes.simulate.simulator import clock_model

SHAPE = dict(tp=4, pp=4, dp=4)  # the README's 64-GPU job
ITERS = 16
FROM = 4  # fault start (persistent)


@pytest.fixture(scope="module")
def healthy():
    return run_simulation(iterations=ITERS, seed=3, **SHAPE)


def _stretch(healthy, faulty, rank: int) -> float:
    return float(np.median(faulty.iteration_times(rank)[FROM:] / healthy.iteration_times(rank)[FROM:]))


def _shares(res, rank: int) -> tuple[float, float]:
    """(compute share, iteration CV) of ``rank`` over iterations 1.. (the first fills the pipeline)."""
    s, e = res.rank_times(rank, wall_clock=False)
    step = (res.iter_end[:, rank] - res.iter_start[:, rank])[1:].astype(float)
    in_ops = (e - s).sum(axis=1)[1:]
    return float(1 - in_ops.sum() / step.sum()), float(step.std(ddof=1) / step.mean())


def test_default_micro_batches_keep_the_bubble_small(healthy):
    assert default_micro_batches(1) == 4 and default_micro_batches(4) == 16 and default_micro_batches(8) == 32
    assert healthy.program.workload.micro_batches == 16
    P, M = SHAPE["pp"], healthy.program.workload.micro_batches
    assert (P - 1) / (M + P - 1) < 0.2  # Megatron's 1F1B bubble fraction


def test_compute_is_the_largest_share_and_iteration_cv_in_band(healthy):
    W = healthy.world_size
    for rank in (0, W // 2, W - 1):
        compute, cv = _shares(healthy, rank)
        assert compute >= 0.5, (rank, compute)  # published Megatron breakdowns: 60-80%
        assert 0.003 <= cv <= 0.03, (rank, cv)  # GPU clusters: ~1% (Holmes: delta < 1.04 is noise)


@pytest.mark.parametrize("stage", [0, 1, 3])
def test_a_13x_gpu_stretches_its_iterations_by_10pct(healthy, stage):
    W = healthy.world_size
    rank = stage * W // SHAPE["pp"] + 1
    faulty = run_simulation(iterations=ITERS, seed=3, faults=[f"gpu:{rank}@persistent:{FROM}*1.3"], **SHAPE)
    for r in (0, W // 2):  # the pivot and the median rank
        assert _stretch(healthy, faulty, r) >= 1.10, (stage, r, _stretch(healthy, faulty, r))


def test_the_issues_example_2x8x4_rank5():
    """Issue #14: 'a 2x slower GPU stretches a simulated iteration by only 6-8% (rank 5 of a
    2x8x4 job)'; at the default shapes a 1.3x one now stretches it by >= 10%, a 2x one by > 40%."""
    shape = dict(tp=2, pp=8, dp=4)
    h = run_simulation(iterations=12, seed=3, **shape)
    for factor, least in ((1.3, 1.10), (2.0, 1.4)):
        f = run_simulation(iterations=12, seed=3, faults=[f"gpu:5@persistent:{FROM}*{factor}"], **shape)
        for r in (0, 32):
            assert _stretch(h, f, r) >= least, (factor, r, _stretch(h, f, r))


def test_the_slow_stage_is_the_1f1b_bottleneck():
    """With stage 1 slow (1.3x), every other stage waits on it once per steady-state
    micro-batch: one of its P2P ops per micro-batch lasts ~0.3 x (forward + backward) longer."""
    quiet = Workload(jitter=0, tail_prob=0, xfer_jitter=0, xfer_tail_prob=0, iter_jitter=0, rank_iter_jitter=0)
    kw = dict(tp=1, pp=4, dp=1, iterations=3, seed=0, workload=quiet, clock_offset_us=0)
    h = run_simulation(**kw)
    f = run_simulation(faults=["gpu:1@persistent:0*1.3"], **kw)
    prog = h.program
    M, P = prog.workload.micro_batches, 4
    slot = 3 * quiet.fwd_ms * 1e6  # forward + backward compute of one micro-batch
    for stage in (0, 2, 3):
        sl = h.rank_slice(stage)
        p2p = np.flatnonzero(prog.op[sl] >= SEND)
        hs, he = h.rank_times(stage)
        fs, fe = f.rank_times(stage)
        longer = ((fe - fs) - (he - hs))[1, p2p]
        assert (longer > 0.25 * slot).sum() >= M - P + 1, (stage, longer)


def test_1f1b_dependencies_hold():
    """A stage enters the forward compute of micro-batch k only after receiving it, and a send
    and its receive complete together (blocking rendezvous)."""
    res = run_simulation(tp=1, pp=4, dp=1, iterations=2, seed=1)
    prog = res.program
    for stage in range(1, 4):
        sl = res.rank_slice(stage)
        s, e = res.rank_times(stage, wall_clock=False)
        rows = np.flatnonzero((prog.op[sl] == RECV) & (prog.peer[sl] == stage - 1))
        nxt = rows + 1
        assert (s[:, nxt] >= e[:, rows]).all()
        ps, pe = res.rank_times(stage - 1, wall_clock=False)
        psl = res.rank_slice(stage - 1)
        sends = np.flatnonzero((prog.op[psl] == SEND) & (prog.peer[psl] == stage))
        assert np.array_equal(np.sort(e[:, rows], axis=1), np.sort(pe[:, sends], axis=1))


def test_heavy_tail_and_clock_offsets():
    res = run_simulation(tp=2, pp=2, dp=2, iterations=40, seed=5)
    s, e = res.rank_times(0, wall_clock=False)
    prev = np.concatenate([res.iter_start[:, :1], e[:, :-1]], axis=1)
    gap = (s - prev).astype(float)
    rel = (gap / np.median(gap, axis=0))[:, np.median(gap, axis=0) > 0].ravel()
    z = np.log(rel)
    kurt = np.mean((z - z.mean()) ** 4) / np.var(z) ** 2
    assert kurt > 4  # a lognormal body alone has kurtosis 3 on the log scale
    # per-rank wall clocks: ranks of one host share an offset; durations are unchanged
    ws, we = res.rank_times(0)
    assert np.array_equal(we - ws, e - s)
    off = res.clock_offset
    assert off[0] != 0 and res.iterations_table(0).column("start_ns")[0].as_py() == res.iter_start[0, 0] + off[0]
    off, _ = clock_model(32, 8, seed=5, offset_us=100.0, drift_ppm=0.0)
    same_host = np.abs(np.diff(off.reshape(4, 8), axis=1)).max()
    assert same_host < 20_000 and np.ptp(off) > 5 * same_host  # ns: hosts ~100 us apart, GPUs of a host ~2 us
