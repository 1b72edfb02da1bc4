"""TextWorld games generated offline with tw-make, won by their walkthroughs."""

from __future__ import annotations

import pytest

from envs import Episode, make_env
from envs.textworld import GAMES, KINDS, TextWorldEnv, tw_make_command


@pytest.fixture(scope="module")
def env():
    e = make_env("textworld", kinds=("cooking",), n_train=1, n_test=1)
    yield e
    e.close()


def test_generated_cooking_game_is_won_by_its_walkthrough(env, isolated_cache):
    task_id = env.tasks("train")[0]
    ep = Episode(env, task_id, expert=True)
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


@pytest.mark.slow
def test_off_the_walkthrough_the_expert_answers_the_winning_policy_from_the_current_state(env, isolated_cache):
    """A step off the walkthrough (``look`` or ``inventory``, whichever the walkthrough does not take
    first) leaves the walkthrough behind; on a level-1 cooking game the expert's answers from there
    on (TextWorld's policy_commands) are candidates and win the game. On the hardest cooking game
    TextWorld finds no winning policy, so off the walkthrough the expert answers nothing (a state
    the relabelled rounds count as "no answer"). Reset without the expert, it answers nothing."""
    easy = make_env("textworld", kinds=("cooking-1",), n_train=1, n_test=1)
    for game_env, wins in ((easy, True), (env, False)):
        task_id = game_env.tasks("train")[0]
        walkthrough = Episode(game_env, task_id, expert=True)
        plan = []
        while not walkthrough.done and walkthrough.expert_action() is not None:
            plan.append(walkthrough.expert_action())
            walkthrough.act(plan[-1])
        assert walkthrough.won
        off = next(a for a in ("look", "inventory") if a != plan[0])  # neither changes the game's state
        ep = Episode(game_env, task_id, max_steps=3 * len(plan), expert=True)
        ep.act(off)
        answers = []
        while not ep.done and ep.expert_action() is not None:
            answers.append(ep.expert_action())
            assert answers[-1] in ep.candidates()
            ep.act(answers[-1])
        assert ep.won == wins and bool(answers) == wins
        assert game_env.reset(task_id) and game_env.expert_action() is None
    easy.close()


def test_train_and_test_seeds_are_disjoint():
    env = TextWorldEnv(n_train=5, n_test=5)
    train, test = env.tasks("train"), env.tasks("test")
    assert {t.split("/")[-1] for t in train}.isdisjoint({t.split("/")[-1] for t in test})
    assert len(train) == 5 * len(KINDS) and {env.task_type_of(t) for t in train} == set(KINDS)
    assert [env.task_type_of(t) for t in train[::5]][:2] == ["cooking", "custom"]  # default slices stay theirs
    with pytest.raises(ValueError, match="overlap"):
        TextWorldEnv(n_train=10, train_seed0=1, test_seed0=5)
    with pytest.raises(ValueError, match="outside the train seeds"):
        env.reset("cooking/train/100001")
    with pytest.raises(ValueError, match="unknown TextWorld split"):
        env.tasks("valid")


def test_difficulty_levels_pass_their_flags_and_only_cooking_takes_the_split(tmp_path):
    easy = tw_make_command("cooking-1", "test", 7, tmp_path / "g.z8")
    assert easy[1:8] == ["tw-cooking", "--recipe", "1", "--take", "1", "--go", "1"]
    assert easy[easy.index("--split") + 1] == "test" and easy[easy.index("--seed") + 1] == "7"
    custom = tw_make_command("custom-2", "train", 3, tmp_path / "g.z8")
    assert custom[1:8] == ["custom", "--world-size", "2", "--nb-objects", "4", "--quest-length", "2"]
    assert "--split" not in custom
    assert KINDS[:2] == ("cooking", "custom") and set(KINDS) == set(GAMES)
    with pytest.raises(ValueError, match="unknown TextWorld game kind 'cooking-9'"):
        tw_make_command("cooking-9", "train", 1, tmp_path / "g.z8")


# -- one input is one command ------------------------------------------------------------

def test_split_commands_follows_the_inform_parser():
    from envs.textworld import split_commands

    assert split_commands("go south then go east") == ["go south", "go east"]
    assert split_commands("GO SOUTH THEN GO EAST") == ["GO SOUTH", "GO EAST"]
    assert split_commands("go south. go east.") == ["go south", "go east"]
    assert split_commands("go south\ngo east") == ["go south", "go east"]
    assert split_commands("take glass. take fly larva") == ["take glass", "take fly larva"]
    # one command each: a trailing stop or `then`; objects joined by `and`/`,` (one tracked action);
    # `;` is no separator (the parser rejects the whole input itself)
    for one in ("go south.", "go south then", "take glass and fly larva", "go south, go east", "go south; go east"):
        assert len(split_commands(one)) == 1, one


@pytest.fixture(scope="module")
def custom():
    e = make_env("textworld", kinds=("custom",), n_train=1, n_test=1)
    yield e
    e.close()


def test_a_chained_input_never_reaches_the_engine_and_the_candidates_stay_true(custom):
    """The input on custom/train/1 (walkthrough: go south, go east, go north, open type D
    locker, take keyboard from type D locker). The engine would run both commands of `go south then
    go east` but its tracker would see only the first, leaving an earlier room's candidates for the
    rest of the episode (no `take keyboard from type D locker` after opening the locker)."""
    from envs.textworld import CHAINED_FEEDBACK

    start = custom.reset("custom/train/1")
    fresh = custom.candidates()
    for chained in ("go south then go east", "go south. go east", "go south\ngo east"):
        result = custom.step(chained)
        assert result.observation == CHAINED_FEEDBACK and result.info == {
            "invalid": True, "chained": ["go south", "go east"]}
        assert custom.candidates() == fresh
    # inputs the parser itself refuses (multiple objects for `go`, `;`) change nothing either
    for refused in ("go south, go east", "go south and go east", "go south; go east"):
        custom.step(refused)
        assert custom.candidates() == fresh, refused
    assert custom.step("look").observation.startswith(start.observation.split("\n", 1)[0])  # still in the first room
    ep = Episode(custom, "custom/train/1")
    ep.act("go south then go east")
    for action in ("go south", "go east", "go north", "open type D locker"):
        ep.act(action)
    assert "take keyboard from type D locker" in ep.candidates()
    assert ep.act("take keyboard from type D locker").won
    assert [s.kind for s in ep.steps] == ["env"] * 6 and ep.trajectory().meta["split"] == "train"


def test_task_ids_and_splits_without_the_engine():
    from envs import check_tasks

    env = TextWorldEnv(n_train=2, n_test=2)
    assert env.split_of("cooking/test/100001") == "test"
    with pytest.raises(ValueError, match="belongs to split 'test', not 'train'"):
        check_tasks(env, "train", ["cooking/train/1", "cooking/test/100001"])
    with pytest.raises(ValueError, match="is not '<kind>/<split>/<seed>'"):
        env.split_of("nosuch/x")
    with pytest.raises(ValueError, match=r"outside the train seeds 1\.\.2"):
        env.split_of("custom/train/3")
    assert env._gym is None  # nothing was started
