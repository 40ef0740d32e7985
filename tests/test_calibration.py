"""The calibrated confidence: the shipped mapping, its file, its effect on wrong confident answers,
and the naming rule it feeds (culprit at >= min_confidence, else inconclusive with candidates)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import holmes
from holmes.calibration.confidence import DEFAULT_PATH, FEATURES, ConfidenceCalibration, device_features
from holmes.errors import ConfigError
from holmes.eval.calibration_data import is_root, job_outcomes
from holmes.localize.pipeline import Localizer
from holmes.localize.report import DeviceScore

REPO = Path(__file__).resolve().parents[1]
DEV = REPO / "fixtures" / "calibration" / "evidence-dev.parquet"


def _constant(p: float) -> ConfidenceCalibration:
    """A calibration that gives every device probability ``p``."""
    return ConfidenceCalibration(features=FEATURES, segments={"all": ((0.0,), (p,))})


def test_shipped_mapping_is_monotone_in_the_evidence():
    cal = ConfidenceCalibration.load()
    for x, y in cal.segments.values():
        assert list(y) == sorted(y) and list(x) == sorted(x)
    for kind, evidence in (("gpu", ("irregular",)), ("nic", ("irregular",)), ("host", ("persistent",))):
        ps = []
        for raw in np.linspace(0.5, 1.0, 26):
            devs = [DeviceScore(f"{kind}:1", kind, 0.6, confidence=float(raw), coverage=0.8, causes=4, evidence=evidence),
                    DeviceScore("gpu:9", "gpu", 0.4, confidence=0.3, coverage=0.2, causes=1, evidence=("irregular",))]
            ps.append(cal.predict_proba(device_features(devs, world_size=16, whole_job=True))[0])
        assert all(b >= a - 1e-12 for a, b in zip(ps, ps[1:])), (kind, ps)
        assert 0.0 < ps[0] <= ps[-1] < 1.0


def test_file_loads_and_round_trips(tmp_path):
    cal = ConfidenceCalibration.load()
    text = DEFAULT_PATH.read_text(encoding="utf-8")
    assert cal.dumps() == text  # what tune.py writes is what loading reads back
    again = ConfidenceCalibration.from_json(json.loads(text))
    assert again == cal
    X = np.random.default_rng(0).normal(size=(50, len(FEATURES)))
    assert np.array_equal(again.predict_proba(X), cal.predict_proba(X))
    (tmp_path / "c.json").write_text(cal.dumps())
    assert ConfidenceCalibration.load(tmp_path / "c.json") == cal
    assert cal.meta["fitted_by"] == "scripts/tune.py" and cal.meta["rows"] > 100


def test_bad_files_raise_config_errors(tmp_path):
    doc = ConfidenceCalibration.load().to_json()
    with pytest.raises(ConfigError, match="not a holmes.confidence-calibration/1"):
        ConfidenceCalibration.from_json(dict(doc, schema="x"))
    with pytest.raises(ConfigError, match="features"):
        ConfidenceCalibration.from_json(dict(doc, features=doc["features"][:-1]))
    with pytest.raises(ConfigError, match="non-decreasing"):
        ConfidenceCalibration.from_json(dict(doc, segments={"all": {"x": [0.0, 1.0], "y": [0.9, 0.1]}}))
    with pytest.raises(ConfigError, match="no 'all' segment"):
        ConfidenceCalibration.from_json(dict(doc, segments={"hang": {"x": [0.0], "y": [0.5]}}))
    with pytest.raises(ConfigError, match="no confidence calibration file"):
        ConfidenceCalibration.load(tmp_path / "absent.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ConfigError, match="unreadable"):
        ConfidenceCalibration.load(tmp_path / "bad.json")


def test_wrong_confident_answers_of_the_dataset_drop_below_naming():
    """The development jobs whose raw evidence named a wrong device first at >= 0.9: under the
    shipped calibration, most are no longer named (and no right answer turns into a wrong one)."""
    table = pq.read_table(DEV)
    cal = ConfidenceCalibration.load()
    dev = table.column("device").to_pylist()
    keep = np.array([d is not None for d in dev])
    X = np.column_stack([np.asarray(table.column(f).to_pylist(), dtype=float) for f in FEATURES])
    proba = np.full(len(dev), np.nan)
    proba[keep] = cal.predict_proba(X[keep])
    raw = {(o["corpus"], o["job"], o["path"]): o for o in job_outcomes(table, None)}
    now = {(o["corpus"], o["job"], o["path"]): o for o in job_outcomes(table, proba)}
    was_wrong = [k for k, o in raw.items() if o["wrong_confident"]]
    assert len(was_wrong) >= 3
    fixed = [k for k in was_wrong if not now[k]["wrong_confident"]]
    assert len(fixed) > len(was_wrong) / 2, (was_wrong, fixed)
    assert sum(o["wrong_confident"] for o in now.values()) < len(was_wrong) / 2
    # a fixed case: its first device's calibrated probability is below 0.9
    k = fixed[0]
    rows = [i for i in range(len(dev)) if (table.column("corpus")[i].as_py(), table.column("job")[i].as_py(),
                                           table.column("path")[i].as_py()) == k and dev[i] is not None]
    wrong_first = rows[0]
    assert not table.column("label")[wrong_first].as_py() and table.column("raw_confidence")[wrong_first].as_py() >= 0.9
    assert proba[wrong_first] < 0.9


def test_culprit_needs_min_confidence_calibrated():
    job = REPO / "fixtures" / "gpu64-3d-slow-gpu"
    sure = Localizer(calibration=_constant(0.95)).localize(job)
    assert sure.verdict == "culprit" and sure.top.id == "gpu:21" and sure.top.confidence == pytest.approx(0.95)
    assert sure.top.evidence_score is not None and sure.top.evidence_score >= 0.9
    unsure = Localizer(calibration=_constant(0.85)).localize(job)
    assert unsure.verdict == "inconclusive" and unsure.devices == []
    assert unsure.candidates and unsure.candidates[0].id == "gpu:21"
    assert unsure.to_json()["candidates"][0]["evidence_score"] == pytest.approx(sure.top.evidence_score, abs=1e-6)
    shipped = holmes.localize(job)
    assert shipped.verdict == "culprit" and shipped.top.id == "gpu:21" and 0.9 <= shipped.top.confidence < 1.0


def test_healthy_job_stays_healthy_whatever_the_calibration():
    assert Localizer(calibration=_constant(0.99)).localize(REPO / "fixtures" / "gpu16-clean").verdict == "healthy"


def test_is_root_accepts_a_nic_cable():
    assert is_root("link:nic:3|switch:leaf-0", ("nic:3",)) and not is_root("link:nic:30|switch:leaf-0", ("nic:3",))
    assert not is_root("host:0", ("gpu:1",))


def test_tune_reproduces_the_shipped_file():
    got = subprocess.run([sys.executable, str(REPO / "scripts" / "tune.py"), "--check"], capture_output=True,
                         text=True, cwd=REPO, timeout=600)
    assert got.returncode == 0, got.stdout[-2000:] + got.stderr[-2000:]
    assert got.stdout.strip().splitlines()[-1].startswith("check=same")


def test_the_fitted_thresholds_are_the_best_of_their_recorded_grids():
    sys.path.insert(0, str(REPO / "scripts"))
    import tune

    from holmes.calibration.thresholds import DEFAULT_PATH as THRESHOLDS, load_thresholds

    doc = json.loads(THRESHOLDS.read_text(encoding="utf-8"))
    fitted = doc["fitted"]["thresholds"]
    assert list(fitted) == list(tune.THRESHOLD_GRID)
    t = load_thresholds()
    for name, rec in fitted.items():
        assert rec["grid"] == list(tune.THRESHOLD_GRID[name]) and getattr(t, name) == rec["chosen"]
        i = rec["grid"].index(rec["chosen"])
        assert len(rec["right"]) == len(rec["grid"]) == len(rec["gain_se"])
        for j, (g, se) in enumerate(rec["gain_se"]):  # a better score, by less than move_se standard errors
            assert rec["utility"][j] <= rec["utility"][i] or g <= doc["fitted"]["move_se"] * se
        # the objective: right answers less wrong_cost per wrong device named first
        assert rec["utility"][i] == rec["right"][i] - doc["fitted"]["wrong_cost"] * rec["wrong_confident"][i]


def test_a_logistic_family_file_round_trips_and_stays_monotone_in_its_score():
    k = len(FEATURES)
    coef = [0.0] * k
    coef[FEATURES.index("logit_evidence")] = 1.0
    cal = ConfidenceCalibration(features=FEATURES, segments={"all": ((-2.0, 0.0, 2.0), (0.1, 0.5, 0.95))},
                                rank_buckets=1, by_path=False,
                                logistic={"mean": (0.0,) * k, "scale": (1.0,) * k, "coef": tuple(coef), "intercept": 0.0})
    again = ConfidenceCalibration.from_json(json.loads(cal.dumps()))
    assert again == cal
    X = np.zeros((3, k))
    X[:, FEATURES.index("logit_evidence")] = [-3.0, 0.0, 5.0]
    assert again.predict_proba(X).tolist() == pytest.approx([0.1, 0.5, 0.95])
    with pytest.raises(ConfigError, match="logistic needs"):
        ConfidenceCalibration(features=FEATURES, segments={"all": ((0.0,), (0.5,))}, logistic={"mean": (0.0,)})


def test_a_later_device_is_never_more_probable_than_the_one_before_it():
    cal = ConfidenceCalibration.load()
    devs = [DeviceScore("gpu:1", "gpu", 0.5, confidence=0.6, coverage=0.5, evidence=("irregular",)),
            DeviceScore("nic:2", "nic", 0.5, confidence=0.999999, coverage=1.0, evidence=("irregular",))]
    out = cal.apply(devs, world_size=16, whole_job=False)
    assert [d.id for d in out] == ["gpu:1", "nic:2"] and out[1].confidence <= out[0].confidence
    assert out[1].evidence_score == 0.999999


def test_a_fifo_given_as_calibration_is_refused_not_read(tmp_path):
    import os

    fifo = tmp_path / "c.json"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="unreadable confidence calibration"):
        ConfidenceCalibration.load(fifo)


def test_a_by_kind_file_maps_compute_and_network_devices_apart_and_round_trips():
    cal = ConfidenceCalibration(features=FEATURES, rank_buckets=1, by_path=False, by_kind=True,
                                segments={"all": ((0.0, 10.0), (0.5, 0.6)), "any-r0-cmp": ((0.0, 10.0), (0.5, 0.95)),
                                          "any-r0-net": ((0.0, 10.0), (0.2, 0.4))})
    again = ConfidenceCalibration.from_json(json.loads(cal.dumps()))
    assert again == cal and again.by_kind
    devs = lambda kind: [DeviceScore(f"{kind}:1", kind, 1.0, confidence=1 - 1e-6, evidence=("irregular",))]  # noqa: E731
    p = {k: float(cal.predict_proba(device_features(devs(k), world_size=8, whole_job=True))[0])
         for k in ("gpu", "host", "nic", "switch")}
    assert p["gpu"] == p["host"] > 0.9 > 0.5 > p["nic"] == p["switch"]
    # a file of an earlier version (no by_kind) reads as before
    doc = json.loads(cal.dumps())
    del doc["by_kind"]
    assert ConfidenceCalibration.from_json(doc).by_kind is False


def test_a_by_scale_file_maps_jobs_beyond_full_read_apart_and_round_trips():
    # the same one-event evidence (1 - 1/2048) means more at 2,048 ranks than in a small job
    cal = ConfidenceCalibration(features=FEATURES, rank_buckets=1, by_path=False, by_scale=True,
                                segments={"all": ((0.0, 10.0), (0.5, 0.6)), "any-r0": ((0.0, 10.0), (0.3, 0.7)),
                                          "any-r0-big": ((0.0, 5.0), (0.6, 0.99))})
    again = ConfidenceCalibration.from_json(json.loads(cal.dumps()))
    assert again == cal and again.by_scale
    dev = [DeviceScore("host:211", "host", 1.0, confidence=1 - 1 / 2048, evidence=("irregular",), causes=1)]
    small, big, edge = (float(cal.predict_proba(device_features(dev, world_size=w, whole_job=False))[0])
                        for w in (16, 2048, 128))
    assert big > 0.9 > small and edge == small
    doc = json.loads(cal.dumps())
    del doc["by_scale"]
    assert ConfidenceCalibration.from_json(doc).by_scale is False


def test_the_calibration_plan_has_2048_gpu_jobs_of_30_iterations_on_their_own_seeds():
    from holmes.eval.calibration_data import sim_plan

    dev, test = sim_plan("dev", 0, 0, 8), sim_plan("test", 0, 0, 8)
    assert [p["cfg"] for p in dev] == [dict(tp=8, pp=8, dp=32)] * 8
    assert {p["iterations"] for p in dev} == {30} and all(p["name"].endswith("_it30") for p in dev)
    assert sum(p["kind"] is None for p in dev) == 2 and len({p["kind"] for p in dev if p["kind"]}) == 6
    assert not {p["seed"] for p in dev} & {p["seed"] for p in test}
    assert {p["iterations"] for p in sim_plan("dev", 2, 1)} == {20}
