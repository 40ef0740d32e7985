"""``holmes detect`` with the shipped model on every rank of held-out simulated jobs: F1 against the labels.

The jobs are :func:`holmes.simulate.scenarios.random_scenario` scenarios with seeds 9000.. (never used
to train or tune the default model: training 1000..1139, validation 5000..5011). Each job goes
through the real command, ``holmes detect JOB --out FILE`` (all ranks, the job's cross-rank
context), and the ``flagged`` column of its output is scored against the ``abnormal`` labels.
Prints one line per job and a last ``key=value`` line with the pooled figures (every op of every
job counts once).

``--by-stretch`` also simulates each faulty job's fault-free twin (same scenario and seed, so the
same noise: the counterfactual run the labels were computed against; checked row by row against the
labels) and prints the recall by how much the fault stretched the op (faulted / fault-free
duration). An op is labelled abnormal from a stretch of 1.1 on, well inside one position's
run-to-run noise, so this says which slowdowns are caught reliably.

Usage: ``python benchmarks/detect_heldout.py [--jobs-dir /tmp/holmes-train-jobs] [--n-test 24] [--model M.json]
[--threshold T] [--by-stretch]``
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
from holmes.simulate.scenarios import random_scenario, simulate_scenarios

STRETCH_BINS = (1.1, 1.2, 1.3, 1.5, 2.0, np.inf)


def durations(t) -> np.ndarray:
    return t.column("end_ns").to_numpy() - t.column("start_ns").to_numpy()


def stretch(job: Path, seed: int, twins: Path, table, scenario_kw: dict | None = None) -> np.ndarray:
    """Per row of ``table`` (holmes detect's output, ranks ascending), faulted / fault-free duration."""
    from holmes.io import read_job
    from holmes.simulate import simulate

    twin = twins / job.name
    if not (twin / "job.json").is_file():
        simulate(twin, overwrite=True, **{**random_scenario(seed, **(scenario_kw or {})), "faults": ()})
    tj = read_job(twin)
    cf = np.concatenate([durations(tj.ops(r)) for r in tj.available_ranks()])
    d = durations(table)
    y = table.column("abnormal").to_numpy(zero_copy_only=False)
    truth = read_job(job).truth  # the job's own label rule (holmes.simulate's abnormal_margin / _abs_us)
    margin, abs_ns = truth.abnormal_margin, 1e3 * truth.extra["abnormal_abs_us"]
    if cf.shape != d.shape or np.any(y != ((d > (1 + margin) * cf) & (d - cf > abs_ns))):
        raise SystemExit(f"{twin}: the fault-free twin does not reproduce the labels of {job}")
    return d / np.maximum(cf, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs-dir", default="/tmp/holmes-train-jobs")
    ap.add_argument("--first-seed", type=int, default=9000)
    ap.add_argument("--n-test", type=int, default=24)
    ap.add_argument("--model", help="detector model (NAME.json); default: the shipped model")
    ap.add_argument("--threshold", type=float, help="flag threshold; default: the model's")
    ap.add_argument("--by-stretch", action="store_true", help="recall by stretch (simulates fault-free twins)")
    ap.add_argument("--smoke", action="store_true",
                    help="CI: 2 held-out jobs of at most 64 GPUs and 10-12 iterations, --by-stretch, a fresh "
                         "temporary directory")
    args = ap.parse_args()
    scenario_kw: dict = {}
    if args.smoke:  # small scenarios in a fresh directory (the cached held-out jobs stay as they are)
        from _cache import smoke_dir

        args.jobs_dir, args.n_test, args.by_stretch = str(smoke_dir("detect_heldout")), 2, True
        scenario_kw = dict(max_gpus=64, iterations=(10, 12))
    seeds = range(args.first_seed, args.first_seed + args.n_test)
    jobs = simulate_scenarios(Path(args.jobs_dir), seeds, **scenario_kw)
    tp_all = y_all = f_all = 0
    f1_jobs = []
    by_stretch = np.zeros((2, len(STRETCH_BINS) - 1), np.int64)  # positives, caught
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
            t = pq.read_table(out, columns=["abnormal", "flagged", "start_ns", "end_ns"])
            y = t.column("abnormal").to_numpy(zero_copy_only=False)
            f = t.column("flagged").to_numpy(zero_copy_only=False)
            if args.by_stretch and y.any():
                b = np.digitize(stretch(job, s, Path(args.jobs_dir) / "fault-free", t, scenario_kw)[y], STRETCH_BINS) - 1
                by_stretch[0] += np.bincount(b, minlength=len(STRETCH_BINS) - 1)
                by_stretch[1] += np.bincount(b[f[y]], minlength=len(STRETCH_BINS) - 1)
            tp = int(np.sum(y & f))
            tp_all, y_all, f_all = tp_all + tp, y_all + int(y.sum()), f_all + int(f.sum())
            f1 = 2 * tp / (y.sum() + f.sum()) if y.sum() else float("nan")
            if y.sum():
                f1_jobs.append(f1)
            print(f"{s:5d} {t.num_rows:9d} {int(y.sum()):9d} {int(f.sum()):8d} {f1:6.3f} {dt:6.1f}")
    if args.by_stretch:
        print(f"\n{'stretch':>11s} {'abnormal':>9s} {'share':>6s} {'recall':>7s}")
        for k, (lo, hi) in enumerate(zip(STRETCH_BINS[:-1], STRETCH_BINS[1:])):
            n, c = by_stretch[:, k]
            print(f"{lo:4.1f}-{hi:<6.1f} {n:9d} {n / max(by_stretch[0].sum(), 1):6.1%} {c / max(n, 1):7.3f}")
    p = tp_all / max(f_all, 1)
    r = tp_all / max(y_all, 1)
    f1 = 2 * p * r / (p + r) if p + r else 0.0
    print(f"f1_detect_cli={f1:.3f} precision={p:.3f} recall={r:.3f} f1_median_job={np.median(f1_jobs):.3f} "
          f"jobs={len(jobs)} faulty_jobs={len(f1_jobs)} abnormal_ops={y_all}")


if __name__ == "__main__":
    main()
