"""Capture a small 3-D parallel PyTorch job with ``holmes.logger`` and localize its slow GPU.

Eight CPU processes (gloo) train a tiny two-stage MLP with tensor parallelism 2 (column/row
parallel layers, an ``all_reduce`` per layer), pipeline parallelism 2 (GPipe micro-batches,
``send``/``recv`` forward and ``isend``/``irecv`` backward) and data parallelism 2 (an
asynchronous gradient ``all_reduce``). One rank computes slowly in some iterations. The logger
writes a CommOps job directory; ``holmes.localize`` then names the slow rank's GPU::

    python examples/torch_capture_and_localize.py --out /tmp/torch-job --slow-rank 5
    holmes localize /tmp/torch-job

Needs PyTorch (the extra ``holmes[torch]``, or the CPU-only wheel: docs/install.md); without it
the script says so in one line and exits with status 2. The only changes to the training code are the lines marked
``# holmes``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

TP, PP, DP = 2, 2, 2
WORLD = TP * PP * DP


def _parse_iters(spec: str) -> list[int]:
    out: list[int] = []
    for part in filter(None, spec.split(",")):
        a, _, b = part.partition("-")
        out.extend(range(int(a), int(b or a) + 1))
    return out


def worker(rank: int, out_dir: str, init_file: str, slow_rank: int, slow_iterations: list[int],
           delay: float, iterations: int, micro_batches: int, compute: float) -> None:
    """One rank of the job (run by ``torch.multiprocessing.spawn``)."""
    import torch
    import torch.distributed as dist

    import holmes.logger
    from holmes.topology.layout import ParallelLayout

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=90))
    layout = ParallelLayout(tp=TP, pp=PP, dp=DP)
    mine = {}
    for kind, desc in (("tp", "TENSOR_MODEL_PARALLEL_GROUP"), ("dp", "DATA_PARALLEL_GROUP"),
                       ("pp", "PIPELINE_MODEL_PARALLEL_GROUP")):
        for ranks in layout.groups(kind):  # every rank creates every group, in the same order
            g = dist.new_group(list(ranks), group_desc=desc)
            if rank in ranks:
                mine[kind] = (g, ranks)
    tp, dp, pp = mine["tp"][0], mine["dp"][0], mine["pp"][0]
    prev, nxt = layout.pp_prev(rank), layout.pp_next(rank)

    logger = holmes.logger.CommOpsLogger(out_dir, layout=layout)  # holmes

    d, hidden, batch = 32, 64, 8
    gen = torch.Generator().manual_seed(1000 + rank)
    w1 = torch.randn(hidden // TP, d, generator=gen) * 0.1  # column-parallel
    w2 = torch.randn(d, hidden // TP, generator=gen) * 0.1  # row-parallel
    dist.broadcast(w1, src=mine["dp"][1][0], group=dp)
    dist.broadcast(w2, src=mine["dp"][1][0], group=dp)
    for it in range(-1, iterations):  # iteration -1 warms up and is not logged
        if it == 0:
            logger.enable()  # holmes
        if it >= 0:
            logger.step(it)  # holmes
        saved = []
        for _mb in range(micro_batches):  # forward
            if prev is None:
                x = torch.randn(batch, d, generator=gen)
            else:
                x = torch.empty(batch, d)
                dist.recv(x, src=prev, group=pp)
            h = torch.relu(x @ w1.T)
            time.sleep(compute)  # stands for the GPU's compute time (sleeping keeps 8 ranks on few cores steady)
            if rank == slow_rank and it in slow_iterations:
                time.sleep(delay)  # the injected slowdown: this GPU computes slowly
            y = h @ w2.T
            dist.all_reduce(y, group=tp)
            if nxt is not None:
                dist.send(y, dst=nxt, group=pp)
            saved.append((x, h))
        g1, g2 = torch.zeros_like(w1), torch.zeros_like(w2)
        for x, h in reversed(saved):  # backward
            if nxt is None:
                gy = torch.ones(batch, d) / batch
            else:
                gy = torch.empty(batch, d)
                dist.irecv(gy, src=nxt, group=pp).wait()
            time.sleep(compute)
            g2 += gy.T @ h
            gh = (gy @ w2) * (h > 0)
            g1 += gh.T @ x
            gx = gh @ w1
            dist.all_reduce(gx, group=tp)
            if prev is not None:
                dist.isend(gx, dst=prev, group=pp).wait()
        flat = torch.cat([g1.flatten(), g2.flatten()])
        dist.all_reduce(flat, group=dp, async_op=True).wait()
        flat /= DP
        w1 -= 0.01 * flat[: w1.numel()].view_as(w1)
        w2 -= 0.01 * flat[w1.numel():].view_as(w2)
    logger.close()  # holmes: every rank closes; rank 0 then writes job.json
    dist.destroy_process_group()


def run_job(out_dir: str | os.PathLike[str], *, slow_rank: int = 5, slow_iterations: list[int] | None = None,
            delay: float = 0.1, iterations: int = 30, micro_batches: int = 2, compute: float = 0.02) -> Path:
    """Run the 8-rank job on this machine's CPU, capturing it into ``out_dir``; returns ``out_dir``."""
    import torch.multiprocessing as mp

    import holmes.logger  # noqa: F401 - imported once here, shared by forked workers
    from holmes.topology.layout import ParallelLayout  # noqa: F401

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if slow_iterations is None:
        slow_iterations = [i for i in range(iterations) if i % 4 == 3]
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo" if sys.platform.startswith("linux") else "lo0")
    with tempfile.TemporaryDirectory() as tmp:
        # fork (where available) shares the parent's imported torch: much faster than spawn
        method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
        mp.start_processes(worker, nprocs=WORLD, join=True, start_method=method,
                           args=(str(out), os.path.join(tmp, "store"), slow_rank, list(slow_iterations), delay,
                       iterations, micro_batches, compute))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="job directory to write (default: a temporary one)")
    ap.add_argument("--slow-rank", type=int, default=5)
    ap.add_argument("--slow-iterations", default=None, help="e.g. 3,7,11-13 (default: every 4th from 3)")
    ap.add_argument("--delay", type=float, default=0.1, help="seconds of extra compute on the slow rank")
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--micro-batches", type=int, default=2)
    ap.add_argument("--compute", type=float, default=0.02, help="seconds of compute per micro-batch and pass")
    ap.add_argument("--no-localize", action="store_true", help="only capture")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    a = ap.parse_args(argv)
    try:
        import torch  # noqa: F401
    except ImportError:
        print("torch_capture_and_localize.py needs PyTorch, which is not installed: pip install torch "
              "(the CPU-only wheel is enough; see docs/install.md)", file=sys.stderr)
        return 2
    out = a.out or tempfile.mkdtemp(prefix="holmes-torch-job-")
    iters = _parse_iters(a.slow_iterations) if a.slow_iterations else None
    t0 = time.perf_counter()
    run_job(out, slow_rank=a.slow_rank, slow_iterations=iters, delay=a.delay, iterations=a.iterations,
            micro_batches=a.micro_batches, compute=a.compute)
    print(f"captured {out} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    if a.no_localize:
        return 0
    import holmes

    report = holmes.localize(out, pivot=0)
    if a.json:
        print(json.dumps(report.to_json()))
    else:
        top = report.to_json()["devices"][:3]
        print("most likely culprits:", ", ".join(f"{d['id']} ({d['score']:.2f})" for d in top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
