"""Property tests of the concept model's maths (features, prior, law, objective, derivatives)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cb_core
from cb_core import model
from cb_core.decisions import to_padded
from cb_core.testing import check_gradient, check_hessian_bounds, hessian_upper_bound
from core_helpers import as_float64, random_decisions, random_lists, ragged, reference_model

SETTINGS = settings(max_examples=10, deadline=None)


def _segment_lse(x, dec):
    offs = np.asarray(dec.offsets)
    return np.array([np.logaddexp.reduce(x[a:b]) for a, b in zip(offs[:-1], offs[1:])])


@SETTINGS
@given(ragged(), st.floats(0.1, 3.0))
def test_gradient_matches_finite_differences_float64(case, lam):
    seed, sizes, d = case
    with jax.enable_x64(True):
        dec = as_float64(random_decisions(seed, sizes, d))
        rng = np.random.default_rng(seed + 1)
        alpha = rng.standard_normal(d + 1)
        f = lambda a: float(cb_core.objective(a, dec, lam=lam))  # noqa: E731
        check_gradient(f, cb_core.gradient(alpha, dec, lam=lam), alpha, step=1e-6, rtol=1e-6, atol=1e-7)


@SETTINGS
@given(ragged(), st.floats(0.1, 3.0))
def test_explicit_hessian_matches_autodiff_and_is_strongly_convex(case, lam):
    seed, sizes, d = case
    with jax.enable_x64(True):
        dec = as_float64(random_decisions(seed, sizes, d))
        alpha = np.random.default_rng(seed + 2).standard_normal(d + 1)
        h = np.asarray(cb_core.hessian(alpha, dec, lam=lam))
        ref = np.asarray(jax.hessian(cb_core.objective)(jnp.asarray(alpha), dec, lam))
        np.testing.assert_allclose(h, ref, rtol=1e-9, atol=1e-11)
        np.testing.assert_allclose(h, h.T, atol=1e-12)
        # lam I <= H <= (lam + B) I, B from the materialised features (independent of alpha)
        check_hessian_bounds(h, lam, hessian_upper_bound(cb_core.features(dec), dec.offsets, lam))
        # the bias coordinate is constant within every set: its row is exactly lam e_m
        np.testing.assert_allclose(h[-1], lam * np.eye(d + 1)[-1], atol=1e-12)
        # the Hessian-vector product the Newton solver uses applies the same matrix
        v = np.random.default_rng(seed + 3).standard_normal(d + 1)
        p = model.prepare(to_padded(dec), 0.8, 1e-6)
        np.testing.assert_allclose(np.asarray(model.hvp(jnp.asarray(alpha), jnp.asarray(v), p, lam)),
                                   h @ v, rtol=1e-9, atol=1e-11)


@SETTINGS
@given(ragged())
def test_zero_alpha_gives_the_normalised_prior(case):
    seed, sizes, d = case
    dec = random_decisions(seed, sizes, d)
    logp = np.asarray(cb_core.log_probs(np.zeros(d + 1, np.float32), dec))
    prior = np.asarray(cb_core.prior_log_probs(dec))
    np.testing.assert_allclose(logp, prior, atol=1e-5)
    np.testing.assert_allclose(_segment_lse(prior, dec), 0.0, atol=1e-5)
    lq = np.asarray(dec.log_q, np.float64) / np.asarray(dec.n_tokens, np.float64) ** 0.8
    seg = np.asarray(dec.segment_ids)
    np.testing.assert_allclose(prior, lq - _segment_lse(lq, dec)[seg], atol=1e-5)


@SETTINGS
@given(ragged(), st.floats(-20.0, 20.0))
def test_normalising_the_prior_does_not_change_p(case, shift):
    seed, sizes, d = case
    hidden, log_q, n_tokens, expert = random_lists(seed, sizes, d)
    rng = np.random.default_rng(seed + 3)
    alpha = rng.standard_normal(d + 1).astype(np.float32)
    # shift every decision's length-normalised prior by its own constant
    shifted = [lq + (shift + i) * nt ** 0.8 for i, (lq, nt) in enumerate(zip(log_q, n_tokens))]
    a = cb_core.decisions_from_lists(hidden, log_q, n_tokens, expert)
    b = cb_core.decisions_from_lists(hidden, shifted, n_tokens, expert)
    np.testing.assert_allclose(cb_core.log_probs(alpha, a), cb_core.log_probs(alpha, b), atol=2e-4)
    np.testing.assert_allclose(cb_core.prior_log_probs(a), cb_core.prior_log_probs(b), atol=2e-4)


@SETTINGS
@given(ragged())
def test_features_standardised_per_decision(case):
    seed, sizes, d = case
    with jax.enable_x64(True):
        dec = as_float64(random_decisions(seed, sizes, d))
        phi = np.asarray(cb_core.features(dec))
    offs = np.asarray(dec.offsets)
    h = np.asarray(dec.hidden)
    for a, b in zip(offs[:-1], offs[1:]):
        ref = (h[a:b] - h[a:b].mean(0)) / np.maximum(h[a:b].std(0), 1e-6)
        np.testing.assert_allclose(phi[a:b, :d], ref, atol=1e-9)
        np.testing.assert_allclose(phi[a:b, d], (b - a) ** -0.5)


@SETTINGS
@given(ragged(), st.floats(0.1, 3.0), st.floats(0.0, 1.5), st.sampled_from([np.float32, np.float64]))
def test_model_matches_an_independent_numpy_reference(case, lam, gamma, dtype):
    """log P, Eq. 6 and its gradient at a random alpha != 0 against plain numpy written from the
    seed's equations (core_helpers.reference_model), in float64 and float32."""
    seed, sizes, d = case
    hidden, log_q, n_tokens, expert = random_lists(seed, sizes, d)
    as32 = lambda xs: [np.asarray(x, np.float32).astype(np.float64) for x in xs]  # noqa: E731
    lists = (as32(hidden), as32(log_q), n_tokens, expert)  # the values LabelledDecisions will hold
    alpha = np.random.default_rng(seed + 6).standard_normal(d + 1)
    ref_log_p, ref_objective, ref_gradient = reference_model(*lists, lam=lam, gamma=gamma)
    tight = dtype == np.float64
    with jax.enable_x64(tight):
        dec = cb_core.decisions_from_lists(*lists)
        if tight:
            dec = as_float64(dec)
        a = alpha.astype(dtype)
        atol = 1e-10 if tight else 5e-5
        lp = np.asarray(cb_core.log_probs(a, dec, gamma=gamma))
        np.testing.assert_allclose(lp, np.concatenate(ref_log_p(alpha)), atol=atol * 10)
        np.testing.assert_allclose(float(cb_core.objective(a, dec, lam=lam, gamma=gamma)),
                                   ref_objective(alpha), rtol=atol, atol=atol)
        np.testing.assert_allclose(np.asarray(cb_core.gradient(a, dec, lam=lam, gamma=gamma)),
                                   ref_gradient(alpha), atol=atol * 10)


@SETTINGS
@given(ragged(), st.integers(0, 9), st.integers(0, 9))
def test_extra_padding_changes_nothing(case, extra_n, extra_m):
    """The kernels on a more generously padded layout (inside a user's jit) give the same law,
    objective and gradient: padded slots and decisions carry no weight."""
    seed, sizes, d = case
    dec = random_decisions(seed, sizes, d)
    alpha = np.random.default_rng(seed).standard_normal(d + 1).astype(np.float32)
    tight = to_padded(dec, n_pad=len(sizes), m_pad=max(sizes))
    loose = to_padded(dec, n_pad=len(sizes) + extra_n, m_pad=max(sizes) + extra_m)

    @jax.jit
    def law(a, padded):
        p = model.prepare(padded, 0.8, 1e-6)
        return model.problem_log_probs(a, p), model.value_and_grad(a, p, 0.7)

    (lp_t, (v_t, g_t)), (lp_l, (v_l, g_l)) = law(alpha, tight), law(alpha, loose)
    np.testing.assert_allclose(tight.unpad(lp_t), loose.unpad(lp_l), atol=2e-5)
    np.testing.assert_allclose(tight.unpad(lp_t), cb_core.log_probs(alpha, dec), atol=2e-5)
    assert np.all(np.isneginf(np.asarray(lp_l)[~loose.mask]))
    np.testing.assert_allclose(v_t, v_l, rtol=2e-5)
    np.testing.assert_allclose(g_t, g_l, rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(v_t, cb_core.objective(alpha, dec, lam=0.7), rtol=2e-5)


@SETTINGS
@given(ragged(), st.randoms(use_true_random=False))
def test_permuting_candidates_permutes_p(case, rnd):
    seed, sizes, d = case
    hidden, log_q, n_tokens, expert = random_lists(seed, sizes, d)
    perms = [np.array(rnd.sample(range(m), m)) for m in sizes]
    inv = [np.argsort(p) for p in perms]
    hp = [h[p] for h, p in zip(hidden, perms)]
    qp = [q[p] for q, p in zip(log_q, perms)]
    npm = [n[p] for n, p in zip(n_tokens, perms)]
    ep = [int(iv[e]) for iv, e in zip(inv, expert)]
    a = cb_core.decisions_from_lists(hidden, log_q, n_tokens, expert)
    b = cb_core.decisions_from_lists(hp, qp, npm, ep)
    alpha = np.random.default_rng(seed).standard_normal(d + 1).astype(np.float32)
    la, lb = np.asarray(cb_core.log_probs(alpha, a)), np.asarray(cb_core.log_probs(alpha, b))
    offs = np.asarray(a.offsets)
    for i, p in enumerate(perms):
        np.testing.assert_allclose(lb[offs[i]:offs[i + 1]], la[offs[i]:offs[i + 1]][p], atol=2e-5)
    np.testing.assert_allclose(cb_core.objective(alpha, a), cb_core.objective(alpha, b), rtol=1e-5)


@SETTINGS
@given(ragged(), st.integers(1, 4))
def test_single_candidate_decisions_add_zero_loss(case, n_single):
    seed, sizes, d = case
    hidden, log_q, n_tokens, expert = random_lists(seed, sizes, d)
    rng = np.random.default_rng(seed + 4)
    alpha = rng.standard_normal(d + 1).astype(np.float32)
    a = cb_core.decisions_from_lists(hidden, log_q, n_tokens, expert)
    extra = random_lists(seed + 5, [1] * n_single, d)
    b = cb_core.decisions_from_lists(hidden + extra[0], log_q + extra[1], n_tokens + extra[2],
                                     expert + extra[3])
    reg = 0.5 * float(np.dot(alpha, alpha))
    nll_a = (float(cb_core.objective(alpha, a)) - reg) * a.n_decisions
    nll_b = (float(cb_core.objective(alpha, b)) - reg) * b.n_decisions
    np.testing.assert_allclose(nll_b, nll_a, rtol=1e-5, atol=1e-5)
    lp = np.asarray(cb_core.log_probs(alpha, b))[a.n_rows:]
    np.testing.assert_allclose(lp, 0.0, atol=1e-6)
