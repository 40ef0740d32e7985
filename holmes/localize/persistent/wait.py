"""Who made whom wait: the merged per-rank summaries folded into per-instance and per-rank tables.

From a :class:`~holmes.localize.persistent.rank.PersistentSummary` (every rank's operators in the
window) :func:`fold` builds, visiting ranks in ascending order (so the result does not depend on how
the summaries were merged):

* per operator *instance* (a slot -- communicator, or P2P communicator + sender + receiver -- and a
  ``seq``): its member count, its shortest copy (its duration, its rank, that rank's own work
  before it, its iteration) and its second-shortest duration. The member that entered last waited
  for no one: its copy lasted least; the others waited about ``second - shortest`` each;
* **waiting caused** (ranks x iterations): each instance's last member is charged
  ``(n - 1) * min(second - shortest, its own work since it last waited)`` (clock-free: every
  duration and gap is measured on one rank's clock);
* **own work** (ranks x iterations): the sum of each rank's compute gaps;
* per slot and iteration the *transfer time* (the sum of its instances' shortest copies), its bytes
  and its instance count, to compare communicators with their peers;
* per instance its *operator type* and per type the median transfer time over the window
  (:func:`operator_types`: the what-if ideal, WIA's per-operator-type median);
* the replayable program (:class:`~holmes.localize.persistent.whatif.Program`) of the window.

Examples
--------
>>> import holmes
>>> from holmes.localize.persistent.rank import persistent_window, persistent_rank_summary, merge_summaries
>>> job = holmes.read_job("fixtures/gpu16-clean")
>>> win = persistent_window(job)
>>> f = fold(merge_summaries(*[persistent_rank_summary(job, r, win) for r in range(16)]), job.communicators)
>>> f.caused.shape == f.compute.shape == (16, len(win)), bool(f.caused.min() >= 0)
(True, True)
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from holmes._jit import njit
from holmes.calibration.thresholds import Thresholds, load_thresholds, or_shipped
from holmes.localize.persistent.rank import _RBITS, FIELDS, PersistentSummary
from holmes.localize.persistent.whatif import Program

__all__ = ["Folded", "fold"]

log = logging.getLogger(__name__)

_BIG = np.iinfo(np.int64).max
_MASK = (1 << _RBITS) - 1
#: an operator type key packs the slot kind, the operator and the size class in bytes
_BYTE_BITS = np.iinfo(np.uint8).bits
_BYTE_MAX = np.iinfo(np.uint8).max


@dataclass
class Folded:
    """The tables the persistent analysis works on (see the module docstring)."""

    window: np.ndarray
    caused: np.ndarray            # (W, T) waiting caused, ns
    compute: np.ndarray           # (W, T) own work, ns
    present: np.ndarray           # (W,) bool: rank summarized
    slot_info: list[tuple]        # per slot ("c"|"p", kind, members | (sender, receiver), comm_id)
    X: np.ndarray                 # (S, T) transfer time per slot and iteration
    NB: np.ndarray                # (S,) bytes
    CNT: np.ndarray               # (S,) instances
    program: Program | None
    inst_slot: np.ndarray         # per instance, its slot
    inst_type: np.ndarray         # per instance, its operator type (index into type_x)
    type_x: np.ndarray            # per operator type, the median transfer time of its instances
    inst_it: np.ndarray           # per instance, its window iteration
    row_rank: np.ndarray          # per program row, its rank
    row_it: np.ndarray            # per program row, its window iteration


def fold(summary: PersistentSummary, communicators: Mapping[str, Any], *, program: bool = True,
         consume: bool = False, thresholds: Thresholds | None = None) -> Folded:
    """Fold a merged summary into the persistent analysis's tables (ranks in ascending order);
    ``consume``: empty ``summary.per_rank`` on the way (halves the peak memory); ``thresholds``:
    whose ``slot_bins_per_octave`` and ``dense_lookup_max`` apply (default the shipped ones)."""
    th = thresholds or load_thresholds()
    W, win = summary.world_size, summary.window
    T = len(win)
    ranks = summary.ranks
    comm_ids = sorted({c for r in ranks for c in summary.per_rank[r].comms})
    code = {c: i for i, c in enumerate(comm_ids)}
    gkeys = []
    for r in ranks:
        s = summary.per_rank[r]
        lut = np.array([code[c] for c in s.comms], np.int64)
        gkeys.append((lut[s.keys >> 2 * _RBITS] << 2 * _RBITS) | (s.keys & ((1 << 2 * _RBITS) - 1)))
    slot_keys = np.unique(np.concatenate(gkeys)) if gkeys else np.zeros(0, np.int64)
    lens = np.zeros(W, np.int64)
    for r in ranks:
        lens[r] = len(summary.per_rank[r].ops["seq"])
    rank_ptr = np.r_[0, np.cumsum(lens)].astype(np.int64)
    n = int(rank_ptr[-1])
    cols = {k: np.empty(n, dt) for k, dt in FIELDS.items()}
    compute = np.zeros((W, T))
    iter_ptr = np.zeros((W, T + 1), np.int64)
    for r, gk in zip(ranks, gkeys):
        s = summary.per_rank.pop(r) if consume else summary.per_rank[r]
        a, b = rank_ptr[r], rank_ptr[r + 1]
        for k in FIELDS:
            cols[k][a:b] = s.ops[k]
        cols["slot"][a:b] = np.searchsorted(slot_keys, gk)[s.ops["slot"]]
        compute[r] = s.compute
        iter_ptr[r] = s.iter_ptr + a
    for r in range(W):
        if lens[r] == 0:
            iter_ptr[r] = rank_ptr[r]
    S = len(slot_keys)
    row_rank = np.repeat(np.arange(W, dtype=np.int32), lens)
    smin = np.full(S, _BIG, np.int64)
    smax = np.full(S, -1, np.int64)
    _seq_range(cols["slot"], cols["seq"], smin, smax)
    size = np.where(smax >= 0, smax - smin + 1, 0)
    base = np.r_[0, np.cumsum(size)].astype(np.int64)
    inst = base[cols["slot"]] + cols["seq"] - smin[cols["slot"]]
    n_inst = int(base[-1])
    cnt = np.zeros(n_inst, np.int64)
    d1 = np.full(n_inst, _BIG, np.int64)
    d2 = np.full(n_inst, _BIG, np.int64)
    r1 = np.full(n_inst, -1, np.int64)
    g1 = np.zeros(n_inst, np.int64)
    it1 = np.full(n_inst, -1, np.int64)
    nb = np.zeros(n_inst, np.int64)
    inst_op = np.zeros(n_inst, np.int8)
    inst_op[inst] = cols["opk"]
    for k in ("slot", "seq", "opk"):
        del cols[k]
    _fold(inst, row_rank, cols["dur"], cols["own"], cols["widx"], cols["nbytes"], cnt, d1, d2, r1, g1, it1, nb)
    for k in ("dur", "own", "nbytes"):  # the replays need none of these: free them before
        del cols[k]
    inst_slot = np.repeat(np.arange(S, dtype=np.int64), size)
    # waiting caused: the last member of each instance, (n - 1) x its own work up to the others' wait
    ok = (cnt >= 2) & (d2 < _BIG) & (r1 >= 0) & (it1 >= 0)
    own = np.minimum(d2[ok] - d1[ok], g1[ok]).clip(0).astype(np.float64)
    caused = np.bincount(r1[ok] * T + it1[ok], weights=(cnt[ok] - 1) * own, minlength=W * T).reshape(W, T)
    # transfer time per slot and iteration: the instances' shortest copies (of instances every member
    # logged: with a member's log missing, the shortest copy may be a wait)
    info = [_slot_info(int(k), comm_ids, communicators) for k in slot_keys.tolist()]
    expected = np.array([len(i[2]) for i in info], np.int64)
    has = cnt > 0
    full = has & (cnt >= expected[inst_slot])
    x = np.where(has & (d1 < _BIG), d1, 0).astype(np.float64)
    inst_it = np.where(it1 >= 0, it1, 0)
    X = np.bincount(inst_slot[full] * T + inst_it[full], weights=x[full], minlength=S * T).reshape(S, T) \
        if T else np.zeros((S, 0))
    inst_type, type_x = operator_types(info, communicators, inst_slot, inst_op, nb, x, full, has,
                                       bins_per_octave=th.slot_bins_per_octave, dense_max=th.dense_lookup_max)
    del inst_op
    NB = np.bincount(inst_slot[has], weights=nb[has].astype(np.float64), minlength=S)
    CNT = np.bincount(inst_slot[has], minlength=S).astype(np.float64)
    prog = None
    if program:
        prog = Program(rank_ptr, iter_ptr, inst, cols["gap"], cols["new_batch"], x, cnt)
    present = lens > 0
    log.info("persistent: %d ranks folded, %d operators, %d instances, %d slots", len(ranks), n, n_inst, S)
    return Folded(win, caused, compute, present, info, X, NB, CNT, prog, inst_slot, inst_type, type_x, inst_it,
                  row_rank,
                  cols["widx"])


def operator_types(info: list[tuple], communicators: Mapping[str, Any], inst_slot: np.ndarray, inst_op: np.ndarray,
                   nb: np.ndarray, x: np.ndarray, full: np.ndarray, has: np.ndarray, *,
                   bins_per_octave: int | None = None, dense_max: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per instance its *operator type*, and per type the median transfer time of its instances.

    Two instances are of one type when they are the same operator (``inst_op``, an index into
    :data:`~holmes.localize.persistent.rank.OP_KINDS`) with the same message size (to
    ``1 / bins_per_octave`` of a factor of two, threshold ``slot_bins_per_octave``) on communicators of the same kind and size -- or, for P2P, of the same kind and
    direction along the communicator's rank order (a pipeline's forward or backward sends): WIA's
    operator types (``grads-reduce-scatter``, ``forward-send``, ...) on communication logs. The
    median is over the instances every member logged (``full``; else over those any member logged).

    >>> info = [("c", "dp", (0, 1), "dp0"), ("c", "dp", (2, 3), "dp1"), ("p", "pp", (0, 2), "pp0")]
    >>> t, m = operator_types(info, {"pp0": ("pp", [0, 2])}, np.array([0, 0, 1, 2]), np.array([1, 2, 1, 7]),
    ...                       np.zeros(4, np.int64), np.array([4.0, 9.0, 6.0, 1.0]), np.ones(4, bool),
    ...                       np.ones(4, bool))
    >>> t.tolist(), m[t].tolist()           # the two all-gathers (op 1) share a type and a median
    ([0, 1, 0, 2], [5.0, 9.0, 5.0, 1.0])
    """
    skey: dict[tuple, int] = {}
    scode = np.zeros(len(info), np.int64)
    for s, i in enumerate(info):
        if i[0] == "p":
            c = communicators.get(i[-1])   # the slot's comm_id
            ranks = [int(r) for r in (c.ranks if hasattr(c, "ranks") else c[1])] if c is not None else []
            snd, rcv = i[2]
            d = int(np.sign(ranks.index(rcv) - ranks.index(snd))) if snd in ranks and rcv in ranks else 0
            k: tuple = ("p", i[1], d)
        else:
            k = ("c", i[1], len(i[2]))
        scode[s] = skey.setdefault(k, len(skey))
    key = scode[inst_slot]
    bins = or_shipped(bins_per_octave, "slot_bins_per_octave")
    key <<= _BYTE_BITS
    key += inst_op
    key <<= _BYTE_BITS
    if nb.any():
        key += np.clip(np.round(np.log2(nb.astype(np.float64) + 1.0) * bins), 0, _BYTE_MAX).astype(np.int64)
    span = (len(skey) or 1) << (2 * _BYTE_BITS)
    if span <= or_shipped(dense_max, "dense_lookup_max"):  # few slot kinds (always, in practice): dense, no sort
        seen = np.zeros(span, np.bool_)
        seen[key] = True
        lut = np.cumsum(seen) - 1
        typ = lut.astype(np.int16 if lut[-1] <= np.iinfo(np.int16).max else np.int32)[key]
    else:
        typ = np.unique(key, return_inverse=True)[1].astype(np.int32).ravel()
    del key
    n = int(typ.max()) + 1 if len(typ) else 0
    med = _group_median(typ[full] if not full.all() else typ, x[full] if not full.all() else x, n)
    lack = np.isnan(med)
    if lack.any():  # types none of whose instances every member logged: over those any member logged
        m = has & lack[typ]
        med[lack] = _group_median(typ[m], x[m], n)[lack]
    return typ, np.nan_to_num(med)


def _group_median(g: np.ndarray, v: np.ndarray, n: int) -> np.ndarray:
    """Per group ``0..n-1`` the median of its values (NaN for an empty group).

    >>> _group_median(np.array([1, 0, 1, 1]), np.array([5.0, 2.0, 1.0, 3.0]), 3).tolist()
    [2.0, 3.0, nan]
    """
    out = np.full(n, np.nan)
    if not len(g):
        return out
    o = np.argsort(g, kind="stable")  # a radix sort when g is int16
    vs = v[o]
    bounds = np.r_[0, np.cumsum(np.bincount(g, minlength=n))]
    for t in np.flatnonzero(np.diff(bounds)).tolist():
        out[t] = np.median(vs[bounds[t]:bounds[t + 1]])
    return out


def _slot_info(k: int, comm_ids: list[str], communicators: Mapping[str, Any]) -> tuple:
    cid = comm_ids[k >> 2 * _RBITS]
    snd, rcv = ((k >> _RBITS) & _MASK) - 1, (k & _MASK) - 1
    c = communicators.get(cid)
    kind = getattr(c, "kind", "other") if c is not None else "other"
    if snd < 0:
        members = tuple(int(r) for r in c.ranks) if c is not None else ()
        return ("c", kind, members, cid)
    return ("p", kind, (snd, rcv), cid)


@njit(cache=True, nogil=True)
def _seq_range(slot, seq, smin, smax):  # pragma: no cover - compiled
    for j in range(len(slot)):
        s = slot[j]
        if seq[j] < smin[s]:
            smin[s] = seq[j]
        if seq[j] > smax[s]:
            smax[s] = seq[j]


@njit(cache=True, nogil=True)
def _fold(inst, rank, dur, own, widx, nbytes, cnt, d1, d2, r1, g1, it1, nb):  # pragma: no cover - compiled
    # rows in ascending rank order: on equal durations the lower rank stays the shortest copy
    for j in range(len(inst)):
        i = inst[j]
        cnt[i] += 1
        d = dur[j]
        if d < d1[i]:
            d2[i] = d1[i]
            d1[i] = d
            r1[i] = rank[j]
            g1[i] = own[j]
        elif d < d2[i]:
            d2[i] = d
        if it1[i] < 0:
            it1[i] = widx[j]
        if nbytes[j] > nb[i]:
            nb[i] = nbytes[j]
