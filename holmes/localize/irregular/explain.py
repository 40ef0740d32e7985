"""One iteration explained by Algorithm 1 (the irregular analysis's gather step, per iteration).

:func:`explain_iteration` runs the search from the monitored ranks over one irregular iteration
and checks its verdicts against every read rank's compute (:mod:`holmes.localize.irregular.straggler`) and,
on a job read whole, against the transfer times (:mod:`holmes.localize.irregular.transfer`);
:func:`implicated_devices` turns a root cause into the devices it implicates, after the
healthy-path exoneration and the network and host probes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from holmes.calibration.thresholds import Thresholds, or_shipped
from holmes.localize.evidence.ranking import cause_devices, network_devices
from holmes.localize.evidence.search import COMPUTE, NETWORK, GraphSearch, RootCause
from holmes.localize.irregular.healthy import HealthyPaths
from holmes.localize.irregular.host_probe import HostProbe
from holmes.localize.irregular.probe import NetworkProbe
from holmes.localize.irregular.straggler import classify, compute_growth
from holmes.localize.irregular.transfer import TransferTimes, pick_channels
from holmes.topology import kinds
from holmes.units import NS_PER_MS

__all__ = ["explain_iteration", "implicated_devices", "pivot_compute", "search_iteration", "start_operators"]


def explain_iteration(run: Any, iteration: int, iteration_excess: float,
                      transfers: TransferTimes | None = None) -> list[RootCause] | None:
    """Root causes of one iteration: Algorithm 1 from the monitored ranks, checked against the
    compute of every rank read (:mod:`holmes.localize.irregular.straggler`) and, when every channel's
    transfers were read (``transfers``, a job read whole), against the transfer times
    (:mod:`holmes.localize.irregular.transfer`).

    Returns None for a common-mode slowdown (ranks of several hosts computed longer together,
    or unrelated channels transferred slower together), else the causes:

    1. a compute straggler replaces the search's causes other than compute causes on the same
       ranks;
    2. with ``transfers``: the channels whose transfers took longer (network causes, on the
       devices they all cross), else only the search's compute causes;
    3. without: the pivot's own compute may be the cause (:func:`pivot_compute`), beside the
       search's causes.
    """
    p, search = run.params, run.search
    found = search_iteration(search, p.pivots, iteration, p.t.max_starts)
    if p.t.straggler_share > 0 and iteration_excess > 0:
        kind, ranks = _stragglers(search, run.topology, iteration, iteration_excess, p.t)
        if kind == "common":
            return None
        if kind is not None:
            keep = [c for c in found if c.cause == COMPUTE and set(c.ranks) <= set(ranks)]
            return keep or [_straggler_cause(search, run.topology, kind, ranks, iteration)]
    if transfers is not None and iteration_excess > 0:
        ex, sig = transfers.excess(iteration, min_iterations=p.t.channel_min_iterations)
        kind, chans = pick_channels(ex, sig, {c: transfers.ranks_of(c) for c in ex}, iteration_excess,
                                    share=p.t.channel_share, noise_z=p.t.channel_z,
                                    dominance=p.t.channel_dominance)
        if kind == "common":
            return None
        if kind == "network":
            causes = [_transfer_cause(search, transfers, c, iteration, ex[c]) for c in chans]
            if len(causes) > 1:  # slow channels through one rank: the devices they all cross
                sets = [set(network_devices(c.ranks, run.topology)) for c in causes]
                shared = sorted(set.intersection(*sets))
                if shared:
                    for c in causes:
                        c.devices = shared
            return causes
        # no channel's transfers explain it: the search's network verdicts rest on operator
        # labels the transfer times do not confirm; its compute causes stand
        return [c for c in found if c.cause == COMPUTE]
    own = pivot_compute(search, p.pivot, iteration, iteration_excess, p.t.pivot_compute_share)
    if own is not None:
        found = [c for c in found if not (c.cause == COMPUTE and c.ranks == own.ranks)] + [own]
    return found


def _stragglers(search: GraphSearch, topo: Any, iteration: int, excess: float,
                t: Thresholds) -> tuple[str | None, tuple[int, ...]]:
    growth: dict[int, float] = {}
    sigma: dict[int, float] = {}
    for r, ro in search.graph.ranks.items():
        g = compute_growth(ro, iteration, min_iterations=t.straggler_min_iterations)
        if g is not None:
            growth[r], sigma[r] = g
    return classify(growth, sigma, excess, topo.host_of, share=t.straggler_share, ratio=t.straggler_ratio,
                    noise_z=t.straggler_z)


def _transfer_cause(search: GraphSearch, transfers: TransferTimes, channel: int, iteration: int,
                    excess: float) -> RootCause:
    """A network cause on a channel whose transfers took longer (:mod:`holmes.localize.irregular.transfer`)."""
    rank, row = transfers.where(channel, iteration)
    ro = search.graph.ranks[rank]
    step = ro.describe(row, search.graph.comm_ids)
    step["transfer_excess_ns"] = int(excess)
    ranks = transfers.ranks_of(channel)
    return RootCause(iteration, NETWORK, tuple(ranks), rank, row, step, [step],
                     f"its transfers took {excess / NS_PER_MS:.1f} ms longer than usual in this iteration")


def _straggler_cause(search: GraphSearch, topo: Any, kind: str, ranks: tuple[int, ...], iteration: int) -> RootCause:
    """A compute cause on the straggler(s): the GPU when a host-mate was read and ran normally,
    the host when several of its ranks straggled, else left to the host probe."""
    r0 = ranks[0]
    ro = search.graph.ranks[r0]
    k = ro.largest_gap_row(iteration)
    assert k is not None  # a straggler of ``iteration`` has rows in it
    step = ro.describe_compute(k, search.graph.comm_ids)
    host = topo.host_of(r0)
    devices: list[str] | None
    if kind == "host":
        devices = [kinds.host(host)]
        note = f"ranks {list(ranks)} of host {host} all computed longer in this iteration"
    else:
        mates = [m for m in search.graph.ranks if m != r0 and topo.host_of(m) == host]
        devices = [kinds.gpu(r0)] if mates else None
        note = f"rank {r0}'s own compute grew in this iteration; its read host-mates' did not" if mates else None
    return RootCause(iteration, COMPUTE, ranks, r0, k, step, [step], note, devices=devices)


def pivot_compute(search: GraphSearch, pivot: int, iteration: int, iteration_excess: float,
                  share: float | None = None) -> RootCause | None:
    """The pivot as its own straggler: a compute cause on the pivot when the growth of its own
    compute gaps in ``iteration`` (over their usual length at each position) accounts for at least
    ``share`` of how much longer the iteration was than the reference. A slow pivot waits for
    nobody, so no abnormal operator of its own leads the search to it. ``share``: threshold
    ``pivot_compute_share``."""
    share = or_shipped(share, "pivot_compute_share")
    ro = search.rank_ops(pivot)
    if ro is None or iteration_excess <= 0:
        return None
    lo, hi = ro.iteration_rows(iteration)
    gap_x = ro.excess()[0][lo:hi]
    if hi <= lo or gap_x.sum() < share * iteration_excess:
        return None
    k = ro.largest_gap_row(iteration)
    step = ro.describe_compute(k, search.graph.comm_ids)
    return RootCause(iteration, COMPUTE, (pivot,), pivot, k, step, [step],
                     f"the pivot's own compute grew by {gap_x.sum() / NS_PER_MS:.1f} ms in this iteration")


def search_iteration(search: GraphSearch, pivots: list[int], iteration: int,
                     max_starts: int | None) -> list[RootCause]:
    """Algorithm 1 on one iteration from the monitored ranks' abnormal operators."""
    starts = [s for piv in pivots for s in start_operators(search, piv, iteration, max_starts)]
    return search.search(iteration, starts) if starts else []


def start_operators(search: GraphSearch, pivot: int, iteration: int, max_starts: int | None) -> list[tuple[int, int]]:
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


def implicated_devices(c: RootCause, ro: Any, topo: Any, *, healthy: HealthyPaths | None, hprobe: HostProbe | None,
                       probe: NetworkProbe | None, include_host: bool, min_share: float, speedup: float) -> list[str]:
    """Devices one root cause implicates, after clearing and probing (also set on ``c.devices``
    when a probe narrowed them)."""
    nb = int(ro.nbytes[c.row])
    if c.devices:  # already decided (a straggler, or the devices every slow channel crosses)
        return list(c.devices)
    if c.cause == COMPUTE:
        devs = cause_devices(c.cause, c.ranks, topo, include_host=include_host)
        verdict = hprobe.verdict(c.ranks[0], c.iteration) if hprobe is not None and len(c.ranks) == 1 else None
        if verdict is not None:
            devs = [d for d in devs if kinds.kind_of(d) == verdict]
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
