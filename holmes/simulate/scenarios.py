"""Simulated scenarios: random training jobs for the detector, and single-fault jobs for localization.

:func:`random_scenario` draws the keyword arguments of :func:`holmes.simulate.simulate` for one
random training job (any shape of 2D-6D parallelism, 0-2 faults of any kind and pattern, drift);
:func:`simulate_scenarios` writes many of them. ``scripts/train_default_model.py`` and the detector
benchmarks train and test on these.

**Realistic localization scenarios** (:func:`realistic_fault_job`): one fault of everyday strength
(:data:`REALISTIC_FACTOR`), never amplified, with a fault-free twin to measure what it cost.

**Amplified localization scenarios**: one fault of a given kind and pattern, strong enough to be irregular.

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
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from holmes.errors import ConfigError

__all__ = ["KINDS", "PATTERNS", "BASE_FACTOR", "REALISTIC_FACTOR", "PERSISTENT_FACTOR", "persistent_fault_job", "draw_fault_device", "pivot_irregularity",
           "irregular_fault_job", "realistic_fault_job", "fault_cost", "random_scenario", "simulate_scenarios"]

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
    from holmes.io import read_job

    job = read_job(path)
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
    from holmes.io import read_job
    from holmes.simulate import simulate

    if pattern not in PATTERNS:
        raise ConfigError(f"fault pattern {pattern!r} must be one of {', '.join(PATTERNS)}")
    out = Path(out)
    if reuse and (out / "job.json").is_file() and pivot_irregularity(out) >= min_ratio:
        return out, read_job(out).truth.faults[0].device
    world = int(cfg["tp"]) * int(cfg["pp"]) * int(cfg["dp"]) * int(cfg.get("cp", 1))
    dev = ""
    for attempt in range(max_attempts):
        dev = draw_fault_device(world, kind, seed, attempt)
        factor = BASE_FACTOR[kind]
        for _ in range(max_doublings + 1):
            simulate(out, micro_batches=micro_batches, iterations=iterations, seed=seed,
                     faults=[f"{dev}@{pattern}*{factor:g}"], overwrite=True, **cfg)
            crossing = read_job(out).truth.extra.get("transfer_groups_crossing", {})
            if kind not in ("gpu", "host") and crossing.get(dev, 1) == 0:
                break  # no transfer uses this device: draw another
            if pivot_irregularity(out) >= min_ratio:
                return out, dev
            factor *= 2
    return out, dev


#: everyday fault strengths (never amplified): compute 1.2-2x, transfers 2-6x
REALISTIC_FACTOR = {"gpu": (1.2, 2.0), "host": (1.2, 2.0), "nic": (2.0, 6.0), "nvswitch": (2.0, 6.0),
                    "switch": (2.0, 6.0), "link": (2.0, 6.0)}


def realistic_fault_job(out: str | os.PathLike[str], cfg: dict[str, Any], kind: str | None, pattern: str, seed: int,
                        *, iterations: int = 30, micro_batches: int | None = None,
                        reuse: bool = True, keep_twin: bool = True) -> tuple[Path, str | None, float]:
    """Simulate into ``out`` a job of shape ``cfg`` with one fault of everyday strength; return
    ``(path, device, cost)``.

    The factor is drawn log-uniformly from :data:`REALISTIC_FACTOR` for the kind and never raised,
    whether or not the fault makes an iteration irregular; ``kind=None`` simulates a healthy job
    (device None). ``micro_batches`` defaults to the simulator's own (``max(4, 4 x pp)``, a
    pipeline bubble near Megatron's: with fewer micro-batches than stages the bubble dominates
    the step and a GPU at half speed stretches it by a few percent, which no real job does).
    ``cost`` is what the fault cost the pivot's step: the mean, over the faulted
    iterations, of the step's duration over that of the fault-free twin (same seed, same noise),
    minus one (0.0 for a healthy job). The twin is written beside the job as ``out.twin``; with
    ``keep_twin=False`` it is removed once the cost is known, which ``out/cost.json`` keeps (a
    reused job then needs no twin).

    >>> import tempfile
    >>> path, dev, cost = realistic_fault_job(tempfile.mkdtemp() + "/job", dict(tp=2, pp=2, dp=2),
    ...                                       "gpu", "persistent", seed=1, iterations=8)
    >>> dev.startswith("gpu:") and cost >= 0
    True
    """
    from holmes.io import read_job
    from holmes.simulate import simulate

    if pattern not in PATTERNS:
        raise ConfigError(f"fault pattern {pattern!r} must be one of {', '.join(PATTERNS)}")
    import json
    import shutil

    out = Path(out)
    twin = out.with_name(out.name + ".twin")
    world = int(cfg["tp"]) * int(cfg["pp"]) * int(cfg["dp"]) * int(cfg.get("cp", 1))
    kw = dict(micro_batches=micro_batches, iterations=iterations, seed=seed, overwrite=True, **cfg)
    if kind is None:
        if not (reuse and (out / "job.json").is_file()):
            simulate(out, **kw)
        return out, None, 0.0
    known = out / "cost.json"
    if reuse and known.is_file() and (out / "job.json").is_file():
        try:
            rec = json.loads(known.read_text())
            return out, str(rec["device"]), float(rec["cost"])
        except (ValueError, KeyError, TypeError):
            pass  # simulated again below
    if not (reuse and (twin / "job.json").is_file()):
        simulate(twin, **kw)
    rng = np.random.default_rng([seed, 4242])
    lo, hi = REALISTIC_FACTOR[kind]
    factor = float(np.exp(rng.uniform(np.log(lo), np.log(hi))))
    dev = ""
    for attempt in range(4):
        dev = draw_fault_device(world, kind, seed, attempt)
        if reuse and (out / "job.json").is_file() and read_job(out).truth.faults[0].device == dev:
            break
        simulate(out, faults=[f"{dev}@{pattern}*{factor:.3f}"], **kw)
        crossing = read_job(out).truth.extra.get("transfer_groups_crossing", {})
        if kind in ("gpu", "host") or crossing.get(dev, 1) > 0:
            break
    cost = fault_cost(out, twin)
    known.write_text(json.dumps({"device": dev, "cost": cost}))
    if not keep_twin:
        shutil.rmtree(twin, ignore_errors=True)
    return out, dev, cost


def fault_cost(job_dir: str | os.PathLike[str], twin_dir: str | os.PathLike[str], pivot: int = 0) -> float:
    """Mean relative stretch of the pivot's faulted iterations against the fault-free twin."""
    from holmes.io import read_job

    job, twin = read_job(job_dir), read_job(twin_dir)
    its, dur = job.iteration_times(pivot)
    t_its, t_dur = twin.iteration_times(pivot)
    faulted = sorted({i for f in job.truth.faults for i in f.iterations})
    if not faulted:
        return 0.0
    a = dict(zip(its.tolist(), dur.tolist()))
    b = dict(zip(t_its.tolist(), t_dur.tolist()))
    ratios = [a[i] / b[i] for i in faulted if i in a and i in b and b[i] > 0]
    return float(np.mean(ratios) - 1.0) if ratios else 0.0


# ---------------------------------------------------------------------------- training scenarios
_KIND_P = {"gpu": 0.30, "host": 0.05, "nic": 0.25, "link": 0.12, "nvswitch": 0.05, "switch": 0.23}


def random_scenario(seed: int, *, min_gpus: int = 32, max_gpus: int = 512, iterations: tuple[int, int] = (30, 80),
                    p_fault_free: float = 0.1, p_two_faults: float = 0.25, p_drift: float = 0.3,
                    factor: tuple[float, float] = (1.15, 4.0), gpus_per_host: int = 8,
                    kinds: dict[str, float] | None = None) -> dict[str, Any]:
    """Keyword arguments of :func:`holmes.simulate.simulate` for one random training scenario.

    Deterministic in ``seed``: a hybrid-parallel shape with 2 to 6 parallel dimensions (counting
    micro-batching as one, like the paper's 2D-6D) and ``min_gpus`` .. ``max_gpus`` ranks, 0-2 faults
    on any device kind (gpu, host, nic, link, nvswitch, switch) with any pattern (spike,
    fluctuation, persistent) and a log-uniform factor, and sometimes compute drift. ``kinds`` maps
    device kinds to their relative probability (default: every kind, GPUs and NICs most often); a
    subset focuses the scenarios, e.g. ``{"link": 1, "switch": 1}`` for fabric faults only.

    Examples
    --------
    >>> s = random_scenario(3)
    >>> 32 <= s["tp"] * s["pp"] * s["dp"] * s["cp"] <= 512 and s["seed"] == 3
    True
    """
    from holmes.topology import rail_optimized

    rng = np.random.default_rng([seed, 7211])
    while True:
        tp = int(rng.choice([1, 2, 4, 8]))
        pp = int(rng.choice([1, 2, 4, 8]))
        cp = int(rng.choice([1, 1, 2]))
        dp = int(rng.choice([1, 2, 4, 8, 16, 32]))
        ep = int(rng.choice([e for e in (1, 1, 2, 4) if dp * cp * tp % e == 0 and e <= dp]))
        world = tp * pp * dp * cp
        dims = sum(x > 1 for x in (tp, pp, dp, cp, ep))
        if min_gpus <= world <= max_gpus and dims >= 2 and tp * cp <= gpus_per_host * 2:
            break
    mb = int(max(pp, rng.choice([2, 4, 8])))
    n_it = int(rng.integers(iterations[0], iterations[1] + 1))
    u = rng.random()
    n_faults = 0 if u < p_fault_free else (2 if u < p_fault_free + p_two_faults else 1)
    topo = rail_optimized(-(-world // gpus_per_host) * gpus_per_host, gpus_per_host)
    kp = _KIND_P if kinds is None else kinds
    if not kp or any(k not in _KIND_P for k in kp) or any(not v >= 0 for v in kp.values()) or sum(kp.values()) <= 0:
        raise ConfigError(f"kinds must map some of {sorted(_KIND_P)} to probabilities >= 0, not all 0 (got {kinds!r})")
    kinds, probs = list(kp), np.array([float(v) for v in kp.values()])
    faults = []
    for _ in range(n_faults):
        kind = str(rng.choice(kinds, p=probs / probs.sum()))
        if kind in ("gpu", "nic"):
            dev = f"{kind}:{int(rng.integers(world))}"
        elif kind in ("host", "nvswitch"):
            dev = f"{kind}:{int(rng.integers(-(-world // gpus_per_host)))}"
        else:
            devs = topo.devices(kind)
            dev = str(devs[int(rng.integers(len(devs)))])
        pat = str(rng.choice(["spike", "fluctuation", "persistent"]))
        f = float(np.exp(rng.uniform(np.log(factor[0]), np.log(factor[1]))))
        faults.append(f"{dev}@{pat}*{f:.3f}")
    drift = float(rng.uniform(2e-4, 2e-3)) if rng.random() < p_drift else 0.0
    return {"tp": tp, "pp": pp, "dp": dp, "ep": ep, "cp": cp, "micro_batches": mb, "iterations": n_it,
            "seed": int(seed), "faults": tuple(faults), "drift": drift}


def simulate_scenarios(root: str | os.PathLike[str], seeds: Iterable[int], *, reuse: bool = True,
                       **scenario_kw: Any) -> list[Any]:
    """Simulate :func:`random_scenario` jobs into ``root/job-<seed>``; returns their paths.

    An existing complete job directory (``job.json`` present) is reused when ``reuse``.
    """
    from holmes.simulate import simulate

    out = []
    for s in seeds:
        d = Path(root) / f"job-{int(s):05d}"
        if not (reuse and (d / "job.json").is_file()):
            kw = random_scenario(int(s), **scenario_kw)
            simulate(d, overwrite=True, **kw)
        out.append(d)
    return out


# ---------------------------------------------------------------------- persistent stragglers
#: strengths of a straggler slow from the first iteration (weak compute faults included)
PERSISTENT_FACTOR = {"gpu": (1.1, 2.0), "host": (1.1, 2.0), "nic": (2.0, 6.0), "nvswitch": (2.0, 6.0),
                     "switch": (2.0, 6.0), "link": (2.0, 6.0)}


def persistent_fault_job(out: str | os.PathLike[str], cfg: dict[str, Any], kind: str | None, seed: int, *,
                         iterations: int = 20, micro_batches: int = 2, factor: float | None = None,
                         reuse: bool = True) -> tuple[Path, str | None, float]:
    """Simulate into ``out`` a job with one fault active in *every* iteration (from iteration 0),
    so no iteration is irregular; return ``(path, device, factor)``.

    The factor is drawn log-uniformly from :data:`PERSISTENT_FACTOR` (or given); ``kind=None``
    simulates a healthy job. A network device no transfer crosses is drawn again.

    >>> import tempfile
    >>> path, dev, f = persistent_fault_job(tempfile.mkdtemp() + "/job", dict(tp=2, pp=2, dp=4), "gpu", 1,
    ...                                     iterations=4)
    >>> dev.startswith("gpu:") and 1.1 <= f <= 2.0
    True
    """
    from holmes.io import read_job
    from holmes.simulate import simulate

    out = Path(out)
    kw = dict(micro_batches=micro_batches, iterations=iterations, seed=seed, overwrite=True, **cfg)
    if kind is None:
        if not (reuse and (out / "job.json").is_file()):
            simulate(out, **kw)
        return out, None, 1.0
    if factor is None:
        lo, hi = PERSISTENT_FACTOR[kind]
        factor = float(np.exp(np.random.default_rng([seed, 1616]).uniform(np.log(lo), np.log(hi))))
    world = int(cfg["tp"]) * int(cfg["pp"]) * int(cfg["dp"]) * int(cfg.get("cp", 1))
    dev = ""
    for attempt in range(4):
        dev = draw_fault_device(world, kind, seed, attempt)
        if reuse and (out / "job.json").is_file() and read_job(out).truth.faults[0].device == dev:
            break
        simulate(out, faults=[f"{dev}@persistent:0-{iterations - 1}*{factor:.3f}"], **kw)
        crossing = read_job(out).truth.extra.get("transfer_groups_crossing", {})
        if kind in ("gpu", "host") or crossing.get(dev, 1) > 0:
            break
    return out, dev, float(factor)
