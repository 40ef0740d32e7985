"""What the ``capture_*.py`` examples share: the command line, the launch of the ranks (CPU
processes, gloo), the slow rank's stall and an independent count of the operators torch ran.

Not Holmes: plain PyTorch plumbing. The lines of the examples marked ``# holmes`` are everything
a training script adds to be captured.

The independent count: PyTorch's own flight recorder (``TORCH_FR_BUFFER_SIZE``), which records
every collective and point-to-point operator a process group runs, whoever called it (gloo
included, without timings). With ``--count`` each rank writes how many it recorded between
``logger.enable()`` and ``logger.close()``, by operator, to ``COUNT_DIR/rank-N.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

#: flight recorder names -> CommOps operators
FR_OPS = {"all_reduce": "all_reduce", "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce",
          "all_reduce_coalesced": "all_reduce", "all_gather": "all_gather", "_allgather_base": "all_gather",
          "all_gather_into_tensor_coalesced": "all_gather", "allgather_into_tensor_coalesced": "all_gather",
          "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
          "reduce_scatter_tensor_coalesced": "reduce_scatter", "all_to_all": "all_to_all",
          "alltoall_base": "all_to_all", "broadcast": "broadcast", "reduce": "reduce", "barrier": "barrier",
          "send": "send", "recv": "recv"}


def parse_args(doc: str, world: int = 4) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--out", required=True, help="job directory to write (must not exist)")
    p.add_argument("--world", type=int, default=world, help="ranks (CPU processes)")
    p.add_argument("--steps", type=int, default=16, help="training steps")
    p.add_argument("--slow-rank", type=int, default=None, help="this rank stalls in its forward")
    p.add_argument("--every", type=int, default=4, help="... in every N-th step (1: every step)")
    p.add_argument("--delay", type=float, default=0.06, help="... for this many seconds")
    p.add_argument("--count", default=None, help="write torch's own operator count per rank here")
    p.add_argument("--healthy-out", default=None,
                   help="first capture the same job without the stall here (same processes)")
    return p.parse_args()


def jobs(args: argparse.Namespace) -> list[tuple[str, int | None, str | None]]:
    """``(job directory, slow rank, count directory)`` of each job the ranks run, in order."""
    out = [(args.out, args.slow_rank, args.count)]
    if args.healthy_out:
        count = None if args.count is None else os.path.join(args.count, "healthy")
        out.insert(0, (args.healthy_out, None, count))
    return out


def stall(args: argparse.Namespace, slow_rank: int | None, rank: int, step: int) -> None:
    """The injected fault: the slow rank sleeps in its forward in every ``--every``-th step."""
    if rank == slow_rank and step % args.every == args.every - 1:
        time.sleep(args.delay)


def launch(worker: Callable, args: argparse.Namespace, preload: tuple[str, ...] = ()) -> None:
    """Run ``worker(rank, args, init_file)`` on ``args.world`` CPU processes.

    ``preload``: modules imported once here, before the ranks are forked (``torch.nn.parallel``
    alone imports ``torch._dynamo``: seconds per process on a small machine)."""
    import importlib
    import sys

    try:
        import torch.multiprocessing as mp
    except ImportError:
        print("this example needs PyTorch: pip install 'holmes[torch]' (see docs/install.md)", file=sys.stderr)
        raise SystemExit(2) from None
    import holmes.logger  # noqa: F401 - shared with forked workers

    for name in preload:
        importlib.import_module(name)

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if args.count:
        os.environ["TORCH_FR_BUFFER_SIZE"] = "100000"  # torch's flight recorder (read by count_ops)
        for _, _, count in jobs(args):
            Path(count).mkdir(parents=True, exist_ok=True)
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(worker, nprocs=args.world, args=(args, os.path.join(tmp, "store")),
                           start_method=method)


def init(rank: int, args: argparse.Namespace, init_file: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=args.world,
                            timeout=timedelta(seconds=120))


def count_ops(count_dir: str | None, rank: int, t0_ns: int, t1_ns: int) -> None:
    """Write the operators torch's flight recorder saw created in ``[t0_ns, t1_ns)``, by name."""
    if not count_dir:
        return
    import torch

    trace = pickle.loads(torch._C._distributed_c10d._dump_fr_trace())
    names: Counter = Counter()
    for e in trace.get("entries", []):
        if t0_ns <= int(e["time_created_ns"]) < t1_ns:
            name = str(e["profiling_name"]).split(":", 1)[-1]
            names[FR_OPS.get(name, name)] += 1
    with open(os.path.join(count_dir, f"rank-{rank}.json"), "w") as f:
        json.dump(dict(names), f)
