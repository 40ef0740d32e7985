"""holmes.watch: events from a live job's parts (late, out of order, truncated, never), the CLI, hangs."""

from __future__ import annotations

import gc
import json
import queue
import shutil
import threading
import time
from collections import deque

import pyarrow as pa
import pytest

import holmes
from holmes.errors import ConfigError, JobError
from holmes.io.parts import list_parts
from holmes.logger import CommOpsRecorder
from holmes.simulate import run_simulation
from holmes.simulate.writer import write_result
from holmes.watch import PartsFollower, Watcher, WatchEvent, watchdog_available


@pytest.fixture(scope="module")
def spiky(tmp_path_factory):
    res = run_simulation(tp=2, pp=2, dp=2, iterations=50, seed=5, faults=["gpu:5@spike:30*3"])
    return write_result(res, tmp_path_factory.mktemp("w") / "job", parts=5)


def _top(rep):
    """The best device a report names or proposes."""
    return (rep["devices"] or rep["candidates"])[0]["id"]


def _events(job, **kw):
    kw.setdefault("detector", "robust")
    kw.setdefault("straggler_check", False)
    return [e for e in Watcher(job, once=True, **kw)]


def test_irregular_then_recovered(spiky):
    ev = _events(spiky)
    assert [(e.event, e.iteration) for e in ev] == [("irregular", 30), ("recovered", 35)]
    rep = ev[0].report
    assert rep["verdict"] in ("culprit", "inconclusive") and _top(rep) == "gpu:5"
    line = json.loads(ev[0].to_json())
    assert line["event"] == "irregular" and line["iteration"] == 30 and line["detail"]["settled"] is True


def test_single_file_job_and_callback(tmp_path):
    res = run_simulation(tp=2, pp=1, dp=2, iterations=40, seed=2, faults=["gpu:3@spike:30*4"])
    d = write_result(res, tmp_path / "job")
    got = []
    assert holmes.watch(d, once=True, detector="robust", straggler_check=False).run(got.append) == 2
    assert got[0].event == "irregular" and _top(got[0].report) == "gpu:3"


def test_truncated_and_missing_pivot_parts(spiky, tmp_path):
    d = shutil.copytree(spiky, tmp_path / "job")
    p = d / "ranks" / "rank-00000" / "part-000002.parquet"  # iterations 10..14 of the pivot
    p.write_bytes(p.read_bytes()[:50])
    (d / "ranks" / "rank-00000" / "part-000004.parquet").unlink()  # iterations 20..24 never arrive
    ev = _events(d)
    assert [(e.event, e.iteration) for e in ev] == [("irregular", 30), ("recovered", 35)]
    text = " ".join(ev[0].findings)
    assert "part-000002.parquet" in text and "part(s) 4..4 missing" in text


def test_late_part_of_another_rank_is_waited_for(spiky, tmp_path):
    d = shutil.copytree(spiky, tmp_path / "job")
    late = d / "ranks" / "rank-00005" / "part-000006.parquet"  # holds the faulty iteration 30
    hidden = tmp_path / "late.parquet"
    late.rename(hidden)
    w = Watcher(d, detector="robust", straggler_check=False, interval=0.05, settle=30.0, use_watchdog=False,
                idle_exit=None)
    out = []
    th = w.start(out.append)
    time.sleep(1.0)
    assert out == []  # the analysis waits for rank 5's part
    hidden.rename(late)
    for _ in range(200):
        if len(out) >= 2:
            break
        time.sleep(0.05)
    w.stop()
    th.join(10)
    assert [e.event for e in out] == ["irregular", "recovered"]
    assert out[0].detail["settled"] is True and _top(out[0].report) == "gpu:5"


def test_settle_timeout_names_missing_ranks(spiky, tmp_path):
    d = shutil.copytree(spiky, tmp_path / "job")
    for p in list_parts(d / "ranks" / "rank-00007", 6):
        p.path.unlink()
    w = Watcher(d, detector="robust", straggler_check=False, interval=0.05, settle=0.3, use_watchdog=False,
                idle_exit=1.0)
    ev = list(w)
    assert ev[0].event == "irregular" and ev[0].detail["settled"] is False
    assert any("[7]" in f for f in ev[0].findings)


def test_followed_rank_part_read_by_its_consumer_first_still_counts(tmp_path):
    from holmes.io.parts import write_part
    from holmes.io.schema import ops_table

    f = PartsFollower(tmp_path, world_size=2, follow=(0,), use_watchdog=False)
    for r in (0, 1):
        t = ops_table(rank=[r], iteration=[0], op_index=[0], comm_id=["dp-0"], seq=[0], op=["all_reduce"],
                      peer=[None], nbytes=[4], start_ns=[0], end_ns=[5])
        write_part(tmp_path / "ranks" / f"rank-{r:05d}", 0, t)
    f.next_needed[0] = 1  # the watcher listed and read the pivot's part 0 before this poll
    f.poll(0.0)
    assert f.reached(0) == 2 and f.behind(0) == []


def test_parts_landing_together_are_judged_without_waiting_for_settle(spiky, tmp_path, monkeypatch):
    # a live job: every rank's next part lands right after the follower's scan, so the watcher's own
    # listing reads the pivot's part first; the analysis must still see every rank landed (settle
    # never expires here: the old follower left it waiting until the job ended, unsettled)
    d = tmp_path / "job"
    (d / "ranks").mkdir(parents=True)
    for name in ("job.json", "topology.json"):
        shutil.copy(spiky / name, d / name)
    ranks = sorted(p.name for p in (spiky / "ranks").iterdir())
    rounds = iter(range(len(list_parts(spiky / "ranks" / ranks[0]))))
    orig = PartsFollower.poll

    def poll_then_land(self, timeout=0.0):
        got = orig(self, timeout)
        k = next(rounds, None)
        if k is not None:
            for r in ranks:
                src = list_parts(spiky / "ranks" / r, k)[0]
                (d / "ranks" / r).mkdir(exist_ok=True)
                tmp = d / "ranks" / r / f".{src.path.name}.partial"
                shutil.copy(src.path, tmp)
                tmp.replace(d / "ranks" / r / src.path.name)
        return got

    monkeypatch.setattr(PartsFollower, "poll", poll_then_land)
    ev = list(Watcher(d, detector="robust", straggler_check=False, interval=0.01, settle=3600.0,
                      use_watchdog=False, idle_exit=1.0))
    assert [(e.event, e.iteration) for e in ev] == [("irregular", 30), ("recovered", 35)]
    assert ev[0].detail["settled"] is True and _top(ev[0].report) == "gpu:5"
    assert not any("had not landed" in f for f in ev[0].findings)


@pytest.mark.skipif(not watchdog_available(), reason="watchdog not installed")
def test_follower_with_filesystem_events(tmp_path):
    from holmes.io.parts import write_part
    from holmes.io.schema import ops_table

    (tmp_path / "ranks").mkdir()
    f = PartsFollower(tmp_path, world_size=3, use_watchdog=True, rescan=3600)
    assert f.poll(0.0) == [] and f.mode == "watchdog"
    t = ops_table(rank=[2], iteration=[0], op_index=[0], comm_id=["dp-0"], seq=[0], op=["all_reduce"],
                  peer=[None], nbytes=[4], start_ns=[0], end_ns=[5])
    write_part(tmp_path / "ranks" / "rank-00002", 0, t)
    got = []
    for _ in range(50):
        got += f.poll(0.1)
        if got:
            break
    f.close()
    assert (2, 0) in got and f.reached(0) == 1


def test_live_logger_job_hang_and_end(tmp_path):
    recs = [CommOpsRecorder(tmp_path, rank=r, world_size=2, parts_every=2) for r in (0, 1)]
    for it in range(8):
        for rec in recs:
            rec.add_communicator("dp-0", [0, 1], kind="dp")
            rec.step(it)
            rec.record("dp-0", "all_reduce", nbytes=8, start_ns=10**6 * it, end_ns=10**6 * it + 10)
    assert "job.json" not in [p.name for p in tmp_path.iterdir()]  # live: metadata from the sidecars
    assert _events(tmp_path) == []
    recs[0].begin("dp-0", "all_reduce", nbytes=8, start_ns=10**7)
    recs[0].dump("timeout")
    recs[1].dump("signal")
    from holmes.logger import finalize_job

    finalize_job(tmp_path, allow_missing=True, validate=False)
    ev = list(Watcher(tmp_path, detector="robust", straggler_check=False, interval=0.05, use_watchdog=False))
    assert [e.event for e in ev] == ["hang"] and ev[0].report["verdict"] == "hang"


def test_stall_event_and_bad_arguments(spiky, tmp_path):
    w = Watcher(spiky, detector="robust", straggler_check=False, interval=0.05, hang_after=0.2, idle_exit=0.6,
                use_watchdog=False)
    kinds = [e.event for e in w]
    assert kinds[-1] == "hang" and "irregular" in kinds
    with pytest.raises(JobError, match="not a job directory"):
        Watcher(tmp_path / "nope")
    with pytest.raises(ConfigError, match="window"):
        Watcher(spiky, window=0)
    with pytest.raises(ConfigError, match="event must be one of"):
        WatchEvent("boom", 1)


def test_cli_prints_json_lines(spiky, capsys):
    from holmes.cli.main import main

    assert main(["watch", str(spiky), "--once", "--detector", "robust"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["event"] for x in lines][:2] == ["irregular", "recovered"]
    assert main(["watch", str(spiky) + "-missing", "--once"]) == 2


def test_stop_from_another_thread(spiky):
    w = Watcher(spiky, detector="robust", interval=0.05, use_watchdog=False, straggler_check=False)
    threading.Timer(0.5, w.stop).start()
    t0 = time.monotonic()
    list(w)
    assert time.monotonic() - t0 < 20


def test_ctrl_c_stops_the_cli_cleanly(spiky):
    import os
    import signal
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-m", "holmes", "watch", str(spiky), "--interval", "0.1",
                          "--detector", "robust", "--polling"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"},
                         # a test run in the background of a non-interactive shell (`cmd &`) inherits
                         # SIGINT ignored, and Python then keeps ignoring it: restore Ctrl-C
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    first = p.stdout.readline()  # the first event: the loop is running
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert json.loads(first)["event"] == "irregular"
    assert p.returncode == 130 and "Traceback" not in err and err.strip() == "holmes: interrupted"


def _retained(w):
    """How many elements the watcher's, its follower's and its monitor's containers hold (one
    level deep: a dict of lists counts the lists' elements)."""
    out = {}
    for name, obj in (("watcher", w), ("follower", w._follower), ("monitor", w.monitor)):
        for k, v in vars(obj).items():
            if isinstance(v, queue.SimpleQueue):
                out[f"{name}.{k}"] = v.qsize()
            elif isinstance(v, (dict, list, deque, set)):
                inner = v.values() if isinstance(v, dict) else v
                out[f"{name}.{k}"] = len(v) + sum(len(x) for x in inner if isinstance(x, (dict, list, deque, set)))
    return out


def test_retained_state_is_bounded(tmp_path):
    # 300 iterations in parts of one: the watcher's containers, and the Arrow memory held once an
    # analysis is done, must not grow with the parts read nor with the analyses run
    res = run_simulation(tp=2, pp=1, dp=2, iterations=300, seed=3,
                         faults=["gpu:1@spike:70*3", "gpu:2@spike:150*3", "gpu:3@spike:230*3", "gpu:0@spike:280*3"])
    d = write_result(res, tmp_path / "job", parts=1)
    w = Watcher(d, once=True, detector="robust", straggler_check=False, window=10, use_watchdog=False)
    seen, arrow = [], []
    gc.collect()
    gc.disable()  # what an analysis leaves behind must be freed by reference counting alone
    try:
        for ev in w:
            seen.append((ev.event, ev.iteration, w.last_iteration, _retained(w)))
            if ev.event == "irregular":
                arrow.append(pa.total_allocated_bytes())
    finally:
        gc.enable()
    irregular = [i for e, i, _, _ in seen if e == "irregular"]
    assert {70, 230, 280} <= set(irregular) and len(arrow) >= 4, irregular  # analyses did run
    assert w.last_iteration == 299
    early = [r for _, _, last, r in seen if last < 150]  # the first half of the parts, then the second
    late = [r for _, _, last, r in seen if last >= 150]
    assert early and late
    top = {k: max(r.get(k, 0) for r in early) for r in late for k in r}
    grown = {k: (top[k], n) for r in late for k, n in r.items() if n > top[k] and k != "watcher._ready"}
    assert not grown, f"watcher state grew with the parts read: {grown}"
    assert 0 < len(w._parts_seen) <= 2 * 10 + 64  # a ring of the parts read, not all 300
    assert not w._ready and not w._pending  # the events' queue (one loop's events) was drained
    # one part's worth of slack: no window's tables outlive its analysis
    assert max(arrow) - arrow[0] < 64 * 1024, [a - arrow[0] for a in arrow]


def test_early_episode_waits_for_the_monitor_window_but_not_for_a_stall(tmp_path):
    """An episode opening before the monitor's window is full is judged once it is, over the job so
    far; a job that stalls first never fills it: the episode is judged at once, before the stall."""
    res = run_simulation(tp=2, pp=2, dp=2, iterations=12, seed=5, faults=["gpu:5@spike:6*3"])
    d = write_result(res, tmp_path / "job", parts=3)
    w = Watcher(d, detector="robust", straggler_check=False, interval=0.05, hang_after=0.3, use_watchdog=False)
    stopped = []
    guard = threading.Timer(60, lambda: (stopped.append(1), w.stop()))
    guard.start()
    got = []
    try:
        for e in w:
            got.append(e)
            if e.event == "hang":
                break
    finally:
        guard.cancel()
    assert not stopped, "the stall never came out while the job was still being watched"
    assert [(e.event, e.iteration) for e in got][:1] == [("irregular", 6)]
    assert got[-1].event == "hang" and got[-1].report["verdict"] == "stalled"
    first = got[0]
    assert first.detail["window"] == [0, 11] and first.detail["judged_at"] == 11
    assert _top(first.report) == "gpu:5"
    # the same job read to its end: the episode is judged over the job so far (its 12 iterations)
    ev = _events(d)
    assert ev[0].event == "irregular" and ev[0].iteration == 6 and ev[0].detail["judged_at"] == 11
