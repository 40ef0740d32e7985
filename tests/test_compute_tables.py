"""The optional compute tables (``compute/rank-NNNNN.parquet``): writing, reading, and the errors on bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import holmes
from holmes.errors import ParseError, SchemaError
from holmes.limits import LimitError
from holmes.io import MemoryJob, compute_table, ops_table, validate_compute, write_job

META = {"world_size": 2, "communicators": {"dp-0": {"kind": "dp", "ranks": [0, 1]}}}


def _ops(r: int, iters: int = 2) -> pa.Table:
    return ops_table(rank=[r] * iters, iteration=list(range(iters)), op_index=[0] * iters, comm_id=["dp-0"] * iters,
                     seq=list(range(iters)), op=["all_reduce"] * iters, peer=[None] * iters, nbytes=[8] * iters,
                     start_ns=[100 + 1000 * i for i in range(iters)], end_ns=[200 + 1000 * i for i in range(iters)])


def _compute(r: int) -> pa.Table:
    # written out of order on purpose: the reader sorts by (iteration, start_ns)
    return compute_table(rank=[r] * 3, iteration=[1, 0, 0], name=["forward", "backward", "forward"],
                         start_ns=[1010, 50, 10], end_ns=[1090, 95, 45], mb_id=[0, 0, 0])


def _foreign(tmp_path: Path, compute: dict[str, pa.Array]) -> Path:
    """A job whose rank 1 compute file another program wrote (plain pyarrow), with ``compute``'s columns."""
    d = tmp_path / "job"
    write_job(d, META, {r: _ops(r) for r in (0, 1)}, compute={0: _compute(0)})
    pq.write_table(pa.table(compute), d / "compute" / "rank-00001.parquet")
    return d


def test_compute_tables_round_trip_sorted_with_extras(tmp_path):
    d = write_job(tmp_path / "job", META, {r: _ops(r) for r in (0, 1)}, compute={0: _compute(0)})
    job = holmes.read_job(d)
    assert job.has_compute
    t = job.compute(0)
    assert t.schema.field("rank").type == pa.int32() and t.schema.field("start_ns").type == pa.int64()
    assert t.column("iteration").to_pylist() == [0, 0, 1]
    assert t.column("start_ns").to_pylist() == [10, 50, 1010]
    assert t.column("name").to_pylist() == ["forward", "backward", "forward"]
    assert "mb_id" in t.column_names
    assert job.compute(1) is None          # a rank without a table: the gaps are used
    assert job.compute(0) is t             # cached
    # a job without compute/ at all
    d2 = write_job(tmp_path / "plain", META, {r: _ops(r) for r in (0, 1)})
    assert not holmes.read_job(d2).has_compute and holmes.read_job(d2).compute(0) is None


def test_memory_job_compute_is_validated_on_read():
    job = MemoryJob(META, {r: _ops(r) for r in (0, 1)}, compute={1: _compute(1)})
    assert job.has_compute and job.compute(0) is None
    assert job.compute(1).column("start_ns").to_pylist() == [10, 50, 1010]
    bad = MemoryJob(META, {r: _ops(r) for r in (0, 1)}, compute={1: _compute(0)})
    with pytest.raises(SchemaError, match=r"compute of rank 1: column 'rank' holds 3 row\(s\) of another rank"):
        bad.compute(1)


def _good_columns(r: int = 1) -> dict[str, pa.Array]:
    return {"rank": pa.array([r, r], pa.int64()), "iteration": pa.array([0, 0], pa.int32()),
            "name": pa.array(["f", "b"]).dictionary_encode(), "start_ns": pa.array([0, 10], pa.int64()),
            "end_ns": pa.array([5, 20], pa.int64())}


def test_foreign_compute_file_with_wider_and_dictionary_columns_is_accepted(tmp_path):
    job = holmes.read_job(_foreign(tmp_path, _good_columns()))
    t = job.compute(1)
    assert t.schema.field("rank").type == pa.int32() and t.schema.field("iteration").type == pa.int64()
    assert t.column("name").cast(pa.string()).to_pylist() == ["f", "b"]


@pytest.mark.parametrize("column, values, message", [
    ("start_ns", pa.array([0.0, 10.0]), r"column 'start_ns' has type double, expected int64"),
    ("name", pa.array([1, 2]), r"column 'name' has type int64, expected string"),
    ("iteration", pa.array(["0", "1"]), r"column 'iteration' has type string, expected int64"),
    ("end_ns", pa.array([5, None], pa.int64()), r"column 'end_ns' has 1 null value"),
    ("end_ns", pa.array([5, 3], pa.int64()), r"column 'end_ns' is before 'start_ns' in 1 row"),
    ("rank", pa.array([0, 0], pa.int32()), r"column 'rank' holds 2 row\(s\) of another rank than 1"),
])
def test_bad_column_is_a_schema_error_naming_file_and_column(tmp_path, column, values, message):
    cols = _good_columns()
    cols[column] = values
    job = holmes.read_job(_foreign(tmp_path, cols))
    with pytest.raises(SchemaError, match=r"compute[/\\]rank-00001\.parquet: " + message):
        job.compute(1)
    assert job.compute(0).num_rows == 3     # the other rank's table stays readable


def test_missing_column_is_named(tmp_path):
    cols = _good_columns()
    del cols["name"]
    with pytest.raises(SchemaError, match=r"rank-00001\.parquet: missing required column\(s\) 'name'"):
        holmes.read_job(_foreign(tmp_path, cols)).compute(1)


def test_unreadable_compute_files_are_parse_errors(tmp_path, monkeypatch):
    d = _foreign(tmp_path, _good_columns())
    p = d / "compute" / "rank-00001.parquet"
    raw = p.read_bytes()
    p.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ParseError, match=r"rank-00001\.parquet: not a readable parquet file"):
        holmes.read_job(d).compute(1)
    p.write_bytes(b"")
    with pytest.raises(ParseError, match="empty file"):
        holmes.read_job(d).compute(1)
    p.write_bytes(raw)
    monkeypatch.setenv("HOLMES_MAX_TRACE_BYTES", str(len(raw) - 1))
    with pytest.raises(LimitError, match="compute table is larger than the cap"):
        holmes.read_job(d).compute(1)


def test_writer_refuses_a_bad_compute_table(tmp_path):
    from holmes.io import JobWriter

    with JobWriter(tmp_path / "job", META) as w:
        with pytest.raises(SchemaError, match="compute of rank 0: column 'end_ns' is before 'start_ns'"):
            w.write_compute(0, compute_table(rank=[0], iteration=[0], name=["f"], start_ns=[9], end_ns=[1]))
        for r in (0, 1):
            w.write_ops(r, _ops(r))
    assert not (tmp_path / "job" / "compute").exists()


def test_validate_compute_keeps_a_sorted_table_as_is():
    t = compute_table(rank=np.zeros(4, np.int32), iteration=[0, 0, 1, 1], name=["a"] * 4,
                      start_ns=[0, 5, 0, 3], end_ns=[1, 6, 2, 4])
    assert validate_compute(t) is t
    assert json.dumps(validate_compute(t.slice(0, 0)).schema.names) == json.dumps(t.schema.names)
