"""Detector core: features, compiled forest == scikit-learn, model files, drift tuning, baselines."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.ensemble import RandomForestClassifier

from holmes.detect import (FEATURE_NAMES, AutoTuner, CompiledForest, DriftMonitor, FeatureBaseline,
                           OperatorDetector, ThreeSigmaDetector, operator_features)
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
    f_a, f_b = F("iter_ms"), F("dur_ms")
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
