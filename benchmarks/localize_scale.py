"""Time one Holmes localization at 2,048-8,192 GPUs against a full scan of every rank (paper §5.2).

For each size a job with one slow GPU (persistent, from iteration 6) is simulated once and cached
(``--cache``). Then, in the same run:

* **Holmes**: ``holmes.localize(path)`` end to end on a freshly opened job directory (reading
  job.json, the pivot's log, the ranks the search visits, detection, search, ranking);
  median of ``--repeats`` runs;
* **Full scan** (the paper's "Traditional"): read every rank's log and flag abnormal operators
  with the 3-sigma rule per operator position on all of them (``--scan-repeats`` runs).

Per size it also prints where one localization's time goes (medians, the process's CPU time
beside the wall time, since a loaded machine inflates the wall time): opening the job (job.json),
parsing topology.json, and the rest (reads, detection, search, ranking).

The last line: ``localize_s_median=<s> ranks_read_pct=<%> full_scan_ratio=<x> peak_rss_mb=<MB>
localize_cpu_s_median=<s>`` for the largest size.

``--analysis persistent`` times the persistent analysis instead (a GPU 1.3x slow from iteration 0;
every rank is read, rank by rank), in a fresh process, with its peak RSS; last line
``persistent_s=<s> persistent_peak_rss_mb=<MB>``.

Usage::

    python benchmarks/localize_scale.py --gpus 8192 --analysis persistent --iterations 100
    python benchmarks/localize_scale.py --gpus 8192
    python benchmarks/localize_scale.py --gpus 32768 --scan-repeats 0   # simulated once: ~4 min, ~0.6 GB
    python benchmarks/localize_scale.py --gpus 131072 --scan-repeats 0  # simulated once (issue #38 target: <= 15 min, <= 8 GB; not yet measured)
    python benchmarks/localize_scale.py            # 2048, 4096 and 8192
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import holmes
from holmes.localize import localize
from holmes.simulate import simulate

LAYOUT = {128: dict(tp=4, pp=4, dp=8),  # 128: --smoke
          2048: dict(tp=8, pp=8, dp=32), 4096: dict(tp=8, pp=8, dp=64), 8192: dict(tp=8, pp=8, dp=128),
          32768: dict(tp=8, pp=8, dp=512), 131072: dict(tp=8, pp=8, dp=2048)}


def three_sigma(table) -> np.ndarray:
    """Abnormal flags by the 3-sigma rule over each operator position's durations."""
    d = (table.column("end_ns").to_numpy() - table.column("start_ns").to_numpy()).astype(float)
    idx = table.column("op_index").to_numpy()
    order = np.argsort(idx, kind="stable")
    ks = idx[order]
    cuts = np.flatnonzero(np.diff(ks)) + 1
    out = np.zeros(len(d), dtype=bool)
    for seg in np.split(order, cuts):
        x = d[seg]
        out[seg] = np.abs(x - x.mean()) > 3 * x.std()
    return out


def full_scan(path: Path) -> tuple[float, int]:
    t0 = time.perf_counter()
    job = holmes.read_job(path, cache_size=1)
    flagged = 0
    for r in range(job.world_size):
        flagged += int(three_sigma(job.ops(r)).sum())
    return time.perf_counter() - t0, flagged


_PERSISTENT_CHILD = """
import json, resource, sys, time
import holmes
t0 = time.perf_counter()
r = holmes.localize(sys.argv[1], analysis="persistent")
dt = time.perf_counter() - t0
print(json.dumps(dict(s=dt, rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
                      top=r.top.id if r.top else None, impact=r.top.impact_pct if r.top else None,
                      slowdown=r.slowdown, read=len(r.fetched))))
"""


def persistent_scale(args: argparse.Namespace) -> int:
    """The persistent analysis (every rank read, streaming) at each size, in a fresh process."""
    import json
    import subprocess

    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    print(f"{'GPUs':>6} {'iters':>6} {'persistent s':>13} {'peak RSS MB':>12} {'ranks read':>11} {'top-1':>10} "
          f"{'impact %':>9} {'slowdown':>9}")
    last = None
    for size in [int(s) for s in args.gpus.split(",")]:
        fault_rank = size // 2 + 5
        out = cache / f"persistent{size}_it{args.iterations}"
        if not (out / "job.json").is_file():
            simulate(out, micro_batches=2, iterations=args.iterations, seed=size, overwrite=True,
                     faults=[f"gpu:{fault_rank}@persistent:0-{args.iterations - 1}*1.3"], **LAYOUT[size])
        got = subprocess.run([sys.executable, "-c", _PERSISTENT_CHILD, str(out)], capture_output=True, text=True,
                             check=True)
        d = json.loads(got.stdout.strip().splitlines()[-1])
        print(f"{size:>6} {args.iterations:>6} {d['s']:>13.2f} {d['rss']:>12.0f} {d['read']:>11} {d['top'] or '-':>10} "
              f"{d['impact'] or float('nan'):>9.2f} {d['slowdown'] or float('nan'):>9.3f}", flush=True)
        last = d
    assert last is not None
    print(f"persistent_s={last['s']:.2f} persistent_peak_rss_mb={last['rss']:.0f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", default="2048,4096,8192",
                    help="comma-separated sizes (128, 2048, 4096, 8192, 32768, 131072)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--scan-repeats", type=int, default=1, help="full scans to time (0: none)")
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "holmes-bench-scale"))
    ap.add_argument("--detector", default="auto")
    ap.add_argument("--quick", action="store_true", help="3 repeats")
    ap.add_argument("--smoke", action="store_true",
                    help="CI: tiny sizes, 128 GPUs x 10 iterations, 1 repeat, a fresh temporary cache")
    ap.add_argument("--analysis", default="irregular", choices=("irregular", "persistent"),
                    help="persistent: a GPU 1.3x slow from iteration 0, analysis='persistent' (reads every rank) "
                         "timed in a fresh process with its peak RSS")
    args = ap.parse_args(argv)
    if args.smoke:
        from _cache import smoke_dir

        args.gpus, args.iterations, args.repeats, args.scan_repeats = "128", 10, 1, 1
        args.cache = str(smoke_dir("localize_scale"))
    if args.analysis == "persistent":
        return persistent_scale(args)
    sizes = [int(s) for s in args.gpus.split(",")]
    for s in sizes:
        if s not in LAYOUT:
            ap.error(f"--gpus: {s} is not one of {sorted(LAYOUT)}")
    reps = 3 if args.quick else args.repeats
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    print(f"{'GPUs':>6} {'holmes s (median)':>18} {'ranks read':>11} {'% ranks':>8} {'MB read':>8} "
          f"{'full scan s':>12} {'ratio':>7} {'top-1':>10}")
    last = None
    for size in sizes:
        fault_rank = size // 2 + 5
        out = cache / f"scale{size}_it{args.iterations}"
        if not (out / "job.json").is_file():
            simulate(out, micro_batches=2, iterations=args.iterations, seed=size, overwrite=True,
                     faults=[f"gpu:{fault_rank}@persistent:6*4"], **LAYOUT[size])
        times, cpus, report = [], [], None
        stages: dict[str, list[tuple[float, float]]] = {"job.json": [], "topology.json": []}
        for _ in range(reps):
            t0, c0 = time.perf_counter(), time.process_time()
            report = localize(out, detector=args.detector, analysis="irregular")
            times.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
            t0, c0 = time.perf_counter(), time.process_time()
            job = holmes.read_job(out)
            stages["job.json"].append((time.perf_counter() - t0, time.process_time() - c0))
            t0, c0 = time.perf_counter(), time.process_time()
            assert job.topology is not None   # parsed as localize parses it
            stages["topology.json"].append((time.perf_counter() - t0, time.process_time() - c0))
            del job
        assert report is not None
        scan = [full_scan(out)[0] for _ in range(args.scan_repeats)]   # 0: no full scan (ratio nan)
        med = statistics.median(times)
        scan_med = statistics.median(scan) if scan else float("nan")
        pct = 100.0 * len(report.fetched) / size
        top = report.top.id if report.top else "-"
        print(f"{size:>6} {med:>18.3f} {len(report.fetched):>11} {pct:>7.2f}% {report.bytes_read / 1e6:>8.2f} "
              f"{scan_med:>12.2f} {scan_med / med:>6.1f}x {top:>10}", flush=True)
        cpu_med = statistics.median(cpus)
        parts = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in stages.items()}
        rest = (med - sum(w for w, _ in parts.values()), cpu_med - sum(c for _, c in parts.values()))
        print("       stages (wall s / cpu s): " + ", ".join(
            f"{k} {w:.3f}/{c:.3f}" for k, (w, c) in [*parts.items(), ("reads+search+ranking", rest)])
            + f"; total {med:.3f}/{cpu_med:.3f}; scans set aside: "
            + next((a.split()[0] for a in report.assumptions if "scan(s) of large groups" in a), "0"), flush=True)
        last = (med, pct, scan_med / med, cpu_med)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    assert last is not None
    print(f"localize_s_median={last[0]:.3f} ranks_read_pct={last[1]:.2f} full_scan_ratio={last[2]:.1f} "
          f"peak_rss_mb={peak:.0f} localize_cpu_s_median={last[3]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
