"""A random forest flattened into arrays and evaluated by a numba kernel.

:class:`CompiledForest` holds every tree of a fitted binary scikit-learn forest as flat node
arrays (``feature``, ``threshold``, ``left``, ``right``, ``leaf_value``) plus per-tree offsets.
:meth:`CompiledForest.predict_proba` returns exactly what ``RandomForestClassifier.predict_proba``
returns for the positive class: the input is cast to float32 as scikit-learn does, a row goes left
when ``x[feature] <= threshold``, and the per-tree leaf probabilities are summed in tree order and
divided by the number of trees.

The arrays are also the on-disk model format (see :mod:`holmes.detect.model_io`) and what drift
auto-tuning edits: :meth:`CompiledForest.shift_thresholds` returns a new forest whose nodes that
split on the given features have their thresholds moved.

Examples
--------
>>> import numpy as np
>>> from sklearn.ensemble import RandomForestClassifier
>>> rng = np.random.default_rng(0)
>>> X = rng.normal(size=(200, 3)); y = (X[:, 0] > 0.3).astype(int)
>>> rf = RandomForestClassifier(n_estimators=5, random_state=0).fit(X, y)
>>> cf = CompiledForest.from_sklearn(rf)
>>> bool(np.array_equal(cf.predict_proba(X), rf.predict_proba(X)[:, 1]))
True
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numba
import numpy as np

from holmes.errors import ConfigError, ModelFormatError

__all__ = ["CompiledForest"]

LEAF = -1


@numba.njit(cache=True, nogil=True)
def _chunk(X, feature, threshold, left, right, value, roots, out, lo, hi):
    # trees outer, rows inner: a tree's nodes stay in cache while the rows stream through it; each
    # row still sums the trees in order (the same float sum as scikit-learn)
    for i in range(lo, hi):
        out[i] = 0.0
    for k in range(roots.size):
        root = roots[k]
        for i in range(lo, hi):
            node = root
            while left[node] != -1:
                if np.float64(X[i, feature[node]]) <= threshold[node]:
                    node = left[node]
                else:
                    node = right[node]
            out[i] += value[node]
    t = roots.size
    for i in range(lo, hi):
        out[i] = out[i] / t


@numba.njit(cache=True, nogil=True, parallel=True)
def _forest_proba(X, feature, threshold, left, right, value, roots, out):
    n = X.shape[0]
    nchunks = (n + 1023) // 1024
    for c in numba.prange(nchunks):
        _chunk(X, feature, threshold, left, right, value, roots, out, c * 1024, min(n, (c + 1) * 1024))


@numba.njit(cache=True, nogil=True)
def _forest_proba_serial(X, feature, threshold, left, right, value, roots, out):
    n = X.shape[0]
    for lo in range(0, n, 1024):
        _chunk(X, feature, threshold, left, right, value, roots, out, lo, min(n, lo + 1024))


@dataclass(frozen=True)
class CompiledForest:
    """Flat arrays of a binary-classification forest.

    Node ``j`` of tree ``k`` lives at index ``roots[k] + j``; ``left``/``right`` hold absolute
    indices (``-1`` at leaves); ``leaf_value`` is P(class 1) at a leaf (0 elsewhere).

    Attributes
    ----------
    feature : int32 array
    threshold : float64 array
    left, right : int32 arrays
    leaf_value : float64 array
    roots : int32 array, one entry per tree
    n_features : int
    """

    feature: np.ndarray
    threshold: np.ndarray
    left: np.ndarray
    right: np.ndarray
    leaf_value: np.ndarray
    roots: np.ndarray
    n_features: int
    meta: dict = field(default_factory=dict, compare=False)

    @property
    def n_trees(self) -> int:
        return int(self.roots.size)

    @property
    def n_nodes(self) -> int:
        return int(self.feature.size)

    @classmethod
    def from_sklearn(cls, forest) -> "CompiledForest":
        """Flatten a fitted ``RandomForestClassifier`` / ``ExtraTreesClassifier`` (binary or one-class)."""
        classes = list(getattr(forest, "classes_", []))
        if not classes or len(classes) > 2:
            raise ConfigError(f"need a fitted binary forest (classes {classes})")
        pos = 1 if len(classes) == 2 else None
        if pos is None:  # one class only: P(abnormal) = 1 if that class is truthy else 0
            const = 1.0 if bool(classes[0]) else 0.0
        feats, thrs, lefts, rights, vals, roots = [], [], [], [], [], []
        off = 0
        for est in forest.estimators_:
            tr = est.tree_
            m = tr.node_count
            v = tr.value[:, 0, :].astype(np.float64)
            leaf = tr.children_left == LEAF
            if pos is None:
                p = np.full(m, const)
            else:
                s = v.sum(axis=1)
                p = np.where(s > 0, v[:, pos] / np.where(s > 0, s, 1.0), 0.0)
            p = np.where(leaf, p, 0.0)
            lf = np.where(leaf, LEAF, tr.children_left + off)
            rt = np.where(leaf, LEAF, tr.children_right + off)
            feats.append(np.where(leaf, 0, tr.feature).astype(np.int32))
            thrs.append(np.where(leaf, 0.0, tr.threshold).astype(np.float64))
            lefts.append(lf.astype(np.int32))
            rights.append(rt.astype(np.int32))
            vals.append(p)
            roots.append(off)
            off += m
        return cls(np.concatenate(feats), np.concatenate(thrs), np.concatenate(lefts), np.concatenate(rights),
                   np.concatenate(vals), np.asarray(roots, dtype=np.int32), int(forest.n_features_in_))

    def predict_proba(self, X: np.ndarray, *, parallel: bool = True) -> np.ndarray:
        """P(abnormal) of each row of ``X`` (n, n_features); equals scikit-learn's ``predict_proba[:, 1]``."""
        X = np.ascontiguousarray(X, dtype=np.float32)
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise ConfigError(f"feature matrix has shape {X.shape}; the forest expects {self.n_features} columns")
        out = np.empty(X.shape[0], dtype=np.float64)
        if X.shape[0] == 0:
            return out
        fn = _forest_proba if parallel and X.shape[0] >= 2048 else _forest_proba_serial
        fn(X, self.feature, self.threshold, self.left, self.right, self.leaf_value, self.roots, out)
        return out

    def split_counts(self) -> np.ndarray:
        """How many internal nodes split on each feature."""
        internal = self.left != LEAF
        return np.bincount(self.feature[internal], minlength=self.n_features)

    def shift_thresholds(self, shifts: dict[int, float] | np.ndarray, *, multiplicative: bool = False) -> "CompiledForest":
        """A new forest whose nodes splitting on feature ``f`` have ``threshold += shifts[f]``.

        With ``multiplicative=True`` thresholds are scaled (``threshold *= shifts[f]``) instead.
        Leaves and nodes on other features are unchanged; ``self`` is not modified.

        Examples
        --------
        >>> cf = CompiledForest(np.array([0, 0, 0], np.int32), np.array([1.0, 0, 0]),
        ...                     np.array([1, -1, -1], np.int32), np.array([2, -1, -1], np.int32),
        ...                     np.array([0, 0.0, 1.0]), np.array([0], np.int32), 2)
        >>> cf.shift_thresholds({0: 0.5}).threshold.tolist(), cf.threshold.tolist()
        ([1.5, 0.0, 0.0], [1.0, 0.0, 0.0])
        """
        if isinstance(shifts, dict):
            vec = np.full(self.n_features, 1.0 if multiplicative else 0.0)
            for f, s in shifts.items():
                if not 0 <= int(f) < self.n_features:
                    raise ConfigError(f"feature index {f} outside 0..{self.n_features - 1}")
                vec[int(f)] = float(s)
        else:
            vec = np.asarray(shifts, dtype=np.float64)
            if vec.shape != (self.n_features,):
                raise ConfigError(f"shifts must have {self.n_features} entries (got shape {vec.shape})")
        if not np.all(np.isfinite(vec)):
            raise ConfigError("threshold shifts must be finite")
        internal = self.left != LEAF
        thr = self.threshold.copy()
        if multiplicative:
            thr[internal] = thr[internal] * vec[self.feature[internal]]
        else:
            thr[internal] = thr[internal] + vec[self.feature[internal]]
        return replace(self, threshold=thr)

    def validate(self, source: str = "model") -> "CompiledForest":
        """Check array shapes, dtypes and tree structure; raise :class:`ModelFormatError` if broken."""
        arrs = {"feature": self.feature, "threshold": self.threshold, "left": self.left, "right": self.right,
                "leaf_value": self.leaf_value}
        m = self.feature.shape[0] if self.feature.ndim == 1 else -1
        for name, a in arrs.items():
            if a.ndim != 1 or a.shape[0] != m:
                raise ModelFormatError(f"{source}: array '{name}' has shape {a.shape}, expected ({m},)")
        if self.roots.ndim != 1 or self.roots.size == 0:
            raise ModelFormatError(f"{source}: array 'roots' must list at least one tree")
        if m == 0:
            raise ModelFormatError(f"{source}: the forest has no nodes")
        if self.n_features < 1:
            raise ModelFormatError(f"{source}: n_features must be >= 1")
        idx = np.arange(m)
        leaf = self.left == LEAF
        if np.any((self.right == LEAF) != leaf):
            raise ModelFormatError(f"{source}: arrays 'left'/'right' disagree on which nodes are leaves")
        internal = ~leaf
        # children come after their parent (scikit-learn's order): traversal always terminates
        if np.any(self.left[internal] <= idx[internal]) or np.any(self.right[internal] <= idx[internal]) \
                or np.any(self.left[internal] >= m) or np.any(self.right[internal] >= m):
            raise ModelFormatError(f"{source}: arrays 'left'/'right' hold out-of-range child indices")
        if np.any(self.feature[internal] < 0) or np.any(self.feature[internal] >= self.n_features):
            raise ModelFormatError(f"{source}: array 'feature' holds indices outside 0..{self.n_features - 1}")
        if not np.all(np.isfinite(self.threshold)) or not np.all(np.isfinite(self.leaf_value)):
            raise ModelFormatError(f"{source}: arrays 'threshold'/'leaf_value' hold non-finite values")
        if np.any(self.leaf_value < 0) or np.any(self.leaf_value > 1):
            raise ModelFormatError(f"{source}: array 'leaf_value' holds probabilities outside [0, 1]")
        r = self.roots
        if np.any(r < 0) or np.any(r >= m) or np.any(np.diff(r) <= 0) or r[0] != 0:
            raise ModelFormatError(f"{source}: array 'roots' must be increasing node indices starting at 0")
        # a child never crosses into another tree
        tree_of = np.searchsorted(r, idx, side="right") - 1
        if np.any(tree_of[self.left[internal]] != tree_of[internal]) or \
                np.any(tree_of[self.right[internal]] != tree_of[internal]):
            raise ModelFormatError(f"{source}: a node's child lies in another tree")
        return self
