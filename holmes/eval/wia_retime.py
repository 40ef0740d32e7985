"""A reference replay of WIA per-op traces, independent of Holmes's converter and replay.

ByteDance's what-if analysis (WIA, ``ByteDance-Seed/StragglerAnalysis``) replays a trace through
its ops' dependencies: a compute op ends ``duration`` after it starts, a communication op ends its
*transfer time* after the last member of its group started (transfer = its logged end minus the
group's last logged start), and each op starts after the ops it depends on, plus its *launch
delay* (its logged start minus the end of what it waited for). Its ideal sets every compute op to
its optype's mean and every transfer to its optype's median (over ranks, stages and steps), with
no launch delay; ``blocking_slowdown`` is the mean step without launch delays over the ideal's.

This module re-implements that model on the trace's own rows, with a simpler dependency model
(each rank's ops in their logged order, ops logged at the same instant issued together), for two
uses: checking Holmes's what-if figures against the study's method on traces the study did not
publish, and **emulating** such traces -- :func:`retime` with ``scale`` stretches some ranks'
compute and re-lays every op, so the waits it causes on the other ranks appear where they would.

Groups (what makes a communication op wait for others): a forward (backward) send and the forward
(backward) receive of the next (previous) stage of the same data-parallel rank, matched in order;
``grads-reduce-scatter`` / ``params-all-gather`` across the data-parallel ranks of a stage;
``embedding-grads-all-reduce`` between the first and last stage of a data-parallel rank;
``optimizer-clip-main-grad`` across every rank; any other op alone.

Examples
--------
>>> import pyarrow.parquet as pq
>>> t = pq.read_table("trace-ST.parquet")          # doctest: +SKIP
>>> study_slowdown(t)                                                  # doctest: +SKIP
1.18...
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa
from pyarrow.compute import max as pc_max

__all__ = ["retime", "study_slowdown", "study_decompose", "widen_dp", "COMPUTE_OPTYPES"]

#: the WIA optypes that are a rank's own work (the rest communicate or synchronise)
COMPUTE_OPTYPES = ("forward-compute", "backward-compute", "optimizer", "gc")
_EPS = 1e-7  # s: ops logged this close together were issued together


def _columns(trace: pa.Table) -> dict[str, np.ndarray]:
    c = {k: trace.column(k).to_numpy() for k in ("dp_rank", "stage", "rank", "step", "start_ts", "duration")}
    c["optype"] = np.asarray(trace.column("optype").cast(pa.string()).to_pylist(), dtype=object)
    c["start_ts"] = c["start_ts"].astype(np.float64)
    c["duration"] = c["duration"].astype(np.float64)
    return c


def _groups(c: dict[str, np.ndarray], order: np.ndarray) -> np.ndarray:
    """Per row, its communication group id (-1: alone, or a compute op)."""
    n = len(order)
    pp = int(c["stage"].max()) + 1
    gid = np.full(n, -1, np.int64)
    keys: dict[tuple, int] = {}
    count: dict[tuple, int] = {}
    for j in order.tolist():  # rows in (rank, step, start) order: the k-th op of its kind on the rank
        o, d, s, st = c["optype"][j], int(c["dp_rank"][j]), int(c["stage"][j]), int(c["step"][j])
        kk = (int(c["rank"][j]), st, o)
        k = count.get(kk, 0)
        count[kk] = k + 1
        if o in ("forward-send", "forward-recv", "backward-send", "backward-recv"):
            direction, side = o.split("-")
            sender = s if side == "send" else (s - 1 if direction == "forward" else s + 1)
            if not 0 <= sender < pp:
                continue
            key: tuple = ("p2p", direction, d, sender, st, k)
        elif o in ("grads-reduce-scatter", "params-all-gather"):
            key = ("dp", o, s, st, k)
        elif o == "embedding-grads-all-reduce":
            key = ("emb", d, st, k)
        elif o == "optimizer-clip-main-grad":
            key = ("clip", st, k)
        else:
            continue
        gid[j] = keys.setdefault(key, len(keys))
    return gid


def retime(trace: pa.Table, *, scale: Mapping[int, float] | None = None,
           scaled_optypes: Sequence[str] = ("forward-compute", "backward-compute"), launch_delay: bool = True,
           ideal: bool = False, keep: np.ndarray | None = None) -> tuple[pa.Table, dict[int, float]]:
    """Replay a WIA trace: ``(the trace re-laid, per step its replayed time in seconds)``.

    Parameters
    ----------
    trace : pyarrow.Table
        A WIA trace (``dp_rank, stage, rank, step, optype, start_ts, duration`` + any columns).
    scale : mapping of rank -> factor, optional
        Multiply these ranks' ``scaled_optypes`` durations (a slow worker).
    launch_delay : bool, default True
        Keep each op's logged launch delay (False: WIA's "no delay").
    ideal : bool, default False
        WIA's ideal: compute ops at their optype's mean duration, transfers at their optype's
        median, over every rank and step (after ``scale``).
    keep : bool array, optional
        With ``ideal``: rows that keep their own durations and transfers (WIA's decomposition).

    Returns
    -------
    (pyarrow.Table, dict)
        The trace with ``start_ts`` / ``duration`` replaced by the replayed ones (a communication op's
        duration then holds its wait), and per step the time its last op ends.
    """
    c = _columns(trace)
    n = trace.num_rows
    dur = c["duration"].copy()
    is_comp = np.isin(c["optype"], COMPUTE_OPTYPES)
    if scale:
        for r, f in scale.items():
            dur[(c["rank"] == r) & np.isin(c["optype"], list(scaled_optypes))] *= float(f)
    order = np.lexsort((c["start_ts"], c["step"], c["rank"]))
    gid = _groups(c, order)
    end_logged = c["start_ts"] + c["duration"]
    ng = int(gid.max()) + 1 if (gid >= 0).any() else 0
    size = np.bincount(gid[gid >= 0], minlength=ng)
    gstart = np.full(ng, -np.inf)
    np.maximum.at(gstart, gid[gid >= 0], c["start_ts"][gid >= 0])
    comm = (gid >= 0) & (size[np.maximum(gid, 0)] > 1)
    transfer = np.where(comm, np.maximum(end_logged - gstart[np.maximum(gid, 0)], 0.0), dur)
    transfer = np.where(is_comp, dur, transfer)
    if ideal:
        own = transfer.copy()
        for o in np.unique(c["optype"]).tolist():
            m = c["optype"] == o
            transfer[m] = own[m].mean() if is_comp[m].all() else np.median(own[m])
        if keep is not None:
            transfer = np.where(keep, own, transfer)
    # per rank and step: batches (ops logged at one instant are issued together) and launch delays
    start = np.zeros(n)
    end = np.zeros(n)
    steps: dict[int, float] = {}
    rank_step = np.stack([c["rank"][order], c["step"][order]], 1)
    cut = np.r_[0, np.flatnonzero((np.diff(rank_step, axis=0) != 0).any(axis=1)) + 1, n]
    by_step: dict[int, list[list[list[int]]]] = {}
    delay = np.zeros(n)
    for a, b in zip(cut[:-1], cut[1:]):
        rows = order[a:b].tolist()
        batches: list[list[int]] = []
        prev_end = 0.0
        for j in rows:
            if batches and not is_comp[j] and not is_comp[batches[-1][0]] and \
                    abs(c["start_ts"][j] - c["start_ts"][batches[-1][0]]) <= _EPS:
                batches[-1].append(j)
                continue
            if batches:
                prev_end = max(end_logged[k] for k in batches[-1])
            delay[j] = max(c["start_ts"][j] - prev_end, 0.0) if launch_delay else 0.0
            batches.append([j])
        by_step.setdefault(int(c["step"][order[a]]), []).append(batches)
    for st, ranks in by_step.items():
        ptr = [0] * len(ranks)
        ready = [0.0] * len(ranks)
        issued = [False] * len(ranks)
        got = {}
        gmax: dict[int, float] = {}
        changed = True
        while changed:
            changed = False
            for i, batches in enumerate(ranks):
                while ptr[i] < len(batches):
                    bt = batches[ptr[i]]
                    if not issued[i]:
                        s0 = ready[i] + delay[bt[0]]
                        for j in bt:
                            start[j] = s0
                            if comm[j]:
                                g = int(gid[j])
                                got[g] = got.get(g, 0) + 1
                                gmax[g] = max(gmax.get(g, -np.inf), s0)
                        issued[i] = changed = True
                    if any(comm[j] and got[int(gid[j])] < size[gid[j]] for j in bt):
                        break
                    for j in bt:
                        end[j] = (gmax[int(gid[j])] if comm[j] else start[j]) + transfer[j]
                    ready[i] = max(end[j] for j in bt)
                    ptr[i] += 1
                    issued[i] = False
                    changed = True
        if any(p < len(b) for p, b in zip(ptr, ranks)):
            raise ValueError(f"step {st}: the ops' groups do not resolve (a deadlock in the replay)")
        steps[st] = max(ready)
    out = trace.set_column(trace.schema.get_field_index("start_ts"), "start_ts", pa.array(start, pa.float64()))
    out = out.set_column(out.schema.get_field_index("duration"), "duration", pa.array(end - start, pa.float64()))
    return out, steps


def widen_dp(trace: pa.Table, times: int) -> pa.Table:
    """The trace with ``times`` as many data-parallel replicas: each replica's rows copied to new
    ``dp_rank`` values (``rank = stage * dp + dp_rank``, the layout of the published traces); re-lay
    it with :func:`retime` to let the copies' collectives synchronise.

    >>> t = pa.table({"dp_rank": [0, 1], "stage": [0, 0], "rank": [0, 1], "step": [0, 0]})
    >>> widen_dp(t, 2).to_pydict()["rank"]
    [0, 1, 2, 3]
    """
    dp0 = int(pc_max(trace.column("dp_rank"))) + 1
    parts = []
    for k in range(int(times)):
        d = trace.column("dp_rank").to_numpy().astype(np.int64) + k * dp0
        st = trace.column("stage").to_numpy().astype(np.int64)
        t = trace.set_column(trace.schema.get_field_index("dp_rank"), "dp_rank",
                             pa.array(d).cast(trace.schema.field("dp_rank").type))
        t = t.set_column(t.schema.get_field_index("rank"), "rank",
                         pa.array(st * dp0 * int(times) + d).cast(trace.schema.field("rank").type))
        parts.append(t)
    return pa.concat_tables(parts)


def study_decompose(trace: pa.Table, by: str) -> dict[int, float]:
    """WIA's ``blocking_decompose_by_<by>`` by this replay (``by``: ``"stage"`` or ``"dp_rank"``): per
    value, the mean ideal step with that group's ops as logged, over the ideal's (no launch delays)."""
    _, ideal = retime(trace, launch_delay=False, ideal=True)
    base = float(np.mean(list(ideal.values())))
    col = trace.column(by).to_numpy()
    out = {}
    for g in np.unique(col).tolist():
        _, alt = retime(trace, launch_delay=False, ideal=True, keep=col == g)
        out[int(g)] = float(np.mean(list(alt.values()))) / base
    return out


def study_slowdown(trace: pa.Table) -> float:
    """WIA's ``blocking_slowdown`` by this replay: the mean step without launch delays over the ideal's."""
    _, nodelay = retime(trace, launch_delay=False)
    _, ideal = retime(trace, launch_delay=False, ideal=True)
    return float(np.mean(list(nodelay.values())) / np.mean(list(ideal.values())))
