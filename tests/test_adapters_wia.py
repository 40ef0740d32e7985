"""WIA converter on the real ByteDance trace (DP2 x PP4, 32 steps) and on broken inputs."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import holmes
from holmes.adapters import ConvertWarning, convert_wia
from holmes.errors import ConvertError, ParseError


@pytest.fixture(scope="module")
def wia(tmp_path_factory):
    from conftest import SHARED_DATA

    src = SHARED_DATA / "wia"
    if not (src / "trace-ST.parquet").is_file():
        pytest.skip(f"real WIA trace not present at {src}")
    out = tmp_path_factory.mktemp("wia") / "job"
    with pytest.warns(ConvertWarning, match="nbytes = 0"):
        convert_wia(src, out)
    return src, holmes.read_job(out)


def test_real_trace_groups_and_iterations(wia):
    src, job = wia
    assert job.world_size == 8 and job.available_ranks() == list(range(8))
    c = job.communicators
    assert c["pp-0"].ranks == (0, 2, 4, 6) and c["pp-0"].kind == "pp"
    assert c["dp-3"].ranks == (6, 7) and c["dp-3"].kind == "dp" and c["emb-1"].ranks == (1, 7)
    steps = json.loads((src / "result-ST.json").read_text())["step_t_base"]
    for r in (0, 7):
        it, dur = job.iteration_times(r)
        assert len(it) == 32
        # the step times laid out by the converter are the analyzer's own step times
        for i, d in zip(it.tolist(), dur.tolist()):
            assert abs(d / 1e9 - steps[str(i)]) < 1e-5
    s = job.meta.source
    assert s.details["compute"] == {"forward-compute": 1024, "backward-compute": 1024, "optimizer": 256, "gc": 256}
    assert "dropped_compute" not in s.details
    # the gradient-norm synchronisation before the optimizer step: an all-reduce over every rank
    assert c["world"].ranks == tuple(range(8)) and c["world"].kind == "other"
    clip = [o for o in job.ops(3).to_pylist() if o["wia_optype"] == "optimizer-clip-main-grad"]
    assert len(clip) == 32 and {o["op"] for o in clip} == {"all_reduce"} and {o["comm_id"] for o in clip} == {"world"}


def test_real_trace_compute_tables_hold_every_compute_op(wia):
    src, job = wia
    raw = pq.read_table(src / "trace-ST.parquet")
    assert job.has_compute
    for r in range(8):
        c = job.compute(r)
        mine = raw.filter(pc.equal(raw.column("rank"), r))
        names = mine.column("optype").cast(pa.string()).to_pylist()
        want = sorted(n for n in names if n.endswith("-compute") or n in ("optimizer", "gc"))
        assert sorted(c.column("name").to_pylist()) == want
        # durations kept to the nanosecond, on the operators' clock: each record lies inside its iteration
        dur = (np.asarray(c.column("end_ns")) - np.asarray(c.column("start_ns"))) / 1e9
        raw_dur = np.sort(np.asarray(mine.filter(pc.is_in(mine.column("optype").cast(pa.string()),
                                                          value_set=pa.array(sorted(set(want))))).column("duration")))
        assert np.allclose(np.sort(dur), raw_dur, atol=2e-9)
        its = job.iterations(r)
        lo = dict(zip(its.column("iteration").to_pylist(), its.column("start_ns").to_pylist()))
        hi = dict(zip(its.column("iteration").to_pylist(), its.column("end_ns").to_pylist()))
        for i, s, e in zip(*(c.column(k).to_pylist() for k in ("iteration", "start_ns", "end_ns"))):
            assert lo[i] <= s <= e <= hi[i] + 1   # 1 ns: rounding seconds to ns


def test_real_trace_p2p_pairs_match(wia):
    _, job = wia
    sends, recvs = {}, {}
    for r in range(8):
        for o in job.ops(r).to_pylist():
            if o["op"] == "send":
                sends[(o["comm_id"], r, o["peer"], o["seq"])] = o
            elif o["op"] == "recv":
                recvs[(o["comm_id"], o["peer"], r, o["seq"])] = o
    assert len(sends) == 768 * 2 and set(sends) == set(recvs)
    for k, o in sends.items():
        stage_from, stage_to = k[1] // 2, k[2] // 2
        assert abs(stage_from - stage_to) == 1 and k[1] % 2 == k[2] % 2  # adjacent stages, same dp rank
        assert recvs[k]["iteration"] == o["iteration"]
        direction = "forward" if stage_to > stage_from else "backward"
        assert o["wia_optype"] == f"{direction}-send" and recvs[k]["wia_optype"] == f"{direction}-recv"


def test_broken_wia_inputs(tmp_path, shared_data):
    src = tmp_path / "wia"
    src.mkdir()
    shutil.copy(shared_data / "wia" / "meta-ST.yaml", src)
    t = pq.read_table(shared_data / "wia" / "trace-ST.parquet")
    pq.write_table(t.drop_columns(["seq_id"]), src / "trace-ST.parquet")
    with pytest.raises(ConvertError, match=r"missing column\(s\) \['seq_id'\]"):
        convert_wia(src, tmp_path / "j1")
    data = (shared_data / "wia" / "trace-ST.parquet").read_bytes()
    (src / "trace-ST.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(ParseError, match="trace-ST.parquet: not a readable parquet"):
        convert_wia(src, tmp_path / "j2")
    (src / "trace-ST.parquet").write_bytes(data)
    (src / "meta-ST.yaml").write_text("dp_size: [unclosed\n")
    with pytest.raises(ParseError, match="meta-ST.yaml"):
        convert_wia(src, tmp_path / "j3")
    (src / "meta-ST.yaml").write_text("dp_size: 1\npp_size: 4\nworld_size: 4\n")
    with pytest.raises(ConvertError, match="outside the meta sizes"):
        convert_wia(src, tmp_path / "j4")


def test_send_recv_recorded_but_never_launched_are_dropped(wia, tmp_path):
    # WIA's profiler may record P2P ops the schedule never launched ("type 1 no-ops"): a receive after
    # the rank's last compute of its direction, a send before its first. Injected on the middle stages,
    # they would leave the pairs unmatched; dropped, the job is the plain trace's.
    src, job = wia
    t = pq.read_table(src / "trace-ST.parquet")
    t = t.cast(pa.schema([f if f.name != "optype" else pa.field("optype", pa.string()) for f in t.schema]))
    extra = []
    mid = pc.is_in(t.column("stage"), value_set=pa.array([1, 2], t.schema.field("stage").type))
    for row in t.filter(pc.and_(mid, pc.equal(t.column("optype"), "optimizer"))).to_pylist():  # one per rank and step
        extra.append(dict(row, optype="forward-recv", start_ts=row["start_ts"] + row["duration"] + 1e-4,
                          duration=1e-5, seq_id=99))
        extra.append(dict(row, optype="backward-send", start_ts=0.0, duration=1e-5, seq_id=99))
    d = tmp_path / "noop"
    d.mkdir()
    pq.write_table(pa.concat_tables([t, pa.Table.from_pylist(extra, schema=t.schema)]), d / "trace-NO.parquet")
    shutil.copy(src / "meta-ST.yaml", d / "meta-NO.yaml")
    with pytest.warns(ConvertWarning) as rec:
        convert_wia(d / "trace-NO.parquet", tmp_path / "job")
    assert any("256 send/recv row(s) recorded but never launched" in str(w.message) for w in rec)
    got = holmes.read_job(tmp_path / "job")
    assert got.meta.source.details["p2p_noops"] == 256
    for r in range(8):
        a, b = got.ops(r), job.ops(r)
        assert a.num_rows == b.num_rows
        for c in ("op", "peer", "seq", "start_ns", "end_ns", "wia_optype"):
            assert a.column(c).to_pylist() == b.column(c).to_pylist()
