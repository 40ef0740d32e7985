"""Drift auto-tuning over a stream of rank logs (paper section 4.2.2): :class:`AutoTuner`.

It runs a fitted :class:`~holmes.detect.OperatorDetector` over rank logs as they come, tracks the
drift-prone features with a :class:`~holmes.detect.drift.DriftMonitor`, and every ``period``
updates (or on demand with :meth:`~AutoTuner.retune_now`) replaces the detector by one whose split
thresholds are moved by the drift (:meth:`~holmes.detect.OperatorDetector.retune_shifts`), keeping a
record of each retune.

Retuning follows a *drift* of the raw millisecond features; it does not bound how much of a job the
model flags when the job is unlike its training data from the start (a real job for the
simulated-trained shipped model: 47.5% of a healthy real job flagged, 34-37% after retuning against
the model's reference, no change against the job's own first ranks). For that the flags follow the
job's own score distribution (``OperatorDetector(relative=True)``, what ``holmes detect`` uses:
:func:`holmes.detect.relative.relative_flags`); retuned detectors keep that setting.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pyarrow as pa

from holmes.detect.detector import OperatorDetector
from holmes.detect.drift import DriftMonitor, RetuneRecord
from holmes.errors import ConfigError

__all__ = ["AutoTuner"]

log = logging.getLogger(__name__)


class AutoTuner:
    """Run a detector over a stream of rank logs and retune it periodically (no retraining).

    Parameters
    ----------
    detector : OperatorDetector
        The fitted detector to start from (never modified; retunes make new detectors).
    period : int or None, default 1
        Retune (when drift is detected) every ``period`` calls of :meth:`update`; None: only on
        :meth:`retune_now`.
    stat : {"mean", "median", "p75", "p99"}, default "mean"
    mode : {"additive", "multiplicative"}, default "additive"
    rel_threshold : float, default 0.01
    baseline : {"first", "model"}, default "first"
        What the drift is measured against. ``"model"``: the model's training reference (right
        when the model was trained on this very job, as in the paper). ``"first"``: the level seen
        during the first ``period`` updates of this job (right for a model trained on other jobs,
        like the shipped default, whose training mean mixes many job shapes).

    Attributes
    ----------
    detector : OperatorDetector
        The current (possibly retuned) detector.
    history : list of RetuneRecord
    """

    def __init__(self, detector: OperatorDetector, *, period: int | None = 1, stat: str = "mean",
                 mode: str = "additive", rel_threshold: float = 0.01, baseline: str = "first") -> None:
        if period is not None and int(period) < 1:
            raise ConfigError(f"period must be a positive integer or None (got {period!r})")
        if baseline not in ("first", "model"):
            raise ConfigError(f"baseline must be 'first' or 'model' (got {baseline!r})")
        self.detector = detector
        self.period = None if period is None else int(period)
        self.stat = stat
        self.mode = mode
        self.rel_threshold = rel_threshold
        self.baseline = baseline
        self.monitor = detector.drift_monitor(stat=stat, rel_threshold=rel_threshold)
        self._baseline_pending = baseline == "first"
        self.history: list[RetuneRecord] = []
        self.n_updates = 0

    def update(self, ops: pa.Table, *, iteration_times: Any = None, context: Any = None) -> np.ndarray:
        """Score one rank log with the current detector, feed the drift monitor, maybe retune.

        ``context``: the job's :class:`~holmes.detect.JobContext`, as for
        :meth:`OperatorDetector.predict_proba_ops`. Returns the scores (P(abnormal) per row)
        computed *before* any retune this call triggers.
        """
        X = self.detector.compute_features(ops, iteration_times=iteration_times, context=context)
        scores = self.detector.predict_proba_features(X)
        self.monitor.update(X)
        self.n_updates += 1
        if self.period is not None and self.n_updates % self.period == 0:
            if self._baseline_pending:
                self.set_baseline()
            elif self.monitor.drift_detected:
                self.retune_now()
        return scores

    def set_baseline(self) -> None:
        """Take the statistics seen since the last reset as the reference level (no retune)."""
        cur = self.monitor.current()
        ref = {k: float(v) for k, v in zip(self.monitor.reference, cur)}
        self.monitor = DriftMonitor(ref, self.monitor.feature_names, stat=self.stat, rel_threshold=self.rel_threshold)
        self._baseline_pending = False

    def retune_now(self) -> RetuneRecord | None:
        """Shift the thresholds by the drift seen since the last retune; None if nothing moved."""
        shifts = self.monitor.shifts(mode=self.mode)
        if not shifts:
            return None
        new = self.detector.retune_shifts(shifts, stat=self.stat, mode=self.mode, rows=self.monitor.n_rows,
                                          update=self.n_updates)
        self.detector = new
        rec = new.retune_history_[-1]
        self.history.append(rec)
        log.info("retuned detector after %d updates: %s", self.n_updates, rec.shifts)
        ref = dict(self.monitor.reference)
        for k, v in shifts.items():
            ref[k] = ref[k] * v if self.mode == "multiplicative" else ref[k] + v
        self.monitor = DriftMonitor(ref, self.monitor.feature_names, stat=self.stat, rel_threshold=self.rel_threshold)
        return rec
