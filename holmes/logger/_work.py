"""Private pieces of the PyTorch logger that do not depend on the logger itself: argument access
and message sizes of wrapped calls, the completion of asynchronous works (a thin proxy that
finishes the pending ops on ``wait()``/``is_completed()``, or a future callback), and the CUDA
event clock. PyTorch is never imported here.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from holmes.logger.recorder import PendingOp

__all__ = ["arg", "nbytes_of", "nbytes_of_list", "is_cuda", "TimedWork", "CudaClock", "finish_on_completion",
           "async_issued", "global_peer", "default_group", "WRAPPED_FUNCTIONS"]

# name -> (CommOps op, position/name of the group, position/name of async_op,
#          position/name of the sized tensor (argument), "one"|"list" sizing, position of the tensor
#          that tells the device)
_COLL_SPECS: dict[str, tuple[str, tuple[int, str], tuple[int, str] | None, tuple[int, str] | None, str]] = {
    "all_reduce": ("all_reduce", (2, "group"), (3, "async_op"), (0, "tensor"), "one"),
    "all_gather": ("all_gather", (2, "group"), (3, "async_op"), (0, "tensor_list"), "list"),
    "all_gather_into_tensor": ("all_gather", (2, "group"), (3, "async_op"), (0, "output_tensor"), "one"),
    "all_gather_single": ("all_gather", (2, "group"), (3, "async_op"), (0, "output_tensor"), "one"),
    "reduce_scatter": ("reduce_scatter", (3, "group"), (4, "async_op"), (1, "input_list"), "list"),
    "reduce_scatter_tensor": ("reduce_scatter", (3, "group"), (4, "async_op"), (1, "input"), "one"),
    "reduce_scatter_single": ("reduce_scatter", (3, "group"), (4, "async_op"), (1, "input"), "one"),
    "all_to_all": ("all_to_all", (2, "group"), (3, "async_op"), (1, "input_tensor_list"), "list"),
    "all_to_all_single": ("all_to_all", (4, "group"), (5, "async_op"), (1, "input"), "one"),
    "broadcast": ("broadcast", (2, "group"), (3, "async_op"), (0, "tensor"), "one"),
    "reduce": ("reduce", (3, "group"), (4, "async_op"), (0, "tensor"), "one"),
    "barrier": ("barrier", (0, "group"), (1, "async_op"), None, "none"),
}
# name -> (CommOps op, async?, name of the peer argument, name of the group-rank peer argument)
_P2P_SPECS = {
    "send": ("send", False, "dst", "group_dst"),
    "recv": ("recv", False, "src", "group_src"),
    "isend": ("send", True, "dst", "group_dst"),
    "irecv": ("recv", True, "src", "group_src"),
}
#: The ``torch.distributed`` functions the logger wraps (those the installed torch has).
WRAPPED_FUNCTIONS = tuple(_COLL_SPECS) + tuple(_P2P_SPECS) + ("batch_isend_irecv",)


def _default_rank_world() -> tuple[int | None, int | None]:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:  # pragma: no cover - torch missing
        pass
    r, w = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    return (int(r) if r is not None else None), (int(w) if w is not None else None)


def default_group() -> Any:
    from torch.distributed import distributed_c10d as c10d

    return c10d._get_default_group()


def global_peer(group: Any, peer: Any, group_peer: Any) -> int | None:
    if group_peer is not None and group is not None:
        import torch.distributed as dist

        return int(dist.get_global_rank(group, int(group_peer)))
    if peer is not None:
        return int(peer)
    if group_peer is not None:
        return int(group_peer)
    return None


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

    __slots__ = ("_work", "_handles", "_end_event", "_cpu")

    def __init__(self, work: Any, handles: list[PendingOp], end_event: Callable[[], Any] | None = None) -> None:
        self._work = work
        self._handles = handles
        self._end_event = end_event
        self._cpu = end_event is None  # CUDA: the stream waits in wait(), not the rank

    def _done(self) -> None:
        if self._end_event is not None:
            self._end_event()
            self._end_event = None
            return
        now = time.time_ns()
        for h in self._handles:
            h.finish(now)

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        if self._cpu:  # the rank blocks from here
            now = time.time_ns()
            for h in self._handles:
                if h.wait_ns is None:
                    h.wait_ns = now
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

            fut.add_done_callback(_cb)
            return work
        for h in handles:
            h.poll = work.is_completed
    return TimedWork(work, handles, cuda_end)


def is_cuda(t: Any) -> bool:
    if isinstance(t, (list, tuple)):
        t = t[0] if t else None
    return bool(getattr(t, "is_cuda", False))


def _keep_thread_state() -> None:
    """Keep the calling thread's Python thread state for good (one ``PyGILState_Ensure`` never
    released).

    A completion callback runs on a backend's own C++ thread (gloo's work loop), which has no
    Python thread state: PyTorch creates one to take the GIL and destroys it when the callback
    returns, per operator (about a third of a callback's CPU time, measured 44 -> 29 us on the
    loaded 2-core box, on the core the rank's training thread is pinned to). Kept, later callbacks
    on that thread reuse it; the price is one idle thread state per backend thread (freed at
    interpreter exit).
    """
    try:
        import ctypes

        ctypes.pythonapi.PyGILState_Ensure()
    except (ImportError, AttributeError, OSError):  # pragma: no cover - not CPython
        pass


def _async_done(rec: Any, key: int, head: tuple[int, ...], _fut: Any = None) -> None:
    """An asynchronous collective of the fast path completed (on the backend's thread). One that
    failed (the process group's timeout, a peer gone) never completed: it stays in flight, where a
    hang dump writes it as started."""
    end = time.time_ns()
    if _fut is not None:
        try:
            _fut.value()
        except Exception:  # noqa: BLE001 - the work's error is the caller's to see, at wait()
            return
    if rec._inflight.pop(key, None) is not None:  # (None: dumped or closed meanwhile)
        rec._done.append(head + ((end if end > head[4] else head[4]),))
    tid = threading.get_ident()
    if tid not in rec._cb_threads:  # first callback on this thread
        rec._cb_threads.add(tid)
        if tid not in threading._active:  # a backend's C++ thread, not a Python one  # type: ignore[attr-defined]
            _keep_thread_state()


def async_issued(rec: Any, work: Any, key: int, head: tuple[int, ...]) -> Any:
    """Finish an asynchronous collective held in flight under ``key`` when ``work`` completes: in
    C++ where the compiled kernel is loaded (``rec._watch``: the end read on the backend's thread,
    no GIL, drained at the next flush); else a callback on its future (no PendingOp, no lock);
    without a future, the general path's completion (a PendingOp finished at
    ``wait()``/``is_completed()``)."""
    if work is not None:
        watch = getattr(rec, "_watch", None)
        if watch is not None:
            try:
                watched = watch(key, work)
            except (TypeError, RuntimeError):  # not a c10d Work
                watched = False
            if watched:
                if len(rec._inflight) >= rec.flush_every:
                    rec.flush()
                return work
        try:
            fut = work.get_future()
        except (RuntimeError, AttributeError):
            fut = None
        if fut is not None:
            fut.add_done_callback(functools.partial(_async_done, rec, key, head))
            return work
    if rec._inflight.pop(key, None) is None:
        return work
    h = PendingOp(rec, head)
    with rec._lock:
        rec._pending.append(h)
    return finish_on_completion(work, [h], None)
