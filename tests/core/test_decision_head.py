"""A concept as the head an LM backend runs (``Concept.decision_head``): one kernel for every concept,
its parameters on the device once, its terms those of ``Concept.terms``, a non-finite score named."""

from __future__ import annotations

import numpy as np
import pytest

import cb_core


def test_one_kernel_serves_every_concept_and_decides_as_the_host_terms():
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    a, b = (cb_core.Concept(rng.normal(size=5).astype(np.float32), 0.8, 1e-6) for _ in range(2))
    head = a.decision_head
    assert head.kernel == b.decision_head.kernel and hash(head.kernel) == hash(b.decision_head.kernel)
    assert repr(head.kernel).startswith("cb_core.DecisionKernel(") and head.width == 4
    assert head.parameters() is head.parameters()  # put once per concept and device
    hidden = rng.normal(size=(3, 4)).astype(np.float32)
    log_q, n_tokens = np.array([-1.0, -2.5, -0.5], np.float32), np.array([1, 3, 2], np.int32)
    padded = np.zeros((8, 4), np.float32)
    padded[:3] = hidden
    out = head.kernel(head.parameters(), jnp.asarray(padded), jnp.asarray(np.r_[log_q, np.zeros(5, np.float32)]),
                      jnp.asarray(np.r_[n_tokens, np.ones(5, np.int32)]), jnp.int32(3))
    want = a.terms(hidden, log_q, n_tokens)
    for got, ref in ((out.log_p, want.log_p), (out.prior, want.prior), (out.concept_term, want.concept_term)):
        np.testing.assert_allclose(np.asarray(got)[:3], ref, atol=1e-5)
    assert int(out.chosen) == int(np.argmax(want.log_p)) and bool(out.finite)


def test_the_heads_host_check_names_the_non_finite_candidate():
    head = cb_core.Concept(np.zeros(3, np.float32), 0.8, 1e-6).decision_head
    hidden = np.array([[0.0, 1.0], [np.nan, 0.0]], np.float32)
    with pytest.raises(ValueError, match="non-finite hidden in candidate 1"):
        head.check(hidden, np.zeros(2, np.float32), np.ones(2, np.int32))
