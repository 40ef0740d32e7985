"""The wait-for graph of a hang (issue #34): pipelines, P2P, batched P2P, dead ranks, deadlocks; the
ranks that merely waited are never named."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import holmes
from holmes.io import MemoryJob
from holmes.io.schema import ops_table
from holmes.localize.hang.waitgraph import wait_graph

C, S, Q = "completed", "started", "scheduled"


def _log(r: int, ops: list[tuple[str, str, int | None, str]]) -> object:
    """A rank's log from ``(op, comm_id, peer, state)`` in issue order (seq numbered as CommOps does)."""
    cnt: Counter = Counter()
    seqs = []
    for op, cid, peer, _ in ops:
        k = (cid,) if peer is None else (cid, op, peer)
        seqs.append(cnt[k])
        cnt[k] += 1
    n = len(ops)
    return ops_table(rank=[r] * n, iteration=[0] * n, op_index=list(range(n)), comm_id=[o[1] for o in ops],
                     seq=seqs, op=[o[0] for o in ops], peer=[o[2] for o in ops], nbytes=[8] * n,
                     start_ns=[100 * i for i in range(n)],
                     end_ns=[100 * i + 50 if o[3] == C else None for i, o in enumerate(ops)],
                     state=[o[3] for o in ops])


def _hang(world: int, comms: dict[str, list[int]], logs: dict[int, list]) -> holmes.Report:
    meta = {"world_size": world, "communicators": {k: {"kind": k.split("-")[0], "ranks": v} for k, v in comms.items()},
            "dump": {"reason": "timeout", "at_ns": 10_000}}
    return holmes.localize(MemoryJob(meta, {r: _log(r, ops) for r, ops in logs.items()}), analysis="hang")


def test_the_issue_example_chain_to_a_rank_without_log():
    # rank 0 waits in recv from 4; 4 waits in all_reduce tp-1 for 5; 5 wrote no log
    comms = {"pp-0": [0, 4], "tp-1": [4, 5]}
    report = _hang(6, comms, {0: [("recv", "pp-0", 4, C), ("recv", "pp-0", 4, S)],
                              4: [("send", "pp-0", 0, C), ("all_reduce", "tp-1", None, S)],
                              1: [], 2: [], 3: []})
    h = report.to_json()["hang"]
    assert report.verdict == "hang" and h["culprit_ranks"] == [5] and h["deadlock"] is None
    assert [d.id for d in report.devices] == ["gpu:5"]
    assert h["wait_chains"] == [[[0, "recv", "pp-0", 1, 4], [4, "all_reduce", "tp-1", 0, 5]]]
    assert "rank 0 waits in recv #1 from 4 (pp-0); 4 waits in all_reduce #0 of tp-1 for 5; 5 wrote no log" \
        in h["explanation"]
    tp = next(c for c in h["communicators"] if c["comm_id"] == "tp-1")
    assert tp["missing"] == [5] and tp["waiting"] == [4] and tp["waiting_for"] == [5]
    assert h["root_kinds"] == {"5": "no_log"} and h["waiting_count"] == 2


def test_pipeline_victims_downstream_of_a_stuck_stage_are_not_named():
    # PP 3 x DP 2: stage 1 of replica 0 (rank 1) stopped in compute; rank 0 blocks in its send to 1,
    # rank 2 in its recv from 1, and the other replica's ranks in the dp all_reduce
    comms = {"pp-0": [0, 1, 2], "pp-1": [3, 4, 5], "dp-0": [0, 3], "dp-1": [1, 4], "dp-2": [2, 5]}
    report = _hang(6, comms, {
        0: [("send", "pp-0", 1, C), ("send", "pp-0", 1, S)],
        1: [("recv", "pp-0", 0, C), ("send", "pp-0", 2, C)],
        2: [("recv", "pp-0", 1, C), ("recv", "pp-0", 1, S)],
        3: [("send", "pp-1", 4, C), ("send", "pp-1", 4, C), ("all_reduce", "dp-0", None, S)],
        4: [("recv", "pp-1", 3, C), ("send", "pp-1", 5, C), ("recv", "pp-1", 3, C), ("send", "pp-1", 5, C),
            ("all_reduce", "dp-1", None, S)],
        5: [("recv", "pp-1", 4, C), ("recv", "pp-1", 4, C), ("all_reduce", "dp-2", None, S)]})
    h = report.to_json()["hang"]
    assert h["culprit_ranks"] == [1] and [d.id for d in report.devices] == ["gpu:1"]
    assert h["root_kinds"] == {"1": "idle"} and h["waiting_count"] == 5 and h["behind"] == {"1": 5}
    chains = {c[0][0]: c for c in h["wait_chains"]}
    assert chains[3] == [[3, "all_reduce", "dp-0", 0, 0], [0, "send", "pp-0", 1, 1]]
    assert chains[5][-1][4] == 1


def test_batched_p2p_waits_for_the_half_never_posted():
    # batch_isend_irecv: rank 0 posted send->1 and recv<-1 together; rank 1 posted recv<-0 and then
    # stopped (no send); rank 2 waits for rank 0 in a collective
    comms = {"pp-0": [0, 1], "dp-0": [0, 2]}
    report = _hang(3, comms, {0: [("send", "pp-0", 1, S), ("recv", "pp-0", 1, S)],
                              1: [("recv", "pp-0", 0, C)],
                              2: [("all_reduce", "dp-0", None, S)]})
    h = report.to_json()["hang"]
    assert h["culprit_ranks"] == [1] and h["waiting_count"] == 2
    assert h["wait_chains"] == [[[2, "all_reduce", "dp-0", 0, 0], [0, "recv", "pp-0", 0, 1]]]


def test_opposite_send_order_is_a_deadlock():
    # two stages both send first (rendezvous): each waits for the other's recv
    comms = {"pp-0": [0, 1], "dp-0": [1, 2]}
    report = _hang(3, comms, {0: [("send", "pp-0", 1, S)], 1: [("send", "pp-0", 0, S)],
                              2: [("all_reduce", "dp-0", None, S)]})
    h = report.to_json()["hang"]
    assert report.verdict == "hang" and h["deadlock"] == [0, 1] and h["culprit_ranks"] == [0, 1]
    assert {d.id for d in report.devices} == {"gpu:0", "gpu:1"}
    assert any(s.startswith("deadlock: ranks 0-1") for s in h["explanation"])
    assert any("deadlock" in a for a in report.assumptions)
    assert h["wait_chains"][0][0] == [2, "all_reduce", "dp-0", 0, 1]


def test_a_rank_whose_peer_completed_the_matching_op_stopped_inside_it():
    # rank 1's recv #0 never completed although rank 0 completed the send: rank 1's device stopped
    comms = {"pp-0": [0, 1], "dp-0": [0, 2]}
    report = _hang(3, comms, {0: [("send", "pp-0", 1, C), ("all_reduce", "dp-0", None, C),
                                  ("send", "pp-0", 1, S)],
                              1: [("recv", "pp-0", 0, S)],
                              2: [("all_reduce", "dp-0", None, C)]})
    h = report.to_json()["hang"]
    assert h["culprit_ranks"] == [1] and h["root_kinds"] == {"1": "stalled"}
    assert h["waiting_count"] == 1


def test_a_collective_everyone_entered_names_them_all_below_the_naming_bar():
    comms = {"dp-0": [0, 1]}
    report = _hang(2, comms, {0: [("all_reduce", "dp-0", None, S)], 1: [("all_reduce", "dp-0", None, S)]})
    h = report.to_json()["hang"]
    assert report.verdict == "hang" and h["culprit_ranks"] == [0, 1] and report.devices == []
    assert h["root_kinds"] == {"0": "inside", "1": "inside"}


def test_graph_scales_linearly_in_the_waiting():
    # 4,096 ranks waiting for one that never entered a world collective: one node, 4,096 edges
    W = 4096
    g = wait_graph(rank=np.arange(1, W), comm=np.zeros(W - 1, np.int64), seq=np.zeros(W - 1, np.int64),
                   op=np.zeros(W - 1, np.int64), op_names=["all_reduce"], peer=np.full(W - 1, -1),
                   start=np.zeros(W - 1, np.int64), is_open=np.ones(W - 1, bool), members={0: range(W)},
                   world_size=W, comm_names=["dp-0"])
    assert g.roots == [0] and len(g.waiting) == W - 1 and len(g.nodes) == 1
    end, depth = g.ends()
    assert (end[1:] == 0).all() and (depth[1:] == 1).all()
    assert g.chain(7) == [(7, "all_reduce", "dp-0", 0, 0)]


@pytest.mark.parametrize("world", [3])
def test_every_rank_waiting_for_a_no_log_rank_in_p2p(world):
    report = _hang(world, {"pp-0": [0, 1, 2]}, {0: [("send", "pp-0", 1, S)], 2: [("recv", "pp-0", 1, S)]})
    h = report.to_json()["hang"]
    assert h["culprit_ranks"] == [1] and h["ranks_without_log"] == [1]
    assert report.devices[0].id == "gpu:1" and report.devices[0].confidence == pytest.approx(0.9)


def test_text_and_html_draw_the_wait_chains():
    from holmes.report.html import render_html

    comms = {"pp-0": [0, 4], "tp-1": [4, 5]}
    report = _hang(6, comms, {0: [("recv", "pp-0", 4, C), ("recv", "pp-0", 4, S)],
                              4: [("send", "pp-0", 0, C), ("all_reduce", "tp-1", None, S)],
                              1: [], 2: [], 3: []})
    text = report.to_text()
    assert "Verdict: hang. Rank(s) 5 never arrived; 2 stuck rank(s) wait for them." in text
    assert "    0 -[recv #1 pp-0]-> 4 -[all_reduce #0 tp-1]-> 5  (no log)" in text
    page = render_html(report)
    svg = page.split('id="hang-chains"')[1].split("</svg>")[0]
    assert svg.count("<circle") == 3 and "recv #1 pp-0" in svg and "rank 5 (root)" in svg


def test_a_deadlock_reads_as_one_in_the_text():
    report = _hang(2, {"pp-0": [0, 1]}, {0: [("send", "pp-0", 1, S)], 1: [("send", "pp-0", 0, S)]})
    assert report.to_text().splitlines()[1] == "Verdict: hang (deadlock). Ranks 0, 1 wait for each other."


def test_an_async_send_whose_completion_was_not_seen_does_not_block():
    # rank 0's isend #0 to 1 is still open in its log although rank 1 received it; rank 0 went on
    # into the dp all_reduce, which rank 2 never entered: rank 2 is the culprit, not rank 0
    comms = {"pp-0": [0, 1], "dp-0": [0, 2]}
    report = _hang(3, comms, {0: [("send", "pp-0", 1, S), ("all_reduce", "dp-0", None, S)],
                              1: [("recv", "pp-0", 0, C)],
                              2: []})
    h = report.to_json()["hang"]
    assert h["culprit_ranks"] == [2] and h["wait_chains"] == [[[0, "all_reduce", "dp-0", 0, 2]]]


def test_mismatched_collective_order_is_a_deadlock():
    # rank 0 enters tp-0 first, rank 1 enters dp-0 first: each collective misses the other rank
    comms = {"tp-0": [0, 1], "dp-0": [0, 1], "dp-1": [1, 2]}
    report = _hang(3, comms, {0: [("all_reduce", "tp-0", None, S), ("all_reduce", "dp-0", None, Q)],
                              1: [("all_reduce", "dp-0", None, S), ("all_reduce", "tp-0", None, Q)],
                              2: [("all_reduce", "dp-1", None, S)]})
    h = report.to_json()["hang"]
    assert h["deadlock"] == [0, 1] and h["culprit_ranks"] == [0, 1] and h["waiting_count"] == 1
    assert h["wait_chains"][0][0] == [2, "all_reduce", "dp-1", 0, 1]


def test_a_rank_inside_a_matched_pair_that_a_collective_waits_for_is_named():
    # Flight Recorder keeps only active entries: rank 0 (its Python stopped) still shows a send to 3
    # that rank 3 also shows (both in it, neither done), and never issued tp all_reduce #0 that ranks
    # 1, 2 wait in; rank 4 (idle) stopped too, rank 5 waits for it. Both stopped ranks are culprits,
    # rank 3 (only paired with rank 0) is not
    comms = {"tp-0": [0, 1, 2], "pp-0": [0, 3], "dp-0": [4, 5]}
    report = _hang(6, comms, {0: [("send", "pp-0", 3, Q)], 3: [("recv", "pp-0", 0, Q)],
                              1: [("all_reduce", "tp-0", None, Q)], 2: [("all_reduce", "tp-0", None, Q)],
                              4: [], 5: [("all_reduce", "dp-0", None, Q)]})
    h = report.to_json()["hang"]
    assert h["culprit_ranks"] == [0, 4] and h["stuck_inside"] == [3]
    assert {d.id for d in report.devices} == {"gpu:0", "gpu:4"}
