"""A framework-free CommOps recorder: a bounded row buffer flushed to a per-rank CommOps v1 file.

:class:`CommOpsRecorder` knows nothing about PyTorch. A framework hook tells it that an operator
started (:meth:`CommOpsRecorder.begin`) and finished (:meth:`PendingOp.finish`) or hands it a
finished operator (:meth:`CommOpsRecorder.record`); the recorder numbers the operators (``seq``
per communicator, ``op_index`` per iteration, as ``docs/formats.md`` defines them), keeps at most
``flush_every`` rows (packed int tuples, converted with numpy) and appends them as a row group to
``JOB/ranks/rank-XXXXX.parquet`` whenever the buffer fills. Step marks
(:meth:`CommOpsRecorder.step`) give iteration boundaries, written to
``JOB/iterations/rank-XXXXX.parquet``. Each rank also writes ``JOB/comms/rank-XXXXX.json``, the
communicators it saw; :func:`holmes.logger.finalize_job` merges those into ``job.json``.

Files are written under a temporary name and renamed on :meth:`CommOpsRecorder.close`, so a job
directory never holds a truncated parquet file under its final name. With ``parts_every=N`` and/or
``parts_interval=T`` the log is written *live* instead: ``JOB/ranks/rank-XXXXX/part-NNNNNN.parquet``,
a part closed and renamed into place at the first step mark after every ``N`` iterations or ``T``
seconds (:mod:`holmes.io.parts`), so a watcher (:mod:`holmes.watch`) reads the job while it runs.

Examples
--------
>>> import tempfile, holmes
>>> d = tempfile.mkdtemp()
>>> rec = CommOpsRecorder(d, rank=0, flush_every=2)
>>> rec.add_communicator("tp-0", [0, 1], kind="tp")
>>> for it in range(3):
...     _ = rec.step(it)
...     rec.record("tp-0", "all_reduce", nbytes=64, start_ns=100 * it, end_ns=100 * it + 10)
>>> _ = rec.close()
>>> import pyarrow.parquet as pq
>>> pq.read_table(f"{d}/ranks/rank-00000.parquet").column("seq").to_pylist()
[0, 1, 2]
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from itertools import chain, count
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from holmes.errors import ConfigError
from holmes.io.parts import ITERATION_KEYS, part_filename, rank_parts_dirname
from holmes.io.schema import ITERATIONS_SCHEMA, OP_NAMES, OPS_SCHEMA, P2P_OPS, WAIT_FIELDS
from holmes.logger._dumps import write_running
from holmes.logger._waits import wait_columns

__all__ = ["CommOpsRecorder", "PendingOp", "COMMS_DIR"]

log = logging.getLogger(__name__)

#: Sub-directory of the job directory holding each rank's communicator sidecar JSON.
COMMS_DIR = "comms"
_KINDS = ("dp", "tp", "pp", "ep", "cp", "other")
_OP_CODE = {name: i for i, name in enumerate(OP_NAMES)}
_P2P_CODES = frozenset(_OP_CODE[o] for o in P2P_OPS)
_OP_DICT = pa.array(list(OP_NAMES), pa.string())
# A buffered row is 6 int64: (iteration << 32 | op_index, comm << 40 | seq, op << 32 | peer + 1,
# nbytes, start_ns, end_ns): fewer Python ints to convert at a flush, and the two numbers every
# operator takes come from one C counter each (itertools.count: atomic, no lock on the hot path).
_LOW32 = (1 << 32) - 1
_SEQ_BITS = 40
_SEQ_MASK = (1 << _SEQ_BITS) - 1
_ROW = 6
_START = 4  # index of start_ns in a row
#: the iterations a recorder can number (op_index takes the low 32 bits of the packed value)
_ITER_RANGE = (-(1 << 31), 1 << 31)


def _op_key(code: int, peer: int) -> int:
    """The packed ``(op, peer)`` of a row (``peer`` -1 for none)."""
    return code << 32 | (peer + 1)
#: what the rank files are written with: CommOps v1, ``comm_id`` and ``op`` dictionary-encoded
_WRITE_SCHEMA = pa.schema([pa.field(f.name, pa.dictionary(pa.int32(), pa.string()), f.nullable)
                           if f.name in ("comm_id", "op") else f for f in OPS_SCHEMA] + list(WAIT_FIELDS))
#: parquet options of the rank files: dictionaries only for the two string columns, delta-encoded
#: monotone integers, lz4, no statistics (4x faster and 4x smaller than pyarrow's defaults)
_WRITE_OPTIONS: dict[str, Any] = {
    "write_statistics": False, "use_dictionary": ["comm_id", "op"], "compression": "lz4",
    "column_encoding": {c: "DELTA_BINARY_PACKED" for c in ("iteration", "op_index", "seq", "start_ns", "end_ns")}}


def _check_iteration(iteration: int) -> int:
    it = int(iteration)
    if not _ITER_RANGE[0] <= it < _ITER_RANGE[1]:
        raise ConfigError(f"iteration {it} is outside the recorder's range [-2**31, 2**31)")
    return it


class PendingOp:
    """An operator that has started and not yet finished; returned by :meth:`CommOpsRecorder.begin`.

    Call :meth:`finish` once (from any thread) when it completes. An optional ``resolver`` lets a
    hook defer the timestamps (e.g. CUDA events): it is called at flush time and returns
    ``(start_ns, end_ns)`` or ``None`` while the operator is still running.
    """

    __slots__ = ("_rec", "head", "done", "resolver", "poll", "return_ns", "wait_ns")

    def __init__(self, rec: "CommOpsRecorder", head: tuple[int, ...]) -> None:
        self._rec = rec
        self.head = head  # iteration, op_index, comm, seq, op, peer, nbytes, start_ns
        self.done = False
        # asynchronous: when its issuing call returned and the rank entered Work.wait(), if it did
        self.return_ns: int | None = None
        self.wait_ns: int | None = None
        self.resolver: Callable[[bool], tuple[int, int] | None] | None = None
        self.poll: Callable[[], bool] | None = None

    def finish(self, end_ns: int | None = None, start_ns: int | None = None) -> None:
        """Mark the operator complete at ``end_ns`` (default: now). A second call is ignored."""
        self._rec._finish(self, time.time_ns() if end_ns is None else int(end_ns), start_ns)


class CommOpsRecorder:
    """Buffer the communication operators of one rank and write them as CommOps v1 files.

    Parameters
    ----------
    out_dir : path-like
        The job directory; ``ranks/``, ``iterations/`` and ``comms/`` are created inside it.
    rank : int
        Global rank of this process.
    world_size : int, optional
        Recorded in the sidecar so :func:`~holmes.logger.finalize_job` can check completeness.
    flush_every : int, default 8192
        Buffer capacity in rows; a full buffer is appended to the rank file as one row group.
        Memory stays bounded by about ``flush_every * 300`` bytes plus the open operators.
    start_iteration : int, default 0
        Iteration number of operators recorded before the first :meth:`step`.
    overwrite : bool, default False
        Replace this rank's log left by an earlier run in ``out_dir``. Without it, an existing
        log of this rank, or a finalized ``job.json``, is refused (a :class:`ConfigError`): the
        new run's ranks would otherwise mix with the old run's.
    parts_every : int, optional
        Live mode: write the log in parts, a part closed at the first step mark after this many
        iterations (``ranks/rank-XXXXX/part-NNNNNN.parquet``, each renamed into place when
        complete; the communicator sidecar is refreshed with each part).
    parts_interval : float, optional
        Live mode: ... or after this many seconds (whichever comes first with ``parts_every``).

    Notes
    -----
    Thread-safe: operators may finish on a backend's completion thread.
    """

    def __init__(self, out_dir: str | os.PathLike[str], rank: int, *, world_size: int | None = None,
                 flush_every: int = 8192, start_iteration: int = 0, overwrite: bool = False,
                 parts_every: int | None = None, parts_interval: float | None = None) -> None:
        if int(rank) < 0:
            raise ConfigError(f"rank must be >= 0, got {rank}")
        if int(flush_every) < 1:
            raise ConfigError(f"flush_every must be >= 1, got {flush_every}")
        if world_size is not None and not 0 <= int(rank) < int(world_size):
            raise ConfigError(f"rank {rank} is outside world_size {world_size}")
        if parts_every is not None and int(parts_every) < 1:
            raise ConfigError(f"parts_every must be >= 1 iteration, got {parts_every}")
        if parts_interval is not None and not float(parts_interval) > 0:
            raise ConfigError(f"parts_interval must be > 0 seconds, got {parts_interval}")
        self.parts_every = None if parts_every is None else int(parts_every)
        self.parts_interval = None if parts_interval is None else float(parts_interval)
        self.live = self.parts_every is not None or self.parts_interval is not None
        self.parts_written = 0
        self._part_iters = 0
        self._part_t0 = time.monotonic()
        self._part_range: list[int] = []
        self._side_written: str | None = None
        self.out_dir = Path(out_dir)
        self.rank = int(rank)
        self.world_size = None if world_size is None else int(world_size)
        self.flush_every = int(flush_every)
        # finished operators, one packed row each (see _ROW); a deque so that appending needs no
        # lock (tuples of ints are left alone by the garbage collector)
        self._done: deque[tuple[int, ...]] = deque()
        # synchronous operators running now: key -> the row without end_ns (a collective's key is
        # its packed comm/seq, unique; other operators take negative keys)
        self._inflight: dict[int, tuple[int, ...]] = {}
        self._sync_keys = count(-1, -1)
        # threads that ran a hook's completion callback (see holmes.logger._work._async_done)
        self._cb_threads: set[int] = set()
        self._pending: list[PendingOp] = []
        # packed (iteration, op_index) of a finished row the rank waited on -> (return_ns, wait_ns)
        self._waits: dict[int, tuple[int, int]] = {}
        # callables returning the (key, end_ns) of _inflight operators that completed elsewhere
        # (the compiled kernel's buffer, holmes.logger._native); drained at flush, dump, running_since
        self._drainers: list[Callable[[], Iterable[tuple[int, int]]]] = []
        self._lock = threading.RLock()
        self._comm_ids: dict[str, int] = {}
        self._comm_names: list[str] = []
        self._comm_info: dict[str, dict[str, Any]] = {}
        # seq counters yielding comm << 40 | seq: per communicator (collectives), per
        # (communicator, op, peer) (point-to-point)
        self._seq_coll: dict[int, count[int]] = {}
        self._seq_p2p: dict[tuple[int, int, int], count[int]] = {}
        self._cur_iter = _check_iteration(start_iteration)
        # yields iteration << 32 | op_index; replaced at each step mark
        self._index = count(self._cur_iter << 32)
        self._iter_start: int | None = None
        self._flushed_first: int | None = None  # earliest start written while no mark was seen
        self._iters: list[tuple[int, int, int]] = []
        self._marked: list[int] = []  # the first and the last iteration a step mark started
        self._writer: pq.ParquetWriter | None = None
        self._iter_writer: pq.ParquetWriter | None = None
        self.rows_written = 0
        self.closed = False
        for sub in ("ranks", "iterations", COMMS_DIR):
            (self.out_dir / sub).mkdir(parents=True, exist_ok=True)
        name = f"rank-{self.rank:05d}"
        self.ops_path = self.out_dir / "ranks" / f"{name}.parquet"
        self.iterations_path = self.out_dir / "iterations" / f"{name}.parquet"
        self.comms_path = self.out_dir / COMMS_DIR / f"{name}.json"
        self.parts_dir = self.out_dir / "ranks" / rank_parts_dirname(self.rank)
        if not overwrite:
            for old in (self.ops_path, self.parts_dir, self.out_dir / "job.json"):
                if old.exists():
                    raise ConfigError(f"{old}: exists (left by an earlier run?); record into a new directory or "
                                      "pass overwrite=True")
        if self.live:
            if overwrite and self.parts_dir.is_dir():
                for old_part in self.parts_dir.glob("part-*.parquet"):
                    old_part.unlink()
            self.parts_dir.mkdir(exist_ok=True)
        self._tmp_ops = self.ops_path.with_name(f".{name}.parquet.partial")
        self._tmp_iters = self.iterations_path.with_name(f".{name}.parquet.partial")

    # ------------------------------------------------------------------ communicators and steps

    @property
    def iteration(self) -> int:
        """The iteration new operators are attributed to."""
        return self._cur_iter

    @property
    def communicators(self) -> dict[str, dict[str, Any]]:
        """comm_id -> ``{"kind", "ranks", "name"}`` of every communicator registered so far."""
        return {k: dict(v) for k, v in self._comm_info.items()}

    def add_communicator(self, comm_id: str, ranks: Iterable[int], kind: str = "other",
                         name: str | None = None) -> None:
        """Register a communicator (its global ranks and kind) for the sidecar and ``job.json``."""
        if kind not in _KINDS:
            raise ConfigError(f"communicator '{comm_id}': kind {kind!r} is not one of {', '.join(_KINDS)}")
        info: dict[str, Any] = {"kind": kind, "ranks": sorted(int(r) for r in ranks)}
        if name:
            info["name"] = str(name)
        with self._lock:
            self._comm_info[str(comm_id)] = info
            self._comm_code(str(comm_id))

    def _comm_code(self, comm_id: str) -> int:
        code = self._comm_ids.get(comm_id)
        if code is None:
            code = self._comm_ids[comm_id] = len(self._comm_names)
            self._comm_names.append(comm_id)
        return code

    def _coll_seq(self, comm_id: str) -> "count[int]":
        """The counter numbering the collectives on ``comm_id`` (yields ``comm << 40 | seq``); a
        hook may keep it and call ``next`` on it, then :meth:`_hold` the operator."""
        with self._lock:
            c = self._comm_code(comm_id)
            ctr = self._seq_coll.get(c)
            if ctr is None:
                ctr = self._seq_coll[c] = count(c << _SEQ_BITS)
            return ctr

    def _renew_index(self, iteration: int) -> int:
        """Start numbering ``iteration``'s operators; returns how many the current one saw (caller
        holds the lock). An operator racing on another thread keeps a unique number."""
        old, base = self._index, self._cur_iter << 32
        self._index = count(iteration << 32)
        return next(old) - base

    def _unmarked_first(self) -> int | None:
        """Earliest start of the current iteration's operators (for operators issued before the
        first mark), or None (caller holds the lock)."""
        it = self._cur_iter
        starts = [r[_START] for r in chain(list(self._done), list(self._inflight.values()),
                                           [h.head for h in self._pending]) if r[0] >> 32 == it]
        if self._flushed_first is not None:
            starts.append(self._flushed_first)
        return min(starts, default=None)

    def step(self, iteration: int | None = None, now_ns: int | None = None) -> int:
        """Start iteration ``iteration`` (default: the current one + 1) and close the current one.

        Call it at the top of every training step (``step(i)``) or at the end of every step
        (``step()``); the current iteration's boundary ``(start, now)`` goes to the iterations file
        if it saw any operator. ``step(i)`` with ``i`` the current iteration changes nothing
        (operators issued before the first mark belong to ``start_iteration``). Returns the new
        iteration number.
        """
        now = time.time_ns() if now_ns is None else int(now_ns)
        if iteration is not None:
            iteration = _check_iteration(iteration)
        with self._lock:
            self._marked.append(self._cur_iter + 1 if iteration is None else iteration)
            if len(self._marked) > 2:  # first and last are enough (job.json's capture checks)
                del self._marked[1]
            if iteration == self._cur_iter:
                if self._iter_start is None:  # ops issued before the first mark stay in it
                    first = self._unmarked_first()
                    self._iter_start = now if first is None else first
                return self._cur_iter
            new = self._cur_iter + 1 if iteration is None else iteration
            n_ops = self._renew_index(new)
            if self._iter_start is not None or n_ops:
                if n_ops:
                    start = self._iter_start if self._iter_start is not None else self._unmarked_first()
                    self._iters.append((self._cur_iter, int(now if start is None else start), now))
                self._part_iters += 1
            elif iteration is None:  # nothing open yet: the first mark just names the iteration
                new = self._cur_iter
                self._index = count(new << 32)
            self._cur_iter = new
            self._iter_start = now
            if self.live and self._part_due():
                self._cut_part_locked()
        return new

    # ------------------------------------------------------------------ live parts

    def _part_due(self) -> bool:
        if self.parts_every is not None and self._part_iters >= self.parts_every:
            return True
        return self.parts_interval is not None and time.monotonic() - self._part_t0 >= self.parts_interval

    def _ops_tmp(self) -> Path:
        """Where rows go now: the rank file's temporary, or the current part's in live mode."""
        if self.live:
            return self.parts_dir / f".{part_filename(self.parts_written)}.partial"
        return self._tmp_ops

    def _cut_part_locked(self) -> None:
        """Flush the finished rows, close the current part and rename it into place (caller holds the lock)."""
        self._flush_locked(final=False)
        self._close_part_locked()
        self._part_iters = 0
        self._part_t0 = time.monotonic()

    def _close_part_locked(self) -> Path | None:
        if self._writer is None:
            return None
        if self._part_range:
            self._writer.add_key_value_metadata({ITERATION_KEYS[0].decode(): str(min(self._part_range)),
                                                 ITERATION_KEYS[1].decode(): str(max(self._part_range))})
        self._writer.close()
        self._writer = None
        final = self.parts_dir / part_filename(self.parts_written)
        os.replace(self._ops_tmp(), final)
        self.parts_written += 1
        self._part_range = []
        self._write_sidecar(live=True)
        log.debug("rank %d: part %s written", self.rank, final)
        return final

    def _write_sidecar(self, live: bool = False, dump: dict[str, Any] | None = None) -> None:
        side: dict[str, Any] = {"rank": self.rank, "world_size": self.world_size, "rows": self.rows_written,
                                "communicators": self._comm_info}
        if self._marked:
            side["marked"] = [self._marked[0], self._marked[-1]]
        if live:
            side["live"] = True
        if dump is not None:
            side["dump"] = dump
        text = json.dumps(side, sort_keys=True)
        if live and text == self._side_written:
            return
        tmp = self.comms_path.with_name(f".{self.comms_path.name}.partial")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, self.comms_path)
        self._side_written = text

    # ------------------------------------------------------------------ recording

    def _head(self, comm_id: str, op: str, peer: int | None, nbytes: int, start_ns: int) -> tuple[int, ...]:
        """Number a new operator (``seq``, ``op_index``) and return its packed row without
        ``end_ns`` (caller holds the lock)."""
        code = _OP_CODE.get(op)
        if code is None:
            raise ConfigError(f"unknown operator {op!r}; expected one of {list(OP_NAMES)}")
        if len(self._done) >= self.flush_every:
            self._flush_locked(final=False)
        c = self._comm_ids.get(comm_id)
        if c is None:
            c = self._comm_code(comm_id)
        p = -1 if peer is None else int(peer)
        if code in _P2P_CODES:
            key = (c, code, p)
            ctr = self._seq_p2p.get(key)
            if ctr is None:
                ctr = self._seq_p2p[key] = count(c << _SEQ_BITS)
        else:
            ctr = self._seq_coll.get(c)
            if ctr is None:
                ctr = self._seq_coll[c] = count(c << _SEQ_BITS)
        return (next(self._index), next(ctr), _op_key(code, p), nbytes, start_ns)

    def record(self, comm_id: str, op: str, *, peer: int | None = None, nbytes: int = 0,
               start_ns: int, end_ns: int) -> None:
        """Record a finished operator (``op`` one of the CommOps v1 operator names)."""
        with self._lock:
            head = self._head(comm_id, op, peer, int(nbytes), int(start_ns))
        self._done.append(head + (max(int(end_ns), int(start_ns)),))

    def begin(self, comm_id: str, op: str, *, peer: int | None = None, nbytes: int = 0,
              start_ns: int | None = None) -> PendingOp:
        """Record an operator that started now (or at ``start_ns``); finish it with :meth:`PendingOp.finish`."""
        start = time.time_ns() if start_ns is None else int(start_ns)
        with self._lock:
            h = PendingOp(self, self._head(comm_id, op, peer, int(nbytes), start))
            self._pending.append(h)
        return h

    def open_sync(self, comm_id: str, op: str, peer: int | None, nbytes: int, start_ns: int) -> int:
        """A synchronous operator started: it is held as running (a dump writes it so) until
        :meth:`close_sync` with the key returned here."""
        with self._lock:
            head = self._head(comm_id, op, peer, nbytes, start_ns)
            key = next(self._sync_keys)
            self._inflight[key] = head
        return key

    def close_sync(self, key: int, end_ns: int) -> None:
        """The synchronous operator ``key`` ended at ``end_ns`` (no lock: a dict pop and a deque
        append; after a dump or close it is ignored)."""
        head = self._inflight.pop(key, None)
        if head is not None:
            self._done.append(head + ((end_ns if end_ns > head[_START] else head[_START]),))

    def running_since(self) -> int | None:
        """``start_ns`` of the oldest operator still running, or None."""
        with self._lock:
            self._drain()
            return min([h[_START] for h in list(self._inflight.values())] +
                       [h.head[_START] for h in self._pending if not h.done], default=None)

    def _finish(self, h: PendingOp, end_ns: int, start_ns: int | None) -> None:
        with self._lock:
            if h.done:
                return
            h.done = True
            head = h.head
            start = head[_START] if start_ns is None else int(start_ns)
            end = max(int(end_ns), start)
            self._done.append(head[:_START] + (start, end))
            if h.wait_ns is not None:
                w = min(max(int(h.wait_ns), start), end)
                self._waits[head[0]] = (min(max(int(h.return_ns or start), start), w), w)
            try:
                self._pending.remove(h)
            except ValueError:  # pragma: no cover - already removed
                pass

    # ------------------------------------------------------------------ flushing

    @property
    def buffered(self) -> int:
        """Rows held in memory (not yet written)."""
        return len(self._done) + len(self._inflight) + len(self._pending)

    def _drain(self) -> None:  # the operators that completed outside Python (see _drainers)
        for drainer in self._drainers:
            for key, end in drainer():
                self.close_sync(key, end)

    def _resolve_pending(self, final: bool) -> None:
        self._drain()
        now = time.time_ns()
        for h in list(self._pending):
            got = None
            if h.resolver is not None:
                got = h.resolver(final)
                if got is not None:
                    self._finish(h, got[1], got[0])
                    continue
            if h.poll is not None:
                try:
                    if h.poll():
                        self._finish(h, now, None)
                        continue
                except Exception:  # noqa: BLE001 - a failed op counts as completed
                    self._finish(h, now, None)
                    continue
            if final:
                log.debug("rank %d: operator still running at close; end_ns set to now", self.rank)
                self._finish(h, now, None)
        if final:
            for key in list(self._inflight):  # synchronous operators that never returned (an exception)
                self.close_sync(key, now)

    def _flush_locked(self, final: bool) -> None:
        self._resolve_pending(final)
        q = self._done
        n = len(q)  # rows appended from now on stay for the next flush
        if n:
            pop = q.popleft
            rows = [pop() for _ in range(n)]
            a = np.fromiter(chain.from_iterable(rows), np.int64, count=_ROW * n).reshape(n, _ROW)
            if self._iter_start is None:  # no mark yet: the unmarked iteration's start may be in here
                mine = a[a[:, 0] >> 32 == self._cur_iter, _START]
                if len(mine):
                    m = int(mine.min())
                    self._flushed_first = m if self._flushed_first is None else min(m, self._flushed_first)
            self._write_rows(a)
        if self._iters:
            self._write_iterations()

    def _columns(self, a: np.ndarray) -> list[pa.Array]:
        """The CommOps v1 columns (end_ns included) of an ``(n, 6)`` array of packed rows;
        ``comm_id`` and ``op`` dictionary-encoded (readers cast them to strings)."""
        peer = ((a[:, 2] & _LOW32) - 1).astype(np.int32)
        return [
            pa.array(np.full(len(a), self.rank, np.int32)),
            pa.array(a[:, 0] >> 32),
            pa.array((a[:, 0] & _LOW32).astype(np.int32)),
            pa.DictionaryArray.from_arrays(pa.array((a[:, 1] >> _SEQ_BITS).astype(np.int32)),
                                           pa.array(self._comm_names, pa.string())),
            pa.array(a[:, 1] & _SEQ_MASK),
            pa.DictionaryArray.from_arrays(pa.array((a[:, 2] >> 32).astype(np.int32)), _OP_DICT),
            pa.array(peer, mask=peer < 0, type=pa.int32()),
            pa.array(a[:, 3]),
            pa.array(a[:, 4]),
            pa.array(a[:, 5]),
        ]

    def _write_rows(self, a: np.ndarray) -> None:
        table = pa.Table.from_arrays(self._columns(a) + wait_columns(self._waits, a[:, 0]), schema=_WRITE_SCHEMA)
        if self._writer is None:
            self._writer = pq.ParquetWriter(self._ops_tmp(), _WRITE_SCHEMA, **_WRITE_OPTIONS)
        if self.live:
            self._part_range += [int(a[:, 0].min() >> 32), int(a[:, 0].max() >> 32)]
        self._writer.write_table(table)
        self.rows_written += table.num_rows

    def _write_iterations(self) -> None:
        a = np.array(self._iters, dtype=np.int64).reshape(-1, 3)
        t = pa.Table.from_arrays([pa.array(np.full(len(a), self.rank, np.int32)), pa.array(a[:, 0]),
                                  pa.array(a[:, 1]), pa.array(a[:, 2])], schema=ITERATIONS_SCHEMA)
        if self._iter_writer is None:
            self._iter_writer = pq.ParquetWriter(self._tmp_iters, ITERATIONS_SCHEMA)
        self._iter_writer.write_table(t)
        self._iters.clear()

    def _finish_ops_file_locked(self) -> None:
        """Close the rank file (or, live, the current part) and rename it into place; a rank without
        any operator gets an empty but valid file (part)."""
        if self.live and self._writer is None and self.parts_written:
            return
        if self._writer is None:
            self._writer = pq.ParquetWriter(self._ops_tmp(), OPS_SCHEMA)
            self._writer.write_table(OPS_SCHEMA.empty_table())
        if self.live:
            self._close_part_locked()
            return
        self._writer.close()
        os.replace(self._tmp_ops, self.ops_path)

    @property
    def log_path(self) -> Path:
        """The rank's log: the file, or the parts directory in live mode."""
        return self.parts_dir if self.live else self.ops_path

    def flush(self) -> None:
        """Append every finished buffered row to the rank file (still-running rows stay buffered)."""
        with self._lock:
            if not self.closed:
                self._flush_locked(final=False)

    def dump(self, reason: str = "signal", detail: str | None = None, *, at_ns: int | None = None) -> Path:
        """Write what this rank has now, the operators in flight included, and close (a hang dump).

        The finished operators are flushed and renamed into place first (the rank file is readable
        even if the process dies during the rest); then the operators still running are added with
        ``state`` ``"started"`` and a null ``end_ns`` (every other row ``"completed"``), and the
        sidecar records ``{"reason", "at_ns", "detail"}`` for ``job.json``'s ``dump``. The current
        iteration is left open (it has no end). Calling it on a closed recorder changes nothing.

        Examples
        --------
        >>> import tempfile, pyarrow.parquet as pq
        >>> d = tempfile.mkdtemp()
        >>> rec = CommOpsRecorder(d, rank=0, world_size=2)
        >>> rec.add_communicator("dp-0", [0, 1], kind="dp")
        >>> rec.record("dp-0", "all_reduce", nbytes=8, start_ns=0, end_ns=5)
        >>> _ = rec.begin("dp-0", "all_reduce", nbytes=8, start_ns=10)
        >>> t = pq.read_table(rec.dump("timeout"))
        >>> t.column("state").to_pylist(), t.column("end_ns").to_pylist()
        (['completed', 'started'], [5, None])
        """
        if reason not in ("timeout", "signal", "exception", "end"):
            raise ConfigError(f"dump reason {reason!r} is not one of timeout, signal, exception, end")
        at = time.time_ns() if at_ns is None else int(at_ns)
        with self._lock:
            if self.closed:
                return self.log_path
            self._flush_locked(final=False)  # finished rows out
            open_ops = [h for h in self._pending if not h.done]   # a rank blocked in wait() says so
            heads = list(self._inflight.values()) + [h.head for h in open_ops]
            rets = [None] * len(self._inflight) + [h.return_ns if h.wait_ns is not None else None for h in open_ops]
            waits = [None] * len(self._inflight) + [h.wait_ns for h in open_ops]
            self._inflight.clear()
            n = len(heads)
            self._finish_ops_file_locked()  # what is complete is readable from here on
            if self._iter_writer is not None:
                self._iter_writer.close()
                os.replace(self._tmp_iters, self.iterations_path)
            if n:
                write_running(self, heads, rets, waits)
            self.rows_written += n
            self._write_sidecar(dump={"reason": reason, "at_ns": at, **({"detail": str(detail)[:500]} if detail else {})})
            self.rows_written -= n
            self.closed = True
            log.warning("rank %d: dumped (%s) %d finished and %d running operator(s) to %s",
                        self.rank, reason, self.rows_written, n, self.log_path)
        return self.log_path

    def close(self, *, end_iteration: bool = True) -> Path:
        """Flush everything, close the files, rename them into place and write the sidecar.

        With ``end_iteration`` the current iteration (if it saw operators) ends now. Returns the
        rank file's path. Calling it twice is harmless.
        """
        with self._lock:
            if self.closed:
                return self.log_path
            now = time.time_ns()
            if self._renew_index(self._cur_iter + 1) and end_iteration:
                start = self._iter_start if self._iter_start is not None else self._unmarked_first()
                self._iters.append((self._cur_iter, int(now if start is None else start), now))
            self._flush_locked(final=True)
            self._finish_ops_file_locked()
            if self._iter_writer is not None:
                self._iter_writer.close()
                os.replace(self._tmp_iters, self.iterations_path)
            self._write_sidecar()
            self.closed = True
            log.info("rank %d: wrote %d operators to %s", self.rank, self.rows_written, self.log_path)
        return self.log_path
