"""Training data from labelled jobs: feature matrices and ``abnormal`` labels per rank.

A labelled job (e.g. from ``holmes simulate``) carries a boolean ``abnormal`` column in every rank
file. :func:`rank_dataset` turns one rank's table into ``(X, y)``; :func:`jobs_dataset` stacks the
ranks of many jobs, sampling at most ``max_ranks`` ranks per job (seeded) so that big jobs do not
drown small ones.

Examples
--------
>>> import numpy as np
>>> from holmes.io.schema import ops_table
>>> t = ops_table(rank=[0] * 4, iteration=[0, 1, 2, 3], op_index=[0] * 4, comm_id=["dp-0"] * 4,
...               seq=[0, 1, 2, 3], op=["all_reduce"] * 4, peer=[None] * 4, nbytes=[8] * 4,
...               start_ns=[0, 100, 200, 300], end_ns=[10, 110, 250, 310],
...               abnormal=np.array([False, False, True, False]))
>>> X, y = rank_dataset(t)
>>> X.shape[0], y.tolist()
(4, [False, False, True, False])
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from holmes.detect.context import JobContext
from holmes.detect.features import DEFAULT_WINDOW, FEATURE_NAMES, operator_features
from holmes.detect.jobmap import context_task, job_source, merge_task, open_job
from holmes.errors import ConfigError, SchemaError
from holmes.parallel import Executor, get_executor

__all__ = ["rank_dataset", "job_dataset", "jobs_dataset", "labels", "f1_precision_recall", "best_threshold",
           "THRESHOLD_GRID"]

log = logging.getLogger(__name__)


def labels(ops: pa.Table, label: str = "abnormal", source: str = "ops") -> np.ndarray:
    """The boolean label column of a rank table; :class:`SchemaError` if absent or null."""
    if label not in ops.column_names:
        raise SchemaError(f"{source}: no '{label}' label column (train on labelled jobs, e.g. simulated ones)")
    col = ops.column(label)
    if col.null_count:
        raise SchemaError(f"{source}: column '{label}' holds {col.null_count} null value(s)")
    if not (pa.types.is_boolean(col.type) or pa.types.is_integer(col.type)):
        raise SchemaError(f"{source}: column '{label}' has type {col.type}, expected bool")
    return np.asarray(col.to_numpy(zero_copy_only=False)).astype(bool)


#: the thresholds :func:`best_threshold` tries by default
THRESHOLD_GRID: tuple[float, ...] = tuple(float(t) for t in np.round(np.arange(0.15, 0.701, 0.025), 3))


def f1_precision_recall(y: np.ndarray, flagged: np.ndarray) -> tuple[float, float, float]:
    """``(F1, precision, recall)`` of boolean flags against boolean labels (0 where undefined)."""
    y, flagged = np.asarray(y, dtype=bool), np.asarray(flagged, dtype=bool)
    tp = float(np.sum(y & flagged))
    p = tp / max(float(flagged.sum()), 1.0)
    r = tp / max(float(y.sum()), 1.0)
    return (2 * p * r / (p + r) if p + r else 0.0), p, r


def best_threshold(y: np.ndarray, proba: np.ndarray, grid: Iterable[float] = THRESHOLD_GRID) -> float:
    """The threshold of ``grid`` whose flags ``proba >= t`` have the best F1 against ``y`` (the
    lowest on ties): how a detector's threshold is chosen on validation jobs.

    Examples
    --------
    >>> best_threshold(np.array([False, True, True]), np.array([0.2, 0.45, 0.9]))
    0.225
    """
    proba = np.asarray(proba)
    return float(max(grid, key=lambda t: f1_precision_recall(y, proba >= t)[0]))


def rank_dataset(ops: pa.Table, *, iteration_times: Any = None, label: str = "abnormal",
                 window: int = DEFAULT_WINDOW, source: str = "ops", context: JobContext | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """``(X, y)`` of one rank: full feature matrix and labels, in table order."""
    y = labels(ops, label, source)
    X = operator_features(ops, iteration_times=iteration_times, window=window, context=context)
    return X, y


def _open(job: Any) -> Any:
    if isinstance(job, (str, os.PathLike)):
        from holmes.io import read_job

        return read_job(job)
    return job


def _rows_task(items: list[tuple[int, bool]], source: Any, ctx: JobContext | None, label: str, window: int,
               use_iterations: bool) -> tuple[np.ndarray, np.ndarray]:
    """The rows of some ranks (``(rank, judged alone)`` pairs), stacked in order (a map task)."""
    j = open_job(source)
    Xs, ys = [], []
    for r, own in items:
        it = j.iteration_times(r) if use_iterations else None
        X, y = rank_dataset(j.ops(r), iteration_times=it, label=label, window=window, source=f"{j!r} rank {r}",
                            context=None if own else ctx)
        Xs.append(X)
        ys.append(y)
    if not Xs:
        return np.zeros((0, len(FEATURE_NAMES)), np.float32), np.zeros(0, bool)
    return np.concatenate(Xs), np.concatenate(ys)


def _counts_task(ranks: list[int], source: Any, label: str) -> np.ndarray:
    j = open_job(source)
    return np.array([_label_count(j, r, label) for r in ranks], dtype=np.int64)


def job_dataset(job: Any, *, ranks: Sequence[int] | None = None, max_ranks: int | None = 64,
                label: str = "abnormal", window: int = DEFAULT_WINDOW, seed: int | None = 0,
                use_iterations: bool = True, context: str = "mixed",
                rank_only_frac: float = 0.25, scheduler: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """Stack :func:`rank_dataset` over ranks of one job (a path or a Job).

    ``ranks`` None: every available rank, or a seeded sample of ``max_ranks`` of them.

    ``context`` chooses the cross-rank features (:mod:`holmes.detect.context`): ``"job"`` builds
    one :class:`JobContext` from every available rank (as ``holmes detect`` does), ``"rank"``
    uses each rank alone (as a detector given one table does), ``"mixed"`` (default) gives a
    seeded ``rank_only_frac`` of the chosen ranks their own context and the others the job's, so
    that one model serves both uses.

    ``scheduler`` (:func:`holmes.parallel.get_executor`): None in this process; a Dask scheduler
    address or client reads the ranks, builds the context and computes the rows on the workers
    (the same rows, bit for bit).
    """
    if context not in ("job", "rank", "mixed"):
        raise ConfigError(f"context must be 'job', 'rank' or 'mixed' (got {context!r})")
    ex = get_executor(scheduler)
    try:
        return _job_dataset(job, ex, ranks, max_ranks, label, window, seed, use_iterations, context, rank_only_frac)
    finally:
        if ex is not scheduler:
            ex.close()


def _job_dataset(job: Any, ex: Executor, ranks: Sequence[int] | None, max_ranks: int | None, label: str,
                 window: int, seed: int | None, use_iterations: bool, context: str, rank_only_frac: float
                 ) -> tuple[np.ndarray, np.ndarray]:
    src = job_source(job, ex)
    j = open_job(src)
    rs = list(ranks) if ranks is not None else j.available_ranks()
    if ranks is None and max_ranks is not None and len(rs) > max_ranks:
        # half of the sample from ranks with labelled abnormal ops (when labels are known), so that
        # faults that touch few ranks still give positives; the rest uniformly
        rng = np.random.default_rng(seed)
        pos: list[int] = []
        try:
            cnt = np.concatenate([np.zeros(0, np.int64)] + list(ex.map(_counts_task, rs, src, label)))
            pos = [r for r, c in zip(rs, cnt.tolist()) if c > 0]
        except (OSError, KeyError, pa.ArrowInvalid):
            pos = []
        k = min(len(pos), max_ranks // 2)
        chosen = set(rng.choice(pos, size=k, replace=False).tolist()) if k else set()
        rest = [r for r in rs if r not in chosen]
        chosen |= set(rng.choice(rest, size=max_ranks - k, replace=False).tolist())
        rs = sorted(chosen)
    ctx = (ex.map_reduce(context_task, j.available_ranks(), merge_task, src)
           if context != "rank" and rs else None)
    alone = np.zeros(len(rs), dtype=bool)
    if context == "rank":
        alone[:] = True
    elif context == "mixed":
        alone = np.random.default_rng(None if seed is None else [seed, 77]).random(len(rs)) < rank_only_frac
    items = [(int(r), bool(own)) for r, own in zip(rs, alone)]
    parts = list(ex.map(_rows_task, items, src, ctx, label, window, use_iterations))
    if not parts:
        return np.zeros((0, len(FEATURE_NAMES)), np.float32), np.zeros(0, bool)
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def jobs_dataset(jobs: Iterable[Any], *, ranks: Sequence[int] | None = None, max_ranks: int | None = 64,
                 label: str = "abnormal", window: int = DEFAULT_WINDOW, seed: int | None = 0,
                 context: str = "mixed", scheduler: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(X, y, job_index)`` stacked over several jobs (``context``, ``scheduler``: see :func:`job_dataset`)."""
    Xs, ys, gs = [], [], []
    ex = get_executor(scheduler)
    try:
        for k, job in enumerate(jobs):
            X, y = job_dataset(job, ranks=ranks, max_ranks=max_ranks, label=label, window=window,
                               seed=None if seed is None else seed + k, context=context, scheduler=ex)
            Xs.append(X)
            ys.append(y)
            gs.append(np.full(len(y), k, dtype=np.int32))
            log.info("job %d: %d rows, %d abnormal", k, len(y), int(y.sum()))
    finally:
        if ex is not scheduler:
            ex.close()
    if not Xs:
        return np.zeros((0, len(FEATURE_NAMES)), np.float32), np.zeros(0, bool), np.zeros(0, np.int32)
    return np.concatenate(Xs), np.concatenate(ys), np.concatenate(gs)



def label_counts(job: Any, label: str = "abnormal") -> np.ndarray:
    """Abnormal ops per rank of a labelled job directory (reads only the label column)."""
    j = _open(job)
    out = np.zeros(j.world_size, dtype=np.int64)
    for r in j.available_ranks():
        out[r] = _label_count(j, r, label)
    return out


def _label_count(j: Any, r: int, label: str) -> int:
    from holmes.io.capped_parquet import read_parquet_capped

    t = read_parquet_capped(j.rank_path(r), where=f"rank {r}", columns=[label]) if hasattr(j, "rank_path") \
        else j.ops(r).select([label])
    return int(np.count_nonzero(t.column(label).to_numpy(zero_copy_only=False)))
