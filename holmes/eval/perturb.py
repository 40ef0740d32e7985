"""Perturb a captured job: add what happens to real jobs to a log that did not have it.

:func:`job_wide_pause` slows every process of a job at once for a moment -- a loaded machine, a
storage or scheduler stall, a collective garbage collection -- the way a box under load shows it:
each rank is caught a little later than the others, for a different time, and runs slower
meanwhile; the job as a whole loses the same time on every rank (they meet again at the next
collective). No device is at fault; whatever each rank was doing (computing, copying,
waiting) took longer. The tests and the threshold sweep of the irregular analysis's pause rule
(``pause_ratio``, :mod:`holmes.localize.irregular.pauses`) use it on real captured jobs.

Examples
--------
>>> import holmes
>>> job = holmes.read_job("fixtures/gpu16-clean")
>>> out = job_wide_pause(job, 6, seed=0)
>>> a, b = job.ops(0), out.ops(0)
>>> bool((b.column("end_ns").to_numpy() >= a.column("end_ns").to_numpy()).all())
True
>>> int(b.column("end_ns").to_numpy()[-1] - a.column("end_ns").to_numpy()[-1]) > 0
True
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa

from holmes.io import MemoryJob

__all__ = ["job_wide_pause", "warp_times"]


def warp_times(table: pa.Table, start_ns: float, width_ns: float, factor: float) -> pa.Table:
    """``table`` with every integer ``*_ns`` column's times warped: unchanged before
    ``start_ns``, running ``factor`` times slower for ``width_ns`` from it, shifted by
    ``(factor - 1) * width_ns`` after. Order is kept (the warp is monotone).

    >>> t = pa.table({"start_ns": pa.array([0, 100, 300], pa.int64()), "x": [1, 2, 3]})
    >>> warp_times(t, 50, 100, 2.0).column("start_ns").to_pylist()
    [0, 150, 400]
    """
    cols = {}
    for name in table.column_names:
        col = table.column(name)
        if name.endswith("_ns") and pa.types.is_integer(col.type):
            a = col.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
            t0 = int(start_ns)
            d = (a - t0).astype(np.float64)  # offsets, exact in float64 (epoch ns are not)
            grow = np.where(d < 0, 0.0, np.where(d < width_ns, (factor - 1.0) * d, (factor - 1.0) * width_ns))
            col = pa.array(a + np.rint(grow).astype(np.int64), type=col.type, mask=np.asarray(col.is_null()))
        cols[name] = col
    return pa.table(cols, schema=table.schema)


def job_wide_pause(job: Any, iteration: int, *, seed: int = 0, at: float = 0.3, jitter_ns: float = 60e6,
                   width_ns: tuple[float, float] = (60e6, 150e6), delay_ns: tuple[float, float] = (40e6, 150e6),
                   hosts: Iterable[int] | None = None) -> MemoryJob:
    """A copy of ``job`` in which every rank (of ``hosts``, default all) ran slower for a moment
    of ``iteration``, and the job lost the same time on all of them.

    The job loses a delay drawn in ``delay_ns``. Each rank's moment starts ``at`` of the way into
    rank 0's ``iteration`` (its iterations table) plus a delay of its own drawn in
    ``[0, jitter_ns]``, and lasts a width of its own drawn in ``width_ns``: the rank runs
    ``1 + delay / width`` times slower within it (:func:`warp_times` of its operators,
    iterations and compute tables), so whatever it was doing then took longer, and every rank is
    ``delay`` later after its moment (the ranks meet again at their next collective, as a real
    job does: a log whose ranks drifted apart would read as shifted, not paused). ``seed`` makes
    the draws (a ``numpy.random.default_rng``; no global state).
    """
    rng = np.random.default_rng(seed)
    ranks = job.available_ranks()
    its = job.iterations(ranks[0])
    row = np.flatnonzero(its.column("iteration").to_numpy() == iteration)
    if not row.size:
        raise ValueError(f"rank {ranks[0]} has no iteration {iteration}")
    s = float(its.column("start_ns")[int(row[0])].as_py())
    e = float(its.column("end_ns")[int(row[0])].as_py())
    t0 = s + at * (e - s)
    topo = job.topology
    chosen = None if hosts is None else {int(h) for h in hosts}
    delay = float(round(rng.uniform(*delay_ns)))  # whole ns: every rank then shifts by exactly it
    draws = {}
    for r in ranks:
        start, width = t0 + rng.uniform(0.0, jitter_ns), rng.uniform(*width_ns)
        draws[r] = (start, width, 1.0 + delay / width)
    hit = {r for r in ranks if chosen is None or int(topo.host_of(r)) in chosen}

    def per(read: Any) -> dict[int, pa.Table]:
        out = {}
        for r in ranks:
            t = read(r)
            if t is not None:
                out[r] = warp_times(t, *draws[r]) if r in hit else t
        return out

    compute = per(job.compute) if getattr(job, "has_compute", False) else None
    return MemoryJob(job.meta, per(job.ops), iterations=per(job.iterations), topology=topo,
                     truth=getattr(job, "truth", None), compute=compute)
