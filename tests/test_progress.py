"""Progress bars (issue #19, item 3): drawn on stderr only when it is a terminal and not --quiet,
never on stdout; the library reports through an optional progress factory; the kernel-compile
notice."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numba
import numpy as np
import pytest

import holmes
from holmes.cli.main import main
from holmes.progress import NullBar, compile_notice, counter, on_first_compile, terminal_progress, track

FIX = Path(__file__).resolve().parents[1] / "fixtures"


class Recorder:
    """A progress factory that records what the library asked for."""

    def __init__(self) -> None:
        self.bars: list[dict] = []

    def __call__(self, iterable=None, **kw):
        bar = dict(kw, updates=0, descs=[], closed=False)
        self.bars.append(bar)

        class Bar(NullBar):
            def __iter__(self):
                for x in iterable:
                    bar["updates"] += 1
                    yield x

            def update(self, n=1):
                bar["updates"] += n

            def set_description(self, desc=None, refresh=True):
                bar["descs"].append(desc)

            def close(self):
                bar["closed"] = True

        return Bar(iterable)


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_track_and_counter_without_a_factory_are_free():
    items = [1, 2, 3]
    assert track(items, None) is items
    with counter(None, total=5) as bar:
        bar.update(2)
    assert isinstance(bar, NullBar)


def test_track_passes_total_desc_unit():
    rec = Recorder()
    assert list(track(range(4), rec, desc="x", unit="rank")) == [0, 1, 2, 3]
    assert rec.bars[0]["total"] == 4 and rec.bars[0]["desc"] == "x" and rec.bars[0]["unit"] == "rank"
    assert rec.bars[0]["updates"] == 4


def test_terminal_progress_only_on_a_terminal_and_not_quiet():
    assert terminal_progress(io.StringIO()) is None                 # a pipe or file: no bars
    assert terminal_progress(FakeTTY(), enabled=False) is None     # --quiet
    tty = FakeTTY()
    bars = terminal_progress(tty)
    assert bars is not None
    for _ in bars(range(3), total=3, desc="reading", unit="rank"):
        pass
    assert "reading" in tty.getvalue()


def test_localizer_counts_each_rank_read_once():
    rec = Recorder()
    r = holmes.Localizer(progress=rec).localize(FIX / "gpu16-clean")
    (bar,) = rec.bars
    assert bar["total"] == 16 and bar["unit"] == "rank"
    assert bar["updates"] == len(r.fetched) == 16 and bar["closed"]
    assert bar["descs"] == ["localize: hang", "localize: irregular", "localize: persistent"]


def test_localizer_irregular_bar_counts_the_ranks_the_search_read():
    rec = Recorder()
    r = holmes.Localizer(progress=rec, analysis="irregular").localize(FIX / "gpu64-3d-slow-gpu")
    assert rec.bars[0]["total"] == 64 and rec.bars[0]["updates"] == len(r.fetched) > 0


def test_simulation_reports_its_iterations():
    from holmes.simulate.simulator import run_simulation

    rec = Recorder()
    run_simulation(tp=2, dp=2, iterations=5, progress=rec)
    assert rec.bars[0]["total"] == 5 and rec.bars[0]["updates"] == 5


def test_on_first_compile_fires_once_on_a_cache_miss():
    @numba.njit(cache=False)
    def _fresh_kernel(x):
        return x + 1

    names: list[str] = []
    with on_first_compile(names.append):
        _fresh_kernel(np.int64(1))
        _fresh_kernel(np.float64(1.0))   # a second compilation: no second call
    assert names == ["test_on_first_compile_fires_once_on_a_cache_miss.<locals>._fresh_kernel"]
    with on_first_compile(names.append):
        _fresh_kernel(np.int64(2))        # already compiled: nothing
    assert len(names) == 1


def test_compile_notice_on_a_terminal_only():
    @numba.njit(cache=False)
    def _k(x):
        return x * 2

    tty, pipe = FakeTTY(), io.StringIO()
    with compile_notice(tty):
        _k(np.int64(1))
    assert tty.getvalue() == "holmes: compiling kernels (first run only; cached for the next runs)\n"
    with compile_notice(pipe):
        _k(np.float64(1.0))
    assert pipe.getvalue() == ""


@pytest.mark.parametrize("argv", [
    ["localize", "JOB", "--quiet"], ["detect", "JOB", "--out", "OUT", "--quiet"],
    ["simulate", "--out", "OUT", "--tp", "2", "--pp", "1", "--dp", "2", "--iterations", "3", "--quiet"],
])
def test_quiet_and_piped_stderr_print_no_bar(argv, tmp_path, capsys):
    argv = [str(FIX / "gpu16-clean") if a == "JOB" else str(tmp_path / "out.parquet") if a == "OUT" else a
            for a in argv]
    if argv[0] == "simulate":
        argv[argv.index(str(tmp_path / "out.parquet"))] = str(tmp_path / "job")
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert "\r" not in out


def test_bars_go_to_a_terminal_stderr_never_to_stdout():
    pty = pytest.importorskip("pty")
    import fcntl
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    p = subprocess.Popen([sys.executable, "-m", "holmes", "localize", str(FIX / "gpu16-clean"), "--format", "json"],
                         stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL)
    os.close(slave)
    err = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        err += chunk
    out = p.stdout.read()
    assert p.wait() == 0
    os.close(master)
    assert json.loads(out)["verdict"] == "healthy"      # stdout: the JSON alone
    assert b"localize" in err and b"rank" in err        # stderr (a terminal): the bar


def test_convert_reports_files_read_and_ranks_written(tmp_path):
    from holmes.adapters import convert

    rec = Recorder()
    src = Path(__file__).parent / "data" / "nccl_inspector"
    convert("nccl-inspector", src, tmp_path / "job", progress=rec)
    by_desc = {b["desc"]: b for b in rec.bars}
    assert by_desc["convert: reading"]["updates"] == len(list(src.iterdir())) == 4
    assert by_desc["convert: writing"]["updates"] == 4 and by_desc["convert: writing"]["unit"] == "rank"
