"""The exception hierarchy of Holmes.

Every error Holmes raises on bad input derives from :class:`HolmesError` and names what is at
fault (file, rank, column) in its message, so a command-line caller can print it on one line.

Errors about bad values (a schema, a file, a parameter) also derive from :class:`ValueError`, so
``except ValueError`` catches them as it would for any library:

>>> from holmes.errors import ConfigError
>>> issubclass(ConfigError, ValueError)
True
"""

from __future__ import annotations

__all__ = [
    "HolmesError",
    "SchemaError",
    "ParseError",
    "JobError",
    "MissingRankError",
    "TopologyError",
    "LayoutError",
    "ConfigError",
    "ThresholdsError",
    "NotFittedError",
    "ModelFormatError",
    "ConvertError",
    "ArgumentTypeError",
    "InconsistentLogError",
]


class HolmesError(Exception):
    """Base class of every error Holmes raises on bad input or misuse."""


class SchemaError(HolmesError, ValueError):
    """A table does not follow CommOps schema v1 (missing column, wrong type, bad value)."""


class ParseError(HolmesError, ValueError):
    """A file could not be read at all: empty, truncated, not the format it claims to be."""


class JobError(HolmesError, ValueError):
    """A job directory is inconsistent (bad job.json, unknown comm_id, rank outside world_size)."""


class MissingRankError(JobError):
    """A rank's log file is absent from the job directory."""


class TopologyError(HolmesError, ValueError):
    """A cluster topology is malformed or a device id is unknown."""


class LayoutError(HolmesError, ValueError):
    """Parallel degrees or an order string do not describe a valid layout."""


class ConfigError(HolmesError, ValueError):
    """An argument, option or configuration file has an invalid value."""


class ThresholdsError(ConfigError):
    """A thresholds file (:mod:`holmes.calibration.thresholds`) is unreadable or names a bad value."""


class NotFittedError(HolmesError, ValueError):
    """An estimator was used before ``fit``."""


class ModelFormatError(HolmesError, ValueError):
    """A saved detector model is malformed or of an unsupported version."""


class ConvertError(HolmesError, ValueError):
    """A converter could not turn a captured trace into a CommOps job."""


class ArgumentTypeError(ConfigError, TypeError):
    """An argument of a public function has the wrong type (a ``TypeError`` and a ``ValueError``)."""


class InconsistentLogError(SchemaError):
    """A rank's log contradicts itself or the job (ops ending before they start, duplicated rows,
    a peer outside the world, a rank writing on a communicator it is not a member of...) beyond
    what can be excluded and reported as an assumption."""
