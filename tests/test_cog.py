"""The communication-operator graph: grouping, matching, execution order."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from holmes.cog import CommOpGraph
from holmes.io.schema import ops_table


def _table(rank, rows):
    cols = list(zip(*rows))
    return ops_table(rank=[rank] * len(rows), iteration=list(cols[0]), op_index=list(cols[1]), comm_id=list(cols[2]),
                     seq=list(cols[3]), op=list(cols[4]), peer=list(cols[5]), nbytes=[8] * len(rows),
                     start_ns=list(cols[6]), end_ns=list(cols[7]))


COMMS = {"tp-0": ("tp", (0, 1)), "dp-0": ("dp", (0, 2)), "ep-0": ("ep", (2, 0)), "pp-0": ("pp", (0, 4))}


def test_ep_folded_into_dp_and_pp_not_grouped():
    g = CommOpGraph(COMMS)
    assert g.group_of[g.comm_code("ep-0")] == g.group_of[g.comm_code("dp-0")]
    assert g.num_groups == 3
    assert not g.is_group_kind(g.comm_code("pp-0")) and g.is_group_kind(g.comm_code("tp-0"))
    assert CommOpGraph(COMMS, fold_ep=False).num_groups == 4


def test_matching_collectives_and_p2p_by_keys():
    g = CommOpGraph(COMMS)
    r0 = g.add_rank(0, _table(0, [(0, 0, "tp-0", 0, "all_reduce", None, 0, 10), (0, 1, "pp-0", 0, "send", 4, 10, 20),
                                  (1, 0, "tp-0", 1, "all_reduce", None, 30, 40), (1, 1, "pp-0", 1, "send", 4, 40, 55)]))
    r4 = g.add_rank(4, _table(4, [(0, 0, "pp-0", 0, "recv", 0, 5, 20), (1, 0, "pp-0", 1, "recv", 0, 35, 55)]))
    assert r0.find_collective(g.comm_code("tp-0"), 1, iteration=1) == 2
    assert r0.find_collective(g.comm_code("tp-0"), 1) == 2          # without iteration hint
    assert r0.find_collective(g.comm_code("tp-0"), 7) is None
    assert r4.find_p2p(g.comm_code("pp-0"), 1, 8, 0, iteration=1) == 1  # recv (code 8) from 0, seq 1
    assert r4.find_p2p(g.comm_code("pp-0"), 1, 7, 0) is None            # no send on rank 4
    assert r0.earlier_rows(3).tolist() == [2]
    assert r0.earlier_rows(2, previous_tail=False).tolist() == []
    assert r0.earlier_rows(2).tolist() == [1, 0]
    assert g.num_operators == 6 and 4 in g and 1 not in g


def test_memory_grows_with_fetched_ranks_only():
    comms = {f"dp-{i}": ("dp", tuple(range(i * 1000, (i + 1) * 1000))) for i in range(8)}
    g = CommOpGraph(comms)
    g.add_rank(5, _table(5, [(0, 0, "dp-0", 0, "all_reduce", None, 0, 1)]))
    assert list(g.ranks) == [5]
    assert g.num_operators == 1


def test_position_series_and_gap():
    g = CommOpGraph(COMMS)
    r = g.add_rank(0, _table(0, [(0, 0, "tp-0", 0, "all_reduce", None, 0, 10), (0, 1, "tp-0", 1, "all_reduce", None, 15, 20),
                                 (2, 0, "tp-0", 2, "all_reduce", None, 50, 70), (2, 1, "tp-0", 3, "all_reduce", None, 90, 95)]))
    its = np.array([0, 1, 2])
    assert np.array_equal(r.position_series(0, its), [10, np.nan, 20], equal_nan=True)
    assert np.array_equal(r.position_series(1, its, gap=True), [5, np.nan, 20], equal_nan=True)
    assert np.array_equal(r.position_series(0, its, gap=True), [np.nan, np.nan, 30], equal_nan=True)
    assert r.earlier_rows(2).tolist() == [1, 0] and r.earlier_rows(2, previous_tail=False).tolist() == []


def test_unknown_comm_gets_code_and_networkx_view():
    g = CommOpGraph(COMMS)
    g.add_rank(0, _table(0, [(0, 0, "tp-0", 0, "all_reduce", None, 0, 10), (0, 1, "zz", 0, "all_reduce", None, 10, 20),
                             (0, 2, "pp-0", 0, "send", 4, 20, 30)]))
    assert g.group_members("zz") == ()
    nxg = g.to_networkx()
    assert nxg.has_edge(("op", 0, 0), ("op", 0, 1))
    assert nxg.has_edge(("op", 0, 2), ("gpu", 4))
    assert nxg.has_edge(("group", g.group_of[g.comm_code("tp-0")]), ("gpu", 1))


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_aligning_collective_ends_only_shortens_async_copies_to_a_peers_end(data):
    from holmes.cog.graph import SYMMETRIC

    world = data.draw(st.integers(2, 4))
    n_ops = data.draw(st.integers(1, 5))
    ops = data.draw(st.lists(st.sampled_from(["all_reduce", "broadcast", "all_gather", "barrier"]),
                             min_size=n_ops, max_size=n_ops))
    g = CommOpGraph({"dp": ("dp", tuple(range(world)))})
    before = {}
    for r in range(world):
        starts = sorted(data.draw(st.lists(st.integers(0, 10_000), min_size=n_ops, max_size=n_ops)))
        lens = data.draw(st.lists(st.integers(0, 5_000), min_size=n_ops, max_size=n_ops))
        t = ops_table(rank=[r] * n_ops, iteration=[0] * n_ops, op_index=list(range(n_ops)),
                      comm_id=["dp"] * n_ops, seq=list(range(n_ops)), op=ops, peer=[None] * n_ops,
                      nbytes=[8] * n_ops, start_ns=starts, end_ns=[s + d for s, d in zip(starts, lens)])
        ro = g.add_rank(r, t)
        before[r] = ro.end.copy()
    host = data.draw(st.sampled_from([lambda r: 0, lambda r: r % 2]))
    moved = g.align_collective_ends(host, 100)
    changed = 0
    for r, ro in g.ranks.items():
        assert (ro.end >= ro.start).all() and (ro.end <= before[r]).all()
        assert np.array_equal(ro.duration, ro.end - ro.start)
        assert ro.table.column("end_ns").to_pylist() == ro.end.tolist()
        diff = ro.end != before[r]
        changed += int(diff.sum())
        nxt = np.append(ro.start[1:], np.iinfo(np.int64).max)
        # only symmetric collectives still open when the rank went on, never past a same-host peer's end
        assert (np.isin(ro.op[diff], SYMMETRIC)).all() and (before[r][diff] > nxt[diff]).all()
        for k in np.flatnonzero(diff):
            peers = [before[q][k] for q in g.ranks if host(q) == host(r)]
            assert ro.end[k] == max(min(peers), ro.start[k])
    assert changed == moved
