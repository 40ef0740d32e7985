"""The optional compute tables of a job directory (``compute/rank-NNNNN.parquet``): reading them.

A compute table holds a rank's own work where the source recorded it (WIA's forward, backward and
optimizer ops, Kineto kernels): ``rank, iteration, name, start_ns, end_ns``, validated by
:func:`holmes.io.schema.validate_compute`. Files are read whole through the capped reader
(:func:`holmes.limits.read_capped`: regular files only, at most ``HOLMES_MAX_TRACE_BYTES``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from holmes.errors import ParseError
from holmes.io import parts
from holmes.limits import max_trace_bytes, read_capped
from holmes.io.schema import validate_compute

__all__ = ["has_compute_dir", "read_compute_file"]


def has_compute_dir(d: Path) -> bool:
    """Whether ``d`` (a job's ``compute/``) holds at least one rank's table."""
    try:
        return d.is_dir() and any(parts.rank_of_entry(n) is not None for n in os.listdir(d))
    except OSError:
        return False


def read_compute_file(p: Path, rank: int) -> tuple[pa.Table, int] | None:
    """``(validated table, bytes read)`` of rank ``rank``'s compute file ``p``; None when absent.

    Raises
    ------
    ParseError
        The file is empty, over the cap (:class:`~holmes.limits.LimitError`), not a regular
        file, truncated or not parquet.
    SchemaError
        A column is missing or of the wrong type, holds nulls, a record ends before it starts, or
        a row names another rank; the message names the file and the column.
    """
    if not os.path.lexists(p):
        return None
    raw = read_capped(p, max_trace_bytes(), what="compute table")
    if not raw:
        raise ParseError(f"{p}: empty file (compute of rank {rank})")
    try:
        t = pq.read_table(pa.BufferReader(raw))
    except (pa.ArrowInvalid, pa.ArrowException, OSError) as exc:
        raise ParseError(f"{p}: not a readable parquet file, truncated or corrupt (compute of rank {rank}): "
                         f"{exc}") from None
    return validate_compute(t, str(p), rank=rank), len(raw)
