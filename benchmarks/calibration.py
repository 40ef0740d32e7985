"""How well the calibrated confidence means what it says, on the test splits of every corpus.

The test jobs of ``fixtures/real``, ``real-loaded``, ``real-always``, ``real-hang`` and realistic
simulated jobs of 64-512 and 2,048 GPUs (:mod:`holmes.eval.calibration_data`; seeds 5000..,
5500.. and 5800..) are
localized on both paths (default; Algorithm 1 forced with ``full_read=0``) with the raw evidence
scores recorded, then the shipped calibration (``holmes/calibration/confidence.json``) is applied
to them exactly as the pipeline applies it (the same features, the same ordering and naming
rule; ``--smoke`` checks this against ``holmes.localize`` itself on its jobs).

Tables printed:

* reliability: the suspicions of every report (both paths; devices the evidence cannot tell
  apart, ``DeviceScore.alike``, are one suspicion, right when any of them is a root cause:
  :func:`holmes.eval.calibration_data.suspicions`) by calibrated confidence bin: how many,
  their mean confidence, the fraction that are a root cause;
* per path and corpus: jobs answered right (``benchmarks/real_accuracy.py``'s scoring: compute
  truth first, network truth in the first two, healthy nothing named) and jobs whose first named
  device (confidence >= 0.9) is wrong, with the calibration and with the raw scores (today's).

Last line: ``ece=<expected calibration error over the suspicions listed> ece_top=<over the first
device of each report> wrong_confident_pct=<% of jobs, default path>
wrong_confident_pct_alg1=<% of jobs, Algorithm 1> raw_wrong_confident_pct=... raw_wrong_confident_pct_alg1=...
right_pct=... raw_right_pct=... jobs=<jobs per path>``.

Usage::

    python benchmarks/calibration.py              # test split, ~20 min on 2 cores (simulates once, cached)
    python benchmarks/calibration.py --cached     # reuse the last dataset built
    python benchmarks/calibration.py --smoke      # CI: 2 jobs of each real corpus, no simulation
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from holmes.calibration.confidence import ConfidenceCalibration  # noqa: E402
from holmes.eval.calibration_data import (CORPORA, build_dataset, calibrated, corpus_jobs, job_outcomes,  # noqa: E402
                                          sim_jobs, suspicions)


def _cache() -> Path:
    env = os.environ.get("HOLMES_CACHE_DIR")
    return (Path(env).expanduser() if env else Path.home() / ".cache" / "holmes") / "calibration"


def reliability(p: np.ndarray, y: np.ndarray, bins: int = 10) -> list[tuple[float, float, int, float, float]]:
    """``(lo, hi, count, mean confidence, observed fraction)`` per non-empty equal-width bin."""
    edges = np.linspace(0, 1, bins + 1)
    b = np.clip(np.digitize(p, edges[1:-1]), 0, bins - 1)
    return [(edges[k], edges[k + 1], int((b == k).sum()), float(p[b == k].mean()), float(y[b == k].mean()))
            for k in range(bins) if (b == k).any()]


def ece(p: np.ndarray, y: np.ndarray, bins: int = 10) -> float:
    """Count-weighted mean |observed - mean confidence| over the bins."""
    rows = reliability(p, y, bins)
    return float(sum(n * abs(o - m) for _, _, n, m, o in rows) / max(len(p), 1))


def _pct(k: int, n: int) -> str:
    return f"{100.0 * k / n:.1f}" if n else "nan"


def _smoke_check(jobs, table, cal) -> None:
    """The replayed decision equals the pipeline's own on the smoke's jobs (names and confidences)."""
    import holmes
    from holmes.eval.calibration_data import PATHS

    proba = calibrated(table, cal)
    outs = {(o["corpus"], o["job"], o["path"]): o for o in job_outcomes(table, proba)}
    for j in jobs:
        for path, extra in PATHS.items():
            rep = holmes.localize(str(j.path), top_k=8, **extra)
            got = [d.id for d in rep.devices]
            want = outs[(j.corpus, j.name, path)]["named"]
            if got != want[:len(got)] or len(got) != min(len(want), 8):
                raise SystemExit(f"calibration: {j.corpus}/{j.name} ({path}): the pipeline names {got}, "
                                 f"the replay {want}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", choices=("test", "dev"), default="test",
                    help="test (report) or dev (what the calibration was fitted on)")
    ap.add_argument("--calibration", default=None, help="a calibration file (default: the shipped one)")
    ap.add_argument("--cached", action="store_true", help="reuse the dataset of the last run of this split")
    ap.add_argument("--sim-small", type=int, default=24, help="simulated 64-128 GPU jobs")
    ap.add_argument("--sim-large", type=int, default=24, help="simulated 256-512 GPU jobs")
    ap.add_argument("--sim-huge", type=int, default=24, help="simulated 2,048-GPU jobs")
    ap.add_argument("--workers", type=int, default=1, help="processes localizing the jobs (the same rows)")
    ap.add_argument("--smoke", action="store_true",
                    help="CI: 2 jobs of each real corpus, no simulation, checked against holmes.localize")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    import pyarrow.parquet as pq

    cal = ConfidenceCalibration.load(a.calibration)
    t0 = time.perf_counter()
    out = _cache() / f"evidence-{a.split}.parquet"
    jobs = []
    if a.cached and out.is_file() and not a.smoke:
        table = pq.read_table(out)
    else:
        for c in CORPORA:
            js = corpus_jobs(a.split, corpora=(c,))
            jobs += js[:2] if a.smoke else js
        if not a.smoke:
            jobs += sim_jobs(a.split, _cache(), n_small=a.sim_small, n_large=a.sim_large, n_huge=a.sim_huge)
        table = build_dataset(jobs, workers=a.workers)
        if not a.smoke:
            out.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(table, out)
    # one row per suspicion (an alike group once, right when any member is: the probability a
    # report gives each member of a group is that the fault is one of them)
    keep, y = suspicions(table)
    proba = calibrated(table, cal)
    raw = np.asarray([np.nan if v is None else v for v in table.column("raw_confidence").to_pylist()], dtype=float)

    print(f"# split {a.split}: {len(set(zip(table.column('corpus').to_pylist(), table.column('job').to_pylist())))} "
          f"jobs, {int(keep.sum())} suspicions, built in {time.perf_counter() - t0:.0f} s")
    print("\n## reliability: suspicions listed (both paths; an alike group once), calibrated confidence vs "
          "observed root causes")
    print(f"{'bin':>11} {'count':>8} {'mean_conf':>9} {'observed':>8} | raw evidence score: {'count':>7} {'observed':>8}")
    rel_raw = {(lo, hi): (n, o) for lo, hi, n, _, o in reliability(np.nan_to_num(raw[keep]), y[keep])}
    bins = {(lo, hi): (n, m, o) for lo, hi, n, m, o in reliability(proba[keep], y[keep])}
    for k in sorted(set(bins) | set(rel_raw)):
        n, m, o = bins.get(k, (0, float("nan"), float("nan")))
        rn, ro = rel_raw.get(k, (0, float("nan")))
        print(f"{k[0]:4.1f}-{k[1]:4.1f}  {n:8d} {m:9.3f} {o:8.3f} | {'':19} {rn:7d} {ro:8.3f}")
    e_all = ece(proba[keep], y[keep])
    firsts = _firsts(table, proba)
    e_top = ece(proba[firsts], y[firsts]) if len(firsts) else float("nan")

    cal_out = job_outcomes(table, proba)
    raw_out = job_outcomes(table, None)
    print("\n## jobs per path and corpus: right / wrong device named first at >= 0.9 (calibrated | raw scores)")
    print(f"{'path':8} {'corpus':12} {'jobs':>5} {'right':>6} {'wrong_conf':>10} | {'right':>6} {'wrong_conf':>10}")
    agg: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    for c, r in zip(cal_out, raw_out):
        for key in ((c["path"], c["corpus"]), (c["path"], "all")):
            s = agg[key]
            s[0] += 1
            s[1] += c["right"]
            s[2] += c["wrong_confident"]
            s[3] += r["right"]
            s[4] += r["wrong_confident"]
    for (path, corpus), s in sorted(agg.items()):
        print(f"{path:8} {corpus:12} {s[0]:5d} {s[1]:6d} {s[2]:10d} | {s[3]:6d} {s[4]:10d}")
    wrong_listed = [f"{c['path']}:{c['corpus']}/{c['job']}->{c['named'][0]}" for c in cal_out if c["wrong_confident"]]
    if wrong_listed:
        print("# wrong and confident: " + " ".join(wrong_listed))
    if a.smoke:
        _smoke_check(jobs, table, cal)
    d, g = agg[("default", "all")], agg[("alg1", "all")]
    tot_right = d[1] + g[1]
    tot_raw = d[3] + g[3]
    print(f"ece={e_all:.4f} ece_top={e_top:.4f} wrong_confident_pct={_pct(d[2], d[0])} "
          f"wrong_confident_pct_alg1={_pct(g[2], g[0])} raw_wrong_confident_pct={_pct(d[4], d[0])} "
          f"raw_wrong_confident_pct_alg1={_pct(g[4], g[0])} right_pct={_pct(tot_right, d[0] + g[0])} "
          f"raw_right_pct={_pct(tot_raw, d[0] + g[0])} jobs={d[0]}")
    return 0


def _firsts(table, proba: np.ndarray) -> np.ndarray:
    """Row index of the most probable device of each (job, path) that lists one."""
    dev = table.column("device").to_pylist()
    keys = list(zip(table.column("corpus").to_pylist(), table.column("job").to_pylist(), table.column("path").to_pylist()))
    best: dict[tuple[str, str, str], int] = {}
    for i, k in enumerate(keys):
        if dev[i] is not None and (k not in best or proba[i] > proba[best[k]]):
            best[k] = i
    return np.asarray(sorted(best.values()), dtype=np.int64)


if __name__ == "__main__":
    raise SystemExit(main())
