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


def test_the_site_takes_no_script_style_or_font_from_a_network():
    """Every script and stylesheet the site adds is a file under docs/ (no CDN), the theme's text fonts
    are the system's (material loads Roboto from Google Fonts unless ``font: false``), and no
    stylesheet shipped with the site reaches out with ``url(http...)`` or ``@import``."""
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    added = [a if isinstance(a, str) else a["path"] for a in config.get("extra_javascript", []) + config.get("extra_css", [])]
    assert added, "the math renderer's script and style are listed in mkdocs.yml"
    for asset in added:
        assert not re.match(r"(https?:)?//", asset), f"{asset}: served from a network"
        assert (ROOT / "docs" / asset).is_file(), f"{asset}: not under docs/"
    assert config["theme"].get("font") is False
    assert "custom_dir" not in config["theme"], "check the theme overrides' <script>/<link> too"
    for css in (ROOT / "docs").rglob("*.css"):
        text = css.read_text()
        assert not re.search(r"url\(\s*['\"]?(https?:)?//|@import", text), f"{css}: fetches from a network"
