"""Holmes: find why a large distributed training job is slow, from its communication-operator logs.

The pipeline (see ``docs/ARCHITECTURE.md``): per-rank CommOps logs -> iteration monitor on a pivot rank ->
abnormal-operator detector -> communication-operator graph search, fetching only the ranks it
visits -> cross-iteration device ranking -> report with a verdict.

The simulator is the subpackage :mod:`holmes.simulate` (``from holmes.simulate import simulate``).
"""

from __future__ import annotations

import logging

from holmes.errors import (ConfigError, ConvertError, HolmesError, JobError, LayoutError, MissingRankError,
                           ModelFormatError, NotFittedError, ParseError, SchemaError, TopologyError)
from holmes.io import Job, JobMeta, JobWriter, MemoryJob, read_job, write_job

# ``holmes.localize`` is the front-door function (the subpackage stays importable as a package:
# ``from holmes.localize import GraphSearch``). Binding it after the subpackage import replaces the
# attribute Python set to the module.
from holmes.localize import Localizer, LocalizeParams, localize  # noqa: E402  (after io: no cycle)
from holmes.watch import watch  # noqa: E402  (the function; the subpackage stays importable)

__version__ = "0.1.0"

logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "__version__",
    "HolmesError", "SchemaError", "ParseError", "JobError", "MissingRankError", "TopologyError",
    "LayoutError", "ConfigError", "NotFittedError", "ModelFormatError", "ConvertError",
    "Job", "JobMeta", "JobWriter", "MemoryJob", "read_job", "write_job",
    "localize", "Localizer", "LocalizeParams", "watch",
]
