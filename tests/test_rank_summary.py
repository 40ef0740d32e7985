"""The per-rank summary (issue #37): compute, waiting and transfer per step against peers, in JSON, text and HTML."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import holmes
from holmes.cli.main import main
from holmes.io import MemoryJob
from holmes.io.schema import ops_table
from holmes.localize.evidence.rank_summary import SUMMARY_KEYS, pipeline_stages, rank_summary

FIX = Path(__file__).resolve().parents[1] / "fixtures"
MS = 1_000_000


def _two_ranks(skew_ns: int = 0):
    """Rank 1 computes 3 ms more than rank 0 before each all_reduce (1 ms of transfer); its own clock
    is shifted by ``skew_ns`` (hosts need not share a clock)."""
    t0, t1 = {k: [] for k in ("it", "seq", "s", "e")}, {k: [] for k in ("it", "seq", "s", "e")}
    now = 0
    for it in range(10):
        a0, a1 = now + 5 * MS, now + 8 * MS   # rank 0 arrives at 5 ms, rank 1 at 8 ms
        end = a1 + 1 * MS                     # then 1 ms of transfer for both
        for t, start, sh in ((t0, a0, 0), (t1, a1, skew_ns)):
            t["it"].append(it), t["seq"].append(it), t["s"].append(start + sh), t["e"].append(end + sh)
        now = end
    tables = {}
    for r, t in ((0, t0), (1, t1)):
        n = len(t["it"])
        tables[r] = ops_table(rank=[r] * n, iteration=t["it"], op_index=[0] * n, comm_id=["dp-0"] * n, seq=t["seq"],
                              op=["all_reduce"] * n, peer=[None] * n, nbytes=[8] * n, start_ns=t["s"], end_ns=t["e"])
    return tables


@pytest.mark.parametrize("skew", [0, 123_456_789])
def test_waiting_and_transfer_of_a_collective(skew):
    rows = {x["rank"]: x for x in rank_summary(_two_ranks(skew))}
    assert set(rows[0]) == set(SUMMARY_KEYS)
    # rank 0 waits 3 ms for rank 1 in every all_reduce; both transfer 1 ms; rank 1 computes 8 ms a step, rank 0 5
    assert rows[0]["waiting_ms"] == pytest.approx(3.0) and rows[1]["waiting_ms"] == pytest.approx(0.0)
    assert rows[0]["transfer_ms"] == pytest.approx(1.0) == rows[1]["transfer_ms"]
    assert rows[1]["compute_ms"] == pytest.approx(8.0) and rows[0]["compute_ms"] == pytest.approx(5.0)
    assert rows[1]["peers_compute_ms"] == pytest.approx(5.0) and rows[1]["compute_vs_peers"] == pytest.approx(1.6)
    assert rows[0]["steps"] == 10


def test_p2p_pairs_and_window():
    # rank 0 sends to rank 1: rank 1 posts its recv 2 ms early and waits
    n = 4
    send = ops_table(rank=[0] * n, iteration=list(range(n)), op_index=[0] * n, comm_id=["pp-0"] * n,
                     seq=list(range(n)), op=["send"] * n, peer=[1] * n, nbytes=[8] * n,
                     start_ns=[10 * MS * i + 3 * MS for i in range(n)], end_ns=[10 * MS * i + 4 * MS for i in range(n)])
    recv = ops_table(rank=[1] * n, iteration=list(range(n)), op_index=[0] * n, comm_id=["pp-0"] * n,
                     seq=list(range(n)), op=["recv"] * n, peer=[0] * n, nbytes=[8] * n,
                     start_ns=[10 * MS * i + 1 * MS for i in range(n)], end_ns=[10 * MS * i + 4 * MS for i in range(n)])
    rows = {x["rank"]: x for x in rank_summary({0: send, 1: recv}, window=[1, 2])}
    assert rows[1]["waiting_ms"] == pytest.approx(2.0) and rows[1]["transfer_ms"] == pytest.approx(1.0)
    assert rows[0]["waiting_ms"] == pytest.approx(0.0) and rows[0]["steps"] == 2


def test_stages_are_the_pp_positions():
    job = holmes.read_job(FIX / "gpu16-clean")
    st = pipeline_stages(job.communicators)
    assert sorted(set(st.values())) == [0, 1] and len(st) == 16


def test_report_json_text_and_html_name_the_slow_rank(capsys):
    path = FIX / "gpu64-3d-slow-gpu"
    if not (path / "job.json").is_file():
        pytest.skip("fixture not present")
    assert main(["localize", str(path), "--format", "json", "-q"]) == 0
    d = json.loads(capsys.readouterr().out)
    rows = d["rank_summary"]
    assert len(rows) == d["fetched_ranks"] == 64
    worst = max(rows, key=lambda x: x["compute_vs_peers"])
    assert worst["rank"] == 21 and worst["compute_vs_peers"] > 1.5
    others = [x["compute_vs_peers"] for x in rows if x["rank"] != 21]
    assert max(others) < 1.05 and min(others) > 0.95
    # the straggler waits least: its peers wait for it
    assert worst["waiting_ms"] < 0.5 * worst["peers_waiting_ms"]
    job = holmes.read_job(path)
    report = holmes.localize(job)
    text = report.to_text()
    block = text.split("Per-rank time per step")[1].split("Root causes")[0]
    assert "      21     1           79.7 (44.4)" in block and block.count("\n") == 8  # header + 6 rows + 1
    assert len(report.to_text(show_all=True).split("Per-rank time per step")[1].split("Root causes")[0]
               .splitlines()) == 2 + 64
    html = report.to_html(job=job)
    table = html.split('id="rank-table"')[1].split("</table>")[0]
    assert '<tr class="named" data-rank="21">' in table and table.count("<tr") == 1 + 32


def test_hang_report_has_no_summary():
    meta = {"world_size": 2, "communicators": {"dp-0": {"kind": "dp", "ranks": [0, 1]}},
            "dump": {"reason": "signal", "at_ns": 1}}
    t = {r: ops_table(rank=[r, r], iteration=[0, 1], op_index=[0, 0], comm_id=["dp-0"] * 2, seq=[0, 1],
                      op=["all_reduce"] * 2, peer=[None] * 2, nbytes=[8] * 2, start_ns=[0, 10],
                      end_ns=[5, None], state=["completed", "started"]) for r in (0,)}
    t[1] = ops_table(rank=[1], iteration=[0], op_index=[0], comm_id=["dp-0"], seq=[0], op=["all_reduce"], peer=[None],
                     nbytes=[8], start_ns=[0], end_ns=[5], state=["completed"])
    r = holmes.localize(MemoryJob(meta, t))
    assert r.verdict == "hang" and r.rank_summary == [] and r.to_json()["rank_summary"] == []


def test_a_pipelines_async_sends_are_not_read_as_transfer_time():
    # gloo completes an isend only when torch.distributed.pipelining waits on it, at the end of
    # the step: the sends' copies lasted most of the step, and the shortest copy of each pair was
    # the receive, which waited for the sender's compute. A pair whose send began within the
    # receive transfers from the send's start to the receive's end: in this healthy GPipe capture
    # (4 ranks, 4 micro-batches of 8 x 128 floats) the middle stages read 16 ms of "transfer"
    # per step before, 6-8 ms now, the rest waiting
    from holmes.localize.evidence.rank_summary import rank_summary_of_job

    rows = rank_summary_of_job(holmes.read_job(Path(__file__).parent / "data" / "gloo_setups" / "gpipe" / "healthy"))
    assert [r["stage"] for r in rows] == [0, 1, 2, 3]
    for r in rows:
        assert r["transfer_ms"] < r["waiting_ms"], r
    assert max(r["transfer_ms"] for r in rows) < 10.0
