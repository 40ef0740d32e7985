"""Fit ``holmes.detect.relative.RELATIVE_Z`` on the healthy development runs of the real corpora.

For every healthy run (``truth.json`` names no device) of ``fixtures/real``, ``real-loaded`` and
``real-always``, every rank is scored by the shipped detector as ``holmes detect`` scores it (with
the job's cross-rank context), then flagged by :func:`holmes.detect.relative.relative_flags` at each
z of a grid. The fitted z is the smallest whose largest per-job flag rate over the *development*
runs stays at or under ``--target`` minus ``--margin`` (percent of the job's operators); the test
runs are only reported.

Usage::

    python scripts/fit_detect_relative.py            # table per z, last line: fitted_z=...
    python scripts/fit_detect_relative.py --smoke    # two runs per corpus
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
CORPORA = ("real", "real-loaded", "real-always")
GRID = (2.0, 2.5, 3.0, 3.5, 4.0)


def job_scores(job_dir: Path, det) -> list[tuple[object, np.ndarray]]:
    """Per rank, ``(ops, scores)`` as ``holmes detect`` computes them."""
    from holmes.detect import JobContext
    from holmes.io import read_job

    job = read_job(job_dir)
    ranks = job.available_ranks()
    ctx = JobContext.from_job(job, ranks) if det.uses_context() else None
    return [(job.ops(r), det.predict_proba_ops(job.ops(r), iteration_times=job.iteration_times(r), context=ctx))
            for r in ranks]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixtures", default=str(REPO / "fixtures"))
    ap.add_argument("--target", type=float, default=5.0, help="largest flag rate of a healthy job (%%)")
    ap.add_argument("--margin", type=float, default=2.0, help="kept under the target on dev (points)")
    ap.add_argument("--smoke", action="store_true", help="two healthy runs per corpus")
    a = ap.parse_args(argv)
    from holmes.detect import load_default_detector
    from holmes.detect.relative import relative_flags

    det = load_default_detector()
    rates: dict[str, list[tuple[str, float, list[float]]]] = {"dev": [], "test": []}
    print(f"{'run':48s} {'split':5s} {'base %':>7s} " + " ".join(f"{'z=' + format(z, 'g'):>7s}" for z in GRID))
    for corpus in CORPORA:
        root = Path(a.fixtures) / corpus
        runs = [r for r in json.loads((root / "MANIFEST.json").read_text())["runs"] if not r["devices"]]
        for r in runs[:2 if a.smoke else None]:
            scored = job_scores(root / r["name"], det)
            n = sum(s.size for _, s in scored)
            base = 100.0 * sum(int((s >= det.threshold).sum()) for _, s in scored) / n
            per_z = [100.0 * sum(int(relative_flags(s, det.threshold, z=z).sum()) for t, s in scored) / n
                     for z in GRID]
            rates[r["split"]].append((f"{corpus}/{r['name']}", base, per_z))
            print(f"{corpus + '/' + r['name']:48s} {r['split']:5s} {base:7.1f} " + " ".join(f"{x:7.1f}" for x in per_z))
    for split, rows in rates.items():
        if rows:
            worst = np.max([x[2] for x in rows], axis=0)
            print(f"# {split}: {len(rows)} healthy runs; largest flag rate per z: " +
                  " ".join(f"z={z:g}:{w:.1f}%" for z, w in zip(GRID, worst)) +
                  f"; untuned largest {max(x[1] for x in rows):.1f}%")
    dev = rates["dev"] or rates["test"]
    worst_dev = np.max([x[2] for x in dev], axis=0)
    ok = [z for z, w in zip(GRID, worst_dev) if w <= a.target - a.margin]
    fitted = ok[0] if ok else GRID[-1]
    test = rates["test"]
    worst_test = max((x[2][GRID.index(fitted)] for x in test), default=float("nan"))
    print(f"fitted_z={fitted:g} dev_max_flag_pct={worst_dev[GRID.index(fitted)]:.1f} test_max_flag_pct={worst_test:.1f} "
          f"untuned_max_flag_pct={max(x[1] for x in dev + test):.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
