"""The action-for-action replay check (``benchmarks/replay_actions.py``): its comparison on made-up
records, and (slow) a replay of committed Table 1 episodes with the real backbone and game."""

from __future__ import annotations

import gzip
import importlib.util
import sys
from pathlib import Path

import orjson
import pytest

from agent_shell.results import read_results

ROOT = Path(__file__).resolve().parents[2]


def load_replay():
    spec = importlib.util.spec_from_file_location("benchmark_replay_actions", ROOT / "benchmarks" / "replay_actions.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


replay = load_replay()


def record(agent: str, task_id: str, *trials: list[str], budget: int = 50) -> dict:
    return {"agent": agent, "task_id": task_id, "success": False, "budget": budget,
            "trials": [{"trajectory": {"steps": [{"kind": "env", "action": a} for a in actions]}}
                       for actions in trials]}


def write(path: Path, records: list[dict], compress: bool = False) -> Path:
    data = b"".join(orjson.dumps(r) + b"\n" for r in records)
    if compress:
        path = path.with_suffix(".jsonl.gz")
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def test_identical_episodes_replay_and_a_changed_action_is_located():
    recorded = [record("react", "g1", ["go to desk 1", "take pen 1"]),
                record("cb-agent", "g1", ["go to desk 1", "think: x", "take pen 1"]),
                record("cb-agent", "g2", ["look"])]
    played = [record("react", "g1", ["go to desk 1", "take pen 1"]),
              record("cb-agent", "g1", ["go to desk 1", "think: y", "take pen 1"]),
              record("prior-only", "g1", ["look"])]  # not in the reference: not compared
    rows = replay.compare(recorded, played)
    assert [(r.agent, r.task_id) for r in rows] == [("react", "g1"), ("cb-agent", "g1")]
    assert rows[0].first_difference is None and rows[0].n_actions == 2
    assert rows[1].first_difference == (0, 1, "think: x", "think: y")


def test_a_shorter_or_longer_trial_and_a_missing_trial_differ():
    recorded = [record("a", "g", ["x", "y"]), record("b", "g", ["x"], ["z"])]
    played = [record("a", "g", ["x"]), record("b", "g", ["x"])]
    rows = replay.compare(recorded, played)
    assert rows[0].first_difference == (0, 1, "y", None)
    assert rows[1].first_difference == (1, 0, "z", None)


def test_a_replay_at_a_smaller_budget_is_compared_on_the_steps_it_played():
    recorded = [record("a", "g", ["x", "y", "z", "w"]), record("b", "g", ["x", "y", "z"])]
    played = [record("a", "g", ["x", "y"], budget=2), record("b", "g", ["x", "q"], budget=2)]
    rows = replay.compare(recorded, played)
    assert rows[0].first_difference is None
    assert rows[1].first_difference == (0, 1, "y", "q")


def test_main_reads_compressed_references_and_exits_one_on_a_difference(tmp_path, capsys):
    ref = write(tmp_path / "ref.jsonl", [record("a", "g1", ["x"]), record("a", "g2", ["y"])], compress=True)
    same = write(tmp_path / "same.jsonl", [record("a", "g1", ["x"]), record("a", "g2", ["y"])])
    other = write(tmp_path / "other.jsonl", [record("a", "g1", ["x"]), record("a", "g2", ["z"])])
    assert replay.main([str(ref), "--played", str(same)]) == 0
    assert "a: 2/2 episodes replay action for action (2 actions)" in capsys.readouterr().out
    assert replay.main([str(ref), "--played", str(other)]) == 1
    out = capsys.readouterr().out
    assert "a: 1/2 episodes" in out and "differs: g2 trial 1 step 1: recorded 'y', played 'z'" in out
    assert replay.main([str(ref), "--played", str(tmp_path / "none.jsonl")]) == 2


@pytest.mark.slow
def test_committed_table1_episodes_replay_action_for_action(tmp_path):
    """One Table 1 game (float32, budget 50 recorded): CB-Agent's whole won episode, and the
    first steps of ReAct's and prior-only's (a smaller budget; each step is decided alike)."""
    from click.testing import CliRunner

    from agent_shell.cli import main

    game = "look_at_obj_in_light-CD-None-DeskLamp-308/trial_T20190908_141942_810052"
    reference = read_results(ROOT / "results" / "table1_alfworld.results.jsonl.gz")
    recorded = [r for r in reference if r["task_id"] == game]
    assert {r["agent"] for r in recorded} == {"react", "prior-only", "cb-agent"}
    played = []
    for agents, budget in ((("cb-agent",), 50), (("react", "prior-only"), 8)):
        out = tmp_path / f"run{budget}"
        args = ["run", "--env", "alfworld", "--split", "valid_unseen", "--game", game, "--dtype", "float32",
                "--max-steps", str(budget), "--cache-dir", str(tmp_path / "cache"), "--out-dir", str(out)]
        for agent in agents:
            args += ["--agent", agent]
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 0, res.output + repr(res.exception)
        played += read_results(out / "results.jsonl")
    rows = replay.compare(recorded, played)
    assert sorted(r.agent for r in rows) == ["cb-agent", "prior-only", "react"]
    assert [r for r in rows if r.first_difference is not None] == []
    assert {r.agent: r.n_actions for r in rows}["cb-agent"] == 8  # the whole recorded episode
