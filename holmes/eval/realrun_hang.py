"""Real hung runs: the real-run harness's job, stopped by a rank that hangs, dies or deadlocks.

:func:`run_hang_job` starts the same rank processes as :func:`holmes.eval.realrun.run_real_job`
(the Megatron-style step of :mod:`holmes.eval.realrun_worker`: TP collectives, 1F1B pipeline
``send``/``recv``, DP gradient all_reduce) and injects one hang (:class:`HangSpec`) from outside
the step: in each rank process, once the :class:`~holmes.logger.CommOpsLogger` is enabled, the
``torch.distributed`` functions the step calls are wrapped once more, outermost, so the injected
behaviour happens *before* the logger sees the operator (the rank never issued it):

``stop``
    before the ``nth`` call of ``op`` in iteration ``iteration`` the rank stops (sleeps): at a
    ``send``/``recv`` (a P2P operator), a collective (``all_reduce``, ``all_gather``,
    ``reduce_scatter``, ``all_to_all``), or ``op="step"`` at the start of the step (its log ends
    in compute). It dumps its log when the harness sends it ``SIGTERM``, as a job scheduler would.
``exit``
    the same point, but the process dies (``os._exit``): no dump (its log is what it flushed).
``deadlock``
    ``rank`` and ``peer`` (the next pipeline stage) exchange in opposite order: before its first
    ``recv`` from ``rank`` in the iteration, ``peer`` first sends to ``rank`` -- which is itself
    sending to ``peer`` (gloo's ``send`` waits for the matching ``recv``): each waits for the other.

Every other rank blocks where the hang leaves it; its logger's watchdog dumps it (with the
operator in flight) after ``watchdog_s``, before the process group's timeout
(``RealRunConfig.timeout``) ends it. ``job.json`` gets its ``dump`` entry from the dumps
(:func:`holmes.logger.finalize.finalize_job`); ``truth.json`` names the culprit ranks
(``extra.hang``: the spec, ``culprits``, ``deadlock``). This module is evaluation code: neither
:mod:`holmes` nor :mod:`holmes.localize` imports it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from holmes.errors import ConfigError, HolmesError
from holmes.eval.realrun import RealRunConfig, _compact, active_factors
from holmes.topology import kinds

__all__ = ["HangSpec", "run_hang_job", "hang_plan", "hang_split_of", "score_hang", "HANG_OPS", "MODES"]

log = logging.getLogger(__name__)

MODES = ("stop", "exit", "deadlock")
#: the points a rank can stop at: the step's start (compute), a P2P operator, a collective
HANG_OPS = ("step", "send", "recv", "all_reduce", "all_gather", "reduce_scatter", "all_to_all")
_DIST_NAME = {"send": "send", "recv": "recv", "all_reduce": "all_reduce", "all_gather": "all_gather_into_tensor",
              "reduce_scatter": "reduce_scatter_tensor", "all_to_all": "all_to_all_single"}


@dataclass(frozen=True)
class HangSpec:
    """One injected hang (see the module docstring).

    Parameters
    ----------
    mode : {"stop", "exit", "deadlock"}
    rank : int
        The rank that stops or exits; in a deadlock, the lower pipeline stage of the pair.
    iteration : int
        Logged iteration (>= 0) in which it happens.
    op : str, default "step"
        One of :data:`HANG_OPS` (stop, exit): the operator the rank never issues.
    nth : int, default 0
        Which call of ``op`` in the iteration (0 = the first).
    peer : int, optional
        Deadlock: the next pipeline stage of ``rank`` (its pair).
    """

    mode: str
    rank: int
    iteration: int
    op: str = "step"
    nth: int = 0
    peer: int | None = None

    @property
    def culprits(self) -> list[int]:
        """The ranks a right answer names: the hung or dead rank, or the deadlock's pair."""
        return sorted({self.rank, int(self.peer)}) if self.mode == "deadlock" else [self.rank]

    def check(self, cfg: RealRunConfig) -> None:
        """Raise :class:`~holmes.errors.ConfigError` when the spec does not fit ``cfg``."""
        from holmes.topology.layout import ParallelLayout

        W = cfg.tp * cfg.pp * cfg.dp
        if self.mode not in MODES:
            raise ConfigError(f"hang mode {self.mode!r} is not one of {', '.join(MODES)}")
        if not 0 <= self.rank < W:
            raise ConfigError(f"hang rank {self.rank} is outside the job's ranks 0..{W - 1}")
        if not 0 <= self.iteration < cfg.iterations:
            raise ConfigError(f"hang iteration {self.iteration} is outside 0..{cfg.iterations - 1}")
        if self.op not in HANG_OPS:
            raise ConfigError(f"hang op {self.op!r} is not one of {', '.join(HANG_OPS)}")
        if self.mode == "deadlock":
            lay = ParallelLayout(tp=cfg.tp, pp=cfg.pp, dp=cfg.dp, ep=cfg.ep)
            if self.peer is None or lay.pp_next(self.rank) != self.peer:
                raise ConfigError(f"a deadlock needs peer = the next pipeline stage of rank {self.rank} "
                                  f"({lay.pp_next(self.rank)})")


def _inject(spec: dict, rank: int, logger: Any, watchdog_s: float | None) -> None:
    """Wrap the torch.distributed functions (outermost) with the hang of ``spec`` for ``rank``."""
    import torch
    import torch.distributed as dist

    state = {"it": -1, "calls": {}}
    orig_step = logger.step

    def step(iteration: int | None = None) -> int:
        out = orig_step(iteration)
        state["it"], state["calls"] = int(out if iteration is None else iteration), {}
        if spec["op"] == "step" and spec["rank"] == rank and state["it"] == spec["iteration"]:
            _stop(spec)
        return out

    logger.step = step
    orig_dump = logger.dump

    def dump(reason: str = "signal", detail: str | None = None, **kw: Any) -> Any:
        res = orig_dump(reason, detail, **kw)
        if reason == "timeout" and detail and "in flight for more than" in detail:
            os._exit(0)  # the watchdog dumped this blocked rank: leave now (peers see a closed connection)
        return res

    logger.dump = dump
    logger.install_dump_handlers(("SIGTERM",), exceptions=False, timeout=watchdog_s)  # None: no watchdog
    mine = spec["rank"] == rank and spec["mode"] in ("stop", "exit")
    swap = spec["mode"] == "deadlock" and spec["peer"] == rank
    for op, name in _DIST_NAME.items():
        inner = getattr(dist, name)

        def wrapped(*args: Any, _op: str = op, _inner: Any = inner, **kw: Any) -> Any:
            n = state["calls"].get(_op, 0)
            state["calls"][_op] = n + 1
            if state["it"] == spec["iteration"]:
                if mine and _op == spec["op"] and n == spec["nth"]:
                    _stop(spec)
                if swap and _op == "recv" and kw.get("src", args[1] if len(args) > 1 else None) == spec["rank"] \
                        and not state.get("swapped"):
                    state["swapped"] = True
                    t = args[0] if args else kw["tensor"]
                    dist.send(torch.zeros_like(t), dst=spec["rank"], group=kw.get("group"))  # the wrong order
            return _inner(*args, **kw)

        wrapped.__name__ = name
        setattr(dist, name, wrapped)


def _stop(spec: dict) -> None:
    if spec["mode"] == "exit":
        os._exit(17)  # the process dies: no dump, no flush
    while True:  # hangs (until SIGTERM: the logger dumps, then the process ends)
        time.sleep(1.0)


def hang_worker(rank: int, cfg: dict, out: str, init_file: str, topology: Any, factors: np.ndarray,
                spec: dict, watchdog_s: float | None) -> None:
    """A rank of a hung run: :func:`holmes.eval.realrun_worker.worker` with the hang injected when
    its logger is enabled; an error (the process group's timeout, a dead peer) dumps the log."""
    import holmes.logger
    from holmes.eval.realrun_worker import worker

    cls = holmes.logger.CommOpsLogger
    made: list[Any] = []
    orig_enable = cls.enable

    def enable(self: Any) -> Any:
        res = orig_enable(self)
        if not made:
            made.append(self)
            _inject(spec, rank, self, watchdog_s)
        return res

    cls.enable = enable
    try:
        worker(rank, cfg, out, init_file, topology, factors)
    except BaseException as exc:  # noqa: BLE001 - the hang's consequence in this rank: dump and leave
        if made and made[0]._rec is not None and not made[0]._rec.closed:
            made[0].dump("timeout" if "timed out" in str(exc).lower() else "exception", str(exc)[:200])
        sys.stderr.flush()
        os._exit(0)
    os._exit(0)


def run_hang_job(out: str | os.PathLike[str], config: RealRunConfig, hang: HangSpec, *, overwrite: bool = False,
                 watchdog_s: float | None = 4.0) -> Path:
    """Run ``config`` until ``hang`` stops it; write the dumped job directory ``out``.

    ``config.timeout`` is the process group's timeout (make it well above ``watchdog_s``, the
    logger's dump timer, so every rank dumps before an error cascades through it). With
    ``watchdog_s=None`` the ranks dump when the process group's timeout (or a peer's exit) raises
    in them, as a job without the watchdog would -- but gloo's blocking ``send``/``recv`` never time
    out, and a rank blocked inside them (in C++) runs no Python signal handler either: such ranks
    leave no dump (measured: a deadlock run left none at all), so keep the watchdog.

    Returns
    -------
    pathlib.Path
        ``out``: ``job.json`` (with ``dump``), ``ranks/``, ``topology.json``, ``truth.json``,
        ``realrun.json``.

    Raises
    ------
    ConfigError
        A bad configuration or spec, or ``out`` exists without ``overwrite``.
    HolmesError
        The run did not end (no rank dumped).
    """
    import torch.multiprocessing as mp

    cfg, faults, topo = config.validate()
    hang.check(cfg)
    if watchdog_s is not None and not watchdog_s * 2 < float(cfg.timeout):
        raise ConfigError(f"timeout={cfg.timeout} must exceed twice watchdog_s={watchdog_s}")
    outp = Path(out)
    if outp.exists():
        if not overwrite:
            raise ConfigError(f"{outp}: exists; pass overwrite=True (--overwrite) to replace it")
        shutil.rmtree(outp)
    outp.mkdir(parents=True)
    W = cfg.tp * cfg.pp * cfg.dp
    factors = active_factors(faults, cfg.iterations, cfg.seed)
    wcfg = cfg.to_dict()
    wcfg["faults"] = [{"kind": f.kind, "device": f.device, "index": f.index,
                       "pair": list(f.pair) if f.pair else None} for f in faults]
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo" if sys.platform.startswith("linux") else "lo0")
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="holmes-realhang-") as tmp:
        ctx = mp.start_processes(hang_worker, nprocs=W, join=False, start_method=method,
                                 args=(wcfg, str(outp), os.path.join(tmp, "store"), topo, factors, asdict(hang),
                                       None if watchdog_s is None else float(watchdog_s)))
        procs = ctx.processes
        stuck = set(hang.culprits) if hang.mode == "stop" else set()
        deadline = time.monotonic() + float(cfg.timeout) * 2 + 30.0 + 2.0 * W
        try:
            while time.monotonic() < deadline:
                if all(not p.is_alive() for r, p in enumerate(procs) if r not in stuck):
                    break
                time.sleep(0.5)
            # the hung rank, and any rank still blocked at the deadline (gloo's send/recv have no
            # timeout): a scheduler's SIGTERM, and their loggers dump
            for p in procs:
                if p.is_alive():
                    os.kill(p.pid, signal.SIGTERM)
            end = time.monotonic() + 60
            while any(p.is_alive() for p in procs) and time.monotonic() < end:
                time.sleep(0.2)
        finally:
            for p in procs:
                if p.is_alive():
                    os.kill(p.pid, signal.SIGKILL)
                p.join(5)
    wall = time.perf_counter() - t0
    if not (outp / "job.json").is_file():
        raise HolmesError(f"{outp}: the hung run left no job.json (no rank dumped)")
    if "dump" not in json.loads((outp / "job.json").read_text(encoding="utf-8")):
        raise HolmesError(f"{outp}: the run ended without hanging ({hang} never happened: is there an "
                          f"{hang.nth + 1}th {hang.op} in iteration {hang.iteration} on rank {hang.rank}?)")
    _compact(outp)
    topo.save(outp / "topology.json")
    meta = json.loads((outp / "job.json").read_text(encoding="utf-8"))
    meta["gpus_per_host"] = cfg.gpus_per_host
    meta["name"] = f"realhang-{cfg.layout_name}-{hang.mode}-{hang.op}-s{cfg.seed}"
    (outp / "job.json").write_text(json.dumps(meta, indent=1, sort_keys=True), encoding="utf-8")
    truth = {"schema": "holmes.truth/1", "faults": [], "devices": [f"gpu:{r}" for r in hang.culprits],
             "seed": cfg.seed, "extra": {"source": "holmes.eval.realrun_hang", "layout": cfg.layout_name,
                                         "hang": {**asdict(hang), "culprits": hang.culprits,
                                                  "deadlock": hang.mode == "deadlock"}}}
    (outp / "truth.json").write_text(json.dumps(truth, indent=1), encoding="utf-8")
    shutil.rmtree(outp / "realrun-ranks", ignore_errors=True)
    shutil.rmtree(outp / "comms", ignore_errors=True)
    rec = {"schema": "holmes.realrun-hang/1", "config": cfg.to_dict(), "hang": asdict(hang),
           "watchdog_s": watchdog_s, "wall_s": round(wall, 3),
           "exit_codes": [p.exitcode for p in procs]}
    (outp / "realrun.json").write_text(json.dumps(rec), encoding="utf-8")
    log.info("%s: %s hang %s in %.1f s", outp, cfg.layout_name, hang, wall)
    return outp


#: (tp, pp, dp) of the hang corpus: 8-32 ranks, pipelines of 2-4 stages
HANG_LAYOUTS: tuple[tuple[int, int, int], ...] = ((2, 2, 2), (2, 4, 2), (1, 4, 2), (2, 2, 4), (2, 4, 4), (1, 4, 4),
                                                  (2, 3, 2))
#: (mode, op) of the plan's cells: a stop at the step, at each P2P direction and at a collective,
#: a process exit, a deadlock
HANG_CELLS: tuple[tuple[str, str], ...] = (("stop", "step"), ("stop", "send"), ("stop", "recv"),
                                           ("stop", "all_reduce"), ("exit", "recv"), ("exit", "all_reduce"),
                                           ("deadlock", "recv"))


def hang_split_of(seed: int) -> str:
    """``"dev"`` when the run's cell (``seed % 7``) plus its round (``seed // 7``) is even, else
    ``"test"``: the parity flips every round, so every cell has runs in both splits.

    >>> [hang_split_of(s) for s in (0, 1, 7, 8, 6, 13)]
    ['dev', 'test', 'test', 'dev', 'dev', 'test']
    """
    s = int(seed)
    return "dev" if (s % len(HANG_CELLS) + s // len(HANG_CELLS)) % 2 == 0 else "test"


def hang_plan(rounds: int = 2, *, seed0: int = 0, iterations: int = 6) -> list[dict[str, Any]]:
    """The hung runs of the corpus, each ``{"name", "split", "seed", "config", "hang"}``: every
    cell of :data:`HANG_CELLS` ``rounds`` times over :data:`HANG_LAYOUTS`, the hung rank at every
    pipeline stage in turn (drawn within the stage from the seed).

    Examples
    --------
    >>> p = hang_plan(1)
    >>> len(p), p[0]["hang"].mode, p[-1]["hang"].mode
    (7, 'stop', 'deadlock')
    """
    from holmes.topology.layout import ParallelLayout

    plan = []
    for i in range(rounds * len(HANG_CELLS)):
        seed = seed0 + i
        mode, op = HANG_CELLS[i % len(HANG_CELLS)]
        tp, pp, dp = HANG_LAYOUTS[(i * 3 + i // len(HANG_CELLS)) % len(HANG_LAYOUTS)]
        rng = np.random.default_rng([seed, 0x4A46])
        lay = ParallelLayout(tp=tp, pp=pp, dp=dp)
        stage = i % pp if mode != "deadlock" else i % (pp - 1)
        ranks = [r for r in range(tp * pp * dp) if lay.coords(r)["pp"] == stage]
        rank = int(ranks[int(rng.integers(len(ranks)))])
        if op == "send" and stage == pp - 1 or op == "recv" and stage == 0 and mode != "deadlock":
            op = "recv" if op == "send" else "send"  # the last stage sends backward, the first receives
        if op == "all_reduce" and tp == 1 and dp == 1:
            op = "step"
        it = int(rng.integers(1, iterations - 1))
        nth = int(rng.integers(0, 2))
        if op == "step" or op == "all_reduce" and tp == 1:  # one call per step (tp 1: the dp all_reduce only)
            nth = 0
        peer = lay.pp_next(rank) if mode == "deadlock" else None
        cfg = RealRunConfig(tp=tp, pp=pp, dp=dp, iterations=iterations, micro_batches=4, seed=seed, warmup=1,
                            timeout=20.0, layers=1, tokens=64, hidden=64, ffn=256)
        spec = HangSpec(mode, rank, it, "recv" if mode == "deadlock" else op, 0 if mode == "deadlock" else nth, peer)
        spec.check(cfg)
        plan.append({"name": f"h{i:03d}-{mode}-{spec.op}-{cfg.layout_name}-s{stage}", "split": hang_split_of(seed),
                     "seed": seed, "config": cfg, "hang": spec})
    return plan


def score_hang(report: Any, hang: HangSpec) -> dict[str, Any]:
    """How a report did on a hung run: culprit set exact, no waiting rank named, a deadlock called one."""
    h = report.hang or {}
    got = sorted(h.get("culprit_ranks", []))
    named = sorted(kinds.number(d.id) for d in report.devices if kinds.is_kind(d.id, "gpu"))
    want = hang.culprits
    deadlock = h.get("deadlock") is not None
    return {"verdict": report.verdict, "culprits": got, "named": named, "want": want,
            "exact": report.verdict == "hang" and got == want and named == want,
            "waiting_named": sorted(set(named) - set(want)), "deadlock_right": deadlock == (hang.mode == "deadlock")}

