"""The house rules of ``holmes/`` imports: no circle, no import from a lower floor to a higher one,
and the analyses never reach the simulator or the evaluation code.

Every ``import`` / ``from ... import`` of a ``holmes`` module counts, also those inside functions
(a lazy import is still a dependency). Floors, lowest first::

    0  holmes.errors, holmes._jit, holmes.stats,          (no holmes imports but holmes._jit
       holmes._ranges, holmes.limits,                       and holmes.errors)
       holmes.progress
    1  holmes.io, holmes.topology                          (data and cluster descriptions)
    2  holmes.cog, holmes.detect                           (the operator graph, detectors)
    3  holmes.simulate, holmes.adapters, holmes.logger     (producers of jobs)
    3  holmes.localize                                     (the analyses)
    4  holmes.eval                                         (baselines, fixtures, harnesses)
    5  holmes (the package), holmes.cli, holmes.__main__   (front doors)
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1] / "holmes"

FLOORS = {
    "holmes.errors": 0, "holmes._jit": 0, "holmes.stats": 0, "holmes._ranges": 0, "holmes.limits": 0, "holmes.parallel": 0, "holmes.progress": 0,
    "holmes.calibration": 0, "holmes.display": 0, "holmes.units": 0,
    "holmes.io": 1, "holmes.topology": 1,
    "holmes.cog": 2, "holmes.detect": 2,
    "holmes.simulate": 3, "holmes.adapters": 3, "holmes.logger": 3, "holmes.localize": 3, "holmes.report": 3,
    "holmes.eval": 4, "holmes.watch": 4,
    "holmes.cli": 5, "holmes.__main__": 5, "holmes": 5,
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(node: ast.ImportFrom, module: str, is_pkg: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph() -> nx.DiGraph:
    """Module -> holmes module it imports (a name imported from a package that is itself a
    submodule counts as that submodule)."""
    files = {(_module_name(p)): p for p in ROOT.rglob("*.py")}
    g = nx.DiGraph()
    for mod, path in files.items():
        g.add_node(mod)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(node, mod, path.name == "__init__.py")
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            for t in targets:
                if t == "holmes" or t.startswith("holmes."):
                    while t not in files and "." in t:
                        t = t.rsplit(".", 1)[0]
                    if t != mod:
                        g.add_edge(mod, t)
    return g


def floor(mod: str) -> int:
    best = None
    for prefix, f in FLOORS.items():
        if mod == prefix or mod.startswith(prefix + "."):
            if best is None or len(prefix) > len(best[0]):
                best = (prefix, f)
    assert best is not None, f"{mod}: no floor assigned (add it to FLOORS)"
    return best[1]


def package(mod: str) -> str:
    return ".".join(mod.split(".")[:2])


@pytest.fixture(scope="module")
def graph() -> nx.DiGraph:
    return import_graph()


def test_graph_is_read(graph):
    assert graph.has_edge("holmes.localize.pipeline", "holmes.localize.irregular.analysis")
    assert graph.has_edge("holmes.detect.simple", "holmes.detect.monitor")


def test_no_import_circle(graph):
    # a package's __init__ re-exports its submodules, which import siblings directly: count
    # circles between modules, not through a package's own __init__
    g = graph.copy()
    g.remove_edges_from([(a, b) for a, b in graph.edges if b == package(a) or a == package(b)
                         or b == "holmes" or a == "holmes"])
    cycles = list(nx.simple_cycles(g))
    assert cycles == [], f"import circles: {cycles}"


def test_no_upward_import(graph):
    up = [(a, b) for a, b in graph.edges if a != "holmes" and floor(b) > floor(a)]
    assert up == [], "imports from a lower floor to a higher one: " + ", ".join(f"{a} -> {b}" for a, b in up)


def test_analyses_never_reach_simulator_or_eval(graph):
    for mod in [m for m in graph if m.startswith("holmes.localize")]:
        reached = nx.descendants(graph, mod)
        bad = sorted(r for r in reached if r.startswith(("holmes.simulate", "holmes.eval")))
        assert bad == [], f"{mod} reaches {bad}"


def test_detect_does_not_import_simulator(graph):
    for mod in [m for m in graph if m.startswith("holmes.detect")]:
        bad = sorted(r for r in nx.descendants(graph, mod) if r.startswith(("holmes.simulate", "holmes.eval")))
        assert bad == [], f"{mod} reaches {bad}"


def test_no_module_level_tricks():
    """No module ``__getattr__`` re-exports, no module-class swaps, no global GC switch."""
    for path in ROOT.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        top_defs = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
        assert "__getattr__" not in top_defs, f"{path}: module __getattr__"
        assert ".__class__ =" not in text, f"{path}: module class swap"
        assert "gc.disable(" not in text, f"{path}: global garbage-collector switch"


def test_no_module_over_600_lines():
    long = {str(p.relative_to(ROOT.parent)): n for p in ROOT.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 650}
    assert long == {}, f"modules over ~600 lines: {long}"


def test_front_door_is_the_function():
    import holmes
    import holmes.localize.evidence.search  # noqa: F401  (a submodule import must not rebind it)

    assert callable(holmes.localize) and holmes.localize.__module__ == "holmes.localize.pipeline"


def test_import_and_run_without_a_writable_numba_cache(tmp_path):
    """A read-only install and no writable home (containers, service accounts): numba finds no
    cache location. Simulated with numba's own switch: only the zip-file locator, which never
    applies to a source tree. Importing and running every compiled kernel still works."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "NUMBA_CACHE_LOCATOR_CLASSES": "numba.core.caching.ZipCacheLocator",
           "PYTHONPATH": str(ROOT.parent)}
    code = ("import holmes, holmes.localize, holmes.detect, holmes.simulate, holmes.stats\n"
            "from holmes.simulate import simulate\n"
            f"j = simulate({str(tmp_path / 'j')!r}, tp=2, iterations=3, micro_batches=1)\n"
            "r = holmes.localize(holmes.read_job(j))\n"
            "print('verdict', r.verdict)\n")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "no locator available" not in p.stderr and "Traceback" not in p.stderr
    assert "verdict" in p.stdout
