"""Simulate a 3D-parallel job with one injected fault, then localize it.

Usage: python examples/simulate_and_localize.py [FAULT_SPEC]
e.g.   python examples/simulate_and_localize.py "nvswitch:3@spike*6"
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import holmes
from holmes.localize import localize
from holmes.simulate import simulate


def main(argv: list[str]) -> int:
    spec = argv[0] if argv else "gpu:21@persistent*3"
    with tempfile.TemporaryDirectory() as tmp:
        path = simulate(Path(tmp) / "job", tp=4, pp=4, dp=4, micro_batches=4, iterations=30, seed=1,
                        faults=[spec])
        job = holmes.read_job(path)
        report = localize(job)
        print(report.to_text())
        truth = job.truth.devices
        found = report.top.id if report.top else None
        print(f"\ninjected {truth}, Holmes ranks first {found}: {'correct' if found in truth else 'wrong'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
