"""ALFWorld through the protocol on the real game files (../shared/alfworld/json_2.1.1)."""

from __future__ import annotations

import gc
import json
import weakref

import pytest

from envs import Episode, make_env
from envs.alfworld import TASK_TYPES, AlfworldEnv, legacy_put, normalize_action, parse_task_folder

# One valid_unseen game per task type that ALFWorld's handcoded expert wins (short ones, to keep
# the suite quick). The pick_two game is one the unpatched 0.4.2 expert also wins.
WON_BY_EXPERT = {
    "look_at_obj_in_light": "look_at_obj_in_light-AlarmClock-None-DeskLamp-308/trial_T20190908_222951_616606",
    "pick_and_place_simple": "pick_and_place_simple-Mug-None-Desk-308/trial_T20190909_203041_433487",
    "pick_clean_then_place_in_recep": "pick_clean_then_place_in_recep-Bowl-None-Cabinet-10/trial_T20190909_061232_368489",
    "pick_heat_then_place_in_recep": "pick_heat_then_place_in_recep-Apple-None-Fridge-10/trial_T20190906_182259_116320",
    "pick_cool_then_place_in_recep": "pick_cool_then_place_in_recep-Bread-None-CounterTop-10/trial_T20190908_091747_866951",
    "pick_two_obj_and_place": "pick_two_obj_and_place-Pillow-None-Sofa-219/trial_T20190907_163327_486300",
}


@pytest.fixture(scope="module")
def env():
    e = make_env("alfworld")
    yield e
    e.close()


def test_splits_and_task_types(env):
    unseen = env.tasks("valid_unseen")
    assert len(unseen) == 134 and unseen == sorted(unseen)
    assert len(env.tasks("train")) == 120
    counts = {t: sum(env.task_type_of(i) == t for i in unseen) for t in TASK_TYPES}
    assert counts == {"pick_and_place_simple": 24, "look_at_obj_in_light": 18, "pick_clean_then_place_in_recep": 31,
                      "pick_heat_then_place_in_recep": 23, "pick_cool_then_place_in_recep": 21,
                      "pick_two_obj_and_place": 17}
    with pytest.raises(ValueError, match="unknown ALFWorld split"):
        env.tasks("valid_seen_typo")
    with pytest.raises(ValueError, match="unknown ALFWorld task"):
        env.reset("pick_and_place_simple-Nope-None-Desk-1/trial_X")


@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_handcoded_expert_wins_one_game_of_each_type(env, task_type):
    task_id = WON_BY_EXPERT[task_type]
    ep = Episode(env, task_id, max_steps=50, expert=True)
    assert ep.start.task_type == task_type
    assert ep.start.instruction.startswith("Your task is to:")
    assert "Your task is to" not in ep.start.observation and "Welcome" not in ep.start.observation
    while not ep.done:
        action = ep.expert_action()
        assert action in ep.candidates()
        ep.act(action)
    assert ep.won, [s.action for s in ep.steps]
    assert all(s.candidates and s.action in s.candidates for s in ep.steps)


def test_think_steps_never_reach_the_engine(env):
    calls = []
    real_step = env.step

    def counting_step(action):
        calls.append(action)
        return real_step(action)

    env.step = counting_step
    try:
        ep = Episode(env, WON_BY_EXPERT["pick_and_place_simple"], max_steps=50, expert=True)
        while not ep.done:
            ep.act("think: where could the mug be?")
            ep.act(ep.expert_action())
    finally:
        del env.step
    assert ep.won
    env_steps = [s.action for s in ep.steps if s.kind == "env"]
    assert calls == env_steps and not any(c.startswith("think") for c in calls)
    assert len(ep.steps) == 2 * len(env_steps)


def test_put_spelling_is_rewritten_and_invalid_actions_flagged(env):
    env.reset(WON_BY_EXPERT["pick_and_place_simple"])
    bad = env.step("fly to the moon")
    assert bad.observation == "Nothing happens." and bad.info["invalid"] and not bad.done
    old = env.step("put mug 1 in/on desk 1")
    assert old.info["rewritten_from"] == "put mug 1 in/on desk 1"
    assert normalize_action("put mug 1 on desk 1") == "move mug 1 to desk 1"
    assert legacy_put("move mug 1 to desk 1") == "put mug 1 in/on desk 1"
    assert legacy_put("go to desk 1") == "go to desk 1"


def test_traj_data_from_folder_name_goes_to_the_cache_only(env, isolated_cache):
    params = parse_task_folder("look_at_obj_in_light-AlarmClock-None-DeskLamp-308")
    assert params["task_type"] == "look_at_obj_in_light"
    assert params["pddl_params"]["toggle_target"] == "DeskLamp" and params["pddl_params"]["parent_target"] == ""
    sliced = parse_task_folder("pick_heat_then_place_in_recep-AppleSliced-None-Fridge-10")["pddl_params"]
    assert sliced["object_target"] == "Apple" and sliced["object_sliced"] and sliced["parent_target"] == "Fridge"
    with pytest.raises(ValueError):
        parse_task_folder("not-a-game")
    written = list(isolated_cache.rglob("traj_data.json"))
    assert written, "reset should have written traj_data.json into the cache"
    assert json.loads(written[0].read_text())["task_type"] in TASK_TYPES
    assert not list(env.data_dir.rglob("traj_data.json"))


def test_missing_data_dir_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("CB_AGENT_ALFWORLD_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="CB_AGENT_ALFWORLD_DATA"):
        AlfworldEnv()


@pytest.mark.slow
def test_patched_expert_wins_a_pick_two_game_the_unpatched_one_loses(env):
    # With alfworld 0.4.2 unpatched this game ends at 50 steps (measured); the tracker fix wins it.
    ep = Episode(env, "pick_two_obj_and_place-SoapBar-None-Cabinet-424/trial_T20190909_081720_491733", 50, expert=True)
    while not ep.done:
        ep.act(ep.expert_action())
    assert ep.won


# -- the expert only where it is used; chained commands; task ids and splits ---------------

@pytest.mark.slow  # real ALFWorld games with and without the expert
def test_the_expert_runs_only_in_expert_episodes_and_gives_up_without_raising(monkeypatch):
    """ALFWorld 0.4.2's handcoded expert raises Exception("Timeout") after its step limit (200), inside
    every engine step. Here its limit is 3 (the same code path, 197 steps sooner): an agent's episode
    never runs it; an expert episode sees "no expert action" and the reason, never an exception."""
    import alfworld.agents.environment.alfred_tw_env as tw_env

    real = tw_env.HandCodedTWAgent
    monkeypatch.setattr(tw_env, "HandCodedTWAgent", lambda max_steps=200: real(max_steps=3))
    env = make_env("alfworld")  # a fresh engine: the expert is built when a game is loaded
    try:
        task_id = WON_BY_EXPERT["pick_two_obj_and_place"]
        agent = Episode(env, task_id, max_steps=5)
        while not agent.done:
            agent.act("look")
        assert len(agent.steps) == 5 and not agent.won and env.expert_gave_up is None
        with pytest.raises(RuntimeError, match="without its expert"):
            agent.expert_action()

        expert = Episode(env, task_id, max_steps=8, expert=True)
        actions = []
        while not expert.done and expert.expert_action() is not None:
            actions.append(expert.expert_action())
            expert.act(actions[-1])
        assert len(actions) == 4 and "Timeout" in env.expert_gave_up  # its opening `look`, then 3 steps
        expert.act("look")  # the episode itself goes on
        assert len(expert.steps) == 5
    finally:
        env.close()


@pytest.mark.slow
def test_a_250_step_agent_episode_ends_at_its_budget(env):
    """The input: valid_unseen[0], 250 steps of `look` used to crash at step 201 (the expert's Timeout)."""
    ep = Episode(env, env.tasks("valid_unseen")[0], max_steps=250)
    while not ep.done:
        ep.act("look")
    assert len(ep.steps) == 250 and not ep.won


def test_chained_commands_are_one_invalid_command(env):
    """The engine matches the whole input against its admissible commands: a chained input is
    `Nothing happens.` and changes nothing, whatever the separator."""
    task_id = WON_BY_EXPERT["pick_and_place_simple"]
    env.reset(task_id)
    fresh = env.candidates()
    first, second = [c for c in fresh if c.startswith("go to")][:2]
    for joined in (f"{first} then {second}", f"{first}. {second}", f"{first}, {second}", f"{first}; {second}",
                   f"{first} and {second}", f"{first}\n{second}"):
        result = env.step(joined)
        assert result.observation == "Nothing happens." and result.info["invalid"], joined
        assert env.candidates() == fresh, joined
    arrived = env.step(first).observation
    assert arrived.startswith("You arrive at") and env.candidates() != fresh


def test_task_ids_and_splits_are_checked_without_the_engine(env):
    from envs import check_tasks

    game = env.tasks("valid_unseen")[0]
    assert env.split_of(game) == "valid_unseen" and env.split_of(SHORT_TRAIN_GAME) == "train"
    for bad in ("nosuch/x", "pick_and_place_simple-Foo-None-Bar-999/trial_X"):
        with pytest.raises(ValueError, match="unknown ALFWorld task") as err:
            env.split_of(bad)
        assert bad in str(err.value) and "\n" not in str(err.value) and "valid_unseen 134" in str(err.value)
    with pytest.raises(ValueError, match="closest: 'pick_and_place_simple-Mug-None-Desk-308/"):
        env.split_of(WON_BY_EXPERT["pick_and_place_simple"][:-1])  # one character short
    with pytest.raises(ValueError, match="belongs to split 'valid_unseen', not 'train'"):
        check_tasks(env, "train", [SHORT_TRAIN_GAME, game])
    with pytest.raises(ValueError, match="belongs to split 'valid_unseen', not 'train'"):
        Episode(env, game, 5, split="train")
    with pytest.raises(ValueError, match="unknown ALFWorld split 'valid'"):
        check_tasks(env, "valid", [game])
    assert check_tasks(env, "valid_unseen", [game, game]) == [game]
    ep = Episode(env, game, 1, split="valid_unseen")
    ep.act("look")
    assert ep.trajectory().meta["split"] == "valid_unseen"


SHORT_TRAIN_GAME = "pick_and_place_simple-AlarmClock-None-Desk-307/trial_T20190907_072303_146844"


@pytest.mark.slow  # real ALFWorld games loaded one after another
def test_moving_to_another_game_frees_the_last_one():
    """textworld's gym registry keeps every registered game with its wrappers (the whole env
    chain, expert included): the adapter drops its entry when it leaves a game, so a long run
    holds one game, not every game it played."""
    from textworld.gym.utils import registry

    e = make_env("alfworld")
    before = set(registry)
    refs = []
    for task_id in list(WON_BY_EXPERT.values())[:3]:
        Episode(e, task_id, max_steps=2, expert=True)
        refs.append(weakref.ref(e._expert_wrapper))
    assert len(set(registry) - before) == 1  # the current game only
    e.close()
    assert set(registry) == before
    gc.collect()
    assert all(r() is None for r in refs[:-1])  # the games left earlier: their env chains are gone
