"""One self-contained HTML page of a localization report (``holmes report JOB -o report.html``).

The page opens offline: styles, the one small script (a read-out of the heatmap under the mouse)
and every image are inline, and a Content-Security-Policy forbids any network fetch. The summary
(verdict, devices, causes, hang table) is plain HTML and every figure plain SVG, so all of it
reads without JavaScript. Figures (``docs/report.md``):

* **heatmap** of the ranks' slowness (compute over their peers') over ranks x iterations, ranks
  ordered by parallel group, the pivot's irregular iterations marked (needs the job);
* the **pivot's iteration times** with the usual level and the ``delta`` threshold;
* the **traced paths** of the top causes through the communication-operator graph, ranks grouped
  by tensor-parallel group at (pipeline stage, data-parallel replica), the followed edges drawn;
* the **cluster** (hosts and switches) with the implicated devices;
* per-device **what-if impact** and the **hang** table when those analyses found something.

Examples
--------
>>> import holmes
>>> job = holmes.read_job("fixtures/gpu64-3d-slow-gpu")
>>> page = render_html(holmes.localize(job), job=job)
>>> page.startswith("<!DOCTYPE html>"), 'data-verdict="culprit"' in page, "http://" in page.replace(
...     'xmlns="http://www.w3.org/2000/svg"', "")
(True, True, False)
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from holmes.errors import ConfigError
from holmes.report.figures import cause_paths, impact_svg, path_graph_svg, paths_text, series_svg
from holmes.report.heatmap import describe, heatmap_svg, slowness_map
from holmes.report.page import PAGE_CSS, PAGE_JS
from holmes.report.svg import esc
from holmes.report.topology_svg import legend_html, topology_svg
from holmes.topology import kinds

__all__ = ["render_html", "write_html"]

log = logging.getLogger(__name__)


def _open_job(job: Any) -> Any:
    if job is None or hasattr(job, "ops"):
        return job
    if isinstance(job, (str, os.PathLike)):
        from holmes.io import read_job

        return read_job(job)
    raise ConfigError(f"job must be a job directory, Job or MemoryJob, not {type(job).__name__}")


def _topology(report: Any, job: Any, topology: Any, notes: list[str]) -> Any:
    from holmes.topology import ClusterTopology, default_topology
    from holmes.topology.cluster import load_topology

    if isinstance(topology, ClusterTopology):
        return topology
    if topology is not None:
        return load_topology(topology)
    topo = getattr(job, "topology", None) if job is not None else None
    if topo is None and report.world_size > 0:
        topo = default_topology(report.world_size)
        notes.append("no topology.json: the default rail-optimized cluster is drawn")
    return topo


def render_html(report: Any, job: Any = None, *, topology: Any = None, max_ranks: int = 512, max_rows: int = 512,
                title: str | None = None) -> str:
    """The report as one self-contained HTML page.

    Parameters
    ----------
    report : Report
        What :func:`holmes.localize` returned.
    job : path, Job or MemoryJob, optional
        The job localized: adds the heatmap (its ranks' logs are read, at most ``max_ranks``), the
        parallel groups of the path graph and the job's topology. Without it those parts say so.
    topology : ClusterTopology or path, optional
        The cluster drawn (default: the job's ``topology.json``, else the default cluster).
    max_ranks : int, default 512
        Ranks' logs read for the heatmap (the ones the report points at first).
    max_rows : int, default 512
        Heatmap rows at most; above, consecutive ranks of a stage are merged (their maximum shown).
    title : str, optional

    Returns
    -------
    str
    """
    job = _open_job(job)
    notes: list[str] = []
    layout = getattr(job, "layout", None) if job is not None else None
    topo = _topology(report, job, topology, notes)
    named = list(report.devices)
    shown = named or list(report.candidates)
    top_ids = {d.id for d in shown}
    gpu_ranks = {r for d in shown if (r := kinds.rank_of(d.id)) is not None}
    paths = cause_paths(report.root_causes, top_ids)
    on_path = sorted({r for p in paths for r, _ in p})
    name = title or (f"Holmes report: {Path(str(job.path)).name}" if job is not None and hasattr(job, "path")
                     else "Holmes report")
    body = [f"<header><h1>{esc(name)}</h1>{_verdict(report)}</header>",
            _section("summary", "Summary", _summary(report)),
            _section("heatmap-section", "Slowness of every rank",
                     _heatmap(report, job, layout, gpu_ranks, on_path, max_ranks, max_rows)),
            _section("series-section", "Iteration times of the pivot", _series(report, job)),
            _section("paths-section", "Traced paths through the communication-operator graph",
                     _paths(report, paths, layout, gpu_ranks)),
            _section("topology-section", "Implicated devices in the cluster", _cluster(report, topo, notes)),
            _section("impact-section", "What-if impact", _impact(report)),
            _section("ranks-section", "Per-rank time per step", _rank_table(report, gpu_ranks))]
    if report.hang:
        body.append(_section("hang-section", "Hang", _hang(report.hang)))
    body.append(_section("causes-section", "Root causes", _causes(report)))
    body.append(_section("assumptions-section", "Assumptions and parameters", _assumptions(report, notes)))
    csp = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
           "connect-src 'none'; font-src 'none'")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"{csp}\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{esc(name)}: {esc(report.verdict)}</title><style>{PAGE_CSS}</style></head>"
            f"<body>{''.join(body)}<script>{PAGE_JS}</script></body></html>\n")


def write_html(report: Any, path: str | os.PathLike[str], job: Any = None, *, overwrite: bool = False,
               **options: Any) -> Path:
    """Write :func:`render_html` to ``path`` atomically (never inside the job directory; an
    existing file only with ``overwrite``); returns the path."""
    from holmes.io.outputs import atomic_write_text, check_output

    inputs = [job] if isinstance(job, (str, os.PathLike)) else [getattr(job, "path", None)]
    check_output(path, inputs=inputs, overwrite=overwrite)
    page = render_html(report, job=job, **options)
    return atomic_write_text(path, page, overwrite=overwrite, inputs=inputs)


def _section(sid: str, heading: str, content: str) -> str:
    return f'<section id="{sid}"><h2>{esc(heading)}</h2>{content}</section>'


def _verdict(report: Any) -> str:
    v = report.verdict
    what = {"culprit": "devices named", "healthy": "nothing to explain", "hang": "the job hung",
            "inconclusive": "no device named with confidence"}.get(v, "")
    top = f" &mdash; {esc(report.devices[0].id)}" if v == "culprit" and report.devices else ""
    return f'<p id="verdict" class="verdict {esc(v)}" data-verdict="{esc(v)}">Verdict: <b>{esc(v)}</b> ({what}){top}</p>'


def _fmt(x: float | None, spec: str, suffix: str = "") -> str:
    return "&ndash;" if x is None or not np.isfinite(x) else f"{x:{spec}}{suffix}"


def _device_table(devs: list[Any], tid: str) -> str:
    rows = "".join(
        f'<tr data-device="{esc(d.id)}"><td>{i}</td><td><b>{esc(d.id)}</b></td><td>{esc(d.kind)}</td>'
        f"<td>{_fmt(d.confidence, '.2f')}</td><td>{_fmt(d.coverage, '.0%')}</td><td>{_fmt(d.impact_pct, '.1f', '%')}</td>"
        f"<td>{_fmt(d.score, '.3f')}</td><td>{d.causes}</td><td>{esc(', '.join(d.evidence))}</td></tr>"
        for i, d in enumerate(devs, 1))
    return (f'<table id="{tid}"><thead><tr><th>#</th><th>device</th><th>kind</th><th>confidence</th>'
            "<th>coverage</th><th>impact</th><th>score</th><th>causes</th><th>evidence</th></tr></thead>"
            f"<tbody>{rows}</tbody></table>")


def _summary(report: Any) -> str:
    n_it = len(report.window)
    out = [f"<p>{len(report.irregular_iterations)} irregular iteration(s) of {n_it} in the window on pivot "
           f"rank(s) {esc(', '.join(map(str, report.pivots)) or '-')}; read {len(report.fetched)} of "
           f"{report.world_size} ranks ({report.bytes_read / 1e6:.1f} MB).</p>"]
    if report.devices:
        out.append("<h3>Devices named</h3>" + _device_table(report.devices, "devices"))
    elif report.candidates:
        out.append("<h3>Candidates (below the confidence needed)</h3>" + _device_table(report.candidates, "devices"))
    else:
        out.append('<p id="devices" class="note">No device is implicated.</p>')
    if report.slowdown is not None:
        out.append(f"<p>Straggling slowdown: the step is <b>{report.slowdown:.3f}x</b> the ideal (what-if replay).</p>")
    nd = report.non_device_cause
    if nd:
        where = f" (stage {esc(nd['stage'])})" if "stage" in nd else ""
        out.append(f"<p>Non-device cause: <b>{esc(str(nd.get('kind', '')).replace('_', ' '))}</b>{where}; "
                   "no device explains the slowdown.</p>")
    if report.missing:
        out.append(f"<p>Missing or unreadable ranks: {esc(', '.join(map(str, sorted(report.missing))))}</p>")
    return "".join(out)


def _heatmap(report: Any, job: Any, layout: Any, gpu_ranks: set[int], on_path: list[int], max_ranks: int,
             max_rows: int) -> str:
    if job is None:
        return '<p class="note">Pass the job (holmes report JOB, Report.to_html(job=...)) for the heatmap.</p>'
    # the named GPUs, their tensor-parallel groups and the traced ranks first (a quarter of the
    # budget at most), then ranks spread evenly over the stages (the peers the cells compare with)
    focus = sorted(gpu_ranks) + [m for r in sorted(gpu_ranks) if layout is not None for m in layout.group_of(r, "tp")]
    focus = list(dict.fromkeys(focus + on_path))[:max(len(gpu_ranks), max_ranks // 4)]
    its = report.window or None
    m = slowness_map(job, iterations=its, layout=layout, focus=focus, max_ranks=max_ranks)
    shown = m.binned(max_rows)
    marked: dict[int, str] = {}
    for d in report.devices or report.candidates:  # the named GPUs and NICs, labelled by their ids
        r = kinds.rank_of(d.id)
        if r is not None:
            marked[r] = f"{marked[r]}, {d.id}" if r in marked else d.id
    return (f"<p>Each cell: a rank's compute in an iteration over the median of its peers' (same pipeline "
            f"stage); red is slower. Triangles mark the pivot's irregular iterations. {describe(shown)}.</p>"
            + heatmap_svg(shown, irregular=report.irregular_iterations, marked=marked)
            + '<p id="heatmap-readout" class="note">&nbsp;</p>')


def _series(report: Any, job: Any) -> str:
    from holmes.detect.monitor import IrregularityRule

    delta = float(report.params.get("delta", 1.1) or 1.1)
    pivot = report.pivots[0] if report.pivots else 0
    got = getattr(report, "iteration_ns", None)
    if got:
        its = sorted(int(i) for i in got)
        durs = [float(got[i]) for i in its]
    elif job is not None and report.window:
        try:
            it_all, d_all = job.iteration_times(pivot)
        except Exception as exc:  # noqa: BLE001 - a figure is left out, the page still renders
            return f'<p class="note">The pivot\'s iteration times could not be read: {esc(exc)}</p>'
        keep = (it_all >= report.window[0]) & (it_all <= report.window[-1])
        its, durs = it_all[keep].tolist(), d_all[keep].astype(float).tolist()
    else:
        return '<p class="note">No iteration times in the report (pass the job).</p>'
    if not its:
        return '<p class="note">No iteration in the window.</p>'
    usual = getattr(report, "usual_iteration_ns", None) or IrregularityRule(delta).reference(durs)
    others = {}
    if job is not None:
        for r in report.pivots[1:4]:
            try:
                oi, od = job.iteration_times(r)
                others[r] = (oi.tolist(), od.astype(float).tolist())
            except Exception:  # noqa: BLE001 - a monitor without iterations is left out
                continue
    explained = {c.iteration for c in report.root_causes}
    return (f"<p>Rank {pivot}'s iteration times; an iteration above {delta:g} x the usual level (its 10th "
            "percentile) is irregular. Filled dots: a root cause was found.</p>"
            + series_svg(its, durs, threshold_ns=delta * usual, usual_ns=usual, irregular=report.irregular_iterations,
                         explained=explained, rank=pivot, others=others))


def _paths(report: Any, paths: list, layout: Any, gpu_ranks: set[int]) -> str:
    if not paths:
        return '<p class="note">No traced path: no root cause was found by the search.</p>'
    listing = "".join(f"<li>{esc(text)} <span class=\"note\">({n} cause(s))</span></li>"
                      for text, n in paths_text(paths))
    return ("<p>Each arrow: the search went from one rank's operator to another rank's (the member that "
            "entered last, or a P2P peer); wider arrows were followed by more causes. Boxes are "
            "tensor-parallel groups at (pipeline stage, data-parallel replica).</p>"
            + path_graph_svg(paths, layout=layout, culprits=gpu_ranks, pivots=set(report.pivots))
            + f'<ol id="path-list">{listing}</ol>')


def _cluster(report: Any, topo: Any, notes: list[str]) -> str:
    if topo is None:
        return '<p class="note">No topology.</p>'
    hi = {d.id: "candidate" for d in report.candidates}
    hi.update({d.id: "named" for d in report.devices})
    for d in report.all_devices[:8]:
        hi.setdefault(d.id, "candidate" if not report.devices else "other")
    hi = {k: v for k, v in hi.items() if v != "other"}
    note = "".join(f'<p class="note">{esc(n)}</p>' for n in notes if "topology" in n)
    return note + f"<p>{legend_html()}</p>" + topology_svg(topo, hi, ranks=list(report.pivots[:1]))


def _impact(report: Any) -> str:
    items = [(d.id, float(d.impact_pct)) for d in report.all_devices if d.impact_pct is not None][:12]
    if not items:
        return ('<p class="note">No per-device what-if estimate (the persistent analysis did not run or '
                "found no straggler).</p>")
    return ("<p>How much shorter the step would be without each device (replay of the operator graph).</p>"
            + impact_svg(items))


def _rank_table(report: Any, named: set[int], limit: int = 32) -> str:
    """Each rank's compute, waiting and transfer per step beside its peers' (HTA's breakdown)."""
    every = list(getattr(report, "rank_summary", None) or [])
    if not every:
        return '<p class="note">No per-rank summary (a hang, or no rank log read).</p>'
    rows = report.rank_rows(limit) if hasattr(report, "rank_rows") else every[:limit]
    steps = max(x["steps"] for x in every)
    cut = "" if len(rows) == len(every) else (f" The {len(rows)} ranks furthest from their peers (and the named "
                                               f"ones) of {len(every)} read; the JSON report holds every one.")
    head = ("<p>Median per step over " + esc(steps) + " iteration(s): time computing (between communication "
            "operators), waiting inside an operator for a later member, and transferring; in brackets the "
            "median of its peers (the ranks of its pipeline stage)." + esc(cut) + "</p>")

    def cell(v: float, peers: float) -> str:
        return f"<td>{v:.1f} <span class=\"note\">({peers:.1f})</span></td>"

    body = []
    for x in rows:
        vs = x.get("compute_vs_peers")
        off = vs is not None and abs(vs - 1) >= 0.1
        cls = ' class="named"' if x["rank"] in named else (' class="off"' if off else "")
        body.append(f'<tr{cls} data-rank="{int(x["rank"])}"><td>{int(x["rank"])}</td><td>{int(x["stage"])}</td>'
                    + cell(x["compute_ms"], x["peers_compute_ms"]) + cell(x["waiting_ms"], x["peers_waiting_ms"])
                    + cell(x["transfer_ms"], x["peers_transfer_ms"])
                    + f"<td>{'-' if vs is None else f'{vs:.2f}x'}</td></tr>")
    return (head + '<table id="rank-table"><thead><tr><th>rank</th><th>stage</th><th>compute ms</th>'
            "<th>waiting ms</th><th>transfer ms</th><th>compute / peers</th></tr></thead><tbody>"
            + "".join(body) + "</tbody></table>")


def _hang(h: dict[str, Any]) -> str:
    from holmes.report.hang_svg import chains_svg

    culprits = h.get("culprit_ranks") or []
    if h.get("deadlock"):
        out = [f"<p>Deadlock: ranks <b>{esc(', '.join(map(str, h['deadlock'])))}</b> wait for each other</p>"]
    else:
        out = [f"<p>Ranks that never arrived (the roots): <b>{esc(', '.join(map(str, culprits)) or 'none')}</b>; "
               f"{esc(h.get('waiting_count', 0))} stuck rank(s) wait behind them</p>"]
    out += [f"<p>{esc(s)}</p>" for s in h.get("explanation", []) if not _is_chain(s)]
    svg = chains_svg(h.get("wait_chains") or [], roots=culprits, deadlock=h.get("deadlock") or [])
    if svg:
        out.append('<p class="note">Wait chains: each waiting rank, the operator it waits in, the rank it '
                   "waits for, down to a root</p>" + f'<div class="figure">{svg}</div>')
    rows = "".join(f"<tr><td>{esc(c.get('comm_id'))}</td><td>{esc(c.get('op') or 'a collective')}</td>"
                   f"<td>{esc(c.get('seq'))}</td><td>{esc(', '.join(map(str, c.get('missing', []))))}</td>"
                   f"<td>{len(c.get('waiting', []))}</td></tr>" for c in h.get("communicators", [])[:200])
    out.append('<table id="hang-table"><thead><tr><th>communicator</th><th>stuck on</th><th>seq</th>'
               f"<th>missing ranks</th><th>ranks waiting</th></tr></thead><tbody>{rows}</tbody></table>")
    if h.get("ranks_without_log"):
        out.append(f"<p>Ranks without a log (prime suspects): {esc(h['ranks_without_log'])}</p>")
    return "".join(out)


def _is_chain(sentence: str) -> bool:
    """An explanation sentence that spells a wait chain (drawn instead)."""
    head = sentence.split(";", 1)[0]
    return head.startswith("rank ") and " waits in " in head


def _causes(report: Any, limit: int = 30) -> str:
    if not report.root_causes:
        return '<p class="note">None.</p>'
    rows = []
    for c in report.root_causes[:limit]:
        ranks = ", ".join(map(str, c.ranks[:8])) + (", ..." if len(c.ranks) > 8 else "")
        hops = " \u2192 ".join(f"{s.get('op')}@{s.get('rank')}" for s in c.evidence)
        rows.append(f"<tr><td>{c.iteration}</td><td>{esc(c.cause)}</td><td>{esc(ranks)}</td>"
                    f"<td>{esc(c.op.get('op'))} [{esc(c.op.get('comm_id'))}]</td><td>{c.rate:.2f}</td>"
                    f"<td class=\"path\">{esc(hops)}</td></tr>")
    more = f'<p class="note">... {len(report.root_causes) - limit} more</p>' if len(report.root_causes) > limit else ""
    return ('<table id="causes"><thead><tr><th>iteration</th><th>cause</th><th>ranks</th><th>operator</th>'
            f"<th>R</th><th>path</th></tr></thead><tbody>{''.join(rows)}</tbody></table>{more}")


def _assumptions(report: Any, notes: list[str]) -> str:
    items = "".join(f"<li>{esc(a)}</li>" for a in list(report.assumptions) + notes)
    params = ", ".join(f"{k}={v}" for k, v in sorted(report.params.items()))
    return f"<ul>{items}</ul><p class=\"note\">Parameters: {esc(params)}</p>"
