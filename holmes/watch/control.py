"""The control file of a running watcher (``holmes watch --control FILE``): thresholds changed
without a restart.

The file is one JSON object holding any of :data:`CONTROL_KEYS`; the watcher re-reads it when
its modification time changes (checked every loop) and on ``SIGHUP`` (``holmes watch``), and
applies it at once: a new ``delta`` or ``monitor_window`` re-judges from the next iteration on
against the same recent history, a new ``window`` is used by the next analysis. A key left out
keeps its value; a file that does not parse or holds a bad value changes nothing (the watcher
logs a warning and says it in the next event's findings) -- a typo never stops a running watcher.

Examples
--------
>>> parse_control('{"delta": 1.2, "window": 50}')
{'delta': 1.2, 'window': 50}
>>> parse_control('{"delta": 0.9}')
Traceback (most recent call last):
...
holmes.errors.ConfigError: control: delta must be a number > 1, not 0.9
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
from pathlib import Path
from typing import Any

from holmes.errors import ConfigError

__all__ = ["CONTROL_KEYS", "ControlFile", "apply_settings", "parse_control", "read_control"]

log = logging.getLogger(__name__)

#: key -> what it must be: "int" >= 1, "count" >= 0, "seconds" >= 0 (null: off), "delta" > 1
CONTROL_KEYS: dict[str, str] = {
    "delta": "delta",               # the irregularity threshold (> 1)
    "window": "int",                # iterations each analysis sees
    "monitor_window": "int",        # iterations of the streaming monitor's reference
    "persistent_after": "int",      # slow iterations that make an episode a straggler
    "recover_after": "int",         # regular iterations that end an episode
    "reevaluate_every": "count",    # iterations between re-evaluations of an open episode (0: never)
    "top_k": "int",                 # devices each analysis reports
    "settle": "seconds",            # longest wait for every rank's part
    "hang_after": "seconds",        # no part for this long: a hang event (null: off)
}


def _check(key: str, v: Any) -> Any:
    kind = CONTROL_KEYS[key]
    is_num = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if kind == "delta":
        if not (is_num and v > 1):
            raise ConfigError(f"control: {key} must be a number > 1, not {v!r}")
        return float(v)
    if kind == "count":
        if not (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
            raise ConfigError(f"control: {key} must be an integer >= 0, not {v!r}")
        return int(v)
    if kind == "int":
        if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
            raise ConfigError(f"control: {key} must be an integer >= 1, not {v!r}")
        return int(v)
    if v is None and key == "hang_after":
        return None
    if not (is_num and v >= 0):
        raise ConfigError(f"control: {key} must be a number of seconds >= 0, not {v!r}")
    return float(v)


def parse_control(text: str) -> dict[str, Any]:
    """The settings of a control file's text, checked (a :class:`~holmes.errors.ConfigError` names
    the key at fault)."""
    try:
        data = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as exc:
        raise ConfigError(f"control: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"control: expected a JSON object, not {type(data).__name__}")
    unknown = sorted(set(data) - set(CONTROL_KEYS))
    if unknown:
        raise ConfigError(f"control: unknown key(s) {', '.join(unknown)} (known: {', '.join(CONTROL_KEYS)})")
    return {k: _check(k, v) for k, v in data.items()}


def read_control(path: str | os.PathLike[str], max_bytes: int = 65536) -> dict[str, Any]:
    """:func:`parse_control` of the file at ``path`` (at most ``max_bytes`` read)."""
    with open(path, encoding="utf-8") as f:
        text = f.read(max_bytes + 1)
    if len(text) > max_bytes:
        raise ConfigError(f"control: {path} is larger than {max_bytes} bytes")
    try:
        return parse_control(text)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


class ControlFile:
    """A control file followed by modification time and size, or re-read on demand.

    :meth:`poll` returns the file's checked settings when it changed (or :meth:`reload` was
    called) since the last poll, else None; a missing file is no change.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._stamp: tuple[int, int] | None = None
        self._reload = threading.Event()

    def reload(self) -> None:
        """Re-read at the next :meth:`poll` (safe from a signal handler or another thread)."""
        self._reload.set()

    def poll(self) -> dict[str, Any] | None:
        """The settings when the file changed since the last poll; a bad file raises
        :class:`~holmes.errors.ConfigError` (once per change)."""
        try:
            st = self.path.stat()
            stamp: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = None
        if stamp == self._stamp and not self._reload.is_set():
            return None
        self._reload.clear()
        self._stamp = stamp
        return None if stamp is None else read_control(self.path)


def apply_settings(watcher: Any, settings: dict[str, Any]) -> None:
    """Apply ``settings`` (checked as a control file's) to a running
    :class:`~holmes.watch.Watcher` (:meth:`~holmes.watch.Watcher.apply_control`)."""
    from collections import deque

    from holmes.detect.monitor import IterationMonitor

    w = watcher
    s = parse_control(json.dumps(dict(settings)))
    if "delta" in s or "monitor_window" in s:
        delta = s.get("delta", w.monitor.delta)
        mw = s.get("monitor_window", w.monitor.window)
        mon = IterationMonitor(delta=delta, window=mw)
        for d in list(w._recent)[-mw:]:  # the same history, judged by the new rule from now on
            mon.update(d)
        mon.n_seen, mon.n_irregular = w.monitor.n_seen, w.monitor.n_irregular
        w.monitor = mon
        w._recent = deque(w._recent, maxlen=mw)
        w.params = w.params.replace(delta=mon.delta)
    for key in ("window", "persistent_after", "recover_after", "reevaluate_every", "settle", "hang_after"):
        if key in s:
            setattr(w, key, s[key])
    if "top_k" in s:
        w.params = w.params.replace(top_k=s["top_k"])
    log.info("watch %s: settings changed: %s", w.path, s)
