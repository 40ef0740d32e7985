"""Resource caps on untrusted input, and reads that respect them.

Every file Holmes reads whole (``job.json``, ``topology.json``, ``truth.json``, JSON traces, a
gzip stream once decompressed) goes through :func:`read_capped` / :func:`read_json_capped`, which
refuse anything that is not a regular file (a device such as ``/dev/zero``, a FIFO, a symlink
loop) and stop reading one byte past the cap, so memory stays bounded whatever the input claims.
World sizes and rank ranges are checked against :func:`max_world_size` *before* anything is
allocated for them.

The caps are documented in ``docs/limits.md``. Each can be raised for a real job that needs more
through an environment variable, read at call time:

========================== ============================= ====================================
cap                        default                       environment variable
========================== ============================= ====================================
small JSON (job.json ...)  64 MiB                        ``HOLMES_MAX_JSON_BYTES``
trace file read whole      1 GiB                         ``HOLMES_MAX_TRACE_BYTES``
decompressed gzip stream   1 GiB                         ``HOLMES_MAX_TRACE_BYTES``
world size / ranks         262,144                       ``HOLMES_MAX_WORLD_SIZE``
JSON nesting depth         64                            ``HOLMES_MAX_JSON_DEPTH``
rows of one rank's log     16,777,216                    ``HOLMES_MAX_ROWS_PER_RANK``
one string value           4,096 bytes                   ``HOLMES_MAX_STRING_BYTES``
a rank's strings, decoded  1 GiB                         ``HOLMES_MAX_RANK_BYTES``
========================== ============================= ====================================

Parquet files (rank logs, iteration tables, parts, WIA traces) are read through
:func:`holmes.io.capped_parquet.read_parquet_capped`, which checks the row cap from the footer
before reading and the string caps before decoding.

Examples
--------
>>> max_world_size() >= 1 << 18
True
>>> check_world_size(8, "job.json")
8
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import stat
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from holmes.errors import ConfigError, HolmesError, ParseError

__all__ = ["max_json_bytes", "max_trace_bytes", "max_world_size", "max_json_depth", "max_rows_per_rank",
           "max_string_bytes", "max_rank_bytes", "check_world_size",
           "read_capped", "read_json_capped", "decode_json", "gunzip_capped", "json_depth", "LimitError"]

_MiB = 1 << 20


class LimitError(ParseError):
    """An input exceeds a documented resource cap (``docs/limits.md``); the message names the cap."""


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        v = int(raw.strip())
    except ValueError:
        raise ConfigError(f"environment variable {name}={raw!r} is not an integer") from None
    if v < 1:
        raise ConfigError(f"environment variable {name}={raw!r} must be >= 1")
    return v


def max_json_bytes() -> int:
    """Cap on a small JSON file read whole (job.json, topology.json, truth.json, sidecars)."""
    return _env_int("HOLMES_MAX_JSON_BYTES", 64 * _MiB)


def max_trace_bytes() -> int:
    """Cap on a trace file read whole, and on a decompressed gzip stream."""
    return _env_int("HOLMES_MAX_TRACE_BYTES", 1024 * _MiB)


def max_world_size() -> int:
    """Cap on a world size (job.json, converter input) and on the ranks a range may name."""
    return _env_int("HOLMES_MAX_WORLD_SIZE", 1 << 18)


def max_rows_per_rank() -> int:
    """Cap on the rows of one rank's log (all its parts together) or one parquet input."""
    return _env_int("HOLMES_MAX_ROWS_PER_RANK", 1 << 24)


def max_string_bytes() -> int:
    """Cap on one string value of a parquet log (a communicator id, an operator name)."""
    return _env_int("HOLMES_MAX_STRING_BYTES", 4096)


def max_rank_bytes() -> int:
    """Cap on the decoded size of a parquet log's string columns (a short string repeated on
    millions of rows compresses to nothing and decodes to gigabytes)."""
    return _env_int("HOLMES_MAX_RANK_BYTES", 1024 * _MiB)


def max_json_depth() -> int:
    """Cap on the nesting depth of JSON input (deeper input is corrupt or hostile)."""
    return _env_int("HOLMES_MAX_JSON_DEPTH", 64)


def check_world_size(n: Any, where: str) -> int:
    """``n`` as an int if it is a world size Holmes accepts, else :class:`LimitError` naming ``where``."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise ParseError(f"{where}: world_size {n!r} is not an integer")
    cap = max_world_size()
    if n > cap:
        raise LimitError(f"{where}: world_size {n} exceeds the cap of {cap} ranks "
                         "(raise HOLMES_MAX_WORLD_SIZE for a larger job; see docs/limits.md)")
    if n < 1:
        raise ParseError(f"{where}: world_size {n} must be >= 1")
    return n


def _open_regular(path: Path, error: type[HolmesError]) -> io.BufferedReader:
    try:
        st = os.stat(path)  # follows symlinks; a loop raises ELOOP here
    except FileNotFoundError:
        raise error(f"{path}: file not found") from None
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise error(f"{path}: is a directory, expected a file")
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{path}: not a regular file (a device, FIFO or socket); refusing to read it")
    try:
        return open(path, "rb")  # noqa: SIM115 - closed by the caller
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror or exc}") from None


def read_capped(path: str | os.PathLike[str], limit: int, *, what: str = "file",
                error: type[HolmesError] = ParseError) -> bytes:
    """Read a regular file whole, refusing it when it holds more than ``limit`` bytes.

    Reads at most ``limit + 1`` bytes, so a file that grows while being read, or lies about its
    size, cannot exhaust memory.

    Raises
    ------
    error (default ParseError)
        Missing, unreadable, not a regular file.
    LimitError
        Larger than ``limit``.
    """
    p = Path(path)
    with _open_regular(p, error) as fh:
        try:
            data = fh.read(limit + 1)
        except OSError as exc:
            raise error(f"{p}: cannot read: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise LimitError(f"{p}: {what} is larger than the cap of {limit} bytes (see docs/limits.md)")
    return data


def gunzip_capped(data: bytes, limit: int, where: str) -> bytes:
    """Decompress a gzip stream (all members), refusing more than ``limit`` output bytes."""
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as gz:
            out = gz.read(limit + 1)
    except (OSError, EOFError, zlib.error) as exc:
        raise ParseError(f"{where}: not a readable gzip file, truncated or corrupt: {exc}") from None
    if len(out) > limit:
        raise LimitError(f"{where}: decompresses to more than the cap of {limit} bytes (see docs/limits.md)")
    return out


_STRING_RE = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET_RE = re.compile(r"[^\[\]{}]+")


def json_depth(text: str) -> int:
    """Nesting depth of JSON text (brackets inside strings ignored), computed without recursion.

    >>> json_depth('{"a": [1, {"b": "]]]"}]}')
    3
    """
    if text.count("[") + text.count("{") == 0:
        return 0
    brackets = _NOT_BRACKET_RE.sub("", _STRING_RE.sub("", text))
    if not brackets:
        return 0
    arr = np.frombuffer(brackets.encode("ascii"), dtype=np.uint8)
    steps = np.where((arr == 0x5B) | (arr == 0x7B), 1, -1).astype(np.int32)
    return int(np.cumsum(steps).max())


def decode_json(raw: bytes, where: str, error: type[HolmesError] = ParseError) -> Any:
    """Parse JSON bytes strictly: UTF-8, nesting <= :func:`max_json_depth`, no NaN/Infinity.

    Errors name ``where`` and, for syntax errors, the line and column.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{where}: not UTF-8 text (byte {exc.start})") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    depth = max_json_depth()
    if text.count("[") + text.count("{") > depth and json_depth(text) > depth:
        raise LimitError(f"{where}: JSON nested deeper than {depth} levels (see docs/limits.md)")

    def _const(name: str) -> Any:
        raise ValueError(f"{name} is not valid JSON")

    try:
        data = json.loads(text, parse_constant=_const)
    except json.JSONDecodeError as exc:
        hint = " (truncated?)" if exc.pos >= len(text.rstrip()) - 1 else ""
        raise error(f"{where}: not valid JSON{hint} (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except RecursionError:
        raise error(f"{where}: JSON nested too deeply") from None
    except ValueError as exc:
        raise error(f"{where}: not valid JSON: {exc}") from None
    return data


def read_json_capped(path: str | os.PathLike[str], *, limit: int | None = None,
                     error: type[HolmesError] = ParseError, what: str = "JSON file") -> Any:
    """Read and parse a small JSON file (job.json, topology.json, truth.json) under the caps."""
    p = Path(path)
    data = read_capped(p, max_json_bytes() if limit is None else limit, what=what, error=error)
    if not data.strip():
        raise error(f"{p}: empty file")
    return decode_json(data, str(p), error)
