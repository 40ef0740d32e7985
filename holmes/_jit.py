"""numba's ``njit`` with an on-disk cache where one can be written, and none where it cannot.

``numba.njit(cache=True)`` raises at decoration time -- that is, when a Holmes module is imported
-- when no cache location is writable: a read-only install (the ``__pycache__`` beside the
sources) and no writable home directory (``~/.cache``), as in containers and for service
accounts. :func:`njit` compiles such a function without a cache instead (slower first call in
every process, nothing written), so importing Holmes never fails for want of a writable place.

Examples
--------
>>> @njit(cache=True, nogil=True)
... def twice(x):
...     return 2 * x
>>> twice(21)
42
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numba

__all__ = ["njit"]

log = logging.getLogger(__name__)


def njit(*args: Any, cache: bool = False, **options: Any) -> Callable[[Callable[..., Any]], Any]:
    """``numba.njit(*args, cache=cache, **options)`` as a decorator; ``cache=True`` falls back to
    no cache when numba finds no writable cache location for the function's file."""

    def decorate(fn: Callable[..., Any]) -> Any:
        if cache:
            try:
                return numba.njit(*args, cache=True, **options)(fn)
            except RuntimeError as exc:  # numba: "cannot cache function ...: no locator available"
                if "no locator available" not in str(exc):
                    raise
                log.debug("%s: no writable numba cache location; compiled without a cache", fn.__qualname__)
        return numba.njit(*args, **options)(fn)

    return decorate
