"""The map/reduce pieces of full-job work: how a task opens the job, and the job context as a tree.

A task gets a *source* (:func:`job_source`): the job itself in process, the job directory's path on
a cluster, where :func:`open_job` opens it on the worker. :func:`job_context` builds the
:class:`~holmes.detect.JobContext` of every rank as a map (one context per group of ranks,
:func:`context_task`) and an exact reduce (:func:`merge_task`); used by
:mod:`holmes.detect.fulljob` (``holmes detect``) and :mod:`holmes.detect.training` (``holmes train``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from holmes.detect.context import JobContext
from holmes.errors import ConfigError
from holmes.parallel import Executor, get_executor

__all__ = ["job_context", "context_handle", "context_task", "merge_task", "job_source", "open_job", "ranks_of"]


def job_source(job: Any, ex: Executor) -> Any:
    """What a task gets to open the job: the job itself in process, its directory's path on a cluster.

    Raises :class:`ConfigError` for an in-memory job on a cluster (workers read files)."""
    if isinstance(job, (str, os.PathLike)):
        job = str(job)
        if not ex.distributed:
            from holmes.io import read_job

            return read_job(job)
        return job
    if not ex.distributed:
        return job
    path = getattr(job, "path", None)
    if path is None:
        raise ConfigError(f"{job!r}: a distributed run needs a job directory the workers can read, "
                          f"not an in-memory job")
    return str(path)


def open_job(source: Any) -> Any:
    """The job of :func:`job_source` (a path is opened here, on the worker; one rank cached at a time)."""
    if isinstance(source, str):
        from holmes.io import read_job

        return read_job(source, cache_size=1)
    return source


def context_task(ranks: list[int], source: Any) -> JobContext:
    """The map: the context of some ranks, read on the worker."""
    return JobContext.from_job(open_job(source), ranks)


def merge_task(*parts: JobContext) -> JobContext:
    """The reduce: one context of all ``parts`` (exact; none is modified)."""
    return JobContext.merged(parts)


def ranks_of(job: Any, ranks: Sequence[int] | None) -> list[int]:
    """``ranks`` as ints, or every available rank of ``job`` when None."""
    return list(job.available_ranks()) if ranks is None else [int(r) for r in ranks]


def job_context(job: Any, ranks: Sequence[int] | None = None, *, scheduler: Any = None) -> JobContext:
    """The :class:`JobContext` of ``job`` (a path or a Job) from ``ranks`` (default: every available rank).

    With ``scheduler`` (:func:`holmes.parallel.get_executor`) each worker builds the context of a
    group of ranks and the groups are merged on the cluster; the result is the same bit for bit.

    Examples
    --------
    >>> import holmes
    >>> job_context(holmes.read_job("fixtures/gpu16-clean")).n_ranks
    16
    """
    ex = get_executor(scheduler)
    try:
        return ex.fetch(context_handle(job, ranks, ex))
    finally:
        if ex is not scheduler:
            ex.close()


def context_handle(job: Any, ranks: Sequence[int] | None, ex: Executor) -> Any:
    """:func:`job_context` left where ``ex`` built it (a future on a cluster, for the tasks that need it)."""
    src = job_source(job, ex)
    rs = ranks_of(open_job(src) if ranks is None else None, ranks)
    return ex.map_reduce(context_task, rs, merge_task, src)
