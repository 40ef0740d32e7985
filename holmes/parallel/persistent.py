"""The persistent analysis with its per-rank work on a Dask cluster.

The persistent analysis reads every rank. :mod:`holmes.localize.mapreduce` gives it as a map
(:func:`~holmes.localize.mapreduce.persistent_rank_summary`, one rank's compact summary) and an
associative union (:func:`~holmes.localize.mapreduce.merge_summaries`); :func:`localize_persistent`
runs the map on the workers of an :class:`~holmes.parallel.Executor` (each task summarizes a group
of ranks, reading their logs from the job directory's path), merges the groups as a tree on the
cluster, and localizes the merged summary here. The report is bit for bit the one
``holmes.localize(job, analysis="persistent", ...)`` gives, but for ``bytes_read`` (the bytes the
report's own process read: the logs are read by the map's tasks).

Examples
--------
>>> import holmes
>>> a = localize_persistent("fixtures/gpu16-clean").to_json()          # no scheduler: in this process
>>> b = holmes.localize("fixtures/gpu16-clean", analysis="persistent").to_json()
>>> _ = a.pop("bytes_read"), b.pop("bytes_read")   # this process's reads (the map's tasks read the logs)
>>> a == b
True
"""

from __future__ import annotations

import logging
from typing import Any

from holmes.detect.jobmap import job_source, open_job
from holmes.localize.mapreduce import localize_summary, merge_summaries, persistent_rank_summary, persistent_window
from holmes.localize.params import LocalizeParams
from holmes.localize.persistent_rank import PersistentSummary
from holmes.localize.report import Report
from holmes.parallel import get_executor

__all__ = ["localize_persistent", "persistent_summary"]

log = logging.getLogger(__name__)


def _summary_task(ranks: list[int], source: Any, window: Any) -> PersistentSummary:
    job = open_job(source)
    return merge_summaries(*[persistent_rank_summary(job, r, window) for r in ranks])


def persistent_summary(job: Any, window: Any, *, scheduler: Any = None) -> PersistentSummary:
    """Every rank's persistent summary over ``window``, merged (the map on ``scheduler``'s workers)."""
    ex = get_executor(scheduler)
    try:
        src = job_source(job, ex)
        ranks = list(range(open_job(src).world_size))
        return ex.fetch(ex.map_reduce(_summary_task, ranks, merge_summaries, src, window))
    finally:
        if ex is not scheduler:
            ex.close()


def localize_persistent(job: Any, *, scheduler: Any = None, **params: Any) -> Report:
    """``holmes.localize(job, analysis="persistent", **params)`` with the per-rank work on ``scheduler``.

    Parameters
    ----------
    job : str or path or Job
        A job directory (a path the workers can read) or a Job read from one.
    scheduler : None, str, distributed.Client or Executor
        See :func:`holmes.parallel.get_executor`; None runs in this process.
    **params
        Any :class:`~holmes.localize.LocalizeParams` field but ``analysis``.
    """
    p = LocalizeParams(**{**params, "analysis": "persistent"})
    window = persistent_window(job, p.pivot, p.window)
    summary = persistent_summary(job, window, scheduler=scheduler)
    params.pop("analysis", None)
    return localize_summary(job, summary, **params)
