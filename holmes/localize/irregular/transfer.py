"""How long the transfers themselves took: the network's share of an irregular iteration.

Every member of a collective (both ends of a P2P transfer) leaves the operator at about the same
time, so the member that entered *last* has the shortest duration, and that duration is the
transfer itself with no waiting in it, measured on that member's own clock (no clock skew
involved) -- except for an asynchronous send whose completion the logger saw late (gloo
completes an ``isend`` only in ``wait()``): a P2P transfer whose sender entered last ends when the
receive did (:func:`_p2p_transfer`). Summed per *channel* -- one communicator's collectives, or
one direction of one P2P pair -- and iteration, and compared with the channel's usual iteration,
it says which channel really moved slower:

* a slow device (a NIC, a cable, a switch, an NVSwitch) stretches the transfers of the channels
  that cross it, and of those only;
* a late rank (a compute straggler) makes the others wait but leaves the transfer untouched;
* a job-wide disturbance (a loaded machine, a noisy neighbour on every link) stretches the
  transfers of unrelated channels together: no single device explains it.

A channel is judged only when every copy of its operators was read (the whole communicator, both
ends of the pair): on a job read whole that is every channel, on a large job those the search
read.

Examples
--------
>>> from holmes.localize.irregular.transfer import pick_channels
>>> excess = {("pp", 1, 5): 40e6, ("tp", 0, 2): 2e6, ("dp", 1, 3): 20e6}
>>> sigma = {k: 1e6 for k in excess}
>>> ranks = {("pp", 1, 5): (1, 5), ("tp", 0, 2): (0, 2), ("dp", 1, 3): (1, 3)}
>>> pick_channels(excess, sigma, ranks, iteration_excess=60e6)
('network', [('pp', 1, 5), ('dp', 1, 3)])
>>> excess[("tp", 0, 2)] = 30e6
>>> pick_channels(excess, sigma, ranks, iteration_excess=60e6)
('common', [('pp', 1, 5), ('tp', 0, 2)])
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

import numpy as np

from holmes.calibration.thresholds import or_shipped
from holmes.cog.graph import SEND
from holmes.localize.evidence.p2p import late_sender_transfer
from holmes.stats import HEALTHY_SPREAD_QS, NORMAL_Q25_Q05, nan_quiet

__all__ = ["TransferTimes", "pick_channels"]


class TransferTimes:
    """Per channel and iteration, the transfer time of every fully read operator.

    Parameters
    ----------
    ranks : mapping of int to RankOps
        The ranks read (:attr:`holmes.cog.CommOpGraph.ranks`).
    members : sequence
        Per communicator code, its member ranks (:attr:`holmes.cog.CommOpGraph.members`).

    Attributes
    ----------
    channels : list of tuple
        ``(comm, src, dst)``: a communicator's collectives (``src = dst = -1``) or one direction
        of a P2P pair.
    """

    def __init__(self, ranks: Mapping[int, Any], members: Any) -> None:
        cols: dict[str, list[np.ndarray]] = {k: [] for k in ("comm", "src", "dst", "seq", "it", "dur", "rank", "row",
                                                             "start", "end")}
        for r, ro in ranks.items():
            n = len(ro)
            if n == 0:
                continue
            p2p = ro.op >= SEND
            send = ro.op == SEND
            cols["comm"].append(ro.comm.astype(np.int64))
            cols["src"].append(np.where(p2p, np.where(send, r, ro.peer), -1).astype(np.int64))
            cols["dst"].append(np.where(p2p, np.where(send, ro.peer, r), -1).astype(np.int64))
            cols["seq"].append(ro.seq.astype(np.int64))
            cols["it"].append(ro.iteration.astype(np.int64))
            cols["dur"].append(ro.duration.astype(np.int64))
            cols["rank"].append(np.full(n, r, np.int64))
            cols["row"].append(np.arange(n, dtype=np.int64))
            cols["start"].append(ro.start.astype(np.int64))
            cols["end"].append(ro.end.astype(np.int64))
        self.channels: list[tuple[int, int, int]] = []
        self._ranks: list[tuple[int, ...]] = []
        self._cube: tuple[float, np.ndarray, np.ndarray] | None = None
        if not cols["comm"]:
            self._t = np.zeros((0, 0))
            self._its = np.zeros(0, np.int64)
            return
        a = {k: np.concatenate(v) for k, v in cols.items()}
        order = np.lexsort((a["dur"], a["seq"], a["dst"], a["src"], a["comm"]))
        a = {k: v[order] for k, v in a.items()}
        key_change = np.r_[True, (np.diff(a["comm"]) != 0) | (np.diff(a["src"]) != 0) | (np.diff(a["dst"]) != 0)
                           | (np.diff(a["seq"]) != 0)]
        starts = np.flatnonzero(key_change)
        counts = np.diff(np.r_[starts, len(order)])
        # one op instance per key: its shortest copy (sorted first) is the transfer
        comm, src, dst = a["comm"][starts], a["src"][starts], a["dst"][starts]
        need = np.where(src >= 0, 2, np.array([len(members[int(c)]) if 0 <= c < len(members) else 0 for c in comm]))
        full = (counts == need) & (need > 0)
        if not full.any():  # no operator with every copy read
            self._t = np.zeros((0, 0))
            self._its = np.zeros(0, np.int64)
            return
        dur = _p2p_transfer(a, starts, counts, a["dur"][starts].copy())
        comm, src, dst, it = comm[full], src[full], dst[full], a["it"][starts][full]
        dur, rank, row = dur[full], a["rank"][starts][full], a["row"][starts][full]
        chan_keys, chan = np.unique(np.stack([comm, src, dst], axis=1), axis=0, return_inverse=True)
        chan = chan.reshape(-1)
        self._its, itpos = np.unique(it, return_inverse=True)
        itpos = itpos.reshape(-1)
        t = np.zeros((len(chan_keys), len(self._its)))
        np.add.at(t, (chan, itpos), dur.astype(float))
        seen = np.zeros_like(t, dtype=bool)
        seen[chan, itpos] = True
        t[~seen] = np.nan
        self._t = t
        # kept for the per-operator views (:meth:`ratio_table`, :meth:`op_times`), built only when asked
        self._ops = (chan, itpos, a["seq"][starts][full], dur)
        # per channel: iterations seen, and its usual level (q25) and healthy spread over them
        self._n = seen.sum(axis=1)
        with np.errstate(all="ignore"):
            q05, q25 = (np.nanquantile(t, HEALTHY_SPREAD_QS, axis=1) if t.size
                        else np.zeros((2, len(chan_keys))))
        self._usual, self._spread = q25, (q25 - q05) / NORMAL_Q25_Q05
        self.channels = [tuple(int(x) for x in k) for k in chan_keys]
        self._ranks = [(int(s), int(d)) if s >= 0 else tuple(int(m) for m in members[int(c)])
                       for c, s, d in self.channels]
        # where each channel's largest transfer of each iteration was read: (rank, row)
        self._where: dict[tuple[int, int], tuple[int, int]] = {}
        best = np.lexsort((-dur, itpos, chan))
        first = np.r_[True, (np.diff(chan[best]) != 0) | (np.diff(itpos[best]) != 0)]
        for b in best[first]:
            self._where[(int(chan[b]), int(itpos[b]))] = (int(rank[b]), int(row[b]))

    def _op_cube(self, usual_q: float) -> tuple[np.ndarray, np.ndarray]:
        """``(cube, usual)``: per channel, iteration (of :attr:`_its`) and operator position (the
        ``k``-th operator of the channel in an iteration) its transfer (NaN where absent), and per
        channel and position the ``usual_q`` quantile of it over the iterations."""
        if self._cube is None or self._cube[0] != usual_q:
            chan, itpos, seq, dur = self._ops
            order = np.lexsort((seq, itpos, chan))
            c, i, d = chan[order], itpos[order], dur[order].astype(float)
            start = np.r_[True, (np.diff(c) != 0) | (np.diff(i) != 0)]
            grp = np.cumsum(start) - 1
            first = np.flatnonzero(start)
            k = np.arange(c.size) - first[grp]
            cube = np.full((len(self.channels), self._its.size, int(k.max()) + 1), np.nan)
            cube[c, i, k] = d
            with nan_quiet():  # positions absent in every iteration: NaN
                usual = np.nanquantile(cube, usual_q, axis=1, keepdims=True)
            self._cube = (usual_q, cube, usual)
        return self._cube[1], self._cube[2]

    def ratio_table(self, iterations: np.ndarray, usual_q: float | None = None) -> np.ndarray:
        """``(channels, len(iterations))``: per channel and iteration, the median over its
        operators of each one's transfer over its usual transfer (the ``usual_q`` quantile of
        that operator position -- the ``k``-th operator of the channel in an iteration -- over
        the iterations), minus one.

        Where :meth:`table` sums an iteration's transfers, this asks whether the channel's
        operators were slower *as a rule* in that iteration: a slow device stretches every
        transfer crossing it, while a one-off stall of one operator (the operating system, a
        retransmission) moves the sum as much but not the median.
        """
        its = np.asarray(iterations, dtype=np.int64)
        out = np.full((len(self.channels), its.size), np.nan)
        if not self._its.size or not its.size:
            return out
        cube, usual = self._op_cube(or_shipped(usual_q, "cell_usual_q"))
        with np.errstate(all="ignore"):
            ratio = np.nanmedian(cube / np.where(usual > 0, usual, np.nan), axis=2) - 1.0
        pos = np.minimum(np.searchsorted(self._its, its), self._its.size - 1)
        ok = self._its[pos] == its
        out[:, ok] = ratio[:, pos[ok]]
        return out

    def op_times(self, channels: Any, iteration: int, usual_q: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(excess, usual)`` of each operator of ``channels`` in ``iteration`` (ns, one entry per
        operator): how much longer than usual it took (may be negative) and its usual transfer
        (its position's ``usual_q`` quantile over the iterations): whether a cell's excess is one
        operator's stall or all of them slower.

        >>> TransferTimes({}, []).op_times([0], 3)[0].size
        0
        """
        i = int(np.searchsorted(self._its, iteration)) if self._its.size else 0
        rows = [int(c) for c in channels]
        if not rows or not self._its.size or i >= self._its.size or self._its[i] != iteration:
            return np.zeros(0), np.zeros(0)
        cube, usual = self._op_cube(or_shipped(usual_q, "cell_usual_q"))
        x, u = cube[rows, i, :], usual[rows, 0, :]
        ok = np.isfinite(x) & np.isfinite(u)
        return (x - u)[ok], u[ok]

    def ranks_of(self, channel: int) -> tuple[int, ...]:
        """The ranks a channel (its index in :attr:`channels`) connects."""
        return self._ranks[channel]

    def table(self, iterations: np.ndarray) -> np.ndarray:
        """``(channels, len(iterations))`` transfer times (ns; NaN where not every copy was read)."""
        its = np.asarray(iterations, dtype=np.int64)
        out = np.full((len(self.channels), its.size), np.nan)
        if not self._its.size or not its.size:
            return out
        pos = np.minimum(np.searchsorted(self._its, its), self._its.size - 1)
        ok = self._its[pos] == its
        out[:, ok] = self._t[:, pos[ok]]
        return out

    def excess(self, iteration: int, min_iterations: int | None = None) -> tuple[dict[int, float], dict[int, float]]:
        """Per channel with at least ``min_iterations``: how much longer than usual (its first
        quartile) its transfers took in ``iteration``, and its healthy spread ``(q25 - q05) /
        0.97``. ``min_iterations``: threshold ``channel_min_iterations``."""
        min_iterations = or_shipped(min_iterations, "channel_min_iterations")
        i = int(np.searchsorted(self._its, iteration))
        if i >= self._its.size or self._its[i] != iteration:
            return {}, {}
        ex: dict[int, float] = {}
        sig: dict[int, float] = {}
        for c in np.flatnonzero((self._n >= min_iterations) & ~np.isnan(self._t[:, i])).tolist():
            ex[c] = float(self._t[c, i] - self._usual[c])
            sig[c] = float(self._spread[c])
        return ex, sig

    def where(self, channel: int, iteration: int) -> tuple[int, int] | None:
        """``(rank, row)`` of the channel's longest transfer in ``iteration``."""
        i = int(np.searchsorted(self._its, iteration))
        if i >= self._its.size or self._its[i] != iteration:
            return None
        return self._where.get((channel, i))


def _p2p_transfer(a: Mapping[str, np.ndarray], starts: np.ndarray, counts: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Per op instance (its copies from ``starts``, sorted shortest first), the transfer: its
    shortest copy ``dur``, or for a P2P pair whose sender entered last the receive's end minus the
    send's start (:func:`~holmes.localize.evidence.p2p.late_sender_transfer`: gloo completes an
    ``isend`` only in ``wait()``, long after the receiver got the data)."""
    two = np.flatnonzero((counts == 2) & (a["src"][starts] >= 0))
    if not two.size:
        return dur
    i0, i1 = starts[two], starts[two] + 1
    first_sends = a["rank"][i0] == a["src"][i0]
    s_i = np.where(first_sends, i0, i1)
    r_i = np.where(first_sends, i1, i0)
    dur[two] = late_sender_transfer(dur[two], a["start"][s_i], a["start"][r_i], a["end"][r_i])
    return dur


def pick_channels(excess: Mapping[Hashable, float], sigma: Mapping[Hashable, float],
                  ranks: Mapping[Hashable, tuple[int, ...]], iteration_excess: float, *, share: float | None = None,
                  noise_z: float | None = None, dominance: float | None = None) -> tuple[str | None, list[Hashable]]:
    """The slow channels of one iteration.

    A channel is slow when its transfer excess is at least ``share`` of the iteration's excess
    and ``noise_z`` of its own spread. The slowest one and the slow channels sharing a rank with
    it are the network's answer (``"network"``) unless an unrelated slow channel comes within
    ``dominance`` of it (``"common"``: unrelated channels slowed together). Defaults: the
    thresholds ``channel_share``, ``channel_z``, ``channel_dominance``.

    Returns
    -------
    kind : {"network", "common", None}
    channels : list
        The slow channels, slowest first.
    """
    share = or_shipped(share, "channel_share")
    noise_z = or_shipped(noise_z, "channel_z")
    dominance = or_shipped(dominance, "channel_dominance")
    slow = sorted((k for k, x in excess.items()
                   if x >= share * iteration_excess and x >= noise_z * sigma.get(k, 0.0)),
                  key=lambda k: -excess[k])
    if not slow or iteration_excess <= 0:
        return None, []
    top = slow[0]
    near = set(ranks[top])
    related = [top] + [k for k in slow[1:] if near & set(ranks[k])]
    rival = next((k for k in slow[1:] if k not in related), None)
    if rival is not None and dominance * excess[rival] >= excess[top]:
        return "common", [top, rival]
    return "network", related
