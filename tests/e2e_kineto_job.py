"""A 2-rank gloo job profiled with torch.profiler (Kineto), the way a torch 2.x user does it.

Run by ``tests/test_adapters_kineto_torch2.py``: ``python tests/e2e_kineto_job.py OUT_DIR``. Each
rank trains a small DDP model for 5 steps (the first a profiler warm-up), all-reduces a tensor and
sends (rank 0) / receives (rank 1) one per step, and exports ``OUT_DIR/rank{R}.json``;
``OUT_DIR/expected-{R}.json`` counts the c10d operators it ran in the profiled steps (what the
profiler's ``c10d::`` events say, counted independently of the converter). The traces in
``tests/data/kineto_gloo_torch213/`` were made by this script (torch 2.13.0+cpu).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections import Counter

STEPS, WARMUP = 5, 1


def worker(rank: int, out: str, init_file: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, schedule

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)), bucket_cap_mb=0.01)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 schedule=schedule(wait=0, warmup=WARMUP, active=STEPS - WARMUP),
                 on_trace_ready=lambda p: p.export_chrome_trace(os.path.join(out, f"rank{rank}.json"))) as prof:
        for i in range(STEPS):
            if rank == 1 and i == 3:
                time.sleep(0.05)
            model(torch.randn(8, 64)).sum().backward()
            t = torch.ones(16)
            dist.all_reduce(t)
            if rank == 0:
                dist.send(t, 1)
            else:
                dist.recv(t, 0)
            prof.step()
    trace = json.load(open(os.path.join(out, f"rank{rank}.json")))
    ops = Counter(e["name"] for e in trace["traceEvents"] if str(e.get("name", "")).startswith("c10d::"))
    with open(os.path.join(out, f"expected-{rank}.json"), "w") as f:
        json.dump(dict(ops), f)
    dist.destroy_process_group()


def main(out: str) -> None:
    import torch.multiprocessing as mp
    import torch.nn.parallel  # noqa: F401 - imported once, shared with the forked ranks
    import torch._dynamo  # noqa: F401 - DistributedDataParallel imports it

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(worker, nprocs=2, args=(out, os.path.join(tmp, "store")), start_method=method)


if __name__ == "__main__":
    main(sys.argv[1])
