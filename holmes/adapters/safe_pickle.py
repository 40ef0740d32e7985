"""A restricted unpickler for Flight Recorder dumps: plain containers and scalars only.

A pickle is a small program; :func:`pickle.load` runs whatever callables it names (``os.system``,
``subprocess.Popen``, ...). Flight Recorder dumps hold nothing but dicts, lists, tuples, strings,
bytes, numbers, booleans and ``None``, which the pickle protocol encodes without naming any global.
:class:`SafeUnpickler` therefore refuses every global lookup but three inert ones (``GLOBAL``/``STACK_GLOBAL``
opcodes), every persistent id and every extension-registry code: the payload of a malicious pickle
is refused before it can be called, and the caller gets a :class:`~holmes.errors.ParseError`.

Examples
--------
>>> import pickle
>>> safe_loads(pickle.dumps({"version": "2.9", "entries": [(1, 2.5, None)]}))
{'version': '2.9', 'entries': [(1, 2.5, None)]}
>>> class Evil:
...     def __reduce__(self):
...         import os
...         return (os.system, ("echo pwned",))
>>> safe_loads(pickle.dumps(Evil()), source="dump")
Traceback (most recent call last):
...
holmes.errors.ParseError: dump: refusing to unpickle global 'posix.system' (only plain containers and scalars are allowed)
"""

from __future__ import annotations

import _codecs
import io
import os
import pickle
import pickletools
from typing import Any

from holmes.errors import ParseError

__all__ = ["SafeUnpickler", "safe_load", "safe_loads"]

# Admitted by name: ``set`` / ``frozenset`` (protocols 0-3 encode them by a global lookup) and the
# bytes decoder of protocols 2-3. Inert types and a pure function, not callables with effects.
_ALLOWED_GLOBALS = {
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("__builtin__", "set"): set,
    ("__builtin__", "frozenset"): frozenset,
    # protocol 2/3 encode ``bytes`` as ``_codecs.encode(text, 'latin1')``: a pure transformation
    ("_codecs", "encode"): _codecs.encode,
}


class SafeUnpickler(pickle.Unpickler):
    """An :class:`pickle.Unpickler` that resolves no globals but ``set``, ``frozenset``, ``_codecs.encode``.

    Parameters
    ----------
    file : binary file object
    source : str, optional
        Named in error messages (usually the file path).
    """

    def __init__(self, file: Any, *, source: str | None = None) -> None:
        super().__init__(file)
        self.source = source or "pickle"

    def find_class(self, module: str, name: str) -> Any:
        hit = _ALLOWED_GLOBALS.get((module, name))
        if hit is not None:
            return hit
        raise ParseError(f"{self.source}: refusing to unpickle global '{module}.{name}' "
                         "(only plain containers and scalars are allowed)")

    def persistent_load(self, pid: Any) -> Any:
        raise ParseError(f"{self.source}: refusing to unpickle a persistent id")


def safe_loads(data: bytes, *, source: str | None = None) -> Any:
    """Unpickle ``data`` admitting only plain containers and scalars.

    Raises
    ------
    ParseError
        The data names a global (class, function) or is truncated/corrupt; the message names
        ``source``.
    """
    src = source or "pickle"
    if not data:
        raise ParseError(f"{src}: empty file")
    # a pass over the opcodes first: every length prefix is checked against the bytes really there,
    # so a forged length (BYTEARRAY8 of 2**60) cannot make the unpickler allocate it
    try:
        for _ in pickletools.genops(data):
            pass
    except Exception as exc:  # noqa: BLE001 - pickletools raises ValueError, KeyError, EOFError...
        raise ParseError(f"{src}: not a readable pickle, truncated or corrupt: {exc.__class__.__name__}: "
                         f"{str(exc)[:200]}") from None
    try:
        return SafeUnpickler(io.BytesIO(data), source=src).load()
    except ParseError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError,
            AttributeError, OverflowError, MemoryError, UnicodeDecodeError, RecursionError) as exc:
        raise ParseError(f"{src}: not a readable pickle, truncated or corrupt: {exc.__class__.__name__}: {exc}") from None


def safe_load(path: str | os.PathLike[str]) -> Any:
    """Read and :func:`safe_loads` a pickle file; errors name the file."""
    from holmes.limits import max_trace_bytes, read_capped

    data = read_capped(path, max_trace_bytes(), what="pickle file")
    return safe_loads(data, source=str(path))
