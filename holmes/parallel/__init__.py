"""Where per-rank work runs: in this process, or on a Dask cluster next to the logs.

The full-job work (``holmes detect`` on every rank, the persistent analysis, ``holmes train``)
is a *map* over ranks (read a rank's log, compute its features or a small summary) and a *reduce*
(merge the summaries into the job's, e.g. :class:`holmes.detect.JobContext`). An
:class:`Executor` runs both:

* :class:`InProcess` (the default, ``scheduler=None``): in this process, as one pass;
* :class:`DaskExecutor` (``scheduler="tcp://host:8786"`` or a ``dask.distributed.Client``):
  each task gets the job directory's *path* and a list of ranks and reads those logs itself on
  its worker (the directory must be visible to the workers at the same path, e.g. a shared file
  system); only summaries, models and results travel. The reduce is a tree of merge tasks on the
  cluster, and its result stays there (a future) for the tasks that need it.

The merges Holmes uses are exact (integer sums, unions), so in-process and distributed runs give
the same results bit for bit, whatever the grouping.

``dask.distributed`` is an optional extra (``pip install holmes-localize[dask]``), imported only
when a scheduler is given: ``import holmes`` never imports it. A worker lost mid-run is replaced by
the cluster, which reruns its tasks (they only read files); when the cluster gives up (the same
task lost its worker several times) or cannot be reached, a :class:`ParallelError` says so.
An exception raised by a task (a :class:`~holmes.HolmesError` about a rank's log) is re-raised as is.

Examples
--------
>>> ex = get_executor(None)
>>> ex
InProcess()
>>> list(ex.map(lambda ranks, k: [r * k for r in ranks], [0, 1, 2, 3], 10))
[[0, 10, 20, 30]]
>>> ex.fetch(ex.map_reduce(lambda ranks: sum(ranks), range(5), lambda *parts: sum(parts)))
10
>>> split_items(list(range(7)), 3)
[[0, 1, 2], [3, 4, 5], [6]]
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from holmes.errors import ConfigError, HolmesError

__all__ = ["Executor", "InProcess", "DaskExecutor", "ParallelError", "get_executor", "split_items"]

log = logging.getLogger(__name__)


class ParallelError(HolmesError):
    """The distributed run failed for a reason of the cluster (a worker lost too often, a scheduler
    unreachable), not of the job's logs."""


def split_items(items: Sequence[Any], size: int) -> list[list[Any]]:
    """``items`` in consecutive chunks of ``size`` (the last may be shorter), order kept."""
    size = max(1, int(size))
    return [list(items[i:i + size]) for i in range(0, len(items), size)]


class Executor:
    """Runs a function over chunks of items (ranks) and merges results; see the module docstring.

    ``map(fn, items, *args)`` yields ``fn(chunk, *args)`` for consecutive chunks of ``items`` in
    order; ``map_reduce(fn, items, merge, *args)`` is ``merge(*[fn(chunk, *args) ...])`` as a
    handle (the value in process, a future on a cluster) that ``map`` and ``map_reduce`` accept as
    an argument; ``fetch(handle)`` gives its value; ``share(obj)`` makes a handle of a local object.
    """

    #: number of workers (1 in process)
    workers: int = 1

    def map(self, fn: Callable[..., Any], items: Sequence[Any], *args: Any, chunk: int | None = None
            ) -> Iterator[Any]:
        raise NotImplementedError

    def map_reduce(self, fn: Callable[..., Any], items: Sequence[Any], merge: Callable[..., Any], *args: Any,
                   chunk: int | None = None) -> Any:
        raise NotImplementedError

    def fetch(self, handle: Any) -> Any:
        return handle

    def share(self, obj: Any) -> Any:
        return obj

    def submit(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        """``fn(*args, **kw)`` as a handle (handles in ``args``, also inside a list, are passed as their
        values): in process the value itself, on a cluster a future whose value stays on its worker."""
        return fn(*args, **kw)

    def release(self, handle: Any) -> None:
        """Forget ``handle``'s value where it is held (a worker drops a task's result)."""

    @property
    def distributed(self) -> bool:
        """Whether tasks run in other processes (they then read the job from its path)."""
        return False

    def close(self) -> None:
        """Release what this executor opened (a client it connected itself)."""

    def __enter__(self) -> "Executor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class InProcess(Executor):
    """Everything in this process: ``map`` calls ``fn`` once per chunk (default: one item per
    chunk, so a caller can stream), ``map_reduce`` calls ``fn`` once on all items (no merge)."""

    def map(self, fn: Callable[..., Any], items: Sequence[Any], *args: Any, chunk: int | None = None
            ) -> Iterator[Any]:
        items = list(items)
        for part in split_items(items, chunk or max(len(items), 1)):
            yield fn(part, *args)

    def map_reduce(self, fn: Callable[..., Any], items: Sequence[Any], merge: Callable[..., Any], *args: Any,
                   chunk: int | None = None) -> Any:
        return fn(list(items), *args)

    def __repr__(self) -> str:
        return "InProcess()"


def _cluster_errors() -> tuple[type[BaseException], ...]:
    """The exceptions by which dask.distributed reports a lost worker or an unreachable cluster."""
    from distributed.comm.core import CommClosedError
    from distributed.scheduler import KilledWorker

    import asyncio
    import concurrent.futures

    return (KilledWorker, CommClosedError, OSError, asyncio.TimeoutError, concurrent.futures.CancelledError,
            asyncio.CancelledError)


class DaskExecutor(Executor):
    """Tasks on a Dask cluster (``client``: a ``dask.distributed.Client``).

    Parameters
    ----------
    client : distributed.Client
        A connected client; see :func:`get_executor` to connect from an address.
    own_client : bool, default False
        Close the client in :meth:`close` (when :func:`get_executor` opened it).
    in_flight : int, optional
        Tasks of a ``map`` on the cluster at a time, the one being consumed included (default
        ``2 x workers + 1``: each worker runs one and has the next queued, and one result is on its
        way to the client). With ``max_chunk`` it bounds the results held on the workers (and the
        client) to ``in_flight x max_chunk`` items' results, whatever the size of the job.
    max_chunk : int, default 64
        Items (ranks) per ``map`` task at most, when the caller gives no ``chunk``: a task's result
        (e.g. 64 ranks' scored tables, ~10 MB at 2,500 ops a rank) is what a worker holds per task.
    """

    #: default ``max_chunk``: ranks per ``map`` task at most (see the class docstring)
    MAX_MAP_CHUNK = 64

    def __init__(self, client: Any, *, own_client: bool = False, in_flight: int | None = None,
                 max_chunk: int | None = None) -> None:
        self.client = client
        self.own_client = own_client
        try:
            self.workers = max(1, len(client.scheduler_info(n_workers=-1).get("workers", {})))
        except TypeError:  # older distributed: no n_workers argument
            self.workers = max(1, len(client.scheduler_info().get("workers", {})))
        self.in_flight = max(1, in_flight if in_flight is not None else 2 * self.workers + 1)
        self.max_chunk = max(1, int(max_chunk if max_chunk is not None else self.MAX_MAP_CHUNK))

    @property
    def distributed(self) -> bool:
        return True

    def _chunk(self, n: int, chunk: int | None, per_worker: int, cap: int = 512) -> int:
        return chunk if chunk else max(1, min(cap, math.ceil(n / (per_worker * self.workers))))

    def _result(self, future: Any, what: str) -> Any:
        try:
            return future.result()
        except HolmesError:
            raise
        except _cluster_errors() as exc:
            raise ParallelError(f"the Dask cluster failed while {what}: {type(exc).__name__}: {exc} "
                                f"(a worker was lost too often or the scheduler is unreachable; rerun, or run "
                                f"without --scheduler)") from exc

    def map(self, fn: Callable[..., Any], items: Sequence[Any], *args: Any, chunk: int | None = None
            ) -> Iterator[Any]:
        """``fn(chunk, *args)`` for chunks of at most ``max_chunk`` items, in order, streamed: at most
        ``in_flight`` tasks are on the cluster at a time; a result is fetched, its future released
        (the worker drops it) and only then yielded, and the next task is submitted as one is taken."""
        parts = split_items(list(items), self._chunk(len(items), chunk, 8, self.max_chunk))
        name = getattr(fn, "__name__", fn)
        pending: deque = deque()
        todo = iter(parts)
        try:
            for part in todo:
                pending.append(self.client.submit(fn, part, *args, pure=False))
                if len(pending) >= self.in_flight:
                    break
            while pending:
                f = pending.popleft()
                value = self._result(f, f"running {name}")
                f.release()  # the worker forgets the result now, not when the future is collected
                del f
                nxt = next(todo, None)
                if nxt is not None:
                    pending.append(self.client.submit(fn, nxt, *args, pure=False))
                yield value
                del value  # not held here while the next result is fetched
        finally:
            for f in pending:  # a consumer that stopped early (or an error): drop the rest
                f.cancel()
            pending.clear()

    def map_reduce(self, fn: Callable[..., Any], items: Sequence[Any], merge: Callable[..., Any], *args: Any,
                   chunk: int | None = None, fan_in: int = 8) -> Any:
        parts = split_items(list(items), self._chunk(len(items), chunk, 4, self.max_chunk))
        level = [self.client.submit(fn, p, *args, pure=False) for p in parts]
        while len(level) > 1:  # a tree of merges, in the order of the chunks
            level = [self.client.submit(merge, *group, pure=False) if len(group) > 1 else group[0]
                     for group in split_items(level, max(2, fan_in))]
        if not level:
            return self.client.submit(merge, pure=False)
        return level[0]

    def fetch(self, handle: Any) -> Any:
        from distributed import Future

        return self._result(handle, "fetching a result") if isinstance(handle, Future) else handle

    def submit(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        return self.client.submit(fn, *args, pure=False, **kw)

    def release(self, handle: Any) -> None:
        from distributed import Future

        if isinstance(handle, Future):
            handle.release()

    def share(self, obj: Any) -> Any:
        # a task returning the object (not a scatter): the cluster can recompute it if its worker is lost
        return self.client.submit(_value, obj, pure=False)

    def close(self) -> None:
        if self.own_client:
            self.client.close()

    def __repr__(self) -> str:
        return f"DaskExecutor({self.client!r}, workers={self.workers})"


def _value(obj: Any) -> Any:
    return obj


def get_executor(scheduler: Any = None) -> Executor:
    """An :class:`Executor` for ``scheduler``.

    Parameters
    ----------
    scheduler : None, str, distributed.Client or Executor
        None: :class:`InProcess`. A string: the address of a Dask scheduler (``tcp://host:8786``),
        connected to here and closed by :meth:`Executor.close`. A ``dask.distributed.Client``: used
        as is (not closed). An :class:`Executor`: returned as is.

    Raises
    ------
    ConfigError
        When ``distributed`` is not installed (``pip install holmes-localize[dask]``) or
        ``scheduler`` is of another type.
    ParallelError
        When the scheduler cannot be reached.
    """
    if scheduler is None:
        return InProcess()
    if isinstance(scheduler, Executor):
        return scheduler
    try:
        import distributed
    except ImportError:
        raise ConfigError("--scheduler needs dask.distributed: pip install 'holmes-localize[dask]'") from None
    if isinstance(scheduler, distributed.Client):
        return DaskExecutor(scheduler)
    if isinstance(scheduler, str):
        if not scheduler.strip():
            raise ConfigError("--scheduler: empty address (expected e.g. tcp://host:8786)")
        try:
            client = distributed.Client(scheduler, timeout="20s")
        except (OSError, TimeoutError) as exc:
            raise ParallelError(f"--scheduler {scheduler}: cannot reach the Dask scheduler: {exc}") from None
        log.info("connected to the Dask scheduler at %s", scheduler)
        return DaskExecutor(client, own_client=True)
    raise ConfigError(f"scheduler must be None, an address or a dask.distributed.Client, not {type(scheduler).__name__}")

