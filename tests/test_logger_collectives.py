"""Logger coverage of the wrapped torch.distributed functions the two-rank end-to-end job does not
call: reduce_scatter_tensor, reduce_scatter and all_to_all with tensor lists (sync and async)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.torch


_SCRIPT = r"""
import os, sys, tempfile, warnings
import torch, torch.distributed as dist
import holmes, holmes.logger
warnings.simplefilter("ignore")
tmp = tempfile.mkdtemp()
dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
lg = holmes.logger.CommOpsLogger(os.path.join(tmp, "job"))
lg.enable(); lg.step(0)
dist.reduce_scatter_tensor(torch.empty(4), torch.ones(4))
dist.all_to_all([torch.empty(4)], [torch.ones(4)])
w = dist.all_to_all([torch.empty(2)], [torch.ones(2)], async_op=True); w.wait()
dist.reduce_scatter([torch.empty(3)][0], [torch.ones(3)])
lg.close()
t = holmes.read_job(os.path.join(tmp, "job")).ops(0)
print([(o, n) for o, n in zip(t.column("op").to_pylist(), t.column("nbytes").to_pylist())])
dist.destroy_process_group()
"""


def test_logger_records_reduce_scatter_tensor_and_all_to_all_lists():
    pytest.importorskip("torch")
    p = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=180, cwd=REPO,
                       env={"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
                            **{k: v for k, v in os.environ.items() if k.startswith(("PYTHON", "HOME"))}})
    assert p.returncode == 0, p.stderr[-2000:]
    got = ast.literal_eval(p.stdout.strip().splitlines()[-1])
    assert got == [("reduce_scatter", 16), ("all_to_all", 16), ("all_to_all", 8), ("reduce_scatter", 12)]
