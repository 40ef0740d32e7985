"""``holmes.localize``: iteration monitor -> detector -> COG search -> cross-iteration ranking.

Examples
--------
>>> import holmes
>>> report = holmes.localize("fixtures/gpu64-3d-slow-gpu")      # doctest: +SKIP
>>> report.top.id                                                 # doctest: +SKIP
'gpu:5'
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from holmes.errors import ConfigError, JobError
from holmes.localize.detectors import resolve_detector
from holmes.localize.ranking import (DeviceRanking, cause_devices, device_kind, irregularity_rate,
                                     narrow_by_coverage)
from holmes.localize.healthy import HealthyPaths
from holmes.localize.host_probe import HostProbe
from holmes.localize.probe import NetworkProbe
from holmes.localize.report import DeviceScore, Report
from holmes.localize.search import COMPUTE, GraphSearch, RootCause
from holmes.localize.sources import open_source

__all__ = ["localize", "irregular_mask"]

log = logging.getLogger(__name__)


def irregular_mask(durations: np.ndarray, delta: float = 1.1, quantile: float = 10.0) -> np.ndarray:
    """Iterations whose duration exceeds ``delta`` times a robust reference.

    The reference is a low percentile (default the 10th) of the durations in the window: unlike
    the median it stays on the fault-free level even when a persistent slowdown covers most of
    the window.

    >>> irregular_mask(np.array([10., 10.2, 9.9, 13., 10.1]), 1.1).tolist()
    [False, False, False, True, False]
    """
    d = np.asarray(durations, dtype=float)
    if d.size == 0:
        return np.zeros(0, dtype=bool)
    ref = np.percentile(d, quantile)
    return d > delta * ref


def localize(job: Any, *, pivot: int = 0, window: int = 100, top_k: int = 2, delta: float = 1.1,
             detector: Any = None, topology: Any = None, prior: Mapping[str, float] | None = None,
             alpha: float = 1.0, monitors: Iterable[int] | None = None, max_iterations: int | None = None,
             max_starts: int | None = 4, method: str = "map", include_host: bool = True,
             exonerate: bool = True, exonerate_bytes: float = 1 / 16, exonerate_speedup: float = 2.0,
             probe_reads: int = 64, rate_lag: int = 1, narrow: bool = True, late_ratio: float = 0.5, host_reads: int = 32) -> Report:
    """Rank the devices most likely making a job slow.

    Parameters
    ----------
    job : path, Job, MemoryJob or JobSource
    pivot : int, default 0
        The monitored rank whose iteration times define the irregular iterations.
    window : int, default 100
        T: the last ``window`` iterations of the pivot are analysed.
    top_k : int, default 2
    delta : float, default 1.1
        An iteration is irregular when it lasts more than ``delta`` times the reference.
    detector : str or object, optional
        ``"auto"`` (default: the shipped model, else the robust rule), ``"model"``, ``"label"``
        (ground truth, for evaluation), ``"robust"``, or any object with ``predict_ops``.
    topology : ClusterTopology, optional
        Defaults to the job's ``topology.json``, else ``default_topology(world_size)`` (recorded in
        the assumptions).
    prior : mapping, optional
        p(d) per device kind (gpu, nic, link, switch, cpu, other).
    alpha : float, default 1.0
        Strength of the Beta prior.
    monitors : iterable of int, optional
        Extra monitored ranks; the search also starts from their abnormal operators.
    max_iterations : int, optional
        Search at most this many irregular iterations (the most irregular ones).
    max_starts : int or None, default 4
        Start operators per monitored rank and iteration: the abnormal ones that lasted longest
        beyond their usual duration (:meth:`holmes.cog.RankOps.excess`), searched in start order.
    method : {"map", "linear"}
    include_host : bool, default True
        Compute causes also implicate the host; a host keeps only the evidence its most-blamed GPU
        has no lead over the runner-up for (:meth:`DeviceRanking.explain_away`).
    exonerate : bool, default True
        Leave out of a network cause the devices crossed, in the same iteration, by operators
        that ran normally on the ranks already fetched (a normal transfer through a device shows
        the device was healthy then). Only operators moving at least ``exonerate_bytes`` times
        the cause operator's bytes (default 1/16) count, so latency-bound small messages do not clear a device,
        and only those at least ``exonerate_speedup`` (default 2) times as fast as the cause
        operator's bytes over its extra duration, so a transfer hidden in a wait clears nothing
        (:mod:`holmes.localize.healthy`).
    probe_reads : int, default 64
        Extra ranks the network probes may read to tell the devices of a network cause apart
        (:mod:`holmes.localize.probe`); 0 turns the probes off.
    narrow : bool, default True
        Narrow each network cause to its devices that the other network causes implicate most
        (weighted by their rates, :func:`~holmes.localize.ranking.narrow_by_coverage`): one
        device explaining a specific pair's cause and a whole ring's cause beats the ring's
        many others.
    rate_lag : int, default 1
        The irregularity rate R of a cause is its operator series' best Pearson correlation with
        the pivot's iteration times shifted by 0 .. ``rate_lag`` iterations (a delay late in one
        iteration can stretch the pivot's next one); 0 is the paper's plain correlation.
    host_reads : int, default 32
        Extra ranks the host probe may read to tell a slow GPU from a slow host: a compute cause
        implicates the host when the GPU's host-mates lost compute time in the same iteration,
        the GPU alone when they did not (:mod:`holmes.localize.host_probe`); 0 turns it off.
    late_ratio : float, default 0.5
        A group member's (or P2P peer's) copy lasting at most this fraction of the operator being
        searched marks that member as the late arriver even when the detector flagged it
        (:class:`~holmes.localize.search.GraphSearch`); 0 trusts the detector's labels alone.

    Returns
    -------
    Report

    Raises
    ------
    JobError, ConfigError
        Bad job or arguments (the pivot's log missing, a rank outside the world, ...).
    """
    if window < 2:
        raise ConfigError(f"window={window} must be >= 2")
    if top_k < 1:
        raise ConfigError(f"top={top_k} must be >= 1")
    if not delta > 1.0:
        raise ConfigError(f"delta={delta} must be > 1")
    src = open_source(job)
    world = src.world_size
    pivots = [int(pivot)] + [int(m) for m in (monitors or []) if int(m) != int(pivot)]
    for p in pivots:
        if not 0 <= p < world:
            raise ConfigError(f"pivot rank {p} is outside world_size {world}")
    assumptions: list[str] = []
    topo = topology if topology is not None else src.topology
    if topo is None:
        from holmes.topology import default_topology

        topo = default_topology(world)
        assumptions.append(f"no topology.json: default rail-optimized two-tier Clos, "
                           f"{topo.gpus_per_host} GPUs per host ({world} GPUs)")
    elif topo.num_gpus < world:
        raise ConfigError(f"topology has {topo.num_gpus} GPUs, the job {world} ranks")
    det = resolve_detector(detector)
    assumptions.append("abnormal operators flagged by " + " ".join(repr(det).split()))
    search = GraphSearch(src, det, late_ratio=late_ratio)
    if search.rank_ops(pivots[0]) is None:
        raise JobError(f"pivot rank {pivots[0]}: {src.missing.get(pivots[0], 'log unavailable')}")
    it_all, dur_all = _iteration_times(src, pivots[0])
    its, durs = it_all[-window:], dur_all[-window:].astype(float)
    irregular = its[irregular_mask(durs, delta)]
    if len(its) < 5:
        assumptions.append(f"only {len(its)} iteration(s) in the window: irregularity rates are unreliable")
    chosen = irregular
    if max_iterations is not None and len(irregular) > max_iterations:
        sev = durs[np.isin(its, irregular)]
        chosen = np.sort(irregular[np.argsort(-sev, kind="stable")[:max_iterations]])
        assumptions.append(f"searched the {max_iterations} most irregular of {len(irregular)} irregular iterations")
    causes: list[RootCause] = []
    without: list[int] = []
    for it in chosen.tolist():
        starts = [s for p in pivots for s in _start_operators(search, p, it, max_starts)]
        found = search.search(it, starts) if starts else []
        if not found:
            without.append(it)
        causes += found
    ranking = DeviceRanking(method=method, prior=prior, alpha=alpha, decay=topo.decay)
    piv_series = durs
    healthy = HealthyPaths(search.graph, topo) if exonerate else None
    probe = NetworkProbe(search, topo, max_reads=probe_reads) if probe_reads > 0 else None
    hprobe = HostProbe(search, topo, max_reads=host_reads) if include_host and host_reads > 0 else None
    implicated: list[list[str]] = []
    for c in causes:
        ro = search.graph.ranks[c.rank]
        series = ro.position_series(int(ro.op_index[c.row]), its, gap=c.cause == COMPUTE)
        c.rate = irregularity_rate(series, piv_series, max_lag=rate_lag)
        implicated.append(_implicated(c, ro, topo, healthy=healthy, hprobe=hprobe, probe=probe,
                                      include_host=include_host, min_share=exonerate_bytes,
                                      speedup=exonerate_speedup))
    if narrow:
        narrowed = narrow_by_coverage(implicated, [c.rate for c in causes],
                                      [c.cause != COMPUTE for c in causes])
        for c, before, devs in zip(causes, implicated, narrowed):
            if len(devs) < len(before):
                c.devices = devs
        implicated = narrowed
    for c, devs in zip(causes, implicated):
        ranking.add(devs, c.rate)
    if include_host:
        gpus_of: dict[str, list[str]] = {}
        for d in ranking.sums:
            if device_kind(d) == "gpu":
                gpus_of.setdefault(f"host:{topo.host_of(int(d.split(':', 1)[1]))}", []).append(d)
        ranking.explain_away(gpus_of)
    index = ranking.index()
    ranked = [DeviceScore(d, device_kind(d), s, index.get(d, 0.0), ranking.counts.get(d, 0))
              for d, s in ranking.ranked()]
    if not len(irregular):
        assumptions.append(f"no irregular iteration (delta={delta}) on pivot rank {pivots[0]}: nothing to localize")
    if src.missing:
        assumptions.append(f"{len(src.missing)} rank(s) missing or unreadable; the search went around them")
    log.info("localize: %d irregular iterations, %d causes, %d ranks read", len(irregular), len(causes),
             len(src.ranks_read))
    return Report(devices=ranked[:top_k], all_devices=ranked, root_causes=causes,
                  irregular_iterations=[int(i) for i in irregular], world_size=world, fetched=src.ranks_read,
                  missing=dict(src.missing), assumptions=assumptions, pivots=pivots,
                  window=[int(i) for i in its], bytes_read=src.bytes_read,
                  params={"pivot": pivots[0], "window": window, "top_k": top_k, "delta": delta, "method": method,
                          "alpha": alpha}, iterations_without_cause=without)


def _start_operators(search: GraphSearch, pivot: int, iteration: int, max_starts: int | None) -> list[tuple[int, int]]:
    """The pivot's abnormal operators of ``iteration`` to search from, ``(rank, row)`` in start
    order: all of them, or the ``max_starts`` that lasted longest beyond their usual duration."""
    ro = search.rank_ops(pivot)
    if ro is None:
        return []
    assert ro.abnormal is not None
    lo, hi = ro.iteration_rows(iteration)
    rows = np.arange(lo, hi)
    rows = rows[ro.abnormal[rows]]
    if max_starts is not None and rows.size > max_starts:
        rows = rows[np.argsort(-ro.excess()[1][rows], kind="stable")[:max_starts]]
    rows = rows[np.argsort(ro.start[rows], kind="stable")]
    return [(pivot, int(r)) for r in rows]


def _implicated(c: RootCause, ro: Any, topo: Any, *, healthy: HealthyPaths | None, hprobe: HostProbe | None,
                probe: NetworkProbe | None, include_host: bool, min_share: float, speedup: float) -> list[str]:
    """Devices one root cause implicates, after clearing and probing (also set on ``c.devices``
    when a probe narrowed them)."""
    nb = int(ro.nbytes[c.row])
    if c.cause == COMPUTE:
        devs = cause_devices(c.cause, c.ranks, topo, include_host=include_host)
        verdict = hprobe.verdict(c.ranks[0], c.iteration) if hprobe is not None and len(c.ranks) == 1 else None
        if verdict is not None:
            devs = [d for d in devs if device_kind(d) == verdict]
            c.devices = devs
        return devs
    ex = None
    if healthy is not None:
        slow_speed = nb / max(int(ro.excess()[1][c.row]), 1)
        ex = healthy.devices(c.iteration, nb * min_share, min_speed=speedup * slow_speed)
    devs = cause_devices(c.cause, c.ranks, topo, include_host=include_host, exonerated=ex)
    if probe is not None:
        t0, t1 = int(ro.start[c.row]), int(ro.end[c.row])
        devs = probe.refine(int(ro.iteration[c.row]), c.ranks, devs, window=(t0 - 2 * (t1 - t0), t1),
                            min_fine_bytes=nb * min_share)
        c.devices = devs
    return devs


def _iteration_times(src: Any, rank: int) -> tuple[np.ndarray, np.ndarray]:
    got = src.iteration_times(rank)
    exc = getattr(src, "errors", {}).get(rank) if got is None else None
    if exc is not None:
        raise exc  # the typed error naming the unreadable iterations/ops file
    if got is None or len(got[0]) == 0:
        raise JobError(f"pivot rank {rank}: no iterations in its log")
    return np.asarray(got[0]), np.asarray(got[1])
