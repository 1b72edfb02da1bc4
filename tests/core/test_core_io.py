"""Bad inputs, the decision-set file, the concept file, act-time scoring and the CLI."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import jax
import numpy as np
import pytest
from click.testing import CliRunner

import cb_core
from cb_core.decision_file import load_decisions_metadata
from core_helpers import random_decisions, random_lists, save_decisions


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
    (lambda h, q, n, e: e.__setitem__(1, 1.5), "decision 1: expert index 1.5 is not a whole number"),
    (lambda h, q, n, e: h.__setitem__(1, np.full((2, 5), "0.5")), "decision 1: hidden must hold real numbers.*text"),
    (lambda h, q, n, e: h.__setitem__(0, h[0] + 1j), "decision 0: hidden must hold real numbers.*complex"),
    (lambda h, q, n, e: q.__setitem__(2, np.array(["-1"] * 4)), "decision 2: log_q must hold real numbers"),
    (lambda h, q, n, e: n.__setitem__(0, np.array([1.0, 2.5, 1.0])), "decision 0: n_tokens 2.5 is not a whole"),
])
def test_bad_input_raises_naming_the_decision(mutate, match):
    h, q, n, e = _lists()
    mutate(h, q, n, e)
    with pytest.raises(ValueError, match=match):
        cb_core.decisions_from_lists(h, q, n, e)


def test_hand_built_decisions_are_checked_by_fit():
    dec = random_decisions(0, [3, 2], 4)
    bad = cb_core.LabelledDecisions(dec.hidden, dec.log_q, dec.n_tokens, dec.offsets, dec.segment_ids,
                                    np.array([0, 5]))
    with pytest.raises(ValueError, match="decision 1: expert index 5"):
        cb_core.fit(bad)
    with pytest.raises(ValueError, match="lam"):
        cb_core.fit(dec, lam=0)


@pytest.mark.parametrize("module, old, new", [
    ("cb_core", "Decisions", "LabelledDecisions"),
    ("cb_core.decisions", "Decisions", "LabelledDecisions"),
    ("cb_core.decisions", "PaddedDecisions", "PaddedLabelledDecisions"),
])
def test_the_old_names_of_the_labelled_decision_sets_warn_and_are_the_same_class(module, old, new):
    mod = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=f"{module}.{old} is deprecated: use {module}.{new}"):
        cls = getattr(mod, old)
    assert cls is getattr(importlib.import_module("cb_core.decisions"), new)
    with pytest.warns(DeprecationWarning):
        exec(f"from {module} import {old} as imported", scope := {})
    assert scope["imported"] is cls
    assert old not in mod.__all__
    with pytest.raises(AttributeError, match="no attribute 'Decision'"):
        getattr(mod, "Decision")


# ---------------------------------------------------------------- decision-set file
def test_decision_file_round_trip(tmp_path):
    dec = random_decisions(1, [3, 1, 5], 4)
    path = tmp_path / "d.npz"
    save_decisions(path, dec, metadata={"backbone": "tiny", "trajectories": ["g1"]})
    back = cb_core.load_decisions(path)
    for f in ("hidden", "log_q", "n_tokens", "offsets", "segment_ids", "expert"):
        np.testing.assert_array_equal(getattr(back, f), getattr(dec, f))
    assert back.n_decisions == 3 and back.hidden_size == 4
    assert load_decisions_metadata(path)["backbone"] == "tiny"
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


def test_a_text_file_named_npz_is_named_as_such(tmp_path):
    """numpy reads any non-zip file as a pickle and says so; the user hears what the file is."""
    path = tmp_path / "decisions.npz"
    path.write_text("hidden,log_q\n0.1,0.2\n")
    for read in (cb_core.load_decisions, load_decisions_metadata):
        with pytest.raises(ValueError, match="not a decision-set .npz file") as err:
            read(path)
        assert "pickle" not in str(err.value) and str(path) in str(err.value)


@pytest.mark.parametrize("field, value, match", [
    ("offsets", np.array([0, 2, 4]), "offsets\\[-1\\] must equal T = 5"),
    # offsets that end before T also leave expert one entry too long: offsets is the culprit
    ("offsets", np.array([0, 2]), "offsets\\[-1\\] must equal T = 5"),
    ("offsets", np.array([1, 2, 5]), "offsets\\[0\\] must be 0"),
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


@pytest.mark.parametrize("meta", [{"trajectories": "t1"}, {"trajectories": [1, 2]}, {"backbone": 3},
                                  {"features": ["lm-hidden"]}, {"task_type": None}],
                         ids=["trajectories not a list", "trajectories not strings", "backbone", "features",
                              "task_type"])
def test_load_decisions_refuses_the_metadata_cb_agent_fit_refuses(tmp_path, meta):
    """One check: a decision-set file whose metadata a concept cannot take is refused by
    ``load_decisions`` and ``cb-agent fit`` in the same line, naming the field."""
    import json

    from agent_shell.commands.fit import fit as fit_cmd

    dec = random_decisions(2, [2, 3], 3)
    path = tmp_path / "d.npz"
    np.savez(path, hidden=dec.hidden, log_q=dec.log_q, n_tokens=dec.n_tokens, offsets=dec.offsets, expert=dec.expert,
             metadata=np.asarray(json.dumps(meta)))
    field = next(iter(meta))
    with pytest.raises(ValueError, match=rf"d.npz: metadata '{field}' must") as err:
        cb_core.load_decisions(path)
    res = CliRunner().invoke(fit_cmd, [str(path), "--out", str(tmp_path / "c"), "--no-cache"])
    assert res.exit_code == 1 and res.output.strip() == f"Error: {err.value}", res.output
    assert not (tmp_path / "c").exists()


# ---------------------------------------------------------------- concept file
def _meta(d):
    return dict(backbone="tiny-lm", features="App. B", gamma=0.8, lam=1.0, eps=1e-6,
                task_type="pick", trajectories=["a", "b"], versions=cb_core.concept.library_versions(),
                hidden_size=d)


def _concept(alpha, meta):
    return cb_core.Concept(alpha, meta["gamma"], meta["eps"], meta)


def test_concept_round_trip(tmp_path):
    alpha = np.arange(5, dtype=np.float32) / 3
    c = _concept(alpha, _meta(4))
    (tmp_path / "c.safetensors").write_bytes(c.to_bytes())
    back = cb_core.Concept.load(tmp_path / "c.safetensors")
    np.testing.assert_array_equal(back.alpha, alpha)
    assert (back.gamma, back.eps) == (0.8, 1e-6)
    assert back.metadata == json.loads(json.dumps(c.metadata))
    with pytest.raises(ValueError):  # frozen alpha
        back.alpha[0] = 1.0


def test_concept_file_of_the_first_format_still_loads():
    """tests/core/data/concept_format1.safetensors was written by the code before the concept
    carried gamma and eps (``Concept(alpha, metadata).save``): it loads, and acts with its own
    gamma = 0.7 and eps = 1e-5."""
    path = Path(__file__).parent / "data" / "concept_format1.safetensors"
    c = cb_core.Concept.load(path)
    np.testing.assert_array_equal(c.alpha, (np.arange(9, dtype=np.float32) - 4) / 8)
    assert (c.gamma, c.eps, c.hidden_size) == (0.7, 1e-5, 8)
    assert c.metadata["task_type"] == "pick_and_place_simple" and c.metadata["fit"]["n_iter"] == 12
    dec = random_decisions(8, [6], 8)
    np.testing.assert_allclose(c.log_probs(dec.hidden, dec.log_q, dec.n_tokens),
                               cb_core.log_probs(c.alpha, dec, gamma=0.7, eps=1e-5), atol=2e-5)


def test_concept_is_a_pytree():
    c = _concept(np.arange(5, dtype=np.float32), _meta(4))
    leaves, tree = jax.tree_util.tree_flatten(c)
    assert len(leaves) == 3 and float(leaves[1]) == 0.8
    doubled = jax.tree_util.tree_map(lambda x: x * 2, c)
    np.testing.assert_array_equal(doubled.alpha, 2 * c.alpha)
    assert doubled.metadata == c.metadata and doubled.gamma == 1.6
    assert jax.tree_util.tree_structure(_concept(np.ones(5, np.float32), _meta(4))) == tree


def test_saved_files_get_ordinary_permissions_and_no_leftovers(tmp_path):
    """The shell's atomic writes of concept and decision-set files must not leave mkstemp's
    private 0600 mode (shared concepts) or temp files."""
    import os

    from cb_io.storage import atomic_path, write_bytes_atomic

    old = os.umask(0o022)
    try:
        write_bytes_atomic(tmp_path / "c.safetensors", _concept(np.zeros(5, np.float32), _meta(4)).to_bytes())
        with atomic_path(tmp_path / "d.npz", suffix=".npz") as tmp, open(tmp, "wb") as f:
            cb_core.write_decisions(f, random_decisions(1, [3, 2], 4))
    finally:
        os.umask(old)
    for name in ("c.safetensors", "d.npz"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.safetensors", "d.npz"]
    np.testing.assert_array_equal(cb_core.load_decisions(tmp_path / "d.npz").hidden,
                                  random_decisions(1, [3, 2], 4).hidden)


def test_failed_save_leaves_the_old_file(tmp_path):
    from cb_io.storage import atomic_path, write_bytes_atomic

    path = tmp_path / "c.safetensors"
    write_bytes_atomic(path, _concept(np.ones(5, np.float32), _meta(4)).to_bytes())
    with pytest.raises(TypeError):
        cb_core.Concept(np.ones(5, np.float32), 0.8, 1e-6, dict(_meta(4), x=object())).to_bytes()
    with pytest.raises(RuntimeError), atomic_path(path) as tmp:  # a writer that dies half way
        Path(tmp).write_bytes(_concept(np.zeros(5, np.float32), _meta(4)).to_bytes()[:40])
        raise RuntimeError("killed")
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
    if field not in ("gamma", "eps", "hidden_size"):  # those the concept itself supplies
        with pytest.raises(ValueError, match=f"field '{field}' is missing"):
            cb_core.Concept(np.zeros(5, np.float32), 0.8, 1e-6, meta).to_bytes()


@pytest.mark.parametrize("field, value", [("gamma", "x"), ("lam", -1.0), ("trajectories", "a"),
                                          ("hidden_size", 7), ("versions", [])])
def test_concept_malformed_field_is_named(tmp_path, field, value):
    from safetensors.numpy import save_file

    meta = _meta(4)
    meta[field] = value
    save_file({"alpha": np.zeros(5, np.float32)}, str(tmp_path / "c.safetensors"),
              metadata={"format": "cb-agent-concept/1", "metadata": json.dumps(meta)})
    with pytest.raises(ValueError, match=field):
        cb_core.Concept.load(tmp_path / "c.safetensors")


@pytest.mark.parametrize("kwargs, match", [
    (dict(gamma=float("nan")), "gamma"), (dict(gamma=-0.1), "gamma"), (dict(eps=0.0), "eps"),
    (dict(alpha=np.zeros((2, 3), np.float32)), "alpha"), (dict(alpha=np.zeros(4, int)), "alpha"),
    (dict(metadata=dict(gamma=0.5)), "gamma"), (dict(metadata=dict(hidden_size=7)), "hidden_size"),
])
def test_bad_concept_is_named(kwargs, match):
    args = dict(alpha=np.zeros(5, np.float32), gamma=0.8, eps=1e-6, metadata={})
    with pytest.raises(ValueError, match=match):
        cb_core.Concept(**dict(args, **kwargs))


def test_concept_load_rejects_other_files(tmp_path):
    (tmp_path / "junk").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="not a safetensors"):
        cb_core.Concept.load(tmp_path / "junk")
    with pytest.raises(FileNotFoundError):
        cb_core.Concept.load(tmp_path / "missing")


# ---------------------------------------------------------------- act time
def test_concept_log_probs_is_the_batch_law_for_one_decision():
    dec = random_decisions(3, [5, 9, 1, 13], 6)
    alpha = np.random.default_rng(0).standard_normal(7).astype(np.float32)
    concept = cb_core.Concept(alpha, 0.6, 1e-6)
    prior_only = cb_core.Concept.prior_only(6, gamma=0.6)
    lp = np.asarray(cb_core.log_probs(alpha, dec, gamma=0.6))
    prior = np.asarray(cb_core.prior_log_probs(dec, gamma=0.6))
    offs = dec.offsets
    for i in range(dec.n_decisions):
        sl = slice(offs[i], offs[i + 1])
        one = concept.log_probs(dec.hidden[sl], dec.log_q[sl], dec.n_tokens[sl])
        assert one.shape == (offs[i + 1] - offs[i],) and one.dtype == np.float32
        np.testing.assert_allclose(one, lp[sl], atol=2e-5)
        none = prior_only.log_probs(dec.hidden[sl], dec.log_q[sl], dec.n_tokens[sl])
        np.testing.assert_allclose(none, prior[sl], atol=2e-5)
        assert concept.choose(dec.hidden[sl], dec.log_q[sl], dec.n_tokens[sl]) == \
            int(np.argmax(lp[sl]))


def test_act_time_does_not_recompile_within_a_bucket():
    from cb_core import model

    rng = np.random.default_rng(0)
    concept = cb_core.Concept(rng.standard_normal(9).astype(np.float32), 0.8, 1e-6)
    concept.log_probs(rng.standard_normal((17, 8)), -rng.random(17), np.ones(17, int))
    before = model._k_log_probs._cache_size()
    for m in range(17, 21):  # all in bucket 20
        concept.log_probs(rng.standard_normal((m, 8)), -rng.random(m), np.ones(m, int))
    assert model._k_log_probs._cache_size() == before


def test_choose_tie_rule_lowest_index():
    h = np.ones((4, 3), np.float32)  # identical candidates: all features zero
    q = np.array([-2.0, -1.0, -1.0, -1.0], np.float32)
    n = np.ones(4, int)
    assert cb_core.Concept.prior_only(3).choose(h, q, n) == 1
    assert cb_core.Concept(np.ones(4, np.float32), 0.8, 1e-6).choose(h, np.full(4, -1.0), n) == 0


@pytest.mark.parametrize("args, match", [
    ((np.zeros((0, 3)), np.zeros(0), np.ones(0, int)), "empty"),
    ((np.zeros((2, 3)), np.zeros(3), np.ones(2, int)), "log_q"),
    ((np.zeros((2, 3)), np.zeros(2), np.array([1, 0])), "n_tokens < 1 in candidate 1"),
    ((np.zeros((2, 3)), np.array([0, np.nan]), np.ones(2, int)), "log_q in candidate 1"),
    ((np.zeros((2, 4)), np.zeros(2), np.ones(2, int)), "hidden size 4 differs"),
])
def test_act_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        cb_core.Concept.prior_only(3).log_probs(*args)


# ---------------------------------------------------------------- CLI
def test_cli_fit_writes_a_loadable_concept(tmp_path):
    from agent_shell.commands.fit import fit as fit_cmd

    dec = random_decisions(4, [4, 6, 3, 5, 2], 6)
    save_decisions(tmp_path / "d.npz", dec, metadata={"backbone": "tiny-lm",
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
    np.testing.assert_allclose(c.alpha, cb_core.fit(dec).alpha, atol=1e-6)  # the default solver
    assert (c.gamma, c.eps) == (0.8, 1e-6)
    assert summary["method"] == importlib.import_module("cb_core.fit").DEFAULT_SOLVER.name
    parts = summary["timings"]
    assert set(parts) == {"import_s", "load_s", "fit_s", "save_s", "command_s"}
    assert sum(v for k, v in parts.items() if k != "command_s") <= parts["command_s"]


def test_cli_fit_reports_bad_file(tmp_path):
    from agent_shell.commands.fit import fit as fit_cmd

    np.savez(tmp_path / "bad.npz", hidden=np.zeros((3, 2), np.float32))
    res = CliRunner().invoke(fit_cmd, [str(tmp_path / "bad.npz"), "--out", str(tmp_path / "c"),
                                       "--no-cache"])
    assert res.exit_code != 0 and "missing field" in res.output
    (tmp_path / "text.npz").write_text("not an archive\n")
    res = CliRunner().invoke(fit_cmd, [str(tmp_path / "text.npz"), "--out", str(tmp_path / "c"),
                                       "--no-cache"])
    assert res.exit_code == 1 and "not a decision-set .npz file" in res.output
    assert "pickle" not in res.output and "Traceback" not in res.output
    dec = random_decisions(2, [2, 3], 3)
    np.savez(tmp_path / "short.npz", hidden=dec.hidden, log_q=dec.log_q, n_tokens=dec.n_tokens,
             offsets=np.array([0, 2]), expert=dec.expert)  # offsets end at 2 of T = 5 rows
    res = CliRunner().invoke(fit_cmd, [str(tmp_path / "short.npz"), "--out", str(tmp_path / "c"),
                                       "--no-cache"])
    assert res.exit_code == 1 and "offsets[-1] must equal T = 5" in res.output
    assert "expert" not in res.output
    assert not (tmp_path / "c").exists()


def _overflowing_decisions() -> cb_core.LabelledDecisions:
    """Five decisions; one feature of decision 3 is 1e25: finite, but its squared deviation from
    the candidate mean (about 1e50) exceeds float32's largest value (about 3.4e38)."""
    hidden, log_q, n_tokens, expert = random_lists(4, [4, 6, 3, 5, 2], 6)
    hidden[3] = hidden[3].copy()
    hidden[3][1, 2] = 1e25
    return cb_core.decisions_from_lists(hidden, log_q, n_tokens, expert)


@pytest.mark.parametrize("certify", ["auto", "structural"])
def test_a_diverged_float32_fit_names_the_overflowing_decision_and_float64_fits_it(certify):
    dec = _overflowing_decisions()
    with np.errstate(over="ignore"):
        assert not np.isfinite(np.float32(1e25) ** 2) and np.isfinite(np.float64(1e25) ** 2)
    with pytest.raises(ValueError, match=r"decision 3's features overflow float32 .*float64") as err:
        cb_core.fit(dec, certify=certify)
    assert "\n" not in str(err.value) and "nothing is saved" in str(err.value)
    result = cb_core.fit(dec, dtype="float64", certify=certify)
    assert np.isfinite(result.loss) and np.all(np.isfinite(result.alpha)) and result.converged


def test_cli_fit_saves_no_diverged_concept_and_its_json_is_strict(tmp_path):
    from agent_shell.commands.fit import fit as fit_cmd

    save_decisions(tmp_path / "d.npz", _overflowing_decisions())
    out = tmp_path / "c.safetensors"
    for certify in ("auto", "structural"):
        res = CliRunner().invoke(fit_cmd, [str(tmp_path / "d.npz"), "--out", str(out), "--json", "--no-cache",
                                           "--certify", certify])
        assert res.exit_code == 1 and "decision 3's features overflow float32" in res.output, res.output
        assert "Eigenvalues" not in res.output and "Traceback" not in res.output and not out.exists()
    res = CliRunner().invoke(fit_cmd, [str(tmp_path / "d.npz"), "--out", str(out), "--json", "--no-cache",
                                       "--float64"])
    assert res.exit_code == 0, res.output

    def no_constant(name):
        raise AssertionError(f"not JSON: {name}")

    summary = json.loads(res.output.strip().splitlines()[-1], parse_constant=no_constant)
    assert summary["converged"] and np.isfinite(cb_core.Concept.load(out).alpha).all()


@pytest.mark.parametrize("where", ["alpha", "metadata"])
def test_a_concept_file_with_one_flipped_bit_is_refused_as_damaged(tmp_path, where):
    alpha = np.linspace(-1, 1, 7).astype(np.float32)
    meta = dict(backbone="tiny-lm", features="f", task_type="pick", trajectories=["g1"], lam=1.0, versions={})
    data = bytearray(cb_core.Concept(alpha, 0.8, 1e-6, meta).to_bytes())
    if where == "alpha":  # the tensor data ends the file: the last float's high byte
        data[-1] ^= 0x40
        flipped = np.frombuffer(bytes(data[-28:]), np.float32)
        assert abs(flipped[-1]) > 1e18 or not np.isfinite(flipped[-1])  # what a reader would act with
    else:  # a digit of the task type's name in the JSON metadata: still valid JSON
        i = bytes(data).index(b'pick')
        data[i] ^= 0x01  # "pick" -> "qick"
    (tmp_path / "c.safetensors").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="damaged concept file .* refit it") as err:
        cb_core.Concept.load(tmp_path / "c.safetensors")
    assert "\n" not in str(err.value)


def test_a_concept_file_written_before_the_digest_loads_unchecked(tmp_path):
    """A file with only the format and metadata header strings (as written before the digest) is
    read as it is: the same alpha and metadata, no refusal."""
    from safetensors.numpy import save_file

    alpha = np.linspace(-1, 1, 7).astype(np.float32)
    meta = dict(backbone="tiny-lm", features="f", task_type="pick", trajectories=["g1"], lam=1.0, versions={},
                gamma=0.8, eps=1e-6, hidden_size=6)
    save_file({"alpha": alpha}, str(tmp_path / "old.safetensors"),
              metadata={"format": cb_core.concept.FORMAT, "metadata": json.dumps(meta)})
    concept = cb_core.Concept.load(tmp_path / "old.safetensors")
    np.testing.assert_array_equal(concept.alpha, alpha)
    assert concept.metadata["task_type"] == "pick" and (concept.gamma, concept.eps) == (0.8, 1e-6)


def test_one_kernel_gives_the_fit_kernels_log_p_bit_for_bit_and_the_batch_terms():
    """Concept.terms (acting: one kernel for the three terms) gives the log P of the fit's own
    log-probability kernel exactly, so no action changes; cb_core.terms matches the separate
    batch functions (prior, features @ alpha, log P)."""
    from cb_core.decisions import bucket_size, to_padded
    from cb_core.model import _k_log_probs

    rng = np.random.default_rng(11)
    for m in (1, 2, 5, 17, 40):
        hidden = rng.normal(size=(m, 6)).astype(np.float32)
        log_q = -rng.gamma(2.0, 3.0, size=m).astype(np.float32)
        n_tokens = rng.integers(1, 6, size=m).astype(np.int32)
        concept = cb_core.Concept(rng.normal(size=7).astype(np.float32), 0.7, 1e-6)
        one = cb_core.LabelledDecisions(hidden, log_q, n_tokens, np.array([0, m]), np.zeros(m, np.int32),
                                        np.zeros(1, np.int32))
        padded = to_padded(one, dtype=np.float32, n_pad=1, m_pad=bucket_size(m))
        fit_kernel = np.asarray(_k_log_probs(concept.alpha, padded, np.float32(0.7), np.float32(1e-6)))[0, :m]
        terms = concept.terms(hidden, log_q, n_tokens)
        np.testing.assert_array_equal(terms.log_p, fit_kernel)
    dec = random_decisions(3, [4, 1, 6, 3], 5)
    alpha = np.random.default_rng(2).normal(size=6).astype(np.float32)
    batch = cb_core.terms(alpha, dec, 0.8, 1e-6)
    np.testing.assert_allclose(batch.log_p, cb_core.log_probs(alpha, dec, 0.8, 1e-6), rtol=0, atol=1e-6)
    np.testing.assert_allclose(batch.prior, cb_core.prior_log_probs(dec, 0.8), rtol=0, atol=1e-6)
    np.testing.assert_allclose(batch.concept_term, np.asarray(cb_core.features(dec, 1e-6)) @ alpha, atol=1e-5)
