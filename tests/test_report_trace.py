"""``holmes report JOB --trace out.json``: a Chrome trace (Trace Event Format) of the window, named devices first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import holmes
from holmes.cli.main import main
from holmes.report.trace import chrome_trace

FIX = Path(__file__).resolve().parents[1] / "fixtures"
SLOW = FIX / "gpu64-3d-slow-gpu"

needs_fixture = pytest.mark.skipif(not (SLOW / "job.json").is_file(), reason="fixture gpu64-3d-slow-gpu not present")


def _check_format(tr: dict) -> None:
    """What the Trace Event Format (JSON object form) requires of every event Perfetto imports."""
    assert isinstance(tr["traceEvents"], list) and tr["displayTimeUnit"] in ("ms", "ns")
    for e in tr["traceEvents"]:
        assert isinstance(e["name"], str) and e["ph"] in ("X", "M", "i")
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] == "X":
            assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0
        if e["ph"] == "i":
            assert e["s"] in ("g", "p", "t")
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "process_sort_index", "thread_name")


@needs_fixture
def test_cli_writes_a_trace_with_the_named_rank_first(tmp_path, capsys):
    out = tmp_path / "trace.json"
    assert main(["report", str(SLOW), "--trace", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    tr = json.loads(out.read_text())
    _check_format(tr)
    ev = tr["traceEvents"]
    sort = {e["pid"]: e["args"]["sort_index"] for e in ev if e["name"] == "process_sort_index"}
    assert min(sort, key=sort.get) == 21 and len(sort) <= 32
    names = {e["pid"]: e["args"]["name"] for e in ev if e["name"] == "process_name"}
    assert names[21] == "rank 21 - NAMED: gpu:21" and all("NAMED" not in n for p, n in names.items() if p != 21)
    assert tr["metadata"]["named_devices"] == ["gpu:21"] and len(tr["metadata"]["iterations"]) <= 20
    # the straggler's compute (tid 2) is longer than any other traced rank's over the same iterations
    comp: dict[int, float] = {}
    for e in ev:
        if e["ph"] == "X" and e["tid"] == 2:
            comp[e["pid"]] = comp.get(e["pid"], 0.0) + e["dur"]
    assert max(comp, key=comp.get) == 21
    assert all("named" in e["cat"] for e in ev if e["ph"] == "X" and e["pid"] == 21 and e["tid"] in (1, 2))
    # the pivot's irregular iterations are marked
    marks = [e for e in ev if e["ph"] == "i"]
    report_irr = set(json.loads(_localize_json(capsys))["irregular_iterations"])
    assert marks and all(int(e["name"].split()[2]) in report_irr for e in marks)
    ops = [e for e in ev if e["ph"] == "X" and e["tid"] == 1]
    assert {"comm_id", "seq", "nbytes", "iteration"} <= set(ops[0]["args"])


def _localize_json(capsys) -> str:
    assert main(["localize", str(SLOW), "--format", "json", "-q"]) == 0
    return capsys.readouterr().out


@needs_fixture
def test_html_and_trace_together_and_bad_arguments(tmp_path, capsys):
    html, tr = tmp_path / "r.html", tmp_path / "t.json"
    assert main(["report", str(SLOW), "-o", str(html), "--trace", str(tr), "--trace-ranks", "3",
                 "--trace-iterations", "2"]) == 0
    assert capsys.readouterr().out.split() == [str(html), str(tr)]
    meta = json.loads(tr.read_text())["metadata"]
    assert len(meta["ranks"]) == 3 and len(meta["iterations"]) == 2 and meta["ranks"][0] == 21
    assert "<!DOCTYPE html>" in html.read_text()
    assert main(["report", str(SLOW)]) == 2  # neither output
    assert "-o REPORT.html, --trace" in capsys.readouterr().err
    assert main(["report", str(SLOW), "--trace", str(tr)]) == 2  # exists: only with --overwrite
    capsys.readouterr()
    assert main(["report", str(SLOW), "--trace", str(SLOW / "trace.json")]) == 2  # never inside the job
    assert not (SLOW / "trace.json").exists()


def test_healthy_job_traces_the_last_iterations():
    path = FIX / "gpu16-clean"
    if not (path / "job.json").is_file():
        pytest.skip("fixture gpu16-clean not present")
    job = holmes.read_job(path)
    report = holmes.localize(job)
    tr = chrome_trace(report, job, max_ranks=4, max_iterations=5)
    _check_format(tr)
    assert tr["metadata"]["iterations"] == report.window[-5:]
    assert not any("NAMED" in e["args"]["name"] for e in tr["traceEvents"] if e["name"] == "process_name")
    with pytest.raises(ValueError):
        chrome_trace(report, job, max_ranks=0)
