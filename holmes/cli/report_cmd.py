"""``holmes report JOB -o REPORT.html [--analysis A] [--detector D] [--topology FILE] ...``.

Localizes the job (the same options as ``holmes localize``) and writes one self-contained HTML
page (no network needed to view it): verdict and devices, the heatmap of the ranks' slowness, the
pivot's iteration times, the traced paths, the cluster, what-if impact, the hang table. The
output is written atomically, never inside the job directory, and replaces a file only with
``--overwrite``. Prints the path written. ``--trace TRACE.json`` also (or, without ``-o``,
only) writes a Chrome trace of the window that Perfetto opens, the named devices' ranks first and
marked (:mod:`holmes.report.trace`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from holmes.localize.params import ANALYSES

__all__ = ["add_parser", "run"]


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", metavar="JOB", help="CommOps job directory")
    parser.add_argument("-o", "--output", default=None, metavar="REPORT.html", help="the page to write")
    parser.add_argument("--trace", default=None, metavar="TRACE.json",
                        help="also write a Chrome trace of the window (open it in Perfetto), the named devices "
                             "highlighted")
    parser.add_argument("--trace-ranks", type=int, default=32, metavar="N",
                        help="ranks in the trace at most (default 32: the named ones first)")
    parser.add_argument("--trace-iterations", type=int, default=20, metavar="N",
                        help="iterations in the trace at most (default 20, from just before the first irregular one)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    parser.add_argument("--pivot", type=int, default=0, metavar="R", help="monitored rank (default 0)")
    parser.add_argument("--window", type=int, default=100, metavar="N", help="iterations analysed (default 100)")
    parser.add_argument("--top", type=int, default=2, metavar="K", help="devices reported (default 2)")
    parser.add_argument("--delta", type=float, default=1.1, metavar="D",
                        help="an iteration is irregular above D times the reference (default 1.1)")
    parser.add_argument("--detector", default="auto", metavar="NAME|PATH",
                        help="auto (default), model, robust, label, or a model written by holmes train")
    parser.add_argument("--topology", default=None, metavar="FILE",
                        help="topology.json of the cluster (default: the job's own, else a default cluster)")
    parser.add_argument("--analysis", choices=ANALYSES, default="all", help="which analyses run (default all)")
    parser.add_argument("--thresholds", default=None, metavar="FILE",
                        help="a thresholds file overriding some of the shipped ones (docs/thresholds.md)")
    parser.add_argument("--max-ranks", type=int, default=512, metavar="N",
                        help="rank logs read for the heatmap at most (default 512; the ranks the report "
                             "points at first)")


def run(args: argparse.Namespace) -> int:
    from holmes.errors import ConfigError
    from holmes.io import read_job
    from holmes.io.outputs import check_output
    from holmes.localize import localize
    from holmes.report import write_html

    if args.max_ranks < 1:
        raise ConfigError(f"--max-ranks={args.max_ranks} must be >= 1")
    if args.output is None and args.trace is None:
        raise ConfigError("give -o REPORT.html, --trace TRACE.json or both")
    if args.trace is not None and (args.trace_ranks < 1 or args.trace_iterations < 1):
        raise ConfigError("--trace-ranks and --trace-iterations must be >= 1")
    if args.output is not None and args.trace is not None and \
            Path(args.output).resolve() == Path(args.trace).resolve():
        raise ConfigError(f"-o and --trace name the same file {args.output}")
    for out in (args.output, args.trace):
        if out is not None:
            check_output(out, inputs=[args.job], overwrite=args.overwrite)  # fail before the work
    job = read_job(args.job)
    report = localize(job, pivot=args.pivot, window=args.window, top_k=args.top, delta=args.delta,
                      detector=args.detector, topology=args.topology, analysis=args.analysis,
                      thresholds=args.thresholds)
    if args.output is not None:
        out = write_html(report, args.output, job=job, topology=args.topology, overwrite=args.overwrite,
                         max_ranks=args.max_ranks)
        sys.stdout.write(f"{out}\n")
    if args.trace is not None:
        from holmes.report.trace import write_trace

        out = write_trace(report, args.trace, job, overwrite=args.overwrite, max_ranks=args.trace_ranks,
                          max_iterations=args.trace_iterations)
        sys.stdout.write(f"{out}\n")
    return 0
