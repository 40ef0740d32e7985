"""Job I/O contract: files written by another program, laziness, read-only input, and the
``holmes`` CLI's one-line exit-2 contract on corrupt job directories."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import holmes
from holmes.errors import ParseError, SchemaError

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "fixtures"
V1 = ["rank", "iteration", "op_index", "comm_id", "seq", "op", "peer", "nbytes", "start_ns", "end_ns"]


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _raw_job(root: Path, world: int = 3, iters: int = 4, *, shuffle: bool = True) -> tuple[Path, dict[int, pa.Table]]:
    """A schema-v1 job written with raw pyarrow + json only: unsorted rows, several row groups,
    unsigned and narrower integer types, large_string, an extra column."""
    rng = np.random.default_rng(0)
    job = root / "raw"
    (job / "ranks").mkdir(parents=True)
    comms = {"world": {"kind": "other", "ranks": list(range(world))},
             "pp": {"kind": "pp", "ranks": [0, 1]}}
    (job / "job.json").write_text(json.dumps({"schema": "holmes.commops/1", "world_size": world,
                                              "communicators": comms}))
    written = {}
    for r in range(world):
        rows = []
        for it in range(iters):
            rows.append(dict(iteration=it, op_index=0, comm_id="world", seq=it, op="all_reduce", peer=None))
            if r in (0, 1):
                rows.append(dict(iteration=it, op_index=1, comm_id="pp", seq=it, op="send" if r == 0 else "recv",
                                 peer=1 - r))
        n = len(rows)
        start = np.cumsum(rng.integers(1_000, 5_000, n)).astype(np.int64) + 10**18
        end = start + rng.integers(0, 900, n)
        t = pa.table({
            "rank": pa.array([r] * n, pa.uint8()),
            "iteration": pa.array([x["iteration"] for x in rows], pa.uint32()),
            "op_index": pa.array([x["op_index"] for x in rows], pa.int16()),
            "comm_id": pa.array([x["comm_id"] for x in rows], pa.large_string()),
            "seq": pa.array([x["seq"] for x in rows], pa.int32()),
            "op": pa.array([x["op"] for x in rows], pa.string()),
            "peer": pa.array([x["peer"] for x in rows], pa.int64()),
            "nbytes": pa.array(rng.integers(0, 2**40, n), pa.uint64()),
            "start_ns": pa.array(start, pa.int64()),
            "end_ns": pa.array(end, pa.int64()),
            "note": pa.array([f"row{i}" for i in range(n)]),
        })
        if shuffle:
            t = t.take(pa.array(rng.permutation(n)))
        pq.write_table(t, job / "ranks" / f"rank-{r:05d}.parquet", row_group_size=3)
        written[r] = t
    return job, written


def _rows(t: pa.Table, cols) -> list[tuple]:
    d = {c: t.column(c).to_pylist() for c in cols}
    return sorted(zip(*(d[c] for c in cols)), key=lambda x: (x[1], x[2]))


def test_raw_pyarrow_job_returns_exactly_its_rows_all_columns(tmp_path):
    job_dir, written = _raw_job(tmp_path)
    job = holmes.read_job(job_dir)
    for r, raw in written.items():
        got = job.ops(r)
        assert got.num_rows == raw.num_rows
        assert got.column_names[:10] == V1 and "note" in got.column_names
        assert _rows(got, V1 + ["note"]) == _rows(raw, V1 + ["note"])
        # returned sorted by (iteration, op_index), v1 types
        key = list(zip(got.column("iteration").to_pylist(), got.column("op_index").to_pylist()))
        assert key == sorted(key)
        assert got.schema.field("rank").type == pa.int32() and got.schema.field("nbytes").type == pa.int64()


def test_reading_never_modifies_user_files_even_read_only(tmp_path):
    job_dir, _ = _raw_job(tmp_path)
    before = _digest(job_dir)
    mtimes = {p: p.stat().st_mtime_ns for p in job_dir.rglob("*")}
    for p in list(job_dir.rglob("*")) + [job_dir]:
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    try:
        job = holmes.read_job(job_dir)
        for r in range(job.world_size):
            job.ops(r)
            job.iterations(r)
            job.iteration_times(r)
        assert holmes.localize(job_dir, pivot=0) is not None
    finally:
        for p in list(job_dir.rglob("*")) + [job_dir]:
            p.chmod(p.stat().st_mode | stat.S_IWUSR)
    assert _digest(job_dir) == before
    assert {p: p.stat().st_mtime_ns for p in job_dir.rglob("*")} == mtimes
    assert sorted(os.listdir(job_dir)) == ["job.json", "ranks"]  # nothing added (no cache files)


def test_ten_thousand_rank_job_opens_instantly_and_reads_lazily(tmp_path):
    world = 10_000
    job_dir = tmp_path / "big"
    (job_dir / "ranks").mkdir(parents=True)
    (job_dir / "job.json").write_text(json.dumps({"world_size": world, "parallel": {"tp": 8, "dp": 125, "pp": 10}}))
    src, _ = _raw_job(tmp_path / "src", world=3)
    t = pq.read_table(src / "ranks" / "rank-00002.parquet")
    t = t.set_column(0, "rank", pa.array([9_999] * t.num_rows, pa.int32()))
    t = t.set_column(t.schema.get_field_index("comm_id"), "comm_id", pa.array(["tp-1249"] * t.num_rows))
    t = t.set_column(t.schema.get_field_index("peer"), "peer", pa.nulls(t.num_rows, pa.int32()))
    t = t.set_column(t.schema.get_field_index("op"), "op", pa.array(["all_reduce"] * t.num_rows))
    pq.write_table(t, job_dir / "ranks" / "rank-09999.parquet")
    t0 = time.perf_counter()
    job = holmes.read_job(job_dir)
    opened = time.perf_counter() - t0
    assert opened < 0.5 and job.stats.files_read == 0 and job.world_size == world
    assert job.ops(9_999).num_rows == t.num_rows
    assert job.stats.files_read == 1 and job.stats.ranks_read == {9_999}


def test_corrupt_iterations_file_is_a_typed_error_naming_it(tmp_path):
    job_dir = tmp_path / "j"
    shutil.copytree(FIXTURES / "gpu16-clean", job_dir)
    p = job_dir / "iterations" / "rank-00003.parquet"
    p.write_bytes(p.read_bytes()[:64])
    with pytest.raises(ParseError, match="iterations/rank-00003.parquet"):
        holmes.read_job(job_dir).iterations(3)
    t = pq.read_table(FIXTURES / "gpu16-clean" / "iterations" / "rank-00004.parquet").drop_columns(["end_ns"])
    pq.write_table(t, job_dir / "iterations" / "rank-00004.parquet")
    with pytest.raises(SchemaError, match="rank-00004.parquet.*'end_ns'"):
        holmes.read_job(job_dir).iterations(4)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "holmes", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=300)


def _one_line_exit_2(p: subprocess.CompletedProcess, *needles: str) -> None:
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert "Traceback" not in p.stderr and p.stderr.count("\n") == 1, p.stderr
    for n in needles:
        assert n in p.stderr, p.stderr


@pytest.mark.parametrize("mode", ["truncated", "empty", "no_end_ns", "missing"])
def test_cli_localize_corrupt_pivot_rank_exit_2_one_line(tmp_path, mode):
    job_dir = tmp_path / "j"
    shutil.copytree(FIXTURES / "gpu16-clean", job_dir)
    p = job_dir / "ranks" / "rank-00000.parquet"
    if mode == "truncated":
        p.write_bytes(p.read_bytes()[:300])
    elif mode == "empty":
        p.write_bytes(b"")
    elif mode == "no_end_ns":
        pq.write_table(pq.read_table(p).drop_columns(["end_ns"]), p)
    else:
        p.unlink()
    _one_line_exit_2(_cli("localize", str(job_dir), "--pivot", "0"), "rank-00000.parquet")


def test_cli_localize_corrupt_pivot_iterations_names_the_file(tmp_path):
    """The pivot's iterations/ file is corrupt: exit 2, and the one line says which file."""
    job_dir = tmp_path / "j"
    shutil.copytree(FIXTURES / "gpu16-clean", job_dir)
    p = job_dir / "iterations" / "rank-00000.parquet"
    p.write_bytes(p.read_bytes()[:100])
    _one_line_exit_2(_cli("localize", str(job_dir), "--pivot", "0"), "iterations/rank-00000.parquet")
    # the Python API raises the typed error itself, not a JobError that hides it
    with pytest.raises(ParseError, match="iterations/rank-00000.parquet"):
        holmes.localize(job_dir, pivot=0)


@pytest.mark.parametrize("args,needle", [
    (["localize", "/nonexistent-audit"], "not a job directory"),
    (["localize", str(FIXTURES / "gpu16-clean"), "--pivot", "999"], "999"),
    (["convert", "--from", "kineto", "/nonexistent-audit", "/tmp/holmes-audit-never"], "/nonexistent-audit"),
])
def test_cli_bad_input_exit_2_one_line(args, needle):
    _one_line_exit_2(_cli(*args), needle)


def test_help_lists_design_subcommands():
    p = _cli("--help")
    assert p.returncode == 0
    for sub in ("localize", "simulate", "detect", "convert", "train"):
        assert sub in p.stdout
