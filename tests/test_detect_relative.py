"""The detector's flags follow the job's own scores: a healthy real job is not mostly flagged (#36)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from holmes.cli.main import main
from holmes.detect import OperatorDetector, load_default_detector
from holmes.detect.relative import RELATIVE_Z, relative_flags, relative_threshold

REAL = Path(__file__).resolve().parents[1] / "fixtures"


def _flag_pct(out: Path) -> tuple[float, float]:
    t = pq.read_table(out)
    s = t.column("score").to_numpy()
    f = t.column("flagged").to_numpy(zero_copy_only=False)
    return 100.0 * f.mean(), 100.0 * (s >= load_default_detector().threshold).mean()


# test-split healthy runs of the three real corpora (the fit saw only the dev split)
@pytest.mark.parametrize("job", ["real/r064-healthy-tp2-pp2-dp2", "real-loaded/r070-healthy-tp4-pp2-dp2",
                                 "real-always/a1043-healthy-tp1-pp8-dp2"])
def test_holmes_detect_flags_at_most_5pct_of_a_healthy_real_job(job, tmp_path):
    out = tmp_path / "flags.parquet"
    assert main(["detect", str(REAL / job), "--out", str(out), "-q"]) == 0
    pct, absolute = _flag_pct(out)
    assert pct <= 5.0, f"{job}: {pct:.1f}% of the operators flagged"
    assert absolute > 30.0  # the model's threshold alone flags a large share: the rule is what helps


def test_a_simulated_job_keeps_its_flags(tmp_path):
    """A job like the model's training (simulated: normal operators score near 0) keeps every flag
    of the model's threshold, a persistent fault's included, and finds the labelled operators."""
    from holmes.detect import JobContext
    from holmes.io import read_job
    from holmes.simulate import simulate

    d = simulate(tmp_path / "job", tp=2, pp=2, dp=4, iterations=24, seed=11,
                 faults=["gpu:6@persistent*2.5", "nic:3@spike*3"])
    job = read_job(d)
    det = load_default_detector()
    ctx = JobContext.from_job(job, job.available_ranks())
    tp = n_flag = n_abn = 0
    for r in job.available_ranks():
        t = job.ops(r)
        s = det.predict_proba_ops(t, iteration_times=job.iteration_times(r), context=ctx)
        f = OperatorDetector(relative=True, threshold=det.threshold).flag_scores(t, s)
        y = t.column("abnormal").to_numpy(zero_copy_only=False)
        assert np.array_equal(f, s >= det.threshold), r
        tp, n_flag, n_abn = tp + int((f & y).sum()), n_flag + int(f.sum()), n_abn + int(y.sum())
    assert n_abn > 0 and 2 * tp / (n_flag + n_abn) > 0.9


def test_relative_threshold_keeps_the_model_threshold_on_a_job_like_its_training():
    sim_like = np.r_[np.zeros(900), np.full(100, 0.6)]
    assert relative_threshold(sim_like, 0.225) == 0.225
    assert relative_flags(sim_like, 0.225).sum() == 100
    wide = np.linspace(0.0, 1.0, 1001)
    assert relative_threshold(wide, 0.225) > 0.9 and relative_flags(wide, 0.225, z=RELATIVE_Z).sum() < 60
    assert relative_threshold(np.array([]), 0.3) == 0.3


def test_relative_is_a_parameter_saved_with_the_model(tmp_path):
    det = load_default_detector()
    assert det.relative is False  # Algorithm 1 follows the model's own flags; holmes detect turns it on
    det.relative = True
    det.save(tmp_path / "m")
    assert OperatorDetector.load(tmp_path / "m").relative is True
