"""Cross-iteration device ranking (§4.4 and Appendix D of the paper).

* :func:`irregularity_rate` -- R(x): Pearson correlation of a root cause's operator series with
  the iteration-time series over the window, negatives clipped to 0, NaN -> 0.
* :func:`cause_devices` -- which devices a root cause implicates: a compute cause its GPU (and,
  with the CPU prior, its host); a network cause every network device on the paths among the
  involved GPUs (for a group: the ring of its members in rank order).
* :class:`DeviceRanking` -- accumulates R into I(d) with the topology decay H(d), then either the
  MAP estimate with a Beta prior per device kind (``a = alpha*p(d)``, ``b = alpha*(1-p(d))``) or
  plain linear accumulation, and ranks the devices.

Examples
--------
>>> r = DeviceRanking()
>>> r.add(["gpu:3"], 0.9); r.add(["nic:3", "switch:leaf-0"], 0.2)
>>> [d for d, _ in r.ranked()][:2]
['gpu:3', 'nic:3']
>>> round(sum(s for _, s in r.ranked()), 6)
1.0
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np

from holmes.calibration.thresholds import Thresholds, load_thresholds, or_shipped
from holmes.errors import ConfigError
from holmes.stats import TIE_RTOL
from holmes.topology import kinds

__all__ = ["DEFAULT_PRIOR", "PRIOR_KINDS", "default_prior", "irregularity_rate", "cause_devices", "network_devices",
           "narrow_by_coverage", "DeviceRanking"]

#: the prior kinds, in the order of Table 1 of the paper (GPU, NIC, link, switch, CPU, other); which one
#: applies to a device is its kind's ``prior`` (:func:`holmes.topology.kinds.prior_kind`).
PRIOR_KINDS = ("gpu", "nic", "link", "switch", "cpu", "other")


def default_prior(thresholds: Thresholds | None = None) -> dict[str, float]:
    """p(d) per prior kind: the thresholds ``prior_<kind>`` (Table 1 of the paper; default the
    shipped file's)."""
    t = thresholds or load_thresholds()
    return {k: float(getattr(t, "prior_" + k)) for k in PRIOR_KINDS}


#: p(d) per prior kind, from Table 1 of the paper (the shipped thresholds; read-only)
DEFAULT_PRIOR: Mapping[str, float] = MappingProxyType(default_prior())


def _pearson(x: np.ndarray, y: np.ndarray, min_points: int) -> float:
    ok = np.isfinite(x) & np.isfinite(y)
    if ok.sum() < min_points:
        return 0.0
    x, y = x[ok] - x[ok].mean(), y[ok] - y[ok].mean()
    den = np.sqrt((x * x).sum() * (y * y).sum())
    if den <= 0 or not np.isfinite(den):
        return 0.0
    r = float((x * y).sum() / den)
    return max(0.0, min(1.0, r)) if np.isfinite(r) else 0.0


def irregularity_rate(op_series: np.ndarray, iteration_times: np.ndarray, max_lag: int = 0, *,
                      min_points: int | None = None) -> float:
    """R(x): Pearson correlation of two aligned series, negatives clipped to 0, NaN -> 0.

    Iterations missing from either series (NaN) are dropped; fewer than ``min_points`` common
    points (threshold ``rate_min_points``), or a constant series, give 0. With ``max_lag`` > 0 the iteration times may trail the operator by
    up to that many iterations and the best correlation counts: a delay late in iteration *i*
    on a rank far from the pivot (the last pipeline stage, the next step's parameter
    all-gather) surfaces on the pivot in iteration *i + 1*.

    >>> round(irregularity_rate(np.array([1., 1, 5, 1]), np.array([10., 10, 20, 11])), 3)
    0.995
    >>> irregularity_rate(np.array([1., 2, 3]), np.array([3., 2, 1]))
    0.0
    >>> x, y = np.array([1., 5, 1, 1, 5, 1, 1]), np.array([10., 10, 30, 10, 10, 30, 10])
    >>> irregularity_rate(x, y), round(irregularity_rate(x, y, max_lag=1), 3)
    (0.0, 1.0)
    """
    x = np.asarray(op_series, dtype=float)
    y = np.asarray(iteration_times, dtype=float)
    k = or_shipped(min_points, "rate_min_points")
    best = _pearson(x, y, k)
    for lag in range(1, max(0, int(max_lag)) + 1):
        if lag < len(x):
            best = max(best, _pearson(x[:-lag], y[lag:], k))
    return best


def network_devices(ranks: Sequence[int], topology: Any) -> list[str]:
    """Network devices on the paths among GPUs: the pair's path, or the ring of a group's members
    in rank order (hops ``r_i -> r_(i+1)``, cyclic), each device once, in path order.

    >>> from holmes.topology import default_topology
    >>> network_devices([0, 1, 2], default_topology(16))
    ['nvswitch:0']
    """
    ranks = sorted(set(int(r) for r in ranks))
    if len(ranks) < 2:
        return []
    pairs = list(zip(ranks, ranks[1:]))
    if len(ranks) > 2:
        pairs.append((ranks[-1], ranks[0]))
    seen: dict[str, None] = {}
    for a, b in pairs:
        for d in topology.path(a, b):
            seen.setdefault(d, None)
    return list(seen)


def cause_devices(cause: str, ranks: Sequence[int], topology: Any, *, include_host: bool = True,
                  exonerated: Any = None) -> list[str]:
    """Devices a root cause implicates.

    Parameters
    ----------
    cause : {"compute", "network"}
    ranks : sequence of int
        The involved GPUs.
    topology : ClusterTopology
        Gives ``path(a, b)`` and ``host_of(rank)``.
    include_host : bool, default True
        Compute causes also implicate the GPU's host (the CPU side), with its own prior.
    exonerated : set of str, optional
        Network devices known healthy at the time (crossed by operators that ran normally in
        the same iteration); they are left out of a network cause unless that would leave
        nothing.

    Examples
    --------
    >>> from holmes.topology import default_topology
    >>> t = default_topology(16)
    >>> cause_devices("compute", [9], t)
    ['gpu:9', 'host:1']
    >>> cause_devices("network", [0, 1], t)
    ['nvswitch:0']
    """
    ranks = sorted(set(int(r) for r in ranks))
    if cause == "compute":
        out = [kinds.gpu(r) for r in ranks]
        if include_host and topology is not None:
            out += sorted({kinds.host(topology.host_of(r)) for r in ranks})
        return out
    if cause != "network":
        raise ConfigError(f"unknown cause {cause!r}")
    if len(ranks) < 2 or topology is None:
        return [kinds.nic(r) for r in ranks]
    devs = network_devices(ranks, topology)
    if exonerated:
        kept = [d for d in devs if d not in exonerated]
        if kept:
            return kept
    return devs


def narrow_by_coverage(device_lists: Sequence[Sequence[str]], rates: Sequence[float],
                       eligible: Sequence[bool] | None = None) -> list[list[str]]:
    """Keep, in each eligible cause's devices, those the *other* eligible causes back most.

    A device's coverage is the sum of the rates of the other eligible causes that implicate it.
    A cause whose devices have some coverage keeps only those with the largest (ties kept);
    one without any keeps all. A single faulty device explains every cause it lies under, so a
    ring's cause spanning dozens of devices is narrowed to the one a specific pair's cause also
    names. Ineligible causes (compute) neither narrow nor back anything.

    >>> narrow_by_coverage([["nic:1", "link:a|b", "nic:9"], ["link:a|b"], ["gpu:3"]], [1.0, 0.9, 1.0],
    ...                    [True, True, False])
    [['link:a|b'], ['link:a|b'], ['gpu:3']]
    """
    n = len(device_lists)
    ok = list(eligible) if eligible is not None else [True] * n
    cover: dict[str, float] = {}
    for devs, r, e in zip(device_lists, rates, ok):
        if e:
            for d in set(devs):
                cover[d] = cover.get(d, 0.0) + float(r)
    out: list[list[str]] = []
    for devs, r, e in zip(device_lists, rates, ok):
        devs = list(devs)
        if not e or len(devs) <= 1:
            out.append(devs)
            continue
        mine = set(devs)
        other = {d: cover.get(d, 0.0) - (float(r) if d in mine else 0.0) for d in devs}
        best = max(other.values())
        out.append([d for d in devs if other[d] >= best * (1 - TIE_RTOL)] if best > 0 else devs)
    return out


class DeviceRanking:
    """Accumulates irregularity rates into devices and ranks them.

    Parameters
    ----------
    method : {"map", "linear"}, default "map"
        ``"map"``: the paper's MAP estimate with a Beta prior; ``"linear"``: the plain sum of
        decayed rates (Fig. 26's baseline).
    prior : mapping, optional
        p(d) per prior kind (keys of :data:`DEFAULT_PRIOR`); missing kinds keep their default.
    alpha : float, default 1.0
        Strength of the prior (``a = alpha*p``, ``b = alpha*(1-p)``).
    decay : callable, optional
        H(d) for a device id (e.g. ``topology.decay``); 1 for every device when omitted.
    thresholds : Thresholds, optional
        Whose ``prior_<kind>`` are the default prior (default the shipped ones).

    Notes
    -----
    ``index(d)`` is the paper's I(d) = (sum_x R(x)H(d) + a(d)) / sum_d' (sum_x R(x)H(d') + a(d') + b(d'))
    over the devices implicated by at least one cause. ``ranked()`` reports scores normalised to
    sum to one over those devices (``(S(d)H(d) + a(d)) / sum_d' (S(d')H(d') + a(d'))``), which orders
    devices exactly as I(d) does.
    """

    def __init__(self, method: str = "map", prior: Mapping[str, float] | None = None, alpha: float = 1.0,
                 decay: Callable[[str], float] | None = None, thresholds: Thresholds | None = None) -> None:
        if method not in ("map", "linear"):
            raise ConfigError(f"ranking method {method!r} must be 'map' or 'linear'")
        if alpha < 0:
            raise ConfigError(f"alpha={alpha} must be >= 0")
        self.method = method
        self.prior = default_prior(thresholds)
        for k, v in (prior or {}).items():
            if k not in DEFAULT_PRIOR:
                raise ConfigError(f"unknown prior kind {k!r}; expected one of {', '.join(DEFAULT_PRIOR)}")
            if not 0.0 <= float(v) <= 1.0:
                raise ConfigError(f"prior p({k})={v} must lie in [0, 1]")
            self.prior[k] = float(v)
        self.alpha = float(alpha)
        self.decay = decay
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self._h: dict[str, float] = {}

    def add(self, devices: Iterable[str], rate: float) -> None:
        """Accumulate one cause's rate into each of its devices (each device once per cause)."""
        for d in dict.fromkeys(devices):
            self.sums[d] = self.sums.get(d, 0.0) + float(rate)
            self.counts[d] = self.counts.get(d, 0) + 1

    def explain_away(self, members: Mapping[str, Iterable[str]]) -> None:
        """Take from each aggregate device the evidence its most-blamed member explains alone.

        ``S(agg) -= S(m1) - S(m2)`` where ``m1``, ``m2`` are the members with the largest and
        second-largest sums (floored at 0). A host collects the compute causes of all its GPUs, so
        a single slow GPU plus a little noise on its neighbours would lift the host above the GPU.
        A host fault slows *several* of its GPUs, which then share the causes: their evidence is
        left to the host, only the top GPU's lead over the runner-up is not.

        >>> r = DeviceRanking()
        >>> for g in ("gpu:1", "gpu:1", "gpu:1", "gpu:2"):
        ...     r.add([g, "host:0"], 1.0)
        >>> r.explain_away({"host:0": ["gpu:1", "gpu:2"]})
        >>> r.sums["host:0"], r.sums["gpu:1"]
        (2.0, 3.0)
        """
        for agg, ms in members.items():
            if agg in self.sums:
                top = sorted((self.sums.get(m, 0.0) for m in ms), reverse=True)[:2] + [0.0, 0.0]
                self.sums[agg] = max(0.0, self.sums[agg] - (top[0] - top[1]))

    def _H(self, d: str) -> float:
        h = self._h.get(d)
        if h is None:
            h = 1.0 if self.decay is None else float(self.decay(d))
            self._h[d] = h
        return h

    def _ab(self, d: str) -> tuple[float, float]:
        p = self.prior[kinds.prior_kind(d)]
        return self.alpha * p, self.alpha * (1.0 - p)

    def numerators(self) -> dict[str, float]:
        """S(d)H(d) + a(d) (MAP) or S(d)H(d) (linear) per implicated device."""
        out = {}
        for d, s in self.sums.items():
            v = s * self._H(d)
            if self.method == "map":
                v += self._ab(d)[0]
            out[d] = v
        return out

    def index(self) -> dict[str, float]:
        """The paper's I(d) for every implicated device."""
        num = self.numerators()
        if self.method == "linear":
            return num
        den = sum(num[d] + self._ab(d)[1] for d in num)
        return {d: (v / den if den > 0 else 0.0) for d, v in num.items()}

    def ranked(self) -> list[tuple[str, float]]:
        """(device, score) best first; scores sum to 1 (empty when nothing was accumulated).

        Ties are broken by the prior (more likely kinds first), then by the number of causes, then
        by id, so the order is deterministic.
        """
        num = self.numerators()
        total = sum(num.values())
        if not num:
            return []
        if total <= 0:
            scores = {d: 1.0 / len(num) for d in num}
        else:
            scores = {d: v / total for d, v in num.items()}
        return sorted(scores.items(), key=lambda kv: (-kv[1], -self.prior[kinds.prior_kind(kv[0])],
                                                       -self.counts.get(kv[0], 0), kv[0]))
