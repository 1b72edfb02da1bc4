"""The public property-test kit (:mod:`cb_core.testing`) fails what it should: NaN and infinity
anywhere, a wrong Hessian, a term that reads across candidate sets, hidden states float32 cannot
hold; and a failing example prints as a call that rebuilds it."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import cb_core
from cb_core import testing as kit

def square(a):
    return float(a @ a)


@pytest.mark.parametrize("case", ["NaN objective", "objective NaN one step away", "NaN gradient coordinate",
                                  "infinite gradient coordinate"])
def test_check_gradient_fails_what_is_not_finite(case):
    alpha = np.zeros(3)
    objective, gradient = {
        "NaN objective": (lambda a: float("nan"), np.zeros(3)),
        "objective NaN one step away": (lambda a: float("nan") if a[2] > 0 else square(a), np.zeros(3)),
        "NaN gradient coordinate": (square, np.array([0.0, np.nan, 0.0])),
        "infinite gradient coordinate": (square, np.array([0.0, 0.0, np.inf])),
    }[case]
    with pytest.raises(AssertionError, match="not finite"):
        kit.check_gradient(objective, gradient, alpha)
    assert kit.check_gradient(square, 2 * alpha, alpha) < 1e-9  # the finite case still passes


def test_the_hessian_bounds_fail_nan_with_their_own_assertion():
    phi = np.ones((3, 2))
    phi[1, 0] = np.nan
    with pytest.raises(AssertionError, match=r"feature entry \(1, 0\) is nan"):
        kit.hessian_upper_bound(phi, np.array([0, 3]), 1.0)
    for h, where in ((np.diag([1.0, np.nan, 2.0]), r"\(1, 1\)"), (np.full((2, 2), np.nan), r"\(0, 0\)")):
        with pytest.raises(AssertionError, match=rf"Hessian entry {where} is nan"):
            kit.check_hessian_bounds(h, 1.0, 5.0)
    with pytest.raises(AssertionError, match="bound"):
        kit.check_hessian_bounds(np.eye(2), 1.0, float("nan"))


def test_check_hessian_takes_cb_core_s_hessian_and_names_a_wrong_entry():
    """cb_core's Hessian passes the finite-difference check of its gradient (float64); one entry
    changed by 1e-4 is named."""
    with jax.enable_x64(True):
        dec = kit.random_decisions(4, [3, 5, 2, 4], 3)
        dec = cb_core.LabelledDecisions(*(np.asarray(x, np.float64) if i < 2 else x for i, x in enumerate(
            (dec.hidden, dec.log_q, dec.n_tokens, dec.offsets, dec.segment_ids, dec.expert))))
        alpha = np.random.default_rng(0).standard_normal(4)
        h = np.asarray(cb_core.hessian(alpha, dec, lam=0.5))
        grad = lambda a: np.asarray(cb_core.gradient(a, dec, lam=0.5))  # noqa: E731
        assert kit.check_hessian(grad, h, alpha) < 1e-7
        wrong = h.copy()
        wrong[2, 1] += 1e-4
        with pytest.raises(AssertionError, match=r"Hessian entry \(2, 1\)"):
            kit.check_hessian(grad, wrong, alpha)


def leaky_objective(alpha, dec, lam=0.5):
    """Eq. 6 with the prior left out and the hidden states standardised over all rows of the data
    instead of per candidate set (the leak a user's extension had); numpy, float64."""
    h = np.asarray(dec.hidden, np.float64)
    z = np.concatenate([(h - h.mean(0)) / np.maximum(h.std(0), 1e-6), np.zeros((len(h), 1))], axis=1)
    s, offsets = z @ alpha, np.asarray(dec.offsets)
    nll = [np.logaddexp.reduce(s[a:b]) - s[a + int(e)] for a, b, e in zip(offsets[:-1], offsets[1:], dec.expert)]
    return float(np.mean(nll) + lam / 2 * alpha @ alpha)


def test_check_separable_catches_a_standardisation_across_candidate_sets_and_passes_cb_core():
    with jax.enable_x64(True):
        dec = kit.random_decisions(3, [3, 4, 2, 5], 3)
        alpha = np.random.default_rng(1).standard_normal(4)
        assert kit.check_separable(lambda a, d: float(cb_core.objective(a, d, lam=0.5)), dec, alpha) < 1e-9
        with pytest.raises(AssertionError, match="reads across candidate sets"):
            kit.check_separable(leaky_objective, dec, alpha)


def test_decision_sets_refuse_a_scale_float32_cannot_hold_and_decisions_refuse_the_overflow():
    with pytest.raises(ValueError, match=r"scale must be .*float32.* got 1e\+39"):
        kit.decision_sets(scale=1e39)
    hidden, log_q, n_tokens, expert = kit.random_lists(0, [2, 3], 2, scale=1e39)  # float64: finite
    assert np.isfinite(np.concatenate(hidden)).all()
    rows = [(i, j) for i, h in enumerate(hidden) for j, row in enumerate(h) if np.abs(row).max() > 3.4028235e38]
    with pytest.raises(ValueError, match=rf"decision {rows[0][0]}: hidden of candidate {rows[0][1]} holds "
                                         r"[0-9.]+e\+3[89], past float32"):
        cb_core.decisions_from_lists(hidden, log_q, n_tokens, expert)


def test_a_failing_example_prints_as_a_call_that_rebuilds_it():
    """The falsifying example is ``random_decisions(seed, sizes, d, scale=...)`` with numbers, which
    rebuilds the same decisions when pasted."""
    from hypothesis import given, settings

    @settings(max_examples=3, deadline=None, database=None, print_blob=False)
    @given(kit.decision_sets(max_n=2, scale=2.5))
    def test_fails(dec):
        assert dec.n_decisions > 5

    with pytest.raises(AssertionError) as err:
        test_fails()
    line = next(x for x in getattr(err.value, "__notes__", []) if "dec=" in x)
    call = line.split("dec=", 1)[1].split("),", 1)[0] + ")"
    assert "scale=2.5" in call and "scale=scale" not in call, line
    rebuilt = eval(call, {"random_decisions": kit.random_decisions})  # noqa: S307 - the printed example
    assert rebuilt.n_decisions <= 2 and rebuilt.hidden.dtype == np.float32
