"""Live ``torch.distributed.pipelining`` captures: the slow stage named, healthy ones silent, with
and without the logger's ``return_ns``/``wait_ns`` columns.

Captures ``examples/capture_pipelining.py`` jobs (gloo on CPU, one pipeline stage per process)
for every schedule (GPipe, 1F1B) x world size (2, 4, 8) x repeat: each healthy, and with one
rank stalling in its forward every 4th step (``--slow-rank``, the rank cycling with the
repeat). Every capture is localized twice: as the logger wrote it, and with the two columns
dropped (the rank's own work read as if every operator held it from its start to its end, as
before 2026-11-28). ``--parallel 2`` captures two jobs at a time (a loaded machine). ``--reuse
DIR`` scores the captures already in ``DIR`` (directories named ``h-*`` healthy,
``s-*-srR`` slow rank ``R``).

Scoring: a slow capture is right when the slow rank's GPU is named first; a healthy one when
nothing is named. Takes about 25 s a capture on a 2-core machine.

Last line: ``healthy_named_pct=<%> healthy_named_nowait_pct=<%> slow_top1_pct=<%>
slow_top1_nowait_pct=<%> captures=<n>`` (``_2rank`` variants of the first two follow the overall).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import holmes  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CAPTURE = ROOT / "examples" / "capture_pipelining.py"
COLUMNS = ("return_ns", "wait_ns")


def _capture(out: Path, schedule: str, world: int, steps: int, slow: int | None, extra: list[str]) -> Path | None:
    cmd = [sys.executable, str(CAPTURE), "--out", str(out), "--steps", str(steps), "--schedule", schedule,
           "--world", str(world)] + ([] if slow is None else ["--slow-rank", str(slow)] + extra)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0 or not (out / "job.json").exists():
        print(f"# capture failed: {out.name}: {done.stderr.strip().splitlines()[-1:]}", flush=True)
        return None
    return out


def _plan(root: Path, schedules: list[str], worlds: list[int], repeats: int) -> list[tuple[Path, str, int, int | None]]:
    jobs = []
    i = 0
    for rep in range(repeats):
        for sch in schedules:
            for w in worlds:
                i += 1
                jobs.append((root / f"h-{sch}-w{w}-r{rep}", sch, w, None))
                slow = (i + rep) % w
                jobs.append((root / f"s-{sch}-w{w}-r{rep}-sr{slow}", sch, w, slow))
    return jobs


def _without_columns(src: Path, dst: Path) -> Path:
    import pyarrow.parquet as pq

    shutil.copytree(src, dst)
    for f in (dst / "ranks").glob("*.parquet"):
        t = pq.read_table(f)
        pq.write_table(t.drop_columns([c for c in COLUMNS if c in t.column_names]), f)
    return dst


def _named(job: Path) -> list[str]:
    return [d.id for d in holmes.localize(job).devices]


def _score(job: Path, tmp: Path) -> tuple[str, bool, bool, list[str], list[str]]:
    """(kind, right with the columns, right without, named with, named without)."""
    slow = job.name.rsplit("-sr", 1)[1] if "-sr" in job.name else None
    new = _named(job)
    old = _named(_without_columns(job, tmp / job.name))

    def right(named: list[str]) -> bool:
        return named[:1] == [f"gpu:{slow}"] if slow is not None else named == []

    return ("slow" if slow is not None else "healthy"), right(new), right(old), new, old


def _pct(xs: list[bool]) -> str:
    return f"{100.0 * sum(xs) / len(xs):.1f}" if xs else "nan"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="keep the captures here (default: a temporary directory)")
    ap.add_argument("--reuse", default=None, help="score the captures already in this directory")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--worlds", default="2,4,8")
    ap.add_argument("--schedules", default="gpipe,1f1b")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--parallel", type=int, default=1, help="captures at a time (2: a loaded machine)")
    ap.add_argument("--delay", type=float, default=None, help="the slow rank's stall, seconds (script default 0.06)")
    ap.add_argument("--every", type=int, default=None, help="... in every N-th step (script default 4; 1: every step)")
    ap.add_argument("--smoke", action="store_true", help="CI: one healthy and one slow 4-rank GPipe, 12 steps")
    args = ap.parse_args(argv)
    if args.smoke:
        args.repeats, args.worlds, args.schedules, args.steps = 1, "4", "gpipe", 12
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        if args.reuse:
            jobs = sorted(p for p in Path(args.reuse).iterdir() if (p / "job.json").exists()
                          and p.name[:2] in ("h-", "s-"))
        else:
            root = Path(args.out) if args.out else tmp / "captures"
            root.mkdir(parents=True, exist_ok=True)
            plan = _plan(root, args.schedules.split(","), [int(w) for w in args.worlds.split(",")], args.repeats)
            with ThreadPoolExecutor(max(1, args.parallel)) as pool:
                extra = ([] if args.delay is None else ["--delay", str(args.delay)]) + \
                    ([] if args.every is None else ["--every", str(args.every)])
                got = list(pool.map(lambda j: _capture(j[0], j[1], j[2], args.steps, j[3], extra), plan))
            jobs = [j for j in got if j is not None]
        (tmp / "old").mkdir()
        rows = []
        print(f"{'capture':36s} {'kind':8s} {'named (with columns)':32s} {'named (without)':32s}")
        for job in jobs:
            kind, new, old, nn, on = _score(job, tmp / "old")
            two = "-w2-" in job.name
            rows.append((kind, new, old, two))
            print(f"{job.name:36s} {kind:8s} {', '.join(nn[:2]) or '-':32s} {', '.join(on[:2]) or '-':32s}"
                  f" {'ok' if new else 'WRONG'}/{'ok' if old else 'WRONG'}", flush=True)
    h = [r for r in rows if r[0] == "healthy"]
    s = [r for r in rows if r[0] == "slow"]
    h2 = [r for r in h if r[3]]
    print(f"healthy_named_pct={_pct([not r[1] for r in h])} healthy_named_nowait_pct={_pct([not r[2] for r in h])} "
          f"slow_top1_pct={_pct([r[1] for r in s])} slow_top1_nowait_pct={_pct([r[2] for r in s])} "
          f"captures={len(rows)} healthy_named_2rank_pct={_pct([not r[1] for r in h2])} "
          f"healthy_named_nowait_2rank_pct={_pct([not r[2] for r in h2])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
