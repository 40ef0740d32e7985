"""``holmes train JOB... --out MODEL``: train a detector from labelled jobs (an ``abnormal`` column).

``MODEL.json`` and ``MODEL.npz`` are refused when they exist (unless ``--overwrite``) or lie inside
an input job, before any training; each is written to a temporary sibling and renamed into place.
"""

from __future__ import annotations

import argparse
import os
import sys

from holmes.errors import ConfigError


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("jobs", nargs="+", metavar="JOB", help="labelled job directories (e.g. from holmes simulate)")
    p.add_argument("--out", required=True, metavar="MODEL", help="model path: writes MODEL.json and MODEL.npz")
    p.add_argument("--n-estimators", type=int, default=64)
    p.add_argument("--criterion", choices=("gini", "entropy"), default="gini")
    p.add_argument("--max-depth", type=int, default=14)
    p.add_argument("--min-samples-leaf", type=int, default=8)
    p.add_argument("--max-ranks", type=int, default=64, help="ranks sampled per job (default 64)")
    p.add_argument("--threshold", type=float, default=0.5)
    p.add_argument("--context", choices=("mixed", "job", "rank"), default="mixed",
                   help="cross-rank context of the training rows: the whole job's, each rank's own, or "
                        "a mix (default; the model then serves holmes detect and lone rank tables)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true", help="replace an existing MODEL.json / MODEL.npz")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="read the jobs and compute the training rows on a Dask cluster (tcp://host:8786; needs "
                        "holmes[dask]; the workers read the jobs from their paths); the same model as without it")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar and no summary line on stderr")


def run(args: argparse.Namespace) -> int:
    from holmes.detect import OperatorDetector
    from holmes.detect.training import jobs_dataset

    if args.n_estimators < 1 or args.max_depth < 1 or args.max_ranks < 1 or args.min_samples_leaf < 1:
        raise ConfigError("--n-estimators, --max-depth, --min-samples-leaf and --max-ranks must be >= 1")
    if not 0.0 <= args.threshold <= 1.0:  # also refuses nan
        raise ConfigError(f"--threshold {args.threshold} must lie in [0, 1]")
    # refuse a destructive output before training: never over a model without --overwrite, never inside a job
    from holmes.detect.model_io import model_paths
    from holmes.io.outputs import check_output

    if args.out.endswith(("/", os.sep)) or os.path.isdir(args.out):
        raise ConfigError(f"--out {args.out}: is a directory; give a model path such as DIR/NAME")
    for path in model_paths(args.out):
        check_output(path, inputs=args.jobs, overwrite=args.overwrite, kind="file")
    from holmes.progress import terminal_progress, track

    jobs = track(args.jobs, terminal_progress(enabled=not args.quiet), desc="train: reading jobs", unit="job")
    X, y, _ = jobs_dataset(jobs, max_ranks=args.max_ranks, seed=args.seed, context=args.context,
                           scheduler=args.scheduler)
    if X.shape[0] == 0:
        raise ConfigError("the jobs hold no operators")
    det = OperatorDetector(n_estimators=args.n_estimators, criterion=args.criterion, max_depth=args.max_depth,
                           min_samples_leaf=args.min_samples_leaf, threshold=args.threshold,
                           max_samples=200_000, random_state=args.seed).fit(X, y)
    path = det.save(args.out)
    if not args.quiet:
        sys.stderr.write(f"holmes train: {X.shape[0]} ops ({int(y.sum())} abnormal) from {len(args.jobs)} job(s) "
                         f"-> {path}\n")
    return 0
