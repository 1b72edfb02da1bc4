"""``candidate_states``: an inner layer's states at the action tokens, as one plain forward gives them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import passes

CONTEXT = "You are in the middle of a room.\nYour task is to: put a clean mug in coffeemachine.\n> go to sinkbasin 1\nOn the sinkbasin 1, you see nothing."
CANDIDATES = ["go to coffeemachine 1", "take mug 2 from countertop 1", "open fridge 1", "examine sinkbasin 1",
              "go to countertop 1"]  # shares "go to c" with the first


#: id of a model -> per candidate, every layer's states at its action tokens (computed once)
_PLAIN_STATES: dict[int, list[tuple[torch.Tensor, ...]]] = {}


@torch.inference_mode()
def reference(lm, layer: int, pool: str) -> np.ndarray:
    """One uncached forward per candidate with output_hidden_states (index 0 = embeddings); the
    forwards run once per model, each call reads the layer and pooling it asks for."""
    if id(lm.model) not in _PLAIN_STATES:
        base = lm.render(CONTEXT, "\n> ")
        _PLAIN_STATES[id(lm.model)] = [
            tuple(h[0, tok.first:] for h in lm.model(input_ids=torch.tensor([tok.ids]), output_hidden_states=True).hidden_states)
            for tok in lm.tokenize_continuations(base, CANDIDATES)]
    out = []
    for layers in _PLAIN_STATES[id(lm.model)]:
        states = layers[layer]
        out.append((states.mean(0) if pool == "mean" else states[-1]).float().numpy())
    return np.stack(out)


@pytest.mark.parametrize("layout, layer, pool", [("tree", 0, "last"), ("tree", 4, "mean"), ("packed", 4, "mean"),
                                                  ("batched", 12, "last"), ("batched", 12, "mean")])
def test_candidate_states_match_a_plain_forward(fresh_any, lm32, layout, layer, pool):
    lm = fresh_any(candidate_layout=layout)
    lm.score(CONTEXT + "\n> look\nNothing happens.", CANDIDATES[:2], "\n> ")  # a stale cache to reuse in part
    got = lm.candidate_states(CONTEXT, CANDIDATES, "\n> ", layer, pool)
    assert got.shape == (len(CANDIDATES), lm.hidden_size) and got.dtype == np.float32
    np.testing.assert_allclose(got, reference(lm32, layer, pool), atol=2e-3, rtol=1e-3)
    # scoring afterwards is unchanged by the capture
    np.testing.assert_allclose(lm.score(CONTEXT, CANDIDATES, "\n> ").log_q,
                               fresh_any().score(CONTEXT, CANDIDATES, "\n> ").log_q, atol=1e-4)


def test_negative_layers_count_from_the_end_and_bad_arguments_are_refused(lm32):
    n = len(lm32.model.get_decoder().layers)
    # the second call reads the context from the KV cache, the first encodes it in the candidates'
    # pass: the same numbers up to float32 rounding
    np.testing.assert_allclose(lm32.candidate_states(CONTEXT, CANDIDATES, "\n> ", -1),
                               lm32.candidate_states(CONTEXT, CANDIDATES, "\n> ", n), atol=2e-3, rtol=1e-3)
    last = lm32.candidate_states(CONTEXT, CANDIDATES, "\n> ", n)
    assert not np.allclose(last, lm32.score(CONTEXT, CANDIDATES, "\n> ").hidden, atol=1e-2)  # before the final norm
    with pytest.raises(ValueError, match=f"layer {n + 1} is outside"):
        lm32.candidate_states(CONTEXT, CANDIDATES, "\n> ", n + 1)
    with pytest.raises(ValueError, match="pool='max'"):
        lm32.candidate_states(CONTEXT, CANDIDATES, "\n> ", 2, "max")


@pytest.mark.parametrize("layout", ["tree", "batched"])
def test_layer_features_come_from_the_scoring_pass(fresh_any, lm32, layout):
    """The decision scorer asks for the lm-layer states in the scoring call: one candidates' pass
    per decision gives log q, the hidden states and every requested layer (each as a plain forward
    gives it), where a separate ``candidate_states`` call would run the pass again."""
    from agent_shell.decision_scorer import DecisionScorer
    from agent_shell.features import DecisionInput, FeatureSet

    lm = fresh_any(candidate_layout=layout)
    scorer = DecisionScorer(lm, FeatureSet.from_spec("lm-hidden,lm-layer:4:mean,lm-layer:0"))
    assert scorer.layers == ((4, "mean"), (0, "last"))
    counted = passes(lm)
    decision = DecisionInput(CONTEXT, "put a clean mug in coffeemachine.", "You are in the middle of a room.", (),
                             tuple(CANDIDATES), "\n> ")
    scored = scorer.score(scorer.request(decision))
    n_passes = len(counted)
    np.testing.assert_allclose(scored.phi[:, lm.hidden_size:2 * lm.hidden_size], reference(lm32, 4, "mean"),
                               atol=2e-3, rtol=1e-3)
    np.testing.assert_allclose(scored.phi[:, 2 * lm.hidden_size:], reference(lm32, 0, "last"), atol=2e-3, rtol=1e-3)
    np.testing.assert_array_equal(scored.phi[:, :lm.hidden_size], scored.scores.hidden)
    plain = fresh_any(candidate_layout=layout)
    counted_plain = passes(plain)
    plain.score(CONTEXT, CANDIDATES, "\n> ")
    assert n_passes == len(counted_plain)  # the layers cost no forward pass beyond the scores'
    np.testing.assert_allclose(scored.scores.log_q, plain.score(CONTEXT, CANDIDATES, "\n> ").log_q, atol=1e-4)
