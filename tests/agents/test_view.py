"""`cb-agent view`: the page's embedded data against the results file it was built from, its bad
input (a torn line, mixed settings, a missing file, an older eval-decisions file), and records
written before the per-candidate terms existed."""

from __future__ import annotations

import gzip
import re

import numpy as np
import orjson
import pytest
from click.testing import CliRunner

import cb_core
from agent_doubles import FakeLM, ScriptedEnv
from agent_shell.agents import CBAgent, ReActAgent
from agent_shell.agents.reflexion import Trial
from agent_shell.cli import main
from agent_shell.results import episode_record
from agent_shell.view import embedded
from envs.episode import Episode

DEMOS = {"fetch": ["DEMO-FETCH"], "open": ["DEMO-OPEN"]}
META = {"env": "scripted", "split": "test", "model": "fake-lm", "seed": 0, "budget": 4}


def concept(lm: FakeLM, task_type: str) -> cb_core.Concept:
    d = lm.hidden_size
    alpha = np.linspace(-1.5, 2.0, d + 1).astype(np.float32)
    meta = dict(backbone="fake-lm", features={}, gamma=0.8, lam=1.0, eps=1e-6, task_type=task_type,
                trajectories=[], versions={}, hidden_size=d)
    return cb_core.Concept(alpha, 0.8, 1e-6, meta)


def played(agent, name: str, task: str, meta: dict = META) -> dict:
    episode = Episode(ScriptedEnv(), task, 4)
    log = agent.run(episode)
    return orjson.loads(orjson.dumps(episode_record(name, task, [Trial(episode, log)], 1.0, dict(meta))))


def sample_records() -> list[dict]:
    """ReAct and prior-only on game a/1, CB-Agent (a concept per type) on a/1 and b/1, as results records."""
    lm = FakeLM([" think: look around", " go to desk 1", " go to window 1", " take key 1 from desk 1"])
    concepts = {"fetch": concept(lm, "fetch"), "open": concept(lm, "open")}
    return [played(ReActAgent(FakeLM([" go to desk 1", " think: hm", " examine wall 1"]), DEMOS), "react", "a/1"),
            played(CBAgent(FakeLM([" act"], prefer="desk"), DEMOS, concepts=None), "prior-only", "a/1"),
            played(CBAgent(lm, DEMOS, concepts=concepts), "cb-agent", "a/1"),
            played(CBAgent(lm, DEMOS, concepts=concepts), "cb-agent", "b/1")]


@pytest.fixture(scope="module")
def records() -> list[dict]:
    return sample_records()


def write(path, records, torn: bytes = b""):
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records) + torn)
    return path


def test_the_page_embeds_every_step_and_the_recorded_terms_of_every_decision(tmp_path, records):
    results = write(tmp_path / "results.jsonl", records)
    res = CliRunner().invoke(main, ["view", str(results), "--out", str(tmp_path / "page.html")])
    assert res.exit_code == 0, res.output
    page = (tmp_path / "page.html").read_text()
    # self-contained: nothing loaded from elsewhere (no script/style/image by address, no import)
    assert not re.search(r"""(?:src|href)\s*=\s*\\?["']?(?:https?:)?//""", page)
    assert "<link" not in page and "@import" not in page and "<script src" not in page
    index, episodes, heldout = embedded(page)
    assert heldout is None and len(episodes) == len(records) == len(index["episodes"])
    scored = 0
    for i, rec in enumerate(records):
        row, ep = index["episodes"][i], episodes[i]
        assert (row["agent"], row["task_id"], row["outcome"]) == (rec["agent"], rec["task_id"],
                                                                   "won" if rec["success"] else "lost")
        text = ep["strings"]
        (trial,) = rec["trials"]
        steps = trial["trajectory"]["steps"]
        assert text[ep["instruction"]] == trial["trajectory"]["instruction"]
        assert [(s["k"], text[s["a"]], text[s["o"]]) for s in ep["trials"][0]["steps"]] == [
            (s["kind"], s["action"], s["observation"]) for s in steps]
        for d in trial["log"]["decisions"]:
            shown = ep["trials"][0]["steps"][d["step"]]["d"]
            if rec["agent"] == "react":
                assert shown == {"reply": d["reply"]} and " " + steps[d["step"]]["action"] == d["reply"]
                continue
            # the scored set is the step's candidates without look / inventory / help, in engine order
            expected = [c for c in steps[d["step"]]["candidates"] if c not in ("look", "inventory", "help")]
            assert [text[c] for c in shown["candidates"]] == expected
            assert (shown["prior"], shown["log_p"], shown["chosen"]) == (d["prior"], d["log_p"], d["chosen"])
            assert shown["concept"] == d.get("concept") and expected[d["chosen"]] == d["action"]
            assert (shown["concept"] is None) == (rec["agent"] == "prior-only")
            scored += 1
    assert scored == sum(len(r["trials"][0]["log"]["decisions"]) for r in records if r["agent"] != "react")
    summary = index["summary"]
    assert [r[:3] for r in summary["table"]["rows"] if r[1] == "all"] == [
        ["react", "all", f"{int(records[0]['success'])}/1"], ["prior-only", "all", f"{int(records[1]['success'])}/1"],
        ["cb-agent", "all", f"{sum(r['success'] for r in records[2:])}/2"]]
    assert summary["chart"].startswith("<svg") and summary["settings"]["cb-agent"]["model"] == "fake-lm"


def test_bad_input_is_handled_as_report_handles_it(tmp_path, records):
    other = dict(records[1], budget=8)  # mixed settings: a row label of its own
    results = write(tmp_path / "r.jsonl.gz", [])
    results.write_bytes(gzip.compress(b"".join(orjson.dumps(r) + b"\n" for r in records[:2] + [other])
                                      + b'{"agent": "react", "ta'))
    res = CliRunner().invoke(main, ["view", str(results), "--out", str(tmp_path / "p.html")])
    assert res.exit_code == 0, res.output
    assert f"warning: {results}:4: skipped malformed results line: truncated line" in res.output
    index, episodes, _ = embedded((tmp_path / "p.html").read_text())
    assert [e["agent"] for e in index["episodes"]] == ["react (budget=4)", "prior-only (budget=4)",
                                                       "prior-only (budget=8)"]
    assert index["summary"]["differing"] == ["budget"] and any("truncated line" in n for n in index["notes"])
    missing = CliRunner().invoke(main, ["view", str(tmp_path / "none.jsonl")])
    errors = [line for line in missing.output.splitlines() if line.startswith("Error")]
    assert missing.exit_code == 2 and len(errors) == 1 and "none.jsonl' does not exist" in errors[0]
    empty = CliRunner().invoke(main, ["view", str(write(tmp_path / "e.jsonl", []))])
    assert empty.exit_code == 1 and "Error: no finished episodes and no held-out decisions" in empty.output


def test_older_records_and_eval_files_still_load(tmp_path, records):
    old = orjson.loads(orjson.dumps(records[2]))
    for d in old["trials"][0]["log"]["decisions"]:  # as written before the terms were recorded
        for key in ("prior", "concept", "log_p"):
            d.pop(key, None)
    rows = [{"task_type": "all", "decisions": 3, "mean_candidates": 2.0, "acc_prior": 1 / 3, "hits_prior": 1,
             "ci_prior": [0.0615, 0.7923], "acc_concept": 2 / 3, "hits_concept": 2, "ci_concept": [0.2077, 0.9385]}]
    heldout = {"schema": "cb-agent/eval-decisions-v1", "model": "fake-lm", "rows": rows, "decisions": [
        {"task_type": "fetch", "task_id": "a/1", "step": 0, "instruction": "i", "observation": "o",
         "candidates": ["go to desk 1", "go to window 1"], "expert": 1, "prior": [-0.1, -2.4],
         "concept": [-1.0, 1.5], "log_p": [-2.5, -0.08]}]}
    (tmp_path / "old_eval.json").write_bytes(orjson.dumps(rows))
    (tmp_path / "eval.json").write_bytes(orjson.dumps(heldout))
    res = CliRunner().invoke(main, ["view", str(write(tmp_path / "old.jsonl", [old])), str(tmp_path / "old_eval.json"),
                                    str(tmp_path / "eval.json"), "--out", str(tmp_path / "p.html")])
    assert res.exit_code == 0, res.output
    index, episodes, shown = embedded((tmp_path / "p.html").read_text())
    assert index["episodes"][0]["scored"] == 0
    assert all("candidates" not in s.get("d", {}) for s in episodes[0]["trials"][0]["steps"])
    assert any("accuracy rows only" in n for n in index["notes"])
    assert index["accuracy"] == [["fake-lm", "all", "3", "33.3% [6.2, 79.2]", "66.7% [20.8, 93.8]"]]
    assert shown[0]["candidates"] == heldout["decisions"][0]["candidates"] and shown[0]["expert"] == 1


def test_the_expert_action_is_marked_while_the_agent_is_where_the_expert_was(tmp_path, records):
    rec = records[2]  # cb-agent on a/1
    traj = orjson.loads(orjson.dumps(rec["trials"][0]["trajectory"]))
    env = [i for i, s in enumerate(traj["steps"]) if s["kind"] == "env"]
    assert len(env) >= 3
    first = traj["steps"][env[0]]["action"]
    other = next(c for c in traj["steps"][env[1]]["candidates"]
                 if c not in ("look", "inventory", "help", traj["steps"][env[1]]["action"]))
    # the expert takes the agent's first action (after a look), then another one than the agent's second
    expert = dict(traj, won=True, steps=[
        {"kind": "env", "action": "look", "observation": "o", "candidates": ["look", first], "done": False,
         "won": False, "score": 0.0, "info": {}},
        {"kind": "env", "action": first, "observation": "o", "candidates": [first], "done": False, "won": False,
         "score": 0.0, "info": {}},
        {"kind": "env", "action": other, "observation": "o", "candidates": [other], "done": True, "won": True,
         "score": 1.0, "info": {}}])
    (tmp_path / "expert.jsonl").write_bytes(orjson.dumps(expert) + b"\n")
    res = CliRunner().invoke(main, ["view", str(write(tmp_path / "r.jsonl", [rec])), "--expert",
                                    str(tmp_path / "expert.jsonl"), "--out", str(tmp_path / "p.html")])
    assert res.exit_code == 0, res.output
    _, episodes, _ = embedded((tmp_path / "p.html").read_text())
    ep = episodes[0]
    steps, text = ep["trials"][0]["steps"], ep["strings"]
    marked = {i: text[s["e"]] for i, s in enumerate(steps) if "e" in s}
    assert marked == {env[0]: first, env[1]: other}  # then the agent left the expert's path
    d = steps[env[1]]["d"]
    assert text[d["candidates"][d["expert"]]] == other and d["expert"] != d["chosen"]
    assert steps[env[0]]["d"]["expert"] == steps[env[0]]["d"]["chosen"]
