"""Clearing network devices: the paths of operators that ran fast in the same iteration.

A network cause implicates every device on the paths among its GPUs. A transfer of the same
iteration that crossed some of those devices *quickly* shows they were healthy then, and
:func:`holmes.localize` leaves them out of the cause (unless nothing would be left).

"Quickly" matters. An operator labelled normal may have spent most of its time waiting for a
late peer (a pipeline ``recv`` posted early, a collective whose member came late), its
transfer hidden in the wait: its label says nothing about the devices it crossed. So a normal
operator clears its devices only when its *effective speed* (bytes over duration) is at least
``speedup`` times that of the cause operator (its bytes over its extra duration,
:meth:`holmes.cog.RankOps.excess`): had it crossed a device as slow as the cause suggests, it
could not have been that fast. Tiny operators (latency-bound) never clear anything.

Examples
--------
>>> from holmes.cog import CommOpGraph
>>> from holmes.io.schema import ops_table
>>> from holmes.topology import default_topology
>>> g = CommOpGraph({"dp": ("dp", (0, 8))})
>>> t = ops_table(rank=[0], iteration=[0], op_index=[0], comm_id=["dp"], seq=[0], op=["all_reduce"],
...               peer=[None], nbytes=[1 << 20], start_ns=[0], end_ns=[1_000])
>>> ro = g.add_rank(0, t); ro.abnormal = np.array([False])
>>> hp = HealthyPaths(g, default_topology(16))
>>> sorted(hp.devices(0, min_bytes=1024, min_speed=100.0))[:2]
['link:nic:0|switch:leaf-0', 'link:nic:8|switch:leaf-0']
>>> hp.devices(0, min_bytes=1024, min_speed=1e6)
set()
"""

from __future__ import annotations

from typing import Any

import numpy as np

from holmes.localize.evidence.ranking import network_devices

__all__ = ["HealthyPaths"]


class HealthyPaths:
    """Network devices crossed by normally-running operators of the fetched ranks, per iteration.

    Parameters
    ----------
    graph : CommOpGraph
        The fetched ranks (with detector flags).
    topology : ClusterTopology
    """

    def __init__(self, graph: Any, topology: Any) -> None:
        self.graph = graph
        self.topology = topology
        self._by_iter: dict[int, list[tuple[int, float, frozenset[str]]]] = {}
        self._paths: dict[tuple[int, ...], frozenset[str]] = {}

    def _devs(self, ranks: tuple[int, ...]) -> frozenset[str]:
        got = self._paths.get(ranks)
        if got is None:
            got = frozenset(network_devices(ranks, self.topology))
            self._paths[ranks] = got
        return got

    def _collect(self, iteration: int) -> list[tuple[int, float, frozenset[str]]]:
        """(bytes, best speed in bytes/ns, devices) per (members, bytes) of normal operators."""
        got = self._by_iter.get(iteration)
        if got is not None:
            return got
        best: dict[tuple[tuple[int, ...], int], float] = {}
        for r, ro in self.graph.ranks.items():
            lo, hi = ro.iteration_rows(iteration)
            if hi <= lo or ro.abnormal is None:
                continue
            rows = np.arange(lo, hi)[~ro.abnormal[lo:hi]]
            rows = rows[ro.nbytes[rows] > 0]
            if rows.size == 0:
                continue
            speed = ro.nbytes[rows] / np.maximum(ro.duration[rows], 1).astype(float)
            for row, sp in zip(rows.tolist(), speed.tolist()):
                peer = int(ro.peer[row])
                members = tuple(sorted((r, peer))) if peer >= 0 else self.graph.members[int(ro.comm[row])]
                if len(members) < 2:
                    continue
                key = (members, int(ro.nbytes[row]))
                if best.get(key, -1.0) < sp:
                    best[key] = sp
        got = [(nb, sp, self._devs(m)) for (m, nb), sp in best.items()]
        self._by_iter[iteration] = got
        return got

    def devices(self, iteration: int, min_bytes: float, min_speed: float = 0.0) -> set[str]:
        """Devices crossed in ``iteration`` by a normal operator of at least ``min_bytes`` bytes
        that moved them at ``min_speed`` bytes/ns or faster."""
        out: set[str] = set()
        for nb, sp, devs in self._collect(iteration):
            if nb >= min_bytes and sp >= min_speed:
                out |= devs
        return out
