"""``holmes detect JOB [--ranks R,...] [--model M] --out FILE.parquet``: flag abnormal operators.

Writes the ops of the chosen ranks (all ranks by default) with two added columns, ``score``
(float64, P(abnormal)) and ``flagged`` (bool, ``score >= threshold``). When the model uses the
cross-rank context features (the shipped one does), every available rank is read once first to build
the job's :class:`~holmes.detect.JobContext`, also when ``--ranks`` scores only a few.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from holmes._ranges import parse_int_ranges
from holmes.errors import ConfigError

log = logging.getLogger(__name__)


def parse_ranks(text: str | None, world_size: int) -> list[int] | None:
    """``"0,3,8-11"`` -> ``[0, 3, 8, 9, 10, 11]``; None -> None (all ranks)."""
    if text is None:
        return None
    try:
        out = parse_int_ranges(text)
    except ValueError:
        raise ConfigError(f"--ranks {text!r}: expected comma-separated ranks or ranges, e.g. 0,3,8-11") from None
    bad = sorted(r for r in out if not 0 <= r < world_size)
    if bad:
        raise ConfigError(f"--ranks: rank {bad[0]} is outside world_size {world_size}")
    if not out:
        raise ConfigError("--ranks lists no rank")
    return out


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", metavar="JOB", help="CommOps job directory")
    p.add_argument("--ranks", metavar="R,...", help="ranks to score (e.g. 0,3,8-11); default: every rank")
    p.add_argument("--model", metavar="M", help="detector model (NAME, NAME.json); default: the shipped model")
    p.add_argument("--threshold", type=float, help="flag ops with score >= this (default: the model's)")
    p.add_argument("--out", required=True, metavar="FILE.parquet", help="output parquet file")


def run(args: argparse.Namespace) -> int:
    from holmes.detect import JobContext, OperatorDetector, load_default_detector
    from holmes.io import read_job

    job = read_job(args.job)
    det = OperatorDetector.load(args.model) if args.model else load_default_detector()
    if args.threshold is not None:
        if not 0.0 <= args.threshold <= 1.0:
            raise ConfigError(f"--threshold {args.threshold} must lie in [0, 1]")
        det.threshold = float(args.threshold)
    ranks = parse_ranks(args.ranks, job.world_size)
    if ranks is None:
        ranks = job.available_ranks()
    # cross-rank evidence from every available rank (one streaming pass), then score the chosen ranks
    context = JobContext.from_job(job) if det.uses_context() else None
    tables = []
    n_flag = 0
    for r in ranks:
        ops = job.ops(r)
        score = det.predict_proba_ops(ops, iteration_times=job.iteration_times(r), context=context)
        flagged = score >= det.threshold
        n_flag += int(flagged.sum())
        tables.append(ops.append_column("score", pa.array(score, pa.float64()))
                      .append_column("flagged", pa.array(flagged, pa.bool_())))
    if not tables:
        raise ConfigError(f"{args.job}: no rank to score")
    schemas = {t.schema for t in tables}
    out = pa.concat_tables(tables, promote_options="permissive") if len(schemas) > 1 else pa.concat_tables(tables)
    dest = Path(args.out)
    if dest.parent and not dest.parent.exists():
        raise ConfigError(f"--out {dest}: directory {dest.parent} does not exist")
    pq.write_table(out, dest, compression="zstd")
    sys.stderr.write(f"holmes detect: {out.num_rows} ops of {len(ranks)} rank(s), {n_flag} flagged -> {dest}\n")
    return 0
