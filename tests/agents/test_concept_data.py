"""Concepts refitted on subsets of cached expert features: the t-SNE figure and the data-size table."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import orjson
import pytest
from click.testing import CliRunner

import agent_shell.lm
import envs
from agent_doubles import FakeLM, ScriptedEnv
from agent_shell.cli import main
from agent_shell.concepts import TypeFeatures
from agent_shell.studies.concept_data import embed_concepts, merge_features, sample_subsets, silhouette

#: three tasks of each of two types (the scripted expert wins them all)
TASKS = {f"{kind}/{i}": (kind, [f"go to {place} {i}", f"{verb} {thing} {i} from {place} {i}"])
         for kind, place, verb, thing in (("fetch", "desk", "take", "key"), ("open", "box", "take", "coin"))
         for i in range(1, 4)}


def test_sample_subsets_are_distinct_sized_seeded_and_complete_when_few():
    subsets = sample_subsets(20, 5, 15, seed=3)
    assert len(subsets) == 15 and len(set(subsets)) == 15
    assert all(len(s) == 5 and len(set(s)) == 5 and list(s) == sorted(s) and 0 <= min(s) and max(s) < 20
               for s in subsets)
    assert subsets == sample_subsets(20, 5, 15, seed=3) and subsets != sample_subsets(20, 5, 15, seed=4)
    everything = sample_subsets(4, 2, 50)
    assert len(everything) == math.comb(4, 2) == len(set(everything))
    for bad in ((3, 4, 1), (3, 0, 1), (3, 2, 0)):
        with pytest.raises(ValueError):
            sample_subsets(*bad)


def _part(task_type, task_id, n, skipped=()):
    tf = TypeFeatures(task_type, task_ids=[task_id], n_env_steps=n + len(skipped), skipped_actions=Counter(skipped))
    for i in range(n):
        tf.phi.append(np.full((3, 2), i, np.float32))
        tf.log_q.append(np.zeros(3, np.float32))
        tf.n_tokens.append(np.ones(3, np.int32))
        tf.expert.append(i % 3)
    return tf


def test_merge_features_concatenates_in_order_and_refuses_mixed_types():
    merged = merge_features([_part("fetch", "a", 2, ["look"]), _part("fetch", "b", 3)])
    assert merged.task_ids == ["a", "b"] and merged.n_decisions == 5 and merged.expert == [0, 1, 0, 1, 2]
    assert merged.n_env_steps == 6 and merged.skipped_actions == Counter(look=1)
    assert merged.decisions().offsets.tolist() == [0, 3, 6, 9, 12, 15]
    with pytest.raises(ValueError, match="several task types"):
        merge_features([_part("fetch", "a", 1), _part("open", "b", 1)])
    with pytest.raises(ValueError, match="at least one"):
        merge_features([])


def test_separated_concepts_have_a_high_silhouette_and_embed_in_2d():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(6, 9)) * 0.05 + np.eye(9)[0]
    b = rng.normal(size=(6, 9)) * 0.05 + np.eye(9)[1]
    labels = ["a"] * 6 + ["b"] * 6
    assert silhouette(np.vstack([a, b]), labels) > 0.8
    mixed = rng.normal(size=(12, 9))
    assert silhouette(mixed, labels) < 0.3
    assert silhouette(a, ["a"] * 6) is None
    points = embed_concepts(np.vstack([a, b]), seed=0)
    assert points.shape == (12, 2) and np.isfinite(points).all()
    with pytest.raises(ValueError, match="at least 3"):
        embed_concepts(a[:2])


@pytest.fixture()
def doubles(monkeypatch, tmp_path):
    monkeypatch.setenv("CB_AGENT_CACHE", str(tmp_path / "cache"))
    lms = []

    def load(name=None, dtype="bfloat16", **_):
        lms.append(FakeLM())
        return lms[-1]

    monkeypatch.setattr(envs, "make_env", lambda name, **kw: ScriptedEnv(TASKS, expert_looks=True))
    monkeypatch.setattr(agent_shell.lm, "load_language_model", load)
    return lms


def test_concepts_tsne_fits_one_concept_per_sample_and_reuses_cached_features(tmp_path, doubles):
    out = tmp_path / "fig" / "tsne.png"
    args = ["concepts-tsne", "--env", "textworld", "--pool-per-type", "3", "--sample-size", "2", "--samples", "3",
            "--out", str(out)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    record = orjson.loads(out.with_suffix(".json").read_bytes())
    points = record["points"]
    assert Counter(p["task_type"] for p in points) == {"fetch": 3, "open": 3}
    for p in points:  # each concept was fitted on two distinct trajectories of its own type
        assert len(set(p["task_ids"])) == 2 and all(t.startswith(p["task_type"][0]) for t in p["task_ids"])
        assert p["n_decisions"] == 4 and p["converged"]
    assert len({tuple(p["task_ids"]) for p in points}) == 6 and record["pool_per_type"] == {"fetch": 3, "open": 3}
    assert doubles[0].score_calls  # features computed once ...
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 0, again.output
    assert not doubles[1].score_calls  # ... then read from the cache
    assert orjson.loads(out.with_suffix(".json").read_bytes())["points"] == points  # seeded


def test_concepts_tsne_leaves_out_types_with_too_few_trajectories(tmp_path, doubles):
    res = CliRunner().invoke(main, ["concepts-tsne", "--env", "textworld", "--pool-per-type", "3", "--sample-size",
                                    "4", "--out", str(tmp_path / "t.png")])
    assert res.exit_code == 1 and "fetch: left out (3 won trajectories < sample size 4)" in res.output
    assert "needs at least 3" in res.output


def test_concept_data_size_evaluates_every_size_on_the_same_heldout_decisions(tmp_path, doubles):
    out = tmp_path / "t4.json"
    res = CliRunner().invoke(main, ["concept-data-size", "--env", "textworld", "--sizes", "1,2,5",
                                    "--heldout-split", "test", "--heldout-per-type", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    table = orjson.loads(out.read_bytes())
    assert [s["k"] for s in table["sizes"]] == [1, 2, 5]
    assert [s["used"] for s in table["sizes"]] == [{"fetch": 1, "open": 1}, {"fetch": 2, "open": 2},
                                                   {"fetch": 3, "open": 3}]  # a pool of 3: capped
    totals = [s["rows"][-1] for s in table["sizes"]]
    assert {t["decisions"] for t in totals} == {4} == {table["heldout_decisions"]}
    assert len({t["acc_prior"] for t in totals}) == 1  # alpha = 0 does not depend on k
    md = out.with_suffix(".md").read_text()
    assert md.count("(n=3)") == 2 and md.splitlines()[0].startswith("| k | fetch | open |")
    bad = CliRunner().invoke(main, ["concept-data-size", "--sizes", "5,2"])
    assert bad.exit_code == 2 and "increasing" in bad.output


def test_task_type_and_cached_only_restrict_the_pool_without_lm_time(tmp_path, doubles):
    out = tmp_path / "t4.json"
    base = ["concept-data-size", "--env", "textworld", "--sizes", "1,2", "--heldout-split", "test",
            "--heldout-per-type", "1", "--out", str(out)]
    cold = CliRunner().invoke(main, base + ["--cached-only"])  # nothing cached yet: nothing to use
    assert cold.exit_code == 1 and "fetch: 2 trajectories without cached features left out" in cold.output
    assert "no held-out decisions" in cold.output
    assert not doubles[-1].score_calls
    res = CliRunner().invoke(main, base + ["--task-type", "open"])
    assert res.exit_code == 0, res.output
    assert {r["task_type"] for s in orjson.loads(out.read_bytes())["sizes"] for r in s["rows"]} == {"open", "all"}
    cached = CliRunner().invoke(main, base + ["--cached-only"])  # "open" is cached now, "fetch" is not
    assert cached.exit_code == 0, cached.output
    assert "fetch: 2 trajectories without cached features left out" in cached.output  # the pool of 2
    assert not doubles[-1].score_calls
    assert [s["used"] for s in orjson.loads(out.read_bytes())["sizes"]] == [{"open": 1}, {"open": 2}]
    bad = CliRunner().invoke(main, base + ["--task-type", "cook"])
    assert bad.exit_code == 1 and "unknown task type(s) cook" in bad.output and "fetch, open" in bad.output
