"""The persistent analysis: stragglers that are slow from the first iteration, with no pivot.

The irregular analysis explains iterations that are slower than the job's usual ones; a GPU that
is slow from the first logged iteration, or a badly balanced pipeline, never makes an iteration
irregular. This analysis asks instead, in every iteration, **who made whom wait**, and compares
every rank with its *role peers* (:mod:`~holmes.localize.peers`: same stage and tensor position
in the other data-parallel replicas), Minder-style. Its steps, as the pipeline runs them:

1. **select** -- the last ``window`` iterations of the pivot (no irregular iteration needed);
2. **gather** -- every rank's log is read once, rank by rank (:meth:`JobSource.stream`), and only
   per-rank summaries are kept:

   * *waiting caused*: in each collective the member that entered last (on every member's own
     clock: the copy that lasted least) made the others wait; along a P2P pair the later end made
     the other wait. The last member is charged ``(n - 1) * min(second-shortest - shortest
     duration, its own work since it last waited)``: the others' waiting, up to the compute it did
     since an operator made it wait (clock-free: durations and gaps are each measured on one
     rank's clock; collectives in which the whole group was slow do not reset it);
   * *own work*: per iteration the sum of the rank's compute gaps;
   * *transfer time*: per communicator (or P2P pair) and iteration, the sum of its operators'
     intrinsic transfer times (each operator's shortest copy), compared with the communicators of
     the same kind, size, volume and stages;

   a rank is an outlier in an iteration when its own work stands ``persistent_z`` robust sigmas
   (of its role group's own spread over the window) above its peers' median *and* it made others
   wait more than its peers' median did (a rank late only because it waited on someone else
   earlier -- a whole pipeline replica behind a slow stage -- has its peers' own work and is not
   an outlier; extra work that nobody waited for is not straggling); a communicator
   when its transfer time does, against its peer communicators; either is a
   straggler only when that holds in at least ``persistent_fraction`` of the window (the continuity
   rule: a one-off blip is not a straggler). Compute stragglers implicate their GPU (their host
   when most of the host's GPUs are stragglers); slow communicators the network devices on the
   paths of all of them and of few healthy ones;
3. **what-if** -- every iteration is replayed through the dependency graph of its operators
   (:mod:`~holmes.localize.whatif`) with the actual gaps and transfers, with a suspect's set to its
   peers' (its ``impact_pct``), and with every rank's work set to the job-wide median (the ideal
   step: ``slowdown = actual / ideal``, WIA's S); per stage and per replica the step with only that
   stage (replica) left as it is (WIA's decomposition; jobs of at most 1,024 ranks, one replay
   each -- beyond, the slowest stage is told by its work alone). When no device explains a slowdown of at
   least ``imbalance_pct`` %, the non-device cause is named: ``pipeline_stage_imbalance`` (one stage
   slowest on every replica) or ``microbatch_imbalance`` (the slow position moves between replicas).

Examples
--------
>>> import holmes
>>> r = holmes.localize("fixtures/gpu64-3d-slow-gpu", analysis="persistent")
>>> r.verdict in ("culprit", "healthy", "inconclusive")
True
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from holmes.errors import JobError
from holmes.localize.confidence import device_confidence
from holmes.localize.peers import Roles
from holmes.localize.ranking import device_kind, network_devices
from holmes.localize.report import DeviceScore
from holmes.localize.whatif import Program, replay
from holmes.stats import MAD_SIGMA

__all__ = ["PersistentAnalysis", "PersistentSelection", "PersistentEvidence", "Suspect"]

log = logging.getLogger(__name__)

_SEND, _RECV = "send", "recv"
_BIG = np.iinfo(np.int64).max


@dataclass
class PersistentSelection:
    """The iterations the persistent analysis looks at (no pivot iteration is singled out)."""

    window: np.ndarray
    weights: dict[int, float] = field(default_factory=dict)


@dataclass
class Suspect:
    """A persistent straggler: a rank (compute) or a communicator (network)."""

    kind: str                       # "compute" | "network"
    ranks: list[int]
    hits: int                       # outlier iterations
    excess: float                   # mean excess over the peers' median (ns per iteration)
    key: int = -1                   # slot id for network suspects
    devices: list[str] = field(default_factory=list)


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


class _Slots:
    """Per operator instance, streaming: member count, the two shortest copies (their rank, gap,
    iteration) and the bytes. Instances are ``(slot, seq)``: a slot is a communicator (collectives)
    or a ``(communicator, sender, receiver)`` pair (P2P)."""

    def __init__(self) -> None:
        self.keys: dict[tuple, int] = {}
        self.info: list[tuple] = []
        self.arr: list[dict[str, np.ndarray]] = []

    def slot(self, key: tuple, info: tuple) -> int:
        s = self.keys.get(key)
        if s is None:
            s = self.keys[key] = len(self.arr)
            self.info.append(info)
            self.arr.append(self._new(64))
        return s

    @staticmethod
    def _new(n: int) -> dict[str, np.ndarray]:
        return dict(n=np.zeros(n, np.int32), d1=np.full(n, _BIG, np.int64), r1=np.full(n, -1, np.int32),
                    g1=np.zeros(n, np.int64), it=np.full(n, -1, np.int32), d2=np.full(n, _BIG, np.int64),
                    g2=np.zeros(n, np.int64), nb=np.zeros(n, np.int64))

    def update(self, s: int, seq: np.ndarray, rank: int, dur: np.ndarray, gap: np.ndarray, it: np.ndarray,
               nb: np.ndarray) -> None:
        a = self.arr[s]
        need = int(seq.max()) + 1
        if need > len(a["n"]):
            grow = self._new(max(need, 2 * len(a["n"])))
            for k, v in a.items():
                grow[k][:len(v)] = v
            a = self.arr[s] = grow
        k = seq
        a["n"][k] += 1
        d1, d2 = a["d1"][k], a["d2"][k]
        better = dur < d1
        a["d2"][k] = np.where(better, d1, np.minimum(d2, dur))
        a["g2"][k] = np.where(better, a["g1"][k], np.where(dur < d2, gap, a["g2"][k]))
        a["d1"][k] = np.where(better, dur, d1)
        a["g1"][k] = np.where(better, gap, a["g1"][k])
        a["r1"][k] = np.where(better, rank, a["r1"][k])
        a["it"][k] = np.where(a["it"][k] < 0, it, a["it"][k])
        a["nb"][k] = np.maximum(a["nb"][k], nb)


class PersistentAnalysis:
    """Persistent stragglers against role peers, and their what-if impact (select -> gather -> rank)."""

    name = "persistent"

    def select(self, run: Any) -> PersistentSelection:
        """The last ``window`` iterations of the pivot."""
        p = run.params
        got = run.source.iteration_times(p.pivot)
        if got is None or len(got[0]) == 0:
            exc = getattr(run.source, "errors", {}).get(p.pivot)
            if exc is not None:
                raise exc
            raise JobError(f"pivot rank {p.pivot}: no iterations in its log")
        return PersistentSelection(np.asarray(got[0])[-p.window:])

    # ------------------------------------------------------------------ gather
    def gather(self, run: Any, sel: PersistentSelection) -> PersistentEvidence:
        """Read every rank once; waiting caused, own work and transfer time; suspects; what-if."""
        src, p = run.source, run.params
        W, win = src.world_size, sel.window
        T = len(win)
        roles = Roles.from_communicators(src.communicators, W)
        comm_code: dict[str, int] = {}
        comm_kind: list[str] = []
        comm_members: list[tuple[int, ...]] = []
        for cid, c in src.communicators.items():
            comm_code[cid] = len(comm_kind)
            comm_kind.append(c.kind)
            comm_members.append(tuple(int(r) for r in c.ranks))
        slots = _Slots()
        caused = np.zeros((W, T))
        compute = np.zeros((W, T))
        per_rank: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None] = [None] * W
        iter_ptr = np.zeros((W, T + 1), np.int64)
        read_iters = W <= 1024
        for r in range(W):
            t = src.stream(r)
            if t is None or t.num_rows == 0:
                continue
            starts = _iteration_starts(src, r) if read_iters else None
            per_rank[r] = self._summarize(r, t, win, starts, comm_code, comm_kind, comm_members, slots,
                                          compute, iter_ptr)
        if src.missing:
            run.assume(f"persistent: {len(src.missing)} rank(s) unreadable; their operators are missing from the "
                       f"comparison and the replay")
        ev = PersistentEvidence(win, caused, compute, roles)
        self._attribute(slots, caused)
        self._compute_suspects(run, ev)
        xs, it_of, slot_of = self._network_suspects(run, ev, slots, comm_members)
        self._whatif(run, ev, slots, per_rank, iter_ptr, xs, it_of, slot_of)
        return ev

    def _summarize(self, r: int, t: pa.Table, win: np.ndarray, starts: dict[int, int] | None,
                   comm_code: dict[str, int], comm_kind: list[str], comm_members: list[tuple[int, ...]],
                   slots: _Slots, compute: np.ndarray, iter_ptr: np.ndarray) -> tuple:
        it = t.column("iteration").to_numpy()
        keep = np.isin(it, win)
        start = t.column("start_ns").to_numpy().astype(np.int64)
        end = t.column("end_ns").to_numpy().astype(np.int64)
        frontier = np.maximum.accumulate(end)
        gap = np.empty(len(start), np.int64)
        gap[0] = 0
        gap[1:] = start[1:] - frontier[:-1]
        new_batch = np.ones(len(start), np.bool_)
        new_batch[1:] = gap[1:] >= 0
        first = np.r_[True, it[1:] != it[:-1]]
        if starts is not None:
            fi = np.flatnonzero(first)
            st = np.array([starts.get(int(i), -1) for i in it[fi].tolist()], np.int64)
            ok = st >= 0
            gap[fi[ok]] = start[fi[ok]] - st[ok]
            new_batch[fi] = True
        gap = np.maximum(gap, 0)
        it, start, end, gap, new_batch = it[keep], start[keep], end[keep], gap[keep], new_batch[keep]
        if len(it) == 0:
            return None
        new_batch[np.r_[True, it[1:] != it[:-1]]] = True
        widx = np.searchsorted(win, it).astype(np.int32)
        iter_ptr[r] = np.searchsorted(widx, np.arange(len(win) + 1))
        np.add.at(compute[r], widx, gap)
        dur = end - start
        own = _own_work(gap, dur, t.column("op_index").to_numpy()[keep])
        tk = t.filter(pa.array(keep))
        cid = tk.column("comm_id").combine_chunks()
        if not pa.types.is_dictionary(cid.type):
            cid = cid.dictionary_encode()
        lut = np.array([comm_code.setdefault(v, len(comm_code)) for v in cid.dictionary.to_pylist()] or [0])
        for v in range(len(comm_kind), len(comm_code)):
            comm_kind.append("other")
            comm_members.append(())
        comm = lut[cid.indices.to_numpy(zero_copy_only=False).astype(np.int64)]
        op = _op_codes(tk.column("op"))
        peer = tk.column("peer").fill_null(-1).to_numpy().astype(np.int64)
        seq = tk.column("seq").to_numpy().astype(np.int64)
        nb = tk.column("nbytes").to_numpy().astype(np.int64)
        is_p2p = op > 0
        sender = np.where(op == 1, r, peer)
        receiver = np.where(op == 1, peer, r)
        key = np.where(is_p2p, (comm * 2 ** 20 + sender) * 2 ** 20 + receiver, -1 - comm)
        slot_row = np.empty(len(key), np.int32)
        ukeys, inv = np.unique(key, return_inverse=True)
        for j, k in enumerate(ukeys.tolist()):
            if k < 0:
                c = -1 - k
                s = slots.slot(("c", c), ("c", comm_kind[c], comm_members[c], c))
            else:
                c, snd, rcv = k >> 40, (k >> 20) & (2 ** 20 - 1), k & (2 ** 20 - 1)
                s = slots.slot(("p", c, snd, rcv), ("p", comm_kind[c], (snd, rcv), c))
            m = inv == j
            slot_row[m] = s
            sq = seq[m]
            if (sq < 0).any():  # unknown sequence numbers: issue order within the slot
                sq = np.arange(m.sum())
                seq[m] = sq
            slots.update(s, sq, r, dur[m], own[m], widx[m], nb[m])
        return slot_row, seq.astype(np.int64), gap.astype(np.float64), new_batch

    @staticmethod
    def _attribute(slots: _Slots, caused: np.ndarray) -> None:
        """Charge each instance's last member with the waiting its own work caused."""
        for a in slots.arr:
            ok = (a["n"] >= 2) & (a["d2"] < _BIG) & (a["r1"] >= 0) & (a["it"] >= 0)
            if not ok.any():
                continue
            own = np.minimum(a["d2"][ok] - a["d1"][ok], a["g1"][ok]).clip(0)
            np.add.at(caused, (a["r1"][ok], a["it"][ok]), (a["n"][ok] - 1) * own.astype(np.float64))

    # ------------------------------------------------------------------ peers
    def _compute_suspects(self, run: Any, ev: PersistentEvidence) -> None:
        p = run.params
        roles, caused = ev.roles, ev.caused
        W, T = caused.shape
        if T == 0:
            return
        med = roles.group_median(caused)
        excess = caused - med
        step = float(np.median(ev.compute.sum(axis=0) / max(W, 1))) if W else 0.0
        floor = max(step * 1e-3, 1.0)
        flags = np.zeros((W, T), np.bool_)
        moving = 0
        counted = 0
        cexcess = ev.compute - roles.group_median(ev.compute)
        ev.compute_z = np.zeros((W, T))
        for m in roles.members:
            if m.size < 3:
                continue
            e = excess[m]
            sig = max(MAD_SIGMA * float(np.median(np.abs(e - np.median(e)))), floor)
            ce = cexcess[m]
            csig = max(MAD_SIGMA * float(np.median(np.abs(ce - np.median(ce)))), floor)
            # its own work beyond its peers', and it made others wait more than its peers did
            f = (ce > p.persistent_z * csig) & (e > 0)
            ev.compute_z[m] = ce / csig
            flags[m] = f
            counted += T
            # a slow position that moves between replicas: outliers most iterations, no persistent one
            any_out = f.any(axis=0)
            moving += int(any_out.sum()) if not (f.mean(axis=1) >= p.persistent_fraction).any() else 0
        ev.outlier_rate = float(flags.mean()) if flags.size else 0.0
        ev.moving_outliers = moving / counted if counted else 0.0
        frac = flags.mean(axis=1)
        for r in np.flatnonzero(frac >= p.persistent_fraction).tolist():
            ev.suspects.append(Suspect("compute", [r], int(flags[r].sum()), float(excess[r].mean())))
        log.info("persistent: %d compute suspect(s) among %d ranks (outlier rate %.4f)", len(ev.suspects), W,
                 ev.outlier_rate)

    def _network_suspects(self, run: Any, ev: PersistentEvidence, slots: _Slots,
                          comm_members: list[tuple[int, ...]]) -> tuple:
        """Communicators / P2P pairs whose transfers are persistently slower than their peers'."""
        p = run.params
        T = len(ev.window)
        S = len(slots.arr)
        X = np.zeros((S, T))
        NB = np.zeros(S)
        CNT = np.zeros(S)
        xs, it_of, slot_of = [], [], []
        for s, a in enumerate(slots.arr):
            ok = a["n"] > 0
            x = np.where(ok & (a["d1"] < _BIG), a["d1"], 0).astype(np.float64)
            itv = np.where(a["it"] >= 0, a["it"], 0)
            np.add.at(X[s], itv[ok], x[ok])
            NB[s] = a["nb"][ok].sum()
            CNT[s] = ok.sum()
            xs.append(x)
            it_of.append(itv)
            slot_of.append(np.full(len(x), s, np.int64))
        stage = ev.roles.stage
        classes: dict[tuple, list[int]] = {}
        for s, info in enumerate(slots.info):
            kind, members = info[1], info[2]
            if info[0] == "p":
                key = ("p", kind, int(stage[members[0]]), int(stage[members[1]]))
            else:
                key = ("c", kind, len(members))
            key += (int(CNT[s]), int(round(math.log2(NB[s] + 1) * 4)))
            classes.setdefault(key, []).append(s)
        flags = np.zeros((S, T), np.bool_)
        ratio = np.ones((S, T))
        for key, ss in classes.items():
            if len(ss) < 3:
                continue
            idx = np.asarray(ss)
            v = X[idx]
            medv = np.median(v, axis=0)
            with np.errstate(divide="ignore", invalid="ignore"):
                lr = np.log(np.where((v > 0) & (medv > 0), v / np.where(medv > 0, medv, 1), 1.0))
            sig = max(MAD_SIGMA * float(np.median(np.abs(lr - np.median(lr)))), 0.01)
            f = (lr > p.persistent_z * sig) & (lr > math.log1p(p.network_min_excess))
            flags[idx] = f
            ratio[idx] = np.exp(lr)
        ev.network_flags_rate = float(flags.mean()) if flags.size else 0.0  # type: ignore[attr-defined]
        frac = flags.mean(axis=1) if T else np.zeros(S)
        slow = np.flatnonzero(frac >= p.persistent_fraction)
        ev.slot_ratio = ratio  # type: ignore[attr-defined]
        ev.slot_flags = flags  # type: ignore[attr-defined]
        if slow.size:
            topo = run.topology
            devs_of = [network_devices(info[2], topo) for info in slots.info]
            crossing: dict[str, list[int]] = {}
            for s, devs in enumerate(devs_of):
                for d in devs:
                    crossing.setdefault(d, []).append(s)
            slow_set = set(slow.tolist())
            total_excess = sum(float((ratio[s] - 1).clip(0).mean()) for s in slow_set) or 1.0
            best: list[tuple[float, str]] = []
            for d in {d for s in slow_set for d in devs_of[s]}:
                cross = crossing[d]
                n_slow = [s for s in cross if s in slow_set]
                share = len(n_slow) / len(cross)
                cover = sum(float((ratio[s] - 1).clip(0).mean()) for s in n_slow) / total_excess
                best.append((share * cover, d))
                per_it = flags[np.asarray(cross)].mean(axis=0)
                ev.device_hits[d] = (float((per_it >= 0.5).sum()), share)
            # devices crossed by exactly the same communicators (a NIC and its cable, mirror cables)
            # cannot be told apart: keep them next to each other
            best.sort(key=lambda z: (-round(z[0], 9), tuple(crossing[z[1]]), z[1]))
            top = best[0][0] if best else 0.0
            for sc, d in best:
                if sc < 0.5 * top:
                    break
                ss = [s for s in crossing[d] if s in slow_set]
                ranks = sorted({r for s in ss for r in slots.info[s][2]})
                ev.suspects.append(Suspect("network", ranks, int(ev.device_hits[d][0]), sc, key=-1, devices=[d]))
            log.info("persistent: %d slow communicator(s); network candidates %s", slow.size,
                     [d for _, d in best[:4]])
        return xs, it_of, slot_of

    # ------------------------------------------------------------------ what-if
    def _whatif(self, run: Any, ev: PersistentEvidence, slots: _Slots, per_rank: list, iter_ptr: np.ndarray,
                xs: list, it_of: list, slot_of: list) -> None:
        p = run.params
        if not p.whatif or not slots.arr:
            return
        sizes = np.array([len(a["n"]) for a in slots.arr], np.int64)
        base = np.r_[0, np.cumsum(sizes)[:-1]]
        W, T = ev.caused.shape
        ranks = [r for r in range(W) if per_rank[r] is not None]
        lens = np.zeros(W, np.int64)
        for r in ranks:
            lens[r] = len(per_rank[r][0])
        rank_ptr = np.r_[0, np.cumsum(lens)]
        inst = np.empty(rank_ptr[-1], np.int64)
        gap = np.empty(rank_ptr[-1])
        nbat = np.empty(rank_ptr[-1], np.bool_)
        gptr = np.zeros((W, T + 1), np.int64)
        for r in ranks:
            sl, sq, g, nbt = per_rank[r]
            a, b = rank_ptr[r], rank_ptr[r + 1]
            inst[a:b] = base[sl] + sq
            gap[a:b] = g
            nbat[a:b] = nbt
            gptr[r] = iter_ptr[r] + a
        for r in range(W):
            if per_rank[r] is None:
                gptr[r] = rank_ptr[r]
        per_rank.clear()
        x = np.concatenate(xs)
        inst_it = np.concatenate(it_of)
        inst_slot = np.concatenate(slot_of)
        size = np.concatenate([a["n"] for a in slots.arr]).astype(np.int64)
        prog = Program(rank_ptr.astype(np.int64), gptr, inst, gap, nbat, x, size)
        actual = replay(prog)
        ok = np.isfinite(actual)
        if not ok.any():
            run.assume("persistent: the operators do not match across ranks; no what-if replay")
            return
        t_act = float(actual[ok].mean())
        # ideal: every rank's work per iteration at the job-wide mean, transfers at their peers'
        row_rank = np.repeat(np.arange(W, dtype=np.int32), lens)
        row_it = np.zeros(len(gap), np.int32)
        for r in ranks:
            row_it[rank_ptr[r]:rank_ptr[r + 1]] = np.repeat(np.arange(T), np.diff(iter_ptr[r]))
        C = ev.compute
        present = lens > 0
        cmed = C[present].mean(axis=0) if present.any() else np.zeros(T)  # WIA: every worker at the average
        with np.errstate(divide="ignore", invalid="ignore"):
            f_all = np.where(C > 0, cmed[None, :] / C, 1.0)
            peer_med = ev.roles.group_median(C)
            f_peer = np.where(C > 0, np.minimum(peer_med / C, 1.0), 1.0)
        ratio = getattr(ev, "slot_ratio", None)
        fx = np.minimum(1.0 / np.maximum(ratio, 1e-9), 1.0) if ratio is not None else None
        x_ideal = x * fx[inst_slot, inst_it] if fx is not None else x
        g_ideal = gap * f_all[row_rank, row_it]
        ideal = replay(prog, gap=g_ideal, x=x_ideal)
        t_ideal = float(np.nanmean(ideal[ok])) if np.isfinite(ideal[ok]).any() else float("nan")
        ev.step_actual, ev.step_ideal = t_act, t_ideal
        ev.slowdown = t_act / t_ideal if t_ideal > 0 else None
        stage, rep = ev.roles.stage, ev.roles.replica
        if 1 < ev.roles.num_stages <= 64 and W <= 1024:  # WIA's decomposition: one replay per stage
            for s in range(ev.roles.num_stages):
                keep = stage[row_rank] == s
                alt = replay(prog, gap=np.where(keep, gap, g_ideal), x=x_ideal)
                ev.by_stage[s] = float(np.nanmean(alt[ok])) / t_ideal
        n_rep = int(rep.max()) + 1 if rep.size else 0
        if 1 < n_rep <= 8 and W <= 1024:
            for d in range(n_rep):
                keep = rep[row_rank] == d
                alt = replay(prog, gap=np.where(keep, gap, g_ideal), x=x_ideal)
                ev.by_replica[d] = float(np.nanmean(alt[ok])) / t_ideal
        # each suspect's impact: its work (transfers) at its peers' level
        for s in ev.suspects[:8]:
            if s.kind == "compute":
                m = np.isin(row_rank, s.ranks)
                alt = replay(prog, gap=np.where(m, gap * f_peer[row_rank, row_it], gap))
                key = f"gpu:{s.ranks[0]}"
            else:
                d = s.devices[0]
                slow = np.flatnonzero(getattr(ev, "slot_flags").mean(axis=1) >= p.persistent_fraction)
                crossing = [sl for sl in slow.tolist() if d in network_devices(slots.info[sl][2], run.topology)]
                m = np.isin(inst_slot, crossing)
                alt = replay(prog, x=np.where(m, x_ideal, x))
                key = d
            ev.impact[key] = 100.0 * (t_act - float(np.nanmean(alt[ok]))) / t_act
        log.info("persistent: step %.3g actual, %.3g ideal (slowdown %.3f)", t_act, t_ideal, ev.slowdown or 0)

    # ------------------------------------------------------------------ rank
    def rank(self, run: Any, ev: PersistentEvidence, sel: PersistentSelection | None = None) -> list[DeviceScore]:
        """Compute stragglers (GPU, or host when most of its GPUs are) and network devices, with
        confidence from the continuity of their outlier iterations and their what-if impact."""
        p, topo = run.params, run.topology
        T = len(ev.window)
        W = ev.caused.shape[0]
        p0 = min(max(ev.outlier_rate, 1.0 / max(W, 1)), 0.5)
        out: list[DeviceScore] = []
        comp = [s for s in ev.suspects if s.kind == "compute"]
        by_host: dict[int, list[Suspect]] = {}
        for s in comp:
            by_host.setdefault(int(topo.host_of(s.ranks[0])), []).append(s)
        gph = int(getattr(topo, "gpus_per_host", 8))
        for h, ss in by_host.items():
            host_gpus = [r for r in range(h * gph, min((h + 1) * gph, W))]
            # the host when most of its GPUs work persistently beyond their peers (half the sigmas)
            cz = ev.compute_z[host_gpus] if ev.compute_z is not None else np.zeros((len(host_gpus), T))
            slow_mates = int(((cz > p.persistent_z / 2).mean(axis=1) >= p.persistent_fraction).sum())
            if len(host_gpus) > 1 and max(len(ss), slow_mates) >= max(2, (len(host_gpus) + 1) // 2):
                hits = float(np.median([s.hits for s in ss]))
                imp = sum(ev.impact.get(f"gpu:{s.ranks[0]}", 0.0) for s in ss)
                out.append(DeviceScore(f"host:{h}", "host", sum(s.excess for s in ss), causes=len(ss),
                                       confidence=device_confidence(hits, T, p0), impact_pct=imp,
                                       evidence=(self.name,)))
            else:
                for s in ss:
                    d = f"gpu:{s.ranks[0]}"
                    out.append(DeviceScore(d, "gpu", s.excess, causes=s.hits,
                                           confidence=device_confidence(s.hits, T, p0),
                                           impact_pct=ev.impact.get(d), evidence=(self.name,)))
        net = [s for s in ev.suspects if s.kind == "network"]
        pn = min(max(getattr(ev, "network_flags_rate", 0.0), 1e-3), 0.5)
        for s in net:
            d = s.devices[0]
            hits, share = ev.device_hits.get(d, (0.0, 0.0))
            out.append(DeviceScore(d, device_kind(d), s.excess, causes=s.hits,
                                   confidence=device_confidence(hits, T, pn) * min(1.0, 2 * share),
                                   impact_pct=ev.impact.get(d), evidence=(self.name,)))
        total = sum(max(d.score, 0.0) for d in out) or 1.0
        out = [DeviceScore(d.id, d.kind, max(d.score, 0.0) / total, d.index, d.causes, confidence=d.confidence,
                           impact_pct=d.impact_pct, evidence=d.evidence) for d in out]
        out.sort(key=lambda d: (-round(d.confidence or 0.0, 2), -d.score))
        self._non_device(run, ev, named=any((d.confidence or 0) >= p.min_confidence for d in out))
        return out

    def _non_device(self, run: Any, ev: PersistentEvidence, named: bool) -> None:
        """Name a pipeline-stage or micro-batch imbalance when no device explains the slowdown."""
        p = run.params
        if named or ev.slowdown is None or (ev.slowdown - 1.0) * 100.0 < p.imbalance_pct:
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
            if (v - 1.0 >= 0.5 * (ev.slowdown - 1.0) and (slowest == s).all()
                    and 100.0 * margin >= p.imbalance_pct / 2):
                ev.non_device_cause = {"kind": "pipeline_stage_imbalance", "stage": int(s),
                                       "stage_slowdown": round(v, 4), "slowdown": round(ev.slowdown, 4)}
                run.assume(f"persistent: pipeline stage {s} is the slowest on every replica; alone it makes the "
                           f"step {100 * (v - 1):.1f}% longer than the balanced ideal (a stage imbalance, no device)")
                return
        if ev.moving_outliers >= 0.5:
            ev.non_device_cause = {"kind": "microbatch_imbalance", "slowdown": round(ev.slowdown, 4),
                                   "iterations_with_outlier_pct": round(100 * ev.moving_outliers, 1)}
            run.assume("persistent: the slow position moves between replicas from iteration to iteration "
                       "(micro-batch / sequence-length imbalance, no device)")


def _own_work(gap: np.ndarray, dur: np.ndarray, op_index: np.ndarray) -> np.ndarray:
    """Per row, the rank's own work since it last waited: the sum of its compute gaps since the
    last operator that lasted clearly longer than that operator's shortest copy over the window
    (1.5x + 20 us), this row's gap included. Collectives in which every member was slow (a whole
    tensor-parallel group on a slow host) keep accumulating; a wait resets it.

    >>> _own_work(np.array([5, 3, 2, 4]), np.array([10_000, 500_000, 10_000, 10_000]), np.array([0, 1, 0, 1])).tolist()
    [5, 8, 2, 6]
    """
    n = len(gap)
    if n == 0:
        return gap.copy()
    pos = op_index.astype(np.int64)
    dmin = np.full(int(pos.max()) + 1, np.iinfo(np.int64).max)
    np.minimum.at(dmin, pos, dur)
    waited = dur > 1.5 * dmin[pos] + 20_000
    c = np.cumsum(gap)
    reset = np.zeros(n, np.bool_)
    reset[0] = True
    reset[1:] = waited[:-1]
    start = np.maximum.accumulate(np.where(reset, np.arange(n), 0))
    before = np.where(start > 0, c[np.maximum(start - 1, 0)], 0)
    return c - before


def _op_codes(col: Any) -> np.ndarray:
    """0 collective, 1 send, 2 recv."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if not pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_encode()
    lut = np.array([1 if v == _SEND else 2 if v == _RECV else 0 for v in arr.dictionary.to_pylist()] or [0])
    return lut[arr.indices.to_numpy(zero_copy_only=False).astype(np.int64)]


def _iteration_starts(src: Any, r: int) -> dict[int, int] | None:
    """Per iteration, when rank ``r`` started it (from the job's iteration table), or None."""
    job = getattr(src, "job", None)
    if job is None or not hasattr(job, "iterations"):
        return None
    try:
        t = job.iterations(r)
    except Exception:  # noqa: BLE001 - an unusable iteration table falls back to the ops
        return None
    return dict(zip(t.column("iteration").to_pylist(), t.column("start_ns").to_pylist()))
