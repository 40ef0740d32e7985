"""``holmes watch --metrics-port`` (Prometheus metrics) and ``--control`` (thresholds changed while running)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client", reason="needs prometheus_client (pip install 'holmes[metrics]')")

from holmes.cli.main import main
from holmes.errors import ConfigError
from holmes.simulate import run_simulation
from holmes.simulate.writer import write_result
from holmes.watch import Watcher
from holmes.watch.control import parse_control, read_control
from holmes.watch.metrics import WatchMetrics


@pytest.fixture(scope="module")
def two_spikes(tmp_path_factory):
    """gpu:5 slowed at iterations 22 and 40 (the first after the monitor's 20-iteration window: an
    earlier episode is judged once it is full); one iteration per part (the watcher reads 16 a loop)."""
    res = run_simulation(tp=2, pp=2, dp=2, iterations=54, seed=5, faults=["gpu:5@spike:22,40*3"])
    return write_result(res, tmp_path_factory.mktemp("m") / "job", parts=1)


def _value(text: str, name: str, labels: str = "") -> float:
    m = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, flags=re.M)
    assert m, f"{name}{labels} not in the exposition"
    return float(m.group(1))


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        assert r.status == 200
        return r.read().decode()


def _run(job, **kw):
    kw.setdefault("detector", "robust")
    kw.setdefault("straggler_check", False)
    w = Watcher(job, once=True, **kw)
    return w, list(w)


def test_metrics_served_and_scraped(two_spikes):
    m = WatchMetrics()
    w, events = _run(two_spikes, metrics=m)
    assert [(e.event, e.iteration) for e in events][:2] == [("irregular", 22), ("recovered", 27)]
    port = m.serve(0, addr="127.0.0.1")
    try:
        text = _scrape(port)
    finally:
        m.close()
    kinds = [e.event for e in events]
    assert _value(text, "holmes_events_total", '{event="irregular"}') == kinds.count("irregular") == 2
    assert _value(text, "holmes_events_total", '{event="recovered"}') == kinds.count("recovered")
    assert _value(text, "holmes_events_total", '{event="hang"}') == 0
    assert _value(text, "holmes_last_iteration") == w.last_iteration == 53
    assert _value(text, "holmes_delta") == pytest.approx(1.1) and _value(text, "holmes_window") == 100
    assert _value(text, "holmes_seconds_since_last_part") >= 0
    assert _value(text, "holmes_seconds_since_last_event") >= 0
    # the last event is a recovery: healthy, no device
    assert kinds[-1] == "recovered"
    assert _value(text, "holmes_verdict", '{verdict="healthy"}') == 1
    assert _value(text, "holmes_verdict", '{verdict="culprit"}') == 0 and _value(text, "holmes_verdict_code") == 0
    assert "holmes_device_score{" not in text


def test_device_metrics_follow_the_last_report(two_spikes):
    m = WatchMetrics()
    w, events = _run(two_spikes, metrics=m, recover_after=100)  # the episode never ends: the report stays
    first = events[0]
    assert first.event == "irregular"
    text = m.exposition()
    rep = events[-1].report
    named = rep["devices"] or rep["candidates"]
    assert named and named[0]["id"] == "gpu:5"
    labels = f'{{device="gpu:5",kind="gpu"}}'
    assert _value(text, "holmes_device_score", labels) == pytest.approx(named[0]["score"])
    assert _value(text, "holmes_device_confidence", labels) == pytest.approx(named[0]["confidence"])
    assert _value(text, "holmes_verdict", f'{{verdict="{rep["verdict"]}"}}') == 1


def test_control_file_applied_at_start_and_on_change(two_spikes, tmp_path):
    ctl = tmp_path / "control.json"
    ctl.write_text(json.dumps({"delta": 1.1}))
    seen = []

    def raise_delta(ev):
        seen.append((ev.event, ev.iteration))
        if ev.event == "irregular":  # after the first spike: no spike of 3x is irregular at delta 50,
            # and no periodic look (which compares every rank's cells whatever the delta)
            ctl.write_text(json.dumps({"delta": 50, "window": 30, "reevaluate_every": 0}))
            os.utime(ctl, ns=(time.time_ns(), time.time_ns() + 10**9))

    m = WatchMetrics()
    w = Watcher(two_spikes, once=True, detector="robust", straggler_check=False, control=ctl, metrics=m)
    w.run(raise_delta)
    assert [e for e in seen if e[0] == "irregular"] == [("irregular", 22)]
    assert w.monitor.delta == 50 and w.window == 30 and w.params.delta == 50 and w.reevaluate_every == 0
    text = m.exposition()
    assert _value(text, "holmes_delta") == 50 and _value(text, "holmes_window") == 30
    # without the change both spikes are events
    _, events = _run(two_spikes)
    assert [e.iteration for e in events if e.event == "irregular" and not e.detail.get("reevaluated")] == [22, 40]


def test_a_bad_control_file_changes_nothing(two_spikes, tmp_path):
    ctl = tmp_path / "control.json"
    ctl.write_text('{"delta": 0.5}')
    w = Watcher(two_spikes, once=True, detector="robust", straggler_check=False, control=ctl)
    events = list(w)
    assert w.monitor.delta == pytest.approx(1.1)
    assert any("control file not applied" in f and "delta" in f for e in events for f in e.findings)
    with pytest.raises(ConfigError, match="unknown key"):
        parse_control('{"delt": 1.2}')
    with pytest.raises(ConfigError, match="window must be an integer"):
        parse_control('{"window": 0}')
    ctl.write_text("[1]")
    with pytest.raises(ConfigError, match="JSON object"):
        read_control(ctl)
    assert parse_control('{"hang_after": null, "settle": 2}') == {"hang_after": None, "settle": 2.0}


def test_sighup_rereads_the_control_file():
    from holmes.cli.watch_cmd import _on_sighup

    calls = []
    restore = _on_sighup(lambda: calls.append(1))
    assert restore is not None
    try:
        os.kill(os.getpid(), signal.SIGHUP)
        for _ in range(100):
            if calls:
                break
            time.sleep(0.01)
    finally:
        restore()
    assert calls == [1]


def test_cli_metrics_port_and_control(two_spikes, tmp_path, capsys):
    ctl = tmp_path / "c.json"
    ctl.write_text('{"delta": 1.1}')
    port = _free_port()
    assert main(["watch", str(two_spikes), "--once", "--detector", "robust", "--metrics-port", str(port),
                 "--metrics-addr", "127.0.0.1", "--control", str(ctl)]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["iteration"] for x in lines if x["event"] == "irregular"] == [22, 40]
    with pytest.raises(OSError):  # the server stopped with the command
        _scrape(port)
    assert main(["watch", str(two_spikes), "--once", "--metrics-port", "99999"]) == 2
    assert "port must be" in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PROMETHEUS = shutil.which("prometheus")


@pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus binary on PATH (Debian: apt-get install prometheus); "
                                               "the exporter is still tested by scraping it with urllib")
def test_a_real_prometheus_server_scrapes_the_exporter(two_spikes, tmp_path):
    m = WatchMetrics()
    w, events = _run(two_spikes, metrics=m)
    port = m.serve(0, addr="127.0.0.1")
    web = _free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n  - job_name: holmes\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{port}']\n")
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{web}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        got = None
        deadline = time.monotonic() + 90
        query = f"http://127.0.0.1:{web}/api/v1/query?query=holmes_events_total"
        while time.monotonic() < deadline and got is None:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            try:
                with urllib.request.urlopen(query, timeout=5) as r:
                    res = json.loads(r.read())["data"]["result"]
                got = {x["metric"]["event"]: float(x["value"][1]) for x in res} or None
            except OSError:
                pass
            if got is None:
                time.sleep(0.5)
        assert got is not None, "Prometheus never scraped the exporter"
        assert got["irregular"] == sum(e.event == "irregular" for e in events) == 2 and got["hang"] == 0
        assert all(x["metric"]["job"] == "holmes" for x in res)
        with urllib.request.urlopen(f"http://127.0.0.1:{web}/api/v1/query?query=holmes_last_iteration",
                                    timeout=5) as r:
            assert float(json.loads(r.read())["data"]["result"][0]["value"][1]) == w.last_iteration
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        m.close()
