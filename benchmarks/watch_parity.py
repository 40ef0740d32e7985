"""Watch parity: every run of a corpus replayed as parts, watched, and compared with the offline report.

For each job of ``--corpus`` (default ``fixtures/real``, ``fixtures/real-loaded``,
``fixtures/real-always`` and ``fixtures/real-hang``: real multi-process PyTorch runs; a rank that
died before writing lands no part), :func:`holmes.watch.replay.watch_parity` cuts the rank logs into parts
of ``--per-part`` iterations, runs :class:`holmes.watch.Watcher` over them to the end (``once``)
and runs :func:`holmes.localize` over the whole job. A job offline calls ``culprit`` (or ``hang``)
is *caught* when an event's report names the same top device (a hang event); an *extra* is an
event naming a culprit none of whose devices offline named.

    python benchmarks/watch_parity.py [--corpus fixtures/real ...] [--per-part 5] [--limit N] [--smoke]

Last line: ``parity_caught_pct=<%> parity_culprits=<n> parity_extra=<events> parity_extra_jobs=<jobs>
healthy_jobs=<n> healthy_with_culprit_event=<jobs>``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", nargs="+", default=[str(REPO / "fixtures" / c)
                                                    for c in ("real", "real-loaded", "real-always", "real-hang")])
    ap.add_argument("--per-part", type=int, default=5)
    ap.add_argument("--limit", type=int, default=None, help="at most N jobs per corpus")
    ap.add_argument("--smoke", action="store_true",
                    help="CI: 2 jobs of fixtures/real (a faulted and a healthy run), parts of 10 iterations")
    args = ap.parse_args()
    if args.smoke:
        args.corpus, args.per_part, args.limit = [str(REPO / "fixtures" / "real")], 10, 2

    from holmes.watch.replay import watch_parity

    rows = []
    for corpus in args.corpus:
        jobs = sorted(p for p in Path(corpus).iterdir() if (p / "job.json").is_file())[: args.limit]
        for job in jobs:
            t0 = time.perf_counter()
            with tempfile.TemporaryDirectory() as tmp:
                p = watch_parity(job, tmp, per_part=args.per_part)
            rows.append((Path(corpus).name, job.name, p, time.perf_counter() - t0))
            ev = " ".join(f"{e[0][:3]}@{e[1]}:{e[2]}{'/' + e[3][0] if e[3] else ''}" for e in p.events)
            print(f"{Path(corpus).name:<12} {job.name:<42} {p.offline_verdict:<12} {str(p.offline_device):<10} "
                  f"{str(p.caught):<6} extra={p.extra}  {ev}", flush=True)
    culprits = [r for r in rows if r[2].caught is not None]
    caught = sum(bool(r[2].caught) for r in culprits)
    extra = sum(r[2].extra for r in rows)
    extra_jobs = sum(1 for r in rows if r[2].extra)
    healthy = [r for r in rows if r[2].offline_verdict == "healthy"]
    extra_healthy = sum(1 for r in healthy if any(e[2] == "culprit" for e in r[2].events))
    print(f"{'jobs':<12} {len(rows)}  offline culprit/hang {len(culprits)}  caught {caught}  "
          f"extra events {extra} in {extra_jobs} job(s)  {sum(r[3] for r in rows):.0f} s")
    pct = 100.0 * caught / len(culprits) if culprits else 100.0
    print(f"parity_caught_pct={pct:.1f} parity_culprits={len(culprits)} parity_extra={extra} "
          f"parity_extra_jobs={extra_jobs} healthy_jobs={len(healthy)} healthy_with_culprit_event={extra_healthy} "
          f"jobs={len(rows)}")
    return 0 if not args.smoke or caught == len(culprits) else 1


if __name__ == "__main__":
    raise SystemExit(main())
