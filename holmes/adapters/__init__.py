"""Converters from traces users already capture to CommOps job directories.

=================== ====================================== =====================================
format              SRC                                    function
=================== ====================================== =====================================
``kineto``          PyTorch profiler JSON(.gz), file/dir   :func:`convert_kineto`
``flight-recorder`` directory of per-rank FR dumps         :func:`convert_flight_recorder`
``wia``             what-if-analysis parquet (+ meta yaml) :func:`convert_wia`
``nccl-inspector``  NCCL Inspector JSONL file or directory :func:`convert_nccl_inspector`
=================== ====================================== =====================================

Each converter validates its input (:class:`~holmes.errors.ParseError` /
:class:`~holmes.errors.ConvertError` naming the file), warns through :class:`ConvertWarning` and
logging when it has to guess, and records what it inferred in ``job.json``'s ``source`` entry.
See ``docs/converters.md``.

Examples
--------
>>> from holmes.adapters import FORMATS, normalize_op
>>> sorted(FORMATS)
['flight-recorder', 'kineto', 'nccl-inspector', 'wia']
>>> normalize_op("nccl:_reduce_scatter_base")
'reduce_scatter'
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from holmes.adapters.notes import ConvertWarning
from holmes.adapters.opnames import normalize_op
from holmes.adapters.flight_recorder import convert_flight_recorder
from holmes.adapters.kineto import convert_kineto
from holmes.adapters.nccl_inspector import convert_nccl_inspector
from holmes.adapters.safe_pickle import SafeUnpickler, safe_load, safe_loads
from holmes.adapters.wia import convert_wia
from holmes.errors import ArgumentTypeError, ConfigError

__all__ = ["convert", "FORMATS", "ConvertWarning", "convert_kineto", "convert_flight_recorder", "convert_wia",
           "convert_nccl_inspector", "normalize_op", "SafeUnpickler", "safe_load", "safe_loads"]

FORMATS: dict[str, Callable[..., Path]] = {
    "kineto": convert_kineto,
    "flight-recorder": convert_flight_recorder,
    "wia": convert_wia,
    "nccl-inspector": convert_nccl_inspector,
}


def convert(fmt: str, src: str | os.PathLike[str], out: str | os.PathLike[str], *, overwrite: bool = False,
            progress: Any = None, **options: Any) -> Path:
    """Convert ``src`` in format ``fmt`` to the job directory ``out``; see :data:`FORMATS`
    (``progress``: an optional progress factory over the files read and ranks written,
    :mod:`holmes.progress`).

    Raises
    ------
    ConfigError
        Unknown format.
    """
    if not isinstance(fmt, str):
        raise ArgumentTypeError(f"format must be a string such as 'kineto', not {type(fmt).__name__}")
    key = fmt.strip().lower().replace("_", "-")
    aliases = {"fr": "flight-recorder", "flightrecorder": "flight-recorder", "inspector": "nccl-inspector",
               "torch-profiler": "kineto", "pytorch-profiler": "kineto"}
    key = aliases.get(key, key)
    if key not in FORMATS:
        raise ConfigError(f"unknown trace format '{fmt}'; expected one of {sorted(FORMATS)}")
    if "world_size" in options and options["world_size"] is not None:
        from holmes.limits import check_world_size

        check_world_size(options["world_size"], "world_size")
    try:
        return FORMATS[key](src, out, overwrite=overwrite, progress=progress, **options)
    except TypeError as exc:  # an unknown option for this format
        if "unexpected keyword argument" in str(exc):
            raise ArgumentTypeError(f"convert --from {key}: {exc}") from None
        raise
