"""The repetition probe and reference-history recovery with FakeLM / ScriptedEnv."""

import numpy as np
import orjson
import pytest
from click.testing import CliRunner

import agent_shell.lm
import cb_core
import envs
from agent_doubles import FakeLM, HangingEnv, ScriptedEnv
from agent_shell import studies
from agent_shell.agents import AgentConfig, CBAgent, ReActAgent
from agent_shell.cli import main
from agent_shell.commands import probe as probe_cmd
from agent_shell.commands import recover as recover_cmd
from agent_shell.commands._common import RENDERING_NAMES
from agent_shell.experience import review_prompt
from cb_io.records import Step, Trajectory
from cb_io.storage import append_jsonl
from envs.episode import Episode

DEMOS = {"fetch": ["DEMO-FETCH"], "open": ["DEMO-OPEN"]}
CANDS = ["look", "inventory", "go to window 1", "go to desk 1", "examine wall 1"]


def env_step(action, obs, cands=CANDS, done=False):
    return Step("env", action, obs, list(cands), done, False, 0.0)


def think(text="think: hmm"):
    return Step("think", text, "OK.", None, False, False, 0.0)


def trajectory(steps, task_id="a/1", task_type="fetch", won=False):
    return Trajectory("scripted", task_id, task_type, f"Your task is to: solve {task_id}.",
                      "You are in a small room.", list(steps), won, float(won))


def results_line(traj, agent="react"):
    return {"schema": "cb-agent/episode-v1", "agent": agent, "task_id": traj.task_id, "task_type": traj.task_type,
            "success": traj.won, "trials": [{"won": traj.won, "trajectory": traj.to_record(),
                                             "log": {"replies": []}}]}


def write_results(path, trajs, agent="react"):
    for t in trajs:
        append_jsonl(path, results_line(t, agent))
    return path


# hand-made: unsupported repeats at j=1 ("Nothing happens.") and j=5 (same observation), a supported
# repeat at j=3 (new observation), a repeat at j=7 followed by a think step, one at j=9 that ends it
MINED = [
    env_step("go to window 1", "Nothing happens."),
    env_step("go to window 1", "Nothing happens."),                 # j=1: unsupported
    env_step("take coin 1", "You take a coin."),
    env_step("take coin 1", "You take another coin."),              # j=3: supported (new feedback)
    env_step("examine wall 1", "A plain wall."),
    env_step("examine wall 1", "A plain wall."),                    # j=5: unsupported (same observation)
    env_step("go to window 1", "Nothing happens."),
    env_step("go to window 1", "Nothing happens."),                 # j=7: next step is a thought
    think(),
    env_step("go to desk 1", "Nothing happens."),
    env_step("go to desk 1", "Nothing happens."),                   # j=10: no step after it
]


def test_mining_finds_exactly_the_unsupported_repeats_with_a_following_env_step():
    assert studies.unsupported_repeats(MINED) == [1, 5]
    # a thought between two equal actions breaks the pair
    assert studies.unsupported_repeats([MINED[0], think(), MINED[1], MINED[2]]) == []


def test_mining_dedupes_caps_and_goes_round_robin(tmp_path):
    a = trajectory(MINED, "a/1")
    b = trajectory(MINED[:3], "b/1", "open")
    path = write_results(tmp_path / "r.jsonl", [a, b, a])  # a twice: deduplicated by (task, j)
    items = studies.mine_probe_items(studies.recorded_trials([path]), max_items=0)
    assert [i.key for i in items] == ["a/1@1", "b/1@1", "a/1@5"]
    assert [i.key for i in studies.mine_probe_items(studies.recorded_trials([path]), max_items=2)] == ["a/1@1", "b/1@1"]
    assert items[0].action == "go to window 1" and items[0].next_candidates == CANDS
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        studies.recorded_trials([tmp_path / "missing.jsonl"])


class SteeredLM(FakeLM):
    """FakeLM whose ``prefer`` boost (50 nats instead of 5) always outweighs the hashed prior."""

    def score(self, context, candidates, action_prefix):
        s = super().score(context, candidates, action_prefix)
        boost = np.asarray([45.0 if self.prefer and self.prefer in c else 0.0 for c in candidates], np.float32)
        return type(s)(s.log_q + boost, s.n_tokens, s.hidden)


def probe_items(tmp_path):
    path = write_results(tmp_path / "r.jsonl", [trajectory(MINED)])
    return studies.mine_probe_items(studies.recorded_trials([path]))


@pytest.mark.parametrize("reply, kind, repeat", [
    (" go to window 1", "action", True),
    (">  go to   window 1", "action", True),
    (" go to desk 1", "action", False),
    (" think: the window does nothing", "think", False),
    (" ...", "malformed", False),
])
def test_probe_records_what_react_replies(tmp_path, reply, kind, repeat):
    item = probe_items(tmp_path)[0]
    lm = FakeLM([reply])
    rec = studies.probe_record(item, "causal", "react", ReActAgent(lm, DEMOS, config=AgentConfig(rendering="causal")))
    assert (rec["kind"], rec["repeat"], rec["repeat_available"]) == (kind, repeat, True)
    assert rec["item"] == "a/1@1" and rec["rendering"] == "causal" and rec["repeated_action"] == "go to window 1"
    prompt = lm.prompts[0]
    # the fixed history is steps[:2] under the causal rendering, nothing after it
    assert prompt.endswith('> go to window 1\nResult of "go to window 1": Nothing happens.\n>')
    assert prompt.count("go to window 1") == 4 and "take coin" not in prompt


def test_probe_takes_the_argmax_of_prior_only_and_cb_agent(tmp_path):
    item = probe_items(tmp_path)[0]
    rec = studies.probe_record(item, "raw", "prior-only", CBAgent(SteeredLM(prefer="window"), DEMOS, concepts=None))
    assert rec["kind"] == "action" and rec["action"] == "go to window 1" and rec["repeat"]
    assert rec["n_candidates"] == 3 and 0 < rec["p_chosen"] <= 1  # look/inventory dropped
    # the scored set and its terms: prior-only acts on the prior alone, log P is the prior, no concept term
    assert rec["candidates"] == ["go to window 1", "go to desk 1", "examine wall 1"] and "concept" not in rec
    assert rec["log_p"] == pytest.approx(rec["prior"], abs=1.1e-3) and int(np.argmax(rec["log_p"])) == 0
    assert np.exp(rec["log_p"][0]) == pytest.approx(rec["p_chosen"], abs=2e-3)
    lm = SteeredLM(prefer="desk")
    rec = studies.probe_record(item, "raw", "prior-only", CBAgent(lm, DEMOS, concepts=None))
    assert rec["action"] == "go to desk 1" and not rec["repeat"]
    context, candidates = lm.score_calls[0]
    assert candidates == ["go to window 1", "go to desk 1", "examine wall 1"] and "take coin" not in context
    # CB-Agent: a strong concept along one hidden coordinate decides against the prior
    d = lm.hidden_size
    alpha = np.zeros(d + 1, np.float32)
    alpha[2] = 80.0
    meta = dict(backbone="fake-lm", features={}, gamma=0.8, lam=1.0, eps=1e-6, task_type="fetch",
                trajectories=[], versions={}, hidden_size=d)
    lm = FakeLM()
    concepts = {"fetch": cb_core.Concept(alpha, 0.8, 1e-6, meta)}
    rec = studies.probe_record(item, "raw", "cb-agent", CBAgent(lm, DEMOS, concepts=concepts))
    context, candidates = lm.score_calls[0]
    assert rec["action"] == candidates[int(np.argmax(lm.score(context, candidates, "\n> ").hidden[:, 2]))]


def test_probe_view_is_the_fixed_history_with_the_next_candidate_set(tmp_path):
    item = probe_items(tmp_path)[0]
    view = item.view({0: "Windows do nothing."})
    assert view.steps == tuple(MINED[:2]) and view.candidates == tuple(CANDS) and not view.route
    assert view.start.task_id == "a/1" and view.experiences == {0: "Windows do nothing."}
    with pytest.raises(TypeError):
        view.experiences[1] = "read-only"


def review_replies(prompt, temperature, n):
    if prompt.rstrip().endswith("Experience:"):
        return ["The window cannot be reached."]
    return [" go to window 1"]


def test_probe_experience_reviews_each_transition_once_per_trajectory(tmp_path):
    items = probe_items(tmp_path)  # a/1@1 and a/1@5 share the reviews of steps 0..1
    lm = FakeLM(review_replies)
    cache = studies.ReviewCache(lm)
    agent = ReActAgent(lm, DEMOS, config=AgentConfig(rendering="experience"))
    recs = [studies.probe_record(i, "experience", "react", agent, cache) for i in items]
    assert cache.calls == 6  # steps 0..5 reviewed once each, not 2 + 6
    assert recs[0]["experiences"] == {"0": "The window cannot be reached.", "1": "The window cannot be reached."}
    assert recs[0]["experiences_kept"] == "2/2" and recs[1]["experiences_kept"] == "6/6"
    reviewed = [p for p in lm.prompts if p.rstrip().endswith("Experience:")]
    assert reviewed[1] == review_prompt(items[0].recorded.trajectory.instruction,
                                        items[0].recorded.trajectory.observation, MINED, 1)
    assert "Experience: The window cannot be reached." in lm.prompts[2]  # the routing prompt shows them


#: what the steered prior-only actor picks under each rendering (SteeredLM's prefer)
PRIOR_PICKS = {"raw": "window", "check": "desk"}


def react_factory(replies=(" go to window 1",)):
    made = []

    def make(rendering, actor):
        if actor == "react":
            agent = ReActAgent(FakeLM(replies if callable(replies) else list(replies)), DEMOS,
                               config=AgentConfig(rendering=rendering))
        else:
            agent = CBAgent(SteeredLM(prefer=PRIOR_PICKS.get(rendering)), DEMOS, concepts=None,
                            config=AgentConfig(rendering=rendering))
        made.append((rendering, actor))
        return agent

    return make, made


def test_probe_resume_skips_finished_keys_and_duplicates_nothing(tmp_path):
    items = probe_items(tmp_path)
    out = tmp_path / "probe" / "p.jsonl"
    make, made = react_factory()
    first = studies.run_probe(items, ["raw"], ["react"], make, out)
    assert [r["repeat"] for r in first] == [True, False]  # the reply repeats item 1's action only
    with pytest.raises(ValueError, match="--resume"):
        studies.run_probe(items, ["raw"], ["react"], make, out)
    seen = []
    again = studies.run_probe(items, ["raw", "check"], ["react", "prior-only"], make, out, resume=True,
                              meta={"model": "fake-lm"}, on_record=seen.append)
    assert len(again) == 6 and seen.count(None) == 2
    keys = [(r["item"], r["rendering"], r["agent"]) for r in studies.read_study(out, "probe")]
    assert len(keys) == 8 == len(set(keys))
    assert ("raw", "react") not in made[1:]  # no agent built when nothing is left to do
    rows = studies.probe_rows(studies.read_study(out, "probe"))
    # items a/1@1 and a/1@5 repeat "go to window 1" and "examine wall 1"; ReAct replies "go to
    # window 1"; prior-only is steered to "go to window 1" under raw and "go to desk 1" under check
    assert [(r.group, r.k, r.n) for r in rows] == [
        (("raw", "react"), 1, 2), (("raw", "prior-only"), 1, 2), (("check", "react"), 1, 2),
        (("check", "prior-only"), 0, 2)]


# recovery: task b/1 is won by go to door 1, open door 1, go to hall 1
FAILED_ACTIONS = ["go to window 1", "think: where is the door", "go to door 1", "examine wall 1", "go to window 1",
                  "examine wall 1", "go to window 1", "examine wall 1", "go to window 1"]


def failed_results(tmp_path, actions=FAILED_ACTIONS, name="failed.jsonl"):
    ep = Episode(ScriptedEnv(), "b/1", len(actions))
    for a in actions:
        ep.act(a)
    assert not ep.won and len(ep.steps) == 9
    return write_results(tmp_path / name, [ep.trajectory()])


def recovery_item(tmp_path):
    (item,) = studies.select_recovery_items(studies.recorded_trials([failed_results(tmp_path)]))
    return item


def test_recovery_selection_skips_wins_and_short_trajectories(tmp_path):
    short = trajectory(MINED[:5], "a/2")
    won = trajectory(MINED, "a/3", won=True)
    path = write_results(tmp_path / "mixed.jsonl", [short, won, trajectory(MINED, "a/1")])
    items = studies.select_recovery_items(studies.recorded_trials([path, path]))
    assert [i.key for i in items] == ["react:a/1#0"]
    assert (items[0].length, items[0].k, items[0].segment_end, len(items[0].segment)) == (11, 3, 7, 4)


@pytest.mark.parametrize("condition", ["history", "reference"])
def test_recovery_replays_k_steps_then_the_agent_continues(tmp_path, condition):
    item = recovery_item(tmp_path)
    assert item.k == 3 and item.segment_end == 6
    env = ScriptedEnv()
    lm = FakeLM([" open door 1", " go to hall 1"])
    rec = studies.recovery_record(env, item, condition, "react", ReActAgent(lm, DEMOS), new_actions=5)
    # the engine saw exactly the replayed env actions (the thought never reaches it), then the agent's
    assert env.engine_actions == ["go to window 1", "go to door 1", "open door 1", "go to hall 1"]
    assert rec["recovered"] and rec["new_steps"] == 2 and not rec["replay_mismatch"] and not rec["replay_ended"]
    steps = rec["trajectory"]["steps"]
    assert [s["kind"] for s in steps[:3]] == ["env", "think", "env"]
    reference_in = ["[Reference: 3 recorded steps follow" in p for p in lm.prompts]
    assert all(reference_in) if condition == "reference" else not any(reference_in)
    if condition == "reference":  # the block sits after the replayed steps, before the new ones
        p = lm.prompts[1]
        assert p.index("> go to door 1") < p.index("[Reference:") < p.index("[End of reference") < p.index(
            "> open door 1")


def test_recovery_budget_gives_at_most_new_actions_steps(tmp_path):
    item = recovery_item(tmp_path)
    env = ScriptedEnv()
    agent = ReActAgent(FakeLM([" examine wall 1"]), DEMOS)
    rec = studies.recovery_record(env, item, "reference", "react", agent, new_actions=4)
    assert rec["new_steps"] == 4 and len(env.engine_actions) == 2 + 4 and not rec["recovered"]
    assert rec["loop"]["longest_cycle"] == {"period": 1, "repeats": 4, "span": 4}
    assert rec["reference_actions_reused"] == 4
    seen = len(agent.lm.prompts)  # the reference entered this item's contexts only, not the agent
    studies.recovery_record(ScriptedEnv(), item, "history", "react", agent, new_actions=1)
    assert "[Reference:" in agent.lm.prompts[seen - 1] and "[Reference:" not in agent.lm.prompts[-1]


def test_recovery_flags_a_replay_that_does_not_reproduce_the_recording(tmp_path):
    path = failed_results(tmp_path)
    rec = orjson.loads(path.read_bytes())
    rec["trials"][0]["trajectory"]["steps"][2]["observation"] = "You see a red door."
    bad = tmp_path / "bad.jsonl"
    append_jsonl(bad, rec)
    (item,) = studies.select_recovery_items(studies.recorded_trials([bad]))
    out = studies.recovery_record(ScriptedEnv(), item, "history", "react", ReActAgent(FakeLM([" look"]), DEMOS), 1)
    assert out["replay_mismatch"] and out["mismatch_steps"] == [2]


def test_recovery_reviews_the_replayed_transitions_under_experience(tmp_path):
    item = recovery_item(tmp_path)
    lm = FakeLM(review_replies)
    agent = ReActAgent(lm, DEMOS, config=AgentConfig(rendering="experience"))
    rec = studies.recovery_record(ScriptedEnv(), item, "history", "react", agent, new_actions=1)
    # replayed env transitions 0 and 2 are reviewed before the agent's first step (1 is a thought)
    assert [r["step"] for r in rec["log"]["reviews"]][:2] == [0, 2]
    assert rec["log"]["experiences"]["0"] == "The window cannot be reached."
    first_route = next(p for p in lm.prompts if p.rstrip().endswith(">"))
    assert first_route.count("Experience: The window cannot be reached.") == 2


def test_run_recovery_resume(tmp_path):
    item = recovery_item(tmp_path)
    out = tmp_path / "rec.jsonl"
    make, _ = react_factory(lambda prompt, t, n: [" go to hall 1" if "You open door 1." in prompt else " open door 1"])
    recs = studies.run_recovery(ScriptedEnv(), [item], ["raw"], ["history", "reference"], ["react"], make, out,
                                new_actions=3)
    assert [r["condition"] for r in recs] == ["history", "reference"] and all(r["recovered"] for r in recs)
    assert studies.run_recovery(ScriptedEnv(), [item], ["raw"], ["history", "reference"], ["react"], make, out,
                                resume=True, new_actions=3) == []
    rows = studies.recovery_rows(studies.read_study(out, "recover"))
    assert [(r.group, r.k, r.n) for r in rows] == [(("history", "raw", "react"), 1, 1),
                                                   (("reference", "raw", "react"), 1, 1)]


def test_pending_keys_refuses_a_resume_with_other_settings(tmp_path):
    out = tmp_path / "s.jsonl"
    line = {"study": "recover", "item": "a/1", "condition": "history", "rendering": "raw", "agent": "react",
            "dtype": "float32", "seed": 0}
    append_jsonl(out, line)
    key, other = ("a/1", "history", "raw", "react"), ("a/2", "history", "raw", "react")
    assert studies.pending_keys(out, "recover", {key, other}, True, {"dtype": "float32", "layout": "text"}) == {other}
    # a line without a layout was played in the text layout (the recorded default, as for results lines)
    with pytest.raises(ValueError, match=r"'a/1' with layout='text', but this run uses layout='chat'"):
        studies.pending_keys(out, "recover", {key, other}, True, {"dtype": "float32", "layout": "chat"})
    with pytest.raises(ValueError, match=r"'a/1' with dtype='float32', but this run uses dtype='bfloat16'"):
        studies.pending_keys(out, "recover", {key, other}, True, {"dtype": "bfloat16"})
    # lines outside the keys asked for are not compared
    assert studies.pending_keys(out, "recover", {other}, True, {"dtype": "bfloat16"}) == {other}


def test_read_study_keeps_its_own_lines_and_names_bad_ones(tmp_path):
    out = tmp_path / "s.jsonl"
    line = {"study": "probe", "item": "a/1@1", "rendering": "raw", "agent": "react", "repeat": True}
    out.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in (line, {**line, "study": "recover"}, {"x": 1}))
                    + b'{"study": "probe"')
    with pytest.warns(UserWarning) as caught:
        assert studies.read_study(out, "probe") == [line]
    assert [str(w.message).split(": ")[0] for w in caught] == [f"{out}:3", f"{out}:4"]


def test_cli_choices_match_the_study_module():
    assert probe_cmd.ACTORS == studies.STUDY_ACTORS and recover_cmd.CONDITIONS == studies.CONDITIONS
    assert tuple(RENDERING_NAMES) == tuple(studies.RENDERINGS)


@pytest.fixture()
def doubles(monkeypatch, tmp_path):
    monkeypatch.setenv("CB_AGENT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(envs, "make_env", lambda name, **kw: ScriptedEnv(expert_looks=True))
    monkeypatch.setattr(agent_shell.lm, "load_language_model",
                        lambda name=None, dtype="bfloat16", **_: FakeLM(review_replies))


def test_probe_and_recover_commands(tmp_path, doubles, monkeypatch):
    results = write_results(tmp_path / "r.jsonl", [trajectory(MINED)])
    out = tmp_path / "probe.jsonl"
    args = ["probe", str(results), "--history", "raw", "--history", "experience", "--actor", "react",
            "--out", str(out)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert "4 lines written" in res.output and "Repetition probe" in res.output
    # a/1@1 repeats "go to window 1" (the scripted reply), a/1@5 repeated "examine wall 1"
    assert res.output.count("1/2 │ 50.0%") == 2

    def no_backbone(*args, **kwargs):
        raise AssertionError("the backbone was loaded")

    # a refused rerun and a resume with nothing left never load the backbone
    monkeypatch.setattr(agent_shell.lm, "load_language_model", no_backbone)
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 1 and "--resume" in again.output, again.output
    whole = out.read_bytes()
    with open(out, "ab") as fh:  # an interrupted append: --resume moves it aside, the rest stays as it was
        fh.write(b'{"study": "probe", "it')
    resumed = CliRunner().invoke(main, args + ["--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert f"repaired {out}: line 5" in resumed.output and out.read_bytes() == whole
    assert "0 lines written, 4 already" in resumed.output and resumed.output.count("1/2 │ 50.0%") == 2
    assert len(studies.read_study(out, "probe")) == 4
    monkeypatch.setattr(agent_shell.lm, "load_language_model",
                        lambda name=None, dtype="bfloat16", **_: FakeLM(review_replies))

    failed = failed_results(tmp_path)
    out = tmp_path / "recover.jsonl"
    args = ["recover", str(failed), "--new-actions", "2", "--out", str(out)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    recs = studies.read_study(out, "recover")
    assert sorted(r["condition"] for r in recs) == ["history", "reference"]
    assert all(r["new_steps"] == 2 and r["model"] == "fake-lm" for r in recs)
    assert "Reference-history recovery" in res.output
    monkeypatch.setattr(agent_shell.lm, "load_language_model", no_backbone)
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 1 and "--resume" in again.output, again.output
    resumed = CliRunner().invoke(main, args + ["--resume"])
    assert resumed.exit_code == 0 and "0 lines written, 2 already" in resumed.output, resumed.output
    # the backbone still unloaded: a resume with other settings is refused before anything loads
    for flag, value, field in (("--new-actions", "3", "new_actions=2"), ("--seed", "1", "seed=0"),
                               ("--layout", "chat", "layout='text'")):
        mixed = CliRunner().invoke(main, args + ["--resume", flag, value])
        assert mixed.exit_code == 1 and field in mixed.output and "would mix" in mixed.output, mixed.output
    assert len(studies.read_study(out, "recover")) == 2


def test_recover_skips_an_episode_past_its_time_limit_and_goes_on(tmp_path, doubles, monkeypatch):
    """A recovery whose engine step never returns ends at --episode-timeout: one warning names it,
    no line is written for it, and the next item's line equals a run's without the hang."""
    trajs = []
    for task_id in ("b/1", "b/2"):
        ep = Episode(ScriptedEnv(), task_id, len(FAILED_ACTIONS))
        for a in FAILED_ACTIONS:
            ep.act(a)
        trajs.append(ep.trajectory())
    results = write_results(tmp_path / "failed.jsonl", trajs)
    args = ["recover", str(results), "--condition", "history", "--new-actions", "2"]
    clean = CliRunner().invoke(main, args + ["--out", str(tmp_path / "clean.jsonl")])
    assert clean.exit_code == 0, clean.output
    expected = {r["item"]: r for r in studies.read_study(tmp_path / "clean.jsonl", "recover")}
    monkeypatch.setattr(envs, "make_env", lambda name, **kw: HangingEnv(hang_on=("b/1",), expert_looks=True))
    out = tmp_path / "recover.jsonl"
    res = CliRunner().invoke(main, args + ["--out", str(out), "--episode-timeout", "1"])
    assert res.exit_code == 0, res.output
    assert ("warning: recover skipped react:b/1#0 [history raw react]: EpisodeTimeout: episode ran past its "
            "wall-clock limit of 1 s; --resume plays it again") in res.output
    assert f"1 lines written, 0 already in {out}; 1 skipped" in res.output
    (got,) = studies.read_study(out, "recover")
    assert got["item"] == "react:b/2#0"
    untimed = lambda r: {**r, "wall_s": 0, "log": {**r["log"], "seconds": {}}}  # noqa: E731
    assert untimed(got) == untimed(expected["react:b/2#0"])


def test_probe_defaults_to_every_rendering_but_the_calibrator_without_its_file(tmp_path, doubles):
    results = write_results(tmp_path / "r.jsonl", [trajectory(MINED)])
    out = tmp_path / "probe.jsonl"
    res = CliRunner().invoke(main, ["probe", str(results), "--actor", "react", "--out", str(out)])
    assert res.exit_code == 0, res.output
    probed = {r["rendering"] for r in studies.read_study(out, "probe")}
    assert probed == set(RENDERING_NAMES) - {"calibrator"} and len(probed) == len(RENDERING_NAMES) - 1
    refused = CliRunner().invoke(main, ["probe", str(results), "--history", "calibrator", "--out", str(tmp_path / "c")])
    assert refused.exit_code == 2 and "--calibrator FILE" in refused.output
