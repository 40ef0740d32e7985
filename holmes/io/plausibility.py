"""What a job's logs cannot mean, judged across ranks: the shape of each rank's log against its
peers', and times no communication operator can take.

The consistency pass (:mod:`holmes.io.consistency`) judges each row; a log can pass it row by row
and still say nothing true about the job:

* **a rank much shorter than its peers** -- fewer than half of the iterations its peers logged
  (every rank takes part in every training step), or under a quarter of their operators: its log
  was truncated or lost, and a slow rank whose log is cut says nothing about its slowness;
* **implausible times** -- a median operator under 1 us or a median step under 0.5 ms (no job's
  collectives complete that fast: timestamps in microseconds or milliseconds read as
  nanoseconds), or a median operator over an hour (a unit the other way);
* **zero-length operators** -- completed operators that took 0 ns (a clock that does not tick at
  this resolution, or a converter that invented end times);
* **ranks whose iterations do not overlap** those of most of the others (two halves of a job on
  disjoint iteration numbers);
* **a member that never logs on its communicator** while the other members read do;
* **``parallel`` contradicting ``communicators``** in ``job.json`` (:func:`layout_contradictions`).

:func:`rank_shapes` measures each rank's log (kept rows) in one vectorized pass;
:func:`judge` turns the shapes of the ranks read into findings, each ``severe`` or not: a severe
finding (a truncated rank, a rank whose times are mostly 0) makes the report's verdict
``inconclusive`` (never a quiet ``healthy`` or a named culprit on a log that cannot mean what it
says) and names the ranks. Implausible units are said but not severe: every analysis compares
times with times of the same job, so a unit off by 10^3 moves every time the report prints by
that factor but not which device stands out (a unit so coarse that operators last 0 ns is caught
by the zero-length rule).

Examples
--------
>>> s = {r: RankShape(iterations=6, ops=120, zero_length=0, median_op_ns=2e5, median_step_ns=5e7) for r in range(4)}
>>> s[1] = RankShape(iterations=1, ops=1, zero_length=0, median_op_ns=2e5, median_step_ns=5e7)
>>> [(f.severe, f.ranks) for f in judge(s)]
[(True, (1,))]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from holmes.stats import median_by_group

__all__ = ["RankShape", "Finding", "rank_shapes", "judge", "layout_contradictions", "SHORT_ITERATIONS", "SHORT_OPS", "MIN_OP_NS",
           "MIN_STEP_NS", "MAX_OP_NS", "ZERO_LENGTH_SHARE"]

#: a rank with fewer than this share of its peers' median iterations is short
SHORT_ITERATIONS = 0.5
#: ... or fewer than this share of their median operators (pipeline stages differ up to 2x)
SHORT_OPS = 0.25
#: the median collective or P2P transfer of a job does not complete in under 1 us (NCCL's smallest
#: intra-node latency is several microseconds, Gloo's tens)
MIN_OP_NS = 1e3
#: no distributed training step is under half a millisecond
MIN_STEP_NS = 500e3
#: no operator takes an hour (a hang leaves it open, not finished)
MAX_OP_NS = 3600e9
#: a rank whose completed operators mostly last 0 ns has no usable times
ZERO_LENGTH_SHARE = 0.5


@dataclass(frozen=True)
class RankShape:
    """The shape of one rank's log after the consistency pass (kept rows only)."""

    iterations: int
    ops: int
    zero_length: int
    median_op_ns: float
    median_step_ns: float
    comms: frozenset[str] = frozenset()
    first_iteration: int | None = None
    last_iteration: int | None = None


@dataclass(frozen=True)
class Finding:
    """One cross-rank finding: its message, the ranks it names, and whether a verdict may stand on it."""

    message: str
    ranks: tuple[int, ...] = ()
    severe: bool = False
    kind: str = field(default="", compare=False)


def _unique_pairs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The distinct ``(a, b)`` rows, sorted, as an ``(n, 2)`` array: one int64 key per pair and a 1-D
    unique (``np.unique(..., axis=0)`` sorts structured rows, 10x slower on millions of rows).

    >>> _unique_pairs(np.array([1, 0, 1, 1]), np.array([5, 7, 5, -2])).tolist()
    [[0, 7], [1, -2], [1, 5]]
    """
    a = np.asarray(a, np.int64)
    b = np.asarray(b, np.int64)
    if not a.size:
        return np.zeros((0, 2), np.int64)
    b0 = int(b.min())
    span = int(b.max()) - b0 + 1
    if int(a.max()) < (1 << 62) // span and int(a.min()) >= 0:
        k = np.unique(a * span + (b - b0))
        return np.stack([k // span, k % span + b0], axis=1)
    return np.unique(np.stack([a, b], axis=1), axis=0)


def _loo_median(x: np.ndarray) -> np.ndarray:
    """Per element, the median of all the others (exact, O(n log n): one sort).

    >>> _loo_median(np.array([1.0, 5.0, 3.0, 9.0])).tolist()
    [5.0, 3.0, 5.0, 3.0]
    """
    x = np.asarray(x, np.float64)
    n = x.size
    if n < 2:
        return np.full(n, np.nan)
    o = np.argsort(x, kind="stable")
    v = x[o]
    j = np.empty(n, np.int64)
    j[o] = np.arange(n)          # each element's place in the sorted order
    m = n - 1                    # how many others

    def at(i: int) -> np.ndarray:  # the i-th smallest of the others, per element
        return v[np.where(i < j, i, i + 1)]

    if m % 2:
        return at((m - 1) // 2)
    return (at(m // 2 - 1) + at(m // 2)) / 2.0


def rank_shapes(ri: np.ndarray, it: np.ndarray, st: np.ndarray, en: np.ndarray, ok: np.ndarray,
                comm: np.ndarray, comm_names: Sequence[str], ranks: Sequence[int]) -> dict[int, RankShape]:
    """Per rank of ``ranks``, the :class:`RankShape` of its rows.

    ``ri`` indexes ``ranks`` row by row; ``it``, ``st``, ``en`` the rows' iteration, start and end
    (ns); ``ok`` where both times are known (completed ops); ``comm`` codes into ``comm_names``.
    """
    n = len(ranks)
    ri = np.asarray(ri, np.int64)
    ops = np.bincount(ri, minlength=n)
    out: dict[int, RankShape] = {}
    if not ri.size:
        return {int(r): RankShape(0, 0, 0, float("nan"), float("nan")) for r in ranks}
    pair = _unique_pairs(ri, np.asarray(it, np.int64))
    iters = np.bincount(pair[:, 0], minlength=n)
    okm = np.asarray(ok, bool)
    dur = (np.asarray(en, np.float64) - np.asarray(st, np.float64))[okm]
    rk = ri[okm]
    zero = np.bincount(rk[dur == 0], minlength=n)
    med_op = median_by_group(rk, dur, n)
    # per (rank, iteration): first start to last end of the completed ops
    itk = np.asarray(it, np.int64)[okm]
    o = np.lexsort((itk, rk))
    starts = np.asarray(st, np.float64)[okm][o]
    ends = np.asarray(en, np.float64)[okm][o]
    g_r, g_it = rk[o], itk[o]
    med_step = np.full(n, np.nan)
    if o.size:
        first = np.r_[True, (g_r[1:] != g_r[:-1]) | (g_it[1:] != g_it[:-1])]
        b = np.flatnonzero(first)
        span = np.maximum.reduceat(ends, b) - np.minimum.reduceat(starts, b)
        med_step = median_by_group(g_r[b], span, n)
    cpair = _unique_pairs(ri, np.asarray(comm, np.int64))
    used: dict[int, set[str]] = {}
    for i, c in cpair.tolist():
        used.setdefault(i, set()).add(str(comm_names[c]))
    lo = np.full(n, np.iinfo(np.int64).max)
    hi = np.full(n, np.iinfo(np.int64).min)
    np.minimum.at(lo, pair[:, 0], pair[:, 1])
    np.maximum.at(hi, pair[:, 0], pair[:, 1])
    for i, r in enumerate(ranks):
        span = (int(lo[i]), int(hi[i])) if ops[i] else (None, None)
        out[int(r)] = RankShape(int(iters[i]), int(ops[i]), int(zero[i]), float(med_op[i]), float(med_step[i]),
                                frozenset(used.get(i, ())), *span)
    return out


def _names(ranks: Sequence[int], limit: int = 8) -> str:
    rs = list(ranks)
    return ", ".join(map(str, rs[:limit])) + (f" and {len(rs) - limit} more" if len(rs) > limit else "")


def judge(shapes: Mapping[int, RankShape], members: Mapping[str, Sequence[int]] | None = None) -> list[Finding]:
    """The cross-rank findings on the ranks of ``shapes`` (those read); ``members``: comm_id ->
    member ranks, for the communicators whose read members never log on them."""
    out: list[Finding] = []
    rs = sorted(shapes)
    if not rs:
        return out
    its = np.array([shapes[r].iterations for r in rs], float)
    ops = np.array([shapes[r].ops for r in rs], float)
    if len(rs) >= 3:
        mi_all, mo_all = _loo_median(its), _loo_median(ops)   # each rank's peers: every other rank read
        is_short = ((mi_all >= 2) & (its < SHORT_ITERATIONS * mi_all)) | ((mo_all >= 8) & (ops < SHORT_OPS * mo_all))
        short = [r for r, f in zip(rs, is_short.tolist()) if f]
        if short and len(short) < len(rs) / 2:
            r0 = short[0]
            peers = [r for r in rs if r not in short]
            mi = float(np.median([shapes[r].iterations for r in peers]))
            mo = float(np.median([shapes[r].ops for r in peers]))
            out.append(Finding(
                f"{len(short)} rank(s) logged far less than their peers ({_names(short)}; rank {r0}: "
                f"{shapes[r0].ops} op(s) in {shapes[r0].iterations} iteration(s), its peers a median of {mo:g} in "
                f"{mi:g}): their logs look truncated or lost, and what they did cannot be compared",
                tuple(short), severe=True, kind="short"))
    ranged = [r for r in rs if shapes[r].first_iteration is not None]
    if len(ranged) >= 2:
        lo = np.array([shapes[r].first_iteration for r in ranged])
        hi = np.array([shapes[r].last_iteration for r in ranged])
        # ranks whose span overlaps each one: all but those starting after it ends or ending before
        # it starts (two disjoint sets), by binary search -- no n x n matrix (8 GB at 32,768 ranks)
        n_r = len(ranged)
        after = n_r - np.searchsorted(np.sort(lo), hi, side="right")
        before = np.searchsorted(np.sort(hi), lo, side="left")
        others = n_r - after - before - 1
        apart = [r for r, k in zip(ranged, others.tolist()) if k < (len(ranged) - 1) / 2]
        if apart:
            r0 = apart[0]
            out.append(Finding(
                f"{len(apart)} rank(s) logged iterations that most of the others did not ({_names(apart)}; rank {r0}: "
                f"{shapes[r0].first_iteration}-{shapes[r0].last_iteration}): iteration numbers shifted, or logs of "
                "different periods; their steps cannot be compared", tuple(apart), severe=True, kind="apart"))
    med_op = np.array([shapes[r].median_op_ns for r in rs])
    med_step = np.array([shapes[r].median_step_ns for r in rs])
    if np.isfinite(med_op).any():
        mop = float(np.nanmedian(med_op))
        mstep = float(np.nanmedian(med_step)) if np.isfinite(med_step).any() else float("nan")
        if mop < MIN_OP_NS or (np.isfinite(mstep) and mstep < MIN_STEP_NS):
            out.append(Finding(
                f"implausibly short times: the median operator lasts {mop:g} ns and the median step "
                f"{mstep:g} ns (under {MIN_OP_NS:g} ns / {MIN_STEP_NS:g} ns): timestamps in microseconds "
                "or milliseconds read as nanoseconds? Every time in this report is off by the same factor",
                tuple(rs), severe=False, kind="units"))
        elif mop > MAX_OP_NS:
            out.append(Finding(
                f"implausibly long times: the median operator lasts {mop / 1e9:g} s: timestamps in a unit "
                "finer than nanoseconds?", tuple(rs), severe=False, kind="units"))
    zero = [r for r in rs if shapes[r].zero_length]
    if zero:
        mostly = [r for r in zero if shapes[r].ops and shapes[r].zero_length > ZERO_LENGTH_SHARE * shapes[r].ops]
        r0 = zero[0]
        out.append(Finding(
            f"{len(zero)} rank(s) logged zero-length operators ({_names(zero)}; rank {r0}: {shapes[r0].zero_length} "
            f"of {shapes[r0].ops}): a clock too coarse or end times invented"
            + (f"; on {len(mostly)} rank(s) most operators, whose times cannot be used" if mostly else ""),
            tuple(zero), severe=bool(mostly), kind="zero"))
    if members:
        silent: list[tuple[str, int]] = []
        read = set(rs)
        for cid, mem in members.items():
            got = [r for r in mem if r in read]
            logging = [r for r in got if cid in shapes[r].comms]
            if logging and len(logging) < len(got):
                silent.extend((cid, r) for r in got if cid not in shapes[r].comms)
        if silent:
            ranks = sorted({r for _, r in silent})
            cid, r0 = silent[0]
            out.append(Finding(
                f"{len(ranks)} rank(s) never log on a communicator of theirs while its other members do ({_names(ranks)}; "
                f"rank {r0} on {cid!r}): job.json's communicators or parallel layout contradict the logs",
                tuple(ranks), severe=False, kind="silent"))
    return out


def layout_contradictions(layout: object, communicators: Mapping[str, object]) -> list[Finding]:
    """Where ``job.json``'s ``parallel`` layout and its ``communicators`` disagree: per kind (tp,
    cp, dp, ep, pp) both describe, groups one lists and the other does not. Said, not severe: the
    logs are read against the communicators, and the roles come from the layout.

    >>> from holmes.topology.layout import Communicator, ParallelLayout
    >>> comms = {"tp-0": Communicator("tp", (0, 2)), "tp-1": Communicator("tp", (1, 3))}
    >>> layout_contradictions(ParallelLayout(tp=2, dp=2), comms)[0].message[:60]
    "job.json's parallel layout and its communicators disagree on"
    """
    derived = getattr(layout, "communicators", None)
    if derived is None:
        return []
    made: dict[str, set[tuple[int, ...]]] = {}
    try:
        groups = derived(expert_data=True)  # the expert data-parallel groups are dp groups too
    except TypeError:
        groups = derived()
    for c in groups.values():
        made.setdefault(c.kind, set()).add(tuple(sorted(c.ranks)))
    given: dict[str, set[tuple[int, ...]]] = {}
    for c in communicators.values():
        kind = getattr(c, "kind", None)
        if kind in made:
            given.setdefault(kind, set()).add(tuple(sorted(getattr(c, "ranks", ()))))
    bad = []
    for kind, groups in sorted(given.items()):
        extra = sorted(groups - made[kind])
        if extra:
            want = sorted(made[kind])
            bad.append(f"{kind}: {list(extra[0])} listed, the layout's {kind} groups are "
                       f"{', '.join(str(list(g)) for g in want[:2])}{' ...' if len(want) > 2 else ''}")
    if not bad:
        return []
    return [Finding(f"job.json's parallel layout and its communicators disagree on {len(bad)} kind(s) of group "
                    f"({'; '.join(bad[:3])}): the ranks' roles (from the layout) may not match who talks to whom",
                    (), severe=False, kind="layout")]
