"""The events :mod:`holmes.watch` emits: one small object per irregularity, straggler, hang or recovery.

Each event is one JSON line (:meth:`WatchEvent.to_json`)::

    {"event": "irregular", "iteration": 512, "at_ns": ..., "report": {...}, "findings": [...]}

``report`` is the :meth:`holmes.localize.Report.to_json` of the analysis that ran (without the
per-cause evidence), or a small object of the watcher's own for a stall; ``findings`` lists what
the watcher had to work around (a part skipped, ranks missing).

Examples
--------
>>> ev = WatchEvent("recovered", 40, at_ns=5, detail={"irregular_iterations": 3})
>>> ev.to_json()
'{"event": "recovered", "iteration": 40, "at_ns": 5, "report": null, "detail": {"irregular_iterations": 3}}'
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from holmes.errors import ConfigError

__all__ = ["WatchEvent", "EVENT_KINDS"]

#: the kinds of event, in the order they can first appear in an episode
EVENT_KINDS = ("irregular", "straggler", "hang", "recovered")


@dataclass(frozen=True)
class WatchEvent:
    """One thing the watcher noticed and the analysis it ran.

    Parameters
    ----------
    event : {"irregular", "straggler", "hang", "recovered"}
    iteration : int or None
        The pivot's iteration it is about (the first irregular one, the last seen for a hang).
    report : dict, optional
        The analysis's report as JSON (None when no analysis ran).
    at_ns : int
        Wall clock when the event was emitted.
    findings : list of str
        What the watcher worked around (parts skipped or late, ranks missing).
    detail : dict
        Small extra facts (the analysis's wall time, the stall length...).
    """

    event: str
    iteration: int | None
    report: dict[str, Any] | None = None
    at_ns: int = field(default_factory=time.time_ns)
    findings: tuple[str, ...] = ()
    detail: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.event not in EVENT_KINDS:
            raise ConfigError(f"event must be one of {', '.join(EVENT_KINDS)}, not {self.event!r}")

    def as_dict(self) -> dict[str, Any]:
        """The JSON object (``findings`` and ``detail`` only when not empty)."""
        out: dict[str, Any] = {"event": self.event, "iteration": self.iteration, "at_ns": self.at_ns,
                               "report": self.report}
        if self.findings:
            out["findings"] = list(self.findings)
        if self.detail:
            out["detail"] = self.detail
        return out

    def to_json(self) -> str:
        """One line of JSON."""
        return json.dumps(self.as_dict(), allow_nan=False, default=str)
