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

Everything is computed with numpy and one numba kernel over the rows sorted by op position: no
Python loop per operator. Short logs (one iteration), missing iterations and zero durations give
finite values (no NaN, no inf).

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

import numba
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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
)

#: features whose level moves when the job drifts (auto-tuning shifts the thresholds on these)
DRIFT_FEATURES: tuple[str, ...] = ("dur_ms", "iter_ms", "win_mean_ms", "win_std_ms", "q1_ms", "q2_ms", "q3_ms",
                                   "iqr_ms", "win_avg_op_ms", "gap_ms")
# (excess_ms is a raw duration difference but communication time does not drift with compute)

_F = {n: i for i, n in enumerate(FEATURE_NAMES)}
_OP_CODE = {n: i for i, n in enumerate(OP_NAMES)}
_NEEDED = ("iteration", "op_index", "comm_id", "op", "nbytes", "start_ns", "end_ns")
_NS_PER_MS = 1e6


@numba.njit(cache=True, nogil=True)
def _quantile_sorted(a, m, q):
    pos = q * (m - 1)
    lo = int(np.floor(pos))
    hi = min(lo + 1, m - 1)
    frac = pos - lo
    return a[lo] + (a[hi] - a[lo]) * frac


@numba.njit(cache=True, nogil=True)
def _largest_gap(a, m):
    """(largest log-gap between consecutive sorted values, value just above it, mean log-gap)."""
    if m < 2:
        return 0.0, np.inf, 0.0
    best = -1.0
    val = np.inf
    for j in range(m - 1):
        g = np.log(max(a[j + 1], 1e-6) / max(a[j], 1e-6))
        if g > best:
            best = g
            val = a[j + 1]
    mean_gap = np.log(max(a[m - 1], 1e-6) / max(a[0], 1e-6)) / (m - 1)
    return best, val, mean_gap


@numba.njit(cache=True, nogil=True)
def _fill(srt, m, v, vprev, vnext, out, i):
    mean = 0.0
    for j in range(m):
        mean += srt[j]
    mean /= m
    var = 0.0
    for j in range(m):
        var += (srt[j] - mean) ** 2
    lt = np.searchsorted(srt[:m], v, side="left")
    le = np.searchsorted(srt[:m], v, side="right")
    out[i, 0] = mean
    out[i, 1] = np.sqrt(var / m)
    out[i, 2] = _quantile_sorted(srt, m, 0.25)
    out[i, 3] = _quantile_sorted(srt, m, 0.5)
    out[i, 4] = _quantile_sorted(srt, m, 0.75)
    out[i, 5] = srt[0]
    out[i, 6] = _quantile_sorted(srt, m, 0.10)
    out[i, 7] = (lt + 0.5 * (le - lt)) / m
    out[i, 8] = m
    out[i, 9] = vprev
    out[i, 10] = vnext


@numba.njit(cache=True, nogil=True)
def _window_stats(vals, starts, stops, window, out):
    """Windowed statistics of ``vals`` within each group ``[starts[g], stops[g])``.

    Rows of a group are in iteration order; element i's window is the ``window`` values centred on
    it, shifted to fit inside the group (a sorted window slid by one insertion and one removal).
    ``out[:, k]``: mean, std, q1, q2, q3, min, p10, pct_rank, count, previous value (itself for
    the first), next value (itself for the last), largest log-gap of the sorted window,
    above-that-gap flag, mean log-gap.
    """
    srt = np.empty(window, dtype=np.float64)
    half = window // 2
    for g in range(starts.size):
        s = starts[g]
        e = stops[g]
        m = min(e - s, window)
        for j in range(m):
            srt[j] = vals[s + j]
        srt[:m].sort()
        cur_lo = s
        gsz, gval, gmean = _largest_gap(srt, m)
        for i in range(s, e):
            lo = i - half
            if lo < s:
                lo = s
            if lo + m > e:
                lo = e - m
            moved = False
            while cur_lo < lo:  # slide by one: remove vals[cur_lo], insert vals[cur_lo + m]
                old = vals[cur_lo]
                new = vals[cur_lo + m]
                k = np.searchsorted(srt[:m], old)
                for j in range(k, m - 1):
                    srt[j] = srt[j + 1]
                k = np.searchsorted(srt[:m - 1], new)
                for j in range(m - 1, k, -1):
                    srt[j] = srt[j - 1]
                srt[k] = new
                cur_lo += 1
                moved = True
            if moved:
                gsz, gval, gmean = _largest_gap(srt, m)
            v = vals[i]
            _fill(srt, m, v, vals[i - 1] if i > s else v, vals[i + 1] if i + 1 < e else v, out, i)
            out[i, 11] = gsz
            out[i, 12] = 1.0 if v >= gval else 0.0
            out[i, 13] = gmean


def _np(table: pa.Table, name: str) -> np.ndarray:
    col = table.column(name)
    if col.null_count:
        raise SchemaError(f"column '{name}' has {col.null_count} null value(s)")
    return col.to_numpy()


def _codes(col: pa.ChunkedArray) -> np.ndarray:
    """Integer codes of a string column (dictionary or plain), first-appearance independent."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_dictionary(arr.type):
        arr = arr.cast(arr.type.value_type)
    enc = pc.dictionary_encode(arr)
    return np.asarray(enc.indices.to_numpy(zero_copy_only=False), dtype=np.int64)


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


def operator_features(ops: pa.Table, *, iteration_times: tuple[np.ndarray, np.ndarray] | None = None,
                      window: int = DEFAULT_WINDOW) -> np.ndarray:
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
    X = np.zeros((n, len(FEATURE_NAMES)), dtype=np.float32)
    if n == 0:
        return X
    it = _np(ops, "iteration").astype(np.int64)
    ix = _np(ops, "op_index").astype(np.int64)
    st = _np(ops, "start_ns").astype(np.int64)
    en = _np(ops, "end_ns").astype(np.int64)
    nb = _np(ops, "nbytes").astype(np.float64)
    dur = np.maximum(en - st, 0).astype(np.float64) / _NS_PER_MS

    op_names = ops.column("op")
    op_codes_local = _codes(op_names)
    uniq_ops = pc.unique(op_names.combine_chunks().cast(pa.string())
                         if pa.types.is_dictionary(op_names.type) else op_names.combine_chunks())
    # local dictionary-encoding order equals pc.unique's order
    lut = np.array([_OP_CODE.get(o, len(OP_NAMES)) for o in uniq_ops.to_pylist()], dtype=np.float64)
    lut_p2p = np.array([o in P2P_OPS for o in uniq_ops.to_pylist()], dtype=np.float64)
    op_code = lut[op_codes_local]
    is_p2p = lut_p2p[op_codes_local]

    # --- per-iteration context ---------------------------------------------------------------
    iters, inv = np.unique(it, return_inverse=True)
    d_iters, d_durs = iteration_durations(ops)
    iter_ns = d_durs.astype(np.float64)
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
    comm_it = np.bincount(inv, weights=dur, minlength=iters.size)
    comm_med = float(np.median(comm_it))
    avg_op = float(dur.sum() / n)
    max_ix = np.zeros(iters.size, dtype=np.float64)
    np.maximum.at(max_ix, inv, ix.astype(np.float64))

    # --- compute gap before each op (issue order within the rank) -----------------------------
    order_t = np.lexsort((ix, it))
    gap = np.zeros(n, dtype=np.float64)
    st_o, en_o = st[order_t], en[order_t]
    prev_end = np.maximum.accumulate(en_o)
    g = np.zeros(n, dtype=np.float64)
    g[1:] = np.maximum(st_o[1:] - prev_end[:-1], 0) / _NS_PER_MS
    gap[order_t] = g

    # --- per-position windowed statistics (numba) ---------------------------------------------
    gid = position_keys(ops)
    order = np.lexsort((it, gid))
    gs = gid[order]
    bounds = np.flatnonzero(np.diff(gs)) + 1
    starts = np.concatenate([[0], bounds]).astype(np.int64)
    stops = np.concatenate([bounds, [n]]).astype(np.int64)
    sd = np.zeros((n, 14), dtype=np.float64)
    sg = np.zeros((n, 14), dtype=np.float64)
    _window_stats(np.ascontiguousarray(dur[order]), starts, stops, window, sd)
    _window_stats(np.ascontiguousarray(gap[order]), starts, stops, window, sg)
    stats_d = np.empty_like(sd)
    stats_d[order] = sd
    stats_g = np.empty_like(sg)
    stats_g[order] = sg

    mean, std, q1, q2, q3, mn, p10, pct, cnt, prev, nxt, gsz, gabove, gmed = stats_d.T
    iqr = q3 - q1
    tiny = 1e-6  # ms
    it_ms = iter_ms_it[inv]
    X[:, _F["dur_ms"]] = dur
    X[:, _F["iter_ms"]] = it_ms
    X[:, _F["win_mean_ms"]] = mean
    X[:, _F["win_std_ms"]] = std
    X[:, _F["q1_ms"]] = q1
    X[:, _F["q2_ms"]] = q2
    X[:, _F["q3_ms"]] = q3
    X[:, _F["iqr_ms"]] = iqr
    X[:, _F["win_avg_op_ms"]] = avg_op
    X[:, _F["gap_ms"]] = gap
    X[:, _F["zscore"]] = np.clip(_safe_div(dur - mean, np.maximum(std, 1e-3 * np.abs(mean)), tiny), -1e4, 1e4)
    X[:, _F["robust_z"]] = np.clip(_safe_div(dur - q2, np.maximum(iqr, 1e-3 * np.abs(q2)), tiny), -1e4, 1e4)
    X[:, _F["ratio_q2"]] = np.minimum(_safe_div(dur, q2, tiny), 1e4)
    X[:, _F["ratio_min"]] = np.minimum(_safe_div(dur, mn, tiny), 1e4)
    X[:, _F["ratio_p10"]] = np.minimum(_safe_div(dur, p10, tiny), 1e4)
    X[:, _F["pct_rank"]] = pct
    X[:, _F["cv"]] = np.minimum(_safe_div(std, mean, tiny), 1e4)
    X[:, _F["share_iter"]] = _safe_div(dur, it_ms, tiny)
    X[:, _F["ratio_avg_op"]] = np.minimum(_safe_div(dur, avg_op, tiny), 1e4)
    X[:, _F["excess_share"]] = _safe_div(dur - p10, iter_med, tiny)
    gq2, gmn = stats_g[:, 3], stats_g[:, 5]
    X[:, _F["gap_ratio_q2"]] = np.minimum(_safe_div(gap + tiny, gq2 + tiny, tiny), 1e4)
    X[:, _F["gap_ratio_min"]] = np.minimum(_safe_div(gap + tiny, gmn + tiny, tiny), 1e4)
    X[:, _F["gap_share"]] = _safe_div(gap - stats_g[:, 6], iter_med, tiny)
    X[:, _F["iter_ratio"]] = _safe_div(it_ms, iter_med, tiny)
    X[:, _F["iter_comm_ratio"]] = _safe_div(comm_it[inv], comm_med, tiny)
    X[:, _F["prev_ratio"]] = np.minimum(_safe_div(dur, prev, tiny), 1e4)
    X[:, _F["win_count"]] = cnt
    X[:, _F["local_ratio"]] = np.minimum(_safe_div(np.median(np.stack([prev, dur, nxt]), axis=0), p10, tiny), 1e4)
    X[:, _F["excess_ms"]] = dur - p10
    X[:, _F["gap_lsize"]] = gsz
    X[:, _F["above_gap"]] = gabove
    X[:, _F["gap_rel"]] = np.minimum(_safe_div(gsz, gmed, 1e-6), 1e4)
    X[:, _F["above_gap_lsize"]] = gabove * gsz
    # iteration context: log-ratio to the position's low quantile, averaged over the ops of the same
    # iteration with the same (comm_id, op), the same comm_id, and all ops of the iteration
    lr = np.log(np.clip(_safe_div(dur, p10, tiny), 1e-4, 1e4))
    cc = _codes(ops.column("comm_id"))
    nc = int(cc.max()) + 1
    k_comm = inv.astype(np.int64) * nc + cc
    k_op = k_comm * (len(OP_NAMES) + 1) + op_code.astype(np.int64)
    for name, key in (("ctx_op_lratio", k_op), ("ctx_comm_lratio", k_comm), ("ctx_iter_lratio", inv)):
        _, kinv = np.unique(key, return_inverse=True)
        kc = np.bincount(kinv).astype(np.float64)
        X[:, _F[name]] = (np.bincount(kinv, weights=lr) / kc)[kinv]
        if name == "ctx_op_lratio":
            X[:, _F["ctx_op_count"]] = kc[kinv]
        if name == "ctx_comm_lratio":
            X[:, _F["ctx_comm_slow_frac"]] = (np.bincount(kinv, weights=(lr > np.log(1.2)).astype(np.float64)) / kc)[kinv]
    X[:, _F["log2_nbytes"]] = np.log2(np.maximum(nb, 0) + 1.0)
    X[:, _F["op_code"]] = op_code
    X[:, _F["is_p2p"]] = is_p2p
    X[:, _F["pos_frac"]] = _safe_div(ix.astype(np.float64), max_ix[inv], 1.0)
    np.nan_to_num(X, copy=False, nan=0.0, posinf=1e4, neginf=-1e4)
    return X
