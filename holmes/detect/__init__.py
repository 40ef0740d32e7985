"""Abnormal-operator detection (paper section 4.2): iteration monitor, features, random forest, drift tuning.

Public pieces:

* :class:`IrregularityRule`, :func:`irregular_mask`, :class:`IterationMonitor`,
  :func:`irregular_iterations`, :func:`classify_episode` -- the one delta-irregularity rule (on a
  finished window or streaming) and the kind of an irregular stretch (spike, fluctuation, persistent);
* :func:`operator_features` / :data:`FEATURE_NAMES` -- per-operator features of one rank's table;
* :class:`JobContext` -- cross-rank evidence (per-iteration and per-instance slowness over ranks)
  that lets the detector see faults too weak for one rank's log;
* :class:`OperatorDetector` -- the random forest (compiled numba inference, JSON + npz model files),
  :func:`load_default_detector` -- the model shipped with Holmes;
* :class:`ReconstructionDetector` (label-free, learns the job's own regular iterations: RUAD's
  idea), :class:`RobustDetector` (no model), :class:`LabelDetector` (ground truth, for evaluation), the
  :class:`Detector` protocol and :func:`resolve_detector` (a detector from a name or a model path);
* :class:`DriftMonitor`, :class:`AutoTuner` -- drift auto-tuning by shifting split thresholds;
* :func:`job_context`, :func:`score_job`, :func:`write_scores` -- full-job detection (what
  ``holmes detect`` does), in process or on a Dask cluster (``scheduler=``, :mod:`holmes.parallel`).

The paper's baselines (3-sigma, KNN, SVM) are evaluation code: :mod:`holmes.eval.detect_baselines`.
"""

from holmes.detect.autotune import AutoTuner
from holmes.detect.context import CONTEXT_FEATURE_NAMES, JobContext
from holmes.detect.detector import DEFAULT_MODEL, OperatorDetector, load_default_detector
from holmes.detect.drift import DriftMonitor, RetuneRecord
from holmes.detect.features import DRIFT_FEATURES, FEATURE_NAMES, operator_features
from holmes.detect.forest import CompiledForest
from holmes.detect.model_io import load_model, save_model
from holmes.detect.reconstruct import ReconstructionDetector
from holmes.detect.monitor import (DEFAULT_DELTA, IrregularityRule, IterationMonitor, classify_episode, episodes,
                                   irregular_iterations, irregular_mask)
from holmes.detect.simple import Detector, LabelDetector, RobustDetector, resolve_detector
from holmes.detect.training import job_dataset, jobs_dataset, rank_dataset
from holmes.detect.fulljob import JobScores, job_context, score_job, write_scores

__all__ = [
    "DEFAULT_DELTA", "IrregularityRule", "irregular_mask", "IterationMonitor", "irregular_iterations",
    "classify_episode", "episodes",
    "FEATURE_NAMES", "DRIFT_FEATURES", "operator_features", "JobContext", "CONTEXT_FEATURE_NAMES",
    "OperatorDetector", "load_default_detector", "DEFAULT_MODEL", "CompiledForest", "save_model", "load_model",
    "Detector", "LabelDetector", "RobustDetector", "ReconstructionDetector", "resolve_detector",
    "DriftMonitor", "AutoTuner", "RetuneRecord",
    "rank_dataset", "job_dataset", "jobs_dataset",
    "job_context", "score_job", "write_scores", "JobScores",
]
