"""Persistent stragglers among role peers: compute suspects (ranks) and network suspects (devices).

A rank is an *outlier* in an iteration when its own work stands ``persistent_z`` robust sigmas (of
its role group's own spread over the window) above its role peers' median *and* it made others
wait more than its peers' median did (a rank late only because it waited on someone else earlier
-- a whole pipeline replica behind a slow stage -- has its peers' own work; extra work nobody
waited for is not straggling). A slot (communicator or P2P pair) is an outlier when its transfer
time stands above that of its peer slots (same kind, size, stages, volume). Either is a straggler
only when that holds in at least ``persistent_fraction`` of the window (the continuity rule: a
one-off blip is not a straggler). Slow slots implicate the network devices on the paths of most
of them and of few healthy ones.

Examples
--------
>>> import numpy as np
>>> from holmes.localize.peers import Roles
>>> roles = Roles.from_communicators({"dp": ("dp", [0, 1, 2, 3])}, 4)
>>> rng = np.random.default_rng(0)
>>> work = 100.0 + rng.normal(0, 1, (4, 20)); work[2] += 30
>>> waits = np.zeros((4, 20)); waits[2] = 50.0
>>> res = compute_suspects(roles, waits, work, z=4.0, fraction=0.6)
>>> [s.ranks for s in res.suspects]
[[2]]
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from holmes.localize.peers import Roles
from holmes.localize.ranking import network_devices
from holmes.stats import MAD_SIGMA

__all__ = ["Suspect", "ComputeOutliers", "NetworkOutliers", "compute_suspects", "network_suspects", "slot_classes"]

log = logging.getLogger(__name__)


@dataclass
class Suspect:
    """A persistent straggler: a rank (compute) or a network device."""

    kind: str                       # "compute" | "network"
    ranks: list[int]
    hits: int                       # outlier iterations
    excess: float                   # mean excess over the peers' median (ns per iteration), or a share
    devices: list[str] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)   # network: the slow slots crossing the device


@dataclass
class ComputeOutliers:
    suspects: list[Suspect]
    z: np.ndarray                   # (W, T) own work over the role peers', in robust sigmas
    rate: float                     # share of (rank, iteration) outliers
    moving: float                   # share of iterations with an outlier that is no persistent one


@dataclass
class NetworkOutliers:
    suspects: list[Suspect]
    ratio: np.ndarray               # (S, T) transfer time over the peer slots' median
    flags: np.ndarray               # (S, T) outlier slots
    rate: float
    device_hits: dict[str, tuple[float, float]] = field(default_factory=dict)  # device -> (iterations, share)


def compute_suspects(roles: Roles, caused: np.ndarray, compute: np.ndarray, *, z: float,
                     fraction: float, present: np.ndarray | None = None) -> ComputeOutliers:
    """Ranks whose own work persistently exceeds their role peers' while others waited on them
    (``present``: the ranks summarized; the others are left out of their groups' statistics)."""
    W, T = caused.shape
    zs = np.zeros((W, T))
    if T == 0:
        return ComputeOutliers([], zs, 0.0, 0.0)
    if present is not None and not present.all():
        caused, compute = caused.astype(np.float64), compute.astype(np.float64)  # copies that can hold NaN
        caused[~present] = np.nan
        compute[~present] = np.nan
    excess = caused - roles.group_median(caused)
    cexcess = compute - roles.group_median(compute)
    step = float(np.nanmedian(np.nanmean(compute, axis=0))) if W else 0.0
    floor = max(step * 1e-3, 1.0)
    flags = np.zeros((W, T), np.bool_)
    moving = counted = 0
    for m in roles.members:
        if present is not None:
            m = m[present[m]]
        if m.size < 3:
            continue
        e = excess[m]
        ce = cexcess[m]
        csig = max(MAD_SIGMA * float(np.median(np.abs(ce - np.median(ce)))), floor)
        f = (ce > z * csig) & (e > 0)
        zs[m] = ce / csig
        flags[m] = f
        counted += T
        # a slow position that moves between replicas: outliers most iterations, no persistent one
        if not (f.mean(axis=1) >= fraction).any():
            moving += int(f.any(axis=0).sum())
    frac = flags.mean(axis=1)
    sus = [Suspect("compute", [r], int(flags[r].sum()), float(excess[r].mean()))
           for r in np.flatnonzero(frac >= fraction).tolist()]
    rate = float(flags.mean()) if flags.size else 0.0
    log.info("persistent: %d compute suspect(s) among %d ranks (outlier rate %.4f)", len(sus), W, rate)
    return ComputeOutliers(sus, zs, rate, moving / counted if counted else 0.0)


def slot_classes(slot_info: list[tuple], stage: np.ndarray, NB: np.ndarray, CNT: np.ndarray) -> list[np.ndarray]:
    """Peer slots: P2P pairs of the same kind between the same stages, collectives of the same kind
    and size; both with the same instance count and volume (to a quarter of a factor of two)."""
    classes: dict[tuple, list[int]] = {}
    for s, info in enumerate(slot_info):
        kind, members = info[1], info[2]
        if info[0] == "p":
            key: tuple = ("p", kind, int(stage[members[0]]), int(stage[members[1]]))
        else:
            key = ("c", kind, len(members))
        key += (int(CNT[s]), int(round(math.log2(NB[s] + 1) * 4)))
        classes.setdefault(key, []).append(s)
    return [np.asarray(v) for _, v in sorted(classes.items(), key=lambda kv: kv[1][0])]


def network_suspects(slot_info: list[tuple], X: np.ndarray, classes: list[np.ndarray], topology: Any, *, z: float,
                     fraction: float, min_excess: float) -> NetworkOutliers:
    """Slots whose transfers are persistently slower than their peer slots', and the network
    devices on the paths of most slow slots and of few healthy ones."""
    S, T = X.shape
    flags = np.zeros((S, T), np.bool_)
    ratio = np.ones((S, T))
    for idx in classes:
        if len(idx) < 3:
            continue
        v = X[idx]
        medv = np.median(v, axis=0)
        with np.errstate(divide="ignore", invalid="ignore"):
            lr = np.log(np.where((v > 0) & (medv > 0), v / np.where(medv > 0, medv, 1), 1.0))
        sig = max(MAD_SIGMA * float(np.median(np.abs(lr - np.median(lr)))), 0.01)
        flags[idx] = (lr > z * sig) & (lr > math.log1p(min_excess))
        ratio[idx] = np.exp(lr)
    out = NetworkOutliers([], ratio, flags, float(flags.mean()) if flags.size else 0.0)
    frac = flags.mean(axis=1) if T else np.zeros(S)
    slow = np.flatnonzero(frac >= fraction)
    if not slow.size:
        return out
    slow_set = set(slow.tolist())
    devs_of: dict[int, list[str]] = {}
    crossing: dict[str, list[int]] = {}
    for s in range(S):
        devs_of[s] = network_devices(slot_info[s][2], topology)
        for d in devs_of[s]:
            crossing.setdefault(d, []).append(s)
    excess = {s: float((ratio[s] - 1).clip(0).mean()) for s in slow_set}
    total_excess = sum(excess.values()) or 1.0
    best: list[tuple[float, str]] = []
    for d in sorted({d for s in slow_set for d in devs_of[s]}):
        cross = crossing[d]
        n_slow = [s for s in cross if s in slow_set]
        share = len(n_slow) / len(cross)
        cover = sum(excess[s] for s in n_slow) / total_excess
        best.append((share * cover, d))
        per_it = flags[np.asarray(cross)].mean(axis=0)
        out.device_hits[d] = (float((per_it >= 0.5).sum()), share)
    # devices crossed by exactly the same slots (a NIC and its cable) cannot be told apart: adjacent
    best.sort(key=lambda zd: (-round(zd[0], 9), tuple(crossing[zd[1]]), zd[1]))
    top = best[0][0] if best else 0.0
    for sc, d in best:
        if sc < 0.5 * top:
            break
        ss = [s for s in crossing[d] if s in slow_set]
        ranks = sorted({r for s in ss for r in slot_info[s][2]})
        out.suspects.append(Suspect("network", ranks, int(out.device_hits[d][0]), sc, devices=[d], slots=ss))
    log.info("persistent: %d slow slot(s); network candidates %s", slow.size, [d for _, d in best[:4]])
    return out
