"""PyTorch profiler (Kineto) traces -> CommOps job.

SRC is one trace file or a directory of them (``*.json``, ``*.json.gz``), one per rank. From each
trace the converter reads:

* rank and world size: ``distributedInfo.rank`` / ``world_size`` (else the file name's trailing
  number, warned);
* groups: ``distributedInfo.pg_config`` plus every op's ``Process Group Name`` / ``Process Group
  Ranks`` / ``Process Group Description`` (ranks rebuilt from ``Global rank start/stride`` and
  ``Group size`` when the list is truncated);
* ops: ``record_param_comms`` CPU ops (``Collective name``, ``In/Out msg nelems``, ``dtype``,
  ``Seq``, ``Src Rank`` / ``Dst Rank`` / ``Rank`` for P2P); ``wait`` records are not operators;
  a torch 2.x trace without them (gloo, CPU): ``c10d::allreduce_``-style dispatcher ops paired with
  the backend's ``gloo:all_reduce``-style annotations (:mod:`holmes.adapters.kineto_c10d`);
* GPU timing: ``nccl*Kernel*`` kernels (``ncclKernel_*``, ``ncclDevKernel_*``, any case) linked to
  their CPU op by ``External id``, else by ``correlation`` through the launching runtime call;
  a trace without ``record_param_comms`` uses the kernels' own metadata;
* iteration: the ``ProfilerStep#N`` window holding the op's start.

``start_ns`` is the CPU op start (kernel start for kernel-only ops); ``end_ns`` the linked kernel's
end, else the backend annotation's end, else the CPU op end; the extra column ``end_source`` says
which (``gpu_kernel`` / ``backend_op`` / ``cpu_op``). Absolute times are
``baseTimeNanoseconds + ts * 1000``. The rank's own work goes to the optional compute table
``compute/rank-NNNNN.parquet``: its GPU kernels other than NCCL's, else its top-level CPU operators.
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from holmes.adapters.build import build_job, check_output
from holmes.adapters.groups import GroupRegistry
from holmes.adapters.inputs import load_json_file, rank_from_filename
from holmes.adapters.iterations import infer_iterations_by_period
from holmes.adapters.kineto_c10d import c10d_records, compute_rows, iterations_of
from holmes.adapters.notes import Notes
from holmes.adapters.opnames import normalize_op
from holmes.adapters.rows import RankRows
from holmes.adapters.flight_recorder import DTYPE_BYTES
from holmes.errors import ConvertError, ParseError
from holmes.limits import max_world_size
from holmes.progress import track

__all__ = ["convert_kineto", "parse_kineto_trace"]

log = logging.getLogger(__name__)

_NCCL_KERNEL = re.compile(r"nccl(?:dev)?kernel", re.IGNORECASE)
_EXTRAS = ("end_source", "kernel_start_ns", "kernel_end_ns")
_NOT_OPS = {"wait", "waitall", "work.wait", "coalesced", "barrier_wait"}
# top-level keys of a profiler trace: Kineto's ChromeTraceLogger (libkineto/src/output_json.cpp), its
# logger buckets (LoggerOutputType) and the metadata torch.profiler adds (torch/profiler/profiler.py)
KNOWN_TOP_LEVEL = frozenset({
    "schemaVersion", "deviceProperties", "traceEvents", "traceName", "displayTimeUnit", "baseTimeNanoseconds",
    "VERBOSE", "INFO", "WARNING", "STAGE", "ERROR", "USDT",
    "distributedInfo", "profile_memory", "with_stack", "record_shapes", "with_modules", "with_flops",
    "DISABLE_CUPTI_LAZY_REINIT", "trace_id", "host_name",
    "cuda_driver_version", "cuda_runtime_version", "cupti_version",  # torch 2.11 on CUDA 13
})


def _trace_files(src: Path) -> list[Path]:
    if src.is_file():
        return [src]
    if not src.is_dir():
        raise ConvertError(f"{src}: no such file or directory")
    files = sorted(f for f in src.iterdir() if f.is_file() and (f.name.endswith(".json") or f.name.endswith(".json.gz")))
    if not files:
        raise ConvertError(f"{src}: no *.json or *.json.gz trace files")
    return files


def _parse_rank_list(v: Any) -> list[int] | None:
    if isinstance(v, list) and all(isinstance(x, int) for x in v):
        return [int(x) for x in v]
    if isinstance(v, str):
        try:
            x = json.loads(v)
        except json.JSONDecodeError:
            return None
        return _parse_rank_list(x)
    return None


def _group_ranks(args: dict[str, Any]) -> list[int] | None:
    ranks = _parse_rank_list(args.get("Process Group Ranks"))
    if ranks is not None and (not args.get("Group size") or len(ranks) == _to_int(args["Group size"])):
        return ranks
    try:
        start, stride, size = int(args["Global rank start"]), int(args["Global rank stride"]), int(args["Group size"])
    except (KeyError, TypeError, ValueError, OverflowError):
        return ranks
    if stride <= 0 or size <= 0 or start < 0 or start + stride * (size - 1) >= max_world_size():
        return ranks
    return list(range(start, start + stride * size, stride))


def _to_int(v: Any) -> int | None:
    """``v`` as an int within int64 (None when it is not one)."""
    try:
        x = int(v)
    except (TypeError, ValueError, OverflowError):
        return None
    return x if -(1 << 62) <= x < 1 << 62 else None


_MAX_US = 4e15  # |ts|, dur in microseconds beyond which nanoseconds leave int64 (absolute epoch us are ~1.7e15)


def _hashable(v: Any) -> Any:
    try:
        hash(v)
    except TypeError:
        return repr(v)
    return v


def _checked_event(i: int, e: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """The event with numeric ``ts`` / ``dur`` (microseconds) and a dict ``args``, or the reason it is malformed."""
    out = dict(e)
    for key, default in (("ts", None), ("dur", 0.0)):
        v = e.get(key, default)
        try:
            if isinstance(v, bool):
                raise TypeError
            x = float(v)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            x = float("nan")
        if not np.isfinite(x) or abs(x) > _MAX_US:
            return None, f"event #{i} {e.get('name')!r}: {key!r} is {str(v)[:40]!r}, not a number of microseconds"
        out[key] = x
    args = e.get("args")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return None, f"event #{i} {e.get('name')!r}: 'args' is {type(args).__name__} {str(args)[:40]!r}, not an object"
    out["args"] = args
    return out, None


def parse_kineto_trace(path: Path, trace: Any, reg: GroupRegistry, notes: Notes,
                       compute: dict[int, list[tuple[int, str, int, int]]] | None = None,
                       ) -> tuple[int, int | None, RankRows]:
    """One trace's rank, world size and op rows (groups go into ``reg``); with ``compute``, the
    rank's compute rows ``(iteration, name, start_ns, end_ns)`` go into ``compute[rank]``."""
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise ParseError(f"{path}: not a PyTorch profiler trace (no 'traceEvents' list)")
    for k in trace:
        if k not in KNOWN_TOP_LEVEL:
            notes.unknown_field("top-level trace key", k, path.name)
    dist = trace.get("distributedInfo") or {}
    if not isinstance(dist, dict):
        raise ParseError(f"{path}: 'distributedInfo' is not an object")
    rank = _to_int(dist.get("rank"))
    if rank is None:
        rank = rank_from_filename(path)
        if rank is None:
            raise ConvertError(f"{path}: no distributedInfo.rank and no rank number in the file name")
        notes.warn(f"{path.name}: no distributedInfo.rank; rank {rank} taken from the file name")
    ws = _to_int(dist.get("world_size"))
    backend = str(dist.get("backend") or "")
    pgc = dist.get("pg_config") or []
    if isinstance(pgc, dict):
        pgc = [dict(v, pg_name=v.get("pg_name", k)) for k, v in pgc.items() if isinstance(v, dict)]
    for g in pgc if isinstance(pgc, list) else []:
        if not isinstance(g, dict) or "pg_name" not in g:
            continue
        ranks = _parse_rank_list(g.get("ranks"))
        if ranks:
            reg.add(g["pg_name"], ranks, g.get("pg_desc"), source=str(path))
    base = _to_int(trace.get("baseTimeNanoseconds")) or 0
    if not 0 <= base < 1 << 62:
        raise ParseError(f"{path}: baseTimeNanoseconds {base} is not a time in nanoseconds since the epoch")
    if not base:
        notes.warn(f"{path.name}: no baseTimeNanoseconds; times are on the profiler's own clock")

    def ns(ts: Any) -> int:
        return base + int(round(float(ts) * 1000.0))

    rpcs: list[dict[str, Any]] = []
    kernels: list[dict[str, Any]] = []
    c10d: list[dict[str, Any]] = []  # torch 2.x dispatcher ops (c10d::allreduce_...) and the
    backend_ops: list[dict[str, Any]] = []  # backend's annotations (gloo:all_reduce...)
    work_kernels: list[tuple[str, int, int]] = []  # compute: GPU kernels other than NCCL's
    cpu_ops: list[tuple[Any, str, float, float]] = []  # compute: CPU ops (tid, name, ts, dur)
    steps: list[tuple[int, int, int]] = []
    runtime_by_corr: dict[int, dict[str, Any]] = {}
    for i, e in enumerate(trace["traceEvents"]):
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        name = e.get("name")
        if not isinstance(name, str) or "ts" not in e:
            continue
        cat = e.get("cat", "")
        kind = ("rpc" if name == "record_param_comms" else
                "kernel" if cat == "kernel" and _NCCL_KERNEL.search(name) else
                "step" if name.startswith("ProfilerStep#") else
                "runtime" if cat in ("cuda_runtime", "cuda_driver") else
                "c10d" if name.startswith("c10d::") else
                "backend" if name.startswith("gloo:") else None)
        if compute is not None and cat in ("kernel", "cpu_op", "user_annotation") and kind in (None, "step"):
            try:
                ts_, dur_ = float(e["ts"]), float(e.get("dur", 0.0))
            except (TypeError, ValueError):
                ts_ = dur_ = float("nan")
            if np.isfinite(ts_) and np.isfinite(dur_) and abs(ts_) <= _MAX_US and 0 <= dur_ <= _MAX_US:
                if cat == "kernel":
                    work_kernels.append((name, ns(ts_), ns(ts_ + dur_)))
                else:
                    cpu_ops.append((_hashable(e.get("tid")), name, ts_, dur_))
        if kind is None:
            continue
        e, why = _checked_event(i, e)
        if e is None:
            notes.malformed(path.name, str(why))
            continue
        if kind == "rpc":
            rpcs.append(e)
        elif kind == "c10d":
            c10d.append(e)
        elif kind == "backend":
            backend_ops.append(e)
        elif kind == "kernel":
            kernels.append(e)
        elif kind == "step":
            n = _to_int(name.split("#", 1)[1])
            if n is not None:
                steps.append((ns(e["ts"]), ns(e["ts"]) + int(round(e["dur"] * 1000)), n))
        else:
            c = _to_int(e["args"].get("correlation"))
            if c is not None:
                runtime_by_corr[c] = e
    # link kernels to CPU ops: External id, else correlation -> runtime call inside a CPU op
    by_ext = {}
    by_tid: dict[Any, list[tuple[float, float, int]]] = {}
    for i, e in enumerate(rpcs):
        x = _to_int(e["args"].get("External id"))
        if x is not None:
            by_ext[x] = i
        by_tid.setdefault(_hashable(e.get("tid")), []).append((e["ts"], e["ts"] + e["dur"], i))
    for v in by_tid.values():
        v.sort()
    linked: dict[int, list[dict[str, Any]]] = {}
    orphans = []
    for k in kernels:
        a = k["args"]
        i = by_ext.get(_to_int(a.get("External id")))
        if i is None:
            rt = runtime_by_corr.get(_to_int(a.get("correlation")))
            if rt is not None:
                lst = by_tid.get(_hashable(rt.get("tid")), [])
                j = bisect.bisect_right(lst, (rt["ts"], float("inf"), 1 << 60)) - 1
                if j >= 0 and lst[j][0] <= rt["ts"] <= lst[j][1]:
                    i = lst[j][2]
        if i is None:
            orphans.append(k)
        else:
            linked.setdefault(i, []).append(k)
    records: list[tuple[dict[str, Any], int, int, str, int | None, int | None]] = []
    for i, e in enumerate(rpcs):
        ks = linked.get(i)
        s = ns(e["ts"])
        if ks:
            ks_start = min(ns(k["ts"]) for k in ks)
            ks_end = max(ns(k["ts"]) + int(round(k["dur"] * 1000)) for k in ks)
            records.append((e["args"], s, max(ks_end, s), "gpu_kernel", ks_start, ks_end))
        else:
            records.append((e["args"], s, s + int(round(e["dur"] * 1000)), "cpu_op", None, None))
    if not rpcs and not kernels and c10d:  # torch 2.x without record_param_comms (gloo, CPU)
        records = c10d_records(path.name, c10d, backend_ops, pgc, ns, notes)
    if not rpcs and orphans:
        notes.infer(f"{path.name}: no record_param_comms CPU ops; ops taken from NCCL kernels' own metadata")
        for k in orphans:
            s = ns(k["ts"])
            e_ = s + int(round(k["dur"] * 1000))
            records.append((k["args"], s, e_, "gpu_kernel", s, e_))
    elif orphans:
        notes.details.setdefault("unlinked_kernels", {})[str(rank)] = len(orphans)
    if compute is not None and records:
        tids = {_hashable(e.get("tid")) for e in (rpcs or c10d)}
        work = compute_rows(work_kernels, cpu_ops, tids, ns)
        if work:
            its = iterations_of([w[1] for w in work], sorted(steps))
            compute[rank] = [(it, n, a, b) for it, (n, a, b) in zip(its, work)]
    n_cpu = sum(1 for r in records if r[3] == "cpu_op")
    if records and n_cpu == len(records):
        kind = "Gloo/CPU trace" if ("gloo" in backend.lower() or not kernels) else "trace"
        notes.warn(f"{path.name}: {kind} without linkable GPU kernels: end_ns is the CPU op end "
                   "(for async ops: when the op was enqueued, not when it completed)")
    rows = RankRows(rank, _EXTRAS)
    n_wait = 0
    for args, s, e_, src, ks, ke in records:
        cname = str(args.get("Collective name") or "")
        if cname.lower() in _NOT_OPS:
            n_wait += 1
            continue
        op = normalize_op(cname)
        if op is None:
            notes.skip(cname or "(no Collective name)")
            continue
        key = args.get("Process Group Name")
        if key is None:
            notes.skip(f"{op} without Process Group Name")
            continue
        if str(key) not in reg:
            ranks = _group_ranks(args)
            if not ranks:
                notes.skip(f"{op} on a group with unknown ranks")
                continue
            reg.add(key, ranks, args.get("Process Group Description"), source=str(path))
        elif args.get("Process Group Description"):
            reg.add(key, reg.ranks(key), args.get("Process Group Description"), source=str(path))
        members = reg.ranks(key)
        peer = None
        if op in ("send", "recv"):
            peer = _to_int(args.get("Dst Rank" if op == "send" else "Src Rank"))
            if peer is None:
                local = _to_int(args.get("Rank"))
                if local is not None and 0 <= local < len(members):
                    peer = members[local]
            if peer is None:
                notes.skip(f"{op} without a peer rank")
                continue
        width = DTYPE_BYTES.get(str(args.get("dtype", "")).lower(), 0)
        nel = max(_to_int(args.get("In msg nelems")) or 0, _to_int(args.get("Out msg nelems")) or 0)
        seq = _to_int(args.get("Seq")) if op not in ("send", "recv") else None
        nbytes = nel * width if 0 <= nel * width < 1 << 62 else 0
        rows.append(iteration=0, comm_id=reg.comm_id(key), op=op, peer=peer, nbytes=nbytes, start_ns=s,
                    end_ns=e_, seq=-1 if seq is None else seq, end_source=src, kernel_start_ns=ks, kernel_end_ns=ke)
    if n_wait:
        notes.details.setdefault("wait_records_ignored", {})[str(rank)] = n_wait
    _assign_steps(rows, sorted(steps), path, notes)
    return rank, ws, rows


def _assign_steps(rows: RankRows, steps: list[tuple[int, int, int]], path: Path, notes: Notes) -> None:
    n = len(rows)
    if n == 0:
        return
    start = np.array(rows.cols["start_ns"], dtype=np.int64)
    if not steps:
        order = np.argsort(start, kind="stable")
        sig = [(rows.cols["comm_id"][i], rows.cols["op"][i], rows.cols["nbytes"][i]) for i in order]
        res = infer_iterations_by_period(sig, start[order])
        if res is None:
            notes.warn(f"{path.name}: no ProfilerStep#N markers and no repeating op pattern: every op is in iteration 0")
            return
        it = np.empty(n, dtype=np.int64)
        it[order] = res[0]
        rows.cols["iteration"] = it.tolist()
        notes.warn(f"{path.name}: no ProfilerStep#N markers; iterations inferred from the op pattern's period "
                   f"({res[1]} ops), numbered from 0 (not aligned with other ranks' step numbers)")
        return
    s0 = np.array([s[0] for s in steps], dtype=np.int64)
    s1 = np.array([s[1] for s in steps], dtype=np.int64)
    num = np.array([s[2] for s in steps], dtype=np.int64)
    j = np.searchsorted(s0, start, side="right") - 1
    inside = (j >= 0) & (start <= s1[np.maximum(j, 0)])
    outside = int((~inside).sum())
    if outside:
        notes.warn(f"{path.name}: {outside} op(s) start outside every ProfilerStep window; assigned to the "
                   "nearest preceding step (the first step for ops before it)")
    rows.cols["iteration"] = num[np.maximum(j, 0)].tolist()
    notes.infer("iterations from ProfilerStep#N windows (the step holding the op's start)")


def convert_kineto(src: str | os.PathLike[str], out: str | os.PathLike[str], *, overwrite: bool = False,
                   world_size: int | None = None, progress: Any = None) -> Path:
    """Convert PyTorch profiler traces (one per rank) to a CommOps job directory.

    Parameters
    ----------
    src : path-like
        A trace file (``.json`` / ``.json.gz``) or a directory of them.
    out : path-like
        Job directory to create.
    overwrite : bool, default False
    world_size : int, optional
        Override ``distributedInfo.world_size``.
    progress : progress factory, optional
        Draws the traces read and the ranks written (:mod:`holmes.progress`).

    Raises
    ------
    ParseError
        Truncated JSON, bad gzip, not a profiler trace (the message names the file).
    ConvertError
        Two traces of the same rank, no communication ops, inconsistent groups.

    Examples
    --------
    >>> import holmes
    >>> from holmes.adapters import convert_kineto
    >>> job = holmes.read_job(convert_kineto("traces/kineto/nccl_data.json.gz",
    ...                                      "/tmp/kineto-job"))      # doctest: +SKIP
    >>> job.ops(0).column("op").unique().to_pylist()                  # doctest: +SKIP
    ['broadcast', 'all_reduce']
    """
    check_output(out, overwrite, src=src)  # types, never clobber, never inside src
    src, out = Path(src), Path(out)
    notes = Notes("kineto", str(src))
    reg = GroupRegistry()
    rows: dict[int, RankRows] = {}
    sizes = set()
    compute: dict[int, list[tuple[int, str, int, int]]] = {}
    for f in track(_trace_files(src), progress, desc="convert: reading", unit="file"):
        rank, ws, rr = parse_kineto_trace(f, load_json_file(f), reg, notes, compute)
        if rank in rows:
            raise ConvertError(f"{f}: a second trace of rank {rank}")
        rows[rank] = rr
        if ws:
            sizes.add(ws)
    if len(sizes) > 1:
        raise ConvertError(f"{src}: traces disagree on world_size: {sorted(sizes)}")
    if world_size is None:
        world_size = sizes.pop() if sizes else max(reg.max_rank(), max(rows)) + 1
        if not (notes.inferred and any("world_size" in m for m in notes.inferred)):
            notes.infer(f"world_size {world_size} from " + ("distributedInfo" if world_size and rows else "ranks seen"))
    if not any(len(r) for r in rows.values()):
        raise ConvertError(f"{src}: no NCCL/Gloo communication operators (record_param_comms, c10d:: ops or nccl "
                           "kernels) found")
    notes.infer("start_ns = CPU op start; end_ns = linked GPU kernel end, else the backend's own annotation end "
                "(gloo), else CPU op end (column end_source)")
    notes.infer("nbytes = max(In msg nelems, Out msg nelems) x dtype width")
    notes.infer("seq: the trace's 'Seq' for collectives when present, else order within the process group")
    notes.details["end_source"] = {k: int(sum(v == k for r in rows.values() for v in r.cols["end_source"]))
                                   for k in ("gpu_kernel", "backend_op", "cpu_op")}
    if compute:
        notes.infer("compute/: the ranks' GPU kernels other than NCCL's, else their top-level CPU operators")
    path = build_job(out, notes, reg, rows, world_size=world_size, overwrite=overwrite, src=src,
                     progress=progress)
    write_compute(path.parent if path.name == "job.json" else path, compute)
    return path


#: the optional compute table (docs/formats.md)
COMPUTE_SCHEMA = pa.schema([("rank", pa.int32()), ("iteration", pa.int64()), ("name", pa.string()),
                            ("start_ns", pa.int64()), ("end_ns", pa.int64())])


def write_compute(job_dir: Path, compute: dict[int, list[tuple[int, str, int, int]]]) -> None:
    """Write ``compute/rank-NNNNN.parquet`` (the optional compute table of docs/formats.md) for each rank."""
    if not compute:
        return
    d = Path(job_dir) / "compute"
    d.mkdir(exist_ok=True)
    for rank, rows in sorted(compute.items()):
        its, names, starts, ends = zip(*rows) if rows else ((), (), (), ())
        t = pa.table([pa.array([rank] * len(rows), pa.int32()), pa.array(its, pa.int64()), pa.array(names, pa.string()),
                      pa.array(starts, pa.int64()), pa.array(ends, pa.int64())], schema=COMPUTE_SCHEMA)
        tmp = d / f".rank-{rank:05d}.parquet.partial"
        pq.write_table(t, tmp, compression="lz4")
        os.replace(tmp, d / f"rank-{rank:05d}.parquet")
