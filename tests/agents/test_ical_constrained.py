"""ICAL's constrained and anchored decoding: the grammar, the admissible commands, the record anchor."""

from __future__ import annotations

import numpy as np
import pytest

from agent_doubles import ScriptedEnv
from agent_shell.ical import LearnConfig, learn_example, parse_program
from agent_shell.ical.constrained import NOTE_QUESTIONS, ChatNotes, anchored_options, constrained_program
from agent_shell.ical.learn import abstraction_prompt
from agent_shell.ical.noisy import replay
from agent_shell.lm.protocol import CandidateScores

PROMPT = "Task: solve a/1.\nNoisy record:\n> go to desk 1\nClean example:\nAbstractions:\n"


class ChoosingLM:
    """A double whose option scores come from ``rank(option) -> log q`` (one token each, so no
    length normalisation), and whose every generated line is ``note``."""

    name = "choosing-lm"
    hidden_size = 2

    def __init__(self, rank, note="keys lie on desks."):
        self.rank = rank
        self.note = note
        self.contexts: list[str] = []
        self.offered: list[list[str]] = []
        self.generated: list = []

    def score(self, context, candidates, action_prefix):
        self.contexts.append(context)
        self.offered.append(list(candidates))
        m = len(candidates)
        return CandidateScores(np.asarray([self.rank(c) for c in candidates], np.float32),
                               np.ones(m, np.int32), np.zeros((m, 2), np.float32))

    def generate(self, prompt, max_new_tokens=64, stop=(), temperature=0.0, n=1, seed=None):
        self.generated.append(prompt)
        return [self.note] * n

    def fork(self):
        return self


def actions_first(option: str) -> float:
    """Any action over notes and End; among actions, the first offered wins (ties: first)."""
    return 0.0 if option.startswith("> ") else -5.0


def test_anchored_options_keep_or_skip_fix_the_verb_or_open_everything():
    admissible = ["look", "go to desk 1", "take key 1 from desk 1", "use lamp 1"]
    # the next record action is admissible: it and the admissible ones after it
    assert anchored_options(["go to desk 1", "fly", "look"], admissible) == ["go to desk 1", "look"]
    # a wrong object: the same verb's admissible commands, then the later record actions
    assert anchored_options(["take key 9 from desk 1", "look"], admissible) == ["take key 1 from desk 1", "look"]
    # nothing of the record fits: every admissible command (a missing step)
    assert anchored_options(["open fridge 1"], admissible) == admissible


def test_every_action_is_admissible_where_written_and_the_program_stops_at_the_goal():
    env = ScriptedEnv()
    lm = ChoosingLM(lambda o: 0.0 if o in ("> go to desk 1", "> take key 1 from desk 1", "effect:") else -3.0)
    text, admissible = constrained_program(lm, env, "a/1", PROMPT, max_actions=6)
    parsed = parse_program(text, admissible)
    assert parsed.ok, parsed.issues
    assert parsed.program.actions == ("go to desk 1", "take key 1 from desk 1")  # the goal: End, no 6 actions
    assert text.endswith("\nEnd")
    assert [(a.kind, a.text) for a in parsed.program.abstractions] == [("causal", "keys lie on desks."),
                                                                       ("state", "keys lie on desks.")]
    assert [n.kind for n in parsed.program.notes] == ["effect"]  # effect after the first action only
    for options in lm.offered:  # every action option was a command of the scratch game
        assert {o[2:] for o in options if o.startswith("> ")} <= admissible
    # the LM read the game's answers under the actions (the program itself has none)
    assert "> go to desk 1\nYou go to desk 1.\n" in lm.contexts[-1]
    assert "You go to desk 1." not in text


def test_grammar_allows_only_its_line_options():
    env = ScriptedEnv()
    lm = ChoosingLM(lambda o: {"subgoal:": 1.0, "End": 0.5}.get(o, 0.0))
    text, _ = constrained_program(lm, env, "a/1", PROMPT, max_actions=3)
    first, second = lm.offered[0], lm.offered[1]
    assert "End" not in first and "effect:" not in first and "subgoal:" in first  # right after Program:
    assert second and all(o.startswith("> ") for o in second)  # after a subgoal: an action must follow
    # subgoal (preferred) and an action alternate; `look` twice at most; the third action ends it
    note = "subgoal: keys lie on desks."
    assert text.split("Program:\n")[1].splitlines() == [note, "> look", note, "> look", note, "> inventory", "End"]


def test_an_empty_note_is_dropped_and_does_not_loop():
    env = ScriptedEnv()
    lm = ChoosingLM(lambda o: {"subgoal:": 2.0, "effect:": 1.5}.get(o, -1.0 if o != "End" else -2.0), note="")
    text, admissible = constrained_program(lm, env, "a/1", PROMPT, max_actions=2)
    assert "subgoal" not in text and "effect" not in text and "causal" not in text
    parsed = parse_program(text, admissible)
    assert not parsed.ok and "no abstraction" in parsed.reasons  # the strict parser still judges it
    assert len(parsed.reasons) == 1


def test_a_command_is_written_at_most_max_uses_times_and_at_most_max_actions():
    env = ScriptedEnv()
    lm = ChoosingLM(lambda o: 1.0 if o == "> go to window 1" else (0.0 if o == "> look" else -4.0))
    text, _ = constrained_program(lm, env, "a/1", PROMPT, max_actions=5, max_uses=2)
    actions = [line[2:] for line in text.splitlines() if line.startswith("> ")]
    assert actions == ["go to window 1", "go to window 1", "look", "look", "inventory"]


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="Abstractions"):
        constrained_program(ChoosingLM(actions_first), ScriptedEnv(), "a/1", "no header", max_actions=3)
    with pytest.raises(ValueError, match="max_actions"):
        constrained_program(ChoosingLM(actions_first), ScriptedEnv(), "a/1", PROMPT, max_actions=0)
    with pytest.raises(ValueError, match="decoding"):
        LearnConfig(decoding="beam")


def test_anchored_decoding_repairs_a_repeat_and_a_swapped_object_and_keeps_the_example():
    env = ScriptedEnv()
    noisy = replay(env, "a/1", ["go to desk 1", "go to desk 1", "take key 9 from desk 1"])
    assert not noisy.won
    lm = ChoosingLM(actions_first)
    out = learn_example(lm, env, noisy, config=LearnConfig(max_rounds=0, decoding="anchored"))
    assert out.example is not None and out.rounds[0]["won"]
    assert out.example.program.actions == ("go to desk 1", "take key 1 from desk 1")
    assert out.example.source["decoding"] == "anchored"
    # plain constrained decoding takes the first admissible command instead (look, look, inventory): no win
    out = learn_example(ChoosingLM(actions_first), env, noisy, config=LearnConfig(max_rounds=0, decoding="constrained"))
    assert out.example is None and out.rounds[0]["program"]["actions"][:2] == ["look", "look"]


def test_constrained_revisions_see_the_feedback_and_every_round_is_recorded():
    env = ScriptedEnv()
    noisy = replay(env, "a/1", ["look", "go to desk 1"])
    lm = ChoosingLM(lambda o: 0.0 if o == "End" else -1.0)  # stops before the goal every time
    out = learn_example(lm, env, noisy, config=LearnConfig(max_rounds=2, decoding="anchored"))
    assert [r["kind"] for r in out.rounds] == ["abstract", "revise", "revise"]
    assert out.example is None and out.reason == "execution: goal not reached"
    assert any("Feedback: All 1 actions ran, but the goal was not reached" in c for c in lm.contexts)
    assert abstraction_prompt(noisy) in lm.contexts[0]


def test_chat_notes_ask_the_kind_s_question_about_the_task_and_keep_the_main_prompt_apart():
    env = ScriptedEnv()
    lm = ChoosingLM(lambda o: 0.0 if o in ("> go to desk 1", "> take key 1 from desk 1", "effect:") else -3.0,
                    note="the key is held.\nmore")
    notes = ChatNotes(lm, "Your task is to: solve a/1.", ["go to desk 1", "look"])
    text, _ = constrained_program(lm, env, "a/1", PROMPT, max_actions=4, notes=notes)
    requests = [m[0]["content"] for m in lm.generated]  # chat messages, not the abstraction prompt
    assert all(isinstance(m, list) and m[0]["role"] == "user" for m in lm.generated)
    causal, state, effect = requests
    assert causal.startswith("Your task is to: solve a/1.\nActions of an attempt:\ngo to desk 1\nlook\n")
    assert causal.endswith(NOTE_QUESTIONS["causal"]) and state.endswith(NOTE_QUESTIONS["state"])
    assert "Last action: go to desk 1\nThe game answered: You go to desk 1." in effect
    assert "subgoal" not in requests and notes.request("subgoal", [], None).split("\n")[1] == "Done so far: nothing."
    assert text.count("the key is held.") == 3 and "more" not in text  # the first line of each reply
    with pytest.raises(ValueError, match="notes"):
        LearnConfig(notes="prose")
