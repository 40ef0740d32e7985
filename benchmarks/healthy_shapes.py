"""Healthy simulated jobs of shapes the other benchmarks do not use: how many does Holmes accuse?

A grid of healthy jobs (no fault) of unseen shapes -- TP 1 or 8, PP up to 8, DP up to 64, with and
without expert parallelism -- times seeds is simulated, and each job is localized on both paths of
the irregular analysis: the whole-job comparison (the default for jobs of at most ``full_read``
ranks) and Algorithm 1 on the detector's labels (forced with ``full_read=0``, the path every job
over 128 ranks takes). A job is *named* when the report names any device; the verdict is printed
beside. Nothing is faulted, so every name is a false accusation.

Prints one row per job and path, then ``healthy_named=<n> healthy_jobs=<n> named_whole=<n>
named_alg1=<n> culprit_verdicts=<n>``.

Usage::

    python benchmarks/healthy_shapes.py             # 8 shapes x 2 seeds, 20 iterations
    python benchmarks/healthy_shapes.py --seeds 3
    python benchmarks/healthy_shapes.py --smoke     # 2 small shapes x 1 seed (CI)
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: shapes no other benchmark uses (localize_accuracy: tp 2-8 x pp 2-4 x dp 4-64 with ep 1; the
#: real corpora: tp 1-4 x pp 2-8 x dp 1-4): tp 1 or 8, pp up to 8, dp up to 64, with and without ep
SHAPES: tuple[dict[str, int], ...] = (
    dict(tp=1, pp=4, dp=64),
    dict(tp=1, pp=8, dp=16),
    dict(tp=8, pp=8, dp=2),
    dict(tp=8, pp=2, dp=8),
    dict(tp=1, pp=2, dp=64, ep=8),
    dict(tp=8, pp=4, dp=4, ep=4),
    dict(tp=1, pp=8, dp=8, ep=4),
    dict(tp=8, pp=1, dp=32, ep=8),
)
SMOKE_SHAPES: tuple[dict[str, int], ...] = (dict(tp=1, pp=4, dp=4), dict(tp=8, pp=2, dp=2, ep=2))
FIRST_SEED = 100


def shape_name(cfg: dict[str, int]) -> str:
    return "-".join(f"{k}{v}" for k, v in cfg.items())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=2, help="seeds per shape (default 2)")
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--smoke", action="store_true", help="2 small shapes x 1 seed, 12 iterations (CI)")
    ap.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                    help="a localize parameter, repeatable (as in localize_accuracy.py)")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    sys.path.insert(0, str(REPO / "benchmarks"))
    import holmes
    from holmes.simulate import simulate
    from localize_accuracy import _params

    extra = _params(a.param)
    shapes = SMOKE_SHAPES if a.smoke else SHAPES
    seeds = range(FIRST_SEED, FIRST_SEED + (1 if a.smoke else a.seeds))
    iterations = 12 if a.smoke else a.iterations
    if a.smoke:
        from _cache import smoke_dir

        root = smoke_dir("healthy_shapes")
    else:
        from _cache import cache_dir

        root = cache_dir("healthy_shapes")
    paths = {"whole": {}, "alg1": {"full_read": 0}}
    named = {k: 0 for k in paths}
    named_jobs = culprits = jobs = 0
    print(f"{'job':36s} {'gpus':>5s} {'path':6s} {'verdict':12s} named devices")
    t0 = time.perf_counter()
    for cfg in shapes:
        for seed in seeds:
            name = f"{shape_name(cfg)}-s{seed}-i{iterations}"
            d = root / name
            if not (d / "job.json").is_file():
                simulate(d, iterations=iterations, seed=seed, overwrite=True, **cfg)
            world = cfg["tp"] * cfg["pp"] * cfg["dp"]
            jobs += 1
            any_named = False
            for path, kw in paths.items():
                rep = holmes.localize(str(d), **{**extra, **kw})
                js = rep.to_json()
                ids = [x["id"] for x in js.get("devices", [])]
                verdict = js.get("verdict") or "-"
                if ids:
                    named[path] += 1
                    any_named = True
                culprits += verdict == "culprit"
                confs = [x.get("confidence") for x in js.get("devices", [])]
                shown = ", ".join(f"{i} ({c:.2f})" if isinstance(c, float) else i for i, c in zip(ids[:4], confs))
                print(f"{name:36s} {world:5d} {path:6s} {verdict:12s} {shown or '-'}", flush=True)
            named_jobs += any_named
    print(f"# {jobs} healthy jobs x {len(paths)} paths in {time.perf_counter() - t0:.1f} s")
    print(f"healthy_named={named_jobs} healthy_jobs={jobs} named_whole={named['whole']} named_alg1={named['alg1']} "
          f"culprit_verdicts={culprits}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
