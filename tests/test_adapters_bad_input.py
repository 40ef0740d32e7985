"""Converters on malformed-but-parseable inputs: a HolmesError (CLI: exit 2, one line) or a job that
reads back, never an unrelated exception; malformed records and unknown fields are warned about and
recorded in ``job.json``; and the real files convert to jobs that read back and localize.
"""

from __future__ import annotations

import gzip
import json
import pickle
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import holmes
from holmes.adapters import (ConvertWarning, convert_flight_recorder, convert_kineto, convert_nccl_inspector,
                             convert_wia)
from holmes.adapters.safe_pickle import safe_load
from holmes.errors import ConvertError, HolmesError

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
KINETO = DATA / "kineto" / "nccl_data.json.gz"
FR = DATA / "flight_recorder" / "gpu_error_1st"
WIA = DATA / "wia"
INSPECTOR = REPO / "tests" / "data" / "nccl_inspector"

needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"needs the real traces at {DATA} (../shared/data, outside the package)")


def _convert_quiet(fn, src, out):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(src, out)


# ------------------------------------------------------------------ real files read back
@needs_data
@pytest.mark.parametrize("fn,src", [(convert_kineto, KINETO), (convert_flight_recorder, FR), (convert_wia, WIA),
                                    (convert_nccl_inspector, INSPECTOR)], ids=["kineto", "fr", "wia", "inspector"])
def test_every_converter_output_reads_back_and_localizes(tmp_path, fn, src):
    out = _convert_quiet(fn, src, tmp_path / "job")
    job = holmes.read_job(out)
    ranks = job.available_ranks()
    assert ranks
    for r in ranks:
        t = job.ops(r)
        assert t.num_rows > 0
        assert (pc.sum(pc.less(t.column("end_ns"), t.column("start_ns"))).as_py() or 0) == 0
    assert job.meta.source is not None and job.meta.source.format
    rep = holmes.localize(out, pivot=ranks[0]).to_json()
    assert rep["world_size"] == job.world_size


# ------------------------------------------------------------------ malformed inputs
def _kineto_mod(tmp_path: Path, mod) -> Path:
    d = json.load(gzip.open(KINETO, "rt"))
    mod(d)
    f = tmp_path / "rank0.json"
    f.write_text(json.dumps(d))
    return f


def _rpc(d):
    return [e for e in d["traceEvents"] if e.get("name") == "record_param_comms"]


def _fr_mod(tmp_path: Path, mod, rank: int = 3) -> Path:
    src = tmp_path / "fr"
    shutil.copytree(FR, src)
    d = safe_load(FR / f"_dump_{rank}")
    mod(d)
    (src / f"_dump_{rank}").write_bytes(pickle.dumps(d))
    return src


def _wia_mod(tmp_path: Path, table_mod=None, meta: str | None = None) -> Path:
    src = tmp_path / "wia"
    shutil.copytree(WIA, src)
    if table_mod is not None:
        pq.write_table(table_mod(pq.read_table(WIA / "trace-ST.parquet")), src / "trace-ST.parquet")
    if meta is not None:
        (src / "meta-ST.yaml").write_text(meta)
    return src


def _set(t: pa.Table, name: str, arr) -> pa.Table:
    return t.set_column(t.schema.get_field_index(name), name, arr)


CASES = {
    # kineto: holmes/adapters/kineto.py parse_kineto_trace
    "kineto-args-not-object": pytest.param(
        "kineto", lambda p: _kineto_mod(p, lambda d: [e.__setitem__("args", "zzz") for e in _rpc(d)])),
    "kineto-ts-not-number": pytest.param(
        "kineto", lambda p: _kineto_mod(p, lambda d: [e.__setitem__("ts", "abc") for e in _rpc(d)])),
    "kineto-truncated": pytest.param(
        "kineto", lambda p: (p / "t.json").write_text('{"traceEvents": [{"ph": "X"') and p / "t.json"),
    "kineto-bad-gzip": pytest.param(
        "kineto", lambda p: (p / "t.json.gz").write_bytes(b"\x1f\x8b\x08junk") and p / "t.json.gz"),
    # flight recorder: holmes/adapters/flight_recorder.py _dump_rows
    "fr-time-created-not-int": pytest.param(
        "flight-recorder",
        lambda p: _fr_mod(p, lambda d: [e.__setitem__("time_created_ns", "x") for e in d["entries"]])),
    "fr-completed-not-int": pytest.param(
        "flight-recorder",
        lambda p: _fr_mod(p, lambda d: [e.__setitem__("time_discovered_completed_ns", "x") for e in d["entries"]])),
    "fr-truncated-json": pytest.param(
        "flight-recorder", lambda p: (_fr_mod(p, lambda d: None) / "_dump_3").write_bytes(b'{"entries": [1,')
        and p / "fr"),
    # wia: holmes/adapters/wia.py convert_wia
    "wia-zero-rows": pytest.param(
        "wia", lambda p: _wia_mod(p, lambda t: t.slice(0, 0))),
    "wia-unknown-optype": pytest.param(
        "wia", lambda p: _wia_mod(p, lambda t: _set(t, "optype", pa.array(["weird-op"] * t.num_rows)))),
    "wia-meta-sizes-not-int": pytest.param(
        "wia", lambda p: _wia_mod(p, meta="dp_size: x\npp_size: y\n")),
    "wia-truncated": pytest.param(
        "wia", lambda p: (_wia_mod(p) / "trace-ST.parquet").write_bytes(b"PAR1 junk") and p / "wia"),
}


@needs_data
@pytest.mark.parametrize("fmt,build", list(CASES.values()), ids=list(CASES))
def test_malformed_input_is_a_holmes_error_and_cli_one_line(tmp_path, fmt, build):
    src = build(tmp_path)
    fn = {"kineto": convert_kineto, "flight-recorder": convert_flight_recorder, "wia": convert_wia}[fmt]
    try:
        _convert_quiet(fn, src, tmp_path / "job")
    except HolmesError:
        pass  # a typed error is the contract
    else:  # accepted: then the job must at least read back
        job = holmes.read_job(tmp_path / "job")
        for r in job.available_ranks():
            job.ops(r)
    p = subprocess.run([sys.executable, "-m", "holmes", "convert", "--from", fmt, str(src), str(tmp_path / "job2")],
                       capture_output=True, text=True, timeout=300)
    assert "Traceback" not in p.stderr, p.stderr[-1500:]
    lines = p.stderr.strip().splitlines()
    assert all(line.startswith("holmes convert:") for line in lines), p.stderr[-1500:]
    if p.returncode != 0:
        assert p.returncode == 2
        assert len([x for x in lines if not x.startswith("holmes convert: warning:")]) == 1, p.stderr


def test_inspector_unknown_fields_warn_and_missing_rank_is_typed(tmp_path):
    src = tmp_path / "logs"
    shutil.copytree(INSPECTOR, src)
    f = sorted(src.iterdir())[0]
    recs = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
    f.write_text("\n".join(json.dumps(dict(r, zzz_new=1)) for r in recs) + "\n")
    with pytest.warns(Warning, match="zzz_new"):
        job = holmes.read_job(convert_nccl_inspector(src, tmp_path / "job"))
    assert job.available_ranks() == [0, 1, 2, 3]
    (src / f.name).unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            job = holmes.read_job(convert_nccl_inspector(src, tmp_path / "job2"))
        except HolmesError:
            return
    missing = set(range(job.world_size)) - set(job.available_ranks())
    assert missing, "a rank's log was removed but the job claims every rank"
    with pytest.raises(holmes.MissingRankError):
        job.ops(min(missing))


# ------------------------------------------------------------------ malformed records: skipped, warned, counted
def _convert_recording(fn, src, out):
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        fn(src, out)
    msgs = [str(w.message) for w in rec if issubclass(w.category, ConvertWarning)]
    return msgs, holmes.read_job(out).meta.source


@needs_data
def test_kineto_malformed_events_are_skipped_named_and_counted(tmp_path):
    ok_msgs, ok = _convert_recording(convert_kineto, KINETO, tmp_path / "ok")
    assert "malformed_records" not in ok.details and not any("malformed" in m for m in ok_msgs)

    def mod(d):
        rpc = _rpc(d)
        rpc[0]["ts"] = "abc"
        rpc[1]["args"] = "zzz"
        rpc[2]["dur"] = None

    msgs, src = _convert_recording(convert_kineto, _kineto_mod(tmp_path, mod), tmp_path / "job")
    assert src.details["malformed_records"] == {"rank0.json": 3}
    first = [m for m in msgs if "malformed" in m]
    assert len(first) == 1 and "rank0.json" in first[0] and "'record_param_comms'" in first[0] and "'ts'" in first[0]
    assert first[0] in src.warnings
    assert src.details["ops"] < ok.details["ops"]


@needs_data
def test_flight_recorder_malformed_entries_are_skipped_named_and_counted(tmp_path):
    def mod(d):
        d["entries"][0]["time_created_ns"] = "x"
        d["entries"][1]["time_discovered_completed_ns"] = [1]
        d["entries"][2]["duration_ms"] = float("nan")
        d["entries"][2]["time_discovered_completed_ns"] = None
        d["entries"][2]["time_discovered_started_ns"] = 1

    bad = safe_load(FR / "_dump_3")["entries"][0]
    msgs, src = _convert_recording(convert_flight_recorder, _fr_mod(tmp_path, mod), tmp_path / "job")
    assert src.details["malformed_records"] == {"_dump_3": 3}
    first = [m for m in msgs if "malformed" in m]
    assert len(first) == 1 and first[0] in src.warnings
    assert "_dump_3" in first[0] and f"record_id {bad['record_id']}" in first[0] and "'time_created_ns'" in first[0]
    assert holmes.read_job(tmp_path / "job").ops(3).num_rows == len(safe_load(FR / "_dump_3")["entries"]) - 3


# ------------------------------------------------------------------ unknown fields: one warning per key
@needs_data
def test_real_files_have_no_unknown_fields(tmp_path):
    for fn, src in ((convert_kineto, KINETO), (convert_flight_recorder, FR)):
        msgs, s = _convert_recording(fn, src, tmp_path / fn.__name__)
        assert not any("unknown" in m for m in msgs), msgs
        assert "unknown_fields" not in s.details


@needs_data
def test_kineto_unknown_top_level_keys_warn_once_per_key(tmp_path):
    d = json.load(gzip.open(KINETO, "rt"))
    d["zzz_new"] = 1
    d["zzz_other"] = {"a": 1}
    src = tmp_path / "traces"
    src.mkdir()
    (src / "rank0.json").write_text(json.dumps(d))
    d["distributedInfo"]["rank"] = 1
    (src / "rank1.json").write_text(json.dumps(d))
    msgs, s = _convert_recording(convert_kineto, src, tmp_path / "job")
    for key in ("zzz_new", "zzz_other"):
        hits = [m for m in msgs if repr(key) in m]
        assert len(hits) == 1 and "unknown top-level trace key" in hits[0] and "rank0.json" in hits[0]
        assert hits[0] in s.warnings
    assert s.details["unknown_fields"] == {"top-level trace key": ["zzz_new", "zzz_other"]}
    assert holmes.read_job(tmp_path / "job").available_ranks() == [0, 1]


@needs_data
def test_flight_recorder_unknown_entry_and_dump_keys_warn_once_per_key(tmp_path):
    src = _fr_mod(tmp_path, lambda d: [e.__setitem__("zzz_new", 1) for e in d["entries"]], rank=3)
    d = safe_load(FR / "_dump_5")
    d["zzz_top"] = "x"
    for e in d["entries"]:
        e["zzz_new"] = 2
    (src / "_dump_5").write_bytes(pickle.dumps(d))
    msgs, s = _convert_recording(convert_flight_recorder, src, tmp_path / "job")
    entry = [m for m in msgs if "'zzz_new'" in m]
    top = [m for m in msgs if "'zzz_top'" in m]
    assert len(entry) == 1 and "Flight Recorder entry field" in entry[0] and "_dump_3" in entry[0]
    assert len(top) == 1 and "Flight Recorder dump key" in top[0] and "_dump_5" in top[0]
    assert entry[0] in s.warnings and top[0] in s.warnings
    assert s.details["unknown_fields"] == {"Flight Recorder entry field": ["zzz_new"],
                                           "Flight Recorder dump key": ["zzz_top"]}


# ------------------------------------------------------------------ wia: the error names the file and column/key
@needs_data
@pytest.mark.parametrize("table_mod,meta,pattern", [
    (lambda t: t.slice(0, 0), None, r"trace-ST\.parquet: the trace has no rows"),
    (lambda t: _set(t, "optype", pa.array(["weird-op"] * t.num_rows)), None,
     r"trace-ST\.parquet: column 'optype' holds no usable communication operator .*weird-op"),
    (lambda t: _set(t, "rank", pa.array(["x"] * t.num_rows)), None,
     r"trace-ST\.parquet: column 'rank' has type string"),
    (lambda t: _set(t, "step", pa.array([None] * t.num_rows, pa.int64())), None,
     r"trace-ST\.parquet: column 'step' holds \d+ null"),
    (lambda t: _set(t, "stage", pa.array([0.5] * t.num_rows)), None,
     r"column 'stage' holds values that are not integers"),
    (None, "dp_size: x\npp_size: y\n", r"meta-ST\.yaml: 'dp_size' is 'x', not a positive integer"),
    (None, "dp_size: 2\npp_size: 4\nworld_size: 99999999999\n",
     r"meta-ST\.yaml: 'world_size' is 99999999999, outside"),
], ids=["zero-rows", "unknown-optype", "text-rank", "null-step", "fractional-stage", "meta-not-int", "meta-huge"])
def test_wia_bad_input_names_file_and_column(tmp_path, table_mod, meta, pattern):
    src = _wia_mod(tmp_path, table_mod, meta)
    with pytest.raises(ConvertError, match=pattern):
        _convert_quiet(convert_wia, src, tmp_path / "job")
    assert not (tmp_path / "job").exists()
