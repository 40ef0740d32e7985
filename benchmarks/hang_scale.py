"""Hang localization at scale: synthetic hang dumps of N ranks (default 8,192), one rank stuck.

The dumps are generated here (not by the simulator): a TP x DP x PP job whose ranks ran
``--iterations`` complete steps (two tp all_reduces and one dp all_reduce each), then one rank (the
culprit) stopped before the next tp all_reduce. Its TP peers wait in that all_reduce (``started``),
every other rank completed its tp ops and waits in the step's dp all_reduce; ranks whose DP group
holds a stuck member wait for it. The logs are what :meth:`holmes.logger.CommOpsRecorder.dump`
writes (completed rows, then the in-flight rows with a null ``end_ns``), written once as a job
directory and cached under ``--cache``.

``hang_s`` is what a user waits for: ``holmes.localize(<job dir>, analysis="hang")`` on a freshly
opened job, end to end (job.json, every rank's log read with its schema check and consistency
pass, the in-flight selection, the per-communicator disagreement, the culprits, the report);
median of ``--repeats`` runs after a warm-up on a one-rank job (imports). ``read_s`` is, in the same
run, every rank's log read once through the batch read path alone (:meth:`holmes.io.Job.iter_batches`),
the part of ``hang_s`` spent reading. The culprit must be exactly the stuck rank.

Last line: ``hang_s=<s> hang_correct=<0|1> read_s=<s> world=<N> ops=<rows> load=<1-min load average>``.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import holmes  # noqa: E402
from holmes.io import MemoryJob, write_job  # noqa: E402
from holmes.io.schema import ops_table  # noqa: E402

STEP_NS = 50_000_000


def synthetic_hang(tp: int, dp: int, pp: int, iterations: int, culprit: int) -> tuple[dict, dict[int, pa.Table]]:
    """``(job.json dict, rank -> table)`` of a hung TP x DP x PP job (rank = tp_i + tp*(dp_i + dp*pp_i))."""
    world = tp * dp * pp

    def tp_id(r: int) -> str:
        return f"tp-{r // tp}"

    def dp_id(r: int) -> str:
        return f"dp-{(r % tp) + tp * (r // (tp * dp))}"

    comms = {}
    for r in range(world):
        comms.setdefault(tp_id(r), {"kind": "tp", "ranks": []})["ranks"].append(r)
        comms.setdefault(dp_id(r), {"kind": "dp", "ranks": []})["ranks"].append(r)
    stuck_tp = set(comms[tp_id(culprit)]["ranks"])
    at = (iterations + 1) * STEP_NS + 180 * 10**9
    meta = {"world_size": world, "communicators": comms, "dump": {"reason": "timeout", "at_ns": at}}
    n_done = 3 * iterations
    base_it = np.repeat(np.arange(iterations), 3)
    base_seq_tp = np.tile([0, 1, -1], iterations) + np.repeat(np.arange(iterations) * 2, 3)
    base_seq_dp = np.repeat(np.arange(iterations), 3)
    is_tp = np.tile([True, True, False], iterations)
    base_start = base_it * STEP_NS + np.tile([0, 10, 20], iterations) * 1_000_000
    tables = {}
    for r in range(world):
        its, seqs, cids, starts, ends, states, ops_ix = [], [], [], [], [], [], []
        comm = np.where(is_tp, tp_id(r), dp_id(r))
        seq = np.where(is_tp, base_seq_tp, base_seq_dp)
        its, cids, seqs, starts = list(base_it), list(comm), list(seq), list(base_start)
        ends = list(base_start + 5_000_000)
        states = ["completed"] * n_done
        ops_ix = list(np.tile([0, 1, 2], iterations))
        t0 = iterations * STEP_NS
        if r == culprit:
            pass                                          # stopped before the step's first collective
        elif r in stuck_tp:                               # waits in tp all_reduce #2I for the culprit
            its += [iterations]; cids += [tp_id(r)]; seqs += [2 * iterations]; starts += [t0]
            ends += [None]; states += ["started"]; ops_ix += [0]
        else:                                             # tp done, waits in the dp all_reduce
            its += [iterations] * 3; cids += [tp_id(r), tp_id(r), dp_id(r)]
            seqs += [2 * iterations, 2 * iterations + 1, iterations]
            starts += [t0, t0 + 10_000_000, t0 + 20_000_000]
            ends += [t0 + 5_000_000, t0 + 15_000_000, None]; states += ["completed", "completed", "started"]
            ops_ix += [0, 1, 2]
        n = len(its)
        tables[r] = ops_table(rank=np.full(n, r, np.int32), iteration=np.asarray(its, np.int64),
                              op_index=np.asarray(ops_ix, np.int32), comm_id=pa.array(cids, pa.string()),
                              seq=np.asarray(seqs, np.int64), op=pa.array(["all_reduce"] * n, pa.string()),
                              peer=pa.nulls(n, pa.int32()), nbytes=np.full(n, 1 << 20, np.int64),
                              start_ns=np.asarray(starts, np.int64), end_ns=pa.array(ends, pa.int64()),
                              state=pa.array(states, pa.string()))
    return meta, tables


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--dp", type=int, default=256)
    ap.add_argument("--pp", type=int, default=4)
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "holmes-bench-scale"),
                    help="where the generated dump directory is kept (reused by later runs)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    world = args.tp * args.dp * args.pp
    culprit = random.Random(args.seed).randrange(world)
    d = Path(args.cache) / f"hang{world}_tp{args.tp}_pp{args.pp}_it{args.iterations}_s{args.seed}"
    t = time.perf_counter()
    if not (d / "job.json").is_file():
        meta, tables = synthetic_hang(args.tp, args.dp, args.pp, args.iterations, culprit)
        write_job(d, meta, tables, overwrite=d.exists())
        del tables
    gen_s = time.perf_counter() - t
    meta, tables = synthetic_hang(args.tp, 1, 1, 1, 0)
    logging.disable(logging.WARNING)  # the warm-up job lacks every rank but one
    holmes.localize(MemoryJob(meta, {0: tables[0]}), analysis="hang")  # imports, outside the timings
    logging.disable(logging.NOTSET)
    times, report = [], None
    for _ in range(max(1, args.repeats)):
        t = time.perf_counter()
        report = holmes.localize(str(d), analysis="hang")
        times.append(time.perf_counter() - t)
    assert report is not None
    hang_s = statistics.median(times)
    job = holmes.read_job(d)
    t = time.perf_counter()
    rows = sum(b.table.num_rows for b in job.iter_batches())
    read_s = time.perf_counter() - t
    got = report.hang["culprit_ranks"] if report.hang else []
    correct = int(report.verdict == "hang" and got == [culprit])
    load = os.getloadavg()[0]
    print(f"{'world':>8} {'ops':>9} {'generate_s':>11} {'hang_s':>8} {'(runs)':>20} {'read_s':>8} {'culprit':>8} "
          f"{'found':>12} {'comms':>6}")
    print(f"{world:>8} {rows:>9} {gen_s:>11.2f} {hang_s:>8.2f} {','.join(f'{x:.2f}' for x in times):>20} "
          f"{read_s:>8.2f} {culprit:>8} {str(got):>12} {len(report.hang['communicators']) if report.hang else 0:>6}")
    if report.hang and report.hang["explanation"]:
        print(report.hang["explanation"][0])
    print(f"hang_s={hang_s:.3f} hang_correct={correct} read_s={read_s:.3f} world={world} ops={rows} load={load:.1f}")
    return 0 if correct else 1


if __name__ == "__main__":
    sys.exit(main())
