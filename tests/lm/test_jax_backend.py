"""What only the JAX backend has: the architectures it refuses in one line, a Qwen3 decoder
against transformers' own, bfloat16 against its measured noise, and the decision taken on the
device (the scores never fetched before the argmax). Everything the two backends share is tested
on both from the same tests (``fresh_any``, ``backend`` in ``conftest.py``)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from agent_shell.context import action_prefix
from conftest import tiny_folder
from test_lm_scoring import ALFWORLD_CANDIDATES, PREFIX, _naive_score, make_context


@pytest.mark.parametrize("change, named", [
    ({"model_type": "mistral"}, "is a 'mistral' model; the JAX backend supports"),
    ({"hidden_act": "gelu"}, "activation 'gelu' is not implemented"),
    ({"use_sliding_window": True, "sliding_window": 64, "max_window_layers": 0}, "sliding-window attention"),
])
def test_an_architecture_the_decoder_does_not_implement_is_refused_in_one_line(tmp_path, change, named):
    from agent_shell.lm import load_language_model
    from agent_shell.lm.factory import check_model_source
    from agent_shell.lm.jax_model import UnsupportedModel

    folder = tmp_path / "model"
    folder.mkdir()
    config = {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100, "hidden_act": "silu",
              "rms_norm_eps": 1e-6, "max_position_embeddings": 512, **change}
    (folder / "config.json").write_text(json.dumps(config))
    for call in (lambda: check_model_source(f"jax:{folder}"), lambda: load_language_model(f"jax:{folder}")):
        with pytest.raises(UnsupportedModel, match=named) as err:
            call()
        assert "\n" not in str(err.value)


def test_both_backends_record_the_same_backbone_so_a_concept_fitted_with_one_acts_with_the_other(lm32, jax32):
    import cb_core
    from agent_shell.concepts import check_concept_matches, concept_feature_spec
    from agent_shell.feature_settings import FeatureSettings

    assert jax32.metadata == lm32.metadata
    settings = FeatureSettings()
    concept = cb_core.Concept.prior_only(lm32.hidden_size, metadata={
        "backbone": lm32.name, "features": concept_feature_spec(lm32, settings)})
    check_concept_matches(concept, jax32, settings)  # no error: the JAX backend acts with it


def test_a_qwen3_decoder_scores_as_transformers_does(tmp_path):
    """Per-head q/k norms and a head size apart from hidden / heads: the JAX backend against one
    full transformers forward per candidate, float32, every layout."""
    from agent_shell.lm import load_language_model
    from agent_shell.lm.jax_backend import JaxLanguageModel

    folder = tiny_folder(tmp_path / "qwen3", "qwen3")
    reference = load_language_model(str(folder), dtype="float32", device="cpu")
    jax_lm = load_language_model(f"jax:{folder}", dtype="float32", device="cpu")
    assert jax_lm.config.qk_norm and jax_lm.config.head_dim == 24
    context = make_context(3)
    refs = [_naive_score(reference, context, a, PREFIX) for a in ALFWORLD_CANDIDATES]
    for layout in ("tree", "packed", "batched"):
        got = JaxLanguageModel(jax_lm.decoder, jax_lm.tokenizer, name="q3", candidate_layout=layout).score(
            context, ALFWORLD_CANDIDATES, PREFIX)
        for m, (log_q, n_tok, hidden) in enumerate(refs):
            assert got.n_tokens[m] == n_tok and abs(got.log_q[m] - log_q) < 1e-4, (layout, m)
            assert np.abs(got.hidden[m] - hidden).max() / np.abs(hidden).max() < 1e-4, (layout, m)


@pytest.mark.slow  # the real backbone in bfloat16: minutes where the CPU emulates bfloat16 (no avx512_bf16)
def test_bfloat16_scores_are_within_the_measured_noise_and_rank_alike(lm32):
    """The JAX backend in bfloat16 against the float32 naive forward, on three contexts, one per
    candidate layout: within twice the noise of PyTorch in bfloat16 (the largest gap to float32 of
    transformers' own bfloat16 forward and of the PyTorch backend in the same layout, measured here
    on the same candidates), and ranked alike wherever two candidates lie further apart than that
    noise."""
    from agent_shell.lm import load_language_model
    from agent_shell.lm.hf import HFLanguageModel
    from agent_shell.lm.jax_backend import JaxLanguageModel

    bf16 = load_language_model(None, dtype="bfloat16", device="cpu")
    jax16 = load_language_model("jax:", dtype="bfloat16", device="cpu")
    refs, torch16, got = [], [], []
    for n_steps, layout in ((0, "tree"), (5, "batched"), (3, "packed")):  # every layout's program in bfloat16
        context = make_context(n_steps)
        refs.append([_naive_score(lm32, context, a, PREFIX)[0] for a in ALFWORLD_CANDIDATES])
        torch16.append([_naive_score(bf16, context, a, PREFIX)[0] for a in ALFWORLD_CANDIDATES])
        torch16.append(list(HFLanguageModel(bf16.model, bf16.tokenizer, name=bf16.name, candidate_layout=layout)
                            .score(context, ALFWORLD_CANDIDATES, PREFIX).log_q))  # and in the same layout
        view = JaxLanguageModel(jax16.decoder, jax16.tokenizer, name=jax16.name, candidate_layout=layout)
        got.append(view.score(context, ALFWORLD_CANDIDATES, PREFIX).log_q)
    sampled = dict(max_new_tokens=6, temperature=0.8, n=3, seed=4)  # rows reading one prompt cache, in bfloat16
    assert jax16.generate(make_context(2), **sampled) == jax16.fork().generate(make_context(2), **sampled)
    refs, torch16, got = np.array(refs), np.array(torch16), np.array(got, np.float64)
    noise = np.abs(torch16 - np.repeat(refs, 2, axis=0)).max()
    assert 0.01 < noise < 1.0, noise  # bfloat16's own rounding, not a broken model
    assert np.abs(got - refs).max() <= 2 * noise, (np.abs(got - refs).max(), noise)
    for ref, mine in zip(refs, got):
        apart = np.abs(ref[:, None] - ref[None, :]) > 2 * noise
        assert np.array_equal((ref[:, None] > ref[None, :])[apart], (mine[:, None] > mine[None, :])[apart])
        assert np.argmax(mine) == np.argmax(ref)


def random_concept(d: int, seed: int):
    import cb_core

    return cb_core.Concept(np.random.default_rng(seed).normal(0, 0.3, d + 1).astype(np.float32), 0.8, 1e-6, {})


def test_a_decision_on_the_device_equals_the_hosts_and_fetches_nothing_before_the_argmax(jax32, host_fetches):
    """score_on_device + Concept.decide against score + Concept.terms (the host path, float64
    sums), on contexts with and without a cached prefix; between the LM pass and the argmax not
    one array reaches the host."""
    import jax

    lm = jax32.fork()
    for k, n_steps in enumerate((0, 2, 3, 6)):
        context = make_context(n_steps)
        concept = random_concept(lm.hidden_size, k)
        host = lm.fork().score(context, ALFWORLD_CANDIDATES, PREFIX)
        with host_fetches() as seen:
            scores = lm.score_on_device(context, ALFWORLD_CANDIDATES, PREFIX)
            out = concept.decide(scores.hidden, scores.log_q, scores.n_tokens, scores.count)
            jax.block_until_ready(out)
        assert seen == [], seen
        chosen, finite, terms = jax.device_get((out.chosen, out.finite, out.terms))
        fetched = scores.fetched()  # the same scores on the host, through the host's kernel
        expected = concept.terms(fetched.hidden, fetched.log_q, fetched.n_tokens)
        m = len(ALFWORLD_CANDIDATES)
        assert finite and scores.count == m and int(chosen) == int(np.argmax(expected.log_p))
        for got, want in zip(terms, expected):  # float32 rounding of a 577-term dot product
            np.testing.assert_allclose(np.asarray(got)[:m], want, rtol=2e-5, atol=2e-5)
        assert np.all(np.isneginf(np.asarray(terms.log_p)[m:]))  # padded slots are never chosen
        # the device's scores against score()'s on a fresh stream (float64 sums; no cached prefix)
        np.testing.assert_allclose(fetched.log_q, host.log_q, atol=1e-4)
        assert np.abs(fetched.hidden - host.hidden).max() / np.abs(host.hidden).max() < 1e-4


def test_cb_agent_decides_on_the_jax_device_and_acts_as_on_the_host(jax32, monkeypatch):
    """CB-Agent over the JAX backend takes its decisions on the device: the host path
    (Concept.terms) is never called, and each decision equals the host path's (the same agent
    with the device path switched off)."""
    import cb_core
    from agent_shell.agents import AgentConfig, CBAgent
    from agent_shell.features import DecisionInput

    concepts = {"pick": random_concept(jax32.hidden_size, 7)}
    device_agent = CBAgent(jax32.fork(), {"pick": []}, concepts=concepts, config=AgentConfig())
    host_agent = CBAgent(jax32.fork(), {"pick": []}, concepts=concepts, config=AgentConfig())
    host_agent.decision_scorer.reads_hidden_only = False  # the host path: scores fetched, then the kernel
    for n_steps in (1, 4):
        decision = DecisionInput(make_context(n_steps), "put a mug in the shelf.", "You are in a room.", (),
                                 tuple(ALFWORLD_CANDIDATES), action_prefix("text"))
        want = host_agent.decide("pick", host_agent.decision_scorer.request(decision))
        with monkeypatch.context() as patch:
            patch.setattr(cb_core.Concept, "terms", lambda *a, **k: pytest.fail("the host path ran"))
            got = device_agent.decide("pick", device_agent.decision_scorer.request(decision))
        assert got.chosen == want.chosen
        for name in ("log_p", "prior", "concept_term"):
            np.testing.assert_allclose(getattr(got, name), getattr(want, name), rtol=2e-5, atol=2e-5)


def test_the_jax_backend_takes_the_devices_jax_sees_and_refuses_others_in_one_line():
    """``--device`` names what ``jax.devices()`` offers with ``--model jax:`` (tpu and gpu too), not
    what torch offers; a device JAX does not see here is refused before anything loads."""
    import jax
    from click.testing import CliRunner

    from agent_shell.cli import main
    from agent_shell.lm.dtypes import dtype_name
    from agent_shell.configure import resolve
    from agent_shell.run_config import RunConfig

    config = resolve(RunConfig(model="jax:", device="auto", dtype="auto"))
    assert config.device == "cpu" == jax.devices()[0].platform and config.dtype == dtype_name("auto", "cpu")
    missing = "tpu" if not any(d.platform == "tpu" for d in jax.devices()) else "gpu:7"
    with pytest.raises(ValueError, match=f"device='{missing}': JAX sees"):
        resolve(RunConfig(model="jax:", device=missing))
    res = CliRunner().invoke(main, ["run", "--env", "alfworld", "--model", "jax:", "--device", missing])
    errors = [line for line in res.output.splitlines() if line.startswith("Error:")]
    assert res.exit_code == 2 and len(errors) == 1 and "JAX sees" in errors[0], res.output
