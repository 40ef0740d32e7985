"""Algorithm 1 of Holmes: root-cause search on the communication-operator graph.

Starting from abnormal operators of a pivot rank in one iteration, the search walks the COG:

* **collective** ``o`` (BFS over its group): read the members' copies of ``o`` (matched by
  ``(comm_id, seq)``). If some member's copy is *normal*, that member entered last and everybody
  waited for it: follow it back through its earlier operators of the same iteration (latest
  first). The latest abnormal one is searched next; if none is abnormal the member's own
  computation delayed it: cause **COMPUTE** on that GPU. If every copy is abnormal the
  communication itself is slow: cause **NETWORK** over the group's members.
* **P2P** ``o`` (DFS along peers): read the peer's matching operator (``(comm_id, sender,
  receiver, seq)``). Both abnormal, or no peer: **NETWORK** between the pair. Peer normal: the
  peer was late; follow its earlier operators as above (COMPUTE on the peer if none is abnormal).

A copy's label is not the only evidence of who was late. Every member of a collective (both
sides of a P2P transfer) completes at about the same time, so the member that entered last has
the *shortest* duration, measured on its own clock (no cross-host clock skew involved). A copy
flagged abnormal that lasted at most ``late_ratio`` (default 1/2) of the operator being searched
is therefore treated as the late arriver too: a detector that flags a few noisy short copies (as
on CPU or shared machines) does not turn a straggler into a false NETWORK verdict.

The search is iterative (an explicit stack, no recursion limit), keeps a visited set per
iteration (cycles end), handles several start operators at once and records the evidence path
of every cause. Ranks are fetched and run through the detector only when the search needs them;
members of a group are read in a useful order (a member found normal in an earlier iteration,
then members already fetched, then the rest) and reading stops at the first normal copy.

Scanning a large group (a data-parallel group of hundreds of ranks) for its late member is what
costs reads at scale, and the iteration's other branches often explain it anyway. So the scans of
one group read at most ``scan_reads`` members anew over a whole search; a branch whose scan reaches that bound
without finding the late member is *set aside*. Once the iteration's other branches are searched,
the set-aside scans are resumed in full only when nothing else found a cause (so a slow ring is
still named, at the old cost); otherwise they are dropped and listed in
:attr:`GraphSearch.set_aside` (the report says so).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from holmes.calibration.thresholds import or_shipped
from holmes.cog.graph import RECV, SEND, CommOpGraph, RankOps
from holmes.display import EVIDENCE_DEVICES
from holmes.errors import ConfigError

__all__ = ["COMPUTE", "NETWORK", "RootCause", "GraphSearch"]

log = logging.getLogger(__name__)

COMPUTE = "compute"
NETWORK = "network"

#: what a bounded scan returns when it stops before finding the group's late member
_SET_ASIDE: Any = object()


class _NotRead(Exception):
    """A search within :meth:`GraphSearch.fetched_only` needed a rank it had not read."""


@dataclass
class RootCause:
    """One root cause found by the search.

    Attributes
    ----------
    iteration : int
    cause : str
        ``"compute"`` or ``"network"``.
    ranks : tuple of int
        The involved GPUs: the straggler (compute), or the group members / the P2P pair (network).
    rank, row : int
        Where the root operator was found (rank and row of its :class:`~holmes.cog.RankOps`).
    op : dict
        Description of the root operator (op, comm_id, seq, op_index, duration_ns, ...).
    evidence : list of dict
        The search path: one step per operator visited, from the start operator to the cause.
    note : str or None
        Why the verdict is less certain (e.g. a member's log was missing).
    rate : float
        Irregularity rate R, filled in by the ranking.
    """

    iteration: int
    cause: str
    ranks: tuple[int, ...]
    rank: int
    row: int
    op: dict[str, Any]
    evidence: list[dict[str, Any]] = field(default_factory=list)
    note: str | None = None
    rate: float = 0.0
    devices: list[str] | None = None

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"iteration": self.iteration, "ranks": list(self.ranks), "cause": self.cause,
                             "op": self.op.get("op"), "operator": self.op, "irregularity_rate": round(self.rate, 6),
                             "evidence": self.evidence}
        if self.note:
            d["note"] = self.note
        if self.devices is not None:
            d["devices"] = list(self.devices[:EVIDENCE_DEVICES])
        return d


def _waited_more(ro: RankOps, gap_x: np.ndarray, dur_x: np.ndarray, a: int, row: int) -> bool:
    """Whether ``ro`` was behind at ``row`` more from waiting (the excess ``dur_x`` of its
    operators of ``row``'s iteration up to ``a``) than from its own compute (the excess ``gap_x``
    of its compute gaps up to ``row``). An ``a`` of the previous iteration (``row`` opens its
    iteration) counts no waiting: the compute gap decides, as without the rule."""
    lo = ro.iteration_rows(int(ro.iteration[row]))[0]
    return int(dur_x[lo:a + 1].sum()) > int(gap_x[lo:row + 1].sum())


class GraphSearch:
    """Progressive Algorithm-1 search over a :class:`~holmes.cog.CommOpGraph`.

    Parameters
    ----------
    source : JobSource
        Gives ranks' tables (None when missing).
    detector : object with ``predict_ops(table) -> bool array``
    graph : CommOpGraph, optional
        Built from ``source.communicators`` when omitted.
    max_steps : int, optional
        Safety bound on operators visited per search (default the threshold ``search_max_steps``).
    late_ratio : float, optional
        A member's copy lasting at most this fraction of the searched operator's duration marks
        that member as the late arriver even when the detector flagged the copy; 0 trusts the
        detector's labels alone (the paper's rule). Default the threshold ``late_ratio``.
    scan_reads : int or None, default None
        Members the scans of one collective group may read (fetch anew) over the whole search
        before a branch scanning it is set aside (resumed in full only if the iteration's other
        branches find no cause); None or 0: every scan runs to the end at once (the paper's search).
    follow_waits : bool, default True
        A late rank whose compute gap grew more than its latest abnormal operator still passes
        the blame on through that operator when, over the iteration so far, it lost more time
        waiting in operators than computing (see :meth:`_follow`); False: the gap alone decides.

    Attributes
    ----------
    set_aside : list of dict
        The scans dropped because the other branches of their iteration found its causes: one
        entry per scan (``iteration``, ``rank``, ``comm_id``, ``members``, ``members_read``).
    """

    def __init__(self, source: Any, detector: Any, graph: CommOpGraph | None = None, *,
                 max_steps: int | None = None, late_ratio: float | None = None, scan_reads: int | None = None,
                 follow_waits: bool = True) -> None:
        max_steps = or_shipped(max_steps, "search_max_steps")
        late_ratio = or_shipped(late_ratio, "late_ratio")
        if not 0.0 <= late_ratio < 1.0:
            raise ConfigError(f"late_ratio={late_ratio} must lie in [0, 1)")
        if scan_reads is not None and (isinstance(scan_reads, bool) or int(scan_reads) != scan_reads
                                       or scan_reads < 0):
            raise ConfigError(f"scan_reads={scan_reads!r} must be None or an integer >= 0")
        self.scan_reads = int(scan_reads) if scan_reads else None
        self.set_aside: list[dict[str, Any]] = []
        self._read_new = True
        self.source = source
        self.detector = detector
        self.graph = graph if graph is not None else CommOpGraph(source.communicators)
        self.max_steps = max_steps
        self.late_ratio = float(late_ratio)
        self.hints: dict[int, int] = {}  # group node -> member whose copy was normal last time
        self.steps = 0
        self.follow_waits = bool(follow_waits)

    # ------------------------------------------------------------------ fetching
    @contextmanager
    def fetched_only(self) -> Iterator[None]:
        """Within the block, searches read no rank they have not read before: a branch that would
        need one ends without a cause (the null iterations, which judge the ranks the search read).

        Examples
        --------
        >>> from holmes.io import MemoryJob
        >>> from holmes.detect import LabelDetector
        >>> from holmes.localize.evidence.sources import JobSource
        >>> job = MemoryJob({"world_size": 2, "communicators": {"dp-0": {"kind": "dp", "ranks": [0, 1]}}}, {})
        >>> s = GraphSearch(JobSource(job), LabelDetector())
        >>> with s.fetched_only():
        ...     s.search(0, [])
        []
        """
        before, self._read_new = self._read_new, False
        try:
            yield
        finally:
            self._read_new = before

    def rank_ops(self, rank: int) -> RankOps | None:
        """The rank's operators with detector flags (fetched and detected once), or None if missing."""
        ro = self.graph.ranks.get(rank)
        if ro is not None:
            return ro
        if not self._read_new and rank not in self.source.missing:
            raise _NotRead(rank)
        t = self.source.fetch(rank)
        if t is None:
            return None
        ro = self.graph.add_rank(rank, t)
        flags = np.asarray(self.detector.predict_ops(t), dtype=bool)
        if flags.shape != (len(ro),):
            raise ConfigError(f"detector returned {flags.shape} flags for {len(ro)} rows of rank {rank}")
        ro.abnormal = flags
        log.debug("fetched rank %d: %d ops, %d abnormal", rank, len(ro), int(flags.sum()))
        return ro

    def _member_order(self, comm: int, me: int) -> list[int]:
        members = self.graph.members[comm]
        gnode = self.graph.group_of[comm]
        hint = self.hints.get(gnode)
        fetched = [m for m in members if m != me and m in self.graph.ranks]
        rest = [m for m in members if m != me and m not in self.graph.ranks and m not in self.source.missing]
        order = fetched + rest
        if hint is not None and hint in order:
            order.remove(hint)
            order.insert(0, hint)
        return order

    def _arrived_late(self, mo: RankOps, mrow: int, ro: RankOps, row: int) -> bool:
        """Whether ``mo``'s copy ``mrow`` shows its rank entered after ``ro`` (see module doc)."""
        assert mo.abnormal is not None
        if not mo.abnormal[mrow]:
            return True
        d, dm = int(ro.duration[row]), int(mo.duration[mrow])
        if dm <= self.late_ratio * d:
            return True
        # the searched copy waited for this member: their difference (how much later the member
        # entered) explains at least late_ratio of how much longer than usual the searched copy was
        x = int(ro.excess()[1][row])
        return x > 0 and d - dm >= self.late_ratio * x

    # ------------------------------------------------------------------ search
    def search(self, iteration: int, starts: list[tuple[int, int]]) -> list[RootCause]:
        """Root causes of the given start operators ``(rank, row)`` of one iteration."""
        causes: list[RootCause] = []
        visited: set[tuple[int, int]] = set()
        deferred: list[tuple[int, int, list[dict[str, Any]]]] = []
        for start in starts:
            if not self._walk(iteration, [(start[0], start[1], [], False)], visited, causes, deferred):
                return causes
        if deferred:
            strongest = max((self._strength(c) for c in causes), default=-1)
            # a set-aside operator that lasted longer beyond its usual than any cause found explains
            # more than they do: its scan is resumed (every scan is, when nothing was found)
            later = [self._strength_at(rank, row, NETWORK) > strongest for rank, row, _ in deferred]
            resume = [d for d, r in zip(deferred, later) if r]
            for (rank, row, path), r in zip(deferred, later):
                if r:
                    continue
                ro = self.graph.ranks[rank]
                comm = int(ro.comm[row])
                self.set_aside.append({"iteration": iteration, "rank": rank, "comm_id": self.graph.comm_ids[comm],
                                       "members": len(self.graph.members[comm]),
                                       "members_read": int(path[-1].get("scan_set_aside", 0))})
            if resume:
                log.debug("iteration %d: resuming %d set-aside scan(s)", iteration, len(resume))
            i = 0
            while i < len(resume):  # scans set aside while resuming are resumed in their turn
                rank, row, path = resume[i]
                i += 1
                path[-1].pop("scan_set_aside", None)
                if not self._walk(iteration, [(rank, row, path, True)], visited, causes, resume):
                    return causes
        return causes

    def _strength_at(self, rank: int, row: int, cause: str) -> int:
        """How much longer than usual (ns) the compute gap before ``row`` (COMPUTE) or the operator
        itself (NETWORK) was on ``rank`` (:meth:`holmes.cog.RankOps.excess`)."""
        gap_x, dur_x = self.graph.ranks[rank].excess()
        return int(gap_x[row] if cause == COMPUTE else dur_x[row])

    def _strength(self, c: RootCause) -> int:
        return self._strength_at(c.rank, c.row, c.cause)

    def _walk(self, iteration: int, stack: list[tuple[int, int, list[dict[str, Any]], bool]],
              visited: set[tuple[int, int]], causes: list[RootCause],
              deferred: list[tuple[int, int, list[dict[str, Any]]]]) -> bool:
        """Search from the stack's operators until it is empty (False: ``max_steps`` reached).

        An item ``(rank, row, path, resume)`` with ``resume`` set is a set-aside scan taken up
        again: its step is already on ``path`` and its scan is not bounded."""
        names = self.graph.comm_ids
        while stack:
            rank, row, path, resume = stack.pop()
            ro = self.graph.ranks[rank]
            if resume:
                try:
                    nxt = self._collective(iteration, ro, row, path, causes, cap=None)
                except _NotRead:
                    continue
            else:
                if (rank, row) in visited:
                    continue
                visited.add((rank, row))
                self.steps += 1
                if self.steps > self.max_steps:
                    log.warning("search stopped after %d steps", self.max_steps)
                    return False
                step = ro.describe(row, names)
                path = path + [step]
                try:
                    if ro.op[row] >= SEND:
                        nxt = self._p2p(iteration, ro, row, path, causes)
                    else:
                        nxt = self._collective(iteration, ro, row, path, causes, cap=self.scan_reads)
                except _NotRead:  # only ranks read before may be searched (:meth:`fetched_only`)
                    continue
                if nxt is _SET_ASIDE:
                    deferred.append((rank, row, path))
                    continue
            if nxt is None or nxt is _SET_ASIDE:
                continue
            if nxt[:2] not in visited:
                stack.append((*nxt, False))
            else:
                path[-1]["merged"] = True
        return True

    def _follow(self, ro: RankOps, row: int, path: list[dict[str, Any]], iteration: int,
                causes: list[RootCause], note: str | None = None) -> tuple[int, int, list[dict[str, Any]]] | None:
        """``ro`` entered ``row`` late: search its latest earlier abnormal op, or blame its compute.

        The rank's lateness comes from its own work between operators (the compute gaps) or from
        an earlier operator that ended late. The paper follows the latest earlier abnormal
        operator ``a``; Holmes does so unless a compute gap after ``a`` (up to ``row``) grew by more
        than ``a`` itself did, measured against the rank's usual gap and duration at the same
        operator positions (:meth:`RankOps.excess`): then the rank's compute is the cause even
        though an abnormal operator precedes it -- unless (``follow_waits``) the rank was behind
        mostly from waiting: its operators of the iteration up to ``a`` lasted longer than usual
        by more than all its compute gaps up to ``row`` did. A rank far behind its pipeline
        replica's usual schedule that also computed one gap long (a compute burst of a few
        milliseconds) is late mostly because of whom it waited for, and the search goes on there.
        """
        assert ro.abnormal is not None
        earlier = ro.earlier_rows(row)
        abn = earlier[ro.abnormal[earlier]] if earlier.size else earlier
        normal_step = ro.describe(row, self.graph.comm_ids)
        gap_x, dur_x = ro.excess()
        lo = int(abn[0]) + 1 if abn.size else (int(earlier[-1]) if earlier.size else row)
        k = lo + int(np.argmax(gap_x[lo:row + 1]))
        if gap_x[k] <= gap_x[row]:
            k = row  # ties (e.g. no excess anywhere): the gap right before the late operator
        if abn.size and (dur_x[abn[0]] >= gap_x[k]
                         or (self.follow_waits and _waited_more(ro, gap_x, dur_x, int(abn[0]), row))):
            return ro.rank, int(abn[0]), path + [normal_step]
        step = ro.describe_compute(k, self.graph.comm_ids)
        if k == row:
            normal_step.update(step)
            step = normal_step
        evidence = path + [normal_step] + ([step] if k != row else [])
        causes.append(RootCause(iteration, COMPUTE, (ro.rank,), ro.rank, k, step, evidence, note))
        return None

    def _collective(self, iteration: int, ro: RankOps, row: int, path: list[dict[str, Any]],
                    causes: list[RootCause], cap: int | None = None) -> Any:
        """The next operator to search, None (a cause was recorded) or ``_SET_ASIDE`` (the scan
        read ``cap`` members it had not fetched before without finding the late one)."""
        comm, seq = int(ro.comm[row]), int(ro.seq[row])
        members = self.graph.members[comm]
        desc = path[-1]
        if not members:
            causes.append(RootCause(iteration, NETWORK, (ro.rank,), ro.rank, row, desc, path,
                                    f"communicator {self.graph.comm_ids[comm]} is not in job.json"))
            return None
        missing: list[int] = []
        read = 0
        order = self._member_order(comm, ro.rank)
        fetched = self.graph.ranks
        bounded = cap is not None and sum(1 for m in order if m not in fetched) > cap
        for m in order:
            if bounded and m not in fetched:  # the members read already did not show the late one
                desc["scan_set_aside"] = read
                return _SET_ASIDE
            mo = self.rank_ops(m)
            if mo is None:
                missing.append(m)
                continue
            read += 1
            mrow = mo.find_collective(comm, seq, iteration)
            if mrow is None:
                missing.append(m)
                continue
            if self._arrived_late(mo, mrow, ro, row):
                self.hints[self.graph.group_of[comm]] = m
                desc["normal_member"] = m
                desc["members_read"] = read
                note = f"ranks {missing} of the group unreadable" if missing else None
                return self._follow(mo, mrow, path, iteration, causes, note)
        self.hints.pop(self.graph.group_of[comm], None)
        missing += [m for m in members if m in self.source.missing and m != ro.rank and m not in missing]
        if missing:
            around = self._around_missing(iteration, missing, comm, int(ro.end[row]))
            if around is not None:
                desc["unreadable_members"] = sorted(missing)
                desc["around_missing"] = around[0]
                return around[0], around[1], path
        involved = tuple(m for m in members if m not in missing)
        note = f"ranks {sorted(set(missing))} of the group could not be checked" if missing else None
        desc["members_read"] = read
        causes.append(RootCause(iteration, NETWORK, involved, ro.rank, row, desc, path, note))
        return None

    def _around_missing(self, iteration: int, missing: list[int], comm: int, t_end: int) -> tuple[int, int] | None:
        """A missing member may be the late one: continue from an abnormal operator, before
        ``t_end``, of one of its other groups (read from another member of that group)."""
        for m in missing:
            for code in self.graph.groups_of(m):
                if code == comm or self.graph.group_of[code] == self.graph.group_of[comm]:
                    continue
                for x in self.graph.members[code]:
                    if x == m or x in self.source.missing:
                        continue
                    xo = self.rank_ops(x)
                    if xo is None:
                        continue
                    lo, hi = xo.iteration_rows(iteration)
                    rows = np.arange(lo, hi)
                    rows = rows[(xo.comm[rows] == code) & xo.abnormal[rows] & (xo.start[rows] < t_end)]
                    if rows.size:
                        return x, int(rows[-1])
        return None

    def _p2p(self, iteration: int, ro: RankOps, row: int, path: list[dict[str, Any]],
             causes: list[RootCause]) -> tuple[int, int, list[dict[str, Any]]] | None:
        comm, seq, peer = int(ro.comm[row]), int(ro.seq[row]), int(ro.peer[row])
        desc = path[-1]
        pair = tuple(sorted({ro.rank, peer})) if peer >= 0 else (ro.rank,)
        if peer < 0:
            causes.append(RootCause(iteration, NETWORK, pair, ro.rank, row, desc, path, "P2P op without a peer"))
            return None
        po = self.rank_ops(peer)
        if po is None:
            causes.append(RootCause(iteration, NETWORK, pair, ro.rank, row, desc, path,
                                    f"log of peer rank {peer} unavailable"))
            return None
        opposite = RECV if ro.op[row] == SEND else SEND
        prow = po.find_p2p(comm, seq, opposite, ro.rank, iteration)
        if prow is None:
            causes.append(RootCause(iteration, NETWORK, pair, ro.rank, row, desc, path,
                                    f"no matching {'recv' if opposite == RECV else 'send'} on rank {peer}"))
            return None
        if not self._arrived_late(po, prow, ro, row):
            peer_step = po.describe(prow, self.graph.comm_ids)
            causes.append(RootCause(iteration, NETWORK, pair, ro.rank, row, desc, path + [peer_step]))
            return None
        return self._follow(po, prow, path, iteration, causes)
