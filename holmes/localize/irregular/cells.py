"""Which device stood out of the job's own noise, iteration by iteration, on a job read whole.

When every rank's log is read (a small job, ``full_read``), Holmes need not follow waits from a
pivot: each device's own time can be measured in every iteration and compared with the job's own
noise. Two matrices hold it:

* **compute** ``C[rank, iteration]``: the sum of the rank's gaps between operators (its own
  work, on its own clock; waiting happens *inside* operators and is not in it);
* **transfer** ``T[channel, iteration]``: per channel (a communicator's collectives, or one
  direction of a P2P pair) the summed duration of the copies of its operators that entered last
  (:class:`~holmes.localize.irregular.transfer.TransferTimes`): the transfer itself, no waiting in it.

Each cell becomes a z-score against the job's noise: minus the row's median (the device's usual
level), minus what every device of the other hosts did in the same iteration (common mode: a
loaded machine slows everyone), over a robust spread (the median absolute deviation, pooled over
the ranks for compute, per channel for transfers, which differ in size). A fault stands out as a
few cells far beyond the rest: a slow GPU is one rank's compute cell, a slow host its ranks'
cells together, a slow NIC the transfer cells of the channels crossing it, a slow P2P direction
its channel's cell.

How far is "far" is measured against the job itself, not a fixed sigma: the cells' upper tail is
modelled as exponential, fitted between their 90th and 99th percentiles (where a few fault cells
weigh nothing), and an event's *family-wise* p-value is the chance that any of the job's cells
would reach its z under that tail. A healthy job's strongest cell has a family-wise p-value near
one half by construction; a 1.3x slower GPU's cell is many tail-lengths beyond it.

A GPU whose work grew evenly (every gap of the iteration, not one operator's) is judged against
the cells that are no one-off stall (:meth:`CellEvidence.even_pvalues`): stalls are never
evidence, yet on a loaded machine they make most of the tail. Those cells are few on a small job,
so their tail is the predictive one (its scale's own uncertainty), and the result is never weaker
than the ordinary null's.

The tails and their p-values live in :mod:`holmes.localize.irregular.tails`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from holmes.calibration.thresholds import Thresholds, load_thresholds, or_shipped
from holmes.localize.irregular.pauses import split_pauses
from holmes.localize.irregular.tails import familywise, tail_pvalue
from holmes.localize.irregular.transfer import TransferTimes
from holmes.stats import BELOW_ONE, nan_quiet, recurring
from holmes.stats import low_spread as _low_spread
from holmes.stats import pooled_low_spread as _pooled_spread
from holmes.stats import row_spread as _row_spread
from holmes.topology import kinds

__all__ = ["Event", "CellEvidence", "device_pvalues"]

log = logging.getLogger(__name__)


def device_pvalues(events: list["Event"], rows: Mapping[str, int], iterations: int) -> dict[str, float]:
    """Per device, the family-wise p-value of its events taken together.

    A device with ``m`` events is as surprising as its ``m``-th strongest one happening ``m``
    times to one row: ``rows * C(iterations, m) * p_m^m``, ``p_m`` the per-cell p-value of its
    ``m``-th strongest event and ``rows`` how many rows of that kind (ranks, channels) could have
    done so; the smallest over ``m`` (times the number of ``m`` tried). A fluctuating or
    persistent fault repeats: its cells, each unremarkable alone, are not together.

    >>> e = [Event(5, "gpu", (3,), 8.0, 1e-3, 1e7, devices=["gpu:3"]),
    ...      Event(9, "gpu", (3,), 8.0, 2e-3, 1e7, devices=["gpu:3"])]
    >>> p = device_pvalues(e, {"gpu": 16, "host": 16, "network": 40}, 40)
    >>> p["gpu:3"] < 1e-3
    True
    """
    from math import comb, log

    per: dict[str, list[tuple[float, str]]] = {}
    for e in events:
        for d in e.best_devices:
            per.setdefault(d, []).append((e.pvalue, e.kind, e.cell_pvalue))
    out: dict[str, float] = {}
    for d, lst in per.items():
        lst.sort(key=lambda x: (x[0], x[2] if x[2] is not None else x[0]))
        kind = lst[0][1]
        n_rows = max(int(rows.get(kind, 1)), 1)
        n = n_rows * max(iterations, 1)
        best = 1.0
        for m, (fw, _, own) in enumerate(lst, start=1):
            if m > iterations:
                break
            if own is not None:
                cell = own
            else:
                cell = -np.expm1(np.log1p(-min(fw, BELOW_ONE)) / n) if fw > 0 else 0.0
            if cell <= 0:
                best = 0.0
                break
            logp = log(n_rows) + log(comb(iterations, m)) + m * log(cell)
            best = min(best, float(np.exp(min(logp, 0.0))))
        out[d] = min(1.0, best * len(lst))
    return out


@dataclass
class Event:
    """A device that stood out in one iteration.

    Attributes
    ----------
    iteration : int
    kind : {"gpu", "host", "network"}
    ranks : tuple of int
        The straggling rank(s), or the ranks the slow channel(s) connect.
    channels : tuple of int
        The slow channels (indices of :attr:`CellEvidence.channels`), network events only.
    z : float
        The strongest cell's z-score.
    pvalue : float
        Its family-wise p-value (:func:`tail_pvalue`).
    excess_ns : float
        How much longer than usual that cell's compute or transfer was.
    devices : list of str
        The devices it implicates, most specific first.
    cell_pvalue : float, optional
        The strongest cell's own p-value (not family-wise); derived from ``pvalue`` when omitted.
    best : int
        How many of ``devices`` explain the event equally well (a NIC and its cable); the
        others are alternatives with less support. 0: all of them.
    """

    iteration: int
    kind: str
    ranks: tuple[int, ...]
    z: float
    pvalue: float
    excess_ns: float
    channels: tuple[int, ...] = ()
    devices: list[str] = field(default_factory=list)
    cell_pvalue: float | None = None
    best: int = 0

    @property
    def best_devices(self) -> list[str]:
        """The devices that best explain it (the first :attr:`best`; all when 0)."""
        return self.devices[:self.best] if self.best else self.devices


class CellEvidence:
    """Compute and transfer cells of a job read whole, as z-scores against the job's own noise.

    Parameters
    ----------
    ranks : mapping of int to RankOps
        Every rank of the job (:attr:`holmes.cog.CommOpGraph.ranks`).
    members : sequence
        Per communicator code, its member ranks.
    host_of : callable
        Rank -> host index.
    transfers : TransferTimes, optional
        Built from ``ranks`` when omitted.
    usual_q : float, default 0.25
        A row's usual level is this quantile of its iterations.

    Attributes
    ----------
    iterations : ndarray
        The iterations every rank has.
    compute_z, transfer_z : ndarray
        ``(ranks, iterations)`` and ``(channels, iterations)`` z-scores (NaN where unmeasured).
    compute_excess, transfer_excess : ndarray
        The same cells in ns over the usual level (compute: common mode removed).
    """

    def __init__(self, ranks: Mapping[int, Any], members: Any, host_of: Callable[[int], int],
                 transfers: TransferTimes | None = None, *, usual_q: float | None = None,
                 common_q: float | None = None, tail: str = "exponential", per_op: bool = False,
                 thresholds: Thresholds | None = None) -> None:
        th = thresholds or load_thresholds()
        self.t = th
        usual_q = th.cell_usual_q if usual_q is None else usual_q
        common_q = th.cell_common_q if common_q is None else common_q
        #: the keywords of the null cells' tail fit (:func:`~holmes.localize.tails.tail_pvalue`)
        self._fit = {"lo": th.tail_q, "hi": th.tail_body_q, "min_cells": th.tail_min_cells, "min_scale": th.tail_min_scale,
                     "max_shape": th.gpd_max_shape, "min_excesses": th.gpd_min_excesses}
        self.rank_ids = sorted(ranks)
        self._ranks = ranks
        #: events the last :meth:`events` judged one-off stalls of one operator
        self.transients: list[Event] = []
        #: events the last :meth:`events` judged part of a job-wide pause (:mod:`.pauses`)
        self.pauses: list[Event] = []
        #: (iteration, devices) of the slow channels whose only shared devices every channel of
        #: their kind crosses (:meth:`_network_devices`): no device named for them
        self.unexplained: list[tuple[int, tuple[str, ...]]] = []
        self.tail = tail
        self.usual_q = float(usual_q)
        self.common_q = float(common_q)
        self.host_of = host_of
        per = [ranks[r].iteration_compute() for r in self.rank_ids]
        its = _shared_iterations([i for i, _ in per])
        self.iterations = its
        #: ranks holding none of :attr:`iterations` (no operator in the window, or only iterations
        #: their peers lack): their cells are NaN, never compared
        self.absent = [r for r, (i, _) in zip(self.rank_ids, per) if not np.isin(i, its).any()]
        comp = np.full((len(per), its.size), np.nan)
        for k, (i, c) in enumerate(per):
            if not i.size:
                continue
            pos = np.minimum(np.searchsorted(i, its), i.size - 1)
            ok = i[pos] == its
            comp[k, ok] = c[pos[ok]]
        self._hosts = hosts = np.array([host_of(r) for r in self.rank_ids])
        #: host -> its row in :meth:`host_pvalues`
        self._host_index = {int(h): j for j, h in enumerate(np.unique(hosts))}
        base = _usual(comp, self.usual_q)
        raw = comp - base
        # common mode: what most ranks did in the same iteration (a loaded machine slows everyone;
        # a low quantile over the ranks, so a slow host of half the job does not enter it)
        self.compute_excess = raw - _common(raw, self.common_q)
        scale = max(float(np.nanmedian(base)) if base.size else 1.0, 1.0)
        spread = max(_pooled_spread(self.compute_excess), th.cell_min_noise * scale, 1.0)
        #: the job's compute noise (whether its cells can be compared at all): the pooled spread, or
        #: where smaller the median rank's own (:func:`~holmes.stats.row_spread` of its compute
        #: around its usual level), over the median rank's usual compute. With two ranks the common
        #: mode, a quantile between them, takes a quarter of one rank's stall off the other, and
        #: those reflections fill the pooled spread's lower part (a rank stalling 60 ms every 4th
        #: step of a 2-rank pipeline read 1798%); a rank's own lower half does not hold them.
        with nan_quiet():
            own = float(np.nanmedian(_row_spread(raw))) if raw.size else np.nan
        self.noise = min(spread, own) / scale if np.isfinite(own) else spread / scale
        self.compute_z = self.compute_excess / spread
        tt = transfers if transfers is not None else TransferTimes(ranks, members)
        self.transfers = tt
        self._path_cache: list[list[str]] | None = None
        self._crossing: dict[str, list[int]] = {}
        self._everywhere: dict[bool, set[str]] = {}
        self.channels = tt.channels
        t = tt.table(its) if len(self.channels) else np.zeros((0, its.size))
        tbase = _usual(t, self.usual_q) if t.size else np.zeros((t.shape[0], 1))
        tx = t - tbase
        # every channel's cells relative to its own spread (channels differ in size; a spread
        # that a slowdown of most iterations does not inflate); the common mode is what most
        # channels did in the same iteration
        with np.errstate(all="ignore"):
            if per_op and t.size:
                # the median operator's slowdown: a one-off stall of one transfer does not move it
                r = tt.ratio_table(its, self.usual_q)
                tz = r / np.maximum(_row_spread(r), th.cell_min_transfer_spread)[:, None]
            else:
                tz = tx / np.maximum(_row_spread(t)[:, None], np.maximum(th.cell_min_transfer_spread * tbase, 1.0))
            if tz.size:
                tz = tz - np.maximum(_common(tz, th.cell_transfer_common_q), 0.0)
        self.transfer_excess = tx
        self.transfer_z = tz

    def compute_pvalues(self, skip: int = 1, n: int | None = None) -> np.ndarray:
        """Family-wise p-value of every compute cell, each rank's cells judged against the tail
        of the cells of the ranks on *other* hosts (a slow host does not hide itself in its own
        null; on a single host, of the other ranks); the first ``skip`` iterations (warm-up) are
        left out (p = 1). A null whose tail scale rests on fewer than ``tail_predictive_cells``
        cells is read by its predictive tail, as the transfer nulls are: a 2-rank pipeline's
        null is the other stage's 29 cells, its scale the mean of 3, and the last stage's 1-6 ms
        hiccups (it also computes the loss) read p = 1e-5..1e-10 against the first stage's steadier
        cells; it was named in 8 of 18 healthy captures, 1 since."""
        z = self.compute_z[:, skip:]
        return self._judged(z, z, int(np.isfinite(z).sum()) if n is None else n, skip)

    def _judged(self, null: np.ndarray, z: np.ndarray, n: int, skip: int, predictive: bool = False) -> np.ndarray:
        """Family-wise p-values (over ``n`` cells) of the compute cells ``z`` (columns from
        ``skip``), each rank's against the tail of ``null``'s cells of the other hosts (on a single
        host, of the other ranks)."""
        out = np.ones_like(self.compute_z)
        hosts = self._hosts
        few = self.t.tail_predictive_cells
        if np.unique(hosts).size == 1:
            for j in range(len(self.rank_ids)):
                out[j, skip:] = tail_pvalue(np.delete(null, j, axis=0), z[j], n=n, model=self.tail,
                                            predictive=predictive, predictive_below=few, **self._fit)
            return out
        for h in np.unique(hosts):
            mine = hosts == h
            out[mine, skip:] = tail_pvalue(null[~mine], z[mine], n=n, model=self.tail, predictive=predictive,
                                           predictive_below=few, **self._fit)
        return out

    def even_pvalues(self, skip: int = 1) -> np.ndarray:
        """Per compute cell, the p-value (of one cell) of its z against the cells of other hosts
        (single host: other ranks) that are not one-off stalls (beyond ``cell_hot_z`` with a
        :meth:`spread_ratio` under ``cell_transient``): the null of an evenly slower rank. Stalls
        are never evidence, yet on a loaded machine they make most of the tail the cells are
        otherwise judged against.

        Its tail is the exponential's *predictive* one (``predictive`` of
        :func:`~holmes.localize.irregular.tails.tail_pvalue`): the null left is small on a small
        job (4 ranks x 16 steps: about 40 cells, 4 of them fitting the tail's scale), and a scale
        estimated from so few cells makes a one-off 6 ms hiccup 10 sigmas out read as p = 1e-13;
        a healthy FSDP2 capture named its rank at 0.99 so."""
        z = self.compute_z[:, skip:]
        even = z.copy()
        for j, k in zip(*np.nonzero(np.nan_to_num(z, nan=0.0) >= self.t.cell_hot_z)):
            if self._compute_spread(self.rank_ids[j], int(self.iterations[k + skip])) < self.t.cell_transient:
                even[j, k] = np.nan
        return self._judged(even, z, 1, skip, predictive=True)

    def host_pvalues(self, skip: int = 1) -> np.ndarray:
        """Per host and iteration, the p-value (of one cell) of the *smallest* compute z of its
        ranks, the tail fitted to the other hosts' smallest: ranks that stand out together (a
        stage's ranks run the same work at the same moment and share its noise) are judged
        against other groups of ranks doing so, not against single ranks.

        The smallest, not the median: a slower host (its CPU throttled, its GPUs' clocks down)
        stretches the work of every one of its ranks, while the operating system or another
        process on the machine stalls some of them. On the development real runs, an injected
        1.2-1.3x host spike grew each rank of the host by 6-14 sigmas (the slowest-growing at
        0.75 of the fastest); in healthy runs the host events that reached p = 1e-5 under the
        median had a rank at 0.3-3.6 sigmas. Judged by the smallest, a healthy run's strongest
        host went from p = 7e-6 to 8e-5 and the weakest injected host fault from 6e-6 to 4e-8
        (docs/real-runs.md).
        """
        hosts = self._hosts
        uh = np.unique(hosts)
        with nan_quiet():  # an iteration no rank of a host measured: NaN
            low = np.stack([np.nanmin(self.compute_z[hosts == h], axis=0) for h in uh]) if uh.size else \
                np.zeros((0, self.compute_z.shape[1]))
        out = np.ones_like(low)
        if uh.size < 2:
            return out
        z = low[:, skip:]
        for j in range(uh.size):
            null = np.delete(z, j, axis=0)
            out[j, skip:] = tail_pvalue(null, z[j], n=1, model=self.tail, **self._fit)
        return out

    def transfer_pvalues(self, skip: int = 1, n: int | None = None) -> np.ndarray:
        """Family-wise p-value of every transfer cell, each channel's cells judged against the
        tail of the channels of its family (P2P directions, or collectives: a small intra-host
        collective stalls far more often than a pipeline transfer) that share no rank with it (a
        slow NIC slows every channel through its rank: they are not its null). A null whose tail
        scale rests on fewer than ``tail_predictive_cells`` cells (a 4-rank pipeline's P2P channel
        has 2 channels x 15 steps for a null, its scale from 2 cells) is read by its predictive
        tail: one 8.7 ms stall of such a channel read p = 1e-17 and named the host's NVSwitch."""
        z = self.transfer_z[:, skip:]
        out = np.ones_like(self.transfer_z)
        if not z.size:
            return out
        n = int(np.isfinite(z).sum()) if n is None else n
        sets = [set(self.transfers.ranks_of(c)) for c in range(len(self.channels))]
        p2p = np.array([ch[1] >= 0 for ch in self.channels])
        for c, mine in enumerate(sets):
            other = np.array([not (mine & o) for o in sets])
            same = other & (p2p == p2p[c])
            null = z[same] if same.sum() >= 2 else (z[other] if other.sum() >= 2 else np.delete(z, c, axis=0))
            out[c, skip:] = tail_pvalue(null, z[c], n=n, model=self.tail,
                                        predictive_below=self.t.tail_predictive_cells, **self._fit)
        return out

    def events(self, topology: Any, *, min_pvalue: float | None = None, min_cost_ns: float = 0.0,
               ratio: float | None = None, skip: int = 1, irregular: Any = (), transient: float = 0.0) -> list[Event]:
        """The cells beyond the job's noise: per iteration at most one compute event, and one
        network event per group of slow channels sharing a device (no network event in an
        iteration whose compute event cost more).

        Parameters
        ----------
        topology : ClusterTopology
        min_pvalue : float, optional
            A cell's p-value times the rows of its kind must be below it (default the threshold
            ``cell_event_p``).
        min_cost_ns : float, default 0
            The strongest cell's excess (ns) must reach it (a device costing nothing is no
            culprit), except in the ``irregular`` iterations.
        irregular : iterable of int
            Iterations known to be irregular (the pivot's): any significant cell may explain them.
        ratio : float, optional
            Cells beyond the noise within ``ratio`` of the strongest one's z join its event (default
            the threshold ``cell_join_ratio``):
            the other ranks of a slow host, the other channels of a slow NIC (channels sharing a
            rank and a device with it). Slow channels within ``ratio`` of the iteration's
            strongest that the event's devices do not explain make events of their own.
        skip : int, default 1
            Leading iterations left out (warm-up).
        transient : float, default 0
            An event whose :meth:`spread_ratio` is under it is a one-off stall of one operator,
            not a slower device: kept in :attr:`transients`, not returned.
        """
        min_pvalue = self.t.cell_event_p if min_pvalue is None else min_pvalue
        ratio = self.t.cell_join_ratio if ratio is None else ratio
        found: list[tuple[Event, bool]] = []  # every event, and whether it is a one-off stall

        def keep(e: Event, spread: float | None = None) -> None:
            spread = self.spread_ratio(e) if spread is None and transient > 0 else spread
            found.append((e, transient > 0 and spread < transient))

        # per-cell p-values; a cell is significant when it is beyond the noise for its iteration
        # (family-wise over the rows of one iteration): a fault repeated over iterations is
        # judged by its events together (device_pvalues), not each against the whole job
        pc1 = self.compute_pvalues(skip, n=1)
        pt1 = self.transfer_pvalues(skip, n=1)
        n_c = max(int(np.isfinite(self.compute_z[:, skip:]).sum()), 1)
        n_t = max(int(np.isfinite(self.transfer_z[:, skip:]).sum()), 1)
        pc, pt = familywise(pc1, n_c), familywise(pt1, n_t)
        hp1 = self.host_pvalues(skip)
        n_h = max(int(np.isfinite(hp1[:, skip:]).sum()), 1)
        cz, tz = self.compute_z, self.transfer_z
        mc = pc1 * max(len(self.rank_ids), 1) < min_pvalue
        mt = pt1 * max(len(self.channels), 1) < min_pvalue
        irr = {int(i) for i in irregular}
        cache: list[np.ndarray] = []

        def even_p() -> np.ndarray:
            if not cache:
                cache.append(self.even_pvalues(skip))
            return cache[0]

        for k, it in enumerate(self.iterations.tolist()):
            if k < skip:
                continue
            cost = 0.0 if it in irr else min_cost_ns
            sig = np.flatnonzero(mc[:, k])
            if sig.size:
                top = int(sig[np.argmax(cz[sig, k])])
                if self.compute_excess[top, k] >= cost:
                    grew = [j for j in sig if cz[j, k] >= ratio * cz[top, k]]
                    e = self._compute_event(it, [self.rank_ids[j] for j in grew], self.rank_ids[top],
                                            float(cz[top, k]), float(pc[top, k]), float(self.compute_excess[top, k]))
                    if e.kind == "host":  # its own ranks' strongest cell (the top may be another host's)
                        own = max((j for j in grew if self.rank_ids[j] in e.ranks), key=lambda j: cz[j, k])
                        e.z, e.excess_ns = float(cz[own, k]), float(self.compute_excess[own, k])
                    e.cell_pvalue = float(pc1[top, k])
                    spread = self.spread_ratio(e) if transient > 0 else None
                    if e.kind == "host":  # the host's ranks together, against the other hosts'
                        e.cell_pvalue = float(hp1[self._host_index[self.host_of(e.ranks[0])], k])
                        e.pvalue = familywise(e.cell_pvalue, n_h)
                    elif spread is not None and spread >= transient:
                        # an evenly slower GPU, judged against the cells that are no one-off stall
                        # (never weaker than against every cell: the smaller null only sharpens)
                        pe = min(even_p()[top, k], pc1[top, k])
                        e.cell_pvalue, e.pvalue = float(pe), float(familywise(pe, n_c))
                    keep(e, spread)
            sig = np.flatnonzero(mt[:, k]) if pt.size else np.zeros(0, np.int64)
            if not sig.size:
                continue
            # one event per group of slow channels with a device in common: channels through one
            # slow NIC join its event; a slow channel of another place in the same iteration (a
            # rank's intra-host collective beside its slow P2P direction) is an event of its own,
            # when about as strong (cell_join_ratio of the iteration's strongest)
            paths = self._paths(topology)
            floor = ratio * float(np.max(tz[sig, k]))
            left = [int(c) for c in sig if tz[c, k] >= floor]
            while left:
                top = max(left, key=lambda c: tz[c, k])
                near, mine = set(self.transfers.ranks_of(top)), set(paths[top])
                slow = [c for c in left if c == top or (tz[c, k] >= ratio * tz[top, k]
                        and near & set(self.transfers.ranks_of(c)) and mine & set(paths[c]))]
                devices, best = self._network_devices(topology, k, slow)
                if not devices:
                    self.unexplained.append((it, tuple(sorted(set(paths[slow[0]])))))
                    left = [c for c in left if c not in slow]
                    continue
                explained = set(devices[:best] if best else devices)
                left = [c for c in left if c not in slow and not explained & set(paths[c])]
                # what the slow channels together cost the iteration (a NIC slows several at once)
                spent = float(np.nansum(np.maximum(self.transfer_excess[slow, k], 0.0)))
                if spent < cost:
                    continue
                ranks = tuple(sorted(set().union(*(self.transfers.ranks_of(c) for c in slow))))
                keep(Event(it, "network", ranks, float(tz[top, k]), float(pt[top, k]),
                           spent, tuple(slow), devices, float(pt1[top, k]), best))
        return self._settle(found, irr, mc, mt)

    def _settle(self, found: list[tuple[Event, bool]], irregular: set[int], mc: np.ndarray,
                mt: np.ndarray) -> list[Event]:
        """The events that count, from every event and whether it is a one-off stall.

        A one-off stall is one-off only once: the stalls of a device whose compute events (stalls
        or not, one per iteration) recur beyond chance (:func:`~holmes.stats.recurring`, threshold
        ``transient_recur_p``: the same GPU or host standing out in several iterations while the
        job's other places did not) are a fault of that device -- a rank that stalls its forward
        every few steps, an intermittent kernel -- and count where they made the pivot's iteration
        irregular (``irregular``: a stall the job did not feel names no culprit). Events of a
        job-wide pause (:func:`~.pauses.job_wide` over the significant cells ``mc``, ``mt``) go to
        :attr:`pauses`. Then, in an iteration whose compute event cost at least its network event,
        the network event goes (the transfers waited on the rank, or it on them)."""
        alpha = self.t.transient_recur_p
        comp = [e for e, _ in found if e.kind in ("gpu", "host")]  # one per iteration at most
        again: set[object] = set()
        if alpha > 0 and any(t for _, t in found):
            for kind, slots in (("gpu", len(self.rank_ids)), ("host", len(self._host_index))):
                keys = [e.devices[0] for e in comp if e.kind == kind]
                again |= recurring(keys, slots, alpha)
        out, self.transients = [], []
        for e, t in found:
            stall = t and not (e.kind in ("gpu", "host") and e.devices[0] in again and e.iteration in irregular)
            (self.transients if stall else out).append(e)
        out, self.pauses = split_pauses(self, out, mc, mt, self.t.pause_ratio)
        cost = {e.iteration: e.excess_ns for e in out if e.kind != "network"}
        return [e for e in out if e.kind != "network" or cost.get(e.iteration, -1.0) < e.excess_ns]

    def spread_ratio(self, e: Event) -> float:
        """How evenly an event's excess spread over the work of the device it implicates: the
        rate at which the device's other operators grew (their excess over their usual length),
        over the rate of the one that grew most.

        A faulty device slows everything it carries alike (near 1 or above); a stall of one
        operator while the device's other work ran as usual (the operating system, a
        heavy-tailed kernel, a TCP retransmission) leaves the rest at the noise (near 0).

        * a GPU: the rank's compute gaps of the iteration;
        * a host: the median of its slow ranks' ratios (a slower host -- its CPU throttled,
          its GPUs' clocks down -- stretches all their work; an operating-system hiccup stalls
          one point of each);
        * a network event: the operators of its slow channels in the iteration (a slow pair
          direction or NIC slows every transfer of the channel, not one); when they held a single
          operator, the operators of every channel crossing each of the event's best devices
          (the largest ratio over them: an NVSwitch whose other transfers ran as usual did not
          stall one all-reduce).

        NaN with under ``transient_min_ops`` operators.
        """
        if e.kind in ("gpu", "host"):
            ratios = [self._compute_spread(r, e.iteration) for r in e.ranks]
            ratios = [r for r in ratios if np.isfinite(r)]
            return float(np.median(ratios)) if ratios else float("nan")
        ex, usual = self.transfers.op_times(e.channels, e.iteration, self.usual_q)
        if ex.size != 1:
            return _rest_over_top(ex, usual, self.t.transient_min_ops)
        best = e.best_devices
        ratios = [_rest_over_top(*self.transfers.op_times(self._crossing.get(d, []), e.iteration, self.usual_q),
                                 self.t.transient_min_ops) for d in best]
        ratios = [r for r in ratios if np.isfinite(r)]
        return max(ratios) if len(ratios) == len(best) and ratios else float("nan")

    def _compute_spread(self, rank: int, iteration: int) -> float:
        """:func:`_rest_over_top` of one rank's compute gaps in one iteration."""
        ro = self._ranks[rank]
        lo, hi = ro.iteration_rows(iteration)
        ex = ro.excess(self.usual_q)[0][lo:hi].astype(float)
        return _rest_over_top(ex, ro.gap[lo:hi].astype(float) - ex, self.t.transient_min_ops)

    def _network_devices(self, topology: Any, k: int, slow: list[int]) -> tuple[list[str], int]:
        """The devices the slow channels of iteration ``k`` implicate, best first, and how many of
        them lead equally (same share and number of slow channels: a NIC and its cable).

        Candidates are the devices every slow channel crosses (else the strongest one's). A
        faulty device slows every channel crossing it: candidates are ordered by the share of
        the channels crossing them that were slower than usual (z at least the threshold
        ``cell_hot_z``) in the iteration
        (a device on every path, a leaf or an NVSwitch, does not win by the volume it carries),
        then by how many those are (a slow switch covers more than each NIC under it), then
        NICs and their cables first.

        A device that every channel of the slow channels' kind crosses (P2P directions, or
        collectives: the channels their cells are judged against) is no candidate: it slows
        them all alike, the comparison cancels it, and it cannot explain why these were slower
        than the others -- one host's NVSwitch under every pair of a single-host job, as in
        the persistent analysis (:func:`~holmes.localize.persistent.suspects.network_suspects`).
        No candidate left: ``([], 0)``, the event names no device.
        """
        paths = self._paths(topology)
        everywhere = self._everywhere[self.channels[slow[0]][1] >= 0]
        sets = [[d for d in paths[c] if d not in everywhere] for c in slow]
        cand = [d for d in sets[0] if all(d in s for s in sets[1:])] or list(sets[0])
        if not cand:
            return [], 0
        col = np.nan_to_num(self.transfer_z[:, k], nan=0.0)
        crossing = self._crossing
        low = self.t.cell_hot_z

        def key(d: str) -> tuple[float, int, int]:
            cs = crossing.get(d, [])
            hot = sum(1 for c in cs if col[c] >= low)
            return (-round(hot / max(len(cs), 1), 6), -hot, kinds.specificity(d))
        out = sorted(cand, key=key)
        return out, (sum(1 for d in out if key(d)[:2] == key(out[0])[:2]) if out else 0)

    def _paths(self, topology: Any) -> list[list[str]]:
        """Per channel, the network devices on its path; also fills ``_crossing`` (device ->
        the channels crossing it)."""
        if self._path_cache is None:
            from holmes.localize.evidence.ranking import network_devices
            self._path_cache = [network_devices(self.transfers.ranks_of(c), topology)
                                for c in range(len(self.channels))]
            for c, devs in enumerate(self._path_cache):
                for d in devs:
                    self._crossing.setdefault(d, []).append(c)
            # per kind (P2P or not), the devices every channel of that kind crosses (two or more)
            for p2p in (False, True):
                of = [set(devs) for c, devs in enumerate(self._path_cache) if (self.channels[c][1] >= 0) == p2p]
                self._everywhere[p2p] = set.intersection(*of) if len(of) >= 2 else set()
        return self._path_cache

    def _compute_event(self, it: int, grew: list[int], top: int, z: float, p: float, excess: float) -> Event:
        """One GPU, or the host when at least half of its ranks (two or more) grew."""
        by_host: dict[int, list[int]] = {}
        for r in grew:
            by_host.setdefault(self.host_of(r), []).append(r)
        host, rs = max(by_host.items(), key=lambda kv: len(kv[1]))
        size = int((self._hosts == host).sum())
        if len(rs) >= 2 and 2 * len(rs) >= size:
            return Event(it, "host", tuple(rs), z, p, excess, devices=[kinds.host(host)])
        return Event(it, "gpu", (top,), z, p, excess, devices=[kinds.gpu(top)])


def _shared_iterations(per: list[np.ndarray]) -> np.ndarray:
    """The iterations held by the most ranks (sorted): every rank's where they all share them.

    A rank with no operator in the window, or whose iterations its peers lack (its log shifted,
    truncated, or the job's halves holding disjoint iterations), does not empty the comparison
    of the others: it is left out of the iterations it lacks (its cells NaN).

    >>> _shared_iterations([np.array([0, 1, 2]), np.array([], np.int64), np.array([1, 2, 3])]).tolist()
    [1, 2]
    """
    if not per:
        return np.zeros(0, np.int64)
    allits = np.concatenate([np.unique(np.asarray(i, np.int64)) for i in per])
    if not allits.size:
        return np.zeros(0, np.int64)
    vals, counts = np.unique(allits, return_counts=True)
    return vals[counts == counts.max()]


def _rest_over_top(excess: np.ndarray, usual: np.ndarray, min_ops: int) -> float:
    """The rate at which the operators other than the most grown one grew (summed excess over
    summed usual length), over that one's rate (NaN under ``min_ops`` operators or nothing grown)."""
    ok = np.isfinite(excess) & np.isfinite(usual)
    ex, us = np.maximum(excess[ok], 0.0), np.maximum(usual[ok], 0.0)
    if ex.size < min_ops:
        return float("nan")
    t = int(np.argmax(ex))
    rest = float(us.sum() - us[t])
    if ex[t] <= 0 or us[t] <= 0 or rest <= 0:
        return float("nan")
    return float((ex.sum() - ex[t]) / rest) / float(ex[t] / us[t])


def _common(x: np.ndarray, q: float) -> np.ndarray:
    """Per iteration (column), the ``q`` quantile over the rows: what most of them did together."""
    with np.errstate(all="ignore"):
        if not x.size:
            return np.zeros((1, x.shape[1]))
        cm = np.nanquantile(x, q, axis=0, keepdims=True)
    return np.nan_to_num(cm, nan=0.0)


def _usual(x: np.ndarray, q: float) -> np.ndarray:
    """Per row, its usual level: the ``q`` quantile over the iterations (a slowdown covering up
    to ``1 - q`` of them leaves it on the healthy level)."""
    with np.errstate(all="ignore"):
        return np.nanquantile(x, q, axis=1, keepdims=True)
