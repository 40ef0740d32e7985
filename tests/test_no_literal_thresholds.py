"""No numeric threshold lives as a literal in holmes/localize/: they are data (holmes/calibration).

An AST scan of every module under ``holmes/localize/`` fails on a numeric literal outside a
small allowlist of structural values (0, 1, 2 as in halves and pairs, 100 for percent; -1 is
the literal 1 negated). Docstrings (and their doctests) are text, not code. The one context
exempted is the precision argument of ``round(x, ndigits)``: how many digits a report shows,
not a rule. Every other number -- a z value, a ratio, a floor, a slack in nanoseconds, a
minimum sample size, a display cap -- is read from :mod:`holmes.calibration.thresholds` or
from a named constant outside ``holmes/localize/`` (units in :mod:`holmes.units`, numeric
guards and statistical constants in :mod:`holmes.stats`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import holmes

#: structural values a module may write as literals
ALLOWED = {0, 1, 2, 100}
LOCALIZE = Path(holmes.__file__).parent / "localize"


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _precision_args(tree: ast.AST) -> set[int]:
    """The ``ndigits`` of ``round(x, ndigits)`` calls."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "round":
            out.update(id(a) for a in node.args[1:])
            out.update(id(k.value) for k in node.keywords if k.arg == "ndigits")
    return out


def literal_thresholds(root: Path = LOCALIZE) -> list[str]:
    """``file:line: value`` for every numeric literal outside the allowlist under ``root``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        skip = _docstrings(tree) | _precision_args(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Constant) or id(node) in skip:
                continue
            v = node.value
            if isinstance(v, bool) or not isinstance(v, (int, float, complex)):
                continue
            if v in ALLOWED:
                continue
            found.append(f"{path.relative_to(root.parent.parent)}:{node.lineno}: {v!r}")
    return found


def test_no_numeric_literal_thresholds_in_localize():
    found = literal_thresholds()
    assert not found, ("numeric literals in holmes/localize/ (move thresholds to holmes/calibration/thresholds.json, "
                       "name units and numeric guards in holmes.units / holmes.stats):\n  " + "\n  ".join(found))


def test_the_scan_finds_a_literal(tmp_path):
    pkg = tmp_path / "holmes" / "localize"
    pkg.mkdir(parents=True)
    (pkg / "rule.py").write_text('"""z = 4.0 in a docstring is text."""\n\n'
                                 "def slow(x, ratio=1.5):\n    return round(x, 3) > ratio * 2 - 1 and x < 100\n")
    assert literal_thresholds(pkg) == ["holmes/localize/rule.py:3: 1.5"]
