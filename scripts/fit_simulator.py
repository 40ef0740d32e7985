"""Measure the simulator against reality: noise, shares and fault stretch, simulated vs real runs.

Usage::

    python scripts/fit_simulator.py [--corpus fixtures/real] [--iterations 30] [--markdown]

For (a) simulated jobs at the default shapes (default :class:`holmes.simulate.Workload`,
``micro_batches = 4 * pp``), (b) simulated jobs at the real corpus' shapes (its layouts, 4
micro-batches) and (c) the healthy runs of the real-run corpus (``MANIFEST.json`` under
``--corpus``; skipped when absent), prints per job

``it_cv``
    CV of the iteration time (median over ranks of each rank's iteration duration) over the
    healthy iterations after the first;
``op_cv``
    median over (rank, op position) of the CV of the op duration over those iterations;
``compute``
    share of the step spent between communication ops (the compute gaps plus the tail after the
    last op), median over ranks;
``wait``
    share of the step spent inside communication ops waiting for the peers: for each op,
    ``max(entry over the members of its collective or send/recv pair) - own entry`` (the rest of
    the op is its own transfer), median over ranks;
``gap_tail``
    p99.9 of the compute gaps, each over the median of its (rank, op position), pooled over the
    job (the heavy tail: 1.0-1.1 for a light lognormal body);
``shared``
    share of the per-rank compute-time variance (over iterations) that is common to all ranks of
    the job (variance of the rank-mean over the mean per-rank variance; 1/ranks when independent);
``stretch13``
    (simulated only) a persistent 1.3x ``gpu`` fault on the first rank of stage 0, of the
    middle stage and of the last stage: the smallest median stretch of the faulted iterations on
    rank 0 and on the median rank.

For the real runs it also prints :func:`holmes.eval.realrun_stats.run_stats` (the in-process
measured compute / wire / wait shares). ``--markdown`` prints the table of ``docs/simulator-fit.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from holmes.simulate import Workload, run_simulation  # noqa: E402

#: default shapes (64-128 GPUs): the README's 4x4x4, the issue's 2x8x4, a deep tp8 job, a shallow one
DEFAULT_SHAPES = [dict(tp=4, pp=4, dp=4), dict(tp=2, pp=8, dp=4), dict(tp=8, pp=8, dp=2), dict(tp=4, pp=2, dp=8)]
P2P = ("send", "recv")


def _cv(x: np.ndarray) -> float:
    x = np.asarray(x, float)
    return float(x.std(ddof=1) / x.mean()) if len(x) > 1 and x.mean() > 0 else float("nan")


def rank_arrays_from_job(job, rank: int) -> dict[str, np.ndarray]:
    """One rank's ops and iteration bounds (its own clock) from a job directory."""
    t = job.ops(rank)
    it = job.iterations(rank)
    return {
        "iteration": t.column("iteration").to_numpy(), "op_index": t.column("op_index").to_numpy(),
        "comm": np.asarray(t.column("comm_id").to_pylist(), dtype=object),
        "seq": t.column("seq").to_numpy(), "op": np.asarray(t.column("op").to_pylist(), dtype=object),
        "peer": t.column("peer").fill_null(-1).to_numpy(),
        "start": t.column("start_ns").to_numpy().astype(np.int64), "end": t.column("end_ns").to_numpy().astype(np.int64),
        "it_iter": it.column("iteration").to_numpy(), "it_start": it.column("start_ns").to_numpy().astype(np.int64),
        "it_end": it.column("end_ns").to_numpy().astype(np.int64),
    }


def rank_arrays_from_sim(res, rank: int) -> dict[str, np.ndarray]:
    """One rank's ops on the simulation's true time line (clock offsets removed)."""
    from holmes.io.schema import OP_NAMES

    prog = res.program
    sl = res.rank_slice(rank)
    n, n_it = sl.stop - sl.start, res.iterations
    starts, ends = res.rank_times(rank, wall_clock=False)
    its = np.arange(n_it)
    return {
        "iteration": np.repeat(its, n), "op_index": np.tile(np.arange(n), n_it),
        "comm": np.tile(np.asarray([prog.comm_ids[c] for c in prog.comm[sl]], dtype=object), n_it),
        "seq": (prog.seq_base[sl][None, :] + its[:, None] * prog.seq_step[sl][None, :]).ravel(),
        "op": np.tile(np.asarray([OP_NAMES[o] for o in prog.op[sl]], dtype=object), n_it),
        "peer": np.tile(prog.peer[sl].astype(np.int64), n_it),
        "start": starts.ravel(), "end": ends.ravel(),
        "it_iter": its, "it_start": res.iter_start[:, rank].copy(), "it_end": res.iter_end[:, rank].copy(),
    }


def log_stats(ranks: dict[int, dict[str, np.ndarray]], healthy: np.ndarray) -> dict[str, float]:
    """The statistics of the module docstring from every rank's arrays (one shared clock)."""
    n_it = healthy.size
    use = healthy.copy()
    use[0] = False  # the first iteration starts from an empty pipeline
    W = len(ranks)
    dur = np.full((W, n_it), np.nan)
    comp = np.full((W, n_it), np.nan)
    op_cvs, tails = [], []
    entry_max: dict[tuple, int] = {}
    keys: dict[int, list[tuple]] = {}
    for i, (r, a) in enumerate(sorted(ranks.items())):
        ok = (a["it_iter"] >= 0) & (a["it_iter"] < n_it)
        dur[i, a["it_iter"][ok]] = (a["it_end"] - a["it_start"])[ok]
        it_start = dict(zip(a["it_iter"].tolist(), a["it_start"].tolist()))
        it_end = dict(zip(a["it_iter"].tolist(), a["it_end"].tolist()))
        its, st, en = a["iteration"], a["start"], a["end"]
        prev = np.empty_like(en)
        prev[1:] = en[:-1]
        first = np.ones(its.size, bool)
        first[1:] = its[1:] != its[:-1]
        prev[first] = [it_start.get(int(x), s) for x, s in zip(its[first], st[first])]
        gap = (st - prev).astype(float)
        last = np.ones(its.size, bool)
        last[:-1] = its[1:] != its[:-1]
        tail = np.zeros(n_it)
        tail[its[last]] = [it_end.get(int(x), e) - e for x, e in zip(its[last], en[last])]
        comp[i] = np.bincount(its, weights=gap, minlength=n_it)[:n_it] + tail
        keep = use[np.clip(its, 0, n_it - 1)]
        d = (en - st).astype(float)
        for k in np.unique(a["op_index"]):
            sel = keep & (a["op_index"] == k)
            if sel.sum() >= 3:
                op_cvs.append(_cv(d[sel]))
                g = gap[sel]
                if np.median(g) > 0:
                    tails.append(g / np.median(g))
        kk = []
        for j in range(its.size):
            op = a["op"][j]
            if op in P2P:
                snd, rcv = (r, int(a["peer"][j])) if op == "send" else (int(a["peer"][j]), r)
                key = (a["comm"][j], int(a["seq"][j]), snd, rcv)
            else:
                key = (a["comm"][j], int(a["seq"][j]))
            kk.append(key)
            v = int(st[j])
            if entry_max.get(key, v - 1) < v:
                entry_max[key] = v
        keys[r] = kk
    wait = np.zeros((W, n_it))
    for i, (r, a) in enumerate(sorted(ranks.items())):
        w = np.array([entry_max[k] for k in keys[r]], np.int64) - a["start"]
        wait[i] = np.bincount(a["iteration"], weights=w.astype(float), minlength=n_it)[:n_it]
    du = dur[:, use]
    it_time = np.nanmedian(du, axis=0)
    cu = comp[:, use]
    rel = cu / np.nanmean(cu, axis=1, keepdims=True)
    per_rank_var = np.nanmean(np.nanvar(rel, axis=1))
    shared = float(np.nanvar(np.nanmean(rel, axis=0)) / per_rank_var) if per_rank_var > 0 else float("nan")
    return {
        "it_ms": float(np.median(it_time) / 1e6), "it_cv": _cv(it_time), "op_cv": float(np.nanmedian(op_cvs)),
        "compute": float(np.nanmedian(np.nansum(cu, 1) / np.nansum(du, 1))),
        "wait": float(np.nanmedian(wait[:, use].sum(1) / np.nansum(du, 1))),
        "gap_tail": float(np.percentile(np.concatenate(tails), 99.9)) if tails else float("nan"), "shared": shared,
        "ranks": W,
    }


def sim_stats(shape: dict[str, int], *, micro_batches: int | None = None, iterations: int = 30, seed: int = 1,
              stretch: bool = True, **sim_kw: Any) -> dict[str, Any]:
    """Statistics of a healthy simulated job of ``shape`` and the stretch of 1.3x GPU faults."""
    w = Workload(micro_batches=micro_batches)
    res = run_simulation(workload=w, iterations=iterations, seed=seed, **shape, **sim_kw)
    W = res.world_size
    out: dict[str, Any] = log_stats({r: rank_arrays_from_sim(res, r) for r in range(W)}, np.ones(iterations, bool))
    out["M"] = res.program.workload.micro_batches
    if stretch:
        out["stretch13"] = min(fault_stretch(shape, s, 1.3, w, iterations, seed, res, **sim_kw)
                               for s in sorted({0, shape.get("pp", 1) // 2, shape.get("pp", 1) - 1}))
    return out


def fault_stretch(shape: dict[str, int], stage: int, factor: float, w: Workload, iterations: int, seed: int,
                  healthy=None, **sim_kw: Any) -> float:
    """Smallest (over rank 0 and the median rank) median stretch of the faulted iterations of a
    persistent ``factor`` x GPU fault on the second rank of pipeline ``stage`` (from iteration n/4)."""
    tp, dp, cp = shape.get("tp", 1), shape.get("dp", 1), shape.get("cp", 1)
    rank = tp * cp * dp * stage + min(1, tp * cp * dp - 1)
    start = iterations // 4
    if healthy is None:
        healthy = run_simulation(workload=w, iterations=iterations, seed=seed, **shape, **sim_kw)
    res = run_simulation(workload=w, iterations=iterations, seed=seed, faults=[f"gpu:{rank}@persistent:{start}*{factor}"],
                         **shape, **sim_kw)
    out = []
    for r in (0, res.world_size // 2):
        out.append(float(np.median(res.iteration_times(r)[start:] / healthy.iteration_times(r)[start:])))
    return min(out)


def real_stats(corpus: Path) -> list[dict[str, Any]]:
    """Log statistics and :func:`run_stats` of the healthy runs of the corpus."""
    from holmes.eval.realrun_stats import run_stats
    from holmes.io import read_job

    man = json.loads((corpus / "MANIFEST.json").read_text())
    rows = []
    for run in man["runs"]:
        if run.get("fault"):
            continue
        p = corpus / run["name"]
        if not (p / "job.json").is_file():
            continue
        job = read_job(p)
        n_it = int(run.get("iterations") or json.loads((p / "realrun.json").read_text())["config"]["iterations"])
        st = log_stats({r: rank_arrays_from_job(job, r) for r in range(job.world_size)}, np.ones(n_it, bool))
        st["name"] = run["name"]
        st["layout"] = run["layout"]
        st["run_stats"] = run_stats(p)
        rows.append(st)
    return rows


def corpus_shapes(corpus: Path) -> list[tuple[str, dict[str, int]]]:
    """The distinct layouts of the corpus as simulator shapes (``tp2-pp2-dp2-ep2`` -> dict)."""
    man = json.loads((corpus / "MANIFEST.json").read_text())
    out = {}
    for run in man["runs"]:
        lay = run["layout"]
        d = {}
        for part in lay.split("-"):
            for k in ("tp", "pp", "dp", "ep", "cp"):
                if part.startswith(k) and part[len(k):].isdigit():
                    d[k] = int(part[len(k):])
        out.setdefault(lay, d)
    return sorted(out.items())


def _fmt(x: float, pct: bool = False) -> str:
    if x is None or not np.isfinite(x):
        return "-"
    return f"{100 * x:.1f}%" if pct else f"{x:.3f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=str(Path(__file__).resolve().parents[1] / "fixtures" / "real"))
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--markdown", action="store_true", help="print the markdown table of docs/simulator-fit.md")
    a = ap.parse_args(argv)
    rows: list[tuple[str, str, dict[str, Any]]] = []
    for shape in DEFAULT_SHAPES:
        name = "x".join(str(shape[k]) for k in ("tp", "pp", "dp"))
        rows.append(("simulated, default", f"tp{shape['tp']}-pp{shape['pp']}-dp{shape['dp']}",
                     sim_stats(shape, iterations=a.iterations, seed=a.seed)))
        print(f"# simulated {name}: done", file=sys.stderr)
    corpus = Path(a.corpus)
    real: list[dict[str, Any]] = []
    if (corpus / "MANIFEST.json").is_file():
        for lay, shape in corpus_shapes(corpus):
            st = sim_stats(shape, micro_batches=4, iterations=a.iterations, seed=a.seed, gpus_per_host=4)
            rows.append(("simulated, corpus shape M=4", lay, st))
        real = real_stats(corpus)
        for st in real:
            rows.append(("real (healthy run)", st["layout"], st))
    else:
        print(f"# no corpus at {corpus}: real runs skipped", file=sys.stderr)
    cols = ("it_ms", "it_cv", "op_cv", "compute", "wait", "gap_tail", "shared", "stretch13")
    if a.markdown:
        print("| job | shape | M | step (ms) | iteration CV | op-duration CV | compute share | wait share | "
              "gap p99.9/median | shared noise | 1.3x GPU stretch |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for kind, lay, st in rows:
            rs = st.get("run_stats")
            comp = _fmt(st["compute"], True) + (f" ({_fmt(rs['compute_share'], True)})" if rs else "")
            wait = _fmt(st["wait"], True) + (f" ({_fmt(rs['wait_share'], True)})" if rs else "")
            print(f"| {kind} | {lay} | {st.get('M', 4)} | {st['it_ms']:.1f} | {_fmt(st['it_cv'], True)} | "
                  f"{_fmt(st['op_cv'])} | {comp} | {wait} | {_fmt(st['gap_tail'])} | {_fmt(st['shared'])} | "
                  f"{_fmt(st.get('stretch13', float('nan')))} |")
        if real:
            med = {c: float(np.nanmedian([r[c] for r in real])) for c in cols[:-1]}
            print(f"| real, median of {len(real)} | | 4 | {med['it_ms']:.1f} | {_fmt(med['it_cv'], True)} | "
                  f"{_fmt(med['op_cv'])} | {_fmt(med['compute'], True)} | {_fmt(med['wait'], True)} | "
                  f"{_fmt(med['gap_tail'])} | {_fmt(med['shared'])} | |")
    else:
        print(f"{'job':28s} {'shape':18s} {'M':>3s} " + " ".join(f"{c:>9s}" for c in cols))
        for kind, lay, st in rows:
            vals = [st.get(c, float("nan")) for c in cols]
            print(f"{kind:28s} {lay:18s} {st.get('M', 4):3d} " + " ".join(f"{v:9.4f}" for v in vals))
        for st in real:
            rs = st["run_stats"]
            print(f"# run_stats {st['name']}: it_cv={rs['it_cv']} op_cv={rs['op_cv']} compute={rs['compute_share']:.3f} "
                  f"wire={rs['wire_share']:.3f} wait={rs['wait_share']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
