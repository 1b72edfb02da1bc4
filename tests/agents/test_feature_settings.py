"""The run's feature settings as one value: every setting that changes a feature names its own
concept cache, and every command that computes features uses the run's settings."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner

import agent_shell.concepts
import cb_core
from agent_doubles import FakeLM, ScriptedEnv
from agent_shell.cli import main
from agent_shell.concepts import cached_concepts, check_concept_matches, collect_features, concepts_dir_key
from agent_shell.demos import expert_demos
from agent_shell.feature_settings import FeatureSettings
from agent_shell.features import FeatureSet
from test_reporting_cli_run import doubles  # noqa: F401  (CLI with FakeLM and ScriptedEnv)

WALK = {"c/1": ("walk", [f"go to room {i}" for i in range(1, 8)]),
        "c/2": ("walk", [f"go to room {i}" for i in range(7, 0, -1)])}


@pytest.fixture()
def walks(tmp_path):
    return expert_demos(ScriptedEnv(WALK, expert_looks=True), per_type=2, split="train", path=tmp_path / "e.jsonl",
                        max_steps=30)


def test_every_feature_setting_changes_the_concept_cache_key(walks):
    """Each field of FeatureSettings, changed alone, names another concept folder; the test covers
    every field the dataclass has (a new field without a case here fails)."""
    lm = FakeLM()
    features = collect_features(lm, walks, FeatureSettings())
    calibrators = SimpleNamespace(fingerprint="a"), SimpleNamespace(fingerprint="b")
    cases = {
        "rendering": (FeatureSettings("raw"), FeatureSettings("causal")),
        "layout": (FeatureSettings(layout="text"), FeatureSettings(layout="chat")),
        "seed": (FeatureSettings("shuffle-all", seed=0), FeatureSettings("shuffle-all", seed=7)),
        "feature_set": (FeatureSettings(), FeatureSettings(feature_set=FeatureSet.from_spec("lm-hidden,novelty"))),
        "max_candidates": (FeatureSettings(), FeatureSettings(max_candidates=2)),
        "calibrator": (FeatureSettings("calibrator", calibrator=calibrators[0]),
                       FeatureSettings("calibrator", calibrator=calibrators[1])),
    }
    assert set(cases) == {f.name for f in dataclasses.fields(FeatureSettings)}
    for name, (before, after) in cases.items():
        assert getattr(before, name) != getattr(after, name), name
        assert (concepts_dir_key(features, lm, before, 1.0, 0.8, 1e-6)
                != concepts_dir_key(features, lm, after, 1.0, 0.8, 1e-6)), name


def test_settings_that_change_no_feature_are_normalised_away():
    """The seed under a rendering that does not read it, and a calibrator under another rendering,
    build the same features: they give the same value (and so share one cache folder)."""
    lm = FakeLM()
    assert FeatureSettings("raw", seed=7).describe(lm) == FeatureSettings("raw", seed=0).describe(lm)
    assert (FeatureSettings("recent3", calibrator=SimpleNamespace(fingerprint="a")).describe(lm)
            == FeatureSettings("recent3").describe(lm))
    assert FeatureSettings("shuffle-old", seed=7).describe(lm) != FeatureSettings("shuffle-old", seed=0).describe(lm)


@pytest.mark.parametrize("bad, message", [
    (dict(rendering="sideways"), "unknown history rendering 'sideways'"),
    (dict(layout="html"), "unknown layout 'html'"),
    (dict(max_candidates=1), r"max_candidates=1 must be 0 \(no cap\) or >= 2"),
    (dict(rendering="calibrator"), "rendering 'calibrator' needs a fitted calibrator"),
])
def test_bad_settings_are_refused_in_one_line(bad, message):
    with pytest.raises(ValueError, match=message):
        FeatureSettings(**bad)


def test_a_shuffle_concept_is_fitted_per_seed_and_refused_under_another_seed(tmp_path, walks):
    """Under shuffle-all, seeds 0 and 7 build other contexts: each seed fits its own concept in its
    own folder, and acting with seed 7 refuses the seed-0 concept."""
    lm = FakeLM()
    s0, s7 = FeatureSettings("shuffle-all", seed=0), FeatureSettings("shuffle-all", seed=7)
    f0, f7 = collect_features(lm, walks, s0), collect_features(lm, walks, s7)
    assert any(not np.array_equal(a, b) for a, b in zip(f0["walk"].phi, f7["walk"].phi))  # other text, other phi
    c0, folder0 = cached_concepts(f0, lm, s0, cache_dir=tmp_path)
    c7, folder7 = cached_concepts(f7, lm, s7, cache_dir=tmp_path)
    assert folder0 != folder7 and not np.array_equal(c0["walk"].alpha, c7["walk"].alpha)
    assert c7["walk"].metadata["features"]["seed"] == 7
    check_concept_matches(c7["walk"], lm, s7)
    with pytest.raises(ValueError, match="fitted with seed=0, but acting uses 7"):
        check_concept_matches(c0["walk"], lm, s7)


SETTINGS_ARGS = ["--env", "textworld", "--history", "shuffle-all", "--seed", "7", "--features", "novelty",
                 "--fit-candidates", "2"]


@pytest.mark.parametrize("command", [
    ["run", "--split", "test", "--agent", "cb-agent", "--games", "1", "--max-steps", "2", "--out-dir", "{tmp}/run"],
    ["fit-concepts", "--demos-per-type", "1", "--out-dir", "{tmp}/concepts"],
    ["eval-decisions", "--heldout-split", "train", "--demos-per-type", "1", "--heldout-per-type", "1"],
    ["concepts-tsne", "--pool-per-type", "3", "--sample-size", "2", "--samples", "3", "--out", "{tmp}/t.png"],
    ["concept-data-size", "--sizes", "1,2", "--heldout-split", "test", "--heldout-per-type", "1",
     "--out", "{tmp}/t4.json"],
], ids=lambda c: c[0])
def test_every_feature_command_uses_the_runs_settings(tmp_path, doubles, monkeypatch, command):  # noqa: F811
    """Each command that computes features, given a non-default rendering, seed, feature set and
    candidate cap, computes every feature under exactly those settings."""
    seen = []
    original = agent_shell.concepts.collect_features

    def spy(lm, trajectories, settings, *args, **kwargs):
        seen.append(settings)
        return original(lm, trajectories, settings, *args, **kwargs)

    monkeypatch.setattr(agent_shell.concepts, "collect_features", spy)
    args = [a.replace("{tmp}", str(tmp_path)) for a in command]
    res = CliRunner().invoke(main, args[:1] + SETTINGS_ARGS + args[1:])
    assert res.exit_code == 0, res.output
    assert seen
    for settings in seen:
        assert (settings.rendering, settings.layout, settings.seed, settings.feature_set.names,
                settings.max_candidates) == ("shuffle-all", "text", 7, ("novelty",), 2)
    if command[0] == "fit-concepts":  # what the concept files record
        meta = cb_core.Concept.load(tmp_path / "concepts" / "open.safetensors").metadata
        assert meta["features"]["seed"] == 7 and meta["features"]["rendering"] == "shuffle-all"
        assert [b["name"] for b in meta["features"]["extractors"]] == ["novelty"]
