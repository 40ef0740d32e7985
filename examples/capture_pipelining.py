"""Capture a ``torch.distributed.pipelining`` job (GPipe or 1F1B) with ``holmes.logger``.

Four CPU processes (gloo; ``--world`` N for N), one pipeline stage each (a small MLP cut in
four), 4 micro-batches a step (N when N > 4: 1F1B needs one per stage at least), scheduled by
``ScheduleGPipe`` or ``Schedule1F1B``. The schedules send activations and gradients in batches
of ``isend``/``irecv`` (``P2POp``); the logger records each as a send or recv with its peer::

    python examples/capture_pipelining.py --out /tmp/pp-job --schedule 1f1b --slow-rank 2
    holmes localize /tmp/pp-job

The lines marked ``# holmes`` are all a training script adds.
"""

from __future__ import annotations

import sys
import time

from _capture_common import count_ops, init, jobs, launch, parse_args, stall

#: micro-batches a step, at least one per stage (``Schedule1F1B`` refuses fewer)
MICRO_BATCHES = 4


def train(rank: int, args, out: str, slow_rank: int | None, count_dir: str | None) -> None:
    """One job: ``args.steps`` pipeline steps, captured into ``out``."""
    import torch
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    import holmes.logger

    logger = holmes.logger.CommOpsLogger(out)  # holmes
    logger.enable()  # holmes
    t0 = time.time_ns()

    class Stage(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(128, 128)
            self.step = 0

        def forward(self, x):
            stall(args, slow_rank, rank, self.step)
            return torch.relu(self.lin(x))

    stage_mod = Stage()
    stage = PipelineStage(stage_mod, rank, args.world, torch.device("cpu"))
    cls = Schedule1F1B if args.schedule == "1f1b" else ScheduleGPipe
    micro = max(MICRO_BATCHES, args.world)
    schedule = cls(stage, n_microbatches=micro, loss_fn=lambda y, t: (y - t).square().mean())
    opt = torch.optim.SGD(stage_mod.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(0)
    for step in range(args.steps):
        logger.step(step)  # holmes
        stage_mod.step = step
        x = torch.randn(8 * micro, 128, generator=gen)
        target = torch.randn(8 * micro, 128, generator=gen)
        if rank == 0:
            schedule.step(x)
        elif rank == args.world - 1:
            schedule.step(target=target, losses=[])
        else:
            schedule.step()
        opt.step()
        opt.zero_grad()
    count_ops(count_dir, rank, t0, time.time_ns())
    logger.close()  # holmes: rank 0 writes job.json


def worker(rank: int, args, init_file: str) -> None:
    init(rank, args, init_file)
    for out, slow_rank, count_dir in jobs(args):
        train(rank, args, out, slow_rank, count_dir)


if __name__ == "__main__":
    schedule = "gpipe"
    if "--schedule" in sys.argv:  # ours, not the common options'
        i = sys.argv.index("--schedule")
        schedule = sys.argv[i + 1]
        del sys.argv[i:i + 2]
    if schedule not in ("gpipe", "1f1b"):
        sys.exit(f"--schedule: gpipe or 1f1b, not {schedule!r}")
    a = parse_args(__doc__)
    a.schedule = schedule
    launch(worker, a, preload=("torch.distributed.pipelining",))
