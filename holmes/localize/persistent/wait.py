"""Who made whom wait: the merged per-rank summaries folded into per-instance and per-rank tables.

From a :class:`~holmes.localize.persistent.rank.PersistentSummary` (every rank's operators in the
window) :func:`fold` builds, visiting ranks in ascending order (so the result does not depend on how
the summaries were merged):

* per operator *instance* (a slot -- communicator, or P2P communicator + sender + receiver -- and a
  ``seq``): its member count, its shortest copy (its duration, its rank, that rank's own work
  before it, its iteration) and its second-shortest duration. The member that entered last waited
  for no one: its copy lasted least; the others waited about ``second - shortest`` each (a P2P pair
  of one host whose send outlived its transfer is read by its ends instead: :func:`p2p_copies`);
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
>>> from holmes.localize.persistent.partials import fold
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
from holmes.calibration.thresholds import Thresholds, or_shipped
from holmes.localize.evidence.p2p import late_sender_transfer
from holmes.localize.persistent.peers import kind_and_ranks
from holmes.localize.persistent.rank import _RBITS, PersistentSummary
from holmes.localize.persistent.whatif import Program

__all__ = ["Folded", "operator_types", "p2p_copies"]

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
    replay_its: np.ndarray | None = None  # the program's iterations the replays run on (None: all)
    gap_sum: np.ndarray | None = None     # (W, T) the gaps' sums over all rows, where the program holds only some


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
    typ, n = dense_types(type_keys(slot_type_codes(info, communicators)[inst_slot], inst_op, nb,
                                   bins_per_octave=bins_per_octave), dense_max)
    med = _group_median(typ[full] if not full.all() else typ, x[full] if not full.all() else x, n)
    lack = np.isnan(med)
    if lack.any():  # types none of whose instances every member logged: over those any member logged
        m = has & lack[typ]
        med[lack] = _group_median(typ[m], x[m], n)[lack]
    return typ, np.nan_to_num(med)


def slot_type_codes(info: list[tuple], communicators: Mapping[str, Any]) -> np.ndarray:
    """Per slot, the code of its kind for :func:`operator_types`: collectives by communicator kind and
    size, P2P by kind and direction along the communicator's rank order."""
    skey: dict[tuple, int] = {}
    scode = np.zeros(len(info), np.int64)
    for s, i in enumerate(info):
        if i[0] == "p":
            c = communicators.get(i[-1])   # the slot's comm_id
            ranks = [int(r) for r in kind_and_ranks(c)[1]] if c is not None else []
            snd, rcv = i[2]
            d = int(np.sign(ranks.index(rcv) - ranks.index(snd))) if snd in ranks and rcv in ranks else 0
            k: tuple = ("p", i[1], d)
        else:
            k = ("c", i[1], len(i[2]))
        scode[s] = skey.setdefault(k, len(skey))
    return scode


def type_keys(scode: np.ndarray, inst_op: np.ndarray, nb: np.ndarray, *, bins_per_octave: int | None = None
              ) -> np.ndarray:
    """Per instance its operator-type key: its slot's kind code (``scode``, per instance), its operator
    and its size class (``1 / bins_per_octave`` of a factor of two)."""
    bins = or_shipped(bins_per_octave, "slot_bins_per_octave")
    key = np.asarray(scode, np.int64) << _BYTE_BITS
    key += inst_op
    key <<= _BYTE_BITS
    if nb.any():
        key += np.clip(np.round(np.log2(nb.astype(np.float64) + 1.0) * bins), 0, _BYTE_MAX).astype(np.int64)
    return key


def dense_types(key: np.ndarray, dense_max: int | None = None) -> tuple[np.ndarray, int]:
    """The type keys numbered densely in their order (and how many there are)."""
    span = int(key.max()) + 1 if len(key) else 1
    if span <= or_shipped(dense_max, "dense_lookup_max"):  # few slot kinds (always, in practice): dense, no sort
        seen = np.zeros(span, np.bool_)
        seen[key] = True
        lut = np.cumsum(seen) - 1
        typ = lut.astype(np.int16 if lut[-1] <= np.iinfo(np.int16).max else np.int32)[key]
    else:
        typ = np.unique(key, return_inverse=True)[1].astype(np.int32).ravel()
    return typ, int(typ.max()) + 1 if len(typ) else 0


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


def p2p_copies(d1: np.ndarray, d2: np.ndarray, r1: np.ndarray, g1: np.ndarray, sender: np.ndarray,
               ss: np.ndarray, gs: np.ndarray, rs: np.ndarray, re: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per instance its transfer, the member that entered last, how long the others waited for it
    and that member's own work before it.

    A collective's copies say it by their durations alone (clock-free): the shortest copy's
    member entered last, the others waited ``second - shortest`` (``d1``, ``r1``, ``d2 - d1``,
    ``g1``). So does a P2P pair's, unless the send's operator outlived its transfer -- gloo completes
    an ``isend`` only when the schedule waits on it, at the end of a pipeline step -- and the
    receive, which waited for a late sender, is the shorter copy. Where the send began while its
    receive was open (``sender`` >= 0; the send's start ``ss`` and own work ``gs``, the receive's
    start ``rs`` and end ``re``, :data:`_BIG` where absent) and the receive is the shortest copy, the
    sender is the member that entered last, the receiver waited ``ss - rs``, and the transfer is the
    receive's end minus the send's start where shorter
    (:func:`~holmes.localize.evidence.p2p.late_sender_transfer`). Two clocks are read only there:
    every other pair keeps its durations' reading, whatever the clocks' offset.

    >>> B = _BIG
    >>> x, last, wait, own = p2p_copies(
    ...     np.array([60, 5]), np.array([190, 9]), np.array([1, 0]), np.array([3, 2]), np.array([0, -1]),
    ...     np.array([96, B]), np.array([40, 0]), np.array([40, B]), np.array([100, B]))
    >>> x.tolist(), last.tolist(), wait.tolist(), own.tolist()   # a late sender; a collective as it was
    ([4, 5], [0, 0], [56, 4], [40, 2])
    """
    wait = d2 - d1
    swap = np.flatnonzero((sender >= 0) & (r1 != sender) & (ss < _BIG) & (rs <= ss) & (ss <= re))
    if not len(swap):
        return d1, r1, wait, g1
    x, last, own = d1.copy(), r1.copy(), g1.copy()
    x[swap] = late_sender_transfer(d1[swap], ss[swap], rs[swap], re[swap])
    last[swap], own[swap], wait[swap] = sender[swap], gs[swap], ss[swap] - rs[swap]
    return x, last, wait, own


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
def _fold(inst, rank, dur, own, widx, nbytes, start, sender, cnt, d1, d2, r1, g1, it1, nb, ss, gs, rs, re
          ):  # pragma: no cover - compiled
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
        if sender[j] >= 0:  # a P2P copy: the send's start and own work, the receive's start and end
            if rank[j] == sender[j]:
                if start[j] < ss[i]:
                    ss[i] = start[j]
                    gs[i] = own[j]
            elif start[j] < rs[i]:
                rs[i] = start[j]
                re[i] = start[j] + d
