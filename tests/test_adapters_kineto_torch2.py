"""Kineto traces of torch 2.x gloo jobs: c10d:: dispatcher ops and gloo: annotations, no record_param_comms."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import holmes
from holmes.adapters import convert_kineto

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO / "tests" / "data" / "kineto_gloo_torch213"
C10D = {"c10d::allreduce_": "all_reduce", "c10d::broadcast_": "broadcast", "c10d::send": "send",
        "c10d::recv_": "recv"}


def _check_job(job, expected: dict[int, Counter]) -> None:
    assert job.world_size == 2 and [c.ranks for c in job.communicators.values()] == [(0, 1)]
    for r in (0, 1):
        t = job.ops(r).to_pydict()
        assert Counter(t["op"]) == Counter({C10D[k]: v for k, v in expected[r].items()})
        # DDP's two buckets (4160 floats) and the explicit all_reduce/send of 16 floats
        assert set(n for n, o in zip(t["nbytes"], t["op"]) if o == "all_reduce") == {16640, 64}
        assert set(t["end_source"]) == {"backend_op"} and all(e >= s for s, e in zip(t["start_ns"], t["end_ns"]))
        assert set(t["iteration"]) == {1, 2, 3, 4}  # ProfilerStep#1..4 (step 0: warm-up)
    # the P2P pair matches, and the collectives are numbered alike on both ranks
    a, b = job.ops(0).to_pydict(), job.ops(1).to_pydict()
    assert [p for o, p in zip(a["op"], a["peer"]) if o == "send"] == [1] * 4
    assert [p for o, p in zip(b["op"], b["peer"]) if o == "recv"] == [0] * 4
    coll = [[(o, s) for o, s, p in zip(t["op"], t["seq"], t["peer"]) if p is None] for t in (a, b)]
    assert coll[0] == coll[1]


def test_torch213_gloo_trace_converts(tmp_path):
    job = holmes.read_job(convert_kineto(TRACES, tmp_path / "job"))
    expected = {0: Counter({"c10d::broadcast_": 2, "c10d::allreduce_": 12, "c10d::send": 4}),
                1: Counter({"c10d::broadcast_": 2, "c10d::allreduce_": 12, "c10d::recv_": 4})}
    _check_job(job, expected)
    # rank 1 slept 50 ms in its 4th step: its peers' all_reduce of that step waited
    t = job.ops(0).to_pydict()
    waits = [e - s for it, o, s, e in zip(t["iteration"], t["op"], t["start_ns"], t["end_ns"]) if o == "all_reduce"]
    assert max(waits) > 40e6
    # the compute table: top-level CPU ops of the training thread, per ProfilerStep
    c = pq.read_table(tmp_path / "job" / "compute" / "rank-00000.parquet")
    assert [f.name for f in c.schema] == ["rank", "iteration", "name", "start_ns", "end_ns"]
    assert [str(f.type) for f in c.schema] == ["int32", "int64", "string", "int64", "int64"]
    names = set(c.column("name").to_pylist())
    assert "DistributedDataParallel.forward" in names and not any(n.startswith(("c10d::", "gloo:")) for n in names)
    assert set(c.column("iteration").to_pylist()) == {1, 2, 3, 4}


def test_torch213_gloo_trace_captured_here_converts(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "traces"
    out.mkdir()
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    p = subprocess.Popen([sys.executable, "tests/e2e_kineto_job.py", str(out)], cwd=REPO, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = p.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        pytest.fail("the profiled job did not finish in 180 s")
    assert p.returncode == 0, err[-3000:]
    expected = {r: Counter(json.loads((out / f"expected-{r}.json").read_text())) for r in (0, 1)}
    for r in (0, 1):
        (out / f"expected-{r}.json").unlink()
    _check_job(holmes.read_job(convert_kineto(out, tmp_path / "job")), expected)


def test_real_gpu_trace_writes_its_kernels_as_the_compute_table(tmp_path):
    from conftest import SHARED_DATA

    src = SHARED_DATA / "kineto" / "nccl_data.json.gz"
    if not src.exists():
        pytest.skip(f"{src} not present")
    convert_kineto(src, tmp_path / "job")
    c = pq.read_table(tmp_path / "job" / "compute" / "rank-00000.parquet").to_pydict()
    assert len(c["name"]) > 100 and set(c["rank"]) == {0}
    assert not any("nccl" in n.lower() for n in c["name"])  # communication is in ranks/, not here
    assert all(e >= s for s, e in zip(c["start_ns"], c["end_ns"]))
    # numbered by the same ProfilerStep#N windows as the operators
    its = set(holmes.read_job(tmp_path / "job").ops(0).column("iteration").to_pylist())
    assert set(c["iteration"]) & its
