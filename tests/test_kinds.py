"""The device-kind registry (holmes.topology.kinds) is the one place that builds and reads device ids."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from holmes.topology import kinds, rail_optimized
from holmes.topology.cluster import ClusterTopology

ROOT = Path(__file__).resolve().parents[1] / "holmes"


def test_every_topology_device_is_of_a_registered_kind():
    t = rail_optimized(32, gpus_per_host=8, hosts_per_pod=2, num_spines=2)
    devs = t.devices()
    assert [kinds.kind_of(d) for d in devs] == [t.kind_of(d) for d in devs]
    # listed kind by kind, in the registry's order
    order = [kinds.DEVICE_KINDS.index(kinds.kind_of(d)) for d in devs]
    assert order == sorted(order)
    assert len(t.devices("gpu")) == 32 and t.devices("host") == ["host:0", "host:1", "host:2", "host:3"]
    assert all(kinds.is_nic_cable(d) == kinds.is_point(d) for d in t.devices("link"))


def test_kind_attributes():
    assert [k for k, v in kinds.KINDS.items() if v.point] == ["gpu", "nic"]
    assert [k for k, v in kinds.KINDS.items() if v.compute] == ["gpu", "host"]
    assert {k: v.prior for k, v in kinds.KINDS.items()} == {"gpu": "gpu", "nic": "nic", "host": "cpu",
                                                            "nvswitch": "other", "switch": "switch", "link": "link"}
    assert kinds.prior_kind("pcie:0") == "other" and not kinds.is_point("pcie:0")
    assert kinds.ranks_of("host:1", 8, 12) == [8, 9, 10, 11] and kinds.rank_of("gpu:07") is None


@pytest.mark.parametrize("bad", ["gpu:32", "host:4", "switch:nope", "link:nic:0|switch:leaf-1", "gpu:-1"])
def test_topology_refuses_ids_it_does_not_hold(bad):
    t = rail_optimized(32, gpus_per_host=8, hosts_per_pod=2, num_spines=2)
    assert bad not in t


def test_no_device_id_is_built_outside_the_registry():
    built = re.compile(r'f"(gpu|nic|host|nvswitch|switch|link):\{')
    read = re.compile(r'startswith\("(gpu|nic|host|nvswitch|switch|link):|split\(":", 1\)|partition\(":"\)')
    bad = []
    for sub in ("localize", "report", "topology", "simulate"):
        for path in sorted((ROOT / sub).rglob("*.py")):
            if path.name == "kinds.py":
                continue
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if (built.search(line) or read.search(line)) and not line.lstrip().startswith((">>>", "...")):
                    bad.append(f"{path.relative_to(ROOT.parent)}:{n}: {line.strip()}")
    assert not bad, "\n".join(bad)


def test_cluster_numbers_members_from_the_registry():
    t = ClusterTopology(4, 2, ["switch:s"], [(f"nic:{g}", "switch:s") for g in range(4)])
    assert t.devices("nvswitch") == ["nvswitch:0", "nvswitch:1"] and t.downstream_nics("host:1") == 2
