"""The persistent analysis's map/reduce on an executor: the steps of
:mod:`~holmes.localize.persistent.partials` submitted as tasks (in process, or on a cluster through
:mod:`holmes.parallel`), a few reduce blocks in flight at a time.

Examples
--------
>>> import holmes
>>> from holmes.localize.persistent.rank import persistent_window
>>> from holmes.localize.persistent.partials import fold_parts, part_of
>>> from holmes.localize.persistent.rank import persistent_summaries
>>> job = holmes.read_job("fixtures/gpu16-clean")
>>> win = persistent_window(job)
>>> f, missing = gather_folded(job, win, job.communicators, chunk=5, nblocks=3)
>>> g = fold_parts([part_of(persistent_summaries(job, win))], job.communicators, 16, win)
>>> bool((f.caused == g.caused).all() and (f.X == g.X).all()), missing
(True, {})
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from holmes.calibration.thresholds import Thresholds, load_thresholds
from holmes.localize.persistent.partials import (Part, _kept_rows, assemble, block_config, block_fold, chunk_part,
                                                 collect_rows, plan)
from holmes.localize.persistent.wait import Folded
from holmes.parallel.sizes import (BLOCK_ROWS, DISTRIBUTED_CHUNK, INPROCESS_BLOCKS, INPROCESS_CHUNK,
                                   OPS_PER_RANK_ITERATION)

__all__ = ["gather_folded"]


def _meta(part: Part) -> Part:
    return part.meta()


def _rows(part: Part) -> dict[str, np.ndarray] | None:
    return part.rows


def _piece(part: Part, b: int) -> dict[str, np.ndarray]:
    return part.blocks[b]


def _chunk_task(source: Any, ranks: list[int], window: np.ndarray, keep: np.ndarray | None, nblocks: int,
                thresholds: Thresholds | None) -> Part:
    from holmes.detect.jobmap import open_job

    return chunk_part(open_job(source), ranks, window, keep=keep, nblocks=nblocks, thresholds=thresholds)


def gather_folded(job: Any, window: Any, communicators: Mapping[str, Any], *, scheduler: Any = None,
                  program_its: np.ndarray | None = None, program: bool = True, restricted: bool = False,
                  thresholds: Thresholds | None = None, chunk: int | None = None,
                  nblocks: int | None = None, clock: np.ndarray | None = None) -> tuple[Folded, dict[int, str]]:
    """Map, plan, reduce by block and assemble on an executor: the job's
    :class:`~holmes.localize.persistent.wait.Folded` and its unreadable ranks.

    Parameters
    ----------
    job : path, Job or JobSource
        In process, read as given; on a cluster each map task opens the job's directory by path.
    window : int array
        The iterations (:func:`~holmes.localize.persistent.rank.persistent_window`).
    communicators : mapping
        The job's communicators.
    scheduler : None, str, distributed.Client or Executor
        Where the tasks run (:func:`holmes.parallel.get_executor`).
    program_its : int array, optional
        The window iterations the what-if replays run on (None: all).
    program : bool
        Build the what-if program (its rows travel to this process).
    restricted : bool
        Keep only ``program_its``'s rows in the program (the job has no compute tables whose
        per-row alignment needs all of them).
    chunk, nblocks : int, optional
        Ranks per map task and reduce blocks (default: :data:`INPROCESS_CHUNK` ranks in process,
        :data:`DISTRIBUTED_CHUNK` on a cluster; about one block per :data:`BLOCK_ROWS` window
        operators, at least :data:`INPROCESS_BLOCKS` in process and two per worker on a cluster).
        The result does not depend on them.
    clock : int array, optional
        Per rank, which clock its timestamps read (:func:`block_config`; default: none shared, every
        pair read by its durations).
    """
    from holmes.detect.jobmap import job_source
    from holmes.localize.evidence.sources import JobSource, open_source
    from holmes.parallel import get_executor, split_items

    th = thresholds or load_thresholds()
    win = np.asarray(window, dtype=np.int64)
    T = len(win)
    ex = get_executor(scheduler)
    try:
        src = job_source(getattr(job, "job", job) if isinstance(job, JobSource) else job, ex) if ex.distributed \
            else open_source(job)
        W = open_source(job).world_size
        blocks_for_size = -(-W * T * OPS_PER_RANK_ITERATION // BLOCK_ROWS)
        if ex.distributed:
            chunk = chunk or DISTRIBUTED_CHUNK
            nblocks = nblocks or max(2 * ex.workers, blocks_for_size)
        else:
            chunk, nblocks = chunk or INPROCESS_CHUNK, nblocks or max(INPROCESS_BLOCKS, blocks_for_size)
        keep = None
        if program:
            keep = np.zeros(T, np.bool_)
            keep[program_its if restricted and program_its is not None else slice(None)] = True
        parts = [ex.submit(_chunk_task, src, rs, win, keep, nblocks, th) for rs in split_items(list(range(W)), chunk)]
        metas = [ex.fetch(ex.submit(_meta, h)) for h in parts]
        pl = plan(metas, communicators)
        rows = needed_by_block = None
        if program:  # one part's rows at a time, fetched and placed
            rows, needed_by_block = collect_rows(pl, (ex.fetch(ex.submit(_rows, h)) for h in parts),
                                                 _kept_rows(pl, program_its, restricted), nblocks)
        del metas
        cfg = ex.share(block_config(pl, th, clock))
        to_global = ex.share(pl.to_global)
        def submit(b: int) -> Any:
            return ex.submit(block_fold, [ex.submit(_piece, p, b) for p in parts], to_global, cfg,
                             None if needed_by_block is None else needed_by_block[b])

        def blocks() -> Iterator[dict[str, Any]]:
            # a few blocks on the cluster at a time (each worker busy, one result on its way), fetched and dropped
            ahead = deque(submit(b) for b in range(min(nblocks, ex.workers + 1)))
            nxt = len(ahead)
            while ahead:
                h = ahead.popleft()
                value = ex.fetch(h)
                ex.release(h)
                del h
                if nxt < nblocks:
                    ahead.append(submit(nxt))
                    nxt += 1
                yield value
                del value
            for p in parts:
                ex.release(p)

        f = assemble(pl, blocks(), rows, replay_its=program_its, restricted=restricted)
        return f, pl.missing
    finally:
        if ex is not scheduler:
            ex.close()
