"""Overhead of holmes.logger on a real multi-process gloo job, with and without the logger.

One job of N ranks (default 4) runs training-like steps (matmul compute + tensor-parallel style
all_reduces + one larger gradient all_reduce). Blocks of steps alternate between logger off and
logger on (the same processes and process groups, the logger enabled/disabled between blocks), so
both arms see the same machine load. Reported: median step time of each arm on rank 0, the
overhead in percent (the median over repetitions of the paired on/off ratio), and the raw
per-operator cost of the logging path measured in isolation (a wrapped no-op vs the bare no-op).

    python benchmarks/logger_overhead.py [--ranks 4] [--reps 6] [--steps 15]

Last line: ``overhead_pct=<%> per_op_us=<us> ...``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta


def _per_op_cost(n: int = 20000) -> tuple[float, float]:
    """(ns per bare no-op call, ns per wrapped and logged no-op call) in one process."""
    import torch
    import torch.distributed as dist

    import holmes.logger
    from holmes.logger import torch_hooks as th

    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        try:
            def noop(tensor, op=None, group=None, async_op=False):
                return None

            wrapped = th._Wrapper(noop, "all_reduce", th._collective_handler("all_reduce"))
            t = torch.ones(1024)
            lg = holmes.logger.CommOpsLogger(os.path.join(tmp, "job"), flush_every=8192).enable()
            try:
                best_bare = best_wrapped = float("inf")
                for _ in range(5):
                    t0 = time.perf_counter_ns()
                    for _ in range(n):
                        noop(t)
                    t1 = time.perf_counter_ns()
                    for _ in range(n):
                        wrapped(t)
                    t2 = time.perf_counter_ns()
                    best_bare = min(best_bare, (t1 - t0) / n)
                    best_wrapped = min(best_wrapped, (t2 - t1) / n)
            finally:
                lg.close(finalize=False)
        finally:
            dist.destroy_process_group()
    return best_bare, best_wrapped


def worker(rank: int, world: int, init_file: str, out_dir: str, reps: int, steps: int, size: int,
           tp_ops: int, result_file: str) -> None:
    import torch
    import torch.distributed as dist

    import holmes.logger

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    pairs = [dist.new_group([r, r + 1]) for r in range(0, world - world % 2, 2)]
    tp = pairs[rank // 2] if rank < len(pairs) * 2 else None
    logger = holmes.logger.CommOpsLogger(out_dir)
    a = torch.randn(size, size)
    grad = torch.randn(1 << 16)
    act = torch.randn(64, 64)
    times: dict[str, list[list[float]]] = {"off": [], "on": []}
    order = ["off", "on"]
    for rep in range(reps + 1):  # rep 0 warms up
        for mode in (order if rep % 2 else order[::-1]):
            if mode == "on":
                logger.enable()
            dist.barrier()
            block = []
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
            logger.disable()
            if rep:
                times[mode].append(block)
    logger.close(finalize=False)
    if rank == 0:
        import json

        with open(result_file, "w") as f:
            json.dump({"times": times, "ops_per_step": (tp_ops if tp is not None else 0) + 1,
                       "rows": logger.recorder.rows_written}, f)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--reps", type=int, default=16, help="off/on block pairs (after one warm-up pair)")
    ap.add_argument("--steps", type=int, default=10, help="steps per block")
    ap.add_argument("--size", type=int, default=192, help="matmul size of the compute per TP op")
    ap.add_argument("--tp-ops", type=int, default=8, help="all_reduces per step (plus one gradient all_reduce)")
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
                                 a.steps, a.size, a.tp_ops, res))
        with open(res) as f:
            r = json.load(f)
    off = [statistics.median(b) for b in r["times"]["off"]]
    on = [statistics.median(b) for b in r["times"]["on"]]
    ratios = [(y / x - 1) * 100 for x, y in zip(off, on)]
    overhead = statistics.median(ratios)
    med_off = statistics.median(x for b in r["times"]["off"] for x in b)
    med_on = statistics.median(x for b in r["times"]["on"] for x in b)
    per_op_us = (wrapped_ns - bare_ns) / 1e3
    ops = r["ops_per_step"]
    print(f"{'arm':<12}{'median step ms':>16}{'blocks':>8}")
    print(f"{'logger off':<12}{med_off * 1e3:>16.3f}{len(off):>8}")
    print(f"{'logger on':<12}{med_on * 1e3:>16.3f}{len(on):>8}")
    print("paired block overheads %: " + " ".join(f"{x:+.2f}" for x in ratios))
    print(f"isolated: bare no-op {bare_ns:.0f} ns, wrapped+logged no-op {wrapped_ns:.0f} ns "
          f"-> {per_op_us:.2f} us per op; {ops} ops/step -> bound {ops * per_op_us / (med_off * 1e6) * 100:.3f}% "
          f"of a {med_off * 1e3:.1f} ms step")
    print(f"rows logged on rank 0: {r['rows']}")
    print(f"pooled-median overhead: {(med_on / med_off - 1) * 100:+.3f}%; paired-block median {overhead:+.3f}% "
          f"(spread of paired blocks {min(ratios):+.1f}..{max(ratios):+.1f}%)")
    print(f"overhead_pct={overhead:.3f} per_op_us={per_op_us:.2f} ops_per_step={ops} "
          f"step_ms_off={med_off * 1e3:.3f} step_ms_on={med_on * 1e3:.3f} ranks={a.ranks}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
