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

Evaluation does not walk those arrays directly: on first use they are repacked (and cached on
the instance) into the layouts the kernels read, with float32 thresholds rounded down so that
the comparisons stay exact (see the comments above :func:`_pack`). Rows are evaluated in blocks
of 128, every tree in order for a block, so each row sums the trees' leaf values in tree order
(the same float sum as scikit-learn); with enough rows, the calling thread and helper threads
take blocks dynamically.

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

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import numba
import numpy as np
from numba import types
from numba.cpython.unsafe.numbers import trailing_zeros
from numba.extending import intrinsic

from holmes._jit import njit
from holmes.errors import ConfigError, ModelFormatError

__all__ = ["CompiledForest"]

LEAF = -1

#: rows evaluated together: one block's features (transposed) and per-row state stay in L1
_BLOCK = 128
#: trees with at most this many leaves are evaluated with leaf bitvectors (``_QS_MAX_LEAVES / 32``
#: uint32 words per row)
_QS_MAX_LEAVES = 128
_QS_MAX_WORDS = _QS_MAX_LEAVES // 32
#: fewer rows than this are evaluated by the calling thread alone
_PARALLEL_MIN_ROWS = 2048
_KIND_QS = 0     # <= _QS_MAX_LEAVES leaves: leaf bitvectors, in uint32 words
_KIND_WALK = 1


# ---------------------------------------------------------------------------------------------
# Reference kernel: plain traversal of the sklearn-shaped arrays (used only when the packed
# layout below cannot represent a forest, e.g. more than 2**32 packed node slots).

@njit(cache=True, nogil=True)
def _chunk(X, feature, threshold, left, right, value, roots, out, lo, hi):
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


@njit(cache=True, nogil=True)
def _forest_proba_reference(X, feature, threshold, left, right, value, roots, out):
    n = X.shape[0]
    for lo in range(0, n, 1024):
        _chunk(X, feature, threshold, left, right, value, roots, out, lo, min(n, lo + 1024))


# ---------------------------------------------------------------------------------------------
# Packing: a forest in the layouts the fast kernels read.
#
# * Small trees (<= 128 leaves), "QuickScorer" style (Lucchese et al., SIGIR 2015): the tree's
#   internal nodes as (feature, float32 threshold, the leaves of its left subtree). Leaves are
#   numbered left to right; a row's bitvector (one bit per leaf) starts with all bits set and, for
#   every node it does NOT satisfy (not x <= threshold: the row goes right there), the bits of the
#   node's left-subtree leaves are cleared; its exit leaf is then the lowest set bit (every leaf
#   left of it lies in the left subtree of a node on its path where it went right; nodes off its
#   path only clear leaves it cannot reach). Every node of the tree is tested for a block of rows
#   with SIMD compares on the block's transposed features: no data-dependent branches, no gathers.
#   The bitvectors are uint32 words (as wide as the float32 features: 16 rows per 512-bit
#   register), and a node updates only the words its left-subtree leaves fall in: one word for all
#   but the few nodes near the root of a tree of 33-128 leaves, so such a tree costs about what
#   a tree of <= 32 leaves costs per node.
# * Larger trees, branch-free walk: nodes re-laid out breadth first so that siblings are adjacent
#   (right child = left child + 1), packed in 8 bytes (float32 threshold, then
#   ``child << fb | feature``); a leaf points to itself (threshold NaN, child = itself - 1, and
#   ``not (x <= NaN)`` always adds 1). A block of rows walks the tree in lockstep for the tree's
#   depth, so the rows' independent walks overlap instead of stalling on mispredicted branches.
#
# Thresholds are float32 rounded DOWN from the float64 ones: for a float32 x,
# ``x <= t32_down  <=>  float64(x) <= t64`` (t32_down is the largest float32 <= t64), so the
# comparisons, and thus the leaves, are exactly scikit-learn's.

@njit(cache=True, nogil=True)
def _pack(feature, thr32, left, right, value, roots, n_nodes, n_features, fb):
    """Build both layouts; returns ``ok`` False when a structure check fails (use the reference kernel)."""
    T = roots.size
    kind = np.zeros(T, np.int8)
    # QuickScorer arrays (at most one entry per node)
    q_feat = np.zeros(n_nodes, np.uint32)
    q_thr = np.zeros(n_nodes, np.float32)
    q_lo = np.zeros(n_nodes, np.int32)    # first leaf of the node's left subtree
    q_wid = np.zeros(n_nodes, np.int32)   # leaves of the node's left subtree
    q_words = np.zeros(T, np.int64)       # uint32 words of the tree's bitvectors
    q_start = np.zeros(T + 1, np.int64)
    q_val = np.zeros(n_nodes, np.float64)
    q_lstart = np.zeros(T + 1, np.int64)
    # walk arrays: slot 0 is a dummy so that a leaf's "child - 1" never underflows
    w_node = np.zeros(2 * (n_nodes + 1), np.uint32)
    w_thr = w_node.view(np.float32)
    w_val = np.zeros(n_nodes + 1, np.float64)
    w_root = np.zeros(T, np.uint32)
    w_depth = np.zeros(T, np.int64)
    w_thr[0] = np.nan
    stack = np.empty(n_nodes + 1, np.int64)
    mark = np.empty(n_nodes + 1, np.int64)
    qlo = np.empty(n_nodes + 1, np.int64)
    qnode = np.empty(n_nodes + 1, np.int64)
    qdep = np.empty(n_nodes + 1, np.int64)
    nq = 0
    nl = 0
    pos = 1
    for k in range(T):
        s = roots[k]
        e = roots[k + 1] if k + 1 < T else n_nodes
        if s < 0 or e > n_nodes or e <= s:
            return False, kind, q_feat, q_thr, q_lo, q_wid, q_words, q_start, q_val, q_lstart, w_node, w_val, w_root, w_depth
        # structure check + leaf count (children inside the tree and after their parent: the
        # walk terminates); count reachable nodes (a shared subtree is counted each time)
        n_leaves = 0
        seen = 0
        top = 0
        stack[0] = s
        top = 1
        while top > 0:
            top -= 1
            j = stack[top]
            seen += 1
            if seen > e - s:
                return False, kind, q_feat, q_thr, q_lo, q_wid, q_words, q_start, q_val, q_lstart, w_node, w_val, w_root, w_depth
            if left[j] == -1:
                n_leaves += 1
                continue
            lj = left[j]
            rj = right[j]
            f = feature[j]
            if lj <= j or rj <= j or lj >= e or rj >= e or f < 0 or f >= n_features:
                return False, kind, q_feat, q_thr, q_lo, q_wid, q_words, q_start, q_val, q_lstart, w_node, w_val, w_root, w_depth
            stack[top] = rj
            stack[top + 1] = lj
            top += 2
        if n_leaves <= _QS_MAX_LEAVES:
            kind[k] = _KIND_QS
            q_words[k] = (n_leaves + 31) // 32
            # depth first, left first: leaves come out left to right
            stack[0] = s
            mark[0] = -1
            top = 1
            leaf = 0
            while top > 0:
                top -= 1
                j = stack[top]
                if mark[top] >= 0:  # j is the right child of internal node mark: its left subtree is done
                    q = mark[top]
                    q_wid[q] = leaf - qlo[q]
                if left[j] == -1:
                    q_val[nl + leaf] = value[j]
                    leaf += 1
                    continue
                q_feat[nq] = np.uint32(feature[j])
                q_thr[nq] = thr32[j]
                qlo[nq] = leaf
                q_lo[nq] = leaf
                stack[top] = right[j]
                mark[top] = nq
                stack[top + 1] = left[j]
                mark[top + 1] = -1
                top += 2
                nq += 1
            q_start[k + 1] = nq
            nl += leaf
            q_lstart[k + 1] = nl
        else:
            kind[k] = _KIND_WALK
            q_start[k + 1] = nq
            q_lstart[k + 1] = nl
            # breadth first; siblings adjacent
            w_root[k] = pos
            qnode[0] = s
            qdep[0] = 0
            head = 0
            tail = 1
            nxt = pos + 1
            depth = 0
            while head < tail:
                j = qnode[head]
                d = qdep[head]
                me = pos + head
                head += 1
                if d > depth:
                    depth = d
                if left[j] == -1:
                    w_thr[2 * me] = np.nan
                    w_node[2 * me + 1] = np.uint32((me - 1) << fb)
                    w_val[me] = value[j]
                else:
                    w_thr[2 * me] = thr32[j]
                    w_node[2 * me + 1] = np.uint32((nxt << fb) | feature[j])
                    qnode[tail] = left[j]
                    qdep[tail] = d + 1
                    qnode[tail + 1] = right[j]
                    qdep[tail + 1] = d + 1
                    tail += 2
                    nxt += 2
            w_depth[k] = depth
            pos += tail
    return True, kind, q_feat[:nq], q_thr[:nq], q_lo[:nq], q_wid[:nq], q_words, q_start, q_val[:nl], q_lstart, \
        w_node[:2 * pos], w_val[:pos], w_root, w_depth


@njit(cache=True, nogil=True)
def _block(X, Xf, lo, hi, kind, q_feat, q_thr, q_lo, q_wid, q_words, q_start, q_val, q_lstart,
           w_node, w_thr, w_val, w_root, w_depth, fb, n_qs, out, Xt, bw, idx, acc, bmax):
    """P(class 1) of rows ``lo:hi`` (at most ``_BLOCK``): trees in order, all rows of the block per tree."""
    m = hi - lo
    nf = X.shape[1]
    B = _BLOCK
    ufb = np.uint64(fb)
    fmask = np.uint64((1 << fb) - 1)
    unf = np.uint64(nf)
    if n_qs > 0:  # transposed block: a node's comparisons read one contiguous run of B floats
        inf = np.float32(np.inf)
        for f in range(nf):
            bmax[f] = -inf
        for r in range(m):
            for f in range(nf):
                v = X[lo + r, f]
                Xt[f * B + r] = v
                if not v <= bmax[f]:  # NaN (goes right at every node) counts as +inf
                    bmax[f] = v if v == v else inf
    for r in range(m):
        acc[r] = 0.0
    ALL32 = np.uint32(0xFFFFFFFF)
    ONE = np.uint64(1)
    for k in range(kind.size):
        if kind[k] == _KIND_QS:
            for i in range(q_words[k] * B):
                bw[i] = ALL32
            for j in range(q_start[k], q_start[k + 1]):
                t = q_thr[j]
                if bmax[q_feat[j]] <= t:
                    continue  # every row of the block goes left here: the node clears nothing
                base = np.uint64(q_feat[j]) * np.uint64(B)
                a = q_lo[j]
                e = a + q_wid[j]  # the node clears leaves a .. e-1
                for w in range(a >> 5, ((e - 1) >> 5) + 1):
                    w0 = w << 5
                    ca = max(a, w0) - w0
                    ce = min(e, w0 + 32) - w0
                    mk = np.uint32(~(((ONE << np.uint64(ce - ca)) - ONE) << np.uint64(ca)) & np.uint64(0xFFFFFFFF))
                    wb = np.uint64(w * B)
                    for r in range(B):
                        v = bw[wb + np.uint64(r)]
                        bw[wb + np.uint64(r)] = v if Xt[base + np.uint64(r)] <= t else v & mk
            l0 = q_lstart[k]
            if q_words[k] == 1:
                for r in range(m):
                    acc[r] += q_val[l0 + trailing_zeros(bw[r])]
            elif q_words[k] == 2:  # the two words as one uint64: no data-dependent branch
                for r in range(m):
                    v = np.uint64(bw[r]) | (np.uint64(bw[B + r]) << np.uint64(32))
                    acc[r] += q_val[l0 + trailing_zeros(v)]
            else:
                for r in range(m):
                    w = 0
                    while bw[w * B + r] == 0:
                        w += 1
                    acc[r] += q_val[l0 + (w << 5) + trailing_zeros(bw[w * B + r])]
        else:
            r0 = w_root[k]
            for r in range(m):
                idx[r] = r0
            for _ in range(w_depth[k]):
                for r in range(m):
                    n2 = np.uint64(2) * np.uint64(idx[r])
                    info = np.uint64(w_node[n2 + np.uint64(1)])
                    x = Xf[np.uint64(lo + r) * unf + (info & fmask)]
                    idx[r] = np.uint32((info >> ufb) + (np.uint64(0) if x <= w_thr[n2] else np.uint64(1)))
            for r in range(m):
                acc[r] += w_val[np.uint64(idx[r])]
    t = kind.size
    for r in range(m):
        out[lo + r] = acc[r] / t


@njit(cache=True, nogil=True)
def _scratch(nf):
    """Per-thread work buffers of one block of ``_BLOCK`` rows."""
    return (np.zeros(nf * _BLOCK, np.float32), np.empty(_QS_MAX_WORDS * _BLOCK, np.uint32),
            np.empty(_BLOCK, np.uint32), np.empty(_BLOCK, np.float64), np.empty(nf, np.float32))


@njit(cache=True, nogil=True)
def _proba_serial(X, kind, q_feat, q_thr, q_lo, q_wid, q_words, q_start, q_val, q_lstart, w_node, w_val, w_root, w_depth,
                  fb, n_qs, out):
    n, nf = X.shape
    Xf = X.reshape(n * nf)
    w_thr = w_node.view(np.float32)
    Xt, bw, idx, acc, bmax = _scratch(nf)
    for lo in range(0, n, _BLOCK):
        _block(X, Xf, lo, min(n, lo + _BLOCK), kind, q_feat, q_thr, q_lo, q_wid, q_words, q_start, q_val,
               q_lstart, w_node, w_thr, w_val, w_root, w_depth, fb, n_qs, out, Xt, bw, idx, acc, bmax)


@intrinsic
def _fetch_add(typingctx, counter, inc):
    """Atomically ``old = counter[0]; counter[0] += inc; return old`` (int64 array, sequentially consistent)."""
    if not (isinstance(counter, types.Array) and counter.dtype == types.int64):
        return None
    sig = types.int64(counter, types.int64)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.atomic_rmw("add", ary.data, args[1], "seq_cst")

    return sig, codegen


@njit(cache=True, nogil=True)
def _proba_claiming(X, kind, q_feat, q_thr, q_lo, q_wid, q_words, q_start, q_val, q_lstart, w_node, w_val, w_root, w_depth,
                    fb, n_qs, out, counter):
    """Evaluate blocks claimed one at a time from ``counter`` until none is left (run by several threads)."""
    n, nf = X.shape
    Xf = X.reshape(n * nf)
    w_thr = w_node.view(np.float32)
    Xt, bw, idx, acc, bmax = _scratch(nf)
    nblocks = (n + _BLOCK - 1) // _BLOCK
    while True:
        b = _fetch_add(counter, 1)
        if b >= nblocks:
            break
        lo = b * _BLOCK
        _block(X, Xf, lo, min(n, lo + _BLOCK), kind, q_feat, q_thr, q_lo, q_wid, q_words, q_start, q_val,
               q_lstart, w_node, w_thr, w_val, w_root, w_depth, fb, n_qs, out, Xt, bw, idx, acc, bmax)


_POOL: tuple[int, ThreadPoolExecutor] | None = None
_POOL_LOCK = threading.Lock()


def _helpers(n: int) -> ThreadPoolExecutor:
    """A process-wide pool of ``n`` helper threads (recreated after a fork)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL[0] != os.getpid() or _POOL[1]._max_workers < n:
            _POOL = (os.getpid(), ThreadPoolExecutor(max_workers=n, thread_name_prefix="holmes-forest"))
        return _POOL[1]


def _run_threads(X: np.ndarray, packed: tuple, out: np.ndarray, n_threads: int) -> None:
    """The calling thread and ``n_threads - 1`` helpers claim blocks of rows dynamically.

    Dynamic claiming keeps a busy or descheduled helper from delaying the result: the caller
    simply takes the remaining blocks (at worst it waits for the one block a helper holds).
    """
    counter = np.zeros(1, dtype=np.int64)
    pool = _helpers(n_threads - 1)
    futs = [pool.submit(_proba_claiming, X, *packed, out, counter) for _ in range(n_threads - 1)]
    _proba_claiming(X, *packed, out, counter)
    for f in futs:
        if not f.cancel():  # a helper still queued (busy with another call) has nothing left to do
            f.result()


def _round_down_f32(t64: np.ndarray) -> np.ndarray:
    """The largest float32 <= each float64 (NaN stays NaN; beyond the float32 range: +-max or -inf)."""
    t64 = np.asarray(t64, dtype=np.float64)
    with np.errstate(over="ignore"):
        t32 = t64.astype(np.float32)
    up = t32.astype(np.float64) > t64
    t32[up] = np.nextafter(t32[up], np.float32(-np.inf))
    return t32


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

    def _packed(self) -> tuple | None:
        """The kernels' layout of this forest, built on first use and cached on the instance.

        The node arrays are treated as immutable once a forest has been used for prediction (the
        arrays of shipped models are read-only; :meth:`shift_thresholds` returns a new forest).
        ``None``: the forest does not fit the packed layout; the reference kernel is used.
        """
        cached = self.__dict__.get("_packed_cache")
        if cached is not None:
            return cached[0]
        packed = None
        n = int(self.feature.size)
        fb = max(1, (int(self.n_features) - 1).bit_length())
        if n > 0 and self.roots.size > 0 and ((n + 2) << fb) < 2 ** 32:
            ok, *arrays = _pack(np.ascontiguousarray(self.feature, dtype=np.int64), _round_down_f32(self.threshold),
                                np.ascontiguousarray(self.left, dtype=np.int64),
                                np.ascontiguousarray(self.right, dtype=np.int64),
                                np.ascontiguousarray(self.leaf_value, dtype=np.float64),
                                np.ascontiguousarray(self.roots, dtype=np.int64), n, int(self.n_features), fb)
            if ok:
                arrays = [a.copy() for a in arrays]  # trimmed views: keep only what is used
                packed = (*arrays, fb, int(np.count_nonzero(arrays[0] != _KIND_WALK)))
        object.__setattr__(self, "_packed_cache", (packed,))
        return packed

    def predict_proba(self, X: np.ndarray, *, parallel: bool = True) -> np.ndarray:
        """P(abnormal) of each row of ``X`` (n, n_features); equals scikit-learn's ``predict_proba[:, 1]``.

        ``parallel``: with at least 2048 rows, the calling thread and helper threads (up to
        ``numba.config.NUMBA_NUM_THREADS`` in all) share the row blocks; the result is the same.
        """
        X = np.ascontiguousarray(X, dtype=np.float32)
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise ConfigError(f"feature matrix has shape {X.shape}; the forest expects {self.n_features} columns")
        out = np.empty(X.shape[0], dtype=np.float64)
        if X.shape[0] == 0:
            return out
        packed = self._packed()
        if packed is None:
            _forest_proba_reference(X, self.feature, self.threshold, self.left, self.right, self.leaf_value,
                                    self.roots, out)
        elif parallel and X.shape[0] >= _PARALLEL_MIN_ROWS and numba.config.NUMBA_NUM_THREADS > 1:
            _run_threads(X, packed, out, min(numba.config.NUMBA_NUM_THREADS, X.shape[0] // (_PARALLEL_MIN_ROWS // 2)))
        else:
            _proba_serial(X, *packed, out)
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
