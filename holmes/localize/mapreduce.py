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
  :class:`~holmes.localize.persistent_rank.PersistentSummary` of that rank: about 50 bytes per
  operator in the window (no strings, no timestamps), picklable; an unreadable rank is recorded in
  its ``missing`` instead of raising;
* :func:`merge_summaries` ``(*summaries)`` -- the union (associative, commutative; a rank given
  twice is a ``ConfigError``). Everything computed from the merged summary visits ranks in
  ascending order with integer minima and counts, so the report is bit-for-bit the same for every
  grouping and order of the merges, and the same as ``holmes.localize(job, analysis="persistent")``;
* :func:`localize_summary` ``(job, summary, **params)`` -- the report (reads no rank's log but the
  pivot's iteration table); ``params`` as :func:`holmes.localize` (``whatif=False`` skips the
  replay).

Examples
--------
>>> import holmes
>>> job = holmes.read_job("fixtures/gpu16-clean")
>>> win = persistent_window(job)
>>> left = merge_summaries(*[persistent_rank_summary(job, r, win) for r in range(0, 16, 2)])
>>> right = merge_summaries(*[persistent_rank_summary(job, r, win) for r in range(1, 16, 2)])
>>> localize_summary(job, merge_summaries(right, left)).dumps() == holmes.localize(job, analysis="persistent").dumps()
True
"""

from __future__ import annotations

from typing import Any

from holmes.localize.persistent import PersistentAnalysis
from holmes.localize.persistent_rank import (PersistentSummary, RankSummary, merge_summaries, persistent_rank_summary,
                                             persistent_window)
from holmes.localize.pipeline import Localizer
from holmes.localize.report import Report

__all__ = ["persistent_window", "persistent_rank_summary", "merge_summaries", "localize_summary",
           "PersistentSummary", "RankSummary"]


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
