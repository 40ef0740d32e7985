"""Device kinds and device ids: the one place that knows what ``gpu:5`` or
``link:nic:3|switch:leaf-0`` means.

A device id is ``KIND:NAME`` (``docs/formats.md``): ``gpu:<rank>``, ``nic:<rank>`` (one NIC per
GPU), ``host:<node>``, ``nvswitch:<node>`` (the intra-host fabric), ``switch:<name>`` and
``link:<id-a>|<id-b>`` (one cable, its two end ids sorted as strings). Each kind is a
:class:`DeviceKind` in :data:`KINDS`, which says

* how its members are numbered on a topology (``per``: one per rank, one per host, or named);
* which Beta prior of the device ranking applies to it (``prior``: a key of
  :data:`holmes.localize.evidence.ranking.DEFAULT_PRIOR`, Table 1 of the paper: a host is a CPU);
* whether it is a *point* device, one that a fault stays on, or one many others share
  (``point``; a cable is a point device when one of its ends is a NIC);
* whether a compute root cause lands on it (``compute``: a GPU, or its host).

Every module that builds an id or reads the kind out of one calls this module; adding a kind is
one :class:`DeviceKind` here (and, if a topology lists its members, one line in
:meth:`holmes.topology.ClusterTopology.devices`).

Examples
--------
>>> kind_of("switch:leaf-2"), number("host:3"), host(1), link("switch:leaf-0", "nic:3")
('switch', 3, 'host:1', 'link:nic:3|switch:leaf-0')
>>> [is_point(d) for d in ("gpu:3", "link:nic:2|switch:leaf-0", "host:1", "switch:spine-0")]
[True, True, False, False]
>>> prior_kind("host:0"), prior_kind("nvswitch:0"), prior_kind("pcie:0")
('cpu', 'other', 'other')
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

__all__ = ["DeviceKind", "KINDS", "DEVICE_KINDS", "kind_of", "is_kind", "name_of", "number", "numbered", "rank_of", "ranks_of", "gpu", "nic",
           "host", "nvswitch", "switch", "link", "link_ends", "is_nic_cable", "is_point", "prior_kind",
           "is_compute", "specificity"]


@dataclass(frozen=True)
class DeviceKind:
    """One kind of device.

    Attributes
    ----------
    name : str
        The id prefix (``gpu`` in ``gpu:5``).
    per : {"rank", "host", "name", "cable"}
        How a topology numbers its members: one per GPU rank, one per host, a switch's own name,
        or a cable's two ends.
    prior : str
        The key of the ranking's Beta prior table that applies to the kind.
    point : bool
        A device a fault stays on (a GPU, a NIC), not one many others share; a cable is a point
        device when one of its ends is a NIC (:func:`is_point`).
    compute : bool
        A compute root cause lands on it (its GPU, or the GPU's host).
    """

    name: str
    per: Literal["rank", "host", "name", "cable"]
    prior: str
    point: bool
    compute: bool

    def id(self, name: object) -> str:
        """The id of this kind's member ``name`` (``KINDS["gpu"].id(5)`` -> ``"gpu:5"``)."""
        return f"{self.name}:{name}"


#: The device kinds, in the order :meth:`holmes.topology.ClusterTopology.devices` lists them.
KINDS: dict[str, DeviceKind] = {k.name: k for k in (
    DeviceKind("gpu", "rank", prior="gpu", point=True, compute=True),
    DeviceKind("nic", "rank", prior="nic", point=True, compute=False),
    DeviceKind("host", "host", prior="cpu", point=False, compute=True),
    DeviceKind("nvswitch", "host", prior="other", point=False, compute=False),
    DeviceKind("switch", "name", prior="switch", point=False, compute=False),
    DeviceKind("link", "cable", prior="link", point=False, compute=False),
)}
#: The kind names, in :data:`KINDS` order.
DEVICE_KINDS: tuple[str, ...] = tuple(KINDS)
#: The prior of a kind :data:`KINDS` does not list.
OTHER_PRIOR = "other"

_NUMBERED = re.compile("(" + "|".join(k.name for k in KINDS.values() if k.per in ("rank", "host"))
                       + r"):(0|[1-9][0-9]*)")


def kind_of(device_id: str) -> str:
    """The kind part of a device id (``"switch:leaf-2"`` -> ``"switch"``); not checked against
    :data:`KINDS`."""
    return device_id.split(":", 1)[0]


def is_kind(device_id: object, kind: str) -> bool:
    """Whether ``device_id`` is a string id of kind ``kind`` (``is_kind("nic:3", "nic")``)."""
    return isinstance(device_id, str) and device_id.startswith(kind + ":")


def name_of(device_id: str) -> str:
    """The name part of a device id (``"switch:leaf-2"`` -> ``"leaf-2"``, ``"gpu:5"`` -> ``"5"``)."""
    return device_id.split(":", 1)[1]


def number(device_id: str) -> int:
    """The rank or host of a numbered id (``"gpu:5"`` -> 5); ``ValueError`` for a named one."""
    return int(name_of(device_id))


def numbered(device_id: object) -> tuple[str, int] | None:
    """``(kind, n)`` for a well-formed id of a kind numbered by rank or host (no sign, no leading
    zero), else None.

    >>> numbered("nvswitch:2"), numbered("gpu:05"), numbered("switch:leaf-0")
    (('nvswitch', 2), None, None)
    """
    m = _NUMBERED.fullmatch(device_id) if isinstance(device_id, str) else None
    return (m.group(1), int(m.group(2))) if m else None


def rank_of(device_id: str) -> int | None:
    """The rank of a device numbered by rank (``"nic:5"`` -> 5), else None.

    >>> rank_of("gpu:5"), rank_of("nic:5"), rank_of("host:5")
    (5, 5, None)
    """
    m = numbered(device_id)
    return m[1] if m is not None and KINDS[m[0]].per == "rank" else None


def ranks_of(device_id: str, gpus_per_host: int, world: int) -> list[int]:
    """The GPU ranks a device numbered by rank or host stands for (its rank, or its host's
    ranks below ``world``); ``[]`` for a switch, a cable or an id of no known kind.

    >>> ranks_of("nic:5", 4, 16), ranks_of("nvswitch:1", 4, 16), ranks_of("host:3", 4, 14), ranks_of("switch:s", 4, 16)
    ([5], [4, 5, 6, 7], [12, 13], [])
    """
    m = numbered(device_id)
    if m is None:
        return []
    kind, n = m
    if KINDS[kind].per == "rank":
        return [n]
    return list(range(n * gpus_per_host, min((n + 1) * gpus_per_host, world)))


def gpu(rank: int) -> str:
    """``gpu:<rank>``."""
    return f"gpu:{rank}"


def nic(rank: int) -> str:
    """``nic:<rank>``, the NIC of GPU ``rank``."""
    return f"nic:{rank}"


def host(node: int) -> str:
    """``host:<node>``."""
    return f"host:{node}"


def nvswitch(node: int) -> str:
    """``nvswitch:<node>``, the intra-host fabric of host ``node``."""
    return f"nvswitch:{node}"


def switch(name: str) -> str:
    """``switch:<name>``."""
    return f"switch:{name}"


def link(a: str, b: str) -> str:
    """Id of the cable between devices ``a`` and ``b`` (ends sorted as strings).

    >>> link("switch:leaf-0", "nic:3")
    'link:nic:3|switch:leaf-0'
    """
    return f"link:{a}|{b}" if a <= b else f"link:{b}|{a}"


def link_ends(device_id: str) -> list[str]:
    """The end ids of a cable id (``"link:nic:3|switch:leaf-0"`` -> ``["nic:3", "switch:leaf-0"]``)."""
    return device_id[len("link:"):].split("|")


def is_nic_cable(device_id: str) -> bool:
    """A cable with a NIC at one end (a NIC's own cable, not a switch's uplink)."""
    return kind_of(device_id) == "link" and any(kind_of(e) == "nic" for e in link_ends(device_id))


def is_point(device_id: str) -> bool:
    """A single device, not one many others share: a GPU, a NIC or a NIC's cable (not a host, an
    NVSwitch, a switch or a switch's uplink)."""
    kind = KINDS.get(kind_of(device_id))
    return kind is not None and (kind.point or is_nic_cable(device_id))


def is_compute(device_id: str) -> bool:
    """A device a compute root cause lands on: a GPU or a host."""
    kind = KINDS.get(kind_of(device_id))
    return kind is not None and kind.compute


def prior_kind(device_id: str) -> str:
    """The key of the ranking's prior table that applies to a device (host -> cpu, nvswitch or an
    unknown kind -> other)."""
    kind = KINDS.get(kind_of(device_id))
    return kind.prior if kind is not None else OTHER_PRIOR


def specificity(device_id: str) -> int:
    """How narrowly a network device points at a fault, most specific first: 0 a NIC, 1 a NIC's
    cable, 2 another cable, 3 a switch, an NVSwitch or anything else.

    >>> [specificity(d) for d in ("nic:3", "link:nic:3|switch:leaf-0", "link:switch:leaf-0|switch:spine-0",
    ...                           "switch:spine-0")]
    [0, 1, 2, 3]
    """
    kind = kind_of(device_id)
    if kind == "nic":
        return 0
    if kind == "link":
        return 1 if is_nic_cable(device_id) else 2
    return 3
