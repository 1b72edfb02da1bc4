"""History renderings and layouts: exact texts on a hand-made trajectory, shuffle
invariants, NO UPDATE inserting nothing, chat messages, Reference blocks, demonstrations."""

from collections import Counter

import numpy as np
import pytest

from agent_shell import context as ctx
from agent_shell import history as hist
from agent_shell.agents import AgentConfig
from cb_io.records import Step

INSTRUCTION = "Your task is to: open the door."
O0 = "You are in a room."
TASK = f"{O0}\n{INSTRUCTION}"


def env_step(action, obs, done=False):
    return Step("env", action, obs, [action, "look"], done, False, 0.0)


def think(text):
    return Step("think", text, "OK.", None, False, False, 0.0)


STEPS = [env_step("go to desk 1", "On the desk 1, you see a key 1."),
         think("think: I need the key."),
         env_step("take key 1 from desk 1", "You pick up the key 1 from the desk 1."),
         env_step("go to door 1", "The door 1 is closed."),
         env_step("open door 1", "You open the door 1.")]

RAW = ("> go to desk 1\nOn the desk 1, you see a key 1.\n"
       "> think: I need the key.\nOK.\n"
       "> take key 1 from desk 1\nYou pick up the key 1 from the desk 1.\n"
       "> go to door 1\nThe door 1 is closed.\n"
       "> open door 1\nYou open the door 1.")

EXPECTED = {
    "raw": RAW,
    "causal": ('> go to desk 1\nResult of "go to desk 1": On the desk 1, you see a key 1.\n'
               "> think: I need the key.\nOK.\n"
               '> take key 1 from desk 1\nResult of "take key 1 from desk 1": You pick up the key 1 from the desk 1.\n'
               '> go to door 1\nResult of "go to door 1": The door 1 is closed.\n'
               '> open door 1\nResult of "open door 1": You open the door 1.'),
    "check": RAW + "\nBefore the next action, check the history above again: what did each earlier action "
                   "actually lead to?",
    "experience": ("> go to desk 1\nOn the desk 1, you see a key 1.\nExperience: Desks can hold keys.\n"
                   "> think: I need the key.\nOK.\n"
                   "> take key 1 from desk 1\nYou pick up the key 1 from the desk 1.\n"
                   "> go to door 1\nThe door 1 is closed.\nExperience: Doors here start closed.\n"
                   "> open door 1\nYou open the door 1."),
    # the calibrator writes different experiences, but shows them exactly as the Experience rendering
    "calibrator": ("> go to desk 1\nOn the desk 1, you see a key 1.\nExperience: Desks can hold keys.\n"
                   "> think: I need the key.\nOK.\n"
                   "> take key 1 from desk 1\nYou pick up the key 1 from the desk 1.\n"
                   "> go to door 1\nThe door 1 is closed.\nExperience: Doors here start closed.\n"
                   "> open door 1\nYou open the door 1."),
    "recent3": ("(2 earlier steps are not shown.)\n"
                "> take key 1 from desk 1\nYou pick up the key 1 from the desk 1.\n"
                "> go to door 1\nThe door 1 is closed.\n"
                "> open door 1\nYou open the door 1."),
    "obs-only": ("On the desk 1, you see a key 1.\nYou pick up the key 1 from the desk 1.\n"
                 "The door 1 is closed.\nYou open the door 1."),
    # seed 0, 5 steps: env actions (0, 2, 3, 4) take the actions of steps (4, 0, 2, 3)
    "shuffle-all": ("> open door 1\nOn the desk 1, you see a key 1.\n"
                    "> think: I need the key.\nOK.\n"
                    "> go to desk 1\nYou pick up the key 1 from the desk 1.\n"
                    "> take key 1 from desk 1\nThe door 1 is closed.\n"
                    "> go to door 1\nYou open the door 1."),
    # only step 0 is an env step before the three latest: nothing can move
    "shuffle-old": RAW,
}
EXPERIENCES = {0: "Desks can hold keys.", 3: "Doors here start closed."}


def test_every_rendering_has_a_documented_text():
    assert sorted(EXPECTED) == sorted(hist.RENDERINGS)


@pytest.mark.parametrize("rendering", sorted(EXPECTED))
def test_each_rendering_gives_the_documented_text(rendering):
    history = ctx.render_history(STEPS, rendering, experiences=EXPERIENCES, seed=0)
    assert history == EXPECTED[rendering]
    # the scoring context is the task block, then exactly that history
    assert ctx.scoring_context(INSTRUCTION, O0, STEPS, rendering, experiences=EXPERIENCES) == \
        TASK + "\n" + EXPECTED[rendering]


def test_shuffle_all_text_follows_the_documented_seeding():
    perm = np.random.default_rng([0, len(STEPS)]).permutation(4)
    env_idx = [0, 2, 3, 4]
    actions = [STEPS[env_idx[p]].action for p in perm]
    assert actions == ["open door 1", "go to desk 1", "take key 1 from desk 1", "go to door 1"]


def test_experiences_show_only_under_the_experience_rendering():
    for rendering in ("raw", "causal", "check", "recent3", "obs-only", "shuffle-all", "shuffle-old"):
        assert "Experience:" not in ctx.render_history(STEPS, rendering, experiences=EXPERIENCES)


def test_empty_history_renders_to_the_task_alone():
    for rendering in hist.RENDERINGS:
        assert ctx.scoring_context(INSTRUCTION, O0, [], rendering) == TASK, rendering
        assert ctx.scoring_context(INSTRUCTION, O0, [], rendering, layout="chat") == [
            {"role": "user", "content": TASK}], rendering


def test_causal_labels_every_env_observation_and_leaves_thoughts_alone():
    view = hist.render(STEPS, "causal")
    assert [e.step for e in view.entries] == list(range(len(STEPS)))
    for entry, step in zip(view.entries, STEPS):
        if step.kind == "think":
            assert entry.observation == "OK." and entry.action == "think: I need the key."
        else:
            assert entry.action == step.action
            assert entry.observation == f'Result of "{step.action}": {step.observation}'
    # same observations, same order: strip the label and get the raw view back
    stripped = [e.observation.split(": ", 1)[1] if STEPS[e.step].kind == "env" else e.observation
                for e in view.entries]
    assert stripped == [e.observation for e in hist.render(STEPS, "raw").entries]


def test_think_steps_render_with_or_without_a_stored_prefix():
    a = ctx.render_history([think("think: look first")], "causal")
    b = ctx.render_history([think("look first")], "causal")
    assert a == b == "> think: look first\nOK."


# -- shuffles ------------------------------------------------------------------------------
def long_history(n_env=14):
    steps = []
    for i in range(n_env):
        steps.append(env_step(f"go to shelf {i}", f"On the shelf {i}, you see nothing."))
        if i in (3, 8):
            steps.append(think(f"think: shelf {i} was empty."))
    steps.append(env_step("go to shelf 1", "On the shelf 1, you see nothing."))  # a duplicate action string
    return steps


LONG = long_history()


@pytest.mark.parametrize("rendering, keep", [("shuffle-all", 0), ("shuffle-old", hist.RECENT)])
def test_shuffles_keep_observations_and_permute_only_env_actions(rendering, keep):
    view = hist.render(LONG, rendering, seed=0)
    raw = hist.render(LONG, "raw")
    assert [e.observation for e in view.entries] == [e.observation for e in raw.entries]
    assert [e.step for e in view.entries] == list(range(len(LONG)))
    env = [i for i, s in enumerate(LONG) if s.kind == "env"]
    # the multiset of env action strings is preserved
    assert Counter(view.entries[i].action for i in env) == Counter(LONG[i].action for i in env)
    # think steps never move
    for i, s in enumerate(LONG):
        if s.kind == "think":
            assert view.entries[i].action == s.action
    # the latest `keep` steps are intact; older env actions really moved
    cut = len(LONG) - keep
    assert [e.action for e in view.entries[cut:]] == [e.action for e in raw.entries[cut:]]
    moved = [i for i in env if i < cut and view.entries[i].action != LONG[i].action]
    assert len(moved) >= 5
    # text layout: each observation stays under the action now assigned to its step
    text = ctx.render_history(LONG, rendering, seed=0)
    assert text == "\n".join(f"> {e.action}\n{e.observation}" for e in view.entries)


@pytest.mark.parametrize("rendering", ["shuffle-all", "shuffle-old"])
def test_shuffles_are_seeded(rendering):
    a = ctx.render_history(LONG, rendering, seed=3)
    assert a == ctx.render_history(LONG, rendering, seed=3)
    assert a != ctx.render_history(LONG, rendering, seed=4)
    assert a != ctx.render_history(LONG, "raw")


def test_shuffle_old_keeps_the_last_three_even_when_they_include_a_thought():
    steps = LONG[:9]  # ..., env 7, think, -> the last three are steps 6, 7, 8
    assert steps[-1].kind == "env" and steps[-2].kind == "env" and steps[4].kind == "think"
    view = hist.render(steps, "shuffle-old", seed=1)
    assert [e.action for e in view.entries[-3:]] == [s.action for s in steps[-3:]]


def test_short_histories_never_break_shuffle_old():
    for n in range(4):
        assert ctx.render_history(LONG[:n], "shuffle-old", seed=5) == ctx.render_history(LONG[:n], "raw")


# -- experiences -----------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["text", "chat"])
@pytest.mark.parametrize("experiences", [None, {}])
def test_no_update_inserts_nothing(layout, experiences):
    got = ctx.scoring_context(INSTRUCTION, O0, STEPS, "experience", layout=layout, experiences=experiences)
    assert got == ctx.scoring_context(INSTRUCTION, O0, STEPS, "raw", layout=layout)


def test_a_kept_experience_follows_its_source_transition():
    text = ctx.render_history(STEPS, "experience", experiences={2: "Keys can be carried."})
    assert ("> take key 1 from desk 1\nYou pick up the key 1 from the desk 1.\n"
            "Experience: Keys can be carried.\n> go to door 1\n") in text
    assert text.count("Experience:") == 1
    # an experience of a step not (yet) in the history is not shown
    assert ctx.render_history(STEPS[:2], "experience", experiences={2: "Keys can be carried."}) == \
        ctx.render_history(STEPS[:2], "raw")


# -- chat layout -----------------------------------------------------------------------------
def _texts_of(messages, role):
    return [m["content"] for m in messages if m["role"] == role]


@pytest.mark.parametrize("rendering", ["raw", "causal", "experience", "shuffle-all"])
def test_chat_layout_alternates_with_the_same_texts(rendering):
    msgs = ctx.scoring_context(INSTRUCTION, O0, STEPS, rendering, layout="chat", experiences=EXPERIENCES)
    assert msgs[0] == {"role": "user", "content": TASK}
    assert [m["role"] for m in msgs] == ["user"] + ["assistant", "user"] * len(STEPS)
    view = hist.render(STEPS, rendering, EXPERIENCES if rendering == "experience" else None)
    assert _texts_of(msgs, "assistant") == [e.action for e in view.entries]
    observations = [e.observation + (f"\nExperience: {e.experience}" if e.experience else "")
                    for e in view.entries]
    assert _texts_of(msgs, "user")[1:] == observations
    # the text layout carries the same texts
    assert ctx.scoring_context(INSTRUCTION, O0, STEPS, rendering, layout="text", experiences=EXPERIENCES) == \
        "\n".join([TASK] + [f"> {a}\n{o}" for a, o in zip(_texts_of(msgs, "assistant"), observations)])


def test_chat_layout_merges_consecutive_user_messages():
    msgs = ctx.scoring_context(INSTRUCTION, O0, STEPS, "obs-only", layout="chat")
    assert msgs == [{"role": "user", "content": TASK + "\n" + EXPECTED["obs-only"]}]
    recent = ctx.scoring_context(INSTRUCTION, O0, STEPS, "recent3", layout="chat")
    assert recent[0] == {"role": "user", "content": TASK + "\n(2 earlier steps are not shown.)"}
    assert [m["role"] for m in recent] == ["user"] + ["assistant", "user"] * 3
    check = ctx.scoring_context(INSTRUCTION, O0, STEPS, "check", layout="chat")
    assert check[-1] == {"role": "user", "content": "You open the door 1.\n" + hist.CHECK_REMINDER}
    assert len(check) == 1 + 2 * len(STEPS)


def test_react_prompt_chat_puts_header_and_demos_into_the_first_user_message():
    context = ctx.scoring_context(INSTRUCTION, O0, STEPS[:1], "raw", layout="chat")
    prompt = ctx.react_prompt("Solve it. Here are {n_demos} examples.", ["demo A\n> x\ny", " demo B "], context)
    assert prompt[0] == {"role": "user", "content": "Solve it. Here are 2 examples.\n\ndemo A\n> x\ny\n\ndemo B\n\n"
                                                    "Here is the task.\n" + TASK}
    assert prompt[1:] == context[1:]
    assert context[0] == {"role": "user", "content": TASK}  # the context itself is not modified
    # the text layout's routing prompt holds the same header and demos
    text = ctx.react_prompt("Solve it. Here are {n_demos} examples.", ["demo A\n> x\ny", " demo B "],
                            ctx.scoring_context(INSTRUCTION, O0, STEPS[:1]))
    assert text == prompt[0]["content"] + "\n> go to desk 1\nOn the desk 1, you see a key 1.\n>"
    with pytest.raises(ValueError, match="user message"):
        ctx.react_prompt("h", [], [{"role": "assistant", "content": "x"}])


def test_context_text_of_a_chat_context_reads_like_the_text_layout():
    msgs = ctx.scoring_context(INSTRUCTION, O0, STEPS, "causal", layout="chat")
    assert ctx.context_text(msgs) == ctx.scoring_context(INSTRUCTION, O0, STEPS, "causal")


# -- reference blocks --------------------------------------------------------------------------
REF_STEPS = (env_step("go to shelf 1", "On the shelf 1, you see a vase 2."),
             env_step("take vase 2 from shelf 1", "You pick up the vase 2 from the shelf 1."))


def ref_block(at):
    return (f"[Reference: 2 recorded steps follow. They were NOT executed in the current environment, which "
            f"is in the state after the {at} step(s) above.]\n"
            "> go to shelf 1\nOn the shelf 1, you see a vase 2.\n"
            "> take vase 2 from shelf 1\nYou pick up the vase 2 from the shelf 1.\n"
            "[End of reference. Actions below are executed.]")


def test_reference_block_precedes_step_at():
    text = ctx.render_history(STEPS, "raw", reference=ctx.Reference(2, REF_STEPS))
    head = "> go to desk 1\nOn the desk 1, you see a key 1.\n> think: I need the key.\nOK.\n"
    assert text == head + ref_block(2) + "\n" + RAW[len(head):]
    at0 = ctx.scoring_context(INSTRUCTION, O0, STEPS, "raw", reference=ctx.Reference(0, REF_STEPS))
    assert at0 == TASK + "\n" + ref_block(0) + "\n" + RAW


def test_reference_block_after_the_history_and_before_the_check_reminder():
    end = ctx.Reference(len(STEPS), REF_STEPS)
    assert ctx.render_history(STEPS, "raw", reference=end) == RAW + "\n" + ref_block(5)
    assert ctx.render_history(STEPS, "check", reference=end) == RAW + "\n" + ref_block(5) + "\n" + hist.CHECK_REMINDER
    # causal labels apply inside the block; experiences never do
    causal = ctx.render_history([], "causal", reference=ctx.Reference(0, REF_STEPS[:1]))
    assert 'Result of "go to shelf 1": On the shelf 1, you see a vase 2.' in causal
    exp = ctx.render_history(STEPS[:1], "experience", experiences={0: "E."}, reference=ctx.Reference(1, REF_STEPS))
    assert exp == "> go to desk 1\nOn the desk 1, you see a key 1.\nExperience: E.\n" + ref_block(1)
    # chat: the block is a user message, merged with the observation before it
    msgs = ctx.scoring_context(INSTRUCTION, O0, STEPS[:1], "raw", layout="chat", reference=ctx.Reference(1, REF_STEPS))
    assert msgs[-1] == {"role": "user", "content": "On the desk 1, you see a key 1.\n" + ref_block(1)}


# -- demonstrations ------------------------------------------------------------------------------
@pytest.mark.parametrize("rendering", sorted(hist.INTERVENTIONS))
def test_demos_of_interventions_are_raw(rendering):
    assert ctx.render_demo(INSTRUCTION, O0, STEPS, rendering) == TASK + "\n" + RAW


def test_demo_renderings():
    assert ctx.render_demo(INSTRUCTION, O0, STEPS, "check") == TASK + "\n" + RAW  # no reminder
    assert ctx.render_demo(INSTRUCTION, O0, STEPS, "causal") == TASK + "\n" + EXPECTED["causal"]
    assert ctx.render_demo(INSTRUCTION, O0, STEPS, "experience", EXPERIENCES) == TASK + "\n" + EXPECTED["experience"]
    assert ctx.render_demo(INSTRUCTION, O0, [], "check") == TASK


# -- errors --------------------------------------------------------------------------------------
def test_unknown_rendering_or_layout_is_named():
    with pytest.raises(ValueError, match="unknown history rendering 'sideways'"):
        hist.render(STEPS, "sideways")
    with pytest.raises(ValueError, match="'sideways'"):
        ctx.scoring_context(INSTRUCTION, O0, STEPS, "sideways", layout="chat")
    with pytest.raises(ValueError, match="'sideways'"):
        ctx.render_demo(INSTRUCTION, O0, STEPS, "sideways")
    with pytest.raises(ValueError, match="unknown layout 'html'"):
        ctx.scoring_context(INSTRUCTION, O0, STEPS, "raw", layout="html")
    with pytest.raises(ValueError, match="'html'"):
        ctx.action_prefix("html")
    with pytest.raises(ValueError, match="'sideways'"):
        AgentConfig(rendering="sideways")
    with pytest.raises(ValueError, match="'html'"):
        AgentConfig(layout="html")
    assert ctx.action_prefix("text") == "\n> " and ctx.action_prefix("chat") == ""
