"""The localization pipeline: validated parameters, the Localizer, analyses as plug-ins, verdicts
and confidence."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import holmes
from holmes.errors import ConfigError, HolmesError
from holmes.localize import DeviceScore, Localizer, LocalizeParams, localize
from holmes.localize.evidence.confidence import device_confidence, iteration_weights, network_opportunity, opportunity
from holmes.topology import default_topology


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SLOW_GPU = FIXTURES / "gpu64-3d-slow-gpu"
CLEAN = FIXTURES / "gpu16-clean"


@pytest.mark.parametrize("kw,names", [
    (dict(pivot="a"), "pivot"), (dict(window=None), "window"), (dict(alpha=float("nan")), "alpha"),
    (dict(topology=5), "topology"), (dict(detector=3.5), "detector"), (dict(delta=1.0), "delta"),
    (dict(top_k=0), "top_k"), (dict(method="best"), "method"), (dict(monitors="1,2"), "monitors"),
    (dict(pivot=-1), "pivot"), (dict(min_confidence=2), "min_confidence"), (dict(colour="red"), "colour"),
])
def test_bad_parameters_are_config_errors_naming_the_parameter(kw, names):
    with pytest.raises(ConfigError, match=names) as info:
        LocalizeParams(**kw)
    assert isinstance(info.value, ValueError) and "\n" not in str(info.value)
    with pytest.raises(ConfigError, match=names):
        localize(SLOW_GPU, **kw)


@pytest.mark.parametrize("job", [5, None, 1.5, object()])
def test_a_job_that_is_not_a_job_is_a_holmes_error(job):
    with pytest.raises(HolmesError, match="job"):
        localize(job)


def test_report_params_hold_every_parameter_and_are_strict_json():
    r = localize(SLOW_GPU, delta=1.2, top_k=3)
    assert set(r.params) == set(LocalizeParams.model_fields)
    assert r.params["delta"] == 1.2 and r.params["top_k"] == 3
    text = r.dumps()
    assert json.loads(text)["params"] == r.params
    assert "NaN" not in text and "Infinity" not in text


def test_slow_gpu_fixture_named_with_confidence():
    r = localize(SLOW_GPU)
    assert r.verdict == "culprit" and r.top.id == "gpu:21"
    assert r.top.confidence >= 0.9 and r.top.evidence[0] == "irregular"  # + "persistent" (analysis="all")
    j = r.to_json()
    assert j["verdict"] == "culprit" and j["devices"][0]["confidence"] >= 0.9
    assert "irregular" in j["devices"][0]["evidence"] and j["hang"] is None


def test_clean_fixture_is_healthy_and_names_nothing():
    r = localize(CLEAN)
    assert r.verdict == "healthy" and r.devices == [] and r.candidates == []
    assert r.to_json()["devices"] == [] and "Verdict: healthy" in r.to_text()


def test_localizer_reuses_one_configuration():
    loc = Localizer(top_k=1)
    a, b = loc.localize(SLOW_GPU), loc.localize(str(SLOW_GPU))
    assert [d.id for d in a.devices] == [d.id for d in b.devices] == ["gpu:21"]
    assert loc.params.top_k == 1 and "top_k=1" in repr(loc)
    with pytest.raises(ConfigError):
        Localizer(params={"top_k": 1})
    assert Localizer(LocalizeParams(delta=1.3), top_k=4).params.delta == 1.3


def test_robust_detector_judges_with_the_pipeline_delta():
    r = localize(SLOW_GPU, detector="robust", delta=1.3)
    assert "delta=1.3" in " ".join(r.assumptions)


@dataclass
class _Sel:
    weights: dict


class _NamesGpu3:
    """A toy analysis: names gpu:3 and the slow GPU, with its own evidence kind."""

    name = "toy"

    def select(self, run):
        return _Sel({0: 1.0})

    def gather(self, run, sel):
        return ["gpu:3", "gpu:21"]

    def rank(self, run, ev, sel):
        return [DeviceScore(d, "gpu", 0.5, confidence=0.95, evidence=("toy",)) for d in ev]


def test_an_analysis_plugs_in_and_devices_merge():
    from holmes.localize import IrregularAnalysis

    r = Localizer(analyses=[IrregularAnalysis(), _NamesGpu3()], top_k=5).localize(SLOW_GPU)
    assert r.params["analysis"] == "all"
    by_id = {d.id: d for d in r.all_devices}
    assert set(by_id["gpu:21"].evidence) == {"irregular", "toy"}
    assert by_id["gpu:3"].evidence == ("toy",)
    assert len([d for d in r.all_devices if d.id == "gpu:21"]) == 1
    with pytest.raises(ConfigError):
        Localizer(analyses=[object()])


def test_confidence_against_chance():
    # one clear iteration naming one GPU of 16: 1 - 1/16
    assert device_confidence(1, 1, 1 / 16) == pytest.approx(15 / 16)
    # a device on 90% of the paths, implicated 18 times of 20: not convincing
    assert device_confidence(18, 20, 0.9) < 0.5
    # a GPU blamed in 10 of 20 iterations among 16 GPUs: certain
    assert device_confidence(10, 20, 1 / 16) > 0.999
    assert device_confidence(0, 5, 0.1) == 0.0
    # more evidence never lowers confidence
    xs = [device_confidence(s, 10, 0.2) for s in range(1, 11)]
    assert xs == sorted(xs)
    w = iteration_weights(np.array([0.0, 2.0, 3.0, 4.0, 10.0]), noise_z=3.0)
    assert w.tolist() == [0.0, 0.0, 0.5, 1.0, 1.0]


def test_network_opportunity_makes_shared_devices_cheap():
    job = holmes.read_job(SLOW_GPU)
    topo = default_topology(job.world_size)
    share = network_opportunity(job.communicators, topo)
    assert all(0 < v <= 1 for v in share.values())
    nvs = max(v for d, v in share.items() if d.startswith("nvswitch:"))
    nics = [v for d, v in share.items() if d.startswith("nic:")]
    assert nvs > max(nics)  # a host's NVSwitch carries more of the job's transfers than one NIC
    assert opportunity("gpu:3", 64, topo, share) == 1 / 64
    assert math.isclose(opportunity("host:1", 64, topo, share), 1 / 64)


def test_inconsistent_pivot_log_makes_the_verdict_inconclusive(tmp_path):
    """A pivot whose seq numbers are shifted against its group's: no confident device."""
    import shutil

    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    job = tmp_path / "job"
    shutil.copytree(SLOW_GPU, job)
    f = job / "ranks" / "rank-00000.parquet"
    t = pq.read_table(f)
    t = t.set_column(t.schema.get_field_index("seq"), "seq", pc.add(t.column("seq"), pa.scalar(1000, pa.int64())))
    pq.write_table(t, f)
    r = localize(job)
    assert r.verdict == "inconclusive" and r.devices == []
    assert any("disagree" in a for a in r.assumptions)
