"""Flags relative to the job's own scores: the threshold follows the rank's score distribution.

A forest trained on simulated labels does not score a real job's normal operators near zero: on the
healthy real corpora (``fixtures/real``, ``real-loaded``, ``real-always``) the shipped model gives
a median score of 0.2-0.5 and flags 42-78% of the operators at its threshold (0.225). Drift
auto-tuning (:class:`~holmes.detect.AutoTuner`) cannot pull that back: it moves the split thresholds
of the ten raw millisecond features by how far their means moved, while the splits that fire on a
real job's normal operators are on ratio and cross-rank features, which do not drift in mean (on
``real/r064-healthy``: 47.5% flagged untuned, 34-37% tuned against the model's reference, 47.5%
against the job's own first ranks).

What every job does have is its own score distribution. :func:`relative_flags` flags a row when its
score reaches ``max(threshold, median + z x sigma)``, the median and the robust sigma
(1.4826 x MAD) of the scores of the rank's rows: the model's threshold where the model scores the
rank's normal operators near zero with little spread (the simulated jobs it was trained on: their
flags are unchanged, a persistent fault included), a higher one where it scores them all over the
probability scale (a real job it was not trained on). Only the rows that stand out of the rank's
own scores are flagged; a rank whose operators mostly score high keeps its median high and its
clearly higher rows flagged.

Examples
--------
>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> real_like = np.clip(rng.normal(0.35, 0.15, 1000), 0, 1)        # a job the model was not trained on
>>> float((real_like >= 0.225).mean()) > 0.75, float(relative_flags(real_like, 0.225).mean()) < 0.01
(True, True)
>>> sim_like = np.r_[np.zeros(950), np.full(50, 0.9)]              # normal rows at 0, 5% abnormal
>>> int(relative_flags(sim_like, 0.225).sum())
50
"""

from __future__ import annotations

import numpy as np

from holmes.stats import robust_sigma

__all__ = ["RELATIVE_Z", "relative_threshold", "relative_flags"]

#: robust standard deviations (1.4826 x MAD of the rank's scores) above the median of the rank's
#: scores a row must reach (besides the model's threshold). Fitted by
#: ``scripts/fit_detect_relative.py`` on the 23 healthy development runs of the real corpora: the
#: smallest z of (2, 2.5, 3, 3.5, 4) at which no healthy development job has more than 3% of its
#: operators flagged (the #36 target of 5% less two points of margin; z=2.5 gives 3.5%, z=3 1.7%).
RELATIVE_Z = 3.0


def relative_threshold(scores: np.ndarray, threshold: float, *, z: float = RELATIVE_Z) -> float:
    """``max(threshold, median + z x robust sigma)`` of one rank's ``scores`` (``threshold``
    when there are none)."""
    s = np.asarray(scores, dtype=np.float64)
    s = s[np.isfinite(s)]
    if s.size == 0:
        return float(threshold)
    return max(float(threshold), float(np.median(s)) + z * robust_sigma(s))


def relative_flags(scores: np.ndarray, threshold: float, *, z: float = RELATIVE_Z) -> np.ndarray:
    """Rows of one rank whose ``scores`` reach :func:`relative_threshold`.

    Parameters
    ----------
    scores : ndarray
        P(abnormal) of each row of one rank (e.g.
        :meth:`~holmes.detect.OperatorDetector.predict_proba_ops`).
    threshold : float
        The model's own threshold (a row below it is never flagged).
    z : float
        How far above the rank's median score (robust sigmas) a row must be.

    Returns
    -------
    ndarray of bool
    """
    s = np.asarray(scores, dtype=np.float64)
    return s >= relative_threshold(s, threshold, z=z)
