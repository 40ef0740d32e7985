"""Topology at scale: building a 16,384-GPU rail-optimized cluster and a first path across it."""

from __future__ import annotations

import statistics
import time

from holmes.topology import rail_optimized


def test_16384_gpus_build_well_under_a_second():
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        t = rail_optimized(16384)
        times.append(time.perf_counter() - t0)
    assert statistics.median(times) < 1.0, times
    t0 = time.perf_counter()
    p = t.path(3, 16384 - 6)  # across rails and pods
    first_path = time.perf_counter() - t0
    assert p[0] == "nic:3" and p[-1] == f"nic:{16384 - 6}" and any(x.startswith("switch:spine-") for x in p)
    assert first_path < 2.0
