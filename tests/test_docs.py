"""The documentation keeps up with the repository: every committed results table is on the results page, and
the README stays a front door."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_committed_results_table_is_included_in_the_results_page():
    page = (ROOT / "docs" / "results.md").read_text()
    included = set(re.findall(r'--8<-- "results/([^"]+\.md)"', page))
    committed = {p.name for p in (ROOT / "results").glob("*.md")}
    assert committed - included == set(), "add these tables to docs/results.md (a --8<-- include with its command)"
    assert included - committed == set(), "docs/results.md includes tables that are not committed"


def test_the_readme_is_a_front_door_of_at_most_250_lines():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move the detail to docs/"
