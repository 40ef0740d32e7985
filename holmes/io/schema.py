"""CommOps schema v1: the per-rank table of communication operators.

The schema is fixed by ``docs/formats.md``; this module is the one place that knows it. Readers validate
with :func:`validate_ops` (required columns present, types castable without loss); writers build
tables with :func:`ops_table`. Extra columns are allowed and kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from holmes.errors import SchemaError

__all__ = [
    "SCHEMA_ID",
    "OPS_SCHEMA",
    "ITERATIONS_SCHEMA",
    "COMPUTE_SCHEMA",
    "OP_NAMES",
    "COLLECTIVE_OPS",
    "P2P_OPS",
    "validate_ops",
    "validate_iterations",
    "validate_compute",
    "ops_table",
    "iterations_table",
    "compute_table",
    "STATES",
]

SCHEMA_ID = "holmes.commops/1"

OPS_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("iteration", pa.int64(), nullable=False),
        pa.field("op_index", pa.int32(), nullable=False),
        pa.field("comm_id", pa.string(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("op", pa.string(), nullable=False),
        pa.field("peer", pa.int32(), nullable=True),
        pa.field("nbytes", pa.int64(), nullable=False),
        pa.field("start_ns", pa.int64(), nullable=False),
        pa.field("end_ns", pa.int64(), nullable=False),
    ]
)

ITERATIONS_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("iteration", pa.int64(), nullable=False),
        pa.field("start_ns", pa.int64(), nullable=False),
        pa.field("end_ns", pa.int64(), nullable=False),
    ]
)

#: the optional compute tables (``compute/rank-NNNNN.parquet``): the rank's own work where the source
#: records it (WIA forward/backward/optimizer ops, Kineto kernels), one row per record
COMPUTE_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("iteration", pa.int64(), nullable=False),
        pa.field("name", pa.string(), nullable=False),
        pa.field("start_ns", pa.int64(), nullable=False),
        pa.field("end_ns", pa.int64(), nullable=False),
    ]
)

COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "barrier")
P2P_OPS = ("send", "recv")
OP_NAMES = COLLECTIVE_OPS + P2P_OPS
#: the optional columns of an asynchronous operator the rank waited on: when the call that issued
#: it returned, and when the rank began to block on it (entered ``Work.wait()``); null where the
#: operator was synchronous or the source does not say
WAIT_FIELDS = (pa.field("return_ns", pa.int64(), nullable=True), pa.field("wait_ns", pa.int64(), nullable=True))
#: values of the optional ``state`` column: done; entered, not finished; issued, not entered
STATES = ("completed", "started", "scheduled")

_INT_COLUMNS = {"rank", "iteration", "op_index", "seq", "peer", "nbytes", "start_ns", "end_ns", "return_ns", "wait_ns"}
_STRING_COLUMNS = {"comm_id", "op", "name"}


def _where(source: str | None) -> str:
    return f"{source}: " if source else ""


def _cast_column(col: pa.ChunkedArray, field: pa.Field, source: str | None,
                 nullable: frozenset[str] = frozenset()) -> pa.ChunkedArray:
    name = field.name
    t = col.type
    if pa.types.is_dictionary(t):
        if name in _STRING_COLUMNS and (pa.types.is_string(t.value_type) or pa.types.is_large_string(t.value_type)):
            return col  # dictionary-encoded strings are allowed as they are
        raise SchemaError(f"{_where(source)}column '{name}' has type {t}, expected {field.type}")
    if name in _INT_COLUMNS:
        if not pa.types.is_integer(t) and not pa.types.is_null(t):
            raise SchemaError(f"{_where(source)}column '{name}' has type {t}, expected {field.type}")
    elif name in _STRING_COLUMNS:
        if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
            raise SchemaError(f"{_where(source)}column '{name}' has type {t}, expected {field.type}")
    if t == field.type:
        out = col
    else:
        try:
            out = col.cast(field.type, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise SchemaError(
                f"{_where(source)}column '{name}' of type {t} does not fit {field.type}: {exc}"
            ) from None
    if not field.nullable and name not in nullable and out.null_count:
        raise SchemaError(f"{_where(source)}column '{name}' has {out.null_count} null value(s)")
    return out


def _as_is(have: pa.Schema, schema: pa.Schema, nullable: frozenset[str]) -> bool:
    """Whether a table of schema ``have`` already is what :func:`_conform` would make of it: the
    required columns first, in order, of their exact types (strings possibly dictionary-encoded)
    and nullability."""
    if len(have) < len(schema):
        return False
    for f, g in zip(schema, have):
        if g.name != f.name or g.nullable != (f.nullable or f.name in nullable):
            return False
        t = g.type
        if t != f.type and not (f.name in _STRING_COLUMNS and pa.types.is_dictionary(t)
                                and (pa.types.is_string(t.value_type) or pa.types.is_large_string(t.value_type))):
            return False
    return True


def _conform(table: pa.Table, schema: pa.Schema, source: str | None,
             nullable: frozenset[str] = frozenset()) -> pa.Table:
    if _as_is(table.schema, schema, nullable):   # nothing to cast or reorder: only nulls to check
        for f in schema:
            if not (f.nullable or f.name in nullable):
                n = table.column(f.name).null_count
                if n:
                    raise SchemaError(f"{_where(source)}column '{f.name}' has {n} null value(s)")
        return table
    missing = [f.name for f in schema if f.name not in table.column_names]
    if missing:
        raise SchemaError(f"{_where(source)}missing required column(s) {', '.join(repr(m) for m in missing)}")
    cols, fields = [], []
    for f in schema:
        c = _cast_column(table.column(f.name), f, source, nullable)
        cols.append(c)
        fields.append(pa.field(f.name, c.type, nullable=f.nullable or f.name in nullable))
    for name in table.column_names:  # extra columns are kept, in their order
        if name not in schema.names:
            cols.append(table.column(name))
            fields.append(table.schema.field(name))
    return pa.Table.from_arrays(cols, schema=pa.schema(fields, metadata=table.schema.metadata))


def validate_ops(table: pa.Table, source: str | None = None, *, world_size: int | None = None,
                 rank: int | None = None, comm_ids: Mapping[str, Any] | None = None,
                 strict: bool = True) -> pa.Table:
    """Check a table against CommOps schema v1 and return it with canonical column types.

    Parameters
    ----------
    table : pyarrow.Table
        The rows of one rank.
    source : str, optional
        Where the table came from (a file path); it prefixes every error message.
    world_size : int, optional
        When given, ``rank`` and ``peer`` must lie in ``[0, world_size)``.
    rank : int, optional
        When given, every row's ``rank`` must equal it.
    comm_ids : mapping, optional
        When given, every ``comm_id`` must be one of its keys.
    strict : bool, default True
        Reject rows whose ``end_ns`` is before ``start_ns``. Readers pass False and leave such rows
        to the consistency pass (:mod:`holmes.io.consistency`), which excludes and reports them.

    The optional ``state`` column (logs dumped while ops were in flight) holds ``completed``,
    ``started`` or ``scheduled`` (:data:`STATES`); ``end_ns`` may then be null where the op is not
    completed, ``start_ns`` where it is only scheduled, and nowhere else.

    Returns
    -------
    pyarrow.Table
        The same rows; integer columns cast to their v1 widths, extra columns kept.

    Raises
    ------
    SchemaError
        A required column is missing, has the wrong type, holds nulls or out-of-range values.

    Examples
    --------
    >>> import pyarrow as pa
    >>> t = ops_table(rank=[0], iteration=[0], op_index=[0], comm_id=["tp-0"], seq=[0],
    ...               op=["all_reduce"], peer=[None], nbytes=[4], start_ns=[10], end_ns=[20])
    >>> validate_ops(t).num_rows
    1
    >>> validate_ops(t.drop_columns(["end_ns"]), "rank-00000.parquet")
    Traceback (most recent call last):
    ...
    holmes.errors.SchemaError: rank-00000.parquet: missing required column(s) 'end_ns'
    >>> hung = ops_table(rank=[0, 0], iteration=[0, 0], op_index=[0, 1], comm_id=["tp-0"] * 2, seq=[0, 1],
    ...                  op=["all_reduce"] * 2, peer=[None, None], nbytes=[4, 4], start_ns=[10, 30],
    ...                  end_ns=[20, None], state=["completed", "started"])
    >>> validate_ops(hung).column("end_ns").null_count
    1
    >>> validate_ops(hung.set_column(10, "state", pa.array(["completed", "done"])), "rank 0")
    Traceback (most recent call last):
    ...
    holmes.errors.SchemaError: rank 0: column 'state' holds ['done']; expected one of ['completed', 'started', 'scheduled']
    """
    has_state = "state" in table.column_names
    out = _conform(table, OPS_SCHEMA, source, frozenset({"start_ns", "end_ns"}) if has_state else frozenset())
    w = _where(source)
    if has_state:
        _check_states(out, w)
    for f in WAIT_FIELDS:   # optional: integers (nulls allowed), as int64
        if f.name in out.column_names:
            i = out.column_names.index(f.name)
            out = out.set_column(i, f, _cast_column(out.column(i), f, source))
    if out.num_rows == 0:
        return out
    ranks = out.column("rank")
    if rank is not None:
        bad = pc.sum(pc.not_equal(ranks, pa.scalar(rank, pa.int32()))).as_py()
        if bad:
            raise SchemaError(f"{w}column 'rank' holds {bad} row(s) of another rank than {rank}")
    if world_size is not None:
        for name in ("rank", "peer"):
            mm = pc.min_max(out.column(name))
            lo, hi = mm["min"].as_py(), mm["max"].as_py()
            if lo is not None and (lo < 0 or hi >= world_size):
                bad_v = lo if lo < 0 else hi
                raise SchemaError(f"{w}column '{name}' holds rank {bad_v} outside world_size {world_size}")
    ends = out.column("end_ns")
    starts = out.column("start_ns")
    neg = pc.sum(pc.less(ends, starts)).as_py() if strict else 0
    if neg:
        raise SchemaError(f"{w}column 'end_ns' is before 'start_ns' in {neg} row(s)")
    ops = pc.unique(out.column("op")).to_pylist()
    unknown = sorted(set(o for o in ops if o is not None) - set(OP_NAMES))
    if unknown:
        raise SchemaError(f"{w}column 'op' holds unknown operator(s) {_short(unknown)}; expected one of {list(OP_NAMES)}")
    if comm_ids is not None:
        ids = pc.unique(out.column("comm_id")).to_pylist()
        missing = sorted(i for i in set(ids) if i not in comm_ids)   # comm_ids: a mapping or set, O(1) lookups
        if missing:
            raise SchemaError(f"{w}column 'comm_id' holds {_short(missing)} absent from job.json communicators")
    return out


def _short(values: list, k: int = 5, width: int = 40) -> str:
    """The first ``k`` values for a message, each cut to ``width`` characters (a 100k-character
    id must not make a 100k-character error line).

    >>> _short(["a" * 50, "b"], width=8)
    "['aaaaa...', 'b']"
    """
    shown = [v if not isinstance(v, str) or len(v) <= width else v[: width - 3] + "..." for v in values[:k]]
    return str(shown) + (f" and {len(values) - k} more" if len(values) > k else "")


def _check_states(out: pa.Table, w: str) -> None:
    """The ``state`` column: known values, and nulls in start/end only where the state allows them."""
    st = out.column("state")
    t = st.type
    if pa.types.is_dictionary(t):
        t = t.value_type
    if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_null(t)):
        raise SchemaError(f"{w}column 'state' has type {st.type}, expected string")
    if out.num_rows == 0:
        return
    if st.null_count:
        raise SchemaError(f"{w}column 'state' has {st.null_count} null value(s)")
    bad = sorted(set(pc.unique(st.cast(pa.string())).to_pylist()) - set(STATES))
    if bad:
        raise SchemaError(f"{w}column 'state' holds {_short(bad)}; expected one of {list(STATES)}")
    s = st.cast(pa.string())
    for name, allowed in (("end_ns", pc.not_equal(s, "completed")), ("start_ns", pc.equal(s, "scheduled"))):
        col = out.column(name)
        if col.null_count:
            wrong = pc.sum(pc.and_(col.is_null(), pc.invert(allowed))).as_py()
            if wrong:
                what = "not completed" if name == "end_ns" else "scheduled"
                raise SchemaError(f"{w}column '{name}' has {wrong} null value(s) on rows whose state is not {what}")


def validate_iterations(table: pa.Table, source: str | None = None) -> pa.Table:
    """Check an iterations table (rank, iteration, start_ns, end_ns) and cast it to int64 columns."""
    return _conform(table, ITERATIONS_SCHEMA, source)


def validate_compute(table: pa.Table, source: str | None = None, *, rank: int | None = None) -> pa.Table:
    """Check a compute table (``compute/rank-NNNNN.parquet``) and return it with canonical types.

    Columns ``rank`` (int32), ``iteration`` (int64), ``name`` (string, dictionary allowed),
    ``start_ns``, ``end_ns`` (int64), none null, every record ending at or after its start; extra
    columns are kept. Rows are returned sorted by ``(iteration, start_ns)``.

    Parameters
    ----------
    table : pyarrow.Table
    source : str, optional
        The file it came from; it prefixes every error message.
    rank : int, optional
        When given, every row's ``rank`` must equal it.

    Raises
    ------
    SchemaError
        A required column is missing, of a wrong type or holds nulls, a record ends before it
        starts, or a row is of another rank.

    Examples
    --------
    >>> t = compute_table(rank=[0, 0], iteration=[1, 1], name=["backward", "forward"], start_ns=[50, 10],
    ...                   end_ns=[90, 40])
    >>> validate_compute(t, rank=0).column("name").to_pylist()
    ['forward', 'backward']
    >>> validate_compute(t.set_column(2, "name", pa.array([1, 2])), "compute/rank-00000.parquet")
    Traceback (most recent call last):
    ...
    holmes.errors.SchemaError: compute/rank-00000.parquet: column 'name' has type int64, expected string
    """
    out = _conform(table, COMPUTE_SCHEMA, source)
    w = _where(source)
    if out.num_rows == 0:
        return out
    if rank is not None:
        bad = pc.sum(pc.not_equal(out.column("rank"), pa.scalar(rank, pa.int32()))).as_py()
        if bad:
            raise SchemaError(f"{w}column 'rank' holds {bad} row(s) of another rank than {rank}")
    neg = pc.sum(pc.less(out.column("end_ns"), out.column("start_ns"))).as_py()
    if neg:
        raise SchemaError(f"{w}column 'end_ns' is before 'start_ns' in {neg} row(s)")
    it = out.column("iteration").to_numpy()
    st = out.column("start_ns").to_numpy()
    if len(it) > 1 and not ((np.diff(it) > 0) | ((np.diff(it) == 0) & (np.diff(st) >= 0))).all():
        out = out.take(np.lexsort((st, it)))
    return out


def compute_table(**columns: Any) -> pa.Table:
    """Build a compute table from column sequences (required columns first, extras after).

    Examples
    --------
    >>> compute_table(rank=[3], iteration=[0], name=["forward-compute"], start_ns=[0], end_ns=[7]).schema.names
    ['rank', 'iteration', 'name', 'start_ns', 'end_ns']
    """
    return _table(COMPUTE_SCHEMA, columns)


def ops_table(**columns: Any) -> pa.Table:
    """Build a schema-v1 table from column sequences (required columns first, extras after).

    Examples
    --------
    >>> t = ops_table(rank=[1, 1], iteration=[0, 0], op_index=[0, 1], comm_id=["pp-0", "pp-0"],
    ...               seq=[0, 0], op=["send", "recv"], peer=[0, 0], nbytes=[8, 8],
    ...               start_ns=[0, 5], end_ns=[4, 9])
    >>> t.schema.field("peer").type
    DataType(int32)
    """
    return _table(OPS_SCHEMA, columns)


def _table(schema: pa.Schema, columns: dict[str, Any]) -> pa.Table:
    """``schema``'s columns from ``columns`` (cast to their types), then the extra columns as given."""
    arrays, fields = [], []
    for f in schema:
        if f.name not in columns:
            raise SchemaError(f"missing required column '{f.name}'")
        v = columns[f.name]
        arrays.append(pa.array(v, type=f.type) if not isinstance(v, (pa.Array, pa.ChunkedArray)) else v.cast(f.type))
        fields.append(f)
    for name, v in columns.items():
        if name in schema.names:
            continue
        a = v if isinstance(v, (pa.Array, pa.ChunkedArray)) else pa.array(np.asarray(v) if not isinstance(v, list) else v)
        arrays.append(a)
        fields.append(pa.field(name, a.type))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def iterations_table(rank: Any, iteration: Any, start_ns: Any, end_ns: Any) -> pa.Table:
    """Build an iterations table with the v1 column types."""
    return pa.Table.from_arrays(
        [pa.array(np.asarray(x), type=f.type) for x, f in zip((rank, iteration, start_ns, end_ns), ITERATIONS_SCHEMA)],
        schema=ITERATIONS_SCHEMA,
    )
