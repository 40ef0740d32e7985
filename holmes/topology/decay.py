"""The paper's topology decay H(d) (Holmes, NSDI'25, Appendix D), as Holmes uses it."""

from __future__ import annotations

import math

__all__ = ["decay_factor"]


def decay_factor(c: float, eps: float = 1e-6) -> float:
    """Topology decay H for a device with ``c`` NICs below it.

    The paper (Holmes, NSDI'25, Appendix D) defines ``f(C) = ln(C + eps - 1) / C``. As printed
    it is negative for C < 2 and not monotone (it rises from C = 3 to C ~ 4.6, then falls), so
    it cannot be used raw. Holmes uses:

    * ``H = 1`` for ``C <= 3`` -- GPUs, NICs and NIC cables (C = 1), small hosts: a device that
      serves one NIC is not an aggregation point and is not discounted;
    * ``H = min(1, f(C) / f(3))`` for ``C > 3`` -- aggregation devices (leaves, spines, uplinks,
      NVSwitches) are discounted by the paper's factor, normalised to the smallest aggregation
      device (C = 3) and clipped at 1 where f still rises.

    The result lies in (0, 1] and is monotone non-increasing in C: the more NICs a device
    aggregates, the more irregularities it sees by mere position, the more they are discounted.
    It equals 1 up to C = 8 (an 8-GPU NVSwitch is not discounted) and is about 0.46 for a
    32-NIC leaf and 2.6e-3 for a spine over 16,384 NICs.

    Examples
    --------
    >>> decay_factor(1), decay_factor(8), round(decay_factor(32), 3)
    (1.0, 1.0, 0.464)
    """
    if c <= 3:
        return 1.0
    f3 = math.log(2.0 + eps) / 3.0
    return min(1.0, math.log(c - 1.0 + eps) / c / f3)
