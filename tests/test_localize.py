"""End to end: holmes.localize on simulated and hand-built jobs, the Report, the CLI."""

from __future__ import annotations

import json

import pytest

import holmes
from holmes.cli.main import main
from holmes.detect import LabelDetector, RobustDetector
from holmes.errors import ConfigError, JobError
from holmes.io import write_job
from holmes.localize import Report, localize

from test_localize_synth import synth_job


def _sim(spec, *, seed, tp=4, pp=2, dp=4, iterations=24):
    from holmes.simulate import run_simulation

    res = run_simulation(tp=tp, pp=pp, dp=dp, iterations=iterations, seed=seed, faults=[spec])
    return res.to_memory_job()


@pytest.mark.parametrize("spec,device", [
    ("gpu:5@spike:9,15*3", "gpu:5"),
    ("gpu:21@persistent*2", "gpu:21"),
    ("nvswitch:1@spike:8,13*6", "nvswitch:1"),
    ("nic:17@persistent*12", "nic:17"),
])
@pytest.mark.parametrize("detector", ["label", "robust"])
def test_simulated_fault_is_ranked_first(spec, device, detector):
    job = _sim(spec, seed=11)
    # progressive fetching (the persistent analysis reads all; full_read=0: no whole read of a small job)
    r = localize(job, detector=detector, analysis="irregular", full_read=0)
    assert r.irregular_iterations
    assert r.top is not None and r.top.id == device, [(d.id, round(d.score, 3)) for d in r.all_devices[:4]]
    assert len(r.fetched) < job.world_size


def test_host_fault_with_ground_truth_labels():
    # with the model-free robust rule the host is not always first (see the report); with labels it is
    r = localize(_sim("host:2@fluctuation*2.5", seed=11), detector="label")
    assert r.top.id == "host:2"


def test_report_json_has_design_keys_and_round_trips():
    job = _sim("gpu:5@spike:9,15*3", seed=3)
    r = localize(job, detector="label", top_k=3)
    d = json.loads(json.dumps(r.to_json()))
    for key in ("devices", "root_causes", "irregular_iterations", "fetched_ranks", "world_size", "assumptions"):
        assert key in d
    assert d["devices"][0]["id"] == "gpu:5" and set(d["devices"][0]) >= {"id", "kind", "score"}
    assert len(d["devices"]) <= 3
    rc = d["root_causes"][0]
    assert rc["cause"] in ("compute", "network") and isinstance(rc["op"], str) and rc["ranks"]
    assert rc["evidence"] and rc["evidence"][0]["rank"] in rc["ranks"]  # a job read whole: the cell's own op
    searched = localize(job, detector="label", full_read=0).to_json()["root_causes"][0]
    assert searched["evidence"][0]["rank"] == 0  # Algorithm 1: the path starts at the pivot
    assert d["world_size"] == 32 and d["fetched_ranks"] == len(r.fetched)
    assert isinstance(d["assumptions"], list) and d["assumptions"]
    plain = localize(synth_job(tp=2, pp=2, dp=2, iters=12), detector="robust")  # no topology
    assert any("default rail-optimized" in a for a in plain.to_json()["assumptions"])
    assert "gpu:5" in r.to_text()


def test_no_irregular_iteration_reports_nothing():
    job = _sim("gpu:5@spike:9*1.0", seed=4)          # factor 1: no slowdown at all
    r = localize(job, detector="robust")
    assert r.irregular_iterations == [] and r.devices == [] and r.top is None
    assert any("no irregular iteration" in a for a in r.assumptions)
    assert "No anomalous device" in r.to_text()


def test_missing_rank_is_reported_and_localization_goes_on():
    full = synth_job(tp=4, pp=2, dp=4, fault=("gpu", 13, 1.6))
    dropped = synth_job(tp=4, pp=2, dp=4, fault=("gpu", 13, 1.6), drop=(12,))
    r_full = localize(full, detector="label")
    r = localize(dropped, detector="label")
    assert r_full.top.id == "gpu:13"
    assert r.top.id == "gpu:13"
    assert 12 in r.missing and "12" in r.to_json()["missing_ranks"]


def test_bad_arguments_raise_holmes_errors():
    job = synth_job(tp=2, pp=2, dp=2, iters=12)
    with pytest.raises(ConfigError):
        localize(job, pivot=99)
    with pytest.raises(ConfigError):
        localize(job, delta=0.9)
    with pytest.raises(ConfigError):
        localize(job, detector="nonsense")
    with pytest.raises(JobError):
        localize(synth_job(tp=2, pp=2, dp=2, iters=12, drop=(0,)))
    with pytest.raises(JobError):
        localize("/nonexistent/job")


def test_holmes_localize_attribute_is_callable_and_exports_report():
    assert callable(holmes.localize)
    assert isinstance(holmes.localize(synth_job(tp=2, pp=2, dp=2, iters=12), detector="robust"), Report)
    assert LabelDetector().column == "abnormal" and RobustDetector().k > 0


@pytest.fixture
def job_dir(tmp_path):
    from holmes.simulate import simulate

    return simulate(tmp_path / "job", tp=4, pp=2, dp=4, iterations=24, seed=21, faults=["gpu:9@persistent*2.5"])


def test_cli_json_output(job_dir, capsys):
    assert main(["localize", str(job_dir), "--format", "json", "--top", "2", "--detector", "robust",
                 "--analysis", "irregular"]) == 0
    d = json.loads(capsys.readouterr().out)
    # at most --top devices; the host is cleared by its healthy GPUs, so gpu:9 may stand alone
    assert d["devices"][0]["id"] == "gpu:9" and 1 <= len(d["devices"]) <= 2
    assert all(x["id"] != "host:1" for x in d["devices"])
    assert d["world_size"] == 32 and d["fetched_ranks"] == 32  # a job of <= full_read (128) ranks is read whole
    assert not any("default rail-optimized" in a for a in d["assumptions"])  # topology.json was used


def test_cli_text_output(job_dir, capsys):
    assert main(["localize", str(job_dir), "--pivot", "3", "--window", "50", "--delta", "1.08"]) == 0
    out = capsys.readouterr().out
    assert "gpu:9" in out and "Most likely" in out


def test_cli_bad_input_exits_2_with_one_line(tmp_path, capsys):
    assert main(["localize", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holmes localize" in err
    assert main(["localize", str(tmp_path), "--window", "1"]) == 2


def test_job_written_by_other_programs_without_labels(tmp_path):
    """Only schema-v1 columns and no topology/truth: localize must still work (robust rule)."""
    job = synth_job(tp=4, pp=2, dp=4, fault=("gpu", 6, 1.6))
    ops = {r: job.ops(r).drop_columns(["abnormal"]) for r in job.available_ranks()}
    path = write_job(tmp_path / "plain", job.meta, ops)
    r = localize(path, detector="auto")
    assert r.top.id == "gpu:6"


@pytest.mark.parametrize("name", [
    "gpu64-3d-slow-gpu",
    "gpu32-3d-nic-fluctuation",  # read whole (32 ranks): the NIC's channels against their own spread
    "gpu128-4d-slow-leaf"])
def test_fixture_jobs_name_the_injected_device_first(name):
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "fixtures" / name
    if not (path / "job.json").is_file():
        pytest.skip(f"fixture {name} not present")
    job = holmes.read_job(path)
    r = localize(job)
    assert r.top.id == job.truth.devices[0]


def test_clean_fixture_has_no_culprit():
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "fixtures" / "gpu16-clean"
    if not (path / "job.json").is_file():
        pytest.skip("fixture not present")
    r = localize(path)
    assert r.devices == [] and r.verdict == "healthy", [(d.id, d.confidence) for d in r.all_devices[:3]]
    # the paper's delta rule alone finds no irregular iteration; stretch_z may flag one heavy-tail
    # blip of the simulator's noise (+7.5%), which the cells then explain by no device
    assert localize(path, stretch_z=0).irregular_iterations == []


def test_host_spike_is_told_from_a_gpu_by_its_host_mates():
    # one spike iteration gives one compute cause: only the host-mates' compute tells host from GPU
    r = localize(_sim("host:3@spike:12*3", seed=5), detector="label")
    assert r.top.id == "host:3", [(d.id, round(d.score, 3)) for d in r.all_devices[:4]]
    g = localize(_sim("gpu:13@spike:12*3", seed=5), detector="label")
    assert g.top.id == "gpu:13" and all(d.id != "host:3" for d in g.all_devices)


def test_host_verdict_rule():
    from holmes.localize.irregular.host_probe import host_verdict

    assert host_verdict(100.0, [60.0, 55.0, 1.0]) == "host"
    assert host_verdict(100.0, [60.0, 1.0, 1.0]) == "gpu"
    assert host_verdict(100.0, []) is None and host_verdict(0.0, [5.0]) is None
