"""Algorithm 1 on hand-built tiny jobs whose answer is known."""

from __future__ import annotations

from holmes.io import MemoryJob
from holmes.io.schema import ops_table
from holmes.detect import LabelDetector
from holmes.localize import COMPUTE, NETWORK, GraphSearch, JobSource


def _t(rank, rows):
    """rows: (op_index, comm, seq, op, peer, start, end, abnormal) of iteration 0."""
    cols = list(zip(*rows))
    n = len(rows)
    return ops_table(rank=[rank] * n, iteration=[0] * n, op_index=list(cols[0]), comm_id=list(cols[1]),
                     seq=list(cols[2]), op=list(cols[3]), peer=list(cols[4]), nbytes=[8] * n,
                     start_ns=list(cols[5]), end_ns=list(cols[6]), abnormal=list(cols[7]))


def _job(comms, tables):
    meta = {"world_size": max(max(r) for _, r in comms.values()) + 1,
            "communicators": {c: {"kind": k, "ranks": list(r)} for c, (k, r) in comms.items()}}
    return MemoryJob(meta, tables)


def _search(job, starts):
    s = GraphSearch(JobSource(job), LabelDetector())
    for r, _ in starts:
        s.rank_ops(r)
    return s, s.search(0, starts)


TP = {"tp-0": ("tp", (0, 1, 2, 3))}


def test_slow_compute_gpu_in_tp_group_is_compute_on_that_gpu():
    tables = {r: _t(r, [(0, "tp-0", 0, "all_reduce", None, 0, 10, False),
                        (1, "tp-0", 1, "all_reduce", None, 20, 90, r != 2)]) for r in range(4)}
    s, causes = _search(_job(TP, tables), [(0, 1)])
    assert len(causes) == 1
    c = causes[0]
    assert c.cause == COMPUTE and c.ranks == (2,)
    assert [step["rank"] for step in c.evidence] == [0, 2]
    assert s.source.ranks_read == [0, 1, 2]       # stopped at the first normal copy


def test_normal_member_with_earlier_abnormal_op_is_followed():
    comms = {"tp-0": ("tp", (0, 1)), "tp-1": ("tp", (2, 3)), "dp-0": ("dp", (1, 3))}
    tables = {
        0: _t(0, [(0, "tp-0", 0, "all_reduce", None, 0, 100, True)]),
        1: _t(1, [(0, "dp-0", 0, "all_reduce", None, 0, 90, True), (1, "tp-0", 0, "all_reduce", None, 95, 100, False)]),
        2: _t(2, [(0, "tp-1", 0, "all_reduce", None, 0, 80, True)]),
        3: _t(3, [(0, "tp-1", 0, "all_reduce", None, 70, 80, False), (1, "dp-0", 0, "all_reduce", None, 85, 90, False)]),
    }
    _, causes = _search(_job(comms, tables), [(0, 0)])
    assert [(c.cause, c.ranks) for c in causes] == [(COMPUTE, (3,))]
    assert [s["rank"] for s in causes[0].evidence] == [0, 1, 1, 3]


def test_both_p2p_ops_abnormal_is_network_between_the_pair():
    comms = {"pp-0": ("pp", (0, 1))}
    tables = {0: _t(0, [(0, "pp-0", 0, "send", 1, 0, 100, True)]), 1: _t(1, [(0, "pp-0", 0, "recv", 0, 0, 100, True)])}
    _, causes = _search(_job(comms, tables), [(0, 0)])
    assert [(c.cause, c.ranks) for c in causes] == [(NETWORK, (0, 1))]


def test_p2p_peer_normal_then_compute_on_peer():
    comms = {"pp-0": ("pp", (0, 1))}
    tables = {0: _t(0, [(0, "pp-0", 0, "recv", 1, 0, 100, True)]), 1: _t(1, [(0, "pp-0", 0, "send", 0, 95, 100, False)])}
    _, causes = _search(_job(comms, tables), [(0, 0)])
    assert [(c.cause, c.ranks) for c in causes] == [(COMPUTE, (1,))]


def test_collective_all_abnormal_is_network_over_members():
    tables = {r: _t(r, [(0, "tp-0", 0, "all_reduce", None, r, 100, True)]) for r in range(4)}
    s, causes = _search(_job(TP, tables), [(1, 0)])
    assert [(c.cause, c.ranks) for c in causes] == [(NETWORK, (0, 1, 2, 3))]
    assert s.source.ranks_read == [0, 1, 2, 3]


def test_cycle_terminates_without_cause():
    comms = {"a": ("tp", (0, 1)), "b": ("dp", (0, 1))}
    tables = {0: _t(0, [(0, "a", 0, "all_reduce", None, 0, 50, True), (1, "b", 0, "all_reduce", None, 60, 70, False)]),
              1: _t(1, [(0, "b", 0, "all_reduce", None, 0, 50, True), (1, "a", 0, "all_reduce", None, 60, 70, False)])}
    s, causes = _search(_job(comms, tables), [(0, 0)])
    assert causes == []
    assert s.steps == 2


def test_missing_member_is_reported_and_search_goes_on():
    tables = {r: _t(r, [(0, "tp-0", 0, "all_reduce", None, 0, 90, r != 2)]) for r in (0, 2, 3)}
    s, causes = _search(_job(TP, tables), [(0, 0)])
    assert [(c.cause, c.ranks) for c in causes] == [(COMPUTE, (2,))]
    assert list(s.source.missing) == [1]
    assert "rank 1" in s.source.missing[1]


def test_missing_member_in_all_abnormal_group_narrows_network_set():
    tables = {r: _t(r, [(0, "tp-0", 0, "all_reduce", None, 0, 90, True)]) for r in (0, 1, 3)}
    _, causes = _search(_job(TP, tables), [(0, 0)])
    assert causes[0].cause == NETWORK and causes[0].ranks == (0, 1, 3)
    assert "could not be checked" in causes[0].note


def test_several_start_operators_share_visited_set():
    tables = {r: _t(r, [(0, "tp-0", 0, "all_reduce", None, 0, 10, r != 3),
                        (1, "tp-0", 1, "all_reduce", None, 20, 90, r != 2)]) for r in range(4)}
    s, causes = _search(_job(TP, tables), [(0, 0), (0, 1), (0, 0)])
    # start 2 reaches rank 2 (normal copy), whose earlier abnormal op leads to rank 3 as well;
    # the repeated start is not searched again
    assert [(c.cause, c.ranks) for c in causes] == [(COMPUTE, (3,)), (COMPUTE, (3,))]
    assert s.hints  # the normal member is remembered for the next iteration


def test_deep_chain_has_no_recursion_limit():
    n = 3000
    comms = {f"pp-{i}": ("pp", (i, i + 1)) for i in range(n - 1)}
    tables = {}
    for r in range(n):
        rows = []
        if r > 0:
            rows.append((0, f"pp-{r - 1}", 0, "recv", r - 1, 0, 100, True))
        if r < n - 1:
            rows.append((len(rows), f"pp-{r}", 0, "send", r + 1, 0, 100, r == 0))
        tables[r] = _t(r, rows)
    # every rank waits on its successor's recv... chain: 0.send -> 1.recv normal? build: send abnormal, recv abnormal
    _, causes = _search(_job(comms, tables), [(0, 0)])
    assert len(causes) == 1 and causes[0].cause == NETWORK


def test_short_copy_flagged_by_a_noisy_detector_is_still_the_late_arriver():
    # rank 1's copy is flagged (noise) but lasted 5 of rank 0's 100: rank 1 entered last
    tables = {0: _t(0, [(0, "tp-0", 0, "all_reduce", None, 0, 100, True)]),
              1: _t(1, [(0, "tp-0", 0, "all_reduce", None, 95, 100, True)])}
    job = _job({"tp-0": ("tp", (0, 1))}, tables)
    _, causes = _search(job, [(0, 0)])
    assert [(c.cause, c.ranks) for c in causes] == [(COMPUTE, (1,))]
    # trusting the labels alone (the paper's rule) makes it a network cause
    s = GraphSearch(JobSource(job), LabelDetector(), late_ratio=0.0)
    s.rank_ops(0)
    assert [(c.cause, c.ranks) for c in s.search(0, [(0, 0)])] == [(NETWORK, (0, 1))]


def test_short_flagged_recv_means_the_receiver_was_late():
    comms = {"pp-0": ("pp", (0, 1))}
    tables = {0: _t(0, [(0, "pp-0", 0, "send", 1, 0, 100, True)]),
              1: _t(1, [(0, "pp-0", 0, "recv", 0, 96, 100, True)])}
    _, causes = _search(_job(comms, tables), [(0, 0)])
    assert [(c.cause, c.ranks) for c in causes] == [(COMPUTE, (1,))]


def _multi(rank, iters):
    """iters: per iteration, rows (op_index, comm, seq, op, peer, start, end, abnormal)."""
    rows = [(it,) + r for it, rs in enumerate(iters) for r in rs]
    cols = list(zip(*rows))
    n = len(rows)
    return ops_table(rank=[rank] * n, iteration=list(cols[0]), op_index=list(cols[1]), comm_id=list(cols[2]),
                     seq=list(cols[3]), op=list(cols[4]), peer=list(cols[5]), nbytes=[8] * n,
                     start_ns=list(cols[6]), end_ns=list(cols[7]), abnormal=list(cols[8]))


def test_long_compute_gap_beats_a_slightly_slow_earlier_operator():
    # rank 1: a dp op (usually 10 ns) then, after its compute (usually 10 ns), the tp op.
    # In iteration 2 the dp op is a little slow (flagged, +5 ns) but the compute gap grew by 80 ns:
    # rank 1's own compute made everybody wait, not the dp op.
    comms = {"tp-0": ("tp", (0, 1)), "dp-0": ("dp", (1, 2))}
    # (seq k = the k-th collective on the communicator: one per iteration here)
    def r1(k, t0, dp_end, tp_start, flag):
        return [(0, "dp-0", k, "all_reduce", None, t0, dp_end, flag),
                (1, "tp-0", k, "all_reduce", None, tp_start, tp_start + 5, False)]
    one = _multi(1, [r1(0, 0, 10, 20, False), r1(1, 100, 110, 120, False), r1(2, 200, 215, 305, True)])
    zero = _multi(0, [[(0, "tp-0", 0, "all_reduce", None, 0, 25, False)],
                      [(0, "tp-0", 1, "all_reduce", None, 100, 125, False)],
                      [(0, "tp-0", 2, "all_reduce", None, 200, 310, True)]])
    two = _multi(2, [[(0, "dp-0", 0, "all_reduce", None, 0, 10, False)],
                     [(0, "dp-0", 1, "all_reduce", None, 100, 110, False)],
                     [(0, "dp-0", 2, "all_reduce", None, 200, 215, True)]])
    job = _job(comms, {0: zero, 1: one, 2: two})
    s = GraphSearch(JobSource(job), LabelDetector())
    s.rank_ops(0)
    causes = s.search(2, [(0, 2)])
    assert [(c.cause, c.ranks) for c in causes] == [(COMPUTE, (1,))]
    assert causes[0].op["gap_excess_ns"] == 80
    assert 2 not in s.source.ranks_read          # the dp op was not searched


def test_rank_behind_from_waiting_passes_the_blame_upstream():
    # rank 1 receives three times from rank 2 (usually 10 ns each), computing 10 ns after each,
    # then joins the tp op with rank 0; iterations follow each other 10 ns apart. In iteration 3
    # every recv waited 30 ns more (rank 2 computed 30 ns longer before each send: 90 ns in all)
    # and rank 1's last compute gap grew by 40 ns. The gap beats the last recv's 30 ns alone, but
    # rank 1 was behind mostly from waiting: the search goes on to rank 2, whose compute is the cause.
    comms = {"tp-0": ("tp", (0, 1)), "pp-0": ("pp", (1, 2))}
    zero, one, two = [], [], []
    t = 0
    for k in range(4):
        wait, gap = (30, 50) if k == 3 else (0, 10)
        it0, r1, r2 = t, [], []
        for j in range(3):
            r2.append((j, "pp-0", 3 * k + j, "send", 1, t + wait, t + wait + 10, False))
            r1.append((j, "pp-0", 3 * k + j, "recv", 2, t, t + 10 + wait, wait > 0))
            t += 10 + wait + 10
        t += gap - 10
        r1.append((3, "tp-0", k, "all_reduce", None, t, t + 5, False))
        zero.append([(0, "tp-0", k, "all_reduce", None, it0, t + 5, k == 3)])
        one.append(r1)
        two.append(r2)
        t += 15
    job = _job(comms, {0: _multi(0, zero), 1: _multi(1, one), 2: _multi(2, two)})
    s = GraphSearch(JobSource(job), LabelDetector())
    s.rank_ops(0)
    causes = s.search(3, [(0, 3)])
    assert [(c.cause, c.ranks) for c in causes] == [(COMPUTE, (2,))]
    assert [step["rank"] for step in causes[0].evidence][:3] == [0, 1, 1]

    s = GraphSearch(JobSource(job), LabelDetector(), follow_waits=False)   # the rule off: the gap is blamed
    s.rank_ops(0)
    assert [(c.cause, c.ranks) for c in s.search(3, [(0, 3)])] == [(COMPUTE, (1,))]
