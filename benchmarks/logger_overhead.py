"""Overhead of holmes.logger on a real multi-process gloo job, with and without the logger.

One job of N ranks (default 2: one per core of a small machine; more ranks than cores make every
collective wait for a descheduled peer) runs training-like steps (matmul compute +
tensor-parallel style all_reduces + one larger gradient all_reduce; about 100 ms a step by
default). Blocks of ``--steps`` steps alternate between logger off and logger on (the same
processes and process groups, the logger enabled/disabled between blocks, the order of the two
arms alternating from pair to pair), so both arms see the same machine load. Reported: the median
step time of each arm on rank 0; the overhead, the median over pairs of the on/off ratio, with a
95% interval (bootstrap of that median over the pairs, seeded); and the per-operator cost of the
logging path in isolation: a wrapped, logged no-op against the bare no-op, in thread CPU time (what
the logger costs the calling thread, not the time it waits for a core on a loaded machine),
interleaved rounds, median.

    python benchmarks/logger_overhead.py [--ranks 2] [--pairs 150] [--steps 1] [--live]

``--live`` records in parts (``parts_every=10``) as a watched job would. Last line:
``overhead_pct=<%> overhead_ci95_pct=<half-width> per_op_us=<us> ...``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta


def _per_op_cost(n: int = 20000, rounds: int = 9) -> tuple[float, float]:
    """(ns per bare no-op call, ns per wrapped and logged no-op call) in one process: thread CPU
    time, the two interleaved round by round, medians (flushes to parquet included)."""
    import torch
    import torch.distributed as dist

    import holmes.logger
    from holmes.logger import torch_hooks as th

    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        try:
            def noop(tensor, op=None, group=None, async_op=False):
                return None

            wrapped = th._collective_wrapper(noop, "all_reduce")
            t = torch.ones(1024)
            lg = holmes.logger.CommOpsLogger(os.path.join(tmp, "job"), flush_every=8192).enable()
            try:
                bare, logged = [], []
                for _ in range(rounds):
                    t0 = time.thread_time_ns()
                    for _ in range(n):
                        noop(t)
                    t1 = time.thread_time_ns()
                    for _ in range(n):
                        wrapped(t)
                    t2 = time.thread_time_ns()
                    bare.append((t1 - t0) / n)
                    logged.append((t2 - t1) / n)
                best_bare, best_wrapped = statistics.median(bare), statistics.median(logged)
            finally:
                lg.close(finalize=False)
        finally:
            dist.destroy_process_group()
    return best_bare, best_wrapped


def _median_ci(ratios, seed: int = 0, n_boot: int = 2000) -> tuple[float, float, float]:
    """(median, 2.5th and 97.5th percentile of its bootstrap) of the paired ratios."""
    import numpy as np

    r = np.asarray(ratios, dtype=float)
    rng = np.random.default_rng(seed)
    boot = np.median(r[rng.integers(0, len(r), size=(n_boot, len(r)))], axis=1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return float(np.median(r)), float(lo), float(hi)


def worker(rank: int, world: int, init_file: str, out_dir: str, reps: int, steps: int, size: int,
           tp_ops: int, result_file: str, live: bool = False, target_ci: float = 0.5,
           budget_s: float = 600.0) -> None:
    import torch
    import torch.distributed as dist

    import holmes.logger

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    pairs = [dist.new_group([r, r + 1]) for r in range(0, world - world % 2, 2)]
    tp = pairs[rank // 2] if rank < len(pairs) * 2 else None
    logger = holmes.logger.CommOpsLogger(out_dir, parts_every=10 if live else None)
    a = torch.randn(size, size)
    grad = torch.randn(1 << 16)
    act = torch.randn(64, 64)
    times: dict[str, list[list[float]]] = {"off": [], "on": []}
    cpu: dict[str, list[float]] = {"off": [], "on": []}
    order = ["off", "on"]
    stop = torch.zeros(1)
    t_begin = time.monotonic()
    for rep in range(reps + 1):  # rep 0 warms up
        if rep and rep % 50 == 0:  # rank 0 decides when the interval is narrow enough (or time is up)
            if rank == 0:
                ratios = [(y[0] / x[0] - 1) * 100 for x, y in zip(times["off"], times["on"])]
                _, lo, hi = _median_ci(ratios)
                stop[0] = float((hi - lo) / 2 <= target_ci or time.monotonic() - t_begin > budget_s)
            dist.broadcast(stop, 0)
            if stop[0]:
                break
        for mode in (order if rep % 2 else order[::-1]):
            if mode == "on":
                logger.enable()
            dist.barrier()
            block = []
            c0 = time.thread_time()
            for it in range(steps):
                t0 = time.perf_counter()
                if mode == "on":
                    logger.step()
                for _ in range(tp_ops):
                    _ = a @ a
                    if tp is not None:
                        dist.all_reduce(act, group=tp)
                dist.all_reduce(grad, async_op=True).wait()
                block.append(time.perf_counter() - t0)
            block = [sum(block) / len(block)]  # the mean step of the block
            c1 = time.thread_time()
            logger.disable()
            if rep:
                times[mode].append(block)
                cpu[mode].append((c1 - c0) / steps)
    logger.close(finalize=False)
    if rank == 0:
        import json

        with open(result_file, "w") as f:
            json.dump({"times": times, "cpu": cpu, "ops_per_step": (tp_ops if tp is not None else 0) + 1,
                       "rows": logger.recorder.rows_written}, f)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--pairs", "--reps", dest="reps", type=int, default=5000,
                    help="at most this many off/on block pairs (after one warm-up pair; default 5000)")
    ap.add_argument("--target-ci", type=float, default=0.5,
                    help="stop once the overhead's 95%% interval is this narrow (+- %%, default 0.5)")
    ap.add_argument("--budget-s", type=float, default=900.0, help="... or after this many seconds (default 900)")
    ap.add_argument("--steps", type=int, default=1, help="steps per block (default 1)")
    ap.add_argument("--size", type=int, default=448, help="matmul size of the compute per TP op (default 448)")
    ap.add_argument("--tp-ops", type=int, default=8, help="all_reduces per step (plus one gradient all_reduce)")
    ap.add_argument("--live", action="store_true", help="record in parts (parts_every=10)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the bootstrap")
    a = ap.parse_args(argv)

    import json

    import torch.multiprocessing as mp

    import holmes.logger  # noqa: F401 - imported once, shared by forked workers

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    bare_ns, wrapped_ns = _per_op_cost()
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    with tempfile.TemporaryDirectory() as tmp:
        res = os.path.join(tmp, "result.json")
        mp.start_processes(worker, nprocs=a.ranks, start_method=method,
                           args=(a.ranks, os.path.join(tmp, "store"), os.path.join(tmp, "job"), a.reps,
                                 a.steps, a.size, a.tp_ops, res, a.live, a.target_ci, a.budget_s))
        with open(res) as f:
            r = json.load(f)
    off = [statistics.median(b) for b in r["times"]["off"]]
    on = [statistics.median(b) for b in r["times"]["on"]]
    ratios = [(y / x - 1) * 100 for x, y in zip(off, on)]
    import numpy as np

    overhead, lo, hi = _median_ci(ratios, a.seed, 4000)
    half = (hi - lo) / 2
    r_arr = np.asarray(ratios)
    cpu_ratios = [(y / x - 1) * 100 for x, y in zip(r["cpu"]["off"], r["cpu"]["on"]) if x > 0]
    cpu_over, clo, chi = _median_ci(cpu_ratios, a.seed, 4000)
    med_off = statistics.median(x for b in r["times"]["off"] for x in b)
    med_on = statistics.median(x for b in r["times"]["on"] for x in b)
    per_op_us = (wrapped_ns - bare_ns) / 1e3
    ops = r["ops_per_step"]
    print(f"{'arm':<12}{'median step ms':>16}{'blocks':>8}")
    print(f"{'logger off':<12}{med_off * 1e3:>16.3f}{len(off):>8}")
    print(f"{'logger on':<12}{med_on * 1e3:>16.3f}{len(on):>8}")
    print("paired block overheads % (first 30): " + " ".join(f"{x:+.2f}" for x in ratios[:30]))
    print(f"isolated (thread CPU time): bare no-op {bare_ns:.0f} ns, wrapped+logged no-op {wrapped_ns:.0f} ns "
          f"-> {per_op_us:.2f} us per op; {ops} ops/step -> bound {ops * per_op_us / (med_off * 1e6) * 100:.3f}% "
          f"of a {med_off * 1e3:.1f} ms step")
    print(f"rows logged on rank 0: {r['rows']}")
    print(f"pooled-median overhead: {(med_on / med_off - 1) * 100:+.3f}%; paired-block median {overhead:+.3f}% "
          f"(spread of paired blocks {min(ratios):+.1f}..{max(ratios):+.1f}%, IQR "
          f"{np.percentile(r_arr, 25):+.2f}..{np.percentile(r_arr, 75):+.2f}%); 95% interval {lo:+.3f}..{hi:+.3f}% "
          f"(bootstrap of the median over {len(ratios)} pairs); load {os.getloadavg()[0]:.1f}")
    print(f"rank 0 thread CPU time per step: overhead {cpu_over:+.3f}% (95% interval {clo:+.3f}..{chi:+.3f}%)")
    print(f"overhead_pct={overhead:.3f} overhead_ci95_pct={half:.3f} cpu_overhead_pct={cpu_over:.3f} "
          f"cpu_overhead_ci95_pct={(chi - clo) / 2:.3f} per_op_us={per_op_us:.2f} ops_per_step={ops} "
          f"step_ms_off={med_off * 1e3:.3f} step_ms_on={med_on * 1e3:.3f} ranks={a.ranks} pairs={len(ratios)} "
          f"steps_per_block={a.steps} live={int(a.live)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
