"""Iteration boundaries derived from a rank's operators, for jobs without ``iterations/``."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from holmes.io.schema import iterations_table

__all__ = ["derive_iterations"]


def derive_iterations(ops: pa.Table) -> pa.Table:
    """Iteration boundaries of one rank derived from its ops, when ``iterations/`` is absent.

    The rule: iteration *i* ends when its last communication op completes (``max(end_ns)``), and
    starts when the previous iteration ended; the first iteration in the log starts at its first
    op's ``start_ns``. So iteration time = gap between consecutive "last op completed" instants,
    which includes the compute after the last op of the previous iteration and before the first op
    of this one, as a step timer would.

    Examples
    --------
    >>> from holmes.io.schema import ops_table
    >>> t = ops_table(rank=[0]*4, iteration=[0, 0, 1, 1], op_index=[0, 1, 0, 1], comm_id=["dp-0"]*4,
    ...               seq=[0, 1, 2, 3], op=["all_reduce"]*4, peer=[None]*4, nbytes=[1]*4,
    ...               start_ns=[100, 300, 600, 800], end_ns=[200, 400, 700, 1000])
    >>> derive_iterations(t).to_pydict()["end_ns"], derive_iterations(t).to_pydict()["start_ns"]
    ([400, 1000], [100, 400])
    """
    if ops.num_rows and (ops.column("end_ns").null_count or ops.column("start_ns").null_count):
        # a log dumped with ops in flight: only iterations whose ops all completed have a duration
        open_its = pc.unique(ops.filter(pc.or_(ops.column("end_ns").is_null(), ops.column("start_ns").is_null()))
                             .column("iteration"))
        ops = ops.filter(pc.invert(pc.is_in(ops.column("iteration"), value_set=open_its)))
    if ops.num_rows == 0:
        return iterations_table([], [], [], [])
    it = ops.column("iteration").to_numpy()
    st = ops.column("start_ns").to_numpy()
    en = ops.column("end_ns").to_numpy()
    rank = int(ops.column("rank")[0].as_py())
    iters, inv = np.unique(it, return_inverse=True)
    first = np.full(len(iters), np.iinfo(np.int64).max, dtype=np.int64)
    last = np.full(len(iters), np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(first, inv, st)
    np.maximum.at(last, inv, en)
    start = np.empty_like(last)
    start[0] = first[0]
    start[1:] = last[:-1]
    return iterations_table(np.full(len(iters), rank, dtype=np.int32), iters, start, last)
