"""The abnormal-operator detector: a random forest over per-operator features (paper section 4.2.2).

:class:`OperatorDetector` is a scikit-learn style estimator. ``fit(X, y)`` trains a
``RandomForestClassifier`` (Gini or entropy) on feature matrices from
:func:`holmes.detect.features.operator_features` and flattens it into a
:class:`~holmes.detect.forest.CompiledForest`, which is what predicts (a numba kernel, equal to
scikit-learn's ``predict_proba``), what is saved (JSON + npz, never pickle) and what drift
auto-tuning edits. :func:`load_default_detector` returns the model shipped in
``holmes/detect/models/``.

Examples
--------
>>> import numpy as np
>>> from holmes.detect.features import FEATURE_NAMES
>>> rng = np.random.default_rng(0)
>>> X = rng.normal(size=(400, len(FEATURE_NAMES))).astype(np.float32)
>>> y = X[:, FEATURE_NAMES.index("ratio_min")] > 1.0
>>> det = OperatorDetector(n_estimators=10, max_depth=6, random_state=0).fit(X, y)
>>> float((det.predict(X) == y).mean()) > 0.95
True
"""

from __future__ import annotations

import copy
import functools
import logging
import numbers
import os
from collections.abc import Iterable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.exceptions import NotFittedError as SklearnNotFittedError
from sklearn.utils._param_validation import Interval, InvalidParameterError, StrOptions
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_array, check_is_fitted, column_or_1d

from holmes.detect.context import CONTEXT_FEATURE_NAMES, JobContext
from holmes.detect.drift import STATS, DriftMonitor, RetuneRecord, column_stat
from holmes.detect.features import DEFAULT_WINDOW, DRIFT_FEATURES, FEATURE_NAMES, operator_features
from holmes.detect.forest import CompiledForest
from holmes.detect.model_io import load_model, save_model
from holmes.errors import ConfigError, ModelFormatError, NotFittedError

__all__ = ["OperatorDetector", "DetectorNotFittedError", "load_default_detector", "DEFAULT_MODEL"]

log = logging.getLogger(__name__)

#: the shipped default model (``NAME.json`` + ``NAME.npz`` inside the package)
DEFAULT_MODEL = "default"

_PARAMS = ("n_estimators", "criterion", "max_depth", "min_samples_leaf", "max_features", "max_samples", "class_weight",
           "threshold", "window", "features", "relative", "random_state", "n_jobs")


class DetectorNotFittedError(NotFittedError, SklearnNotFittedError):
    """An :class:`OperatorDetector` used before ``fit``: both Holmes's and scikit-learn's error."""


class OperatorDetector(ClassifierMixin, BaseEstimator):
    """Random-forest detector of abnormal communication operators.

    Parameters
    ----------
    n_estimators : int, default 64
    criterion : {"gini", "entropy", "log_loss"}, default "gini"
    max_depth : int or None, default 14
    min_samples_leaf : int, default 2
    max_features : str, int or float, default "sqrt"
    max_samples : int, float or None, default None
        Bootstrap rows per tree (an int caps the cost of fitting on millions of rows).
    class_weight : None, "balanced" or dict, default None
    threshold : float, default 0.5
        A row is flagged when its probability is >= ``threshold``.
    window : int, default 64
        Feature window (iterations) used by :meth:`predict_proba_ops`.
    features : sequence of str or None, default None
        Subset of :data:`~holmes.detect.features.FEATURE_NAMES` to use (None: all).
    relative : bool, default False
        True: :meth:`predict_ops` flags a row only when its score also stands out of the scores of
        the rank's other rows (:func:`holmes.detect.relative.relative_flags`): the threshold
        follows the job's own score distribution, so a model trained on other jobs does not flag
        most of a healthy job (``holmes detect`` sets it unless ``--absolute``). False:
        ``score >= threshold`` alone (the paper's rule), what Algorithm 1 follows in
        :func:`holmes.localize`: on the real corpora it needs the waits the forest flags, which the
        relative rule leaves unflagged (``full_read=0``: compute top-1 66.7% -> 40.0% with it).
        :meth:`predict` on a feature matrix (rows of any rank) uses the threshold alone.
    random_state : int or None
    n_jobs : int or None
        Threads used by scikit-learn when fitting.

    Attributes
    ----------
    forest_ : CompiledForest
    feature_names_ : list of str
    reference_ : dict
        ``stat -> {feature: value}`` on the training rows, for drift tuning.
    retune_history_ : list of RetuneRecord
    estimator_ : sklearn RandomForestClassifier or None
        Only after an in-process ``fit`` (not stored in model files).
    """

    _parameter_constraints: dict = {
        "n_estimators": [Interval(numbers.Integral, 1, None, closed="left")],
        "criterion": [StrOptions({"gini", "entropy", "log_loss"})],
        "max_depth": [Interval(numbers.Integral, 1, None, closed="left"), None],
        "min_samples_leaf": [Interval(numbers.Integral, 1, None, closed="left"),
                             Interval(numbers.Real, 0.0, 1.0, closed="neither")],
        "max_features": [Interval(numbers.Integral, 1, None, closed="left"),
                         Interval(numbers.Real, 0.0, 1.0, closed="right"), StrOptions({"sqrt", "log2"}), None],
        "max_samples": [None, Interval(numbers.Integral, 1, None, closed="left"),
                        Interval(numbers.Real, 0.0, 1.0, closed="right")],
        "class_weight": [StrOptions({"balanced", "balanced_subsample"}), dict, None],
        "threshold": [Interval(numbers.Real, 0.0, 1.0, closed="both")],
        "window": [Interval(numbers.Integral, 2, None, closed="left")],
        "features": ["array-like", None],
        "relative": ["boolean"],
        "random_state": ["random_state"],
        "n_jobs": [numbers.Integral, None],
    }

    def __init__(self, n_estimators: int = 64, criterion: str = "gini", max_depth: int | None = 14,
                 min_samples_leaf: int = 2, max_features: Any = "sqrt", max_samples: Any = None,
                 class_weight: Any = None,
                 threshold: float = 0.5, window: int = DEFAULT_WINDOW, features: Sequence[str] | None = None,
                 relative: bool = False, random_state: int | None = None, n_jobs: int | None = None) -> None:
        self.n_estimators = n_estimators
        self.criterion = criterion
        self.max_depth = max_depth
        self.min_samples_leaf = min_samples_leaf
        self.max_features = max_features
        self.max_samples = max_samples
        self.class_weight = class_weight
        self.threshold = threshold
        self.window = window
        self.features = features
        self.relative = relative
        self.random_state = random_state
        self.n_jobs = n_jobs

    # ------------------------------------------------------------------ fitting
    def _columns(self) -> np.ndarray:
        if self.features is None:
            return np.arange(len(FEATURE_NAMES))
        unknown = [f for f in self.features if f not in FEATURE_NAMES]
        if unknown:
            raise ConfigError(f"unknown feature name(s) {unknown}; see holmes.detect.FEATURE_NAMES")
        return np.array([FEATURE_NAMES.index(f) for f in self.features], dtype=np.int64)

    def _select(self, X: np.ndarray) -> np.ndarray:
        X = _check_width(np.asarray(X, dtype=np.float32))
        if not hasattr(self, "feature_idx_"):
            cols = self._columns()
        else:
            cols = self.feature_idx_
        return X if cols.size == len(FEATURE_NAMES) else np.ascontiguousarray(X[:, cols])

    def fit(self, X: np.ndarray, y: np.ndarray, sample_weight: np.ndarray | None = None) -> "OperatorDetector":
        """Train on a full feature matrix (columns :data:`FEATURE_NAMES`) and boolean labels."""
        from sklearn.ensemble import RandomForestClassifier

        try:
            self._validate_params()
        except InvalidParameterError as exc:
            raise ConfigError(f"OperatorDetector: {exc}") from None
        cols = self._columns()
        try:
            X = check_array(X, dtype=np.float32, ensure_min_samples=2)
            y = column_or_1d(y, warn=True)
            check_classification_targets(y)
        except ValueError as exc:
            raise ConfigError(f"OperatorDetector.fit: {exc}") from None
        weighted = y
        if sample_weight is not None:
            sw = np.asarray(sample_weight, dtype=np.float64).ravel()
            if sw.size == y.size and not np.any(sw > 0):
                raise ConfigError("OperatorDetector.fit: every sample weight is zero")
            weighted = y[sw > 0] if sw.size == y.size else y
        if np.unique(weighted).size < 2:
            raise ConfigError("OperatorDetector.fit: the (weighted) labels hold one class only: a detector "
                              "needs both normal and abnormal operators to learn from")
        X = _check_width(X)
        if X.shape[0] != y.shape[0]:
            raise ConfigError(f"X has {X.shape[0]} rows and y {y.shape[0]}; need the same")
        y = y.astype(bool)
        Xs = np.ascontiguousarray(X[:, cols])
        rf = RandomForestClassifier(n_estimators=self.n_estimators, criterion=self.criterion,
                                    max_depth=self.max_depth, min_samples_leaf=self.min_samples_leaf,
                                    max_features=self.max_features,
                                    max_samples=(None if self.max_samples is None or (isinstance(self.max_samples, int)
                                                 and self.max_samples >= X.shape[0]) else self.max_samples),
                                    class_weight=self.class_weight,
                                    random_state=self.random_state, n_jobs=self.n_jobs)
        rf.fit(Xs, y.astype(np.int8), sample_weight=sample_weight)
        self.estimator_ = rf
        self.feature_idx_ = cols
        self.feature_names_ = [FEATURE_NAMES[i] for i in cols]
        self.forest_ = CompiledForest.from_sklearn(rf)
        self.classes_ = np.array([False, True])
        self.n_features_in_ = len(FEATURE_NAMES)
        drift_cols = [i for i, n in enumerate(self.feature_names_) if n in DRIFT_FEATURES]
        self.reference_ = {s: {self.feature_names_[i]: float(v) for i, v in
                               zip(drift_cols, column_stat(Xs[:, drift_cols], s))} for s in STATS}
        self.retune_history_: list[RetuneRecord] = []
        self.train_info_ = {"rows": int(X.shape[0]), "abnormal": int(y.sum())}
        return self

    def fit_jobs(self, jobs: Iterable[Any], *, ranks: Any = None, max_ranks: int | None = 64,
                 label: str = "abnormal", context: str = "mixed") -> "OperatorDetector":
        """Train on labelled jobs (paths or Job objects); see :func:`holmes.detect.training.jobs_dataset`."""
        from holmes.detect.training import jobs_dataset

        X, y, _ = jobs_dataset(jobs, ranks=ranks, max_ranks=max_ranks, label=label, window=self.window,
                               seed=self.random_state, context=context)
        return self.fit(X, y)

    # ------------------------------------------------------------------ prediction
    def _check_fitted(self) -> None:
        try:
            check_is_fitted(self, "forest_")
        except SklearnNotFittedError:
            raise DetectorNotFittedError("this OperatorDetector is not fitted: call fit()/fit_jobs() "
                                         "or load a model") from None

    def compute_features(self, ops: pa.Table, *, iteration_times: Any = None,
                         context: JobContext | None = None) -> np.ndarray:
        """The full feature matrix of one rank's ops (see :func:`operator_features`)."""
        return operator_features(ops, iteration_times=iteration_times, window=self.window, context=context)

    def uses_context(self) -> bool:
        """Whether the model reads any cross-rank context feature (so a :class:`JobContext` matters)."""
        names = self.feature_names_ if hasattr(self, "feature_names_") else \
            [FEATURE_NAMES[i] for i in self._columns()]
        return any(n in CONTEXT_FEATURE_NAMES for n in names)

    def predict_proba_features(self, X: np.ndarray) -> np.ndarray:
        """P(abnormal) per row of a full feature matrix (1-D)."""
        self._check_fitted()
        return self.forest_.predict_proba(self._select(X))

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        """scikit-learn style ``(n, 2)`` probabilities (columns: normal, abnormal)."""
        p = self.predict_proba_features(X)
        return np.column_stack([1.0 - p, p])

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Boolean flags: probability >= ``threshold``."""
        return self.predict_proba_features(X) >= self.threshold

    def predict_proba_ops(self, ops: pa.Table, *, iteration_times: Any = None,
                          context: JobContext | None = None) -> np.ndarray:
        """Probability that each row of one rank's CommOps table is abnormal (table order).

        Parameters
        ----------
        ops : pyarrow.Table
            CommOps v1 rows of one rank.
        iteration_times : (iterations, durations_ns), optional
            E.g. ``job.iteration_times(rank)``; derived from the ops otherwise.
        context : JobContext, optional
            Cross-rank evidence of the job (e.g. ``JobContext.from_job(job)``); it finds weak faults
            one rank cannot see. Without it the rank is judged alone.
        """
        self._check_fitted()
        if ops.num_rows == 0:
            return np.zeros(0, dtype=np.float64)
        return self.predict_proba_features(self.compute_features(ops, iteration_times=iteration_times,
                                                                 context=context))

    def predict_ops(self, ops: pa.Table, *, iteration_times: Any = None,
                    context: JobContext | None = None) -> np.ndarray:
        """Boolean abnormal flag of each row of one rank's CommOps table (see ``relative``)."""
        return self.flag_scores(ops, self.predict_proba_ops(ops, iteration_times=iteration_times, context=context))

    def flag_scores(self, ops: pa.Table, scores: np.ndarray) -> np.ndarray:
        """The flags of one rank's rows from their scores: ``scores >= threshold``, and with
        ``relative`` only those standing out of the rank's own scores
        (:func:`holmes.detect.relative.relative_flags`). ``ops`` is the rank's table (unused
        today; a rule may look at the rows)."""
        if not getattr(self, "relative", False):
            return np.asarray(scores) >= self.threshold
        from holmes.detect.relative import relative_flags

        return relative_flags(scores, self.threshold)

    # ------------------------------------------------------------------ drift
    def drift_monitor(self, *, stat: str = "mean", rel_threshold: float = 0.01) -> DriftMonitor:
        """A :class:`DriftMonitor` against this model's training reference (full feature rows)."""
        self._check_fitted()
        ref = self.reference_.get(stat)
        if ref is None:
            raise ConfigError(f"the model has no '{stat}' reference; available: {sorted(self.reference_)}")
        return DriftMonitor(ref, FEATURE_NAMES, stat=stat, rel_threshold=rel_threshold)

    def retune(self, X: np.ndarray | None = None, *, ops: pa.Table | Sequence[pa.Table] | None = None,
               stat: str = "mean", mode: str = "additive", rel_threshold: float = 0.01) -> "OperatorDetector":
        """A new detector whose thresholds follow the drift seen in ``X`` (or in ``ops`` tables).

        ``self`` is not modified. If nothing drifted beyond ``rel_threshold`` the copy is unchanged.
        """
        self._check_fitted()
        if X is None:
            if ops is None:
                raise ConfigError("retune needs feature rows X or ops tables")
            tables = [ops] if isinstance(ops, pa.Table) else list(ops)
            X = np.concatenate([self.compute_features(t) for t in tables]) if tables else np.zeros((0, len(FEATURE_NAMES)))
        mon = self.drift_monitor(stat=stat, rel_threshold=rel_threshold).update(X)
        return self.retune_shifts(mon.shifts(mode=mode), stat=stat, mode=mode, rows=mon.n_rows)

    def retune_shifts(self, shifts: dict[str, float], *, stat: str = "mean", mode: str = "additive",
                      rows: int = 0, update: int = 0) -> "OperatorDetector":
        """A new detector with thresholds of the named features shifted (additive) or scaled."""
        self._check_fitted()
        new = copy.copy(self)
        new.estimator_ = None
        idx = {}
        for name, s in shifts.items():
            if name not in self.feature_names_:
                raise ConfigError(f"cannot shift unknown feature {name!r}")
            idx[self.feature_names_.index(name)] = s
        new.forest_ = self.forest_.shift_thresholds(idx, multiplicative=(mode == "multiplicative"))
        counts = self.forest_.split_counts()
        moved = int(sum(counts[i] for i in idx))
        new.reference_ = {k: dict(v) for k, v in self.reference_.items()}
        for name, s in shifts.items():
            if name in new.reference_.get(stat, {}):
                r = new.reference_[stat][name]
                new.reference_[stat][name] = r * s if mode == "multiplicative" else r + s
        rec = RetuneRecord(update=update, rows=rows, stat=stat, mode=mode,
                           shifts={k: float(v) for k, v in shifts.items()}, nodes_moved=moved)
        new.retune_history_ = list(self.retune_history_) + [rec]
        return new

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write ``PATH.json`` + ``PATH.npz`` (no pickle); returns the JSON path."""
        self._check_fitted()
        params = {k: getattr(self, k) for k in _PARAMS if k not in ("random_state", "n_jobs")}
        params["features"] = None if self.features is None else list(self.features)
        if not isinstance(params["class_weight"], (str, type(None))):
            params["class_weight"] = None
        meta = {"feature_names": list(self.feature_names_), "params": params, "reference": self.reference_,
                "retune_history": [r.to_dict() for r in self.retune_history_],
                "train_info": getattr(self, "train_info_", {})}
        return save_model(path, self.forest_, meta)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "OperatorDetector":
        """Read a model written by :meth:`save`; raises :class:`ModelFormatError` when malformed."""
        forest, meta = load_model(path)
        return cls._from_parts(forest, meta, str(path))

    @classmethod
    def _from_parts(cls, forest: CompiledForest, meta: dict[str, Any], source: str) -> "OperatorDetector":
        names = meta.get("feature_names")
        if not isinstance(names, list) or any(n not in FEATURE_NAMES for n in names):
            raise ModelFormatError(f"{source}: 'feature_names' must list features this version computes")
        params = meta.get("params", {})
        if not isinstance(params, dict):
            raise ModelFormatError(f"{source}: 'params' must be an object")
        try:
            det = cls(**{k: v for k, v in params.items() if k in _PARAMS})
            thr = float(det.threshold)
            win = int(det.window)
        except (TypeError, ValueError) as exc:
            raise ModelFormatError(f"{source}: bad 'params' ({exc})") from None
        if not 0 <= thr <= 1 or win < 1:
            raise ModelFormatError(f"{source}: 'params' threshold/window out of range")
        det.forest_ = forest
        det.feature_names_ = list(names)
        det.feature_idx_ = np.array([FEATURE_NAMES.index(n) for n in names], dtype=np.int64)
        det.features = list(names) if len(names) != len(FEATURE_NAMES) else None
        det.classes_ = np.array([False, True])
        det.n_features_in_ = len(FEATURE_NAMES)
        ref = meta.get("reference", {})
        if not isinstance(ref, dict) or not all(isinstance(v, dict) for v in ref.values()):
            raise ModelFormatError(f"{source}: 'reference' must map a statistic to feature values")
        det.reference_ = {str(k): {str(f): float(x) for f, x in v.items()} for k, v in ref.items()}
        det.retune_history_ = [RetuneRecord(**r) for r in meta.get("retune_history", []) if isinstance(r, dict)]
        det.train_info_ = meta.get("train_info", {})
        det.estimator_ = None
        return det


@functools.lru_cache(maxsize=4)
def _default_parts(name: str) -> tuple[CompiledForest, dict[str, Any], str]:
    ref = resources.files("holmes.detect") / "models" / f"{name}.json"
    with resources.as_file(ref) as p:
        forest, meta = load_model(p)
        for a in (forest.feature, forest.threshold, forest.left, forest.right, forest.leaf_value, forest.roots):
            a.setflags(write=False)
        return forest, meta, str(p)


def load_default_detector(name: str = DEFAULT_MODEL) -> OperatorDetector:
    """The detector shipped with Holmes (``holmes/detect/models/default.*``).

    The files are read once per process; each call returns a new :class:`OperatorDetector` whose
    arrays are read-only and shared, so retuning one (which builds new arrays) never affects
    another.

    Examples
    --------
    >>> det = load_default_detector()
    >>> det.forest_.n_trees > 0
    True
    """
    forest, meta, src = _default_parts(name)
    return OperatorDetector._from_parts(forest, copy.deepcopy(meta), src)


def _check_width(X: np.ndarray) -> np.ndarray:
    """``X`` when it is the full feature matrix of :func:`operator_features`, else a ConfigError."""
    if X.ndim != 2 or X.shape[1] != len(FEATURE_NAMES):
        width = X.shape[1] if X.ndim == 2 else "?"
        raise ConfigError(f"feature matrix has shape {X.shape}: X has {width} feature(s); expected "
                          f"{len(FEATURE_NAMES)} (n, {len(FEATURE_NAMES)}) as produced by holmes.detect.operator_features")
    return X
