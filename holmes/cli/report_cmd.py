"""``holmes report JOB -o REPORT.html [--analysis A] [--detector D] [--topology FILE] ...``.

Localizes the job (the same options as ``holmes localize``) and writes one self-contained HTML
page (no network needed to view it): verdict and devices, the heatmap of the ranks' slowness, the
pivot's iteration times, the traced paths, the cluster, what-if impact, the hang table. The
output is written atomically, never inside the job directory, and replaces a file only with
``--overwrite``. Prints the path written.
"""

from __future__ import annotations

import argparse
import sys

from holmes.localize.params import ANALYSES

__all__ = ["add_parser", "run"]


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", metavar="JOB", help="CommOps job directory")
    parser.add_argument("-o", "--output", required=True, metavar="REPORT.html", help="the page to write")
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
    check_output(args.output, inputs=[args.job], overwrite=args.overwrite)  # fail before the work
    job = read_job(args.job)
    report = localize(job, pivot=args.pivot, window=args.window, top_k=args.top, delta=args.delta,
                      detector=args.detector, topology=args.topology, analysis=args.analysis)
    out = write_html(report, args.output, job=job, topology=args.topology, overwrite=args.overwrite,
                     max_ranks=args.max_ranks)
    sys.stdout.write(f"{out}\n")
    return 0
