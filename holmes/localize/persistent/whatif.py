"""What-if replay: how long would each step last if some ranks computed or transferred faster?

The replay re-runs every iteration through the dependency graph of its operators (the COG: each
rank's operators in issue order, each collective joined by its members, each P2P op by its two
ends) from per-operator summaries that need no wall clock:

* ``gap`` -- the rank's own work before it issued the operator (its start minus the end of the
  rank's previous operators, on its own clock; operators issued while an earlier one was still
  running, e.g. Megatron's batched send/recv, form one *batch* issued together);
* ``x`` -- the operator's intrinsic transfer time: the shortest duration over its members (the
  last member to enter waits for no one).

A rank issues a batch ``gap`` after its previous batch completed; an operator completes ``x``
after its last member issued it; a rank's next batch waits for every operator of its batch but
the *detached* ones (still in flight when the rank went on in the log: an async ``isend``, a DDP
bucket), which only its step's end waits for. Each iteration starts all ranks at 0; its step is
the time the last rank finishes. Replaying with the
actual gaps and transfers reproduces the logged steps; replaying with a suspect's gaps or a slow
group's transfers set to its peers' tells how much shorter the step would be without it (WIA's
what-if analysis, on communication logs).

Examples
--------
Two ranks, one all-reduce each iteration; rank 1 computes 5 before it, rank 0 only 1:

>>> prog = Program.from_arrays(rank_ptr=[0, 2, 4], iter_ptr=[[0, 1, 2], [2, 3, 4]],
...                            inst=[0, 1, 0, 1], gap=[1.0, 1.0, 5.0, 5.0], new_batch=[1, 1, 1, 1],
...                            x=[2.0, 2.0], size=[2, 2])
>>> replay(prog).tolist()                      # steps: 5 + 2 each
[7.0, 7.0]
>>> replay(prog, gap=np.array([1.0, 1.0, 1.0, 1.0])).tolist()
[3.0, 3.0]
>>> replay(prog, iterations=np.array([1])).tolist()
[nan, 7.0]

Rank 0 sends to rank 1 (x 4), then computes 3 before a receive from rank 1 (x 1), which rank 1
sends after computing 1; the send ran detached, as gloo's ``isend`` does:

>>> p2p = dict(rank_ptr=[0, 2, 4], iter_ptr=[[0, 2], [2, 4]], inst=[0, 1, 0, 1], gap=[0.0, 3.0, 0.0, 1.0],
...            new_batch=[1, 1, 1, 1], x=[4.0, 1.0], size=[2, 2])
>>> replay(Program.from_arrays(**p2p, detached=[1, 0, 0, 0])).tolist()   # receive issued at 3, sent at 5
[6.0]
>>> replay(Program.from_arrays(**p2p)).tolist()                          # waiting for its send: at 7
[8.0]
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from holmes._jit import njit

__all__ = ["Program", "replay", "ideal_gaps", "swap_compute"]

log = logging.getLogger(__name__)


@dataclass
class Program:
    """The operators of a job in replayable form (rows rank-major, iterations in order).

    Attributes
    ----------
    rank_ptr : int64 array (W + 1)
        Rows of rank ``r`` are ``rank_ptr[r]:rank_ptr[r + 1]``.
    iter_ptr : int64 array (W, T + 1)
        Rows of rank ``r`` in iteration ``t`` are ``iter_ptr[r, t]:iter_ptr[r, t + 1]``.
    inst : int64 array
        Per row, the operator instance it belongs to (shared by its members).
    gap : float64 array
        Per row, the rank's own work before it (0 inside a batch).
    new_batch : bool array
        Per row, whether it starts a batch.
    x : float64 array
        Per instance, its intrinsic transfer time.
    size : int64 array
        Per instance, how many rows (members) take part.
    """

    rank_ptr: np.ndarray
    iter_ptr: np.ndarray
    inst: np.ndarray
    gap: np.ndarray
    new_batch: np.ndarray
    x: np.ndarray
    size: np.ndarray
    #: per row, its rank (optional: the replay derives it from ``rank_ptr``; given, it is not rebuilt
    #: for every replay)
    row_rank: np.ndarray | None = None
    #: per row, whether the rank went on past it while it ran (optional, default none): its batch
    #: does not wait for it; the rank's step ends no earlier than it completes
    detached: np.ndarray | None = None

    @classmethod
    def from_arrays(cls, **kw: object) -> "Program":
        """A program from plain sequences (converted to the dtypes the replay needs)."""
        dt = dict(rank_ptr=np.int64, iter_ptr=np.int64, inst=np.int64, gap=np.float64, new_batch=np.bool_,
                  x=np.float64, size=np.int64, detached=np.bool_)
        return cls(**{k: np.ascontiguousarray(np.asarray(v, dtype=dt[k])) for k, v in kw.items()})

    @property
    def world_size(self) -> int:
        return len(self.rank_ptr) - 1

    @property
    def num_iterations(self) -> int:
        return self.iter_ptr.shape[1] - 1


def replay(prog: Program, *, gap: np.ndarray | None = None, x: np.ndarray | None = None,
           iterations: np.ndarray | None = None, tail: np.ndarray | None = None) -> np.ndarray:
    """Per iteration, the replayed step (same unit as the gaps); NaN where the dependencies of an
    iteration cannot be resolved (its operators do not match across ranks) and, when
    ``iterations`` (indices into the program's iterations) is given, for the iterations not in it.
    ``tail`` (W, T): per rank and iteration, its work after its last operator (where the job's
    compute tables record it: the optimizer step), added to its finish."""
    g = prog.gap if gap is None else np.ascontiguousarray(gap, dtype=np.float64)
    xx = prog.x if x is None else np.ascontiguousarray(x, dtype=np.float64)
    n = len(prog.inst)
    rank_of = prog.row_rank if prog.row_rank is not None else \
        np.repeat(np.arange(prog.world_size, dtype=np.int32), np.diff(prog.rank_ptr))
    out = np.full(prog.num_iterations, np.nan)
    its = np.arange(prog.num_iterations, dtype=np.int64) if iterations is None else \
        np.ascontiguousarray(iterations, dtype=np.int64)
    tl = np.zeros((prog.world_size, prog.num_iterations)) if tail is None else \
        np.ascontiguousarray(tail, dtype=np.float64)
    nxt = np.empty(n, np.int32 if n <= np.iinfo(np.int32).max else np.int64)  # row links: row numbers
    det = prog.detached if prog.detached is not None else np.zeros(n, np.bool_)
    _replay(prog.iter_ptr, prog.inst, g, prog.new_batch, det, xx, prog.size, rank_of, nxt, its, out, tl)
    return out


def ideal_gaps(gap: np.ndarray, row_rank: np.ndarray, row_it: np.ndarray, shape: tuple[int, int],
               present: np.ndarray, comp: np.ndarray | None = None, comp_ideal: np.ndarray | None = None, *,
               rest_sum: np.ndarray | None = None) -> np.ndarray:
    """Per program row, its gap in the what-if *ideal* (WIA's: no variation along rank, stage or iteration).

    A gap is the rank's compute records before the operator, where the job has compute tables
    (``comp``; see :func:`holmes.localize.persistent.compute_source.row_compute`), and the rest of it -- launch
    delays, data loading, and all of the gap where nothing was recorded. In the ideal the records
    last their name's mean over the job (``comp_ideal``; the share of them the gap holds: records
    that ran while an operator was in flight were not in the gap), and each rank's rest in each
    iteration is scaled to the job's mean rest (in proportion over its gaps). Without compute
    tables every rank's work in every iteration is thus at the job's mean, its gaps scaled alike.

    Parameters
    ----------
    gap : float64 array
        Per row, the logged gap.
    row_rank, row_it : int arrays
        Per row, its rank and window iteration.
    shape : (W, T)
    present : bool array (W,)
        Ranks with rows (the mean is over them).
    comp, comp_ideal : float64 arrays, optional
        Per row, the compute records before it, as logged and at their names' means.
    rest_sum : float64 array (W, T), optional
        Per rank and iteration the sum of the rest over *all* its rows, where the rows given are
        only some (a program of the replayed iterations; without ``comp`` it is the sum of the
        gaps). Default: from the rows given.

    Examples
    --------
    Two ranks, one gap each: rank 1 computes 6 where rank 0 computes 2 (records of one name), and
    idles 1 where rank 0 idles 3:

    >>> g = np.array([5.0, 7.0])
    >>> ideal_gaps(g, np.array([0, 1]), np.array([0, 0]), (2, 1), np.ones(2, bool)).tolist()   # gaps only
    [6.0, 6.0]
    >>> ideal_gaps(g, np.array([0, 1]), np.array([0, 0]), (2, 1), np.ones(2, bool),
    ...            comp=np.array([2.0, 6.0]), comp_ideal=np.array([4.0, 4.0])).tolist()
    [6.0, 6.0]
    """
    W, T = shape
    gap = np.asarray(gap, dtype=np.float64)
    if comp is None or comp_ideal is None:  # no compute records: the rest is the whole gap (two arrays of the rows, not six)
        rest = np.maximum(gap, 0.0)
        R = rest_sum if rest_sum is not None else \
            np.bincount(row_rank.astype(np.int64) * T + row_it, weights=rest, minlength=W * T).reshape(W, T)
        rest *= _rest_factor(R, present)[row_rank, row_it]
        rest += 0.0  # as rest * f + 0 (no negative zero)
        return rest
    with np.errstate(divide="ignore", invalid="ignore"):
        held = np.where(comp > 0, np.clip(gap / comp, 0.0, 1.0), 0.0)
    rest = np.maximum(gap - comp, 0.0)
    R = rest_sum if rest_sum is not None else \
        np.bincount(row_rank.astype(np.int64) * T + row_it, weights=rest, minlength=W * T).reshape(W, T)
    return rest * _rest_factor(R, present)[row_rank, row_it] + comp_ideal * held


def _rest_factor(R: np.ndarray, present: np.ndarray) -> np.ndarray:
    """Per rank and iteration, the factor that brings its rest ``R`` to the job's mean rest."""
    r_all = float(R[present].mean()) if np.any(present) else 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(R > 0, r_all / R, 1.0)


def swap_compute(gap: np.ndarray, comp: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Per row, its gap with the compute records before it lasting ``new`` instead of ``comp`` (the
    share of them the gap holds: see :func:`ideal_gaps`), e.g. a suspect's records at its peers'
    level (:meth:`holmes.localize.persistent.compute_source.RowCompute.at_peers`) for its what-if impact.

    >>> swap_compute(np.array([5.0, 3.0]), np.array([4.0, 6.0]), np.array([2.0, 3.0])).tolist()
    [3.0, 1.5]
    """
    gap = np.asarray(gap, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        held = np.where(comp > 0, np.clip(gap / comp, 0.0, 1.0), 0.0)
    return np.maximum(gap + (new - comp) * held, 0.0)


@njit(cache=True, nogil=True)
def _completed(det, r, e, pending, dmax, outstanding, bmax):  # pragma: no cover - compiled
    # one of rank r's operators completed at e: a detached one only moves its step's end
    if det:
        pending[r] -= 1
        if e > dmax[r]:
            dmax[r] = e
    else:
        outstanding[r] -= 1
        if e > bmax[r]:
            bmax[r] = e


@njit(cache=True, nogil=True)
def _replay(iter_ptr, inst, gap, new_batch, detached, x, size, rank_of, nxt, its, out, tail
            ):  # pragma: no cover - compiled
    W = iter_ptr.shape[0]
    n_inst = len(x)
    maxs = np.zeros(n_inst)
    cnt = np.zeros(n_inst, np.int64)
    head = np.full(n_inst, -1, np.int64)
    pos = np.zeros(W, np.int64)
    qend = np.zeros(W, np.int64)
    outstanding = np.zeros(W, np.int64)
    bmax = np.zeros(W)
    clock = np.zeros(W)
    dmax = np.zeros(W)          # per rank, when its detached operators completed
    pending = np.zeros(W, np.int64)
    issued = np.zeros(W, np.bool_)
    stack = np.empty(W + 1, np.int64)
    onstack = np.zeros(W, np.bool_)
    for t in its:
        sp = 0
        for r in range(W):
            pos[r] = iter_ptr[r, t]
            clock[r] = 0.0
            dmax[r] = 0.0
            pending[r] = 0
            issued[r] = False
            outstanding[r] = 0
            stack[sp] = r
            sp += 1
            onstack[r] = True
        while sp > 0:
            sp -= 1
            r = stack[sp]
            onstack[r] = False
            hi = iter_ptr[r, t + 1]
            while pos[r] < hi:
                if not issued[r]:
                    p = pos[r]
                    q = p + 1
                    while q < hi and not new_batch[q]:
                        q += 1
                    qend[r] = q
                    start = clock[r] + gap[p]
                    bmax[r] = start
                    outstanding[r] = 0
                    for j in range(p, q):
                        if detached[j]:
                            pending[r] += 1
                        else:
                            outstanding[r] += 1
                    issued[r] = True
                    for j in range(p, q):
                        i = inst[j]
                        if start > maxs[i]:
                            maxs[i] = start
                        cnt[i] += 1
                        if cnt[i] >= size[i]:
                            e = maxs[i] + x[i]
                            k = head[i]
                            while k >= 0:
                                rr = rank_of[k]
                                _completed(detached[k], rr, e, pending, dmax, outstanding, bmax)
                                if not detached[k] and outstanding[rr] == 0 and rr != r and not onstack[rr]:
                                    stack[sp] = rr
                                    sp += 1
                                    onstack[rr] = True
                                k = nxt[k]
                            head[i] = -1
                            _completed(detached[j], r, e, pending, dmax, outstanding, bmax)
                        else:
                            nxt[j] = head[i]
                            head[i] = j
                if outstanding[r] == 0:
                    clock[r] = bmax[r]
                    pos[r] = qend[r]
                    issued[r] = False
                else:
                    break
        step = 0.0
        ok = True
        for r in range(W):
            if pos[r] < iter_ptr[r, t + 1] or pending[r] != 0:
                ok = False
            fin = max(clock[r] + tail[r, t], dmax[r])
            if fin > step:
                step = fin
        out[t] = step if ok else np.nan
        if not ok:  # clear what the blocked ranks left behind
            for r in range(W):
                for j in range(iter_ptr[r, t], iter_ptr[r, t + 1]):
                    head[inst[j]] = -1
