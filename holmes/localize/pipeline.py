"""The localization pipeline: one run of named steps that every analysis plugs into.

::

    Localizer(params).localize(job)
      prepare   open the job, resolve the topology and the detector       -> Run
      for each analysis that applies (params.analysis), by its strategy for the job (for_run):
        select  what to explain (irregular: the pivot's irregular iterations beyond the noise)
        gather  evidence (irregular: Algorithm 1 search, probes)
        rank    devices with their confidence, best first
      verdict   culprit | healthy | inconclusive, from every analysis's finding: only devices
                reaching ``min_confidence`` are named
      report    Report (params recorded whole)

An analysis is any object with a ``name`` and the three methods ``select(run)``,
``gather(run, selection)`` and ``rank(run, evidence, selection)`` (:class:`Analysis`); the irregular
analysis of the paper is :class:`~holmes.localize.irregular.analysis.IrregularAnalysis`. A new analysis
(persistent stragglers, hangs) adds its class to :data:`ANALYSIS_CLASSES`, the registry the
pipeline and the report iterate; its devices are merged with the others' in :func:`merge_devices`
(a device found by several analyses is one entry with every kind of evidence).

Examples
--------
>>> import holmes
>>> report = holmes.localize("fixtures/gpu64-3d-slow-gpu")
>>> report.verdict, report.top.id
('culprit', 'gpu:21')
>>> loc = Localizer(top_k=1, delta=1.2)
>>> loc.params.delta, loc.localize("fixtures/gpu16-clean").verdict
(1.2, 'healthy')
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from holmes.calibration.thresholds import or_shipped
from holmes.detect.simple import resolve_detector
from holmes.display import NOT_HEALTHY, SHOWN_ITEMS, SHOWN_RANKS, SUMMARY_RANKS
from holmes.errors import ConfigError
from holmes.localize.evidence.rank_summary import rank_summary
from holmes.localize.evidence.p2p import stages_of
from holmes.localize.evidence.search import GraphSearch, RootCause
from holmes.localize.evidence.sources import JobSource, open_source
from holmes.localize.hang.analysis import HangAnalysis
from holmes.localize.irregular.analysis import IrregularAnalysis
from holmes.localize.params import LocalizeParams
from holmes.localize.persistent.analysis import PersistentAnalysis
from holmes.localize.report import DeviceScore, Report
from holmes.progress import counter

__all__ = ["Localizer", "localize", "Analysis", "Finding", "Run", "ANALYSIS_CLASSES", "merge_devices", "decide_verdict"]

log = logging.getLogger(__name__)


class Analysis(Protocol):
    """The steps an analysis plugs into the pipeline."""

    name: str

    def select(self, run: "Run") -> Any: ...

    def gather(self, run: "Run", selection: Any) -> Any: ...

    def rank(self, run: "Run", evidence: Any, selection: Any) -> list[DeviceScore]: ...

    # optional (a registered analysis has them): reads_every_rank: bool,
    # ends_run(finding) -> bool, report_fields(run, finding) -> dict of Report fields


#: The analysis registry: the analyses by name, in the order ``analysis="all"`` runs them (hang first:
#: it reads every log only when the job can hold ops in flight; once it found a hang, the analyses
#: after it are skipped with an assumption: their timing models need completed iterations). Besides
#: its steps, each class says whether it reads every rank (``reads_every_rank``), whether a finding
#: of it ends the run (``ends_run(finding)``) and which fields of the :class:`Report` its finding
#: fills (``report_fields(run, finding)``); the pipeline and the report iterate this table.
ANALYSIS_CLASSES: dict[str, type] = {c.name: c for c in (HangAnalysis, IrregularAnalysis, PersistentAnalysis)}


@dataclass
class Run:
    """What every step of one localization sees: the parameters, the job, the shared search."""

    params: LocalizeParams
    source: JobSource
    topology: Any
    detector: Any
    search: GraphSearch
    assumptions: list[str] = field(default_factory=list)

    def assume(self, text: str) -> None:
        """Record an assumption or limitation the report shows."""
        self.assumptions.append(text)


@dataclass
class Finding:
    """One analysis's result: its selection, evidence and ranked devices."""

    analysis: str
    selection: Any
    evidence: Any
    devices: list[DeviceScore]


class Localizer:
    """A reusable localization configuration: ``Localizer(**params).localize(job) -> Report``.

    Parameters
    ----------
    params : LocalizeParams, optional
        A ready parameters object; keyword arguments override its fields.
    analyses : sequence of Analysis, optional
        Analysis objects to run instead of those ``params.analysis`` names (platform code can plug
        its own in; each needs ``name``, ``select``, ``gather`` and ``rank``).
    progress : progress factory, optional
        Draws the ranks read as a bar (:mod:`holmes.progress`; the CLI passes one on a terminal).
    calibration : ConfidenceCalibration, path, "default" or None
        Maps the analyses' evidence to each device's ``confidence``, the probability of being a
        root cause (:mod:`holmes.calibration.confidence`; default: the shipped file). None keeps
        the raw evidence scores as confidences (what ``scripts/tune.py`` fits on).
    **kwargs
        Any :class:`~holmes.localize.params.LocalizeParams` field.
    """

    def __init__(self, params: LocalizeParams | None = None, *, analyses: Any = None, progress: Any = None,
                 calibration: Any = "default", **kwargs: Any) -> None:
        if params is not None and not isinstance(params, LocalizeParams):
            raise ConfigError(f"params must be a LocalizeParams, not {type(params).__name__}")
        base = params or LocalizeParams()
        self.params = base.replace(**kwargs) if kwargs else base
        if analyses is not None:
            analyses = list(analyses)
            for a in analyses:
                if not all(hasattr(a, m) for m in ("name", "select", "gather", "rank")):
                    raise ConfigError(f"analysis {a!r} lacks name/select/gather/rank")
        self._analyses = analyses
        self._progress = progress
        self.calibration = _calibration(calibration)

    def __repr__(self) -> str:
        default = LocalizeParams().to_json()
        changed = {k: v for k, v in self.params.to_json().items() if v != default[k]}
        return f"Localizer({', '.join(f'{k}={v!r}' for k, v in changed.items())})"

    def prepare(self, job: Any) -> Run:
        """Open the job and resolve the topology and the detector (the first step)."""
        p = self.params
        src = open_source(job)
        world = src.world_size
        for r in p.pivots:
            if r >= world:
                raise ConfigError(f"pivot rank {r} is outside world_size {world}")
        assumptions: list[str] = []
        meta = getattr(src.job, "meta", None)
        captured = getattr(getattr(meta, "source", None), "warnings", None) or []
        assumptions.extend(f"capture: {w}" for w in captured)  # job.json's source.warnings (the logger's checks)
        topo = _topology(p.topology, src, world, assumptions)
        det = resolve_detector(p.detector, delta=p.delta)
        search = GraphSearch(src, det, late_ratio=p.t.late_ratio, scan_reads=p.scan_reads,
                             follow_waits=p.t.follow_waits, max_steps=p.t.search_max_steps)
        return Run(p, src, topo, det, search, assumptions)

    def analyses(self) -> list[Analysis]:
        """The analyses to run: those given, else those ``params.analysis`` asks for."""
        if self._analyses is not None:
            return list(self._analyses)
        names = list(ANALYSIS_CLASSES) if self.params.analysis == "all" else [self.params.analysis]
        return [ANALYSIS_CLASSES[n]() for n in names]

    def localize(self, job: Any) -> Report:
        """Run every step on ``job`` (a path, Job, MemoryJob or JobSource) and report."""
        run = self.prepare(job)
        findings = []
        hung = False
        with counter(self._progress, total=run.source.world_size, desc="localize", unit="rank") as bar:
            run.source.on_read = lambda r: bar.update(1)
            for a in self.analyses():
                if hung:  # the logs end in ops in flight: the timing analyses do not apply to them
                    run.assume(f"{a.name} analysis skipped: the logs end in a hang (ops in flight)")
                    continue
                if getattr(a, "reads_every_rank", False) and self._analyses is None and \
                        self.params.analysis == "all" and run.source.world_size > self.params.full_read and \
                        named_devices(merge_devices([f.devices for f in findings]), self.params.min_confidence):
                    # it reads every rank: by default only when the analyses before it found no device
                    # on their own evidence scores (or the job is small enough to be read whole anyway,
                    # ``full_read``); not on the calibrated confidences, so that what a large job reads
                    # does not depend on the calibration (a spike at 0.77 calibrated would read all
                    # 131,072 ranks) and the calibration's dataset sees the runs the pipeline makes
                    run.assume(f"{a.name} analysis skipped: the irregular analysis named a device "
                               f"(analysis='{a.name}' runs it anyway)")
                    continue
                choose = getattr(a, "for_run", None)
                if choose is not None:  # its strategy for this job (irregular: read whole, or Algorithm 1)
                    a = choose(run)
                bar.set_description(f"localize: {a.name}")
                sel = a.select(run)
                ev = a.gather(run, sel)
                findings.append(Finding(a.name, sel, ev, a.rank(run, ev, sel)))
                hung = _ends_run(findings[-1])
        run.source.on_read = None
        return self.report(run, findings)

    def _calibrated(self, run: Run, findings: list[Finding]) -> list[DeviceScore]:
        """The analyses' devices merged, with calibrated confidences: the one place the evidence
        scores become probabilities (:mod:`holmes.calibration.confidence`; raw without one)."""
        ranked = merge_devices([f.devices for f in findings])
        if self.calibration is None:
            return ranked
        irr = next((f for f in findings if f.analysis == "irregular"), None)
        return self.calibration.apply(ranked, world_size=run.source.world_size,
                                      whole_job=irr is not None and getattr(irr.evidence, "cells", None) is not None)

    def report(self, run: Run, findings: list[Finding]) -> Report:
        """The merged devices, the verdict and everything read (the last step)."""
        src, p = run.source, run.params
        if src.missing:
            run.assume(f"{len(src.missing)} rank(s) missing or unreadable; the search went around them")
        if run.search.set_aside:
            run.assume(_set_aside_note(run.search.set_aside, p.scan_reads))
        untrusted = _consistency(run)
        ranked = self._calibrated(run, findings)
        sections: dict[str, Any] = {}  # each registered analysis fills its own fields of the report
        for f in findings:
            fill = getattr(ANALYSIS_CLASSES.get(f.analysis), "report_fields", None)
            if fill is not None:
                sections.update(fill(run, f))
        causes: list[RootCause] = sections.get("root_causes", [])
        verdict = decide_verdict(findings, ranked, p.min_confidence)
        slowdown = sections.get("slowdown")
        verdict = _no_quiet_healthy(run, verdict, untrusted, findings)
        named = named_devices(ranked, p.min_confidence)
        if untrusted and verdict == "culprit":
            verdict, named = "inconclusive", []
        if verdict == "healthy" and slowdown is not None and slowdown >= p.t.unexplained_slowdown:
            # one story per report: "healthy" means within the noise *and* near the ideal step
            verdict = "inconclusive"
            run.assume(f"the step is {slowdown:.3f}x the ideal (what-if replay) and no device or imbalance explains "
                       f"it (unexplained_slowdown={p.t.unexplained_slowdown:g}): {NOT_HEALTHY}")
        log.info("localize: verdict %s, %d causes, %d ranks read", verdict, len(causes), len(src.ranks_read))
        return Report(devices=named[:p.top_k], all_devices=ranked, verdict=verdict,
                      candidates=[] if named else ranked[:p.top_k],
                      world_size=src.world_size, fetched=src.ranks_read, missing=dict(src.missing),
                      assumptions=run.assumptions, pivots=p.pivots, bytes_read=src.bytes_read, params=p.to_json(),
                      rank_summary=_rank_summary(run, sections.get("window") or None, verdict), **sections)


def localize(job: Any, **params: Any) -> Report:
    """Rank the devices most likely making a job slow: ``Localizer(**params).localize(job)``.

    Parameters
    ----------
    job : path, Job, MemoryJob or JobSource
    **params
        Any :class:`~holmes.localize.params.LocalizeParams` field (``pivot``, ``window``,
        ``top_k``, ``delta``, ``detector``, ``topology``, ...); each is validated.

    Returns
    -------
    Report

    Raises
    ------
    ConfigError
        A bad parameter (also a ``ValueError``), naming it.
    JobError
        A bad job (the pivot's log missing, a rank outside the world, ...).

    Examples
    --------
    >>> import holmes
    >>> holmes.localize("fixtures/gpu64-3d-slow-gpu", top_k=1).top.id
    'gpu:21'
    """
    return Localizer(**params).localize(job)


def merge_devices(lists: list[list[DeviceScore]]) -> list[DeviceScore]:
    """One entry per device over the analyses' rankings, ordered by :func:`device_order`; a device
    several analyses found keeps its best score and confidence and the union of their evidence."""
    best: dict[str, DeviceScore] = {}
    for devs in lists:
        for d in devs:
            old = best.get(d.id)
            if old is None:
                best[d.id] = d
            else:
                keep = d if d.score > old.score else old
                ev = tuple(dict.fromkeys(old.evidence + d.evidence))
                best[d.id] = DeviceScore(keep.id, keep.kind, keep.score, keep.index, old.causes + d.causes,
                                         confidence=_max(old.confidence, d.confidence),
                                         impact_pct=_impact(old, d, keep),
                                         evidence=ev, coverage=_max(old.coverage, d.coverage),
                                         alike=tuple(dict.fromkeys(old.alike + d.alike)))
    # devices no log tells apart (alike) cost the same: one impact for the group, so that they stay
    # together in the analyses' order (the ranking's prior: a NIC before its cable)
    for d in list(best.values()):
        group = [best[a] for a in d.alike if a in best] + [d]
        imp = [g.impact_pct for g in group if g.impact_pct is not None]
        if imp and d.impact_pct != max(imp):
            best[d.id] = replace(d, impact_pct=max(imp))
    return sorted(best.values(), key=device_order)


def _impact(a: DeviceScore, b: DeviceScore, keep: DeviceScore) -> float | None:
    """The impact of a device two analyses found: the what-if replay's (an analysis class with
    ``replays_impact``) when one was made -- the whole-job comparison's is its events' excess,
    which counts a GPU's extra compute that the step partly hid -- else the higher-scoring
    analysis's, else either."""
    replayed = [x.impact_pct for x in (a, b) if x.impact_pct is not None
                and any(getattr(ANALYSIS_CLASSES.get(n), "replays_impact", False) for n in x.evidence)]
    if replayed:
        return replayed[0]
    if keep.impact_pct is not None:
        return keep.impact_pct
    return a.impact_pct if a.impact_pct is not None else b.impact_pct


def device_order(d: DeviceScore) -> tuple[float, float, float, float]:
    """Best first: the more confident (to 2 decimals), then the one whose impact on the step is
    larger (to 0.1 %: a device that costs every iteration 20 % before one blamed for a few
    irregular iterations, a rank whose stalls cost a quarter of the window before one persistently
    2 % slower; ``impact_pct``), then the one covering more of the evidence (to 2 decimals: a device
    implicated in every irregular iteration before one implicated in some), then the higher score."""
    return (-round(d.confidence or 0.0, 2), -round(max(d.impact_pct or 0.0, 0.0), 1), -round(d.coverage or 0.0, 2),
            -d.score)


def _max(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


def decide_verdict(findings: list[Finding], ranked: list[DeviceScore], min_confidence: float | None = None) -> str:
    """``"culprit"`` when a device reaches ``min_confidence`` (or an analysis that measures no
    confidence names one); ``"healthy"`` when nothing stood out of the job's own noise;
    ``"inconclusive"`` when something did but no device can be named with confidence, and when the
    persistent analysis found a slowdown of at least ``imbalance_pct`` % that no device explains
    (its non-device cause, a pipeline-stage or micro-batch imbalance, is named in the report:
    ``culprit`` with no device would be wrong, ``healthy`` would hide a slowdown worth fixing)."""
    if any(_ends_run(f) for f in findings):
        return "hang"  # ops in flight at the end of the logs: the job hung
    min_confidence = or_shipped(min_confidence, "default_min_confidence")
    if named_devices(ranked, min_confidence):
        return "culprit"
    beyond_noise = any(_beyond_noise(f.selection) for f in findings)
    if any(getattr(f.evidence, "non_device_cause", None) for f in findings):
        return "inconclusive"  # a slowdown with a named non-device cause (stage / micro-batch imbalance)
    return "inconclusive" if beyond_noise or ranked else "healthy"


def _beyond_noise(selection: Any) -> bool:
    """Whether an analysis's selection holds an iteration beyond the job's own noise: its
    ``beyond_noise()`` when it has one (:class:`~holmes.localize.irregular.analysis.Selection`), else any
    positive weight of its ``weights`` (iteration -> weight)."""
    own = getattr(selection, "beyond_noise", None)
    if callable(own):
        return bool(own())
    return any(w > 0 for w in getattr(selection, "weights", {}).values())


def named_devices(ranked: list[DeviceScore], min_confidence: float) -> list[DeviceScore]:
    """The devices a report may name: those reaching ``min_confidence``, and those of an analysis
    that measures no confidence."""
    return [d for d in ranked if d.confidence is None or d.confidence >= min_confidence]


def _ends_run(finding: Finding) -> bool:
    """Whether a finding of a registered analysis ends the run (the hang analysis's, when it found
    ops in flight)."""
    ends = getattr(ANALYSIS_CLASSES.get(finding.analysis), "ends_run", None)
    return bool(ends is not None and ends(finding))


def _rank_summary(run: Run, window: list[int] | None, verdict: str, max_ranks: int = SUMMARY_RANKS) -> list[dict[str, Any]]:
    """Each rank read: compute, waiting and transfer per step against its peers, over the window
    (:mod:`holmes.localize.evidence.rank_summary`; from the logs already in memory; none for a hang)."""
    if verdict == "hang":
        return []
    ranks = run.search.graph.ranks
    tables = {r: ranks[r].table for r in sorted(ranks)[:max_ranks]}
    try:
        return rank_summary(tables, window, stages_of(tables, run.source.communicators))
    except (KeyError, ValueError, TypeError) as exc:  # a table the analyses read but this cannot: say so
        run.assume(f"no per-rank summary: {exc}")
        return []


def _consistency(run: Run) -> bool:
    """Put the consistency pass's findings on the ranks read first among the assumptions; True when
    the localization stands on untrustworthy data: most rows read were excluded, or the pivot's log
    disagrees with another rank's on what happened when."""
    found_log = getattr(run.source.job, "consistency", None)
    if found_log is None:
        return False
    read = set(run.source.ranks_read)
    found = [m for r in sorted(found_log.inconsistencies) if r in read for m in found_log.inconsistencies[r]]
    run.assumptions[:0] = found
    pivots = set(run.params.pivots)
    severe = _plausibility(run, found_log, read)
    if severe:
        run.assume(f"the logs of rank(s) {', '.join(map(str, severe[:SHOWN_RANKS]))}{' ...' if len(severe) > SHOWN_RANKS else ''} cannot "
                   "mean what they say (see above): no verdict stands on them")
        return True
    if found_log.mostly_excluded(read):
        run.assume(f"{100 * found_log.excluded_fraction(read):.0f}% of the rows read were excluded as "
                   "inconsistent: no device is named")
        return True
    if any(a in pivots or b in pivots for a, b, *_ in getattr(found_log, "disagreements", [])):
        run.assume("the pivot's log disagrees with other ranks' on iteration or seq numbers: no device is named")
        return True
    return False


def _ranks_shown(ranks: list[int]) -> str:
    """``"3, 5, 9 ..."``: the first :data:`SHOWN_RANKS` of ``ranks``."""
    return ", ".join(map(str, ranks[:SHOWN_RANKS])) + (" ..." if len(ranks) > SHOWN_RANKS else "")


def _no_quiet_healthy(run: Run, verdict: str, untrusted: bool, findings: list[Finding]) -> str:
    """``inconclusive`` instead of ``healthy`` when the logs cannot be trusted (:func:`_consistency`),
    a rank's log exists but could not be read (it may be the one at fault), or an analysis could
    not compare a rank with any other (its ``no_peer``: a stage of one rank, whose slowness in
    every iteration no log comparison shows); else ``verdict``."""
    if verdict != "healthy":
        return verdict
    if untrusted:
        return "inconclusive"
    unreadable = sorted(getattr(run.source, "unreadable", ()))
    if unreadable:
        run.assume(f"rank(s) {_ranks_shown(unreadable)} could not be read (see above): a healthy verdict cannot "
                   "stand without them")
        return "inconclusive"
    alone = sorted({int(r) for f in findings for r in (getattr(f.evidence, "no_peer", None) or ())})
    if alone:
        run.assume(f"rank(s) {_ranks_shown(alone)} have no peer doing the same work: one of them slow in every "
                   f"iteration would not show: {NOT_HEALTHY}")
        return "inconclusive"
    return verdict


def _plausibility(run: Run, found_log: Any, read: set[int]) -> list[int]:
    """List the cross-rank findings on the ranks read (:mod:`holmes.io.plausibility`) among the
    assumptions; returns the ranks of the severe ones (a truncated log, implausible times)."""
    judge = getattr(found_log, "plausibility", None)
    if judge is None:
        return []
    comms = getattr(run.source.job, "communicators", None) or {}
    members = {cid: getattr(c, "ranks", c) for cid, c in comms.items()}
    issues = judge(read, members)
    job = run.source.job
    if getattr(getattr(job, "meta", None), "parallel", None) is not None and \
            getattr(getattr(job, "meta", None), "communicators", None) is not None:
        from holmes.io.plausibility import layout_contradictions

        issues += layout_contradictions(job.layout, comms)
    for f in issues:
        run.assume(f.message)
    return sorted({r for f in issues if f.severe for r in f.ranks})


def _set_aside_note(scans: list[dict[str, Any]], bound: int) -> str:
    """The assumption naming the group scans the search dropped (:class:`GraphSearch` ``set_aside``).

    >>> note = _set_aside_note([{"iteration": 7, "comm_id": "dp-0", "members": 128, "members_read": 0}], 8)
    >>> note.startswith("1 scan(s)"), note.endswith("dp-0 (iteration 7, 128 members)")
    (True, True)
    """
    shown = ", ".join(f"{s['comm_id']} (iteration {s['iteration']}, {s['members']} members)" for s in scans[:SHOWN_ITEMS])
    more = f" and {len(scans) - SHOWN_ITEMS} more" if len(scans) > SHOWN_ITEMS else ""
    return (f"{len(scans)} scan(s) of large groups for their late member stopped unfinished (more than "
            f"scan_reads={bound} ranks to read) because the iteration's other branches explained it: {shown}{more}")


def _calibration(calibration: Any) -> Any:
    """The confidence calibration: ``"default"`` the shipped one, a path a file, None none, else
    the object given (anything with ``apply(devices, world_size=, whole_job=)``)."""
    if calibration is None or hasattr(calibration, "apply"):
        return calibration
    from holmes.calibration.confidence import ConfidenceCalibration

    return ConfidenceCalibration.load(None if calibration == "default" else calibration)


def _topology(topology: Any, src: JobSource, world: int, assumptions: list[str]) -> Any:
    """The cluster topology: given (object or topology.json path), the job's own, or the default."""
    from holmes.topology import default_topology, load_topology

    topo = load_topology(topology) if isinstance(topology, (str, bytes)) or hasattr(topology, "__fspath__") \
        else topology
    if topo is None:
        topo = src.topology
    if topo is None:
        topo = default_topology(world)
        assumptions.append(f"no topology.json: default rail-optimized two-tier Clos, "
                           f"{topo.gpus_per_host} GPUs per host ({world} GPUs)")
    elif topo.num_gpus < world:
        raise ConfigError(f"topology has {topo.num_gpus} GPUs, the job {world} ranks")
    return topo
