"""Summary statistics of a real run (:mod:`holmes.eval.realrun`): noise, shares and fault stretch.

:func:`run_stats` reads a run's job directory (the CommOps logs plus ``realrun.json``, the
compute / wire / in-operator seconds every rank measured) and returns the numbers used to check
that an injected fault shows and to fit the simulator's noise:

``it_cv``
    coefficient of variation of the iteration time over the fault-free iterations (the
    iteration time is the median over ranks of each rank's logged iteration duration).
``op_cv``
    median over (rank, op position) of the CV of the operator duration over fault-free iterations.
``compute_share``, ``wire_share``, ``wait_share``
    median over ranks of the share of the iteration spent in compute (matmuls), in emulated wire
    time, and inside communication operators but not on the wire (waiting for peers, gloo).
``stretch``
    median iteration time of the faulted iterations / of the fault-free ones (None if healthy).
``loadavg_1min``
    the machine's 1-minute load average (the larger of run start and end): other work competing
    for the cores while the run was captured.
``device_stretch``
    for compute faults: the faulty ranks' compute seconds in faulted / fault-free iterations; for
    a NIC: the rank's wire seconds, the same way; for a p2p pair: the logged durations of the
    pair's sends (median, faulted / fault-free iterations).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["run_stats"]


def _cv(x: np.ndarray) -> float:
    x = np.asarray(x, float)
    if len(x) < 2 or x.mean() <= 0:
        return float("nan")
    return float(x.std(ddof=1) / x.mean())


def run_stats(path: str | Path) -> dict[str, Any]:
    """Statistics of the real run in ``path`` (see the module docstring).

    Raises
    ------
    holmes.errors.JobError
        ``path`` is not a readable job or lacks ``realrun.json``.
    """
    from holmes.errors import JobError
    from holmes.io.job import read_job

    p = Path(path)
    job = read_job(p)
    try:
        rec = json.loads((p / "realrun.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise JobError(f"{p / 'realrun.json'}: unreadable: {exc}") from None
    factors = np.asarray(rec["factors"], float).reshape(-1, rec["config"]["iterations"])
    n_it = factors.shape[1]
    faulted = (factors != 1.0).any(axis=0) if len(factors) else np.zeros(n_it, bool)
    W = job.world_size
    dur = np.full((W, n_it), np.nan)
    op_cvs: list[float] = []
    for r in range(W):
        it, d = job.iteration_times(r)
        ok = (it >= 0) & (it < n_it)
        dur[r, it[ok]] = d[ok]
        t = job.ops(r)
        its = t.column("iteration").to_numpy()
        idx = t.column("op_index").to_numpy()
        od = (t.column("end_ns").to_numpy() - t.column("start_ns").to_numpy()).astype(float)
        keep = ~faulted[np.clip(its, 0, n_it - 1)]
        if keep.any():
            m = int(idx.max()) + 1
            for k in range(m):
                sel = keep & (idx == k)
                if sel.sum() >= 3:
                    op_cvs.append(_cv(od[sel]))
    it_time = np.nanmedian(dur, axis=0)
    healthy = ~faulted
    cfg = rec["config"]
    comp = np.array([x["compute_s"] for x in rec["ranks"]]) * 1e9
    wire = np.array([x["wire_s"] for x in rec["ranks"]]) * 1e9
    comm = np.array([x["comm_s"] for x in rec["ranks"]]) * 1e9

    def share(a: np.ndarray) -> float:
        return float(np.nanmedian(np.nansum(a[:, healthy], axis=1) / np.nansum(dur[:, healthy], axis=1)))

    out: dict[str, Any] = {
        "iterations": n_it, "world_size": W, "wall_s": rec.get("wall_s"),
        "loadavg_1min": max((x for x in rec.get("loadavg_1min") or [] if x is not None), default=None),
        "it_ms": float(np.median(it_time[healthy]) / 1e6) if healthy.any() else None,
        "it_cv": _cv(it_time[healthy]) if healthy.sum() > 1 else None,
        "op_cv": float(np.nanmedian(op_cvs)) if op_cvs else None,
        "compute_share": share(comp), "wire_share": share(wire), "wait_share": share(comm - wire),
        "faulted_iterations": int(faulted.sum()), "stretch": None, "device_stretch": None,
    }
    if faulted.any() and healthy.any():
        out["stretch"] = float(np.median(it_time[faulted]) / np.median(it_time[healthy]))
        gph = int(cfg["gpus_per_host"])
        ranks: set[int] = set()
        use = comp
        for spec in cfg["faults"]:
            dev = spec.split("@", 1)[0]
            kind, name = dev.split(":", 1)
            if kind == "gpu":
                ranks.add(int(name))
            elif kind == "host":
                ranks.update(range(int(name) * gph, (int(name) + 1) * gph))
            else:
                use = wire
                if kind == "nic":
                    ranks.add(int(name))
                elif kind == "p2p":
                    ranks.add(int(name.split(">")[0]))
        pairs = [tuple(int(x) for x in s.split("@", 1)[0].split(":", 1)[1].split(">"))
                 for s in cfg["faults"] if s.startswith("p2p:")]
        if pairs:  # the logged durations of the slow transfers
            a, b = pairs[0]
            t = job.ops(a)
            sel_ = (t.column("op").to_numpy(zero_copy_only=False) == "send") & \
                (t.column("peer").to_numpy(zero_copy_only=False) == b)
            its = t.column("iteration").to_numpy()[sel_]
            dd = (t.column("end_ns").to_numpy() - t.column("start_ns").to_numpy())[sel_].astype(float)
            fm = faulted[np.clip(its, 0, n_it - 1)]
            if fm.any() and (~fm).any():
                out["device_stretch"] = float(np.median(dd[fm]) / max(np.median(dd[~fm]), 1.0))
        elif ranks:
            sel = use[sorted(ranks)]
            h = np.median(sel[:, healthy], axis=1)
            f = np.median(sel[:, faulted], axis=1)
            out["device_stretch"] = float(np.median(f / np.maximum(h, 1.0)))
    return out
