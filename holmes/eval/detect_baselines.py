"""Baseline detectors behind the detector interface (paper Appendix F): 3-sigma, KNN, KNN+PCA, SVM.

Each offers ``fit(X, y)``, ``predict_proba_features(X)``, ``predict(X)``, ``predict_proba_ops(ops)``
and ``predict_ops(ops)`` like :class:`~holmes.detect.OperatorDetector`, so benchmarks and the
localizer can swap them in.

* :class:`ThreeSigmaDetector`: per operator position's own time series (same ``op_index``,
  ``comm_id``, ``op`` across iterations), an op is abnormal when its duration lies outside
  ``mean +- k * std`` of that series (``k=3``; needs no training).
* :class:`FeatureBaseline`: a scikit-learn classifier on the same feature matrix:
  ``"knn"`` (standardized features, k nearest neighbours), ``"knn_pca"`` (standardized, PCA,
  KNN) or ``"svm"`` (standardized, RBF SVM). Training rows are subsampled to ``max_train_rows``
  (seeded) to keep KNN/SVM tractable.

Examples
--------
>>> from holmes.io.schema import ops_table
>>> d = [10] * 19 + [40]
>>> t = ops_table(rank=[0] * 20, iteration=list(range(20)), op_index=[0] * 20, comm_id=["dp"] * 20,
...               seq=list(range(20)), op=["all_reduce"] * 20, peer=[None] * 20, nbytes=[8] * 20,
...               start_ns=[100 * i for i in range(20)], end_ns=[100 * i + x for i, x in enumerate(d)])
>>> ThreeSigmaDetector().predict_ops(t).nonzero()[0].tolist()
[19]
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
from sklearn.base import BaseEstimator, ClassifierMixin

from holmes.detect.features import DEFAULT_WINDOW, FEATURE_NAMES, operator_features, position_keys
from holmes.errors import ConfigError, NotFittedError

__all__ = ["ThreeSigmaDetector", "FeatureBaseline", "BASELINES"]

BASELINES = ("3sigma", "knn", "knn_pca", "svm")


class ThreeSigmaDetector(ClassifierMixin, BaseEstimator):
    """The k-sigma rule over each operator position's own duration series.

    Parameters
    ----------
    k : float, default 3.0
    threshold : float, default 0.5
        Scores are 1.0 outside the band and 0.0 inside; flags are ``score >= threshold``.
    """

    def __init__(self, k: float = 3.0, threshold: float = 0.5) -> None:
        self.k = k
        self.threshold = threshold

    def fit(self, X: Any = None, y: Any = None) -> "ThreeSigmaDetector":
        """Nothing to learn (kept for the common interface)."""
        self.fitted_ = True
        return self

    def predict_proba_ops(self, ops: pa.Table, *, iteration_times: Any = None) -> np.ndarray:
        n = ops.num_rows
        if n == 0:
            return np.zeros(0)
        dur = (ops.column("end_ns").to_numpy() - ops.column("start_ns").to_numpy()).astype(np.float64)
        gid = position_keys(ops)
        cnt = np.bincount(gid).astype(np.float64)
        mean = np.bincount(gid, weights=dur) / cnt
        var = np.bincount(gid, weights=(dur - mean[gid]) ** 2) / cnt
        std = np.sqrt(var)
        out = np.abs(dur - mean[gid]) > float(self.k) * std[gid]
        return out.astype(np.float64)

    def predict_ops(self, ops: pa.Table, *, iteration_times: Any = None) -> np.ndarray:
        return self.predict_proba_ops(ops) >= self.threshold


_KINDS = ("knn", "knn_pca", "svm")


class FeatureBaseline(ClassifierMixin, BaseEstimator):
    """KNN, KNN+PCA or SVM on the detector's feature matrix.

    Parameters
    ----------
    kind : {"knn", "knn_pca", "svm"}, default "knn"
    n_neighbors : int, default 5
    n_components : int, default 8
        PCA components (``knn_pca``).
    C : float, default 1.0
        SVM regularization.
    max_train_rows : int, default 20_000
    threshold : float, default 0.5
    window : int, default 64
    random_state : int or None
    """

    def __init__(self, kind: str = "knn", n_neighbors: int = 5, n_components: int = 8, C: float = 1.0,
                 max_train_rows: int = 20_000, threshold: float = 0.5, window: int = DEFAULT_WINDOW,
                 random_state: int | None = None) -> None:
        self.kind = kind
        self.n_neighbors = n_neighbors
        self.n_components = n_components
        self.C = C
        self.max_train_rows = max_train_rows
        self.threshold = threshold
        self.window = window
        self.random_state = random_state

    def _pipeline(self):
        from sklearn.decomposition import PCA
        from sklearn.neighbors import KNeighborsClassifier
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler
        from sklearn.svm import SVC

        if self.kind == "knn":
            return make_pipeline(StandardScaler(), KNeighborsClassifier(n_neighbors=self.n_neighbors))
        if self.kind == "knn_pca":
            return make_pipeline(StandardScaler(), PCA(n_components=self.n_components, random_state=self.random_state),
                                 KNeighborsClassifier(n_neighbors=self.n_neighbors))
        if self.kind == "svm":
            return make_pipeline(StandardScaler(), SVC(C=self.C, kernel="rbf", gamma="scale"))
        raise ConfigError(f"baseline kind must be one of {', '.join(_KINDS)} (got {self.kind!r})")

    def fit(self, X: np.ndarray, y: np.ndarray) -> "FeatureBaseline":
        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y).astype(bool).ravel()
        if X.ndim != 2 or X.shape[1] != len(FEATURE_NAMES) or X.shape[0] != y.size:
            raise ConfigError(f"expected X of shape (n, {len(FEATURE_NAMES)}) and n labels")
        X = np.sign(X) * np.log1p(np.abs(X))  # tame heavy tails for distance-based models
        if X.shape[0] > self.max_train_rows:
            rng = np.random.default_rng(self.random_state)
            keep = rng.choice(X.shape[0], size=self.max_train_rows, replace=False)
            X, y = X[keep], y[keep]
        self.model_ = self._pipeline().fit(X, y.astype(np.int8))
        self.classes_ = np.array([False, True])
        return self

    def predict_proba_features(self, X: np.ndarray) -> np.ndarray:
        if not hasattr(self, "model_"):
            raise NotFittedError(f"this {self.kind} baseline is not fitted")
        X = np.asarray(X, dtype=np.float64)
        X = np.sign(X) * np.log1p(np.abs(X))
        m = self.model_
        if hasattr(m, "predict_proba") and self.kind != "svm":
            p = m.predict_proba(X)
            cls = list(m.classes_)
            return p[:, cls.index(1)] if 1 in cls else np.zeros(X.shape[0])
        return m.predict(X).astype(np.float64)

    def predict(self, X: np.ndarray) -> np.ndarray:
        return self.predict_proba_features(X) >= self.threshold

    def predict_proba_ops(self, ops: pa.Table, *, iteration_times: Any = None) -> np.ndarray:
        if ops.num_rows == 0:
            return np.zeros(0)
        return self.predict_proba_features(operator_features(ops, iteration_times=iteration_times,
                                                             window=self.window))

    def predict_ops(self, ops: pa.Table, *, iteration_times: Any = None) -> np.ndarray:
        return self.predict_proba_ops(ops, iteration_times=iteration_times) >= self.threshold
