"""Reading and writing CommOps job directories (see ``docs/formats.md``, "The job directory").

A :class:`Job` opens instantly: it parses ``job.json`` and nothing else. A rank's parquet file is
read (memory-mapped) the first time :meth:`Job.ops` asks for it and kept in a small LRU cache, so
a search that visits 40 ranks of a 10,000-rank job reads 40 files. :attr:`Job.stats` counts what
was read.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from holmes.errors import (ArgumentTypeError, ConfigError, HolmesError, JobError, MissingRankError, ParseError,
                           SchemaError)
from holmes.io import parts
from holmes.io.batch import RankBatch, RankRead, iter_batches, read_rank_file, sort_ops
from holmes.io.capped_parquet import CappedReader, read_parquet_capped
from holmes.io.consistency import ConsistencyLog, check_iterations, check_ops
from holmes.io.crosscheck import MemberIndex
from holmes.io.compute import has_compute_dir, read_compute_file
from holmes.limits import read_json_capped
from holmes.io.models import JobMeta, TruthModel, load_model
from holmes.io.schema import SCHEMA_ID, iterations_table, validate_compute, validate_iterations, validate_ops
from holmes.io.writer import JobWriter, _rank_arg, rank_filename, write_job
from holmes.io.derive import derive_iterations

if TYPE_CHECKING:
    from holmes.topology.cluster import ClusterTopology
    from holmes.topology.layout import Communicator, ParallelLayout

__all__ = ["Job", "MemoryJob", "ReadStats", "read_job", "JobWriter", "write_job", "rank_filename",
           "derive_iterations", "RankRead", "RankBatch"]

log = logging.getLogger(__name__)


@dataclass
class ReadStats:
    """What a job has read from disk so far."""

    ranks_read: set[int] = field(default_factory=set)
    bytes_read: int = 0
    files_read: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"ranks_read": len(self.ranks_read), "bytes_read": self.bytes_read, "files_read": self.files_read}


class _JobBase:
    """What every job offers, whatever stores its rows."""

    meta: JobMeta
    stats: ReadStats

    def __init__(self, meta: JobMeta) -> None:
        self.meta = meta
        self.stats = ReadStats()
        #: Findings of the consistency pass on every rank read (see :mod:`holmes.io.consistency`).
        self.consistency = ConsistencyLog()
        self._iter_unverified: dict[int, tuple[pa.Table, str]] = {}
        self._communicators: dict[str, Communicator] | None = None
        self._member_index: MemberIndex | None = None
        self._layout: ParallelLayout | None = None

    @property
    def world_size(self) -> int:
        return self.meta.world_size

    @property
    def dump(self) -> dict[str, Any] | None:
        """``job.json``'s ``dump`` (``{"reason", "at_ns", ...}``): why logs holding in-flight ops
        were written, or None for a job whose logs hold completed ops only."""
        d = self.meta.dump
        return None if d is None else d.model_dump(mode="json")

    @property
    def layout(self) -> "ParallelLayout | None":
        """The parallel layout of ``job.json``'s ``parallel`` entry, if any."""
        if self._layout is None and self.meta.parallel is not None:
            from holmes.errors import LayoutError
            from holmes.topology.layout import ParallelLayout

            p = self.meta.parallel
            try:
                self._layout = ParallelLayout(tp=p.tp, pp=p.pp, dp=p.dp, cp=p.cp, ep=p.ep, etp=p.etp, order=p.order)
            except LayoutError as exc:
                raise JobError(f"{self._where('job.json')}: parallel: {exc}") from None
            if self._layout.world_size != self.world_size:
                raise JobError(f"{self._where('job.json')}: parallel degrees give {self._layout.world_size} ranks, "
                               f"world_size is {self.world_size}")
        return self._layout

    @property
    def communicators(self) -> "dict[str, Communicator]":
        """comm_id -> :class:`~holmes.topology.layout.Communicator` (kind and sorted ranks)."""
        if self._communicators is None:
            from holmes.topology.layout import Communicator

            if self.meta.communicators is not None:
                self._communicators = {
                    cid: Communicator(kind=c.kind, ranks=tuple(sorted(c.ranks)))
                    for cid, c in self.meta.communicators.items()
                }
            else:
                assert self.layout is not None
                self._communicators = dict(self.layout.communicators())
        return self._communicators

    @property
    def member_index(self) -> MemberIndex:
        """The communicators' members as sorted arrays (built once per communicator, for the checks)."""
        if self._member_index is None:
            self._member_index = MemberIndex(self.communicators)
        return self._member_index

    def _where(self, name: str) -> str:
        return name

    def check_rank(self, rank: int) -> int:
        r = _rank_arg(rank)
        if r < 0 or r >= self.world_size:
            raise JobError(f"rank {r} is outside world_size {self.world_size}")
        return r

    def iterations(self, rank: int) -> pa.Table:  # pragma: no cover - overridden
        raise NotImplementedError

    @property
    def inconsistencies(self) -> dict[int, list[str]]:
        """rank -> what the consistency pass found in that rank's log (only ranks with findings)."""
        return self.consistency.inconsistencies

    def _checked_ops(self, t: pa.Table, r: int, source: str) -> pa.Table:
        t = validate_ops(t, source, world_size=self.world_size, rank=r, comm_ids=self.communicators, strict=False)
        t, found = check_ops(t, r, self.member_index, source)
        self.consistency.record_ops(found)
        self.consistency.cross_check(r, t)
        return sort_ops(t)

    def _load_raw(self, r: int, columns: Sequence[str] | None = None) -> pa.Table:  # pragma: no cover - overridden
        """Rank ``r``'s rows as stored (only ``columns``, those it has, when given), unchecked."""
        raise NotImplementedError

    def _source(self, r: int) -> str:
        """How messages name rank ``r``'s log."""
        return f"rank {r}"

    def _load_many(self, ranks: Sequence[int], columns: Sequence[str] | None, pool: Any = None,
                   threads: int = 1) -> dict[int, pa.Table | HolmesError]:
        """rank -> its rows as stored (:meth:`_load_raw`), or the error that makes them unreadable
        (``pool``: an executor of ``threads`` threads to read with, when the storage allows)."""
        out: dict[int, pa.Table | HolmesError] = {}
        for r in ranks:
            try:
                out[r] = self._load_raw(r, columns)
            except (MissingRankError, ParseError, SchemaError) as exc:
                out[r] = exc
        return out

    def _load_many_later(self, ranks: Sequence[int], columns: Sequence[str] | None, pool: Any = None,
                         threads: int = 1) -> Callable[[], dict[int, pa.Table | HolmesError]]:
        """Start reading ``ranks`` (in ``pool``'s threads, where the storage allows) and return
        the function that waits for them and gives what :meth:`_load_many` gives."""
        return lambda: self._load_many(ranks, columns, pool, threads)

    def iter_batches(self, ranks: Sequence[int] | None = None, *, columns: Sequence[str] | None = None,
                     batch_size: int = 256, threads: int = 2) -> Iterator[RankBatch]:
        """Read many ranks cheaply, ``batch_size`` at a time, as :class:`RankBatch` tables.

        The fast path for an analysis that reads every rank (or many): each file is opened once,
        the schema is validated once per batch and the consistency pass runs vectorized over the
        batch (:mod:`holmes.io.batch`); the findings land in :attr:`consistency` exactly as with
        :meth:`ops`, and :attr:`stats` counts the ranks read. Nothing is kept in the rank cache
        (memory stays one batch). An unusable rank is in the batch's ``errors`` (never raised).

        Parameters
        ----------
        ranks : sequence of int, optional
            Which ranks, in which order (default: every rank of the world, ascending).
        columns : sequence of str, optional
            The columns to return (default: all). Only these and the ones the checks need are read.
        batch_size : int, default 256
        threads : int, default 2
            Files read at once (the parquet reader releases the GIL); 1: one after the other.
        """
        rs = range(self.world_size) if ranks is None else [self.check_rank(r) for r in ranks]
        return iter_batches(self, rs, columns=columns, batch_size=max(1, int(batch_size)), threads=int(threads))

    def iter_ranks(self, ranks: Sequence[int] | None = None, *, columns: Sequence[str] | None = None,
                   batch_size: int = 256, errors: str = "raise") -> Iterator[RankRead]:
        """Every rank's checked log, streamed: ``(rank, table, error)`` per rank, in order.

        The same tables as :meth:`ops` (validated, consistency-checked, sorted by ``(iteration,
        op_index)``), read through :meth:`iter_batches` (several times cheaper per rank); nothing is
        cached, so memory stays one batch whatever the world size.

        Parameters
        ----------
        ranks : sequence of int, optional
            Which ranks, in which order (default: every rank, ascending).
        columns : sequence of str, optional
            Return only these columns (the checks still read what they need).
        batch_size : int, default 256
            Ranks read and checked together.
        errors : {"raise", "skip"}
            An unusable rank (missing, unreadable, bad schema) raises its typed error
            (:class:`~holmes.errors.MissingRankError`, :class:`~holmes.errors.ParseError`,
            :class:`~holmes.errors.SchemaError`) when reached, or with ``"skip"`` is yielded as
            ``(rank, None, error)``.

        Examples
        --------
        >>> import holmes
        >>> job = holmes.read_job("fixtures/gpu64-3d-slow-gpu")                      # doctest: +SKIP
        >>> for rank, table, _ in job.iter_ranks(columns=["iteration", "start_ns", "end_ns"]):
        ...     pass                                                                 # doctest: +SKIP
        """
        if errors not in ("raise", "skip"):
            raise ConfigError(f"iter_ranks: errors must be 'raise' or 'skip', not {errors!r}")
        for b in self.iter_batches(ranks, columns=columns, batch_size=batch_size):
            for i, r in enumerate(b.ranks):
                err = b.errors.get(r)
                if err is not None and errors == "raise":
                    raise err
                yield RankRead(r, None if err is not None else b.rank_table(i), err)

    def _cached_ops(self, r: int) -> pa.Table | None:  # pragma: no cover - overridden
        return None

    def _store_iterations(self, r: int, t: pa.Table) -> None:  # pragma: no cover - overridden
        pass

    def _checked_iterations(self, t: pa.Table, r: int, source: str) -> pa.Table:
        """An iteration table after the consistency pass.

        Its agreement with the rank's ops is checked now when the ops are already read, else when
        :meth:`ops` reads them (reading an iteration file never reads the rank's log by itself, so
        monitors over many ranks stay cheap); a table that disagrees is then replaced by
        :func:`derive_iterations` of the ops.
        """
        t = validate_iterations(t, source)
        ops = self._cached_ops(r)
        checked, found = check_iterations(t, r, ops, source)
        self.consistency.record_iterations(found)
        if ops is None:
            self._iter_unverified[r] = (t, source)
        if checked is None:
            assert ops is not None
            return derive_iterations(ops)
        return checked

    def _verify_iterations(self, r: int, ops: pa.Table) -> None:
        pending = self._iter_unverified.pop(r, None)
        if pending is None:
            return
        checked, found = check_iterations(pending[0], r, ops, pending[1])
        self.consistency.record_iterations(found)
        if checked is None:
            self._store_iterations(r, derive_iterations(ops))

    @property
    def has_compute(self) -> bool:
        """Whether the job holds compute tables (the ranks' own work, where the source records it)."""
        return False

    def compute(self, rank: int) -> pa.Table | None:
        """Rank ``rank``'s compute table (``rank, iteration, name, start_ns, end_ns``, sorted by
        ``(iteration, start_ns)``), or None where the job has none for it: analyses then use the gaps
        between operators."""
        self.check_rank(rank)
        return None

    def iteration_times(self, rank: int) -> tuple[np.ndarray, np.ndarray]:
        """``(iteration numbers, durations in ns)`` of one rank, sorted by iteration."""
        t = self.iterations(rank)
        it = t.column("iteration").to_numpy()
        d = t.column("end_ns").to_numpy() - t.column("start_ns").to_numpy()
        order = np.argsort(it, kind="stable")
        return it[order], d[order]


class Job(_JobBase):
    """A CommOps job directory opened for reading; see :func:`read_job`."""

    def __init__(self, path: str | os.PathLike[str], *, cache_size: int = 64) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise ArgumentTypeError(f"read_job: path must be a str or os.PathLike, not {type(path).__name__}")
        if isinstance(cache_size, bool) or not isinstance(cache_size, (int, np.integer)) or cache_size < 1:
            raise ConfigError(f"read_job: cache_size must be a positive integer, not {cache_size!r}")
        self.path = Path(path)
        try:
            is_dir = self.path.is_dir()
        except (OSError, ValueError) as exc:
            raise JobError(f"{self.path}: cannot open job directory: {exc}") from None
        if not is_dir:
            raise JobError(f"{self.path}: not a job directory")
        super().__init__(load_model(self.path / "job.json", JobMeta, JobError))
        self._cache: OrderedDict[int, pa.Table] = OrderedDict()
        self._iter_cache: OrderedDict[int, pa.Table] = OrderedDict()
        self._compute_cache: OrderedDict[int, pa.Table | None] = OrderedDict()
        self._cache_size = max(1, int(cache_size))
        self._topology: Any = None
        self._truth: Any = None

    def __repr__(self) -> str:
        return f"Job({str(self.path)!r}, world_size={self.world_size})"

    def _where(self, name: str) -> str:
        return str(self.path / name)

    def rank_path(self, rank: int) -> Path:
        return parts.locate_rank_log(self.path / "ranks", rank)  # the file, else a live job's parts directory

    def has_rank(self, rank: int) -> bool:
        return parts.has_rank_log(self.rank_path(self.check_rank(rank)))

    def available_ranks(self) -> list[int]:
        """Ranks whose log file exists (lists the ``ranks/`` directory)."""
        d = self.path / "ranks"
        out = []
        if d.is_dir():
            for name in os.listdir(d):
                r = parts.rank_of_entry(name)  # rank-XXXXX.parquet, or rank-XXXXX/ of a live job's parts
                if r is not None:
                    out.append(r)
        return sorted(set(r for r in out if 0 <= r < self.world_size))

    def _source(self, r: int) -> str:
        return str(self.rank_path(r))

    def _load_raw(self, r: int, columns: Sequence[str] | None = None) -> pa.Table:
        p = self.rank_path(r)
        if p.is_dir():  # a live job's rank written in parts (holmes.io.parts)
            t = parts.read_rank_parts_into(p, r, self.stats)
            return t if columns is None else t.select([c for c in t.column_names if c in set(columns)])
        t, size = read_rank_file(p, r, columns)
        self.stats.bytes_read += size
        self.stats.files_read += 1
        return t

    def _load_many(self, ranks: Sequence[int], columns: Sequence[str] | None, pool: Any = None,
                   threads: int = 1) -> dict[int, pa.Table | HolmesError]:
        return self._load_many_later(ranks, columns, pool, threads)()

    def _load_many_later(self, ranks: Sequence[int], columns: Sequence[str] | None, pool: Any = None,
                         threads: int = 1) -> Callable[[], dict[int, pa.Table | HolmesError]]:
        ranks_dir = os.path.join(self.path, "ranks")   # str paths: no Path object per file

        def chunk(rs: Sequence[int]) -> list[Any]:
            reader = CappedReader()   # the caps read once, the shared schema planned once (a reader per thread)
            out: list[Any] = []
            for r in rs:
                try:
                    out.append(read_rank_file(os.path.join(ranks_dir, rank_filename(r)), r, columns, reader))
                except (MissingRankError, ParseError) as exc:
                    out.append(exc)
            return out

        k = max(1, int(threads)) if pool is not None and len(ranks) > 1 else 1
        step = -(-len(ranks) // k)  # one contiguous chunk per thread (a task per file costs more than its read)
        futures = [pool.submit(chunk, ranks[i:i + step]) for i in range(0, len(ranks), step)] if k > 1 else []

        def collect() -> dict[int, pa.Table | HolmesError]:
            got = [x for f in futures for x in f.result()] if futures else chunk(ranks)
            out: dict[int, pa.Table | HolmesError] = {}
            for r, x in zip(ranks, got):
                if isinstance(x, MissingRankError):   # a live job's parts directory, or really missing
                    out.update(super(Job, self)._load_many([r], columns))
                elif isinstance(x, HolmesError):
                    out[r] = x
                else:
                    self.stats.bytes_read += x[1]
                    self.stats.files_read += 1
                    out[r] = x[0]
            return out
        return collect

    def _read_parquet(self, p: Path, rank: int) -> pa.Table:
        try:
            size = p.stat().st_size
        except FileNotFoundError:
            raise MissingRankError(f"{p}: log of rank {rank} is missing") from None
        if size == 0:
            raise ParseError(f"{p}: empty file (rank {rank})")
        try:
            t = read_parquet_capped(p, memory_map=True)
        except (pa.ArrowInvalid, pa.ArrowException, OSError) as exc:
            raise ParseError(f"{p}: not a readable parquet file, truncated or corrupt (rank {rank}): {exc}") from None
        self.stats.bytes_read += size
        self.stats.files_read += 1
        return t

    def ops(self, rank: int) -> pa.Table:
        """The CommOps v1 table of ``rank``, validated, sorted by (iteration, op_index).

        Raises
        ------
        MissingRankError
            The rank's file does not exist.
        ParseError
            The file is empty, truncated or not parquet.
        SchemaError
            A column is missing or of the wrong type, a rank/peer lies outside ``world_size``, or a
            ``comm_id`` is absent from ``job.json``.
        """
        r = self.check_rank(rank)
        hit = self._cache.get(r)
        if hit is not None:
            self._cache.move_to_end(r)
            return hit
        t = self._checked_ops(self._load_raw(r), r, self._source(r))
        self.stats.ranks_read.add(r)
        self._cache[r] = t
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        self._verify_iterations(r, t)
        return t

    def _cached_ops(self, r: int) -> pa.Table | None:
        return self._cache.get(r)

    def _store_iterations(self, r: int, t: pa.Table) -> None:
        self._iter_cache[r] = t

    def iterations(self, rank: int) -> pa.Table:
        """Iteration boundaries of ``rank``: from ``iterations/`` if present, else :func:`derive_iterations`."""
        r = self.check_rank(rank)
        hit = self._iter_cache.get(r)
        if hit is not None:
            return hit
        p = self.path / "iterations" / rank_filename(r)
        if p.is_file():
            t = self._checked_iterations(self._read_parquet(p, r), r, str(p))
        else:
            t = derive_iterations(self.ops(r))
        self._iter_cache[r] = t
        if len(self._iter_cache) > self._cache_size * 4:
            self._iter_cache.popitem(last=False)
        return t

    @property
    def has_iterations(self) -> bool:
        return (self.path / "iterations").is_dir()

    @property
    def has_compute(self) -> bool:
        """Whether ``compute/`` holds at least one rank's table."""
        return has_compute_dir(self.path / "compute")

    def compute(self, rank: int) -> pa.Table | None:
        """Rank ``rank``'s compute table from ``compute/rank-NNNNN.parquet``, validated; None when
        the file is absent (see :func:`holmes.io.compute.read_compute_file` for the errors)."""
        r = self.check_rank(rank)
        if r not in self._compute_cache:
            got = read_compute_file(self.path / "compute" / rank_filename(r), r)
            if got is not None:
                self.stats.bytes_read += got[1]
                self.stats.files_read += 1
            self._compute_cache[r] = None if got is None else got[0]
            if len(self._compute_cache) > self._cache_size:
                self._compute_cache.popitem(last=False)
        self._compute_cache.move_to_end(r)
        return self._compute_cache[r]

    @property
    def topology(self) -> "ClusterTopology | None":
        """The cluster network of ``topology.json``, or None when the job has none."""
        if self._topology is None:
            p = self.path / "topology.json"
            if not p.is_file():
                return None
            from holmes.errors import TopologyError
            from holmes.topology.cluster import ClusterTopology

            data = read_json_capped(p, error=TopologyError, what="topology file")
            self._topology = ClusterTopology.from_dict(data, source=str(p))
        return self._topology

    @property
    def truth(self) -> TruthModel | None:
        """The injected faults of ``truth.json`` (generated or labelled jobs only)."""
        if self._truth is None:
            p = self.path / "truth.json"
            if not p.is_file():
                return None
            self._truth = load_model(p, TruthModel, JobError)
        return self._truth


class MemoryJob(_JobBase):
    """A job held in memory (tests, simulators, converters before writing).

    Parameters
    ----------
    meta : JobMeta or dict
        What ``job.json`` would hold.
    ops : mapping of rank -> pyarrow.Table
        Ranks absent from the mapping behave like missing files.
    iterations : mapping of rank -> pyarrow.Table, optional
    topology : ClusterTopology, optional
    truth : TruthModel, optional
    compute : mapping of rank -> pyarrow.Table, optional
        The ranks' compute tables (validated when first read, as a directory job's).
    """

    def __init__(self, meta: JobMeta | Mapping[str, Any], ops: Mapping[int, pa.Table],
                 iterations: Mapping[int, pa.Table] | None = None, topology: Any = None,
                 truth: TruthModel | None = None, compute: Mapping[int, pa.Table] | None = None) -> None:
        super().__init__(meta if isinstance(meta, JobMeta) else JobMeta.model_validate(meta))
        self._ops = dict(ops)
        self._iters = dict(iterations or {})
        self._compute = dict(compute or {})
        self._compute_checked: dict[int, pa.Table] = {}
        self.topology = topology
        self.truth = truth
        self._validated: dict[int, pa.Table] = {}
        self._iter_checked: dict[int, pa.Table] = {}

    def __repr__(self) -> str:
        return f"MemoryJob(world_size={self.world_size}, ranks={len(self._ops)})"

    def has_rank(self, rank: int) -> bool:
        return self.check_rank(rank) in self._ops

    def available_ranks(self) -> list[int]:
        return sorted(self._ops)

    def ops(self, rank: int) -> pa.Table:
        r = self.check_rank(rank)
        if r in self._validated:
            return self._validated[r]
        t = self._checked_ops(self._load_raw(r), r, f"rank {r}")
        self._validated[r] = t
        self.stats.ranks_read.add(r)
        self._verify_iterations(r, t)
        return t

    def _load_raw(self, r: int, columns: Sequence[str] | None = None) -> pa.Table:
        if r not in self._ops:
            raise MissingRankError(f"log of rank {r} is missing")
        t = self._ops[r]
        self.stats.bytes_read += t.nbytes
        return t if columns is None else t.select([c for c in t.column_names if c in set(columns)])

    def _cached_ops(self, r: int) -> pa.Table | None:
        return self._validated.get(r)

    def _store_iterations(self, r: int, t: pa.Table) -> None:
        self._iter_checked[r] = t

    def iterations(self, rank: int) -> pa.Table:
        r = self.check_rank(rank)
        if r in self._iter_checked:
            return self._iter_checked[r]
        if r in self._iters:
            t = self._checked_iterations(self._iters[r], r, f"iterations of rank {r}")
            self._iter_checked[r] = t
            return t
        return derive_iterations(self.ops(r))

    @property
    def has_compute(self) -> bool:
        return bool(self._compute)

    def compute(self, rank: int) -> pa.Table | None:
        r = self.check_rank(rank)
        if r not in self._compute:
            return None
        if r not in self._compute_checked:
            self._compute_checked[r] = validate_compute(self._compute[r], f"compute of rank {r}", rank=r)
        return self._compute_checked[r]


def read_job(path: str | os.PathLike[str], *, cache_size: int = 64) -> Job:
    """Open a CommOps job directory.

    Only ``job.json`` is read here; rank files are read lazily by :meth:`Job.ops`.

    Parameters
    ----------
    path : path-like
        The job directory (``job.json``, ``ranks/rank-00000.parquet``, ...).
    cache_size : int, default 64
        How many ranks' tables to keep in memory.

    Raises
    ------
    JobError
        The directory or ``job.json`` is missing or invalid (unknown keys, bad kinds, a rank
        outside ``world_size``).

    Examples
    --------
    >>> import holmes
    >>> job = holmes.read_job("fixtures/gpu64-3d-slow-gpu")   # doctest: +SKIP
    >>> job.ops(0).num_rows                                     # doctest: +SKIP
    """
    return Job(path, cache_size=cache_size)


assert SCHEMA_ID == JobMeta.model_fields["schema_id"].default
_ = (SchemaError,)
