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

The module is compiled once by :func:`torch.utils.cpp_extension.load` (20-60 s; concurrent ranks
wait on its lock) into ``~/.cache/holmes-native`` (``HOLMES_NATIVE_DIR`` elsewhere), then imported
from there directly (milliseconds). :func:`build_native` builds it ahead of a job;
``HOLMES_LOGGER_NATIVE=0`` turns it off.
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
    """The module's name: Python, torch and a digest of the source (a changed source, another torch
    or another Python is another module, built apart)."""
    import hashlib
    import sys

    import torch

    ver = torch.__version__.replace(".", "_").replace("+", "_")
    digest = hashlib.sha256(_SOURCE.read_bytes()).hexdigest()[:12]
    return f"holmes_logger_native_py{sys.version_info[0]}{sys.version_info[1]}_torch{ver}_{digest}"


def _build_dir(name: str) -> Path:
    """Where the module is built: ``$HOLMES_NATIVE_DIR`` or ``$XDG_CACHE_HOME/holmes-native``
    (default ``~/.cache/holmes-native``; not under the benchmarks' pruned ``~/.cache/holmes``),
    one folder per module name."""
    root = os.environ.get("HOLMES_NATIVE_DIR")
    if not root:
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(cache, "holmes-native")
    return Path(root) / name


def _import_built(name: str, folder: Path) -> Any:
    """The module already built in ``folder`` (imported directly: no compiler check, no ninja), or None."""
    import importlib.machinery
    import importlib.util

    for suffix in importlib.machinery.EXTENSION_SUFFIXES + [".so"]:
        path = folder / f"{name}{suffix}"
        if path.is_file() and not (folder / "lock").exists():
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None or spec.loader is None:
                return None
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            return mod
    return None


def build_native(verbose: bool = False) -> Any:
    """Compile (if needed) and import the logger's compiled kernel; returns the module.

    Built once per source, torch and Python into ``~/.cache/holmes-native`` (``HOLMES_NATIVE_DIR``
    elsewhere), later imported from there directly. Raises whatever
    :func:`torch.utils.cpp_extension.load` raises (no compiler, no headers). Run it once per
    machine image before a job to take the compile out of the job's start.

    Examples
    --------
    ``python -c "import holmes.logger; holmes.logger.build_native()"``
    """
    with _LOCK:
        mod = _CACHE.get("mod")
        if mod is not None:
            return mod
        import torch  # noqa: F401 - the module links against torch's libraries, loaded first

        name = _module_name()
        folder = _build_dir(name)
        mod = _import_built(name, folder)
        if mod is None:
            from torch.utils import cpp_extension

            folder.mkdir(parents=True, exist_ok=True)
            log.info("holmes logger: building the compiled dispatcher kernel in %s (once, 20-60 s)", folder)
            mod = cpp_extension.load(name, [str(_SOURCE)], extra_cflags=["-O2"], build_directory=str(folder),
                                     verbose=verbose)
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
        # the namespace wrappers' asynchronous operators end the same way (holmes.logger._work.async_issued)
        rec._watch = functools.partial(mod.watch, tag)  # watch(key, work): positional, no keyword parsing
    return tag


def unregister_native() -> None:
    """Remove the compiled kernel from the dispatcher if this process registered it (a logger with
    ``native=False`` then gets the Python kernels for CPU tensors too: the compiled kernel, kept
    registered as a pass-through between loggers, would otherwise hide them)."""
    mod = _CACHE.get("mod")
    if mod is not None:
        mod.unregister()


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
        """Stop recording; the kernel stays registered as a pass-through (see ``_native.cpp``).
        Operators it issued that are still running end later: the recorder keeps draining them
        (its drainer stays attached)."""
        self._mod.uninstall()
        self._rec = None
        self._seq.clear()
        self._groups.clear()  # the process groups are the job's again (a group outliving its job hangs a fork)

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
