"""Reading converter inputs: whole files (gunzipped when compressed), JSON, rank numbers from
file names."""

from __future__ import annotations

import gzip
import json
import re
import zlib
from pathlib import Path
from typing import Any

from holmes.errors import ParseError

__all__ = ["read_bytes", "load_json_file", "rank_from_filename"]


def read_bytes(path: Path) -> bytes:
    """Read a file, transparently gunzipping ``*.gz``; errors name the file (ParseError)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ParseError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if path.suffix == ".gz" or data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise ParseError(f"{path}: not a readable gzip file, truncated or corrupt: {exc}") from None
    if not data.strip():
        raise ParseError(f"{path}: empty file")
    return data


def load_json_file(path: Path) -> Any:
    """Parse a (possibly gzipped) JSON file; ParseError names the file, line and column."""
    data = read_bytes(path)
    try:
        return json.loads(data)
    except UnicodeDecodeError as exc:
        raise ParseError(f"{path}: not UTF-8 text: {exc}") from None
    except json.JSONDecodeError as exc:
        hint = " (truncated?)" if exc.pos >= len(data.rstrip()) - 1 else ""
        raise ParseError(f"{path}: not valid JSON{hint} (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None


def rank_from_filename(path: Path) -> int | None:
    """The last integer in a file name (``_dump_12`` -> 12, ``rank3.json.gz`` -> 3), or None."""
    nums = re.findall(r"\d+", path.name.split(".")[0])
    return int(nums[-1]) if nums else None
