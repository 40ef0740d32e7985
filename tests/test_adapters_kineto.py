"""Kineto converter: the real HTA trace and small synthetic traces (P2P, Gloo, broken files)."""

from __future__ import annotations

import gzip
import json

import pytest

import holmes
from holmes.adapters import ConvertWarning, convert_kineto
from holmes.errors import ConvertError, ParseError


@pytest.fixture(scope="module")
def kineto_job(tmp_path_factory):
    from conftest import SHARED_DATA

    src = SHARED_DATA / "kineto" / "nccl_data.json.gz"
    if not src.is_file():
        pytest.skip(f"real Kineto trace not present at {src}")
    out = tmp_path_factory.mktemp("kineto") / "job"
    with pytest.warns(ConvertWarning, match=r"have no log: \[1\]"):
        convert_kineto(src, out)
    return holmes.read_job(out)


def test_real_trace(kineto_job):
    job = kineto_job
    assert job.world_size == 2 and job.available_ranks() == [0]
    assert job.meta.communicators["other-0"].name == "default_pg"
    t = job.ops(0)
    rows = t.to_pylist()
    assert len(rows) == 21  # 27 record_param_comms minus 6 'wait'
    assert sorted(set(t.column("iteration").to_pylist())) == [4, 5, 6]
    per_step = [[o["op"] for o in rows if o["iteration"] == s] for s in (4, 5, 6)]
    assert per_step[0] == per_step[1] == per_step[2] == ["broadcast"] * 2 + ["all_reduce"] * 5
    assert [o["seq"] for o in rows] == list(range(21))
    assert all(o["end_source"] == "gpu_kernel" and o["kernel_start_ns"] >= o["start_ns"] for o in rows)
    assert all(o["end_ns"] == o["kernel_end_ns"] for o in rows)
    # absolute time: 2024-05-23 (baseTimeNanoseconds + ts)
    assert 1_716_400_000 * 10**9 < rows[0]["start_ns"] < 1_716_500_000 * 10**9
    assert rows[2]["nbytes"] == 2049000 * 4
    assert job.meta.source.details["wait_records_ignored"] == {"0": 6}


def _rpc(ts, name, pg="0", ranks="[0, 1]", desc="default_pg", ext=None, **extra):
    args = {"Collective name": name, "Process Group Name": pg, "Process Group Ranks": ranks,
            "Process Group Description": desc, "In msg nelems": 10, "Out msg nelems": 10, "dtype": "Float",
            "Group size": len(json.loads(ranks)), **extra}
    if ext is not None:
        args["External id"] = ext
    return {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": ts, "dur": 5,
            "args": args}


def _trace(rank, events, backend="gloo"):
    return {"schemaVersion": 1, "baseTimeNanoseconds": 10**18,
            "distributedInfo": {"backend": backend, "rank": rank, "world_size": 2, "pg_config": [
                {"pg_name": "0", "pg_desc": "default_pg", "backend_config": f"cpu:{backend}", "pg_size": 2, "ranks": [0, 1]}]},
            "traceEvents": events}


def _steps(n=2):
    return [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "ts": 1000 * i, "dur": 999, "pid": 1,
             "tid": 1} for i in range(n)]


def test_gloo_p2p_directory_of_traces(tmp_path):
    src = tmp_path / "traces"
    src.mkdir()
    for r in (0, 1):
        ev = _steps()
        for i in range(2):
            ev.append(_rpc(1000 * i + 10, "allreduce", Seq=100 + i))
            if r == 0:
                ev.append(_rpc(1000 * i + 20, "send", **{"Dst Rank": 1}))
            else:
                ev.append(_rpc(1000 * i + 20, "recv", Rank=0))  # group-local peer only
            ev.append(_rpc(1000 * i + 30, "gather"))
        with gzip.open(src / f"rank{r}.json.gz", "wt") as f:
            json.dump(_trace(r, ev), f)
    with pytest.warns(ConvertWarning) as rec:
        job = holmes.read_job(convert_kineto(src, tmp_path / "job"))
    msgs = " | ".join(str(w.message) for w in rec)
    assert "Gloo/CPU trace" in msgs and "gather x4" in msgs
    t0, t1 = job.ops(0).to_pylist(), job.ops(1).to_pylist()
    assert [(o["op"], o["peer"], o["seq"], o["iteration"]) for o in t0] == [
        ("all_reduce", None, 100, 0), ("send", 1, 0, 0), ("all_reduce", None, 101, 1), ("send", 1, 1, 1)]
    assert [(o["op"], o["peer"], o["seq"]) for o in t1 if o["op"] == "recv"] == [("recv", 0, 0), ("recv", 0, 1)]
    assert all(o["end_source"] == "cpu_op" and o["end_ns"] - o["start_ns"] == 5000 for o in t0)
    assert job.meta.source.details["skipped"] == {"gather": 4}


def test_kernel_linked_by_correlation_and_kernel_only_trace(tmp_path):
    ev = _steps(1) + [_rpc(10, "allreduce"),
                      {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 12,
                       "dur": 1, "args": {"correlation": 77}},
                      {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "pid": 0,
                       "tid": 7, "ts": 40, "dur": 100, "args": {"correlation": 77}}]
    (tmp_path / "a.json").write_text(json.dumps(_trace(0, ev, "nccl")))
    with pytest.warns(ConvertWarning, match="no log"):
        job = holmes.read_job(convert_kineto(tmp_path / "a.json", tmp_path / "job"))
    o = job.ops(0).to_pylist()[0]
    assert o["end_source"] == "gpu_kernel" and o["end_ns"] == 10**18 + 140_000 and o["start_ns"] == 10**18 + 10_000
    kernel = {"ph": "X", "cat": "kernel", "name": "ncclKernel_Broadcast_RING_LL_Sum_int8_t", "pid": 0, "tid": 7,
              "ts": 50, "dur": 20, "args": {"Collective name": "broadcast", "In msg nelems": 8, "Out msg nelems": 8,
                                            "dtype": "Byte", "Group size": 2, "Process Group Name": "0",
                                            "Process Group Ranks": "[0, 1]", "Process Group Description": "default_pg"}}
    (tmp_path / "b.json").write_text(json.dumps(_trace(1, _steps(1) + [kernel], "nccl")))
    with pytest.warns(ConvertWarning, match="no log"):
        job = holmes.read_job(convert_kineto(tmp_path / "b.json", tmp_path / "job2"))
    o = job.ops(1).to_pylist()[0]
    assert (o["op"], o["nbytes"], o["end_ns"] - o["start_ns"]) == ("broadcast", 8, 20_000)


def test_broken_inputs_give_parse_errors(tmp_path):
    good = json.dumps(_trace(0, _steps(1) + [_rpc(10, "allreduce")]))
    (tmp_path / "trunc.json").write_text(good[: len(good) // 2])
    with pytest.raises(ParseError, match=r"trunc.json: not valid JSON \(truncated\?\)"):
        convert_kineto(tmp_path / "trunc.json", tmp_path / "j1")
    (tmp_path / "bad.json.gz").write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(ParseError, match="bad.json.gz: not a readable gzip"):
        convert_kineto(tmp_path / "bad.json.gz", tmp_path / "j2")
    (tmp_path / "half.json.gz").write_bytes(gzip.compress(good.encode())[:-20])
    with pytest.raises(ParseError, match="half.json.gz"):
        convert_kineto(tmp_path / "half.json.gz", tmp_path / "j3")
    (tmp_path / "other.json").write_text(json.dumps({"hello": []}))
    with pytest.raises(ParseError, match="other.json: not a PyTorch profiler trace"):
        convert_kineto(tmp_path / "other.json", tmp_path / "j4")
    (tmp_path / "nocomm.json").write_text(json.dumps(_trace(0, _steps(1))))
    with pytest.raises(ConvertError, match="no NCCL/Gloo communication operators"):
        convert_kineto(tmp_path / "nocomm.json", tmp_path / "j5")
    assert not any((tmp_path / f"j{i}").exists() for i in range(1, 6))
