"""Saving and loading detector models without executing code.

A model is two files side by side: ``NAME.json`` (format id, feature names, parameters, drift
reference statistics, retune history, the sha256 of the arrays file) and ``NAME.npz`` (the flat
forest arrays of :class:`~holmes.detect.forest.CompiledForest`, read with ``allow_pickle=False``).
Never pickle or joblib: loading a model cannot run code. Anything malformed raises
:class:`holmes.errors.ModelFormatError` naming the file.

Examples
--------
>>> import tempfile, numpy as np
>>> cf = CompiledForest(np.array([0, 0, 0], np.int32), np.array([1.0, 0, 0]),
...                     np.array([1, -1, -1], np.int32), np.array([2, -1, -1], np.int32),
...                     np.array([0, 0.0, 1.0]), np.array([0], np.int32), 1)
>>> p = save_model(tempfile.mkdtemp() + "/m", cf, {"feature_names": ["x"]})
>>> forest, meta = load_model(p)
>>> forest.threshold.tolist(), meta["feature_names"]
([1.0, 0.0, 0.0], ['x'])
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from holmes.detect.forest import CompiledForest
from holmes.errors import ModelFormatError

__all__ = ["MODEL_FORMAT", "save_model", "load_model", "model_paths"]

MODEL_FORMAT = "holmes.detector/1"
_ARRAYS = {"feature": np.int32, "threshold": np.float64, "left": np.int32, "right": np.int32,
           "leaf_value": np.float64, "roots": np.int32}


def model_paths(path: str | os.PathLike[str]) -> tuple[Path, Path]:
    """``(NAME.json, NAME.npz)`` for ``NAME``, ``NAME.json`` or ``NAME.npz``."""
    p = Path(path)
    if p.suffix in (".json", ".npz"):
        p = p.with_suffix("")
    return p.with_name(p.name + ".json"), p.with_name(p.name + ".npz")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_model(path: str | os.PathLike[str], forest: CompiledForest, meta: dict[str, Any]) -> Path:
    """Write ``forest`` and JSON-able ``meta``; returns the ``.json`` path."""
    js, npz = model_paths(path)
    js.parent.mkdir(parents=True, exist_ok=True)
    arrays = {k: np.ascontiguousarray(getattr(forest, k), dtype=t) for k, t in _ARRAYS.items()}
    tmp = npz.with_name(npz.name + ".tmp.npz")
    np.savez_compressed(tmp, **arrays)
    os.replace(tmp, npz)
    doc = dict(meta)
    doc.update({"format": MODEL_FORMAT, "arrays": npz.name, "arrays_sha256": _sha256(npz),
                "n_features": int(forest.n_features), "n_trees": int(forest.n_trees),
                "n_nodes": int(forest.n_nodes)})
    tmpj = js.with_name(js.name + ".tmp")
    tmpj.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmpj, js)
    return js


def load_model(path: str | os.PathLike[str]) -> tuple[CompiledForest, dict[str, Any]]:
    """Read a model written by :func:`save_model`; returns ``(forest, meta)``.

    Raises
    ------
    ModelFormatError
        A file is missing, not JSON / not an npz, of another format version, its arrays do not
        match the recorded checksum, or the trees are structurally invalid.
    """
    js, npz = model_paths(path)
    if not js.is_file():
        raise ModelFormatError(f"{js}: model file not found")
    from holmes.limits import read_json_capped

    doc = read_json_capped(js, error=ModelFormatError, what="model description")
    if not isinstance(doc, dict) or doc.get("format") != MODEL_FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise ModelFormatError(f"{js}: format is {got!r}, expected {MODEL_FORMAT!r}")
    name = doc.get("arrays")
    if not isinstance(name, str) or "/" in name or "\\" in name or name in ("", ".", ".."):
        raise ModelFormatError(f"{js}: key 'arrays' must name the .npz file next to it")
    npz = js.with_name(name)
    if not npz.is_file():
        raise ModelFormatError(f"{npz}: model arrays file not found")
    want = doc.get("arrays_sha256")
    if want is not None and want != _sha256(npz):
        raise ModelFormatError(f"{npz}: checksum differs from the one in {js.name} (corrupted or replaced)")
    try:
        with np.load(npz, allow_pickle=False) as z:
            arrays = {k: z[k] for k in _ARRAYS if k in z.files}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
        raise ModelFormatError(f"{npz}: not a readable npz of arrays ({exc})") from None
    missing = [k for k in _ARRAYS if k not in arrays]
    if missing:
        raise ModelFormatError(f"{npz}: missing array(s) {missing}")
    for k, t in _ARRAYS.items():
        a = arrays[k]
        if a.dtype.kind != np.dtype(t).kind:
            raise ModelFormatError(f"{npz}: array '{k}' has dtype {a.dtype}, expected {np.dtype(t)}")
        arrays[k] = np.ascontiguousarray(a, dtype=t)
    try:
        nf = int(doc["n_features"])
    except (KeyError, TypeError, ValueError):
        raise ModelFormatError(f"{js}: key 'n_features' missing or not an integer") from None
    forest = CompiledForest(arrays["feature"], arrays["threshold"], arrays["left"], arrays["right"],
                            arrays["leaf_value"], arrays["roots"], nf)
    forest.validate(str(npz))
    names = doc.get("feature_names")
    if names is not None and (not isinstance(names, list) or len(names) != nf):
        raise ModelFormatError(f"{js}: 'feature_names' must list {nf} names")
    return forest, doc
