"""CommOps schema v1 and job directories: reading, writing, and the errors on bad input."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import holmes
from holmes.errors import HolmesError, JobError, MissingRankError, ParseError, SchemaError
from holmes.io import JobWriter, MemoryJob, derive_iterations, ops_table, read_job, validate_ops, write_job


def _foreign_job(tmp_path: Path, world: int = 4, iters: int = 3, drop: str | None = None,
                 dictionary: bool = True) -> Path:
    """Write a schema-v1 job with plain pyarrow/json, as another program would (not Holmes' writer)."""
    job = tmp_path / "foreign"
    (job / "ranks").mkdir(parents=True)
    comms = {"dp-0": {"kind": "dp", "ranks": [0, 2]}, "dp-1": {"kind": "dp", "ranks": [1, 3]},
             "tp-0": {"kind": "tp", "ranks": [0, 1]}, "tp-1": {"kind": "tp", "ranks": [2, 3]}}
    (job / "job.json").write_text(json.dumps({"schema": "holmes.commops/1", "world_size": world,
                                               "communicators": comms}))
    for r in range(world):
        n = iters * 2
        cols = {
            "rank": pa.array([r] * n, pa.int64()),  # wider than v1's int32: must be accepted
            "iteration": pa.array(np.repeat(np.arange(iters), 2), pa.int64()),
            "op_index": pa.array([0, 1] * iters, pa.int64()),
            "comm_id": pa.array([f"tp-{r // 2}", f"dp-{r % 2}"] * iters),
            "seq": pa.array(np.repeat(np.arange(iters), 2), pa.int64()),
            "op": pa.array(["all_reduce", "reduce_scatter"] * iters),
            "peer": pa.array([None] * n, pa.int32()),
            "nbytes": pa.array([1024] * n, pa.int64()),
            "start_ns": pa.array(np.arange(n) * 100 + r, pa.int64()),
            "end_ns": pa.array(np.arange(n) * 100 + 50 + r, pa.int64()),
            "stream": pa.array(["s0"] * n),  # an extra column, kept
        }
        if dictionary:
            cols["comm_id"] = cols["comm_id"].dictionary_encode()
        if drop:
            cols.pop(drop)
        pq.write_table(pa.table(cols), job / "ranks" / f"rank-{r:05d}.parquet")
    return job


def test_read_foreign_job_returns_exactly_its_rows(tmp_path):
    job_dir = _foreign_job(tmp_path)
    job = holmes.read_job(job_dir)
    assert job.world_size == 4
    assert job.communicators["tp-1"].kind == "tp" and job.communicators["tp-1"].ranks == (2, 3)
    for r in range(4):
        raw = pq.read_table(job_dir / "ranks" / f"rank-{r:05d}.parquet")
        t = job.ops(r)
        assert t.num_rows == raw.num_rows
        assert t.column("start_ns").to_pylist() == raw.column("start_ns").to_pylist()
        assert t.column("comm_id").to_pylist() == raw.column("comm_id").to_pylist()
        assert t.column("stream").to_pylist() == ["s0"] * raw.num_rows  # extras kept
        assert t.schema.field("rank").type == pa.int32()
    assert job.stats.as_dict()["ranks_read"] == 4


def test_job_opens_without_reading_rank_files(tmp_path):
    job = holmes.read_job(_foreign_job(tmp_path))
    assert job.stats.files_read == 0
    job.ops(2)
    job.ops(2)
    assert job.stats.files_read == 1 and job.stats.ranks_read == {2}


def test_missing_end_ns_names_file_and_column(tmp_path):
    job = holmes.read_job(_foreign_job(tmp_path, drop="end_ns"))
    with pytest.raises(SchemaError) as ei:
        job.ops(1)
    assert "rank-00001.parquet" in str(ei.value) and "'end_ns'" in str(ei.value)
    assert isinstance(ei.value, HolmesError)


def test_wrong_column_type(tmp_path):
    job_dir = _foreign_job(tmp_path)
    p = job_dir / "ranks" / "rank-00000.parquet"
    t = pq.read_table(p)
    t = t.set_column(t.schema.get_field_index("start_ns"), "start_ns", pa.array([str(i) for i in range(t.num_rows)]))
    pq.write_table(t, p)
    with pytest.raises(SchemaError, match="'start_ns'.*string"):
        read_job(job_dir).ops(0)


def test_missing_rank_file(tmp_path):
    job_dir = _foreign_job(tmp_path)
    os.remove(job_dir / "ranks" / "rank-00003.parquet")
    job = read_job(job_dir)
    with pytest.raises(MissingRankError, match="rank-00003.parquet"):
        job.ops(3)
    assert job.available_ranks() == [0, 1, 2]


@pytest.mark.parametrize("mode", ["empty", "truncated", "garbage"])
def test_bad_parquet_files(tmp_path, mode):
    job_dir = _foreign_job(tmp_path)
    p = job_dir / "ranks" / "rank-00002.parquet"
    data = p.read_bytes()
    p.write_bytes({"empty": b"", "truncated": data[: len(data) // 2], "garbage": b"not parquet" * 10}[mode])
    before = p.read_bytes()
    with pytest.raises(ParseError, match="rank-00002.parquet"):
        read_job(job_dir).ops(2)
    assert p.read_bytes() == before  # never modified


def test_rank_outside_world_size(tmp_path):
    job = read_job(_foreign_job(tmp_path))
    with pytest.raises(JobError, match="outside world_size"):
        job.ops(4)
    job_dir = tmp_path / "foreign"
    t = pq.read_table(job_dir / "ranks" / "rank-00001.parquet")
    t = t.set_column(t.schema.get_field_index("peer"), "peer", pa.array([9] * t.num_rows, pa.int32()))
    pq.write_table(t, job_dir / "ranks" / "rank-00001.parquet")
    with pytest.raises(SchemaError, match="'peer'.*9.*world_size 4"):
        job.ops(1)


def test_comm_id_absent_from_job_json(tmp_path):
    job_dir = _foreign_job(tmp_path)
    meta = json.loads((job_dir / "job.json").read_text())
    del meta["communicators"]["dp-1"]
    (job_dir / "job.json").write_text(json.dumps(meta))
    with pytest.raises(SchemaError, match="dp-1.*absent from job.json"):
        read_job(job_dir).ops(1)


@pytest.mark.parametrize("content,match", [
    ("{not json", "not valid JSON"),
    ('{"schema": "holmes.commops/1", "world_size": 2, "communicators": {}, "colour": 1}', "colour: unknown key"),
    ('{"schema": "holmes.commops/1", "world_size": 2, "communicators": {"x": {"kind": "zz", "ranks": [0]}}}', "communicators.x.kind"),
    ('{"schema": "holmes.commops/1", "world_size": 2, "communicators": {"x": {"kind": "dp", "ranks": [0, 5]}}}', "outside world_size"),
    ('{"schema": "holmes.commops/1", "world_size": 2}', "needs 'communicators' or 'parallel'"),
])
def test_bad_job_json(tmp_path, content, match):
    (tmp_path / "j").mkdir()
    (tmp_path / "j" / "job.json").write_text(content)
    with pytest.raises(JobError, match=match) as ei:
        read_job(tmp_path / "j")
    assert "job.json" in str(ei.value)


def test_not_a_job_directory(tmp_path):
    with pytest.raises(JobError, match="not a job directory"):
        read_job(tmp_path / "nope")
    with pytest.raises(JobError, match="job.json: file not found"):
        read_job(tmp_path)


def test_writer_refuses_non_empty_directory(tmp_path):
    (tmp_path / "user.txt").write_text("keep me")
    with pytest.raises(JobError, match="not empty"):
        JobWriter(tmp_path, {"world_size": 1, "communicators": {"a": {"kind": "other", "ranks": [0]}}})
    with pytest.raises(JobError, match="not a job directory"):
        JobWriter(tmp_path, {"world_size": 1, "communicators": {"a": {"kind": "other", "ranks": [0]}}}, overwrite=True)
    assert (tmp_path / "user.txt").read_text() == "keep me"


def test_derived_iterations_when_absent(tmp_path):
    job = read_job(_foreign_job(tmp_path))
    assert not job.has_iterations
    it, dur = job.iteration_times(0)
    assert it.tolist() == [0, 1, 2]
    # ends are at 150, 350, 550 (+rank); first starts at 0
    assert dur.tolist() == [150, 200, 200]


_names = st.sampled_from(["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send", "recv"])


@st.composite
def _tables(draw):
    n = draw(st.integers(0, 40))
    rank = draw(st.integers(0, 7))
    ops = draw(st.lists(_names, min_size=n, max_size=n))
    starts = sorted(draw(st.lists(st.integers(0, 2**50), min_size=n, max_size=n)))  # issue order = start order
    durs = draw(st.lists(st.integers(0, 2**30), min_size=n, max_size=n))
    peers = [draw(st.integers(0, 7).filter(lambda p: p != rank)) if o in ("send", "recv") else None for o in ops]
    extra = draw(st.lists(st.floats(allow_nan=False, width=32), min_size=n, max_size=n))
    return rank, ops_table(
        rank=[rank] * n, iteration=[i // 5 for i in range(n)], op_index=[i % 5 for i in range(n)],
        comm_id=[draw(st.sampled_from(["tp-0", "dp-0", "pp-0"])) for _ in range(n)],
        seq=list(range(n)), op=ops, peer=peers, nbytes=draw(st.lists(st.integers(0, 2**40), min_size=n, max_size=n)),
        start_ns=starts, end_ns=[s + d for s, d in zip(starts, durs)], score=pa.array(extra, pa.float32()),
    )


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_tables())
def test_schema_round_trip(tmp_path_factory, rt):
    rank, table = rt
    d = tmp_path_factory.mktemp("rt") / "job"
    comms = {c: {"kind": c.split("-")[0], "ranks": list(range(8))} for c in ("tp-0", "dp-0", "pp-0")}
    write_job(d, {"world_size": 8, "communicators": comms}, {rank: table})
    back = read_job(d).ops(rank)
    assert back.num_rows == table.num_rows
    for name in table.column_names:
        assert back.column(name).to_pylist() == table.column(name).to_pylist(), name
    mem = MemoryJob({"world_size": 8, "communicators": comms}, {rank: table})
    assert mem.ops(rank).equals(back)


def test_validate_rejects_unknown_op_and_reversed_times():
    t = ops_table(rank=[0], iteration=[0], op_index=[0], comm_id=["a"], seq=[0], op=["allreduce"], peer=[None],
                  nbytes=[1], start_ns=[0], end_ns=[1])
    with pytest.raises(SchemaError, match="unknown operator"):
        validate_ops(t, "f.parquet")
    t = ops_table(rank=[0], iteration=[0], op_index=[0], comm_id=["a"], seq=[0], op=["barrier"], peer=[None],
                  nbytes=[1], start_ns=[5], end_ns=[1])
    with pytest.raises(SchemaError, match="before 'start_ns'"):
        validate_ops(t)


def test_derive_iterations_empty():
    t = ops_table(rank=[], iteration=[], op_index=[], comm_id=[], seq=[], op=[], peer=[], nbytes=[], start_ns=[], end_ns=[])
    assert derive_iterations(t).num_rows == 0
