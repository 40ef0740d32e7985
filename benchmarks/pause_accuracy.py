"""Job-wide pauses: how often a moment in which the whole job stalled names a device, and what the
pause rule costs real faults (threshold ``pause_ratio``, :mod:`holmes.localize.irregular.pauses`).

Every run of the real corpora (``fixtures/real``, ``real-loaded``, ``real-always``) gets a pause
(:func:`holmes.eval.perturb.job_wide_pause`: every rank slowed 1.3-4x for 60-150 ms from a jittered
moment of one iteration, as a loaded machine or a storage stall shows it) in ``--pauses`` different
iterations and seeds, and is localized at each ``pause_ratio`` of the grid:

* a healthy run that names a device is a false name (``healthy_named_pct``);
* a faulted run is scored as ``benchmarks/real_accuracy.py`` scores it (``fault_hit_pct``).

The development split chooses the ratio (the fewest false names, then the most faults kept, then
the value nearest 1); the test split reports it. The last line is the test split's figure at the
shipped value, beside the rule turned off (0) measured in the same run.

Usage::

    python benchmarks/pause_accuracy.py              # dev fit + test report (~10 min on 2 cores)
    python benchmarks/pause_accuracy.py --smoke      # CI: 2 runs per corpus, 1 pause, 2 ratios
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

CORPORA = ("real", "real-loaded", "real-always")
GRID = (0.0, 0.5, 1.0, 2.0, 4.0)


def _runs(split: str, limit: int | None) -> list[tuple[Path, dict]]:
    out = []
    for name in CORPORA:
        root = REPO / "fixtures" / name
        m = root / "MANIFEST.json"
        if not m.is_file():
            continue
        runs = [r for r in json.loads(m.read_text())["runs"] if r["split"] == split]
        out += [(root / r["name"], r) for r in runs[:limit]]
    return out


def measure(split: str, grid: tuple[float, ...], pauses: int, limit: int | None) -> dict[float, dict[str, list[bool]]]:
    """Per ratio of ``grid``: ``{"healthy": [named...], "fault": [hit...]}`` over the paused runs."""
    import holmes
    from holmes.eval.perturb import job_wide_pause
    from real_accuracy import score

    res = {g: {"healthy": [], "fault": []} for g in grid}
    for d, _ in _runs(split, limit):
        job = holmes.read_job(d)
        truth = json.loads((d / "truth.json").read_text())
        its = job.iterations(job.available_ranks()[0]).column("iteration").to_pylist()
        for k in range(pauses):
            it = its[(len(its) * (k + 2)) // (pauses + 3)]  # spread over the run, past the warm-up
            paused = job_wide_pause(job, it, seed=k)
            for g in grid:
                ids = [x.id for x in holmes.localize(paused, pause_ratio=g).devices]
                cat, hit = score(truth, ids, d)
                res[g]["healthy" if cat == "healthy" else "fault"].append(bool(hit))
    return res


def _pct(v: list[bool]) -> float:
    return 100.0 * sum(v) / len(v) if v else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pauses", type=int, default=2, help="pauses per run (iterations and seeds)")
    ap.add_argument("--smoke", action="store_true", help="CI: 2 runs per corpus, 1 pause, ratios 0 and the shipped one")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    from holmes.calibration.thresholds import load_thresholds

    shipped = float(load_thresholds().pause_ratio)
    limit, pauses = (2, 1) if a.smoke else (None, a.pauses)
    grid = (0.0, shipped) if a.smoke else tuple(sorted(set(GRID) | {shipped}))
    t0 = time.perf_counter()
    dev = measure("dev", grid, pauses, limit)
    print(f"{'pause_ratio':>11s} {'dev healthy named %':>20s} {'dev fault hit %':>16s}   (n healthy / faulted "
          f"= {len(dev[grid[0]]['healthy'])} / {len(dev[grid[0]]['fault'])})")
    for g in grid:
        print(f"{g:11g} {_pct(dev[g]['healthy']):20.1f} {_pct(dev[g]['fault']):16.1f}")
    on = [g for g in grid if g > 0]
    best = min(on, key=lambda g: (sum(dev[g]["healthy"]), -sum(dev[g]["fault"]), abs(g - 1.0)))
    print(f"# dev chooses pause_ratio={best:g} (shipped {shipped:g}); {time.perf_counter() - t0:.0f} s")
    test = measure("test", (0.0, shipped), pauses, limit)
    print(f"# test split (n healthy / faulted = {len(test[0.0]['healthy'])} / {len(test[0.0]['fault'])}); "
          f"{time.perf_counter() - t0:.0f} s in all")
    print(f"healthy_named_pct={_pct(test[shipped]['healthy']):.1f} fault_hit_pct={_pct(test[shipped]['fault']):.1f} "
          f"off_healthy_named_pct={_pct(test[0.0]['healthy']):.1f} off_fault_hit_pct={_pct(test[0.0]['fault']):.1f} "
          f"dev_choice={best:g} shipped={shipped:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
