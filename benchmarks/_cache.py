"""Where the benchmarks keep the jobs they simulate: one directory, bounded in size.

``$HOLMES_CACHE_DIR`` (default ``$XDG_CACHE_HOME/holmes``, i.e. ``~/.cache/holmes``) holds one
subdirectory per benchmark. ``$HOLMES_CACHE_MAX_GB`` (default 12: the realistic 2,048-GPU jobs
of both splits take ~8 GB) bounds the whole: when a benchmark opens its cache, the least
recently written job directories (over every benchmark) are removed until the cache fits.
Removing the directory is always safe: jobs are simulated again.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

DEFAULT_MAX_GB = 12.0


def cache_root() -> Path:
    """``$HOLMES_CACHE_DIR``, else ``$XDG_CACHE_HOME/holmes``, else ``~/.cache/holmes``."""
    env = os.environ.get("HOLMES_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "holmes"


def _size(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total


def prune(root: Path, max_bytes: int) -> int:
    """Remove the oldest job directories (``root/<benchmark>/<job>``, by modification time) until
    ``root`` holds at most ``max_bytes``; returns the bytes freed."""
    if not root.is_dir():
        return 0
    entries = [(e.stat().st_mtime, e, _size(e)) for b in root.iterdir() if b.is_dir()
               for e in b.iterdir() if e.is_dir()]
    total = sum(s for _, _, s in entries)
    freed = 0
    for _, e, s in sorted(entries, key=lambda x: x[0]):
        if total - freed <= max_bytes:
            break
        shutil.rmtree(e, ignore_errors=True)
        freed += s
    return freed


def smoke_dir(name: str) -> Path:
    """A fresh temporary directory for a ``--smoke`` run of benchmark ``name``, removed at exit.

    Smokes never reuse cached jobs: a job simulated by an older version would hide a break.
    """
    path = Path(tempfile.mkdtemp(prefix=f"holmes-smoke-{name}-"))
    atexit.register(shutil.rmtree, path, True)
    return path


def cache_dir(name: str) -> Path:
    """The cache directory of benchmark ``name`` (created), after bounding the whole cache."""
    root = cache_root()
    try:
        max_gb = float(os.environ.get("HOLMES_CACHE_MAX_GB", DEFAULT_MAX_GB))
    except ValueError:
        max_gb = DEFAULT_MAX_GB
    freed = prune(root, int(max_gb * 1e9))
    if freed:
        print(f"# cache {root}: removed {freed / 1e9:.1f} GB of old jobs (HOLMES_CACHE_MAX_GB={max_gb:g})",
              file=sys.stderr)
    path = root / name
    path.mkdir(parents=True, exist_ok=True)
    return path
