"""Non-destructive outputs: every file or job directory Holmes writes goes through this module.

Three rules, shared by ``simulate``, ``convert``, ``detect --out``, ``train --out``, the logger's
finalize and any future writer (``report -o``):

1. **Write beside, rename into place.** A file is written to a temporary sibling and renamed over
   the target (:func:`atomic_file`, :func:`atomic_write_bytes`, :func:`atomic_write_text`); a job
   directory is built in a temporary sibling directory and swapped in whole
   (:func:`staged_directory`), ``job.json`` written last. An interrupted write leaves the old
   output intact (or nothing) and at most a ``.holmes-tmp-*`` sibling, never a half-new job.
2. **Refuse an existing output** unless ``overwrite`` is set (:func:`check_output`); a directory is
   only replaced when Holmes wrote it (:func:`is_job_dir`): its ``job.json`` carries the CommOps
   schema id and it holds nothing but a job's own entries -- or it holds no file at all. A
   directory with anything else in it (a user's notes beside a ``job.json``) is refused.
3. **Refuse an output inside an input** (or an input inside the output), always, overwrite or not.
4. **The umask's permissions.** Files and directories get what the user's umask gives (0644 /
   0755 under umask 022), not a temporary file's 0600 / 0700 (:func:`make_temp_file`,
   :func:`make_temp_dir`).

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
import re
import shutil
import sys
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from holmes.errors import ArgumentTypeError, ConfigError

__all__ = ["OutputError", "OutputExistsError", "OutputInsideInputError", "check_output", "atomic_file",
           "atomic_write_bytes", "atomic_write_text", "staged_directory", "is_job_dir", "not_a_job_reason",
           "make_temp_file", "make_temp_dir", "current_umask", "JOB_FILES", "JOB_DIRS", "TMP_PREFIX"]

log = logging.getLogger(__name__)

#: Prefix of the temporary siblings this module creates (safe to delete when no write is running).
TMP_PREFIX = ".holmes-tmp-"


class OutputError(ConfigError):
    """An output path cannot be written without destroying something."""


class OutputExistsError(OutputError):
    """The output exists and ``overwrite`` was not given."""


class OutputInsideInputError(OutputError):
    """The output lies inside an input (or contains one)."""


def as_path(p: Any, what: str = "output path") -> Path:
    """``p`` as a :class:`~pathlib.Path`: a ``str``, an ``os.PathLike`` or ``bytes`` (decoded as
    the file system does); anything else, or a path holding a NUL byte, is a :class:`ConfigError`."""
    if isinstance(p, (bytes, bytearray)):
        p = os.fsdecode(bytes(p))
    if not isinstance(p, (str, os.PathLike)):
        raise ArgumentTypeError(f"{what} must be a str or os.PathLike, not {type(p).__name__}")
    q = os.fspath(p)
    if isinstance(q, bytes):
        q = os.fsdecode(q)
    if not q.strip():
        raise OutputError(f"no {what} given")
    if "\x00" in q:
        raise OutputError(f"{q!r}: a path cannot hold a NUL byte")
    return Path(q)


def _resolve(p: str | os.PathLike[str]) -> Path:
    try:
        return Path(os.path.realpath(os.path.abspath(os.fspath(p))))
    except (OSError, ValueError) as exc:  # pragma: no cover - realpath rarely fails
        raise OutputError(f"{p}: cannot resolve path: {exc}") from None


#: Files a job directory Holmes wrote may hold at its top level: the job directory of docs/formats.md, an
#: evaluation run's ``realrun.json`` and a scenario's ``cost.json``.
JOB_FILES = frozenset({"job.json", "topology.json", "truth.json", "realrun.json", "cost.json"})
#: Folders a job directory Holmes wrote may hold (``comms/``: the logger's communicator sidecars).
JOB_DIRS = frozenset({"ranks", "iterations", "compute", "comms"})
#: What those folders hold: ``rank-00042.parquet``, a live rank's ``rank-00042/`` of parts, a sidecar.
_RANK_ENTRY = re.compile(r"rank-\d+(?:\.parquet|\.json)?")
_PART_ENTRY = re.compile(r"part-\d+\.parquet")
_SCHEMA = "holmes.commops/1"


def _scratch(name: str) -> bool:
    """A temporary sibling a Holmes writer leaves when interrupted (``.holmes-tmp-*``, ``.*.partial``)."""
    return name.startswith(TMP_PREFIX) or (name.startswith(".") and name.endswith(".partial"))


def _foreign_entry(p: Path) -> tuple[str | None, int]:
    """The first entry under job directory ``p`` no Holmes writer makes (None if none), and the
    number of files found. Never follows a link: Holmes writes none, so a link is foreign."""
    files = 0
    with os.scandir(p) as it:
        top = list(it)
    for e in top:
        if _scratch(e.name):
            continue
        if e.is_symlink():
            return e.name, files
        if e.name in JOB_FILES and e.is_file(follow_symlinks=False):
            files += 1
            continue
        if e.name not in JOB_DIRS or not e.is_dir(follow_symlinks=False):
            return e.name, files
        with os.scandir(e.path) as it:
            subs = list(it)
        for s in subs:
            if _scratch(s.name):
                continue
            if s.is_symlink() or not _RANK_ENTRY.fullmatch(s.name):
                return f"{e.name}/{s.name}", files
            if s.is_file(follow_symlinks=False):
                files += 1
                continue
            if not s.is_dir(follow_symlinks=False):
                return f"{e.name}/{s.name}", files
            with os.scandir(s.path) as it:  # a live rank's parts
                for q in it:
                    if _scratch(q.name):
                        continue
                    if q.is_symlink() or not q.is_file(follow_symlinks=False) or not _PART_ENTRY.fullmatch(q.name):
                        return f"{e.name}/{s.name}/{q.name}", files
                    files += 1
    return None, files


def _holmes_job_json(path: Path) -> bool:
    """True when ``path`` is a regular file of JSON whose ``schema`` is Holmes's CommOps id."""
    from holmes.errors import HolmesError
    from holmes.limits import read_json_capped

    try:
        doc = read_json_capped(path, what="job.json")
    except HolmesError:
        return False
    return isinstance(doc, dict) and doc.get("schema") == _SCHEMA


def not_a_job_reason(p: str | os.PathLike[str]) -> str | None:
    """Why ``p`` is not a directory Holmes wrote (None when it is one, and may be replaced).

    A directory Holmes wrote holds only a job's own entries -- ``job.json``, ``topology.json``,
    ``truth.json``, ``realrun.json``, ``cost.json``, and ``ranks/``, ``iterations/``, ``compute/``,
    ``comms/`` holding ``rank-*`` files or part folders (plus the ``.holmes-tmp-*`` / ``.*.partial``
    scratch an interrupted writer leaves) -- and its ``job.json`` carries ``"schema":
    "holmes.commops/1"``. A directory holding no file at all (only empty folders of those names)
    loses nothing when replaced and is accepted too.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "job.json").write_text('{"schema": "holmes.commops/1", "world_size": 1}')
    >>> not_a_job_reason(d) is None
    True
    >>> _ = (d / "notes.txt").write_text("mine")
    >>> not_a_job_reason(d)
    'it holds notes.txt, which Holmes does not write'
    """
    q = Path(p)
    try:
        if q.is_symlink() or not q.is_dir():
            return "it is not a directory"
        foreign, files = _foreign_entry(q)
    except OSError as exc:
        return f"it cannot be listed ({exc.strerror or exc})"
    if foreign is not None:
        return f"it holds {foreign}, which Holmes does not write"
    if files and not _holmes_job_json(q / "job.json"):
        return f'its job.json is missing or lacks "schema": "{_SCHEMA}"'
    return None


def is_job_dir(p: str | os.PathLike[str]) -> bool:
    """True when ``p`` is a directory Holmes wrote (see :func:`not_a_job_reason`): safe to replace."""
    return not_a_job_reason(p) is None


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
    if out is None:
        raise OutputError("no output path given")
    p = as_path(out)
    rp = _resolve(p)
    for src in inputs:
        if src is None:
            continue
        rs = _resolve(as_path(src, "input path"))
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
            why = not_a_job_reason(p) if entries else None
            if why is not None:
                raise OutputError(f"{p}: output directory is not a job directory Holmes wrote ({why}); "
                                  "refusing to replace it")
    return p


def current_umask() -> int:
    """The process umask, read without changing it where Linux says it (``/proc/self/status``)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)  # elsewhere: set and restore (the only way POSIX offers)
    os.umask(old)
    return old


def _tmp_prefix(name: str) -> str:
    """``.holmes-tmp-NAME.``, NAME cut so that the temporary name stays under the file system's
    255-byte limit whatever the output's own name."""
    return f"{TMP_PREFIX}{name[:100]}."


def make_temp_file(directory: str | os.PathLike[str], prefix: str, suffix: str = "") -> Path:
    """Create an empty temporary file in ``directory`` with the umask's permissions (not 0600)."""
    fd, name = tempfile.mkstemp(dir=directory, prefix=prefix, suffix=suffix)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
    finally:
        os.close(fd)
    return Path(name)


def make_temp_dir(directory: str | os.PathLike[str], prefix: str) -> Path:
    """Create a temporary directory in ``directory`` with the umask's permissions (not 0700)."""
    d = Path(tempfile.mkdtemp(dir=directory, prefix=prefix))
    os.chmod(d, 0o777 & ~current_umask())
    return d


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
    parent = _resolve(p).parent  # ``missing/../r.html``: the directory the checks saw
    try:
        tmp = make_temp_file(parent, _tmp_prefix(p.name), sfx[:16])
    except OSError as exc:
        raise OutputError(f"{p}: cannot write in {parent}: {exc.strerror or exc}") from None
    try:
        yield tmp
        if not overwrite and os.path.lexists(p):
            raise OutputExistsError(f"{p}: output appeared while it was being written; not replacing it")
        try:
            os.replace(tmp, p)
        except OSError as exc:
            raise OutputError(f"{p}: cannot write: {exc.strerror or exc}") from None
    finally:
        if tmp.exists():
            with contextlib.suppress(OSError):
                tmp.unlink()


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, overwrite: bool = False,
                       inputs: Iterable[str | os.PathLike[str]] = ()) -> Path:
    """Write ``data`` to ``path`` through a temporary sibling (see :func:`atomic_file`)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ArgumentTypeError(f"data must be bytes, not {type(data).__name__}")
    with atomic_file(path, overwrite=overwrite, inputs=inputs) as tmp:
        try:
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:  # a full disk, a quota: named on the user's path, not the temporary one
            raise OutputError(f"{as_path(path)}: cannot write: {exc.strerror or exc}") from None
    return as_path(path)


def atomic_write_text(path: str | os.PathLike[str], text: str, *, overwrite: bool = False,
                      inputs: Iterable[str | os.PathLike[str]] = ()) -> Path:
    """Write UTF-8 ``text`` to ``path`` through a temporary sibling (see :func:`atomic_file`)."""
    if not isinstance(text, str):
        raise ArgumentTypeError(f"text must be a str, not {type(text).__name__}")
    return atomic_write_bytes(path, text.encode("utf-8"), overwrite=overwrite, inputs=inputs)


def replace_file_text(path: Path, text: str) -> None:
    """Write ``text`` over ``path`` through a temporary sibling, without the existence checks.

    For files inside a directory this process is building or owns (``job.json`` in a staging
    directory, a logger's own job directory).
    """
    tmp = make_temp_file(path.parent, _tmp_prefix(path.name))
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
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
    tmp = make_temp_dir(rp.parent, _tmp_prefix(rp.name))
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
    why = not_a_job_reason(target)  # checked again: the write may have taken minutes
    if why is not None:
        raise OutputError(f"{target}: output directory is not a job directory Holmes wrote ({why}); "
                          "refusing to replace it")
    if _exchange(tmp, target):  # one atomic step: no instant without a job at ``target``
        shutil.rmtree(tmp, ignore_errors=True)  # now the old job
        return
    old = Path(tempfile.mkdtemp(dir=target.parent, prefix=_tmp_prefix(target.name) + "old."))
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
