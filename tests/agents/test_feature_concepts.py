"""Feature sets wired into fitting, acting and the CLI: caches, metadata, refusals, old files."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

import cb_core
from agent_doubles import FakeLM, ScriptedEnv
from agent_shell.agents import CBAgent
from agent_shell.cli import main
from agent_shell.concepts import cached_concepts, check_concept_matches, collect_features
from agent_shell.demos import expert_demos
from agent_shell.feature_settings import FeatureSettings
from agent_shell.features import FeatureSet
from agent_shell.features.novelty import COLUMNS as NOVELTY_COLUMNS
from agent_shell.features.novelty import Novelty
from agent_shell.results import read_results
from envs.episode import Episode
from test_features import plugin  # noqa: F401  (the entry-point fixture with the example WordCount)
from test_reporting_cli_run import doubles  # noqa: F401  (CLI with FakeLM and ScriptedEnv)

DEMOS = {"fetch": ["DEMO-FETCH"], "open": ["DEMO-OPEN"]}


@pytest.fixture()
def trajectories(tmp_path):
    return expert_demos(ScriptedEnv(expert_looks=True), per_type=2, split="train", path=tmp_path / "expert.jsonl")


def test_collected_features_are_the_blocks_side_by_side_and_each_block_is_cached(tmp_path, trajectories,
                                                                                  monkeypatch, plugin):  # noqa: F811
    lm = FakeLM(hidden_size=8)
    seed = collect_features(lm, trajectories, FeatureSettings(), cache_dir=tmp_path / "cache")
    calls = []
    original = Novelty.extract
    monkeypatch.setattr(Novelty, "extract", lambda self, *a: calls.append(1) or original(self, *a))
    fs = FeatureSet.from_spec("lm-hidden,novelty,word-count")
    feats = collect_features(lm, trajectories, FeatureSettings(feature_set=fs), cache_dir=tmp_path / "cache")
    assert len(calls) == 10  # one novelty block per decision (4 + 6), computed once
    for t in feats:
        assert feats[t].expert == seed[t].expert
        for x, h, lq, lq0 in zip(feats[t].phi, seed[t].phi, feats[t].log_q, seed[t].log_q):
            assert x.shape == (len(h), 8 + 13 + 1)
            np.testing.assert_array_equal(x[:, :8], h)       # lm-hidden from the cached scores
            np.testing.assert_array_equal(lq, lq0)           # the prior is untouched
    n_scores = len(lm.score_calls)
    other = collect_features(lm, trajectories, FeatureSettings(feature_set=FeatureSet.from_spec("novelty")),
                             cache_dir=tmp_path / "cache")
    assert len(calls) == 10 and len(lm.score_calls) == n_scores  # both blocks and scores came from the cache
    np.testing.assert_array_equal(other["open"].phi[2], feats["open"].phi[2][:, 8:21])
    # b/1's second decision: "open door 1" names the object of the earlier "go to door 1"
    assert other["open"].phi[1][:, 5].tolist() == [0, 1, 0]  # object_taken_ge_1


def test_concepts_record_their_feature_set_and_acting_refuses_another(tmp_path, trajectories):
    lm = FakeLM(hidden_size=8)
    fs = FeatureSet.from_spec("novelty,lm-hidden")
    feats = collect_features(lm, trajectories, FeatureSettings(feature_set=fs))
    concepts, folder = cached_concepts(feats, lm, FeatureSettings(feature_set=fs), lam=0.5, gamma=0.8,
                                       cache_dir=tmp_path)
    c = cb_core.Concept.load(folder / "open.safetensors")  # one safetensors file, read back
    assert c.hidden_size == 21 and [b["name"] for b in c.metadata["features"]["extractors"]] == ["novelty", "lm-hidden"]
    assert c.metadata["features"]["extractors"][0]["metadata"]["columns"][0] == "taken_ge_1"
    check_concept_matches(c, lm, FeatureSettings(feature_set=fs))
    with pytest.raises(ValueError, match="fitted with features 'novelty,lm-hidden', but acting uses 'lm-hidden'"):
        check_concept_matches(c, lm, FeatureSettings())
    seed_concepts, seed_folder = cached_concepts(collect_features(lm, trajectories, FeatureSettings()), lm,
                                                 FeatureSettings(), lam=0.5, gamma=0.8, cache_dir=tmp_path)
    assert seed_folder != folder and seed_concepts["open"].hidden_size == 8  # the cache keys differ


def test_a_concept_file_from_before_extractors_loads_as_lm_hidden(tmp_path):
    lm = FakeLM(hidden_size=8)
    meta = dict(backbone="fake-lm", gamma=0.8, lam=1.0, eps=1e-6, task_type="open", trajectories=[], versions={},
                hidden_size=8, features={"formatting": "plain", "dtype": "", "rendering": "raw", "layout": "text",
                                         "action_prefix": "\n> ", "context": "task + history, no demonstrations",
                                         "candidate_filter": "drop look/inventory/help"})
    (tmp_path / "open.safetensors").write_bytes(cb_core.Concept(np.ones(9, np.float32), 0.8, 1e-6, meta).to_bytes())
    old = cb_core.Concept.load(tmp_path / "open.safetensors")
    check_concept_matches(old, lm, FeatureSettings())
    with pytest.raises(ValueError, match="fitted with features 'lm-hidden', but acting uses 'lm-hidden,novelty'"):
        check_concept_matches(old, lm, FeatureSettings(feature_set=FeatureSet.from_spec("lm-hidden,novelty")))


class StubbornLM(FakeLM):
    """The prior wants 'go to window 1' (a wrong move in every scripted task) by 50 nats."""

    def score(self, context, candidates, action_prefix):
        s = super().score(context, candidates, action_prefix)
        return type(s)(s.log_q + 50.0 * np.array([c == "go to window 1" for c in candidates]), s.n_tokens, s.hidden)


def repeat_averse_concept() -> cb_core.Concept:
    """A ``novelty`` concept of type "fetch" that dislikes immediate repeats and their outcomes."""
    alpha = np.zeros(len(NOVELTY_COLUMNS) + 1, np.float32)
    for c in ("taken_last_step", "last_outcome_nothing", "last_outcome_unchanged"):
        alpha[NOVELTY_COLUMNS.index(c)] = -10.0
    meta = dict(backbone="fake-lm", features={}, gamma=0.8, lam=1.0, eps=1e-6, task_type="fetch", trajectories=[],
                versions={}, hidden_size=len(NOVELTY_COLUMNS))
    return cb_core.Concept(alpha, 0.8, 1e-6, meta)


def test_cb_agent_acts_on_the_history_features_of_its_concept():
    """A concept that dislikes immediate repeats and their 'Nothing happens.' makes CB-Agent move
    on after one wrong move, where prior-only repeats it for the whole budget."""
    fs = FeatureSet.from_spec("novelty")
    runs = {}
    for name, concepts in (("prior-only", None), ("cb-agent", {"fetch": repeat_averse_concept()})):
        env = ScriptedEnv()
        lm = StubbornLM([" act"])
        CBAgent(lm, DEMOS, concepts=concepts, features=fs).run(Episode(env, "a/1", 6))
        runs[name] = env.engine_actions
    assert runs["prior-only"] == ["go to window 1"] * 6
    cb = runs["cb-agent"]
    assert cb[0] == "go to window 1" and all(a != b for a, b in zip(cb, cb[1:])), cb


def test_cli_selects_records_and_refuses_features(tmp_path, doubles):  # noqa: F811
    out = tmp_path / "run"
    args = ["run", "--env", "textworld", "--split", "test", "--agent", "cb-agent", "--games", "1", "--max-steps",
            "3", "--out-dir", str(out)]
    bad = CliRunner().invoke(main, args + ["--features", "lm-hidden,colour"])
    assert bad.exit_code == 2 and "unknown feature extractor 'colour'" in bad.output and not doubles
    res = CliRunner().invoke(main, args + ["--features", "lm-hidden,novelty"])
    assert res.exit_code == 0, res.output
    (rec,) = read_results(out / "results.jsonl")
    assert rec["features"] == "lm-hidden,novelty"
    concept = cb_core.Concept.load(next(iter(sorted(__import__("pathlib").Path(rec["concepts_dir"]).glob("*.safetensors")))))
    assert [b["name"] for b in concept.metadata["features"]["extractors"]] == ["lm-hidden", "novelty"]
    mixed = CliRunner().invoke(main, args + ["--resume"])
    assert mixed.exit_code == 1 and "features='lm-hidden,novelty'" in mixed.output
    acc = CliRunner().invoke(main, ["eval-decisions", "--env", "textworld", "--heldout-split", "train",
                                    "--demos-per-type", "1", "--heldout-per-type", "1", "--features", "novelty",
                                    "--out", str(tmp_path / "acc.json")])
    assert acc.exit_code == 0, acc.output
    assert "features novelty" in " ".join(acc.output.split())


def test_run_config_normalises_validates_and_records_the_selection():
    from agent_shell.configure import feature_settings, resolve
    from agent_shell.run_config import RunConfig

    config = resolve(RunConfig(features=" lm-hidden , novelty"), backbone=False)
    assert config.features == "lm-hidden,novelty" and config.settings()["features"] == "lm-hidden,novelty"
    assert feature_settings(config).feature_set.names == ("lm-hidden", "novelty")
    assert resolve(RunConfig(), backbone=False).features == "lm-hidden"
    assert feature_settings(RunConfig()).feature_set.is_default
    with pytest.raises(ValueError, match="'lm-layer' needs an integer layer"):
        resolve(RunConfig(features="lm-layer"), backbone=False)


def test_concept_data_size_is_decoupled_from_the_react_demonstrations(tmp_path, doubles):  # noqa: F811
    """--concept-per-type K fits the concept on the first K won trajectories per type while the
    ReAct prompt keeps --demos-per-type; records and reports tell the two apart."""
    from agent_shell.reporting import summarize

    def run(out, k):
        args = ["run", "--env", "textworld", "--split", "test", "--agent", "react", "--agent", "cb-agent",
                "--games", "1", "--max-steps", "2", "--demos-per-type", "1", "--out-dir", str(out)]
        res = CliRunner().invoke(main, args + (["--concept-per-type", str(k)] if k else []))
        assert res.exit_code == 0, res.output
        return read_results(out / "results.jsonl"), doubles[-1]

    records, lm = run(tmp_path / "k2", 2)
    assert {r["concept_per_type"] for r in records} == {2} and {r["demos_per_type"] for r in records} == {1}
    cb = next(r for r in records if r["agent"] == "cb-agent")
    concepts = sorted(__import__("pathlib").Path(cb["concepts_dir"]).glob("*.safetensors"))
    assert concepts and all(len(cb_core.Concept.load(c).metadata["trajectories"]) == 2 for c in concepts)
    routing = [p for p in lm.prompts if isinstance(p, str) and "Here are" in p]
    assert routing and all("Here are 1 examples" in p for p in routing)  # the demonstrations stay 1
    default, _ = run(tmp_path / "k0", 0)  # 0: the demonstrations' count
    assert {r["concept_per_type"] for r in default} == {1}
    labels = {row.agent for row in summarize(records + default)}
    assert labels == {"react", "cb-agent (concept_per_type=1)", "cb-agent (concept_per_type=2)"}
    old = [{k: v for k, v in r.items() if k != "concept_per_type"} for r in default]  # written before the option
    assert {row.agent for row in summarize(old + default)} == {"react", "cb-agent"}


@pytest.mark.parametrize("features", ["novelty", "goal-similarity"])
def test_joint_cb_agent_plays_with_non_default_features(tmp_path, doubles, features):  # noqa: F811
    """The joint actor hands its choice the decision's task and history, as CB-Agent does, so the
    feature extractors that read them work under it too."""
    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["run", "--env", "textworld", "--split", "test", "--agent", "joint-cb-agent",
                                    "--games", "1", "--max-steps", "3", "--features", features,
                                    "--out-dir", str(out)])
    assert res.exit_code == 0, res.output
    (rec,) = read_results(out / "results.jsonl")
    assert rec.get("error") is None, rec.get("error")
    assert rec["agent"] == "joint-cb-agent" and rec["features"] == features and rec["env_steps"] >= 1
    assert all(n > 1 for n in rec["n_candidates"]) and len(rec["n_candidates"]) == rec["env_steps"]


def test_joint_cb_agent_chooses_under_a_history_concept_as_cb_agent_does():
    """With the concept of the history test above, the joint actor's environment steps pick the
    candidates CB-Agent picks on the same view: alpha reads the novelty block of the true history."""
    from agent_shell.agents import AgentConfig, View
    from agent_shell.agents.joint import JointCBAgent
    from cb_io.records import TaskStart

    concepts = {"fetch": repeat_averse_concept()}
    fs = FeatureSet.from_spec("novelty")
    lm = StubbornLM(lambda prompt, t, n: [" NO UPDATE\n> go"] * n)
    joint = JointCBAgent(lm, DEMOS, concepts=concepts, config=AgentConfig(), features=fs)
    plain = CBAgent(lm, DEMOS, concepts=concepts, config=AgentConfig(rendering="experience"), features=fs)
    window = type("S", (), {"kind": "env", "action": "go to window 1", "observation": "Nothing happens."})()
    view = View(TaskStart("a/1", "fetch", "Your task is to: fetch the key.", "You are in a room."), (window,),
                ("go to window 1", "go to desk 1", "look"))
    d = joint.next_action(view)
    assert d.kind == "env" and d.action == "go to desk 1"  # the prior wants the window by 50 nats
    assert d.action == plain.choose("fetch", plain.scoring_context(view), d.candidates, view).action
