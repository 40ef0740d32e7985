"""Job-wide pauses: an iteration in which the whole job stalled at once is no device's fault.

A faulty device slows the work it carries: a GPU its rank's compute, a host its ranks', a NIC or
a switch the transfers crossing it. The other ranks *wait* for it, and waiting is in neither of
the cells' matrices (:mod:`holmes.localize.irregular.cells`): a slow device leaves the job's other
cells at the noise. A pause of the whole job -- the machine or the cluster's storage stalls every
process for a moment, a collective garbage collection, a checkpoint, the operating system -- does
not: each rank is caught in whatever it was doing, so the iteration's significant cells lie on
every host, in compute and in transfers of places that share no device. Whichever cell stood out
most then names a device (one P2P copy that the pause caught for 100 ms names a spine switch at
0.98, on a healthy job).

:func:`job_wide` tells the two apart for one event: the significant cells the event's device
cannot explain (outside its footprint) cost every host of the job at least ``ratio / hosts``
times what the device explains (together at least ``ratio`` times it, no host spared). Such an
event is evidence of the pause, not of a device -- unless the device also stands out in another
iteration that is no pause (:func:`split_pauses`); the irregular analysis says so in an
assumption and counts it for no device. The threshold ``pause_ratio`` was chosen on the
development split of the real corpora with pauses added (``benchmarks/pause_accuracy.py``).
Several pauses in one run are a limit: one that catches mostly the cross-host copies of one
spine reads, in its iteration, as that spine's spike.

The footprint of an event:

* a GPU or host: its ranks' compute and every channel one of its ranks is a member of (a slow GPU
  may slow its own transfers);
* a network event: the channels crossing its best devices, and the compute of its channels' ranks
  (a slow sender, as a slow link looks from the sender's side, shows as the sender's compute).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["footprint", "job_wide", "split_pauses"]


def footprint(cells: Any, event: Any) -> tuple[set[int], set[int]]:
    """The ranks (compute rows by rank id) and channels (indices of ``cells.channels``) that the
    device(s) of ``event`` can slow (see the module docstring); a network event's from the cells'
    map of the channels crossing each device (filled when its events were found)."""
    tr = cells.transfers
    if event.kind == "network":
        chans = {c for d in event.best_devices for c in cells._crossing.get(d, ())} | set(event.channels)
        ranks = {r for c in event.channels for r in tr.ranks_of(c)}
        return ranks, chans
    ranks = set(event.ranks)
    return ranks, {c for c in range(len(cells.channels)) if ranks & set(tr.ranks_of(c))}


def job_wide(cells: Any, event: Any, k: int, compute_sig: np.ndarray, transfer_sig: np.ndarray,
             ratio: float) -> bool:
    """Whether ``event`` (iteration column ``k`` of ``cells``) is part of a job-wide pause.

    ``compute_sig`` and ``transfer_sig`` are the significance masks of the cells
    (``(ranks, iterations)`` and ``(channels, iterations)``) the events were found with. True,
    on a job of two hosts or more, when the significant cells outside the event's
    :func:`footprint` cost *every* host at least ``ratio / hosts`` times the event's own excess (the significant cells inside its
    footprint; a channel's excess shared equally by the hosts of its ranks): together at least
    ``ratio`` times it, and no host spared (a trace of a cell on a host is no stall of it).
    ``ratio`` <= 0: never.

    >>> from types import SimpleNamespace as NS
    >>> class T:
    ...     def ranks_of(self, c): return [(0, 1), (2, 3)][c]
    >>> cells = NS(channels=[0, 1], transfers=T(), rank_ids=[0, 1, 2, 3], host_of=lambda r: r // 2,
    ...            _host_index={0: 0, 1: 1}, _crossing={},
    ...            compute_excess=np.array([[50.0], [20], [40], [0]]), transfer_excess=np.array([[0.0], [30]]))
    >>> e = NS(kind="gpu", ranks=(0,), excess_ns=50.0)
    >>> sig_t = np.array([[0], [1]], bool)
    >>> job_wide(cells, e, 0, np.array([[1], [1], [1], [0]], bool), sig_t, 1.0)  # host 0: 20, host 1: 40 + 30
    False
    >>> job_wide(cells, e, 0, np.array([[1], [1], [1], [0]], bool), sig_t, 0.8)  # each at least 0.4 x 50
    True
    >>> job_wide(cells, e, 0, np.array([[1], [0], [1], [0]], bool), sig_t, 0.8)  # host 0 spared: gpu:0's own
    False
    """
    nh = len(cells._host_index)
    if ratio <= 0 or nh < 2:
        return False
    ranks, chans = footprint(cells, event)
    ce = np.maximum(np.nan_to_num(cells.compute_excess[:, k]), 0.0)
    te = np.maximum(np.nan_to_num(cells.transfer_excess[:, k]), 0.0) if len(cells.channels) else np.zeros(0)
    inside = 0.0
    per_host: dict[int, float] = {}
    for j, r in enumerate(cells.rank_ids):
        if not compute_sig[j, k]:
            continue
        if r in ranks:
            inside += ce[j]
        else:
            h = int(cells.host_of(r))
            per_host[h] = per_host.get(h, 0.0) + ce[j]
    for c in range(len(cells.channels)):
        if not transfer_sig[c, k]:
            continue
        if c in chans:
            inside += te[c]
            continue
        hs = {int(cells.host_of(r)) for r in cells.transfers.ranks_of(c)}
        for h in hs:
            per_host[h] = per_host.get(h, 0.0) + te[c] / len(hs)
    need = ratio * max(inside, float(event.excess_ns), 1.0) / nh
    return bool(len(per_host) >= nh and min(per_host.values()) >= need)


def split_pauses(cells: Any, events: list[Any], compute_sig: np.ndarray, transfer_sig: np.ndarray,
                 ratio: float) -> tuple[list[Any], list[Any]]:
    """``events`` (of ``cells``' iterations) split into those that count and those of a job-wide
    pause (:func:`job_wide`), each in the given order.

    A pause explains an event only for a device that stands out nowhere else: an event whose
    device has an event of another iteration that is no pause counts (a faulty device's stall the
    pause coincided with -- a fluctuating P2P link slow in the paused iteration too)."""
    col = {it: k for k, it in enumerate(np.asarray(cells.iterations).tolist())}
    wide = [job_wide(cells, e, col[e.iteration], compute_sig, transfer_sig, ratio) for e in events]
    seen: dict[str, set[int]] = {}
    for e, w in zip(events, wide):
        if not w:
            for d in e.best_devices:
                seen.setdefault(d, set()).add(e.iteration)
    wide = [w and not any(seen.get(d, set()) - {e.iteration} for d in e.best_devices) for e, w in zip(events, wide)]
    return [e for e, w in zip(events, wide) if not w], [e for e, w in zip(events, wide) if w]
