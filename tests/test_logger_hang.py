"""A real hang (issue #17): a 4-rank gloo job in which one rank stops inside its step while the
others enter the next all_reduce; the healthy ranks dump when the process group's timeout fires,
the stuck one on SIGTERM; ``holmes localize`` names the stuck rank."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
WORLD, STUCK, PG_TIMEOUT_S = 4, 2, 4


def _worker(rank: int, out: str, store: str, path: str = "namespace") -> None:
    """One rank: 4 steps of an all_reduce on the world and one on a pair; rank STUCK sleeps in step 2.
    ``path``: ``namespace`` calls ``dist.all_reduce``; ``dispatcher`` calls the process groups'
    ``allreduce`` (DDP's path: the dispatcher hook, compiled where it builds)."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    import holmes.logger

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=PG_TIMEOUT_S))
    pair = [dist.new_group([0, 1]), dist.new_group([2, 3])][rank // 2]
    lg = holmes.logger.CommOpsLogger(out, rank=rank, world_size=WORLD)
    lg.install_dump_handlers(("SIGTERM",), exceptions=False)
    world = dist.group.WORLD

    def all_reduce(t, group):
        if path == "namespace":
            dist.all_reduce(t, group=group)
        else:
            group.allreduce([t]).wait()

    try:
        with lg:
            for it in range(4):
                lg.step(it)
                all_reduce(torch.ones(256), pair)
                if rank == STUCK and it == 2:
                    Path(out, "stuck").write_text("1")
                    time.sleep(3600)  # the hang: this rank never enters the next collective
                all_reduce(torch.ones(1024), world)
    except RuntimeError as exc:  # the process group's timeout: the logger dumped on the way out
        print(f"rank {rank}: {exc}"[:200], file=sys.stderr)


@pytest.mark.torch
@pytest.mark.parametrize("path", ["namespace", "dispatcher"])
def test_stuck_rank_is_localized_from_the_logger_dumps(tmp_path, path):
    pytest.importorskip("torch")
    import holmes

    out, store = tmp_path / "job", tmp_path / "store"
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, __file__, str(r), str(out), str(store), path], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
             for r in range(WORLD)]
    try:
        deadline = time.monotonic() + 90
        healthy = [p for r, p in enumerate(procs) if r != STUCK]
        while any(p.poll() is None for p in healthy) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert all(p.poll() is not None for p in healthy), "healthy ranks did not dump after the timeout"
        stuck = procs[STUCK]
        assert stuck.poll() is None and (out / "stuck").exists()
        stuck.send_signal(signal.SIGTERM)
        stuck.wait(timeout=60)
        assert stuck.returncode == -signal.SIGTERM
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
    job = holmes.read_job(out)
    assert job.dump["reason"] == "timeout" and job.dump["at_ns"] > 0
    report = holmes.localize(job)
    assert report.verdict == "hang"
    assert report.hang["culprit_ranks"] == [STUCK]
    assert [d.id for d in report.devices] == [f"gpu:{STUCK}"]
    world = next(c for c in report.hang["communicators"] if c["missing"] == [STUCK] and len(c["waiting"]) == 3)
    assert world["op"] == "all_reduce" and world["waiting"] == [0, 1, 3]
    assert world["waited_s"] is not None and world["waited_s"] >= PG_TIMEOUT_S * 0.5
    assert f"rank {STUCK} never entered all_reduce" in report.to_text()


if __name__ == "__main__":
    _worker(int(sys.argv[1]), sys.argv[2], sys.argv[3], *sys.argv[4:5])
