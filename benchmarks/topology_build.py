"""Benchmark: build a rail-optimized Clos, route random GPU pairs, derive a parallel layout.

Usage::

    python benchmarks/topology_build.py [--gpus 16384] [--pairs 20000] [--repeats 5] [--seed 0]

Prints a table, then as its last line
``build_ms_median=<ms> path_us_median=<us> path_cached_us_median=<us> ...``:

* build_ms_median      -- ``rail_optimized(gpus)`` wall time, median over repeats
* path_us_median       -- ``path(a, b)`` on a fresh topology, first call for each random pair
                          (includes the per-destination-switch BFS on first use)
* path_cached_us_median-- the same pairs again (path cache hits)
* decay_ms             -- first ``decay`` call (computes C(d) for every switch)
* layout_ms_median     -- a ParallelLayout over ``gpus`` ranks: every group kind + communicators
* fat_tree_build_ms    -- ``fat_tree(gpus)`` wall time, median over repeats
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from holmes.topology import ParallelLayout, fat_tree, rail_optimized  # noqa: E402
from holmes.topology.layout import GROUP_KINDS  # noqa: E402


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1e3


def _layout_for(world: int) -> ParallelLayout:
    tp = 8 if world % 8 == 0 else 1
    pp = 8 if world % (tp * 8) == 0 else 1
    dp = world // (tp * pp)
    ep = 8 if (tp * dp) % 8 == 0 else 1
    return ParallelLayout(tp=tp, pp=pp, dp=dp, ep=ep, etp=1 if ep > 1 else None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=16384)
    ap.add_argument("--pairs", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="CI: tiny sizes, 512 GPUs, 200 pairs, 1 repeat")
    args = ap.parse_args(argv)
    if args.smoke:
        args.gpus, args.pairs, args.repeats = 512, 200, 1
    n = args.gpus

    # warm imports (scipy.sparse.csgraph is imported lazily on the first route)
    warm = rail_optimized(64)
    warm.path(0, 63)
    warm.decay("switch:spine-0")

    builds = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        topo = rail_optimized(n)
        builds.append(_ms(t0))

    rng = random.Random(args.seed)
    pairs = [(rng.randrange(n), rng.randrange(n)) for _ in range(args.pairs)]
    first, cached = [], []
    for a, b in pairs:
        t0 = time.perf_counter()
        topo.path(a, b)
        first.append((time.perf_counter() - t0) * 1e6)
    for a, b in pairs:
        t0 = time.perf_counter()
        topo.path(a, b)
        cached.append((time.perf_counter() - t0) * 1e6)
    t0 = time.perf_counter()
    topo.decay("switch:spine-0")
    decay_ms = _ms(t0)

    layouts = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        lay = _layout_for(n)
        for kind in GROUP_KINDS:
            lay.groups(kind)
        lay.communicators()
        layouts.append(_ms(t0))

    ft = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        ftopo = fat_tree(n)
        ft.append(_ms(t0))

    rows = [
        ("rail_optimized build (ms)", statistics.median(builds), max(builds)),
        ("path first call (us)", statistics.median(first), max(first)),
        ("path cached (us)", statistics.median(cached), max(cached)),
        ("decay first call (ms)", decay_ms, decay_ms),
        (f"layout {lay.tp}x{lay.pp}x{lay.dp} ep{lay.ep} all groups (ms)",
         statistics.median(layouts), max(layouts)),
        ("fat_tree build (ms)", statistics.median(ft), max(ft)),
    ]
    print(f"{n} GPUs: {topo!r}")
    print(f"          {ftopo!r}")
    print(f"{'measure':<45} {'median':>12} {'max':>12}")
    for name, med, mx in rows:
        print(f"{name:<45} {med:>12.2f} {mx:>12.2f}")
    print(
        f"build_ms_median={statistics.median(builds):.1f} "
        f"path_us_median={statistics.median(first):.2f} "
        f"path_cached_us_median={statistics.median(cached):.2f} "
        f"decay_ms={decay_ms:.1f} "
        f"layout_ms_median={statistics.median(layouts):.1f} "
        f"fat_tree_build_ms={statistics.median(ft):.1f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
