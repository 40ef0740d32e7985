"""The framework-free parts of holmes.logger: CommOpsRecorder and finalize_job (no torch needed)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import holmes
from holmes.errors import ConfigError, JobError
from holmes.logger import CommOpsRecorder, finalize_job


def test_import_does_not_need_torch():
    code = "import sys, holmes, holmes.logger; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _rows(path):
    return pq.read_table(path).to_pydict()


def test_seq_and_op_index_follow_the_schema(tmp_path):
    rec = CommOpsRecorder(tmp_path, rank=1, world_size=4)
    rec.add_communicator("tp-0", [0, 1], kind="tp")
    rec.add_communicator("pp-0", [1, 3], kind="pp")
    for it in range(2):
        rec.step(it)
        rec.record("tp-0", "all_reduce", nbytes=8, start_ns=10, end_ns=20)
        rec.record("pp-0", "send", peer=3, nbytes=4, start_ns=20, end_ns=30)
        rec.record("pp-0", "recv", peer=3, nbytes=4, start_ns=30, end_ns=40)
        rec.record("pp-0", "send", peer=3, nbytes=4, start_ns=40, end_ns=50)
        rec.record("tp-0", "all_reduce", nbytes=8, start_ns=50, end_ns=60)
    rec.close()
    t = _rows(tmp_path / "ranks" / "rank-00001.parquet")
    assert t["seq"] == [0, 0, 0, 1, 1, 2, 2, 1, 3, 3]
    assert t["op_index"] == [0, 1, 2, 3, 4] * 2
    assert t["iteration"] == [0] * 5 + [1] * 5
    assert t["peer"] == [None, 3, 3, 3, None] * 2
    assert set(t["rank"]) == {1}


def test_flush_is_bounded_and_appends_row_groups(tmp_path):
    rec = CommOpsRecorder(tmp_path, rank=0, flush_every=3)
    rec.add_communicator("dp-0", [0, 1], kind="dp")
    for i in range(10):
        rec.record("dp-0", "all_reduce", nbytes=1, start_ns=i, end_ns=i + 1)
        assert rec.buffered <= 3
    assert rec.rows_written == 9
    assert not (tmp_path / "ranks" / "rank-00000.parquet").exists()  # only the partial file so far
    rec.close()
    f = pq.ParquetFile(tmp_path / "ranks" / "rank-00000.parquet")
    assert f.metadata.num_rows == 10 and f.metadata.num_row_groups == 4
    assert not list((tmp_path / "ranks").glob(".*partial"))


def test_pending_ops_survive_a_flush_and_finish_later(tmp_path):
    rec = CommOpsRecorder(tmp_path, rank=0, flush_every=2)
    rec.add_communicator("dp-0", [0, 1], kind="dp")
    h = rec.begin("dp-0", "all_reduce", nbytes=4, start_ns=100)
    for i in range(5):  # forces flushes while h is still running
        rec.record("dp-0", "broadcast", start_ns=200 + i, end_ns=210 + i)
    h.finish(end_ns=500)
    h.finish(end_ns=900)  # ignored
    rec.close()
    t = _rows(tmp_path / "ranks" / "rank-00000.parquet")
    i = t["op"].index("all_reduce")
    assert (t["start_ns"][i], t["end_ns"][i], t["op_index"][i], t["seq"][i]) == (100, 500, 0, 0)
    assert sorted(t["op_index"]) == list(range(6))


def test_resolver_and_poll_are_used_at_flush(tmp_path):
    rec = CommOpsRecorder(tmp_path, rank=0, flush_every=8)
    rec.add_communicator("dp-0", [0, 1], kind="dp")
    h1 = rec.begin("dp-0", "all_reduce", start_ns=5)
    h1.resolver = lambda final: (7, 70)
    h2 = rec.begin("dp-0", "all_reduce", start_ns=6)
    h2.poll = lambda: False
    rec.flush()
    assert rec.rows_written == 1 and rec.buffered == 1
    rec.close()  # h2 never completed: closed at close time
    t = _rows(tmp_path / "ranks" / "rank-00000.parquet")
    assert (t["start_ns"][0], t["end_ns"][0]) == (7, 70)
    assert t["end_ns"][1] >= t["start_ns"][1] == 6


def test_step_marks_write_iterations(tmp_path):
    rec = CommOpsRecorder(tmp_path, rank=0)
    rec.add_communicator("dp-0", [0, 1], kind="dp")
    rec.record("dp-0", "broadcast", start_ns=50, end_ns=60)  # before the first mark: iteration 0
    rec.step(0, now_ns=100)
    rec.record("dp-0", "all_reduce", start_ns=110, end_ns=120)
    assert rec.step(now_ns=200) == 1
    rec.record("dp-0", "all_reduce", start_ns=210, end_ns=220)
    rec.step(5, now_ns=300)  # iteration 5 has no op: not written
    rec.step(now_ns=400)
    rec.close(end_iteration=False)
    it = _rows(tmp_path / "iterations" / "rank-00000.parquet")
    assert it["iteration"] == [0, 1] and it["start_ns"] == [50, 200] and it["end_ns"] == [200, 300]
    t = _rows(tmp_path / "ranks" / "rank-00000.parquet")
    assert t["iteration"] == [0, 0, 1] and t["op_index"] == [0, 1, 0]


def test_bad_arguments_raise_config_error(tmp_path):
    with pytest.raises(ConfigError, match="flush_every"):
        CommOpsRecorder(tmp_path, rank=0, flush_every=0)
    with pytest.raises(ConfigError, match="outside world_size"):
        CommOpsRecorder(tmp_path, rank=4, world_size=4)
    rec = CommOpsRecorder(tmp_path, rank=0)
    with pytest.raises(ConfigError, match="unknown operator 'allreduce'"):
        rec.record("x", "allreduce", start_ns=0, end_ns=1)
    with pytest.raises(ConfigError, match="kind 'data'"):
        rec.add_communicator("x", [0], kind="data")



@pytest.mark.parametrize("flush_every", [1, 100])
def test_first_iteration_start_and_extreme_values_survive_the_packed_rows(tmp_path, flush_every):
    rec = CommOpsRecorder(tmp_path, rank=0, flush_every=flush_every, start_iteration=-3)
    rec.add_communicator("dp-0", [0, 1], kind="dp")
    rec.record("dp-0", "all_reduce", start_ns=70, end_ns=80)  # before the first mark
    rec.record("dp-0", "send", peer=1, nbytes=2**40, start_ns=50, end_ns=90)  # the earliest start
    rec.step(-3, now_ns=100)  # names the open iteration: it started with its earliest operator
    rec.record("dp-0", "all_reduce", start_ns=110, end_ns=120)
    rec.step(2**31 - 1, now_ns=200)
    rec.record("dp-0", "recv", peer=70000, start_ns=210, end_ns=220)
    with pytest.raises(ConfigError, match="outside"):
        rec.step(2**31)
    rec.close(end_iteration=False)
    it = _rows(tmp_path / "iterations" / "rank-00000.parquet")
    assert it["iteration"] == [-3] and it["start_ns"] == [50] and it["end_ns"] == [200]
    t = _rows(tmp_path / "ranks" / "rank-00000.parquet")
    assert t["iteration"] == [-3, -3, -3, 2**31 - 1] and t["op_index"] == [0, 1, 2, 0]
    assert t["seq"] == [0, 0, 1, 0] and t["peer"] == [None, 1, None, 70000]
    assert t["op"] == ["all_reduce", "send", "all_reduce", "recv"] and t["nbytes"][1] == 2**40

def _capture(tmp_path, world=2, rows=3):
    for r in range(world):
        rec = CommOpsRecorder(tmp_path, rank=r, world_size=world, flush_every=2)
        rec.add_communicator("dp-0", list(range(world)), kind="dp")
        for it in range(rows):
            rec.step(it, now_ns=1000 * it)
            rec.record("dp-0", "all_reduce", nbytes=16, start_ns=1000 * it + 10 * r, end_ns=1000 * it + 500)
        rec.close()


def test_finalize_job_writes_a_readable_job(tmp_path):
    _capture(tmp_path)
    path = finalize_job(tmp_path, parallel={"dp": 2}, name="two")
    meta = json.loads(path.read_text())
    assert meta["world_size"] == 2 and meta["communicators"]["dp-0"] == {"kind": "dp", "ranks": [0, 1]}
    job = holmes.read_job(tmp_path)
    assert job.ops(1).num_rows == 3
    its, durs = job.iteration_times(0)
    assert its.tolist() == [0, 1, 2] and durs[:2].tolist() == [1000, 1000]


def test_finalize_job_errors_name_what_is_missing(tmp_path):
    with pytest.raises(JobError, match="no rank sidecar"):
        finalize_job(tmp_path)
    _capture(tmp_path, world=2)
    with pytest.raises(JobError, match=r"rank\(s\) \[2, 3\] missing"):
        finalize_job(tmp_path, world_size=4, timeout=0.1)
    side = tmp_path / "comms" / "rank-00001.json"
    d = json.loads(side.read_text())
    d["communicators"]["dp-0"]["ranks"] = [1, 2]
    side.write_text(json.dumps(d))
    with pytest.raises(JobError, match="communicator 'dp-0'"):
        finalize_job(tmp_path)


def test_empty_rank_gives_valid_empty_file(tmp_path):
    CommOpsRecorder(tmp_path, rank=0, world_size=1).close()
    finalize_job(tmp_path, communicators={"dp-0": {"kind": "dp", "ranks": [0]}})
    assert holmes.read_job(tmp_path).ops(0).num_rows == 0


_OPS = st.lists(st.tuples(st.sampled_from(["a", "b"]), st.sampled_from(["all_reduce", "send", "recv"]),
                          st.integers(1, 3), st.booleans()), min_size=1, max_size=60)


@settings(max_examples=40, deadline=None)
@given(ops=_OPS, flush_every=st.integers(1, 7))
def test_written_rows_do_not_depend_on_flush_size(tmp_path_factory, ops, flush_every):
    d = tmp_path_factory.mktemp("rec")
    rec = CommOpsRecorder(d, rank=0, flush_every=flush_every)
    handles = []
    for i, (comm, op, peer, step) in enumerate(ops):
        if step:
            rec.step()
        p = peer if op != "all_reduce" else None
        if i % 3 == 0:
            handles.append((rec.begin(comm, op, peer=p, start_ns=i), i))
        else:
            rec.record(comm, op, peer=p, start_ns=i, end_ns=i + 1)
    for h, i in handles:
        h.finish(end_ns=i + 1)
    rec.close()
    t = pq.read_table(d / "ranks" / "rank-00000.parquet").sort_by("start_ns").to_pydict()
    assert t["start_ns"] == list(range(len(ops)))
    assert all(e == s + 1 for s, e in zip(t["start_ns"], t["end_ns"]))
    counts: dict = {}
    for (comm, op, peer, _), seq in zip(ops, t["seq"]):
        key = (comm,) if op == "all_reduce" else (comm, op, peer)
        assert seq == counts.get(key, 0)
        counts[key] = seq + 1
    it = np.array(t["iteration"])
    assert np.all(np.diff(it) >= 0)
    for k in np.unique(it):
        assert sorted(np.array(t["op_index"])[it == k].tolist()) == list(range(int((it == k).sum())))
