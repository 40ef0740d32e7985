"""The trace simulator: CommOps jobs of hybrid-parallel LLM training with injected faults.

``holmes.simulate.simulate(out, tp=..., pp=..., dp=..., faults=[...])`` writes a job directory
(``job.json`` with ``parallel`` and ``communicators``, ``ranks/``, ``iterations/``,
``topology.json``, ``truth.json``) whose rank files carry the ground-truth ``abnormal`` column.

Modules: :mod:`~holmes.simulate.program` (the per-rank communication program: Megatron 1F1B
with tp/cp/ep/dp/pp collectives), :mod:`~holmes.simulate.network` (ring transfer costs over the
cluster topology), :mod:`~holmes.simulate.faults` (fault specs, spike/fluctuation/persistent
patterns, drift), :mod:`~holmes.simulate.engine` (numba timing engine),
:mod:`~holmes.simulate.simulator` (runs faulted and counterfactual passes, labels ops),
:mod:`~holmes.simulate.writer` (tables and job directory), :mod:`~holmes.simulate.scenarios`
(random training jobs, single-fault localization jobs).

Examples
--------
>>> import tempfile, holmes
>>> from holmes.simulate import simulate
>>> job_dir = simulate(tempfile.mkdtemp() + "/job", tp=2, pp=2, dp=2, iterations=4,
...                           faults=["gpu:5@persistent:2*3"])
>>> job = holmes.read_job(job_dir)
>>> job.world_size, job.truth.faults[0].iterations
(8, [2, 3])
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from holmes.simulate.faults import FaultSpec, active_factors, parse_faults
from holmes.simulate.program import Program, Workload, build_program
from holmes.simulate.simulator import SimResult, run_simulation

__all__ = ["simulate", "run_simulation", "SimResult", "FaultSpec", "Workload", "Program", "build_program",
           "parse_faults", "active_factors"]


def simulate(out: str | os.PathLike[str], *, tp: int = 1, pp: int = 1, dp: int = 1, ep: int = 1, cp: int = 1,
             micro_batches: int | None = None, iterations: int = 20, seed: int = 0,
             faults: Iterable[str | FaultSpec] = (), drift: float = 0.0, sequence_parallel: bool = True,
             distributed_optimizer: bool = True, layers_per_stage: int = 1, gpus_per_host: int = 8,
             topology: Any = None, overwrite: bool = False, order: str = "tp-cp-ep-dp-pp",
             abnormal_margin: float = 0.1, abnormal_abs_us: float = 20.0, workload: Workload | None = None,
             name: str | None = None, threads: int = 2, clock_offset_us: float = 100.0,
             clock_drift_ppm: float = 0.0) -> Path:
    """Simulate a training job and write it as a CommOps job directory.

    Parameters
    ----------
    out : path-like
        Job directory to create (must be absent or empty unless ``overwrite``).
    tp, pp, dp, ep, cp : int
        Parallel degrees; world size = tp x cp x dp x pp, ep carved out of tp x cp x dp.
    micro_batches : int, optional
        Micro-batches per iteration (1F1B schedule); default ``max(4, 4 * pp)`` (Megatron keeps
        several micro-batches per stage so the pipeline bubble stays small).
    iterations : int
        Training iterations to simulate.
    seed : int
        Seeds the noise and the fault patterns; the same seed gives the same job.
    faults : iterable of str or FaultSpec
        ``DEVICE_ID@PATTERN[:ITERS]*FACTOR`` specs, e.g. ``"gpu:5@spike*2.0"``.
    drift : float
        Per-iteration relative increase of compute time (e.g. 2e-5; the paper saw ~6% a month).
    sequence_parallel, distributed_optimizer, layers_per_stage :
        Workload shape (see :class:`Workload`); ignored when ``workload`` is given.
    gpus_per_host : int
        GPUs per host of the generated topology.
    topology : None, "rail", "fat-tree", path or ClusterTopology
        The cluster network (default: rail-optimized two-tier Clos).
    overwrite : bool
        Replace an existing job directory.
    order : str
        Megatron rank order.
    abnormal_margin, abnormal_abs_us : float
        The ``abnormal`` label rule (see :mod:`holmes.simulate.simulator`).
    workload : Workload, optional
        Full workload; overrides ``micro_batches``, ``sequence_parallel``, ``distributed_optimizer``
        and ``layers_per_stage``.
    name : str, optional
        Job name recorded in job.json.
    threads : int
        Writer threads.
    clock_offset_us, clock_drift_ppm : float
        Per-host wall-clock offset sigma (us) and rate-error sigma (ppm) of the logged timestamps
        (see :func:`~holmes.simulate.simulator.run_simulation`).

    Returns
    -------
    pathlib.Path
        The job directory.

    Raises
    ------
    ConfigError, LayoutError
        Bad degrees, specs or unknown fault devices (one-line messages).
    """
    w = workload or Workload(micro_batches=micro_batches, layers_per_stage=layers_per_stage,
                             sequence_parallel=sequence_parallel, distributed_optimizer=distributed_optimizer)
    res = run_simulation(tp=tp, pp=pp, dp=dp, ep=ep, cp=cp, order=order, workload=w, iterations=iterations,
                         seed=seed, faults=faults, drift=drift, topology=topology, gpus_per_host=gpus_per_host,
                         abnormal_margin=abnormal_margin, abnormal_abs_us=abnormal_abs_us, name=name,
                         clock_offset_us=clock_offset_us, clock_drift_ppm=clock_drift_ppm)
    from holmes.simulate.writer import write_result

    return write_result(res, out, overwrite=overwrite, threads=threads)
