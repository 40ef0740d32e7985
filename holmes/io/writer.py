"""Writing CommOps job directories (see ``docs/formats.md``, "The job directory"): :class:`JobWriter`
rank by rank into a staging directory swapped in whole, :func:`write_job` all at once."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from holmes.errors import ArgumentTypeError, ConfigError, JobError
from holmes.limits import check_world_size
from holmes.io.models import JobMeta, TruthModel
from holmes.io.outputs import replace_file_text
from holmes.io.schema import validate_compute, validate_iterations, validate_ops

__all__ = ["JobWriter", "write_job", "rank_filename", "rank_parquet_options", "job_json_text", "COMPACT_FROM_RANKS"]

#: integer columns of a rank log that only grow (within a rank): delta-encoded
_DELTA_COLUMNS = ("iteration", "op_index", "seq", "start_ns", "end_ns")
#: string columns of a rank log with few distinct values: dictionary-encoded
_DICT_COLUMNS = ("comm_id", "op", "state")


def rank_parquet_options(table: pa.Table, compression: str = "lz4") -> dict[str, Any]:
    """Keyword arguments of :func:`pyarrow.parquet.write_table` for one rank's log ``table``: those
    the logger and the simulator write with -- dictionaries only for the string columns, the
    monotone integers delta-encoded, no statistics, ``compression`` (lz4 by default).

    A rank log is small (tens to thousands of rows) and an analysis may read every rank, so what
    a file costs to open and decode matters: zstd with pyarrow's defaults (what
    :class:`JobWriter` wrote before) cost 5x more per file to read (2.4 vs 0.45 ms for a 25-row
    log, 2 cores at load 10), and the file was larger too (3.7 vs 2.3 kB).

    >>> from holmes.io.schema import ops_table
    >>> t = ops_table(rank=[0], iteration=[0], op_index=[0], comm_id=["dp-0"], seq=[0], op=["all_reduce"],
    ...               peer=[None], nbytes=[4], start_ns=[0], end_ns=[9])
    >>> sorted(rank_parquet_options(t)["column_encoding"])
    ['end_ns', 'iteration', 'op_index', 'seq', 'start_ns']
    """
    names = set(table.column_names)
    delta = {c: "DELTA_BINARY_PACKED" for c in _DELTA_COLUMNS
             if c in names and pa.types.is_integer(table.schema.field(c).type)}
    strings = [c for c in _DICT_COLUMNS if c in names]
    return {"compression": compression, "use_dictionary": strings, "write_statistics": False,
            "column_encoding": delta}


def rank_filename(rank: int) -> str:
    """``rank-00042.parquet``: the file name of a rank's log (zero-padded to 5 digits)."""
    return f"rank-{rank:05d}.parquet"


def _rank_arg(rank: Any) -> int:
    """``rank`` as an int; a float, bool or string is an :class:`ArgumentTypeError` (not truncated)."""
    if isinstance(rank, (bool, np.bool_)) or not isinstance(rank, (int, np.integer)):
        raise ArgumentTypeError(f"rank must be an integer, not {type(rank).__name__} {rank!r}"[:200])
    return int(rank)


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
    compression : str, default "lz4"
        Parquet codec of the files; rank logs are written with :func:`rank_parquet_options`.
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
                 overwrite: bool = False, compression: str = "lz4",
                 inputs: Iterable[str | os.PathLike[str]] = ()) -> None:
        from holmes.io.outputs import OutputError, _tmp_prefix, check_output, make_temp_dir

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
        try:
            self.staging = make_temp_dir(parent, _tmp_prefix(self.path.name))
        except OSError as exc:
            raise JobError(f"{self.path}: cannot write in {parent}: {exc.strerror or exc}") from None
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
        pq.write_table(t, p, **rank_parquet_options(t, self.compression))
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

    def write_compute(self, rank: int, table: pa.Table) -> Path:
        """Validate and write one rank's compute table (``compute/rank-NNNNN.parquet``: the rank's own
        work where the source records it; see :func:`holmes.io.schema.validate_compute`)."""
        r = self._check_rank(rank)
        t = validate_compute(table, f"compute of rank {r}", rank=r)
        d = self.staged_path("compute")
        d.mkdir(exist_ok=True)
        p = d / rank_filename(r)
        pq.write_table(t, p, compression=self.compression)
        return p

    def write_topology(self, topology: Any) -> Path:
        """Write ``topology.json`` (compact from :data:`holmes.topology.cluster.COMPACT_FROM_GPUS` GPUs on)."""
        p = self.staged_path("topology.json")
        replace_file_text(p, topology.to_json())
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
                replace_file_text(self.staging / "job.json", job_json_text(self.meta))
                _swap_in(self.staging, Path(os.path.realpath(os.path.abspath(self.path))), self.overwrite)
            except BaseException:
                self.abort()
                raise
            self._closed = True
        return self.path


#: jobs of this many ranks and more get a compact ``job.json`` (:func:`job_json_text`)
COMPACT_FROM_RANKS = 8192


def job_json_text(meta: JobMeta, compact: bool | None = None) -> str:
    """The text of ``job.json`` for ``meta``.

    Compact (``compact``; default: from :data:`COMPACT_FROM_RANKS` ranks on): the
    ``communicators`` are left out when ``parallel`` derives exactly the same ones (same ids,
    kinds and ranks in the same order: what a reader derives from ``parallel`` when they are
    missing, ``docs/formats.md``), and the file is one line -- at 131,072 GPUs 0.2 kB instead of
    8 MB, opened in milliseconds instead of 0.5-0.9 s. Any other job keeps them.

    >>> m = JobMeta.model_validate({"world_size": 4, "parallel": {"tp": 2, "dp": 2},
    ...     "communicators": {"tp-0": {"kind": "tp", "ranks": [0, 1]}, "tp-1": {"kind": "tp", "ranks": [2, 3]},
    ...                       "dp-0": {"kind": "dp", "ranks": [0, 2]}, "dp-1": {"kind": "dp", "ranks": [1, 3]}}})
    >>> "communicators" in job_json_text(m, compact=True), "communicators" in job_json_text(m)
    (False, True)
    """
    d = meta.to_json_dict()
    if compact is None:
        compact = meta.world_size >= COMPACT_FROM_RANKS
    if not compact:
        return json.dumps(d, indent=2, allow_nan=False) + "\n"
    if meta.parallel is not None and meta.communicators is not None and _derivable(meta):
        d.pop("communicators", None)
    return json.dumps(d, separators=(",", ":"), allow_nan=False) + "\n"


def _derivable(meta: JobMeta) -> bool:
    """Whether ``meta.parallel`` derives exactly ``meta.communicators`` (as :attr:`holmes.io.Job.communicators` does)."""
    from holmes.errors import LayoutError
    from holmes.topology.layout import ParallelLayout

    p, comms = meta.parallel, meta.communicators
    assert p is not None and comms is not None
    try:
        lay = ParallelLayout(tp=p.tp, pp=p.pp, dp=p.dp, cp=p.cp, ep=p.ep, etp=p.etp, order=p.order)
    except LayoutError:
        return False
    if lay.world_size != meta.world_size:
        return False
    kinds = {"tp": "tp", "cp": "cp", "dp": "dp_cp", "ep": "ep", "pp": "pp"}   # ParallelLayout.communicators
    n = 0
    for kind, group in kinds.items():
        arr = lay.group_array(group)
        if arr.shape[1] < 2:
            continue
        if not (np.diff(arr, axis=1) > 0).all():   # a reader keeps derived groups as they are, listed ones sorted
            return False
        for i, row in enumerate(arr.tolist()):
            c = comms.get(f"{kind}-{i}")
            if c is None or c.kind != kind or c.ranks != row:
                return False
            n += 1
    return n == len(comms)


def write_job(path: str | os.PathLike[str], meta: JobMeta | Mapping[str, Any], ops: Mapping[int, pa.Table] | Iterable[tuple[int, pa.Table]],
              *, iterations: Mapping[int, pa.Table] | None = None, compute: Mapping[int, pa.Table] | None = None,
              topology: Any = None,
              truth: TruthModel | Mapping[str, Any] | None = None, overwrite: bool = False,
              inputs: Iterable[str | os.PathLike[str]] = ()) -> Path:
    """Write a whole job directory at once; see :class:`JobWriter`."""
    items = ops.items() if isinstance(ops, Mapping) else ops
    with JobWriter(path, meta, overwrite=overwrite, inputs=inputs) as w:
        for r, t in items:
            w.write_ops(r, t)
        for r, t in (iterations or {}).items():
            w.write_iterations(r, t)
        for r, t in (compute or {}).items():
            w.write_compute(r, t)
        if topology is not None:
            w.write_topology(topology)
        if truth is not None:
            w.write_truth(truth)
    return Path(path)
