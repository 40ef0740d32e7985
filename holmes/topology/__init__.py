"""Topology of a training job: its parallel layout (which ranks communicate) and its cluster
network (which devices a transfer crosses).

Examples
--------
>>> from holmes.topology import ParallelLayout, default_topology
>>> ParallelLayout(tp=2, pp=2, dp=2).groups("tp")[:2]
[(0, 1), (2, 3)]
>>> default_topology(16).path(0, 8)[2]
'switch:leaf-0'
"""

from __future__ import annotations

from holmes.topology.cluster import ClusterTopology
from holmes.topology.generators import default_topology, fat_tree, rail_optimized
from holmes.topology.infer import infer_layout, kind_from_group_name
from holmes.topology.layout import KINDS, Communicator, ParallelLayout

load_topology = ClusterTopology.load

__all__ = [
    "Communicator",
    "ParallelLayout",
    "KINDS",
    "kind_from_group_name",
    "infer_layout",
    "ClusterTopology",
    "rail_optimized",
    "fat_tree",
    "default_topology",
    "load_topology",
]
