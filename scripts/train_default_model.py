"""Train the default detector shipped in holmes/detect/models/ from simulated jobs.

Deterministic: the jobs are :func:`holmes.simulate.scenarios.random_scenario` scenarios (2D-6D
hybrid-parallel shapes, 32-512 GPUs, 0-2 faults of every device kind and pattern, some with
compute drift) with seeds

* training:   1000 .. 1000 + N_TRAIN - 1   (default 1000..1279), plus N_BIG scenarios of 256-512
  GPUs with seeds 2000 .. 2000 + N_BIG - 1 (default 40; cached under ``--jobs-dir``/big), where
  weak fabric faults are hardest to see
* validation: 5000 .. 5000 + N_VAL - 1     (threshold choice; default 5000..5071: with 24 jobs the
  chosen threshold moved by 0.1 from one set of 24 to the next)
* held-out:   9000 .. 9000 + N_TEST - 1    (reported only; never used to fit or tune)

Training rows carry the cross-rank context features of their whole job for 3/4 of the sampled
ranks and of the rank alone for the rest (``jobs_dataset(context="mixed")``), so the model serves
``holmes detect`` (job context) and a lone rank table alike. Validation and the held-out F1 use
the job context, as ``holmes detect`` does; the held-out F1 of ranks alone is printed too.

Held-out jobs differ in seed and, with overwhelming probability, in shape and faults. Jobs are
cached under ``--jobs-dir`` (re-used when present). Usage::

    python scripts/train_default_model.py [--jobs-dir /tmp/holmes-train-jobs] [--out holmes/detect/models/default]

Prints the validation threshold and the held-out F1/precision/recall, and writes the model.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from holmes.detect import OperatorDetector
from holmes.detect.training import best_threshold, f1_precision_recall as f1_parts, jobs_dataset
from holmes.simulate.scenarios import simulate_scenarios

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs-dir", default="/tmp/holmes-train-jobs")
    ap.add_argument("--out", default=str(REPO / "holmes" / "detect" / "models" / "default"))
    ap.add_argument("--n-train", type=int, default=280)
    ap.add_argument("--n-big", type=int, default=40, help="extra training jobs of 256-512 GPUs")
    ap.add_argument("--n-val", type=int, default=72)
    ap.add_argument("--n-test", type=int, default=12)
    ap.add_argument("--max-ranks", type=int, default=16, help="ranks sampled per training job")
    ap.add_argument("--n-estimators", type=int, default=64)
    ap.add_argument("--max-depth", type=int, default=16)
    ap.add_argument("--min-samples-leaf", type=int, default=4)
    ap.add_argument("--max-samples", type=int, default=400_000, help="bootstrap rows per tree")
    ap.add_argument("--criterion", default="entropy")
    args = ap.parse_args(argv)

    root = Path(args.jobs_dir)
    t0 = time.time()
    train = simulate_scenarios(root, range(1000, 1000 + args.n_train))
    train += simulate_scenarios(root / "big", range(2000, 2000 + args.n_big), min_gpus=256)
    val = simulate_scenarios(root, range(5000, 5000 + args.n_val))
    test = simulate_scenarios(root, range(9000, 9000 + args.n_test))
    print(f"simulated/reused {len(train) + len(val) + len(test)} jobs in {time.time() - t0:.0f} s", flush=True)

    t0 = time.time()
    X, y, _ = jobs_dataset(train, max_ranks=args.max_ranks, seed=1)
    Xv, yv, _ = jobs_dataset(val, max_ranks=16, seed=2, context="job")
    print(f"features: train {X.shape} ({y.mean():.4f} abnormal), val {Xv.shape} in {time.time() - t0:.0f} s", flush=True)

    t0 = time.time()
    det = OperatorDetector(n_estimators=args.n_estimators, criterion=args.criterion, max_depth=args.max_depth,
                           min_samples_leaf=args.min_samples_leaf, max_samples=args.max_samples,
                           random_state=0, n_jobs=2).fit(X, y)
    print(f"fit in {time.time() - t0:.0f} s", flush=True)
    pv = det.predict_proba_features(Xv)
    det.threshold = best_threshold(yv, pv)
    print(f"validation: threshold {det.threshold}, F1/P/R {f1_parts(yv, pv >= det.threshold)}", flush=True)
    det.train_info_.update({"script": "scripts/train_default_model.py", "train_seeds": [1000, 1000 + args.n_train],
                            "train_seeds_256_512_gpus": [2000, 2000 + args.n_big],
                            "val_seeds": [5000, 5000 + args.n_val], "max_ranks": args.max_ranks})

    Xt, yt, _ = jobs_dataset(test, max_ranks=16, seed=3, context="job")
    f1, p, r = f1_parts(yt, det.predict(Xt))
    det.train_info_["heldout"] = {"seeds": [9000, 9000 + args.n_test], "f1": f1, "precision": p, "recall": r,
                                  "rows": int(len(yt)), "abnormal": int(yt.sum()), "context": "job"}
    Xa, ya, _ = jobs_dataset(test, max_ranks=16, seed=3, context="rank")
    fa, pa_, ra = f1_parts(ya, det.predict(Xa))
    det.train_info_["heldout_rank_alone"] = {"f1": fa, "precision": pa_, "recall": ra}
    print(f"held-out, each rank alone (no job context): F1 {fa:.4f} precision {pa_:.4f} recall {ra:.4f}")
    out = det.save(args.out)
    size = sum(p.stat().st_size for p in out.parent.glob(Path(args.out).name + ".*"))
    print(f"held-out F1 {f1:.4f} precision {p:.4f} recall {r:.4f}; wrote {out} ({size / 1e6:.2f} MB)")
    print(json.dumps(det.train_info_))
    return 0


if __name__ == "__main__":
    sys.exit(main())
