"""Graph-based localization (§4.3-4.4 of the Holmes paper) as a pipeline of analyses.

``holmes.localize(job, **params) -> Report`` is the one-call front door;
:class:`Localizer` keeps one validated configuration (:class:`LocalizeParams`) for many jobs.
The pipeline (:mod:`~holmes.localize.pipeline`) runs each analysis's steps select -> gather ->
rank, then decides the verdict; the irregular analysis (:mod:`~holmes.localize.irregular`) is the
paper's: iteration monitor on a pivot rank, abnormal-operator detector, Algorithm 1 on the
communication-operator graph (fetching only the ranks the search visits), cross-iteration MAP
ranking of devices.

Submodules: :mod:`~holmes.localize.params`, :mod:`~holmes.localize.pipeline`,
:mod:`~holmes.localize.irregular`, :mod:`~holmes.localize.sources` (progressive fetching),
:mod:`~holmes.localize.search` (Algorithm 1), :mod:`~holmes.localize.ranking` (R, MAP, decay,
narrowing), :mod:`~holmes.localize.healthy` (clearing devices crossed quickly),
:mod:`~holmes.localize.probe` (network probes), :mod:`~holmes.localize.host_probe` (GPU or host),
:mod:`~holmes.localize.report`.
"""

from holmes.localize.healthy import HealthyPaths
from holmes.localize.host_probe import HostProbe
from holmes.localize.irregular import IrregularAnalysis
from holmes.localize.params import ANALYSES, LocalizeParams
from holmes.localize.pipeline import ANALYSIS_CLASSES, Analysis, Finding, Localizer, Run, localize
from holmes.localize.probe import NetworkProbe
from holmes.localize.ranking import DEFAULT_PRIOR, DeviceRanking, cause_devices, irregularity_rate, narrow_by_coverage
from holmes.localize.report import DeviceScore, Report
from holmes.localize.search import COMPUTE, NETWORK, GraphSearch, RootCause
from holmes.localize.sources import JobSource, open_source

__all__ = ["localize", "Localizer", "LocalizeParams", "ANALYSES", "ANALYSIS_CLASSES", "Analysis", "Finding", "Run",
           "IrregularAnalysis", "Report", "DeviceScore", "RootCause", "GraphSearch", "COMPUTE", "NETWORK",
           "JobSource", "open_source", "DeviceRanking", "DEFAULT_PRIOR", "cause_devices", "irregularity_rate",
           "narrow_by_coverage", "NetworkProbe", "HostProbe", "HealthyPaths"]
