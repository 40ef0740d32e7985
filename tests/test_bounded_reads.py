"""Issue #39 item 3: every file Holmes reads goes through a capped reader -- regular files only,
rows per rank, string lengths and decoded sizes capped, each raisable by an environment variable."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import holmes
from holmes.errors import HolmesError
from holmes.io.capped_parquet import read_parquet_capped
from holmes.limits import LimitError
from holmes.simulate import simulate
from holmes.topology.cluster import ClusterTopology

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def base_job(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("bounded") / "job"
    simulate(d, tp=2, pp=2, dp=1, iterations=6, micro_batches=2, seed=0)
    return d


@pytest.fixture
def job(base_job, tmp_path) -> Path:
    d = tmp_path / "J"
    shutil.copytree(base_job, d)
    return d


def _cli(*argv, timeout=120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "holmes", *map(str, argv)], env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_topology_on_a_fifo_or_dev_zero_is_refused(job, tmp_path, kind):
    if kind == "fifo":
        src = tmp_path / "topo.fifo"
        os.mkfifo(src)
    else:
        src = Path("/dev/zero")
        if not src.exists():
            pytest.skip("no /dev/zero")
    p = _cli("localize", job, "--topology", src)  # a blocking read would hit the timeout
    assert p.returncode == 2, p.stderr
    assert "not a regular file" in p.stderr and str(src) in p.stderr and len(p.stderr.strip().splitlines()) == 1
    with pytest.raises(HolmesError, match="not a regular file"):
        ClusterTopology.load(src)


def _rank(job: Path, r: int) -> Path:
    return job / "ranks" / f"rank-{r:05d}.parquet"


def test_rows_beyond_the_cap_are_refused_from_the_footer(job, monkeypatch):
    n = pq.read_metadata(_rank(job, 1)).num_rows
    monkeypatch.setenv("HOLMES_MAX_ROWS_PER_RANK", str(n - 1))
    with pytest.raises(LimitError, match=rf"{n} rows exceed the cap of {n - 1} rows per rank .*HOLMES_MAX_ROWS_PER_RANK"):
        holmes.read_job(job).ops(1)
    monkeypatch.setenv("HOLMES_MAX_ROWS_PER_RANK", str(n))
    assert holmes.read_job(job).ops(1).num_rows == n


def test_rows_of_all_parts_count_together(tmp_path, monkeypatch):
    from holmes.simulate.writer import write_result
    from holmes.simulate.simulator import run_simulation

    d = write_result(run_simulation(tp=2, pp=1, dp=1, iterations=6, seed=0), tmp_path / "p", parts=2)
    total = holmes.read_job(d).ops(0).num_rows
    monkeypatch.setenv("HOLMES_MAX_ROWS_PER_RANK", str(total - 1))  # every part is under it
    with pytest.raises(LimitError, match="HOLMES_MAX_ROWS_PER_RANK"):
        holmes.read_job(d).ops(0)


def _long_comm_ids(job: Path, r: int, length: int, rows: int = 2000) -> None:
    t = pq.read_table(_rank(job, r)).take(np.zeros(rows, np.int64))
    ids = pa.DictionaryArray.from_arrays(pa.array(np.zeros(rows, np.int32)), pa.array(["c" * length]))
    t = t.set_column(t.schema.get_field_index("comm_id"), "comm_id", ids.cast(pa.string()))
    pq.write_table(t, _rank(job, r), compression="zstd")  # dictionary-encoded: a few kB on disk


def test_a_long_communicator_id_is_refused_before_decoding(job, monkeypatch):
    _long_comm_ids(job, 1, 100_000)
    assert _rank(job, 1).stat().st_size < 100_000  # 200 MB once decoded
    with pytest.raises(LimitError, match="column 'comm_id' holds a string of 100000 bytes.*HOLMES_MAX_STRING_BYTES"):
        holmes.read_job(job).ops(1)
    p = _cli("localize", job, "--format", "json")
    assert p.returncode == 0 and "HOLMES_MAX_STRING_BYTES" in p.stdout  # the rank is named unreadable
    monkeypatch.setenv("HOLMES_MAX_STRING_BYTES", "200000")
    monkeypatch.setenv("HOLMES_MAX_RANK_BYTES", str(100_000 * 1000))
    with pytest.raises(LimitError, match="string columns decode to more than the cap.*HOLMES_MAX_RANK_BYTES"):
        read_parquet_capped(_rank(job, 1))
    monkeypatch.setenv("HOLMES_MAX_RANK_BYTES", str(100_000 * 2000))
    assert read_parquet_capped(_rank(job, 1), columns=["comm_id"]).column("comm_id")[0].as_py() == "c" * 100_000


def test_the_checked_path_reads_the_same_table(job, monkeypatch):
    plain = pq.read_table(_rank(job, 0))
    monkeypatch.setenv("HOLMES_MAX_STRING_BYTES", "8")  # every string chunk is checked value by value
    with pytest.raises(LimitError, match="column 'op' holds a string of 1[04] bytes"):  # all_reduce, all_gather ...
        read_parquet_capped(_rank(job, 0))
    monkeypatch.setenv("HOLMES_MAX_STRING_BYTES", "64")  # chunks are larger: checked, and within the cap
    got = read_parquet_capped(_rank(job, 0))
    assert got.equals(plain) and got.schema == plain.schema


def test_a_parquet_fifo_is_refused(job):
    p = _rank(job, 1)
    p.unlink()
    os.mkfifo(p)
    with pytest.raises(HolmesError):
        read_parquet_capped(p)


def test_a_rank_over_a_cap_makes_no_healthy_verdict(job, monkeypatch, capsys):
    import json as _json

    from holmes.cli.main import main

    _long_comm_ids(job, 1, 100_000)
    assert main(["localize", str(job), "--format", "json"]) == 0
    rep = _json.loads(capsys.readouterr().out)
    assert rep["verdict"] == "inconclusive"
    assert any("HOLMES_MAX_STRING_BYTES" in a for a in rep["assumptions"]) or "HOLMES_MAX_STRING_BYTES" in str(rep)


def test_error_lines_stay_short(job, monkeypatch):
    monkeypatch.setenv("HOLMES_MAX_STRING_BYTES", "200000")
    _long_comm_ids(job, 1, 100_000, rows=10)
    with pytest.raises(HolmesError) as e:
        holmes.read_job(job).ops(1)
    assert len(str(e.value)) < 400 and "absent from job.json" in str(e.value)


def test_one_reader_checks_every_file_whole(job):
    """CappedReader plans a schema once; a hostile file after good ones of the same schema (and one
    whose strings are written as dictionaries) is still refused, naming that file."""
    from holmes.io.capped_parquet import CappedReader

    reader = CappedReader()
    good = [reader.read(_rank(job, r)) for r in (0, 2, 3)]
    assert all(t.equals(pq.read_table(_rank(job, r))) for t, r in zip(good, (0, 2, 3)))
    _long_comm_ids(job, 1, 100_000)
    with pytest.raises(LimitError, match=rf"{_rank(job, 1)}: column 'comm_id' holds a string of 100000 bytes"):
        reader.read(_rank(job, 1))
    assert reader.read(_rank(job, 0), columns=["seq", "op"]).column_names == ["seq", "op"]
    assert reader.read(_rank(job, 2)).equals(good[1])  # a plan for other columns: planned again


def test_a_hostile_rank_in_a_batch_is_named_and_the_others_read(job):
    _long_comm_ids(job, 1, 100_000)
    got = {r.rank: r for r in holmes.read_job(job).iter_ranks(errors="skip")}
    assert isinstance(got[1].error, LimitError) and str(_rank(job, 1)) in str(got[1].error)
    assert all(got[r].error is None and got[r].table.num_rows for r in (0, 2, 3))
