"""Watch a job while it trains: follow its parts and emit an event within seconds of an irregularity.

``holmes.watch(job, ...)`` returns a :class:`Watcher`: iterate it for :class:`WatchEvent` objects
(``irregular``, ``straggler``, ``hang``, ``recovered``; each carries the report of the analysis it
ran), or give it a callback (``.run(callback)``, ``.start(callback)`` in a background thread).
``holmes watch JOB`` prints one JSON line per event. See ``docs/watch.md``.

Modules: :mod:`~holmes.watch.follower` (which parts landed: ``watchdog`` or polling),
:mod:`~holmes.watch.window` (the job's metadata now, a bounded :class:`~holmes.io.MemoryJob` view),
:mod:`~holmes.watch.watcher` (the loop), :mod:`~holmes.watch.events`, :mod:`~holmes.watch.control`
(thresholds changed while running), :mod:`~holmes.watch.metrics` (Prometheus metrics; imported on
use: it needs the extra ``holmes[metrics]``).
"""

from __future__ import annotations

from holmes.watch.events import EVENT_KINDS, WatchEvent
from holmes.watch.follower import PartsFollower, watchdog_available
from holmes.watch.watcher import Watcher, watch
from holmes.watch.window import WindowJob, job_meta

__all__ = ["watch", "Watcher", "WatchEvent", "EVENT_KINDS", "PartsFollower", "WindowJob", "job_meta",
           "watchdog_available"]
