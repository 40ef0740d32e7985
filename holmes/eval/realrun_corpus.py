"""The real-run corpus: which runs, their dev/test split, and ``MANIFEST.json``.

:func:`corpus_plan` lists the runs of ``python scripts/real_runs.py corpus``: every fault kind
(gpu, host, nic, p2p) x pattern (spike, fluctuation, persistent), ``runs_per_cell`` runs each,
plus ``healthy`` fault-free runs, over varied layouts (8-16 ranks, 4 per virtual host, with and
without ep / sequence parallelism / distributed optimizer). Run ``i`` has seed ``seed0 + i``; the
split is by seed (:func:`split_of`): ``dev`` when ``seed + seed // 12`` is even, so that every
(kind, pattern) cell has runs in both splits. Devices and factors are drawn from
``numpy.random.default_rng(seed)``: compute factors in [1.2, 2.0], network factors in [2, 6].
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from holmes.eval.realrun import RealRunConfig
from holmes.topology import kinds

__all__ = ["LAYOUTS", "ALWAYS_LAYOUTS", "corpus_plan", "always_plan", "split_of", "write_manifest", "read_manifest"]

#: (tp, pp, dp, ep, sequence_parallel, distributed_optimizer) of the corpus layouts.
LAYOUTS: tuple[tuple[int, int, int, int, bool, bool], ...] = (
    (2, 2, 2, 1, False, False),
    (2, 2, 4, 1, False, False),
    (4, 2, 2, 1, False, False),
    (2, 4, 2, 1, False, False),
    (2, 2, 2, 2, False, False),
    (2, 2, 4, 2, True, False),
    (2, 2, 3, 1, False, True),
    (2, 2, 2, 1, True, True),
)
KINDS = ("gpu", "host", "nic", "p2p")
PATTERNS = ("spike", "fluctuation", "persistent")


#: Runs per round of the plan: one per (kind, pattern) cell.
ROUND = len(KINDS) * len(PATTERNS)


def split_of(seed: int) -> str:
    """``"dev"`` when ``seed + seed // 12`` is even, else ``"test"``.

    Run ``i`` of the plan (seed ``i``) is cell ``i % 12`` of round ``i // 12``; adding the round
    flips the parity every round, so every (kind, pattern) cell has runs in both splits (3 + 2)
    and each split holds 30 faulted runs.

    >>> [split_of(s) for s in (0, 12, 24, 1, 13)]
    ['dev', 'test', 'dev', 'test', 'dev']
    """
    s = int(seed)
    return "dev" if (s + s // ROUND) % 2 == 0 else "test"


def _fault(kind: str, pattern: str, cfg: RealRunConfig, rng: np.random.Generator) -> str:
    from holmes.topology.layout import ParallelLayout

    W = cfg.tp * cfg.pp * cfg.dp
    if kind in ("gpu", "host"):
        factor = round(float(rng.uniform(1.2, 2.0)), 2)
    else:
        factor = round(float(rng.uniform(2.0, 6.0)), 1)
    if kind == "gpu" or kind == "nic":
        dev = f"{kind}:{int(rng.integers(W))}"
    elif kind == "host":
        dev = kinds.host(int(rng.integers(W // cfg.gpus_per_host)))
    else:
        lay = ParallelLayout(tp=cfg.tp, pp=cfg.pp, dp=cfg.dp, ep=cfg.ep)
        a = int(rng.integers(W))
        peers = [p for p in (lay.pp_next(a), lay.pp_prev(a)) if p is not None]
        b = int(peers[int(rng.integers(len(peers)))])
        dev = f"p2p:{a}>{b}"
    return f"{dev}@{pattern}*{factor:g}"


def corpus_plan(runs_per_cell: int = 5, healthy: int = 15, *, seed0: int = 0,
                iterations: tuple[int, int] = (30, 40)) -> list[dict[str, Any]]:
    """The runs of the corpus, each ``{"name", "split", "seed", "config": RealRunConfig}``.

    Examples
    --------
    >>> plan = corpus_plan(1, 1)
    >>> len(plan), plan[0]["name"], plan[-1]["config"].faults
    (13, 'r000-gpu-spike-tp2-pp2-dp2', ())
    """
    cells = [(k, p) for k in KINDS for p in PATTERNS]
    items: list[tuple[str, str] | None] = [c for _ in range(runs_per_cell) for c in cells]
    items += [None] * healthy
    plan = []
    for i, item in enumerate(items):
        seed = seed0 + i
        rng = np.random.default_rng([seed, 0xC0A9])
        tp, pp, dp, ep, sp, do = LAYOUTS[(i * 3 + i // len(LAYOUTS)) % len(LAYOUTS)]
        n_it = int(rng.integers(iterations[0], iterations[1] + 1))
        cfg = RealRunConfig(tp=tp, pp=pp, dp=dp, ep=ep, sequence_parallel=sp, distributed_optimizer=do,
                            iterations=n_it, micro_batches=4, seed=seed)
        if item is not None:
            cfg = replace(cfg, faults=(_fault(item[0], item[1], cfg, rng),))
        tag = "healthy" if item is None else f"{item[0]}-{item[1]}"
        plan.append({"name": f"r{i:03d}-{tag}-{cfg.layout_name}", "split": split_of(seed), "seed": seed,
                     "config": cfg})
    return plan


#: (tp, pp, dp) of the always-on corpus: data-parallel degree 1, 2 and 4, 8-16 ranks, 2-4 hosts.
ALWAYS_LAYOUTS: tuple[tuple[int, int, int], ...] = (
    (2, 4, 1), (4, 2, 1), (2, 2, 2), (1, 4, 2), (1, 2, 4), (2, 2, 4), (1, 8, 2), (2, 4, 2),
)
#: (kind, fault side) cells of the always-on corpus; network kinds both as a slower wire and as a
#: late sender (the transfer leaves late: a delay before the operator on the sending side).
ALWAYS_CELLS: tuple[tuple[str, str], ...] = (
    ("gpu", "wire"), ("host", "wire"), ("nic", "wire"), ("nic", "sender"), ("p2p", "wire"), ("p2p", "sender"),
    ("switch", "wire"), ("switch", "sender"),
)


def _always_fault(kind: str, cfg: RealRunConfig, rng: np.random.Generator) -> str | None:
    """A fault active in every logged iteration (``persistent:0``), or None when the layout has no
    transfer the kind could slow (a NIC whose rank sends nothing between hosts, say)."""
    from holmes.eval.realrun import build_topology
    from holmes.topology.layout import ParallelLayout

    W = cfg.tp * cfg.pp * cfg.dp
    lay = ParallelLayout(tp=cfg.tp, pp=cfg.pp, dp=cfg.dp)
    gph = cfg.gpus_per_host
    if kind in ("gpu", "host"):
        factor = round(float(rng.uniform(1.1, 1.6)), 2)
    else:
        factor = round(float(rng.uniform(2.0, 5.0)), 1)
    if kind == "gpu":
        dev = f"gpu:{int(rng.integers(W))}"
    elif kind == "host":
        dev = kinds.host(int(rng.integers(W // gph)))
    else:
        # a rank with a pipeline peer on another host: its NIC (or that pair, or its leaf) carries traffic
        cands = [(a, b) for a in range(W) for b in (lay.pp_next(a), lay.pp_prev(a))
                 if b is not None and a // gph != b // gph]
        if not cands:
            return None
        a, b = cands[int(rng.integers(len(cands)))]
        if kind == "nic":
            dev = f"nic:{a}"
        elif kind == "p2p":
            dev = f"p2p:{a}>{b}"
        else:
            dev = build_topology(W, gph).leaf_of(a)
    return f"{dev}@persistent:0*{factor:g}"


def always_plan(runs_per_cell: int = 5, healthy: int = 10, *, seed0: int = 1000,
                iterations: tuple[int, int] = (20, 26)) -> list[dict[str, Any]]:
    """The always-on corpus (``scripts/real_runs.py corpus --plan always``): faults active in every
    logged iteration, over layouts with 1, 2 and 4 data-parallel replicas.

    GPU and host compute x 1.1-1.6; NIC, one pipeline direction (``p2p``) and leaf switch x 2-5, each
    as a slower wire and as a late sender (``fault_side``); ``healthy`` fault-free runs. Run ``i``
    has seed ``seed0 + i`` and is cell ``i % 8`` of round ``i // 8``; the split is by seed: dev when
    ``seed + seed // 8`` is even, so every cell has runs in both splits.

    Examples
    --------
    >>> plan = always_plan(1, 1)
    >>> len(plan), plan[0]["name"], plan[0]["config"].faults[0].split("@")[1].split("*")[0]
    (9, 'a1000-gpu-wire-tp2-pp4-dp1', 'persistent:0')
    """
    items: list[tuple[str, str] | None] = [c for _ in range(runs_per_cell) for c in ALWAYS_CELLS]
    items += [None] * healthy
    plan = []
    n = len(ALWAYS_CELLS)
    for i, item in enumerate(items):
        seed = seed0 + i
        rng = np.random.default_rng([seed, 0xA1A7])
        fault = None
        for k in range(len(ALWAYS_LAYOUTS)):  # the first layout (from the run's own) where the fault exists
            tp, pp, dp = ALWAYS_LAYOUTS[(i * 3 + i // n + k) % len(ALWAYS_LAYOUTS)]
            n_it = int(rng.integers(iterations[0], iterations[1] + 1))
            cfg = RealRunConfig(tp=tp, pp=pp, dp=dp, iterations=n_it, micro_batches=4, seed=seed,
                                fault_side=item[1] if item else "wire")
            if item is None:
                break
            fault = _always_fault(item[0], cfg, rng)
            if fault is not None:
                cfg = replace(cfg, faults=(fault,))
                break
        tag = "healthy" if item is None else f"{item[0]}-{item[1]}"
        plan.append({"name": f"a{seed}-{tag}-{cfg.layout_name.replace('-sender', '')}",
                     "split": "dev" if (seed + seed // n) % 2 == 0 else "test", "seed": seed, "config": cfg})
    return plan


def write_manifest(root: str | Path, entries: list[dict[str, Any]]) -> Path:
    """Write ``root/MANIFEST.json`` (entries sorted by name)."""
    p = Path(root) / "MANIFEST.json"
    doc = {"schema": "holmes.realrun-manifest/1",
           "split_rule": "(seed + seed // 12) % 2 == 0 -> dev, else test",
           "command": "python scripts/real_runs.py corpus --out " + str(root),
           "runs": sorted(entries, key=lambda e: e["name"])}
    tmp = p.with_name(".MANIFEST.json.partial")
    tmp.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    tmp.replace(p)
    return p


def read_manifest(root: str | Path) -> dict[str, Any]:
    """Read ``root/MANIFEST.json``; a missing or bad file raises :class:`holmes.errors.ConfigError`."""
    from holmes.errors import ConfigError

    p = Path(root) / "MANIFEST.json"
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{p}: no manifest; run `python scripts/real_runs.py corpus --out {root}`") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{p}: unreadable manifest: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("runs"), list):
        raise ConfigError(f"{p}: not a real-run manifest (no 'runs' list)")
    return doc
