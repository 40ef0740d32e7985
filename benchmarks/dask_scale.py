"""Full-job ``holmes detect`` in process vs on a 2-worker Dask ``LocalCluster`` (issue #18).

The job (8,192 GPUs x 100 iterations by default, a GPU 1.3x slow from iteration 0) is simulated
once and cached as ``benchmarks/localize_scale.py --analysis persistent`` caches it (the same
directory, so either benchmark reuses the other's). Then, in the same run:

* **in process**: ``holmes detect JOB --out A.parquet`` in a fresh process (context from every
  rank, every rank scored, one output file); wall time and the process's peak RSS;
* **Dask**: a ``LocalCluster(n_workers=2, threads_per_worker=1, processes=True)`` started here,
  then ``holmes detect JOB --scheduler ADDRESS --out B.parquet`` in a fresh process; wall time
  of that command, and the peak RSS of each worker process, of the client process and of this
  process (which hosts the scheduler);
* the two outputs compared bit for bit: the same rows (rank, iteration, op_index, seq) and the
  same ``score`` (float64 bits) and ``flagged`` in the same order.

On a small shared machine the Dask run is not faster (two workers on two cores, plus the
transfers); the point is the memory of the largest single process.

Last line: ``dask_s=<s> inproc_s=<s> dask_max_worker_rss_mb=<MB> inproc_rss_mb=<MB> same_result=<0|1>``
(medians over ``--repeats``; also ``dask_client_rss_mb`` and ``scheduler_rss_mb`` in the table).

Usage::

    python benchmarks/dask_scale.py                      # 8192 GPUs x 100 iterations
    python benchmarks/dask_scale.py --gpus 2048 --iterations 20
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from holmes.simulate import simulate

LAYOUT = {2048: dict(tp=8, pp=8, dp=32), 4096: dict(tp=8, pp=8, dp=64), 8192: dict(tp=8, pp=8, dp=128)}

# runs the CLI in this child and prints its own peak RSS (MB) and wall time on the last line
_CHILD = """
import json, resource, sys, time
from holmes.cli.main import main
t0 = time.perf_counter()
rc = main(sys.argv[1:])
print(json.dumps(dict(rc=rc, s=time.perf_counter() - t0,
                      rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0)))
"""


def cached_job(cache: Path, size: int, iterations: int) -> Path:
    """The job of ``localize_scale.py --analysis persistent`` (simulated once, then reused)."""
    out = cache / f"persistent{size}_it{iterations}"
    if not (out / "job.json").is_file():
        print(f"simulating {size} GPUs x {iterations} iterations into {out} (once) ...", flush=True)
        simulate(out, micro_batches=2, iterations=iterations, seed=size, overwrite=True,
                 faults=[f"gpu:{size // 2 + 5}@persistent:0-{iterations - 1}*1.3"], **LAYOUT[size])
    return out


def run_cli(argv: list[str]) -> dict:
    got = subprocess.run([sys.executable, "-c", _CHILD, *argv], capture_output=True, text=True)
    if got.returncode != 0:
        raise SystemExit(f"holmes {' '.join(argv)} failed:\n{got.stderr[-3000:]}")
    return json.loads(got.stdout.strip().splitlines()[-1])


def _worker_peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def dask_run(job: Path, out: Path) -> tuple[dict, list[float]]:
    """``holmes detect --scheduler`` against a fresh 2-worker LocalCluster; (client result, worker peak RSS)."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        res = run_cli(["detect", str(job), "--out", str(out), "--overwrite", "--scheduler", cluster.scheduler_address])
        workers = list(client.run(_worker_peak_rss_mb).values())
    return res, workers


def same_result(a: Path, b: Path) -> bool:
    """The two outputs hold the same rows, scores (bit for bit) and flags, in the same order."""
    fa, fb = pq.ParquetFile(a), pq.ParquetFile(b)
    if fa.metadata.num_rows != fb.metadata.num_rows:
        return False
    for col in ("rank", "iteration", "op_index", "seq", "score", "flagged"):
        x = fa.read(columns=[col]).column(0).to_numpy()
        y = fb.read(columns=[col]).column(0).to_numpy()
        if col == "score":
            x, y = x.view(np.int64), y.view(np.int64)
        if not np.array_equal(x, y):
            return False
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=8192, choices=sorted(LAYOUT))
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "holmes-bench-scale"))
    args = ap.parse_args(argv)
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    job = cached_job(cache, args.gpus, args.iterations)
    print(f"load: {os.getloadavg()[0]:.1f} (1-min average, {os.cpu_count()} cores)")
    print(f"{'run':>4} {'inproc s':>9} {'inproc RSS MB':>14} {'dask s':>7} {'worker RSS MB':>16} "
          f"{'client RSS MB':>14} {'same':>5}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="holmes-dask-scale-", dir=cache) as tmp:
        a, b = Path(tmp) / "inproc.parquet", Path(tmp) / "dask.parquet"
        for k in range(args.repeats):
            inproc = run_cli(["detect", str(job), "--out", str(a), "--overwrite"])
            t0 = time.perf_counter()
            client, workers = dask_run(job, b)
            dask_s = time.perf_counter() - t0  # with the cluster's start and stop
            same = same_result(a, b)
            rows.append((inproc["s"], inproc["rss"], client["s"], max(workers), client["rss"], same))
            print(f"{k:>4} {inproc['s']:>9.1f} {inproc['rss']:>14.0f} {client['s']:>7.1f} "
                  f"{'/'.join(f'{w:.0f}' for w in workers):>16} {client['rss']:>14.0f} {int(same):>5}   "
                  f"(with cluster start/stop: {dask_s:.1f} s)", flush=True)
    med = [statistics.median(r[i] for r in rows) for i in range(5)]
    sched = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(f"scheduler_rss_mb={sched:.0f} dask_client_rss_mb={med[4]:.0f} load_end={os.getloadavg()[0]:.1f}")
    print(f"dask_s={med[2]:.1f} inproc_s={med[0]:.1f} dask_max_worker_rss_mb={med[3]:.0f} inproc_rss_mb={med[1]:.0f} "
          f"same_result={int(all(r[5] for r in rows))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
