"""The parameters of a localization: one frozen, validated object, recorded whole in the report.

:class:`LocalizeParams` is the single place where the knobs of :func:`holmes.localize` live and
where every argument is checked; the analyses' thresholds are data
(:mod:`holmes.calibration.thresholds`), carried as ``params.thresholds`` (``params.t``). A bad value raises :class:`~holmes.errors.ConfigError` (also a
``ValueError``) naming the parameter; :meth:`LocalizeParams.to_json` is what ``Report.params``
holds.

Examples
--------
>>> p = LocalizeParams(pivot=3, delta=1.2)
>>> p.pivot, p.window, p.delta
(3, 100, 1.2)
>>> p.replace(top_k=5).top_k
5
>>> p = LocalizeParams(stretch_z=6)              # a threshold by name: routed into p.thresholds
>>> p.t.stretch_z, p.to_json()["thresholds"]
(6.0, {'stretch_z': 6.0})
>>> LocalizeParams(thresholds={"own_z": 5}).t.own_z
5.0
>>> LocalizeParams(window=None)
Traceback (most recent call last):
...
holmes.errors.ConfigError: localize: window: Input should be a valid integer (got None)
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from holmes.calibration.thresholds import Thresholds, load_thresholds, threshold_names
from holmes.detect.monitor import DEFAULT_DELTA
from holmes.display import SHOWN_INPUT_CHARS
from holmes.errors import ConfigError

__all__ = ["LocalizeParams", "ANALYSES"]

#: analyses a localization can run; ``"all"`` runs every one that applies to the job
ANALYSES = ("hang", "irregular", "persistent", "all")


class LocalizeParams(BaseModel):
    """Every parameter of :func:`holmes.localize` / :class:`~holmes.localize.Localizer`.

    Parameters
    ----------
    analysis : {"all", "irregular"}, default "all"
        Which analyses run. ``"hang"`` names the ranks that never arrived at the collective the
        others wait in when ops are in flight at the end of the logs (:mod:`holmes.localize.hang.analysis`;
        it reads every log only when the job can hold ops in flight). ``"irregular"`` explains the pivot's delta-irregular iterations (the
        paper's Holmes); ``"persistent"`` compares every rank with its role peers in every iteration
        (stragglers slow from the first iteration, no pivot needed, every rank read) and replays
        the iterations without them (:mod:`holmes.localize.persistent.analysis`); ``"all"`` runs every analysis this version has.
    pivot : int, default 0
        The monitored rank whose iteration times define the irregular iterations.
    monitors : tuple of int, default ()
        Extra monitored ranks; the search also starts from their abnormal operators.
    window : int, default 100
        T: the last ``window`` iterations of the pivot are analysed (>= 2).
    top_k : int, default 2
        Devices in ``Report.devices`` (>= 1).
    delta : float, default 1.1
        An iteration is irregular when it lasts more than ``delta`` times the reference
        (:class:`holmes.detect.IrregularityRule`); the robust detector judges with the same delta.
    detector : str, path or object, optional
        ``"auto"`` (the shipped model, else the robust rule), ``"model"``, ``"label"`` (ground
        truth, for evaluation), ``"robust"``, a model path written by ``holmes train``, or any
        object with ``predict_ops`` (:func:`holmes.detect.resolve_detector`).
    topology : ClusterTopology or path, optional
        Defaults to the job's ``topology.json``, else a default rail-optimized cluster (recorded in
        the assumptions).
    prior : mapping, optional
        p(d) per device kind (gpu, nic, link, switch, cpu, other).
    alpha : float, default 1.0
        Strength of the Beta prior (> 0).
    max_iterations : int, optional
        Search at most this many irregular iterations (the most irregular ones).
    search_from : int, optional
        The first iteration the irregular analysis explains: the window's iterations before it are
        *context*, in the usual step and the job's noise every iteration is judged against but not
        searched themselves (as the job's warm-up). A watcher judging a new episode uses it: the
        episode against the job before it, as ``holmes localize`` would judge the job so far,
        without naming the previous episode's device again. None: every iteration of the window.
    method : {"map", "linear"}, default "map"
        Cross-iteration accumulation of the device evidence.
    probe_reads : int, default from the thresholds (64)
        Extra ranks the network probes may read (0 turns them off).
    host_reads : int, default from the thresholds (32)
        Extra ranks the host probe may read to tell a slow GPU from a slow host (0 turns it off).
    whatif : bool, default True
        Persistent analysis: replay the iterations (what-if impact and slowdown); False skips it.
    full_read : int, default from the thresholds (128)
        Jobs of at most this many ranks are read whole: instead of following waits from the
        pivot, every device's own time in every iteration (each rank's compute, each channel's
        transfers) is compared with the job's own noise (:mod:`holmes.localize.irregular.cells`), a cell
        counting when its excess alone could make an iteration delta-irregular; larger
        jobs run Algorithm 1 and compare the ranks the search reads.
    scan_reads : int, default from the thresholds (8)
        Ranks not read before that the search's scan of one collective group (for the member that
        entered it last) may read: a scan that would read more is set aside until the iteration's
        other branches are searched, then resumed in full only if they found no cause (or none
        as strong as the set-aside operator's own excess), else dropped, and the report says so
        (:class:`~holmes.localize.evidence.search.GraphSearch`). Bounds the reads of a large job (a
        data-parallel group of hundreds of ranks); 0: every scan runs in full at once.
    min_confidence : float, default from the thresholds (0.9)
        A device is named only when its confidence (against how often chance would blame it)
        reaches this; otherwise the verdict is ``inconclusive`` and the devices are candidates.
    thresholds : mapping, path or Thresholds, optional
        The thresholds of the analyses (:mod:`holmes.calibration.thresholds`; every name and its
        meaning in ``docs/thresholds.md``): by default the shipped ``thresholds.json``; a mapping
        overrides some of its values (``{"stretch_z": 6}``), a path reads a thresholds file (it
        may name only some; the rest keep the shipped values), a :class:`Thresholds` is taken as
        it is. The analyses read them as ``params.t.<name>``.
    **threshold_names
        A threshold's name given as a keyword (``LocalizeParams(stretch_z=6)``, as when it was a
        parameter) is routed into ``thresholds``, over the values ``thresholds`` gives.

    Notes
    -----
    The knobs here are the ones a user turns: what to analyse and from where (``analysis``,
    ``pivot``, ``monitors``, ``window``), what "slow" means (``delta``), what to trust
    (``detector``, ``topology``, ``prior``, ``alpha``, ``method``, ``min_confidence``), what to
    report (``top_k``) and what it may cost (``max_iterations``, ``full_read``, ``probe_reads``,
    ``host_reads``, ``scan_reads``, ``whatif``). Every other number is a threshold fitted on
    the development splits. The defaults of the cost knobs and of ``min_confidence`` are taken
    from the thresholds (``default_<name>``) when the parameters are built.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    analysis: Literal["hang", "irregular", "persistent", "all"] = "all"
    pivot: int = Field(default=0, ge=0)
    monitors: tuple[int, ...] = ()
    window: int = Field(default=100, ge=2)
    top_k: int = Field(default=2, ge=1)
    delta: float = DEFAULT_DELTA
    detector: Any = None
    topology: Any = None
    prior: dict[str, float] | None = None
    alpha: float = Field(default=1.0, gt=0)
    max_iterations: int | None = Field(default=None, ge=1)
    search_from: int | None = Field(default=None, ge=0)
    method: Literal["map", "linear"] = "map"
    min_confidence: float = Field(ge=0, le=1)
    whatif: bool = True
    full_read: int = Field(ge=0)
    probe_reads: int = Field(ge=0)
    host_reads: int = Field(ge=0)
    scan_reads: int = Field(ge=0)
    thresholds: Thresholds

    def __init__(self, **data: Any) -> None:
        data = _route_thresholds(data)
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise ConfigError(_one_line(exc)) from None
    @property
    def t(self) -> Thresholds:
        """The thresholds the analyses read (``p.t.stretch_z``)."""
        return self.thresholds

    @field_validator("delta", "alpha", "min_confidence")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v

    @field_validator("delta")
    @classmethod
    def _delta(cls, v: float) -> float:
        if not v > 1.0:
            raise ValueError("must be > 1")
        return v

    @field_validator("pivot", "window", "top_k", "max_iterations", "search_from", "probe_reads",
                     "host_reads", "full_read", "scan_reads", mode="before")
    @classmethod
    def _integer(cls, v: Any) -> Any:
        """A plain integer (a bool is not one) of at most 2**31 - 1: counts and ranks, never more."""
        if isinstance(v, (bool, np.bool_)):
            raise ValueError("must be an integer, not a bool")
        if isinstance(v, np.integer):
            v = int(v)
        if isinstance(v, int) and v > _INT_MAX:
            raise ValueError(f"must be at most {_INT_MAX}")
        return v

    @field_validator("monitors", mode="before")
    @classmethod
    def _monitors(cls, v: Any) -> Any:
        if v is None:
            return ()
        if isinstance(v, (str, bytes)) or not hasattr(v, "__iter__"):
            raise ValueError("must be a sequence of ranks")
        from holmes.limits import max_world_size

        cap = max_world_size()  # more distinct ranks than any job may hold: refused before it is listed
        n = len(v) if hasattr(v, "__len__") else None
        ranks = tuple(itertools.islice(v, cap + 1)) if n is None or n <= cap else None
        if ranks is None or len(ranks) > cap:
            raise ValueError(f"more than {cap} ranks (the world size cap, HOLMES_MAX_WORLD_SIZE)")
        for m in ranks:
            cls._integer(m)
        return ranks

    @field_validator("prior")
    @classmethod
    def _prior(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v is not None and any(not (math.isfinite(x) and x >= 0) for x in v.values()):
            raise ValueError("probabilities must be finite numbers >= 0")
        return v

    @field_validator("detector")
    @classmethod
    def _detector(cls, v: Any) -> Any:
        if v is None or isinstance(v, (str, os.PathLike)) or hasattr(v, "predict_ops"):
            return v
        raise ValueError("must be a name, a model path or an object with predict_ops(ops)")

    @field_validator("topology")
    @classmethod
    def _topology(cls, v: Any) -> Any:
        if v is None or isinstance(v, (str, os.PathLike)) or hasattr(v, "decay"):
            return v
        raise ValueError("must be a ClusterTopology or the path of a topology.json")

    @model_validator(mode="after")
    def _ranks(self) -> "LocalizeParams":
        if any(m < 0 for m in self.monitors):
            raise ValueError("monitors: ranks must be >= 0")
        return self

    @property
    def pivots(self) -> list[int]:
        """The pivot followed by the extra monitors (each once)."""
        return [self.pivot] + [m for m in self.monitors if m != self.pivot]

    def replace(self, **changes: Any) -> "LocalizeParams":
        """A copy with some parameters changed (validated again)."""
        return LocalizeParams(**{**self.as_kwargs(), **changes})

    def as_kwargs(self) -> dict[str, Any]:
        """The parameters as keyword arguments (objects kept as they are)."""
        return {k: getattr(self, k) for k in type(self).model_fields}

    def to_json(self) -> dict[str, Any]:
        """Every parameter as JSON values: a detector or topology object by its ``repr``."""
        out: dict[str, Any] = {}
        for k, v in self.as_kwargs().items():
            if k in ("detector", "topology") and v is not None and not isinstance(v, str):
                v = os.fspath(v) if isinstance(v, os.PathLike) else " ".join(repr(v).split())
            elif isinstance(v, tuple):
                v = list(v)
            elif isinstance(v, Thresholds):
                v = v.changed()  # the values that differ from the shipped file
            out[k] = v
        return out


#: the largest integer parameter (counts, ranks): an int32
_INT_MAX = int(np.iinfo(np.int32).max)
#: names a caller may still pass as keywords; they are thresholds now (routed into ``thresholds``)
_THRESHOLD_NAMES = frozenset(threshold_names())
#: knobs whose defaults the thresholds hold (``default_<knob>``)
_KNOB_DEFAULTS = ("min_confidence", "full_read", "probe_reads", "host_reads", "scan_reads")


def _route_thresholds(data: dict[str, Any]) -> dict[str, Any]:
    """``thresholds`` as a :class:`Thresholds` (threshold names given as keywords merged into it),
    then the knobs' defaults that the thresholds hold."""
    data = dict(data)
    given = data.pop("thresholds", None)
    moved = {k: data.pop(k) for k in list(data) if k in _THRESHOLD_NAMES}
    if given is None:
        t = load_thresholds()
    elif isinstance(given, Thresholds):
        t = given
    elif isinstance(given, (str, os.PathLike)):
        t = load_thresholds(given)
    elif isinstance(given, Mapping):
        t = load_thresholds().replace(**given)
    else:
        raise ConfigError(f"localize: thresholds: must be a mapping, a thresholds file or a Thresholds "
                          f"(got {type(given).__name__})")
    data["thresholds"] = t.replace(**moved) if moved else t
    for k in _KNOB_DEFAULTS:
        if k not in data:
            data[k] = getattr(data["thresholds"], "default_" + k)
    return data


def _one_line(exc: ValidationError) -> str:
    parts = []
    for e in exc.errors():
        loc = ".".join(str(x) for x in e.get("loc", ())) or "parameters"
        msg = e.get("msg", "invalid").removeprefix("Value error, ")
        if e.get("type") == "extra_forbidden":
            parts.append(f"unknown parameter {loc!r}")
        else:
            got = repr(e.get("input"))
            cut = got if len(got) <= SHOWN_INPUT_CHARS else got[:SHOWN_INPUT_CHARS - len('...')] + '...'
            parts.append(f"{loc}: {msg} (got {cut})")
    return "localize: " + "; ".join(parts)
