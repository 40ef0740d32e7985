"""Holmes: find why a large distributed training job is slow, from its communication-operator logs.

The pipeline (see ``DESIGN.md``): per-rank CommOps logs -> iteration monitor on a pivot rank ->
abnormal-operator detector -> communication-operator graph search, fetching only the ranks it
visits -> cross-iteration device ranking -> report.
"""

from __future__ import annotations

import logging

from holmes.errors import (ConfigError, ConvertError, HolmesError, JobError, LayoutError, MissingRankError,
                           ModelFormatError, NotFittedError, ParseError, SchemaError, TopologyError)
from holmes.io import Job, JobMeta, JobWriter, MemoryJob, read_job, write_job

__version__ = "0.1.0"

logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "__version__",
    "HolmesError", "SchemaError", "ParseError", "JobError", "MissingRankError", "TopologyError",
    "LayoutError", "ConfigError", "NotFittedError", "ModelFormatError", "ConvertError",
    "Job", "JobMeta", "JobWriter", "MemoryJob", "read_job", "write_job",
    "localize", "simulate",
]


def __getattr__(name: str):  # lazy: keep ``import holmes`` light
    if name == "localize":
        from holmes.localize import localize

        return localize
    if name == "simulate":
        from holmes.simulate import simulate

        return simulate
    raise AttributeError(f"module 'holmes' has no attribute {name!r}")
