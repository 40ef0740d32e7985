"""Transfer cost model: which devices each transfer group crosses, and how fast it goes.

A transfer group (*xgroup*, see :class:`~holmes.simulate.program.Program`) is a communicator's
ring (all-reduce, all-gather, reduce-scatter: hops ``r_i -> r_{i+1}`` over its ranks in
ascending order, cyclic), a communicator's all-to-all (every pair of members) or one pipeline
link (a send/recv pair). A hop between GPUs on one host crosses ``nvswitch:<host>`` at
``nvlink_gbps``; a hop between hosts crosses the devices of ``topology.path(a, b)`` (NICs,
cables, switches), all at ``nic_gbps``.

The transfer time of a ring is set by its slowest hop, so an instance moving ``V`` effective
bytes takes ``latency + V * max_d(F_d / bw_d)`` over the devices ``d`` the group crosses, with
``F_d`` the active fault factor of ``d`` (1 when healthy). Only faulted devices can change the
maximum, so each xgroup keeps its healthy ``1 / bw`` and a short list of (fault, ``1 / bw_d``)
pairs for the faulted devices it crosses: the engine applies faults by integer look-ups.

Effective bytes (ring algorithms): all-reduce ``2 (n-1)/n * nbytes``, all-gather and
reduce-scatter ``(n-1)/n * nbytes``, all-to-all ``(n-1)/n * nbytes`` (pairwise exchange, limited
per NIC), send/recv ``nbytes``. Latency: ``base_us`` plus ``step_us`` per ring step
(``2 (n-1)`` steps for all-reduce, ``n-1`` otherwise, one for P2P).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from holmes.simulate.faults import FaultSpec
from holmes.simulate.program import AR, SEND, RECV, Program
from holmes.topology import kinds

__all__ = ["NetworkModel", "build_network"]

log = logging.getLogger(__name__)


@dataclass
class NetworkModel:
    """Per-instance transfer parameters and per-xgroup fault look-ups (all numpy)."""

    inst_vol: np.ndarray  # effective bytes per instance (float64)
    inst_lat_ns: np.ndarray  # latency per instance (float64)
    xg_inv_bw: np.ndarray  # healthy ns per byte of every xgroup
    xg_fault_ptr: np.ndarray  # CSR over xgroups
    xg_fault_idx: np.ndarray  # index into the fault list
    xg_fault_inv_bw: np.ndarray  # ns per byte of the faulted device
    crossed: dict[str, int]  # device id -> number of xgroups crossing it (network faults)


def _hops(members: list[np.ndarray], a2a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(a, b, xgroup) of every hop of every xgroup, vectorized per group size."""
    out_a, out_b, out_x = [], [], []
    sizes = np.array([len(m) for m in members])
    for n in np.unique(sizes):
        for is_a2a in (False, True):
            sel = np.flatnonzero((sizes == n) & (a2a == is_a2a))
            if sel.size == 0:
                continue
            arr = np.stack([members[i] for i in sel])
            if is_a2a:
                i, j = np.triu_indices(n, 1)
            elif n == 2:
                i, j = np.array([0]), np.array([1])
            else:
                i = np.arange(n)
                j = (i + 1) % n
            out_a.append(arr[:, i].ravel())
            out_b.append(arr[:, j].ravel())
            out_x.append(np.repeat(sel, len(i)))
    if not out_a:
        e = np.zeros(0, np.int64)
        return e, e, e
    return np.concatenate(out_a), np.concatenate(out_b), np.concatenate(out_x)


def build_network(prog: Program, topology, faults: list[FaultSpec], *, nvlink_gbps: float = 150.0,
                  nic_gbps: float = 50.0, base_us: float = 8.0, step_us: float = 1.5) -> NetworkModel:
    """Transfer parameters of ``prog`` on ``topology`` with the network ``faults`` located.

    Parameters
    ----------
    prog : Program
    topology : ClusterTopology
        Needs ``gpus_per_host`` and ``path``.
    faults : list of FaultSpec
        All faults; compute faults are ignored here (indices refer to this list).
    nvlink_gbps, nic_gbps : float
        Bus bandwidth (GB/s) of an intra-host (NVSwitch) hop and of an inter-host hop.
    base_us, step_us : float
        Latency of a transfer and of each ring step.
    """
    gph = topology.gpus_per_host
    inv_nv, inv_nic = 1.0 / nvlink_gbps, 1.0 / nic_gbps  # ns per byte (GB/s = bytes/ns)
    members = prog.xgroup_members
    a2a = prog.xgroup_a2a if prog.xgroup_a2a is not None else np.zeros(len(members), bool)
    ha, hb, hx = _hops(members, a2a)
    inter = (ha // gph) != (hb // gph)
    nx_ = len(members)
    xg_inter = np.zeros(nx_, dtype=bool)
    xg_inter[hx[inter]] = True
    xg_inv_bw = np.where(xg_inter, inv_nic, inv_nv)

    n = prog.inst_size.astype(np.float64)
    op = prog.inst_op
    p2p = (op == SEND) | (op == RECV)
    frac = np.where(op == AR, 2.0 * (n - 1) / n, (n - 1) / n)
    frac[p2p] = 1.0
    steps = np.where(op == AR, 2.0 * (n - 1), n - 1)
    steps[p2p] = 1.0
    inst_vol = prog.inst_bytes.astype(np.float64) * frac
    inst_lat = (base_us + step_us * steps) * 1e3

    pairs: list[tuple[int, int, float]] = []  # (xgroup, fault index, inv_bw)
    crossed: dict[str, int] = {}
    path_cache: dict[tuple[int, int], tuple[str, ...]] = {}
    leaf_kinds = getattr(topology, "kind", "custom") in ("rail-optimized", "fat-tree")
    for fi, f in enumerate(faults):
        if f.is_compute:
            continue
        kind, name = f.kind, kinds.name_of(f.device)
        if kind == "nic":
            g = int(name)
            hit = inter & ((ha == g) | (hb == g))
            inv = inv_nic
        elif kind == "nvswitch":
            h = int(name)
            hit = (~inter) & (ha // gph == h) & (hb // gph == h)
            inv = inv_nv
        else:
            inv = inv_nic
            cand = inter.copy()
            if leaf_kinds:
                # leaves (switches NICs hang off) are never transit hops in these topologies
                ends = [f.device] if kind == "switch" else kinds.link_ends(f.device)
                leaf_ranks = set()
                for e in ends:
                    if kinds.is_kind(e, "nic"):
                        leaf_ranks.add(kinds.number(e))
                leaves = [e for e in ends if kinds.is_kind(e, "switch")]
                nic_leaf = {e: [] for e in leaves}
                if leaves:
                    leaf_of = _leaf_array(topology)
                    for e in leaves:
                        nic_leaf[e] = np.flatnonzero(leaf_of == e).tolist()
                is_leaf = any(len(v) for v in nic_leaf.values())
                if leaf_ranks or is_leaf:
                    under = set(leaf_ranks)
                    for v in nic_leaf.values():
                        under.update(v)
                    u = np.zeros(prog.world_size + 1, dtype=bool)
                    u[[r for r in under if r < prog.world_size]] = True
                    cand &= u[ha] | u[hb]
            hit = np.zeros_like(inter)
            for k in np.flatnonzero(cand):
                a, b = int(ha[k]), int(hb[k])
                key = (a, b) if a < b else (b, a)
                p = path_cache.get(key)
                if p is None:
                    p = path_cache[key] = topology.path(*key)
                if f.device in p:
                    hit[k] = True
        xs = np.unique(hx[hit])
        crossed[f.device] = int(xs.size)
        if xs.size == 0:
            log.warning("fault %s: no transfer of this job crosses %s; it has no effect", f, f.device)
        pairs.extend((int(x), fi, inv) for x in xs)
    pairs.sort()
    ptr = np.zeros(nx_ + 1, dtype=np.int64)
    if pairs:
        xs_arr = np.array([p[0] for p in pairs], dtype=np.int64)
        np.cumsum(np.bincount(xs_arr, minlength=nx_), out=ptr[1:])
    return NetworkModel(
        inst_vol=inst_vol, inst_lat_ns=inst_lat, xg_inv_bw=xg_inv_bw, xg_fault_ptr=ptr,
        xg_fault_idx=np.array([p[1] for p in pairs], dtype=np.int64),
        xg_fault_inv_bw=np.array([p[2] for p in pairs], dtype=np.float64), crossed=crossed,
    )


def _leaf_array(topology) -> np.ndarray:
    out = np.empty(topology.num_gpus, dtype=object)
    for r in range(topology.num_gpus):
        try:
            out[r] = topology.leaf_of(r)
        except Exception:  # noqa: BLE001 - single-host topologies have no leaves
            out[r] = ""
    return out
