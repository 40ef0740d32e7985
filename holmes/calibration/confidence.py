"""Calibrated confidence: the probability that a device the analyses name is a root cause.

The analyses measure how far a device's evidence stands out of the job's own noise (the
irregular analysis's binomial tail, the persistent analysis's effect test, the hang analysis's
fixed 0.99): an *evidence score*, not the chance of being right. A
:class:`ConfidenceCalibration` maps the evidence of each device of one report
(:func:`device_features`) to ``P(root cause)``: per segment of evidence (:func:`segment_of`: the
hang analysis, or the whole-job comparison or Algorithm 1 and the device's place in the list), an
isotonic map of the evidence score, stored as points in a versioned JSON file
(``confidence.json`` beside this module, written by ``scripts/tune.py`` from the development
splits of the project's corpora; no pickle, no scikit-learn at run time). The other features
(coverage, score share, impact, kind, ...) are recorded with the dataset for richer models; a
logistic regression over all of them lost more right answers at the same cost of wrong ones
(``scripts/tune.py`` prints the comparison).

The pipeline applies it once, to the merged devices of a report
(:meth:`ConfidenceCalibration.apply`): each device's ``confidence`` becomes the calibrated
probability, its raw value stays as ``evidence_score``; the devices keep the analyses' order and
no device is more probable than the one before it.

Examples
--------
>>> from holmes.localize.report import DeviceScore
>>> cal = ConfidenceCalibration.load()
>>> devs = [DeviceScore("gpu:3", "gpu", 0.9, confidence=0.999999, coverage=1.0, evidence=("irregular",)),
...         DeviceScore("nvswitch:0", "nvswitch", 0.1, confidence=0.95, coverage=0.4, evidence=("irregular",))]
>>> out = cal.apply(devs, world_size=16, whole_job=True)
>>> [d.id for d in out], out[0].evidence_score
(['gpu:3', 'nvswitch:0'], 0.999999)
>>> all(0.0 <= d.confidence <= 1.0 for d in out)
True
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from holmes.errors import ConfigError
from holmes.limits import read_json_capped

__all__ = ["FEATURES", "KINDS", "SCHEMA", "DEFAULT_PATH", "alike_groups", "device_features", "segment_of", "ConfidenceCalibration"]

#: the file format of :meth:`ConfidenceCalibration.to_json`
SCHEMA = "holmes.confidence-calibration/1"
#: the shipped calibration
DEFAULT_PATH = Path(__file__).with_name("confidence.json")
#: device kinds with a feature of their own (any other kind has none set)
KINDS = ("gpu", "host", "nic", "link", "nvswitch", "switch")
#: the ``rank`` feature (a suspicion's place in the list) is capped here: places from it on are
#: "far down the list" alike
MAX_PLACE = 5
#: jobs of more ranks than this have segments of their own under ``by_scale`` (the default
#: ``full_read``: the size above which every job takes Algorithm 1)
LARGE_WORLD = 128
#: the analyses with a feature of their own
ANALYSES = ("irregular", "persistent", "hang")
#: the features of one device, in the order of :func:`device_features`'s columns
FEATURES = ("logit_evidence", "has_evidence", "gap_next", "rank", "score", "coverage", "impact", "has_impact",
            "log_causes", "log_devices", "whole_job", "log_world") + \
    tuple(f"analysis_{a}" for a in ANALYSES) + tuple(f"kind_{k}" for k in KINDS)
#: evidence scores are clipped to [EPS, 1 - EPS] before their logit: a binomial tail of 1 - 1e-8
#: is no better evidence than one of 1 - 1e-6 (both say "far beyond chance"; the difference is
#: rounding and the number of iterations searched)
EPS = 1e-6


def _logit(p: float) -> float:
    p = min(max(float(p), EPS), 1.0 - EPS)
    return math.log(p) - math.log1p(-p)


def device_features(devices: Sequence[Any], *, world_size: int, whole_job: bool) -> np.ndarray:
    """The evidence of each device of one report's ranked list, ``(len(devices), len(FEATURES))``.

    ``devices`` are :class:`~holmes.localize.report.DeviceScore` in the analyses' order (best
    first) with their raw confidence (the evidence score); ``whole_job``: the irregular analysis
    compared the job cell by cell (read whole) rather than running Algorithm 1.

    >>> from holmes.localize.report import DeviceScore
    >>> X = device_features([DeviceScore("gpu:1", "gpu", 0.7, confidence=0.99, causes=3),
    ...                      DeviceScore("host:0", "host", 0.3, confidence=0.5)], world_size=8, whole_job=False)
    >>> X.shape == (2, len(FEATURES)), float(X[0, FEATURES.index("rank")]), float(X[1, FEATURES.index("kind_host")])
    (True, 0.0, 1.0)
    >>> round(float(X[0, FEATURES.index("gap_next")]), 2)
    0.49
    """
    n = len(devices)
    X = np.zeros((n, len(FEATURES)), dtype=np.float64)
    col = {f: i for i, f in enumerate(FEATURES)}
    raw = [d.confidence for d in devices]
    group = alike_groups(devices)
    for i, d in enumerate(devices):
        row = X[i]
        c = raw[i]
        if c is not None and math.isfinite(c):
            row[col["logit_evidence"]] = _logit(c)
            row[col["has_evidence"]] = 1.0
            nxt = next((r for j, r in enumerate(raw[i + 1:], i + 1)
                        if r is not None and math.isfinite(r) and group[j] != group[i]), 0.0)
            row[col["gap_next"]] = float(c) - float(nxt)
        row[col["rank"]] = float(min(group[i], MAX_PLACE))
        row[col["score"]] = float(d.score) if math.isfinite(d.score) else 0.0
        row[col["coverage"]] = float(d.coverage) if d.coverage is not None and math.isfinite(d.coverage) else 0.0
        if d.impact_pct is not None and math.isfinite(d.impact_pct):
            row[col["impact"]] = min(max(float(d.impact_pct), 0.0), 100.0) / 100.0
            row[col["has_impact"]] = 1.0
        row[col["log_causes"]] = math.log1p(max(int(d.causes), 0))
        row[col["log_devices"]] = math.log2(n)
        row[col["whole_job"]] = float(bool(whole_job))
        row[col["log_world"]] = math.log2(max(int(world_size), 1))
        for a in ANALYSES:
            row[col[f"analysis_{a}"]] = float(a in d.evidence)
        kind = d.kind or d.id.split(":", 1)[0]
        if kind in KINDS:
            row[col[f"kind_{kind}"]] = 1.0
    return X


def alike_groups(devices: Sequence[Any]) -> list[int]:
    """The place of each device's suspicion in a ranked list: devices that name each other as
    ``alike`` (the evidence cannot tell them apart) share one place, the first member's; the
    others count places as usual. A device is one suspicion with its group, so the second member
    of a group is not "the second device" of the report.

    >>> from holmes.localize.report import DeviceScore
    >>> alike_groups([DeviceScore("nic:7", "nic", 0.3, alike=("nic:9",)), DeviceScore("nic:9", "nic", 0.3, alike=("nic:7",)),
    ...               DeviceScore("gpu:1", "gpu", 0.1)])
    [0, 0, 1]
    """
    out: list[int] = []
    seen: dict[str, int] = {}      # device id -> the group place it was listed under
    place = 0
    for d in devices:
        here = seen.get(d.id)
        if here is None:
            here = place
            place += 1
        out.append(here)
        for a in getattr(d, "alike", ()) or ():
            seen.setdefault(a, here)
    return out


def segment_of(X: np.ndarray, *, rank_buckets: int = 3, by_path: bool = True, by_analysis: bool = False,
               by_kind: bool = False, by_scale: bool = False) -> list[str]:
    """The segment of each row of ``X`` (features as :data:`FEATURES`): ``"hang"`` for a device
    the hang analysis names, else the comparison (``whole``: the job compared cell by cell;
    ``alg1``: Algorithm 1; ``any`` when not ``by_path``) and the place in the ranked list
    (``r0``, ``r1``, ... up to ``rank_buckets - 1``, the last bucket holding the rest); with
    ``by_kind``, then ``-cmp`` for a compute device (GPU, host) or ``-net`` for a network one
    (their evidence differs: a rank's own work, or transfers that several devices share).

    >>> X = np.zeros((2, len(FEATURES))); X[1, FEATURES.index("rank")] = 4; X[0, FEATURES.index("whole_job")] = 1
    >>> segment_of(X)
    ['whole-r0', 'alg1-r2']
    >>> X[0, FEATURES.index("kind_gpu")] = 1; segment_of(X, by_kind=True)
    ['whole-r0-cmp', 'alg1-r2-net']
    >>> X[1, FEATURES.index("log_world")] = 11; segment_of(X, by_scale=True)
    ['whole-r0', 'alg1-r2-big']
    """
    X = np.atleast_2d(X)
    hang = X[:, FEATURES.index("analysis_hang")] > 0
    whole = X[:, FEATURES.index("whole_job")] > 0
    rank = np.minimum(X[:, FEATURES.index("rank")].astype(int), rank_buckets - 1)
    # by_analysis: a device only the persistent analysis found (an effect test over every
    # iteration) apart from one the irregular analysis's tail found
    per = (X[:, FEATURES.index("analysis_persistent")] > 0) & (X[:, FEATURES.index("analysis_irregular")] <= 0)
    an = [("-per" if p else "-irr") if by_analysis else "" for p in per]
    comp = (X[:, FEATURES.index("kind_gpu")] > 0) | (X[:, FEATURES.index("kind_host")] > 0)
    kd = [("-cmp" if c else "-net") if by_kind else "" for c in comp]
    big = X[:, FEATURES.index("log_world")] > math.log2(LARGE_WORLD)
    sc = [("-big" if b else "") if by_scale else "" for b in big]
    return ["hang" if h else f"{('whole' if w else 'alg1') if by_path else 'any'}{a}-r{r}{k}{z}"
            for h, w, r, a, k, z in zip(hang, whole, rank, an, kd, sc)]


@dataclass(frozen=True)
class ConfidenceCalibration:
    """Evidence -> ``P(root cause)``: one isotonic map of the evidence score per segment.

    A device's segment (:func:`segment_of`) says which evidence it stands on: the hang analysis,
    or the irregular / persistent analyses through a whole-job comparison or Algorithm 1, and its
    place in the report's list (the first device of a report is right more often than a second
    one at the same evidence score). Within a segment the probability is a non-decreasing
    function of the evidence score's logit, stored as points and interpolated linearly
    (constant above the last point, as :class:`sklearn.isotonic.IsotonicRegression` predicts;
    below a segment's first point, the lower of its first value and the map of all rows: weaker
    evidence than a segment ever saw is not extrapolated upwards).

    Parameters
    ----------
    features : tuple of str
        The feature names of the rows it reads (must be :data:`FEATURES`).
    segments : dict
        segment name -> ``(x, y)``: the isotonic points (``x``: logit of the evidence score,
        ``y``: probability; both non-decreasing). ``"all"`` is the map of a segment not listed.
    rank_buckets : int
        Places in the list with a segment of their own (the last holds the rest).
    by_path : bool
        Whether the whole-job comparison and Algorithm 1 have segments of their own.
    by_analysis : bool
        Whether a device only the persistent analysis found has segments of its own (its evidence
        is an effect test over every iteration, not the irregular analysis's tail).
    clip : (float, float)
        The probability range reported (no device is certain).
    logistic : dict or None
        When set (``{"mean", "scale", "coef", "intercept"}``, one value per feature), the maps
        read the logit of a logistic regression over every standardized feature instead of the
        evidence score's logit (``scripts/tune.py`` fits both families and keeps the better).
    by_kind : bool
        Whether compute devices (GPU, host) and network devices have segments of their own.
    by_scale : bool
        Whether jobs of more than :data:`LARGE_WORLD` ranks have segments of their own.
    meta : dict
        What it was fitted on (``scripts/tune.py`` records corpora, rows, cross-validated scores).
    """

    features: tuple[str, ...]
    segments: dict[str, tuple[tuple[float, ...], tuple[float, ...]]]
    rank_buckets: int = 3
    by_path: bool = True
    by_analysis: bool = False
    clip: tuple[float, float] = (0.001, 0.999)
    logistic: dict[str, Any] | None = None
    by_kind: bool = False
    by_scale: bool = False
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if tuple(self.features) != FEATURES:
            raise ConfigError(f"confidence calibration: features {list(self.features)} are not this version's "
                              f"{list(FEATURES)}; re-fit it with scripts/tune.py")
        if "all" not in self.segments:
            raise ConfigError("confidence calibration: no 'all' segment")
        if self.logistic is not None:
            k = len(self.features)
            if not all(len(self.logistic.get(n, ())) == k for n in ("mean", "scale", "coef")) or \
                    not math.isfinite(float(self.logistic.get("intercept", float("nan")))) or \
                    min(self.logistic["scale"]) <= 0:
                raise ConfigError("confidence calibration: logistic needs mean, scale (> 0), coef per feature "
                                  "and an intercept")
        if self.rank_buckets < 1:
            raise ConfigError("confidence calibration: rank_buckets must be at least 1")
        for name, (x, y) in self.segments.items():
            if len(x) != len(y) or not len(x):
                raise ConfigError(f"confidence calibration: segment {name!r}: x and y differ in length or are empty")
            if any(b < a for a, b in zip(x, x[1:])) or any(b < a for a, b in zip(y, y[1:])):
                raise ConfigError(f"confidence calibration: segment {name!r}: points must be non-decreasing")
            if not all(math.isfinite(v) for v in (*x, *y)) or min(y) < 0 or max(y) > 1:
                raise ConfigError(f"confidence calibration: segment {name!r}: a probability outside [0, 1]")

    # -- prediction -----------------------------------------------------------------------------
    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        """``P(root cause)`` of each row of ``X`` (features as :data:`FEATURES`)."""
        X = np.atleast_2d(np.asarray(X, dtype=np.float64))
        segs = segment_of(X, rank_buckets=self.rank_buckets, by_path=self.by_path, by_analysis=self.by_analysis,
                          by_kind=self.by_kind, by_scale=self.by_scale)
        ev = self.score(X)
        has = X[:, FEATURES.index("has_evidence")] > 0 if self.logistic is None else np.ones(len(X), bool)
        ax, ay = self.segments["all"]
        out = np.empty(len(X))
        for i, (s, e, h) in enumerate(zip(segs, ev, has)):
            x, y = self.segments.get(s) or self.segments["all"]
            if not h:
                out[i] = min(y[0], ay[0])
            elif e < x[0]:  # weaker evidence than the segment ever saw: no better than the map of all rows says
                out[i] = min(y[0], float(np.interp(e, ax, ay)))
            else:
                out[i] = np.interp(e, x, y)
        return np.clip(out, self.clip[0], self.clip[1])

    def score(self, X: np.ndarray) -> np.ndarray:
        """What the maps read: the evidence score's logit, or the logistic regression's logit."""
        X = np.atleast_2d(np.asarray(X, dtype=np.float64))
        if self.logistic is None:
            return X[:, FEATURES.index("logit_evidence")]
        lg = self.logistic
        return ((X - np.asarray(lg["mean"])) / np.asarray(lg["scale"])) @ np.asarray(lg["coef"]) + float(lg["intercept"])

    def predict_list(self, X: np.ndarray) -> np.ndarray:
        """The probabilities of the devices of one report, best first (rows of ``X`` in the
        analyses' order): :meth:`predict_proba`, then no device above the one before it (a
        second device is never more probable than the first the analyses ranked above it)."""
        return np.minimum.accumulate(self.predict_proba(X)) if len(X) else np.zeros(0)

    def apply(self, devices: Sequence[Any], *, world_size: int, whole_job: bool) -> list[Any]:
        """The devices of one report, in the analyses' order, with calibrated ``confidence``
        (:meth:`predict_list`; the raw one kept as ``evidence_score``)."""
        devices = list(devices)
        if not devices:
            return []
        p = self.predict_list(device_features(devices, world_size=world_size, whole_job=whole_job))
        return [replace(d, confidence=float(round(pi, 6)), evidence_score=d.confidence) for d, pi in zip(devices, p)]

    # -- file -----------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """The file's object (``schema`` :data:`SCHEMA`)."""
        r = lambda xs: [round(float(v), 10) for v in xs]  # noqa: E731 - stable text across platforms
        return {"schema": SCHEMA, "features": list(self.features), "rank_buckets": int(self.rank_buckets),
                "by_path": bool(self.by_path), "by_analysis": bool(self.by_analysis), "clip": r(self.clip),
                **({"by_kind": True} if self.by_kind else {}), **({"by_scale": True} if self.by_scale else {}),
                "segments": {k: {"x": r(x), "y": r(y)} for k, (x, y) in sorted(self.segments.items())},
                "logistic": None if self.logistic is None else
                {"mean": r(self.logistic["mean"]), "scale": r(self.logistic["scale"]),
                 "coef": r(self.logistic["coef"]), "intercept": round(float(self.logistic["intercept"]), 10)},
                "meta": self.meta}

    def dumps(self) -> str:
        """:meth:`to_json` as the file's text (sorted keys, one trailing newline)."""
        return json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, doc: Any, *, source: str = "confidence calibration") -> "ConfidenceCalibration":
        """Build from :meth:`to_json`'s object; a wrong schema or shape raises
        :class:`~holmes.errors.ConfigError` naming ``source``."""
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
            raise ConfigError(f"{source}: not a {SCHEMA} file")
        try:
            segs = {str(k): (tuple(map(float, v["x"])), tuple(map(float, v["y"]))) for k, v in doc["segments"].items()}
            return cls(features=tuple(doc["features"]), segments=segs, rank_buckets=int(doc.get("rank_buckets", 3)),
                       by_path=bool(doc.get("by_path", True)), by_analysis=bool(doc.get("by_analysis", False)),
                       by_kind=bool(doc.get("by_kind", False)), by_scale=bool(doc.get("by_scale", False)),
                       clip=tuple(map(float, doc.get("clip", (0.001, 0.999)))),
                       logistic=None if doc.get("logistic") is None else
                       {"mean": tuple(map(float, doc["logistic"]["mean"])),
                        "scale": tuple(map(float, doc["logistic"]["scale"])),
                        "coef": tuple(map(float, doc["logistic"]["coef"])),
                        "intercept": float(doc["logistic"]["intercept"])},
                       meta=dict(doc.get("meta") or {}))
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(f"{source}: bad field ({type(exc).__name__}: {exc})") from None

    @classmethod
    def load(cls, path: str | Path | None = None) -> "ConfidenceCalibration":
        """Read a calibration file (default: the shipped :data:`DEFAULT_PATH`)."""
        p = Path(path) if path is not None else DEFAULT_PATH
        if not p.exists():
            raise ConfigError(f"{p}: no confidence calibration file")
        try:  # the capped reader: a FIFO or /dev/zero is refused, not read forever
            doc = read_json_capped(p, error=ConfigError, what="confidence calibration")
        except ConfigError as exc:
            raise ConfigError(f"{p}: unreadable confidence calibration: {exc}") from None
        return cls.from_json(doc, source=str(p))
