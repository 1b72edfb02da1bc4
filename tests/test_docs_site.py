"""The built documentation site reads offline (slow): ``mkdocs build --strict`` into a temporary
folder, then headless Chromium with the network cut off (tests/conftest.py's ``offline_page``)
opens the home page from disk and every page with math from a local server, and finds each formula
typeset by the KaTeX shipped with the site: no raw ``\\[`` or ``\\(`` left in the text."""

from __future__ import annotations

import functools
import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
#: the page's formulas: arithmatex's elements, those KaTeX typeset, its error marks, the fonts loaded
MATH = """() => ({
    math: document.querySelectorAll('.arithmatex').length,
    typeset: document.querySelectorAll('.arithmatex > .katex, .arithmatex > .katex-display').length,
    failed: document.querySelectorAll('.katex-error').length,
    fonts: [...document.fonts].filter(f => f.status === 'loaded').map(f => f.family)})"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]'")
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def typeset(page) -> dict:
    """The page's math once its fonts are in, and its article text."""
    page.wait_for_load_state("load")
    page.evaluate("document.fonts.ready.then(() => true)")
    return {**page.evaluate(MATH), "text": page.inner_text("article")}


def test_the_home_page_s_score_formula_renders_from_disk_with_no_network(site, offline_page):
    offline_page.goto((site / "index.html").as_uri())
    math = typeset(offline_page)
    assert "\\[" not in math["text"] and "\\(" not in math["text"]
    assert "score" in math["text"] and math["math"] >= 2
    assert math["typeset"] == math["math"] and math["failed"] == 0
    assert "KaTeX_Main" in math["fonts"] and "KaTeX_Math" in math["fonts"]
    assert offline_page.refused == []


def test_every_page_with_math_renders_served_locally_with_no_network(site, offline_page):
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    offline_page.allow(f"http://127.0.0.1:{server.server_port}/")
    pages = sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html") if 'class="arithmatex"' in p.read_text())
    assert {"index.html", "concept/index.html"} <= set(pages)
    try:
        for name in pages:
            offline_page.goto(f"http://127.0.0.1:{server.server_port}/{name}")
            math = typeset(offline_page)
            assert "\\[" not in math["text"] and "\\(" not in math["text"], name
            assert math["typeset"] == math["math"] > 0 and math["failed"] == 0, (name, math)
    finally:
        server.shutdown()
        server.server_close()
    assert offline_page.refused == [] and offline_page.errors == []
