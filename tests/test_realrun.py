"""The real-run harness (holmes.eval.realrun, scripts/real_runs.py): one small real run, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import holmes
from holmes.errors import ConfigError
from holmes.eval.realrun import RealRunConfig, active_factors, parse_fault, run_real_job
from holmes.eval.realrun_worker import one_f_one_b

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "real_runs.py"


def _script(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.torch
def test_small_real_run_writes_a_readable_labelled_job(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "job"
    cfg = RealRunConfig(tp=2, pp=2, dp=2, iterations=8, seed=3, faults=("gpu:5@persistent:4*1.8",), timeout=60)
    run_real_job(out, cfg)
    job = holmes.read_job(out)
    assert job.world_size == 8
    assert {c.kind for c in job.communicators.values()} == {"tp", "pp", "dp"}
    for r in range(8):
        t = job.ops(r)
        assert sorted(set(t.column("iteration").to_pylist())) == list(range(8))
        d = np.asarray(t.column("end_ns")) - np.asarray(t.column("start_ns"))
        assert (d >= 0).all()
    # the true payload size is logged: a pipeline activation is tokens x hidden float32
    t4 = job.ops(4).to_pydict()
    assert {n for o, n in zip(t4["op"], t4["nbytes"]) if o == "recv"} == {128 * 128 * 4}
    topo = job.topology
    assert topo is not None and topo.gpus_per_host == 4 and topo.num_gpus == 8
    assert "nic:5" in topo and "host:1" in topo
    truth = job.truth
    assert truth.devices == ["gpu:5"]
    assert truth.faults[0].pattern == "persistent" and truth.faults[0].factor == 1.8
    assert truth.faults[0].iterations == [4, 5, 6, 7]
    rec = json.loads((out / "realrun.json").read_text())
    comp = np.array(rec["ranks"][5]["compute_s"])
    assert np.median(comp[4:]) > 1.3 * np.median(comp[:4])  # the slow GPU really computed longer


def test_schedule_is_deadlock_free_with_rendezvous_sends():
    for P in (2, 3, 4):
        for M in (1, 2, 4, 6):
            sch = [[(a, s) for a, _ in one_f_one_b(s, P, M) if a not in ("F", "B")] for s in range(P)]
            pos = [0] * P

            def head(s):
                if pos[s] >= len(sch[s]):
                    return None
                a, _ = sch[s][pos[s]]
                peer = s + 1 if a in ("send_f", "recv_b") else s - 1
                return a, peer

            while any(pos[s] < len(sch[s]) for s in range(P)):
                moved = False
                for s in range(P):
                    h = head(s)
                    if h is None:
                        continue
                    a, peer = h
                    g = head(peer)
                    want = {"send_f": "recv_f", "recv_f": "send_f", "send_b": "recv_b", "recv_b": "send_b"}[a]
                    if g is not None and g == (want, s):
                        pos[s] += 1
                        pos[peer] += 1
                        moved = True
                assert moved, f"deadlock P={P} M={M} at {pos}"
            counts = [sum(1 for a, _ in one_f_one_b(s, P, M) if a == "F") for s in range(P)]
            assert counts == [M] * P


def test_fault_specs_and_patterns():
    assert parse_fault("p2p:1>5@spike*3").pair == (1, 5)
    f = active_factors([parse_fault("gpu:1@spike*2"), parse_fault("nic:2@fluctuation*3"),
                        parse_fault("host:0@persistent*1.5")], 35, seed=4)
    spike, fl, pers = (f != 1.0)
    assert 1 <= spike.sum() <= 3
    assert 0 < fl.sum() < 35 and pers[-1] and not pers[0] and pers[np.argmax(pers):].all()
    assert set(np.unique(f[2])) == {1.0, 1.5}


@pytest.mark.parametrize("kwargs, match", [
    (dict(faults=("cpu:1@spike*2",)), "unknown fault kind"),
    (dict(faults=("gpu:9@spike*2",)), "unknown device gpu:9"),
    (dict(faults=("host:2@spike*2",)), "unknown device host:2"),
    (dict(faults=("link:nic:0|switch:spine-7@spike*2",)), "unknown device"),
    (dict(faults=("p2p:0>1@spike*2",)), "not adjacent pipeline stages"),
    (dict(faults=("gpu:1@spike*0.5",)), "factor"),
    (dict(faults=("gpu:1@spike*abc",)), "not a number"),
    (dict(faults=("gpu:1@often*2",)), "pattern"),
    (dict(world_size=12), "world size 12"),
    (dict(tp=2, pp=1, dp=3), "gpus_per_host"),
    (dict(tp=0), "tp=0"),
])
def test_bad_config_raises_config_error(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        RealRunConfig(**kwargs).validate()


def test_bad_output_and_api_error_before_any_process(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "mine.txt").write_text("a user's file")
    with pytest.raises(ConfigError, match="not empty"):
        run_real_job(tmp_path / "x", RealRunConfig())
    with pytest.raises(ConfigError, match="mine.txt"):
        run_real_job(tmp_path / "x", RealRunConfig(), overwrite=True)
    assert (tmp_path / "x" / "mine.txt").read_text() == "a user's file"
    with pytest.raises(ConfigError):
        run_real_job(tmp_path / "y", RealRunConfig(faults=("gpu:99@spike*2",)))
    assert not (tmp_path / "y").exists()


@pytest.mark.parametrize("args, match", [
    (["--fault", "cpu:1@spike*2"], "unknown fault kind"),
    (["--fault", "gpu:42@persistent*1.5"], "unknown device"),
    (["--world-size", "10"], "world size 10"),
    (["--fault", "gpu:1@spike*-2"], "factor"),
    (["--tp", "two"], "invalid int"),
])
def test_script_bad_input_exits_2_with_one_line(tmp_path, args, match):
    p = _script("run", "--out", str(tmp_path / "job"), *args)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and match in lines[0], p.stderr
    assert not (tmp_path / "job").exists()
