"""Reading a parquet file under the caps of :mod:`holmes.limits`.

Parquet compresses a constant column to almost nothing: 60 million identical rows fit in 2.4 MB
and a 100,000-character communicator id repeated on every row costs one dictionary entry, yet
both decode to gigabytes. :func:`read_parquet_capped` refuses such a file before decoding it:

* only a regular file is opened (a FIFO would block, ``/dev/zero`` never ends);
* the row count in the footer is checked against :func:`~holmes.limits.max_rows_per_rank`
  (``rows_before``: rows already read for the same rank, e.g. its earlier parts);
* where the footer cannot show the string columns to be within the caps (a chunk large enough,
  uncompressed, to hold a value over :func:`~holmes.limits.max_string_bytes`, or rows x chunk
  sizes over :func:`~holmes.limits.max_rank_bytes`), they are read as dictionaries, their
  longest value and decoded size checked, and only then decoded. Small files (every job of a
  few thousand operators per rank) take the plain read.

The table returned is the one :meth:`pyarrow.parquet.ParquetFile.read` gives (plain strings).

Examples
--------
>>> import tempfile, pyarrow as pa, pyarrow.parquet as pq, os
>>> p = os.path.join(tempfile.mkdtemp(), "r.parquet")
>>> pq.write_table(pa.table({"comm_id": ["x" * 5000] * 3, "n": [1, 2, 3]}), p)
>>> read_parquet_capped(p).num_rows  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
holmes.limits.LimitError: .../r.parquet: column 'comm_id' holds a string of 5000 bytes, over the cap of 4096 ...
"""

from __future__ import annotations

import contextlib
import inspect
import os
import stat
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyarrow._parquet import ParquetReader as _ParquetReader
from pyarrow._parquet import ParquetSchema as _ParquetSchema

from holmes.errors import HolmesError, ParseError
from holmes.limits import LimitError, max_rank_bytes, max_rows_per_rank, max_string_bytes

__all__ = ["read_parquet_capped", "CappedReader", "parquet_rows"]


def _at(p: str, where: str | None) -> str:
    return f"{where}: {p}" if where else str(p)


def _not_regular(p: str, where: str | None, mode: int, error: type[HolmesError]) -> HolmesError | None:
    """The error for a file of ``mode`` (:func:`os.stat`) that is not a regular file, else None."""
    if stat.S_ISDIR(mode):
        return error(f"{_at(p, where)}: is a directory, expected a parquet file")
    if not stat.S_ISREG(mode):
        return error(f"{_at(p, where)}: not a regular file (a device, FIFO or socket); refusing to read it")
    return None


def _regular(p: str, where: str | None, error: type[HolmesError]) -> int:
    """The size of ``p`` when it is a regular file, else ``error``."""
    st = os.stat(p)  # FileNotFoundError / OSError: the caller's to name
    bad = _not_regular(p, where, st.st_mode, error)
    if bad is not None:
        raise bad
    return int(st.st_size)


#: files up to this size are read into memory in one call and parsed from there (a rank log of a
#: few hundred rows: 20 % cheaper than pyarrow's file reads); larger ones are read from the file
_SMALL_FILE = 1 << 20

#: Arrow type ids of the string and binary types (a dictionary's by its value type)
_STRING_IDS = frozenset(t.id for t in (pa.string(), pa.large_string(), pa.binary(), pa.large_binary()))
_DICT_ID = pa.dictionary(pa.int32(), pa.string()).id


def _is_string(t: pa.DataType) -> bool:
    if t.id == _DICT_ID:
        t = t.value_type
    return t.id in _STRING_IDS


def parquet_rows(path: str | os.PathLike[str], *, where: str | None = None,
                 error: type[HolmesError] = ParseError) -> int:
    """The row count in a parquet file's footer (the file is not read)."""
    p = os.fspath(path)
    _regular(p, where, error)
    return int(pq.read_metadata(p).num_rows)


def read_parquet_capped(path: str | os.PathLike[str], *, where: str | None = None,
                        columns: Sequence[str] | None = None, memory_map: bool = False, rows_before: int = 0,
                        error: type[HolmesError] = ParseError, stat_result: os.stat_result | None = None) -> pa.Table:
    """Read a parquet file (``columns`` of it, those it has, when given) under the caps.

    Parameters
    ----------
    path : path-like
    where : str, optional
        What the file is (``"WIA trace"``), put before the file's path in error messages; leave it
        out where the caller's own message says it.
    columns : sequence of str, optional
    memory_map : bool, default False
    rows_before : int, default 0
        Rows already read for the same rank; the row cap applies to the sum.
    error : HolmesError subclass, default ParseError
        Raised for a file that is not a regular file.
    stat_result : os.stat_result, optional
        The file's :func:`os.stat`, when the caller has it already (one system call less per file
        where thousands are read).

    Raises
    ------
    LimitError
        Too many rows, a string too long, or string columns that decode to too many bytes.
    error
        Not a regular file.
    FileNotFoundError, OSError, pyarrow.ArrowException
        Left to the caller (each names missing, truncated and corrupt files its own way).

    See Also
    --------
    CappedReader : the same for many files (the caps read once, a schema's work done once).
    """
    return CappedReader(where=where, error=error).read(path, columns=columns, memory_map=memory_map,
                                                       rows_before=rows_before, stat_result=stat_result)


#: keywords :class:`pyarrow.parquet.ParquetFile` passes its reader that differ from the reader's own
#: defaults (``arrow_extensions_enabled``: True there since pyarrow 18, False on the bare reader)
_OPEN_KW = {"arrow_extensions_enabled": True} \
    if "arrow_extensions_enabled" in inspect.signature(pq.ParquetFile.__init__).parameters else {}


class CappedReader:
    """:func:`read_parquet_capped` for many files, one after the other (one reader per thread).

    The caps (:mod:`holmes.limits`) are read once, when the reader is made, and the work that
    depends only on a file's schema (which columns hold strings, their leaf indices, the indices
    of ``columns``) is done once per distinct footer schema: the rank logs of a job share one
    schema, so a file costs its footer, the checks of its row counts and chunk sizes, and the
    decode. Each file is still checked whole: a hostile file among thousands of good ones gets the
    same typed error, naming it, as when it is read alone.

    Parameters
    ----------
    where : str, optional
        As in :func:`read_parquet_capped`.
    error : HolmesError subclass, default ParseError
        Raised for a file that is not a regular file.

    Examples
    --------
    >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq, os
    >>> d = tempfile.mkdtemp()
    >>> for i in range(3):
    ...     pq.write_table(pa.table({"comm_id": ["dp-0"] * (i + 1), "n": list(range(i + 1))}), f"{d}/{i}.parquet")
    >>> reader = CappedReader()
    >>> [reader.read(f"{d}/{i}.parquet", columns=["n"]).num_rows for i in range(3)]
    [1, 2, 3]
    """

    def __init__(self, *, where: str | None = None, error: type[HolmesError] = ParseError) -> None:
        self.where = where
        self.error = error
        self.row_cap = max_rows_per_rank()
        self.string_cap = max_string_bytes()
        self.bytes_cap = max_rank_bytes()
        self._schema: Any = None    # the last footer schema (pyarrow.parquet.ParquetSchema) planned for
        self._columns: Any = None   # and (the columns asked for, the Arrow schema stored) then
        self._plan: Any = None

    def read(self, path: str | os.PathLike[str], *, columns: Sequence[str] | None = None, memory_map: bool = False,
             rows_before: int = 0, stat_result: os.stat_result | None = None) -> pa.Table:
        """One file, as :func:`read_parquet_capped` reads it (same parameters, same errors)."""
        p = os.fspath(path)   # a str: messages and opening need no Path
        where, error = self.where, self.error
        if stat_result is None:
            size = _regular(p, where, error)
        else:
            bad = _not_regular(p, where, stat_result.st_mode, error)
            if bad is not None:
                raise bad
            size = int(stat_result.st_size)
        # a memory map is left to the tables' buffers to release (they may point into it); a native file
        # otherwise (pyarrow's own reads, no Python file object in the loop), or the bytes of a small one
        if memory_map:
            src: Any = contextlib.nullcontext(pa.memory_map(str(p), "r"))
        elif size <= _SMALL_FILE:
            with open(p, "rb") as fh:
                src = contextlib.nullcontext(pa.BufferReader(fh.read()))
        else:
            src = pa.OSFile(str(p), "r")
        with src as fh:
            reader = _ParquetReader()
            reader.open(fh, **_OPEN_KW)
            md = reader.metadata
            rows = md.num_rows
            if rows + rows_before > self.row_cap:
                raise LimitError(f"{_at(p, where)}: {rows + rows_before} rows exceed the cap of {self.row_cap} rows "
                                 "per rank (raise HOLMES_MAX_ROWS_PER_RANK; see docs/limits.md)")
            want, strings, nested = self._plan_for(reader, md, columns)
            risky = _may_exceed(md, strings, nested, self.string_cap, self.bytes_cap)
            if not risky:
                return reader.read_all(column_indices=want, use_threads=False)
            pfd = pq.ParquetFile(fh, metadata=md, read_dictionary=risky)
            t = pfd.read(columns=None if columns is None else [n for n in pfd.schema_arrow.names if n in set(columns)],
                         use_threads=False)
            schema = reader.schema_arrow   # the types as stored (a dictionary only where written one)
        return _decode_checked(t, risky, schema, where, p, self.string_cap, self.bytes_cap)

    def _plan_for(self, reader: Any, md: pq.FileMetaData,
                  columns: Sequence[str] | None) -> tuple[list[int] | None, list[tuple[str, int]], list[str]]:
        """``(leaf indices to read, (name, leaf index) of each flat string column read, nested string
        columns read)`` for the footer ``md`` (the last one's when its schema is the same)."""
        # not ``md.schema``: the footer caches it and it points back, a reference cycle per file that
        # only the garbage collector frees (at 32,768 files, ~1 s of collections)
        pschema = _ParquetSchema(md)
        kv = md.metadata   # the Arrow types written beside the parquet ones, where a writer kept them
        key = (None if columns is None else tuple(columns), kv.get(b"ARROW:schema") if kv else None)
        if self._plan is not None and key == self._columns and pschema.equals(self._schema):
            return self._plan
        schema = reader.schema_arrow
        paths = reader.column_paths   # each leaf's path, in leaf order
        leaves: dict[str, list[int]] = {}
        for i, path in enumerate(paths):
            leaves.setdefault(path[0], []).append(i)
        asked = None if columns is None else set(columns)
        names = [n for n in schema.names if asked is None or n in asked]
        want = None if asked is None else [i for n in names for i in leaves.get(n, ())]
        strings, nested = [], []
        for n in names:
            if not _is_string(schema.field(n).type):
                continue
            idx = leaves.get(n, [])
            if len(idx) == 1 and len(paths[idx[0]]) == 1:
                strings.append((n, idx[0]))
            else:   # a nested column: checked exactly
                nested.append(n)
        self._schema, self._columns, self._plan = pschema, key, (want, strings, nested)
        return self._plan


def _may_exceed(md: pq.FileMetaData, strings: list[tuple[str, int]], nested: list[str], scap: int,
               bcap: int) -> list[str]:
    """The string columns the footer cannot show to be within the caps: no value is longer than
    its chunk's uncompressed size, so a column whose chunks are all under ``scap`` holds no longer
    string, and decodes to at most rows x chunk size -- if that stays under ``bcap`` for all
    the columns together, nothing needs checking value by value. ``strings``: (name, leaf index)
    of the flat string columns; ``nested``: the nested ones (always checked exactly)."""
    if not strings:
        return list(nested)
    bound, over = 0, set()
    for g in range(md.num_row_groups):
        rg = md.row_group(g)
        rows = rg.num_rows
        for n, i in strings:
            u = rg.column(i).total_uncompressed_size
            bound += rows * u
            if u > scap:
                over.add(n)
    if bound > bcap:
        return [n for n, _ in strings] + list(nested)
    if not over:
        return list(nested)
    return [n for n, _ in strings if n in over] + list(nested)


def _decode_checked(t: pa.Table, names: list[str], schema: pa.Schema, where: str | None, p: str,
                    scap: int, bcap: int) -> pa.Table:
    total = 0
    for n in names:
        col = t.column(n)
        if not pa.types.is_dictionary(col.type):
            continue
        plain = []
        for ch in col.chunks:
            lengths = pc.binary_length(ch.dictionary)
            longest = pc.max(lengths).as_py() or 0
            if longest > scap:
                raise LimitError(f"{_at(p, where)}: column '{n}' holds a string of {longest} bytes, over the cap of "
                                 f"{scap} (raise HOLMES_MAX_STRING_BYTES; see docs/limits.md)")
            idx = ch.indices
            total += int(pc.sum(pc.take(lengths, idx.filter(pc.is_valid(idx)))).as_py() or 0)
            if total > bcap:
                raise LimitError(f"{_at(p, where)}: string columns decode to more than the cap of {bcap} bytes "
                                 "(raise HOLMES_MAX_RANK_BYTES; see docs/limits.md)")
            plain.append(ch.dictionary_decode())
        target = schema.field(n).type
        if pa.types.is_dictionary(target):  # stored as a dictionary: kept one
            continue
        arr = pa.chunked_array([c.cast(target) for c in plain], type=target) if plain else pa.chunked_array([], target)
        t = t.set_column(t.schema.get_field_index(n), schema.field(n), arr)
    return t
