"""The batch read path (``Job.iter_ranks`` / ``Job.iter_batches``, :mod:`holmes.io.batch`): the same
tables and the same consistency findings as reading rank by rank with ``Job.ops``, whatever the
mutation, the batch size or the columns asked for; typed errors for unusable ranks."""

from __future__ import annotations

import importlib.util
import random
import shutil
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from holmes.cli.main import main
from holmes.errors import ConfigError, MissingRankError, ParseError, SchemaError
from holmes.io import MemoryJob, check_ops, read_job
from holmes.io.consistency import check_ops_batch
from holmes.io.schema import OP_NAMES, ops_table

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("holmes_fuzz_bench_rf", REPO / "benchmarks" / "fuzz.py")
fuzz = importlib.util.module_from_spec(_spec)
assert _spec.loader is not None
sys.modules[_spec.name] = fuzz
_spec.loader.exec_module(fuzz)


@pytest.fixture(scope="module")
def base_job(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("readfast") / "job"
    assert main(["simulate", "--out", str(d), "--tp", "2", "--pp", "2", "--dp", "2", "--iterations", "5",
                 "--micro-batches", "2", "--quiet"]) == 0
    return d


@pytest.fixture
def job(base_job, tmp_path) -> Path:
    d = tmp_path / "J"
    shutil.copytree(base_job, d)
    return d


def _iterations_first(j) -> None:
    """Iteration files read before the ops: each is checked against its rank's ops when they are read."""
    for r in range(j.world_size):
        try:
            j.iterations(r)
        except (MissingRankError, ParseError, SchemaError):
            pass


def _by_ops(path: Path):
    j = read_job(path)
    _iterations_first(j)
    out = {}
    for r in range(j.world_size):
        try:
            out[r] = j.ops(r)
        except (MissingRankError, ParseError, SchemaError) as exc:
            out[r] = type(exc)
    return j, out


def _by_batches(path: Path, batch_size: int, columns=None):
    j = read_job(path)
    _iterations_first(j)
    out = {r: (t if e is None else type(e)) for r, t, e in
           j.iter_ranks(columns=columns, batch_size=batch_size, errors="skip")}
    return j, out


def _same_findings(a, b) -> None:
    assert a.consistency.inconsistencies == b.consistency.inconsistencies
    assert a.consistency.rows_read == b.consistency.rows_read
    assert a.consistency.rows_excluded == b.consistency.rows_excluded
    assert sorted(a.consistency.disagreements) == sorted(b.consistency.disagreements)


@pytest.mark.parametrize("name", sorted({**fuzz.SEMANTIC, **fuzz.CROSS}))
def test_batches_find_what_rank_by_rank_finds(job, name):
    rng = random.Random(7)
    mutate = {**fuzz.SEMANTIC, **fuzz.CROSS}[name]
    rank = 1
    assert mutate(job, rng, rank) is not None
    j1, t1 = _by_ops(job)
    assert j1.consistency.inconsistencies, f"{name}: nothing found"
    for bs in (3, 256):
        j2, t2 = _by_batches(job, bs)
        _same_findings(j1, j2)
        assert t1.keys() == t2.keys()
        for r in t1:
            assert t1[r].equals(t2[r]), (name, r)
        assert j2.stats.as_dict()["ranks_read"] == j1.stats.as_dict()["ranks_read"]


def test_columns_missing_and_unreadable_ranks(job):
    (job / "ranks" / "rank-00002.parquet").unlink()
    (job / "ranks" / "rank-00005.parquet").write_bytes(b"PAR1 not parquet")
    t = pq.read_table(job / "ranks" / "rank-00006.parquet")
    pq.write_table(t.drop_columns(["end_ns"]), job / "ranks" / "rank-00006.parquet")
    j, got = _by_batches(job, 4, columns=["seq", "end_ns"])
    assert got[2] is MissingRankError and got[5] is ParseError and got[6] is SchemaError
    assert got[0].column_names == ["seq", "end_ns"] and got[0].num_rows == read_job(job).ops(0).num_rows
    assert j.stats.as_dict()["ranks_read"] == 5
    with pytest.raises(MissingRankError, match="rank-00002.parquet"):
        list(read_job(job).iter_ranks())
    with pytest.raises(SchemaError, match="rank-00006.parquet.*end_ns"):
        list(read_job(job).iter_ranks(ranks=[6]))
    with pytest.raises(ConfigError):
        list(read_job(job).iter_ranks(errors="ignore"))


def test_batch_across_schemas_and_order(job):
    # one rank's strings plain instead of dictionary-encoded, one with an extra column
    p = job / "ranks" / "rank-00003.parquet"
    t = pq.read_table(p)
    t = t.cast(pa.schema([pa.field(f.name, f.type.value_type if pa.types.is_dictionary(f.type) else f.type)
                          for f in t.schema]))
    pq.write_table(t.append_column("extra", pa.array(np.arange(t.num_rows))), p)
    j1, t1 = _by_ops(job)
    j2 = read_job(job)
    order = [7, 3, 0, 5, 1, 6, 2, 4]
    batches = list(j2.iter_batches(order, batch_size=5))
    assert [b.ranks for b in batches] == [order[:5], order[5:]]
    for b in batches:
        for i, r in enumerate(b.ranks):
            assert b.rank_table(i).column("seq").equals(t1[r].column("seq"))
    assert "extra" in next(t for r, t, _ in j2.iter_ranks([3])).column_names
    _same_findings(j1, j2)


def test_memory_job_and_parts(job, tmp_path):
    j = read_job(job)
    mem = MemoryJob(j.meta, {r: j.ops(r) for r in range(j.world_size) if r != 4})
    got = {r: e for r, _, e in mem.iter_ranks(errors="skip")}
    assert isinstance(got[4], MissingRankError) and sum(e is None for e in got.values()) == 7
    # a live job's rank written in parts reads the same
    from holmes.io.parts import rank_parts_dirname, write_part

    t = pq.read_table(job / "ranks" / "rank-00001.parquet")
    (job / "ranks" / "rank-00001.parquet").unlink()
    d = job / "ranks" / rank_parts_dirname(1)
    write_part(d, 0, t.slice(0, t.num_rows // 2))
    write_part(d, 1, t.slice(t.num_rows // 2))
    (r, t1, err), = read_job(job).iter_ranks([1])
    assert err is None and t1.num_rows == t.num_rows


def _rand_table(rng: random.Random, rank: int, n: int) -> pa.Table:
    ops = [rng.choice(OP_NAMES) for _ in range(n)]
    st_ = [rng.randrange(0, 40) for _ in range(n)]
    t = ops_table(rank=[rank] * n, iteration=[rng.randrange(0, 3) for _ in range(n)],
                  op_index=[rng.randrange(0, 4) for _ in range(n)], comm_id=[rng.choice("abc") for _ in range(n)],
                  seq=[rng.randrange(0, 5) for _ in range(n)], op=ops,
                  peer=[rng.choice([None, 0, 1, 2, 3]) if o in ("send", "recv") or rng.random() < 0.1 else None
                        for o in ops],
                  nbytes=[8] * n, start_ns=st_, end_ns=[s + rng.randrange(-2, 8) for s in st_])
    if n and rng.random() < 0.3:
        t = pa.concat_tables([t, t.slice(0, rng.randrange(1, n + 1))])
    if rng.random() < 0.5:
        t = t.sort_by([("iteration", "ascending"), ("op_index", "ascending")])
    return t


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.integers(0, 2**32))
def test_check_ops_batch_is_check_ops_rank_by_rank(seed):
    rng = random.Random(seed)
    comms = {"a": (0, 1, 2), "b": (1, 2, 3), "c": (0, 3)}
    ts = [_rand_table(rng, r, rng.randrange(0, 15)) for r in range(4)]
    single = [check_ops(t, r, comms) for r, t in enumerate(ts)]
    kept, found = check_ops_batch(pa.concat_tables(ts), range(4), comms)
    assert kept.equals(pa.concat_tables([s[0] for s in single]))
    for r in range(4):
        assert found[r].messages == single[r][1].messages
        assert (found[r].rows_read, found[r].rows_excluded) == (single[r][1].rows_read, single[r][1].rows_excluded)


def test_job_source_stream_batches_accounts_like_stream(job):
    from holmes.localize.evidence.sources import JobSource

    (job / "ranks" / "rank-00003.parquet").unlink()
    src = JobSource(read_job(job))
    got = {r: t for b in src.stream_batches(columns=["seq"], batch_size=3) for r, t in b.tables.items()}
    assert sorted(got) == [0, 1, 2, 4, 5, 6, 7] and all(t.column_names == ["seq"] for t in got.values())
    assert src.ranks_read == sorted(got) and list(src.missing) == [3] and "rank-00003" in src.missing[3]
    ref = JobSource(read_job(job))
    for r in sorted(got):
        ref.stream(r)
    assert src.bytes_read == ref.bytes_read > 0
