"""Detectors that need no model, the detector protocol, and the choice of a detector by name.

The localizer needs one thing from a detector: ``predict_ops(ops_table) -> bool array``, one flag
per row of a rank's CommOps table (the :class:`Detector` protocol; :class:`holmes.detect.OperatorDetector`
follows it). Two detectors live here:

* :class:`LabelDetector` reads the ground-truth ``abnormal`` column of generated or labelled jobs.
  It is an *evaluation tool*: with it, the search and ranking are measured separately from the
  detector.
* :class:`RobustDetector` needs no model: an operator is abnormal when its duration exceeds the
  median duration of the same operator position (same ``op_index``, ``comm_id`` and ``op`` across
  the rank's iterations) by a relative ``margin`` and by ``k`` robust standard deviations (MAD).

:func:`resolve_detector` maps a name ("auto", "model", "label", "robust"), a saved model's path
or an object to a detector.

Examples
--------
>>> import numpy as np
>>> from holmes.io.schema import ops_table
>>> n = 10
>>> t = ops_table(rank=[0]*n, iteration=list(range(n)), op_index=[0]*n, comm_id=["dp-0"]*n, seq=list(range(n)),
...               op=["all_reduce"]*n, peer=[None]*n, nbytes=[4]*n, start_ns=[0]*n,
...               end_ns=[100, 101, 99, 100, 90250, 100, 102, 98, 100, 101])
>>> np.flatnonzero(RobustDetector().predict_ops(t)).tolist()
[4]
"""

from __future__ import annotations

import logging
import os
from typing import Any, Protocol, runtime_checkable

import numpy as np
import pyarrow as pa

from holmes.detect.monitor import DEFAULT_DELTA, IrregularityRule
from holmes.errors import ConfigError, SchemaError
from holmes.stats import robust_sigma

__all__ = ["Detector", "LabelDetector", "RobustDetector", "resolve_detector"]

log = logging.getLogger(__name__)


@runtime_checkable
class Detector(Protocol):
    """Anything that flags the abnormal rows of one rank's CommOps table."""

    def predict_ops(self, ops: pa.Table) -> np.ndarray: ...


class LabelDetector:
    """Ground truth as a detector: the table's boolean ``abnormal`` column.

    Use it to evaluate the search and ranking apart from the detector, on jobs written by
    ``holmes simulate`` or labelled by hand.

    Parameters
    ----------
    column : str, default "abnormal"

    Raises
    ------
    SchemaError
        The table has no such column.
    """

    def __init__(self, column: str = "abnormal") -> None:
        self.column = column

    def predict_ops(self, ops: pa.Table) -> np.ndarray:
        if self.column not in ops.column_names:
            rank = ops.column("rank")[0].as_py() if ops.num_rows else "?"
            raise SchemaError(f"rank {rank}: no '{self.column}' column for the label detector "
                              "(only generated or labelled jobs carry it)")
        col = ops.column(self.column)
        if not (pa.types.is_boolean(col.type) or pa.types.is_integer(col.type)):
            rank = ops.column("rank")[0].as_py() if ops.num_rows else "?"
            raise SchemaError(f"rank {rank}: column '{self.column}' has type {col.type}, expected bool "
                              "(the label the label detector reads)")
        return np.asarray(col.fill_null(0 if pa.types.is_integer(col.type) else False)
                          .to_numpy(zero_copy_only=False)).astype(bool)

    def __repr__(self) -> str:
        return f"LabelDetector(column={self.column!r})"


class RobustDetector:
    """Per-operator-position median/MAD rule over the rank's regular iterations; needs no model.

    The reference of an operator position (same ``op_index``, ``comm_id`` and ``op``) is the
    median of its durations over the rank's *regular* iterations (:class:`IrregularityRule` with
    ``delta``: so a persistent slowdown covering most iterations does not become the reference),
    and its spread the MAD over the same iterations. An operator is abnormal when it exceeds the reference by more than
    ``margin`` (relative), ``k`` robust standard deviations (1.4826 x MAD) and ``min_excess_ns``.

    Parameters
    ----------
    margin : float, default 0.15
    k : float, default 5.0
    min_excess_ns : int, default 20000
    delta : float, default 1.1
        The irregularity rule's delta; :func:`holmes.localize` passes its own.
    """

    def __init__(self, margin: float = 0.15, k: float = 5.0, min_excess_ns: int = 20_000,
                 delta: float = DEFAULT_DELTA) -> None:
        self.margin = margin
        self.k = k
        self.min_excess_ns = min_excess_ns
        self.delta = delta

    def _regular_rows(self, ops: pa.Table) -> np.ndarray:
        from holmes.io.job import derive_iterations

        it_t = derive_iterations(ops)
        its = it_t.column("iteration").to_numpy()
        dur = (it_t.column("end_ns").to_numpy() - it_t.column("start_ns").to_numpy()).astype(float)
        if its.size < 4:
            return np.ones(ops.num_rows, dtype=bool)
        body = dur[1:]  # the first iteration's start is unknown
        ok = np.ones(its.size, dtype=bool)
        ok[1:] = ~IrregularityRule(self.delta).mask(body)
        ok[0] = False
        if ok.sum() < 3:
            return np.ones(ops.num_rows, dtype=bool)
        return np.isin(ops.column("iteration").to_numpy(), its[ok])

    def predict_ops(self, ops: pa.Table) -> np.ndarray:
        n = ops.num_rows
        if n == 0:
            return np.zeros(0, dtype=bool)
        d = (ops.column("end_ns").to_numpy() - ops.column("start_ns").to_numpy()).astype(np.float64)
        regular = self._regular_rows(ops)
        key = _position_key(ops)
        order = np.argsort(key, kind="stable")
        ks = key[order]
        bounds = np.flatnonzero(np.diff(ks)) + 1
        starts = np.concatenate(([0], bounds))
        ends = np.concatenate((bounds, [n]))
        base = np.empty(n)
        sigma = np.empty(n)
        ds = d[order]
        rs = regular[order]
        # one step per operator position (a few hundred), not per operator
        for lo, hi in zip(starts.tolist(), ends.tolist()):
            seg = ds[lo:hi]
            ref = seg[rs[lo:hi]]
            if ref.size < 3:
                ref = seg
            m = np.median(ref)
            base[lo:hi] = m
            sigma[lo:hi] = robust_sigma(ref)
        out = np.empty(n, dtype=bool)
        excess = ds - base
        out[order] = (excess > self.margin * base) & (excess > self.k * sigma) & (excess > self.min_excess_ns)
        return out

    def __repr__(self) -> str:
        return f"RobustDetector(margin={self.margin}, k={self.k}, delta={self.delta})"


def _position_key(ops: pa.Table) -> np.ndarray:
    """An integer per row naming its operator position (op_index, comm_id, op)."""
    idx = ops.column("op_index").to_numpy().astype(np.int64)
    comm = ops.column("comm_id").combine_chunks()
    if not pa.types.is_dictionary(comm.type):
        comm = comm.dictionary_encode()
    op = ops.column("op").combine_chunks()
    if not pa.types.is_dictionary(op.type):
        op = op.dictionary_encode()
    c = comm.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    o = op.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    return (idx * (len(comm.dictionary) + 1) + c) * 16 + o


def resolve_detector(detector: Any = None, *, delta: float = DEFAULT_DELTA) -> Any:
    """A detector from a name, a saved model's path or an object.

    ``None`` or ``"auto"``: the shipped model (:func:`holmes.detect.load_default_detector`) when it
    can be loaded, else :class:`RobustDetector`; ``"model"``: the shipped model (error if
    unavailable); ``"label"``: :class:`LabelDetector`; ``"robust"``: :class:`RobustDetector` judging
    regular iterations with ``delta``; ``"reconstruct"``: the label-free
    :class:`~holmes.detect.reconstruct.ReconstructionDetector` learning from the regular iterations; a path to a model written by ``holmes train`` /
    :meth:`OperatorDetector.save`: that model; an object with ``predict_ops`` is returned unchanged.

    >>> resolve_detector("robust", delta=1.3)
    RobustDetector(margin=0.15, k=5.0, delta=1.3)
    """
    if detector is not None and not isinstance(detector, (str, os.PathLike)):
        if not hasattr(detector, "predict_ops"):
            raise ConfigError(f"detector {detector!r} has no predict_ops(ops) method")
        return detector
    if isinstance(detector, os.PathLike) or (isinstance(detector, str) and _looks_like_path(detector)):
        from holmes.detect.detector import OperatorDetector

        return OperatorDetector.load(detector)
    name = (detector or "auto").lower()
    if name == "label":
        return LabelDetector()
    if name == "reconstruct":
        from holmes.detect.reconstruct import ReconstructionDetector

        return ReconstructionDetector(delta=delta)
    if name == "robust":
        return RobustDetector(delta=delta)
    if name in ("auto", "model"):
        from holmes.detect.detector import load_default_detector

        try:
            return load_default_detector()
        except Exception as exc:  # noqa: BLE001 - any failure to load the model falls back
            if name == "model":
                raise ConfigError(f"the default detector model cannot be loaded: {exc}") from None
            log.info("default detector unavailable (%s); using RobustDetector", exc)
            return RobustDetector(delta=delta)
    raise ConfigError(f"unknown detector {detector!r}; expected auto, model, label, robust, reconstruct "
                      "or a model path")


def _looks_like_path(text: str) -> bool:
    """A detector given as text names a saved model when it is not one of the names and exists
    (with or without the ``.json`` of the model's metadata file) or has a path separator."""
    if text.lower() in ("auto", "model", "label", "robust", "reconstruct"):
        return False
    return os.sep in text or "/" in text or os.path.exists(text) or os.path.exists(text + ".json")
