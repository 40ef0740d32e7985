"""The result of a localization: ranked devices, root causes, evidence, what was read.

:meth:`Report.to_json` returns the dict ``holmes localize --format json`` prints (``docs/cli.md`` lists the keys:
``devices``, ``root_causes``, ``irregular_iterations``, ``fetched_ranks``, ``world_size``,
``assumptions``, plus ``missing_ranks``, ``bytes_read``, ``pivots`` and others); :meth:`Report.to_text`
a readable summary.

Examples
--------
>>> r = Report(devices=[DeviceScore("gpu:3", "gpu", 0.8)], world_size=8, fetched=[0, 3], verdict="culprit")
>>> r.top.id, r.to_json()["fetched_ranks"], r.to_json()["verdict"]
('gpu:3', 2, 'culprit')
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from holmes.display import SHOWN_CAUSES, SHOWN_ROWS
from holmes.localize.evidence.search import RootCause

__all__ = ["DeviceScore", "Report"]


@dataclass(frozen=True)
class DeviceScore:
    """One ranked device.

    Attributes
    ----------
    id, kind : str
    score : float
        Normalised score (the devices' scores of one report sum to 1).
    index : float
        The paper's I(d).
    causes : int
        How many root causes implicated it.
    confidence : float or None
        The calibrated probability that the device is a root cause, in [0, 1] (None where no
        analysis measured its evidence).
    impact_pct : float or None
        How much shorter the step would be without the device, % (None where not estimated): the
        persistent analysis's what-if replay; for a device of the irregular analysis's whole-job
        comparison, the excess of the events it best explains over the window's time.
    evidence : tuple of str
        The analyses that found it (``"irregular"``, ...).
    coverage : float or None
        Share of the analysis's evidence that implicates the device (irregular: of the weighted
        irregular iterations with a cause); orders devices equally confident.
    evidence_score : float or None
        The analyses' raw confidence (how far the evidence stands out of the job's noise) when
        ``confidence`` is the calibrated probability (:mod:`holmes.calibration.confidence`).
    alike : tuple of str
        Devices the evidence cannot tell this one apart from (a slow NIC and the NIC at the other
        end of the only transfers both carry, and their cables): one suspicion, listed as its
        members, each with the group's confidence (the probability that the fault is one of them).
    """

    id: str
    kind: str
    score: float
    index: float = 0.0
    causes: int = 0
    confidence: float | None = None
    impact_pct: float | None = None
    evidence: tuple[str, ...] = ()
    coverage: float | None = None
    evidence_score: float | None = None
    alike: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "score": _num(self.score), "index": _num(self.index),
                "causes": self.causes, "confidence": _num(self.confidence), "impact_pct": _num(self.impact_pct),
                "evidence": list(self.evidence), "coverage": _num(self.coverage),
                "evidence_score": _num(self.evidence_score), "alike": list(self.alike)}


def _num(x: float | None) -> float | None:
    """A JSON number rounded to 6 digits, or None for a missing or non-finite value."""
    if x is None or not math.isfinite(x):
        return None
    return round(float(x), 6)


@dataclass
class Report:
    """What :func:`holmes.localize` found.

    Attributes
    ----------
    slowdown : float or None
        Actual over ideal step from the persistent analysis's what-if replay (WIA's S).
    non_device_cause : dict or None
        ``{"kind": "pipeline_stage_imbalance" | "microbatch_imbalance", ...}`` when no device
        explains a slowdown.
    hang : dict or None
        The ``hang`` object (``docs/cli.md``) when ops were in flight at the end of the logs (``communicators``:
        where each is stuck, ``missing`` / ``waiting`` ranks; ``culprit_ranks``; ``explanation``).
    verdict : {"culprit", "healthy", "inconclusive", "hang"}
        ``culprit``: devices are named; ``healthy``: nothing to explain; ``inconclusive``:
        something was irregular but no device could be named with confidence.
    devices : list of DeviceScore
        The top-K devices named (confidence at least ``min_confidence``), best first.
    candidates : list of DeviceScore
        When no device is named: the top-K implicated ones, below the confidence needed.
    all_devices : list of DeviceScore
        Every implicated device, best first.
    root_causes : list of RootCause
    irregular_iterations : list of int
    world_size : int
    fetched : list of int
        Ranks whose logs were read.
    missing : dict
        rank -> reason, ranks whose logs were absent or unreadable.
    assumptions : list of str
    iteration_ns : dict
        The pivot's iteration durations over the window (iteration -> ns; irregular analysis).
    usual_iteration_ns : float or None
        The usual iteration: the irregularity rule's reference (the window's 10th percentile).
    device_cost : dict
        device id -> ``{"excess_ns", "iterations"}``: how much longer than usual, in total, the
        searched irregular iterations whose causes implicate the device were, and how many.
    rank_summary : list of dict
        Per rank read: median compute, waiting and transfer ms per step and its peers'
        (:mod:`holmes.localize.evidence.rank_summary`).
    """

    devices: list[DeviceScore] = field(default_factory=list)
    root_causes: list[RootCause] = field(default_factory=list)
    irregular_iterations: list[int] = field(default_factory=list)
    world_size: int = 0
    fetched: list[int] = field(default_factory=list)
    missing: dict[int, str] = field(default_factory=dict)
    assumptions: list[str] = field(default_factory=list)
    all_devices: list[DeviceScore] = field(default_factory=list)
    pivots: list[int] = field(default_factory=list)
    window: list[int] = field(default_factory=list)
    bytes_read: int = 0
    params: dict[str, Any] = field(default_factory=dict)
    iterations_without_cause: list[int] = field(default_factory=list)
    verdict: str = "healthy"
    candidates: list[DeviceScore] = field(default_factory=list)
    hang: dict[str, Any] | None = None
    slowdown: float | None = None
    non_device_cause: dict[str, Any] | None = None
    iteration_ns: dict[int, int] = field(default_factory=dict)
    usual_iteration_ns: float | None = None
    device_cost: dict[str, dict[str, float]] = field(default_factory=dict)
    rank_summary: list[dict[str, Any]] = field(default_factory=list)

    @property
    def top(self) -> DeviceScore | None:
        """The most likely device, or None when nothing was found."""
        return self.devices[0] if self.devices else None

    def to_json(self, *, evidence: bool = True) -> dict[str, Any]:
        """The JSON object of ``holmes localize --format json``."""
        causes = []
        for c in self.root_causes:
            d = c.to_json()
            if not evidence:
                d.pop("evidence", None)
            causes.append(d)
        return {
            "verdict": self.verdict,
            "devices": [d.to_json() for d in self.devices],
            "root_causes": causes,
            "irregular_iterations": list(self.irregular_iterations),
            "fetched_ranks": len(self.fetched),
            "world_size": self.world_size,
            "assumptions": list(self.assumptions),
            "missing_ranks": {str(r): why for r, why in sorted(self.missing.items())},
            "fetched": list(self.fetched),
            "bytes_read": self.bytes_read,
            "pivots": list(self.pivots),
            "window": [self.window[0], self.window[-1]] if self.window else [],
            "iterations_without_cause": list(self.iterations_without_cause),
            "candidates": [d.to_json() for d in self.candidates],
            "slowdown": _num(self.slowdown),
            "non_device_cause": dict(self.non_device_cause) if self.non_device_cause else None,
            "hang": dict(self.hang) if self.hang else None,
            "rank_summary": [dict(r) for r in self.rank_summary],
            "params": dict(self.params),
            "timing": {"usual_iteration_ns": _num(self.usual_iteration_ns),
                       "iteration_ns": {str(i): int(d) for i, d in sorted(self.iteration_ns.items())},
                       "device_cost": {k: {"excess_ns": _num(v["excess_ns"]), "iterations": int(v["iterations"])}
                                       for k, v in self.device_cost.items()}},
        }

    def rank_rows(self, limit: int | None = SHOWN_ROWS) -> list[dict[str, Any]]:
        """The :attr:`rank_summary` rows worth showing first (the named devices' ranks, then those
        furthest from their peers), at most ``limit`` (None: all), by rank."""
        from holmes.localize.report_text import rank_rows

        return rank_rows(self, limit)

    def dumps(self, **kw: Any) -> str:
        """:meth:`to_json` as strict JSON text (no NaN or Infinity)."""
        return json.dumps(self.to_json(**kw), indent=2, allow_nan=False)

    def to_text(self, max_causes: int = SHOWN_CAUSES, *, show_all: bool = False) -> str:
        """A readable summary (what the CLI prints with ``--format text``; ``show_all``: ``--all``,
        every root cause and implicated device); see :mod:`holmes.localize.report_text`."""
        from holmes.localize.report_text import render_text

        return render_text(self, max_causes=max_causes, show_all=show_all)

    def __str__(self) -> str:
        return self.to_text()

    def to_html(self, job: Any = None, **options: Any) -> str:
        """One self-contained HTML page that opens offline (:func:`holmes.report.render_html`:
        ``job``, the job localized, adds the heatmap of the ranks' slowness and the parallel groups)."""
        from holmes.report.html import render_html

        return render_html(self, job=job, **options)

