"""Iteration monitor: streaming == batch, delta rule, episode classification."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from holmes.detect import IterationMonitor, classify_episode, episodes, irregular_iterations
from holmes.errors import ConfigError


def test_delta_rule_against_previous_window_low_percentile():
    d = [10.0, 10.0, 10.0, 11.5, 10.0, 10.9]
    # 11.5 > 1.1 * 10; 10.9 vs p10(10, 11.5, 10) = 10 -> 11.0: not irregular
    assert irregular_iterations(d, delta=1.1, window=3).tolist() == [False, False, False, True, False, False]
    # a persistent slowdown filling the window stays irregular while one fast iteration is in it
    d = [10.0, 10.0, 13.0, 13.0, 13.0]
    assert irregular_iterations(d, delta=1.1, window=3).tolist() == [False, False, True, True, True]


def test_one_rule_for_batch_and_streaming():
    """localize's window rule and the streaming monitor are the same IrregularityRule."""
    from holmes.detect import IrregularityRule, irregular_mask

    d = np.array([10.0, 10.2, 9.9, 13.0, 10.1, 10.0])
    rule = IrregularityRule(delta=1.2)
    assert irregular_mask(d, 1.2).tolist() == rule.mask(d).tolist() == [False, False, False, True, False, False]
    m = IterationMonitor(delta=1.2, window=len(d))
    assert [m.update(x) for x in d] == [rule.is_irregular(x, d[:i]) for i, x in enumerate(d)]
    with pytest.raises(ConfigError):
        IrregularityRule(delta=1.0)


def test_first_iteration_never_irregular_and_short_logs():
    assert irregular_iterations([], 1.1, 5).tolist() == []
    assert irregular_iterations([100.0], 1.1, 5).tolist() == [False]
    assert irregular_iterations([1.0, 5.0], 1.1, 5).tolist() == [False, True]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=0.0, max_value=1e6, allow_nan=False), min_size=0, max_size=60),
       st.floats(min_value=1.01, max_value=3.0), st.integers(min_value=1, max_value=25))
def test_streaming_equals_batch(durs, delta, window):
    m = IterationMonitor(delta=delta, window=window)
    stream = [m.update(x) for x in durs]
    assert stream == irregular_iterations(durs, delta=delta, window=window).tolist()
    assert m.n_irregular == sum(stream)


def test_monitor_irregular_attribute_and_reset():
    m = IterationMonitor(delta=1.1, window=4)
    for x in (5.0, 5.0, 5.0):
        m.update(x)
    assert m.update(9.0) is True and m.irregular
    m.reset()
    assert m.n_seen == 0 and not m.irregular


@pytest.mark.parametrize("delta,window", [(1.0, 5), (0.5, 5), (float("nan"), 5), (1.1, 0), (1.1, 2.5)])
def test_bad_parameters_raise_config_error(delta, window):
    with pytest.raises(ConfigError):
        IterationMonitor(delta=delta, window=window)
    with pytest.raises(ConfigError):
        irregular_iterations([1.0, 2.0], delta=delta, window=window)


def test_bad_durations_raise():
    with pytest.raises(ConfigError):
        irregular_iterations([1.0, float("inf")])
    with pytest.raises(ConfigError):
        IterationMonitor().update(-1.0)


def test_episodes_runs():
    assert episodes([0, 1, 1, 0, 0, 1]) == [(1, 3), (5, 6)]
    assert episodes([0, 0]) == []


def _noisy(n, seed):
    return 100.0 + np.random.default_rng(seed).normal(0, 1.0, n)


@pytest.mark.parametrize("seed", range(5))
def test_classify_spike(seed):
    d = _noisy(60, seed)
    rng = np.random.default_rng(seed + 100)
    for i in rng.choice(np.arange(5, 60), size=2, replace=False):
        d[i] *= 2.0
    assert classify_episode(d) == "spike"


@pytest.mark.parametrize("period", [6, 7, 9])
def test_classify_fluctuation(period):
    d = _noisy(80, period)
    d[3::period] *= 1.4
    assert classify_episode(d) == "fluctuation"


@pytest.mark.parametrize("start", [10, 25, 40])
def test_classify_persistent(start):
    d = _noisy(60, start)
    d[start:] *= 1.6
    assert classify_episode(d) == "persistent"


def test_classify_length_mismatch():
    with pytest.raises(ConfigError):
        classify_episode([1.0, 2.0], [True])
