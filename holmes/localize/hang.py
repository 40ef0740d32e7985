"""The hang analysis: which ranks never arrived at the collective the others wait in.

A hung job leaves logs whose last ops are in flight (CommOps ``state`` ``started`` or
``scheduled``, from a Flight Recorder dump or :mod:`holmes.logger`'s dump on a timeout, a signal or
an exception). Its steps, as :class:`~holmes.localize.pipeline.Localizer` runs them:

1. **select** -- the in-flight ops at the end of the logs. Only a job that can hold them is read
   whole (``job.json`` has a ``dump``, or the pivot's log has a ``state`` column); an old job (no
   ``state``) costs one read of the pivot, which the irregular analysis reads anyway;
2. **gather** -- per communicator, from every member's log (collectives only; P2P ops are counted,
   not matched):

   * ``first_open[r]``: the first collective ``seq`` rank ``r`` has not completed (its oldest op in
     flight, else one past the last op it issued); ``issued[r]``: the last ``seq`` it issued;
   * the communicator is stuck on ``seq = max(first_open) `` (the first collective no member
     completed): **missing** are the members that never issued it, those without a log, and those
     **stalled** on an earlier collective that other members completed (their device stopped: an
     op the peers finished never finished on it, so it cannot have entered ``seq`` either);
     **waiting** are the others (they issued it and completed everything before it), and
     **scheduled** those of them whose log shows it issued but not entered;
   * only communicators where members disagree are reported (all members waiting in the same
     collective, none missing, points below the collective: a transport or a rank stuck inside
     the kernel; such communicators are counted in an assumption);

3. **rank** -- the culprits across communicators: the ranks missing from some communicator and
   waiting in none (a rank missing from one group because it waits in another is a victim of the
   chain, not its origin), as ``gpu:<rank>`` devices with ``evidence=("hang",)``; a host when all
   its ranks are culprits. A culprit with its own log is certain (confidence 0.99); a rank with no
   log at all is a prime suspect (0.9); when every missing rank also waits somewhere (a cycle),
   the ranks missing most often are candidates (0.5).

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
'rank 2 never entered all_reduce #2 of dp-0; ranks 0-1,3 waited 180 s'
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from holmes._ranges import format_int_ranges
from holmes.io.schema import P2P_OPS
from holmes.localize.report import DeviceScore

__all__ = ["HangAnalysis", "HangSelection", "HangEvidence", "CommHang"]

log = logging.getLogger(__name__)

_COLS = ("rank", "comm_id", "seq", "op", "start_ns")
#: confidence of a culprit with its own log / without any log / in a cycle of missing ranks
CONF_CULPRIT, CONF_NO_LOG, CONF_CYCLE = 0.99, 0.9, 0.5


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

    def to_json(self) -> dict[str, Any]:
        return {"comm_id": self.comm_id, "seq": self.seq, "op": self.op, "missing": list(self.missing),
                "waiting": list(self.waiting), "scheduled": list(self.scheduled),
                "stalled": {str(r): s for r, s in sorted(self.stalled.items())}, "no_log": list(self.no_log),
                "not_issued": list(self.not_issued),
                "waited_s": None if self.waited_s is None else round(self.waited_s, 3)}


@dataclass
class HangEvidence:
    """What the hang analysis found."""

    found: bool = False
    communicators: list[CommHang] = field(default_factory=list)
    culprits: dict[int, float] = field(default_factory=dict)   # rank -> confidence
    all_waiting: int = 0      # communicators whose members all wait in the same collective
    explanation: list[str] = field(default_factory=list)
    no_log: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The report's ``hang`` object (``docs/cli.md``) (plus ``explanation`` and ``ranks_without_log``)."""
        return {"communicators": [c.to_json() for c in self.communicators],
                "culprit_ranks": sorted(self.culprits), "explanation": list(self.explanation),
                "ranks_without_log": list(self.no_log)}


class HangAnalysis:
    """Localize a hang from the ops in flight at the end of the logs (select -> gather -> rank)."""

    name = "hang"

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
            state = ops.column("state")
            is_open = pc.not_equal(state, "completed")
            ops = ops.drop_columns(["state"]).append_column("open", is_open) \
                .append_column("scheduled", pc.equal(state, "scheduled"))
            sel.in_flight = int(pc.sum(is_open).as_py() or 0)
            p2p = pc.is_in(ops.column("op"), value_set=pa.array(list(P2P_OPS)))
            sel.p2p_in_flight = int(pc.sum(pc.and_(p2p, is_open)).as_py() or 0)
            sel.ops = ops.filter(pc.invert(p2p))
        if sel.in_flight:
            log.info("hang: %d op(s) in flight over %d rank(s)", sel.in_flight, src.world_size)
        return sel

    def gather(self, run: Any, sel: HangSelection) -> HangEvidence:
        """Per communicator the collective it is stuck on, its missing/waiting ranks; the culprits."""
        ev = HangEvidence(no_log=sorted(sel.no_log))
        if not sel.in_flight:
            return ev
        ev.found = True
        ops = sel.ops
        if sel.p2p_in_flight:
            run.assume(f"{sel.p2p_in_flight} P2P op(s) in flight are not matched (the hang analysis reads "
                       "collectives)")
        if ops is None or ops.num_rows == 0:
            run.assume("no collective in the logs: the hang cannot be placed")
            return ev
        per = _per_rank_comm(ops)
        comms = run.source.communicators
        waited_at = (sel.dump or {}).get("at_ns")
        open_rows: dict[str, list[tuple]] = {}  # comm_id -> (rank, seq, op, scheduled, start_ns) of ops in flight
        flying = ops.filter(ops.column("open"))
        for row in zip(*(flying.column(k).to_pylist() for k in ("comm_id", "rank", "seq", "op", "scheduled",
                                                                 "start_ns"))):
            open_rows.setdefault(row[0], []).append(row[1:])
        for cid in sorted(open_rows):
            c = comms.get(cid)
            members = sorted(int(x) for x in getattr(c, "ranks", c) or ()) if c is not None else \
                sorted(r for (r, k) in per if k == cid)
            ch = _stuck(cid, members, per, sel.no_log, open_rows[cid], waited_at)
            if ch is None:
                continue
            if ch.missing:
                ev.communicators.append(ch)
            else:
                ev.all_waiting += 1
        if ev.all_waiting:
            run.assume(f"{ev.all_waiting} communicator(s) have every member waiting in the same collective "
                       "(none missing): blocked behind the ranks named, or inside the collective")
        ev.culprits = _culprits(ev.communicators, sel.no_log)
        ev.explanation = _explain(ev, run)
        if sel.no_log:
            run.assume(f"rank(s) {format_ranges(sorted(sel.no_log))} have no log (too dead to dump?): "
                       "treated as prime suspects where their communicators wait")
        return ev

    def rank(self, run: Any, ev: HangEvidence, sel: HangSelection | None = None) -> list[DeviceScore]:
        """The culprits as ``gpu:<rank>`` (and ``host:<n>`` when all its ranks are culprits)."""
        if not ev.culprits:
            return []
        counts = {r: sum(r in c.missing for c in ev.communicators) for r in ev.culprits}
        total = float(sum(counts.values())) or 1.0
        out = [DeviceScore(f"gpu:{r}", "gpu", counts[r] / total, float(counts[r]), counts[r],
                           confidence=conf, evidence=(self.name,)) for r, conf in ev.culprits.items()]
        topo = run.topology
        if topo is not None and run.params.include_host:
            hosts: dict[int, list[int]] = {}
            for r in ev.culprits:
                hosts.setdefault(int(topo.host_of(r)), []).append(r)
            for h, rs in hosts.items():
                on_host = [g for g in range(run.source.world_size) if int(topo.host_of(g)) == h]
                if len(rs) == len(on_host) and len(on_host) > 1:
                    out.append(DeviceScore(f"host:{h}", "host", max(counts[r] for r in rs) / total,
                                           float(sum(counts[r] for r in rs)), sum(counts[r] for r in rs),
                                           confidence=min(ev.culprits[r] for r in rs), evidence=(self.name,)))
        return sorted(out, key=lambda d: (-(d.confidence or 0.0), -d.score, d.id))


def _every_rank(src: Any, columns: list[str]) -> Any:
    """``(ranks, have, tables)`` over every rank of ``src``, a batch at a time: ``have`` the ranks
    with a usable log (the others' reasons are in ``src.missing``), ``tables`` their rows. Read in
    batches (:meth:`~holmes.localize.sources.JobSource.stream_batches`) when the source can."""
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
    types = {"rank": pa.int32(), "comm_id": pa.string(), "seq": pa.int64(), "op": pa.string(),
             "start_ns": pa.int64(), "state": pa.string(), "open": pa.bool_(), "scheduled": pa.bool_()}
    return pa.schema([pa.field(f.name, types[f.name]) for f in schema])


def _per_rank_comm(ops: pa.Table) -> dict[tuple[int, str], tuple[int, int, int | None]]:
    """(rank, comm_id) -> (first seq not completed, last seq issued, first seq in flight or None)."""
    seq = ops.column("seq")
    open_seq = pc.if_else(ops.column("open"), seq, pa.scalar(None, pa.int64()))
    t = pa.table({"rank": ops.column("rank"), "comm_id": ops.column("comm_id"), "seq": seq, "open_seq": open_seq})
    g = t.group_by(["rank", "comm_id"]).aggregate([("seq", "max"), ("open_seq", "min")])
    out = {}
    for r, cid, last, first_open in zip(g.column("rank").to_pylist(), g.column("comm_id").to_pylist(),
                                        g.column("seq_max").to_pylist(), g.column("open_seq_min").to_pylist()):
        out[(r, cid)] = (first_open if first_open is not None else last + 1, last, first_open)
    return out


def _stuck(cid: str, members: list[int], per: dict, no_log: dict[int, str], flying: list[tuple],
           at_ns: int | None) -> CommHang | None:
    """Where communicator ``cid`` is stuck, or None when no member has an op in flight on it."""
    have = [r for r in members if r not in no_log]
    first = {r: per[(r, cid)][0] if (r, cid) in per else 0 for r in have}
    issued = {r: per[(r, cid)][1] if (r, cid) in per else -1 for r in have}
    inflight = {r: per[(r, cid)][2] for r in have if (r, cid) in per and per[(r, cid)][2] is not None}
    if not inflight:
        return None
    done_max = max(first.values()) - 1          # the furthest any member completed
    stalled = {r: s for r, s in inflight.items() if s <= done_max}
    seq = done_max + 1
    entered = [r for r in have if issued[r] >= seq]
    if not entered:                             # nobody issued the next one: only the stalled disagree
        seq = min(stalled.values())
        entered = []
    missing = sorted({r for r in have if issued[r] < seq} | set(stalled) | (set(members) - set(have)))
    waiting = sorted(r for r in entered if r not in stalled)
    at = [x for x in flying if x[1] == seq]     # (rank, seq, op, scheduled, start_ns) in flight at ``seq``
    op = at[0][2] if at else None
    sched = {x[0] for x in at if x[3]}
    wait_set = set(waiting)
    ts = [x[4] for x in at if x[0] in wait_set and x[4] is not None]
    t0 = min(ts) if ts else None
    waited = (at_ns - t0) / 1e9 if at_ns is not None and t0 is not None and at_ns >= t0 else None
    return CommHang(cid, int(seq), op, missing, waiting, sorted(r for r in waiting if r in sched),
                    {r: int(s) for r, s in stalled.items()}, sorted(set(members) - set(have)), waited,
                    sorted(r for r in have if issued[r] < seq))


def _culprits(comms: list[CommHang], no_log: dict[int, str]) -> dict[int, float]:
    """Ranks missing somewhere and waiting nowhere -> confidence (see the module docstring)."""
    missing_in: dict[int, int] = {}
    waiting = set()
    for c in comms:
        waiting.update(c.waiting)
        for r in c.missing:
            missing_in[r] = missing_in.get(r, 0) + 1
    out = {r: (CONF_NO_LOG if r in no_log else CONF_CULPRIT) for r in sorted(missing_in) if r not in waiting}
    if not out and missing_in:  # every missing rank waits elsewhere: a cycle; the most-missing are candidates
        most = max(missing_in.values())
        out = {r: CONF_CYCLE for r, k in sorted(missing_in.items()) if k == most}
    return out


def _explain(ev: HangEvidence, run: Any) -> list[str]:
    """One sentence per culprit: where it never arrived, and who waited how long."""
    lines = []
    for r in sorted(ev.culprits):
        c = next((c for c in ev.communicators if r in c.missing and c.waiting), None) or \
            next(c for c in ev.communicators if r in c.missing)
        where = f"{c.op or 'collective'} #{c.seq} of {c.comm_id}"
        if r in c.no_log:
            s = f"rank {r} has no log; it is needed in {where}"
        elif r in c.stalled and c.stalled[r] < c.seq:
            s = (f"rank {r} never entered {where}" if r in c.not_issued else f"rank {r} issued {where} but never entered it")
            done = [x for x in c.waiting] or None
            s += f" (its device stopped at #{c.stalled[r]}, which " + \
                 (f"ranks {format_ranges(done)} completed)" if done else "its peers completed)")
        else:
            s = f"rank {r} never entered {where}"
        if c.waiting:
            w = format_ranges(c.waiting)
            w = f"{len(c.waiting)} ranks ({','.join(w.split(',')[:4])},...)" if w.count(",") >= 8 else f"ranks {w}"
            s += f"; {w} waited" + (f" {c.waited_s:.0f} s" if c.waited_s is not None else "")
        lines.append(s)
    return lines
