"""The contracts a user needs live in docs/ and nothing in the package or its docs points outside it."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _texts():
    yield REPO / "README.md"
    yield from sorted((REPO / "docs").glob("*.md"))
    yield from sorted((REPO / "holmes").rglob("*.py"))
    yield from sorted((REPO / "examples").rglob("*.py"))


def test_no_reference_to_files_outside_the_repository():
    bad = []
    for path in _texts():
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if "DESIGN.md" in line or "../shared" in line or re.search(r"\bDESIGN\b", line):
                bad.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert not bad, "\n".join(bad)


def test_the_contracts_are_documented():
    cli = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    for key in ("verdict", "devices", "root_causes", "irregular_iterations", "slowdown", "hang", "fetched_ranks",
                "world_size", "assumptions", "confidence", "impact_pct", "evidence"):
        assert f"`{key}`" in cli, key
    assert "--exit-code" in cli and "| 3 |" in cli and "| 1 |" in cli
    formats = (REPO / "docs" / "formats.md").read_text(encoding="utf-8")
    assert "compute/rank-00000.parquet" in formats and "## Device ids" in formats
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "docs/cli.md" in readme


def test_docs_links_resolve():
    """Every ``docs/NAME.md`` named in the README and docs exists."""
    missing = set()
    for path in _texts():
        for name in re.findall(r"docs/([A-Za-z0-9_.-]+\.md)", path.read_text(encoding="utf-8")):
            if not (REPO / "docs" / name).is_file():
                missing.add(f"{path.relative_to(REPO)} -> docs/{name}")
    assert not missing, sorted(missing)
