"""Context rendering and reply parsing: exact texts on hand-made steps."""

import pytest

from agent_shell import context as ctx
from agent_shell.candidates import (FALLBACK_ACTION, FormatError, drop_excluded, fixed_action_space,
                                    parse_actions, parse_reply)
from cb_io.records import Step


def env_step(action, obs):
    return Step("env", action, obs, [action, "look"], False, False, 0.0)


STEPS = [env_step("go to desk 1", "On the desk 1, you see a key 1."),
         Step("think", "think: I need the key.", "OK.", None, False, False, 0.0),
         env_step("take key 1 from desk 1", "You pick up the key 1 from the desk 1.")]


def test_scoring_context_is_task_then_raw_history_with_thoughts():
    text = ctx.scoring_context("Your task is to: get the key.", "You are in a room.", STEPS)
    assert text == ("You are in a room.\nYour task is to: get the key.\n"
                    "> go to desk 1\nOn the desk 1, you see a key 1.\n"
                    "> think: I need the key.\nOK.\n"
                    "> take key 1 from desk 1\nYou pick up the key 1 from the desk 1.")


def test_think_step_without_prefix_renders_with_it():
    step = Step("think", "the key is on the desk", "OK.", None, False, False, 0.0)
    assert ctx.render_history([step]) == "> think: the key is on the desk\nOK."


def test_empty_history_and_memory():
    assert ctx.scoring_context("Goal.", "Room.", []) == "Room.\nGoal."
    text = ctx.scoring_context("Goal.", "Room.", [], memory=["I looped.", "Try the shelf."])
    assert text == "Your memory for the task below:\nTrial 1: I looped.\nTrial 2: Try the shelf.\nRoom.\nGoal."


def test_react_prompt_layout():
    prompt = ctx.react_prompt("Solve it. Here are {n_demos} examples.", ["demo A\n> x\ny", "demo B"],
                              "Room.\nGoal.")
    assert prompt == ("Solve it. Here are 2 examples.\n\ndemo A\n> x\ny\n\ndemo B\n\n"
                      "Here is the task.\nRoom.\nGoal.\n>")


def test_unknown_rendering_is_named():
    with pytest.raises(ValueError, match="'sideways'"):
        ctx.render_history(STEPS, rendering="sideways")


@pytest.mark.parametrize("reply, expected", [
    (" go to desk 1", ("action", "go to desk 1")),
    ("> take  key 1 from desk 1\n> more", ("action", "take key 1 from desk 1")),
    (" think: first find the key", ("think", "first find the key")),
    ("Think: Upper-case prefix", ("think", "Upper-case prefix")),
    ("put key 1 in/on desk 1", ("action", "put key 1 in/on desk 1")),
])
def test_parse_reply(reply, expected):
    assert parse_reply(reply) == expected


@pytest.mark.parametrize("reply, reason", [
    ("", "empty reply"), ("   \n go", "empty reply"), (">", "empty reply"),
    ("...", "no action"), ("42 !", "no action"), ("think:", "empty thought"), ("think: ...", "empty thought"),
])
def test_malformed_replies_raise_format_error(reply, reason):
    with pytest.raises(FormatError) as err:
        parse_reply(reply)
    assert err.value.reason == reason and err.value.reply == reply


def test_fixed_action_space_filters_and_falls_back():
    cands = ["look", "go to desk 1", "Inventory", " help ", "open drawer 1"]
    assert fixed_action_space(cands) == ["go to desk 1", "open drawer 1"]
    assert fixed_action_space(["look", "inventory"]) == [FALLBACK_ACTION]
    assert drop_excluded(["look", "inventory"]) == []


def test_parse_actions_keeps_duplicates_drops_thoughts_and_malformed():
    replies = [" go to desk 1", "think: hmm", "", " go to desk 1", "...", " open drawer 1"]
    assert parse_actions(replies) == ["go to desk 1", "go to desk 1", "open drawer 1"]
