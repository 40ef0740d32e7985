"""PyTorch NCCL Flight Recorder dumps -> CommOps job.

SRC is a directory with one dump per rank, as written by ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``
(``<prefix><rank>``, e.g. ``_dump_12``): pickles (read by :mod:`holmes.adapters.safe_pickle`, never
by :func:`pickle.load`) or the JSON dump of ``_dump_nccl_trace_json`` / ``_dump_fr_trace_json``.
Dump versions 2.x are supported; other versions convert with a warning.

What is taken from where (see ``docs/converters.md``):

* rank: the number after the last ``rank`` in the file name (``nccl_trace_rank_container-node07_40``,
  ``host0.pci3_rank_12``; pytorch #140879 / #159490), else its trailing number (``_dump_12``);
  dumps do not carry it. Ranks without a dump are listed missing (the hang analysis treats them
  as ranks that wrote no log);
* progress beyond the window: each dump's ``pg_status`` (per process group the last collective
  enqueued, started and completed, which outlive the ring buffer's evicted entries, pytorch
  #125173) is kept in ``job.json`` as ``extra["progress"]``: ``{rank: {comm_id: [last_enqueued,
  last_completed]}}`` (``pg_status`` is keyed by the c10d ``pg_id``, mapped to the group through
  the entries of every dump); the file's modification time, the dump's time, as
  ``extra["flight_recorder"]["dump_mtime_ns"]``;
* groups: ``pg_config`` of every dump (name, ``desc``, ``ranks``), kinds from Megatron
  descriptions through :func:`holmes.topology.kind_from_group_name`;
* op: ``profiling_name`` without its backend prefix (``nccl:``, ``gloo:``, ``ncclx:``, ``xccl:``);
  P2P peers ``'send 0->3'`` / ``'recv 3<-0'`` are group-local indices into the group's rank list;
* seq: collectives ``collective_seq_id``; P2P: order per (group, direction, peer), aligned between
  the two ends by creation time because each dump holds only the newest entries (a ring buffer);
* time: ``start_ns`` = ``time_created_ns`` (issue); ``end_ns`` = ``time_discovered_completed_ns``, or
  started + ``duration_ms``; the entry's ``state`` is kept (the schema's optional column:
  ``completed``, ``started``, ``scheduled``) and entries that never completed have a null ``end_ns``
  (``start_ns`` stays the issue time, ``time_created_ns``); ``end_known``, ``fr_record_id``,
  ``fr_collective_seq_id`` (the collective sequence id per process group) and ``fr_p2p_seq_id`` are
  extra columns;
* iteration: not in the dump; inferred from the period of each rank's op pattern and aligned
  across ranks by shared collectives; when no period is found: one iteration 0 (warned).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from holmes.adapters.build import build_job, check_output
from holmes.adapters.groups import GroupRegistry
from holmes.adapters.inputs import read_bytes
from holmes.adapters.iterations import align_p2p_by_time, assign_iterations_from_pattern
from holmes.adapters.notes import Notes
from holmes.adapters.opnames import normalize_op, strip_backend
from holmes.adapters.rows import RankRows
from holmes.adapters.safe_pickle import safe_loads
from holmes.errors import ConvertError, ParseError
from holmes.io.schema import STATES
from holmes.limits import decode_json
from holmes.progress import track

__all__ = ["convert_flight_recorder", "read_fr_dump", "fr_rank", "DTYPE_BYTES"]

log = logging.getLogger(__name__)

DTYPE_BYTES = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2, "bfloat16": 2,
    "long": 8, "int64": 8, "int": 4, "int32": 4, "short": 2, "int16": 2, "char": 1, "int8": 1,
    "byte": 1, "uint8": 1, "bool": 1, "complexfloat": 8, "complexdouble": 16, "complexhalf": 4,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1, "uint16": 2,
    "uint32": 4, "uint64": 8,
}
_P2P_RE = re.compile(r"^(send|recv)\s+(\d+)\s*(->|<-)\s*(\d+)", re.IGNORECASE)
_EXTRAS = ("state", "end_known", "fr_record_id", "fr_collective_seq_id", "fr_p2p_seq_id")
# the keys PyTorch writes (torch/csrc/distributed/c10d/FlightRecorder*.{hpp,cpp}, dump versions 1.x-2.x)
KNOWN_TOP_LEVEL = frozenset({"version", "entries", "pg_config", "pg_status", "nccl_version", "comm_lib_version",
                             "nccl_comm_state"})
KNOWN_ENTRY = frozenset({
    "record_id", "pg_id", "process_group", "collective_seq_id", "p2p_seq_id", "is_p2p", "op_id", "seq_id",
    "profiling_name", "input_sizes", "input_dtypes", "output_sizes", "output_dtypes", "time_created_ns",
    "duration_ms", "timeout_ms", "frames", "state", "retired", "time_discovered_started_ns",
    "time_discovered_completed_ns", "thread_id", "thread_name",
})


class _BadField(Exception):
    """An entry field holds a value of the wrong type (the entry is skipped and counted)."""


_MAX_NS = 1 << 62


def _opt_int(v: Any) -> int | None:
    """``v`` as an int, or None (for the informational extra columns)."""
    if v is None or isinstance(v, (bool, bytes)):
        return None
    try:
        x = int(v)
    except (TypeError, ValueError, OverflowError):
        return None
    return x if -_MAX_NS <= x < _MAX_NS else None


def _int_field(e: dict[str, Any], key: str) -> int | None:
    """``e[key]`` as an int (None when absent or null); :class:`_BadField` when it is not an integer."""
    v = e.get(key)
    if v is None:
        return None
    x = _opt_int(v)
    if x is None:
        raise _BadField(f"{key!r} is {str(v)[:40]!r}, not an integer")
    return x


def _float_field(e: dict[str, Any], key: str) -> float | None:
    """``e[key]`` as a finite float (None when absent or null); :class:`_BadField` otherwise."""
    v = e.get(key)
    if v is None:
        return None
    try:
        x = math.nan if isinstance(v, (bool, bytes)) else float(v)
    except (TypeError, ValueError, OverflowError):
        x = math.nan
    if not math.isfinite(x):
        raise _BadField(f"{key!r} is {str(v)[:40]!r}, not a number")
    return x


def read_fr_dump(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load one Flight Recorder dump (pickle through the restricted unpickler, or JSON).

    Raises
    ------
    ParseError
        Unreadable, truncated, a pickle naming a global, or not a dump (no ``entries`` list).
    """
    p = Path(path)
    data = read_bytes(p)
    if data.lstrip()[:1] == b"{":
        d = decode_json(data, str(p))
    else:
        d = safe_loads(data, source=str(p))
    if not isinstance(d, dict) or not isinstance(d.get("entries"), list):
        raise ParseError(f"{p}: not a Flight Recorder dump (no 'entries' list)")
    return d


def _nbytes(sizes: Any, dtypes: Any) -> int:
    """Bytes of a list of tensor shapes; 0 when unknown; an impossible size (negative, beyond int64)
    makes the entry malformed (skipped and counted)."""
    if not isinstance(sizes, (list, tuple)):
        return 0
    total = 0
    for i, shape in enumerate(sizes):
        dt = dtypes[i] if isinstance(dtypes, (list, tuple)) and i < len(dtypes) else None
        width = DTYPE_BYTES.get(str(dt).lower(), 0)
        if not isinstance(shape, (list, tuple)):
            continue
        try:
            dims = [int(x) for x in shape]
        except (TypeError, ValueError, OverflowError):
            continue
        if any(d < 0 or d >= 1 << 62 for d in dims):
            raise _BadField(f"tensor size {shape!r} is negative or beyond int64"[:200])
        total += math.prod(dims) * width
        if total >= 1 << 62:
            raise _BadField(f"tensor sizes {sizes!r} add up to more than int64 bytes"[:200])
    return total


def _parse_ranks(v: Any, where: str) -> list[int]:
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except json.JSONDecodeError:
            raise ConvertError(f"{where}: pg_config ranks {v!r} is not a list") from None
    if not isinstance(v, (list, tuple)) or not all(isinstance(x, int) for x in v):
        raise ConvertError(f"{where}: pg_config ranks {v!r} is not a list of ranks")
    return [int(x) for x in v]


_RANK_RE = re.compile(r"rank[_\-.]?(?:[A-Za-z][\w\-]*?[_\-.])?(\d+)(?!.*rank)", re.IGNORECASE)
_EXT_RE = re.compile(r"(\.(json|pkl|pickle|gz))+$", re.IGNORECASE)


def fr_rank(name: str) -> int | None:
    """The rank of a dump from its file name: the number after the last ``rank`` (a host name
    between them allowed), else the trailing number (extensions ``.json``/``.pkl``/``.pickle``/``.gz``
    dropped); None when the name ends in no number.

    >>> [fr_rank(n) for n in ("_dump_12", "nccl_trace_rank_container-node07_40", "host1.pci3_rank_5",
    ...                       "rank3.json.gz", "trace_rank_12_host-node07", "README")]
    [12, 40, 5, 3, 12, None]
    """
    base = _EXT_RE.sub("", name)
    m = _RANK_RE.search(base)
    if m:
        return int(m.group(1))
    m = re.search(r"(\d+)$", base)
    return int(m.group(1)) if m else None


def _list_dumps(src: Path, notes: Notes) -> dict[int, Path]:
    if src.is_file():
        files = [src]
    elif src.is_dir():
        files = sorted(f for f in src.iterdir() if f.is_file() and not f.name.startswith("."))
    else:
        raise ConvertError(f"{src}: no such file or directory")
    out: dict[int, Path] = {}
    ignored = []
    for f in files:
        r = fr_rank(f.name)
        if r is None:
            ignored.append(f.name)
            continue
        if r in out:
            raise ConvertError(f"{src}: two dumps for rank {r}: {out[r].name} and {f.name}")
        out[r] = f
    if ignored:
        notes.infer(f"ignored files whose name does not end in a rank number: {ignored[:10]}")
    if not out:
        raise ConvertError(f"{src}: no Flight Recorder dumps (files named <prefix><rank>)")
    notes.infer("rank of each dump taken from its file name (the number after 'rank', else the trailing number)")
    return out


def convert_flight_recorder(src: str | os.PathLike[str], out: str | os.PathLike[str], *, overwrite: bool = False,
                            world_size: int | None = None, progress: Any = None) -> Path:
    """Convert a directory of per-rank Flight Recorder dumps to a CommOps job directory.

    Parameters
    ----------
    src : path-like
        Directory holding ``<prefix><rank>`` dumps (pickle or JSON); other files are ignored.
    out : path-like
        Job directory to create; must not exist or be empty unless ``overwrite``.
    overwrite : bool, default False
    world_size : int, optional
        Override the world size (default: size of ``default_pg``, else highest rank + 1).
    progress : progress factory, optional
        Draws the dumps read and the ranks written (:mod:`holmes.progress`).

    Returns
    -------
    pathlib.Path
        ``out``.

    Raises
    ------
    ParseError
        A dump is truncated, corrupt, or a pickle tries to call anything.
    ConvertError
        Inconsistent groups across dumps, duplicate ranks, no dumps.

    Examples
    --------
    >>> import holmes
    >>> from holmes.adapters import convert_flight_recorder
    >>> job = holmes.read_job(convert_flight_recorder("traces/flight_recorder/gpu_error_1st",
    ...                                               "/tmp/fr-job"))          # doctest: +SKIP
    >>> job.world_size                                                           # doctest: +SKIP
    16
    """
    check_output(out, overwrite, src=src)  # types, never clobber, never inside src
    src, out = Path(src), Path(out)
    notes = Notes("flight-recorder", str(src))
    files = _list_dumps(src, notes)
    dumps = {r: read_fr_dump(f) for r, f in track(sorted(files.items()), progress, desc="convert: reading",
                                                   unit="file")}
    reg = GroupRegistry()
    versions = sorted({str(d.get("version")) for d in dumps.values()})
    notes.details["fr_versions"] = versions
    for v in versions:
        if not v.startswith("2."):
            notes.warn(f"Flight Recorder dump version {v} is not 2.x; converted on a best-effort basis")
    ncclv = sorted({str(d["nccl_version"]) for d in dumps.values() if d.get("nccl_version")})
    if ncclv:
        notes.details["nccl_versions"] = ncclv
    ws_default = None
    for r, d in dumps.items():
        where = str(files[r])
        for k in d:
            if k not in KNOWN_TOP_LEVEL:
                notes.unknown_field("Flight Recorder dump key", k, files[r].name)
        cfg = d.get("pg_config") or {}
        if not isinstance(cfg, dict):
            raise ConvertError(f"{where}: pg_config is not a mapping")
        for key, g in cfg.items():
            if not isinstance(g, dict):
                raise ConvertError(f"{where}: pg_config['{key}'] is not a mapping")
            ranks = _parse_ranks(g.get("ranks"), where)
            desc = g.get("desc") or g.get("pg_desc")
            reg.add(g.get("name", key), ranks, desc, source=where)
            if desc == "default_pg" or str(g.get("name", key)) == "0":
                ws_default = max(ws_default or 0, len(ranks))
    if world_size is None:
        world_size = ws_default or max(reg.max_rank(), max(dumps)) + 1
        notes.infer(f"world_size {world_size} from " + ("the default_pg size" if ws_default else "the highest rank seen"))
    notes.infer("process-group kinds from pg_config descriptions (Megatron names)")
    rows: dict[int, RankRows] = {}
    start_only = 0
    for r, d in dumps.items():
        rows[r], n_open = _dump_rows(r, d, str(files[r]), reg, notes)
        start_only += n_open
    if start_only:
        notes.warn(f"{start_only} entr(ies) have no completion time (state 'scheduled'/'started'): "
                   "end_ns is null where the state is not 'completed' (ops in flight at the dump)")
    notes.infer("start_ns = time_created_ns; end_ns = time_discovered_completed_ns "
                "(else time_discovered_started_ns + duration_ms)")
    notes.infer("nbytes = the larger of input and output sizes x dtype width")
    _align_p2p(rows, notes)
    assign_iterations_from_pattern(rows, notes, "fr_collective_seq_id", "Flight Recorder dumps")
    extra = {"progress": _progress(dumps, reg, notes),
             "flight_recorder": {"dump_mtime_ns": {str(r): _mtime(files[r]) for r in sorted(files)}}}
    return build_job(out, notes, reg, rows, world_size=world_size, overwrite=overwrite, src=src,
                     progress=progress, extra=extra)


def _mtime(f: Path) -> int | None:
    try:
        return f.stat().st_mtime_ns
    except OSError:
        return None


def _progress(dumps: dict[int, dict[str, Any]], reg: GroupRegistry, notes: Notes) -> dict[str, dict[str, list[int]]]:
    """``{rank: {comm_id: [last_enqueued, last_completed]}}`` from each dump's ``pg_status``.

    ``pg_status`` is keyed by the c10d ``pg_id``; entries carry both it and ``process_group``
    (the ``pg_config`` key), so the mapping is read from the entries, the rank's own first and
    every dump's where they agree. A status whose group cannot be named is left out (counted)."""
    pairs: dict[str, set[str]] = {}
    own: dict[int, dict[str, str]] = {}
    for r, d in dumps.items():
        for e in d["entries"]:
            if not isinstance(e, dict):
                continue
            pg, pid = e.get("process_group"), e.get("pg_id")
            if pid is None or not isinstance(pg, (list, tuple)) or not pg:
                continue
            pairs.setdefault(str(pid), set()).add(str(pg[0]))
            own.setdefault(r, {})[str(pid)] = str(pg[0])
    shared = {pid: next(iter(k)) for pid, k in pairs.items() if len(k) == 1}
    out: dict[str, dict[str, list[int]]] = {}
    unnamed = 0
    for r, d in dumps.items():
        st = d.get("pg_status")
        if not isinstance(st, dict):
            continue
        for pid, v in st.items():
            key = own.get(r, {}).get(str(pid)) or shared.get(str(pid))
            if key is None and str(pid) in reg and str(pid) == "0":
                key = str(pid)
            if key is None or key not in reg or not isinstance(v, dict):
                unnamed += 1
                continue
            enq, done = _opt_int(v.get("last_enqueued_collective")), _opt_int(v.get("last_completed_collective"))
            if enq is None or done is None:
                continue
            out.setdefault(str(r), {})[reg.comm_id(key)] = [enq, done]
    if out:
        notes.infer("pg_status kept as extra['progress'] (per rank and group: last collective enqueued, completed)")
    if unnamed:
        notes.infer(f"{unnamed} pg_status entr(ies) name a pg_id no entry maps to a group: left out")
    return out


def _dump_rows(rank: int, d: dict[str, Any], where: str, reg: GroupRegistry, notes: Notes) -> tuple[RankRows, int]:
    rows = RankRows(rank, _EXTRAS)
    n_open = 0
    name = Path(where).name
    for i, e in enumerate(d["entries"]):
        if not isinstance(e, dict):
            raise ParseError(f"{where}: an entry is not a mapping")
        for k in e:
            if k not in KNOWN_ENTRY:
                notes.unknown_field("Flight Recorder entry field", k, name)
        try:
            n_open += _entry_row(rank, e, where, reg, notes, rows)
        except _BadField as exc:
            notes.malformed(name, f"entry #{i} (record_id {e.get('record_id')!r}): {exc}")
    return rows, n_open


def _entry_row(rank: int, e: dict[str, Any], where: str, reg: GroupRegistry, notes: Notes, rows: RankRows) -> int:
    """Append one entry's row (or count it as skipped); 1 if it never completed, else 0.

    Raises :class:`_BadField` when a field the row needs holds a value of the wrong type.
    """
    pname = str(e.get("profiling_name") or "")
    op = normalize_op(pname)
    if op is None:
        notes.skip(strip_backend(pname).split(" ")[0] or "(no profiling_name)")
        return 0
    pg = e.get("process_group")
    key = str(pg[0]) if isinstance(pg, (list, tuple)) and pg else (str(e["pg_id"]) if "pg_id" in e else None)
    if key is None or key not in reg:
        notes.skip(f"{op} on a group absent from pg_config")
        return 0
    cid = reg.comm_id(key)
    members = reg.ranks(key)
    peer = None
    if op in ("send", "recv"):
        m = _P2P_RE.match(strip_backend(pname))
        if not m:
            notes.skip(f"{op} without 'a->b' peers")
            return 0
        me_local, peer_local = int(m.group(2)), int(m.group(4))
        if me_local >= len(members) or peer_local >= len(members) or members[me_local] != rank:
            raise ConvertError(f"{where}: '{pname}' on group {key} {members} does not fit rank {rank}")
        peer = members[peer_local]
    created = _int_field(e, "time_created_ns")
    if created is None:
        notes.skip(f"{op} without time_created_ns")
        return 0
    started = _int_field(e, "time_discovered_started_ns")
    completed = _int_field(e, "time_discovered_completed_ns")
    dur = _float_field(e, "duration_ms")
    cseq = _int_field(e, "collective_seq_id")
    for name, v in (("time_created_ns", created), ("time_discovered_started_ns", started),
                    ("time_discovered_completed_ns", completed)):
        if v is not None and not 0 <= v < _MAX_NS:
            raise _BadField(f"{name!r} is {v}, not a time in nanoseconds since the epoch")
    if dur is not None and not abs(dur) < _MAX_NS / 1e6:
        raise _BadField(f"'duration_ms' is {dur}, out of range")
    open_ = 0
    if completed is not None:
        end, known = completed, True
    elif started is not None and dur is not None:
        end, known = started + int(round(dur * 1e6)), True
    else:
        end, known = created, False
        open_ = 1
    nb = max(_nbytes(e.get("input_sizes"), e.get("input_dtypes")),
             _nbytes(e.get("output_sizes"), e.get("output_dtypes")))
    rows.append(iteration=0, comm_id=cid, op=op, peer=peer, nbytes=nb, start_ns=created,
                end_ns=min(max(end, created), _MAX_NS),
                seq=cseq if (op not in ("send", "recv") and cseq is not None) else -1,
                state=_state(e.get("state"), completed is not None or (started is not None and dur is not None),
                             started is not None), end_known=known,
                fr_record_id=_opt_int(e.get("record_id")), fr_collective_seq_id=cseq,
                fr_p2p_seq_id=_opt_int(e.get("p2p_seq_id")))
    return open_


def _state(fr_state: Any, done: bool, entered: bool) -> str:
    """The CommOps ``state`` of an entry: Flight Recorder's own when it is one of
    ``completed``/``started``/``scheduled``, else what its timestamps show."""
    st = str(fr_state or "").lower()
    if st in STATES:
        return st
    return "completed" if done else "started" if entered else "scheduled"


def _align_p2p(rows: dict[int, RankRows], notes: Notes) -> None:
    """Give matching P2P seq to the k-th send and its recv although each dump is a window."""
    lists: dict[tuple[str, str, int, int], list[int]] = {}
    for r, rr in rows.items():
        c = rr.cols
        for i, (op, peer, cid) in enumerate(zip(c["op"], c["peer"], c["comm_id"])):
            if op in ("send", "recv"):
                src, dst = (r, peer) if op == "send" else (peer, r)
                lists.setdefault((cid, op, src, dst), []).append(i)
    shifted = 0
    for (cid, op, s, q), idx in lists.items():
        if op != "send":
            continue
        ts = np.array([rows[s].cols["start_ns"][i] for i in idx])
        ridx = lists.get((cid, "recv", s, q), [])
        tr = np.array([rows[q].cols["start_ns"][i] for i in ridx]) if q in rows else np.zeros(0)
        d = align_p2p_by_time(ts, tr) if len(tr) else 0
        base = max(0, -d)
        for k, i in enumerate(idx):
            rows[s].cols["seq"][i] = k + base
        for j, i in enumerate(ridx):
            rows[q].cols["seq"][i] = j + d + base
        shifted += d != 0
    for (cid, op, s, q), idx in lists.items():  # recvs whose sender has no dump
        if op == "recv" and (cid, "send", s, q) not in lists:
            for j, i in enumerate(idx):
                rows[q].cols["seq"][i] = j
    notes.infer("P2P seq: order per (group, direction, peer), the two ends aligned by creation time "
                f"(dumps are ring buffers; {shifted} pair(s) shifted)")
