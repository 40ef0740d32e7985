"""Which of the pivot's iterations are irregular: the paper's delta rule and the rules for faults
that cost only a few percent of a step on a quiet job.

:func:`flag_iterations` applies them in order (each documented at its parameter in
:class:`~holmes.localize.params.LocalizeParams`):

* **delta** -- longer than ``delta`` times the usual iteration (:class:`holmes.detect.IrregularityRule`);
* **stretch** -- ``stretch_z`` healthy sigmas out and ``min_stretch`` longer: beyond doubt;
* **step** -- the iterations after a step up that lasts to the end of the window (``shift_z``,
  ``min_shift``);
* **repeats** -- when nothing else stands out, two or more iterations ``repeat_z`` sigmas out:
  a device counts only when it explains two of them (``min_hits``);
* **candidates** -- ``candidate_z`` to ``stretch_z`` sigmas out: searched, but only a cause
  standing out of its own rank's noise counts (:func:`holmes.localize.irregular.cause_filter.drop_unproven`).

Jobs read whole keep the delta rule alone: their cells judge every iteration of every device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from holmes.detect.monitor import IrregularityRule

__all__ = ["Flags", "flag_iterations"]


@dataclass
class Flags:
    """The pivot's flagged iterations (boolean masks over its window)."""

    irregular: np.ndarray
    #: each iteration's z-score the weights are drawn from (a rule may raise it to its own evidence)
    z: np.ndarray
    candidates: np.ndarray
    #: a device must explain this many searched iterations (the repeat rule; 0: one is enough)
    min_hits: int = 0


def flag_iterations(its: np.ndarray, durs: np.ndarray, p: Any, whole: bool,
                    assume: Callable[[str], None] = lambda s: None) -> Flags:
    """Flag the pivot's irregular iterations ``its`` of durations ``durs`` (ns) under the
    parameters ``p``; ``whole``: the job is read whole (the delta rule alone); ``assume``
    records what a rule concluded (the report's assumptions).

    >>> from holmes.localize.params import LocalizeParams
    >>> d = np.r_[np.full(10, 100.0), 100.5, 101, 99.5, 100, 106, np.full(5, 100.0)]
    >>> f = flag_iterations(np.arange(20), d, LocalizeParams(), whole=False)
    >>> np.flatnonzero(f.irregular).tolist(), f.min_hits
    ([14], 0)
    >>> np.flatnonzero(flag_iterations(np.arange(20), d, LocalizeParams(), whole=True).irregular).tolist()
    []
    """
    rule = IrregularityRule(p.delta)
    z = rule.z_scores(durs)
    if p.t.noise_window:
        z = np.minimum(z, rule.z_scores(durs, local=p.t.noise_window))
    mask = rule.mask(durs)
    if whole:
        return Flags(mask, z, np.zeros_like(mask))
    ref = rule.reference(durs)
    z_floor = rule.z_scores(durs, mad_floor=True)   # the stretch, candidate and repeat rules' sigmas
    if p.t.noise_mad_floor:
        z = np.minimum(z, z_floor)  # the iterations' weights in the same sigmas
    long_enough = durs > (1.0 + p.t.min_stretch) * ref
    enough = durs.size >= p.t.stretch_min_iterations
    if p.t.stretch_z > 0 and enough:
        # beyond doubt though under delta: far out of the job's own noise and a real cost (not
        # next to a delta-irregular one: a delay late in an iteration spills into the next)
        mask |= (z_floor >= p.t.stretch_z) & long_enough & ~_beside(mask)
    if p.t.shift_z > 0:
        z = _step(its, durs, p, rule, ref, mask, z, assume)
    cand = np.zeros_like(mask)
    if p.t.candidate_z > 0 and p.t.stretch_z > 0 and enough:
        # a few sigmas out, not beyond doubt: searched, but only a cause standing out of its own
        # rank's noise counts, and one no cause explains is the job's noise
        cand = (z_floor >= p.t.candidate_z) & long_enough & ~mask & ~_beside(mask)
    min_hits = 0
    if p.t.repeat_z > 0 and enough and not mask.any():
        # a fault that returns, each time a few percent: several iterations stretched a few
        # sigmas, none beyond doubt alone; searched with full weight, but a device counts only if
        # it explains two of them (chance rarely blames one device twice)
        rep = (z_floor >= p.t.repeat_z) & long_enough
        if rep.sum() >= 2:
            min_hits = 2
            z = np.where(rep, np.maximum(z, p.t.noise_z + 1.0), z)
            mask |= rep
            assume(f"no iteration irregular, but {int(rep.sum())} stretched {p.t.repeat_z:g}+ sigmas and over "
                   f"{100 * p.t.min_stretch:g}%: searched for a device that explains two of them or more")
    if cand.any():
        mask |= cand
        assume(f"{int(cand.sum())} iteration(s) {p.t.candidate_z:g}-{p.t.stretch_z:g} sigmas out searched as candidates "
               f"(a cause counts alone only when its own work stood {p.t.own_z:g} sigmas out of its rank's noise)")
    return Flags(mask, z, cand, min_hits)


def _step(its: np.ndarray, durs: np.ndarray, p: Any, rule: IrregularityRule, ref: float, mask: np.ndarray,
          z: np.ndarray, assume: Callable[[str], None]) -> np.ndarray:
    """Flag (in ``mask``) the iterations after a step up lasting to the end of the window: a
    device slow from some iteration on, each iteration after it only a few percent longer (its z
    over the window's spread, which the step itself widens, stays small); returns ``z`` raised
    to the step's evidence there (``ref``: the usual iteration)."""
    k, t, shift = rule.level_shift(durs)
    if not (t >= p.t.shift_z and shift >= p.t.min_shift * ref):
        return z
    base = float(np.median(durs[:k]))
    after = np.zeros_like(mask)
    after[k:] = durs[k:] > base + shift / 2.0
    mask |= after
    assume(f"the pivot's iterations stepped up by {100 * shift / ref:.1f}% from "
           f"iteration {int(its[k])} on ({t:.1f} standard errors): those above half the step are irregular")
    return np.where(after, np.maximum(z, t), z)  # weighed by the step's evidence


def _beside(mask: np.ndarray) -> np.ndarray:
    """The iterations next to a flagged one (a delay late in an iteration spills into the next).

    >>> _beside(np.array([False, True, False, False])).tolist()
    [True, False, True, False]
    """
    out = np.zeros_like(mask)
    out[1:] |= mask[:-1]
    out[:-1] |= mask[1:]
    return out
