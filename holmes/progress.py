"""Optional progress reporting for long loops, without printing from the library.

Library functions that loop over ranks, iterations or jobs take ``progress=None``: a *progress
factory*, any callable accepting tqdm's constructor arguments ``(iterable=None, *, total=None,
desc=None, unit=...)`` and returning a bar with ``update(n)``, ``set_description(text)`` and
``close()`` (iterable when given an iterable). ``tqdm.tqdm`` itself is one. The library never
decides whether to draw anything: the command line passes :func:`terminal_progress`, which draws
bars on stderr only when stderr is a terminal and ``--quiet`` was not given (stdout stays clean
for JSON consumers).

:func:`track` and :func:`counter` turn a ``progress`` argument that may be None into something a
loop can use unconditionally. :func:`on_first_compile` calls back once when numba has to compile a
kernel (a cache miss: the first run after installing or upgrading), so the command line can say
why the first run is slow.

Examples
--------
>>> list(track(range(3), None))        # no progress factory: the iterable itself
[0, 1, 2]
>>> seen = []
>>> def recorder(iterable=None, **kw):
...     seen.append(kw.get("desc"))
...     return NullBar(iterable)
>>> sum(track(range(4), recorder, desc="ranks"))
6
>>> seen
['ranks']
>>> with counter(None, total=10) as bar:
...     bar.update(3)                  # a no-op bar
>>> terminal_progress(stream=None, enabled=False) is None
True
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TextIO

__all__ = ["NullBar", "track", "counter", "terminal_progress", "on_first_compile", "compile_notice"]

log = logging.getLogger(__name__)

#: a progress factory: ``factory(iterable=None, *, total=None, desc=None, unit="it") -> bar``
ProgressFactory = Callable[..., Any]


class NullBar:
    """A bar that draws nothing (what :func:`counter` returns without a progress factory).

    Examples
    --------
    >>> b = NullBar([1, 2])
    >>> b.update(5); b.set_description("x"); b.close(); list(b)
    [1, 2]
    """

    def __init__(self, iterable: Iterable[Any] | None = None, **_: Any) -> None:
        self._iterable = iterable

    def __iter__(self) -> Iterator[Any]:
        return iter(self._iterable if self._iterable is not None else ())

    def update(self, n: int = 1) -> None:
        """Nothing to draw."""

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        """Nothing to draw."""

    def close(self) -> None:
        """Nothing to close."""

    def __enter__(self) -> "NullBar":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def track(iterable: Iterable[Any], progress: ProgressFactory | None, *, total: int | None = None,
          desc: str | None = None, unit: str = "it") -> Iterable[Any]:
    """``iterable``, drawn as a bar by ``progress`` when one is given.

    Parameters
    ----------
    iterable : iterable
    progress : progress factory or None
    total : int, optional
        Length when ``iterable`` has none.
    desc, unit : str
        What the bar says and counts.
    """
    if progress is None:
        return iterable
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    return progress(iterable, total=total, desc=desc, unit=unit)


@contextlib.contextmanager
def counter(progress: ProgressFactory | None, *, total: int | None = None, desc: str | None = None,
            unit: str = "it") -> Iterator[Any]:
    """A bar to ``update(n)`` by hand (a :class:`NullBar` without a progress factory), closed on exit."""
    bar = NullBar() if progress is None else progress(total=total, desc=desc, unit=unit)
    try:
        yield bar
    finally:
        bar.close()


def terminal_progress(stream: TextIO | None = None, *, enabled: bool = True) -> ProgressFactory | None:
    """The command line's progress factory: tqdm bars on ``stream`` (default stderr), or None when
    ``enabled`` is false, ``stream`` is not a terminal, or tqdm is not installed.

    Bars disappear when done (``leave=False``) and redraw at most twice a second.
    """
    if not enabled:
        return None
    stream = sys.stderr if stream is None else stream
    try:
        if not stream.isatty():
            return None
    except (AttributeError, ValueError):  # closed or not a real stream
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency; degrade to no bars
        return None
    return functools.partial(tqdm, file=stream, leave=False, dynamic_ncols=True, mininterval=0.5)


@contextlib.contextmanager
def on_first_compile(callback: Callable[[str], None]) -> Iterator[None]:
    """Call ``callback(function_name)`` once, when numba first compiles a kernel inside the block.

    A kernel loaded from numba's on-disk cache does not compile; only a cache miss (the first run
    after installing, upgrading or editing a kernel) does. Without numba's event API nothing is
    reported.

    Examples
    --------
    >>> names = []
    >>> with on_first_compile(names.append):
    ...     pass
    >>> names
    []
    """
    try:
        from numba.core import event
    except ImportError:  # pragma: no cover - numba is a dependency
        yield
        return
    fired = False

    class _Listener(event.Listener):
        def on_start(self, ev: Any) -> None:
            nonlocal fired
            if not fired:
                fired = True
                disp = (ev.data or {}).get("dispatcher")
                callback(getattr(getattr(disp, "py_func", None), "__qualname__", "?"))

        def on_end(self, ev: Any) -> None:
            pass

    with event.install_listener("numba:compile", _Listener()):
        yield


#: what :func:`compile_notice` says
COMPILE_NOTICE = "compiling kernels (first run only; cached for the next runs)"


@contextlib.contextmanager
def compile_notice(stream: TextIO | None = None, *, enabled: bool = True, prefix: str = "holmes") -> Iterator[None]:
    """The command line's notice that numba is compiling (a first run is ~15 s slower).

    Inside the block, the first kernel compilation writes ``"<prefix>: compiling kernels (first run
    only; ...)"`` on ``stream`` (default stderr) when ``enabled`` and ``stream`` is a terminal, and
    logs it at INFO level either way (``holmes -v`` shows it in a pipe).
    """
    stream = sys.stderr if stream is None else stream
    try:
        show = enabled and stream.isatty()
    except (AttributeError, ValueError):
        show = False

    def say(func: str) -> None:
        log.info("%s (first kernel: %s)", COMPILE_NOTICE, func)
        if show:
            try:  # clear any bar drawn on the stream, write, redraw it
                from tqdm import tqdm

                ctx: Any = tqdm.external_write_mode(file=stream)
            except ImportError:  # pragma: no cover
                ctx = contextlib.nullcontext()
            with ctx:
                stream.write(f"{prefix}: {COMPILE_NOTICE}\n")
                stream.flush()

    with on_first_compile(say):
        yield
