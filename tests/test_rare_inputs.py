"""Issue #39: the rare inputs an outside fuzz run turned into "internal error" (hidden crashes), each
reproduced on a small simulated job or a synthetic trace and run through the real command.

A hidden crash is exit 2 with "internal error" on stderr; every reproducer here must end in exit
0 (with what went wrong named) or exit 2 with one typed line naming the file, rank or column.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from holmes.cli.main import main
from holmes.errors import ConfigError, HolmesError
from holmes.simulate import simulate


@pytest.fixture(scope="module")
def base_job(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("rare") / "job"
    simulate(d, tp=2, pp=2, dp=1, iterations=6, micro_batches=2, seed=0, faults=["gpu:1@persistent*3"])
    return d


@pytest.fixture
def job(base_job, tmp_path) -> Path:
    d = tmp_path / "J"
    shutil.copytree(base_job, d)
    return d


def _edit(job: Path, r: int, fn) -> None:
    p = job / "ranks" / f"rank-{r:05d}.parquet"
    pq.write_table(fn(pq.read_table(p)), p)


def _set(t: pa.Table, name: str, values) -> pa.Table:
    return t.set_column(t.schema.get_field_index(name), name, values)


def _run(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    cap = capsys.readouterr()
    assert "internal error" not in cap.err and "Traceback" not in cap.err, cap.err
    return rc, cap.out, cap.err


def _localize(capsys, job: Path, *extra) -> dict:
    rc, out, err = _run(capsys, "localize", job, "--format", "json", *extra)
    assert rc == 0, err
    return json.loads(out)


def _zero_rows(job):
    _edit(job, 1, lambda t: t.slice(0, 0))


def _all_op_index_zero(job):
    _edit(job, 1, lambda t: _set(t, "op_index", pa.array(np.zeros(t.num_rows, np.int32))))


def _one_rank_shifted(job):
    _edit(job, 1, lambda t: _set(t, "iteration", pc.add(t["iteration"], 100)))


def _disjoint_halves(job):
    for r in (2, 3):
        _edit(job, r, lambda t: _set(t, "iteration", pc.add(t["iteration"], 100)))


@pytest.mark.parametrize("mutate", [_zero_rows, _all_op_index_zero, _one_rank_shifted, _disjoint_halves])
def test_a_rank_with_no_operator_in_the_window(job, capsys, mutate):
    mutate(job)
    rep = _localize(capsys, job)
    text = " ".join(rep["assumptions"])
    assert "rank 1" in text or "rank(s)" in text or "rank 2" in text, text


def test_the_empty_rank_is_named(job, capsys):
    _zero_rows(job)
    rep = _localize(capsys, job)
    assert any("hold no operator in the iterations their peers share (1)" in a for a in rep["assumptions"]), \
        rep["assumptions"]


def test_cells_of_ranks_without_shared_iterations():
    from holmes.localize.irregular.cells import _low_spread, _row_spread, _shared_iterations

    assert _shared_iterations([np.arange(3), np.zeros(0, np.int64)]).tolist() == [0, 1, 2]
    assert _shared_iterations([np.arange(3), np.arange(100, 103)]).tolist() == [0, 1, 2, 100, 101, 102]
    assert _shared_iterations([]).size == 0
    assert np.isnan(_low_spread(np.zeros((2, 0)))).all() and _row_spread(np.zeros((1, 0))).shape == (1,)


def _kineto_rank(rank: int, world: int) -> dict:
    ev = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "ts": 1000 * i, "dur": 999,
           "pid": 1, "tid": 1} for i in range(6)]
    for i in range(6):
        args = {"Collective name": "allreduce", "Process Group Name": "0", "Process Group Ranks": "[0, 1]",
                "Process Group Description": "default_pg", "In msg nelems": 10, "Out msg nelems": 10,
                "dtype": "Float", "Group size": 2}
        ev.append({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1,
                   "ts": 1000 * i + 10 + rank, "dur": 5 + (i == 3) * 50, "args": args})
    return {"schemaVersion": 1, "baseTimeNanoseconds": 10**18,
            "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": world, "pg_config": [
                {"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cpu:gloo", "pg_size": 2,
                 "ranks": [0, 1]}]},
            "traceEvents": ev}


def test_kineto_traces_of_24_ranks_on_a_group_of_2(tmp_path, capsys):
    src = tmp_path / "traces"
    src.mkdir()
    for r in range(24):
        (src / f"rank{r}.json").write_text(json.dumps(_kineto_rank(r, 24)))
    rc, _, err = _run(capsys, "convert", "--from", "kineto", src, tmp_path / "job")
    assert rc == 0, err
    assert "22 of 24 rank(s) logged ops on a process group that does not list them" in err
    rep = _localize(capsys, tmp_path / "job")
    assert rep["world_size"] == 24


def test_label_detector_on_a_string_abnormal_column(job, capsys):
    for r in range(4):
        _edit(job, r, lambda t: _set(t, "abnormal", pa.array(["yes" if v else "no" for v in t["abnormal"].to_pylist()])))
    rc, _, err = _run(capsys, "localize", job, "--detector", "label")
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "column 'abnormal' has type string, expected bool" in err and "rank 0" in err


def test_label_detector_reads_an_integer_label(job):
    import holmes
    from holmes.detect.simple import LabelDetector

    t = holmes.read_job(job).ops(1)
    flags = LabelDetector().predict_ops(_set(t, "abnormal", pc.cast(t["abnormal"], pa.int8())))
    assert flags.dtype == bool and flags.tolist() == t["abnormal"].to_pylist()


@pytest.mark.parametrize("seed", [2**63, 123456789012345678901234567890, -1])
def test_seed_beyond_64_bits(tmp_path, capsys, seed):
    rc, _, err = _run(capsys, "simulate", "--out", tmp_path / "s", "--tp", "2", "--pp", "1", "--dp", "1",
                      "--iterations", "2", "--seed", seed, "--quiet")
    assert rc == 2 and "seed=" in err and "[0, 2**63)" in err, err
    assert not (tmp_path / "s").exists()
    with pytest.raises(ConfigError):
        simulate(tmp_path / "s", tp=2, iterations=2, seed=seed)


def test_largest_seed_is_accepted(tmp_path):
    simulate(tmp_path / "s", tp=2, iterations=2, micro_batches=1, seed=2**63 - 1)
    assert (tmp_path / "s" / "job.json").is_file()


# ------------------------------------------------------------------ Python API edges (item 5)


@pytest.mark.parametrize("kw, match", [
    (dict(monitors=range(10**12)), "monitors: more than"),
    (dict(monitors=(r for r in range(10**9))), "monitors: more than"),
    (dict(monitors=[1, True]), "monitors: must be an integer, not a bool"),
    (dict(pivot=True), "pivot: must be an integer, not a bool"),
    (dict(top_k=10**20), "top_k: must be at most"),
    (dict(window=np.int64(10**12)), "window: must be at most"),
])
def test_localize_refuses_absurd_parameters(base_job, kw, match):
    import holmes

    with pytest.raises(ConfigError, match=match):
        holmes.localize(holmes.read_job(base_job), **kw)


def test_localize_accepts_numpy_integers():
    from holmes.localize.params import LocalizeParams

    p = LocalizeParams(pivot=np.int64(3), monitors=np.arange(3), top_k=np.int32(4))
    assert (p.pivot, p.monitors, p.top_k) == (3, (0, 1, 2), 4)


def test_write_html_paths(base_job, tmp_path, monkeypatch):
    import holmes
    from holmes.io.outputs import OutputError
    from holmes.report.html import write_html

    job = holmes.read_job(base_job)
    rep = holmes.localize(job, analysis="hang")
    out = write_html(rep, os.fsencode(tmp_path / "r.html"), job=job)  # a bytes path
    assert out == tmp_path / "r.html" and out.read_text().startswith("<!DOCTYPE html>")
    long = tmp_path / ("x" * 250 + ".html")  # a valid name whose temporary sibling would not be
    assert write_html(rep, long, job=job) == long and long.is_file()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OutputError, match=r"^missing/\.\./r2\.html: cannot write") as e:
        write_html(rep, Path("missing/../r2.html"), job=job)
    assert ".holmes-tmp" not in str(e.value)
    with pytest.raises(OutputError, match="NUL"):
        write_html(rep, "a\x00b.html", job=job)
    with pytest.raises(HolmesError, match="must be a str or os.PathLike, not int"):
        write_html(rep, 42, job=job)
    assert not list(tmp_path.glob(".holmes-tmp-*"))
