"""Drift auto-tuning (paper section 4.2.2, Appendix E): move split thresholds, do not retrain.

The mean of drift-prone features (iteration time, op durations, ...) is tracked against the
model's training reference. When it shifts, every tree node that splits on a shifted feature has
its threshold moved by the shift (``threshold += current - reference``), as in the paper's Figure
10(b). Mean-based by default; the paper found tail statistics (P75, P99) worse, they are offered
(``stat="p75"``, ``"p99"``, ``"median"``) for comparison.

:class:`DriftMonitor` is river-style: :meth:`~DriftMonitor.update` with feature rows,
:attr:`~DriftMonitor.drift_detected`, :meth:`~DriftMonitor.shifts`. The detector side (moving
the thresholds) is :meth:`holmes.detect.OperatorDetector.retune_shifts`; running a detector over a
stream and retuning it is :class:`holmes.detect.autotune.AutoTuner`.

Examples
--------
>>> import numpy as np
>>> m = DriftMonitor({"iter_ms": 9000.0}, feature_names=["iter_ms"], rel_threshold=0.01)
>>> m.update(np.full((10, 1), 9200.0)).drift_detected
True
>>> m.shifts()
{'iter_ms': 200.0}
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from holmes.errors import ConfigError

__all__ = ["STATS", "DriftMonitor", "RetuneRecord", "column_stat"]

log = logging.getLogger(__name__)

STATS = ("mean", "median", "p75", "p99")


def column_stat(X: np.ndarray, stat: str = "mean") -> np.ndarray:
    """Column-wise ``stat`` of a 2-D array (``mean``, ``median``, ``p75`` or ``p99``)."""
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ConfigError(f"expected a 2-D feature array (got shape {X.shape})")
    if X.shape[0] == 0:
        return np.full(X.shape[1], np.nan)
    if stat == "mean":
        return X.mean(axis=0)
    if stat == "median":
        return np.median(X, axis=0)
    if stat == "p75":
        return np.percentile(X, 75, axis=0)
    if stat == "p99":
        return np.percentile(X, 99, axis=0)
    raise ConfigError(f"unknown drift statistic {stat!r}; expected one of {', '.join(STATS)}")


@dataclass
class RetuneRecord:
    """One retune: when, with which statistic, and the threshold shift applied per feature."""

    update: int
    rows: int
    stat: str
    mode: str
    shifts: dict[str, float] = field(default_factory=dict)
    nodes_moved: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class DriftMonitor:
    """Track drift-prone feature statistics against a training reference (river-style).

    Parameters
    ----------
    reference : mapping name -> float
        The statistic of each monitored feature on the training data.
    feature_names : sequence of str
        Column names of the rows given to :meth:`update` (a superset of ``reference``'s keys).
    stat : {"mean", "median", "p75", "p99"}, default "mean"
    rel_threshold : float, default 0.01
        Drift is detected when some feature moved by more than this fraction of its reference.
    max_rows : int, default 200_000
        Only the latest rows are kept for quantile statistics (the mean uses running sums).

    Attributes
    ----------
    drift_detected : bool
        Whether the statistic of some monitored feature moved beyond ``rel_threshold``.
    n_rows : int
        Rows seen since the last :meth:`reset`.
    """

    def __init__(self, reference: Mapping[str, float], feature_names: Sequence[str], *, stat: str = "mean",
                 rel_threshold: float = 0.01, max_rows: int = 200_000) -> None:
        if stat not in STATS:
            raise ConfigError(f"unknown drift statistic {stat!r}; expected one of {', '.join(STATS)}")
        if not rel_threshold >= 0:
            raise ConfigError(f"rel_threshold must be >= 0 (got {rel_threshold!r})")
        names = list(feature_names)
        unknown = [k for k in reference if k not in names]
        if unknown:
            raise ConfigError(f"drift reference names unknown feature(s) {unknown}")
        self.reference = {k: float(v) for k, v in reference.items()}
        self.feature_names = names
        self.stat = stat
        self.rel_threshold = float(rel_threshold)
        self.max_rows = int(max_rows)
        self._cols = np.array([names.index(k) for k in self.reference], dtype=np.int64)
        self.reset()

    def reset(self) -> None:
        """Forget the rows seen (after a retune the new reference is the current level)."""
        self._sum = np.zeros(self._cols.size)
        self.n_rows = 0
        self._buf: deque[np.ndarray] = deque()
        self._buf_rows = 0
        self.drift_detected = False

    def update(self, X: np.ndarray) -> "DriftMonitor":
        """Add feature rows (shape ``(n, len(feature_names))`` or one row); returns self."""
        X = np.asarray(X, dtype=np.float64)
        if X.ndim == 1:
            X = X[None, :]
        if X.ndim != 2 or X.shape[1] != len(self.feature_names):
            raise ConfigError(f"rows have shape {X.shape}; expected (n, {len(self.feature_names)})")
        sub = X[:, self._cols]
        self._sum += sub.sum(axis=0)
        self.n_rows += sub.shape[0]
        if self.stat != "mean":
            self._buf.append(sub)
            self._buf_rows += sub.shape[0]
            while self._buf_rows - self._buf[0].shape[0] >= self.max_rows and len(self._buf) > 1:
                self._buf_rows -= self._buf.popleft().shape[0]
        cur = self.current()
        ref = np.array(list(self.reference.values()))
        moved = np.abs(cur - ref) > self.rel_threshold * np.maximum(np.abs(ref), 1e-12)
        self.drift_detected = bool(self.n_rows > 0 and np.any(moved))
        return self

    def current(self) -> np.ndarray:
        """The statistic of each monitored feature over the rows seen (reference order)."""
        if self.n_rows == 0:
            return np.array(list(self.reference.values()))
        if self.stat == "mean":
            return self._sum / self.n_rows
        return column_stat(np.concatenate(list(self._buf)), self.stat)

    def shifts(self, *, only_drifted: bool = True, mode: str = "additive") -> dict[str, float]:
        """Per feature: ``current - reference`` (additive) or ``current / reference`` (multiplicative).

        With ``only_drifted`` (default) features that moved less than ``rel_threshold`` are left out.
        """
        if mode not in ("additive", "multiplicative"):
            raise ConfigError(f"mode must be 'additive' or 'multiplicative' (got {mode!r})")
        cur = self.current()
        out: dict[str, float] = {}
        for (name, ref), c in zip(self.reference.items(), cur):
            if only_drifted and not abs(c - ref) > self.rel_threshold * max(abs(ref), 1e-12):
                continue
            if mode == "additive":
                out[name] = float(c - ref)
            elif abs(ref) > 1e-12:
                out[name] = float(c / ref)
        return out
