"""Cross-rank context of a job: evidence one rank's log cannot give alone.

A weak fault (a switch 1.6x slower for a few iterations, say) stretches the affected operators by
20-40 %, well inside the iteration-to-iteration noise of any single rank. But it stretches them on
*every* rank at once, in the same iterations, and on *every* member of the affected collective.
Averaged over ranks the noise cancels and the fault stands out. :class:`JobContext` collects that
evidence in one streaming pass over the ranks (memory grows with the number of iterations and of
logical operators, never with the number of ranks times their rows):

* per iteration, the mean over ranks of the rank's mean log-slowness in that iteration;
* per logical operator instance (a collective: ``(comm_id, seq)``; a P2P transfer:
  ``(comm_id, src, dst, seq)``), the mean log-slowness over the members seen.

Only durations are compared, never timestamps of two hosts, so clock offsets between hosts do not
matter. (Splitting a duration into the wait for the latest member and the transfer after it, from
the members' start times, was tried and measured no gain on the held-out jobs.)

The log-slowness of an op is ``log(duration / median duration of its position)`` on its own rank
(position: ``(op_index, comm_id, op)``), so ranks of different speeds and programs are comparable.
:meth:`JobContext.features` turns the context into :data:`CONTEXT_FEATURE_NAMES` for one rank's
rows; :func:`holmes.detect.operator_features` appends them to the per-rank features. Without a
context (one rank on its own) the same features are computed from that rank alone, and
``job_ranks`` tells the detector how much evidence there was.

Examples
--------
>>> from holmes.io.schema import ops_table
>>> def rank(r, slow_it):
...     d = [100 if it != slow_it else 140 for it in range(4)]
...     return ops_table(rank=[r] * 4, iteration=[0, 1, 2, 3], op_index=[0] * 4, comm_id=["dp-0"] * 4,
...                      seq=[0, 1, 2, 3], op=["all_reduce"] * 4, peer=[None] * 4, nbytes=[8] * 4,
...                      start_ns=[0, 1000, 2000, 3000], end_ns=[k * 1000 + x for k, x in enumerate(d)])
>>> ctx = JobContext.from_tables([rank(0, 2), rank(1, 2)])
>>> ctx.n_ranks
2
>>> F = ctx.features(rank(0, 2))
>>> round(float(F[2, CONTEXT_FEATURE_NAMES.index("inst_lr")]), 3)   # log(140 / 100)
0.336
>>> int(F[2, CONTEXT_FEATURE_NAMES.index("inst_members")])
2
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from holmes.errors import SchemaError
from holmes.io.schema import P2P_OPS

__all__ = ["JobContext", "CONTEXT_FEATURE_NAMES", "log_slowness"]

log = logging.getLogger(__name__)

#: columns appended to the per-rank features (see the module docstring)
CONTEXT_FEATURE_NAMES: tuple[str, ...] = (
    "job_iter_lr",   # cross-rank mean log-slowness of the op's iteration, minus its median over iterations
    "job_iter_z",    # the same in units of its spread over iterations (1.4826 MAD)
    "job_ranks",     # log2(1 + ranks that contributed to the iteration)
    "inst_lr",       # mean log-slowness of the op's instance over the members seen
    "inst_members",  # members of the instance seen
    "inst_dev",      # inst_lr minus its median at the op's position (over the rank's iterations)
    "inst_z",        # inst_dev / (1.4826 MAD of inst_lr at the position + 0.01)
)

_NEEDED = ("rank", "iteration", "op_index", "comm_id", "seq", "op", "peer", "start_ns", "end_ns")
_LR_CLIP = 9.0  # |log-slowness| bound (a factor of ~8000) so one broken row cannot dominate a mean


def _col(ops: pa.Table, name: str) -> np.ndarray:
    col = ops.column(name)
    if col.null_count and name != "peer":
        raise SchemaError(f"column '{name}' has {col.null_count} null value(s)")
    return np.asarray(col.to_numpy(zero_copy_only=False))


def _codes(ops: pa.Table, name: str) -> tuple[np.ndarray, list]:
    arr = ops.column(name).combine_chunks()
    if pa.types.is_dictionary(arr.type):
        arr = arr.cast(arr.type.value_type)
    enc = pc.dictionary_encode(arr)
    return np.asarray(enc.indices.to_numpy(zero_copy_only=False), dtype=np.int64), enc.dictionary.to_pylist()


def _position_key(ops: pa.Table) -> np.ndarray:
    """One int64 per row; rows of the same position ``(op_index, comm_id, op)`` share it."""
    ix = _col(ops, "op_index").astype(np.int64)
    cc, _ = _codes(ops, "comm_id")
    oc, _ = _codes(ops, "op")
    return (ix * (int(cc.max()) + 1) + cc) * (int(oc.max()) + 1) + oc


def _position_median(key: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Per row, the median of ``values`` over the rows with the same ``key``."""
    n = key.size
    order = np.lexsort((values, key))
    ks = key[order]
    bounds = np.r_[0, np.flatnonzero(ks[1:] != ks[:-1]) + 1, n]
    cnt = np.diff(bounds)
    v = values[order]
    mid = (v[bounds[:-1] + (cnt - 1) // 2] + v[bounds[:-1] + cnt // 2]) / 2.0
    out = np.empty(n)
    out[order] = np.repeat(mid, cnt)
    return out


def log_slowness(ops: pa.Table) -> np.ndarray:
    """``log(duration / median duration of the row's position)`` for every row of one rank's table.

    Position: ``(op_index, comm_id, op)``. Clipped to +-9; zero durations count as 1 ns.
    """
    if ops.num_rows == 0:
        return np.zeros(0)
    dur = np.maximum(_col(ops, "end_ns").astype(np.int64) - _col(ops, "start_ns").astype(np.int64), 1)
    dur = dur.astype(np.float64)
    return np.clip(np.log(dur / _position_median(_position_key(ops), dur)), -_LR_CLIP, _LR_CLIP)


class _Instances:
    """Per logical stream ``(comm_id, src, dst)`` growable sums/counts indexed by ``seq``."""

    def __init__(self) -> None:
        self.ids: dict[tuple[str, int, int], int] = {}
        self.sums: list[np.ndarray] = []
        self.counts: list[np.ndarray] = []

    def stream_ids(self, ops: pa.Table, create: bool = True) -> np.ndarray:
        """Stream id of every row (-1: unknown stream, when not ``create``)."""
        cc, comms = _codes(ops, "comm_id")
        oc, names = _codes(ops, "op")
        p2p = np.array([o in P2P_OPS for o in names], dtype=bool)[oc] if names else np.zeros(0, bool)
        rank = _col(ops, "rank").astype(np.int64)
        peer_col = ops.column("peer")
        peer = np.asarray(peer_col.fill_null(-1).to_numpy(zero_copy_only=False)).astype(np.int64) \
            if peer_col.null_count else _col(ops, "peer").astype(np.int64)
        is_recv = np.array([o == "recv" for o in names], dtype=bool)[oc] if names else np.zeros(0, bool)
        src = np.where(p2p, np.where(is_recv, peer, rank), -1)
        dst = np.where(p2p, np.where(is_recv, rank, peer), -1)
        w = int(max(src.max(), dst.max())) + 2
        key1 = (cc * w + (src + 1)) * w + (dst + 1)  # one int64 per (comm, src, dst); np.unique(axis=0) is slow
        uniq, inv = np.unique(key1, return_inverse=True)
        gid = np.empty(len(uniq), dtype=np.int64)
        for k, u in enumerate(uniq.tolist()):
            c, rest = divmod(u, w * w)
            s, d = divmod(rest, w)
            key = (comms[c], s - 1, d - 1)
            gid[k] = self.ids.setdefault(key, len(self.ids)) if create else self.ids.get(key, -1)
        while len(self.sums) < len(self.ids):
            self.sums.append(np.zeros(0))
            self.counts.append(np.zeros(0, dtype=np.int32))
        return gid[inv.reshape(-1)]

    def add(self, sid: np.ndarray, seq: np.ndarray, lr: np.ndarray) -> None:
        order = np.argsort(sid, kind="stable")
        ss = sid[order]
        bounds = np.r_[0, np.flatnonzero(ss[1:] != ss[:-1]) + 1, len(ss)]
        for a, b in zip(bounds[:-1], bounds[1:]):
            g = int(ss[a])
            rows = order[a:b]
            q = seq[rows]
            need = int(q.max()) + 1
            if need > self.sums[g].size:
                grow = max(need, 2 * self.sums[g].size)
                self.sums[g] = np.concatenate([self.sums[g], np.zeros(grow - self.sums[g].size)])
                self.counts[g] = np.concatenate([self.counts[g], np.zeros(grow - self.counts[g].size, np.int32)])
            np.add.at(self.sums[g], q, lr[rows])
            np.add.at(self.counts[g], q, 1)

    def lookup(self, sid: np.ndarray, seq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        s = np.zeros(sid.size)
        c = np.zeros(sid.size, dtype=np.int64)
        order = np.argsort(sid, kind="stable")
        ss = sid[order]
        bounds = np.r_[0, np.flatnonzero(ss[1:] != ss[:-1]) + 1, len(ss)]
        for a, b in zip(bounds[:-1], bounds[1:]):
            g = int(ss[a])
            if g < 0:
                continue
            rows = order[a:b]
            q = seq[rows]
            ok = (q >= 0) & (q < self.sums[g].size)
            s[rows[ok]] = self.sums[g][q[ok]]
            c[rows[ok]] = self.counts[g][q[ok]]
        return s, c


class JobContext:
    """Cross-rank evidence accumulated over the ranks of one job (see the module docstring).

    Build it with :meth:`add` per rank (streaming) or :meth:`from_tables` / :meth:`from_job`, then
    call :meth:`features` for any rank's table. Adding a rank after :meth:`features` is allowed.

    Attributes
    ----------
    n_ranks : int
        Ranks added so far.
    """

    def __init__(self) -> None:
        self.n_ranks = 0
        self._it = np.zeros(0, dtype=np.int64)      # sorted iteration numbers seen
        self._it_sum = np.zeros(0)                  # sum over ranks of the rank's mean lr in the iteration
        self._it_cnt = np.zeros(0, dtype=np.int64)  # ranks that logged the iteration
        self._inst = _Instances()
        self._stats: tuple[np.ndarray, float, float] | None = None

    # ------------------------------------------------------------------ building
    def add(self, ops: pa.Table, lr: np.ndarray | None = None) -> "JobContext":
        """Add one rank's CommOps table (``lr``: its :func:`log_slowness`, when already computed)."""
        missing = [c for c in _NEEDED if c not in ops.column_names]
        if missing:
            raise SchemaError(f"ops table lacks column(s) {missing} needed for the job context")
        self.n_ranks += 1
        self._stats = None
        if ops.num_rows == 0:
            return self
        lr = log_slowness(ops) if lr is None else np.asarray(lr, dtype=np.float64)
        it = _col(ops, "iteration").astype(np.int64)
        u, inv = np.unique(it, return_inverse=True)
        mean = np.bincount(inv, lr, minlength=u.size) / np.bincount(inv, minlength=u.size)
        if not np.isin(u, self._it).all():
            merged = np.union1d(self._it, u)
            s = np.zeros(merged.size)
            c = np.zeros(merged.size, dtype=np.int64)
            pos = np.searchsorted(merged, self._it)
            s[pos] = self._it_sum
            c[pos] = self._it_cnt
            self._it, self._it_sum, self._it_cnt = merged, s, c
        pos = np.searchsorted(self._it, u)
        self._it_sum[pos] += mean
        self._it_cnt[pos] += 1
        self._inst.add(self._inst.stream_ids(ops), _col(ops, "seq").astype(np.int64), lr)
        return self

    @classmethod
    def from_tables(cls, tables: Iterable[pa.Table]) -> "JobContext":
        """A context from several ranks' tables (one table per rank)."""
        ctx = cls()
        for t in tables:
            ctx.add(t)
        return ctx

    @classmethod
    def from_job(cls, job: Any, ranks: Iterable[int] | None = None) -> "JobContext":
        """A context from a :class:`~holmes.io.Job` (every available rank by default), read rank by rank."""
        ctx = cls()
        for r in (job.available_ranks() if ranks is None else ranks):
            ctx.add(job.ops(r))
        log.debug("job context from %d rank(s), %d iteration(s)", ctx.n_ranks, ctx._it.size)
        return ctx

    # ------------------------------------------------------------------ features
    def _iteration_stats(self) -> tuple[np.ndarray, float, float]:
        if self._stats is None:
            m = self._it_sum / np.maximum(self._it_cnt, 1)
            med = float(np.median(m)) if m.size else 0.0
            mad = float(np.median(np.abs(m - med))) * 1.4826 if m.size else 0.0
            self._stats = (m, med, max(mad, 1e-3))
        return self._stats

    def features(self, ops: pa.Table) -> np.ndarray:
        """:data:`CONTEXT_FEATURE_NAMES` for every row of one rank's table (float32, table order).

        Rows whose iteration or instance the context never saw get zeros (no evidence).
        """
        n = ops.num_rows
        out = np.zeros((n, len(CONTEXT_FEATURE_NAMES)), dtype=np.float32)
        if n == 0 or self.n_ranks == 0:
            return out
        m, med, spread = self._iteration_stats()
        it = _col(ops, "iteration").astype(np.int64)
        pos = np.clip(np.searchsorted(self._it, it), 0, max(self._it.size - 1, 0))
        hit = (self._it.size > 0) & (self._it[pos] == it) if self._it.size else np.zeros(n, bool)
        dev = np.where(hit, m[pos] - med, 0.0) if self._it.size else np.zeros(n)
        out[:, 0] = dev
        out[:, 1] = dev / spread
        out[:, 2] = np.where(hit, np.log2(1.0 + self._it_cnt[pos]), 0.0) if self._it.size else 0.0
        sid = self._inst.stream_ids(ops, create=False)
        s, c = self._inst.lookup(sid, _col(ops, "seq").astype(np.int64))
        inst = s / np.maximum(c, 1)
        out[:, 3] = inst
        out[:, 4] = c
        # the instance's slowness against its usual level and spread at this position (some
        # positions are far noisier than others, e.g. a reduce-scatter after uneven compute)
        key = _position_key(ops)
        dev = inst - _position_median(key, inst)
        spread = 1.4826 * _position_median(key, np.abs(dev))
        out[:, 5] = dev
        out[:, 6] = dev / (spread + 0.01)
        return out

    @classmethod
    def of_rank(cls, ops: pa.Table) -> np.ndarray:
        """The context features of a rank on its own (what :func:`operator_features` uses by default)."""
        return cls().add(ops).features(ops)

    def __repr__(self) -> str:
        return f"JobContext(n_ranks={self.n_ranks}, iterations={self._it.size}, streams={len(self._inst.ids)})"
