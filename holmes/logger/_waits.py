"""The optional ``return_ns`` and ``wait_ns`` columns of a rank log (``docs/formats.md``): for an
asynchronous operator the rank waited on, when the call that issued it returned and when the rank
entered ``Work.wait()`` (set by :class:`holmes.logger._work.TimedWork`, kept by the recorder per
packed ``(iteration, op_index)`` until the row is written)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["wait_columns"]


def wait_columns(waits: dict[int, tuple[int, int]], keys: np.ndarray) -> list[pa.Array]:
    """``[return_ns, wait_ns]`` of the rows whose packed ``(iteration, op_index)`` are ``keys``,
    taken out of ``waits``; null where a row has none.

    >>> waits = {5: (12, 40)}
    >>> [c.to_pylist() for c in wait_columns(waits, np.array([4, 5]))], waits
    ([[None, 12], [None, 40]], {})
    """
    if not waits:
        return [pa.nulls(len(keys), pa.int64())] * 2
    pop = waits.pop
    rw = np.array([pop(k, (-1, -1)) for k in keys.tolist()], np.int64).reshape(-1, 2)
    return [pa.array(rw[:, j], mask=rw[:, j] < 0, type=pa.int64()) for j in (0, 1)]
