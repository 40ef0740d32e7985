"""Non-destructive outputs: every file or job directory Holmes writes goes through this module.

Three rules, shared by ``simulate``, ``convert``, ``detect --out``, ``train --out``, the logger's
finalize and any future writer (``report -o``):

1. **Write beside, rename into place.** A file is written to a temporary sibling and renamed over
   the target (:func:`atomic_file`, :func:`atomic_write_bytes`, :func:`atomic_write_text`); a job
   directory is built in a temporary sibling directory and swapped in whole
   (:func:`staged_directory`), ``job.json`` written last. An interrupted write leaves the old
   output intact (or nothing) and at most a ``.holmes-tmp-*`` sibling, never a half-new job.
2. **Refuse an existing output** unless ``overwrite`` is set (:func:`check_output`); a directory is
   only replaced when it is empty or a job (it holds ``job.json`` or ``ranks/``).
3. **Refuse an output inside an input** (or an input inside the output), always, overwrite or not.

Examples
--------
>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> atomic_write_text(d / "a.txt", "one")  # doctest: +ELLIPSIS
PosixPath('...a.txt')
>>> atomic_write_text(d / "a.txt", "two")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
holmes.io.outputs.OutputExistsError: .../a.txt: output exists (pass --overwrite / overwrite=True to replace it)
>>> check_output(d / "job" / "x.parquet", inputs=[d / "job"])  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
holmes.io.outputs.OutputInsideInputError: .../job/x.parquet: output lies inside the input .../job; refusing to write there
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from holmes.errors import ConfigError

__all__ = ["OutputError", "OutputExistsError", "OutputInsideInputError", "check_output", "atomic_file",
           "atomic_write_bytes", "atomic_write_text", "staged_directory", "is_job_dir", "TMP_PREFIX"]

log = logging.getLogger(__name__)

#: Prefix of the temporary siblings this module creates (safe to delete when no write is running).
TMP_PREFIX = ".holmes-tmp-"


class OutputError(ConfigError):
    """An output path cannot be written without destroying something."""


class OutputExistsError(OutputError):
    """The output exists and ``overwrite`` was not given."""


class OutputInsideInputError(OutputError):
    """The output lies inside an input (or contains one)."""


def _resolve(p: str | os.PathLike[str]) -> Path:
    try:
        return Path(os.path.realpath(os.path.abspath(os.fspath(p))))
    except (OSError, ValueError) as exc:  # pragma: no cover - realpath rarely fails
        raise OutputError(f"{p}: cannot resolve path: {exc}") from None


def is_job_dir(p: str | os.PathLike[str]) -> bool:
    """True when ``p`` is a directory holding ``job.json`` or ``ranks/`` (a CommOps job)."""
    q = Path(p)
    try:
        return q.is_dir() and ((q / "job.json").exists() or (q / "ranks").is_dir())
    except OSError:
        return False


def _within(child: Path, parent: Path) -> bool:
    return child == parent or parent in child.parents


def check_output(out: str | os.PathLike[str], *, inputs: Iterable[str | os.PathLike[str]] = (),
                 overwrite: bool = False, kind: str = "file") -> Path:
    """Refuse an output that would destroy something; returns ``out`` as a Path.

    Parameters
    ----------
    out : path-like
        The file or directory about to be written.
    inputs : iterable of path-like
        What the command reads (job directories, trace files or directories). ``out`` may not lie
        inside one of them, be one of them, or contain one of them -- whatever ``overwrite`` says.
    overwrite : bool
        Allow replacing an existing output (a file by a file; an empty or job directory by a job).
    kind : {"file", "job"}
        What ``out`` will be.

    Raises
    ------
    OutputInsideInputError, OutputExistsError, OutputError
        All subclasses of :class:`holmes.errors.ConfigError` (a ``ValueError``).
    """
    if kind not in ("file", "job"):
        raise ValueError(f"kind must be 'file' or 'job', not {kind!r}")
    if out is None or (isinstance(out, str) and not out.strip()):
        raise OutputError("no output path given")
    p = Path(out)
    rp = _resolve(p)
    for src in inputs:
        if src is None:
            continue
        rs = _resolve(src)
        if _within(rp, rs):
            raise OutputInsideInputError(f"{p}: output lies inside the input {src}; refusing to write there")
        if _within(rs, rp):
            raise OutputInsideInputError(f"{p}: output contains the input {src}; refusing to replace it")
    # an output inside any job directory (an input or not) would change that job
    for anc in rp.parents:  # (a job.json marks a job here: a stray ranks/ folder in $HOME must not block everything)
        if (anc / "job.json").is_file() and (kind == "file" or anc != rp):
            raise OutputInsideInputError(f"{p}: output lies inside the job directory {anc}; refusing to write there")
    parent = rp.parent
    if kind == "file" and not parent.is_dir():
        raise OutputError(f"{p}: directory {parent} does not exist")
    if kind == "job" and parent.exists() and not parent.is_dir():
        raise OutputError(f"{p}: {parent} is not a directory")
    if os.path.lexists(p):
        if kind == "file":
            if p.is_dir():
                raise OutputError(f"{p}: output is a directory, expected a file path")
            if not overwrite:
                raise OutputExistsError(f"{p}: output exists (pass --overwrite / overwrite=True to replace it)")
            if not p.is_file():
                raise OutputError(f"{p}: output exists and is not a regular file; refusing to replace it")
        else:
            if not p.is_dir():
                raise OutputError(f"{p}: output exists and is not a directory")
            try:
                entries = os.listdir(p)
            except OSError as exc:
                raise OutputError(f"{p}: cannot list output directory: {exc.strerror or exc}") from None
            if entries and not overwrite:
                raise OutputExistsError(f"{p}: output directory is not empty (pass --overwrite / overwrite=True "
                                        "to replace a job)")
            if entries and not is_job_dir(p):
                raise OutputError(f"{p}: output directory is not a job directory (it holds something else); refusing to replace it")
    return p


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str], *, overwrite: bool = False,
                inputs: Iterable[str | os.PathLike[str]] = (), suffix: str | None = None) -> Iterator[Path]:
    """Yield a temporary sibling path to write; on success it is renamed over ``path``.

    The target is checked first (:func:`check_output`); on an exception the temporary file is
    removed and ``path`` is untouched. ``suffix`` (default: ``path``'s) lets writers that pick a
    format from the extension (numpy, pyarrow) see the right one.
    """
    p = check_output(path, inputs=inputs, overwrite=overwrite, kind="file")
    sfx = p.suffix if suffix is None else suffix
    fd, tmp_name = tempfile.mkstemp(dir=p.parent, prefix=f"{TMP_PREFIX}{p.name}.", suffix=sfx)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        if not overwrite and os.path.lexists(p):
            raise OutputExistsError(f"{p}: output appeared while it was being written; not replacing it")
        os.replace(tmp, p)
    finally:
        if tmp.exists():
            with contextlib.suppress(OSError):
                tmp.unlink()


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, overwrite: bool = False,
                       inputs: Iterable[str | os.PathLike[str]] = ()) -> Path:
    """Write ``data`` to ``path`` through a temporary sibling (see :func:`atomic_file`)."""
    with atomic_file(path, overwrite=overwrite, inputs=inputs) as tmp:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    return Path(path)


def atomic_write_text(path: str | os.PathLike[str], text: str, *, overwrite: bool = False,
                      inputs: Iterable[str | os.PathLike[str]] = ()) -> Path:
    """Write UTF-8 ``text`` to ``path`` through a temporary sibling (see :func:`atomic_file`)."""
    return atomic_write_bytes(path, text.encode("utf-8"), overwrite=overwrite, inputs=inputs)


def replace_file_text(path: Path, text: str) -> None:
    """Write ``text`` over ``path`` through a temporary sibling, without the existence checks.

    For files inside a directory this process is building or owns (``job.json`` in a staging
    directory, a logger's own job directory).
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{TMP_PREFIX}{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def staged_directory(path: str | os.PathLike[str], *, overwrite: bool = False,
                     inputs: Iterable[str | os.PathLike[str]] = ()) -> Iterator[Path]:
    """Yield an empty temporary sibling directory; on success it replaces ``path`` whole.

    ``path`` is checked first (:func:`check_output` with ``kind="job"``). On success an existing
    ``path`` is renamed aside, the new directory renamed into place and the old one deleted, so
    nothing of the old job survives beside the new one (``--overwrite`` swaps, never merges). On an
    exception the temporary directory is deleted and ``path`` is untouched.
    """
    p = check_output(path, inputs=inputs, overwrite=overwrite, kind="job")
    rp = _resolve(p)
    rp.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=rp.parent, prefix=f"{TMP_PREFIX}{rp.name}."))
    try:
        yield tmp
        _swap_in(tmp, rp, overwrite)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _swap_in(tmp: Path, target: Path, overwrite: bool) -> None:
    if not os.path.lexists(target):
        os.rename(tmp, target)
        return
    if not overwrite:
        try:
            os.rmdir(target)  # an empty directory may be replaced without overwrite
        except OSError:
            raise OutputExistsError(f"{target}: output appeared while it was being written; not replacing it") from None
        os.rename(tmp, target)
        return
    if _exchange(tmp, target):  # one atomic step: no instant without a job at ``target``
        shutil.rmtree(tmp, ignore_errors=True)  # now the old job
        return
    old = Path(tempfile.mkdtemp(dir=target.parent, prefix=f"{TMP_PREFIX}{target.name}.old."))
    os.rmdir(old)
    os.rename(target, old)
    try:
        os.rename(tmp, target)
    except BaseException:
        os.rename(old, target)  # put the old job back
        raise
    shutil.rmtree(old, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2(RENAME_EXCHANGE)``); False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2
    rc = fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange)
    if rc != 0:
        log.debug("renameat2 exchange failed (errno %d); falling back to two renames", ctypes.get_errno())
        return False
    return True
