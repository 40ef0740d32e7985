"""Unit conversions, named once: the logs measure time in nanoseconds and sizes in bytes.

>>> 2_500_000 / NS_PER_MS, 3e9 / NS_PER_S
(2.5, 3.0)
"""

from __future__ import annotations

__all__ = ["NS_PER_MS", "NS_PER_S", "BYTES_PER_MB"]

#: nanoseconds in a millisecond
NS_PER_MS = 1e6
#: nanoseconds in a second
NS_PER_S = 1e9
#: bytes in a (decimal) megabyte, as the reports print sizes
BYTES_PER_MB = 1e6
