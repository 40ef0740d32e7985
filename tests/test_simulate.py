"""Tests of the trace simulator: physics of generated jobs, faults, labels, determinism, CLI."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import holmes
import holmes.simulate
from holmes.cli.main import main as cli_main
from holmes.errors import ConfigError, LayoutError
from holmes.simulate import FaultSpec, Workload, active_factors, run_simulation
from holmes.eval.fixtures import FIXTURES, dir_size

FIXTURES_DIR = Path(__file__).resolve().parents[1] / "fixtures"


def _rows(res):
    """All ops of a SimResult as numpy columns (small jobs only)."""
    tables = [res.ops(r) for r in range(res.world_size)]
    t = pa.concat_tables([x.cast(tables[0].schema) for x in tables])
    out = {}
    for name in t.column_names:
        col = t.column(name)
        if pa.types.is_dictionary(col.type):
            col = col.cast(pa.string())
        out[name] = np.asarray(col.to_numpy(zero_copy_only=False))
    out["peer"] = np.asarray(t.column("peer").fill_null(-1).to_numpy())
    # the logs are on each rank's wall clock (offset per host); the physics holds on the true time line
    assert res.clock_drift is None or not res.clock_drift.any()
    for c in ("start_ns", "end_ns"):
        out[c] = out[c] - res.clock_offset[out["rank"]]
    return out


def _check_physics(res):
    d = _rows(res)
    comms = res.meta().communicators
    # 1. the ends of one collective instance agree across its members, and every member is there
    coll = d["peer"] < 0
    groups = defaultdict(list)
    for i in np.flatnonzero(coll):
        groups[(d["comm_id"][i], d["seq"][i])].append(i)
    for (cid, _), idx in groups.items():
        assert len(idx) == len(comms[cid].ranks)
        assert sorted(d["rank"][idx].tolist()) == sorted(comms[cid].ranks)
        assert len(set(d["end_ns"][idx].tolist())) == 1
        assert len(set(d["op"][idx].tolist())) == 1
        assert d["end_ns"][idx][0] >= d["start_ns"][idx].max()
    # 2. no op on a rank starts before the previous one ended
    for r in range(res.world_size):
        sel = d["rank"] == r
        key = d["iteration"][sel] * 10**6 + d["op_index"][sel]
        order = np.argsort(key)
        st_, en = d["start_ns"][sel][order], d["end_ns"][sel][order]
        assert np.all(st_[1:] >= en[:-1])
        assert np.all(en >= st_)
    # 3. a recv never ends before its send started; the pair completes together
    sends = {}
    for i in np.flatnonzero(d["op"] == "send"):
        sends[(d["comm_id"][i], int(d["rank"][i]), int(d["peer"][i]), int(d["seq"][i]))] = i
    recvs = np.flatnonzero(d["op"] == "recv")
    assert len(recvs) == len(sends)
    for i in recvs:
        j = sends[(d["comm_id"][i], int(d["peer"][i]), int(d["rank"][i]), int(d["seq"][i]))]
        assert d["end_ns"][i] >= d["start_ns"][j]
        assert d["end_ns"][i] == d["end_ns"][j]
        assert d["nbytes"][i] == d["nbytes"][j]
    return d


SHAPES = [
    dict(tp=2, pp=2, dp=2),
    dict(tp=2, pp=4, dp=2, cp=2),
    dict(tp=2, pp=2, dp=4, ep=2),
    dict(tp=2, pp=2, dp=2, cp=2, ep=2),  # 5 dims + sequence parallel: 16 GPUs
    dict(tp=1, pp=3, dp=4, ep=4),
    dict(tp=4, pp=1, dp=2),
]


@pytest.mark.parametrize("shape", SHAPES)
def test_physics_of_generated_jobs(shape):
    res = run_simulation(**shape, iterations=3, seed=7, faults=["gpu:1@spike:1*2"])
    d = _check_physics(res)
    assert res.world_size == shape.get("tp", 1) * shape.get("pp", 1) * shape.get("dp", 1) * shape.get("cp", 1)
    assert d["abnormal"].dtype == bool


@settings(max_examples=12, deadline=None)
@given(tp=st.sampled_from([1, 2, 4]), pp=st.integers(1, 5), dp=st.sampled_from([1, 2, 4]),
       cp=st.sampled_from([1, 2]), ep=st.sampled_from([1, 2]), m=st.integers(1, 6),
       sp=st.booleans(), dist=st.booleans(), seed=st.integers(0, 2**31))
def test_physics_property(tp, pp, dp, cp, ep, m, sp, dist, seed):
    if (tp * cp * dp) % (tp * ep):
        ep = 1
    w = Workload(micro_batches=m, sequence_parallel=sp, distributed_optimizer=dist)
    res = run_simulation(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, workload=w, iterations=2, seed=seed,
                         faults=["gpu:0@persistent:1*1.7"])
    _check_physics(res)


def test_deadlock_free_over_many_shapes():
    for pp in range(2, 9):
        for m in range(1, 10):
            res = run_simulation(pp=pp, dp=1, tp=1, workload=Workload(micro_batches=m), iterations=1)
            n = res.program.ops_per_rank
            assert n.min() >= m  # every stage sends or receives each micro-batch
    # 6D-ish with sequence parallel and distributed optimizer: tp, cp, ep, dp, pp (+ edp)
    res = run_simulation(tp=2, cp=2, ep=2, dp=2, pp=4, workload=Workload(micro_batches=5), iterations=1)
    assert {"tp", "cp", "ep", "dp", "pp"} <= set(res.program.comm_kinds)
    assert any(c.startswith("edp-") for c in res.program.comm_ids)


def test_engine_detects_deadlock():
    with pytest.raises(ConfigError, match="deadlock"):
        run_simulation(pp=4, workload=Workload(micro_batches=6, p2p_order="send-first"), iterations=1)


def test_fault_free_job_has_no_abnormal_op():
    res = run_simulation(tp=2, pp=2, dp=4, iterations=6, seed=3)
    assert not res.abnormal.any()
    assert res.truth().faults == []


def _persistent(device, start=3, factor=3.0, **shape):
    shape = shape or dict(tp=2, pp=2, dp=8)
    return run_simulation(**shape, iterations=6, seed=5, faults=[f"{device}@persistent:{start}*{factor}"])


@pytest.mark.parametrize("device", ["gpu:5", "host:1", "nic:3", "link:nic:3|switch:leaf-3", "nvswitch:0",
                                    "switch:leaf-3", "switch:spine-0"])
def test_every_fault_kind_lengthens_faulted_iterations(device):
    res = _persistent(device, start=3)
    for r in (0, 5, 31):
        slow, base = res.iteration_times(r), res.counterfactual_iteration_times(r)
        assert np.array_equal(slow[:3], base[:3])
        # the rank itself or, one iteration later through the dp/pp waits, every rank is slower
        assert np.all(slow[4:] > base[4:]) and np.all(slow[3:] >= base[3:]), (device, r)
    assert np.all(res.iteration_times(0)[3:] > res.counterfactual_iteration_times(0)[3:]) or device.startswith("switch:spine")
    assert not res.abnormal[:3].any()
    assert res.abnormal[3:].sum() > 0
    truth = res.truth()
    assert truth.devices == [device] and truth.faults[0].iterations == [3, 4, 5]


def test_slow_switch_slows_exactly_the_transfers_crossing_it():
    shape = dict(tp=2, pp=2, dp=8)
    base = run_simulation(**shape, iterations=2, seed=9)
    slow = run_simulation(**shape, iterations=2, seed=9, faults=["switch:leaf-0@persistent:0*2"])
    topo = base.topology

    def xfer(res):
        d = _rows(res)
        out = {}
        keys = np.array([f"{c}#{s}#{o}" for c, s, o in zip(d["comm_id"], d["seq"], d["op"])])
        coll = d["peer"] < 0
        for k in np.unique(keys[coll]):
            sel = keys == k
            out[k] = int(d["end_ns"][sel][0] - d["start_ns"][sel].max())
        return out

    xb, xs = xfer(base), xfer(slow)
    comms = base.meta().communicators

    def crosses(cid):
        ranks = comms[cid].ranks
        if comms[cid].kind == "ep":
            pairs = [(a, b) for i, a in enumerate(ranks) for b in ranks[i + 1:]]
        else:
            pairs = [(ranks[i], ranks[(i + 1) % len(ranks)]) for i in range(len(ranks))]
        return any("switch:leaf-0" in topo.path(a, b) for a, b in pairs if a != b)

    changed = {k.split("#")[0] for k in xb if xs[k] != xb[k]}
    crossing = {c for c in comms if comms[c].kind != "pp" and crosses(c)}
    assert crossing and changed == crossing


def test_compute_fault_only_delays_waiting_peers_and_is_labelled():
    res = run_simulation(tp=2, pp=1, dp=2, iterations=4, seed=1, faults=["gpu:1@persistent:2*3"])
    d = _rows(res)
    ab = d["abnormal"] & (d["iteration"] >= 2)
    # the slow GPU arrives last; its tp peer (rank 0) waits, so rank 0's tp ops are abnormal
    assert ab[(d["rank"] == 0) & (d["comm_id"] == "tp-0")].any()
    assert not d["abnormal"][d["iteration"] < 2].any()


def test_same_seed_same_job_and_other_seed_differs(tmp_path):
    a = holmes.simulate.simulate(tmp_path / "a", tp=2, pp=2, dp=2, iterations=4, seed=11, faults=["nic:3@spike*2"])
    b = holmes.simulate.simulate(tmp_path / "b", tp=2, pp=2, dp=2, iterations=4, seed=11, faults=["nic:3@spike*2"])
    c = holmes.simulate.simulate(tmp_path / "c", tp=2, pp=2, dp=2, iterations=4, seed=12, faults=["nic:3@spike*2"])
    ja, jb, jc = holmes.read_job(a), holmes.read_job(b), holmes.read_job(c)
    for r in range(8):
        assert ja.ops(r).equals(jb.ops(r))
        assert ja.iterations(r).equals(jb.iterations(r))
    assert not ja.ops(0).column("start_ns").equals(jc.ops(0).column("start_ns"))
    assert (a / "truth.json").read_text() == (b / "truth.json").read_text()


def test_job_directory_reads_back(tmp_path):
    out = holmes.simulate.simulate(tmp_path / "job", tp=2, pp=2, dp=2, ep=2, iterations=3, seed=0,
                          faults=["gpu:6@persistent:1*2", "switch:leaf-1@fluctuation*1.5"], drift=1e-3)
    job = holmes.read_job(out)
    assert job.world_size == 8 and job.layout.tp == 2
    assert {c.kind for c in job.communicators.values()} == {"tp", "dp", "ep", "pp"}
    for r in job.available_ranks():
        t = job.ops(r)
        assert t.column("abnormal").type == pa.bool_()
        assert job.iterations(r).num_rows == 3
    assert job.topology is not None and job.topology.num_gpus == 8
    assert [f.device for f in job.truth.faults] == ["gpu:6", "switch:leaf-1"]
    assert job.truth.drift_per_iteration == 1e-3
    meta = json.loads((out / "job.json").read_text())
    assert meta["parallel"]["ep"] == 2 and "communicators" in meta
    with pytest.raises(holmes.JobError):
        holmes.simulate.simulate(out, tp=2, pp=2, dp=2, iterations=1)
    holmes.simulate.simulate(out, tp=2, pp=1, dp=1, iterations=1, overwrite=True)
    assert holmes.read_job(out).available_ranks() == [0, 1]


def test_drift_raises_compute_time_without_labels():
    flat = run_simulation(tp=2, dp=2, iterations=40, seed=2)
    drift = run_simulation(tp=2, dp=2, iterations=40, seed=2, drift=0.005)
    ratio = drift.iteration_times(0) / flat.iteration_times(0)
    assert ratio[-1] > 1.15 and abs(ratio[0] - 1) < 0.02
    assert not drift.abnormal.any()


@pytest.mark.parametrize("spec,msg", [
    ("gpu:5", "expected DEVICE_ID@PATTERN"),
    ("gpu:5@often*2", "pattern 'often'"),
    ("gpu:5@spike*x", "not a number"),
    ("gpu:5@spike*-1", "positive"),
    ("disk:1@spike*2", "kind must be"),
    ("gpu:5@spike:9-3*2", "bad iterations"),
])
def test_faultspec_parse_errors(spec, msg):
    with pytest.raises(ConfigError, match=msg):
        FaultSpec.parse(spec)


def test_faultspec_roundtrip_and_unknown_devices():
    f = FaultSpec.parse("switch:leaf-2@fluctuation:3,5*1.5")
    assert (f.device, f.pattern, f.factor, f.iterations) == ("switch:leaf-2", "fluctuation", 1.5, (3, 5))
    assert FaultSpec.parse(str(f)) == f
    for bad in ("gpu:8@spike*2", "switch:leaf-99@spike*2", "host:3@spike*2", "link:nic:0|nic:1@spike*2"):
        with pytest.raises(ConfigError, match="unknown device|holds no rank"):
            run_simulation(tp=2, pp=2, dp=2, iterations=1, faults=[bad])
    with pytest.raises(ConfigError, match="already has a fault"):
        run_simulation(tp=2, dp=1, iterations=1, faults=["gpu:1@spike*2", "gpu:1@persistent*2"])
    with pytest.raises(LayoutError):
        run_simulation(tp=2, dp=3, ep=2, iterations=1)


def test_patterns():
    specs = [FaultSpec.parse(s) for s in ("gpu:0@spike*2", "gpu:1@fluctuation*2", "gpu:2@persistent*2")]
    for seed in range(20):
        fac = active_factors(specs, 100, seed)
        spike, fluct, pers = fac != 1.0
        assert not spike[0] and 1 <= spike.sum() <= 20
        its = np.flatnonzero(fluct)
        assert len(set(np.diff(its))) == 1 and 6 <= np.diff(its)[0] <= 9
        assert np.all((fac[1][fluct] > 1.0) & (fac[1][fluct] <= 2.0))
        start = np.flatnonzero(pers)[0]
        assert 25 <= start < 50 and pers[start:].all()
    assert np.array_equal(active_factors(specs, 50, 3), active_factors(specs, 50, 3))


def test_cli_simulate(tmp_path, capsys):
    out = tmp_path / "job"
    rc = cli_main(["simulate", "--out", str(out), "--tp", "2", "--pp", "2", "--dp", "2", "--iterations", "3",
                   "--fault", "gpu:5@spike*2.0", "--fault", "nic:2@persistent*3", "--seed", "4"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["world_size"] == 8 and len(summary["faults"]) == 2
    assert holmes.read_job(out).truth.seed == 4
    for bad in (["--fault", "gpu:5@sometimes*2"], ["--fault", "gpu:99@spike*2"], ["--ep", "3"]):
        rc = cli_main(["simulate", "--out", str(tmp_path / "bad"), "--tp", "2", "--pp", "2", "--dp", "2", *bad])
        assert rc == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_fixtures_exist_small_and_match_truth(name):
    path = FIXTURES_DIR / name
    if not path.is_dir():
        pytest.skip("fixtures not generated (python scripts/make_fixtures.py)")
    assert dir_size(path) <= 1 << 20
    job = holmes.read_job(path)
    spec = FIXTURES[name]
    assert job.world_size == spec["tp"] * spec["pp"] * spec["dp"] * spec.get("cp", 1)
    assert [f.device for f in job.truth.faults] == [s.split("@")[0] for s in spec["faults"]]
    abn = sum(int(np.count_nonzero(job.ops(r).column("abnormal").to_numpy(zero_copy_only=False)))
              for r in range(job.world_size))
    assert (abn > 0) == bool(spec["faults"])


def test_1024_gpus_with_every_fault_kind_at_once():
    faults = ["gpu:5@spike*2", "host:3@fluctuation*1.5", "nic:17@persistent:2*3", "link:nic:40|switch:leaf-0@spike*2",
              "nvswitch:2@persistent:1*4", "switch:spine-1@fluctuation*1.5", "switch:leaf-9@persistent:3*2"]
    res = run_simulation(tp=8, pp=4, dp=32, iterations=8, seed=1, faults=faults)
    assert res.world_size == 1024
    assert all(v > 0 for v in res.network.crossed.values()) and len(res.network.crossed) == 5
    truth = res.truth()
    assert sorted(truth.devices) == sorted(f.split("@")[0] for f in faults)
    active = np.zeros(8, bool)
    for f in truth.faults:
        active[f.iterations] = True
    slow, base = res.iteration_times(0), res.counterfactual_iteration_times(0)
    assert np.all(slow >= base) and slow.sum() > base.sum()
    assert res.abnormal[active].sum() > 0
    first = int(np.flatnonzero(active)[0])
    assert not res.abnormal[:first].any()  # before the first fault both runs are identical


def test_fat_tree_topology_and_cli_help(tmp_path, capsys):
    res = run_simulation(tp=2, pp=2, dp=8, iterations=3, topology="fat-tree",
                         faults=["switch:tor-1@persistent:1*3"])
    assert res.topology.kind == "fat-tree" and res.network.crossed["switch:tor-1"] > 0
    assert res.abnormal[1:].any() and not res.abnormal[0].any()
    with pytest.raises(SystemExit):
        cli_main(["simulate", "--help"])
    assert "--fault" in capsys.readouterr().out


def test_a_realistic_job_keeps_its_cost_without_its_twin(tmp_path):
    from holmes.simulate.scenarios import realistic_fault_job

    out = tmp_path / "job"
    path, dev, cost = realistic_fault_job(out, dict(tp=2, pp=2, dp=2), "gpu", "persistent", seed=3,
                                          iterations=8, keep_twin=False)
    assert not out.with_name("job.twin").exists() and (out / "cost.json").is_file()
    again = realistic_fault_job(out, dict(tp=2, pp=2, dp=2), "gpu", "persistent", seed=3, iterations=8)
    assert again == (path, dev, cost) and dev.startswith("gpu:") and cost > 0
    assert not out.with_name("job.twin").exists()  # reused from cost.json, nothing simulated again
