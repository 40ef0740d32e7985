"""Real multi-process PyTorch runs with injected faults: the harness behind ``scripts/real_runs.py``.

:func:`run_real_job` starts one CPU process per rank (gloo, ``torch.set_num_threads(1)``), trains
a small Megatron-style model (TP collectives in every block, 1F1B pipeline ``send``/``recv``, DP
gradient reduction, optional EP ``all_to_all``; see :mod:`holmes.eval.realrun_worker`), captures
it with :class:`holmes.logger.CommOpsLogger` and writes a complete job directory: ``job.json``,
``ranks/``, ``iterations/``, ``topology.json`` (a rail-optimized cluster with
``gpus_per_host`` GPUs per host, so the device ids are the job's own) and ``truth.json``
(:class:`holmes.io.models.TruthModel`), plus ``realrun.json`` (the run's configuration and the
per-rank, per-iteration compute / wire / in-operator seconds the ranks measured).

Faults are written like the simulator's, ``DEVICE@PATTERN[:ITERS]*FACTOR``:

``gpu:<rank>``, ``host:<n>``
    compute slowdown: the matmul work of every micro-batch on the rank(s) times ``FACTOR``.
``nic:<rank>``, ``link:<a>|<b>``, ``switch:<name>``, ``nvswitch:<n>``
    every transfer hop crossing the device (topology path) takes ``FACTOR`` x its wire time;
    for a NIC: the rank's inter-host point-to-point and collective transfers.
``p2p:<a>><b>``
    one direction of a pipeline pair: the point-to-point transfers ``a -> b`` take ``FACTOR`` x
    their wire time. truth.json names the device the transfer leaves by: the sender's NIC cable
    ``link:nic:<a>|switch:...`` between hosts, ``nvswitch:<host>`` inside one; ``extra.faults``
    records the pair and its whole path.

Patterns (iterations drawn with ``numpy.random.default_rng`` from the seed): ``spike`` 1-3
iterations, ``fluctuation`` a random 30-60% of a range of iterations, ``persistent`` every
iteration from a start in ``[n/4, n/2)`` to the end. This module is evaluation code: neither
:mod:`holmes` nor :mod:`holmes.localize` imports it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from holmes.errors import ConfigError, HolmesError
from holmes.simulate.faults import PATTERNS, split_fault_spec
from holmes.topology import kinds

__all__ = ["RealFault", "RealRunConfig", "parse_fault", "active_factors", "build_topology", "run_real_job",
           "truth_of", "DEFAULT_NET", "COMPUTE_KINDS", "NETWORK_KINDS", "PATTERNS"]

log = logging.getLogger(__name__)

COMPUTE_KINDS = ("gpu", "host")
NETWORK_KINDS = ("nic", "link", "switch", "nvswitch", "p2p")
#: Emulated network: NVSwitch and inter-host (NIC path) bandwidth (bytes/s) and latency (s).
DEFAULT_NET = {"intra_bw": 400e6, "inter_bw": 25e6, "intra_lat": 30e-6, "inter_lat": 150e-6}
MAX_FACTOR = 10.0



@dataclass(frozen=True)
class RealFault:
    """One fault injected into a real run.

    Attributes
    ----------
    spec : str
        The text it was parsed from.
    kind : str
        gpu, host, nic, link, switch, nvswitch or p2p.
    device : str
        The device id as written (``p2p:<a>><b>`` for a pair; see :func:`truth_of` for its truth id).
    pattern : str
    factor : float
    iterations : tuple of int or None
        Pinned iterations (persistent with one value: from there to the end).
    """

    spec: str
    kind: str
    device: str
    pattern: str
    factor: float
    iterations: tuple[int, ...] | None = None

    @property
    def is_compute(self) -> bool:
        return self.kind in COMPUTE_KINDS

    @property
    def index(self) -> int | None:
        """The rank (gpu, nic) or host number (host, nvswitch) of the device, else None."""
        if kinds.numbered(self.device) is not None:
            return kinds.number(self.device)
        return None

    @property
    def pair(self) -> tuple[int, int] | None:
        """``(src, dst)`` of a p2p fault."""
        if self.kind != "p2p":
            return None
        a, b = self.device.split(":", 1)[1].split(">")
        return int(a), int(b)

    def __str__(self) -> str:
        it = "" if self.iterations is None else ":" + ",".join(str(i) for i in self.iterations)
        return f"{self.device}@{self.pattern}{it}*{self.factor:g}"


def parse_fault(spec: str) -> RealFault:
    """Parse ``DEVICE@PATTERN[:ITERS]*FACTOR`` (kinds and patterns in the module docstring).

    The syntax is checked here; whether the device exists in a job is checked by
    :meth:`RealRunConfig.validate`.

    Raises
    ------
    ConfigError
        One line naming the spec and what is wrong.

    Examples
    --------
    >>> parse_fault("gpu:5@persistent*1.5").factor
    1.5
    >>> parse_fault("p2p:1>5@spike*3").pair
    (1, 5)
    >>> parse_fault("gpu:5@often*2")
    Traceback (most recent call last):
    ...
    holmes.errors.ConfigError: fault 'gpu:5@often*2': pattern 'often' is not one of spike, fluctuation, persistent
    """
    dev, pat, factor, iters = split_fault_spec(spec, example="gpu:5@persistent*1.5")
    text = spec.strip()
    kind, name = dev.split(":", 1)
    if kind not in COMPUTE_KINDS + NETWORK_KINDS:
        raise ConfigError(f"fault {spec!r}: unknown fault kind {kind!r}; use one of "
                          f"{', '.join(COMPUTE_KINDS + NETWORK_KINDS)}")
    if kind in ("gpu", "nic", "host", "nvswitch") and not name.isdigit():
        raise ConfigError(f"fault {spec!r}: {kind} needs a number, e.g. {kind}:3")
    if kind == "p2p" and not re.fullmatch(r"\d+>\d+", name):
        raise ConfigError(f"fault {spec!r}: a pair is written p2p:<src>><dst>, e.g. p2p:1>5")
    if not 1.0 < factor <= MAX_FACTOR:
        raise ConfigError(f"fault {spec!r}: factor must be > 1 and <= {MAX_FACTOR:g}")
    return RealFault(text, kind, dev, pat, factor, iters)


def active_factors(faults: list[RealFault], iterations: int, seed: int) -> np.ndarray:
    """Factor of every fault in every iteration, shape ``(len(faults), iterations)``; 1.0 = inactive.

    Examples
    --------
    >>> f = active_factors([parse_fault("gpu:1@persistent:30*2")], 35, seed=0)
    >>> f[0, 29].item(), f[0, 30].item(), f[0, 34].item()
    (1.0, 2.0, 2.0)
    """
    out = np.ones((len(faults), iterations))
    for i, f in enumerate(faults):
        rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, 0x5EA1, i])
        active = np.zeros(iterations, bool)
        if f.iterations is not None:
            if f.pattern == "persistent" and len(f.iterations) == 1:
                active[f.iterations[0]:] = True
            else:
                active[[x for x in f.iterations if 0 <= x < iterations]] = True
        elif f.pattern == "spike":
            k = int(rng.integers(1, 4))
            lo = min(3, iterations - 1)
            active[rng.choice(np.arange(lo, iterations), size=min(k, iterations - lo), replace=False)] = True
        elif f.pattern == "fluctuation":
            a = int(rng.integers(iterations // 8, iterations // 3 + 1))
            b = int(rng.integers(max(a + iterations // 3, 2 * iterations // 3), iterations + 1))
            p = rng.uniform(0.3, 0.6)
            seg = rng.random(b - a) < p
            if not seg.any():
                seg[rng.integers(0, b - a)] = True
            active[a:b] = seg
        else:
            active[int(rng.integers(iterations // 4, max(iterations // 2, iterations // 4 + 1))):] = True
        out[i, active] = f.factor
    return out


def build_topology(world_size: int, gpus_per_host: int) -> Any:
    """The run's cluster: :func:`holmes.topology.rail_optimized` with two spines, one pod."""
    from holmes.topology import rail_optimized

    return rail_optimized(world_size, gpus_per_host=gpus_per_host, hosts_per_pod=max(1, world_size // gpus_per_host),
                          num_spines=2, name=f"realrun-{world_size}x{gpus_per_host}")


@dataclass(frozen=True)
class RealRunConfig:
    """Everything that defines one real run.

    Parameters
    ----------
    tp, pp, dp, ep : int
        Parallel degrees; ``world_size = tp * pp * dp`` (ep divides ``tp * dp``).
    gpus_per_host : int, default 4
        Ranks per virtual host (topology and NVSwitch vs NIC wire times).
    iterations : int, default 35
        Logged iterations (after ``warmup`` unlogged ones).
    micro_batches : int, default 4
    seed : int, default 0
        Data, weights and fault activation.
    faults : tuple of str
        Fault specs (:func:`parse_fault`); empty for a healthy run.
    sequence_parallel : bool, default False
        TP with all_gather + reduce_scatter instead of all_reduce.
    distributed_optimizer : bool, default False
        DP with reduce_scatter + all_gather instead of all_reduce.
    tokens, hidden, ffn, layers : int
        Micro-batch tokens, model width, MLP width (split over tp), blocks per stage.
    device_flops : float, default 5e9
        Emulated device rate: every matmul lasts at least ``flops / device_flops`` seconds (times
        the compute fault's factor); 0 runs the matmuls at CPU speed only.
    net : dict
        Emulated network (:data:`DEFAULT_NET`).
    fault_side : {"wire", "sender"}, default "wire"
        How a network fault shows: ``"wire"`` lengthens the emulated transfer inside the logged
        operator on every side; ``"sender"`` keeps the transfer's healthy wire time and delays the
        sender *before* it enters the operator (a slow link as it looks from the sending side: its
        data leaves late, the receiver and the other members wait).
    warmup : int, default 2
    timeout : float, default 120
        Seconds before a stuck collective or the whole run is abandoned.
    world_size : int, optional
        When given it must equal ``tp * pp * dp`` (with ``dp=0``: dp is derived from it).
    """

    tp: int = 2
    pp: int = 2
    dp: int = 2
    ep: int = 1
    gpus_per_host: int = 4
    iterations: int = 35
    micro_batches: int = 4
    seed: int = 0
    faults: tuple[str, ...] = ()
    sequence_parallel: bool = False
    distributed_optimizer: bool = False
    tokens: int = 128
    hidden: int = 128
    ffn: int = 1024
    layers: int = 1
    device_flops: float = 5e9
    net: dict = field(default_factory=lambda: dict(DEFAULT_NET))
    fault_side: str = "wire"
    warmup: int = 2
    timeout: float = 120.0
    world_size: int | None = None

    def validate(self) -> tuple["RealRunConfig", list[RealFault], Any]:
        """Check the configuration; returns ``(config with dp resolved, parsed faults, topology)``.

        Raises
        ------
        ConfigError
            A bad degree, a world size the layout does not divide, an unknown fault kind or
            device, a bad factor.
        """
        from holmes.errors import LayoutError, TopologyError
        from holmes.topology.layout import ParallelLayout

        for name in ("tp", "pp", "ep", "gpus_per_host", "iterations", "micro_batches", "tokens", "hidden",
                     "ffn", "layers"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ConfigError(f"{name}={v!r} must be an integer >= 1")
        cfg = self
        if self.world_size is not None:
            W = self.world_size
            if isinstance(W, bool) or not isinstance(W, (int, np.integer)) or W < 1:
                raise ConfigError(f"world_size={W!r} must be an integer >= 1")
            if W % (self.tp * self.pp):
                raise ConfigError(f"world size {W} is not divisible by tp*pp = {self.tp * self.pp}")
            if self.dp in (0, None):
                cfg = replace(cfg, dp=W // (self.tp * self.pp))
            elif self.tp * self.pp * self.dp != W:
                raise ConfigError(f"world size {W} != tp*pp*dp = {self.tp * self.pp * self.dp}")
        if isinstance(cfg.dp, bool) or not isinstance(cfg.dp, (int, np.integer)) or cfg.dp < 1:
            raise ConfigError(f"dp={cfg.dp!r} must be an integer >= 1")
        W = cfg.tp * cfg.pp * cfg.dp
        if W < 2:
            raise ConfigError("a real run needs at least 2 ranks")
        if W % cfg.gpus_per_host:
            raise ConfigError(f"world size {W} (tp*pp*dp) is not divisible by gpus_per_host={cfg.gpus_per_host}")
        if W // cfg.gpus_per_host < 2:
            log.warning("world size %d on one host of %d GPUs: no inter-host transfers", W, cfg.gpus_per_host)
        try:
            layout = ParallelLayout(tp=cfg.tp, pp=cfg.pp, dp=cfg.dp, ep=cfg.ep)
        except LayoutError as exc:
            raise ConfigError(str(exc)) from None
        if cfg.sequence_parallel and cfg.tokens % cfg.tp:
            raise ConfigError(f"tokens={cfg.tokens} is not divisible by tp={cfg.tp} (sequence parallel)")
        held = cfg.tokens // cfg.tp if cfg.sequence_parallel else cfg.tokens
        if cfg.ep > 1 and held % cfg.ep:
            raise ConfigError(f"tokens per rank {held} is not divisible by ep={cfg.ep}")
        if cfg.ffn % cfg.tp:
            raise ConfigError(f"ffn={cfg.ffn} is not divisible by tp={cfg.tp}")
        if not np.isfinite(float(cfg.device_flops)) or float(cfg.device_flops) < 0:
            raise ConfigError(f"device_flops={cfg.device_flops!r} must be >= 0")
        if cfg.fault_side not in ("wire", "sender"):
            raise ConfigError(f"fault_side={cfg.fault_side!r} must be 'wire' or 'sender'")
        if cfg.iterations < 4:
            raise ConfigError(f"iterations={cfg.iterations} must be >= 4")
        missing = {"intra_bw", "inter_bw", "intra_lat", "inter_lat"} - set(cfg.net)
        if missing or any(not float(v) > 0 for k, v in cfg.net.items() if k.endswith("bw")):
            raise ConfigError(f"net={cfg.net!r} needs positive intra_bw, inter_bw and intra_lat, inter_lat")
        topo = build_topology(W, cfg.gpus_per_host)
        faults = [parse_fault(s) for s in cfg.faults]
        seen: set[str] = set()
        for f in faults:
            if f.device in seen:
                raise ConfigError(f"fault {f.spec!r}: device {f.device} already has a fault")
            seen.add(f.device)
            if f.kind in ("gpu", "nic") and not 0 <= f.index < W:
                raise ConfigError(f"fault {f.spec!r}: unknown device {f.device} (the job has ranks 0..{W - 1})")
            if f.kind in ("host", "nvswitch") and not 0 <= f.index < W // cfg.gpus_per_host:
                raise ConfigError(f"fault {f.spec!r}: unknown device {f.device} "
                                  f"(the job has hosts 0..{W // cfg.gpus_per_host - 1})")
            if f.kind in ("link", "switch"):
                try:
                    topo.kind_of(f.device)
                except TopologyError:
                    raise ConfigError(f"fault {f.spec!r}: unknown device {f.device} in topology {topo.name!r}") from None
            if f.kind == "p2p":
                a, b = f.pair
                if not (0 <= a < W and 0 <= b < W) or b not in (layout.pp_next(a), layout.pp_prev(a)):
                    raise ConfigError(f"fault {f.spec!r}: ranks {a} and {b} are not adjacent pipeline stages of "
                                      f"this layout (no point-to-point transfer {a}->{b})")
            if f.kind in ("nic", "link", "switch", "p2p") and W // cfg.gpus_per_host < 2:
                raise ConfigError(f"fault {f.spec!r}: a one-host job has no inter-host transfer")
        return cfg, faults, topo

    @property
    def layout_name(self) -> str:
        """``tp2-pp2-dp2`` (+ ``-ep2``, ``-sp``, ``-do``)."""
        s = f"tp{self.tp}-pp{self.pp}-dp{self.dp}"
        if self.ep > 1:
            s += f"-ep{self.ep}"
        if self.sequence_parallel:
            s += "-sp"
        if self.distributed_optimizer:
            s += "-do"
        if self.fault_side != "wire":
            s += f"-{self.fault_side}"
        return s

    def to_dict(self) -> dict:
        d = asdict(self)
        d["faults"] = list(self.faults)
        return d


def truth_device(fault: RealFault, topology: Any) -> str:
    """The device id truth.json names for ``fault`` (a p2p pair: the link its data leaves by)."""
    if fault.kind != "p2p":
        return fault.device
    a, b = fault.pair
    path = topology.path(a, b)
    return path[1] if len(path) > 1 else path[0]


def truth_of(cfg: RealRunConfig, faults: list[RealFault], factors: np.ndarray, topology: Any) -> Any:
    """The :class:`~holmes.io.models.TruthModel` of a run."""
    from holmes.io.models import TruthModel

    fs, extra = [], []
    for f, fac in zip(faults, factors):
        dev = truth_device(f, topology)
        fs.append({"device": dev, "pattern": f.pattern, "factor": f.factor,
                   "iterations": np.flatnonzero(fac != 1.0).tolist()})
        e: dict[str, Any] = {"spec": str(f), "kind": f.kind, "device": dev,
                             "cause": "compute" if f.is_compute else "network"}
        if f.kind == "p2p":
            e["pair"] = list(f.pair)
            e["path"] = list(topology.path(*f.pair))
        if f.kind == "host":
            g = topology.gpus_per_host
            e["gpus"] = [f"gpu:{r}" for r in range(f.index * g, (f.index + 1) * g)]
        extra.append(e)
    return TruthModel.model_validate({
        "schema": "holmes.truth/1", "faults": fs, "devices": sorted({x["device"] for x in fs}),
        "seed": cfg.seed,
        "extra": {"source": "holmes.eval.realrun", "layout": cfg.layout_name, "faults": extra,
                  "specs": [str(f) for f in faults]}})


_DELTA = {c: "DELTA_BINARY_PACKED" for c in ("iteration", "op_index", "seq", "start_ns", "end_ns")}


def _compact(out: Path) -> None:
    """Rewrite the rank and iteration files with zstd and delta encodings (same tables, ~3x smaller)."""
    import pyarrow.parquet as pq

    for sub, enc in (("ranks", _DELTA), ("iterations", None)):
        for p in sorted((out / sub).glob("rank-*.parquet")):
            t = pq.read_table(p)
            tmp = p.with_name(f".{p.name}.partial")
            kw: dict[str, Any] = {"compression": "zstd", "write_statistics": False}
            if enc:
                kw.update(use_dictionary=["comm_id", "op"], column_encoding=enc)
            pq.write_table(t, tmp, **kw)
            os.replace(tmp, p)


def _launch(cfg: RealRunConfig, faults: list[RealFault], topo: Any, factors: np.ndarray, out: Path) -> None:
    import torch.multiprocessing as mp

    from holmes.eval.realrun_worker import worker

    W = cfg.tp * cfg.pp * cfg.dp
    wcfg = cfg.to_dict()
    wcfg["faults"] = [{"kind": f.kind, "device": f.device, "index": f.index,
                       "pair": list(f.pair) if f.pair else None} for f in faults]
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo" if sys.platform.startswith("linux") else "lo0")
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    with tempfile.TemporaryDirectory(prefix="holmes-realrun-") as tmp:
        ctx = mp.start_processes(worker, nprocs=W, join=False, start_method=method,
                                 args=(wcfg, str(out), os.path.join(tmp, "store"), topo, factors))
        deadline = time.monotonic() + float(cfg.timeout) + 10.0 * W
        try:
            while not ctx.join(timeout=1.0):
                if time.monotonic() > deadline:
                    raise HolmesError(f"{out}: real run did not finish in time; ranks stopped")
        except Exception:
            for p in ctx.processes:
                if p.is_alive():
                    os.kill(p.pid, signal.SIGKILL)
            raise


def _loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:  # pragma: no cover - not on this platform
        return None


def run_real_job(out: str | os.PathLike[str], config: RealRunConfig, *, overwrite: bool = False) -> Path:
    """Run ``config`` as real processes and write the job directory ``out``.

    Parameters
    ----------
    out : path-like
        Job directory to create; must not exist unless ``overwrite``.
    config : RealRunConfig
    overwrite : bool, default False

    Returns
    -------
    pathlib.Path
        ``out``.

    Raises
    ------
    ConfigError
        Bad configuration (checked before any process starts) or ``out`` exists.
    HolmesError
        A rank failed or the run timed out.
    """
    cfg, faults, topo = config.validate()
    outp = Path(out)
    if outp.exists():
        from holmes.io.outputs import check_output

        check_output(outp, overwrite=overwrite, kind="job")  # only a job Holmes wrote is replaced
        shutil.rmtree(outp)
    outp.mkdir(parents=True)
    factors = active_factors(faults, cfg.iterations, cfg.seed)
    load0 = _loadavg()
    t0 = time.perf_counter()
    try:
        _launch(cfg, faults, topo, factors, outp)
    except HolmesError:
        raise
    except Exception as exc:  # a rank raised: torch's ProcessRaisedException carries its traceback
        raise HolmesError(f"{outp}: a rank failed: {str(exc).strip().splitlines()[-1] if str(exc).strip() else exc!r}") from exc
    wall = time.perf_counter() - t0
    _compact(outp)
    topo.save(outp / "topology.json")
    truth = truth_of(cfg, faults, factors, topo)
    (outp / "truth.json").write_text(json.dumps(truth.model_dump(by_alias=True, mode="json"), indent=1),
                                     encoding="utf-8")
    meta = json.loads((outp / "job.json").read_text(encoding="utf-8"))
    meta["gpus_per_host"] = cfg.gpus_per_host
    meta["name"] = f"realrun-{cfg.layout_name}-s{cfg.seed}"
    (outp / "job.json").write_text(json.dumps(meta, indent=1, sort_keys=True), encoding="utf-8")
    side = outp / "realrun-ranks"
    ranks = []
    for r in range(cfg.tp * cfg.pp * cfg.dp):
        ranks.append(json.loads((side / f"rank-{r:05d}.json").read_text(encoding="utf-8")))
    shutil.rmtree(side)
    shutil.rmtree(outp / "comms", ignore_errors=True)
    rec = {"schema": "holmes.realrun/1", "config": cfg.to_dict(), "wall_s": round(wall, 3),
           "loadavg_1min": [load0, _loadavg()], "cpus": os.cpu_count(),
           "factors": factors.tolist(), "ranks": ranks}
    (outp / "realrun.json").write_text(json.dumps(rec), encoding="utf-8")
    log.info("%s: %s, %d ranks x %d iterations in %.1f s", outp, cfg.layout_name, cfg.tp * cfg.pp * cfg.dp,
             cfg.iterations, wall)
    return outp
