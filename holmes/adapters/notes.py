"""What a converter inferred, guessed or dropped: :class:`Notes`, which becomes ``job.json``'s
``source`` entry, and :class:`ConvertWarning`."""

from __future__ import annotations

import logging
import warnings
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from holmes.io import SourceInfo

__all__ = ["ConvertWarning", "Notes"]

log = logging.getLogger(__name__)


class ConvertWarning(UserWarning):
    """A converter had to guess, drop or approximate something; the job says what in ``job.json``."""


@dataclass
class Notes:
    """What a converter inferred and warned about; becomes ``job.json``'s ``source`` entry."""

    format: str
    path: str | None = None
    inferred: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    skipped: Counter = field(default_factory=Counter)

    def infer(self, msg: str) -> None:
        """Record something the converter inferred (logged at INFO)."""
        if msg not in self.inferred:
            self.inferred.append(msg)
            log.info("%s: %s", self.format, msg)

    def warn(self, msg: str) -> None:
        """Record a guess or a loss: a :class:`ConvertWarning`, a log line and a ``warnings[]`` entry."""
        if msg in self.warnings:
            return
        self.warnings.append(msg)
        log.warning("%s: %s", self.format, msg)
        warnings.warn(msg, ConvertWarning, stacklevel=3)

    def unknown_field(self, what: str, key: Any, where: str) -> None:
        """Warn once per ``(what, key)`` that an input field is not known and was ignored.

        ``what`` says where the field sits (e.g. ``"top-level trace key"``), ``where`` is the
        first file it was seen in; the keys are listed in ``details.unknown_fields[what]``.
        """
        k = str(key)
        lst = self.details.setdefault("unknown_fields", {}).setdefault(what, [])
        if k in lst:
            return
        lst.append(k)
        lst.sort()
        self.warn(f"{where}: unknown {what} {k!r} ignored")

    def malformed(self, where: str, what: str) -> None:
        """Count a record dropped because a field has the wrong type or value.

        ``where`` names the file, ``what`` the record and the field (e.g. ``"event #12
        'record_param_comms': 'ts' is 'abc', not a number"``). The first one of each file is
        warned about at once; the counts per file go to ``details.malformed_records``.
        """
        counts = self.details.setdefault("malformed_records", {})
        if where not in counts:
            counts[where] = 0
            self.warn(f"{where}: skipped malformed record(s) (counted in details.malformed_records), first: {what}")
        counts[where] += 1

    def skip(self, what: str, n: int = 1) -> None:
        """Count an input record that was not converted (reported once, in :meth:`finish`)."""
        self.skipped[what] += n

    def finish(self) -> SourceInfo:
        if self.skipped:
            total = sum(self.skipped.values())
            top = ", ".join(f"{k} x{v}" for k, v in self.skipped.most_common(10))
            self.warn(f"skipped {total} record(s) that are not supported operators: {top}")
            self.details["skipped"] = dict(self.skipped)
        return SourceInfo(format=self.format, path=self.path, inferred=list(self.inferred),
                          warnings=list(self.warnings), details=_jsonable(self.details))


def _jsonable(x: Any) -> Any:
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    return x
