"""Fitting a concept: minimise the strongly convex Eq. 6 objective, return alpha with a certificate.

One entry point, :func:`fit` ``(decisions, solver=..., lam=..., gamma=..., eps=...)``, and one
frozen solver object per method (hyperparameters only; the state of a run lives in a NamedTuple
inside one jit-compiled ``lax.while_loop``):

* :class:`Subspace`: sequential subspace optimisation: each step minimises Eq. 6 exactly over
  span{gradient, last ``memory`` steps} by a few damped Newton iterations in those coordinates
  (two passes over the hidden states per step; the images Phi d of the kept steps are stored).
* :class:`Newton`: Newton-CG. Each step solves H d = -g by conjugate gradients with
  Hessian-vector products (two passes over the hidden states each, :func:`cb_core.model.hvp`),
  to the forcing tolerance max(min(forcing, sqrt(||g||)) ||g||, tol / 4), then an exact line
  search along d
  (Phi d is accumulated inside CG, so the search costs no pass).
* :class:`LBFGS`: optax L-BFGS with its zoom line search (strong Wolfe).
* :class:`Adam`: the seed paper's protocol (optax Adam, learning rate 0.01, alpha_0 = 0, at most
  1,500 steps, stop when ||grad|| < 1e-4).

The decisions are padded once, on the host, to shape buckets
(:func:`cb_core.decisions.to_padded`), so fits on nearby shapes reuse compiled code; the
features' statistics are computed once per fit inside the compiled function.

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
from typing import Any, ClassVar, Literal, NamedTuple, Union

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from cb_core.cache import call_compiled
from cb_core.decisions import Decisions, to_padded, validate_decisions
from cb_core.model import (Problem, _expert_nll, _log_softmax, _matvec, _rmatvec, hessian_factor,
                           prepare, problem_objective, value_and_grad, value_and_grad_at)

__all__ = ["Adam", "Certificate", "FitResult", "LBFGS", "Newton", "Solver", "Subspace", "fit",
           "EXACT_EIG_MAX_DIM", "DEFAULT_SOLVER"]

#: ``certify="auto"`` measures the Hessian's smallest eigenvalue when min(T_pad, m) is at most this.
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
        n_iter: solver iterations (subspace, Newton, L-BFGS or Adam steps).
        converged: grad_norm <= tol.
        method: the solver's name ("subspace", "newton", "lbfgs" or "adam").
        certificate: see :class:`Certificate`.
        n_decisions, hidden_size: N and d of the data.
        seconds: wall time of the fit call (compilation included on a first call).
        settings: lam, gamma, eps, tol, dtype, method and the solver's hyperparameters.
        n_hvp: Hessian-vector products (CG iterations) of a Newton fit, else 0.
        n_passes: passes over the [N, M, d] hidden states made by the compiled fit (the
            features' statistics included; a fit is memory-bound, so this is its cost); None
            for lbfgs (its line search's evaluations are not counted).
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
    n_hvp: int = 0
    n_passes: int | None = None

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


class SolverOutput(NamedTuple):
    """What a solver's compiled loop returns (arrays)."""

    alpha: Any  # [m]
    value: Any  # []
    grad_norm: Any  # []
    n_iter: Any  # [] int32
    n_hvp: Any  # [] int32
    n_passes: Any  # [] int32, passes over the hidden states (-1: not counted)


def _default_tol(dtype) -> float:
    # float32 rounding puts the gradient floor near 1e-4..1e-3 at d ~ 5k; 1e-3 certifies an
    # objective gap <= 5e-7 / lam.
    return 1e-3 if jnp.dtype(dtype) == jnp.float32 else 1e-7


# ----------------------------------------------------------------------------------------------
# the solvers
# ----------------------------------------------------------------------------------------------

class _Progress(NamedTuple):
    """Best iterate so far: a float32 fit near the optimum stalls at the rounding floor, where
    the objective's noise exceeds its decrease while the gradient norm stays informative."""

    alpha: Any
    grad_norm: Any
    value: Any
    stalled: Any  # steps with neither a smaller gradient norm nor a decrease beyond noise

    @classmethod
    def start(cls, alpha, grad_norm, value):
        return cls(alpha, grad_norm, value, jnp.asarray(0, jnp.int32))

    def update(self, alpha, grad_norm, value):
        noise = 8 * jnp.finfo(alpha.dtype).eps
        finite = jnp.isfinite(value) & jnp.isfinite(grad_norm)
        better_g = finite & (grad_norm < self.grad_norm)
        better_v = finite & (value < self.value - noise * jnp.abs(self.value))
        return _Progress(jnp.where(better_g, alpha, self.alpha),
                         jnp.where(better_g, grad_norm, self.grad_norm),
                         jnp.where(better_v, value, self.value),
                         jnp.where(better_g | better_v, 0, self.stalled + 1))


@dataclasses.dataclass(frozen=True)
class Newton:
    """Newton-CG with an exact line search (the objective is smooth and strongly convex).

    Attributes:
        tol: gradient-norm tolerance (default: 1e-3 in float32, 1e-7 in float64).
        max_iter: Newton steps.
        max_cg: conjugate-gradient iterations (Hessian-vector products) per step.
        forcing: CG stops when its residual is <= max(min(forcing, sqrt(||g||)) ||g||, tol / 4)
            (superlinear local convergence; no solve beyond what the tolerance needs).
        line_search_steps: safeguarded 1-D Newton steps of the line search (no passes).
        patience: stop after this many steps without progress (the float rounding floor);
            the iterate with the smallest gradient norm is returned.
    """

    tol: float | None = None
    max_iter: int = 50
    max_cg: int = 200
    forcing: float = 0.5
    line_search_steps: int = 8
    patience: int = 3
    name: ClassVar[str] = "newton"

    def minimise(self, p: Problem, lam, tol) -> SolverOutput:
        m = p.hidden.shape[2] + 1
        dtype = p.hidden.dtype
        alpha0 = jnp.zeros(m, dtype)

        class Loop(NamedTuple):
            alpha: Any
            scores: Any  # [N, M] at alpha
            grad: Any  # [m] at alpha
            best: _Progress
            k: Any
            n_hvp: Any

        def cg(grad, prob, gnorm):
            """x ~ -H^{-1} g and u = Phi x (accumulated from the HVPs' Phi p)."""
            # a residual below tol / 4 already makes the next gradient about that small
            target = jnp.maximum(jnp.minimum(self.forcing, jnp.sqrt(gnorm)) * gnorm, 0.25 * tol)

            def hv(v):
                u = _matvec(v, p)
                z = prob * (u - jnp.sum(prob * u, axis=-1, keepdims=True))
                return u, _rmatvec(p.weight[:, None] * z, p) + lam * v

            class CG(NamedTuple):
                x: Any
                u: Any
                r: Any
                d: Any
                rr: Any
                j: Any

            def cond(c):
                return (c.j < self.max_cg) & (jnp.sqrt(c.rr) > target)

            def body(c):
                ud, hd = hv(c.d)
                a = c.rr / jnp.vdot(c.d, hd)
                r = c.r - a * hd
                rr = jnp.vdot(r, r)
                return CG(c.x + a * c.d, c.u + a * ud, r, r + (rr / c.rr) * c.d, rr, c.j + 1)

            r0 = -grad
            out = lax.while_loop(cond, body, CG(jnp.zeros_like(grad), jnp.zeros_like(p.prior), r0,
                                                r0, jnp.vdot(r0, r0), jnp.asarray(0, jnp.int32)))
            return out.x, out.u, out.j

        def line_search(alpha, s, x, u):
            """argmin_t L(alpha + t x) by safeguarded 1-D Newton (f' and f'' cost O(N M))."""
            ax, xx = jnp.vdot(alpha, x), jnp.vdot(x, x)
            chosen = jnp.take_along_axis(u, p.expert[:, None], axis=1)[:, 0]

            def derivatives(t):
                prob = jnp.exp(_log_softmax(s + t * u, p))
                mean = jnp.sum(prob * u, axis=-1)
                var = jnp.sum(prob * (u - mean[:, None]) ** 2, axis=-1)
                return (jnp.sum(p.weight * (mean - chosen)) + lam * (ax + t * xx),
                        jnp.sum(p.weight * var) + lam * xx)

            def step(_, carry):
                t, lo, hi = carry
                d1, d2 = derivatives(t)
                lo = jnp.where(d1 < 0, t, lo)
                hi = jnp.where(d1 < 0, hi, t)
                tn = t - d1 / d2
                inside = (tn > lo) & (tn < hi)
                tn = jnp.where(inside, tn, jnp.where(jnp.isfinite(hi), 0.5 * (lo + hi), 2 * t))
                return tn, lo, hi

            one = jnp.asarray(1.0, dtype)
            t, _, _ = lax.fori_loop(0, self.line_search_steps, step,
                                    (one, jnp.zeros_like(one), jnp.asarray(jnp.inf, dtype)))
            return t

        def cond(c: Loop):
            return (c.k < self.max_iter) & (c.best.grad_norm > tol) & (c.best.stalled < self.patience)

        def body(c: Loop):
            prob = jnp.exp(_log_softmax(c.scores, p))
            x, u, j = cg(c.grad, prob, jnp.linalg.norm(c.grad))
            t = line_search(c.alpha, c.scores, x, u)
            alpha, s = c.alpha + t * x, c.scores + t * u  # Phi x came with CG: no pass here
            value, grad = value_and_grad_at(alpha, s, p, lam)
            return Loop(alpha, s, grad, c.best.update(alpha, jnp.linalg.norm(grad), value),
                        c.k + 1, c.n_hvp + j)

        s0 = jnp.where(p.mask, p.prior, 0.0)  # the scores at alpha0 = 0: no pass
        v0, g0 = value_and_grad_at(alpha0, s0, p, lam)
        start = Loop(alpha0, s0, g0, _Progress.start(alpha0, jnp.linalg.norm(g0), v0),
                     jnp.asarray(0, jnp.int32), jnp.asarray(0, jnp.int32))
        out = lax.while_loop(cond, body, start)
        # the certificate's gradient from scratch (the tracked scores carry rounding drift)
        value, grad = value_and_grad(out.best.alpha, p, lam)
        # passes: the first gradient, per step its HVPs (2 each) and gradient, the last gradient
        return SolverOutput(out.best.alpha, value, jnp.linalg.norm(grad), out.k, out.n_hvp,
                            1 + 2 * out.n_hvp + out.k + 2)


def _spd_solve(a, b):
    """x = a^{-1} b for a small SPD [k, k] matrix, by an unrolled Cholesky (no LAPACK custom
    call, so the compiled fit stays storable; k is static and small)."""
    k = a.shape[0]
    cols = []
    for j in range(k):  # L column by column
        lj = a[:, j] - sum((cols[i] * cols[i][j] for i in range(j)), jnp.zeros_like(b))
        d = jnp.sqrt(jnp.maximum(lj[j], jnp.finfo(b.dtype).tiny))
        cols.append(jnp.where(jnp.arange(k) >= j, lj / d, 0.0))
    low = jnp.stack(cols, axis=1)
    y = []
    for i in range(k):  # L y = b
        y.append((b[i] - sum((low[i, j] * y[j] for j in range(i)), 0.0)) / low[i, i])
    x = [None] * k
    for i in reversed(range(k)):  # L^T x = y
        x[i] = (y[i] - sum((low[j, i] * x[j] for j in range(i + 1, k)), 0.0)) / low[i, i]
    return jnp.stack(x)


@dataclasses.dataclass(frozen=True)
class Subspace:
    """Newton in a subspace (sequential subspace optimisation): each step minimises Eq. 6
    exactly over span{gradient, last ``memory`` steps} by damped Newton in those few
    coordinates.

    Costs per step: one pass for the gradient and one for Phi g; the images Phi d of the past
    steps are kept ([N, M, memory] floats), so the inner Newton iterations cost O(N M memory^2)
    and no pass. On a quadratic with memory 1 this is conjugate gradients; unlike Newton-CG it
    keeps its Krylov directions from one step to the next and re-linearises at every step.

    Attributes:
        tol: gradient-norm tolerance (default: 1e-3 in float32, 1e-7 in float64).
        max_iter: steps.
        memory: past steps kept in the subspace.
        inner: at most this many damped Newton iterations of the subspace problem per step;
            they stop earlier once the Newton decrement g^T H^-1 g of the subspace problem is
            at most ``(tol / 10)**2 / lam`` (each inner iteration costs no pass, but a fixed
            dispatch time).
        patience: stop after this many steps without progress (the float rounding floor);
            the iterate with the smallest gradient norm is returned.
    """

    tol: float | None = None
    max_iter: int = 500
    memory: int = 8
    inner: int = 6
    patience: int = 10
    name: ClassVar[str] = "subspace"

    def minimise(self, p: Problem, lam, tol) -> SolverOutput:
        m = p.hidden.shape[2] + 1
        dtype = p.hidden.dtype
        n, slots = p.prior.shape
        k = self.memory + 1
        onehot = (jnp.arange(slots)[None, :] == p.expert[:, None]).astype(dtype)

        class Loop(NamedTuple):
            alpha: Any
            scores: Any  # [N, M] at alpha (tracked)
            grad: Any
            steps: Any  # [m, memory] past steps, newest first
            images: Any  # [N, M, memory] their Phi d
            best: _Progress
            k: Any

        def sub_value(c, s, w, da, gram):
            """Eq. 6 at alpha + D c (up to the constant lam/2 ||alpha||^2)."""
            return _expert_nll(s + w @ c, p) + lam * (da @ c + 0.5 * c @ gram @ c)

        def sub_derivatives(c, s, w, da, gram):
            prob = jnp.exp(_log_softmax(s + w @ c, p))
            r = p.weight[:, None] * (prob - onehot) * p.mask
            grad = jnp.einsum("nmk,nm->k", w, r) + lam * (da + gram @ c)
            wp = jnp.einsum("nmk,nm->nk", w, prob)
            cov = (jnp.einsum("nmk,nml->kl", w * (p.weight[:, None] * prob)[..., None], w)
                   - jnp.einsum("nk,nl->kl", wp * p.weight[:, None], wp))
            return grad, cov + lam * gram

        # the subspace problem is solved once its Newton decrement g^T H^-1 g (computed from
        # the derivatives, not from differences of rounded objective values) is below what the
        # outer tolerance can see: its gradient is then below tol / 10 in the H^-1 norm
        decrement_tol = (0.1 * tol) ** 2 / lam

        def inner_cond(c_args):
            j, slope = c_args[:2]
            return (j < self.inner) & (slope > decrement_tol)

        def inner_step(c_args):
            j, _, c, s, w, da, gram = c_args
            grad, hess = sub_derivatives(c, s, w, da, gram)
            hess = hess + 1e-6 * jnp.trace(hess) / k * jnp.eye(k, dtype=dtype)
            delta = _spd_solve(hess, grad)
            f0, slope = sub_value(c, s, w, da, gram), grad @ delta

            def shorter(t):  # backtracking (Armijo) keeps every inner step a decrease
                return (t > 1e-4) & (sub_value(c - t * delta, s, w, da, gram)
                                     > f0 - 1e-4 * t * slope)

            t = lax.while_loop(shorter, lambda t: 0.5 * t, jnp.asarray(1.0, dtype))
            return j + 1, slope, c - t * delta, s, w, da, gram

        def cond(c: Loop):
            return (c.k < self.max_iter) & (c.best.grad_norm > tol) & (c.best.stalled < self.patience)

        def body(c: Loop):
            d = jnp.concatenate([c.grad[:, None], c.steps], axis=1)  # [m, k]
            w = jnp.concatenate([_matvec(c.grad, p)[..., None], c.images], axis=2)
            scale = 1.0 / jnp.maximum(jnp.linalg.norm(d, axis=0), jnp.finfo(dtype).tiny)
            d, w = d * scale, w * scale
            coef = lax.while_loop(inner_cond, inner_step,
                                  (jnp.asarray(0, jnp.int32), jnp.asarray(jnp.inf, dtype), jnp.zeros(k, dtype),
                                   c.scores, w, d.T @ c.alpha, d.T @ d))[2]
            step, image = d @ coef, w @ coef
            alpha, s = c.alpha + step, c.scores + image
            value, grad = value_and_grad_at(alpha, s, p, lam)
            return Loop(alpha, s, grad, jnp.concatenate([step[:, None], c.steps[:, :-1]], axis=1),
                        jnp.concatenate([image[..., None], c.images[..., :-1]], axis=2),
                        c.best.update(alpha, jnp.linalg.norm(grad), value), c.k + 1)

        alpha0 = jnp.zeros(m, dtype)
        s0 = jnp.where(p.mask, p.prior, 0.0)  # the scores at alpha0 = 0: no pass
        v0, g0 = value_and_grad_at(alpha0, s0, p, lam)
        start = Loop(alpha0, s0, g0, jnp.zeros((m, self.memory), dtype),
                     jnp.zeros((n, slots, self.memory), dtype),
                     _Progress.start(alpha0, jnp.linalg.norm(g0), v0), jnp.asarray(0, jnp.int32))
        out = lax.while_loop(cond, body, start)
        value, grad = value_and_grad(out.best.alpha, p, lam)  # from scratch: no tracked drift
        # passes: the first gradient, two per step, the last gradient
        return SolverOutput(out.best.alpha, value, jnp.linalg.norm(grad), out.k,
                            jnp.asarray(0, jnp.int32), 1 + 2 * out.k + 2)


@dataclasses.dataclass(frozen=True)
class LBFGS:
    """optax L-BFGS with the zoom line search (strong Wolfe), in one compiled loop.

    Attributes:
        tol: gradient-norm tolerance (default: 1e-3 in float32, 1e-7 in float64).
        max_iter: L-BFGS steps.
        memory_size: history length.
        max_linesearch_steps: zoom line-search evaluations per step.
        patience: stop after this many steps with neither a smaller gradient norm nor an
            objective decrease above rounding noise (the float floor); the iterate with the
            smallest gradient norm is returned.
    """

    tol: float | None = None
    max_iter: int = 500
    memory_size: int = 10
    max_linesearch_steps: int = 30
    patience: int = 10
    name: ClassVar[str] = "lbfgs"

    def minimise(self, p: Problem, lam, tol) -> SolverOutput:
        import optax  # here: a Newton (default, one-off CLI) or subspace fit never imports it
        import optax.tree_utils as otu

        fun = lambda a: problem_objective(a, p, lam)  # noqa: E731
        opt = optax.lbfgs(
            memory_size=self.memory_size,
            linesearch=optax.scale_by_zoom_linesearch(
                max_linesearch_steps=self.max_linesearch_steps),
        )
        value_and_grad_fn = optax.value_and_grad_from_state(fun)
        alpha0 = jnp.zeros(p.hidden.shape[2] + 1, p.hidden.dtype)

        class Loop(NamedTuple):
            alpha: Any
            state: Any
            best: _Progress

        def cond(c: Loop):
            k = otu.tree_get(c.state, "count")
            return (k < self.max_iter) & (c.best.grad_norm > tol) & (c.best.stalled < self.patience)

        def body(c: Loop):
            value, grad = value_and_grad_fn(c.alpha, state=c.state)
            updates, state = opt.update(grad, c.state, c.alpha, value=value, grad=grad,
                                        value_fn=fun)
            alpha = optax.apply_updates(c.alpha, updates)
            new_g = jnp.linalg.norm(otu.tree_get(state, "grad"))
            return Loop(alpha, state, c.best.update(alpha, new_g, otu.tree_get(state, "value")))

        v0, g0 = value_and_grad(alpha0, p, lam)
        out = lax.while_loop(cond, body, Loop(alpha0, opt.init(alpha0),
                                              _Progress.start(alpha0, jnp.linalg.norm(g0), v0)))
        value, grad = value_and_grad(out.best.alpha, p, lam)
        return SolverOutput(out.best.alpha, value, jnp.linalg.norm(grad),
                            otu.tree_get(out.state, "count"), jnp.asarray(0, jnp.int32),
                            jnp.asarray(-1, jnp.int32))


@dataclasses.dataclass(frozen=True)
class Adam:
    """The seed paper's protocol: optax Adam from alpha = 0, stop when ||grad|| < tol.

    Attributes:
        learning_rate: seed 0.01.
        tol: gradient-norm tolerance (seed 1e-4).
        max_iter: Adam steps (seed 1,500).
    """

    learning_rate: float = 0.01
    tol: float | None = 1e-4
    max_iter: int = 1500
    name: ClassVar[str] = "adam"

    def minimise(self, p: Problem, lam, tol) -> SolverOutput:
        import optax

        opt = optax.adam(self.learning_rate)
        alpha0 = jnp.zeros(p.hidden.shape[2] + 1, p.hidden.dtype)

        class Loop(NamedTuple):
            alpha: Any
            state: Any
            k: Any
            value: Any
            grad: Any

        def cond(c: Loop):
            return (c.k < self.max_iter) & (jnp.linalg.norm(c.grad) >= tol)

        def body(c: Loop):
            updates, state = opt.update(c.grad, c.state, c.alpha)
            alpha = optax.apply_updates(c.alpha, updates)
            value, grad = value_and_grad(alpha, p, lam)
            return Loop(alpha, state, c.k + 1, value, grad)

        v0, g0 = value_and_grad(alpha0, p, lam)
        out = lax.while_loop(cond, body, Loop(alpha0, opt.init(alpha0), jnp.asarray(0, jnp.int32),
                                              v0, g0))
        return SolverOutput(out.alpha, out.value, jnp.linalg.norm(out.grad), out.k,
                            jnp.asarray(0, jnp.int32), 2 * (out.k + 1))


Solver = Union[Subspace, Newton, LBFGS, Adam]

#: the default solver of :func:`fit`: Newton-CG. Subspace needs fewer passes over the hidden
#: states (README "Fit speed") but was not faster in wall time in every case there (its inner
#: iterations cost time at small sizes), and Newton-CG stops with the smaller gap
DEFAULT_SOLVER: Solver = Newton()


# ----------------------------------------------------------------------------------------------
# the compiled programs
# ----------------------------------------------------------------------------------------------

@functools.partial(jax.jit, static_argnums=0)
def _solve(solver: Solver, padded, lam, gamma, eps, tol) -> tuple[SolverOutput, Any]:
    """(the solver's output, [N_pad] bool: the decision's hidden states are finite)."""
    p = prepare(padded, gamma, eps)
    # a non-finite hidden state makes its set's mean non-finite: the statistics' pass doubles as
    # the input check (fit() names the culprit); an overflow there only costs a host re-check
    finite = jnp.all(jnp.isfinite(p.mean), axis=1)
    out = solver.minimise(p, lam, tol)
    # + the features' statistics (one pass)
    return out._replace(n_passes=jnp.where(out.n_passes >= 0, out.n_passes + 1, -1)), finite


@jax.jit
def _gram(alpha, padded, gamma, eps):
    """The smaller Gram matrix of the Hessian's covariance factor B (H = B^T B + lam I):
    B B^T [T_pad, T_pad] when T_pad < m, else B^T B [m, m]."""
    b = hessian_factor(alpha, prepare(padded, gamma, eps))
    return b @ b.T if b.shape[0] < b.shape[1] else b.T @ b


def _hessian_eig_range(gram: np.ndarray, lam: float, m: int) -> tuple[float, float]:
    """(smallest, largest) eigenvalue of H from the Gram matrix (host LAPACK: the compiled
    program stays free of custom calls, so the executable store can keep it)."""
    w = np.linalg.eigvalsh(np.asarray(gram, np.float64))
    # B^T B has m - rank >= m - T_pad zero eigenvalues; the others are those of B B^T
    low = min(w[0], 0.0) if gram.shape[0] < m else w[0]
    return lam + float(low), lam + float(w[-1])


def _x64_context(dtype):
    if jnp.dtype(dtype) != jnp.float64 or jax.config.jax_enable_x64:
        return contextlib.nullcontext()
    return jax.enable_x64(True)


def _check_number(name: str, value: Any, low: float, strict: bool) -> float:
    ok = isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool)
    if ok:
        value = float(value)
        ok = math.isfinite(value) and (value > low if strict else value >= low)
    if not ok:
        raise ValueError(f"{name} must be a finite number {'>' if strict else '>='} {low:g}, "
                         f"got {value!r}")
    return value


def fit(
    decisions: Decisions,
    solver: Solver = DEFAULT_SOLVER,
    *,
    lam: float = 1.0,
    gamma: float = 0.8,
    eps: float = 1e-6,
    dtype: Any = jnp.float32,
    certify: Literal["auto", "exact", "structural"] = "auto",
) -> FitResult:
    """Fit the concept alpha by minimising Eq. 6 (strongly convex; unique optimum).

    Args:
        decisions: ragged decisions (validated here).
        solver: :class:`Subspace`, :class:`Newton`, :class:`LBFGS` or :class:`Adam`
            (hyperparameters, tolerance and iteration cap); default :data:`DEFAULT_SOLVER`
            (``Newton()``). A solver's ``tol=None`` means 1e-3 in float32 (certified
            objective gap <= 5e-7 / lam) and 1e-7 in float64.
        lam: L2 strength lam > 0 (also the strong-convexity constant).
        gamma: length-normalisation exponent of the prior (App. B), >= 0.
        eps: floor of the per-coordinate std in the features (App. B), > 0.
        dtype: jnp.float32 (default) or jnp.float64 (x64 is enabled for this call only).
        certify: "auto" measures the Hessian's smallest eigenvalue when min(T_pad, m) <=
            EXACT_EIG_MAX_DIM, "exact" always, "structural" never.

    Returns:
        FitResult with alpha [d + 1] (numpy, ``dtype``) and its :class:`Certificate`.

    Raises:
        ValueError: lam <= 0 or non-finite, gamma/eps/tol/max_iter (or Subspace memory/inner)
            invalid, unknown solver or dtype, or bad decisions (naming the decision at fault;
            a non-finite hidden state is found by the compiled fit's first pass).
    """
    lam = _check_number("lam", lam, 0.0, strict=True)
    gamma = _check_number("gamma", gamma, 0.0, strict=False)
    eps = _check_number("eps", eps, 0.0, strict=True)
    if not isinstance(solver, (Subspace, Newton, LBFGS, Adam)):
        raise ValueError("solver must be cb_core.Subspace(), Newton(), LBFGS() or Adam(), "
                         f"got {solver!r}")
    if certify not in ("auto", "exact", "structural"):
        raise ValueError(f"certify must be 'auto', 'exact' or 'structural', got {certify!r}")
    dt = jnp.dtype(dtype)
    if dt not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.float64)):
        raise ValueError(f"dtype must be float32 or float64, got {dt}")
    tol = _check_number("tol", _default_tol(dt) if solver.tol is None else solver.tol, 0.0,
                        strict=False)
    if not (isinstance(solver.max_iter, int) and solver.max_iter >= 0):
        raise ValueError(f"max_iter must be an int >= 0, got {solver.max_iter!r}")
    if isinstance(solver, Subspace):
        for name in ("memory", "inner"):
            value = getattr(solver, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"Subspace {name} must be an int >= 1, got {value!r}")
    if not isinstance(decisions, Decisions):
        raise ValueError(f"decisions must be a cb_core.Decisions, got {type(decisions).__name__}")
    start = time.perf_counter()
    dec = validate_decisions(decisions, finite_hidden=False)  # checked in the compiled fit
    padded = to_padded(dec, dtype=np.dtype(dt.name))
    with _x64_context(dt):
        args = (padded,) + tuple(np.asarray(x, dt) for x in (lam, gamma, eps))
        out, finite = call_compiled("fit", _solve, (solver,), args + (np.asarray(tol, dt),),
                                    (SolverOutput(*[0] * 6), 0))
        if not np.all(np.asarray(finite)[: dec.n_decisions]):
            validate_decisions(decisions)  # names the decision with a non-finite hidden state
        m = dec.hidden_size + 1
        measure = certify == "exact" or (certify == "auto" and min(padded.mask.size, m)
                                         <= EXACT_EIG_MAX_DIM)
        if measure:
            gram = call_compiled("gram", _gram, (), (out.alpha, padded, *args[2:]), 0)
            low, high = _hessian_eig_range(gram, lam, m)
        alpha = np.asarray(out.alpha)
        value, gnorm = float(out.value), float(out.grad_norm)
    if measure:
        rounding = math.sqrt(float(jnp.finfo(dt).eps)) * max(1.0, high)
        min_eig, strongly_convex = low, low >= lam - rounding
    else:
        min_eig, strongly_convex = None, True
    cert = Certificate(grad_norm=gnorm, lam=lam, gap_bound=gnorm**2 / (2 * lam),
                       distance_bound=gnorm / lam, min_hessian_eig=min_eig,
                       strongly_convex=strongly_convex,
                       eig_method="gram" if measure else "structural")
    settings = dict(lam=lam, gamma=gamma, eps=eps, tol=tol, dtype=dt.name, method=solver.name,
                    **{k: v for k, v in dataclasses.asdict(solver).items() if k != "tol"})
    return FitResult(alpha=alpha, loss=value, grad_norm=gnorm, n_iter=int(out.n_iter),
                     converged=bool(gnorm <= tol), method=solver.name, certificate=cert,
                     n_decisions=dec.n_decisions, hidden_size=dec.hidden_size,
                     seconds=time.perf_counter() - start, settings=settings,
                     n_hvp=int(out.n_hvp),
                     n_passes=int(out.n_passes) if int(out.n_passes) >= 0 else None)
