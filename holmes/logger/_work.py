"""Private pieces of the PyTorch logger that do not depend on the logger itself: argument access
and message sizes of wrapped calls, the completion of asynchronous works (a thin proxy that
finishes the pending ops on ``wait()``/``is_completed()``, or a future callback), and the CUDA
event clock. PyTorch is never imported here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from holmes.logger.recorder import PendingOp

__all__ = ["arg", "nbytes_of", "nbytes_of_list", "is_cuda", "TimedWork", "CudaClock", "finish_on_completion"]


def nbytes_of(t: Any) -> int:
    try:
        return int(t.numel()) * int(t.element_size())
    except AttributeError:
        return 0


def nbytes_of_list(ts: Any) -> int:
    try:
        return sum(int(t.numel()) * int(t.element_size()) for t in ts)
    except (AttributeError, TypeError):
        return 0


def arg(args: tuple, kwargs: dict, pos: int, name: str, default: Any = None) -> Any:
    if len(args) > pos:
        return args[pos]
    return kwargs.get(name, default)


class TimedWork:
    """Proxy of a ``torch.distributed.Work`` that finishes its operators when completion is seen."""

    __slots__ = ("_work", "_handles", "_end_event")

    def __init__(self, work: Any, handles: list[PendingOp], end_event: Callable[[], Any] | None = None) -> None:
        self._work = work
        self._handles = handles
        self._end_event = end_event

    def _done(self) -> None:
        if self._end_event is not None:
            self._end_event()
            self._end_event = None
            return
        now = time.time_ns()
        for h in self._handles:
            h.finish(now)

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        r = self._work.wait(*args, **kwargs)
        self._done()
        return r

    def is_completed(self) -> bool:
        r = self._work.is_completed()
        if r:
            self._done()
        return r

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)

    def __repr__(self) -> str:
        return f"<timed {self._work!r}>"


class CudaClock:
    """Maps CUDA event times to wall-clock ns through one anchor event per logger."""

    def __init__(self) -> None:
        self.anchor: Any = None
        self.anchor_ns = 0

    def event(self) -> Any:
        import torch

        if self.anchor is None:
            a = torch.cuda.Event(enable_timing=True)
            a.record()
            a.synchronize()
            self.anchor_ns = time.time_ns()
            self.anchor = a
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def to_ns(self, ev: Any) -> int:
        return self.anchor_ns + int(self.anchor.elapsed_time(ev) * 1e6)

    def resolver(self, ev0: Any, box: list) -> Callable[[bool], tuple[int, int] | None]:
        def resolve(final: bool) -> tuple[int, int] | None:
            ev1 = box[0] if box else None
            if ev1 is None:
                return None
            if final:
                ev1.synchronize()
            elif not ev1.query():
                return None
            return self.to_ns(ev0), self.to_ns(ev1)

        return resolve


def finish_on_completion(work: Any, handles: list[PendingOp], cuda_end: Callable[[], Any] | None) -> Any:
    """Arrange for ``handles`` to finish when ``work`` completes; returns what the caller gets back."""
    if work is None:
        for h in handles:
            h.finish()
        return work
    if cuda_end is None:
        try:
            fut = work.get_future()
        except (RuntimeError, AttributeError):
            fut = None
        if fut is not None:
            def _cb(_f: Any, hs: list[PendingOp] = handles) -> None:
                now = time.time_ns()
                for h in hs:
                    h.finish(now)

            fut.then(_cb)
            return work
        for h in handles:
            h.poll = work.is_completed
    return TimedWork(work, handles, cuda_end)


def is_cuda(t: Any) -> bool:
    if isinstance(t, (list, tuple)):
        t = t[0] if t else None
    return bool(getattr(t, "is_cuda", False))
