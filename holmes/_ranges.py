"""Parsing integer lists written as ranges: ``"0,3,8-11"``."""

from __future__ import annotations

__all__ = ["parse_int_ranges"]


def parse_int_ranges(text: str) -> list[int]:
    """``"0,3,8-11"`` -> ``[0, 3, 8, 9, 10, 11]`` (sorted, each once; blanks between commas ignored).

    Raises ``ValueError`` on anything else (a non-integer, a reversed range ``5-2``); callers turn
    it into a :class:`holmes.HolmesError` that names the option or spec.

    >>> parse_int_ranges("8-10, 0,3")
    [0, 3, 8, 9, 10]
    """
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            a, b = (int(x) for x in part.split("-", 1))
            if b < a:
                raise ValueError(f"reversed range {part!r}")
            out.update(range(a, b + 1))
        else:
            out.add(int(part))
    return sorted(out)
