"""Overhead of holmes.logger on a real multi-process gloo job, with and without the logger.

One job of N ranks (default 2: one per core of a small machine, each pinned to its core when there
are enough cores) runs training-like steps: ``--layers`` layers, each a matmul then a
tensor-parallel all_reduce forward and the same backward (2 x 24 = 48 synchronous all_reduces by
default), then ``--buckets`` asynchronous gradient all_reduces issued together and waited for
(4 by default): 52 operators and about 100-150 ms a step on an idle 2-core machine. Steps
alternate between logger off and logger on in the same processes and process groups (the logger
enabled/disabled between steps, a barrier before each, the order of the two arms alternating from
pair to pair), so both arms see the same machine load and drift cancels within a pair.

Reported, on rank 0:

* the overhead: the Hodges-Lehmann estimate (median of the Walsh averages) of the paired log
  ratios ``log(on/off)``, with its 95% interval from the Wilcoxon signed-rank test, both shown as
  percentages. Distribution-free: it assumes only that the paired log ratios are symmetric about
  the effect, which exchangeable arms in alternating order give. Pairs are added, 50 at a time
  after ``--min-pairs``, until the interval is ``+-target`` or the time budget is spent. The median
  with a bootstrap interval is printed too;
* the same in the rank's thread CPU time (what the logger costs the training thread, without the
  waiting for a core of a loaded machine), and that cost per operator;
* ``per_op_us``: the logging path of one synchronous collective in isolation, a wrapped and
  logged no-op against the bare no-op, in thread CPU time, interleaved rounds, median (flushes to
  parquet included). The no-op is declared a ``torch.distributed`` function so that it takes the
  path torch's collectives take. Its caches are warm: between real collectives the same path costs
  more (the CPU-time overhead per operator above says how much, asynchronous ones included).

``--setup ddp`` runs a stock DistributedDataParallel model instead (its gradient buckets reach the
logger through the dispatcher hook, :mod:`holmes.logger._dispatch`: the compiled kernel of
:mod:`holmes.logger._native` where it builds), 100 pairs at least and 90 s of pairs at most by
default, with two more arms: *floor*, the dispatcher hook's kernels installed but recording nothing
(what the dispatcher mechanism costs by itself; with the Python kernels, converting each operator's
arguments to Python and back, cold between two buckets' worth of backward compute), and *python*,
the same logger with ``native=False`` (the dispatcher's Python kernels: the path of a machine
without a compiler, the naive path measured in the same run). ``dispatch_op_us`` (the compiled
kernel where it is used, ``native=1``) and ``dispatch_py_op_us`` (the Python kernel) time one
dispatcher operator in isolation. Every arm pays the same enable/disable switching before its
barrier.

    python benchmarks/logger_overhead.py [--ranks 2] [--budget-s 1100] [--target-ci 0.5] [--live]
    python benchmarks/logger_overhead.py --setup ddp       # ~2 minutes on 2 ranks

``--live`` records in parts (``parts_every=10``) as a watched job would. Last line:
``overhead_pct=<%> overhead_ci95_pct=<half-width> per_op_us=<us> cpu_overhead_pct=<%> ...``, with
``native=... dispatch_py_op_us=... floor_pct=... python_pct=...`` at its end with ``--setup ddp``. Timing on a shared machine
is noisy: the interval says how much; compare figures measured at the same load (printed).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta

import numpy as np


def _interleaved(fns: dict, n: int, rounds: int) -> dict:
    """ns of thread CPU time per call of each function, rounds interleaved (order alternating), medians."""
    out: dict = {k: [] for k in fns}
    for r in range(rounds):
        for k in (list(fns) if r % 2 else list(fns)[::-1]):
            f = fns[k]
            t0 = time.thread_time_ns()
            for _ in range(n):
                f()
            out[k].append((time.thread_time_ns() - t0) / n)
    return {k: statistics.median(v) for k, v in out.items()}


def _per_op_cost(n: int = 20000, rounds: int = 15) -> tuple[float, float]:
    """(ns per bare no-op call, ns per wrapped and logged no-op call) in one process: thread CPU
    time, the two interleaved round by round, medians (flushes to parquet included). The no-op is
    declared a ``torch.distributed`` function so that it takes the path of torch's collectives."""
    import torch
    import torch.distributed as dist

    import holmes.logger
    from holmes.logger import torch_hooks as th

    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        try:
            def noop(tensor, op=None, group=None, async_op=False):
                return None

            noop.__module__ = "torch.distributed.distributed_c10d"
            wrapped = th._collective_wrapper(noop, "all_reduce")
            t = torch.ones(1024)
            lg = holmes.logger.CommOpsLogger(os.path.join(tmp, "job"), flush_every=8192).enable()
            try:
                cost = _interleaved({"bare": lambda: noop(t), "logged": lambda: wrapped(t)}, n, rounds)
            finally:
                lg.close(finalize=False)
        finally:
            dist.destroy_process_group()
    return cost["bare"], cost["logged"]


def _dispatch_op_cost(n: int = 3000, rounds: int = 9, native: bool | None = None) -> tuple[float, float]:
    """(ns per bare, ns per logged) ``ProcessGroup.allreduce`` of a 1-rank gloo group, waited for:
    the path of operators that bypass ``torch.distributed`` (DDP's reducer), caught by the
    logger's dispatcher hook. Thread CPU time, interleaved rounds, medians."""
    import torch
    import torch.distributed as dist

    import holmes.logger

    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        try:
            pg = dist.group.WORLD
            t = torch.ones(16)
            lg = holmes.logger.CommOpsLogger(os.path.join(tmp, "job"), flush_every=8192, native=native)

            def bare() -> None:
                pg.allreduce([t]).wait()

            def logged() -> None:
                lg.enable()
                for _ in range(n):
                    pg.allreduce([t]).wait()
                lg.disable()

            out: dict = {"bare": [], "logged": []}
            for r in range(rounds):
                for k in (("bare", "logged") if r % 2 else ("logged", "bare")):
                    t0 = time.thread_time_ns()
                    if k == "bare":
                        for _ in range(n):
                            bare()
                    else:
                        logged()
                    out[k].append((time.thread_time_ns() - t0) / n)
            lg.close(finalize=False)
        finally:
            dist.destroy_process_group()
    return statistics.median(out["bare"]), statistics.median(out["logged"])


def hodges_lehmann(x, conf: float = 0.95) -> tuple[float, float, float]:
    """(estimate, low, high): the Hodges-Lehmann estimate of the centre of ``x`` (paired
    differences) and its Wilcoxon signed-rank confidence interval (normal approximation).

    >>> est, lo, hi = hodges_lehmann(np.random.default_rng(0).normal(1.0, 1.0, 400))
    >>> lo < 1.0 < hi and hi - lo < 0.3
    True
    """
    x = np.sort(np.asarray(x, dtype=float))
    n = len(x)
    i, j = np.triu_indices(n)
    walsh = np.sort((x[i] + x[j]) / 2)
    m = len(walsh)
    z = statistics.NormalDist().inv_cdf(0.5 + conf / 2)
    k = int(np.floor(m / 2 - z * np.sqrt(n * (n + 1) * (2 * n + 1) / 24)))
    k = min(max(k, 0), m - 1)
    return float(np.median(walsh)), float(walsh[k]), float(walsh[m - 1 - k])


def median_bootstrap(x, seed: int = 0, n_boot: int = 2000) -> tuple[float, float, float]:
    """(median, 2.5th and 97.5th percentile of its bootstrap) of ``x``."""
    r = np.asarray(x, dtype=float)
    rng = np.random.default_rng(seed)
    boot = np.median(r[rng.integers(0, len(r), size=(n_boot, len(r)))], axis=1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return float(np.median(r)), float(lo), float(hi)


def _log_ratios(times: dict, i: int, arm: str = "on") -> np.ndarray:
    """``log(arm / off)`` of each pair (column ``i``: 0 wall, 1 thread CPU): exchanging the two
    arms flips its sign, so without an effect it is symmetric about 0, as the signed-rank
    interval assumes (a plain ratio ``on/off - 1`` is not)."""
    off = np.array([x[i] for x in times["off"]], dtype=float)
    on = np.array([x[i] for x in times[arm]], dtype=float)
    n = min(len(off), len(on))
    return np.log(on[:n] / off[:n])


def _pct(x: float) -> float:
    return float(np.expm1(x) * 100)


def worker(rank: int, world: int, init_file: str, out_dir: str, a: argparse.Namespace, result_file: str) -> None:
    import torch
    import torch.distributed as dist

    import holmes.logger
    from holmes.logger._dispatch import DispatchHook

    torch.set_num_threads(1)
    if a.pin and hasattr(os, "sched_setaffinity"):  # before gloo starts its threads: they inherit it
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=300))
    pairs = [dist.new_group([r, r + 1]) for r in range(0, world - world % 2, 2)]
    tp = pairs[rank // 2] if rank < len(pairs) * 2 else None
    logger = holmes.logger.CommOpsLogger(out_dir, parts_every=10 if a.live else None)
    # the "python" arm: the same logger with the dispatcher's Python kernels only (the path of a
    # machine without a compiler, and of this package before the compiled kernel)
    py_logger = holmes.logger.CommOpsLogger(out_dir + "-python", native=False) if a.python_arm else None
    w = torch.randn(a.size, a.size)
    act = torch.randn(64, 64)
    grads = [torch.randn(1 << 16) for _ in range(a.buckets)]

    def train_step() -> None:
        for _ in range(2 * a.layers):  # forward then backward: a matmul and a TP all_reduce each
            _ = w @ w
            if tp is not None:
                dist.all_reduce(act, group=tp)
        works = [dist.all_reduce(g, async_op=True) for g in grads]
        for wk in works:
            wk.wait()

    if a.setup == "ddp":  # stock DDP: its reducer's bucket all_reduces reach the logger at the dispatcher
        from torch.nn.parallel import DistributedDataParallel as DDP

        net = torch.nn.Sequential(*[torch.nn.Linear(a.size, a.size) for _ in range(a.layers)])
        # buckets of about a quarter of the gradients: --buckets of them a step
        cap = sum(p.numel() for p in net.parameters()) * 4 / 2**20 / a.buckets
        model = DDP(net, bucket_cap_mb=cap)
        x = torch.randn(64, a.size)

        def train_step() -> None:  # noqa: F811 - the DDP setup's step
            model.zero_grad(set_to_none=False)
            model(x).square().mean().backward()

        if a.comm_hook:  # the same model with torch's own allreduce comm hook: its buckets' all_reduces
            # go through torch.distributed.all_reduce, i.e. the logger's namespace fast path
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            net2 = torch.nn.Sequential(*[torch.nn.Linear(a.size, a.size) for _ in range(a.layers)])
            model2 = DDP(net2, bucket_cap_mb=cap)
            model2.register_comm_hook(None, allreduce_hook)

            def hooked_step() -> None:
                model2.zero_grad(set_to_none=False)
                model2(x).square().mean().backward()

    # (wall ns, thread CPU ns) per step and arm; "floor" (--floor): the dispatcher hook's Python
    # kernels installed but recording nothing, i.e. what PyTorch's Python-kernel mechanism alone costs
    arms = ("off", "on") + (("floor",) if a.floor else ()) + (("hook",) if a.setup == "ddp" and a.comm_hook else ()) \
        + (("python",) if a.python_arm else ())
    times: dict[str, list[tuple[int, int]]] = {m: [] for m in arms}
    floor = DispatchHook(None) if a.floor else None
    orders = list(itertools.permutations(arms))
    native_used = False  # the compiled dispatcher kernel took the "on" arm's buckets
    n_on = 0  # logged steps, warm-up included (rows per step = rows / n_on)
    stop = torch.zeros(1)
    t_begin = time.monotonic()
    for rep in range(a.max_pairs + a.warmup):
        done_pairs = rep - a.warmup
        if done_pairs >= a.min_pairs and done_pairs % 50 == 0:  # rank 0 decides: narrow enough or out of time
            if rank == 0:
                _, lo, hi = hodges_lehmann(_log_ratios(times, 0))
                stop[0] = float((_pct(hi) - _pct(lo)) / 2 <= a.target_ci or time.monotonic() - t_begin > a.budget_s)
            dist.broadcast(stop, 0)
            if stop[0]:
                break
        for mode in orders[rep % len(orders)]:
            # every arm pays the same switching before its barrier (enabling installs the dispatcher
            # hook's kernels: Python work that would otherwise precede the logged steps only)
            logger.enable()
            if mode not in ("on", "hook"):
                logger.disable()
            if mode == "floor":
                floor.install()
            if mode == "python":
                py_logger.enable()
            dist.barrier()
            c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
            if mode in ("on", "hook"):
                logger.step()
            elif mode == "python":
                py_logger.step()
            if mode == "on":
                n_on += 1
                native_used = native_used or logger._dispatch.native_installed
            (hooked_step if mode == "hook" else train_step)()
            t1, c1 = time.perf_counter_ns(), time.thread_time_ns()
            logger.disable()
            if py_logger is not None:
                py_logger.disable()
            if floor is not None:
                floor.uninstall()
            if rep >= a.warmup:
                times[mode].append((t1 - t0, c1 - c0))
    hook_rows = 0
    if "hook" in arms:  # the rows one hooked step logs (the namespace path), counted apart
        logger.enable()
        before = logger.recorder.rows_written + len(logger.recorder._done)
        logger.step()
        hooked_step()
        logger.step()
        logger.recorder.flush()
        hook_rows = logger.recorder.rows_written - before
        logger.disable()
    logger.close(finalize=False)
    if py_logger is not None:
        py_logger.close(finalize=False)
    if rank == 0:
        with open(result_file, "w") as f:
            rows = logger.recorder.rows_written
            json.dump({"times": times, "ops_per_step": round(rows / max(n_on, 1)) if a.setup == "ddp" else
                       (2 * a.layers if tp is not None else 0) + a.buckets,
                       "n_async": round(rows / max(n_on, 1)) if a.setup == "ddp" else a.buckets,
                       "rows": logger.recorder.rows_written, "hook_rows": hook_rows,
                       "native": int(native_used),
                       "elapsed_s": time.monotonic() - t_begin}, f)
    dist.destroy_process_group()


def _arm(times: dict, arm: str) -> tuple[tuple[float, float, float], tuple[float, float, float], float]:
    """An extra arm against "off": (wall %, low, high), (thread CPU %, low, high), median step ms."""
    wall = tuple(_pct(v) for v in hodges_lehmann(_log_ratios(times, 0, arm)))
    cpu = tuple(_pct(v) for v in hodges_lehmann(_log_ratios(times, 1, arm)))
    return wall, cpu, statistics.median(x[0] for x in times[arm]) / 1e6  # type: ignore[return-value]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--layers", type=int, default=24, help="layers: 2 TP all_reduces each a step (default 24)")
    ap.add_argument("--buckets", type=int, default=4, help="asynchronous gradient all_reduces a step (default 4)")
    ap.add_argument("--size", type=int, default=384, help="matmul size of the compute before each TP op (default 384)")
    ap.add_argument("--target-ci", type=float, default=0.5,
                    help="stop once the overhead's 95%% interval is this narrow (+- %%, default 0.5)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="... or after this many seconds (default 1100; --setup ddp: 90)")
    ap.add_argument("--min-pairs", type=int, default=None,
                    help="off/on step pairs before the first check (default 300; --setup ddp: 100)")
    ap.add_argument("--max-pairs", type=int, default=100000, help="at most this many pairs")
    ap.add_argument("--warmup", type=int, default=5, help="pairs run first and dropped (default 5)")
    ap.add_argument("--pin", action=argparse.BooleanOptionalAction, default=None,
                    help="pin rank r to the r-th allowed core (default: when there are at least as many cores as ranks)")
    ap.add_argument("--live", action="store_true", help="record in parts (parts_every=10)")
    ap.add_argument("--setup", choices=("tp", "ddp"), default="tp",
                    help="tp: the TP+DP step above; ddp: a stock DistributedDataParallel model of --layers "
                         "Linear(--size) layers in --buckets gradient buckets (its all_reduces come from DDP's "
                         "C++ reducer, through the dispatcher hook)")
    ap.add_argument("--floor", action=argparse.BooleanOptionalAction, default=None,
                    help="a third arm: the dispatcher hook's Python kernels installed, recording nothing (what "
                         "PyTorch's Python-kernel mechanism costs by itself; default: with --setup ddp)")
    ap.add_argument("--comm-hook", action="store_true",
                    help="--setup ddp: a fourth arm, the same model with torch's own allreduce comm hook "
                         "(register_comm_hook(None, allreduce_hook)) and the logger on: its buckets take the "
                         "namespace fast path instead of the dispatcher hook; against the plain model off")
    ap.add_argument("--python-arm", action=argparse.BooleanOptionalAction, default=None,
                    help="an arm logging with the dispatcher's Python kernels only (native=False): the naive "
                         "path the compiled kernel replaces, measured in the same run (default: with --setup ddp)")
    ap.add_argument("--save", help="write the per-step times (JSON) here")
    ap.add_argument("--seed", type=int, default=0, help="seed of the bootstrap")
    ap.add_argument("--smoke", action="store_true",
                    help="CI: 2 ranks, 2 layers, 1 bucket, 64x64 matmuls, 12 pairs; skipped (exit 0, said) "
                         "without torch")
    a = ap.parse_args(argv)
    ddp = a.setup == "ddp"
    a.budget_s = a.budget_s if a.budget_s is not None else (90.0 if ddp else 1100.0)
    a.min_pairs = a.min_pairs if a.min_pairs is not None else (100 if ddp else 300)
    a.floor = ddp if a.floor is None else a.floor
    a.python_arm = ddp if a.python_arm is None else a.python_arm
    if a.smoke:
        try:
            import torch  # noqa: F401
        except ImportError:
            print("logger_overhead --smoke: skipped, torch is not installed (pip install 'holmes[torch]')")
            return 0
        a.ranks, a.layers, a.buckets, a.size = 2, 2, 1, 64
        a.min_pairs, a.max_pairs, a.warmup, a.budget_s = 12, 12, 1, 60.0
    if a.pin is None:
        a.pin = hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) >= a.ranks

    import torch.multiprocessing as mp

    import holmes.logger  # noqa: F401 - imported once, shared by forked workers

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if a.setup == "ddp":
        import torch._dynamo  # noqa: F401 - DistributedDataParallel imports it: once, before the fork
        import torch.nn.parallel  # noqa: F401
    load0 = os.getloadavg()
    bare_ns, wrapped_ns = _per_op_cost(2000, 3) if a.smoke else _per_op_cost()
    disp_bare_ns, disp_ns = _dispatch_op_cost(2000, 3) if a.smoke else _dispatch_op_cost()
    dpy_bare_ns, dpy_ns = _dispatch_op_cost(2000, 3, False) if a.smoke else _dispatch_op_cost(native=False)
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    # the measurements above leave process groups in garbage: collected here, not in a forked
    # worker, where a gloo group's destructor waits forever on threads that were not forked
    gc.collect()
    with tempfile.TemporaryDirectory() as tmp:
        res = os.path.join(tmp, "result.json")
        mp.start_processes(worker, nprocs=a.ranks, start_method=method,
                           args=(a.ranks, os.path.join(tmp, "store"), os.path.join(tmp, "job"), a, res))
        with open(res) as f:
            r = json.load(f)
    load1 = os.getloadavg()
    if a.save:
        with open(a.save, "w") as f:
            json.dump(r, f)
    times = r["times"]
    logs, cpu_logs = _log_ratios(times, 0), _log_ratios(times, 1)
    ratios = np.expm1(logs) * 100
    overhead, lo, hi = (_pct(v) for v in hodges_lehmann(logs))
    half = (hi - lo) / 2
    med, mlo, mhi = (_pct(v) for v in median_bootstrap(logs, a.seed))
    cpu_over, clo, chi = (_pct(v) for v in hodges_lehmann(cpu_logs))
    med_off = statistics.median(x[0] for x in times["off"]) / 1e6
    med_on = statistics.median(x[0] for x in times["on"]) / 1e6
    cpu_off = statistics.median(x[1] for x in times["off"]) / 1e6
    per_op_us = (wrapped_ns - bare_ns) / 1e3
    dispatch_op_us = (disp_ns - disp_bare_ns) / 1e3
    dispatch_py_op_us = (dpy_ns - dpy_bare_ns) / 1e3
    ops = r["ops_per_step"]
    lag1 = float(np.corrcoef(ratios[:-1], ratios[1:])[0, 1]) if len(ratios) > 2 else float("nan")
    print(f"{'arm':<12}{'median step ms':>16}{'steps':>8}")
    print(f"{'logger off':<12}{med_off:>16.3f}{len(times['off']):>8}")
    print(f"{'logger on':<12}{med_on:>16.3f}{len(times['on']):>8}")
    print(f"{len(ratios)} pairs in {r['elapsed_s']:.0f} s; paired overheads %: IQR {np.percentile(ratios, 25):+.2f}.."
          f"{np.percentile(ratios, 75):+.2f}, spread {ratios.min():+.1f}..{ratios.max():+.1f}, lag-1 correlation "
          f"{lag1:+.3f}; rows logged on rank 0: {r['rows']}")
    print(f"overhead (Hodges-Lehmann of the log ratios, signed-rank 95% interval): {overhead:+.3f}% "
          f"({lo:+.3f}..{hi:+.3f}); median {med:+.3f}% (bootstrap {mlo:+.3f}..{mhi:+.3f})")
    print(f"rank 0 thread CPU time per step ({cpu_off:.1f} ms off): overhead {cpu_over:+.3f}% ({clo:+.3f}..{chi:+.3f}), "
          f"about {cpu_over / 100 * cpu_off * 1e3 / ops:.1f} us per operator ({r['n_async']} of {ops} asynchronous)")
    print(f"the hook alone (thread CPU time): bare no-op {bare_ns:.0f} ns, wrapped+logged no-op {wrapped_ns:.0f} ns "
          f"-> {per_op_us:.2f} us per op, {ops * per_op_us / (med_off * 1e3) * 100:.3f}% of a {med_off:.1f} ms step")
    print(f"the dispatcher hook (operators that bypass torch.distributed, e.g. DDP's buckets): a 1-rank gloo "
          f"ProcessGroup.allreduce {disp_bare_ns / 1e3:.1f} us bare, {disp_ns / 1e3:.1f} us logged -> "
          f"{dispatch_op_us:.2f} us per op ({'compiled kernel' if r.get('native') else 'Python kernel'}); the Python "
          f"kernel: {dpy_bare_ns / 1e3:.1f} us bare, {dpy_ns / 1e3:.1f} us logged -> {dispatch_py_op_us:.2f} us per op")
    floor_keys = f" native={r.get('native', 0)} dispatch_py_op_us={dispatch_py_op_us:.2f}"
    if "floor" in times:  # the Python-kernel mechanism alone, and the logger's share on top of it
        (f_over, flo, fhi), (fc_over, fclo, fchi), med_floor = _arm(times, "floor")
        print(f"floor arm (the dispatcher hook's kernels installed, recording nothing; median step "
              f"{med_floor:.3f} ms): wall {f_over:+.3f}% ({flo:+.3f}..{fhi:+.3f}), thread CPU {fc_over:+.3f}% "
              f"({fclo:+.3f}..{fchi:+.3f}): the dispatcher mechanism ({'compiled' if r.get('native') else 'boxed Python'} "
              f"kernel); the logger's own share is the rest ({cpu_over - fc_over:+.3f}% thread CPU)")
        floor_keys += (f" floor_pct={f_over:.3f} floor_ci95_pct={(fhi - flo) / 2:.3f} floor_cpu_pct={fc_over:.3f} "
                      f"floor_cpu_ci95_pct={(fchi - fclo) / 2:.3f}")
    if "python" in times:  # the same logger on the Python kernels only: the naive path, same run
        (p_over, plo, phi), (pc_over, pclo, pchi), med_py = _arm(times, "python")
        print(f"python arm (the same logger with native=False: the dispatcher's Python kernels; median step "
              f"{med_py:.3f} ms): wall {p_over:+.3f}% ({plo:+.3f}..{phi:+.3f}), thread CPU {pc_over:+.3f}% "
              f"({pclo:+.3f}..{pchi:+.3f}); the logger as run costs {cpu_over / pc_over if pc_over > 0 else float('nan'):.2f}x "
              f"its thread CPU")
        floor_keys += (f" python_pct={p_over:.3f} python_ci95_pct={(phi - plo) / 2:.3f} python_cpu_pct={pc_over:.3f}")
    if "hook" in times:  # DDP with torch's allreduce comm hook, logged through the namespace path
        (h_over, hlo, hhi), (hc_over, hclo, hchi), med_hook = _arm(times, "hook")
        print(f"comm-hook arm (register_comm_hook(None, allreduce_hook), logger on, {r.get('hook_rows', 0)} rows a "
              f"step; median step {med_hook:.3f} ms): wall {h_over:+.3f}% ({hlo:+.3f}..{hhi:+.3f}), thread CPU "
              f"{hc_over:+.3f}% ({hclo:+.3f}..{hchi:+.3f}) against the plain model off")
        floor_keys += (f" comm_hook_pct={h_over:.3f} comm_hook_ci95_pct={(hhi - hlo) / 2:.3f} "
                       f"comm_hook_cpu_pct={hc_over:.3f} comm_hook_rows={r.get('hook_rows', 0)}")
    print(f"load (1-min average) {load0[0]:.1f} at the start, {load1[0]:.1f} at the end; pinned: {a.pin}")
    print(f"overhead_pct={overhead:.3f} overhead_ci95_pct={half:.3f} per_op_us={per_op_us:.2f} "
          f"cpu_overhead_pct={cpu_over:.3f} cpu_overhead_ci95_pct={(chi - clo) / 2:.3f} ops_per_step={ops} "
          f"step_ms_off={med_off:.3f} step_ms_on={med_on:.3f} ranks={a.ranks} pairs={len(ratios)} "
          f"load={load1[0]:.1f} live={int(a.live)} setup={a.setup} dispatch_op_us={dispatch_op_us:.2f}"
          f"{floor_keys}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
