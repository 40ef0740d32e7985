"""Cluster network topology: devices, routes between GPUs, and the topology decay factor.

Device ids (``docs/formats.md``): ``gpu:<rank>``, ``nic:<rank>`` (one NIC per GPU), ``host:<node>``,
``nvswitch:<node>`` (the intra-host fabric), ``switch:<name>`` and ``link:<id-a>|<id-b>`` (one
cable, its two end ids sorted as strings). GPU ``g`` lives on host ``g // gpus_per_host`` and
owns NIC ``nic:g`` (rail ``g % gpus_per_host``).

A :class:`ClusterTopology` keeps a networkx graph of the network devices (NICs and switches;
cables are edges whose ``id`` attribute is the link id). Hosts and NVSwitches are implicit.

Routing
-------
Each NIC hangs off exactly one switch (its leaf / ToR). A transfer between GPUs on one host
crosses only ``nvswitch:<host>``. Otherwise it leaves through ``nic:a``, climbs from a's leaf to
b's leaf along a shortest path of the switch-only graph, and enters ``nic:b``; every device and
every cable is listed in order. Routes are computed in the canonical direction ``lo -> hi``
(``lo = min(a, b)``) so that ``path(b, a) == reversed(path(a, b))``. Among equal-cost next hops
(ECMP) the one with index ``mix64(lo, hi, hop) % n_candidates`` is taken, candidates sorted by
id, where ``mix64`` is the SplitMix64 finaliser: deterministic across runs and processes, and it
spreads GPU pairs over spines like flow-hash ECMP does. Switch distances are BFS rows of the
switch graph (scipy csgraph) cached per destination switch; whole paths are cached per GPU pair.

Examples
--------
>>> from holmes.topology import rail_optimized
>>> topo = rail_optimized(32, gpus_per_host=8, hosts_per_pod=2, num_spines=2)
>>> topo.path(0, 1)
('nvswitch:0',)
>>> topo.path(0, 8)
('nic:0', 'link:nic:0|switch:leaf-0', 'switch:leaf-0', 'link:nic:8|switch:leaf-0', 'nic:8')
>>> len(topo.path(0, 17))      # across pods: leaf -> spine -> leaf
9
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from holmes.errors import ConfigError, TopologyError
from holmes.topology import kinds
from holmes.topology.decay import decay_factor
from holmes.topology.kinds import DEVICE_KINDS, KINDS, DeviceKind
from holmes.topology.topology_file import (COMPACT_FROM_GPUS, TOPOLOGY_SCHEMA, add_compact, parse_topology, topology_dict,
                                           topology_text)

if TYPE_CHECKING:  # networkx is imported when a graph is asked for (it costs ~1 s to import)
    import networkx as nx

__all__ = [
    "TOPOLOGY_SCHEMA",
    "COMPACT_FROM_GPUS",
    "ClusterTopology",
    "decay_factor",
    "load_topology",
]

logger = logging.getLogger(__name__)

_TOPOLOGY_KINDS = ("rail-optimized", "fat-tree", "custom")
_MASK64 = (1 << 64) - 1


def _mix64(lo: int, hi: int, hop: int) -> int:
    """SplitMix64 finaliser of (lo, hi, hop): a stable, well-spread hash."""
    z = ((lo * 0x9E3779B97F4A7C15) ^ (hi * 0xBF58476D1CE4E5B9) ^ (hop + 1)) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


class ClusterTopology:
    """The network of a GPU cluster and the routes transfers take through it.

    Parameters
    ----------
    num_gpus : int
        Number of GPUs (= ranks); GPU ``g`` is on host ``g // gpus_per_host``.
    gpus_per_host : int
        GPUs (and NICs) per host.
    switches : iterable of str
        Switch ids, each ``switch:<name>`` (no ``|`` in the name).
    links : iterable of (str, str)
        Cables: NIC-switch (``nic:<g>``, ``switch:...``) and switch-switch. Each NIC has at most
        one cable; when there is more than one host, every NIC must have one.
    name : str
        Free-form name.
    kind : str
        "rail-optimized", "fat-tree" or "custom".
    nic_switch : sequence of int, optional
        The compact form of the NIC cables (topology.json of a large cluster): NIC ``g`` is cabled
        to ``switches[nic_switch[g]]`` (in the order ``switches`` is given; -1: no cable), one
        entry per GPU. Checked as a whole (numpy), not cable by cable.
    switch_links : sequence of (int, int), optional
        The compact form of the switch-switch cables: pairs of indices into ``switches``.

    Raises
    ------
    TopologyError
        On malformed ids, unknown ends, duplicate or self cables, NIC-NIC cables, or a NIC with
        zero (multi-host) or several cables.

    Examples
    --------
    >>> topo = ClusterTopology(4, gpus_per_host=2, switches=["switch:s"],
    ...                        links=[(f"nic:{g}", "switch:s") for g in range(4)])
    >>> topo.path(1, 2)
    ('nic:1', 'link:nic:1|switch:s', 'switch:s', 'link:nic:2|switch:s', 'nic:2')
    >>> topo.downstream_nics("switch:s"), topo.kind_of("link:nic:1|switch:s")
    (4, 'link')
    """

    def __init__(
        self,
        num_gpus: int,
        gpus_per_host: int = 8,
        switches: Iterable[str] = (),
        links: Iterable[Sequence[str]] = (),
        *,
        name: str = "cluster",
        kind: str = "custom",
        nic_switch: Sequence[int] | np.ndarray | None = None,
        switch_links: Sequence[Sequence[int]] | np.ndarray | None = None,
    ) -> None:
        for label, v in (("num_gpus", num_gpus), ("gpus_per_host", gpus_per_host)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise TopologyError(f"{label}={v!r} must be an integer >= 1")
        if kind not in _TOPOLOGY_KINDS:
            raise TopologyError(f"topology kind {kind!r} is not one of {', '.join(_TOPOLOGY_KINDS)}")
        self.num_gpus = int(num_gpus)
        self.gpus_per_host = int(gpus_per_host)
        self.name = str(name)
        self.kind = kind
        self.num_hosts = -(-self.num_gpus // self.gpus_per_host)

        switches = list(switches)
        sw_ids = sorted(set(switches))
        for s in sw_ids:
            if not isinstance(s, str) or not kinds.is_kind(s, "switch") or len(s) == 7 or "|" in s:
                raise TopologyError(f"bad switch id {s!r}: expected 'switch:<name>' without '|'")
        self._sw_ids: list[str] = sw_ids
        self._sw_index = {s: i for i, s in enumerate(sw_ids)}

        nic_leaf = np.full(self.num_gpus, -1, dtype=np.int64)
        sw_edges: list[tuple[int, int]] = []
        ends: list[tuple[str, str]] = []   # each cable once, its ends sorted as strings
        seen: set[tuple[str, str]] = set()
        sw_index = self._sw_index
        for item in links:
            try:
                a, b = item
            except (TypeError, ValueError):
                raise TopologyError(f"link {item!r} must be a pair of device ids") from None
            na, nb = self._nic_number(a), self._nic_number(b)
            if a == b:
                raise TopologyError(f"link {a!r}-{b!r} connects a device to itself")
            if na >= 0 and nb >= 0:
                raise TopologyError(f"link {a!r}-{b!r} connects two NICs; NICs attach to switches")
            key = (a, b) if a <= b else (b, a)
            if key in seen:
                raise TopologyError(f"duplicate link {kinds.link(a, b)!r}")
            seen.add(key)
            ends.append(key)
            if na >= 0 or nb >= 0:
                r, sw = (na, b) if na >= 0 else (nb, a)
                if nic_leaf[r] >= 0:
                    raise TopologyError(f"{kinds.nic(r)} has more than one link (to {self._sw_ids[nic_leaf[r]]} and {sw})")
                nic_leaf[r] = sw_index[sw]
            else:
                sw_edges.append((sw_index[a], sw_index[b]))
        compact = nic_switch is not None or switch_links is not None
        if compact:
            add_compact(self, switches, nic_leaf, sw_edges, nic_switch, switch_links)
        if self.num_hosts > 1:
            missing = np.flatnonzero(nic_leaf < 0)
            if missing.size:
                raise TopologyError(
                    f"{kinds.nic(int(missing[0]))} has no link to a switch ({missing.size} NICs unconnected)"
                )
        # the cables as sorted id pairs: built on first use where the compact form gave them
        self._links_l: list[tuple[str, str]] | None = None if compact else ends
        self._link_set_s: set[tuple[str, str]] | None = None if compact else seen
        self._sw_pairs: set[tuple[int, int]] | None = None
        self._graph: nx.Graph | None = None
        self._nic_leaf = nic_leaf
        self._sw_edges = sw_edges
        self._nbrs: list[np.ndarray] | None = None
        self._csr = None
        self._dist_rows: dict[int, np.ndarray] = {}
        self._sw_nics: np.ndarray | None = None
        self._devices: list[str] | None = None
        self._path_cached = functools.lru_cache(maxsize=1 << 18)(self._compute_path)

    def _build_links(self) -> None:
        sw = self._sw_ids
        ends: list[tuple[str, str]] = []
        nics = np.flatnonzero(self._nic_leaf >= 0)
        for g, i in zip(nics.tolist(), self._nic_leaf[nics].tolist()):
            a, b = kinds.nic(g), sw[i]
            ends.append((a, b) if a <= b else (b, a))
        for i, j in self._sw_edges:
            a, b = sw[i], sw[j]
            ends.append((a, b) if a <= b else (b, a))
        self._links_l, self._link_set_s = ends, set(ends)

    @property
    def _links(self) -> list[tuple[str, str]]:
        """Every cable as its two end ids sorted as strings."""
        if self._links_l is None:
            self._build_links()
        assert self._links_l is not None
        return self._links_l

    @property
    def _link_set(self) -> set[tuple[str, str]]:
        if self._link_set_s is None:
            self._build_links()
        assert self._link_set_s is not None
        return self._link_set_s

    def _has_link(self, a: str, b: str) -> bool:
        """Whether a cable joins ``a`` and ``b`` (ends sorted as strings), without listing every cable."""
        if self._link_set_s is not None:
            return (a, b) in self._link_set_s
        sa, sb = self._sw_index.get(a), self._sw_index.get(b)
        if sa is not None and sb is not None:
            if self._sw_pairs is None:
                self._sw_pairs = {(min(i, j), max(i, j)) for i, j in self._sw_edges}
            return (min(sa, sb), max(sa, sb)) in self._sw_pairs
        nic, sw = (a, sb) if sb is not None else (b, sa)
        got = kinds.numbered(nic)
        if sw is None or got is None or got[0] != "nic" or got[1] >= self.num_gpus:
            return False
        return int(self._nic_leaf[got[1]]) == sw

    @property
    def num_links(self) -> int:
        """The number of cables."""
        return int((self._nic_leaf >= 0).sum()) + len(self._sw_edges)

    @property
    def graph(self) -> nx.Graph:
        """The network devices as a networkx graph: ``nic:<g>`` and switch nodes (attribute
        ``kind``), cables as edges (attribute ``id``, the link id). Built on first use."""
        if self._graph is None:
            import networkx as nx

            g = nx.Graph(name=self.name)
            g.add_nodes_from((kinds.nic(r) for r in range(self.num_gpus)), kind="nic")
            g.add_nodes_from(self._sw_ids, kind="switch")
            g.add_edges_from((a, b, {"id": kinds.link(a, b)}) for a, b in self._links)
            self._graph = g
        return self._graph

    # ------------------------------------------------------------------ ids
    def _nic_number(self, dev: object) -> int:
        """``g`` for a cable end ``nic:<g>``, -1 for a listed switch; anything else raises."""
        if isinstance(dev, str):
            if dev in self._sw_index:
                return -1
            if kinds.is_kind(dev, "nic"):
                n = kinds.name_of(dev)
                if n.isascii() and n.isdigit() and (n == "0" or n[0] != "0") and int(n) < self.num_gpus:
                    return int(n)
        raise TopologyError(
            f"link end {dev!r} is neither a listed switch nor a NIC nic:0..nic:{self.num_gpus - 1}"
        )

    def kind_of(self, device_id: str) -> str:
        """Kind of a device id: gpu, nic, host, nvswitch, switch or link.

        Raises :class:`TopologyError` if the id is not a device of this topology.

        >>> from holmes.topology import rail_optimized
        >>> rail_optimized(16).kind_of("switch:spine-0")
        'switch'
        """
        if isinstance(device_id, str):
            m = kinds.numbered(device_id)
            if m:
                kind, n = m
                limit = self.num_hosts if KINDS[kind].per == "host" else self.num_gpus
                if n < limit:
                    return kind
            elif device_id in self._sw_index:
                return "switch"
            elif kinds.is_kind(device_id, "link"):
                ends = kinds.link_ends(device_id)
                if len(ends) == 2 and self._has_link(ends[0], ends[1]):
                    return "link"
        raise TopologyError(f"unknown device {device_id!r} in topology {self.name!r}")

    def __contains__(self, device_id: object) -> bool:
        try:
            self.kind_of(device_id)  # type: ignore[arg-type]
        except TopologyError:
            return False
        return True

    def _rank(self, rank: int) -> int:
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)):
            raise TopologyError(f"GPU rank {rank!r} is not an integer")
        if not 0 <= rank < self.num_gpus:
            raise TopologyError(f"GPU rank {rank} is outside 0..{self.num_gpus - 1} ({self.name})")
        return int(rank)

    def host_of(self, rank: int) -> int:
        """Host index of GPU ``rank``.

        >>> from holmes.topology import rail_optimized
        >>> rail_optimized(16).host_of(9)
        1
        """
        return self._rank(rank) // self.gpus_per_host

    def hosts_of(self, ranks: Any) -> np.ndarray:
        """Host index of each GPU rank in ``ranks`` (an int array; :meth:`host_of` for many).

        >>> from holmes.topology import rail_optimized
        >>> rail_optimized(16).hosts_of(np.arange(16)).tolist()[6:10]
        [0, 0, 1, 1]
        """
        r = np.asarray(ranks, dtype=np.int64)
        if r.size and (r.min() < 0 or r.max() >= self.num_gpus):
            self._rank(int(r[(r < 0) | (r >= self.num_gpus)][0]))  # raises, naming it
        return r // self.gpus_per_host

    def nic_of(self, rank: int) -> str:
        """NIC id of GPU ``rank`` (``nic:<rank>``)."""
        return kinds.nic(self._rank(rank))

    def leaf_of(self, rank: int) -> str:
        """Id of the switch GPU ``rank``'s NIC is cabled to.

        >>> from holmes.topology import rail_optimized
        >>> rail_optimized(16).leaf_of(9)
        'switch:leaf-1'
        """
        i = int(self._nic_leaf[self._rank(rank)])
        if i < 0:
            raise TopologyError(f"{kinds.nic(rank)} is not connected to any switch in {self.name!r}")
        return self._sw_ids[i]

    @property
    def switches(self) -> list[str]:
        """Switch ids, sorted."""
        return list(self._sw_ids)

    def devices(self, kind: str | None = None) -> list[str]:
        """All device ids, or those of one kind (see :data:`DEVICE_KINDS`).

        >>> from holmes.topology import rail_optimized
        >>> rail_optimized(8, num_spines=1).devices("host"), len(rail_optimized(8).devices("link"))
        (['host:0'], 72)
        """
        if kind is not None and kind not in DEVICE_KINDS:
            raise ConfigError(f"unknown device kind {kind!r}; expected one of {', '.join(DEVICE_KINDS)}")
        if self._devices is None:
            self._devices = [d for k in KINDS.values() for d in self._members(k)]
        if kind is None:
            return list(self._devices)
        return self._members(KINDS[kind])

    def _members(self, kind: DeviceKind) -> list[str]:
        """The ids of one kind's members, numbered by rank, by host, by name or by cable."""
        if kind.per == "rank":
            return [kind.id(r) for r in range(self.num_gpus)]
        if kind.per == "host":
            return [kind.id(h) for h in range(self.num_hosts)]
        if kind.per == "name":
            return list(self._sw_ids)
        return sorted(kinds.link(a, b) for a, b in self._links)

    # ------------------------------------------------------------------ routing
    def _switch_graph(self) -> None:
        from scipy.sparse import csr_matrix

        n = len(self._sw_ids)
        rows = [a for a, b in self._sw_edges] + [b for a, b in self._sw_edges]
        cols = [b for a, b in self._sw_edges] + [a for a, b in self._sw_edges]
        data = np.ones(len(rows), dtype=np.float64)
        self._csr = csr_matrix((data, (rows, cols)), shape=(n, n))
        self._csr.sort_indices()
        self._nbrs = [self._csr.indices[self._csr.indptr[i] : self._csr.indptr[i + 1]] for i in range(n)]

    def _dist_to(self, t: int) -> np.ndarray:
        row = self._dist_rows.get(t)
        if row is None:
            from scipy.sparse.csgraph import shortest_path

            if self._csr is None:
                self._switch_graph()
            row = shortest_path(self._csr, directed=False, unweighted=True, indices=t)
            self._dist_rows[t] = row
        return row

    def switch_route(self, src: str, dst: str, key: tuple[int, int] = (0, 0)) -> tuple[str, ...]:
        """Switches on the route from switch ``src`` to ``dst`` (both included).

        ``key`` selects among equal-cost paths (see the module notes); :meth:`path` passes
        ``(min(a, b), max(a, b))`` of the GPU pair.

        >>> from holmes.topology import rail_optimized
        >>> rail_optimized(16, num_spines=1).switch_route("switch:leaf-0", "switch:leaf-1")
        ('switch:leaf-0', 'switch:spine-0', 'switch:leaf-1')
        """
        for s in (src, dst):
            if s not in self._sw_index:
                raise TopologyError(f"unknown switch {s!r} in topology {self.name!r}")
        idx = self._route(self._sw_index[src], self._sw_index[dst], *key)
        return tuple(self._sw_ids[i] for i in idx)

    def _route(self, s: int, t: int, lo: int, hi: int) -> list[int]:
        if s == t:
            return [s]
        dist = self._dist_to(t)
        d = dist[s]
        if not np.isfinite(d):
            raise TopologyError(f"no route between {self._sw_ids[s]} and {self._sw_ids[t]} in {self.name!r}")
        route = [s]
        cur, hop = s, 0
        nbrs = self._nbrs
        assert nbrs is not None
        while cur != t:
            nb = nbrs[cur]
            cand = nb[dist[nb] == d - 1]
            cur = int(cand[_mix64(lo, hi, hop) % len(cand)]) if len(cand) > 1 else int(cand[0])
            route.append(cur)
            d -= 1
            hop += 1
        return route

    def _compute_path(self, lo: int, hi: int) -> tuple[str, ...]:
        g = self.gpus_per_host
        if lo // g == hi // g:
            return (kinds.nvswitch(lo // g),)
        sl, sh = int(self._nic_leaf[lo]), int(self._nic_leaf[hi])
        for r, s in ((lo, sl), (hi, sh)):
            if s < 0:
                raise TopologyError(f"{kinds.nic(r)} is not connected to any switch in {self.name!r}")
        ids = self._sw_ids
        na, nb = kinds.nic(lo), kinds.nic(hi)
        out = [na, kinds.link(na, ids[sl])]
        prev = None
        for i in self._route(sl, sh, lo, hi):
            if prev is not None:
                out.append(kinds.link(ids[prev], ids[i]))
            out.append(ids[i])
            prev = i
        out += [kinds.link(ids[sh], nb), nb]
        return tuple(out)

    def path(self, a: int, b: int) -> tuple[str, ...]:
        """Devices a transfer from GPU ``a`` to GPU ``b`` crosses, in order, GPUs excluded.

        Same host: ``("nvswitch:<host>",)``. Different hosts: the source NIC, its cable, the
        switches and the cables between them, the destination cable and NIC. ``a == b`` gives
        ``()``. Symmetric: ``path(b, a) == path(a, b)[::-1]``.

        >>> from holmes.topology import rail_optimized
        >>> rail_optimized(16, num_spines=1).path(9, 0)[2:5]
        ('switch:leaf-1', 'link:switch:leaf-1|switch:spine-0', 'switch:spine-0')
        """
        a, b = self._rank(a), self._rank(b)
        if a == b:
            return ()
        if a < b:
            return self._path_cached(a, b)
        return self._path_cached(b, a)[::-1]

    # ------------------------------------------------------------------ decay
    def _downstream_counts(self) -> np.ndarray:
        """NICs below every switch: reachable by strictly descending tiers (NIC tier 0)."""
        if self._sw_nics is not None:
            return self._sw_nics
        n = len(self._sw_ids)
        if self._csr is None:
            self._switch_graph()
        nbrs = self._nbrs
        assert nbrs is not None
        tier = np.full(n, np.inf)
        frontier = sorted({int(i) for i in self._nic_leaf if i >= 0})
        tier[frontier] = 1
        level = 1
        while frontier:
            nxt = []
            for i in frontier:
                for j in nbrs[i]:
                    if tier[j] == np.inf:
                        tier[j] = level + 1
                        nxt.append(int(j))
            frontier, level = nxt, level + 1
        bits: list[int] = [0] * n
        attached = self._nic_leaf >= 0
        for i in np.unique(self._nic_leaf[attached]):
            mask = np.zeros(self.num_gpus, dtype=bool)
            mask[(self._nic_leaf == i)] = True
            bits[int(i)] = int.from_bytes(np.packbits(mask, bitorder="little").tobytes(), "little")
        for i in sorted((i for i in range(n) if np.isfinite(tier[i])), key=lambda i: tier[i]):
            for j in nbrs[i]:
                if tier[j] < tier[i]:
                    bits[i] |= bits[int(j)]
        self._sw_nics = np.array([b.bit_count() for b in bits], dtype=np.int64)
        return self._sw_nics

    def downstream_nics(self, device_id: str) -> int:
        """The paper's C(d): number of NICs below a device.

        gpu, nic and NIC cables -> 1; host and nvswitch -> GPUs on the host; a switch -> NICs
        reachable from it by strictly descending tiers (tier = hop distance from the nearest NIC,
        so a leaf counts its NICs and a spine every NIC under its leaves); a switch-switch cable
        -> the smaller count of its two ends (the NICs under its lower end).

        >>> from holmes.topology import rail_optimized
        >>> t = rail_optimized(64, hosts_per_pod=4)
        >>> [t.downstream_nics(d) for d in ("nic:3", "switch:leaf-3", "switch:spine-0", "nvswitch:0")]
        [1, 4, 64, 8]
        """
        kind = self.kind_of(device_id)
        if KINDS[kind].per == "rank":
            return 1
        if KINDS[kind].per == "host":
            h = kinds.number(device_id)
            return min(self.gpus_per_host, self.num_gpus - h * self.gpus_per_host)
        counts = self._downstream_counts()
        if kind == "switch":
            return int(counts[self._sw_index[device_id]])
        return min(1 if kinds.is_kind(x, "nic") else int(counts[self._sw_index[x]])
                   for x in kinds.link_ends(device_id))

    def decay(self, device_id: str, eps: float = 1e-6) -> float:
        """The topology decay H(d) in (0, 1]; see :func:`decay_factor` for the rule.

        >>> from holmes.topology import rail_optimized
        >>> t = rail_optimized(512)
        >>> t.decay("nic:0"), t.decay("nvswitch:0"), round(t.decay("switch:leaf-0"), 3)
        (1.0, 1.0, 0.464)
        """
        return decay_factor(self.downstream_nics(device_id), eps)

    # ------------------------------------------------------------------ files
    def to_dict(self, compact: bool = False) -> dict:
        """The topology.json object (schema holmes.topology/1).

        ``compact``: the NIC cables as one switch index per GPU (``nic_switch``) and the
        switch-switch cables as index pairs (``switch_links``) instead of one id pair per cable
        (``links``) -- for large clusters: a 131,072-GPU rail-optimized cluster reads in a tenth
        of the time. Holmes reads both forms.

        >>> from holmes.topology import rail_optimized
        >>> t = rail_optimized(16)
        >>> d = t.to_dict(compact=True)
        >>> d["nic_switch"][:3], len(d["switch_links"]), ClusterTopology.from_dict(d) == t
        ([0, 1, 2], 64, True)
        """
        return topology_dict(self, compact)

    @classmethod
    def from_dict(cls, data: object, source: str = "<dict>") -> ClusterTopology:
        """Build a topology from a topology.json object; errors name ``source``.

        >>> from holmes.topology import rail_optimized
        >>> t = rail_optimized(16)
        >>> ClusterTopology.from_dict(t.to_dict()) == t
        True
        """
        return parse_topology(cls, data, source)

    @classmethod
    def from_graph(
        cls, graph: nx.Graph, num_gpus: int, gpus_per_host: int = 8, *, name: str = "cluster"
    ) -> ClusterTopology:
        """Build a custom topology from a networkx graph whose nodes are ``nic:<g>`` and
        ``switch:<name>`` ids and whose edges are cables.

        >>> import networkx as nx
        >>> g = nx.Graph([("nic:0", "switch:s"), ("nic:1", "switch:s")])
        >>> ClusterTopology.from_graph(g, 2, 1).path(0, 1)[2]
        'switch:s'
        """
        switches = [n for n in graph.nodes if isinstance(n, str) and kinds.is_kind(n, "switch")]
        return cls(num_gpus, gpus_per_host, switches, list(graph.edges()), name=name, kind="custom")

    def save(self, path: str | os.PathLike[str], compact: bool | None = None) -> None:
        """Write topology.json; ``compact`` (default: from :data:`COMPACT_FROM_GPUS` GPUs on) in
        the compact form of :meth:`to_dict`, on one line."""
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(self.to_json(compact))

    def to_json(self, compact: bool | None = None) -> str:
        """The text of topology.json (see :meth:`save`)."""
        return topology_text(self, compact)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ClusterTopology:
        """Read a topology.json; any problem raises :class:`TopologyError` naming the file.

        Read through :func:`holmes.limits.read_json_capped`: a regular file only (a FIFO or
        ``/dev/zero`` is refused, not read forever), at most ``HOLMES_MAX_JSON_BYTES``."""
        from holmes.limits import read_json_capped

        data = read_json_capped(path, error=TopologyError, what="topology file")
        topo = cls.from_dict(data, source=str(path))
        logger.debug("loaded topology %s from %s", topo, path)
        return topo

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        for key in ("_path_cached", "_csr", "_nbrs", "_dist_rows", "_sw_nics", "_devices", "_graph", "_sw_pairs"):
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict) -> None:
        for old, new in (("_links", "_links_l"), ("_link_set", "_link_set_s")):  # pickled before the compact form
            if old in state:
                state[new] = state.pop(old)
        self.__dict__.update(state)
        self._nbrs, self._csr, self._sw_nics, self._devices, self._graph = None, None, None, None, None
        self._sw_pairs = None
        self._dist_rows = {}
        self._path_cached = functools.lru_cache(maxsize=1 << 18)(self._compute_path)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ClusterTopology):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"ClusterTopology(name={self.name!r}, kind={self.kind!r}, num_gpus={self.num_gpus}, "
            f"gpus_per_host={self.gpus_per_host}, switches={len(self._sw_ids)}, "
            f"links={self.num_links})"
        )


def load_topology(path: str | os.PathLike[str]) -> ClusterTopology:
    """Read a topology.json (same as :meth:`ClusterTopology.load`)."""
    return ClusterTopology.load(path)
