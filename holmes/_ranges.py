"""Integer lists written as ranges, ``"0,3,8-11"``: parsed and formatted."""

from __future__ import annotations

__all__ = ["parse_int_ranges", "format_int_ranges", "DEFAULT_MAX_ITEMS"]

#: How many integers a range list may expand to when the caller gives no bound (checked before
#: anything is expanded; see ``docs/limits.md``).
DEFAULT_MAX_ITEMS = 1 << 20


def parse_int_ranges(text: str, *, lo: int | None = 0, hi: int | None = None,
                     max_items: int | None = None) -> list[int]:
    """``"0,3,8-11"`` -> ``[0, 3, 8, 9, 10, 11]`` (sorted, each once; blanks between commas ignored).

    Every bound is checked *before* a range is expanded, so ``"0-50000000"`` costs nothing:
    values must lie in ``[lo, hi)`` (``lo`` 0 by default; None: no bound), and the total count may not exceed ``max_items``
    (default :data:`DEFAULT_MAX_ITEMS`, or ``hi - lo`` when both bounds are given).

    Raises ``ValueError`` on anything else (a non-integer, a reversed range ``5-2``, a value out
    of bounds, too many values); callers turn it into a :class:`holmes.HolmesError` that names the
    option or spec.

    >>> parse_int_ranges("8-10, 0,3")
    [0, 3, 8, 9, 10]
    >>> parse_int_ranges("0-50000000", hi=64)
    Traceback (most recent call last):
    ...
    ValueError: 50000000 is outside world_size 64
    """
    if not isinstance(text, str):
        raise ValueError(f"expected a string of ranges, not {type(text).__name__}")
    if len(text) > 1_000_000:
        raise ValueError("range list is longer than 1,000,000 characters")
    if max_items is None:
        max_items = (hi - (lo or 0)) if hi is not None else DEFAULT_MAX_ITEMS
    spans: list[tuple[int, int]] = []
    total = 0
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part[1:]:
            i = part.index("-", 1)
            a, b = int(part[:i]), int(part[i + 1:])
            if b < a:
                raise ValueError(f"reversed range {part!r}")
        else:
            a = b = int(part)
        for v in (a, b):
            if (lo is not None and v < lo) or (hi is not None and v >= hi):
                bound = f"world_size {hi}" if hi is not None else f">= {lo}"
                raise ValueError(f"{v} is outside {bound}" if hi is not None else f"{v} is not {bound}")
        total += b - a + 1
        if total > max_items:
            raise ValueError(f"ranges name more than {max_items} values")
        spans.append((a, b))
    out: set[int] = set()
    for a, b in spans:
        out.update(range(a, b + 1))
    return sorted(out)


def format_int_ranges(values: object, limit: int | None = None) -> str:
    """Sorted distinct integers as ``'3,8-11,19'``, the inverse of :func:`parse_int_ranges`; at
    most ``limit`` pieces, then ``',...'``.

    >>> format_int_ranges([8, 9, 10, 11, 19, 3])
    '3,8-11,19'
    >>> format_int_ranges(range(0, 20, 2), limit=3)
    '0,2,4,...'
    >>> parse_int_ranges(format_int_ranges([5, 1, 2, 3]))
    [1, 2, 3, 5]
    """
    vs = sorted({int(v) for v in values})  # type: ignore[attr-defined]
    parts: list[str] = []
    i = 0
    while i < len(vs):
        j = i
        while j + 1 < len(vs) and vs[j + 1] == vs[j] + 1:
            j += 1
        parts.append(str(vs[i]) if i == j else f"{vs[i]}-{vs[j]}")
        i = j + 1
    if limit is not None and len(parts) > limit:
        return ",".join(parts[:limit]) + ",..."
    return ",".join(parts)
