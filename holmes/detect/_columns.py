"""Column access shared by the per-rank features and the cross-rank context: numpy views of
non-null columns and integer codes of string columns (plain or dictionary-encoded)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from holmes.errors import SchemaError

__all__ = ["column", "codes", "codes_values"]


def column(table: pa.Table, name: str) -> np.ndarray:
    """A non-null column as numpy; :class:`SchemaError` naming it when it holds nulls."""
    col = table.column(name)
    if col.null_count:
        raise SchemaError(f"column '{name}' has {col.null_count} null value(s)")
    return col.to_numpy()


def codes(col: pa.ChunkedArray) -> np.ndarray:
    """Integer codes of a string column (dictionary or plain), first-appearance independent."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_dictionary(arr.type):
        arr = arr.cast(arr.type.value_type)
    enc = pc.dictionary_encode(arr)
    return np.asarray(enc.indices.to_numpy(zero_copy_only=False), dtype=np.int64)


def codes_values(col: pa.ChunkedArray) -> tuple[np.ndarray, list]:
    """``(codes, values)``: equal strings get equal codes, ``values[code]`` is the string.

    The numbering may differ from :func:`codes` (only equality matters to the features). A
    dictionary column is read through its (small) dictionary instead of decoding every row.
    """
    if isinstance(col, pa.ChunkedArray) and pa.types.is_dictionary(col.type) and col.null_count == 0 \
            and col.num_chunks > 0:
        col = col.unify_dictionaries()
        dic = col.chunk(0).dictionary
        if dic.null_count == 0:
            enc = pc.dictionary_encode(dic)  # the dictionary may repeat a value or hold unused ones
            remap = np.asarray(enc.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
            idx = [np.asarray(c.indices.to_numpy(zero_copy_only=False)) for c in col.chunks]
            idx = idx[0] if len(idx) == 1 else np.concatenate(idx)
            return remap[idx], enc.dictionary.to_pylist()
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_dictionary(arr.type):
        arr = arr.cast(arr.type.value_type)
    enc = pc.dictionary_encode(arr)
    return np.asarray(enc.indices.to_numpy(zero_copy_only=False), dtype=np.int64), enc.dictionary.to_pylist()
