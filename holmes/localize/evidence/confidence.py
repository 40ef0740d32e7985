"""How sure a localization is, measured against the job's own noise.

Two questions decide whether a device may be named:

1. **Is the iteration really irregular, or the job's noise?** The pivot's irregular iterations
   are weighed by how far they stand above the job's healthy spread
   (:meth:`holmes.detect.IrregularityRule.z_scores`): ``w = clip((z - (noise_z - 1)) / 2, 0, 1)``,
   so an iteration within ``noise_z - 1`` healthy sigmas of the reference counts for nothing and
   one beyond ``noise_z + 1`` counts fully. A CPU job whose steps vary by 10% sees most of its
   "irregular" iterations weighed 0.
2. **Is the device blamed more often than chance would blame it?** A device's evidence is the
   weighted count ``S`` of searched iterations whose causes implicate it, out of ``N`` (the weighted
   iterations with a cause). Under the null, a cause implicates a device with its *opportunity*
   ``p0``: ``1/world`` for a GPU or a host (a compute cause falls on one rank; it names the host
   only when the host probe saw the host-mates slowed too), and for a network device the share of the job's communicators and P2P pairs whose paths
   cross it (:func:`network_opportunity`): a host's NVSwitch or a spine that lies on most paths is
   implicated by almost any network cause, so being implicated says little about it. The
   confidence is ``1 - P(Binomial(N, p0) >= S)``, continuous in ``S`` and ``N`` through the
   regularized incomplete beta function. Where the search was also run on regular iterations
   (the job's own null), ``p0`` is updated by how often it blamed the device there: a device the
   procedure blames whatever happens (a fabric on every path of a noisy job) is no culprit.

Examples
--------
>>> round(device_confidence(1.0, 1.0, 1 / 16), 4)      # one clear iteration, one of 16 GPUs
0.9375
>>> round(device_confidence(15.0, 20.0, 0.9), 3)      # on 90% of paths, blamed 15 times of 20
0.011
>>> iteration_weights(np.array([0.5, 2.5, 3.0, 9.0]), noise_z=3.0).tolist()
[0.0, 0.25, 0.5, 1.0]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from scipy.special import betainc

from holmes.calibration.thresholds import or_shipped
from holmes.localize.evidence.ranking import network_devices
from holmes.stats import PROB_FLOOR
from holmes.topology import kinds

__all__ = ["iteration_weights", "device_confidence", "network_opportunity", "opportunity", "confidences", "weighted_hits"]


def iteration_weights(z: np.ndarray, noise_z: float) -> np.ndarray:
    """Weight in [0, 1] of each irregular iteration from its z-score over the healthy spread."""
    return np.clip((np.asarray(z, dtype=np.float64) - (noise_z - 1.0)) / 2.0, 0.0, 1.0)


def device_confidence(s: float, n: float, p0: float) -> float:
    """``1 - P(X >= s)`` for ``X ~ Binomial(n, p0)`` (continuous in ``s``, ``n``); 0 when ``s <= 0``."""
    if s <= 0 or n <= 0:
        return 0.0
    p0 = min(max(float(p0), PROB_FLOOR), 1.0)
    s = min(float(s), float(n))
    return float(1.0 - betainc(s, n - s + 1.0, p0))


def network_opportunity(communicators: Mapping[str, Any], topology: Any, *, max_groups: int | None = None,
                        seed: int = 0) -> dict[str, float]:
    """Share of the job's transfer groups whose paths cross each network device.

    The groups are the communicators (their ring of members, as
    :func:`~holmes.localize.evidence.ranking.network_devices` walks it) and, for pipeline communicators,
    each consecutive pair; at most ``max_groups`` of them (threshold ``opportunity_max_groups``),
    drawn evenly with a seeded generator.
    """
    max_groups = or_shipped(max_groups, "opportunity_max_groups")
    groups: list[tuple[int, ...]] = []
    for c in communicators.values():
        ranks = tuple(int(r) for r in c.ranks)
        if len(ranks) < 2:
            continue
        if c.kind == "pp":
            groups += [(a, b) for a, b in zip(ranks, ranks[1:])]
        else:
            groups.append(ranks)
    if not groups:
        return {}
    if len(groups) > max_groups:
        idx = np.random.default_rng(seed).choice(len(groups), size=max_groups, replace=False)
        groups = [groups[i] for i in sorted(idx.tolist())]
    counts: dict[str, int] = {}
    for g in groups:
        for d in network_devices(g, topology):
            counts[d] = counts.get(d, 0) + 1
    return {d: k / len(groups) for d, k in counts.items()}


def opportunity(device: str, world: int, topology: Any, net_share: Mapping[str, float]) -> float:
    """``p0``: the chance that a cause with no fault behind it implicates ``device``."""
    if kinds.is_compute(device):
        # a compute cause lands on one rank; it implicates the host instead of the GPU only when
        # the host probe saw the GPU's host-mates lose compute time too, which chance rarely does
        return 1.0 / max(world, 1)
    # a network device no sampled group crosses: as rare as the rarest one seen
    floor = min(net_share.values()) if net_share else 1.0 / max(world, 1)
    return float(net_share.get(device, floor))


def confidences(hits: Mapping[str, float], n: float, world: int, topology: Any,
                net_share: Mapping[str, float], *, null_hits: Mapping[str, int] | None = None,
                null_n: int = 0, prior_weight: float | None = None) -> dict[str, float]:
    """Confidence of every device from its weighted hits out of ``n`` weighted iterations.

    The chance level of a device is its opportunity ``p0`` (:func:`opportunity`) updated by the
    job's own null, when one was searched: ``(null_hits + prior_weight * p0) / (null_n +
    prior_weight)``, where ``null_hits`` counts the regular iterations (out of ``null_n`` with a
    cause) whose causes implicated the device (``prior_weight``: threshold ``null_prior_weight``).

    >>> from holmes.topology import default_topology
    >>> t = default_topology(16)
    >>> c = confidences({"gpu:3": 4.0, "nvswitch:0": 4.0}, 4.0, 16, t, {"nvswitch:0": 0.5},
    ...                 null_hits={"nvswitch:0": 5}, null_n=6)
    >>> round(c["gpu:3"], 4), round(c["nvswitch:0"], 2)
    (1.0, 0.68)
    """
    null_hits = null_hits or {}
    prior_weight = or_shipped(prior_weight, "null_prior_weight")
    out = {}
    for d, s in hits.items():
        p0 = opportunity(d, world, topology, net_share)
        if null_n > 0:
            p0 = (null_hits.get(d, 0) + prior_weight * p0) / (null_n + prior_weight)
        out[d] = device_confidence(s, n, p0)
    return out


def weighted_hits(iterations: Sequence[int], device_lists: Iterable[Sequence[str]],
                  weights: Mapping[int, float]) -> tuple[dict[str, float], float]:
    """``(S per device, N)``: per iteration with a cause, every device any of its causes
    implicates counts the iteration's weight once."""
    per_it: dict[int, set[str]] = {}
    for it, devs in zip(iterations, device_lists):
        per_it.setdefault(int(it), set()).update(devs)
    hits: dict[str, float] = {}
    n = 0.0
    for it, devs in per_it.items():
        w = float(weights.get(it, 0.0))
        n += w
        for d in devs:
            hits[d] = hits.get(d, 0.0) + w
    return hits, n
