"""Detection accuracy on held-out simulated jobs (paper Fig. 14a/21) and under a drifted month (Fig. 14b).

Part 1: F1 / precision / recall of the shipped RF, RF (Gini, entropy) trained here, 3-sigma, KNN,
KNN+PCA and SVM, per scale bucket, on held-out jobs (seeds 9000.. of
:func:`holmes.simulate.scenarios.random_scenario`, never used by the default model's training).
The bench-trained models all use the same training set (seeds 1000..1000+N_TRAIN-1); the two
forests' thresholds are chosen on validation jobs (seeds 5000..5000+N_VAL-1). Every model
but 3-sigma sees the cross-rank features of a :class:`holmes.detect.JobContext` built from every
rank of the held-out job, as ``holmes detect`` does; ``rf_default_alone`` is the shipped model
judging each rank on its own log (a lone rank table, no job context).

Part 2: a "month": one long job with compute drift (``--drift`` per iteration) and transient
faults (spike, fluctuation), split into 5 weeks; each week is scored with the detector seeing that
week plus the ``DEFAULT_WINDOW`` iterations before it, as a deployed detector sees the recent log.
The same forest scores every week untuned (naive) and with weekly auto-tuning
(:class:`holmes.detect.AutoTuner`, mean statistic, baseline = week 0). Done for the shipped
model and for a model on the paper's raw features only (durations, iteration time, quartiles),
where drift matters most.

Usage: ``python benchmarks/detect_accuracy.py [--jobs-dir D] [--n-train 30] [--n-test 24] [--n-val 12]``
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from holmes.detect import AutoTuner, JobContext, OperatorDetector, load_default_detector, operator_features
from holmes.eval.detect_baselines import FeatureBaseline, ThreeSigmaDetector
from holmes.detect.features import DEFAULT_WINDOW
from holmes.detect.training import best_threshold, f1_precision_recall as prf, jobs_dataset, labels
from holmes.simulate.scenarios import simulate_scenarios
from holmes.io import read_job

PAPER_FEATURES = ["dur_ms", "iter_ms", "win_mean_ms", "win_std_ms", "q1_ms", "q2_ms", "q3_ms", "iqr_ms",
                  "win_avg_op_ms", "zscore", "log2_nbytes", "op_code", "is_p2p"]


def bucket(world: int) -> str:
    return "32-64" if world <= 64 else ("65-256" if world <= 256 else "257-512")


def eval_jobs(paths, max_ranks=16, seed=3):
    """Per job: (world, list of (ops, iteration_times, y)) for sampled ranks."""
    from holmes.detect.training import job_dataset  # noqa: F401

    out = []
    for k, p in enumerate(paths):
        j = read_job(p)
        rng = np.random.default_rng(seed + k)
        from holmes.detect.training import label_counts

        cnt = label_counts(j)
        rs = j.available_ranks()
        pos = [r for r in rs if cnt[r] > 0]
        pick = set(rng.choice(pos, size=min(len(pos), max_ranks // 2), replace=False).tolist()) if pos else set()
        rest = [r for r in rs if r not in pick]
        pick |= set(rng.choice(rest, size=min(len(rest), max_ranks - len(pick)), replace=False).tolist())
        ranks = []
        ctx = JobContext.from_job(j)  # as `holmes detect` does: evidence from every rank of the job
        for r in sorted(pick):
            ops = j.ops(r)
            ranks.append((ops, j.iteration_times(r), labels(ops), ctx))
        out.append((j.world_size, ranks))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs-dir", default="/tmp/holmes-train-jobs")
    ap.add_argument("--n-train", type=int, default=30)
    ap.add_argument("--n-test", type=int, default=24,
                    help="held-out jobs (with 12, one 512-GPU job holds over a quarter of the positives)")
    ap.add_argument("--n-val", type=int, default=12, help="validation jobs choosing the thresholds of the forests trained here")
    ap.add_argument("--drift", type=float, default=4e-4, help="per-iteration compute drift of the month job")
    ap.add_argument("--smoke", action="store_true",
                    help="CI: 2 jobs per set of at most 64 GPUs and 10-12 iterations, 4 trees, a 5 x 8-iteration"
                         " month, a fresh temporary directory")
    args = ap.parse_args()
    scenario_kw: dict = {}
    trees, week_len = 32, 40
    if args.smoke:  # small scenarios in a fresh directory (the cached jobs stay as they are)
        from _cache import smoke_dir

        args.jobs_dir, args.n_train, args.n_test, args.n_val = str(smoke_dir("detect_accuracy")), 2, 2, 2
        scenario_kw, trees, week_len = dict(max_gpus=64, iterations=(10, 12)), 4, 8
    root = Path(args.jobs_dir)
    t0 = time.time()
    train = simulate_scenarios(root, range(1000, 1000 + args.n_train), **scenario_kw)
    test = simulate_scenarios(root, range(9000, 9000 + args.n_test), **scenario_kw)
    X, y, _ = jobs_dataset(train, max_ranks=8, seed=1)
    models = {
        "rf_default": load_default_detector(),
        "rf_default_alone": load_default_detector(),
        "rf_gini": OperatorDetector(n_estimators=trees, criterion="gini", max_samples=100_000, min_samples_leaf=8,
                                    random_state=0, n_jobs=2).fit(X, y),
        "rf_entropy": OperatorDetector(n_estimators=trees, criterion="entropy", max_samples=100_000, min_samples_leaf=8,
                                       random_state=0, n_jobs=2).fit(X, y),
        "3sigma": ThreeSigmaDetector(),
        "knn": FeatureBaseline("knn", random_state=0).fit(X, y),
        "knn_pca": FeatureBaseline("knn_pca", random_state=0).fit(X, y),
        "svm": FeatureBaseline("svm", max_train_rows=10_000, random_state=0).fit(X, y),
    }
    # each forest trained here gets its own threshold, the F1-best on validation jobs (as the
    # default model's was chosen), not the default's: a smaller training set calibrates differently
    val = simulate_scenarios(root, range(5000, 5000 + args.n_val), **scenario_kw)
    Xv, yv, _ = jobs_dataset(val, max_ranks=8, seed=2, context="job")
    for name in ("rf_gini", "rf_entropy"):
        models[name].threshold = best_threshold(yv, models[name].predict_proba_features(Xv))
    print(f"# trained on {len(y)} rows of {len(train)} jobs; evaluating {len(test)} held-out jobs "
          f"({time.time() - t0:.0f} s); thresholds: default {models['rf_default'].threshold}, "
          f"gini {models['rf_gini'].threshold}, entropy {models['rf_entropy'].threshold} "
          f"(the last two chosen on {len(val)} validation jobs)")
    data = eval_jobs(test)
    res: dict[tuple[str, str], list] = {}
    for name, m in models.items():
        for world, ranks in data:
            for ops, itt, yy, ctx in ranks:
                if name == "rf_default_alone":  # each rank judged on its own log (no job context)
                    ctx = None
                if name in ("knn", "knn_pca", "svm"):
                    f = m.predict(operator_features(ops, iteration_times=itt, context=ctx))
                elif name == "3sigma":
                    f = m.predict_ops(ops, iteration_times=itt)
                else:
                    f = m.predict_ops(ops, iteration_times=itt, context=ctx)
                for b in (bucket(world), "all"):
                    r = res.setdefault((name, b), [[], []])
                    r[0].append(yy)
                    r[1].append(f)
    buckets = ["32-64", "65-256", "257-512", "all"]
    print(f"\n{'model':12s} " + " ".join(f"{b + ' F1/P/R':>22s}" for b in buckets))
    f1s = {}
    for name in models:
        cells = []
        for b in buckets:
            if (name, b) not in res:
                cells.append(f"{'-':>22s}")
                continue
            yy, ff = (np.concatenate(v) for v in res[(name, b)])
            f1, p, r = prf(yy, ff)
            if b == "all":
                f1s[name] = f1
            cells.append(f"{f1:6.3f}/{p:6.3f}/{r:6.3f}".rjust(22))
        print(f"{name:12s} " + " ".join(cells))

    # ---------------------------------------------------------------- drifted month
    from holmes.simulate import simulate

    month = root / f"month-{args.drift:g}-v2" if week_len == 40 else root / f"month-{args.drift:g}-w{week_len}"
    if not (month / "job.json").is_file():
        simulate(month, tp=4, pp=2, dp=8, micro_batches=4, iterations=5 * week_len, seed=4242, drift=args.drift,
                 faults=["gpu:13@fluctuation*1.8", "nic:40@spike*3.0", "switch:leaf-5@fluctuation*1.6"],
                 overwrite=True)
    j = read_job(month)
    ranks = list(range(0, j.world_size, 4))
    weeks = [(w * week_len, (w + 1) * week_len) for w in range(5)]
    paper = OperatorDetector(n_estimators=trees, features=PAPER_FEATURES, max_samples=100_000, min_samples_leaf=8,
                             random_state=0, n_jobs=2).fit(X, y)
    print(f"\n# drifted month: 64 GPUs, {5 * week_len} iterations = 5 weeks, drift {args.drift:g}/iteration "
          f"({100 * args.drift * 5 * week_len:.1f}% over the month), {len(ranks)} ranks scored per week")
    print(f"{'week':>4s} {'default naive':>14s} {'default tuned':>14s} {'paper naive':>12s} {'paper tuned':>12s}")
    tuners = {"default": AutoTuner(load_default_detector(), period=len(ranks)),
              "paper": AutoTuner(paper, period=len(ranks))}
    naive = {"default": load_default_detector(), "paper": paper}
    acc = {k: [[], []] for k in ("default naive", "default tuned", "paper naive", "paper tuned")}
    for w, (a, b) in enumerate(weeks):
        row = {}
        # the week plus the window of iterations before it, on every rank: a deployed detector sees
        # the recent log of the job, not a week cut out of it; the job context comes from all ranks
        week = {}
        for r in range(j.world_size):
            ops = j.ops(r)
            it = ops.column("iteration").to_numpy()
            sel = (it >= a - DEFAULT_WINDOW) & (it < b)
            week[r] = (ops.filter(sel), it[sel] >= a)
        wctx = JobContext.from_tables(t for t, _ in week.values())
        for kind in ("default", "paper"):
            yy, fn, ft = [], [], []
            for r in ranks:
                wk, mine = week[r]
                lab = labels(wk)[mine]
                fn.append(naive[kind].predict_ops(wk, context=wctx)[mine])
                tuner = tuners[kind]
                ft.append((tuner.update(wk, context=wctx) >= tuner.detector.threshold)[mine])
                yy.append(lab)
            yy, fn, ft = np.concatenate(yy), np.concatenate(fn), np.concatenate(ft)
            row[kind] = (prf(yy, fn)[0], prf(yy, ft)[0])
            if w > 0:  # week 0 is the baseline week
                for tag, f in (("naive", fn), ("tuned", ft)):
                    acc[f"{kind} {tag}"][0].append(yy)
                    acc[f"{kind} {tag}"][1].append(f)
        print(f"{w:4d} {row['default'][0]:14.3f} {row['default'][1]:14.3f} {row['paper'][0]:12.3f} {row['paper'][1]:12.3f}")
    month_f1 = {k: prf(np.concatenate(v[0]), np.concatenate(v[1]))[0] for k, v in acc.items()}
    print(f"weeks 1-4: " + ", ".join(f"{k} F1 {v:.3f}" for k, v in month_f1.items()))
    print(f"retunes: default {len(tuners['default'].history)}, paper {len(tuners['paper'].history)}")
    print(f"f1_rf={f1s['rf_default']:.3f} f1_rf_alone={f1s['rf_default_alone']:.3f} f1_rf_gini={f1s['rf_gini']:.3f} f1_rf_entropy={f1s['rf_entropy']:.3f} "
          f"f1_3sigma={f1s['3sigma']:.3f} f1_knn={f1s['knn']:.3f} f1_knn_pca={f1s['knn_pca']:.3f} "
          f"f1_svm={f1s['svm']:.3f} f1_drift_tuned={month_f1['default tuned']:.3f} "
          f"f1_drift_naive={month_f1['default naive']:.3f} f1_drift_paper_tuned={month_f1['paper tuned']:.3f} "
          f"f1_drift_paper_naive={month_f1['paper naive']:.3f}")


if __name__ == "__main__":
    main()
