"""The reproducers of issue #15: never clobber, bounded memory, typed errors, consistency findings.

Each test runs the real command (``holmes.cli.main.main`` in-process, or a subprocess where a kill
is needed) and asserts the outcome: exit 2 with exactly one stderr line naming the file or field,
or exit 0 with the inconsistency named; the user's files byte-identical afterwards (hashes).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import holmes
from holmes.cli.main import main
from holmes.errors import ArgumentTypeError, HolmesError, JobError
from holmes.io import JobWriter, ops_table, read_job
from holmes.limits import LimitError, decode_json, read_capped
from holmes.io.outputs import (OutputExistsError, OutputInsideInputError, atomic_write_text, check_output,
                               staged_directory)

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"


def _tree(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = "link:" + os.readlink(p)
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            out[rel] = "dir"
    return out


def _cli(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _exit2(capsys, *argv, match: str = "") -> str:
    rc, _, err = _cli(capsys, *argv)
    lines = err.strip().splitlines()
    assert rc == 2, err
    assert len(lines) == 1, err
    assert "internal error" not in err and "Traceback" not in err
    assert match in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def base_job(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("safety") / "job"
    assert main(["simulate", "--out", str(d), "--tp", "2", "--pp", "2", "--dp", "1", "--iterations", "5",
                 "--micro-batches", "2", "--quiet"]) == 0
    return d


@pytest.fixture
def job(base_job, tmp_path) -> Path:
    d = tmp_path / "J"
    shutil.copytree(base_job, d)
    return d


# ------------------------------------------------------------------ 1. data loss


@pytest.mark.parametrize("target", ["job.json", "ranks/rank-00001.parquet", "ranks", ".", "new.parquet"])
def test_detect_out_inside_the_job_is_refused(job, capsys, target):
    before = _tree(job)
    _exit2(capsys, "detect", job, "--ranks", "0", "--out", job / target, match="inside")
    assert _tree(job) == before


def test_detect_out_existing_needs_overwrite_and_directory_is_refused(job, tmp_path, capsys):
    out = tmp_path / "flagged.parquet"
    out.write_bytes(b"user data")
    _exit2(capsys, "detect", job, "--ranks", "0", "--out", out, match="exists")
    assert out.read_bytes() == b"user data"
    d = tmp_path / "adir"
    d.mkdir()
    _exit2(capsys, "detect", job, "--ranks", "0", "--out", d, match="directory")
    rc, _, err = _cli(capsys, "detect", job, "--ranks", "0", "--out", out, "--overwrite")
    assert rc == 0, err
    assert pq.read_table(out).num_rows > 0
    assert not list(tmp_path.glob(".holmes-tmp-*"))


def test_train_out_existing_model_is_refused(job, tmp_path, capsys):
    for ext in (".json", ".npz"):
        (tmp_path / f"m{ext}").write_text("my model")
    before = _tree(tmp_path)
    _exit2(capsys, "train", job, "--out", tmp_path / "m", "--n-estimators", "1", "--max-ranks", "1", match="exists")
    assert _tree(tmp_path) == before
    _exit2(capsys, "train", job, "--out", job / "m", "--n-estimators", "1", match="inside")
    _exit2(capsys, "train", job, "--out", str(tmp_path) + "/", "--n-estimators", "1", match="directory")


@pytest.mark.skipif(not (DATA / "kineto").is_dir(), reason=f"needs the Kineto traces at {DATA / 'kineto'} (../shared/data)")
def test_convert_overwrite_replaces_a_larger_job_whole(job, tmp_path, capsys):
    assert (job / "iterations").is_dir() and (job / "truth.json").is_file()
    rc, _, err = _cli(capsys, "convert", "--from", "kineto", DATA / "kineto" / "nccl_data.json.gz", job, "--overwrite", "-q")
    assert rc == 0, err
    assert sorted(p.name for p in job.iterdir()) in (["job.json", "ranks"], ["compute", "job.json", "ranks"])
    assert [p.name for p in (job / "ranks").iterdir()] == ["rank-00000.parquet"]
    j = read_job(job)
    assert j.world_size == 2 and j.iteration_times(0)[0].size > 0
    assert not list(tmp_path.glob(".holmes-tmp-*"))


def test_convert_refuses_output_inside_source_and_non_job_directory(tmp_path, capsys):
    src = tmp_path / "insp"
    shutil.copytree(REPO / "tests" / "data" / "nccl_inspector", src)
    before = _tree(src)
    _exit2(capsys, "convert", "--from", "nccl-inspector", src, src / "job", match="inside")
    other = tmp_path / "notes"
    other.mkdir()
    (other / "a.txt").write_text("keep")
    _exit2(capsys, "convert", "--from", "nccl-inspector", src, other, "--overwrite", match="not a job")
    assert _tree(src) == before and (other / "a.txt").read_text() == "keep"


def test_simulate_killed_half_way_leaves_the_old_job(job, tmp_path):
    before = _tree(job)
    p = subprocess.Popen([sys.executable, "-m", "holmes", "simulate", "--out", str(job), "--tp", "8", "--pp", "4",
                          "--dp", "8", "--iterations", "60", "--overwrite", "--quiet"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline and not list(tmp_path.glob(".holmes-tmp-J.*/ranks/rank-0001*")):
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert _tree(job) == before  # the old job, whole: not half new ranks under the old job.json
    assert read_job(job).world_size == 4


def test_job_writer_failure_leaves_nothing(tmp_path):
    meta = {"world_size": 2, "communicators": {"dp-0": {"kind": "dp", "ranks": [0, 1]}}}
    with pytest.raises(RuntimeError):
        with JobWriter(tmp_path / "j", meta) as w:
            w.write_ops(0, ops_table(rank=[0], iteration=[0], op_index=[0], comm_id=["dp-0"], seq=[0], op=["all_reduce"],
                                     peer=[None], nbytes=[4], start_ns=[0], end_ns=[9]))
            raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []


def test_outputs_helpers(tmp_path):
    f = tmp_path / "r.html"
    atomic_write_text(f, "one")
    with pytest.raises(OutputExistsError):
        atomic_write_text(f, "two")
    atomic_write_text(f, "two", overwrite=True)
    assert f.read_text() == "two"
    job = tmp_path / "job"
    (job / "ranks").mkdir(parents=True)
    with pytest.raises(OutputInsideInputError):
        check_output(job / "report.html", inputs=[job])
    check_output(job / "report.html")  # a ranks/ folder alone does not make a job
    (job / "job.json").write_text("{}")
    with pytest.raises(OutputInsideInputError):
        check_output(job / "report.html")  # inside any job directory
    with staged_directory(tmp_path / "new") as d:
        (d / "job.json").write_text("{}")
        assert not (tmp_path / "new").exists()
    assert (tmp_path / "new" / "job.json").is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".holmes-tmp")] == []


# ------------------------------------------------------------------ 2. memory


def test_job_json_linked_to_an_endless_file(job, capsys):
    (job / "job.json").unlink()
    (job / "job.json").symlink_to("/dev/zero")
    _exit2(capsys, "localize", job, match="job.json")
    with pytest.raises(JobError, match="not a regular file"):
        read_job(job)


def test_world_size_beyond_the_cap(job, capsys):
    d = json.loads((job / "job.json").read_text())
    d["world_size"] = 10**7
    (job / "job.json").write_text(json.dumps(d))
    _exit2(capsys, "localize", job, match="world_size")
    _exit2(capsys, "detect", job, "--out", job.parent / "x.parquet", match="world_size")


def test_ranks_range_is_checked_before_expanding(job, tmp_path, capsys):
    t = time.perf_counter()
    _exit2(capsys, "detect", job, "--ranks", "0-50000000", "--out", tmp_path / "x.parquet", match="--ranks")
    assert time.perf_counter() - t < 5


def test_gzip_bomb_and_size_caps(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOLMES_MAX_TRACE_BYTES", str(8 << 20))
    bomb = tmp_path / "rank0.json.gz"
    bomb.write_bytes(gzip.compress(b" " * (20 << 20)))
    _exit2(capsys, "convert", "--from", "kineto", bomb, tmp_path / "out", match="cap")
    assert not (tmp_path / "out").exists()
    big = tmp_path / "big.json"
    big.write_bytes(b" " * 2048)
    with pytest.raises(LimitError):
        read_capped(big, 1024)


# ------------------------------------------------------------------ 4. tracebacks -> exit 2


@pytest.mark.parametrize("content,match", [(b"\xff\xfe{", "UTF-8"), (b"[" * 100_000, "nested"),
                                           (b'{"a":' * 5000 + b"1" + b"}" * 5000, "nested"), (b"", "empty")])
def test_bad_job_json_is_one_line(job, capsys, content, match):
    (job / "job.json").write_bytes(content)
    _exit2(capsys, "localize", job, match=match)


@pytest.mark.parametrize("fmt,name", [("kineto", "t.json"), ("flight-recorder", "_dump_0"), ("nccl-inspector", "x.jsonl")])
@pytest.mark.parametrize("content", [b"\xff\xfe{", b"[" * 100_000])
def test_bad_converter_input_is_one_line(tmp_path, capsys, fmt, name, content):
    src = tmp_path / "src"
    src.mkdir()
    (src / name).write_bytes(content)
    _exit2(capsys, "convert", "--from", fmt, src if fmt != "kineto" else src / name, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_ranks_is_a_file_or_a_symlink_loop(job, tmp_path, capsys):
    shutil.rmtree(job / "ranks")
    (job / "ranks").write_text("x")
    _exit2(capsys, "localize", job, match="rank")
    (job / "ranks").unlink()
    (job / "ranks").symlink_to("ranks")
    _exit2(capsys, "localize", job, match="rank")
    _exit2(capsys, "detect", job, "--out", tmp_path / "x.parquet")


def test_detect_mixed_dictionary_and_plain_strings(job, tmp_path, capsys):
    p = job / "ranks" / "rank-00001.parquet"
    t = pq.read_table(p)
    for name in ("comm_id", "op"):
        i = t.schema.get_field_index(name)
        t = t.set_column(i, pa.field(name, pa.string()), t.column(i).cast(pa.string()))
    pq.write_table(t, p)
    rc, _, err = _cli(capsys, "detect", job, "--out", tmp_path / "x.parquet")
    assert rc == 0, err
    assert pq.read_table(tmp_path / "x.parquet").num_rows > 0


@pytest.mark.skipif(not (DATA / "flight_recorder").is_dir(), reason=f"needs the Flight Recorder dumps at {DATA / 'flight_recorder'} (../shared/data)")
def test_flight_recorder_size_beyond_int64_is_skipped_and_named(tmp_path, capsys):
    from holmes.adapters.safe_pickle import safe_load

    src = tmp_path / "fr"
    shutil.copytree(DATA / "flight_recorder" / "gpu_error_1st", src)
    for f in src.iterdir():
        f.chmod(0o644)
    d = safe_load(src / "_dump_3")
    d["entries"][0]["input_sizes"] = [[10**30]]
    (src / "_dump_3").write_bytes(pickle.dumps(d))
    rc, _, err = _cli(capsys, "convert", "--from", "flight-recorder", src, tmp_path / "out")
    assert rc == 0 and "beyond int64" in err


@pytest.mark.skipif(not (DATA / "kineto").is_dir(), reason=f"needs the Kineto traces at {DATA / 'kineto'} (../shared/data)")
def test_kineto_negative_rank_in_a_process_group(tmp_path, capsys):
    d = json.load(gzip.open(DATA / "kineto" / "nccl_data.json.gz", "rt"))
    d["distributedInfo"]["pg_config"][0]["ranks"] = [0, -1]
    f = tmp_path / "t.json"
    f.write_text(json.dumps(d))
    _exit2(capsys, "convert", "--from", "kineto", f, tmp_path / "out", match="rank -1")


# ------------------------------------------------------------------ 5. Python API


def test_api_edges_raise_holmes_errors(job):
    with pytest.raises(ArgumentTypeError):
        read_job(None)
    with pytest.raises(TypeError):
        read_job(5)
    j = read_job(job)
    for bad in (1.5, "1", True, None):
        with pytest.raises(ArgumentTypeError):
            j.ops(bad)
    with pytest.raises(HolmesError):
        j.ops(10**30)
    from holmes.adapters import convert

    with pytest.raises(HolmesError):
        convert(None, job, job.parent / "o")
    with pytest.raises(HolmesError):
        convert("kineto", None, job.parent / "o")
    with pytest.raises(ValueError):
        decode_json(b'{"a": NaN}', "x")


# ------------------------------------------------------------------ 3. consistency


def _edit(job: Path, rank: int, fn) -> None:
    p = job / "ranks" / f"rank-{rank:05d}.parquet"
    pq.write_table(fn(pq.read_table(p)), p)


def _setcol(t: pa.Table, name: str, values, type_=None) -> pa.Table:
    i = t.schema.get_field_index(name)
    arr = pa.array(values, type=type_ or t.schema.field(i).type)
    return t.set_column(i, pa.field(name, arr.type), arr)


def test_consistency_findings_are_named_and_counted(job, tmp_path, capsys):
    def f(t):
        t = t.cast(pa.schema([pa.field(x.name, x.type.value_type if pa.types.is_dictionary(x.type) else x.type)
                              for x in t.schema]))
        st, en = t.column("start_ns").to_pylist(), t.column("end_ns").to_pylist()
        en[0], en[1], en[2] = st[0] - 5, st[1] - 5, st[2] - 5
        st[3] = int(np.iinfo(np.int64).min)
        t = _setcol(_setcol(t, "end_ns", en), "start_ns", st)
        return pa.concat_tables([t, t.slice(10, 2)])
    _edit(job, 3, f)
    j = read_job(job)
    n = j.ops(3).num_rows
    msgs = j.inconsistencies[3]
    assert "rank 3: 3 op(s) end before they start, excluded" in msgs
    assert any("int64 extreme" in m for m in msgs) and any("2 duplicated row(s)" in m for m in msgs)
    assert j.consistency.rows_excluded[3] == 6 and j.consistency.rows_read[3] == n + 6
    assert 0 < j.consistency.excluded_fraction([3]) < 0.5 and not j.consistency.mostly_excluded()
    rc, _, err = _cli(capsys, "detect", job, "--ranks", "3", "--out", tmp_path / "x.parquet")
    assert rc == 0 and "rank 3: 3 op(s) end before they start, excluded" in err


def test_clean_jobs_have_no_findings(base_job):
    j = read_job(base_job)
    for r in j.available_ranks():
        j.ops(r)
        j.iterations(r)
    assert not j.consistency and j.consistency.excluded_fraction() == 0.0


def test_shuffled_op_index_is_renumbered_and_reported(job):
    orig = read_job(job).ops(2)

    def f(t):
        ix = t.column("op_index").to_pylist()
        it = t.column("iteration").to_pylist()
        rows = [i for i, v in enumerate(it) if v == 1]
        vals = [ix[i] for i in rows][::-1]
        for i, v in zip(rows, vals):
            ix[i] = v
        return _setcol(t, "op_index", ix)
    _edit(job, 2, f)
    j = read_job(job)
    got = j.ops(2)
    assert any("op_index is not in start order in 1 iteration(s)" in m for m in j.inconsistencies[2])
    assert got.column("op_index").to_pylist() == orig.column("op_index").to_pylist()
    assert got.column("start_ns").to_pylist() == orig.column("start_ns").to_pylist()


def test_peers_membership_and_seq(job):
    meta = json.loads((job / "job.json").read_text())
    foreign = next(c for c, v in meta["communicators"].items() if 0 not in v["ranks"])

    def f(t):
        t = t.cast(pa.schema([pa.field(x.name, x.type.value_type if pa.types.is_dictionary(x.type) else x.type)
                              for x in t.schema]))
        op, peer, comm, seq = (t.column(c).to_pylist() for c in ("op", "peer", "comm_id", "seq"))
        p2p = [i for i, o in enumerate(op) if o in ("send", "recv")]
        coll = [i for i, o in enumerate(op) if o not in ("send", "recv")]
        peer[p2p[0]] = None
        peer[coll[0]] = 1
        comm[coll[1]] = foreign
        same = [i for i in coll[2:] if comm[i] == comm[coll[2]]]
        seq[same[0]], seq[same[1]] = seq[same[1]], seq[same[0]]
        return _setcol(_setcol(_setcol(t, "peer", peer, pa.int32()), "comm_id", comm), "seq", seq)
    _edit(job, 0, f)
    j = read_job(job)
    j.ops(0)
    msgs = " | ".join(j.inconsistencies[0])
    for needle in ("have no peer", "collective op(s) name a peer", "not a member", "go back in seq"):
        assert needle in msgs, msgs


def test_iteration_table_disagreeing_or_reversed(job):
    p = job / "iterations" / "rank-00000.parquet"
    t = pq.read_table(p)
    pq.write_table(_setcol(t, "iteration", [v + 1000 for v in t.column("iteration").to_pylist()]), p)
    j = read_job(job)
    j.ops(0)  # ops read first: the iteration table is checked against them at once
    it, dur = j.iteration_times(0)
    assert any("disagrees with the op table" in m for m in j.inconsistencies[0])
    assert it.tolist() == sorted(set(j.ops(0).column("iteration").to_pylist())) and (dur > 0).all()
    j = read_job(job)
    it0, _ = j.iteration_times(0)  # iteration file first: checked when the ops are read
    assert 0 not in j.inconsistencies and j.stats.as_dict()["ranks_read"] == 0
    j.ops(0)
    assert any("disagrees with the op table" in m for m in j.inconsistencies[0])
    assert j.iteration_times(0)[0].tolist() == it.tolist() != it0.tolist()
    st, en = t.column("start_ns").to_pylist(), t.column("end_ns").to_pylist()
    en[1] = st[1] - 1
    pq.write_table(_setcol(t, "end_ns", en), p)
    j = read_job(job)
    j.iterations(0)
    assert any("1 iteration(s) end before they start, excluded" in m for m in j.inconsistencies[0])


@pytest.mark.parametrize("column,offset", [("iteration", 1000), ("seq", 7), ("iteration", 1)])
def test_a_rank_shifted_against_the_others_is_named(job, column, offset):
    _edit(job, 0, lambda t: _setcol(t, column, [v + offset for v in t.column(column).to_pylist()]))
    j = read_job(job)
    for r in j.available_ranks():
        j.ops(r)
    assert j.consistency.disagreements and all(0 in d[:2] for d in j.consistency.disagreements)
    assert any("disagree on communicator" in m for m in j.inconsistencies[0])


def test_logger_refuses_to_mix_with_an_earlier_run(tmp_path):
    from holmes.errors import ConfigError
    from holmes.logger import CommOpsRecorder, finalize_job

    for r in (0, 1):
        rec = CommOpsRecorder(tmp_path, rank=r, world_size=2)
        rec.add_communicator("dp-0", [0, 1], kind="dp")
        rec.record("dp-0", "all_reduce", nbytes=8, start_ns=0, end_ns=5)
        rec.close()
    finalize_job(tmp_path)
    before = _tree(tmp_path)
    with pytest.raises(ConfigError, match="earlier run"):
        CommOpsRecorder(tmp_path, rank=1, world_size=2)
    assert _tree(tmp_path) == before
    assert not [p for p in tmp_path.rglob("*") if "tmp" in p.name or p.name.endswith(".partial")]
