"""Every benchmark takes ``--smoke`` and CI runs every smoke (benchmarks that cannot rot).

``.ci/run`` runs ``python benchmarks/NAME.py --smoke`` for each benchmark after the test suite; a
benchmark without the flag would fail there only, so this checks the flag statically (the
argparse setup of each script, read with :mod:`ast`: nothing is imported or run).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
#: the benchmarks: every script of benchmarks/ but the helper modules (``_cache.py``, ...)
SCRIPTS = sorted(p for p in BENCH.glob("*.py") if not p.name.startswith("_"))


def _options(path: Path) -> set[str]:
    """The option strings of every ``add_argument`` call in ``path``."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            out.update(a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str))
    return out


def test_there_are_benchmarks():
    assert len(SCRIPTS) >= 10, [p.name for p in SCRIPTS]


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_every_benchmark_takes_smoke(script):
    opts = _options(script)
    assert opts, f"{script.name}: no argparse options found"
    assert "--smoke" in opts, f"{script.name} has no --smoke (tiny sizes for CI); .ci/run runs every benchmark with it"


def test_options_parser_sees_a_missing_flag(tmp_path):
    bad = tmp_path / "bench.py"
    bad.write_text("import argparse\nap = argparse.ArgumentParser()\nap.add_argument('--gpus', type=int)\n")
    assert _options(bad) == {"--gpus"}


def test_ci_runs_the_readme_command_and_every_smoke():
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    test_cmd = 'pip install -e ".[dev]" && python -m pytest'
    assert test_cmd in readme and test_cmd in ci
    assert "benchmarks/[!_]*.py" in ci and '"$bench" --smoke' in ci
    assert ci.index(test_cmd) < ci.index('"$bench" --smoke')  # the smokes after the test suite


def test_a_smoke_runs(tmp_path):
    """One smoke for real (the cheapest): the flag parses and the run ends with the key=value line."""
    got = subprocess.run([sys.executable, str(BENCH / "topology_build.py"), "--smoke"], capture_output=True,
                         text=True, cwd=tmp_path, timeout=300)
    assert got.returncode == 0, got.stderr[-2000:]
    last = got.stdout.strip().splitlines()[-1]
    assert last.startswith("build_ms_median=") and "fat_tree_build_ms=" in last
