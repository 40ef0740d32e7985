"""Simulator output as written to disk: physics checked on the fixtures and on `holmes simulate`
jobs, the CLI with several --fault of the three patterns and --drift, and the fixture budget."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import holmes

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "fixtures"


def _all_rows(job) -> dict[str, np.ndarray]:
    ts = [job.ops(r) for r in range(job.world_size)]
    cols = defaultdict(list)
    for t in ts:
        for name in ("rank", "iteration", "op_index", "comm_id", "seq", "op", "peer", "start_ns", "end_ns", "abnormal"):
            col = t.column(name)
            if pa.types.is_dictionary(col.type):
                col = col.cast(pa.string())
            if name == "peer":
                col = col.fill_null(-1)
            cols[name].append(np.asarray(col.to_numpy(zero_copy_only=False)))
    out = {k: np.concatenate(v) for k, v in cols.items()}
    # simulated ranks log on their own wall clocks; truth.json records each one's offset
    off = (job.truth.extra or {}).get("clock_offset_ns") if job.truth is not None else None
    if off:
        assert not job.truth.extra.get("clock_drift")
        for c in ("start_ns", "end_ns"):
            out[c] = out[c] - np.asarray(off, np.int64)[out["rank"]]
    return out


def _check_physics_on_disk(job) -> None:
    d = _all_rows(job)
    comms = job.communicators
    groups = defaultdict(list)
    for i in np.flatnonzero(d["peer"] < 0):
        groups[(d["comm_id"][i], int(d["seq"][i]))].append(i)
    assert groups
    for (cid, _), idx in groups.items():
        assert sorted(d["rank"][idx].tolist()) == list(comms[cid].ranks)
        assert len(set(d["end_ns"][idx].tolist())) == 1  # one end for every member
        assert d["end_ns"][idx][0] >= d["start_ns"][idx].max()  # nobody finishes before the last arrives
    for r in range(job.world_size):
        sel = np.flatnonzero(d["rank"] == r)
        o = sel[np.lexsort((d["op_index"][sel], d["iteration"][sel]))]
        assert np.all(d["start_ns"][o][1:] >= d["end_ns"][o][:-1])  # issue order, no overlap
    sends = {(d["comm_id"][i], int(d["rank"][i]), int(d["peer"][i]), int(d["seq"][i])): i
             for i in np.flatnonzero(d["op"] == "send")}
    recvs = np.flatnonzero(d["op"] == "recv")
    assert len(recvs) == len(sends)
    for i in recvs:
        j = sends[(d["comm_id"][i], int(d["peer"][i]), int(d["rank"][i]), int(d["seq"][i]))]
        assert d["end_ns"][i] >= d["start_ns"][j]


@pytest.mark.parametrize("name", ["gpu16-clean", "gpu32-3d-nic-fluctuation", "gpu64-3d-slow-gpu"])
def test_fixture_physics_as_written_to_disk(name):
    path = FIXTURES / name
    if not path.is_dir():
        pytest.skip("fixture not generated")
    job = holmes.read_job(path)
    _check_physics_on_disk(job)
    if not job.truth.faults:
        d = _all_rows(job)
        assert not d["abnormal"].any()


def test_fixtures_each_at_most_1mb_and_regeneration_script_present():
    assert (REPO / "scripts" / "make_fixtures.py").is_file()
    corpora = ("real", "real-loaded", "real-always", "real-hang")
    dirs = [p for p in FIXTURES.iterdir() if p.is_dir() and p.name not in corpora]
    assert len(dirs) >= 2
    for p in dirs:
        size = sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
        assert size <= 1 << 20, (p.name, size)
    # the real-run corpora: many small runs (scripts/real_runs.py corpus), bounded as a whole
    for name in corpora:
        real = FIXTURES / name
        if real.is_dir():
            runs = [p for p in real.iterdir() if p.is_dir()]
            sizes = {p.name: sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) for p in runs}
            assert max(sizes.values()) <= 1 << 20 and sum(sizes.values()) <= 25 << 20


def _simulate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "holmes", "simulate", *args], capture_output=True, text=True,
                          timeout=300, cwd=REPO)


def test_cli_three_patterns_multiple_faults_and_drift(tmp_path):
    out = tmp_path / "job"
    p = _simulate("--out", str(out), "--tp", "2", "--pp", "2", "--dp", "4", "--ep", "2", "--cp", "1",
                  "--micro-batches", "3", "--iterations", "30", "--seed", "5",
                  "--fault", "gpu:3@spike*2.0", "--fault", "nic:9@persistent*3",
                  "--fault", "switch:leaf-1@fluctuation*1.5", "--drift", "0.001")
    assert p.returncode == 0, p.stderr
    job = holmes.read_job(out)
    assert job.world_size == 16
    truth = json.loads((out / "truth.json").read_text())
    got = {(f["device"], f["pattern"], f["factor"]) for f in truth["faults"]}
    assert got == {("gpu:3", "spike", 2.0), ("nic:9", "persistent", 3.0), ("switch:leaf-1", "fluctuation", 1.5)}
    assert all(f["iterations"] for f in truth["faults"])
    assert truth["drift_per_iteration"] == pytest.approx(0.001)
    _check_physics_on_disk(job)
    d = _all_rows(job)
    active = sorted({i for f in truth["faults"] for i in f["iterations"]})
    assert d["abnormal"][np.isin(d["iteration"], active)].any()
    assert not d["abnormal"][~np.isin(d["iteration"], active)].any()
    assert (out / "topology.json").is_file() and (out / "iterations").is_dir()


def test_cli_fault_free_has_no_abnormal_and_same_seed_same_files(tmp_path):
    args = ["--tp", "2", "--pp", "2", "--dp", "2", "--iterations", "5", "--seed", "9", "--quiet"]
    for name in ("a", "b"):
        p = _simulate("--out", str(tmp_path / name), *args)
        assert p.returncode == 0 and p.stdout == "", p.stderr
    ja, jb = holmes.read_job(tmp_path / "a"), holmes.read_job(tmp_path / "b")
    for r in range(8):
        assert ja.ops(r).equals(jb.ops(r))
        assert not np.asarray(ja.ops(r).column("abnormal").to_numpy(zero_copy_only=False)).any()
    assert (tmp_path / "a" / "truth.json").read_text() == (tmp_path / "b" / "truth.json").read_text()


@pytest.mark.parametrize("bad", [["--fault", "gpu:3@spike"], ["--fault", "gpu:3@spike*0"], ["--tp", "0"],
                                 ["--iterations", "0"], ["--micro-batches", "0"]])
def test_cli_bad_flags_exit_2_one_line(tmp_path, bad):
    base = {"--tp": "2", "--pp": "1", "--dp": "2"}
    for k in bad[::2]:
        base.pop(k, None)
    args = [x for kv in base.items() for x in kv]
    p = _simulate("--out", str(tmp_path / "job"), *args, *bad)
    assert p.returncode == 2 and "Traceback" not in p.stderr and p.stderr.count("\n") == 1, p.stderr
