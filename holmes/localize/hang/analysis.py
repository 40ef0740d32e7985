"""The hang analysis: the ranks everyone's waiting comes down to, and who waits for whom.

A hung job leaves logs whose last ops are in flight (CommOps ``state`` ``started`` or
``scheduled``, from a Flight Recorder dump or :mod:`holmes.logger`'s dump on a timeout, a signal or
an exception). Its steps, as :class:`~holmes.localize.pipeline.Localizer` runs them:

1. **select** -- every rank's operators, collectives and P2P (rank, comm_id, seq, op, peer,
   start_ns, state). Only a job that can hold ops in flight is read whole (``job.json`` has a
   ``dump``, or the pivot's log has a ``state`` column); an old job (no ``state``) costs one read
   of the pivot, which the irregular analysis reads anyway;
2. **gather** -- the wait-for graph over every operator in flight
   (:func:`holmes.localize.hang.waitgraph.wait_graph`): a collective waits for its members that are
   neither in it nor past it (no log, never issued it, or blocked on something else), a ``recv``
   for the peer's matching ``send`` (same communicator, P2P ``seq``), a ``send`` for the matching
   ``recv``, a batch of P2P for each half; an operator a peer completed while this rank still runs
   it means the rank's own device stopped. Job-level ``extra["progress"]`` (Flight Recorder's
   ``pg_status``) fills in what a ring buffer evicted. The **roots** (sinks the waiting reaches)
   are the culprits; a sink of several ranks is a **deadlock**; every other stuck rank is
   **waiting**, with a chain to its root (``wait_chains``). Per stuck collective (and P2P
   operator) a ``communicators`` entry: ``missing``, ``waiting``, ``waiting_for``, ``stalled``
   (missing members with an older collective in flight there), ``not_issued``, ``no_log``;
3. **rank** -- the roots as ``gpu:<rank>`` devices with ``evidence=("hang",)`` scored by the share
   of stuck ranks behind them; a host when all its ranks are roots. A root with its own log is
   certain (confidence 0.99: it stopped inside an operator its peers completed, or has nothing in
   flight -- its log ends in compute or its process exited), a rank with no log a prime suspect
   (0.9), a deadlock's ranks 0.9; ranks stuck inside an operator every participant entered (none
   missing) are named (0.5, below the naming bar) only when no other root explains them.

Examples
--------
>>> import pyarrow as pa
>>> from holmes.io import MemoryJob
>>> from holmes.io.schema import ops_table
>>> def log(r, states):
...     n = len(states)
...     return ops_table(rank=[r] * n, iteration=list(range(n)), op_index=[0] * n, comm_id=["dp-0"] * n,
...                      seq=list(range(n)), op=["all_reduce"] * n, peer=[None] * n, nbytes=[8] * n,
...                      start_ns=[10 * i for i in range(n)],
...                      end_ns=[10 * i + 5 if s == "completed" else None for i, s in enumerate(states)],
...                      state=states)
>>> meta = {"world_size": 4, "communicators": {"dp-0": {"kind": "dp", "ranks": [0, 1, 2, 3]}},
...         "dump": {"reason": "timeout", "at_ns": 180_000_000_020}}
>>> done, stuck = ["completed", "completed"], ["completed", "completed", "started"]
>>> job = MemoryJob(meta, {0: log(0, stuck), 1: log(1, stuck), 2: log(2, done), 3: log(3, stuck)})
>>> import holmes
>>> report = holmes.localize(job, analysis="hang")
>>> report.verdict, [d.id for d in report.devices], report.hang["culprit_ranks"]
('hang', ['gpu:2'], [2])
>>> c = report.hang["communicators"][0]
>>> c["comm_id"], c["seq"], c["op"], c["missing"], c["waiting"]
('dp-0', 2, 'all_reduce', [2], [0, 1, 3])
>>> report.hang["explanation"][0]
'rank 2 never entered all_reduce #2 of dp-0; ranks 0-1,3 waited 180 s; 3 stuck rank(s) wait behind it'
>>> report.hang["wait_chains"][0], report.hang["deadlock"]
([[0, 'all_reduce', 'dp-0', 2, 2]], None)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from holmes._ranges import format_int_ranges
from holmes.display import SHOWN_CHAINS, SHOWN_ITEMS, SHOWN_WAITING
from holmes.io.schema import P2P_OPS
from holmes.localize.hang.waitgraph import (ROOT_IDLE, ROOT_INSIDE, ROOT_NO_LOG, ROOT_STALLED, WaitGraph,
                                       wait_graph)
from holmes.localize.report import DeviceScore
from holmes.topology import kinds
from holmes.units import NS_PER_S

__all__ = ["HangAnalysis", "HangSelection", "HangEvidence", "CommHang"]

log = logging.getLogger(__name__)

_COLS = ("rank", "comm_id", "seq", "op", "peer", "start_ns")
#: the threshold holding the confidence of a root of each kind: with its own log / without any log /
#: stuck inside an operator every participant entered (which of them cannot be told); a rank in a wait
#: cycle (the deadlock's ranks) has ``hang_conf_deadlock``
_CONF = {ROOT_IDLE: "hang_conf_culprit", ROOT_STALLED: "hang_conf_culprit", ROOT_NO_LOG: "hang_conf_no_log",
         ROOT_INSIDE: "hang_conf_cycle"}
#: wait chains a report draws (every root's longest first); they bound the report, not the analysis
MAX_CHAINS = SHOWN_CHAINS


@dataclass
class HangSelection:
    """The in-flight ops at the end of the logs (every rank's collectives, read once)."""

    ops: pa.Table | None = None          # rank, comm_id, seq, op, start_ns, open (bool) of every rank
    in_flight: int = 0                   # ops not completed, collectives and P2P
    p2p_in_flight: int = 0
    no_log: dict[int, str] = field(default_factory=dict)   # rank -> why it has no log
    dump: dict[str, Any] | None = None   # job.json's ``dump``
    weights: dict[int, float] = field(default_factory=dict)  # the pipeline's verdict reads it


@dataclass
class CommHang:
    """Where one communicator is stuck."""

    comm_id: str
    seq: int
    op: str | None
    missing: list[int]
    waiting: list[int]
    scheduled: list[int] = field(default_factory=list)
    stalled: dict[int, int] = field(default_factory=dict)   # rank -> the seq it never completed
    no_log: list[int] = field(default_factory=list)
    waited_s: float | None = None
    not_issued: list[int] = field(default_factory=list)     # members whose log never issued ``seq``
    waiting_for: list[int] = field(default_factory=list)    # the ranks its stuck members wait on
    peer: int | None = None                                 # P2P: the peer waited for (``seq`` its P2P seq)

    def to_json(self) -> dict[str, Any]:
        out = {"comm_id": self.comm_id, "seq": self.seq, "op": self.op, "missing": list(self.missing),
               "waiting": list(self.waiting), "scheduled": list(self.scheduled),
               "stalled": {str(r): s for r, s in sorted(self.stalled.items())}, "no_log": list(self.no_log),
               "not_issued": list(self.not_issued),
               "waited_s": None if self.waited_s is None else round(self.waited_s, 3),
               "waiting_for": list(self.waiting_for)}
        if self.peer is not None:
            out["peer"] = self.peer
        return out


@dataclass
class HangEvidence:
    """What the hang analysis found."""

    found: bool = False
    communicators: list[CommHang] = field(default_factory=list)
    culprits: dict[int, float] = field(default_factory=dict)   # rank -> confidence
    all_waiting: int = 0      # communicators whose members all wait in the same collective
    explanation: list[str] = field(default_factory=list)
    no_log: list[int] = field(default_factory=list)
    deadlocks: list[list[int]] = field(default_factory=list)  # the ranks of each wait cycle
    waiting: list[int] = field(default_factory=list)          # stuck ranks that wait (for a root)
    behind: dict[int, int] = field(default_factory=dict)      # root -> stuck ranks whose chain ends there
    chains: list[list[list[Any]]] = field(default_factory=list)   # [[rank, op, comm_id, seq, waits_for], ...]
    inside: list[int] = field(default_factory=list)           # ranks in an operator all its participants entered
    graph: WaitGraph | None = None

    def to_json(self) -> dict[str, Any]:
        """The report's ``hang`` object (``docs/cli.md``; plus ``explanation``, ``ranks_without_log``,
        ``deadlocks`` (every cycle), ``waiting_count``, ``root_kinds`` and ``behind``)."""
        g = self.graph
        return {"communicators": [c.to_json() for c in self.communicators],
                "culprit_ranks": sorted(self.culprits), "explanation": list(self.explanation),
                "ranks_without_log": list(self.no_log), "wait_chains": [list(map(list, c)) for c in self.chains],
                "deadlock": sorted(self.deadlocks[0]) if self.deadlocks else None,
                "deadlocks": [sorted(c) for c in self.deadlocks], "waiting_count": len(self.waiting),
                "root_kinds": {str(r): k for r, k in sorted((g.root_kind if g else {}).items())},
                "behind": {str(r): n for r, n in sorted(self.behind.items())}, "stuck_inside": list(self.inside)}


class HangAnalysis:
    """Localize a hang from the ops in flight at the end of the logs (select -> gather -> rank)."""

    name = "hang"
    reads_every_rank = False

    @staticmethod
    def ends_run(finding: Any) -> bool:
        """A hang found ends the run: the timing analyses after it need completed iterations."""
        return bool(getattr(finding.evidence, "found", False))

    @staticmethod
    def report_fields(run: Any, finding: Any) -> dict[str, Any]:
        """The report's ``hang`` object when ops were in flight at the end of the logs."""
        return {"hang": finding.evidence.to_json()} if getattr(finding.evidence, "found", False) else {}

    def select(self, run: Any) -> HangSelection:
        """Every rank's collectives when the job can hold ops in flight; nothing otherwise."""
        src = run.source
        sel = HangSelection(dump=getattr(src.job, "dump", None) if hasattr(src, "job") else None)
        pivot = src.fetch(run.params.pivot)
        if sel.dump is None and (pivot is None or "state" not in pivot.column_names):
            return sel  # an old job: every op completed
        parts = []
        for ranks, have, tables in _every_rank(src, list(_COLS) + ["state"]):
            for r in ranks:
                if r not in have:
                    sel.no_log[r] = src.missing.get(r, "no log")
            for t in tables:
                if not t.num_rows:
                    continue
                if "state" not in t.column_names:  # old logs: every op completed
                    t = t.append_column("state", pa.array(["completed"] * t.num_rows, pa.string()))
                elif t.column("state").null_count:  # old logs batched with dumps
                    t = t.set_column(t.schema.get_field_index("state"), "state",
                                     pc.fill_null(t.column("state").cast(pa.string()), "completed"))
                parts.append(t.select(list(_COLS) + ["state"]))
        if parts:
            try:
                ops = pa.concat_tables(parts)
            except pa.ArrowInvalid:  # ranks whose columns differ in encoding or width
                ops = pa.concat_tables([p.cast(_unify(p.schema)) for p in parts])
            if pa.types.is_dictionary(ops.schema.field("comm_id").type) or \
                    pa.types.is_dictionary(ops.schema.field("op").type) or ops.schema != _unify(ops.schema):
                ops = ops.cast(_unify(ops.schema))
            ops = ops.combine_chunks()  # one chunk, not one per rank: every column pass below is one pass
            state = ops.column("state")
            is_open = pc.not_equal(state, "completed")
            ops = ops.drop_columns(["state"]).append_column("open", is_open) \
                .append_column("scheduled", pc.equal(state, "scheduled"))
            sel.in_flight = int(pc.sum(is_open).as_py() or 0)
            p2p = pc.is_in(ops.column("op"), value_set=pa.array(list(P2P_OPS)))
            sel.p2p_in_flight = int(pc.sum(pc.and_(p2p, is_open)).as_py() or 0)
            sel.ops = ops
        if sel.in_flight:
            log.info("hang: %d op(s) in flight over %d rank(s)", sel.in_flight, src.world_size)
        return sel

    def gather(self, run: Any, sel: HangSelection) -> HangEvidence:
        """The wait-for graph over every operator in flight (:mod:`holmes.localize.hang.waitgraph`): its
        roots are the culprits, every other stuck rank waits, with a chain to its root."""
        ev = HangEvidence(no_log=sorted(sel.no_log))
        if not sel.in_flight:
            return ev
        ev.found = True
        ops = sel.ops
        if ops is None or ops.num_rows == 0:
            run.assume("no operator in the logs: the hang cannot be placed")
            return ev
        g, comm_names = _graph(run, sel)
        ev.graph = g
        waited_at = (sel.dump or {}).get("at_ns")
        start = ops.column("start_ns").to_numpy(zero_copy_only=False)
        sched = ops.column("scheduled").to_numpy(zero_copy_only=False)
        for nd in g.nodes:
            rows = nd.rows[nd.rows < len(start)]   # rows past the table: collectives a status shows evicted
            st = start[rows]
            st = st[~np.isnan(st)] if st.dtype.kind == "f" else st
            t0 = int(st.min()) if len(st) else None
            have = ~nd.missing_no_log
            ev.communicators.append(CommHang(
                comm_names[nd.comm], nd.seq, nd.op, [int(x) for x in nd.missing], [int(x) for x in nd.blocked],
                sorted(int(x) for x, r in zip(nd.blocked, nd.rows) if r < len(sched) and sched[r]),
                {int(m): int(o) for m, o, h in zip(nd.missing, nd.missing_open, have) if h and 0 <= o < nd.seq},
                [int(x) for x in nd.missing[nd.missing_no_log]], _waited(waited_at, t0),
                [int(x) for x in nd.missing[have & (nd.missing_last < nd.seq)]],
                waiting_for=[int(x) for x in nd.missing]))
        for r, op, c, k, p in g.p2p:
            ev.communicators.append(CommHang(comm_names[c], k, op, [p], [r], no_log=[p] if p in sel.no_log else [],
                                             waiting_for=[p], peer=p))
        ev.communicators.sort(key=lambda c: (c.comm_id, c.seq, c.op or "", c.waiting[:1]))
        ev.all_waiting = sum(1 for r in g.roots if g.root_kind[r] == ROOT_INSIDE)
        if ev.all_waiting:
            run.assume(f"{ev.all_waiting} rank(s) wait in an operator every participant entered and none "
                       "completed (stuck inside it: transport, kernel, or a stream stopped behind it)")
        ends, depth = g.ends()
        # ranks stuck inside an operator every participant entered are explained by a root
        # elsewhere when there is one (a stream stopped behind it, order evicted from a ring
        # buffer); they are the finding only when nothing else is, or when a collective's
        # members wait for them (they never entered it: their own stop is the finding)
        in_coll = set()   # ranks a collective waits for (missing members of a stuck collective)
        for nd in g.nodes:
            in_coll.update(int(x) for x in nd.missing)
        ev.inside = [r for r in g.roots if g.root_kind[r] == ROOT_INSIDE and r not in in_coll]
        others = [r for r in g.roots if r not in ev.inside]
        t = run.params.t
        ev.culprits = {r: t.hang_conf_culprit if g.root_kind[r] == ROOT_INSIDE and r in in_coll
                       else getattr(t, _CONF[g.root_kind[r]]) for r in (others if others or g.deadlocks else g.roots)}
        for cyc in g.deadlocks:
            ev.culprits.update({r: t.hang_conf_deadlock for r in cyc})
        ev.deadlocks = [list(c) for c in g.deadlocks]
        ev.waiting = list(g.waiting)
        counts = np.bincount(ends[ends >= 0], minlength=g.world_size)
        ev.behind = {r: int(counts[r]) - 1 for r in g.roots}
        for cyc in g.deadlocks:
            ev.behind.update({r: int(counts[min(cyc)]) - len(cyc) for r in cyc})
        ev.chains = _pick_chains(g, ends, depth)
        ev.explanation = _explain(ev, g)
        if sel.no_log:
            run.assume(f"rank(s) {format_ranges(sorted(sel.no_log))} have no log (too dead to dump?): "
                       "they wait for nobody; those others wait for are named")
        if ev.deadlocks:
            run.assume(f"{len(ev.deadlocks)} wait cycle(s): a deadlock (send/recv or collective order "
                       "mismatched), not a slow or dead device")
        return ev

    def rank(self, run: Any, ev: HangEvidence, sel: HangSelection | None = None) -> list[DeviceScore]:
        """The roots as ``gpu:<rank>`` (and ``host:<n>`` when all its ranks are roots); score: the
        share of the stuck ranks whose chain ends at the root."""
        if not ev.culprits:
            return []
        counts = {r: ev.behind.get(r, 0) + 1 for r in ev.culprits}  # itself and the ranks behind it
        total = float(sum(counts.values())) or 1.0
        out = [DeviceScore(kinds.gpu(r), "gpu", counts[r] / total, float(counts[r]), counts[r],
                           confidence=conf, evidence=(self.name,)) for r, conf in ev.culprits.items()]
        topo = run.topology
        if topo is not None and run.params.t.include_host:
            hosts: dict[int, list[int]] = {}
            for r in ev.culprits:
                hosts.setdefault(int(topo.host_of(r)), []).append(r)
            for h, rs in hosts.items():
                on_host = [g for g in range(run.source.world_size) if int(topo.host_of(g)) == h]
                if len(rs) == len(on_host) and len(on_host) > 1:
                    out.append(DeviceScore(kinds.host(h), "host", max(counts[r] for r in rs) / total,
                                           float(sum(counts[r] for r in rs)), sum(counts[r] for r in rs),
                                           confidence=min(ev.culprits[r] for r in rs), evidence=(self.name,)))
        return sorted(out, key=lambda d: (-(d.confidence or 0.0), -d.score, d.id))


def _every_rank(src: Any, columns: list[str]) -> Any:
    """``(ranks, have, tables)`` over every rank of ``src``, a batch at a time: ``have`` the ranks
    with a usable log (the others' reasons are in ``src.missing``), ``tables`` their rows. Read in
    batches (:meth:`~holmes.localize.evidence.sources.JobSource.stream_batches`) when the source can."""
    if hasattr(src, "stream_batches"):
        for b in src.stream_batches(columns=columns):
            yield b.ranks, set(b.tables), [b.table] if b.tables else []
        return
    for r in range(src.world_size):
        t = src.fetch(r)
        yield [r], set() if t is None else {r}, [] if t is None else [t.select([c for c in columns
                                                                                 if c in t.column_names])]


def format_ranges(ranks: list[int]) -> str:
    """``[0, 1, 2, 5, 8, 9]`` -> ``"0-2,5,8-9"`` (:func:`holmes._ranges.format_int_ranges`).

    >>> format_ranges([8, 9, 10, 11, 12, 13, 14, 15, 3])
    '3,8-15'
    """
    return format_int_ranges(ranks)


def _unify(schema: pa.Schema) -> pa.Schema:
    """Plain string/int types so tables of ranks with dictionary or narrower columns concatenate."""
    types = {"rank": pa.int32(), "comm_id": pa.string(), "seq": pa.int64(), "op": pa.string(), "peer": pa.int32(),
             "start_ns": pa.int64(), "state": pa.string(), "open": pa.bool_(), "scheduled": pa.bool_()}
    return pa.schema([pa.field(f.name, types[f.name]) for f in schema])


def _codes(col: Any) -> tuple[np.ndarray, list[str]]:
    """A string column as (int codes, names) through Arrow's dictionary encoding."""
    d = pc.dictionary_encode(col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col)
    return d.indices.to_numpy(zero_copy_only=False).astype(np.int64), [str(x) for x in d.dictionary.to_pylist()]


def _graph(run: Any, sel: HangSelection) -> tuple[WaitGraph, list[str]]:
    """The wait-for graph of ``sel.ops`` (numpy arrays from the Arrow columns, codes for strings)."""
    ops = sel.ops
    comm, comm_names = _codes(ops.column("comm_id"))
    op, op_names = _codes(ops.column("op"))
    comms = run.source.communicators
    members = {}
    for code, cid in enumerate(comm_names):
        c = comms.get(cid)
        if c is not None:
            members[code] = [int(x) for x in (getattr(c, "ranks", c) or ())]
    big = np.iinfo(np.int64).max
    code = {c: i for i, c in enumerate(comm_names)}
    prog = [(int(r), code[cid], int(v[0]), int(v[1])) for r, per in _progress(run.source).items()
            for cid, v in per.items() if cid in code]
    g = wait_graph(progress=tuple(np.asarray(x, np.int64) for x in zip(*prog)) if prog else None,
                   rank=ops.column("rank").to_numpy(zero_copy_only=False).astype(np.int64), comm=comm,
                   seq=pc.fill_null(ops.column("seq"), -1).to_numpy(zero_copy_only=False),
                   op=op, op_names=op_names,
                   peer=pc.fill_null(ops.column("peer"), -1).to_numpy(zero_copy_only=False),
                   start=pc.fill_null(ops.column("start_ns"), big).to_numpy(zero_copy_only=False),
                   is_open=ops.column("open").to_numpy(zero_copy_only=False), members=members,
                   world_size=run.source.world_size, comm_names=comm_names, no_log=sel.no_log)
    return g, comm_names


def _progress(src: Any) -> dict[int, dict[str, list[int]]]:
    """``job.json``'s ``extra["progress"]`` (rank -> comm_id -> [last enqueued, last completed]
    collective seq, e.g. Flight Recorder's ``pg_status``), or nothing; malformed entries are skipped."""
    meta = getattr(getattr(src, "job", None), "meta", None)
    raw = (getattr(meta, "extra", None) or {}).get("progress") if meta is not None else None
    out: dict[int, dict[str, list[int]]] = {}
    if not isinstance(raw, dict):
        return out
    for r, per in raw.items():
        if not isinstance(per, dict) or not str(r).lstrip("-").isdigit():
            continue
        for cid, v in per.items():
            if isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(x, int) for x in v):
                out.setdefault(int(r), {})[str(cid)] = [int(v[0]), int(v[1])]
    return out


def _waited(at_ns: int | None, t0: int | None) -> float | None:
    return (at_ns - t0) / NS_PER_S if at_ns is not None and t0 is not None and at_ns >= t0 else None


def _pick_chains(g: WaitGraph, ends: np.ndarray, depth: np.ndarray) -> list[list[list[Any]]]:
    """Up to :data:`MAX_CHAINS` wait chains: for every root (and deadlock) the longest chain ending
    there, then the longest others; each starts at a rank nobody waits for."""
    if not g.waiting:
        return []
    w = np.asarray(g.waiting, np.int64)
    waited_on = np.zeros(g.world_size, bool)
    for r, _, _, _, p in g.p2p:
        waited_on[p] = True
    for nd in g.nodes:
        waited_on[nd.missing] = True
    leaves = w[~waited_on[w]]
    if not len(leaves):
        leaves = w
    order = leaves[np.lexsort((leaves, -depth[leaves]))]
    picked: list[int] = []
    seen_end: set[int] = set()
    for r in order.tolist():
        if int(ends[r]) not in seen_end:
            seen_end.add(int(ends[r]))
            picked.append(r)
    for r in order.tolist():
        if len(picked) >= MAX_CHAINS:
            break
        if r not in picked:
            picked.append(r)
    return [[list(x) for x in g.chain(r)] for r in picked[:max(MAX_CHAINS, len(seen_end))]]


def _link(rank: int, op: str, comm: str, seq: int, to: int) -> str:
    if op == "recv":
        return f"{rank} waits in recv #{seq} from {to} ({comm})"
    if op == "send":
        return f"{rank} waits in send #{seq} to {to} ({comm})"
    return f"{rank} waits in {op} #{seq} of {comm} for {to}"


def _root_words(g: WaitGraph, r: int, comm_names: list[str]) -> str:
    kind = g.root_kind.get(r)
    if kind == ROOT_NO_LOG:
        return f"{r} wrote no log"
    if kind == ROOT_IDLE:
        return f"{r} has nothing in flight (its log ends in compute, or its process exited)"
    op, c, k = g.root_op.get(r, ("operator", -1, -1))
    where = f"{op} #{k} of {comm_names[c]}" if c >= 0 else op
    if kind == ROOT_STALLED:
        return f"{r} stopped inside {where}, which its peers completed"
    return f"{r} is inside {where} with every peer (none completed it)"


def _explain(ev: HangEvidence, g: WaitGraph) -> list[str]:
    """One sentence per culprit (where it is missing, who waited how long), one per deadlock, one
    per wait chain drawn."""
    lines = []
    names = g.comm_names
    for r in sorted(x for x in g.roots if x in ev.culprits):
        c = next((c for c in ev.communicators if r in c.missing and c.peer is None), None)
        if c is None:
            c = next((c for c in ev.communicators if r in c.missing), None)
        if c is None:
            lines.append("rank " + _root_words(g, r, names))
            continue
        if c.peer is None:
            where = f"{c.op or 'collective'} #{c.seq} of {c.comm_id}"
        else:  # the operator it never posted: the other end of the one its peer waits in
            where = (f"send #{c.seq} to {c.waiting[0]}" if c.op == "recv" else
                     f"recv #{c.seq} from {c.waiting[0]}") + f" on {c.comm_id}"
        if r in c.no_log:
            s = f"rank {r} has no log; it is needed in {where}"
        elif r in c.stalled and c.stalled[r] < c.seq:
            s = (f"rank {r} never entered {where}" if r in c.not_issued else f"rank {r} issued {where} but never entered it")
            done = list(c.waiting) or None
            s += f" (its device stopped at #{c.stalled[r]}, which " + \
                 (f"ranks {format_ranges(done)} completed)" if done else "its peers completed)")
        else:
            s = f"rank {r} never entered {where}"
            if g.root_kind.get(r) in (ROOT_STALLED, ROOT_INSIDE):
                s += "; " + _root_words(g, r, names)
        if c.waiting:
            w = format_ranges(c.waiting)
            w = f"{len(c.waiting)} ranks ({','.join(w.split(',')[:SHOWN_ITEMS])},...)" \
                if w.count(",") >= SHOWN_WAITING else f"ranks {w}"
            s += f"; {w} waited" + (f" {c.waited_s:.0f} s" if c.waited_s is not None else "")
        if ev.behind.get(r):
            s += f"; {ev.behind[r]} stuck rank(s) wait behind it"
        lines.append(s)
    for cyc in ev.deadlocks:
        links = []
        for r in cyc:
            ch = g.chain(r)
            if ch:
                links.append(_link(*ch[0]))
        lines.append(f"deadlock: ranks {format_ranges(cyc)} wait for each other (" + "; ".join(links) +
                     "): send/recv or collective order mismatched")
    for ch in ev.chains:
        if len(ch) < 2:
            continue
        end = ch[-1][-1]   # the rank the last link waits for
        tail = next((f"{end} is in the deadlock" for c in ev.deadlocks if end in c), None) or _root_words(g, end, names)
        lines.append("rank " + "; ".join(_link(*x) for x in ch) + "; " + tail)
    return lines
