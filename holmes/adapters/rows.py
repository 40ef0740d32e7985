"""One rank's converted rows before ``op_index`` / ``seq`` exist (:class:`RankRows`), and the
CommOps ``seq`` assignment."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from holmes.io.schema import P2P_OPS

__all__ = ["RankRows", "assign_seq", "group_cumcount"]


class RankRows:
    """Column lists of one rank's ops, in issue order, before ``op_index`` / ``seq`` exist.

    ``seq`` may be given per row (the framework's own sequence number, e.g. FR
    ``collective_seq_id`` or Kineto ``Seq``) or left as -1 to be assigned by order.
    """

    BASE = ("iteration", "comm_id", "op", "peer", "nbytes", "start_ns", "end_ns", "seq")

    def __init__(self, rank: int, extras: Sequence[str] = ()) -> None:
        self.rank = int(rank)
        self.cols: dict[str, list[Any]] = {c: [] for c in (*self.BASE, *extras)}

    def __len__(self) -> int:
        return len(self.cols["op"])

    def append(self, **row: Any) -> None:
        for c, lst in self.cols.items():
            lst.append(row.get(c, -1 if c == "seq" else None))


def group_cumcount(codes: np.ndarray) -> np.ndarray:
    """k-th occurrence (0-based) of each row's code, in row order; vectorized."""
    n = len(codes)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(codes, kind="stable")
    sc = codes[order]
    starts = np.r_[0, np.flatnonzero(sc[1:] != sc[:-1]) + 1]
    run_start = np.repeat(starts, np.diff(np.r_[starts, n]))
    out = np.empty(n, dtype=np.int64)
    out[order] = np.arange(n) - run_start
    return out


def assign_seq(comm_id: np.ndarray, op: np.ndarray, peer: np.ndarray, given: np.ndarray | None = None) -> np.ndarray:
    """CommOps ``seq`` of one rank's rows (already in issue order).

    Collectives: the k-th collective on ``comm_id``; P2P: the k-th op of that direction with that
    ``peer`` on ``comm_id``. Rows whose ``given`` value is >= 0 keep it (framework seq numbers).

    Examples
    --------
    >>> assign_seq(np.array(["tp", "tp", "pp", "pp", "tp"]), np.array(["all_reduce", "all_gather", "send", "send", "all_reduce"]),
    ...            np.array([-1, -1, 4, 4, -1])).tolist()
    [0, 1, 0, 1, 2]
    """
    comm_id = np.asarray(comm_id, dtype=object)
    op = np.asarray(op, dtype=object)
    peer = np.asarray(peer, dtype=np.int64)
    is_p2p = np.isin(op, P2P_OPS)
    kind = np.where(is_p2p, op, "coll")
    pk = np.where(is_p2p, peer, -1)
    keys = np.char.add(np.char.add(comm_id.astype(str), "|"), np.char.add(kind.astype(str), np.char.add("|", pk.astype(str))))
    _, codes = np.unique(keys, return_inverse=True)
    seq = group_cumcount(codes.ravel())
    if given is not None:
        g = np.asarray(given, dtype=np.int64)
        seq = np.where(g >= 0, g, seq)
    return seq
