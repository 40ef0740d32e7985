"""Prometheus metrics of a watched job (``holmes watch --metrics-port PORT``; extra ``holmes[metrics]``).

:class:`WatchMetrics` holds its own :class:`prometheus_client.CollectorRegistry` (no global
state): :meth:`~WatchMetrics.observe` folds each :class:`~holmes.watch.WatchEvent` in, the
watcher's live figures (last iteration, seconds since the last part, the thresholds in force) are
read when scraped, and :meth:`~WatchMetrics.serve` exposes ``/metrics`` over HTTP. Every name
starts ``holmes_``:

=====================================  =======  ==========================================================
name                                   type     meaning
=====================================  =======  ==========================================================
``holmes_verdict{verdict}``            gauge    1 for the verdict of the last analysis (``culprit``,
                                                ``healthy``, ``inconclusive``, ``hang``), 0 for the others
``holmes_verdict_code``                gauge    that verdict as ``holmes localize --exit-code`` maps it
                                                (0 healthy, 1 culprit or hang, 3 inconclusive); -1 before
                                                the first analysis
``holmes_slowdown``                    gauge    actual over ideal step of the last persistent analysis
                                                (NaN where not measured)
``holmes_device_score{device,kind}``   gauge    the devices the last analysis named (candidates when it
``holmes_device_confidence{...}``               named none): score, confidence in [0, 1], what-if impact
``holmes_device_impact_pct{...}``               in % of the step (NaN where not estimated)
``holmes_events_total{event}``         counter  events emitted, by kind (irregular, straggler, hang,
                                                recovered)
``holmes_last_iteration``              gauge    the pivot's last complete iteration read (-1 before)
``holmes_seconds_since_last_event``    gauge    seconds since the last event (since the start before one)
``holmes_seconds_since_last_part``     gauge    seconds since any rank's part last landed: a hang
                                                detector for alerting rules
``holmes_last_analysis_seconds``       gauge    wall time of the last analysis
``holmes_delta``, ``holmes_window``,   gauge    the thresholds in force (changeable while running:
``holmes_monitor_window``                       ``--control FILE``)
=====================================  =======  ==========================================================

Examples
--------
>>> from holmes.watch.events import WatchEvent
>>> m = WatchMetrics()
>>> m.observe(WatchEvent("irregular", 30, {"verdict": "culprit", "slowdown": None,
...     "devices": [{"id": "gpu:3", "kind": "gpu", "score": 1.0, "confidence": 0.97, "impact_pct": None}]}))
>>> text = m.exposition()
>>> 'holmes_verdict{verdict="culprit"} 1.0' in text, 'holmes_events_total{event="irregular"} 1.0' in text
(True, True)
>>> 'holmes_device_confidence{device="gpu:3",kind="gpu"} 0.97' in text, "holmes_verdict_code 1.0" in text
(True, True)
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from holmes.errors import ConfigError
from holmes.watch.events import EVENT_KINDS, WatchEvent

__all__ = ["WatchMetrics", "VERDICTS", "VERDICT_CODE"]

log = logging.getLogger(__name__)

#: the verdicts the ``holmes_verdict`` state set spans
VERDICTS = ("culprit", "healthy", "inconclusive", "hang")
#: ``holmes_verdict_code``: the ``holmes localize --exit-code`` statuses (a stall is a hang)
VERDICT_CODE = {"healthy": 0, "culprit": 1, "hang": 1, "stalled": 1, "inconclusive": 3}


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError:  # pragma: no cover - depends on the environment
        raise ConfigError("Prometheus metrics need the prometheus_client package: pip install 'holmes[metrics]'") \
            from None
    return prometheus_client


def _num(x: Any) -> float:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else math.nan


class WatchMetrics:
    """The metrics of one watched job, in a registry of their own.

    Parameters
    ----------
    watcher : Watcher, optional
        Read at scrape time for the last iteration, the seconds since the last part and the
        thresholds in force (:meth:`bind` sets it later).
    """

    def __init__(self, watcher: Any = None) -> None:
        pc = _prometheus()
        self.registry = pc.CollectorRegistry(auto_describe=True)
        r = self.registry
        self._verdict = pc.Gauge("holmes_verdict", "1 for the verdict of the last analysis, 0 for the others",
                                 ["verdict"], registry=r)
        for v in VERDICTS:
            self._verdict.labels(v).set(0)
        self._code = pc.Gauge("holmes_verdict_code", "the last verdict as holmes localize --exit-code maps it "
                                                     "(0 healthy, 1 culprit or hang, 3 inconclusive; -1 none yet)",
                              registry=r)
        self._code.set(-1)
        self._slowdown = pc.Gauge("holmes_slowdown", "actual over ideal step of the last persistent analysis",
                                  registry=r)
        self._slowdown.set(math.nan)
        dev = ["device", "kind"]
        self._score = pc.Gauge("holmes_device_score", "score of a device the last analysis named", dev, registry=r)
        self._conf = pc.Gauge("holmes_device_confidence", "confidence in [0, 1] of a device the last analysis named",
                              dev, registry=r)
        self._impact = pc.Gauge("holmes_device_impact_pct", "how much shorter the step would be without the device, "
                                                            "% (NaN where not estimated)", dev, registry=r)
        self._events = pc.Counter("holmes_events", "events emitted, by kind", ["event"], registry=r)
        for k in EVENT_KINDS:
            self._events.labels(k)
        self._analysis = pc.Gauge("holmes_last_analysis_seconds", "wall time of the last analysis", registry=r)
        self._started = time.monotonic()
        self._last_event: float | None = None
        self._watcher = None
        pc.Gauge("holmes_seconds_since_last_event", "seconds since the last event (since the start before one)",
                 registry=r).set_function(lambda: time.monotonic() - (self._last_event or self._started))
        pc.Gauge("holmes_last_iteration", "the pivot's last complete iteration read (-1 before the first)",
                 registry=r).set_function(lambda: self._read("last_iteration", -1))
        pc.Gauge("holmes_seconds_since_last_part", "seconds since any rank's part last landed",
                 registry=r).set_function(lambda: self._read("seconds_since_last_part", math.nan))
        pc.Gauge("holmes_delta", "the irregularity threshold in force", registry=r).set_function(
            lambda: self._read("delta", math.nan))
        pc.Gauge("holmes_window", "iterations each analysis sees", registry=r).set_function(
            lambda: self._read("window", math.nan))
        pc.Gauge("holmes_monitor_window", "iterations of the streaming monitor's reference",
                 registry=r).set_function(lambda: self._read("monitor_window", math.nan))
        self._server: Any = None
        self._thread: Any = None
        if watcher is not None:
            self.bind(watcher)

    def bind(self, watcher: Any) -> "WatchMetrics":
        """Read ``watcher``'s live figures at scrape time; returns self."""
        self._watcher = watcher
        return self

    def _read(self, name: str, default: float) -> float:
        w = self._watcher
        if w is None:
            return default
        if name == "delta":
            return float(w.monitor.delta)
        if name == "monitor_window":
            return float(w.monitor.window)
        v = getattr(w, name, None)
        return default if v is None else float(v)

    def observe(self, event: WatchEvent) -> None:
        """Fold one event in: counts, the verdict, slowdown and devices of its report."""
        self._events.labels(event.event).inc()
        self._last_event = time.monotonic()
        took = (event.detail or {}).get("analysis_s")
        if isinstance(took, (int, float)):
            self._analysis.set(float(took))
        rep = event.report
        if event.event == "recovered":
            rep = {"verdict": "healthy", "devices": []}
        if not isinstance(rep, dict) or "verdict" not in rep:
            return  # an analysis that failed: the last verdict stands
        verdict = str(rep["verdict"])
        for v in VERDICTS:
            self._verdict.labels(v).set(1 if v == verdict or (verdict == "stalled" and v == "hang") else 0)
        self._code.set(VERDICT_CODE.get(verdict, -1))
        if event.event != "recovered":
            self._slowdown.set(_num(rep.get("slowdown")))
        devices = rep.get("devices") or rep.get("candidates") or []
        for g in (self._score, self._conf, self._impact):
            g.clear()
        for d in devices:
            labels = (str(d.get("id")), str(d.get("kind")))
            self._score.labels(*labels).set(_num(d.get("score")))
            self._conf.labels(*labels).set(_num(d.get("confidence")))
            self._impact.labels(*labels).set(_num(d.get("impact_pct")))

    def exposition(self) -> str:
        """The metrics in the Prometheus text format (what ``/metrics`` returns)."""
        return _prometheus().generate_latest(self.registry).decode()

    def serve(self, port: int, addr: str = "0.0.0.0") -> int:
        """Serve ``/metrics`` on ``addr:port`` in a daemon thread (``port=0``: any free port);
        returns the port bound. :meth:`close` stops it."""
        if self._server is not None:
            raise ConfigError("metrics: already served")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ConfigError(f"metrics: port must be an integer in [0, 65535], not {port!r}")
        out = _prometheus().start_http_server(port, addr=addr, registry=self.registry)
        if not isinstance(out, tuple):  # pragma: no cover - prometheus_client < 0.20 returns nothing
            raise ConfigError("metrics: prometheus_client >= 0.20 is needed (pip install -U prometheus_client)")
        self._server, self._thread = out
        port = int(self._server.server_port)
        log.info("metrics on http://%s:%d/metrics", addr, port)
        return port

    def close(self) -> None:
        """Stop serving (nothing when not served)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
