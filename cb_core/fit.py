"""Fitting a concept: minimise the strongly convex Eq. 6 objective, return alpha with a certificate.

One entry point, :func:`fit`. Two methods:

* ``"lbfgs"`` (default): optax L-BFGS with its zoom line search (strong Wolfe), the whole loop
  inside one jit-compiled ``lax.while_loop``; stops when ||grad|| <= tol, when an iteration
  makes no progress (float rounding floor), or at ``max_iter``.
* ``"adam"``: the seed paper's protocol (optax Adam, learning rate 0.01, alpha_0 = 0, at most
  1,500 steps, stop when ||grad|| < 1e-4), also one jitted ``lax.while_loop``.

Shapes are *bucketed* (rows T and decisions N rounded up, see
:func:`cb_core.decisions.bucket_size`) with zero-weight padding, so fits on nearby shapes reuse
compiled code. The data are standardised once per fit, inside the compiled function.

Every :class:`FitResult` carries a :class:`Certificate`: the final gradient norm, the
strong-convexity constant lam (H >= lam I holds by construction: H - lam I is a covariance, i.e.
a Gram matrix), the bound on the objective gap it implies, f(alpha) - f* <= ||g||^2 / (2 lam),
and (when cheap enough, or asked for) the measured smallest eigenvalue of the explicit Hessian.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import time
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.tree_utils as otu
from jax import lax

from cb_core.decisions import Decisions, bucket_size, validate_decisions
from cb_core.model import (Problem, make_problem, problem_hessian_factor, problem_objective)

__all__ = ["Certificate", "FitResult", "fit", "pad_to_buckets", "EXACT_EIG_MAX_DIM"]

#: smallest row bucket: every small problem (T <= 64, N <= 7) shares one compiled program per d
MIN_ROWS = 64

#: ``certify="auto"`` measures the Hessian's smallest eigenvalue when min(T, m) is at most this.
EXACT_EIG_MAX_DIM = 512


@dataclasses.dataclass(frozen=True)
class Certificate:
    """What a fit proves about its alpha (Eq. 6 objective, strongly convex with constant lam).

    Attributes:
        grad_norm: ||grad L(alpha)||_2 at the returned alpha (computed in the fit's dtype).
        lam: the strong-convexity constant: H >= lam I by construction.
        gap_bound: ||g||^2 / (2 lam) >= L(alpha) - L(alpha*) (strong convexity).
        distance_bound: ||g|| / lam >= ||alpha - alpha*||_2.
        min_hessian_eig: smallest eigenvalue of the explicit Hessian at alpha, measured via the
            smaller Gram matrix of its covariance factor (``eig_method="gram"``); None when not
            measured (``eig_method="structural"``: the bound H >= lam I is then the algebraic one).
        strongly_convex: min_hessian_eig >= lam up to rounding (True when not measured).
        eig_method: "gram" or "structural".
    """

    grad_norm: float
    lam: float
    gap_bound: float
    distance_bound: float
    min_hessian_eig: float | None
    strongly_convex: bool
    eig_method: str


@dataclasses.dataclass(frozen=True)
class FitResult:
    """The result of :func:`fit`.

    Attributes:
        alpha: [m = d + 1] numpy array, the concept (last entry: bias weight).
        loss: L(alpha) (Eq. 6, nats per decision, regulariser included).
        grad_norm: ||grad L(alpha)||_2.
        n_iter: optimiser iterations taken (L-BFGS steps or Adam steps).
        converged: grad_norm <= tol.
        method: "lbfgs" or "adam".
        certificate: see :class:`Certificate`.
        n_decisions, hidden_size: N and d of the data.
        seconds: wall time of the fit call (compilation included on a first call).
        settings: lam, gamma, eps, tol, max_iter, dtype.
    """

    alpha: np.ndarray
    loss: float
    grad_norm: float
    n_iter: int
    converged: bool
    method: str
    certificate: Certificate
    n_decisions: int
    hidden_size: int
    seconds: float
    settings: dict

    @property
    def min_hessian_eig(self) -> float | None:
        """The certificate's measured smallest Hessian eigenvalue (None if not measured)."""
        return self.certificate.min_hessian_eig

    def summary(self) -> str:
        """A short human-readable report of the fit and its certificate."""
        c = self.certificate
        eig = (f"{c.min_hessian_eig:.6g} (measured)" if c.min_hessian_eig is not None
               else f">= {c.lam:g} (by construction)")
        return (f"method={self.method} N={self.n_decisions} d={self.hidden_size} "
                f"iterations={self.n_iter} converged={self.converged}\n"
                f"loss={self.loss:.9g} grad_norm={self.grad_norm:.3e} "
                f"gap_bound={c.gap_bound:.3e} min_hessian_eig={eig} "
                f"time={self.seconds:.3f}s")


# ----------------------------------------------------------------------------------------------
# padding to buckets
# ----------------------------------------------------------------------------------------------

def pad_to_buckets(decisions: Decisions, dtype=np.float32):
    """Pad ragged decisions to bucketed (T_pad, N_pad) with zero-weight rows and decisions.

    T_pad = bucket_size(T, minimum=MIN_ROWS), N_pad = bucket_size(N + 1).
    Padded rows (hidden 0, log_q 0, n_tokens 1) all belong to the dummy decision N_pad - 1;
    decisions N..N_pad-1 get weight 0. Returns (padded Decisions, weight [N_pad]) as numpy.
    """
    t, n = decisions.n_rows, decisions.n_decisions
    t_pad, n_pad = bucket_size(t, minimum=MIN_ROWS), bucket_size(n + 1)
    d = decisions.hidden_size
    hidden = np.zeros((t_pad, d), dtype)
    hidden[:t] = decisions.hidden
    log_q = np.zeros(t_pad, dtype)
    log_q[:t] = decisions.log_q
    n_tokens = np.ones(t_pad, np.int32)
    n_tokens[:t] = decisions.n_tokens
    offsets = np.full(n_pad + 1, t, np.int32)
    offsets[: n + 1] = decisions.offsets
    offsets[-1] = t_pad
    seg = np.full(t_pad, n_pad - 1, np.int32)
    seg[:t] = decisions.segment_ids
    expert = np.zeros(n_pad, np.int32)
    expert[:n] = decisions.expert
    weight = np.zeros(n_pad, dtype)
    weight[:n] = 1.0
    return Decisions(hidden, log_q, n_tokens, offsets, seg, expert), weight


# ----------------------------------------------------------------------------------------------
# the compiled loops
# ----------------------------------------------------------------------------------------------

@functools.partial(jax.jit, static_argnames=("memory_size", "max_linesearch_steps"))
def _lbfgs(dec, weight, n_real, lam, gamma, eps, tol, max_iter, patience, *, memory_size,
           max_linesearch_steps):
    prob = make_problem(dec, gamma, eps, weight, n_real)
    fun = lambda a: problem_objective(a, prob, lam)  # noqa: E731
    opt = optax.lbfgs(
        memory_size=memory_size,
        linesearch=optax.scale_by_zoom_linesearch(max_linesearch_steps=max_linesearch_steps),
    )
    value_and_grad = optax.value_and_grad_from_state(fun)
    alpha0 = jnp.zeros(dec.hidden.shape[1] + 1, dec.hidden.dtype)
    state0 = opt.init(alpha0)
    v0, g0 = jax.value_and_grad(fun)(alpha0)

    # carry: (alpha, state, best_alpha, best_gnorm, best_value, steps without progress)
    # Progress = a smaller gradient norm, or a decrease of the objective beyond its rounding
    # noise. In float32 near the optimum the objective's rounding noise exceeds its decrease
    # while the gradient stays informative, so the iterate returned is the one with the smallest
    # gradient norm (the best certificate), and `patience` steps without progress stop the loop.
    noise = 8 * jnp.finfo(alpha0.dtype).eps

    def cond(carry):
        _, state, _, best_g, _, since = carry
        k = otu.tree_get(state, "count")
        return (k < max_iter) & (best_g > tol) & (since < patience)

    def body(carry):
        alpha, state, best_a, best_g, best_v, since = carry
        value, grad = value_and_grad(alpha, state=state)
        updates, state = opt.update(grad, state, alpha, value=value, grad=grad, value_fn=fun)
        alpha = optax.apply_updates(alpha, updates)
        new_v = otu.tree_get(state, "value")
        new_g = jnp.linalg.norm(otu.tree_get(state, "grad"))
        finite = jnp.isfinite(new_v) & jnp.isfinite(new_g)
        better_g = finite & (new_g < best_g)
        better_v = finite & (new_v < best_v - noise * jnp.abs(best_v))
        best_a = jnp.where(better_g, alpha, best_a)
        best_g = jnp.where(better_g, new_g, best_g)
        best_v = jnp.where(better_v, new_v, best_v)
        since = jnp.where(better_g | better_v, 0, since + 1)
        return alpha, state, best_a, best_g, best_v, since

    carry = (alpha0, state0, alpha0, jnp.linalg.norm(g0), v0, jnp.asarray(0, jnp.int32))
    _, state, alpha, _, _, _ = lax.while_loop(cond, body, carry)
    value, grad = jax.value_and_grad(fun)(alpha)
    return alpha, value, jnp.linalg.norm(grad), otu.tree_get(state, "count")


@jax.jit
def _adam(dec, weight, n_real, lam, gamma, eps, tol, max_iter, learning_rate):
    prob = make_problem(dec, gamma, eps, weight, n_real)
    fun = lambda a: problem_objective(a, prob, lam)  # noqa: E731
    opt = optax.adam(learning_rate)
    alpha0 = jnp.zeros(dec.hidden.shape[1] + 1, dec.hidden.dtype)
    v0, g0 = jax.value_and_grad(fun)(alpha0)

    def cond(carry):
        _, _, k, _, g = carry
        return (k < max_iter) & (jnp.linalg.norm(g) >= tol)

    def body(carry):
        alpha, state, k, _, g = carry
        updates, state = opt.update(g, state, alpha)
        alpha = optax.apply_updates(alpha, updates)
        v, g = jax.value_and_grad(fun)(alpha)
        return alpha, state, k + 1, v, g

    carry = (alpha0, opt.init(alpha0), jnp.asarray(0, jnp.int32), v0, g0)
    alpha, _, k, v, g = lax.while_loop(cond, body, carry)
    return alpha, v, jnp.linalg.norm(g), k


@jax.jit
def _gram_min_eig(alpha, dec, weight, n_real, lam, gamma, eps):
    """Smallest eigenvalue of H = B^T B + lam I via the smaller Gram matrix of B [T, m]."""
    prob = make_problem(dec, gamma, eps, weight, n_real)
    b = problem_hessian_factor(alpha, prob)
    t, m = b.shape
    if t < m:  # B^T B has m - rank >= m - t zero eigenvalues; the others are those of B B^T
        w = jnp.linalg.eigvalsh(b @ b.T)
        low = jnp.minimum(w[0], 0.0)
    else:
        w = jnp.linalg.eigvalsh(b.T @ b)
        low = w[0]
    return lam + low, lam + w[-1]


def _x64_context(dtype):
    if jnp.dtype(dtype) != jnp.float64 or jax.config.jax_enable_x64:
        return contextlib.nullcontext()
    enable = getattr(jax, "enable_x64", None)
    if enable is None:  # older JAX
        from jax.experimental import enable_x64 as enable
        return enable()
    return enable(True)


def fit(
    decisions: Decisions,
    lam: float = 1.0,
    gamma: float = 0.8,
    eps: float = 1e-6,
    method: Literal["lbfgs", "adam"] = "lbfgs",
    max_iter: int | None = None,
    tol: float | None = None,
    dtype=jnp.float32,
    *,
    learning_rate: float = 0.01,
    memory_size: int = 10,
    max_linesearch_steps: int = 30,
    patience: int = 10,
    certify: Literal["auto", "exact", "structural"] = "auto",
) -> FitResult:
    """Fit the concept alpha by minimising Eq. 6 (strongly convex; unique optimum).

    Args:
        decisions: ragged decisions (validated here).
        lam: L2 strength lam > 0 (also the strong-convexity constant).
        gamma: length-normalisation exponent of the prior (App. B).
        eps: floor of the per-coordinate std in the features (App. B).
        method: "lbfgs" (default) or "adam" (the seed protocol).
        max_iter: iteration cap; default 500 for L-BFGS, 1500 for Adam.
        tol: gradient-norm tolerance; the fit counts as converged when ||grad|| <= tol.
            Default: Adam 1e-4 (the seed's); L-BFGS 1e-3 in float32 (certified objective gap
            <= 5e-7 / lam; float32 rounding puts the gradient floor near 1e-4..1e-3 at d ~ 5k)
            and 1e-7 in float64.
        dtype: jnp.float32 (default) or jnp.float64 (x64 is enabled for this call only).
        learning_rate: Adam's learning rate (seed: 0.01).
        memory_size: L-BFGS history length.
        max_linesearch_steps: zoom line-search evaluations per L-BFGS step.
        patience: L-BFGS stops after this many steps with neither a smaller gradient norm nor
            an objective decrease above rounding noise (the float floor); it returns the iterate
            with the smallest gradient norm.
        certify: "auto" measures the Hessian's smallest eigenvalue when min(T, m) <=
            EXACT_EIG_MAX_DIM, "exact" always, "structural" never.

    Returns:
        FitResult with alpha [d + 1] (numpy, ``dtype``) and its :class:`Certificate`.

    Raises:
        ValueError: lam <= 0 or non-finite, gamma/eps/tol invalid, unknown method or dtype,
            or bad decisions (naming the decision at fault).
    """
    if not (isinstance(lam, (int, float, np.floating)) and math.isfinite(lam) and lam > 0):
        raise ValueError(f"lam must be a finite number > 0, got {lam!r}")
    if not (math.isfinite(gamma) and gamma >= 0):
        raise ValueError(f"gamma must be finite and >= 0, got {gamma!r}")
    if not (math.isfinite(eps) and eps > 0):
        raise ValueError(f"eps must be finite and > 0, got {eps!r}")
    if method not in ("lbfgs", "adam"):
        raise ValueError(f"method must be 'lbfgs' or 'adam', got {method!r}")
    if certify not in ("auto", "exact", "structural"):
        raise ValueError(f"certify must be 'auto', 'exact' or 'structural', got {certify!r}")
    dt = jnp.dtype(dtype)
    if dt not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.float64)):
        raise ValueError(f"dtype must be float32 or float64, got {dt}")
    if tol is None:
        tol = 1e-4 if method == "adam" else (1e-3 if dt == jnp.dtype(jnp.float32) else 1e-7)
    tol = float(tol)
    if not tol >= 0:
        raise ValueError(f"tol must be >= 0, got {tol!r}")
    max_iter = (500 if method == "lbfgs" else 1500) if max_iter is None else int(max_iter)
    if max_iter < 0:
        raise ValueError(f"max_iter must be >= 0, got {max_iter}")
    if not isinstance(decisions, Decisions):
        raise ValueError(f"decisions must be a cb_core.Decisions, got {type(decisions).__name__}")
    start = time.perf_counter()
    dec = validate_decisions(decisions)
    padded, weight = pad_to_buckets(dec, np.dtype(dt.name))
    with _x64_context(dt):
        args = (padded, weight, np.asarray(dec.n_decisions, dt), np.asarray(lam, dt),
                np.asarray(gamma, dt), np.asarray(eps, dt), np.asarray(tol, dt),
                np.asarray(max_iter, np.int32))
        if method == "lbfgs":
            alpha, value, gnorm, k = _lbfgs(*args, np.asarray(patience, np.int32),
                                            memory_size=memory_size,
                                            max_linesearch_steps=max_linesearch_steps)
        else:
            alpha, value, gnorm, k = _adam(*args, np.asarray(learning_rate, dt))
        m = dec.hidden_size + 1
        measure = certify == "exact" or (certify == "auto"
                                         and min(padded.n_rows, m) <= EXACT_EIG_MAX_DIM)
        if measure:
            low, high = _gram_min_eig(alpha, *args[:6])
            min_eig, max_eig = float(low), float(high)
        alpha = np.asarray(alpha)
        value, gnorm, k = float(value), float(gnorm), int(k)
    if measure:
        rounding = math.sqrt(float(jnp.finfo(dt).eps)) * max(1.0, max_eig)
        strongly_convex = min_eig >= lam - rounding
    else:
        min_eig, strongly_convex = None, True
    cert = Certificate(grad_norm=gnorm, lam=float(lam), gap_bound=gnorm**2 / (2 * lam),
                       distance_bound=gnorm / lam, min_hessian_eig=min_eig,
                       strongly_convex=strongly_convex,
                       eig_method="gram" if measure else "structural")
    settings = dict(lam=float(lam), gamma=float(gamma), eps=float(eps), tol=tol,
                    max_iter=max_iter, dtype=dt.name, method=method)
    if method == "adam":
        settings["learning_rate"] = float(learning_rate)
    return FitResult(alpha=alpha, loss=value, grad_norm=gnorm, n_iter=k,
                     converged=bool(gnorm <= tol), method=method, certificate=cert,
                     n_decisions=dec.n_decisions, hidden_size=dec.hidden_size,
                     seconds=time.perf_counter() - start, settings=settings)
