"""Detection latency: one rank log of 10,000 operators, features + forest, vs scikit-learn.

* ``detect_ms``: ``OperatorDetector.predict_proba_ops`` end to end (features + compiled forest) with
  the shipped default model (or, with ``--no-default``, the forest trained here).
* ``sklearn_ratio``: scikit-learn ``RandomForestClassifier.predict_proba`` time / compiled-kernel
  time, on the same feature matrix and the same forest (64 trees, depth 14, trained here on a
  simulated job), in the same run. Medians over ``--reps`` runs after a warm-up.

Usage: ``python benchmarks/detect_latency.py [--ops 10000] [--reps 30]``
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import numpy as np

from holmes.detect import CompiledForest, OperatorDetector, load_default_detector, operator_features
from holmes.detect.training import job_dataset
from holmes.errors import ModelFormatError


def median_ms(fn, reps: int) -> float:
    fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ts)


def rank_log(n_ops: int):
    """One rank of a simulated 3D job, trimmed/extended to about ``n_ops`` ops."""
    from holmes.io import read_job
    from holmes.simulate import simulate

    d = tempfile.mkdtemp(prefix="holmes-bench-")
    per_iter_guess = 40
    p = simulate(d + "/job", tp=4, pp=4, dp=4, micro_batches=8, iterations=max(3, n_ops // per_iter_guess + 2),
                 seed=7, faults=["gpu:9@fluctuation*2.0", "nic:20@spike*3"])
    job = read_job(p)
    ops = job.ops(4)
    its = ops.column("iteration").to_numpy()
    per_iter = ops.num_rows / (its.max() + 1)
    if ops.num_rows < n_ops:  # re-simulate with enough iterations
        p = simulate(d + "/job", tp=4, pp=4, dp=4, micro_batches=8, iterations=int(n_ops / per_iter) + 2,
                     seed=7, faults=["gpu:9@fluctuation*2.0", "nic:20@spike*3"], overwrite=True)
        job = read_job(p)
        ops = job.ops(4)
    return job, ops.slice(0, n_ops)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=10_000)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--no-default", action="store_true", help="time the forest trained here instead of the default")
    args = ap.parse_args()

    job, ops = rank_log(args.ops)
    X, y = job_dataset(job, max_ranks=16, seed=0)
    det_bench = OperatorDetector(n_estimators=64, max_depth=14, min_samples_leaf=8, random_state=0).fit(X, y)
    rf = det_bench.estimator_
    try:
        det = det_bench if args.no_default else load_default_detector()
        which = "default" if not args.no_default else "bench"
    except ModelFormatError:
        det, which = det_bench, "bench"

    F = operator_features(ops)
    cf: CompiledForest = det_bench.forest_
    assert np.array_equal(cf.predict_proba(F), rf.predict_proba(F)[:, 1])

    t_feat = median_ms(lambda: operator_features(ops), args.reps)
    t_comp = median_ms(lambda: cf.predict_proba(F), args.reps)
    t_comp1 = median_ms(lambda: cf.predict_proba(F, parallel=False), args.reps)
    t_sk = median_ms(lambda: rf.predict_proba(F), max(5, args.reps // 3))
    t_detect = median_ms(lambda: det.predict_proba_ops(ops), args.reps)
    t_detect_sk = t_feat + t_sk

    rows = [("features (numba)", t_feat), ("forest compiled, 2 threads", t_comp),
            ("forest compiled, 1 thread", t_comp1), ("forest scikit-learn predict_proba", t_sk),
            (f"detect end-to-end ({which} model, {det.forest_.n_trees} trees)", t_detect),
            ("features + scikit-learn forest", t_detect_sk)]
    print(f"rank log: {ops.num_rows} ops; bench forest: {cf.n_trees} trees, {cf.n_nodes} nodes; medians of {args.reps}")
    print(f"{'stage':58s} {'ms':>9s}")
    for name, ms in rows:
        print(f"{name:58s} {ms:9.2f}")
    print(f"detect_ms_median={t_detect:.2f} sklearn_ratio={t_sk / t_comp:.1f} sklearn_ratio_1thread={t_sk / t_comp1:.1f} "
          f"features_ms={t_feat:.2f} forest_ms={t_comp:.2f} sklearn_ms={t_sk:.2f} n_ops={ops.num_rows}")


if __name__ == "__main__":
    main()
