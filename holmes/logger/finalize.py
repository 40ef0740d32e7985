"""Merge the per-rank communicator sidecars of a captured job into ``job.json``.

Every rank's :class:`~holmes.logger.recorder.CommOpsRecorder` writes ``comms/rank-XXXXX.json``
(the communicators that rank used) when it closes. :func:`finalize_job` waits for all of them,
merges them, writes ``job.json`` and checks the result with :func:`holmes.read_job` and
:func:`~holmes.logger.checks.capture_warnings` (what looks missing goes to ``source.warnings``).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from holmes.errors import JobError
from holmes.io.job import read_job
from holmes.limits import read_json_capped
from holmes.io.models import JobMeta
from holmes.io.outputs import replace_file_text
from holmes.logger.checks import capture_warnings
from holmes.logger.recorder import COMMS_DIR

__all__ = ["finalize_job", "live_meta"]

log = logging.getLogger(__name__)


def _sidecars(out: Path) -> dict[int, Path]:
    d = out / COMMS_DIR
    found: dict[int, Path] = {}
    if d.is_dir():
        for name in os.listdir(d):
            if name.startswith("rank-") and name.endswith(".json"):
                try:
                    found[int(name[5:-5])] = d / name
                except ValueError:
                    continue
    return found


def finalize_job(out_dir: str | os.PathLike[str], world_size: int | None = None, *,
                 communicators: Mapping[str, Mapping[str, Any]] | None = None,
                 parallel: Any = None, name: str | None = None, timeout: float = 0.0,
                 validate: bool = True, allow_missing: bool = False) -> Path:
    """Write ``job.json`` for a job directory captured by :class:`~holmes.logger.CommOpsLogger`.

    Parameters
    ----------
    out_dir : path-like
        The job directory the ranks wrote into.
    world_size : int, optional
        Number of ranks; by default the largest ``world_size`` any sidecar reports (or the
        number of sidecars).
    communicators : mapping, optional
        Extra or overriding entries ``comm_id -> {"kind", "ranks"}``.
    parallel : ParallelLayout or mapping, optional
        Written as job.json's ``parallel`` entry.
    name : str, optional
        Job name for job.json.
    timeout : float, default 0
        Seconds to wait for the sidecars of all ``world_size`` ranks to appear.
    validate : bool, default True
        Open the result with :func:`holmes.read_job` and validate every rank file.
    allow_missing : bool, default False
        After ``timeout``, write ``job.json`` from the sidecars found (a hung job: a rank too dead
        to dump has no log, which the hang analysis reports). Sidecars written by
        :meth:`~holmes.logger.CommOpsRecorder.dump` give ``job.json`` its ``dump`` entry: the
        reason ``timeout`` if any rank timed out (else the first rank's), at the earliest dump.

    Returns
    -------
    pathlib.Path
        The path of ``job.json``.

    Raises
    ------
    JobError
        No sidecar at all, a rank's sidecar missing after ``timeout``, two ranks disagreeing on a
        communicator's members, or a rank file failing validation.

    Examples
    --------
    >>> import tempfile
    >>> from holmes.logger import CommOpsRecorder
    >>> d = tempfile.mkdtemp()
    >>> for r in (0, 1):
    ...     rec = CommOpsRecorder(d, rank=r, world_size=2)
    ...     rec.add_communicator("dp-0", [0, 1], kind="dp")
    ...     rec.record("dp-0", "all_reduce", nbytes=8, start_ns=0, end_ns=5)
    ...     _ = rec.close()
    >>> finalize_job(d).name
    'job.json'
    """
    out = Path(out_dir)
    deadline = time.monotonic() + max(0.0, float(timeout))
    while True:
        sides, found = _read_sidecars(out)
        ws = world_size
        if ws is None:
            reported = [int(s["world_size"]) for s in sides.values() if s.get("world_size")]
            ws = max(reported) if reported else (max(sides) + 1 if sides else None)
        missing = [] if ws is None else [r for r in range(int(ws)) if r not in sides]
        if sides and not missing:
            break
        if time.monotonic() >= deadline:
            if sides and allow_missing:
                log.warning("%s: no sidecar from rank(s) %s: job.json written without them", out, missing[:8])
                break
            if not sides:
                raise JobError(f"{out / COMMS_DIR}: no rank sidecar found; did the ranks close their loggers?")
            raise JobError(f"{out / COMMS_DIR}: sidecar of rank(s) {missing[:8]} missing "
                           f"({len(missing)} of {ws}); a rank did not close its logger")
        time.sleep(0.05)
    assert ws is not None
    meta = _merged_meta(out, sides, found, int(ws), communicators, parallel, name)
    try:
        model = JobMeta.model_validate(meta)
    except Exception as exc:  # pydantic ValidationError
        raise JobError(f"{out / 'job.json'}: merged metadata is invalid: {exc}") from None
    path = out / "job.json"
    # a temporary sibling renamed into place: readers see no job.json or a complete one
    replace_file_text(path, json.dumps(model.to_json_dict(), indent=1, sort_keys=True, allow_nan=False))
    if validate:
        job = read_job(out)
        for r in range(job.world_size):
            if job.has_rank(r):
                job.ops(r)
                job.iterations(r)
        marked = {r: tuple(s["marked"]) for r, s in sides.items()
                  if isinstance(s.get("marked"), list) and len(s["marked"]) == 2}
        found_warnings = capture_warnings(job, marked)
        if found_warnings:
            for w in found_warnings:
                log.warning("%s: %s", out, w)
            assert model.source is not None
            model.source.warnings.extend(found_warnings)
            replace_file_text(path, json.dumps(model.to_json_dict(), indent=1, sort_keys=True, allow_nan=False))
    log.info("%s: job.json written for %d ranks, %d communicators", out, ws, len(meta["communicators"]))
    return path


def _read_sidecars(out: Path) -> tuple[dict[int, dict[str, Any]], dict[int, Path]]:
    found = _sidecars(out)
    sides = {}
    for r, p in found.items():
        try:
            side = read_json_capped(p, error=JobError, what="communicator sidecar")
        except JobError as exc:
            raise JobError(f"unreadable communicator sidecar of rank {r}: {exc}") from None
        if not isinstance(side, dict):
            raise JobError(f"{p}: communicator sidecar of rank {r} is not a JSON object")
        sides[r] = side
    return sides, found


def live_meta(out_dir: str | os.PathLike[str], world_size: int | None = None) -> tuple[JobMeta, dict[int, bool]]:
    """What ``job.json`` would hold now, from the sidecars present, without writing anything.

    For a live job (:class:`~holmes.logger.CommOpsRecorder` with ``parts_every``/``parts_interval``)
    before :func:`finalize_job` ran. Returns the metadata and, per rank with a sidecar, whether
    that rank has closed (or dumped) its log.

    Raises
    ------
    JobError
        No sidecar yet, or two ranks disagreeing on a communicator.
    """
    out = Path(out_dir)
    sides, found = _read_sidecars(out)
    if not sides:
        raise JobError(f"{out}: no job.json and no rank sidecar in {COMMS_DIR}/ yet")
    ws = world_size
    if ws is None:
        reported = [int(s["world_size"]) for s in sides.values() if s.get("world_size")]
        ws = max(reported) if reported else max(sides) + 1
    meta = _merged_meta(out, sides, found, int(ws), None, None, None)
    try:
        model = JobMeta.model_validate(meta)
    except Exception as exc:  # pydantic ValidationError
        raise JobError(f"{out / COMMS_DIR}: merged metadata is invalid: {exc}") from None
    return model, {r: not s.get("live") or "dump" in s for r, s in sides.items()}


def _merged_meta(out: Path, sides: dict[int, dict[str, Any]], found: dict[int, Path], ws: int,
                 communicators: Mapping[str, Mapping[str, Any]] | None, parallel: Any,
                 name: str | None) -> dict[str, Any]:
    merged: dict[str, dict[str, Any]] = {}
    for r in sorted(sides):
        for cid, info in (sides[r].get("communicators") or {}).items():
            prev = merged.get(cid)
            if prev is None:
                merged[cid] = dict(info)
            elif sorted(prev["ranks"]) != sorted(info["ranks"]):
                raise JobError(f"{found[r]}: rank {r} sees communicator '{cid}' with ranks {info['ranks'][:8]}, "
                               f"another rank with {prev['ranks'][:8]}")
            elif prev.get("kind") == "other" and info.get("kind") != "other":
                prev["kind"] = info["kind"]
    for cid, info in (communicators or {}).items():
        merged[str(cid)] = {"kind": info.get("kind", "other"), "ranks": sorted(int(x) for x in info["ranks"])}
    meta: dict[str, Any] = {"schema": "holmes.commops/1", "world_size": int(ws), "communicators": merged,
                            "source": {"format": "holmes.logger", "details": {
                                "rows": {str(r): int(s.get("rows", 0)) for r, s in sorted(sides.items())}}}}
    dumps = [s["dump"] for r, s in sorted(sides.items()) if isinstance(s.get("dump"), dict)]
    if dumps:
        reasons = [d.get("reason") for d in dumps]
        ats = [int(d["at_ns"]) for d in dumps if isinstance(d.get("at_ns"), int)]
        meta["dump"] = {"reason": "timeout" if "timeout" in reasons else reasons[0], "at_ns": min(ats) if ats else None,
                        "detail": f"{len(dumps)} of {ws} rank(s) dumped"}
    if parallel is not None:
        meta["parallel"] = parallel.to_dict() if hasattr(parallel, "to_dict") else dict(parallel)
    if name:
        meta["name"] = name
    return meta
