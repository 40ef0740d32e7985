"""The slowness of every rank in every iteration: the data and the figure of the report's heatmap.

A rank's **compute** in an iteration is the sum of its gaps between consecutive communication
ops (the time it spent working, not waiting in a collective or a transfer; overlapping ops count
no gap). In lock-step training every rank's *iteration* lasts the same, but the straggler's
compute grows while the others' waits grow; so the heatmap shows a rank's compute over the
median compute of its **peers** in the same iteration (the ranks of its pipeline stage, which
run the same layers; all ranks read when the layout is unknown). 1 is as its peers, 1.5 is half
as long again.

Rows are ranks ordered by parallel group (pipeline stage, then data-parallel replica, then
context and tensor position); columns are iterations. Reading is bounded: at most ``max_ranks``
ranks' logs are read (the ranks the report points at first, then evenly spread ones), and above
``max_rows`` rows consecutive rows are merged into one showing their maximum.

Examples
--------
>>> import holmes
>>> m = slowness_map(holmes.read_job("fixtures/gpu64-3d-slow-gpu"), iterations=range(8, 20))
>>> m.values.shape, int(m.ranks[np.nanargmax(m.values) // m.values.shape[1]])
((64, 12), 21)
>>> m.binned(16).values.shape
(16, 12)
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow.compute as pc

from holmes.cog.own_work import COLUMNS as OWN_WORK_COLUMNS
from holmes.cog.own_work import table_gaps, wait_arrays
from holmes.errors import HolmesError
from holmes.report.svg import el, esc, num, png_data_uri, slowness_rgb, svg_open
from holmes.stats import nan_quiet

__all__ = ["SlownessMap", "slowness_map", "rank_order", "heatmap_svg"]

log = logging.getLogger(__name__)

_COLUMNS = ("iteration", "start_ns", "end_ns") + OWN_WORK_COLUMNS


@dataclass
class SlownessMap:
    """Ranks x iterations of compute relative to peers.

    Attributes
    ----------
    ranks : numpy.ndarray
        The first rank of each row, rows in parallel-group order.
    last : numpy.ndarray
        The last rank of each row (equal to ``ranks`` unless rows were merged).
    stage : numpy.ndarray
        The pipeline stage of each row (0 without a layout).
    iterations : numpy.ndarray
    values : numpy.ndarray
        ``(rows, iterations)`` slowness; NaN where no rank of the row was read or had the iteration.
    world_size, read : int
        Ranks in the job and ranks whose logs were read.
    missing : dict
        rank -> reason, ranks whose logs could not be read.
    """

    ranks: np.ndarray
    last: np.ndarray
    stage: np.ndarray
    iterations: np.ndarray
    values: np.ndarray
    world_size: int
    read: int
    missing: dict[int, str] = field(default_factory=dict)

    def binned(self, max_rows: int) -> "SlownessMap":
        """At most ``max_rows`` rows: runs of consecutive rows of one stage merged, showing their max."""
        n = len(self.ranks)
        if n <= max_rows:
            return self
        size = -(-n // max_rows)
        starts = []
        i = 0
        while i < n:  # bins never cross a stage boundary
            starts.append(i)
            j = min(i + size, n)
            k = i + int(np.argmax(self.stage[i:j] != self.stage[i])) if np.any(self.stage[i:j] != self.stage[i]) else j
            i = k
        starts_a = np.array(starts)
        with np.errstate(all="ignore"):
            filled = np.where(np.isnan(self.values), -np.inf, self.values)
            vals = np.maximum.reduceat(filled, starts_a, axis=0)
        vals[~np.isfinite(vals)] = np.nan
        ends = np.append(starts_a[1:], n) - 1
        return SlownessMap(self.ranks[starts_a], self.last[ends], self.stage[starts_a], self.iterations, vals,
                           self.world_size, self.read, self.missing)


def rank_order(world_size: int, layout: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """Ranks ordered by pipeline stage, data-parallel replica, context and tensor position, and
    each one's stage (without a layout: rank order, stage 0).

    >>> from holmes.topology import ParallelLayout
    >>> order, stage = rank_order(8, ParallelLayout(tp=2, pp=2, dp=2))
    >>> order.tolist(), stage.tolist()
    ([0, 1, 2, 3, 4, 5, 6, 7], [0, 0, 0, 0, 1, 1, 1, 1])
    >>> rank_order(8, ParallelLayout(tp=2, pp=2, dp=2, order="tp-pp-dp"))[0].tolist()
    [0, 1, 4, 5, 2, 3, 6, 7]
    """
    ranks = np.arange(world_size)
    if layout is None or getattr(layout, "world_size", None) != world_size:
        return ranks, np.zeros(world_size, dtype=np.int64)
    keys = []
    for kind in ("tp", "cp", "dp", "pp"):  # lexsort: the last key is the primary one
        pos = np.zeros(world_size, dtype=np.int64)
        try:
            arr = np.asarray(layout.group_array(kind))
        except (HolmesError, KeyError, ValueError):
            keys.append(pos)
            continue
        pos[arr.ravel()] = np.tile(np.arange(arr.shape[1]), arr.shape[0])
        keys.append(pos)
    order = np.lexsort(keys)
    return order, keys[-1][order]


def _compute_per_iteration(table: Any, iterations: np.ndarray) -> np.ndarray:
    """One rank's compute (sum of non-negative gaps between consecutive ops) per iteration."""
    out = np.full(len(iterations), np.nan)
    if table.column("end_ns").null_count:  # logs dumped with ops in flight: completed ops only
        table = table.filter(pc.is_valid(table.column("end_ns")))
    if table.num_rows == 0:
        return out
    it = table.column("iteration").to_numpy()
    start = table.column("start_ns").to_numpy().astype(np.int64)
    end = table.column("end_ns").to_numpy().astype(np.int64)
    gap = table_gaps(start, end, wait_arrays(table))
    pos = np.searchsorted(iterations, it)
    ok = (pos < len(iterations)) & (iterations[np.minimum(pos, len(iterations) - 1)] == it)
    sums = np.bincount(pos[ok], weights=gap[ok], minlength=len(iterations))
    seen = np.bincount(pos[ok], minlength=len(iterations)) > 0
    out[seen] = sums[seen]
    return out


def _pick_ranks(order: np.ndarray, focus: list[int], max_ranks: int) -> np.ndarray:
    """The ranks to read: all when they fit, else ``focus`` first then evenly spread ones (sorted
    in ``order``)."""
    n = len(order)
    if n <= max_ranks:
        return order
    chosen = list(dict.fromkeys(int(r) for r in focus if 0 <= int(r) < n))[:max_ranks]
    left = max_ranks - len(chosen)
    if left > 0:
        spread = order[np.unique(np.linspace(0, n - 1, left + len(chosen)).astype(int))]
        have = set(chosen)
        chosen += [int(r) for r in spread if int(r) not in have][:left]
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    return np.array(sorted(chosen, key=lambda r: pos[r]), dtype=np.int64)


def _read(job: Any, ranks: list[int]) -> Iterator[tuple[int, Any, Any]]:
    """``(rank, table or None, error)`` per rank: the job's batch reader of only the columns needed
    when it has one (several times cheaper per rank), else :meth:`ops` rank by rank."""
    batch = getattr(job, "iter_ranks", None)
    if batch is not None:
        yield from batch(ranks, columns=list(_COLUMNS), errors="skip")
        return
    for r in ranks:
        try:
            yield r, job.ops(r), None
        except HolmesError as exc:
            yield r, None, exc


def slowness_map(job: Any, *, iterations: Any = None, layout: Any = None, focus: Any = (),
                 max_ranks: int = 512, max_iterations: int = 200) -> SlownessMap:
    """Read ranks' logs and measure each one's compute against its peers', per iteration.

    Parameters
    ----------
    job : Job or MemoryJob
    iterations : sequence of int, optional
        The columns (e.g. the report's window); default the first rank read's iterations.
    layout : ParallelLayout, optional
        Default ``job.layout``; orders the rows and defines the peers (same pipeline stage).
    focus : sequence of int
        Ranks read first when not every rank fits in ``max_ranks`` (the report's).
    max_ranks : int, default 512
        Logs read at most (bounds the time: about 3 ms per rank).
    max_iterations : int, default 200
        The last ``max_iterations`` iterations are kept.

    Returns
    -------
    SlownessMap
        One row per rank read (unread ranks are left out).
    """
    if max_ranks < 1:
        raise ValueError(f"max_ranks={max_ranks} must be >= 1")
    world = int(job.world_size)
    lay = layout if layout is not None else getattr(job, "layout", None)
    order, stage_of = rank_order(world, lay)
    stage_by_rank = np.empty(world, dtype=np.int64)
    stage_by_rank[order] = stage_of
    pick = _pick_ranks(order, list(focus), max_ranks)
    its = None if iterations is None else np.unique(np.asarray(list(iterations), dtype=np.int64))
    rows: list[np.ndarray] = []
    got: list[int] = []
    missing: dict[int, str] = {}
    for r, t, err in _read(job, pick.tolist()):
        if t is None:
            missing[r] = str(err)
            continue
        if its is None:
            its = np.unique(t.column("iteration").to_numpy())
        if its.size > max_iterations:
            its = its[-max_iterations:]
            rows = [row[-max_iterations:] for row in rows]
        rows.append(_compute_per_iteration(t, its))
        got.append(r)
    if its is None:
        its = np.zeros(0, dtype=np.int64)
    comp = np.array(rows, dtype=float).reshape(len(got), len(its))
    ranks = np.array(got, dtype=np.int64)
    stage = stage_by_rank[ranks] if len(ranks) else np.zeros(0, dtype=np.int64)
    values = np.full_like(comp, np.nan)
    with nan_quiet():  # all-NaN columns (an iteration nobody logged)
        for s in np.unique(stage):
            m = stage == s
            peers = comp[m] if m.sum() >= 3 else comp
            ref = np.nanmedian(peers, axis=0) if peers.size else np.full(len(its), np.nan)
            values[m] = comp[m] / np.where(ref > 0, ref, np.nan)
    if missing:
        log.info("heatmap: %d rank(s) unreadable", len(missing))
    return SlownessMap(ranks, ranks.copy(), stage, its, values, world, len(got), missing)


def heatmap_svg(m: SlownessMap, *, irregular: Any = (), marked: dict[int, str] | None = None,
                cell_w: float | None = None, max_height: float = 560.0) -> str:
    """The heatmap as inline SVG: the cells as one PNG image, iteration and stage axes, a mark
    above each irregular iteration and a label beside each marked rank (``rank -> text``).

    The SVG carries the cell values for the page's hover read-out (``data-*`` attributes and a
    JSON block); nothing needs a script to show."""
    rows, cols = m.values.shape
    if rows == 0 or cols == 0:
        return '<p class="note">No rank log could be read for the heatmap.</p>'
    left, top, bottom = 70.0, 26.0, 44.0
    cw = cell_w or max(3.0, min(24.0, 820.0 / cols))
    ch = max(1.0, min(14.0, max_height / rows))
    w, h = cols * cw, rows * ch
    # the named ranks' labels get their own column, the colour scale the next one: never on each other
    label_w = max((_text_w(t, 11.0, bold=True) for t in (marked or {}).values()), default=0.0)
    leg_x = left + w + 14 + (label_w + 16 if label_w else 0.0)
    right = leg_x - (left + w) + _LEGEND_W
    W, H = left + w + right, top + max(h, _LEGEND_H) + bottom
    parts = [svg_open(W, H, id="heatmap", cls="figure", role="img",
                      aria_label=f"slowness of {rows} rank rows over {cols} iterations")]
    parts.append(el("image", href=png_data_uri(slowness_rgb(m.values)), x=left, y=top, width=w, height=h,
                    preserveAspectRatio="none", cls="cells", style="image-rendering:pixelated"))
    parts.append(el("rect", x=left, y=top, width=w, height=h, fill="none", stroke="#888"))
    # iteration axis: ~10 ticks
    step = max(1, int(np.ceil(cols / 10)))
    for j in range(0, cols, step):
        x = left + (j + 0.5) * cw
        parts.append(el("text", str(int(m.iterations[j])), x=x, y=top + h + 14, cls="tick", text_anchor="middle"))
    parts.append(el("text", "iteration", x=left + w / 2, y=top + h + 34, cls="axis", text_anchor="middle"))
    # irregular iterations: a triangle above the column
    col_of = {int(it): j for j, it in enumerate(m.iterations.tolist())}
    for it in sorted({int(i) for i in irregular}):
        j = col_of.get(it)
        if j is None:
            continue
        x = left + (j + 0.5) * cw
        parts.append(el("path", raw=el("title", f"iteration {it}: irregular on the pivot"),
                        d=f"M{num(x - 4)} {num(top - 12)} L{num(x + 4)} {num(top - 12)} L{num(x)} {num(top - 3)} Z",
                        cls="irr-mark", data_iteration=it))
    # stage bands on the left
    bounds = np.flatnonzero(np.diff(m.stage)) + 1
    starts = np.concatenate([[0], bounds])
    ends = np.concatenate([bounds, [rows]])
    many = len(starts) > 1
    per_row = ch >= _ROW_LABEL_H  # rows tall enough to name each one's rank(s)
    for s0, s1 in zip(starts.tolist(), ends.tolist()):
        y0, y1 = top + s0 * ch, top + s1 * ch
        if s0 > 0:
            parts.append(el("line", x1=left, x2=left + w, y1=y0, y2=y0, cls="stage-sep"))
        if per_row and not many:
            continue  # one stage: the rows' own labels say it all
        label = f"PP {int(m.stage[s0])}" if many else f"ranks {int(m.ranks[0])}-{int(m.last[-1])}"
        parts.append(el("text", label, x=left - (40 if per_row else 6), y=(y0 + y1) / 2 + 4, cls="tick",
                        text_anchor="end"))
    if per_row:
        for i, (a, b) in enumerate(zip(m.ranks.tolist(), m.last.tolist())):
            parts.append(el("text", str(a) if a == b else f"{a}-{b}", x=left - 4, y=top + (i + 0.5) * ch + 3.5,
                            cls="tick row-label", text_anchor="end", data_row=a))
    # marked ranks (the devices named) on the right
    row_of = {}
    for i, (a, b) in enumerate(zip(m.ranks.tolist(), m.last.tolist())):
        row_of[(a, b)] = i
    for rank, text in (marked or {}).items():
        hit = [i for (a, b), i in row_of.items() if a <= rank <= b] if rank not in m.ranks else \
            [int(np.flatnonzero(m.ranks == rank)[0])]
        if not hit:
            continue
        y = top + (hit[0] + 0.5) * ch
        parts.append(el("path", d=f"M{num(left + w + 2)} {num(y)} l8 -5 l0 10 Z", cls="rank-mark"))
        parts.append(el("text", text, x=left + w + 13, y=y + 4, cls="rank-label", data_rank=rank))
    parts.append(_legend(leg_x, top + 12))
    data = {"x0": left, "y0": top, "cw": cw, "ch": ch, "iterations": m.iterations.tolist(),
            "ranks": m.ranks.tolist(), "last": m.last.tolist(), "stage": m.stage.tolist(),
            "values": [[None if not np.isfinite(v) else round(float(v), 2) for v in row] for row in m.values]}
    parts.append("</svg>")
    blob = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    return "".join(parts) + f'<script type="application/json" id="heatmap-data">{blob}</script>'


#: rows at least this tall (px) are labelled with their rank(s)
_ROW_LABEL_H = 9.0
#: the colour scale's box: its title above the bar, the ticks to its right
_LEGEND_W, _LEGEND_H = 110.0, 106.0


def _text_w(text: str, size: float, bold: bool = False) -> float:
    """An upper estimate of a label's width in px (system-ui; digits and lowercase ~0.6 em)."""
    return len(text) * size * (0.66 if bold else 0.62)


def _legend(x: float, y: float) -> str:
    """The colour scale: a vertical bar from 0.6x to 2x."""
    vals = np.linspace(2.0, 0.6, 48)
    img = png_data_uri(slowness_rgb(vals[:, None]))
    out = [el("image", href=img, x=x, y=y, width=12, height=90, preserveAspectRatio="none",
              style="image-rendering:pixelated")]
    for v in (2.0, 1.5, 1.0, 0.6):
        yy = y + (2.0 - v) / 1.4 * 90
        out.append(el("text", f"{v:g}x", x=x + 16, y=yy + 4, cls="tick"))
    out.append(el("text", "compute / peers", x=x, y=y - 10, cls="tick"))
    return "".join(out)


def describe(m: SlownessMap) -> str:
    """One sentence about what the heatmap shows (ranks read, rows merged)."""
    rows = len(m.ranks)
    merged = int(np.sum(m.last - m.ranks)) > 0
    s = (f"{m.read} of {m.world_size} ranks read" + (f"; {rows} rows, consecutive ranks merged (max shown)"
                                                     if merged else ""))
    if m.missing:
        s += f"; {len(m.missing)} unreadable"
    return esc(s)
