"""Tests of holmes.topology.cluster / generators: device ids, routes, C(d) and H(d), topology.json."""

from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from holmes.errors import ConfigError, HolmesError, TopologyError
from holmes.topology import (
    ClusterTopology,
    default_topology,
    fat_tree,
    load_topology,
    rail_optimized,
)
from holmes.topology.cluster import decay_factor
from holmes.topology import kinds

# 4 pods of 2 hosts x 4 GPUs: leaf i = pod * 4 + rail, 2 spines
SMALL = dict(num_gpus=32, gpus_per_host=4, hosts_per_pod=2, num_spines=2)


@pytest.fixture(scope="module")
def topo() -> ClusterTopology:
    return rail_optimized(**SMALL)


def assert_well_formed(t: ClusterTopology, a: int, b: int, path: tuple[str, ...]) -> None:
    """Device, cable, device, ..., each cable joining its two neighbours on the path."""
    assert all(d in t for d in path)
    if t.host_of(a) == t.host_of(b):
        assert path == (f"nvswitch:{t.host_of(a)}",)
        return
    assert path[0] == f"nic:{a}" and path[-1] == f"nic:{b}"
    assert len(path) % 2 == 1
    for i, dev in enumerate(path):
        assert (t.kind_of(dev) == "link") == (i % 2 == 1)
    for i in range(1, len(path), 2):
        assert path[i] == kinds.link(path[i - 1], path[i + 1])
        assert t.graph.has_edge(path[i - 1], path[i + 1])
        assert t.graph.edges[path[i - 1], path[i + 1]]["id"] == path[i]
    assert len(set(path)) == len(path)


# ---------------------------------------------------------------------- paths
def test_path_inside_a_host(topo):
    assert topo.path(0, 3) == ("nvswitch:0",)
    assert topo.path(5, 6) == ("nvswitch:1",)
    assert topo.path(7, 7) == ()


def test_path_same_rail_same_pod_uses_one_leaf(topo):
    # GPU 1 (host 0) and GPU 5 (host 1): both rail 1 of pod 0 -> leaf-1 only
    assert topo.path(1, 5) == (
        "nic:1", "link:nic:1|switch:leaf-1", "switch:leaf-1", "link:nic:5|switch:leaf-1", "nic:5",
    )
    assert topo.leaf_of(1) == topo.leaf_of(5) == "switch:leaf-1"


def test_path_across_rails_goes_through_a_spine(topo):
    p = topo.path(0, 5)  # rail 0 -> rail 1, same pod
    assert len(p) == 9
    assert p[2] == "switch:leaf-0" and p[6] == "switch:leaf-1"
    assert p[4] in ("switch:spine-0", "switch:spine-1")
    assert_well_formed(topo, 0, 5, p)


def test_path_across_pods(topo):
    # GPU 2 (pod 0, rail 2) -> GPU 26 (host 6, pod 3, rail 2): same rail, other pod
    p = topo.path(2, 26)
    assert p[2] == "switch:leaf-2" and p[6] == "switch:leaf-14" and p[4].startswith("switch:spine-")
    assert_well_formed(topo, 2, 26, p)


def test_all_paths_symmetric_and_adjacent(topo):
    for a in range(topo.num_gpus):
        for b in range(topo.num_gpus):
            p = topo.path(a, b)
            assert topo.path(b, a) == p[::-1]
            if a != b:
                assert_well_formed(topo, a, b, p)


def test_ecmp_spreads_over_spines_deterministically():
    t = rail_optimized(256, hosts_per_pod=4, num_spines=4)
    spines = {t.path(a, b)[4] for a in range(0, 64, 8) for b in range(129, 256, 8)}
    assert len(spines) == 4
    again = rail_optimized(256, hosts_per_pod=4, num_spines=4)
    assert all(t.path(a, a + 97) == again.path(a, a + 97) for a in range(100))


def test_fat_tree_paths():
    t = fat_tree(128, gpus_per_host=4, k=8)  # 4 NICs per ToR, 4 ToRs + 4 aggs per pod, 16 cores
    assert t.kind == "fat-tree" and len(t.devices("switch")) == 32 + 32 + 16
    assert t.path(0, 3) == ("nvswitch:0",)
    p = t.path(0, 5)  # ToR 0 -> ToR 1 in pod 0: tor - agg - tor
    assert [t.kind_of(d) for d in p[::2]] == ["nic", "switch", "switch", "switch", "nic"]
    assert p[2] == "switch:tor-0" and p[4].startswith("switch:agg-") and p[6] == "switch:tor-1"
    p = t.path(0, 127)  # pod 0 -> pod 7: tor - agg - core - agg - tor
    assert len(p) == 13 and p[6].startswith("switch:core-")
    for a, b in [(0, 5), (0, 127), (17, 90), (64, 3)]:
        assert_well_formed(t, a, b, t.path(a, b))
        assert t.path(b, a) == t.path(a, b)[::-1]
    # the aggregation switch on the way up is cabled to the core on the path
    assert t.graph.has_edge(p[4], p[6]) and t.graph.has_edge(p[6], p[8])


def test_fat_tree_default_k_and_config_errors():
    t = fat_tree(64)
    assert t.leaf_of(0) == t.leaf_of(7)  # a host's NICs share a ToR
    with pytest.raises(ConfigError):
        fat_tree(16, k=3)
    with pytest.raises(ConfigError, match="holds at most"):
        fat_tree(1000, k=4)
    with pytest.raises(ConfigError):
        rail_optimized(12, gpus_per_host=8)
    with pytest.raises(ConfigError):
        rail_optimized(16, hosts_per_pod=0)


def test_default_topology_rounds_up_to_whole_hosts():
    t = default_topology(20)
    assert (t.num_gpus, t.gpus_per_host, t.kind) == (24, 8, "rail-optimized")
    assert t.host_of(19) == 2 and "gpu:23" in t and "gpu:24" not in t


# ---------------------------------------------------------------------- ids and lookups
def test_device_ids_and_kinds(topo):
    assert topo.kind_of("gpu:0") == "gpu" and topo.kind_of("host:7") == "host"
    assert topo.kind_of("nvswitch:7") == "nvswitch" and topo.kind_of("nic:31") == "nic"
    assert topo.kind_of("switch:spine-1") == "switch"
    assert topo.kind_of("link:switch:leaf-3|switch:spine-0") == "link"
    assert topo.nic_of(9) == "nic:9" and topo.host_of(9) == 2 and topo.leaf_of(9) == "switch:leaf-5"
    devs = topo.devices()
    assert len(devs) == len(set(devs))
    assert len(topo.devices("gpu")) == 32 and len(topo.devices("host")) == 8
    assert len(topo.devices("switch")) == 16 + 2
    assert len(topo.devices("link")) == 32 + 16 * 2
    assert set(topo.devices("link")) == {d["id"] for _, _, d in topo.graph.edges(data=True)}
    assert all(topo.kind_of(d) in ("gpu", "nic", "host", "nvswitch", "switch", "link") for d in devs)


@pytest.mark.parametrize(
    "bad",
    ["gpu:32", "nic:-1", "host:8", "nvswitch:99", "switch:nope", "link:nic:0|switch:leaf-1",
     "link:switch:spine-0|switch:leaf-3", "gpu:01", "cpu:0", "", "gpu"],
)
def test_unknown_devices_raise_topology_error(topo, bad):
    assert bad not in topo
    for fn in (topo.kind_of, topo.downstream_nics, topo.decay):
        with pytest.raises(TopologyError, match="unknown device"):
            fn(bad)


def test_bad_ranks_and_kinds(topo):
    with pytest.raises(TopologyError):
        topo.path(0, 32)
    with pytest.raises(TopologyError):
        topo.host_of(-1)
    with pytest.raises(ConfigError):
        topo.devices("router")
    assert 17 not in topo


# ---------------------------------------------------------------------- C(d) and H(d)
def test_downstream_nics_and_decay_values():
    t = rail_optimized(512)  # 64 hosts, 2 pods of 32 hosts, 16 leaves of 32 NICs, 8 spines
    c = {d: t.downstream_nics(d) for d in (
        "gpu:3", "nic:3", "link:nic:3|switch:leaf-3", "switch:leaf-3",
        "link:switch:leaf-3|switch:spine-0", "switch:spine-0", "nvswitch:0", "host:0")}
    assert c == {
        "gpu:3": 1, "nic:3": 1, "link:nic:3|switch:leaf-3": 1, "switch:leaf-3": 32,
        "link:switch:leaf-3|switch:spine-0": 32, "switch:spine-0": 512, "nvswitch:0": 8,
        "host:0": 8,
    }
    f3 = math.log(2 + 1e-6) / 3
    assert t.decay("nic:3") == t.decay("gpu:3") == t.decay("link:nic:3|switch:leaf-3") == 1.0
    assert t.decay("nvswitch:0") == 1.0
    assert t.decay("switch:leaf-3") == pytest.approx(math.log(31 + 1e-6) / 32 / f3)
    assert t.decay("switch:spine-0") == pytest.approx(math.log(511 + 1e-6) / 512 / f3)
    assert 0 < t.decay("switch:spine-0") < t.decay("switch:leaf-3") < t.decay("nvswitch:0")
    assert t.decay("link:switch:leaf-3|switch:spine-0") == t.decay("switch:leaf-3")


def test_fat_tree_downstream_counts():
    t = fat_tree(128, gpus_per_host=4, k=8)
    assert t.downstream_nics("switch:tor-0") == 4
    assert t.downstream_nics("switch:agg-5") == 16
    assert t.downstream_nics("switch:core-0") == 128
    assert t.downstream_nics("link:switch:agg-0|switch:core-0") == 16


def test_decay_is_monotone_and_bounded():
    values = [decay_factor(c) for c in range(0, 20000)]
    assert all(0 < v <= 1 for v in values)
    assert all(x >= y for x, y in zip(values, values[1:]))
    assert values[1] == values[2] == values[8] == 1.0 and values[32] < 0.5


# ---------------------------------------------------------------------- topology.json
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    hosts=st.integers(1, 12), gph=st.sampled_from([1, 2, 4, 8]), hpp=st.integers(1, 4),
    spines=st.integers(1, 3), tree=st.booleans(), seed=st.integers(0, 2**16),
)
def test_json_round_trip_keeps_paths(tmp_path_factory, hosts, gph, hpp, spines, tree, seed):
    n = hosts * gph
    t = fat_tree(n, gph, k=max(4, 2 * math.ceil((4 * n) ** (1 / 3) / 2) + 2)) if tree else \
        rail_optimized(n, gph, hpp, spines)
    path = tmp_path_factory.mktemp("topo") / "topology.json"
    t.save(path)
    u = load_topology(path)
    assert u == t and u.to_dict() == t.to_dict() and u.kind == t.kind
    rng = random.Random(seed)
    for _ in range(30):
        a, b = rng.randrange(n), rng.randrange(n)
        assert u.path(a, b) == t.path(a, b)
    assert [u.downstream_nics(d) for d in u.devices("switch")] == \
        [t.downstream_nics(d) for d in t.devices("switch")]


def test_custom_topology_from_dict():
    data = {
        "schema": "holmes.topology/1", "name": "ring", "kind": "custom", "gpus_per_host": 2,
        "num_gpus": 6,
        "switches": ["switch:a", "switch:b", "switch:c"],
        "links": [["nic:0", "switch:a"], ["nic:1", "switch:a"], ["nic:2", "switch:b"],
                  ["nic:3", "switch:b"], ["switch:c", "nic:4"], ["nic:5", "switch:c"],
                  ["switch:a", "switch:b"], ["switch:b", "switch:c"]],
    }
    t = ClusterTopology.from_dict(data)
    assert t.path(0, 4) == (
        "nic:0", "link:nic:0|switch:a", "switch:a", "link:switch:a|switch:b", "switch:b",
        "link:switch:b|switch:c", "switch:c", "link:nic:4|switch:c", "nic:4",
    )
    assert t.path(4, 0) == t.path(0, 4)[::-1]
    assert t.downstream_nics("switch:b") == 2 and t.downstream_nics("switch:a") == 2


def _write(tmp_path, obj) -> str:
    p = tmp_path / "topology.json"
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return str(p)


GOOD = {"schema": "holmes.topology/1", "name": "x", "kind": "custom", "gpus_per_host": 1,
        "num_gpus": 2, "switches": ["switch:s"], "links": [["nic:0", "switch:s"], ["nic:1", "switch:s"]]}


@pytest.mark.parametrize(
    "change, match",
    [
        ({"color": "red"}, "unknown key 'color'"),
        ({"schema": "holmes.topology/2"}, "key 'schema'"),
        ({"num_gpus": "2"}, "key 'num_gpus'"),
        ({"gpus_per_host": 0}, "key 'gpus_per_host'"),
        ({"kind": "torus"}, "key 'kind'"),
        ({"switches": None}, "key 'switches'"),
        ({"links": [["nic:0"]]}, "links.0"),
        ({"links": [["nic:0", "switch:zz"], ["nic:1", "switch:s"]]}, "switch:zz"),
        ({"links": [["nic:0", "switch:s"], ["nic:7", "switch:s"]]}, "nic:7"),
        ({"links": [["nic:0", "switch:s"]]}, "nic:1 has no link"),
        ({"links": [["nic:0", "switch:s"], ["nic:1", "switch:s"], ["switch:s", "nic:1"]]}, "duplicate"),
        ({"links": [["nic:0", "nic:1"]]}, "two NICs"),
        ({"switches": ["switch:s", "switch:s"]}, "duplicate switch"),
        ({"switches": ["leaf-1"]}, "bad switch id"),
    ],
)
def test_malformed_topology_file_raises(tmp_path, change, match):
    data = {**GOOD, **change}
    path = _write(tmp_path, data)
    with pytest.raises(TopologyError, match=match) as info:
        load_topology(path)
    assert path in str(info.value) and isinstance(info.value, HolmesError)


def test_missing_key_unreadable_and_non_json_files(tmp_path):
    data = dict(GOOD)
    del data["num_gpus"]
    with pytest.raises(TopologyError, match="missing key 'num_gpus'"):
        load_topology(_write(tmp_path, data))
    with pytest.raises(TopologyError, match="not valid JSON"):
        load_topology(_write(tmp_path, "{not json"))
    with pytest.raises(TopologyError, match="must be a JSON object"):
        load_topology(_write(tmp_path, "[1, 2]"))
    with pytest.raises(TopologyError, match="absent.json: file not found"):
        load_topology(tmp_path / "absent.json")
    assert ClusterTopology.load(_write(tmp_path, GOOD)).path(0, 1)[2] == "switch:s"


def test_large_rail_optimized_is_fast_enough():
    import time

    t0 = time.perf_counter()
    t = rail_optimized(16384)
    built = time.perf_counter() - t0
    assert built < 3.0  # generous: the benchmark measures the real figure
    assert t.downstream_nics("switch:spine-0") == 16384
    assert t.downstream_nics("switch:leaf-0") == 32
    p = t.path(0, 16383)
    assert p[2] == "switch:leaf-0" and p[-3] == "switch:leaf-511"
