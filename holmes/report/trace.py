"""A Chrome trace of a job's window with the named devices highlighted (``holmes report --trace``).

The file is the Trace Event Format's JSON object (``{"traceEvents": [...]}``) that Perfetto
(ui.perfetto.dev, *Open trace file*) and ``chrome://tracing`` open: one process per rank, with
three threads -- ``communication`` (each operator a complete event: op, communicator, seq, bytes),
``compute`` (the gaps between its operators) and ``iterations`` (each step). The ranks of the
named devices (their candidates when none is named) come first and their process names say
``NAMED``; the pivot's irregular iterations are global instant events. Timestamps are each rank's
own clock in microseconds from the window's first operator: hosts whose clocks disagree are
shifted against each other, as in any per-host trace.

Reading is bounded: at most ``max_ranks`` ranks (the named ones, those on the traced paths and the
pivot first, then ranks spread over the job) and ``max_iterations`` iterations (from just before
the first irregular one, else the window's last).

Examples
--------
>>> import holmes
>>> job = holmes.read_job("fixtures/gpu64-3d-slow-gpu")
>>> tr = chrome_trace(holmes.localize(job), job, max_ranks=4, max_iterations=3)
>>> names = [e["args"]["name"] for e in tr["traceEvents"] if e["name"] == "process_name"]
>>> names[0]
'rank 21 - NAMED: gpu:21'
>>> sorted({e["tid"] for e in tr["traceEvents"] if e["ph"] == "X"})
[1, 2, 3]
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from holmes.errors import HolmesError
from holmes.topology import kinds

__all__ = ["chrome_trace", "write_trace", "trace_ranks"]

_TIDS = {"communication": 1, "compute": 2, "iterations": 3}


def _named_ranks(report: Any, gpus_per_host: int, world: int) -> dict[int, list[str]]:
    """rank -> the named (else candidate) device ids on it: gpu/nic by rank, host/nvswitch by host."""
    out: dict[int, list[str]] = {}
    for d in list(report.devices) or list(report.candidates):
        for r in kinds.ranks_of(d.id, gpus_per_host, world):
            if 0 <= r < world:
                out.setdefault(int(r), []).append(d.id)
    return out


def trace_ranks(report: Any, world: int, named: dict[int, list[str]], max_ranks: int) -> list[int]:
    """The ranks traced: named, on the traced paths, the pivots, then spread evenly; at most ``max_ranks``."""
    first: list[int] = list(named)
    for c in report.root_causes:
        first += [int(s["rank"]) for s in (c.evidence or []) if isinstance(s, dict) and "rank" in s]
    first += [int(p) for p in report.pivots]
    pick = list(dict.fromkeys(r for r in first if 0 <= r < world))[:max_ranks]
    left = max_ranks - len(pick)
    if left > 0:
        have = set(pick)
        pick += [int(r) for r in np.unique(np.linspace(0, world - 1, left + len(pick)).astype(int))
                 if int(r) not in have][:left]
    return pick


def _iterations(report: Any, max_iterations: int) -> list[int]:
    window = [int(i) for i in report.window]
    if not window:
        return []
    irr = sorted(int(i) for i in report.irregular_iterations if int(i) in set(window))
    if irr:
        k = max(0, window.index(irr[0]) - 2)
        return window[k:k + max_iterations]
    return window[-max_iterations:]


def chrome_trace(report: Any, job: Any, *, max_ranks: int = 32, max_iterations: int = 20) -> dict[str, Any]:
    """The Trace Event Format object of ``report``'s window over ``job`` (module docstring).

    Parameters
    ----------
    report : Report
    job : Job or MemoryJob
    max_ranks, max_iterations : int
        Bounds of what is read and written.
    """
    if max_ranks < 1 or max_iterations < 1:
        raise ValueError(f"max_ranks={max_ranks} and max_iterations={max_iterations} must be >= 1")
    world = int(job.world_size)
    topo = getattr(job, "topology", None)
    gph = int(getattr(topo, "gpus_per_host", 8) or 8)
    named = _named_ranks(report, gph, world)
    ranks = trace_ranks(report, world, named, max_ranks)
    its = _iterations(report, max_iterations)
    keep = np.asarray(its, dtype=np.int64)
    tables: dict[int, Any] = {}
    skipped: dict[int, str] = {}
    for r in ranks:
        try:
            t = job.ops(r)
        except HolmesError as exc:
            skipped[r] = str(exc)
            continue
        if t.column("end_ns").null_count:
            t = t.filter(pc.is_valid(t.column("end_ns")))
        if len(keep):
            t = t.filter(pc.is_in(t.column("iteration"), value_set=pa.array(keep)))
        tables[r] = t
    t0 = min((int(pc.min(t.column("start_ns")).as_py()) for t in tables.values() if t.num_rows), default=0)
    events: list[dict[str, Any]] = []
    order = sorted(tables, key=lambda r: (r not in named, r))
    for idx, r in enumerate(order):
        label = f"rank {r}" + (f" - NAMED: {', '.join(named[r])}" if r in named else "")
        events.append({"name": "process_name", "ph": "M", "pid": r, "tid": 0, "args": {"name": label}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": r, "tid": 0, "args": {"sort_index": idx}})
        for name, tid in _TIDS.items():
            events.append({"name": "thread_name", "ph": "M", "pid": r, "tid": tid, "args": {"name": name}})
        events += _rank_events(r, tables[r], t0, r in named)
    irr = set(int(i) for i in report.irregular_iterations)
    pivot = next((p for p in report.pivots if p in tables), None)
    if pivot is not None and tables[pivot].num_rows:
        t = tables[pivot]
        it = t.column("iteration").to_numpy()
        start = t.column("start_ns").to_numpy()
        for i in sorted(irr & set(its)):
            m = it == i
            if m.any():
                events.append({"name": f"irregular iteration {i} (pivot rank {pivot})", "ph": "i", "s": "g",
                               "ts": round((int(start[m].min()) - t0) / 1e3, 3), "pid": pivot, "tid": 3})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "metadata": {"source": "holmes report --trace", "verdict": report.verdict,
                         "named_devices": [d.id for d in report.devices],
                         "candidates": [d.id for d in report.candidates] if not report.devices else [],
                         "ranks": order, "iterations": its, "world_size": world,
                         "unreadable_ranks": {str(k): v for k, v in skipped.items()},
                         "clock": "each rank's own clock, microseconds from the window's first operator"}}


def _rank_events(r: int, t: Any, t0: int, named: bool) -> list[dict[str, Any]]:
    if not t.num_rows:
        return []
    it = t.column("iteration").to_numpy().astype(np.int64)
    start = t.column("start_ns").to_numpy().astype(np.int64)
    end = t.column("end_ns").to_numpy().astype(np.int64)
    op = t.column("op").cast("string").to_pylist()
    comm = t.column("comm_id").cast("string").to_pylist()
    seq = t.column("seq").to_numpy().tolist()
    nbytes = t.column("nbytes").to_numpy().tolist()
    peer = t.column("peer").to_pylist()
    ts = (start - t0) / 1e3
    dur = (end - start) / 1e3
    cat = "comm,named" if named else "comm"
    out = []
    for k in range(len(it)):
        args = {"comm_id": comm[k], "seq": int(seq[k]), "nbytes": int(nbytes[k]), "iteration": int(it[k])}
        if peer[k] is not None:
            args["peer"] = int(peer[k])
        out.append({"name": op[k], "cat": cat, "ph": "X", "ts": round(float(ts[k]), 3),
                    "dur": round(max(float(dur[k]), 0.0), 3), "pid": r, "tid": 1, "args": args})
    prev_end = np.maximum.accumulate(end)[:-1]
    gap = start[1:] - prev_end
    for k in np.flatnonzero(gap > 0).tolist():
        out.append({"name": "compute", "cat": "compute,named" if named else "compute", "ph": "X",
                    "ts": round((int(prev_end[k]) - t0) / 1e3, 3), "dur": round(int(gap[k]) / 1e3, 3),
                    "pid": r, "tid": 2, "args": {"iteration": int(it[k + 1])}})
    its, inv = np.unique(it, return_inverse=True)
    last = np.full(len(its), np.iinfo(np.int64).min, dtype=np.int64)
    lo = np.full(len(its), np.iinfo(np.int64).max, dtype=np.int64)
    np.maximum.at(last, inv, end)
    np.minimum.at(lo, inv, start)
    for i, a, b in zip(its.tolist(), lo.tolist(), last.tolist()):
        out.append({"name": f"iteration {i}", "cat": "iteration", "ph": "X", "ts": round((a - t0) / 1e3, 3),
                    "dur": round(max(b - a, 0) / 1e3, 3), "pid": r, "tid": 3})
    return out


def write_trace(report: Any, path: str | os.PathLike[str], job: Any, *, overwrite: bool = False,
                **options: Any) -> Path:
    """Write :func:`chrome_trace` to ``path`` atomically (never inside the job directory; an
    existing file only with ``overwrite``); returns the path."""
    from holmes.io.outputs import atomic_write_text, check_output

    inputs = [job] if isinstance(job, (str, os.PathLike)) else [getattr(job, "path", None)]
    inputs = [p for p in inputs if p is not None]
    check_output(path, inputs=inputs, overwrite=overwrite)
    text = json.dumps(chrome_trace(report, job, **options), separators=(",", ":"), allow_nan=False)
    return atomic_write_text(path, text, overwrite=overwrite, inputs=inputs)
