"""Flight Recorder dumps as users have them (issue #34): wrapped ring buffers, host names in the
file names, ``pg_status`` kept; the culprits of gpu_error_1st stay {12, 14}."""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path

import pyarrow.compute as pc
import pytest

import holmes
from holmes.adapters import convert_flight_recorder
from holmes.adapters.safe_pickle import safe_load

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "flight_recorder" / "gpu_error_1st"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"needs the Flight Recorder dumps at {DATA}")


def _wrapped(tmp: Path, keep: int) -> holmes.Job:
    """gpu_error_1st with every ring buffer cut to its newest ``keep`` entries, written under
    host-qualified names (``nccl_trace_rank_container-node01_12``, pytorch #140879)."""
    src = tmp / f"src{keep}"
    src.mkdir()
    for f in DATA.glob("_dump_*"):
        d = safe_load(f)
        d["entries"] = sorted(d["entries"], key=lambda e: e["record_id"])[-keep:]
        r = int(f.name.rsplit("_", 1)[1])
        (src / f"nccl_trace_rank_container-node{r // 8:02d}_{r}").write_bytes(pickle.dumps(d))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return holmes.read_job(convert_flight_recorder(src, tmp / f"job{keep}"))


@needs_data
@pytest.mark.parametrize("keep", [20, 8])
def test_wrapped_ring_buffers_keep_the_culprits(tmp_path, keep):
    job = _wrapped(tmp_path, keep)
    assert job.world_size == 16 and len(job.meta.extra["progress"]) == 16
    report = holmes.localize(job, analysis="hang")
    h = report.to_json()["hang"]
    assert report.verdict == "hang" and h["culprit_ranks"] == [12, 14] and h["deadlock"] is None
    assert {d.id for d in report.devices} == {"gpu:12", "gpu:14"}


@needs_data
def test_pg_status_names_the_collective_a_ring_buffer_evicted(tmp_path):
    # rank 14's stalled all_gather #42806 of tp-42 is older than its 20 newest entries; its
    # pg_status (last completed 42805) still says where it stopped
    job = _wrapped(tmp_path, 20)
    assert job.meta.extra["progress"]["14"]["tp-42"] == [42826, 42805]
    t = job.ops(14)
    assert min(t.filter(pc.equal(t.column("comm_id"), "tp-42")).column("seq").to_pylist()) > 42806
    h = holmes.localize(job, analysis="hang").to_json()["hang"]
    assert h["root_kinds"] == {"12": "stalled", "14": "stalled"}
    assert h["waiting_count"] == 14
    assert any("14 stopped inside collective #42806 of tp-42" in s for s in h["explanation"])
    assert set(job.meta.extra["flight_recorder"]["dump_mtime_ns"]) == {str(r) for r in range(16)}
