"""The CommOps logger: capture a training job's communication operators as a Holmes job directory.

Install the extra ``holmes[torch]`` to hook PyTorch. ``import holmes.logger`` does not import
PyTorch; :meth:`CommOpsLogger.enable` does.

* :class:`CommOpsRecorder` (framework-free): bounded buffer, ``seq``/``op_index`` numbering,
  periodic flush to ``ranks/rank-XXXXX.parquet``, step marks to ``iterations/``.
* :class:`CommOpsLogger` / :func:`enable`: wraps ``torch.distributed`` collectives and P2P, and
  registers kernels for the dispatcher's ``c10d`` operators (what bypasses the namespace: DDP's
  reducer, coalesced operators, ``ProcessGroup`` methods; :mod:`holmes.logger._dispatch`), in C++
  for collectives on CPU tensors where a compiler is present (:func:`build_native`).
* :func:`finalize_job`: merges the ranks' communicator sidecars into ``job.json`` and checks the
  capture (:func:`capture_warnings`: what looks missing goes to ``source.warnings``).

See ``docs/logger.md``.
"""

from __future__ import annotations

from holmes.logger._native import build_native
from holmes.logger.checks import capture_warnings
from holmes.logger.finalize import finalize_job
from holmes.logger.recorder import COMMS_DIR, CommOpsRecorder, PendingOp
from holmes.logger.torch_hooks import WRAPPED_FUNCTIONS, CommOpsLogger, active_logger, enable

__all__ = ["CommOpsRecorder", "PendingOp", "CommOpsLogger", "enable", "finalize_job", "active_logger",
           "WRAPPED_FUNCTIONS", "COMMS_DIR", "capture_warnings", "build_native"]
