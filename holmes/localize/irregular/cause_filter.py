"""Which root causes of an iteration stand: the ones that explain it.

Algorithm 1 ends every branch somewhere: on the operator that started late (compute) or ran long
(network). In an iteration stretched by one slow device that is the device; in an iteration
stretched a few sigmas by the job's own jitter the delay is spread thin over many ranks and the
search ends wherever the last small wait led -- on an operator about as long as usual. Four
rules keep such causes from counting as evidence:

* :func:`drop_diffuse` -- unrelated causes of similar size in one iteration are a job-wide
  disturbance, not a device (the iteration is *common*);
* :func:`drop_minor` -- a cause that cost its rank only a small share of the iteration's excess
  did not make the iteration slow (the iteration is *without cause*);
* :func:`drop_unproven` -- in an iteration stretched a few sigmas only (a *candidate*), a cause
  counts only when its rank's own work stood out of that rank's noise (:func:`cause_z`);
* :func:`drop_usual_compute` -- in any iteration, a compute cause counts only when its rank
  computed longer than its own noise allows (:func:`computed_longer`);
* :func:`drop_stalls` -- a compute cause whose rank's extra compute was one gap while its other
  compute of the iteration ran as usual is a one-off stall (:func:`one_off_stall`), the rule the
  whole-job comparison applies to its events (``cell_transient``).

The first two weigh a cause by :func:`cause_cost` (what it cost its rank in its iteration), the
last two by :func:`cause_z` (how far that stood out of the rank's own noise).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from holmes.calibration.thresholds import or_shipped
from holmes.localize.evidence.search import COMPUTE, RootCause
from holmes.stats import MAD_SIGMA, recurring
from holmes.topology import kinds

__all__ = ["cause_cost", "cause_z", "components", "computed_longer", "drop_diffuse", "drop_minor", "drop_stalls",
           "drop_unproven", "drop_usual_compute", "explains", "one_off_stall", "proven_devices"]


def components(involved: list[set[Any]]) -> list[list[int]]:
    """Indices of ``involved`` grouped by overlap (connected components of "shares an element").

    >>> components([{4, 5, "nvswitch:1"}, {2, 3, "nvswitch:0"}])
    [[0], [1]]
    >>> components([{1, 5}, {1, "host:0"}, {3, 7}, {1, 3}])
    [[0, 1, 2, 3]]
    """
    groups: list[tuple[set[Any], list[int]]] = []
    for i, s in enumerate(involved):
        s, idx = set(s), [i]
        for g in [g for g in groups if g[0] & s]:
            s |= g[0]
            idx += g[1]
            groups.remove(g)
        groups.append((s, sorted(idx)))
    return sorted((g[1] for g in groups), key=lambda idx: idx[0])


def cause_cost(ro: Any, row: int, compute: bool, usual: Any = None, *, min_usual: int | None = None) -> float:
    """What a cause cost its rank in its iteration: the larger of its operator's excess over its
    usual length (:meth:`~holmes.cog.RankOps.excess`) and how much more than in its median
    iteration the rank spent in the iteration -- computing (a compute cause) or in the
    operators of the cause's communicator (a network cause: a slower NVSwitch stretches each of
    a tensor-parallel group's hundreds of collectives a little). ``usual``: the iterations whose
    median is the rank's usual level (default every iteration of the rank; a slowdown that
    persists over most of them needs the job's regular ones). With fewer than ``min_usual``
    iterations (threshold ``cause_min_iterations``) it is the operator's own excess.

    >>> dur = [2 if i // 4 != 1 else 5 for i in range(3 * 4)]   # iteration 1: each collective +3
    >>> from holmes.cog.examples import example_rank
    >>> ro = example_rank(dur, per_iteration=4)
    >>> cause_cost(ro, 5, compute=False)   # 3 ns on one operator, 12 over the iteration
    12.0
    """
    its, per, k, one = _per_iteration(ro, row, compute)
    base = per if usual is None else per[np.isin(its, usual)]
    base = per if base.size == 0 else base
    return max(one, float(per[k] - np.median(base))) if its.size >= or_shipped(min_usual, "cause_min_iterations") else one


def cause_z(ro: Any, row: int, compute: bool, usual: Any, *, min_usual: int | None = None) -> float:
    """How far the rank's own work of a cause stood out in its iteration: its time computing (a
    compute cause) or in the cause's communicator (a network cause) against the same over the
    ``usual`` iterations, in robust sigmas (``1.4826 * MAD``; NaN with under ``min_usual`` usual
    iterations, threshold ``cause_min_iterations``: nothing to judge against).

    A slow device shows in the work it did itself, not only in the iteration it stretched: a
    cause standing ``z`` sigmas out of its own rank's noise is the device; one where the search
    ended in an iteration stretched by jitter shows the rank's usual time.

    >>> dur = [2 + (i // 2) % 2 if i // 2 != 4 else 9 for i in range(6 * 2)]   # iteration 4: +6-7 per op
    >>> from holmes.cog.examples import example_rank
    >>> ro = example_rank(dur, per_iteration=2)
    >>> cause_z(ro, 8, compute=False, usual=[0, 1, 2, 3, 5]) > 4, cause_z(ro, 2, compute=False, usual=[0, 1, 2, 3, 5]) < 2
    (True, True)
    """
    its, per, k, _ = _per_iteration(ro, row, compute)
    base = per[np.isin(its, usual) & (its != its[k])]
    if base.size < or_shipped(min_usual, "cause_min_iterations"):
        return float("nan")
    med = float(np.median(base))
    sigma = MAD_SIGMA * float(np.median(np.abs(base - med)))
    return float((per[k] - med) / max(sigma, 1.0))


def _per_iteration(ro: Any, row: int, compute: bool) -> tuple[np.ndarray, np.ndarray, int, float]:
    """The rank's iterations, its excess per iteration where the cause lies (computing, or in
    the cause's communicator), the cause's iteration's index, and the cause operator's own excess."""
    gap_x, dur_x = ro.excess()
    x = gap_x if compute else dur_x
    its, per = ro.iteration_sums(x.astype(float) if compute else np.where(ro.comm == ro.comm[row], x, 0.0))
    return its, per, int(np.searchsorted(its, ro.iteration[row])), float(x[row])


def drop_diffuse(ev: Any, ranks: Any, host_of: Any, dominance: float | None = None, *,
                 min_usual: int | None = None) -> None:
    """Per iteration, keep only the causes related to its strongest one.

    Causes are related when they share a rank, a device, or (compute causes) a host. An
    iteration whose causes fall into unrelated groups keeps the group whose strongest cause (what
    it cost the iteration: :func:`cause_cost`) is at least ``dominance`` times the next group's;
    otherwise it is *diffuse*: unrelated slowdowns of similar size at once are the mark of a
    job-wide disturbance (a loaded machine, a shared file system), not of one faulty device, and
    the iteration moves to ``ev.common``. ``dominance``: threshold ``diffuse_dominance``.
    """
    dominance = or_shipped(dominance, "diffuse_dominance")
    by_it: dict[int, list[int]] = {}
    for i, c in enumerate(ev.causes):
        by_it.setdefault(c.iteration, []).append(i)

    def involved(i: int) -> set[Any]:
        c = ev.causes[i]
        out: set[Any] = set(c.ranks) | set(ev.implicated[i])
        if c.cause == COMPUTE:
            out |= {kinds.host(host_of(r)) for r in c.ranks}
        return out

    def strength(i: int) -> float:
        c = ev.causes[i]
        return cause_cost(ranks[c.rank], c.row, c.cause == COMPUTE, min_usual=min_usual)

    keep: list[int] = []
    for it, idx in by_it.items():
        comps = components([involved(i) for i in idx])
        if len(comps) == 1:
            keep += idx
            continue
        best = sorted(((max(strength(idx[j]) for j in comp), comp) for comp in comps), key=lambda x: -x[0])
        if best[0][0] >= dominance * best[1][0]:
            keep += [idx[j] for j in best[0][1]]
        else:
            ev.common.append(it)
    _keep(ev, sorted(keep))


def explains(ro: Any, cause: RootCause, excess: float, share: float, usual: Any = None, *,
             min_usual: int | None = None) -> bool:
    """Whether ``cause`` cost its rank (:func:`cause_cost` against the ``usual`` iterations) at
    least ``share`` of its iteration's ``excess`` over the usual iteration (ns).

    >>> from holmes.localize.evidence.search import RootCause
    >>> dur = [2 if i // 4 != 3 else 5 for i in range(5 * 4)]   # iteration 3: each collective +3
    >>> from holmes.cog.examples import example_rank
    >>> ro = example_rank(dur, per_iteration=4)
    >>> c = RootCause(iteration=3, cause="network", ranks=(0,), rank=0, row=13, op={})
    >>> explains(ro, c, excess=30, share=1 / 3), explains(ro, c, excess=60, share=1 / 3)
    (True, False)
    """
    if share <= 0 or excess <= 0:
        return True
    return cause_cost(ro, cause.row, cause.cause == COMPUTE, usual, min_usual=min_usual) >= share * excess


def drop_minor(ev: Any, ranks: Mapping[int, Any], excess: Mapping[int, float], share: float,
               usual: Any = None, *, min_usual: int | None = None) -> None:
    """Drop the causes of ``ev`` (an :class:`~holmes.localize.irregular.analysis.Evidence`) that do not
    :func:`explain <explains>` their iteration (``excess``: iteration -> its excess, ns); an
    iteration left without a cause joins ``ev.without_cause``."""
    if share <= 0 or not ev.causes:
        return
    _drop_unless(ev, lambda c: explains(ranks[c.rank], c, excess.get(c.iteration, 0.0), share, usual,
                                        min_usual=min_usual))


def drop_unproven(ev: Any, ranks: Mapping[int, Any], candidates: Any, own_z: float, usual: Any, *,
                  min_usual: int | None = None) -> None:
    """Drop the causes of the ``candidates`` iterations (stretched a few sigmas, not beyond doubt)
    whose own work did not stand ``own_z`` sigmas out of its rank's ``usual`` level
    (:func:`cause_z`); a candidate left without a cause joins ``ev.without_cause``."""
    cand = _iterations(candidates)
    if own_z <= 0 or not cand or not ev.causes:
        return
    _drop_unless(ev, lambda c: c.iteration not in cand or _stands_out(ranks, c, own_z, usual, min_usual))


def proven_devices(ev: Any, ranks: Mapping[int, Any], candidates: Any, own_z: float, usual: Any, *,
                   min_usual: int | None = None) -> set[str]:
    """The devices implicated by a cause of the ``candidates`` iterations that stood ``own_z``
    sigmas out of its rank's ``usual`` level (:func:`cause_z`)."""
    cand = _iterations(candidates)
    if own_z <= 0:
        return set()
    return {d for c, devs in zip(ev.causes, ev.implicated)
            if c.iteration in cand and _stands_out(ranks, c, own_z, usual, min_usual) for d in devs}


def computed_longer(ro: Any, cause: RootCause, compute_z: float, usual: Any, *, min_usual: int | None = None) -> bool:
    """Whether ``cause`` is no compute cause, or its rank ``ro`` computed at least ``compute_z``
    robust sigmas longer in its iteration than over its ``usual`` iterations (:func:`cause_z`;
    true when there are too few usual iterations to judge, or ``compute_z`` is 0).

    The search ends on a rank's compute when it finds nothing later to follow: a slow GPU (its
    compute grew far beyond its noise), or, in an iteration a network fault stretched, the rank
    that happened to arrive last (its compute as usual: the delay came in through an operator the
    detector did not flag).

    >>> from holmes.localize.evidence.search import RootCause
    >>> n = 6 * 2
    >>> gaps = [8 + (i // 2) % 2 + (5 if i // 2 == 4 else 0) for i in range(n)]   # iteration 4: each gap +5
    >>> from holmes.cog.examples import example_rank
    >>> ro = example_rank([2] * n, per_iteration=2, start=[sum(gaps[:i + 1]) + 2 * i for i in range(n)])
    >>> slow = RootCause(iteration=4, cause="compute", ranks=(0,), rank=0, row=8, op={})
    >>> usual = RootCause(iteration=2, cause="compute", ranks=(0,), rank=0, row=4, op={})
    >>> computed_longer(ro, slow, 4.0, [0, 1, 2, 3, 5]), computed_longer(ro, usual, 4.0, [0, 1, 2, 3, 5])
    (True, False)
    """
    if compute_z <= 0 or cause.cause != COMPUTE:
        return True
    return not cause_z(ro, cause.row, True, usual, min_usual=min_usual) < compute_z   # NaN (nothing to judge against) counts


def drop_usual_compute(ev: Any, ranks: Mapping[int, Any], compute_z: float, usual: Any, *,
                       min_usual: int | None = None) -> None:
    """Drop the compute causes of ``ev`` whose rank did not compute longer than its noise allows
    (:func:`computed_longer`); an iteration left without a cause joins ``ev.without_cause``."""
    if compute_z <= 0 or not ev.causes:
        return
    _drop_unless(ev, lambda c: computed_longer(ranks[c.rank], c, compute_z, usual, min_usual=min_usual))


def one_off_stall(ranks: Mapping[int, Any], c: RootCause, min_spread: float, quantile: float, min_ops: int) -> bool:
    """Whether a compute cause is a one-off stall: on its rank(s), the compute gaps of its
    iteration other than the most grown one grew at under ``min_spread`` of that one's rate
    (their excess over the usual length, :meth:`~holmes.cog.RankOps.excess` at ``quantile``;
    median over the cause's read ranks). A slower GPU or host stretches all its compute alike
    (near 1); the operating system, a heavy-tailed kernel or the simulator's compute hiccup stalls
    one gap (near 0). Unmeasurable (under ``min_ops`` gaps, nothing grown): not a stall."""
    from holmes.localize.irregular.cells import _rest_over_top  # the whole-job comparison's own measure

    if c.cause != COMPUTE or min_spread <= 0:
        return False
    ratios = []
    for r in c.ranks:
        ro = ranks.get(r)
        if ro is None:
            continue
        lo, hi = ro.iteration_rows(c.iteration)
        ex = ro.excess(quantile)[0][lo:hi].astype(float)
        ratios.append(_rest_over_top(ex, ro.gap[lo:hi].astype(float) - ex, min_ops))
    ratios = [x for x in ratios if np.isfinite(x)]
    return bool(ratios) and float(np.median(ratios)) < min_spread


def drop_stalls(ev: Any, ranks: Mapping[int, Any], min_spread: float, quantile: float, min_ops: int,
                recur_p: float = 0.0, slots: int = 0) -> list[RootCause]:
    """Drop the compute causes of ``ev`` that are one-off stalls (:func:`one_off_stall`); returns
    them. An iteration left without a cause joins ``ev.without_cause``.

    A rank whose compute causes (stalls or not, once per iteration) recur beyond chance
    (:func:`~holmes.stats.recurring` at ``recur_p`` over ``slots`` ranks, the threshold
    ``transient_recur_p``) keeps its stalls: one-off means once."""
    if min_spread <= 0 or not ev.causes:
        return []
    stalls = [c for c in ev.causes if one_off_stall(ranks, c, min_spread, quantile, min_ops)]
    if recur_p > 0 and slots > 0 and stalls:  # every compute cause's rank, once per iteration
        seen = {(c.rank, c.iteration) for c in ev.causes if c.cause == COMPUTE}
        again = recurring([r for r, _ in sorted(seen)], slots, recur_p)
        stalls = [c for c in stalls if c.rank not in again]
    if stalls:
        _drop_unless(ev, lambda c: not any(c is s for s in stalls))
    return stalls


def _iterations(candidates: Any) -> set[int]:
    return {int(i) for i in np.asarray(candidates).tolist()}


def _stands_out(ranks: Mapping[int, Any], c: RootCause, own_z: float, usual: Any, min_usual: int | None) -> bool:
    return cause_z(ranks[c.rank], c.row, c.cause == COMPUTE, usual, min_usual=min_usual) >= own_z


def _drop_unless(ev: Any, holds: Callable[[RootCause], bool]) -> None:
    """Keep the causes for which ``holds``; an iteration left without a cause joins
    ``ev.without_cause``."""
    before = {c.iteration for c in ev.causes}
    _keep(ev, [i for i, c in enumerate(ev.causes) if holds(c)])
    ev.without_cause += sorted(before - {c.iteration for c in ev.causes})


def _keep(ev: Any, keep: list[int]) -> None:
    """Keep only the causes (and their implicated devices) at the indices ``keep``."""
    ev.causes = [ev.causes[i] for i in keep]
    ev.implicated = [ev.implicated[i] for i in keep]
