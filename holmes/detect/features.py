"""Per-operator features of one rank's CommOps table (paper section 4.2.2, Appendix E).

Every row (one communication operator on one rank) becomes a feature vector. The paper's features
are windowed statistics of the operator's duration over *the same operator position* in the
iterations of a window (mean, std, z-score, Q1/Q2/Q3, IQR), fixed features (data size,
communication pattern) and global context (iteration time, window-average op time). "The same
operator position" is the key ``(op_index, comm_id, op)``.

Besides the paper's raw (millisecond) features, which drift when the job slows down, most features
here are scale-free ratios so that one model generalizes across job shapes and sizes: duration /
window median, duration / window minimum and low quantile (robust when a persistent fault inflates
the median), percentile rank in the window, share of the iteration time, the compute gap before
the op relative to its usual value, and the op's excess over its usual duration as a share of the
iteration (how much this op matters; the paper's 0.02 ms -> 1 ms vs 1 s -> 3 s example).

Everything is computed with numpy and the numba kernels of :mod:`holmes.detect._feature_kernels`
over the rows sorted by op position: no Python loop per operator. The windowed statistics slide a sorted window along each position's
iterations and compute the statistics of batches of distinct windows together, with SIMD lanes
across windows; the features of a position's rows are then written straight into the float32
matrix. Every sum is taken in the same order as a one-window-at-a-time computation, so the
values do not depend on the batching. Short logs (one iteration), missing iterations and zero
durations give finite values (no NaN, no inf).

Examples
--------
>>> from holmes.io.schema import ops_table
>>> n = 6
>>> t = ops_table(rank=[0] * n, iteration=[0, 0, 1, 1, 2, 2], op_index=[0, 1] * 3,
...               comm_id=["tp-0", "dp-0"] * 3, seq=[0, 0, 1, 1, 2, 2], op=["all_reduce"] * n,
...               peer=[None] * n, nbytes=[1024] * n, start_ns=[0, 300, 1000, 1300, 2000, 2300],
...               end_ns=[100, 400, 1100, 1400, 2500, 2400])
>>> X = operator_features(t)
>>> X.shape == (n, len(FEATURE_NAMES)), bool(np.isfinite(X).all())
(True, True)
>>> round(float(X[4, FEATURE_NAMES.index("ratio_min")]), 1)   # the slow op: 500 ns vs 100 ns
5.0
"""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa

from holmes.detect._feature_kernels import (_context_features, _dense_index, _features_core, _gaps,  # noqa: F401
                                            _group_order, _group_stats, _issue_order_sorted, _per_iteration,
                                            _window_stats)
from holmes.detect._columns import codes as _codes
from holmes.detect._columns import codes_values as _codes_values
from holmes.detect._columns import column as _np
from holmes.detect.context import CONTEXT_FEATURE_NAMES, JobContext, rank_context_features
from holmes.errors import ConfigError, SchemaError
from holmes.io.schema import OP_NAMES, P2P_OPS

__all__ = ["FEATURE_NAMES", "DRIFT_FEATURES", "operator_features", "iteration_durations", "position_keys",
           "DEFAULT_WINDOW"]

log = logging.getLogger(__name__)

DEFAULT_WINDOW = 64

FEATURE_NAMES: tuple[str, ...] = (
    # raw, in milliseconds (drift-prone; the paper's list)
    "dur_ms", "iter_ms", "win_mean_ms", "win_std_ms", "q1_ms", "q2_ms", "q3_ms", "iqr_ms", "win_avg_op_ms",
    "gap_ms",
    # scale-free
    "zscore", "robust_z", "ratio_q2", "ratio_min", "ratio_p10", "pct_rank", "cv", "share_iter",
    "ratio_avg_op", "excess_share", "gap_ratio_q2", "gap_ratio_min", "gap_share", "iter_ratio",
    "iter_comm_ratio", "prev_ratio", "win_count", "local_ratio", "excess_ms",
    # context: the same iteration's other ops (a faulty device slows many ops at once)
    "ctx_op_lratio", "ctx_comm_lratio", "ctx_iter_lratio", "ctx_comm_slow_frac", "ctx_op_count",
    # bimodality of the position's window: largest log-gap in its sorted durations, whether this op
    # lies above it, and that gap relative to the typical gap
    "gap_lsize", "above_gap", "gap_rel", "above_gap_lsize",
    # fixed
    "log2_nbytes", "op_code", "is_p2p", "pos_frac",
) + CONTEXT_FEATURE_NAMES  # cross-rank context (holmes.detect.context), the rank alone by default

#: features whose level moves when the job drifts (auto-tuning shifts the thresholds on these)
DRIFT_FEATURES: tuple[str, ...] = ("dur_ms", "iter_ms", "win_mean_ms", "win_std_ms", "q1_ms", "q2_ms", "q3_ms",
                                   "iqr_ms", "win_avg_op_ms", "gap_ms")
# (excess_ms is a raw duration difference but communication time does not drift with compute)

_F = {n: i for i, n in enumerate(FEATURE_NAMES)}
# the kernels write the columns by index: 0..28 and 34..41 in _features_core, 29..33 in
# _context_features (holmes/detect/_feature_kernels.py)
assert FEATURE_NAMES[28] == "excess_ms" and FEATURE_NAMES[29:34] == (
    "ctx_op_lratio", "ctx_comm_lratio", "ctx_iter_lratio", "ctx_comm_slow_frac", "ctx_op_count") \
    and FEATURE_NAMES[41] == "pos_frac" and len(FEATURE_NAMES) == 42 + len(CONTEXT_FEATURE_NAMES)
_N_RANK = 42  # the per-rank features; the context ones follow
_OP_CODE = {n: i for i, n in enumerate(OP_NAMES)}
_NEEDED = ("rank", "iteration", "op_index", "comm_id", "seq", "op", "peer", "nbytes", "start_ns", "end_ns")
_NS_PER_MS = 1e6


def _dense(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(a, return_inverse=True)`` for an int64 array (a counting pass when the range is small)."""
    lo, hi = int(a.min()), int(a.max())
    if hi - lo < 4 * a.size + 4096:
        return _dense_index(a, lo, hi - lo + 1)
    vals, inv = np.unique(a, return_inverse=True)
    return vals, inv.astype(np.int64).reshape(-1)


def position_keys(ops: pa.Table) -> np.ndarray:
    """Group id of every row: rows with the same ``(op_index, comm_id, op)`` share it."""
    ix = _np(ops, "op_index").astype(np.int64)
    cc = _codes(ops.column("comm_id"))
    oc = _codes(ops.column("op"))
    nc = int(cc.max()) + 1 if cc.size else 1
    no = int(oc.max()) + 1 if oc.size else 1
    key = (ix * nc + cc) * no + oc
    _, gid = np.unique(key, return_inverse=True)
    return gid.astype(np.int64)


def iteration_durations(ops: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """Iteration numbers and durations (ns) derived from one rank's ops.

    Same rule as :func:`holmes.io.derive_iterations`: an iteration ends when its last op completes
    and starts when the previous one ended (the first starts at its first op).
    """
    it = _np(ops, "iteration")
    st = _np(ops, "start_ns")
    en = _np(ops, "end_ns")
    iters, inv = np.unique(it, return_inverse=True)
    if iters.size == 0:
        return iters, np.zeros(0, dtype=np.int64)
    first = np.full(iters.size, np.iinfo(np.int64).max, dtype=np.int64)
    last = np.full(iters.size, np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(first, inv, st)
    np.maximum.at(last, inv, en)
    start = np.empty_like(last)
    start[0] = first[0]
    start[1:] = last[:-1]
    return iters, last - start


def _safe_div(a: np.ndarray, b: np.ndarray | float, floor: float) -> np.ndarray:
    return a / np.maximum(b, floor)


_SLOW_LRATIO = float(np.log(1.2))


def operator_features(ops: pa.Table, *, iteration_times: tuple[np.ndarray, np.ndarray] | None = None,
                      window: int = DEFAULT_WINDOW, context: JobContext | None = None) -> np.ndarray:
    """The feature matrix of one rank's ops, one row per op in table order.

    Parameters
    ----------
    ops : pyarrow.Table
        CommOps v1 rows of ONE rank (columns iteration, op_index, comm_id, op, nbytes, start_ns,
        end_ns are used; extra columns are ignored). Any row order.
    iteration_times : (iterations, durations_ns), optional
        The rank's iteration times (e.g. ``Job.iteration_times(rank)``); derived from the ops when
        omitted or when an iteration is missing from it.
    window : int, default 64
        Iterations in the window of the per-position statistics (centred on the op's iteration;
        the whole log when it is shorter).
    context : JobContext, optional
        Cross-rank evidence of the job (:class:`~holmes.detect.context.JobContext`, built from many
        ranks); its :data:`~holmes.detect.context.CONTEXT_FEATURE_NAMES` fill the last columns. When
        omitted they are computed from this rank alone (``job_ranks`` = 1).

    Returns
    -------
    numpy.ndarray, float32, shape (n_rows, len(FEATURE_NAMES))
        Finite values only.

    Raises
    ------
    SchemaError
        A needed column is missing or holds nulls.
    ConfigError
        ``window`` is not a positive integer.
    """
    missing = [c for c in _NEEDED if c not in ops.column_names]
    if missing:
        raise SchemaError(f"ops table lacks column(s) {missing} needed for detection features")
    if int(window) != window or window < 1:
        raise ConfigError(f"window must be a positive integer (got {window!r})")
    window = int(window)
    n = ops.num_rows
    if n == 0:
        return np.zeros((n, len(FEATURE_NAMES)), dtype=np.float32)
    it = _np(ops, "iteration").astype(np.int64, copy=False)
    ix = _np(ops, "op_index").astype(np.int64, copy=False)
    st = _np(ops, "start_ns").astype(np.int64, copy=False)
    en = _np(ops, "end_ns").astype(np.int64, copy=False)
    nb = _np(ops, "nbytes").astype(np.float64)
    dur = np.maximum(en - st, 0).astype(np.float64) / _NS_PER_MS
    ixf = ix.astype(np.float64)

    oc, op_values = _codes_values(ops.column("op"))
    cc, comm_values = _codes_values(ops.column("comm_id"))
    lut = np.array([_OP_CODE.get(o, len(OP_NAMES)) for o in op_values], dtype=np.float64)
    lut_p2p = np.array([o in P2P_OPS for o in op_values], dtype=np.float64)
    op_code = lut[oc]
    is_p2p = lut_p2p[oc]

    # --- per-iteration context ---------------------------------------------------------------
    iters, inv = _dense(it)
    n_it = iters.size
    first, last, comm_it, max_ix = _per_iteration(inv, n_it, st, en, dur, ixf)
    start = np.empty_like(last)  # iteration_durations' rule
    start[0] = first[0]
    start[1:] = last[:-1]
    iter_ns = (last - start).astype(np.float64)
    if iteration_times is not None:
        gi, gd = (np.asarray(a) for a in iteration_times)
        if gi.size:
            order = np.argsort(gi, kind="stable")
            gi, gd = gi[order].astype(np.int64), gd[order].astype(np.float64)
            pos = np.clip(np.searchsorted(gi, iters), 0, gi.size - 1)
            hit = gi[pos] == iters
            iter_ns = np.where(hit & (gd[pos] > 0), gd[pos], iter_ns)
    iter_ms_it = np.maximum(iter_ns / _NS_PER_MS, 1e-9)
    iter_med = float(np.median(iter_ms_it))
    comm_med = float(np.median(comm_it))
    avg_op = float(dur.sum() / n)

    # --- compute gap before each op (issue order within the rank) -----------------------------
    order_t = np.arange(n) if _issue_order_sorted(it, ix) else np.lexsort((ix, it))
    gap = np.empty(n, dtype=np.float64)
    _gaps(order_t, st, en, gap)

    # --- per-position windowed statistics (numba) ---------------------------------------------
    nc = int(cc.max()) + 1
    no = int(oc.max()) + 1
    key = (ix * nc + cc) * no + oc
    k_lo, k_hi = int(key.min()), int(key.max())
    if k_hi - k_lo >= 4 * n + 4096:
        key = np.unique(key, return_inverse=True)[1].astype(np.int64).reshape(-1)
        k_lo, k_hi = 0, int(key.max())
    order, starts, stops = _group_order(key, k_lo, k_hi - k_lo + 1, inv, n_it)
    X = np.empty((n, len(FEATURE_NAMES)), dtype=np.float32)
    p10 = np.empty(n, dtype=np.float64)
    _features_core(X, dur, gap, order, starts, stops, window, iter_ms_it, inv, comm_it, max_ix, ixf,
                   np.log2(np.maximum(nb, 0) + 1.0), op_code, is_p2p, avg_op, iter_med, comm_med, p10)

    # iteration context: log-ratio to the position's low quantile, averaged over the ops of the same
    # iteration with the same (comm_id, op), the same comm_id, and all ops of the iteration
    tiny = 1e-6  # ms
    lr = np.log(np.clip(_safe_div(dur, p10, tiny), 1e-4, 1e4))
    k_comm = inv * nc + cc
    k_op = k_comm * (len(OP_NAMES) + 1) + op_code.astype(np.int64)
    k_comm, n_comm = _dense_keys(k_comm)
    k_op, n_op = _dense_keys(k_op)
    _context_features(X, lr, _SLOW_LRATIO, k_op, n_op, k_comm, n_comm, inv, n_it)
    X[:, _N_RANK:] = rank_context_features(ops, context, comm=(cc, comm_values), op=(oc, op_values))
    return X


def _dense_keys(key: np.ndarray) -> tuple[np.ndarray, int]:
    """Non-negative ids (not necessarily consecutive) for grouping equal keys, and their bound."""
    lo, hi = int(key.min()), int(key.max())
    if hi - lo < 4 * key.size + 4096:
        return key - lo, hi - lo + 1
    inv = np.unique(key, return_inverse=True)[1].astype(np.int64).reshape(-1)
    return inv, int(inv.max()) + 1
