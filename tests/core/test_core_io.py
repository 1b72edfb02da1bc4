"""Bad inputs, the decision-set file, the concept file, act-time scoring and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

import cb_core
from core_helpers import random_decisions, random_lists


# ---------------------------------------------------------------- bad input names the culprit
def _lists():
    return [list(x) for x in random_lists(0, [3, 2, 4], 5)]


@pytest.mark.parametrize("mutate, match", [
    (lambda h, q, n, e: h.__setitem__(1, np.zeros((0, 5))), "decision 1.*empty"),
    (lambda h, q, n, e: e.__setitem__(2, 4), "decision 2: expert index 4"),
    (lambda h, q, n, e: e.__setitem__(0, -1), "decision 0: expert index -1"),
    (lambda h, q, n, e: h[1].__setitem__((0, 3), np.nan), "decision 1: non-finite hidden"),
    (lambda h, q, n, e: q[2].__setitem__(1, -np.inf), "decision 2: non-finite log_q"),
    (lambda h, q, n, e: n[1].__setitem__(1, 0), "decision 1: n_tokens 0 < 1"),
    (lambda h, q, n, e: h.__setitem__(2, np.zeros((4, 6))), "decision 2: hidden size 6"),
    (lambda h, q, n, e: q.__setitem__(0, np.zeros(2)), "decision 0: log_q"),
    (lambda h, q, n, e: e.pop(), "expert has 2 entries"),
])
def test_bad_input_raises_naming_the_decision(mutate, match):
    h, q, n, e = _lists()
    mutate(h, q, n, e)
    with pytest.raises(ValueError, match=match):
        cb_core.decisions_from_lists(h, q, n, e)


def test_hand_built_decisions_are_checked_by_fit():
    dec = random_decisions(0, [3, 2], 4)
    bad = cb_core.Decisions(dec.hidden, dec.log_q, dec.n_tokens, dec.offsets, dec.segment_ids,
                            np.array([0, 5]))
    with pytest.raises(ValueError, match="decision 1: expert index 5"):
        cb_core.fit(bad)
    with pytest.raises(ValueError, match="lam"):
        cb_core.fit(dec, lam=0)


# ---------------------------------------------------------------- decision-set file
def test_decision_file_round_trip(tmp_path):
    dec = random_decisions(1, [3, 1, 5], 4)
    path = tmp_path / "d.npz"
    cb_core.save_decisions(path, dec, metadata={"backbone": "tiny", "trajectories": ["g1"]})
    back = cb_core.load_decisions(path)
    for f in ("hidden", "log_q", "n_tokens", "offsets", "segment_ids", "expert"):
        np.testing.assert_array_equal(getattr(back, f), getattr(dec, f))
    assert back.n_decisions == 3 and back.hidden_size == 4
    assert cb_core.load_decisions_metadata(path)["backbone"] == "tiny"
    with np.load(path) as z:
        assert z["hidden"].dtype == np.float32 and z["offsets"].dtype == np.int64


@pytest.mark.parametrize("drop", ["hidden", "log_q", "n_tokens", "offsets", "expert"])
def test_decision_file_missing_field(tmp_path, drop):
    dec = random_decisions(2, [2, 3], 3)
    arrays = dict(hidden=dec.hidden, log_q=dec.log_q, n_tokens=dec.n_tokens, offsets=dec.offsets,
                  expert=dec.expert)
    arrays.pop(drop)
    np.savez(tmp_path / "x.npz", **arrays)
    with pytest.raises(ValueError, match=f"missing field.*{drop}"):
        cb_core.load_decisions(tmp_path / "x.npz")


@pytest.mark.parametrize("field, value, match", [
    ("offsets", np.array([0, 2, 4]), "offsets\\[-1\\] must equal T = 5"),
    ("offsets", np.array([0, 2, 2, 5]), "expert must be \\[N\\]"),
    ("hidden", np.zeros(5), "hidden must be \\[T, d\\]"),
    ("log_q", np.zeros(4), "log_q must be \\[T\\]"),
    ("expert", np.array([0, 3]), "decision 1: expert index 3"),
    ("hidden", np.zeros((5, 3), np.int64), "hidden must be float"),
])
def test_decision_file_malformed_field(tmp_path, field, value, match):
    dec = random_decisions(2, [2, 3], 3)
    arrays = dict(hidden=dec.hidden, log_q=dec.log_q, n_tokens=dec.n_tokens, offsets=dec.offsets,
                  expert=dec.expert)
    arrays[field] = value
    np.savez(tmp_path / "x.npz", **arrays)
    with pytest.raises(ValueError, match=match):
        cb_core.load_decisions(tmp_path / "x.npz")


# ---------------------------------------------------------------- concept file
def _meta(d):
    return dict(backbone="tiny-lm", features="App. B", gamma=0.8, lam=1.0, eps=1e-6,
                task_type="pick", trajectories=["a", "b"], versions=cb_core.library_versions(),
                hidden_size=d)


def test_concept_round_trip(tmp_path):
    alpha = np.arange(5, dtype=np.float32) / 3
    c = cb_core.Concept(alpha, _meta(4))
    c.save(tmp_path / "c.safetensors")
    back = cb_core.Concept.load(tmp_path / "c.safetensors")
    np.testing.assert_array_equal(back.alpha, alpha)
    assert back.metadata == json.loads(json.dumps(c.metadata))
    with pytest.raises(ValueError):  # frozen alpha
        back.alpha[0] = 1.0


def test_saved_files_get_ordinary_permissions_and_no_leftovers(tmp_path):
    """Atomic saves must not leave mkstemp's private 0600 mode (shared concepts) or temp files."""
    import os
    old = os.umask(0o022)
    try:
        cb_core.Concept(np.zeros(5, np.float32), _meta(4)).save(tmp_path / "c.safetensors")
        cb_core.save_decisions(tmp_path / "d.npz", random_decisions(1, [3, 2], 4))
    finally:
        os.umask(old)
    for name in ("c.safetensors", "d.npz"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.safetensors", "d.npz"]


def test_failed_save_leaves_the_old_file(tmp_path):
    path = tmp_path / "c.safetensors"
    cb_core.Concept(np.ones(5, np.float32), _meta(4)).save(path)
    with pytest.raises(Exception):
        cb_core.Concept(np.ones(5, np.float32), {"not": object()}).save(path)  # metadata not JSON
    np.testing.assert_array_equal(cb_core.Concept.load(path).alpha, np.ones(5, np.float32))
    assert [p.name for p in tmp_path.iterdir()] == ["c.safetensors"]


@pytest.mark.parametrize("field", ["backbone", "features", "gamma", "lam", "eps", "task_type",
                                   "trajectories", "versions", "hidden_size"])
def test_concept_missing_field_is_named(tmp_path, field):
    from safetensors.numpy import save_file

    meta = _meta(4)
    meta.pop(field)
    save_file({"alpha": np.zeros(5, np.float32)}, str(tmp_path / "c.safetensors"),
              metadata={"format": "cb-agent-concept/1", "metadata": json.dumps(meta)})
    with pytest.raises(ValueError, match=f"field '{field}' is missing"):
        cb_core.Concept.load(tmp_path / "c.safetensors")
    with pytest.raises(ValueError, match=f"field '{field}' is missing"):
        cb_core.Concept(np.zeros(5, np.float32), meta)


@pytest.mark.parametrize("field, value", [("gamma", "x"), ("lam", -1.0), ("trajectories", "a"),
                                          ("hidden_size", 7), ("versions", [])])
def test_concept_malformed_field_is_named(field, value):
    meta = _meta(4)
    meta[field] = value
    with pytest.raises(ValueError, match=field):
        cb_core.Concept(np.zeros(5, np.float32), meta)


def test_concept_load_rejects_other_files(tmp_path):
    (tmp_path / "junk").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="not a safetensors"):
        cb_core.Concept.load(tmp_path / "junk")
    with pytest.raises(FileNotFoundError):
        cb_core.Concept.load(tmp_path / "missing")


# ---------------------------------------------------------------- act time
def test_candidate_log_probs_matches_the_batch_law():
    dec = random_decisions(3, [5, 9, 1, 13], 6)
    alpha = np.random.default_rng(0).standard_normal(7).astype(np.float32)
    lp = np.asarray(cb_core.log_probs(alpha, dec))
    prior = np.asarray(cb_core.prior_log_probs(dec))
    offs = dec.offsets
    for i in range(dec.n_decisions):
        sl = slice(offs[i], offs[i + 1])
        one = cb_core.candidate_log_probs(dec.hidden[sl], dec.log_q[sl], dec.n_tokens[sl], alpha)
        assert one.shape == (offs[i + 1] - offs[i],)
        np.testing.assert_allclose(one, lp[sl], atol=2e-5)
        none = cb_core.candidate_log_probs(dec.hidden[sl], dec.log_q[sl], dec.n_tokens[sl], None)
        np.testing.assert_allclose(none, prior[sl], atol=2e-5)
        assert cb_core.choose(dec.hidden[sl], dec.log_q[sl], dec.n_tokens[sl], alpha) == \
            int(np.argmax(lp[sl]))


def test_act_time_does_not_recompile_within_a_bucket():
    from cb_core import act

    rng = np.random.default_rng(0)
    alpha = rng.standard_normal(9).astype(np.float32)
    cb_core.candidate_log_probs(rng.standard_normal((17, 8)), -rng.random(17), np.ones(17, int),
                                alpha)
    before = act._kernel._cache_size()
    for m in range(17, 21):  # all in bucket 20
        cb_core.candidate_log_probs(rng.standard_normal((m, 8)), -rng.random(m),
                                    np.ones(m, int), alpha)
    assert act._kernel._cache_size() == before


def test_choose_tie_rule_lowest_index():
    h = np.ones((4, 3), np.float32)  # identical candidates: all features zero
    q = np.array([-2.0, -1.0, -1.0, -1.0], np.float32)
    n = np.ones(4, int)
    assert cb_core.choose(h, q, n, None) == 1
    assert cb_core.choose(h, np.full(4, -1.0), n, np.ones(4, np.float32)) == 0


@pytest.mark.parametrize("args, match", [
    ((np.zeros((0, 3)), np.zeros(0), np.ones(0, int), None), "empty"),
    ((np.zeros((2, 3)), np.zeros(3), np.ones(2, int), None), "log_q"),
    ((np.zeros((2, 3)), np.zeros(2), np.array([1, 0]), None), "n_tokens < 1 in candidate 1"),
    ((np.zeros((2, 3)), np.array([0, np.nan]), np.ones(2, int), None), "log_q in candidate 1"),
    ((np.zeros((2, 3)), np.zeros(2), np.ones(2, int), np.zeros(3)), "alpha must be"),
])
def test_act_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        cb_core.candidate_log_probs(*args)


# ---------------------------------------------------------------- CLI
def test_cli_fit_writes_a_loadable_concept(tmp_path):
    from agent_shell.commands.fit import fit as fit_cmd

    dec = random_decisions(4, [4, 6, 3, 5, 2], 6)
    cb_core.save_decisions(tmp_path / "d.npz", dec, metadata={"backbone": "tiny-lm",
                                                               "task_type": "pick",
                                                               "trajectories": ["g1", "g2"]})
    out = tmp_path / "c.safetensors"
    # --no-cache: the persistent cache is process-global JAX config (tested in a subprocess below)
    res = CliRunner().invoke(fit_cmd, [str(tmp_path / "d.npz"), "--out", str(out), "--json",
                                       "--no-cache"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output.strip().splitlines()[-1])
    assert summary["converged"] and summary["n_decisions"] == 5
    c = cb_core.Concept.load(out)
    assert c.metadata["backbone"] == "tiny-lm" and c.metadata["trajectories"] == ["g1", "g2"]
    assert c.metadata["lam"] == 1.0 and c.metadata["task_type"] == "pick"
    np.testing.assert_allclose(c.alpha, cb_core.fit(dec).alpha, atol=1e-6)


def test_cli_process_uses_the_persistent_cache(tmp_path):
    import os
    import subprocess
    import sys

    dec = random_decisions(5, [4, 6, 3], 5)
    cb_core.save_decisions(tmp_path / "d.npz", dec)
    env = dict(os.environ, CB_AGENT_CACHE=str(tmp_path / "cache"))
    cmd = [sys.executable, "-m", "agent_shell.cli", "fit", str(tmp_path / "d.npz"), "--out",
           str(tmp_path / "c.safetensors")]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "converged=True" in res.stdout
    assert len(list((tmp_path / "cache" / "jax").iterdir())) >= 1
    assert cb_core.Concept.load(tmp_path / "c.safetensors").hidden_size == 5


def test_cli_fit_reports_bad_file(tmp_path):
    from agent_shell.commands.fit import fit as fit_cmd

    np.savez(tmp_path / "bad.npz", hidden=np.zeros((3, 2), np.float32))
    res = CliRunner().invoke(fit_cmd, [str(tmp_path / "bad.npz"), "--out", str(tmp_path / "c")])
    assert res.exit_code != 0 and "missing field" in res.output
