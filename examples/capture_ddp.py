"""Capture a stock DistributedDataParallel job with ``holmes.logger``.

Four CPU processes (gloo) train a small MLP wrapped in plain ``DistributedDataParallel``; its
gradient all-reduces are issued by DDP's C++ reducer, bucket by bucket, and the logger records
them at the dispatcher (docs/logger.md, "Capture your job"). One rank can be made to stall::

    python examples/capture_ddp.py --out /tmp/ddp-job --slow-rank 2
    holmes localize /tmp/ddp-job

The lines marked ``# holmes`` are all a training script adds.
"""

from __future__ import annotations

import time

from _capture_common import count_ops, init, jobs, launch, parse_args, stall


def train(rank: int, args, out: str, slow_rank: int | None, count_dir: str | None) -> None:
    """One job: ``args.steps`` DDP steps, captured into ``out``."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    import holmes.logger

    logger = holmes.logger.CommOpsLogger(out)  # holmes
    logger.enable()  # holmes: before DDP(...), so its parameter broadcast is recorded too
    t0 = time.time_ns()

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)])
            self.step = 0

        def forward(self, x):
            stall(args, slow_rank, rank, self.step)
            return self.layers(x)

    net = Net()
    model = DDP(net, bucket_cap_mb=0.3)  # a small bucket cap: a few gradient buckets per step
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(rank)
    for step in range(args.steps):
        logger.step(step)  # holmes
        net.step = step
        loss = model(torch.randn(32, 256, generator=gen)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    count_ops(count_dir, rank, t0, time.time_ns())
    logger.close()  # holmes: rank 0 writes job.json


def worker(rank: int, args, init_file: str) -> None:
    init(rank, args, init_file)
    for out, slow_rank, count_dir in jobs(args):
        train(rank, args, out, slow_rank, count_dir)


if __name__ == "__main__":
    # DistributedDataParallel imports torch._dynamo: once here rather than in every rank
    launch(worker, parse_args(__doc__), preload=("torch.nn.parallel", "torch._dynamo"))
