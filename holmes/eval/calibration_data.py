"""The evidence dataset the confidence calibration is fitted on and checked against.

For every job of a split of every corpus the project has -- real runs idle (``fixtures/real``),
under load (``fixtures/real-loaded``), with faults active in every iteration
(``fixtures/real-always``), hung (``fixtures/real-hang``), and realistic simulated jobs of 64-512
and 2,048 GPUs (:func:`sim_plan`, simulated once into a cache) -- :func:`build_dataset` localizes the job on
both paths (``"default"``; ``"alg1"``: Algorithm 1 forced with ``full_read=0``) with the raw
evidence scores as confidences, and records one row per device of the report's ranked list: the
features the calibration reads (:func:`holmes.calibration.confidence.device_features`, computed
inside the pipeline by a recording calibration, so exactly what it sees at run time), the raw
confidence, and the label: whether the device is a root cause (:func:`accepted`). A job whose
report implicates no device has one row with a null ``device``.

Splits follow the corpora's own rules (each ``MANIFEST.json``'s ``split``; simulated jobs by seed
range, as ``benchmarks/localize_accuracy.py --realistic --small``): fit on ``dev``, report on
``test``.

:func:`job_outcomes` replays the pipeline's decision on the rows of each job under a calibration:
the devices ordered by calibrated probability, those at ``min_confidence`` or above named, the job
scored as ``benchmarks/real_accuracy.py`` scores it (compute: the truth first; network: in the
first two; healthy: nothing named).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from holmes.calibration.confidence import FEATURES, MAX_PLACE, device_features

__all__ = ["CORPORA", "JobEntry", "corpus_jobs", "sim_plan", "accepted", "is_root", "indistinguishable",
           "build_dataset", "relabel", "calibrated", "load_or_build", "job_outcomes", "suspicions", "PATHS"]

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
#: the fixture corpora: name -> directory under the repository (each with ``MANIFEST.json``)
CORPORA = {"real": "fixtures/real", "real-loaded": "fixtures/real-loaded", "real-always": "fixtures/real-always",
           "real-hang": "fixtures/real-hang"}
#: the two paths a job is localized on: name -> extra localize parameters
PATHS = {"default": {}, "alg1": {"full_read": 0}}
#: simulated layouts: 64-128 GPUs (``localize_accuracy.py --small``'s) and 256-512 GPUs, beyond ``full_read``
SIM_SMALL = ((2, 4, 8), (4, 4, 4), (8, 4, 4), (2, 8, 4), (4, 2, 8), (8, 2, 4))
SIM_LARGE = ((4, 4, 16), (8, 4, 8), (2, 8, 32), (8, 8, 8))
#: the 2,048-GPU layout (``localize_accuracy.py --realistic``'s): Algorithm 1's evidence at the
#: scale it is built for (a one-event fault's tail there is ``1 - 1/2048``, not a small job's)
SIM_HUGE = ((8, 8, 32),)
#: iterations of the simulated jobs (``holmes simulate``'s own), and of the 2,048-GPU ones
#: (``localize_accuracy.py --realistic``'s)
SIM_ITERATIONS, SIM_HUGE_ITERATIONS = 20, 30
#: first seed of each split of the simulated jobs (small, large, 2,048 GPUs)
SIM_SEED = {"dev": (4_000, 4_500, 4_800), "test": (5_000, 5_500, 5_800)}
NETWORK_KINDS = ("nic", "p2p", "link", "switch", "nvswitch")


@dataclass(frozen=True)
class JobEntry:
    """One labelled job: where it is, its corpus and split, and what is true about it."""

    corpus: str
    name: str
    path: Path
    split: str
    fault_kind: str  # gpu, host, nic, p2p, switch, link, nvswitch, hang, or healthy
    truth: tuple[str, ...]  # the devices a report may name (see accepted)
    cost: float | None = None  # simulated: what the fault cost the pivot's step (None: unknown)


def _truth_kind(truth: dict[str, Any]) -> tuple[str, str | None]:
    faults = truth.get("faults") or []
    extra = truth.get("extra") or {}
    if extra.get("hang"):
        return "hang", None
    if not faults:
        return "healthy", None
    dev = faults[0]["device"]
    more = {e.get("device"): e for e in (extra.get("faults") or [])}
    return (more.get(dev) or {}).get("kind") or dev.split(":", 1)[0], dev


def indistinguishable(job_dir: str | Path, device: str) -> set[str]:
    """The devices crossed by exactly the transfers that cross ``device`` (ring hops of each
    collective, both directions of each pipeline pair): no log of the job tells them apart
    (``benchmarks/real_accuracy.py``'s rule)."""
    from holmes.io import read_job
    from holmes.topology import ClusterTopology

    job_dir = Path(job_dir)
    if not (job_dir / "topology.json").is_file():
        return {device}
    topo = ClusterTopology.load(job_dir / "topology.json")
    hops: set[tuple[int, int]] = set()
    for c in read_job(job_dir).communicators.values():
        ranks = [int(r) for r in c.ranks]
        if c.kind == "pp":
            hops |= {(a, b) for a, b in zip(ranks, ranks[1:])} | {(b, a) for a, b in zip(ranks, ranks[1:])}
        elif len(ranks) > 1:
            rs = sorted(ranks)
            hops |= {(rs[i], rs[(i + 1) % len(rs)]) for i in range(len(rs))}
    crossing: dict[str, set[tuple[int, int]]] = {}
    for h in hops:
        for d in topo.path(*h):
            crossing.setdefault(d, set()).add(h)
    mine = crossing.get(device)
    return {d for d, hs in crossing.items() if hs == mine} if mine else {device}


def accepted(job_dir: str | Path, truth: dict[str, Any]) -> tuple[str, tuple[str, ...]]:
    """``(fault kind, devices that are a root cause)`` of a labelled job.

    Compute faults: the device. One pipeline direction (``p2p``): every device of its path. A
    NIC, switch, cable or NVSwitch: every device no log can tell apart from it
    (:func:`indistinguishable`: the NIC at the other end of the only transfers a NIC carries; a
    NIC's own cable always, :func:`is_root`). A hang: its culprit ranks' GPUs. Healthy: none.
    """
    kind, dev = _truth_kind(truth)
    if kind == "hang":
        return kind, tuple(f"gpu:{int(r)}" for r in truth["extra"]["hang"].get("culprits", []))
    if dev is None:
        return kind, ()
    if kind in ("gpu", "host"):
        return kind, (dev,)
    if kind == "p2p":
        more = {e.get("device"): e for e in ((truth.get("extra") or {}).get("faults") or [])}
        return kind, tuple((more.get(dev) or {}).get("path") or [dev])
    return kind, tuple(sorted(indistinguishable(job_dir, dev) | {dev}))


def relabel(table: Any, sim_cache: Path | None, *, root: Path = REPO) -> Any:
    """``table`` with ``truth`` and ``label`` computed again from each job's ``truth.json`` (after
    a change of :func:`accepted`; the localizations are kept)."""
    import pyarrow as pa

    truths: dict[tuple[str, str], tuple[str, ...]] = {}
    for c, j in set(zip(table.column("corpus").to_pylist(), table.column("job").to_pylist())):
        jd = (sim_cache / j) if c == "sim" else root / CORPORA[c] / j
        truths[(c, j)] = accepted(jd, json.loads((jd / "truth.json").read_text(encoding="utf-8")))[1]
    keys = list(zip(table.column("corpus").to_pylist(), table.column("job").to_pylist()))
    dev = table.column("device").to_pylist()
    table = table.set_column(table.schema.get_field_index("truth"), "truth",
                             pa.array([",".join(truths[k]) for k in keys], pa.string()))
    return table.set_column(table.schema.get_field_index("label"), "label",
                            pa.array([None if d is None else is_root(d, truths[k]) for d, k in zip(dev, keys)],
                                     pa.bool_()))


def is_root(device: str, truth: Sequence[str]) -> bool:
    """Whether ``device`` is one of ``truth`` or the own cable of a NIC in it.

    >>> is_root("link:nic:3|switch:leaf-0", ["nic:3"]), is_root("gpu:3", ["nic:3"])
    (True, False)
    """
    if device in truth:
        return True
    if device.startswith("link:"):
        ends = device[5:].split("|")
        return any(t.startswith("nic:") and t in ends for t in truth)
    return False


def corpus_jobs(split: str, *, corpora: Sequence[str] = tuple(CORPORA), root: Path = REPO) -> list[JobEntry]:
    """The labelled jobs of ``split`` (``dev``, ``test`` or ``all``) of the fixture corpora."""
    out = []
    for c in corpora:
        d = root / CORPORA[c]
        man = json.loads((d / "MANIFEST.json").read_text(encoding="utf-8"))
        for r in man["runs"]:
            if split != "all" and r["split"] != split:
                continue
            jd = d / r["name"]
            kind, truth = accepted(jd, json.loads((jd / "truth.json").read_text(encoding="utf-8")))
            out.append(JobEntry(c, r["name"], jd, r["split"], kind, truth))
    return out


def sim_plan(split: str, n_small: int, n_large: int, n_huge: int = 0) -> list[dict[str, Any]]:
    """The simulated jobs of ``split``: ``n_small`` of 64-128 GPUs, ``n_large`` of 256-512,
    ``n_huge`` of 2,048, each ``{"name", "cfg", "kind" (None: healthy), "pattern", "seed",
    "iterations"}``; a quarter healthy, the faulty ones cycling over the kinds and patterns of
    :mod:`holmes.simulate.scenarios`. Jobs of 20 iterations (``holmes simulate``'s own), the
    2,048-GPU ones of 30 (``localize_accuracy.py --realistic``'s).

    >>> [p["name"] for p in sim_plan("dev", 2, 1)]
    ['sim_64_gpu_spike_s4000', 'sim_64_healthy_fluctuation_s4001', 'sim_256_healthy_spike_s4500']
    """
    from holmes.simulate.scenarios import KINDS, PATTERNS

    plan = []
    tiers = ((SIM_SMALL, n_small, SIM_SEED[split][0], SIM_ITERATIONS),
             (SIM_LARGE, n_large, SIM_SEED[split][1], SIM_ITERATIONS),
             (SIM_HUGE, n_huge, SIM_SEED[split][2], SIM_HUGE_ITERATIONS))
    for layouts, n, seed0, iterations in tiers:
        faulty = n - max(1, n // 4) if n > 1 else 0
        for i in range(n):
            kind = KINDS[i % len(KINDS)] if i < faulty else None
            pattern = PATTERNS[(i // len(KINDS) + i) % len(PATTERNS)]
            tp, pp, dp = layouts[(i * 5 + seed0) % len(layouts)]
            seed = seed0 + i
            plan.append({"name": f"sim_{tp * pp * dp}_{kind or 'healthy'}_{pattern}_s{seed}"
                                 + ("" if iterations == SIM_ITERATIONS else f"_it{iterations}"),
                         "cfg": dict(tp=tp, pp=pp, dp=dp), "kind": kind, "pattern": pattern, "seed": seed,
                         "iterations": iterations})
    return plan


def sim_jobs(split: str, cache: Path, *, n_small: int = 24, n_large: int = 24, n_huge: int = 24) -> list[JobEntry]:
    """The simulated jobs of :func:`sim_plan`, simulated into ``cache`` when not there yet
    (everyday fault strength: :func:`holmes.simulate.scenarios.realistic_fault_job`)."""
    from holmes.simulate.scenarios import realistic_fault_job

    out = []
    for p in sim_plan(split, n_small, n_large, n_huge):
        path, dev, cost = realistic_fault_job(cache / p["name"], p["cfg"], p["kind"], p["pattern"], p["seed"],
                                              iterations=p["iterations"], keep_twin=False)
        truth = json.loads((path / "truth.json").read_text(encoding="utf-8"))
        kind, acc = accepted(path, truth)
        out.append(JobEntry("sim", p["name"], path, split, kind, acc, cost))
    return out


class _Recorder:
    """A calibration that changes nothing and keeps the features of the last report's devices."""

    def __init__(self) -> None:
        self.devices: list[Any] = []
        self.X = np.zeros((0, len(FEATURES)))

    def apply(self, devices: Sequence[Any], *, world_size: int, whole_job: bool) -> list[Any]:
        self.devices = list(devices)
        self.X = device_features(self.devices, world_size=world_size, whole_job=whole_job)
        return self.devices


def job_rows(job: JobEntry, path: str, *, top: int = 8, **params: Any) -> list[dict[str, Any]]:
    """The rows of one job on one path (see the module docstring)."""
    from holmes.localize.pipeline import Localizer

    rec = _Recorder()
    base = {"corpus": job.corpus, "job": job.name, "split": job.split, "path": path, "fault_kind": job.fault_kind,
            "truth": ",".join(job.truth), "cost": job.cost}
    t0 = time.perf_counter()
    try:
        rep = Localizer(calibration=rec, top_k=top, **PATHS[path], **params).localize(str(job.path))
    except Exception as exc:  # noqa: BLE001 - a dataset records a failed job and goes on
        log.warning("calibration data: %s/%s (%s) failed: %s", job.corpus, job.name, path, exc)
        return [dict(base, device=None, verdict=f"error:{type(exc).__name__}", blocked=False, seconds=0.0)]
    secs = time.perf_counter() - t0
    min_conf = float(rep.params.get("min_confidence", 0.9))
    # the report could name none of its devices for another reason (logs it cannot trust)
    blocked = not rep.devices and any(d.confidence is not None and d.confidence >= min_conf for d in rec.devices)
    common = dict(base, verdict=rep.verdict, blocked=blocked, seconds=round(secs, 3))
    if not rec.devices:
        return [dict(common, device=None)]
    rows = []
    for i, d in enumerate(rec.devices[:top]):
        row = dict(common, device=d.id, kind=d.kind, raw_rank=i, raw_confidence=d.confidence,
                   label=is_root(d.id, job.truth))
        row.update({f: float(v) for f, v in zip(FEATURES, rec.X[i])})
        rows.append(row)
    return rows


def _job_on_paths(args: tuple[JobEntry, Sequence[str], dict[str, Any]]) -> list[dict[str, Any]]:
    job, paths, params = args
    return [r for p in paths for r in job_rows(job, p, **params)]


def build_dataset(jobs: Sequence[JobEntry], *, paths: Sequence[str] = tuple(PATHS),
                  progress: Callable[[str], None] | None = None, workers: int = 1, **params: Any) -> Any:
    """The rows of every job on every path as a :class:`pyarrow.Table` (``workers`` > 1:
    localized in that many processes; the same rows in the same order)."""
    import pyarrow as pa

    rows: list[dict[str, Any]] = []
    tasks = [(j, tuple(paths), params) for j in jobs]
    with contextlib.ExitStack() as stack:
        done: Iterator[list[dict[str, Any]]] = map(_job_on_paths, tasks)
        if workers > 1 and len(jobs) > 1:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            ex = stack.enter_context(ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")))
            done = ex.map(_job_on_paths, tasks)
        for j, got in zip(jobs, done):
            rows += got
            if progress is not None:
                progress(f"{j.corpus}/{j.name}")
    cols = ["corpus", "job", "split", "path", "fault_kind", "truth", "cost", "verdict", "blocked", "seconds",
            "device", "kind", "raw_rank", "raw_confidence", "label", *FEATURES]
    types = {"cost": pa.float64(), "raw_rank": pa.int32(), "raw_confidence": pa.float64(), "label": pa.bool_(),
             "blocked": pa.bool_(), "seconds": pa.float64(), **{f: pa.float64() for f in FEATURES}}
    return pa.table({c: pa.array([r.get(c) for r in rows], type=types.get(c, pa.string())) for c in cols})


def load_or_build(split: str, out: Path, *, sim_cache: Path | None, n_small: int = 24, n_large: int = 24,
                  n_huge: int = 24, rebuild: bool = False, progress: Callable[[str], None] | None = None,
                  workers: int = 1) -> Any:
    """The dataset of ``split`` from ``out`` (parquet), built and written there first when absent
    or ``rebuild``; ``sim_cache`` None leaves the simulated jobs out."""
    import pyarrow.parquet as pq

    if out.is_file() and not rebuild:
        return pq.read_table(out)
    jobs = corpus_jobs(split)
    if sim_cache is not None and (n_small or n_large or n_huge):
        jobs += sim_jobs(split, sim_cache, n_small=n_small, n_large=n_large, n_huge=n_huge)
    table = build_dataset(jobs, progress=progress, workers=workers)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    pq.write_table(table, tmp)
    tmp.replace(out)
    return table


def suspicions(table: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(first, label)`` per row: ``first`` marks one row per suspicion of each report, ``label``
    whether that suspicion is a root cause.

    A report lists the devices its evidence cannot tell apart (``DeviceScore.alike``: the NICs at
    the two ends of the only transfers both carry) at one place, and each gets the group's
    probability: that the fault is one of them. So a group is one suspicion, right when any
    member is a root cause; it is fitted and scored once (its first row), not once per member
    (a network fault's group of NIC, cable and partner NIC would count three times, and its
    partner as a wrong answer at the group's confidence). Members share the ``rank`` feature
    (the group's place); places from ``MAX_PLACE`` on are capped there, so each of those rows is
    its own suspicion. Rows naming no device are no suspicion.

    >>> import pyarrow as pa
    >>> t = pa.table({"corpus": ["s"] * 4, "job": ["j"] * 4, "path": ["alg1"] * 4,
    ...               "device": ["nic:1", "nic:5", "gpu:0", None], "rank": [0.0, 0.0, 1.0, None],
    ...               "label": [False, True, False, False]})
    >>> first, label = suspicions(t)
    >>> first.tolist(), label.tolist()
    ([True, False, True, False], [True, True, False, False])
    """
    keys = zip(table.column("corpus").to_pylist(), table.column("job").to_pylist(),
               table.column("path").to_pylist(), table.column("rank").to_pylist())
    group = [None if d is None else (k if k[3] is not None and k[3] < MAX_PLACE else (i,))
             for i, (k, d) in enumerate(zip(keys, table.column("device").to_pylist()))]
    right: dict[Any, bool] = {}
    first = np.zeros(len(group), dtype=bool)
    for i, (g, lab) in enumerate(zip(group, table.column("label").to_pylist())):
        if g is not None:
            first[i] = g not in right
            right[g] = right.get(g, False) or bool(lab)
    label = np.asarray([g is not None and right[g] for g in group], dtype=bool)
    return first, label


def _groups(table: Any) -> Iterator[tuple[tuple[str, str, str], list[int]]]:
    """Row indices of each (corpus, job, path), in table order."""
    keys = list(zip(table.column("corpus").to_pylist(), table.column("job").to_pylist(),
                    table.column("path").to_pylist()))
    idx: dict[tuple[str, str, str], list[int]] = {}
    for i, k in enumerate(keys):
        idx.setdefault(k, []).append(i)
    yield from idx.items()


def calibrated(table: Any, calibration: Any, X: np.ndarray | None = None) -> np.ndarray:
    """Each row's calibrated probability as the pipeline computes it (one report at a time,
    :meth:`~holmes.calibration.confidence.ConfidenceCalibration.predict_list`); NaN for the rows
    of reports without a device. ``X``: the rows' features (default: the table's)."""
    if X is None:
        X = np.column_stack([np.asarray(table.column(f).to_pylist(), dtype=np.float64) for f in FEATURES])
    dev = table.column("device").to_pylist()
    out = np.full(len(dev), np.nan)
    for _, rows in _groups(table):
        rows = [i for i in rows if dev[i] is not None]
        if rows:
            out[rows] = calibration.predict_list(X[rows])
    return out


def job_outcomes(table: Any, proba: np.ndarray | None, min_confidence: float = 0.9) -> list[dict[str, Any]]:
    """Each job and path under calibrated probabilities ``proba`` (one per row; None: the raw
    confidences): ``{"corpus", "job", "path", "fault_kind", "named" (ids), "top_p", "right",
    "wrong_confident"}``.

    ``right``: compute fault (and hang), the first named device is a root cause; network fault,
    one of the first two is (no log tells the two ends of a slow transfer apart); healthy, nothing
    named. ``wrong_confident``: devices are named (probability at least ``min_confidence``) and
    the answer is not right: the wrong device named first.
    """
    dev = table.column("device").to_pylist()
    lab = table.column("label").to_pylist()
    raw = table.column("raw_confidence").to_pylist()
    blocked = table.column("blocked").to_pylist()
    kind = table.column("fault_kind").to_pylist()
    p = np.asarray([np.nan if r is None else r for r in raw], dtype=np.float64) if proba is None else np.asarray(proba)
    out = []
    for (corpus, job, path), every in _groups(table):
        rows = [i for i in every if dev[i] is not None]
        order = sorted(rows, key=lambda i: -(p[i] if np.isfinite(p[i]) else -1.0))  # stable: raw order on ties
        named = [] if blocked[every[0]] else [i for i in order if np.isfinite(p[i]) and p[i] >= min_confidence]
        k = kind[every[0]]
        first = named[:2] if k in NETWORK_KINDS else named[:1]
        right = (not named) if k == "healthy" else any(lab[i] for i in first)
        out.append({"corpus": corpus, "job": job, "path": path, "fault_kind": k, "named": [dev[i] for i in named],
                    "top_p": float(p[order[0]]) if order and np.isfinite(p[order[0]]) else 0.0,
                    "right": bool(right), "wrong_confident": bool(named) and not right})
    return out
