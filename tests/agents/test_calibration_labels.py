"""Action calibration's labels: the judges, transitions mined from recorded trials, proposed experiences,
label records, resumable labelling and the task-disjoint split, with FakeLM / ScriptedEnv.
"""

import numpy as np
import pytest

from agent_doubles import FakeLM, ScriptedEnv
from agent_shell.agents import AgentConfig, CBAgent, ReActAgent
from agent_shell.calibration import LMJudge, Pair, judge_pair, split_tasks
from agent_shell.calibration.expert_distance import ExpertDistanceJudge
from agent_shell.studies.labels import (ContentScreen, label_counts, label_record, mine_transitions, propose,
                                        read_labels, retained, run_labels, transition_label)
from agent_shell.experience import NO_UPDATE
from agent_shell.studies import recorded_trials
from calibration_doubles import DEMOS, PLAYED, START, env_step, label_line, recorded, review_replies


# ------------------------------------------------------------------------------------- judges


class CountingJudge:
    name = "counting"

    def __init__(self):
        self.calls = 0

    def compare(self, pair):
        self.calls += 1
        from agent_shell.calibration import Verdict
        return Verdict("with", self.name)


def test_identical_executable_actions_are_ties_without_a_judge_call():
    judge = CountingJudge()
    for a, b in [("go to desk 1", " Go  to DESK 1"), ("think: a", "think: b")]:
        v = judge_pair(judge, Pair(START, (), a, b))
        assert (v.outcome, v.judge) == ("tie", "same-action")
    assert judge.calls == 0
    assert judge_pair(judge, Pair(START, (), "go to desk 1", "think: x")).judge == "counting" and judge.calls == 1


class ABLM(FakeLM):
    """Scores "A"/"B": prefers the letter whose action contains ``good`` (or always "A")."""

    def __init__(self, good=None):
        super().__init__()
        self.good = good

    def score(self, context, candidates, action_prefix):
        scores = super().score(context, candidates, action_prefix)
        if candidates == ["A", "B"]:
            a_line = context.split("\nA: ", 1)[1].split("\n", 1)[0]
            prefer_a = self.good is None or self.good in a_line
            scores = type(scores)(np.asarray([-1.0, -2.0] if prefer_a else [-2.0, -1.0], np.float32),
                                  scores.n_tokens, scores.hidden)
        return scores


def test_lm_judge_asks_twice_in_both_orders_and_ties_when_inconsistent():
    pair = Pair(START, (env_step("go to window 1", "Nothing happens."),), "go to window 1", "go to desk 1 good")
    judge = LMJudge(ABLM(good="good"))
    v = judge.compare(pair)
    assert (v.outcome, v.effect, v.judge) == ("with", "improvement", "lm") and judge.calls == 2
    assert v.detail["order1"]["answer"] == "B" and v.detail["order2"]["answer"] == "A"
    flipped = LMJudge(ABLM(good="good")).compare(Pair(START, (), "go to desk 1 good", "go to window 1"))
    assert flipped.outcome == "without" and flipped.effect == "degradation"
    biased = LMJudge(ABLM(good=None)).compare(pair)  # always "A": position, not action
    assert biased.outcome == "tie" and biased.reason == "inconsistent across orders"
    # the prompt is blind: it never says which action had the experience
    prompt = judge.prompt(pair, pair.without, pair.with_)
    assert "experience" not in prompt.lower() and "A: go to window 1" in prompt and "B: go to desk 1 good" in prompt


def test_expert_distance_judge_counts_expert_steps_after_each_action():
    env = ScriptedEnv()
    judge = ExpertDistanceJudge(env)
    v = judge.compare(Pair(START, (), "go to window 1", "go to desk 1"))
    assert (v.outcome, v.judge) == ("with", "expert-distance")
    assert v.detail["without"]["distance"] == 2 and v.detail["with"]["distance"] == 1
    # the action that wins beats everything; the replayed prefix reproduces the recording
    history = (env_step("go to desk 1", "You go to desk 1."),)
    w = judge.compare(Pair(START, history, "take key 1 from desk 1", "go to window 1"))
    assert w.outcome == "without" and w.detail["without"] == {"distance": 0, "won_by_action": True,
                                                              "mismatch": False, "gave_up": False}
    # a think step executes nothing: the same distance as an action without effect
    t = judge.compare(Pair(START, (), "think: where is the key?", "go to window 1"))
    assert t.outcome == "tie" and t.detail["with"]["distance"] == 2
    replays = judge.replays
    judge.compare(Pair(START, (), "go to window 1", "go to desk 1"))  # memoised: no new replay
    assert judge.replays == replays
    # an action without effect shares the unchanged state's rollout: the engine sees only the action itself
    before = len(env.engine_actions)
    assert judge.distance("a/1", (), "examine wall 1")["distance"] == 2
    assert env.engine_actions[before:] == ["examine wall 1"]
    bad = judge.distance("a/1", (env_step("go to desk 1", "Something else."),), "examine wall 1")
    assert bad["mismatch"] is True


def test_expert_distance_judge_needs_an_expert():
    class NoExpert(ScriptedEnv):
        expert_name = None

    with pytest.raises(ValueError, match="has no expert"):
        ExpertDistanceJudge(NoExpert())


# ------------------------------------------------------------------------------------- labels


def test_label_rule_and_transition_label():
    assert retained(0, 0) and retained(2, 1) and retained(1, 0)
    assert not retained(1, 1) and not retained(0, 1)
    # candidates 0..2 + NO UPDATE (3): the retained one with the largest key; none retained -> NO UPDATE
    assert transition_label([(True, (0, 0)), (False, (5, 5)), (True, (1, 1))]) == 2
    assert transition_label([(True, (1, 1)), (True, (1, 1))]) == 0
    assert transition_label([(False, (1,)), (False, (2,))]) == 2
    assert transition_label([]) == 0


def test_transitions_need_a_following_environment_step(tmp_path):
    trials = recorded_trials([recorded(tmp_path, PLAYED)])
    # 0 and 1 are followed by env steps (1 via the thought); 3 is followed by the terminal step; 4 ends
    assert [t.i for t in mine_transitions(trials)] == [0, 1, 3]
    assert [t.i for t in mine_transitions(trials, 2)] == [0, 1]
    assert mine_transitions(trials)[0].key == "react:a/3#0@0"


def test_propose_keeps_distinct_valid_experiences_and_records_every_reply(tmp_path):
    t = mine_transitions(recorded_trials([recorded(tmp_path, PLAYED)]))[0]
    candidates, proposals = propose(FakeLM(review_replies), t, k=4)
    assert candidates == ["The window cannot be used."]
    assert [p["invalid"] for p in proposals] == ["", "", "", "plan or next action"]
    with pytest.raises(ValueError, match="k"):
        propose(FakeLM(review_replies), t, k=0)


def actors(lm):
    config = AgentConfig(rendering="experience")
    return {"react": ReActAgent(lm, DEMOS, config=config), "prior-only": CBAgent(lm, DEMOS, concepts=None,
                                                                                 config=config)}


def test_label_record_judges_each_actor_with_and_without_each_candidate(tmp_path):
    t = mine_transitions(recorded_trials([recorded(tmp_path, PLAYED)]))[0]
    lm = FakeLM(review_replies)
    record = label_record(t, actors(lm), ExpertDistanceJudge(ScriptedEnv()), lm, ContentScreen(lm), k=4)
    assert record["options"] == ["The window cannot be used.", NO_UPDATE]
    assert (record["split"], record["role"], record["task_id"], record["i"]) == ("train", "calibrator-training",
                                                                                  "a/3", 0)
    react = record["actors"]["react"]
    # the experience changed ReAct's action from the useless window to the desk (a/3's first solution step
    # is "go to bed 1", so both leave the expert 2 steps: a tie by the expert judge)
    assert react["without"]["action"] == "go to window 1" and react["with"][0]["action"] == "go to desk 1"
    cand = record["candidates"][0]
    assert cand["verdicts"]["react"]["judge"] == "expert-distance"
    assert cand["improvements"] + cand["degradations"] + cand["ties"] == 2
    assert cand["retained"] == retained(cand["improvements"], cand["degradations"])
    assert record["label"] == (0 if cand["retained"] else 1)
    assert record["content_label"] == (0 if cand["screen"]["retained"] else 1)
    counts = label_counts([record])
    assert counts["candidates"] == 1 and counts["improvements"] + counts["degradations"] + counts["ties"] == 2
    assert counts["splits"] == ["train"]


def test_label_record_counts_an_improvement_the_expert_can_see(tmp_path):
    # a/1: the experience moves ReAct from the window to the desk, one expert step closer
    steps = [env_step("go to window 1", "Nothing happens."), env_step("examine wall 1", "A plain wall.")]
    t = mine_transitions(recorded_trials([recorded(tmp_path, steps, task_id="a/1")]))[0]
    lm = FakeLM(review_replies)
    record = label_record(t, {"react": ReActAgent(lm, DEMOS, config=AgentConfig(rendering="experience"))},
                          ExpertDistanceJudge(ScriptedEnv()), lm, None, k=2)
    v = record["candidates"][0]["verdicts"]["react"]
    assert (v["effect"], v["detail"]["without"]["distance"], v["detail"]["with"]["distance"]) == ("improvement", 2, 1)
    assert record["label"] == 0 and record["label_text"] == "The window cannot be used."
    assert "content_label" not in record


def test_run_labels_appends_and_resumes(tmp_path):
    items = mine_transitions(recorded_trials([recorded(tmp_path, PLAYED)]))
    out = tmp_path / "labels.jsonl"
    calls = []

    def label(t):
        calls.append(t.key)
        return {"schema": "cb-agent/calibration-label-v1", "item": t.key, "candidates": []}

    run_labels(items[:2], out, label)
    with pytest.raises(ValueError, match="--resume"):
        run_labels(items, out, label)
    written = run_labels(items, out, label, resume=True, meta={"model": "m"})
    assert [r["item"] for r in written] == [items[2].key] and calls == [t.key for t in items]
    assert [r["item"] for r in read_labels(out)] == [t.key for t in items] and written[0]["model"] == "m"


def test_split_tasks_is_task_disjoint_and_deterministic():
    records = [label_line(f"t/{j}", 0, ["x"], 0) for j in range(7)] * 2
    fit_tasks, held = split_tasks(records, 3)
    assert held == ["t/2", "t/5"] and not set(fit_tasks) & set(held) and len(fit_tasks) == 5
    with pytest.raises(ValueError):
        split_tasks(records, 1)
