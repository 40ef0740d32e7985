"""Graph-based localization (§4.3-4.4 of the Holmes paper) as a pipeline of analyses.

``holmes.localize(job, **params) -> Report`` is the one-call front door;
:class:`Localizer` keeps one validated configuration (:class:`LocalizeParams`) for many jobs.
The pipeline (:mod:`~holmes.localize.pipeline`) runs each analysis's steps select -> gather ->
rank, then decides the verdict; the irregular analysis (:mod:`~holmes.localize.irregular.analysis`) is the
paper's: iteration monitor on a pivot rank, abnormal-operator detector, Algorithm 1 on the
communication-operator graph (fetching only the ranks the search visits), cross-iteration MAP
ranking of devices.

Submodules: :mod:`~holmes.localize.params`, :mod:`~holmes.localize.pipeline`,
:mod:`~holmes.localize.irregular.analysis`, :mod:`~holmes.localize.evidence.sources` (progressive fetching),
:mod:`~holmes.localize.evidence.search` (Algorithm 1), :mod:`~holmes.localize.evidence.ranking` (R, MAP, decay,
narrowing), :mod:`~holmes.localize.irregular.healthy` (clearing devices crossed quickly),
:mod:`~holmes.localize.irregular.probe` (network probes), :mod:`~holmes.localize.irregular.host_probe` (GPU or host),
:mod:`~holmes.localize.report`.
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
