"""Graph-based localization (§4.3-4.4 of the Holmes paper).

``localize(job, ...) -> Report`` strings together the iteration monitor on a pivot rank, the
abnormal-operator detector, Algorithm 1 on the communication-operator graph (fetching only the
ranks the search visits) and the cross-iteration MAP ranking of devices.

Submodules: :mod:`~holmes.localize.sources` (progressive fetching), :mod:`~holmes.localize.detectors`,
:mod:`~holmes.localize.search` (Algorithm 1), :mod:`~holmes.localize.ranking` (R, MAP, decay,
narrowing), :mod:`~holmes.localize.healthy` (clearing devices crossed quickly),
:mod:`~holmes.localize.probe` (network probes), :mod:`~holmes.localize.host_probe` (GPU or host),
:mod:`~holmes.localize.report`, :mod:`~holmes.localize.baselines` (RW, Seer-like).
"""

from holmes.localize.api import irregular_mask, localize
from holmes.localize.detectors import Detector, LabelDetector, RobustDetector, resolve_detector
from holmes.localize.healthy import HealthyPaths
from holmes.localize.host_probe import HostProbe
from holmes.localize.probe import NetworkProbe
from holmes.localize.ranking import DEFAULT_PRIOR, DeviceRanking, cause_devices, irregularity_rate, narrow_by_coverage
from holmes.localize.report import DeviceScore, Report
from holmes.localize.search import COMPUTE, NETWORK, GraphSearch, RootCause
from holmes.localize.sources import JobSource, open_source

__all__ = ["localize", "Report", "DeviceScore", "RootCause", "GraphSearch", "COMPUTE", "NETWORK", "JobSource",
           "open_source", "Detector", "LabelDetector", "RobustDetector", "resolve_detector", "DeviceRanking",
           "DEFAULT_PRIOR", "cause_devices", "irregularity_rate", "irregular_mask", "narrow_by_coverage",
           "NetworkProbe", "HostProbe", "HealthyPaths"]


def _make_callable() -> None:
    """``holmes.localize`` is both this package and the function: once the package is imported,
    Python binds the attribute ``holmes.localize`` to the module, so the module itself forwards
    calls to :func:`localize` (``holmes.localize(job)`` works either way)."""
    import sys
    import types

    class _CallableModule(types.ModuleType):
        def __call__(self, *args, **kwargs):  # noqa: ANN002, ANN003
            return localize(*args, **kwargs)

    sys.modules[__name__].__class__ = _CallableModule


_make_callable()
