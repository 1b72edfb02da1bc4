"""Expert decisions (seed Eq. 5), the concept's data: history before each expert action, its
(filtered) candidate set and the expert's index."""

import pytest

from agent_shell.expert_decisions import decision_examples, drop_actions
from envs.trajectory import Step, Trajectory


def make_trajectory(task_id="t1") -> Trajectory:
    steps = [
        Step("env", "look", "You see a desk 1.", ["go to desk 1", "look", "inventory"], False, False, 0.0),
        Step("think", "think: the mug is probably on the desk", "OK.", None, False, False, 0.0),
        Step("env", "go to desk 1", "On the desk 1, you see a mug 1.", ["go to desk 1", "look"], False, False, 0.0),
        Step("env", "take mug 1 from desk 1", "You pick up the mug 1.", ["take mug 1 from desk 1", "look"], True, True, 1.0,
             {"note": "x"}),
    ]
    return Trajectory("alfworld", task_id, "pick_and_place_simple", "Your task is to: put a mug in desk.",
                      "You are in the middle of a room.", steps, True, 1.0, {"expert": "test"})


def test_decision_examples_count_history_and_expert_index():
    traj = make_trajectory()
    examples, skipped = decision_examples(traj)
    assert (len(examples), skipped) == (3, 0)
    second = examples[1]
    assert second.expert_action == "go to desk 1"
    assert second.candidates[second.expert_index] == traj.steps[2].action
    assert [s.action for s in second.history] == ["look", "think: the mug is probably on the desk"]
    # the context never contains the action's own feedback
    assert all(s.observation != "On the desk 1, you see a mug 1." for s in second.history)


def test_filtered_expert_look_is_skipped_and_counted():
    examples, skipped = decision_examples(make_trajectory(), drop_actions(["look", "inventory", "help"]))
    assert (len(examples), skipped) == (2, 1)
    assert all("look" not in e.candidates for e in examples)
    assert examples[0].history[0].action == "look"  # the skipped step still shapes later contexts


def test_expert_action_missing_from_saved_set_is_an_error():
    traj = make_trajectory("broken")
    traj.steps[2] = Step("env", "go to desk 9", "", ["go to desk 1"], False, False, 0.0)
    with pytest.raises(ValueError, match=r"'broken'.*step 2"):
        decision_examples(traj)
