"""Fitting a concept: minimise the strongly convex Eq. 6 objective, return alpha with a certificate.

One entry point, :func:`fit` ``(decisions, solver=..., lam=..., gamma=..., eps=...)``, and one
frozen solver object per method (:class:`~cb_core.solvers.Subspace`,
:class:`~cb_core.solvers.Newton`, :class:`~cb_core.solvers.LBFGS` or
:class:`~cb_core.solvers.Adam`: hyperparameters only; each method is described in
:mod:`cb_core.solvers`).

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
import math
import time
from typing import Any, Literal

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike, DTypeLike
import numpy as np

from cb_core.cache import call_compiled
from cb_core.decisions import Decisions, to_padded, validate_decisions
from cb_core.model import compiled, hessian_factor, prepare
from cb_core.solvers import LBFGS, Adam, Newton, Solver, SolverOutput, Subspace

__all__ = ["Certificate", "DEFAULT_SOLVER", "EXACT_EIG_MAX_DIM", "FitResult", "fit"]

#: ``certify="auto"`` measures the Hessian's smallest eigenvalue when min(T_pad, m) is at most this.
EXACT_EIG_MAX_DIM = 512

#: the default solver of :func:`fit`: Newton-CG. Subspace needs fewer passes over the hidden
#: states (docs/benchmarks.md) but was not faster in wall time in every case there (its inner
#: iterations cost time at small sizes), and Newton-CG stops with the smaller gap
DEFAULT_SOLVER: Solver = Newton()


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


def _default_tol(dtype) -> float:
    # float32 rounding puts the gradient floor near 1e-4..1e-3 at d ~ 5k; 1e-3 certifies an
    # objective gap <= 5e-7 / lam.
    return 1e-3 if jnp.dtype(dtype) == jnp.float32 else 1e-7


# ----------------------------------------------------------------------------------------------
# the compiled programs
# ----------------------------------------------------------------------------------------------

@compiled(static_argnums=0)
def _solve(solver: Solver, padded, lam, gamma, eps, tol, alpha0=None) -> tuple[SolverOutput, Any]:
    """(the solver's output, [N_pad] bool: the decision's hidden states are finite); from
    ``alpha0`` [m] when given (a warm start), else from alpha = 0."""
    p = prepare(padded, gamma, eps)
    # a non-finite hidden state makes its set's mean non-finite: the statistics' pass doubles as
    # the input check (fit() names the culprit); an overflow there only costs a host re-check
    finite = jnp.all(jnp.isfinite(p.mean), axis=1)
    out = solver.minimise(p, lam, tol, alpha0)
    # + the features' statistics (one pass)
    return out._replace(n_passes=jnp.where(out.n_passes >= 0, out.n_passes + 1, -1)), finite


@compiled
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


def _check_number(name: str, value: object, low: float, strict: bool) -> float:
    ok = isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool)
    if ok:
        value = float(value)
        ok = math.isfinite(value) and (value > low if strict else value >= low)
    if not ok:
        raise ValueError(f"{name} must be a finite number {'>' if strict else '>='} {low:g}, "
                         f"got {value!r}")
    return value


def _check_init(init: ArrayLike, m: int, dt) -> np.ndarray:
    """``init`` as a [m] array of ``dt``; ValueError (one line) for another shape or a non-finite entry."""
    alpha0 = np.asarray(init, dtype=np.dtype(dt.name))
    if alpha0.shape != (m,):
        raise ValueError(f"init must be alpha [d + 1] = [{m}] for these decisions, got shape {alpha0.shape}")
    if not np.isfinite(alpha0).all():
        raise ValueError("init has non-finite entries")
    return alpha0


def _diverged(dec: Decisions, dt, value: float, gnorm: float) -> str:
    """One line for a fit whose loss or gradient is not finite although every input is: which
    decision's features overflow ``dt`` when standardised (their squared deviations), and the fix."""
    offsets, hidden = np.asarray(dec.offsets), np.asarray(dec.hidden)
    culprit = ""
    with np.errstate(over="ignore", invalid="ignore"):
        for i, (a, b) in enumerate(zip(offsets[:-1], offsets[1:])):
            x = hidden[a:b].astype(dt.name)
            if not np.isfinite(np.square(x - x.mean(axis=0)).sum(axis=0)).all():
                culprit = (f"decision {i}'s features overflow {dt.name} when standardised (largest |feature| "
                           f"{float(np.abs(hidden[a:b]).max()):.3g}); ")
                break
    return (f"the {dt.name} fit diverged (loss {value}, gradient norm {gnorm}) and nothing is saved: {culprit}"
            "fit in float64 (dtype=float64, `cb-agent fit --float64`) or standardise the features first")


def fit(
    decisions: Decisions,
    solver: Solver = DEFAULT_SOLVER,
    *,
    lam: float = 1.0,
    gamma: float = 0.8,
    eps: float = 1e-6,
    dtype: DTypeLike = jnp.float32,
    certify: Literal["auto", "exact", "structural"] = "auto",
    init: ArrayLike | None = None,
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
        init: [d + 1] the solver's first iterate (a warm start, e.g. the alpha of a concept
            fitted on part of these decisions); None: alpha = 0. The optimum is the same (Eq. 6
            is strongly convex); a start near it takes fewer steps. ``settings["warm_start"]``
            records which.

    Returns:
        FitResult with alpha [d + 1] (numpy, ``dtype``) and its :class:`Certificate`.

    Raises:
        ValueError: lam <= 0 or non-finite, gamma/eps/tol/max_iter (or Subspace memory/inner)
            invalid, an ``init`` that is not a finite [d + 1] vector, unknown solver or dtype, or bad decisions (naming the decision at fault;
            a non-finite hidden state is found by the compiled fit's first pass); a fit whose
            loss or gradient is not finite although its inputs are (finite features too large
            for ``dtype``: naming the first decision whose standardisation overflows).
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
    start_at = () if init is None else (_check_init(init, dec.hidden_size + 1, dt),)
    with _x64_context(dt):
        args = (padded,) + tuple(np.asarray(x, dt) for x in (lam, gamma, eps))
        out, finite = call_compiled("fit", _solve, (solver,), args + (np.asarray(tol, dt),) + start_at,
                                    (SolverOutput(*[0] * 6), 0))
        if not np.all(np.asarray(finite)[: dec.n_decisions]):
            validate_decisions(decisions)  # names the decision with a non-finite hidden state
        value, gnorm = float(out.value), float(out.grad_norm)
        if not (math.isfinite(value) and math.isfinite(gnorm)):
            raise ValueError(_diverged(dec, dt, value, gnorm))
        m = dec.hidden_size + 1
        measure = certify == "exact" or (certify == "auto" and min(padded.mask.size, m)
                                         <= EXACT_EIG_MAX_DIM)
        if measure:
            gram = call_compiled("gram", _gram, (), (out.alpha, padded, *args[2:]), 0)
            low, high = _hessian_eig_range(gram, lam, m)
        alpha = np.asarray(out.alpha)
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
                    warm_start=init is not None,
                    **{k: v for k, v in dataclasses.asdict(solver).items() if k != "tol"})
    return FitResult(alpha=alpha, loss=value, grad_norm=gnorm, n_iter=int(out.n_iter),
                     converged=bool(gnorm <= tol), method=solver.name, certificate=cert,
                     n_decisions=dec.n_decisions, hidden_size=dec.hidden_size,
                     seconds=time.perf_counter() - start, settings=settings,
                     n_hvp=int(out.n_hvp),
                     n_passes=int(out.n_passes) if int(out.n_passes) >= 0 else None)
