"""The parameters of a localization: one frozen, validated object, recorded whole in the report.

:class:`LocalizeParams` is the single place where the defaults of :func:`holmes.localize` live and
where every argument is checked. A bad value raises :class:`~holmes.errors.ConfigError` (also a
``ValueError``) naming the parameter; :meth:`LocalizeParams.to_json` is what ``Report.params``
holds.

Examples
--------
>>> p = LocalizeParams(pivot=3, delta=1.2)
>>> p.pivot, p.window, p.delta
(3, 100, 1.2)
>>> p.replace(top_k=5).top_k
5
>>> LocalizeParams(window=None)
Traceback (most recent call last):
...
holmes.errors.ConfigError: localize: window: Input should be a valid integer (got None)
"""

from __future__ import annotations

import itertools
import math
import os
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from holmes.detect.monitor import DEFAULT_DELTA
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
    max_starts : int or None, default 4
        Start operators per monitored rank and iteration: the abnormal ones that lasted longest
        beyond their usual duration, searched in start order.
    method : {"map", "linear"}, default "map"
        Cross-iteration accumulation of the device evidence.
    include_host : bool, default True
        Compute causes also implicate the host (explained away by its most-blamed GPU).
    exonerate : bool, default True
        Leave out of a network cause the devices crossed quickly, in the same iteration, by
        operators that ran normally (:mod:`holmes.localize.irregular.healthy`).
    exonerate_bytes : float, default 1/16
        Only operators moving at least this share of the cause operator's bytes clear a device.
    exonerate_speedup : float, default 2.0
        ... and only those at least this many times as fast as the cause operator.
    probe_reads : int, default 64
        Extra ranks the network probes may read (0 turns them off).
    rate_lag : int, default 1
        The irregularity rate R is the best Pearson correlation over lags 0 .. ``rate_lag``.
    narrow : bool, default True
        Narrow each network cause to its devices the other network causes implicate most.
    late_ratio : float, default 0.5
        A member's copy lasting at most this fraction of the searched operator marks it as the
        late arriver even when the detector flagged it (0 trusts the detector alone).
    follow_waits : bool, default True
        A late rank that lost more time waiting in its operators of the iteration than computing
        passes the blame on through its latest abnormal operator even when its last compute gap
        grew more than that operator (:class:`~holmes.localize.GraphSearch`).
    host_reads : int, default 32
        Extra ranks the host probe may read to tell a slow GPU from a slow host (0 turns it off).
    noise_z : float, default 3.0
        An irregular iteration counts by how far it stands above the job's healthy spread: not at
        all within ``noise_z - 1`` healthy sigmas, fully beyond ``noise_z + 1``
        (:mod:`holmes.localize.evidence.confidence`); iterations within the noise are not searched.
    noise_window : int, default 10
        The healthy level an iteration is weighed against is also taken locally, over the
        ``2 * noise_window + 1`` iterations around it (a slow drift of the whole job is not an
        irregularity); 0 uses the window-wide level only.
    null_iterations : int, default 8
        Regular iterations the search also runs on (evenly spread over the window): how often the
        procedure blames a device when nothing is wrong sets the chance level its evidence must
        beat (:func:`holmes.localize.evidence.confidence.confidences`); 0 uses the topology's share alone.
    persistent_z : float, default 4.0
        Persistent analysis: a rank's median excess work over its work peers' must stand this many
        standard errors above zero, a channel's median excess transfer time this many times its
        class's iteration-to-iteration noise.
    persistent_fraction : float, default 0.6
        ... and a straggler only when it is an outlier in at least this share of the window (the
        continuity rule: a one-off blip is not a straggler).
    network_min_excess : float, default 0.2
        A communicator's transfers count as slow only when also at least this much (relative)
        slower than its peers'.
    imbalance_pct : float, default 3.0
        When no device is named and the what-if slowdown is at least this many percent, the
        persistent analysis names the non-device cause (pipeline-stage or micro-batch imbalance).
    persistent_min_effect : float, default 0.08
        Persistent analysis: a rank's work must exceed its work peers' by at least this much
        (relative) over the window to be a straggler (healthy real runs' persistent offsets stayed
        under 0.077 on the development splits, slow GPUs at 1.14x stood at 0.157).
    unexplained_slowdown : float, default 1.25
        A job whose what-if step is at least this many times its ideal while no device is named is
        ``inconclusive`` (a slowdown worth a look that the report cannot explain), never
        ``healthy``. Healthy development runs (idle and under load) reached 1.228.
    whatif : bool, default True
        Persistent analysis: replay the iterations (what-if impact and slowdown); False skips it.
    straggler_share : float, default 0.5
        A rank whose own compute (its gaps between operators) grew in an irregular iteration by
        at least this share of the iteration's excess, and by at least half as much as the rank
        that grew most, is a compute straggler of that iteration; stragglers on several hosts are
        a common-mode slowdown no device explains (:mod:`holmes.localize.irregular.straggler`); 0 turns
        the rule off.
    stretch_z : float, default 5.0
        An iteration under ``delta`` is irregular too when it lasts at least ``1 + min_stretch``
        times the usual one *and* stands ``stretch_z`` of the job's own healthy sigmas above it
        (the larger of the fast side's and the window's MAD; not next to a delta-irregular
        iteration, whose delay spills into it): on a quiet job a device that
        costs 3-10% of a step is beyond doubt, though not delta-irregular; 0 keeps the paper's
        delta rule alone. Jobs read whole (``full_read``) keep the delta rule: their cells judge
        every iteration anyway; 0 also turns ``candidate_z`` off. 4 names single NVSwitch and
        spine-link spikes costing 4-7% (4.2-5 sigmas) on the simulated development splits, but a
        healthy 2,048-GPU job then reads ``inconclusive`` one time in four (an iteration 4-4.7
        sigmas out that no cause explains) and the test split had two jobs whose fault cost under
        0.3% named a host: 5, and the iterations below it are ``candidate_z``'s.
    min_stretch : float, default 0.03
        See ``stretch_z``: the smallest stretch it flags (the step rule has its own, ``min_shift``).
    candidate_z : float, default 3.5
        Iterations standing ``candidate_z`` to ``stretch_z`` healthy sigmas out (at least
        ``min_stretch`` longer, not next to an irregular one) are *candidates*, searched: a cause
        of one counts only when its rank's own work (its compute, or its time in the cause's
        communicator) stood ``own_z`` sigmas out of that rank's usual level
        (:func:`holmes.localize.irregular.cause_filter.cause_z`), and a candidate that no cause explains is
        the job's noise, not a reason for ``inconclusive``; among the repeat rule's iterations
        such a cause's devices count without a second hit. A single NVSwitch,
        leaf-switch or spine-link spike costing 4-7% of a 2,048-GPU step stands 3.6-5 sigmas out;
        the causes Algorithm 1 ends on in a healthy job's 3.5-5-sigma iteration are compute
        jitter of the rank's usual size. Not for jobs read whole. 0 turns candidates off.
    own_z : float, default 4.0
        See ``candidate_z``. Chosen on the simulated development splits (66 jobs with an
        iteration 3.5-5 sigmas out): every cause of such an iteration implicating no faulty
        device stood at most 3.2 sigmas out of its rank's noise; every faulty iteration kept a
        cause at 5 or more (most 10-50).
    compute_z : float, default 3.0
        Algorithm 1 (jobs not read whole): a compute cause -- the search ended on a rank's
        compute -- counts only when that rank computed ``compute_z`` robust sigmas longer in its
        iteration than over the usual ones (:func:`holmes.localize.irregular.cause_filter.computed_longer`;
        the null search obeys the same rule). In an iteration a network fault stretched, the
        search can end on the rank that happened to arrive last, its compute as usual (the delay
        came in through an operator the detector left unflagged). Chosen on the simulated
        development splits: ~400 compute causes implicating a faulty GPU or host (1.2-2x) stood
        17 sigmas out or more; those ending a network fault's search on a healthy host 1.8-3.6
        (one 14.5: a rank's own heavy-tailed kernel). 0 keeps every compute cause.
    cause_share : float, default 0.3
        Algorithm 1 (jobs not read whole): a root cause counts only when it cost its rank in its
        iteration (:func:`holmes.localize.irregular.cause_filter.cause_cost`, against the rank's regular
        iterations) at least this share of the iteration's excess over the usual one; a cause
        that cost less is where the search ended in an iteration stretched by the job's own
        jitter, spread thin over many ranks, not what made it slow
        (:func:`holmes.localize.irregular.cause_filter.drop_minor`; the null search obeys the same rule).
        0 keeps every cause.
    repeat_z : float, default 3.0
        When no iteration is irregular, the iterations standing ``repeat_z`` healthy sigmas out
        and at least ``min_stretch`` longer -- if two or more -- are searched, and a device
        counts only when it explains two of them (a fault that returns, a few percent each
        time: a NIC fluctuating at 2,048 GPUs cost 3.6% of the step, its iterations 3-4 sigmas
        out). Not for jobs read whole (their cells judge every iteration). Chosen on the
        simulated development splits (2.5 and 3 score the same, no healthy job named; 3 kept
        for the margin); 0 turns the rule off.
    shift_z : float, default 4.5
        Iterations after a step up of the pivot's iterations that lasts to the end of the window
        are irregular too when the step stands ``shift_z`` standard errors out (medians before
        and after, the sigma of the successive differences:
        :meth:`holmes.detect.IrregularityRule.level_shift`) and is at least ``min_shift`` of the
        step: a device slow from some iteration on, costing 5% of each step, is beyond doubt
        though no single iteration is (the window's spread grows with the step); a slow drift,
        which a straight line fits better, is no step. Not on jobs read whole; 0 turns it off.
        Chosen on the simulated development splits: the step statistic of 128 healthy 2,048-GPU
        jobs stayed at most 3.1 (their steps at most 1.5% of the step); a leaf switch slow from
        iteration 14 on, costing 3.1% of the job, stood 4.6 out (6 left it ``healthy``).
    min_shift : float, default 0.02
        See ``shift_z``: the smallest step it flags, as a share of the usual iteration. A step
        is evidenced by every iteration after it, so it may be smaller than ``min_stretch`` (one
        iteration's evidence).
    full_read : int, default 128
        Jobs of at most this many ranks are read whole: instead of following waits from the
        pivot, every device's own time in every iteration (each rank's compute, each channel's
        transfers) is compared with the job's own noise (:mod:`holmes.localize.irregular.cells`), a cell
        counting when its excess alone could make an iteration delta-irregular; larger
        jobs run Algorithm 1 and compare the ranks the search reads.
    cell_noise : float, default 0.1
        ... only when the job's compute noise (the pooled spread of the ranks' compute per
        iteration over the usual compute) is at most this: on a noisier job (a loaded machine)
        the cells' tail model no longer holds and Algorithm 1 from the pivot runs instead
        (chosen on the development halves of two real-run corpora, one captured on an idle
        machine, one at load 6-16).
    cell_usual_q : float, default 0.1
        Jobs read whole: a row's (a rank's compute, a channel's transfers) usual level is this
        quantile of its iterations, so a slowdown covering up to ``1 - cell_usual_q`` of them
        (a fault that persists from a quarter of the run on) is measured against the healthy level.
    cell_cost : float, default 1.0
        Jobs read whole: outside the pivot's delta-irregular iterations a cell counts only when its
        excess reaches ``cell_cost * (delta - 1)`` times the usual iteration (1: it alone could
        make an iteration irregular; 0: any cell beyond the noise counts).
    cell_cost_z : float, default 2.5
        Jobs read whole: on a quiet job the cost a cell needs is lower, ``cell_cost_z`` sigmas of
        the pivot's iterations (the stretch rule's sigma), at least ``min_stretch`` of the step,
        when that is under ``cell_cost``'s; 0 keeps ``cell_cost`` alone.
    cell_transient : float, default 0.25
        Jobs read whole: an event that is one operator's stall -- the device's other work grew at
        under this fraction of that operator's rate (a GPU's other kernels; a host's, the median
        over its slow ranks; for a channel holding one operator in the iteration, the other
        transfers through its device;
        :meth:`holmes.localize.irregular.cells.CellEvidence.spread_ratio`; a slower device stretches all of
        its work alike, near 1) -- is reported as a one-off stall, not counted as evidence
        against the device; 0 counts every cell.
    cell_event_p : float, default 0.3
        Jobs read whole: a cell makes an event of its iteration when its p-value, times the rows
        of its kind (ranks, channels), is below this; a device's events are then judged together.
    cell_tail : {"exponential", "gpd"}, default "exponential"
        Jobs read whole: the model of the null cells' upper tail (:func:`holmes.localize.irregular.tails.tail_pvalue`).
    cell_per_op : bool, default False
        Jobs read whole: a channel's cell in an iteration is the median of its operators'
        slowdowns (each against its own operator position's usual transfer) instead of its
        summed transfer time (:meth:`holmes.localize.irregular.transfer.TransferTimes.ratio_table`).
    tail_calibration : float, default 1e6
        Jobs read whole: a device's confidence is ``1 - tail_calibration * p``, ``p`` the
        family-wise p-value of its cells under the exponential tail fitted to the job's cells
        (:func:`holmes.localize.irregular.cells.device_pvalues`), for the devices many others share (hosts,
        NVSwitches, switches, their uplinks; single devices have ``point_calibration``). The
        exponential tail is lighter than the real one, so the default names such a device
        (confidence 0.9) only from ``p = 1e-7``: on 104 development real runs (44 healthy) a
        healthy run's strongest shared device has ``p >= 8e-5`` once one-off stalls of hosts are
        set aside (``cell_transient``) and a host is judged by its slowest-growing rank (before
        both, host hiccups reached ``5e-8`` and the default was 1e8; docs/real-runs.md).
    point_calibration : float, default 1e4
        Jobs read whole: ``tail_calibration`` for single devices (a GPU, a NIC, a NIC's cable;
        :func:`holmes.topology.kinds.is_point`), named (confidence 0.9) from ``p = 1e-5``.
        Their cells are judged against every other rank or channel, while a host or an NVSwitch
        is judged against the job's two to four others, and it is there that the environment's
        shared disturbances land (a machine's other load, the operating system): on the 104
        development real runs (44 healthy) and the loaded corpus's 8 development healthy runs,
        the strongest single device of a healthy run had ``p = 2e-4`` (a margin of 20); the
        strongest host, judged by the median of its ranks, ``7e-6``.
    scan_reads : int, default 8
        Ranks not read before that the search's scan of one collective group (for the member that
        entered it last) may read: a scan that would read more is set aside until the iteration's
        other branches are searched, then resumed in full only if they found no cause (or none
        as strong as the set-aside operator's own excess), else dropped, and the report says so
        (:class:`~holmes.localize.evidence.search.GraphSearch`). Bounds the reads of a large job (a
        data-parallel group of hundreds of ranks); 0: every scan runs in full at once.
    min_confidence : float, default 0.9
        A device is named only when its confidence (against how often chance would blame it)
        reaches this; otherwise the verdict is ``inconclusive`` and the devices are candidates.
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
    max_starts: int | None = Field(default=4, ge=1)
    method: Literal["map", "linear"] = "map"
    include_host: bool = True
    exonerate: bool = True
    exonerate_bytes: float = Field(default=1 / 16, ge=0)
    exonerate_speedup: float = Field(default=2.0, ge=0)
    probe_reads: int = Field(default=64, ge=0)
    rate_lag: int = Field(default=1, ge=0)
    narrow: bool = True
    late_ratio: float = Field(default=0.5, ge=0, le=1)
    follow_waits: bool = True
    host_reads: int = Field(default=32, ge=0)
    noise_z: float = Field(default=3.0, ge=0)
    noise_window: int = Field(default=10, ge=0)
    null_iterations: int = Field(default=8, ge=0)
    straggler_share: float = Field(default=0.5, ge=0)
    full_read: int = Field(default=128, ge=0)
    stretch_z: float = Field(default=5.0, ge=0)
    min_stretch: float = Field(default=0.03, ge=0)
    candidate_z: float = Field(default=3.5, ge=0)
    own_z: float = Field(default=4.0, ge=0)
    compute_z: float = Field(default=3.0, ge=0)
    repeat_z: float = Field(default=3.0, ge=0)
    cause_share: float = Field(default=0.3, ge=0, le=1)
    shift_z: float = Field(default=4.5, ge=0)
    min_shift: float = Field(default=0.02, ge=0)
    cell_noise: float = Field(default=0.1, ge=0)
    cell_usual_q: float = Field(default=0.1, gt=0, lt=0.5)
    cell_cost: float = Field(default=1.0, ge=0)
    cell_cost_z: float = Field(default=2.5, ge=0)
    cell_transient: float = Field(default=0.25, ge=0, le=1)
    cell_event_p: float = Field(default=0.3, gt=0, le=1)
    cell_tail: Literal["exponential", "gpd"] = "exponential"
    cell_per_op: bool = False
    tail_calibration: float = Field(default=1e6, ge=1)
    point_calibration: float = Field(default=1e4, ge=1)
    scan_reads: int = Field(default=8, ge=0)
    min_confidence: float = Field(default=0.9, ge=0, le=1)
    persistent_z: float = Field(default=4.0, gt=0)
    persistent_fraction: float = Field(default=0.6, gt=0, le=1)
    network_min_excess: float = Field(default=0.2, ge=0)
    imbalance_pct: float = Field(default=3.0, ge=0)
    persistent_min_effect: float = Field(default=0.08, ge=0)
    unexplained_slowdown: float = Field(default=1.25, ge=1)
    whatif: bool = True

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise ConfigError(_one_line(exc)) from None

    @field_validator("delta", "alpha", "exonerate_bytes", "exonerate_speedup", "late_ratio", "noise_z",
                     "min_confidence", "straggler_share", "tail_calibration", "point_calibration", "cell_noise", "stretch_z", "min_stretch", "candidate_z", "own_z", "compute_z", "repeat_z", "shift_z", "min_shift", "cell_cost_z", "persistent_z", "network_min_excess", "imbalance_pct", "persistent_min_effect", "unexplained_slowdown")
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

    @field_validator("pivot", "window", "top_k", "max_iterations", "max_starts", "probe_reads", "rate_lag",
                     "host_reads", "noise_window", "null_iterations", "full_read", "scan_reads", mode="before")
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
            out[k] = v
        return out


#: the largest integer parameter (counts, ranks): an int32
_INT_MAX = 2**31 - 1


def _one_line(exc: ValidationError) -> str:
    parts = []
    for e in exc.errors():
        loc = ".".join(str(x) for x in e.get("loc", ())) or "parameters"
        msg = e.get("msg", "invalid").removeprefix("Value error, ")
        if e.get("type") == "extra_forbidden":
            parts.append(f"unknown parameter {loc!r}")
        else:
            got = repr(e.get("input"))
            parts.append(f"{loc}: {msg} (got {got if len(got) <= 80 else got[:77] + '...'})")
    return "localize: " + "; ".join(parts)
