"""Upper tails of a job's own noise, and how surprising a cell is under them.

A cell (a rank's compute, a channel's transfer, in one iteration; :mod:`holmes.localize.irregular.cells`)
is judged against a *null*: cells of the same job that no fault of the judged device touches
(the other hosts' ranks, the channels that share no rank with it). Only the null's upper tail
matters, and it is modelled from the null itself:

* :func:`tail_fit`: an exponential tail fitted between the null's 90th and 99th percentiles (the
  default; a few extreme cells -- faults elsewhere in the job -- weigh nothing in it);
* :func:`gpd_fit`: a generalized Pareto tail fitted to every excess over the 90th percentile
  (heavier where the null's extremes are heavy: a loaded machine's stalls);

and :func:`tail_pvalue` turns a z-score into the chance that one of ``n`` null cells reaches it.

Examples
--------
>>> import numpy as np
>>> from holmes.localize.irregular.tails import tail_pvalue
>>> rng = np.random.default_rng(0)
>>> z = rng.standard_exponential(2000)
>>> bool(tail_pvalue(z, float(z.max())) > 0.05), tail_pvalue(z, 40.0) < 1e-6
(True, True)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from holmes.calibration.thresholds import or_shipped
from holmes.stats import BELOW_ONE, SHAPE_EPS

__all__ = ["tail_fit", "gpd_fit", "tail_pvalue", "familywise"]


def familywise(p: Any, n: int) -> Any:
    """The chance that one of ``n`` independent cells, each reaching a level with probability
    ``p``, does: ``1 - (1 - p)^n`` (computed without loss for tiny ``p``).

    >>> round(familywise(0.01, 10), 4)
    0.0956
    """
    with np.errstate(all="ignore"):
        fw = -np.expm1(n * np.log1p(-np.minimum(np.asarray(p, dtype=np.float64), BELOW_ONE)))
    return float(fw) if np.ndim(fw) == 0 else fw


def tail_fit(cells: np.ndarray, *, lo: float | None = None, hi: float | None = None, min_cells: int | None = None,
             min_scale: float | None = None) -> tuple[float, float]:
    """``(threshold, scale)`` of an exponential upper tail fitted to ``cells`` (finite values):
    the ``lo`` quantile and the mean excess over it of the cells up to the ``hi`` quantile (a few
    extreme cells, the faults, weigh nothing in it). Defaults: the thresholds ``tail_q``,
    ``tail_body_q``, ``tail_min_cells`` (fewer: no tail, nothing is significant) and
    ``tail_min_scale`` (the smallest scale)."""
    q_lo, scale, _ = _exponential_fit(cells, lo=lo, hi=hi, min_cells=min_cells, min_scale=min_scale)
    return q_lo, scale


def _exponential_fit(cells: np.ndarray, *, lo: float | None = None, hi: float | None = None,
                     min_cells: int | None = None, min_scale: float | None = None) -> tuple[float, float, int]:
    """:func:`tail_fit`'s ``(threshold, scale)`` and how many cells the scale averaged (0: no tail)."""
    lo, hi = or_shipped(lo, "tail_q"), or_shipped(hi, "tail_body_q")
    min_scale = or_shipped(min_scale, "tail_min_scale")
    x = np.asarray(cells, dtype=np.float64)
    x = x[np.isfinite(x)]
    if x.size < or_shipped(min_cells, "tail_min_cells"):
        return np.inf, 1.0, 0
    q_lo, q_hi = np.quantile(x, [lo, hi])
    body = x[(x >= q_lo) & (x <= q_hi)]
    return float(q_lo), max(float(body.mean() - q_lo) if body.size else 0.0, min_scale), int(body.size)


def gpd_fit(cells: np.ndarray, *, lo: float | None = None, max_shape: float | None = None, min_cells: int | None = None,
            min_scale: float | None = None, min_excesses: int | None = None) -> tuple[float, float, float]:
    """``(threshold, scale, shape)`` of a generalized Pareto upper tail fitted to *every* excess
    of ``cells`` over their ``lo`` quantile, by probability-weighted moments (Hosking & Wallis
    1987; stable on a few dozen excesses), the shape clipped to ``[0, max_shape]``: 0 is the
    exponential tail, larger is heavier. Meant for a null of cells no fault touches (the other
    hosts' ranks, the channels sharing no rank): its extremes are the job's own noise, and a
    loaded machine's rare stalls make the tail heavy instead of passing for faults. Defaults: the
    thresholds ``tail_q``, ``gpd_max_shape``, ``tail_min_cells``, ``tail_min_scale`` (and
    ``gpd_min_excesses``: fewer excesses, the smallest scale).

    >>> rng = np.random.default_rng(0)
    >>> round(gpd_fit(rng.standard_exponential(5000))[2], 1)
    0.0
    >>> gpd_fit(rng.pareto(2.0, 5000))[2] > 0.3
    True
    """
    lo, max_shape = or_shipped(lo, "tail_q"), or_shipped(max_shape, "gpd_max_shape")
    min_scale = or_shipped(min_scale, "tail_min_scale")
    x = np.asarray(cells, dtype=np.float64)
    x = x[np.isfinite(x)]
    if x.size < or_shipped(min_cells, "tail_min_cells"):
        return np.inf, 1.0, 0.0
    q_lo = float(np.quantile(x, lo))
    y = np.sort(x[x > q_lo] - q_lo)
    n = y.size
    if n < or_shipped(min_excesses, "gpd_min_excesses"):
        return q_lo, min_scale, 0.0
    a0 = float(y.mean())
    a1 = float(np.mean(y * (n - 1 - np.arange(n)) / (n - 1)))
    d = a0 - 2.0 * a1
    if d <= 0 or a0 <= 0:
        return q_lo, max(a0, min_scale), 0.0
    shape = 2.0 - a0 / d
    scale = 2.0 * a0 * a1 / d
    shape = float(np.clip(shape, 0.0, max_shape))
    if shape == 0.0:
        scale = a0
    return q_lo, max(float(scale), min_scale), shape


def tail_pvalue(cells: np.ndarray, z: Any, *, n: int | None = None, lo: float | None = None,
                model: str = "exponential", predictive: bool = False, predictive_below: int = 0,
                **fit: Any) -> Any:
    """Family-wise p-value of a cell reaching ``z`` (a number or an array), the tail fitted to
    ``cells``: the chance that one of ``n`` cells (default: as many as ``cells``) does,
    ``1 - (1 - p)^n``. ``model`` ``"exponential"`` (:func:`tail_fit`): ``p = (1 - lo)
    exp(-(z - q_lo) / scale)``, or with ``predictive`` ``p = (1 - lo) (1 + (z - q_lo) / (k
    scale))^(-k)``, ``k`` the cells the scale was averaged over (the exponential's posterior
    predictive tail: the scale's own uncertainty, which matters when ``k`` is a handful; without
    ``predictive``, still so when ``k`` is under ``predictive_below``);
    ``"gpd"`` (:func:`gpd_fit`): ``p = (1 - lo) (1 + shape (z - q_lo) / scale)^(-1 / shape)``.
    ``lo``: threshold ``tail_q``; ``fit``: the other keywords of the fit (``min_cells``,
    ``min_scale``; ``hi`` for the exponential tail, ``max_shape`` and ``min_excesses`` for the GPD)."""
    lo = or_shipped(lo, "tail_q")
    k = 0  # predictive: the cells the exponential scale averaged
    if model == "gpd":
        q_lo, beta, xi = gpd_fit(cells, lo=lo, **{key: v for key, v in fit.items() if key != "hi"})
    else:
        q_lo, beta, body = _exponential_fit(cells, lo=lo, **{key: v for key, v in fit.items()
                                                             if key not in ("max_shape", "min_excesses")})
        xi, k = 0.0, (body if predictive or body < predictive_below else 0)
    n = int(np.isfinite(np.asarray(cells, dtype=np.float64)).sum()) if n is None else n
    zz = np.asarray(z, dtype=np.float64)
    with np.errstate(all="ignore"):
        t = np.maximum(zz - q_lo, 0.0) / beta
        if k > 0:  # the scale is the mean of k excesses: the exponential's predictive tail (Lomax)
            tail = np.power(1.0 + t / k, -float(k))
        else:
            tail = np.exp(-t) if xi <= SHAPE_EPS else np.power(1.0 + xi * t, -1.0 / xi)
        p = np.where(zz > q_lo, (1.0 - lo) * tail, 1.0)
        fw = np.where(np.isfinite(zz), familywise(p, n), 1.0)
    return float(fw) if fw.ndim == 0 else fw
