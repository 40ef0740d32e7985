"""Write the HTML report of a job: one self-contained page that opens offline.

Usage: python examples/report_job.py [JOB] [OUT.html]

JOB (default: the embedded 64-GPU fixture with a slow GPU) is localized, then the page is written
with the job (for the heatmap of every rank's slowness). The same as ``holmes report JOB -o OUT.html``.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import holmes
from holmes.report import write_html


def main(argv: list[str]) -> int:
    job_dir = argv[0] if argv else "fixtures/gpu64-3d-slow-gpu"
    out = Path(argv[1]) if len(argv) > 1 else Path(tempfile.mkdtemp()) / "report.html"
    job = holmes.read_job(job_dir)
    report = holmes.localize(job)
    write_html(report, out, job=job)          # never inside the job; an existing file is kept
    print(f"verdict {report.verdict}, top {report.top.id if report.top else '-'}")
    print(f"wrote {out} ({out.stat().st_size / 1e3:.0f} kB); open it in any browser, offline")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
