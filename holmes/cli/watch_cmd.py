"""``holmes watch``: follow a live job and print one JSON line per event on stdout.

Example::

    holmes watch /jobs/run-17 --interval 0.5 --window 100
    {"event": "irregular", "iteration": 5120, "at_ns": ..., "report": {"verdict": "culprit", ...}}

Logging goes to stderr (``-v``). Ctrl-C stops it (exit 130 after the observer thread stopped).
``--metrics-port PORT`` also serves Prometheus metrics at ``http://HOST:PORT/metrics``
(:mod:`holmes.watch.metrics`; extra ``holmes[metrics]``); ``--control FILE`` changes thresholds
while it runs (:mod:`holmes.watch.control`: re-read when the file changes and on ``SIGHUP``).
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["add_parser", "run"]


def add_parser(p: argparse.ArgumentParser) -> None:
    """Fill the ``watch`` subcommand's parser."""
    p.add_argument("job", metavar="JOB", help="job directory (live parts ranks/rank-XXXXX/part-*.parquet, or files)")
    p.add_argument("--interval", type=float, default=0.5, metavar="S", help="seconds between polls (default 0.5)")
    p.add_argument("--window", type=int, default=100, metavar="N", help="iterations each analysis sees (default 100)")
    p.add_argument("--once", action="store_true", help="analyse what is there now and exit")
    p.add_argument("--pivot", type=int, default=0, metavar="RANK", help="monitored rank (default 0)")
    p.add_argument("--delta", type=float, default=1.1, help="irregularity threshold (default 1.1)")
    p.add_argument("--settle", type=float, default=5.0, metavar="S",
                   help="longest wait for every rank's part of an irregular iteration (default 5)")
    p.add_argument("--hang-after", type=float, default=None, metavar="S",
                   help="emit a hang event when no part lands for S seconds (default: off)")
    p.add_argument("--idle-exit", type=float, default=None, metavar="S",
                   help="exit after S seconds without a new part (default: run until the job ends)")
    p.add_argument("--detector", default="auto", help="abnormal-operator detector of the analyses (default auto)")
    p.add_argument("--polling", action="store_true", help="poll even when watchdog is installed")
    p.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help="serve Prometheus metrics at :PORT/metrics (needs holmes[metrics]; 0: any free port, "
                        "logged with -v)")
    p.add_argument("--metrics-addr", default="0.0.0.0", metavar="ADDR",
                   help="address the metrics server listens on (default 0.0.0.0)")
    p.add_argument("--control", default=None, metavar="FILE",
                   help="JSON file of thresholds (delta, window, monitor_window, settle, hang_after, ...) re-read "
                        "when it changes and on SIGHUP")


def run(args: argparse.Namespace) -> int:
    """Watch until the job ends (or Ctrl-C); each event is printed and flushed at once."""
    from holmes.watch import Watcher

    metrics = None
    if args.metrics_port is not None:
        from holmes.watch.metrics import WatchMetrics

        metrics = WatchMetrics()
    w = Watcher(args.job, pivot=args.pivot, window=args.window, interval=args.interval, delta=args.delta,
                settle=args.settle, hang_after=args.hang_after, idle_exit=args.idle_exit, once=args.once,
                use_watchdog=False if args.polling else None, detector=args.detector, control=args.control,
                metrics=metrics)
    if metrics is not None:
        metrics.serve(args.metrics_port, addr=args.metrics_addr)
    restore = _on_sighup(w.reload_control) if args.control else None
    events = w.events()
    try:
        for ev in events:
            sys.stdout.write(ev.to_json() + "\n")
            sys.stdout.flush()
    finally:
        events.close()  # stops the observer thread, also on Ctrl-C
        if restore is not None:
            restore()
        if metrics is not None:
            metrics.close()
    return 0


def _on_sighup(reload):
    """Call ``reload()`` on SIGHUP (POSIX, main thread); returns what restores the old handler."""
    import signal
    import threading

    if not hasattr(signal, "SIGHUP") or threading.current_thread() is not threading.main_thread():
        return None
    old = signal.signal(signal.SIGHUP, lambda signum, frame: reload())
    return lambda: signal.signal(signal.SIGHUP, old)
