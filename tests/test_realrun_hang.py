"""Real hung runs (issue #34): the harness's hang injection, its plan, and the localization of the
corpus's test split (culprit set exact, no waiting rank named, deadlocks called deadlocks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import holmes
from holmes.errors import ConfigError
from holmes.eval.realrun import RealRunConfig
from holmes.eval.realrun_hang import HANG_CELLS, HangSpec, hang_plan, run_hang_job, score_hang

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "real-hang"


def test_plan_covers_every_cell_stage_and_split():
    plan = hang_plan(4)
    assert {(p["hang"].mode, p["split"]) for p in plan} == {(m, s) for m in ("stop", "exit", "deadlock")
                                                             for s in ("dev", "test")}
    assert {p["hang"].op for p in plan} >= {"step", "send", "recv", "all_reduce"}
    for p in plan:
        cfg = p["config"]
        assert 8 <= cfg.tp * cfg.pp * cfg.dp <= 32 and 2 <= cfg.pp <= 4
    # the hung rank sits at every pipeline stage of the 4-stage layouts
    stages = {int(p["name"].rsplit("-s", 1)[1]) for p in plan if p["config"].pp == 4}
    assert stages == {0, 1, 2, 3}
    assert len(plan) == 4 * len(HANG_CELLS)


def test_bad_specs_are_config_errors():
    cfg = RealRunConfig(tp=2, pp=2, dp=2, iterations=6)
    with pytest.raises(ConfigError, match="mode"):
        HangSpec("freeze", 0, 1).check(cfg)
    with pytest.raises(ConfigError, match="outside"):
        HangSpec("stop", 8, 1).check(cfg)
    with pytest.raises(ConfigError, match="next pipeline stage"):
        HangSpec("deadlock", 0, 1, "recv", peer=1).check(cfg)
    with pytest.raises(ConfigError, match="op"):
        HangSpec("stop", 0, 1, "barrier").check(cfg)


@pytest.mark.torch
def test_a_rank_stopped_before_its_send_is_the_only_culprit(tmp_path):
    pytest.importorskip("torch")
    cfg = RealRunConfig(tp=1, pp=2, dp=2, gpus_per_host=2, iterations=4, warmup=1, timeout=20.0, tokens=32,
                        hidden=32, ffn=64)
    spec = HangSpec("stop", 0, 2, "send", 1)
    out = run_hang_job(tmp_path / "job", cfg, spec)
    truth = json.loads((out / "truth.json").read_text())
    assert truth["devices"] == ["gpu:0"] and truth["extra"]["hang"]["culprits"] == [0]
    job = holmes.read_job(out)
    assert job.dump is not None
    report = holmes.localize(job, analysis="hang")
    s = score_hang(report, spec)
    assert s["exact"] and not s["waiting_named"] and s["deadlock_right"]
    # its pipeline peer waits in a recv from it: P2P in flight in the logger's own dump
    assert any(c["op"] == "recv" and c["missing"] == [0] for c in report.hang["communicators"])


@pytest.mark.skipif(not (CORPUS / "MANIFEST.json").is_file(), reason="no hang corpus in fixtures/real-hang")
def test_corpus_test_split_is_localized_exactly():
    runs = [e for e in json.loads((CORPUS / "MANIFEST.json").read_text())["runs"] if e["split"] == "test"]
    assert len(runs) >= 7
    for e in runs:
        h = e["hang"]
        spec = HangSpec(h["mode"], h["rank"], h["iteration"], h["op"], h["nth"], h["peer"])
        s = score_hang(holmes.localize(str(CORPUS / e["name"]), analysis="hang"), spec)
        assert s["exact"] and not s["waiting_named"] and s["deadlock_right"], (e["name"], s)
