"""ICAL: the strict program parser, refinement rounds, feedback, noisy inputs (doubles only)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_doubles import FakeLM, HangingEnv, ScriptedEnv
from agent_shell.ical import HumanFeedback, LearnConfig, execute, learn_example, parse_program
from agent_shell.ical.learn import abstraction_prompt
from agent_shell.ical.noisy import corrupt_actions, corrupted_expert, from_results, replay
from agent_shell.ical.program import KINDS, Annotation, Program

ALLOWED = ["go to desk 1", "take key 1 from desk 1", "go to window 1", "examine wall 1"]
GOOD = """Abstractions:
causal: keys lie on desks.
state: key 1, desk 1
Program:
subgoal: find the key
> go to desk 1
> Take  key 1 from DESK 1
effect: I hold key 1.
End
trailing text is ignored"""


def test_parser_reads_sections_actions_and_annotations_in_place():
    parsed = parse_program(GOOD, ALLOWED)
    assert parsed.ok and parsed.issues == ()
    p = parsed.program
    assert p.actions == ("go to desk 1", "take key 1 from desk 1")  # the candidate's own spelling
    assert [(a.kind, a.text) for a in p.abstractions] == [("causal", "keys lie on desks."), ("state", "key 1, desk 1")]
    assert [(n.kind, n.at) for n in p.notes] == [("subgoal", 0), ("effect", 2)]
    assert p.items()[2:] == [("think", "think: Subgoal: find the key"), ("act", "go to desk 1"),
                             ("act", "take key 1 from desk 1"), ("think", "think: Effect: I hold key 1.")]


@pytest.mark.parametrize("text, reason", [
    ("", "empty output"),
    ("   \n\n", "empty output"),
    ("Program:\n> go to desk 1\nEnd", "missing section Abstractions"),
    ("Abstractions:\ncausal: x\nEnd", "missing section Program"),
    ("Abstractions:\nProgram:\n> go to desk 1", "no abstraction"),
    ("Abstractions:\ncausal: x\nProgram:\nsubgoal: y\nEnd", "no actions"),
    ("Abstractions:\ncausal: x\nProgram:\n> fly to the moon", "action outside the candidate sets"),
    ("Abstractions:\ncausal: x\nProgram:\nmood: happy\n> go to desk 1", "unknown annotation kind"),
    ("Abstractions:\ncausal:\nProgram:\n> go to desk 1", "empty annotation"),
    ("Abstractions:\ncausal: x\nProgram:\ngo to desk 1 then take the key", "unreadable line"),
    ("Abstractions:\ncausal: x\n> go to desk 1\nProgram:\n> go to desk 1", "unreadable line"),
])
def test_malformed_outputs_are_rejected_with_their_reason(text, reason):
    parsed = parse_program(text, ALLOWED)
    assert not parsed.ok and parsed.program is None
    assert reason in parsed.reasons


def test_every_defect_is_listed_with_its_line():
    parsed = parse_program("Abstractions:\ncausal: x\nProgram:\n> fly\n> swim\n> go to desk 1", ALLOWED)
    assert [(i.reason, i.line, i.text) for i in parsed.issues] == [
        ("action outside the candidate sets", 4, "fly"), ("action outside the candidate sets", 5, "swim")]
    assert parse_program("Abstractions:\ncausal: x\nProgram:\n> fly", None).ok  # no set given: any action


_text = st.text(st.characters(whitelist_categories=("Ll", "Lu", "Nd"), whitelist_characters=" ,."),
                min_size=1).map(lambda s: " ".join(s.split())).filter(bool)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(KINDS), _text), min_size=1, max_size=3),
       st.lists(st.sampled_from(ALLOWED), min_size=1, max_size=6),
       st.lists(st.tuples(st.sampled_from(KINDS), _text, st.integers(0, 6)), max_size=4))
def test_written_programs_parse_back_to_themselves(abstractions, actions, notes):
    notes = sorted([(k, t, min(at, len(actions))) for k, t, at in notes], key=lambda n: n[2])
    program = Program(tuple(Annotation(k, t) for k, t in abstractions), tuple(actions),
                      tuple(Annotation(k, t, at) for k, t, at in notes))
    assert parse_program(program.text(), ALLOWED).program == program
    assert Program.from_record(program.to_record()) == program


# -- execution and refinement ------------------------------------------------------------------------

def program_for(*actions: str) -> str:
    return "causal: keys lie on desks.\nProgram:\nsubgoal: get it\n" + "\n".join(f"> {a}" for a in actions)


def expert_trajectory(env, task_id):
    from agent_doubles import TASKS

    return replay(env, task_id, TASKS[task_id][1])


def test_execution_wins_and_records_annotations_as_thoughts():
    env = ScriptedEnv()
    program = parse_program(GOOD, ALLOWED).program
    run = execute(env, "a/1", program)
    assert run.won and run.failure is None
    kinds = [s.kind for s in run.trajectory.steps]
    assert kinds == ["think", "think", "think", "env", "env"] and run.trajectory.won  # done: the effect is cut
    assert env.engine_actions == ["go to desk 1", "take key 1 from desk 1"]  # thoughts never reach it


def test_execution_stops_at_a_non_candidate_with_the_valid_actions_as_feedback():
    env = ScriptedEnv()
    run = execute(env, "a/1", Program((Annotation("causal", "x"),), ("go to desk 1", "go to desk 1")))
    assert not run.won and run.failure["reason"] == "not a candidate" and run.failure["step"] == 1
    assert "take key 1 from desk 1" in run.feedback and env.engine_actions == ["go to desk 1"]
    run = execute(env, "a/1", Program((Annotation("causal", "x"),), ("go to window 1",)))
    assert run.failure["reason"] == "invalid action" and "Nothing happens." in run.feedback
    run = execute(env, "a/1", Program((Annotation("causal", "x"),), ("go to desk 1",)))
    assert run.failure["reason"] == "goal not reached"


def test_refinement_stops_after_max_rounds_and_records_every_round():
    env = ScriptedEnv()
    noisy = expert_trajectory(env, "a/1")
    lm = FakeLM(replies=lambda prompt, temperature, n: [program_for("go to window 1")] * n)
    for max_rounds in (0, 1, 3):
        before = len(lm.prompts)
        out = learn_example(lm, env, noisy, config=LearnConfig(max_rounds=max_rounds))
        assert len(out.rounds) == max_rounds + 1 and len(lm.prompts) - before == max_rounds + 1
        assert out.example is None and out.reason == "execution: invalid action"
        assert [r["kind"] for r in out.rounds] == ["abstract"] + ["revise"] * max_rounds
    assert "Feedback: Action 1 'go to window 1' failed" in lm.prompts[-1]


def test_a_revision_that_fixes_the_program_is_kept_after_one_round():
    env = ScriptedEnv()
    noisy = expert_trajectory(env, "a/1")
    lm = FakeLM(replies=[program_for("go to desk 1"), program_for("go to desk 1", "take key 1 from desk 1")])
    out = learn_example(lm, env, noisy, config=LearnConfig(max_rounds=3))
    assert out.example is not None and out.reason is None and len(out.rounds) == 2
    assert out.example.rounds == 1 and out.example.trajectory.won
    assert out.rounds[0]["failure"]["reason"] == "goal not reached"
    assert out.abstracted


def test_an_unparsable_abstraction_is_revised_with_the_parse_issues():
    env = ScriptedEnv()
    noisy = expert_trajectory(env, "a/1")
    lm = FakeLM(replies=["I do not know.", "Still no."])
    out = learn_example(lm, env, noisy, config=LearnConfig(max_rounds=1))
    assert not out.abstracted and out.example is None
    assert out.reason.startswith("parse: ") and "unreadable line" in out.reason
    assert "could not be read" in lm.prompts[-1]


def test_human_feedback_enter_accepts_and_a_line_becomes_feedback():
    env = ScriptedEnv()
    noisy = expert_trajectory(env, "a/1")
    shown: list[str] = []
    answers = iter(["", "", ""])
    human = HumanFeedback(ask=lambda prompt: next(answers), show=shown.append)
    lm = FakeLM(replies=[program_for("go to desk 1", "take key 1 from desk 1")])
    out = learn_example(lm, env, noisy, config=LearnConfig(max_rounds=1), feedback=human)
    assert out.example is not None and any("> go to desk 1" in s for s in shown)
    answers = iter(["check the desk twice", "", "", ""])
    human = HumanFeedback(ask=lambda prompt: next(answers), show=shown.append)
    lm = FakeLM(replies=lambda prompt, t, n: [program_for("go to desk 1", "take key 1 from desk 1")] * n)
    out = learn_example(lm, env, noisy, config=LearnConfig(max_rounds=1), feedback=human)
    assert out.rounds[0]["failure"]["reason"] == "human feedback" and out.example is not None
    assert "a person said: check the desk twice" in lm.prompts[-1]


def test_prompt_shows_the_noisy_record_and_the_builtin_example_when_memory_is_empty():
    env = ScriptedEnv()
    prompt = abstraction_prompt(expert_trajectory(env, "b/1"))
    assert "> open door 1" in prompt and "put a hot apple in fridge" in prompt and prompt.endswith("Abstractions:\n")


# -- noisy inputs --------------------------------------------------------------------------------------

def test_corruptions_are_seeded_and_record_the_known_answer():
    actions = ["go to desk 1", "take key 1 from desk 1", "go to door 1"]
    sets = [["go to desk 1", "go to door 2", "examine key 2"]] * 3
    a = corrupt_actions(actions, sets, np.random.default_rng(3), ["insert", "repeat", "drop", "swap"])
    b = corrupt_actions(actions, sets, np.random.default_rng(3), ["insert", "repeat", "drop", "swap"])
    assert a == b
    seq, records = corrupt_actions(actions, sets, np.random.default_rng(0), ["drop"])
    assert len(seq) == 2 and records[0]["original"] not in seq
    seq, records = corrupt_actions(actions, sets, np.random.default_rng(0), ["repeat"])
    assert seq[records[0]["at"]] == seq[records[0]["at"] - 1]
    seq, records = corrupt_actions(actions, sets, np.random.default_rng(0), ["swap"])
    assert records[0]["original"] in actions and seq[records[0]["at"]] != records[0]["original"]
    with pytest.raises(ValueError, match="unknown corruption kind 'teleport'"):
        corrupt_actions(actions, sets, np.random.default_rng(0), ["teleport"])
    with pytest.raises(ValueError, match="empty action sequence"):
        corrupt_actions([], [], np.random.default_rng(0), ["drop"])


def test_corrupted_expert_replays_in_the_game():
    env = ScriptedEnv()
    experts = [expert_trajectory(env, t) for t in ("a/1", "b/1")]
    noisy = corrupted_expert(env, experts, seed=1, n_corruptions=2)
    again = corrupted_expert(env, experts, seed=1, n_corruptions=2)
    assert [n.to_record() for n in noisy] == [n.to_record() for n in again]
    for n, e in zip(noisy, experts):
        assert n.meta["reference_actions"] == [s.action for s in e.steps]
        assert len(n.meta["corruptions"]) == 2 and n.meta["noisy_id"] == f"corrupted:seed1:{e.task_id}"


def test_a_corrupted_expert_replay_past_its_time_limit_is_skipped_with_one_line():
    """a/1's replay hangs at its first engine step: skipped at the limit with one line naming it;
    b/1's noisy trajectory is the one it is without a/1 (its corruption is seeded by its task)."""
    env = ScriptedEnv()
    experts = [expert_trajectory(env, t) for t in ("a/1", "b/1")]
    expected = corrupted_expert(env, experts[1:], seed=1)
    skipped = []
    got = corrupted_expert(HangingEnv(hang_on=("a/1",), after=0), experts, seed=1, time_limit=1.0,
                           on_skip=skipped.append)
    assert [n.to_record() for n in got] == [n.to_record() for n in expected]
    assert skipped == ["skipped the corrupted expert trajectory of a/1: EpisodeTimeout: episode ran past its "
                       "wall-clock limit of 1 s; --resume replays it again"]


def test_results_files_give_trials_and_bad_lines_one_line_errors(tmp_path):
    from agent_shell.agents import build_agent
    from agent_doubles import play_agent

    env = ScriptedEnv()
    lm = FakeLM(replies=["> go to window 1"])
    path = tmp_path / "run" / "results.jsonl"
    play_agent(env, build_agent("react", lm, {"fetch": ["demo"]}), ["a/1", "a/2"], path, max_steps=3)
    failed = from_results(path, "failed")
    assert len(failed) == 2 and not failed[0].won and failed[0].meta["noisy_source"]["agent"] == "react"
    assert from_results(path, "won") == []
    with open(path, "ab") as fh:
        fh.write(b'{"agent": "react", "task_id": "a/3"')
    with pytest.raises(ValueError, match=r"results.jsonl:3: truncated line") as err:
        from_results(path)
    assert "\n" not in str(err.value)
    other = tmp_path / "other.jsonl"
    other.write_text('{"study": "probe"}\n')
    with pytest.raises(ValueError, match=r"other.jsonl:1: not an episode record"):
        from_results(other)
