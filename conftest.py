"""Root pytest configuration: the docstring examples of ``holmes/`` run with the tests.

Modules that need the optional PyTorch extra are not collected for doctests without it.
"""

import importlib.util

collect_ignore_glob = ["build/*", "fixtures/*", "benchmarks/*", "scripts/*", "examples/*"]
if importlib.util.find_spec("torch") is None:
    collect_ignore_glob += ["holmes/logger/torch_hooks.py", "holmes/eval/realrun*.py"]
