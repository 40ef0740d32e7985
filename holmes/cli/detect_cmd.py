"""``holmes detect JOB [--ranks R,...] [--detector M] --out FILE.parquet``: flag abnormal operators.

``--model M`` is the same option under its older name.

Writes the ops of the chosen ranks (all ranks by default) with two added columns, ``score``
(float64, P(abnormal)) and ``flagged`` (bool: ``score >= threshold`` and, unless ``--absolute``, standing out
of the scores of the rank's other rows, :func:`holmes.detect.relative.relative_flags`). When the model uses the
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
        out = parse_int_ranges(text, lo=0, hi=world_size)
    except ValueError as exc:
        shown = text if len(text) <= 60 else text[:57] + "..."
        raise ConfigError(f"--ranks {shown!r}: {exc} (expected comma-separated ranks or ranges inside "
                          f"world_size {world_size}, e.g. 0,3,8-11)") from None
    if not out:
        raise ConfigError("--ranks lists no rank")
    return out


def _plain(t: pa.Table) -> pa.Table:
    """Dictionary-encoded columns decoded to their value type (ranks may differ in encoding)."""
    for i, f in enumerate(t.schema):
        if pa.types.is_dictionary(f.type):
            t = t.set_column(i, pa.field(f.name, f.type.value_type, nullable=f.nullable),
                             t.column(i).cast(f.type.value_type))
    return t


def _concat(tables: list[pa.Table], ranks: list[int]) -> pa.Table:
    """One table from every rank's scored ops, whatever their extra columns and encodings."""
    if len({t.schema for t in tables}) == 1:
        return pa.concat_tables(tables)
    plain = [_plain(t) for t in tables]
    try:
        return pa.concat_tables(plain, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        base = plain[0].schema
        for r, t in zip(ranks, plain):
            for f in t.schema:
                if f.name in base.names and base.field(f.name).type != f.type:
                    raise ConfigError(f"rank {r}: extra column '{f.name}' has type {f.type}, rank {ranks[0]} has "
                                      f"{base.field(f.name).type}; the ranks cannot go into one file") from None
        raise ConfigError(f"the ranks' tables cannot go into one file: {exc}") from None


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", metavar="JOB", help="CommOps job directory")
    p.add_argument("--ranks", metavar="R,...", help="ranks to score (e.g. 0,3,8-11); default: every rank")
    p.add_argument("--detector", "--model", dest="model", metavar="M",
                   help="detector model (NAME, NAME.json, as written by holmes train); default: the shipped model. "
                        "--detector as in holmes localize; --model is the same option's older name")
    p.add_argument("--threshold", type=float, help="flag ops with score >= this (default: the model's)")
    p.add_argument("--absolute", action="store_true",
                   help="flag every op with score >= threshold (the paper's rule); default: only those that also "
                        "stand out of the scores of the rank's other ops (the threshold follows the job)")
    p.add_argument("--out", required=True, metavar="FILE.parquet",
                   help="output parquet file (never inside JOB; an existing file needs --overwrite)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="run on a Dask cluster (tcp://host:8786; needs holmes[dask]): the workers read the rank "
                        "files from JOB's path and the scored ranks are written as they come; same output")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars and no summary line on stderr")


def run(args: argparse.Namespace) -> int:
    from holmes.detect import JobContext, OperatorDetector, load_default_detector
    from holmes.io import read_job
    from holmes.io.outputs import atomic_file, check_output
    from holmes.progress import terminal_progress, track

    bars = terminal_progress(enabled=not args.quiet)

    # refuse a destructive output before any work: never inside the job, never over a file without --overwrite
    inputs = [args.job] + ([args.model] if args.model else [])
    check_output(args.out, inputs=[args.job], overwrite=args.overwrite, kind="file")
    job = read_job(args.job)
    det = OperatorDetector.load(args.model) if args.model else load_default_detector()
    if args.threshold is not None:
        if not 0.0 <= args.threshold <= 1.0:
            raise ConfigError(f"--threshold {args.threshold} must lie in [0, 1]")
        det.threshold = float(args.threshold)
    det.relative = not getattr(args, "absolute", False)
    ranks = parse_ranks(args.ranks, job.world_size)
    if ranks is None:
        ranks = job.available_ranks()
    if args.scheduler:
        return _run_distributed(args, job, det, ranks, inputs)
    # cross-rank evidence from every available rank (one streaming pass), then score the chosen ranks
    context = JobContext.from_job(job, track(job.available_ranks(), bars, desc="detect: context", unit="rank")) \
        if det.uses_context() else None
    tables = []
    n_flag = 0
    for r in track(ranks, bars, desc="detect: scoring", unit="rank"):
        ops = job.ops(r)
        score = det.predict_proba_ops(ops, iteration_times=job.iteration_times(r), context=context)
        flagged = det.flag_scores(ops, score)
        n_flag += int(flagged.sum())
        tables.append(ops.append_column("score", pa.array(score, pa.float64()))
                      .append_column("flagged", pa.array(flagged, pa.bool_())))
    if not tables:
        raise ConfigError(f"{args.job}: no rank to score")
    out = _concat(tables, ranks)
    dest = Path(args.out)
    with atomic_file(dest, inputs=inputs, overwrite=args.overwrite) as tmp:
        pq.write_table(out, tmp, compression="zstd")
    for msg in job.consistency.assumptions():  # what the consistency pass excluded or repaired
        sys.stderr.write(f"holmes detect: warning: {msg}\n")
    if not args.quiet:
        sys.stderr.write(f"holmes detect: {out.num_rows} ops of {len(ranks)} rank(s), {n_flag} flagged -> {dest}\n")
    return 0


def _run_distributed(args: argparse.Namespace, job, det, ranks: list[int], inputs: list[str]) -> int:
    """``--scheduler``: the context and the scores computed on the Dask workers, written as they come."""
    from holmes.detect.fulljob import score_job, write_scores
    from holmes.io.outputs import atomic_file

    if not ranks:
        raise ConfigError(f"{args.job}: no rank to score")
    dest = Path(args.out)
    scores = score_job(job, det, ranks=ranks, scheduler=args.scheduler)
    with atomic_file(dest, inputs=inputs, overwrite=args.overwrite) as tmp:
        write_scores(scores, tmp)
    for msg in scores.assumptions:  # what the consistency pass excluded or repaired, on the workers
        sys.stderr.write(f"holmes detect: warning: {msg}\n")
    if not getattr(args, "quiet", False):
        sys.stderr.write(f"holmes detect: {scores.n_ops} ops of {len(ranks)} rank(s), {scores.n_flagged} flagged "
                         f"-> {dest}\n")
    return 0
