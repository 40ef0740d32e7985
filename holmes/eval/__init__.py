"""Evaluation code: the baselines Holmes is compared with, the fixture jobs, the real-run harness.

Installed with Holmes for the benchmarks, scripts and tests, but never imported by
:func:`holmes.localize` or any other analysis (an import test checks it). Modules:
:mod:`~holmes.eval.detect_baselines` (3-sigma, KNN, SVM on operator features),
:mod:`~holmes.eval.localize_baselines` (random walk, Seer-like), :mod:`~holmes.eval.fixtures`
(the small jobs under ``fixtures/``).
"""
