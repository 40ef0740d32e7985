"""A tiny deterministic trace generator for localization tests (not the project simulator).

Each iteration runs, in one global order, a forward pass over pipeline stages (compute, TP
all-reduce, send to the next stage), a backward pass (compute, TP all-reduce, send to the previous
stage) and a DP all-reduce. A collective starts when its last member is ready and ends after its
transfer time; P2P likewise. Faults: ("gpu", rank) slows compute, ("nic", rank) slows inter-host
transfers of that rank, ("nvswitch", host) slows intra-host transfers. Labels come from a
fault-free counterfactual run with the same noise.
"""

from __future__ import annotations

import numpy as np

from holmes.io import MemoryJob
from holmes.io.schema import ops_table
from holmes.topology import ParallelLayout

GPH = 8


def _run(layout, iters, rng_seed, fault, active):
    W = layout.world_size
    rng = np.random.default_rng(rng_seed)
    comms = layout.communicators()
    cid_of = {}
    for cid, c in comms.items():
        for r in c.ranks:
            cid_of[(c.kind, r)] = cid
    t = np.zeros(W)
    rows = {r: [] for r in range(W)}
    seqc: dict = {}
    idx = np.zeros(W, dtype=int)

    def comp(r, it, base):
        f = fault is not None and fault[0] == "gpu" and fault[1] == r and it in active
        return base * (1 + 0.02 * noise[r, it, cnt[r]]) * (fault[2] if f else 1.0)

    def xfer(members, it, base):
        f = 1.0
        if fault is not None and it in active:
            hosts = {m // GPH for m in members}
            if fault[0] == "nic" and fault[1] in members and len(hosts) > 1:
                f = fault[2]
            if fault[0] == "nvswitch" and len(hosts) == 1 and fault[1] in hosts:
                f = fault[2]
        return base * f

    noise = rng.standard_normal((W, iters, 64))
    cnt = np.zeros(W, dtype=int)

    def emit(r, it, cid, seq, op, peer, s, e):
        rows[r].append((r, it, int(idx[r]), cid, seq, op, peer, 8, int(s), int(e)))
        idx[r] += 1

    def coll(members, kind, it, base_c, base_x):
        members = list(members)
        starts = {}
        for m in members:
            starts[m] = t[m] + comp(m, it, base_c)
            cnt[m] += 1
        end = max(starts.values()) + xfer(members, it, base_x)
        cid = cid_of[(kind, members[0])]
        k = seqc.get((cid, members[0]), 0)
        for m in members:
            seqc[(cid, m)] = k + 1
            emit(m, it, cid, k, "all_reduce", None, starts[m], end)
            t[m] = end

    def p2p(a, b, it, base_c, base_x):
        sa = t[a] + comp(a, it, base_c); sb = t[b] + comp(b, it, base_c * 0.1)
        cnt[a] += 1; cnt[b] += 1
        end = max(sa, sb) + xfer([a, b], it, base_x)
        cid = cid_of[("pp", a)]
        k = seqc.get((cid, a, b), 0)
        seqc[(cid, a, b)] = k + 1
        emit(a, it, cid, k, "send", b, sa, end)
        emit(b, it, cid, k, "recv", a, sb, end)
        t[a] = end; t[b] = end

    tp_groups = layout.groups("tp") if layout.tp > 1 else [(r,) for r in range(W)]
    stage_of = {r: layout.coords(r)["pp"] for r in range(W)}
    for it in range(iters):
        idx[:] = 0
        cnt[:] = 0
        for direction in (1, -1):
            stages = range(layout.pp) if direction == 1 else range(layout.pp - 1, -1, -1)
            for s in stages:
                for g in tp_groups:
                    if stage_of[g[0]] == s and len(g) > 1:
                        coll(g, "tp", it, 1000.0, 200.0)
                for r in range(W):
                    if stage_of[r] == s:
                        nxt = layout.pp_next(r) if direction == 1 else layout.pp_prev(r)
                        if nxt is not None:
                            p2p(r, nxt, it, 500.0, 300.0)
        if layout.dp > 1:
            for g in layout.groups("dp_cp") if hasattr(layout, "groups") else []:
                coll(g, "dp", it, 800.0, 600.0)
    return rows


def synth_job(tp=2, pp=2, dp=2, iters=30, seed=0, fault=None, active=None, drop=()):
    """A MemoryJob plus the fault's device id. ``fault`` = (kind, index, factor)."""
    layout = ParallelLayout(tp=tp, pp=pp, dp=dp, order="tp-dp-pp")
    active = set(active if active is not None else range(10, iters, 4))
    real = _run(layout, iters, seed, fault, active)
    cf = _run(layout, iters, seed, None, set())
    ops = {}
    for r in range(layout.world_size):
        if r in drop:
            continue
        rr, cc = real[r], cf[r]
        cols = list(zip(*rr))
        dur = np.array([x[9] - x[8] for x in rr]); cdur = np.array([x[9] - x[8] for x in cc])
        ab = dur > cdur * 1.1 + 20
        ops[r] = ops_table(rank=list(cols[0]), iteration=list(cols[1]), op_index=list(cols[2]),
                           comm_id=list(cols[3]), seq=list(cols[4]), op=list(cols[5]), peer=list(cols[6]),
                           nbytes=list(cols[7]), start_ns=list(cols[8]), end_ns=list(cols[9]), abnormal=ab)
    meta = {"world_size": layout.world_size,
            "communicators": {cid: {"kind": c.kind, "ranks": list(c.ranks)} for cid, c in layout.communicators().items()}}
    return MemoryJob(meta, ops)


def test_synth_labels_only_faulty_iterations():
    job = synth_job(tp=2, pp=2, dp=2, iters=12, fault=("gpu", 3, 2.0), active=[5])
    ab = {r: job.ops(r).column("abnormal").to_numpy(zero_copy_only=False) for r in job.available_ranks()}
    its = job.ops(0).column("iteration").to_numpy()
    assert ab[0][its == 5].any() and not ab[0][its < 5].any()
