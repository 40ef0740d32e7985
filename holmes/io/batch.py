"""Reading many ranks at once: the batch read path behind :meth:`holmes.io.Job.iter_ranks`.

Reading a rank one at a time costs a fixed ~3 ms (open the file, validate its schema, the
consistency pass, the cross-rank check), whatever its size; an analysis that reads every rank of
an 8,192-rank job pays it 8,192 times. A batch of ranks is read as one: each file is opened once
(only the columns the checks and the caller need), the tables of one schema are concatenated
(zero-copy), the schema is validated once per batch, and the consistency pass
(:func:`holmes.io.consistency.check_ops_batch`, :meth:`~holmes.io.consistency.ConsistencyLog.cross_check_batch`)
runs vectorized over every row of the batch, keyed by rank. The findings are the same as rank by
rank; a batch in which something fails validation is redone rank by rank so that the error names
the file, the rank and the column.

Examples
--------
>>> import tempfile, holmes
>>> from holmes.io import write_job
>>> from holmes.io.schema import ops_table
>>> d = tempfile.mkdtemp() + "/job"
>>> meta = {"world_size": 3, "communicators": {"dp-0": {"kind": "dp", "ranks": [0, 1, 2]}}}
>>> logs = {r: ops_table(rank=[r] * 2, iteration=[0, 1], op_index=[0, 0], comm_id=["dp-0"] * 2, seq=[0, 1],
...                      op=["all_reduce"] * 2, peer=[None] * 2, nbytes=[4] * 2, start_ns=[0, 10],
...                      end_ns=[5, 15]) for r in range(2)}
>>> _ = write_job(d, meta, logs)
>>> job = holmes.read_job(d)
>>> [(r, t.num_rows if t is not None else None, type(e).__name__) for r, t, e in
...  job.iter_ranks(columns=["seq", "end_ns"], errors="skip")]
[(0, 2, 'NoneType'), (1, 2, 'NoneType'), (2, None, 'MissingRankError')]
>>> job.stats.as_dict()["ranks_read"]
2
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from holmes.errors import HolmesError, MissingRankError, ParseError, SchemaError
from holmes.io.capped_parquet import CappedReader
from holmes.io.consistency import check_ops_batch
from holmes.io.schema import OPS_SCHEMA, validate_ops

__all__ = ["RankRead", "RankBatch", "iter_batches", "read_rank_file", "sort_ops", "CHECK_COLUMNS", "DEFAULT_BATCH_SIZE"]

log = logging.getLogger(__name__)

#: the columns the schema check and the consistency pass read (``state`` too, when a log has it)
CHECK_COLUMNS = tuple(OPS_SCHEMA.names) + ("state",)
#: ranks read together in one batch (one batch's tables are in memory at once)
DEFAULT_BATCH_SIZE = 256


class RankRead(NamedTuple):
    """One rank of :meth:`holmes.io.Job.iter_ranks`: its checked table, or the error that made
    it unusable (``errors="skip"``)."""

    rank: int
    table: pa.Table | None
    error: HolmesError | None


class RankBatch:
    """One batch of :meth:`holmes.io.Job.iter_batches`.

    Attributes
    ----------
    ranks : list of int
        The ranks asked for, in order.
    tables : dict of int to pyarrow.Table
        rank -> its checked rows (as :meth:`holmes.io.Job.ops` returns them, projected on the
        columns asked for), for the usable ranks.
    errors : dict of int to HolmesError
        rank -> why its log is unusable (missing, unreadable, bad schema).
    """

    def __init__(self, ranks: list[int], tables: Mapping[int, pa.Table], errors: dict[int, HolmesError],
                 table: pa.Table | None = None) -> None:
        self.ranks = ranks
        self.tables = tables
        self.errors = errors
        self._table: pa.Table | None = table   # given: the usable ranks' rows, in the order of ``ranks``

    def __repr__(self) -> str:
        return f"RankBatch(ranks={len(self.ranks)}, usable={len(self.tables)}, errors={len(self.errors)})"

    @property
    def table(self) -> pa.Table:
        """Every usable rank's rows, rank after rank in the order of :attr:`ranks`, as one table
        (dictionary-encoded and plain string columns unified when ranks differ)."""
        if self._table is None:
            parts = [self.tables[r] for r in self.ranks if r in self.tables]
            self._table = _concat(parts) if parts else pa.table({})
        return self._table

    @property
    def offsets(self) -> np.ndarray:
        """:attr:`table` rows ``offsets[i]:offsets[i + 1]`` belong to ``ranks[i]``."""
        t = self.tables
        rows = t.rows if isinstance(t, _Slices) else (lambda r: t[r].num_rows)
        return np.r_[0, np.cumsum([rows(r) if r in t else 0 for r in self.ranks])]

    def rank_table(self, i: int) -> pa.Table:
        """The rows of ``ranks[i]``."""
        return self.tables[self.ranks[i]]


class _Slices(Mapping):
    """rank -> its rows of one checked table (a slice, made when asked for: most callers of a
    batch read :attr:`RankBatch.table` whole)."""

    def __init__(self, whole: pa.Table, spans: dict[int, tuple[int, int]]) -> None:
        self.whole = whole
        self.spans = spans

    def __getitem__(self, r: int) -> pa.Table:
        a, n = self.spans[r]
        return self.whole.slice(a, n)

    def __contains__(self, r: object) -> bool:
        return r in self.spans

    def __iter__(self) -> Iterator[int]:
        return iter(self.spans)

    def __len__(self) -> int:
        return len(self.spans)

    def rows(self, r: int) -> int:
        return self.spans[r][1]


def read_rank_file(path: Any, rank: int, columns: Sequence[str] | None = None,
                   reader: CappedReader | None = None) -> tuple[pa.Table, int]:
    """``(table, bytes)`` of one rank's parquet file, only ``columns`` (those it has) when given.

    Read under the caps without threads (3-4x cheaper per small file than
    :func:`pyarrow.parquet.read_table`'s dataset machinery); ``reader``: a
    :class:`~holmes.io.capped_parquet.CappedReader` to read with, where one thread reads many files.

    Raises
    ------
    MissingRankError, ParseError
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise MissingRankError(f"{path}: log of rank {rank} is missing") from None
    except OSError as exc:
        raise ParseError(f"{path}: cannot read the log of rank {rank}: {exc}") from None
    size = st.st_size
    if size == 0:
        raise ParseError(f"{path}: empty file (rank {rank})")
    try:
        t = (reader or CappedReader()).read(path, columns=columns, stat_result=st)
    except (pa.ArrowInvalid, pa.ArrowException, OSError) as exc:
        raise ParseError(f"{path}: not a readable parquet file, truncated or corrupt (rank {rank}): {exc}") from None
    return t, size


def iter_batches(job: Any, ranks: Sequence[int], *, columns: Sequence[str] | None = None,
                 batch_size: int = 256, threads: int = 2) -> Iterator[RankBatch]:
    """Read ``ranks`` of ``job`` ``batch_size`` at a time; see :meth:`holmes.io.Job.iter_batches`.

    ``threads`` files are read at once (the parquet reader releases the GIL); 1 reads one by one.
    With threads, the next batch's files are read while this one is checked and handed out.
    """
    need = None if columns is None else sorted(set(columns) | set(CHECK_COLUMNS))
    rs = list(dict.fromkeys(int(r) for r in ranks))   # each rank once, in the order asked
    parts = [rs[a:a + batch_size] for a in range(0, len(rs), batch_size)]
    pool = ThreadPoolExecutor(threads) if threads > 1 and len(rs) > 1 else None
    try:
        pending = job._load_many_later(parts[0], need, pool, threads) if parts else None
        for i, part in enumerate(parts):
            assert pending is not None
            loaded = pending()
            pending = job._load_many_later(parts[i + 1], need, pool, threads) if i + 1 < len(parts) else None
            yield _read_batch(job, part, loaded, columns)
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _read_batch(job: Any, ranks: list[int], loaded: dict[int, pa.Table | HolmesError],
                columns: Sequence[str] | None) -> RankBatch:
    errors: dict[int, HolmesError] = {}
    raw: dict[int, pa.Table] = {}
    for r, got in loaded.items():
        if isinstance(got, pa.Table):
            raw[r] = got
        else:
            errors[r] = got
    usable = [r for r in ranks if r in raw]
    try:   # one schema (the usual case): one concatenation, no grouping
        groups: list[tuple[list[int], pa.Table | None]] = [(usable, _one_chunk(pa.concat_tables([raw[r] for r in usable])))]
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        groups = [(g, None) for g in _schema_groups(usable, raw)]
    checked: dict[int, pa.Table] = {}
    whole = None
    for rs, big in groups:
        got = _check_group(job, rs, raw, errors, columns, big)
        if len(groups) == 1 and isinstance(got, _Slices) and len(got) == len(usable):
            whole = got   # every usable rank, in order, as one table
        else:
            checked.update(got)
    del raw
    if whole is not None:
        job.stats.ranks_read.update(whole.spans)
        return RankBatch(list(ranks), whole, errors, table=whole.whole)
    tables = {}
    for r in ranks:
        t = checked.get(r)
        if t is not None:
            job.stats.ranks_read.add(r)
            tables[r] = t
    return RankBatch(list(ranks), tables, errors)


def _one_chunk(t: pa.Table) -> pa.Table:
    """``t`` with one chunk per column, not one per rank (every column pass of the checks is then
    one pass); dictionary columns are left as they are (combining them would unify the ranks'
    dictionaries, and each rank's table is handed out with its own)."""
    if not any(pa.types.is_dictionary(f.type) for f in t.schema):
        return t.combine_chunks()
    if all(c.num_chunks <= 1 or pa.types.is_dictionary(c.type) for c in t.columns):
        return t
    return pa.Table.from_arrays([c if pa.types.is_dictionary(c.type) else c.combine_chunks() for c in t.columns],
                                schema=t.schema)


def _schema_groups(ranks: list[int], raw: dict[int, pa.Table]) -> list[list[int]]:
    """``ranks`` grouped by the schema of their tables, in order."""
    groups: list[tuple[pa.Schema, list[int]]] = []   # (hashing a schema costs more than comparing it)
    for r in ranks:
        sch = raw[r].schema
        g = next((g for g in reversed(groups) if g[0] is sch or g[0].equals(sch)), None)
        if g is None:
            groups.append((sch, [r]))
        else:
            g[1].append(r)
    return [rs for _, rs in groups]


def _check_group(job: Any, ranks: list[int], raw: dict[int, pa.Table], errors: dict[int, HolmesError],
                 columns: Sequence[str] | None = None, joined: pa.Table | None = None) -> Mapping[int, pa.Table]:
    """Validate and check the tables of ``ranks`` (one schema; ``joined``: them concatenated) as one
    table, then split it by rank (projected on ``columns``); a failing batch is redone rank by rank
    (the error then names the file)."""
    if not ranks:
        return {}
    lens = np.array([raw[r].num_rows for r in ranks], dtype=np.int64)
    row_rank = np.repeat(np.asarray(ranks, dtype=np.int64), lens)
    try:
        big = validate_ops(pa.concat_tables([raw[r] for r in ranks]) if joined is None else joined, None,
                           world_size=job.world_size, comm_ids=job.communicators, strict=False)
        if len(row_rank) and not np.array_equal(big.column("rank").to_numpy().astype(np.int64), row_rank):
            raise SchemaError("rank column differs from the file's rank")
    except (SchemaError, pa.ArrowException):
        return _one_by_one(job, ranks, raw, errors, columns)
    kept, found = check_ops_batch(big, ranks, job.member_index, row_ranks=row_rank)
    for r in ranks:
        job.consistency.record_ops(found[r])
    job.consistency.cross_check_batch(kept, ranks)
    # kept rows stay in input order: rank after rank, in the order of ``ranks``
    kept_rank = kept.column("rank").to_numpy().astype(np.int64) if kept.num_rows else np.zeros(0, np.int64)
    lookup = np.zeros(max(ranks) + 1, dtype=np.int64)
    lookup[np.asarray(ranks)] = np.arange(len(ranks))
    counts = np.bincount(lookup[kept_rank], minlength=len(ranks))
    starts = np.r_[0, np.cumsum(counts)[:-1]]
    if kept.num_rows > 1:   # every rank already in (iteration, op_index) order: no rank needs sorting
        it, ix = kept.column("iteration").to_numpy(), kept.column("op_index").to_numpy()
        new_rank = np.zeros(kept.num_rows, dtype=bool)
        new_rank[starts[counts > 0]] = True
        ok = new_rank[1:] | (it[1:] > it[:-1]) | ((it[1:] == it[:-1]) & (ix[1:] >= ix[:-1]))
        if ok.all():
            for i, r in enumerate(ranks):
                if r in job._iter_unverified:   # an iteration file read before, awaiting its rank's ops
                    job._verify_iterations(r, kept.slice(int(starts[i]), int(counts[i])))
            kept = _project(kept, columns)
            return _Slices(kept, dict(zip(ranks, zip(starts.tolist(), counts.tolist()))))
    out = {r: sort_ops(kept.slice(int(starts[i]), int(counts[i]))) for i, r in enumerate(ranks)}
    for r, t in out.items():
        job._verify_iterations(r, t)
    return {r: _project(t, columns) for r, t in out.items()}


def _project(t: pa.Table, columns: Sequence[str] | None) -> pa.Table:
    return t if columns is None else t.select([c for c in columns if c in t.column_names])


def sort_ops(t: pa.Table) -> pa.Table:
    """``t`` sorted by ``(iteration, op_index)`` (returned as is when it already is)."""
    if t.num_rows < 2:
        return t
    it = t.column("iteration").to_numpy()
    ix = t.column("op_index").to_numpy()
    if np.all((it[1:] > it[:-1]) | ((it[1:] == it[:-1]) & (ix[1:] >= ix[:-1]))):
        return t
    return t.sort_by([("iteration", "ascending"), ("op_index", "ascending")])


def _one_by_one(job: Any, ranks: list[int], raw: dict[int, pa.Table], errors: dict[int, HolmesError],
                columns: Sequence[str] | None) -> dict[int, pa.Table]:
    out = {}
    for r in ranks:
        try:
            out[r] = job._checked_ops(raw[r], r, job._source(r))
        except SchemaError as exc:
            errors[r] = exc
            continue
        job._verify_iterations(r, out[r])
        out[r] = _project(out[r], columns)
    return out


def _concat(parts: list[pa.Table]) -> pa.Table:
    """Tables of one batch as one (dictionary and plain string columns, extra columns unified)."""
    try:
        return pa.concat_tables(parts)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        plain = []
        for t in parts:
            for i, f in enumerate(t.schema):
                if pa.types.is_dictionary(f.type):
                    t = t.set_column(i, pa.field(f.name, f.type.value_type, f.nullable), t.column(i).cast(f.type.value_type))
            plain.append(t)
        return pa.concat_tables(plain, promote_options="permissive")
