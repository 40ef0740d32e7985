"""Robust statistics shared by every stage: grouped quantiles, MAD and the healthy spread.

One home for the numbers Holmes compares things with. Groups are given as an ``order`` (row
indices sorted by group) and ``bounds`` (the start of each group in ``order``, then ``n``), the
form :func:`group_order` returns, so a caller that needs several statistics of the same grouping
sorts once.

* :data:`MAD_SIGMA` -- 1.4826: the MAD of a normal sample times this is its standard deviation.
* :func:`robust_sigma` -- ``MAD_SIGMA * median(|x - median(x)|)``.
* :func:`group_quantiles` -- per row, quantiles of its group (one sort per group for all of them;
  the median exactly as :func:`numpy.median`, others interpolated as :func:`numpy.quantile`).
* :func:`healthy_low` -- per row, its group's 10th percentile and *healthy spread*
  ``(q25 - q05) / 0.97``, the normal-equivalent sigma of the fastest quarter, which a fault that
  slows under ~3/4 of the samples does not inflate.
* :func:`excess_over_low` -- ``max(0, x - low quantile of its group)`` without interpolation.

Examples
--------
>>> import numpy as np
>>> robust_sigma(np.array([1.0, 2.0, 3.0, 4.0, 100.0]))
1.4826
>>> order, bounds = group_order(np.array([0, 1, 0, 1, 0]))
>>> group_quantiles(np.array([1.0, 10.0, 3.0, 20.0, 2.0]), order, bounds, [0.5]).tolist()
[[2.0, 15.0, 2.0, 15.0, 2.0]]
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Sequence

import numpy as np

from holmes._jit import njit

__all__ = ["MAD_SIGMA", "NORMAL_Q25_Q05", "HEALTHY_SPREAD_QS", "MEDIAN_SE", "TIE_RTOL", "P_FLOOR", "PROB_FLOOR", "SHAPE_EPS", "RATIO_FLOOR", "BELOW_ONE", "low_spread", "pooled_low_spread", "row_spread", "robust_sigma", "group_order", "group_quantiles", "group_medians",
           "median_by_group", "recurring",
           "healthy_low", "excess_over_low", "quantile_sorted", "nan_quiet"]

MAD_SIGMA = 1.4826
"""Scale of the median absolute deviation to a normal standard deviation."""

NORMAL_Q25_Q05 = 0.9704
"""``z(0.25) - z(0.05)`` of the standard normal: the healthy spread's denominator."""

HEALTHY_SPREAD_QS = (0.05, 0.25)
"""The quantiles whose difference over :data:`NORMAL_Q25_Q05` is the *healthy spread*."""

MEDIAN_SE = 1.2533
"""``sqrt(pi / 2)``: the standard error of a median of ``n`` normal samples is ``MEDIAN_SE * sigma / sqrt(n)``."""

TIE_RTOL = 1e-9
"""Tolerance under which two sums of floating-point weights count as equal (ties): relative, or
absolute on sums of weights of order 1."""

P_FLOOR = 1e-300
"""The smallest p-value kept finite under a logarithm."""

PROB_FLOOR = 1e-12
"""The smallest chance level a binomial tail is computed with."""

BELOW_ONE = float(np.nextafter(1.0, 0.0))
"""The largest float below 1: a probability kept under 1 inside ``log1p(-p)``."""

RATIO_FLOOR = 1e-9
"""The smallest ratio a value is divided by (a ratio of durations that is 0 or less)."""

SHAPE_EPS = 1e-9
"""A generalized Pareto shape at most this is the exponential tail (its limit as the shape goes to 0)."""


_HEALTHY_QS = np.array([0.1, 0.05, 0.25])


@contextlib.contextmanager
def nan_quiet() -> Iterator[None]:
    """Silence numpy's floating-point errors and its ``RuntimeWarning`` s (an all-NaN slice, a
    mean of nothing) inside the block: statistics over rows or columns some of which hold no
    measurement (an iteration nobody logged, an operator position absent from every iteration),
    whose NaN results the caller handles.

    >>> import numpy as np
    >>> with nan_quiet():
    ...     np.nanmedian(np.array([[np.nan, 1.0], [np.nan, 3.0]]), axis=0).tolist()
    [nan, 2.0]
    """
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def robust_sigma(x: np.ndarray) -> float:
    """``MAD_SIGMA * median(|x - median(x)|)``: a standard deviation that outliers do not inflate.

    >>> robust_sigma(np.array([5.0, 5.0, 5.0]))
    0.0
    """
    a = np.asarray(x, dtype=np.float64)
    if a.size == 0:
        return float("nan")
    return float(MAD_SIGMA * np.median(np.abs(a - np.median(a))))


def group_order(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(order, bounds)`` of integer group keys: rows sorted by key (stable), and the start of
    each group in that order followed by ``n``.

    >>> [a.tolist() for a in group_order(np.array([2, 0, 2]))]
    [[1, 0, 2], [0, 1, 3]]
    """
    k = np.asarray(keys)
    order = np.argsort(k, kind="stable")
    ks = k[order]
    bounds = np.concatenate(([0], np.flatnonzero(ks[1:] != ks[:-1]) + 1, [k.size])).astype(np.int64)
    return order.astype(np.int64), bounds


@njit(cache=True, nogil=True)
def quantile_sorted(a, m, q):  # pragma: no cover - compiled
    """The ``q`` quantile of the sorted ``a[:m]``, interpolated linearly as ``np.quantile``."""
    pos = q * (m - 1)
    lo = int(np.floor(pos))
    hi = min(lo + 1, m - 1)
    frac = pos - lo
    return a[lo] + (a[hi] - a[lo]) * frac


@njit(cache=True, nogil=True)
def _group_quantiles(values, order, bounds, qs, out):  # pragma: no cover - compiled
    for g in range(bounds.size - 1):
        a = bounds[g]
        c = bounds[g + 1] - a
        tmp = np.empty(c)
        for k in range(c):
            tmp[k] = values[order[a + k]]
        tmp.sort()
        for j in range(qs.size):
            q = qs[j]
            if q == 0.5:
                v = (tmp[(c - 1) // 2] + tmp[c // 2]) / 2.0
            else:
                x = q * (c - 1)
                lo = int(np.floor(x))
                hi = min(lo + 1, c - 1)
                v = tmp[lo] + (tmp[hi] - tmp[lo]) * (x - lo)
            for k in range(c):
                out[j, order[a + k]] = v


def group_quantiles(values: np.ndarray, order: np.ndarray, bounds: np.ndarray, qs: Sequence[float],
                    out: np.ndarray | None = None) -> np.ndarray:
    """``out[j, i]``: the ``qs[j]`` quantile of ``values`` over the rows of row i's group.

    Each group is sorted once for all the quantiles; ``q = 0.5`` is the median as
    :func:`numpy.median` computes it, the others interpolate as :func:`numpy.quantile`.
    """
    q = np.ascontiguousarray(qs, dtype=np.float64)
    v = np.ascontiguousarray(values, dtype=np.float64)
    if out is None:
        out = np.empty((q.size, v.size))
    if v.size:
        _group_quantiles(v, order, bounds, q, out)
    return out


def group_medians(values: np.ndarray, order: np.ndarray, bounds: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Per row, the median of ``values`` over the rows of its group (a 1-D array)."""
    res = group_quantiles(values, order, bounds, [0.5], None if out is None else out.reshape(1, -1))
    return res[0]


def median_by_group(group: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Per group id in ``range(n)``, the median of its ``values`` (NaN for an empty group).

    Two sorts (by value, then stably by the integer group: a radix sort), about half a lexsort's cost.

    >>> median_by_group(np.array([1, 0, 1, 1]), np.array([5.0, 2.0, 1.0, 3.0]), 3).tolist()
    [2.0, 3.0, nan]
    """
    out = np.full(n, np.nan)
    v = np.asarray(values, np.float64)
    if not v.size:
        return out
    g = np.asarray(group, np.int64)
    o = np.argsort(v)
    o = o[np.argsort(g[o], kind="stable")]
    vs = v[o]
    cnt = np.bincount(g, minlength=n)[:n]
    start = np.r_[0, np.cumsum(cnt)[:-1]]
    has = cnt > 0
    out[has] = (vs[start[has] + (cnt[has] - 1) // 2] + vs[start[has] + cnt[has] // 2]) / 2.0
    return out


def healthy_low(values: np.ndarray, order: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row, its group's 10th percentile and healthy spread ``(q25 - q05) / 0.97``.

    A fault only slows, so while it covers under ~3/4 of the samples (a fluctuation covers about
    half) the fast quarter is healthy, where the MAD is inflated by the slow samples.
    """
    q = group_quantiles(values, order, bounds, _HEALTHY_QS)
    return q[0], (q[2] - q[1]) / NORMAL_Q25_Q05


def excess_over_low(values: np.ndarray, groups: np.ndarray, quantile: float) -> np.ndarray:
    """``max(0, values - ref[group])`` with ``ref`` the lower ``quantile`` of each group's values
    (the order statistic at ``floor(quantile * (size - 1))``, no interpolation), as int64.

    >>> excess_over_low(np.array([5, 7, 1, 9, 5]), np.array([0, 0, 1, 1, 0]), 0.0).tolist()
    [0, 2, 0, 8, 0]
    """
    n = len(values)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort((values, groups))
    g = groups[order]
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    sizes = np.diff(np.r_[starts, n])
    pick = starts + np.floor(quantile * (sizes - 1)).astype(np.int64)
    ref_sorted = np.repeat(values[order][pick], sizes)
    ref = np.empty(n, dtype=values.dtype)
    ref[order] = ref_sorted
    return np.maximum(values - ref, 0).astype(np.int64)


#: ``z(0.5) - z(0.1)`` and ``z(0.4) - z(0.1)`` of the standard normal: the lower-part spreads' denominators
_Q10_Q50, _Q10_Q40 = 1.2816, 1.0283


def low_spread(x: np.ndarray) -> np.ndarray:
    """Per row, a normal's sigma from its lower half, ``(q50 - q10) / 1.2816``: a slowdown of
    up to half of the iterations (which only adds to the upper half) leaves it on the healthy
    level. NaN for a row without a cell.

    >>> low_spread(np.array([[1.0, 2.0, 3.0, 4.0, 5.0]])).round(3).tolist()
    [1.248]
    """
    if x.ndim != 2 or not x.size:
        return np.full(x.shape[0] if x.ndim else 0, np.nan)
    with np.errstate(all="ignore"):
        q10, q50 = np.nanquantile(x, [0.10, 0.50], axis=1)
    return (q50 - q10) / _Q10_Q50


def pooled_low_spread(x: np.ndarray) -> float:
    """A normal's sigma from the lower part of every finite value of ``x`` together, ``(q40 -
    q10) / 1.0283``: faults only add to the upper part, and up to half of the cells may be slowed
    (0 with under four values)."""
    v = x[np.isfinite(x)]
    if v.size < 4:
        return 0.0
    q10, q40 = np.quantile(v, [0.10, 0.40])
    return float(q40 - q10) / _Q10_Q40


def row_spread(x: np.ndarray) -> np.ndarray:
    """Per row, the smaller of two noise estimates that a slowdown inflates differently: the
    lower half's (:func:`low_spread`, a slowdown of under half of the iterations leaves it
    alone) and the successive differences' (a slowdown from some iteration to the end -- one
    step -- leaves it alone): ``MAD(diff) / sqrt(2)`` (with three columns or more)."""
    low = low_spread(x)
    if x.shape[1] < 3:
        return low
    with np.errstate(all="ignore"):
        d = np.diff(x, axis=1)
        dm = MAD_SIGMA * np.nanmedian(np.abs(d - np.nanmedian(d, axis=1, keepdims=True)), axis=1) / np.sqrt(2.0)
    return np.fmin(low, dm)


def recurring(keys: Sequence[object], slots: int, alpha: float) -> set[object]:
    """The keys that recur more often than chance allows.

    ``keys`` are the places (a rank, a host) where ``len(keys)`` events fell, out of ``slots``
    equally likely places. A key holding ``c`` of them recurs when the chance that *any* place
    holds ``c`` or more, were the events spread at random (``slots`` times the binomial tail),
    is at most ``alpha``. One event on a place is never a recurrence.

    >>> sorted(recurring(["gpu:2"] * 4 + ["gpu:0"], 4, 0.1))
    ['gpu:2']
    >>> recurring(["gpu:0", "gpu:3", "gpu:3", "gpu:1"], 4, 0.1)
    set()
    """
    from scipy.stats import binom

    n = len(keys)
    if n < 2 or slots < 1:
        return set()
    counts: dict[object, int] = {}
    for k in keys:
        counts[k] = counts.get(k, 0) + 1
    p = 1.0 / max(slots, 1)
    return {k for k, c in counts.items() if c >= 2 and slots * float(binom.sf(c - 1, n, p)) <= alpha}
