"""Many concepts in one program: cb_core.fit_many against single fits, padding, early stops,
certificates and fold weights (property tests with the public kit, cb_core.testing).

Shapes are held in one bucket (at most 6 decisions of at most 6 candidates: N_pad = M_pad = 8,
d = 4) so the examples share a few compiled programs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cb_core
from cb_core.testing import decision_sets, decision_weights, random_decisions, random_lists
from core_helpers import as_float64, reference_model

D = 4
SETTINGS = settings(max_examples=5, deadline=None)
SETS = decision_sets(max_n=6, max_m=6, min_d=D, max_d=D)
LAMS = st.lists(st.sampled_from([0.05, 0.3, 1.0, 4.0]), min_size=3, max_size=3)


def subset(dec: cb_core.LabelledDecisions, keep) -> cb_core.LabelledDecisions:
    """The decisions whose index is in ``keep``, as a new validated set."""
    offsets = np.asarray(dec.offsets)
    rows = [slice(offsets[i], offsets[i + 1]) for i in keep]
    pick = lambda x: [np.asarray(x)[r] for r in rows]  # noqa: E731
    return cb_core.decisions_from_lists(pick(dec.hidden), pick(dec.log_q), pick(dec.n_tokens),
                                        [int(np.asarray(dec.expert)[i]) for i in keep])


def reference_objective(dec: cb_core.LabelledDecisions, lam: float, weights=None):
    """Eq. 6 with decision weights in float64 numpy (core_helpers.reference_model, per decision)."""
    offsets = np.asarray(dec.offsets)
    split = lambda x: np.split(np.asarray(x, np.float64), offsets[1:-1])  # noqa: E731
    log_p, _, _ = reference_model(split(dec.hidden), split(dec.log_q), split(dec.n_tokens),
                                  np.asarray(dec.expert), lam=lam)
    w = np.ones(dec.n_decisions) if weights is None else np.asarray(weights, np.float64)

    def f(alpha):
        nll = np.array([-lp[e] for lp, e in zip(log_p(alpha), np.asarray(dec.expert))])
        return float(w @ nll / w.sum() + 0.5 * lam * np.dot(alpha, alpha))

    return f


def close_within_certificates(a: cb_core.FitResult, b: cb_core.FitResult, slack: float = 1e-6) -> None:
    """Both alphas lie within their distance bounds of the one optimum: ||a - b|| <= both bounds."""
    gap = float(np.linalg.norm(np.asarray(a.alpha, np.float64) - np.asarray(b.alpha, np.float64)))
    assert gap <= a.certificate.distance_bound + b.certificate.distance_bound + slack


@SETTINGS
@given(SETS, SETS, LAMS)
def test_batched_fit_equals_single_fits(a, b, lams):
    many = cb_core.fit_many([a, b], lam=lams)
    assert len(many) == 2 and all(len(row) == 3 for row in many)
    for s, dec in enumerate((a, b)):
        for k, lam in enumerate(lams):
            one, solo = many[s][k], cb_core.fit(dec, lam=lam)
            assert one.converged == solo.converged and one.converged
            assert one.alpha.shape == (D + 1,) and one.alpha.dtype == np.float32
            assert one.settings["lam"] == lam and one.n_decisions == dec.n_decisions
            close_within_certificates(one, solo)


@SETTINGS
@given(SETS, SETS, st.integers(7, 11), st.integers(7, 11))
def test_padding_never_changes_a_result(a, b, extra_n, extra_m):
    """An extra problem (a set with more decisions and candidates: a larger shared bucket) and the
    padded decisions and slots it brings change no other problem's result (float64: its alpha within
    the certificates, its loss to rounding)."""
    big = random_decisions(extra_n * 31 + extra_m, [extra_m] * extra_n, D)
    with jax.enable_x64(True):
        sets = [as_float64(x) for x in (a, b, big)]
        tight = cb_core.fit_many(sets[:2], lam=[0.3, 2.0], dtype=jnp.float64)
        loose = cb_core.fit_many(sets, lam=[0.3, 2.0], dtype=jnp.float64)
    for s in range(2):
        for k in range(2):
            one, ref = loose[s][k], tight[s][k]
            assert one.converged and ref.converged
            close_within_certificates(one, ref, slack=1e-12)
            assert abs(one.loss - ref.loss) <= 1e-12
            # (the step counts are not compared: the padded layout rounds differently, and at the
            # tolerance's edge the stall guard may take a few more steps to the same optimum)


def test_a_problem_that_converges_early_stays_put():
    """A strongly regularised problem stops after fewer Newton steps than its weakly regularised
    neighbour; batched, its alpha and step count are its solo fit's while the other iterates on."""
    dec = random_decisions(5, [3, 5, 4, 6, 2, 5], D, scale=3.0)
    with jax.enable_x64(True):
        dec = as_float64(dec)
        solver = cb_core.Newton(tol=1e-9)
        many = cb_core.fit_many(dec, solver, lam=[20.0, 0.02], dtype=jnp.float64)[0]
        solo = [cb_core.fit(dec, solver, lam=lam, dtype=jnp.float64) for lam in (20.0, 0.02)]
    assert many[0].n_iter < many[1].n_iter
    for one, ref in zip(many, solo):
        assert one.converged and one.n_iter == ref.n_iter
        # the same steps; the batched layout (scaled hidden states, matrix-matrix products) sums in
        # another order: float64 rounding (a CG iteration more or fewer at its forcing target)
        np.testing.assert_allclose(one.alpha, ref.alpha, rtol=1e-7, atol=1e-10)


@SETTINGS
@given(SETS, SETS, LAMS)
def test_certificates_hold_for_every_problem(a, b, lams):
    """Every problem's gap and distance bounds hold against a tightly converged float64 fit,
    judged by the independent numpy objective."""
    many = cb_core.fit_many([a, b], lam=lams)
    for s, dec in enumerate((a, b)):
        for k, lam in enumerate(lams):
            with jax.enable_x64(True):
                ref = cb_core.fit(as_float64(dec), cb_core.Newton(tol=1e-11), lam=lam, dtype=jnp.float64)
            f = reference_objective(dec, lam)
            r = many[s][k]
            # + float32 rounding: the certificate's gradient is computed in float32 at a float32 alpha,
            # so it certifies the gap down to the float32 objective's own resolution, no further
            rounding = 4 * float(np.finfo(np.float32).eps) * max(1.0, abs(f(ref.alpha)))
            assert f(r.alpha) - f(ref.alpha) <= r.certificate.gap_bound + rounding
            assert np.linalg.norm(r.alpha - ref.alpha) <= r.certificate.distance_bound + 1e-6
            assert r.certificate.strongly_convex and r.certificate.min_hessian_eig >= lam * (1 - 1e-3)


@SETTINGS
@given(SETS.filter(lambda dec: dec.n_decisions >= 2), st.data())
def test_fold_weights_equal_the_fit_on_the_subset(dec, data):
    """A problem whose weights are a 0/1 mask is the fit of the decisions it keeps (whose features
    are standardised per candidate set, so leaving a decision out changes nothing else)."""
    weights = data.draw(decision_weights(dec.n_decisions, 3))
    many = cb_core.fit_many(dec, lam=0.5, weights=weights)[0]
    for w, one in zip(weights, many):
        kept = np.flatnonzero(w)
        solo = cb_core.fit(subset(dec, kept), lam=0.5)
        assert one.n_decisions == kept.size == solo.n_decisions
        assert one.converged and solo.converged
        close_within_certificates(one, solo)
        assert abs(one.loss - solo.loss) <= 1e-5


def test_a_weight_of_two_counts_a_decision_twice():
    """Eq. 6 with weights is sum_i w_i nll_i / sum_i w_i + lam/2 ||alpha||^2: weight 2 on a decision
    is that decision repeated (checked in float64 against the independent numpy objective)."""
    lists = random_lists(8, [3, 4, 5, 2], D)
    dec = cb_core.decisions_from_lists(*lists)
    twice = cb_core.decisions_from_lists(*(x + [x[2]] for x in lists))
    w = np.array([1.0, 1.0, 2.0, 1.0])
    with jax.enable_x64(True):
        solver = cb_core.Newton(tol=1e-10)
        weighted = cb_core.fit_many(as_float64(dec), solver, weights=w, dtype=jnp.float64)[0][0]
        repeated = cb_core.fit(as_float64(twice), solver, dtype=jnp.float64)
    np.testing.assert_allclose(weighted.alpha, repeated.alpha, atol=1e-8)
    assert weighted.loss == pytest.approx(reference_objective(dec, 1.0, w)(weighted.alpha), abs=1e-10)


def test_one_problem_is_the_single_fit():
    """fit_many with one problem runs fit's program: the same alpha to the bit."""
    dec = random_decisions(2, [4, 3, 5], D)
    np.testing.assert_array_equal(cb_core.fit_many(dec, lam=0.7)[0][0].alpha, cb_core.fit(dec, lam=0.7).alpha)


@pytest.mark.parametrize("kwargs, match", [
    (dict(solver=cb_core.Subspace()), "supports the solvers Newton"),
    (dict(lam=[1.0, -1.0]), "lam must be finite numbers > 0"),
    (dict(lam=[1.0, 2.0], weights=np.ones((3, 3))), "different numbers of problems"),
    (dict(weights=np.ones((2, 4))), r"weights must be \[K, N\] = \[K, 3\]"),
    (dict(weights=np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])), "problem 1 weights no decision"),
    (dict(weights=np.array([[1.0, -1.0, 1.0]])), "finite and >= 0"),
    (dict(init=np.zeros(3)), "init must broadcast"),
])
def test_bad_fit_many_arguments(kwargs, match):
    dec = random_decisions(0, [2, 3, 2], D)
    with pytest.raises(ValueError, match=match):
        cb_core.fit_many(dec, **kwargs)


def test_decision_sets_of_different_widths_are_refused():
    with pytest.raises(ValueError, match="set 1 has d = 3"):
        cb_core.fit_many([random_decisions(0, [2, 3], D), random_decisions(1, [2, 3], 3)])
    with pytest.raises(ValueError, match="non-empty sequence"):
        cb_core.fit_many([])
