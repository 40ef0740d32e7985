"""Run the logger's CUDA path once, on a machine with one GPU, and say what it showed.

Four checks, each in its own processes so that one failing does not hide the others:

``gloo``
    4 ranks on the one GPU, gloo over CUDA tensors, stock ``DistributedDataParallel``; one rank
    keeps the GPU busy (``torch.cuda._sleep``) in its forward every 4th step, so only its *GPU*
    is late: the CPU issues every all-reduce early. Captured with ``holmes.logger`` (healthy job
    first, then the slow one, same processes); rows counted against torch's flight recorder; the
    CUDA-event clock checked against the injected delay; both jobs localized.
``nccl``
    1 rank, NCCL (the only NCCL world one GPU can hold): all-reduces behind a known GPU delay;
    the rows' start must land after the delay, not at the CPU's issue time.
``kineto``
    ``torch.profiler`` traces with CUDA kernels (the gloo job on 2 ranks, the NCCL job on 1)
    through ``holmes convert --from kineto`` and ``holmes localize``; the traces are kept.
``overhead``
    ``benchmarks/logger_overhead.py --setup ddp`` (CPU, gloo), on a quiet machine.

Usage (``--cpu`` runs the same plumbing without a GPU, with ``time.sleep`` for the delay)::

    python scripts/cuda_check.py --out /tmp/cuda-check [--parts gloo,nccl,kineto,overhead] [--cpu]

Writes ``OUT/summary.json`` and prints it; exits 0 even when a check fails (the summary says
which and why).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path

DELAY_S = 0.04  # the injected GPU delay of the slow rank, per slow step
STEPS = 16
EVERY = 4


# ------------------------------------------------------------------------------------------ ranks
def _gpu_delay(cpu: bool, seconds: float, cycles_per_s: float) -> None:
    if cpu:
        time.sleep(seconds)
    else:
        import torch

        torch.cuda._sleep(int(seconds * cycles_per_s))


def _cycles_per_s() -> float:
    import torch

    torch.cuda._sleep(1000)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    torch.cuda._sleep(20_000_000)
    b.record()
    b.synchronize()
    return 20_000_000 / (a.elapsed_time(b) / 1e3)


def _ddp_rank(rank: int, world: int, init_file: str, out: str, cpu: bool, profile: bool) -> None:
    import pickle

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import holmes.logger

    torch.manual_seed(0)
    dev = torch.device("cpu" if cpu else "cuda:0")
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    cps = 0.0 if cpu else _cycles_per_s()
    counts = {}
    for name, slow in (("healthy", None), ("slow", 1)):
        job = os.path.join(out, f"{'kineto-' if profile else ''}{name}")
        logger = None if profile else holmes.logger.CommOpsLogger(job)
        if logger:
            logger.enable()
        t0 = time.time_ns()
        net = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(4)]).to(dev)
        model = DDP(net, device_ids=None if cpu else [0], bucket_cap_mb=1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        gen = torch.Generator().manual_seed(rank)
        delays = []
        prof = None
        if profile:
            acts = [torch.profiler.ProfilerActivity.CPU] + ([] if cpu else [torch.profiler.ProfilerActivity.CUDA])
            prof = torch.profiler.profile(activities=acts, record_shapes=True)
            prof.__enter__()
        for step in range(STEPS):
            if logger:
                logger.step(step)
            with torch.profiler.record_function(f"ProfilerStep#{step}") if profile else _null():
                x = torch.randn(64, 512, generator=gen).to(dev)
                if rank == slow and step % EVERY == EVERY - 1:
                    delays.append((step, time.time_ns()))
                    _gpu_delay(cpu, DELAY_S, cps)
                loss = model(x).square().mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            if not cpu:
                torch.cuda.synchronize()
        t1 = time.time_ns()
        if prof is not None:
            prof.__exit__(None, None, None)
            Path(job).mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(os.path.join(job, f"rank-{rank}.json"))
        if logger:
            logger.close()
        fr = pickle.loads(torch._C._distributed_c10d._dump_fr_trace()) if os.environ.get("TORCH_FR_BUFFER_SIZE") \
            else {}
        n = sum(1 for e in fr.get("entries", []) if t0 <= int(e["time_created_ns"]) < t1)
        counts[name] = {"fr_ops": n, "delays": delays}
        dist.barrier()
    with open(os.path.join(out, f"rank-{rank}.{'kineto' if profile else 'log'}.json"), "w") as f:
        json.dump({"rank": rank, "cycles_per_s": cps, **counts}, f)
    dist.destroy_process_group()


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _nccl_rank(out: str, cpu: bool, profile: bool) -> None:
    import torch
    import torch.distributed as dist

    import holmes.logger

    backend = "gloo" if cpu else "nccl"
    dev = torch.device("cpu" if cpu else "cuda:0")
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group(backend, init_method=f"file://{tmp}/store", rank=0, world_size=1,
                                timeout=timedelta(seconds=60))
        cps = 0.0 if cpu else _cycles_per_s()
        job = os.path.join(out, "kineto-nccl" if profile else "nccl")
        logger = None if profile else holmes.logger.CommOpsLogger(job)
        if logger:
            logger.enable()
        prof = None
        if profile:
            acts = [torch.profiler.ProfilerActivity.CPU] + ([] if cpu else [torch.profiler.ProfilerActivity.CUDA])
            prof = torch.profiler.profile(activities=acts, record_shapes=True)
            prof.__enter__()
        t = torch.ones(1 << 20, device=dev)
        issued = []
        for step in range(8):
            if logger:
                logger.step(step)
            with torch.profiler.record_function(f"ProfilerStep#{step}") if profile else _null():
                delayed = step % 2 == 1
                if delayed:
                    _gpu_delay(cpu, DELAY_S, cps)
                issued.append((step, time.time_ns(), delayed))
                dist.all_reduce(t)
                w = dist.all_reduce(t, async_op=True)
                w.wait()
                y = t * 2  # compute after the collective
                del y
            if not cpu:
                torch.cuda.synchronize()
        if prof is not None:
            prof.__exit__(None, None, None)
            Path(job).mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(os.path.join(job, "rank-0.json"))
        if logger:
            logger.close()
        with open(os.path.join(out, f"nccl.{'kineto' if profile else 'log'}.json"), "w") as f:
            json.dump({"cycles_per_s": cps, "issued": issued}, f)
        dist.destroy_process_group()


def _rank_main(args: argparse.Namespace) -> None:
    if args.role == "ddp":
        import torch.multiprocessing as mp

        with tempfile.TemporaryDirectory() as tmp:
            mp.start_processes(_ddp_entry, nprocs=args.world, args=(args, os.path.join(tmp, "store")),
                               start_method="spawn")
    else:
        _nccl_rank(args.out, args.cpu, args.profile)


def _ddp_entry(rank: int, args: argparse.Namespace, init_file: str) -> None:
    _ddp_rank(rank, args.world, init_file, args.out, args.cpu, args.profile)


# ------------------------------------------------------------------------------------------ checks
def _run(cmd: list[str], timeout: float, env: dict | None = None) -> dict:
    t = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
    return {"rc": p.returncode, "s": round(time.monotonic() - t, 1), "tail": (p.stdout + p.stderr)[-1500:]}


def _localize(job: str) -> dict:
    import holmes

    r = holmes.localize(job).to_json()
    return {"verdict": r["verdict"], "devices": [(d["id"], d["confidence"]) for d in r["devices"][:3]],
            "assumptions": [a for a in r.get("assumptions", []) if "capture" in str(a)][:3]}


def _rows(job: str) -> dict:
    import pyarrow.parquet as pq

    out = {}
    for f in sorted((Path(job) / "ranks").glob("rank-*.parquet")):
        t = pq.read_table(f)
        out[f.name] = t
    return out


def check_gloo(out: Path, cpu: bool) -> dict:
    res = _run([sys.executable, __file__, "--rank-role", "ddp", "--out", str(out), "--world", "4"]
               + (["--cpu"] if cpu else []), 300, {"TORCH_FR_BUFFER_SIZE": "100000", "GLOO_SOCKET_IFNAME": "lo"})
    if res["rc"] != 0:
        return {"ok": False, "run": res}
    meta = [json.loads((out / f"rank-{r}.log.json").read_text()) for r in range(4)]
    found: dict = {"run_s": res["s"], "cycles_per_s": meta[0]["cycles_per_s"]}
    for name in ("healthy", "slow"):
        tabs = _rows(str(out / name))
        rows = {k: v.num_rows for k, v in tabs.items()}
        fr = [m[name]["fr_ops"] for m in meta]
        found[name] = {"rows": rows, "fr_ops": fr, "localize": _localize(str(out / name))}
    # the CUDA-event clock: the slow rank's all-reduces in a delayed step start >= DELAY after the
    # CPU marked the delay; its peers' ends wait for it
    slow = _rows(str(out / "slow"))
    t1 = slow["rank-00001.parquet"].to_pydict()
    delays = meta[1]["slow"]["delays"]
    lag = []
    for step, cpu_ns in delays:
        starts = [s for s, it in zip(t1["start_ns"], t1["iteration"]) if it == step]
        if starts:
            lag.append(round((min(starts) - cpu_ns) / 1e6, 2))
    dur = {}
    for k, t in slow.items():
        d = t.to_pydict()
        dur[k] = {"median_ms": round(sorted(e - s for s, e in zip(d["start_ns"], d["end_ns"]))[len(d["start_ns"]) // 2]
                                     / 1e6, 3), "min_ms": round(min(e - s for s, e in zip(d["start_ns"], d["end_ns"])) / 1e6, 3)}
    found["slow_rank_first_op_lag_ms"] = lag
    found["durations"] = dur
    found["ok"] = (all(v["rows"] == dict(zip(sorted(v["rows"]), v["fr_ops"])) for v in (found["healthy"], found["slow"]))
                   and found["healthy"]["localize"]["verdict"] == "healthy"
                   and bool(found["slow"]["localize"]["devices"])
                   and found["slow"]["localize"]["devices"][0][0] == "gpu:1")
    return found


def check_nccl(out: Path, cpu: bool) -> dict:
    res = _run([sys.executable, __file__, "--rank-role", "nccl", "--out", str(out)] + (["--cpu"] if cpu else []), 180)
    if res["rc"] != 0:
        return {"ok": False, "run": res}
    meta = json.loads((out / "nccl.log.json").read_text())
    d = _rows(str(out / "nccl"))["rank-00000.parquet"].to_pydict()
    per = []
    for step, cpu_ns, delayed in meta["issued"]:
        idx = [i for i, it in enumerate(d["iteration"]) if it == step]
        per.append({"step": step, "delayed": delayed, "rows": len(idx),
                    "start_after_issue_ms": [round((d["start_ns"][i] - cpu_ns) / 1e6, 3) for i in idx],
                    "dur_ms": [round((d["end_ns"][i] - d["start_ns"][i]) / 1e6, 3) for i in idx]})
    late = [p["start_after_issue_ms"][0] for p in per if p["delayed"] and p["start_after_issue_ms"]]
    ontime = [p["start_after_issue_ms"][0] for p in per if not p["delayed"] and p["start_after_issue_ms"]]
    return {"ok": all(p["rows"] == 2 for p in per) and bool(late) and min(late) > DELAY_S * 1e3 * 0.5
            and max(ontime) < DELAY_S * 1e3 * 0.5, "run_s": res["s"], "steps": per,
            "columns": sorted(d), "end_source": sorted(set(map(str, d.get("end_source", []))))}


def check_kineto(out: Path, cpu: bool) -> dict:
    found: dict = {}
    env = {"GLOO_SOCKET_IFNAME": "lo"}
    r1 = _run([sys.executable, __file__, "--rank-role", "ddp", "--profile", "--out", str(out), "--world", "2"]
              + (["--cpu"] if cpu else []), 300, env)
    r2 = _run([sys.executable, __file__, "--rank-role", "nccl", "--profile", "--out", str(out)]
              + (["--cpu"] if cpu else []), 180, env)
    found["capture"] = {"gloo": {k: r1[k] for k in ("rc", "s")}, "nccl": {k: r2[k] for k in ("rc", "s")}}
    if r1["rc"] or r2["rc"]:
        found["capture"]["tail"] = (r1["tail"] if r1["rc"] else "") + (r2["tail"] if r2["rc"] else "")
    ok = not (r1["rc"] or r2["rc"])
    from holmes.adapters import convert

    for name in ("kineto-healthy", "kineto-slow", "kineto-nccl"):
        src = out / name
        if not src.exists():
            continue
        traces = sorted(src.glob("rank-*.json"))
        ev = []
        for t in traces:
            tr = json.loads(t.read_text())
            names = [e.get("name", "") for e in tr.get("traceEvents", [])]
            cats = {}
            for e in tr.get("traceEvents", []):
                cats[e.get("cat", "")] = cats.get(e.get("cat", ""), 0) + 1
            ev.append({"file": t.name, "events": len(names), "cats": cats,
                       "comm_names": sorted({n for n in names if any(k in n.lower() for k in
                                                                      ("nccl", "gloo", "c10d", "allreduce",
                                                                       "all_reduce"))})[:12],
                       "distributedInfo": tr.get("distributedInfo")})
        job = out / f"{name}-job"
        try:
            convert("kineto", src, job)
            loc = _localize(str(job))
            rows = {k: v.num_rows for k, v in _rows(str(job)).items()}
            comp = sorted(p.name for p in (job / "compute").glob("*.parquet")) if (job / "compute").exists() else []
            found[name] = {"traces": ev, "rows": rows, "compute": comp, "localize": loc}
        except Exception as e:  # noqa: BLE001 - reported, the other checks go on
            found[name] = {"traces": ev, "error": f"{type(e).__name__}: {e}"}
            ok = False
    devs = found.get("kineto-slow", {}).get("localize", {}).get("devices") or [[None]]
    found["ok"] = ok and devs[0][0] == "gpu:1"
    return found


def check_overhead(out: Path, cpu: bool) -> dict:
    bench = Path(__file__).resolve().parent.parent / "benchmarks" / "logger_overhead.py"
    res = _run([sys.executable, str(bench), "--setup", "ddp", "--comm-hook"], 300)
    last = [ln for ln in res["tail"].splitlines() if "overhead_pct=" in ln]
    return {"ok": res["rc"] == 0, "last": last[-1] if last else None, "rc": res["rc"], "s": res["s"],
            "tail": res["tail"][-600:] if res["rc"] else ""}


CHECKS = {"gloo": check_gloo, "nccl": check_nccl, "kineto": check_kineto, "overhead": check_overhead}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--parts", default="gloo,nccl,kineto,overhead")
    ap.add_argument("--cpu", action="store_true", help="no GPU: the same plumbing on CPU tensors")
    ap.add_argument("--rank-role", dest="role", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, default=4, help=argparse.SUPPRESS)
    ap.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role:
        _rank_main(args)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary: dict = {"cpu": args.cpu}
    try:
        import torch

        summary["torch"] = torch.__version__
        summary["cuda"] = None if args.cpu else torch.cuda.get_device_name(0)
    except Exception as e:  # noqa: BLE001
        summary["torch"] = f"{type(e).__name__}: {e}"
    for part in args.parts.split(","):
        t = time.monotonic()
        try:
            summary[part] = CHECKS[part](out / part, args.cpu)
        except Exception:  # noqa: BLE001 - one check failing must not hide the others
            summary[part] = {"ok": False, "error": traceback.format_exc()[-1500:]}
        summary[part]["check_s"] = round(time.monotonic() - t, 1)
        (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
        print(part, "ok" if summary[part].get("ok") else "FAILED", summary[part]["check_s"], "s", flush=True)
    print(json.dumps(summary, indent=1, default=str))


if __name__ == "__main__":
    main()
