"""Role peers: the ranks that do the same work as a rank, in the other data-parallel replicas.

Two ranks are *role peers* when they hold the same pipeline stage and the same tensor / context /
expert position in different data-parallel replicas: they run the same program (the same
operators, the same compute between them), so a rank that keeps making others wait more than its
role peers do is a straggler, while a stage that is slow on every replica is an imbalance of the
job, not a device (Minder compares each machine with its peers the same way).

The roles are read from the job's communicators, never from its size: the members of a
data-parallel communicator (kind ``dp``) are exactly a set of role peers; a rank's *stage* is its
position in its pipeline communicator (kind ``pp``, members listed in stage order) and its
*replica* its position in its data-parallel communicator. A rank in no data-parallel communicator
is its own role group of one (it has no peers to compare with).

Examples
--------
>>> from holmes.topology import ParallelLayout
>>> roles = Roles.from_communicators(ParallelLayout(tp=2, pp=2, dp=4).communicators(), 16)
>>> roles.peers_of(5).tolist(), int(roles.stage[5]), int(roles.replica[5])
([1, 3, 5, 7], 0, 2)
>>> roles.num_groups, roles.num_stages
(4, 2)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Roles"]


@dataclass
class Roles:
    """Role groups, stages and replicas of every rank of a job.

    Attributes
    ----------
    group : numpy.ndarray of int
        Per rank, the id of its role group (ranks with the same id are role peers).
    members : list of numpy.ndarray
        Per role group, its ranks (replica order).
    stage : numpy.ndarray of int
        Per rank, its pipeline stage (0 without pipeline communicators).
    replica : numpy.ndarray of int
        Per rank, its data-parallel replica (its position in its role group).
    """

    group: np.ndarray
    members: list[np.ndarray]
    stage: np.ndarray
    replica: np.ndarray

    @classmethod
    def from_communicators(cls, communicators: Mapping[str, Any], world_size: int) -> "Roles":
        """Roles from ``comm_id -> Communicator(kind, ranks)`` (or ``(kind, ranks)`` pairs)."""
        W = int(world_size)
        group = np.full(W, -1, dtype=np.int64)
        replica = np.zeros(W, dtype=np.int64)
        stage = np.zeros(W, dtype=np.int64)
        members: list[np.ndarray] = []
        for c in communicators.values():
            kind, ranks = (c.kind, c.ranks) if hasattr(c, "kind") else (c[0], c[1])
            rk = np.asarray([int(r) for r in ranks if 0 <= int(r) < W], dtype=np.int64)
            if kind == "pp" and rk.size:
                stage[rk] = np.arange(rk.size)
            elif kind == "dp" and rk.size and (group[rk] < 0).all():
                group[rk] = len(members)
                replica[rk] = np.arange(rk.size)
                members.append(rk)
        for r in np.flatnonzero(group < 0).tolist():
            group[r] = len(members)
            members.append(np.array([r], dtype=np.int64))
        return cls(group, members, stage, replica)

    @property
    def num_groups(self) -> int:
        return len(self.members)

    @property
    def num_stages(self) -> int:
        return int(self.stage.max()) + 1 if self.stage.size else 0

    def peers_of(self, rank: int) -> np.ndarray:
        """The role group of ``rank`` (itself included)."""
        return self.members[int(self.group[int(rank)])]

    def group_median(self, values: np.ndarray) -> np.ndarray:
        """Per rank and column, the median of ``values`` (ranks x columns) over its role group."""
        out = np.empty_like(values, dtype=np.float64)
        for m in self.members:
            out[m] = np.nanmedian(values[m], axis=0) if m.size > 1 else values[m]
        return out
