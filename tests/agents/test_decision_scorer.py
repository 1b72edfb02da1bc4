"""The decision scorer: the terms of log P on one candidate set (checked against numpy), batched
evaluation against a per-decision loop, and many decisions scored as one at a time."""

from __future__ import annotations

import numpy as np
import pytest

import cb_core
from agent_doubles import FakeLM
from agent_shell.concepts import TypeFeatures
from agent_shell.decision_scorer import DecisionScorer, batch_log_probs, decision_accuracy
from agent_shell.features import DecisionInput, FeatureSet
from agent_shell.features import novelty

STEP = type("Step", (), {"kind": "env", "action": "go to desk 1", "observation": "Nothing happens."})()


def decision(candidates=("go to desk 1", "take key 1 from desk 1", "open drawer 2", "go to desk 1")):
    return DecisionInput("You are in a room.\nYour task is to: fetch the key.", "Your task is to: fetch the key.",
                         "You are in a room.", (STEP,), candidates, "\n> ")


def numpy_terms(h, lq, nt, alpha, gamma, eps):
    """Seed Eq. 3 / App. B written out: prior log Qbar, standardised features with the bias M ** -0.5."""
    h, lq = np.asarray(h, np.float64), np.asarray(lq, np.float64)
    bar = lq / np.asarray(nt, np.float64) ** gamma
    prior = bar - np.log(np.sum(np.exp(bar - bar.max()))) - bar.max()
    phi = (h - h.mean(0)) / np.maximum(h.std(0), eps)
    phi = np.concatenate([phi, np.full((len(h), 1), len(h) ** -0.5)], axis=1)
    term = phi @ np.asarray(alpha, np.float64)
    s = prior + term
    return prior, term, s - np.log(np.sum(np.exp(s - s.max()))) - s.max()


def test_scored_decision_terms_are_eq3_with_the_concepts_gamma_and_eps():
    lm = FakeLM(hidden_size=6)
    scored = DecisionScorer(lm).score(DecisionScorer(lm).request(decision()))
    assert scored.phi.dtype == np.float32 and scored.phi.shape == (4, 6)
    np.testing.assert_array_equal(scored.phi, scored.scores.hidden)  # lm-hidden: the LM's own states
    alpha = np.random.default_rng(3).normal(size=7).astype(np.float32)
    concept = cb_core.Concept(alpha, 0.6, 1e-5)
    prior, term, logp = numpy_terms(scored.phi, scored.scores.log_q, scored.scores.n_tokens, alpha, 0.6, 1e-5)
    terms = scored.terms(concept)
    assert all(x.dtype == np.float32 and x.shape == (4,) for x in terms)
    np.testing.assert_allclose(terms.prior, prior, atol=1e-5)
    np.testing.assert_allclose(terms.concept_term, term, atol=1e-4)
    np.testing.assert_allclose(terms.log_p, logp, atol=1e-4)
    assert terms.log_p[0] == terms.log_p[3]  # duplicates: the same numbers
    np.testing.assert_array_equal(scored.log_probs(concept), terms.log_p)
    with pytest.raises(ValueError, match="differ"):
        scored.terms(cb_core.Concept(np.zeros(4, np.float32), 0.8, 1e-6))


def test_one_decision_runs_one_kernel_and_fetches_one_array(monkeypatch, host_fetches):
    """A CB-Agent decision under a concept: one compiled call (cb_core's decision kernel and the
    packing of its record) gives log P, the prior and the concept term, no other cb_core kernel
    or host validation runs, and one array comes back to the host. The action is the argmax of
    that call's log P, and the terms equal cb_core's host kernel (Concept.terms) on the same scores."""
    import dataclasses

    import jax

    import cb_core.concept as concept_module
    import cb_core.decisions as decisions_module
    import cb_core.model as model_module
    from agent_doubles import ScriptedEnv
    from agent_shell.agents import CBAgent, View
    from agent_shell.lm import decision as decision_module
    from envs.episode import Episode

    lm = FakeLM(hidden_size=6)
    alpha = np.random.default_rng(5).normal(size=7).astype(np.float32)
    agent = CBAgent(lm, {"fetch": ["DEMO"], "open": ["DEMO"]},
                    concepts={"fetch": cb_core.Concept(alpha, 0.8, 1e-6), "open": cb_core.Concept(alpha, 0.8, 1e-6)})
    view = dataclasses.replace(View.of(Episode(ScriptedEnv(), "a/1", 5)), route=False)
    agent.next_action(view)  # compiled once, outside the count
    calls = {}

    def counted(module, name, make=lambda original, count: lambda *a, **k: (count(), original(*a, **k))[1]):
        original = getattr(module, name)
        monkeypatch.setattr(module, name, make(original, lambda: calls.__setitem__(name, calls.get(name, 0) + 1)))

    for name in ("_k_terms", "_k_decide", "_check_candidate_set", "to_padded"):
        counted(concept_module, name)
    for name in ("_k_log_probs", "_k_prior", "_k_features", "to_padded"):
        counted(model_module, name)
    counted(decisions_module, "validate_decisions")
    counted(decision_module, "_program",
            lambda original, count: lambda kernel: (lambda *a: (count(), original(kernel)(*a))[1]))
    with host_fetches() as fetched:
        decision = agent.next_action(view)
        jax.effects_barrier()
    assert calls == {"_program": 1}
    assert len(fetched) == 1 and fetched[0] == (3 * 16 + 2,)  # the packed record of M_pad = 16 slots (the least)
    assert decision.kind == "env" and decision.chosen == int(np.argmax(decision.log_probs))
    assert decision.concept_term is not None and len(decision.prior) == len(decision.candidates)
    scores = lm.score(agent.scoring_context(view), decision.candidates, "\n> ")
    want = cb_core.Concept(alpha, 0.8, 1e-6).terms(scores.hidden, scores.log_q, scores.n_tokens)
    for got, ref in zip((decision.log_probs, decision.prior, decision.concept_term), want):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_many_decisions_score_as_one_at_a_time():
    lm = FakeLM(hidden_size=6)
    scorer = DecisionScorer(lm, FeatureSet.from_spec("lm-hidden,novelty"))
    requests = [scorer.request(decision(c)) for c in (("go to desk 1", "look at wall"), ("open door 1", "go to desk 1",
                                                                                        "examine key 1"))]
    many, _ = scorer.score_many(requests)
    for r, m in zip(requests, many):
        one = scorer.score(r)
        assert m.candidates == r.decision.candidates and m.phi.shape == (len(m.candidates), 6 + len(novelty.COLUMNS))
        np.testing.assert_array_equal(m.phi, one.phi)
        np.testing.assert_array_equal(m.scores.log_q, one.scores.log_q)
    # "go to desk 1" was taken once just before: novelty's "taken >= 1" column is 1 for it only, "taken >= 2" 0
    assert novelty.COLUMNS[:2] == ("taken_ge_1", "taken_ge_2")
    assert many[0].phi[:, 6].tolist() == [1.0, 0.0] and many[0].phi[:, 7].tolist() == [0.0, 0.0]


def test_batched_accuracy_counts_the_hits_of_one_decision_at_a_time():
    rng = np.random.default_rng(0)
    tf = TypeFeatures("t")
    for i in range(60):
        m = int(rng.integers(2, 12))
        h = rng.normal(size=(m, 5)).astype(np.float32)
        lq = -rng.uniform(1, 20, m).astype(np.float32)
        if i % 4 == 0:  # an exact tie: the lowest index wins in both
            h[1], lq[1] = h[0], lq[0]
        tf.phi.append(h)
        tf.log_q.append(lq)
        tf.n_tokens.append(rng.integers(1, 6, m).astype(np.int32))
        tf.expert.append(int(rng.integers(0, m)))
    concept = cb_core.Concept(rng.normal(size=6).astype(np.float32), 0.8, 1e-6)
    (row, total) = decision_accuracy({"t": tf}, {"t": concept}, gamma=0.7)
    prior = cb_core.Concept.prior_only(5, 0.7)
    args = list(zip(tf.phi, tf.log_q, tf.n_tokens))
    assert row["hits_prior"] == sum(prior.choose(*a) == e for a, e in zip(args, tf.expert))
    assert row["hits_concept"] == sum(concept.choose(*a) == e for a, e in zip(args, tf.expert))
    assert total["task_type"] == "all" and total["hits_concept"] == row["hits_concept"]
    for lp, a in zip(batch_log_probs(concept, tf.decisions()), args):
        np.testing.assert_allclose(lp, concept.log_probs(*a), atol=1e-5)
    (alone,) = decision_accuracy({"t": tf}, {}, gamma=0.7)[:1]
    assert alone["acc_concept"] is None and alone["hits_prior"] == row["hits_prior"]
