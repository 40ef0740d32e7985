"""Size and time of the HTML report of an 8,192-GPU job (issue #19: <= 10 MB, <= 10 s).

The job is ``localize_scale.py``'s (TP 8 x PP 8 x DP 128, one GPU 4x slow from iteration 6,
20 iterations), simulated once and cached in the same directory (``--cache``). The job is
localized once (``localize_s``, not part of the target); then ``write_html`` is timed on a freshly
opened job (``render_s``: reading the heatmap's rank logs, at most ``--max-ranks``, drawing and
writing the page), median of ``--repeats`` runs. ``--max-ranks 8192`` reads every rank.

Last line: ``html_mb=<size> render_s=<median s> localize_s=<s> ranks_read=<n> top=<device>``.

Usage::

    python benchmarks/report_size.py                 # 8192 GPUs
    python benchmarks/report_size.py --gpus 2048 --repeats 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import holmes
from holmes.report import write_html
from holmes.simulate import simulate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from localize_scale import LAYOUT  # noqa: E402  (the same job and cache as localize_scale.py)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=8192, choices=sorted(LAYOUT))
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-ranks", type=int, default=512)
    ap.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "holmes-bench-scale"))
    ap.add_argument("--keep", default=None, metavar="FILE", help="also keep the page here")
    ap.add_argument("--smoke", action="store_true",
                    help="CI: tiny sizes, 128 GPUs x 10 iterations, 1 render of 64 ranks, a fresh temporary "
                         "cache")
    args = ap.parse_args(argv)
    if args.smoke:
        from _cache import smoke_dir

        args.gpus, args.iterations, args.repeats, args.max_ranks = 128, 10, 1, 64
        args.cache = str(smoke_dir("report_size"))
    size = args.gpus
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    job_dir = cache / f"scale{size}_it{args.iterations}"
    if not (job_dir / "job.json").is_file():
        simulate(job_dir, micro_batches=2, iterations=args.iterations, seed=size, overwrite=True,
                 faults=[f"gpu:{size // 2 + 5}@persistent:6*4"], **LAYOUT[size])
    t0 = time.perf_counter()
    report = holmes.localize(job_dir, analysis="irregular")
    localize_s = time.perf_counter() - t0
    top = report.top.id if report.top else "-"
    times, mb = [], 0.0
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.html"
        for _ in range(max(1, args.repeats)):
            job = holmes.read_job(job_dir)  # fresh: nothing cached from the localization
            t0 = time.perf_counter()
            write_html(report, out, job=job, max_ranks=args.max_ranks, overwrite=True)
            times.append(time.perf_counter() - t0)
            mb = out.stat().st_size / 1e6
        if args.keep:
            os.replace(out, args.keep)
    read = min(args.max_ranks, size)
    print(f"{'GPUs':>6} {'localize s':>11} {'render s (median)':>18} {'runs':>5} {'ranks read':>11} {'html MB':>8} "
          f"{'top-1':>10}")
    print(f"{size:>6} {localize_s:>11.2f} {statistics.median(times):>18.2f} {len(times):>5} {read:>11} {mb:>8.2f} "
          f"{top:>10}")
    print(f"html_mb={mb:.2f} render_s={statistics.median(times):.2f} localize_s={localize_s:.2f} ranks_read={read} "
          f"top={top}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
