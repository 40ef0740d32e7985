"""The ranks' own work from their compute tables, where the job has them (``compute/``).

CommOps logs hold only communication operators: without more, a rank's work between two of its
operators is the *gap* between them (:mod:`~holmes.localize.persistent.rank`), which also holds
launch delays, data loading and whatever else the rank waited for on its own. Where the source
recorded the work itself (WIA's forward/backward/optimizer ops, Kineto kernels: see
:meth:`holmes.io.Job.compute`), this module reads it:

* :func:`compute_by_iteration` -- per rank and window iteration, the time of its compute records
  (the persistent analysis's *own work*, measured instead of inferred);
* :func:`row_compute` -- per operator of the what-if program, the compute records that ran before
  it (since the rank's previous operator), and the same records at their name's mean over the
  job: WIA's ideal, where every forward pass lasts the job's mean forward pass.

A record belongs to the first operator of its rank and iteration that starts at or after the
record's midpoint (so clock jitter of a few microseconds between a record and the operator that
follows it does not move it); records after the iteration's last operator (the optimizer step)
count in :func:`compute_by_iteration` only. Everything is measured on the rank's own clock.

Examples
--------
>>> from holmes.io import MemoryJob, compute_table, ops_table
>>> ops = {r: ops_table(rank=[r] * 2, iteration=[0, 0], op_index=[0, 1], comm_id=["dp-0"] * 2, seq=[0, 1],
...                     op=["all_reduce"] * 2, peer=[None] * 2, nbytes=[8] * 2, start_ns=[100, 400],
...                     end_ns=[150, 450]) for r in (0, 1)}
>>> comp = {r: compute_table(rank=[r] * 2, iteration=[0, 0], name=["fwd", "opt"], start_ns=[160, 460],
...                          end_ns=[160 + 200 * (r + 1), 480]) for r in (0, 1)}
>>> job = MemoryJob({"world_size": 2, "communicators": {"dp-0": {"kind": "dp", "ranks": [0, 1]}}}, ops, compute=comp)
>>> compute_by_iteration(job, [0]).tolist()          # fwd + opt on each rank
[[220.0], [420.0]]
>>> rc = row_compute(job, [0], [0, 2, 4])
>>> rc.comp.tolist(), rc.ideal.tolist()              # fwd before each rank's 2nd operator; at the mean (300)
([0.0, 200.0, 0.0, 400.0], [0.0, 300.0, 0.0, 300.0])
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["RowCompute", "compute_by_iteration", "row_compute", "has_compute"]

log = logging.getLogger(__name__)


def _job(job: Any) -> Any:
    """The job behind a path, a Job / MemoryJob or a :class:`~holmes.localize.evidence.sources.JobSource`."""
    from holmes.localize.evidence.sources import open_source

    return open_source(job).job


def has_compute(job: Any) -> bool:
    """Whether the job holds compute tables (a job type without them: False)."""
    return bool(getattr(_job(job), "has_compute", False))


def _records(job: Any, r: int, win: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]] | None:
    """Rank ``r``'s records in the window: (window index, start, end, names), or None (no table)."""
    t = job.compute(r)
    if t is None:
        return None
    it = t.column("iteration").to_numpy()
    keep = np.isin(it, win)
    st = t.column("start_ns").to_numpy()[keep]
    en = t.column("end_ns").to_numpy()[keep]
    names = t.column("name").cast("string").to_numpy(zero_copy_only=False)[keep].tolist()
    return np.searchsorted(win, it[keep]), st.astype(np.int64), en.astype(np.int64), names


def compute_by_iteration(job: Any, window: Sequence[int], ranks: Sequence[int] | None = None) -> np.ndarray | None:
    """Per rank and window iteration, the nanoseconds of its compute records.

    Parameters
    ----------
    job : path, Job, MemoryJob or JobSource
    window : sequence of int
        The iterations (increasing), e.g. :func:`~holmes.localize.persistent.rank.persistent_window`.
    ranks : sequence of int, optional
        The ranks to read (default every rank).

    Returns
    -------
    float64 array (world_size, len(window)) or None
        None when the job has no compute tables; NaN rows for ranks without one (their own work
        is then the gaps between their operators). A drop-in for the persistent analysis's
        ``Folded.compute`` (same unit, same shape) where every rank has a table.
    """
    j = _job(job)
    if not getattr(j, "has_compute", False):
        return None
    win = np.asarray(window, dtype=np.int64)
    out = np.full((j.world_size, len(win)), np.nan)
    for r in (range(j.world_size) if ranks is None else ranks):
        got = _records(j, int(r), win)
        if got is None:
            continue
        widx, st, en, _ = got
        out[int(r)] = np.bincount(widx, weights=(en - st).astype(np.float64), minlength=len(win))
    return out


@dataclass
class RowCompute:
    """Per operator row of a what-if program (rank-major, the window's iterations in order).

    Attributes
    ----------
    comp : float64 array
        The ns of the rank's compute records that ran before the operator (since its previous one).
    ideal : float64 array
        The same records, each at its name's mean over every rank and window iteration (WIA's ideal).
    covered : bool array (world_size,)
        Ranks whose compute table was read (the others' rows hold 0).
    names : dict of str -> float
        Per record name, its mean duration (ns) over the job.
    rec_rank, rec_it, rec_row, rec_code, rec_dur : arrays
        Per record read (window iterations): its rank, its window iteration, its row (-1: after the
        iteration's last operator), the index of its name in ``names`` and its duration (ns).
    tail, tail_ideal : float64 arrays (world_size, T)
        Per rank and window iteration, its records after its last operator (the optimizer step), as
        logged and at their names' means (the replay's ``tail``).
    """

    comp: np.ndarray
    ideal: np.ndarray
    covered: np.ndarray
    names: dict[str, float]
    rec_rank: np.ndarray
    rec_it: np.ndarray
    rec_row: np.ndarray
    rec_code: np.ndarray
    rec_dur: np.ndarray
    tail: np.ndarray
    tail_ideal: np.ndarray

    def at_peers(self, ranks: Sequence[int], peers: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """``(comp, tail)`` with the records of ``ranks`` at their name's mean over ``peers``: a
        suspect's work at its role peers' level, for its what-if impact (``comp`` per row, for
        :func:`~holmes.localize.persistent.whatif.swap_compute`; ``tail`` per rank and iteration, the replay's).
        A name the peers never ran keeps its records as logged.

        >>> rc = RowCompute(np.array([4.0, 9.0]), np.zeros(2), np.ones(2, bool), {"fwd": 6.5, "opt": 2.0},
        ...                 np.array([0, 1, 0, 1]), np.zeros(4, np.int64), np.array([0, 1, -1, -1]),
        ...                 np.array([0, 0, 1, 1]), np.array([4.0, 9.0, 1.0, 3.0]),
        ...                 np.array([[1.0], [3.0]]), np.array([[2.0], [2.0]]))
        >>> comp, tail = rc.at_peers([1], [0])
        >>> comp.tolist(), tail.tolist()
        ([4.0, 4.0], [[1.0], [1.0]])
        """
        K = len(self.names)
        pm = np.isin(self.rec_rank, np.asarray(peers, dtype=np.int64))
        cnt = np.bincount(self.rec_code[pm], minlength=K)
        with np.errstate(divide="ignore", invalid="ignore"):
            mean = np.bincount(self.rec_code[pm], weights=self.rec_dur[pm], minlength=K) / cnt
        mine = np.isin(self.rec_rank, np.asarray(ranks, dtype=np.int64))
        delta = np.where(cnt[self.rec_code] > 0, mean[self.rec_code], self.rec_dur) - self.rec_dur
        m = mine & (self.rec_row >= 0)
        out = self.comp.copy()
        np.add.at(out, self.rec_row[m], delta[m])
        tail = self.tail.copy()
        a = mine & (self.rec_row < 0) & self.covered[self.rec_rank]
        np.add.at(tail, (self.rec_rank[a], self.rec_it[a]), delta[a])
        return out, tail


def row_compute(job: Any, window: Sequence[int], rank_ptr: Sequence[int]) -> RowCompute | None:
    """The compute records before every operator of a what-if program, as logged and at the ideal.

    Parameters
    ----------
    job : path, Job, MemoryJob or JobSource
    window : sequence of int
        The program's iterations.
    rank_ptr : sequence of int (world_size + 1)
        The program's rows of rank ``r`` are ``rank_ptr[r]:rank_ptr[r + 1]``: the rank's operators
        of the window in the order of its checked log (``Job.ops``), as
        :func:`~holmes.localize.persistent.rank.summarize_table` keeps them.

    Returns
    -------
    RowCompute or None
        None when the job has no compute tables. A rank whose table is missing, or whose log holds
        another number of window operators than the program, is left uncovered (its rows 0).
    """
    j = _job(job)
    if not getattr(j, "has_compute", False):
        return None
    win = np.asarray(window, dtype=np.int64)
    ptr = np.asarray(rank_ptr, dtype=np.int64)
    n = int(ptr[-1])
    W = len(ptr) - 1
    covered = np.zeros(W, np.bool_)
    rows, codes, durs, rks, its = [], [], [], [], []
    code: dict[str, int] = {}
    for r in range(W):
        got = _records(j, r, win)
        if got is None:
            continue
        widx, st, en, names = got
        c = np.array([code.setdefault(x, len(code)) for x in names], np.int64)
        mid = (st + en) // 2
        row = np.full(len(st), -1, np.int64)
        lo, hi = int(ptr[r]), int(ptr[r + 1])
        if hi > lo:
            try:
                ops = j.ops(r)
            except Exception as exc:  # noqa: BLE001 - an unreadable log: the rank is simply not covered
                log.info("compute: rank %d not covered (%s)", r, exc)
                ops = None
            if ops is not None:
                it = ops.column("iteration").to_numpy()
                sel = np.isin(it, win)
                o_w = np.searchsorted(win, it[sel])
                o_st = ops.column("start_ns").to_numpy()[sel]
                if len(o_st) == hi - lo and not (np.diff(o_w) < 0).any():
                    for t in np.unique(widx).tolist():
                        a, b = int(np.searchsorted(o_w, t, "left")), int(np.searchsorted(o_w, t, "right"))
                        m = widx == t
                        if b > a:  # the first operator starting at or after the midpoint: on the running max
                            k = np.searchsorted(np.maximum.accumulate(o_st[a:b]), mid[m], "left")
                            row[m] = np.where(k < b - a, lo + a + k, -1)
                    covered[r] = True
        rows.append(row)
        rks.append(np.full(len(row), r, np.int64))
        its.append(widx.astype(np.int64))
        codes.append(c)
        durs.append((en - st).astype(np.float64))
    T = len(win)
    if not rows:
        e = np.zeros(0, np.int64)
        return RowCompute(np.zeros(n), np.zeros(n), covered, {}, e, e, e, e, np.zeros(0), np.zeros((W, T)),
                          np.zeros((W, T)))
    row, c, d = np.concatenate(rows), np.concatenate(codes), np.concatenate(durs)
    mean = np.bincount(c, weights=d, minlength=len(code)) / np.maximum(np.bincount(c, minlength=len(code)), 1)
    m = row >= 0
    comp = np.bincount(row[m], weights=d[m], minlength=n)
    ideal = np.bincount(row[m], weights=mean[c[m]], minlength=n)
    rk, wi = np.concatenate(rks), np.concatenate(its)
    after = ~m & covered[rk]   # records after the last operator of a covered rank's iteration
    tail = np.bincount(rk[after] * T + wi[after], weights=d[after], minlength=W * T).reshape(W, T)
    tail_ideal = np.bincount(rk[after] * T + wi[after], weights=mean[c[after]], minlength=W * T).reshape(W, T)
    return RowCompute(comp, ideal, covered, {k: float(mean[v]) for k, v in code.items()}, rk, wi, row, c, d, tail,
                      tail_ideal)
