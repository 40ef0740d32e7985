"""Detection latency: one rank log of 10,000 operators, features + forest, vs scikit-learn.

* ``detect_ms``: ``OperatorDetector.predict_proba_ops`` end to end (features + compiled forest) with
  the shipped default model (or, with ``--no-default``, the forest trained here).
* ``sklearn_ratio``: scikit-learn ``RandomForestClassifier.predict_proba`` time (its default
  ``n_jobs=None``: one thread) / compiled-forest time (``CompiledForest.predict_proba``, calling
  thread + helper threads, ``numba.config.NUMBA_NUM_THREADS`` in all), on the same feature matrix
  and the same forest (64 trees, max depth 14, trained here on a simulated job), in the same run;
  ``sklearn_ratio_1thread`` uses the compiled forest on the calling thread only.
  The compiled output is checked to equal scikit-learn's before timing.

Timed calls are interleaved round-robin (one call of each, repeated ``--reps`` times after a
warm-up), so that load from other processes hits every variant alike; medians are reported.

Usage: ``python benchmarks/detect_latency.py [--ops 10000] [--reps 30]``
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import numba
import numpy as np

from holmes.detect import CompiledForest, OperatorDetector, load_default_detector, operator_features
from holmes.detect.training import job_dataset
from holmes.errors import ModelFormatError


def median_ms(fns: dict, reps: int) -> dict:
    """Median wall time (ms) of each callable, the callables interleaved round-robin."""
    for fn in fns.values():
        fn()
    ts: dict = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            ts[k].append((time.perf_counter() - t) * 1e3)
    return {k: statistics.median(v) for k, v in ts.items()}


def rank_log(n_ops: int, d: str):
    """One rank of a simulated 3D job (written under ``d``), trimmed/extended to about ``n_ops`` ops."""
    from holmes.io import read_job
    from holmes.simulate import simulate

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
    ap.add_argument("--smoke", action="store_true",
                    help="CI: 1,000 ops, 3 repetitions, a bench forest of 8 trees (seconds; the same code path)")
    args = ap.parse_args()
    args.trees = 64
    if args.smoke:
        args.ops, args.reps, args.trees = 1_000, 3, 8
    with tempfile.TemporaryDirectory(prefix="holmes-bench-") as d:
        run(args, d)


def run(args: argparse.Namespace, d: str) -> None:
    job, ops = rank_log(args.ops, d)
    X, y = job_dataset(job, max_ranks=16, seed=0)
    det_bench = OperatorDetector(n_estimators=args.trees, max_depth=14, min_samples_leaf=8, random_state=0).fit(X, y)
    rf = det_bench.estimator_
    try:
        det = det_bench if args.no_default else load_default_detector()
        which = "default" if not args.no_default else "bench"
    except ModelFormatError:
        det, which = det_bench, "bench"

    F = operator_features(ops)
    cf: CompiledForest = det_bench.forest_
    assert np.array_equal(cf.predict_proba(F), rf.predict_proba(F)[:, 1])
    assert np.array_equal(cf.predict_proba(F, parallel=False), rf.predict_proba(F)[:, 1])
    Fd = det._select(F)
    dcf = det.forest_

    t = median_ms({"feat": lambda: operator_features(ops),
                   "comp": lambda: cf.predict_proba(F),
                   "comp1": lambda: cf.predict_proba(F, parallel=False),
                   "sk": lambda: rf.predict_proba(F),
                   "dcomp": lambda: dcf.predict_proba(Fd),
                   "dcomp1": lambda: dcf.predict_proba(Fd, parallel=False),
                   "detect": lambda: det.predict_proba_ops(ops)}, args.reps)
    threads = numba.config.NUMBA_NUM_THREADS
    rows = [("features (numba)", t["feat"]),
            (f"forest compiled, {threads} threads", t["comp"]),
            ("forest compiled, 1 thread", t["comp1"]),
            ("forest scikit-learn predict_proba", t["sk"]),
            (f"{which} model forest ({dcf.n_trees} trees, {dcf.n_nodes} nodes) compiled, {threads} threads",
             t["dcomp"]),
            (f"{which} model forest compiled, 1 thread", t["dcomp1"]),
            (f"detect end-to-end ({which} model, {dcf.n_trees} trees)", t["detect"]),
            ("features + scikit-learn forest", t["feat"] + t["sk"])]
    print(f"rank log: {ops.num_rows} ops; bench forest: {cf.n_trees} trees, {cf.n_nodes} nodes; "
          f"medians of {args.reps} interleaved runs")
    print(f"{'stage':72s} {'ms':>9s}")
    for name, ms in rows:
        print(f"{name:72s} {ms:9.2f}")
    print(f"detect_ms_median={t['detect']:.2f} sklearn_ratio={t['sk'] / t['comp']:.1f} "
          f"sklearn_ratio_1thread={t['sk'] / t['comp1']:.1f} features_ms={t['feat']:.2f} forest_ms={t['comp']:.2f} "
          f"sklearn_ms={t['sk']:.2f} n_ops={ops.num_rows}")


if __name__ == "__main__":
    main()
