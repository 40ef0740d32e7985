"""The communication-operator graph (COG) of Holmes, built incrementally from fetched ranks.

The paper (§4.3.1, Fig. 11c) links every operator to the *communicator group* it ran on instead
of to every GPU that took part: an operator has one edge, to its group, and the group knows its
member GPUs. Holmes keeps exactly that sparse form:

* :class:`RankOps` holds the operators of one fetched rank as columnar numpy arrays, sorted in
  execution order (iteration, op_index): the "linked list" of the paper is simply row order.
* :class:`CommOpGraph` holds the groups (comm_id -> kind and members; expert-parallel groups
  whose members equal a data-parallel group are folded into it, pipeline groups are kept as
  plain P2P pairs) and the :class:`RankOps` of the ranks fetched so far. Memory grows with what
  was fetched, never with the world size.

The same collective is matched across ranks by ``(comm_id, seq)``; a P2P operator by
``(comm_id, sender, receiver, seq)``: a ``send`` of rank *a* to *b* matches the ``recv`` of *b*
from *a* with the same ``seq``.

Examples
--------
>>> from holmes.io.schema import ops_table
>>> t = ops_table(rank=[0, 0], iteration=[0, 0], op_index=[0, 1], comm_id=["tp-0", "pp-0"],
...               seq=[0, 0], op=["all_reduce", "send"], peer=[None, 1], nbytes=[8, 8],
...               start_ns=[0, 50], end_ns=[40, 60])
>>> g = CommOpGraph({"tp-0": ("tp", (0, 1)), "pp-0": ("pp", (0, 1))})
>>> ro = g.add_rank(0, t)
>>> ro.find_collective(g.comm_code("tp-0"), 0, iteration=0)
0
>>> g.group_members("tp-0")
(0, 1)
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from holmes.cog.own_work import own_work_gaps, wait_arrays
from holmes.stats import excess_over_low

__all__ = ["RankOps", "CommOpGraph", "OP_CODES"]

log = logging.getLogger(__name__)

#: operator name -> small integer code used in :attr:`RankOps.op`
OP_CODES = {"all_reduce": 0, "all_gather": 1, "reduce_scatter": 2, "all_to_all": 3, "broadcast": 4,
            "reduce": 5, "barrier": 6, "send": 7, "recv": 8}
OP_NAMES = {v: k for k, v in OP_CODES.items()}
SEND, RECV = OP_CODES["send"], OP_CODES["recv"]
#: collectives whose members all complete together (the last data arrives everywhere at once):
#: a copy recorded ending later was *observed* late (not broadcast/reduce: a tree's members end in turn)
SYMMETRIC = np.array([OP_CODES[o] for o in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "barrier")])


def _codes(col: pa.ChunkedArray, table: Mapping[str, int], add: Any) -> np.ndarray:
    """Integer codes of a (possibly dictionary-encoded) string column."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if not pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_encode()
    values = arr.dictionary.to_pylist()
    lut = np.array([add(v) for v in values] or [0], dtype=np.int32)
    idx = arr.indices.to_numpy(zero_copy_only=False)
    return lut[idx.astype(np.int64)] if len(idx) else np.zeros(0, dtype=np.int32)


class RankOps:
    """The operators of one rank as numpy arrays, in execution order.

    Attributes
    ----------
    rank : int
    iteration, op_index, comm, seq, op, peer, start, end : numpy arrays (one entry per row)
        ``comm`` holds communicator codes of the owning :class:`CommOpGraph`; ``op`` codes of
        :data:`OP_CODES`; ``peer`` is -1 for collectives.
    duration : numpy.ndarray
        ``end - start`` in ns.
    abnormal : numpy.ndarray of bool or None
        Set by the localizer once a detector has looked at the rank.
    """

    __slots__ = ("rank", "iteration", "op_index", "comm", "seq", "op", "peer", "start", "end", "duration", "nbytes",
                 "abnormal", "_iters", "_iter_lo", "_iter_hi", "table", "_excess", "_compute", "wait", "_gap")

    def __init__(self, rank: int, table: pa.Table, comm_code: Any) -> None:
        self.rank = int(rank)
        self.table = table
        n = table.num_rows

        def col(name: str, dtype: Any) -> np.ndarray:
            return table.column(name).to_numpy().astype(dtype, copy=False)

        self.iteration = col("iteration", np.int64)
        self.op_index = col("op_index", np.int32)
        self.seq = col("seq", np.int64)
        self.start = col("start_ns", np.int64)
        self.end = col("end_ns", np.int64)
        self.duration = self.end - self.start
        # (return_ns, wait_ns) of the asynchronous operators the rank waited on (-1: none; None: not logged)
        self.wait = wait_arrays(table) if n else None
        self.nbytes = col("nbytes", np.int64)
        self.comm = _codes(table.column("comm_id"), {}, comm_code)
        self.op = _codes(table.column("op"), OP_CODES, lambda v: OP_CODES.get(v, 0))
        peer = table.column("peer")
        self.peer = peer.fill_null(-1).to_numpy().astype(np.int32, copy=False) if n else np.zeros(0, np.int32)
        self.abnormal: np.ndarray | None = None
        self._excess: tuple[float, np.ndarray, np.ndarray] | None = None
        self._compute: tuple[np.ndarray, np.ndarray] | None = None
        self._gap: np.ndarray | None = None
        self._iters, first = np.unique(self.iteration, return_index=True)
        self._iter_lo = first
        self._iter_hi = np.append(first[1:], n)

    def __len__(self) -> int:
        return len(self.iteration)

    def __repr__(self) -> str:
        return f"RankOps(rank={self.rank}, rows={len(self)})"

    def set_end(self, end: np.ndarray) -> None:
        """Replace the operators' end times (ns), e.g. :meth:`CommOpGraph.align_collective_ends`;
        durations and :attr:`table` (an in-memory copy: nothing read is written back) follow, and
        the cached compute and excess are recomputed on demand."""
        end = np.asarray(end, dtype=np.int64)
        if end.shape != self.end.shape:
            raise ValueError(f"{end.shape[0]} end times for {len(self)} rows of rank {self.rank}")
        i = self.table.schema.get_field_index("end_ns")
        self.table = self.table.set_column(i, self.table.schema.field(i), pa.array(end, self.table.schema.field(i).type))
        self.end = end
        self.duration = end - self.start
        self._excess = None
        self._compute = None
        self._gap = None

    @property
    def is_p2p(self) -> np.ndarray:
        return self.op >= SEND

    def iteration_rows(self, iteration: int) -> tuple[int, int]:
        """Row range ``[lo, hi)`` of one iteration (empty range if the rank has none)."""
        i = int(np.searchsorted(self._iters, iteration))
        if i < len(self._iters) and self._iters[i] == iteration:
            return int(self._iter_lo[i]), int(self._iter_hi[i])
        return 0, 0

    def _find(self, mask_fn: Any, iteration: int | None) -> int | None:
        if iteration is not None:
            lo, hi = self.iteration_rows(iteration)
            if hi > lo:
                hit = np.flatnonzero(mask_fn(slice(lo, hi)))
                if hit.size:
                    return lo + int(hit[0])
        hit = np.flatnonzero(mask_fn(slice(None)))
        return int(hit[0]) if hit.size else None

    def find_collective(self, comm: int, seq: int, iteration: int | None = None) -> int | None:
        """Row of this rank's copy of collective ``(comm, seq)``, or None."""
        return self._find(lambda s: (self.comm[s] == comm) & (self.seq[s] == seq) & (self.op[s] < SEND), iteration)

    def find_p2p(self, comm: int, seq: int, op: int, peer: int, iteration: int | None = None) -> int | None:
        """Row of this rank's P2P op ``op`` (send/recv code) with ``peer`` and ``seq`` on ``comm``."""
        return self._find(lambda s: (self.comm[s] == comm) & (self.seq[s] == seq) & (self.op[s] == op)
                          & (self.peer[s] == peer), iteration)

    def earlier_rows(self, row: int, *, previous_tail: bool = True) -> np.ndarray:
        """Rows before ``row`` in its iteration, latest first (the paper's "operators before n").

        When ``row`` is the first operator of its iteration and ``previous_tail`` is set, the rows
        of the previous iteration are returned instead (latest first): what delayed the first
        operator happened at the end of the previous iteration.
        """
        lo, _ = self.iteration_rows(int(self.iteration[row]))
        if row == lo and previous_tail and lo > 0:
            plo, _ = self.iteration_rows(int(self.iteration[lo - 1]))
            return np.arange(lo - 1, plo - 1, -1)
        return np.arange(row - 1, lo - 1, -1)

    def position_series(self, op_index: int, iterations: np.ndarray, *, gap: bool = False) -> np.ndarray:
        """Per iteration of ``iterations``: duration of the op at ``op_index`` (NaN where absent).

        With ``gap=True`` the compute gap before it (its start minus the previous op's end, the
        previous op being the last one of the previous iteration for the first op) is returned.
        """
        rows = np.flatnonzero(self.op_index == op_index)
        out = np.full(len(iterations), np.nan)
        if rows.size == 0:
            return out
        its = self.iteration[rows]
        if gap:
            vals = np.where(rows > 0, self.gap[rows], np.nan).astype(float)
        else:
            vals = self.duration[rows].astype(float)
        pos = np.searchsorted(iterations, its)
        ok = (pos < len(iterations)) & (iterations[np.minimum(pos, len(iterations) - 1)] == its)
        out[pos[ok]] = vals[ok]
        return out

    @property
    def gap(self) -> np.ndarray:
        """Per row, the time between the previous row's end and this row's start (0 for row 0):
        the rank's own work (compute, data loading, optimizer) before it issued the op. Where the
        log says when the rank waited on an asynchronous operator (``wait_ns``), the time since
        that operator's start less the time blocked in ``wait()``
        (:func:`~holmes.cog.own_work.own_work_gaps`)."""
        if self._gap is None:
            self._gap = (own_work_gaps(self.start, self.end) if self.wait is None else
                         own_work_gaps(self.start, self.end, self.wait[1], self.wait[0]))
            self._gap.setflags(write=False)  # cached: shared by every caller
        return self._gap

    def excess(self, quantile: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
        """Per row, how much longer than usual its compute gap and its duration were.

        "Usual" is the ``quantile`` (default the 10th percentile) of the same operator position
        (``op_index``) over every iteration of the rank: like the iteration monitor's reference it
        stays on the healthy level even when a persistent slowdown covers most iterations. Both
        are measured on the rank's own clock, so clock skew between hosts plays no part.

        Returns
        -------
        gap_excess, duration_excess : int64 arrays, >= 0
        """
        if self._excess is None or self._excess[0] != quantile:
            gap = self.gap
            self._excess = (quantile, excess_over_low(gap, self.op_index, quantile),
                            excess_over_low(self.duration, self.op_index, quantile))
        return self._excess[1], self._excess[2]

    def describe_compute(self, row: int, comm_ids: list[str]) -> dict[str, Any]:
        """:meth:`describe` of ``row`` with the compute gap before it and that gap's excess over
        its usual length (:meth:`excess`): the step of a compute cause."""
        d = self.describe(row, comm_ids)
        d["compute_gap_ns"] = int(self.gap[row])
        d["gap_excess_ns"] = int(self.excess()[0][row])
        return d

    def largest_gap_row(self, iteration: int) -> int | None:
        """The row of ``iteration`` whose compute gap grew most over its usual length (None when
        the rank has no such iteration)."""
        lo, hi = self.iteration_rows(iteration)
        if hi <= lo:
            return None
        return lo + int(np.argmax(self.excess()[0][lo:hi]))

    def iteration_compute(self) -> tuple[np.ndarray, np.ndarray]:
        """``(iterations, compute_ns)``: per iteration, the sum of the rank's compute gaps (its own
        work between operators, not the waiting inside them)."""
        if self._compute is None:
            self._compute = self.iteration_sums(np.maximum(self.gap, 0))
        return self._compute

    def iteration_sums(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(iterations, sums)``: a per-row array summed over each iteration's rows."""
        v = np.asarray(values)
        return self._iters, (np.add.reduceat(v, self._iter_lo) if len(self) else np.zeros(0, v.dtype))

    def describe(self, row: int, comm_ids: list[str]) -> dict[str, Any]:
        """A small JSON-able description of one row."""
        d: dict[str, Any] = {"rank": self.rank, "iteration": int(self.iteration[row]),
                             "op_index": int(self.op_index[row]), "op": OP_NAMES.get(int(self.op[row]), "?"),
                             "comm_id": comm_ids[int(self.comm[row])], "seq": int(self.seq[row]),
                             "duration_ns": int(self.duration[row])}
        if self.peer[row] >= 0:
            d["peer"] = int(self.peer[row])
        if self.abnormal is not None:
            d["abnormal"] = bool(self.abnormal[row])
        return d


class CommOpGraph:
    """The grouped, sparse COG: operators linked to communicator groups, built from fetched ranks.

    Parameters
    ----------
    communicators : mapping
        comm_id -> object with ``kind`` and ``ranks`` (e.g. :class:`holmes.topology.Communicator`)
        or a ``(kind, ranks)`` pair.
    fold_ep : bool, default True
        Fold an expert-parallel group into the data-parallel group with the same members (the
        paper's footnote to Fig. 11c): both then share one group node.
    """

    def __init__(self, communicators: Mapping[str, Any], *, fold_ep: bool = True) -> None:
        self.comm_ids: list[str] = []
        self._code: dict[str, int] = {}
        self.kinds: list[str] = []
        self.members: list[tuple[int, ...]] = []
        self.group_of: list[int] = []  # comm code -> group node id (after folding)
        self.ranks: dict[int, RankOps] = {}
        self._groups_of: dict[int, list[int]] | None = None
        by_members: dict[tuple[int, ...], int] = {}
        for cid, c in communicators.items():
            kind, ranks = (c.kind, c.ranks) if hasattr(c, "kind") else (c[0], c[1])
            ranks = tuple(sorted(int(r) for r in ranks))
            code = self._add(cid, kind, ranks)
            if kind in ("dp", "ep") and fold_ep:
                g = by_members.setdefault(ranks, code)
                self.group_of[code] = g
            log.debug("group %s kind %s %d ranks", cid, kind, len(ranks))

    def _add(self, cid: str, kind: str, ranks: tuple[int, ...]) -> int:
        code = len(self.comm_ids)
        self.comm_ids.append(cid)
        self._code[cid] = code
        self.kinds.append(kind)
        self.members.append(ranks)
        self.group_of.append(code)
        return code

    def comm_code(self, comm_id: str) -> int:
        """Integer code of ``comm_id``; unknown ids (logs without job.json entries) get a new code."""
        c = self._code.get(comm_id)
        if c is None:
            c = self._add(comm_id, "other", ())
        return c

    def group_members(self, comm: int | str) -> tuple[int, ...]:
        """Member ranks of a communicator (by code or id)."""
        code = self.comm_code(comm) if isinstance(comm, str) else int(comm)
        return self.members[code]

    def groups_of(self, rank: int) -> list[int]:
        """Codes of the collective (non-pipeline) communicators of two or more ranks ``rank`` is in.

        >>> CommOpGraph({"tp": ("tp", (0, 1)), "pp": ("pp", (0, 2)), "dp": ("dp", (0, 3))}).groups_of(0)
        [0, 2]
        """
        if self._groups_of is None:
            idx: dict[int, list[int]] = {}
            for code, members in enumerate(self.members):
                if self.kinds[code] != "pp" and len(members) >= 2:
                    for m in members:
                        idx.setdefault(m, []).append(code)
            self._groups_of = idx
        return self._groups_of.get(int(rank), [])

    def is_group_kind(self, comm: int) -> bool:
        """False for pipeline communicators (kept as plain P2P pairs, not grouped)."""
        return self.kinds[comm] != "pp"

    def add_rank(self, rank: int, table: pa.Table) -> RankOps:
        """Add the operators of a fetched rank (idempotent) and return its :class:`RankOps`."""
        ro = self.ranks.get(rank)
        if ro is None:
            ro = RankOps(rank, table, self.comm_code)
            self.ranks[rank] = ro
        return ro

    def __contains__(self, rank: object) -> bool:
        return rank in self.ranks

    def align_collective_ends(self, host_of: Any, slack_ns: float) -> int:
        """End each copy of a symmetric collective (:data:`SYMMETRIC`) that was still open when its
        rank issued its next operator, and was recorded ending more than ``slack_ns`` after its
        host's first copy of the same instance, when that first copy ended.

        The members of an all-reduce (all-gather, reduce-scatter, all-to-all, barrier) complete
        together. An asynchronous copy that ends well after another copy *on the same clock*
        (``host_of(rank)`` equal), after its rank had gone on to its next operator, was observed
        late: gloo completes an asynchronous operator through a Python future callback, which waits
        for the GIL of a rank busy with its own work (DDP's buckets during the backward). That time
        was the rank's, not the operator's: left in place it hides the rank's compute (its next
        operator starts "before" the previous ended) and lowers its usual level. A synchronous copy
        is never moved (it ended before its rank went on: a late end there is the rank scheduled
        back late), nor are copies compared across hosts (their clocks differ). Returns how many
        copies were moved; the fetched ranks are changed in place (their tables too, in memory).

        >>> from holmes.io.schema import ops_table
        >>> g = CommOpGraph({"dp": ("dp", (0, 1))})
        >>> for r, (s1, e0) in ((0, (500, 900)), (1, (450, 400))):  # rank 0 went on at 500, its copy "ended" at 900
        ...     _ = g.add_rank(r, ops_table(rank=[r] * 2, iteration=[0, 0], op_index=[0, 1], comm_id=["dp"] * 2,
        ...                                 seq=[0, 1], op=["all_reduce"] * 2, peer=[None] * 2, nbytes=[8] * 2,
        ...                                 start_ns=[100, s1], end_ns=[e0, 950]))
        >>> g.align_collective_ends(lambda r: 0, 100), g.ranks[0].end.tolist(), g.ranks[0].duration.tolist()
        (1, [400, 950], [300, 450])
        >>> g.ranks[0].table.column("end_ns").to_pylist()  # the per-rank table reads the same
        [400, 950]
        >>> g.align_collective_ends(lambda r: r, 100)  # two hosts: two clocks, nothing compared
        0
        """
        ranks = [ro for ro in self.ranks.values() if len(ro)]
        if len(ranks) < 2:
            return 0
        sel = [np.flatnonzero(np.isin(ro.op, SYMMETRIC)) for ro in ranks]
        host = np.concatenate([np.full(k.size, int(host_of(ro.rank)), np.int64) for ro, k in zip(ranks, sel)])
        comm = np.concatenate([ro.comm[k].astype(np.int64) for ro, k in zip(ranks, sel)])
        seq = np.concatenate([ro.seq[k] for ro, k in zip(ranks, sel)])
        end = np.concatenate([ro.end[k] for ro, k in zip(ranks, sel)])
        if not end.size:
            return 0
        # per copy, the first end among the copies of its instance on its host
        _, inv = np.unique(np.stack([host, comm, seq], axis=1), axis=0, return_inverse=True)
        inv = inv.reshape(-1)
        earliest = np.full(int(inv.max()) + 1, np.iinfo(np.int64).max)
        np.minimum.at(earliest, inv, end)
        first_end = earliest[inv]
        moved, at = 0, 0
        for ro, k in zip(ranks, sel):
            fe = first_end[at:at + k.size]
            at += k.size
            nxt = np.append(ro.start[1:], np.iinfo(np.int64).max)[k]
            # only a copy still open when its rank issued its next operator (asynchronous: a
            # synchronous one ends before the rank goes on, whenever it is scheduled back)
            late = (ro.end[k] > fe + slack_ns) & (ro.end[k] > nxt)
            if late.any():
                new = ro.end.copy()
                rows = k[late]
                new[rows] = np.maximum(fe[late], ro.start[rows])
                ro.set_end(new)
                moved += int(late.sum())
        return moved

    @property
    def num_groups(self) -> int:
        return len(set(self.group_of))

    @property
    def num_operators(self) -> int:
        return sum(len(r) for r in self.ranks.values())

    def to_networkx(self, iteration: int | None = None) -> Any:
        """The fetched part of the COG as a networkx graph (for inspection and graph baselines).

        Nodes: ``("op", rank, row)`` operators, ``("group", code)`` groups and ``("gpu", rank)``.
        Edges: each operator to its group (P2P operators to the peer GPU instead), each operator to
        the next one of its rank (execution order), each group to its member GPUs.
        """
        import networkx as nx

        g = nx.DiGraph()
        for r, ro in self.ranks.items():
            rows = np.arange(len(ro)) if iteration is None else np.arange(*ro.iteration_rows(iteration))
            prev = None
            for row in rows.tolist():
                node = ("op", r, row)
                g.add_node(node, rank=r, duration=int(ro.duration[row]))
                if ro.op[row] >= SEND:
                    g.add_edge(node, ("gpu", int(ro.peer[row])))
                else:
                    g.add_edge(node, ("group", self.group_of[int(ro.comm[row])]))
                if prev is not None:
                    g.add_edge(prev, node, order=True)
                prev = node
        for node in [n for n in g.nodes if n[0] == "group"]:
            for m in self.members[node[1]]:
                g.add_edge(node, ("gpu", m))
        return g
