"""ScienceWorld through the protocol: gold paths, candidates, ambiguity answers, JVM restarts."""

from __future__ import annotations

import pytest

from envs import Episode, decision_examples, make_env
from envs.collect import play_expert
from envs.scienceworld import candidate_spelling

TASK = "lifespan-longest-lived/0"  # a short gold path (about 6 actions)


@pytest.fixture(scope="module")
def env():
    e = make_env("scienceworld")
    yield e
    e.close()


def test_gold_path_reaches_score_100(env):
    traj = play_expert(env, TASK)
    assert traj.won and traj.score == 100
    assert traj.task_type == "lifespan-longest-lived" and "longest life span" in traj.instruction
    env_steps = [s for s in traj.steps if s.kind == "env"]
    assert all(s.action in s.candidates for s in env_steps)
    assert all(len(s.candidates) > 50 for s in env_steps)  # valid action-object combinations
    examples, skipped = decision_examples(traj)
    assert len(examples) == len(env_steps) and skipped == 0
    _, skipped_appended = decision_examples(traj, skip_expert_appended=True)
    assert skipped_appended == sum(bool(s.info.get("expert_appended")) for s in env_steps)


def test_jvm_restart_keeps_the_episode(env):
    ep = Episode(env, TASK)
    ep.act(ep.expert_action())
    ep.act("think: the animals are outside")
    env._sw._gateway.java_process.kill()  # a crashed simulator
    restarts = env.jvm_restarts
    result = ep.act(ep.expert_action())
    assert env.jvm_restarts == restarts + 1 and result.info["jvm_restarts"] == 1
    assert [s.kind for s in ep.steps] == ["env", "think", "env"]
    while not ep.done and ep.expert_action() is not None:
        ep.act(ep.expert_action())
    assert ep.won


def test_candidate_spelling():
    cands = {"focus on thermometer", "open kitchen door", "use thermometer on substance in metal pot"}
    assert candidate_spelling("focus on thermometer in inventory", cands) == "focus on thermometer"
    assert candidate_spelling("open door to kitchen", cands) == "open kitchen door"
    assert candidate_spelling("use thermometer in inventory on substance in metal pot", cands) == \
        "use thermometer on substance in metal pot"
    assert candidate_spelling("examine steam", cands) == "examine steam"


def test_bad_task_ids(env):
    with pytest.raises(ValueError):
        env.reset("boil")
    with pytest.raises(ValueError, match="unknown ScienceWorld task"):
        env.reset("no-such-task/0")
    with pytest.raises(ValueError, match="unknown ScienceWorld split"):
        env.tasks("valid")


@pytest.mark.slow
def test_ambiguity_prompt_is_answered_and_recorded(env):
    traj = play_expert(env, "grow-fruit/0")
    answered = [s.info["ambiguity"] for s in traj.steps if "ambiguity" in s.info]
    assert answered and all(a["prompt"].startswith("Ambiguous request") and a["answer"].isdigit() for a in answered)
    assert traj.won
