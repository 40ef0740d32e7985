"""``holmes localize JOB [--pivot R] [--window N] [--top K] [--delta D] [--format text|json] [--all] [--exit-code]``.

Prints the ranked devices, root causes and what was read; JSON on stdout with ``--format json``
(the keys of docs/report.md plus evidence, missing ranks, bytes read). A progress bar of the ranks
read is drawn on stderr when stderr is a terminal (not with ``--quiet``); stdout carries only the
report. With ``--exit-code`` the exit status carries the verdict (:data:`VERDICT_EXIT`): 0 healthy,
1 culprit or hang, 3 inconclusive; 2 stays bad input.
"""

from __future__ import annotations

import argparse
import sys

from holmes.localize.params import ANALYSES

__all__ = ["VERDICT_EXIT", "add_parser", "exit_status", "run"]

#: exit status of ``holmes localize --exit-code`` per verdict (2 is bad input, as for every command)
VERDICT_EXIT: dict[str, int] = {"healthy": 0, "culprit": 1, "hang": 1, "inconclusive": 3}


def exit_status(verdict: str) -> int:
    """The ``--exit-code`` status of a verdict: 0 healthy, 1 culprit or hang, 3 inconclusive.

    >>> [exit_status(v) for v in ("healthy", "culprit", "hang", "inconclusive")]
    [0, 1, 1, 3]
    """
    return VERDICT_EXIT[verdict]


def _ranks(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ranks, got {text!r}") from None


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", metavar="JOB", help="CommOps job directory")
    parser.add_argument("--pivot", type=int, default=0, metavar="R", help="monitored rank (default 0)")
    parser.add_argument("--monitors", type=_ranks, default=None, metavar="R,...",
                        help="extra monitored ranks the search also starts from")
    parser.add_argument("--window", type=int, default=100, metavar="N", help="iterations analysed (default 100)")
    parser.add_argument("--top", type=int, default=2, metavar="K", help="devices reported (default 2)")
    parser.add_argument("--delta", type=float, default=1.1, metavar="D",
                        help="an iteration is irregular above D times the reference (default 1.1)")
    parser.add_argument("--detector", default="auto", metavar="NAME|PATH",
                        help="auto (default), model, robust, label (ground truth of generated jobs), "
                             "or the path of a model written by holmes train")
    parser.add_argument("--topology", default=None, metavar="FILE",
                        help="topology.json of the cluster (default: the job's own, else a default cluster)")
    parser.add_argument("--scheduler", metavar="ADDRESS",
                        help="with --analysis persistent: read the ranks on a Dask cluster (tcp://host:8786; needs "
                             "holmes[dask]; the workers read JOB's rank files from its path); the same report")
    parser.add_argument("--analysis", choices=ANALYSES, default="all",
                        help="which analyses run (default all)")
    parser.add_argument("--method", choices=("map", "linear"), default="map", help="device accumulation")
    parser.add_argument("--alpha", type=float, default=1.0, help="strength of the Beta prior (default 1)")
    parser.add_argument("--max-iterations", type=int, default=None, metavar="N",
                        help="search at most N irregular iterations (the most irregular)")
    parser.add_argument("--thresholds", default=None, metavar="FILE",
                        help="a thresholds file overriding some of the shipped ones (docs/thresholds.md)")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument("--no-evidence", action="store_true", help="omit the evidence paths from JSON")
    parser.add_argument("--all", dest="show_all", action="store_true",
                        help="text: list every root cause (not folded) and every implicated device")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar on stderr")
    parser.add_argument("--exit-code", action="store_true",
                        help="exit with the verdict: 0 healthy, 1 culprit or hang, 3 inconclusive "
                             "(2 stays bad input)")


def run(args: argparse.Namespace) -> int:
    if getattr(args, "scheduler", None):
        return _run_distributed(args)
    from holmes.localize import Localizer
    from holmes.progress import terminal_progress

    loc = Localizer(pivot=args.pivot, window=args.window, top_k=args.top, delta=args.delta,
                    detector=args.detector, monitors=args.monitors, method=args.method, alpha=args.alpha,
                    max_iterations=args.max_iterations, topology=args.topology, analysis=args.analysis,
                    thresholds=args.thresholds, progress=terminal_progress(enabled=not args.quiet))
    report = loc.localize(args.job)
    if args.format == "json":
        sys.stdout.write(report.dumps(evidence=not args.no_evidence) + "\n")
    else:
        sys.stdout.write(report.to_text(show_all=args.show_all) + "\n")
    return exit_status(report.verdict) if args.exit_code else 0


def _run_distributed(args: argparse.Namespace) -> int:
    """``--scheduler``: the persistent analysis with its per-rank work on a Dask cluster."""
    from holmes.errors import ConfigError
    from holmes.localize.mapreduce import localize_persistent

    if args.analysis != "persistent":
        raise ConfigError(f"--scheduler runs the persistent analysis (give --analysis persistent, not {args.analysis})")
    report = localize_persistent(args.job, scheduler=args.scheduler, pivot=args.pivot, window=args.window,
                                 top_k=args.top, delta=args.delta, detector=args.detector, monitors=args.monitors,
                                 method=args.method, alpha=args.alpha, max_iterations=args.max_iterations,
                                 topology=args.topology, thresholds=args.thresholds)
    if args.format == "json":
        sys.stdout.write(report.dumps(evidence=not args.no_evidence) + "\n")
    else:
        sys.stdout.write(report.to_text() + "\n")
    return exit_status(report.verdict) if args.exit_code else 0
