"""The wait chains of a hang drawn as SVG: one row per chain, from a waiting rank to its root.

Each rank is a circle (a root or a deadlock's rank filled dark, a waiting rank light), each wait an
arrow labelled with the operator it waits in (``recv #4 pp-0-2``). Input: the report's
``hang["wait_chains"]`` (``[[rank, op, comm_id, seq, waits_for], ...]`` per chain, see docs/cli.md).

>>> svg = chains_svg([[[0, "recv", "pp-0", 4, 4], [4, "all_reduce", "tp-1", 8, 5]]], roots=[5])
>>> svg.count("<circle"), "recv #4" in svg, svg.startswith("<svg")
(3, True, True)
"""

from __future__ import annotations

from typing import Any, Sequence

from holmes.report.svg import el, svg_open

__all__ = ["chains_svg"]

_R, _STEP, _ROW, _PAD = 14.0, 150.0, 46.0, 24.0


def chains_svg(chains: Sequence[Sequence[Sequence[Any]]], *, roots: Sequence[int] = (),
               deadlock: Sequence[int] = ()) -> str:
    """An SVG of the wait chains (empty string when there is none)."""
    chains = [c for c in chains if c]
    if not chains:
        return ""
    dark = set(int(r) for r in roots) | set(int(r) for r in deadlock)
    width = _PAD * 2 + _STEP * max(len(c) for c in chains) + _R * 2
    height = _PAD + _ROW * len(chains)
    parts = [svg_open(width, height, id="hang-chains", role="img",
                      aria_label="wait chains: each waiting rank to the rank it ultimately waits for")]
    parts.append('<defs><marker id="hang-arrow" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="7" '
                 'markerHeight="7" orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#555"/></marker></defs>')
    for i, chain in enumerate(chains):
        y = _PAD + _ROW * i + _R
        ranks = [int(chain[0][0])] + [int(link[4]) for link in chain]
        for j, link in enumerate(chain):
            x0, x1 = _PAD + _R + _STEP * j, _PAD + _R + _STEP * (j + 1)
            parts.append(el("line", x1=x0 + _R, y1=y, x2=x1 - _R - 2, y2=y, stroke="#555", stroke_width=1.5,
                            marker_end="url(#hang-arrow)"))
            parts.append(el("text", f"{link[1]} #{link[3]} {link[2]}", x=(x0 + x1) / 2, y=y - _R + 2,
                            font_size=10, text_anchor="middle", fill="#333"))
        for j, r in enumerate(ranks):
            x = _PAD + _R + _STEP * j
            fill = "#4b2372" if r in dark else "#e8dcf5"
            parts.append(el("circle", raw=el("title", f"rank {r}" + (" (root)" if r in dark else " (waiting)")),
                            cx=x, cy=y, r=_R, fill=fill, stroke="#4b2372"))
            parts.append(el("text", str(r), x=x, y=y + 4, font_size=11, text_anchor="middle",
                            fill="#fff" if r in dark else "#222"))
    parts.append("</svg>")
    return "".join(parts)
