"""Fuzzing Holmes with bad input: mutated job directories, converter inputs and CLI arguments.

Every case builds a fresh working directory (a small simulated job, or a converter input taken
from ``../shared/data`` / ``tests/data``), applies one to three mutations, runs one ``holmes``
command in-process (``holmes.cli.main.main``) and checks the outcome:

* ``tracebacks``: the command raised out of ``main``, exited with a status other than 0/2, or
  printed more than one stderr line with status 2;
* ``internal_errors``: the CLI's catch-all answered (``internal error: ... please report it``): an
  exception Holmes did not turn into a typed error -- a hidden crash, counted as a failure;
* ``clobbers``: a file of the input changed, or something appeared outside the command's output
  (including a leftover ``.holmes-tmp-*``);
* ``silent_wrong``: a mutation that makes the log inconsistent (ops ending before they start,
  shuffled ``op_index``, duplicated rows, ...) on a rank the command reads, and the command exited
  0 without naming the inconsistency on stdout or stderr;
* ``max_rss_mb``: the peak resident set size of the process (all cases run in one process).

Usage: ``python benchmarks/fuzz.py [--cases 10000] [--seed 0] [--verbose]``; the last line is
``fuzz_cases=<n> tracebacks=<n> internal_errors=<n> clobbers=<n> silent_wrong=<n> max_rss_mb=<MB>``.

The ``rare`` family (issue #39) holds what an outside run found: a rank with no operator in the
window (0 rows, every ``op_index`` 0, two halves of the ranks on disjoint iterations), a rank
truncated to one row, times in microseconds or milliseconds, zero-length operators, an
``abnormal`` label of strings with ``--detector label``, seeds beyond 64 bits, Kineto traces of 24
ranks on a process group of 2, parquet bombs (constant rows, 100k-character communicator ids),
``--topology`` on a FIFO or ``/dev/zero``, and ``--overwrite`` onto directories holding a user's
files beside a ``job.json`` or an empty ``ranks/``. The same machinery
drives ``tests/test_fuzz.py`` (hypothesis picks the cases there).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import hashlib
import io
import json
import os
import pickle
import random
import resource
import shutil
import sys
import tempfile
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
INSPECTOR = REPO / "tests" / "data" / "nccl_inspector"

I64_MIN = int(np.iinfo(np.int64).min)

# keep the caps small so that a gzip bomb or a huge file fails fast and cheaply in the fuzz run
FUZZ_ENV = {"HOLMES_MAX_TRACE_BYTES": str(64 << 20), "HOLMES_MAX_JSON_BYTES": str(8 << 20),
            "HOLMES_MAX_ROWS_PER_RANK": str(1 << 20)}


# ----------------------------------------------------------------------------- base inputs


@dataclass
class Bases:
    """Pristine inputs every case copies: a job and one input per converter format."""

    root: Path
    job: Path = field(init=False)
    model: Path = field(init=False)
    convert_src: dict[str, Path] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from holmes.cli.main import main

        self.job = self.root / "job"
        with _quiet():
            rc = main(["simulate", "--out", str(self.job), "--tp", "2", "--pp", "2", "--dp", "1", "--iterations", "6",
                       "--micro-batches", "2", "--quiet", "--fault", "gpu:1@persistent*3"])
        assert rc == 0, "could not simulate the base job"
        self.model = self.root / "model"
        from holmes.detect import load_default_detector

        load_default_detector().save(self.model)
        kin = DATA / "kineto" / "nccl_data.json.gz"
        if kin.is_file():
            d = json.load(gzip.open(kin, "rt"))
            evs = d["traceEvents"]
            keep = [e for e in evs if e.get("name") == "record_param_comms"][:60]
            keep += [e for e in evs if e.get("cat") == "kernel" and "nccl" in str(e.get("name", "")).lower()][:60]
            d["traceEvents"] = keep
            p = self.root / "kineto" / "rank0.json"
            p.parent.mkdir()
            p.write_text(json.dumps(d))
            self.convert_src["kineto"] = p
        fr = DATA / "flight_recorder" / "gpu_error_1st"
        if fr.is_dir():
            dst = self.root / "fr"
            shutil.copytree(fr, dst)
            for f in dst.iterdir():
                f.chmod(0o644)
            dst.chmod(0o755)
            self.convert_src["flight-recorder"] = dst
        if INSPECTOR.is_dir():
            dst = self.root / "inspector"
            shutil.copytree(INSPECTOR, dst)
            self.convert_src["nccl-inspector"] = dst
        wia = DATA / "wia"
        if wia.is_dir():
            dst = self.root / "wia"
            dst.mkdir()
            for name in ("meta-ST.yaml", "trace-ST.parquet"):
                shutil.copy(wia / name, dst / name)
                (dst / name).chmod(0o644)
            self.convert_src["wia"] = dst


@contextlib.contextmanager
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield out, err


# ----------------------------------------------------------------------------- job mutations
# each takes (job_dir, rng) and returns the substring a correct run must name when it exits 0
# (None: no semantic inconsistency to name, only a file-level corruption)

Mut = Callable[[Path, random.Random], "str | None"]


def _rank_file(job: Path, r: int) -> Path:
    return job / "ranks" / f"rank-{r:05d}.parquet"


def _edit_rank(job: Path, r: int, fn: Callable[[pa.Table], pa.Table]) -> None:
    p = _rank_file(job, r)
    pq.write_table(fn(pq.read_table(p)), p)


def _set(t: pa.Table, name: str, values: Any, type_: Any = None) -> pa.Table:
    i = t.schema.get_field_index(name)
    arr = pa.array(values, type=type_ or t.schema.field(i).type)
    return t.set_column(i, pa.field(name, arr.type, nullable=True), arr)


def _plain(t: pa.Table) -> pa.Table:
    for i, f in enumerate(t.schema):
        if pa.types.is_dictionary(f.type):
            t = t.set_column(i, pa.field(f.name, f.type.value_type), t.column(i).cast(f.type.value_type))
    return t


def _col(t: pa.Table, name: str) -> list[Any]:
    return _plain(t).column(name).to_pylist()


def m_end_before_start(job: Path, rng: random.Random, r: int) -> str:
    def f(t):
        st, en = _col(t, "start_ns"), _col(t, "end_ns")
        for i in rng.sample(range(t.num_rows), k=min(3, t.num_rows)):
            en[i] = st[i] - rng.randint(1, 10**6)
        return _set(t, "end_ns", en)
    _edit_rank(job, r, f)
    return "end before they start"


def m_op_index_shuffle(job: Path, rng: random.Random, r: int) -> str:
    def f(t):
        it, ix = _col(t, "iteration"), _col(t, "op_index")
        target = rng.choice(sorted(set(it)))
        rows = [i for i, v in enumerate(it) if v == target]
        vals = [ix[i] for i in rows]
        shuffled = vals[:]
        while shuffled == vals and len(vals) > 1:
            rng.shuffle(shuffled)
        for i, v in zip(rows, shuffled):
            ix[i] = v
        return _set(t, "op_index", ix)
    _edit_rank(job, r, f)
    return "op_index is not in start order"


def m_int64_min(job: Path, rng: random.Random, r: int) -> str:
    def f(t):
        st = _col(t, "start_ns")
        st[rng.randrange(t.num_rows)] = I64_MIN
        return _set(t, "start_ns", st)
    _edit_rank(job, r, f)
    return "int64 extreme"


def m_duplicate_rows(job: Path, rng: random.Random, r: int) -> str:
    def f(t):
        idx = rng.sample(range(t.num_rows), k=min(4, t.num_rows))
        return pa.concat_tables([t, t.take(idx)])
    _edit_rank(job, r, f)
    return "duplicated row"


def m_send_no_peer(job: Path, rng: random.Random, r: int) -> str | None:
    def f(t):
        op, peer = _col(t, "op"), _col(t, "peer")
        p2p = [i for i, o in enumerate(op) if o in ("send", "recv")]
        for i in rng.sample(p2p, k=min(2, len(p2p))):
            peer[i] = None
        return _set(t, "peer", peer, pa.int32())
    t = pq.read_table(_rank_file(job, r))
    if not any(o in ("send", "recv") for o in _col(t, "op")):
        return None
    _edit_rank(job, r, f)
    return "have no peer"


def m_collective_peer(job: Path, rng: random.Random, r: int) -> str:
    def f(t):
        op, peer = _col(t, "op"), _col(t, "peer")
        coll = [i for i, o in enumerate(op) if o not in ("send", "recv")]
        for i in rng.sample(coll, k=min(2, len(coll))):
            peer[i] = (r + 1) % 4
        return _set(t, "peer", peer, pa.int32())
    _edit_rank(job, r, f)
    return "name a peer"


def m_foreign_comm(job: Path, rng: random.Random, r: int) -> str | None:
    meta = json.loads((job / "job.json").read_text())
    foreign = [c for c, v in meta.get("communicators", {}).items() if r not in v["ranks"]]
    if not foreign:
        return None
    cid = rng.choice(foreign)

    def f(t):
        comm = _col(t, "comm_id")
        for i in rng.sample(range(t.num_rows), k=min(3, t.num_rows)):
            comm[i] = cid
        return _set(_plain(t), "comm_id", comm, pa.string())
    _edit_rank(job, r, f)
    return "not a member"


def m_seq_backwards(job: Path, rng: random.Random, r: int) -> str | None:
    def f(t):
        comm, op, seq = _col(t, "comm_id"), _col(t, "op"), _col(t, "seq")
        by: dict[str, list[int]] = {}
        for i, (c, o) in enumerate(zip(comm, op)):
            if o not in ("send", "recv"):
                by.setdefault(c, []).append(i)
        cands = [v for v in by.values() if len(v) >= 2]
        rows = rng.choice(cands)
        a, b = sorted(rng.sample(rows, 2))
        seq[a], seq[b] = seq[b], seq[a]
        return _set(t, "seq", seq)
    _edit_rank(job, r, f)
    return "go back in seq"


def m_iter_end_before_start(job: Path, rng: random.Random, r: int) -> str | None:
    p = job / "iterations" / f"rank-{r:05d}.parquet"
    if not p.is_file():
        return None
    t = pq.read_table(p)
    st, en = t.column("start_ns").to_pylist(), t.column("end_ns").to_pylist()
    for i in rng.sample(range(t.num_rows), k=min(2, t.num_rows)):
        en[i] = st[i] - rng.randint(1, 10**9)
    pq.write_table(_set(t, "end_ns", en), p)
    return "end before they start"


def m_iter_offset(job: Path, rng: random.Random, r: int) -> str | None:
    p = job / "iterations" / f"rank-{r:05d}.parquet"
    if not p.is_file():
        return None
    t = pq.read_table(p)
    pq.write_table(_set(t, "iteration", [v + 1000 for v in t.column("iteration").to_pylist()]), p)
    return "disagrees with the op table"


def m_iteration_shift(job: Path, rng: random.Random, r: int) -> str:
    """The rank's ops (and iteration table) numbered from another step than the other files."""
    off = rng.choice([1, 2, 1000])
    _edit_rank(job, r, lambda t: _set(t, "iteration", [v + off for v in _col(t, "iteration")]))
    p = job / "iterations" / f"rank-{r:05d}.parquet"
    if p.is_file():
        t = pq.read_table(p)
        pq.write_table(_set(t, "iteration", [v + off for v in t.column("iteration").to_pylist()]), p)
    return "disagree on communicator"


def m_seq_shift(job: Path, rng: random.Random, r: int) -> str:
    """The rank's seq numbers shifted against the other members' (still monotone)."""
    off = rng.choice([1, 7, 10**6])
    _edit_rank(job, r, lambda t: _set(t, "seq", [v + off for v in _col(t, "seq")]))
    return "disagree on communicator"


# cross-rank inconsistencies: only a command that reads another member of the communicators sees
# them (holmes detect reads every rank for the job context)
CROSS: dict[str, Callable[[Path, random.Random, int], "str | None"]] = {
    "iteration_shift": m_iteration_shift, "seq_shift": m_seq_shift,
}

SEMANTIC: dict[str, Callable[[Path, random.Random, int], "str | None"]] = {
    "end_before_start": m_end_before_start, "op_index_shuffle": m_op_index_shuffle, "int64_min": m_int64_min,
    "duplicate_rows": m_duplicate_rows, "send_no_peer": m_send_no_peer, "collective_peer": m_collective_peer,
    "foreign_comm": m_foreign_comm, "seq_backwards": m_seq_backwards, "iter_end_before_start": m_iter_end_before_start,
    "iter_offset": m_iter_offset,
}


def _junk(rng: random.Random) -> bytes:
    choices = [
        b"", b"\xff\xfe\x00garbage", b"{", b"[" * 100_000, b"null", b"[]", b'"x"', b"1e400",
        b'{"schema": "holmes.commops/1", "world_size": NaN, "communicators": {}}',
        bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 512))),
        json.dumps({"a": 1}).encode() * 3,
        gzip.compress(b"{" * 10),
    ]
    return rng.choice(choices)


def _meta_edit(job: Path, fn: Callable[[dict], None]) -> None:
    p = job / "job.json"
    d = json.loads(p.read_text())
    fn(d)
    p.write_text(json.dumps(d))


def f_job_json(job: Path, rng: random.Random) -> None:
    k = rng.randrange(12)
    p = job / "job.json"
    if k == 0:
        p.unlink()
    elif k == 1:
        p.unlink()
        p.symlink_to("/dev/zero")
    elif k == 2:
        p.write_bytes(p.read_bytes()[: rng.randrange(1, max(2, p.stat().st_size))])
    elif k == 3:
        _meta_edit(job, lambda d: d.__setitem__("world_size", rng.choice([10**7, 10**30, -1, 0, 1.5, "8", None, True])))
    elif k == 4:
        def g(d):
            c = rng.choice(list(d["communicators"]))
            d["communicators"][c]["ranks"] = rng.choice([[-1, 0], [0, 10**9], [], "0,1", [0.5]])
        _meta_edit(job, g)
    elif k == 5:
        _meta_edit(job, lambda d: d.__setitem__(rng.choice(["bogus", "schema"]), rng.choice([1, "holmes.commops/9"])))
    elif k == 6:
        def g(d):
            c = rng.choice(list(d["communicators"]))
            d["communicators"][c]["kind"] = rng.choice(["xx", 5, None])
        _meta_edit(job, g)
    elif k == 7:
        def g(d):
            d["communicators"] = {}
            d.pop("parallel", None)
        _meta_edit(job, g)
    elif k == 8:
        p.unlink()
        p.mkdir()
    elif k == 9:
        _meta_edit(job, lambda d: d.__setitem__("parallel", {"tp": rng.choice([0, 3, 10**9, -2]), "pp": 2, "dp": 1}))
    elif k == 10:
        p.write_bytes(b'{"a":' * 5000 + b"1" + b"}" * 5000)
    else:
        p.write_bytes(_junk(rng))


def f_ranks(job: Path, rng: random.Random) -> None:
    k = rng.randrange(8)
    d = job / "ranks"
    if k == 0:
        shutil.rmtree(d)
        d.write_text("not a directory")
    elif k == 1:
        shutil.rmtree(d)
        d.symlink_to(d.name)  # a symlink loop
    elif k == 2:
        f = rng.choice(sorted(d.iterdir()))
        f.write_bytes(f.read_bytes()[: rng.randrange(0, max(1, f.stat().st_size))])
    elif k == 3:
        rng.choice(sorted(d.iterdir())).unlink()
    elif k == 4:
        rng.choice(sorted(d.iterdir())).write_bytes(_junk(rng))
    elif k == 5:  # a required column dropped or retyped
        r = rng.randrange(4)
        name = rng.choice(["end_ns", "op", "seq", "peer", "rank", "comm_id"])
        if rng.random() < 0.5:
            _edit_rank(job, r, lambda t: t.drop_columns([name]))
        else:
            _edit_rank(job, r, lambda t: _set(_plain(t), name, [str(v) for v in _col(t, name)], pa.string()))
    elif k == 6:  # plain strings on one rank, dictionaries on the others
        _edit_rank(job, rng.randrange(4), _plain)
    else:  # a peer or rank outside the world
        r = rng.randrange(4)
        col = rng.choice(["peer", "rank"])
        _edit_rank(job, r, lambda t: _set(t, col, [rng.choice([10**6, -3])] * t.num_rows, pa.int32()))


def f_topology(job: Path, rng: random.Random) -> None:
    p = job / "topology.json"
    k = rng.randrange(4)
    if k == 0:
        p.write_bytes(_junk(rng))
    elif k == 1:
        d = json.loads(p.read_text())
        for key in list(d)[: rng.randint(1, 2)]:
            d[key] = rng.choice([None, 5, "x", [], {}])
        p.write_text(json.dumps(d))
    elif k == 2:
        p.unlink()
        p.symlink_to("/dev/zero")
    else:
        p.write_bytes(b"[" * 200_000)


def f_iterations(job: Path, rng: random.Random) -> None:
    d = job / "iterations"
    k = rng.randrange(3)
    if k == 0:
        rng.choice(sorted(d.iterdir())).write_bytes(_junk(rng))
    elif k == 1:
        f = rng.choice(sorted(d.iterdir()))
        pq.write_table(pq.read_table(f).drop_columns(["end_ns"]), f)
    else:
        shutil.rmtree(d)
        d.write_text("x")


FILE_LEVEL: dict[str, Callable[[Path, random.Random], None]] = {
    "job_json": f_job_json, "ranks": f_ranks, "topology": f_topology, "iterations": f_iterations,
}


# ----------------------------------------------------------------------------- converter mutations


def c_mutate(src: Path, fmt: str, rng: random.Random) -> None:
    files = [src] if src.is_file() else sorted(f for f in src.rglob("*") if f.is_file())
    f = rng.choice(files)
    k = rng.randrange(9)
    raw = f.read_bytes()
    if k == 0:
        f.write_bytes(raw[: rng.randrange(0, max(1, len(raw)))])
    elif k == 1:
        b = bytearray(raw)
        for _ in range(rng.randint(1, 20)):
            if b:
                b[rng.randrange(len(b))] = rng.getrandbits(8)
        f.write_bytes(bytes(b))
    elif k == 2:
        f.write_bytes(gzip.compress(b"\0" * (80 << 20), compresslevel=1))  # a gzip bomb past the fuzz cap
    elif k == 3:
        f.write_bytes(_junk(rng))
    elif k == 4 and fmt == "kineto":
        d = json.loads(raw)
        evs = d["traceEvents"]
        e = rng.choice(evs)
        key = rng.choice(["ts", "dur", "args", "name", "pid"])
        e[key] = rng.choice([10**30, -10**30, "x", None, [], {"a": 1}, float("nan")])
        if rng.random() < 0.5:
            d["distributedInfo"]["pg_config"][0]["ranks"] = rng.choice([[0, -1], [0, 10**12], "x", None])
        f.write_text(json.dumps(d))
    elif k == 4 and fmt == "flight-recorder":
        try:
            from holmes.adapters.safe_pickle import safe_loads

            d = safe_loads(raw)
            e = rng.choice(d["entries"])
            key = rng.choice(["input_sizes", "time_created_ns", "process_group", "collective_seq_id",
                              "profiling_name", "duration_ms"])
            e[key] = rng.choice([[[10**30]], -5, ("x",), None, "nan", 10**30, [[-1, 2]]])
            f.write_bytes(pickle.dumps(d))
        except Exception:  # noqa: BLE001 - already not a dump
            f.write_bytes(_junk(rng))
    elif k == 4 and fmt == "nccl-inspector":
        lines = raw.decode().splitlines()
        if lines:
            i = rng.randrange(len(lines))
            try:
                rec = json.loads(lines[i])
                key = rng.choice(list(rec))
                rec[key] = rng.choice([10**30, -1, "x", None, [], {"id": -5}])
                lines[i] = json.dumps(rec)
            except ValueError:
                lines[i] = "{"
        f.write_text("\n".join(lines))
    elif k == 4 and fmt == "wia" and f.suffix == ".yaml":
        f.write_text(rng.choice(["world_size: 100000000000\n", "dp_size: -1\n", "a: [\n", "!!python/object:os.system\n",
                                 "tp_size: x\npp_size: 2\n"]))
    elif k == 5:
        f.write_bytes(b"[" * 100_000 if rng.random() < 0.5 else b'{"a":' * 3000)
    elif k == 6:
        f.unlink()
        f.symlink_to("/dev/zero")
    elif k == 7:
        f.write_bytes(b"\xff\xfe" + raw[:100])
    else:
        f.write_bytes(json.dumps({"traceEvents": [{"ph": "X", "name": "record_param_comms", "ts": 1e300,
                                                   "dur": -1, "args": {"Process Group Ranks": "[-1]"}}]}).encode())


# ----------------------------------------------------------------------------- running a case


def _outputs(out: Path | None) -> list[Path]:
    """The paths a command writing ``out`` may create (a model ``M`` is ``M.json`` and ``M.npz``)."""
    if out is None:
        return []
    return [out, out.with_name(out.name + ".json"), out.with_name(out.name + ".npz")]


def _digest(root: Path, skip: Path | None = None) -> dict[str, str]:
    """path -> sha256 (or link target / 'dir') of everything under ``root`` except ``skip`` (and its model files)."""
    out = {}
    skips = _outputs(skip)

    def skipped(p: Path) -> bool:
        return any(p == s or s in p.parents for s in skips)

    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dp = Path(dirpath)
        if skipped(dp):
            dirnames[:] = []
            continue
        for name in dirnames + filenames:
            p = dp / name
            if skipped(p):
                continue
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_dir():
                out[rel] = "dir"
            elif not p.is_file():
                out[rel] = "special"  # a FIFO a case made: reading it would block
            else:
                try:
                    out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
                except OSError as exc:
                    out[rel] = f"unreadable:{exc.errno}"
    return out


@dataclass
class Outcome:
    name: str
    rc: int | None
    stdout: str
    stderr: str
    traceback: bool = False
    internal_error: bool = False
    clobber: bool = False
    silent_wrong: bool = False
    detail: str = ""


def run_cli(argv: list[str]) -> tuple[int | None, str, str, str]:
    """Run ``holmes argv`` in-process; returns (status, stdout, stderr, escaped-exception)."""
    from holmes.cli.main import main

    escaped = ""
    with _quiet() as (out, err):
        try:
            rc = main(argv)
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 2
        except BaseException as exc:  # noqa: BLE001 - counted as a traceback
            rc = None
            escaped = f"{type(exc).__name__}: {exc}"
    return rc, out.getvalue(), err.getvalue(), escaped


def judge(name: str, argv: list[str], work: Path, output: Path | None, expect: str | None,
          semantic_rank: int | None) -> Outcome:
    """Run one command in ``work`` and judge the outcome (see the module docstring)."""
    before = _digest(work, skip=output)
    rc, out, err, escaped = run_cli(argv)
    after = _digest(work, skip=output)
    o = Outcome(name, rc, out, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if escaped or rc not in (0, 2):
        o.traceback, o.detail = True, escaped or f"exit {rc}"
    elif rc == 2 and len(lines) != 1:
        o.traceback, o.detail = True, f"{len(lines)} stderr lines: {err[:300]!r}"
    elif any("internal error" in ln for ln in lines):
        o.internal_error, o.detail = True, lines[-1][:300]
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    if changed:
        o.clobber, o.detail = True, f"changed outside the output: {changed[:5]}"
    if rc == 0 and expect is not None and not (o.traceback or o.internal_error):
        text = out + err
        if expect not in text:
            o.silent_wrong, o.detail = True, f"holmes {argv[0]}: exit 0 without naming {expect!r} (rank {semantic_rank})"
    return o


def make_case(bases: Bases, rng: random.Random, work: Path) -> tuple[str, list[str], Path | None, str | None, int | None]:
    """Build one case in ``work``; returns (name, argv, output path, expected finding, rank)."""
    family = rng.choices(["semantic", "file", "args", "clobber", "convert", "rare"], weights=[4, 3, 1, 1, 2, 3])[0]
    if family == "rare":
        return make_rare_case(bases, rng, work)
    if family == "convert" and not bases.convert_src:
        family = "file"
    if family == "convert":
        fmt = rng.choice(sorted(bases.convert_src))
        base = bases.convert_src[fmt]
        src = work / base.name
        (shutil.copytree if base.is_dir() else shutil.copy)(base, src)
        c_mutate(src, fmt, rng)
        if rng.random() < 0.2 and src.is_dir():
            out = src / "job"  # an output inside the input
        else:
            out = work / "out"
        argv = ["convert", "--from", fmt, str(src), str(out)]
        if rng.random() < 0.2:
            argv += ["--world-size", str(rng.choice([0, -1, 10**9, 2, 10**30]))]
        return f"convert-{fmt}", argv, out, None, None
    job = work / "job"
    shutil.copytree(bases.job, job, symlinks=True)
    if family == "semantic":
        use_detect = rng.random() < 0.5
        pool = {**SEMANTIC, **CROSS} if use_detect else SEMANTIC
        names = rng.sample(sorted(pool), k=rng.randint(1, 2))
        r = rng.randrange(4)
        expects = [pool[n](job, rng, r) for n in names]
        expect = next((e for e in expects if e is not None), None)
        if use_detect:
            out = work / "scores.parquet"
            argv = ["detect", str(job), "--ranks", str(r), "--model", str(bases.model), "--out", str(out)]
        else:
            out = None
            argv = ["localize", str(job), "--pivot", str(r), "--format", "json"]
        return "semantic-" + "+".join(names), argv, out, expect, r
    if family == "file":
        names = rng.sample(sorted(FILE_LEVEL), k=rng.randint(1, 2))
        for n in names:
            FILE_LEVEL[n](job, rng)
        if rng.random() < 0.5:
            out = work / "scores.parquet"
            argv = ["detect", str(job), "--model", str(bases.model), "--out", str(out)]
        else:
            out = None
            argv = ["localize", str(job), "--format", "json"]
        return "file-" + "+".join(names), argv, out, None, None
    if family == "args":
        k = rng.randrange(6)
        out = work / "scores.parquet"
        if k == 0:
            argv = ["detect", str(job), "--ranks", rng.choice(["0-50000000", "-1", "3-1", "a", "0,,1", "1" * 40, ""]),
                    "--model", str(bases.model), "--out", str(out)]
        elif k == 1:
            argv = ["detect", str(job), "--threshold", rng.choice(["nan", "-1", "2", "inf"]), "--model", str(bases.model),
                    "--out", str(out)]
        elif k == 2:
            out = None
            argv = ["localize", str(job)] + rng.choice([["--pivot", "99"], ["--pivot", "-1"], ["--window", "0"],
                                                         ["--top", "-1"], ["--delta", "nan"], ["--delta", "0.5"],
                                                         ["--format", "xml"], ["--pivot", "1.5"]])
        elif k == 3:
            out = work / "sim"
            argv = ["simulate", "--out", str(out)] + rng.choice([["--tp", "0", "--pp", "1", "--dp", "1"],
                                                                   ["--tp", "2", "--pp", "1", "--dp", "1", "--fault", "gpu:9@spike*2"],
                                                                   ["--tp", "2", "--pp", "1", "--dp", "1", "--fault", "x"],
                                                                   ["--tp", "2", "--pp", "1", "--dp", "1", "--iterations", "-3"],
                                                                   ["--tp", "100000", "--pp", "100000", "--dp", "100000"],
                                                                   ["--tp", "2", "--pp", "1", "--dp", "1", "--topology", str(job / "job.json")]])
        elif k == 4:
            out = work / "m"
            argv = ["train", str(job), "--out", str(out), "--n-estimators", rng.choice(["0", "1"]), "--max-ranks", "1",
                    "--threshold", rng.choice(["nan", "0.5", "7"])]
        else:
            out = work / "conv"
            argv = ["convert", "--from", rng.choice(["kineto", "bogus", "wia"]), str(job / "missing"), str(out)]
        return f"args-{k}", argv, out, None, None
    # clobber attempts: the output is an input or inside one, or exists without --overwrite
    k = rng.randrange(7)
    if k == 0:
        target = rng.choice([job / "job.json", job / "ranks" / "rank-00001.parquet", job / "ranks", job, job / "new.parquet"])
        argv = ["detect", str(job), "--ranks", "0", "--model", str(bases.model), "--out", str(target)]
    elif k == 1:
        target = job
        argv = ["simulate", "--out", str(job), "--tp", "2", "--pp", "1", "--dp", "1", "--iterations", "2"]
        if rng.random() < 0.5:
            target = job / "inner"
            argv[2] = str(target)
    elif k == 2:
        target = job / "m"
        argv = ["train", str(job), "--out", str(target), "--n-estimators", "1", "--max-ranks", "1"]
    elif k == 3:
        target = work / "existing.parquet"
        target.write_bytes(b"user data")
        argv = ["detect", str(job), "--ranks", "0", "--model", str(bases.model), "--out", str(target)]
    elif k == 4:
        target = work / "existing"
        (target).mkdir()
        (target / "notes.txt").write_text("user data")
        argv = ["simulate", "--out", str(target), "--tp", "2", "--pp", "1", "--dp", "1", "--iterations", "2", "--overwrite"]
    elif k == 5:
        target = work / "m2"
        for ext in (".json", ".npz"):
            (work / f"m2{ext}").write_text("user model")
        argv = ["train", str(job), "--out", str(target), "--n-estimators", "1", "--max-ranks", "1"]
    else:
        target = work
        argv = ["detect", str(job), "--ranks", "0", "--model", str(bases.model), "--out", str(work)]
    # nothing may change anywhere: the output is refused, so digest the whole work tree
    return f"clobber-{k}", argv, None, None, None


# ----------------------------------------------------------------------------- rare inputs (#39)


def _all_ranks(job: Path, fn: Callable[[pa.Table], pa.Table]) -> None:
    for r in range(4):
        _edit_rank(job, r, fn)


def _scale_times(k: int) -> Callable[[pa.Table], pa.Table]:
    return lambda t: _set(_set(t, "start_ns", [v // k for v in _col(t, "start_ns")]), "end_ns",
                          [None if v is None else v // k for v in _col(t, "end_ns")])


def _kineto_24(src: Path, rng: random.Random) -> None:
    """24 ranks' Kineto traces whose one process group lists ranks 0 and 1 only."""
    src.mkdir()
    for r in range(24):
        ev = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "ts": 1000 * i, "dur": 999,
               "pid": 1, "tid": 1} for i in range(4)]
        for i in range(4):
            args = {"Collective name": "allreduce", "Process Group Name": "0", "Process Group Ranks": "[0, 1]",
                    "Process Group Description": "default_pg", "In msg nelems": 10, "Out msg nelems": 10,
                    "dtype": "Float", "Group size": 2}
            ev.append({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1,
                       "ts": 1000 * i + 10 + r, "dur": 5 + rng.randrange(50), "args": args})
        d = {"schemaVersion": 1, "baseTimeNanoseconds": 10**18,
             "distributedInfo": {"backend": "gloo", "rank": r, "world_size": 24, "pg_config": [
                 {"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cpu:gloo", "pg_size": 2,
                  "ranks": [0, 1]}]}, "traceEvents": ev}
        (src / f"rank{r}.json").write_text(json.dumps(d))


def _bomb(job: Path, r: int, kind: str) -> None:
    """A rank file that is small on disk and huge once decoded."""
    t = pq.read_table(_rank_file(job, r))
    one = t.slice(0, 1)
    if kind == "rows":  # constant rows: beyond FUZZ_ENV's row cap, a few kB
        n = (1 << 20) + 1000
        big = one.take(pa.array(np.zeros(n, np.int64)))
        pq.write_table(big, _rank_file(job, r), compression="zstd")
        return
    # 100k-character communicator ids (500 MB decoded), dictionary-encoded on disk, written 200 rows
    # at a time so that the harness itself stays small
    n = 200
    chunk = one.take(pa.array(np.zeros(n, np.int64)))
    ids = pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array(["c" * 100_000]))
    chunk = chunk.set_column(chunk.schema.get_field_index("comm_id"), "comm_id", ids.cast(pa.string()))
    with pq.ParquetWriter(_rank_file(job, r), chunk.schema, compression="zstd") as w:
        for _ in range(25):
            w.write_table(chunk)


RARE_KINDS = ("zero_rows", "op_index_zero", "halves", "truncated", "microseconds", "milliseconds", "zero_length",
              "label_strings", "seed", "kineto_24", "bomb_rows", "bomb_strings", "topology_fifo", "topology_zero",
              "overwrite_job_json", "overwrite_empty_ranks")


def make_rare_case(bases: Bases, rng: random.Random, work: Path, kind: str | None = None
                   ) -> tuple[str, list[str], Path | None, str | None, int | None]:
    """One of the rare inputs an outside fuzz run turned into hidden crashes, clobbers, unbounded
    reads or quiet verdicts (see the module docstring); ``kind``: one of :data:`RARE_KINDS`
    (default: drawn)."""
    k = kind if kind is not None else rng.choice(RARE_KINDS)
    loc = ["localize"]
    if k == "seed":
        out = work / "sim"
        seed = rng.choice([2**63, 2**64 + 5, 10**30, -1])
        return "rare-seed", ["simulate", "--out", str(out), "--tp", "2", "--pp", "1", "--dp", "1", "--iterations", "2",
                             "--seed", str(seed)], out, None, None
    if k == "kineto_24":
        src = work / "traces"
        _kineto_24(src, rng)
        out = work / "out"
        return "rare-kineto_24", ["convert", "--from", "kineto", str(src), str(out)], out, \
            "process group that does not list them", None
    job = work / "job"
    shutil.copytree(bases.job, job, symlinks=True)
    r = rng.randrange(4)
    expect: str | None = None
    extra: list[str] = []
    if k == "zero_rows":
        _edit_rank(job, r, lambda t: t.slice(0, 0))
        expect = "logged far less than their peers"
    elif k == "op_index_zero":
        _edit_rank(job, r, lambda t: _set(t, "op_index", [0] * t.num_rows, pa.int32()))
        expect = "share an (iteration, op_index)"
    elif k == "halves":
        for q in (2, 3):
            _edit_rank(job, q, lambda t: _set(t, "iteration", [v + 100 for v in _col(t, "iteration")]))
        shutil.rmtree(job / "iterations")
        expect = "iterations that most of the others did not"
    elif k == "truncated":
        _edit_rank(job, r, lambda t: t.slice(0, 1))
        expect = "logged far less than their peers"
    elif k in ("microseconds", "milliseconds"):
        _all_ranks(job, _scale_times(1000 if k == "microseconds" else 1_000_000))
        shutil.rmtree(job / "iterations")
        expect = "implausibly short times"
    elif k == "zero_length":
        _edit_rank(job, r, lambda t: _set(t, "end_ns", _col(t, "start_ns")))
        expect = "zero-length operators"
    elif k == "label_strings":
        _all_ranks(job, lambda t: _set(t, "abnormal", ["yes" if v else "no" for v in _col(t, "abnormal")], pa.string()))
        extra = ["--detector", "label"]
    elif k in ("bomb_rows", "bomb_strings"):
        _bomb(job, r, "rows" if k == "bomb_rows" else "strings")
    elif k in ("topology_fifo", "topology_zero"):
        if k == "topology_fifo":
            fifo = work / "topo.fifo"
            os.mkfifo(fifo)
            extra = ["--topology", str(fifo)]
        else:
            extra = ["--topology", "/dev/zero"]
    else:  # --overwrite onto a directory holding a user's file beside a job.json, or an empty ranks/
        target = work / "mine"
        target.mkdir()
        if k == "overwrite_job_json":
            (target / "job.json").write_text(rng.choice(['{"world_size": 2}', (job / "job.json").read_text()]))
        else:
            (target / "ranks").mkdir()
        (target / "thesis.tex").write_text("user data")
        if rng.random() < 0.5:
            argv = ["simulate", "--out", str(target), "--tp", "2", "--pp", "1", "--dp", "1", "--iterations", "2",
                    "--overwrite"]
        else:
            argv = ["convert", "--from", "nccl-inspector", str(INSPECTOR), str(target), "--overwrite"]
        return f"rare-{k}", argv, None, None, None  # nothing may change: the whole work tree is digested
    return f"rare-{k}", loc + [str(job), "--format", "json"] + extra, None, expect, r


def run_case(bases: Bases, seed: int, scratch: Path) -> Outcome:
    rng = random.Random(seed)
    work = Path(tempfile.mkdtemp(dir=scratch, prefix=f"case{seed}-"))
    try:
        name, argv, out, expect, r = make_case(bases, rng, work)
        o = judge(name, argv, work, out, expect, r)
        if out is not None and any(p.exists() for p in _outputs(out)) and o.rc == 2:
            o.clobber, o.detail = True, f"exit 2 but the output {out.name} was written"
        leftovers = [p.name for p in work.rglob(".holmes-tmp-*")]
        if leftovers:
            o.clobber, o.detail = True, f"temporary files left: {leftovers[:3]}"
        return o
    finally:
        for p in work.rglob("*"):
            if p.is_dir() and not p.is_symlink():
                with contextlib.suppress(OSError):
                    p.chmod(0o755)
        shutil.rmtree(work, ignore_errors=True)


def max_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--verbose", action="store_true", help="print every failing case")
    ap.add_argument("--smoke", action="store_true",
                    help="CI: 12 cases (exits 1 on a traceback, clobber or silent wrong answer)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.cases, args.verbose = 12, True
    os.environ.update(FUZZ_ENV)
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="holmes-fuzz-") as tmp:
        scratch = Path(tmp)
        bases = Bases(scratch / "bases")
        before = _digest(bases.root)
        counts: Counter[str] = Counter()
        by_family: Counter[str] = Counter()
        fails: list[Outcome] = []
        for i in range(args.cases):
            rss0 = max_rss_mb()
            o = run_case(bases, args.seed * 1_000_003 + i, scratch)
            if max_rss_mb() > max(rss0, 1024) + 64:
                print(f"case {i} {o.name}: peak RSS rose to {max_rss_mb():.0f} MB", flush=True)
            fam = o.name.split("-")[0]
            by_family[fam] += 1
            for k in ("traceback", "internal_error", "clobber", "silent_wrong"):
                if getattr(o, k):
                    counts[k] += 1
                    fails.append(o)
                    if args.verbose:
                        print(f"case {i} {o.name} {k}: rc={o.rc} {o.detail}", flush=True)
            counts[f"rc{o.rc}"] += 1
            if (i + 1) % 500 == 0:
                print(f"  progress: fuzz_cases={i + 1} tracebacks={counts['traceback']} "
                      f"internal_errors={counts['internal_error']} clobbers={counts['clobber']} "
                      f"silent_wrong={counts['silent_wrong']} max_rss_mb={max_rss_mb():.0f} "
                      f"elapsed_s={time.time() - t0:.0f}", flush=True)
        if _digest(bases.root) != before:
            counts["clobber"] += 1
            print("the pristine inputs changed during the run")
    print(f"{'family':<10} {'cases':>7}")
    for fam, n in sorted(by_family.items()):
        print(f"{fam:<10} {n:>7}")
    print(f"exit 0: {counts['rc0']}, exit 2: {counts['rc2']}, elapsed {time.time() - t0:.0f} s")
    seen = set()
    for o in fails:
        key = (o.name.split("+")[0], o.detail[:60])
        if key not in seen:
            seen.add(key)
            print(f"  {o.name}: {o.detail[:200]}")
    print(f"fuzz_cases={args.cases} tracebacks={counts['traceback']} internal_errors={counts['internal_error']} "
          f"clobbers={counts['clobber']} "
          f"silent_wrong={counts['silent_wrong']} max_rss_mb={max_rss_mb():.0f}")
    if args.smoke and (counts["traceback"] or counts["clobber"] or counts["silent_wrong"]):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
