"""Fitting: both methods reach the float64 optimum (scipy reference), invariances, certificate."""

from __future__ import annotations

import collections
import dataclasses
import importlib
import re
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize
from hypothesis import given, settings
from hypothesis import strategies as st

import cb_core
from cb_core.decisions import bucket_size
from core_helpers import random_decisions, random_lists, ragged, reference_model


def scipy_optimum(dec, lam=1.0, gamma=0.8, eps=1e-6):
    """Float64 reference optimum of Eq. 6: scipy L-BFGS-B on the independent numpy model
    (core_helpers.reference_model, written from the seed's equations)."""
    offsets = np.asarray(dec.offsets)
    split = lambda x: np.split(np.asarray(x, np.float64), offsets[1:-1])  # noqa: E731
    _, f, grad = reference_model(split(dec.hidden), split(dec.log_q), split(dec.n_tokens),
                                 np.asarray(dec.expert), lam=lam, gamma=gamma, eps=eps)
    res = scipy.optimize.minimize(lambda a: (f(a), grad(a)), np.zeros(dec.hidden_size + 1),
                                  jac=True, method="L-BFGS-B",
                                  options=dict(gtol=1e-12, ftol=1e-15, maxiter=5000))
    return res.x, res.fun, f


@pytest.fixture(scope="module")
def medium():
    rng = np.random.default_rng(7)
    sizes = list(rng.integers(1, 12, size=30))
    return random_decisions(11, sizes, 24)


@pytest.mark.parametrize("solver", [cb_core.Subspace(tol=1e-4), cb_core.Newton(tol=1e-4),
                                    cb_core.LBFGS(tol=1e-4)], ids=["subspace", "newton", "lbfgs"])
def test_float32_fit_reaches_the_float64_optimum(medium, solver):
    x_star, f_star, f64 = scipy_optimum(medium)
    r = cb_core.fit(medium, solver)
    assert r.converged and r.grad_norm <= 1e-4 and r.method == solver.name
    assert r.alpha.shape == (25,) and r.alpha.dtype == np.float32
    assert f64(r.alpha) - f_star <= 1e-7
    np.testing.assert_allclose(r.alpha, x_star, atol=2e-4)
    assert abs(r.loss - f_star) <= 1e-5
    c = r.certificate
    assert c.gap_bound == pytest.approx(r.grad_norm**2 / 2) and c.strongly_convex
    assert f64(r.alpha) - f_star <= c.gap_bound + 1e-9
    assert c.eig_method == "gram" and c.min_hessian_eig >= 1.0 - 1e-3  # T, m small: measured


@pytest.mark.parametrize("solver", [cb_core.Subspace(tol=1e-9), cb_core.Newton(tol=1e-9),
                                    cb_core.LBFGS(tol=1e-9)], ids=["subspace", "newton", "lbfgs"])
def test_float64_fit_matches_scipy_tightly(medium, solver):
    x_star, f_star, f64 = scipy_optimum(medium, lam=0.3)
    r = cb_core.fit(medium, solver, lam=0.3, dtype=jnp.float64)
    assert r.alpha.dtype == np.float64 and r.converged
    np.testing.assert_allclose(r.alpha, x_star, atol=1e-6)
    assert abs(r.loss - f_star) <= 1e-11
    assert not jax.config.jax_enable_x64  # enabled for the call only


@pytest.fixture()
def passes(monkeypatch):
    """Counts the passes over the hidden states the compiled fit makes, as it runs: a host callback
    in each function that reads them (the features' statistics, Phi v and Phi^T r), executed once
    per call inside the compiled loops. The stored-executable cache is off and the tests use solver
    settings no other test compiles, so their fits are traced with the counting functions (a
    compiled program without them would count nothing and fail). The fits here skip the
    certificate's eigenvalue program (``certify="structural"``): ``n_passes`` is the solve's."""
    model, solvers, fit_module = (importlib.import_module(f"cb_core.{m}") for m in ("model", "solvers", "fit"))
    count = collections.Counter()

    def counted(fn):
        def wrapper(*args, **kwargs):
            jax.debug.callback(lambda: count.update([fn.__name__]))
            return fn(*args, **kwargs)
        return wrapper

    for module, name in ((model, "phi_matvec"), (model, "phi_rmatvec"), (solvers, "phi_matvec"),
                         (solvers, "phi_rmatvec"), (fit_module, "prepare")):
        monkeypatch.setattr(module, name, counted(getattr(module, name)))
    monkeypatch.setattr(importlib.import_module("cb_core.cache"), "_EXECUTABLES", None)
    return count


def test_newton_takes_few_steps(medium, passes):
    """Newton-CG converges quadratically: a handful of steps to a float64 gradient of 1e-9; the
    passes it reports are the passes it made (counted as they ran)."""
    r = cb_core.fit(medium, cb_core.Newton(tol=1e-9, max_iter=49), dtype=jnp.float64, certify="structural")
    assert r.converged and r.n_iter <= 8 and r.n_hvp >= r.n_iter
    assert passes["prepare"] == 1 and r.n_passes == passes.total()
    assert passes["phi_matvec"] >= r.n_hvp and passes["phi_rmatvec"] >= r.n_hvp  # an HVP reads them twice


def test_subspace_steps_cost_two_passes(medium, passes):
    """Each subspace step costs two passes (its gradient and that gradient's image), counted as they
    ran; with the exact minimisation over the past steps it reaches a float64 gradient of 1e-9 in a
    few dozen steps (Adam does not within 1,500), also with memory 1, at the same optimum."""
    r = cb_core.fit(medium, cb_core.Subspace(tol=1e-9, max_iter=499), dtype=jnp.float64, certify="structural")
    assert r.converged and r.method == "subspace" and r.n_hvp == 0
    assert r.n_passes == passes.total() and r.n_iter <= 60
    # per step the gradient's image and the new gradient; besides, the statistics, the first
    # gradient (the scores at alpha = 0 need no pass) and the certificate's gradient from scratch
    assert passes == {"prepare": 1, "phi_matvec": r.n_iter + 1, "phi_rmatvec": 1 + r.n_iter + 1}
    r1 = cb_core.fit(medium, cb_core.Subspace(tol=1e-9, memory=1), dtype=jnp.float64)
    assert r1.converged
    np.testing.assert_allclose(r1.alpha, r.alpha, atol=1e-8)


def test_adam_seed_protocol_reaches_the_optimum(medium):
    x_star, f_star, f64 = scipy_optimum(medium)
    r = cb_core.fit(medium, cb_core.Adam())
    assert r.method == "adam" and r.n_iter <= 1500 and r.settings["learning_rate"] == 0.01
    assert f64(r.alpha) - f_star <= 1e-4
    np.testing.assert_allclose(r.alpha, x_star, atol=2e-2)
    # the reported gradient norm is the gradient's at the returned alpha (independent formula)
    offsets = np.asarray(medium.offsets)
    split = lambda x: np.split(np.asarray(x, np.float64), offsets[1:-1])  # noqa: E731
    _, _, grad = reference_model(split(medium.hidden), split(medium.log_q),
                                 split(medium.n_tokens), np.asarray(medium.expert))
    assert r.grad_norm == pytest.approx(np.linalg.norm(grad(r.alpha)), rel=1e-2, abs=1e-6)


def test_adam_stops_on_gradient_tolerance():
    lists = random_lists(3, [3, 4, 2, 5], 3)
    r = cb_core.fit(cb_core.decisions_from_lists(*lists), cb_core.Adam(tol=0.05))
    assert r.converged and 0 < r.n_iter < 1500
    _, _, grad = reference_model(*lists)  # the stop is judged by an independent gradient
    assert np.linalg.norm(grad(r.alpha)) < 0.05 * (1 + 1e-3)


@settings(max_examples=8, deadline=None)
@given(ragged(), st.randoms(use_true_random=False))
def test_permuting_candidates_leaves_the_fit_unchanged(case, rnd):
    seed, sizes, d = case
    hidden, log_q, n_tokens, expert = random_lists(seed, sizes, d)
    perms = [np.array(rnd.sample(range(m), m)) for m in sizes]
    a = cb_core.decisions_from_lists(hidden, log_q, n_tokens, expert)
    b = cb_core.decisions_from_lists([h[p] for h, p in zip(hidden, perms)],
                                     [q[p] for q, p in zip(log_q, perms)],
                                     [n[p] for n, p in zip(n_tokens, perms)],
                                     [int(np.argsort(p)[e]) for p, e in zip(perms, expert)])
    with jax.enable_x64(True):
        ra = cb_core.fit(a, cb_core.LBFGS(tol=1e-10), dtype=jnp.float64)
        rb = cb_core.fit(b, cb_core.LBFGS(tol=1e-10), dtype=jnp.float64)
    np.testing.assert_allclose(ra.alpha, rb.alpha, atol=1e-8)
    assert ra.loss == pytest.approx(rb.loss, abs=1e-12)


def test_constant_feature_gets_zero_weight():
    hidden, log_q, n_tokens, expert = random_lists(5, [4, 6, 3, 5, 7, 2, 4], 6)
    rng = np.random.default_rng(0)
    for h in hidden:  # coordinate 2 is constant inside every candidate set (but differs across)
        h[:, 2] = rng.standard_normal() * 10
    dec = cb_core.decisions_from_lists(hidden, log_q, n_tokens, expert)
    phi = np.asarray(cb_core.features(dec))
    assert np.all(phi[:, 2] == 0.0)
    for solver in (cb_core.Subspace(), cb_core.Newton(), cb_core.LBFGS(), cb_core.Adam()):
        r = cb_core.fit(dec, solver)
        assert r.alpha[2] == 0.0
        assert abs(r.alpha[-1]) <= 1e-6  # the bias coordinate is constant within every set
        assert np.any(np.abs(r.alpha[:2]) > 1e-3)


def test_single_candidate_decisions_do_not_move_alpha_with_rescaled_lam():
    """Adding K one-candidate decisions only rescales the NLL by N/(N+K)."""
    sizes = [3, 5, 4, 6]
    hidden, log_q, n_tokens, expert = random_lists(9, sizes, 4)
    extra = random_lists(10, [1, 1, 1, 1], 4)
    a = cb_core.decisions_from_lists(hidden, log_q, n_tokens, expert)
    b = cb_core.decisions_from_lists(hidden + extra[0], log_q + extra[1], n_tokens + extra[2],
                                     expert + extra[3])
    with jax.enable_x64(True):
        ra = cb_core.fit(a, cb_core.Newton(tol=1e-10), lam=1.0, dtype=jnp.float64)
        rb = cb_core.fit(b, cb_core.Newton(tol=1e-10), lam=0.5, dtype=jnp.float64)  # N doubled
    np.testing.assert_allclose(ra.alpha, rb.alpha, atol=1e-8)


def test_bucketed_shapes_reuse_compiled_code():
    fit_module = importlib.import_module("cb_core.fit")  # cb_core.fit is the function

    sizes_a = [5] * 17  # N = 17, M = 5
    sizes_b = [5] * 19 + [6]  # N = 20, M_max = 6: the same buckets (20, 8)
    assert bucket_size(5) == bucket_size(6) and bucket_size(17) == bucket_size(20)
    cb_core.fit(random_decisions(1, sizes_a, 7), cb_core.LBFGS(max_iter=3))
    before = fit_module._solve._cache_size()
    cb_core.fit(random_decisions(2, sizes_b, 7), cb_core.LBFGS(max_iter=3), lam=2.0)
    assert fit_module._solve._cache_size() == before


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_fit_names_the_decision_with_a_non_finite_hidden_state(bad):
    """The fit checks the hidden states on its way through them (no separate host pass): an
    unvalidated LabelledDecisions with one bad entry is refused naming its decision and candidate."""
    good = random_decisions(3, [3, 4, 2, 5], 6)
    hidden = np.array(good.hidden)
    hidden[good.offsets[2] + 1, 4] = bad  # decision 2, candidate 1
    dec = dataclasses.replace(good, hidden=hidden)
    with pytest.raises(ValueError, match="decision 2: non-finite hidden .candidate 1"):
        cb_core.fit(dec)


def test_bucket_size():
    assert bucket_size(1) == 8 and bucket_size(8) == 8
    for n in range(1, 3000):
        b = bucket_size(n)
        assert n <= b <= max(8, int(n * 1.25) + 1)
    assert len({bucket_size(n) for n in range(1025, 2049)}) == 4


def test_iteration_cap_is_reported():
    dec = random_decisions(4, [5, 6, 7, 4, 5], 8)
    r = cb_core.fit(dec, cb_core.LBFGS(max_iter=2, tol=0.0))
    assert r.n_iter == 2 and not r.converged
    d = cb_core.fit(dec)  # default float32 tolerance: 1e-3, certified gap <= 5e-7
    assert d.converged and d.settings["tol"] == 1e-3 and d.certificate.gap_bound <= 5e-7
    assert d.method == importlib.import_module("cb_core.fit").DEFAULT_SOLVER.name


@pytest.mark.parametrize("args, kwargs, match", [
    ((), dict(lam=0.0), "lam"), ((), dict(lam=-1.0), "lam"), ((), dict(lam=float("nan")), "lam"),
    (("sgd",), {}, "solver"), ((), dict(dtype=jnp.float16), "dtype"),
    ((), dict(eps=0.0), "eps"), ((cb_core.LBFGS(tol=-1.0),), {}, "tol"),
    ((cb_core.Newton(max_iter=-1),), {}, "max_iter"),
    ((cb_core.Subspace(memory=0),), {}, "memory"), ((cb_core.Subspace(inner=0),), {}, "inner"),
])
def test_bad_fit_arguments(args, kwargs, match):
    dec = random_decisions(0, [2, 3], 3)
    with pytest.raises(ValueError, match=match):
        cb_core.fit(dec, *args, **kwargs)


@pytest.mark.parametrize("lam, edge", [(1e39, "overflows"), (1e-46, "underflows"), (1e-40, "underflows")])
def test_a_strength_the_fit_s_dtype_cannot_hold_is_one_line_naming_lam(lam, edge):
    """float32 holds 1.18e-38 to 3.40e38 (numpy.finfo): 1e39 would be inf (the error blamed the
    features), 1e-46 would be 0 and 1e-40 a subnormal (a certificate for a lam that was not
    fitted). fit and fit_many refuse each in one line naming lam, and point to float64, which holds them."""
    dec = random_decisions(0, [3, 4, 2, 5], 4)
    assert not np.finfo(np.float32).tiny <= lam <= np.finfo(np.float32).max
    for call in (lambda: cb_core.fit(dec, lam=lam), lambda: cb_core.fit_many(dec, lam=[1.0, lam])):
        with pytest.raises(ValueError, match="^" + re.escape(f"lam={lam:g} {edge} float32 ") + ".*float64") as err:
            call()
        assert "\n" not in str(err.value)


def test_cb_agent_fit_refuses_a_strength_float32_cannot_hold(tmp_path):
    from click.testing import CliRunner

    from agent_shell.commands.fit import fit as fit_cmd
    from core_helpers import save_decisions

    save_decisions(tmp_path / "d.npz", random_decisions(0, [3, 4, 2, 5], 4))
    res = CliRunner().invoke(fit_cmd, [str(tmp_path / "d.npz"), "--out", str(tmp_path / "c"), "--lam", "1e39",
                                       "--no-cache"])
    assert res.exit_code == 1 and res.output.startswith("Error: lam=1e+39 overflows float32"), res.output
    assert len(res.output.strip().splitlines()) == 1 and not (tmp_path / "c").exists()
