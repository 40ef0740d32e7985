"""Shared machinery of the converters: op-name normalization, the process-group registry, seq
assignment, iteration inference, input decoding and the final job build.

Every converter turns its input into per-rank column lists (:class:`RankRows`), registers the
process groups it saw in a :class:`GroupRegistry`, records what it guessed in a :class:`Notes`,
and hands all three to :func:`build_job`, which assigns ``op_index`` and ``seq``, validates every
table against CommOps v1 and writes the job directory through :class:`holmes.io.JobWriter`.
"""

from __future__ import annotations

import gzip
import json
import logging
import re
import warnings
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from holmes.errors import ConvertError, ParseError
from holmes.io import JobMeta, JobWriter, SourceInfo, ops_table, validate_ops
from holmes.io.schema import P2P_OPS
from holmes.topology import kind_from_group_name

__all__ = ["ConvertWarning", "Notes", "GroupRegistry", "RankRows", "normalize_op", "strip_backend",
           "assign_seq", "infer_iterations_by_period", "assign_iterations_from_pattern", "align_iterations", "align_p2p_by_time",
           "read_bytes", "load_json_file", "build_job", "check_output", "rank_from_filename", "BACKEND_PREFIXES",
           "MAX_WORLD_SIZE"]

log = logging.getLogger(__name__)

BACKEND_PREFIXES = ("nccl", "ncclx", "gloo", "xccl", "mpi", "ucc", "hccl", "rccl", "fake", "custom")
MAX_WORLD_SIZE = 1 << 24  # ranks / world sizes beyond this are corrupt input, not a job


class ConvertWarning(UserWarning):
    """A converter had to guess, drop or approximate something; the job says what in ``job.json``."""


# ---------------------------------------------------------------------------------- notes


@dataclass
class Notes:
    """What a converter inferred and warned about; becomes ``job.json``'s ``source`` entry."""

    format: str
    path: str | None = None
    inferred: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    skipped: Counter = field(default_factory=Counter)

    def infer(self, msg: str) -> None:
        """Record something the converter inferred (logged at INFO)."""
        if msg not in self.inferred:
            self.inferred.append(msg)
            log.info("%s: %s", self.format, msg)

    def warn(self, msg: str) -> None:
        """Record a guess or a loss: a :class:`ConvertWarning`, a log line and a ``warnings[]`` entry."""
        if msg in self.warnings:
            return
        self.warnings.append(msg)
        log.warning("%s: %s", self.format, msg)
        warnings.warn(msg, ConvertWarning, stacklevel=3)

    def unknown_field(self, what: str, key: Any, where: str) -> None:
        """Warn once per ``(what, key)`` that an input field is not known and was ignored.

        ``what`` says where the field sits (e.g. ``"top-level trace key"``), ``where`` is the
        first file it was seen in; the keys are listed in ``details.unknown_fields[what]``.
        """
        k = str(key)
        lst = self.details.setdefault("unknown_fields", {}).setdefault(what, [])
        if k in lst:
            return
        lst.append(k)
        lst.sort()
        self.warn(f"{where}: unknown {what} {k!r} ignored")

    def malformed(self, where: str, what: str) -> None:
        """Count a record dropped because a field has the wrong type or value.

        ``where`` names the file, ``what`` the record and the field (e.g. ``"event #12
        'record_param_comms': 'ts' is 'abc', not a number"``). The first one of each file is
        warned about at once; the counts per file go to ``details.malformed_records``.
        """
        counts = self.details.setdefault("malformed_records", {})
        if where not in counts:
            counts[where] = 0
            self.warn(f"{where}: skipped malformed record(s) (counted in details.malformed_records), first: {what}")
        counts[where] += 1

    def skip(self, what: str, n: int = 1) -> None:
        """Count an input record that was not converted (reported once, in :meth:`finish`)."""
        self.skipped[what] += n

    def finish(self) -> SourceInfo:
        if self.skipped:
            total = sum(self.skipped.values())
            top = ", ".join(f"{k} x{v}" for k, v in self.skipped.most_common(10))
            self.warn(f"skipped {total} record(s) that are not supported operators: {top}")
            self.details["skipped"] = dict(self.skipped)
        return SourceInfo(format=self.format, path=self.path, inferred=list(self.inferred),
                          warnings=list(self.warnings), details=_jsonable(self.details))


def _jsonable(x: Any) -> Any:
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    return x


# ---------------------------------------------------------------------------------- op names

_BACKEND_RE = re.compile(r"^\s*(?:" + "|".join(BACKEND_PREFIXES) + r")\s*:\s*", re.IGNORECASE)
_KERNEL_RE = re.compile(r"^nccl(?:dev)?kernel_?([a-z]+)", re.IGNORECASE)

# compact (lower-case, alphanumerics only) name prefixes -> CommOps op, checked in this order
_PREFIX_MAP: tuple[tuple[str, str], ...] = (
    ("allreduce", "all_reduce"),
    ("allgather", "all_gather"),
    ("reducescatter", "reduce_scatter"),
    ("alltoall", "all_to_all"),
    ("broadcast", "broadcast"),
    ("bcast", "broadcast"),
    ("barrier", "barrier"),
    ("reduce", "reduce"),
    ("isend", "send"),
    ("send", "send"),
    ("irecv", "recv"),
    ("recv", "recv"),
)
# compact names that look like a prefix above but are something else
_NOT_OPS = {"sendrecv", "reducecoalesced_", "recvanysource"}


def strip_backend(name: str) -> str:
    """``'nccl:send 0->3'`` -> ``'send 0->3'`` (any known backend prefix, any case)."""
    return _BACKEND_RE.sub("", name, count=1)


def normalize_op(name: str | None) -> str | None:
    """Map a framework's operator name to a CommOps v1 op name, or None when unknown.

    Accepts PyTorch ``Collective name`` values and ``profiling_name`` strings with any backend
    prefix (``nccl:``, ``gloo:``, ``ncclx:``, ``xccl:``...), c10d function names
    (``_allgather_base``, ``allgather_into_tensor_coalesced``, ``reduce_scatter_tensor``,
    ``alltoall_base``, ``_reduce_scatter_base``...), NCCL kernel names (``ncclKernel_AllReduce_*``,
    ``ncclDevKernel_ReduceScatter_*``) and NCCL Inspector names (``AllGather``, ``Send``...).

    Examples
    --------
    >>> [normalize_op(n) for n in ("nccl:_all_gather_base", "allgather_into_tensor_coalesced",
    ...                            "gloo:reduce_scatter_tensor", "alltoall_base", "nccl:send 0->3",
    ...                            "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "ReduceScatter", "gather")]
    ['all_gather', 'all_gather', 'reduce_scatter', 'all_to_all', 'send', 'all_reduce', 'reduce_scatter', None]
    """
    if not name or not isinstance(name, str):
        return None
    s = strip_backend(name.strip())
    s = re.sub(r"^(?:c10d|torch\.distributed|dist)\s*(?:::|\.)\s*", "", s)
    m = _KERNEL_RE.match(s)
    if m:
        s = m.group(1)
    s = s.split()[0] if s.split() else s
    compact = re.sub(r"[^a-z0-9]", "", s.lower())
    if compact in _NOT_OPS:
        return None
    for prefix, op in _PREFIX_MAP:
        if compact.startswith(prefix):
            return op
    return None


# ---------------------------------------------------------------------------------- groups


class GroupRegistry:
    """Process groups seen in the input, keyed by the framework's group name.

    ``comm_id`` is ``"<kind>-<name>"`` (e.g. ``"pp-43"``), identical on every member because it
    is derived from the group's name, which frameworks keep equal on all members.

    Examples
    --------
    >>> reg = GroupRegistry()
    >>> reg.add("43", [0, 4, 8, 12], "PIPELINE_MODEL_PARALLEL_GROUP")
    'pp-43'
    >>> reg.add("43", [12, 8, 4, 0], "PIPELINE_MODEL_PARALLEL_GROUP", source="_dump_12")
    'pp-43'
    >>> reg.communicators()["pp-43"]
    {'kind': 'pp', 'ranks': [0, 4, 8, 12], 'name': 'PIPELINE_MODEL_PARALLEL_GROUP'}
    """

    def __init__(self) -> None:
        self._by_key: dict[str, str] = {}
        self._groups: dict[str, dict[str, Any]] = {}

    def __contains__(self, key: object) -> bool:
        return str(key) in self._by_key

    def comm_id(self, key: Any) -> str:
        return self._by_key[str(key)]

    def ranks(self, key: Any) -> list[int]:
        """The group's ranks in the framework's order (local index -> global rank)."""
        return list(self._groups[self._by_key[str(key)]]["order"])

    def add(self, key: Any, ranks: Sequence[int], desc: str | None = None, *, kind: str | None = None,
            source: str | None = None, comm_id: str | None = None) -> str:
        """Register (or re-check) a group; returns its comm_id.

        Raises
        ------
        ConvertError
            The same group name was seen with another member set.
        """
        key = str(key)
        if desc is not None and not isinstance(desc, str):
            desc = str(desc)
        order = [int(r) for r in ranks]
        members = sorted(set(order))
        if key in self._by_key:
            cid = self._by_key[key]
            g = self._groups[cid]
            if g["ranks"] != members:
                where = f"{source}: " if source else ""
                raise ConvertError(f"{where}process group '{key}' ({desc or g['name']}) has ranks {members} here "
                                   f"but {g['ranks']} elsewhere")
            if desc and not g["name"]:
                g["name"] = desc
            return cid
        k = kind or kind_from_group_name(desc or key)
        slug = re.sub(r"[^A-Za-z0-9_.:-]+", "_", key) or "g"
        cid = comm_id or f"{k}-{slug}"
        n = 1
        while cid in self._groups:
            n += 1
            cid = f"{k}-{slug}.{n}"
        self._by_key[key] = cid
        self._groups[cid] = {"kind": k, "ranks": members, "order": order, "name": desc}
        return cid

    def communicators(self, used: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
        """``job.json`` communicators (all registered groups, or only the ``used`` comm_ids)."""
        keep = None if used is None else set(used)
        out = {}
        for cid, g in self._groups.items():
            if keep is not None and cid not in keep:
                continue
            d: dict[str, Any] = {"kind": g["kind"], "ranks": list(g["ranks"])}
            if g["name"]:
                d["name"] = g["name"]
            out[cid] = d
        return out

    def max_rank(self) -> int:
        return max((max(g["ranks"]) for g in self._groups.values() if g["ranks"]), default=-1)


# ---------------------------------------------------------------------------------- rows


class RankRows:
    """Column lists of one rank's ops, in issue order, before ``op_index`` / ``seq`` exist.

    ``seq`` may be given per row (the framework's own sequence number, e.g. FR
    ``collective_seq_id`` or Kineto ``Seq``) or left as -1 to be assigned by order.
    """

    BASE = ("iteration", "comm_id", "op", "peer", "nbytes", "start_ns", "end_ns", "seq")

    def __init__(self, rank: int, extras: Sequence[str] = ()) -> None:
        self.rank = int(rank)
        self.cols: dict[str, list[Any]] = {c: [] for c in (*self.BASE, *extras)}

    def __len__(self) -> int:
        return len(self.cols["op"])

    def append(self, **row: Any) -> None:
        for c, lst in self.cols.items():
            lst.append(row.get(c, -1 if c == "seq" else None))


def _group_cumcount(codes: np.ndarray) -> np.ndarray:
    """k-th occurrence (0-based) of each row's code, in row order; vectorized."""
    n = len(codes)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(codes, kind="stable")
    sc = codes[order]
    starts = np.r_[0, np.flatnonzero(sc[1:] != sc[:-1]) + 1]
    run_start = np.repeat(starts, np.diff(np.r_[starts, n]))
    out = np.empty(n, dtype=np.int64)
    out[order] = np.arange(n) - run_start
    return out


def assign_seq(comm_id: np.ndarray, op: np.ndarray, peer: np.ndarray, given: np.ndarray | None = None) -> np.ndarray:
    """CommOps ``seq`` of one rank's rows (already in issue order).

    Collectives: the k-th collective on ``comm_id``; P2P: the k-th op of that direction with that
    ``peer`` on ``comm_id``. Rows whose ``given`` value is >= 0 keep it (framework seq numbers).

    Examples
    --------
    >>> assign_seq(np.array(["tp", "tp", "pp", "pp", "tp"]), np.array(["all_reduce", "all_gather", "send", "send", "all_reduce"]),
    ...            np.array([-1, -1, 4, 4, -1])).tolist()
    [0, 1, 0, 1, 2]
    """
    comm_id = np.asarray(comm_id, dtype=object)
    op = np.asarray(op, dtype=object)
    peer = np.asarray(peer, dtype=np.int64)
    is_p2p = np.isin(op, P2P_OPS)
    kind = np.where(is_p2p, op, "coll")
    pk = np.where(is_p2p, peer, -1)
    keys = np.char.add(np.char.add(comm_id.astype(str), "|"), np.char.add(kind.astype(str), np.char.add("|", pk.astype(str))))
    _, codes = np.unique(keys, return_inverse=True)
    seq = _group_cumcount(codes.ravel())
    if given is not None:
        g = np.asarray(given, dtype=np.int64)
        seq = np.where(g >= 0, g, seq)
    return seq


# ---------------------------------------------------------------------------------- iterations


def infer_iterations_by_period(signature: Sequence[Any], start_ns: np.ndarray, *, min_match: float = 0.9,
                               max_period: int = 4096, min_repeats: int = 2) -> tuple[np.ndarray, int] | None:
    """Split one rank's op sequence into iterations from the periodicity of its op pattern.

    The period is the smallest lag ``p`` at which at least ``min_match`` of the op signatures
    (e.g. ``(comm_id, op, nbytes)``) repeat, provided the pattern repeats ``min_repeats`` times.
    The iteration boundary inside the period is placed at the phase with the largest mean gap
    between consecutive op starts (the optimizer step / data loading between iterations).

    Returns
    -------
    (iterations, period) or None
        ``iterations`` numbers the rows 0, 1, ... (rows before the first boundary form iteration
        0); None when no period is found.

    Examples
    --------
    >>> sig = ["a", "b", "c"] * 4
    >>> t = np.array([0, 1, 2, 10, 11, 12, 20, 21, 22, 30, 31, 32])
    >>> it, p = infer_iterations_by_period(sig, t)
    >>> p, it.tolist()
    (3, [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3])
    """
    n = len(signature)
    if n < min_repeats or n < 2:
        return None
    _, codes = np.unique(np.array([repr(s) for s in signature], dtype=object).astype(str), return_inverse=True)
    codes = codes.ravel()
    head = codes[: min(n, 50_000)]
    m = len(head)
    period = None
    for p in range(1, min(max_period, m // min_repeats) + 1):
        if np.mean(head[p:] == head[:-p]) >= min_match:
            period = p
            break
    if period is None:
        return None
    t = np.asarray(start_ns, dtype=np.int64)
    gaps = np.r_[0, np.diff(t)].astype(np.float64)
    pos = np.arange(n) % period
    mean_gap = np.bincount(pos, weights=gaps, minlength=period) / np.maximum(np.bincount(pos, minlength=period), 1)
    if n > period:
        mean_gap[0] = max(mean_gap[0], np.mean(gaps[period::period]) if n > period else 0.0)
    phase = int(np.argmax(mean_gap))
    it = (np.arange(n) - phase) // period
    it -= it.min()
    return it.astype(np.int64), period


def align_iterations(keys: Mapping[int, Sequence[Any]], iters: Mapping[int, np.ndarray]) -> dict[int, int]:
    """Offsets that make independently numbered ranks agree on iteration numbers.

    ``keys[r]`` holds, per row of rank ``r``, a cross-rank identity of the op (e.g.
    ``(comm_id, seq)`` of a collective) or None; the same op must fall in the same iteration on
    every rank. Ranks are aligned one after another to the ones already aligned (median
    difference over shared ops); a rank sharing no op keeps offset 0. Returns rank -> offset to
    add.

    Examples
    --------
    >>> align_iterations({0: [("g", 5), ("g", 6)], 1: [("g", 6), ("g", 7)]},
    ...                  {0: np.array([3, 4]), 1: np.array([0, 1])})
    {0: -3, 1: 1}
    """
    ranks = sorted(keys)
    if not ranks:
        return {}
    seen: dict[Any, int] = {}
    offsets: dict[int, int] = {}
    pending = list(ranks)
    while pending:
        best, best_shared = None, -1
        for r in pending:
            shared = sum(1 for k in keys[r] if k is not None and k in seen)
            if shared > best_shared:
                best, best_shared = r, shared
        assert best is not None
        r = best
        diffs = [seen[k] - int(i) for k, i in zip(keys[r], iters[r]) if k is not None and k in seen]
        off = int(np.median(diffs)) if diffs else 0
        offsets[r] = off
        for k, i in zip(keys[r], iters[r]):
            if k is not None and k not in seen:
                seen[k] = int(i) + off
        pending.remove(r)
    low = min(int(np.min(iters[r])) + offsets[r] for r in ranks if len(iters[r]))  if any(len(iters[r]) for r in ranks) else 0
    return {r: o - low for r, o in offsets.items()}


def assign_iterations_from_pattern(rows: Mapping[int, RankRows], notes: Notes, seq_col: str, what: str) -> None:
    """Fill the ``iteration`` column of every rank from its op pattern's period (in place).

    Each rank is split by :func:`infer_iterations_by_period` over its ``(comm_id, op, nbytes)``
    sequence; ranks are then aligned by :func:`align_iterations` on collectives sharing
    ``(comm_id, row[seq_col])``. If any rank shows no period, every op stays in iteration 0 and a
    warning says so (a partial split would disagree across ranks).
    """
    found: dict[int, np.ndarray] = {}
    periods: dict[str, int] = {}
    for r, rr in rows.items():
        c = rr.cols
        if not len(rr):
            continue
        start = np.array(c["start_ns"], dtype=np.int64)
        order = np.argsort(start, kind="stable")
        sig = [(c["comm_id"][i], c["op"][i], c["nbytes"][i]) for i in order]
        res = infer_iterations_by_period(sig, start[order])
        if res is None:
            found = {}
            break
        it = np.empty(len(rr), dtype=np.int64)
        it[order] = res[0]
        found[r] = it
        periods[str(r)] = res[1]
    if not found:
        notes.warn(f"iterations are not in {what} and no repeating op pattern was found on every rank "
                   "(logs too short?): every op is in iteration 0")
        return
    keys = {r: [(cid, int(s)) if op not in P2P_OPS and s is not None and int(s) >= 0 else None
                for cid, op, s in zip(rows[r].cols["comm_id"], rows[r].cols["op"], rows[r].cols[seq_col])]
            for r in found}
    offsets = align_iterations(keys, found)
    for r, it in found.items():
        rows[r].cols["iteration"] = (it + offsets[r]).tolist()
    notes.infer(f"iterations are not in {what}: inferred from the period of each rank's (group, op, bytes) "
                "sequence, boundary at the largest recurring gap between ops, aligned across ranks by shared "
                "collective sequence numbers")
    notes.details["iteration_period_ops"] = periods


def align_p2p_by_time(send_t: np.ndarray, recv_t: np.ndarray) -> int:
    """Offset ``d`` such that the k-th send matches the (k-d)-th recv, from issue times.

    Used when each side only holds a window of its history (ring buffers): among all shifts
    with at least one overlapping pair, the one with the smallest median absolute time
    difference wins (ties: the larger overlap, then the smaller shift).

    Examples
    --------
    >>> align_p2p_by_time(np.array([100, 200, 300]), np.array([201, 301]))
    1
    """
    a = np.asarray(send_t, dtype=np.float64)
    b = np.asarray(recv_t, dtype=np.float64)
    if len(a) == 0 or len(b) == 0:
        return 0
    best = (np.inf, 0, 0)
    for d in range(-(len(b) - 1), len(a)):
        lo = max(0, d)
        hi = min(len(a), len(b) + d)
        if hi <= lo:
            continue
        err = float(np.median(np.abs(a[lo:hi] - b[lo - d:hi - d])))
        cand = (err, -(hi - lo), abs(d))
        if cand < best:
            best = cand
            best_d = d
    return int(best_d) if np.isfinite(best[0]) else 0


# ---------------------------------------------------------------------------------- input


def read_bytes(path: Path) -> bytes:
    """Read a file, transparently gunzipping ``*.gz``; errors name the file (ParseError)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ParseError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if path.suffix == ".gz" or data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise ParseError(f"{path}: not a readable gzip file, truncated or corrupt: {exc}") from None
    if not data.strip():
        raise ParseError(f"{path}: empty file")
    return data


def load_json_file(path: Path) -> Any:
    """Parse a (possibly gzipped) JSON file; ParseError names the file, line and column."""
    data = read_bytes(path)
    try:
        return json.loads(data)
    except UnicodeDecodeError as exc:
        raise ParseError(f"{path}: not UTF-8 text: {exc}") from None
    except json.JSONDecodeError as exc:
        hint = " (truncated?)" if exc.pos >= len(data.rstrip()) - 1 else ""
        raise ParseError(f"{path}: not valid JSON{hint} (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None


# ---------------------------------------------------------------------------------- output


def _rank_table(rows: RankRows, notes: Notes) -> pa.Table:
    c = rows.cols
    n = len(rows)
    op = np.array(c["op"], dtype=object)
    peer = np.array([-1 if p is None else int(p) for p in c["peer"]], dtype=np.int64)
    comm = np.array(c["comm_id"], dtype=object)
    it = np.array(c["iteration"], dtype=np.int64)
    start = np.array(c["start_ns"], dtype=np.int64)
    end = np.array(c["end_ns"], dtype=np.int64)
    given = np.array([-1 if s is None else int(s) for s in c["seq"]], dtype=np.int64)
    # issue order = (iteration, start_ns, input order); op_index restarts every iteration
    order = np.lexsort((np.arange(n), start, it))
    op, peer, comm, it, start, end, given = (x[order] for x in (op, peer, comm, it, start, end, given))
    bad = end < start
    if bad.any():
        notes.warn(f"rank {rows.rank}: {int(bad.sum())} op(s) end before they start; end_ns set to start_ns")
        end = np.where(bad, start, end)
    seq = assign_seq(comm, op, peer, given)
    op_index = _group_cumcount(it)
    cols: dict[str, Any] = dict(
        rank=pa.array(np.full(n, rows.rank, dtype=np.int32)), iteration=pa.array(it), op_index=pa.array(op_index.astype(np.int32)),
        comm_id=pa.array(comm.tolist(), type=pa.string()), seq=pa.array(seq), op=pa.array(op.tolist(), type=pa.string()),
        peer=pa.array(peer.astype(np.int32), mask=peer < 0), nbytes=pa.array(np.array([0 if b is None else int(b) for b in
                                                                                           np.array(c["nbytes"], dtype=object)[order]], dtype=np.int64)),
        start_ns=pa.array(start), end_ns=pa.array(end))
    for name in c:
        if name in RankRows.BASE:
            continue
        vals = [c[name][i] for i in order]
        cols[name] = pa.array(vals)
    return ops_table(**cols)


def build_job(out: str | Path, notes: Notes, registry: GroupRegistry, rows: Mapping[int, RankRows], *,
              world_size: int, iterations: Mapping[int, pa.Table] | None = None, overwrite: bool = False,
              parallel: Mapping[str, Any] | None = None, name: str | None = None) -> Path:
    """Validate every rank's rows and write the job directory (``job.json`` last).

    Ranks of ``range(world_size)`` without rows are reported as missing in ``job.json``; a rank
    with rows outside ``world_size`` or a comm_id absent from the registry is a ConvertError.
    Nothing is written when a table fails validation.
    """
    if world_size < 1:
        raise ConvertError(f"{notes.path}: no ranks found")
    if world_size > MAX_WORLD_SIZE:
        raise ConvertError(f"{notes.path}: world_size {world_size} is larger than {MAX_WORLD_SIZE}")
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
                                   **({"name": name} if name else {})})
    with JobWriter(out, meta, overwrite=overwrite) as w:
        for r, t in tables.items():
            w.write_ops(r, t)
        for r, t in (iterations or {}).items():
            w.write_iterations(r, t)
    log.info("wrote %s: %d rank(s), %d op(s)", out, len(tables), notes.details["ops"])
    return Path(out)


def check_output(out: str | Path, overwrite: bool) -> None:
    """Fail early (before parsing) when ``out`` exists and is not an empty directory or a job."""
    p = Path(out)
    if not p.exists():
        return
    if not p.is_dir():
        raise ConvertError(f"{p}: output exists and is not a directory")
    entries = list(p.iterdir())
    if entries and not overwrite:
        raise ConvertError(f"{p}: output directory is not empty (pass overwrite=True / --overwrite to replace a job)")
    if entries and not ((p / "job.json").is_file() or (p / "ranks").is_dir()):
        raise ConvertError(f"{p}: output directory holds something else than a job; refusing to overwrite it")


def rank_from_filename(path: Path) -> int | None:
    """The last integer in a file name (``_dump_12`` -> 12, ``rank3.json.gz`` -> 3), or None."""
    nums = re.findall(r"\d+", path.name.split(".")[0])
    return int(nums[-1]) if nums else None
