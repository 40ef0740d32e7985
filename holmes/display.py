"""How much of a long list a report, an assumption or a log line shows, named once.

These caps shape text for people; no verdict depends on them.
"""

from __future__ import annotations

__all__ = ["NOT_HEALTHY", "SHOWN_RANKS", "SHOWN_ITEMS", "SHOWN_TRANSIENTS", "SHOWN_MISSING", "SHOWN_COMMUNICATORS",
           "SHOWN_CAUSES", "SHOWN_ROWS", "SHOWN_RANGES", "LOGGED_RANKS", "EVIDENCE_DEVICES", "SHOWN_CANDIDATES",
           "SHOWN_SUSPECTS", "SHOWN_WAITING", "SHOWN_CHAINS",
           "SUMMARY_RANKS", "SHOWN_INPUT_CHARS"]

#: ranks listed in an assumption ("rank(s) 3, 5, 9 ...")
SHOWN_RANKS = 8
#: other items (scans set aside, a chain's columns) listed in an assumption
SHOWN_ITEMS = 4
#: one-off stalls named in an assumption
SHOWN_TRANSIENTS = 3
#: missing ranks listed in the text report (all with ``--all``)
SHOWN_MISSING = 5
#: communicators a hang report lists
SHOWN_COMMUNICATORS = 10
#: root causes the text report lists before folding
SHOWN_CAUSES = 10
#: rows of the per-rank table in the text report (all with ``--all``)
SHOWN_ROWS = 6
#: rank ranges an ``int_ranges`` string lists before "..."
SHOWN_RANGES = 12
#: ranks and devices a probe's log entry keeps
LOGGED_RANKS = 16
#: devices an evidence step keeps
EVIDENCE_DEVICES = 32
#: network candidates a log line names
SHOWN_CANDIDATES = 4
#: suspects a log line or an assumption names
SHOWN_SUSPECTS = 8
#: waiting ranks named in full in a hang line (more: the first SHOWN_ITEMS and "...")
SHOWN_WAITING = 8
#: wait chains a hang report draws (every root's longest first)
SHOWN_CHAINS = 16
#: ranks the per-rank summary of a report covers (those read, at most this many)
SUMMARY_RANKS = 512
#: characters of a bad input value an error message quotes
SHOWN_INPUT_CHARS = 80
#: how the report's assumptions end when they turn a verdict that would read healthy into
#: inconclusive (the text report repeats them under the verdict)
NOT_HEALTHY = "inconclusive, not healthy"
