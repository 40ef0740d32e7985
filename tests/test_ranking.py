"""Irregularity rate, device implication and MAP / linear accumulation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from holmes.errors import ConfigError
from holmes.localize.evidence.ranking import (DEFAULT_PRIOR, DeviceRanking, cause_devices, irregularity_rate,
                                     network_devices)
from holmes.topology import default_topology


def test_irregularity_rate_is_clipped_pearson():
    x = np.array([1.0, 1.0, 5.0, 1.0, 1.2])
    y = np.array([10.0, 10.0, 20.0, 10.5, 11.0])
    assert irregularity_rate(x, y) == pytest.approx(np.corrcoef(x, y)[0, 1])
    assert irregularity_rate(x, -y) == 0.0                      # negative correlation clipped
    assert irregularity_rate(np.ones(5), y) == 0.0              # constant series -> NaN -> 0
    assert irregularity_rate(np.array([1.0, np.nan, 3.0, 4.0]), np.array([1.0, 2.0, 3.0, 4.5])) > 0.9
    assert irregularity_rate(np.array([1.0, 2.0]), np.array([1.0, 2.0])) == 0.0  # too few points


def test_cause_devices_compute_network_and_exoneration():
    t = default_topology(32)
    assert cause_devices("compute", [9], t) == ["gpu:9", "host:1"]
    assert cause_devices("compute", [9], t, include_host=False) == ["gpu:9"]
    pair = cause_devices("network", [1, 17], t)
    assert pair == list(t.path(1, 17))
    ring = network_devices([0, 8, 16], t)
    assert set(t.path(0, 8)) | set(t.path(8, 16)) | set(t.path(16, 0)) == set(ring)
    kept = cause_devices("network", [1, 17], t, exonerated={"nic:1", "nic:17"})
    assert "nic:1" not in kept and kept
    assert cause_devices("network", [1, 17], t, exonerated=set(pair)) == pair  # never empty
    with pytest.raises(ConfigError):
        cause_devices("disk", [1], t)


def test_map_formula_matches_paper_appendix_d():
    r = DeviceRanking(alpha=2.0, decay=lambda d: 0.5 if d.startswith("switch") else 1.0)
    r.add(["gpu:1"], 0.8)
    r.add(["switch:leaf-0", "nic:2"], 0.4)
    idx = r.index()
    a = {d: 2.0 * DEFAULT_PRIOR[k] for d, k in (("gpu:1", "gpu"), ("switch:leaf-0", "switch"), ("nic:2", "nic"))}
    num = {"gpu:1": 0.8 + a["gpu:1"], "switch:leaf-0": 0.4 * 0.5 + a["switch:leaf-0"], "nic:2": 0.4 + a["nic:2"]}
    den = sum(num.values()) + sum(2.0 - v for v in a.values())
    for d in num:
        assert idx[d] == pytest.approx(num[d] / den)
    assert [d for d, _ in r.ranked()] == ["gpu:1", "nic:2", "switch:leaf-0"]


def test_prior_breaks_ties_and_linear_ignores_it():
    r = DeviceRanking()
    r.add(["nic:3", "link:nic:3|switch:leaf-0", "switch:leaf-0"], 0.5)
    assert [d for d, _ in r.ranked()] == ["nic:3", "link:nic:3|switch:leaf-0", "switch:leaf-0"]
    lin = DeviceRanking(method="linear")
    lin.add(["gpu:1", "host:0"], 0.5)
    lin.add(["host:0"], 0.1)
    assert lin.ranked()[0][0] == "host:0"
    m = DeviceRanking()
    m.add(["gpu:1", "host:0"], 0.5)
    m.add(["host:0"], 0.1)
    assert m.ranked()[0][0] == "gpu:1"   # the GPU prior outweighs 0.1 of extra evidence


def test_bad_configuration_raises():
    with pytest.raises(ConfigError):
        DeviceRanking(method="max")
    with pytest.raises(ConfigError):
        DeviceRanking(prior={"toaster": 0.1})
    with pytest.raises(ConfigError):
        DeviceRanking(prior={"gpu": 1.5})
    with pytest.raises(ConfigError):
        DeviceRanking(alpha=-1)


causes_st = st.lists(st.tuples(st.lists(st.sampled_from(["gpu:0", "gpu:1", "gpu:2", "nic:0", "nic:1", "host:0",
                                                          "switch:leaf-0", "link:nic:0|switch:leaf-0"]),
                                        min_size=1, max_size=4),
                               st.floats(0.0, 1.0)), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(causes_st, st.sampled_from(["map", "linear"]), st.floats(0.0, 5.0))
def test_scores_are_a_probability_distribution(causes, method, alpha):
    r = DeviceRanking(method=method, alpha=alpha)
    for devs, rate in causes:
        r.add(devs, rate)
    scores = [s for _, s in r.ranked()]
    assert all(s >= 0 for s in scores)
    assert sum(scores) == pytest.approx(1.0)
    assert scores == sorted(scores, reverse=True)


@settings(max_examples=60, deadline=None)
@given(causes_st, st.permutations([0, 1, 2]))
def test_ranking_invariant_to_gpu_relabelling(causes, perm):
    def relabel(d):
        return f"gpu:{perm[int(d[4:])]}" if d.startswith("gpu:") else d

    a, b = DeviceRanking(), DeviceRanking()
    for devs, rate in causes:
        a.add(devs, rate)
        b.add([relabel(d) for d in devs], rate)
    sa = {relabel(d): s for d, s in a.ranked()}
    sb = dict(b.ranked())
    assert sa.keys() == sb.keys()
    for d in sa:
        assert sa[d] == pytest.approx(sb[d])


@settings(max_examples=40, deadline=None)
@given(causes_st, st.floats(0.01, 1.0))
def test_more_evidence_never_lowers_a_device(causes, extra):
    r = DeviceRanking()
    for devs, rate in causes:
        r.add(devs, rate)
    target = causes[0][0][0]
    before = dict(r.ranked())[target]
    r.add([target], extra)
    assert dict(r.ranked())[target] >= before - 1e-12
