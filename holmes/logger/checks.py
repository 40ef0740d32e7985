"""Capture checks: a logger that silently records nothing, or records part of a job, is worse than
no logger. :func:`capture_warnings` reads a captured job's rank files and says, in plain words,
what looks missing; :func:`~holmes.logger.finalize_job` writes its findings to ``job.json``
(``source.warnings``), and the localization report repeats them as assumptions.

Checks, each a property every complete capture has:

* every rank logged operators (a rank file with no row, or no row on any rank: the hook saw
  nothing, e.g. a parallelism whose operators bypass it);
* after the first ``warmup`` marked steps, every rank logged at least one operator in every step
  up to the last one any rank logged in;
* on every communicator, its members logged the same number of collectives in each iteration
  (a collective runs on all members or none);
* between every two ranks, the sends of one equal the receives of the other in each iteration.

Examples
--------
>>> import tempfile
>>> from holmes.logger import CommOpsRecorder, finalize_job
>>> d = tempfile.mkdtemp()
>>> for r in (0, 1):
...     rec = CommOpsRecorder(d, rank=r, world_size=2)
...     rec.add_communicator("dp-0", [0, 1], kind="dp")
...     for it in range(4):
...         _ = rec.step(it)
...         if r == 0 or it < 3:
...             rec.record("dp-0", "all_reduce", nbytes=8, start_ns=10 * it, end_ns=10 * it + 5)
...     _ = rec.close()
>>> import holmes
>>> job = holmes.read_job(finalize_job(d).parent)
>>> for w in capture_warnings(job, marked={0: (0, 3), 1: (0, 3)}, warmup=1):
...     print(w)
rank 1 logged no operator in 1 marked step(s) after the first 1 (iteration 3)
communicator dp-0: its members logged different numbers of collectives in 1 iteration(s), e.g. iteration 3 (rank 0: 1, rank 1: 0)
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["capture_warnings", "WARMUP_STEPS"]

#: marked steps at the start of a job not checked for missing operators (warm-up, lazy init)
WARMUP_STEPS = 2


def _spans(its: list[int], limit: int = 4) -> str:
    """``[3, 4, 5, 9]`` -> ``"3-5, 9"`` (at most ``limit`` spans, then "...")."""
    out: list[str] = []
    start = prev = its[0]
    for i in its[1:] + [None]:  # type: ignore[list-item]
        if i is not None and i == prev + 1:
            prev = i
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ", ".join(out[:limit]) + (", ..." if len(out) > limit else "")


def capture_warnings(job: Any, marked: Mapping[int, tuple[int, int]] | None = None, *,
                     warmup: int = WARMUP_STEPS, max_items: int = 8) -> list[str]:
    """What looks missing from a captured job (see the module docstring), one sentence each.

    Parameters
    ----------
    job : holmes.io.Job
        The captured job (every rank file is read: iteration, comm_id, op, peer).
    marked : mapping, optional
        rank -> (first, last) iteration its step marks started (the logger's sidecars); without
        it, missing steps are not checked.
    warmup : int
        Marked steps at the start not checked for missing operators.
    max_items : int
        At most this many warnings of each kind.
    """
    warnings: list[str] = []
    per_rank: dict[int, dict[str, np.ndarray]] = {}
    ws = int(job.world_size)
    for r in range(ws):
        if not job.has_rank(r):
            continue
        t = job.ops(r).select(["iteration", "comm_id", "op", "peer"]).to_pydict()
        per_rank[r] = t
    rows = {r: len(t["iteration"]) for r, t in per_rank.items()}
    if rows and not any(rows.values()):
        return ["no rank logged any communication operator: the job's operators bypassed the logger's hooks, "
                "or the logger was enabled after they ran (docs/logger.md, 'Capture your job')"]
    empty = sorted(r for r, n in rows.items() if n == 0)
    if empty:
        warnings.append(f"{len(empty)} rank(s) logged no operator at all: {_spans(empty)}")
    last_any = max((max(t["iteration"]) for t in per_rank.values() if t["iteration"]), default=None)
    seen_its = {r: set(t["iteration"]) for r, t in per_rank.items()}
    n_missing = 0
    for r in sorted(per_rank):
        if not rows[r] or not marked or r not in marked or last_any is None:
            continue
        first, last = marked[r]
        hi = min(int(last), int(last_any))
        lacking = [i for i in range(int(first) + warmup, hi + 1) if i not in seen_its[r]]
        if lacking:
            n_missing += 1
            if n_missing <= max_items:
                warnings.append(f"rank {r} logged no operator in {len(lacking)} marked step(s) after the first "
                                f"{warmup} (iteration {_spans(lacking)})")
    # collectives: per communicator and iteration, the same count on every member
    comms = getattr(job, "communicators", None) or {}
    counts: dict[str, dict[int, Counter]] = defaultdict(dict)
    p2p: Counter = Counter()  # (src, dst, iteration, +1 send / -1 recv)
    for r, t in per_rank.items():
        for it, cid, op, peer in zip(t["iteration"], t["comm_id"], t["op"], t["peer"]):
            if peer is None:
                counts[cid].setdefault(r, Counter())[it] += 1
            elif op == "send":
                p2p[(r, peer, it)] += 1
            elif op == "recv":
                p2p[(peer, r, it)] -= 1
    n_comm = 0
    for cid in sorted(counts):
        info = comms.get(cid)
        members = [m for m in (info.ranks if info is not None else sorted(counts[cid])) if m in per_rank]
        its = sorted(set().union(*(counts[cid].get(m, Counter()).keys() for m in members)))
        bad = [it for it in its if len({counts[cid].get(m, Counter())[it] for m in members}) > 1]
        if bad:
            n_comm += 1
            if n_comm <= max_items:
                it = bad[0]
                ex = ", ".join(f"rank {m}: {counts[cid].get(m, Counter())[it]}" for m in members[:6])
                warnings.append(f"communicator {cid}: its members logged different numbers of collectives in "
                                f"{len(bad)} iteration(s), e.g. iteration {it} ({ex})")
    unmatched = sorted((k for k, v in p2p.items() if v), key=lambda k: (k[2], k[0], k[1]))
    if unmatched:
        pairs = sorted({(a, b) for a, b, _ in unmatched})
        a, b, it = unmatched[0]
        warnings.append(f"{len(unmatched)} (sender, receiver, iteration) triple(s) where one rank's sends and the "
                        f"other's receives differ in number, over {len(pairs)} pair(s), e.g. rank {a} -> rank {b} "
                        f"in iteration {it}")
    return warnings
