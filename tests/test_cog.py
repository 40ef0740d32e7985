"""The communication-operator graph: grouping, matching, execution order."""

from __future__ import annotations

import numpy as np

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
