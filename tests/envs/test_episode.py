"""Episode semantics: think steps, the step budget, recording (a scripted engine, then a real one)."""

from __future__ import annotations

import pytest

from envs import Episode, EpisodeOver, StepResult, TaskStart, decision_examples, is_think


class ScriptedEnv:
    """A two-action engine that records every call that reaches it."""

    name = "scripted"
    default_max_steps = 4

    def __init__(self):
        self.calls: list[str] = []

    def tasks(self, split):
        return ["t"]

    def reset(self, task_id):
        self.calls.append("reset")
        return TaskStart(task_id, "type", "Do it.", "o0")

    def step(self, action):
        self.calls.append(action)
        won = action == "win"
        return StepResult(f"did {action}", done=won, won=won, score=float(won))

    def candidates(self):
        return ["noop", "win"]

    def expert_action(self):
        return "win"

    def close(self):
        pass


def test_think_steps_never_reach_the_engine_but_use_the_budget():
    env = ScriptedEnv()
    ep = Episode(env, "t", max_steps=3)
    r = ep.act("think: first I plan")
    assert r.observation == "OK." and not r.done
    ep.act("  THINK: again")
    assert env.calls == ["reset"]
    assert ep.budget_left == 1
    ep.act("noop")
    assert env.calls == ["reset", "noop"]
    assert ep.done and not ep.won  # budget spent
    with pytest.raises(EpisodeOver):
        ep.act("win")
    assert [s.kind for s in ep.steps] == ["think", "think", "env"]
    assert ep.steps[2].candidates == ["noop", "win"]
    assert ep.steps[0].candidates is None


def test_a_thought_spending_the_last_step_ends_the_episode():
    ep = Episode(ScriptedEnv(), "t", max_steps=1)
    assert ep.act("think: hmm").done
    assert ep.done and not ep.won


def test_won_episode_becomes_a_trajectory():
    env = ScriptedEnv()
    ep = Episode(env, "t")
    assert ep.max_steps == 4  # the adapter's default_max_steps
    ep.act("think: win now")
    r = ep.act("win")
    assert r.won and ep.done and ep.won
    traj = ep.trajectory({"expert": "scripted"})
    assert traj.won and traj.meta == {"max_steps": 4, "expert": "scripted"}
    examples, skipped = decision_examples(traj)
    assert len(examples) == 1 and skipped == 0
    assert examples[0].history[0].observation == "OK."


def test_is_think_and_bad_inputs():
    assert is_think("think: x") and is_think(" Think: x") and not is_think("thinking about it")
    with pytest.raises(ValueError):
        Episode(ScriptedEnv(), "t", max_steps=0)
    with pytest.raises(ValueError):
        Episode(ScriptedEnv(), "t").act("  ")
