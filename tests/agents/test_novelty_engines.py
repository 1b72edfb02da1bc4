"""The ``novelty`` block on recorded loops of each engine, in each engine's own wording, and its
counts through the per-set standardisation the fit applies (seed App. B)."""

from __future__ import annotations

import numpy as np
import pytest

import cb_core
from agent_shell.features import DecisionInput
from agent_shell.features.novelty import COLUMNS, Novelty
from cb_io.feedback import ENGINE_FEEDBACK, is_nothing, normalise
from cb_io.records import Trajectory

COL = {c: i for i, c in enumerate(COLUMNS)}
TW_STATUS = "\n\n>" + " " * 128 + "-= Closet =-0/{}"  # TextWorld's status line: room, score / moves


def record(env: str, observation: str, loop: list[tuple[str, str]]) -> Trajectory:
    """A trajectory record of ``env`` whose env steps are ``loop`` (action, feedback), one think step first."""
    steps = [{"kind": "think", "action": "think: look around", "observation": "OK.", "candidates": None,
              "done": False, "won": False, "score": 0.0, "info": {}}]
    steps += [{"kind": "env", "action": a, "observation": o, "candidates": [a], "done": False, "won": False,
               "score": 0.0, "info": {}} for a, o in loop]
    return Trajectory.from_record({"schema_version": 1, "env": env, "task_id": f"{env}/1", "task_type": "t",
                                   "instruction": "Your task is to: do it.", "observation": observation,
                                   "steps": steps, "won": False, "score": 0.0, "meta": {}})


def block(traj: Trajectory, candidates: list[str]) -> np.ndarray:
    d = DecisionInput("ctx", traj.instruction, traj.observation, tuple(traj.steps), tuple(candidates))
    return Novelty().extract(d, None, None)


def fired(b: np.ndarray, column: str, candidates: list[str]) -> list[str]:
    return [c for c, v in zip(candidates, b[:, COL[column]]) if v]


# each engine's loop: (env, o0, (action, feedback) steps, candidates, expected "nothing", expected "unchanged")
ALFWORLD = ("alfworld", "You are in the middle of a room. Looking quickly around you, you see a drawer 1.", [
    ("go to drawer 1", "You arrive at drawer 1. The drawer 1 is closed."),
    ("take mug 1 from drawer 1", "Nothing happens."),
    ("open drawer 1", "You open the drawer 1. The drawer 1 is open. In it, you see a mug 1."),
    ("examine drawer 1", "The drawer 1 is open. In it, you see a mug 1."),
    ("examine drawer 1", "The drawer 1 is open. In it, you see a mug 1."),
], ["take mug 1 from drawer 1", "open drawer 1", "examine drawer 1", "go to drawer 1", "close drawer 1"],
    ["take mug 1 from drawer 1"], ["examine drawer 1"])

TEXTWORLD = ("textworld", "-= Closet =-\nYou've entered a closet.\n\nYou can see a TextWorld style safe."
             + TW_STATUS.format(1), [
    ("open TextWorld style safe", "You open the TextWorld style safe." + TW_STATUS.format(2)),
    ("examine counter", "The counter is reliable." + TW_STATUS.format(3)),
    ("examine counter", "The counter is reliable." + TW_STATUS.format(4)),  # only the move counter differs
    ("take key then go north", "I didn't understand that sentence."),     # the adapter's answer to a chained input
    ("close TextWorld style safe", "You close the TextWorld style safe." + TW_STATUS.format(5)),
    ("look", "-= Closet =-\nYou've entered a closet." + TW_STATUS.format(6)),
], ["take key then go north", "examine counter", "close TextWorld style safe", "open TextWorld style safe", "look",
    "go east"], ["take key then go north"], ["examine counter"])

SCIENCEWORLD = ("scienceworld", "This room is called the kitchen. In it, you see: \n\tthe agent\n\ta sink, which is "
                "turned off. In the sink is: nothing.\nYou also see:\n\tA door to the hallway (that is open)", [
    ("look around", "This room is called the kitchen. In it, you see: \n\tthe agent\n\ta sink, which is turned off. "
                    "In the sink is: nothing.\nYou also see:\n\tA door to the hallway (that is open)"),
    ("open door to hallway", "The door is already open."),
    ("activate sink", "The sink is now activated."),
    ("go to bathroom", "It's not clear how to get there from here."),
    ("activate kitchen", "The kitchen is not something that can be activated."),
    ("wait1", "You decide to wait for 1 iterations."),
], ["look around", "open door to hallway", "activate sink", "go to bathroom", "activate kitchen", "wait1",
    "go to hallway"], ["open door to hallway", "go to bathroom", "activate kitchen"], ["look around"])


@pytest.mark.parametrize("env, o0, loop, candidates, nothing, unchanged", [ALFWORLD, TEXTWORLD, SCIENCEWORLD],
                         ids=["alfworld", "textworld", "scienceworld"])
def test_outcome_columns_fire_on_each_engines_wording(env, o0, loop, candidates, nothing, unchanged):
    traj = record(env, o0, loop)
    b = block(traj, candidates)
    assert fired(b, "last_outcome_nothing", candidates) == nothing
    assert fired(b, "last_outcome_unchanged", candidates) == unchanged
    assert fired(b, "taken_last_step", candidates) == [loop[-1][0]]
    never = [c for c in candidates if c not in {a for a, _ in loop}]
    assert never and not b[[candidates.index(c) for c in never], :COL["object_taken_ge_1"]].any()
    # each engine's own rule agrees with the rule of every engine together (what the block applies)
    assert [a for a, o in loop if is_nothing(o, env)] == [a for a, o in loop if is_nothing(o)] == nothing


def test_textworld_status_line_is_cut_before_comparing():
    a, b = "The counter is reliable." + TW_STATUS.format(3), "The counter is reliable." + TW_STATUS.format(4)
    assert a != b and normalise(a, "textworld") == normalise(b, "textworld") == "The counter is reliable."
    assert normalise(a) == "The counter is reliable."  # no engine named: every rule
    text = "-= Kitchen =-\nYou're now in a kitchen.\n\nYour score has just gone up by one point."
    assert normalise(text + TW_STATUS.format(9), "textworld") == text  # the room heading stays, only the tail goes
    assert normalise("Nothing happens.", "alfworld") == "Nothing happens."


def test_each_engines_refusals_are_no_other_engines_and_the_adapters_use_them():
    from envs.alfworld import INVALID_FEEDBACK
    from envs.textworld import CHAINED_FEEDBACK

    refusals = {"alfworld": [INVALID_FEEDBACK],
                "textworld": [CHAINED_FEEDBACK, "That's not a verb I recognise." + TW_STATUS.format(3)],
                "scienceworld": ["No known action matches that input.", "The door is already open.",
                                 "Its not clear how to go to/through a orange box.", "The sink is not openable."]}
    for env, texts in refusals.items():
        for text in texts:
            assert is_nothing(text, env) and is_nothing(text)
            assert not any(is_nothing(text, other) for other in ENGINE_FEEDBACK if other != env), (env, text)
    for text in ("You open the TextWorld style safe.", "The sink is now activated.",
                 "You arrive at drawer 1. The drawer 1 is closed.", "You decide to wait for 1 iterations."):
        assert not is_nothing(text)
    with pytest.raises(ValueError, match="no feedback rule for environment 'nethack'"):
        is_nothing("x", "nethack")


def app_b_features(x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Seed App. B, written out here: phi_k = (x_k - mean_A x_k) / max(std_A x_k, eps), then M ** -0.5."""
    std = np.maximum(x.std(axis=0), eps)
    return np.concatenate([(x - x.mean(axis=0)) / std, np.full((len(x), 1), len(x) ** -0.5)], axis=1)


def test_a_count_of_19_stays_distinguishable_from_1_after_the_standardisation():
    candidates = ["open TextWorld style safe", "examine counter", "go east"]
    opened = "You open the TextWorld style safe."
    blocks = {}
    for n in (1, 19):
        loop = [("open TextWorld style safe", opened + TW_STATUS.format(k + 2)) for k in range(n)]
        loop.append(("examine counter", "The counter is reliable." + TW_STATUS.format(n + 2)))
        blocks[n] = block(record("textworld", "-= Closet =-" + TW_STATUS.format(1), loop), candidates)
    phi = {n: app_b_features(b.astype(np.float64)) for n, b in blocks.items()}
    # the standardisation the fit applies is this one
    dec = cb_core.decisions_from_lists([blocks[1], blocks[19]], [np.zeros(3, np.float32)] * 2,
                                       [np.ones(3, np.int32)] * 2, [0, 0])
    got = np.asarray(cb_core.features(dec))
    np.testing.assert_allclose(got, np.concatenate([phi[1], phi[19]]), rtol=1e-5, atol=1e-5)
    # the safe's row: a count of 19 fires taken >= 2 .. >= 16, which 1 leaves constant (phi 0)
    assert np.abs(phi[19][0] - phi[1][0]).max() > 1.0
    for t in ("taken_ge_2", "taken_ge_4", "taken_ge_8", "taken_ge_16"):
        assert phi[1][0, COL[t]] == 0 and phi[19][0, COL[t]] > 1.0
    # a single log(1 + count) column, alone in its set, cannot tell them apart after the same standardisation
    alone = {n: app_b_features(np.log1p([[n], [0], [0]]))[:, 0] for n in (1, 19)}
    np.testing.assert_allclose(alone[1], alone[19])
