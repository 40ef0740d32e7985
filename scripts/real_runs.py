"""Real multi-process PyTorch runs with injected faults (see docs/real-runs.md).

    python scripts/real_runs.py run --out DIR --tp 2 --pp 2 --dp 2 --fault gpu:5@persistent*1.5 --seed 3
    python scripts/real_runs.py corpus --out fixtures/real            # 60 faulted + 15 healthy runs
    python scripts/real_runs.py stats fixtures/real                   # re-print the corpus statistics

Every run prints one summary line: iteration time and CV, op-duration CV, compute / wire / wait
share of the step, and how much the fault stretched its iterations (``stretch``) and the faulty
device's own compute or wire time (``dev_stretch``). Exit status 2 and one line on stderr on bad
input.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from holmes.errors import HolmesError  # noqa: E402


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        print(f"real_runs: {message}", file=sys.stderr)
        raise SystemExit(2)


def _fmt(x: object, spec: str = ".3f") -> str:
    return "-" if x is None or (isinstance(x, float) and not np.isfinite(x)) else format(x, spec)


def summary_line(name: str, spec: str | None, st: dict) -> str:
    return (f"{name:44s} {spec or 'healthy':30s} it_ms={_fmt(st['it_ms'], '.0f'):>5s} it_cv={_fmt(st['it_cv'])} "
            f"op_cv={_fmt(st['op_cv'])} compute={_fmt(st['compute_share'], '.2f')} wire={_fmt(st['wire_share'], '.2f')} "
            f"wait={_fmt(st['wait_share'], '.2f')} stretch={_fmt(st['stretch'])} dev_stretch={_fmt(st['device_stretch'])} "
            f"wall_s={_fmt(st['wall_s'], '.1f')} load={_fmt(st.get('loadavg_1min'), '.1f')}")


def aggregate(rows: list[dict]) -> list[str]:
    """Per fault kind: median statistics (and the stretch range)."""
    out = []
    by: dict[str, list[dict]] = {}
    for r in rows:
        kind = "healthy" if not r["fault"] else r["fault"].split(":", 1)[0]
        by.setdefault(kind, []).append(r["stats"])
        by.setdefault("all", []).append(r["stats"])
    for kind in sorted(by):
        sts = by[kind]

        def med(k: str) -> float:
            v = [s[k] for s in sts if s.get(k) is not None and np.isfinite(s[k])]
            return float(np.median(v)) if v else float("nan")

        def rng(k: str) -> str:
            v = [s[k] for s in sts if s.get(k) is not None and np.isfinite(s[k])]
            return f"{min(v):.2f}-{max(v):.2f}" if v else "-"

        out.append(f"summary {kind:8s} n={len(sts):3d} it_cv={med('it_cv'):.3f} op_cv={med('op_cv'):.3f} "
                   f"compute={med('compute_share'):.2f} wire={med('wire_share'):.2f} wait={med('wait_share'):.2f} "
                   f"stretch={med('stretch'):.3f} ({rng('stretch')}) dev_stretch={med('device_stretch'):.2f} "
                   f"({rng('device_stretch')})")
    return out


def cmd_run(a: argparse.Namespace) -> int:
    from holmes.eval.realrun import RealRunConfig, run_real_job
    from holmes.eval.realrun_stats import run_stats

    cfg = RealRunConfig(tp=a.tp, pp=a.pp, dp=a.dp if a.dp is not None else (0 if a.world_size else 2), ep=a.ep,
                        world_size=a.world_size, gpus_per_host=a.gpus_per_host, iterations=a.iterations,
                        micro_batches=a.micro_batches, seed=a.seed, faults=tuple(a.fault or ()),
                        sequence_parallel=a.sp, distributed_optimizer=a.distributed_optimizer,
                        device_flops=a.device_flops, timeout=a.timeout, fault_side=a.fault_side)
    cfg.validate()
    out = run_real_job(a.out, cfg, overwrite=a.overwrite)
    print(summary_line(Path(out).name, ";".join(cfg.faults) or None, run_stats(out)))
    return 0


def cmd_corpus(a: argparse.Namespace) -> int:
    from holmes.eval.realrun import run_real_job
    from holmes.eval.realrun_corpus import always_plan, corpus_plan, write_manifest
    from holmes.eval.realrun_stats import run_stats

    root = Path(a.out)
    if a.plan == "always":
        plan = always_plan(a.runs_per_cell, a.healthy, seed0=1000 if a.seed0 is None else a.seed0)
    else:
        plan = corpus_plan(a.runs_per_cell, a.healthy, seed0=a.seed0 or 0)
    if a.only:
        plan = [p for p in plan if any(s in p["name"] for s in a.only.split(","))]
    root.mkdir(parents=True, exist_ok=True)
    entries, rows = [], []
    t0 = time.perf_counter()
    for i, item in enumerate(plan):
        cfg, d = item["config"], root / item["name"]
        if not (a.resume and (d / "realrun.json").is_file()):
            for attempt in range(2):
                try:
                    run_real_job(d, cfg, overwrite=True)
                    break
                except HolmesError as exc:
                    if attempt:
                        raise
                    print(f"{item['name']}: retrying after: {exc}", file=sys.stderr)
        st = run_stats(d)
        truth = json.loads((d / "truth.json").read_text())
        spec = cfg.faults[0] if cfg.faults else None
        entries.append({"name": item["name"], "split": item["split"], "seed": item["seed"], "layout": cfg.layout_name,
                        "world_size": cfg.tp * cfg.pp * cfg.dp, "iterations": cfg.iterations, "fault": spec,
                        "devices": truth["devices"], "stats": {k: (round(v, 4) if isinstance(v, float) else v)
                                                               for k, v in st.items()}})
        rows.append({"fault": spec, "stats": st})
        print(summary_line(item["name"], spec, st), flush=True)
        write_manifest(root, entries if not a.resume else _merge(root, entries))
        print(f"  [{i + 1}/{len(plan)}] {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    for line in aggregate(rows):
        print(line)
    return 0


def _merge(root: Path, entries: list[dict]) -> list[dict]:
    from holmes.eval.realrun_corpus import read_manifest

    try:
        old = read_manifest(root)["runs"]
    except HolmesError:
        old = []
    names = {e["name"] for e in entries}
    return [e for e in old if e["name"] not in names] + entries


def cmd_stats(a: argparse.Namespace) -> int:
    from holmes.eval.realrun_corpus import read_manifest
    from holmes.eval.realrun_stats import run_stats

    doc = read_manifest(a.root)
    rows = []
    for e in doc["runs"]:
        if a.split != "all" and e["split"] != a.split:
            continue
        st = run_stats(Path(a.root) / e["name"])
        rows.append({"fault": e["fault"], "stats": st})
        print(summary_line(e["name"], e["fault"], st))
    for line in aggregate(rows):
        print(line)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = _Parser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    r = sub.add_parser("run", help="one run")
    r.add_argument("--out", required=True)
    r.add_argument("--tp", type=int, default=2)
    r.add_argument("--pp", type=int, default=2)
    r.add_argument("--dp", type=int, default=None, help="default 2, or world_size / (tp*pp)")
    r.add_argument("--ep", type=int, default=1)
    r.add_argument("--world-size", type=int, default=None)
    r.add_argument("--gpus-per-host", type=int, default=4)
    r.add_argument("--iterations", type=int, default=35)
    r.add_argument("--micro-batches", type=int, default=4)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--fault", action="append", help="DEVICE@PATTERN[:ITERS]*FACTOR, repeatable")
    r.add_argument("--sp", action="store_true", help="sequence parallelism (TP all_gather + reduce_scatter)")
    r.add_argument("--distributed-optimizer", action="store_true", help="DP reduce_scatter + all_gather")
    r.add_argument("--device-flops", type=float, default=5e9)
    r.add_argument("--timeout", type=float, default=120.0)
    r.add_argument("--fault-side", choices=("wire", "sender"), default="wire",
                   help="a network fault as a slower wire (inside the op) or a late sender (before it)")
    r.add_argument("--overwrite", action="store_true")
    c = sub.add_parser("corpus", help="the whole corpus and MANIFEST.json")
    c.add_argument("--out", required=True)
    c.add_argument("--runs-per-cell", type=int, default=5)
    c.add_argument("--healthy", type=int, default=15)
    c.add_argument("--seed0", type=int, default=None, help="first seed (default 0; 1000 with --plan always)")
    c.add_argument("--plan", choices=("mixed", "always"), default="mixed",
                   help="mixed: spikes, fluctuations and late-starting faults (fixtures/real); always: faults "
                        "active in every iteration over dp 1, 2 and 4 (fixtures/real-always)")
    c.add_argument("--only", default=None, help="comma-separated substrings of run names")
    c.add_argument("--resume", action="store_true", help="keep runs already written")
    s = sub.add_parser("stats", help="statistics of a generated corpus")
    s.add_argument("root")
    s.add_argument("--split", choices=("dev", "test", "all"), default="all")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return {"run": cmd_run, "corpus": cmd_corpus, "stats": cmd_stats}[a.cmd](a)
    except HolmesError as exc:  # bad input (ValueError kinds: config, job) -> 2; a failed run -> 1
        print(f"real_runs: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", file=sys.stderr)
        return 2 if isinstance(exc, ValueError) else 1
    except ImportError as exc:
        print(f"real_runs: needs PyTorch (pip install 'holmes[torch]'): {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
