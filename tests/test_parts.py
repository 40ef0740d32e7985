"""A rank's log written in parts (holmes.io.parts): discovery, reading, and every reader accepting both layouts."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import holmes
from holmes.errors import MissingRankError
from holmes.io.parts import (TruncatedPartError, has_rank_log, list_parts, locate_rank_log, part_iterations,
                             read_rank_parts, write_part)
from holmes.io.schema import ops_table
from holmes.simulate import run_simulation
from holmes.simulate.writer import write_result


def _table(iters, rank=0):
    n = len(iters)
    return ops_table(rank=[rank] * n, iteration=list(iters), op_index=[0] * n, comm_id=["dp-0"] * n,
                     seq=list(range(n)), op=["all_reduce"] * n, peer=[None] * n, nbytes=[4] * n,
                     start_ns=[10 * i for i in iters], end_ns=[10 * i + 5 for i in iters])


@pytest.fixture(scope="module")
def sim():
    return run_simulation(tp=2, pp=2, dp=2, iterations=12, seed=3, faults=["gpu:5@spike:8*3"])


def test_parts_job_reads_like_single_files(sim, tmp_path):
    a = write_result(sim, tmp_path / "single")
    b = write_result(sim, tmp_path / "parts", parts=5)
    assert sorted(os.listdir(b / "ranks" / "rank-00003")) == ["part-000000.parquet", "part-000001.parquet",
                                                             "part-000002.parquet"]
    ja, jb = holmes.read_job(a), holmes.read_job(b)
    assert jb.available_ranks() == list(range(8)) and jb.has_rank(7)
    for r in (0, 5):
        assert ja.ops(r).drop_columns(["comm_id", "op"]).equals(jb.ops(r).drop_columns(["comm_id", "op"]))
        assert ja.ops(r).column("comm_id").to_pylist() == jb.ops(r).column("comm_id").to_pylist()
    assert jb.stats.files_read == 6  # 3 parts of 2 ranks
    ra, rb = holmes.localize(a, detector="robust"), holmes.localize(b, detector="robust")
    assert ra.to_json()["devices"] == rb.to_json()["devices"]
    assert ra.irregular_iterations == rb.irregular_iterations == [8]


def test_temporaries_ignored_and_missing_rank(tmp_path):
    d = tmp_path / "ranks" / "rank-00000"
    write_part(d, 0, _table([0, 1]))
    (d / ".part-000001.parquet.partial").write_bytes(b"PAR1 half")
    assert [p.index for p in list_parts(d)] == [0]
    assert locate_rank_log(tmp_path / "ranks", 0) == d
    assert not has_rank_log(locate_rank_log(tmp_path / "ranks", 1))
    (tmp_path / "ranks" / "rank-00001").mkdir()  # a rank that has not landed a part yet
    assert not has_rank_log(tmp_path / "ranks" / "rank-00001")
    with pytest.raises(MissingRankError, match="rank 1 has no complete part"):
        read_rank_parts(tmp_path / "ranks" / "rank-00001", 1)


def test_truncated_part_raises_or_is_skipped(tmp_path):
    d = tmp_path / "rank-00002"
    write_part(d, 0, _table([0, 1], rank=2))
    p1 = write_part(d, 1, _table([2, 3], rank=2))
    write_part(d, 2, _table([4], rank=2))
    p1.write_bytes(p1.read_bytes()[: p1.stat().st_size // 2])
    with pytest.raises(TruncatedPartError, match=r"part-000001\.parquet: part of rank 2"):
        read_rank_parts(d, 2)
    got = read_rank_parts(d, 2, on_truncated="skip")
    assert got.table.column("iteration").to_pylist() == [0, 1, 4]
    assert len(got.findings) == 1 and "part-000001" in got.findings[0]


def test_job_names_truncated_part(sim, tmp_path):
    b = write_result(sim, tmp_path / "parts", parts=4)
    p = b / "ranks" / "rank-00002" / "part-000001.parquet"
    p.write_bytes(p.read_bytes()[:100])
    with pytest.raises(holmes.ParseError, match="part-000001.parquet: part of rank 2"):
        holmes.read_job(b).ops(2)
    missing = holmes.localize(b, detector="robust", analysis="persistent").missing
    assert list(missing) == [2] and "part-000001.parquet" in missing[2]


def test_state_column_of_a_dump_part(tmp_path):
    d = tmp_path / "rank-00000"
    write_part(d, 0, _table([0]))
    dumped = _table([1]).append_column("state", pa.array(["started"], pa.string()))
    write_part(d, 1, dumped)
    t = read_rank_parts(d, 0).table
    assert t.column("state").to_pylist() == ["completed", "started"]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=6))
def test_any_split_reads_back_whole(tmp_path_factory, sizes):
    d = tmp_path_factory.mktemp("p") / "rank-00000"
    iters = list(range(sum(sizes)))
    pos = 0
    for k, n in enumerate(sizes):
        write_part(d, k, _table(iters[pos:pos + n]))
        assert part_iterations(d / f"part-{k:06d}.parquet") == (pos, pos + n - 1)
        pos += n
    assert read_rank_parts(d, 0).table.column("iteration").to_pylist() == iters
    assert read_rank_parts(d, 0, min_iteration=2).table.column("iteration").to_pylist() == iters[2:]


def test_simulate_cli_parts(tmp_path):
    from holmes.cli.main import main

    out = tmp_path / "job"
    assert main(["simulate", "--out", str(out), "--tp", "2", "--pp", "1", "--dp", "2", "--iterations", "6",
                 "--parts", "4", "--quiet"]) == 0
    assert [p.index for p in list_parts(out / "ranks" / "rank-00001")] == [0, 1]
    assert holmes.read_job(out).ops(1).column("iteration").to_pylist()[-1] == 5
    assert main(["simulate", "--out", str(tmp_path / "j2"), "--tp", "2", "--pp", "1", "--dp", "1",
                 "--parts", "0"]) == 2
    _ = pq
