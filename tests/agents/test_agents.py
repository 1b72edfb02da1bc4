"""ReAct, CB-Agent, prior-only and Reflexion on a scripted environment with a fake LM."""

import numpy as np
import pytest

import cb_core
from agent_doubles import FakeLM, ScriptedEnv
from agent_shell.agents import AgentConfig, CBAgent, ReActAgent, Reflexion, View, build_agent
from envs.episode import Episode

DEMOS = {"fetch": ["DEMO-FETCH"], "open": ["DEMO-OPEN"]}


def play(agent, task="a/1", max_steps=10, env=None, memory=()):
    env = env or ScriptedEnv()
    episode = Episode(env, task, max_steps)
    saves = []
    log = agent.run(episode, memory=memory, on_step=lambda ep, lg: saves.append(len(ep.steps)))
    return env, episode, log, saves


def test_react_executes_own_actions_and_think_steps_never_reach_the_engine():
    lm = FakeLM([" think: the key is on the desk", " go to desk 1", " take key 1 from desk 1"])
    env, ep, log, saves = play(ReActAgent(lm, DEMOS))
    assert ep.won and [s.kind for s in ep.steps] == ["think", "env", "env"]
    assert ep.steps[0].observation == "OK."
    assert env.engine_actions == ["go to desk 1", "take key 1 from desk 1"]
    assert saves == [1, 2, 3, 3]  # saved after every step, and once more when the loop ends
    assert "DEMO-FETCH" in lm.prompts[0] and "DEMO-OPEN" not in lm.prompts[0]
    assert lm.prompts[1].endswith("> think: the key is on the desk\nOK.\n>")


def test_think_steps_count_toward_the_budget():
    lm = FakeLM([" think: still thinking"])
    env, ep, log, _ = play(ReActAgent(lm, DEMOS), max_steps=4)
    assert len(ep.steps) == 4 and all(s.kind == "think" for s in ep.steps)
    assert env.engine_actions == [] and not ep.won


def test_a_transcript_that_outgrows_the_context_window_ends_the_episode_and_says_so():
    """The backbone refuses the third prompt as too long: the episode ends after two steps, unfinished,
    instead of failing (and being retried) as an error."""
    from agent_shell.lm.protocol import ContextWindowFull

    class SmallWindow(FakeLM):
        def generate(self, prompt, *args, **kwargs):
            if len(self.prompts) == 2:
                raise ContextWindowFull("prompt is too long: 8377 tokens leave no room in the window of 8192 tokens")
            return super().generate(prompt, *args, **kwargs)

    for agent in (ReActAgent(SmallWindow([" go to desk 1", " look"]), DEMOS),
                  CBAgent(SmallWindow([" go to desk 1", " look"]), DEMOS, concepts=None)):
        env, ep, log, saves = play(agent, max_steps=10)
        assert len(ep.steps) == 2 and not ep.won and not ep.done
        assert log.window_full.startswith("prompt is too long: 8377 tokens")
        assert log.to_dict()["window_full"] == log.window_full
        assert saves == [1, 2, 2]
    assert "window_full" not in play(ReActAgent(FakeLM([" look"]), DEMOS), max_steps=2)[2].to_dict()


def test_react_sends_an_action_outside_the_set_to_the_engine_as_published():
    lm = FakeLM([" fly to the moon"])
    env, ep, log, _ = play(ReActAgent(lm, DEMOS), max_steps=2)
    assert env.engine_actions == ["fly to the moon", "fly to the moon"]
    assert ep.steps[0].observation == "Nothing happens."
    assert log.format_errors == []


@pytest.mark.parametrize("reply, reason", [("", "empty reply"), (" ...", "no action"), (" think:", "empty thought")])
def test_react_malformed_reply_spends_the_step_on_look(reply, reason):
    lm = FakeLM([reply, " go to desk 1"])
    env, ep, log, _ = play(ReActAgent(lm, DEMOS), max_steps=2)
    assert env.engine_actions == ["look", "go to desk 1"]
    assert log.format_errors == [{"step": 0, "reason": reason, "reply": reply}]
    assert [d["reply"] for d in log.decisions] == [reply, " go to desk 1"]  # what it wrote, at the step


def test_cb_agent_fixed_space_scores_filtered_candidates_on_a_demo_free_context():
    lm = FakeLM([" think: go get it", " anything"], prefer="desk")
    env, ep, log, _ = play(CBAgent(lm, DEMOS, concepts=None), max_steps=3)
    context, candidates = lm.score_calls[0]
    assert candidates == ["go to window 1", "go to desk 1", "examine wall 1"]
    assert "DEMO" not in context and context.endswith("> think: go get it\nOK.")
    assert env.engine_actions[0] == "go to desk 1"  # the prior's argmax (boosted), not the reply
    # p_chosen by hand: the length-normalised prior log q / L^gamma (gamma 0.8), softmaxed over the set
    s = FakeLM(prefer="desk").score(context, candidates, "\n> ")
    z = s.log_q.astype(np.float64) / s.n_tokens.astype(np.float64) ** 0.8
    p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    # prior-only: the prior term is log p itself (rounded to 3 decimals), log P the same, no concept term
    logp = pytest.approx(list(np.log(p)), abs=5.1e-4)
    assert log.decisions[0] == {"step": 1, "n_candidates": 3, "chosen": 1,
                                "p_chosen": pytest.approx(p[1], rel=1e-5), "action": "go to desk 1",
                                "prior": logp, "log_p": logp}


def test_cb_agent_malformed_routing_reply_still_acts_from_the_set():
    lm = FakeLM([""], prefer="desk")
    env, ep, log, _ = play(CBAgent(lm, DEMOS, concepts=None), max_steps=1)
    assert env.engine_actions == ["go to desk 1"]
    assert log.format_errors[0]["reason"] == "empty reply"


def test_cb_agent_uses_the_concept_of_the_task_type():
    lm = FakeLM([" act"])
    d = lm.hidden_size
    alpha = np.zeros(d + 1, np.float32)
    alpha[3] = 50.0  # a strong concept along one hidden coordinate
    meta = dict(backbone="fake-lm", features={}, gamma=0.8, lam=1.0, eps=1e-6, task_type="fetch",
                trajectories=[], versions={}, hidden_size=d)
    agent = CBAgent(lm, DEMOS, concepts={"fetch": cb_core.Concept(alpha, 0.8, 1e-6, meta)})
    env, ep, log, _ = play(agent, max_steps=1)
    context, candidates = lm.score_calls[0]
    s = lm.score(context, candidates, "\n> ")
    expected = int(np.argmax(s.hidden[:, 3]))
    assert env.engine_actions == [candidates[expected]]
    with pytest.raises(ValueError, match="no concept for task type 'open'"):
        play(agent, task="b/1", max_steps=1)


def test_a_backend_with_no_base_class_plays_an_episode_under_a_concept():
    """The LM protocol is structural: the test double subclasses nothing and has no ``decide`` (it
    passes the runtime protocol check all the same); a CB-Agent over it plays a three-step episode
    under a concept, each step the argmax of the concept's log P on the double's own scores."""
    from agent_shell.lm import LanguageModel

    lm = FakeLM([" act"])
    assert FakeLM.__mro__ == (FakeLM, object) and not hasattr(lm, "decide") and isinstance(lm, LanguageModel)
    alpha = np.random.default_rng(4).normal(0, 1.0, lm.hidden_size + 1).astype(np.float32)
    concept = cb_core.Concept(alpha, 0.8, 1e-6)
    env, ep, log, _ = play(CBAgent(lm, DEMOS, concepts={"fetch": concept}), max_steps=3)
    assert len(env.engine_actions) == 3 and len(log.decisions) == 3
    for (context, candidates), action in zip(lm.score_calls, env.engine_actions):
        s = lm.score(context, candidates, "\n> ")
        assert action == candidates[int(np.argmax(concept.terms(s.hidden, s.log_q, s.n_tokens).log_p))]


def test_cb_agent_records_the_prior_and_concept_terms_of_every_candidate():
    """The recorded terms by hand (seed Eq. 3, App. B): the prior is log q / L^gamma normalised over
    the set; the concept term alpha . phi with phi the hidden states standardised over the set (std
    floored at eps) and the bias coordinate M^-1/2; log P their sum normalised over the set."""
    lm = FakeLM([" act"])
    d = lm.hidden_size
    alpha = np.linspace(-2.0, 3.0, d + 1).astype(np.float32)
    meta = dict(backbone="fake-lm", features={}, gamma=0.7, lam=1.0, eps=1e-6, task_type="fetch",
                trajectories=[], versions={}, hidden_size=d)
    env, ep, log, _ = play(CBAgent(lm, DEMOS, concepts={"fetch": cb_core.Concept(alpha, 0.7, 1e-6, meta)}), max_steps=1)
    context, candidates = lm.score_calls[0]
    s = lm.score(context, candidates, "\n> ")
    z = s.log_q.astype(np.float64) / s.n_tokens.astype(np.float64) ** 0.7
    prior = z - np.log(np.exp(z).sum())
    h = s.hidden.astype(np.float64)
    phi = (h - h.mean(0)) / np.maximum(h.std(0), 1e-6)
    concept = phi @ alpha[:d] + alpha[d] / np.sqrt(len(candidates))
    logp = prior + concept - np.log(np.exp(prior + concept).sum())
    rec = log.decisions[0]
    assert rec["prior"] == pytest.approx(list(prior), abs=6e-4)
    assert rec["concept"] == pytest.approx(list(concept), abs=2e-3)
    assert rec["log_p"] == pytest.approx(list(logp), abs=2e-3)
    assert rec["chosen"] == int(np.argmax(logp)) and "candidates" not in rec  # the trajectory has them
    assert all(round(x, 3) == x for x in rec["prior"] + rec["concept"] + rec["log_p"])


def test_open_action_space_samples_twenty_keeps_duplicates_and_falls_back():
    def replies(prompt, temperature, n):
        if n == 1:
            return [" act"]
        assert temperature == 0.7 and n == 20  # the seed's 20 samples
        return [" go to desk 1"] * 12 + [" think: no"] * 3 + [" open drawer 1"] * 5

    lm = FakeLM(replies)
    config = AgentConfig(action_space="open")
    env, ep, log, _ = play(CBAgent(lm, DEMOS, concepts=None, config=config), max_steps=1)
    assert len(lm.score_calls[0][1]) == 17 and log.decisions[0]["n_candidates"] == 17
    assert log.decisions[0]["candidates"] == lm.score_calls[0][1]  # samples: kept in the record
    assert len(log.decisions[0]["prior"]) == len(log.decisions[0]["log_p"]) == 17
    lm2 = FakeLM(lambda p, t, n: [" act"] if n == 1 else [""] * n)
    env2, _, log2, _ = play(CBAgent(lm2, DEMOS, concepts=None, config=config), max_steps=1)
    assert env2.engine_actions == ["look"] and log2.decisions[0]["n_candidates"] == 1


def test_reflexion_reflects_after_a_failed_trial_and_uses_the_memory():
    def replies(prompt, temperature, n):
        if prompt.endswith("Reflection:"):
            return [" I never went to the desk."]
        if "Trial 1: I never went to the desk." in prompt:
            return [" go to desk 1" if "> go to desk 1" not in prompt else " take key 1 from desk 1"]
        return [" examine wall 1"]

    lm = FakeLM(replies)
    env = ScriptedEnv()
    result = Reflexion(ReActAgent(lm, DEMOS), trials=2).run(lambda: Episode(env, "a/1", 3))
    assert [t.episode.won for t in result.trials] == [False, True] and result.won
    assert result.trials[0].reflection == "I never went to the desk."
    assert result.trials[1].log.memory == ["I never went to the desk."]
    assert sum(p.endswith("Reflection:") for p in lm.prompts) == 1


def test_reflexion_does_not_reflect_after_a_win_and_cb_memory_enters_scoring_context():
    lm = FakeLM(lambda p, t, n: [" I failed."] if p.endswith("Reflection:") else [" act"], prefer="zzz")
    env = ScriptedEnv()
    agent = build_agent("reflexion-prior-only", lm, DEMOS)
    result = agent.run(lambda: Episode(env, "a/1", 1))
    assert agent.name == "reflexion-prior-only" and len(result.trials) == 2
    assert lm.score_calls[-1][0].startswith("Your memory for the task below:\nTrial 1: I failed.")
    won_lm = FakeLM([" go to desk 1", " take key 1 from desk 1"])
    won = build_agent("reflexion-react", won_lm, DEMOS).run(lambda: Episode(ScriptedEnv(), "a/1", 5))
    assert len(won.trials) == 1 and won.won and not any(p.endswith("Reflection:") for p in won_lm.prompts)


def test_reflexion_cb_agent_acts_with_its_concept_in_every_trial():
    """Both trials choose by the fitted concept (argmax of a strong alpha along one hidden
    coordinate), not by the prior (steered to the window); the first trial's reflection enters the
    second's scoring context."""
    lm = FakeLM(lambda p, t, n: [" I never reached the desk."] if p.endswith("Reflection:") else [" act"],
                prefer="window")
    d = lm.hidden_size
    alpha = np.zeros(d + 1, np.float32)
    alpha[3] = 50.0
    meta = dict(backbone="fake-lm", features={}, gamma=0.8, lam=1.0, eps=1e-6, task_type="fetch",
                trajectories=[], versions={}, hidden_size=d)
    agent = build_agent("reflexion-cb-agent", lm, DEMOS, concepts={"fetch": cb_core.Concept(alpha, 0.8, 1e-6, meta)})
    env = ScriptedEnv()
    result = agent.run(lambda: Episode(env, "a/1", 1))  # one step cannot win a/1: two trials
    assert agent.name == "reflexion-cb-agent" and len(result.trials) == 2 and not result.won
    calls = list(lm.score_calls)
    assert len(calls) == 2
    by_concept = [c[int(np.argmax(lm.score(ctx, c, "\n> ").hidden[:, 3]))] for ctx, c in calls]
    priors = [lm.score(ctx, c, "\n> ") for ctx, c in calls]  # log q / L^0.8: the length-normalised prior
    by_prior = [c[int(np.argmax(s.log_q / s.n_tokens ** 0.8))] for (_, c), s in zip(calls, priors)]
    assert env.engine_actions == by_concept and by_concept != by_prior
    assert result.trials[0].reflection == "I never reached the desk."
    assert calls[1][0].startswith("Your memory for the task below:\nTrial 1: I never reached the desk.")


def test_build_agent_names_and_errors():
    lm = FakeLM()
    assert build_agent("react", lm, DEMOS).name == "react"
    assert build_agent("prior-only", lm, DEMOS).name == "prior-only"
    with pytest.raises(ValueError, match="needs fitted concepts"):
        build_agent("cb-agent", lm, DEMOS)
    with pytest.raises(ValueError, match="unknown agent 'gpt'"):
        build_agent("gpt", lm, DEMOS)
    with pytest.raises(ValueError, match="no demonstrations for task type 'open'"):
        play(ReActAgent(lm, {"fetch": ["d"]}), task="b/1")


def test_a_separate_scorer_scores_and_the_router_only_generates():
    router, scorer = FakeLM([" act"]), FakeLM(prefer="desk")
    env, ep, log, _ = play(CBAgent(router, DEMOS, concepts=None, scoring_lm=scorer), max_steps=2)
    assert router.score_calls == [] and len(scorer.score_calls) == 2 and len(router.prompts) == 2
    assert env.engine_actions[0] == "go to desk 1"


def test_next_action_decides_without_executing_and_returns_the_scores():
    env = ScriptedEnv()
    episode = Episode(env, "a/1", 5)
    view = View.of(episode)
    lm = FakeLM([" go to desk 1"], prefer="desk")
    decision = CBAgent(lm, DEMOS, concepts=None).next_action(view)
    assert env.engine_actions == [] and episode.steps == []  # nothing was executed
    assert decision.kind == "env" and decision.reply == " go" and decision.format_error is None  # the peek
    assert decision.candidates == ("go to window 1", "go to desk 1", "examine wall 1")
    assert decision.action == decision.candidates[decision.chosen] == "go to desk 1"
    probs = np.exp(decision.log_probs)
    assert abs(probs.sum() - 1) < 1e-5 and decision.p_chosen == pytest.approx(probs[decision.chosen], rel=1e-6)
    assert decision.record(0) == {"step": 0, "n_candidates": 3, "chosen": 1, "p_chosen": decision.p_chosen,
                                  "action": "go to desk 1", "prior": pytest.approx(list(decision.log_probs), abs=5.1e-4),
                                  "log_p": [round(x, 3) for x in decision.log_probs]}
    thought = ReActAgent(FakeLM([" think: the desk first"]), DEMOS).next_action(view)
    assert (thought.kind, thought.action, thought.thought, thought.candidates) == (
        "think", "think: the desk first", "the desk first", None)
    skipped = CBAgent(lm, DEMOS, concepts=None).next_action(View(view.start, candidates=view.candidates, route=False))
    assert skipped.reply is None and skipped.action == "go to desk 1" and len(lm.prompts) == 1  # no routing


@pytest.mark.parametrize("action_space", ["fixed", "open"])
def test_the_scoring_context_is_built_once_per_step(monkeypatch, action_space):
    import agent_shell.context as ctx

    built = []
    real = ctx.scoring_context
    monkeypatch.setattr(ctx, "scoring_context", lambda *a, **k: built.append(1) or real(*a, **k))
    lm = FakeLM(lambda p, t, n: [" act"] if n == 1 else [" go to desk 1"] * n, prefer="desk")
    config = AgentConfig(action_space=action_space, n_samples=3)
    env, ep, log, _ = play(CBAgent(lm, DEMOS, concepts=None, config=config), max_steps=2)
    assert len(ep.steps) == 2 and len(built) == 2  # one per step: routing, sampling and scoring share it


class PinningLM(FakeLM):
    """A double with a prefix cache: records the heads it is asked to pin."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.pinned = []

    def pin_prefix(self, head):
        self.pinned.append(head)
        return len(head)


@pytest.mark.parametrize("name", ["react", "prior-only"])
def test_agents_pin_the_routing_head_of_the_task_type_and_every_prompt_starts_with_it(name):
    lm = PinningLM([" go to desk 1", " take key 1 from desk 1"])
    agent = build_agent(name, lm, DEMOS).agent
    play(agent, "a/1")
    play(agent, "b/1")
    assert [("DEMO-FETCH" in h, "DEMO-OPEN" in h) for h in lm.pinned] == [(True, False), (False, True)]
    assert lm.prompts and all(p.startswith(lm.pinned[0]) or p.startswith(lm.pinned[1]) for p in lm.prompts)


@pytest.mark.parametrize("gamma", [0.0, 0.5])
def test_run_s_gamma_reaches_the_prior_only_agent(gamma):
    """`cb-agent run --gamma` sets the prior-only control's length exponent (a concept carries
    its own fit's gamma; alpha = 0 has none but the run's)."""
    from types import SimpleNamespace

    from agent_shell.pipeline import players_of
    from agent_shell.run_config import RunConfig

    lm = FakeLM([" anything"])
    setup = SimpleNamespace(lm=lm, demos=DEMOS, concepts=None, calibrator=None, feature_settings=None)
    player = players_of(RunConfig(env="scripted", agents=("prior-only",), gamma=gamma), setup)["prior-only"]
    env, ep, log, _ = play(player.agent, max_steps=1)
    context, candidates = lm.score_calls[0]
    s = FakeLM().score(context, candidates, "\n> ")
    z = s.log_q.astype(np.float64) / s.n_tokens.astype(np.float64) ** gamma
    p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    assert player.agent.config.gamma == gamma
    assert log.decisions[0]["chosen"] == int(np.argmax(z))
    assert log.decisions[0]["p_chosen"] == pytest.approx(p.max(), rel=1e-5)


def test_a_run_warns_up_front_about_task_types_whose_expert_won_no_trajectory(tmp_path):
    """ScienceWorld's expert wins no train variation of some tasks: the run says so at its start
    (naming the types and what happens to their episodes) instead of only in error records."""
    from agent_shell.pipeline import prepare
    from agent_shell.configure import resolve
    from agent_shell.run_config import RunConfig

    class LosingExpert(ScriptedEnv):  # the expert of type "open" gives up at once
        def expert_action(self):
            return None if self.task_type_of(self._task) == "open" else super().expert_action()

    lines = []
    config = resolve(RunConfig(env="scripted", agents=("react",), demos_per_type=4, cache_dir=str(tmp_path)),
                     backbone=False)
    setup = prepare(config, False, lines.append, env=LosingExpert(), lm=FakeLM(), task_types=["fetch", "open"])
    warnings = [line for line in lines if line.startswith("warning:")]
    assert warnings == [
        "warning: no won expert trajectory in train for 1 task type (open): without demonstrations their episodes "
        "end as error records (counted in the report's errors)",
        "warning: fewer than 4 won expert trajectories in train for fetch (3): they use what there is"]
    assert sorted(setup.demos) == ["fetch"]
    lines.clear()  # a run of the types the expert won names no type without trajectories (cached ones read)
    prepare(config, False, lines.append, env=LosingExpert(), lm=FakeLM(), task_types=["fetch"])
    assert [line for line in lines if line.startswith("warning:")] == [warnings[1]]
