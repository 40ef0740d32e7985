"""The logger's compiled dispatcher kernel (gloo, CPU, one rank): it takes the collectives the
dispatcher sees on CPU tensors, numbers them with the recorder's own counters (one sequence per
communicator with the namespace wrappers), ends them from the work's future in C++, and leaves
the Python kernels to everything else."""

from __future__ import annotations

import time

import pytest

import holmes
import holmes.logger
from holmes.logger._dispatch import DispatchHook

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
pytestmark = pytest.mark.torch


@pytest.fixture
def native():
    try:
        return holmes.logger.build_native()
    except Exception as e:  # noqa: BLE001 - no compiler here: the Python kernels are tested elsewhere
        pytest.skip(f"the compiled kernel does not build here: {type(e).__name__}")


def _rows(path):
    return holmes.read_job(path).ops(0).to_pydict()


def test_dispatcher_and_namespace_operators_share_one_sequence(tmp_path, world1, native):
    pg = dist.group.WORLD
    lg = holmes.logger.CommOpsLogger(tmp_path / "job")
    with lg:
        assert lg._dispatch.native_installed
        t = torch.ones(4)
        dist.all_reduce(t)  # namespace wrapper
        pg.allreduce([torch.ones(8)]).wait()  # dispatcher, compiled kernel
        w = pg.allgather([[torch.zeros(3)]], [torch.ones(3)])  # dispatcher, waited later
        dist.broadcast(t, src=0)  # namespace wrapper again
        w.wait()
        lg.step()
        pg.allreduce([torch.ones(2, dtype=torch.float64)]).wait()
        assert lg._dispatch.seen == 3
    rows = _rows(tmp_path / "job")
    assert rows["op"] == ["all_reduce", "all_reduce", "all_gather", "broadcast", "all_reduce"]
    assert rows["seq"] == [0, 1, 2, 3, 4]
    assert rows["iteration"] == [0, 0, 0, 0, 1] and rows["op_index"] == [0, 1, 2, 3, 0]
    assert rows["nbytes"] == [16, 32, 12, 16, 16]
    assert all(e >= s for s, e in zip(rows["start_ns"], rows["end_ns"]))


def test_an_asynchronous_operator_ends_when_its_work_completes_not_when_it_is_drained(tmp_path, world1, native):
    pg = dist.group.WORLD
    lg = holmes.logger.CommOpsLogger(tmp_path / "job")
    with lg:
        w = pg.allreduce([torch.ones(1024)])
        w.wait()
        done = time.time_ns()
        time.sleep(0.05)  # the end waits in the C++ buffer; it is drained at close
    end = _rows(tmp_path / "job")["end_ns"][0]
    assert end <= done + 5_000_000  # completed before wait() returned (clock granularity aside)


def test_a_hook_without_a_logger_passes_through_and_follows_a_logger_attached_later(tmp_path, world1, native):
    pg = dist.group.WORLD
    hook = DispatchHook(None).install()
    try:
        assert hook.native_installed
        t = torch.arange(4, dtype=torch.float32)
        pg.allreduce([t]).wait()
        assert t.tolist() == [0.0, 1.0, 2.0, 3.0] and hook.seen == 0
        first = holmes.logger.CommOpsLogger(tmp_path / "a", dispatch=False)
        hook.logger = first
        pg.allreduce([t]).wait()
        second = holmes.logger.CommOpsLogger(tmp_path / "b", dispatch=False)
        hook.logger = second  # a second recorder: its operators and ends are its own
        pg.allreduce([torch.ones(2)]).wait()
        pg.allreduce([torch.ones(2)]).wait()
        hook.logger = None
        pg.allreduce([t]).wait()
        assert hook.seen == 3
    finally:
        hook.uninstall()
    first.close()
    second.close()
    assert _rows(tmp_path / "a")["seq"] == [0]
    b = _rows(tmp_path / "b")
    assert b["seq"] == [0, 1] and b["nbytes"] == [8, 8]


def test_native_false_and_the_environment_switch_keep_the_python_kernels(tmp_path, world1, monkeypatch):
    pg = dist.group.WORLD
    hook = DispatchHook(None, native=False).install()
    try:
        assert not hook.native_installed
    finally:
        hook.uninstall()
    monkeypatch.setenv("HOLMES_LOGGER_NATIVE", "0")
    lg = holmes.logger.CommOpsLogger(tmp_path / "job")
    with lg:
        assert not lg._dispatch.native_installed
        pg.allreduce([torch.ones(4)]).wait()
        assert lg._dispatch.seen == 1
    assert _rows(tmp_path / "job")["op"] == ["all_reduce"]


def test_a_kernel_that_does_not_build_leaves_the_python_kernels_and_says_so_once(tmp_path, world1, monkeypatch,
                                                                                   caplog):
    from holmes.logger import _native

    def no_compiler(verbose=False):
        raise RuntimeError("Error building extension: c++: command not found")

    monkeypatch.setattr(_native, "build_native", no_compiler)
    monkeypatch.setattr(_native, "_CACHE", {})
    pg = dist.group.WORLD
    with caplog.at_level("WARNING", logger="holmes.logger._native"):
        for i in range(2):
            lg = holmes.logger.CommOpsLogger(tmp_path / f"job{i}")
            with lg:
                assert not lg._dispatch.native_installed
                pg.allreduce([torch.ones(4)]).wait()
                assert lg._dispatch.seen == 1
    said = [r.getMessage() for r in caplog.records if "compiled dispatcher kernel is unavailable" in r.getMessage()]
    assert len(said) == 1 and "command not found" in said[0]
    assert _rows(tmp_path / "job1")["op"] == ["all_reduce"]


def test_the_namespace_asynchronous_path_ends_in_cpp_too(tmp_path, world1, native):
    lg = holmes.logger.CommOpsLogger(tmp_path / "job")
    with lg:
        works = [dist.all_reduce(torch.ones(256), async_op=True) for _ in range(3)]
        for w in works:
            w.wait()
        done = time.time_ns()
        rec = lg.recorder
        assert not rec._cb_threads  # no Python callback ran on gloo's thread: the ends are C++'s
        time.sleep(0.05)
    rows = _rows(tmp_path / "job")
    assert rows["seq"] == [0, 1, 2] and rows["op"] == ["all_reduce"] * 3
    assert max(rows["end_ns"]) <= done + 5_000_000


def test_a_closed_logger_holds_no_process_group_and_is_freed_when_dropped(tmp_path, world1):
    import gc
    import weakref

    pg = dist.new_group([0])
    lg = holmes.logger.CommOpsLogger(tmp_path / "job")
    with lg:
        dist.all_reduce(torch.ones(2), group=pg)
        pg.allreduce([torch.ones(2)]).wait()  # through the dispatcher hook too
    assert not lg._group_cache and not lg._seq_of
    ref = weakref.ref(lg)
    gc.disable()
    try:
        del lg
        assert ref() is None  # freed by its reference count: no cycle through the dispatcher hook
    finally:
        gc.enable()
    assert _rows(tmp_path / "job")["op"] == ["all_reduce", "all_reduce"]
