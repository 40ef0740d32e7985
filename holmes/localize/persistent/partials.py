"""The persistent analysis's gather as an explicit map and reduce over chunks of ranks.

Folding every rank's operators at once (:func:`fold` on a merged
:class:`~holmes.localize.persistent.rank.PersistentSummary`) holds about 50 bytes per operator of
the job: 3 GB at 8,192 GPUs x 100 iterations. Here the same tables are built in three steps, in
process or on a cluster (:mod:`holmes.parallel`), with nothing the size of the job in one process:

1. **map** (:func:`chunk_part`, one task per chunk of consecutive ranks): read the chunk's logs,
   summarize each rank (:func:`~holmes.localize.persistent.rank.persistent_summaries`) and reduce
   the chunk to a :class:`Part`: per rank its own work and operator counts per iteration; per
   *instance* (slot + ``seq``) the chunk's partial fold (member count, shortest and second-shortest
   copy, ...: what :func:`fold` keeps), split into ``nblocks``
   blocks by a hash of the slot; and the what-if program's rows of the replayed iterations only;
2. **plan** (:func:`plan`, the client, small): the job's slots (sorted as ``fold`` sorts them) and
   each slot's ``seq`` range, hence every instance's number;
3. **reduce by block** (:func:`block_fold`, one task per block): the partial folds of one block
   of slots, from every chunk, merged in rank order, and reduced to the tables the analysis reads
   (waiting caused, per-slot transfer time, bytes and counts, operator-type inputs) plus the
   replay's per-instance arrays for the instances the program rows use; then :func:`assemble`
   (the client) adds the blocks up into a :class:`~holmes.localize.persistent.wait.Folded`.

:func:`~holmes.localize.persistent.gather.gather_folded` runs the three steps as tasks on an executor.

Every table is a sum of integers (nanoseconds, bytes, counts) or a minimum with ties broken by
the lower rank, so the result is bit for bit the one of ``fold`` whatever the chunks and blocks.

Examples
--------
>>> import holmes
>>> from holmes.localize.persistent.rank import persistent_window, persistent_summaries
>>> from holmes.localize.persistent.partials import fold
>>> job = holmes.read_job("fixtures/gpu16-clean")
>>> win = persistent_window(job)
>>> parts = [chunk_part(job, r, win, nblocks=3) for r in ([0, 1, 2, 3, 4], list(range(5, 16)))]
>>> f = fold_parts(parts, job.communicators, 16, win)
>>> g = fold(persistent_summaries(job, win), job.communicators)
>>> bool((f.caused == g.caused).all() and (f.X == g.X).all() and (f.CNT == g.CNT).all())
True
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from holmes._jit import njit
from holmes.calibration.thresholds import Thresholds, load_thresholds, or_shipped
from holmes.errors import ConfigError
from holmes.localize.persistent.rank import _RBITS, PersistentSummary, persistent_summaries
from holmes.localize.persistent.wait import (_BIG, _MASK, Folded, _fold, _seq_range, _slot_info, p2p_copies,
                                             slot_type_codes, type_keys)
from holmes.localize.persistent.whatif import Program
from holmes.parallel.sizes import INSTANCE_KEY_BITS, PROGRAM_SLICE_ROWS, SLOT_HASH_MULTIPLIERS

__all__ = ["Part", "Plan", "chunk_part", "part_of", "plan", "block_fold", "assemble", "fold_parts", "fold",
           "replayed_iterations", "block_config", "collect_rows"]

log = logging.getLogger(__name__)

_LOW = (1 << 2 * _RBITS) - 1
#: the per-instance partial fold a :class:`Part` carries, with dtypes
PARTIAL = {"cslot": np.int32, "seq": np.int64, "cnt": np.int32, "d1": np.int64, "d2": np.int64, "r1": np.int32,
           "g1": np.int64, "it1": np.int32, "nb": np.int64, "opk": np.int8,
           "ss": np.int64, "gs": np.int64, "rs": np.int64, "re": np.int64}


#: the codec a part's arrays are held in (a chunk's partial folds and rows shrink ~5x with lz4)
_CODEC = "lz4" if pa.Codec.is_available("lz4") else None


def pack(arrs: Mapping[str, np.ndarray]) -> dict[str, tuple[str, int, bytes]]:
    """1-D arrays compressed (:data:`_CODEC`): what a part holds while it waits for the reduce.

    >>> a = {"x": np.arange(5), "b": np.array([True, False])}
    >>> {k: v.tolist() for k, v in unpack(pack(a)).items()}
    {'x': [0, 1, 2, 3, 4], 'b': [True, False]}
    """
    out = {}
    for k, v in arrs.items():
        v = np.ascontiguousarray(v)
        raw = v.view(np.uint8)
        out[k] = (v.dtype.str, len(v), pa.compress(raw, codec=_CODEC, asbytes=True) if _CODEC else raw.tobytes())
    return out


def unpack(packed: Mapping[str, tuple[str, int, bytes]]) -> dict[str, np.ndarray]:
    """The arrays of :func:`pack` (read-only)."""
    out = {}
    for k, (dt, n, b) in packed.items():
        size = n * np.dtype(dt).itemsize
        raw = pa.decompress(b, size, codec=_CODEC, asbytes=True) if _CODEC else b
        out[k] = np.frombuffer(raw, dtype=dt, count=n)
    return out


def replayed_iterations(T: int, n: int | None = None) -> np.ndarray | None:
    """The window iterations the what-if replays run on: ``n`` (threshold ``whatif_iterations``)
    evenly spaced, or None (all) when the window holds at most ``n``.

    >>> replayed_iterations(100, 4).tolist(), replayed_iterations(3, 4)
    ([0, 33, 66, 99], None)
    """
    n = int(or_shipped(n, "whatif_iterations"))
    return np.unique(np.linspace(0, T - 1, n).round().astype(np.int64)) if T > n else None


@dataclass
class Part:
    """The map's value for a chunk of ranks (see the module docstring).

    ``comms``/``ckeys``: the chunk's communicators and slots (``comm code << 42 | (sender + 1) << 21
    | (receiver + 1)``, codes into ``comms``), ``smin``/``smax`` each slot's ``seq`` range;
    ``compute`` and ``counts`` (ranks x T): own work and operators per iteration; ``blocks[b]``:
    the partial folds (:data:`PARTIAL`) of the slots of block ``b``; ``rows``: the program rows
    (``cslot``, ``seq``, ``gap``, ``new_batch``, ``detached``, ``widx``) of the kept iterations, rank-major; both
    held compressed (:func:`pack`, :func:`unpack`).
    """

    window: np.ndarray
    world_size: int
    ranks: np.ndarray
    missing: dict[int, str]
    comms: tuple[str, ...]
    ckeys: np.ndarray
    smin: np.ndarray
    smax: np.ndarray
    compute: np.ndarray
    counts: np.ndarray
    blocks: list[dict[str, tuple[str, int, bytes]]] = field(default_factory=list)
    rows: dict[str, tuple[str, int, bytes]] | None = None

    def meta(self) -> "Part":
        """The part without its blocks and rows (what :func:`plan` reads)."""
        return Part(self.window, self.world_size, self.ranks, self.missing, self.comms, self.ckeys, self.smin,
                    self.smax, self.compute, self.counts)

    @property
    def nbytes(self) -> int:
        arrs = [self.ckeys, self.smin, self.smax, self.compute, self.counts]
        packed = [v for b in self.blocks for v in b.values()] + list((self.rows or {}).values())
        return int(sum(a.nbytes for a in arrs) + sum(len(v[2]) for v in packed))


def chunk_part(job: Any, ranks: Sequence[int], window: Any, *, keep: np.ndarray | None = None, nblocks: int = 1,
               thresholds: Thresholds | None = None) -> Part:
    """Map step: read ``ranks`` (an int: that one) of ``job`` and reduce them to a :class:`Part`.

    ``keep``: bool per window iteration, the iterations whose program rows the part carries (None:
    no rows, no what-if program); ``nblocks``: how many blocks the partial folds are split into.
    """
    rs = [int(ranks)] if np.isscalar(ranks) else [int(r) for r in ranks]
    s = persistent_summaries(job, window, rs, thresholds)
    return part_of(s, rs, keep=keep, nblocks=nblocks, consume=True)


def _recode(pieces: list[tuple[Sequence[str], np.ndarray]]) -> tuple[list[str], list[np.ndarray], np.ndarray]:
    """Slot keys of several pieces (each with its own communicator numbering) in one numbering:
    the sorted union of their communicator ids, each piece's keys re-coded to it, and the union
    of those keys (sorted, unique)."""
    comm_ids = sorted({c for cs, _ in pieces for c in cs})
    code = {c: i for i, c in enumerate(comm_ids)}
    out = []
    for cs, keys in pieces:
        lut = np.array([code[c] for c in cs] or [0], np.int64)
        out.append((lut[keys >> 2 * _RBITS] << 2 * _RBITS) | (keys & _LOW))
    return comm_ids, out, (np.unique(np.concatenate(out)) if out else np.zeros(0, np.int64))


def slot_block(comms: Sequence[str], keys: np.ndarray, nblocks: int) -> np.ndarray:
    """Per slot, its block: a hash of its communicator's id, sender and receiver (the same in every
    process, whatever the chunk)."""
    if nblocks <= 1:
        return np.zeros(len(keys), np.int64)
    ch = np.array([zlib.crc32(c.encode()) for c in comms] or [0], np.int64)
    k = keys.astype(np.int64)
    m_send, m_recv = SLOT_HASH_MULTIPLIERS
    h = ch[k >> 2 * _RBITS] + m_send * ((k >> _RBITS) & _MASK) + m_recv * (k & _MASK)
    return h % nblocks


def part_of(summary: PersistentSummary, ranks: Sequence[int] | None = None, *, keep: np.ndarray | None = None,
            nblocks: int = 1, consume: bool = False) -> Part:
    """The :class:`Part` of a (merged) summary's ranks (default all of them, ascending)."""
    win, T = summary.window, len(summary.window)
    rs = sorted(int(r) for r in (summary.per_rank if ranks is None else ranks))
    have = [r for r in rs if r in summary.per_rank]
    missing = {r: summary.missing[r] for r in rs if r in summary.missing}
    per = [summary.per_rank.pop(r) if consume else summary.per_rank[r] for r in have]
    comm_list, gk, ckeys = _recode([(s.comms, s.keys) for s in per])
    comms = tuple(comm_list)
    R = len(rs)
    pos = {r: i for i, r in enumerate(rs)}
    compute = np.zeros((R, T))
    counts = np.zeros((R, T), np.int64)
    lens = np.array([len(s.ops["seq"]) for s in per], np.int64)
    n = int(lens.sum())
    cslot = np.empty(n, np.int32)
    cols = {k: np.empty(n, dt) for k, dt in (("seq", np.int64), ("widx", np.int32), ("dur", np.int64),
                                              ("own", np.int64), ("gap", np.float64), ("new_batch", np.bool_),
                                              ("nbytes", np.int64), ("opk", np.int8), ("start", np.int64),
                                              ("detached", np.bool_))}
    row_rank = np.repeat(np.array(have, np.int64), lens)
    a = 0
    for r, s, g in zip(have, per, gk):
        b = a + len(s.ops["seq"])
        cslot[a:b] = np.searchsorted(ckeys, g)[s.ops["slot"]]
        for k in cols:
            cols[k][a:b] = s.ops[k]
        compute[pos[r]] = s.compute
        counts[pos[r]] = np.diff(s.iter_ptr)
        a = b
    del per, gk
    S = len(ckeys)
    smin = np.full(S, _BIG, np.int64)
    smax = np.full(S, -1, np.int64)
    _seq_range(cslot, cols["seq"], smin, smax)
    size = np.where(smax >= 0, smax - smin + 1, 0)
    base = np.r_[0, np.cumsum(size)].astype(np.int64)
    lid = base[cslot] + cols["seq"] - smin[cslot]
    m = int(base[-1])
    cnt = np.zeros(m, np.int64)
    d1 = np.full(m, _BIG, np.int64)
    d2 = np.full(m, _BIG, np.int64)
    r1 = np.full(m, -1, np.int64)
    g1 = np.zeros(m, np.int64)
    it1 = np.full(m, -1, np.int64)
    nb = np.zeros(m, np.int64)
    opk = np.zeros(m, np.int8)
    opk[lid] = cols["opk"]  # the last row's, as fold's
    p2p = {k: np.full(m, _BIG, np.int64) for k in ("ss", "rs", "re")}
    p2p["gs"] = np.zeros(m, np.int64)
    sender = (((ckeys >> _RBITS) & _MASK) - 1)[cslot]
    _fold(lid, row_rank, cols["dur"], cols["own"], cols["widx"], cols["nbytes"], cols["start"], sender, cnt, d1, d2,
          r1, g1, it1, nb, p2p["ss"], p2p["gs"], p2p["rs"], p2p["re"])
    del sender
    rows = None
    if keep is not None:
        sel = np.asarray(keep, np.bool_)[cols["widx"]]
        rows = pack({"cslot": cslot[sel], "seq": cols["seq"][sel], "gap": cols["gap"][sel],
                     "new_batch": cols["new_batch"][sel], "detached": cols["detached"][sel],
                     "widx": cols["widx"][sel]})
    del cols, lid, row_rank, cslot
    has = np.flatnonzero(cnt > 0)
    ps = np.repeat(np.arange(S, dtype=np.int64), size)[has]
    part = {"cslot": ps, "seq": smin[ps] + (has - base[ps]), "cnt": cnt[has], "d1": d1[has], "d2": d2[has],
            "r1": r1[has], "g1": g1[has], "it1": it1[has], "nb": nb[has], "opk": opk[has],
            **{k: v[has] for k, v in p2p.items()}}
    part = {k: v.astype(PARTIAL[k], copy=False) for k, v in part.items()}
    del cnt, d1, d2, r1, g1, it1, nb, opk, p2p
    blk = slot_block(comms, ckeys, nblocks)[ps]
    blocks = []
    for b in range(max(1, nblocks)):
        w = np.flatnonzero(blk == b)
        blocks.append(pack({k: v[w] for k, v in part.items()}))
    return Part(win, summary.world_size, np.array(rs, np.int64), missing, comms, ckeys, smin, smax, compute, counts,
                blocks, rows)


@dataclass
class Plan:
    """The job's slots and instance numbering, from every part's :meth:`Part.meta`."""

    window: np.ndarray
    world_size: int
    comm_ids: list[str]
    slot_keys: np.ndarray
    smin: np.ndarray
    base: np.ndarray
    to_global: list[np.ndarray]   # per part, its slots' global indices
    info: list[tuple]
    expected: np.ndarray
    scode: np.ndarray
    compute: np.ndarray
    counts: np.ndarray
    missing: dict[int, str]


def plan(metas: Sequence[Part], communicators: Mapping[str, Any]) -> Plan:
    """Step 2: the job's slots, sorted as :func:`fold` sorts them
    (communicators by id), each slot's ``seq`` range and first instance number; the parts' per-rank
    tables placed in job-wide arrays."""
    first = metas[0]
    W, T = first.world_size, len(first.window)
    comm_ids, gks, slot_keys = _recode([(p.comms, p.ckeys) for p in metas])
    S = len(slot_keys)
    smin = np.full(S, _BIG, np.int64)
    smax = np.full(S, -1, np.int64)
    to_global = []
    compute = np.zeros((W, T))
    counts = np.zeros((W, T), np.int64)
    missing: dict[int, str] = {}
    for p, g in zip(metas, gks):
        ix = np.searchsorted(slot_keys, g)
        to_global.append(ix)
        np.minimum.at(smin, ix, p.smin)
        np.maximum.at(smax, ix, p.smax)
        compute[p.ranks] = p.compute
        counts[p.ranks] = p.counts
        missing.update(p.missing)
    size = np.where(smax >= 0, smax - smin + 1, 0)
    base = np.r_[0, np.cumsum(size)].astype(np.int64)
    info = [_slot_info(int(k), comm_ids, communicators) for k in slot_keys.tolist()]
    expected = np.array([len(i[2]) for i in info], np.int64)
    return Plan(first.window, W, comm_ids, slot_keys, smin, base, to_global, info, expected,
                slot_type_codes(info, communicators), compute, counts, missing)


@njit(cache=True, nogil=True)
def _merge(order, gid, cnt, d1, d2, r1, g1, it1, nb, opk, slot, ss, gs, rs, re,
           ugid, ucnt, ud1, ud2, ur1, ug1, uit1, unb, uopk, uslot, uss, ugs, urs, ure):  # pragma: no cover - compiled
    # partial folds sorted by instance, in rank order within one: fold's result on all their rows
    k = -1
    for j in order:
        g = gid[j]
        if k < 0 or g != ugid[k]:
            k += 1
            ugid[k] = g
            ucnt[k] = cnt[j]
            ud1[k] = d1[j]
            ud2[k] = d2[j]
            ur1[k] = r1[j]
            ug1[k] = g1[j]
            uit1[k] = it1[j]
            unb[k] = nb[j]
            uopk[k] = opk[j]
            uslot[k] = slot[j]
            uss[k] = ss[j]
            ugs[k] = gs[j]
            urs[k] = rs[j]
            ure[k] = re[j]
        else:
            ucnt[k] += cnt[j]
            a1, b1 = ud1[k], d1[j]
            ud2[k] = min(max(a1, b1), min(ud2[k], d2[j]))
            if b1 < a1:  # on equal durations the lower rank's (an earlier chunk) stays
                ud1[k] = b1
                ur1[k] = r1[j]
                ug1[k] = g1[j]
            if uit1[k] < 0:
                uit1[k] = it1[j]
            if nb[j] > unb[k]:
                unb[k] = nb[j]
            uopk[k] = opk[j]  # the last row's
            if ss[j] < uss[k]:  # one send and one receive per P2P instance: whichever part has it
                uss[k] = ss[j]
                ugs[k] = gs[j]
            if rs[j] < urs[k]:
                urs[k] = rs[j]
                ure[k] = re[j]
    return k + 1


def block_fold(pieces: Sequence[dict[str, np.ndarray]], to_global: Sequence[np.ndarray], pl: dict[str, Any],
               needed: np.ndarray | None = None) -> dict[str, Any]:
    """Step 3, one block: every part's partial folds of the block (``pieces``, in rank order, with
    each part's slot map ``to_global``) merged and reduced.

    ``pl``: ``base``, ``smin``, ``expected``, ``scode`` of the :class:`Plan`, ``W``, ``T`` and
    ``bins`` (threshold ``slot_bins_per_octave``); ``needed``: the instance numbers of the block the
    program rows use (sorted), whose replay arrays are returned.
    """
    W, T = pl["W"], pl["T"]
    pieces = [unpack(p) for p in pieces]
    gsl = [tg[p["cslot"]] for p, tg in zip(pieces, to_global)]
    slot = np.concatenate(gsl) if gsl else np.zeros(0, np.int64)
    gid = pl["base"][slot] + np.concatenate([p["seq"] for p in pieces]) - pl["smin"][slot] if len(slot) else \
        np.zeros(0, np.int64)
    cat = {k: np.concatenate([p[k] for p in pieces]).astype(np.int8 if k == "opk" else np.int64, copy=False)
           for k in PARTIAL if k not in ("cslot", "seq")}
    order = np.argsort(gid, kind="stable")
    n = len(gid)
    u = {k: np.empty(n, np.int64) for k in ("gid", "cnt", "d1", "d2", "r1", "g1", "it1", "nb", "slot", "ss", "gs",
                                             "rs", "re")}
    u["opk"] = np.empty(n, np.int8)
    m = _merge(order, gid, cat["cnt"], cat["d1"], cat["d2"], cat["r1"], cat["g1"], cat["it1"], cat["nb"], cat["opk"],
               slot, cat["ss"], cat["gs"], cat["rs"], cat["re"], u["gid"], u["cnt"], u["d1"], u["d2"], u["r1"], u["g1"],
               u["it1"], u["nb"], u["opk"], u["slot"], u["ss"], u["gs"], u["rs"], u["re"])
    del cat, gid, slot, order
    u = {k: v[:m] for k, v in u.items()}
    cnt, d2, it1, s = u["cnt"], u["d2"], u["it1"], u["slot"]
    d1, r1, wait, g = p2p_copies(u["d1"], d2, u["r1"], u["g1"], pl["one_clock_sender"][s], u["ss"], u["gs"], u["rs"],
                                 u["re"])
    ok = (cnt >= 2) & (d2 < _BIG) & (r1 >= 0) & (it1 >= 0)
    own = np.minimum(wait[ok], g[ok]).clip(0).astype(np.float64)
    ck, cinv = np.unique(r1[ok] * T + it1[ok], return_inverse=True)
    caused = (ck, np.bincount(cinv.ravel(), weights=(cnt[ok] - 1) * own, minlength=len(ck)))
    full = cnt >= pl["expected"][s]
    x = np.where(d1 < _BIG, d1, 0).astype(np.float64)
    inst_it = np.where(it1 >= 0, it1, 0)
    xk, xinv = np.unique(s[full] * T + inst_it[full], return_inverse=True)
    X = (xk, np.bincount(xinv.ravel(), weights=x[full], minlength=len(xk)))
    sk, sinv = np.unique(s, return_inverse=True)
    NB = (sk, np.bincount(sinv.ravel(), weights=u["nb"].astype(np.float64), minlength=len(sk)),
          np.bincount(sinv.ravel(), minlength=len(sk)).astype(np.float64))
    tk = type_keys(pl["scode"][s], u["opk"], u["nb"], bins_per_octave=pl["bins"])
    tk = tk.astype(np.int32) if len(tk) and tk.max() <= np.iinfo(np.int32).max else tk
    # per operator type, the transfer times of its instances every member logged, and of the others
    ot = np.argsort(tk, kind="stable")
    tks, starts = np.unique(tk[ot], return_index=True)
    bounds = np.r_[starts, len(ot)]
    types = {}
    for k, a, b in zip(tks.tolist(), bounds[:-1].tolist(), bounds[1:].tolist()):
        w = ot[a:b]
        types[k] = (x[w[full[w]]], x[w[~full[w]]])
    out = {"caused": caused, "X": X, "NB": NB, "types": types}
    if needed is not None:
        w = np.searchsorted(u["gid"], needed)
        out["replay"] = {"gid": needed, "x": x[w], "size": cnt[w].astype(np.int32), "tk": tk[w],
                         "slot": s[w].astype(np.int32), "it": inst_it[w].astype(np.int32)}
    return out


def assemble(pl: Plan, blocks: Iterable[dict[str, Any]], rows: dict[str, np.ndarray] | None, *,
             replay_its: np.ndarray | None, restricted: bool) -> Folded:
    """The :class:`~holmes.localize.persistent.wait.Folded` from the plan, every block's
    :func:`block_fold` (consumed one at a time) and the program rows (:func:`collect_rows`; emptied
    on the way)."""
    W, T = pl.world_size, len(pl.window)
    S = len(pl.slot_keys)
    caused = np.zeros(W * T)
    X = np.zeros(S * T)
    NB = np.zeros(S)
    CNT = np.zeros(S)
    by_type: dict[int, tuple[list[np.ndarray], list[np.ndarray]]] = {}
    reps = []
    nblocks = 0
    for b in blocks:  # the sums are of integers: exact in any order
        np.add.at(caused, b["caused"][0], b["caused"][1])
        np.add.at(X, b["X"][0], b["X"][1])
        np.add.at(NB, b["NB"][0], b["NB"][1])
        np.add.at(CNT, b["NB"][0], b["NB"][2])
        for k, (xf, xo) in b["types"].items():
            got = by_type.setdefault(k, ([], []))
            got[0].append(xf)
            got[1].append(xo)
        reps.append(b.get("replay"))
        nblocks += 1
        del b
    types = np.array(sorted(by_type), np.int64)
    type_x = np.zeros(len(types))
    for i, k in enumerate(types.tolist()):  # the median over the instances every member logged, else all
        xf, xo = by_type.pop(k)
        v = np.concatenate(xf) if sum(len(a) for a in xf) else np.concatenate(xf + xo)
        type_x[i] = np.median(v) if len(v) else 0.0
        del xf, xo, v
    counts = pl.counts
    present = counts.sum(axis=1) > 0
    prog = None
    inst_slot = inst_type = inst_it = np.zeros(0, np.int64)
    row_rank = row_it = np.zeros(0, np.int64)
    if rows is not None:
        # the replay's instances in block order, each block's by number: row -> (block, number) is sorted alike
        rkey = np.concatenate([(np.int64(b) << _GID_BITS) | r.pop("gid") for b, r in enumerate(reps)])
        rep = {k: np.concatenate([r.pop(k) for r in reps]) for k in ("x", "size", "tk", "slot", "it")}
        del reps
        gid, blk = rows.pop("gid"), rows.pop("blk")
        inst = np.empty(len(gid), np.int64 if len(rkey) > np.iinfo(np.int32).max else np.int32)
        for a in range(0, len(gid), _SLICE):  # in slices: no second int64 array of the rows
            inst[a:a + _SLICE] = np.searchsorted(rkey, (blk[a:a + _SLICE].astype(np.int64) << _GID_BITS)
                                                 | gid[a:a + _SLICE])
        del gid, blk, rkey
        kc = counts[:, replay_its] if restricted and replay_its is not None else counts
        lens = kc.sum(axis=1)
        rank_ptr = np.r_[0, np.cumsum(lens)].astype(np.int64)
        iter_ptr = rank_ptr[:-1, None] + np.c_[np.zeros(W, np.int64), np.cumsum(kc, axis=1)]
        row_it = rows.pop("widx")
        row_rank = np.repeat(np.arange(W, dtype=np.int32), lens)
        prog = Program(rank_ptr, iter_ptr, inst, rows.pop("gap"), rows.pop("new_batch"), rep["x"], rep["size"],
                       row_rank=row_rank, detached=rows.pop("detached"))
        inst_slot, inst_it = rep["slot"], rep["it"]
        inst_type = np.searchsorted(types, rep["tk"]).astype(np.int32)
    log.info("persistent: %d ranks folded in %d blocks, %d slots", int(present.sum()), nblocks, S)
    return Folded(pl.window, caused.reshape(W, T), pl.compute, present, pl.info, X.reshape(S, T), NB, CNT, prog,
                  inst_slot, inst_type, type_x, inst_it, row_rank, row_it,
                  replay_its=None if restricted else replay_its, gap_sum=pl.compute if restricted else None)


_SLICE = PROGRAM_SLICE_ROWS
_GID_BITS = INSTANCE_KEY_BITS


def collect_rows(pl: Plan, parts_rows: Iterable[Mapping[str, Any]], n: int, nblocks: int
                 ) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    """The program rows of every part (packed, in rank order; ``n`` in all) in job-wide arrays:
    ``gap``, ``new_batch``, ``detached``, ``widx``, ``gid`` (the instance number) and ``blk`` (its block); and per
    block the sorted instance numbers they use (what :func:`block_fold` returns the replay arrays
    of)."""
    T = len(pl.window)
    out = {"gap": np.empty(n), "new_batch": np.empty(n, np.bool_), "detached": np.empty(n, np.bool_),
           "widx": np.empty(n, np.int16 if T <= np.iinfo(np.int16).max else np.int32), "gid": np.empty(n, np.int64),
           "blk": np.empty(n, np.int16)}
    blk = out["blk"]
    sb = slot_block(pl.comm_ids, pl.slot_keys, nblocks).astype(np.int16)
    a = 0
    for packed, tg in zip(parts_rows, pl.to_global):  # one part's rows at a time
        r = unpack(packed)
        del packed
        b = a + len(r["gap"])
        g = tg[r["cslot"]]
        out["gid"][a:b] = pl.base[g] + r["seq"] - pl.smin[g]
        blk[a:b] = sb[g]
        for k in ("gap", "new_batch", "detached", "widx"):
            out[k][a:b] = r[k]
        a = b
        del r, g
    if a != n:
        raise RuntimeError(f"internal: {a} program rows, the parts' counts say {n}")
    gid = out["gid"]
    if int(pl.base[-1]) >= 1 << _GID_BITS:
        raise ConfigError(f"{int(pl.base[-1])} operator instances in the window: more than this analysis numbers")
    needed = [np.unique(gid[blk == b]) if nblocks > 1 else np.unique(gid) for b in range(nblocks)]
    return out, needed


def _kept_rows(pl: Plan, program_its: np.ndarray | None, restricted: bool) -> int:
    """How many program rows the parts carry."""
    return int(pl.counts[:, program_its].sum() if restricted and program_its is not None else pl.counts.sum())


def fold_parts(parts: Sequence[Part], communicators: Mapping[str, Any], world_size: int, window: Any, *,
               program_its: np.ndarray | None = None, restricted: bool = False,
               thresholds: Thresholds | None = None, clock: np.ndarray | None = None) -> Folded:
    """Plan, reduce by block and assemble in this process (the parts' blocks must agree);
    ``clock``: :func:`block_config`'s."""
    th = thresholds or load_thresholds()
    pl = plan([p.meta() for p in parts], communicators)
    nb = len(parts[0].blocks)
    rows = needed = None
    if parts[0].rows is not None:
        rows, needed = collect_rows(pl, [p.rows for p in parts], _kept_rows(pl, program_its, restricted), nb)
    cfg = block_config(pl, th, clock)
    blocks = (block_fold([p.blocks[b] for p in parts], pl.to_global, cfg, None if needed is None else needed[b])
              for b in range(nb))
    return assemble(pl, blocks, rows, replay_its=program_its, restricted=restricted)


def block_config(pl: Plan, th: Thresholds, clock: np.ndarray | None = None) -> dict[str, Any]:
    """What every :func:`block_fold` needs of the plan (small: per slot, four integers).

    ``clock``: per rank, which clock its timestamps read (ranks of one host share one); a P2P
    slot whose two ends read one clock keeps its sender in ``one_clock_sender`` (else -1), the
    pairs :func:`~holmes.localize.persistent.wait.p2p_copies` may read across ranks.
    """
    sender = ((pl.slot_keys >> _RBITS) & _MASK) - 1
    receiver = (pl.slot_keys & _MASK) - 1
    one = np.zeros(len(sender), np.bool_)
    if clock is not None:
        ck = np.asarray(clock, np.int64)
        p2p = np.flatnonzero((sender >= 0) & (sender < len(ck)) & (receiver >= 0) & (receiver < len(ck)))
        one[p2p] = ck[sender[p2p]] == ck[receiver[p2p]]
    return {"base": pl.base, "smin": pl.smin, "expected": pl.expected, "scode": pl.scode, "W": pl.world_size,
            "T": len(pl.window), "bins": th.slot_bins_per_octave, "one_clock_sender": np.where(one, sender, -1)}


def fold(summary: PersistentSummary, communicators: Mapping[str, Any], *, program: bool = True,
         consume: bool = False, thresholds: Thresholds | None = None, clock: np.ndarray | None = None) -> Folded:
    """Fold a merged summary into the persistent analysis's tables (ranks in ascending order);
    ``consume``: empty ``summary.per_rank`` on the way; ``thresholds``: whose
    ``slot_bins_per_octave`` applies (default the shipped ones); ``clock``: :func:`block_config`'s. The summary is one
    :class:`~holmes.localize.persistent.partials.Part` of the map/reduce of
    :mod:`~holmes.localize.persistent.partials`, folded as every other."""
    keep = np.ones(len(summary.window), np.bool_) if program else None
    part = part_of(summary, list(range(summary.world_size)), keep=keep, consume=consume)
    return fold_parts([part], communicators, summary.world_size, summary.window, thresholds=thresholds, clock=clock)
