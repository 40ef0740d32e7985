"""Root pytest configuration: the docstring examples of ``holmes/`` run with the tests.

Modules that need the optional PyTorch extra are not collected for doctests without it. A
docstring example's ``tempfile.mkdtemp()`` lands in that example's pytest temporary directory
(removed with the run's when it passes), not loose under the system temp dir.
"""

import importlib.util
import tempfile

import pytest

collect_ignore_glob = ["build/*", "fixtures/*", "benchmarks/*", "scripts/*", "examples/*"]
if importlib.util.find_spec("torch") is None:
    collect_ignore_glob += ["holmes/logger/torch_hooks.py", "holmes/eval/realrun*.py"]


@pytest.fixture(autouse=True)
def _doctest_tempdir(request, monkeypatch):
    """Docstring examples: ``tempfile``'s default directory is the example's own ``tmp_path``."""
    if isinstance(request.node, pytest.DoctestItem):
        monkeypatch.setattr(tempfile, "tempdir", str(request.getfixturevalue("tmp_path")))
