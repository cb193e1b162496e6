"""The project's own documentation stands alone.

Invariants pinned:
- every test that ``docs/design.md`` names as pinning an invariant or a decision exists: the file, and a
  ``def`` of that name in it (a renamed test breaks this, not the doc silently);
- nothing in ``src/``, ``docs/``, ``tests/``, ``bench/``, ``scripts/``, ``examples/`` or ``README.md`` cites a
  document that is not in the repository (design notes, numbered sections, seed write-ups, upstream specs):
  a reader who clones the project can follow every pointer;
- the README links the design document.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
TEST_REFERENCE = re.compile(r"`(tests/test_\w+\.py)::(test_\w+)`")

# Pointers into notes that live outside the repository. Built from pieces so this file does not match itself.
OUTSIDE_CITATIONS = [
    re.compile(pattern)
    for pattern in (
        r"\bDESIGN\b",
        "\u00a7",  # a numbered section of some other document
        r"\bseed[ -]?0{2}\d",
        r"\bfeasibility\b",
        r"\bupstream\b",
        r"\breference(/|\s*\u00a7)",
        r"shared/(reference|seeds|DESIGN)",
        r"the reviewer's",
    )
]
SCANNED = ("src", "docs", "tests", "bench", "scripts", "examples")
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt"}


def scanned_files() -> list[Path]:
    files = [ROOT / "README.md"]
    for top in SCANNED:
        files += [p for p in (ROOT / top).rglob("*") if p.is_file() and p.suffix in SUFFIXES]
    return sorted(p for p in files if p != Path(__file__).resolve() and "__pycache__" not in p.parts)


def test_every_test_the_design_names_exists():
    references = TEST_REFERENCE.findall(DESIGN.read_text(encoding="utf-8"))
    assert len(references) >= 30, "docs/design.md should name the tests that pin each invariant"
    missing = []
    for path, name in references:
        source = ROOT / path
        if not source.is_file() or not re.search(rf"^(async )?def {name}\(", source.read_text(), re.M):
            missing.append(f"{path}::{name}")
    assert not missing, f"docs/design.md names tests that do not exist: {missing}"


@pytest.mark.parametrize("pattern", OUTSIDE_CITATIONS, ids=lambda p: p.pattern)
def test_nothing_cites_a_document_outside_the_repository(pattern):
    hits = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}"
        for path in scanned_files()
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1)
        if pattern.search(line)
    ]
    assert not hits, "say the point in place or cite docs/design.md:\n" + "\n".join(hits)


def test_the_readme_links_the_design():
    assert "(docs/design.md)" in (ROOT / "README.md").read_text(encoding="utf-8")
