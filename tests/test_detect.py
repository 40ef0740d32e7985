"""Detector core: features, compiled forest == scikit-learn, model files, drift tuning, baselines."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from sklearn.ensemble import RandomForestClassifier

from holmes.detect import (FEATURE_NAMES, AutoTuner, CompiledForest, DriftMonitor, OperatorDetector,
                           operator_features)
from holmes.eval.detect_baselines import FeatureBaseline, ThreeSigmaDetector
from holmes.detect.features import DRIFT_FEATURES
from holmes.errors import ConfigError, ModelFormatError, NotFittedError, SchemaError
from holmes.io.schema import ops_table

F = FEATURE_NAMES.index


def synth_rank(n_iter=30, n_ops=12, seed=0, slow=(), factor=3.0, drift=0.0, rank=0):
    """One rank's table: n_ops ops per iteration with noisy durations; ``slow`` = (iteration, op_index) pairs."""
    rng = np.random.default_rng(seed)
    ops_cycle = ["all_reduce", "all_gather", "reduce_scatter", "send", "recv", "all_to_all"]
    it = np.repeat(np.arange(n_iter), n_ops)
    ix = np.tile(np.arange(n_ops), n_iter)
    base = np.tile(rng.uniform(50e3, 2e6, n_ops), n_iter)
    dur = base * rng.uniform(0.95, 1.05, it.size) * (1 + drift * it)
    ab = np.zeros(it.size, bool)
    for (i, k) in slow:
        m = (it == i) & (ix == k)
        dur[m] *= factor
        ab |= m
    gap = np.tile(rng.uniform(1e5, 5e5, n_ops), n_iter) * (1 + drift * it)
    start = np.empty(it.size, np.int64)
    end = np.empty(it.size, np.int64)
    t = 0.0
    for j in range(it.size):  # test-data builder only
        t += gap[j]
        start[j] = int(t)
        t += dur[j]
        end[j] = int(t)
    op = [ops_cycle[k % len(ops_cycle)] for k in ix]
    peer = [1 if o in ("send", "recv") else None for o in op]
    comm = [("pp-0" if o in ("send", "recv") else f"g-{k % 3}") for k, o in zip(ix, op)]
    return ops_table(rank=[rank] * it.size, iteration=it, op_index=ix, comm_id=comm, seq=np.arange(it.size),
                     op=op, peer=peer, nbytes=np.full(it.size, 1 << 20), start_ns=start, end_ns=end, abnormal=ab)


def synth_dataset(n_ranks=6, seed=0):
    rng = np.random.default_rng(seed)
    Xs, ys = [], []
    for r in range(n_ranks):
        slow = [(int(rng.integers(30)), int(rng.integers(12))) for _ in range(25)]
        t = synth_rank(seed=seed * 100 + r, slow=slow, factor=float(rng.uniform(1.5, 4)))
        Xs.append(operator_features(t))
        ys.append(t.column("abnormal").to_numpy())
    return np.concatenate(Xs), np.concatenate(ys)


@pytest.fixture(scope="module")
def data():
    return synth_dataset(6, 0)


@pytest.fixture(scope="module")
def fitted(data):
    X, y = data
    return OperatorDetector(n_estimators=12, max_depth=8, random_state=0).fit(X, y)


# ------------------------------------------------------------------------ features
def test_features_shape_finite_and_slow_op_stands_out():
    t = synth_rank(slow=[(10, 3)], factor=4.0)
    X = operator_features(t)
    assert X.shape == (t.num_rows, len(FEATURE_NAMES)) and X.dtype == np.float32
    assert np.isfinite(X).all()
    row = 10 * 12 + 3
    assert X[row, F("ratio_min")] > 3.0
    others = np.delete(X[:, F("ratio_min")], row)
    assert others.max() < 1.2
    assert X[row, F("above_gap")] == 1.0


def test_features_row_order_invariant():
    t = synth_rank(slow=[(5, 1)])
    perm = np.random.default_rng(1).permutation(t.num_rows)
    X1 = operator_features(t)
    X2 = operator_features(t.take(pa.array(perm)))
    np.testing.assert_allclose(X2, X1[perm], rtol=1e-6)


@pytest.mark.parametrize("n_iter", [1, 2, 3])
def test_features_short_logs_are_finite(n_iter):
    t = synth_rank(n_iter=n_iter, n_ops=5)
    X = operator_features(t)
    assert X.shape[0] == t.num_rows and np.isfinite(X).all()


def test_features_missing_iterations_and_zero_durations():
    t = synth_rank(n_iter=20, n_ops=4)
    it = t.column("iteration").to_numpy()
    t = t.filter(pa.array((it % 3) != 1))
    t = t.set_column(t.schema.get_field_index("end_ns"), "end_ns", t.column("start_ns"))  # all zero durations
    X = operator_features(t)
    assert np.isfinite(X).all()


def test_features_empty_and_missing_column():
    t = synth_rank(n_iter=2, n_ops=2)
    assert operator_features(t.slice(0, 0)).shape == (0, len(FEATURE_NAMES))
    with pytest.raises(SchemaError, match="end_ns"):
        operator_features(t.drop_columns(["end_ns"]))
    with pytest.raises(ConfigError):
        operator_features(t, window=0)


def test_features_sliding_window_matches_whole_log_when_window_is_long():
    t = synth_rank(n_iter=12, n_ops=3, slow=[(4, 0)])
    np.testing.assert_array_equal(operator_features(t, window=12), operator_features(t, window=500))
    Xs = operator_features(t, window=4)
    assert np.isfinite(Xs).all() and Xs[:, F("win_count")].max() == 4


def test_iteration_times_are_used():
    t = synth_rank(n_iter=4, n_ops=3)
    X = operator_features(t, iteration_times=(np.arange(4), np.full(4, 7_000_000)))
    assert np.allclose(X[:, F("iter_ms")], 7.0)


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 6), st.integers(1, 5), st.integers(0, 10_000))
def test_features_always_finite(n_iter, n_ops, seed):
    X = operator_features(synth_rank(n_iter=n_iter, n_ops=n_ops, seed=seed, slow=[(0, 0)], factor=50.0))
    assert np.isfinite(X).all()



# features as computed before the numba rewrite (same data, window 16): column sums
_GOLDEN_COLUMN_SUMS = [
    243.734580211, 2402.99418116, 242.722949356, 21.6083585527, 231.276490875, 239.615860224, 248.040762715,
    16.7642720044, 243.734583855, 99.5503050685, 11.1904718438, 79.0570973936, 284.794581234, 308.824789166,
    301.79926616, 144.6875, 25.5717864633, 28.3872633493, 280.00000114, 2.09323862781, 279.397820261,
    80290.8940017, 0.592834503419, 279.037836373, 278.923579752, 285.408319145, 4480.0, 297.539154887,
    18.0263734577, 19.0596116381, 19.0596115636, 19.0596116604, 2.0, 360.0, 40.5678222105, 132.0,
    1187.08784127, 6.5519381538, 5600.00053406, 840.0, 80.0, 140.000000596]


def test_features_unchanged_from_reference_values():
    t = synth_rank(n_iter=40, n_ops=7, seed=11, slow=[(5, 2), (30, 6)], factor=3.0, drift=0.01)
    X = operator_features(t, window=16)
    n_rank = len(_GOLDEN_COLUMN_SUMS)  # the per-rank features; the context ones are tested on their own
    np.testing.assert_allclose(X[:, :n_rank].astype(np.float64).sum(axis=0), _GOLDEN_COLUMN_SUMS, rtol=1e-6)


def _string_variants(t):
    """The same table with comm_id/op dictionary-encoded, as several chunks, and as chunks whose
    dictionaries differ (another value order, an unused and a repeated value)."""
    import pyarrow.compute as pc

    def recode(tab, fn):
        for c in ("comm_id", "op"):
            tab = tab.set_column(tab.schema.get_field_index(c), c, fn(tab.column(c).combine_chunks().cast(pa.string())))
        return tab

    def odd_dictionary(arr):
        vals = arr.to_pylist()
        dic = sorted(set(vals), reverse=True) + ["never-used", sorted(set(vals))[0]]
        return pa.DictionaryArray.from_arrays(pa.array([dic.index(v) for v in vals], pa.int32()), pa.array(dic))

    enc = recode(t, pc.dictionary_encode)
    yield enc
    k = t.num_rows // 3
    yield pa.concat_tables([enc.slice(0, k), enc.slice(k, k), enc.slice(2 * k)])
    yield pa.concat_tables([recode(t.slice(0, k), pc.dictionary_encode), recode(t.slice(k), odd_dictionary)])
    yield recode(t, odd_dictionary)


def test_features_same_for_dictionary_plain_and_chunked_strings():
    t = synth_rank(n_iter=25, n_ops=9, seed=4, slow=[(7, 3)])
    X = operator_features(t, window=8)
    for v in _string_variants(t):
        np.testing.assert_array_equal(operator_features(v, window=8), X)


def _naive_window_stats(vals, window):
    """The per-position statistics, one element at a time: np.sort of the window, sums in ascending
    order, the largest log-gap over all consecutive pairs (first maximum)."""
    import math
    n = len(vals)
    m = min(n, window)
    out = np.zeros((14, n))
    for i in range(n):
        lo = min(max(i - window // 2, 0), n - m)
        a = np.sort(vals[lo:lo + m])
        mean = 0.0
        for v in a:
            mean += v
        mean /= m
        var = 0.0
        for v in a:
            var += (v - mean) ** 2

        def q(p):
            pos = p * (m - 1)
            k = int(math.floor(pos))
            h = min(k + 1, m - 1)
            return a[k] + (a[h] - a[k]) * (pos - k)
        best, above = (-1.0, np.inf) if m >= 2 else (0.0, np.inf)
        for j in range(m - 1):
            g = math.log(max(a[j + 1], 1e-6) / max(a[j], 1e-6))
            if g > best:
                best, above = g, a[j + 1]
        gmean = math.log(max(a[-1], 1e-6) / max(a[0], 1e-6)) / (m - 1) if m >= 2 else 0.0
        lt, le = np.searchsorted(a, vals[i], "left"), np.searchsorted(a, vals[i], "right")
        out[:, i] = [mean, math.sqrt(var / m), q(0.25), q(0.5), q(0.75), a[0], q(0.10), (lt + 0.5 * (le - lt)) / m,
                     m, vals[max(i - 1, 0)], vals[min(i + 1, n - 1)], best, float(vals[i] >= above), gmean]
    return out


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from([0.0, 1e-7, 0.5, 1.0, 1.0000000001, 2.0, 2.0000001, 3.0, 4.0, 8.0, 1e3]),
                min_size=1, max_size=90) | st.lists(st.floats(0, 1e4), min_size=1, max_size=90),
       st.sampled_from([1, 2, 3, 8, 33, 64]))
@example([0.0, 0.0, 1.0000000001, 2.0, 2.0, 3.0, 4.0, 8.0], 8)  # the spreads one ulp apart (CI, 2026-11-26)
def test_window_stats_equal_naive_one_window_at_a_time(vals, window):
    """Batched windows, ratio-first largest gap (ties and near-ties included), branch-free ranks."""
    from holmes.detect.features import _window_stats
    vals = np.asarray(vals, dtype=np.float64)
    n = vals.size
    out = np.zeros((14, n))
    order = np.arange(n)[::-1].copy()      # table rows hold the values reversed; the group lists them back
    _window_stats(vals[::-1].copy(), order, np.array([0]), np.array([n]), window, out)
    got, want = out[:, ::-1], _naive_window_stats(vals, window)
    exact = np.arange(14) != 1  # the standard deviation's square root may round one ulp apart
    np.testing.assert_array_equal(got[exact], want[exact])
    np.testing.assert_allclose(got[1], want[1], rtol=1e-13, atol=0.0)



def test_window_stats_long_windows_equal_naive():
    """Windows longer than 256 values take the binary-search paths."""
    vals = np.round(np.random.default_rng(3).lognormal(size=420), 2)    # ties included
    test_window_stats_equal_naive_one_window_at_a_time.hypothesis.inner_test(list(vals), 300)


def test_largest_gap_keeps_the_first_of_ratios_with_equal_logs():
    """1e10 and 1e10 * (1 + 8.9e-16) are different ratios with the same float64 log: the first gap wins."""
    vals = [1e10, 2e10 * 1e10 * (1 + 2 ** -50), 1.0, 2e10, 1e10]
    test_window_stats_equal_naive_one_window_at_a_time.hypothesis.inner_test(vals, 8)
    from holmes.detect.features import _window_stats
    out = np.zeros((14, 5))
    _window_stats(np.array(vals), np.arange(5), np.array([0]), np.array([5]), 8, out)
    assert out[12].tolist() == [1.0, 1.0, 0.0, 1.0, 1.0]     # at or above 1e10 (not only above 2e10)

# ------------------------------------------------------------------------ compiled forest
@pytest.mark.parametrize("criterion", ["gini", "entropy"])
def test_compiled_forest_equals_sklearn_predict_proba(data, criterion):
    X, y = data
    rf = RandomForestClassifier(n_estimators=15, criterion=criterion, max_depth=10, random_state=3).fit(X, y)
    cf = CompiledForest.from_sklearn(rf)
    rng = np.random.default_rng(0)
    Xq = np.concatenate([X, X[rng.integers(0, len(X), 3000)] * rng.uniform(0.9, 1.1, (3000, X.shape[1]))])
    want = rf.predict_proba(Xq.astype(np.float32))[:, 1]
    np.testing.assert_array_equal(cf.predict_proba(Xq), want)                  # parallel kernel (n >= 2048)
    np.testing.assert_array_equal(cf.predict_proba(Xq[:100]), want[:100])     # serial kernel


def test_round_down_thresholds_edge_cases():
    from holmes.detect.forest import _round_down_f32
    f32 = np.finfo(np.float32)
    t = np.array([0.0, -0.0, 1.0, 0.1, -0.1, 1 / 3, float(f32.max), 3.5e38, -3.5e38, np.inf, -np.inf,
                  1e-45, -1e-45, 1e-40, 5e-324, float(np.nextafter(np.float32(1), np.float32(2))) - 1e-12])
    t32 = _round_down_f32(t)
    assert t32.dtype == np.float32
    assert np.all(t32.astype(np.float64) <= t)
    up = np.nextafter(t32, np.float32(np.inf)).astype(np.float64)
    assert np.all((up > t) | (t32 == f32.max) | (t32 == np.inf))     # the largest float32 <= t
    assert t32[7] == f32.max and t32[8] == -np.inf and t32[9] == np.inf and t32[10] == -np.inf


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=False, width=64),
       st.floats(allow_nan=True, width=32) | st.sampled_from([0.0, -0.0]),
       st.integers(-2, 2))
def test_round_down_threshold_comparison_is_exact(t, x, ulps):
    """float32 x <= (largest float32 <= t)  <=>  float64(x) <= t, also for x next to the threshold."""
    from holmes.detect.forest import _round_down_f32
    t32 = _round_down_f32(np.array([t]))[0]
    xs = [np.float32(x), t32]
    for k in range(abs(ulps)):   # walk a few float32 steps from the threshold
        xs.append(np.nextafter(xs[-1], np.float32(np.inf if ulps > 0 else -np.inf)))
    for v in xs:
        assert bool(v <= t32) == bool(np.float64(v) <= t)


def _forest_of(trees):
    """One RandomForestClassifier whose estimators are those of the given fitted forests, in order."""
    import copy
    rf = copy.deepcopy(trees[0])
    rf.estimators_ = [e for f in trees for e in f.estimators_]
    rf.n_estimators = len(rf.estimators_)
    return rf


@pytest.mark.parametrize("shape", ["small", "mid", "wide", "deep", "mixed", "best_first"])
def test_compiled_forest_all_layouts_equal_sklearn(shape):
    """<= 32 leaves (one 32-bit word of leaf bits), 33..64 and 65..128 leaves (2-4 words), larger
    trees (walk), a mix, and best-first trees (node ids not in left-to-right leaf order); rows on the
    thresholds, and rows sorted by a feature (blocks where every row goes left at many nodes)."""
    from holmes.detect.forest import _KIND_QS, _KIND_WALK, _QS_MAX_LEAVES
    rng = np.random.default_rng(7)
    X = rng.normal(size=(3000, 6)).astype(np.float32)
    y = (X[:, 0] + 0.5 * X[:, 1] ** 2 + 0.3 * rng.normal(size=3000) > 0.4).astype(int)
    kw = {"small": [dict(max_leaf_nodes=20)], "mid": [dict(max_leaf_nodes=60)], "deep": [dict(max_depth=None)],
          "wide": [dict(max_leaf_nodes=110)],
          "mixed": [dict(max_leaf_nodes=8), dict(max_depth=None), dict(max_leaf_nodes=50), dict(max_leaf_nodes=100),
                    dict(max_depth=3)],
          "best_first": [dict(max_leaf_nodes=200)]}[shape]
    rf = _forest_of([RandomForestClassifier(n_estimators=5, random_state=i, **k).fit(X, y) for i, k in enumerate(kw)])
    cf = CompiledForest.from_sklearn(rf)
    leaves = np.diff(np.r_[cf.roots, cf.n_nodes]) // 2 + 1
    assert {"small": leaves.max() <= 32, "mid": (leaves > 32).any() and leaves.max() <= 64,
            "wide": (leaves > 64).all() and leaves.max() <= 128, "deep": leaves.min() > 128,
            "mixed": leaves.min() <= 32 and leaves.max() > 128 and ((leaves > 64) & (leaves <= 128)).any(),
            "best_first": leaves.min() > 128}[shape]
    kinds = cf._packed()[0]
    np.testing.assert_array_equal(kinds, np.where(leaves <= _QS_MAX_LEAVES, _KIND_QS, _KIND_WALK))
    # queries: data, and values exactly at / one float32 step around the thresholds
    internal = cf.left != -1
    thr = cf.threshold[internal]
    Xq = X[rng.integers(0, len(X), 2600)].copy()
    for j in range(len(Xq)):
        k = rng.integers(thr.size)
        t32 = np.float32(thr[k])
        near = [t32, np.nextafter(t32, np.float32(-1e9)), np.nextafter(t32, np.float32(1e9))]
        Xq[j, cf.feature[internal][k]] = near[j % 3]
    want = rf.predict_proba(Xq)[:, 1]
    for n in (1, 127, 128, 129, 2600):
        np.testing.assert_array_equal(cf.predict_proba(Xq[:n], parallel=False), want[:n])
    np.testing.assert_array_equal(cf.predict_proba(Xq), want)     # helper threads share the blocks
    order = np.argsort(Xq[:, 0], kind="stable")
    np.testing.assert_array_equal(cf.predict_proba(Xq[order], parallel=False), want[order])


def test_compiled_forest_nan_inf_inputs_match_reference_kernel(fitted, data):
    """Non-finite features (scikit-learn rejects them): every kernel takes the same branches as a
    plain walk of the float64 thresholds (NaN goes right)."""
    from holmes.detect.forest import _forest_proba_reference
    X, _ = data
    cf = fitted.forest_
    Xq = X[:2500].astype(np.float32).copy()
    rng = np.random.default_rng(1)
    mask = rng.random(Xq.shape) < 0.1
    Xq[mask] = rng.choice(np.array([np.nan, np.inf, -np.inf], np.float32), size=int(mask.sum()))
    ref = np.empty(len(Xq))
    _forest_proba_reference(Xq, cf.feature, cf.threshold, cf.left, cf.right, cf.leaf_value, cf.roots, ref)
    np.testing.assert_array_equal(cf.predict_proba(Xq), ref)
    np.testing.assert_array_equal(cf.predict_proba(Xq, parallel=False), ref)


def test_compiled_forest_shared_subtree_uses_reference_kernel():
    """Arrays that are not a tree (a node reached twice) cannot be packed: the reference walk is used."""
    cf = CompiledForest(np.array([0, 1, 0, 0], np.int32), np.array([0.0, 5.0, 0.0, 0.0]),
                        np.array([1, 3, -1, -1], np.int32), np.array([2, 3, -1, -1], np.int32),
                        np.array([0.0, 0.0, 0.25, 1.0]), np.array([0], np.int32), 2)
    assert cf._packed() is None
    X = np.array([[-1, 0], [1, 0], [-1, 9]], np.float32)
    np.testing.assert_array_equal(cf.predict_proba(X), [1.0, 0.25, 1.0])


def test_detector_matches_its_sklearn_estimator(fitted, data):
    X, _ = data
    np.testing.assert_array_equal(fitted.predict_proba(X)[:, 1], fitted.estimator_.predict_proba(X)[:, 1])


def test_one_class_forest():
    X = np.random.default_rng(0).normal(size=(50, 3))
    rf = RandomForestClassifier(n_estimators=3, random_state=0).fit(X, np.zeros(50, int))
    assert np.all(CompiledForest.from_sklearn(rf).predict_proba(X) == 0.0)


def test_shift_moves_exactly_the_nodes_on_shifted_features(fitted):
    cf = fitted.forest_
    internal = cf.left != -1
    used = np.bincount(cf.feature[internal], minlength=len(FEATURE_NAMES))
    f_a, f_b = (int(k) for k in np.argsort(used)[-2:])  # two features the forest splits on
    assert used[f_a] and used[f_b]
    new = cf.shift_thresholds({f_a: 0.25, f_b: -1.5})
    on_a = internal & (cf.feature == f_a)
    on_b = internal & (cf.feature == f_b)
    assert on_a.any() or on_b.any()
    np.testing.assert_allclose(new.threshold[on_a], cf.threshold[on_a] + 0.25)
    np.testing.assert_allclose(new.threshold[on_b], cf.threshold[on_b] - 1.5)
    untouched = ~(on_a | on_b)
    np.testing.assert_array_equal(new.threshold[untouched], cf.threshold[untouched])
    # structure and leaves unchanged, original untouched
    for k in ("feature", "left", "right", "leaf_value", "roots"):
        np.testing.assert_array_equal(getattr(new, k), getattr(cf, k))
    assert new.threshold is not cf.threshold


def test_shift_multiplicative_and_bad_input(fitted):
    cf = fitted.forest_
    f = int(np.argmax(cf.split_counts()))
    new = cf.shift_thresholds({f: 2.0}, multiplicative=True)
    m = (cf.left != -1) & (cf.feature == f)
    np.testing.assert_allclose(new.threshold[m], 2 * cf.threshold[m])
    with pytest.raises(ConfigError):
        cf.shift_thresholds({cf.n_features + 3: 1.0})
    with pytest.raises(ConfigError):
        cf.shift_thresholds({0: float("nan")})


def test_shifting_a_feature_equals_shifting_the_data(fitted, data):
    """Moving thresholds on feature f by s == moving the data of f by -s."""
    X, _ = data
    f = F("iter_ms")
    shifted = fitted.forest_.shift_thresholds({fitted.feature_names_.index("iter_ms"): 10.0})
    X2 = X.astype(np.float64).copy()
    # choose data shift representable exactly: compare on rows whose decision is not within rounding
    X2[:, f] = X2[:, f] + 10.0
    p1 = shifted.predict_proba(X2.astype(np.float32))
    p0 = fitted.forest_.predict_proba(X)
    assert np.mean(np.isclose(p1, p0)) > 0.99


# ------------------------------------------------------------------------ detector
def test_detector_detects_slow_ops_on_unseen_rank(fitted):
    t = synth_rank(seed=777, slow=[(3, 2), (17, 9), (25, 5)], factor=3.0)
    flags = fitted.predict_ops(t)
    y = t.column("abnormal").to_numpy()
    assert flags[y].all()
    assert flags.sum() <= y.sum() + 2
    p = fitted.predict_proba_ops(t)
    assert p.shape == (t.num_rows,) and p.dtype == np.float64 and ((p >= 0) & (p <= 1)).all()


def test_detector_threshold_and_not_fitted(fitted):
    t = synth_rank(n_iter=5, n_ops=4)
    with pytest.raises(NotFittedError):
        OperatorDetector().predict_proba_ops(t)
    assert fitted.predict_ops(t.slice(0, 0)).shape == (0,)


def test_detector_feature_subset(data):
    X, y = data
    det = OperatorDetector(n_estimators=5, max_depth=5, features=["ratio_min", "dur_ms"], random_state=0).fit(X, y)
    assert det.forest_.n_features == 2 and det.feature_names_ == ["ratio_min", "dur_ms"]
    assert det.predict(X).shape == (len(X),)
    with pytest.raises(ConfigError):
        OperatorDetector(features=["nope"]).fit(X, y)


def test_detector_bad_fit_input():
    with pytest.raises(ConfigError):
        OperatorDetector().fit(np.zeros((3, 2)), [0, 1, 0])
    with pytest.raises(ConfigError):
        OperatorDetector(criterion="mse").fit(np.zeros((3, len(FEATURE_NAMES))), [0, 1, 0])


def test_save_load_roundtrip(fitted, data, tmp_path):
    X, _ = data
    path = fitted.save(tmp_path / "m")
    assert path.name == "m.json" and (tmp_path / "m.npz").is_file()
    doc = json.loads(path.read_text())
    assert doc["format"] == "holmes.detector/1" and doc["n_trees"] == 12
    det = OperatorDetector.load(tmp_path / "m")
    np.testing.assert_array_equal(det.predict_proba_features(X), fitted.predict_proba_features(X))
    assert det.threshold == fitted.threshold and det.reference_ == fitted.reference_
    with np.load(tmp_path / "m.npz", allow_pickle=False) as z:
        assert all(z[k].dtype != object for k in z.files)


def _corrupt_cases(tmp_path, fitted):
    base = fitted.save(tmp_path / "good")
    good_npz = (tmp_path / "good.npz").read_bytes()
    doc = json.loads(base.read_text())
    cases = {}

    def write(name, js=None, npz=None):
        (tmp_path / f"{name}.json").write_text(js if js is not None else json.dumps(dict(doc, arrays=f"{name}.npz")))
        (tmp_path / f"{name}.npz").write_bytes(npz if npz is not None else good_npz)
        cases[name] = tmp_path / name

    write("trunc_npz", npz=good_npz[: len(good_npz) // 2])
    write("garbage_json", js="{not json")
    write("wrong_format", js=json.dumps(dict(doc, format="sklearn-pickle", arrays="wrong_format.npz")))
    d = dict(doc, arrays="nosum.npz")
    d.pop("arrays_sha256")
    # structurally broken arrays, with no checksum to catch them first
    with np.load(tmp_path / "good.npz") as z:
        arrs = {k: z[k] for k in z.files}
    import io
    for name, mut in {"cycle": lambda a: a["left"].__setitem__(0, 0),
                      "bad_feature": lambda a: a["feature"].__setitem__(0, 999),
                      "bad_leaf": lambda a: a["leaf_value"].__setitem__(np.flatnonzero(a["left"] == -1)[0], 7.0),
                      "missing": lambda a: a.pop("threshold")}.items():
        a = {k: v.copy() for k, v in arrs.items()}
        mut(a)
        buf = io.BytesIO()
        np.savez(buf, **a)
        write(name, js=json.dumps(dict(d, arrays=f"{name}.npz")), npz=buf.getvalue())
    obj = io.BytesIO()
    np.save(obj, np.array([{"evil": 1}], dtype=object), allow_pickle=True)
    import zipfile
    zb = io.BytesIO()
    with zipfile.ZipFile(zb, "w") as zf:
        for k, v in arrs.items():
            if k == "threshold":
                continue
            b = io.BytesIO()
            np.save(b, v)
            zf.writestr(f"{k}.npy", b.getvalue())
        zf.writestr("threshold.npy", obj.getvalue())
    write("pickled", js=json.dumps(dict(d, arrays="pickled.npz")), npz=zb.getvalue())
    write("sum_mismatch", npz=good_npz[:-3] + b"xyz")
    return cases


def test_corrupted_model_files_raise_model_format_error(fitted, tmp_path):
    cases = _corrupt_cases(tmp_path, fitted)
    assert len(cases) == 9
    for name, p in cases.items():
        with pytest.raises(ModelFormatError, match=name):
            OperatorDetector.load(p)
    with pytest.raises(ModelFormatError, match="not found"):
        OperatorDetector.load(tmp_path / "absent")


# ------------------------------------------------------------------------ drift
def test_drift_monitor_mean_and_quantiles():
    ref = {"iter_ms": 100.0, "dur_ms": 1.0}
    m = DriftMonitor(ref, FEATURE_NAMES)
    X = np.zeros((4, len(FEATURE_NAMES)))
    X[:, F("iter_ms")] = 100.5
    X[:, F("dur_ms")] = 1.2
    m.update(X)
    assert m.drift_detected
    assert m.shifts() == pytest.approx({"dur_ms": 0.2})         # iter_ms moved 0.5% < 1%
    assert m.shifts(mode="multiplicative") == pytest.approx({"dur_ms": 1.2})
    q = DriftMonitor(ref, FEATURE_NAMES, stat="p99").update(X)
    assert q.current()[1] == pytest.approx(1.2)
    with pytest.raises(ConfigError):
        DriftMonitor(ref, FEATURE_NAMES, stat="p42")
    with pytest.raises(ConfigError):
        DriftMonitor({"nope": 1.0}, FEATURE_NAMES)


def test_retune_restores_accuracy_under_drift():
    """A model relying on raw features loses recall under drift; retuning recovers it, no retraining."""
    X, y = synth_dataset(6, 1)
    raw = ["dur_ms", "iter_ms", "q2_ms", "win_mean_ms", "gap_ms"]
    det = OperatorDetector(n_estimators=10, max_depth=8, features=raw, random_state=0).fit(X, y)
    Xd = X.copy()
    Xd[:, F("iter_ms")] += 40.0   # the whole job slowed by 40 ms per iteration
    new = det.retune(Xd)
    assert new is not det and det.retune_history_ == [] and len(new.retune_history_) == 1
    rec = new.retune_history_[0]
    assert set(rec.shifts) == {"iter_ms"} and rec.shifts["iter_ms"] == pytest.approx(40.0, rel=1e-3)
    assert rec.nodes_moved == int(det.forest_.split_counts()[raw.index("iter_ms")])
    acc_old = (det.predict(Xd) == y).mean()
    acc_new = (new.predict(Xd) == y).mean()
    acc_ref = (det.predict(X) == y).mean()
    assert acc_new == pytest.approx(acc_ref, abs=2e-3) and acc_new >= acc_old
    # the reference moved: the same drift again detects nothing more
    again = new.retune(Xd)
    assert again.retune_history_[-1].shifts == {}


def test_auto_tuner_periodic_and_records():
    X, y = synth_dataset(4, 2)
    det = OperatorDetector(n_estimators=6, max_depth=6, random_state=0).fit(X, y)
    tuner = AutoTuner(det, period=1, baseline="model")
    for k in range(4):
        t = synth_rank(seed=50 + k, drift=0.05, n_iter=30)
        s = tuner.update(t)
        assert s.shape == (t.num_rows,)
    assert tuner.n_updates == 4 and len(tuner.history) >= 1
    assert all(set(r.shifts) <= set(DRIFT_FEATURES) for r in tuner.history)
    assert tuner.detector is not det and det.retune_history_ == []
    with pytest.raises(ConfigError):
        AutoTuner(det, period=0)


# ------------------------------------------------------------------------ baselines
def test_three_sigma_flags_outlier_per_position():
    t = synth_rank(n_iter=40, seed=3, slow=[(20, 4)], factor=5.0)
    flags = ThreeSigmaDetector().fit().predict_ops(t)
    y = t.column("abnormal").to_numpy()
    assert flags[y].all() and flags.sum() <= 3


@pytest.mark.parametrize("kind", ["knn", "knn_pca", "svm"])
def test_feature_baselines(kind, data):
    X, y = data
    b = FeatureBaseline(kind=kind, max_train_rows=1500, random_state=0).fit(X, y)
    t = synth_rank(seed=999, slow=[(8, 8), (9, 2)], factor=4.0)
    f = b.predict_ops(t)
    assert f.shape == (t.num_rows,) and f[t.column("abnormal").to_numpy()].mean() >= 0.5
    with pytest.raises(ConfigError):
        FeatureBaseline(kind="tree").fit(X, y)


def test_auto_tuner_first_period_is_the_baseline():
    X, y = synth_dataset(3, 4)
    det = OperatorDetector(n_estimators=4, max_depth=5, random_state=0).fit(X, y)
    tuner = AutoTuner(det, period=1, baseline="first")
    tuner.update(synth_rank(seed=1, n_iter=20))           # week 0: sets the baseline, no retune
    assert tuner.history == [] and tuner.detector is det
    tuner.update(synth_rank(seed=1, n_iter=20))           # same level: nothing to do
    assert tuner.history == []
    tuner.update(synth_rank(seed=1, n_iter=20, drift=0.02))   # compute drifted: gap/iteration time rise
    assert len(tuner.history) == 1 and "iter_ms" in tuner.history[0].shifts
    assert tuner.history[0].shifts["iter_ms"] > 0


def test_random_scenario_is_deterministic_and_kinds_focus_the_faults():
    from holmes.simulate.scenarios import random_scenario

    assert random_scenario(17) == random_scenario(17)
    fabric = [random_scenario(s, kinds={"link": 1, "switch": 1}, p_fault_free=0.0) for s in range(40)]
    devs = [f.split("@")[0] for s in fabric for f in s["faults"]]
    assert len(devs) >= 40 and all(d.startswith(("link:", "switch:")) for d in devs)
    assert any(d.startswith("link:") for d in devs) and any(d.startswith("switch:") for d in devs)
    for bad in ({}, {"disk": 1}, {"gpu": -1}, {"gpu": 0, "nic": 0}):
        with pytest.raises(ConfigError, match="kinds"):
            random_scenario(1, kinds=bad)


def test_f1_and_best_threshold_on_validation_scores():
    from holmes.detect.training import THRESHOLD_GRID, best_threshold, f1_precision_recall

    y = np.array([True, True, False, False, True])
    assert f1_precision_recall(y, np.array([True, False, True, False, True])) == pytest.approx((2 / 3, 2 / 3, 2 / 3))
    assert f1_precision_recall(np.zeros(3, bool), np.zeros(3, bool)) == (0.0, 0.0, 0.0)
    proba = np.array([0.8, 0.4, 0.35, 0.1, 0.6])
    t = best_threshold(y, proba)  # 0.375 .. 0.4 separate the classes; the lowest such grid point wins
    assert t == 0.375 and t in THRESHOLD_GRID
    assert f1_precision_recall(y, proba >= t)[0] == 1.0
    assert best_threshold(y, proba, grid=[0.5, 0.9]) == 0.5


def test_operator_detector_passes_the_scikit_learn_checks_that_apply():
    """check_estimator over OperatorDetector: every check passes except those that fit on small
    random matrices, which the detector refuses because it needs the 57 operator features."""
    import warnings

    from sklearn.utils.estimator_checks import check_estimator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = check_estimator(OperatorDetector(n_estimators=4), on_fail=None)
    failed = {r["check_name"]: str(r["exception"]) for r in results if r["status"] == "failed"}
    passed = [r["check_name"] for r in results if r["status"] == "passed"]
    width = "needs the operator feature matrix"
    other = {k: v for k, v in failed.items()
             if f"expected {len(FEATURE_NAMES)}" not in v and k != "check_positive_only_tag_during_fit"}
    assert other == {}, f"checks failing for another reason than the fixed feature width ({width}): {other}"
    for name in ("check_parameters_default_constructible", "check_no_attributes_set_in_init",
                 "check_get_params_invariance", "check_set_params", "check_estimators_unfitted",
                 "check_classifiers_one_label", "check_all_zero_sample_weights_error"):
        assert name in passed, name


def test_operator_detector_validates_params_and_labels():
    X = np.zeros((10, len(FEATURE_NAMES)), np.float32)
    with pytest.raises(ConfigError, match="n_estimators"):
        OperatorDetector(n_estimators=0).fit(X, np.arange(10) % 2 == 0)
    with pytest.raises(ConfigError, match="one class"):
        OperatorDetector(n_estimators=2).fit(X, np.zeros(10, bool))
    with pytest.raises(NotFittedError) as info:
        OperatorDetector().predict(X)
    from sklearn.exceptions import NotFittedError as SkNotFitted

    assert isinstance(info.value, SkNotFitted) and isinstance(info.value, ValueError)
