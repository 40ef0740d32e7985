"""Full-job detection: the job's context from every rank, then every chosen rank scored.

What ``holmes detect`` does, as a library: :func:`job_context` builds the cross-rank
:class:`~holmes.detect.JobContext` (a map over ranks and an exact merge), :func:`score_job` scores
the chosen ranks with it (a map) and yields their tables with ``score`` and ``flagged`` columns,
rank by rank. Both take ``scheduler`` (:func:`holmes.parallel.get_executor`): None runs in this
process; a Dask scheduler address or client runs the map on the workers, which read the rank
files themselves from the job directory's path; the merged context stays on the cluster, and only
the scored tables come back, a few at a time. The results are the same bit for bit.

Examples
--------
>>> import holmes
>>> job = holmes.read_job("fixtures/gpu16-clean")
>>> scores = score_job(job, ranks=[0, 5])
>>> [(t.column("rank")[0].as_py(), t.column_names[-2:]) for t in scores]
[(0, ['score', 'flagged']), (5, ['score', 'flagged'])]
>>> scores.n_ops == job.ops(0).num_rows + job.ops(5).num_rows
True
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from holmes.detect.context import JobContext
from holmes.detect.jobmap import context_handle, job_context, job_source, open_job, ranks_of
from holmes.errors import ConfigError
from holmes.parallel import Executor, get_executor

__all__ = ["job_context", "score_job", "write_scores", "JobScores"]

log = logging.getLogger(__name__)


def _score_task(ranks: list[int], source: Any, detector: Any, context: JobContext | None
                ) -> tuple[list[pa.Table], list[str]]:
    job = open_job(source)
    out = []
    for r in ranks:
        ops = job.ops(r)
        score = detector.predict_proba_ops(ops, iteration_times=job.iteration_times(r), context=context)
        out.append(ops.append_column("score", pa.array(score, pa.float64()))
                   .append_column("flagged", pa.array(detector.flag_scores(ops, score) if hasattr(detector, "flag_scores")
                                                 else score >= detector.threshold, pa.bool_())))
    return out, (job.consistency.assumptions() if isinstance(source, str) else [])


class JobScores:
    """The scored tables of :func:`score_job`, one per rank in the order asked (iterate once).

    Attributes
    ----------
    ranks : list of int
        The ranks scored, in order.
    n_ops, n_flagged : int
        Rows yielded so far, and how many of them are flagged.
    assumptions : list of str
        What the consistency pass excluded or repaired in the logs read (complete once iterated).
    """

    def __init__(self, job: Any, detector: Any, ranks: list[int], context: Any, ex: Executor, src: Any,
                 own: bool) -> None:
        self.ranks = ranks
        self.n_ops = 0
        self.n_flagged = 0
        self.assumptions: list[str] = []
        self._job, self._det, self._ctx, self._ex, self._src, self._own = job, detector, context, ex, src, own
        self._used = False

    def __iter__(self) -> Iterator[pa.Table]:
        if self._used:
            raise RuntimeError("JobScores can be iterated once")
        self._used = True
        ex = self._ex
        seen: dict[str, None] = {}
        try:
            det = ex.share(self._det) if ex.distributed else self._det
            for tables, msgs in ex.map(_score_task, self.ranks, self._src, det, self._ctx,
                                       chunk=None if ex.distributed else 1):
                seen.update(dict.fromkeys(msgs))
                for t in tables:
                    self.n_ops += t.num_rows
                    self.n_flagged += int(np.count_nonzero(t.column("flagged").to_numpy(zero_copy_only=False)))
                    yield t
                tables = t = None  # a task's tables are not held while the next task's are fetched
        finally:
            if self._own:
                ex.close()
        if ex.distributed:
            self.assumptions = list(seen)
        else:
            cons = getattr(self._src, "consistency", None)
            self.assumptions = cons.assumptions() if cons is not None else []

    def __repr__(self) -> str:
        return f"JobScores(ranks={len(self.ranks)}, n_ops={self.n_ops}, n_flagged={self.n_flagged})"


def score_job(job: Any, detector: Any = None, *, ranks: Sequence[int] | None = None, context: Any = "job",
              scheduler: Any = None) -> JobScores:
    """Score the ops of ``ranks`` of ``job`` (a path or a Job) with ``detector``, as ``holmes detect`` does.

    Parameters
    ----------
    job : str, path or Job
    detector : OperatorDetector, optional
        Default: :func:`~holmes.detect.load_default_detector`.
    ranks : sequence of int, optional
        Ranks to score, in this order (default: every available rank).
    context : "job", None or JobContext, default "job"
        ``"job"``: the context of every available rank (built first, when the detector uses
        context features); None: each rank judged alone; a :class:`JobContext`: that one.
    scheduler : None, str or distributed.Client
        Where to run (:func:`holmes.parallel.get_executor`); the results are the same bit for bit.

    Returns
    -------
    JobScores
        Iterable of the ranks' tables with ``score`` (float64) and ``flagged`` (bool) appended,
        produced as it is iterated (the tables are not kept).
    """
    if detector is None:
        from holmes.detect.detector import load_default_detector

        detector = load_default_detector()
    if not (isinstance(context, (JobContext, type(None))) or context == "job"):
        raise ConfigError(f"context must be 'job', None or a JobContext, not {context!r}")
    ex = get_executor(scheduler)
    own = ex is not scheduler
    try:
        src = job_source(job, ex)
        local = open_job(src) if not ex.distributed else None
        rs = ranks_of(local if local is not None else open_job(src), ranks)
        if context == "job":
            ctx = context_handle(src, None, ex) if detector.uses_context() else None
        else:
            ctx = ex.share(context) if (ex.distributed and context is not None) else context
    except BaseException:
        if own:
            ex.close()
        raise
    return JobScores(job, detector, rs, ctx, ex, src, own)


def write_scores(scores: Any, path: str | os.PathLike[str], *, compression: str = "zstd") -> int:
    """Write the tables of ``scores`` (e.g. a :class:`JobScores`) to one parquet file as they come;
    returns the rows written. Memory: one table at a time.

    Every table must have the first one's columns (a table whose types differ is cast to the first's
    types, e.g. a dictionary-encoded column to plain strings); :class:`ConfigError` names the rank
    and column otherwise.

    Examples
    --------
    >>> import holmes, pyarrow.parquet as pq, tempfile, os
    >>> out = os.path.join(tempfile.mkdtemp(), "flagged.parquet")
    >>> write_scores(score_job("fixtures/gpu16-clean", ranks=[1, 2]), out) == pq.read_metadata(out).num_rows
    True
    """
    import pyarrow.parquet as pq

    writer = None
    rows = 0
    try:
        for t in scores:
            if writer is None:
                writer = pq.ParquetWriter(str(path), t.schema, compression=compression)
            elif t.schema != writer.schema:
                t = _conform(t, writer.schema)
            writer.write_table(t)
            rows += t.num_rows
    finally:
        if writer is not None:
            writer.close()
    if writer is None:
        raise ConfigError("no rank to score")
    return rows


def _conform(t: pa.Table, schema: pa.Schema) -> pa.Table:
    """``t`` cast to ``schema`` (same columns), or a ConfigError naming the rank and the column."""
    rank = t.column("rank")[0].as_py() if t.num_rows and "rank" in t.column_names else "?"
    if t.column_names != schema.names:
        extra = sorted(set(t.column_names) ^ set(schema.names))
        raise ConfigError(f"rank {rank}: column(s) {extra} differ from the first rank's; the ranks cannot go "
                          f"into one file written as they come (run without --scheduler)")
    try:
        return t.cast(schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        bad = [f.name for f in t.schema if f.type != schema.field(f.name).type]
        raise ConfigError(f"rank {rank}: column(s) {bad} have types {[str(t.schema.field(b).type) for b in bad]}, "
                          f"the first rank's {[str(schema.field(b).type) for b in bad]}; the ranks cannot go "
                          f"into one file") from None
