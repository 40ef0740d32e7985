"""A label-free detector: learn each operator position's normal behaviour from the job's own
regular iterations and flag what that cannot reconstruct (the idea of RUAD, with a linear model).

Real logs carry no per-operator labels, and a forest trained on simulated labels may not
transfer to a cluster unlike the simulator. :class:`ReconstructionDetector` needs no training
data: for one rank's table it

1. lays the log-durations out as a matrix, iterations x operator positions (``op_index``,
   ``comm_id``, ``op``);
2. takes the rank's *regular* iterations (:class:`~holmes.detect.IrregularityRule`) as the normal
   data, and fits a low-rank model there: per-position medians plus the first ``n_components``
   principal directions of the deviations (what varies together in a healthy iteration, e.g. a
   whole iteration a little slower);
3. reconstructs every iteration with coefficients kept inside the range the regular iterations
   used (a healthy model cannot explain a stretch it never saw), and flags an operator whose
   log-duration exceeds its reconstruction by more than ``k`` robust sigmas of that position's
   residuals on the regular iterations, by a relative ``margin`` and by ``min_excess_ns``.

Fitting is an SVD of a small matrix (iterations x positions): milliseconds per rank.

Examples
--------
>>> import numpy as np
>>> from holmes.io.schema import ops_table
>>> rng = np.random.default_rng(0)
>>> n = 30
>>> dur = (1e6 * np.exp(rng.normal(0, 0.02, 2 * n))).astype(int)
>>> dur[2 * 17] *= 3                                            # one op of iteration 17 stretched
>>> start = np.arange(2 * n) * 5_000_000
>>> t = ops_table(rank=[0] * 2 * n, iteration=np.repeat(np.arange(n), 2), op_index=[0, 1] * n,
...               comm_id=["tp-0", "dp-0"] * n, seq=np.arange(2 * n), op=["all_reduce"] * 2 * n,
...               peer=[None] * 2 * n, nbytes=[1024] * 2 * n, start_ns=start, end_ns=start + dur)
>>> np.flatnonzero(ReconstructionDetector().predict_ops(t)).tolist()
[34]
"""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa

from holmes.detect.features import iteration_durations, position_keys
from holmes.detect.monitor import DEFAULT_DELTA, IrregularityRule
from holmes.errors import ConfigError
from holmes.stats import MAD_SIGMA, nan_quiet

__all__ = ["ReconstructionDetector"]

log = logging.getLogger(__name__)


class ReconstructionDetector:
    """Flag the operators a healthy low-rank model of the rank's own log cannot reconstruct.

    Parameters
    ----------
    n_components : int, default 2
        Principal directions of the healthy deviations (0: per-position medians only).
    k : float, default 5.0
        Robust sigmas of the position's healthy residuals an operator must exceed.
    margin : float, default 0.15
        Relative excess over the reconstructed duration an operator must also exceed.
    min_excess_ns : int, default 20000
        Absolute excess (ns) an operator must also exceed.
    delta : float, default 1.1
        The irregularity rule choosing the regular iterations the model learns from.
    min_sigma : float, default 0.01
        Floor of a position's residual sigma (log scale: 1%).
    """

    def __init__(self, n_components: int = 2, k: float = 5.0, margin: float = 0.15, min_excess_ns: int = 20_000,
                 delta: float = DEFAULT_DELTA, min_sigma: float = 0.01) -> None:
        self.n_components = n_components
        self.k = k
        self.margin = margin
        self.min_excess_ns = min_excess_ns
        self.delta = delta
        self.min_sigma = min_sigma

    def __repr__(self) -> str:
        return (f"ReconstructionDetector(n_components={self.n_components}, k={self.k}, margin={self.margin}, "
                f"delta={self.delta})")

    def _check(self) -> None:
        if int(self.n_components) != self.n_components or self.n_components < 0:
            raise ConfigError(f"n_components must be an integer >= 0 (got {self.n_components!r})")
        for name in ("k", "margin", "min_excess_ns", "min_sigma"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and np.isfinite(v) and v >= 0):
                raise ConfigError(f"{name} must be a finite number >= 0 (got {v!r})")

    def score_ops(self, ops: pa.Table) -> np.ndarray:
        """Per row, how many healthy residual sigmas its log-duration exceeds its reconstruction."""
        return self._fit_residuals(ops)[0]

    def predict_ops(self, ops: pa.Table) -> np.ndarray:
        """Boolean flag per row of one rank's CommOps table."""
        z, dur, recon = self._fit_residuals(ops)
        excess = dur - recon
        return (z > self.k) & (excess > self.margin * recon) & (excess > self.min_excess_ns)

    def _fit_residuals(self, ops: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        self._check()
        n = ops.num_rows
        if n == 0:
            z = np.zeros(0)
            return z, z, z
        dur = np.maximum((ops.column("end_ns").to_numpy() - ops.column("start_ns").to_numpy()).astype(np.float64), 1.0)
        logd = np.log(dur)
        pos = position_keys(ops)
        it = ops.column("iteration").to_numpy()
        iters, row_it = np.unique(it, return_inverse=True)
        n_it, n_pos = iters.size, int(pos.max()) + 1
        # iterations x positions (a position repeated within an iteration keeps its last row;
        # the residual is computed per row against the row's own cell of the reconstruction)
        X = np.full((n_it, n_pos), np.nan)
        X[row_it, pos] = logd
        _, it_dur = iteration_durations(ops)
        regular = ~IrregularityRule(self.delta).mask(it_dur.astype(np.float64)) if n_it >= 4 else np.ones(n_it, bool)
        if regular.sum() < 3:
            regular = np.ones(n_it, bool)
        with nan_quiet():  # a position absent from every regular iteration: all-NaN
            med = np.nanmedian(X[regular], axis=0)
            med = np.where(np.isfinite(med), med, np.nanmedian(X, axis=0))
        D = np.where(np.isnan(X), 0.0, X - med)        # deviations, missing cells at the median
        recon = np.zeros_like(D)
        # the components need many positions to mean anything, and fit on winsorized healthy
        # deviations so that a stretched operator inside a regular iteration cannot become one
        kc = min(int(self.n_components), int(regular.sum()) - 1, n_pos // 4)
        if kc > 0:
            Dr = D[regular]
            s0 = np.maximum(MAD_SIGMA * np.median(np.abs(Dr - np.median(Dr, axis=0)), axis=0), self.min_sigma)
            Dw = np.clip(Dr, -3.0 * s0, 3.0 * s0)
            _, _, vt = np.linalg.svd(Dw, full_matrices=False)
            V = vt[:kc].T                               # positions x components
            C = D @ V                                   # coefficients of every iteration
            Cw = Dw @ V
            lo, hi = Cw.min(axis=0), Cw.max(axis=0)
            recon = np.clip(C, lo, hi) @ V.T
        resid = D - recon
        sig = MAD_SIGMA * np.median(np.abs(resid[regular] - np.median(resid[regular], axis=0)), axis=0)
        sig = np.maximum(sig, self.min_sigma)
        z_cell = resid / sig
        z = z_cell[row_it, pos]
        recon_dur = np.exp(med[pos] + recon[row_it, pos])
        return z, dur, recon_dur
