"""Cross-rank context of a job: evidence one rank's log cannot give alone.

A weak fault (a switch 1.6x slower for a few iterations, say) stretches the affected operators by
20-40 %, well inside the iteration-to-iteration noise of any single rank. But it stretches them on
*every* rank at once, in the same iterations, and on *every* member of the affected collective.
Averaged over ranks the noise cancels and the fault stands out. :class:`JobContext` collects that
evidence in one streaming pass over the ranks (memory grows with the number of iterations and of
logical operators, never with the number of ranks times their rows):

* per iteration, the mean over ranks of the rank's mean log-slowness in that iteration;
* per communicator and op type in each iteration (``(comm_id, op, iteration)``), the mean over
  ranks and over the operators of that kind: a faulty switch or link slows the communicators routed
  through it, and a rank that waits on a late peer slows every member of the next collective;
* per logical operator instance (a collective: ``(comm_id, seq)``; a P2P transfer:
  ``(comm_id, src, dst, seq)``), the mean log-slowness over the members seen.

Each is compared with its usual level over the iterations: the median (a spike or fluctuation
stands out against it) and the 10th percentile (a persistent fault covers most of the log, so the
median sits on the slow level; the step over the healthy low level remains). The step is also given
in units of the *healthy spread*, the normal-equivalent sigma of the fastest quarter of the
iterations: a fluctuation slows about half of them and a persistent fault most of them, which
inflates the MAD (a 1.8x GPU fluctuation gave a communicator z of 1.5 against its MAD and 5.4
against the healthy spread); a fault only slows, so the fast quarter stays healthy. The instance
and the op's own log-slowness get the same healthy-spread step at their position. A position whose
duration is naturally bimodal on one rank (the first pipeline recv of an iteration, waiting for
upstream compute) averages out over a communicator's ops and ranks, so these features also tell
it from a fault.

Only durations are compared, never timestamps of two hosts, so clock offsets between hosts do not
matter. (Splitting a duration into the wait for the latest member and the transfer after it, from
the members' start times, was tried and measured no gain on the held-out jobs.)

The log-slowness of an op is ``log(duration / median duration of its position)`` on its own rank
(position: ``(op_index, comm_id, op)``), so ranks of different speeds and programs are comparable.
:meth:`JobContext.features` turns the context into :data:`CONTEXT_FEATURE_NAMES` for one rank's
rows; :func:`holmes.detect.operator_features` appends them to the per-rank features. Without a
context (one rank on its own) the same features are computed from that rank alone, and
``job_ranks`` tells the detector how much evidence there was.

A context is a *mergeable summary*: :meth:`JobContext.merge` adds another context's ranks, so a
job's context can be built as a tree (one context per group of ranks, on the machines that hold
their logs, then merged; :func:`holmes.detect.job_context` with a Dask scheduler). Its sums are
exact: each log-slowness enters as a fixed-point integer (``2**-32`` units), so the merged context
is bit for bit the same whatever the grouping and order of the merges (floating-point sums would
depend on them).

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
>>> both = JobContext.from_tables([rank(0, 2)]).merge(JobContext.from_tables([rank(1, 2)]))
>>> both.n_ranks, bool((both.features(rank(0, 2)) == F).all())   # merged: the same, bit for bit
(2, True)
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa

from holmes.detect._columns import codes_values, column
from holmes.errors import SchemaError
from holmes.io.schema import P2P_OPS
from holmes.stats import MAD_SIGMA, group_medians, healthy_low

__all__ = ["JobContext", "CONTEXT_FEATURE_NAMES", "log_slowness", "rank_context_features"]

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
    "comm_iter_dev",  # mean log-slowness of (comm_id, op) in the op's iteration minus its median over iterations
    "comm_iter_z",    # comm_iter_dev / (1.4826 MAD over iterations + 0.01)
    "comm_iter_rise",  # the same mean minus its 10th percentile over iterations (a persistent fault's step)
    "job_iter_rise",   # job_iter_lr's mean minus its 10th percentile over iterations
    "comm_iter_rise_z",  # comm_iter_rise / (the healthy spread over iterations + 0.01)
    "job_iter_rise_z",   # job_iter_rise / the healthy spread over iterations
    "inst_rise_z",       # inst_lr minus its 10th percentile at the position, over (its healthy spread + 0.01)
    "pos_rise_z",        # the same for the op's own log-slowness on this rank
)

_NEEDED = ("rank", "iteration", "op_index", "comm_id", "seq", "op", "peer", "start_ns", "end_ns")
_LR_CLIP = 9.0  # |log-slowness| bound (a factor of ~8000) so one broken row cannot dominate a mean
# fixed-point unit of the sums: exact (hence associative) integer sums; a key holds up to
# 2**63 / (9 * 2**32) ~ 2.4e8 contributions before overflowing
_SCALE = float(2 ** 32)


def _fixed(x: np.ndarray) -> np.ndarray:
    """Values in fixed-point units (int64)."""
    return np.rint(np.asarray(x, dtype=np.float64) * _SCALE).astype(np.int64)


def _group_sum(inv: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Exact int64 sums of ``values`` per group ``inv`` (0..n-1)."""
    out = np.zeros(n, dtype=np.int64)
    if values.size:
        np.add.at(out, inv, values)
    return out


class _RankView:
    """The columns of one rank's table that the context uses, decoded once."""

    def __init__(self, ops: pa.Table, comm: tuple[np.ndarray, list] | None = None,
                 op: tuple[np.ndarray, list] | None = None) -> None:
        # comm/op: the ``codes_values`` of those columns when the caller already has them
        missing = [c for c in _NEEDED if c not in ops.column_names]
        if missing:
            raise SchemaError(f"ops table lacks column(s) {missing} needed for the job context")
        self.n = ops.num_rows
        self._streams: tuple[np.ndarray, np.ndarray, int, list] | None = None
        self._comm_ops: tuple[list[tuple[int, int]], np.ndarray] | None = None
        self._lr: np.ndarray | None = None
        self.it = column(ops, "iteration").astype(np.int64)
        self.seq = column(ops, "seq").astype(np.int64)
        self.rank = column(ops, "rank").astype(np.int64)
        self.start = column(ops, "start_ns").astype(np.int64)
        self.dur = np.maximum(column(ops, "end_ns").astype(np.int64) - self.start, 1).astype(np.float64)
        peer = ops.column("peer")
        self.peer = np.asarray(peer.fill_null(-1).to_numpy(zero_copy_only=False) if peer.null_count
                               else peer.to_numpy(zero_copy_only=False)).astype(np.int64)
        self.cc, self.comms = codes_values(ops.column("comm_id")) if comm is None else comm
        self.oc, self.names = codes_values(ops.column("op")) if op is None else op
        ix = column(ops, "op_index").astype(np.int64)
        if self.n:
            key = (ix * (int(self.cc.max()) + 1) + self.cc) * (int(self.oc.max()) + 1) + self.oc
            self.order = np.argsort(key, kind="stable")
            ks = key[self.order]
            self.bounds = np.r_[0, np.flatnonzero(ks[1:] != ks[:-1]) + 1, self.n].astype(np.int64)

    def streams(self) -> tuple[np.ndarray, np.ndarray, int, list]:
        """``(keys, inverse, w, comm names)``: the rank's distinct ``(comm, src, dst)`` streams, each
        encoded as ``(comm_code * w + src + 1) * w + dst + 1`` (src = dst = -1 for collectives)."""
        if self._streams is None:
            names = self.names
            p2p = np.array([o in P2P_OPS for o in names], dtype=bool)[self.oc] if names else np.zeros(0, bool)
            is_recv = np.array([o == "recv" for o in names], dtype=bool)[self.oc] if names else np.zeros(0, bool)
            src = np.where(p2p, np.where(is_recv, self.peer, self.rank), -1)
            dst = np.where(p2p, np.where(is_recv, self.rank, self.peer), -1)
            w = int(max(src.max(), dst.max())) + 2 if self.n else 1
            key = (self.cc * w + (src + 1)) * w + (dst + 1)  # one int64 each; np.unique(axis=0) is slow
            uniq, inv = np.unique(key, return_inverse=True)
            self._streams = (uniq, inv.reshape(-1), w, self.comms)
        return self._streams

    def comm_ops(self) -> tuple[list[tuple[int, int]], np.ndarray]:
        """The rank's distinct ``(comm code, op code)`` pairs and each row's index into them."""
        if self._comm_ops is None:
            w = int(self.oc.max()) + 1 if self.n else 1
            uniq, inv = np.unique(self.cc.astype(np.int64) * w + self.oc, return_inverse=True)
            self._comm_ops = ([divmod(u, w) for u in uniq.tolist()], inv.reshape(-1))
        return self._comm_ops

    def median(self, values: np.ndarray) -> np.ndarray:
        """Per row, the median of ``values`` over the rows of its position ``(op_index, comm_id, op)``."""
        out = np.empty(self.n)
        if self.n:
            group_medians(values, self.order, self.bounds, out)
        return out

    def healthy(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per row, the 10th percentile and the healthy spread (:func:`holmes.stats.healthy_low`) of ``values``
        over the rows of its position."""
        if self.n == 0:
            return np.zeros(0), np.zeros(0)
        return healthy_low(values, self.order, self.bounds)

    def log_slowness(self) -> np.ndarray:
        if self._lr is None:  # computed once: a lone rank adds itself, then reads its features
            self._lr = (np.clip(np.log(self.dur / self.median(self.dur)), -_LR_CLIP, _LR_CLIP) if self.n
                        else np.zeros(0))
        return self._lr


def log_slowness(ops: pa.Table) -> np.ndarray:
    """``log(duration / median duration of the row's position)`` for every row of one rank's table.

    Position: ``(op_index, comm_id, op)``. Clipped to +-9; zero durations count as 1 ns.
    """
    return _RankView(ops).log_slowness()


class _Instances:
    """Per logical stream ``(comm_id, src, dst)`` growable sums/counts indexed by ``seq``."""

    def __init__(self) -> None:
        self.ids: dict[tuple[str, int, int], int] = {}
        self.sums: list[np.ndarray] = []
        self.counts: list[np.ndarray] = []

    def stream_ids(self, v: _RankView, create: bool = True) -> np.ndarray:
        """Stream id of every row (-1: unknown stream, when not ``create``)."""
        uniq, inv, w, comms = v.streams()
        gid = _global_ids(self.ids, [(comms[u // (w * w)], u // w % w - 1, u % w - 1) for u in uniq.tolist()], create)
        while len(self.sums) < len(self.ids):
            self.sums.append(np.zeros(0, np.int64))
            self.counts.append(np.zeros(0, dtype=np.int32))
        return gid[inv]

    def add(self, sid: np.ndarray, seq: np.ndarray, lr: np.ndarray) -> None:
        """Add fixed-point log-slowness ``lr`` (int64) at each row's stream and ``seq``."""
        for g, rows in _runs(sid):
            rows = rows[seq[rows] >= 0]  # a negative seq (malformed log) names no instance
            if rows.size == 0:
                continue
            q = seq[rows]
            need = int(q.max()) + 1
            self._grow(g, need)
            np.add.at(self.sums[g], q, lr[rows])
            np.add.at(self.counts[g], q, 1)

    def _grow(self, g: int, need: int) -> None:
        if need > self.sums[g].size:
            grow = max(need, 2 * self.sums[g].size)
            self.sums[g] = np.concatenate([self.sums[g], np.zeros(grow - self.sums[g].size, np.int64)])
            self.counts[g] = np.concatenate([self.counts[g], np.zeros(grow - self.counts[g].size, np.int32)])

    def merge(self, other: "_Instances") -> None:
        """Add ``other``'s sums and counts (exact)."""
        for key, h in other.ids.items():
            g = self.ids.setdefault(key, len(self.ids))
            if g == len(self.sums):
                self.sums.append(np.zeros(0, np.int64))
                self.counts.append(np.zeros(0, np.int32))
            n = int(np.flatnonzero(other.counts[h])[-1]) + 1 if other.counts[h].any() else 0
            self._grow(g, n)
            self.sums[g][:n] += other.sums[h][:n]
            self.counts[g][:n] += other.counts[h][:n]

    def lookup(self, sid: np.ndarray, seq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per row, the fixed-point sum (as float64) and the count of its instance."""
        s = np.zeros(sid.size)
        c = np.zeros(sid.size, dtype=np.int64)
        for g, rows in _runs(sid):
            if g < 0:
                continue
            q = seq[rows]
            ok = (q >= 0) & (q < self.sums[g].size)
            s[rows[ok]] = self.sums[g][q[ok]]
            c[rows[ok]] = self.counts[g][q[ok]]
        return s, c


class _CommIterations:
    """Sums and counts of log-slowness per ``(comm_id, op, iteration)``, accumulated rank by rank.

    Each rank adds one small chunk (its distinct keys); chunks are merged when they pile up and
    before a lookup, so memory stays at one entry per key plus a bounded backlog.
    """

    _MERGE_AT = 1 << 21  # pending entries

    def __init__(self) -> None:
        self.ids: dict[tuple[str, str], int] = {}
        self._chunks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._pending = 0
        self._stats: tuple[np.ndarray, ...] | None = None

    def keys(self, v: _RankView, create: bool = True) -> np.ndarray:
        """One int64 key per row: ``group id * 2**32 + iteration mod 2**32`` (-1: unknown group).

        The low word keeps iterations apart from -2**31 to 2**31 - 1 (a negative iteration is not
        iteration 0); the statistics treat a group's iterations as a set, so their order is moot."""
        if v.n == 0:
            return np.zeros(0, dtype=np.int64)
        uniq, inv = v.comm_ops()
        g = _global_ids(self.ids, [(str(v.comms[c]), str(v.names[o])) for c, o in uniq], create)[inv]
        return np.where(g >= 0, (g << 32) + (v.it & 0xFFFFFFFF), -1)

    def add(self, keys: np.ndarray, lr: np.ndarray) -> None:
        """Add fixed-point log-slowness ``lr`` (int64) at each row's key."""
        u, inv = np.unique(keys, return_inverse=True)
        inv = inv.reshape(-1)
        self._append((u, _group_sum(inv, lr, u.size), np.bincount(inv, minlength=u.size).astype(np.int64)))

    def _append(self, chunk: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
        self._chunks.append(chunk)
        self._pending += chunk[0].size
        self._stats = None
        if self._pending > self._MERGE_AT:
            self._merge()

    def merge(self, other: "_CommIterations") -> None:
        """Add ``other``'s sums and counts (exact; its group ids renumbered into this store's)."""
        if not other.ids:
            return
        remap = np.zeros(max(other.ids.values()) + 1, dtype=np.int64)
        for key, h in other.ids.items():
            remap[h] = self.ids.setdefault(key, len(self.ids))
        for k, s, c in other._chunks:
            self._append(((remap[k >> 32] << 32) + (k & 0xFFFFFFFF), s, c))

    def __getstate__(self) -> dict[str, Any]:
        self._merge()  # one chunk of sums (exact: the same sums either way), no derived statistics
        state = dict(self.__dict__)
        state["_stats"] = None
        return state

    def _merge(self) -> None:
        if len(self._chunks) > 1:
            k = np.concatenate([c[0] for c in self._chunks])
            u, inv = np.unique(k, return_inverse=True)
            inv = inv.reshape(-1)
            s = _group_sum(inv, np.concatenate([c[1] for c in self._chunks]), u.size)
            c = _group_sum(inv, np.concatenate([c[2] for c in self._chunks]), u.size)
            self._chunks = [(u, s, c)]
        self._pending = self._chunks[0][0].size if self._chunks else 0

    def stats(self) -> tuple[np.ndarray, ...]:
        """``(keys, dev, z, rise, rise_z)``: per key, the mean against its group's median over
        iterations, raw and in units of the group's spread (1.4826 MAD + 0.01), and against the
        group's 10th percentile, raw and in units of its healthy spread (+ 0.01)."""
        if self._stats is None:
            self._merge()
            if not self._chunks:
                self._stats = (np.zeros(0, np.int64),) + tuple(np.zeros(0) for _ in range(4))
                return self._stats
            keys, s, c = self._chunks[0]
            mean = s / np.maximum(c, 1) / _SCALE
            grp = keys >> 32  # keys are sorted, so each group's iterations are contiguous
            bounds = np.r_[0, np.flatnonzero(grp[1:] != grp[:-1]) + 1, keys.size].astype(np.int64)
            med, mad, low, healthy = _levels(mean, bounds)
            dev, rise = mean - med, mean - low
            self._stats = (keys, dev, dev / (MAD_SIGMA * mad + 0.01), rise, rise / (healthy + 0.01))
        return self._stats

    def lookup(self, keys: np.ndarray) -> tuple[np.ndarray, ...]:
        """``(dev, z, rise, rise_z)`` of each row's key (zeros for keys never seen)."""
        k, *cols = self.stats()
        if k.size == 0 or keys.size == 0:
            return tuple(np.zeros(keys.size) for _ in cols)
        pos = np.clip(np.searchsorted(k, keys), 0, k.size - 1)
        hit = (k[pos] == keys) & (keys >= 0)
        return tuple(np.where(hit, c[pos], 0.0) for c in cols)


def _global_ids(ids: dict, keys: list, create: bool) -> np.ndarray:
    """The store's id of each key (new ids when ``create``, else -1 for a key never seen)."""
    if create:
        return np.array([ids.setdefault(k, len(ids)) for k in keys], dtype=np.int64)
    return np.array([ids.get(k, -1) for k in keys], dtype=np.int64)


def _levels(values: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per row, its group's median, median absolute deviation, 10th percentile and healthy spread
    (:func:`holmes.stats.healthy_low`; groups are the contiguous runs ``values[bounds[g]:bounds[g+1]]``): the usual
    and the healthy level over iterations, and the spread of the healthy ones."""
    order = np.arange(values.size, dtype=np.int64)
    med, mad = np.empty(values.size), np.empty(values.size)
    if values.size:
        group_medians(values, order, bounds, med)
        group_medians(np.abs(values - med), order, bounds, mad)
    low, healthy = healthy_low(values, order, bounds)
    return med, mad, low, healthy


def _runs(sid: np.ndarray):
    """``(stream id, rows)`` for each distinct id of ``sid`` (rows in table order)."""
    order = np.argsort(sid, kind="stable")
    ss = sid[order]
    bounds = np.r_[0, np.flatnonzero(ss[1:] != ss[:-1]) + 1, len(ss)]
    for a, b in zip(bounds[:-1], bounds[1:]):
        yield int(ss[a]), order[a:b]


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
        self._it_sum = np.zeros(0, dtype=np.int64)  # sum over ranks of the rank's mean lr in the iteration (fixed point)
        self._it_cnt = np.zeros(0, dtype=np.int64)  # ranks that logged the iteration
        self._inst = _Instances()
        self._comm_it = _CommIterations()
        self._stats: tuple[np.ndarray, float, float, float, float] | None = None

    # ------------------------------------------------------------------ building
    def add(self, ops: pa.Table) -> "JobContext":
        """Add one rank's CommOps table."""
        return self._add(_RankView(ops))

    def _add(self, v: _RankView) -> "JobContext":
        self.n_ranks += 1
        self._stats = None
        if v.n == 0:
            return self
        lr = v.log_slowness()
        u, inv = np.unique(v.it, return_inverse=True)
        mean = np.bincount(inv, lr, minlength=u.size) / np.bincount(inv, minlength=u.size)
        self._add_iterations(u, _fixed(mean), np.ones(u.size, dtype=np.int64))
        q = _fixed(lr)
        self._inst.add(self._inst.stream_ids(v), v.seq, q)
        self._comm_it.add(self._comm_it.keys(v), q)
        return self

    def _add_iterations(self, u: np.ndarray, s: np.ndarray, c: np.ndarray) -> None:
        if not np.isin(u, self._it).all():
            merged = np.union1d(self._it, u)
            ms = np.zeros(merged.size, dtype=np.int64)
            mc = np.zeros(merged.size, dtype=np.int64)
            pos = np.searchsorted(merged, self._it)
            ms[pos] = self._it_sum
            mc[pos] = self._it_cnt
            self._it, self._it_sum, self._it_cnt = merged, ms, mc
        pos = np.searchsorted(self._it, u)
        self._it_sum[pos] += s
        self._it_cnt[pos] += c

    def merge(self, other: "JobContext") -> "JobContext":
        """Add the ranks of ``other`` (a context of other ranks of the same job) to this one; returns self.

        Exact: merging contexts in any grouping and order gives the context of all their ranks
        added one by one, bit for bit (the reduce of a distributed build).
        """
        if not isinstance(other, JobContext):
            raise TypeError(f"JobContext.merge takes a JobContext, not {type(other).__name__}")
        self.n_ranks += other.n_ranks
        self._stats = None
        if other._it.size:
            self._add_iterations(other._it, other._it_sum, other._it_cnt)
        self._inst.merge(other._inst)
        self._comm_it.merge(other._comm_it)
        return self

    @classmethod
    def merged(cls, contexts: Iterable["JobContext"]) -> "JobContext":
        """One context holding the ranks of all ``contexts`` (none is modified)."""
        out = cls()
        for c in contexts:
            out.merge(c)
        return out

    def __getstate__(self) -> dict[str, Any]:
        # the derived statistics are recomputed where needed: a pickled context (sent to a worker) carries sums only
        state = dict(self.__dict__)
        state["_stats"] = None
        return state

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
    def _iteration_stats(self) -> tuple[np.ndarray, float, float, float, float]:
        """``(per-iteration mean, median, spread, 10th percentile, healthy spread)`` over the iterations seen."""
        if self._stats is None:
            m = self._it_sum / np.maximum(self._it_cnt, 1) / _SCALE
            med, mad, low, healthy = (float(a[0]) if m.size else 0.0
                                      for a in _levels(m, np.array([0, m.size], np.int64)))
            self._stats = (m, med, max(MAD_SIGMA * mad, 1e-3), low, max(healthy, 1e-3))
        return self._stats

    def features(self, ops: pa.Table) -> np.ndarray:
        """:data:`CONTEXT_FEATURE_NAMES` for every row of one rank's table (float32, table order).

        Rows whose iteration or instance the context never saw get zeros (no evidence).
        """
        return self._features(_RankView(ops))

    def _features(self, v: _RankView) -> np.ndarray:
        n = v.n
        out = np.zeros((n, len(CONTEXT_FEATURE_NAMES)), dtype=np.float32)
        if n == 0 or self.n_ranks == 0 or self._it.size == 0:
            return out
        m, med, spread, low, healthy = self._iteration_stats()
        pos = np.clip(np.searchsorted(self._it, v.it), 0, self._it.size - 1)
        hit = self._it[pos] == v.it
        dev = np.where(hit, m[pos] - med, 0.0)
        out[:, 0] = dev
        out[:, 1] = dev / spread
        out[:, 2] = np.where(hit, np.log2(1.0 + self._it_cnt[pos]), 0.0)
        s, c = self._inst.lookup(self._inst.stream_ids(v, create=False), v.seq)
        inst = s / np.maximum(c, 1) / _SCALE
        out[:, 3] = inst
        out[:, 4] = c
        # the instance's slowness against its usual level and spread at this position (some
        # positions are far noisier than others, e.g. a reduce-scatter after uneven compute)
        dev = inst - v.median(inst)
        out[:, 5] = dev
        out[:, 6] = dev / (MAD_SIGMA * v.median(np.abs(dev)) + 0.01)
        low_i, healthy_i = v.healthy(inst)
        out[:, 13] = (inst - low_i) / (healthy_i + 0.01)
        own = v.log_slowness()
        low_o, healthy_o = v.healthy(own)
        out[:, 14] = (own - low_o) / (healthy_o + 0.01)
        out[:, 7], out[:, 8], out[:, 9], out[:, 11] = self._comm_it.lookup(self._comm_it.keys(v, create=False))
        out[:, 10] = np.where(hit, m[pos] - low, 0.0)
        out[:, 12] = out[:, 10] / healthy
        return out

    @classmethod
    def of_rank(cls, ops: pa.Table) -> np.ndarray:
        """The context features of a rank on its own (what :func:`operator_features` uses by default)."""
        return rank_context_features(ops)

    def __repr__(self) -> str:
        return f"JobContext(n_ranks={self.n_ranks}, iterations={self._it.size}, streams={len(self._inst.ids)})"


def rank_context_features(ops: pa.Table, context: JobContext | None = None, *,
                          comm: tuple[np.ndarray, list] | None = None,
                          op: tuple[np.ndarray, list] | None = None) -> np.ndarray:
    """:data:`CONTEXT_FEATURE_NAMES` of one rank's rows: from ``context``, or the rank alone when None.

    ``comm`` / ``op``: the rank's ``comm_id`` / ``op`` codes and values
    (:func:`holmes.detect._columns.codes_values`) when already decoded, as
    :func:`~holmes.detect.operator_features` has them.
    """
    v = _RankView(ops, comm, op)
    if context is None:
        return JobContext()._add(v)._features(v)
    return context._features(v)
