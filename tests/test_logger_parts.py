"""The recorder's live mode: a rank's log written in parts while the job runs."""

from __future__ import annotations

import json
import os

import pytest

import holmes
from holmes.errors import ConfigError
from holmes.io.parts import list_parts, part_iterations
from holmes.logger import CommOpsRecorder, finalize_job


def _run(d, rank, iters, **kw):
    rec = CommOpsRecorder(d, rank=rank, world_size=2, flush_every=4, **kw)
    rec.add_communicator("dp-0", [0, 1], kind="dp")
    for it in range(iters):
        rec.step(it)
        for k in range(3):
            rec.record("dp-0", "all_reduce", nbytes=8, start_ns=1000 * it + 10 * k, end_ns=1000 * it + 10 * k + 5)
    return rec


def test_parts_every_n_iterations(tmp_path):
    rec = _run(tmp_path, 0, 10, parts_every=3)
    d = tmp_path / "ranks" / "rank-00000"
    # parts are cut at the mark that starts iteration 3, 6, 9: three are complete while 9 runs
    assert [part_iterations(p.path) for p in list_parts(d)] == [(0, 2), (3, 5), (6, 8)]
    assert any(n.startswith(".part-000003") for n in os.listdir(d)) is False  # rows of 9 still buffered
    side = json.loads((tmp_path / "comms" / "rank-00000.json").read_text())
    assert side["live"] is True and side["communicators"]["dp-0"]["ranks"] == [0, 1]
    assert rec.close() == d
    assert [part_iterations(p.path) for p in list_parts(d)][-1] == (9, 9)
    _run(tmp_path, 1, 10).close()  # the other rank writes one file: a job may mix both layouts
    finalize_job(tmp_path)
    job = holmes.read_job(tmp_path)
    assert job.ops(0).num_rows == job.ops(1).num_rows == 30
    assert job.iterations(0).column("iteration").to_pylist() == list(range(10))


def test_parts_interval_seconds(tmp_path):
    rec = _run(tmp_path, 0, 4, parts_interval=1e-9)  # every mark is past the interval
    assert len(list_parts(tmp_path / "ranks" / "rank-00000")) == 3
    rec.close()


def test_live_dump_adds_running_part(tmp_path):
    rec = _run(tmp_path, 1, 5, parts_every=2)
    rec.begin("dp-0", "all_reduce", nbytes=8, start_ns=9000)
    rec.dump("timeout")
    t = holmes.read_job(finalize_job(tmp_path, allow_missing=True).parent).ops(1)
    assert t.column("state").to_pylist().count("started") == 1 and t.num_rows == 16


def test_refuses_old_parts_and_bad_options(tmp_path):
    _run(tmp_path, 0, 3, parts_every=1).close()
    with pytest.raises(ConfigError, match="rank-00000: exists"):
        CommOpsRecorder(tmp_path, rank=0, parts_every=1)
    rec = CommOpsRecorder(tmp_path, rank=0, parts_every=1, overwrite=True)
    assert list_parts(rec.parts_dir) == []
    with pytest.raises(ConfigError, match="parts_every"):
        CommOpsRecorder(tmp_path / "x", rank=0, parts_every=0)
    with pytest.raises(ConfigError, match="parts_interval"):
        CommOpsRecorder(tmp_path / "y", rank=0, parts_interval=0)
