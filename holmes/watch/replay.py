"""Replay a finished job as a live one: its rank logs cut into parts, to try ``holmes watch`` on it.

:func:`replay_as_parts` writes the live layout the logger writes (``ranks/rank-XXXXX/part-*.parquet``,
``per_part`` iterations each, :mod:`holmes.io.parts`) beside the job's ``job.json`` and
``topology.json``; :func:`watch_parity` compares what :class:`~holmes.watch.Watcher` emits on it
with what :func:`holmes.localize` says of the whole job.

Examples
--------
>>> import tempfile
>>> live = replay_as_parts("fixtures/gpu16-clean", tempfile.mkdtemp() + "/live", per_part=5)
>>> sorted(p.name for p in (live / "ranks" / "rank-00003").iterdir())[:2]
['part-000000.parquet', 'part-000001.parquet']
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc

from holmes.errors import ConfigError, MissingRankError

__all__ = ["replay_as_parts", "watch_parity", "Parity"]


def replay_as_parts(job: str | os.PathLike[str], out: str | os.PathLike[str], *, per_part: int = 5) -> Path:
    """Write ``job``'s rank logs as parts of ``per_part`` iterations under ``out`` (a new directory);
    a rank without a log (one that died before writing) gets no part, as it would live."""
    from holmes.io import read_job
    from holmes.io.parts import rank_parts_dirname, write_part

    if isinstance(per_part, bool) or not isinstance(per_part, int) or per_part < 1:
        raise ConfigError(f"per_part must be an integer >= 1, not {per_part!r}")
    src, dst = Path(job), Path(out)
    if dst.exists():
        raise ConfigError(f"{dst}: exists already")
    j = read_job(src)
    (dst / "ranks").mkdir(parents=True)
    for name in ("job.json", "topology.json"):
        if (src / name).is_file():
            shutil.copyfile(src / name, dst / name)
    for r in range(j.world_size):
        try:
            t = j.ops(r)
        except MissingRankError:  # a rank that never wrote (it died): it lands no part live either
            continue
        if not t.num_rows:
            continue
        it = t.column("iteration").to_numpy()
        lo = int(it.min())
        chunk = (it - lo) // per_part
        for k in np.unique(chunk).tolist():
            write_part(dst / "ranks" / rank_parts_dirname(r), int(k), t.filter(pc.equal(chunk, k)))
    return dst


@dataclass
class Parity:
    """What the watcher emitted against what the offline localization found.

    Attributes
    ----------
    offline_verdict : str
    offline_device : str or None
        The offline report's top named device.
    events : list of tuple
        ``(event, iteration, verdict, named device ids)`` of every watch event.
    caught : bool or None
        Offline culprit or hang: whether an event's report names the same top device (a hang: a
        hang event); None when offline named nothing.
    extra : int
        Events naming a culprit where offline named nothing (or naming none of offline's devices).
    """

    offline_verdict: str
    offline_device: str | None
    events: list[tuple[Any, ...]] = field(default_factory=list)
    caught: bool | None = None
    extra: int = 0


def watch_parity(job: str | os.PathLike[str], workdir: str | os.PathLike[str], *, per_part: int = 5,
                 **watch_kw: Any) -> Parity:
    """Replay ``job`` as parts in ``workdir`` (:func:`replay_as_parts`), watch it to the end
    (``once``), and compare the events with :func:`holmes.localize` of the whole job."""
    from holmes.localize import localize
    from holmes.watch.watcher import Watcher

    offline = localize(job)
    live = replay_as_parts(job, Path(workdir) / "live", per_part=per_part)
    watch_kw.setdefault("once", True)
    events = []
    for ev in Watcher(live, **watch_kw):
        rep = ev.report or {}
        named = tuple(d["id"] for d in rep.get("devices") or [])
        events.append((ev.event, ev.iteration, rep.get("verdict"), named))
    top = offline.devices[0].id if offline.devices else None
    p = Parity(offline.verdict, top, events)
    if offline.verdict == "hang":
        p.caught = any(e[0] == "hang" for e in events)
    elif offline.verdict == "culprit":
        p.caught = any(e[2] == "culprit" and top in e[3] for e in events)
    offline_ids = {d.id for d in offline.devices}
    p.extra = sum(1 for e in events if e[2] == "culprit" and not offline_ids & set(e[3]))
    return p
