"""holmes.logger on the parallelisms people run: stock DDP, FSDP2, torch pipelining (GPipe, 1F1B).

Each test runs one of the ``examples/capture_*.py`` scripts: 4 gloo ranks (CPU processes), the same
job twice in the same processes, healthy then with rank 2 stalling in its forward every 4th step.
Checked: every operator torch ran is a row (against torch's own flight recorder where it records
them: gloo's collectives; against the schedule's own arithmetic for pipelining's P2P, which gloo's
flight recorder does not record), collectives numbered alike on every member, and the
localization: the slow rank's GPU first, the healthy job naming nothing. A wrong verdict on a
correctly captured job is an analysis issue (reported to the lead with reproducers): it is an
expected failure, reached only after every capture check passed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import holmes

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")
pytestmark = pytest.mark.torch

REPO = Path(__file__).resolve().parents[1]
WORLD, SLOW, STEPS = 4, 2, 16
#: why a live verdict may be wrong on a correctly captured job: four processes on a shared 2-core
#: machine make real, unplanned stragglers (one capture of 16 read a healthy FSDP2 rank 10% slower
#: in 11 of 16 steps, persistently). The verdicts on fixed captures of these jobs are strict tests
#: (tests/test_setup_captures.py).
LIVE = "live capture on a shared machine (the fixed captures are tests/test_setup_captures.py)"


def _capture(tmp_path: Path, script: str, *extra: str, delay: float = 0.1) -> tuple[Path, Path, Path]:
    """Run ``examples/SCRIPT`` (healthy job, then the slow one); returns (slow, healthy, counts)."""
    slow, healthy, counts = tmp_path / "slow", tmp_path / "healthy", tmp_path / "fr"
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    args = [sys.executable, f"examples/{script}", "--out", str(slow), "--healthy-out", str(healthy),
            "--slow-rank", str(SLOW), "--steps", str(STEPS), "--delay", str(delay), "--count", str(counts), *extra]
    p = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        _, err = p.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        pytest.fail(f"{script} did not finish in 240 s")
    assert p.returncode == 0, f"{script} failed:\n{err[-3000:]}"
    return slow, healthy, counts


def _torch_counts(counts: Path, r: int) -> Counter:
    return Counter(json.loads((counts / f"rank-{r}.json").read_text()))


def _no_capture_warning(job_dir: Path) -> None:
    """finalize_job's capture checks found nothing missing (docs/logger.md, "Never silent")."""
    assert json.loads((job_dir / "job.json").read_text())["source"]["warnings"] == []


def _check_collectives_match(job) -> None:
    """The same logical collective has the same (comm_id, seq, op) on every member."""
    seen = []
    for r in range(job.world_size):
        t = job.ops(r).to_pydict()
        seen.append({(c, s, o) for c, s, o, p in zip(t["comm_id"], t["seq"], t["op"], t["peer"]) if p is None})
    assert all(s == seen[0] for s in seen[1:])


def _check_localized(slow: Path, healthy: Path, known_issue: str | None = None) -> None:
    """The slow rank's GPU first in the slow job, nothing in the healthy one. ``known_issue``: a
    wrong verdict on this correctly captured job is an open analysis issue, reported as an xfail
    (the capture checks before it still fail the test)."""
    named = [d["id"] for d in holmes.localize(slow).to_json()["devices"]]
    named_healthy = [d["id"] for d in holmes.localize(healthy).to_json()["devices"]]
    if known_issue and (named[:1] != [f"gpu:{SLOW}"] or named_healthy):
        pytest.xfail(f"{known_issue}: slow job named {named[:3]}, healthy job {named_healthy[:3]}")
    assert named[:1] == [f"gpu:{SLOW}"], named
    assert named_healthy == [], named_healthy


def test_ddp_every_bucket_captured_and_slow_rank_named(tmp_path):
    slow, healthy, counts = _capture(tmp_path, "capture_ddp.py")
    for job_dir, count_dir in ((slow, counts), (healthy, counts / "healthy")):
        job = holmes.read_job(job_dir)
        _no_capture_warning(job_dir)
        for r in range(WORLD):
            ops = Counter(job.ops(r).column("op").to_pylist())
            # DDP's reducer issues its gradient all_reduces from C++; DDP(...) broadcasts the
            # parameters: every one is a row, as many as torch's flight recorder saw
            assert ops == _torch_counts(count_dir, r) and ops["all_reduce"] >= STEPS
            assert set(job.ops(r).column("iteration").to_pylist()) == set(range(STEPS))
        _check_collectives_match(job)
    _check_localized(slow, healthy, known_issue=LIVE)


def test_fsdp2_every_collective_captured_and_slow_rank_named(tmp_path):
    slow, healthy, counts = _capture(tmp_path, "capture_fsdp2.py", delay=0.2)
    for job_dir, count_dir in ((slow, counts), (healthy, counts / "healthy")):
        job = holmes.read_job(job_dir)
        _no_capture_warning(job_dir)
        for r in range(WORLD):
            t = job.ops(r).to_pydict()
            ops, fr = Counter(t["op"]), _torch_counts(count_dir, r)
            # per step, 4 sharded layers: all_gather before forward and before backward, one
            # reduce_scatter of the gradients (gloo runs it as an all_reduce: its recorder says so)
            assert ops["all_gather"] == fr["all_gather"] == 8 * STEPS
            assert ops["reduce_scatter"] == fr["all_reduce"] + fr["reduce_scatter"] == 4 * STEPS
            assert sum(ops.values()) == sum(fr.values())
            # asynchronous: an operator ends when its work completed, after it was issued
            assert all(e >= s for s, e in zip(t["start_ns"], t["end_ns"]))
        _check_collectives_match(job)
    _check_localized(slow, healthy, known_issue=LIVE)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipelining_every_p2p_captured_and_slow_rank_named(tmp_path, schedule):
    slow, healthy, _ = _capture(tmp_path, "capture_pipelining.py", "--schedule", schedule)
    mb = 4  # capture_pipelining.MICRO_BATCHES
    for job_dir in (slow, healthy):
        job = holmes.read_job(job_dir)
        _no_capture_warning(job_dir)
        for r in range(WORLD):
            t = job.ops(r).to_pydict()
            neighbours = {r - 1, r + 1} & set(range(WORLD))
            # per step and micro-batch: an activation from the previous stage and a gradient from
            # the next one (recv), the same sent on (send); step 0 also exchanges shape metadata
            for it in range(1, STEPS):
                rows = Counter((o, p) for i, o, p in zip(t["iteration"], t["op"], t["peer"]) if i == it)
                assert rows == Counter({(o, p): mb for o in ("send", "recv") for p in neighbours}), (r, it)
            assert all(p in neighbours for p in t["peer"])
            # the schedule waits on every isend/irecv of a step: the row says when the issuing call
            # returned and when the rank began to wait, in that order inside the operator
            steady = [k for k, i in enumerate(t["iteration"]) if i >= 1]
            assert all(t["wait_ns"][k] is not None for k in steady), r
            assert all(t["start_ns"][k] <= t["return_ns"][k] <= t["wait_ns"][k] <= t["end_ns"][k] for k in steady)
        # every send has its recv: same (comm_id, seq) on the two ends
        for r in range(WORLD - 1):
            a, b = job.ops(r).to_pydict(), job.ops(r + 1).to_pydict()
            sends = sorted((c, s) for c, o, s, p in zip(a["comm_id"], a["op"], a["seq"], a["peer"])
                           if o == "send" and p == r + 1)
            recvs = sorted((c, s) for c, o, s, p in zip(b["comm_id"], b["op"], b["seq"], b["peer"])
                           if o == "recv" and p == r)
            assert sends == recvs and len(sends) >= mb * STEPS
    _check_localized(slow, healthy, known_issue=LIVE)
