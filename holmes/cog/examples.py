"""Small example ranks for the docstrings and tests (not used by the analyses).

>>> ro = example_rank([2, 2, 5, 2], per_iteration=2)
>>> ro.iteration.tolist()
[0, 0, 1, 1]
"""

from __future__ import annotations

from typing import Any

__all__ = ["example_rank"]


def example_rank(dur: list[int], per_iteration: int, start: list[int] | None = None) -> Any:
    """One rank of tensor-parallel all-reduces, ``per_iteration`` per iteration, lasting ``dur``
    (ns) and starting at ``start`` (default every 10 ns): a :class:`~holmes.cog.RankOps`."""
    import pyarrow as pa

    from holmes.cog import RankOps

    n = len(dur)
    start = [i * 10 for i in range(n)] if start is None else list(start)
    t = pa.table({"rank": [0] * n, "iteration": [i // per_iteration for i in range(n)],
                  "op_index": [i % per_iteration for i in range(n)], "comm_id": ["tp-0"] * n, "seq": list(range(n)),
                  "op": ["all_reduce"] * n, "peer": pa.array([None] * n, pa.int32()), "nbytes": [8] * n,
                  "start_ns": start, "end_ns": [s + d for s, d in zip(start, dur)], "abnormal": [False] * n})
    return RankOps(0, t, lambda v: 0)
