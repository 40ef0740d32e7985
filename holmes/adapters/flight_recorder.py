"""PyTorch NCCL Flight Recorder dumps -> CommOps job.

SRC is a directory with one dump per rank, as written by ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``
(``<prefix><rank>``, e.g. ``_dump_12``): pickles (read by :mod:`holmes.adapters.safe_pickle`, never
by :func:`pickle.load`) or the JSON dump of ``_dump_nccl_trace_json`` / ``_dump_fr_trace_json``.
Dump versions 2.x are supported; other versions convert with a warning.

What is taken from where (see ``docs/converters.md``):

* rank: the trailing number of the file name (dumps do not carry it);
* groups: ``pg_config`` of every dump (name, ``desc``, ``ranks``), kinds from Megatron
  descriptions through :func:`holmes.topology.kind_from_group_name`;
* op: ``profiling_name`` without its backend prefix (``nccl:``, ``gloo:``, ``ncclx:``, ``xccl:``);
  P2P peers ``'send 0->3'`` / ``'recv 3<-0'`` are group-local indices into the group's rank list;
* seq: collectives ``collective_seq_id``; P2P: order per (group, direction, peer), aligned between
  the two ends by creation time because each dump holds only the newest entries (a ring buffer);
* time: ``start_ns`` = ``time_created_ns`` (issue); ``end_ns`` = ``time_discovered_completed_ns``, or
  started + ``duration_ms``; entries that never completed keep ``end_ns = start_ns`` and their
  ``state`` (an extra column, as are ``end_known``, ``fr_record_id``, ``fr_collective_seq_id``,
  ``fr_p2p_seq_id``);
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

from holmes.adapters.common import (GroupRegistry, Notes, RankRows, align_p2p_by_time, assign_iterations_from_pattern,
                                    build_job, check_output, normalize_op, rank_from_filename, read_bytes, strip_backend)
from holmes.adapters.safe_pickle import safe_loads
from holmes.errors import ConvertError, ParseError

__all__ = ["convert_flight_recorder", "read_fr_dump", "DTYPE_BYTES"]

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
        try:
            d = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ParseError(f"{p}: not valid JSON (truncated?): {exc}") from None
    else:
        d = safe_loads(data, source=str(p))
    if not isinstance(d, dict) or not isinstance(d.get("entries"), list):
        raise ParseError(f"{p}: not a Flight Recorder dump (no 'entries' list)")
    return d


def _nbytes(sizes: Any, dtypes: Any) -> int:
    if not isinstance(sizes, (list, tuple)):
        return 0
    total = 0
    for i, shape in enumerate(sizes):
        dt = dtypes[i] if isinstance(dtypes, (list, tuple)) and i < len(dtypes) else None
        width = DTYPE_BYTES.get(str(dt).lower(), 0)
        try:
            total += math.prod(int(x) for x in shape) * width
        except (TypeError, ValueError):
            continue
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
        r = rank_from_filename(f) if re.search(r"\d+(\.(json|pkl|pickle|gz))*$", f.name) else None
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
    notes.infer("rank of each dump taken from the trailing number of its file name")
    return out


def convert_flight_recorder(src: str | os.PathLike[str], out: str | os.PathLike[str], *, overwrite: bool = False,
                            world_size: int | None = None) -> Path:
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
    >>> job = holmes.read_job(convert_flight_recorder("../shared/data/flight_recorder/gpu_error_1st",
    ...                                               "/tmp/fr-job"))          # doctest: +SKIP
    >>> job.world_size                                                           # doctest: +SKIP
    16
    """
    src, out = Path(src), Path(out)
    check_output(out, overwrite)
    notes = Notes("flight-recorder", str(src))
    files = _list_dumps(src, notes)
    dumps = {r: read_fr_dump(f) for r, f in sorted(files.items())}
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
                   "end_ns = start_ns, column 'state' and 'end_known' tell them apart")
    notes.infer("start_ns = time_created_ns; end_ns = time_discovered_completed_ns "
                "(else time_discovered_started_ns + duration_ms)")
    notes.infer("nbytes = the larger of input and output sizes x dtype width")
    _align_p2p(rows, notes)
    assign_iterations_from_pattern(rows, notes, "fr_collective_seq_id", "Flight Recorder dumps")
    return build_job(out, notes, reg, rows, world_size=world_size, overwrite=overwrite)


def _dump_rows(rank: int, d: dict[str, Any], where: str, reg: GroupRegistry, notes: Notes) -> tuple[RankRows, int]:
    rows = RankRows(rank, _EXTRAS)
    n_open = 0
    for e in d["entries"]:
        if not isinstance(e, dict):
            raise ParseError(f"{where}: an entry is not a mapping")
        pname = str(e.get("profiling_name") or "")
        op = normalize_op(pname)
        if op is None:
            notes.skip(strip_backend(pname).split(" ")[0] or "(no profiling_name)")
            continue
        pg = e.get("process_group")
        key = str(pg[0]) if isinstance(pg, (list, tuple)) and pg else (str(e["pg_id"]) if "pg_id" in e else None)
        if key is None or key not in reg:
            notes.skip(f"{op} on a group absent from pg_config")
            continue
        cid = reg.comm_id(key)
        members = reg.ranks(key)
        peer = None
        if op in ("send", "recv"):
            m = _P2P_RE.match(strip_backend(pname))
            if not m:
                notes.skip(f"{op} without 'a->b' peers")
                continue
            me_local, peer_local = int(m.group(2)), int(m.group(4))
            if me_local >= len(members) or peer_local >= len(members) or members[me_local] != rank:
                raise ConvertError(f"{where}: '{pname}' on group {key} {members} does not fit rank {rank}")
            peer = members[peer_local]
        created = e.get("time_created_ns")
        if created is None:
            notes.skip(f"{op} without time_created_ns")
            continue
        started = e.get("time_discovered_started_ns")
        completed = e.get("time_discovered_completed_ns")
        dur = e.get("duration_ms")
        if completed is not None:
            end, known = int(completed), True
        elif started is not None and dur is not None:
            end, known = int(started) + int(round(float(dur) * 1e6)), True
        else:
            end, known = int(created), False
            n_open += 1
        nb = max(_nbytes(e.get("input_sizes"), e.get("input_dtypes")),
                 _nbytes(e.get("output_sizes"), e.get("output_dtypes")))
        cseq = e.get("collective_seq_id")
        rows.append(iteration=0, comm_id=cid, op=op, peer=peer, nbytes=nb, start_ns=int(created),
                    end_ns=max(end, int(created)),
                    seq=int(cseq) if (op not in ("send", "recv") and cseq is not None) else -1,
                    state=str(e.get("state") or "unknown"), end_known=known,
                    fr_record_id=e.get("record_id"), fr_collective_seq_id=cseq, fr_p2p_seq_id=e.get("p2p_seq_id"))
    return rows, n_open


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
