"""Hang localization on real hung runs: the culprit set exactly, no waiting rank named, deadlocks
called deadlocks.

The runs are real multi-process PyTorch jobs (gloo, CPU) stopped by an injected hang
(:mod:`holmes.eval.realrun_hang`: a rank that stops at the step, at a send/recv or at a
collective, a rank whose process dies, two pipeline stages in opposite send order), 8-32 ranks
with PP 2-4, captured by :mod:`holmes.logger`'s own dumps (the watchdog's, SIGTERM's, the
error's). ``--corpus`` is a directory of them with ``MANIFEST.json`` (``python
scripts/real_hangs.py corpus --out DIR``; default ``fixtures/real-hang``); ``--split`` picks the
runs (``test`` by default, ``dev``, ``all``). The Flight Recorder dumps of ``../shared/data``
(gpu_error_1st; its culprits are the injected faults 12 and 14) are scored too when present.

Last line: ``hang_exact_pct=<%> waiting_named=<ranks named that only waited> deadlock_right_pct=<%>
runs=<n> fr_exact=<right>/<dumps>``.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import tempfile
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import holmes  # noqa: E402
from holmes.eval.realrun_hang import HangSpec, score_hang  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FR = ROOT.parent / "shared" / "data" / "flight_recorder"


def _fr_rows() -> list[tuple[str, bool, str]]:
    from holmes.adapters import convert_flight_recorder

    rows = []
    for d in sorted(p for p in FR.glob("*") if p.is_dir()) if FR.is_dir() else []:
        log_ = d / "fault_injection.log"
        m = re.search(r"Fault ranks:\s*\[([^\]]*)\]", log_.read_text()) if log_.is_file() else None
        if not m:
            continue
        want = sorted(int(x) for x in m.group(1).split(","))
        with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            job = holmes.read_job(convert_flight_recorder(d, Path(tmp) / "job"))
            r = holmes.localize(job, analysis="hang")
        got = sorted((r.hang or {}).get("culprit_ranks", []))
        rows.append((d.name, got == want and r.verdict == "hang", f"{got} want {want}"))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default=str(ROOT / "fixtures" / "real-hang"))
    ap.add_argument("--split", default="test", choices=("test", "dev", "all"))
    ap.add_argument("--smoke", action="store_true", help="CI: the first 3 runs of the split")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    root = Path(args.corpus)
    try:
        runs = json.loads((root / "MANIFEST.json").read_text())["runs"]
    except (OSError, ValueError, KeyError) as exc:
        print(f"hang_real: {root}/MANIFEST.json unreadable ({exc}); generate the corpus with "
              f"python scripts/real_hangs.py corpus --out {root} --rounds 4", file=sys.stderr)
        return 2
    runs = [e for e in runs if args.split == "all" or e["split"] == args.split]
    if args.smoke:
        runs = runs[:3]
    print(f"{'run':46} {'split':5} {'want':>8} {'culprits':>10} {'named':>10} {'exact':>5} {'deadlock':>8}")
    exact = dl = 0
    waiting_named: list[int] = []
    for e in runs:
        h = e["hang"]
        spec = HangSpec(h["mode"], h["rank"], h["iteration"], h["op"], h["nth"], h["peer"])
        s = score_hang(holmes.localize(str(root / e["name"]), analysis="hang"), spec)
        exact += s["exact"]
        dl += s["deadlock_right"]
        waiting_named += s["waiting_named"]
        print(f"{e['name']:46} {e['split']:5} {str(s['want']):>8} {str(s['culprits']):>10} {str(s['named']):>10} "
              f"{int(s['exact']):>5} {int(s['deadlock_right']):>8}")
    fr = _fr_rows()
    for name, ok, what in fr:
        print(f"flight_recorder/{name:30} {'-':5} {what:>30} {int(ok):>5}")
    n = max(len(runs), 1)
    print(f"hang_exact_pct={100.0 * exact / n:.1f} waiting_named={len(waiting_named)} "
          f"deadlock_right_pct={100.0 * dl / n:.1f} runs={len(runs)} fr_exact={sum(ok for _, ok, _ in fr)}/{len(fr)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
