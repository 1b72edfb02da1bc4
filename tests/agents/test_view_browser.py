"""`cb-agent view` in a real browser (slow): headless Chromium (Debian's ``chromium``, driven by
Playwright through that binary) opens the page from disk with the network cut off, filters the list
to one episode, opens it, unfolds a decision and reads the candidate table: the recorded candidates,
terms and choice; and the page's success chart of the committed improve results (six rows) shows
every label apart from the others and inside the chart, as the browser lays the text out."""

from __future__ import annotations

import gzip
import itertools
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent_shell.cli import main
from test_view import sample_records, write

pytestmark = pytest.mark.slow


def test_the_page_shows_the_recorded_candidates_of_a_decision(tmp_path, offline_page):
    records = sample_records()
    res = CliRunner().invoke(main, ["view", str(write(tmp_path / "results.jsonl", records)),
                                    "--out", str(tmp_path / "page.html")])
    assert res.exit_code == 0, res.output
    page = offline_page
    page.goto((tmp_path / "page.html").as_uri())
    page.wait_for_selector("body[data-ready]")
    assert page.inner_text("#episode-count") == "4 of 4 episodes"
    page.select_option("#filter-agent", "cb-agent")
    page.fill("#filter-game", "b/")
    assert page.inner_text("#episode-count") == "1 of 4 episodes"
    page.click("tr.episode-row")
    rec = records[3]
    trial = rec["trials"][0]
    decision = trial["log"]["decisions"][0]
    page.click(f"#view button.unfold[data-step='{decision['step']}']")
    rows = page.eval_on_selector_all("table.cands tbody tr", """rows => rows.map(r => ({
        index: +r.dataset.index, text: r.querySelector('td.cand').firstChild.textContent.trim(),
        prior: +r.querySelector('td.prior').dataset.value, concept: +r.querySelector('td.concept').dataset.value,
        logp: +r.querySelector('td.logp').dataset.value, shown: r.querySelector('td.logp').textContent,
        chosen: r.classList.contains('is-chosen')}))""")
    steps = trial["trajectory"]["steps"]
    candidates = [c for c in steps[decision["step"]]["candidates"] if c not in ("look", "inventory", "help")]
    assert sorted(r["index"] for r in rows) == list(range(len(candidates)))
    assert [r["logp"] for r in rows] == sorted(decision["log_p"], reverse=True)  # ranked by log P
    for r in rows:
        i = r["index"]
        assert r["text"] == candidates[i]
        recorded = (decision["prior"][i], decision["concept"][i], decision["log_p"][i])
        assert (r["prior"], r["concept"], r["logp"]) == recorded
        assert r["shown"] == f"{decision['log_p'][i]:.3f}" and r["chosen"] == (i == decision["chosen"])
    assert [r["text"] for r in rows if r["chosen"]] == [decision["action"]]
    # two agents on one game side by side, the first differing step highlighted
    page.fill("#filter-game", "a/")
    page.select_option("#filter-agent", "react")
    page.click("tr.episode-row")
    page.select_option("#compare", index=1)
    assert page.locator("#view .episode").count() == 2
    assert "first step where they differ" in page.inner_text("#diff-note")
    assert page.locator("#view .step.first-diff").count() == 2
    assert page.errors == [] and page.refused == []  # read from disk alone


def test_the_success_chart_of_six_rows_shows_every_label_apart_and_inside(tmp_path, offline_page):
    plain = tmp_path / "improve_textworld.jsonl"
    committed = Path(__file__).resolve().parents[2] / "results" / "improve_textworld.results.jsonl.gz"
    plain.write_bytes(gzip.decompress(committed.read_bytes()))
    res = CliRunner().invoke(main, ["view", str(plain), "--out", str(tmp_path / "page.html")])
    assert res.exit_code == 0, res.output
    page = offline_page
    page.goto((tmp_path / "page.html").as_uri())
    page.wait_for_selector("body[data-ready]")
    chart, boxes = page.evaluate("""() => {
        const box = (e) => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
        const svg = document.querySelector("#summary .chart svg");
        return [box(svg), [...svg.querySelectorAll("text")].filter((t) => t.textContent.trim())
                .map((t) => [t.textContent, box(t)])];
    }""")
    texts = [t for t, _ in boxes]
    assert {"react", "prior-only", *(f"cb-agent (concept_round={i})" for i in range(4))} <= set(texts)  # legend
    assert sum(bool(re.fullmatch(r"\d+/\d+", t)) for t in texts) == 30  # won/n: six rows, four levels and "all"
    left, top, right, bottom = chart
    for text, (x0, y0, x1, y1) in boxes:
        assert left <= x0 and x1 <= right and top <= y0 and y1 <= bottom, (text, chart)
    apart = lambda a, b: a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1]
    assert [(s, t) for (s, a), (t, b) in itertools.combinations(boxes, 2) if not apart(a, b)] == []
    assert page.errors == [] and page.refused == []
