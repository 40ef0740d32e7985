"""Notice the parts a live job lands: filesystem events when ``watchdog`` is installed, polling otherwise.

:class:`PartsFollower` keeps, per rank, the highest complete part index seen (``latest``) and hands
out the newly landed ``(rank, index)`` pairs. With ``watchdog`` (the extra ``holmes[watch]``) the
operating system reports each part renamed into place; a slow rescan still runs every
``rescan`` seconds, so an event lost (a rank directory created after the observer started, an
overflowing event queue) only delays a part. Without ``watchdog``, every poll probes each rank's
next two part names (one ``stat`` each: a part arriving one ahead of its predecessor is still
seen) and lists the followed ranks' directories in full, each from the first part it has not
counted (its consumer, which lists the directory itself, may have read further: a part it read
first still counts as landed, or every wait for all ranks' parts would run to its timeout).

The follower never writes into the job directory. Memory is one integer per rank.

Examples
--------
>>> import tempfile, pathlib
>>> from holmes.io.parts import write_part
>>> from holmes.io.schema import ops_table
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> f = PartsFollower(d, world_size=2, use_watchdog=False)
>>> f.poll(0.0)
[]
>>> t = ops_table(rank=[1], iteration=[0], op_index=[0], comm_id=["dp-0"], seq=[0], op=["all_reduce"],
...               peer=[None], nbytes=[4], start_ns=[0], end_ns=[5])
>>> _ = write_part(d / "ranks" / "rank-00001", 0, t)
>>> f.poll(0.0), f.latest.tolist()
([(1, 0)], [-1, 0])
>>> f.close()
"""

from __future__ import annotations

import logging
import os
import queue
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from holmes.io.parts import list_parts, part_filename, part_index, rank_of_entry, rank_parts_dirname

__all__ = ["PartsFollower", "watchdog_available"]

log = logging.getLogger(__name__)


def watchdog_available() -> bool:
    """Whether the optional ``watchdog`` package can be imported."""
    try:
        import watchdog.observers  # noqa: F401
    except ImportError:
        return False
    return True


class PartsFollower:
    """Which parts of a live job landed since the last :meth:`poll`.

    Parameters
    ----------
    job_dir : path-like
        The job directory (``ranks/`` need not exist yet).
    world_size : int
    follow : iterable of int
        Ranks whose directories are listed in full at every poll (the pivots).
    use_watchdog : bool, optional
        Default: use ``watchdog`` when installed.
    rescan : float
        With ``watchdog``, seconds between the safety rescans.
    late_after : float
        A part missing this long after a later one of the same rank landed is stepped over.
    """

    def __init__(self, job_dir: str | os.PathLike[str], world_size: int, *, follow: Iterable[int] = (0,),
                 use_watchdog: bool | None = None, rescan: float = 5.0, late_after: float = 30.0) -> None:
        self.ranks_dir = Path(job_dir) / "ranks"
        self.world_size = int(world_size)
        self.follow = sorted(set(int(r) for r in follow))
        #: per rank, the highest part index landed with every one before it (or stepped over)
        self.latest = np.full(self.world_size, -1, dtype=np.int64)
        self._ahead: dict[int, dict[int, float]] = {}  # rank -> parts landed past a gap -> when seen
        self.late_after = float(late_after)
        self.last_landed = time.monotonic()
        self._events: queue.SimpleQueue[tuple[int, int]] = queue.SimpleQueue()
        self._observer = None
        self._want_watchdog = watchdog_available() if use_watchdog is None else bool(use_watchdog)
        self.rescan = float(rescan)
        self._last_scan = 0.0
        #: followed rank -> the first part index its consumer still needs (listed from there, or
        #: from the first part not counted in ``latest`` when that is lower)
        self.next_needed: dict[int, int] = {}

    @property
    def mode(self) -> str:
        """``"watchdog"`` once filesystem events are followed, else ``"polling"``."""
        return "watchdog" if self._observer is not None else "polling"

    def _start_observer(self) -> None:
        if self._observer is not None or not self._want_watchdog or not self.ranks_dir.is_dir():
            return
        from watchdog.events import FileSystemEventHandler
        from watchdog.observers import Observer

        events = self._events

        class _Handler(FileSystemEventHandler):
            def _note(self, path: str) -> None:
                p = Path(path)
                i = part_index(p.name)
                r = rank_of_entry(p.parent.name) if i is not None else None
                if r is not None:
                    events.put((r, i))

            def on_moved(self, event) -> None:  # a part renamed into place
                self._note(os.fsdecode(event.dest_path))

            def on_created(self, event) -> None:  # a writer that writes parts directly
                if not event.is_directory:
                    self._note(os.fsdecode(event.src_path))

        obs = Observer()
        obs.schedule(_Handler(), str(self.ranks_dir), recursive=True)
        obs.daemon = True
        obs.start()
        self._observer = obs
        log.info("following %s with filesystem events (watchdog)", self.ranks_dir)

    def _probe(self, ranks: Iterable[int]) -> list[tuple[int, int]]:
        """Stat the next two part names of each rank (polling)."""
        out = []
        for r in ranks:
            d = self.ranks_dir / rank_parts_dirname(r)
            nxt = int(self.latest[r]) + 1
            while os.path.exists(d / part_filename(nxt)):
                out.append((r, nxt))
                nxt += 1
            if os.path.exists(d / part_filename(nxt + 1)):  # one arrived ahead of its predecessor
                out.append((r, nxt + 1))
        return out

    def _scan(self) -> list[tuple[int, int]]:
        # a followed rank is listed from the first part this follower has not counted, even when its
        # consumer already read further: the consumer lists the directory itself, so a part landing
        # between this scan and its listing is read there first and must still count as landed
        found = [(r, p.index) for r in self.follow
                 for p in list_parts(self.ranks_dir / rank_parts_dirname(r),
                                     min(self.next_needed.get(r, 0), int(self.latest[r]) + 1))]
        others = [r for r in range(self.world_size) if r not in self.follow]
        return found + self._probe(others)

    def poll(self, timeout: float = 0.0) -> list[tuple[int, int]]:
        """The ``(rank, part index)`` pairs landed since the last call, waiting up to ``timeout``
        seconds for the first one (polling mode sleeps in short steps)."""
        self._start_observer()
        deadline = time.monotonic() + max(0.0, float(timeout))
        new: list[tuple[int, int]] = []
        while True:
            now = time.monotonic()
            if self._observer is None or now - self._last_scan >= self.rescan:
                self._last_scan = now
                new += self._scan()
            while True:
                try:
                    new.append(self._events.get_nowait())
                except queue.Empty:
                    break
            fresh = self._accept(new)
            if fresh or time.monotonic() >= deadline:
                return fresh
            if self._observer is not None:
                try:
                    new.append(self._events.get(timeout=min(0.2, max(0.0, deadline - time.monotonic()))))
                except queue.Empty:
                    pass
            else:
                time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))

    def _accept(self, new: list[tuple[int, int]]) -> list[tuple[int, int]]:
        fresh = []
        seen = set()
        now = time.monotonic()
        for r, i in new:
            if not 0 <= r < self.world_size or (r, i) in seen:
                continue
            seen.add((r, i))
            if i > self.latest[r] and i not in self._ahead.get(r, {}) or r in self.follow:
                fresh.append((r, i))
            if i > self.latest[r]:
                self._ahead.setdefault(r, {}).setdefault(i, now)
        for r in {r for r, _ in fresh}:
            self._advance(r, now)
        if fresh:
            self.last_landed = now
        new.clear()
        return sorted(fresh)

    def _advance(self, r: int, now: float) -> None:
        """Move the rank's contiguous index over the parts landed; a gap older than ``late_after``
        (a part that never came) is stepped over."""
        ahead = self._ahead.get(r)
        while ahead:
            nxt = int(self.latest[r]) + 1
            if nxt in ahead:
                del ahead[nxt]
                self.latest[r] = nxt
            elif now - min(ahead.values()) >= self.late_after:
                log.warning("rank %d: part %d never landed (part %d did %.1f s ago); stepped over", r, nxt,
                            min(ahead), now - min(ahead.values()))
                self.latest[r] = min(ahead) - 1
            else:
                break
        if not ahead:
            self._ahead.pop(r, None)

    def reached(self, index: int) -> int:
        """How many ranks have landed part ``index`` (and those before it, or gave up on them)."""
        n = int(np.count_nonzero(self.latest >= index))
        return n + sum(1 for r, a in self._ahead.items() if self.latest[r] < index and index in a)

    def behind(self, index: int, limit: int = 16) -> list[int]:
        """Up to ``limit`` ranks that have not landed part ``index`` yet."""
        return [int(r) for r in np.flatnonzero(self.latest < index)
                if index not in self._ahead.get(int(r), {})][:limit]

    def close(self) -> None:
        """Stop following (the watchdog observer thread, if any)."""
        obs, self._observer = self._observer, None
        self._want_watchdog = False
        if obs is not None:
            obs.stop()
            obs.join(timeout=5)
