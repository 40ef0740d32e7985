"""A Kineto trace with CUDA activity, captured on an H100 with torch 2.11 (``scripts/cuda_check.py``).

One rank, NCCL, 8 profiled steps of two 4 MiB all-reduces each (the odd steps behind a 40 ms
``torch.cuda._sleep``), then ``t * 2``. A one-rank NCCL communicator launches no NCCL kernel, so
the operators' times are the CPU ops'; the GPU kernels (the sleep, the multiply) land in the
compute table.
"""

from __future__ import annotations

import warnings
from collections import Counter
from pathlib import Path

import holmes
from holmes.adapters import convert_kineto

TRACE = Path(__file__).resolve().parent / "data" / "kineto_nccl_cuda_torch211"


def test_torch211_cuda_trace_converts_without_unknown_keys(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        convert_kineto(TRACE, tmp_path / "job")
    messages = [str(w.message) for w in caught]
    # CUDA 13 traces carry cuda_driver_version / cuda_runtime_version / cupti_version: known keys
    assert not [m for m in messages if "unknown top-level" in m]
    job = holmes.read_job(tmp_path / "job")
    ops = job.ops(0).to_pydict()
    assert Counter(ops["op"])["all_reduce"] == 16
    assert {n for n, o in zip(ops["nbytes"], ops["op"]) if o == "all_reduce"} == {4 << 20}
    steps = Counter(i for i, o in zip(ops["iteration"], ops["op"]) if o == "all_reduce")
    assert steps == Counter({i: 2 for i in range(8)})
    assert all(e >= s for s, e in zip(ops["start_ns"], ops["end_ns"]))


def test_torch211_cuda_trace_gpu_kernels_are_the_compute_table(tmp_path):
    convert_kineto(TRACE, tmp_path / "job")
    compute = holmes.read_job(tmp_path / "job").compute(0).to_pydict()
    names = Counter(compute["name"])
    assert names["at::cuda::(anonymous namespace)::spin_kernel(long)"] == 4  # the four delayed steps
    assert sum(1 for n in names.elements() if "MulFunctor" in n) == 8  # t * 2 in each step
    spins = [e - s for n, s, e in zip(compute["name"], compute["start_ns"], compute["end_ns"]) if "spin_kernel" in n]
    assert all(35e6 < d < 60e6 for d in spins)  # the 40 ms GPU sleep, timed by the GPU
