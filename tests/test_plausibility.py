"""Issue #39 item 4: a consistency finding for what a log cannot mean, and no quiet verdict built
on it -- a rank much shorter than its peers, implausible time units, zero-length operators,
members silent on their communicator, duplicated records in converted traces."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from holmes.cli.main import main
from holmes.io.plausibility import RankShape, judge
from holmes.simulate import simulate


@pytest.fixture(scope="module")
def slow_job(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("plaus") / "job"
    simulate(d, tp=2, pp=2, dp=2, iterations=10, micro_batches=2, seed=1, faults=["gpu:5@persistent*2.4"])
    return d


@pytest.fixture
def job(slow_job, tmp_path) -> Path:
    d = tmp_path / "J"
    shutil.copytree(slow_job, d)
    return d


def _edit(job: Path, r: int, fn) -> None:
    p = job / "ranks" / f"rank-{r:05d}.parquet"
    pq.write_table(fn(pq.read_table(p)), p)


def _set(t, name, values):
    return t.set_column(t.schema.get_field_index(name), name, values)


def _localize(capsys, job: Path) -> dict:
    rc = main(["localize", str(job), "--format", "json"])
    out = capsys.readouterr().out
    assert rc == 0
    return json.loads(out)


def test_the_untouched_job_names_the_slow_gpu(job, capsys):
    rep = _localize(capsys, job)
    assert rep["verdict"] == "culprit" and rep["devices"][0]["id"] == "gpu:5"
    assert not any("cannot mean" in a or "implausibly" in a for a in rep["assumptions"])


def test_truncated_slow_rank_is_inconclusive_and_named(job, capsys):
    _edit(job, 5, lambda t: t.slice(0, 1))
    rep = _localize(capsys, job)
    assert rep["verdict"] == "inconclusive" and rep["devices"] == []
    text = "\n".join(rep["assumptions"])
    assert "rank 5: 1 op(s) in 1 iteration(s), its peers a median of" in text
    assert "the logs of rank(s) 5 cannot mean what they say" in text


@pytest.mark.parametrize("factor", [1000, 1_000_000])
def test_microseconds_or_milliseconds_read_as_ns_are_said(job, capsys, factor):
    for r in range(8):
        _edit(job, r, lambda t: _set(_set(t, "start_ns", pc.divide(t["start_ns"], factor)), "end_ns",
                                     pc.divide(t["end_ns"], factor)))
    shutil.rmtree(job / "iterations")
    rep = _localize(capsys, job)
    assert any(a.startswith("implausibly short times") for a in rep["assumptions"]), rep["assumptions"]
    if factor == 1_000_000:  # most operators now last 0 ns: nothing stands on them
        assert rep["verdict"] == "inconclusive"


def test_zero_length_operators(job, capsys):
    _edit(job, 3, lambda t: _set(t, "end_ns", t["start_ns"]))
    rep = _localize(capsys, job)
    assert rep["verdict"] == "inconclusive"
    assert any("rank 3: 220 of 220" in a and "zero-length" in a for a in rep["assumptions"]), rep["assumptions"]


def test_a_member_silent_on_its_communicator():
    s = {r: RankShape(10, 100, 0, 2e5, 5e7, frozenset({"dp", "tp"})) for r in range(4)}
    s[2] = RankShape(10, 100, 0, 2e5, 5e7, frozenset({"tp"}))
    (f,) = judge(s, {"dp": [0, 1, 2, 3], "tp": [0, 1, 2, 3]})
    assert not f.severe and f.ranks == (2,) and "rank 2 on 'dp'" in f.message


def test_pipeline_stages_of_unequal_length_are_not_short():
    # the first and last stage of a pipeline issue half the P2P operators of a middle one
    s = {r: RankShape(10, 200 if r in (1, 2) else 100, 0, 2e5, 5e7) for r in range(4)}
    assert judge(s) == []


def _kineto(rank: int, repeat: int) -> dict:
    ev = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "ts": 1000 * i, "dur": 999,
           "pid": 1, "tid": 1} for i in range(4)]
    for i in range(4):
        args = {"Collective name": "allreduce", "Process Group Name": "0", "Process Group Ranks": "[0, 1]",
                "Process Group Description": "default_pg", "In msg nelems": 10, "Out msg nelems": 10,
                "dtype": "Float", "Group size": 2}
        ev += [{"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": 1000 * i + 10,
                "dur": 50, "args": args}] * repeat
    return {"schemaVersion": 1, "baseTimeNanoseconds": 10**18,
            "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 2, "pg_config": [
                {"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cpu:gloo", "pg_size": 2, "ranks": [0, 1]}]},
            "traceEvents": ev}


def test_a_trace_listing_its_records_twice(tmp_path, capsys):
    import holmes

    src = tmp_path / "traces"
    src.mkdir()
    for r in (0, 1):
        (src / f"rank{r}.json").write_text(json.dumps(_kineto(r, 2)))
    assert main(["convert", "--from", "kineto", str(src), str(tmp_path / "job")]) == 0
    err = capsys.readouterr().err
    assert "rank 0: 4 record(s) repeat another" in err and "dropped" in err
    job = holmes.read_job(tmp_path / "job")
    assert job.ops(0).num_rows == 4 and job.meta.source.details["duplicates_dropped"] == {"0": 4, "1": 4}
    assert np.all(np.diff(job.ops(0).column("seq").to_numpy()) == 1)


@pytest.mark.parametrize("cfg", [dict(tp=2, pp=2, dp=2), dict(tp=2, cp=2, dp=2, ep=2), dict(tp=1, pp=4, dp=2)])
def test_simulated_layouts_agree_with_their_communicators(tmp_path, cfg):
    import holmes
    from holmes.io.plausibility import layout_contradictions

    job = holmes.read_job(simulate(tmp_path / "j", iterations=2, micro_batches=2, **cfg))
    assert layout_contradictions(job.layout, job.communicators) == []


def test_parallel_contradicting_communicators_is_said(job, capsys):
    meta = json.loads((job / "job.json").read_text())
    meta["parallel"]["order"] = "tp-cp-ep-pp-dp"  # other dp and pp groups than those listed
    (job / "job.json").write_text(json.dumps(meta))
    rep = _localize(capsys, job)
    assert any(a.startswith("job.json's parallel layout and its communicators disagree") for a in rep["assumptions"])


def test_two_halves_on_disjoint_iterations_are_inconclusive(job, capsys):
    for r in (4, 5, 6, 7):  # the second pipeline stage numbered from step 100
        _edit(job, r, lambda t: _set(t, "iteration", pc.add(t["iteration"], 100)))
    shutil.rmtree(job / "iterations")
    rep = _localize(capsys, job)
    assert rep["verdict"] == "inconclusive"
    assert any("rank(s) logged iterations that most of the others did not" in a for a in rep["assumptions"])
