"""The what-if ideal (per operator type) and WIA's per-stage decomposition on small programs."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from holmes.localize.persistent.analysis import PersistentAnalysis
from holmes.localize.persistent.wait import operator_types
from holmes.localize.persistent.whatif import Program, replay

INFO = [("c", "dp", (0, 1), "dp0"), ("c", "dp", (2, 3), "dp1"), ("c", "dp", (4, 5, 6), "dp2"),
        ("p", "pp", (0, 2), "pp0"), ("p", "pp", (2, 0), "pp0")]
COMMS = {"pp0": ("pp", [0, 2])}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(INFO) - 1), st.integers(0, 2), st.sampled_from([0, 1 << 20, 1 << 21]),
                          st.floats(0, 1e6, allow_nan=False), st.booleans()), min_size=1, max_size=40))
def test_operator_types_group_alike_instances_and_take_their_median(rows):
    slot, op, nb, x, full = (np.array(v) for v in zip(*rows))
    typ, med = operator_types(INFO, COMMS, slot, op.astype(np.int8), nb, x.astype(float), full, np.ones(len(x), bool))

    def key(i):  # what makes a type: the communicator kind and size (P2P: its direction), op, size
        s = INFO[slot[i]]
        return (s[0], s[1], len(s[2]) if s[0] == "c" else s[2][1] > s[2][0], op[i], nb[i])

    for i in range(len(x)):
        for j in range(len(x)):
            assert (typ[i] == typ[j]) == (key(i) == key(j))
    for t in np.unique(typ):
        m = typ == t
        want = np.median(x[m & full]) if (m & full).any() else np.median(x[m])
        assert med[t] == want


def test_decomposition_charges_a_stage_with_the_transfers_of_its_own_operators():
    # rank 0 (stage 0) and rank 1 (stage 1) exchange once (instance 0), then each runs a collective of
    # its own: rank 0's (instance 1) takes 5 instead of its type's 1; rank 1 works 3 instead of 2
    prog = Program.from_arrays(rank_ptr=[0, 2, 4], iter_ptr=[[0, 2], [2, 4]], inst=[0, 1, 0, 2],
                               gap=[1.0, 1.0, 3.0, 1.0], new_batch=[1, 1, 1, 1], x=[1.0, 5.0, 1.0], size=[2, 1, 1])
    f = SimpleNamespace(row_rank=np.array([0, 0, 1, 1]))
    g_ideal, x_ideal = np.full(4, 2.0), np.ones(3)
    ok = np.array([True])
    t_ideal = float(replay(prog, gap=g_ideal, x=x_ideal)[0])
    assert t_ideal == 6.0
    by_stage = PersistentAnalysis._decompose(np.array([0, 1]), 2, 2, prog, f, prog.gap, g_ideal, x_ideal, replay,
                                             ok, t_ideal)
    # stage 0 as logged: its exchange at 2, its slow collective 4 -> 9; stage 1 as logged: 3 -> 4, 6 -> 7
    assert by_stage == {0: 9.0 / 6.0, 1: 7.0 / 6.0}


def test_operator_type_medians_are_exact_when_types_alternate_in_a_large_job():
    # a data-parallel communicator's all-gathers and reduce-scatters alternate instance by instance;
    # any strided sample of millions of instances would see one kind only (the old sampled medians
    # lost a type this way at 8,192 GPUs)
    n = (1 << 21) + 4
    op = np.tile(np.array([1, 2], np.int8), n // 2)
    x = np.where(op == 1, 3.0, 7.0) + np.arange(n) % 5
    typ, med = operator_types([("c", "dp", (0, 1), "dp0")], {}, np.zeros(n, np.int64), op, np.zeros(n, np.int64), x,
                              np.ones(n, bool), np.ones(n, bool))
    assert med[typ[0]] == np.median(x[op == 1]) and med[typ[1]] == np.median(x[op == 2])
