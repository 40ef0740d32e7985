"""``holmes detect`` with the shipped model on every rank of held-out simulated jobs: F1 against the labels.

The jobs are :func:`holmes.detect.training.random_scenario` scenarios with seeds 9000.. (never used
to train or tune the default model: training 1000..1139, validation 5000..5011). Each job goes
through the real command, ``holmes detect JOB --out FILE`` (all ranks, the job's cross-rank
context), and the ``flagged`` column of its output is scored against the ``abnormal`` labels.
Prints one line per job and a last ``key=value`` line with the pooled figures (every op of every
job counts once).

Usage: ``python benchmarks/detect_heldout.py [--jobs-dir /tmp/holmes-train-jobs] [--n-test 24] [--model M.json]``
"""

from __future__ import annotations

import argparse
import contextlib
import io
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from holmes.cli.main import main as holmes_main
from holmes.detect.training import simulate_scenarios


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs-dir", default="/tmp/holmes-train-jobs")
    ap.add_argument("--first-seed", type=int, default=9000)
    ap.add_argument("--n-test", type=int, default=24)
    ap.add_argument("--model", help="detector model (NAME.json); default: the shipped model")
    ap.add_argument("--threshold", type=float, help="flag threshold; default: the model's")
    args = ap.parse_args()
    seeds = range(args.first_seed, args.first_seed + args.n_test)
    jobs = simulate_scenarios(Path(args.jobs_dir), seeds)
    tp_all = y_all = f_all = 0
    f1_jobs = []
    print(f"{'seed':>5s} {'ops':>9s} {'abnormal':>9s} {'flagged':>8s} {'F1':>6s} {'s':>6s}")
    with tempfile.TemporaryDirectory(prefix="holmes-heldout-") as tmp:
        for s, job in zip(seeds, jobs):
            out = Path(tmp) / f"{s}.parquet"
            t0 = time.perf_counter()
            with contextlib.redirect_stderr(io.StringIO()):
                rc = holmes_main(["detect", str(job), "--out", str(out)]
                                 + (["--model", args.model] if args.model else [])
                                 + (["--threshold", str(args.threshold)] if args.threshold is not None else []))
            dt = time.perf_counter() - t0
            if rc != 0:
                raise SystemExit(f"holmes detect failed on {job} (exit {rc})")
            t = pq.read_table(out, columns=["abnormal", "flagged"])
            y = t.column("abnormal").to_numpy(zero_copy_only=False)
            f = t.column("flagged").to_numpy(zero_copy_only=False)
            tp = int(np.sum(y & f))
            tp_all, y_all, f_all = tp_all + tp, y_all + int(y.sum()), f_all + int(f.sum())
            f1 = 2 * tp / (y.sum() + f.sum()) if y.sum() else float("nan")
            if y.sum():
                f1_jobs.append(f1)
            print(f"{s:5d} {t.num_rows:9d} {int(y.sum()):9d} {int(f.sum()):8d} {f1:6.3f} {dt:6.1f}")
    p = tp_all / max(f_all, 1)
    r = tp_all / max(y_all, 1)
    f1 = 2 * p * r / (p + r) if p + r else 0.0
    print(f"f1_detect_cli={f1:.3f} precision={p:.3f} recall={r:.3f} f1_median_job={np.median(f1_jobs):.3f} "
          f"jobs={len(jobs)} faulty_jobs={len(f1_jobs)} abnormal_ops={y_all}")


if __name__ == "__main__":
    main()
