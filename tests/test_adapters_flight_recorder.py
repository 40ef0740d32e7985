"""Flight Recorder converter: the real 16-rank Megatron dumps and small synthetic dumps."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from pathlib import Path

import pytest

import holmes
from holmes.adapters import ConvertWarning, convert_flight_recorder
from holmes.adapters.safe_pickle import safe_load
from holmes.errors import ConvertError, MissingRankError, ParseError

FR = "flight_recorder/gpu_error_1st"


@pytest.fixture(scope="module")
def fr_job(tmp_path_factory):
    from conftest import SHARED_DATA

    src = SHARED_DATA / FR
    if not src.is_dir():
        pytest.skip(f"real Flight Recorder dumps not present at {src}")
    out = tmp_path_factory.mktemp("fr") / "job"
    with pytest.warns(ConvertWarning, match="no completion time"):
        convert_flight_recorder(src, out)
    return src, holmes.read_job(out)


def _tree_digest(d: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(d.iterdir()):
        h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()


def test_real_dumps_world_groups_and_peers(fr_job):
    src, job = fr_job
    assert job.world_size == 16
    assert job.available_ranks() == list(range(16))
    # every pg_config entry of every dump is a communicator with the same ranks, kind and name
    expected = {}
    for r in range(16):
        for key, g in safe_load(src / f"_dump_{r}")["pg_config"].items():
            expected[key] = (sorted(json.loads(g["ranks"])), g["desc"])
    by_name = {}
    for cid, c in job.meta.communicators.items():
        by_name[cid.split("-", 1)[1]] = c
    assert set(by_name) == set(expected)
    for key, (ranks, desc) in expected.items():
        assert by_name[key].ranks == ranks and by_name[key].name == desc
    assert job.communicators["pp-43"].kind == "pp" and job.communicators["pp-43"].ranks == (0, 4, 8, 12)
    assert job.communicators["tp-41"].kind == "tp" and job.communicators["dp-7"].kind == "dp"
    assert job.communicators["ep-74"].kind == "ep" and job.communicators["other-0"].kind == "other"
    # 'nccl:recv 3<-0' on rank 12 in [0, 4, 8, 12]: the peer is global rank 0
    t12 = job.ops(12).to_pylist()
    assert [(o["op"], o["peer"]) for o in t12 if o["op"] in ("send", "recv")] == [
        ("recv", 0), ("send", 8), ("recv", 8), ("send", 0)]
    for r in range(16):
        t = job.ops(r)
        assert set(t.column("state").to_pylist()) == {"scheduled"}
        assert t.column("end_known").to_pylist() == [False] * t.num_rows
        for o in t.to_pylist():
            if o["op"] in ("send", "recv"):
                assert o["peer"] in job.communicators[o["comm_id"]].ranks and o["peer"] != r


def test_real_dumps_seq_and_source_info(fr_job):
    src, job = fr_job
    raw = safe_load(src / "_dump_12")["entries"]
    t = job.ops(12)
    coll = [e["collective_seq_id"] for e in raw if not e["is_p2p"]]
    assert [o["seq"] for o in t.to_pylist() if o["op"] not in ("send", "recv")] == coll
    # the same collective (comm, seq) has the same op on every member that logged it
    seen = {}
    for r in range(16):
        for o in job.ops(r).to_pylist():
            if o["op"] not in ("send", "recv"):
                assert seen.setdefault((o["comm_id"], o["seq"]), o["op"]) == o["op"]
    s = job.meta.source
    assert s.format == "flight-recorder" and s.details["fr_versions"] == ["2.9"]
    assert any("iteration 0" in w for w in s.warnings)
    assert any("fault_injection.log" in m for m in s.inferred)


def _entry(rid, pg, desc, name, cseq, pseq, t, *, p2p=False, done=True, sizes=((4, 8),), dtype="Float"):
    return {"record_id": rid, "pg_id": int(pg), "process_group": (pg, desc), "collective_seq_id": cseq,
            "p2p_seq_id": pseq, "op_id": rid, "profiling_name": name, "time_created_ns": t,
            "input_sizes": [list(s) for s in sizes], "input_dtypes": [dtype] * len(sizes),
            "output_sizes": [list(s) for s in sizes], "output_dtypes": [dtype] * len(sizes),
            "state": "completed" if done else "scheduled", "time_discovered_started_ns": t + 10 if done else None,
            "time_discovered_completed_ns": t + 500 if done else None, "duration_ms": None, "retired": done,
            "timeout_ms": 1000, "is_p2p": p2p}


def _synthetic_dumps(d: Path, *, as_json: bool, iters: int = 3, prefix: str = "gloo") -> None:
    """2 ranks; group '1' = [1, 0] (reversed) carries P2P 'send 1->0' from rank 0 (local 1) to rank 1."""
    pg = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"},
          "1": {"name": "1", "desc": "PIPELINE_MODEL_PARALLEL_GROUP", "ranks": "[1, 0]"}}
    for r in (0, 1):
        entries, t = [], 1_000_000 + r * 7
        for i in range(iters):
            entries.append(_entry(3 * i, "0", "default_pg", f"{prefix}:allreduce", 2 * i, 0, t))
            if r == 0:
                entries.append(_entry(3 * i + 1, "1", "PIPELINE_MODEL_PARALLEL_GROUP", f"{prefix}:send 1->0", 0, i, t + 1000, p2p=True))
            else:
                entries.append(_entry(3 * i + 1, "1", "PIPELINE_MODEL_PARALLEL_GROUP", f"{prefix}:recv 0<-1", 0, i, t + 900, p2p=True))
            entries.append(_entry(3 * i + 2, "0", "default_pg", f"{prefix}:_allgather_base", 2 * i + 1, 0, t + 2000,
                                  done=(i < iters - 1), dtype="BFloat16"))
            t += 1_000_000
        dump = {"version": "2.4", "pg_config": pg, "pg_status": {}, "entries": entries}
        if as_json:
            dump["entries"] = [dict(e, process_group=list(e["process_group"])) for e in entries]
            (d / f"rank_{r}.json").write_text(json.dumps(dump))
        else:
            (d / f"_dump_{r}").write_bytes(pickle.dumps(dump))


@pytest.mark.parametrize("as_json", [False, True])
def test_synthetic_dumps_timing_peers_iterations(tmp_path, as_json):
    src = tmp_path / "src"
    src.mkdir()
    _synthetic_dumps(src, as_json=as_json)
    before = _tree_digest(src)
    with pytest.warns(ConvertWarning, match="no completion time"):
        job = holmes.read_job(convert_flight_recorder(src, tmp_path / "job"))
    assert _tree_digest(src) == before
    t0, t1 = job.ops(0).to_pylist(), job.ops(1).to_pylist()
    sends = [o for o in t0 if o["op"] == "send"]
    recvs = [o for o in t1 if o["op"] == "recv"]
    assert [o["peer"] for o in sends] == [1, 1, 1] and [o["peer"] for o in recvs] == [0, 0, 0]
    assert [o["seq"] for o in sends] == [o["seq"] for o in recvs] == [0, 1, 2]
    assert [o["iteration"] for o in sends] == [0, 1, 2] and [o["iteration"] for o in recvs] == [0, 1, 2]
    ar = t0[0]
    assert ar["op"] == "all_reduce" and ar["end_ns"] - ar["start_ns"] == 500 and ar["nbytes"] == 128
    ag = [o for o in t0 if o["op"] == "all_gather"]
    assert ag[-1]["end_ns"] is None and ag[-1]["state"] == "scheduled" and ag[0]["nbytes"] == 64
    assert job.communicators["pp-1"].kind == "pp"
    assert any("period" in m for m in job.meta.source.inferred)


def test_missing_rank_is_warned_and_job_still_reads(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    _synthetic_dumps(src, as_json=False)
    (src / "_dump_1").unlink()
    with pytest.warns(ConvertWarning, match=r"1 of 2 rank\(s\) have no log: \[1\]"):
        job = holmes.read_job(convert_flight_recorder(src, tmp_path / "job"))
    assert job.ops(0).num_rows == 9
    with pytest.raises(MissingRankError):
        job.ops(1)


def test_malicious_dump_gives_typed_error_and_runs_nothing(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    _synthetic_dumps(src, as_json=False)
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    (src / "_dump_1").write_bytes(pickle.dumps({"version": "2.9", "pg_config": {}, "entries": [Evil()]}))
    with pytest.raises(ParseError, match=r"_dump_1: refusing to unpickle global"):
        convert_flight_recorder(src, tmp_path / "job")
    assert not marker.exists() and not (tmp_path / "job").exists()


def test_truncated_and_foreign_dumps(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    _synthetic_dumps(src, as_json=False)
    data = (src / "_dump_1").read_bytes()
    (src / "_dump_1").write_bytes(data[: len(data) // 2])
    with pytest.raises(ParseError, match="_dump_1: not a readable pickle"):
        convert_flight_recorder(src, tmp_path / "job")
    (src / "_dump_1").write_bytes(pickle.dumps({"hello": 1}))
    with pytest.raises(ParseError, match="_dump_1: not a Flight Recorder dump"):
        convert_flight_recorder(src, tmp_path / "job")


def test_inconsistent_groups_and_non_empty_output(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    _synthetic_dumps(src, as_json=False)
    before = _tree_digest(src)
    out = tmp_path / "job"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ConvertError, match="not empty"):
        convert_flight_recorder(src, out)
    assert (out / "notes.txt").read_text() == "mine"
    assert _tree_digest(src) == before
    d = safe_load(src / "_dump_1")
    d["pg_config"]["1"]["ranks"] = "[0]"
    (src / "_dump_1").write_bytes(pickle.dumps(d))
    with pytest.raises(ConvertError, match="process group '1'"):
        convert_flight_recorder(src, tmp_path / "job2")
