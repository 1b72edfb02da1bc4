"""``--lam auto``: each task type's strength chosen by cross-validation over its trajectories, checked
against one cb_core.fit per held-out trajectory and strength; its curve in the concept's provenance,
its rule and grid in the cache key; refused in one line where it cannot apply."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

import cb_core
from agent_doubles import FakeLM, ScriptedEnv
from agent_shell.cli import main
from agent_shell.concepts import collect_features, concepts_dir_key, fit_concepts, strength_key
from agent_shell.demos import expert_demos
from agent_shell.feature_settings import FeatureSettings
from cb_core.strength import DEFAULT_GRID
from test_reporting_cli_run import doubles  # noqa: F401  (CLI with FakeLM and ScriptedEnv)

WALK = {"c/1": ("walk", [f"go to room {i}" for i in range(1, 8)]),
        "c/2": ("walk", [f"go to room {i}" for i in range(7, 0, -1)]),
        "c/3": ("walk", [f"go to room {i}" for i in (2, 4, 6, 1, 3, 5, 7)])}


@pytest.fixture()
def walks(tmp_path):
    return expert_demos(ScriptedEnv(WALK, expert_looks=True), per_type=3, split="train", path=tmp_path / "e.jsonl",
                        max_steps=30)


def _lists(tf, keep):
    return [[part[i] for i in keep] for part in (tf.phi, tf.log_q, tf.n_tokens, tf.expert)]


def test_each_type_is_fitted_at_the_strength_its_held_out_trajectories_choose(walks):
    lm = FakeLM()
    features = collect_features(lm, walks, FeatureSettings())
    tf = features["walk"]
    # each decision labelled with its own trajectory: the trajectories' decisions counted alone
    alone = [collect_features(FakeLM(), [w], FeatureSettings())["walk"].n_decisions for w in walks]
    assert tf.decision_task_ids == [w.task_id for w, n in zip(walks, alone) for _ in range(n)]

    concept = fit_concepts(features, lm, FeatureSettings(), lam="auto")["walk"]
    curve = concept.metadata["strength"]
    assert curve["rule"] == "default-se" and curve["criterion"] == "top-1" and curve["default"] == 1.0
    assert curve["lams"] == list(DEFAULT_GRID) and curve["n_folds"] == 3 and curve["z"] == 2.0

    # three trajectories, three folds: each held out once, fitted on the other two at every strength
    ids = np.array(tf.decision_task_ids)
    held_top1 = np.zeros((len(DEFAULT_GRID), tf.n_decisions))
    for w in walks:
        train, test = np.flatnonzero(ids != w.task_id), np.flatnonzero(ids == w.task_id)
        test_dec = cb_core.decisions_from_lists(*_lists(tf, test))
        starts = np.asarray(test_dec.offsets)[:-1]
        rows = starts + np.asarray(test_dec.expert)
        for l, lam in enumerate(DEFAULT_GRID):
            alpha = cb_core.fit(cb_core.decisions_from_lists(*_lists(tf, train)), lam=lam).alpha
            log_p = np.asarray(cb_core.log_probs(alpha, test_dec))
            held_top1[l, test] = [float(log_p[r] >= log_p[a:b].max() - 1e-6)
                                  for r, a, b in zip(rows, starts, np.asarray(test_dec.offsets)[1:])]
    np.testing.assert_allclose(curve["mean"], held_top1.mean(axis=1), atol=1e-9)
    # lam = 1 unless a strength beats it on top-1 by two paired standard errors over the 3 folds
    fold_means = np.array([held_top1[:, ids == w.task_id].mean(axis=1) for w in walks])  # [3, L]
    d = DEFAULT_GRID.index(1.0)
    paired = fold_means - fold_means[:, [d]]
    means = held_top1.mean(axis=1)
    better = [l for l in range(len(DEFAULT_GRID))
              if means[l] - means[d] > 2 * paired[:, l].std(ddof=1) / np.sqrt(3) + 1e-12]
    assert curve["flat"] == (not better)
    assert curve["chosen"] == (DEFAULT_GRID[max(better, key=lambda l: means[l])] if better else 1.0)

    # the concept itself: every decision at the chosen strength
    assert concept.metadata["lam"] == curve["chosen"]
    direct = cb_core.fit(tf.decisions(), lam=curve["chosen"])
    np.testing.assert_allclose(concept.alpha, direct.alpha, atol=1e-4)


def test_a_type_with_one_trajectory_is_refused_in_one_line(walks):
    lm = FakeLM()
    features = collect_features(lm, walks[:1], FeatureSettings())
    with pytest.raises(ValueError, match=r"task type 'walk' has 1 won trajectory; cross-validation needs 2") as err:
        fit_concepts(features, lm, FeatureSettings(), lam="auto")
    assert "\n" not in str(err.value)


def test_the_rule_and_grid_name_the_concepts_cache_folder(walks):
    lm = FakeLM()
    features = collect_features(lm, walks, FeatureSettings())
    keys = {concepts_dir_key(features, lm, FeatureSettings(), lam, 0.8, 1e-6) for lam in ("auto", 1.0, 0.5)}
    assert len(keys) == 3
    assert strength_key("auto") == {"lam": "auto", "rule": "default-se", "criterion": "top-1", "default": 1.0, "z": 2.0,
                                    "guard": "log-lik", "ties": "nearest the default", "grid": list(DEFAULT_GRID),
                                    "folds": 5}
    assert strength_key(0.5) == 0.5


@pytest.mark.parametrize("value, message", [("nope", "neither a number > 0 nor 'auto'"), ("0", "must be > 0"),
                                            ("-1", "must be > 0"), ("nan", "must be > 0")])
def test_a_strength_that_is_no_number_nor_auto_is_one_line(value, message):
    result = CliRunner().invoke(main, ["fit-concepts", "--lam", value])
    assert result.exit_code == 2 and message in result.output


@pytest.mark.parametrize("command", [["concepts-tsne"], ["concept-data-size"]])
def test_commands_of_one_fixed_strength_refuse_auto_before_loading(doubles, command):  # noqa: F811
    result = CliRunner().invoke(main, [*command, "--env", "alfworld", "--lam", "auto"])
    assert result.exit_code == 2, result.output
    assert "--lam auto chooses a concept's strength" in result.output and "needs a number" in result.output


def test_one_demonstration_per_type_is_refused_before_anything_loads(doubles):  # noqa: F811
    result = CliRunner().invoke(main, ["fit-concepts", "--env", "alfworld", "--lam", "auto", "--demos-per-type", "1"])
    assert result.exit_code != 0 and "--lam auto holds trajectories out" in result.output
    assert "needs 2" in result.output and "Traceback" not in result.output
