"""Abnormal-operator detection (paper section 4.2): iteration monitor, features, random forest, drift tuning.

Public pieces:

* :class:`IterationMonitor`, :func:`irregular_iterations`, :func:`classify_episode` -- delta-irregularity
  on a pivot rank and the kind of an irregular stretch (spike, fluctuation, persistent);
* :func:`operator_features` / :data:`FEATURE_NAMES` -- per-operator features of one rank's table;
* :class:`JobContext` -- cross-rank evidence (per-iteration and per-instance slowness over ranks)
  that lets the detector see faults too weak for one rank's log;
* :class:`OperatorDetector` -- the random forest (compiled numba inference, JSON + npz model files),
  :func:`load_default_detector` -- the model shipped with Holmes;
* :class:`DriftMonitor`, :class:`AutoTuner` -- drift auto-tuning by shifting split thresholds;
* :class:`ThreeSigmaDetector`, :class:`FeatureBaseline` -- the paper's baselines.
"""

from holmes.detect.baselines import BASELINES, FeatureBaseline, ThreeSigmaDetector
from holmes.detect.context import CONTEXT_FEATURE_NAMES, JobContext
from holmes.detect.detector import DEFAULT_MODEL, OperatorDetector, load_default_detector
from holmes.detect.drift import AutoTuner, DriftMonitor, RetuneRecord
from holmes.detect.features import DRIFT_FEATURES, FEATURE_NAMES, operator_features
from holmes.detect.forest import CompiledForest
from holmes.detect.model_io import load_model, save_model
from holmes.detect.monitor import IterationMonitor, classify_episode, episodes, irregular_iterations
from holmes.detect.training import job_dataset, jobs_dataset, rank_dataset

__all__ = [
    "IterationMonitor", "irregular_iterations", "classify_episode", "episodes",
    "FEATURE_NAMES", "DRIFT_FEATURES", "operator_features", "JobContext", "CONTEXT_FEATURE_NAMES",
    "OperatorDetector", "load_default_detector", "DEFAULT_MODEL", "CompiledForest", "save_model", "load_model",
    "DriftMonitor", "AutoTuner", "RetuneRecord",
    "ThreeSigmaDetector", "FeatureBaseline", "BASELINES",
    "rank_dataset", "job_dataset", "jobs_dataset",
]
