"""The irregular analysis (the paper's Holmes, §4.3-4.4): explain the pivot's slow iterations.

Its steps, as :class:`~holmes.localize.pipeline.Localizer` runs them:

1. **select** -- the pivot's irregular iterations in the window (the delta rule and the rules
   for faults costing a few percent: :mod:`~holmes.localize.irregular.iteration_rules`), each weighed by how far it stands above the job's
   healthy spread (:func:`~holmes.localize.evidence.confidence.iteration_weights`); those within the noise
   are not searched; at most ``max_iterations`` of the most irregular;
2. **gather** -- per chosen iteration, Algorithm 1 from the monitored ranks' abnormal operators
   (:class:`~holmes.localize.evidence.search.GraphSearch`, fetching only the ranks it visits); per root
   cause its irregularity rate R and the devices it implicates, after clearing devices crossed
   quickly (:mod:`~holmes.localize.irregular.healthy`), the network probes (:mod:`~holmes.localize.irregular.probe`)
   and the host probe (:mod:`~holmes.localize.irregular.host_probe`); network causes narrowed by coverage;
3. **rank** -- MAP accumulation over the causes with the topology decay
   (:class:`~holmes.localize.evidence.ranking.DeviceRanking`), hosts explained away by their GPUs; each
   device's confidence against how often chance would blame it
   (:func:`~holmes.localize.evidence.confidence.confidences`) and the share of the irregular iterations
   that implicate it; the pipeline orders devices by confidence, that share, then score.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from holmes.detect.monitor import IrregularityRule
from holmes.display import SHOWN_RANKS, SHOWN_TRANSIENTS
from holmes.errors import JobError
from holmes.localize.evidence.confidence import confidences, iteration_weights, network_opportunity, weighted_hits
from holmes.localize.evidence.ranking import DeviceRanking, irregularity_rate, narrow_by_coverage
from holmes.localize.evidence.search import COMPUTE, NETWORK, GraphSearch, RootCause
from holmes.localize.irregular.cause_filter import (computed_longer, drop_diffuse, drop_minor, drop_stalls,
                                                    drop_unproven, drop_usual_compute, explains, one_off_stall,
                                                    proven_devices)
from holmes.localize.irregular.cells import CellEvidence, Event, device_pvalues
from holmes.localize.irregular.explain import explain_iteration, implicated_devices
from holmes.localize.irregular.healthy import HealthyPaths
from holmes.localize.irregular.host_probe import HostProbe
from holmes.localize.irregular.iteration_rules import flag_iterations
from holmes.localize.irregular.probe import NetworkProbe
from holmes.localize.irregular.transfer import TransferTimes
from holmes.localize.report import DeviceScore
from holmes.stats import P_FLOOR, TIE_RTOL
from holmes.topology import kinds
from holmes.units import NS_PER_MS

__all__ = ["IrregularAnalysis", "PivotSearch", "WholeJobComparison", "Selection", "Evidence"]

log = logging.getLogger(__name__)



@dataclass
class Selection:
    """What the irregular analysis explains: the pivot's window and its irregular iterations."""

    window: np.ndarray            # iteration numbers of the analysed window
    durations: np.ndarray         # the pivot's iteration durations over the window (ns)
    irregular: np.ndarray         # the irregular iterations
    chosen: np.ndarray            # those searched (beyond the noise; at most ``max_iterations``)
    weights: dict[int, float] = field(default_factory=dict)  # irregular iteration -> weight in [0, 1]
    z: np.ndarray | None = None   # every window iteration's z-score over the healthy spread
    #: a device must be implicated in this many searched iterations (the repeat rule: none
    #: alone is beyond the noise, their agreement is the evidence)
    min_hits: int = 0
    #: irregular iterations only a few sigmas out (``candidate_z``): their causes must stand out
    #: of their own rank's noise, and unexplained they are noise
    candidates: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    #: leading window iterations that are the job's warm-up (the threshold ``warmup_iterations``)
    warmup: int = 0

    @property
    def usual(self) -> np.ndarray:
        """The window's iterations that are not irregular: the job's usual level."""
        return self.window[~np.isin(self.window, self.irregular)]

    def beyond_noise(self) -> bool:
        """Whether an iteration searched stood out of the job's own noise on its own (those
        searched for their repeats, ``min_hits``, and the ``candidates`` did not)."""
        cand = set(self.candidates.tolist())
        return not self.min_hits and any(w > 0 for i, w in self.weights.items() if i not in cand)


@dataclass
class Evidence:
    """What the search found: root causes and the devices each implicates."""

    causes: list[RootCause] = field(default_factory=list)
    implicated: list[list[str]] = field(default_factory=list)
    without_cause: list[int] = field(default_factory=list)
    #: the same procedure on regular iterations (the job's own null): per iteration with a cause,
    #: the devices its causes implicate
    null_devices: list[set[str]] = field(default_factory=list)
    #: irregular iterations in which ranks of several hosts computed longer together (a
    #: common-mode slowdown: no device explains them)
    common: list[int] = field(default_factory=list)
    #: a job read whole: every device's cells against the job's noise, and what stood out
    cells: CellEvidence | None = None
    events: list[Event] = field(default_factory=list)
    #: devices implicated by a candidate iteration's cause that stood out of its rank's noise
    #: (they need no repeat: ``Selection.min_hits``)
    proven: set[str] = field(default_factory=set)


class IrregularAnalysis:
    """Explain the pivot's delta-irregular iterations (select -> gather -> rank) by one of two
    strategies, chosen per job by :meth:`for_run` (the pipeline asks it before the steps):
    :class:`WholeJobComparison` when the job is read whole (``world_size <= full_read``), else
    :class:`PivotSearch`, Algorithm 1 on the detector's operator labels. Its own ``select`` and
    ``gather`` go to that strategy; ``rank`` is the same for both."""

    name = "irregular"
    reads_every_rank = False

    @staticmethod
    def ends_run(finding: Any) -> bool:
        """Never: the analyses after it still apply."""
        return False

    @staticmethod
    def report_fields(run: Any, finding: Any) -> dict[str, Any]:
        """The report's root causes, irregular iterations, window, iterations without a cause and
        timing facts (:func:`report_timing`); when the detector's operator flags steered Algorithm 1,
        says so among the first assumptions (a job compared cell by cell, or one with nothing
        searched, used no operator label)."""
        sel, ev = finding.selection, finding.evidence
        if getattr(ev, "cells", None) is None and len(sel.chosen):
            run.assumptions.insert(min(1, len(run.assumptions)),
                                   "abnormal operators flagged by " + " ".join(repr(run.detector).split()))
        return {"root_causes": ev.causes, "irregular_iterations": [int(i) for i in sel.irregular],
                "window": [int(i) for i in sel.window], "iterations_without_cause": ev.without_cause,
                **report_timing(sel, ev, run.params.delta)}

    def for_run(self, run: Any) -> IrregularAnalysis:
        """The strategy for this job: :class:`WholeJobComparison` when every rank is read
        (``full_read``), else :class:`PivotSearch`."""
        p = run.params
        return WholeJobComparison() if p.full_read and run.source.world_size <= p.full_read else PivotSearch()

    def select(self, run: Any) -> Selection:
        """The window of the pivot's iterations and its irregular ones (by the job's strategy)."""
        return self.for_run(run).select(run)

    def gather(self, run: Any, sel: Selection) -> Evidence:
        """Root causes of the chosen iterations and the devices each implicates (by the job's strategy)."""
        return self.for_run(run).gather(run, sel)

    def _null(self, run: Any, sel: Selection, ev: Evidence, healthy: HealthyPaths | None, ref: float,
              transfers: TransferTimes | None) -> None:
        """Run the search on up to ``null_iterations`` regular iterations (evenly spread): what
        the procedure blames when nothing is wrong is the chance level a device must beat."""
        p, search, topo = run.params, run.search, run.topology
        # clearly regular iterations: not irregular, not next to an irregular one (a delay late in
        # one iteration spills into the next), and within the noise themselves
        near = np.concatenate([sel.irregular - 1, sel.irregular, sel.irregular + 1])
        calm = sel.z < p.t.noise_z - 1 if sel.z is not None else np.ones(sel.window.size, bool)
        regular = sel.window[~np.isin(sel.window, near) & calm]
        if p.t.null_iterations == 0 or regular.size == 0:
            return
        pick = regular[np.unique(np.linspace(0, regular.size - 1, min(p.t.null_iterations, regular.size)).astype(int))]
        # a regular iteration is judged as if it had just made the cut: its excess is at least
        # the smallest an irregular one has ((delta - 1) x the reference ``ref``)
        excess = dict(zip(sel.window.tolist(), np.maximum(sel.durations - ref, (p.delta - 1) * ref).tolist()))
        usual = sel.usual
        for it in pick.tolist():
            with search.fetched_only():  # chance is judged on the ranks the real search read
                found = explain_iteration(run, it, excess.get(it, 0.0), transfers)
            # (the same rules as the real causes': one that cost its rank a trifle explains nothing,
            # nor a rank that computed as usual)
            found = [c for c in found or () if explains(search.graph.ranks[c.rank], c, excess.get(it, 0.0),
                                                         p.t.cause_share, usual, min_usual=p.t.cause_min_iterations)
                     and computed_longer(search.graph.ranks[c.rank], c, p.t.compute_z, usual,
                                         min_usual=p.t.cause_min_iterations)
                     and not one_off_stall(search.graph.ranks, c, p.t.cell_transient, p.t.cell_usual_q,
                                           p.t.transient_min_ops)]
            if not found:
                continue
            devs: set[str] = set()
            for c in found:
                ro = search.graph.ranks[c.rank]
                devs.update(implicated_devices(c, ro, topo, healthy=healthy, hprobe=None, probe=None,
                                               include_host=p.t.include_host, min_share=p.t.exonerate_bytes,
                                               speedup=p.t.exonerate_speedup))
            ev.null_devices.append(devs)

    def rank(self, run: Any, ev: Evidence, sel: Selection) -> list[DeviceScore]:
        """Every implicated device: MAP over the causes' rates with the topology decay, and its
        confidence against how often chance would blame it; ordered by confidence, then score
        (a job read whole: :func:`rank_cells`)."""
        p, topo = run.params, run.topology
        if ev.cells is not None:
            span = float(np.sum(sel.durations)) if len(getattr(sel, "durations", ())) else None
            return rank_cells(ev, p.t.tail_calibration, self.name, point_calibration=p.t.point_calibration,
                              span_ns=span)
        ranking = DeviceRanking(method=p.method, prior=p.prior, alpha=p.alpha, decay=topo.decay, thresholds=p.t)
        for c, devs in zip(ev.causes, ev.implicated):
            ranking.add(devs, c.rate)
        if p.t.include_host:
            gpus_of: dict[str, list[str]] = {}
            for d in ranking.sums:
                if kinds.is_kind(d, "gpu"):
                    gpus_of.setdefault(kinds.host(topo.host_of(kinds.number(d))), []).append(d)
            ranking.explain_away(gpus_of)
        index = ranking.index()
        hits, n = weighted_hits([c.iteration for c in ev.causes], ev.implicated, sel.weights)
        conf = self.confidence(run, ev, hits, n)
        alike = same_causes(ev.implicated)
        # devices implicated by exactly the same causes are one suspicion (the evidence cannot tell
        # a slow transfer's two NICs apart; their chance of being blamed differs, not the evidence):
        # each is listed with the group's confidence, as alike
        for d, group in alike.items():
            best = max((conf[a] for a in (d, *group) if conf.get(a) is not None), default=None)
            if best is not None:
                conf[d] = best
        return [DeviceScore(d, kinds.kind_of(d), s, index.get(d, 0.0), ranking.counts.get(d, 0),
                            confidence=conf.get(d), evidence=(self.name,), alike=alike.get(d, ()),
                            coverage=hits.get(d, 0.0) / n if n > 0 else None) for d, s in ranking.ranked()
                if hits.get(d, 0.0) >= sel.min_hits - TIE_RTOL or d in ev.proven]

    @staticmethod
    def confidence(run: Any, ev: Evidence, hits: dict[str, float], n: float) -> dict[str, float]:
        """Per implicated device, ``1 - P(chance blames it as often)`` from its weighted ``hits``
        out of ``n`` weighted iterations."""
        if not hits:
            return {}
        src = run.source
        share = network_opportunity(src.communicators, run.topology,
                                    max_groups=run.params.t.opportunity_max_groups) if any(
            not kinds.is_compute(d) for d in hits) else {}
        null_hits: dict[str, int] = {}
        for devs in ev.null_devices:
            for d in devs:
                null_hits[d] = null_hits.get(d, 0) + 1
        return confidences(hits, n, src.world_size, run.topology, share, null_hits=null_hits,
                           null_n=len(ev.null_devices), prior_weight=run.params.t.null_prior_weight)


class PivotSearch(IrregularAnalysis):
    """The paper's path: Algorithm 1 from the pivot's irregular iterations on the detector's
    operator labels, fetching only the ranks the search visits (every job over ``full_read``)."""

    #: whether every rank is read (the iteration rules judge a job read whole by its cells)
    whole_job = False

    def for_run(self, run: Any) -> IrregularAnalysis:
        """This strategy, whatever the job's size (the pipeline chose it)."""
        return self

    def select(self, run: Any) -> Selection:
        """The window of the pivot's iterations and its irregular ones (the iteration rules know
        whether the job is read whole: ``whole_job``)."""
        p = run.params
        search = run.search
        if search.rank_ops(p.pivot) is None:
            raise JobError(f"pivot rank {p.pivot}: {run.source.missing.get(p.pivot, 'log unavailable')}")
        it_all, dur_all = _iteration_times(run.source, p.pivot)
        its, durs = it_all[-p.window:], dur_all[-p.window:].astype(float)
        flags = flag_iterations(its, durs, p, self.whole_job, run.assume)
        mask, z = flags.irregular, flags.z
        irregular = its[mask]
        w = iteration_weights(z[mask], p.t.noise_z)
        weights = {int(i): float(x) for i, x in zip(irregular, w)}
        if len(its) < p.t.rate_min_iterations:
            run.assume(f"only {len(its)} iteration(s) in the window: irregularity rates are unreliable")
        chosen = irregular[w > 0]
        warm = its[its < int(it_all[0]) + p.t.warmup_iterations]
        if np.isin(chosen, warm).any():
            run.assume(f"irregular iteration(s) {', '.join(map(str, chosen[np.isin(chosen, warm)].tolist()))} are the "
                       f"job's warm-up (its first {p.t.warmup_iterations} iterations): not searched")
            chosen = chosen[~np.isin(chosen, warm)]
        if p.search_from is not None and len(its) and int(its[0]) < p.search_from:
            # the iterations before search_from are context: the noise and the usual step, not explained
            context = its[its < p.search_from]
            run.assume(f"iterations {int(context[0])}-{int(context[-1])} are context (search_from={p.search_from}): "
                       "judged part of the job's noise and usual step, not searched")
            chosen = chosen[chosen >= p.search_from]
            weights = {i: x for i, x in weights.items() if i >= p.search_from}
            warm = context if context.size > warm.size else warm
        if (w <= 0).any():
            run.assume(f"{int((w <= 0).sum())} of {len(irregular)} irregular iteration(s) lie within the "
                       f"job's own noise (under {p.t.noise_z - 1:g} healthy sigmas): not searched")
        if p.max_iterations is not None and len(chosen) > p.max_iterations:
            sev = durs[np.isin(its, chosen)]
            chosen = np.sort(chosen[np.argsort(-sev, kind="stable")[:p.max_iterations]])
            run.assume(f"searched the {p.max_iterations} most irregular of {len(irregular)} irregular iterations")
        if not len(irregular):
            run.assume(f"no irregular iteration (delta={p.delta}) on pivot rank {p.pivot}: nothing to localize")
        return Selection(its, durs, irregular, chosen, weights, z, flags.min_hits, its[flags.candidates],
                         warmup=int(warm.size))

    def gather(self, run: Any, sel: Selection) -> Evidence:
        """Root causes of the chosen iterations (Algorithm 1) and the devices each implicates."""
        ref = IrregularityRule(run.params.delta).reference(sel.durations)
        return self._search(run, sel, ref, None)

    def _search(self, run: Any, sel: Selection, ref: float, transfers: TransferTimes | None) -> Evidence:
        """Algorithm 1 on each chosen iteration (``transfers``: the job's transfer times when it
        was read whole), then the causes' rates, devices, filters, the null and the narrowing."""
        p, search, topo = run.params, run.search, run.topology
        ev = Evidence()
        excess = dict(zip(sel.window.tolist(), (sel.durations - ref).tolist()))
        for it in sel.chosen.tolist():
            found = explain_iteration(run, it, excess.get(it, 0.0), transfers)
            if found is None:
                ev.common.append(it)
                continue
            if not found:
                ev.without_cause.append(it)
            ev.causes += found
        healthy = HealthyPaths(search.graph, topo) if p.t.exonerate else None
        probe = NetworkProbe(search, topo, max_reads=p.probe_reads, thresholds=p.t) if p.probe_reads > 0 else None
        hprobe = HostProbe(search, topo, max_reads=p.host_reads, mates=p.t.host_probe_mates, ratio=p.t.host_probe_ratio) \
            if p.t.include_host and p.host_reads > 0 else None
        for c in ev.causes:
            ro = search.graph.ranks[c.rank]
            series = ro.position_series(int(ro.op_index[c.row]), sel.window, gap=c.cause == COMPUTE)
            c.rate = irregularity_rate(series, sel.durations, max_lag=p.t.rate_lag, min_points=p.t.rate_min_points)
            ev.implicated.append(implicated_devices(c, ro, topo, healthy=healthy, hprobe=hprobe, probe=probe,
                                                    include_host=p.t.include_host, min_share=p.t.exonerate_bytes,
                                                    speedup=p.t.exonerate_speedup))
        mu = p.t.cause_min_iterations
        drop_usual_compute(ev, search.graph.ranks, p.t.compute_z, sel.usual, min_usual=mu)
        stalls = drop_stalls(ev, search.graph.ranks, p.t.cell_transient, p.t.cell_usual_q, p.t.transient_min_ops,
                             p.t.transient_recur_p, run.source.world_size)
        if stalls:
            run.assume(f"{len(stalls)} one-off compute stall(s) (one compute gap grew while the rank's other compute "
                       "of the iteration ran as usual), not counted as a device fault: " +
                       ", ".join(f"rank {c.rank} in iteration {c.iteration}" for c in stalls[:SHOWN_TRANSIENTS]) +
                       (f" and {len(stalls) - SHOWN_TRANSIENTS} more" if len(stalls) > SHOWN_TRANSIENTS else ""))
        if p.t.straggler_share > 0:
            drop_diffuse(ev, search.graph.ranks, topo.host_of, p.t.diffuse_dominance, min_usual=mu)
        drop_minor(ev, search.graph.ranks, excess, p.t.cause_share, sel.usual, min_usual=mu)
        if sel.min_hits:  # searched for their repeats: a candidate's cause standing out counts alone
            ev.proven = proven_devices(ev, search.graph.ranks, sel.candidates, p.t.own_z, sel.usual, min_usual=mu)
        else:
            drop_unproven(ev, search.graph.ranks, sel.candidates, p.t.own_z, sel.usual, min_usual=mu)
        self._null(run, sel, ev, healthy, ref, transfers)
        if p.t.narrow:
            narrowed = narrow_by_coverage(ev.implicated, [c.rate for c in ev.causes],
                                          [c.cause != COMPUTE for c in ev.causes])
            for c, before, devs in zip(ev.causes, ev.implicated, narrowed):
                if len(devs) < len(before):
                    c.devices = devs
            ev.implicated = narrowed
        return ev


class WholeJobComparison(PivotSearch):
    """A job read whole (``world_size <= full_read``): each rank's compute and each channel's
    transfers per iteration against the job's own noise (:mod:`~holmes.localize.irregular.cells`);
    when its compute noise is beyond ``cell_noise`` or a rank is unreadable, Algorithm 1 from the
    pivot with the transfer times of the whole job."""

    whole_job = True

    def gather(self, run: Any, sel: Selection) -> Evidence:
        """Every rank read; the cells when the job is quiet, else :meth:`PivotSearch.gather`'s search."""
        p, search, topo = run.params, run.search, run.topology
        ref = IrregularityRule(p.delta).reference(sel.durations)
        for r in range(run.source.world_size):
            search.rank_ops(r)
        moved = search.graph.align_collective_ends(topo.host_of, p.t.collective_end_slack_ns)
        if moved:
            run.assume(f"{moved} asynchronous collective copies, still open when their rank went on, ended more than "
                       f"{p.t.collective_end_slack_ns / NS_PER_MS:g} ms after their host's first copy: read as ending "
                       "with it (members complete together: observed late, the time the rank's own)")
        transfers = TransferTimes(search.graph.ranks, search.graph.members)
        cells = None if run.source.missing else \
            CellEvidence(search.graph.ranks, search.graph.members, topo.host_of, transfers,
                         usual_q=p.t.cell_usual_q, tail=p.t.cell_tail, per_op=p.t.cell_per_op, thresholds=p.t)
        if cells is not None and cells.absent:
            shown = cells.absent[:SHOWN_RANKS] + (["..."] if len(cells.absent) > SHOWN_RANKS else [])
            run.assume(f"{len(cells.absent)} rank(s) hold no operator in the iterations their peers share "
                       f"({', '.join(map(str, shown))}): their cells are not compared")
        if cells is not None and cells.noise <= p.t.cell_noise:
            # the pivot's irregular iterations are not what is explained: every iteration is
            sel.weights = {}
            # a cell explains one of the pivot's irregular iterations, or its own excess could make one
            # (only the delta-irregular ones: a stretch under delta, flagged by stretch_z, is
            # what the cells' own cost rule judges)
            delta_irregular = sel.window[sel.durations > p.delta * float(ref)]
            return _gather_cells(run, cells, cell_min_cost(p, sel.durations), delta_irregular, p.t.cell_event_p,
                                 p.t.cell_transient, warmup=sel.window[:sel.warmup])
        run.assume(f"{len(run.source.missing)} rank(s) unreadable: the job is not compared cell by cell"
                   if cells is None else f"the job's compute noise ({100 * cells.noise:.1f}% of its compute) is "
                   f"beyond cell_noise={p.t.cell_noise:g}: not compared cell by cell; Algorithm 1 from the pivot")
        return self._search(run, sel, ref, transfers)


def report_timing(sel: Selection, ev: Evidence, delta: float) -> dict[str, Any]:
    """The report's timing facts: the pivot's iteration durations over the window, the usual one
    (the irregularity rule's reference) and ``device_cost``: per device implicated, how much longer
    than usual the searched irregular iterations whose causes implicate it were, in total (ns), and
    how many there were."""
    if not len(getattr(sel, "window", ())):
        return {}
    usual = IrregularityRule(delta).reference(sel.durations)
    excess = {int(i): max(float(d) - usual, 0.0) for i, d in zip(sel.window, sel.durations)}
    iters: dict[str, set[int]] = {}
    for c, devs in zip(ev.causes, ev.implicated):
        for d in devs:
            iters.setdefault(d, set()).add(int(c.iteration))
    return {"iteration_ns": {int(i): int(d) for i, d in zip(sel.window, sel.durations)},
            "usual_iteration_ns": float(usual),
            "device_cost": {d: {"excess_ns": float(sum(excess.get(i, 0.0) for i in its)), "iterations": len(its)}
                            for d, its in iters.items()}}


def _iteration_times(src: Any, rank: int) -> tuple[np.ndarray, np.ndarray]:
    got = src.iteration_times(rank)
    exc = getattr(src, "errors", {}).get(rank) if got is None else None
    if exc is not None:
        raise exc  # the typed error naming the unreadable iterations/ops file
    if got is None or len(got[0]) == 0:
        raise JobError(f"pivot rank {rank}: no iterations in its log")
    return np.asarray(got[0]), np.asarray(got[1])


def cell_min_cost(p: Any, durations: np.ndarray) -> float:
    """The excess (ns) a cell needs outside the pivot's delta-irregular iterations: what alone
    could make an iteration irregular (``cell_cost * (delta - 1)`` x the usual step), or on a
    quiet job less: ``cell_cost_z`` of the step's own sigmas, at least ``min_stretch`` of the step
    (a NIC costing 6% of a step whose noise is 1.5% is beyond doubt, as the stretch rule says
    of larger jobs).

    >>> from holmes.localize.params import LocalizeParams
    >>> d = np.r_[np.full(10, 100.0), np.full(10, 101.0)]
    >>> round(cell_min_cost(LocalizeParams(), d), 1), round(cell_min_cost(LocalizeParams(cell_cost_z=0), d), 1)
    (3.0, 10.0)
    """
    rule = IrregularityRule(p.delta)
    ref = rule.reference(durations)
    cost = p.t.cell_cost * (p.delta - 1.0) * ref
    if p.t.cell_cost_z > 0 and durations.size >= p.t.stretch_min_iterations:
        quiet = max(p.t.cell_cost_z * rule.sigma(durations, mad_floor=True), p.t.min_stretch * ref)
        cost = min(cost, quiet)
    return float(cost)


def _gather_cells(run: Any, cells: CellEvidence, min_cost_ns: float, irregular: Any, min_pvalue: float,
                  transient: float, warmup: Any = ()) -> Evidence:
    """A job read whole: the devices whose cells stood out of the job's noise
    (:class:`~holmes.localize.irregular.cells.CellEvidence`) by at least ``min_cost_ns``, one root cause per
    event; one-off stalls of one operator (``transient``) and job-wide pauses are said, not counted; an event in the
    ``warmup`` iterations (the job's first, threshold ``warmup_iterations``) is no evidence (their
    cells stay in the job's noise: leaving them out of it moved the tails enough to lose r052's host)."""
    search, topo, transfers = run.search, run.topology, cells.transfers
    events = cells.events(topo, min_cost_ns=min_cost_ns, irregular=irregular, min_pvalue=min_pvalue,
                          transient=transient)
    warm = {int(i) for i in np.asarray(warmup).tolist()}
    events = [e for e in events if e.iteration not in warm]
    if cells.transients:
        said = ", ".join(f"{e.devices[0]} in iteration {e.iteration} (+{e.excess_ns / NS_PER_MS:.1f} ms)"
                         for e in sorted(cells.transients, key=lambda e: -e.excess_ns)[:SHOWN_TRANSIENTS])
        more = f" and {len(cells.transients) - SHOWN_TRANSIENTS} more" if len(cells.transients) > SHOWN_TRANSIENTS else ""
        run.assume(f"{len(cells.transients)} one-off stall(s) of a single operator (on a host: one per rank) while "
                   f"the device's other work ran as usual, not counted as a device fault: {said}{more}")
    pauses = sorted({e.iteration for e in cells.pauses if e.iteration not in warm})
    if pauses:
        run.assume(f"iteration(s) {', '.join(map(str, pauses))}: the whole job stalled at once (significant stalls "
                   "on every host, beyond what the device standing out most explains: a pause of the machine, "
                   "storage or scheduler); not counted as a device fault")
    if cells.unexplained:
        devs = sorted({d for _, ds in cells.unexplained for d in ds})
        run.assume(f"{len(cells.unexplained)} transfer stall(s) whose channels share only {', '.join(devs)}, on "
                   "every channel of their kind: the comparison cancels such a device, so none is named for them")
    ev = Evidence(cells=cells, events=events)
    for e in events:
        c = _event_cause(search, transfers, e)
        ev.causes.append(c)
        ev.implicated.append(list(e.devices))
    run.assume(f"the job was read whole ({run.source.world_size} ranks): each rank's compute and each "
               f"channel's transfers in every iteration compared with the job's own noise")
    return ev


def _event_cause(search: GraphSearch, transfers: TransferTimes, e: Event) -> RootCause:
    """The root cause an event of the cells stands for (its evidence: the cell's operator)."""
    names = search.graph.comm_ids
    if e.kind == "network":
        rank, row = transfers.where(e.channels[0], e.iteration) or (e.ranks[0], 0)
        ro = search.graph.ranks[rank]
        step = ro.describe(row, names)
        step["transfer_excess_ns"] = int(e.excess_ns)
        cause = NETWORK
    else:
        rank = e.ranks[0]
        ro = search.graph.ranks[rank]
        row = ro.largest_gap_row(e.iteration)
        row = 0 if row is None else row
        step = ro.describe_compute(row, names)
        cause = COMPUTE
    step["z"] = round(e.z, 2)
    step["pvalue"] = float(e.pvalue)
    what = "compute" if cause == COMPUTE else "transfers"
    note = (f"its {what} took {e.excess_ns / NS_PER_MS:.1f} ms longer than usual, {e.z:.1f} sigmas of the "
            f"job's noise (family-wise p={e.pvalue:.1e})")
    c = RootCause(e.iteration, cause, tuple(e.ranks), rank, row, step, [step], note, devices=list(e.devices))
    c.rate = 1.0 - float(e.pvalue)
    return c


def same_causes(implicated: list[list[str]]) -> dict[str, tuple[str, ...]]:
    """Per network device, the other network devices implicated by exactly the same causes (the
    indices of ``implicated``): what no cause tells apart. Compute devices are left out (a GPU
    and its host are told apart by the explain-away, not by the causes).

    >>> same_causes([["nic:1", "nic:5", "gpu:1"], ["nic:1", "nic:5", "switch:leaf-0"]])
    {'nic:1': ('nic:5',), 'nic:5': ('nic:1',)}
    """
    where: dict[str, set[int]] = {}
    for i, devs in enumerate(implicated):
        for d in devs:
            if not kinds.is_compute(d):
                where.setdefault(d, set()).add(i)
    groups: dict[frozenset[int], list[str]] = {}
    for d, idx in where.items():
        groups.setdefault(frozenset(idx), []).append(d)
    return {d: tuple(a for a in g if a != d) for g in groups.values() if len(g) > 1 for d in g}


def rank_cells(ev: Evidence, calibration: float, name: str = "irregular",
               point_calibration: float | None = None, span_ns: float | None = None) -> list[DeviceScore]:
    """Devices of the cells' events: confidence ``1 - calibration * p`` (``p`` from
    :func:`~holmes.localize.irregular.cells.device_pvalues`; ``point_calibration``, when given, for single
    devices, :func:`~holmes.topology.kinds.is_point`), coverage the device's share of the strongest
    evidence, ``log p / log p_min`` (the strongest device 1.0), score from each event's order of
    its devices (the most specific first); ordered as :func:`~holmes.localize.pipeline.device_order`.

    Coverage weighs how improbable a device's events are by chance, not how many events named
    it: equally confident devices (the confidence rounds every strong one to 1.00) are told apart
    by it, and a NIC with eight weak events no longer outranks the NIC whose two events were 40
    orders of magnitude less likely.
    """
    import math

    cells = ev.cells
    assert cells is not None
    rows = {"gpu": len(cells.rank_ids), "host": max(len(set(cells.host_of(r) for r in cells.rank_ids)), 1),
            "network": max(len(cells.channels), 1)}
    # devices that best explained none of the events (alternatives only) have no p-value: p = 1
    pv = {d: 1.0 for e in ev.events for d in e.devices}
    pv.update(device_pvalues(ev.events, rows, max(len(cells.iterations) - 1, 1)))
    score: dict[str, float] = {}
    causes: dict[str, int] = {}
    for e in ev.events:
        for pos, d in enumerate(e.devices):
            score[d] = score.get(d, 0.0) + 1.0 / (1.0 + pos)
            causes[d] = causes.get(d, 0) + 1
    total = sum(score.values()) or 1.0

    def strength(d: str) -> float:  # -log10 p, p = 0 (underflow) as P_FLOOR
        return -math.log10(max(pv[d], P_FLOOR))

    # how often chance would blame each device
    chance = {d: (point_calibration if point_calibration is not None and kinds.is_point(d) else calibration) * pv[d]
              for d in score}
    top = max((strength(d) for d in score), default=1.0) or 1.0
    # devices that best explain exactly the same events (a slow transfer's two NICs and their
    # cables, where no other event tells them apart) are one suspicion: alike
    best_in: dict[str, set[int]] = {}
    for i, e in enumerate(ev.events):
        for d in e.best_devices:
            best_in.setdefault(d, set()).add(i)
    same: dict[frozenset[int], list[str]] = {}
    for d, es in best_in.items():
        same.setdefault(frozenset(es), []).append(d)

    def alike(d: str) -> tuple[str, ...]:
        return tuple(a for a in same.get(frozenset(best_in.get(d, ())), ()) if a != d) if d in best_in else ()

    # a device whose cells chance explains (confidence 0) is no candidate either
    # with ``span_ns`` (the window's time), what the device's own cells cost it: the excess of the
    # events it best explains, as a share of the window -- the unit of the persistent analysis's
    # what-if impact, so the two analyses' devices of equal confidence order alike
    # (per iteration its largest event: a compute and a network event of one iteration are one delay)
    own: dict[tuple[str, int], float] = {}
    for e in ev.events:
        for d in e.best_devices:
            own[(d, e.iteration)] = max(own.get((d, e.iteration), 0.0), float(e.excess_ns))
    cost: dict[str, float] = {}
    for (d, _), v in own.items():
        cost[d] = cost.get(d, 0.0) + v
    impact = {d: 100.0 * v / span_ns for d, v in cost.items()} if span_ns else {}
    out = [DeviceScore(d, kinds.kind_of(d), score[d] / total, score[d], causes[d],
                       confidence=1.0 - chance[d], evidence=(name,), impact_pct=impact.get(d),
                       coverage=max(strength(d), 0.0) / top, alike=alike(d)) for d in score if chance[d] < 1.0]
    # the same order as the pipeline's device_order (confidence, then coverage, then score)
    return sorted(out, key=lambda x: (-round(x.confidence or 0.0, 2), -round(x.coverage or 0.0, 2), -x.score))
