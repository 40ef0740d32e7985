"""Capture an FSDP2 (``fully_shard``) job with ``holmes.logger``.

Four CPU processes (gloo) train a small MLP whose layers are each ``fully_shard``-ed: per step,
each layer's parameters are all-gathered before its forward and again before its backward
(asynchronously, prefetched), and its gradients reduce-scattered. The logger records every one;
an asynchronous operator ends when its work completes, not when it was issued::

    python examples/capture_fsdp2.py --out /tmp/fsdp-job --slow-rank 2
    holmes localize /tmp/fsdp-job

The lines marked ``# holmes`` are all a training script adds.
"""

from __future__ import annotations

import time

from _capture_common import count_ops, init, jobs, launch, parse_args, stall


def train(rank: int, args, out: str, slow_rank: int | None, count_dir: str | None) -> None:
    """One job: ``args.steps`` FSDP2 steps, captured into ``out``."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import holmes.logger

    logger = holmes.logger.CommOpsLogger(out)  # holmes
    logger.enable()  # holmes
    t0 = time.time_ns()
    mesh = init_device_mesh("cpu", (args.world,))
    layers = [torch.nn.Linear(256, 256) for _ in range(4)]
    model = torch.nn.Sequential(*layers)
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(rank)
    for step in range(args.steps):
        logger.step(step)  # holmes
        x = torch.randn(32, 256, generator=gen)
        stall(args, slow_rank, rank, step)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    count_ops(count_dir, rank, t0, time.time_ns())
    logger.close()  # holmes: rank 0 writes job.json


def worker(rank: int, args, init_file: str) -> None:
    init(rank, args, init_file)
    for out, slow_rank, count_dir in jobs(args):
        train(rank, args, out, slow_rank, count_dir)


if __name__ == "__main__":
    launch(worker, parse_args(__doc__), preload=("torch.distributed.fsdp", "torch.distributed.device_mesh"))
