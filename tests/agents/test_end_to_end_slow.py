"""End to end with the real default backbone (SmolLM2) and real games, at a short budget.

Slow (minutes on two cores): run with ``pytest -m slow tests/agents``. Expert trajectories,
features and concepts go to a temporary cache; the converted default model stays in the user
cache. ALFWorld: CB-Agent and ReAct. TextWorld: ``fit-concepts`` first, then CB-Agent,
Reflexion-CB-Agent and ReAct on two games, whose concepts equal the ones fit-concepts wrote. ScienceWorld: CB-Agent, whose concept
is fitted on a gold path with appended expert steps.
"""

import filecmp
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import cb_core
from agent_shell.candidates import fixed_action_space
from agent_shell.cli import main
from agent_shell.results import read_results
from cb_io.records import read_trajectories
from envs import make_env

BUDGET = 5


def check_trial(trial, agent, budget):
    steps = trial["trajectory"]["steps"]
    assert trial["won"] or len(steps) == budget
    assert trial["steps"] == len(steps) and trial["think_steps"] == sum(s["kind"] == "think" for s in steps)
    for s in steps:
        if s["kind"] == "think":
            assert s["observation"] == "OK." and s["candidates"] is None
        elif agent.endswith("cb-agent"):  # the chosen action is always from the filtered environment set
            assert s["action"] in fixed_action_space(s["candidates"])


def check_episode(rec, agent, budget=BUDGET):
    assert rec["agent"] == agent and rec["budget"] == budget
    for trial in rec["trials"]:
        check_trial(trial, agent, budget)
    assert rec["steps"] == sum(t["steps"] for t in rec["trials"])
    if agent.endswith("cb-agent"):
        assert len(rec["n_candidates"]) == rec["env_steps"] and all(n >= 1 for n in rec["n_candidates"])


def run_games(tmp_path, env_name, split, game_args, agents=("cb-agent", "react"), budget=BUDGET):
    out = tmp_path / "run"
    args = ["run", "--env", env_name, "--split", split, *game_args, "--demos-per-type", "1",
            "--max-steps", str(budget), "--cache-dir", str(tmp_path / "cache"), "--out-dir", str(out)]
    for agent in agents:
        args += ["--agent", agent]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output + repr(res.exception)
    records = read_results(out / "results.jsonl")
    games = sorted({r["task_id"] for r in records})  # every agent played every game once
    assert sorted((r["agent"], r["task_id"]) for r in records) == sorted((a, g) for a in agents for g in games)
    for rec in records:
        check_episode(rec, rec["agent"], budget)
    assert list((tmp_path / "cache" / "concepts").iterdir())  # a fitted, cached concept
    return records


@pytest.mark.slow
def test_alfworld_game_end_to_end_with_the_default_model(tmp_path):
    records = run_games(tmp_path, "alfworld", "valid_unseen", ["--games", "1"])
    assert all(r["task_type"] == records[0]["task_type"] for r in records)


@pytest.mark.slow
def test_textworld_fit_concepts_then_cb_agent_and_reflexion_cb_agent(tmp_path):
    cache, copied = tmp_path / "cache", tmp_path / "concepts"
    res = CliRunner().invoke(main, ["fit-concepts", "--env", "textworld", "--demos-per-type", "1",
                                    "--cache-dir", str(cache), "--out-dir", str(copied)])
    assert res.exit_code == 0, res.output + repr(res.exception)
    (folder,) = (cache / "concepts").iterdir()
    files = sorted(p.name for p in folder.glob("*.safetensors"))
    assert files == sorted(p.name for p in copied.iterdir()) and files  # one concept per task type, copied
    assert all(filecmp.cmp(folder / f, copied / f, shallow=False) for f in files)
    for f in files:
        meta = cb_core.Concept.load(folder / f).metadata
        assert meta["backbone"].startswith("SmolLM2") and meta["fit"]["converged"] and meta["n_decisions"] >= 1
        assert f.removesuffix(".safetensors") in res.output  # the printed table names each task type
    # two games (two task types): the run fits only the types it plays (another cache key, since
    # fit-concepts fitted every type), on the same demonstrations, so it gets the same concepts
    records = run_games(tmp_path, "textworld", "test", ["--games", "2"],
                        agents=("cb-agent", "reflexion-cb-agent", "react"))
    played = {r["task_type"] for r in records}
    assert len(played) == 2 and played <= {f.removesuffix(".safetensors") for f in files}
    (run_folder,) = {r["concepts_dir"] for r in records}
    for task_type in played:
        ours, theirs = (cb_core.Concept.load(Path(d) / f"{task_type}.safetensors") for d in (run_folder, copied))
        assert ours.metadata["trajectories"] == theirs.metadata["trajectories"]
        np.testing.assert_allclose(ours.alpha, theirs.alpha, atol=1e-5)
    for reflexion in [r for r in records if r["agent"] == "reflexion-cb-agent"]:
        trials = reflexion["trials"]
        assert reflexion["n_trials"] == len(trials) and 1 <= len(trials) <= 2
        assert reflexion["success"] == any(t["won"] for t in trials)
        if len(trials) == 2:  # the failed first trial's reflection is the second trial's memory
            assert not trials[0]["won"] and isinstance(trials[0]["reflection"], str)
            # an empty reflection (SmolLM2 can write one) adds nothing
            reflection = trials[0]["reflection"]
            assert trials[1]["log"]["memory"] == ([reflection] if reflection else [])


@pytest.mark.slow
def test_scienceworld_cb_agent_with_a_concept_fitted_on_appended_expert_steps(tmp_path):
    env = make_env("scienceworld")
    try:  # the first dev variation of a task whose gold path has appended expert steps
        game = next(t for t in env.tasks("dev") if t.startswith("lifespan-longest-lived/"))
    finally:
        env.close()
    (rec,) = run_games(tmp_path, "scienceworld", "dev", ["--game", game], agents=("cb-agent",), budget=3)
    assert rec["task_type"] == "lifespan-longest-lived" and min(rec["n_candidates"]) > 50
    (demo,) = read_trajectories(tmp_path / "cache" / "expert" / "scienceworld" / "train.jsonl")
    env_steps = [s for s in demo.steps if s.kind == "env"]
    appended = [s.action for s in env_steps if s.info.get("expert_appended")]
    assert demo.won and appended
    (folder,) = (tmp_path / "cache" / "concepts").iterdir()
    meta = cb_core.Concept.load(folder / "lifespan-longest-lived.safetensors").metadata
    # the appended expert steps stay in the histories but are no fitting target
    assert all(meta["skipped_actions"].get(a) for a in appended)
    assert meta["n_decisions"] + meta["n_skipped_expert_steps"] == len(env_steps)
    assert meta["n_decisions"] == len(env_steps) - len(appended) - sum(
        s.action in ("look", "inventory", "help") for s in env_steps if not s.info.get("expert_appended"))
