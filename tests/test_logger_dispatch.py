"""The logger's dispatcher hook on its own (gloo, CPU, one rank): passing operators through without
a logger, recording into one once attached."""

from __future__ import annotations

import pytest

import holmes
import holmes.logger
from holmes.logger._dispatch import DispatchHook

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
pytestmark = pytest.mark.torch


def test_a_hook_without_a_logger_only_redispatches_and_records_once_attached(tmp_path, world1):
    pg = dist.group.WORLD
    hook = DispatchHook(None).install()
    try:
        t = torch.arange(4, dtype=torch.float32)
        pg.allreduce([t]).wait()  # through the Python kernel, nothing recorded
        assert t.tolist() == [0.0, 1.0, 2.0, 3.0] and hook.seen == 0
        lg = holmes.logger.CommOpsLogger(tmp_path / "job", dispatch=False)
        hook.logger = lg  # the kernels read it per operator: attached without reinstalling
        pg.allreduce([t]).wait()
        work = pg.allreduce([torch.ones(8, dtype=torch.float64)])  # asynchronous: ends in a future callback
        work.wait()
        hook.logger = None
        pg.allreduce([t]).wait()
        assert hook.seen == 2
    finally:
        hook.uninstall()
    assert not hook.installed
    lg.close()
    rows = holmes.read_job(tmp_path / "job").ops(0).to_pydict()
    assert list(zip(rows["op"], rows["nbytes"], rows["seq"])) == [("all_reduce", 16, 0), ("all_reduce", 64, 1)]
    assert all(e >= s for s, e in zip(rows["start_ns"], rows["end_ns"]))
