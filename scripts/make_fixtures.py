"""Regenerate the example jobs under ``fixtures/`` (see holmes/simulate/fixtures.py).

Usage::

    python scripts/make_fixtures.py [--root fixtures] [NAME ...]

Prints each fixture's size and fails (exit 1) if one exceeds 1 MB.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from holmes.eval.fixtures import FIXTURES, make_fixtures  # noqa: E402

LIMIT = 1 << 20


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=str(Path(__file__).resolve().parents[1] / "fixtures"))
    ap.add_argument("names", nargs="*", help="fixtures to regenerate (default: all)")
    args = ap.parse_args(argv)
    unknown = [n for n in args.names if n not in FIXTURES]
    if unknown:
        ap.error(f"unknown fixture(s) {unknown}; known: {', '.join(FIXTURES)}")
    sizes = make_fixtures(args.root, args.names or None)
    bad = 0
    for name, size in sizes.items():
        flag = "" if size <= LIMIT else "  TOO BIG"
        bad += size > LIMIT
        print(f"{name:28s} {size / 1024:8.1f} KB{flag}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
