"""The report's smaller figures as inline SVG: the pivot's iteration times, the what-if impact
bars, and the traced paths through the communication-operator graph.

Each function takes plain data (lists, dicts, the report's root causes) and returns SVG text;
none needs a script to show, and native ``<title>`` tooltips give the exact figures.

Examples
--------
>>> svg = series_svg([1, 2, 3, 4], [100e6, 101e6, 150e6, 99e6], threshold_ns=110e6, usual_ns=100e6,
...                  irregular=[3], explained=[3])
>>> svg.count('class="irr-point explained"'), 'id="series"' in svg
(1, True)
>>> impact_svg([("gpu:3", 12.5), ("nic:3", 1.0)]).count('class="bar"')
2
"""

from __future__ import annotations

from typing import Any

import numpy as np

from holmes.report.svg import el, esc, num, svg_open
from holmes.topology import kinds

__all__ = ["series_svg", "impact_svg", "path_graph_svg", "cause_paths"]


def series_svg(iterations: Any, durations_ns: Any, *, threshold_ns: float | None, usual_ns: float | None,
               irregular: Any = (), explained: Any = (), rank: int = 0,
               others: dict[int, tuple[Any, Any]] | None = None) -> str:
    """The pivot's iteration times (ms) over the window, the usual level and the irregularity
    threshold (``delta x usual``); irregular iterations are dots (filled where a cause was found).
    ``others``: rank -> (iterations, durations) of further monitored ranks, drawn thin."""
    its = np.asarray(list(iterations), dtype=float)
    ms = np.asarray(list(durations_ns), dtype=float) / 1e6
    if its.size == 0:
        return '<p class="note">No iteration times.</p>'
    left, top, w, h = 60.0, 16.0, 760.0, 220.0
    W, H = left + w + 20, top + h + 42
    lines = [ms]
    if others:
        lines += [np.asarray(list(d), dtype=float) / 1e6 for _, d in others.values()]
    ys = np.concatenate([x[np.isfinite(x)] for x in lines] + [np.array([v / 1e6 for v in (threshold_ns, usual_ns)
                                                                          if v is not None])])
    lo, hi = float(ys.min()), float(ys.max())
    pad = max((hi - lo) * 0.08, 1e-3)
    lo, hi = max(0.0, lo - pad), hi + pad
    x0, x1 = float(its.min()), float(its.max()) if its.max() > its.min() else float(its.min()) + 1

    def X(i: float) -> float:
        return left + (i - x0) / (x1 - x0) * w

    def Y(v: float) -> float:
        return top + (hi - v) / (hi - lo) * h

    p = [svg_open(W, H, id="series", cls="figure", role="img", aria_label=f"iteration times of rank {rank}")]
    p.append(el("rect", x=left, y=top, width=w, height=h, fill="none", stroke="#bbb"))
    for v in np.linspace(lo, hi, 5):
        p.append(el("line", x1=left - 4, x2=left, y1=Y(v), y2=Y(v), stroke="#888"))
        p.append(el("text", f"{v:.1f}", x=left - 6, y=Y(v) + 4, cls="tick", text_anchor="end"))
    p.append(el("text", "ms", x=left + 4, y=top + 12, cls="axis"))
    step = max(1, int(np.ceil(len(its) / 12)))
    for i in its[::step]:
        p.append(el("text", str(int(i)), x=X(i), y=top + h + 14, cls="tick", text_anchor="middle"))
    p.append(el("text", "iteration", x=left + w / 2, y=top + h + 34, cls="axis", text_anchor="middle"))
    if usual_ns is not None:
        y = Y(usual_ns / 1e6)
        p.append(el("line", x1=left, x2=left + w, y1=y, y2=y, cls="usual"))
        p.append(el("text", f"usual {usual_ns / 1e6:.1f} ms", x=left + w - 4, y=y + 13, cls="tick", text_anchor="end"))
    if threshold_ns is not None:
        y = Y(threshold_ns / 1e6)
        p.append(el("line", x1=left, x2=left + w, y1=y, y2=y, cls="threshold"))
        p.append(el("text", f"threshold {threshold_ns / 1e6:.1f} ms", x=left + w - 4, y=y - 5, cls="tick",
                    text_anchor="end"))
    for r, (oi, od) in (others or {}).items():
        pts = " ".join(f"{num(X(i))},{num(Y(d / 1e6))}" for i, d in zip(oi, od) if x0 <= i <= x1)
        p.append(el("polyline", raw=el("title", f"rank {r}"), points=pts, cls="line other"))
    pts = " ".join(f"{num(X(i))},{num(Y(v))}" for i, v in zip(its, ms) if np.isfinite(v))
    p.append(el("polyline", raw=el("title", f"rank {rank}"), points=pts, cls="line pivot"))
    irr, expl = {int(i) for i in irregular}, {int(i) for i in explained}
    for i, v in zip(its.tolist(), ms.tolist()):
        if int(i) in irr and np.isfinite(v):
            tip = f"iteration {int(i)}: {v:.2f} ms, irregular" + ("; a root cause was found" if int(i) in expl else "")
            p.append(el("circle", raw=el("title", tip), cx=X(i), cy=Y(v), r=4.0,
                        cls="irr-point explained" if int(i) in expl else "irr-point", data_iteration=int(i)))
    p.append("</svg>")
    return "".join(p)


def impact_svg(items: list[tuple[str, float]]) -> str:
    """Horizontal bars: per device, how much shorter the step would be without it (%)."""
    if not items:
        return '<p class="note">No what-if estimate.</p>'
    left, bar_h, w = 190.0, 20.0, 480.0
    H = len(items) * (bar_h + 6) + 10
    top = max(max(v for _, v in items), 1e-9)
    p = [svg_open(left + w + 70, H, id="impact", cls="figure", role="img", aria_label="what-if impact per device")]
    for k, (dev, v) in enumerate(items):
        y = 5 + k * (bar_h + 6)
        p.append(el("text", dev, x=left - 8, y=y + bar_h - 6, cls="tick", text_anchor="end"))
        p.append(el("rect", raw=el("title", f"{dev}: the step would be {v:.1f}% shorter without it"),
                    x=left, y=y, width=max(1.0, v / top * w), height=bar_h, cls="bar", data_device=dev))
        p.append(el("text", f"{v:.1f}%", x=left + max(1.0, v / top * w) + 6, y=y + bar_h - 6, cls="tick"))
    p.append("</svg>")
    return "".join(p)


def cause_paths(causes: list[Any], devices: set[str], limit: int = 200) -> list[list[tuple[int, str]]]:
    """The search paths of the root causes implicating ``devices`` (all causes when none does):
    per cause the visited ``(rank, "op comm_id")`` steps, consecutive repeats of a rank merged."""
    pick = [c for c in causes if devices & set(_cause_devices(c))] or list(causes)
    out = []
    for c in pick[:limit]:
        steps: list[tuple[int, str]] = []
        for s in getattr(c, "evidence", None) or []:
            r, what = int(s.get("rank", -1)), f"{s.get('op', '?')} {s.get('comm_id', '')}".strip()
            if steps and steps[-1][0] == r:
                continue
            steps.append((r, what))
        if steps:
            out.append(steps)
    return out


def _cause_devices(c: Any) -> list[str]:
    if getattr(c, "devices", None):
        return list(c.devices)
    return [kinds.gpu(r) for r in getattr(c, "ranks", ())]


def path_graph_svg(paths: list[list[tuple[int, str]]], *, layout: Any = None, culprits: set[int] = frozenset(),
                   pivots: set[int] = frozenset(), max_full: int = 128) -> str:
    """Ranks as nodes grouped by parallel group, the followed edges highlighted.

    With a layout, each box is a tensor-parallel group placed at (pipeline stage, data-parallel
    replica); every rank is drawn when the world has at most ``max_full`` ranks, otherwise the
    ranks on the paths and their tensor-parallel groups. An edge ``a -> b`` means the search went
    from rank ``a``'s operator to rank ``b``'s (``b`` entered last, or ``b`` is ``a``'s P2P peer);
    its width grows with the number of causes that followed it."""
    on_path = sorted({r for p in paths for r, _ in p})
    if not on_path:
        return '<p class="note">No traced path: the search found no root cause.</p>'
    edges: dict[tuple[int, int], list[Any]] = {}
    for p in paths:
        for (a, _), (b, what) in zip(p, p[1:]):
            e = edges.setdefault((a, b), [0, what])
            e[0] += 1
    pos, boxes, heads = _place(on_path, layout, max_full)
    W = max(x for x, _ in pos.values()) + 60
    H = max(y for _, y in pos.values()) + 50
    p = [svg_open(W, H, id="path-graph", cls="figure", role="img",
                  aria_label=f"search paths over {len(pos)} ranks, {len(edges)} edges followed")]
    p.append('<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="9" markerHeight="9" '
             'markerUnits="userSpaceOnUse" orient="auto-start-reverse"><path d="M0 0 L10 5 L0 10 z" fill="#c0392b"/></marker></defs>')
    for (x, y, bw, bh, label) in boxes:
        p.append(el("rect", raw=el("title", label), x=x, y=y, width=bw, height=bh, rx=6.0, cls="group"))
    for text, x, y, anchor in heads:
        p.append(el("text", text, x=x, y=y, cls="axis", text_anchor=anchor))
    top = max((e[0] for e in edges.values()), default=1)  # single-step paths (a cell) have no edge
    for (a, b), (count, what) in sorted(edges.items()):
        if a == b or a not in pos or b not in pos:
            continue
        (x1, y1), (x2, y2) = pos[a], pos[b]
        dx, dy = x2 - x1, y2 - y1
        d = max(float(np.hypot(dx, dy)), 1e-6)
        # stop at the node's rim; bend a little so a -> b and b -> a do not overlap
        sx, sy, ex, ey = x1 + dx / d * 11, y1 + dy / d * 11, x2 - dx / d * 13, y2 - dy / d * 13
        mx, my = (sx + ex) / 2 - dy / d * 14, (sy + ey) / 2 + dx / d * 14
        p.append(el("path", raw=el("title", f"rank {a} -> rank {b}: {what}, followed by {count} cause(s)"),
                    d=f"M{num(sx)} {num(sy)} Q{num(mx)} {num(my)} {num(ex)} {num(ey)}", cls="edge followed",
                    stroke_width=1.5 + 3.5 * count / top, marker_end="url(#arrow)", data_from=a, data_to=b))
    for r, (x, y) in sorted(pos.items()):
        cls = "node" + (" on-path" if r in set(on_path) else "") + (" culprit" if r in culprits else "") + \
            (" pivot" if r in pivots else "")
        tip = f"rank {r}" + (" (pivot)" if r in pivots else "") + (" (named device)" if r in culprits else "")
        p.append(el("circle", raw=el("title", tip), cx=x, cy=y, r=10.0, cls=cls, data_rank=r))
        p.append(el("text", str(r), x=x, y=y + 3.5, cls="node-label", text_anchor="middle"))
    p.append("</svg>")
    return "".join(p)


def _place(on_path: list[int], layout: Any, max_full: int) -> tuple[dict[int, tuple[float, float]], list, list]:
    """Node positions, group boxes ``(x, y, w, h, label)`` and headings ``(text, x, y, anchor)``."""
    if layout is None:
        pos = {r: (40.0 + 34.0 * (k % 20), 40.0 + 40.0 * (k // 20)) for k, r in enumerate(on_path)}
        return pos, [], []
    world = int(layout.world_size)
    if world <= max_full:
        shown = list(range(world))
    else:
        shown = sorted({m for r in on_path for m in layout.group_of(r, "tp")} | set(on_path))
    coords = {r: layout.coords(r) for r in shown}
    stages = sorted({c["pp"] for c in coords.values()})
    replicas = sorted({(c["dp"], c.get("cp", 0)) for c in coords.values()})
    slot = {}
    for r in shown:
        c = coords[r]
        slot.setdefault((c["pp"], c["dp"], c.get("cp", 0)), []).append(r)
    width = max(len(v) for v in slot.values())
    bw, bh, gapx, gapy = 28.0 * width + 12, 36.0, 40.0, 14.0
    x_of = {s: 70.0 + k * (bw + gapx) for k, s in enumerate(stages)}
    y_of = {d: 40.0 + k * (bh + gapy) for k, d in enumerate(replicas)}
    pos, boxes, heads = {}, [], []
    for (s, d, cp), members in slot.items():
        x, y = x_of[s], y_of[(d, cp)]
        boxes.append((x, y, bw, bh, f"tensor-parallel group: pipeline stage {s}, data-parallel replica {d}"
                      + (f", context {cp}" if cp else "")))
        for k, r in enumerate(sorted(members, key=lambda r: coords[r].get("tp", 0))):
            pos[r] = (x + 20.0 + 28.0 * k, y + bh / 2)
    for s in stages:
        heads.append((f"PP {s}", x_of[s] + bw / 2, 26.0, "middle"))
    for d in replicas:
        heads.append((f"DP {d[0]}" + (f"/CP {d[1]}" if d[1] else ""), 62.0, y_of[d] + bh / 2 + 4, "end"))
    return pos, boxes, heads


def paths_text(paths: list[list[tuple[int, str]]], limit: int = 5) -> list[tuple[str, int]]:
    """The distinct paths as text (``op@rank -> ...``) with how many causes followed each."""
    count: dict[str, int] = {}
    for p in paths:
        key = " \u2192 ".join(f"{what}@{r}" for r, what in p)
        count[key] = count.get(key, 0) + 1
    return sorted(count.items(), key=lambda kv: -kv[1])[:limit]


def esc_list(items: Any) -> str:
    """Comma-separated, escaped."""
    return esc(", ".join(str(i) for i in items))
