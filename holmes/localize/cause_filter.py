"""Which root causes of an iteration stand: the ones that explain it.

Algorithm 1 ends every branch somewhere: on the operator that started late (compute) or ran long
(network). In an iteration stretched by one slow device that is the device; in an iteration
stretched a few sigmas by the job's own jitter the delay is spread thin over many ranks and the
search ends wherever the last small wait led -- on an operator about as long as usual. Two rules
keep such causes from counting as evidence:

* :func:`drop_diffuse` -- unrelated causes of similar size in one iteration are a job-wide
  disturbance, not a device (the iteration is *common*);
* :func:`drop_minor` -- a cause that cost its rank only a small share of the iteration's excess
  did not make the iteration slow (the iteration is *without cause*).

Both weigh a cause by :func:`cause_cost`: what it cost its rank in its iteration.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from holmes.localize.search import COMPUTE, RootCause

__all__ = ["cause_cost", "components", "drop_diffuse", "drop_minor", "explains"]


def components(involved: list[set[Any]]) -> list[list[int]]:
    """Indices of ``involved`` grouped by overlap (connected components of "shares an element").

    >>> components([{4, 5, "nvswitch:1"}, {2, 3, "nvswitch:0"}])
    [[0], [1]]
    >>> components([{1, 5}, {1, "host:0"}, {3, 7}, {1, 3}])
    [[0, 1, 2, 3]]
    """
    groups: list[tuple[set[Any], list[int]]] = []
    for i, s in enumerate(involved):
        s, idx = set(s), [i]
        for g in [g for g in groups if g[0] & s]:
            s |= g[0]
            idx += g[1]
            groups.remove(g)
        groups.append((s, sorted(idx)))
    return sorted((g[1] for g in groups), key=lambda idx: idx[0])


def cause_cost(ro: Any, row: int, compute: bool, usual: Any = None) -> float:
    """What a cause cost its rank in its iteration: the larger of its operator's excess over its
    usual length (:meth:`~holmes.cog.RankOps.excess`) and how much more than in its median
    iteration the rank spent in the iteration -- computing (a compute cause) or in the
    operators of the cause's communicator (a network cause: a slower NVSwitch stretches each of
    a tensor-parallel group's hundreds of collectives a little). ``usual``: the iterations whose
    median is the rank's usual level (default every iteration of the rank; a slowdown that
    persists over most of them needs the job's regular ones).

    >>> import pyarrow as pa
    >>> from holmes.cog import RankOps
    >>> n = 3 * 4
    >>> it = [i // 4 for i in range(n)]
    >>> start = [i * 10 for i in range(n)]
    >>> dur = [2 if i // 4 != 1 else 5 for i in range(n)]   # iteration 1: each collective +3
    >>> t = pa.table({"rank": [0] * n, "iteration": it, "op_index": [i % 4 for i in range(n)],
    ...               "comm_id": ["tp-0"] * n, "seq": list(range(n)), "op": ["all_reduce"] * n,
    ...               "peer": pa.array([None] * n, pa.int32()), "nbytes": [8] * n, "start_ns": start,
    ...               "end_ns": [s + d for s, d in zip(start, dur)], "abnormal": [False] * n})
    >>> ro = RankOps(0, t, lambda v: 0)
    >>> cause_cost(ro, 5, compute=False)   # 3 ns on one operator, 12 over the iteration
    12.0
    """
    gap_x, dur_x = ro.excess()
    x = gap_x if compute else dur_x
    one = float(x[row])
    its, per = ro.iteration_sums(x.astype(float) if compute else np.where(ro.comm == ro.comm[row], x, 0.0))
    k = int(np.searchsorted(its, ro.iteration[row]))
    base = per if usual is None else per[np.isin(its, usual)]
    base = per if base.size == 0 else base
    return max(one, float(per[k] - np.median(base))) if its.size >= 3 else one


def drop_diffuse(ev: Any, ranks: Any, host_of: Any, dominance: float = 3.0) -> None:
    """Per iteration, keep only the causes related to its strongest one.

    Causes are related when they share a rank, a device, or (compute causes) a host. An
    iteration whose causes fall into unrelated groups keeps the group whose strongest cause (what
    it cost the iteration: :func:`cause_cost`) is at least ``dominance`` times the next group's;
    otherwise it is *diffuse*: unrelated slowdowns of similar size at once are the mark of a
    job-wide disturbance (a loaded machine, a shared file system), not of one faulty device, and
    the iteration moves to ``ev.common``.
    """
    by_it: dict[int, list[int]] = {}
    for i, c in enumerate(ev.causes):
        by_it.setdefault(c.iteration, []).append(i)

    def involved(i: int) -> set[Any]:
        c = ev.causes[i]
        out: set[Any] = set(c.ranks) | set(ev.implicated[i])
        if c.cause == COMPUTE:
            out |= {f"host:{host_of(r)}" for r in c.ranks}
        return out

    def strength(i: int) -> float:
        c = ev.causes[i]
        return cause_cost(ranks[c.rank], c.row, c.cause == COMPUTE)

    keep: list[int] = []
    for it, idx in by_it.items():
        comps = components([involved(i) for i in idx])
        if len(comps) == 1:
            keep += idx
            continue
        best = sorted(((max(strength(idx[j]) for j in comp), comp) for comp in comps), key=lambda x: -x[0])
        if best[0][0] >= dominance * best[1][0]:
            keep += [idx[j] for j in best[0][1]]
        else:
            ev.common.append(it)
    _keep(ev, sorted(keep))


def explains(ro: Any, cause: RootCause, excess: float, share: float, usual: Any = None) -> bool:
    """Whether ``cause`` cost its rank (:func:`cause_cost` against the ``usual`` iterations) at
    least ``share`` of its iteration's ``excess`` over the usual iteration (ns).

    >>> import pyarrow as pa
    >>> from holmes.cog import RankOps
    >>> from holmes.localize.search import RootCause
    >>> n = 5 * 4
    >>> dur = [2 if i // 4 != 3 else 5 for i in range(n)]   # iteration 3: each collective +3
    >>> t = pa.table({"rank": [0] * n, "iteration": [i // 4 for i in range(n)],
    ...               "op_index": [i % 4 for i in range(n)], "comm_id": ["tp-0"] * n, "seq": list(range(n)),
    ...               "op": ["all_reduce"] * n, "peer": pa.array([None] * n, pa.int32()), "nbytes": [8] * n,
    ...               "start_ns": [i * 10 for i in range(n)], "end_ns": [i * 10 + d for i, d in enumerate(dur)],
    ...               "abnormal": [False] * n})
    >>> ro = RankOps(0, t, lambda v: 0)
    >>> c = RootCause(iteration=3, cause="network", ranks=(0,), rank=0, row=13, op={})
    >>> explains(ro, c, excess=30, share=1 / 3), explains(ro, c, excess=60, share=1 / 3)
    (True, False)
    """
    if share <= 0 or excess <= 0:
        return True
    return cause_cost(ro, cause.row, cause.cause == COMPUTE, usual) >= share * excess


def drop_minor(ev: Any, ranks: Mapping[int, Any], excess: Mapping[int, float], share: float,
               usual: Any = None) -> None:
    """Drop the causes of ``ev`` (an :class:`~holmes.localize.irregular.Evidence`) that do not
    :func:`explain <explains>` their iteration (``excess``: iteration -> its excess, ns); an
    iteration left without a cause joins ``ev.without_cause``."""
    if share <= 0 or not ev.causes:
        return
    keep = [i for i, c in enumerate(ev.causes)
            if explains(ranks[c.rank], c, excess.get(c.iteration, 0.0), share, usual)]
    before = {c.iteration for c in ev.causes}
    _keep(ev, keep)
    ev.without_cause += sorted(before - {c.iteration for c in ev.causes})


def _keep(ev: Any, keep: list[int]) -> None:
    """Keep only the causes (and their implicated devices) at the indices ``keep``."""
    ev.causes = [ev.causes[i] for i in keep]
    ev.implicated = [ev.implicated[i] for i in keep]
