"""The rank's own work around asynchronous operators: the logger's ``wait_ns`` and the gaps read from it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from holmes.cog.graph import RankOps
from holmes.cog.own_work import own_work_gaps, wait_arrays
from holmes.errors import SchemaError
from holmes.io import ops_table
from holmes.io.schema import validate_ops
from holmes.logger import CommOpsRecorder
from holmes.logger._work import TimedWork


class _Work:
    """A gloo point-to-point work: no future, completes in wait()."""

    def __init__(self, block_ns: int = 0) -> None:
        self.block_ns = block_ns
        self.waited = 0

    def wait(self, timeout=None):
        self.waited += 1
        return True

    def is_completed(self):
        return False


def test_the_recorder_writes_when_the_rank_waited_on_an_asynchronous_operator(tmp_path):
    rec = CommOpsRecorder(tmp_path, rank=0, world_size=2)
    rec.add_communicator("world", [0, 1], kind="other")
    send = rec.begin("world", "send", peer=1, nbytes=8, start_ns=100)
    send.return_ns = 150   # what the hook sets when the issuing call returns
    w = TimedWork(_Work(), [send])
    rec.record("world", "recv", peer=1, nbytes=8, start_ns=200, end_ns=300)   # synchronous
    w.wait()
    w.wait()   # a second wait changes nothing
    rec.close()
    t = pq.read_table(tmp_path / "ranks" / "rank-00000.parquet").to_pydict()
    i = t["op"].index("send")
    assert t["wait_ns"][1 - i] is None and t["return_ns"][1 - i] is None   # the synchronous receive
    assert t["start_ns"][i] == 100 and t["return_ns"][i] == 150 and 300 < t["wait_ns"][i] <= t["end_ns"][i]


def test_a_rank_blocked_in_wait_at_a_dump_says_so(tmp_path):
    rec = CommOpsRecorder(tmp_path, rank=0, world_size=2)
    rec.add_communicator("world", [0, 1], kind="other")
    rec.record("world", "send", peer=1, nbytes=8, start_ns=10, end_ns=20)
    h = rec.begin("world", "recv", peer=1, nbytes=8, start_ns=30)
    h.return_ns, h.wait_ns = 31, 40   # what the hook and TimedWork.wait set
    t = pq.read_table(rec.dump("timeout")).to_pydict()
    assert t["state"] == ["completed", "started"] and t["end_ns"] == [20, None]
    assert t["return_ns"] == [None, 31] and t["wait_ns"] == [None, 40]


def test_wait_ns_of_another_integer_type_is_cast_and_a_string_is_refused():
    base = dict(rank=[0, 0], iteration=[0, 0], op_index=[0, 1], comm_id=["w"] * 2, seq=[0, 0], op=["send", "recv"],
                peer=[1, 1], nbytes=[8, 8], start_ns=[0, 10], end_ns=[5, 20])
    t = ops_table(**base).append_column("wait_ns", pa.array([3, None], pa.int32()))
    assert validate_ops(t, "r0").schema.field("wait_ns").type == pa.int64()
    bad = ops_table(**base).append_column("wait_ns", pa.array(["3", None]))
    with pytest.raises(SchemaError, match="r0: column 'wait_ns' has type string"):
        validate_ops(bad, "r0")


def test_a_stall_while_a_send_is_open_is_the_ranks_own_work():
    # stage 0 of a GPipe step: send micro-batch 0, compute 30 (a stall), send 1, compute 5, wait both
    base = dict(rank=[0] * 3, iteration=[0, 0, 1], op_index=[0, 1, 0], comm_id=["w"] * 3, seq=[0, 1, 2],
                op=["send"] * 3, peer=[1] * 3, nbytes=[8] * 3, start_ns=[0, 31, 60], end_ns=[50, 50, 61])
    plain = ops_table(**base)
    waited = plain.append_column("wait_ns", pa.array([37, 50, None], pa.int64()))
    ro_plain, ro = RankOps(0, plain, lambda v: 0), RankOps(0, waited, lambda v: 0)
    assert ro_plain.iteration_compute()[1].tolist() == [0, 10]     # the stall hides in the open send
    assert ro.gap.tolist() == [0, 31, 16]                 # since send 1's issue: 60 - 31 - (50 - 37) blocked
    assert ro.iteration_compute()[1].tolist() == [31, 16]


_ops = st.lists(st.tuples(st.integers(0, 50), st.integers(0, 60), st.one_of(st.none(), st.integers(0, 40)),
                          st.integers(0, 20)), min_size=1, max_size=30)


@settings(max_examples=300, deadline=None)
@given(_ops)
def test_the_gaps_are_the_work_the_rank_did_between_its_operators(ops):
    # one thread's timeline: own work, then issue an operator; a synchronous one (wait None) blocks
    # it to its end; an asynchronous one returns after ``call`` (blocked in the call), the rank works
    # ``after`` more and waits for it (blocked until it completes, if it has not yet); that work
    # counts before the next operator
    start, end, ret, wait, truth, t, carry = [], [], [], [], [], 0, 0
    for gap, dur, after, call in ops:
        t += gap
        truth.append(carry + gap)
        start.append(t)
        if after is None:
            t += dur
            end.append(t)
            ret.append(-1)
            wait.append(-1)
            carry = 0
        else:
            ret.append(t + call)
            wait.append(t + call + after)
            t = max(t + call + after, t + dur)
            end.append(t)
            carry = after
    start, end, ret, wait = (np.array(x, np.int64) for x in (start, end, ret, wait))
    g = own_work_gaps(start, end, wait, ret)
    assert g.tolist() == [0] + truth[1:]
    if (wait < 0).all():   # no asynchronous operator: the gaps as they always were
        assert g.tolist() == own_work_gaps(start, end).tolist()


def test_wait_arrays_read_none_when_the_column_is_absent_or_empty():
    t = pa.table({"wait_ns": pa.nulls(3, pa.int64())})
    assert wait_arrays(t) is None and wait_arrays(pa.table({"x": [1]})) is None
    ret, wait = wait_arrays(pa.table({"wait_ns": pa.array([None, 5], pa.int64())}))
    assert ret.tolist() == [-1, -1] and wait.tolist() == [-1, 5]


_any = st.integers(-10, 200)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_any, _any, _any, _any), min_size=1, max_size=20))
def test_any_logged_wait_and_return_never_make_more_work_than_elapsed(rows):
    # columns from another writer: wait/return outside their operator, before its start, nulls (-1)
    start = np.sort(np.array([r[0] for r in rows], np.int64))
    end = start + np.abs(np.array([r[1] for r in rows], np.int64))
    wait = np.array([r[2] for r in rows], np.int64)
    ret = np.array([r[3] for r in rows], np.int64)
    g = own_work_gaps(start, end, wait, ret)
    assert g.shape == start.shape and g[0] == 0
    # never more own work than the time since the previous operator began
    assert (g[1:] <= np.diff(start)).all()
