"""Each rank's step split three ways, HTA-style: compute, waiting and transfer, against its peers.

For one rank and one iteration:

* **compute** -- the sum of the gaps between its consecutive communication operators (time
  working, not inside a collective or a transfer; overlapping operators count no gap), as the
  report's heatmap measures it;
* **transfer** -- inside each operator, the part every member spent: the shortest duration among
  the members of that collective (the member that arrived last waited for nobody, so its whole
  operator was moving data), or of the two ends of a send/recv pair (for a pair whose send began
  while the receive was open, the receive's end minus the send's start when shorter: an
  asynchronous send may end only when the program waits on it, long after the data arrived);
* **waiting** -- the rest of the time inside operators: the operator's duration beyond that
  transfer, spent waiting for a later member to arrive.

Durations are measured on each rank's own clock and compared only across the members of one
operator, so hosts need not share a clock (the late-sender estimate of a pair across hosts is off
by their clocks' offset at most, and never longer than the receive). Each figure is the median
over the iterations of the window (one slow iteration does not move it); a rank's **peers** are
the ranks of its pipeline stage (same position in their ``pp`` communicator, else along the chain
of a pipeline's P2P transfers, :mod:`holmes.localize.evidence.p2p`; every rank read without
one). Only the ranks
whose logs were read are summarised, and an operator is matched only among the members read (a
member not read cannot be the last to arrive: its peers' transfer is then an upper bound).

Examples
--------
>>> import holmes
>>> rows = rank_summary_of_job(holmes.read_job("fixtures/gpu64-3d-slow-gpu"), ranks=range(16, 24))
>>> worst = max(rows, key=lambda r: r["compute_vs_peers"])
>>> worst["rank"], worst["compute_vs_peers"] > 1.2, worst["waiting_ms"] < worst["peers_waiting_ms"]
(21, True, True)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from holmes.cog.own_work import table_gaps, wait_arrays
from holmes.display import SUMMARY_RANKS
from holmes.localize.evidence.p2p import late_sender_transfer, pipeline_stages, stages_of
from holmes.units import NS_PER_MS

__all__ = ["rank_summary", "rank_summary_of_job", "pipeline_stages", "SUMMARY_KEYS"]

#: the keys of one row, in the order the text and HTML tables show them
SUMMARY_KEYS = ("rank", "stage", "steps", "compute_ms", "waiting_ms", "transfer_ms", "peers_compute_ms",
                "peers_waiting_ms", "peers_transfer_ms", "compute_vs_peers")

_SEND, _RECV = "send", "recv"


def _columns(t: Any) -> dict[str, np.ndarray]:
    """The columns needed, completed operators only."""
    import pyarrow.compute as pc

    if "state" in t.column_names or t.column("end_ns").null_count:
        t = t.filter(pc.is_valid(t.column("end_ns")))
    peer = t.column("peer").fill_null(-1)

    def codes(name: str) -> tuple[np.ndarray, list[str]]:
        enc = pc.dictionary_encode(t.column(name).cast("string")).combine_chunks()
        return enc.indices.to_numpy(zero_copy_only=False).astype(np.int64), enc.dictionary.to_pylist()

    comm, comm_names = codes("comm_id")
    op, op_names = codes("op")
    return {"iteration": t.column("iteration").to_numpy().astype(np.int64),
            "comm": comm, "comm_names": np.asarray(comm_names, dtype=object),
            "seq": t.column("seq").to_numpy().astype(np.int64),
            "op": np.asarray(op_names, dtype=object)[op] if len(op) else np.zeros(0, dtype=object),
            "peer": peer.to_numpy().astype(np.int64),
            "start": t.column("start_ns").to_numpy().astype(np.int64),
            "end": t.column("end_ns").to_numpy().astype(np.int64),
            **dict(zip(("returned", "wait"), wait_arrays(t) or (np.full(t.num_rows, -1, np.int64),) * 2))}


def rank_summary(tables: Mapping[int, Any], window: Sequence[int] | None = None,
                 stage: Mapping[int, int] | None = None) -> list[dict[str, Any]]:
    """The per-rank table (module docstring) of the ranks in ``tables`` (rank -> CommOps table).

    Parameters
    ----------
    tables : mapping of int to pyarrow.Table
    window : sequence of int, optional
        The iterations summarised (default: every iteration present).
    stage : mapping of int to int, optional
        rank -> pipeline stage (:func:`pipeline_stages`); peers share a stage.

    Returns
    -------
    list of dict
        One row per rank with at least one operator in the window, by rank; keys :data:`SUMMARY_KEYS`.
    """
    cols = {int(r): _columns(t) for r, t in tables.items()}
    if window is not None:
        keep = np.unique(np.asarray(list(window), dtype=np.int64))
        cols = {r: {k: v if k == "comm_names" else v[np.isin(c["iteration"], keep)] for k, v in c.items()}
                for r, c in cols.items()}
    cols = {r: c for r, c in cols.items() if len(c["iteration"])}
    if not cols:
        return []
    # the key of each operator instance, equal on every member: collectives (comm, seq), P2P
    # (comm, sender, receiver, seq)
    names = sorted({str(x) for c in cols.values() for x in c["comm_names"]})
    code = {n: i for i, n in enumerate(names)}
    keys: list[np.ndarray] = []
    for r, c in cols.items():
        op = c["op"]
        p2p = (op == _SEND) | (op == _RECV)
        local = np.array([code[str(x)] for x in c["comm_names"]], dtype=np.int64)
        comm = local[c["comm"]] if len(local) else np.zeros(len(op), dtype=np.int64)
        sender = np.where(p2p, np.where(op == _RECV, c["peer"], r), -1)
        receiver = np.where(p2p, np.where(op == _RECV, r, c["peer"]), -1)
        keys.append(np.stack([comm, sender, receiver, c["seq"]], axis=1))
    allk = np.concatenate(keys)
    start = np.concatenate([c["start"] for c in cols.values()]).astype(np.float64)
    end = np.concatenate([c["end"] for c in cols.values()]).astype(np.float64)
    dur = end - start
    order = np.lexsort(allk.T[::-1])  # group equal keys: sort by comm, sender, receiver, seq
    srt = allk[order]
    new_group = np.ones(len(srt), dtype=bool)
    new_group[1:] = np.any(srt[1:] != srt[:-1], axis=1)
    inv = np.empty(len(srt), dtype=np.int64)
    inv[order] = np.cumsum(new_group) - 1
    shortest = np.full(int(new_group.sum()), np.inf)
    np.minimum.at(shortest, inv, dur)
    _late_sender(shortest, inv, np.concatenate([c["op"] for c in cols.values()]), start, end)
    transfer_all = np.minimum(shortest[inv], dur)
    rows = []
    at = 0
    per_rank: dict[int, tuple[float, float, float, int]] = {}
    for r, c in cols.items():
        n = len(c["iteration"])
        tr = transfer_all[at:at + n]
        d = dur[at:at + n]
        at += n
        it = c["iteration"]
        gap = table_gaps(c["start"], c["end"], (c["returned"], c["wait"]))
        its, pos = np.unique(it, return_inverse=True)
        comp = np.bincount(pos, weights=gap, minlength=len(its))
        wait = np.bincount(pos, weights=d - tr, minlength=len(its))
        xfer = np.bincount(pos, weights=tr, minlength=len(its))
        per_rank[r] = (float(np.median(comp)), float(np.median(wait)), float(np.median(xfer)), len(its))
    st = {r: int((stage or {}).get(r, 0)) for r in per_rank}
    for r in sorted(per_rank):
        peers = [q for q in per_rank if st[q] == st[r] and q != r] or [q for q in per_rank if q != r]
        comp, wait, xfer, steps = per_rank[r]
        # the peers' medians of compute, waiting and transfer (each rank's entry ends with its steps)
        pc_, pw, px = (np.median(np.array([per_rank[q][:-1] for q in peers]), axis=0).tolist() if peers
                       else (comp, wait, xfer))
        rows.append({"rank": r, "stage": st[r], "steps": steps, "compute_ms": round(comp / NS_PER_MS, 4),
                     "waiting_ms": round(wait / NS_PER_MS, 4), "transfer_ms": round(xfer / NS_PER_MS, 4),
                     "peers_compute_ms": round(pc_ / NS_PER_MS, 4), "peers_waiting_ms": round(pw / NS_PER_MS, 4),
                     "peers_transfer_ms": round(px / NS_PER_MS, 4),
                     "compute_vs_peers": round(comp / pc_, 4) if pc_ > 0 else None})
    return rows


def _late_sender(shortest: np.ndarray, inv: np.ndarray, op: np.ndarray, start: np.ndarray, end: np.ndarray) -> None:
    """``shortest`` (per operator instance ``inv``) lowered in place to the transfer of a P2P pair
    whose sender entered last (:func:`~holmes.localize.evidence.p2p.late_sender_transfer`, as the
    irregular analysis reads it)."""
    snd, rcv = op == _SEND, op == _RECV
    if not (snd.any() and rcv.any()):
        return
    g = shortest.size
    pair = (np.bincount(inv[snd], minlength=g) == 1) & (np.bincount(inv[rcv], minlength=g) == 1)
    send_start, recv_start, recv_end = np.full(g, np.nan), np.full(g, np.nan), np.full(g, np.nan)
    send_start[inv[snd]] = start[snd]
    recv_start[inv[rcv]], recv_end[inv[rcv]] = start[rcv], end[rcv]
    shortest[pair] = late_sender_transfer(shortest[pair], send_start[pair], recv_start[pair], recv_end[pair])


def rank_summary_of_job(job: Any, ranks: Iterable[int] | None = None, window: Sequence[int] | None = None,
                        max_ranks: int = SUMMARY_RANKS) -> list[dict[str, Any]]:
    """:func:`rank_summary` of a job's ranks (default every one, at most ``max_ranks`` read);
    ranks whose log cannot be read are left out."""
    from holmes.errors import HolmesError

    pick = list(range(int(job.world_size)) if ranks is None else ranks)[:max_ranks]
    tables = {}
    for r in pick:
        try:
            tables[int(r)] = job.ops(int(r))
        except HolmesError:
            continue
    return rank_summary(tables, window, stages_of(tables, job.communicators))
