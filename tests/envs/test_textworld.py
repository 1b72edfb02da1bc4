"""TextWorld games generated offline with tw-make, won by their walkthroughs."""

from __future__ import annotations

import pytest

from envs import Episode, make_env
from envs.textworld import TextWorldEnv


@pytest.fixture(scope="module")
def env():
    e = make_env("textworld", kinds=("cooking",), n_train=1, n_test=1)
    yield e
    e.close()


def test_generated_cooking_game_is_won_by_its_walkthrough(env, isolated_cache):
    task_id = env.tasks("train")[0]
    ep = Episode(env, task_id)
    assert ep.start.task_type == "cooking"
    assert "cook" in ep.start.instruction.lower() and "$$" not in ep.start.observation
    while not ep.done and ep.expert_action() is not None:
        action = ep.expert_action()
        assert action in ep.candidates()
        ep.act(action)
    assert ep.won and ep.done
    assert list(isolated_cache.rglob("cooking-train-1.z8"))  # cached for the next run
    # a second reset reuses the cached game and replays identically
    start = env.reset(task_id)
    assert start == ep.start


def test_train_and_test_seeds_are_disjoint():
    env = TextWorldEnv(n_train=5, n_test=5)
    train, test = env.tasks("train"), env.tasks("test")
    assert {t.split("/")[-1] for t in train}.isdisjoint({t.split("/")[-1] for t in test})
    assert len(train) == 10 and {env.task_type_of(t) for t in train} == {"cooking", "custom"}
    with pytest.raises(ValueError, match="overlap"):
        TextWorldEnv(n_train=10, train_seed0=1, test_seed0=5)
    with pytest.raises(ValueError, match="outside the train seeds"):
        env.reset("cooking/train/100001")
    with pytest.raises(ValueError, match="unknown TextWorld split"):
        env.tasks("valid")
