"""What-if-analysis (WIA) per-op parquet traces -> CommOps job.

The trace (``trace-<trial>.parquet``) has one row per op of each rank and step: ``dp_rank, stage,
rank, step, optype, start_ts, duration, seq_id`` (+ ``mc, gmc, mb_id``); times are seconds from the
step's start. ``meta-<trial>.yaml`` gives ``dp_size, pp_size, tp_size, world_size``.

Mapping (see ``docs/converters.md``):

=============================== =========================================================
optype                          CommOps
=============================== =========================================================
forward-send / backward-send    ``send`` to stage+1 / stage-1 (same dp_rank), group pp
forward-recv / backward-recv    ``recv`` from stage-1 / stage+1, group pp
grads-reduce-scatter            ``reduce_scatter`` on the stage's data-parallel group
params-all-gather               ``all_gather`` on the data-parallel group
embedding-grads-all-reduce      ``all_reduce`` on the embedding group (first + last stage)
layernorm-grads-all-reduce      ``all_reduce`` on the tensor-parallel group
other ``*-all-reduce`` etc.     the data-parallel group (warned)
``*-compute``, optimizer, gc     the rank's compute table (``compute/``), ``name`` = optype
optimizer-clip-main-grad        ``all_reduce`` on ``world`` (every rank, kind other): the
                                gradient-norm synchronisation before the optimizer step
send/recv never launched        dropped (WIA's type-1 no-ops, :func:`_p2p_noops`)
=============================== =========================================================

Steps become iterations (their numbers kept). The trace has no wall clock, so steps are laid
back to back (each lasting its longest rank's span) and ``iterations/`` records those spans;
``nbytes`` is 0 (sizes are not in the trace).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from holmes.adapters.build import build_job, check_output
from holmes.adapters.groups import GroupRegistry
from holmes.adapters.notes import Notes
from holmes.adapters.rows import RankRows
from holmes.errors import ConvertError, ParseError
from holmes.io import compute_table, iterations_table
from holmes.io.capped_parquet import read_parquet_capped

__all__ = ["convert_wia", "WIA_OPS"]

log = logging.getLogger(__name__)

REQUIRED = ("dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration", "seq_id")
# optype -> (op, group kind, stage step of the peer)
WIA_OPS: dict[str, tuple[str, str, int]] = {
    "forward-send": ("send", "pp", +1),
    "forward-recv": ("recv", "pp", -1),
    "backward-send": ("send", "pp", -1),
    "backward-recv": ("recv", "pp", +1),
    "grads-reduce-scatter": ("reduce_scatter", "dp", 0),
    "params-all-gather": ("all_gather", "dp", 0),
    "embedding-grads-all-reduce": ("all_reduce", "emb", 0),
    "layernorm-grads-all-reduce": ("all_reduce", "tp", 0),
    "optimizer-clip-main-grad": ("all_reduce", "world", 0),
}
_COMPUTE = ("compute", "optimizer", "gc")


def _is_compute(optype: str) -> bool:
    """Whether a WIA optype is the rank's own work (its compute table), not a wait or a transfer.

    >>> [_is_compute(o) for o in ("forward-compute", "optimizer", "gc", "optimizer-clip-main-grad", "forward-send")]
    [True, True, True, False, False]
    """
    return optype.endswith("-compute") or optype in ("optimizer", "gc")


def _find_files(src: Path) -> tuple[Path, Path | None]:
    if src.is_file():
        trace = src
    elif src.is_dir():
        cands = sorted(src.glob("trace-*.parquet")) or sorted(src.glob("*.parquet"))
        if not cands:
            raise ConvertError(f"{src}: no trace-*.parquet file")
        if len(cands) > 1:
            raise ConvertError(f"{src}: several traces {[c.name for c in cands]}; pass one file as SRC")
        trace = cands[0]
    else:
        raise ConvertError(f"{src}: no such file or directory")
    trial = trace.stem[len("trace-"):] if trace.stem.startswith("trace-") else trace.stem
    for m in (trace.parent / f"meta-{trial}.yaml", trace.parent / f"meta-{trial}.yml"):
        if m.is_file():
            return trace, m
    metas = sorted(trace.parent.glob("meta-*.y*ml"))
    return trace, (metas[0] if len(metas) == 1 else None)


_MAX_SIZE = 1 << 20  # a parallel degree larger than this is not a job description
_INT_COLS = ("dp_rank", "stage", "rank", "step", "seq_id")
_FLOAT_COLS = ("start_ts", "duration")


def _meta_size(meta: dict[str, Any], key: str, path: Path | None) -> int | None:
    """``meta[key]`` as a positive int, None when absent / null / 0; ConvertError naming file and key otherwise."""
    v = meta.get(key)
    if v is None or v == 0:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ConvertError(f"{path}: '{key}' is {v!r}, not a positive integer")
    try:
        x = int(v)
    except (TypeError, ValueError, OverflowError):
        raise ConvertError(f"{path}: '{key}' is {v!r}, not a positive integer") from None
    if x != v and str(x) != str(v).strip():
        raise ConvertError(f"{path}: '{key}' is {v!r}, not a positive integer")
    if not 1 <= x <= _MAX_SIZE:
        raise ConvertError(f"{path}: '{key}' is {x}, outside 1..{_MAX_SIZE}")
    return x


def _numeric_column(t: pa.Table, c: str, trace: Path, integer: bool) -> np.ndarray:
    """Column ``c`` as int64 / float64; ConvertError naming file and column for nulls, text, NaN or fractions."""
    col = t.column(c)
    typ = col.type.value_type if pa.types.is_dictionary(col.type) else col.type
    if not (pa.types.is_integer(typ) or pa.types.is_floating(typ)):
        raise ConvertError(f"{trace}: column '{c}' has type {col.type}, not a number")
    if col.null_count:
        raise ConvertError(f"{trace}: column '{c}' holds {col.null_count} null value(s)")
    if pa.types.is_dictionary(col.type):
        col = col.cast(typ)
    a = col.to_numpy()
    if pa.types.is_floating(typ):
        a = a.astype(np.float64)
        if not np.isfinite(a).all():
            raise ConvertError(f"{trace}: column '{c}' holds NaN or infinite values")
        if integer:
            if (a != np.round(a)).any() or (np.abs(a) >= 2.0 ** 62).any():
                raise ConvertError(f"{trace}: column '{c}' holds values that are not integers")
            return a.astype(np.int64)
        return a
    if pa.types.is_uint64(typ) and (a >= 2 ** 62).any():
        raise ConvertError(f"{trace}: column '{c}' holds values out of range")
    return a.astype(np.int64 if integer else np.float64)


def _read_meta(path: Path | None, notes: Notes) -> dict[str, Any]:
    if path is None:
        notes.warn("no meta-*.yaml next to the trace: parallel sizes inferred from the trace")
        return {}
    import yaml

    from holmes.limits import max_json_bytes, read_capped

    raw = read_capped(path, max_json_bytes(), what="meta yaml")
    try:
        meta = yaml.safe_load(raw.decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError, RecursionError) as exc:
        raise ParseError(f"{path}: not a readable YAML file: {exc}") from None
    if not isinstance(meta, dict):
        raise ParseError(f"{path}: expected a mapping of job settings")
    return meta


def convert_wia(src: str | os.PathLike[str], out: str | os.PathLike[str], *, overwrite: bool = False,
                progress: Any = None) -> Path:
    """Convert a what-if-analysis trace (parquet + meta yaml) to a CommOps job directory.

    Parameters
    ----------
    src : path-like
        The ``trace-<trial>.parquet`` file or the directory holding it and ``meta-<trial>.yaml``.
    out : path-like
        Job directory to create.
    overwrite : bool, default False

    Raises
    ------
    ParseError
        The parquet or yaml file is unreadable / truncated.
    ConvertError
        A required column is missing, ranks contradict (dp_rank, stage), or sizes disagree.

    Examples
    --------
    >>> import holmes
    >>> from holmes.adapters import convert_wia
    >>> job = holmes.read_job(convert_wia("traces/wia", "/tmp/wia-job"))  # doctest: +SKIP
    >>> job.world_size                                                          # doctest: +SKIP
    8
    """
    check_output(out, overwrite, src=src)  # types, never clobber, never inside src
    src, out = Path(src), Path(out)
    trace, meta_path = _find_files(src)
    notes = Notes("wia", str(src))
    meta = _read_meta(meta_path, notes)
    try:
        t = read_parquet_capped(trace, where="WIA trace")
    except (pa.ArrowInvalid, pa.ArrowException, OSError) as exc:
        raise ParseError(f"{trace}: not a readable parquet file, truncated or corrupt: {exc}") from None
    missing = [c for c in REQUIRED if c not in t.column_names]
    if missing:
        raise ConvertError(f"{trace}: missing column(s) {missing} of a WIA trace")
    extra = sorted(set(t.column_names) - set(REQUIRED) - {"mc", "gmc", "mb_id"})
    if extra:
        notes.warn(f"{trace.name}: unknown column(s) {extra} ignored")
    if t.num_rows == 0:
        raise ConvertError(f"{trace}: the trace has no rows (no operator at all)")
    cols = {c: _numeric_column(t, c, trace, integer=True) for c in _INT_COLS}
    cols.update({c: _numeric_column(t, c, trace, integer=False) for c in _FLOAT_COLS})
    try:
        optype_col = t.column("optype").cast(pa.string())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise ConvertError(f"{trace}: column 'optype' is not text: {exc}") from None
    if optype_col.null_count:
        raise ConvertError(f"{trace}: column 'optype' holds {optype_col.null_count} null value(s)")
    optype = np.asarray(optype_col.to_pylist(), dtype=object)
    dp_rank, stage, rank, step = (cols[c] for c in ("dp_rank", "stage", "rank", "step"))
    start_s, dur_s = cols["start_ts"], cols["duration"]
    if (dur_s < 0).any():
        raise ConvertError(f"{trace}: column 'duration' holds negative values")
    if (np.abs(start_s) + dur_s > 1e6).any():
        raise ConvertError(f"{trace}: column 'start_ts'/'duration' holds values beyond 10^6 s from the step start")
    sizes = {k: _meta_size(meta, k, meta_path) for k in ("dp_size", "pp_size", "tp_size", "world_size", "dsp_size",
                                                         "vpp_size")}
    if min(dp_rank.min(), stage.min(), rank.min()) < 0 or max(dp_rank.max(), stage.max(), rank.max()) >= _MAX_SIZE:
        raise ConvertError(f"{trace}: columns 'dp_rank'/'stage'/'rank' hold values outside 0..{_MAX_SIZE - 1}")
    dp = sizes["dp_size"] or int(dp_rank.max()) + 1
    pp = sizes["pp_size"] or int(stage.max()) + 1
    tp = sizes["tp_size"] or 1
    ws = sizes["world_size"] or dp * pp * tp
    if dp * pp > _MAX_SIZE:
        raise ConvertError(f"{meta_path or trace}: dp x pp = {dp * pp} is larger than {_MAX_SIZE}")
    if tp > 1 or (sizes["dsp_size"] or 1) > 1 or (sizes["vpp_size"] or 1) > 1:
        notes.warn("tp/dsp/vpp > 1: the trace holds one row per (dp_rank, stage); other dimensions are not modelled")
    if dp_rank.max() >= dp or stage.max() >= pp or rank.max() >= ws:
        raise ConvertError(f"{trace}: dp_rank/stage/rank outside the meta sizes dp={dp} pp={pp} world_size={ws}")
    grid = np.full((dp, pp), -1, dtype=np.int64)
    grid[dp_rank, stage] = rank
    if (grid[dp_rank, stage] != rank).any():
        raise ConvertError(f"{trace}: column 'rank' is not a function of (dp_rank, stage)")
    if (grid < 0).any():
        notes.warn(f"{trace.name}: some (dp_rank, stage) cells have no rows")
    notes.details.update({"dp": dp, "pp": pp, "tp": tp, "steps": int(len(np.unique(step)))})

    # process groups
    reg = GroupRegistry()
    for d in range(dp):
        if (grid[d] >= 0).all():
            reg.add(f"pp{d}", grid[d].tolist(), "PIPELINE_MODEL_PARALLEL_GROUP", comm_id=f"pp-{d}")
            reg.add(f"emb{d}", sorted({int(grid[d, 0]), int(grid[d, pp - 1])}), "EMBEDDING_GROUP", comm_id=f"emb-{d}")
    for s in range(pp):
        if (grid[:, s] >= 0).all():
            reg.add(f"dp{s}", grid[:, s].tolist(), "DATA_PARALLEL_GROUP", comm_id=f"dp-{s}")
    for r in np.unique(rank).tolist():
        reg.add(f"tp{r}", [r], "TENSOR_MODEL_PARALLEL_GROUP", comm_id=f"tp-{r}")
    if (optype == "optimizer-clip-main-grad").any():
        reg.add("world", np.unique(rank).tolist(), "OPTIMIZER_GRAD_NORM", kind="other", comm_id="world")

    # op mapping, vectorized over rows
    kinds = np.array([WIA_OPS.get(o, (None, None, 0))[1] for o in optype.tolist()], dtype=object)
    ops = np.array([WIA_OPS.get(o, (None, None, 0))[0] for o in optype.tolist()], dtype=object)
    delta = np.array([WIA_OPS.get(o, (None, None, 0))[2] for o in optype.tolist()], dtype=np.int64)
    unknown_coll = np.array([o not in WIA_OPS and any(k in o for k in ("all-reduce", "all-gather", "reduce-scatter"))
                             for o in optype.tolist()])
    if unknown_coll.any():
        names = sorted(set(optype[unknown_coll].tolist()))
        notes.warn(f"collective optype(s) {names} of unknown group: mapped to the data-parallel group")
        ops[unknown_coll] = [("all_reduce" if "all-reduce" in o else "all_gather" if "all-gather" in o
                              else "reduce_scatter") for o in optype[unknown_coll].tolist()]
        kinds[unknown_coll] = "dp"
    keep = ops != None  # noqa: E711 (object array)
    dropped = optype[~keep]
    if len(dropped):
        vals, counts = np.unique(dropped.astype(str), return_counts=True)
        vals, counts = vals.tolist(), counts.tolist()
        compute = {v: int(c) for v, c in zip(vals, counts) if _is_compute(v)}
        sync = {v: int(c) for v, c in zip(vals, counts) if v not in compute and any(k in v for k in _COMPUTE)}
        other = {v: int(c) for v, c in zip(vals, counts) if v not in compute and v not in sync}
        if compute:
            notes.infer(f"compute ops written to compute/ (the ranks' own work): {compute}")
            notes.details["compute"] = compute
        if sync:
            notes.infer(f"synchronising ops dropped (mostly waiting; no communicator describes them): {sync}")
            notes.details["dropped_compute"] = sync
        for v, c in other.items():
            notes.skip(v, c)
    peer_stage = stage + delta
    is_p2p = np.isin(ops, ("send", "recv"))
    bad_peer = is_p2p & ((peer_stage < 0) | (peer_stage >= pp))
    if bad_peer.any():
        notes.warn(f"{int(bad_peer.sum())} send/recv row(s) point past the first/last stage; dropped")
        keep &= ~bad_peer
    noop = _p2p_noops(optype, rank, step, start_s, dur_s) & keep
    if noop.any():
        notes.warn(f"{int(noop.sum())} send/recv row(s) recorded but never launched (a receive after the last "
                   "compute of its direction, a send before the first): dropped, as the what-if analyzer does")
        notes.details["p2p_noops"] = int(noop.sum())
        keep &= ~noop
    peer = np.where(is_p2p, grid[dp_rank, np.clip(peer_stage, 0, pp - 1)], -1)
    comm = np.empty(len(ops), dtype=object)
    comm[kinds == "pp"] = np.char.add("pp", dp_rank[kinds == "pp"].astype(str)).astype(object)
    comm[kinds == "emb"] = np.char.add("emb", dp_rank[kinds == "emb"].astype(str)).astype(object)
    comm[kinds == "dp"] = np.char.add("dp", stage[kinds == "dp"].astype(str)).astype(object)
    comm[kinds == "tp"] = np.char.add("tp", rank[kinds == "tp"].astype(str)).astype(object)
    comm[kinds == "world"] = "world"
    emb_bad = (kinds == "emb") & ~np.isin(stage, (0, pp - 1))
    if emb_bad.any():
        notes.warn(f"{int(emb_bad.sum())} embedding all-reduce row(s) on a middle stage; dropped")
        keep &= ~emb_bad

    # time: steps laid back to back, each as long as its longest rank span
    steps, step_idx = np.unique(step, return_inverse=True)
    span = np.zeros(len(steps))
    ran = ~noop  # a send/recv never launched does not make a step longer
    np.maximum.at(span, step_idx[ran], (start_s + dur_s)[ran])
    offset = np.r_[0.0, np.cumsum(span)[:-1]]
    start_ns = np.round((offset[step_idx] + start_s) * 1e9).astype(np.int64)
    end_ns = start_ns + np.round(dur_s * 1e9).astype(np.int64)
    notes.infer("durations are seconds; steps laid back to back (no wall clock in the trace), each lasting its "
                "longest rank's span; iterations/ holds those spans")
    notes.infer("iteration = the trace's step number")
    notes.infer("groups: pp per dp_rank, dp per stage, embedding = first+last stage, layernorm all-reduce on tp")
    notes.warn("message sizes are not in WIA traces: nbytes = 0")

    rows: dict[int, RankRows] = {}
    iters: dict[int, pa.Table] = {}
    comp_rows = np.array([_is_compute(o) for o in optype.tolist()], dtype=bool)
    compute = _compute_tables(comp_rows, rank, step, optype, start_ns, end_ns, cols["seq_id"], t, trace)
    idx = np.flatnonzero(keep)
    if not len(idx):
        names = sorted(set(optype.tolist()))
        raise ConvertError(f"{trace}: column 'optype' holds no usable communication operator (values: {names[:10]})")
    order = idx[np.lexsort((cols["seq_id"][idx], start_ns[idx], rank[idx]))]
    comm_ids = {k: reg.comm_id(k) for k in set(comm[order].tolist())}
    bounds = np.r_[0, np.flatnonzero(np.diff(rank[order])) + 1, len(order)]
    mb = np.full(len(ops), -1, dtype=np.int64)
    if "mb_id" in t.column_names:
        try:
            mb = _numeric_column(t, "mb_id", trace, integer=True)
        except ConvertError as exc:
            notes.warn(f"{exc}; extra column mb_id set to -1")
    for a, b in zip(bounds[:-1], bounds[1:]):
        sel = order[a:b]
        r = int(rank[sel[0]])
        rr = RankRows(r, ("wia_optype", "wia_seq_id", "mb_id", "wia_stage", "wia_dp_rank"))
        rr.cols.update(iteration=step[sel].tolist(), comm_id=[comm_ids[c] for c in comm[sel].tolist()],
                       op=ops[sel].tolist(), peer=[int(p) if p >= 0 else None for p in peer[sel].tolist()],
                       nbytes=[0] * len(sel), start_ns=start_ns[sel].tolist(), end_ns=end_ns[sel].tolist(),
                       seq=[-1] * len(sel), wia_optype=optype[sel].tolist(),
                       wia_seq_id=cols["seq_id"][sel].tolist(), mb_id=mb[sel].tolist(),
                       wia_stage=stage[sel].tolist(), wia_dp_rank=dp_rank[sel].tolist())
        rows[r] = rr
        st = np.unique(step_idx[rank == r])
        iters[r] = iterations_table(np.full(len(st), r, dtype=np.int32), steps[st],
                                    np.round(offset[st] * 1e9).astype(np.int64),
                                    np.round((offset[st] + span[st]) * 1e9).astype(np.int64))
    compute = {r: c for r, c in compute.items() if r in rows}
    return build_job(out, notes, reg, rows, world_size=ws, iterations=iters, compute=compute, overwrite=overwrite,
                     src=src, progress=progress)


_NOOP_EPS = 5e-5  # s: clock slack between a compute op and the send/recv it feeds or waits on


def _p2p_noops(optype: np.ndarray, rank: np.ndarray, step: np.ndarray, start_s: np.ndarray,
               dur_s: np.ndarray) -> np.ndarray:
    """Per row, whether it is a send/recv the trace's profiler recorded but the schedule never
    launched (WIA's "type 1 no-ops", at the beginning or end of a step): a forward (backward) receive
    that starts after the rank's last forward (backward) compute of the step started -- nothing
    would consume it --, or a send that ends before the rank's first compute of that direction ended
    -- nothing produced it. Ranks and steps without compute ops of that direction are left alone.

    >>> o = np.array(["forward-recv", "forward-compute", "forward-send", "forward-recv"], dtype=object)
    >>> _p2p_noops(o, np.zeros(4, np.int64), np.zeros(4, np.int64), np.array([0.0, 1.0, 2.0, 3.0]),
    ...            np.full(4, 0.5)).tolist()
    [False, False, False, True]
    """
    n = len(optype)
    out = np.zeros(n, np.bool_)
    _, g = np.unique(np.stack([rank, step], 1), axis=0, return_inverse=True)
    g = g.ravel()
    ng = int(g.max()) + 1 if n else 0
    end_s = start_s + dur_s
    for t in ("forward", "backward"):
        c = optype == f"{t}-compute"
        if not c.any():
            continue
        last_start = np.full(ng, -np.inf)
        first_end = np.full(ng, np.inf)
        np.maximum.at(last_start, g[c], start_s[c])
        np.minimum.at(first_end, g[c], end_s[c])
        has = np.zeros(ng, np.bool_)
        has[g[c]] = True
        recv = (optype == f"{t}-recv") & has[g] & (start_s > last_start[g] + _NOOP_EPS)
        send = (optype == f"{t}-send") & has[g] & (end_s < first_end[g] - _NOOP_EPS)
        out |= recv | send
    return out


def _compute_tables(sel: np.ndarray, rank: np.ndarray, step: np.ndarray, optype: np.ndarray, start_ns: np.ndarray,
                    end_ns: np.ndarray, seq_id: np.ndarray, t: pa.Table, trace: Path) -> dict[int, pa.Table]:
    """Per rank, its compute table: the rows ``sel`` (forward/backward compute, optimizer, gc) with
    ``name`` = optype, on the same laid-out clock as the rank's operators; ``mb_id`` and
    ``wia_seq_id`` kept."""
    idx = np.flatnonzero(sel)
    if not len(idx):
        return {}
    mb = np.full(len(rank), -1, dtype=np.int64)
    if "mb_id" in t.column_names:
        try:
            mb = _numeric_column(t, "mb_id", trace, integer=True)
        except ConvertError:
            pass  # warned about with the operators
    idx = idx[np.lexsort((start_ns[idx], step[idx], rank[idx]))]
    bounds = np.r_[0, np.flatnonzero(np.diff(rank[idx])) + 1, len(idx)]
    out: dict[int, pa.Table] = {}
    for a, b in zip(bounds[:-1], bounds[1:]):
        s = idx[a:b]
        r = int(rank[s[0]])
        out[r] = compute_table(rank=np.full(len(s), r, dtype=np.int32), iteration=step[s],
                               name=pa.array(optype[s].tolist(), pa.string()).dictionary_encode(),
                               start_ns=start_ns[s], end_ns=end_ns[s], mb_id=pa.array(mb[s]),
                               wia_seq_id=pa.array(seq_id[s]))
    return out
