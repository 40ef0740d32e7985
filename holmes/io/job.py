"""Reading and writing CommOps job directories (see ``DESIGN.md``, "The job directory").

A :class:`Job` opens instantly: it parses ``job.json`` and nothing else. A rank's parquet file is
read (memory-mapped) the first time :meth:`Job.ops` asks for it and kept in a small LRU cache, so
a search that visits 40 ranks of a 10,000-rank job reads 40 files. :attr:`Job.stats` counts what
was read.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from holmes.errors import ArgumentTypeError, ConfigError, JobError, MissingRankError, ParseError, SchemaError
from holmes.io import parts
from holmes.io.consistency import ConsistencyLog, check_iterations, check_ops
from holmes.io.limits import check_world_size, read_json_capped
from holmes.io.models import JobMeta, TruthModel, load_model
from holmes.io.outputs import replace_file_text
from holmes.io.schema import SCHEMA_ID, iterations_table, validate_iterations, validate_ops

if TYPE_CHECKING:
    from holmes.topology.cluster import ClusterTopology
    from holmes.topology.layout import Communicator, ParallelLayout

__all__ = ["Job", "MemoryJob", "ReadStats", "read_job", "JobWriter", "write_job", "rank_filename",
           "derive_iterations"]

log = logging.getLogger(__name__)


def rank_filename(rank: int) -> str:
    """``rank-00042.parquet``: the file name of a rank's log (zero-padded to 5 digits)."""
    return f"rank-{rank:05d}.parquet"


@dataclass
class ReadStats:
    """What a job has read from disk so far."""

    ranks_read: set[int] = field(default_factory=set)
    bytes_read: int = 0
    files_read: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"ranks_read": len(self.ranks_read), "bytes_read": self.bytes_read, "files_read": self.files_read}


def derive_iterations(ops: pa.Table) -> pa.Table:
    """Iteration boundaries of one rank derived from its ops, when ``iterations/`` is absent.

    The rule: iteration *i* ends when its last communication op completes (``max(end_ns)``), and
    starts when the previous iteration ended; the first iteration in the log starts at its first
    op's ``start_ns``. So iteration time = gap between consecutive "last op completed" instants,
    which includes the compute after the last op of the previous iteration and before the first op
    of this one, as a step timer would.

    Examples
    --------
    >>> from holmes.io.schema import ops_table
    >>> t = ops_table(rank=[0]*4, iteration=[0, 0, 1, 1], op_index=[0, 1, 0, 1], comm_id=["dp-0"]*4,
    ...               seq=[0, 1, 2, 3], op=["all_reduce"]*4, peer=[None]*4, nbytes=[1]*4,
    ...               start_ns=[100, 300, 600, 800], end_ns=[200, 400, 700, 1000])
    >>> derive_iterations(t).to_pydict()["end_ns"], derive_iterations(t).to_pydict()["start_ns"]
    ([400, 1000], [100, 400])
    """
    if ops.num_rows and (ops.column("end_ns").null_count or ops.column("start_ns").null_count):
        # a log dumped with ops in flight: only iterations whose ops all completed have a duration
        open_its = pc.unique(ops.filter(pc.or_(ops.column("end_ns").is_null(), ops.column("start_ns").is_null()))
                             .column("iteration"))
        ops = ops.filter(pc.invert(pc.is_in(ops.column("iteration"), value_set=open_its)))
    if ops.num_rows == 0:
        return iterations_table([], [], [], [])
    it = ops.column("iteration").to_numpy()
    st = ops.column("start_ns").to_numpy()
    en = ops.column("end_ns").to_numpy()
    rank = int(ops.column("rank")[0].as_py())
    iters, inv = np.unique(it, return_inverse=True)
    first = np.full(len(iters), np.iinfo(np.int64).max, dtype=np.int64)
    last = np.full(len(iters), np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(first, inv, st)
    np.maximum.at(last, inv, en)
    start = np.empty_like(last)
    start[0] = first[0]
    start[1:] = last[:-1]
    return iterations_table(np.full(len(iters), rank, dtype=np.int32), iters, start, last)


def _rank_arg(rank: Any) -> int:
    """``rank`` as an int; a float, bool or string is an :class:`ArgumentTypeError` (not truncated)."""
    if isinstance(rank, (bool, np.bool_)) or not isinstance(rank, (int, np.integer)):
        raise ArgumentTypeError(f"rank must be an integer, not {type(rank).__name__} {rank!r}"[:200])
    return int(rank)


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
        t, found = check_ops(t, r, self.communicators, source)
        self.consistency.record_ops(found)
        self.consistency.cross_check(r, t)
        return _sorted(t)

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

    def _read_parquet(self, p: Path, rank: int) -> pa.Table:
        if p.is_dir():  # a live job's rank written in parts (holmes.io.parts)
            return parts.read_rank_parts_into(p, rank, self.stats)
        try:
            size = p.stat().st_size
        except FileNotFoundError:
            raise MissingRankError(f"{p}: log of rank {rank} is missing") from None
        if size == 0:
            raise ParseError(f"{p}: empty file (rank {rank})")
        try:
            t = pq.read_table(p, memory_map=True)
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
        p = self.rank_path(r)
        t = self._checked_ops(self._read_parquet(p, r), r, str(p))
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
    """

    def __init__(self, meta: JobMeta | Mapping[str, Any], ops: Mapping[int, pa.Table],
                 iterations: Mapping[int, pa.Table] | None = None, topology: Any = None,
                 truth: TruthModel | None = None) -> None:
        super().__init__(meta if isinstance(meta, JobMeta) else JobMeta.model_validate(meta))
        self._ops = dict(ops)
        self._iters = dict(iterations or {})
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
        if r not in self._ops:
            raise MissingRankError(f"log of rank {r} is missing")
        t = self._checked_ops(self._ops[r], r, f"rank {r}")
        self._validated[r] = t
        self.stats.ranks_read.add(r)
        self.stats.bytes_read += t.nbytes
        self._verify_iterations(r, t)
        return t

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


def _sorted(t: pa.Table) -> pa.Table:
    if t.num_rows < 2:
        return t
    it = t.column("iteration").to_numpy()
    ix = t.column("op_index").to_numpy()
    if np.all((it[1:] > it[:-1]) | ((it[1:] == it[:-1]) & (ix[1:] >= ix[:-1]))):
        return t
    return t.sort_by([("iteration", "ascending"), ("op_index", "ascending")])


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


class JobWriter:
    """Write a job directory rank by rank: built in a temporary sibling, swapped in whole on close.

    Files go to :attr:`staging` (a ``.holmes-tmp-*`` sibling of ``path``); :meth:`close` writes
    ``job.json`` last and swaps the directory into place (see :func:`holmes.io.outputs.staged_directory`),
    so an interrupted write never leaves a half-new job, and ``overwrite`` replaces an old job
    whole (nothing of it survives beside the new files). Leaving the ``with`` block on an
    exception, or :meth:`abort`, deletes the staging directory and leaves ``path`` untouched.

    Parameters
    ----------
    path : path-like
        Target directory. It must not exist or be empty, unless ``overwrite=True``; a writer never
        replaces a directory that holds something else than a job.
    meta : JobMeta or dict
        The contents of ``job.json``.
    overwrite : bool, default False
        Replace an existing job directory.
    compression : str, default "zstd"
    inputs : iterable of path-like, optional
        What the caller reads; ``path`` may not lie inside (or contain) one of them.

    Examples
    --------
    >>> import tempfile, holmes
    >>> from holmes.io.schema import ops_table
    >>> d = tempfile.mkdtemp() + "/job"
    >>> meta = {"world_size": 2, "communicators": {"dp-0": {"kind": "dp", "ranks": [0, 1]}}}
    >>> with JobWriter(d, meta) as w:
    ...     for r in (0, 1):
    ...         _ = w.write_ops(r, ops_table(rank=[r], iteration=[0], op_index=[0], comm_id=["dp-0"],
    ...                     seq=[0], op=["all_reduce"], peer=[None], nbytes=[4], start_ns=[0], end_ns=[9]))
    >>> holmes.read_job(d).ops(1).num_rows
    1
    """

    def __init__(self, path: str | os.PathLike[str], meta: JobMeta | Mapping[str, Any], *,
                 overwrite: bool = False, compression: str = "zstd",
                 inputs: Iterable[str | os.PathLike[str]] = ()) -> None:
        from holmes.io.outputs import TMP_PREFIX, OutputError, check_output

        if not isinstance(path, (str, os.PathLike)):
            raise ConfigError(f"job path must be a path, not {type(path).__name__}")
        self.path = Path(path)
        self.meta = meta if isinstance(meta, JobMeta) else JobMeta.model_validate(dict(meta))
        check_world_size(self.meta.world_size, f"{self.path}/job.json")
        self.compression = compression
        self.overwrite = bool(overwrite)
        try:
            check_output(self.path, inputs=inputs, overwrite=self.overwrite, kind="job")
        except OutputError as exc:
            raise JobError(str(exc)) from None
        parent = Path(os.path.realpath(os.path.abspath(self.path))).parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise JobError(f"{self.path}: cannot create {parent}: {exc.strerror or exc}") from None
        self.staging = Path(tempfile.mkdtemp(dir=parent, prefix=f"{TMP_PREFIX}{self.path.name}."))
        (self.staging / "ranks").mkdir()
        self._comm_ids = None if self.meta.communicators is None else set(self.meta.communicators)
        self.ranks_written: set[int] = set()
        self._closed = False

    def __enter__(self) -> "JobWriter":
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def __del__(self) -> None:  # a writer dropped without close leaves no staging directory
        try:
            if not self._closed:
                self.abort()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def abort(self) -> None:
        """Delete what was staged; ``path`` stays as it was."""
        self._closed = True
        shutil.rmtree(self.staging, ignore_errors=True)

    def _check_rank(self, rank: int) -> int:
        r = _rank_arg(rank)
        if r < 0 or r >= self.meta.world_size:
            raise JobError(f"rank {r} is outside world_size {self.meta.world_size}")
        return r

    def staged_path(self, *parts: str) -> Path:
        """Where a file of the job is written before the swap (``staged_path("ranks", name)``)."""
        if self._closed:
            raise JobError(f"{self.path}: writer is closed")
        return self.staging.joinpath(*parts)

    def write_ops(self, rank: int, table: pa.Table) -> Path:
        """Validate and write one rank's ops; returns the file written (in the staging directory)."""
        r = self._check_rank(rank)
        t = validate_ops(table, f"rank {r}", world_size=self.meta.world_size, rank=r, comm_ids=self._comm_ids)
        p = self.staged_path("ranks", rank_filename(r))
        pq.write_table(t, p, compression=self.compression)
        self.ranks_written.add(r)
        return p

    def write_iterations(self, rank: int, table: pa.Table) -> Path:
        r = self._check_rank(rank)
        t = validate_iterations(table, f"iterations of rank {r}")
        d = self.staged_path("iterations")
        d.mkdir(exist_ok=True)
        p = d / rank_filename(r)
        pq.write_table(t, p, compression=self.compression)
        return p

    def write_topology(self, topology: Any) -> Path:
        p = self.staged_path("topology.json")
        replace_file_text(p, json.dumps(topology.to_dict(), indent=1, allow_nan=False) + "\n")
        return p

    def write_truth(self, truth: TruthModel | Mapping[str, Any]) -> Path:
        model = truth if isinstance(truth, TruthModel) else TruthModel.model_validate(dict(truth))
        p = self.staged_path("truth.json")
        replace_file_text(p, json.dumps(model.model_dump(by_alias=True, mode="json"), indent=2, allow_nan=False) + "\n")
        return p

    def close(self) -> Path:
        """Write ``job.json`` (last) and swap the staged directory into place; returns the job directory."""
        if not self._closed:
            from holmes.io.outputs import _swap_in

            try:
                replace_file_text(self.staging / "job.json",
                                  json.dumps(self.meta.to_json_dict(), indent=2, allow_nan=False) + "\n")
                _swap_in(self.staging, Path(os.path.realpath(os.path.abspath(self.path))), self.overwrite)
            except BaseException:
                self.abort()
                raise
            self._closed = True
        return self.path


def write_job(path: str | os.PathLike[str], meta: JobMeta | Mapping[str, Any], ops: Mapping[int, pa.Table] | Iterable[tuple[int, pa.Table]],
              *, iterations: Mapping[int, pa.Table] | None = None, topology: Any = None,
              truth: TruthModel | Mapping[str, Any] | None = None, overwrite: bool = False,
              inputs: Iterable[str | os.PathLike[str]] = ()) -> Path:
    """Write a whole job directory at once; see :class:`JobWriter`."""
    items = ops.items() if isinstance(ops, Mapping) else ops
    with JobWriter(path, meta, overwrite=overwrite, inputs=inputs) as w:
        for r, t in items:
            w.write_ops(r, t)
        for r, t in (iterations or {}).items():
            w.write_iterations(r, t)
        if topology is not None:
            w.write_topology(topology)
        if truth is not None:
            w.write_truth(truth)
    return Path(path)


assert SCHEMA_ID == JobMeta.model_fields["schema_id"].default
_ = (SchemaError,)
