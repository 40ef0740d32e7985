"""Small drawing helpers for the HTML report: escaping, SVG elements, a colour scale, PNG images.

Everything is generated in Python as text (inline SVG) or bytes (a PNG for dense images such as
the heatmap); the page needs no plotting library (``docs/report.md`` says why).

Examples
--------
>>> el("rect", x=1, y=2, width=3, height=4, cls="cell")
'<rect x="1" y="2" width="3" height="4" class="cell"/>'
>>> el("text", "a < b", x=0, y=0)
'<text x="0" y="0">a &lt; b</text>'
>>> png_bytes(np.zeros((2, 3, 3), np.uint8))[:8]
b'\\x89PNG\\r\\n\\x1a\\n'
>>> slowness_rgb(np.array([1.0, 2.5, np.nan]))[:, 0].tolist()
[247, 165, 221]
"""

from __future__ import annotations

import base64
import html
import math
import struct
import zlib
from typing import Any

import numpy as np

__all__ = ["esc", "el", "num", "png_bytes", "png_data_uri", "slowness_rgb", "SLOWNESS_STOPS", "MISSING_RGB",
           "svg_open"]

#: slowness (a rank's compute over its peers') -> colour; values between stops are interpolated
SLOWNESS_STOPS: tuple[tuple[float, tuple[int, int, int]], ...] = (
    (0.6, (69, 117, 180)),     # much faster than its peers
    (0.85, (171, 217, 233)),
    (1.0, (247, 247, 247)),    # as its peers
    (1.15, (254, 224, 139)),
    (1.4, (244, 109, 67)),
    (2.0, (165, 0, 38)),       # twice its peers' compute and more
)
#: cells without data (rank not read, iteration absent)
MISSING_RGB = (221, 221, 221)


def esc(text: Any) -> str:
    """HTML/XML-escaped text (quotes too)."""
    return html.escape(str(text), quote=True)


def num(x: float, digits: int = 1) -> str:
    """A short number for coordinates (no trailing zeros).

    >>> num(3.0), num(2.25), num(float("nan"))
    ('3', '2.2', '0')
    """
    if x is None or not math.isfinite(x):
        return "0"
    s = f"{x:.{digits}f}".rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


def el(tag: str, text: str | None = None, *, raw: str | None = None, **attrs: Any) -> str:
    """One SVG/HTML element: ``attrs`` as attributes (``cls`` -> ``class``, ``_`` -> ``-``, floats
    shortened, None skipped); ``text`` escaped, ``raw`` inserted as is (child elements)."""
    parts = [tag]
    for k, v in attrs.items():
        if v is None:
            continue
        name = "class" if k == "cls" else k.rstrip("_").replace("_", "-")
        val = num(v, 2) if isinstance(v, float) else v
        parts.append(f'{name}="{esc(val)}"')
    head = " ".join(parts)
    if text is None and raw is None:
        return f"<{head}/>"
    body = (esc(text) if text is not None else "") + (raw or "")
    return f"<{head}>{body}</{tag}>"


def svg_open(width: float, height: float, **attrs: Any) -> str:
    """The opening ``<svg>`` tag of a figure of the given size (scales down with the page)."""
    a = " ".join(f'{"class" if k == "cls" else k.replace("_", "-")}="{esc(v)}"' for k, v in attrs.items())
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{num(width)}" height="{num(height)}" '
            f'viewBox="0 0 {num(width)} {num(height)}" {a}>')


def slowness_rgb(values: np.ndarray) -> np.ndarray:
    """Colours (``values.shape + (3,)``, uint8) of slowness values; NaN -> :data:`MISSING_RGB`."""
    v = np.asarray(values, dtype=float)
    xs = np.array([s for s, _ in SLOWNESS_STOPS])
    cols = np.array([c for _, c in SLOWNESS_STOPS], dtype=float)
    flat = v.ravel()
    finite = np.isfinite(flat)
    out = np.empty((flat.size, 3), dtype=np.uint8)
    safe = np.where(finite, flat, 1.0)
    for ch in range(3):
        out[:, ch] = np.rint(np.interp(safe, xs, cols[:, ch])).astype(np.uint8)
    out[~finite] = MISSING_RGB
    return out.reshape(v.shape + (3,))


def png_bytes(rgb: np.ndarray) -> bytes:
    """A PNG file (8-bit RGB, no interlace) of an ``(height, width, 3)`` uint8 array."""
    a = np.ascontiguousarray(rgb, dtype=np.uint8)
    if a.ndim != 3 or a.shape[2] != 3 or a.shape[0] < 1 or a.shape[1] < 1:
        raise ValueError(f"expected a non-empty (height, width, 3) array, got shape {a.shape}")
    h, w, _ = a.shape
    raw = np.concatenate([np.zeros((h, 1), np.uint8), a.reshape(h, w * 3)], axis=1).tobytes()

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def png_data_uri(rgb: np.ndarray) -> str:
    """``data:image/png;base64,...`` of :func:`png_bytes`."""
    return "data:image/png;base64," + base64.b64encode(png_bytes(rgb)).decode("ascii")
