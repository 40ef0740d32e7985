"""Role peers and work peers: the ranks that do the same work as a rank.

*Work peers* are every rank of the same pipeline stage, across tensor, context and expert
positions and data-parallel replicas: Megatron splits a stage's work evenly over its TP/CP/EP
positions, and the replicas run the same program, so their compute between the same pair of
operators is comparable. A job with 2 replicas, or 1 (whose peers are the TP/CP positions),
still has peers; only a stage of one rank has none. Ranks whose logs issue a different number of
operators per iteration are not peers even in one stage (a converted trace without communicator
kinds has every rank in "stage 0"). *Role peers* (below) are the narrower data-parallel groups
the what-if decomposition by replica uses.

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
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from holmes.localize.evidence.p2p import p2p_stages

__all__ = ["Roles", "faster_half_mean", "kind_and_ranks", "p2p_stages"]


def faster_half_mean(v: np.ndarray) -> np.ndarray:
    """Per column, the mean of the lower half of the rows (at least one row): the work of a group's
    faster members, which a slow half of the group (a host's GPUs) cannot pull up.

    >>> faster_half_mean(np.array([[1.0, 4.0], [3.0, 2.0], [9.0, 9.0], [8.0, 3.0]])).tolist()
    [2.0, 2.5]
    """
    k = max(1, v.shape[0] // 2)
    return np.sort(v, axis=0)[:k].mean(axis=0)


def kind_and_ranks(c: Any) -> tuple[str, Any]:
    """A communicator's kind and member ranks, from a :class:`~holmes.topology.layout.Communicator`
    or a ``(kind, ranks)`` pair."""
    return (c.kind, c.ranks) if hasattr(c, "kind") else (c[0], c[1])


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
    work_members : list of numpy.ndarray
        Work peer groups: the ranks of one stage (see the module docstring), ascending.
    work_group : numpy.ndarray of int
        Per rank, the index of its work peer group.
    """

    group: np.ndarray
    members: list[np.ndarray]
    stage: np.ndarray
    replica: np.ndarray
    work_members: list[np.ndarray] = field(default_factory=list)
    work_group: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @classmethod
    def from_communicators(cls, communicators: Mapping[str, Any], world_size: int) -> "Roles":
        """Roles from ``comm_id -> Communicator(kind, ranks)`` (or ``(kind, ranks)`` pairs)."""
        W = int(world_size)
        group = np.full(W, -1, dtype=np.int64)
        replica = np.zeros(W, dtype=np.int64)
        stage = np.zeros(W, dtype=np.int64)
        members: list[np.ndarray] = []
        for c in communicators.values():
            kind, ranks = kind_and_ranks(c)
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
        roles = cls(group, members, stage, replica)
        roles.split_work(stage)
        return roles

    def split_work(self, key: np.ndarray) -> None:
        """Set the work peer groups: ranks with the same ``key`` (their stage, or a finer signature)."""
        key = np.asarray(key)
        uniq, inv = np.unique(key, return_inverse=True, axis=0) if key.ndim > 1 else np.unique(key, return_inverse=True)
        inv = np.asarray(inv).ravel()
        self.work_group = inv.astype(np.int64)
        order = np.argsort(inv, kind="stable")
        bounds = np.r_[0, np.cumsum(np.bincount(inv, minlength=len(uniq)))]
        self.work_members = [order[bounds[g]:bounds[g + 1]] for g in range(len(uniq))]

    def work_peers_of(self, rank: int) -> np.ndarray:
        """The work peer group of ``rank`` (itself included)."""
        return self.work_members[int(self.work_group[int(rank)])]

    @property
    def num_groups(self) -> int:
        return len(self.members)

    @property
    def num_stages(self) -> int:
        return int(self.stage.max()) + 1 if self.stage.size else 0

    def work_reference(self, values: np.ndarray) -> np.ndarray:
        """Per rank and column, :func:`faster_half_mean` of ``values`` (ranks x columns) over its
        work peer group (a rank alone in its group keeps its own values)."""
        out = np.asarray(values, dtype=np.float64).copy()
        for m in self.work_members:
            if m.size > 1:
                out[m] = faster_half_mean(out[m])
        return out

    def peers_of(self, rank: int) -> np.ndarray:
        """The role group of ``rank`` (itself included)."""
        return self.members[int(self.group[int(rank)])]


