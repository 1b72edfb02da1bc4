"""End to end with the real default backbone (SmolLM2) and real games, at a short budget.

Slow (minutes on two cores): run with ``pytest -m slow tests/agents``. Expert trajectories,
features and concepts go to a temporary cache; the converted default model stays in the user
cache.
"""

import pytest
from click.testing import CliRunner

from agent_shell.candidates import fixed_action_space
from agent_shell.cli import main
from agent_shell.runner import read_results

BUDGET = 5


def check_episode(rec, agent):
    assert rec["agent"] == agent and rec["budget"] == BUDGET
    assert rec["success"] or rec["steps"] == BUDGET
    steps = rec["trials"][0]["trajectory"]["steps"]
    assert len(steps) == rec["steps"] and rec["think_steps"] == sum(s["kind"] == "think" for s in steps)
    for s in steps:
        if s["kind"] == "think":
            assert s["observation"] == "OK." and s["candidates"] is None
        elif agent == "cb-agent":  # the chosen action is always from the filtered environment set
            assert s["action"] in fixed_action_space(s["candidates"])
    if agent == "cb-agent":
        assert len(rec["n_candidates"]) == rec["env_steps"] and all(n >= 1 for n in rec["n_candidates"])


def run_one_game(tmp_path, env_name, split, game_args):
    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["run", "--env", env_name, "--split", split, *game_args,
                                    "--agent", "cb-agent", "--agent", "react", "--demos-per-type", "1",
                                    "--max-steps", str(BUDGET), "--cache-dir", str(tmp_path / "cache"),
                                    "--out-dir", str(out)])
    assert res.exit_code == 0, res.output + repr(res.exception)
    records = read_results(out / "results.jsonl")
    assert sorted(r["agent"] for r in records) == ["cb-agent", "react"]
    for rec in records:
        check_episode(rec, rec["agent"])
    assert list((tmp_path / "cache" / "concepts").iterdir())  # a fitted, cached concept
    return records


@pytest.mark.slow
def test_alfworld_game_end_to_end_with_the_default_model(tmp_path):
    records = run_one_game(tmp_path, "alfworld", "valid_unseen", ["--games", "1"])
    assert all(r["task_type"] == records[0]["task_type"] for r in records)


@pytest.mark.slow
def test_textworld_game_end_to_end_with_the_default_model(tmp_path):
    run_one_game(tmp_path, "textworld", "test", ["--games", "1"])
