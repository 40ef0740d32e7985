"""Iteration inference for inputs that do not record the training step: period of the op
pattern, cross-rank alignment, and send/recv alignment of ring-buffer windows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from holmes.adapters.notes import Notes
from holmes.adapters.rows import RankRows
from holmes.io.schema import P2P_OPS

__all__ = ["infer_iterations_by_period", "align_iterations", "assign_iterations_from_pattern", "align_p2p_by_time"]


def infer_iterations_by_period(signature: Sequence[Any], start_ns: np.ndarray, *, min_match: float = 0.9,
                               max_period: int = 4096, min_repeats: int = 2) -> tuple[np.ndarray, int] | None:
    """Split one rank's op sequence into iterations from the periodicity of its op pattern.

    The period is the smallest lag ``p`` at which at least ``min_match`` of the op signatures
    (e.g. ``(comm_id, op, nbytes)``) repeat, provided the pattern repeats ``min_repeats`` times.
    The iteration boundary inside the period is placed at the phase with the largest mean gap
    between consecutive op starts (the optimizer step / data loading between iterations).

    Returns
    -------
    (iterations, period) or None
        ``iterations`` numbers the rows 0, 1, ... (rows before the first boundary form iteration
        0); None when no period is found.

    Examples
    --------
    >>> sig = ["a", "b", "c"] * 4
    >>> t = np.array([0, 1, 2, 10, 11, 12, 20, 21, 22, 30, 31, 32])
    >>> it, p = infer_iterations_by_period(sig, t)
    >>> p, it.tolist()
    (3, [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3])
    """
    n = len(signature)
    if n < min_repeats or n < 2:
        return None
    _, codes = np.unique(np.array([repr(s) for s in signature], dtype=object).astype(str), return_inverse=True)
    codes = codes.ravel()
    head = codes[: min(n, 50_000)]
    m = len(head)
    period = None
    for p in range(1, min(max_period, m // min_repeats) + 1):
        if np.mean(head[p:] == head[:-p]) >= min_match:
            period = p
            break
    if period is None:
        return None
    t = np.asarray(start_ns, dtype=np.int64)
    gaps = np.r_[0, np.diff(t)].astype(np.float64)
    pos = np.arange(n) % period
    mean_gap = np.bincount(pos, weights=gaps, minlength=period) / np.maximum(np.bincount(pos, minlength=period), 1)
    if n > period:
        mean_gap[0] = max(mean_gap[0], np.mean(gaps[period::period]) if n > period else 0.0)
    phase = int(np.argmax(mean_gap))
    it = (np.arange(n) - phase) // period
    it -= it.min()
    return it.astype(np.int64), period


def align_iterations(keys: Mapping[int, Sequence[Any]], iters: Mapping[int, np.ndarray]) -> dict[int, int]:
    """Offsets that make independently numbered ranks agree on iteration numbers.

    ``keys[r]`` holds, per row of rank ``r``, a cross-rank identity of the op (e.g.
    ``(comm_id, seq)`` of a collective) or None; the same op must fall in the same iteration on
    every rank. Ranks are aligned one after another to the ones already aligned (median
    difference over shared ops); a rank sharing no op keeps offset 0. Returns rank -> offset to
    add.

    Examples
    --------
    >>> align_iterations({0: [("g", 5), ("g", 6)], 1: [("g", 6), ("g", 7)]},
    ...                  {0: np.array([3, 4]), 1: np.array([0, 1])})
    {0: -3, 1: 1}
    """
    ranks = sorted(keys)
    if not ranks:
        return {}
    seen: dict[Any, int] = {}
    offsets: dict[int, int] = {}
    pending = list(ranks)
    while pending:
        best, best_shared = None, -1
        for r in pending:
            shared = sum(1 for k in keys[r] if k is not None and k in seen)
            if shared > best_shared:
                best, best_shared = r, shared
        assert best is not None
        r = best
        diffs = [seen[k] - int(i) for k, i in zip(keys[r], iters[r]) if k is not None and k in seen]
        off = int(np.median(diffs)) if diffs else 0
        offsets[r] = off
        for k, i in zip(keys[r], iters[r]):
            if k is not None and k not in seen:
                seen[k] = int(i) + off
        pending.remove(r)
    low = min(int(np.min(iters[r])) + offsets[r] for r in ranks if len(iters[r]))  if any(len(iters[r]) for r in ranks) else 0
    return {r: o - low for r, o in offsets.items()}


def assign_iterations_from_pattern(rows: Mapping[int, RankRows], notes: Notes, seq_col: str, what: str) -> None:
    """Fill the ``iteration`` column of every rank from its op pattern's period (in place).

    Each rank is split by :func:`infer_iterations_by_period` over its ``(comm_id, op, nbytes)``
    sequence; ranks are then aligned by :func:`align_iterations` on collectives sharing
    ``(comm_id, row[seq_col])``. If any rank shows no period, every op stays in iteration 0 and a
    warning says so (a partial split would disagree across ranks).
    """
    found: dict[int, np.ndarray] = {}
    periods: dict[str, int] = {}
    for r, rr in rows.items():
        c = rr.cols
        if not len(rr):
            continue
        start = np.array(c["start_ns"], dtype=np.int64)
        order = np.argsort(start, kind="stable")
        sig = [(c["comm_id"][i], c["op"][i], c["nbytes"][i]) for i in order]
        res = infer_iterations_by_period(sig, start[order])
        if res is None:
            found = {}
            break
        it = np.empty(len(rr), dtype=np.int64)
        it[order] = res[0]
        found[r] = it
        periods[str(r)] = res[1]
    if not found:
        notes.warn(f"iterations are not in {what} and no repeating op pattern was found on every rank "
                   "(logs too short?): every op is in iteration 0")
        return
    keys = {r: [(cid, int(s)) if op not in P2P_OPS and s is not None and int(s) >= 0 else None
                for cid, op, s in zip(rows[r].cols["comm_id"], rows[r].cols["op"], rows[r].cols[seq_col])]
            for r in found}
    offsets = align_iterations(keys, found)
    for r, it in found.items():
        rows[r].cols["iteration"] = (it + offsets[r]).tolist()
    notes.infer(f"iterations are not in {what}: inferred from the period of each rank's (group, op, bytes) "
                "sequence, boundary at the largest recurring gap between ops, aligned across ranks by shared "
                "collective sequence numbers")
    notes.details["iteration_period_ops"] = periods


def align_p2p_by_time(send_t: np.ndarray, recv_t: np.ndarray) -> int:
    """Offset ``d`` such that the k-th send matches the (k-d)-th recv, from issue times.

    Used when each side only holds a window of its history (ring buffers): among all shifts
    with at least one overlapping pair, the one with the smallest median absolute time
    difference wins (ties: the larger overlap, then the smaller shift).

    Examples
    --------
    >>> align_p2p_by_time(np.array([100, 200, 300]), np.array([201, 301]))
    1
    """
    a = np.asarray(send_t, dtype=np.float64)
    b = np.asarray(recv_t, dtype=np.float64)
    if len(a) == 0 or len(b) == 0:
        return 0
    best = (np.inf, 0, 0)
    for d in range(-(len(b) - 1), len(a)):
        lo = max(0, d)
        hi = min(len(a), len(b) + d)
        if hi <= lo:
            continue
        err = float(np.median(np.abs(a[lo:hi] - b[lo - d:hi - d])))
        cand = (err, -(hi - lo), abs(d))
        if cand < best:
            best = cand
            best_d = d
    return int(best_d) if np.isfinite(best[0]) else 0
