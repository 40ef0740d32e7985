"""Communication operators and compute of a PyTorch 2.x profiler trace without ``record_param_comms``.

A torch 2.x trace of a gloo job (CPU) holds no ``record_param_comms`` events. Each operator is
instead a dispatcher op on the thread that issued it, ``c10d::allreduce_`` / ``c10d::send`` /
``c10d::_allgather_base_``... (its start is when the rank issued the operator; with
``record_shapes=True`` its ``Input Dims`` give the message's elements and its ``Concrete Inputs``
the P2P peer's group rank), and a ``gloo:all_reduce`` / ``gloo:send``... annotation where the
backend ran it (a gloo worker thread for collectives, the issuing thread for P2P; its end is
when the operator completed, and with ``record_shapes`` its ``Input type`` the dtype). The two
are paired first-in first-out per operator kind. The process group is not in these events: a
trace whose ``distributedInfo.pg_config`` holds one group uses it; otherwise the default group
is assumed (warned).

:func:`c10d_records` turns them into the records :func:`holmes.adapters.kineto.parse_kineto_trace`
builds rows from, in the ``record_param_comms`` argument names. :func:`compute_rows` gives the
optional compute table (``docs/formats.md``): the GPU kernels other than NCCL's where the trace has
kernels, else the top-level CPU operators of the threads that issued communication (forward,
backward, optimizer ops under a ``ProfilerStep#N``).
"""

from __future__ import annotations

import bisect
from collections import defaultdict, deque
from collections.abc import Callable
from typing import Any

from holmes.adapters.notes import Notes
from holmes.adapters.opnames import normalize_op

__all__ = ["c10d_records", "compute_rows", "C10D_OPS"]

# c10d operator -> (CommOps op, index of the sized argument in Input Dims (-1: none), index of the
# peer's group rank in Concrete Inputs (-1: none)); the schemas of torch/csrc/distributed/c10d/Ops.cpp
C10D_OPS: dict[str, tuple[str, int, int]] = {
    "allreduce_": ("all_reduce", 0, -1), "allreduce_coalesced_": ("all_reduce", 0, -1),
    "allgather_": ("all_gather", 0, -1), "allgather_coalesced_": ("all_gather", 0, -1),
    "allgather_into_tensor_coalesced_": ("all_gather", 0, -1), "_allgather_base_": ("all_gather", 0, -1),
    "reduce_scatter_": ("reduce_scatter", 1, -1), "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1, -1),
    "_reduce_scatter_base_": ("reduce_scatter", 1, -1), "alltoall_": ("all_to_all", 1, -1),
    "alltoall_base_": ("all_to_all", 1, -1), "broadcast_": ("broadcast", 0, -1), "reduce_": ("reduce", 0, -1),
    "barrier": ("barrier", -1, -1), "monitored_barrier_": ("barrier", -1, -1),
    "send": ("send", 0, 2), "recv_": ("recv", 0, 2),
}


def _elements(dims: Any) -> int:
    """Elements of an ``Input Dims`` entry: a shape, a list of shapes or a list of lists of shapes."""
    if not isinstance(dims, list):
        return 0
    if all(isinstance(d, int) for d in dims):
        n = 1
        for d in dims:
            n *= max(int(d), 0)
        return n
    return sum(_elements(d) for d in dims)


def _pick_group(pgc: list[dict[str, Any]], notes: Notes, fname: str) -> tuple[str | None, list[int]]:
    """The process group the trace's operators are attributed to, and its ranks."""
    groups = [g for g in pgc if isinstance(g, dict) and "pg_name" in g and isinstance(g.get("ranks"), list)]
    if len(groups) == 1:
        return str(groups[0]["pg_name"]), [int(r) for r in groups[0]["ranks"]]
    default = [g for g in groups if g.get("pg_desc") == "default_pg"] or [g for g in groups if str(g["pg_name"]) == "0"]
    if default:
        notes.warn(f"{fname}: {len(groups)} process groups and no record_param_comms: the group of each "
                   "c10d operator is unknown; all are attributed to the default group")
        return str(default[0]["pg_name"]), [int(r) for r in default[0]["ranks"]]
    return None, []


def c10d_records(fname: str, c10d: list[dict[str, Any]], backend: list[dict[str, Any]], pgc: list[Any],
                 ns: Callable[[float], int], notes: Notes) -> list[tuple[dict[str, Any], int, int, str, None, None]]:
    """Records ``(args, start_ns, end_ns, end_source, None, None)`` of the trace's c10d operators.

    ``args`` uses the ``record_param_comms`` names (``Collective name``, ``Process Group Name``,
    ``In msg nelems``, ``dtype``, ``Dst Rank`` / ``Src Rank``) so that one path builds the rows;
    ``end_source`` is ``backend_op`` (the backend's annotation ended) or ``cpu_op``.
    """
    pg_name, members = _pick_group(pgc if isinstance(pgc, list) else [], notes, fname)
    if pg_name is None:
        notes.warn(f"{fname}: c10d operators but no process group in distributedInfo.pg_config: not converted")
        return []
    # the backend's annotations by operator kind, in start order (FIFO pairing)
    queues: dict[str, deque] = defaultdict(deque)
    for e in sorted(backend, key=lambda e: e["ts"]):
        op = normalize_op(e["name"])
        if op is not None:
            queues[op].append(e)
    out = []
    unpaired = 0
    for e in sorted(c10d, key=lambda e: e["ts"]):
        spec = C10D_OPS.get(e["name"].split("::", 1)[1])
        if spec is None:
            continue
        op, si, pi = spec
        args = e["args"]
        dims = args.get("Input Dims")
        nel = _elements(dims[si]) if si >= 0 and isinstance(dims, list) and len(dims) > si else 0
        start = ns(e["ts"])
        end = start + int(round(e["dur"] * 1000))
        q = queues.get(op)
        # the first annotation of this kind starting after the issue (earlier ones are orphans)
        while q and ns(q[0]["ts"]) + int(round(q[0]["dur"] * 1000)) < start:
            q.popleft()
            unpaired += 1
        dtype = ""
        source = "cpu_op"
        if q:
            b = q.popleft()
            end = max(end, ns(b["ts"]) + int(round(b["dur"] * 1000)))
            source = "backend_op"
            types = b["args"].get("Input type")
            dtype = str(types[0]) if isinstance(types, list) and types else ""
        rec: dict[str, Any] = {"Collective name": op, "Process Group Name": pg_name, "In msg nelems": nel,
                               "dtype": dtype}
        if pi >= 0:
            conc = args.get("Concrete Inputs")
            try:
                peer = members[int(conc[pi])]
            except (TypeError, ValueError, IndexError):
                peer = None
            rec["Dst Rank" if op == "send" else "Src Rank"] = peer
        out.append((rec, start, end, source, None, None))
    unpaired += sum(len(q) for q in queues.values())
    if unpaired:
        notes.details.setdefault("unpaired_backend_annotations", {})[fname] = unpaired
    if out:
        notes.infer("torch 2.x trace without record_param_comms: operators from c10d:: dispatcher ops (start: "
                    "issued) paired first-in first-out with the backend's annotations (end: completed)")
        if not any(r[0]["In msg nelems"] for r in out):
            notes.warn(f"{fname}: no Input Dims on the c10d operators (profile with record_shapes=True): "
                       "nbytes is 0")
    return out


def compute_rows(kernels: list[tuple[str, int, int]], cpu: list[tuple[Any, str, float, float]], comm_tids: set[Any],
                 ns: Callable[[float], int]) -> list[tuple[str, int, int]]:
    """``(name, start_ns, end_ns)`` of the rank's own work: the non-NCCL GPU kernels when there are
    any, else the top-level CPU operators (directly under ``ProfilerStep#N``, or outermost) of the
    threads that issued communication, communication and profiler events excluded."""
    if kernels:
        return sorted(kernels, key=lambda k: k[1])
    by_tid: dict[Any, list[tuple[float, float, str]]] = defaultdict(list)
    for tid, name, ts, dur in cpu:
        if tid in comm_tids:
            by_tid[tid].append((ts, -dur, name))
    out: list[tuple[str, int, int]] = []
    for evs in by_tid.values():
        evs.sort()
        stack: list[tuple[float, bool]] = []  # (end, is a ProfilerStep)
        for ts, mdur, name in evs:
            while stack and stack[-1][0] <= ts:
                stack.pop()
            step = name.startswith("ProfilerStep#")
            top = not stack or (len(stack) == 1 and stack[0][1])
            if top and not step and not _is_comm(name):
                out.append((name, ns(ts), ns(ts - mdur)))
            stack.append((ts - mdur, step))
    out.sort(key=lambda r: r[1])
    return out


def _is_comm(name: str) -> bool:
    return name.startswith(("c10d::", "gloo:", "nccl:", "record_param_comms")) or normalize_op(name) is not None \
        and ":" in name


def iterations_of(starts: list[int], steps: list[tuple[int, int, int]]) -> list[int]:
    """The ``ProfilerStep#N`` holding each start (the preceding one, the first for starts before it)."""
    s0 = [s[0] for s in steps]
    out = []
    for t in starts:
        j = bisect.bisect_right(s0, t) - 1
        out.append(steps[max(j, 0)][2] if steps else 0)
    return out
