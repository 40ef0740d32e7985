"""The readable text of a :class:`~holmes.localize.report.Report` (``holmes localize --format text``).

What a person needs first comes first: ranks that could not be read, how long the pivot's
iterations took against the usual one, the verdict with the time each device costs, then the root
causes -- repeated causes (the same operator on the same ranks in several iterations) folded into
one line with a count, the iterations, the ``seq`` numbers and how much longer those iterations
were; ``show_all`` lists every cause. When nothing was irregular, the text says how far the
longest iteration stretched and which ``--delta`` would have flagged it, instead of a bare "no
irregular iteration".

Examples
--------
>>> fmt_ns(12_345_678), fmt_ns(2.5e9), fmt_ns(450_000)
('12.3 ms', '2.50 s', '0.45 ms')
>>> int_ranges([8, 9, 10, 11, 19, 3])
'3,8-11,19'
>>> signed_span(-1.04e6, 16.9e6), signed_span(2e6, 2e6), signed_span(1e6, 16.9e6)
('-1.0 to +16.9 ms', '+2.0 ms', '+1.0 to +16.9 ms')
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from holmes._ranges import format_int_ranges
from holmes.display import (NOT_HEALTHY, SHOWN_CAUSES, SHOWN_COMMUNICATORS, SHOWN_MISSING, SHOWN_RANGES, SHOWN_RANKS,
                             SHOWN_ROWS)
from holmes.units import BYTES_PER_MB, NS_PER_MS, NS_PER_S
from holmes.topology import kinds

__all__ = ["render_text", "fmt_ns", "int_ranges", "signed_span", "device_figures"]


def fmt_ns(ns: float) -> str:
    """A duration for people: ``'12.3 ms'``, ``'0.45 ms'``, ``'2.50 s'``."""
    if abs(ns) >= NS_PER_S:
        return f"{ns / NS_PER_S:.2f} s"
    ms = ns / NS_PER_MS
    return f"{ms:.2f} ms" if abs(ms) < 1 else f"{ms:.1f} ms"


def int_ranges(values: Iterable[int], limit: int | None = SHOWN_RANGES) -> str:
    """Sorted distinct integers as ``'3,8-11,19'`` (at most ``limit`` pieces, then ``',...'``)."""
    return format_int_ranges(values, limit)


def _span(lo: float, hi: float, fmt: str) -> str:
    a, b = format(lo, fmt), format(hi, fmt)
    return a if a == b else f"{a}-{b}"


def signed_span(lo_ns: float, hi_ns: float) -> str:
    """A range of differences in ms, each end with its sign: ``'-1.0 to +16.9 ms'``, ``'+2.0 ms'``."""
    a, b = f"{lo_ns / NS_PER_MS:+.1f}", f"{hi_ns / NS_PER_MS:+.1f}"
    return f"{a} ms" if a == b else f"{a} to {b} ms"


def device_figures(d: Any) -> str:
    """A device's figures in the order devices are ranked: confidence, then coverage, then score
    (and the what-if impact where measured), so the order of a listing can be read off it."""
    parts = [f"confidence {d.confidence:.2f}" if d.confidence is not None else "no confidence"]
    if d.coverage is not None:
        parts.append(f"coverage {100 * d.coverage:.0f}%")
    parts.append(f"score {d.score:.3f}")
    if d.impact_pct is not None:
        parts.append(f"impact {d.impact_pct:.1f}% of the step")
    return "  ".join(parts)


def _alike_line(d: Any, before: list[Any]) -> list[str]:
    """Once per group of devices the evidence cannot tell apart (``DeviceScore.alike``): which
    they are, and that the confidence is the group's."""
    if not d.alike or any(b.id in d.alike for b in before):
        return []
    return [f"     the logs cannot tell {d.id} apart from {', '.join(d.alike)}: the confidence is that the fault "
            f"is one of these {len(d.alike) + 1}"]


def render_text(r: Any, max_causes: int = SHOWN_CAUSES, show_all: bool = False) -> str:
    """The text report of ``r`` (a :class:`~holmes.localize.report.Report`).

    Parameters
    ----------
    r : Report
    max_causes : int, default 10
        Folded root-cause lines shown (``show_all`` shows every cause, unfolded).
    show_all : bool, default False
        Every root cause on its own line, and every implicated device.
    """
    usual = r.usual_iteration_ns
    durs: dict[int, int] = r.iteration_ns or {}
    lines = [f"Holmes localization: {len(r.irregular_iterations)} irregular iteration(s) of {len(r.window)} in the "
             f"window; read {len(r.fetched)} of {r.world_size} ranks ({r.bytes_read / BYTES_PER_MB:.1f} MB)"]
    lines += _missing_lines(r.missing, show_all)
    lines += _iteration_lines(r, usual, durs)
    if r.verdict == "hang":
        lines.extend(_hang_lines(r.hang or {}, r.devices))
    elif r.verdict == "healthy":
        lines.append("Verdict: healthy. No anomalous device found: " + _healthy_reason(r, usual, durs))
        lines += _longest_line(r, usual, durs)
    elif not r.devices:
        lines.append("Verdict: inconclusive. No device is named with confidence"
                     + ("." if r.root_causes else " (no root cause could be attributed)."))
        # why a job that might read healthy is not (the pipeline's own assumptions say so)
        lines += [f"  Why: {a}" for a in r.assumptions or () if a.endswith(NOT_HEALTHY)]
        for d in (r.all_devices if show_all and r.all_devices else r.candidates):
            lines.append(f"  candidate {d.id:<28} {device_figures(d)}  ({d.causes} cause(s))")
            lines += _cost_line(r, d, usual)
    else:
        lines.append(f"Verdict: {r.verdict}. Most likely anomalous devices (by confidence, then coverage):")
        for i, d in enumerate(r.devices, 1):
            lines.append(f"  {i}. {d.id:<28} {device_figures(d)}  ({d.causes} cause(s))")
            lines += _cost_line(r, d, usual)
            lines += _alike_line(d, r.devices[:i - 1])
        if show_all:
            rest = [d for d in r.all_devices if d.id not in {x.id for x in r.devices}]
            for d in rest:
                lines.append(f"     also implicated: {d.id:<22} {device_figures(d)}")
    if r.slowdown is not None:
        lines.append(f"Straggling slowdown: the step is {r.slowdown:.3f}x the ideal (what-if replay)")
    if r.non_device_cause:
        nd = r.non_device_cause
        where = f" (stage {nd['stage']})" if "stage" in nd else ""
        if r.devices:  # one story: the devices above are named; the imbalance is a second finding
            lines.append(f"Also measured: {nd['kind'].replace('_', ' ')}{where}, apart from the devices named above "
                         f"(the persistent analysis found no device behind the step's own slowdown)")
        else:
            lines.append(f"Non-device cause: {nd['kind'].replace('_', ' ')}{where}; no device explains the slowdown")
    lines += _rank_lines(r, show_all)
    if r.root_causes:
        lines += (_all_causes(r.root_causes, durs, usual) if show_all
                  else _folded_causes(r.root_causes, durs, usual, max_causes))
    for a in r.assumptions:
        lines.append(f"Assumption: {a}")
    return "\n".join(lines)


def rank_rows(r: Any, limit: int | None = SHOWN_ROWS) -> list[dict[str, Any]]:
    """The per-rank summary rows worth showing first: the named devices' ranks, then the ranks
    furthest from their peers (compute or transfer, relative); every row with ``limit=None``."""
    rows = list(getattr(r, "rank_summary", None) or [])
    if limit is None or len(rows) <= limit:
        return sorted(rows, key=lambda x: x["rank"])
    named = set()
    for d in list(r.devices) + list(r.candidates):
        rank = kinds.rank_of(d.id)
        if rank is not None:
            named.add(rank)

    def off(x: dict[str, Any]) -> float:
        c = abs((x.get("compute_vs_peers") or 1.0) - 1.0)
        pt = x.get("peers_transfer_ms") or 0.0
        t = abs(x["transfer_ms"] / pt - 1.0) if pt > 0 else 0.0
        return max(c, t)

    ordered = sorted(rows, key=lambda x: (x["rank"] not in named, -off(x), x["rank"]))
    return sorted(ordered[:limit], key=lambda x: x["rank"])


def _rank_lines(r: Any, show_all: bool) -> list[str]:
    """The per-rank summary table: each rank's compute, waiting and transfer per step, its peers' beside."""
    all_rows = getattr(r, "rank_summary", None) or []
    if not all_rows:
        return []
    rows = rank_rows(r, None if show_all else SHOWN_ROWS)
    steps = max(x["steps"] for x in all_rows)
    more = "" if len(rows) == len(all_rows) else \
        f"; the {len(rows)} furthest from their peers of {len(all_rows)}, --all lists each"
    out = [f"Per-rank time per step (median of {steps} iteration(s); peers: the ranks of its pipeline stage{more}):",
           f"  {'rank':>6} {'stage':>5}  {'compute ms (peers)':>20}  {'waiting ms (peers)':>20}  "
           f"{'transfer ms (peers)':>20}  compute/peers"]
    for x in rows:
        vs = x.get("compute_vs_peers")
        out.append(f"  {x['rank']:>6} {x['stage']:>5}  {_pair(x['compute_ms'], x['peers_compute_ms']):>20}  "
                   f"{_pair(x['waiting_ms'], x['peers_waiting_ms']):>20}  "
                   f"{_pair(x['transfer_ms'], x['peers_transfer_ms']):>20}  "
                   + (f"{vs:.2f}x" if vs is not None else "-"))
    return out


def _pair(v: float, peers: float) -> str:
    return f"{v:.1f} ({peers:.1f})"


def _missing_lines(missing: dict[int, str], show_all: bool) -> list[str]:
    """Ranks that could not be read, first: every conclusion below was drawn without them."""
    if not missing:
        return []
    ranks = sorted(missing)
    out = [f"Missing or unreadable ranks ({len(ranks)}): {int_ranges(ranks, limit=None if show_all else SHOWN_RANGES)}"]
    shown = ranks if show_all else ranks[:SHOWN_MISSING]
    out += [f"  rank {k}: {missing[k]}" for k in shown]
    if len(shown) < len(ranks):
        out.append(f"  ... {len(ranks) - len(shown)} more (--all lists every one)")
    return out


def _iteration_lines(r: Any, usual: float | None, durs: dict[int, int]) -> list[str]:
    """The pivot's usual iteration and how much longer the irregular ones were."""
    if not usual or not durs:
        return []
    piv = f"pivot rank{'s' if len(r.pivots) > 1 else ''} {','.join(map(str, r.pivots))}" if r.pivots else "pivot"
    flagged = [i for i in r.irregular_iterations if i in durs]
    longer = [durs[i] for i in flagged if durs[i] > usual]
    if not longer:
        head = f"Iterations ({piv}): usual {fmt_ns(usual)}"
    else:
        lo, hi = min(longer), max(longer)
        head = (f"Iterations ({piv}): usual {fmt_ns(usual)}; the irregular ones took "
                f"{_span(lo / NS_PER_MS, hi / NS_PER_MS, '.1f')} ms, {_span(lo / usual, hi / usual, '.2f')}x the usual "
                f"({signed_span(lo - usual, hi - usual)})")
    out = [head]
    within = sorted(i for i in flagged if durs[i] <= usual)
    if within:
        # flagged on another monitored rank, or against the iterations around them: not longer
        # than the usual on this pivot, so not counted among the irregular ones above
        ratios = [durs[i] / usual for i in within]
        out.append(f"  {len(within)} more flagged iteration(s) ({int_ranges(within)}) are not longer than the usual "
                   f"on this pivot ({_span(min(ratios), max(ratios), '.2f')}x): flagged on another monitored rank "
                   f"or against the iterations around them")
    return out


def _healthy_reason(r: Any, usual: float | None, durs: dict[int, int]) -> str:
    """Why nothing is named."""
    if not r.irregular_iterations:
        if durs:
            return "no iteration was irregular."
        analysis = (r.params or {}).get("analysis")
        if analysis == "hang":
            return "no operator was in flight when the logs were written: the job did not hang."
        if analysis == "persistent":
            return "no rank made its peers wait beyond the job's own noise."
        return "nothing irregular to explain."
    delta = (r.params or {}).get("delta")
    n = len(r.irregular_iterations)
    ratios = [durs[i] / usual for i in r.irregular_iterations if i in durs] if usual else []
    if ratios and isinstance(delta, (int, float)) and min(ratios) <= delta:
        # flagged under delta (the stretch, step or repeat rules): say what they were
        return (f"{n} iteration(s) stood out ({_span(min(ratios), max(ratios), '.2f')}x the usual) but no device "
                f"explains them beyond the job's own noise.")
    above = f"above delta {delta:g}" if isinstance(delta, (int, float)) else "above delta"
    return f"{n} iteration(s) were {above} but within the job's own noise."


def _longest_line(r: Any, usual: float | None, durs: dict[int, int]) -> list[str]:
    """The largest stretch seen, and the ``--delta`` it would take to flag it."""
    if not usual or not durs:
        return []
    it, longest = max(durs.items(), key=lambda kv: (kv[1], -kv[0]))
    ratio = longest / usual
    line = (f"  The longest iteration, {it}, took {fmt_ns(longest)}: {ratio:.3f}x the usual {fmt_ns(usual)} "
            f"({100 * (ratio - 1):+.1f}%)")
    delta = (r.params or {}).get("delta")
    if not r.irregular_iterations and ratio > 1.0:
        now = f", now {delta:g}" if isinstance(delta, (int, float)) else ""
        line += f"; it would take --delta below {ratio:.3f} to flag it{now}"
    return [line + "."]


def _cost_line(r: Any, d: Any, usual: float | None) -> list[str]:
    """What a device costs: the time its irregular iterations lasted beyond the usual."""
    c = (r.device_cost or {}).get(d.id)
    if not c or not c.get("iterations"):
        return []
    n, ns = int(c["iterations"]), float(c["excess_ns"])
    share = f", {100 * ns / n / usual:.1f}% of the usual step" if usual else ""
    return [f"     costs {fmt_ns(ns)} over {n} irregular iteration(s) ({fmt_ns(ns / n)} each{share})"]


def _cause_key(c: Any) -> tuple[Any, ...]:
    """Causes that are the same finding repeated: same kind, ranks, operator, communicator and devices."""
    return (c.cause, tuple(c.ranks), c.op.get("op"), c.op.get("comm_id"), tuple(c.devices or ()))


def _where(c: Any) -> str:
    ranks = ",".join(map(str, c.ranks[:SHOWN_RANKS])) + (",..." if len(c.ranks) > SHOWN_RANKS else "")
    return f"{c.cause} on rank(s) {ranks} at {c.op.get('op')} [{c.op.get('comm_id')}]"


def _path(c: Any) -> str:
    def step(s: dict[str, Any]) -> str:
        gap = s.get("gap_excess_ns")
        return f"{s['op']}@{s['rank']}" + (f" ({'+' if gap > 0 else ''}{fmt_ns(gap)} compute before)" if gap else "")

    return " -> ".join(step(s) for s in c.evidence)


def _stretch(its: Sequence[int], durs: dict[int, int], usual: float | None) -> str:
    """How long those iterations took against the usual one."""
    got = [durs[i] for i in its if i in durs]
    if not got or not usual:
        return ""
    lo, hi = min(got), max(got)
    return (f"{_span(lo / NS_PER_MS, hi / NS_PER_MS, '.1f')} ms, {_span(lo / usual, hi / usual, '.2f')}x the usual "
            f"({signed_span(lo - usual, hi - usual)})")


def _folded_causes(causes: list[Any], durs: dict[int, int], usual: float | None, max_causes: int) -> list[str]:
    groups: dict[tuple[Any, ...], list[Any]] = {}
    for c in causes:
        groups.setdefault(_cause_key(c), []).append(c)
    ordered = sorted(groups.values(), key=lambda g: (-len({c.iteration for c in g}), -max(c.rate for c in g)))
    out = [f"Root causes ({len(causes)} in {len({c.iteration for c in causes})} iteration(s), "
           f"{len(ordered)} distinct; --all lists each):"]
    for g in ordered[:max_causes]:
        c0 = g[0]
        its = sorted({c.iteration for c in g})
        seqs = [int(c.op["seq"]) for c in g if c.op.get("seq") is not None]
        seq = f" seq {_span(min(seqs), max(seqs), 'd')}" if seqs else ""
        gaps = [s["gap_excess_ns"] for c in g for s in c.evidence[-1:] if s.get("gap_excess_ns")]
        gap = f"; {signed_span(min(gaps), max(gaps))} compute before it" if gaps else ""
        st = _stretch(its, durs, usual)
        out.append(f"  {len(g)}x {_where(c0)}{seq}: iteration(s) {int_ranges(its)}"
                   + (f" took {st}" if st else "") + f"{gap}; R={_span(min(c.rate for c in g), max(c.rate for c in g), '.2f')}")
        out.append(f"      path {_path(c0)}")
    if len(ordered) > max_causes:
        out.append(f"  ... {len(ordered) - max_causes} more distinct cause(s) (--all lists each)")
    return out


def _all_causes(causes: list[Any], durs: dict[int, int], usual: float | None) -> list[str]:
    out = [f"Root causes ({len(causes)}):"]
    for c in causes:
        st = _stretch([c.iteration], durs, usual)
        seq = f" seq {c.op['seq']}" if c.op.get("seq") is not None else ""
        out.append(f"  iter {c.iteration}" + (f" ({st})" if st else "") + f": {_where(c)}{seq} R={c.rate:.2f}; "
                   f"path {_path(c)}")
    return out


def _is_chain(sentence: str) -> bool:
    """An explanation sentence that spells a wait chain (drawn as one instead)."""
    head = sentence.split(";", 1)[0]
    return head.startswith("rank ") and " waits in " in head


def _hang_lines(h: dict[str, Any], devices: list[Any]) -> list[str]:
    """The text report of a hang: the culprits, why, and where each communicator is stuck."""
    culprits = h.get("culprit_ranks") or []
    if h.get("deadlock"):
        head = f"Verdict: hang (deadlock). Ranks {', '.join(map(str, h['deadlock']))} wait for each other."
    elif culprits:
        head = (f"Verdict: hang. Rank(s) {', '.join(map(str, culprits))} never arrived; "
                f"{h.get('waiting_count', 'the other')} stuck rank(s) wait for them.")
    else:
        head = "Verdict: hang. Ops are in flight, but no rank is missing from them."
    lines = [head]
    chains = h.get("wait_chains") or []
    lines += [f"  {s}" for s in h.get("explanation", []) if not (chains and _is_chain(s))]
    if chains:
        lines.append("  Wait chains (waiting rank -[operator it waits in]-> the rank it waits for ... root):")
        root_kinds = h.get("root_kinds") or {}
        dl = set(h.get("deadlock") or [])
        for ch in chains:
            end = ch[-1][-1]   # the rank the last link waits for
            tag = ("deadlock" if end in dl else {"no_log": "no log", "idle": "nothing in flight",
                                                  "stalled": "stopped inside", "inside": "inside"}
                   .get(root_kinds.get(str(end), ""), "root"))
            lines.append("    " + f"{ch[0][0]}" + "".join(f" -[{op} #{seq} {comm}]-> {to}" for _, op, comm, seq, to in ch)
                         + f"  ({tag})")
    for i, d in enumerate(devices, 1):
        conf = f"  confidence {d.confidence:.2f}" if d.confidence is not None else ""
        lines.append(f"  {i}. {d.id:<28}{conf}")
    comms = h.get("communicators", [])
    for c in comms[:SHOWN_COMMUNICATORS]:
        p2p = f" {'to' if c['op'] == 'send' else 'from'} {c['peer']}" if c.get("peer") is not None else ""
        lines.append(f"  {c['comm_id']}: stuck on {c['op'] or 'a collective'} #{c['seq']}{p2p}; missing {c['missing']}, "
                     f"{len(c['waiting'])} rank(s) waiting")
    if len(comms) > SHOWN_COMMUNICATORS:
        lines.append(f"  ... {len(comms) - SHOWN_COMMUNICATORS} more communicator(s)")
    if h.get("ranks_without_log"):
        lines.append(f"  Ranks without a log (prime suspects): {h['ranks_without_log']}")
    return lines
