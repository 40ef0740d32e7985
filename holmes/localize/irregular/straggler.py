"""Who worked longer: the compute stragglers of one irregular iteration, from the ranks read.

Algorithm 1 finds a straggler by following late arrivals from the pivot's abnormal operators.
On a noisy job (shared CPUs, a loaded host, a busy storage system) many copies of an operator
look abnormal, the late arrival is lost, and the search ends in a NETWORK verdict on a group
whose real problem is one member's compute. The compute itself tells them apart, on each rank's
own clock: a rank's *compute* in an iteration is the sum of its gaps between operators (the time
it spent working, not waiting inside an operator). A compute straggler is a rank whose compute
grew, against its own usual iteration, by a large share of how much longer the iteration was:

* one such rank: its GPU (or, when none of its host-mates was read, the GPU or its host, left to
  :mod:`~holmes.localize.irregular.host_probe`);
* several, all on one host, with no rank of another host: the host (its CPU side);
* several on different hosts: the whole job slowed down together (a shared resource, the
  machine, the data loader): **common mode**, a slowdown no single device explains.

Waiting for a slow transfer happens *inside* operators, so a network fault grows no rank's
compute: a network cause of Algorithm 1 is left alone when no straggler stands out.

Examples
--------
>>> import numpy as np
>>> from holmes.localize.irregular.straggler import classify
>>> growth = {0: 1.0e6, 1: 40.0e6, 2: 2.0e6, 3: 0.5e6}     # ns of extra compute per rank
>>> sigma = {r: 1.0e6 for r in growth}
>>> classify(growth, sigma, iteration_excess=30e6, host_of=lambda r: r // 2)
('gpu', (1,))
>>> classify({0: 30e6, 1: 35e6, 2: 1e6, 3: 0.0}, sigma, 30e6, host_of=lambda r: r // 2)
('host', (0, 1))
>>> classify({0: 30e6, 1: 1e6, 2: 33e6, 3: 0.0}, sigma, 30e6, host_of=lambda r: r // 2)
('common', (0, 2))
>>> classify({0: 1e6, 1: 2e6}, sigma, 30e6, host_of=lambda r: r // 2)
(None, ())
>>> # host 1's rank grew 16 ms of a 44 ms excess, the pivot on host 0 9 ms (the job's own jitter):
>>> # not common mode, and compute alone explains too little for a straggler: the search decides
>>> classify({0: 9e6, 2: 16e6, 3: 2e6}, sigma, 44e6, host_of=lambda r: r // 2)
(None, ())
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from holmes.calibration.thresholds import or_shipped
from holmes.stats import HEALTHY_SPREAD_QS, NORMAL_Q25_Q05

__all__ = ["classify", "compute_growth"]


def compute_growth(ro: Any, iteration: int, *, min_iterations: int | None = None) -> tuple[float, float] | None:
    """How much longer than usual the rank computed in ``iteration`` and its healthy spread.

    "Usual" is the rank's first quartile of compute per iteration, the spread ``(q25 - q05) /
    0.97`` (a normal's sigma): a slowdown covering up to about half of the iterations (a
    fluctuation, a fault that began mid-run) leaves both on the healthy level. None when the rank
    has no such iteration or fewer than ``min_iterations`` iterations (threshold
    ``straggler_min_iterations``).
    """
    its, comp = ro.iteration_compute()
    if its.size < or_shipped(min_iterations, "straggler_min_iterations"):
        return None
    i = int(np.searchsorted(its, iteration))
    if i >= its.size or its[i] != iteration:
        return None
    q05, q25 = np.quantile(comp.astype(float), HEALTHY_SPREAD_QS)
    return float(comp[i] - q25), float((q25 - q05) / NORMAL_Q25_Q05)


def classify(growth: Mapping[int, float], sigma: Mapping[int, float], iteration_excess: float,
             host_of: Callable[[int], int], *, share: float | None = None, ratio: float | None = None,
             noise_z: float | None = None) -> tuple[str | None, tuple[int, ...]]:
    """The stragglers of one iteration from each read rank's compute ``growth`` (ns).

    A rank *grew* when its growth is at least ``ratio`` of the largest growth and ``noise_z`` of
    its own spread ``sigma``. Compute explains the iteration only when the largest growth is at
    least ``share / 2`` of its excess: then ranks of several hosts grew is common mode when a rank
    off the most-grown rank's host grew by ``share / 2`` of the excess too (else only that host's
    ranks count); the ranks that grew are stragglers when the largest growth is at least
    ``share`` of the excess. Defaults: the thresholds ``straggler_share``, ``straggler_ratio``,
    ``straggler_z``.

    Returns
    -------
    kind : {"gpu", "host", "common", None}
    ranks : tuple of int
        The stragglers (sorted).
    """
    share = or_shipped(share, "straggler_share")
    ratio = or_shipped(ratio, "straggler_ratio")
    noise_z = or_shipped(noise_z, "straggler_z")
    if not growth or iteration_excess <= 0:
        return None, ()
    top = max(growth.values())
    grew = tuple(sorted(r for r, g in growth.items() if g >= ratio * top and g >= noise_z * sigma.get(r, 0.0)))
    if not grew:
        return None, ()
    if top < share / 2 * iteration_excess:
        return None, ()  # compute explains little of this iteration
    if len({host_of(r) for r in grew}) > 1:
        # common mode when ranks of two hosts or more each account for a good part of the
        # iteration; a rank of another host that grew a little beside a host that grew more (the
        # job's own per-iteration jitter on top of a slow host's NVSwitch) is not
        lead = host_of(max(grew, key=lambda r: growth[r]))
        other = max(growth[r] for r in grew if host_of(r) != lead)
        if other >= share / 2 * iteration_excess:
            return "common", grew
        grew = tuple(r for r in grew if host_of(r) == lead)
    if top < share * iteration_excess:
        return None, ()
    return ("gpu" if len(grew) == 1 else "host"), grew
