"""Localize the device slowing a captured job directory.

Usage: python examples/localize_job.py JOB [PIVOT]

JOB is any CommOps schema-v1 job directory (from a converter, the PyTorch logger or the
simulator). Prints the readable report, then the top device and what was read.
"""

from __future__ import annotations

import sys

import holmes
from holmes.localize import localize


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    job = holmes.read_job(argv[0])
    pivot = int(argv[1]) if len(argv) > 1 else 0
    report = localize(job, pivot=pivot)
    print(report.to_text())
    if report.top is not None:
        print(f"\nmost likely: {report.top.id} (score {report.top.score:.2f}); "
              f"read {len(report.fetched)} of {job.world_size} ranks, {report.bytes_read / 1e6:.2f} MB")
    for cause in report.root_causes[:1]:
        print("evidence path of the first root cause:")
        for step in cause.evidence:
            extra = f", {step['gap_excess_ns'] / 1e6:.2f} ms more compute before it" if step.get("gap_excess_ns") else ""
            print(f"  rank {step['rank']:>5} op {step['op_index']:>3} {step['op']:<14} {step['comm_id']:<10} "
                  f"{step['duration_ns'] / 1e6:8.2f} ms {'abnormal' if step.get('abnormal') else 'normal'}{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["fixtures/gpu64-3d-slow-gpu"]))
