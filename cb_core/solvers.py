"""The built-in solvers of :func:`cb_core.fit.fit`: one frozen object per method, minimising Eq. 6.

Each implements :class:`cb_core.solver_protocol.Solver` (its name, whether :func:`cb_core.fit_many`
may batch it, the check of its hyperparameters) and is registered by name
(:data:`~cb_core.solver_protocol.SOLVERS`). Each holds hyperparameters only (tolerance, iteration cap,
method settings); its ``minimise(problem, lam, tol, alpha0=None) -> SolverOutput`` runs one jit-compiled
``lax.while_loop`` whose state is a NamedTuple, on the padded :class:`cb_core.model.Problem` the fit
prepared, from alpha = 0 or from ``alpha0`` [m] (a warm start: the same unique optimum, fewer steps
when ``alpha0`` is near it):

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

Imports nothing of this project outside :mod:`cb_core`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from cb_core.model import (Problem, expert_nll, phi_matvec, phi_rmatvec, problem_objective, set_log_softmax,
                           value_and_grad, value_and_grad_at)
from cb_core.solver_protocol import (SOLVERS, Progress, Solver, SolverOutput, check_int, register_solver,
                                     first_iterate as _start)

__all__ = ["Adam", "LBFGS", "Newton", "SOLVERS", "Solver", "SolverOutput", "Subspace"]


def _check_positive(solver: object, name: str) -> None:
    """ValueError (one line) unless ``solver.<name>`` is a finite number > 0."""
    value = getattr(solver, name)
    if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0):
        raise ValueError(f"{type(solver).__name__} {name} must be a finite number > 0, got {value!r}")


@register_solver
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
    #: the CG loop stops per problem under ``jax.vmap`` (masked by the outer condition)
    batchable: ClassVar[bool] = True

    def check(self) -> None:
        for field, low in (("max_cg", 1), ("line_search_steps", 0), ("patience", 1)):
            check_int(self, field, low)
        _check_positive(self, "forcing")

    def minimise(self, p: Problem, lam, tol, alpha0=None) -> SolverOutput:
        m = p.hidden.shape[2] + 1
        dtype = p.hidden.dtype
        warm = alpha0 is not None
        alpha0, s0 = _start(alpha0, p, m, dtype)

        class Loop(NamedTuple):
            alpha: jax.Array
            scores: jax.Array  # [N, M] at alpha
            grad: jax.Array  # [m] at alpha
            best: Progress
            k: jax.Array
            n_hvp: jax.Array

        def cg(grad, prob, gnorm, active):
            """x ~ -H^{-1} g and u = Phi x (accumulated from the HVPs' Phi p); no iteration when not
            ``active`` (a problem that has stopped, under ``jax.vmap``: its step is discarded)."""
            # a residual below tol / 4 already makes the next gradient about that small
            target = jnp.maximum(jnp.minimum(self.forcing, jnp.sqrt(gnorm)) * gnorm, 0.25 * tol)

            def hv(v):
                u = phi_matvec(v, p)
                z = prob * (u - jnp.sum(prob * u, axis=-1, keepdims=True))
                return u, phi_rmatvec(p.weight[:, None] * z, p) + lam * v

            class CG(NamedTuple):
                x: jax.Array
                u: jax.Array
                r: jax.Array
                d: jax.Array
                rr: jax.Array
                j: jax.Array

            def cond(c):
                return active & (c.j < self.max_cg) & (jnp.sqrt(c.rr) > target)

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
                prob = jnp.exp(set_log_softmax(s + t * u, p))
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
            prob = jnp.exp(set_log_softmax(c.scores, p))
            # always True unbatched; under jax.vmap a stopped problem's CG makes no HVP
            x, u, j = cg(c.grad, prob, jnp.linalg.norm(c.grad), cond(c))
            t = line_search(c.alpha, c.scores, x, u)
            alpha, s = c.alpha + t * x, c.scores + t * u  # Phi x came with CG: no pass here
            value, grad = value_and_grad_at(alpha, s, p, lam)
            return Loop(alpha, s, grad, c.best.update(alpha, jnp.linalg.norm(grad), value),
                        c.k + 1, c.n_hvp + j)

        v0, g0 = value_and_grad_at(alpha0, s0, p, lam)
        start = Loop(alpha0, s0, g0, Progress.start(alpha0, jnp.linalg.norm(g0), v0),
                     jnp.asarray(0, jnp.int32), jnp.asarray(0, jnp.int32))
        out = lax.while_loop(cond, body, start)
        # the certificate's gradient from scratch (the tracked scores carry rounding drift)
        value, grad = value_and_grad(out.best.alpha, p, lam)
        # passes: (a warm start's scores,) the first gradient, per step its HVPs (2 each) and
        # gradient, the last gradient
        return SolverOutput(out.best.alpha, value, jnp.linalg.norm(grad), out.k, out.n_hvp,
                            1 + 2 * out.n_hvp + out.k + 2 + int(warm))


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


@register_solver
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
    #: not batchable: its vmapped inner loops (the subspace Newton iterations and their
    #: backtracking) do not terminate on every batch
    batchable: ClassVar[bool] = False

    def check(self) -> None:
        for field in ("memory", "inner", "patience"):
            check_int(self, field, 1)

    def minimise(self, p: Problem, lam, tol, alpha0=None) -> SolverOutput:
        m = p.hidden.shape[2] + 1
        dtype = p.hidden.dtype
        n, slots = p.prior.shape
        k = self.memory + 1
        onehot = (jnp.arange(slots)[None, :] == p.expert[:, None]).astype(dtype)

        class Loop(NamedTuple):
            alpha: jax.Array
            scores: jax.Array  # [N, M] at alpha (tracked)
            grad: jax.Array
            steps: jax.Array  # [m, memory] past steps, newest first
            images: jax.Array  # [N, M, memory] their Phi d
            best: Progress
            k: jax.Array

        def sub_value(c, s, w, da, gram):
            """Eq. 6 at alpha + D c (up to the constant lam/2 ||alpha||^2)."""
            return expert_nll(s + w @ c, p) + lam * (da @ c + 0.5 * c @ gram @ c)

        def sub_derivatives(c, s, w, da, gram):
            prob = jnp.exp(set_log_softmax(s + w @ c, p))
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
            w = jnp.concatenate([phi_matvec(c.grad, p)[..., None], c.images], axis=2)
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

        warm = alpha0 is not None
        alpha0, s0 = _start(alpha0, p, m, dtype)
        v0, g0 = value_and_grad_at(alpha0, s0, p, lam)
        start = Loop(alpha0, s0, g0, jnp.zeros((m, self.memory), dtype),
                     jnp.zeros((n, slots, self.memory), dtype),
                     Progress.start(alpha0, jnp.linalg.norm(g0), v0), jnp.asarray(0, jnp.int32))
        out = lax.while_loop(cond, body, start)
        value, grad = value_and_grad(out.best.alpha, p, lam)  # from scratch: no tracked drift
        # passes: (a warm start's scores,) the first gradient, two per step, the last gradient
        return SolverOutput(out.best.alpha, value, jnp.linalg.norm(grad), out.k,
                            jnp.asarray(0, jnp.int32), 1 + 2 * out.k + 2 + int(warm))


@register_solver
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
    batchable: ClassVar[bool] = True  # each problem its own optax state

    def check(self) -> None:
        for field in ("memory_size", "max_linesearch_steps", "patience"):
            check_int(self, field, 1)

    def minimise(self, p: Problem, lam, tol, alpha0=None) -> SolverOutput:
        import optax  # here: a Newton (default, one-off CLI) or subspace fit never imports it
        import optax.tree_utils as otu

        fun = lambda a: problem_objective(a, p, lam)  # noqa: E731
        opt = optax.lbfgs(
            memory_size=self.memory_size,
            linesearch=optax.scale_by_zoom_linesearch(
                max_linesearch_steps=self.max_linesearch_steps),
        )
        value_and_grad_fn = optax.value_and_grad_from_state(fun)
        alpha0, _ = _start(alpha0, p, p.hidden.shape[2] + 1, p.hidden.dtype)

        class Loop(NamedTuple):
            alpha: jax.Array
            state: jax.Array
            best: Progress

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
                                              Progress.start(alpha0, jnp.linalg.norm(g0), v0)))
        value, grad = value_and_grad(out.best.alpha, p, lam)
        return SolverOutput(out.best.alpha, value, jnp.linalg.norm(grad),
                            otu.tree_get(out.state, "count"), jnp.asarray(0, jnp.int32),
                            jnp.asarray(-1, jnp.int32))


@register_solver
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
    batchable: ClassVar[bool] = True

    def check(self) -> None:
        _check_positive(self, "learning_rate")

    def minimise(self, p: Problem, lam, tol, alpha0=None) -> SolverOutput:
        import optax

        opt = optax.adam(self.learning_rate)
        alpha0, _ = _start(alpha0, p, p.hidden.shape[2] + 1, p.hidden.dtype)

        class Loop(NamedTuple):
            alpha: jax.Array
            state: jax.Array
            k: jax.Array
            value: jax.Array
            grad: jax.Array

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

