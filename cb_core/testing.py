"""Property-test kit for the concept model: hypothesis strategies and derivative checks.

For a user who extends the objective (a new feature, a weighting, a solver) and wants to test it
the way cb_core tests its own: random ragged decision sets, concepts and decision weights drawn by
hypothesis, and checks of a gradient against central finite differences, of a Hessian against
finite differences of the gradient and against its bounds lam I <= H <= (lam + B) I, and of the
objective's structure (one decision's term depends on its own candidate set only).

* :func:`random_lists` / :func:`random_decisions`: a seeded random ragged decision set (numpy).
* strategies: :func:`ragged` ((seed, sizes, d): candidate counts, token counts and expert index
  vary with the seed), :func:`decision_sets` (validated :class:`cb_core.LabelledDecisions`; a failing
  example prints as the call that rebuilds it, ``random_decisions(0, [1], 3, scale=1.0)``),
  :func:`concepts` (alpha vectors [d + 1]) and :func:`decision_weights` ([K, N] 0/1 masks, each
  row weighting at least one decision: cross-validation folds for :func:`cb_core.fit_many`).
* checks: :func:`check_gradient` (central differences of the objective), :func:`check_hessian`
  (central differences of the gradient), :func:`hessian_upper_bound` and
  :func:`check_hessian_bounds`, :func:`check_separable` (the objective of N decisions is the mean
  of the objectives of each alone: a standardisation or any term that leaks across candidate sets
  fails it). Each raises AssertionError naming the coordinate, entry, eigenvalue or decision at
  fault, and a NaN or infinity anywhere (objective, gradient, Hessian, features) fails it too.

Run the checks in float64: ``with jax.enable_x64(True):`` around building the decisions and
calling the objective. Central differences in float32 carry a rounding error of about
eps_32 |f| / h (1e-7 / 1e-6: order 0.1 with the default step), so a correct gradient fails a
float32 check; in float64 it is about 1e-10. The strongest check of a changed objective is
against :func:`cb_core.objective` (and :func:`cb_core.gradient`, :func:`cb_core.hessian`) on the
decisions where the change should not matter (e.g. its new weight set to 1): the derivative checks
only say that the gradient is the objective's, not that the objective is Eq. 6.

Needs hypothesis (the ``testing`` extra: ``pip install cb-agent[testing]``). Imports nothing of
this project outside :mod:`cb_core`; no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from hypothesis import strategies as st
from jax.typing import ArrayLike

from cb_core.decisions import LabelledDecisions, decisions_from_lists

__all__ = [
    "check_gradient", "check_hessian", "check_hessian_bounds", "check_separable", "concepts", "decision_sets",
    "decision_weights", "hessian_upper_bound", "ragged", "random_decisions", "random_lists",
]

#: Largest |hidden state| :func:`random_lists` draws, in units of ``scale`` (a normal draw past 8
#: standard deviations plus the set's offset has probability below 1e-14).
_SPREAD = 16.0


def random_lists(seed: int, sizes: Sequence[int], d: int, scale: float = 1.0):
    """A random ragged decision set as lists (the arguments of :func:`cb_core.decisions_from_lists`).

    Args:
        seed: numpy seed.
        sizes: [N] candidate counts M_i >= 1.
        d: hidden width.
        scale: spread of the hidden states within a set (around a per-set offset).

    Returns:
        (hidden, log_q, n_tokens, expert): N float64 arrays [M_i, d]; N float64 arrays [M_i] of
        summed token log-probabilities (nats, < 0); N int arrays [M_i] of token counts in [1, 8];
        N ints, the expert's index in its set.
    """
    rng = np.random.default_rng(seed)
    hidden = [rng.standard_normal((m, d)) * scale + rng.standard_normal(d) for m in sizes]
    n_tokens = [rng.integers(1, 9, size=m) for m in sizes]
    log_q = [-rng.gamma(2.0, 1.5, size=m) * nt ** 0.5 for m, nt in zip(sizes, n_tokens)]
    expert = [int(rng.integers(0, m)) for m in sizes]
    return hidden, log_q, n_tokens, expert


def random_decisions(seed: int, sizes: Sequence[int], d: int, scale: float = 1.0) -> LabelledDecisions:
    """:func:`random_lists` as validated float32 :class:`cb_core.LabelledDecisions`."""
    return decisions_from_lists(*random_lists(seed, sizes, d, scale))


@st.composite
def ragged(draw, max_n: int = 6, max_m: int = 6, min_d: int = 3, max_d: int = 4):
    """Strategy: (seed, sizes, d) of a random ragged decision set (:func:`random_lists`): N in
    [1, max_n] decisions of M_i in [1, max_m] candidates, d in [min_d, max_d]."""
    n = draw(st.integers(1, max_n))
    sizes = draw(st.lists(st.integers(1, max_m), min_size=n, max_size=n))
    d = draw(st.integers(min_d, max_d))
    seed = draw(st.integers(0, 2**31 - 1))
    return seed, sizes, d


def decision_sets(max_n: int = 6, max_m: int = 6, min_d: int = 3, max_d: int = 4,
                  scale: float = 1.0) -> st.SearchStrategy[LabelledDecisions]:
    """Strategy: validated float32 :class:`cb_core.LabelledDecisions` drawn as :func:`ragged` describes;
    a failing example prints as the :func:`random_decisions` call that rebuilds it.

    Raises:
        ValueError: ``scale`` not a finite number > 0, or so large that the hidden states would
            overflow float32 (|h| up to about 16 scale must stay below 3.4e38).
    """
    limit = float(np.finfo(np.float32).max) / _SPREAD
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale <= limit:
        raise ValueError(f"scale must be a finite number in (0, {limit:.3g}] (float32 hidden states), got {scale!r}")

    def build(case: tuple[int, list[int], int]) -> st.SearchStrategy[LabelledDecisions]:
        seed, sizes, d = case
        return st.builds(random_decisions, st.just(seed), st.just(sizes), st.just(d), scale=st.just(scale))

    return ragged(max_n, max_m, min_d, max_d).flatmap(build)


def concepts(m: int, max_abs: float = 3.0) -> st.SearchStrategy[np.ndarray]:
    """Strategy: concept vectors alpha, float64 [m] (m = d + 1), entries in [-max_abs, max_abs]."""
    entry = st.floats(-max_abs, max_abs, allow_nan=False, allow_infinity=False)
    return st.lists(entry, min_size=m, max_size=m).map(lambda x: np.asarray(x, np.float64))


@st.composite
def decision_weights(draw, n: int, k: int) -> np.ndarray:
    """Strategy: float64 [k, n] 0/1 decision weights, each row with at least one 1 (a problem
    weighting no decision has no data term)."""
    rows = []
    for _ in range(k):
        row = np.asarray(draw(st.lists(st.booleans(), min_size=n, max_size=n)), np.float64)
        row[draw(st.integers(0, n - 1))] = 1.0
        rows.append(row)
    return np.stack(rows)


def check_gradient(objective: Callable[[np.ndarray], float], gradient: ArrayLike, alpha: ArrayLike,
                   step: float = 1e-6, rtol: float = 1e-6, atol: float = 1e-7) -> float:
    """Check ``gradient`` [m] (the analytic gradient at ``alpha``) against central finite
    differences (f(alpha + h e_j) - f(alpha - h e_j)) / (2 h) of ``objective`` (a float64
    function of alpha [m]; rounding error ~ eps_64 |f| / h, truncation ~ h^2 |f'''|).

    Returns:
        the largest absolute difference (float).

    Raises:
        AssertionError: a non-finite gradient coordinate or objective value (at alpha or a step
            from it), or naming the first coordinate where |g_j - fd_j| > atol + rtol |fd_j|.
    """
    alpha = np.asarray(alpha, np.float64)
    g = np.asarray(gradient, np.float64)
    if g.shape != alpha.shape or alpha.ndim != 1:
        raise AssertionError(f"gradient shape {g.shape} does not match alpha's {alpha.shape}")
    _finite("gradient coordinate", g)
    _finite("objective at alpha", np.asarray([objective(alpha)], np.float64))
    eye = np.eye(alpha.size)
    fd = np.array([_difference(objective, alpha, step * e, j) for j, e in enumerate(eye)])
    bad = np.flatnonzero(np.abs(g - fd) > atol + rtol * np.abs(fd))
    if bad.size:
        j = int(bad[0])
        raise AssertionError(f"gradient coordinate {j}: analytic {g[j]!r}, central difference {fd[j]!r} "
                             f"(step {step:g})")
    return float(np.max(np.abs(g - fd)))


def check_hessian(gradient: Callable[[np.ndarray], ArrayLike], hessian: ArrayLike, alpha: ArrayLike,
                  step: float = 1e-5, rtol: float = 1e-6, atol: float = 1e-7) -> float:
    """Check ``hessian`` [m, m] (the analytic Hessian at ``alpha``) against central finite
    differences of ``gradient`` (a float64 function of alpha [m] -> [m]): column j is
    (g(alpha + h e_j) - g(alpha - h e_j)) / (2 h); truncation ~ h^2 times the gradient's third
    derivative.

    Returns:
        the largest absolute difference (float).

    Raises:
        AssertionError: a non-finite entry of ``hessian`` or of a gradient, a shape that is not
            [m, m], or naming the first entry (i, j) where |H_ij - fd_ij| > atol + rtol |fd_ij|.
    """
    alpha = np.asarray(alpha, np.float64)
    h = np.asarray(hessian, np.float64)
    if alpha.ndim != 1 or h.shape != (alpha.size, alpha.size):
        raise AssertionError(f"Hessian shape {h.shape} does not match alpha's {alpha.shape}")
    _finite("Hessian entry", h)
    eye = np.eye(alpha.size)
    fd = np.stack([_difference(gradient, alpha, step * e, j) for j, e in enumerate(eye)], axis=1)
    bad = np.argwhere(np.abs(h - fd) > atol + rtol * np.abs(fd))
    if bad.size:
        i, j = (int(x) for x in bad[0])
        raise AssertionError(f"Hessian entry ({i}, {j}): analytic {h[i, j]!r}, central difference of the "
                             f"gradient {fd[i, j]!r} (step {step:g})")
    return float(np.max(np.abs(h - fd)))


def check_separable(objective: Callable[[np.ndarray, LabelledDecisions], float], decisions: LabelledDecisions,
                    alpha: ArrayLike, rtol: float = 1e-9, atol: float = 1e-12) -> float:
    """Check that ``objective(alpha, decisions)`` (Eq. 6, or an extension of it with the same
    regulariser for any decision count) is the mean of ``objective(alpha, {i})`` over its N
    decisions alone: each decision's term may read its own candidate set only. A term that mixes
    candidate sets (hidden states standardised over all rows instead of per set, a prior
    normalised over the whole data) fails it; cb_core's own :func:`cb_core.objective` passes.

    Returns:
        the absolute difference (float).

    Raises:
        AssertionError: a non-finite value (naming the decision), or the two differ by more than
            atol + rtol |whole|, naming the decision whose term is farthest from the whole's.
    """
    from cb_core.decisions import validate_decisions

    dec = validate_decisions(decisions)
    offsets = np.asarray(dec.offsets)
    alone = []
    for i, (a, b) in enumerate(zip(offsets[:-1], offsets[1:])):
        one = LabelledDecisions(hidden=dec.hidden[a:b], log_q=dec.log_q[a:b], n_tokens=dec.n_tokens[a:b],
                                offsets=np.asarray([0, b - a], np.int64), segment_ids=np.zeros(b - a, np.int32),
                                expert=dec.expert[i:i + 1])
        alone.append(float(objective(alpha, one)))
    _finite("objective of decision", np.asarray(alone))
    whole = float(objective(alpha, decisions))
    _finite("objective of all decisions", np.asarray([whole]))
    gap = abs(whole - float(np.mean(alone)))
    if gap > atol + rtol * abs(whole):
        worst = int(np.argmax(np.abs(np.asarray(alone) - whole)))
        raise AssertionError(f"the objective of the {len(alone)} decisions is {whole!r}, but the mean of each "
                             f"decision's alone is {float(np.mean(alone))!r}: a term reads across candidate sets "
                             f"(decision {worst} alone: {alone[worst]!r})")
    return gap


def _difference(fn: Callable[[np.ndarray], ArrayLike], alpha: np.ndarray, h: np.ndarray, j: int) -> np.ndarray:
    """(fn(alpha + h) - fn(alpha - h)) / (2 |h|), refused when either value is not finite."""
    up, down = (np.asarray(fn(alpha + sign * h), np.float64) for sign in (1, -1))
    for value, side in ((up, "+"), (down, "-")):
        if not np.isfinite(value).all():
            raise AssertionError(f"the function is not finite at alpha {side} step e_{j}: {value!r}")
    return (up - down) / (2 * float(np.max(np.abs(h))))


def _finite(what: str, values: np.ndarray) -> None:
    """AssertionError naming the first non-finite entry of ``values``."""
    bad = np.argwhere(~np.isfinite(values))
    if bad.size:
        at = tuple(int(x) for x in bad[0])
        raise AssertionError(f"{what} {at[0] if len(at) == 1 else at} is {values[at].item()!r}, not finite")


def hessian_upper_bound(features: ArrayLike, offsets: ArrayLike, lam: float,
                        weights: ArrayLike | None = None) -> float:
    """An upper bound on the largest eigenvalue of the Eq. 6 Hessian, lam + B.

    H = sum_i w_i Cov_{P_i}(phi) / sum_i w_i + lam I, and for any law P on a candidate set
    lambda_max(Cov_P(phi)) <= tr Cov_P(phi) <= E_P ||phi - c||^2 <= max_a ||phi_a - c||^2 for every
    centre c; with c the set's mean feature, B = sum_i w_i max_a ||phi_a - mean_i phi||^2 / sum_i w_i
    (independent of alpha).

    Args:
        features: [T, m] features phi (:func:`cb_core.features`).
        offsets: [N + 1] the decisions' row offsets.
        lam: the L2 strength.
        weights: [N] decision weights >= 0 (None: all 1).

    Returns:
        lam + B (float).

    Raises:
        AssertionError: a non-finite feature (naming the row and column), weight or lam.
    """
    phi = np.asarray(features, np.float64)
    offsets = np.asarray(offsets)
    w = np.ones(offsets.size - 1) if weights is None else np.asarray(weights, np.float64)
    _finite("feature entry", phi)
    _finite("decision weight", w)
    _finite("lam", np.asarray([lam], np.float64))
    spread = np.array([np.max(np.sum((phi[a:b] - phi[a:b].mean(axis=0)) ** 2, axis=1))
                       for a, b in zip(offsets[:-1], offsets[1:])])
    return float(lam + np.sum(w * spread) / np.sum(w))


def check_hessian_bounds(hessian: ArrayLike, lam: float, upper: float, rtol: float = 1e-9) -> np.ndarray:
    """Check that a Hessian [m, m] is symmetric with lam I <= H <= upper I (strong convexity with
    constant lam, and :func:`hessian_upper_bound`), up to ``rtol`` times max(1, upper).

    Returns:
        its eigenvalues, float64 [m] ascending.

    Raises:
        AssertionError: naming a non-finite entry or bound, the asymmetry, or the eigenvalue below
            lam or above ``upper``.
    """
    h = np.asarray(hessian, np.float64)
    if h.ndim != 2 or h.shape[0] != h.shape[1]:
        raise AssertionError(f"Hessian must be square [m, m], got shape {h.shape}")
    _finite("Hessian entry", h)
    _finite("bound (lam, upper)", np.asarray([lam, upper], np.float64))
    slack = rtol * max(1.0, abs(upper))
    asym = float(np.max(np.abs(h - h.T))) if h.size else 0.0
    if asym > slack:
        raise AssertionError(f"Hessian not symmetric: largest |H - H^T| entry {asym!r}")
    eig = np.linalg.eigvalsh(h)
    if eig[0] < lam - slack:
        raise AssertionError(f"smallest Hessian eigenvalue {eig[0]!r} below lam = {lam!r}")
    if eig[-1] > upper + slack:
        raise AssertionError(f"largest Hessian eigenvalue {eig[-1]!r} above the bound {upper!r}")
    return eig
