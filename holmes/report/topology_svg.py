"""The implicated devices on a drawing of the cluster: hosts (with their GPUs) and switch tiers.

Switch tiers are found from the cables: tier 1 are the switches NICs are cabled to (leaves,
ToRs), tier 2 the switches cabled to tier 1 (spines, aggregation), and so on; the highest tier is
drawn on top, hosts at the bottom. Large clusters are cut down to what matters: the hosts of the
implicated devices and of the traced ranks (at most ``max_hosts``), their leaves, and the
implicated switches (each tier shows at most ``max_per_tier`` switches, the rest counted). A
job on one host talks through its NVSwitch only: its network switches carry none of its traffic
and are not drawn unless implicated (a note says how many were left out).

Examples
--------
>>> from holmes.topology import rail_optimized
>>> svg = topology_svg(rail_optimized(16, num_spines=2), {"gpu:9": "named", "switch:spine-1": "candidate"})
>>> svg.count('class="host'), svg.count("gpu named"), 'data-device="switch:spine-1"' in svg
(2, 1, True)
"""

from __future__ import annotations

from typing import Any

from holmes.report.svg import el, svg_open
from holmes.topology import kinds

__all__ = ["topology_svg"]


def _num_id(dev: str) -> int | None:
    m = kinds.numbered(dev)
    return m[1] if m is not None else None


def _tiers(topo: Any) -> dict[str, int]:
    """Switch -> tier (1 = cabled to NICs)."""
    g = topo.graph
    tier: dict[str, int] = {}
    frontier = []
    for s in topo.switches:
        if any(kinds.is_kind(n, "nic") for n in g.neighbors(s)):
            tier[s] = 1
            frontier.append(s)
    k = 1
    while frontier:
        k += 1
        nxt = []
        for s in frontier:
            for n in g.neighbors(s):
                if kinds.is_kind(n, "switch") and n not in tier:
                    tier[n] = k
                    nxt.append(n)
        frontier = nxt
    for s in topo.switches:  # switches cabled to nothing
        tier.setdefault(s, 1)
    return tier


def topology_svg(topo: Any, highlight: dict[str, str], *, ranks: Any = (), max_hosts: int = 16,
                 max_per_tier: int = 24) -> str:
    """SVG of hosts and switches with ``highlight`` (device id -> ``"named"`` | ``"candidate"``)
    drawn in colour; ``ranks`` (e.g. those on the traced paths) bring their hosts into the picture."""
    gph = topo.gpus_per_host
    hosts: list[int] = []

    def add_host(h: int | None) -> None:
        if h is not None and 0 <= h < topo.num_hosts and h not in hosts:
            hosts.append(h)

    for dev in highlight:
        kind, n = kinds.kind_of(dev), _num_id(dev)
        if kinds.rank_of(dev) is not None and n < topo.num_gpus:
            add_host(topo.host_of(n))
        elif kind in kinds.KINDS and kinds.KINDS[kind].per == "host":
            add_host(n)
        elif kind == "link":
            for end in kinds.link_ends(dev):
                if kinds.rank_of(end) is not None and kinds.is_kind(end, "nic"):
                    add_host(topo.host_of(kinds.number(end)))
    for r in ranks:
        if 0 <= int(r) < topo.num_gpus:
            add_host(topo.host_of(int(r)))
    if topo.num_hosts <= max_hosts:
        hosts = list(range(topo.num_hosts))
    hidden_hosts = max(0, len(hosts) - max_hosts) + (topo.num_hosts - len(hosts))
    hosts = sorted(hosts[:max_hosts])
    tier = _tiers(topo)
    g = topo.graph
    leaves_used = {g_ for h in hosts for r in range(h * gph, min((h + 1) * gph, topo.num_gpus))
                   for g_ in [_leaf(topo, r)] if g_}
    hi_links = {d for d in highlight if kinds.is_kind(d, "link")}
    hi_sw = {d for d in highlight if kinds.is_kind(d, "switch")} | {e for d in hi_links for e in kinds.link_ends(d)
                                                                    if kinds.is_kind(e, "switch")}
    one_host = topo.num_hosts == 1
    by_tier: dict[int, list[str]] = {}
    for s in topo.switches:
        if one_host and s not in hi_sw:
            continue  # no traffic leaves the host
        by_tier.setdefault(tier[s], []).append(s)
    idle_switches = len(topo.switches) - sum(map(len, by_tier.values()))
    shown: dict[int, list[str]] = {}
    hidden: dict[int, int] = {}
    for t, sws in by_tier.items():
        if len(sws) <= max_per_tier:
            pick = sws
        else:  # the implicated switches always, then the shown hosts' leaves, then the first others
            first = [x for x in sws if x in hi_sw]
            used = [x for x in sws if t == 1 and x in leaves_used and x not in hi_sw]
            rest = [x for x in sws if x not in hi_sw and x not in leaves_used]
            pick = first + (used + rest)[:max(0, max_per_tier - len(first))]
            pick = sorted(set(pick), key=sws.index)
        shown[t] = pick
        hidden[t] = len(sws) - len(pick)
    levels = sorted(shown, reverse=True)
    host_w, sw_w = max(60.0, 12.0 * gph + 14), 74.0
    widest = max([len(hosts) * (host_w + 14)] + [len(v) * (sw_w + 8) for v in shown.values()] + [300.0])
    W = widest + 140
    row_h = 80.0
    H = 30 + row_h * (len(levels) + 1) + 40
    xy: dict[str, tuple[float, float]] = {}
    for k, t in enumerate(levels):
        sws = shown[t]
        step = widest / max(len(sws), 1)
        for i, s in enumerate(sws):
            xy[s] = (20 + step * (i + 0.5), 30 + k * row_h)
    hy = 30 + len(levels) * row_h + 20
    hstep = widest / max(len(hosts), 1)
    host_x = {h: 20 + hstep * (i + 0.5) for i, h in enumerate(hosts)}
    p = [svg_open(W, H, id="topology", cls="figure", role="img",
                  aria_label=f"cluster: {len(hosts)} of {topo.num_hosts} hosts, {sum(map(len, shown.values()))} switches")]
    # cables between shown switches
    for a, b, d in g.edges(data=True):
        if a in xy and b in xy:
            cls = "cable named" if d.get("id") in hi_links else "cable"
            (x1, y1), (x2, y2) = xy[a], xy[b]
            p.append(el("line", raw=el("title", d.get("id", "")), x1=x1, y1=y1 + 11, x2=x2, y2=y2 - 11, cls=cls,
                        data_device=d.get("id")))
    # NIC cables from the hosts' GPUs to their leaves
    for h in hosts:
        for r in range(h * gph, min((h + 1) * gph, topo.num_gpus)):
            leaf = _leaf(topo, r)
            if leaf not in xy:
                continue
            lid = g.edges[kinds.nic(r), leaf].get("id", "")
            gx = host_x[h] - host_w / 2 + 7 + 12 * (r - h * gph) + 5
            cls = "cable named" if lid in hi_links or kinds.nic(r) in highlight else "cable nic"
            p.append(el("line", raw=el("title", lid), x1=gx, y1=hy, x2=xy[leaf][0], y2=xy[leaf][1] + 11, cls=cls,
                        data_device=lid))
    for s, (x, y) in xy.items():
        mark = highlight.get(s)
        p.append(el("rect", raw=el("title", s + (f" ({mark})" if mark else "")), x=x - sw_w / 2, y=y - 11,
                    width=sw_w, height=22, rx=4.0, cls="switch" + (f" {mark}" if mark else ""), data_device=s))
        p.append(el("text", kinds.name_of(s), x=x, y=y + 4, cls="sw-label", text_anchor="middle"))
    for k, t in enumerate(levels):
        if hidden[t]:
            p.append(el("text", f"+{hidden[t]} more", x=widest + 30, y=30 + k * row_h + 4, cls="tick"))
    for h in hosts:
        x0 = host_x[h] - host_w / 2
        mark = highlight.get(kinds.host(h)) or highlight.get(kinds.nvswitch(h))
        p.append(el("rect", raw=el("title", kinds.host(h) + (f" ({mark})" if mark else "")), x=x0, y=hy, width=host_w,
                    height=34, rx=4.0, cls="host" + (f" {mark}" if mark else ""), data_device=kinds.host(h)))
        for r in range(h * gph, min((h + 1) * gph, topo.num_gpus)):
            gm = highlight.get(kinds.gpu(r)) or highlight.get(kinds.nic(r))
            p.append(el("rect", raw=el("title", kinds.gpu(r) + (f" ({gm})" if gm else "")),
                        x=x0 + 7 + 12 * (r - h * gph), y=hy + 5, width=10, height=10,
                        cls="gpu" + (f" {gm}" if gm else ""), data_device=kinds.gpu(r)))
        p.append(el("text", f"host {h}", x=host_x[h], y=hy + 30, cls="sw-label", text_anchor="middle"))
    if hidden_hosts:
        p.append(el("text", f"+{hidden_hosts} more hosts", x=widest + 30, y=hy + 20, cls="tick"))
    if idle_switches:
        p.append(el("text", f"one host: no switch carries its traffic ({idle_switches} not drawn)",
                    x=20, y=hy - 24, cls="tick note-line"))
    p.append("</svg>")
    return "".join(p)


def _leaf(topo: Any, rank: int) -> str | None:
    try:
        return topo.leaf_of(rank)
    except Exception:  # noqa: BLE001 - a single-host topology has no leaves
        return None


def legend_html() -> str:
    """The colour key of the drawing."""
    return ('<span class="key named"></span> named device <span class="key candidate"></span> candidate '
            '(below the confidence needed) <span class="key plain"></span> other')
