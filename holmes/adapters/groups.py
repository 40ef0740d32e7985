"""The process-group registry of a conversion (group name -> comm_id, kind and members)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from holmes.errors import ConvertError
from holmes.limits import max_world_size
from holmes.topology import kind_from_group_name

__all__ = ["GroupRegistry"]


def _rank(r: Any) -> int:
    if isinstance(r, bool) or isinstance(r, float) and not r.is_integer():
        raise TypeError(r)
    return int(r)


class GroupRegistry:
    """Process groups seen in the input, keyed by the framework's group name.

    ``comm_id`` is ``"<kind>-<name>"`` (e.g. ``"pp-43"``), identical on every member because it
    is derived from the group's name, which frameworks keep equal on all members.

    Examples
    --------
    >>> reg = GroupRegistry()
    >>> reg.add("43", [0, 4, 8, 12], "PIPELINE_MODEL_PARALLEL_GROUP")
    'pp-43'
    >>> reg.add("43", [12, 8, 4, 0], "PIPELINE_MODEL_PARALLEL_GROUP", source="_dump_12")
    'pp-43'
    >>> reg.communicators()["pp-43"]
    {'kind': 'pp', 'ranks': [0, 4, 8, 12], 'name': 'PIPELINE_MODEL_PARALLEL_GROUP'}
    """

    def __init__(self) -> None:
        self._by_key: dict[str, str] = {}
        self._groups: dict[str, dict[str, Any]] = {}

    def __contains__(self, key: object) -> bool:
        return str(key) in self._by_key

    def comm_id(self, key: Any) -> str:
        return self._by_key[str(key)]

    def ranks(self, key: Any) -> list[int]:
        """The group's ranks in the framework's order (local index -> global rank)."""
        return list(self._groups[self._by_key[str(key)]]["order"])

    def add(self, key: Any, ranks: Sequence[int], desc: str | None = None, *, kind: str | None = None,
            source: str | None = None, comm_id: str | None = None) -> str:
        """Register (or re-check) a group; returns its comm_id.

        Raises
        ------
        ConvertError
            The same group name was seen with another member set.
        """
        key = str(key)
        if desc is not None and not isinstance(desc, str):
            desc = str(desc)
        where = f"{source}: " if source else ""
        cap = max_world_size()
        try:
            order = [_rank(r) for r in ranks]
        except (TypeError, ValueError, OverflowError):
            raise ConvertError(f"{where}process group '{key}' has a rank that is not an integer: "
                               f"{list(ranks)[:8]!r}"[:300]) from None
        bad = [r for r in order if r < 0 or r >= cap]
        if bad:
            raise ConvertError(f"{where}process group '{key}' has rank {bad[0]} outside [0, {cap})")
        if len(order) > cap:
            raise ConvertError(f"{where}process group '{key}' lists more than {cap} ranks")
        members = sorted(set(order))
        if key in self._by_key:
            cid = self._by_key[key]
            g = self._groups[cid]
            if g["ranks"] != members:
                raise ConvertError(f"{where}process group '{key}' ({desc or g['name']}) has ranks {members} here "
                                   f"but {g['ranks']} elsewhere")
            if desc and not g["name"]:
                g["name"] = desc
            return cid
        k = kind or kind_from_group_name(desc or key)
        slug = re.sub(r"[^A-Za-z0-9_.:-]+", "_", key) or "g"
        cid = comm_id or f"{k}-{slug}"
        n = 1
        while cid in self._groups:
            n += 1
            cid = f"{k}-{slug}.{n}"
        self._by_key[key] = cid
        self._groups[cid] = {"kind": k, "ranks": members, "order": order, "name": desc}
        return cid

    def communicators(self, used: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
        """``job.json`` communicators (all registered groups, or only the ``used`` comm_ids)."""
        keep = None if used is None else set(used)
        out = {}
        for cid, g in self._groups.items():
            if keep is not None and cid not in keep:
                continue
            d: dict[str, Any] = {"kind": g["kind"], "ranks": list(g["ranks"])}
            if g["name"]:
                d["name"] = g["name"]
            out[cid] = d
        return out

    def max_rank(self) -> int:
        return max((max(g["ranks"]) for g in self._groups.values() if g["ranks"]), default=-1)
