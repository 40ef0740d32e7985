"""Shared converter machinery: op names, seq, iteration inference, group registry, safe pickle."""

from __future__ import annotations

import os
import pickle
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from holmes.adapters import ConvertWarning, convert
from holmes.adapters.groups import GroupRegistry
from holmes.adapters.iterations import align_iterations, align_p2p_by_time, infer_iterations_by_period
from holmes.adapters.notes import Notes
from holmes.adapters.opnames import normalize_op
from holmes.adapters.rows import assign_seq
from holmes.adapters.safe_pickle import safe_load, safe_loads
from holmes.errors import ConfigError, ConvertError, ParseError


@pytest.mark.parametrize("name, op", [
    ("allreduce", "all_reduce"), ("nccl:all_reduce", "all_reduce"), ("allreduce_coalesced", "all_reduce"),
    ("_allgather_base", "all_gather"), ("nccl:_all_gather_base", "all_gather"),
    ("allgather_into_tensor_coalesced", "all_gather"), ("reduce_scatter_tensor", "reduce_scatter"),
    ("ncclx:_reduce_scatter_base", "reduce_scatter"), ("alltoall_base", "all_to_all"), ("all_to_all", "all_to_all"),
    ("gloo:broadcast", "broadcast"), ("xccl:reduce", "reduce"), ("barrier", "barrier"),
    ("nccl:send 0->3", "send"), ("nccl:recv 3<-0", "recv"), ("Send", "send"), ("Recv", "recv"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "all_reduce"),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", "reduce_scatter"), ("NCCLDEVKERNEL_ALLGATHER_RING", "all_gather"),
    ("AllGather", "all_gather"), ("gather", None), ("scatter", None), ("wait", None), ("", None), ("SendRecv", None),
])
def test_normalize_op(name, op):
    assert normalize_op(name) == op


def test_assign_seq_counts_per_comm_and_per_direction_peer():
    comm = np.array(["tp", "pp", "pp", "tp", "pp", "pp"])
    op = np.array(["all_reduce", "send", "recv", "all_gather", "send", "send"])
    peer = np.array([-1, 4, 4, 4, 4, 8])
    assert assign_seq(comm, op, peer).tolist() == [0, 0, 0, 1, 1, 0]
    assert assign_seq(comm, op, peer, np.array([7, -1, -1, 9, -1, -1])).tolist() == [7, 0, 0, 9, 1, 0]


@given(st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=60))
def test_assign_seq_collectives_are_0_to_k(comms):
    seq = assign_seq(np.array(comms), np.array(["all_reduce"] * len(comms)), np.full(len(comms), -1))
    for c in set(comms):
        assert seq[np.array(comms) == c].tolist() == list(range(comms.count(c)))


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 12), st.integers(2, 6), st.integers(0, 11), st.integers(0, 2**31))
def test_period_inference_recovers_iterations(period, repeats, phase, seed):
    rng = np.random.default_rng(seed)
    pattern = [f"op{i}" for i in range(period)]
    sig = (pattern * (repeats + 1))[phase % period:][: period * repeats]
    gaps = rng.integers(10, 20, size=len(sig))
    boundary = np.array([(phase % period + i) % period == 0 for i in range(len(sig))])
    gaps[boundary] += 1000  # the gap before each iteration's first op
    res = infer_iterations_by_period(sig, np.cumsum(gaps))
    assert res is not None and res[0][0] == 0
    it, p = res
    assert p == period
    # every iteration starts exactly where the big gaps are
    starts = np.flatnonzero(np.r_[True, np.diff(it) != 0])
    assert set(starts[1:].tolist()) == set(np.flatnonzero(boundary).tolist()) - {0}


def test_period_inference_gives_up_on_noise():
    rng = np.random.default_rng(1)
    sig = [f"x{v}" for v in rng.integers(0, 50, size=40)]
    assert infer_iterations_by_period(sig, np.arange(40)) is None


def test_align_iterations_and_p2p_by_time():
    offs = align_iterations({0: [("g", 1), ("g", 2)], 1: [None, ("g", 2)], 2: [("h", 0)]},
                            {0: np.array([5, 6]), 1: np.array([0, 1]), 2: np.array([0])})
    assert offs[1] - offs[0] == 5 and min(offs.values()) == 0
    assert align_p2p_by_time(np.array([0, 100, 200, 300]), np.array([199, 301])) == 2
    assert align_p2p_by_time(np.array([500]), np.array([10, 498])) == -1


def test_group_registry_rejects_conflicting_ranks():
    reg = GroupRegistry()
    assert reg.add("43", [0, 4, 8, 12], "PIPELINE_MODEL_PARALLEL_GROUP") == "pp-43"
    assert reg.ranks("43") == [0, 4, 8, 12]
    with pytest.raises(ConvertError, match="dump_3.*'43'"):
        reg.add("43", [0, 4], "PIPELINE_MODEL_PARALLEL_GROUP", source="dump_3")
    assert reg.add("7", [12, 14], "DATA_PARALLEL_GROUP_WITH_CP") == "dp-7"
    assert reg.communicators()["dp-7"] == {"kind": "dp", "ranks": [12, 14], "name": "DATA_PARALLEL_GROUP_WITH_CP"}


def test_notes_warn_emits_convert_warning():
    n = Notes("x", "src")
    with pytest.warns(ConvertWarning, match="guessed"):
        n.warn("guessed something")
    n.skip("gather", 3)
    with pytest.warns(ConvertWarning, match="skipped 3"):
        info = n.finish()
    assert info.details["skipped"] == {"gather": 3} and len(info.warnings) == 2


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _EvilPopen:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (subprocess.call, (["touch", self.marker],))


@pytest.mark.parametrize("cls, proto", [(_Evil, 0), (_Evil, 2), (_EvilPopen, 4), (_EvilPopen, 5)])
def test_safe_pickle_refuses_code_and_runs_nothing(tmp_path, cls, proto):
    marker = tmp_path / "pwned"
    payload = pickle.dumps({"version": "2.9", "entries": [cls(str(marker))]}, protocol=proto)
    f = tmp_path / "_dump_0"
    f.write_bytes(payload)
    with pytest.raises(ParseError, match=r"_dump_0: refusing to unpickle global"):
        safe_load(f)
    assert not marker.exists()


def test_safe_pickle_accepts_plain_data_and_rejects_truncation():
    data = {"a": [1, 2.5, None, True, "s", b"b", (1, 2)], "s": {1, 2}, "f": frozenset({3})}
    for proto in (0, 2, 5):
        assert safe_loads(pickle.dumps(data, protocol=proto)) == data
    with pytest.raises(ParseError, match="dump: not a readable pickle"):
        safe_loads(pickle.dumps(data)[:-7], source="dump")
    with pytest.raises(ParseError, match="empty"):
        safe_loads(b"", source="dump")


def test_convert_rejects_unknown_format(tmp_path):
    with pytest.raises(ConfigError, match="unknown trace format 'csv'"):
        convert("csv", tmp_path, tmp_path / "job")
