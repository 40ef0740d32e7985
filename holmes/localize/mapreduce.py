"""The persistent analysis as map/reduce, for running it distributed (one task per rank).

The persistent analysis reads every rank. Its per-rank work is a pure function of one rank's log,
and its merge an associative, commutative union, so a cluster scheduler (Dask, Ray, a process
pool) can run it::

    from holmes.localize.mapreduce import (persistent_window, persistent_rank_summary,
                                           merge_summaries, localize_summary)
    window = persistent_window(job_path)                                 # driver: the pivot's
    parts = [persistent_rank_summary(job_path, r, window)                # map: one task per rank
             for r in range(world_size)]
    summary = merge_summaries(*parts)                                    # reduce: any grouping
    report = localize_summary(job_path, summary)                         # driver: the report

* :func:`persistent_window` -- the iterations analysed (the pivot's last ``window``);
* :func:`persistent_rank_summary` ``(job, rank, window)`` -- reads one rank and returns a
  :class:`~holmes.localize.persistent.rank.PersistentSummary` of that rank: about 50 bytes per
  operator in the window (no strings, no timestamps), picklable; an unreadable rank is recorded in
  its ``missing`` instead of raising;
* :func:`merge_summaries` ``(*summaries)`` -- the union (associative, commutative; a rank given
  twice is a ``ConfigError``). Everything computed from the merged summary visits ranks in
  ascending order with integer minima and counts, so the report is bit-for-bit the same for every
  grouping and order of the merges, and the same as ``holmes.localize(job, analysis="persistent")``;
* :func:`localize_summary` ``(job, summary, **params)`` -- the report (reads no rank's log but the
  pivot's iteration table); ``params`` as :func:`holmes.localize` (``whatif=False`` skips the
  replay);
* :func:`localize_persistent` ``(job, scheduler=None, **params)`` -- all of the above with the map
  on an executor (:func:`holmes.parallel.get_executor`: this process, or a Dask cluster whose
  workers read the logs from the job directory's path and merge the groups as a tree); the report
  is the in-process one but for ``bytes_read`` (the bytes the report's own process read).

Examples
--------
>>> import holmes
>>> job = holmes.read_job("fixtures/gpu16-clean")
>>> win = persistent_window(job)
>>> left = merge_summaries(*[persistent_rank_summary(job, r, win) for r in range(0, 16, 2)])
>>> right = merge_summaries(*[persistent_rank_summary(job, r, win) for r in range(1, 16, 2)])
>>> localize_summary(job, merge_summaries(right, left)).dumps() == holmes.localize(job, analysis="persistent").dumps()
True
>>> a = localize_persistent("fixtures/gpu16-clean").to_json()          # no scheduler: in this process
>>> b = holmes.localize("fixtures/gpu16-clean", analysis="persistent").to_json()
>>> _ = a.pop("bytes_read"), b.pop("bytes_read")   # this process's reads (the map's tasks read the logs)
>>> a == b
True
"""

from __future__ import annotations

from typing import Any

from holmes.detect.jobmap import job_source, open_job
from holmes.localize.params import LocalizeParams
from holmes.localize.persistent.analysis import PersistentAnalysis
from holmes.localize.persistent.rank import (PersistentSummary, RankSummary, merge_summaries, persistent_rank_summary,
                                             persistent_window)
from holmes.localize.pipeline import Localizer
from holmes.localize.report import Report
from holmes.parallel import get_executor

__all__ = ["persistent_window", "persistent_rank_summary", "merge_summaries", "localize_summary",
           "localize_persistent", "persistent_summary", "PersistentSummary", "RankSummary"]


def localize_summary(job: Any, summary: PersistentSummary, **params: Any) -> Report:
    """The persistent analysis's report from a merged summary built elsewhere.

    Parameters
    ----------
    job : path, Job, MemoryJob or JobSource
        The job the summary is of (its communicators, topology and pivot's iteration table).
    summary : PersistentSummary
        Every rank's summary, merged (:func:`merge_summaries`).
    **params
        Any :class:`~holmes.localize.params.LocalizeParams` field but ``analysis``.

    Returns
    -------
    Report
        The one ``holmes.localize(job, analysis="persistent", **params)`` gives.
    """
    params["analysis"] = "persistent"
    return Localizer(analyses=[PersistentAnalysis(summary)], **params).localize(job)


def _summary_task(ranks: list[int], source: Any, window: Any, thresholds: Any = None) -> PersistentSummary:
    job = open_job(source)
    return merge_summaries(*[persistent_rank_summary(job, r, window, thresholds) for r in ranks])


def persistent_summary(job: Any, window: Any, *, scheduler: Any = None, thresholds: Any = None) -> PersistentSummary:
    """Every rank's persistent summary over ``window``, merged (the map on ``scheduler``'s workers;
    ``thresholds``: a :class:`~holmes.calibration.thresholds.Thresholds`, default the shipped ones)."""
    ex = get_executor(scheduler)
    try:
        src = job_source(job, ex)
        ranks = list(range(open_job(src).world_size))
        return ex.fetch(ex.map_reduce(_summary_task, ranks, merge_summaries, src, window, thresholds))
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
    params["analysis"] = "persistent"
    LocalizeParams(**params)  # bad parameters fail before the cluster is used
    ex = get_executor(scheduler)
    try:
        return Localizer(analyses=[PersistentAnalysis(scheduler=ex)], **params).localize(job)
    finally:
        if ex is not scheduler:
            ex.close()
