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
>>> from holmes.localize.persistent.peers import Roles
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

from holmes.calibration.thresholds import Thresholds, load_thresholds, or_shipped
from holmes.display import SHOWN_CANDIDATES
from holmes.localize.evidence.ranking import default_prior, network_devices
from holmes.localize.persistent.peers import Roles, faster_half_mean, kind_and_ranks
from holmes.stats import MAD_SIGMA, MEDIAN_SE
from holmes.topology import kinds

__all__ = ["Suspect", "ComputeOutliers", "NetworkOutliers", "compute_suspects", "network_suspects", "slot_classes",
           "StageHost", "stage_hosts", "stage_volumes"]

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
    alike: list[str] = field(default_factory=list)   # network: devices crossed by exactly the same slots


@dataclass
class ComputeOutliers:
    suspects: list[Suspect]
    z: np.ndarray                   # (W, T) own work over the work peers', in sigmas of their noise
    rate: float                     # share of (rank, iteration) outliers
    moving: float                   # share of iterations with an outlier that is no persistent one
    no_peer: list[int] = field(default_factory=list)   # ranks no other rank does the same work as
    effect: np.ndarray | None = None                   # (W,) median relative excess over the peers


@dataclass
class NetworkOutliers:
    suspects: list[Suspect]
    ratio: np.ndarray               # (S, T) transfer time over the peer slots' median
    flags: np.ndarray               # (S, T) outlier slots
    rate: float
    device_hits: dict[str, tuple[float, float]] = field(default_factory=dict)  # device -> (iterations, share)


def _separated(eff: np.ndarray, gap: float) -> np.ndarray:
    """The members above the widest gap between consecutive sorted effects, when that gap is at
    least ``gap`` and at most half the group lies above it (a slow host may be half a stage).

    >>> _separated(np.array([0.0, 0.02, 0.16, 0.01]), 0.06).tolist()
    [False, False, True, False]
    >>> _separated(np.array([0.01, 0.03, 0.05, 0.07, 0.09]), 0.06).tolist()   # a continuum: no one
    [False, False, False, False, False]
    """
    n = eff.size
    out = np.zeros(n, np.bool_)
    if n < 2:
        return out
    o = np.sort(eff)
    lo = n - n // 2 - 1  # at most half the group above the gap
    gaps = np.diff(o)[lo:]
    k = int(np.argmax(gaps))
    if gaps[k] >= gap:
        out = eff > o[lo + k]
    return out


def compute_suspects(roles: Roles, caused: np.ndarray, compute: np.ndarray, *, z: float,
                     fraction: float, present: np.ndarray | None = None, min_effect: float | None = None,
                     thresholds: Thresholds | None = None) -> ComputeOutliers:
    """Ranks whose own work persistently exceeds their work peers' while others waited on them.

    Each rank's work in each iteration is compared, in log scale, with the mean of the faster half
    of its work peer group (:attr:`Roles.work_members`: its stage across TP/CP/EP positions and
    replicas; with two peers, the faster one). A rank is a straggler when

    * its median excess over the window is at least ``min_effect`` (relative: the persistent
      offsets of healthy ranks stay below it) and stands ``z`` standard errors above zero, the
      errors from the group's iteration-to-iteration noise (each rank's spread around its own
      median, pooled: a persistently slow rank does not widen it);
    * it stands apart: above the widest gap (at least three quarters of ``min_effect``) between
      the sorted excesses of its group, with at most half the group above it (healthy ranks form a
      continuum of small offsets);
    * in at least ``fraction`` of the window (the continuity rule) its excess is at least half
      ``min_effect``;
    * over the window it made others wait more than the faster half of its peers did (extra work
      nobody waited for is not straggling; two slow ranks of one host share the blame of the
      collectives they are late to together, so this is not asked per iteration).

    ``present``: the ranks summarized (the others are left out of their groups' statistics). Ranks
    with no work peer are listed in ``no_peer``; ``z`` of the result is each rank's excess in units
    of the noise, per iteration. ``min_effect`` defaults to the threshold ``persistent_min_effect``;
    ``thresholds`` (default the shipped ones) give ``persistent_work_floor`` (work under this share
    of the step counts as that share before the log), ``persistent_min_sigma`` (the noise floor, in
    log units) and ``persistent_gap_share`` (the widest gap, as a share of ``min_effect``).
    """
    th = thresholds or load_thresholds()
    min_effect = or_shipped(min_effect, "persistent_min_effect")
    W, T = caused.shape
    zs = np.zeros((W, T))
    if T == 0:
        return ComputeOutliers([], zs, 0.0, 0.0)
    C = compute.astype(np.float64)
    step = float(np.nanmedian(np.nanmean(C, axis=0))) if W else 0.0
    floor = max(step * th.persistent_work_floor, 1.0)
    flags = np.zeros((W, T), np.bool_)
    effect = np.zeros(W)
    strong = np.zeros(W, np.bool_)
    no_peer: list[int] = []
    moving = counted = 0
    groups = roles.work_members or roles.members
    min_log = math.log1p(max(min_effect, 0.0))
    for m in groups:
        if present is not None:
            m = m[present[m]]
        if m.size < 2:
            no_peer.extend(int(r) for r in m)
            continue
        x = np.log(np.maximum(C[m], floor))
        d = x - faster_half_mean(x)
        med_d = np.median(d, axis=1, keepdims=True)
        sig = max(MAD_SIGMA * float(np.median(np.abs(d - med_d))), th.persistent_min_sigma)
        tot = caused[m].sum(axis=1)
        f = (d > min_log / 2) & (tot > faster_half_mean(tot[:, None]))[:, None]
        zs[m] = d / sig
        flags[m] = f
        sig_med = MEDIAN_SE * sig / math.sqrt(T)  # standard error of a median of T iterations
        strong[m] = (med_d[:, 0] >= min_log) & (med_d[:, 0] >= z * sig_med) & \
            _separated(med_d[:, 0], th.persistent_gap_share * min_log)
        effect[m] = np.expm1(med_d[:, 0])
        counted += T
        # a slow position that moves between replicas: outliers most iterations, no persistent one
        if not ((f.mean(axis=1) >= fraction) & strong[m]).any():
            moving += int((f & (d > max(z * sig, min_log))).any(axis=0).sum())
    frac = np.where(strong, flags.mean(axis=1), 0.0)
    excess = caused - roles.work_reference(caused) if roles.work_members else caused
    sus = [Suspect("compute", [r], int(flags[r].sum()), float(max(excess[r].mean(), 0.0) + effect[r] * step))
           for r in np.flatnonzero(frac >= fraction).tolist()]
    rate = float(flags.mean()) if flags.size else 0.0
    log.info("persistent: %d compute suspect(s) among %d ranks (outlier rate %.4f)", len(sus), W, rate)
    out = ComputeOutliers(sus, zs, rate, moving / counted if counted else 0.0)
    out.no_peer = sorted(no_peer)
    out.effect = effect
    return out


@dataclass
class StageHost:
    """A host all of whose GPUs lie in the pipeline stages that are slower than the others."""

    host: int
    stages: list[int]               # the slow stages on the host (all of their ranks are the host's)
    hits: int                       # iterations the stages stood out
    effect: float                   # median relative excess of the stages' work over the others'
    ambiguous: bool                 # the first or last stage alone: a slow host and a heavier stage look the same


def stage_volumes(slot_info: list[tuple], NB: np.ndarray, roles: Roles, communicators: Any) -> np.ndarray:
    """Each pipeline stage's gradient reduction volume: the bytes its data-parallel collectives
    (communicator kind ``dp``, every member in the stage) moved over the window, per data-parallel
    group of the stage (NaN for a stage with none). Megatron-style stages of equal layers reduce
    equal volumes; the embedding or the output layer shows as a larger one.

    >>> from holmes.localize.persistent.peers import Roles
    >>> roles = Roles.from_communicators({"pp0": ("pp", [0, 2]), "pp1": ("pp", [1, 3]),
    ...                                   "dp0": ("dp", [0, 1]), "dp1": ("dp", [2, 3])}, 4)
    >>> info = [("c", "all_reduce", [0, 1], "dp0"), ("c", "all_reduce", [2, 3], "dp1"), ("p", "send", [0, 2], "pp0")]
    >>> stage_volumes(info, np.array([100.0, 300.0, 7.0]), roles, {"dp0": ("dp", [0, 1]), "dp1": ("dp", [2, 3])}).tolist()
    [100.0, 300.0]
    """
    S = roles.num_stages
    per_group: dict[tuple[int, str], float] = {}
    for s, info in enumerate(slot_info):
        if info[0] != "c":
            continue
        c = communicators.get(info[-1]) if communicators is not None else None
        kind = kind_and_ranks(c)[0] if c is not None else None
        members = [int(r) for r in info[2]]
        stages = {int(roles.stage[r]) for r in members}
        if kind != "dp" or len(stages) != 1:
            continue
        key = (stages.pop(), str(info[-1]))
        per_group[key] = per_group.get(key, 0.0) + float(NB[s])
    out = np.full(S, np.nan)
    for st in range(S):
        v = [b for (g, _), b in per_group.items() if g == st]
        if v:
            out[st] = float(np.median(v))
    return out


def stage_hosts(roles: Roles, compute: np.ndarray, host_of: Any, *, z: float, fraction: float,
                min_effect: float, present: np.ndarray | None = None,
                thresholds: Thresholds | None = None, volume: np.ndarray | None = None) -> list[StageHost]:
    """Hosts that make up whole slow pipeline stages (where no work peer is on another host).

    When a host holds every rank of a stage (every TP position of every replica), the stage's
    peers are all on that host and no peer comparison can tell it. What remains is the stage
    against the other stages: each stage's mean work (log scale) per iteration against the mean of
    the faster half of the stages, with the significance, separation and continuity rules of
    :func:`compute_suspects`. A slow set of stages whose ranks are exactly the GPUs of whole hosts
    implicates those hosts; a host holding two or more of the slow stages is the simpler story (two
    stages equally heavier by chance, exactly on one host), and so is a middle stage (built like its
    neighbours); the first or the last stage alone is ``ambiguous``: it is heavier by design in many
    models (the embedding; the output layer and the loss), which looks the same -- unless
    ``volume`` (:func:`stage_volumes`) shows it holds no other layers than the rest: its gradient
    volume within ``stage_volume_tolerance`` of the other stages' median.

    >>> from holmes.localize.persistent.peers import Roles
    >>> roles = Roles.from_communicators({"pp0": ("pp", [0, 2, 4, 6]), "pp1": ("pp", [1, 3, 5, 7]),
    ...                                   **{f"dp{s}": ("dp", [2 * s, 2 * s + 1]) for s in range(4)}}, 8)
    >>> rng = np.random.default_rng(1)
    >>> work = 100.0 * np.exp(rng.normal(0, 0.01, (8, 20))); work[:4] *= 1.3   # host 0: stages 0, 1
    >>> [(h.host, h.stages, h.ambiguous) for h in stage_hosts(roles, work, lambda r: r // 4, z=4.0,
    ...                                                          fraction=0.6, min_effect=0.08)]
    [(0, [0, 1], False)]
    """
    th = thresholds or load_thresholds()
    W, T = compute.shape
    S = roles.num_stages
    if S < 2 or T == 0:
        return []
    ok = np.ones(W, np.bool_) if present is None else present.astype(np.bool_)
    x = np.log(np.maximum(compute.astype(np.float64), 1.0))
    stage_x = np.full((S, T), np.nan)
    for st in range(S):
        m = ok & (roles.stage == st)
        if m.any():
            stage_x[st] = x[m].mean(axis=0)
    have = np.flatnonzero(np.isfinite(stage_x[:, 0]))
    if have.size < 2:
        return []
    v = stage_x[have]
    d = v - faster_half_mean(v)
    med = np.median(d, axis=1)
    sig = max(MAD_SIGMA * float(np.median(np.abs(d - med[:, None]))), th.persistent_min_sigma)
    min_log = math.log1p(max(min_effect, 0.0))
    slow = (med >= min_log) & (med >= z * MEDIAN_SE * sig / math.sqrt(T)) & \
        _separated(med, th.persistent_gap_share * min_log) & \
        ((d > min_log / 2).mean(axis=1) >= fraction)
    if not slow.any():
        return []
    slow_stages = have[slow]
    slow_ranks = set(np.flatnonzero(ok & np.isin(roles.stage, slow_stages)).tolist())
    hosts: dict[int, list[int]] = {}
    for r in range(W):
        if ok[r]:
            hosts.setdefault(int(host_of(r)), []).append(r)
    out = []
    for h in sorted({int(host_of(r)) for r in slow_ranks}):
        if not set(hosts[h]) <= slow_ranks:
            continue  # the host also holds ranks of stages that are not slow
        sts = sorted({int(roles.stage[r]) for r in hosts[h]})
        if {r for st in sts for r in np.flatnonzero(ok & (roles.stage == st)).tolist()} != set(hosts[h]):
            continue  # its stages have ranks on other hosts too: their peers there would have shown it
        hits = int((d[np.isin(have, sts)] > min_log / 2).all(axis=0).sum())
        # one stage alone is ambiguous when it is the first or the last (embedding, output layer and
        # loss make those heavier by design); a middle stage is built like its neighbours
        edge = len(sts) < 2 and sts[0] in (int(have[0]), int(have[-1])) and not _like_others(volume, sts[0], th)
        out.append(StageHost(h, sts, hits, float(np.expm1(np.median(med[np.isin(have, sts)]))), edge))
    return out


def slot_classes(slot_info: list[tuple], stage: np.ndarray, NB: np.ndarray, CNT: np.ndarray,
                 host_of: Any = None, communicators: Any = None, bins_per_octave: int | None = None) -> list[np.ndarray]:
    """Peer slots: channels doing the same transfers, so that their transfer times compare.

    P2P pairs of the same communicator kind and direction along the communicator's rank order (a
    pipeline's forward or backward sends, between any adjacent stages); collectives of the same
    kind and size; both with the same instance count and volume (to ``1 / bins_per_octave`` of a
    factor of two, threshold ``slot_bins_per_octave``)
    and, with ``host_of``, the same locality (a P2P pair inside one host or between two; a
    collective spanning the same number of hosts): an NVSwitch transfer is not a peer of a NIC one.
    Without ``communicators`` the P2P direction is told by the stages (``stage``)."""
    bins = or_shipped(bins_per_octave, "slot_bins_per_octave")
    classes: dict[tuple, list[int]] = {}
    for s, info in enumerate(slot_info):
        kind, members = info[1], info[2]
        hosts = len({int(host_of(int(r))) for r in members}) if host_of is not None and len(members) else 0
        if info[0] == "p":
            snd, rcv = int(members[0]), int(members[1])
            c = communicators.get(info[-1]) if communicators is not None else None   # its comm_id
            ranks = [int(r) for r in kind_and_ranks(c)[1]] if c is not None else []
            if snd in ranks and rcv in ranks:
                d = int(np.sign(ranks.index(rcv) - ranks.index(snd)))
            else:
                d = int(np.sign(int(stage[rcv]) - int(stage[snd])))
            key: tuple = ("p", kind, d, hosts)
        else:
            key = ("c", kind, len(members), hosts)
        key += (int(CNT[s]), int(round(math.log2(NB[s] + 1) * bins)))
        classes.setdefault(key, []).append(s)
    return [np.asarray(v) for _, v in sorted(classes.items(), key=lambda kv: kv[1][0])]


def network_suspects(slot_info: list[tuple], X: np.ndarray, classes: list[np.ndarray], topology: Any, *, z: float,
                     fraction: float, min_excess: float, thresholds: Thresholds | None = None) -> NetworkOutliers:
    """Slots whose transfers are persistently slower than their peer slots', and the network
    devices on the paths of most slow slots and of few healthy ones.

    A slot's transfer time in each iteration is compared, in log scale, with the mean of the faster
    half of its class (:func:`slot_classes`; with two slots, the faster one). A slot is slow when
    its median excess is at least ``min_excess`` (relative) and ``z`` times the class's
    iteration-to-iteration noise, and its excess is at least half ``min_excess`` in ``fraction`` of
    the iterations. ``thresholds`` (default the shipped ones) give ``network_min_sigma`` (the class
    noise floor, log units), ``network_hit_share`` (an iteration is a device's hit when at least this
    share of the slots crossing it are flagged, or every slow slot it explains is) and
    ``network_candidate_share`` (devices scoring at least this share of the best are candidates)."""
    th = thresholds or load_thresholds()
    S, T = X.shape
    flags = np.zeros((S, T), np.bool_)
    strong = np.zeros(S, np.bool_)
    ratio = np.ones((S, T))
    min_log = math.log1p(min_excess)
    for idx in classes:
        if len(idx) < 2:
            continue
        v = X[idx]
        ok = (v > 0).all(axis=0)
        if not ok.any():
            continue
        lv = np.log(np.where(v > 0, v, 1.0))
        lr = np.where(ok, lv - faster_half_mean(lv), 0.0)  # over the faster half of the peer slots
        med = np.median(lr[:, ok], axis=1)
        sig = max(MAD_SIGMA * float(np.median(np.abs(lr[:, ok] - med[:, None]))), th.network_min_sigma)
        flags[idx] = ok & (lr > min_log / 2)
        # per-iteration noise, not the median's standard error: channels of one class differ by more
        # than chance in healthy jobs (a later stage's gradient reduction overlaps other work)
        strong[idx] = (med >= min_log) & (med >= z * sig)
        ratio[idx] = np.exp(lr)
    out = NetworkOutliers([], ratio, flags, float(flags.mean()) if flags.size else 0.0)
    frac = np.where(strong, flags.mean(axis=1), 0.0) if T else np.zeros(S)
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
    # a device every slot of a class crosses slows them all alike: the comparison within the class
    # cancels it, so it cannot explain why one of them is slower than the others (one host's
    # NVSwitch under every P2P pair of an intra-host pipeline)
    common: dict[int, set[str]] = {}
    for idx in classes:
        if len(idx) >= 2:
            shared = set(devs_of[int(idx[0])]).intersection(*(devs_of[int(s)] for s in idx[1:]))
            common.update({int(s): shared for s in idx})
    explains = {s: [d for d in devs_of[s] if d not in common.get(s, ())] for s in slow_set}
    excess = {s: float((ratio[s] - 1).clip(0).mean()) for s in slow_set}
    total_excess = sum(excess.values()) or 1.0
    best: list[tuple[float, str]] = []
    for d in sorted({d for s in slow_set for d in explains[s]}):
        cross = crossing[d]
        n_slow = [s for s in cross if s in slow_set and d in explains[s]]
        share = len(n_slow) / len(cross)
        cover = sum(excess[s] for s in n_slow) / total_excess
        best.append((share * cover, d))
        per_it = flags[np.asarray(cross)].mean(axis=0)
        # an iteration is the device's hit when most of its traffic was slow (a slow NIC or switch),
        # or when every slow transfer it explains was (one slow P2P direction: one of the NIC's
        # transfers, whichever other traffic the NIC carries); which of the devices on that path is
        # at fault is the explain-away's (share) question, not the hits'
        hit = per_it >= th.network_hit_share
        if n_slow:
            hit |= flags[np.asarray(n_slow)].all(axis=0)
        out.device_hits[d] = (float(hit.sum()), share)
    # devices crossed by exactly the same slots (a NIC, its cable, the NIC at the other end of the
    # only transfers it carries) cannot be told apart: adjacent, the kind more often at fault first
    # (the ranking's prior), and each names the others as alike
    prior = default_prior(th)
    best.sort(key=lambda zd: (-round(zd[0], 9), tuple(crossing[zd[1]]),
                              -prior.get(kinds.prior_kind(zd[1]), 0.0), zd[1]))
    top = best[0][0] if best else 0.0
    kept = [(sc, d) for sc, d in best if sc >= th.network_candidate_share * top]
    groups: dict[tuple[int, ...], list[str]] = {}
    for _, d in kept:
        groups.setdefault(tuple(crossing[d]), []).append(d)
    for sc, d in kept:
        ss = [s for s in crossing[d] if s in slow_set and d in explains[s]]
        ranks = sorted({r for s in ss for r in slot_info[s][2]})
        alike = [a for a in groups[tuple(crossing[d])] if a != d]
        out.suspects.append(Suspect("network", ranks, int(out.device_hits[d][0]), sc, devices=[d], slots=ss,
                                    alike=alike))
    log.info("persistent: %d slow slot(s); network candidates %s", slow.size, [d for _, d in best[:SHOWN_CANDIDATES]])
    return out


def _like_others(volume: np.ndarray | None, stage: int, th: Thresholds) -> bool:
    """The stage reduces the same gradient volume as the other stages (within the tolerance):
    it holds layers like theirs. False where a volume is unknown."""
    if volume is None or len(volume) < 2 or not np.isfinite(volume[stage]):
        return False
    rest = np.delete(volume, stage)
    rest = rest[np.isfinite(rest)]
    if not rest.size:
        return False
    ref = float(np.median(rest))
    return ref > 0 and abs(float(volume[stage]) - ref) <= th.stage_volume_tolerance * ref
