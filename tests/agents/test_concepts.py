"""Concept fitting from expert trajectories: filtering, counting, caching, metadata."""

import re

import numpy as np
import pytest

import cb_core
from agent_doubles import FakeLM, HangingEnv, ScriptedEnv
from agent_shell.concepts import (cached_concepts, check_concept_matches, collect_features, decision_texts,
                                  skipped_summary)
from agent_shell.context import scoring_context
from agent_shell.feature_settings import FeatureSettings
from agent_shell.demos import expert_demos, rendered_demos


@pytest.fixture()
def trajectories(tmp_path):
    env = ScriptedEnv(expert_looks=True)
    return expert_demos(env, per_type=2, split="train", path=tmp_path / "expert.jsonl")


def test_expert_demos_collect_won_trajectories_per_type_once(tmp_path, trajectories):
    assert [t.task_id for t in trajectories] == ["a/1", "a/2", "b/1", "b/2"]
    played = []
    again = expert_demos(ScriptedEnv(expert_looks=True), 2, "train", path=tmp_path / "expert.jsonl",
                         on_task=played.append)
    assert played == [] and [t.task_id for t in again] == ["a/1", "a/2", "b/1", "b/2"]
    demos = rendered_demos(trajectories)
    assert sorted(demos) == ["fetch", "open"] and demos["fetch"][0].startswith("You are in a small room.\n")


def test_an_expert_episode_past_its_time_limit_is_not_collected_and_the_next_task_is_tried(tmp_path):
    """a/1's expert episode hangs at its second engine step: at the limit it is not collected, one
    warning names it, and the next tasks of its type (a/2, a/3) give the demonstrations."""
    path = tmp_path / "expert.jsonl"
    with pytest.warns(UserWarning) as caught:
        got = expert_demos(HangingEnv(hang_on=("a/1",), expert_looks=True), 2, "train", path=path, time_limit=1.0)
    assert [t.task_id for t in got] == ["a/2", "a/3", "b/1", "b/2"]
    assert [str(w.message) for w in caught] == [
        "expert trajectory a/1 not collected (episode ran past its wall-clock limit of 1 s); the next task of its "
        "type is tried"]
    clean = expert_demos(ScriptedEnv(expert_looks=True), 2, "train", path=tmp_path / "clean.jsonl",
                         task_types={"open"})
    assert [t.to_record() for t in got[2:]] == [t.to_record() for t in clean]


def test_a_demonstration_another_process_collects_meanwhile_is_used_not_replaced(tmp_path, monkeypatch):
    """Two runs collect into one expert file: a/2 is appended by the other one after this one read the
    file, so the collection here skips it as stored; it is still a/2 that serves as the
    demonstration (read back from the file), not the next game of its type."""
    import agent_shell.demos as demos_module
    import envs.collect as collect_module
    from cb_io.storage import append_jsonl

    path = tmp_path / "expert.jsonl"
    other = {t.task_id: t for t in expert_demos(ScriptedEnv(expert_looks=True), 2, "train",
                                                path=tmp_path / "other.jsonl")}
    collect = collect_module.collect_expert_trajectories

    def racing(env, task_ids, out_path, **kwargs):
        if list(task_ids) == ["a/2"]:  # the other run stores a/2 first
            append_jsonl(out_path, other["a/2"])
        return collect(env, task_ids, out_path, **kwargs)

    monkeypatch.setattr(collect_module, "collect_expert_trajectories", racing)
    got = demos_module.expert_demos(ScriptedEnv(expert_looks=True), 2, "train", path=path)
    assert [t.task_id for t in got] == ["a/1", "a/2", "b/1", "b/2"]


def test_look_steps_are_no_target_but_stay_in_the_history(trajectories):
    traj = trajectories[0]  # look, go to desk 1, look, take key 1 from desk 1
    texts, skipped = decision_texts(traj, FeatureSettings())
    assert skipped == {"look": 2}
    assert [t[1][t[2]] for t in texts] == ["go to desk 1", "take key 1 from desk 1"]
    assert texts[1][0] == scoring_context(traj.instruction, traj.observation, traj.steps[:3])
    assert "> look\n" in texts[1][0]
    assert all("look" not in cands and "inventory" not in cands for _, cands, _ in texts)


def test_features_are_cached_so_a_refit_costs_no_lm_time(tmp_path, trajectories):
    lm = FakeLM()
    first = collect_features(lm, trajectories, FeatureSettings(), cache_dir=tmp_path / "cache")
    n_calls = len(lm.score_calls)
    assert n_calls == 4 + 6  # fetch: 2 + 2 decisions, open: 3 + 3
    second = collect_features(lm, trajectories, FeatureSettings(), cache_dir=tmp_path / "cache")
    assert len(lm.score_calls) == n_calls and second["open"].lm_seconds == 0.0
    for t in first:
        for a, b in zip(first[t].phi, second[t].phi):
            np.testing.assert_array_equal(a, b)
        assert first[t].expert == second[t].expert
    other = FakeLM(name="other-lm")
    collect_features(other, trajectories, FeatureSettings(), cache_dir=tmp_path / "cache")
    assert len(other.score_calls) == n_calls  # another backbone never reads these features


def test_only_won_trajectories_are_fitted_and_lost_ones_counted(trajectories):
    lost = trajectories[0].__class__(**{**trajectories[0].__dict__, "task_id": "a/9", "won": False})
    feats = collect_features(FakeLM(), trajectories + [lost], FeatureSettings())
    assert feats["fetch"].task_ids == ["a/1", "a/2"] and feats["fetch"].n_lost == 1
    assert feats["fetch"].n_skipped == 4 and feats["fetch"].n_env_steps == 8
    assert skipped_summary(feats) == "10 of 20 expert steps (50.0%) were no fitting target (look x10)"


def test_one_concept_per_type_with_metadata_and_a_cache(tmp_path, trajectories):
    lm = FakeLM()
    feats = collect_features(lm, trajectories, FeatureSettings())
    concepts, folder = cached_concepts(feats, lm, FeatureSettings(), lam=0.5, gamma=0.8, env_name="scripted",
                                       cache_dir=tmp_path)
    assert sorted(concepts) == ["fetch", "open"] and sorted(p.name for p in folder.iterdir()) == [
        "fetch.safetensors", "open.safetensors"]
    meta = concepts["open"].metadata
    assert meta["rendering"] == "raw" and meta["features"]["rendering"] == "raw"
    assert meta["backbone"] == "fake-lm" and meta["lam"] == 0.5 and meta["trajectories"] == ["b/1", "b/2"]
    assert meta["n_decisions"] == 6 and meta["skipped_actions"] == {"look": 6}
    assert meta["fit"]["converged"]
    # the concept lowers the Eq. 6 objective below alpha = 0 on its data
    dec = feats["open"].decisions()
    alpha = concepts["open"].alpha
    assert cb_core.objective(alpha, dec, lam=0.5) < cb_core.objective(np.zeros_like(alpha), dec, lam=0.5) - 1e-3
    again, folder2 = cached_concepts(feats, lm, FeatureSettings(), lam=0.5, gamma=0.8, cache_dir=tmp_path)
    assert folder2 == folder and np.array_equal(again["open"].alpha, concepts["open"].alpha)
    check_concept_matches(concepts["open"], lm, FeatureSettings())
    with pytest.raises(ValueError, match="backbone"):
        check_concept_matches(concepts["open"], FakeLM(name="other"), FeatureSettings())


def test_capped_candidate_sets_are_fitted_and_cached_apart(tmp_path, trajectories):
    lm = FakeLM()
    whole = collect_features(lm, trajectories, FeatureSettings(), cache_dir=tmp_path)
    capped = collect_features(lm, trajectories, FeatureSettings(max_candidates=2), cache_dir=tmp_path)
    assert max(len(h) for h in whole["open"].phi) > 2  # the cap bites
    assert all(len(h) <= 2 for tf in capped.values() for h in tf.phi)
    assert capped["open"].max_candidates == 2 and whole["open"].max_candidates == 0
    # the expert's action is always kept: its features (FakeLM's are a function of the context and
    # the candidate's text) are the uncapped set's expert row, decision by decision
    for task_type, tf in capped.items():
        full = whole[task_type]
        assert len(tf.phi) == len(full.phi)
        for h, e, h_full, e_full in zip(tf.phi, tf.expert, full.phi, full.expert):
            np.testing.assert_array_equal(h[e], h_full[e_full])
    # and by text: the capped candidate set holds the action the expert took at that step
    for traj in trajectories:
        texts, _ = decision_texts(traj, FeatureSettings(max_candidates=2))
        taken = [s.action for s in traj.steps if s.kind == "env" and s.action != "look"]
        assert [cands[e] for _, cands, e in texts] == taken and all(len(c) <= 2 for _, c, _ in texts)
    _, folder_whole = cached_concepts(whole, lm, FeatureSettings(), cache_dir=tmp_path)
    _, folder_capped = cached_concepts(capped, lm, FeatureSettings(max_candidates=2), cache_dir=tmp_path)
    assert folder_whole != folder_capped  # a capped fit never reads the uncapped concepts


def test_a_concept_fitted_in_another_dtype_is_refused(trajectories):
    fitted_with, acting_with = FakeLM(), FakeLM()
    fitted_with.dtype, acting_with.dtype = "bfloat16", "float32"
    concept = cached_concepts(collect_features(fitted_with, trajectories, FeatureSettings()), fitted_with,
                              FeatureSettings())[0]["open"]
    assert concept.metadata["features"]["dtype"] == "bfloat16"
    check_concept_matches(concept, fitted_with, FeatureSettings())
    with pytest.raises(ValueError, match="concept for 'open' was fitted with dtype='bfloat16', but acting uses 'float32'"):
        check_concept_matches(concept, acting_with, FeatureSettings())


@pytest.mark.parametrize("field, fitted", [("formatting", "chat"), ("action_prefix", "\nAction: "),
                                           ("dtype", "float16")])
def test_a_concept_from_another_feature_construction_is_refused(trajectories, field, fitted):
    """A concept file whose features were built another way (another formatting of the text, another
    action prefix, another dtype: e.g. written by another version or tool) is refused by name."""
    lm = FakeLM()
    lm.dtype = "float32"
    concept = cached_concepts(collect_features(lm, trajectories, FeatureSettings()), lm, FeatureSettings())[0]["fetch"]
    acting = concept.metadata["features"][field]
    assert acting != fitted
    meta = {**concept.metadata, "features": {**concept.metadata["features"], field: fitted}}
    other = cb_core.Concept(concept.alpha, concept.gamma, concept.eps, meta)
    with pytest.raises(ValueError, match=re.escape(f"fitted with {field}={fitted!r}, but acting uses {acting!r}")):
        check_concept_matches(other, lm, FeatureSettings())


def test_a_damaged_cached_concept_is_refitted_with_a_warning_not_trusted(tmp_path, trajectories):
    lm = FakeLM()
    feats = collect_features(lm, trajectories, FeatureSettings())
    concepts, folder = cached_concepts(feats, lm, FeatureSettings(), cache_dir=tmp_path)
    path = folder / "open.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x40  # one bit of alpha's last entry
    path.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match="damaged and are refitted"):
        again, folder2 = cached_concepts(feats, lm, FeatureSettings(), cache_dir=tmp_path)
    assert folder2 == folder
    np.testing.assert_array_equal(again["open"].alpha, concepts["open"].alpha)
    np.testing.assert_array_equal(cb_core.Concept.load(path).alpha, concepts["open"].alpha)  # the entry replaced


def test_the_out_dir_copy_of_the_concepts_killed_part_way_leaves_no_torn_concept(tmp_path):
    """``fit-concepts --out-dir`` copies the cached concepts one atomic file at a time: a process
    killed while writing the second leaves the first whole and no file under the second's name,
    and the next copy completes and removes what the killed one left."""
    import os
    import subprocess
    import sys

    from agent_shell.concepts import copy_concepts
    from cb_io.paths import REPO_ROOT

    cache, out = tmp_path / "cache", tmp_path / "out"
    cache.mkdir()
    for name in ("a", "b"):
        (cache / f"{name}.safetensors").write_bytes(os.urandom(100_000))
    script = f"""
import os, signal
import cb_io.storage as storage
real = os.replace
def replace(src, dst):
    if str(dst).endswith("b.safetensors"):  # the second file's bytes are written, not yet in place
        os.kill(os.getpid(), signal.SIGKILL)
    real(src, dst)
storage.os.replace = replace
from agent_shell.concepts import copy_concepts
copy_concepts({str(cache)!r}, {str(out)!r})
"""
    res = subprocess.run([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, timeout=120)
    assert res.returncode == -9
    names = sorted(p.name for p in out.iterdir())
    assert names[0] == "a.safetensors" and len(names) == 2 and names[1].startswith("b.safetensors.tmp-"), names
    assert (out / "a.safetensors").read_bytes() == (cache / "a.safetensors").read_bytes()
    assert copy_concepts(cache, out) == [out / "a.safetensors", out / "b.safetensors"]
    assert sorted(p.name for p in out.iterdir()) == ["a.safetensors", "b.safetensors"]
    assert all((out / n).read_bytes() == (cache / n).read_bytes() for n in ("a.safetensors", "b.safetensors"))
