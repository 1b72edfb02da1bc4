"""ALFWorld through the protocol on the real game files (../shared/alfworld/json_2.1.1)."""

from __future__ import annotations

import json

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
    ep = Episode(env, task_id, max_steps=50)
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
        ep = Episode(env, WON_BY_EXPERT["pick_and_place_simple"], max_steps=50)
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
    ep = Episode(env, "pick_two_obj_and_place-SoapBar-None-Cabinet-424/trial_T20190909_081720_491733", 50)
    while not ep.done:
        ep.act(ep.expert_action())
    assert ep.won
