"""The documentation keeps up with the repository: every committed results table is on the results page, the
README stays a front door, and every Python example of docs/ runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

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


def python_examples() -> list[tuple[str, int, str]]:
    """(page, index, code) of every ```python block of docs/."""
    found = []
    for page in sorted((ROOT / "docs").glob("*.md")):
        blocks = re.findall(r"^```python\n(.*?)^```", page.read_text(), re.S | re.M)
        found += [(page.name, i, code) for i, code in enumerate(blocks)]
    return found


#: The examples that load the real backbone, play real games or compile many fits (10 s and more on
#: a CPU; run with -m slow).
SLOW_EXAMPLES = {("getting-started.md", 0), ("agents.md", 0), ("lm-backends.md", 0), ("lm-backends.md", 1),
                 ("lm-backends.md", 2),
                 ("concept.md", 0), ("concept.md", 2), ("concept.md", 3)}


@pytest.mark.parametrize("page, index, code", [
    pytest.param(page, index, code, id=f"{page}:{index}",
                 marks=[pytest.mark.slow] if (page, index) in SLOW_EXAMPLES else [])
    for page, index, code in python_examples()])
def test_every_python_example_in_the_docs_runs_as_written(page, index, code, tmp_path, monkeypatch,
                                                          no_executable_store):
    """Each block runs as it is printed, in a fresh namespace, in an empty folder with its own
    cache; a block that defines ``test_*`` functions (a property test) has them called too. The
    persistent compile cache a block turns on is this process's, so its state is put back after."""
    import jax

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CB_AGENT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(jax.config, "update", lambda name, value: None)
    namespace = {"__name__": f"docs_{page.removesuffix('.md').replace('-', '_')}_{index}"}
    exec(compile(code, f"docs/{page} example {index}", "exec", dont_inherit=True), namespace)  # noqa: S102 - the documented code
    for name, value in list(namespace.items()):
        if name.startswith("test_") and callable(value):
            value()
