"""Watch a live job: follow its parts, monitor the pivot, and run the matching analysis on an event.

The loop of :class:`Watcher` (one thread; nothing but the window is held in memory):

1. :class:`~holmes.watch.follower.PartsFollower` notices the parts that landed (filesystem events
   or polling);
2. the pivot's parts are read in index order (a part that lands ahead of its predecessor waits
   for it up to ``late_after`` seconds, then the missing one is skipped with a finding; an
   unreadable part is skipped with a finding), each complete iteration's duration (the gap between
   consecutive "last operator ended" instants, as :func:`holmes.io.derive_iterations`) goes to the
   streaming :class:`~holmes.detect.IterationMonitor`;
3. the first irregular iteration of an episode schedules the irregular analysis (over the window
   up to it: the iterations since the previous episode searched, those before as context, the
   ``search_from`` of :class:`~holmes.localize.LocalizeParams`; an episode opening before the
   monitor's first window is full is judged once it is, over the job so far); an episode whose
   iterations stay slow (against the reference before it) for ``persistent_after`` iterations
   schedules the persistent one (``"straggler"``; over the slow stretch, or, before the monitor's
   first window is full, once it is, over the job so far: a burst of a few iterations in a job
   whose noise is not known yet is no straggler), as does, once, the first full monitor window
   (a straggler slow from the start shows no irregularity); ``recover_after`` regular iterations end
   the episode (``"recovered"``); the window is **looked at again** -- every analysis ``holmes
   localize`` runs, over the last ``window`` iterations -- ``reevaluate_every`` iterations after
   the last analysis, in an episode sooner (after ``recover_after``) when the rolling monitor
   flags a new burst (looks start once ``monitor_window`` iterations were measured: a look judges
   the window against the job's own noise), and once more when the job ends; a look is an
   ``"irregular"`` event only when it names a culprit or a hang not already reported, so a long
   noisy episode never hides a later fault; a dump (``job.json``'s or a sidecar's ``dump``)
   schedules the hang
   analysis, and no part at all for ``hang_after`` seconds emits a ``"hang"`` stall event;
4. a scheduled analysis runs once every rank has landed the part holding its iteration, or after
   ``settle`` seconds (the ranks still missing are named in the event's findings): it builds a
   :class:`~holmes.watch.window.WindowJob` over the last ``window`` iterations and calls
   :class:`holmes.localize.Localizer` with the matching ``analysis``.

Thresholds can change while it runs (:meth:`Watcher.apply_control`, or a ``control`` file
re-read when it changes or on :meth:`Watcher.reload_control`: :mod:`holmes.watch.control`);
``metrics`` (a :class:`~holmes.watch.metrics.WatchMetrics`) sees every event before it is
yielded.

The job ends for the watcher when every rank's logger closed (sidecars), after ``idle_exit``
seconds without a new part, at :meth:`Watcher.stop`, or after one pass with ``once=True``; the
analyses still scheduled then run at once.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from holmes.detect.monitor import DEFAULT_DELTA, IterationMonitor
from holmes.errors import ConfigError, HolmesError, JobError
from holmes.io.parts import Part, list_parts, rank_parts_dirname, read_part
from holmes.localize import Localizer, LocalizeParams
from holmes.watch.control import ControlFile
from holmes.watch.events import WatchEvent
from holmes.watch.follower import PartsFollower
from holmes.watch.window import WindowJob, job_meta

__all__ = ["Watcher", "watch"]

log = logging.getLogger(__name__)

_EVENT_OF = {"irregular": "irregular", "persistent": "straggler", "hang": "hang", "all": "irregular"}
_NAMED = ("culprit", "hang")  # the verdicts a re-evaluation emits
_PARTS_PER_LOOP = 16  # pivot parts read between two looks at the events due
_MIN_WINDOW = 10  # iterations an irregular analysis searches at least (the previous episode may then be in it)


class Watcher:
    """Follow a live job directory and emit :class:`~holmes.watch.WatchEvent` objects.

    Parameters
    ----------
    job : path-like
        The job directory (live parts or finished files).
    pivot : int, default 0
        The monitored rank.
    window : int, default 100
        Iterations each analysis sees (the last ``window`` up to the event's iteration).
    interval : float, default 0.5
        Seconds between polls (with ``watchdog``: the longest wait for an event).
    delta : float, default 1.1
        The irregularity rule's delta (:class:`holmes.detect.IrregularityRule`).
    monitor_window : int, default 20
        Iterations of the streaming monitor's reference.
    settle : float, default 5.0
        Longest wait, after the pivot's part, for every rank's part holding the same iteration.
    late_after : float, optional
        How long a missing pivot part is waited for once a later one landed (default ``settle``).
    persistent_after, recover_after : int, default 5
        Slow iterations that make an episode a straggler; regular ones that end it.
    straggler_check : bool, default True
        Run the persistent analysis once when the monitor's first window is full.
    reevaluate_every : int, optional
        Iterations between two re-evaluations of an open episode (default ``monitor_window``; 0: never).
    hang_after : float, optional
        Emit a ``"hang"`` stall event when no part lands for this many seconds.
    idle_exit : float, optional
        Stop after this many seconds without a part.
    once : bool, default False
        Read what is there now, run the analyses due, and stop.
    use_watchdog : bool, optional
        Default: filesystem events when ``watchdog`` is installed, else polling.
    control : path-like, optional
        A control file (:mod:`holmes.watch.control`) applied at the start and whenever it changes.
    metrics : WatchMetrics, optional
        Observes every event (and reads the watcher's live figures when scraped).
    **localize_params
        Any :class:`~holmes.localize.LocalizeParams` field for the analyses (``detector``,
        ``top_k``, ``topology``...); ``analysis``, ``pivot`` and ``window`` are set per event.

    Examples
    --------
    >>> import tempfile
    >>> from holmes.simulate import run_simulation
    >>> from holmes.simulate.writer import write_result
    >>> res = run_simulation(tp=2, pp=1, dp=2, iterations=40, seed=2, faults=["gpu:3@spike:30*4"])
    >>> d = write_result(res, tempfile.mkdtemp() + "/job", parts=10)
    >>> [(e.event, e.iteration) for e in Watcher(d, once=True, detector="robust", straggler_check=False)]
    [('irregular', 30), ('recovered', 36)]
    """

    def __init__(self, job: str | os.PathLike[str], *, pivot: int = 0, window: int = 100, interval: float = 0.5,
                 delta: float = DEFAULT_DELTA, monitor_window: int = 20, settle: float = 5.0,
                 late_after: float | None = None, persistent_after: int = 5, recover_after: int = 5,
                 straggler_check: bool = True, reevaluate_every: int | None = None,
                 hang_after: float | None = None, idle_exit: float | None = None, once: bool = False,
                 use_watchdog: bool | None = None, control: str | os.PathLike[str] | None = None,
                 metrics: Any = None, **localize_params: Any) -> None:
        if not isinstance(job, (str, os.PathLike)):
            raise ConfigError(f"watch: job must be a path, not {type(job).__name__}")
        self.path = Path(job)
        if not self.path.is_dir():
            raise JobError(f"{self.path}: not a job directory")
        for name, v in (("window", window), ("monitor_window", monitor_window),
                        ("persistent_after", persistent_after), ("recover_after", recover_after)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ConfigError(f"watch: {name} must be a positive integer, not {v!r}")
        for name, f in (("interval", interval), ("settle", settle), ("late_after", late_after),
                        ("hang_after", hang_after), ("idle_exit", idle_exit)):
            if f is not None and not (isinstance(f, (int, float)) and np.isfinite(f) and f >= 0):
                raise ConfigError(f"watch: {name} must be a number of seconds >= 0, not {f!r}")
        if reevaluate_every is None:
            reevaluate_every = monitor_window
        if isinstance(reevaluate_every, bool) or not isinstance(reevaluate_every, (int, np.integer)) or \
                reevaluate_every < 0:
            raise ConfigError(f"watch: reevaluate_every must be an integer >= 0, not {reevaluate_every!r}")
        self.reevaluate_every = int(reevaluate_every)
        self.pivot, self.window = int(pivot), int(window)
        self.interval, self.settle = float(interval), float(settle)
        self.late_after = self.settle if late_after is None else float(late_after)
        self.persistent_after, self.recover_after = int(persistent_after), int(recover_after)
        self.straggler_check, self.hang_after, self.idle_exit = bool(straggler_check), hang_after, idle_exit
        self.once, self.use_watchdog = bool(once), use_watchdog
        self.monitor = IterationMonitor(delta=delta, window=monitor_window)
        self.params = LocalizeParams(**{**localize_params, "pivot": self.pivot, "delta": self.monitor.delta})
        self._stop = threading.Event()
        self._meta: Any = None
        self._closed: dict[int, bool] | None = None
        self._meta_checked = 0.0
        self._meta_mtime: int | None = None
        self._follower: PartsFollower | None = None
        self._mode = "polling"
        self._last_episode_end = -1
        self._analysed: int | None = None  # the iteration of the last analysis scheduled
        self._looked: int | None = None  # the iteration of the last look (every analysis, the whole window)
        self._first = 0  # the pivot's first iteration measured
        self._last_named: tuple[int, str] | None = None  # (iteration, top device) of the last culprit event
        self._topology: Any = None
        # the pivot's stream
        self._next_part = 0
        self._held: dict[int, tuple[Part, float]] = {}
        self._fed = -1
        self._prev_end: int | None = None
        self._parts_seen: deque[tuple[int, int, int]] = deque(maxlen=2 * self.window + 64)
        # episodes and scheduled analyses
        self._episode: dict[str, Any] | None = None
        self._checked_straggler = not self.straggler_check
        self._hang_scheduled = False
        self._stalled = False
        self._pending: list[dict[str, Any]] = []
        self._ready: deque[WatchEvent] = deque()
        self._findings: deque[str] = deque(maxlen=32)
        # live settings
        self._recent: deque[float] = deque(maxlen=self.monitor.window)  # to rebuild the monitor on a new delta
        self.control = None if control is None else Path(control)
        self._control = None if control is None else ControlFile(control)
        self.metrics = metrics.bind(self) if metrics is not None and hasattr(metrics, "bind") else metrics
        if self.control is not None:
            self._check_control()

    def __repr__(self) -> str:
        return f"Watcher({str(self.path)!r}, pivot={self.pivot}, window={self.window})"

    # ------------------------------------------------------------------ public

    def __iter__(self) -> Iterator[WatchEvent]:
        return self.events()

    @property
    def follower_mode(self) -> str:
        """How parts were noticed: ``"watchdog"`` (filesystem events) or ``"polling"``."""
        return self._mode

    @property
    def last_iteration(self) -> int:
        """The pivot's last complete iteration read so far (-1 before the first)."""
        return self._fed

    @property
    def seconds_since_last_part(self) -> float | None:
        """Seconds since any rank's part last landed (None before the job was found)."""
        return None if self._follower is None else time.monotonic() - self._follower.last_landed

    def apply_control(self, settings: dict[str, Any]) -> None:
        """Change thresholds while running (the keys of :data:`holmes.watch.control.CONTROL_KEYS`,
        checked as a control file's). ``delta`` and ``monitor_window`` take effect from the next
        iteration, judged against the same recent history; the others at their next use."""
        from holmes.watch.control import apply_settings

        apply_settings(self, settings)

    def reload_control(self) -> None:
        """Re-read the control file at the next loop (safe from a signal handler or another thread)."""
        if self._control is not None:
            self._control.reload()

    def _check_control(self) -> None:
        if self._control is None:
            return
        try:
            settings = self._control.poll()
            if settings is not None:
                self.apply_control(settings)
        except (HolmesError, OSError, UnicodeDecodeError) as exc:
            self._finding(f"control file not applied: {exc}")

    def stop(self) -> None:
        """Ask the loop to end (from any thread or a callback); the scheduled analyses still run."""
        self._stop.set()

    def run(self, callback: Callable[[WatchEvent], Any]) -> int:
        """Call ``callback(event)`` for every event until the job ends or :meth:`stop`; returns
        how many events were emitted."""
        n = 0
        for ev in self.events():
            callback(ev)
            n += 1
        return n

    def start(self, callback: Callable[[WatchEvent], Any]) -> threading.Thread:
        """:meth:`run` in a daemon thread (platform code); :meth:`stop` ends it."""
        th = threading.Thread(target=self.run, args=(callback,), name="holmes-watch", daemon=True)
        th.start()
        return th

    def events(self) -> Iterator[WatchEvent]:
        """The events, as they happen, until the job ends (see the module's notes)."""
        try:
            while True:
                self._check_control()
                if self._load_meta():
                    self._follower_poll()
                    self._consume_pivot()
                    self._check_dump()
                    self._check_stall()
                ended = self._ended()
                if ended:
                    self._last_look()
                self._run_due(force=ended)
                while self._ready:
                    ev = self._ready.popleft()
                    if self.metrics is not None:
                        self.metrics.observe(ev)
                    yield ev
                if ended:
                    log.info("watch %s: stopped after iteration %d", self.path, self._fed)
                    return
                if self._meta is None:
                    self._stop.wait(self.interval)
        finally:
            if self._follower is not None:
                self._follower.close()

    # ------------------------------------------------------------------ job metadata and end

    def _load_meta(self) -> bool:
        now = time.monotonic()
        p = self.path / "job.json"
        try:
            mtime = p.stat().st_mtime_ns
        except FileNotFoundError:
            mtime = None
        due = self._meta is None or mtime != self._meta_mtime or now - self._meta_checked >= max(5.0, self.interval)
        if not due:
            return True
        self._meta_checked = now
        try:
            meta, closed = job_meta(self.path)
        except JobError as exc:
            if self._meta is None:
                if self.once:
                    raise
                log.info("watch %s: waiting for job.json or the ranks' sidecars (%s)", self.path, exc)
                return False
            return True
        self._meta, self._closed, self._meta_mtime = meta, closed, mtime
        if self._follower is None:
            self._follower = PartsFollower(self.path, meta.world_size, follow=(self.pivot,),
                                           use_watchdog=self.use_watchdog, rescan=max(5.0, 4 * self.interval),
                                           late_after=max(self.late_after, self.settle))
            if self.pivot >= meta.world_size:
                raise ConfigError(f"watch: pivot rank {self.pivot} is outside world_size {meta.world_size}")
            topo = self.path / "topology.json"
            if self.params.topology is None and topo.is_file():
                from holmes.topology.cluster import load_topology

                self._topology = load_topology(topo)
        return True

    def _ended(self) -> bool:
        if self._stop.is_set():
            return True
        if self.once:
            return not self._held
        if self._closed is not None and self._meta is not None and \
                len(self._closed) >= self._meta.world_size and all(self._closed.values()):
            return self._held == {} and not self._new_pivot_parts()
        if self.idle_exit is not None and self._follower is not None:  # idle, and caught up
            return time.monotonic() - self._follower.last_landed >= self.idle_exit and not self._held \
                and not self._new_pivot_parts()
        return False

    def _new_pivot_parts(self) -> bool:
        return bool(list_parts(self.path / "ranks" / rank_parts_dirname(self.pivot), self._next_part))

    # ------------------------------------------------------------------ the pivot's stream

    def _follower_poll(self) -> None:
        assert self._follower is not None
        self._follower.next_needed[self.pivot] = self._next_part
        self._follower.poll(0.0 if self.once or self._ready or self._held else self.interval)
        self._mode = self._follower.mode

    def _consume_pivot(self) -> None:
        d = self.path / "ranks" / rank_parts_dirname(self.pivot)
        now = time.monotonic()
        for p in list_parts(d, self._next_part):
            self._held.setdefault(p.index, (p, now))
        if not self._held and self._next_part == 0 and (self.path / "ranks" / f"{rank_parts_dirname(self.pivot)}.parquet").is_file():
            # a finished job written as single files: one "part" holding every iteration
            f = self.path / "ranks" / f"{rank_parts_dirname(self.pivot)}.parquet"
            self._held[0] = (Part(0, f, f.stat().st_size, 0), now)
        budget = _PARTS_PER_LOOP  # a watcher catching up still emits its events as it goes
        while self._held and budget:
            k = self._next_part
            if k in self._held:
                part, _ = self._held.pop(k)
                self._read_pivot_part(part)
                self._next_part = k + 1
                budget -= 1
                continue
            first = min(self._held)
            waited = now - self._held[first][1]
            if waited >= self.late_after or self.once:
                self._finding(f"rank {self.pivot}: part(s) {k}..{first - 1} missing {waited:.1f} s after part "
                              f"{first} landed; skipped")
                self._next_part = first
                continue
            break

    def _read_pivot_part(self, part: Part) -> None:
        try:
            t = read_part(part.path, self.pivot, columns=None)
        except HolmesError as exc:
            self._finding(f"{exc}; part skipped")
            return
        if "state" in t.column_names:  # a dump: its last iteration never ended (the hang analysis reads it)
            return
        if not t.num_rows:
            return
        it = t.column("iteration").to_numpy()
        end = t.column("end_ns").to_numpy(zero_copy_only=False)
        iters, inv = np.unique(it, return_inverse=True)
        last = np.full(len(iters), np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(last, inv, end.astype(np.int64))
        self._parts_seen.append((part.index, int(iters[0]), int(iters[-1])))
        for i, e in zip(iters.tolist(), last.tolist()):
            if i <= self._fed:
                continue  # a part that arrived after its iterations were skipped, or a repeat
            if self._prev_end is not None and i == self._fed + 1:
                d = float(e - self._prev_end)
                if d >= 0:
                    self._on_iteration(int(i), d, self.monitor.update(d), part.index)
                    self._recent.append(d)
            self._fed, self._prev_end = int(i), int(e)

    def _on_iteration(self, i: int, d: float, flagged: bool, part: int) -> None:
        ep = self._episode
        if self._analysed is None:
            self._analysed = self._first = i
        since = i - self._analysed
        # the job's noise is known once the monitor's window is full (a spike among four iterations
        # names a device that the job a few iterations on puts within its noise)
        full = i - self._first + 1 >= self.monitor.window
        if full:
            self._release_early(i, part)
        can_look = bool(self.reevaluate_every) and full
        if ep is None:
            if flagged:
                self._episode = {"start": i, "ref": self.monitor.reference, "slow": 1, "regular": 0,
                                 "straggler": False}
                self._analysed = i
                if full:
                    self._schedule("irregular", i, part)
                elif not any(j.get("early") for j in self._pending):  # one judges every early episode
                    self._schedule("irregular", i, part, early=True)
            elif not self._checked_straggler and self.monitor.n_seen >= self.monitor.window:
                self._checked_straggler = True
                self._analysed = i
                self._schedule("persistent", i, part, only_if_found=True)
            elif can_look and since >= self.reevaluate_every:
                # nothing stood out on the pivot, but the window may still hold a fault (a job read
                # whole compares every rank's cells): look as holmes localize would
                self._analysed = self._looked = i
                self._schedule(self._quiet_kind(), i, part, emit_if=_NAMED)
            return
        if can_look and (since >= self.reevaluate_every or (flagged and since >= self.recover_after)):
            # the episode again, as holmes localize would see the window now: a later fault is not hidden
            self._analysed = self._looked = i
            self._schedule("all", i, part, emit_if=_NAMED)
        if d > self.monitor.delta * ep["ref"]:
            ep["slow"] += 1
            ep["regular"] = 0
            if ep["slow"] >= self.persistent_after and not ep["straggler"]:
                ep["straggler"] = True
                if full:
                    self._schedule("persistent", i, part, lo=ep["start"])  # the slow stretch only
                else:  # as an early episode: the job's noise is not known yet; judged on the job so far
                    self._schedule("persistent", i, part, early=True)
        else:
            ep["regular"] += 1
            if ep["regular"] >= self.recover_after:
                # queued behind the episode's analyses: events come out in the order they happened
                self._pending.append({"kind": "emit", "event": WatchEvent(
                    "recovered", i, detail={"episode_start": ep["start"], "slow_iterations": ep["slow"]})})
                self._episode = None
                self._last_episode_end = i

    def _release_early(self, i: int, part: int | None) -> None:
        """The monitor's window is full at iteration ``i``: the early episodes' analysis is due, over
        the job so far (up to ``i``), as holmes localize would judge it now."""
        for job in self._pending:
            if job.get("early"):
                job.update(early=False, hi=i, part=part, since=time.monotonic())
                self._analysed = i  # it is the look at the job so far

    def _quiet_kind(self) -> str:
        """The analysis of a periodic look outside an episode: all of them on a job read whole,
        else the irregular one only (the persistent one would read every rank each time)."""
        world = self._meta.world_size if self._meta is not None else 0
        return "all" if self.params.full_read and world <= self.params.full_read else "irregular"

    def _last_look(self) -> None:
        """The job ended: look at its last window once more, as holmes localize would (unless the
        last look was at its last iteration already)."""
        if not self.reevaluate_every or self._analysed is None or self._looked == self._fed:
            return
        self._analysed = self._looked = self._fed
        self._schedule("all" if self._episode is not None else self._quiet_kind(), self._fed, None, emit_if=_NAMED)

    # ------------------------------------------------------------------ hangs

    def _check_dump(self) -> None:
        if self._hang_scheduled or self._meta is None or self._meta.dump is None:
            return
        self._hang_scheduled = True
        self._schedule("hang", self._fed if self._fed >= 0 else None, None)

    def _check_stall(self) -> None:
        f = self._follower
        if self.hang_after is None or f is None or self._fed < 0:
            return
        quiet = time.monotonic() - f.last_landed
        if quiet < self.hang_after:
            self._stalled = False
            return
        if self._stalled:
            return
        self._stalled = True
        top = int(f.latest.max())
        report = {"verdict": "stalled", "stalled_s": round(quiet, 1), "last_iteration": self._fed,
                  "last_part": top, "ranks_behind": f.behind(top), "ranks_behind_count": self._meta.world_size - f.reached(top)}
        self._pending.append({"kind": "emit", "event": WatchEvent("hang", self._fed, report,
                                                                  findings=tuple(self._take_findings()))})

    # ------------------------------------------------------------------ analyses

    def _schedule(self, kind: str, iteration: int | None, part: int | None, only_if_found: bool = False,
                  lo: int | None = None, emit_if: tuple[str, ...] | None = None, early: bool = False) -> None:
        """Queue an analysis (``early``: held until the monitor's window is full, :meth:`_release_early`)."""
        log.info("watch %s: %s analysis scheduled at iteration %s%s", self.path, kind, iteration, " (early)" * early)
        self._pending.append({"kind": kind, "iteration": iteration, "part": part, "since": time.monotonic(),
                              "only_if_found": only_if_found, "lo": lo, "emit_if": emit_if, "early": early,
                              "hi": None})
        self._run_due(force=False)  # already settled (every rank landed the part): run it now

    def _run_due(self, force: bool) -> None:
        """Run the scheduled analyses in order, each once settled (or forced); one not yet due
        holds back those after it, so events keep the order of what happened."""
        while self._pending:
            job = self._pending[0]
            if job["kind"] == "emit":  # no analysis: an event waiting for those before it
                self._ready.append(job["event"])
                self._pending.pop(0)
                continue
            if job.get("early") and not force and not self._hang_queued():  # the job's noise is not known yet
                return
            f = self._follower
            settled = f is None or job["part"] is None or f.reached(job["part"]) >= self._meta.world_size
            if not (settled or force or time.monotonic() - job["since"] >= self.settle):
                return
            self._pending.pop(0)
            self._analyse(job, settled)

    def _hang_queued(self) -> bool:
        """Whether a hang (a dump's analysis or a stall) waits in the queue: the iterations an early
        episode waits for will not come, so it is judged on the job so far at once."""
        return any(j["kind"] == "hang" or (j["kind"] == "emit" and j["event"].event == "hang") for j in self._pending)

    def _analyse(self, job: dict[str, Any], settled: bool) -> None:
        kind, i = job["kind"], job["iteration"]
        hi = None if kind == "hang" else max(i, self._fed if kind == "persistent" else i)
        late = job.get("early") or job.get("hi") is not None  # an early episode: the job so far
        if late:  # up to where the monitor's window filled (or the job ended first)
            hi = job["hi"] if job.get("hi") is not None else max(i, self._fed)
        lo = None if hi is None else max(0, hi - self.window + 1, job.get("lo") or 0)
        search_from = None
        if lo is not None and kind == "irregular" and not late:
            # the episode is searched, not the last episode again (unless very recent), against the
            # job before it as context: a window cut to the episode has too few iterations (its noise
            # looks like a fault); the whole window's usual step and noise, as holmes localize's
            first = min(self._last_episode_end + 1, i - min(self.window, _MIN_WINDOW) + 1)
            if first > lo:
                search_from = first
        min_part, max_part = 0, None
        if lo is not None:
            min_part = next((k for k, a, b in self._parts_seen if b >= lo), 0)
        if hi is not None:  # a rank's cadence may differ a little from the pivot's: one part of slack
            max_part = next((k + 1 for k, a, b in self._parts_seen if b >= hi), None)
        own = self._take_findings()
        findings = list(own)
        if not settled and job["part"] is not None and self._follower is not None:
            behind = self._follower.behind(job["part"])
            findings.append(f"{self._meta.world_size - self._follower.reached(job['part'])} rank(s) (e.g. {behind[:8]}) "
                            f"had not landed part {job['part']} after {self.settle:g} s; analysed without it")
        wj = WindowJob(self.path, self._meta, lo=lo, hi=hi, min_part=max(0, min_part - 1), max_part=max_part,
                       topology=self._topology)
        n = self.window if hi is None or lo is None else hi - lo + 1
        t0 = time.perf_counter()
        report, verdict = self._localize(wj, kind, n, i, search_from)
        took = time.perf_counter() - t0
        findings += wj.findings
        del wj  # the window and every table it read (nothing else holds them: no reference cycle)
        pa.default_memory_pool().release_unused()  # a service: give the window's buffers back
        if job["only_if_found"] and verdict in ("healthy", "error"):
            log.info("watch %s: no straggler at iteration %s (%s)", self.path, i, verdict)
            self._findings.extend(own)  # no event: the next one carries them
            return
        top = _top_device(report)
        if job.get("emit_if") is not None:
            same = top is not None and self._last_named is not None and self._last_named[1] == top and \
                lo is not None and self._last_named[0] >= lo
            if verdict not in job["emit_if"] or same:  # nothing, or the finding already reported in this window
                log.info("watch %s: re-evaluated at iteration %s: %s%s", self.path, i, verdict,
                         f" ({top}, reported at iteration {self._last_named[0]})" if same else "")
                self._findings.extend(own)
                return
        if verdict in _NAMED and top is not None:
            self._last_named = (i if i is not None else self._fed, top)
        detail = {"analysis_s": round(took, 3), "window": [lo, hi], "settled": settled}
        if search_from is not None:
            detail["searched_from"] = search_from
        if late:
            detail["judged_at"] = hi
        if kind == "all":
            detail["reevaluated"] = True
        self._ready.append(WatchEvent(_EVENT_OF[kind], i, report, findings=tuple(findings), detail=detail))

    def _localize(self, wj: WindowJob, kind: str, n: int, i: int | None,
                  search_from: int | None = None) -> tuple[dict[str, Any], str]:
        """The analysis's report as JSON and its verdict; the report object itself (and what it
        references of the window) is dropped on return."""
        try:
            params = self.params.replace(analysis=kind, window=max(2, n), search_from=search_from)
            rep = Localizer(params).localize(wj)
            return rep.to_json(evidence=False), rep.verdict
        except HolmesError as exc:
            log.warning("watch %s: %s analysis at iteration %s failed: %s", self.path, kind, i, exc)
            return {"error": str(exc)}, "error"

    def _finding(self, text: str) -> None:
        log.warning("watch %s: %s", self.path, text)
        self._findings.append(text)

    def _take_findings(self) -> list[str]:
        out = list(self._findings)
        self._findings.clear()
        return out


def _top_device(report: dict[str, Any]) -> str | None:
    devices = report.get("devices") or []
    return str(devices[0]["id"]) if devices and isinstance(devices[0], dict) and "id" in devices[0] else None


def watch(job: str | os.PathLike[str], **kwargs: Any) -> Watcher:
    """Watch a live job directory: ``for event in holmes.watch(job): ...``.

    Returns a :class:`Watcher` (iterable over :class:`~holmes.watch.WatchEvent`; ``.run(callback)``
    blocks, ``.start(callback)`` runs in a background thread, ``.stop()`` ends it); the keyword
    arguments are :class:`Watcher`'s.

    Examples
    --------
    >>> import holmes
    >>> for event in holmes.watch("fixtures/gpu16-clean", once=True, straggler_check=False):
    ...     print(event.to_json())
    """
    return Watcher(job, **kwargs)

