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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from holmes.io.crosscheck import CrossCheck, MemberIndex, _codes, op_codes
from holmes.io.plausibility import Finding, RankShape, judge, rank_shapes
from holmes.io.schema import OP_NAMES, P2P_OPS

__all__ = ["RankFindings", "ConsistencyLog", "check_ops", "check_ops_batch", "check_iterations"]

log = logging.getLogger(__name__)

_I64_MIN = np.iinfo(np.int64).min
_I64_MAX = np.iinfo(np.int64).max
_P2P_CODES = np.array([OP_NAMES.index(o) for o in P2P_OPS])
_CROSS_COLUMNS = ("rank", "iteration", "comm_id", "seq", "op", "nbytes", "end_ns")


@dataclass
class RankFindings:
    """What the consistency pass found in one table of one rank."""

    rank: int
    rows_read: int = 0
    rows_excluded: int = 0
    messages: list[str] = field(default_factory=list)
    #: the shape of the rows kept, judged against the other ranks' (:mod:`holmes.io.plausibility`)
    shape: RankShape | None = None

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

    #: ranks whose cross-rank check may wait (their collectives kept meanwhile), then run as one batch
    PENDING = 256

    def __init__(self) -> None:
        self._inconsistencies: dict[int, list[str]] = {}
        self.rows_read: dict[int, int] = {}
        self.rows_excluded: dict[int, int] = {}
        self._disagreements: list[tuple[int, int, str, str]] = []
        self._iter_msgs: dict[int, list[str]] = {}
        self._cross_msgs: dict[int, list[str]] = {}
        self._cross = CrossCheck()
        self._pending: dict[int, pa.Table] = {}
        #: rank -> the shape of its log (kept rows), for :meth:`plausibility`
        self.shapes: dict[int, RankShape] = {}

    @property
    def inconsistencies(self) -> dict[int, list[str]]:
        """rank -> human-readable findings; only ranks with findings appear."""
        self.flush()
        return self._inconsistencies

    @property
    def disagreements(self) -> list[tuple[int, int, str, str]]:
        """Cross-rank findings ``(rank_a, rank_b, comm_id, message)``; each message is also listed
        under both ranks in :attr:`inconsistencies`."""
        self.flush()
        return self._disagreements

    def cross_check(self, rank: int, table: pa.Table) -> None:
        """Compare ``rank``'s collectives with those of up to two members read before.

        The members of a communicator number the same collective with the same ``seq`` and log it
        in the same iteration. Against each partner: when they share ``seq`` numbers, at least 90% of the shared
        collectives must fall in the same iteration, and their completions (where both logged one)
        may not lie over half an iteration period apart (a rank numbered a whole iteration ahead);
        when they share none, they may not share two or more iterations either (their ``seq``
        numbers are then shifted against each other), nor have logged at the same time.
        Ring-buffer windows (Flight Recorder) that overlap partly pass. A disagreement is recorded
        for both ranks (no file can tell which one is wrong) and in :attr:`disagreements`. Only
        the first two readers of each communicator are kept, so memory stays bounded.

        Ranks read one at a time are checked in batches (up to :attr:`PENDING` of them, in
        reading order), when the batch is full or a finding is asked for: the same findings,
        a fraction of the cost.
        """
        r = int(rank)
        if r in self._pending or r in self._cross.checked:
            return
        self._pending[r] = table.select([c for c in _CROSS_COLUMNS if c in table.column_names])
        if len(self._pending) >= self.PENDING:
            self.flush()

    def cross_check_batch(self, table: pa.Table, ranks: Sequence[int]) -> None:
        """:meth:`cross_check` for the rows of many ranks at once, read in the order of ``ranks``
        (vectorized: :class:`holmes.io.crosscheck.CrossCheck`)."""
        self.flush()
        self._record(self._cross.add(table, ranks))

    def flush(self) -> None:
        """Run the cross-rank check of the ranks still waiting for it."""
        pending, self._pending = list(self._pending.items()), {}
        i = 0
        while i < len(pending):   # runs of one schema, in reading order
            j = i + 1
            while j < len(pending) and pending[j][1].schema.equals(pending[i][1].schema):
                j += 1
            run = pending[i:j]
            self._record(self._cross.add(pa.concat_tables([t for _, t in run]), [r for r, _ in run]))
            i = j

    def _record(self, found: list[tuple[int, int, str, str]]) -> None:
        for lo, hi, cid, msg in found:
            self._disagreements.append((lo, hi, cid, msg))
            for r in (lo, hi):
                self._cross_msgs.setdefault(r, []).append(f"rank {r}: {msg}")
                self._set(r)
            log.warning("%s", msg)

    def record_ops(self, f: RankFindings) -> None:
        if f.shape is not None:
            self.shapes[f.rank] = f.shape
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
        prev_ops = [m for m in self._inconsistencies.get(rank, []) if m not in extra]
        msgs = list(ops if ops is not None else prev_ops) + extra
        if msgs:
            self._inconsistencies[rank] = msgs
        else:
            self._inconsistencies.pop(rank, None)

    def assumptions(self) -> list[str]:
        """Every finding, rank by rank (what a report lists as assumptions)."""
        return [m for r in sorted(self.inconsistencies) for m in self.inconsistencies[r]]

    def plausibility(self, ranks: Iterable[int] | None = None,
                     members: Mapping[str, Sequence[int]] | None = None) -> list[Finding]:
        """What the logs of ``ranks`` (default: every rank read) cannot mean, judged across ranks:
        :func:`holmes.io.plausibility.judge` (a rank much shorter than its peers, implausible
        time units, zero-length operators, members silent on their communicator)."""
        rs = list(self.shapes) if ranks is None else [r for r in ranks if r in self.shapes]
        return judge({r: self.shapes[r] for r in rs}, members)

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


def _np(col: pa.ChunkedArray, fill: int | None = None) -> np.ndarray:
    if fill is not None and col.null_count:
        col = pc.fill_null(col, fill)
    return col.to_numpy() if isinstance(col, pa.ChunkedArray) else np.asarray(col)


def _is_sorted(keys: list[np.ndarray]) -> bool:
    """Whether the rows already are in ``np.lexsort(keys)`` order (last key = primary)."""
    n = len(keys[0])
    tie = np.ones(max(n - 1, 0), dtype=bool)
    for k in reversed(keys):
        a, b = k[:-1], k[1:]
        if (tie & (b < a)).any():
            return False
        tie &= b == a
    return True


def _sort_order(keys: list[np.ndarray]) -> np.ndarray:
    """``np.lexsort(keys)`` (last key = primary), ``arange`` when the rows already are in that order."""
    return np.arange(len(keys[0])) if _is_sorted(keys) else np.lexsort(keys)


def _first_of_runs(keys: list[np.ndarray], n: int) -> tuple[np.ndarray, np.ndarray]:
    """(order, same_as_previous) after sorting rows by ``keys`` (last key = primary)."""
    order = _sort_order(keys)
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
    communicators : mapping comm_id -> members, or MemberIndex, optional
        Members as a sequence of ranks or an object with ``ranks``; enables the membership checks
        (a :class:`~holmes.io.crosscheck.MemberIndex` keeps them between calls).
    source : str, optional
        Unused in messages (they name the rank); kept for logging.

    Returns
    -------
    (pyarrow.Table, RankFindings)
    """
    out, found = check_ops_batch(table, [int(rank)], communicators, np.full(table.num_rows, int(rank), np.int64))
    return out, found[int(rank)]


def check_ops_batch(table: pa.Table, ranks: Iterable[int], communicators: Mapping[str, Any] | None = None,
                    row_ranks: np.ndarray | None = None) -> tuple[pa.Table, dict[int, RankFindings]]:
    """:func:`check_ops` over the rows of many ranks at once (one vectorized pass, rank-keyed).

    ``table`` holds validated rows whose ``rank`` column names their rank (as
    :func:`holmes.io.validate_ops` with ``rank=`` ensures); ``ranks`` lists the ranks it covers
    (a rank without rows gets empty findings); ``row_ranks``, when given, overrides the column
    (each row's rank). Returns the rows kept, in their input order, with
    ``op_index`` renumbered on the ranks that need it, and rank -> :class:`RankFindings`: the same
    rows and messages as :func:`check_ops` rank by rank.

    Examples
    --------
    >>> from holmes.io.schema import ops_table
    >>> t = ops_table(rank=[0, 0, 1, 1], iteration=[0] * 4, op_index=[0, 1, 0, 1], comm_id=["dp"] * 4,
    ...               seq=[0, 1, 0, 1], op=["all_reduce"] * 4, peer=[None] * 4, nbytes=[8] * 4,
    ...               start_ns=[0, 10, 0, 10], end_ns=[5, 15, 5, 8])
    >>> kept, found = check_ops_batch(t, [0, 1], {"dp": (0, 1)})
    >>> kept.num_rows, found[0].messages, found[1].messages
    (3, [], ['rank 1: 1 op(s) end before they start, excluded'])
    """
    if row_ranks is not None:
        rk = np.asarray(row_ranks, dtype=np.int64)
    else:
        rk = _np(table.column("rank")).astype(np.int64) if table.num_rows else np.zeros(0, np.int64)
    order_ranks = sorted({int(r) for r in ranks} | set(np.unique(rk).tolist()))
    uranks = np.asarray(order_ranks, dtype=np.int64)
    ri = np.searchsorted(uranks, rk)
    n = table.num_rows
    counts = np.bincount(ri, minlength=len(uranks))
    found = {r: RankFindings(rank=r, rows_read=int(counts[i])) for i, r in enumerate(order_ranks)}
    if n == 0:
        for f in found.values():
            f.shape = RankShape(0, 0, 0, float("nan"), float("nan"))
        return table, found
    it = _np(table.column("iteration"))
    ix = _np(table.column("op_index")).astype(np.int64)
    st, st_ok = _np_valid(table.column("start_ns"))
    en, en_ok = _np_valid(table.column("end_ns"))
    seq = _np(table.column("seq"))
    peer = _np(table.column("peer"), fill=-1).astype(np.int64)
    has_peer = _np(pc.is_valid(table.column("peer"))).astype(bool)
    comm, comm_names = _codes(table.column("comm_id"))
    op_code, is_p2p = op_codes(table.column("op"))
    excluded = np.zeros(n, dtype=bool)

    def exclude(mask: np.ndarray, msg: str, detail: Any = None) -> None:
        new = mask & ~excluded
        if not new.any():
            return
        excluded[new] = True
        per = np.bincount(ri[new], minlength=len(uranks))
        for i in np.flatnonzero(per).tolist():
            k = int(per[i])
            found[order_ranks[i]].add(msg.format(k=k, detail=detail(i, new) if detail else ""), excluded=k)

    def extreme(v: np.ndarray, ok: np.ndarray | None = None) -> np.ndarray:
        e = (v == _I64_MIN) | (v == _I64_MAX)
        return e if ok is None else e & ok

    exclude(extreme(st, st_ok) | extreme(en, en_ok) | extreme(it) | extreme(seq),
            "{k} op(s) hold an int64 extreme in start_ns/end_ns/iteration/seq (a sentinel, not a value), excluded")
    exclude((en < st) & st_ok & en_ok, "{k} op(s) end before they start, excluded")
    exclude(is_p2p & ~has_peer, "{k} send/recv op(s) have no peer, excluded")
    exclude(is_p2p & has_peer & (peer == rk), "{k} send/recv op(s) name the rank itself as peer, excluded")
    exclude(~is_p2p & has_peer, "{k} collective op(s) name a peer, excluded")
    if communicators:
        index = communicators if isinstance(communicators, MemberIndex) else MemberIndex(communicators)
        known, is_member = index.lookup(comm_names)
        member = is_member(comm, rk)

        def names(i: int, new: np.ndarray) -> str:
            cs = sorted({comm_names[c] for c in np.unique(comm[new & (ri == i)]).tolist()})
            return ", ".join(repr(x) for x in cs[:3])

        exclude(~member, "{k} op(s) on communicator(s) {detail} that the rank is not a member of, excluded", names)
        sel = is_p2p & has_peer & ~excluded
        peer_in = np.ones(n, dtype=bool)
        if sel.any():
            peer_in[sel] = is_member(comm[sel], peer[sel])
        exclude(~peer_in, "{k} send/recv op(s) name a peer outside their communicator, excluded")

    # rows sharing (rank, iteration, op_index): the only ones that can be duplicates or clash
    o3, same3 = _first_of_runs([ix, it, ri], n)
    if same3.any():
        in_run = same3 | np.r_[same3[1:], False]
        sub = np.sort(o3[in_run])
        # exact duplicates (every required column equal): keep the first (an open op's missing
        # time never equals another's)
        order, same = _first_of_runs([a[sub] for a in (en, st, peer, op_code, seq, comm, ix, it, ri)], len(sub))
        okr = (st_ok & en_ok)[sub][order]
        same[1:] &= okr[1:] & okr[:-1]
        dup = np.zeros(n, dtype=bool)
        dup[sub[order[same]]] = True
        exclude(dup, "{k} duplicated row(s), excluded")
        # two different rows at the same (iteration, op_index)
        keep = sub[~excluded[sub]]
        if len(keep) > 1:
            o, s = _first_of_runs([ix[keep], it[keep], ri[keep]], len(keep))
            if s.any():
                clash = np.zeros(n, dtype=bool)
                first = np.r_[s[1:], False] & ~s
                clash[keep[o[s]]] = True
                clash[keep[o[first]]] = True
                exclude(clash, "{k} row(s) share an (iteration, op_index) with a different row, excluded")

    # seq strictly increasing per stream (collectives: comm; p2p: comm, direction, peer) in issue
    # (= start; not started: last) order
    keep = np.flatnonzero(~excluded)
    if len(keep) > 1:
        o = _stream_order(ri[keep], comm[keep], np.where(is_p2p, op_code, -1)[keep],
                          np.where(is_p2p, peer, -1)[keep], it[keep], np.where(st_ok, st, _I64_MAX)[keep], ix[keep])
        sid = o[1]
        o = o[0]
        same_stream = sid[o][1:] == sid[o][:-1]
        sq = seq[keep][o]
        back = np.zeros(len(keep), dtype=bool)
        back[1:] = same_stream & (sq[1:] <= sq[:-1])
        bad = np.zeros(n, dtype=bool)
        bad[keep[o[back]]] = True
        exclude(bad, "{k} op(s) repeat or go back in seq on their communicator, excluded")

    kk = ~excluded
    shapes = rank_shapes(ri[kk], it[kk], st[kk], en[kk], (st_ok & en_ok)[kk], comm[kk], comm_names, order_ranks)
    for r, f in found.items():
        f.shape = shapes[r]
    out = table.filter(pa.array(~excluded)) if excluded.any() else table
    out = _repair_op_index(out, ~excluded, ri, it, ix, np.where(st_ok, st, _I64_MAX), st_ok, order_ranks, found)
    for r, f in found.items():
        if f.rows_excluded and f.rows_excluded == f.rows_read:
            f.messages[-1] += " (no op of this rank is left)"
    return out, found


def _stream_order(ri: np.ndarray, comm: np.ndarray, kind: np.ndarray, pk: np.ndarray, it: np.ndarray,
                  st: np.ndarray, ix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(order by stream (rank, comm, kind, peer) then (iteration, start, op_index), stream id per row)."""
    c, pmax = int(comm.max()) + 1, int(pk.max()) + 2
    if (int(ri.max()) + 1) * c * 3 * pmax < (1 << 62):   # one int64 key
        kc = np.where(kind < 0, 0, kind - int(_P2P_CODES.min()) + 1)
        sid = ((ri * c + comm) * 3 + kc) * pmax + (pk + 1)
    else:
        sid = np.unique(np.stack([ri, comm, kind, pk], axis=1), axis=0, return_inverse=True)[1].reshape(-1)
    if _is_sorted([ix, st, it, ri]):   # rows in issue order already: a stable sort by stream keeps it
        return np.argsort(sid, kind="stable"), sid
    return np.lexsort([ix, st, it, sid]), sid


def _repair_op_index(out: pa.Table, kept: np.ndarray, ri: np.ndarray, it: np.ndarray, ix: np.ndarray,
                     st: np.ndarray, st_ok: np.ndarray, order_ranks: list[int],
                     found: dict[int, RankFindings]) -> pa.Table:
    """``op_index`` in issue (start) order inside each iteration: renumbered on the ranks where it is not."""
    m = out.num_rows
    if m < 2:
        return out
    ri2, it2, ix2, st2, ok2 = ri[kept], it[kept], ix[kept], st[kept], st_ok[kept]
    o = _sort_order([ix2, it2, ri2])
    ris, its, sts, oks = ri2[o], it2[o], st2[o], ok2[o]
    disorder = (ris[1:] == ris[:-1]) & (its[1:] == its[:-1]) & (sts[1:] < sts[:-1]) & oks[1:] & oks[:-1]
    if not disorder.any():
        return out
    bad_r, bad_it = ris[1:][disorder], its[1:][disorder]
    pairs = np.unique(np.stack([bad_r, bad_it]), axis=1)
    n_iters = np.bincount(pairs[0], minlength=len(order_ranks))
    o2 = np.lexsort([ix2, st2, it2, ri2])
    grp = np.r_[0, np.flatnonzero((it2[o2][1:] != it2[o2][:-1]) | (ri2[o2][1:] != ri2[o2][:-1])) + 1]
    run = np.repeat(grp, np.diff(np.r_[grp, m]))
    new_ix = np.empty(m, dtype=np.int64)
    new_ix[o2] = np.arange(m) - run
    new_ix = np.where(n_iters[ri2] > 0, new_ix, ix2)
    idx = out.schema.get_field_index("op_index")
    out = out.set_column(idx, out.schema.field(idx), pa.array(new_ix.astype(np.int32)))
    for i in np.flatnonzero(n_iters).tolist():
        found[order_ranks[i]].add(f"op_index is not in start order in {int(n_iters[i])} iteration(s); "
                                  "renumbered by start_ns")
    return out


def _np_valid(col: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """An int64 column as numpy (nulls as 0) and its validity mask."""
    if col.null_count:
        return pc.fill_null(col, 0).to_numpy(), _np(pc.is_valid(col)).astype(bool)
    return _np(col), np.ones(len(col), dtype=bool)


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
