"""Reading converter inputs: whole files (gunzipped when compressed), JSON, rank numbers from
file names."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from holmes.errors import ParseError
from holmes.limits import decode_json, gunzip_capped, max_trace_bytes, read_capped

__all__ = ["read_bytes", "load_json_file", "rank_from_filename"]


def read_bytes(path: Path, *, limit: int | None = None) -> bytes:
    """Read a converter input whole, transparently gunzipping it, under the size caps.

    The file (and, for gzip input, its decompressed stream) may hold at most ``limit`` bytes
    (default :func:`holmes.limits.max_trace_bytes`); a device, FIFO or symlink loop is refused.
    Errors name the file (:class:`~holmes.errors.ParseError`, :class:`~holmes.limits.LimitError`).
    """
    cap = max_trace_bytes() if limit is None else limit
    path = Path(path)
    data = read_capped(path, cap, what="input file")
    if path.suffix == ".gz" or data[:2] == b"\x1f\x8b":
        data = gunzip_capped(data, cap, str(path))
    if not data.strip():
        raise ParseError(f"{path}: empty file")
    return data


def load_json_file(path: Path) -> Any:
    """Parse a (possibly gzipped) JSON file strictly; ParseError names the file, line and column."""
    return decode_json(read_bytes(path), str(path))


def rank_from_filename(path: Path) -> int | None:
    """The last integer in a file name (``_dump_12`` -> 12, ``rank3.json.gz`` -> 3), or None."""
    nums = re.findall(r"\d+", path.name.split(".")[0])
    return int(nums[-1]) if nums else None
