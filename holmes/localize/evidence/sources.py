"""Where the localizer gets ranks' logs from: progressive fetching with accounting.

A :class:`RankSource` hands out one rank's CommOps table at a time. :class:`JobSource` wraps any
job (a directory read rank by rank, or an in-memory :class:`~holmes.io.MemoryJob`); it counts the
ranks and bytes it read and turns a missing or unreadable rank into a recorded entry of
:attr:`JobSource.missing` (the search then goes on around it) instead of an exception.

Examples
--------
>>> from holmes.io import MemoryJob
>>> from holmes.io.schema import ops_table
>>> t = ops_table(rank=[0], iteration=[0], op_index=[0], comm_id=["dp-0"], seq=[0],
...               op=["all_reduce"], peer=[None], nbytes=[4], start_ns=[0], end_ns=[9])
>>> job = MemoryJob({"world_size": 2, "communicators": {"dp-0": {"kind": "dp", "ranks": [0, 1]}}}, {0: t})
>>> src = JobSource(job)
>>> src.fetch(0).num_rows, src.fetch(1), src.missing
(1, None, {1: 'log of rank 1 is missing'})
>>> src.ranks_read
[0]
"""

from __future__ import annotations

import logging
import os
from typing import Any, Protocol, runtime_checkable

import numpy as np
import pyarrow as pa

from holmes.errors import ConfigError, JobError, MissingRankError, ParseError, SchemaError
from holmes.io.batch import DEFAULT_BATCH_SIZE

__all__ = ["RankSource", "JobSource", "open_source"]

log = logging.getLogger(__name__)


@runtime_checkable
class RankSource(Protocol):
    """What the localizer needs from a job."""

    world_size: int
    communicators: Any
    missing: dict[int, str]

    def fetch(self, rank: int) -> pa.Table | None: ...

    def iteration_times(self, rank: int) -> tuple[np.ndarray, np.ndarray] | None: ...

    @property
    def ranks_read(self) -> list[int]: ...

    @property
    def bytes_read(self) -> int: ...


class JobSource:
    """Progressive, accounted access to a job's per-rank logs.

    Parameters
    ----------
    job : Job or MemoryJob
        Anything with ``world_size``, ``communicators``, ``ops(rank)`` and ``iteration_times(rank)``.

    Attributes
    ----------
    missing : dict
        rank -> one-line reason, for every rank whose log was absent or unreadable.
    errors : dict
        rank -> the typed error (naming the file) behind an unusable ``iteration_times``.
    """

    def __init__(self, job: Any) -> None:
        self.job = job
        self.world_size = int(job.world_size)
        self.communicators = job.communicators
        self.missing: dict[int, str] = {}
        #: the ranks of :attr:`missing` whose log exists but could not be read (corrupt, over a cap)
        self.unreadable: set[int] = set()
        self.errors: dict[int, Exception] = {}
        self._fetched: dict[int, pa.Table] = {}
        self._streamed: set[int] = set()
        self._bytes = 0
        #: called with a rank the first time its log is read (progress reporting; None: nothing)
        self.on_read: Any = None

    def fetch(self, rank: int) -> pa.Table | None:
        """The rank's table, or None (recorded in :attr:`missing`) when absent or unreadable."""
        t = self._read(rank)
        if t is not None:
            self._fetched[int(rank)] = t
        return t

    def stream(self, rank: int) -> pa.Table | None:
        """Like :meth:`fetch`, but the table is not kept (an analysis that reads every rank once,
        rank by rank); the rank still counts as read."""
        r = int(rank)
        was_read = r in self._fetched
        t = self._read(r)
        if t is not None and not was_read:
            self._streamed.add(r)
        return t

    def note_read(self, ranks: Any) -> None:
        """Count ``ranks`` as read when their logs were read elsewhere (a distributed map step)."""
        new = [int(r) for r in ranks if int(r) not in self._fetched and int(r) not in self._streamed]
        self._streamed.update(new)
        if self.on_read is not None:  # progress: each rank counted once
            for r in new:
                self.on_read(r)

    def stream_batches(self, ranks: Any = None, *, columns: Any = None, batch_size: int = DEFAULT_BATCH_SIZE) -> Any:
        """Many ranks' logs read together, as :class:`holmes.io.batch.RankBatch` es (``ranks``,
        ``tables``: rank -> checked table, ``errors``; ``table``: all of a batch's rows as one).

        The batch read path of :meth:`holmes.io.Job.iter_batches` (each file opened once, the schema
        validated and the consistency pass run once per batch): for an analysis that reads every
        rank. Like :meth:`stream`, the tables are not kept; each usable rank counts as read and each
        unusable one lands in :attr:`missing`. ``ranks`` defaults to every rank; ``columns`` (default
        all) are the columns returned. A job without ``iter_batches`` is read rank by rank.

        Examples
        --------
        >>> from holmes.io import MemoryJob
        >>> from holmes.io.schema import ops_table
        >>> t = ops_table(rank=[0], iteration=[0], op_index=[0], comm_id=["dp-0"], seq=[0],
        ...               op=["all_reduce"], peer=[None], nbytes=[4], start_ns=[0], end_ns=[9])
        >>> src = JobSource(MemoryJob({"world_size": 2, "communicators": {"dp-0": {"kind": "dp", "ranks": [0, 1]}}},
        ...                           {0: t}))
        >>> [(b.table.num_rows, sorted(b.errors)) for b in src.stream_batches(columns=["seq"])]
        [(1, [1])]
        >>> src.ranks_read, list(src.missing)
        ([0], [1])
        """
        from holmes.io.batch import RankBatch

        rs = list(range(self.world_size)) if ranks is None else [int(r) for r in ranks]
        if not hasattr(self.job, "iter_batches"):
            for a in range(0, len(rs), batch_size):
                chunk = rs[a:a + batch_size]
                tables = {r: t for r in chunk if (t := self.stream(r)) is not None}
                if columns is not None:
                    tables = {r: t.select([c for c in columns if c in t.column_names]) for r, t in tables.items()}
                yield RankBatch(chunk, tables, {})
            return
        bad = [r for r in rs if not 0 <= r < self.world_size]
        for r in bad:
            self.missing[r] = f"rank {r} is outside world_size {self.world_size}"
        rs = [r for r in rs if 0 <= r < self.world_size]
        batches = iter(self.job.iter_batches(rs, columns=columns, batch_size=batch_size)) if rs else iter(())
        while True:   # one iterator: the next batch is read while this one is used
            before = self._job_bytes()
            b = next(batches, None)
            if b is None:
                return
            after = self._job_bytes()
            self._bytes += (after - before) if after is not None and before is not None else \
                sum(t.nbytes for t in b.tables.values())
            for r, exc in b.errors.items():
                self.missing[r] = " ".join(str(exc).split())
                if not isinstance(exc, MissingRankError):
                    self.unreadable.add(r)
                log.warning("rank %d skipped: %s", r, self.missing[r])
            new = [r for r in b.tables if r not in self._fetched and r not in self._streamed]
            self._streamed.update(new)
            if self.on_read is not None:  # progress: each rank counted once
                for r in new:
                    self.on_read(r)
            yield b

    def _read(self, rank: int) -> pa.Table | None:
        """The rank's table (the kept one if any), read and accounted, or None recorded in :attr:`missing`."""
        r = int(rank)
        hit = self._fetched.get(r)
        if hit is not None or r in self.missing:
            return hit
        if not 0 <= r < self.world_size:
            self.missing[r] = f"rank {r} is outside world_size {self.world_size}"
            return None
        before = self._job_bytes()
        try:
            t = self.job.ops(r)
        except (MissingRankError, ParseError, SchemaError) as exc:
            self.missing[r] = " ".join(str(exc).split())
            if not isinstance(exc, MissingRankError):
                self.unreadable.add(r)
            log.warning("rank %d skipped: %s", r, self.missing[r])
            return None
        after = self._job_bytes()
        self._bytes += (after - before) if after is not None and before is not None else t.nbytes
        if self.on_read is not None and r not in self._streamed:
            self.on_read(r)
        return t

    def _job_bytes(self) -> int | None:
        st = getattr(self.job, "stats", None)
        return None if st is None else int(st.bytes_read)

    def iteration_times(self, rank: int) -> tuple[np.ndarray, np.ndarray] | None:
        """``(iterations, durations_ns)`` of ``rank`` or None if its logs are unusable."""
        try:
            return self.job.iteration_times(int(rank))
        except (MissingRankError, ParseError, SchemaError) as exc:
            self.missing.setdefault(int(rank), " ".join(str(exc).split()))
            self.errors.setdefault(int(rank), exc)
            return None

    @property
    def ranks_read(self) -> list[int]:
        """Ranks whose logs were fetched, ascending."""
        return sorted(self._streamed.union(self._fetched))

    @property
    def bytes_read(self) -> int:
        return self._bytes

    @property
    def topology(self) -> Any:
        return getattr(self.job, "topology", None)

    @property
    def layout(self) -> Any:
        try:
            return getattr(self.job, "layout", None)
        except JobError:
            return None


def open_source(job: Any) -> JobSource:
    """A :class:`JobSource` for a path, a Job/MemoryJob, or an existing source (returned as is)."""
    if isinstance(job, JobSource):
        return job
    if isinstance(job, (str, os.PathLike)):
        from holmes.io import read_job

        job = read_job(job)
    if not all(hasattr(job, a) for a in ("world_size", "communicators", "ops")):
        raise ConfigError(f"job must be a job directory path, a Job, a MemoryJob or a JobSource, "
                          f"not {type(job).__name__} {job!r:.60}")
    return JobSource(job)
