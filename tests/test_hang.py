"""The hang analysis (issue #17): real Flight Recorder dumps, missing/partial/malformed dumps, old jobs."""

from __future__ import annotations

import pickle
import random
import re
import shutil
import warnings
from pathlib import Path

import pytest

import holmes
from holmes.adapters import convert_flight_recorder
from holmes.errors import ParseError
from holmes.io import MemoryJob
from holmes.io.schema import ops_table

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "flight_recorder" / "gpu_error_1st"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"needs the Flight Recorder dumps at {DATA} (../shared/data, outside the package)")


def _fault_ranks() -> list[int]:
    m = re.search(r"Fault ranks:\s*\[([^\]]*)\]", (DATA / "fault_injection.log").read_text())
    assert m
    return sorted(int(x) for x in m.group(1).split(","))


def _convert(src: Path, out: Path) -> holmes.Job:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return holmes.read_job(convert_flight_recorder(src, out))


@pytest.fixture(scope="module")
def fr_job(tmp_path_factory):
    return _convert(DATA, tmp_path_factory.mktemp("fr") / "job")


@needs_data
def test_gpu_error_1st_culprits_are_the_injected_faults(fr_job):
    report = holmes.localize(fr_job)
    assert report.verdict == "hang"
    out = report.to_json()
    assert out["hang"]["culprit_ranks"] == _fault_ranks() == [12, 14]
    assert {d["id"] for d in out["devices"]} == {"gpu:12", "gpu:14"}
    assert all(d["evidence"] == ["hang"] and d["confidence"] >= 0.9 for d in out["devices"])
    ep = next(c for c in out["hang"]["communicators"] if c["comm_id"] == "ep-74")
    # NVIDIA's attribution: rank 12 missing from the EP all_to_all; rank 14 issued it but its device
    # stopped on an earlier all_to_all that ranks 13 and 15 completed
    assert ep["op"] == "all_to_all" and ep["missing"] == [12, 14] and ep["waiting"] == [13, 15]
    assert ep["not_issued"] == [12] and set(ep["stalled"]) == {"12", "14"}
    text = report.to_text()
    assert "Verdict: hang" in text and "rank 12 never entered all_to_all" in text
    assert any("irregular analysis skipped: the logs end in a hang" in a for a in report.assumptions)


@needs_data
def test_a_rank_without_dump_is_a_prime_suspect(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(DATA, src)
    (src / "_dump_12").unlink()
    report = holmes.localize(_convert(src, tmp_path / "job"), analysis="hang")
    h = report.to_json()["hang"]
    assert report.verdict == "hang"
    assert h["ranks_without_log"] == [12]
    assert h["culprit_ranks"] == [12, 14]
    assert any("no log" in s for s in h["explanation"])
    assert 12 in report.missing


@needs_data
def test_entries_out_of_order_give_the_same_answer(tmp_path):
    from holmes.adapters.safe_pickle import safe_load

    src = tmp_path / "src"
    shutil.copytree(DATA, src)
    for f in src.glob("_dump_*"):
        d = safe_load(f)
        random.Random(f.name).shuffle(d["entries"])
        f.chmod(0o644)
        f.write_bytes(pickle.dumps(d))
    report = holmes.localize(_convert(src, tmp_path / "job"), analysis="hang")
    assert report.hang["culprit_ranks"] == [12, 14]


@needs_data
def test_truncated_and_malicious_dumps_are_clear_errors(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(DATA, src)
    f = src / "_dump_3"
    f.chmod(0o644)
    f.write_bytes(f.read_bytes()[:1000])
    with pytest.raises(ParseError, match="_dump_3"):
        convert_flight_recorder(src, tmp_path / "job")
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            import os
            return (os.system, (f"touch {marker}",))

    f.write_bytes(pickle.dumps({"version": "2.9", "entries": [Evil()]}))
    with pytest.raises(ParseError, match="refusing"):
        convert_flight_recorder(src, tmp_path / "job2")
    assert not marker.exists()


def test_old_jobs_read_as_before():
    a = holmes.localize("fixtures/gpu16-clean")
    assert a.verdict == "healthy" and a.hang is None and a.to_json()["hang"] is None
    h = holmes.localize("fixtures/gpu16-clean", analysis="hang")  # no state, no dump: only the pivot read
    assert h.verdict == "healthy" and h.hang is None and h.fetched == [0]


def _log(r: int, states: list[str], comm: str = "dp-0") -> object:
    n = len(states)
    return ops_table(rank=[r] * n, iteration=list(range(n)), op_index=[0] * n, comm_id=[comm] * n,
                     seq=list(range(n)), op=["all_reduce"] * n, peer=[None] * n, nbytes=[8] * n,
                     start_ns=[10 * i for i in range(n)],
                     end_ns=[10 * i + 5 if s == "completed" else None for i, s in enumerate(states)], state=states)


def test_chain_blames_the_origin_not_the_victims():
    # rank 1 waits in tp-0 (for rank 0, which never issued), so it never issued dp-0 #1: rank 0 is the culprit
    meta = {"world_size": 4, "communicators": {"tp-0": {"kind": "tp", "ranks": [0, 1]},
                                               "dp-0": {"kind": "dp", "ranks": [1, 2, 3]}},
            "dump": {"reason": "signal", "at_ns": 1_000}}
    c, s = "completed", "started"
    ops = {0: _log(0, [c], "tp-0"),
           1: pa_concat(_log(1, [c, s], "tp-0"), _log(1, [c], "dp-0")),
           2: _log(2, [c, s], "dp-0"), 3: _log(3, [c, s], "dp-0")}
    report = holmes.localize(MemoryJob(meta, ops), analysis="hang")
    assert report.hang["culprit_ranks"] == [0]
    assert [d.id for d in report.devices] == ["gpu:0"]


def pa_concat(a, b):
    import pyarrow as pa

    return pa.concat_tables([a, b])


def test_no_log_rank_in_memory_job():
    meta = {"world_size": 3, "communicators": {"dp-0": {"kind": "dp", "ranks": [0, 1, 2]}}}
    c, s = "completed", "started"
    report = holmes.localize(MemoryJob(meta, {0: _log(0, [c, s]), 1: _log(1, [c, s])}), analysis="hang")
    assert report.verdict == "hang" and report.hang["culprit_ranks"] == [2]
    assert report.hang["ranks_without_log"] == [2]
    assert report.devices[0].id == "gpu:2" and report.devices[0].evidence_score == pytest.approx(0.9)
