"""The dump triggers of :meth:`holmes.logger.CommOpsLogger.install_dump_handlers`: signals, an
uncaught exception, and a watchdog thread for an operator in flight too long; and the rows a dump
adds for the operators still in flight (:func:`write_running`)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from holmes.errors import ConfigError
from holmes.io.parts import part_filename
from holmes.io.schema import OPS_SCHEMA, WAIT_FIELDS

__all__ = ["install_dump_handlers", "write_running"]


def write_running(rec: Any, heads: list[tuple[int, ...]], rets: list[int | None], waits: list[int | None]) -> None:
    """Add the operators still in flight (packed rows without their end; ``rets``/``waits``: their
    ``return_ns``/``wait_ns`` or None) to ``rec``'s closed rank log with ``state`` ``"started"``
    (every earlier row ``"completed"``); live, as its last part (readers fill ``completed`` in the others)."""
    n = len(heads)
    cols = [c.cast(pa.string()) if pa.types.is_dictionary(c.type) else c
            for c in rec._columns(np.array([h + (-1,) for h in heads], dtype=np.int64))[:9]]
    running = pa.Table.from_arrays(cols + [pa.nulls(n, pa.int64()), pa.array(rets, pa.int64()),
                                           pa.array(waits, pa.int64()), pa.array(["started"] * n, pa.string())],
                                   names=OPS_SCHEMA.names + [f.name for f in WAIT_FIELDS] + ["state"])
    if rec.live:
        final = rec.parts_dir / part_filename(rec.parts_written)
        tmp = rec.parts_dir / f".{final.name}.partial"
        pq.write_table(running, tmp)
        os.replace(tmp, final)
        rec.parts_written += 1
        return
    done = pq.read_table(rec.ops_path)
    for f in WAIT_FIELDS:   # a log written before the columns existed
        if f.name not in done.column_names:
            done = done.append_column(f, pa.nulls(done.num_rows, pa.int64()))
    done = done.append_column("state", pa.array(["completed"] * done.num_rows, type=pa.string()))
    both = pa.concat_tables([done.cast(running.schema), running])
    tmp = rec.ops_path.with_name(f".{rec.ops_path.name}.dump")
    pq.write_table(both, tmp)
    os.replace(tmp, rec.ops_path)


def install_dump_handlers(self: Any, signals: Iterable[str] = ("SIGTERM", "SIGUSR1"), *, exceptions: bool = True,
                          timeout: float | None = None, poll: float = 0.5) -> Any:
    """See :meth:`holmes.logger.CommOpsLogger.install_dump_handlers` (``self``: the logger)."""
    import signal
    import sys

    def _on_signal(signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        self.dump("signal", name)
        prev = self._prev_handlers.get(signum)
        if callable(prev):
            prev(signum, frame)
        elif signum == signal.SIGTERM:  # still terminate, as the default handler would
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    self._prev_handlers = getattr(self, "_prev_handlers", {})
    for name in signals:
        sig = getattr(signal, name, None)
        if sig is None:
            raise ConfigError(f"unknown signal {name!r}")
        self._prev_handlers[sig] = signal.signal(sig, _on_signal)
    if exceptions:
        prev_hook = sys.excepthook

        def _hook(tp: Any, val: Any, tb: Any) -> None:
            if self._rec is not None and not self._rec.closed:
                self.dump(_reason_of(val), f"{tp.__name__}: {val}")
            prev_hook(tp, val, tb)

        sys.excepthook = _hook
    if timeout is not None:
        limit_ns = int(float(timeout) * 1e9)

        def _watch() -> None:
            while self._rec is None or not self._rec.closed:
                time.sleep(poll)
                rec = self._rec
                if rec is None or rec.closed:
                    continue
                oldest = rec.running_since()
                if oldest is not None and time.time_ns() - oldest > limit_ns:
                    self.dump("timeout", f"an operator in flight for more than {timeout:g} s")
                    return

        threading.Thread(target=_watch, name="holmes-commops-watchdog", daemon=True).start()
    return self


def _reason_of(exc: BaseException | None) -> str:
    """``"timeout"`` for a collective that timed out (gloo/NCCL say so in the message), else ``"exception"``."""
    text = f"{type(exc).__name__} {exc}".lower()
    return "timeout" if "timed out" in text or "timeout" in text else "exception"
