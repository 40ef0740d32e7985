"""Localization accuracy of Holmes on real multi-process PyTorch runs (``fixtures/real``).

The corpus comes from ``python scripts/real_runs.py corpus --out fixtures/real`` (see
docs/real-runs.md): 8-16 gloo ranks, 4 per virtual host, with an injected compute (gpu, host) or
network (nic, one direction of a pipeline pair) fault, or none. Runs are split by seed into
``dev`` and ``test`` (``MANIFEST.json``).

Scoring (one fault per run):

* compute fault (``gpu:<r>``, ``host:<n>``): a hit when the truth device is ranked first;
* network fault: a hit when the faulty device is among the top 2. ``nic:<r>``: ``nic:<r>`` or its
  own cable ``link:nic:<r>|...`` (no traffic tells them apart). A pair fault ``p2p:a>b`` (truth:
  the sender's cable): any device of the pair's path (its NICs, cables, switches), as only that
  one transfer direction is slow and no log separates the devices it crosses;
* healthy run: counted when the report names any device.

Prints one row per run (run, truth, top devices, verdict when the report has one, hit) and, as the
last line, ``real_compute_top1=<%> real_network_top2=<%> healthy_named_pct=<%>
sim_realistic_top1=<%> persistent_top1=<%> network_always_top2=<%> always_healthy_named_pct=<%>``
(the last three over ``fixtures/real-always``, faults active in every iteration, same split, same
scoring; ``python scripts/real_runs.py corpus --plan always --out fixtures/real-always``), the
``sim_realistic_top1`` figure from ``benchmarks/localize_accuracy.py --realistic
--split test --jobs 18`` (everyday-strength simulated faults at 2,048 GPUs, run in a subprocess
with the same ``--param`` values; its jobs are cached, ~4 GB, the first run builds them in ~10 min
on 2 cores, later runs take ~5 min; ``--no-sim`` skips it and prints ``nan``).

Usage::

    python benchmarks/real_accuracy.py                 # test split
    python benchmarks/real_accuracy.py --split dev
    python benchmarks/real_accuracy.py --detector reconstruct   # the label-free detector
    python benchmarks/real_accuracy.py --split dev --no-sim --param tail_calibration=1e9
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from holmes.eval.calibration_data import indistinguishable

REPO = Path(__file__).resolve().parents[1]


def _pct(hits: list[bool]) -> str:
    return f"{100.0 * sum(hits) / len(hits):.1f}" if hits else "nan"


def score(truth: dict, ids: list[str], job_dir: Path | None = None) -> tuple[str, bool | None]:
    """``(category, hit)`` of one run; category compute, network or healthy. A switch, link or
    NVSwitch fault is also hit by a device no log can tell apart from it (:func:`indistinguishable`,
    when ``job_dir`` is given: in a two-host job a leaf switch carries exactly its two NICs' cables'
    transfers)."""
    faults = truth.get("faults") or []
    if not faults:
        return "healthy", bool(ids)
    extra = {e.get("device"): e for e in (truth.get("extra") or {}).get("faults", [])}
    f = faults[0]
    dev = f["device"]
    kind = (extra.get(dev) or {}).get("kind") or dev.split(":", 1)[0]
    if kind in ("gpu", "host"):
        return "compute", bool(ids) and ids[0] == dev
    top2 = ids[:2]
    if kind == "nic":
        ok = {dev} | {i for i in top2 if i.startswith(f"link:{dev}|") or i.endswith(f"|{dev}")}
        return "network", any(i in ok for i in top2)
    if kind == "p2p":
        path = set((extra.get(dev) or {}).get("path") or [dev])
        return "network", any(i in path for i in top2)
    ok = indistinguishable(job_dir, dev) if job_dir is not None else {dev}
    return "network", any(i in ok for i in top2)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=str(REPO / "fixtures" / "real"))
    ap.add_argument("--always-root", default=str(REPO / "fixtures" / "real-always"),
                    help="the always-on corpus (faults active in every iteration; '' skips it)")
    ap.add_argument("--split", choices=("test", "dev", "all"), default="test")
    ap.add_argument("--top", type=int, default=5, help="devices asked of localize (table shows 3)")
    ap.add_argument("--detector", default=None,
                    help="detector for localize (default: localize's own; auto, robust, reconstruct, a model path)")
    ap.add_argument("--no-sim", action="store_true", help="skip the simulated --realistic figure")
    ap.add_argument("--sim-jobs", type=int, default=18,
                    help="faulted jobs of the simulated figure (default 18: every kind x pattern once, and 4 healthy)")
    ap.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                    help="a localize parameter (holmes.LocalizeParams), repeatable: --param cell_noise=0.1")
    ap.add_argument("--smoke", action="store_true",
                    help="CI: the first 2 runs of each corpus, errors raised, and the simulated figure from "
                         "localize_accuracy.py --realistic --smoke")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    import holmes

    root = Path(a.root)
    try:
        runs = json.loads((root / "MANIFEST.json").read_text())["runs"]
    except (OSError, ValueError, KeyError) as exc:
        print(f"real_accuracy: {root}/MANIFEST.json unreadable ({exc}); generate the corpus with "
              f"python scripts/real_runs.py corpus --out {root}", file=sys.stderr)
        return 2
    if any("hang" in r and "fault" not in r for r in runs):
        print(f"real_accuracy: {root} is a corpus of hung runs; score it with python benchmarks/hang_real.py",
              file=sys.stderr)
        return 2
    runs = [dict(r, root=root) for r in runs if a.split == "all" or r["split"] == a.split][:2 if a.smoke else None]
    always = Path(a.always_root) if a.always_root else None
    if always is not None and (always / "MANIFEST.json").is_file():
        runs += [dict(r, root=always, always=True) for r in json.loads((always / "MANIFEST.json").read_text())["runs"]
                 if a.split == "all" or r["split"] == a.split][:2 if a.smoke else None]
    from localize_accuracy import _params  # the same NAME=VALUE parsing as the simulated benchmark

    extra: dict[str, object] = _params(a.param)
    if a.detector:
        extra["detector"] = a.detector
    res: dict[str, list[bool]] = {"compute": [], "network": [], "healthy": []}
    res_always: dict[str, list[bool]] = {"compute": [], "network": [], "healthy": []}
    by_kind: dict[str, list[bool]] = {}
    print(f"{'run':44s} {'truth':34s} {'top devices':60s} {'verdict':12s} hit")
    t0 = time.perf_counter()
    for r in runs:
        d = r["root"] / r["name"]
        truth = json.loads((d / "truth.json").read_text())
        try:
            rep = holmes.localize(str(d), top_k=a.top, **extra)
            js = rep.to_json()
            ids = [x["id"] for x in js.get("devices", [])]
            verdict = js.get("verdict") or "-"
        except Exception as exc:  # noqa: BLE001 - a benchmark reports failures and goes on
            if a.smoke:  # ... but a smoke fails CI
                raise
            ids, verdict = [], f"error:{type(exc).__name__}"
        cat, hit = score(truth, ids, d)
        (res_always if r.get("always") else res)[cat].append(bool(hit))
        kind = "healthy" if not r["fault"] else r["fault"].split(":", 1)[0]
        kind = ("always-" if r.get("always") else "") + kind
        by_kind.setdefault(kind, []).append(bool(hit))
        tdesc = r["fault"] or "healthy"
        if truth.get("devices"):
            tdesc = f"{truth['devices'][0]} ({r['fault'].split('@', 1)[1]})" if r["fault"] else tdesc
        print(f"{r['name']:44s} {tdesc[:34]:34s} {', '.join(ids[:3])[:60]:60s} {verdict:12s} "
              f"{'yes' if hit else 'no'}")
    print(f"# {len(runs)} runs of split {a.split} in {time.perf_counter() - t0:.1f} s; per kind (hit %): " +
          " ".join(f"{k}={_pct(v)}(n={len(v)})" for k, v in sorted(by_kind.items())))
    sim = "nan" if a.no_sim else _sim_realistic(a)
    print(f"real_compute_top1={_pct(res['compute'])} real_network_top2={_pct(res['network'])} "
          f"healthy_named_pct={_pct(res['healthy'])} sim_realistic_top1={sim} "
          f"persistent_top1={_pct(res_always['compute'])} network_always_top2={_pct(res_always['network'])} "
          f"always_healthy_named_pct={_pct(res_always['healthy'])}")
    return 0


def _sim_realistic(a: argparse.Namespace) -> str:
    """``realistic_top1`` of ``localize_accuracy.py --realistic --split test`` (its table goes to
    stderr here, so stdout keeps one row per real run and the summary)."""
    import subprocess

    cmd = [sys.executable, str(REPO / "benchmarks" / "localize_accuracy.py"), "--realistic", "--split", "test"]
    if a.smoke:
        cmd += ["--smoke"]
    elif a.sim_jobs:
        cmd += ["--jobs", str(a.sim_jobs)]
    for kv in a.param:
        cmd += ["--param", kv]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if a.smoke and proc.returncode != 0:
        sys.stderr.write(proc.stderr[-3000:])
        raise SystemExit(f"real_accuracy: {' '.join(cmd[1:])} exited {proc.returncode}")
    sys.stderr.write(proc.stdout)
    for line in proc.stdout.splitlines()[::-1]:
        if line.startswith("realistic_top1="):
            return line.split()[0].split("=", 1)[1]
    sys.stderr.write(proc.stderr[-2000:])
    return "nan"


if __name__ == "__main__":
    raise SystemExit(main())
