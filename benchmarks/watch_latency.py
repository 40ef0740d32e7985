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
as the writer recorded it) to the event. Memory: this process's resident set (``/proc``), sampled
in the event loop right after an analysis (one phase of the loop, so an analysis's transient
window is not mistaken for growth): the first sample once the watcher passed iteration
``--rss-from`` (default 1,000), then at the end of the run; and the peak (``VmHWM``). A line every
``--rss-every`` iterations shows the trend (anonymous / file-backed RSS, Arrow bytes allocated,
Python objects).

The memory run (``--fast-writer``): no real-time pacing, the writer stays at most ``--lead``
rounds (default 2) ahead of the watcher, which reads and analyses the parts exactly as it does
live (filesystem events, settling on every rank's part); parts of 20 iterations, a 100-iteration
block replayed, and the parts more than ``--keep-iters`` (1,000) iterations behind deleted by
the writer so the disk holds ~1,000 iterations, not 10,000. Its ``watch_detect_s`` includes the
competition with a writer running flat out: the latency figure is the real-time run's.

    python benchmarks/watch_latency.py                       # 1,024 GPUs, 100 iterations, 3 faults, real time
    python benchmarks/watch_latency.py --gpus 1024 --iterations 10000 --fast-writer   # memory flatness (~40 min)

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


def _rss_mb(kind: str = "VmRSS") -> tuple[float, float]:
    """(current, peak) resident set of this process in MB (``kind``: ``VmRSS``, or ``RssAnon`` /
    ``RssFile`` for the current anonymous / file-backed part, the peak is then 0)."""
    cur = peak = 0.0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(kind + ":"):
                cur = int(line.split()[1]) / 1024
            elif line.startswith("VmHWM:") and kind == "VmRSS":
                peak = int(line.split()[1]) / 1024
    return cur, peak


def _rank_block(res, r: int, B: int) -> dict:
    """Rank ``r``'s simulated block and what shifting it by a block needs (ops per iteration, the
    per-op ``seq`` step)."""
    from holmes.simulate.writer import rank_table

    t = rank_table(res, r)
    n = t.num_rows // B
    seq = t.column("seq").to_numpy()
    step = seq[n:2 * n] - seq[:n] if B > 1 else np.zeros(n, np.int64)
    return {"table": t, "n": n, "step": step}


def _part(blk: dict, lo: int, hi: int, B: int, span: int):
    """The rows of iterations ``[lo, hi)`` (within one replayed block): iteration, ``seq`` and
    timestamps shifted by the block number (one vectorized shift per column)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    b, j = divmod(lo, B)
    n, t = blk["n"], blk["table"]
    s = t.slice(j * n, (hi - lo) * n)
    if b:
        s = s.set_column(1, "iteration", pc.add(s.column("iteration"), b * B))
        s = s.set_column(4, "seq", pa.array(s.column("seq").to_numpy() + b * B * np.tile(blk["step"], hi - lo)))
        for c in ("start_ns", "end_ns"):
            idx = s.schema.get_field_index(c)
            s = s.set_column(idx, c, pc.add(s.column(c), b * span))
    return s


def writer(a: argparse.Namespace, out: str, log_path: str, watched=None) -> None:
    """Simulate, then write the job part by part (paced to real time, or with ``--fast-writer``
    as fast as the watcher consumes: at most ``--lead`` rounds ahead of ``watched``, the watcher's
    last iteration); log each round's last landing time; prune parts ``--keep-iters`` behind."""
    from holmes.io.parts import part_filename, rank_parts_dirname, write_part
    from holmes.simulate import run_simulation
    from holmes.simulate.writer import _DELTA

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
    # rounds: parts of --part-iters iterations, cut at block boundaries (a part never spans two blocks)
    bounds, lo = [], 0
    while lo < a.iterations:
        hi = min(lo + a.part_iters, (lo // B + 1) * B, a.iterations)
        bounds.append((lo, hi))
        lo = hi
    t0 = time.time()
    blocks: dict[int, dict] = {}
    end0 = _rank_block(res, 0, B)["table"].column("end_ns").to_numpy()
    span = int(end0.max() - end0[:len(end0) // B].max()) + int(it_time_s * 1e9)  # a replayed block starts one iteration later
    del end0
    pruned = 0
    opts = dict(compression="lz4", use_dictionary=["comm_id", "op"], write_statistics=False, column_encoding=_DELTA)
    waited = 0.0
    with open(log_path, "w") as log:
        log.write(json.dumps({"world_size": W, "iteration_s": it_time_s, "ops_per_rank": ops,
                              "part_bounds": bounds}) + "\n")
        log.flush()
        for k, (lo, hi) in enumerate(bounds):
            if watched is not None:  # fast writer: no further than --lead rounds ahead of the watcher
                tw = time.time()
                while k >= a.lead and watched.value < bounds[k - a.lead][1] - 1:
                    time.sleep(0.02)
                waited += time.time() - tw
            for r in rng.permutation(W):
                r = int(r)
                blk = blocks.get(r)
                if blk is None:
                    blk = _rank_block(res, r, B)
                    if len(blocks) < a.cache_ranks:
                        blocks[r] = blk
                write_part(d / "ranks" / rank_parts_dirname(r), k, _part(blk, lo, hi, B, span), **opts)
            landed = time.time()
            log.write(json.dumps({"part": k, "first": lo, "last": hi - 1, "landed": landed,
                                  "behind_s": round(landed - (t0 + hi * it_time_s / a.speed), 3) if a.speed else None})
                      + "\n")
            log.flush()
            while a.keep_iters and pruned < k and hi - bounds[pruned][1] > a.keep_iters:
                for r in range(W):  # disk: drop every rank's part whose iterations are --keep-iters behind
                    try:
                        os.unlink(d / "ranks" / rank_parts_dirname(r) / part_filename(pruned))
                    except FileNotFoundError:
                        pass
                pruned += 1
            if a.speed:
                wait = t0 + hi * it_time_s / a.speed - time.time()
                if wait > 0:
                    time.sleep(wait)
        log.write(json.dumps({"done": time.time(), "waited_s": round(waited, 1)}) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--pp", type=int, default=4)
    ap.add_argument("--dp", type=int, default=None, help="default 32 (1,024 GPUs)")
    ap.add_argument("--gpus", type=int, default=None, help="world size: sets --dp to GPUS / (tp x pp)")
    ap.add_argument("--iterations", type=int, default=100, help="iterations written (default 100)")
    ap.add_argument("--block", type=int, default=None,
                    help="iterations simulated (default: --iterations; 100 with --fast-writer)")
    ap.add_argument("--part-iters", type=int, default=None, help="iterations per part (default 5; 20 with --fast-writer)")
    ap.add_argument("--fault-iters", type=int, nargs="+", default=[42, 62, 82], help="spike iterations (in the block)")
    ap.add_argument("--fault-gpus", type=int, nargs="+", default=[517, 90, 1000])
    ap.add_argument("--factor", type=float, default=2.5, help="spike slowdown factor (default 2.5)")
    ap.add_argument("--speed", type=float, default=1.0, help="x real time (0: as fast as possible)")
    ap.add_argument("--fast-writer", action="store_true",
                    help="memory run: no real-time pacing, the writer stays at most --lead rounds ahead of the watcher")
    ap.add_argument("--lead", type=int, default=2, help="--fast-writer: rounds written ahead of the watcher (default 2)")
    ap.add_argument("--keep-iters", type=int, default=None,
                    help="the writer deletes parts this many iterations behind (disk; default: keep all, "
                         "1,000 with --fast-writer)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--interval", type=float, default=0.25, help="watcher poll interval (default 0.25 s)")
    ap.add_argument("--settle", type=float, default=5.0)
    ap.add_argument("--rss-from", type=int, default=1000, help="iteration of the first RSS sample (default 1000)")
    ap.add_argument("--rss-every", type=int, default=1000, help="iterations between RSS samples printed (default 1000)")
    ap.add_argument("--cache-ranks", type=int, default=2048, help="rank tables the writer keeps (default all)")
    ap.add_argument("--polling", action="store_true", help="poll instead of filesystem events")
    ap.add_argument("--tracemalloc", action="store_true",
                    help="diagnosis: print the Python allocation sites that grew between --rss-from and the end (slow)")
    ap.add_argument("--smoke", action="store_true",
                    help="CI: 64 GPUs (tp 4 x pp 2 x dp 8), 30 iterations in parts of 5, 2 spikes, fast writer, "
                         "settle 0.5 s; exits 1 unless a spike is detected")
    a = ap.parse_args(argv)
    if a.smoke:
        a.tp, a.pp, a.dp, a.gpus, a.iterations, a.part_iters = 4, 2, 8, None, 30, 5
        a.fault_iters, a.fault_gpus, a.fast_writer, a.keep_iters = [12, 22], [5, 40], True, None
        a.settle, a.interval, a.rss_from, a.rss_every = 0.5, 0.1, 10, 10
    if a.gpus is not None:
        if a.dp is not None or a.gpus % (a.tp * a.pp):
            ap.error(f"--gpus {a.gpus} must be a multiple of tp x pp = {a.tp * a.pp} (and not given with --dp)")
        a.dp = a.gpus // (a.tp * a.pp)
    a.dp = 32 if a.dp is None else a.dp
    if a.fast_writer:
        a.speed = 0.0
        a.block = a.block or min(a.iterations, 100)
        a.part_iters = a.part_iters or 20
        a.keep_iters = 1000 if a.keep_iters is None else a.keep_iters
    a.block = a.block or a.iterations
    a.part_iters = a.part_iters or 5
    world = a.tp * a.pp * a.dp
    pairs = [(g % world, i) for g, i in zip(a.fault_gpus, a.fault_iters) if i < a.block]
    a.fault_gpus, a.fault_iters = [g for g, _ in pairs], [i for _, i in pairs]

    import gc
    import threading
    import tracemalloc

    import pyarrow as pa

    from holmes.watch import Watcher

    snaps: list = []

    with tempfile.TemporaryDirectory() as tmp:
        job, log_path = os.path.join(tmp, "job"), os.path.join(tmp, "writer.jsonl")
        ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
        watched = ctx.Value("q", -1, lock=False) if a.fast_writer else None
        proc = ctx.Process(target=writer, args=(a, job, log_path, watched), daemon=True)
        proc.start()
        if a.tracemalloc:  # after the fork: the writer is not traced
            tracemalloc.start(6)
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
        rss_first: list = []  # (rss MB, iteration): the first sample at or after --rss-from
        n_traced = 0
        t_watch = time.time()

        def supervise() -> None:  # tells a fast writer where the watcher is; stops the watcher at the end
            while True:
                time.sleep(0.05 if watched is not None else 0.2)
                last = w.last_iteration
                if watched is not None:
                    watched.value = last
                if _done(log_path) and last >= a.iterations - 1:
                    w.stop()
                    return

        threading.Thread(target=supervise, daemon=True).start()
        n_shown = 0
        for ev in w:
            r = ev.report or {}
            events.append((time.time(), ev.event, ev.iteration, ev.at_ns))  # not the report: memory is measured
            top = (r.get("devices") or r.get("candidates") or [{}])[0].get("id")
            if n_shown < 40:
                n_shown += ev.event != "recovered"
                print(f"  {ev.event:<10} it {ev.iteration:>6} at +{time.time() - t_watch:7.1f} s  {r.get('verdict')} "
                      f"{top} analysis {ev.detail.get('analysis_s')} s settled {ev.detail.get('settled')}", flush=True)
            del ev, r
            # RSS samples at one phase of the loop: right after an analysis, its window released
            last = w.last_iteration
            if not rss_first and last >= a.rss_from:
                rss_first.append((_rss_mb()[0], last))
                if a.tracemalloc:
                    snaps.append(tracemalloc.take_snapshot())
            if last >= (n_traced + 1) * a.rss_every:
                n_traced = last // a.rss_every
                print(f"  rss {_rss_mb()[0]:7.1f} MB at iteration {last:>6} (+{time.time() - t_watch:.0f} s; anon "
                      f"{_rss_mb('RssAnon')[0]:.1f}, files {_rss_mb('RssFile')[0]:.1f}; arrow "
                      f"{pa.total_allocated_bytes() / 2**20:.1f}; python objects {len(gc.get_objects())}; "
                      f"threads {threading.active_count()})", flush=True)
        proc.join(timeout=60)
        rss_first = rss_first[0] if rss_first else None
        mode = w.follower_mode
        rss_end, rss_peak = _rss_mb()
        if snaps:
            diff = tracemalloc.take_snapshot().compare_to(snaps[0], "traceback")
            print(f"tracemalloc: traced {tracemalloc.get_traced_memory()[0] / 2**20:.1f} MB now; grown since "
                  f"iteration {rss_first[0][1]}:")
            for st in diff[:8]:
                print(f"  {st.size_diff / 1024:+9.1f} KiB {st.count_diff:+7d} blocks  "
                      + " <- ".join(f"{Path(fr.filename).name}:{fr.lineno}" for fr in st.traceback[:5]))
            tracemalloc.stop()
        with open(log_path) as f:
            recs = [json.loads(x) for x in f]
    info = recs[0]
    rounds = {r["part"]: r for r in recs if "part" in r}
    part_of = {}
    for k, (lo, hi) in enumerate(info["part_bounds"]):
        part_of.update((i, k) for i in range(lo, hi))
    fault_its = sorted(b * a.block + i for b in range(-(-a.iterations // a.block)) for i in a.fault_iters
                       if b * a.block + i < a.iterations)
    lat = []
    for _, kind, iteration, at_ns in events:
        if kind != "irregular" or iteration is None:
            continue
        hit = next((f for f in fault_its if 0 <= iteration - f <= 1), None)
        if hit is None:
            continue
        lat.append(at_ns / 1e9 - rounds[part_of[hit]]["landed"])
    behind = [r["behind_s"] for r in rounds.values() if r.get("behind_s") is not None]
    n_irr = sum(1 for _, kind, _, _ in events if kind == "irregular")
    done = next((r for r in recs if "done" in r), {})
    print(f"job: {info['world_size']} ranks, {a.iterations} iterations ({a.block} simulated, "
          f"{info['iteration_s'] * 1e3:.0f} ms each, {info['ops_per_rank']} ops/rank), parts of {a.part_iters} "
          f"({len(rounds)} x {info['world_size']} part files); follower: {mode}; watch {time.time() - t_watch:.0f} s; "
          f"load {os.getloadavg()[0]:.1f}")
    if a.fast_writer:
        print(f"writer: fast (at most {a.lead} rounds ahead of the watcher; waited for it {done.get('waited_s')} s), "
              f"parts kept: the last {a.keep_iters} iterations")
    else:
        print(f"writer: speed x{a.speed}; behind real time by median {statistics.median(behind) if behind else 0:.2f} s, "
              f"max {max(behind) if behind else 0:.2f} s")
    print(f"events: {len(events)} ({n_irr} irregular); faulty iterations {len(fault_its)}, detected {len(lat)}; "
          f"latencies s: median {statistics.median(lat) if lat else float('nan'):.2f}, max {max(lat, default=float('nan')):.2f}"
          + ("" if len(lat) > 20 else f" ({' '.join(f'{x:.2f}' for x in lat)})"))
    growth = None
    if rss_first is not None:
        growth = (rss_end / rss_first[0] - 1) * 100
        print(f"rss: {rss_first[0]:.1f} MB at iteration {rss_first[1]}, {rss_end:.1f} MB at the end "
              f"(iteration {w.last_iteration}), peak {rss_peak:.1f} MB")
    print(f"watch_detect_s={statistics.median(lat) if lat else float('nan'):.3f} watch_rss_mb={rss_peak:.1f} "
          f"watch_rss_growth_pct={growth if growth is not None else float('nan'):.1f} detected={len(lat)}/{len(fault_its)} "
          f"ranks={info['world_size']} iterations={w.last_iteration + 1}")
    if a.smoke and not lat:
        return 1
    return 0


def _done(log_path: str) -> bool:
    try:
        with open(log_path) as f:
            return any('"done"' in x for x in f)
    except FileNotFoundError:
        return False


if __name__ == "__main__":
    sys.exit(main())
