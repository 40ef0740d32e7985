"""Fit the thresholds and the confidence calibration shipped in holmes/calibration/ (development splits only).

Steps:

0. **Thresholds** (:func:`fit_thresholds`): the thresholds of :data:`THRESHOLD_GRID`, one after
   the other, each over its grid, the others at their current values: every development job of
   the fixture corpora and the simulated ones of 64-512 GPUs localized on both paths under each
   setting (cached in ``fixtures/calibration/thresholds-dev.parquet``; ``--rebuild-thresholds``
   localizes them again, ~25 min on 2 cores), scored by step 2's objective under the shipped
   segmentation re-fitted out of fold on that setting's evidence. A value moves only when its
   gain beats :data:`MOVE_SE` paired standard errors. Written into ``thresholds.json`` with the
   record of the fit (``fitted``); when a value moved, step 1 localizes again.
1. **Dataset** (:mod:`holmes.eval.calibration_data`): every development job of every corpus
   (``fixtures/real``, ``real-loaded``, ``real-always``, ``real-hang``, and realistic simulated
   jobs of 64-512 and 2,048 GPUs simulated into ``$HOLMES_CACHE_DIR/calibration``) localized on both paths
   (default; Algorithm 1 forced with ``full_read=0``) with raw evidence scores, one row per device
   of each report, labelled root cause or not. Cached as ``fixtures/calibration/evidence-dev.parquet``
   (``--rebuild`` builds it again: ~20 min on 2 cores, most of it simulating and localizing the
   2,048-GPU jobs).
2. **Fit** (scikit-learn's ``IsotonicRegression``): for each segmentation of a small grid (the
   device's place in the list: 1-3 buckets; whole-job comparison and Algorithm 1 apart or not;
   per analysis, per kind of device, jobs beyond 128 ranks apart or not;
   hang devices always apart, :func:`holmes.calibration.confidence.segment_of`), one isotonic
   map of the evidence logit per segment, scored out of fold (5 folds over jobs, both paths of a
   job in one fold, dealt by a seeded permutation). The objective is the pipeline's decision
   replayed on every job and path (:func:`holmes.eval.calibration_data.job_outcomes`): right
   answers minus ``--wrong-cost`` (10) per wrong device named first at ``min_confidence`` (0.9),
   among the models whose out-of-fold calibration error is within ``--max-ece`` (0.05);
   ties go to more right answers, then to the lower calibration error, then to the simpler
   segmentation. The chosen one is refitted on
   all rows. A logistic regression over every feature (then isotonic) is scored beside it for
   comparison.
3. **Write** the calibration (plain numbers, no pickle) with what it was fitted on in ``meta``.

Deterministic: the same dataset gives the same file byte for byte; ``--check`` exits 1 when the
file would change (and writes nothing). Usage::

    python scripts/tune.py                  # fit from the cached datasets, write the files
    python scripts/tune.py --check          # are the shipped files what the datasets give?
    python scripts/tune.py --rebuild        # localize the dev jobs again first (after changing an analysis)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from holmes.calibration.confidence import DEFAULT_PATH, FEATURES, ConfidenceCalibration, segment_of  # noqa: E402
from holmes.calibration.thresholds import DEFAULT_PATH as THRESHOLDS_PATH  # noqa: E402
from holmes.eval.calibration_data import build_dataset, job_outcomes, load_or_build, suspicions  # noqa: E402

DATASET = REPO / "fixtures" / "calibration" / "evidence-dev.parquet"
#: step 0's dataset: the development jobs' evidence under each threshold setting tried
THRESHOLDS_DATASET = REPO / "fixtures" / "calibration" / "thresholds-dev.parquet"
#: step 0 moves a threshold only when the gain exceeds this many standard errors (paired over the
#: jobs: a single job flipping never does, five concordant ones do)
MOVE_SE = 2.0
#: the thresholds step 0 fits, in this order, each over a grid holding the value it had when the
#: grid was written; every other threshold is kept as the file says (docs/thresholds.md)
THRESHOLD_GRID = {
    "stretch_z": (4.0, 5.0, 6.0, 8.0),       # Algorithm 1: how far out of the job's noise a sub-delta iteration is searched
    "compute_z": (2.0, 3.0, 4.0),            # Algorithm 1: how much longer a compute cause's rank must have computed
    "cell_cost_z": (2.0, 2.5, 3.0, 4.0),     # whole job: the cost a cell needs on a quiet job, in step sigmas
    "cell_event_p": (0.1, 0.3, 1.0),         # whole job: the significance a cell needs to make an event
    "cause_share": (0.2, 0.3, 0.5),          # Algorithm 1: the share of an iteration's excess a cause must explain
    "persistent_min_effect": (0.05, 0.08, 0.12),  # persistent: how much more work a straggler does than its peers
    "noise_z": (2.0, 3.0, 4.0, 6.0),         # how far out of the job's noise an irregular iteration must stand to count
    "own_z": (3.0, 4.0, 5.0),                # a candidate iteration's cause: how far out of its own rank's noise
    "noise_mad_floor": (False, True),        # Algorithm 1: iterations weighed in MAD sigmas too
}
#: the isotonic blocks' smoothing tried (pseudo-rows at the segment's mean rate; 0: none)
SMOOTH = (0.0, 1.0, 2.0, 4.0)
#: the segmentations tried: (rank_buckets, by_path, by_analysis, smooth, by_kind, by_scale)
GRID = tuple((rb, bp, ba, sm, bk, bs) for bs in (False, True) for bk in (False, True) for sm in SMOOTH
             for ba in (False, True) for bp in (False, True) for rb in (1, 2, 3))
#: the regularization of the logistic family
C_GRID = (0.01, 0.03, 0.1, 0.3, 1.0)
FOLDS = 5
#: a segment with fewer development rows uses the map of all rows
MIN_ROWS = 10
#: the calibration error a model may have out of fold (issue #36's target for the test splits)
MAX_ECE = 0.05


def sim_cache() -> Path:
    """Where the simulated jobs are kept (``$HOLMES_CACHE_DIR``, else ``~/.cache/holmes``)."""
    env = os.environ.get("HOLMES_CACHE_DIR")
    return (Path(env).expanduser() if env else Path.home() / ".cache" / "holmes") / "calibration"


def design(table):
    """``(X, y, groups, keep, one)`` of the rows naming a device: ``y`` whether the row's
    suspicion (its alike group) is a root cause, ``one`` the first row of each suspicion (the
    rows fitted and scored: :func:`holmes.eval.calibration_data.suspicions`)."""
    dev = table.column("device").to_pylist()
    keep = np.array([d is not None for d in dev])
    X = np.column_stack([np.asarray(table.column(f).to_pylist(), dtype=np.float64) for f in FEATURES])[keep]
    first, label = suspicions(table)
    y, one = label[keep].astype(np.int64), first[keep]
    jobs = [f"{c}/{j}" for c, j, k in zip(table.column("corpus").to_pylist(), table.column("job").to_pylist(), keep) if k]
    _, groups = np.unique(np.asarray(jobs), return_inverse=True)
    return X, y, groups, keep, one


def _fold_ids(groups: np.ndarray, folds: int) -> np.ndarray:
    """Fold of each row: the jobs (groups) dealt round-robin in a seeded order."""
    uniq, inv = np.unique(groups, return_inverse=True)
    perm = np.random.default_rng(36).permutation(len(uniq))
    fold_of = np.empty(len(uniq), dtype=np.int64)
    fold_of[perm] = np.arange(len(uniq)) % folds
    return fold_of[inv]


def _logistic(X: np.ndarray, y: np.ndarray, C: float) -> dict:
    """A logistic regression over the standardized features, as plain numbers."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    sc = StandardScaler().fit(X)
    scale = np.where(sc.scale_ > 0, sc.scale_, 1.0)
    lr = LogisticRegression(C=C, max_iter=5000).fit((X - sc.mean_) / scale, y)
    return {"mean": tuple(map(float, sc.mean_)), "scale": tuple(map(float, scale)),
            "coef": tuple(map(float, lr.coef_[0])), "intercept": float(lr.intercept_[0])}


def fit_logistic(X: np.ndarray, y: np.ndarray, groups: np.ndarray, C: float, meta=None) -> ConfidenceCalibration:
    """The logistic regression over every feature, then one isotonic map of its logit fitted on
    its out-of-fold logits (3 folds over jobs): calibrated on data it was not fitted on."""
    inner = _fold_ids(groups, 3)
    z = np.zeros(len(y))
    for f in range(3):
        tr, te = inner != f, inner == f
        z[te] = ConfidenceCalibration(features=FEATURES, segments={"all": ((0.0,), (0.5,))},
                                      logistic=_logistic(X[tr], y[tr], C)).score(X[te])
    return ConfidenceCalibration(features=FEATURES, segments={"all": _isotonic(z, y)}, rank_buckets=1,
                                 by_path=False, logistic=_logistic(X, y, C), meta=meta or {})


def _isotonic(x: np.ndarray, y: np.ndarray, smooth: float = 0.0) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The isotonic map of ``y`` on ``x`` as points. ``smooth`` > 0: each block's rate is pulled
    towards the segment's mean rate by ``smooth`` pseudo-rows, ``(k + smooth * mean) / (n + smooth)``
    (a block of 3 rows with no root cause says 0 only by chance), then made non-decreasing again."""
    from sklearn.isotonic import IsotonicRegression

    iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(x, y)
    xt, yt = np.asarray(iso.X_thresholds_, dtype=float), np.asarray(iso.y_thresholds_, dtype=float)
    if smooth > 0 and len(y):
        fitted = iso.predict(x)
        mean = float(np.mean(y))
        rate = {}
        for v in np.unique(yt):
            m = np.isclose(fitted, v, rtol=0.0, atol=1e-12)
            n, k = int(m.sum()), float(np.asarray(y, dtype=float)[m].sum())
            rate[float(v)] = (k + smooth * mean) / (n + smooth) if n else float(v)
        yt = np.maximum.accumulate(np.array([rate[float(v)] for v in yt]))
    return tuple(map(float, xt)), tuple(map(float, yt))


def fit_segments(X: np.ndarray, y: np.ndarray, rank_buckets: int, by_path: bool, by_analysis: bool = False,
                 smooth: float = 0.0, meta=None, by_kind: bool = False, by_scale: bool = False) -> ConfidenceCalibration:
    """One isotonic map of the evidence logit per segment with at least ``MIN_ROWS`` rows, and ``all``."""
    ev = X[:, FEATURES.index("logit_evidence")]
    has = X[:, FEATURES.index("has_evidence")] > 0
    segs = np.asarray(segment_of(X, rank_buckets=rank_buckets, by_path=by_path, by_analysis=by_analysis,
                                 by_kind=by_kind, by_scale=by_scale))
    out = {"all": _isotonic(ev[has], y[has], smooth)}
    for sname in sorted(set(segs.tolist())):
        m = (segs == sname) & has
        if m.sum() >= MIN_ROWS:
            out[sname] = _isotonic(ev[m], y[m], smooth)
    return ConfidenceCalibration(features=FEATURES, segments=out, rank_buckets=rank_buckets, by_path=by_path,
                                 by_analysis=by_analysis, by_kind=by_kind, by_scale=by_scale, meta=meta or {})


def ece(p: np.ndarray, y: np.ndarray, bins: int = 10) -> float:
    """Expected calibration error: the count-weighted mean |observed - mean p| over equal-width bins."""
    edges = np.linspace(0, 1, bins + 1)
    b = np.clip(np.digitize(p, edges[1:-1]), 0, bins - 1)
    return float(sum(abs(y[b == k].mean() - p[b == k].mean()) * (b == k).sum() for k in range(bins) if (b == k).any())
                 / max(len(p), 1))


def _outcomes(table, keep, q, min_conf: float) -> list[dict]:
    """:func:`~holmes.eval.calibration_data.job_outcomes` under ``q``, the probabilities of the
    rows naming a device (``keep``)."""
    proba = np.full(len(keep), np.nan)
    proba[keep] = q
    return job_outcomes(table, proba, min_conf)


def utility(table, keep, q, wrong_cost: float, min_conf: float) -> tuple[float, int, int, int]:
    """``(right - wrong_cost x wrong_confident, right, wrong_confident, jobs)`` over jobs x paths."""
    out = _outcomes(table, keep, q, min_conf)
    right = sum(o["right"] for o in out)
    wrong = sum(o["wrong_confident"] for o in out)
    return right - wrong_cost * wrong, right, wrong, len(out)


def _reports(table, keep) -> list[np.ndarray]:
    """Row indices (among the rows naming a device) of each report, in the analyses' order."""
    keys = [k for k, kk in zip(zip(table.column("corpus").to_pylist(), table.column("job").to_pylist(),
                                   table.column("path").to_pylist()), keep) if kk]
    idx: dict[tuple, list[int]] = {}
    for i, k in enumerate(keys):
        idx.setdefault(k, []).append(i)
    return [np.asarray(v) for v in idx.values()]


def _oof(X, y, groups, folds_of, reports, predictor, one):
    """Out-of-fold probabilities, one report at a time (no device above the one before it), of
    ``predictor(X_train, y_train, groups_train) -> (X -> p)`` trained on one row per suspicion."""
    q = np.zeros(len(y))
    for f in np.unique(folds_of):
        tr = (folds_of != f) & one
        pred = predictor(X[tr], y[tr], groups[tr])
        for rows in reports:
            if folds_of[rows[0]] == f:
                q[rows] = np.minimum.accumulate(pred(X[rows]))
    return q


def _predictor(spec: tuple):
    """``(X_train, y_train, groups_train) -> (X -> p)`` of a grid entry."""
    if spec[0] == "segments":
        return lambda Xt, yt, gt: fit_segments(Xt, yt, spec[1], spec[2], spec[3], spec[4], by_kind=spec[5],
                                               by_scale=spec[6]).predict_proba
    return lambda Xt, yt, gt: fit_logistic(Xt, yt, gt, spec[1]).predict_proba


def job_utilities(table, spec: tuple, *, wrong_cost: float, min_conf: float = 0.9) -> dict:
    """``(corpus, job, path) -> 1 right / 0 / -wrong_cost`` under the grid entry ``spec`` fitted out
    of fold (:func:`fit`'s objective, job by job)."""
    X, y, groups, keep, one = design(table)
    q = _oof(X, y, groups, _fold_ids(groups, FOLDS), _reports(table, keep), _predictor(spec), one)
    return {(o["corpus"], o["job"], o["path"]): float(o["right"]) - wrong_cost * float(o["wrong_confident"])
            for o in _outcomes(table, keep, q, min_conf)}


def spec_of(cal: ConfidenceCalibration) -> tuple:
    """The grid entry (as :func:`fit` names them) a calibration file was fitted as."""
    m = re.search(r"smooth=([0-9.]+)", cal.meta.get("model", ""))
    if cal.logistic is not None:
        return ("logistic", float(re.search(r"C=([0-9.e-]+)", cal.meta.get("model", "C=1")).group(1)))
    return ("segments", cal.rank_buckets, cal.by_path, cal.by_analysis, float(m.group(1)) if m else 0.0,
            cal.by_kind, cal.by_scale)


def fit(table, *, wrong_cost: float = 10.0, min_conf: float = 0.9, family: str = "segments",
        max_ece: float = MAX_ECE, log=print, only: tuple | None = None) -> ConfidenceCalibration:
    """The calibration the dataset gives (see the module docstring); ``only``: that grid entry
    alone (:func:`spec_of`), scored and fitted."""
    X, y, groups, keep, one = design(table)
    folds_of = _fold_ids(groups, FOLDS)
    reports = _reports(table, keep)
    raw = utility(table, keep, np.asarray(table.column("raw_confidence").to_pylist(), dtype=float)[keep],
                  wrong_cost, min_conf)
    log(f"# {len(y)} device rows, {int(one.sum())} suspicions ({int(y[one].sum())} root causes) of {raw[3]} "
        f"jobs x paths; raw evidence scores: "
        f"right={raw[1]} wrong_confident={raw[2]} utility={raw[0]:g}")
    log(f"{'model':36} {'utility':>8} {'right':>6} {'wrong_conf':>10} {'ece_cv':>7}")
    best = None
    cands = [(f"isotonic rank_buckets={rb} by_path={bp}" + (" by_analysis=True" if ba else "")
              + (f" smooth={sm:g}" if sm else "") + (" by_kind=True" if bk else "") + (" by_scale=True" if bs else ""),
              ("segments", rb, bp, ba, sm, bk, bs))
             for rb, bp, ba, sm, bk, bs in GRID]
    cands += [(f"logistic+isotonic C={C:g}", ("logistic", C)) for C in C_GRID]
    for name, spec in cands:
        if (family != "all" and spec[0] != family and only is None) or (only is not None and spec != only):
            continue
        q = _oof(X, y, groups, folds_of, reports, _predictor(spec), one)
        u, right, wrong, _ = utility(table, keep, q, wrong_cost, min_conf)
        e = ece(q[one], y[one])
        log(f"{name:36} {u:8g} {right:6d} {wrong:10d} {e:7.4f}")
        # a model whose cross-validated ECE misses the target is chosen only when none meets it
        if best is None or (e <= max_ece, u, right, -round(e, 6)) > (best[5] <= max_ece, best[0], best[3], -round(best[5], 6)):
            best = (u, spec, name, right, wrong, e)
    u, spec, name, right, wrong, e = best
    meta = {"fitted_by": "scripts/tune.py", "dataset": "fixtures/calibration/evidence-dev.parquet (split dev)",
            "rows": int(len(y)), "suspicions": int(one.sum()), "root_causes": int(y[one].sum()),
            "jobs_x_paths": int(raw[3]),
            "corpora": sorted(set(table.column("corpus").to_pylist())), "folds": FOLDS,
            "wrong_cost": wrong_cost, "min_confidence": min_conf, "max_ece": max_ece,
            "cv": {"utility": u, "right": right, "wrong_confident": wrong, "ece": round(e, 6)},
            "raw": {"utility": raw[0], "right": raw[1], "wrong_confident": raw[2]}}
    meta["model"] = name
    log(f"# chosen {name}: cross-validated right={right} wrong_confident={wrong} ece={e:.4f}")
    if spec[0] == "segments":
        return fit_segments(X[one], y[one], spec[1], spec[2], spec[3], spec[4], meta, by_kind=spec[5],
                            by_scale=spec[6])
    return fit_logistic(X[one], y[one], groups[one], spec[1], meta)


def setting_key(values: dict) -> str:
    """The canonical text of a threshold setting (its fitted names only)."""
    return json.dumps({k: v if isinstance(v, bool) else float(v) for k, v in sorted(values.items())}, sort_keys=True)


def threshold_jobs():
    """Step 0's jobs: every development job of the fixture corpora and the simulated ones of
    64-512 GPUs (the 2,048-GPU tier is left out: it would take ~15 min per setting)."""
    from holmes.eval.calibration_data import corpus_jobs, sim_jobs

    return corpus_jobs("dev") + sim_jobs("dev", sim_cache(), n_huge=0)


def _write_parquet(table, path: Path) -> None:
    """``table`` to ``path`` through a ``.partial`` file (a run stopped midway leaves the old one)."""
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    pq.write_table(table, tmp)
    tmp.replace(path)


def fit_thresholds(path: Path, *, current: dict, spec: tuple, wrong_cost: float, build: bool,
                   workers: int = 2, progress=None, log=print):
    """Step 0: coordinate search over :data:`THRESHOLD_GRID`, in its order, the others at their
    current values. A setting's score is the calibration step's own objective for the
    segmentation ``spec`` (the shipped file's, :func:`spec_of`): cross-validated right answers
    minus ``wrong_cost`` per wrong device named first, under maps fitted out of fold on that
    setting's evidence (the confidence is re-fitted for every setting, as it will be for the
    chosen one). A value replaces the current one only when it scores higher and its gain, summed
    over the jobs, exceeds :data:`MOVE_SE` standard errors of that sum, paired job by job (one job
    flipping, or a gain the jobs do not agree on, is noise, not a reason to move a threshold; the
    gain of one flipped job is just under one standard error's worth of the rest). Evidence is read from
    ``path`` (one table per setting, a ``setting`` column); a setting not there is localized when
    ``build``, else ``None`` is returned (stale).

    Returns ``(chosen, record, jobs_x_paths)``: the fitted values and what each grid scored."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    have = pq.read_table(path) if path.is_file() else None
    known = set() if have is None else set(have.column("setting").to_pylist())
    jobs = None
    chosen = {k: current[k] if isinstance(current[k], bool) else float(current[k]) for k in THRESHOLD_GRID}
    record = {}
    n = 0
    visited: set[str] = set()
    for name, grid in THRESHOLD_GRID.items():
        scores, per = [], []
        for v in grid:
            key = setting_key({**chosen, name: v})
            visited.add(key)
            if key not in known:
                if not build:
                    log(f"# thresholds: {key} not in {path.name}: run with --rebuild-thresholds")
                    return None, None, 0
                jobs = jobs if jobs is not None else threshold_jobs()
                t = build_dataset(jobs, workers=workers, progress=progress, thresholds=json.loads(key))
                t = t.append_column("setting", pa.array([key] * t.num_rows, pa.string()))
                have = t if have is None else pa.concat_tables([have, t])
                _write_parquet(have, path)
                known.add(key)
            mask = pc.equal(have.column("setting"), key)
            per.append(job_utilities(have.filter(mask).drop_columns(["setting"]), spec, wrong_cost=wrong_cost))
            u = per[-1]
            scores.append((sum(u.values()), sum(v > 0 for v in u.values()), sum(v < 0 for v in u.values())))
            log(f"threshold {name}={v}: utility={scores[-1][0]:g} right={scores[-1][1]} "
                f"wrong_confident={scores[-1][2]}")
        # a value replaces the current one only when its gain over it, summed over the jobs, exceeds
        # MOVE_SE standard errors of that sum (paired, job by job)
        cur = grid.index(chosen[name]) if chosen[name] in grid else None
        def gain(i: int) -> tuple[float, float]:
            if cur is None:
                return scores[i][0], 0.0
            d = np.asarray([per[i].get(k, 0.0) - per[cur].get(k, 0.0) for k in set(per[i]) | set(per[cur])])
            return float(d.sum()), float(np.sqrt(len(d) * d.var())) if len(d) else 0.0
        best = cur if cur is not None else 0
        for i in range(len(grid)):
            g, se = gain(i)
            if g > MOVE_SE * se and (scores[i][0], scores[i][1]) > (scores[best][0], scores[best][1]):
                best = i
        n = len(per[best])
        record[name] = {"grid": list(grid), "utility": [s[0] for s in scores], "right": [s[1] for s in scores],
                        "wrong_confident": [s[2] for s in scores],
                        "gain_se": [[round(x, 3) for x in gain(i)] for i in range(len(grid))], "chosen": grid[best]}
        chosen[name] = grid[best] if isinstance(grid[best], bool) else float(grid[best])
        log(f"# threshold {name}: chosen {grid[best]}")
    if build and have is not None and set(known) - visited:  # keep the settings this search reads, no others
        _write_parquet(have.filter(pc.is_in(have.column("setting"), value_set=pa.array(sorted(visited)))), path)
    return chosen, record, n


def thresholds_text(path: Path, chosen: dict, record: dict, jobs_x_paths: int, wrong_cost: float,
                    scored_with: str) -> str:
    """The thresholds file ``path`` with the fitted values and the record of the fit."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    for k, v in chosen.items():
        old = doc["thresholds"][k]
        doc["thresholds"][k] = bool(v) if isinstance(old, bool) else type(old)(v)
    doc["fitted"] = {"by": "scripts/tune.py", "dataset": "fixtures/calibration/thresholds-dev.parquet (split dev)",
                     "jobs_x_paths": jobs_x_paths, "wrong_cost": wrong_cost,
                     "objective": "cross-validated right answers minus wrong_cost per wrong device named first, "
                                  "under the calibration each setting's evidence gives",
                     "move_se": MOVE_SE,
                     "calibration": scored_with,
                     "thresholds": record}
    return json.dumps(doc, indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default=str(DATASET), help="the cached development dataset (parquet)")
    ap.add_argument("--out", default=str(DEFAULT_PATH), help="the calibration file to write")
    ap.add_argument("--rebuild", action="store_true", help="localize the development jobs again first")
    ap.add_argument("--check", action="store_true", help="exit 1 when the file would change; write nothing")
    ap.add_argument("--wrong-cost", type=float, default=10.0,
                    help="cost of a wrong device named first, in right answers (default 10)")
    ap.add_argument("--max-ece", type=float, default=MAX_ECE,
                    help="a model whose cross-validated calibration error exceeds this is chosen only when none "
                         f"meets it (default {MAX_ECE})")
    ap.add_argument("--family", choices=("segments", "logistic", "all"), default="segments",
                    help="model family to choose from (default segments: isotonic maps of the evidence score "
                         "per segment; docs/calibration.md says why)")
    ap.add_argument("--sim-small", type=int, default=24, help="simulated 64-128 GPU jobs (with --rebuild)")
    ap.add_argument("--sim-large", type=int, default=24, help="simulated 256-512 GPU jobs (with --rebuild)")
    ap.add_argument("--sim-huge", type=int, default=24, help="simulated 2,048-GPU jobs (with --rebuild)")
    ap.add_argument("--thresholds-dataset", default=str(THRESHOLDS_DATASET),
                    help="step 0's cached dataset (parquet; one table per threshold setting)")
    ap.add_argument("--thresholds-out", default=str(THRESHOLDS_PATH), help="the thresholds file to write")
    ap.add_argument("--rebuild-thresholds", action="store_true",
                    help="localize the development jobs under every threshold setting again (~30 min)")
    ap.add_argument("--workers", type=int, default=2, help="processes localizing jobs (default 2)")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    def progress(s: str) -> None:
        print(f"# {time.perf_counter() - t0:7.1f} s {s}", file=sys.stderr, flush=True)

    # step 0: the thresholds
    tpath, tdata = Path(a.thresholds_out), Path(a.thresholds_dataset)
    current = json.loads(tpath.read_text(encoding="utf-8"))["thresholds"]
    if a.rebuild_thresholds and not a.check and tdata.is_file():
        tdata.unlink()
    shipped = ConfidenceCalibration.load(a.out) if Path(a.out).is_file() else ConfidenceCalibration.load()
    chosen, record, n = fit_thresholds(tdata, current=current, spec=spec_of(shipped), wrong_cost=a.wrong_cost,
                                       build=not a.check, workers=a.workers, progress=progress)
    if chosen is None:
        print(f"check=stale file={tpath}")
        return 1
    ttext = thresholds_text(tpath, chosen, record, n, a.wrong_cost, shipped.meta.get("model", "?"))
    tsame = tpath.read_text(encoding="utf-8") == ttext
    moved = sorted(k for k in chosen if current[k] != chosen[k])
    if not a.check and not tsame:
        tmp = tpath.with_name(tpath.name + ".partial")
        tmp.write_text(ttext, encoding="utf-8")
        tmp.replace(tpath)  # read again by the localizations below (the reader keys on the file's mtime)
    if moved and not a.check and not a.rebuild:
        print(f"# thresholds {', '.join(moved)} moved: the calibration's dataset is localized again", file=sys.stderr)
        a.rebuild = True

    table = load_or_build("dev", Path(a.dataset), sim_cache=sim_cache(), n_small=a.sim_small, n_large=a.sim_large,
                          n_huge=a.sim_huge, rebuild=a.rebuild, progress=progress, workers=a.workers)
    splits = set(table.column("split").to_pylist())
    if splits != {"dev"}:
        print(f"tune: {a.dataset} holds split(s) {sorted(splits)}: fit on dev only", file=sys.stderr)
        return 2
    cal = fit(table, wrong_cost=a.wrong_cost, family=a.family, max_ece=a.max_ece)
    text = cal.dumps()
    out = Path(a.out)
    same = out.is_file() and out.read_text(encoding="utf-8") == text
    if a.check:
        ok = same and tsame
        print(f"check={'same' if ok else 'changed'} file={out} thresholds={'same' if tsame else 'changed'}")
        return 0 if ok else 1
    if not same:
        tmp = out.with_name(out.name + ".partial")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(out)
    if spec_of(cal) != spec_of(shipped):  # step 0 scored the segmentation that was shipped when it ran
        print("# the calibration's segmentation changed: run tune.py again so that step 0 scores the new one",
              file=sys.stderr)
    print(f"thresholds={tpath} changed={int(not tsame)} moved={','.join(moved) or '-'}")
    print(f"wrote={out} changed={int(not same)} model={cal.meta['model'].replace(' ', '_')} "
          f"cv_right={cal.meta['cv']['right']} cv_wrong_confident={cal.meta['cv']['wrong_confident']} "
          f"cv_ece={cal.meta['cv']['ece']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
