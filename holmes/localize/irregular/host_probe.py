"""Telling a slow GPU from a slow host: the compute of a straggler's host-mates.

Algorithm 1 ends a branch with COMPUTE on one GPU: that rank entered an operator late because
its own work between operators took longer. The GPU itself, or its host (CPU contention, a
throttled host, a noisy neighbour process), may be at fault. One cause cannot tell them apart,
but the other GPUs of the same host can: a host fault slows *their* compute in the same
iteration too, a GPU fault does not (they only wait for it, inside operators).

:class:`HostProbe` compares the extra compute time of the straggler in the cause's iteration
(the sum of its compute-gap excess, :meth:`holmes.cog.RankOps.excess`) with that of its
host-mates, read from ranks already fetched first and then, within a budget, from the job:

* ``"host"``: at least half of the host-mates checked (and at least one) lost at least
  ``ratio`` (default 1/2) as much compute time: the cause implicates the host;
* ``"gpu"``: host-mates were checked and ran normally: the cause implicates the GPU alone;
* ``None``: no host-mate could be checked (single-GPU host, logs missing, budget spent): both
  stay implicated, as without the probe.

Examples
--------
>>> from holmes.localize.irregular.host_probe import host_verdict
>>> host_verdict(10_000, [9_000, 8_000, 100], ratio=0.5)
'host'
>>> host_verdict(10_000, [100, 300], ratio=0.5)
'gpu'
>>> host_verdict(10_000, [], ratio=0.5) is None
True
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from holmes.calibration.thresholds import or_shipped

__all__ = ["HostProbe", "host_verdict"]

log = logging.getLogger(__name__)


def host_verdict(own: float, mates: Sequence[float], *, ratio: float | None = None) -> str | None:
    """``"host"``, ``"gpu"`` or None from the compute excess of a straggler and its host-mates
    (``ratio``: threshold ``host_probe_ratio``)."""
    ratio = or_shipped(ratio, "host_probe_ratio")
    if not mates:
        return None
    if own <= 0:
        return None
    slow = sum(1 for m in mates if m >= ratio * own)
    return "host" if 2 * slow >= len(mates) else "gpu"


class HostProbe:
    """Decides, per COMPUTE cause, whether its GPU or its host is implicated.

    Parameters
    ----------
    search : GraphSearch
        Gives fetched ranks (``rank_ops``) and the COG.
    topology : ClusterTopology
        Gives ``host_of`` and ``gpus_per_host``.
    max_reads : int, optional
        Ranks the probe may fetch in a whole localization (fetched ranks cost nothing; default:
        the threshold ``default_host_reads``).
    mates : int, optional
        Host-mates checked per cause (threshold ``host_probe_mates``).
    ratio : float, optional
        A host-mate corroborates when its compute excess reaches this fraction of the straggler's
        (threshold ``host_probe_ratio``).
    """

    def __init__(self, search: Any, topology: Any, *, max_reads: int | None = None, mates: int | None = None,
                 ratio: float | None = None) -> None:
        self.search = search
        self.topology = topology
        self.max_reads = or_shipped(max_reads, "default_host_reads")
        self.mates = or_shipped(mates, "host_probe_mates")
        self.ratio = or_shipped(ratio, "host_probe_ratio")
        self.reads = 0
        self._cache: dict[tuple[int, int], str | None] = {}

    @staticmethod
    def _iteration_excess(ro: Any, iteration: int) -> float:
        lo, hi = ro.iteration_rows(iteration)
        return float(ro.excess()[0][lo:hi].sum()) if hi > lo else -1.0

    def _mates(self, rank: int) -> list[int]:
        g = int(self.topology.gpus_per_host)
        h = int(self.topology.host_of(rank))
        world = self.search.source.world_size
        ids = [r for r in range(h * g, min((h + 1) * g, world)) if r != rank]
        fetched = [r for r in ids if r in self.search.graph.ranks]
        # the nearest unfetched neighbours first: deterministic and spread around the straggler
        rest = sorted((r for r in ids if r not in self.search.graph.ranks and r not in self.search.source.missing),
                      key=lambda r: (abs(r - rank), r))
        return fetched + rest

    def verdict(self, rank: int, iteration: int) -> str | None:
        """``"host"``, ``"gpu"`` or None for a COMPUTE cause on ``rank`` in ``iteration``."""
        key = (rank, iteration)
        if key in self._cache:
            return self._cache[key]
        own_ro = self.search.graph.ranks.get(rank)
        own = self._iteration_excess(own_ro, iteration) if own_ro is not None else -1.0
        got: list[float] = []
        for m in self._mates(rank):
            if len(got) >= self.mates:
                break
            ro = self.search.graph.ranks.get(m)
            if ro is None:
                if self.reads >= self.max_reads:
                    break
                self.reads += 1
                ro = self.search.rank_ops(m)
                if ro is None:
                    continue
            x = self._iteration_excess(ro, iteration)
            if x >= 0:
                got.append(x)
        v = host_verdict(own, got, ratio=self.ratio)
        log.debug("host probe rank %d iteration %d: own %.0f mates %s -> %s", rank, iteration, own, got, v)
        self._cache[key] = v
        return v
