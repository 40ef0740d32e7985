"""A rank's own work between its communication operators, where the log says when it waited.

A rank's *gap* before an operator is the time it spent on its own work (compute, data loading,
the optimizer) since it could last go on: for a synchronous operator, since the previous one
returned (``start[i] - end[i - 1]``). An asynchronous operator (``isend``/``irecv``, a bucket's
``all_reduce(async_op=True)``) returns at once; the rank blocks on it only later, in
``Work.wait()``, and only until it completes. Its row's ``end_ns`` is when it completed -- for
gloo's point-to-point works, which have no completion callback, the moment ``wait()`` returned,
possibly long after the rank went on computing. Read as if synchronous, every gap inside that
interval reads 0: a pipeline stage's work while its sends are open (GPipe waits on them at the end
of the phase) vanished, and so did any stall it made there, while the same stall on a rank whose
schedule had no open send showed in full.

The logger's optional ``return_ns`` and ``wait_ns`` columns (``docs/formats.md``) say when the
call that issued the operator returned (gloo's ``batch_isend_irecv`` may block in it) and when the
rank entered ``wait()``. Where ``wait_ns`` is set, the rank is blocked from the operator's start to
``return_ns`` (its ``start`` when not given), free until ``wait_ns`` and blocked again until
``end_ns``; :func:`own_work_gaps` measures each gap as the time between the previous operator's
release and this one's start, less the time the rank spent blocked in ``wait()`` meanwhile. Rows
without ``wait_ns`` block from start to end, as before, so a log without the columns reads exactly
as it always did.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["own_work_gaps", "table_gaps", "wait_arrays", "COLUMNS"]

#: the optional CommOps columns read here
COLUMNS = ("return_ns", "wait_ns")


def wait_arrays(table: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """``(return_ns, wait_ns)`` of a CommOps table as int64 arrays with -1 for null (``return_ns``
    all -1 when absent), or None when the table has no ``wait_ns`` or it holds no value."""
    if "wait_ns" not in table.column_names:
        return None
    col = table.column("wait_ns")
    if col.null_count == len(col):
        return None
    wait = col.fill_null(-1).to_numpy().astype(np.int64, copy=False)
    ret = (table.column("return_ns").fill_null(-1).to_numpy().astype(np.int64, copy=False)
           if "return_ns" in table.column_names else np.full(len(wait), -1, np.int64))
    return ret, wait


def own_work_gaps(start: np.ndarray, end: np.ndarray, wait: np.ndarray | None = None,
                  returned: np.ndarray | None = None) -> np.ndarray:
    """Per row (one rank's operators in issue order), the rank's own work before it (ns; 0 for row 0).

    Parameters
    ----------
    start, end : int64 arrays
        The operators' ``start_ns`` and ``end_ns``.
    wait : int64 array, optional
        Their ``wait_ns``, -1 where null (:func:`wait_arrays`). None: every operator blocked the
        rank from its start to its end, and the gap is ``start[i] - end[i - 1]`` (negative where
        the previous one outlived this one's start).
    returned : int64 array, optional
        Their ``return_ns``, -1 where null (then the operator's start).

    Returns
    -------
    int64 array
        Row ``i``: ``start[i]`` minus the previous operator's release (its end, or when its call
        returned where the rank waited on it later), less the time the rank spent inside ``wait()`` between the
        two (each moment counted once, however many operators one ``wait()`` finished).

    Examples
    --------
    A GPipe stage: receive (waited at once), compute 5, send, receive, compute 7, send, compute
    21, wait for both sends (40-50), compute 10, the next step's first receive:

    >>> start = np.array([0, 8, 9, 19, 60])
    >>> end = np.array([3, 50, 12, 50, 63])
    >>> wait = np.array([0, 40, 9, 50, -1])
    >>> own_work_gaps(start, end).tolist()                 # as if synchronous: the work hides
    [0, 5, -41, 7, 10]
    >>> own_work_gaps(start, end, wait).tolist()
    [0, 5, 1, 7, 31]
    """
    start = np.asarray(start, dtype=np.int64)
    end = np.asarray(end, dtype=np.int64)
    n = len(start)
    gap = np.zeros(n, np.int64)
    if n < 2:
        return gap
    if wait is None:
        gap[1:] = start[1:] - end[:-1]
        return gap
    wait = np.asarray(wait, dtype=np.int64)
    waited = wait >= 0
    w = np.clip(wait, start, end)
    ret = start if returned is None else np.clip(np.where(np.asarray(returned) >= 0, returned, start), start, w)
    release = np.where(waited, ret, end)
    lo, hi = _union(w[waited], end[waited])
    a, b = release[:-1], start[1:]
    if not len(lo):
        gap[1:] = b - a
        return gap
    cum = np.r_[0, np.cumsum(hi - lo)]

    def blocked_until(t: np.ndarray) -> np.ndarray:
        """Time spent inside ``wait()`` up to ``t``."""
        k = np.searchsorted(lo, t, "right")   # intervals starting at or before t
        inside = np.where(k > 0, np.minimum(t, hi[np.maximum(k - 1, 0)]) - lo[np.maximum(k - 1, 0)], 0)
        return cum[np.maximum(k - 1, 0)] * (k > 0) + np.maximum(inside, 0)

    blocked = np.where(b > a, blocked_until(b) - blocked_until(np.minimum(a, b)), 0)
    gap[1:] = b - a - blocked
    return gap


def table_gaps(start: np.ndarray, end: np.ndarray, waits: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
    """Per row, the rank's own work before it as float64, never negative: :func:`own_work_gaps`
    where the log says when the rank waited (``waits``: :func:`wait_arrays`), else the time since
    every earlier operator ended (operators overlapping it count no gap) -- the per-rank summary's
    and the heatmap's compute.

    >>> table_gaps(np.array([0, 8, 9]), np.array([3, 50, 12]), None).tolist()
    [0.0, 5.0, 0.0]
    >>> table_gaps(np.array([0, 8, 9]), np.array([3, 50, 12]), (np.full(3, -1), np.array([0, 40, 9]))).tolist()
    [0.0, 5.0, 1.0]
    """
    start = np.asarray(start, dtype=np.int64)
    end = np.asarray(end, dtype=np.int64)
    if waits is not None and (waits[1] >= 0).any():
        return np.maximum(own_work_gaps(start, end, waits[1], waits[0]), 0).astype(np.float64)
    gap = np.zeros(len(start), np.float64)
    if len(start) > 1:
        gap[1:] = np.maximum(start[1:] - np.maximum.accumulate(end)[:-1], 0)
    return gap


def _union(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Intervals ``[lo, hi)`` merged into disjoint ones, in order.

    >>> [x.tolist() for x in _union(np.array([5, 0, 6, 20]), np.array([9, 3, 8, 22]))]
    [[0, 5, 20], [3, 9, 22]]
    """
    if not len(lo):
        return lo.astype(np.int64), hi.astype(np.int64)
    o = np.argsort(lo, kind="stable")
    lo, hi = lo[o], hi[o]
    reach = np.maximum.accumulate(hi)
    new = np.r_[True, lo[1:] > reach[:-1]]
    first = np.flatnonzero(new)
    last = np.r_[first[1:], len(lo)] - 1
    return lo[first], reach[last]
