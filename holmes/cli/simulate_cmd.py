"""``holmes simulate``: generate a CommOps job of hybrid-parallel training with injected faults.

Example::

    holmes simulate --out /tmp/job --tp 4 --pp 4 --dp 4 --iterations 30 --fault gpu:5@spike*2.0
"""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["add_parser", "run"]


def add_parser(p: argparse.ArgumentParser) -> None:
    """Fill the ``simulate`` subcommand's parser."""
    p.add_argument("--out", required=True, metavar="JOB", help="job directory to write")
    for name, help_text in (("tp", "tensor-parallel degree"), ("pp", "pipeline-parallel degree"),
                            ("dp", "data-parallel degree")):
        p.add_argument(f"--{name}", type=int, required=True, help=help_text)
    p.add_argument("--ep", type=int, default=1, help="expert-parallel degree (carved out of tp x cp x dp; default 1)")
    p.add_argument("--cp", type=int, default=1, help="context-parallel degree (default 1)")
    p.add_argument("--micro-batches", type=int, default=None, metavar="M",
                   help="micro-batches per iteration (default max(4, 4 x pp): a pipeline bubble near Megatron's)")
    p.add_argument("--layers-per-stage", type=int, default=1, metavar="L", help="layers per pipeline stage (default 1)")
    p.add_argument("--iterations", type=int, default=20, metavar="N", help="iterations (default 20)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="seed of noise and fault patterns (default 0)")
    p.add_argument("--fault", action="append", default=[], metavar="SPEC",
                   help="DEVICE_ID@PATTERN[:ITERS]*FACTOR, e.g. gpu:5@spike*2.0 (repeatable)")
    p.add_argument("--drift", type=float, default=0.0,
                   help="per-iteration relative increase of compute time (default 0)")
    p.add_argument("--no-sequence-parallel", action="store_true", help="tp all-reduce instead of AG/RS")
    p.add_argument("--no-distributed-optimizer", action="store_true", help="dp all-reduce instead of RS + AG")
    p.add_argument("--gpus-per-host", type=int, default=8, help="GPUs per host (default 8)")
    p.add_argument("--topology", default="rail", metavar="rail|fat-tree|FILE",
                   help="cluster network: rail (default), fat-tree or a topology.json")
    p.add_argument("--order", default="tp-cp-ep-dp-pp", help="Megatron rank order (default tp-cp-ep-dp-pp)")
    p.add_argument("--compression", default="lz4", choices=("lz4", "zstd", "snappy", "none"),
                   help="parquet codec of the rank files (default lz4)")
    p.add_argument("--parts", type=int, default=None, metavar="N",
                   help="write each rank's log in parts of N iterations, as a live job does (ranks/rank-XXXXX/part-*.parquet)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing job directory")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing on success (no progress bars)")


#: Upper bounds of the simulation sizes, checked before anything is allocated (docs/limits.md).
MAX_ITERATIONS = 100_000
MAX_MICRO_BATCHES = 1024
MAX_LAYERS_PER_STAGE = 1024


def _check_sizes(args: argparse.Namespace) -> None:
    from holmes.errors import ConfigError
    from holmes.limits import check_world_size

    for name in ("tp", "pp", "dp", "ep", "cp", "micro_batches", "layers_per_stage", "iterations", "gpus_per_host",
                 "parts"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise ConfigError(f"--{name.replace('_', '-')} {v} must be >= 1")
    world = args.tp * args.pp * args.dp * args.cp
    check_world_size(world, "--tp x --cp x --dp x --pp")
    for name, cap in (("iterations", MAX_ITERATIONS), ("micro_batches", MAX_MICRO_BATCHES),
                      ("layers_per_stage", MAX_LAYERS_PER_STAGE)):
        if (getattr(args, name) or 0) > cap:
            raise ConfigError(f"--{name.replace('_', '-')} {getattr(args, name)} exceeds the cap of {cap} "
                              "(see docs/limits.md)")
    if not -1.0 < args.drift < 10.0:  # also refuses nan
        raise ConfigError(f"--drift {args.drift} must lie in (-1, 10)")


def run(args: argparse.Namespace) -> int:
    """Simulate and write the job; prints a one-line JSON summary on stdout."""
    from holmes.io.outputs import check_output
    from holmes.simulate import Workload
    from holmes.simulate.simulator import run_simulation
    from holmes.progress import terminal_progress
    from holmes.simulate.writer import write_result

    _check_sizes(args)
    # refuse a destructive output before simulating (the writer checks again and swaps the job in whole)
    topo_inputs = [args.topology] if args.topology not in ("rail", "fat-tree") else []
    check_output(args.out, inputs=topo_inputs, overwrite=args.overwrite, kind="job")

    bars = terminal_progress(enabled=not args.quiet)
    w = Workload(micro_batches=args.micro_batches, layers_per_stage=args.layers_per_stage,
                 sequence_parallel=not args.no_sequence_parallel,
                 distributed_optimizer=not args.no_distributed_optimizer)
    res = run_simulation(tp=args.tp, pp=args.pp, dp=args.dp, ep=args.ep, cp=args.cp, order=args.order, workload=w,
                         iterations=args.iterations, seed=args.seed, faults=args.fault, drift=args.drift,
                         topology=args.topology, gpus_per_host=args.gpus_per_host, progress=bars)
    path = write_result(res, args.out, overwrite=args.overwrite, compression=args.compression, progress=bars,
                        parts=args.parts)
    if not args.quiet:
        truth = res.truth()
        summary = {"job": str(path), "world_size": res.world_size, "iterations": res.iterations,
                   "ops_per_rank_per_iteration": [int(res.program.ops_per_rank.min()),
                                                  int(res.program.ops_per_rank.max())],
                   "abnormal_ops": int(res.abnormal.sum()),
                   "faults": [{"device": f.device, "pattern": f.pattern, "factor": f.factor,
                               "iterations": f.iterations} for f in truth.faults]}
        sys.stdout.write(json.dumps(summary) + "\n")
    return 0
