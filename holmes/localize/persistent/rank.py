"""The persistent analysis as map/reduce: one small summary per rank, and an associative merge.

The persistent analysis (:mod:`~holmes.localize.persistent.analysis`) must read every rank. It does so
rank by rank, keeping of each rank only a compact numeric summary of its operators in the
analysis window (no strings; every value but one is measured on the rank's own clock):

* per operator: its *slot* (communicator, or communicator + sender + receiver for P2P), its
  ``seq``, its iteration, its duration, the rank's compute gap before it, the rank's own work since
  it last waited, whether it starts a batch of operators issued together and whether the rank went
  on past it while it ran (*detached*: an async ``isend``, a DDP bucket), its bytes, its operator
  (an index into :data:`OP_KINDS`: what-if analysis compares an all-gather with all-gathers), and
  its start (the one timestamp: a P2P pair's send start against its receive, where the sender
  entered last -- :func:`~holmes.localize.evidence.p2p.late_sender_transfer`);
* per iteration: the rank's own work (the sum of its compute gaps).

The same functions run in process (``holmes localize``) and distributed (one task per rank)::

    window = persistent_window(job)                          # the iterations to analyse (pivot's)
    parts = [persistent_rank_summary(job, r, window) for r in range(job.world_size)]   # map
    summary = merge_summaries(*parts)                        # reduce: associative, commutative
    report = localize_summary(job, summary)                  # the report, as holmes.localize's

:func:`merge_summaries` only takes the union of the ranks (a rank summarized twice is an error),
and everything computed from the merged summary visits the ranks in ascending order, so the
report is bit-for-bit the same whatever the grouping or order of the merges.

Examples
--------
>>> import holmes
>>> job = holmes.read_job("fixtures/gpu16-clean")
>>> win = persistent_window(job)
>>> a = persistent_rank_summary(job, 3, win)
>>> a.ranks, a.rows(3) > 0
([3], True)
>>> s = merge_summaries(merge_summaries(*[persistent_rank_summary(job, r, win) for r in range(8)]),
...                     merge_summaries(*[persistent_rank_summary(job, r, win) for r in range(8, 16)]))
>>> s.ranks == list(range(16)), s.missing
(True, {})
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from holmes.calibration.thresholds import Thresholds, load_thresholds, or_shipped
from holmes.display import SHOWN_MISSING
from holmes.errors import ConfigError, JobError
from holmes.io.schema import OP_NAMES

__all__ = ["RankSummary", "PersistentSummary", "persistent_window", "persistent_rank_summary", "merge_summaries",
           "persistent_summaries", "FIELDS", "COLUMNS", "OP_KINDS"]

log = logging.getLogger(__name__)

_SEND, _RECV = "send", "recv"
#: bits of a slot key: communicator code << 42 | (sender + 1) << 21 | (receiver + 1): three fields of a
#: 63-bit key
_RBITS = (np.iinfo(np.int64).bits - 1) // len(("communicator", "sender", "receiver"))

#: the operators a summary tells apart (``opk`` indexes this tuple; any other name is ``len(OP_KINDS)``)
OP_KINDS: tuple[str, ...] = tuple(OP_NAMES)

#: the per-operator arrays of a :class:`RankSummary`, with their dtypes
FIELDS = {"slot": np.int32, "seq": np.int64, "widx": np.int32, "dur": np.int64, "own": np.int64,
          "gap": np.float64, "new_batch": np.bool_, "nbytes": np.int64, "opk": np.int8, "start": np.int64,
          "detached": np.bool_}


@dataclass(frozen=True)
class RankSummary:
    """One rank's operators in the window, in compact numeric form.

    Attributes
    ----------
    comms : tuple of str
        The communicators the rank used (its local codes index this tuple).
    keys : int64 array
        The rank's slots: ``local comm code << 42 | (sender + 1) << 21 | (receiver + 1)``
        (sender = receiver = -1 for collectives).
    ops : dict of str -> array
        Per operator (issue order), the arrays of :data:`FIELDS`; ``slot`` indexes ``keys``.
    compute : float64 array (T,)
        Per window iteration, the rank's own work (sum of its compute gaps, ns).
    iter_ptr : int64 array (T + 1,)
        The operators of window iteration ``t`` are rows ``iter_ptr[t]:iter_ptr[t + 1]``.
    """

    comms: tuple[str, ...]
    keys: np.ndarray
    ops: dict[str, np.ndarray]
    compute: np.ndarray
    iter_ptr: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in self.ops.values()) + self.keys.nbytes + self.compute.nbytes
                   + self.iter_ptr.nbytes)


@dataclass
class PersistentSummary:
    """The persistent analysis's input: the summaries of the ranks read so far (the reduce's value).

    Attributes
    ----------
    window : int64 array
        The iterations analysed (the same for every rank).
    world_size : int
    per_rank : dict of int -> RankSummary
    missing : dict of int -> str
        Ranks whose log was absent or unreadable, with the reason.
    """

    window: np.ndarray
    world_size: int
    per_rank: dict[int, RankSummary] = field(default_factory=dict)
    missing: dict[int, str] = field(default_factory=dict)

    @property
    def ranks(self) -> list[int]:
        """Ranks summarized, ascending."""
        return sorted(self.per_rank)

    def rows(self, rank: int) -> int:
        """How many operators of ``rank`` the summary holds."""
        s = self.per_rank.get(int(rank))
        return 0 if s is None else int(len(s.ops["seq"]))

    @property
    def nbytes(self) -> int:
        return int(sum(s.nbytes for s in self.per_rank.values()))


def persistent_window(job: Any, pivot: int = 0, window: int | None = None) -> np.ndarray:
    """The iterations the persistent analysis looks at: the pivot's last ``window`` iterations
    (default: the threshold ``default_persistent_window``).

    Raises
    ------
    JobError
        The pivot's log holds no iteration (or is unreadable: the typed error naming its file).
    """
    from holmes.localize.evidence.sources import open_source

    src = open_source(job)
    got = src.iteration_times(pivot)
    if got is None or len(got[0]) == 0:
        exc = src.errors.get(pivot)
        if exc is not None:
            raise exc
        raise JobError(f"pivot rank {pivot}: no iterations in its log")
    return np.asarray(got[0], dtype=np.int64)[-int(or_shipped(window, "default_persistent_window")):]


def persistent_rank_summary(job: Any, rank: int, window: Any, thresholds: Thresholds | None = None) -> PersistentSummary:
    """Map step: read one rank's log and summarize it (a :class:`PersistentSummary` of one rank).

    Parameters
    ----------
    job : path, Job, MemoryJob or JobSource
        Pass an opened job (or source) when summarizing many ranks in one process: a path is
        opened on every call.
    rank : int
    window : sequence of int
        The iterations to keep (:func:`persistent_window`).
    thresholds : Thresholds, optional
        Whose ``wait_ratio``, ``wait_slack_ns`` and ``persistent_starts_max_world`` apply (default
        the shipped ones).

    Returns
    -------
    PersistentSummary
        With the rank in ``per_rank``, or in ``missing`` when its log is absent or unreadable.
    """
    from holmes.localize.evidence.sources import open_source

    src = open_source(job)
    r = int(rank)
    win = np.asarray(window, dtype=np.int64)
    if win.ndim != 1 or (np.diff(win) <= 0).any():
        raise ConfigError("window must be increasing iteration numbers")
    out = PersistentSummary(win, src.world_size)
    t = src.stream(r)
    if t is None:
        out.missing[r] = src.missing.get(r, f"log of rank {r} is missing")
        return out
    th = thresholds or load_thresholds()
    starts = _iteration_starts(src, r) if src.world_size <= th.persistent_starts_max_world else None
    s = summarize_table(r, t, win, starts, wait_ratio=th.wait_ratio, wait_slack_ns=th.wait_slack_ns,
                        batch_issue_ns=th.batch_issue_ns)
    if s is not None:
        out.per_rank[r] = s
    return out


#: the CommOps columns a summary needs (the batch read path reads only these)
COLUMNS = ("iteration", "op_index", "comm_id", "seq", "op", "peer", "nbytes", "start_ns", "end_ns")


def persistent_summaries(job: Any, window: Any, ranks: Any = None, thresholds: Thresholds | None = None) -> PersistentSummary:
    """Map and reduce in one process: the merged summary of ``ranks`` (default every rank).

    Reads through the job's batch read path (:meth:`holmes.io.Job.iter_ranks`: files opened once,
    only :data:`COLUMNS`, the consistency pass vectorized over a batch) when it has one; the result
    is the same as ``merge_summaries(*(persistent_rank_summary(job, r, window) for r in ranks))``.
    """
    from holmes.localize.evidence.sources import open_source

    src = open_source(job)
    win = np.asarray(window, dtype=np.int64)
    rs = list(range(src.world_size)) if ranks is None else sorted(int(r) for r in ranks)
    batch = getattr(src.job, "iter_ranks", None)
    if batch is None:
        return merge_summaries(*(persistent_rank_summary(src, r, win, thresholds) for r in rs))
    out = PersistentSummary(win, src.world_size)
    th = thresholds or load_thresholds()
    small = src.world_size <= th.persistent_starts_max_world
    for r, t, err in batch([r for r in rs if r not in src.missing], columns=list(COLUMNS), errors="skip"):
        if t is None:
            why = " ".join(str(err).split()) if err is not None else f"log of rank {r} is missing"
            out.missing[r] = src.missing[r] = why
            log.warning("rank %d skipped: %s", r, why)
            continue
        s = summarize_table(r, t, win, _iteration_starts(src, r) if small else None, wait_ratio=th.wait_ratio,
                            wait_slack_ns=th.wait_slack_ns, batch_issue_ns=th.batch_issue_ns)
        if s is not None:
            out.per_rank[r] = s
    for r in rs:
        if r in src.missing:
            out.missing.setdefault(r, src.missing[r])
    src.note_read(r for r in rs if r not in out.missing)
    return out


def merge_summaries(*parts: PersistentSummary) -> PersistentSummary:
    """Reduce step: the union of summaries (associative and commutative).

    Raises
    ------
    ConfigError
        No summary given, summaries of different windows or jobs, or a rank summarized twice.
    """
    if not parts:
        raise ConfigError("merge_summaries needs at least one summary")
    first = parts[0]
    out = PersistentSummary(first.window, first.world_size)
    for p in parts:
        if p.world_size != first.world_size or not np.array_equal(p.window, first.window):
            raise ConfigError("merge_summaries: the summaries are of different jobs or windows")
        twice = set(p.per_rank) & set(out.per_rank)
        if twice:
            raise ConfigError(f"merge_summaries: rank(s) {sorted(twice)[:SHOWN_MISSING]} summarized twice")
        out.per_rank.update(p.per_rank)
        for r, why in p.missing.items():
            out.missing.setdefault(r, why)
    for r in out.per_rank:
        out.missing.pop(r, None)
    return out


def summarize_table(r: int, t: pa.Table, win: np.ndarray, starts: dict[int, int] | None, *,
                    wait_ratio: float | None = None, wait_slack_ns: float | None = None,
                    batch_issue_ns: float | None = None) -> RankSummary | None:
    """The :class:`RankSummary` of rank ``r``'s CommOps table (None: no operator in the window);
    ``wait_ratio``, ``wait_slack_ns``: :func:`_own_work`'s; ``batch_issue_ns``: :func:`_batches`'s."""
    if t.num_rows == 0:
        return None
    col = {c: _np(t.column(c)) for c in ("iteration", "start_ns", "end_ns", "op_index", "seq", "nbytes")}
    it = col["iteration"]
    start, end = col["start_ns"].astype(np.int64), col["end_ns"].astype(np.int64)
    gap, new_batch = _batches(start, end, batch_issue_ns)
    if starts is not None:
        fi = np.flatnonzero(np.r_[True, it[1:] != it[:-1]])
        st = np.array([starts.get(int(i), -1) for i in it[fi].tolist()], np.int64)
        ok = st >= 0
        gap[fi[ok]] = start[fi[ok]] - st[ok]
        new_batch[fi] = True
    gap = np.maximum(gap, 0)
    if (np.diff(it) >= 0).all():  # sorted by iteration (a Job's tables are): the window is a slice
        sel: Any = slice(int(np.searchsorted(it, win[0], "left")), int(np.searchsorted(it, win[-1], "right")))
        if sel.stop > sel.start and len(win) != int(win[-1] - win[0]) + 1:
            sel = sel.start + np.flatnonzero(np.isin(it[sel], win))
    else:
        sel = np.flatnonzero(np.isin(it, win))
    it = it[sel]
    if len(it) == 0:
        return None
    gap, new_batch, dur = gap[sel], new_batch[sel], (end - start)[sel]
    new_batch[np.r_[True, it[1:] != it[:-1]]] = True
    detached = _detached(start[sel], end[sel], new_batch, batch_issue_ns)
    T = len(win)
    widx = np.searchsorted(win, it).astype(np.int32)
    iter_ptr = np.searchsorted(widx, np.arange(T + 1)).astype(np.int64)
    compute = np.bincount(widx, weights=gap, minlength=T).astype(np.float64)
    own = _own_work(gap, dur, col["op_index"][sel], wait_ratio, wait_slack_ns)
    comms, comm = _codes(t.column("comm_id"))
    opk = _op_kinds(t.column("op"))[sel]
    op = np.where(opk == _KIND_SEND, 1, np.where(opk == _KIND_RECV, 2, 0))
    peer = _np(t.column("peer").fill_null(-1)).astype(np.int64)[sel]
    seq = col["seq"][sel].astype(np.int64)
    is_p2p = op > 0
    sender = np.where(is_p2p, np.where(op == 1, r, peer), -1)
    receiver = np.where(is_p2p, np.where(op == 1, peer, r), -1)
    key = (comm[sel] << 2 * _RBITS) | ((sender + 1) << _RBITS) | (receiver + 1)
    keys, slot = np.unique(key, return_inverse=True)
    if (seq < 0).any():  # unknown sequence numbers: issue order within the slot
        for j in np.unique(slot[seq < 0]).tolist():
            m = slot == j
            seq[m] = np.arange(int(m.sum()))
    ops = {"slot": slot.astype(np.int32), "seq": seq, "widx": widx, "dur": dur, "own": own,
           "gap": gap.astype(np.float64), "new_batch": new_batch, "nbytes": col["nbytes"][sel].astype(np.int64),
           "opk": opk, "start": start[sel], "detached": detached}
    return RankSummary(comms, keys.astype(np.int64), ops, compute, iter_ptr)


def _batches(start: np.ndarray, end: np.ndarray, issue_ns: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per row (one rank's operators in issue order), its gap -- the rank's own work before it -- and
    whether it starts a *batch* (operators issued together; the replay issues a batch at once and
    waits for it).

    An operator issued once every earlier one completed starts a batch, ``start`` minus the latest
    end before it after them. One issued while an earlier one was in flight (``issue_ns``: threshold
    ``batch_issue_ns``):

    * after the previous one completed (an older one still in flight): a batch of its own, its gap
      since the previous one's end;
    * while the previous one ran on for more than ``issue_ns``, and more than ``issue_ns`` after its
      start: the rank went on with its own work while the earlier operator ran (gloo's ``isend``
      completes only when a pipeline schedule waits on it at the end of the step; DDP's buckets
      reduce while the backward goes on): a batch of its own, its gap since the previous one's start;
    * else issued with the previous one (Megatron's batched send/recv; one that outlived the next
      one's start by a few microseconds, two CUDA streams' timings), gap 0.

    >>> st, en = np.array([0, 10, 300, 600, 900]), np.array([5, 1000, 320, 1500, 950])
    >>> g, b = _batches(st, en, 100)
    >>> g.tolist(), b.astype(int).tolist()   # 5 after the first's end; 290 after the 2nd's start...
    ([0, 5, 290, 280, 300], [1, 1, 1, 1, 1])
    >>> _batches(np.array([0, 20, 500]), np.array([50, 60, 560]), 100)[1].astype(int).tolist()   # issued together
    [1, 0, 1]
    >>> _batches(np.array([0, 5000]), np.array([5030, 6000]), 100)[1].astype(int).tolist()   # outlived it by 30
    [1, 0]
    """
    issue_ns = or_shipped(issue_ns, "batch_issue_ns")
    n = len(start)
    gap = np.zeros(n, np.int64)
    new = np.ones(n, np.bool_)
    if n > 1:
        s1 = start[1:]
        frontier = np.maximum.accumulate(end)[:-1]
        gap[1:] = s1 - frontier
        new[1:] = gap[1:] >= 0
        done = end[:-1] <= s1
        since = np.where(done, s1 - end[:-1], s1 - start[:-1])
        apart = ~new[1:] & (done | ((since > issue_ns) & (end[:-1] - s1 > issue_ns)))
        gap[1:][apart] = since[apart]
        new[1:][apart] = True
    return gap, new


def _detached(start: np.ndarray, end: np.ndarray, new_batch: np.ndarray, issue_ns: float | None = None
              ) -> np.ndarray:
    """Per row, whether the operator was still in flight (by more than ``issue_ns``, threshold
    ``batch_issue_ns``) when the rank's next batch began: the rank did not wait for it there (the
    replay waits for it only at the end of the step).

    >>> _detached(np.array([0, 10, 300]), np.array([5, 1000, 320]), np.ones(3, bool), 100).astype(int).tolist()
    [0, 1, 0]
    """
    if not len(start):
        return np.zeros(0, np.bool_)
    issue_ns = or_shipped(issue_ns, "batch_issue_ns")
    bid = np.cumsum(new_batch) - 1
    nxt = np.r_[start[new_batch][1:], np.iinfo(np.int64).max]
    return end - nxt[bid] > issue_ns


def _np(col: Any) -> np.ndarray:
    """A numeric column as a numpy array."""
    return col.to_numpy() if isinstance(col, pa.ChunkedArray) and col.num_chunks != 1 else \
        (col.chunk(0) if isinstance(col, pa.ChunkedArray) else col).to_numpy(zero_copy_only=False)


def _own_work(gap: np.ndarray, dur: np.ndarray, op_index: np.ndarray, ratio: float | None = None,
              slack_ns: float | None = None) -> np.ndarray:
    """Per row, the rank's own work since it last waited: the sum of its compute gaps since the
    last operator that lasted clearly longer than that operator's shortest copy over the window
    (1.5x + 20 us), this row's gap included. Collectives in which every member was slow (a whole
    tensor-parallel group on a slow host) keep accumulating; a wait resets it.

    >>> _own_work(np.array([5, 3, 2, 4]), np.array([10_000, 500_000, 10_000, 10_000]), np.array([0, 1, 0, 1])).tolist()
    [5, 8, 2, 6]
    """
    n = len(gap)
    if n == 0:
        return gap.astype(np.int64)
    pos = op_index.astype(np.int64)
    dmin = np.full(int(pos.max()) + 1, np.iinfo(np.int64).max)
    np.minimum.at(dmin, pos, dur)
    ratio, slack_ns = or_shipped(ratio, "wait_ratio"), or_shipped(slack_ns, "wait_slack_ns")
    waited = dur > ratio * dmin[pos] + slack_ns
    c = np.cumsum(gap)
    reset = np.zeros(n, np.bool_)
    reset[0] = True
    reset[1:] = waited[:-1]
    start = np.maximum.accumulate(np.where(reset, np.arange(n), 0))
    before = np.where(start > 0, c[np.maximum(start - 1, 0)], 0)
    return (c - before).astype(np.int64)


def _codes(col: Any) -> tuple[tuple[str, ...], np.ndarray]:
    """A string column as (its distinct values, per row the index of its value)."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if not pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_encode()
    return tuple(arr.dictionary.to_pylist()), arr.indices.to_numpy(zero_copy_only=False).astype(np.int64)


_KIND_SEND, _KIND_RECV = OP_KINDS.index(_SEND), OP_KINDS.index(_RECV)


def _op_kinds(col: Any) -> np.ndarray:
    """Per row, the index of its operator in :data:`OP_KINDS` (int8; ``len(OP_KINDS)``: another name).

    >>> _op_kinds(pa.array(["send", "all_gather", "frobnicate"])).tolist() == [
    ...     OP_KINDS.index("send"), OP_KINDS.index("all_gather"), len(OP_KINDS)]
    True
    """
    values, idx = _codes(col)
    lut = np.array([OP_KINDS.index(v) if v in OP_KINDS else len(OP_KINDS) for v in values] or [0], np.int8)
    return lut[idx]


def _iteration_starts(src: Any, r: int) -> dict[int, int] | None:
    """Per iteration, when rank ``r`` started it (from the job's iteration table), or None."""
    job = getattr(src, "job", None)
    if job is None or not hasattr(job, "iterations"):
        return None
    try:
        t = job.iterations(r)
    except Exception:  # noqa: BLE001 - an unusable iteration table falls back to the ops
        return None
    return dict(zip(t.column("iteration").to_pylist(), t.column("start_ns").to_pylist()))
