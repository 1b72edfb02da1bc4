"""Renderings through the agents and concept fitting: CB-Agent's routing peek, and the
same rendering/layout for fitting and acting, recorded in every concept's metadata."""

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from agent_doubles import FakeLM, ScriptedEnv
from agent_shell.agents import AgentConfig, CBAgent, ReActAgent
from agent_shell.agents.cb_agent import ROUTE_PEEK_TOKENS
from agent_shell.agents import AgentLog, View
from agent_shell.concepts import (check_concept_matches, collect_features, concept_feature_spec, decision_texts,
                                  fit_concepts)
from agent_shell.context import scoring_context
from agent_shell.demos import expert_demos
from agent_shell.feature_settings import FeatureSettings
from envs.episode import Episode

DEMOS = {"fetch": ["DEMO-FETCH"], "open": ["DEMO-OPEN"]}


class CountingLM(FakeLM):
    """FakeLM that also records ``max_new_tokens`` of every generate call."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.budgets: list[int] = []

    def generate(self, prompt, max_new_tokens=64, stop=(), temperature=0.0, n=1, seed=None):
        self.budgets.append(max_new_tokens)
        return super().generate(prompt, max_new_tokens, stop, temperature, n, seed)


class SteeredLM(FakeLM):
    """FakeLM whose prior strongly prefers candidates containing ``prefer`` (+100 nats)."""

    def score(self, context, candidates, action_prefix):
        s = super().score(context, candidates, action_prefix)
        boost = np.array([100.0 if self.prefer in c else 0.0 for c in candidates], np.float32)
        return s.__class__(s.log_q + boost, s.n_tokens, s.hidden)


def play(agent, task="a/1", max_steps=10):
    episode = Episode(ScriptedEnv(), task, max_steps)
    return episode, agent.run(episode)


# -- CB-Agent's routing peek --------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["text", "chat"])
def test_cb_agent_records_the_whole_thought(layout):
    lm = CountingLM([" think: the key is on the desk 1", " go to desk 1"], prefer="desk")
    ep, log = play(CBAgent(lm, DEMOS, concepts=None, config=AgentConfig(layout=layout)), max_steps=2)
    assert ep.steps[0].kind == "think" and ep.steps[0].action == "think: the key is on the desk 1"
    assert log.replies[0] == " think: the key is on the desk 1"
    # the think step: a peek, then the whole line on the same prompt
    assert lm.budgets[:2] == [1, AgentConfig().reply_tokens] and lm.prompts[0] == lm.prompts[1]


def test_cb_agent_reads_only_the_peek_of_an_action_reply():
    lm = CountingLM([" go to window 1 and then to the desk 1"], prefer="desk")
    ep, log = play(CBAgent(lm, DEMOS, concepts=None), max_steps=2)
    assert lm.budgets == [1] * 2  # one generate call of one token per step: its letters show the kind
    assert log.replies == [" go"] * 2 and [s.kind for s in ep.steps] == ["env", "env"]
    assert ep.steps[0].action == "go to desk 1"  # chosen from the candidates, not the reply


def test_cb_agent_peeks_a_second_token_when_the_first_shows_no_letters():
    lm = CountingLM([" > go to window 1"], prefer="desk")
    ep, log = play(CBAgent(lm, DEMOS, concepts=None), max_steps=1)
    assert lm.budgets == [1, ROUTE_PEEK_TOKENS] and log.replies == [" > go"] and ep.steps[0].kind == "env"


@pytest.mark.parametrize("reply", [" > think: the key is on the desk 1", "> think: the key is on the desk 1",
                                   " Think: the key is on the desk 1"])
def test_cb_agent_peek_knows_a_think_reply_as_parse_reply_does(reply):
    """The step's kind must be that of the whole reply, also when it starts with a ``>`` mark."""
    lm = CountingLM([reply, " go to desk 1"], prefer="desk")
    ep, log = play(CBAgent(lm, DEMOS, concepts=None), max_steps=2)
    assert ep.steps[0].kind == "think" and ep.steps[0].action == "think: the key is on the desk 1"
    assert log.replies[0] == reply


# -- same rendering for fitting and acting ------------------------------------------------------------
@pytest.fixture()
def trajectories(tmp_path):
    return expert_demos(ScriptedEnv(), per_type=2, split="train", path=tmp_path / "expert.jsonl")


@pytest.mark.parametrize("rendering, layout", [("causal", "chat"), ("check", "text"), ("shuffle-all", "chat")])
def test_decision_texts_are_the_scoring_contexts(trajectories, rendering, layout):
    traj = trajectories[2]  # b/1: go to door 1, open door 1, go to hall 1
    texts, skipped = decision_texts(traj, FeatureSettings(rendering, layout))
    assert len(texts) == 3 and not skipped
    for k, (context, candidates, expert) in enumerate(texts):
        assert context == scoring_context(traj.instruction, traj.observation, traj.steps[:k], rendering, layout=layout)
        assert candidates[expert] == traj.steps[k].action
    if layout == "chat":
        assert texts[1][0][-2]["role"] == "assistant" and texts[1][0][-1]["role"] == "user"


def test_fitting_and_acting_contexts_are_byte_identical(trajectories):
    """CB-Agent under causal + chat, following the expert's path, scores exactly the contexts the
    concept was fitted on."""
    lm = FakeLM([" act"], prefer="desk")
    feats = collect_features(lm, trajectories[:1], FeatureSettings("causal", "chat"))
    fitted_contexts = [c for c, _ in lm.score_calls]
    acting = SteeredLM([" act"], prefer="desk")
    ep, log = play(CBAgent(acting, DEMOS, concepts=None, config=AgentConfig(rendering="causal", layout="chat")))
    assert ep.won and [s.action for s in ep.steps] == [s.action for s in trajectories[0].steps]
    assert [c for c, _ in acting.score_calls] == fitted_contexts
    assert [c for _, c in acting.score_calls] == [c for _, c in lm.score_calls]
    assert feats["fetch"].n_decisions == 2


def test_concept_metadata_records_rendering_and_layout(trajectories):
    lm = FakeLM()
    feats = collect_features(lm, trajectories, FeatureSettings("causal", "chat"))
    assert all(isinstance(c, list) and c[0]["role"] == "user" for c, _ in lm.score_calls)
    assert any('Result of "go to door 1":' in m["content"] for c, _ in lm.score_calls for m in c)
    concepts = fit_concepts(feats, lm, FeatureSettings("causal", "chat"), env_name="scripted")
    meta = concepts["open"].metadata
    assert meta["rendering"] == "causal" and meta["layout"] == "chat"
    assert meta["features"]["rendering"] == "causal" and meta["features"]["layout"] == "chat"
    assert meta["features"]["action_prefix"] == ""
    assert meta["features"] == concept_feature_spec(lm, FeatureSettings("causal", "chat"))
    check_concept_matches(concepts["open"], lm, FeatureSettings("causal", "chat"))
    with pytest.raises(ValueError, match="rendering='causal', but acting uses 'raw'"):
        check_concept_matches(concepts["open"], lm, FeatureSettings("raw", "chat"))
    with pytest.raises(ValueError, match="layout='chat', but acting uses 'text'"):
        check_concept_matches(concepts["open"], lm, FeatureSettings("causal", "text"))
    assert concept_feature_spec(lm, FeatureSettings("causal", "text"))["action_prefix"] == "\n> "
    # the text layout scores other contexts, hence gives other features
    text_feats = collect_features(lm, trajectories, FeatureSettings("causal", "text"))
    assert not np.allclose(text_feats["open"].phi[0], feats["open"].phi[0])


def test_experience_fitting_uses_the_reviewed_experiences(trajectories, tmp_path):
    reviewer = FakeLM(["Doors lead somewhere."])
    lm = FakeLM()
    feats = collect_features(lm, trajectories[2:3], FeatureSettings("experience"), cache_dir=tmp_path,
                             reviewer=reviewer)
    assert feats["open"].n_decisions == 3 and len(reviewer.prompts) == 2  # 2 non-terminal transitions
    contexts = [c for c, _ in lm.score_calls]
    assert contexts[0].count("Experience:") == 0
    assert contexts[1].endswith("> go to door 1\nYou go to door 1.\nExperience: Doors lead somewhere.")
    assert contexts[2].count("Experience: Doors lead somewhere.") == 2
    concept = fit_concepts(feats, lm, FeatureSettings("experience"))["open"]
    assert concept.metadata["features"]["rendering"] == "experience"
    # acting with the same reviews: the scoring contexts equal the fitted ones
    acting = FakeLM(["Doors lead somewhere."])
    agent = ReActAgent(acting, DEMOS, config=AgentConfig(rendering="experience"))
    ep = Episode(ScriptedEnv(), "b/1", 10)
    log = AgentLog()  # follow the expert path step by hand, reviewing as the agent's loop does
    for k, step in enumerate(trajectories[2].steps):
        assert agent.scoring_context(View.of(ep, experiences=log.experiences)) == contexts[k]
        ep.act(step.action)
        if not ep.done:
            log.add_review(agent.review(View.of(ep)))


# -- the run's seed: fitting reads the text acting reads ----------------------------------------------
WALK = {"c/1": ("walk", [f"go to room {i}" for i in range(1, 8)])}  # long enough for the shuffles to move
SEED = 7
#: Stands in for a fitted calibrator where the experiences are given (rendering "calibrator").
STUB_CALIBRATOR = SimpleNamespace(fingerprint="stub")


@pytest.mark.parametrize("layout", ["text", "chat"])
def test_fitting_contexts_are_the_acting_contexts_for_every_rendering_under_a_seed(tmp_path, layout):
    """Each expert decision's fitting context is byte-identical to the context the acting agent
    builds for the same history with the run's seed (the shuffle renderings read it)."""
    import json

    from agent_shell.concepts import decision_inputs
    from agent_shell.history import RENDERINGS, REVIEWED, SEEDED_RENDERINGS
    from cb_io.records import TaskStart

    (traj,) = expert_demos(ScriptedEnv(WALK, expert_looks=True), per_type=1, split="train", path=tmp_path / "e.jsonl",
                           max_steps=30)
    start = TaskStart(traj.task_id, traj.task_type, traj.instruction, traj.observation)
    experiences = {i: f"Room {i} leads on." for i, s in enumerate(traj.steps) if s.kind == "env" and i % 3 == 1}
    moved = set()
    for rendering in RENDERINGS:
        given = experiences if rendering in REVIEWED else None
        settings = FeatureSettings(rendering, layout, SEED, calibrator=STUB_CALIBRATOR)
        inputs, _ = decision_inputs(traj, settings, given)
        unseeded, _ = decision_inputs(traj, dataclasses.replace(settings, seed=0), given)
        agent = CBAgent(FakeLM(), DEMOS, concepts=None, config=AgentConfig(rendering=rendering, layout=layout,
                                                                           seed=SEED))
        assert len(inputs) == 7
        for (d, _), (d0, _) in zip(inputs, unseeded):
            view = View(start, tuple(traj.steps[:len(d.history)]), experiences=given or {})
            acting = agent.scoring_context(view)
            assert json.dumps(d.context).encode() == json.dumps(acting).encode(), (rendering, len(d.history))
            if d.context != d0.context:
                moved.add(rendering)
        if rendering not in REVIEWED:  # the path the pipeline fits on
            lm = FakeLM()
            collect_features(lm, [traj], settings)
            assert [c for c, _ in lm.score_calls] == [d.context for d, _ in inputs]
    assert moved == {"shuffle-all", "shuffle-old"} == SEEDED_RENDERINGS  # the seed changes their text, only theirs
