"""Fault specifications, their activation patterns, and compute drift.

A fault is written ``DEVICE_ID@PATTERN[:ITERS]*FACTOR`` (``docs/cli.md``), e.g. ``gpu:5@spike*2.0``,
``nic:17@persistent*3``, ``switch:leaf-2@fluctuation*1.5``. ``FACTOR`` (> 1 slows down, any
positive value is accepted) multiplies, while the fault is active,

* the compute time between the communication ops of the affected ranks, for ``gpu:<rank>`` and
  ``host:<node>`` (every GPU of the host);
* the transfer time of every hop that crosses the device, for ``nic:``, ``link:``, ``nvswitch:``
  and ``switch:`` devices.

Patterns (the three irregularities of the paper, section 3.1 and Appendix B). Unless ``:ITERS``
pins them, the active iterations are drawn from ``numpy.random.default_rng`` seeded by the job
seed and the fault's position, so the same seed gives the same truth:

``spike``
    random isolated iterations, each with probability 6% (at least one), never iteration 0.
``fluctuation``
    periodic: a period ``P`` drawn from 6..9 iterations and a phase in ``[1, P]``; every ``P``-th
    iteration is active. The strength of each occurrence varies: the effective factor is
    ``1 + (FACTOR - 1) * u`` with ``u ~ U(0.6, 1.0)`` per active iteration (the paper notes that
    "the impact of each performance fluctuation varies").
``persistent``
    every iteration from a start drawn in ``[n/4, n/2)`` (``n`` iterations) to the end.

``:ITERS`` fixes the active iterations instead: ``:7`` (from 7 on for persistent, only 7
otherwise), ``:3-9`` (inclusive range) or ``:2,5,11``.

Drift (paper section 4.2: mean iteration time rose 5.92%-7.03% over a month) is a slow mean shift
of every rank's compute time: compute gaps of iteration ``i`` are multiplied by
``1 + drift * i``. Drift is not a fault: the counterfactual run drifts as well, so drift never
makes an op ``abnormal``.

Examples
--------
>>> FaultSpec.parse("gpu:5@spike*2.0")
FaultSpec(device='gpu:5', pattern='spike', factor=2.0, iterations=None)
>>> FaultSpec.parse("switch:leaf-2@persistent:10*1.5").iterations
(10,)
>>> active_factors([FaultSpec.parse("gpu:1@persistent:3*2")], 5, seed=0)[0].tolist()
[1.0, 1.0, 1.0, 2.0, 2.0]
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from holmes._ranges import parse_int_ranges
from holmes.errors import ConfigError
from holmes.topology import kinds

__all__ = ["FaultSpec", "split_fault_spec", "PATTERNS", "COMPUTE_KINDS", "NETWORK_KINDS", "active_factors", "parse_faults",
           "check_devices"]

PATTERNS = ("spike", "fluctuation", "persistent")
COMPUTE_KINDS = tuple(k.name for k in kinds.KINDS.values() if k.compute)
NETWORK_KINDS = tuple(k.name for k in kinds.KINDS.values() if not k.compute)

_SPEC = re.compile(r"^(?P<dev>[a-z][a-z0-9]*:[^@*]+)@(?P<pat>[a-z]+)(?::(?P<it>[0-9,\- ]+))?\*(?P<fac>[^*@]+)$")

SPIKE_PROB = 0.06
FLUCT_PERIODS = (6, 9)
FLUCT_STRENGTH = (0.6, 1.0)


def _parse_iters(text: str, spec: str) -> tuple[int, ...]:
    try:
        return tuple(parse_int_ranges(text))
    except ValueError:
        raise ConfigError(f"fault {spec!r}: bad iterations {text!r}; use N, A-B or N,M,...") from None


def split_fault_spec(spec: object, example: str = "gpu:5@spike*2.0") -> tuple[str, str, float, tuple[int, ...] | None]:
    """The grammar of a fault spec, ``DEVICE_ID@PATTERN[:ITERS]*FACTOR``, shared by the simulator
    and the real-run harness: ``(device, pattern, factor, iterations or None)``.

    The pattern must be one of :data:`PATTERNS` and the factor a finite number; what a device id
    and factor may be is the caller's to check.

    >>> split_fault_spec("gpu:5@persistent:3-5*1.5")
    ('gpu:5', 'persistent', 1.5, (3, 4, 5))
    """
    if not isinstance(spec, str):
        raise ConfigError(f"fault spec {spec!r} must be a string like {example}")
    m = _SPEC.match(spec.strip())
    if not m:
        raise ConfigError(f"fault {spec!r}: expected DEVICE_ID@PATTERN*FACTOR, e.g. {example}")
    if m.group("pat") not in PATTERNS:
        raise ConfigError(f"fault {spec!r}: pattern {m.group('pat')!r} is not one of {', '.join(PATTERNS)}")
    try:
        factor = float(m.group("fac"))
    except ValueError:
        raise ConfigError(f"fault {spec!r}: factor {m.group('fac')!r} is not a number") from None
    if not np.isfinite(factor):
        raise ConfigError(f"fault {spec!r}: factor must be a finite number")
    iters = _parse_iters(m.group("it"), spec) if m.group("it") else None
    return m.group("dev"), m.group("pat"), factor, iters


@dataclass(frozen=True)
class FaultSpec:
    """One injected fault: a device id, an activation pattern and a slow-down factor.

    Parameters
    ----------
    device : str
        ``gpu:<rank>``, ``host:<node>``, ``nic:<rank>``, ``nvswitch:<node>``, ``switch:<name>`` or
        ``link:<a>|<b>``.
    pattern : {"spike", "fluctuation", "persistent"}
    factor : float
        Multiplies compute (gpu, host) or transfer (nic, link, nvswitch, switch) time while active.
    iterations : tuple of int, optional
        Pinned iterations (persistent: a single value means "from there on").

    Examples
    --------
    >>> FaultSpec("nic:3", "persistent", 3.0).kind
    'nic'
    """

    device: str
    pattern: str
    factor: float
    iterations: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        kind = kinds.kind_of(self.device) if isinstance(self.device, str) else ""
        if kind not in COMPUTE_KINDS + NETWORK_KINDS or ":" not in self.device:
            raise ConfigError(f"fault device {self.device!r}: kind must be one of "
                              f"{', '.join(COMPUTE_KINDS + NETWORK_KINDS)} (e.g. gpu:5)")
        if self.pattern not in PATTERNS:
            raise ConfigError(f"fault on {self.device}: pattern {self.pattern!r} is not one of {', '.join(PATTERNS)}")
        f = float(self.factor)
        if not np.isfinite(f) or f <= 0:
            raise ConfigError(f"fault on {self.device}: factor {self.factor!r} must be a positive number")
        object.__setattr__(self, "factor", f)

    @property
    def kind(self) -> str:
        """Device kind: gpu, host, nic, link, nvswitch or switch."""
        return kinds.kind_of(self.device)

    @property
    def is_compute(self) -> bool:
        return self.kind in COMPUTE_KINDS

    @classmethod
    def parse(cls, spec: "str | FaultSpec") -> "FaultSpec":
        """Parse ``DEVICE_ID@PATTERN[:ITERS]*FACTOR``.

        Raises
        ------
        ConfigError
            One line naming the spec and what is wrong with it.

        Examples
        --------
        >>> FaultSpec.parse("nic:17@persistent*3").factor
        3.0
        >>> FaultSpec.parse("gpu:5@often*2")
        Traceback (most recent call last):
        ...
        holmes.errors.ConfigError: fault 'gpu:5@often*2': pattern 'often' is not one of spike, fluctuation, persistent
        """
        if isinstance(spec, FaultSpec):
            return spec
        dev, pattern, factor, iters = split_fault_spec(spec)
        if factor <= 0:
            raise ConfigError(f"fault {spec!r}: factor must be a positive number")
        try:
            return cls(dev, pattern, factor, iters)
        except ConfigError as exc:
            raise ConfigError(f"fault {spec!r}: {exc}") from None

    def __str__(self) -> str:
        it = ""
        if self.iterations is not None:
            it = ":" + ",".join(str(i) for i in self.iterations)
        return f"{self.device}@{self.pattern}{it}*{self.factor:g}"


def parse_faults(specs: Iterable["str | FaultSpec"]) -> list[FaultSpec]:
    """Parse many specs; a device may carry only one fault.

    >>> [str(f) for f in parse_faults(["gpu:1@spike*2", "nic:3@persistent*3"])]
    ['gpu:1@spike*2', 'nic:3@persistent*3']
    """
    out: list[FaultSpec] = []
    seen: set[str] = set()
    for s in specs:
        f = FaultSpec.parse(s)
        if f.device in seen:
            raise ConfigError(f"fault {str(s)!r}: device {f.device} already has a fault")
        seen.add(f.device)
        out.append(f)
    return out


def check_devices(faults: Sequence[FaultSpec], topology, world_size: int) -> None:
    """Raise :class:`ConfigError` if a fault names a device absent from the topology or job.

    GPUs and NICs must be ranks of the job (< ``world_size``); other ids must exist in the
    topology (``topology.kind_of``).
    """
    from holmes.errors import TopologyError

    for f in faults:
        if kinds.KINDS[f.kind].per == "rank":
            try:
                n = kinds.number(f.device)
            except ValueError:
                n = -1
            if not 0 <= n < world_size:
                raise ConfigError(f"fault {f}: unknown device {f.device} (the job has ranks 0..{world_size - 1})")
            continue
        try:
            topology.kind_of(f.device)
        except TopologyError:
            raise ConfigError(f"fault {f}: unknown device {f.device} in topology {topology.name!r}") from None
        if kinds.KINDS[f.kind].per == "host":
            h = kinds.number(f.device)
            if h * topology.gpus_per_host >= world_size:
                raise ConfigError(f"fault {f}: {f.device} holds no rank of this {world_size}-rank job")


def active_factors(faults: Sequence[FaultSpec], iterations: int, seed: int) -> np.ndarray:
    """Factor of every fault in every iteration, shape ``(len(faults), iterations)``; 1.0 = inactive.

    Deterministic in ``seed`` and each fault's position in ``faults``.
    """
    out = np.ones((len(faults), iterations), dtype=np.float64)
    for i, f in enumerate(faults):
        rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, 0xFA017, i])
        active = np.zeros(iterations, dtype=bool)
        strength = np.ones(iterations)
        if f.iterations is not None:
            its = np.array([x for x in f.iterations if 0 <= x < iterations], dtype=np.int64)
            if f.pattern == "persistent" and len(f.iterations) == 1:
                active[f.iterations[0]:] = True
            else:
                active[its] = True
        elif f.pattern == "spike":
            if iterations > 1:
                active[1:] = rng.random(iterations - 1) < SPIKE_PROB
                if not active.any():
                    active[rng.integers(1, iterations)] = True
            else:
                active[:] = True
        elif f.pattern == "fluctuation":
            period = int(rng.integers(FLUCT_PERIODS[0], FLUCT_PERIODS[1] + 1))
            phase = int(rng.integers(1, period + 1))
            active[phase::period] = True
            if not active.any() and iterations:
                active[iterations - 1] = True
        else:  # persistent
            lo, hi = iterations // 4, max(iterations // 2, iterations // 4 + 1)
            active[int(rng.integers(lo, hi)):] = True
        if f.pattern == "fluctuation":
            strength = rng.uniform(*FLUCT_STRENGTH, size=iterations)
        out[i, active] = 1.0 + (f.factor - 1.0) * strength[active]
    return out
