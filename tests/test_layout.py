"""Tests of holmes.topology.layout: Megatron rank groups, communicators, group-name kinds, and
layout inference (including a real 16-rank Megatron Flight Recorder job)."""

from __future__ import annotations

import ast
import itertools
import pickle
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from holmes.errors import HolmesError, LayoutError
from holmes.topology import (
    KINDS,
    Communicator,
    ParallelLayout,
    infer_layout,
    kind_from_group_name,
)
from holmes.topology.layout import GROUP_KINDS, MEGATRON_GROUP_KINDS

FR_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "flight_recorder" / "gpu_error_1st"
TOKENS = ("tp", "cp", "ep", "dp", "pp")


# ---------------------------------------------------------------------- reference algorithm
def reference_groups(sizes: list[int], mask: list[bool]) -> list[list[int]]:
    """Plain-loop statement of Megatron's generate_masked_orthogonal_rank_groups: groups are
    enumerated by the unmasked coordinates and members by the masked ones, first token fastest."""
    strides = [int(np.prod(sizes[:i])) for i in range(len(sizes))]
    masked = [i for i, m in enumerate(mask) if m]
    unmasked = [i for i, m in enumerate(mask) if not m]

    def coords(index: int, dims: list[int]) -> list[int]:
        out = []
        for d in dims:
            out.append(index % sizes[d])
            index //= sizes[d]
        return out

    gsize = int(np.prod([sizes[i] for i in masked])) if masked else 1
    world = int(np.prod(sizes))
    groups = []
    for gi in range(world // gsize):
        base = sum(c * strides[d] for c, d in zip(coords(gi, unmasked), unmasked))
        groups.append(
            [base + sum(c * strides[d] for c, d in zip(coords(j, masked), masked)) for j in range(gsize)]
        )
    return groups


REF_SPECS = {
    "tp": ("dense", "tp"), "cp": ("dense", "cp"), "dp": ("dense", "dp"), "dp_cp": ("dense", "dp-cp"),
    "pp": ("dense", "pp"), "mp": ("dense", "tp-pp"), "tp_cp": ("dense", "tp-cp"),
    "tp_dp": ("dense", "tp-dp"), "tp_dp_cp": ("dense", "tp-dp-cp"), "ep": ("expert", "ep"),
    "etp": ("expert", "tp"), "edp": ("expert", "dp"), "etp_ep": ("expert", "tp-ep"),
    "etp_ep_pp": ("expert", "tp-ep-pp"),
}


def reference(lay: ParallelLayout, kind: str) -> list[tuple[int, ...]]:
    which, token = REF_SPECS[kind]
    toks = lay.order.split("-")
    toks += [t for t in TOKENS if t not in toks]
    if which == "dense":
        size = {"tp": lay.tp, "cp": lay.cp, "ep": 1, "dp": lay.dp, "pp": lay.pp}
    else:
        size = {"tp": lay.expert_tp, "cp": 1, "ep": lay.ep, "dp": lay.expert_dp, "pp": lay.pp}
    want = token.split("-")
    return [tuple(g) for g in reference_groups([size[t] for t in toks], [t in want for t in toks])]


# ---------------------------------------------------------------------- strategies
@st.composite
def layouts(draw, max_world: int = 512) -> ParallelLayout:
    divs = [1, 2, 3, 4, 8]
    while True:
        tp, pp, dp, cp = (draw(st.sampled_from(divs)) for _ in range(4))
        if tp * pp * dp * cp <= max_world:
            break
    inner = tp * cp * dp
    etp = draw(st.sampled_from([d for d in (1, 2, 4, tp) if inner % d == 0]))
    ep = draw(st.sampled_from([d for d in (1, 2, 3, 4, 8) if inner % (etp * d) == 0]))
    order = "-".join(draw(st.permutations(TOKENS)))
    kw = dict(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=None if etp == tp else etp)
    try:
        return ParallelLayout(**kw, order=order)
    except LayoutError as exc:  # Megatron rejects non-pp-last orders whose pp groups differ
        assert "pipeline groups differ" in str(exc)
        return ParallelLayout(**kw, order="-".join([t for t in order.split("-") if t != "pp"] + ["pp"]))


# ---------------------------------------------------------------------- examples
def test_megatron_default_order_examples():
    lay = ParallelLayout(tp=2, pp=2, dp=2)
    assert lay.world_size == 8
    assert lay.groups("tp") == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert lay.groups("dp") == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert lay.groups("pp") == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert lay.groups("mp") == [(0, 1, 4, 5), (2, 3, 6, 7)]
    comms = lay.communicators()
    assert comms["tp-0"] == Communicator("tp", (0, 1))
    assert comms["pp-3"] == Communicator("pp", (3, 7))
    assert comms["dp-2"] == Communicator("dp", (4, 6))
    assert len(comms) == 12 and not any(k.startswith(("cp", "ep")) for k in comms)


def test_megatron_docstring_example_16_ranks():
    # initialize_model_parallel docstring: 16 GPUs, tp=2, pp=4 -> dp=2
    lay = ParallelLayout(tp=2, pp=4, dp=2)
    assert lay.groups("dp") == [(0, 2), (1, 3), (4, 6), (5, 7), (8, 10), (9, 11), (12, 14), (13, 15)]
    assert lay.groups("pp") == [(0, 4, 8, 12), (1, 5, 9, 13), (2, 6, 10, 14), (3, 7, 11, 15)]
    assert lay.groups("embedding") == [(0, 12), (1, 13), (2, 14), (3, 15)]
    assert lay.groups("position_embedding") == [(0,), (1,), (2,), (3,)]


def test_tp_pp_dp_order_and_cp_dp_communicators():
    lay = ParallelLayout(tp=2, pp=2, dp=2, order="tp-pp-dp")
    assert lay.groups("dp") == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert lay.groups("pp") == [(0, 2), (1, 3), (4, 6), (5, 7)]
    lay = ParallelLayout(tp=2, cp=2, dp=2)
    assert lay.groups("cp") == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert lay.groups("dp") == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert lay.groups("dp_cp") == [(0, 2, 4, 6), (1, 3, 5, 7)]
    comms = lay.communicators()
    # kind "dp" communicators are the gradient-reduction groups (DATA_PARALLEL_GROUP_WITH_CP)
    assert comms["dp-0"] == Communicator("dp", (0, 2, 4, 6))
    assert comms["cp-1"] == Communicator("cp", (1, 3))
    assert lay.comm_id_of(6, "dp") == "dp-0"


def test_expert_groups_and_edp_communicators():
    lay = ParallelLayout(tp=2, dp=4, ep=2)
    assert lay.expert_dp == 2
    assert lay.groups("ep") == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert lay.groups("edp") == [(0, 4), (1, 5), (2, 6), (3, 7)]
    comms = lay.communicators(expert_data=True)
    assert comms["edp-1"] == Communicator("dp", (1, 5))
    assert comms["ep-0"].kind == "ep"
    assert lay.coords(6) == {"tp": 0, "cp": 0, "dp": 3, "pp": 0, "ep": 1}


def test_coords_pp_neighbours_and_comm_ids():
    lay = ParallelLayout(tp=2, pp=4, dp=2)
    assert lay.coords(13) == {"tp": 1, "cp": 0, "dp": 0, "pp": 3, "ep": 0}
    assert (lay.pp_prev(1), lay.pp_next(1)) == (None, 5)
    assert (lay.pp_prev(13), lay.pp_next(13)) == (9, None)
    assert lay.group_of(9, "pp") == (1, 5, 9, 13)
    assert lay.comm_id_of(9, "pp") == "pp-1" and lay.comm_id_of(9, "tp") == "tp-4"
    with pytest.raises(LayoutError, match="no cp communicators"):
        lay.comm_id_of(0, "cp")
    with pytest.raises(LayoutError, match="outside world_size"):
        lay.group_of(16, "tp")
    with pytest.raises(LayoutError, match="unknown group kind"):
        lay.groups("xx")
    assert ParallelLayout(tp=2).pp_next(0) is None


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"tp": 0}, "tp=0"),
        ({"dp": -2}, "dp=-2"),
        ({"pp": 1.5}, "pp=1.5"),
        ({"tp": True}, "tp=True"),
        ({"etp": 0}, "etp=0"),
        ({"order": "tp-dp"}, "lacks 'pp'"),
        ({"order": "tp-dp-pp-tp"}, "repeats"),
        ({"order": "tp-xp-dp-pp"}, "unknown token"),
        ({"cp": 2, "order": "tp-dp-pp"}, "lacks 'cp'"),
        ({"ep": 2, "dp": 2, "order": "tp-dp-pp"}, "lacks 'ep'"),
        ({"tp": 2, "dp": 3, "ep": 4}, "not divisible"),
        ({"order": 5}, "order must be a string"),
        ({"tp": 1, "pp": 2, "dp": 2, "ep": 2, "order": "tp-ep-pp-dp"}, "pipeline groups differ"),
    ],
)
def test_bad_layouts_raise_layout_error(kwargs, match):
    with pytest.raises(LayoutError, match=match) as info:
        ParallelLayout(**kwargs)
    assert isinstance(info.value, HolmesError)


def test_order_is_normalised_and_optional_tokens():
    lay = ParallelLayout(tp=2, dp=2, pp=2, order=" TP-DP-PP ")
    assert lay.order == "tp-dp-pp"
    assert lay.groups("dp") == ParallelLayout(tp=2, dp=2, pp=2).groups("dp")
    assert lay.to_dict() == {"tp": 2, "pp": 2, "dp": 2, "cp": 1, "ep": 1, "order": "tp-dp-pp"}


def test_communicator_validation():
    assert Communicator("pp", (7, 3)).ranks == (3, 7)
    for kind, ranks in [("xx", (0,)), ("tp", ()), ("tp", (1, 1)), ("tp", (-1, 2)), ("tp", ("a",))]:
        with pytest.raises(LayoutError):
            Communicator(kind, ranks)


# ---------------------------------------------------------------------- properties
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts())
def test_groups_partition_ranks_and_match_reference(lay):
    world = lay.world_size
    for kind in REF_SPECS:
        groups = lay.groups(kind)
        assert groups == reference(lay, kind), kind
        flat = sorted(itertools.chain.from_iterable(groups))
        assert flat == list(range(world)), kind  # each rank in exactly one group
        assert len({len(g) for g in groups}) == 1
        assert all(list(g) == sorted(g) for g in groups)
        for r in (0, world // 2, world - 1):
            assert r in lay.group_of(r, kind)
    degrees = {"tp": lay.tp, "cp": lay.cp, "dp": lay.dp, "pp": lay.pp, "ep": lay.ep,
               "etp": lay.expert_tp, "edp": lay.expert_dp, "dp_cp": lay.dp * lay.cp,
               "mp": lay.tp * lay.pp}
    for kind, d in degrees.items():
        assert lay.degree(kind) == d and len(lay.groups(kind)) == world // d


@settings(max_examples=100, deadline=None)
@given(layouts())
def test_pp_neighbours_and_coords_consistent(lay):
    toks = lay.order.split("-")
    toks += [t for t in TOKENS if t not in toks]
    size = {"tp": lay.tp, "cp": lay.cp, "ep": 1, "dp": lay.dp, "pp": lay.pp}
    for r in range(lay.world_size):
        nxt, prv = lay.pp_next(r), lay.pp_prev(r)
        c = lay.coords(r)
        assert (nxt is None) == (c["pp"] == lay.pp - 1)
        assert (prv is None) == (c["pp"] == 0)
        if nxt is not None:
            assert lay.pp_prev(nxt) == r and lay.coords(nxt)["pp"] == c["pp"] + 1
        stride, rank = 1, 0
        for t in toks:
            rank += c.get(t, 0) * stride if t != "ep" else 0
            stride *= size[t]
        assert rank == r
        assert lay.group_of(r, "ep")[c["ep"]] == r


@settings(max_examples=100, deadline=None)
@given(layouts(max_world=256))
def test_infer_layout_round_trips(lay):
    named = {}
    for desc, kind in MEGATRON_GROUP_KINDS.items():
        for i, g in enumerate(lay.groups(kind)):
            named[f"{desc}-{i}"] = (desc, list(g))
    got = infer_layout(named, lay.world_size)
    for kind in GROUP_KINDS:
        assert set(got.groups(kind)) == set(lay.groups(kind)), kind
    # from our own communicators only (etp is found from the ep groups)
    comms = {cid: (c.kind, c.ranks) for cid, c in lay.communicators().items()}
    got = infer_layout(comms, lay.world_size)
    assert (got.tp, got.cp, got.dp, got.pp, got.ep) == (lay.tp, lay.cp, lay.dp, lay.pp, lay.ep)
    assert got.communicators() == lay.communicators()


def test_infer_layout_defaults_and_errors():
    assert infer_layout({"0": ("default_pg", list(range(8)))}, 8) == ParallelLayout(dp=8)
    with pytest.raises(LayoutError, match="different sizes"):
        infer_layout({"a": ("tp", [0, 1]), "b": ("tp", [2, 3, 4])}, 8)
    with pytest.raises(LayoutError, match="outside world_size"):
        infer_layout({"a": ("tp", [0, 9])}, 8)
    with pytest.raises(LayoutError, match="no rank order"):
        infer_layout({"a": ("tp", [0, 5]), "b": ("pp", [0, 1])}, 8)
    with pytest.raises(LayoutError, match="inconsistent"):
        infer_layout({"a": ("tp", [0, 1, 2]), "b": ("pp", [0, 4])}, 8)


# ---------------------------------------------------------------------- group names
@pytest.mark.parametrize(
    "name, kind",
    [
        ("TENSOR_MODEL_PARALLEL_GROUP", "tp"), ("PIPELINE_MODEL_PARALLEL_GROUP", "pp"),
        ("DATA_PARALLEL_GROUP", "dp"), ("DATA_PARALLEL_GROUP_WITH_CP", "dp"),
        ("data_parallel_group_with_cp", "dp"), ("DATA_PARALLEL_GROUP_GLOO", "dp"),
        ("CONTEXT_PARALLEL_GROUP", "cp"), ("EXPERT_MODEL_PARALLEL_GROUP", "ep"),
        ("EXPERT_DATA_PARALLEL_GROUP", "dp"), ("EXPERT_TENSOR_PARALLEL_GROUP", "tp"),
        ("default_pg", "other"), ("MODEL_PARALLEL_GROUP", "other"), ("EMBEDDING_GROUP", "other"),
        ("POSITION_EMBEDDING_GROUP", "other"), ("TENSOR_AND_DATA_PARALLEL_GROUP", "other"),
        ("TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP", "other"),
        ("INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP", "other"),
        ("EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP", "other"),
        ("EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP", "other"), ("something_else", "other"),
        ("tp", "tp"), ("DP", "dp"), ("pp", "pp"), ("ep", "ep"), ("cp", "cp"),
        ("tensor_parallel", "tp"), ("Tensor Parallel", "tp"), ("pipeline", "pp"),
        ("data_parallel", "dp"), ("context-parallel-group", "cp"), ("expert_parallel_pg", "ep"),
        ("tp-0", "tp"), ("pp-3", "pp"), ("dp-0-1", "dp"), ("edp-2", "dp"), ("", "other"),
        (None, "other"), ("mp", "other"), ("HIERARCHICAL_CONTEXT_PARALLEL_GROUP_L0", "cp"),
    ],
)
def test_kind_from_group_name(name, kind):
    assert kind_from_group_name(name) == kind
    assert kind in KINDS


# ---------------------------------------------------------------------- real Megatron job
class _PlainUnpickler(pickle.Unpickler):
    """Admits only plain containers and scalars: any class or function lookup is refused."""

    def find_class(self, module, name):  # noqa: D102
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def _load_dump(path: Path) -> dict:
    with open(path, "rb") as fh:
        return _PlainUnpickler(fh).load()


@pytest.mark.skipif(not FR_DIR.is_dir(), reason=f"needs the Flight Recorder dumps at {FR_DIR} (../shared/data)")
def test_infer_layout_reproduces_megatron_flight_recorder_groups():
    groups: dict[str, tuple[str, str]] = {}
    per_rank: dict[int, dict[str, tuple[int, ...]]] = {}
    for rank in range(16):
        dump = _load_dump(FR_DIR / f"_dump_{rank}")
        mine = {}
        for name, cfg in dump["pg_config"].items():
            groups[str(name)] = (cfg["desc"], cfg["ranks"])
            mine[cfg["desc"]] = tuple(ast.literal_eval(cfg["ranks"]))
        per_rank[rank] = mine
    lay = infer_layout(groups, 16)
    assert (lay.tp, lay.pp, lay.dp, lay.cp, lay.ep, lay.expert_tp) == (2, 4, 2, 1, 4, 1)
    checked = set()
    for rank, mine in per_rank.items():
        for desc, ranks in mine.items():
            assert rank in ranks
            if desc in MEGATRON_GROUP_KINDS:
                kind = MEGATRON_GROUP_KINDS[desc]
                assert lay.group_of(rank, kind) == ranks, (rank, desc)
                assert ranks in lay.groups(kind)
                checked.add(desc)
            elif desc in ("default_pg", "INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP"):
                assert ranks == tuple(range(16))  # one distributed-optimizer instance
    assert checked >= {
        "TENSOR_MODEL_PARALLEL_GROUP", "PIPELINE_MODEL_PARALLEL_GROUP",
        "DATA_PARALLEL_GROUP_WITH_CP", "EXPERT_MODEL_PARALLEL_GROUP", "EXPERT_DATA_PARALLEL_GROUP",
        "MODEL_PARALLEL_GROUP", "TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP",
        "TENSOR_AND_CONTEXT_PARALLEL_GROUP", "EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP",
        "EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP", "EMBEDDING_GROUP",
    }
    # every group of each observed kind is reproduced, not only the ones listed
    for desc in checked:
        listed = {tuple(ast.literal_eval(r)) for d, r in groups.values() if d == desc}
        assert listed == set(lay.groups(MEGATRON_GROUP_KINDS[desc])), desc
    # the communicators a simulator would use for this job
    comms = lay.communicators()
    assert comms["tp-0"].ranks == (0, 1) and comms["pp-0"].ranks == (0, 4, 8, 12)
    assert comms["ep-3"].ranks == (12, 13, 14, 15) and comms["dp-7"].ranks == (13, 15)
    assert {kind_from_group_name(d) for d, _ in groups.values()} <= set(KINDS)
