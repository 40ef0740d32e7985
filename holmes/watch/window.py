"""A bounded view of a live job: its metadata now, and a :class:`~holmes.io.MemoryJob` over a window.

:func:`job_meta` reads ``job.json`` or, before a logger's ``finalize_job`` wrote it, merges the
ranks' communicator sidecars (:func:`holmes.logger.finalize.live_meta`). :class:`WindowJob` is what
the watcher hands to :func:`holmes.localize`: a :class:`~holmes.io.MemoryJob` whose rank tables
are read lazily, each from the rank's parts from a given part index on and cut to the iterations
``[lo, hi]``, so an analysis reads only the ranks it visits and only the window of each. A part
that cannot be read is skipped with a finding (:attr:`WindowJob.findings`).

Examples
--------
>>> import tempfile, holmes
>>> from holmes.simulate import run_simulation
>>> from holmes.simulate.writer import write_result
>>> d = write_result(run_simulation(tp=2, pp=1, dp=2, iterations=9, seed=1), tempfile.mkdtemp() + "/j", parts=3)
>>> meta, _ = job_meta(d)
>>> w = WindowJob(d, meta, lo=4, hi=7, min_part=1)
>>> sorted(set(w.ops(3).column("iteration").to_pylist()))
[4, 5, 6, 7]
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from holmes.errors import JobError, MissingRankError, ParseError
from holmes.io.job import MemoryJob
from holmes.io.models import JobMeta, load_model
from holmes.io.parts import has_rank_log, list_parts, locate_rank_log, rank_of_entry, read_part, read_rank_parts

__all__ = ["job_meta", "WindowJob"]

log = logging.getLogger(__name__)


def job_meta(job_dir: str | os.PathLike[str]) -> tuple[JobMeta, dict[int, bool] | None]:
    """``(metadata, closed)``: from ``job.json`` (``closed`` None: unknown), else from the sidecars
    of a live logger job (``closed``: rank -> whether it closed or dumped its log).

    Raises
    ------
    JobError
        Neither ``job.json`` nor any sidecar (yet), or they are invalid.
    """
    d = Path(job_dir)
    p = d / "job.json"
    if p.is_file():
        return load_model(p, JobMeta, JobError), _closed_sidecars(d)
    from holmes.logger.finalize import live_meta

    return live_meta(d)


def _closed_sidecars(d: Path) -> dict[int, bool] | None:
    """rank -> closed, from the logger's sidecars when the job has them."""
    if not (d / "comms").is_dir():
        return None
    try:
        from holmes.logger.finalize import live_meta

        return live_meta(d)[1]
    except JobError:
        return None


class _LazyRanks(Mapping):
    """rank -> its table cut to the window, read on first access.

    It holds its :class:`WindowJob` by a weak reference: no reference cycle, so a window (and the
    Arrow buffers of the tables it read) is freed as soon as the analysis drops it, not at the
    next full garbage collection (a watcher runs for days).
    """

    def __init__(self, owner: "WindowJob") -> None:
        self._ref = weakref.ref(owner)

    @property
    def _o(self) -> "WindowJob":
        o = self._ref()
        if o is None:
            raise JobError("the window this rank mapping belonged to is gone")
        return o

    def __contains__(self, rank: object) -> bool:
        return isinstance(rank, int) and has_rank_log(locate_rank_log(self._o.ranks_dir, rank))

    def __getitem__(self, rank: int) -> pa.Table:
        if rank not in self:
            raise KeyError(rank)
        return self._o._read(rank)

    def __iter__(self) -> Iterator[int]:
        try:
            names = os.listdir(self._o.ranks_dir)
        except FileNotFoundError:
            return iter(())
        ranks = {rank_of_entry(n) for n in names} - {None}
        return iter(sorted(r for r in ranks if r is not None and r < self._o.world_size and r in self))

    def __len__(self) -> int:
        return sum(1 for _ in self)


class WindowJob(MemoryJob):
    """A live job's ranks cut to the iterations ``[lo, hi]``, read lazily from their parts.

    Parameters
    ----------
    job_dir : path-like
    meta : JobMeta
    lo, hi : int, optional
        The iterations kept (inclusive; None: unbounded).
    min_part, max_part : int, optional
        Only parts with an index in ``[min_part, max_part]`` are read (the others hold iterations
        outside the window; a watcher behind the job must not read what came after).
    topology : ClusterTopology, optional
    """

    def __init__(self, job_dir: str | os.PathLike[str], meta: JobMeta, *, lo: int | None = None,
                 hi: int | None = None, min_part: int = 0, max_part: int | None = None,
                 topology: Any = None) -> None:
        super().__init__(meta, {}, topology=topology)
        self.path = Path(job_dir)
        self.ranks_dir = self.path / "ranks"
        self.lo, self.hi, self.min_part = lo, hi, max(0, int(min_part))
        self.max_part = None if max_part is None else int(max_part)
        #: what was worked around while reading (parts skipped)
        self.findings: list[str] = []
        self._ops = _LazyRanks(self)

    def __repr__(self) -> str:
        return f"WindowJob({str(self.path)!r}, iterations {self.lo}..{self.hi})"

    def _read(self, rank: int) -> pa.Table:
        p = locate_rank_log(self.ranks_dir, rank)
        try:
            if p.is_dir():
                found = [q for q in list_parts(p, self.min_part) if self.max_part is None or q.index <= self.max_part]
                got = read_rank_parts(p, rank, on_truncated="skip", parts=found or list_parts(p)[-1:])
                self.findings += got.findings
                t = got.table
            else:
                t = read_part(p, rank)
        except ParseError as exc:
            raise MissingRankError(str(exc)) from None
        it = t.column("iteration")
        if self.lo is not None:
            t = t.filter(pc.greater_equal(it, self.lo))
            it = t.column("iteration")
        if self.hi is not None:
            t = t.filter(pc.less_equal(it, self.hi))
        return t
