"""Generators of standard cluster topologies.

* :func:`rail_optimized` -- two-tier rail-optimized Clos (the default when a job has no
  topology.json): ``switch:leaf-<i>`` with ``i = pod * gpus_per_host + rail``, every leaf cabled
  to every ``switch:spine-<j>``.
* :func:`fat_tree` -- three-tier k-ary fat tree: ``switch:tor-<i>``, ``switch:agg-<j>``,
  ``switch:core-<c>``.
* :func:`default_topology` -- the rail-optimized Clos for a world size, rounded up to whole
  hosts.
"""

from __future__ import annotations

import logging

import numpy as np

from holmes.errors import ConfigError
from holmes.topology import kinds
from holmes.topology.cluster import ClusterTopology

__all__ = ["rail_optimized", "fat_tree", "default_topology"]

logger = logging.getLogger(__name__)


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name}={value!r} must be an integer >= 1")
    return value


def rail_optimized(
    num_gpus: int,
    gpus_per_host: int = 8,
    hosts_per_pod: int = 32,
    num_spines: int | None = None,
    *,
    name: str | None = None,
) -> ClusterTopology:
    """Two-tier rail-optimized Clos.

    Hosts are grouped into pods of ``hosts_per_pod`` (host ``h`` in pod
    ``h // hosts_per_pod``). Each pod has one leaf per rail: NIC ``g`` (rail
    ``g % gpus_per_host``) is cabled to ``switch:leaf-<pod * gpus_per_host + rail>``. Every leaf
    is cabled to every ``switch:spine-<j>``, ``j < num_spines``. Same-rail traffic inside a pod
    turns at the shared leaf; cross-rail or cross-pod traffic goes leaf - spine - leaf.

    Parameters
    ----------
    num_gpus : int
        Number of GPUs; a multiple of ``gpus_per_host``.
    gpus_per_host : int
        GPUs (= NICs = rails) per host.
    hosts_per_pod : int
        Hosts under one set of rail leaves (a leaf has this many NIC ports).
    num_spines : int or None
        Spine switches; default ``gpus_per_host``.
    name : str or None
        Topology name; default ``"rail-optimized-<num_gpus>"``.

    Raises
    ------
    ConfigError
        On non-positive sizes or ``num_gpus`` not a multiple of ``gpus_per_host``.

    Examples
    --------
    >>> t = rail_optimized(64, gpus_per_host=8, hosts_per_pod=4, num_spines=2)
    >>> len(t.devices("switch")), t.leaf_of(33), t.downstream_nics("switch:leaf-9")
    (18, 'switch:leaf-9', 4)
    """
    n = _positive("num_gpus", num_gpus)
    g = _positive("gpus_per_host", gpus_per_host)
    p = _positive("hosts_per_pod", hosts_per_pod)
    s = g if num_spines is None else _positive("num_spines", num_spines)
    if n % g:
        raise ConfigError(f"num_gpus={n} is not a multiple of gpus_per_host={g}")
    hosts = n // g
    pods = -(-hosts // p)
    leaves = [kinds.switch(f"leaf-{i}") for i in range(pods * g)]
    spines = [kinds.switch(f"spine-{j}") for j in range(s)]
    # the cables in the compact form (indices into leaves + spines; the same cables, in the same
    # order, as listing them): a NIC to its rail's leaf in its pod, every leaf to every spine
    r = np.arange(n, dtype=np.int64)
    nic_switch = (r // g // p) * g + r % g
    leaf, spine = np.meshgrid(np.arange(len(leaves)), len(leaves) + np.arange(s), indexing="ij")
    topo = ClusterTopology(
        n, g, leaves + spines, name=name or f"rail-optimized-{n}", kind="rail-optimized",
        nic_switch=nic_switch, switch_links=np.stack([leaf.ravel(), spine.ravel()], axis=1).astype(np.int64),
    )
    logger.debug("built %r", topo)
    return topo


def _default_k(num_gpus: int, gpus_per_host: int) -> int:
    k = 4
    while k < 2 * gpus_per_host:
        k *= 2
    while k**3 // 4 < num_gpus:
        k *= 2
    return k


def fat_tree(
    num_gpus: int, gpus_per_host: int = 8, k: int | None = None, *, name: str | None = None
) -> ClusterTopology:
    """Three-tier k-ary fat tree (ToR / aggregation / core), NICs cabled to ToRs.

    With ``h = k // 2``: NIC ``g`` is cabled to ``switch:tor-<g // h>``; ToR ``t`` is in pod
    ``t // h`` and is cabled to the pod's ``h`` aggregation switches ``switch:agg-<pod*h + j>``;
    when there is more than one pod, aggregation switch ``j`` of every pod is cabled to cores
    ``switch:core-<j*h>`` .. ``switch:core-<j*h + h - 1>`` (``h * h`` cores). Only the ToRs and
    pods the GPUs need are built.

    Parameters
    ----------
    num_gpus : int
        Number of GPUs (= NICs); at most ``k**3 // 4``.
    gpus_per_host : int
        GPUs per host.
    k : int or None
        Switch radix, even. Default: the smallest power of two >= max(4, 2 * gpus_per_host)
        with ``k**3 // 4 >= num_gpus`` (so a host's NICs share one ToR).
    name : str or None
        Topology name; default ``"fat-tree-<num_gpus>"``.

    Raises
    ------
    ConfigError
        On bad sizes, odd ``k`` or more GPUs than the tree holds.

    Examples
    --------
    >>> t = fat_tree(128, k=8)
    >>> t.leaf_of(5), len(t.path(0, 127)), t.downstream_nics("switch:agg-0")
    ('switch:tor-1', 13, 16)
    """
    n = _positive("num_gpus", num_gpus)
    gph = _positive("gpus_per_host", gpus_per_host)
    if k is None:
        k = _default_k(n, gph)
    if isinstance(k, bool) or not isinstance(k, int) or k < 2 or k % 2:
        raise ConfigError(f"fat-tree radix k={k!r} must be an even integer >= 2")
    if n > k**3 // 4:
        raise ConfigError(f"a k={k} fat tree holds at most {k**3 // 4} NICs, not {n}")
    h = k // 2
    tors = -(-n // h)
    pods = -(-tors // h)
    tor_ids = [kinds.switch(f"tor-{t}") for t in range(tors)]
    agg_ids = [kinds.switch(f"agg-{a}") for a in range(pods * h)]
    core_ids = [kinds.switch(f"core-{c}") for c in range(h * h)] if pods > 1 else []
    links = [(kinds.nic(r), tor_ids[r // h]) for r in range(n)]
    links += [(tor_ids[t], agg_ids[(t // h) * h + j]) for t in range(tors) for j in range(h)]
    for pod in range(pods if core_ids else 0):
        for j in range(h):
            links += [(agg_ids[pod * h + j], core_ids[j * h + c]) for c in range(h)]
    topo = ClusterTopology(
        n, gph, tor_ids + agg_ids + core_ids, links, name=name or f"fat-tree-{n}", kind="fat-tree"
    )
    logger.debug("built %r", topo)
    return topo


def default_topology(world_size: int, gpus_per_host: int = 8) -> ClusterTopology:
    """The topology assumed when a job has none: :func:`rail_optimized` over
    ``world_size`` rounded up to whole hosts.

    >>> default_topology(12).num_gpus
    16
    """
    n = _positive("world_size", world_size)
    g = _positive("gpus_per_host", gpus_per_host)
    return rail_optimized(-(-n // g) * g, g, name=f"default-rail-optimized-{n}")
