"""Bounded reads of the search at scale: large group scans set aside, null iterations on read ranks."""

from __future__ import annotations

import pytest

from holmes.detect import LabelDetector
from holmes.errors import ConfigError
from holmes.localize import COMPUTE, GraphSearch, JobSource, localize

from test_search import _job, _t

# a 20-member data-parallel group whose last member (19) entered late, and a TP pair (0, 20)
# where rank 20 entered late: the pivot 0 waited in both
DP = tuple(range(20))
COMMS = {"dp-0": ("dp", DP), "tp-0": ("tp", (0, 20))}


def _tables():
    t = {0: _t(0, [(0, "tp-0", 0, "all_reduce", None, 0, 100, True), (1, "dp-0", 0, "all_reduce", None, 110, 200, True)]),
         20: _t(20, [(0, "tp-0", 0, "all_reduce", None, 95, 100, False)])}
    for r in DP[1:]:
        late = r == 19
        t[r] = _t(r, [(0, "dp-0", 0, "all_reduce", None, 195 if late else 110, 200, not late)])
    return t


def _search(starts, **kw):
    s = GraphSearch(JobSource(_job(COMMS, _tables())), LabelDetector(), **kw)
    s.rank_ops(0)
    return s, s.search(0, starts)


def test_large_group_scan_is_set_aside_when_another_branch_explains_the_iteration():
    # start on the dp op first: its scan (19 ranks to read > 8) waits; the TP branch finds rank 20
    s, causes = _search([(0, 1), (0, 0)], scan_reads=8)
    assert [(c.cause, c.ranks) for c in causes] == [(COMPUTE, (20,))]
    assert s.source.ranks_read == [0, 20]
    assert [(x["comm_id"], x["members"], x["iteration"]) for x in s.set_aside] == [("dp-0", 20, 0)]


def test_unbounded_search_scans_the_whole_group():
    s, causes = _search([(0, 1), (0, 0)])
    assert sorted(c.ranks for c in causes) == [(19,), (20,)]
    assert s.source.ranks_read == list(range(21))
    assert s.set_aside == []


def test_set_aside_scan_is_resumed_when_nothing_else_explains_the_iteration():
    s, causes = _search([(0, 1)], scan_reads=8)
    assert [(c.cause, c.ranks) for c in causes] == [(COMPUTE, (19,))]
    assert s.set_aside == [] and len(s.source.ranks_read) == 20


def test_small_group_is_scanned_whole_under_the_bound():
    s, causes = _search([(0, 1)], scan_reads=19)
    assert [c.ranks for c in causes] == [(19,)] and s.set_aside == []


def test_fetched_only_reads_nothing_new():
    s = GraphSearch(JobSource(_job(COMMS, _tables())), LabelDetector())
    s.rank_ops(0)
    with s.fetched_only():
        assert s.search(0, [(0, 0), (0, 1)]) == []
    assert s.source.ranks_read == [0]
    assert [c.ranks for c in s.search(0, [(0, 0)])] == [(20,)]    # reads again after the block


@pytest.mark.parametrize("bad", [-1, 1.5, True, "8"])
def test_bad_scan_reads_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="scan_reads"):
        GraphSearch(JobSource(_job(COMMS, _tables())), LabelDetector(), scan_reads=bad)


def test_simulated_256_gpu_job_reads_few_ranks_and_names_the_slow_gpu():
    from holmes.simulate import Workload, run_simulation

    # the benchmark's fault (localize_scale.py) on a 4x2x32 job: 32-member data-parallel groups
    job = run_simulation(tp=4, pp=2, dp=32, iterations=20, workload=Workload(micro_batches=2), seed=1,
                         faults=["gpu:133@persistent:6*4"]).to_memory_job()
    bounded = localize(job, analysis="irregular")
    full = localize(job, analysis="irregular", scan_reads=0)
    assert bounded.top is not None and bounded.top.id == "gpu:133" and bounded.verdict == "culprit"
    assert full.top is not None and full.top.id == "gpu:133"
    assert len(bounded.fetched) <= 10 < len(full.fetched)
