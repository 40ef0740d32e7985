"""NCCL Inspector plugin logs -> CommOps job.

Built from the plugin's documentation (NVIDIA/nccl, ``ext-profiler/inspector/README.md``, output
format ``v4.0``): every record is a JSON object ``{"header": {"id", "rank", "n_ranks", "nnodes"},
"metadata": {"inspector_output_format_version", "dump_timestamp_us", "hostname", "pid", ...},
"coll_perf": {"coll", "coll_sn", "coll_msg_size_bytes", "coll_exec_time_us", "coll_timing_source",
...}}``; verbose logs (``NCCL_INSPECTOR_DUMP_VERBOSE=1``) add ``event_trace_ts`` (``coll_start_ts``,
``coll_stop_ts``, ``kernel_events[].kernel_start_ts/kernel_stop_ts``, microseconds). P2P records
use ``p2p_perf`` with the same shape (``p2p``, ``p2p_sn``, ``p2p_peer``, ``p2p_msg_size_bytes``,
``p2p_exec_time_us``, ``event_trace_ts.p2p_start_ts``).

``header.rank`` and ``p2p_peer`` are ranks *within the communicator*. The global rank of a process
(records grouped by ``metadata.hostname`` + ``pid``, else by file) is its rank in the
communicator spanning the whole job (the largest ``n_ranks``); communicator members and P2P peers
are mapped to global ranks through it.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from holmes.adapters.build import build_job, check_output
from holmes.adapters.groups import GroupRegistry
from holmes.adapters.inputs import read_bytes
from holmes.adapters.iterations import assign_iterations_from_pattern
from holmes.adapters.notes import Notes
from holmes.adapters.opnames import normalize_op
from holmes.adapters.rows import RankRows
from holmes.errors import ConvertError, ParseError
from holmes.limits import LimitError, json_depth, max_json_depth
from holmes.progress import track

__all__ = ["convert_nccl_inspector", "read_inspector_log"]

log = logging.getLogger(__name__)

_KNOWN_TOP = {"header", "metadata", "coll_perf", "p2p_perf"}
_OTHER_RECORDS = {"proxy_ctrl", "proxy_op", "group", "group_api", "coll_api", "p2p_api", "kernel_launch", "net_plugin"}
_EXTRAS = ("timing_source", "inspector_sn", "exec_time_us")


def read_inspector_log(path: Path, notes: Notes) -> list[dict[str, Any]]:
    """All JSON records of one log (JSON Lines, or concatenated pretty-printed objects).

    A truncated last record (the process died while writing) is dropped with a warning; any
    other undecodable text is a ParseError naming the file and line.
    """
    data = read_bytes(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ParseError(f"{path}: not UTF-8 text: {exc}") from None
    cap = max_json_depth()
    if text.count("{") + text.count("[") > cap and json_depth(text) > cap:
        raise LimitError(f"{path}: JSON nested deeper than {cap} levels (see docs/limits.md)")
    dec = json.JSONDecoder()
    out: list[dict[str, Any]] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i] in " \t\r\n":
            i += 1
        if i >= n:
            break
        try:
            obj, j = dec.raw_decode(text, i)
        except RecursionError:
            raise ParseError(f"{path}: JSON nested too deeply at line {text.count(chr(10), 0, i) + 1}") from None
        except json.JSONDecodeError as exc:
            line = text.count("\n", 0, exc.pos) + 1
            rest = text[i:]
            if "\n{" not in rest.rstrip() and (exc.pos >= len(text.rstrip()) - 1 or rest.lstrip().startswith("{")):
                notes.warn(f"{path.name}: last record truncated at line {line}; dropped")
                break
            raise ParseError(f"{path}: not valid JSON at line {line}: {exc.msg}") from None
        if not isinstance(obj, dict):
            raise ParseError(f"{path}: record at line {text.count(chr(10), 0, i) + 1} is not a JSON object")
        obj["_line"] = text.count("\n", 0, i) + 1
        out.append(obj)
        i = j
    if not out:
        raise ParseError(f"{path}: no records")
    return out


def _files(src: Path) -> list[Path]:
    if src.is_file():
        return [src]
    if not src.is_dir():
        raise ConvertError(f"{src}: no such file or directory")
    files = sorted(f for f in src.rglob("*") if f.is_file() and not f.name.startswith(".")
                   and f.suffix.lower() in (".log", ".jsonl", ".json", ".gz", ".txt"))
    if not files:
        raise ConvertError(f"{src}: no Inspector log files (*.log, *.jsonl, *.json)")
    return files


def _int(v: Any, where: str, what: str) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        raise ParseError(f"{where}: '{what}' is {v!r}, not an integer") from None


def convert_nccl_inspector(src: str | os.PathLike[str], out: str | os.PathLike[str], *, overwrite: bool = False,
                           world_size: int | None = None, progress: Any = None) -> Path:
    """Convert NCCL Inspector logs (a file or a directory of them) to a CommOps job directory.

    Parameters
    ----------
    src : path-like
        One log or a directory of logs (``*.log``, ``*.jsonl``, ``*.json``, optionally gzipped).
    out : path-like
        Job directory to create.
    overwrite : bool, default False
    world_size : int, optional
        Default: the largest communicator size seen.

    Raises
    ------
    ParseError
        Undecodable JSON (other than a truncated last record), non-integer ranks or sizes.
    ConvertError
        Two processes claim the same global rank, no coll_perf / p2p_perf records.

    Examples
    --------
    >>> from holmes.adapters import convert_nccl_inspector
    >>> convert_nccl_inspector("nccl-inspector-1234/", "/tmp/inspector-job")   # doctest: +SKIP
    """
    check_output(out, overwrite, src=src)  # types, never clobber, never inside src
    src, out = Path(src), Path(out)
    notes = Notes("nccl-inspector", str(src))
    procs: dict[tuple[str, str], list[tuple[str, dict[str, Any]]]] = {}
    versions, unknown_keys = set(), set()
    for f in track(_files(src), progress, desc="convert: reading", unit="file"):
        for rec in read_inspector_log(f, notes):
            where = f"{f}:{rec['_line']}"
            md = rec.get("metadata") if isinstance(rec.get("metadata"), dict) else {}
            if md.get("inspector_output_format_version"):
                versions.add(str(md["inspector_output_format_version"]))
            keys = set(rec) - {"_line"}
            if not keys & {"coll_perf", "p2p_perf"}:
                notes.skip(next(iter(sorted(keys & _OTHER_RECORDS)), "record without coll_perf/p2p_perf"))
                continue
            unknown_keys |= keys - _KNOWN_TOP
            if not isinstance(rec.get("header"), dict):
                raise ParseError(f"{where}: record without a 'header' object")
            pkey = (str(md.get("hostname", "")), str(md.get("pid", ""))) if md.get("pid") is not None else (str(f), "")
            procs.setdefault(pkey, []).append((where, rec))
    if unknown_keys:
        notes.warn(f"unknown record field(s) ignored: {sorted(unknown_keys)}")
    notes.details["inspector_versions"] = sorted(versions)
    for v in versions:
        if not v.lstrip("v").startswith("4"):
            notes.warn(f"Inspector output format {v} is not the documented v4.x; converted on a best-effort basis")
    if not procs:
        raise ConvertError(f"{src}: no coll_perf or p2p_perf records")

    # global rank of each process: its rank in the communicator spanning the most ranks
    comm_size: dict[str, int] = {}
    for recs in procs.values():
        for where, rec in recs:
            h = rec["header"]
            comm_size[str(h.get("id"))] = _int(h.get("n_ranks"), where, "header.n_ranks")
    biggest = max(comm_size.values())
    if world_size is None:
        world_size = biggest
        notes.infer(f"world_size {world_size} = the largest communicator size")
    global_of: dict[tuple[str, str], int] = {}
    for pkey, recs in procs.items():
        cand = [(_int(rec["header"].get("rank"), where, "header.rank"))
                for where, rec in recs if comm_size[str(rec["header"].get("id"))] == world_size]
        if cand:
            global_of[pkey] = cand[0]
    unmapped = sorted(set(procs) - set(global_of))
    if unmapped:
        free = [r for r in range(world_size) if r not in set(global_of.values())]
        if len(free) < len(unmapped):
            raise ConvertError(f"{src}: {len(unmapped)} process(es) without a global rank and no free rank left")
        notes.warn(f"{len(unmapped)} process(es) took part in no job-wide communicator; global ranks assigned by "
                   f"(hostname, pid) order: {dict(zip([f'{h}:{p}' for h, p in unmapped], free))}")
        for pkey, r in zip(unmapped, free):
            global_of[pkey] = r
    else:
        notes.infer("global rank of a process = its rank in the job-wide communicator")
    seen_ranks: dict[int, tuple[str, str]] = {}
    for pkey, r in global_of.items():
        if r in seen_ranks:
            raise ConvertError(f"{src}: processes {seen_ranks[r]} and {pkey} both have global rank {r}")
        seen_ranks[r] = pkey

    # communicators: local rank -> global rank
    members: dict[str, dict[int, int]] = {}
    for pkey, recs in procs.items():
        for where, rec in recs:
            h = rec["header"]
            members.setdefault(str(h.get("id")), {})[_int(h.get("rank"), where, "header.rank")] = global_of[pkey]
    reg = GroupRegistry()
    partial = 0
    for cid, m in members.items():
        if len(m) < comm_size[cid]:
            partial += 1
        kind = "other"
        reg.add(cid, [m[k] for k in sorted(m)], None, kind=kind)
    if partial:
        notes.warn(f"{partial} communicator(s) have logs from only some members; their rank lists hold those members")
    notes.infer("communicator kinds are unknown to NCCL Inspector: every communicator is 'other'")

    rows: dict[int, RankRows] = {}
    approx = dup = 0
    for pkey, recs in procs.items():
        r = global_of[pkey]
        rr = rows.setdefault(r, RankRows(r, _EXTRAS))
        seen: set[tuple[str, str, int]] = set()
        for where, rec in recs:
            h, md = rec["header"], rec.get("metadata") or {}
            cid = str(h.get("id"))
            is_p2p = "p2p_perf" in rec
            body = rec["p2p_perf" if is_p2p else "coll_perf"]
            pre = "p2p" if is_p2p else "coll"
            if not isinstance(body, dict):
                raise ParseError(f"{where}: '{pre}_perf' is not an object")
            name = str(body.get(pre, ""))
            op = normalize_op(name)
            if op is None or (is_p2p != (op in ("send", "recv"))):
                notes.skip(name or f"({pre} without a name)")
                continue
            sn = _int(body.get(f"{pre}_sn"), where, f"{pre}_sn")
            if (cid, pre, sn) in seen:
                dup += 1
                continue
            seen.add((cid, pre, sn))
            peer = None
            if is_p2p:
                local = _int(body.get("p2p_peer"), where, "p2p_peer")
                peer = members[cid].get(local)
                if peer is None:
                    notes.skip(f"{op} to a peer without logs")
                    continue
            exec_us = float(body.get(f"{pre}_exec_time_us") or 0)
            ts = body.get("event_trace_ts") if isinstance(body.get("event_trace_ts"), dict) else None
            if ts and ts.get(f"{pre}_start_ts") is not None:
                start = _int(ts.get(f"{pre}_start_ts"), where, f"{pre}_start_ts") * 1000
                stops = [k.get("kernel_stop_ts") for k in ts.get("kernel_events") or [] if isinstance(k, dict)]
                stops = [int(s) for s in stops if isinstance(s, (int, float)) and s > 0]
                end = max(stops) * 1000 if stops else start + int(round(exec_us * 1000))
            else:
                dump = md.get("dump_timestamp_us")
                if dump is None:
                    raise ParseError(f"{where}: no event_trace_ts and no metadata.dump_timestamp_us: no time at all")
                end = _int(dump, where, "dump_timestamp_us") * 1000
                start = end - int(round(exec_us * 1000))
                approx += 1
            rr.append(iteration=0, comm_id=reg.comm_id(cid), op=op, peer=peer,
                      nbytes=_int(body.get(f"{pre}_msg_size_bytes", 0), where, f"{pre}_msg_size_bytes"),
                      start_ns=start, end_ns=max(end, start), seq=sn if not is_p2p else -1,
                      timing_source=str(body.get(f"{pre}_timing_source", "unknown")), inspector_sn=sn,
                      exec_time_us=exec_us)
    if dup:
        notes.warn(f"{dup} duplicate record(s) (same communicator and sequence number) dropped")
    if approx:
        notes.warn(f"{approx} record(s) without verbose timestamps (NCCL_INSPECTOR_DUMP_VERBOSE=0): end_ns = dump "
                   "time, start_ns = end_ns - exec time; only durations are reliable, not the order")
    notes.infer("start_ns = event_trace_ts start; end_ns = last kernel stop (else start + exec time)")
    notes.infer("seq: coll_sn for collectives; order per (communicator, direction, peer) for P2P")
    assign_iterations_from_pattern(rows, notes, "inspector_sn", "NCCL Inspector logs")
    return build_job(out, notes, reg, rows, world_size=world_size, overwrite=overwrite, src=src,
                     progress=progress)
