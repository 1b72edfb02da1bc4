"""Experience reviews: parsing replies, counting, the review calls of an acting agent
and of expert trajectories, and what reaches later prompts."""

import json

import pytest

from agent_doubles import FakeLM, ScriptedEnv
from agent_shell.agents import AgentConfig, CBAgent, ReActAgent, View
from agent_shell.experience import (MAX_WORDS, NO_UPDATE, Review, parse_review, review_prompt,
                                    review_trajectory, reviewable)
from envs.episode import Episode

DEMOS = {"fetch": ["DEMO-FETCH"], "open": ["DEMO-OPEN"]}
CANDIDATES = ["go to desk 1", "open drawer 1", "take key 1 from desk 1", "look"]


# -- parse_review --------------------------------------------------------------------------------
@pytest.mark.parametrize("reply", ["NO UPDATE", " NO UPDATE\n", "no update", "No update.", '"NO UPDATE"',
                                   "NO UPDATE - nothing new here", "**NO UPDATE**", "`NO UPDATE`"])
def test_no_update_variants_keep_nothing_and_are_valid(reply):
    assert parse_review(reply, CANDIDATES) == (None, "")


@pytest.mark.parametrize("reply, reason", [
    ("", "empty"),
    ("   \n ", "empty"),
    ('""', "empty"),
    ("... 42 !", "no letters"),
    (" ".join(["word"] * (MAX_WORDS + 1)), f"longer than {MAX_WORDS} words"),
    ("Next, open the drawer 1.", "plan or next action"),
    ("I will go to the desk.", "plan or next action"),
    ("I should check the shelf.", "plan or next action"),
    ("go to desk 2", "plan or next action"),
    ("> open drawer 2", "plan or next action"),
    ("think: the key is here", "plan or next action"),
    ("Step 2: take the key.", "plan or next action"),
    ("The key is on the desk, so take key 1 from desk 1 now.", "names the action 'take key 1 from desk 1'"),
    ("Drawer contents matter: OPEN DRAWER 1 reveals them.", "names the action 'open drawer 1'"),
])
def test_invalid_replies_keep_nothing_and_say_why(reply, reason):
    assert parse_review(reply, CANDIDATES) == (None, reason)


@pytest.mark.parametrize("reply, kept", [
    (" The desk 1 holds the key 1.", "The desk 1 holds the key 1."),
    ('"Drawers here start closed."\n', "Drawers here start closed."),
    ("Closed drawers must be opened before their contents show.",
     "Closed drawers must be opened before their contents show."),
    ("Opening an empty drawer changes nothing.", "Opening an empty drawer changes nothing."),
    ("Nowhere  in this room  is there a second key.", "Nowhere in this room is there a second key."),
    ("Taking an item leaves the receptacle empty.", "Taking an item leaves the receptacle empty."),
    ("Plants need water to grow.", "Plants need water to grow."),
    ("Useful objects are kept on the desk.", "Useful objects are kept on the desk."),
    ("Looking around repeats the same description.", "Looking around repeats the same description."),
    (" ".join(["word"] * MAX_WORDS), " ".join(["word"] * MAX_WORDS)),
])
def test_a_valid_general_sentence_is_kept(reply, kept):
    assert parse_review(reply, CANDIDATES) == (kept, "")


def test_each_review_outcome_is_kept_no_update_or_invalid_with_its_reason():
    outcomes = []
    for reply in ["NO UPDATE", "Desks hold keys.", "", "go to desk 1", "I will look.", "Keys open doors.",
                  "The key: take key 1 from desk 1."]:
        exp, why = parse_review(reply, CANDIDATES)
        outcomes.append("kept" if exp is not None else why.split(" ")[0] if why else "no update")
    assert outcomes == ["no update", "kept", "empty", "plan", "plan", "kept", "names"]


# -- the review call -------------------------------------------------------------------------------
def scripted_episode(actions, task="a/1", max_steps=10):
    ep = Episode(ScriptedEnv(), task, max_steps)
    for a in actions:
        ep.act(a)
    return ep


def test_review_prompt_shows_task_raw_history_and_the_transition():
    ep = scripted_episode(["go to window 1", "think: wrong place", "go to desk 1"])
    prompt = review_prompt(ep.start.instruction, ep.start.observation, ep.steps, 2)
    assert prompt.startswith("You are in a small room.\nYour task is to: solve a/1.\n"
                             "> go to window 1\nNothing happens.\n> think: wrong place\nOK.\n\n"
                             "Latest action: go to desk 1\nObservation: You go to desk 1.\n\n")
    assert prompt.endswith(f"reply exactly {NO_UPDATE}.\nExperience:")
    assert review_prompt(ep.start.instruction, ep.start.observation, ep.steps, 0).startswith(
        "You are in a small room.\nYour task is to: solve a/1.\n\nLatest action: go to window 1\n")


def is_review(prompt):
    return isinstance(prompt, str) and prompt.endswith("\nExperience:")


def lm_with(route, review):
    """A FakeLM answering review prompts with ``review(prompt)`` and routing prompts from ``route``."""
    routes = list(route)

    def replies(prompt, temperature, n):
        if is_review(prompt):
            return [review(prompt)] * n
        return [routes.pop(0) if len(routes) > 1 else routes[0]] * n

    return FakeLM(replies, prefer="desk")


def play(agent, task="a/1", max_steps=10):
    episode = Episode(ScriptedEnv(), task, max_steps)
    return episode, agent.run(episode)


def test_react_reviews_each_non_terminal_env_step_only():
    lm = lm_with([" think: the key is on the desk", " go to window 1", " go to desk 1", " take key 1 from desk 1"],
                 lambda p: "Windows show nothing useful." if "Latest action: go to window 1" in p else NO_UPDATE)
    ep, log = play(ReActAgent(lm, DEMOS, config=AgentConfig(rendering="experience")))
    assert ep.won and [s.kind for s in ep.steps] == ["think", "env", "env", "env"]
    reviews = [p for p in lm.prompts if is_review(p)]
    # steps 1 and 2 are reviewed; not the think step 0, not the terminal step 3
    assert [r["step"] for r in log.reviews] == [1, 2] and len(reviews) == 2
    assert reviews[0] == review_prompt(ep.start.instruction, ep.start.observation, ep.steps, 1)
    assert log.experiences == {1: "Windows show nothing useful."}
    assert log.reviews[0] == {"step": 1, "reply": "Windows show nothing useful.",
                              "experience": "Windows show nothing useful.", "invalid": ""}
    assert log.reviews[1] == {"step": 2, "reply": NO_UPDATE, "experience": None, "invalid": ""}
    routing = [p for p in lm.prompts if not is_review(p)]
    assert "> go to window 1\nNothing happens.\nExperience: Windows show nothing useful.\n> go to desk 1\n" \
        in routing[3]
    assert routing[3].count("Experience:") == 1
    # the log serialises experiences (JSON keys are strings) and reviews
    d = json.loads(json.dumps(log.to_dict()))
    assert d["experiences"] == {"1": "Windows show nothing useful."} and d["reviews"] == log.reviews
    assert "review" in d["seconds"]


def test_no_update_reviews_leave_every_routing_prompt_as_raw():
    route = [" go to window 1", " examine wall 1", " go to desk 1", " take key 1 from desk 1"]
    lm_exp = lm_with(route, lambda p: NO_UPDATE)
    ep, log = play(ReActAgent(lm_exp, DEMOS, config=AgentConfig(rendering="experience")))
    lm_raw = lm_with(route, lambda p: pytest.fail("raw rendering must not review"))
    play(ReActAgent(lm_raw, DEMOS, config=AgentConfig(rendering="raw")))
    assert ep.won and len(log.reviews) == 3 and log.experiences == {}
    assert [p for p in lm_exp.prompts if not is_review(p)] == lm_raw.prompts


def test_invalid_review_counts_as_no_update():
    lm = lm_with([" go to window 1", " go to desk 1", " take key 1 from desk 1"],
                 lambda p: "Next, go to desk 1.")
    ep, log = play(ReActAgent(lm, DEMOS, config=AgentConfig(rendering="experience")))
    assert log.experiences == {} and [r["invalid"] for r in log.reviews] == ["plan or next action"] * 2
    assert not any("Experience:" in p for p in lm.prompts if not is_review(p))


def test_a_separate_reviewer_gets_the_reviews():
    router = lm_with([" go to window 1", " go to desk 1", " take key 1 from desk 1"], lambda p: pytest.fail("router"))
    reviewer = FakeLM(["Windows are useless here."])
    ep, log = play(ReActAgent(router, DEMOS, config=AgentConfig(rendering="experience"), reviewer=reviewer))
    assert len(reviewer.prompts) == 2 and all(is_review(p) for p in reviewer.prompts)
    assert log.experiences == {0: "Windows are useless here.", 1: "Windows are useless here."}


def test_cb_agent_scores_on_a_context_with_the_experience():
    lm = lm_with([" act"], lambda p: "Desks can hold keys.")
    ep, log = play(CBAgent(lm, DEMOS, concepts=None, config=AgentConfig(rendering="experience")))
    assert ep.won and [s.action for s in ep.steps] == ["go to desk 1", "take key 1 from desk 1"]
    assert log.experiences == {0: "Desks can hold keys."}
    second_context = lm.score_calls[1][0]
    assert second_context.endswith("> go to desk 1\nYou go to desk 1.\nExperience: Desks can hold keys.")
    assert second_context == ReActAgent(lm, DEMOS, config=AgentConfig(rendering="experience")).scoring_context(
        View.of(scripted_episode(["go to desk 1"]), experiences=log.experiences))
    routing = [p for p in lm.prompts if not is_review(p)]
    assert routing[-1].endswith("You go to desk 1.\nExperience: Desks can hold keys.\n>")


def test_chat_layout_carries_the_experience_in_the_user_message():
    lm = lm_with([" act"], lambda p: "Desks can hold keys.")
    ep, log = play(CBAgent(lm, DEMOS, concepts=None, config=AgentConfig(rendering="experience", layout="chat")),
                   max_steps=2)
    first = ep.steps[0]
    assert log.experiences == {0: "Desks can hold keys."} and len(lm.score_calls) == 2
    msgs = lm.score_calls[1][0]
    assert msgs[-2:] == [{"role": "assistant", "content": first.action},
                         {"role": "user", "content": f"{first.observation}\nExperience: Desks can hold keys."}]
    assert all(isinstance(p, str) for p in lm.prompts if is_review(p))  # reviews are text prompts


# -- expert trajectories ---------------------------------------------------------------------------
def expert_trajectory(task="a/1"):
    from cb_io.records import Step

    ep = Episode(ScriptedEnv(), task, 10, expert=True)
    ep.act("think: find the key")
    while not ep.done:
        ep.act(ep.expert_action())
    assert ep.won and isinstance(ep.steps[0], Step)
    return ep.trajectory()


def test_review_trajectory_reviews_non_terminal_transitions_and_caches(tmp_path):
    traj = expert_trajectory()
    assert reviewable(traj.steps) == [1]
    lm = FakeLM(["The desk holds a key."])
    assert review_trajectory(lm, traj, tmp_path) == {1: "The desk holds a key."}
    assert len(lm.prompts) == 1 and lm.prompts[0] == review_prompt(traj.instruction, traj.observation, traj.steps, 1)
    again = FakeLM(["something else entirely"])
    assert review_trajectory(again, traj, tmp_path) == {1: "The desk holds a key."} and again.prompts == []
    files = list((tmp_path / "experiences").glob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["reviews"][0]["step"] == 1
    other = FakeLM(["NO UPDATE"], name="other-lm")  # another backbone never reads these reviews
    assert review_trajectory(other, traj, tmp_path) == {} and len(other.prompts) == 1


def test_fitting_and_acting_judge_a_review_against_the_same_candidates():
    """The acting agent rejects a review naming an action of the state it is in after the step
    (``episode.candidates()``); reviews of an expert trajectory must use that same state."""
    reply = "The desk matters: take key 1 from desk 1 is possible there."
    traj = expert_trajectory()  # think, go to desk 1, take key 1 from desk 1
    fitted = review_trajectory(FakeLM([reply]), traj)
    lm = lm_with([" think: find the key", " go to desk 1", " take key 1 from desk 1"], lambda p: reply)
    ep, log = play(ReActAgent(lm, DEMOS, config=AgentConfig(rendering="experience")))
    assert [s.action for s in ep.steps] == [s.action for s in traj.steps]
    assert log.reviews[0]["invalid"] == "names the action 'take key 1 from desk 1'"
    assert fitted == log.experiences == {}


@pytest.mark.parametrize("reply", [
    " You are in the middle of a room. Looking quickly around you, you see nothing.",
    " you pick up the AlarmClock 1 from the desk 1!",
    " You pick up",
])
def test_a_review_that_copies_an_observation_is_invalid(reply):
    shown = ["You are in the middle of a room. Looking quickly around you, you see a bed 1.",
             "You pick up the alarmclock 1 from the desk 1."]
    assert parse_review(reply, (), shown) == (None, "copies an observation")


def test_an_implication_that_quotes_a_few_observation_words_is_kept():
    shown = ["On the desk 1, you see a pen 1."]
    text = "The desk 1 holds only a pen, so the key is elsewhere."
    assert parse_review(text, (), shown) == (text, "")
