"""The per-rank communication program of one Megatron-style training iteration.

One op *template* is built per pipeline stage (every rank of a stage issues the same sequence of
ops, up to communicator ids and peers), then the templates are expanded over all ranks with numpy
into flat arrays (:class:`Program`) that the engine runs once per iteration.

Workload (:class:`Workload`)
----------------------------
Per micro-batch and per layer of the stage, in issue order (``g`` = compute gap before the op):

* forward, sequence parallel (default): ``all_gather`` (tp) -> [``all_gather`` (cp, K/V)] ->
  attention -> ``reduce_scatter`` (tp) -> ``all_gather`` (tp) -> MLP -> ``reduce_scatter`` (tp).
  Without sequence parallelism each block ends with one ``all_reduce`` (tp) instead.
  In MoE layers (``ep > 1``; every layer is MoE) the MLP block is router -> ``all_to_all`` (ep,
  dispatch) -> experts -> ``all_to_all`` (ep, combine), without tp collectives.
* backward: the same blocks in reverse order with the conjugate collectives (the backward of an
  all-gather is a reduce-scatter and vice versa; cp: ``reduce_scatter`` of dK/dV; ep: two
  ``all_to_all``).
* pipeline (pp > 1): Megatron's non-interleaved 1F1B schedule with ``micro_batches`` M: stage
  ``s`` runs ``min(pp - s - 1, M)`` warm-up forwards, then steady 1F1B, then cool-down backwards.
  ``recv`` of the activation before a forward (not on the first stage), ``send`` after it (not
  on the last), ``recv`` of the gradient before a backward (not on the last stage), ``send``
  after it (not on the first). P2P ops are blocking rendezvous (see the engine), so the two ops
  of Megatron's batched ``send_forward_recv_backward`` / ``send_backward_recv_forward`` are
  issued one after the other in a parity order: even stages send first, odd stages receive
  first. This makes the rendezvous graph acyclic for every (pp, M); the tests run the engine,
  which raises on a deadlock, over many shapes.
* data parallel, after the last backward: gradient ``reduce_scatter`` on ``dp`` (the dp x cp
  group), on ``edp`` (expert data parallel) when ``ep > 1``, the optimizer step, then parameter
  ``all_gather`` on the same groups (distributed optimizer, default) -- or one ``all_reduce`` per
  group before the optimizer step without it.

Sizes (bf16, bytes): activation ``A = tokens * hidden * 2`` per micro-batch; tp collectives move
``A`` (all-gather output / reduce-scatter input), cp all-gathers ``2 * A / tp`` (K and V), ep
all-to-alls ``A * topk / tp``, P2P sends ``A / tp``, dp collectives the stage's parameters
``12 * hidden^2 * layers / tp * 2`` (expert MLP parameters 8/12 of those go over ``edp``).
Compute: ``fwd_ms`` per layer and micro-batch (attention 40%, MLP 60%, 5% of it as layer-norm
before the first collective of a block), backward ``2 * fwd_ms``, optimizer ``optimizer_ms``,
data loading ``data_ms`` before the first op of an iteration.

Number of ops per rank per iteration (``Program.ops_per_rank``): with tp > 1, sequence parallel,
no cp/ep, L layers per stage and M micro-batches: ``8*L*M`` tp ops + up to ``4*M`` P2P ops + 2
dp ops; the default 8,192-GPU benchmark shape (tp=8, pp=8, dp=128, L=1, M=4) has 42 (first and
last stage) to 50 (middle stages), mean 48 -- 4,800 per rank over 100 iterations, in the paper's
4-10K ops per rank per window.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

import numpy as np

from holmes.errors import ConfigError
from holmes.io.schema import OP_NAMES
from holmes.topology.layout import ParallelLayout

__all__ = ["Workload", "default_micro_batches", "TAIL_CAP", "Program", "build_program", "stage_template", "OP_CODE", "KIND_NAMES"]

log = logging.getLogger(__name__)

OP_CODE = {name: i for i, name in enumerate(OP_NAMES)}
AR, AG, RS, A2A = OP_CODE["all_reduce"], OP_CODE["all_gather"], OP_CODE["reduce_scatter"], OP_CODE["all_to_all"]
SEND, RECV = OP_CODE["send"], OP_CODE["recv"]

#: communicator kinds the program uses (index = kind code); "edp" communicators have kind "dp"
KIND_NAMES = ("tp", "cp", "ep", "dp", "edp", "pp")
_GROUP_KIND = {"tp": "tp", "cp": "cp", "ep": "ep", "dp": "dp_cp", "edp": "edp", "pp": "pp"}
TP, CP, EP, DP, EDP, PP = range(6)
FWD, BWD = 0, 1  # P2P direction: activation (lower -> higher stage) or gradient
#: cap of the exponential draw of a heavy-tail excursion (``1 + scale * min(E, TAIL_CAP)``)
TAIL_CAP = 6.0


@dataclass(frozen=True)
class Workload:
    """What one training iteration does (see the module docstring for the op sequence).

    Parameters
    ----------
    micro_batches : int or None
        Micro-batches per iteration (M of the 1F1B schedule). None (default): ``max(4, 4 * pp)``,
        resolved by :meth:`resolved` once the pipeline depth is known. Megatron jobs keep M several
        times the pipeline depth, since the 1F1B bubble is ``(pp - 1) / (M + pp - 1)`` of the step;
        ``4 * pp`` keeps it under 20% (``docs/simulator-fit.md``).
    layers_per_stage : int
        Transformer layers per pipeline stage.
    sequence_parallel : bool
        all-gather/reduce-scatter (True) or all-reduce (False) tp collectives.
    distributed_optimizer : bool
        dp reduce-scatter + all-gather (True) or all-reduce (False).
    tokens, hidden, topk : int
        Tokens per micro-batch, hidden size, experts per token (MoE).
    fwd_ms, optimizer_ms, data_ms : float
        Compute times (ms) of one layer's forward per micro-batch, the optimizer step, data loading.
    jitter : float
        Sigma of the lognormal noise on every compute gap (independent per op).
    tail_prob, tail_scale : float
        Heavy tail of the per-op compute noise: with probability ``tail_prob`` a gap is also
        multiplied by ``1 + tail_scale * E``, ``E ~ Exp(1)`` capped at :data:`TAIL_CAP` (a kernel
        launch stall, a page fault, a Python/GC pause on the host).
    xfer_jitter : float
        Sigma of the lognormal noise on every transfer time.
    xfer_tail_prob, xfer_tail_scale : float
        Heavy tail of the transfer noise (transient congestion), as for compute.
    iter_jitter : float
        Sigma of a lognormal factor shared by every rank of the job in one iteration, multiplying
        all its compute (data-dependent work, input pipeline, the cluster's shared state): the
        per-iteration noise that makes iteration times vary as a whole.
    rank_iter_jitter : float
        Sigma of a lognormal factor per (rank, iteration) on that rank's compute (clock boost,
        thermals, host-side interference).
    p2p_order : {"parity", "send-first"}
        Order of the two blocking P2P ops of a batched pair: "parity" (even stages send first,
        odd stages receive first; deadlock-free) or "send-first" (every stage sends first; it
        deadlocks for pp >= 2 with a steady phase -- kept to test deadlock detection).

    Notes
    -----
    The defaults are fitted to published Megatron step breakdowns and to the real-run corpus
    (``scripts/fit_simulator.py``, ``docs/simulator-fit.md``): compute is the largest share of a
    step, the healthy iteration CV is ~1%, and a 1.3x slower GPU stretches its iterations by
    more than 10%.
    """

    micro_batches: int | None = None
    layers_per_stage: int = 1
    sequence_parallel: bool = True
    distributed_optimizer: bool = True
    tokens: int = 4096
    hidden: int = 4096
    topk: int = 2
    fwd_ms: float = 3.5
    optimizer_ms: float = 2.0
    data_ms: float = 0.5
    jitter: float = 0.02
    tail_prob: float = 0.001
    tail_scale: float = 0.5
    xfer_jitter: float = 0.04
    xfer_tail_prob: float = 0.002
    xfer_tail_scale: float = 0.5
    iter_jitter: float = 0.01
    rank_iter_jitter: float = 0.004
    p2p_order: str = "parity"

    def __post_init__(self) -> None:
        names = ("layers_per_stage", "tokens", "hidden", "topk")
        if self.micro_batches is not None:
            names = ("micro_batches",) + names
        for name in names:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ConfigError(f"{name}={v!r} must be an integer >= 1")
        for name in ("fwd_ms", "optimizer_ms", "data_ms", "jitter", "tail_scale", "xfer_jitter", "xfer_tail_scale",
                     "iter_jitter", "rank_iter_jitter"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v < 0:
                raise ConfigError(f"{name}={v!r} must be a finite number >= 0")
        for name in ("tail_prob", "xfer_tail_prob"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                raise ConfigError(f"{name}={v!r} must be a probability in [0, 1]")
        if self.p2p_order not in ("parity", "send-first"):
            raise ConfigError(f"p2p_order={self.p2p_order!r} must be 'parity' or 'send-first'")

    def resolved(self, pp: int) -> "Workload":
        """This workload with ``micro_batches`` fixed for a pipeline of depth ``pp``.

        >>> Workload().resolved(4).micro_batches, Workload(micro_batches=3).resolved(4).micro_batches
        (16, 3)
        """
        if self.micro_batches is not None:
            return self
        return replace(self, micro_batches=default_micro_batches(pp))


def default_micro_batches(pp: int) -> int:
    """Default micro-batches per iteration for pipeline depth ``pp``: ``max(4, 4 * pp)``."""
    return max(4, 4 * int(pp))


@dataclass
class _Op:
    op: int
    kind: int
    k: int  # index among this kind's ops in the iteration (pp: micro-batch)
    nbytes: int
    gap_ns: float
    step: int = 0  # pp: +1 next stage, -1 previous stage
    pdir: int = -1  # pp: FWD or BWD


class _TemplateBuilder:
    def __init__(self, lay: ParallelLayout, w: Workload) -> None:
        self.lay, self.w = lay, w
        self.ops: list[_Op] = []
        self.pending = 0.0
        self.counts = [0] * 6
        self.has = {TP: lay.tp > 1, CP: lay.cp > 1, EP: lay.ep > 1, DP: lay.dp * lay.cp > 1,
                    EDP: lay.ep > 1 and lay.expert_dp > 1, PP: lay.pp > 1}
        act = w.tokens * w.hidden * 2
        self.act = act
        self.p2p_bytes = act // lay.tp
        self.cp_bytes = 2 * act // lay.tp
        self.a2a_bytes = act * w.topk // lay.tp
        params = 12 * w.hidden * w.hidden * w.layers_per_stage // lay.tp * 2
        self.dp_bytes = params if not self.has[EDP] else params * 4 // 12
        self.edp_bytes = params * 8 // 12
        self.fwd_ns = w.fwd_ms * 1e6

    def compute(self, ns: float) -> None:
        self.pending += ns

    def coll(self, kind: int, op: int, nbytes: int) -> None:
        if not self.has[kind]:
            return
        self.ops.append(_Op(op, kind, self.counts[kind], int(nbytes), self.pending))
        self.counts[kind] += 1
        self.pending = 0.0

    def p2p(self, op: int, step: int, pdir: int, mb: int) -> None:
        self.ops.append(_Op(op, PP, mb, self.p2p_bytes, self.pending, step, pdir))
        self.pending = 0.0

    def layer(self, backward: bool) -> None:
        f = self.fwd_ns * (2.0 if backward else 1.0)
        sp = self.w.sequence_parallel
        attn, mlp = 0.4 * f, 0.6 * f
        blocks = ["attn", "mlp"] if not backward else ["mlp", "attn"]
        for b in blocks:
            cost = attn if b == "attn" else mlp
            if b == "mlp" and self.has[EP]:
                self.compute(0.05 * cost)
                self.coll(EP, A2A, self.a2a_bytes)
                self.compute(0.95 * cost)
                self.coll(EP, A2A, self.a2a_bytes)
                continue
            if sp:
                self.compute(0.05 * cost)
                self.coll(TP, AG, self.act)
                if b == "attn" and not backward:
                    self.coll(CP, AG, self.cp_bytes)
                self.compute(0.95 * cost)
                if b == "attn" and backward:
                    self.coll(CP, RS, self.cp_bytes)
                self.coll(TP, RS, self.act)
            else:
                if b == "attn" and not backward:
                    self.coll(CP, AG, self.cp_bytes)
                self.compute(cost)
                if b == "attn" and backward:
                    self.coll(CP, RS, self.cp_bytes)
                self.coll(TP, AR, self.act)

    def forward(self) -> None:
        for _ in range(self.w.layers_per_stage):
            self.layer(False)

    def backward(self) -> None:
        for _ in range(self.w.layers_per_stage):
            self.layer(True)


def stage_template(lay: ParallelLayout, w: Workload, stage: int) -> tuple[list[_Op], float]:
    """The op sequence of every rank of pipeline ``stage`` and the compute tail after its last op.

    Returns ``(ops, tail_ns)``; see the module docstring for the schedule.
    """
    w = w.resolved(lay.pp)
    b = _TemplateBuilder(lay, w)
    P, M, s = lay.pp, w.micro_batches, stage
    first, last = s == 0, s == P - 1
    even = s % 2 == 0 or w.p2p_order == "send-first"
    b.compute(w.data_ms * 1e6)
    warm = min(P - s - 1, M)
    rem = M - warm
    fmb = bmb = 0  # next forward / backward micro-batch
    for _ in range(warm):
        if not first:
            b.p2p(RECV, -1, FWD, fmb)
        b.forward()
        if not last:
            b.p2p(SEND, +1, FWD, fmb)
        fmb += 1
    if rem > 0 and not first:
        b.p2p(RECV, -1, FWD, fmb)
    for i in range(rem):
        b.forward()
        if not last:  # send_forward_recv_backward
            pair = [(SEND, +1, FWD, fmb), (RECV, +1, BWD, bmb)]
            for x in (pair if even else pair[::-1]):
                b.p2p(*x)
        fmb += 1
        b.backward()
        if not first:
            if i == rem - 1:
                b.p2p(SEND, -1, BWD, bmb)
            else:  # send_backward_recv_forward
                pair = [(SEND, -1, BWD, bmb), (RECV, -1, FWD, fmb)]
                for x in (pair if even else pair[::-1]):
                    b.p2p(*x)
        bmb += 1
    for _ in range(warm):
        if not last:
            b.p2p(RECV, +1, BWD, bmb)
        b.backward()
        if not first:
            b.p2p(SEND, -1, BWD, bmb)
        bmb += 1
    dist = w.distributed_optimizer
    b.coll(DP, RS if dist else AR, b.dp_bytes)
    b.coll(EDP, RS if dist else AR, b.edp_bytes)
    b.compute(w.optimizer_ms * 1e6)
    if dist:
        b.coll(DP, AG, b.dp_bytes)
        b.coll(EDP, AG, b.edp_bytes)
    return b.ops, b.pending


@dataclass
class Program:
    """The flat communication program of one iteration, all ranks (rank-major).

    Op ``j`` of rank ``r`` is row ``rank_ptr[r] + j``. Instances (one logical collective or one
    send/recv pair) have ids ``inst``; ``inst_ptr``/``inst_members`` list each instance's rows.
    Transfer groups (``xgroup``): one per communicator (its ring or all-to-all), then one per
    pipeline link (a pair of adjacent stages) for P2P.
    """

    layout: ParallelLayout
    workload: Workload
    rank_ptr: np.ndarray
    op: np.ndarray
    kind: np.ndarray
    comm: np.ndarray
    peer: np.ndarray
    nbytes: np.ndarray
    gap_ns: np.ndarray
    seq_base: np.ndarray
    seq_step: np.ndarray
    inst: np.ndarray
    tail_ns: np.ndarray  # per rank
    inst_ptr: np.ndarray
    inst_members: np.ndarray
    inst_xgroup: np.ndarray
    inst_op: np.ndarray
    inst_bytes: np.ndarray
    inst_size: np.ndarray
    comm_ids: list[str]
    comm_kinds: list[str]
    comm_ranks: list[np.ndarray]
    xgroup_members: list[np.ndarray] = field(default_factory=list)
    xgroup_a2a: np.ndarray | None = None

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    @property
    def num_ops(self) -> int:
        return int(self.op.size)

    @property
    def ops_per_rank(self) -> np.ndarray:
        return np.diff(self.rank_ptr)

    @property
    def num_instances(self) -> int:
        return int(self.inst_ptr.size - 1)

    def rank_of_row(self) -> np.ndarray:
        return np.repeat(np.arange(self.world_size, dtype=np.int32), self.ops_per_rank)


def build_program(lay: ParallelLayout, w: Workload) -> Program:
    """Expand the stage templates over every rank of ``lay``.

    Examples
    --------
    >>> prog = build_program(ParallelLayout(tp=2, pp=2, dp=2), Workload(micro_batches=2))
    >>> prog.world_size, int(prog.ops_per_rank[0]), prog.num_instances > 0
    (8, 22, True)
    """
    w = w.resolved(lay.pp)
    W, P, M = lay.world_size, lay.pp, w.micro_batches
    kinds_present = []
    arrays: dict[int, np.ndarray] = {}
    comm_ids: list[str] = []
    comm_kinds: list[str] = []
    comm_ranks: list[np.ndarray] = []
    comm_base = np.zeros(6, dtype=np.int64)
    gidx = np.zeros((6, W), dtype=np.int64)
    for kc, kname in enumerate(KIND_NAMES):
        if kname == "edp" and lay.ep == 1:
            continue
        arr = lay.group_array(_GROUP_KIND[kname])
        if arr.shape[1] < 2:
            continue
        kinds_present.append(kc)
        arrays[kc] = arr
        comm_base[kc] = len(comm_ids)
        gidx[kc, arr] = np.arange(arr.shape[0])[:, None]
        ckind = "dp" if kname == "edp" else kname
        for i in range(arr.shape[0]):
            comm_ids.append(f"{kname}-{i}")
            comm_kinds.append(ckind)
            comm_ranks.append(arr[i])
    templates = [stage_template(lay, w, s) for s in range(P)]
    # collectives: same count per kind on every stage (groups of one kind live inside one stage)
    ccount = np.zeros(6, dtype=np.int64)
    for kc in range(5):
        c = {sum(1 for o in t if o.kind == kc) for t, _ in templates}
        if len(c) != 1:  # pragma: no cover - guarded by construction
            raise ConfigError(f"internal: stages disagree on the number of {KIND_NAMES[kc]} ops")
        ccount[kc] = c.pop()
    inst_base = np.zeros(7, dtype=np.int64)
    for kc in range(5):
        ngroups = arrays[kc].shape[0] if kc in arrays else 0
        inst_base[kc + 1] = inst_base[kc] + ngroups * ccount[kc]
    p2p_base = inst_base[5]
    pp_arr = lay.group_array("pp")  # (groups, P)
    n_links = pp_arr.shape[0] * max(P - 1, 0)
    n_inst = int(p2p_base + n_links * 2 * M)

    n_per_stage = np.array([len(t) for t, _ in templates], dtype=np.int64)
    stage_of = np.empty(W, dtype=np.int64)
    stage_of[pp_arr] = np.arange(P)[None, :]
    per_rank = n_per_stage[stage_of]
    rank_ptr = np.zeros(W + 1, dtype=np.int64)
    np.cumsum(per_rank, out=rank_ptr[1:])
    T = int(rank_ptr[-1])
    op = np.empty(T, np.int8)
    kind = np.empty(T, np.int8)
    comm = np.empty(T, np.int32)
    peer = np.full(T, -1, np.int32)
    nbytes = np.empty(T, np.int64)
    gap = np.empty(T, np.float64)
    seq_base = np.empty(T, np.int64)
    seq_step = np.empty(T, np.int64)
    inst = np.empty(T, np.int64)
    tail = np.empty(W, np.float64)
    pp_gidx = np.empty(W, np.int64)
    pp_gidx[pp_arr] = np.arange(pp_arr.shape[0])[:, None]
    for s, (tmpl, tail_ns) in enumerate(templates):
        ranks = pp_arr[:, s]
        tail[ranks] = tail_ns
        n = len(tmpl)
        if n == 0:
            continue
        rows = rank_ptr[ranks][:, None] + np.arange(n)[None, :]  # (R, n)
        t_op = np.array([o.op for o in tmpl], np.int8)
        t_kind = np.array([o.kind for o in tmpl], np.int8)
        op[rows] = t_op
        kind[rows] = t_kind
        nbytes[rows] = np.array([o.nbytes for o in tmpl], np.int64)
        gap[rows] = np.array([o.gap_ns for o in tmpl], np.float64)
        for j, o in enumerate(tmpl):
            r_rows = rows[:, j]
            if o.kind != PP:
                g = gidx[o.kind, ranks]
                comm[r_rows] = comm_base[o.kind] + g
                seq_base[r_rows] = o.k
                seq_step[r_rows] = ccount[o.kind]
                inst[r_rows] = inst_base[o.kind] + g * ccount[o.kind] + o.k
            else:
                g = pp_gidx[ranks]
                comm[r_rows] = comm_base[PP] + g
                peer[r_rows] = pp_arr[g, s + o.step]
                seq_base[r_rows] = o.k
                seq_step[r_rows] = M
                link = g * (P - 1) + min(s, s + o.step)
                inst[r_rows] = p2p_base + (link * 2 + o.pdir) * M + o.k
    sizes = np.bincount(inst, minlength=n_inst)
    if sizes.size != n_inst or (sizes == 0).any():  # pragma: no cover - guarded by construction
        raise ConfigError("internal: program has instances without members")
    order = np.argsort(inst, kind="stable")
    inst_ptr = np.zeros(n_inst + 1, dtype=np.int64)
    np.cumsum(sizes, out=inst_ptr[1:])
    first_row = order[inst_ptr[:-1]]
    inst_op = op[first_row]
    inst_bytes = nbytes[first_row]
    n_comms = len(comm_ids)
    is_p2p = np.arange(n_inst) >= p2p_base
    inst_xgroup = comm[first_row].astype(np.int64)
    p2p_ids = np.arange(n_inst)[is_p2p] - p2p_base
    inst_xgroup[is_p2p] = n_comms + p2p_ids // (2 * M)
    xgroup_members = list(comm_ranks)
    for g in range(pp_arr.shape[0]):
        for s in range(P - 1):
            xgroup_members.append(pp_arr[g, s:s + 2].copy())
    xa2a = np.zeros(len(xgroup_members), dtype=bool)
    xa2a[:n_comms] = [k == "ep" for k in comm_kinds]
    prog = Program(
        layout=lay, workload=w, rank_ptr=rank_ptr, op=op, kind=kind, comm=comm, peer=peer, nbytes=nbytes,
        gap_ns=gap, seq_base=seq_base, seq_step=seq_step, inst=inst, tail_ns=tail, inst_ptr=inst_ptr,
        inst_members=order.astype(np.int64), inst_xgroup=inst_xgroup, inst_op=inst_op, inst_bytes=inst_bytes,
        inst_size=sizes.astype(np.int64), comm_ids=comm_ids, comm_kinds=comm_kinds, comm_ranks=comm_ranks,
        xgroup_members=xgroup_members, xgroup_a2a=xa2a,
    )
    log.debug("program: %d ranks, %d ops/iteration (%d..%d per rank), %d instances",
              W, T, per_rank.min(), per_rank.max(), n_inst)
    return prog
