"""Localization scenarios: one fault of a given kind and pattern, strong enough to be irregular.

Holmes (like the paper) explains *delta-irregular* iterations: a fault that does not stretch an
iteration on the monitored rank by ``delta`` (default 10%) is not a slowdown to explain. To
measure localization accuracy, :func:`irregular_fault_job` therefore simulates a job with one
fault whose factor starts at :data:`BASE_FACTOR` for its kind and doubles until a faulted
iteration lasts at least ``min_ratio`` times the pivot's healthy level (its 10th percentile);
a network device that no transfer of the job crosses (a spine cable the routing never uses)
is drawn again. Used by ``benchmarks/localize_accuracy.py`` and the accuracy tests.

Examples
--------
>>> import tempfile
>>> path, dev = irregular_fault_job(tempfile.mkdtemp() + "/job", dict(tp=2, pp=2, dp=4),
...                                 "gpu", "persistent", seed=3, iterations=12)
>>> dev.startswith("gpu:") and pivot_irregularity(path) >= 1.15
True
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from holmes.errors import ConfigError

__all__ = ["KINDS", "PATTERNS", "BASE_FACTOR", "draw_fault_device", "pivot_irregularity", "irregular_fault_job"]

#: fault kinds a scenario can inject (``link`` = a cable between two switches)
KINDS = ("gpu", "host", "nic", "nvswitch", "switch", "link")
PATTERNS = ("spike", "fluctuation", "persistent")
#: starting factor per kind: transfers are a small part of an iteration, compute a large one
BASE_FACTOR = {"gpu": 4.0, "host": 3.0, "nic": 12.0, "nvswitch": 8.0, "switch": 16.0, "link": 60.0}


def draw_fault_device(world: int, kind: str, seed: int, attempt: int = 0) -> str:
    """A device id of ``kind`` in the default topology of ``world`` GPUs, deterministic in
    ``(seed, attempt)``. ``switch`` draws a leaf; ``link`` a cable between two switches.

    >>> draw_fault_device(64, "gpu", 1) == draw_fault_device(64, "gpu", 1)
    True
    """
    from holmes.topology import default_topology

    if kind not in KINDS:
        raise ConfigError(f"fault kind {kind!r} must be one of {', '.join(KINDS)}")
    rng = np.random.default_rng([seed, attempt] if attempt else seed)
    topo = default_topology(world)
    if kind in ("gpu", "nic"):
        return f"{kind}:{int(rng.integers(world))}"
    if kind in ("host", "nvswitch"):
        return f"{kind}:{int(rng.integers(topo.num_hosts))}"
    if kind == "switch":
        pool = [s for s in topo.switches if "leaf" in s]
    else:
        pool = [d for d in topo.devices("link") if d.count("switch:") == 2]
    if not pool:
        raise ConfigError(f"a {world}-GPU default topology has no {kind} to fault")
    return pool[int(rng.integers(len(pool)))]


def pivot_irregularity(path: str | os.PathLike[str], pivot: int = 0) -> float:
    """Longest faulted iteration of ``pivot`` over its 10th-percentile iteration time."""
    import holmes

    job = holmes.read_job(path)
    its, dur = job.iteration_times(pivot)
    faulted = set()
    for f in job.truth.faults:
        faulted.update(f.iterations)
    hit = np.isin(its, sorted(faulted))
    return float(dur[hit].max() / np.percentile(dur, 10)) if hit.any() else 0.0


def irregular_fault_job(out: str | os.PathLike[str], cfg: dict[str, Any], kind: str, pattern: str, seed: int, *,
                        iterations: int = 30, micro_batches: int = 2, min_ratio: float = 1.15,
                        max_doublings: int = 4, max_attempts: int = 4, reuse: bool = True) -> tuple[Path, str]:
    """Simulate into ``out`` a job of shape ``cfg`` (``tp``, ``pp``, ``dp``, ...) with one fault of
    ``kind`` and ``pattern`` that makes the pivot's iterations irregular; return ``(path, device)``.

    An existing job at ``out`` that already meets ``min_ratio`` is reused when ``reuse``. If no
    draw reaches the ratio, the last job simulated is returned (check :func:`pivot_irregularity`).
    """
    import holmes
    from holmes.simulate import simulate

    if pattern not in PATTERNS:
        raise ConfigError(f"fault pattern {pattern!r} must be one of {', '.join(PATTERNS)}")
    out = Path(out)
    if reuse and (out / "job.json").is_file() and pivot_irregularity(out) >= min_ratio:
        return out, holmes.read_job(out).truth.faults[0].device
    world = int(cfg["tp"]) * int(cfg["pp"]) * int(cfg["dp"]) * int(cfg.get("cp", 1))
    dev = ""
    for attempt in range(max_attempts):
        dev = draw_fault_device(world, kind, seed, attempt)
        factor = BASE_FACTOR[kind]
        for _ in range(max_doublings + 1):
            simulate(out, micro_batches=micro_batches, iterations=iterations, seed=seed,
                     faults=[f"{dev}@{pattern}*{factor:g}"], overwrite=True, **cfg)
            crossing = holmes.read_job(out).truth.extra.get("transfer_groups_crossing", {})
            if kind not in ("gpu", "host") and crossing.get(dev, 1) == 0:
                break  # no transfer uses this device: draw another
            if pivot_irregularity(out) >= min_ratio:
                return out, dev
            factor *= 2
    return out, dev
