"""The rank process of a real run: a small Megatron-style training step on CPU (gloo).

One process per rank (started by :func:`holmes.eval.realrun.run_real_job`) trains ``layers``
MLP blocks per pipeline stage:

* tensor parallelism: column-parallel ``W1`` and row-parallel ``W2``; an ``all_reduce`` of the
  block output in forward and of the input gradient in backward, or with sequence parallelism an
  ``all_gather`` before and a ``reduce_scatter`` after each block (and in backward);
* pipeline parallelism: blocking ``send``/``recv`` between adjacent stages in a 1F1B schedule over
  ``micro_batches`` (combined exchanges ordered lower-stage-sends-first, which is deadlock free
  with gloo's rendezvous send; see :func:`one_f_one_b`);
* data parallelism: a gradient ``all_reduce`` at the end of the step, or ``reduce_scatter`` +
  ``all_gather`` (distributed optimizer);
* expert parallelism (``ep > 1``): one MoE block per stage with an ``all_to_all`` dispatch and
  combine in forward and backward.

Compute is real (float32 matmuls with torch on one thread), paced to an emulated device: a
matmul lasts ``max(CPU time, flops / device_flops)`` (``device_flops`` 0: CPU time only). Every communication function the
step calls is a *wire* function installed on ``torch.distributed`` before the
:class:`~holmes.logger.CommOpsLogger` is enabled, so the logger times it: it runs the real gloo
operator and then sleeps the emulated wire time of the transfer (:class:`WireModel`), which the
injected network faults stretch. Compute faults multiply the matmul work.
"""

from __future__ import annotations

import json
import logging
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["one_f_one_b", "WireModel", "worker"]

log = logging.getLogger(__name__)

_NET_KINDS = ("nic", "link", "switch", "nvswitch")


def one_f_one_b(stage: int, stages: int, micro_batches: int) -> list[tuple[str, int]]:
    """The 1F1B action list of one pipeline stage with blocking point-to-point operators.

    Actions are ``("F", mb)``, ``("B", mb)``, ``("recv_f", 0)``, ``("send_f", 0)``,
    ``("recv_b", 0)``, ``("send_b", 0)``. In the steady state a stage exchanges with its next
    stage as *send then receive* and with its previous stage as *receive then send*, so that
    every pair of blocking operators meets (gloo's ``send`` waits for the matching ``recv``).

    Examples
    --------
    >>> [a for a, _ in one_f_one_b(1, 2, 2)]
    ['recv_f', 'F', 'B', 'recv_f', 'send_b', 'F', 'B', 'send_b']
    """
    s, P, M = stage, stages, micro_batches
    w = min(P - s - 1, M)
    r = M - w
    first, last = s == 0, s == P - 1
    a: list[tuple[str, int]] = []
    for i in range(w):
        if not first:
            a.append(("recv_f", 0))
        a.append(("F", i))
        if not last:
            a.append(("send_f", 0))
    if r > 0 and not first:
        a.append(("recv_f", 0))
    for i in range(r):
        a.append(("F", w + i))
        if not last:
            a += [("send_f", 0), ("recv_b", 0)]
        a.append(("B", i))
        if not first:
            a += [("recv_f", 0), ("send_b", 0)] if i < r - 1 else [("send_b", 0)]
    for i in range(w):
        if not last:
            a.append(("recv_b", 0))
        a.append(("B", r + i))
        if not first:
            a.append(("send_b", 0))
    return a


class WireModel:
    """Emulated wire time of every transfer, from the topology path and the active network faults.

    A hop ``u -> v`` of ``S`` bytes takes ``(lat + S / bw) * F`` seconds, with ``lat, bw`` of the
    NVSwitch (same host) or of the NIC path (different hosts) and ``F`` the product of the
    factors of the active faults on the hop: a faulty device (nic, link, switch, nvswitch) on
    ``topology.path(u, v)``, or a ``p2p:u>v`` fault (point-to-point transfers ``u -> v`` only).
    Collectives run as rings over the group's members in rank order and are as slow as their
    slowest hop: all_reduce ``2(n-1)`` steps of ``S/n``; all_gather, reduce_scatter and
    all_to_all ``n-1`` steps of ``S/n``.

    Parameters
    ----------
    topology : ClusterTopology
    net : dict
        ``intra_bw``, ``inter_bw`` (bytes/s), ``intra_lat``, ``inter_lat`` (s).
    faults : list of dict
        ``{"kind", "device", "pair"}`` of every fault (compute faults are ignored here).
    factors : numpy.ndarray
        ``(len(faults), iterations)`` active factor per iteration (1.0 = inactive).
    """

    def __init__(self, topology: Any, net: dict, faults: list[dict], factors: np.ndarray) -> None:
        self.topo = topology
        self.net = net
        self.gph = topology.gpus_per_host
        self.faults = faults
        self.factors = factors
        self._hop_cache: dict[tuple[int, int, bool], list[int]] = {}

    def _hop_faults(self, u: int, v: int, p2p: bool) -> list[int]:
        key = (u, v, p2p)
        hit = self._hop_cache.get(key)
        if hit is None:
            path = set(self.topo.path(u, v))
            hit = []
            for i, f in enumerate(self.faults):
                if f["kind"] in _NET_KINDS and f["device"] in path:
                    hit.append(i)
                elif f["kind"] == "p2p" and p2p and tuple(f["pair"]) == (u, v):
                    hit.append(i)
            self._hop_cache[key] = hit
        return hit

    def hop(self, u: int, v: int, nbytes: float, it: int, p2p: bool = False) -> float:
        """Seconds of the hop ``u -> v`` carrying ``nbytes`` in iteration ``it`` (< 0: warm-up: no fault)."""
        same = u // self.gph == v // self.gph
        lat = self.net["intra_lat"] if same else self.net["inter_lat"]
        bw = self.net["intra_bw"] if same else self.net["inter_bw"]
        t = lat + nbytes / bw
        if it >= 0:
            for i in self._hop_faults(u, v, p2p):
                t *= float(self.factors[i, it])
        return t

    def p2p(self, src: int, dst: int, nbytes: int, it: int) -> float:
        return self.hop(src, dst, nbytes, it, p2p=True)

    def _hops(self, op: str, ranks: tuple[int, ...]) -> list[tuple[int, int]]:
        n = len(ranks)
        if op == "all_to_all":
            return [(u, v) for u in ranks for v in ranks if u != v]
        return [(ranks[i], ranks[(i + 1) % n]) for i in range(n)]

    def collective(self, op: str, ranks: tuple[int, ...], nbytes: int, it: int) -> float:
        n = len(ranks)
        if n < 2:
            return 0.0
        chunk = nbytes / n
        worst = max(self.hop(u, v, chunk, it) for u, v in self._hops(op, ranks))
        steps = 2 * (n - 1) if op == "all_reduce" else n - 1
        return steps * worst

    def collective_sender_delay(self, op: str, ranks: tuple[int, ...], nbytes: int, it: int, rank: int) -> float:
        """In the sender-side mode, the extra seconds ``rank`` is late to the collective: the fault's
        extra on the slowest faulty hop it sends on (0 when none of its hops is faulty)."""
        n = len(ranks)
        if n < 2 or it < 0:
            return 0.0
        chunk = nbytes / n
        steps = 2 * (n - 1) if op == "all_reduce" else n - 1
        extra = [self.hop(u, v, chunk, it) - self.hop(u, v, chunk, -1) for u, v in self._hops(op, ranks) if u == rank]
        return steps * max(extra, default=0.0)


class _Clock:
    """Per-iteration accounting of one rank: compute, wire and in-operator seconds."""

    def __init__(self, iterations: int) -> None:
        self.it = -1
        self.compute = np.zeros(iterations)
        self.wire = np.zeros(iterations)
        self.comm = np.zeros(iterations)

    def add(self, what: str, dt: float) -> None:
        if self.it >= 0:
            getattr(self, what)[self.it] += dt


def _install_wires(dist: Any, rank: int, wire: WireModel, clock: _Clock, side: str = "wire") -> dict[str, Any]:
    """Replace the torch.distributed functions the step uses by wire functions; returns the originals.

    ``side="wire"``: a network fault lengthens the emulated wire time, inside the logged operator on
    every side. ``side="sender"``: the transfer takes its healthy wire time and the sender sleeps the
    fault's extra *before* it enters the operator (outside the logged window), as a slow link looks
    from the sending side (its data leaves late); the receiver and the other members wait for it."""
    sender = side == "sender"
    names = ("send", "recv", "all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single")
    orig = {n: getattr(dist, n) for n in names}
    ranks_of: dict[int, tuple[int, ...]] = {}

    def members(group: Any) -> tuple[int, ...]:
        hit = ranks_of.get(id(group))
        if hit is None:
            hit = ranks_of[id(group)] = tuple(sorted(dist.get_process_group_ranks(group)))
        return hit

    def nb(t: Any) -> int:
        return int(t.numel()) * int(t.element_size())

    def finish(t0: float, w: float) -> None:
        if w > 0:
            time.sleep(w)
        clock.add("wire", w)
        clock.add("comm", time.perf_counter() - t0)

    def p2p_times(src: int, dst: int, n: int, is_sender: bool) -> tuple[float, float]:
        """(seconds slept before the operator, emulated wire seconds inside it)."""
        if not sender:
            return 0.0, wire.p2p(src, dst, n, clock.it)
        base = wire.p2p(src, dst, n, -1)
        return (wire.p2p(src, dst, n, clock.it) - base if is_sender else 0.0), base

    def coll_times(op: str, group: Any, n: int) -> tuple[float, float]:
        ranks = members(group)
        if not sender:
            return 0.0, wire.collective(op, ranks, n, clock.it)
        return wire.collective_sender_delay(op, ranks, n, clock.it, rank), wire.collective(op, ranks, n, -1)

    def late(pre: float) -> None:
        if pre > 0:
            time.sleep(pre)
            clock.add("wire", pre)

    def send(tensor: Any, dst: int, group: Any = None, **kw: Any) -> None:
        pre, w = p2p_times(rank, dst, nb(tensor), True)
        late(pre)
        t0 = time.perf_counter()
        orig["send"](tensor, dst=dst, group=group, **kw)
        finish(t0, w)

    def recv(tensor: Any, src: int, group: Any = None, **kw: Any) -> int:
        _, w = p2p_times(src, rank, nb(tensor), False)
        t0 = time.perf_counter()
        out = orig["recv"](tensor, src=src, group=group, **kw)
        finish(t0, w)
        return out

    def all_reduce(tensor: Any, op: Any = None, group: Any = None, async_op: bool = False) -> None:
        pre, w = coll_times("all_reduce", group, nb(tensor))
        late(pre)
        t0 = time.perf_counter()
        orig["all_reduce"](tensor, group=group)
        finish(t0, w)

    def all_gather_into_tensor(output_tensor: Any, input_tensor: Any, group: Any = None, async_op: bool = False) -> None:
        pre, w = coll_times("all_gather", group, nb(output_tensor))
        late(pre)
        t0 = time.perf_counter()
        orig["all_gather_into_tensor"](output_tensor, input_tensor, group=group)
        finish(t0, w)

    def reduce_scatter_tensor(output: Any, input: Any, op: Any = None, group: Any = None,  # noqa: A002
                              async_op: bool = False) -> None:
        pre, w = coll_times("reduce_scatter", group, nb(input))
        late(pre)
        t0 = time.perf_counter()
        orig["reduce_scatter_tensor"](output, input, group=group)
        finish(t0, w)

    def all_to_all_single(output: Any, input: Any, output_split_sizes: Any = None,  # noqa: A002
                          input_split_sizes: Any = None, group: Any = None, async_op: bool = False) -> None:
        pre, w = coll_times("all_to_all", group, nb(input))
        late(pre)
        t0 = time.perf_counter()
        orig["all_to_all_single"](output, input, group=group)
        finish(t0, w)

    for fn in (send, recv, all_reduce, all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single):
        setattr(dist, fn.__name__, fn)
    return orig


def worker(rank: int, cfg: dict, out: str, init_file: str, topology: Any, factors: np.ndarray) -> None:
    """One rank of a real run (the target of ``torch.multiprocessing.start_processes``).

    Parameters
    ----------
    rank : int
    cfg : dict
        :meth:`holmes.eval.realrun.RealRunConfig.to_dict` plus ``"faults"`` as parsed dicts.
    out : str
        The job directory.
    init_file : str
        File store of ``init_process_group``.
    topology : ClusterTopology
    factors : numpy.ndarray
        ``(n_faults, iterations)`` active factor of every fault in every iteration.
    """
    import warnings

    import torch
    import torch.distributed as dist

    import holmes.logger
    from holmes.topology.layout import ParallelLayout

    warnings.filterwarnings("ignore", message=".*reduce_scatter_tensor.*deprecated", category=FutureWarning)
    torch.set_num_threads(1)
    W = cfg["tp"] * cfg["pp"] * cfg["dp"]
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=W,
                            timeout=timedelta(seconds=float(cfg["timeout"])))
    layout = ParallelLayout(tp=cfg["tp"], pp=cfg["pp"], dp=cfg["dp"], ep=cfg["ep"])
    kinds = [("tp", "tp"), ("pp", "pp"), ("dp", "dp")] + ([("ep", "ep")] if cfg["ep"] > 1 else [])
    mine: dict[str, tuple[Any, tuple[int, ...]]] = {}
    all_groups: dict[str, list[Any]] = {}
    for kind, gkind in kinds:
        if layout.degree(kind) < 2:
            continue
        for ranks in layout.groups(gkind):  # every rank creates every group, in the same order
            g = dist.new_group(list(ranks))
            all_groups.setdefault(kind, []).append(g)
            if rank in ranks:
                mine[kind] = (g, tuple(ranks))

    faults = cfg["faults"]
    n_it = int(cfg["iterations"])
    gph = topology.gpus_per_host
    cf = np.ones(n_it)  # compute factor of this rank per iteration
    for i, f in enumerate(faults):
        if (f["kind"] == "gpu" and f["index"] == rank) or (f["kind"] == "host" and f["index"] == rank // gph):
            cf = cf * factors[i]
    clock = _Clock(n_it)
    wire = WireModel(topology, cfg["net"], faults, factors)
    orig = _install_wires(dist, rank, wire, clock, side=cfg.get("fault_side", "wire"))
    logger = holmes.logger.CommOpsLogger(out, layout=layout, groups=all_groups)

    tp, tpg = mine.get("tp", (None, (rank,)))
    dpc, dpg = mine.get("dp", (None, (rank,)))
    ppc = mine.get("pp", (None, ()))[0]
    epc, epg = mine.get("ep", (None, (rank,)))
    TP, EP = len(tpg), len(epg)
    sp = bool(cfg["sequence_parallel"]) and TP > 1
    stage = layout.coords(rank)["pp"]
    P = cfg["pp"]
    prev, nxt = layout.pp_prev(rank), layout.pp_next(rank)
    T, d, F, L = cfg["tokens"], cfg["hidden"], cfg["ffn"] // TP, cfg["layers"]
    Tl = T // TP if sp else T  # tokens this rank holds between blocks
    gen = torch.Generator().manual_seed(int(cfg["seed"]) * 1000 + rank)
    W1 = [torch.randn(d, F, generator=gen) * 0.05 for _ in range(L)]
    W2 = [torch.randn(F, d, generator=gen) * 0.05 for _ in range(L)]
    We = torch.randn(d, d, generator=gen) * 0.05 if EP > 1 else None
    params = W1 + W2 + ([We] if We is not None else [])
    grads = [torch.zeros_like(p) for p in params]
    cur = {"f": 1.0}

    rate = float(cfg.get("device_flops") or 0.0)

    def mm(a: Any, b: Any) -> Any:
        """``a @ b`` with the active compute factor: (factor - 1) more row-slices of the same work,
        paced to the emulated device: it lasts at least ``factor x flops / device_flops``."""
        t0 = time.perf_counter()
        out_ = a @ b
        f = cur["f"]
        extra = f - 1.0
        while extra > 1e-6:
            k = max(1, int(round(min(extra, 1.0) * a.shape[0])))
            _ = a[:k] @ b
            extra -= min(extra, 1.0)
        if rate > 0:
            left = 2.0 * a.shape[0] * a.shape[1] * b.shape[1] * f / rate - (time.perf_counter() - t0)
            if left > 0:
                time.sleep(left)
        return out_

    def tp_in(x: Any) -> Any:  # before a block: SP gathers the sequence
        if not sp:
            return x
        full = torch.empty(T, d)
        dist.all_gather_into_tensor(full, x, group=tp)
        return full

    def tp_out(y: Any) -> Any:  # after a block: reduce partial sums over TP
        if TP < 2:
            return y
        if sp:
            part = torch.empty(T // TP, d)
            dist.reduce_scatter_tensor(part, y.contiguous(), group=tp)
            return part
        dist.all_reduce(y, group=tp)
        return y

    def forward(x: Any) -> tuple[Any, list]:
        saved = []
        for l in range(L):
            xin = tp_in(x)
            t1 = time.perf_counter()
            h = mm(xin, W1[l])
            a = torch.relu(h)
            y = mm(a, W2[l])
            t2 = time.perf_counter()
            clock.add("compute", t2 - t1)
            y = tp_out(y)
            saved.append((xin, h, a))
            x = x + y
        if We is not None:
            buf = torch.empty_like(x)
            dist.all_to_all_single(buf, x.contiguous(), group=epc)  # dispatch tokens to experts
            t1 = time.perf_counter()
            e = torch.relu(mm(buf, We))
            clock.add("compute", time.perf_counter() - t1)
            back = torch.empty_like(e)
            dist.all_to_all_single(back, e.contiguous(), group=epc)  # combine
            saved.append((buf, e))
            x = x + back
        return x, saved

    def backward(dy: Any, saved: list) -> Any:
        if We is not None:
            buf, e = saved.pop()
            de = torch.empty_like(dy)
            dist.all_to_all_single(de, dy.contiguous(), group=epc)
            t1 = time.perf_counter()
            de = de * (e > 0)
            grads[-1] += mm(buf.T.contiguous(), de)
            dbuf = mm(de, We.T)
            clock.add("compute", time.perf_counter() - t1)
            dx_e = torch.empty_like(dbuf)
            dist.all_to_all_single(dx_e, dbuf.contiguous(), group=epc)
            dy = dy + dx_e
        for l in reversed(range(L)):
            xin, h, a = saved[l]
            g = tp_in(dy)
            t1 = time.perf_counter()
            grads[L + l] += mm(a.T.contiguous(), g)
            da = mm(g, W2[l].T)
            dh = da * (h > 0)
            grads[l] += mm(xin.T.contiguous(), dh)
            dx = mm(dh, W1[l].T)
            clock.add("compute", time.perf_counter() - t1)
            dy = dy + tp_out(dx)
        return dy

    plan = one_f_one_b(stage, P, int(cfg["micro_batches"]))

    def step() -> None:
        for gr in grads:
            gr.zero_()
        pending_x: list = []
        stash: dict[int, tuple[Any, list]] = {}
        fwd_out: list = []
        bwd_out: list = []
        grad_in: list = []
        for act, mb in plan:
            if act == "recv_f":
                x = torch.empty(Tl, d)
                dist.recv(x, src=prev, group=ppc)
                pending_x.append(x)
            elif act == "F":
                x = pending_x.pop(0) if stage > 0 else torch.randn(Tl, d, generator=gen)
                y, saved = forward(x)
                stash[mb] = (y, saved)
                if nxt is not None:
                    fwd_out.append(y)
            elif act == "send_f":
                dist.send(fwd_out.pop(0).contiguous(), dst=nxt, group=ppc)
            elif act == "recv_b":
                g = torch.empty(Tl, d)
                dist.recv(g, src=nxt, group=ppc)
                grad_in.append(g)
            elif act == "B":
                y, saved = stash.pop(mb)
                dy = grad_in.pop(0) if nxt is not None else y / T
                dx = backward(dy, saved)
                if prev is not None:
                    bwd_out.append(dx)
            elif act == "send_b":
                dist.send(bwd_out.pop(0).contiguous(), dst=prev, group=ppc)
        if dpc is not None:
            flat = torch.cat([gr.flatten() for gr in grads])
            n = len(dpg)
            if cfg["distributed_optimizer"]:
                pad = (-flat.numel()) % n
                if pad:
                    flat = torch.cat([flat, flat.new_zeros(pad)])
                shard = torch.empty(flat.numel() // n)
                dist.reduce_scatter_tensor(shard, flat, group=dpc)
                t1 = time.perf_counter()
                shard.mul_(-1e-3 / n)
                clock.add("compute", time.perf_counter() - t1)
                dist.all_gather_into_tensor(flat, shard, group=dpc)
            else:
                dist.all_reduce(flat, group=dpc)
                flat.mul_(-1e-3 / n)
            off = 0
            for p in params:
                p.add_(flat[off: off + p.numel()].view_as(p))
                off += p.numel()

    warm = int(cfg["warmup"])
    try:
        for it in range(-warm, n_it):
            if it == 0:
                logger.enable()
            if it >= 0:
                logger.step(it)
            clock.it = it
            cur["f"] = float(cf[it]) if it >= 0 else 1.0
            step()
        logger.close(timeout=float(cfg["timeout"]))
    finally:
        for n_, f_ in orig.items():
            setattr(dist, n_, f_)
    side = Path(out) / "realrun-ranks"
    side.mkdir(exist_ok=True)
    rec = {"rank": rank, "compute_s": np.round(clock.compute, 6).tolist(), "wire_s": np.round(clock.wire, 6).tolist(),
           "comm_s": np.round(clock.comm, 6).tolist(), "compute_factor": cf.tolist()}
    tmp = side / f".rank-{rank:05d}.json.partial"
    tmp.write_text(json.dumps(rec), encoding="utf-8")
    os.replace(tmp, side / f"rank-{rank:05d}.json")
    dist.destroy_process_group()
