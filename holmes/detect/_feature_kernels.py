"""Numba kernels of :mod:`holmes.detect.features` (private).

Windowed per-position statistics (a sorted window slid along each op position's iterations, the
statistics of batches of distinct windows computed together with SIMD lanes across windows),
per-iteration aggregates, issue-order compute gaps, the group sort, and the kernels that write
feature columns straight into the float32 matrix. Column indices are those of
:data:`holmes.detect.features.FEATURE_NAMES` (checked there).
"""

from __future__ import annotations

import numpy as np

from holmes._jit import njit
from holmes.stats import quantile_sorted

_F32_MAX = np.float32(np.finfo(np.float32).max)


_WBATCH = 32  # windows whose statistics are computed together (SIMD lanes across windows)


@njit(cache=True, nogil=True)
def _count_less(a, m, v):
    """``np.searchsorted(a[:m], v)`` for sorted ``a`` and non-NaN ``v`` (the values here are
    finite): a branch-free count for short windows, a binary search for long ones."""
    if m > 256:
        return np.searchsorted(a[:m], v)
    c = 0
    for j in range(m):
        c += 1 if a[j] < v else 0
    return c


@njit(cache=True, nogil=True)
def _flush_windows(snap, m, nw, wstat, rat, best, ncand, first):
    """Statistics of the ``nw`` sorted windows in the columns of ``snap`` (``snap[j, w]``, ``m`` values each).

    Lanes run across windows; each window's sums are accumulated in the same order (ascending
    values) as a loop over that window alone, so the results are bit-identical to it.
    ``wstat[k, w]``: mean, std, q1, q2, q3, min, p10, largest log-gap, value above it, mean log-gap.
    """
    for w in range(nw):
        wstat[0, w] = 0.0
    for j in range(m):
        for w in range(nw):
            wstat[0, w] += snap[j, w]
    for w in range(nw):
        wstat[0, w] /= m
        wstat[1, w] = 0.0
    for j in range(m):
        for w in range(nw):
            wstat[1, w] += (snap[j, w] - wstat[0, w]) ** 2
    for w in range(nw):
        wstat[1, w] = np.sqrt(wstat[1, w] / m)
        wstat[2, w] = quantile_sorted(snap[:, w], m, 0.25)
        wstat[3, w] = quantile_sorted(snap[:, w], m, 0.5)
        wstat[4, w] = quantile_sorted(snap[:, w], m, 0.75)
        wstat[5, w] = snap[0, w]
        wstat[6, w] = quantile_sorted(snap[:, w], m, 0.10)
    if m < 2:
        for w in range(nw):
            wstat[7, w] = 0.0
            wstat[8, w] = np.inf
            wstat[9, w] = 0.0
        return
    # largest log-gap: the first maximum of log(max(a[j+1], 1e-6) / max(a[j], 1e-6)). Ratios are
    # compared instead of logs; only ratios within 1e-9 of the largest (which log may round to the
    # same value) have their log taken, the first largest log wins, as in a loop over all logs.
    for w in range(nw):
        best[w] = -1.0
    for j in range(m - 1):
        for w in range(nw):
            r = max(snap[j + 1, w], 1e-6) / max(snap[j, w], 1e-6)
            rat[j, w] = r
            best[w] = r if r > best[w] else best[w]
    for w in range(nw):
        best[w] = best[w] * (1.0 - 1e-9)  # the candidates' bound
        ncand[w] = 0
        first[w] = m
    for j in range(m - 1):
        for w in range(nw):
            c = rat[j, w] >= best[w]
            ncand[w] += 1 if c else 0
            first[w] = j if (c and j < first[w]) else first[w]
    for w in range(nw):
        g = -1.0
        val = np.inf
        if ncand[w] == 1:
            j = first[w]
            g = np.log(rat[j, w])
            val = snap[j + 1, w]
        elif ncand[w] > 1:
            done = -1.0  # a ratio equal to one already seen has the same log: never strictly larger
            for j in range(first[w], m - 1):
                r = rat[j, w]
                if r >= best[w] and r != done:
                    lg = np.log(r)
                    done = r
                    if lg > g:
                        g = lg
                        val = snap[j + 1, w]
        wstat[7, w] = g
        wstat[8, w] = val
        wstat[9, w] = np.log(max(snap[m - 1, w], 1e-6) / max(snap[0, w], 1e-6)) / (m - 1)


@njit(cache=True, nogil=True)
def _group_stats(vals, order, s, e, window, out, srt, snap, rat, wstat, best, ncand, first, win_of):
    """Windowed statistics of ``vals`` over the rows ``order[s:e]`` (one op position, in iteration order).

    Element i's window is the ``window`` values centred on it, shifted to fit inside the group (a
    sorted window slid by one removal and one insertion). Each distinct window is snapshotted;
    batches of snapshots get their statistics together (:func:`_flush_windows`). ``out[k, i - s]``:
    mean, std, q1, q2, q3, min, p10, pct_rank, count, previous value (itself for the first), next
    value (itself for the last), largest log-gap of the sorted window, above-that-gap flag, mean
    log-gap.
    """
    W = _WBATCH
    half = window // 2
    m = min(e - s, window)
    for j in range(m):
        srt[j] = vals[order[s + j]]
    srt[:m].sort()
    cur_lo = s
    nw = 0
    for i in range(s, e + 1):
        dirty = i == s
        if i < e:
            lo = i - half
            if lo < s:
                lo = s
            if lo + m > e:
                lo = e - m
            while cur_lo < lo:  # slide by one: remove the oldest value, insert the next one
                old = vals[order[cur_lo]]
                new = vals[order[cur_lo + m]]
                k = _count_less(srt, m, old)  # == np.searchsorted(srt[:m], old)
                for j in range(k, m - 1):
                    srt[j] = srt[j + 1]
                k = _count_less(srt, m - 1, new)  # == np.searchsorted(srt[:m - 1], new)
                for j in range(m - 1, k, -1):
                    srt[j] = srt[j - 1]
                srt[k] = new
                cur_lo += 1
                dirty = True
        if (dirty and nw == W) or i == e:  # statistics of the batch; write its elements
            _flush_windows(snap, m, nw, wstat, rat, best, ncand, first)
            win_of[nw] = i
            for w in range(nw):
                for p in range(win_of[w], win_of[w + 1]):
                    q = p - s
                    out[0, q] = wstat[0, w]
                    out[1, q] = wstat[1, w]
                    out[2, q] = wstat[2, w]
                    out[3, q] = wstat[3, w]
                    out[4, q] = wstat[4, w]
                    out[5, q] = wstat[5, w]
                    out[6, q] = wstat[6, w]
                    out[11, q] = wstat[7, w]
                    out[12, q] = 1.0 if vals[order[p]] >= wstat[8, w] else 0.0
                    out[13, q] = wstat[9, w]
            nw = 0
        if i == e:
            break
        if dirty:
            for j in range(m):
                snap[j, nw] = srt[j]
            win_of[nw] = i
            nw += 1
        v = vals[order[i]]
        if m <= 256:  # np.searchsorted(srt[:m], v, side="left") and side="right", branch-free
            lt = 0
            le = 0
            for j in range(m):
                lt += 1 if srt[j] < v else 0
                le += 1 if srt[j] <= v else 0
        else:
            lt = np.searchsorted(srt[:m], v, side="left")
            le = np.searchsorted(srt[:m], v, side="right")
        q = i - s
        out[7, q] = (lt + 0.5 * (le - lt)) / m
        out[8, q] = m
        out[9, q] = vals[order[i - 1]] if i > s else v
        out[10, q] = vals[order[i + 1]] if i + 1 < e else v


@njit(cache=True, nogil=True)
def _window_stats(vals, order, starts, stops, window, out):
    """:func:`_group_stats` of every group ``[starts[g], stops[g])``; ``out[k, row]`` in table order."""
    L = 1
    for g in range(starts.size):
        L = max(L, stops[g] - starts[g])
    srt, snap, rat, wstat, best, ncand, first, win_of = _window_scratch(min(window, L))
    buf = np.empty((14, L), dtype=np.float64)
    for g in range(starts.size):
        s = starts[g]
        e = stops[g]
        _group_stats(vals, order, s, e, window, buf, srt, snap, rat, wstat, best, ncand, first, win_of)
        for p in range(s, e):
            for k in range(14):
                out[k, order[p]] = buf[k, p - s]


@njit(cache=True, nogil=True)
def _window_scratch(m):
    """Work arrays of :func:`_group_stats` for windows of at most ``m`` values."""
    W = _WBATCH
    window = max(m, 1)
    return (np.empty(window, dtype=np.float64), np.empty((window, W), dtype=np.float64),
            np.empty((window, W), dtype=np.float64), np.empty((10, W), dtype=np.float64),
            np.empty(W, dtype=np.float64), np.empty(W, dtype=np.int64), np.empty(W, dtype=np.int64),
            np.empty(W + 1, dtype=np.int64))


@njit(cache=True, nogil=True)
def _dense_index(a, lo, span):
    """``(sorted distinct values, index of each element among them)`` like ``np.unique(a,
    return_inverse=True)``, for integers within ``[lo, lo + span)``."""
    seen = np.zeros(span, np.int64)
    for i in range(a.size):
        seen[a[i] - lo] = 1
    k = 0
    for v in range(span):
        if seen[v]:
            seen[v] = k
            k += 1
        else:
            seen[v] = -1
    vals = np.empty(k, a.dtype)
    inv = np.empty(a.size, np.int64)
    for v in range(span):
        if seen[v] >= 0:
            vals[seen[v]] = lo + v
    for i in range(a.size):
        inv[i] = seen[a[i] - lo]
    return vals, inv


@njit(cache=True, nogil=True)
def _per_iteration(inv, n_it, st, en, dur, ixf):
    """Per iteration: first start, last end, summed op time (row order, as ``np.bincount``), max op_index (>= 0)."""
    first = np.full(n_it, np.iinfo(np.int64).max, dtype=np.int64)
    last = np.full(n_it, np.iinfo(np.int64).min, dtype=np.int64)
    comm = np.zeros(n_it, np.float64)
    max_ix = np.zeros(n_it, np.float64)
    for i in range(inv.size):
        k = inv[i]
        if st[i] < first[k]:
            first[k] = st[i]
        if en[i] > last[k]:
            last[k] = en[i]
        comm[k] += dur[i]
        if ixf[i] > max_ix[k]:
            max_ix[k] = ixf[i]
    return first, last, comm, max_ix


@njit(cache=True, nogil=True)
def _issue_order_sorted(it, ix):
    """Whether rows are already ordered by (iteration, op_index): then ``np.lexsort((ix, it))`` is the identity."""
    for i in range(1, it.size):
        if it[i] < it[i - 1] or (it[i] == it[i - 1] and ix[i] < ix[i - 1]):
            return False
    return True


@njit(cache=True, nogil=True)
def _gaps(order_t, st, en, gap):
    """Compute time before each op in issue order: start minus the latest end of the ops before it (ms, >= 0)."""
    prev_end = np.iinfo(np.int64).min
    for p in range(order_t.size):
        i = order_t[p]
        if p == 0:
            gap[i] = 0.0
        else:
            d = st[i] - prev_end
            gap[i] = (d if d > 0 else 0) / 1e6
        if en[i] > prev_end:
            prev_end = en[i]


@njit(cache=True, nogil=True)
def _group_order(key, key_lo, key_span, inv, n_it):
    """Rows sorted by (key, iteration), stable (``np.lexsort((it, key))``), and the group bounds.

    Two stable counting sorts: by iteration index, then by key.
    """
    n = key.size
    cnt = np.zeros(n_it + 1, np.int64)
    for i in range(n):
        cnt[inv[i] + 1] += 1
    for k in range(n_it):
        cnt[k + 1] += cnt[k]
    by_it = np.empty(n, np.int64)
    for i in range(n):
        by_it[cnt[inv[i]]] = i
        cnt[inv[i]] += 1
    kc = np.zeros(key_span + 1, np.int64)
    for i in range(n):
        kc[key[i] - key_lo + 1] += 1
    n_groups = 0
    for k in range(key_span):
        if kc[k + 1] > 0:
            n_groups += 1
        kc[k + 1] += kc[k]
    order = np.empty(n, np.int64)
    for p in range(n):
        i = by_it[p]
        k = key[i] - key_lo
        order[kc[k]] = i
        kc[k] += 1
    starts = np.empty(n_groups, np.int64)
    stops = np.empty(n_groups, np.int64)
    g = 0
    for p in range(n):
        if p == 0 or key[order[p]] != key[order[p - 1]]:
            if g > 0:
                stops[g - 1] = p
            starts[g] = p
            g += 1
    stops[n_groups - 1] = n
    return order, starts, stops


@njit(cache=True, nogil=True)
def _mx(a, b):  # np.maximum (NaN propagates)
    return a if (a >= b or a != a) else b


@njit(cache=True, nogil=True)
def _mn(a, b):  # np.minimum (NaN propagates)
    return a if (a <= b or a != a) else b


@njit(cache=True, nogil=True)
def _sdiv(a, b, floor):  # _safe_div
    return a / _mx(b, floor)


@njit(cache=True, nogil=True)
def _put(X, i, j, v):
    """``X[i, j] = float32(v)`` then ``np.nan_to_num(nan=0, posinf=1e4, neginf=-1e4)``."""
    f = np.float32(v)
    if not abs(f) <= _F32_MAX:  # NaN or +-inf (one well-predicted test for the finite values)
        f = np.float32(0.0) if f != f else (np.float32(1e4) if f > 0 else np.float32(-1e4))
    X[i, j] = f


@njit(cache=True, nogil=True)
def _context_means(key, span, lr, slow_thr):
    """Per-row mean of ``lr`` over the rows sharing ``key`` (sums in row order, as ``np.bincount``),
    the group's row count and its fraction of rows with ``lr > slow_thr``."""
    s = np.zeros(span, np.float64)
    c = np.zeros(span, np.float64)
    sl = np.zeros(span, np.float64)
    for i in range(key.size):
        k = key[i]
        s[k] += lr[i]
        c[k] += 1.0
        sl[k] += 1.0 if lr[i] > slow_thr else 0.0
    return s, c, sl


@njit(cache=True, nogil=True)
def _features_core(X, dur, gap, order, starts, stops, window, it_ms, inv, comm_it, max_ix, ixf, log2_nb,
                   op_code, is_p2p, avg_op, iter_med, comm_med, p10_out):
    """Every feature but the iteration-context ones (29..33), group by group.

    The gap and duration statistics of a group go to small buffers and straight into the group's
    rows of ``X``: the same float64 formulas as the numpy reference, cast to float32, with
    ``np.nan_to_num(nan=0, posinf=1e4, neginf=-1e4)``. ``p10_out[row]``: the duration window's p10.
    """
    L = 1
    for g in range(starts.size):
        L = max(L, stops[g] - starts[g])
    srt, snap, rat, wstat, best, ncand, first, win_of = _window_scratch(min(window, L))
    sd = np.empty((14, L), dtype=np.float64)
    sg = np.empty((14, L), dtype=np.float64)
    tiny = 1e-6
    v = np.zeros(X.shape[1], dtype=np.float64)   # one row's features (float64) before the cast
    for g in range(starts.size):
        s = starts[g]
        e = stops[g]
        _group_stats(gap, order, s, e, window, sg, srt, snap, rat, wstat, best, ncand, first, win_of)
        _group_stats(dur, order, s, e, window, sd, srt, snap, rat, wstat, best, ncand, first, win_of)
        for p in range(s, e):
            q = p - s
            i = order[p]
            d = dur[i]
            mean = sd[0, q]
            std = sd[1, q]
            q1 = sd[2, q]
            q2 = sd[3, q]
            q3 = sd[4, q]
            mn = sd[5, q]
            p10 = sd[6, q]
            prev = sd[9, q]
            nxt = sd[10, q]
            gsz = sd[11, q]
            gabove = sd[12, q]
            gmed = sd[13, q]
            iqr = q3 - q1
            k = inv[i]
            im = it_ms[k]
            gp = gap[i]
            p10_out[i] = p10
            v[0] = d                      # dur_ms
            v[1] = im                     # iter_ms
            v[2] = mean                   # win_mean_ms
            v[3] = std                    # win_std_ms
            v[4] = q1                     # q1_ms
            v[5] = q2                     # q2_ms
            v[6] = q3                     # q3_ms
            v[7] = iqr                    # iqr_ms
            v[8] = avg_op                 # win_avg_op_ms
            v[9] = gp                     # gap_ms
            v[10] = _mn(_mx(_sdiv(d - mean, _mx(std, 1e-3 * abs(mean)), tiny), -1e4), 1e4)   # zscore
            v[11] = _mn(_mx(_sdiv(d - q2, _mx(iqr, 1e-3 * abs(q2)), tiny), -1e4), 1e4)      # robust_z
            v[12] = _mn(_sdiv(d, q2, tiny), 1e4)          # ratio_q2
            v[13] = _mn(_sdiv(d, mn, tiny), 1e4)          # ratio_min
            v[14] = _mn(_sdiv(d, p10, tiny), 1e4)         # ratio_p10
            v[15] = sd[7, q]                              # pct_rank
            v[16] = _mn(_sdiv(std, mean, tiny), 1e4)      # cv
            v[17] = _sdiv(d, im, tiny)                    # share_iter
            v[18] = _mn(_sdiv(d, avg_op, tiny), 1e4)      # ratio_avg_op
            v[19] = _sdiv(d - p10, iter_med, tiny)        # excess_share
            v[20] = _mn(_sdiv(gp + tiny, sg[3, q] + tiny, tiny), 1e4)   # gap_ratio_q2
            v[21] = _mn(_sdiv(gp + tiny, sg[5, q] + tiny, tiny), 1e4)   # gap_ratio_min
            v[22] = _sdiv(gp - sg[6, q], iter_med, tiny)  # gap_share
            v[23] = _sdiv(im, iter_med, tiny)             # iter_ratio
            v[24] = _sdiv(comm_it[k], comm_med, tiny)     # iter_comm_ratio
            v[25] = _mn(_sdiv(d, prev, tiny), 1e4)        # prev_ratio
            v[26] = sd[8, q]                              # win_count
            med3 = _mx(_mn(prev, d), _mn(_mx(prev, d), nxt))      # np.median of (prev, dur, next)
            v[27] = _mn(_sdiv(med3, p10, tiny), 1e4)      # local_ratio
            v[28] = d - p10                               # excess_ms
            v[34] = gsz                                   # gap_lsize
            v[35] = gabove                                # above_gap
            v[36] = _mn(_sdiv(gsz, gmed, 1e-6), 1e4)      # gap_rel
            v[37] = gabove * gsz                          # above_gap_lsize
            v[38] = log2_nb[i]                            # log2_nbytes
            v[39] = op_code[i]                            # op_code
            v[40] = is_p2p[i]                             # is_p2p
            v[41] = _sdiv(ixf[i], max_ix[k], 1.0)         # pos_frac
            for j in range(29):
                _put(X, i, j, v[j])
            for j in range(34, 42):
                _put(X, i, j, v[j])


@njit(cache=True, nogil=True)
def _context_features(X, lr, slow_thr, k_op, n_op, k_comm, n_comm, inv, n_it):
    """Features 29..33: the mean of ``lr`` over the rows of the same iteration with the same
    (comm_id, op code) / comm_id / any op, sums in row order (as ``np.bincount``), the group's
    row count and its fraction of rows with ``lr > slow_thr``."""
    s_op, c_op, _ = _context_means(k_op, n_op, lr, slow_thr)
    s_comm, c_comm, sl_comm = _context_means(k_comm, n_comm, lr, slow_thr)
    s_it, c_it, _ = _context_means(inv, n_it, lr, slow_thr)
    for i in range(X.shape[0]):
        ko = k_op[i]
        kc = k_comm[i]
        ki = inv[i]
        _put(X, i, 29, s_op[ko] / c_op[ko])                   # ctx_op_lratio
        _put(X, i, 30, s_comm[kc] / c_comm[kc])               # ctx_comm_lratio
        _put(X, i, 31, s_it[ki] / c_it[ki])                   # ctx_iter_lratio
        _put(X, i, 32, sl_comm[kc] / c_comm[kc])              # ctx_comm_slow_frac
        _put(X, i, 33, c_op[ko])                              # ctx_op_count

