"""Issue #39 item 2 and #37's permissions: ``--overwrite`` replaces only a directory Holmes wrote,
and everything Holmes writes gets the umask's permissions.

Each reproducer runs the real command (CLI in-process, or the Python API) and asserts the user's
files are byte-identical afterwards.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest

import holmes
from holmes.adapters import convert
from holmes.simulate import simulate
from holmes.cli.main import main
from holmes.errors import HolmesError
from holmes.io import JobWriter, ops_table, read_job
from holmes.io.outputs import (OutputError, atomic_write_text, is_job_dir, not_a_job_reason,
                               replace_file_text, staged_directory)

REPO = Path(__file__).resolve().parents[1]
INSPECTOR = REPO / "tests" / "data" / "nccl_inspector"
META = {"world_size": 2, "communicators": {"dp-0": {"kind": "dp", "ranks": [0, 1]}}}


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir")
            for p in sorted(root.rglob("*"))}


def _ops(r: int):
    return ops_table(rank=[r], iteration=[0], op_index=[0], comm_id=["dp-0"], seq=[0], op=["all_reduce"],
                     peer=[None], nbytes=[4], start_ns=[0], end_ns=[9])


def _write(path: Path, overwrite: bool = False) -> Path:
    with JobWriter(path, META, overwrite=overwrite) as w:
        for r in (0, 1):
            w.write_ops(r, _ops(r))
    return path


def _cli(capsys, *argv) -> tuple[int, str]:
    rc = main([str(a) for a in argv])
    return rc, capsys.readouterr().err


def _simulate(out: Path, *extra: str) -> list[str]:
    return ["simulate", "--out", str(out), "--tp", "2", "--pp", "1", "--dp", "1", "--iterations", "3",
            "--micro-batches", "1", "--quiet", *extra]


def _fake_job(d: Path, *, job_json: str | None = '{"world_size": 2}', empty_ranks: bool = False) -> Path:
    d.mkdir()
    if job_json is not None:
        (d / "job.json").write_text(job_json)
    if empty_ranks:
        (d / "ranks").mkdir()
    (d / "thesis.tex").write_text("three years of work")
    return d


@pytest.mark.parametrize("case", ["job.json", "holmes job.json", "empty ranks"])
def test_simulate_overwrite_refuses_a_directory_with_user_files(tmp_path, capsys, case):
    schema = '{"schema": "holmes.commops/1", "world_size": 2}'
    d = _fake_job(tmp_path / "d", job_json=None if case == "empty ranks" else
                  (schema if case == "holmes job.json" else '{"world_size": 2}'), empty_ranks=case == "empty ranks")
    before = _tree(d)
    rc, err = _cli(capsys, *_simulate(d, "--overwrite"))
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1 and str(d) in err and "not a job directory" in err, err
    assert "thesis.tex" in err  # names what it would have deleted
    assert _tree(d) == before
    assert not list(tmp_path.glob(".holmes-tmp-*"))


def test_convert_overwrite_refuses_a_directory_with_user_files(tmp_path, capsys):
    d = _fake_job(tmp_path / "d")
    before = _tree(d)
    rc, err = _cli(capsys, "convert", "--from", "nccl-inspector", INSPECTOR, d, "--overwrite", "-q")
    assert rc == 2 and str(d) in err and "thesis.tex" in err, err
    assert _tree(d) == before


def test_python_api_refuses_a_directory_with_user_files(tmp_path):
    d = _fake_job(tmp_path / "d", empty_ranks=True)
    before = _tree(d)
    with pytest.raises(HolmesError, match="thesis.tex"):
        JobWriter(d, META, overwrite=True)
    with pytest.raises(HolmesError, match="thesis.tex"):
        simulate(d, tp=2, iterations=2, micro_batches=1, overwrite=True)
    with pytest.raises(HolmesError, match="thesis.tex"):
        convert("nccl-inspector", INSPECTOR, d, overwrite=True)
    with pytest.raises(OutputError, match="thesis.tex"):
        with staged_directory(d, overwrite=True):
            pass
    assert _tree(d) == before


def test_a_user_file_inside_ranks_or_a_link_is_refused(tmp_path):
    d = _write(tmp_path / "j")
    (d / "ranks" / "README").write_text("mine")
    assert not_a_job_reason(d) == "it holds ranks/README, which Holmes does not write"
    (d / "ranks" / "README").unlink()
    assert is_job_dir(d)
    (tmp_path / "elsewhere").write_text("x")
    (d / "truth.json").symlink_to(tmp_path / "elsewhere")
    assert "truth.json" in not_a_job_reason(d)


def test_file_added_while_the_job_is_written_is_not_deleted(tmp_path):
    d = _write(tmp_path / "j")
    w = JobWriter(d, META, overwrite=True)
    w.write_ops(0, _ops(0))
    (d / "notes.md").write_text("added meanwhile")
    with pytest.raises(OutputError, match="notes.md"):
        w.close()
    assert (d / "notes.md").read_text() == "added meanwhile"
    assert not list(tmp_path.glob(".holmes-tmp-*"))


def test_a_holmes_job_is_replaced(tmp_path, capsys):
    d = tmp_path / "J"
    rc, err = _cli(capsys, *_simulate(d))
    assert rc == 0, err
    assert {p.name for p in d.iterdir()} >= {"job.json", "ranks", "iterations", "topology.json", "truth.json"}
    assert is_job_dir(d)
    rc, err = _cli(capsys, "convert", "--from", "nccl-inspector", INSPECTOR, d, "--overwrite", "-q")
    assert rc == 0, err
    assert "truth.json" not in {p.name for p in d.iterdir()}  # swapped whole
    rc, err = _cli(capsys, *_simulate(d, "--overwrite"))
    assert rc == 0, err
    assert read_job(d).world_size == 2
    _write(d, overwrite=True)  # the Python API too
    assert read_job(d).ops(1).num_rows == 1
    (d / "ranks").mkdir(exist_ok=True)
    empty = tmp_path / "E"
    (empty / "ranks").mkdir(parents=True)  # nothing to lose: accepted
    _write(empty, overwrite=True)
    assert read_job(empty).world_size == 2


def test_a_logger_job_is_replaced(tmp_path):
    from holmes.logger import CommOpsRecorder, finalize_job

    d = tmp_path / "cap"
    for r in (0, 1):
        rec = CommOpsRecorder(d, rank=r, world_size=2)
        rec.add_communicator("dp-0", [0, 1], kind="dp")
        rec.record("dp-0", "all_reduce", nbytes=8, start_ns=0, end_ns=5)
        rec.close()
    finalize_job(d)
    assert not_a_job_reason(d) is None, sorted(str(p.relative_to(d)) for p in d.rglob("*"))
    _write(d, overwrite=True)
    assert sorted(p.name for p in d.iterdir()) == ["job.json", "ranks"]


# ------------------------------------------------------------------ permissions (#37 item 3)


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def test_every_writer_gives_the_umask_permissions(tmp_path, capsys, umask_022):
    j = tmp_path / "J"
    assert main(_simulate(j)) == 0
    c = tmp_path / "C"
    assert main(["convert", "--from", "nccl-inspector", str(INSPECTOR), str(c), "-q"]) == 0
    w = _write(tmp_path / "W")
    html = tmp_path / "r.html"
    assert main(["report", str(j), "-o", str(html)]) == 0
    det = tmp_path / "d.parquet"
    assert main(["detect", str(j), "--ranks", "0", "--out", str(det)]) == 0
    txt = atomic_write_text(tmp_path / "a.txt", "x")
    capsys.readouterr()
    checked = 0
    for root in (j, c, w):
        assert _mode(root) == 0o755, root
        for p in root.rglob("*"):
            assert _mode(p) == (0o755 if p.is_dir() else 0o644), (p, oct(_mode(p)))
            checked += 1
    for f in (html, det, txt):
        assert _mode(f) == 0o644, (f, oct(_mode(f)))
    assert checked >= 10


def test_logger_finalize_and_other_umasks(tmp_path):
    from holmes.logger import CommOpsRecorder, finalize_job

    old = os.umask(0o027)
    try:
        d = tmp_path / "cap"
        rec = CommOpsRecorder(d, rank=0, world_size=1)
        rec.add_communicator("w", [0], kind="dp")
        rec.record("w", "all_reduce", nbytes=8, start_ns=0, end_ns=5)
        rec.close()
        p = finalize_job(d)
        assert _mode(p) == 0o640
        replace_file_text(tmp_path / "t.json", "{}")
        assert _mode(tmp_path / "t.json") == 0o640
        w = _write(tmp_path / "W")
        assert _mode(w) == 0o750 and _mode(w / "job.json") == 0o640
    finally:
        os.umask(old)
    json.loads(p.read_text())
