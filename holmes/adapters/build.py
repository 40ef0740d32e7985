"""The final step of every converter: assign ``op_index`` / ``seq``, validate every rank's table
against CommOps v1 and write the job directory; and the early output check."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from holmes.adapters.groups import GroupRegistry
from holmes.adapters.notes import Notes
from holmes.adapters.rows import RankRows, assign_seq, group_cumcount
from holmes.errors import ArgumentTypeError, ConvertError
from holmes.io import JobMeta, JobWriter, ops_table, validate_ops
from holmes.limits import LimitError, max_world_size
from holmes.io.outputs import OutputError
from holmes.io.outputs import check_output as check_output_path
from holmes.progress import track

__all__ = ["build_job", "check_output"]

log = logging.getLogger(__name__)


_I64 = (-(1 << 63), (1 << 63) - 1)


def _int64_col(values: list[Any], rank: int, name: str, *, none: int | None = None) -> np.ndarray:
    """A converted column as int64; a value that is not an integer inside int64 is a ConvertError."""
    try:
        vals = values if none is None else [none if v is None else v for v in values]
        arr = np.array(vals, dtype=np.int64)
    except (OverflowError, TypeError, ValueError):
        bad = next((v for v in values if not isinstance(v, (int, np.integer)) or not _I64[0] <= int(v) <= _I64[1]), None)
        raise ConvertError(f"rank {rank}: column '{name}' holds {bad!r}, not an integer inside int64"[:300]) from None
    if arr.size and (arr.min() == _I64[0] or arr.max() == _I64[1]):
        raise ConvertError(f"rank {rank}: column '{name}' holds an int64 extreme (a sentinel, not a value)")
    return arr


def _duplicates(*cols: np.ndarray) -> np.ndarray:
    """True on every row equal, column by column, to an earlier row (the first copy is kept).

    >>> _duplicates(np.array(["a", "a", "b", "a"], dtype=object), np.array([1, 1, 1, 2])).tolist()
    [False, True, False, False]
    """
    n = len(cols[0]) if cols else 0
    if n < 2:
        return np.zeros(n, dtype=bool)
    keys = [np.unique(c.astype(str) if c.dtype == object else c, return_inverse=True)[1].reshape(-1) for c in cols]
    o = np.lexsort([np.arange(n)] + keys[::-1])
    same = np.ones(n - 1, dtype=bool)
    for k in keys:
        ks = k[o]
        same &= ks[1:] == ks[:-1]
    dup = np.zeros(n, dtype=bool)
    dup[o[1:][same]] = True
    return dup


def _rank_table(rows: RankRows, notes: Notes) -> pa.Table:
    c = rows.cols
    n = len(rows)
    op = np.array(c["op"], dtype=object)
    peer = _int64_col(c["peer"], rows.rank, "peer", none=-1)
    comm = np.array(c["comm_id"], dtype=object)
    it = _int64_col(c["iteration"], rows.rank, "iteration")
    start = _int64_col(c["start_ns"], rows.rank, "start_ns")
    end = _int64_col(c["end_ns"], rows.rank, "end_ns")
    given = _int64_col(c["seq"], rows.rank, "seq", none=-1)
    nbytes = _int64_col(c["nbytes"], rows.rank, "nbytes", none=0)
    if peer.size and (peer.max() >= max_world_size() or peer.min() < -1):
        bad = int(peer.max()) if peer.max() >= max_world_size() else int(peer.min())
        raise ConvertError(f"rank {rows.rank}: column 'peer' holds rank {bad} outside the world")
    # issue order = (iteration, start_ns, input order); op_index restarts every iteration
    order = np.lexsort((np.arange(n), start, it))
    dup = _duplicates(comm, op, peer, it, start, end, nbytes, given)
    if dup.any():
        k = int(dup.sum())
        notes.warn(f"rank {rows.rank}: {k} record(s) repeat another of the same communicator, operator, peer, "
                   "size and times (the trace lists them twice), dropped")
        notes.details.setdefault("duplicates_dropped", {})[str(rows.rank)] = k
        order = order[~dup[order]]
        n = len(order)
    op, peer, comm, it, start, end, given, nbytes = (x[order] for x in (op, peer, comm, it, start, end, given, nbytes))
    bad = end < start
    if bad.any():
        notes.warn(f"rank {rows.rank}: {int(bad.sum())} op(s) end before they start; end_ns set to start_ns")
        end = np.where(bad, start, end)
    seq = assign_seq(comm, op, peer, given)
    op_index = group_cumcount(it)
    cols: dict[str, Any] = dict(
        rank=pa.array(np.full(n, rows.rank, dtype=np.int32)), iteration=pa.array(it), op_index=pa.array(op_index.astype(np.int32)),
        comm_id=pa.array(comm.tolist(), type=pa.string()), seq=pa.array(seq), op=pa.array(op.tolist(), type=pa.string()),
        peer=pa.array(peer.astype(np.int32), mask=peer < 0), nbytes=pa.array(nbytes),
        start_ns=pa.array(start), end_ns=pa.array(end))
    if "state" in c:  # ops dumped in flight (docs/formats.md: end_ns is null where state is not 'completed')
        state = np.array([c["state"][i] for i in order], dtype=object)
        cols["end_ns"] = pa.array(end, mask=state != "completed")
    for name in c:
        if name in RankRows.BASE:
            continue
        vals = [c[name][i] for i in order]
        cols[name] = pa.array(vals)
    return ops_table(**cols)


def _warn_non_members(notes: Notes, tables: Mapping[int, pa.Table], comms: Mapping[str, Any]) -> None:
    """Warn (and count in ``details``) where a rank logged ops on a process group whose member
    list leaves it out: the reader excludes those ops, so the trace contradicts itself."""
    outside: dict[int, list[str]] = {}
    for r, t in tables.items():
        for cid in t.column("comm_id").unique().to_pylist():
            if r not in comms[cid]["ranks"]:
                outside.setdefault(r, []).append(cid)
    if not outside:
        return
    r0 = min(outside)
    cid = outside[r0][0]
    members = list(comms[cid]["ranks"])
    shown = members if len(members) <= 8 else members[:8] + ["..."]
    notes.warn(f"{len(outside)} of {len(tables)} rank(s) logged ops on a process group that does not list them "
               f"(rank {r0} on {cid!r}, members {shown}): the trace contradicts itself and readers exclude those ops")
    notes.details["ranks_outside_their_groups"] = sorted(outside)


def build_job(out: str | Path, notes: Notes, registry: GroupRegistry, rows: Mapping[int, RankRows], *,
              world_size: int, iterations: Mapping[int, pa.Table] | None = None,
              compute: Mapping[int, pa.Table] | None = None, overwrite: bool = False,
              parallel: Mapping[str, Any] | None = None, name: str | None = None,
              src: str | os.PathLike[str] | None = None, progress: Any = None,
              extra: Mapping[str, Any] | None = None) -> Path:
    """Validate every rank's rows and write the job directory (``job.json`` last).

    The job is built in a temporary sibling of ``out`` and swapped in whole (an ``overwrite``
    replaces an old job entirely; an interrupted conversion leaves the old job or nothing).
    ``out`` may never lie inside ``src`` or contain it.

    Ranks of ``range(world_size)`` without rows are reported as missing in ``job.json``; a rank
    with rows outside ``world_size`` or a comm_id absent from the registry is a ConvertError.
    Nothing is written when a table fails validation. ``progress``: an optional progress factory
    over the ranks written (:mod:`holmes.progress`). ``extra``: kept as ``job.json``'s ``extra``
    (e.g. the Flight Recorder's ``progress``, see :mod:`holmes.adapters.flight_recorder`).
    ``compute``: the ranks' compute tables (``compute/``, :func:`holmes.io.schema.validate_compute`),
    where the source records the work.
    """
    if world_size < 1:
        raise ConvertError(f"{notes.path}: no ranks found")
    cap = max_world_size()
    if world_size > cap:
        raise LimitError(f"{notes.path}: world_size {world_size} exceeds the cap of {cap} ranks "
                         "(raise HOLMES_MAX_WORLD_SIZE for a larger job; see docs/limits.md)")
    tables: dict[int, pa.Table] = {}
    for r in sorted(rows):
        if r < 0 or r >= world_size:
            raise ConvertError(f"{notes.path}: rank {r} is outside world_size {world_size}")
        tables[r] = _rank_table(rows[r], notes)
    used = set()
    for t in tables.values():
        used.update(t.column("comm_id").unique().to_pylist())
    comms = registry.communicators()
    unknown = sorted(used - set(comms))
    if unknown:
        raise ConvertError(f"{notes.path}: ops on unknown process group(s) {unknown[:5]}")
    bad = [cid for cid, c in comms.items() if max(c["ranks"]) >= world_size]
    if bad:
        raise ConvertError(f"{notes.path}: process group {bad[0]} lists ranks outside world_size {world_size}")
    if not comms:
        raise ConvertError(f"{notes.path}: no communication operators found")
    _warn_non_members(notes, tables, comms)
    missing = [r for r in range(world_size) if r not in tables]
    if missing:
        shown = missing if len(missing) <= 20 else missing[:20] + ["..."]
        notes.warn(f"{len(missing)} of {world_size} rank(s) have no log: {shown}")
        notes.details["missing_ranks"] = missing
    notes.details["ops"] = int(sum(t.num_rows for t in tables.values()))
    notes.details["ranks_written"] = len(tables)
    for r, t in tables.items():  # validate everything before touching the output directory
        validate_ops(t, f"rank {r}", world_size=world_size, rank=r, comm_ids=comms)
    meta = JobMeta.model_validate({"world_size": world_size, "communicators": comms, "source": notes.finish(),
                                   **({"parallel": dict(parallel)} if parallel else {}),
                                   **({"name": name} if name else {}), **({"extra": dict(extra)} if extra else {})})
    with JobWriter(out, meta, overwrite=overwrite, inputs=[] if src is None else [src]) as w:
        for r, t in track(tables.items(), progress, desc="convert: writing", unit="rank"):
            w.write_ops(r, t)
        for r, t in (iterations or {}).items():
            w.write_iterations(r, t)
        for r, t in (compute or {}).items():
            w.write_compute(r, t)
    log.info("wrote %s: %d rank(s), %d op(s)", out, len(tables), notes.details["ops"])
    return Path(out)


_NO_SRC: Any = object()


def check_output(out: str | os.PathLike[str], overwrite: bool, src: str | os.PathLike[str] = _NO_SRC) -> None:
    """Fail early (before parsing) when ``out`` cannot be written without destroying something.

    Refused: an existing non-empty directory without ``overwrite``, a directory that is not a job,
    a file, an ``out`` inside ``src`` or containing it (see :func:`holmes.io.outputs.check_output`).
    """
    for name, v in (("out", out), ("src", src)):
        if not isinstance(v, (str, os.PathLike)) and v is not _NO_SRC:
            raise ArgumentTypeError(f"{name} must be a path (str or os.PathLike), not {type(v).__name__}")
    if not isinstance(overwrite, (bool, np.bool_)):
        raise ArgumentTypeError(f"overwrite must be a bool, not {type(overwrite).__name__}")
    try:
        check_output_path(out, inputs=[] if src is _NO_SRC else [src], overwrite=overwrite, kind="job")
    except OutputError as exc:
        raise ConvertError(str(exc)) from None
