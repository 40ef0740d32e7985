"""Generate the real hung runs (holmes.eval.realrun_hang): one run, or the corpus with its manifest.

    python scripts/real_hangs.py run --out /tmp/h --tp 2 --pp 2 --dp 2 --mode stop --rank 5 --iteration 2 --op recv
    python scripts/real_hangs.py corpus --out fixtures/real-hang [--rounds 3] [--only h001,h004]

Bad input exits with status 2 and one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from holmes.errors import HolmesError  # noqa: E402


def cmd_run(a: argparse.Namespace) -> int:
    from holmes.eval.realrun import RealRunConfig
    from holmes.eval.realrun_hang import HangSpec, run_hang_job

    cfg = RealRunConfig(tp=a.tp, pp=a.pp, dp=a.dp, iterations=a.iterations, seed=a.seed, warmup=1, timeout=a.timeout,
                        tokens=64, hidden=64, ffn=256)
    out = run_hang_job(a.out, cfg, HangSpec(a.mode, a.rank, a.iteration, a.op, a.nth, a.peer), overwrite=a.overwrite)
    print(out)
    return 0


def cmd_corpus(a: argparse.Namespace) -> int:
    from holmes.eval.realrun_hang import hang_plan, run_hang_job

    root = Path(a.out)
    root.mkdir(parents=True, exist_ok=True)
    only = [s for s in (a.only or "").split(",") if s]
    entries = []
    for item in hang_plan(a.rounds, seed0=a.seed0):
        name = item["name"]
        if only and not any(s in name for s in only):
            continue
        t = time.perf_counter()
        run_hang_job(root / name, item["config"], item["hang"], overwrite=True)
        entries.append({"name": name, "split": item["split"], "seed": item["seed"],
                        "hang": {**item["hang"].__dict__, "culprits": item["hang"].culprits},
                        "layout": item["config"].layout_name, "seconds": round(time.perf_counter() - t, 1)})
        print(f"{name:48s} {item['split']:5s} {entries[-1]['seconds']:6.1f} s", flush=True)
    man = root / "MANIFEST.json"
    old = json.loads(man.read_text())["runs"] if man.is_file() else []
    keep = {e["name"]: e for e in old}
    keep.update({e["name"]: e for e in entries})
    doc = {"schema": "holmes.realrun-hang-manifest/1",
           "split_rule": "(seed % 7 + seed // 7) % 2 == 0 -> dev, else test",
           "command": f"python scripts/real_hangs.py corpus --out {root} --rounds {a.rounds}"
                      + (f" --seed0 {a.seed0}" if a.seed0 else ""),
           "runs": sorted(keep.values(), key=lambda e: e["name"])}
    man.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    return 0


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv: list[str] | None = None) -> int:
    ap = _Parser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    r = sub.add_parser("run", help="one hung run")
    r.add_argument("--out", required=True)
    for k, d in (("tp", 2), ("pp", 2), ("dp", 2), ("iterations", 6), ("seed", 0), ("rank", 0), ("iteration", 2),
                 ("nth", 0)):
        r.add_argument(f"--{k}", type=int, default=d)
    r.add_argument("--mode", default="stop")
    r.add_argument("--op", default="step")
    r.add_argument("--peer", type=int, default=None)
    r.add_argument("--timeout", type=float, default=20.0)
    r.add_argument("--overwrite", action="store_true")
    c = sub.add_parser("corpus", help="the hung runs of hang_plan and MANIFEST.json")
    c.add_argument("--out", required=True)
    c.add_argument("--rounds", type=int, default=3)
    c.add_argument("--seed0", type=int, default=0, help="first seed (a fresh corpus: a seed the shipped one does not use)")
    c.add_argument("--only", default=None, help="comma-separated substrings of run names")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    try:
        return cmd_run(a) if a.cmd == "run" else cmd_corpus(a)
    except HolmesError as exc:
        print(f"real_hangs: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
