"""Benchmark: simulate a large job and write it, end to end.

Usage::

    python benchmarks/simulate_speed.py [--gpus 8192] [--iterations 100] [--tp 8] [--pp 8]
                                        [--micro-batches 4] [--out DIR] [--keep]

The job is tp x pp x (gpus / tp / pp) with the default workload (sequence parallel, distributed
optimizer, 1 layer per stage) and two faults (a leaf switch fluctuating, a GPU spiking), so the
counterfactual pass runs too. Phases are timed once (the whole run is the figure); the engine
and the writer are also compared with their naive peers *in the same run*:

* engine: the numba worklist engine vs the same algorithm in pure Python, one iteration
  (results asserted identical), median of 3;
* writer: the simulator's tuned parquet writer vs ``holmes.io.JobWriter.write_ops``' defaults on
  256 ranks, median ms per rank over 3 rounds.

Last line: ``simulate_s=<s> peak_rss_mb=<MB> ...``.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from holmes.io.job import JobWriter  # noqa: E402
from holmes.simulate import Workload, engine  # noqa: E402
from holmes.simulate.simulator import run_simulation  # noqa: E402
from holmes.simulate.writer import _DELTA, rank_table, write_result  # noqa: E402


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def naive_iteration(prog, net, noise, tail_noise, inst_noise, clock):
    """Pure-Python version of engine.run_iteration (no faults)."""
    W = prog.world_size
    rank_ptr, inst, inst_ptr, members = (prog.rank_ptr.tolist(), prog.inst.tolist(), prog.inst_ptr.tolist(),
                                         prog.inst_members.tolist())
    row_rank = prog.rank_of_row().tolist()
    xg, inv, vol, lat = prog.inst_xgroup.tolist(), net.xg_inv_bw.tolist(), net.inst_vol.tolist(), net.inst_lat_ns.tolist()
    noise_l, inn = noise.tolist(), inst_noise.tolist()
    clock = clock.tolist()
    arrivals = [0] * (len(inst_ptr) - 1)
    maxentry = [-(1 << 62)] * (len(inst_ptr) - 1)
    pos = [0] * W
    start, end = [0] * len(inst), [0] * len(inst)
    stack = list(range(W - 1, -1, -1))
    while stack:
        r = stack.pop()
        base, n = rank_ptr[r], rank_ptr[r + 1] - rank_ptr[r]
        while pos[r] < n:
            j = base + pos[r]
            e = clock[r] + int(noise_l[j] * 1.0 + 0.5)
            start[j] = e
            i = inst[j]
            arrivals[i] += 1
            maxentry[i] = max(maxentry[i], e)
            if arrivals[i] < inst_ptr[i + 1] - inst_ptr[i]:
                break
            t = (lat[i] + vol[i] * inv[xg[i]]) * inn[i]
            done = maxentry[i] + int(t + 0.5)
            for m in range(inst_ptr[i], inst_ptr[i + 1]):
                row = members[m]
                end[row] = done
                rr = row_rank[row]
                clock[rr] = done
                pos[rr] += 1
                if rr != r:
                    stack.append(rr)
    for r in range(W):
        clock[r] += int(tail_noise[r] * 1.0 + 0.5)
    return np.array(start), np.array(end), np.array(clock)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="simulator speed")
    ap.add_argument("--gpus", type=int, default=8192)
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--pp", type=int, default=8)
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--compression", default="lz4")
    ap.add_argument("--out", default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--no-peers", action="store_true", help="skip the naive-peer comparisons")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny run (64 GPUs x 3 iterations, tp=4 pp=2) for CI: same code path, seconds")
    args = ap.parse_args(argv)
    if args.smoke:
        args.gpus, args.iterations, args.tp, args.pp = 64, 3, 4, 2
    dp = args.gpus // (args.tp * args.pp)
    if dp * args.tp * args.pp != args.gpus:
        ap.error("--gpus must be a multiple of tp * pp")
    out = Path(args.out or tempfile.mkdtemp(prefix="holmes-simbench-")) / "job"
    faults = ["switch:leaf-3@fluctuation*1.5", "gpu:100@spike*2"] if args.gpus > 100 else ["gpu:1@spike*2"]
    # warm the numba cache outside the timed region
    run_simulation(tp=2, pp=2, dp=2, iterations=2, faults=["gpu:1@spike*2"])

    workload = Workload(micro_batches=args.micro_batches)
    t0, c0 = time.perf_counter(), time.process_time()
    res = run_simulation(tp=args.tp, pp=args.pp, dp=dp, iterations=args.iterations, seed=0, faults=faults,
                         workload=workload)
    t1, c1 = time.perf_counter(), time.process_time()
    write_result(res, out, overwrite=True, compression=args.compression)
    t2, c2 = time.perf_counter(), time.process_time()
    total = t2 - t0
    rss = _rss_mb()
    opr = res.program.ops_per_rank
    total_ops = int(opr.sum()) * args.iterations
    size_mb = sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) / 1e6

    rows = [("simulate (engine, 2 passes)", t1 - t0, c1 - c0), ("write parquet", t2 - t1, c2 - c1),
            ("total", total, c2 - c0)]
    print(f"job: {args.gpus} GPUs (tp={args.tp} pp={args.pp} dp={dp}) x {args.iterations} iterations, "
          f"M={args.micro_batches}, faults={faults}")
    print(f"ops per rank per iteration: {opr.min()}-{opr.max()} (mean {opr.mean():.1f}); total ops {total_ops:,}; "
          f"on disk {size_mb:.0f} MB")
    print(f"{'phase':32s} {'wall s':>8s} {'cpu s':>8s}")
    for name, w, c in rows:
        print(f"{name:32s} {w:8.2f} {c:8.2f}")

    extra = ""
    if not args.no_peers:
        prog, net = res.program, res.network
        T, W, ni = prog.num_ops, prog.world_size, prog.num_instances
        noise, tn, inn = np.empty(T), np.empty(W), np.empty(ni)
        w = workload.resolved(args.pp)  # the noise parameters run_simulation used
        engine.iteration_noise(0, 0, float(w.jitter), float(w.tail_prob), float(w.tail_scale), float(w.xfer_jitter),
                               float(w.xfer_tail_prob), float(w.xfer_tail_scale), prog.rank_ptr, prog.gap_ns,
                               prog.tail_ns, noise, tn, inn)
        common = (noise, tn, inn, prog.rank_ptr, prog.inst, prog.inst_ptr, prog.inst_members, prog.inst_xgroup,
                  net.inst_vol, net.inst_lat_ns, net.xg_inv_bw, np.zeros(net.xg_inv_bw.size + 1, np.int64),
                  np.zeros(0, np.int64), np.zeros(0), np.ones(0), np.ones(W))
        sc = dict(arrivals=np.empty(ni, np.int64), maxentry=np.empty(ni, np.int64), pos=np.empty(W, np.int64),
                  stack=np.empty(W, np.int64))
        rr = prog.rank_of_row()
        nb_t, py_t = [], []
        for _ in range(3):
            clock = np.zeros(W, np.int64)
            s, e = np.empty(T, np.int64), np.empty(T, np.int64)
            a = time.perf_counter()
            engine.run_iteration(*common, rr, clock, s, e, **sc)
            nb_t.append(time.perf_counter() - a)
        a = time.perf_counter()
        ps, pe, pc = naive_iteration(prog, net, noise, tn, inn, np.zeros(W, np.int64))
        py_t.append(time.perf_counter() - a)
        if not (np.array_equal(ps, s) and np.array_equal(pe, e) and np.array_equal(pc, clock)):
            raise SystemExit("simulate_speed: the naive engine disagrees with the numba engine")
        nb_ms, py_ms = statistics.median(nb_t) * 1e3, statistics.median(py_t) * 1e3
        # writer vs JobWriter.write_ops defaults, 256 ranks
        sample = range(min(256, W))
        tmp = Path(tempfile.mkdtemp(prefix="holmes-simw-"))
        jw = JobWriter(tmp / "peer", res.meta())
        ours, peer = [], []
        for _ in range(3):
            a = time.perf_counter()
            for r in sample:
                pq.write_table(rank_table(res, r), tmp / "ours.parquet", compression=args.compression,
                               use_dictionary=["comm_id", "op"], write_statistics=False, column_encoding=_DELTA)
            ours.append((time.perf_counter() - a) / len(sample) * 1e3)
            a = time.perf_counter()
            for r in sample:
                jw.write_ops(r, rank_table(res, r))
            peer.append((time.perf_counter() - a) / len(sample) * 1e3)
        shutil.rmtree(tmp, ignore_errors=True)
        w_ms, p_ms = statistics.median(ours), statistics.median(peer)
        print(f"{'engine: 1 iteration, numba':32s} {nb_ms / 1e3:8.3f}   (naive Python {py_ms / 1e3:.2f} s, "
              f"x{py_ms / nb_ms:.0f})")
        print(f"{'writer: ms per rank file':32s} {w_ms:8.2f}   (JobWriter.write_ops {p_ms:.2f} ms, x{p_ms / w_ms:.1f})")
        extra = (f" engine_iter_ms_median={nb_ms:.1f} naive_python_ratio={py_ms / nb_ms:.0f}"
                 f" write_ms_per_rank_median={w_ms:.2f} jobwriter_ratio={p_ms / w_ms:.2f}")
    if not args.keep:
        shutil.rmtree(out.parent, ignore_errors=True)
    print(f"simulate_s={total:.1f} peak_rss_mb={rss:.0f} engine_s={t1 - t0:.1f} write_s={t2 - t1:.1f} "
          f"cpu_s={c2 - c0:.1f} ops_per_rank_iter={opr.mean():.1f} total_ops={total_ops}{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
