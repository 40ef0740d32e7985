"""Baseline localizers for the benchmarks (§5.1.2 of the paper).

* :class:`RandomWalkLocalizer` ("RW", after MicroRank [59]): ranks devices by a personalized
  PageRank on a device graph built from abnormal operators: each abnormal operator links its
  GPU to the network devices its transfer crosses; the walk restarts in proportion to each
  GPU's share of abnormal operators. It sees where waiting concentrates, not who made others wait.
* :class:`SeerLikeLocalizer` (after Seer [16]): a learned localizer, an sklearn classifier over
  per-rank features of the logs (abnormal shares and duration excesses by operator class),
  trained on labelled jobs to say which rank's GPU or NIC is at fault.

Both read ``max_ranks`` ranks (default: all), unlike Holmes's progressive search.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import numpy as np

from holmes.detect.simple import resolve_detector
from holmes.errors import NotFittedError
from holmes.localize.evidence.ranking import network_devices
from holmes.localize.evidence.sources import open_source

__all__ = ["RandomWalkLocalizer", "SeerLikeLocalizer", "rank_features"]

log = logging.getLogger(__name__)


def _ranks_to_read(world: int, max_ranks: int | None, pivot: int, seed: int) -> list[int]:
    if max_ranks is None or max_ranks >= world:
        return list(range(world))
    rng = np.random.default_rng(seed)
    pick = rng.choice(world, size=max_ranks, replace=False).tolist()
    return sorted(set(pick) | {pivot})


class RandomWalkLocalizer:
    """Random-walk ("RW") device ranking over the operator graph.

    Parameters
    ----------
    detector : str or object, default "robust"
    max_ranks : int, optional
        Read a random sample of this many ranks (plus the pivot) instead of all.
    damping : float, default 0.85
    seed : int, default 0

    Examples
    --------
    >>> RandomWalkLocalizer(max_ranks=16).rank("fixtures/gpu64-3d-slow-gpu")[:1]   # doctest: +SKIP
    [('nic:5', 0.07)]
    """

    def __init__(self, detector: Any = "robust", max_ranks: int | None = None, damping: float = 0.85,
                 seed: int = 0) -> None:
        self.detector = detector
        self.max_ranks = max_ranks
        self.damping = damping
        self.seed = seed

    def rank(self, job: Any, pivot: int = 0) -> list[tuple[str, float]]:
        """(device, score) best first."""
        import networkx as nx

        src = open_source(job)
        topo = src.topology
        if topo is None:
            from holmes.topology import default_topology

            topo = default_topology(src.world_size)
        det = resolve_detector(self.detector)
        comms = src.communicators
        g = nx.Graph()
        restart: dict[str, float] = {}
        for r in _ranks_to_read(src.world_size, self.max_ranks, pivot, self.seed):
            t = src.fetch(r)
            if t is None or t.num_rows == 0:
                continue
            ab = np.asarray(det.predict_ops(t), dtype=bool)
            gpu = f"gpu:{r}"
            g.add_node(gpu)
            restart[gpu] = float(ab.mean())
            if not ab.any():
                continue
            cid = np.asarray(t.column("comm_id").to_pylist(), dtype=object)[ab]
            peer = t.column("peer").fill_null(-1).to_numpy()[ab]
            keys, counts = np.unique(np.array([f"{c}|{p}" for c, p in zip(cid, peer)]), return_counts=True)
            for key, n in zip(keys.tolist(), counts.tolist()):
                c, p = key.rsplit("|", 1)
                ranks = (r, int(p)) if int(p) >= 0 else (comms[c].ranks if c in comms else (r,))
                for d in network_devices(ranks, topo) or [gpu]:
                    w = g.get_edge_data(gpu, d, {"weight": 0.0})["weight"] + n
                    g.add_edge(gpu, d, weight=w)
        if g.number_of_nodes() == 0:
            return []
        total = sum(restart.values())
        pers = {n: (restart.get(n, 0.0) / total if total > 0 else 1.0) for n in g.nodes}
        if total <= 0:
            pers = None
        pr = nx.pagerank(g, alpha=self.damping, personalization=pers, weight="weight")
        return sorted(pr.items(), key=lambda kv: (-kv[1], kv[0]))


def rank_features(table: Any, detector: Any) -> np.ndarray:
    """Per-rank features: for collectives and P2P separately, the abnormal share, the mean and max
    duration relative to the position median, and the mean compute-gap excess; plus the share of
    abnormal operators overall (11 numbers)."""
    n = table.num_rows
    if n == 0:
        return np.zeros(11)
    ab = np.asarray(detector.predict_ops(table), dtype=bool)
    start = table.column("start_ns").to_numpy().astype(float)
    end = table.column("end_ns").to_numpy().astype(float)
    d = end - start
    gap = np.empty(n)
    gap[0] = 0.0
    gap[1:] = np.maximum(start[1:] - end[:-1], 0.0)
    idx = table.column("op_index").to_numpy()
    p2p = np.isin(np.asarray(table.column("op").to_pylist(), dtype=object), ["send", "recv"])
    med = np.zeros(n)
    gmed = np.zeros(n)
    for k in np.unique(idx):
        m = idx == k
        med[m] = np.median(d[m]) + 1.0
        gmed[m] = np.median(gap[m]) + 1.0
    rel = d / med
    grel = gap / gmed
    out = []
    for sel in (~p2p, p2p):
        if sel.any():
            out += [ab[sel].mean(), rel[sel].mean(), rel[sel].max(), grel[sel].mean(), grel[sel].max()]
        else:
            out += [0.0] * 5
    out.append(ab.mean())
    return np.asarray(out, dtype=float)


class SeerLikeLocalizer:
    """A learned localizer over per-rank features (sklearn), after Seer.

    ``fit(jobs)`` learns, from labelled jobs (``truth.json``), which ranks carry the faulty device
    and whether it is the GPU (compute) or the NIC (network) side; ``rank(job)`` scores every rank
    read and names ``gpu:<r>`` or ``nic:<r>`` for the best one. Switch, link and host faults are
    outside what it can name, as for the original.

    Parameters
    ----------
    detector : str or object, default "robust"
    max_ranks : int, optional
    model : {"tree", "mlp"}, default "tree"
    random_state : int, default 0
    """

    def __init__(self, detector: Any = "robust", max_ranks: int | None = None, model: str = "tree",
                 random_state: int = 0) -> None:
        self.detector = detector
        self.max_ranks = max_ranks
        self.model = model
        self.random_state = random_state

    def _features(self, job: Any, pivot: int = 0) -> tuple[list[int], np.ndarray, Any]:
        src = open_source(job)
        det = resolve_detector(self.detector)
        ranks, rows = [], []
        for r in _ranks_to_read(src.world_size, self.max_ranks, pivot, self.random_state):
            t = src.fetch(r)
            if t is None:
                continue
            ranks.append(r)
            rows.append(rank_features(t, det))
        X = np.vstack(rows) if rows else np.zeros((0, 11))
        # relative to the job: subtract the per-job median so scales transfer across jobs
        if len(X):
            X = np.hstack([X, X - np.median(X, axis=0)])
        return ranks, X, src

    def fit(self, jobs: Iterable[Any]) -> "SeerLikeLocalizer":
        from sklearn.ensemble import RandomForestClassifier
        from sklearn.neural_network import MLPClassifier

        Xs, ys = [], []
        for job in jobs:
            ranks, X, src = self._features(job)
            truth = getattr(src.job, "truth", None)
            bad = set(truth.devices) if truth is not None else set()
            y = np.array([2 if f"nic:{r}" in bad else 1 if f"gpu:{r}" in bad else 0 for r in ranks])
            Xs.append(X)
            ys.append(y)
        X, y = np.vstack(Xs), np.concatenate(ys)
        if self.model == "mlp":
            clf = MLPClassifier(hidden_layer_sizes=(32, 16), max_iter=500, random_state=self.random_state)
        else:
            clf = RandomForestClassifier(n_estimators=100, class_weight="balanced", random_state=self.random_state)
        self.model_ = clf.fit(X, y)
        return self

    def rank(self, job: Any, pivot: int = 0) -> list[tuple[str, float]]:
        if not hasattr(self, "model_"):
            raise NotFittedError("SeerLikeLocalizer is not fitted; call fit(jobs) first")
        ranks, X, _ = self._features(job, pivot)
        if not ranks:
            return []
        proba = self.model_.predict_proba(X)
        classes = list(self.model_.classes_)
        out = []
        for kind, label in (("gpu", 1), ("nic", 2)):
            if label in classes:
                p = proba[:, classes.index(label)]
                out += [(f"{kind}:{r}", float(s)) for r, s in zip(ranks, p)]
        return sorted(out, key=lambda kv: (-kv[1], kv[0]))

