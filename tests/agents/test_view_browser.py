"""`cb-agent view` in a real browser (slow): headless Chromium (Debian's ``chromium``, driven by
Playwright through that binary) opens the page from disk with the network cut off, filters the list to one episode, opens it,
unfolds a decision and reads the candidate table: the recorded candidates, terms and choice."""

from __future__ import annotations

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
