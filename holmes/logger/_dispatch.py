"""The logger's second hook: the ``c10d`` operators of PyTorch's dispatcher, for callers that bypass
the ``torch.distributed`` namespace.

Every collective and point-to-point operator a ``ProcessGroup`` runs in PyTorch 2.x is a
dispatcher operator (``c10d::allreduce_``, ``c10d::_allgather_base_``, ``c10d::send``...),
whoever calls it: the Python functions of ``torch.distributed``, ``ProcessGroup`` methods called
directly (``_coalescing_manager``'s coalesced operators, FSDP's internals), and C++ callers that
never enter Python: DistributedDataParallel's reducer (gradient buckets), functional collectives
(``_c10d_functional``, DTensor), ``_broadcast_coalesced``. :class:`DispatchHook` registers a Python
kernel for each of them at the ``Autograd`` dispatch key (the c10d operators have none of their
own there); the kernel notes the operator, redispatches below autograd to the real kernel and
finishes the operator when its work's future completes.

A boxed Python kernel costs 11-17 us of CPU time per operator with warm caches and 60-70 us with
cold ones (PyTorch's own argument conversions; see :class:`DispatchHook`), plus the logging, so
the namespace wrappers of :mod:`holmes.logger.torch_hooks` stay the fast path: they call torch below the autograd keys
(``torch._C._AutoDispatchBelowAutograd``, about 0.4 us), where this hook is not called. Operators
issued under ``torch.inference_mode()`` skip the autograd keys too, so only the wrappers see them.

PyTorch is imported lazily (in :meth:`DispatchHook.install`).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from holmes.logger._work import _async_done, is_cuda

__all__ = ["DispatchHook", "C10D_SPECS"]

log = logging.getLogger(__name__)

# c10d operator -> (CommOps op, index of the process group argument, index of the argument whose
# bytes are the message size (-1: none), how that argument is sized: "one" tensor, a "list" of
# tensors or a "nested" list of lists, index of the peer argument (P2P) or -1)
C10D_SPECS: dict[str, tuple[str, int, int, str, int]] = {
    "allreduce_": ("all_reduce", 1, 0, "list", -1),
    "allreduce_coalesced_": ("all_reduce", 1, 0, "list", -1),
    "allgather_": ("all_gather", 2, 0, "nested", -1),
    "allgather_coalesced_": ("all_gather", 2, 0, "nested", -1),
    "allgather_into_tensor_coalesced_": ("all_gather", 2, 0, "list", -1),
    "_allgather_base_": ("all_gather", 2, 0, "one", -1),
    "reduce_scatter_": ("reduce_scatter", 2, 1, "nested", -1),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 2, 1, "list", -1),
    "_reduce_scatter_base_": ("reduce_scatter", 2, 1, "one", -1),
    "alltoall_": ("all_to_all", 2, 1, "list", -1),
    "alltoall_base_": ("all_to_all", 2, 1, "one", -1),
    "broadcast_": ("broadcast", 1, 0, "list", -1),
    "reduce_": ("reduce", 1, 0, "list", -1),
    "barrier": ("barrier", 1, -1, "one", -1),
    "monitored_barrier_": ("barrier", 1, -1, "one", -1),
    "send": ("send", 1, 0, "list", 2),
    "recv_": ("recv", 1, 0, "list", 2),
}
# not recorded: gather_/scatter_ (no CommOps v1 operator name) and recv_any_source_ (its peer is
# known only once it completed); the namespace wrappers record dist.recv without a source.


def _size(x: Any, how: str) -> int:
    try:
        if how == "one":
            return int(x.nbytes)
        if how == "list":
            return sum(int(t.nbytes) for t in x)
        return sum(int(t.nbytes) for ts in x for t in ts)
    except (AttributeError, TypeError):
        return 0


def _work_of(out: Any) -> Any:
    """The ``Work`` script object an operator returned (alone or last in a tuple), or None."""
    if isinstance(out, tuple):
        out = out[-1] if out else None
    return out if out is not None and not isinstance(out, (list, tuple)) else None


class DispatchHook:
    """Python kernels for the ``c10d`` operators at the ``Autograd`` dispatch key.

    Parameters
    ----------
    logger : CommOpsLogger, optional
        The logger the kernels record into; None: they only redispatch (what the mechanism alone
        costs, see ``benchmarks/logger_overhead.py``). :attr:`logger` may be changed while installed.

    Notes
    -----
    The kernels are registered by :meth:`install` and removed by :meth:`uninstall`; while they
    are, every ``c10d`` operator called above the autograd keys passes through Python. What that
    costs is mostly PyTorch's: a boxed Python kernel converts the operator's arguments to Python
    objects and back (about 11-17 us of CPU time per operator when the caches are warm, 60-70 us
    once a step's data has evicted them, as between DDP's gradient buckets); the kernel's own work
    is kept to a few dictionary and counter operations and one future callback.
    """

    def __init__(self, logger: Any = None, native: bool | None = None) -> None:
        # one cell read by every kernel (cheaper than calling a function or reading an attribute chain)
        self._cell: list[Any] = [logger]
        self._lib: Any = None
        self.native = native  # the compiled kernel for CPU collectives: None = where it builds
        self._native: Any = None  # the installed NativeKernel
        self._unbox_pg: Any = None
        self._unbox_work: Any = None
        self._warned = False
        self._seen = 0  # operators recorded through the Python kernels
        self._native_seen0 = 0

    @property
    def logger(self) -> Any:
        return self._cell[0]

    @logger.setter
    def logger(self, lg: Any) -> None:
        self._cell[0] = lg
        if self._native is not None:
            self._native.refresh()

    @property
    def native_installed(self) -> bool:
        """Whether the compiled kernel takes the collectives on CPU tensors (see :mod:`holmes.logger._native`)."""
        return self._native is not None

    @property
    def seen(self) -> int:
        """Operators recorded through this hook (its Python kernels and the compiled one)."""
        return self._seen + (self._native.seen - self._native_seen0 if self._native is not None else 0)

    @property
    def installed(self) -> bool:
        return self._lib is not None

    def install(self) -> "DispatchHook":
        if self._lib is not None:
            return self
        import torch
        import torch.distributed  # noqa: F401 - registers the c10d operators

        from torch._C._distributed_c10d import ProcessGroup, Work

        self._unbox_pg, self._unbox_work = ProcessGroup.unbox, Work.unbox
        lib = torch.library.Library("c10d", "IMPL")
        after = torch._C._after_autograd_keyset
        try:
            for name, spec in C10D_SPECS.items():
                packet = getattr(torch.ops.c10d, name, None)
                if packet is None:  # not in this torch version
                    continue
                lib.impl(name, self._kernel(packet.default, after, spec), "Autograd", with_keyset=True)
        except Exception:
            lib._destroy()
            raise
        self._lib = lib
        if self.native is not False:
            self._install_native()
        if self._native is None:  # a compiled kernel registered earlier would hide the Python ones on CPU
            from holmes.logger._native import unregister_native

            unregister_native()
        return self

    def _install_native(self) -> None:
        from holmes.logger._native import NativeKernel, load_native

        mod = load_native()
        if mod is None:
            if self.native:
                log.warning("holmes logger: native=True but the compiled kernel could not be loaded")
            return
        try:
            nk = NativeKernel(mod, self._cell, C10D_SPECS)
            nk.install()
        except Exception:  # noqa: BLE001 - e.g. another hook already holds the key: the Python kernels stay
            log.warning("holmes logger: the compiled dispatcher kernel could not be installed", exc_info=True)
            return
        self._native, self._native_seen0 = nk, nk.seen

    def uninstall(self) -> None:
        nk, self._native = self._native, None
        if nk is not None:
            self._seen += nk.seen - self._native_seen0
            nk.uninstall()
        lib, self._lib = self._lib, None
        if lib is not None:
            lib._destroy()

    def _kernel(self, op: Any, after: Any, spec: tuple[str, int, int, str, int]) -> Callable:
        from holmes.logger.recorder import _OP_CODE, _op_key

        name, gi, si, how, pi = spec
        cell = self._cell
        unbox_pg, unbox_work = self._unbox_pg, self._unbox_work
        redispatch = op._handle.redispatch_boxed
        opk = _op_key(_OP_CODE[name], -1)
        time_ns, partial = time.time_ns, functools.partial
        listed = how == "list"

        def kernel(keyset: Any, *args: Any) -> Any:
            lg = cell[0]
            if lg is None:
                return redispatch(keyset & after, *args)
            if pi >= 0:  # point-to-point: the general path
                return self._p2p(lg, redispatch, keyset & after, args, name, gi, si, how, pi)
            if si >= 0 and _on_gpu(args[si]):  # CUDA tensors: times from CUDA events
                return self._cuda(lg, redispatch, keyset & after, args, name, gi, si, how)
            # a collective: the fast path of the namespace wrappers (a packed row held in flight
            # under its comm/seq key, finished by a callback on the work's future)
            try:
                pg = unbox_pg(args[gi])
                seq = lg._seq_of.get(pg)
                if seq is None:
                    lg.comm_of(pg)
                    seq = lg._seq_of[pg]
                rec = lg._rec
                if si < 0:
                    nbytes = 0
                else:
                    x = args[si]
                    nbytes = x[0].nbytes if listed and len(x) == 1 else _size(x, how)
                key = next(seq)
            except Exception:  # noqa: BLE001 - logging must never break the training step
                self._warn_once(name)
                return redispatch(keyset & after, *args)
            head = (next(rec._index), key, opk, nbytes, time_ns())
            rec._inflight[key] = head
            out = redispatch(keyset & after, *args)
            self._seen += 1
            try:  # the work: last in the returned tuple (or returned alone)
                fut = unbox_work(out[-1] if type(out) is tuple else out).get_future()
            except (RuntimeError, AttributeError, TypeError, IndexError):
                fut = None
            if fut is not None:
                fut.add_done_callback(partial(_async_done, rec, key, head))
            elif rec._inflight.pop(key, None) is not None:  # synchronous (monitored_barrier_), or no future
                end = time_ns()
                rec._done.append(head + (max(end, head[4]),))
            if len(rec._done) >= rec.flush_every:
                rec.flush()
            return out

        return kernel

    def _p2p(self, lg: Any, redispatch: Callable, keyset: Any, args: tuple, name: str, gi: int, si: int, how: str,
             pi: int) -> Any:
        try:
            note = self._note(lg, args, name, gi, si, how, pi)
        except Exception:  # noqa: BLE001 - logging must never break the training step
            note = None
            self._warn_once(name)
        start = time.time_ns()
        out = redispatch(keyset, *args)
        if note is not None:
            try:
                self._issued(lg, note, start, _work_of(out))
            except Exception:  # noqa: BLE001
                self._warn_once(name)
        return out

    def _cuda(self, lg: Any, redispatch: Callable, keyset: Any, args: tuple, name: str, gi: int, si: int,
              how: str) -> Any:
        """A collective on CUDA tensors: it starts when the issuing stream reaches it (a CUDA event
        recorded before it is enqueued) and ends when its work completes on the GPU (an event
        recorded from the work's future callback, whose current stream waits on the work), not
        when the CPU issued it: a rank whose GPU is late issues its collectives early, and only
        the GPU's clock shows it late. Resolved at flush (:class:`~holmes.logger._work.CudaClock`)."""
        try:
            note = self._note(lg, args, name, gi, si, how, -1)
            clock = lg._cuda
            ev0 = clock.event()
        except Exception:  # noqa: BLE001 - logging must never break the training step
            self._warn_once(name)
            return redispatch(keyset, *args)
        start = time.time_ns()
        out = redispatch(keyset, *args)
        try:
            cid, op, _, nbytes = note
            h = lg.recorder.begin(cid, op, nbytes=nbytes, start_ns=start)
            box: list = []
            h.resolver = clock.resolver(ev0, box)
            work = _work_of(out)
            try:
                fut = None if work is None else self._unbox_work(work).get_future()
            except (RuntimeError, AttributeError):
                fut = None
            if fut is None:  # no future: the end as enqueued on the issuing stream
                box.append(clock.event())
            else:
                fut.add_done_callback(functools.partial(_cuda_end, clock, box))
            self._seen += 1
        except Exception:  # noqa: BLE001
            self._warn_once(name)
        return out

    def _warn_once(self, name: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning("holmes logger: recording a c10d::%s operator failed; it and others like it may be missing "
                        "from the log", name, exc_info=True)

    def _note(self, lg: Any, args: tuple, name: str, gi: int, si: int, how: str, pi: int) -> tuple[str, str, int | None, int]:
        pg = self._unbox_pg(args[gi])
        nbytes = _size(args[si], how) if si >= 0 else 0
        if pi < 0:
            return lg.comm_of(pg)[0], name, None, nbytes
        import torch.distributed as dist

        peer = int(dist.get_global_rank(pg, int(args[pi])))
        return lg._p2p_comm(pg, peer), name, peer, nbytes

    def _issued(self, lg: Any, note: tuple[str, str, int | None, int], start: int, work: Any) -> None:
        cid, name, peer, nbytes = note
        rec = lg.recorder
        self._seen += 1
        if work is None:  # a synchronous operator (monitored_barrier_) has returned
            rec.record(cid, name, peer=peer, nbytes=nbytes, start_ns=start, end_ns=time.time_ns())
            return
        h = rec.begin(cid, name, peer=peer, nbytes=nbytes, start_ns=start)
        w = self._unbox_work(work)
        try:
            fut = w.get_future()
        except (RuntimeError, AttributeError):  # e.g. gloo's send/recv works: polled at the next flush
            fut = None
        if fut is None:
            h.poll = w.is_completed
            return
        fut.add_done_callback(functools.partial(_finish, h))


def _finish(h: Any, _fut: Any) -> None:
    h.finish(time.time_ns())


def _on_gpu(x: Any) -> bool:
    """Whether a c10d operator's tensor argument (a tensor, or nested lists of them) is on a GPU."""
    while isinstance(x, (list, tuple)):
        if not x:
            return False
        x = x[0]
    return is_cuda(x)


def _cuda_end(clock: Any, box: list, _fut: Any) -> None:
    if not box:  # the first completion wins
        box.append(clock.event())
