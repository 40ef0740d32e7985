"""Graph-based localization (§4.3-4.4 of the Holmes paper) as a pipeline of analyses.

``holmes.localize(job, **params) -> Report`` is the one-call front door;
:class:`Localizer` keeps one validated configuration (:class:`LocalizeParams`) for many jobs.
The pipeline (:mod:`~holmes.localize.pipeline`) runs each analysis's steps select -> gather ->
rank, then decides the verdict; the irregular analysis (:mod:`~holmes.localize.irregular.analysis`) is the
paper's: iteration monitor on a pivot rank, abnormal-operator detector, Algorithm 1 on the
communication-operator graph (fetching only the ranks the search visits), cross-iteration MAP
ranking of devices.

One sub-package per analysis over the evidence they share: :mod:`~holmes.localize.irregular`
(the paper's; two strategies, the whole job compared cell by cell or Algorithm 1 from the pivot),
:mod:`~holmes.localize.persistent` (stragglers against role peers, what-if replay),
:mod:`~holmes.localize.hang` (the wait-for graph of a stuck job) and
:mod:`~holmes.localize.evidence` (the search, the job source, the ranking, the confidence, the
per-rank summary); on top :mod:`~holmes.localize.params`, :mod:`~holmes.localize.pipeline` (the
analysis registry ``ANALYSIS_CLASSES``), :mod:`~holmes.localize.report` and
:mod:`~holmes.localize.mapreduce` (the persistent analysis on Dask).
"""

from holmes.localize.evidence.ranking import (DEFAULT_PRIOR, DeviceRanking, cause_devices, irregularity_rate,
                                              narrow_by_coverage)
from holmes.localize.evidence.search import COMPUTE, NETWORK, GraphSearch, RootCause
from holmes.localize.evidence.sources import JobSource, open_source
from holmes.localize.irregular.analysis import IrregularAnalysis
from holmes.localize.irregular.healthy import HealthyPaths
from holmes.localize.irregular.host_probe import HostProbe
from holmes.localize.irregular.probe import NetworkProbe
from holmes.localize.params import ANALYSES, LocalizeParams
from holmes.localize.pipeline import ANALYSIS_CLASSES, Analysis, Finding, Localizer, Run, localize
from holmes.localize.report import DeviceScore, Report

__all__ = ["localize", "Localizer", "LocalizeParams", "ANALYSES", "ANALYSIS_CLASSES", "Analysis", "Finding", "Run",
           "IrregularAnalysis", "Report", "DeviceScore", "RootCause", "GraphSearch", "COMPUTE", "NETWORK",
           "JobSource", "open_source", "DeviceRanking", "DEFAULT_PRIOR", "cause_devices", "irregularity_rate",
           "narrow_by_coverage", "NetworkProbe", "HostProbe", "HealthyPaths"]
