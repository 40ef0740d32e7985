"""Localization accuracy on freshly simulated jobs of every fault kind and pattern.

Seeds 41000.. were never used while developing the localizer (the benchmarks use 5000-14000 and
100000+, the development checks 30000). 24 jobs of 2,048 GPUs (tp 8 x pp 8 x dp 32, 20
iterations): each of the six fault kinds with each pattern, the fault strong enough to make
iterations irregular (:func:`holmes.simulate.scenarios.irregular_fault_job`), localized with the
shipped detector.

Why 2,048 GPUs: in a cluster of one or two pods, a cable between a leaf and a spine carries
exactly the transfers its mirror cable (spine to the other pod's leaf of the same rail) carries,
so no log can tell the two apart and Holmes reports them tied. From a few pods up, transfers
to different leaves separate them.
"""

from __future__ import annotations

import pytest

from holmes.localize import localize
from holmes.simulate.scenarios import KINDS, PATTERNS, irregular_fault_job

CFG = dict(tp=8, pp=8, dp=32)
N_JOBS = 24


@pytest.fixture(scope="module")
def fresh_jobs(tmp_path_factory):
    root = tmp_path_factory.mktemp("fresh")
    jobs = []
    for i in range(N_JOBS):
        kind, pattern = KINDS[i % len(KINDS)], PATTERNS[(i // len(KINDS) + i) % len(PATTERNS)]
        path, dev = irregular_fault_job(root / f"job{i}", CFG, kind, pattern, seed=41000 + i, iterations=20)
        jobs.append((path, dev, kind, pattern))
    return jobs


def test_every_fault_kind_and_pattern_is_covered(fresh_jobs):
    assert {k for _, _, k, _ in fresh_jobs} == set(KINDS)
    assert {p for _, _, _, p in fresh_jobs} == set(PATTERNS)


def test_top1_on_fresh_jobs(fresh_jobs):
    misses, wrong_named = [], []
    for path, dev, kind, pattern in fresh_jobs:
        report = localize(path, analysis="irregular")  # the persistent analysis reads every rank
        ranked = report.all_devices
        if not ranked or ranked[0].id != dev:
            misses.append((kind, pattern, dev, [(d.id, round(d.score, 2)) for d in ranked[:3]]))
        if report.top is not None and report.top.id != dev:
            wrong_named.append((kind, pattern, dev, report.top.id, report.top.confidence))
    # the device ranked first: >= 95% over at least 20 jobs (issue target); a miss is printed with
    # what was ranked instead. Whether it is *named* (culprit, calibrated confidence >= 0.9) is the
    # calibration's call: Algorithm 1's single-spike evidence is named less often than it is right
    # (its calibration comes from real jobs forced onto that path), but a wrong device is never named.
    assert len(misses) <= N_JOBS * 0.05, misses
    assert not wrong_named, wrong_named
