"""The persistent analysis: stragglers that are slow from the first iteration, with no pivot.

The irregular analysis explains iterations that are slower than the job's usual ones; a GPU that
is slow from the first logged iteration, or a badly balanced pipeline, never makes an iteration
irregular. This analysis asks instead, in every iteration, **who made whom wait**, and compares
every rank with its *role peers* (:mod:`~holmes.localize.persistent.peers`: same stage and tensor position
in the other data-parallel replicas), Minder-style. Its steps, as the pipeline runs them:

1. **select** -- the last ``window`` iterations of the pivot (no irregular iteration needed);
2. **gather** -- every rank's log is read once, rank by rank, and only a compact per-rank summary
   is kept (:mod:`~holmes.localize.persistent.rank`, the map/reduce form: the same functions run
   distributed); the summaries are folded into *waiting caused*, *own work* and *transfer time*
   tables (:mod:`~holmes.localize.persistent.wait`), and compute and network stragglers are told
   against their role peers with the continuity rule (:mod:`~holmes.localize.persistent.suspects`).
   Compute stragglers implicate their GPU (their host when most of the host's GPUs are
   stragglers); slow slots the network devices on the paths of all of them and of few healthy ones;
3. **what-if** -- every iteration is replayed through the dependency graph of its operators
   (:mod:`~holmes.localize.persistent.whatif`) with the actual gaps and transfers, with a suspect's set to its
   peers' (its ``impact_pct``), and ideal -- every rank's work at the window-wide mean, every
   transfer at its operator type's median (:func:`~holmes.localize.persistent.wait.operator_types`):
   ``slowdown = actual / ideal``, WIA's S; per stage and per replica the ideal step with only that
   stage (replica) left as logged, its gaps and the transfers it takes part in (WIA's decomposition;
   jobs of at most 1,024 ranks, one replay each -- beyond, the slowest stage is told by its work
   alone). When no device explains a slowdown
   of at least ``imbalance_pct`` %, the non-device cause is named: ``pipeline_stage_imbalance``
   (one stage slowest on every replica) or ``microbatch_imbalance`` (the slow position moves
   between replicas).

A summary built elsewhere (one task per rank, :mod:`~holmes.localize.mapreduce`) is localized by
``PersistentAnalysis(summary)``: the report is the one ``holmes.localize`` gives.

Examples
--------
>>> import holmes
>>> r = holmes.localize("fixtures/gpu64-3d-slow-gpu", analysis="persistent")
>>> r.verdict in ("culprit", "healthy", "inconclusive")
True
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from holmes.calibration.thresholds import or_shipped
from holmes.display import SHOWN_RANKS
from holmes.errors import ConfigError
from holmes.localize.evidence.confidence import device_confidence
from holmes.localize.persistent.compute_source import has_compute, row_compute
from holmes.localize.persistent.peers import Roles, p2p_stages
from holmes.localize.persistent.gather import gather_folded
from holmes.localize.persistent.partials import fold_parts, part_of, replayed_iterations
from holmes.localize.persistent.rank import PersistentSummary, persistent_window
from holmes.localize.persistent.suspects import (ComputeOutliers, NetworkOutliers, StageHost, Suspect,
                                                 compute_suspects, network_suspects, slot_classes, stage_hosts,
                                                 stage_volumes)
from holmes.localize.persistent.wait import Folded
from holmes.localize.persistent.whatif import ideal_gaps, swap_compute
from holmes.localize.persistent.whatif import replay as _replay
from holmes.localize.report import DeviceScore
from holmes.stats import RATIO_FLOOR
from holmes.topology import kinds

__all__ = ["PersistentAnalysis", "PersistentSelection", "PersistentEvidence", "Suspect"]

log = logging.getLogger(__name__)



@dataclass
class PersistentSelection:
    """The iterations the persistent analysis looks at (no pivot iteration is singled out)."""

    window: np.ndarray
    weights: dict[int, float] = field(default_factory=dict)


@dataclass
class PersistentEvidence:
    """Summaries and findings of the persistent analysis."""

    window: np.ndarray
    caused: np.ndarray              # (W, T) waiting caused, ns
    compute: np.ndarray             # (W, T) own work, ns
    roles: Roles
    suspects: list[Suspect] = field(default_factory=list)
    outlier_rate: float = 0.0
    step_actual: float | None = None
    step_ideal: float | None = None
    slowdown: float | None = None
    by_stage: dict[int, float] = field(default_factory=dict)
    by_replica: dict[int, float] = field(default_factory=dict)
    impact: dict[str, float] = field(default_factory=dict)
    device_hits: dict[str, tuple[float, float]] = field(default_factory=dict)
    non_device_cause: dict[str, Any] | None = None
    moving_outliers: float = 0.0
    compute_z: np.ndarray | None = None   # (W, T) own work over the role peers', in robust sigmas
    network_flags_rate: float = 0.0
    slot_ratio: np.ndarray | None = None  # (S, T) transfer time over the peer slots'
    no_peer: list[int] = field(default_factory=list)  # ranks no other rank does the same work as
    stage_hosts: list[StageHost] = field(default_factory=list)  # hosts that are whole slow stages


class PersistentAnalysis:
    """Persistent stragglers against role peers, and their what-if impact (select -> gather -> rank).

    Parameters
    ----------
    summary : PersistentSummary, optional
        Every rank's summary, merged (built elsewhere, e.g. one task per rank); when given,
        ``gather`` reads no log and the window is the summary's.
    scheduler : None, str, distributed.Client or Executor, optional
        Where ``gather``'s map and reduce run (:mod:`~holmes.localize.persistent.partials`;
        :func:`holmes.parallel.get_executor`): None in this process. The report is the same.
    """

    name = "persistent"
    #: its devices' ``impact_pct`` comes from a what-if replay (preferred when analyses merge)
    replays_impact = True
    #: it reads every rank: under ``analysis="all"``, on a job over ``full_read`` ranks, it runs
    #: only when the analyses before it named no device
    reads_every_rank = True

    @staticmethod
    def ends_run(finding: Any) -> bool:
        """Never: the analyses after it still apply."""
        return False

    @staticmethod
    def report_fields(run: Any, finding: Any) -> dict[str, Any]:
        """The report's ``slowdown`` (what-if replay) and ``non_device_cause``."""
        return {"slowdown": getattr(finding.evidence, "slowdown", None),
                "non_device_cause": getattr(finding.evidence, "non_device_cause", None)}

    def __init__(self, summary: PersistentSummary | None = None, scheduler: Any = None) -> None:
        self.summary = summary
        self.scheduler = scheduler

    def select(self, run: Any) -> PersistentSelection:
        """The last ``window`` iterations of the pivot (or the given summary's window)."""
        if self.summary is not None:
            if self.summary.world_size != run.source.world_size:
                raise ConfigError(f"the summary is of a job of {self.summary.world_size} ranks, "
                                  f"not {run.source.world_size}")
            return PersistentSelection(np.asarray(self.summary.window))
        return PersistentSelection(persistent_window(run.source, run.params.pivot, run.params.window))

    def gather(self, run: Any, sel: PersistentSelection) -> PersistentEvidence:
        """Summarize every rank (map/reduce), fold, find suspects against their peers, replay."""
        src, p = run.source, run.params
        T = len(sel.window)
        its = replayed_iterations(T, p.t.whatif_iterations) if p.whatif else None
        # the program holds the replayed iterations' rows only, unless compute tables (aligned with
        # every row) are read
        restricted = its is not None and not has_compute(src)
        # the ranks of one host read one clock: a P2P pair of one host may be read across its ends
        topo = run.topology
        clock = topo.hosts_of(np.arange(src.world_size)) if topo is not None and topo.num_gpus >= src.world_size \
            else None
        if self.summary is not None:
            src.note_read(self.summary.ranks)
            keep = None
            if p.whatif:
                keep = np.zeros(T, np.bool_)
                keep[its if restricted else slice(None)] = True
            part = part_of(self.summary, list(range(src.world_size)), keep=keep)
            f = fold_parts([part], src.communicators, src.world_size, sel.window, program_its=its,
                           restricted=restricted, thresholds=p.t, clock=clock)
            del part
            missing = dict(self.summary.missing)
        else:
            f, missing = gather_folded(src, sel.window, src.communicators, scheduler=self.scheduler,
                                       program_its=its, program=p.whatif, restricted=restricted, thresholds=p.t,
                                       clock=clock)
            if self.scheduler is not None:  # read on the workers
                for r, why in missing.items():
                    src.missing.setdefault(r, why)
                src.note_read(r for r in range(src.world_size) if r not in missing)
        if missing:
            run.assume(f"persistent: {len(missing)} rank(s) unreadable; their operators are missing from "
                       f"the comparison and the replay")
        roles = Roles.from_communicators(src.communicators, src.world_size)
        if roles.num_stages <= 1:
            stages = p2p_stages(f.slot_info, src.world_size)
            if stages is not None:  # a pipeline over the default group: its P2P chain says the stages
                roles.stage = stages
                roles.split_work(stages)
                run.assume(f"persistent: {int(stages.max()) + 1} pipeline stage(s) read from the P2P transfers "
                           "(no pp communicator): each stage's ranks are compared with each other only")
        ev = PersistentEvidence(sel.window, f.caused, f.compute, roles)
        co: ComputeOutliers = compute_suspects(roles, f.caused, f.compute, z=p.t.persistent_z,
                                               fraction=p.t.persistent_fraction, present=f.present,
                                               min_effect=p.t.persistent_min_effect, thresholds=p.t)
        if co.no_peer:
            ev.no_peer = co.no_peer
            shown = ", ".join(str(r) for r in co.no_peer[:SHOWN_RANKS]) + (" ..." if len(co.no_peer) > SHOWN_RANKS else "")
            run.assume(f"persistent: no peer does the same work as rank(s) {shown} (a stage of one rank): "
                       "their compute is not compared")
        if not co.suspects:
            ev.stage_hosts = stage_hosts(roles, f.compute, run.topology.host_of, z=p.t.persistent_z,
                                         fraction=p.t.persistent_fraction, min_effect=p.t.persistent_min_effect,
                                         present=f.present, thresholds=p.t,
                                         volume=stage_volumes(f.slot_info, f.NB, roles, src.communicators))
        classes = slot_classes(f.slot_info, roles.stage, f.NB, f.CNT, host_of=run.topology.host_of,
                               communicators=src.communicators, bins_per_octave=p.t.slot_bins_per_octave)
        no: NetworkOutliers = network_suspects(f.slot_info, f.X, classes, run.topology, z=p.t.persistent_z,
                                               fraction=p.t.persistent_fraction, min_excess=p.t.network_min_excess,
                                               thresholds=p.t)
        ev.suspects = co.suspects + no.suspects
        ev.compute_z, ev.outlier_rate, ev.moving_outliers = co.z, co.rate, co.moving
        ev.slot_ratio, ev.network_flags_rate, ev.device_hits = no.ratio, no.rate, no.device_hits
        self._whatif(run, ev, f)
        return ev

    # ------------------------------------------------------------------ what-if
    def _whatif(self, run: Any, ev: PersistentEvidence, f: Folded) -> None:
        prog = f.program
        if prog is None or not len(prog.inst):
            return
        p = run.params
        limits = (p.t.whatif_max_groups, p.t.whatif_max_ranks)
        its = f.replay_its

        # where the job has compute tables (every rank read): each rank's work after its last operator
        # of an iteration (the optimizer step) ends its step, as logged and at the ideal
        rc = row_compute(run.source, f.window, prog.rank_ptr)
        use = rc is not None and bool(rc.covered[f.present].all())
        if rc is not None and not use:
            run.assume("persistent: compute tables cover only some ranks; the what-if ideal uses the gaps between "
                       "operators")
        tails = (rc.tail, rc.tail_ideal) if use and rc is not None else None

        def replay(prog: Any, **kw: Any) -> np.ndarray:
            if tails is not None and "tail" not in kw:
                kw["tail"] = tails[0]
            return _replay(prog, iterations=its, **kw)

        actual = replay(prog)
        ok = np.isfinite(actual)
        if not ok.any():
            run.assume("persistent: the operators do not match across ranks; no what-if replay")
            return
        t_act = float(actual[ok].mean())
        W = ev.caused.shape[0]
        C, gap, x = ev.compute, prog.gap, prog.x
        row_rank, row_it = f.row_rank, f.row_it
        # the ideal (WIA's): no variation along rank, stage or iteration. Every transfer at the median
        # of its operator type over the window; every compute record at its name's mean where the job
        # has compute tables (every rank read), and the rest of every rank's gaps in every iteration
        # at the job's mean, scaled in proportion (whatif.ideal_gaps)
        with np.errstate(divide="ignore", invalid="ignore"):
            # a suspect's work at its work peers' (the faster half of its stage, as it was found)
            f_peer = np.where(C > 0, np.minimum(ev.roles.work_reference(C) / C, 1.0), 1.0)
        x_ideal = f.type_x[f.inst_type] if len(f.type_x) else x
        g_ideal = ideal_gaps(gap, row_rank, row_it, C.shape, f.present,
                             *((rc.comp, rc.ideal) if use and rc is not None else ()), rest_sum=f.gap_sum)
        ideal = replay(prog, gap=g_ideal, x=x_ideal, **({"tail": tails[1]} if tails is not None else {}))
        t_ideal = float(np.nanmean(ideal[ok])) if np.isfinite(ideal[ok]).any() else float("nan")
        ev.step_actual, ev.step_ideal = t_act, t_ideal
        ev.slowdown = t_act / t_ideal if t_ideal > 0 else None
        # WIA's decomposition: the ideal with one stage (replica) as logged -- its ranks' gaps and the
        # transfers of the instances they take part in -- over the ideal; one replay each
        ev.by_stage = self._decompose(ev.roles.stage, ev.roles.num_stages, W, prog, f, gap, g_ideal, x_ideal,
                                      replay, ok, t_ideal, tails=tails, limits=limits)
        rep = ev.roles.replica
        n_rep = int(rep.max()) + 1 if rep.size else 0
        if n_rep <= p.t.whatif_max_replicas:
            ev.by_replica = self._decompose(rep, n_rep, W, prog, f, gap, g_ideal, x_ideal, replay, ok, t_ideal,
                                            tails=tails, limits=limits)
        # transfers at their peers' (a network suspect's impact)
        ratio = ev.slot_ratio
        if ratio is not None and ratio.size:
            x_peer = x * np.minimum(1.0 / np.maximum(ratio, RATIO_FLOOR), 1.0)[f.inst_slot, f.inst_it]
        else:
            x_peer = x
        # each suspect's impact: its work (transfers) at its peers' level
        for s in ev.suspects[:p.t.whatif_max_suspects]:
            if s.kind == "compute":
                peers = [q for r in s.ranks for q in ev.roles.work_peers_of(r).tolist() if q not in s.ranks]
                if tails is not None and rc is not None and peers:  # its compute records at its peers' means
                    comp, tl = rc.at_peers(s.ranks, peers)
                    alt = replay(prog, gap=swap_compute(gap, rc.comp, comp), tail=tl)
                else:
                    g_alt = gap.copy()  # its rows (one range per rank) at its peers' work: one copy of the gaps
                    for r in sorted(set(s.ranks)):
                        a, b = int(prog.rank_ptr[r]), int(prog.rank_ptr[r + 1])
                        g_alt[a:b] = gap[a:b] * f_peer[r, row_it[a:b]]
                    alt = replay(prog, gap=g_alt)
                    del g_alt
                key = kinds.gpu(s.ranks[0])
            else:
                m = np.isin(f.inst_slot, s.slots)
                alt = replay(prog, x=np.where(m, x_peer, x))
                key = s.devices[0]
            ev.impact[key] = 100.0 * (t_act - float(np.nanmean(alt[ok]))) / t_act
        log.info("persistent: step %.3g actual, %.3g ideal (slowdown %.3f)", t_act, t_ideal, ev.slowdown or 0)

    @staticmethod
    def _decompose(label: np.ndarray, n: int, W: int, prog: Any, f: Folded, gap: np.ndarray, g_ideal: np.ndarray,
                   x_ideal: np.ndarray, replay: Any, ok: np.ndarray, t_ideal: float,
                   tails: tuple[np.ndarray, np.ndarray] | None = None,
                   limits: tuple[int, int] | None = None) -> dict[int, float]:
        """Per group ``g`` of ``label`` (stage or replica per rank), the mean replayed step with the
        ideal everywhere but group ``g``'s gaps, its ranks' tails (``tails``: as logged, at the ideal)
        and the transfers of the instances its ranks take part in, over the ideal step (WIA's
        ``blocking_decompose_by_stage`` / ``_by_dp_rank``). ``limits``: ``(max groups, max ranks)``,
        the thresholds ``whatif_max_groups``, ``whatif_max_ranks`` (one replay per group)."""
        max_groups, max_ranks = limits or (or_shipped(None, "whatif_max_groups"), or_shipped(None, "whatif_max_ranks"))
        if not 1 < n <= max_groups or W > max_ranks or not t_ideal > 0:
            return {}
        row_group = label[f.row_rank]
        out: dict[int, float] = {}
        for g in range(n):
            keep = row_group == g
            touched = np.zeros(len(x_ideal), np.bool_)
            touched[prog.inst[keep]] = True
            kw = {} if tails is None else {"tail": np.where((label == g)[:, None], tails[0], tails[1])}
            alt = replay(prog, gap=np.where(keep, gap, g_ideal), x=np.where(touched, prog.x, x_ideal), **kw)
            out[g] = float(np.nanmean(alt[ok])) / t_ideal
        return out

    # ------------------------------------------------------------------ rank
    def rank(self, run: Any, ev: PersistentEvidence, sel: PersistentSelection | None = None) -> list[DeviceScore]:
        """Compute stragglers (GPU, or host when most of its GPUs are) and network devices, with
        confidence from the continuity of their outlier iterations and their what-if impact."""
        p, topo = run.params, run.topology
        T = len(ev.window)
        W = ev.caused.shape[0]
        p0 = min(max(ev.outlier_rate, 1.0 / max(W, 1)), p.t.persistent_max_chance)
        out: list[DeviceScore] = []
        comp = [s for s in ev.suspects if s.kind == "compute"]
        by_host: dict[int, list[Suspect]] = {}
        for s in comp:
            by_host.setdefault(int(topo.host_of(s.ranks[0])), []).append(s)
        host_of = topo.hosts_of(np.arange(W)) if by_host else None
        for h, ss in by_host.items():
            host_gpus = np.flatnonzero(host_of == h).tolist()
            # the host when most of its GPUs work persistently beyond their peers (half the sigmas)
            cz = ev.compute_z[host_gpus] if ev.compute_z is not None else np.zeros((len(host_gpus), T))
            slow_mates = int(((cz > p.t.persistent_z / 2).mean(axis=1) >= p.t.persistent_fraction).sum())
            if len(host_gpus) > 1 and max(len(ss), slow_mates) >= max(2, (len(host_gpus) + 1) // 2):
                hits = float(np.median([s.hits for s in ss]))
                imp = sum(ev.impact.get(kinds.gpu(s.ranks[0]), 0.0) for s in ss)
                out.append(DeviceScore(kinds.host(h), "host", sum(s.excess for s in ss), causes=len(ss),
                                       confidence=device_confidence(hits, T, p0), impact_pct=imp,
                                       evidence=(self.name,)))
            else:
                for s in ss:
                    d = kinds.gpu(s.ranks[0])
                    out.append(DeviceScore(d, "gpu", s.excess, causes=s.hits,
                                           confidence=device_confidence(s.hits, T, p0),
                                           impact_pct=ev.impact.get(d), evidence=(self.name,)))
        for sh in ev.stage_hosts:
            conf = device_confidence(sh.hits, T, p0)
            where = f"stage {sh.stages[0]}" if len(sh.stages) == 1 else "stages " + ", ".join(map(str, sh.stages))
            if sh.ambiguous:
                conf = min(conf, p.t.persistent_ambiguous_conf)
                run.assume(f"persistent: {where} works {100 * sh.effect:.0f}% more than the other stages on every "
                           f"replica, and all its ranks are host:{sh.host}'s GPUs: a slow host:{sh.host} and a heavier "
                           f"stage cannot be told apart from timing (host:{sh.host} is a candidate)")
            else:
                run.assume(f"persistent: {where}, exactly host:{sh.host}'s GPUs, work {100 * sh.effect:.0f}% more than "
                           f"the other stages on every replica: host:{sh.host}")
            out.append(DeviceScore(kinds.host(sh.host), "host", sh.effect, causes=sh.hits, confidence=conf,
                                   evidence=(self.name,)))
        net = [s for s in ev.suspects if s.kind == "network"]
        pn = min(max(ev.network_flags_rate, p.t.persistent_min_network_chance), p.t.persistent_max_chance)
        # explain-away: a device is discounted by how much less of its traffic is slow than the best
        # explanation's (a slow P2P direction slows no device's every transfer; its path's devices
        # are the candidates, the ones carrying the fewest healthy transfers first)
        best_share = max((ev.device_hits.get(s.devices[0], (0.0, 0.0))[1] for s in net), default=0.0)
        for s in net:
            d = s.devices[0]
            hits, share = ev.device_hits.get(d, (0.0, 0.0))
            rel = share / best_share if best_share > 0 else 0.0
            out.append(DeviceScore(d, kinds.kind_of(d), s.excess, causes=s.hits,
                                   confidence=device_confidence(hits, T, pn) * min(1.0, rel),
                                   impact_pct=ev.impact.get(d), evidence=(self.name,), alike=tuple(s.alike)))
        total = sum(max(d.score, 0.0) for d in out) or 1.0
        out = [replace(d, score=max(d.score, 0.0) / total) for d in out]
        out.sort(key=lambda d: (-round(d.confidence or 0.0, 2), -d.score))
        self._non_device(run, ev, named=any((d.confidence or 0) >= p.min_confidence for d in out))
        return out

    def _non_device(self, run: Any, ev: PersistentEvidence, named: bool) -> None:
        """Name a pipeline-stage or micro-batch imbalance when no device explains the slowdown."""
        p = run.params
        if named or ev.slowdown is None or (ev.slowdown - 1.0) * 100.0 < p.t.imbalance_pct:
            return
        if ev.roles.num_stages > 1:
            C = ev.compute
            if ev.by_stage:
                s, v = max(ev.by_stage.items(), key=lambda kv: kv[1])
            else:  # no per-stage replay (large job): the stage doing most work
                s = int(np.argmax([C[ev.roles.stage == st].mean() for st in range(ev.roles.num_stages)]))
                v = ev.slowdown
            stage, rep = ev.roles.stage, ev.roles.replica
            n_rep = int(rep.max()) + 1
            per = np.array([[C[(stage == st) & (rep == d)].mean() if ((stage == st) & (rep == d)).any() else np.nan
                             for st in range(ev.roles.num_stages)] for d in range(n_rep)])
            slowest = np.nanargmax(np.nan_to_num(per, nan=-1.0), axis=1)
            # the stage's own work exceeds the other stages' on every replica (not one replica's device)
            others = np.nanmedian(np.delete(per, s, axis=1), axis=1) if per.shape[1] > 1 else per[:, 0]
            margin = float(np.nanmin(per[:, s] / others)) - 1.0 if per.shape[1] > 1 else 0.0
            if (v - 1.0 >= p.t.imbalance_stage_share * (ev.slowdown - 1.0) and (slowest == s).all()
                    and 100.0 * margin >= p.t.imbalance_pct / 2):
                ev.non_device_cause = {"kind": "pipeline_stage_imbalance", "stage": int(s),
                                       "stage_slowdown": round(v, 4), "slowdown": round(ev.slowdown, 4)}
                run.assume(f"persistent: pipeline stage {s} is the slowest on every replica; alone it makes the "
                           f"step {100 * (v - 1):.1f}% longer than the balanced ideal (a stage imbalance, no device)")
                return
        if ev.moving_outliers >= p.t.microbatch_moving_share:
            ev.non_device_cause = {"kind": "microbatch_imbalance", "slowdown": round(ev.slowdown, 4),
                                   "iterations_with_outlier_pct": round(100 * ev.moving_outliers, 1)}
            run.assume("persistent: the slow position moves between replicas from iteration to iteration "
                       "(micro-batch / sequence-length imbalance, no device)")
