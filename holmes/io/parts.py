"""A rank's log written in parts while the job runs (``docs/formats.md``, "The job directory").

A live job may hold, instead of ``ranks/rank-00042.parquet``, a directory
``ranks/rank-00042/`` of parts ``part-000000.parquet``, ``part-000001.parquet``, ... Each part is
written under a temporary name (a name starting with ``.``, e.g. ``.part-000003.parquet.partial``)
and renamed into place when complete, so a part under its final name is whole; the rank's log is
the parts concatenated in index order. This module finds and reads them:

* :func:`locate_rank_log` -- the single file if present, else the parts directory;
* :func:`list_parts` -- a rank's complete parts in index order (temporaries ignored);
* :func:`read_rank_parts` -- their rows as one table; a part that is not readable parquet (cut
  short, corrupt) raises :class:`TruncatedPartError` naming the file and the rank, or is skipped
  with a one-line finding (``on_truncated="skip"``).

Parts may carry, in their parquet key-value metadata, ``holmes.first_iteration`` and
``holmes.last_iteration`` (the logger and the simulator write them); :func:`part_iterations`
reads them from the footer alone.

Examples
--------
>>> import tempfile, pathlib
>>> from holmes.io.schema import ops_table
>>> d = pathlib.Path(tempfile.mkdtemp()) / "rank-00000"
>>> for i in range(3):
...     t = ops_table(rank=[0], iteration=[i], op_index=[0], comm_id=["dp-0"], seq=[i], op=["all_reduce"],
...                   peer=[None], nbytes=[4], start_ns=[10 * i], end_ns=[10 * i + 5])
...     _ = write_part(d, i, t)
>>> _ = (d / ".part-000003.parquet.partial").write_bytes(b"PAR1")   # a part still being written
>>> [p.index for p in list_parts(d)]
[0, 1, 2]
>>> read_rank_parts(d, 0).table.column("iteration").to_pylist()
[0, 1, 2]
>>> part_iterations(list_parts(d)[2].path)
(2, 2)
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from holmes.errors import ConfigError, MissingRankError, ParseError
from holmes.io.capped_parquet import read_parquet_capped

__all__ = ["TruncatedPartError", "Part", "PartsRead", "part_filename", "part_index", "rank_parts_dirname",
           "rank_of_entry", "locate_rank_log", "has_rank_log", "list_parts", "read_part", "read_rank_parts",
           "part_iterations", "write_part", "read_rank_parts_into", "ITERATION_KEYS"]

log = logging.getLogger(__name__)

_PREFIX = "part-"
_SUFFIX = ".parquet"
#: parquet key-value metadata of a part: its first and last iteration
ITERATION_KEYS = (b"holmes.first_iteration", b"holmes.last_iteration")


class TruncatedPartError(ParseError):
    """A part under its final name that is not readable parquet (cut short or corrupt)."""


def part_filename(index: int) -> str:
    """``part-000042.parquet``: the file name of a rank's part ``index`` (zero-padded to 6 digits).

    >>> part_filename(7)
    'part-000007.parquet'
    """
    i = int(index)
    if i < 0:
        raise ConfigError(f"part index must be >= 0, got {index}")
    return f"{_PREFIX}{i:06d}{_SUFFIX}"


def part_index(name: str) -> int | None:
    """The index of a complete part's file name, None for anything else (temporaries included).

    >>> part_index("part-000012.parquet"), part_index(".part-000013.parquet.partial"), part_index("x")
    (12, None, None)
    """
    if not (name.startswith(_PREFIX) and name.endswith(_SUFFIX)):
        return None
    digits = name[len(_PREFIX):-len(_SUFFIX)]
    return int(digits) if digits.isdigit() else None


def rank_parts_dirname(rank: int) -> str:
    """``rank-00042``: the directory of a rank's parts under ``ranks/``."""
    return f"rank-{int(rank):05d}"


def rank_of_entry(name: str) -> int | None:
    """The rank of an entry of ``ranks/``: ``rank-00042.parquet`` (a file) or ``rank-00042`` (parts).

    >>> rank_of_entry("rank-00042.parquet"), rank_of_entry("rank-00042"), rank_of_entry(".rank-00042.parquet.partial")
    (42, 42, None)
    """
    if not name.startswith("rank-"):
        return None
    digits = name[5:-len(_SUFFIX)] if name.endswith(_SUFFIX) else name[5:]
    return int(digits) if digits.isdigit() else None


def locate_rank_log(ranks_dir: str | os.PathLike[str], rank: int) -> Path:
    """Where rank ``rank``'s log is: ``rank-XXXXX.parquet`` when it exists, else the parts
    directory ``rank-XXXXX/`` when that exists, else the (missing) single file's path."""
    d = Path(ranks_dir)
    single = d / f"{rank_parts_dirname(rank)}{_SUFFIX}"
    if single.exists():
        return single
    parts = d / rank_parts_dirname(rank)
    return parts if parts.is_dir() else single


def has_rank_log(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` (from :func:`locate_rank_log`) is a log: a file, or a parts directory
    holding at least one complete part."""
    p = Path(path)
    if p.is_file():
        return True
    if not p.is_dir():
        return False
    try:
        return any(part_index(e.name) is not None for e in os.scandir(p))
    except OSError:
        return False


@dataclass(frozen=True)
class Part:
    """One complete part of a rank's log."""

    index: int
    path: Path
    size: int
    mtime_ns: int


def list_parts(parts_dir: str | os.PathLike[str], min_index: int = 0) -> list[Part]:
    """The complete parts of a rank (index >= ``min_index``) in index order; temporaries and other
    names are ignored. A missing directory has no parts."""
    out = []
    try:
        entries = list(os.scandir(parts_dir))
    except (FileNotFoundError, NotADirectoryError):
        return []
    for e in entries:
        i = part_index(e.name)
        if i is None or i < min_index:
            continue
        try:
            st = e.stat()
        except FileNotFoundError:  # removed between the listing and the stat
            continue
        out.append(Part(i, Path(e.path), int(st.st_size), int(st.st_mtime_ns)))
    out.sort(key=lambda p: p.index)
    return out


def read_part(path: str | os.PathLike[str], rank: int, columns: Sequence[str] | None = None,
              rows_before: int = 0) -> pa.Table:
    """One part's rows; :class:`TruncatedPartError` (naming the file and rank) when unreadable, a
    :class:`~holmes.limits.LimitError` beyond the caps (``rows_before``: the rank's rows in
    its earlier parts, counted against the row cap)."""
    p = Path(path)
    try:
        if p.stat().st_size == 0:
            raise TruncatedPartError(f"{p}: empty part (rank {rank})")
        return read_parquet_capped(p, columns=columns, memory_map=True,
                                   rows_before=rows_before, error=TruncatedPartError)
    except FileNotFoundError:
        raise MissingRankError(f"{p}: part of rank {rank} disappeared while reading") from None
    except (pa.ArrowInvalid, pa.ArrowException, OSError) as exc:
        raise TruncatedPartError(f"{p}: part of rank {rank} is not readable parquet, truncated or corrupt: "
                                 f"{exc}") from None


def part_iterations(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    """``(first, last)`` iteration of a part from its footer's key-value metadata, or None when the
    writer did not record them (or the part is unreadable)."""
    try:
        md = pq.read_metadata(path).metadata or {}
    except (pa.ArrowException, OSError):
        return None
    a, b = md.get(ITERATION_KEYS[0]), md.get(ITERATION_KEYS[1])
    try:
        return (int(a), int(b)) if a is not None and b is not None else None
    except ValueError:
        return None


@dataclass
class PartsRead:
    """What :func:`read_rank_parts` read: the rows, the parts used, the findings, the bytes."""

    table: pa.Table
    parts: list[Part] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    bytes_read: int = 0


def _with_state(tables: list[pa.Table]) -> list[pa.Table]:
    """Give every table a ``state`` column when one has it (a part without it holds completed ops)."""
    if not any("state" in t.column_names for t in tables):
        return tables
    return [t if "state" in t.column_names else
            t.append_column("state", pa.array(["completed"] * t.num_rows, pa.string())) for t in tables]


def _plain(t: pa.Table) -> pa.Table:
    """Dictionary-encoded string columns decoded, so parts written by different writers concatenate."""
    for i, f in enumerate(t.schema):
        if pa.types.is_dictionary(f.type):
            t = t.set_column(i, pa.field(f.name, f.type.value_type, f.nullable), t.column(i).cast(f.type.value_type))
    return t


def read_rank_parts(parts_dir: str | os.PathLike[str], rank: int, *, on_truncated: str = "raise",
                    min_index: int = 0, parts: Sequence[Part] | None = None,
                    min_iteration: int | None = None, columns: Sequence[str] | None = None) -> PartsRead:
    """Read a rank's complete parts, in index order, as one table.

    Parameters
    ----------
    parts_dir : path-like
        ``ranks/rank-XXXXX/``.
    rank : int
        Named in errors and findings.
    on_truncated : {"raise", "skip"}
        What an unreadable part does: raise :class:`TruncatedPartError`, or be left out with a
        finding in :attr:`PartsRead.findings`.
    min_index : int
        Only parts with this index or more.
    parts : sequence of Part, optional
        The parts to read (default: :func:`list_parts`).
    min_iteration : int, optional
        Keep only rows of this iteration or later.
    columns : sequence of str, optional

    Raises
    ------
    MissingRankError
        The directory holds no complete part.
    TruncatedPartError
        A part is unreadable and ``on_truncated="raise"``.
    """
    if on_truncated not in ("raise", "skip"):
        raise ConfigError(f"on_truncated must be 'raise' or 'skip', not {on_truncated!r}")
    found = list(parts) if parts is not None else list_parts(parts_dir, min_index)
    if not found:
        raise MissingRankError(f"{parts_dir}: log of rank {rank} has no complete part")
    out = PartsRead(pa.table({}))
    tables = []
    rows = 0
    for p in found:
        try:
            t = read_part(p.path, rank, columns, rows_before=rows)
        except (TruncatedPartError, MissingRankError) as exc:
            if on_truncated == "raise":
                raise
            out.findings.append(f"rank {rank}: {exc}; part skipped")
            log.warning("%s", out.findings[-1])
            continue
        if min_iteration is not None and t.num_rows and "iteration" in t.column_names:
            t = t.filter(pc.greater_equal(t.column("iteration"), min_iteration))
        tables.append(t)
        rows += t.num_rows
        out.parts.append(p)
        out.bytes_read += p.size
    if not tables:
        raise MissingRankError(f"{parts_dir}: no readable part of rank {rank} ({len(out.findings)} skipped)")
    tables = _with_state(tables)
    if any(not t.schema.equals(tables[0].schema) for t in tables[1:]):
        tables = [_plain(t) for t in tables]
    try:
        out.table = pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise ParseError(f"{parts_dir}: the parts of rank {rank} disagree on their columns: {exc}") from None
    return out


def read_rank_parts_into(parts_dir: str | os.PathLike[str], rank: int, stats: object) -> pa.Table:
    """:func:`read_rank_parts` for :class:`holmes.io.Job`: an unreadable part raises
    :class:`TruncatedPartError`; ``stats`` (a :class:`~holmes.io.ReadStats`) counts the bytes and files."""
    got = read_rank_parts(parts_dir, rank)
    stats.bytes_read += got.bytes_read  # type: ignore[attr-defined]
    stats.files_read += len(got.parts)  # type: ignore[attr-defined]
    return got.table


def write_part(parts_dir: str | os.PathLike[str], index: int, table: pa.Table, *, compression: str = "lz4",
               **parquet_options: object) -> Path:
    """Write ``table`` as part ``index`` of a rank: to a temporary name, then renamed into place.

    The first and last iteration of the rows go to the footer's key-value metadata
    (:func:`part_iterations`). Refuses to replace an existing part (:class:`ConfigError`).
    """
    d = Path(parts_dir)
    d.mkdir(parents=True, exist_ok=True)
    final = d / part_filename(index)
    if final.exists():
        raise ConfigError(f"{final}: part exists already")
    if table.num_rows and "iteration" in table.column_names:
        lo, hi = pc.min_max(table.column("iteration")).values()
        meta = dict(table.schema.metadata or {})
        meta.update({ITERATION_KEYS[0]: str(lo.as_py()).encode(), ITERATION_KEYS[1]: str(hi.as_py()).encode()})
        table = table.replace_schema_metadata(meta)
    tmp = d / f".{final.name}.partial"
    pq.write_table(table, tmp, compression=compression, **parquet_options)  # type: ignore[arg-type]
    os.replace(tmp, final)
    return final
