"""Full-job work in process vs on a 2-worker Dask ``LocalCluster``: ``holmes detect`` (issue #18) or
the persistent analysis (``--analysis persistent``, issue #38).

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

Last line: ``[new] dask_s=<s> inproc_s=<s> dask_max_worker_rss_mb=<MB> inproc_rss_mb=<MB>
dask_client_rss_mb=<MB> scheduler_rss_mb=<MB> ratio_worker=<x> ratio_any_process=<x> same_result=<0|1>``
(medians over ``--repeats``). ``dask_max_worker_rss_mb`` is the largest worker's peak;
``dask_client_rss_mb`` the ``holmes detect --scheduler`` process's; ``scheduler_rss_mb`` this
process's (the scheduler, the ``LocalCluster`` and its client) during the Dask run only (its peak is
reset before, on Linux: not the simulation, the comparison or another run). ``ratio_worker`` is
in-process RSS / largest worker's, ``ratio_any_process`` the same over the largest of the three.
``--compare-old`` also runs the Dask part with the settings before the memory fix (512 ranks a
task, 8 tasks ahead), printed first as ``[old]``.

``--analysis persistent``: ``holmes localize JOB --analysis persistent --format json`` in a fresh
process, then the same with ``--scheduler ADDRESS`` (map over chunks of ranks on the workers, reduce
by blocks of slots, report in the client); the two reports compared as JSON without ``bytes_read``
and ``timing`` (the workers read the logs; wall times differ). Last line:
``[persistent] dask_s=<s> inproc_s=<s> dask_max_worker_rss_mb=<MB> dask_client_rss_mb=<MB>
scheduler_rss_mb=<MB> max_process_rss_mb=<MB> inproc_rss_mb=<MB> load=<1-min> same_result=<0|1>``;
``--skip-inproc`` runs the Dask part only, against a report written earlier (``--reference``; without
one ``same_result=-1``). The commands run with ``MALLOC_TRIM_THRESHOLD_=65536`` (what Dask's nanny sets
for its workers: glibc hands freed memory back to the system, so RSS is what the process holds).

Usage::

    python benchmarks/dask_scale.py                      # 8192 GPUs x 100 iterations
    python benchmarks/dask_scale.py --gpus 2048 --iterations 20 --compare-old
    python benchmarks/dask_scale.py --gpus 32768 --analysis persistent
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
import pyarrow as pa
import pyarrow.parquet as pq

from holmes.simulate import simulate

LAYOUT = {128: dict(tp=4, pp=4, dp=8), 2048: dict(tp=8, pp=8, dp=32), 4096: dict(tp=8, pp=8, dp=64),
          8192: dict(tp=8, pp=8, dp=128), 32768: dict(tp=8, pp=8, dp=512)}

# runs the CLI in this child and prints its own peak RSS (MB) and wall time on the last line;
# argv[1] (JSON) may set DaskExecutor's in_flight / max_chunk (to compare settings in one session) and
# "stdout": the file the command's output goes to
_CHILD = """
import contextlib, functools, json, resource, sys, time
from holmes.cli.main import main
from holmes.parallel import DaskExecutor
opts = json.loads(sys.argv[1])
out = opts.pop("stdout", None)
if opts:
    DaskExecutor.__init__ = functools.partialmethod(DaskExecutor.__init__, **opts)
t0 = time.perf_counter()
if out:
    with open(out, "w") as f, contextlib.redirect_stdout(f):
        rc = main(sys.argv[2:])
else:
    rc = main(sys.argv[2:])
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


def run_cli(argv: list[str], opts: dict | None = None) -> dict:
    env = {**os.environ, "MALLOC_TRIM_THRESHOLD_": os.environ.get("MALLOC_TRIM_THRESHOLD_", "65536")}
    got = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(opts or {}), *argv], capture_output=True,
                         text=True, env=env)
    if got.returncode != 0:
        raise SystemExit(f"holmes {' '.join(argv)} failed:\n{got.stderr[-3000:]}")
    return json.loads(got.stdout.strip().splitlines()[-1])


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _reset_peak() -> bool:
    """Reset this process's peak RSS (Linux ``clear_refs``), so that the next :func:`_peak_mb` covers only
    what follows (not the simulation, a comparison or an earlier run); False where not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_mb() -> float:
    """This process's peak RSS since the last :func:`_reset_peak` (``VmHWM``), else since its start."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return _rss_mb()


def dask_run(job: Path, out: Path, opts: dict) -> tuple[dict, list[float], float]:
    """``holmes detect --scheduler`` against a fresh 2-worker LocalCluster; (client result, each worker's
    peak RSS, the peak RSS of this process, which hosts the scheduler, measured before the comparison)."""
    from distributed import Client, LocalCluster

    _reset_peak()
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        res = run_cli(["detect", str(job), "--out", str(out), "--overwrite", "--scheduler", cluster.scheduler_address],
                      opts)
        workers = list(client.run(_rss_mb).values())
    return res, workers, _peak_mb()


def dask_localize(job: Path, out: Path) -> tuple[dict, list[float], float]:
    """``holmes localize --analysis persistent --scheduler`` against a fresh 2-worker LocalCluster; (client
    result, each worker's peak RSS, this process's peak RSS: the scheduler's)."""
    from distributed import Client, LocalCluster

    _reset_peak()
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        res = run_cli(["localize", str(job), "--analysis", "persistent", "--format", "json", "-q",
                       "--scheduler", cluster.scheduler_address], {"stdout": str(out)})
        workers = list(client.run(_peak_mb).values())
    return res, workers, _peak_mb()


def same_report(a: Path, b: Path) -> bool:
    """The two reports' JSON are equal but for ``bytes_read`` (what the report's own process read) and
    ``timing``."""
    ra, rb = json.loads(a.read_text()), json.loads(b.read_text())
    for r in (ra, rb):
        r.pop("bytes_read", None)
        r.pop("timing", None)
    return ra == rb


def persistent_main(args: argparse.Namespace, job: Path, cache: Path) -> int:
    print(f"{'run':>4} {'inproc s':>9} {'inproc RSS MB':>14} {'dask s':>7} {'worker RSS MB':>14} "
          f"{'client RSS MB':>14} {'sched. RSS MB':>14} {'same':>5}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="holmes-dask-scale-", dir=cache) as tmp:
        a, b = Path(tmp) / "inproc.json", Path(tmp) / "dask.json"
        for k in range(args.repeats):
            if args.skip_inproc:
                a = Path(args.reference) if args.reference else None
                inproc = {"s": float("nan"), "rss": float("nan")}
            else:
                inproc = run_cli(["localize", str(job), "--analysis", "persistent", "--format", "json", "-q"],
                                 {"stdout": str(a)})
            t0 = time.perf_counter()
            client, workers, sched = dask_localize(job, b)
            dask_s = time.perf_counter() - t0
            same = same_report(a, b) if a is not None else -1  # -1: not compared
            rows.append((inproc["s"], inproc["rss"], client["s"], max(workers), client["rss"], sched, same))
            print(f"{k:>4} {inproc['s']:>9.1f} {inproc['rss']:>14.0f} {client['s']:>7.1f} "
                  f"{'/'.join(f'{w:.0f}' for w in workers):>14} {client['rss']:>14.0f} {sched:>14.0f} "
                  f"{int(same):>5}   (with cluster start/stop: {dask_s:.1f} s)", flush=True)
            if args.keep_report and k == 0:
                Path(args.keep_report).write_text(b.read_text())
    med = [statistics.median(r[i] for r in rows) for i in range(6)]
    print(f"[persistent] dask_s={med[2]:.1f} inproc_s={med[0]:.1f} dask_max_worker_rss_mb={med[3]:.0f} "
          f"dask_client_rss_mb={med[4]:.0f} scheduler_rss_mb={med[5]:.0f} "
          f"max_process_rss_mb={max(med[3], med[4], med[5]):.0f} inproc_rss_mb={med[1]:.0f} "
          f"load={os.getloadavg()[0]:.1f} same_result={min(int(r[6]) for r in rows)}")
    return 0 if all(r[6] == 1 for r in rows) or not args.smoke else 1


def same_result(a: Path, b: Path) -> bool:
    """The two outputs hold the same rows, scores (bit for bit) and flags, in the same order."""
    fa, fb = pq.ParquetFile(a), pq.ParquetFile(b)
    if fa.metadata.num_rows != fb.metadata.num_rows:
        return False
    cols = ["rank", "iteration", "op_index", "seq", "score", "flagged"]
    # batch by batch (the two files' row groups differ): this process's memory stays small
    for xa, xb in zip(_rows(fa, cols), _rows(fb, cols)):
        for col in cols:
            x, y = xa[col], xb[col]
            if col == "score":
                x, y = x.view(np.int64), y.view(np.int64)
            if not np.array_equal(x, y):
                return False
    return True


def _rows(f: pq.ParquetFile, cols: list[str], n: int = 1 << 20):
    """Consecutive blocks of exactly ``n`` rows (the last shorter) of ``cols`` of ``f`` as numpy arrays,
    whatever its row groups."""
    buf: list = []
    have = 0
    for b in f.iter_batches(batch_size=1 << 16, columns=cols):
        buf.append(b)
        have += b.num_rows
        while have >= n:
            t = pa.Table.from_batches(buf).combine_chunks()
            yield {c: t.column(c).slice(0, n).to_numpy() for c in cols}
            rest = t.slice(n)
            buf, have = rest.to_batches(), rest.num_rows
    if have:
        t = pa.Table.from_batches(buf).combine_chunks()
        yield {c: t.column(c).to_numpy() for c in cols}


OLD = dict(in_flight=8, max_chunk=512)  # the settings before the memory fix: 512 ranks a task, 4 x workers ahead


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=8192, choices=sorted(LAYOUT))
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--in-flight", type=int, help="DaskExecutor in_flight (default: the library's, 2 x workers + 1)")
    ap.add_argument("--max-chunk", type=int, help="DaskExecutor max_chunk (default: the library's, 64 ranks)")
    ap.add_argument("--compare-old", action="store_true",
                    help="also run the Dask part with the old settings (512 ranks a task, 8 tasks ahead)")
    ap.add_argument("--analysis", choices=("detect", "persistent"), default="detect",
                    help="the full-job work compared: holmes detect (default) or the persistent analysis")
    ap.add_argument("--skip-inproc", action="store_true",
                    help="--analysis persistent: no in-process run; compare with --reference (none: same_result=-1)")
    ap.add_argument("--reference", help="--analysis persistent --skip-inproc: an in-process report (JSON)")
    ap.add_argument("--keep-report", help="--analysis persistent: copy the Dask run's report here")
    ap.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "holmes-bench-scale"))
    ap.add_argument("--smoke", action="store_true",
                    help="CI: tiny sizes, 128 GPUs x 10 iterations, a fresh temporary cache, holmes detect and "
                         "then the persistent analysis; exits 1 unless same_result=1")
    args = ap.parse_args(argv)
    if args.smoke:
        from _cache import smoke_dir

        args.gpus, args.iterations, args.repeats, args.compare_old = 128, 10, 1, False
        args.cache = str(smoke_dir("dask_scale"))
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    job = cached_job(cache, args.gpus, args.iterations)
    if args.analysis == "persistent":
        print(f"job: {job} ({args.gpus} GPUs x {args.iterations} iterations, persistent analysis); "
              f"load: {os.getloadavg()[0]:.1f} (1-min average, {os.cpu_count()} cores)")
        return persistent_main(args, job, cache)
    opts = {k: v for k, v in (("in_flight", args.in_flight), ("max_chunk", args.max_chunk)) if v is not None}
    settings = [("new", opts)] + ([("old", OLD)] if args.compare_old else [])
    print(f"job: {job} ({args.gpus} GPUs x {args.iterations} iterations); "
          f"load: {os.getloadavg()[0]:.1f} (1-min average, {os.cpu_count()} cores)")
    print(f"{'run':>4} {'set':>4} {'inproc s':>9} {'inproc RSS MB':>14} {'dask s':>7} {'worker RSS MB':>14} "
          f"{'client RSS MB':>14} {'sched. RSS MB':>14} {'same':>5}", flush=True)
    rows: dict[str, list] = {name: [] for name, _ in settings}
    with tempfile.TemporaryDirectory(prefix="holmes-dask-scale-", dir=cache) as tmp:
        a, b = Path(tmp) / "inproc.parquet", Path(tmp) / "dask.parquet"
        for k in range(args.repeats):
            inproc = run_cli(["detect", str(job), "--out", str(a), "--overwrite"])
            for name, o in settings:
                t0 = time.perf_counter()
                client, workers, sched = dask_run(job, b, o)
                dask_s = time.perf_counter() - t0  # with the cluster's start and stop
                same = same_result(a, b)
                rows[name].append((inproc["s"], inproc["rss"], client["s"], max(workers), client["rss"], sched, same))
                print(f"{k:>4} {name:>4} {inproc['s']:>9.1f} {inproc['rss']:>14.0f} {client['s']:>7.1f} "
                      f"{'/'.join(f'{w:.0f}' for w in workers):>14} {client['rss']:>14.0f} {sched:>14.0f} "
                      f"{int(same):>5}   (with cluster start/stop: {dask_s:.1f} s; settings {o or 'default'})",
                      flush=True)
    print(f"load_end={os.getloadavg()[0]:.1f}")
    for name, o in reversed(settings):  # the library's settings last (the last line)
        med = [statistics.median(r[i] for r in rows[name]) for i in range(6)]
        # the largest Dask process: a worker; the client (holmes detect --scheduler) and the scheduler's
        # process (this benchmark: scheduler, LocalCluster and its Client; peak before the comparison)
        # are given apart, and the ratio with the largest of all three too
        big = max(med[3], med[4], med[5])
        print(f"[{name}] dask_s={med[2]:.1f} inproc_s={med[0]:.1f} dask_max_worker_rss_mb={med[3]:.0f} "
              f"inproc_rss_mb={med[1]:.0f} dask_client_rss_mb={med[4]:.0f} scheduler_rss_mb={med[5]:.0f} "
              f"ratio_worker={med[1] / med[3]:.2f} ratio_any_process={med[1] / big:.2f} "
              f"same_result={int(all(r[6] for r in rows[name]))}")
    if args.smoke and not all(r[6] for name, _ in settings for r in rows[name]):
        return 1
    if args.smoke:  # CI runs the persistent analysis on Dask too (its own last line)
        return persistent_main(args, job, cache)
    return 0


if __name__ == "__main__":
    sys.exit(main())
