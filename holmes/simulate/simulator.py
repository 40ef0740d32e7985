"""Run a simulated training job: layout + workload + topology + faults -> timings in memory.

:func:`run_simulation` builds the program (:mod:`~holmes.simulate.program`), the transfer model
(:mod:`~holmes.simulate.network`) and the fault activations (:mod:`~holmes.simulate.faults`), then
runs the engine (:mod:`~holmes.simulate.engine`) iteration by iteration, twice when there are
faults: the faulted run and a fault-free *counterfactual* run with the same noise.

Ground-truth label. An op is ``abnormal`` when its duration in the faulted run exceeds its
duration in the counterfactual run by more than ``abnormal_margin`` (relative, default 10%)
**and** by more than ``abnormal_abs_us`` (absolute, default 20 us). Durations include waiting
for the slowest member, so the ops that wait for a slow GPU or cross a slow link are abnormal,
as the paper's labels are; an op merely shifted in time is not. Without faults the two runs are
identical, so a fault-free job has no abnormal op.

Memory. Only what the writer needs is kept: per iteration and op the end time as an offset from
the rank's iteration start (int32, int64 when an iteration exceeds 2.1 s) and the label (one
byte), plus per-rank iteration bounds. ``start_ns`` is rebuilt when writing (the noise is a pure
function of its counters): 5 bytes per op, e.g. 8,192 ranks x 100 iterations x 48 ops = 197 MB; the
benchmark (benchmarks/simulate_speed.py) measured a peak RSS of ~515 MB for that job, runtime
libraries included.

Threads. With faults, the counterfactual pass of an iteration runs in a second thread while the
faulted pass runs (the engine releases the GIL); ``threads=1`` runs them one after the other.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from holmes.errors import ConfigError
from holmes.progress import track
from holmes.simulate import engine
from holmes.simulate.faults import FaultSpec, active_factors, check_devices, parse_faults
from holmes.simulate.network import NetworkModel, build_network
from holmes.simulate.program import Program, Workload, build_program
from holmes.topology.layout import ParallelLayout

__all__ = ["SimResult", "run_simulation", "resolve_topology", "noise_multipliers", "clock_model", "BASE_NS"]

log = logging.getLogger(__name__)

#: wall-clock origin of simulated jobs (2023-11-14T22:13:20Z), so timestamps look like real ones
BASE_NS = 1_700_000_000 * 10**9
#: seeds are int64 inside the numba noise kernels: ``0 <= seed < SEED_LIMIT``
SEED_LIMIT = 1 << 63


def resolve_topology(topology: Any, world_size: int, gpus_per_host: int):
    """A :class:`~holmes.topology.ClusterTopology` from None/"rail"/"fat-tree"/a path/an instance."""
    from holmes.topology import ClusterTopology, fat_tree, rail_optimized

    n = -(-world_size // gpus_per_host) * gpus_per_host
    if topology is None or topology in ("rail", "rail-optimized"):
        topo = rail_optimized(n, gpus_per_host)
    elif topology in ("fat-tree", "fat_tree", "fattree"):
        topo = fat_tree(n, gpus_per_host)
    elif isinstance(topology, (str, os.PathLike)):
        if not Path(topology).is_file():
            raise ConfigError(f"topology {str(topology)!r}: expected rail, fat-tree or a topology.json path")
        topo = ClusterTopology.load(topology)
    elif isinstance(topology, ClusterTopology):
        topo = topology
    else:
        raise ConfigError(f"topology {topology!r}: expected rail, fat-tree, a path or a ClusterTopology")
    if topo.num_gpus < world_size:
        raise ConfigError(f"topology {topo.name!r} has {topo.num_gpus} GPUs, the job needs {world_size}")
    return topo


@dataclass
class SimResult:
    """Timings of a simulated job, compact (see the module docstring).

    Use :meth:`ops` / :meth:`iterations_table` for one rank's tables,
    :func:`holmes.simulate.writer.write_result` to write the job directory, or
    :meth:`to_memory_job` for a :class:`holmes.io.MemoryJob`.
    """

    program: Program
    network: NetworkModel
    topology: Any
    faults: list[FaultSpec]
    factors: np.ndarray  # (faults, iterations)
    mult: np.ndarray  # (iterations, ranks) compute multiplier of the faulted run (noise, drift, faults)
    ends: np.ndarray  # (iterations, ops) end offset from the rank's iteration start
    abnormal: np.ndarray  # (iterations, ops) bool
    iter_start: np.ndarray  # (iterations, ranks) int64
    iter_end: np.ndarray  # (iterations, ranks) int64
    seed: int
    drift: float
    abnormal_margin: float
    abnormal_abs_us: float
    cf_iter_end: np.ndarray | None = None  # counterfactual iteration ends (None without faults)
    meta_extra: dict[str, Any] = field(default_factory=dict)
    clock_offset: np.ndarray | None = None  # (ranks,) int64 ns: each rank's wall clock minus true time
    clock_drift: np.ndarray | None = None  # (ranks,) float: each rank's clock rate error (1e-6 = 1 ppm)

    @property
    def iterations(self) -> int:
        return int(self.iter_start.shape[0])

    @property
    def world_size(self) -> int:
        return self.program.world_size

    def rank_slice(self, rank: int) -> slice:
        p = self.program.rank_ptr
        return slice(int(p[rank]), int(p[rank + 1]))

    def rank_times(self, rank: int, wall_clock: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """``(start_ns, end_ns)`` of one rank, each (iterations, ops of the rank).

        ``wall_clock`` (default): as the rank's own clock reads them (:meth:`to_wall_clock`, what
        the job directory holds); False: on the simulation's true time line, shared by all ranks.
        """
        sl = self.rank_slice(rank)
        ends = self.ends[:, sl].astype(np.int64) + self.iter_start[:, rank][:, None]
        w = self.program.workload
        starts = engine.rank_starts(rank, ends, self.iter_start[:, rank], self.program.gap_ns[sl],
                                    self.mult[:, rank], w.jitter, w.tail_prob, w.tail_scale, self.seed)
        if wall_clock:
            return self.to_wall_clock(rank, starts), self.to_wall_clock(rank, ends)
        return starts, ends

    def to_wall_clock(self, rank: int, t: np.ndarray) -> np.ndarray:
        """True times ``t`` (int64 ns) as ``rank``'s wall clock reads them: ``t + offset +
        round(drift * (t - BASE_NS))`` (see ``clock_offset_us`` of :func:`run_simulation`)."""
        t = np.asarray(t, dtype=np.int64)
        off = int(self.clock_offset[rank]) if self.clock_offset is not None else 0
        out = t + off
        if self.clock_drift is not None and self.clock_drift[rank] != 0.0:
            out = out + np.rint((t - BASE_NS) * float(self.clock_drift[rank])).astype(np.int64)
        return out

    def ops(self, rank: int):
        """CommOps v1 table (+ ``abnormal``) of ``rank``."""
        from holmes.simulate.writer import rank_table

        return rank_table(self, rank)

    def iterations_table(self, rank: int):
        from holmes.io.schema import iterations_table

        n = self.iterations
        return iterations_table(np.full(n, rank, np.int32), np.arange(n),
                                self.to_wall_clock(rank, self.iter_start[:, rank]),
                                self.to_wall_clock(rank, self.iter_end[:, rank]))

    def iteration_times(self, rank: int = 0) -> np.ndarray:
        """Faulted iteration durations (ns) of ``rank``."""
        return self.iter_end[:, rank] - self.iter_start[:, rank]

    def counterfactual_iteration_times(self, rank: int = 0) -> np.ndarray:
        """Fault-free iteration durations (ns) of ``rank`` with the same noise."""
        if self.cf_iter_end is None:
            return self.iteration_times(rank)
        end = self.cf_iter_end[:, rank]
        start = np.concatenate([[BASE_NS], end[:-1]])
        return end - start

    def meta(self):
        from holmes.io.models import JobMeta

        prog = self.program
        comms = {cid: {"kind": k, "ranks": [int(x) for x in r]}
                 for cid, k, r in zip(prog.comm_ids, prog.comm_kinds, prog.comm_ranks)}
        return JobMeta.model_validate({
            "schema": "holmes.commops/1", "world_size": self.world_size, "parallel": prog.layout.to_dict(),
            "communicators": comms, "gpus_per_host": self.topology.gpus_per_host,
            "name": self.meta_extra.get("name"),
            "source": {"format": "simulator", "details": self.meta_extra},
        })

    def truth(self):
        from holmes.io.models import FaultTruth, TruthModel

        faults = []
        for f, fac in zip(self.faults, self.factors):
            its = np.flatnonzero(fac != 1.0).tolist()
            faults.append(FaultTruth(device=f.device, pattern=f.pattern, factor=f.factor, iterations=its))
        n_abn = int(self.abnormal.sum())
        return TruthModel.model_validate({
            "schema": "holmes.truth/1", "faults": [x.model_dump() for x in faults],
            "devices": sorted({f.device for f in self.faults}), "abnormal_margin": self.abnormal_margin,
            "drift_per_iteration": self.drift, "seed": self.seed,
            "extra": {"abnormal_abs_us": self.abnormal_abs_us, "abnormal_ops": n_abn,
                      "specs": [str(f) for f in self.faults],
                      "transfer_groups_crossing": self.network.crossed,
                      "clock_offset_ns": ([] if self.clock_offset is None else self.clock_offset.tolist()),
                      "clock_drift": ([] if self.clock_drift is None or not self.clock_drift.any()
                                      else self.clock_drift.tolist()),
                      "label_rule": "abnormal = faulted duration > (1 + abnormal_margin) x counterfactual "
                                    "duration and exceeds it by more than abnormal_abs_us"},
        })

    def to_memory_job(self):
        """The whole job as a :class:`holmes.io.MemoryJob` (small jobs: tests, examples)."""
        from holmes.io import MemoryJob

        W = self.world_size
        return MemoryJob(self.meta(), {r: self.ops(r) for r in range(W)},
                         iterations={r: self.iterations_table(r) for r in range(W)},
                         topology=self.topology, truth=self.truth())


def run_simulation(*, tp: int = 1, pp: int = 1, dp: int = 1, ep: int = 1, cp: int = 1,
                   order: str = "tp-cp-ep-dp-pp", workload: Workload | None = None, iterations: int = 20,
                   seed: int = 0, faults: Iterable[str | FaultSpec] = (), drift: float = 0.0,
                   topology: Any = None, gpus_per_host: int = 8, abnormal_margin: float = 0.1,
                   abnormal_abs_us: float = 20.0, name: str | None = None,
                   network_options: dict[str, float] | None = None, threads: int = 2,
                   clock_offset_us: float = 100.0, clock_drift_ppm: float = 0.0,
                   progress: Any = None) -> SimResult:
    """Simulate a job in memory; see :func:`holmes.simulate.simulate` for the parameters
    (``progress``: an optional progress factory over the iterations, :mod:`holmes.progress`).

    Clocks: every rank logs on its own wall clock. Each host's clock is off the true time by a
    fixed offset ``~ N(0, clock_offset_us)`` (NTP-synchronised hosts are tens to hundreds of
    microseconds apart) and each rank adds ``~ N(0, clock_offset_us / 50)`` (the GPU-to-host
    timestamp conversion); ``clock_drift_ppm`` (default 0) gives each host a rate error
    ``~ N(0, clock_drift_ppm)`` parts per million. Durations on one rank are exact when the drift
    is 0; ranks that share a host share its offset.

    Examples
    --------
    >>> res = run_simulation(tp=2, pp=2, dp=2, iterations=3, faults=["gpu:3@persistent:1*2"])
    >>> res.world_size, bool(res.iteration_times()[2] > res.counterfactual_iteration_times()[2])
    (8, True)
    """
    for nm, v in (("iterations", iterations), ("gpus_per_host", gpus_per_host)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ConfigError(f"{nm}={v!r} must be an integer >= 1")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < SEED_LIMIT:
        raise ConfigError(f"seed={seed!r} must be an integer in [0, 2**63) (the noise kernels hash it as int64)"[:300])
    if not np.isfinite(drift) or drift <= -1.0 / max(iterations, 1):
        raise ConfigError(f"drift={drift!r} must be a finite per-iteration fraction > -1/iterations")
    if not (abnormal_margin >= 0 and abnormal_abs_us >= 0):
        raise ConfigError("abnormal_margin and abnormal_abs_us must be >= 0")
    for nm, v in (("clock_offset_us", clock_offset_us), ("clock_drift_ppm", clock_drift_ppm)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v < 0:
            raise ConfigError(f"{nm}={v!r} must be a finite number >= 0")
    lay = ParallelLayout(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, order=order)
    w = (workload or Workload()).resolved(lay.pp)
    W = lay.world_size
    topo = resolve_topology(topology, W, gpus_per_host)
    fl = parse_faults(faults)
    check_devices(fl, topo, W)
    prog = build_program(lay, w)
    net = build_network(prog, topo, fl, **(network_options or {}))
    fac = active_factors(fl, iterations, seed)
    base_mult = noise_multipliers(w, iterations, W, seed, drift)
    mult = base_mult.copy()
    gph = topo.gpus_per_host
    for fi, f in enumerate(fl):
        if f.kind == "gpu":
            mult[:, int(f.device[4:])] *= fac[fi]
        elif f.kind == "host":
            h = int(f.device[5:])
            mult[:, h * gph:min((h + 1) * gph, W)] *= fac[fi][:, None]
    has_faults = bool(fl) and bool((fac != 1.0).any())

    T, n_inst = prog.num_ops, prog.num_instances
    row_rank = prog.rank_of_row()
    scratch = dict(arrivals=np.empty(n_inst, np.int64), maxentry=np.empty(n_inst, np.int64),
                   pos=np.empty(W, np.int64), stack=np.empty(W, np.int64))
    f_start, f_end = np.empty(T, np.int64), np.empty(T, np.int64)
    c_start, c_end = np.empty(T, np.int64), np.empty(T, np.int64)
    off = np.empty(T, np.int64)
    abn_row = np.zeros(T, np.bool_)
    ends = np.empty((iterations, T), np.int32)
    abnormal = np.zeros((iterations, T), np.bool_)
    iter_start = np.empty((iterations, W), np.int64)
    iter_end = np.empty((iterations, W), np.int64)
    cf_end = np.empty((iterations, W), np.int64) if has_faults else None
    clock = np.full(W, BASE_NS, np.int64)
    cf_clock = clock.copy()
    ones = np.ones(len(fl), np.float64)
    noise_args = (float(w.jitter), float(w.tail_prob), float(w.tail_scale), float(w.xfer_jitter),
                  float(w.xfer_tail_prob), float(w.xfer_tail_scale))
    noise, tail_noise, inst_noise = np.empty(T), np.empty(W), np.empty(n_inst)
    common = (noise, tail_noise, inst_noise, prog.rank_ptr, prog.inst, prog.inst_ptr, prog.inst_members,
              prog.inst_xgroup, net.inst_vol, net.inst_lat_ns, net.xg_inv_bw, net.xg_fault_ptr,
              net.xg_fault_idx, net.xg_fault_inv_bw)
    cf_scratch = {k: np.empty_like(v) for k, v in scratch.items()}
    pool = ThreadPoolExecutor(max_workers=2) if has_faults and threads > 1 else None
    try:
        for it in track(range(iterations), progress, desc="simulate", unit="iteration"):
            iter_start[it] = clock
            engine.iteration_noise(it, seed, *noise_args, prog.rank_ptr, prog.gap_ns, prog.tail_ns, noise,
                                   tail_noise, inst_noise)
            f_args = (*common, np.ascontiguousarray(fac[:, it]), mult[it], row_rank, clock, f_start, f_end)
            if has_faults:  # the counterfactual pass runs alongside (numba releases the GIL)
                c_args = (*common, ones, base_mult[it], row_rank, cf_clock, c_start, c_end)
                if pool is not None:
                    cf_future = pool.submit(engine.run_iteration, *c_args, **cf_scratch)
                    done = engine.run_iteration(*f_args, **scratch)
                    cf_future.result()
                else:
                    done = engine.run_iteration(*f_args, **scratch)
                    engine.run_iteration(*c_args, **cf_scratch)
            else:
                done = engine.run_iteration(*f_args, **scratch)
            if done != T:
                _deadlock(prog, scratch["pos"], it)
            iter_end[it] = clock
            if has_faults:
                cf_end[it] = cf_clock
                big = engine.label_and_store(f_start, f_end, c_start, c_end, row_rank, iter_start[it],
                                             float(abnormal_margin), float(abnormal_abs_us) * 1e3, off, abn_row)
                abnormal[it] = abn_row
            else:
                big = engine.label_and_store(f_start, f_end, f_start, f_end, row_rank, iter_start[it], 0.0, 1.0,
                                             off, abn_row)
            if big >= 2**31 and ends.dtype == np.int32:
                log.debug("iteration %d lasts %.2f s: storing end offsets as int64", it, big / 1e9)
                ends = ends.astype(np.int64)
            ends[it] = off
    finally:
        if pool is not None:
            pool.shutdown()
    extra = {"name": name, "seed": int(seed), "iterations": int(iterations),
             "ops_per_rank_per_iteration": [int(prog.ops_per_rank.min()), int(prog.ops_per_rank.max())],
             "workload": {k: getattr(w, k) for k in w.__dataclass_fields__},
             "topology": topo.name, "faults": [str(f) for f in fl], "drift_per_iteration": float(drift),
             "clock_offset_us": float(clock_offset_us), "clock_drift_ppm": float(clock_drift_ppm)}
    off, rate = clock_model(W, gph, seed, clock_offset_us, clock_drift_ppm)
    return SimResult(program=prog, network=net, topology=topo, faults=fl, factors=fac, mult=mult, ends=ends,
                     abnormal=abnormal, iter_start=iter_start, iter_end=iter_end, seed=int(seed), drift=float(drift),
                     abnormal_margin=float(abnormal_margin), abnormal_abs_us=float(abnormal_abs_us),
                     cf_iter_end=cf_end, meta_extra=extra, clock_offset=off, clock_drift=rate)


def noise_multipliers(w: Workload, iterations: int, world_size: int, seed: int, drift: float = 0.0) -> np.ndarray:
    """Compute multiplier of every (iteration, rank) before faults: drift x the job-wide
    per-iteration factor ``exp(iter_jitter * z_i)`` x the per-rank factor ``exp(rank_iter_jitter
    * z_ir)``; shared by the faulted and the counterfactual run.

    >>> m = noise_multipliers(Workload(), 3, 4, seed=0)
    >>> m.shape, bool(abs(m.mean() - 1) < 0.05)
    ((3, 4), True)
    """
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, 0x17E4A7])
    z_it = rng.standard_normal(iterations)
    z_rank = rng.standard_normal((iterations, world_size))
    out = np.exp(float(w.rank_iter_jitter) * z_rank)
    out *= ((1.0 + drift * np.arange(iterations, dtype=np.float64)) * np.exp(float(w.iter_jitter) * z_it))[:, None]
    return out


def clock_model(world_size: int, gpus_per_host: int, seed: int, offset_us: float,
                drift_ppm: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-rank clock offset (int64 ns) and rate error (see :func:`run_simulation`).

    >>> off, rate = clock_model(16, 8, 0, 100.0, 0.0)
    >>> bool(abs(off[0] - off[1]) < abs(off[0] - off[8])), bool((rate == 0).all())
    (True, True)
    """
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, 0xC10C])
    hosts = -(-world_size // gpus_per_host)
    host_of = np.arange(world_size) // gpus_per_host
    off_us = rng.normal(0.0, offset_us, hosts)[host_of] + rng.normal(0.0, offset_us / 50.0, world_size)
    rate = rng.normal(0.0, drift_ppm, hosts)[host_of] * 1e-6 if drift_ppm > 0 else np.zeros(world_size)
    return np.rint(off_us * 1e3).astype(np.int64), rate


def _deadlock(prog: Program, pos: np.ndarray, it: int) -> None:
    from holmes.io.schema import OP_NAMES

    n = prog.ops_per_rank
    stuck = np.flatnonzero(pos < n)
    r = int(stuck[0])
    j = int(prog.rank_ptr[r] + pos[r])
    raise ConfigError(
        f"the communication program deadlocks in iteration {it}: {stuck.size} rank(s) blocked, e.g. rank {r} "
        f"at op {int(pos[r])} ({OP_NAMES[prog.op[j]]} on {prog.comm_ids[prog.comm[j]]})")
