"""Action calibration: the calibrator, its rendering, the joint actor and the `cb-agent calibrate` commands,
with FakeLM / ScriptedEnv.
"""

import numpy as np
import pytest
from click.testing import CliRunner

import agent_shell.lm
import envs
from agent_doubles import FakeLM, HangingEnv, ScriptedEnv
from agent_shell.agents import AgentConfig, ReActAgent, build_agent, needs_concepts
from agent_shell.agents.joint import JointCBAgent, JointFormatError, parse_joint_reply
from agent_shell.calibration import Calibrator, accuracy, fit_calibrator, predictions, record_features, tied_labels
from agent_shell.studies.labels import read_labels
from agent_shell.cli import main
from agent_shell.experience import NO_UPDATE
from agent_shell.history import RENDERINGS
from agent_shell.configure import resolve
from agent_shell.run_config import RunConfig
from agent_shell.studies import recorded_trials
from calibration_doubles import CANDS, DEMOS, PLAYED, START, env_step, label_line, recorded, review_replies
from envs.episode import Episode
from cb_io.storage import append_jsonl


# ------------------------------------------------------------------------------------- the calibrator


class DrawerLM(FakeLM):
    """FakeLM whose hidden coordinate 0 is 3 for an option that mentions a drawer."""

    def score(self, context, candidates, action_prefix):
        s = super().score(context, candidates, action_prefix)
        hidden = s.hidden.copy()
        hidden[:, 0] = [3.0 if "drawer" in c else 0.0 for c in candidates]
        return type(s)(s.log_q, s.n_tokens, hidden)


def test_calibrator_fits_saves_loads_and_refuses_another_backbone(tmp_path):
    lm = DrawerLM(hidden_size=8)
    # the label is always the option mentioning "drawer" (at varying positions)
    records = []
    for j in range(24):
        opts = [f"Shelf {j} is empty.", f"The drawer {j} holds things.", f"Walls are plain {j}."]
        pos = j % 3
        opts.insert(pos, opts.pop(1))
        records.append(label_line(f"t/{j % 6}", j, opts, pos, content_label=0))
    feats = [record_features(lm, r) for r in records]
    assert feats[0][0].shape == (4, 8)
    cal = fit_calibrator(lm, records, feats, "label", lam=0.01, extra={"k": 3, "temperature": 0.5})
    assert cal.metadata["task_type"] == "calibrator" and cal.metadata["label_field"] == "label"
    assert cal.metadata["fit"]["converged"]
    train_acc = accuracy(predictions(cal, feats), records, "label")["top1"]
    prior_acc = accuracy(predictions(None, feats), records, "label")["top1"]
    assert train_acc["n"] == 24 and train_acc["k"] == 24 > prior_acc["k"]  # the fit learns the drawer rule
    path = tmp_path / "cal.safetensors"
    cal.save(path)
    again = Calibrator.load(path)
    assert np.array_equal(again.concept.alpha, cal.concept.alpha) and (again.k, again.temperature) == (3, 0.5)
    assert predictions(again, feats) == predictions(cal, feats) and again.fingerprint == cal.fingerprint
    again.check(lm)
    with pytest.raises(ValueError, match="backbone"):
        again.check(DrawerLM(name="other-lm"))
    with pytest.raises(ValueError, match="content_label"):
        fit_calibrator(lm, [label_line("t/0", 0, ["x"], 0)], feats[:1], "content_label")
    with pytest.raises(ValueError, match="no transition"):
        fit_calibrator(lm, [], [], "label")


def test_accuracy_counts_when_and_what():
    records = [label_line("t/0", 0, ["a", "b"], 0), label_line("t/0", 1, ["a", "b"], 2),
               label_line("t/0", 2, ["a", "b"], 1), label_line("t/0", 3, ["a", "b"], 1)]
    acc = accuracy([0, 2, 0, 2], records, "label")
    assert acc["top1"]["k"] == 2 and acc["when"]["k"] == 3
    assert (acc["what"]["k"], acc["what"]["n"]) == (1, 2)  # records 0 and 2 update in label and prediction


def test_top1_among_tied_labels_counts_any_candidate_as_good_as_the_label():
    def counts(i, d, keep=True):
        return {"experience": "x", "improvements": i, "degradations": d, "ties": 0, "retained": keep}

    r = label_line("t/0", 0, ["a", "b", "c", "d"], 0)
    r["candidates"] = [counts(1, 0), counts(0, 0), counts(1, 0), counts(2, 1)]  # a and c tie by (I - D, I)
    assert tied_labels(r, "label") == {0, 2}
    none = label_line("t/0", 1, ["a"], 1)
    none["candidates"] = [counts(0, 2, keep=False)]
    assert tied_labels(none, "label") == {1}
    r["content_label"] = 1
    assert tied_labels(r, "content_label") == {1}
    acc = accuracy([2, 1, 4], [r, none, r], "label")
    assert (acc["top1"]["k"], acc["top1_tied"]["k"], acc["top1_tied"]["n"]) == (1, 2, 3)


def calibrator_for(lm, tmp_path=None):
    records = [label_line(f"t/{j}", j, [f"The desk {j} holds a key.", f"Walls {j} are plain."], j % 2)
               for j in range(6)]
    return fit_calibrator(lm, records, [record_features(lm, r) for r in records], "label",
                          extra={"k": 3, "temperature": 0.7})


def test_calibrated_review_chooses_among_sampled_candidates():
    lm = FakeLM(lambda prompt, t, n: ["The window cannot be used.", "Walls stay plain here.", NO_UPDATE][:n])
    cal = calibrator_for(lm)
    steps = [env_step("go to window 1", "Nothing happens.")]
    review = cal.review(lm, START.instruction, START.observation, steps, 0, CANDS)
    assert review.options == ("The window cannot be used.", "Walls stay plain here.")
    assert review.to_dict()["options"] == list(review.options)


class WordLM(FakeLM):
    """FakeLM whose hidden coordinate 0 is 3 for an option that mentions ``word``."""

    def __init__(self, word, replies):
        super().__init__(replies, hidden_size=8)
        self.word = word

    def score(self, context, candidates, action_prefix):
        s = super().score(context, candidates, action_prefix)
        hidden = s.hidden.copy()
        hidden[:, 0] = [3.0 if self.word in c else 0.0 for c in candidates]
        return type(s)(s.log_q, s.n_tokens, hidden)


@pytest.mark.parametrize("word", ["drawer", "Walls"])
def test_calibrated_review_takes_the_option_its_fitted_rule_prefers(word):
    """A calibrator fitted to always pick the option that mentions ``word`` (marked in a hidden
    coordinate) picks the sampled option that mentions it: with the other word, the other option
    of the same sampled pair, so the choice is the calibrator's, not the prior's or the order's."""
    sampled = ["The drawer 1 holds the key.", "Walls stay plain here."]
    lm = WordLM(word, lambda prompt, t, n: (sampled + [NO_UPDATE])[:n])
    records = []
    for j in range(24):  # the label is always the option with the word (at varying positions)
        opts = [f"Shelf {j} is empty.", f"The drawer {j} holds things.", f"Walls are plain {j}."]
        marked = next(i for i, o in enumerate(opts) if word in o)
        pos = j % 3
        opts.insert(pos, opts.pop(marked))
        records.append(label_line(f"t/{j % 6}", j, opts, pos))
    cal = fit_calibrator(lm, records, [record_features(lm, r) for r in records], "label", lam=0.01,
                         extra={"k": 3, "temperature": 0.7})
    review = cal.review(lm, START.instruction, START.observation, [env_step("go to window 1", "Nothing happens.")],
                        0, CANDS)
    assert review.options == tuple(sampled)
    assert review.experience == next(o for o in sampled if word in o)


def test_calibrator_rendering_in_an_episode(tmp_path):
    assert RENDERINGS["calibrator"] is RENDERINGS["experience"]
    lm = FakeLM(lambda prompt, t, n: ["The window cannot be used."] * n if "Latest action" in prompt
                else ["> go to window 1"] * n)
    cal = calibrator_for(lm)
    config = AgentConfig(rendering="calibrator")
    with pytest.raises(ValueError, match="calibrator"):
        ReActAgent(lm, DEMOS, config=config).run(Episode(ScriptedEnv(), "a/1", 3))
    log = ReActAgent(lm, DEMOS, config=config, calibrator=cal).run(Episode(ScriptedEnv(), "a/1", 3))
    assert len(log.reviews) == 2 and all(r["options"] == ["The window cannot be used."] for r in log.reviews)
    kept = [r for r in log.reviews if r["experience"]]
    assert set(log.experiences) == {r["step"] for r in kept}
    with pytest.raises(ValueError, match="--calibrator"):
        RunConfig(rendering="calibrator")
    resolved = resolve(RunConfig(rendering="calibrator", calibrator="c.safetensors"), backbone=False)
    assert resolved.settings()["calibrator"] == "c.safetensors"


# ------------------------------------------------------------------------------------- the joint actor


def test_joint_reply_is_parsed_strictly():
    assert parse_joint_reply(" The drawer is empty.\n> go to desk 1\nextra") == ("The drawer is empty.", "> go to desk 1")
    for reply, reason in [("\n> go to desk 1", "empty calibration block"), (" NO UPDATE", "no action line"),
                          (" NO UPDATE\ngo to desk 1", "does not start with '>'"), ("   \n", "empty calibration")]:
        with pytest.raises(JointFormatError, match=reason):
            parse_joint_reply(reply)


class GreedyTextLM(FakeLM):
    """A greedy LM that writes one whole text per step (everything it would ever write after the
    prompt's ``Experience:``) and honours ``stop`` as a real backend does: a call returns the
    text up to its first stop string, a continuation prompt gets what follows, and nothing once
    the text has ended."""

    def __init__(self, texts):
        super().__init__()
        self.texts, self.calls = iter(texts), []

    def generate(self, prompt, max_new_tokens=64, stop=(), temperature=0.0, n=1, seed=None):
        self.prompts.append(prompt)
        self.calls.append(max_new_tokens)
        if prompt.endswith("Experience:"):
            self.text, self.start = next(self.texts), prompt
        written = prompt[len(self.start):]
        if written.startswith(self.text):  # the text ended (end of sequence): nothing more
            return [""]
        assert self.text.startswith(written), "a continuation must extend what was written"
        rest = self.text[len(written):]
        cut = min((i for i in (rest.find(x) for x in stop) if i >= 0), default=len(rest))
        return [rest[:cut]]


def test_joint_reply_ends_with_its_action_line():
    """Two greedy continuations of one reply: the block to its newline (review_tokens), then the
    action line to its newline (reply_tokens); what the model would write after it is never
    generated and never recorded."""
    lm = GreedyTextLM([" The desk is empty.\n> go to desk 1\nYou arrive at desk 1.\n> look\n"])
    agent = build_agent("joint-react", lm, DEMOS).agent
    episode = Episode(ScriptedEnv(), "a/1", 1)
    log = agent.run(episode)
    assert [s.action for s in episode.steps] == ["go to desk 1"]
    assert log.replies == [" The desk is empty.\n> go to desk 1"]
    assert lm.calls == [agent.config.review_tokens, agent.config.reply_tokens]
    assert lm.prompts[1] == lm.prompts[0] + " The desk is empty.\n"


def test_joint_react_keeps_its_experiences_and_counts_malformed_replies():
    lm = GreedyTextLM([" NO UPDATE\n> go to window 1\nYou see a window.", " The window cannot be used.\n> go to desk 1\n",
                       " garbage without an action line", " NO UPDATE\n> think: next the key\n"])
    agent = build_agent("joint-react", lm, DEMOS).agent
    assert agent.config.rendering == "experience"
    env = ScriptedEnv()
    episode = Episode(env, "a/1", 4)
    log = agent.run(episode)
    assert [s.action for s in episode.steps] == ["go to window 1", "go to desk 1", "look", "think: next the key"]
    assert log.experiences == {0: "The window cannot be used."}  # step 0 reviewed by the second reply
    assert [r["step"] for r in log.reviews] == [0, 2] and log.reviews[1]["experience"] is None
    assert [e["reason"] for e in log.format_errors] == ["no action line after the calibration block"]
    step_prompts = [p for p in lm.prompts if p.endswith("Experience:")]
    assert "Experience: The window cannot be used." in step_prompts[2] and len(step_prompts) == 4
    assert env.engine_actions == ["go to window 1", "go to desk 1", "look"]


def test_joint_cb_agent_chooses_among_candidates():
    lm = FakeLM(lambda prompt, t, n: [" NO UPDATE\n> fly to the moon"], prefer="go to desk 1")
    with pytest.raises(ValueError, match="needs fitted concepts"):
        build_agent("joint-cb-agent", lm, DEMOS, concepts=None)
    agent = JointCBAgent(lm, DEMOS, concepts=None)
    assert agent.name == "joint-prior-only"
    d = agent.next_action(agent_view())
    assert d.kind == "env" and d.action == "go to desk 1" and d.candidates is not None and d.format_error is None
    with pytest.raises(ValueError, match="text only"):
        JointCBAgent(lm, DEMOS, concepts=None, config=AgentConfig(layout="chat"))
    with pytest.raises(ValueError, match="raw or experience"):
        JointCBAgent(lm, DEMOS, concepts=None, config=AgentConfig(rendering="causal"))


def agent_view():
    from agent_shell.agents import View
    return View(START, (env_step("go to window 1", "Nothing happens."),), tuple(CANDS))


# ------------------------------------------------------------------------------------- the CLI


@pytest.fixture()
def doubles(monkeypatch, tmp_path):
    monkeypatch.setenv("CB_AGENT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(envs, "make_env", lambda name, **kw: ScriptedEnv())
    monkeypatch.setattr(agent_shell.lm, "load_language_model",
                        lambda name=None, dtype="bfloat16", **_: FakeLM(review_replies))


def test_calibrate_label_fit_eval_commands(tmp_path, doubles):
    results = recorded(tmp_path, PLAYED)
    out = tmp_path / "labels.jsonl"
    args = ["calibrate", "label", str(results), "--actor", "react", "--actor", "prior-only", "--k", "3",
            "--out", str(out)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    records = read_labels(out)
    assert len(records) == 3 and all(r["judge"] == "expert-distance" and r["model"] == "fake-lm" for r in records)
    assert "Calibration labels: 3 transitions" in res.output
    counts = __import__("json").loads((tmp_path / "labels.jsonl.counts.json").read_text())
    assert counts["transitions"] == 3
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 1 and "--resume" in again.output
    resumed = CliRunner().invoke(main, args + ["--resume"])
    assert resumed.exit_code == 0 and "0 to label" in resumed.output, resumed.output
    # a resume with other settings, or over another recording of the same trials, would mix labels
    other_k = CliRunner().invoke(main, args[:-3] + ["4", "--out", str(out), "--resume"])
    assert other_k.exit_code == 1 and "k=3" in other_k.output and "k=4" in other_k.output, other_k.output
    replayed = recorded(tmp_path, [env_step("go to window 1", "The window is open."), *PLAYED[1:]], name="r2.jsonl")
    other_run = CliRunner().invoke(main, [*args[:2], str(replayed), *args[3:], "--resume"])
    assert other_run.exit_code == 1 and "another recording" in other_run.output, other_run.output
    assert "react:a/3#0@0" in other_run.output and len(read_labels(out)) == 3
    one = CliRunner().invoke(main, ["calibrate", "label", str(results), "--actor", "react", "--out", str(out)])
    assert one.exit_code == 2 and "at least two" in one.output
    test_split = recorded(tmp_path, PLAYED, split="test", name="t.jsonl")
    refused = CliRunner().invoke(main, ["calibrate", "label", str(test_split), "--out", str(tmp_path / "x.jsonl")])
    assert refused.exit_code == 1 and "training games only" in refused.output
    demo = recorded(tmp_path, PLAYED, task_id="a/1", name="d.jsonl")  # a/1 is a demonstration game
    refused = CliRunner().invoke(main, ["calibrate", "label", str(demo), "--actor", "react", "--actor", "prior-only",
                                        "--out", str(tmp_path / "y.jsonl")])
    assert refused.exit_code == 1 and "expert demonstrations" in refused.output, refused.output

    lines = [label_line(f"t/{j}", j, [f"The desk {j} holds a key.", f"Walls {j} are plain."], j % 3, j % 2)
             for j in range(9)]
    labels = tmp_path / "synthetic.jsonl"
    for r in lines:
        append_jsonl(labels, r)
    cal = tmp_path / "cal.safetensors"
    res = CliRunner().invoke(main, ["calibrate", "fit", str(labels), "--out", str(cal)])
    assert res.exit_code == 0, res.output
    assert "Held-out accuracy (3 transitions of 3 training tasks" in res.output
    ev = __import__("json").loads((tmp_path / "cal.safetensors.eval.json").read_text())
    assert ev["heldout_tasks"] == ["t/2", "t/5", "t/8"] and set(ev["accuracy"]["calibrator"]) == {"label",
                                                                                                   "content_label"}
    res = CliRunner().invoke(main, ["calibrate", "eval", str(labels), "--calibrator", str(cal)])
    assert res.exit_code == 0 and "Accuracy on 3 transitions (held-out tasks)" in res.output, res.output


def test_calibrate_label_skips_a_transition_whose_judge_rollout_hangs_and_goes_on(tmp_path, doubles, monkeypatch):
    """The expert-distance judge's rollout on a/3 hangs at its second engine step: at
    --episode-timeout that transition is skipped with one warning naming it, and the next one is
    labelled as without the hang."""
    hung = recorded(tmp_path, PLAYED, task_id="a/3", name="hung.jsonl")
    fine = recorded(tmp_path, PLAYED, task_id="b/2", name="fine.jsonl")  # a/1, a/2: the demonstrations
    args = ["calibrate", "label", "--actor", "react", "--actor", "prior-only", "--k", "3"]
    clean = CliRunner().invoke(main, args + [str(fine), "--max-transitions", "1", "--out", str(tmp_path / "c.jsonl")])
    assert clean.exit_code == 0, clean.output
    (expected,) = read_labels(tmp_path / "c.jsonl")
    monkeypatch.setattr(envs, "make_env", lambda name, **kw: HangingEnv(hang_on=("a/3",)))
    out = tmp_path / "labels.jsonl"
    res = CliRunner().invoke(main, args + [str(hung), str(fine), "--max-transitions", "2", "--episode-timeout", "1",
                                           "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert ("warning: skipped react:a/3#0@0: EpisodeTimeout: expert-distance rollout ran past its wall-clock limit "
            "of 1 s; --resume labels it again") in res.output
    assert "1 of 2 transitions skipped" in res.output
    (got,) = read_labels(out)
    assert {**got, "wall_s": 0} == {**expected, "wall_s": 0}


def test_training_runs_name_games_that_are_no_demonstrations():
    from agent_shell.run_config import check_not_demos

    env = ScriptedEnv()
    from agent_shell.configure import task_ids

    assert task_ids(RunConfig(split="train", demo_split="train", game_ids=("a/3",)), env) == ["a/3"]
    with pytest.raises(ValueError, match="is the evaluation split"):
        task_ids(RunConfig(split="train", demo_split="train"), env)
    check_not_demos(["a/3"], ["a/1", "a/2"])
    with pytest.raises(ValueError, match="'a/1' is one of the expert demonstrations"):
        check_not_demos(["a/3", "a/1"], ["a/1", "a/2"])
    assert needs_concepts("joint-cb-agent") and not needs_concepts("joint-react")


def test_run_refuses_a_calibrator_without_its_rendering(tmp_path, doubles):
    cal = tmp_path / "c.safetensors"
    cal.write_bytes(b"x")
    res = CliRunner().invoke(main, ["run", "--env", "textworld", "--calibrator", str(cal)])
    assert res.exit_code == 2 and "only with --history calibrator" in res.output
    res = CliRunner().invoke(main, ["probe", str(cal), "--history", "calibrator"])
    assert res.exit_code == 2 and "needs --calibrator" in res.output


def test_probe_and_recovery_use_the_calibrator_under_its_rendering(tmp_path):
    from agent_shell import studies

    steps = [env_step("go to window 1", "Nothing happens."), env_step("go to window 1", "Nothing happens."),
             env_step("examine wall 1", "A plain wall.")]
    (item,) = studies.mine_probe_items(recorded_trials([recorded(tmp_path, steps, task_id="a/1")]))
    lm = FakeLM(lambda prompt, t, n: ["The window cannot be used."] * n if "Latest action" in prompt
                else [" go to desk 1"] * n)
    cal = calibrator_for(lm)
    config = AgentConfig(rendering="calibrator")
    cache = studies.ReviewCache(lm)
    with pytest.raises(ValueError, match="--calibrator"):
        studies.probe_record(item, "calibrator", "react", ReActAgent(lm, DEMOS, config=config), cache)
    rec = studies.probe_record(item, "calibrator", "react", ReActAgent(lm, DEMOS, config=config, calibrator=cal), cache)
    assert rec["experiences_kept"].endswith("/2") and all(r.options for r in cache.reviews.values())
    # the plain reviews of the same transitions are cached apart
    studies.probe_record(item, "experience", "react", ReActAgent(lm, DEMOS, config=AgentConfig(rendering="experience")),
                         cache)
    assert len(cache.reviews) == 4 and sum(not r.options for r in cache.reviews.values()) == 2

    ep = Episode(ScriptedEnv(), "b/1", 9)
    for a in ["go to window 1"] * 9:
        ep.act(a)
    path = tmp_path / "failed.jsonl"
    append_jsonl(path, {"schema": "cb-agent/episode-v1", "agent": "react", "task_id": "b/1", "task_type": "open",
                        "success": False, "trials": [{"won": False, "trajectory": ep.trajectory().to_record()}]})
    (ritem,) = studies.select_recovery_items(recorded_trials([path]))
    line = studies.recovery_record(ScriptedEnv(), ritem, "history", "react",
                                   ReActAgent(lm, DEMOS, config=config, calibrator=cal), new_actions=2)
    reviews = line["log"]["reviews"]
    assert len(reviews) == ritem.k + 2 - 1 and all(r["options"] == ["The window cannot be used."] for r in reviews)
