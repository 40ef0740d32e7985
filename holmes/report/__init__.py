"""The HTML report of a localization: one self-contained page (``holmes report JOB -o FILE``).

:func:`render_html` / :func:`write_html` turn a :class:`~holmes.localize.Report` (and the job, for
the heatmap) into the page; :func:`slowness_map` measures every rank's compute against its peers'.
The figures are inline SVG generated here, no plotting library (``docs/report.md``).
"""

from holmes.report.heatmap import SlownessMap, rank_order, slowness_map
from holmes.report.html import render_html, write_html

__all__ = ["render_html", "write_html", "slowness_map", "SlownessMap", "rank_order"]
