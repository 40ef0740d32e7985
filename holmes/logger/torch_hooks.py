"""Capture a PyTorch job's communication operators by wrapping ``torch.distributed``.

:class:`CommOpsLogger` replaces the collective and point-to-point functions of the
``torch.distributed`` namespace with thin wrappers while it is enabled, and restores the very same
function objects when disabled. Operators that bypass the namespace (DDP's C++ reducer,
``_coalescing_manager``'s coalesced operator, ``ProcessGroup`` methods called directly) are caught
one level lower, at the dispatcher's ``c10d`` operators (:mod:`holmes.logger._dispatch`); the
wrappers call torch below the autograd keys, where that hook is not called, so nothing is seen
twice. Each wrapped call is handed to a
:class:`~holmes.logger.recorder.CommOpsRecorder` (communicator id and members, ``seq``,
``nbytes``, entry and completion time). Training code changes only by enabling the logger and
marking steps::

    logger = CommOpsLogger("job-dir", layout=ParallelLayout(tp=2, pp=2, dp=2)).enable()
    for it in range(n):
        logger.step(it)
        train_step()
    logger.close()          # rank 0 then writes job.json (see finalize_job)

Timing: on CPU tensors (gloo) a synchronous call ends when it returns; an asynchronous one
(``async_op=True``, ``isend``/``irecv``, ``batch_isend_irecv``) ends in a completion callback of
the work's future when the backend supports one, else when the returned work's ``wait()`` (or a
true ``is_completed()``) is seen; such works are returned wrapped in a thin proxy. On CUDA tensors
CUDA events are recorded around the call on the current stream and resolved lazily at flush
(asynchronous CUDA work ends at ``wait()``).

PyTorch is imported lazily: importing this module does not need it.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from holmes.errors import ConfigError
from holmes.logger._dispatch import DispatchHook
from holmes.logger._dumps import _reason_of, install_dump_handlers
from holmes.logger._work import (_COLL_SPECS, _P2P_SPECS, WRAPPED_FUNCTIONS, CudaClock, TimedWork, _default_rank_world,
                                  arg, async_issued, default_group, finish_on_completion, global_peer, is_cuda, nbytes_of,
                                  nbytes_of_list)
from holmes.logger.recorder import _OP_CODE, CommOpsRecorder, _op_key

__all__ = ["CommOpsLogger", "enable", "WRAPPED_FUNCTIONS", "active_logger"]

log = logging.getLogger(__name__)

class _Depth(threading.local):
    depth = 0  # > 0 inside a wrapped call of this thread: nested calls are not logged twice


_tls = _Depth()
_ACTIVE: "CommOpsLogger | None" = None
_ENABLE_LOCK = threading.Lock()
# set by enable(): the wrappers call torch below the autograd keys (torch._C._AutoDispatchBelowAutograd;
# the fast path sets the thread's exclusion of AutogradCPU itself), so the dispatcher hook does not
# see their operators twice; c10d's coalescing state: group -> the operators a _coalescing_manager
# defers (recorded as the coalesced operator it issues at its exit, through the dispatcher hook)
_below: Any = None
_coalescing: dict = {}
_excluded: Any = None
_exclude: Any = None
_AUTOGRAD_CPU: Any = None


def active_logger() -> "CommOpsLogger | None":
    """The enabled :class:`CommOpsLogger` of this process, if any."""
    return _ACTIVE


class _Wrapper:
    """A callable standing in for a ``torch.distributed`` function; compares equal to it (so
    ``P2POp(dist.isend, ...)`` passes torch's own check) and passes calls through when no logger is
    active or when called from inside another wrapped call."""

    def __init__(self, orig: Callable, name: str, handler: Callable) -> None:
        self.__wrapped__ = orig
        self._name = name
        self._handler = handler
        self.__doc__ = getattr(orig, "__doc__", None)

    @property
    def __name__(self) -> str:
        return self._name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        lg = _ACTIVE
        if lg is None or _tls.depth:
            return self.__wrapped__(*args, **kwargs)
        return self._handler(lg, self.__wrapped__, args, kwargs)

    def __eq__(self, other: object) -> bool:
        return other is self or other is self.__wrapped__

    def __hash__(self) -> int:
        return hash(self.__wrapped__)

    def __repr__(self) -> str:
        return f"<holmes logger wrapper of torch.distributed.{self._name}>"


class CommOpsLogger:
    """Record every ``torch.distributed`` communication operator of this rank as CommOps v1.

    Parameters
    ----------
    out_dir : path-like
        The job directory (shared by all ranks, or one per node merged later).
    rank, world_size : int, optional
        Default: from the initialized default process group, else ``RANK`` / ``WORLD_SIZE``.
    flush_every : int, default 8192
        Rows buffered in memory before they are appended to the rank's parquet file.
    layout : holmes.topology.ParallelLayout, optional
        When given, a group whose members equal one of the layout's communicators takes that
        communicator's id and kind (``tp-0``, ``pp-3``...), point-to-point operators on another
        group (e.g. the world) are attributed to the pp communicator holding both ends, and
        ``job.json`` gets the layout as ``parallel``.
    groups : mapping, optional
        ``kind -> iterable of groups``, each a ``ProcessGroup`` or a list of global ranks, e.g.
        ``{"tp": tp_groups, "dp": dp_groups}``. Otherwise the kind comes from the group's
        description (``group_desc``, Megatron names understood) or is ``"other"``.
    start_iteration : int, default 0
        Iteration number of operators issued before the first :meth:`step`.
    parts_every, parts_interval : int, float, optional
        Live mode: write the log in parts (``ranks/rank-XXXXX/part-NNNNNN.parquet``), one closed at
        the first step mark after every ``parts_every`` iterations or ``parts_interval`` seconds,
        so ``holmes watch`` follows the job while it trains (see
        :class:`~holmes.logger.CommOpsRecorder`).
    dispatch : bool, default True
        Also hook the dispatcher's ``c10d`` operators (DDP's buckets, coalesced operators, direct
        ``ProcessGroup`` calls; :mod:`holmes.logger._dispatch`).
    native : bool, optional
        The compiled dispatcher kernel for CPU collectives (:mod:`holmes.logger._native`): None
        where it builds (``HOLMES_LOGGER_NATIVE=0``: never), False never, True warns if it cannot.

    Examples
    --------
    >>> import tempfile
    >>> lg = CommOpsLogger(tempfile.mkdtemp(), rank=0, world_size=1)
    >>> lg.enabled
    False
    """

    def __init__(self, out_dir: str | os.PathLike[str], rank: int | None = None, world_size: int | None = None, *,
                 flush_every: int = 8192, layout: Any = None,
                 groups: Mapping[str, Iterable[Any]] | None = None, start_iteration: int = 0,
                 parts_every: int | None = None, parts_interval: float | None = None,
                 dispatch: bool = True, native: bool | None = None) -> None:
        self.out_dir = Path(out_dir)
        self._rank = None if rank is None else int(rank)
        self._world_size = None if world_size is None else int(world_size)
        self.flush_every = int(flush_every)
        self.layout = layout
        self.groups = dict(groups) if groups else {}
        self.start_iteration = int(start_iteration)
        self.parts_every = parts_every
        self.parts_interval = parts_interval
        self._rec: CommOpsRecorder | None = None
        self._saved: dict[str, Any] = {}
        self._saved_p2pop_op: Any = _NOTHING
        self._group_cache: dict[int, tuple[Any, str, tuple[int, ...]]] = {}
        # group -> the counter numbering its collectives (the wrappers' look-up: a process group
        # hashes by identity, cheaper than id() plus an identity check)
        self._seq_of: dict[Any, Any] = {}
        self._kind_by_ranks: dict[tuple[int, ...], str] | None = None
        self._layout_ids: dict[tuple[int, ...], tuple[str, str]] | None = None
        self._cuda = CudaClock()
        self._atexit = False
        self.dispatch = bool(dispatch)
        self._dispatch = DispatchHook(self, native=native)

    # ------------------------------------------------------------------ lifecycle

    @property
    def enabled(self) -> bool:
        return _ACTIVE is self

    @property
    def recorder(self) -> CommOpsRecorder:
        """The underlying recorder (created on first use)."""
        if self._rec is None:
            r, w = _default_rank_world()
            rank = self._rank if self._rank is not None else r
            ws = self._world_size if self._world_size is not None else w
            if rank is None:
                raise ConfigError("CommOpsLogger: rank unknown; initialize torch.distributed first or pass rank=")
            self._rank, self._world_size = rank, ws
            self._rec = CommOpsRecorder(self.out_dir, rank, world_size=ws, flush_every=self.flush_every,
                                        start_iteration=self.start_iteration, parts_every=self.parts_every,
                                        parts_interval=self.parts_interval)
        return self._rec

    @property
    def rank(self) -> int:
        return self.recorder.rank

    def enable(self) -> "CommOpsLogger":
        """Wrap the ``torch.distributed`` functions (see :data:`WRAPPED_FUNCTIONS`); returns self."""
        global _ACTIVE, _below, _coalescing, _excluded, _exclude, _AUTOGRAD_CPU
        import torch
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        with _ENABLE_LOCK:
            if _ACTIVE is self:
                return self
            if _ACTIVE is not None:
                raise ConfigError("another CommOpsLogger is enabled in this process; disable it first")
            if self._rec is not None and self._rec.closed:
                raise ConfigError(f"CommOpsLogger for {self.out_dir} is closed")
            _ = self.recorder
            for name in WRAPPED_FUNCTIONS:
                orig = getattr(dist, name, None)
                if orig is None:  # not in this torch version
                    continue
                self._saved[name] = orig
                base = orig.__wrapped__ if _is_wrapper(orig) else orig
                if name in _COLL_SPECS:
                    setattr(dist, name, _collective_wrapper(base, name))
                    continue
                handler = _p2p_handler(name) if name in _P2P_SPECS else _batch_handler
                setattr(dist, name, _Wrapper(base, name, handler))
            self._saved_p2pop_op = c10d.P2POp.__dict__.get("op", _NOTHING)
            c10d.P2POp.op = _p2p_op_property({getattr(dist, n).__wrapped__: getattr(dist, n)
                                              for n in ("isend", "irecv") if n in self._saved})
            _below = torch._C._AutoDispatchBelowAutograd
            _excluded, _exclude = torch._C._dispatch_tls_is_dispatch_key_excluded, \
                torch._C._dispatch_tls_set_dispatch_key_excluded
            _AUTOGRAD_CPU = torch._C.DispatchKey.AutogradCPU
            _coalescing = c10d._world.pg_coalesce_state
            if self.dispatch:
                try:
                    self._dispatch.logger = self
                    self._dispatch.install()
                except Exception:  # noqa: BLE001 - another torch: log what the namespace sees, say so
                    log.warning("holmes logger: the c10d dispatcher hook could not be installed; operators that "
                                "bypass torch.distributed (DDP's buckets) will be missing", exc_info=True)
            _ACTIVE = self
            if not self._atexit:
                atexit.register(self._atexit_close)
                self._atexit = True
        log.debug("rank %d: torch.distributed wrapped", self.rank)
        return self

    def disable(self) -> None:
        """Restore the original ``torch.distributed`` functions (the same objects)."""
        global _ACTIVE
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        with _ENABLE_LOCK:
            if _ACTIVE is not self:
                return
            for name, orig in self._saved.items():
                cur = getattr(dist, name)
                if _is_wrapper(cur):
                    setattr(dist, name, orig)
                else:
                    log.warning("torch.distributed.%s was replaced by someone else while logging; left as is", name)
            self._saved.clear()
            if self._saved_p2pop_op is _NOTHING:
                if isinstance(c10d.P2POp.__dict__.get("op"), property):
                    del c10d.P2POp.op
            else:
                c10d.P2POp.op = self._saved_p2pop_op
            self._saved_p2pop_op = _NOTHING
            self._dispatch.uninstall()
            self._dispatch.logger = None  # no cycle through the hook: a disabled logger is freed when dropped
            _ACTIVE = None

    def __enter__(self) -> "CommOpsLogger":
        return self.enable()

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None:
            self.close()
        elif self._rec is not None and not self._rec.closed:
            self.dump(_reason_of(exc[1]), f"{exc[0].__name__}: {exc[1]}")

    def dump(self, reason: str = "signal", detail: str | None = None, *, finalize_timeout: float = 2.0) -> Path:
        """Write this rank's log now, the operators in flight included, and write ``job.json``.

        For a hung or failing job: see :meth:`~holmes.logger.CommOpsRecorder.dump` (``reason`` one
        of ``timeout``, ``signal``, ``exception``, ``end``). Then ``job.json`` is (re)written from
        the sidecars present after waiting up to ``finalize_timeout`` seconds for the others (every
        dumping rank does it; the last one to dump writes the most complete ``job.json``; ranks
        without a dump have no log). Never raises: a hang dump must not hide the original error.
        """
        path = self.out_dir
        try:
            self.disable()
            path = self.recorder.dump(reason, detail)
            if self._atexit:
                atexit.unregister(self._atexit_close)
                self._atexit = False
            from holmes.logger.finalize import finalize_job

            finalize_job(self.out_dir, self.recorder.world_size, parallel=self.layout, timeout=finalize_timeout,
                         validate=False, allow_missing=True)
        except Exception:  # noqa: BLE001 - called from signal handlers and exception paths
            log.exception("rank %s: CommOps dump failed", self._rank)
        return path

    def install_dump_handlers(self, signals: Iterable[str] = ("SIGTERM", "SIGUSR1"), *, exceptions: bool = True,
                              timeout: float | None = None, poll: float = 0.5) -> "CommOpsLogger":
        """Dump (:meth:`dump`) on ``signals``, on an uncaught exception and when an operator has
        been in flight longer than ``timeout`` seconds (a watchdog thread; use the process group's
        timeout or less). Signal handlers can only be installed from the main thread; after the
        dump ``SIGTERM`` still terminates the process (the previous handler or the default runs).
        Returns self.
        """
        return install_dump_handlers(self, signals, exceptions=exceptions, timeout=timeout, poll=poll)

    def step(self, iteration: int | None = None) -> int:
        """Mark the start of iteration ``iteration`` (default: next); see :meth:`CommOpsRecorder.step`."""
        return self.recorder.step(iteration)

    def mark_step(self) -> int:
        """End the current iteration and start the next one (call at the end of each step)."""
        return self.recorder.step()

    def flush(self) -> None:
        """Write the buffered, finished operators now."""
        self.recorder.flush()

    def _atexit_close(self) -> None:
        try:
            self.close(finalize=False)
        except Exception:  # noqa: BLE001 - never fail interpreter exit
            log.exception("closing the CommOps logger at exit failed")

    def close(self, *, finalize: bool = True, timeout: float = 120.0) -> Path:
        """Disable, flush and close this rank's files; with ``finalize`` rank 0 writes ``job.json``.

        With ``finalize`` and an initialized process group, all ranks meet in a barrier first (so
        call ``close`` on every rank); rank 0 then runs :func:`~holmes.logger.finalize_job`,
        waiting up to ``timeout`` seconds for the other ranks' sidecars. Returns the rank file.
        """
        self.disable()
        rec = self.recorder
        path = rec.close()
        self._group_cache.clear()  # the process groups are the job's again (one kept alive past its
        self._seq_of.clear()  # job hangs a forked child whose interpreter frees it: ~ProcessGroupGloo)
        if self._atexit:
            atexit.unregister(self._atexit_close)
            self._atexit = False
        if finalize:
            try:
                import torch.distributed as dist

                if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
                    dist.barrier()
            except ImportError:  # pragma: no cover
                pass
            if rec.rank == 0:
                from holmes.logger.finalize import finalize_job

                finalize_job(self.out_dir, rec.world_size, parallel=self.layout, timeout=timeout)
        return path

    # ------------------------------------------------------------------ communicators

    def _explicit_kind(self, pg: Any, ranks: tuple[int, ...]) -> str | None:
        """Kind from ``groups``: a ProcessGroup listed there (by identity) or a listed rank list."""
        if self._kind_by_ranks is None:
            self._kind_by_pg: dict[int, tuple[Any, str]] = {}
            m: dict[tuple[int, ...], str] = {}
            for kind, gs in self.groups.items():
                for g in gs:
                    if g is None:
                        continue
                    if isinstance(g, (list, tuple, range)):
                        m[tuple(sorted(int(x) for x in g))] = kind
                    else:
                        self._kind_by_pg[id(g)] = (g, kind)
            self._kind_by_ranks = m
        hit = self._kind_by_pg.get(id(pg))
        if hit is not None and hit[0] is pg:
            return hit[1]
        return self._kind_by_ranks.get(ranks)

    def _layout_id(self, ranks: tuple[int, ...]) -> tuple[str, str] | None:
        if self.layout is None:
            return None
        if self._layout_ids is None:
            self._layout_ids = {tuple(sorted(c.ranks)): (cid, c.kind) for cid, c in self.layout.communicators().items()}
        return self._layout_ids.get(ranks)

    def comm_of(self, group: Any) -> tuple[str, tuple[int, ...]]:
        """``(comm_id, sorted global ranks)`` of a process group (``None``: the world).

        Ids are identical on every member: the layout's id when the members match a layout
        communicator, else ``f"{kind}-g{group_name}"`` (torch names groups by a creation counter
        shared by all ranks, or by a hash of the members), and ``"world"`` for the default group.
        """
        key = id(group)
        hit = self._group_cache.get(key)
        if hit is not None and hit[0] is group:
            return hit[1], hit[2]
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        pg = group if group is not None else c10d._get_default_group()
        ranks = tuple(sorted(int(r) for r in dist.get_process_group_ranks(pg)))
        is_world = pg is c10d._get_default_group()
        desc = getattr(pg, "group_desc", None)
        kind = self._explicit_kind(pg, ranks) if self.groups else None
        found = self._layout_id(ranks)
        if found is not None:
            cid, lkind = found
            kind = kind or lkind
        else:
            if kind is None and desc and desc not in ("undefined", "default_pg"):
                from holmes.topology.infer import kind_from_group_name

                kind = kind_from_group_name(desc)
            kind = kind or "other"
            cid = "world" if is_world else f"{kind}-g{pg.group_name}"
        self.recorder.add_communicator(cid, ranks, kind=kind,
                                       name=desc if desc and desc != "undefined" else None)
        self._group_cache[key] = (group, cid, ranks)
        try:
            self._seq_of[group] = self.recorder._coll_seq(cid)
        except TypeError:  # an unhashable group: its collectives take the slower path
            pass
        return cid, ranks

    def _p2p_comm(self, group: Any, peer: int | None) -> str:
        cid, ranks = self.comm_of(group)
        if self.layout is not None and peer is not None and self._layout_id(ranks) is None:
            me = self.recorder.rank
            try:
                pid = self.layout.comm_id_of(me, "pp")
            except Exception:  # noqa: BLE001 - no pp dimension
                return cid
            prs = tuple(self.layout.group_of(me, "pp"))
            if peer in prs:
                self.recorder.add_communicator(pid, prs, kind="pp")
                return pid
        return cid


# ---------------------------------------------------------------------- handlers


_time_ns = time.time_ns


def _run(orig: Callable, args: tuple, kwargs: dict) -> Any:
    _tls.depth = getattr(_tls, "depth", 0) + 1
    try:
        with _below():
            return orig(*args, **kwargs)
    finally:
        _tls.depth -= 1


def _issue(lg: CommOpsLogger, orig: Callable, args: tuple, kwargs: dict, cuda: bool, is_async: bool,
           entries: list[tuple[str, str, int | None, int]]) -> Any:
    """Call ``orig`` and record ``entries`` = [(comm_id, op, peer, nbytes)] issued together."""
    rec = lg.recorder
    if cuda:
        ev0 = lg._cuda.event()
    start = time.time_ns()
    if not cuda and not is_async:  # in flight while the call blocks: a hang dump shows it 'started'
        keys = [rec.open_sync(cid, op, peer, nbytes, start) for cid, op, peer, nbytes in entries]
        out = _run(orig, args, kwargs)
        end = time.time_ns()
        for key in keys:
            rec.close_sync(key, end)
        return out
    out = _run(orig, args, kwargs)
    returned = time.time_ns()   # free from here until wait() (gloo's batch_isend_irecv can block in the call)
    handles = [rec.begin(cid, op, peer=peer, nbytes=nbytes, start_ns=start) for cid, op, peer, nbytes in entries]
    if cuda:
        box: list = []
        for h in handles:
            h.resolver = lg._cuda.resolver(ev0, box)
        if not is_async:
            box.append(lg._cuda.event())
            return out
        end_fn = lambda: box.append(lg._cuda.event())  # noqa: E731 - first wait() wins
        if isinstance(out, list):
            return [TimedWork(w, handles, end_fn) for w in out]
        return finish_on_completion(out, handles, end_fn)
    for h in handles:
        h.return_ns = returned
    if isinstance(out, list):  # batch_isend_irecv: one work per operator unless coalesced
        if len(out) == len(handles):
            return [finish_on_completion(w, [h], None) for w, h in zip(out, handles)]
        if len(out) == 1:
            return [finish_on_completion(out[0], handles, None)]
        return [finish_on_completion(w, handles if i == len(out) - 1 else [], None) for i, w in enumerate(out)]
    return finish_on_completion(out, handles, None)


_NOTHING = object()
_C10D = "torch.distributed.distributed_c10d"


def _p2p_op_property(wrappers: dict[Callable, "_Wrapper"]) -> property:
    """``P2POp.op`` while the logger is enabled: the instance keeps torch's own ``isend``/``irecv``
    (what ``batch_isend_irecv`` tests with ``is``, and what is left once the logger is disabled),
    and reading it outside a wrapped call hands out the logging wrapper, so that code calling
    ``p.op(...)`` itself (``torch.distributed.pipelining``'s ``_batch_p2p``) is logged too."""

    def get(p2p: Any) -> Any:
        f = p2p.__dict__.get("op")
        if _ACTIVE is not None and not _tls.depth:
            w = wrappers.get(f)
            # torch's own module (batch_isend_irecv called by send_object_list...) tests `is isend`
            if w is not None and sys._getframe(1).f_globals.get("__name__") != _C10D:
                return w
        return f

    def set_(p2p: Any, f: Any) -> None:
        p2p.__dict__["op"] = f.__wrapped__ if isinstance(f, _Wrapper) else f

    return property(get, set_)


def _is_wrapper(f: Any) -> bool:
    """Whether ``f`` is one of the logger's wrappers (a :class:`_Wrapper` or a collective's closure)."""
    return isinstance(f, _Wrapper) or getattr(f, "_holmes_wrapper", False) is True


def _collective_wrapper(orig: Callable, name: str) -> Callable:
    """The stand-in of a collective: a plain function that passes the call through when no logger
    is active or inside another wrapped call, and logs it otherwise (a synchronous CPU call on the
    fast path, the rest through :func:`_issue`).

    The fast path, per operator: the tensor's ``nbytes``/``is_cuda``, the communicator's cache
    entry, two clock reads, two ``next`` on C counters (op_index, seq), one packed row held in the
    in-flight dict while the call blocks (a hang dump shows it 'started') and appended to the
    buffer when it returns; no lock, no logging call, no formatting. The thread's nesting depth is
    not raised around torch's own collectives (they never call back into the ``torch.distributed``
    namespace); a function from elsewhere (another tool's wrapper) goes through :func:`_issue`.
    """
    op, gpos, apos, tpos, sizing = _COLL_SPECS[name]
    opk = _op_key(_OP_CODE[op], -1)
    gi, gname = gpos
    ai, aname = apos if apos else (10**6, "")
    ti, tname = tpos if tpos else (10**6, "")
    foreign = getattr(orig, "__module__", None) != "torch.distributed.distributed_c10d"

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        lg = _ACTIVE
        if lg is None or _tls.depth:
            return orig(*args, **kwargs)
        n = len(args)
        group = args[gi] if n > gi else kwargs.get(gname)
        is_async = args[ai] if n > ai else kwargs.get(aname, False)
        t = args[ti] if n > ti else kwargs.get(tname)
        if sizing == "one":
            try:
                nbytes = t.nbytes
                cuda = t.is_cuda
            except AttributeError:
                nbytes, cuda = nbytes_of(t), is_cuda(t)
        else:
            nbytes, cuda = (nbytes_of_list(t) if sizing == "list" else 0), is_cuda(t)
        if _coalescing and (group if group is not None else default_group()) in _coalescing:
            return orig(*args, **kwargs)  # deferred by a _coalescing_manager (see _coalescing)
        try:
            seq = lg._seq_of.get(group)
        except TypeError:  # an unhashable group
            seq = None
        if seq is None or cuda or foreign:
            return _issue(lg, orig, args, kwargs, cuda, bool(is_async), [(lg.comm_of(group)[0], op, None, nbytes)])
        rec = lg._rec
        start = _time_ns()
        key = next(seq)  # comm << 40 | seq: unique, the in-flight key
        head = (next(rec._index), key, opk, nbytes, start)
        inflight = rec._inflight
        inflight[key] = head
        if _excluded(_AUTOGRAD_CPU):  # already below autograd (inference mode)
            out = orig(*args, **kwargs)
        else:  # below autograd, as _below() but cheaper (0.25 against 0.45 us): a CPU collective
            _exclude(_AUTOGRAD_CPU, True)
            try:
                out = orig(*args, **kwargs)  # an exception leaves it in flight (close ends it, a dump shows it)
            finally:
                _exclude(_AUTOGRAD_CPU, False)
        if is_async:
            return async_issued(rec, out, key, head)
        end = _time_ns()
        if inflight.pop(key, None) is not None:  # (None: dumped meanwhile)
            done = rec._done
            done.append(head + ((end if end > start else start),))
            if len(done) >= rec.flush_every:
                rec.flush()
        return out

    functools.update_wrapper(wrapper, orig)
    wrapper._holmes_wrapper = True  # type: ignore[attr-defined]
    return wrapper


def _p2p_handler(name: str) -> Callable:
    op, is_async, peer_name, gpeer_name = _P2P_SPECS[name]

    def handler(lg: CommOpsLogger, orig: Callable, args: tuple, kwargs: dict) -> Any:
        t = arg(args, kwargs, 0, "tensor")
        group = arg(args, kwargs, 2, "group")
        peer = global_peer(group, arg(args, kwargs, 1, peer_name), arg(args, kwargs, 4, gpeer_name))
        if op == "recv" and peer is None and not is_async:  # recv from any source: peer known after
            start = time.time_ns()
            src = _run(orig, args, kwargs)
            end = time.time_ns()
            cid = lg._p2p_comm(group, src)
            lg.recorder.record(cid, op, peer=src, nbytes=nbytes_of(t), start_ns=start, end_ns=end)
            return src
        cid = lg._p2p_comm(group, peer)
        return _issue(lg, orig, args, kwargs, is_cuda(t), is_async, [(cid, op, peer, nbytes_of(t))])

    return handler


def _batch_handler(lg: CommOpsLogger, orig: Callable, args: tuple, kwargs: dict) -> Any:
    ops = arg(args, kwargs, 0, "p2p_op_list")
    try:
        entries = []
        for p in ops:
            f = p.op.__wrapped__ if isinstance(p.op, _Wrapper) else p.op
            p.op = f  # torch tests `p.op is isend` against the original function
            kind = "send" if getattr(f, "__name__", "") == "isend" else "recv"
            peer = int(p.peer) if p.peer is not None else None
            entries.append((lg._p2p_comm(p.group, peer), kind, peer, nbytes_of(p.tensor)))
        cuda = is_cuda(ops[0].tensor) if ops else False
    except (AttributeError, TypeError, IndexError):
        return _run(orig, args, kwargs)  # let torch report the malformed list
    return _issue(lg, orig, args, kwargs, cuda, True, entries)


def enable(out_dir: str | os.PathLike[str], **kwargs: Any) -> CommOpsLogger:
    """Create a :class:`CommOpsLogger` for ``out_dir`` and enable it (keyword arguments as there).

    Examples
    --------
    >>> import holmes.logger                                 # doctest: +SKIP
    >>> lg = holmes.logger.enable("job-dir", layout=layout)  # doctest: +SKIP
    """
    return CommOpsLogger(out_dir, **kwargs).enable()
