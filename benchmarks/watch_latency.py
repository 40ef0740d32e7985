"""Watch latency and memory: a simulated job written part by part in real time, watched by ``holmes.watch``.

A writer *process* simulates a job (default 1,024 GPUs: tp 8 x pp 4 x dp 32) with spike faults
starting mid-run and writes it as a live job would: ``job.json`` and ``topology.json`` first,
then, round after round, every rank's next part (``--part-iters`` iterations each; ranks in a
shuffled order) to a temporary name renamed into place, paced to the simulated iteration time
(``--speed`` x real time; the writer falls behind when the disk or the CPU cannot keep up, which is
reported). For a run longer than the simulated block (``--block`` iterations) the block is replayed
with its iteration numbers, ``seq`` and timestamps shifted, so a 10,000-iteration run needs only a
short simulation; the faults then recur once per block.

This process watches the job with :class:`holmes.watch.Watcher` (the shipped detector, no straggler
check: it would read every rank) and measures, for each irregular event on a faulty iteration,
the time from the moment the last rank's part holding that iteration landed (renamed into place,
as the writer recorded it) to the event. Memory: this process's resident set (``/proc``) when the
watcher passed iteration ``--rss-from`` (default 1,000) and at the end, and its peak.

    python benchmarks/watch_latency.py                       # 1,024 GPUs, 100 iterations, 3 faults
    python benchmarks/watch_latency.py --tp 2 --pp 2 --dp 2 --iterations 10000 --block 200 \\
        --part-iters 10 --speed 0                             # memory flatness (as fast as possible)

Last line: ``watch_detect_s=<median> watch_rss_mb=<peak> watch_rss_growth_pct=<%> ...``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def _rss_mb() -> tuple[float, float]:
    """(current, peak) resident set of this process in MB."""
    cur = peak = 0.0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                cur = int(line.split()[1]) / 1024
            elif line.startswith("VmHWM:"):
                peak = int(line.split()[1]) / 1024
    return cur, peak


def writer(a: argparse.Namespace, out: str, log_path: str) -> None:
    """Simulate, then write the job part by part, paced; log each round's last landing time."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from holmes.io.parts import rank_parts_dirname
    from holmes.simulate import run_simulation
    from holmes.simulate.writer import rank_table, write_parts

    faults = [f"gpu:{g}@spike:{i}*{a.factor}" for g, i in zip(a.fault_gpus, a.fault_iters)]
    res = run_simulation(tp=a.tp, pp=a.pp, dp=a.dp, iterations=a.block, seed=a.seed, faults=faults)
    W, B = res.world_size, res.iterations
    d = Path(out)
    (d / "ranks").mkdir(parents=True)
    (d / "topology.json").write_text(json.dumps(res.topology.to_dict()))
    tmp = d / ".job.json.partial"
    tmp.write_text(json.dumps(res.meta().to_json_dict()))
    os.replace(tmp, d / "job.json")
    it_time_s = float(np.median(res.iteration_times(0))) / 1e9
    ops = int(res.program.ops_per_rank.max())
    rng = np.random.default_rng(a.seed)
    n_rounds = -(-a.iterations // a.part_iters)
    t0 = time.time()
    tables: dict[int, pa.Table] = {}
    span = None
    with open(log_path, "w") as log:
        log.write(json.dumps({"world_size": W, "iteration_s": it_time_s, "ops_per_rank": ops}) + "\n")
        log.flush()
        for k in range(n_rounds):
            lo, hi = k * a.part_iters, min(a.iterations, (k + 1) * a.part_iters)
            for r in rng.permutation(W):
                r = int(r)
                t = tables.get(r)
                if t is None:
                    t = rank_table(res, r)
                    if len(tables) < a.cache_ranks:
                        tables[r] = t
                n = t.num_rows // B
                if span is None:  # a replayed block starts one iteration after the previous one ended
                    end = t.column("end_ns").to_numpy()
                    span = int(end.max() - end[:n].max()) + int(it_time_s * 1e9)
                    seq = t.column("seq").to_numpy()
                    step = np.tile(seq[n:2 * n] - seq[:n], 1) if B > 1 else np.zeros(n, np.int64)
                rows = []
                for i in range(lo, hi):  # replayed blocks: iteration, seq and time shifted
                    b, j = divmod(i, B)
                    s = t.slice(j * n, n)
                    if b:
                        s = s.set_column(1, "iteration", pc.add(s.column("iteration"), b * B))
                        s = s.set_column(4, "seq", pa.array(s.column("seq").to_numpy() + b * B * step))
                        for c in ("start_ns", "end_ns"):
                            idx = s.schema.get_field_index(c)
                            s = s.set_column(idx, c, pc.add(s.column(c), b * span))
                    rows.append(s)
                write_parts(pa.concat_tables(rows), d / "ranks" / rank_parts_dirname(r), n, hi - lo, first_index=k)
            landed = time.time()
            log.write(json.dumps({"part": k, "first": lo, "last": hi - 1, "landed": landed,
                                  "behind_s": round(landed - (t0 + hi * it_time_s / a.speed), 3) if a.speed else None})
                      + "\n")
            log.flush()
            if a.speed:
                wait = t0 + hi * it_time_s / a.speed - time.time()
                if wait > 0:
                    time.sleep(wait)
        log.write(json.dumps({"done": time.time()}) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--pp", type=int, default=4)
    ap.add_argument("--dp", type=int, default=32)
    ap.add_argument("--iterations", type=int, default=100, help="iterations written (default 100)")
    ap.add_argument("--block", type=int, default=None, help="iterations simulated (default: --iterations)")
    ap.add_argument("--part-iters", type=int, default=5, help="iterations per part (default 5)")
    ap.add_argument("--fault-iters", type=int, nargs="+", default=[42, 62, 82], help="spike iterations (in the block)")
    ap.add_argument("--fault-gpus", type=int, nargs="+", default=[517, 90, 1000])
    ap.add_argument("--factor", type=float, default=2.5, help="spike slowdown factor (default 2.5)")
    ap.add_argument("--speed", type=float, default=1.0, help="x real time (0: as fast as possible)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--interval", type=float, default=0.25, help="watcher poll interval (default 0.25 s)")
    ap.add_argument("--settle", type=float, default=5.0)
    ap.add_argument("--rss-from", type=int, default=1000, help="iteration of the first RSS sample (default 1000)")
    ap.add_argument("--cache-ranks", type=int, default=2048, help="rank tables the writer keeps (default all)")
    ap.add_argument("--polling", action="store_true", help="poll instead of filesystem events")
    a = ap.parse_args(argv)
    a.block = a.block or a.iterations
    world = a.tp * a.pp * a.dp
    pairs = [(g % world, i) for g, i in zip(a.fault_gpus, a.fault_iters) if i < a.block]
    a.fault_gpus, a.fault_iters = [g for g, _ in pairs], [i for _, i in pairs]

    from holmes.watch import Watcher

    with tempfile.TemporaryDirectory() as tmp:
        job, log_path = os.path.join(tmp, "job"), os.path.join(tmp, "writer.jsonl")
        ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
        proc = ctx.Process(target=writer, args=(a, job, log_path), daemon=True)
        proc.start()
        t_start = time.time()
        while not os.path.exists(os.path.join(job, "job.json")):
            if not proc.is_alive():
                print("writer failed", file=sys.stderr)
                return 1
            time.sleep(0.1)
        print(f"writer: job.json after {time.time() - t_start:.1f} s (simulation)", flush=True)
        w = Watcher(job, window=100, interval=a.interval, settle=a.settle, straggler_check=False,
                    use_watchdog=False if a.polling else None, idle_exit=max(30.0, 4 * a.settle))
        events = []
        rss_first: list = []
        t_watch = time.time()

        def supervise() -> None:  # samples the RSS once past --rss-from; stops the watcher at the end
            while True:
                time.sleep(0.2)
                if not rss_first and w.last_iteration >= a.rss_from:
                    rss_first.append((_rss_mb()[0], w.last_iteration))
                if _done(log_path) and w.last_iteration >= a.iterations - 1:
                    w.stop()
                    return

        import threading

        threading.Thread(target=supervise, daemon=True).start()
        for ev in w:
            r = ev.report or {}
            events.append((time.time(), ev.event, ev.iteration, ev.at_ns))  # not the report: memory is measured
            top = (r.get("devices") or r.get("candidates") or [{}])[0].get("id")
            if ev.event != "recovered" or len(events) < 40:
                print(f"  {ev.event:<10} it {ev.iteration:>6} at +{time.time() - t_watch:7.1f} s  {r.get('verdict')} "
                      f"{top} analysis {ev.detail.get('analysis_s')} s settled {ev.detail.get('settled')}", flush=True)
        proc.join(timeout=60)
        rss_first = rss_first[0] if rss_first else None
        mode = w.follower_mode
        rss_end, rss_peak = _rss_mb()
        with open(log_path) as f:
            recs = [json.loads(x) for x in f]
    info = recs[0]
    rounds = {r["part"]: r for r in recs if "part" in r}
    fault_its = sorted(b * a.block + i for b in range(-(-a.iterations // a.block)) for i in a.fault_iters
                       if b * a.block + i < a.iterations)
    lat = []
    for _, kind, iteration, at_ns in events:
        if kind != "irregular" or iteration is None:
            continue
        hit = next((f for f in fault_its if 0 <= iteration - f <= 1), None)
        if hit is None:
            continue
        k = hit // a.part_iters
        lat.append(at_ns / 1e9 - rounds[k]["landed"])
    behind = [r["behind_s"] for r in rounds.values() if r.get("behind_s") is not None]
    n_irr = sum(1 for _, kind, _, _ in events if kind == "irregular")
    print(f"job: {info['world_size']} ranks, {a.iterations} iterations ({a.block} simulated, "
          f"{info['iteration_s'] * 1e3:.0f} ms each, {info['ops_per_rank']} ops/rank), parts of {a.part_iters}; "
          f"follower: {mode}; load {os.getloadavg()[0]:.1f}")
    print(f"writer: speed x{a.speed}; behind real time by median {statistics.median(behind) if behind else 0:.2f} s, "
          f"max {max(behind) if behind else 0:.2f} s")
    print(f"events: {len(events)} ({n_irr} irregular); faulty iterations {len(fault_its)}, detected {len(lat)}; "
          f"latencies s: {' '.join(f'{x:.2f}' for x in lat)}")
    growth = None
    if rss_first is not None:
        growth = (rss_end / rss_first[0] - 1) * 100
        print(f"rss: {rss_first[0]:.1f} MB at iteration {rss_first[1]}, {rss_end:.1f} MB at the end "
              f"(iteration {w.last_iteration}), peak {rss_peak:.1f} MB")
    print(f"watch_detect_s={statistics.median(lat) if lat else float('nan'):.3f} watch_rss_mb={rss_peak:.1f} "
          f"watch_rss_growth_pct={growth if growth is not None else float('nan'):.1f} detected={len(lat)}/{len(fault_its)} "
          f"ranks={info['world_size']} iterations={w.last_iteration + 1}")
    return 0


def _done(log_path: str) -> bool:
    try:
        with open(log_path) as f:
            return any('"done"' in x for x in f)
    except FileNotFoundError:
        return False


if __name__ == "__main__":
    sys.exit(main())
