"""The consistency pass: what a rank's log may not say, checked on every rank a job reads.

A table can follow CommOps v1 column by column and still contradict itself: ops ending before
they start, duplicated rows, ``op_index`` out of issue order, ``seq`` going backwards on a
communicator, a send without a peer, a collective with one, a rank writing on a communicator it
is not a member of, int64 extremes used as times, an iteration table that disagrees with the
ops. :func:`check_ops` and :func:`check_iterations` find these in a few vectorized passes and
either repair what has one obvious meaning (``op_index`` renumbered by start time) or exclude the
rows, and say so in one human-readable line each ("rank 7: 3 ops end before they start,
excluded"). :class:`ConsistencyLog` (``Job.consistency``) collects those lines and the counts of
rows read and excluded per rank, for the report's assumptions and its ``inconclusive`` verdict.

Examples
--------
>>> from holmes.io.schema import ops_table
>>> t = ops_table(rank=[0, 0, 0], iteration=[0, 0, 0], op_index=[0, 1, 2], comm_id=["dp"] * 3, seq=[0, 1, 2],
...               op=["all_reduce"] * 3, peer=[None] * 3, nbytes=[8] * 3, start_ns=[0, 10, 20], end_ns=[5, 8, 25])
>>> clean, found = check_ops(t, 0, {"dp": (0, 1)})
>>> clean.num_rows, found.messages
(2, ['rank 0: 1 op(s) end before they start, excluded'])
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from holmes.io.schema import OP_NAMES, P2P_OPS

__all__ = ["RankFindings", "ConsistencyLog", "check_ops", "check_iterations"]

log = logging.getLogger(__name__)

_I64_MIN = np.iinfo(np.int64).min
_I64_MAX = np.iinfo(np.int64).max
_P2P_CODES = np.array([OP_NAMES.index(o) for o in P2P_OPS])
_A2A = OP_NAMES.index("all_to_all")  # its per-rank size may differ between members


@dataclass
class RankFindings:
    """What the consistency pass found in one table of one rank."""

    rank: int
    rows_read: int = 0
    rows_excluded: int = 0
    messages: list[str] = field(default_factory=list)

    def add(self, msg: str, excluded: int = 0) -> None:
        self.messages.append(f"rank {self.rank}: {msg}")
        self.rows_excluded += int(excluded)

    def exclude(self, excluded: np.ndarray, mask: np.ndarray, msg: str, prefix: str = "") -> None:
        """Mark the rows of ``mask`` not yet ``excluded`` and, if any, record ``prefix + msg`` with
        ``{k}`` in ``msg`` their count."""
        new = mask & ~excluded
        k = int(new.sum())
        if k:
            excluded[new] = True
            self.add(prefix + msg.format(k=k), excluded=k)


class ConsistencyLog:
    """Per-rank results of the consistency pass over everything a job has read (``Job.consistency``).

    Attributes
    ----------
    inconsistencies : dict[int, list[str]]
        rank -> human-readable findings (``"rank 7: 3 op(s) end before they start, excluded"``);
        only ranks with findings appear.
    rows_read : dict[int, int]
        rank -> op rows read from its log (before exclusion).
    rows_excluded : dict[int, int]
        rank -> op rows the pass excluded.
    """

    def __init__(self) -> None:
        self.inconsistencies: dict[int, list[str]] = {}
        self.rows_read: dict[int, int] = {}
        self.rows_excluded: dict[int, int] = {}
        #: cross-rank findings: ``(rank_a, rank_b, comm_id, message)``; the message is also listed
        #: under both ranks in :attr:`inconsistencies`
        self.disagreements: list[tuple[int, int, str, str]] = []
        self._iter_msgs: dict[int, list[str]] = {}
        self._cross_msgs: dict[int, list[str]] = {}
        self._checked: set[int] = set()
        self._readers: dict[str, list[tuple[int, tuple[np.ndarray, ...], float]]] = {}

    def cross_check(self, rank: int, table: pa.Table, max_partners: int = 2) -> None:
        """Compare ``rank``'s collectives with those of up to ``max_partners`` members read before.

        The members of a communicator number the same collective with the same ``seq`` and log it
        in the same iteration. Against each partner: when they share ``seq`` numbers, at least 90% of the shared
        collectives must fall in the same iteration; when they share none, they may not share two
        or more iterations either (their ``seq`` numbers are then shifted against each other).
        Ring-buffer windows (Flight Recorder) that overlap partly pass. A disagreement is recorded
        for both ranks (no file can tell which one is wrong) and in :attr:`disagreements`. Only
        the first ``max_partners`` readers of each communicator are kept, so memory stays bounded.
        """
        if table.num_rows == 0 or rank in self._checked:
            return
        self._checked.add(rank)
        for cid, summ in _collective_summary(table).items():
            sq, its, opc, nb, st = summ
            own_period: list[float] = []  # computed once, when first needed
            readers = self._readers.setdefault(cid, [])
            for q, (qsq, qits, qopc, qnb, qst), qperiod in readers:
                if q == rank:
                    continue
                common, ia, ib = np.intersect1d(sq, qsq, assume_unique=True, return_indices=True)
                if len(common):
                    bad = int(np.sum((its[ia] != qits[ib]) | (opc[ia] != qopc[ib])
                                     | ((nb[ia] != qnb[ib]) & (nb[ia] > 0) & (qnb[ib] > 0) & (opc[ia] != _A2A))))
                    if bad <= 0.1 * len(common):  # inferred iteration boundaries (converters) may slip a little
                        # the same collectives must also complete at about the same time (a member
                        # may enter early and wait, but all leave together): a rank numbered a whole
                        # iteration ahead (iteration and seq shifted together) is off by one iteration
                        # period, far beyond any clock skew between hosts
                        if not own_period:
                            own_period.append(_period(its, st))
                        period = min(own_period[0], qperiod)
                        if not np.isfinite(period):
                            continue
                        lag = float(np.median(np.abs(st[ia] - qst[ib]).astype(np.float64)))
                        if lag <= 0.5 * period:
                            continue
                        what = (f"the collectives both logged end {lag / 1e6:.3g} ms apart (median), "
                                f"{lag / period:.2g} iteration periods")
                    else:
                        what = (f"{bad} of the {len(common)} collective(s) both logged differ in iteration, "
                                "operator or size")
                else:
                    shared_iters = len(np.intersect1d(np.unique(its), np.unique(qits)))
                    if shared_iters >= 2:
                        what = f"they share {shared_iters} iterations but no collective seq number"
                    elif _ran_together(st, its, qst, qits):
                        what = "they logged at the same time but share no iteration or collective seq number"
                    else:
                        continue
                lo, hi = min(rank, q), max(rank, q)
                msg = f"ranks {lo} and {hi} disagree on communicator {cid!r}: {what} (iteration or seq numbers shifted)"
                self.disagreements.append((lo, hi, cid, msg))
                for r in (rank, q):
                    self._cross_msgs.setdefault(r, []).append(f"rank {r}: {msg}")
                    self._set(r)
                log.warning("%s", msg)
            if len(readers) < max_partners:
                readers.append((rank, summ, own_period[0] if own_period else _period(its, st)))

    def record_ops(self, f: RankFindings) -> None:
        self.rows_read[f.rank] = f.rows_read
        self.rows_excluded[f.rank] = f.rows_excluded
        self._set(f.rank, ops=f.messages)
        for m in f.messages:
            log.warning("%s", m)

    def record_iterations(self, f: RankFindings) -> None:
        self._iter_msgs[f.rank] = list(f.messages)
        self._set(f.rank)
        for m in f.messages:
            log.warning("%s", m)

    def _set(self, rank: int, ops: list[str] | None = None) -> None:
        extra = self._iter_msgs.get(rank, []) + self._cross_msgs.get(rank, [])
        prev_ops = [m for m in self.inconsistencies.get(rank, []) if m not in extra]
        msgs = list(ops if ops is not None else prev_ops) + extra
        if msgs:
            self.inconsistencies[rank] = msgs
        else:
            self.inconsistencies.pop(rank, None)

    def assumptions(self) -> list[str]:
        """Every finding, rank by rank (what a report lists as assumptions)."""
        return [m for r in sorted(self.inconsistencies) for m in self.inconsistencies[r]]

    def excluded_fraction(self, ranks: Iterable[int] | None = None) -> float:
        """Excluded op rows / op rows read, over ``ranks`` (default: every rank read); 0.0 when none read."""
        rs = list(self.rows_read) if ranks is None else [r for r in ranks if r in self.rows_read]
        read = sum(self.rows_read[r] for r in rs)
        return 0.0 if read == 0 else sum(self.rows_excluded.get(r, 0) for r in rs) / read

    def mostly_excluded(self, ranks: Iterable[int] | None = None, threshold: float = 0.5) -> bool:
        """True when more than ``threshold`` of the rows read (over ``ranks``) were excluded."""
        return self.excluded_fraction(ranks) > threshold

    def __bool__(self) -> bool:
        return bool(self.inconsistencies)

    def __repr__(self) -> str:
        return (f"ConsistencyLog(ranks_read={len(self.rows_read)}, ranks_with_findings={len(self.inconsistencies)}, "
                f"rows_excluded={sum(self.rows_excluded.values())})")


def _collective_summary(table: pa.Table) -> dict[str, tuple[np.ndarray, ...]]:
    """comm_id -> (seq sorted, iteration, op code, nbytes, end_ns) of its collectives, for the cross-rank check."""
    op_c, op_names = _codes(table.column("op"))
    if not len(op_names):
        return {}
    codes = np.array([OP_NAMES.index(o) if o in OP_NAMES else -1 for o in op_names], dtype=np.int64)[op_c]
    is_coll = ~np.isin(codes, _P2P_CODES)
    if not is_coll.any():
        return {}
    comm, comm_names = _codes(table.column("comm_id"))
    cols = [comm[is_coll], _np(table.column("iteration"))[is_coll], _np(table.column("seq"))[is_coll],
            codes[is_coll], _np(table.column("nbytes"))[is_coll], _np(table.column("end_ns"))[is_coll]]
    o = np.lexsort([cols[2], cols[0]])
    comm, it, seq, opc, nb, st = (c[o] for c in cols)
    out = {}
    brk = np.r_[0, np.flatnonzero(comm[1:] != comm[:-1]) + 1, len(comm)]
    for a, b in zip(brk[:-1], brk[1:]):
        s_ = seq[a:b]
        keep = np.r_[True, s_[1:] != s_[:-1]]  # unique seq (the per-rank pass already excluded repeats)
        out[comm_names[int(comm[a])]] = (s_[keep], it[a:b][keep], opc[a:b][keep], nb[a:b][keep], st[a:b][keep])
    return out


def _ran_together(st: np.ndarray, its: np.ndarray, qst: np.ndarray, qits: np.ndarray) -> bool:
    """Both ranks logged >= 3 iterations and their time spans overlap by over half the shorter one."""
    if len(np.unique(its)) < 3 or len(np.unique(qits)) < 3:
        return False
    lo, hi = max(st.min(), qst.min()), min(st.max(), qst.max())
    shorter = min(st.max() - st.min(), qst.max() - qst.min())
    return shorter > 0 and (hi - lo) > 0.5 * shorter


def _period(its: np.ndarray, st: np.ndarray) -> float:
    """Median gap between the first collective ends of consecutive iterations (inf with < 3 iterations)."""
    u, inv = np.unique(its, return_inverse=True)
    if len(u) < 3:
        return float("inf")
    first = np.full(len(u), _I64_MAX, dtype=np.int64)
    np.minimum.at(first, inv, st)
    gaps = np.diff(first.astype(np.float64)) / np.maximum(np.diff(u.astype(np.float64)), 1.0)
    gaps = gaps[gaps > 0]
    return float(np.median(gaps)) if len(gaps) else float("inf")


def _np(col: pa.ChunkedArray, fill: int | None = None) -> np.ndarray:
    if fill is not None and col.null_count:
        col = pc.fill_null(col, fill)
    return col.to_numpy() if isinstance(col, pa.ChunkedArray) else np.asarray(col)


def _codes(col: pa.ChunkedArray) -> tuple[np.ndarray, list[Any]]:
    """Integer codes and their values for a (possibly dictionary-encoded) string column."""
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    enc = col.combine_chunks().dictionary_encode() if isinstance(col, pa.ChunkedArray) else col.dictionary_encode()
    return enc.indices.to_numpy(zero_copy_only=False).astype(np.int64), enc.dictionary.to_pylist()


def _first_of_runs(keys: list[np.ndarray], n: int) -> tuple[np.ndarray, np.ndarray]:
    """(order, same_as_previous) after sorting rows by ``keys`` (last key = primary)."""
    order = np.lexsort(keys)
    same = np.zeros(n, dtype=bool)
    if n > 1:
        eq = np.ones(n - 1, dtype=bool)
        for k in keys:
            ks = k[order]
            eq &= ks[1:] == ks[:-1]
        same[1:] = eq
    return order, same


def check_ops(table: pa.Table, rank: int, communicators: Mapping[str, Any] | None = None,
              source: str | None = None) -> tuple[pa.Table, RankFindings]:
    """Check one rank's validated ops table; returns the rows kept (op_index repaired) and the findings.

    Parameters
    ----------
    table : pyarrow.Table
        Validated by :func:`holmes.io.validate_ops` (types, ranks and peers inside the world, known
        ops and comm_ids).
    rank : int
    communicators : mapping comm_id -> members, optional
        Members as a sequence of ranks or an object with ``ranks``; enables the membership checks.
    source : str, optional
        Unused in messages (they name the rank); kept for logging.

    Returns
    -------
    (pyarrow.Table, RankFindings)
    """
    n = table.num_rows
    f = RankFindings(rank=int(rank), rows_read=n)
    if n == 0:
        return table, f
    it = _np(table.column("iteration"))
    ix = _np(table.column("op_index")).astype(np.int64)
    st = _np(table.column("start_ns"))
    en = _np(table.column("end_ns"))
    seq = _np(table.column("seq"))
    peer = _np(table.column("peer"), fill=-1).astype(np.int64)
    has_peer = _np(pc.is_valid(table.column("peer"))).astype(bool)
    comm, comm_names = _codes(table.column("comm_id"))
    opc, op_names = _codes(table.column("op"))
    op_code = np.array([OP_NAMES.index(o) if o in OP_NAMES else -1 for o in op_names], dtype=np.int64)[opc]
    is_p2p = np.isin(op_code, _P2P_CODES)
    excluded = np.zeros(n, dtype=bool)

    def exclude(mask: np.ndarray, msg: str) -> None:
        f.exclude(excluded, mask, msg)

    extreme = ((st == _I64_MIN) | (st == _I64_MAX) | (en == _I64_MIN) | (en == _I64_MAX)
               | (it == _I64_MIN) | (it == _I64_MAX) | (seq == _I64_MIN) | (seq == _I64_MAX))
    exclude(extreme, "{k} op(s) hold an int64 extreme in start_ns/end_ns/iteration/seq (a sentinel, not a value), "
                     "excluded")
    exclude(en < st, "{k} op(s) end before they start, excluded")
    exclude(is_p2p & ~has_peer, "{k} send/recv op(s) have no peer, excluded")
    exclude(is_p2p & has_peer & (peer == rank), "{k} send/recv op(s) name the rank itself as peer, excluded")
    exclude(~is_p2p & has_peer, "{k} collective op(s) name a peer, excluded")
    if communicators:
        members = []
        for name in comm_names:
            c = communicators.get(name)
            rs = getattr(c, "ranks", c) if c is not None else None
            members.append(frozenset(int(x) for x in rs) if rs is not None else None)
        not_member = np.array([m is not None and rank not in m for m in members], dtype=bool)
        if not_member.any():
            bad = not_member[comm]
            names = sorted({comm_names[i] for i in np.unique(comm[bad & ~excluded])}) if bad.any() else []
            exclude(bad, "{k} op(s) on communicator(s) " + ", ".join(repr(x) for x in names[:3])
                    + " that the rank is not a member of, excluded")
        peer_member = np.ones(n, dtype=bool)
        sel = np.flatnonzero(is_p2p & has_peer & ~excluded)
        if len(sel):
            peer_member[sel] = [members[comm[i]] is None or int(peer[i]) in members[comm[i]] for i in sel]
        exclude(~peer_member, "{k} send/recv op(s) name a peer outside their communicator, excluded")

    # exact duplicates (every required column equal): keep the first
    keys = [en, st, peer, op_code, seq, comm, ix, it]
    order, same = _first_of_runs(keys, n)
    dup = np.zeros(n, dtype=bool)
    dup[order[same]] = True
    exclude(dup, "{k} duplicated row(s), excluded")

    # two different rows at the same (iteration, op_index)
    keep = np.flatnonzero(~excluded)
    if len(keep) > 1:
        o, s = _first_of_runs([ix[keep], it[keep]], len(keep))
        clash = np.zeros(n, dtype=bool)
        if s.any():
            first = np.r_[s[1:], False] & ~s
            clash[keep[o[s]]] = True
            clash[keep[o[first]]] = True
            exclude(clash, "{k} row(s) share an (iteration, op_index) with a different row, excluded")

    # seq strictly increasing per stream (collectives: comm; p2p: comm, direction, peer) in start order
    keep = np.flatnonzero(~excluded)
    if len(keep) > 1:
        kind = np.where(is_p2p, op_code, -1)[keep]
        pk = np.where(is_p2p, peer, -1)[keep]
        # issue order = start order (op_index is repaired to it below)
        o = np.lexsort([ix[keep], st[keep], it[keep], pk, kind, comm[keep]])
        ks = [comm[keep][o], kind[o], pk[o]]
        same_stream = np.ones(len(o) - 1, dtype=bool)
        for k_ in ks:
            same_stream &= k_[1:] == k_[:-1]
        sq = seq[keep][o]
        back = np.zeros(len(keep), dtype=bool)
        back[1:] = same_stream & (sq[1:] <= sq[:-1])
        bad = np.zeros(n, dtype=bool)
        bad[keep[o[back]]] = True
        exclude(bad, "{k} op(s) repeat or go back in seq on their communicator, excluded")

    out = table.filter(pa.array(~excluded)) if excluded.any() else table

    # op_index in issue (start) order inside each iteration: renumber where it is not
    m = out.num_rows
    if m > 1:
        it2 = _np(out.column("iteration"))
        ix2 = _np(out.column("op_index")).astype(np.int64)
        st2 = _np(out.column("start_ns"))
        o = np.lexsort([ix2, it2])
        its, sts = it2[o], st2[o]
        disorder = (its[1:] == its[:-1]) & (sts[1:] < sts[:-1])
        if disorder.any():
            bad_iters = np.unique(its[1:][disorder])
            o2 = np.lexsort([ix2, st2, it2])
            new_ix = np.empty(m, dtype=np.int64)
            starts = np.r_[0, np.flatnonzero(it2[o2][1:] != it2[o2][:-1]) + 1]
            run = np.repeat(starts, np.diff(np.r_[starts, m]))
            new_ix[o2] = np.arange(m) - run
            idx = out.schema.get_field_index("op_index")
            out = out.set_column(idx, out.schema.field(idx), pa.array(new_ix.astype(np.int32)))
            f.add(f"op_index is not in start order in {len(bad_iters)} iteration(s); renumbered by start_ns")
    if f.rows_excluded and f.rows_excluded == n:
        f.messages[-1] += " (no op of this rank is left)"
    return out, f


def check_iterations(table: pa.Table, rank: int, ops: pa.Table | None, source: str) -> tuple[pa.Table | None, RankFindings]:
    """Check an iterations table against itself and the rank's ops.

    Rows of another rank, with int64 extremes, ending before they start or repeating an
    iteration are excluded. When the table disagrees with the ops (fewer than half of the
    iterations the ops hold are in it, or fewer than half of the shared iterations contain their
    ops' first start), ``None`` is returned: the caller derives the iterations from the ops instead.
    """
    n = table.num_rows
    f = RankFindings(rank=int(rank), rows_read=n)
    if n == 0:
        return table, f
    rk = _np(table.column("rank"))
    it = _np(table.column("iteration"))
    st = _np(table.column("start_ns"))
    en = _np(table.column("end_ns"))
    excluded = np.zeros(n, dtype=bool)

    def exclude(mask: np.ndarray, msg: str) -> None:
        f.exclude(excluded, mask, msg, prefix=f"{source}: ")

    exclude(rk != rank, "{k} row(s) of another rank, excluded")
    exclude((st == _I64_MIN) | (st == _I64_MAX) | (en == _I64_MIN) | (en == _I64_MAX) | (it == _I64_MIN)
            | (it == _I64_MAX), "{k} iteration(s) hold an int64 extreme, excluded")
    exclude(en < st, "{k} iteration(s) end before they start, excluded")
    keep = np.flatnonzero(~excluded)
    if len(keep) > 1:
        o = np.argsort(it[keep], kind="stable")
        s = np.zeros(len(keep), dtype=bool)
        s[1:] = it[keep][o][1:] == it[keep][o][:-1]
        d = np.zeros(n, dtype=bool)
        d[keep[o[s]]] = True
        exclude(d, "{k} repeated iteration number(s), excluded")
    out = table.filter(pa.array(~excluded)) if excluded.any() else table
    if ops is not None and ops.num_rows and out.num_rows:
        oit = _np(ops.column("iteration"))
        ost = _np(ops.column("start_ns"))
        u, inv = np.unique(oit, return_inverse=True)
        first = np.full(len(u), _I64_MAX, dtype=np.int64)
        np.minimum.at(first, inv, ost)
        tit = _np(out.column("iteration"))
        tst = _np(out.column("start_ns"))
        ten = _np(out.column("end_ns"))
        pos = np.searchsorted(u, tit)
        pos_c = np.minimum(pos, len(u) - 1)
        shared = (pos < len(u)) & (u[pos_c] == tit)
        n_shared = int(shared.sum())
        inside = (first[pos_c] >= tst) & (first[pos_c] <= ten) & shared
        if n_shared < 0.5 * len(u) or int(inside.sum()) < 0.5 * n_shared:
            f.add(f"{source} disagrees with the op table ({n_shared} of the {len(u)} iterations of the ops are in "
                  f"it, {int(inside.sum())} of them contain their ops' first start); iteration times derived "
                  "from the ops instead")
            return None, f
        missing = len(u) - n_shared
        if missing:
            f.add(f"{source} lacks {missing} of the {len(u)} iterations of the ops")
    return out, f
