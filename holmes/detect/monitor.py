"""The iteration monitor: delta-irregularity on a pivot rank (paper section 3.1, Definition 1).

**The one irregularity rule of Holmes** (:class:`IrregularityRule`): an iteration is *irregular*
when its duration is more than ``delta`` times a robust reference, the ``quantile``-th percentile
(default the 10th) of the reference durations. Unlike the paper's window mean, a low percentile
stays on the fault-free level when a persistent slowdown or a fluctuation covers much of the
reference. Every part of Holmes that calls an iteration irregular uses this rule:

* :func:`irregular_mask` -- the reference is the analysed window itself (what
  :func:`holmes.localize` and :class:`~holmes.detect.RobustDetector` use on a finished log);
* :class:`IterationMonitor` / :func:`irregular_iterations` -- streaming: the reference is the
  ``window`` iterations *before* each one (what a live monitor can know). The first iteration of a
  log has no history and is never irregular.

:func:`classify_episode` names the kind of an irregularity: an isolated ``"spike"``, a periodic
``"fluctuation"`` (Appendix B: a dominant DFT component) or a ``"persistent"`` degradation.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from holmes.errors import ConfigError
from holmes.stats import robust_sigma

__all__ = ["DEFAULT_DELTA", "IrregularityRule", "irregular_mask", "IterationMonitor", "irregular_iterations",
           "classify_episode", "episodes"]

log = logging.getLogger(__name__)

DEFAULT_DELTA = 1.1
"""The paper's delta: an iteration 10% longer than the reference is irregular."""

_Q20_Q02 = 1.2122  # z(0.20) - z(0.02) of the standard normal


def _check(delta: float, window: int) -> tuple[float, int]:
    d = _check_delta(delta)
    w = int(window)
    if w < 1 or w != window:
        raise ConfigError(f"window must be a positive integer (got {window!r})")
    return d, w


def _check_delta(delta: float) -> float:
    try:
        d = float(delta)
    except (TypeError, ValueError):
        raise ConfigError(f"delta must be a number > 1 (got {delta!r})") from None
    if not np.isfinite(d) or d <= 1.0:
        raise ConfigError(f"delta must be a number > 1 (got {delta!r})")
    return d


@dataclass(frozen=True)
class IrregularityRule:
    """``duration > delta * percentile(reference, quantile)``.

    Parameters
    ----------
    delta : float, default 1.1
        How much longer than the reference an irregular iteration lasts (> 1).
    quantile : float, default 10
        The reference percentile (0-100) of the reference durations.

    Examples
    --------
    >>> rule = IrregularityRule(delta=1.1)
    >>> rule.mask(np.array([10., 10.2, 9.9, 13., 10.1])).tolist()
    [False, False, False, True, False]
    >>> rule.is_irregular(11.5, [10.0, 10.4, 10.2])
    True
    """

    delta: float = DEFAULT_DELTA
    quantile: float = 10.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "delta", _check_delta(self.delta))
        q = float(self.quantile)
        if not 0.0 <= q <= 100.0:
            raise ConfigError(f"quantile must be in [0, 100] (got {self.quantile!r})")
        object.__setattr__(self, "quantile", q)

    def reference(self, durations: Sequence[float] | np.ndarray) -> float:
        """The reference duration of ``durations`` (nan when empty)."""
        d = np.asarray(durations, dtype=np.float64)
        return float(np.percentile(d, self.quantile)) if d.size else float("nan")

    def is_irregular(self, duration: float, reference_durations: Sequence[float] | np.ndarray) -> bool:
        """Whether one ``duration`` is irregular against ``reference_durations``."""
        ref = self.reference(reference_durations)
        return bool(np.isfinite(ref) and duration > self.delta * ref)

    def z_scores(self, durations: Sequence[float] | np.ndarray, min_rel_sigma: float = 0.002,
                 local: int | None = None, mad_floor: bool = False) -> np.ndarray:
        """How many healthy sigmas each duration stands above the reference.

        The healthy sigma is the spread of the fast side, ``(q20 - q02) / 1.212`` (the normal
        equivalent), relative to the reference and at least ``min_rel_sigma``: a slowdown only
        slows, so while it covers under ~4/5 of the window the fast side is the job's own noise.
        With ``local=k`` the reference of each iteration is the rule's percentile of the
        ``2k + 1`` iterations around it, so a slow drift of the whole job (load, thermals) is not
        an irregularity; the z-scores are then of the ratios to that local reference. With
        ``mad_floor`` the sigma is at least the window's MAD sigma: on a few dozen iterations the
        fast side alone is itself noisy (a clean job's 4% blip stood six of its sigmas out).

        >>> d = np.r_[np.random.default_rng(0).normal(100.0, 1.0, 200), [130.0]]
        >>> z = IrregularityRule().z_scores(d)
        >>> bool(z[-1] > 20), bool(z[:200].max() < 6)
        (True, True)
        >>> drift = np.linspace(100.0, 130.0, 60)                   # a slow drift, nothing irregular
        >>> bool(IrregularityRule().z_scores(drift, local=5).max() < 4)
        True
        """
        d = np.asarray(durations, dtype=np.float64)
        if d.size == 0:
            return np.zeros(0)
        if local:
            k = int(local)
            ref_t = np.array([np.percentile(d[max(0, i - k):i + k + 1], self.quantile) for i in range(d.size)])
            ratio = d / np.maximum(ref_t, 1e-12)
            q02, q20 = np.percentile(ratio, [2.0, 20.0])
            sigma = max((q20 - q02) / _Q20_Q02, min_rel_sigma)
            return (ratio - 1.0) / sigma
        return (d - self.reference(d)) / self.sigma(d, min_rel_sigma, mad_floor=mad_floor)

    def sigma(self, durations: Sequence[float] | np.ndarray, min_rel_sigma: float = 0.002,
              mad_floor: bool = False) -> float:
        """The healthy sigma of ``durations`` that :meth:`z_scores` divides by (same units).

        >>> rule = IrregularityRule()
        >>> d = np.random.default_rng(1).normal(100.0, 2.0, 500)
        >>> 1.5 < rule.sigma(d) < 2.5
        True
        """
        d = np.asarray(durations, dtype=np.float64)
        if d.size == 0:
            return float("nan")
        q02, q20 = np.percentile(d, [2.0, 20.0])
        sigma = max((q20 - q02) / _Q20_Q02, min_rel_sigma * self.reference(d), 1e-12)
        if mad_floor:
            sigma = max(sigma, robust_sigma(d))
        return float(sigma)

    def level_shift(self, durations: Sequence[float] | np.ndarray, min_block: int = 4,
                    min_rel_sigma: float = 0.002) -> tuple[int, float, float]:
        """The strongest step up of ``durations`` that lasts to the end: ``(k, t, shift)``, the
        step before index ``k``, ``shift`` the median after it minus the median before it, and
        ``t`` that shift in standard errors of the difference of two medians.

        The sigma is that of the successive differences (``MAD(diff) / sqrt 2``): a step is one
        difference and leaves it alone, where the window's own spread would grow with the step
        (a device slow from some iteration on, costing 5% of the step, stood two MAD sigmas out
        and no iteration was irregular). Both blocks hold at least ``min_block`` iterations. A
        slow drift (load, thermals) is no step: when a straight line (Theil-Sen) leaves smaller
        residuals than the two medians (their median absolute residuals), there is no step.
        ``(0, 0.0, 0.0)`` without a step up.

        >>> rng = np.random.default_rng(0)
        >>> d = np.r_[rng.normal(100, 1, 15), rng.normal(105, 1, 15)]
        >>> k, t, shift = IrregularityRule().level_shift(d)
        >>> bool(14 <= k <= 16), bool(t > 6), bool(4 < shift < 6)
        (True, True, True)
        >>> bool(IrregularityRule().level_shift(rng.normal(100, 1, 30))[1] < 4)
        True
        >>> IrregularityRule().level_shift(np.linspace(100, 110, 30) + rng.normal(0, 1, 30))  # a drift
        (0, 0.0, 0.0)
        """
        d = np.asarray(durations, dtype=np.float64)
        n = d.size
        if n < 2 * min_block:
            return 0, 0.0, 0.0
        sigma = max(robust_sigma(np.diff(d)) / np.sqrt(2.0), min_rel_sigma * self.reference(d), 1e-12)
        best = (0, 0.0, 0.0)
        for k in range(min_block, n - min_block + 1):
            shift = float(np.median(d[k:]) - np.median(d[:k]))
            t = shift / (sigma * np.sqrt(np.pi / 2.0) * np.sqrt(1.0 / k + 1.0 / (n - k)))
            if t > best[1]:
                best = (k, float(t), shift)
        k = best[0]
        if k:
            from scipy.stats import theilslopes

            i = np.arange(n, dtype=np.float64)
            slope, icept = theilslopes(d, i)[:2]
            step = np.abs(np.r_[d[:k] - np.median(d[:k]), d[k:] - np.median(d[k:])])
            line = np.abs(d - (icept + slope * i))
            if np.median(step) >= np.median(line):
                return 0, 0.0, 0.0
        return best

    def mask(self, durations: Sequence[float] | np.ndarray) -> np.ndarray:
        """Flags of ``durations`` against their own reference (the window is its own reference)."""
        d = np.asarray(durations, dtype=np.float64)
        if d.size == 0:
            return np.zeros(0, dtype=bool)
        return d > self.delta * self.reference(d)


def irregular_mask(durations: Sequence[float] | np.ndarray, delta: float = DEFAULT_DELTA,
                   quantile: float = 10.0) -> np.ndarray:
    """Iterations longer than ``delta`` x the ``quantile``-th percentile of the same durations.

    The batch form of :class:`IrregularityRule` on a finished window.

    >>> irregular_mask(np.array([10., 10.2, 9.9, 13., 10.1]), 1.1).tolist()
    [False, False, False, True, False]
    """
    return IrregularityRule(delta, quantile).mask(durations)


class IterationMonitor:
    """Streaming delta-irregularity detector for one (pivot) rank.

    Each iteration is judged by :class:`IrregularityRule` against the ``window`` iterations before it.

    Parameters
    ----------
    delta : float, default 1.1
        An iteration is irregular when it lasts more than ``delta`` x the reference.
    window : int, default 20
        How many preceding iterations form the reference.
    quantile : float, default 10
        The reference percentile of those iterations.

    Attributes
    ----------
    irregular : bool
        Whether the last iteration given to :meth:`update` was irregular.
    n_seen : int
        Iterations seen so far.
    n_irregular : int
        Irregular iterations seen so far.
    reference : float
        The reference the last iteration was compared with (nan before the second iteration).

    Examples
    --------
    >>> m = IterationMonitor(delta=1.1, window=3)
    >>> [m.update(d) for d in (10.0, 10.0, 10.2, 12.0, 10.0)]
    [False, False, False, True, False]
    >>> m.irregular, m.n_irregular
    (False, 1)
    """

    def __init__(self, delta: float = DEFAULT_DELTA, window: int = 20, quantile: float = 10.0) -> None:
        self.delta, self.window = _check(delta, window)
        self.quantile = quantile
        self._rule = IrregularityRule(self.delta, quantile)
        self._buf: deque[float] = deque(maxlen=self.window)
        self.irregular = False
        self.n_seen = 0
        self.n_irregular = 0
        self.reference = float("nan")

    def update(self, duration: float) -> bool:
        """Feed one iteration duration; returns (and stores in :attr:`irregular`) its flag."""
        d = float(duration)
        if not np.isfinite(d) or d < 0:
            raise ConfigError(f"iteration duration must be a finite number >= 0 (got {duration!r})")
        if self._buf:
            self.reference = self._rule.reference(np.fromiter(self._buf, dtype=np.float64))
            self.irregular = bool(d > self.delta * self.reference)
        else:
            self.reference = float("nan")
            self.irregular = False
        self._buf.append(d)
        self.n_seen += 1
        self.n_irregular += int(self.irregular)
        return self.irregular

    def reset(self) -> None:
        """Forget the history."""
        self._buf.clear()
        self.irregular = False
        self.n_seen = 0
        self.n_irregular = 0
        self.reference = float("nan")


def irregular_iterations(durations: Sequence[float] | np.ndarray, delta: float = DEFAULT_DELTA, window: int = 20,
                         quantile: float = 10.0) -> np.ndarray:
    """Batch form of :class:`IterationMonitor`: each iteration against the ``window`` before it.

    Parameters
    ----------
    durations : array-like of float
        Iteration durations of one rank in iteration order (any unit).
    delta : float, default 1.1
    window : int, default 20
    quantile : float, default 10

    Returns
    -------
    numpy.ndarray of bool
        Same length as ``durations``; element 0 is always False.

    Examples
    --------
    >>> irregular_iterations([10, 10, 10, 13, 10, 10], delta=1.1, window=3).tolist()
    [False, False, False, True, False, False]
    """
    delta, window = _check(delta, window)
    rule = IrregularityRule(delta, quantile)
    d = np.asarray(durations, dtype=np.float64).ravel()
    if d.size and (not np.all(np.isfinite(d)) or np.any(d < 0)):
        raise ConfigError("iteration durations must be finite numbers >= 0")
    n = d.size
    out = np.zeros(n, dtype=bool)
    if n < 2:
        return out
    if n > window:  # full windows: one vectorized percentile over a strided view
        view = np.lib.stride_tricks.sliding_window_view(d[:-1], window)
        out[window:] = d[window:] > delta * np.percentile(view, rule.quantile, axis=1)
    for i in range(1, min(n, window + 1) if n > window else n):
        out[i] = d[i] > delta * rule.reference(d[max(0, i - window):i])
    return out


def episodes(irregular: Sequence[bool] | np.ndarray) -> list[tuple[int, int]]:
    """Runs of consecutive irregular iterations as ``(start, stop)`` index pairs (stop exclusive).

    Examples
    --------
    >>> episodes([0, 1, 1, 0, 1])
    [(1, 3), (4, 5)]
    """
    f = np.asarray(irregular, dtype=bool).ravel()
    if not f.any():
        return []
    x = np.diff(np.concatenate([[0], f.astype(np.int8), [0]]))
    starts = np.flatnonzero(x == 1)
    stops = np.flatnonzero(x == -1)
    return [(int(a), int(b)) for a, b in zip(starts, stops)]


def classify_episode(durations: Sequence[float] | np.ndarray, irregular: Sequence[bool] | np.ndarray | None = None,
                     *, delta: float = 1.1, window: int = 20) -> str:
    """Name the kind of irregularity in a stretch of iteration durations.

    The rules (paper section 3.1 and Appendix B):

    * ``"persistent"``: after the first irregular iteration, most iterations (>= 70%) stay above
      ``delta`` x the median of the iterations before it, for at least 3 iterations;
    * ``"fluctuation"``: at least 3 separate irregular episodes whose spacing is regular, i.e. the
      amplitude spectrum (DFT) of the irregular indicator has a dominant non-zero frequency, or
      the gaps between episode starts vary little;
    * ``"spike"``: anything else (isolated, randomly timed slow iterations).

    Parameters
    ----------
    durations : array-like of float
        Iteration durations in order.
    irregular : array-like of bool, optional
        Their flags; computed with :func:`irregular_iterations` when omitted.
    delta, window
        Passed to :func:`irregular_iterations` when ``irregular`` is omitted.

    Returns
    -------
    str
        ``"spike"``, ``"fluctuation"`` or ``"persistent"``. A log without irregular iterations is
        reported as ``"spike"`` only if asked; callers normally classify irregular stretches.

    Examples
    --------
    >>> d = [10.0] * 40
    >>> for i in range(3, 40, 7): d[i] = 14.0
    >>> classify_episode(d)
    'fluctuation'
    >>> classify_episode([10.0] * 10 + [20.0] * 30)
    'persistent'
    >>> d = [10.0] * 40; d[17] = 25.0
    >>> classify_episode(d)
    'spike'
    """
    d = np.asarray(durations, dtype=np.float64).ravel()
    f = (irregular_iterations(d, delta, window) if irregular is None
         else np.asarray(irregular, dtype=bool).ravel())
    if f.shape != d.shape:
        raise ConfigError(f"durations ({d.size}) and irregular flags ({f.size}) differ in length")
    eps = episodes(f)
    if not eps:
        return "spike"
    first = eps[0][0]
    before = d[:first]
    base = float(np.median(before)) if before.size else float(np.min(d))
    after = d[first:]
    if after.size >= 3 and np.mean(after > delta * base) >= 0.7:
        return "persistent"
    if len(eps) >= 3:
        starts = np.array([a for a, _ in eps], dtype=np.float64)
        gaps = np.diff(starts)
        if gaps.size >= 2 and np.std(gaps) <= 0.25 * np.mean(gaps):
            return "fluctuation"
        x = f.astype(np.float64) - f.mean()
        amp = np.abs(np.fft.rfft(x))[1:]
        if amp.size >= 3:
            k = int(np.argmax(amp))
            period = d.size / (k + 1)
            # a dominant component with a period that spans several iterations
            if 2.0 <= period <= d.size / 3 and amp[k] >= 2.5 * np.median(amp) and len(eps) >= d.size / period * 0.6:
                return "fluctuation"
    return "spike"
