"""Hang localization at scale: synthetic hang dumps of N ranks (default 8,192), one rank stuck.

The dumps are generated here (not by the simulator): a TP x DP x PP job whose ranks ran
``--iterations`` complete steps of a pipelined schedule -- per stage a ``recv`` of activations from
the previous stage, a tp all_reduce, a ``send`` to the next stage, a ``recv`` of gradients from the
next stage, a second tp all_reduce, a ``send`` to the previous stage, then the dp all_reduce --
then one rank (the culprit) stopped before its next step (its log ends in compute). The step
that hung is played out with rendezvous semantics (a collective completes once every member is
in it, a send and its recv together) until nothing moves, so every other rank is left where a
real job leaves it: in a ``send`` to a stage that never posts the recv, a ``recv`` from a stage
that never sends, a tp all_reduce its stuck peer never enters, or the dp all_reduce its replica
never reaches. The logs are what :meth:`holmes.logger.CommOpsRecorder.dump` writes (completed
rows, then the in-flight row with a null ``end_ns``; the logger's parquet options, through
:func:`holmes.io.write_job`), written once as a job directory and cached under ``--cache``.

``hang_s`` is what a user waits for: ``holmes.localize(<job dir>, analysis="hang")`` on a freshly
opened job, end to end (job.json, every rank's log read with its schema check and consistency
pass, the in-flight selection, the wait-for graph, its roots and chains, the report); median of
``--repeats`` runs after a warm-up on a one-rank job (imports). ``read_s`` is, in the same run,
every rank's log read once through the batch read path alone (:meth:`holmes.io.Job.iter_batches`),
the part of ``hang_s`` spent reading. Correct means: the culprit is exactly the stuck rank, no
deadlock, and every other stuck rank is reported waiting.

``hang_cpu_s`` is the median process CPU time of those runs (reader threads included): on a loaded
machine the wall time mostly measures the wait for a core.

Last line: ``hang_s=<s> hang_correct=<0|1> read_s=<s> hang_cpu_s=<s> world=<N> ops=<rows>
p2p_in_flight=<n> load=<1-min load average>``.
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
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import holmes  # noqa: E402
from holmes.io import MemoryJob, write_job  # noqa: E402
from holmes.io.schema import ops_table  # noqa: E402

STEP_NS = 50_000_000


def _ids(tp: int, dp: int, r: int) -> tuple[int, int, int]:
    """(tp index, dp index, pp stage) of rank ``r`` (rank = tp_i + tp * (dp_i + dp * pp_i))."""
    return r % tp, (r // tp) % dp, r // (tp * dp)


def _program(tp: int, dp: int, pp: int, r: int) -> list[tuple[str, str, int | None]]:
    """One step of rank ``r``: ``(op, comm_id, peer)`` in issue order."""
    ti, di, si = _ids(tp, dp, r)
    tpc, dpc, ppc = f"tp-{r // tp}", f"dp-{ti}-{si}", f"pp-{ti}-{di}"
    prev, nxt = r - tp * dp, r + tp * dp
    out: list[tuple[str, str, int | None]] = []
    if si > 0:
        out.append(("recv", ppc, prev))
    out.append(("all_reduce", tpc, None))
    if si < pp - 1:
        out += [("send", ppc, nxt), ("recv", ppc, nxt)]
    out.append(("all_reduce", tpc, None))
    if si > 0:
        out.append(("send", ppc, prev))
    out.append(("all_reduce", dpc, None))
    return out


def _play(progs: list[list[tuple[str, str, int | None]]], sizes: dict[str, int]) -> list[int]:
    """How far each rank gets through ``progs`` under rendezvous semantics (index of the op it is
    stuck in; ``len`` when it finished)."""
    pos = [0] * len(progs)
    seqs: list[list[int]] = []
    for prog in progs:  # seq of each op: per comm for collectives, per (comm, direction, peer) for P2P
        c: Counter = Counter()
        s = []
        for op, cid, peer in prog:
            k = (cid,) if peer is None else (cid, op, peer)
            s.append(c[k])
            c[k] += 1
        seqs.append(s)
    moved = True
    while moved:
        moved = False
        here: Counter = Counter()
        p2p = set()
        for r, prog in enumerate(progs):
            if pos[r] < len(prog):
                op, cid, peer = prog[pos[r]]
                if peer is None:
                    here[(cid, seqs[r][pos[r]])] += 1
                else:
                    p2p.add((cid, r, peer, op, seqs[r][pos[r]]))
        for r, prog in enumerate(progs):
            if pos[r] < len(prog):
                op, cid, peer = prog[pos[r]]
                k = seqs[r][pos[r]]
                if (peer is None and here[(cid, k)] == sizes[cid]) or \
                        (peer is not None and (cid, peer, r, "recv" if op == "send" else "send", k) in p2p):
                    pos[r] += 1
                    moved = True
    return pos


def synthetic_hang(tp: int, dp: int, pp: int, iterations: int, culprit: int) -> tuple[dict, dict[int, pa.Table]]:
    """``(job.json dict, rank -> table)`` of a hung TP x DP x PP job (see the module docstring)."""
    world = tp * dp * pp
    progs = [_program(tp, dp, pp, r) for r in range(world)]
    members: dict[str, set[int]] = {}
    for r in range(world):
        for op, cid, peer in progs[r]:
            members.setdefault(cid, set()).add(r)
    comms = {cid: {"kind": cid.split("-")[0], "ranks": sorted(m)} for cid, m in members.items()}
    hung = [p if r != culprit else [] for r, p in enumerate(progs)]
    pos = _play(hung, {k: len(v["ranks"]) for k, v in comms.items()})
    at = (iterations + 1) * STEP_NS + 180 * 10**9
    meta = {"world_size": world, "communicators": comms, "dump": {"reason": "timeout", "at_ns": at}}
    tables = {}
    for r in range(world):
        prog = progs[r]
        n_it = len(prog)
        cnt: Counter = Counter()
        rows = []
        for it in range(iterations + 1):
            last = n_it if it < iterations else (0 if r == culprit else pos[r] + 1)
            for j, (op, cid, peer) in enumerate(prog[:min(last, n_it)]):
                k = (cid,) if peer is None else (cid, op, peer)
                s0 = it * STEP_NS + j * 2_000_000
                done = it < iterations or j < pos[r]
                rows.append((it, j, cid, cnt[k], op, peer, s0, s0 + 1_000_000 if done else None,
                             "completed" if done else "started"))
                cnt[k] += 1
        cols = list(zip(*rows))
        n = len(rows)
        tables[r] = ops_table(rank=np.full(n, r, np.int32), iteration=np.asarray(cols[0], np.int64),
                              op_index=np.asarray(cols[1], np.int32), comm_id=pa.array(cols[2], pa.string()),
                              seq=np.asarray(cols[3], np.int64), op=pa.array(cols[4], pa.string()),
                              peer=pa.array(cols[5], pa.int32()), nbytes=np.full(n, 1 << 20, np.int64),
                              start_ns=np.asarray(cols[6], np.int64), end_ns=pa.array(cols[7], pa.int64()),
                              state=pa.array(cols[8], pa.string()))
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
    ap.add_argument("--smoke", action="store_true",
                    help="CI: tiny sizes, tp 2 x dp 4 x pp 2, 2 iterations, 1 repeat, a fresh temporary cache")
    args = ap.parse_args(argv)
    if args.smoke:
        from _cache import smoke_dir

        args.tp, args.dp, args.pp, args.iterations, args.repeats = 2, 4, 2, 2, 1
        args.cache = str(smoke_dir("hang_scale"))
    logging.basicConfig(level=logging.WARNING)
    world = args.tp * args.dp * args.pp
    culprit = random.Random(args.seed).randrange(world)
    # "_lz4": written with the logger's parquet options (holmes.io.writer.rank_parquet_options);
    # older caches (zstd, pyarrow's defaults: 5x the read cost per file) are not reused
    d = Path(args.cache) / f"hang-pp{world}_tp{args.tp}_pp{args.pp}_it{args.iterations}_s{args.seed}_lz4"
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
    times, cpus, report = [], [], None
    for _ in range(max(1, args.repeats)):
        t, c = time.perf_counter(), time.process_time()
        report = holmes.localize(str(d), analysis="hang")
        times.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    assert report is not None
    hang_s = statistics.median(times)
    job = holmes.read_job(d)
    t = time.perf_counter()
    rows, stuck, p2p = 0, set(), 0
    for b in job.iter_batches():
        rows += b.table.num_rows
        t_open = b.table.filter(pc.not_equal(b.table.column("state"), "completed"))
        stuck.update(t_open.column("rank").to_pylist())
        p2p += sum(o in ("send", "recv") for o in t_open.column("op").to_pylist())
    read_s = time.perf_counter() - t
    h = report.hang or {}
    got = h.get("culprit_ranks", [])
    # right: the stuck rank alone, no deadlock, every rank in flight reported waiting
    correct = int(report.verdict == "hang" and got == [culprit] and h.get("deadlock") is None
                  and h.get("waiting_count") == len(stuck - {culprit}))
    load = os.getloadavg()[0]
    print(f"{'world':>8} {'ops':>9} {'generate_s':>11} {'hang_s':>8} {'(runs)':>20} {'read_s':>8} {'culprit':>8} "
          f"{'found':>12} {'comms':>6}")
    print(f"{world:>8} {rows:>9} {gen_s:>11.2f} {hang_s:>8.2f} {','.join(f'{x:.2f}' for x in times):>20} "
          f"{read_s:>8.2f} {culprit:>8} {str(got):>12} {len(report.hang['communicators']) if report.hang else 0:>6}")
    if report.hang and report.hang["explanation"]:
        print(report.hang["explanation"][0])
    for line in h.get("explanation", [])[1:3]:
        print(line[:300])
    print(f"hang_s={hang_s:.3f} hang_correct={correct} read_s={read_s:.3f} hang_cpu_s={statistics.median(cpus):.3f} "
          f"world={world} ops={rows} "
          f"p2p_in_flight={p2p} waiting={h.get('waiting_count')} stuck={len(stuck)} load={load:.1f}")
    return 0 if correct else 1


if __name__ == "__main__":
    sys.exit(main())
