"""Narrowing a network cause down to devices: corroborating and clearing probes.

Algorithm 1 ends a branch with NETWORK over a P2P pair or a group's ring, which implicates every
device on the paths among those GPUs (NICs, cables, leaves, spines, NVSwitches). A single
cause cannot tell them apart, and the same cause repeats in every irregular iteration. Following
the paper's remark that operator-to-node correlations can be integrated further (Appendix C),
Holmes checks a few *neighbouring transfers* of the same iteration. A transfer is judged by
the copy of the member that entered it last (it did not wait, so its duration is the transfer
itself): abnormal, or 1.5 times its healthy duration or more -> slow transfer, else the transfer
ran fine. Copies that waited say
nothing about the transfer, whatever their label.

* the other communicators and P2P peers of the cause's members (small groups only, or groups
  already fetched);
* for a switch on the path, a P2P pair of another GPU below that switch;
* for a cable between switches, a P2P pair of another GPU below its leaf end whose path uses
  that cable.

A transfer that ran fine clears every device on its path; a slow one supports the devices on
it. The cause keeps its devices not cleared, and among them those with the most support. Probes
read at most ``max_reads`` more ranks in a whole localization.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from holmes.calibration.thresholds import Thresholds, load_thresholds
from holmes.cog.graph import RECV, SEND
from holmes.display import LOGGED_RANKS
from holmes.localize.evidence.ranking import network_devices
from holmes.topology import kinds

__all__ = ["NetworkProbe"]

log = logging.getLogger(__name__)

SLOW, FINE = "slow", "fine"


def _slow(ro: Any, row: int, ratio: float) -> bool:
    """A copy that timed a transfer is slow when flagged abnormal, or when it lasted at least
    ``ratio`` (threshold ``probe_slow_ratio``) times its healthy reference (:meth:`holmes.cog.RankOps.excess`): a persistent
    slowdown is the norm of a detector's window, not of the healthy reference."""
    if ro.abnormal[row]:
        return True
    x = int(ro.excess()[1][row])
    return x > 0 and ro.duration[row] >= ratio * (ro.duration[row] - x)


def _largest_row(ro: Any, comm: int, iteration: int) -> int | None:
    """Row of ``ro``'s largest operator on ``comm`` in ``iteration`` (None if none or no ``ro``)."""
    if ro is None:
        return None
    lo, hi = ro.iteration_rows(iteration)
    rows = lo + np.flatnonzero(ro.comm[lo:hi] == comm)
    return int(rows[np.argmax(ro.nbytes[rows])]) if rows.size else None


class NetworkProbe:
    """Refines the device sets of network causes with a bounded number of extra reads.

    Parameters
    ----------
    search : GraphSearch
        Gives fetched ranks (``rank_ops``) and the COG.
    topology : ClusterTopology
    max_reads : int, optional
        Ranks the probes may fetch in total (default: the threshold ``default_probe_reads``).
    thresholds : Thresholds, optional
        Default the shipped ones: ``probe_max_group`` (the largest group a probe reads in full;
        larger ones only when already fetched), ``probe_per_cause`` (reads one cause may always
        spend; beyond that a cause spends at most ``probe_cause_share`` of what is left of
        ``max_reads``, so the causes of later iterations are probed too), ``probe_slow_ratio``,
        ``probe_leaf_pairs`` and ``probe_ring_groups``.
    """

    def __init__(self, search: Any, topology: Any, *, max_reads: int | None = None,
                 thresholds: Thresholds | None = None) -> None:
        t = thresholds or load_thresholds()
        self.search = search
        self.graph = search.graph
        self.topology = topology
        self.max_reads = t.default_probe_reads if max_reads is None else max_reads
        self.max_group = t.probe_max_group
        self.reads = 0
        self.per_cause = t.probe_per_cause
        self.cause_share = t.probe_cause_share
        self.slow_ratio = t.probe_slow_ratio
        self.leaf_pairs = t.probe_leaf_pairs
        self.ring_groups = t.probe_ring_groups
        self._cap = self.max_reads
        self._verdicts: dict[tuple[int, tuple[int, ...]], str | None] = {}
        self._refined: dict[tuple[int, frozenset[str]], list[str]] = {}
        self._pp_peers: dict[int, list[int]] | None = None
        self._under: dict[str, list[int]] | None = None
        self._rings: dict[int, frozenset[str]] = {}
        self.log: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ reads
    def _spent(self) -> bool:
        return self.reads >= min(self.max_reads, self._cap)

    def _ops(self, rank: int, allow_read: bool = True) -> Any:
        ro = self.graph.ranks.get(rank)
        if ro is not None:
            return ro
        if not allow_read or self._spent() or rank in self.search.source.missing:
            return None
        self.reads += 1
        return self.search.rank_ops(rank)

    # ------------------------------------------------------------------ verdicts
    def _pair_verdict(self, iteration: int, a: int, b: int, row: int | None = None) -> str | None:
        """Was the P2P transfer between ``a`` and ``b`` slow in ``iteration`` (or at ``row`` of ``a``)?"""
        ra = self._ops(a)
        key = (iteration, (min(a, b), max(a, b)))
        if key in self._verdicts:
            return self._verdicts[key]
        verdict = None
        rb = self._ops(b) if ra is not None else None
        if ra is not None and rb is not None:
            lo, hi = ra.iteration_rows(iteration)
            rows = np.arange(lo, hi)
            rows = rows[(ra.op[rows] >= SEND) & (ra.peer[rows] == b)]
            slow = fine = 0
            for row in rows.tolist():
                opp = RECV if ra.op[row] == SEND else SEND
                prow = rb.find_p2p(int(ra.comm[row]), int(ra.seq[row]), opp, a, iteration)
                if prow is None:
                    continue
                # the side that arrived last did not wait: its duration is the transfer itself
                late_slow = _slow(ra, row, self.slow_ratio) if ra.start[row] >= rb.start[prow] \
                    else _slow(rb, prow, self.slow_ratio)
                if late_slow:
                    slow += 1
                else:
                    fine += 1
            if slow or fine:
                verdict = SLOW if slow > fine else FINE
        self._verdicts[key] = verdict
        return verdict

    def _group_verdict(self, iteration: int, comm: int, seq: int, own: Any = None, row: int | None = None) -> str | None:
        members = self.graph.members[comm]
        key = (iteration, (-1 - comm, seq))
        if key in self._verdicts:
            return self._verdicts[key]
        verdict: str | None = None
        allow = len(members) <= self.max_group
        latest: tuple[int, bool] | None = None
        for m in members:
            ro = self._ops(m, allow_read=allow)
            mrow = None if ro is None else ro.find_collective(comm, seq, iteration)
            if mrow is None:
                latest = None
                break
            if latest is None or ro.start[mrow] > latest[0]:
                latest = (int(ro.start[mrow]), _slow(ro, mrow, self.slow_ratio))
        if latest is not None:
            # the member that entered last did not wait: its copy times the transfer itself
            verdict = SLOW if latest[1] else FINE
        self._verdicts[key] = verdict
        return verdict

    # ------------------------------------------------------------------ probes
    def _neighbour_probes(self, ranks: tuple[int, ...], skip: tuple[int, ...], t0: int, t1: int,
                          min_fine_bytes: float, iteration: int):
        """(verdict, group) of the other transfers of the cause's fetched members around [t0, t1]."""
        seen: set[Any] = set()
        for r in ranks:
            ro = self.graph.ranks.get(r)
            if ro is None:
                continue
            lo, hi = ro.iteration_rows(iteration)
            sl = slice(lo, hi)
            rows = lo + np.flatnonzero((ro.end[sl] >= t0) & (ro.start[sl] <= t1) & (ro.nbytes[sl] > 0))
            for row in rows.tolist():
                it = int(ro.iteration[row])
                if ro.op[row] >= SEND:
                    peer = int(ro.peer[row])
                    grp = tuple(sorted((r, peer)))
                    if peer < 0 or grp == skip or (grp, it) in seen:
                        continue
                    seen.add((grp, it))
                    v = self._pair_verdict(it, r, peer, row)
                else:
                    comm = int(ro.comm[row])
                    grp = self.graph.members[comm]
                    if len(grp) < 2 or grp == skip or (comm, it) in seen:
                        continue
                    seen.add((comm, it))
                    v = self._group_verdict(it, comm, int(ro.seq[row]), ro, row)
                if v == FINE and ro.nbytes[row] < min_fine_bytes:
                    continue  # a small message may pass a slow device unnoticed
                if v is not None:
                    yield v, grp

    def _leaf_probes(self, iteration: int, switch: str, avoid: set[int], through: str | None = None):
        """Verdicts of up to ``probe_leaf_pairs`` P2P pairs of other GPUs below ``switch`` (one pair per GPU)
        whose path crosses ``through`` (any path when None)."""
        count = self.leaf_pairs
        found = 0
        for r in self._ranks_under(switch):
            if r in avoid:
                continue
            for peer in self._peers(r):
                if peer in avoid or self.topology.host_of(peer) == self.topology.host_of(r):
                    continue
                if through is not None and through not in self.topology.path(r, peer):
                    continue
                v = self._pair_verdict(iteration, r, peer)
                if v is not None:
                    yield v, (min(r, peer), max(r, peer))
                    found += 1
                    avoid = avoid | {r, peer}
                    break
            if found >= count or self._spent():
                return
        if through is None or found:
            return
        # no P2P pair uses the cable: small collectives of GPUs below the switch whose ring does
        for r in self._ranks_under(switch):
            for comm in self._small_groups(r):
                grp = self.graph.members[comm]
                if avoid.intersection(grp) or through not in self._ring(comm):
                    continue
                ro = self._ops(r)
                row = _largest_row(ro, comm, iteration)
                if row is None:
                    continue
                v = self._group_verdict(iteration, comm, int(ro.seq[row]), ro, row)
                if v is not None:
                    yield v, grp
                    found += 1
                    avoid = avoid | set(grp)
                if found >= count or self._spent():
                    return

    def _ring_clearing(self, iteration: int, switch: str, through: str, skip: tuple[int, ...]):
        """FINE verdicts of up to ``probe_ring_groups`` collectives of any size whose ring uses ``through``, from one member.

        Every member's copy of a collective lasts at least its transfer: one copy at its healthy
        duration (not :func:`_slow`) shows the whole ring, ``through`` included, ran fine. A slow
        copy may only have waited, so it says nothing here. Members already fetched are asked
        first; at most one rank is read per group."""
        count = self.ring_groups
        found = 0
        seen: set[int] = set()
        for r in self._ranks_under(switch):
            for comm in self.graph.groups_of(r):
                if comm in seen:
                    continue
                seen.add(comm)
                grp = self.graph.members[comm]
                if grp == skip or through not in self._ring(comm):
                    continue
                fetched = [m for m in grp if m in self.graph.ranks]
                ro = self._ops(fetched[0] if fetched else r)
                row = _largest_row(ro, comm, iteration)
                if row is None:
                    continue
                if ro.nbytes[row] > 0 and not _slow(ro, row, self.slow_ratio):
                    yield FINE, grp
                    found += 1
                if found >= count or self._spent():
                    return

    def _ring(self, comm: int) -> frozenset[str]:
        got = self._rings.get(comm)
        if got is None:
            got = self._rings[comm] = frozenset(network_devices(self.graph.members[comm], self.topology))
        return got

    def _small_groups(self, rank: int) -> list[int]:
        """Collective groups of ``rank`` small enough to be read in full."""
        return [c for c in self.graph.groups_of(rank) if len(self.graph.members[c]) <= self.max_group]

    def _peers(self, rank: int) -> list[int]:
        if self._pp_peers is None:
            peers: dict[int, list[int]] = {}
            for code, kind in enumerate(self.graph.kinds):
                if kind != "pp":
                    continue
                m = self.graph.members[code]
                for a, b in zip(m, m[1:]):
                    peers.setdefault(a, []).append(b)
                    peers.setdefault(b, []).append(a)
            self._pp_peers = peers
        return self._pp_peers.get(rank, [])

    def _ranks_under(self, switch: str) -> list[int]:
        if self._under is None:
            under: dict[str, list[int]] = {}
            leaf_of = getattr(self.topology, "leaf_of", None)
            if leaf_of is not None:
                for r in range(self.topology.num_gpus):
                    try:
                        under.setdefault(leaf_of(r), []).append(r)
                    except Exception:  # noqa: BLE001 - single-host topologies have no leaves
                        break
            self._under = under
        return self._under.get(switch, [])

    # ------------------------------------------------------------------ refine
    def refine(self, iteration: int, ranks: tuple[int, ...], candidates: list[str], *, window: tuple[int, int],
               min_fine_bytes: float = 0.0) -> list[str]:
        """The devices of a network cause that survive the probes (never empty).

        ``iteration`` is the cause operator's iteration and ``window`` a time span (ns) around it:
        neighbouring transfers are those of the members in that iteration overlapping the span; a transfer that ran fine only clears devices when it moved
        at least ``min_fine_bytes``.
        """
        if len(candidates) <= 1:
            return candidates
        prior = self._refined.get((-1, frozenset(candidates)))
        if prior is not None:
            return prior
        cand = set(candidates)
        support = dict.fromkeys(candidates, 1)
        cleared: set[str] = set()
        # one cause may spend at most a share of what is left, so later causes are probed too
        self._cap = self.reads + max(self.per_cause, math.floor((self.max_reads - self.reads) * self.cause_share))
        results: list[tuple[str, tuple[int, ...]]] = []
        for sw in [c for c in candidates if kinds.is_kind(c, "switch")]:
            results += list(self._leaf_probes(iteration, sw, set(ranks)))
        for link in [c for c in candidates if kinds.is_kind(c, "link") and not kinds.is_nic_cable(c)]:
            # a cable between two switches: pairs of GPUs below its (leaf) ends whose path uses it
            for end in kinds.link_ends(link):
                if self._ranks_under(end):
                    results += list(self._leaf_probes(iteration, end, set(ranks), through=link))
                    results += list(self._ring_clearing(iteration, end, link, tuple(sorted(ranks))))
        # device-specific probes first, then the cause's members' other transfers
        results += list(self._neighbour_probes(ranks, ranks, window[0], window[1], min_fine_bytes, iteration))
        for verdict, grp in results:
            devs = set(network_devices(grp, self.topology)) & cand
            if not devs:
                continue
            if verdict == FINE:
                cleared |= devs
            else:
                for d in devs:
                    support[d] += 1
        left = [c for c in candidates if c not in cleared] or list(candidates)
        best = max(support[c] for c in left)
        out = [c for c in left if support[c] == best]
        self.log.append({"iteration": iteration, "ranks": list(ranks[:LOGGED_RANKS]), "candidates": len(candidates),
                         "probes": len(results), "kept": out[:LOGGED_RANKS]})
        self._refined[(-1, frozenset(candidates))] = out
        return out
