"""The cross-rank half of the consistency pass, vectorized over a batch of ranks.

The members of a communicator number the same collective with the same ``seq`` and log it in the
same iteration. :class:`CrossCheck` compares each rank read with the first ``max_partners``
readers of each of its communicators (see :meth:`holmes.io.consistency.ConsistencyLog.cross_check`
for the rule); :meth:`CrossCheck.add` takes the checked rows of many ranks at once and does one
sort and a few grouped numpy passes per communicator instead of a Python loop per rank.

Examples
--------
>>> from holmes.io.schema import ops_table
>>> def log(r, shift):
...     return ops_table(rank=[r] * 4, iteration=[0, 1, 2, 3], op_index=[0] * 4, comm_id=["dp"] * 4,
...                      seq=[0, 1, 2, 3], op=["all_reduce"] * 4, peer=[None] * 4, nbytes=[8] * 4,
...                      start_ns=[i * 100 + shift for i in range(4)], end_ns=[i * 100 + 5 + shift for i in range(4)])
>>> import pyarrow as pa
>>> cc = CrossCheck()
>>> found = cc.add(pa.concat_tables([log(0, 0), log(1, 0), log(2, 100)]), [0, 1, 2])
>>> [d[:3] for d in found]
[(0, 2, 'dp'), (1, 2, 'dp')]
>>> found[0][3]
"ranks 0 and 2 disagree on communicator 'dp': the collectives both logged end 0.0001 ms apart (median), 1 iteration periods (iteration or seq numbers shifted)"
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from holmes.io.schema import OP_NAMES, P2P_OPS
from holmes.stats import median_by_group

__all__ = ["CrossCheck", "MemberIndex", "op_codes"]

_I64_MAX = np.iinfo(np.int64).max
_P2P_CODES = np.array([OP_NAMES.index(o) for o in P2P_OPS])
_IS_P2P = np.array([o in P2P_OPS for o in OP_NAMES] + [False])   # by op code; -1 (unknown) = last
_A2A = OP_NAMES.index("all_to_all")  # its per-rank size may differ between members


@dataclass
class _Reader:
    """One reader of a communicator: its collectives (seq sorted unique) and iteration period."""

    rank: int
    seq: np.ndarray
    it: np.ndarray
    opc: np.ndarray
    nb: np.ndarray
    end: np.ndarray
    end_ok: np.ndarray
    period: float
    pos: int = -1   # position in the batch that registered it (-1: an earlier batch)


class CrossCheck:
    """The readers kept per communicator and the disagreements found (bounded memory)."""

    def __init__(self, max_partners: int = 2) -> None:
        self.max_partners = int(max_partners)
        self.readers: dict[str, list[_Reader]] = {}
        self.checked: set[int] = set()

    def add(self, table: pa.Table, ranks: Sequence[int]) -> list[tuple[int, int, str, str]]:
        """Cross-check the ranks of ``ranks`` (in that reading order) whose rows ``table`` holds;
        returns the disagreements ``(rank_a, rank_b, comm_id, message)`` found, in reading order."""
        todo = [int(r) for r in ranks if int(r) not in self.checked]
        if not todo or table.num_rows == 0:
            self.checked.update(todo)
            return []
        pos_of = np.full(int(max(todo)) + 2, -1, dtype=np.int64)
        pos_of[np.asarray(todo)] = np.arange(len(todo))
        self.checked.update(todo)
        rows = _collectives(table, pos_of)
        if rows is None:
            return []
        pos, comm, names, first_row, it, seq, opc, nb, end, end_ok = rows
        # one segment per (comm, rank): its collectives by seq, repeats dropped (the first kept)
        o = np.lexsort([seq, pos, comm])
        pos, comm, first_row, it, seq, opc, nb, end, end_ok = (
            a[o] for a in (pos, comm, first_row, it, seq, opc, nb, end, end_ok))
        keep = np.r_[True, (seq[1:] != seq[:-1]) | (pos[1:] != pos[:-1]) | (comm[1:] != comm[:-1])]
        pos, comm, first_row, it, seq, opc, nb, end, end_ok = (
            a[keep] for a in (pos, comm, first_row, it, seq, opc, nb, end, end_ok))
        seg_start = np.flatnonzero(np.r_[True, (pos[1:] != pos[:-1]) | (comm[1:] != comm[:-1])])
        seg_end = np.r_[seg_start[1:], len(pos)]
        seg = np.repeat(np.arange(len(seg_start)), seg_end - seg_start)
        periods = _periods(seg, it, end, end_ok, len(seg_start))
        seg_first = np.minimum.reduceat(first_row, seg_start)
        # the readers of each communicator: those kept from earlier batches, then this batch's first
        comm_bounds = np.flatnonzero(np.r_[True, comm[seg_start][1:] != comm[seg_start][:-1]])
        block_end = np.r_[comm_bounds[1:], len(seg_start)]
        block_readers: list[list[_Reader]] = []
        new: list[_Reader] = []
        for cs, ce in zip(comm_bounds.tolist(), block_end.tolist()):
            readers = self.readers.setdefault(names[int(comm[seg_start[cs]])], [])
            for s in range(cs, min(ce, cs + max(0, self.max_partners - len(readers)))):
                a, b = seg_start[s], seg_end[s]
                # copies: a view would keep the whole batch's arrays alive as long as the reader
                readers.append(_Reader(todo[int(pos[a])], *(x[a:b].copy() for x in (seq, it, opc, nb, end, end_ok)),
                                       float(periods[s]), int(pos[a])))
                new.append(readers[-1])
            block_readers.append(readers)
        seg_block = np.repeat(np.arange(len(comm_bounds)), block_end - comm_bounds)
        cols = (seg, pos, it, seq, opc, nb, end, end_ok)
        found: list[tuple[int, int, int, int, tuple[int, int, str, str]]] = []
        for qi in range(self.max_partners):
            for s, q, what in _compare_slot(qi, block_readers, seg_block, seg_start, seg_end, todo, cols, periods):
                r = todo[int(pos[seg_start[s]])]
                lo, hi = min(r, q.rank), max(r, q.rank)
                cid = names[int(comm[seg_start[s]])]
                msg = (f"ranks {lo} and {hi} disagree on communicator {cid!r}: {what} "
                       "(iteration or seq numbers shifted)")
                found.append((int(pos[seg_start[s]]), int(seg_first[s]), qi, 0, (lo, hi, cid, msg)))
        found.sort(key=lambda x: x[:4])
        for q in new:   # later batches see this batch's readers as earlier ones
            q.pos = -1
        return [f[4] for f in found]


def _compare_slot(qi: int, block_readers: list[list[_Reader]], seg_block: np.ndarray, seg_start: np.ndarray,
                  seg_end: np.ndarray, todo: list[int], cols: tuple, periods: np.ndarray) -> list[tuple[int, _Reader, str]]:
    """(segment, reader, what) of every segment that disagrees with its communicator's reader
    number ``qi`` read before it: all communicators at once, keyed by (communicator block, seq)."""
    seg, pos, it, seq, opc, nb, end, end_ok = cols
    blocks = [b for b, rs in enumerate(block_readers) if len(rs) > qi and len(rs[qi].seq)]
    if not blocks:
        return []
    qs = [block_readers[b][qi] for b in blocks]
    has = np.zeros(len(block_readers), dtype=bool)
    has[blocks] = True
    q_of_block = np.full(len(block_readers), -1, dtype=np.int64)
    q_of_block[blocks] = np.arange(len(blocks))
    qpos = np.array([q.pos for q in qs], dtype=np.int64)
    qrank = np.array([q.rank for q in qs], dtype=np.int64)
    qperiod = np.array([q.period for q in qs], dtype=np.float64)
    todo_a = np.asarray(todo, dtype=np.int64)
    seg_q = np.where(has[seg_block], q_of_block[seg_block], -1)
    sp = pos[seg_start]
    elig = (seg_q >= 0) & (sp > np.where(seg_q >= 0, qpos[seg_q], 0)) & (todo_a[sp] != np.where(seg_q >= 0, qrank[seg_q], -1))
    if not elig.any():
        return []
    # reader rows keyed by (reader number, seq rank); batch rows of eligible segments likewise
    lens = np.array([len(q.seq) for q in qs], dtype=np.int64)
    rq = np.repeat(np.arange(len(qs)), lens)
    rseq = np.concatenate([q.seq for q in qs])
    rows = np.flatnonzero(elig[seg])
    bq = seg_q[seg[rows]]
    useq, inv = np.unique(np.concatenate([rseq, seq[rows]]), return_inverse=True)
    inv = inv.reshape(-1)
    u = len(useq)
    rkey = rq * u + inv[:len(rseq)]          # sorted: readers in order, each one's seq ascending
    bkey = bq * u + inv[len(rseq):]
    j = np.minimum(np.searchsorted(rkey, bkey), len(rkey) - 1)
    m = rkey[j] == bkey
    rows, j = rows[m], j[m]
    rit, ropc, rnb = (np.concatenate([getattr(q, a) for q in qs]) for a in ("it", "opc", "nb"))
    rend, rok = np.concatenate([q.end for q in qs]), np.concatenate([q.end_ok for q in qs])
    n = len(seg_start)
    sg = seg[rows]
    common = np.bincount(sg, minlength=n)
    diff = ((it[rows] != rit[j]) | (opc[rows] != ropc[j])
            | ((nb[rows] != rnb[j]) & (nb[rows] > 0) & (rnb[j] > 0) & (opc[rows] != _A2A)))
    bad = np.bincount(sg[diff], minlength=n)
    ok_m = end_ok[rows] & rok[j]
    lag = median_by_group(sg[ok_m], np.abs(end[rows][ok_m] - rend[j][ok_m]).astype(np.float64), n)
    period = np.minimum(periods, np.where(seg_q >= 0, qperiod[np.maximum(seg_q, 0)], np.inf))
    out: list[tuple[int, _Reader, str]] = []
    for s in np.flatnonzero(elig & (common > 0)).tolist():
        q = qs[int(seg_q[s])]
        if bad[s] <= 0.1 * common[s]:  # inferred iteration boundaries (converters) may slip a little
            # the same collectives must also complete at about the same time: a rank numbered a
            # whole iteration ahead is off by one iteration period, far beyond any clock skew
            if not np.isfinite(period[s]) or not np.isfinite(lag[s]) or lag[s] <= 0.5 * period[s]:
                continue
            out.append((s, q, f"the collectives both logged end {lag[s] / 1e6:.3g} ms apart (median), "
                              f"{lag[s] / period[s]:.2g} iteration periods"))
        else:
            out.append((s, q, f"{int(bad[s])} of the {int(common[s])} collective(s) both logged differ in "
                              "iteration, operator or size"))
    for s in np.flatnonzero(elig & (common == 0)).tolist():
        q = qs[int(seg_q[s])]
        a, b = seg_start[s], seg_end[s]
        shared = len(np.intersect1d(np.unique(it[a:b]), np.unique(q.it)))
        if shared >= 2:
            out.append((s, q, f"they share {shared} iterations but no collective seq number"))
        elif _ran_together(end[a:b][end_ok[a:b]], it[a:b][end_ok[a:b]], q.end[q.end_ok], q.it[q.end_ok]):
            out.append((s, q, "they logged at the same time but share no iteration or collective seq number"))
    return out


def _collectives(table: pa.Table, pos_of: np.ndarray) -> tuple | None:
    """The collectives of the ranks to check: (reading position, comm code, comm names, row, iteration,
    seq, op code, nbytes, end_ns, end_ns valid), or None when there are none."""
    rk = table.column("rank").to_numpy().astype(np.int64)
    inside = rk < len(pos_of) - 1
    pos = np.where(inside, pos_of[np.minimum(rk, len(pos_of) - 1)], -1)
    codes, is_p2p = op_codes(table.column("op"))
    sel = (pos >= 0) & ~is_p2p
    if not sel.any():
        return None
    comm, names = _codes(table.column("comm_id"))
    endc = table.column("end_ns")
    if endc.null_count:
        end, end_ok = pc.fill_null(endc, 0).to_numpy(), pc.is_valid(endc).to_numpy(zero_copy_only=False)
    else:
        end, end_ok = endc.to_numpy(), np.ones(table.num_rows, dtype=bool)
    idx = np.flatnonzero(sel)
    return (pos[idx], comm[idx], names, idx, table.column("iteration").to_numpy()[idx],
            table.column("seq").to_numpy()[idx], codes[idx], table.column("nbytes").to_numpy()[idx],
            end[idx].astype(np.int64), np.asarray(end_ok)[idx].astype(bool))


def _codes(col: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, list[Any]]:
    """Integer codes and their values for a (possibly dictionary-encoded) string column (equal
    strings, equal codes)."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()   # one dictionary for every chunk
    if pa.types.is_dictionary(col.type):
        values = col.dictionary.to_pylist()
        if col.dictionary.null_count == 0 and len(set(values)) == len(values):
            return col.indices.to_numpy(zero_copy_only=False).astype(np.int64), values
        col = col.cast(col.type.value_type)
    enc = col.dictionary_encode()
    return enc.indices.to_numpy(zero_copy_only=False).astype(np.int64), enc.dictionary.to_pylist()


def op_codes(col: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(index in :data:`~holmes.io.schema.OP_NAMES` per row, -1 for an unknown op; is send/recv)."""
    c, names = _codes(col)
    code = np.array([OP_NAMES.index(o) if o in OP_NAMES else -1 for o in names] or [-1], dtype=np.int64)[c]
    return code, _IS_P2P[code]


class MemberIndex:
    """Who belongs to which communicator: one sorted ``(communicator, member)`` key array over every
    communicator of the job, built once and kept (a job's checks ask rank after rank).

    Examples
    --------
    >>> known, is_member = MemberIndex({"dp-0": (0, 1), "tp-0": (0, 2)}).lookup(["tp-0", "other"])
    >>> known.tolist(), is_member(np.array([0, 0, 1]), np.array([2, 1, 5])).tolist()
    ([True, False, False], [True, False, True])
    """

    def __init__(self, communicators: Mapping[str, Any]) -> None:
        self.communicators = communicators
        self._code: dict[Any, int] | None = None
        self._keys = np.zeros(0, np.int64)
        self._span = 1

    def _build(self) -> dict[Any, int]:
        if self._code is None:
            code: dict[Any, int] = {}
            parts = []
            for name, c in self.communicators.items():
                rs = getattr(c, "ranks", c) if c is not None else None
                if rs is None:
                    continue
                code[name] = len(code)
                parts.append(np.unique(np.asarray(rs, dtype=np.int64)))
            self._span = max([int(m[-1]) for m in parts if len(m)] + [0]) + 1
            self._keys = np.concatenate([i * self._span + m for i, m in enumerate(parts)] or [np.zeros(0, np.int64)])
            self._code = code
        return self._code

    def lookup(self, names: list[Any]) -> tuple[np.ndarray, Any]:
        """For local codes ``0..len(names)-1`` (and -1 = the last): (whether each comm_id has a member
        list, ``is_member(code, rank)`` -> bool array, True where the comm_id has none)."""
        code = self._build()
        g = np.array([code.get(n, -1) for n in names] + [-1], dtype=np.int64)
        known = g >= 0
        keys, span = self._keys, self._span

        def is_member(local: np.ndarray, rank: np.ndarray) -> np.ndarray:
            gc = g[local]
            out = gc < 0
            if len(keys):
                q = gc * span + rank
                j = np.minimum(np.searchsorted(keys, q), len(keys) - 1)
                out |= (gc >= 0) & (keys[j] == q) & (rank >= 0) & (rank < span)
            return out
        return known, is_member


def _periods(seg: np.ndarray, it: np.ndarray, end: np.ndarray, end_ok: np.ndarray, n: int) -> np.ndarray:
    """Per segment: the median gap between the first collective ends of consecutive iterations
    (per iteration number), inf with fewer than 3 iterations."""
    out = np.full(n, np.inf)
    o = np.lexsort([it, seg])
    s, i = seg[o], it[o]
    e = np.where(end_ok[o], end[o], _I64_MAX)
    starts = np.flatnonzero(np.r_[True, (s[1:] != s[:-1]) | (i[1:] != i[:-1])])
    gs, gi, ge = s[starts], i[starts], np.minimum.reduceat(e, starts)
    n_it = np.bincount(gs, minlength=n)
    same = gs[1:] == gs[:-1]
    ok = same & (ge[1:] != _I64_MAX) & (ge[:-1] != _I64_MAX) & (n_it[gs[1:]] >= 3)
    gaps = (ge[1:].astype(np.float64) - ge[:-1]) / np.maximum((gi[1:] - gi[:-1]).astype(np.float64), 1.0)
    ok &= gaps > 0
    med = median_by_group(gs[1:][ok], gaps[ok], n)
    has = np.isfinite(med)
    out[has] = med[has]
    return out


def _ran_together(st: np.ndarray, its: np.ndarray, qst: np.ndarray, qits: np.ndarray) -> bool:
    """Both ranks logged >= 3 iterations and their time spans overlap by over half the shorter one."""
    if len(np.unique(its)) < 3 or len(np.unique(qits)) < 3:
        return False
    lo, hi = max(st.min(), qst.min()), min(st.max(), qst.max())
    shorter = min(st.max() - st.min(), qst.max() - qst.min())
    return shorter > 0 and (hi - lo) > 0.5 * shorter
