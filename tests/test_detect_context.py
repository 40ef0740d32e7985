"""Cross-rank context features (holmes.detect.context)."""

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from holmes.detect import CONTEXT_FEATURE_NAMES, FEATURE_NAMES, JobContext, operator_features
from holmes.detect.context import log_slowness
from holmes.errors import SchemaError
from holmes.io.schema import ops_table

C = CONTEXT_FEATURE_NAMES.index


def group_rank(rank, n_ranks=4, n_iter=20, slow_iters=(), factor=1.3, seed=0, slow_ops=(0,)):
    """One member of a data-parallel group: one all_reduce on 'dp-0' per iteration plus a send to the
    next rank and a recv from the previous one on 'pp-0'. ``slow_iters``: the ops at ``slow_ops``
    (op_index; the all_reduce by default) are ``factor`` x slower there. Durations carry +-15 % noise
    per rank."""
    rng = np.random.default_rng([seed, rank])
    rows = {k: [] for k in ("iteration", "op_index", "comm_id", "seq", "op", "peer", "start_ns", "end_ns")}
    t = 0
    for it in range(n_iter):
        for k, (comm, op, peer) in enumerate([("dp-0", "all_reduce", None),
                                              ("pp-0", "send", (rank + 1) % n_ranks),
                                              ("pp-0", "recv", (rank - 1) % n_ranks)]):
            d = 1e6 * rng.uniform(0.85, 1.15) * (factor if (k in slow_ops and it in slow_iters) else 1.0)
            t += 50_000
            rows["iteration"].append(it)
            rows["op_index"].append(k)
            rows["comm_id"].append(comm)
            rows["seq"].append(it)
            rows["op"].append(op)
            rows["peer"].append(peer)
            rows["start_ns"].append(t)
            t += int(d)
            rows["end_ns"].append(t)
    n = len(rows["seq"])
    return ops_table(rank=[rank] * n, nbytes=[1 << 20] * n, **rows)


def test_weak_fault_on_every_rank_stands_out_in_the_job_context_only():
    slow = (7, 13)
    tables = [group_rank(r, slow_iters=slow) for r in range(16)]
    ctx = JobContext.from_tables(tables)
    F = ctx.features(tables[0])
    it = tables[0].column("iteration").to_numpy()
    z = F[:, C("job_iter_z")]
    assert z[np.isin(it, slow)].min() > 3 * max(z[~np.isin(it, slow)].max(), 0.5)
    assert np.all(F[:, C("job_ranks")] == np.float32(np.log2(17)))
    # the slow all_reduce instances: every member's log-slowness averaged, ~log(1.3)
    ar = (tables[0].column("op").to_pylist().index("all_reduce"))
    assert ar == 0
    inst = F[:, C("inst_lr")]
    is_ar = np.array([o == "all_reduce" for o in tables[0].column("op").to_pylist()])
    assert np.all(np.abs(inst[is_ar & np.isin(it, slow)] - np.log(1.3)) < 0.08)
    assert np.all(F[is_ar, C("inst_members")] == 16)


def test_weak_fault_on_one_communicator_stands_out_in_its_comm_iterations():
    """pp-0's send and recv 1.15x slower on every rank in two iterations: inside one op's +-15 %
    noise, but the mean over the communicator's ops of the iteration on all ranks shows it."""
    slow = (5, 9)
    tables = [group_rank(r, n_ranks=16, slow_iters=slow, factor=1.15, slow_ops=(1, 2)) for r in range(16)]
    F = JobContext.from_tables(tables).features(tables[3])
    it = tables[3].column("iteration").to_numpy()
    pp = tables[3].column("op_index").to_numpy() > 0
    z = F[:, C("comm_iter_z")]
    assert z[pp & np.isin(it, slow)].min() > 4
    assert np.abs(z[~np.isin(it, slow)]).max() < 4  # the other iterations
    assert np.abs(z[~pp]).max() < 4                 # dp-0 is not involved
    np.testing.assert_allclose(F[pp & np.isin(it, slow), C("comm_iter_dev")], np.log(1.15), atol=0.03)


def test_persistent_step_shows_as_a_rise_over_the_low_iterations():
    """The all_reduce 1.3x slower from iteration 8 to the end (60 % of the log): the median over
    iterations sits on the slow level, so the deviation from it is ~0, but the rise over the 10th
    percentile (the healthy level) keeps the step."""
    tables = [group_rank(r, n_ranks=8, slow_iters=range(8, 20)) for r in range(8)]
    F = JobContext.from_tables(tables).features(tables[0])
    it = tables[0].column("iteration").to_numpy()
    ar = tables[0].column("op_index").to_numpy() == 0
    after = it >= 8
    np.testing.assert_allclose(F[ar & after, C("comm_iter_rise")], np.log(1.3), atol=0.06)
    assert np.abs(F[ar & ~after, C("comm_iter_rise")]).max() < 0.06
    assert np.abs(F[ar & after, C("comm_iter_dev")]).max() < 0.1
    rise = F[:, C("job_iter_rise")]  # one op in three is slow
    assert rise[after].min() > rise[~after].max()
    assert abs(rise[after].mean() - np.log(1.3) / 3) < 0.03


def test_fluctuation_rises_in_units_of_the_healthy_spread():
    """pp-0 1.15x slower on every rank in every other iteration (a fluctuation covering half the
    log): the slow iterations inflate the MAD, so the z over the median stays small, but the rise in
    units of the spread of the fast (healthy) iterations stands out. A one-iteration spike stands out
    both ways."""
    slow = tuple(range(1, 30, 2))
    tables = [group_rank(r, n_ranks=16, n_iter=30, slow_iters=slow, factor=1.15, slow_ops=(1, 2)) for r in range(16)]
    F = JobContext.from_tables(tables).features(tables[3])
    it = tables[3].column("iteration").to_numpy()
    pp = tables[3].column("op_index").to_numpy() > 0
    hit = pp & np.isin(it, slow)
    assert F[hit, C("comm_iter_z")].max() < 2
    rz = F[:, C("comm_iter_rise_z")]
    assert rz[hit].min() > max(rz[pp & ~hit].max() + 1, 3)
    assert rz[hit].mean() > 3 * F[hit, C("comm_iter_z")].mean()
    assert rz[~pp].max() < rz[hit].min()  # dp-0 is not involved
    job_rz = F[:, C("job_iter_rise_z")]
    assert job_rz[np.isin(it, slow)].min() > job_rz[~np.isin(it, slow)].max()

    tables = [group_rank(r, n_ranks=16, n_iter=30, slow_iters=(11,), factor=1.15, slow_ops=(1, 2)) for r in range(16)]
    F = JobContext.from_tables(tables).features(tables[3])
    spike = (tables[3].column("iteration").to_numpy() == 11) & pp
    assert F[spike, C("comm_iter_rise_z")].min() > 4
    assert np.all(F[spike, C("comm_iter_rise_z")] >= F[spike, C("comm_iter_z")])


def test_features_without_context_use_the_rank_alone():
    t = group_rank(0, slow_iters=(3,))
    X = operator_features(t)
    np.testing.assert_array_equal(X[:, len(FEATURE_NAMES) - len(CONTEXT_FEATURE_NAMES):], JobContext.of_rank(t))
    assert np.all(X[:, FEATURE_NAMES.index("job_ranks")] == 1.0)
    assert np.all(X[:, FEATURE_NAMES.index("inst_members")] == 1.0)


def test_p2p_directions_are_different_instances():
    """send 0->1 and send 1->0 share comm_id and seq, but are two transfers: each pairs with its recv."""
    tables = [group_rank(r, n_ranks=2) for r in range(2)]
    ctx = JobContext.from_tables(tables)
    assert len(ctx._inst.ids) == 3  # dp-0, pp-0 0->1, pp-0 1->0
    F = ctx.features(tables[0])
    assert np.all(F[:, C("inst_members")] == 2)
    lr0, lr1 = log_slowness(tables[0]), log_slowness(tables[1])
    # rank 0's send (op_index 1) pairs with rank 1's recv (op_index 2)
    send0 = tables[0].column("op_index").to_numpy() == 1
    recv1 = tables[1].column("op_index").to_numpy() == 2
    np.testing.assert_allclose(F[send0, C("inst_lr")], (lr0[send0] + lr1[recv1]) / 2, rtol=1e-5, atol=1e-6)


def test_unseen_rank_gets_no_evidence_and_does_not_change_the_context():
    ctx = JobContext.from_tables([group_rank(r) for r in range(4)])
    before = (repr(ctx), ctx.features(group_rank(1)).copy())
    stranger = ops_table(rank=[9], iteration=[500], op_index=[0], comm_id=["tp-77"], seq=[3], op=["all_gather"],
                         peer=[None], nbytes=[8], start_ns=[0], end_ns=[10])
    F = ctx.features(stranger)
    assert F.shape == (1, len(CONTEXT_FEATURE_NAMES)) and not F.any()
    assert repr(ctx) == before[0]
    np.testing.assert_array_equal(ctx.features(group_rank(1)), before[1])


def test_empty_context_and_empty_table():
    assert not JobContext().features(group_rank(0)).any()
    empty = group_rank(0).slice(0, 0)
    assert JobContext.from_tables([empty]).features(empty).shape == (0, len(CONTEXT_FEATURE_NAMES))
    assert operator_features(empty).shape == (0, len(FEATURE_NAMES))


def test_missing_column_is_a_schema_error():
    t = group_rank(0).drop_columns(["seq"])
    with pytest.raises(SchemaError, match="seq"):
        JobContext().add(t)
    with pytest.raises(SchemaError, match="seq"):
        operator_features(t)


@settings(max_examples=10, deadline=None)
@given(st.permutations(list(range(6))), st.integers(0, 1000))
def test_context_does_not_depend_on_the_order_ranks_are_added(order, seed):
    tables = [group_rank(r, n_ranks=6, n_iter=8, slow_iters=(2,), seed=seed) for r in range(6)]
    a = JobContext.from_tables(tables)
    b = JobContext.from_tables([tables[k] for k in order])
    for t in tables:
        np.testing.assert_allclose(a.features(t), b.features(t), rtol=1e-6, atol=1e-7)


def test_row_order_of_a_rank_does_not_change_its_features():
    tables = [group_rank(r, n_iter=10, slow_iters=(4,)) for r in range(4)]
    ctx = JobContext.from_tables(tables)
    perm = np.random.default_rng(1).permutation(tables[2].num_rows)
    shuffled = tables[2].take(perm)
    np.testing.assert_allclose(ctx.features(shuffled), ctx.features(tables[2])[perm], rtol=1e-6)
    ctx2 = JobContext.from_tables(tables[:2] + [shuffled] + tables[3:])
    np.testing.assert_allclose(ctx2.features(tables[0]), ctx.features(tables[0]), rtol=1e-6, atol=1e-7)


def test_negative_seq_names_no_instance():
    t = group_rank(0)
    seq = t.column("seq").to_numpy().copy()
    seq[-1] = -1
    bad = t.set_column(t.schema.get_field_index("seq"), "seq", pa.array(seq))
    F = JobContext.from_tables([bad, group_rank(1)]).features(bad)
    good = JobContext.from_tables([t, group_rank(1)]).features(t)
    assert F[-1, C("inst_members")] == 0
    cols = [C("inst_lr"), C("inst_members")]  # the other rows' instances are untouched
    np.testing.assert_array_equal(F[:-1][:, cols], good[:-1][:, cols])


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.floats(-1e3, 1e3)), min_size=1, max_size=60),
       st.lists(st.sampled_from([0.05, 0.1, 0.25, 0.5, 0.9]), min_size=1, max_size=3))
def test_group_quantiles_match_numpy(rows, qs):
    from holmes.stats import group_order, group_quantiles

    g = np.array([r[0] for r in rows])
    v = np.array([r[1] for r in rows])
    order, bounds = group_order(g)
    out = group_quantiles(v, order, bounds, qs)
    for j, q in enumerate(qs):
        for k in np.unique(g):
            want = np.median(v[g == k]) if q == 0.5 else np.quantile(v[g == k], q)
            np.testing.assert_allclose(out[j, g == k], want, rtol=1e-12, atol=1e-9)


def test_negative_iteration_is_its_own_iteration():
    """A log whose warm-up iteration is numbered -1 keeps it apart from iteration 0."""
    rows = dict(iteration=[-1, 0, 1, 2], op_index=[0] * 4, comm_id=["dp-0"] * 4, seq=[0, 1, 2, 3],
                op=["all_reduce"] * 4, peer=[None] * 4, nbytes=[8] * 4, start_ns=[0, 1000, 2000, 3000])
    t = ops_table(rank=[0] * 4, end_ns=[1000 * k + d for k, d in enumerate([500, 100, 100, 100])], **rows)
    F = JobContext.from_tables([t]).features(t)
    dev = F[:, C("comm_iter_dev")]
    assert dev[0] == pytest.approx(np.log(5), abs=1e-5) and not dev[1:].any()
