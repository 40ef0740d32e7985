"""What P2P pairs say beyond themselves: a pipeline's stages, and when a late sender's data arrived.

**Stages.** A rank's *stage* decides who its peers are (the ranks doing the same work).
Megatron-style jobs name it: the position in the ``pp`` communicator (:func:`pipeline_stages`). A
pipeline run over the default group (``torch.distributed.pipelining``, a hand-written schedule)
does not: its stages are the positions along the chains its P2P transfers draw
(:func:`p2p_stages`, on the persistent analysis's slots; :func:`stages_of`, on the operator tables
of the ranks read, for the per-rank summary).

**Transfers.** Both ends of a pair leave the operator together, so the shortest copy is the
transfer -- except for an asynchronous send whose completion the logger saw late: gloo completes
an ``isend`` only in ``wait()`` (``torch.distributed.pipelining`` waits on a step's sends at its
end), long after the receiver got the data, while the receive waited for the late sender.
:func:`late_sender_transfer` reads such a pair from the receive's end (the irregular analysis's
transfer times and the per-rank summary both use it).

Examples
--------
>>> import holmes
>>> job = holmes.read_job("tests/data/gloo_setups/gpipe/slow")
>>> stages_of({r: job.ops(r) for r in range(4)}, job.communicators)
{0: 0, 1: 1, 2: 2, 3: 3}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["SAME_WORK_KINDS", "late_sender_transfer", "p2p_stages", "pipeline_stages", "stages_of"]

#: communicator kinds whose P2P transfers are a ring or exchange among ranks doing the same work
#: (context-parallel ring attention, expert all-to-all), never a pipeline
SAME_WORK_KINDS = ("tp", "cp", "ep", "dp")


def p2p_stages(slot_info: list[tuple], world_size: int) -> np.ndarray | None:
    """Pipeline stages read from the P2P transfers of a job whose communicators do not say them.

    ``torch.distributed.pipelining`` (and any hand-written pipeline) sends activations and
    gradients over the default group: the job's communicators hold no ``pp`` kind, so every rank
    looks like stage 0 and the stages' different work looks like stragglers. The ranks joined by
    P2P transfers (``slot_info``'s ``("p", kind, (sender, receiver), comm)`` slots, except on
    communicators of the kinds whose ranks do the same work) form the pipelines: a component that
    is a simple chain is one pipeline, its ranks numbered along it from the end with the lower rank
    (replicas of one pipeline laid out alike get the same stage numbers). Returns the stage of every
    rank (0 for ranks in no chain), or None when no component is a chain of two or more ranks (a
    ring, a star, no P2P at all: nothing to read).

    >>> p2p_stages([("p", "other", (0, 1), "w"), ("p", "other", (1, 2), "w"), ("p", "other", (2, 1), "w"),
    ...             ("c", "other", (0, 1, 2), "w")], 3).tolist()
    [0, 1, 2]
    >>> p2p_stages([("p", "cp", (0, 1), "cp0"), ("p", "cp", (1, 0), "cp0")], 2) is None
    True
    """
    W = int(world_size)
    adj: dict[int, set[int]] = {}
    for info in slot_info:
        if info[0] != "p" or info[1] in SAME_WORK_KINDS:
            continue
        a, b = (int(r) for r in info[2])
        if a == b or not (0 <= a < W and 0 <= b < W):
            continue
        adj.setdefault(a, set()).add(b)
        adj.setdefault(b, set()).add(a)
    stage = np.zeros(W, dtype=np.int64)
    found = False
    seen: set[int] = set()
    for start in sorted(adj):
        if start in seen:
            continue
        comp, todo = {start}, [start]
        while todo:
            for n in adj[todo.pop()]:
                if n not in comp:
                    comp.add(n)
                    todo.append(n)
        seen |= comp
        ends = sorted(r for r in comp if len(adj[r]) == 1)
        edges = sum(len(adj[r]) for r in comp) // 2
        if len(ends) != 2 or edges != len(comp) - 1 or any(len(adj[r]) > 2 for r in comp):
            continue  # not a chain: a ring or an exchange
        prev, cur, k = -1, ends[0], 0
        while True:
            stage[cur] = k
            nxt = [n for n in adj[cur] if n != prev]
            if not nxt:
                break
            prev, cur, k = cur, nxt[0], k + 1
        found = True
    return stage if found else None


def pipeline_stages(communicators: Mapping[str, Any]) -> dict[int, int]:
    """rank -> its position in its ``pp`` communicator (the pipeline stage); empty without one.

    >>> from holmes.topology.layout import Communicator
    >>> pipeline_stages({"pp-0": Communicator("pp", (0, 4)), "tp-0": Communicator("tp", (0, 1))})
    {0: 0, 4: 1}
    """
    out: dict[int, int] = {}
    for c in communicators.values():
        kind = c.get("kind") if isinstance(c, Mapping) else getattr(c, "kind", None)
        ranks = c.get("ranks") if isinstance(c, Mapping) else getattr(c, "ranks", ())
        if kind == "pp":
            for pos, r in enumerate(ranks):
                out.setdefault(int(r), pos)
    return out


def stages_of(tables: Mapping[int, Any], communicators: Mapping[str, Any]) -> dict[int, int]:
    """rank -> pipeline stage of the ranks in ``tables`` (rank -> CommOps table): the ``pp``
    communicators' (:func:`pipeline_stages`), else the P2P chains of the tables' send and recv
    rows (:func:`p2p_stages`; communicators of the kinds whose ranks do the same work left out),
    else empty (every rank one stage).

    >>> import pyarrow as pa
    >>> t = lambda ops, peers: pa.table({"op": ops, "peer": peers, "comm_id": ["world"] * len(ops)})
    >>> stages_of({0: t(["send"], [1]), 1: t(["recv", "send"], [0, 2]), 2: t(["recv"], [1])},
    ...           {"world": {"kind": "other", "ranks": [0, 1, 2]}})
    {0: 0, 1: 1, 2: 2}
    """
    named = pipeline_stages(communicators)
    if named or not tables:
        return named
    kind_of = {str(k): (c.get("kind") if isinstance(c, Mapping) else getattr(c, "kind", None))
               for k, c in communicators.items()}
    slots: set[tuple] = set()
    for r, t in tables.items():
        ops = pa.table({"op": t.column("op").cast(pa.string()), "peer": t.column("peer"),
                        "comm_id": t.column("comm_id").cast(pa.string())})
        ops = ops.filter(pc.and_(pc.is_in(ops.column("op"), value_set=pa.array(["send", "recv"])),
                                 pc.is_valid(ops.column("peer"))))
        if not ops.num_rows:
            continue
        for row in ops.group_by(["op", "peer", "comm_id"]).aggregate([]).to_pylist():
            peer = int(row["peer"])
            pair = (int(r), peer) if row["op"] == "send" else (peer, int(r))
            slots.add(("p", kind_of.get(str(row["comm_id"])) or "other", pair, str(row["comm_id"])))
    world = max(max(int(r) for r in tables), *(max(s[2]) for s in slots)) + 1 if slots else 0
    stage = p2p_stages(sorted(slots), world) if slots else None
    return {} if stage is None else {int(r): int(stage[int(r)]) for r in tables}


def late_sender_transfer(shortest: np.ndarray, send_start: np.ndarray, recv_start: np.ndarray,
                         recv_end: np.ndarray) -> np.ndarray:
    """Per P2P pair, its transfer: ``shortest`` (its shortest copy), or, where the send began while
    the receive was open (the sender entered last), the receive's end minus the send's start when
    that is shorter. Across hosts the two ends read different clocks: the estimate is used only when
    consistent (the send began within the receive), and is then off by the clocks' offset at most,
    never longer than the receive. NaN starts or ends (a copy not read) leave ``shortest``.

    >>> late_sender_transfer(np.array([60.0, 5.0]), np.array([100.0, 0.0]), np.array([40.0, 0.0]),
    ...                      np.array([104.0, 5.0])).tolist()
    [4.0, 5.0]
    """
    with np.errstate(invalid="ignore"):
        late = (recv_start <= send_start) & (send_start <= recv_end)
    return np.where(late, np.minimum(shortest, recv_end - send_start), shortest)
