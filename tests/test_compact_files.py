"""The compact forms of job.json and topology.json (large jobs): read back exactly as the long forms."""

from __future__ import annotations

import json

import pytest

import holmes
from holmes.errors import HolmesError, TopologyError
from holmes.io import write_job
from holmes.io.models import JobMeta
from holmes.io.schema import ops_table
from holmes.io.writer import job_json_text
from holmes.topology import ClusterTopology, fat_tree, load_topology, rail_optimized
from holmes.topology.layout import ParallelLayout


def _meta(**parallel) -> JobMeta:
    lay = ParallelLayout(**parallel)
    comms = {cid: {"kind": c.kind, "ranks": list(c.ranks)} for cid, c in lay.communicators().items()}
    return JobMeta.model_validate({"world_size": lay.world_size, "parallel": lay.to_dict(), "communicators": comms})


@pytest.mark.parametrize("parallel", [dict(tp=2, pp=2, dp=2), dict(tp=2, dp=2, cp=2), dict(tp=4, pp=2, dp=2)])
def test_compact_job_json_reads_back_the_same_communicators(tmp_path, parallel):
    meta = _meta(**parallel)
    text = job_json_text(meta, compact=True)
    assert "communicators" not in json.loads(text) and "\n" not in text.rstrip("\n")
    for name, t in (("long", job_json_text(meta, compact=False)), ("compact", text)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "job.json").write_text(t)
    long, compact = holmes.read_job(tmp_path / "long"), holmes.read_job(tmp_path / "compact")
    assert compact.communicators == long.communicators and len(long.communicators) == len(meta.communicators)


def test_communicators_parallel_does_not_derive_are_kept():
    meta = _meta(tp=2, pp=2, dp=2)
    d = meta.to_json_dict()
    d["communicators"]["tp-0"]["ranks"] = [1, 0]          # group order differs from the derived one
    assert "communicators" in json.loads(job_json_text(JobMeta.model_validate(d), compact=True))
    d = meta.to_json_dict()
    d["communicators"]["world"] = {"kind": "other", "ranks": list(range(8))}   # one more
    assert json.loads(job_json_text(JobMeta.model_validate(d), compact=True))["communicators"]["world"]
    d = meta.to_json_dict()
    del d["communicators"]["dp-0"]                          # one fewer
    assert "tp-0" in json.loads(job_json_text(JobMeta.model_validate(d), compact=True))["communicators"]


def test_write_job_is_compact_from_the_size_on(tmp_path, monkeypatch):
    import holmes.io.writer as w

    meta = _meta(tp=2, pp=2, dp=2)
    logs = {r: ops_table(rank=[r], iteration=[0], op_index=[0], comm_id=[f"tp-{r // 2}"], seq=[0], op=["all_reduce"],
                         peer=[None], nbytes=[4], start_ns=[0], end_ns=[9]) for r in range(8)}
    write_job(tmp_path / "small", meta, logs)
    assert "communicators" in json.loads((tmp_path / "small" / "job.json").read_text())
    monkeypatch.setattr(w, "COMPACT_FROM_RANKS", 8)
    write_job(tmp_path / "big", meta, logs)
    assert "communicators" not in json.loads((tmp_path / "big" / "job.json").read_text())
    small, big = holmes.read_job(tmp_path / "small"), holmes.read_job(tmp_path / "big")
    assert big.communicators == small.communicators
    assert big.ops(3).equals(small.ops(3))


@pytest.mark.parametrize("make", [lambda: rail_optimized(32, 4, 2, 2), lambda: rail_optimized(64),
                                  lambda: fat_tree(16, 2, k=4), lambda: rail_optimized(4, 4)])
def test_compact_topology_round_trip(tmp_path, make):
    t = make()
    p = tmp_path / "topology.json"
    t.save(p, compact=True)
    assert "nic_switch" in json.loads(p.read_text())
    u = load_topology(p)
    assert repr(u) == repr(t) and u.num_links == t.num_links
    links = t.devices("link")
    assert all(u.kind_of(d) == "link" for d in links)      # answered before the cables are listed
    assert u == t and u.to_dict() == t.to_dict() and u.devices() == t.devices()
    n = t.num_gpus
    assert [u.path(a, (a * 7 + 3) % n) for a in range(n)] == [t.path(a, (a * 7 + 3) % n) for a in range(n)]
    assert [u.downstream_nics(d) for d in u.switches] == [t.downstream_nics(d) for d in t.switches]


def test_compact_topology_mixed_with_long_links():
    t = ClusterTopology.from_dict({"schema": "holmes.topology/1", "num_gpus": 2, "gpus_per_host": 1,
                                   "switches": ["switch:b", "switch:a"], "links": [["nic:1", "switch:a"]],
                                   "nic_switch": [0, -1], "switch_links": [[0, 1]]})
    assert t.path(0, 1) == ("nic:0", "link:nic:0|switch:b", "switch:b", "link:switch:a|switch:b", "switch:a",
                            "link:nic:1|switch:a", "nic:1")
    assert "link:nic:0|switch:a" not in t and "link:nic:1|switch:a" in t and "link:switch:a|switch:b" in t


BASE = {"schema": "holmes.topology/1", "name": "x", "gpus_per_host": 1, "num_gpus": 2,
        "switches": ["switch:s", "switch:t"]}


@pytest.mark.parametrize("change, match", [
    ({"nic_switch": [0]}, "one switch index per GPU"),
    ({"nic_switch": [0, 2]}, r"nic_switch\[1\] = 2"),
    ({"nic_switch": [0, -2]}, r"nic_switch\[1\] = -2"),
    ({"nic_switch": [0, -1]}, "nic:1 has no link"),
    ({"nic_switch": [0, 0], "links": [["nic:1", "switch:t"]]}, "nic:1 has more than one link"),
    ({"nic_switch": [0, "1"]}, "nic_switch.1"),
    ({"nic_switch": [0, 1], "switch_links": [[0, 0]]}, "to itself"),
    ({"nic_switch": [0, 1], "switch_links": [[0, 1], [1, 0]]}, "duplicate link 'link:switch:s|switch:t'"),
    ({"nic_switch": [0, 1], "switch_links": [[0, 1]], "links": [["switch:t", "switch:s"]]}, "duplicate link"),
    ({"nic_switch": [0, 1], "switch_links": [[0, 5]]}, r"switch_links\[0\]"),
])
def test_malformed_compact_topology_raises(tmp_path, change, match):
    p = tmp_path / "topology.json"
    p.write_text(json.dumps({**BASE, **change}))
    with pytest.raises(TopologyError, match=match) as info:
        load_topology(p)
    assert str(p) in str(info.value) and isinstance(info.value, HolmesError)


@pytest.mark.parametrize("n,g,pod,spines", [(64, 8, 4, 2), (48, 4, 2, 3), (16, 2, 1, 1), (8, 8, 32, None)])
def test_rail_optimized_built_compact_equals_its_cables_listed(n, g, pod, spines):
    got = rail_optimized(n, g, hosts_per_pod=pod, num_spines=spines)
    s = g if spines is None else spines
    leaves = [f"switch:leaf-{i}" for i in range(-(-(n // g) // pod) * g)]
    tops = [f"switch:spine-{j}" for j in range(s)]
    links = [(f"nic:{r}", leaves[(r // g // pod) * g + r % g]) for r in range(n)]
    links += [(a, b) for a in leaves for b in tops]
    want = ClusterTopology(n, g, leaves + tops, links, name=got.name, kind="rail-optimized")
    assert got.to_dict() == want.to_dict() and got.to_json() == want.to_json() and got.num_links == len(links)
    assert [got.path(0, r) for r in range(n)] == [want.path(0, r) for r in range(n)]
