"""The wait-for graph of a hung job: which rank each stuck operator waits for, its roots and cycles.

Every rank with an operator in flight is *blocked*; what it waits for follows from the operators
in flight, read as NCCL and gloo run them (in issue order, a point-to-point pair as a rendezvous):

* a rank's **blocking operators** are its oldest operator in flight (by issue time) and, when that
  one is point-to-point, every point-to-point operator in flight it issued before its first
  collective in flight (a ``batch_isend_irecv`` batch, or sends queued behind the first);
* a blocking **collective** ``#seq`` of a communicator waits for each member that is not there: a
  member *arrived* when the same collective is among its own blocking operators, *passed* when it
  completed it (it issued it and has nothing in flight on the communicator at or before ``seq``);
  every other member -- no log, never issued ``seq``, or blocked on something else -- is
  **missing**, and the blocked members wait for each missing one (through one node per
  ``(communicator, seq)``, so a thousand ranks waiting for a thousand costs two thousand edges);
* a blocking ``recv`` ``#k`` from ``p`` waits for ``p``'s ``send`` ``#k`` to this rank on the same
  communicator (the P2P ``seq``), a ``send`` for the matching ``recv`` (the rendezvous): ``p``
  arrived when that operator is among its blocking ones, passed when it completed it;
* an operator some member (or the peer) **passed** while this rank still runs it waits for
  nobody: the rank's own device stopped inside it (NVIDIA's "stalled"); a collective every member
  arrived at and nobody passed waits for nobody either (stuck inside: transport or kernel);
* a rank with nothing in flight, or no log at all, waits for nobody.

The **roots** are the sinks the waiting reaches (strongly connected components without an edge
out): a single rank is a culprit; a component of several ranks is a wait cycle, a **deadlock**
(send/recv or collective order mismatched). Every other blocked rank is *waiting*, and
:meth:`WaitGraph.chain` walks from it to its root along a shortest path. All of it is numpy over
the in-flight rows plus :mod:`scipy.sparse.csgraph` (strong components and breadth-first orders),
linear in the rows and the edges.

Examples
--------
Rank 0 waits in a recv from 1; rank 1 waits in an all_reduce of ``tp`` ``{1, 2}`` for rank 2,
whose log ends in compute:

>>> import numpy as np
>>> g = wait_graph(rank=[0, 1, 1, 2], comm=[0, 1, 1, 1], seq=[0, 0, 1, 0], op=["recv", "all_reduce",
...                "all_reduce", "all_reduce"], peer=[1, -1, -1, -1], start=[5, 1, 4, 1],
...                is_open=[True, False, True, False], members={0: [0, 1], 1: [1, 2]}, world_size=3,
...                comm_names=["pp-0", "tp-0"])
>>> g.roots, g.deadlocks, g.waiting
([2], [], [0, 1])
>>> g.chain(0)
[(0, 'recv', 'pp-0', 0, 1), (1, 'all_reduce', 'tp-0', 1, 2)]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import breadth_first_order, connected_components

__all__ = ["WaitGraph", "wait_graph", "P2P_NAMES"]

P2P_NAMES = ("send", "recv")
_BIG = np.iinfo(np.int64).max
_NONE = -1

#: why a root waits for nobody
ROOT_IDLE, ROOT_NO_LOG, ROOT_STALLED, ROOT_INSIDE = "idle", "no_log", "stalled", "inside"


@dataclass
class OpNode:
    """A collective ``#seq`` of a communicator that blocked ranks wait in, and who is missing."""

    comm: int
    seq: int
    op: str
    blocked: np.ndarray      # ranks blocked in it (they arrived)
    missing: np.ndarray      # members neither arrived nor past it
    passed: np.ndarray       # members that completed it (none: a node with one is no node)
    rows: np.ndarray         # the blocked ranks' rows (indices into the arrays given)
    missing_last: np.ndarray     # per missing member: the last seq it issued on the communicator (-1: none)
    missing_open: np.ndarray     # per missing member: its first seq in flight there (-1: none)
    missing_no_log: np.ndarray   # per missing member: it has no log


@dataclass
class WaitGraph:
    """The wait-for graph (see the module docstring). Ranks are global ranks; ``comm_names`` maps
    the communicator codes the arrays use to their ids."""

    world_size: int
    comm_names: list[str]
    blocked: np.ndarray                                   # bool per rank: an operator in flight
    roots: list[int] = field(default_factory=list)        # culprits (sinks of one rank the waiting reaches)
    root_kind: dict[int, str] = field(default_factory=dict)   # root -> idle|no_log|stalled|inside
    deadlocks: list[list[int]] = field(default_factory=list)  # ranks of each wait cycle
    waiting: list[int] = field(default_factory=list)      # blocked ranks that reach a root
    nodes: list[OpNode] = field(default_factory=list)     # collective nodes (node id = world_size + i)
    p2p: list[tuple[int, str, int, int, int]] = field(default_factory=list)  # (rank, op, comm, seq, peer) waits
    root_op: dict[int, tuple[str, int, int]] = field(default_factory=dict)   # root -> (op, comm, seq) it stopped in
    _next: np.ndarray | None = None                       # node -> next node towards a root (-1: none)
    _sink: np.ndarray | None = None                       # node -> in a sink the blocked ranks reach
    _edge_key: np.ndarray | None = None                   # sorted src * n + dst
    _edge_lab: np.ndarray | None = None                   # its label: (op, comm, seq) row index
    _lab: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def waits_for(self, rank: int) -> list[int]:
        """The ranks ``rank`` waits for directly (through its collective's node, or a P2P peer)."""
        if self._edge_key is None:
            return []
        n = self.world_size + len(self.nodes)
        lo, hi = np.searchsorted(self._edge_key, [rank * n, (rank + 1) * n])
        out: set[int] = set()
        for d in (self._edge_key[lo:hi] % n).tolist():
            if d < self.world_size:
                out.add(int(d))
            else:
                out.update(int(x) for x in self.nodes[d - self.world_size].missing)
        return sorted(out)

    def chain(self, rank: int) -> list[tuple[int, str, str, int, int]]:
        """``[(rank, op, comm_id, seq, waits_for_rank), ...]`` from ``rank`` to its root (shortest);
        ``[]`` for a root or a rank that waits for nobody. In a deadlock it ends where the cycle
        closes."""
        out: list[tuple[int, str, str, int, int]] = []
        if self._next is None or self._edge_key is None or self._lab is None:
            return out
        n = self.world_size + len(self.nodes)
        ops, comms, seqs = self._lab
        seen = {rank}
        u = rank
        while True:
            v = int(self._next[u])
            if v < 0:
                return out
            k = int(np.searchsorted(self._edge_key, u * n + v))
            j = int(self._edge_lab[k])
            if v >= self.world_size:  # through a collective's node to one of its missing members
                w = int(self._next[v])
                if w < 0:
                    return out
                v = w
            out.append((u, str(ops[j]), self.comm_names[int(comms[j])], int(seqs[j]), v))
            if v in seen:
                return out
            seen.add(v)
            u = v

    def ends(self) -> tuple[np.ndarray, np.ndarray]:
        """Per rank, where its chain ends (the root, or the smallest rank of its deadlock; -1 for a
        rank that waits for nobody and is no root) and its length in ranks, by pointer jumping over
        the next hops (numpy, one pass per hop of the longest chain)."""
        W = self.world_size
        end = np.full(W, -1, np.int64)
        depth = np.zeros(W, np.int64)
        if self._next is None or self._sink is None:
            return end, depth
        cyc = np.full(W, -1, np.int64)
        for c in self.deadlocks:
            cyc[c] = min(c)
        cur = np.arange(W, dtype=np.int64)
        live = self.blocked.copy() | np.isin(cur, self.roots)
        n = len(self._next)
        for _ in range(n):
            stop = self._sink[cur] | (self._next[cur] < 0)
            move = live & ~stop
            if not move.any():
                break
            cur[move] = self._next[cur[move]]
            depth[move] += cur[move] < W
        node = live & (cur >= W)          # stopped on a collective's node inside a cycle
        cur[node] = np.where(self._next[cur[node]] >= 0, self._next[cur[node]], cur[node])
        at = live & (cur < W)
        end[at] = np.where(cyc[cur[at]] >= 0, cyc[cur[at]], cur[at])
        return end, depth


def _look(uk: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions of ``keys`` in the sorted unique ``uk`` and whether each is there."""
    if not len(uk):
        return np.zeros(len(keys), np.int64), np.zeros(len(keys), bool)
    i = np.minimum(np.searchsorted(uk, keys), len(uk) - 1)
    return i, uk[i] == keys


def _evicted(progress: tuple[np.ndarray, ...], rank: np.ndarray, comm: np.ndarray, seq: np.ndarray,
             op_code: np.ndarray, peer: np.ndarray, start: np.ndarray, is_open: np.ndarray, op_names: list[str],
             coll: np.ndarray, C: int) -> tuple[Any, ...]:
    """The arrays with one row added per collective a rank's status shows in flight
    (``last_completed + 1`` while ``last_enqueued`` is beyond it) although its log lost it: a ring
    buffer evicts its oldest entries, in flight or not, so that collective was issued before every
    entry the log kept (its issue time: before all of them). Its op is ``collective`` (unknown)."""
    pr_r, pr_c, pr_e, pr_d = (np.asarray(x, np.int64) for x in progress)
    key = rank[coll] * C + comm[coll]
    uk, inv = np.unique(key, return_inverse=True)
    first = np.full(len(uk), _BIG, np.int64)
    np.minimum.at(first, inv, seq[coll])
    i, found = _look(uk, pr_r * C + pr_c)
    lost = (pr_e > pr_d) & (~found | (np.where(found, first[i], _BIG) > pr_d + 1))
    n = int(lost.sum())
    if not n:
        return rank, comm, seq, op_code, peer, start, is_open, op_names
    names = list(op_names) + ([] if "collective" in op_names else ["collective"])
    code = names.index("collective")
    return (np.r_[rank, pr_r[lost]], np.r_[comm, pr_c[lost]], np.r_[seq, pr_d[lost] + 1],
            np.r_[op_code, np.full(n, code)], np.r_[peer, np.full(n, -1)],
            np.r_[start, np.full(n, np.iinfo(np.int64).min)], np.r_[is_open, np.ones(n, bool)], names)


def wait_graph(*, rank: Sequence[int] | np.ndarray, comm: Sequence[int] | np.ndarray,
               seq: Sequence[int] | np.ndarray, op: Sequence[str] | np.ndarray,
               peer: Sequence[int] | np.ndarray, start: Sequence[int] | np.ndarray,
               is_open: Sequence[bool] | np.ndarray, members: Mapping[int, Sequence[int]],
               world_size: int, comm_names: Sequence[str], no_log: Iterable[int] = (),
               op_names: Sequence[str] | None = None,
               progress: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None) -> WaitGraph:
    """Build the wait-for graph from every logged operator (completed and in flight).

    Parameters
    ----------
    rank, comm, seq, peer, start : array-like of int
        One entry per operator: its rank, communicator code (an index into ``comm_names``), CommOps
        ``seq``, P2P peer (-1 for collectives) and issue time (``start_ns``; int64 max where unknown).
    op : array-like of str or int
        CommOps operator names, or their codes into ``op_names`` when that is given.
    is_open : array-like of bool
        Not completed (``state`` ``started`` or ``scheduled``).
    members : mapping
        communicator code -> its member ranks.
    world_size : int
    comm_names : sequence of str
    no_log : iterable of int
        Ranks without a log (they wait for nobody, and every operator waiting for them finds them missing).
    op_names : sequence of str, optional
        The names ``op`` codes index (a dictionary-encoded column), so no string is compared per row.
    progress : tuple of arrays, optional
        ``(rank, comm, last_enqueued, last_completed)``: collectives a rank is known to have issued
        and completed beyond its log (Flight Recorder's ``pg_status`` outlives its ring buffer).
        Used for the (rank, communicator) pairs the log holds no collective of: a member whose
        window lost every entry of the communicator is then *passed* or *arrived* by its status,
        not missing.

    Returns
    -------
    WaitGraph
    """
    W = int(world_size)
    rank = np.asarray(rank, np.int64)
    comm = np.asarray(comm, np.int64)
    seq = np.asarray(seq, np.int64)
    peer = np.asarray(peer, np.int64)
    start = np.asarray(start, np.int64)
    is_open = np.asarray(is_open, bool)
    if op_names is None:
        names, op_code = np.unique(np.asarray(op, dtype=object).astype(str), return_inverse=True)
        op_names = [str(x) for x in names]
    else:
        op_names, op_code = [str(x) for x in op_names], np.asarray(op, np.int64)
    if progress is not None and len(progress[0]):
        # a status counts every operator of its group; on groups carrying P2P its numbers are not
        # the collectives' seq: used only on groups without P2P in any log
        p2p_rows = np.isin(op_code, [op_names.index(x) for x in P2P_NAMES if x in op_names])
        keep = ~np.isin(np.asarray(progress[1], np.int64), np.unique(comm[p2p_rows]))
        progress = tuple(np.asarray(x, np.int64)[keep] for x in progress)
        rank, comm, seq, op_code, peer, start, is_open, op_names = _evicted(
            progress, rank, comm, seq, op_code, peer, start, is_open, op_names, ~p2p_rows, max(len(comm_names), 1))
    send_c = op_names.index("send") if "send" in op_names else -2
    recv_c = op_names.index("recv") if "recv" in op_names else -2
    is_send = op_code == send_c
    is_p2p = is_send | (op_code == recv_c)
    C = max(len(comm_names), 1)
    nolog = np.zeros(W, bool)
    nl = np.fromiter((int(r) for r in no_log), np.int64)
    nolog[nl[(nl >= 0) & (nl < W)]] = True
    g = WaitGraph(W, list(comm_names), np.zeros(W, bool))
    op_name = np.asarray(op_names, dtype=object)
    g._lab = (op_name[op_code], comm, seq)

    # --- a P2P operator in flight whose peer completed the matching one, on a rank that issued
    #     operators after it, is an asynchronous operator whose completion the log did not see
    #     (isend/irecv waited on later): it counts as completed; it stays in flight (the rank's
    #     device stopped inside it) only when it is the rank's newest operator in flight
    if is_p2p.any() and is_open.any():
        pk = ((rank * C + comm) * 2 + is_send) * W + np.where(is_p2p, peer, 0)
        sel = is_p2p
        uk, inv = np.unique(pk[sel], return_inverse=True)
        last = np.full(len(uk), -1, np.int64)
        np.maximum.at(last, inv, seq[sel])
        fo = np.full(len(uk), _BIG, np.int64)
        op_ = is_open[sel]
        np.minimum.at(fo, inv[op_], seq[sel][op_])
        cand = np.flatnonzero(is_p2p & is_open & (peer >= 0) & (peer < W))
        mk = ((peer[cand] * C + comm[cand]) * 2 + (~is_send[cand])) * W + rank[cand]
        i, found = _look(uk, mk)
        passed = found & (last[i] >= seq[cand]) & (fo[i] > seq[cand])
        if passed.any():
            o = np.flatnonzero(is_open)
            newest = np.full(W, -1, np.int64)   # per rank: its newest open row (issue order)
            o = o[np.lexsort((o, start[o], rank[o]))]
            newest[rank[o]] = o                  # the last write per rank wins: the newest
            done = cand[passed & (newest[rank[cand]] != cand)]
            if len(done):
                is_open = is_open.copy()
                is_open[done] = False

    # --- blocking operators: per rank, the oldest in flight (+ the P2P before its first collective)
    o = np.flatnonzero(is_open)
    if not len(o):
        return g
    o = o[np.lexsort((o, start[o], rank[o]))]
    orank = rank[o]
    first = np.r_[True, orank[1:] != orank[:-1]]
    grp = np.cumsum(first) - 1
    gstart = np.flatnonzero(first)
    coll = ~is_p2p[o]
    coll_before = np.cumsum(coll) - coll          # collectives strictly before, within the group
    coll_before -= coll_before[gstart][grp]
    first_p2p = is_p2p[o[gstart]][grp]
    blocking = o[first | (first_p2p & is_p2p[o] & (coll_before == 0))]
    g.blocked[rank[blocking]] = True
    g.blocked &= ~nolog

    # --- per (rank, comm) collectives / per (rank, comm, direction, peer) P2P: last issued, first in flight,
    #     the seq range blocking
    def table(keys: np.ndarray, sel: np.ndarray) -> tuple[np.ndarray, ...]:
        k = keys[sel]
        s = seq[sel]
        op_ = is_open[sel]
        uk, inv = np.unique(k, return_inverse=True)
        last = np.full(len(uk), -1, np.int64)
        np.maximum.at(last, inv, s)
        fo = np.full(len(uk), _BIG, np.int64)
        np.minimum.at(fo, inv[op_], s[op_])
        return uk, last, fo

    ckey = rank * C + comm
    pkey = ((rank * C + comm) * 2 + is_send) * W + np.where(is_p2p, peer, 0)
    c_uk, c_last, c_fo = table(ckey, ~is_p2p)
    if progress is not None and len(progress[0]):  # (already without the P2P groups)
        pr_r, pr_c, pr_e, pr_d = (np.asarray(x, np.int64) for x in progress)
        k = pr_r * C + pr_c
        _, found = _look(c_uk, k)
        k, e, d = k[~found], pr_e[~found], pr_d[~found]
        if len(k):
            allk = np.r_[c_uk, k]
            o_ = np.argsort(allk, kind="stable")
            c_uk = allk[o_]
            c_last = np.r_[c_last, e][o_]
            c_fo = np.r_[c_fo, np.where(e > d, d + 1, _BIG)][o_]
    p_uk, p_last, p_fo = table(pkey, is_p2p)
    bl_c = blocking[~is_p2p[blocking]]
    bl_p = blocking[is_p2p[blocking]]
    c_bseq = np.full(len(c_uk), _NONE, np.int64)
    c_bseq[np.searchsorted(c_uk, ckey[bl_c])] = seq[bl_c]
    p_bmin = np.full(len(p_uk), _BIG, np.int64)
    p_bmax = np.full(len(p_uk), -1, np.int64)
    ip = np.searchsorted(p_uk, pkey[bl_p])
    np.minimum.at(p_bmin, ip, seq[bl_p])
    np.maximum.at(p_bmax, ip, seq[bl_p])

    look = _look
    src_l: list[np.ndarray] = []
    dst_l: list[np.ndarray] = []
    lab_l: list[np.ndarray] = []
    stalled = np.zeros(W, bool)
    inside = np.zeros(W, bool)

    # --- collectives: one node per (comm, seq) blocked in
    if len(bl_c):
        order = np.lexsort((seq[bl_c], comm[bl_c]))
        b = bl_c[order]
        newg = np.r_[True, (comm[b][1:] != comm[b][:-1]) | (seq[b][1:] != seq[b][:-1])]
        gid = np.cumsum(newg) - 1
        heads = b[newg]
        codes = sorted({int(c) for c in comm[heads]})
        mem = {c: np.unique(np.asarray(members.get(c, ()), np.int64)) for c in codes}
        for c in codes:  # communicators without a member list: the ranks that logged on them
            if not len(mem[c]):
                mem[c] = np.unique(rank[comm == c])
        sizes = np.array([len(mem[int(c)]) for c in comm[heads]], np.int64)
        flat = np.concatenate([mem[int(c)] for c in comm[heads]]) if len(heads) else np.zeros(0, np.int64)
        hg = np.repeat(np.arange(len(heads)), sizes)
        m = flat
        hc, hs = comm[heads][hg], seq[heads][hg]
        i, found = look(c_uk, m * C + hc)
        last = np.where(found, c_last[i], -1)
        fo = np.where(found, c_fo[i], _BIG)
        bs = np.where(found, c_bseq[i], _NONE)
        arrived = found & (bs == hs) & ~nolog[m]
        passed = found & (last >= hs) & (fo > hs) & ~nolog[m]
        missing = ~arrived & ~passed
        n_pass = np.bincount(hg, passed, len(heads)) > 0
        n_miss = np.bincount(hg, missing, len(heads)) > 0
        # ranks in a node some member passed: stalled; in a node none missing: stuck inside
        st_g = n_pass[gid]
        in_g = ~n_pass[gid] & ~n_miss[gid]
        stalled[rank[b[st_g]]] = True
        inside[rank[b[in_g]]] = True
        live = ~n_pass & n_miss
        node_of = np.full(len(heads), -1, np.int64)
        node_of[live] = W + np.arange(int(live.sum()))
        gcut = np.flatnonzero(newg)[1:]
        bsplit, rsplit = np.split(rank[b], gcut), np.split(b, gcut)
        cut = np.cumsum(sizes)[:-1]
        msplit, miss_split, pass_split = np.split(m, cut), np.split(missing, cut), np.split(passed, cut)
        lsplit, fsplit = np.split(last, cut), np.split(fo, cut)
        for h in np.flatnonzero(live):
            mm, ms = msplit[h], miss_split[h]
            g.nodes.append(OpNode(int(comm[heads[h]]), int(seq[heads[h]]), str(op_name[op_code[heads[h]]]),
                                  bsplit[h], mm[ms], mm[pass_split[h]], rsplit[h], lsplit[h][ms],
                                  np.where(fsplit[h][ms] == _BIG, -1, fsplit[h][ms]), nolog[mm[ms]]))
        lv = live[gid]
        src_l.append(rank[b[lv]])
        dst_l.append(node_of[gid[lv]])
        lab_l.append(b[lv])
        hm = live[hg] & missing
        src_l.append(node_of[hg[hm]])
        dst_l.append(m[hm])
        lab_l.append(heads[hg[hm]])
        for h in np.flatnonzero(n_pass | ~n_miss):
            for r in bsplit[h].tolist():
                g.root_op.setdefault(int(r), (str(op_name[op_code[heads[h]]]), int(comm[heads[h]]),
                                              int(seq[heads[h]])))

    # --- point-to-point: the matching operator on the peer (same comm, opposite direction, same seq)
    if len(bl_p):
        pr = peer[bl_p]
        ok = (pr >= 0) & (pr < W)
        mk = ((np.where(ok, pr, 0) * C + comm[bl_p]) * 2 + (~is_send[bl_p])) * W + rank[bl_p]
        i, found = look(p_uk, mk)
        k = seq[bl_p]
        found &= ok & ~nolog[np.where(ok, pr, 0)]
        arrived = found & (p_bmin[i] <= k) & (k <= p_bmax[i])
        passed = found & (p_last[i] >= k) & (p_fo[i] > k)
        wait = ok & ~arrived & ~passed
        src_l.append(rank[bl_p[wait]])
        dst_l.append(pr[wait])
        lab_l.append(bl_p[wait])
        g.p2p = [(int(rank[x]), str(op_name[op_code[x]]), int(comm[x]), int(seq[x]), int(peer[x]))
                 for x in bl_p[wait]]
        pst = passed | (ok & arrived)
        # a rank whose every blocking P2P waits for nobody is a root: stalled when a peer passed it
        has_wait = np.zeros(W, bool)
        has_wait[rank[bl_p[wait]]] = True
        cand = rank[bl_p[pst]]
        cand = cand[~has_wait[cand]]
        stalled[rank[bl_p[passed & ~has_wait[rank[bl_p]]]]] = True
        inside[cand] |= ~stalled[cand]
        for x in bl_p[pst & ~has_wait[rank[bl_p]]].tolist():
            g.root_op.setdefault(int(rank[x]), (str(op_name[op_code[x]]), int(comm[x]), int(seq[x])))

    # --- the graph: strong components, the sinks the blocked ranks reach, the next hop to a root
    src = np.concatenate(src_l) if src_l else np.zeros(0, np.int64)
    dst = np.concatenate(dst_l) if dst_l else np.zeros(0, np.int64)
    lab = np.concatenate(lab_l) if lab_l else np.zeros(0, np.int64)
    n = W + len(g.nodes)
    key = src * n + dst
    key, ix = np.unique(key, return_index=True)
    src, dst, lab = key // n, key % n, lab[ix]
    g._edge_key, g._edge_lab = key, lab
    has_out = np.zeros(n, bool)
    has_out[src] = True
    adj = csr_matrix((np.ones(len(src), np.int8), (src, dst)), shape=(n + 1, n + 1))
    ncomp, comp = connected_components(adj[:n, :n], directed=True, connection="strong")
    cross = comp[src] != comp[dst]
    comp_out = np.zeros(ncomp, bool)
    comp_out[comp[src[cross]]] = True
    # reach from the blocked ranks (a virtual source n)
    bl = np.flatnonzero(g.blocked)
    sup = csr_matrix((np.ones(len(src) + len(bl), np.int8),
                      (np.r_[src, np.full(len(bl), n)], np.r_[dst, bl])), shape=(n + 1, n + 1))
    reached = np.zeros(n + 1, bool)
    reached[breadth_first_order(sup, n, directed=True, return_predecessors=False)] = True
    reached = reached[:n]
    sink = ~comp_out[comp] & reached
    csize = np.bincount(comp, minlength=ncomp)
    rk = np.arange(W)
    root_mask = sink[:W] & (csize[comp[:W]] == 1)
    g.roots = [int(r) for r in rk[root_mask]]
    for r in g.roots:
        g.root_kind[r] = (ROOT_NO_LOG if nolog[r] else ROOT_STALLED if stalled[r] else
                          ROOT_INSIDE if inside[r] or g.blocked[r] else ROOT_IDLE)
    cyc = sink[:W] & (csize[comp[:W]] > 1)
    for c in np.unique(comp[:W][cyc]):
        g.deadlocks.append([int(r) for r in rk[cyc & (comp[:W] == c)]])
    g.waiting = [int(r) for r in rk[reached[:W] & has_out[:W] & ~root_mask & ~cyc]]
    # next hop towards the nearest root: breadth-first from the sinks over the reversed edges
    targets = np.flatnonzero(sink)
    rev = csr_matrix((np.ones(len(src) + len(targets), np.int8),
                      (np.r_[dst, np.full(len(targets), n)], np.r_[src, targets])), shape=(n + 1, n + 1))
    _, pred = breadth_first_order(rev, n, directed=True, return_predecessors=True)
    nxt = pred[:n].astype(np.int64)
    nxt[(nxt == n) | (nxt < 0)] = -1
    # inside a cycle, the next hop is the cycle's own edge (the BFS from the sink set gives none)
    for cyc_ranks in g.deadlocks:
        cs = set(cyc_ranks)
        for u in cyc_ranks:
            lo, hi = np.searchsorted(key, [u * n, (u + 1) * n])
            for v in (key[lo:hi] % n).tolist():
                tgt = [v] if v < W else [int(x) for x in g.nodes[v - W].missing]
                if any(t in cs for t in tgt):
                    nxt[u] = v
                    if v >= W:
                        nxt[v] = next(t for t in tgt if t in cs)
                    break
    g._next, g._sink = nxt, sink
    return g
