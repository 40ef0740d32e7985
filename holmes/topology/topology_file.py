"""topology.json on disk: its schema (pydantic, at the edge), its long and compact forms, and the
parsing of either into a :class:`~holmes.topology.cluster.ClusterTopology` (which imports this module).

The long form lists every cable as a pair of device ids; the compact form (large clusters)
gives each NIC's switch as an index into ``switches`` (``nic_switch``) and the switch-switch
cables as index pairs (``switch_links``). docs/formats.md describes both.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError

from holmes.errors import TopologyError
from holmes.topology import kinds

__all__ = ["TOPOLOGY_SCHEMA", "COMPACT_FROM_GPUS", "topology_dict", "topology_text", "parse_topology", "add_compact"]

#: Schema tag of topology.json.
TOPOLOGY_SCHEMA = "holmes.topology/1"
#: clusters of this many GPUs and more are saved in the compact form (:meth:`ClusterTopology.to_dict`);
#: smaller ones in the long form, a cable per line, readable by hand and by older versions of Holmes
COMPACT_FROM_GPUS = 8192


class _TopologyFile(BaseModel):
    """topology.json, schema holmes.topology/1."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    schema_: Literal["holmes.topology/1"] = Field(alias="schema")
    name: StrictStr = "cluster"
    kind: Literal["rail-optimized", "fat-tree", "custom"] = "custom"
    gpus_per_host: StrictInt = Field(8, ge=1)
    num_gpus: StrictInt = Field(ge=1)
    switches: list[StrictStr]
    links: list[tuple[StrictStr, StrictStr]] = Field(default_factory=list)
    #: the compact form (large clusters): NIC ``g``'s cable goes to ``switches[nic_switch[g]]`` (-1: none)
    nic_switch: list[StrictInt] | None = None
    #: the compact form: switch-switch cables as pairs of indices into ``switches``
    switch_links: list[tuple[StrictInt, StrictInt]] | None = None


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "<root>"
        if err["type"] == "extra_forbidden":
            parts.append(f"unknown key {loc!r}")
        elif err["type"] == "missing":
            parts.append(f"missing key {loc!r}")
        else:
            parts.append(f"key {loc!r}: {err['msg']}")
    return "; ".join(parts)


def topology_dict(topo: Any, compact: bool = False) -> dict:
    """The topology.json object of ``topo`` (:meth:`ClusterTopology.to_dict`)."""
    head = {"schema": TOPOLOGY_SCHEMA, "name": topo.name, "kind": topo.kind, "gpus_per_host": topo.gpus_per_host,
            "num_gpus": topo.num_gpus, "switches": list(topo._sw_ids)}
    if compact:
        pairs = sorted((min(i, j), max(i, j)) for i, j in topo._sw_edges)
        return {**head, "nic_switch": topo._nic_leaf.tolist(), "switch_links": [list(p) for p in pairs]}
    return {**head, "links": [list(link) for link in sorted(topo._links)]}


def topology_text(topo: Any, compact: bool | None = None) -> str:
    """The text of topology.json: compact (one line) from :data:`COMPACT_FROM_GPUS` GPUs on
    unless ``compact`` says otherwise."""
    if compact is None:
        compact = topo.num_gpus >= COMPACT_FROM_GPUS
    if compact:
        return json.dumps(topology_dict(topo, compact=True), separators=(",", ":"), allow_nan=False) + "\n"
    return json.dumps(topology_dict(topo), indent=1, allow_nan=False) + "\n"


def parse_topology(cls: Any, data: object, source: str = "<dict>") -> Any:
    """Validate a topology.json object and build ``cls`` from it; errors name ``source``."""
    if not isinstance(data, dict):
        raise TopologyError(f"{source}: topology must be a JSON object, got {type(data).__name__}")
    try:
        spec = _TopologyFile.model_validate(data)
    except ValidationError as exc:
        raise TopologyError(f"{source}: invalid topology: {_validation_message(exc)}") from None
    dup = len(spec.switches) != len(set(spec.switches))
    if dup:
        seen: set[str] = set()
        first = next(s for s in spec.switches if s in seen or seen.add(s))  # type: ignore[func-returns-value]
        raise TopologyError(f"{source}: key 'switches': duplicate switch {first!r}")
    try:
        return cls(
            spec.num_gpus, spec.gpus_per_host, spec.switches, spec.links,
            name=spec.name, kind=spec.kind, nic_switch=spec.nic_switch, switch_links=spec.switch_links,
        )
    except TopologyError as exc:
        raise TopologyError(f"{source}: {exc}") from None


def add_compact(topo: Any, switches: list[str], nic_leaf: np.ndarray, sw_edges: list[tuple[int, int]],
                nic_switch: Sequence[int] | np.ndarray | None,
                switch_links: Sequence[Sequence[int]] | np.ndarray | None) -> None:
    """Add to ``topo`` (being built) the cables of the compact form (indices into ``switches`` as given), checked as
    arrays: index range, one cable per NIC, no self or duplicate cable."""
    pos = np.array([topo._sw_index[s] for s in switches], dtype=np.int64)
    n = len(switches)
    if nic_switch is not None:
        v = np.asarray(nic_switch)
        if v.ndim != 1 or v.shape[0] != topo.num_gpus or (v.size and v.dtype.kind not in "iu"):
            raise TopologyError(f"nic_switch must list one switch index per GPU ({topo.num_gpus} integers)")
        v = v.astype(np.int64, copy=False)
        bad = np.flatnonzero((v < -1) | (v >= n))
        if bad.size:
            raise TopologyError(f"nic_switch[{int(bad[0])}] = {int(v[bad[0]])} is not an index into "
                                f"the {n} switches (or -1: no cable)")
        has = v >= 0
        twice = np.flatnonzero(has & (nic_leaf >= 0))
        if twice.size:
            g = int(twice[0])
            raise TopologyError(f"{kinds.nic(g)} has more than one link (to {topo._sw_ids[nic_leaf[g]]} and "
                                f"{switches[v[g]]})")
        nic_leaf[has] = pos[v[has]]
    if switch_links is not None:
        e = np.asarray(switch_links)
        if e.size == 0:
            e = np.zeros((0, 2), dtype=np.int64)
        if e.ndim != 2 or e.shape[1] != 2 or e.dtype.kind not in "iu":
            raise TopologyError("switch_links must be pairs of switch indices")
        e = e.astype(np.int64, copy=False)
        bad = np.flatnonzero(((e < 0) | (e >= n)).any(axis=1))
        if bad.size:
            raise TopologyError(f"switch_links[{int(bad[0])}] = {e[bad[0]].tolist()} is not a pair of indices "
                                f"into the {n} switches")
        e = pos[e]
        same = np.flatnonzero(e[:, 0] == e[:, 1])
        if same.size:
            a = topo._sw_ids[e[same[0], 0]]
            raise TopologyError(f"link {a!r}-{a!r} connects a device to itself")
        lo, hi = np.minimum(e[:, 0], e[:, 1]), np.maximum(e[:, 0], e[:, 1])
        key = np.concatenate([lo * n + hi, np.array([min(a, b) * n + max(a, b) for a, b in sw_edges],
                                                    dtype=np.int64)])
        uniq, counts = np.unique(key, return_counts=True)
        if (counts > 1).any():
            k = int(uniq[np.argmax(counts > 1)])
            raise TopologyError(f"duplicate link {kinds.link(topo._sw_ids[k // n], topo._sw_ids[k % n])!r}")
        sw_edges.extend(zip(e[:, 0].tolist(), e[:, 1].tolist()))
