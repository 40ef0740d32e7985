"""The logger's compiled dispatcher kernel: build, load and drive ``_native.cpp``.

:class:`holmes.logger._dispatch.DispatchHook` registers Python kernels for the ``c10d`` operators
at the ``Autograd`` dispatch key. A Python kernel pays PyTorch's argument conversions (11-17 us a
operator with warm caches, 60-250 us between two gradient buckets of a backward pass), the cost of
``benchmarks/logger_overhead.py --setup ddp``'s *floor* arm. Where a C++ compiler is present, the
hook adds a compiled kernel for the collectives on CPU tensors at the ``AutogradCPU`` key (a
per-backend key takes precedence over the alias): it reads the group, size and clock in C++, makes
one Python call with four integers to number the operator with the recorder's own counters, and
ends the operator from a C++ callback on the work's future (no GIL; the end is exact, where a
Python callback's waits for the GIL). Completed operators wait in a C++ buffer until the
recorder's next flush, dump or :meth:`~holmes.logger.CommOpsRecorder.running_since`.

The module is compiled once by :func:`torch.utils.cpp_extension.load` (about 30-60 s, cached in
``TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``; concurrent ranks wait on its
lock). :func:`build_native` builds it ahead of a job; ``HOLMES_LOGGER_NATIVE=0`` turns it off.
Without a compiler the Python kernels are used, as before.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from pathlib import Path
from typing import Any

__all__ = ["build_native", "load_native", "NATIVE_ENV"]

log = logging.getLogger(__name__)

#: environment variable: ``0`` (or ``off``/``false``) disables the compiled kernel
NATIVE_ENV = "HOLMES_LOGGER_NATIVE"
_SOURCE = Path(__file__).with_name("_native.cpp")
_HOW = {"none": 0, "one": 1, "list": 2, "nested": 3}
_LOCK = threading.Lock()
_CACHE: dict[str, Any] = {}


def _disabled() -> bool:
    return os.environ.get(NATIVE_ENV, "").strip().lower() in ("0", "off", "false", "no")


def _module_name() -> str:
    import sys

    import torch

    ver = torch.__version__.replace(".", "_").replace("+", "_")
    return f"holmes_logger_native_py{sys.version_info[0]}{sys.version_info[1]}_torch{ver}"


def build_native(verbose: bool = False) -> Any:
    """Compile (if needed) and import the logger's compiled kernel; returns the module.

    Raises whatever :func:`torch.utils.cpp_extension.load` raises (no compiler, no headers).
    Run it once per machine image before a job to take the compile out of the job's start.

    Examples
    --------
    ``python -c "import holmes.logger; holmes.logger.build_native()"``
    """
    with _LOCK:
        mod = _CACHE.get("mod")
        if mod is not None:
            return mod
        from torch.utils import cpp_extension

        mod = cpp_extension.load(_module_name(), [str(_SOURCE)], extra_cflags=["-O2"], verbose=verbose)
        _CACHE["mod"] = mod
        return mod


def load_native() -> Any:
    """The compiled kernel's module, or None (disabled, or it could not be built: logged once)."""
    if _disabled():
        return None
    if "error" in _CACHE:
        return None
    try:
        return build_native()
    except Exception as e:  # noqa: BLE001 - no compiler, no headers: the Python kernels stay
        _CACHE["error"] = e
        log.warning("holmes logger: the compiled dispatcher kernel is unavailable (%s: %s); DDP's buckets and "
                    "other dispatcher-level operators on CPU are logged by the slower Python kernel",
                    type(e).__name__, str(e).splitlines()[0] if str(e) else "")
        return None


_TAGS = iter(range(1, 1 << 62))


def _tag_of(rec: Any, mod: Any) -> int:
    """The recorder's tag in the compiled kernel's buffer; its drainer is attached once, for good."""
    tag = getattr(rec, "_native_tag", None)
    if tag is None:
        tag = rec._native_tag = next(_TAGS)
        rec._drainers.append(functools.partial(mod.drain, tag))
    return tag


class NativeKernel:
    """The compiled kernel installed for one :class:`~holmes.logger._dispatch.DispatchHook`.

    ``cell`` is the hook's one-element list holding the logger (or None: redispatch only).
    """

    def __init__(self, mod: Any, cell: list[Any], specs: dict[str, tuple[str, int, int, str, int]]) -> None:
        from holmes.logger.recorder import _OP_CODE, _op_key

        self._mod = mod
        self._cell = cell
        # group id (the C++ pointer) -> the counter numbering its collectives; the groups are
        # kept alive here so that an id is never reused while it is known
        self._seq: dict[int, Any] = {}
        self._groups: dict[int, Any] = {}
        self._specs = {name: (_op_key(_OP_CODE[op], -1), gi, si, _HOW[how])
                       for name, (op, gi, si, how, pi) in specs.items() if pi < 0 and name != "monitored_barrier_"}
        self._rec: Any = None

    @property
    def seen(self) -> int:
        return int(self._mod.counters()["seen"])

    def install(self) -> None:
        self._mod.install(self._specs, self._issue, self._resolve)
        self.refresh()

    def uninstall(self) -> None:
        """Remove the kernel. Operators it issued that are still running end later: the recorder
        keeps draining them (its drainer stays attached)."""
        self._mod.uninstall()
        self._rec = None
        self._seq.clear()

    def refresh(self) -> None:
        """Follow the hook's logger: record into its recorder, or only redispatch."""
        lg = self._cell[0]
        rec = None if lg is None else lg.recorder
        if rec is not self._rec:
            self._seq.clear()
            self._rec = rec
        tag = 0
        if rec is not None:
            tag = _tag_of(rec, self._mod)
        self._mod.set_active(rec is not None, tag)

    # called from C++ with the GIL held (keep them short: they are the per-operator cost)
    def _issue(self, pg_id: int, opk: int, nbytes: int, start: int) -> int:
        seq = self._seq.get(pg_id)
        rec = self._rec
        if seq is None or rec is None:
            return -1
        key = next(seq)
        rec._inflight[key] = (next(rec._index), key, opk, nbytes, start)
        if len(rec._inflight) >= rec.flush_every:
            rec.flush()
        return key

    def _resolve(self, pg_id: int, pg: Any) -> None:
        lg = self._cell[0]
        if lg is None:
            return
        lg.comm_of(pg)
        seq = lg._seq_of.get(pg)
        if seq is None:  # unhashable group: number it through its comm id
            seq = lg.recorder._coll_seq(lg.comm_of(pg)[0])
        self._groups[pg_id] = pg
        self._seq[pg_id] = seq
