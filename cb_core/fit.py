"""Fitting a concept: minimise the strongly convex Eq. 6 objective, return alpha with a certificate.

Two entry points, :func:`fit` ``(decisions, solver=..., lam=..., gamma=..., eps=...)`` and
:func:`fit_many` (many problems: strengths, 0/1 fold weights, task types, in one compiled program;
``fit`` is its one-problem case through the same path), and one frozen solver object per method:
any :class:`~cb_core.solver_protocol.Solver` (the built-in :class:`~cb_core.solvers.Subspace`,
:class:`~cb_core.solvers.Newton`, :class:`~cb_core.solvers.LBFGS` and :class:`~cb_core.solvers.Adam`
are described in :mod:`cb_core.solvers`; hyperparameters only). The fit knows no solver by name:
a solver checks its own hyperparameters and says whether :func:`fit_many` may batch it.

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
from collections.abc import Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike, DTypeLike
import numpy as np

from cb_core.cache import call_compiled
from cb_core.decisions import LabelledDecisions, bucket_size, to_padded, validate_decisions
from cb_core.model import compiled, hessian_factor, prepare
from cb_core.mesh import Devices, device_mesh, padded_size, put, repeat_first
from cb_core.fit_arguments import (check_finite_fit, check_init, check_inits, check_lam_dtype, check_number,
                                   check_problems, check_sets, check_shared)
from cb_core.solver_protocol import Solver, SolverOutput, solver_settings
from cb_core.solvers import Newton

__all__ = ["Certificate", "DEFAULT_SOLVER", "EXACT_EIG_MAX_DIM", "FitResult", "fit", "fit_many"]

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


# ----------------------------------------------------------------------------------------------
# the compiled programs
# ----------------------------------------------------------------------------------------------

def _solve_problem(solver: Solver, padded, lam, gamma, eps, tol, alpha0=None, scaled: bool = False
                   ) -> tuple[SolverOutput, Any]:
    """One problem: (the solver's output, [N_pad] bool: the decision's hidden states are finite);
    from ``alpha0`` [m] when given (a warm start), else from alpha = 0. The decision weights are
    ``padded.weight`` (0 for padded decisions and for decisions left out of the problem); ``scaled``:
    the :class:`cb_core.model.Problem` layout."""
    p = prepare(padded, gamma, eps, scaled)
    # a non-finite hidden state makes its set's mean non-finite: the statistics' pass doubles as
    # the input check (fit() names the culprit); an overflow there only costs a host re-check
    finite = jnp.all(jnp.isfinite(p.mean), axis=1)
    out = solver.minimise(p, lam, tol, alpha0)
    # + the features' statistics (one pass)
    return out._replace(n_passes=jnp.where(out.n_passes >= 0, out.n_passes + 1, -1)), finite


#: the compiled program of one problem (:func:`fit`, and :func:`fit_many` with one problem)
_solve = compiled(_solve_problem, static_argnums=0)


@compiled(static_argnums=0)
def _solve_many(solver: Solver, padded, weight, lam, gamma, eps, tol, alpha0=None) -> tuple[SolverOutput, Any]:
    """S x K problems in one program: :func:`_solve_problem` vmapped over the K problems of a
    decision set (``weight`` [S, K, N_pad], ``lam`` [S, K], ``alpha0`` [S, K, m] or None; the set's
    hidden states unbatched and scaled once (``Problem.scaled``), so every pass reads them once for
    its K problems: one [N M, d] x [d, K] matrix-matrix product) and over the S sets (``padded`` [S, N_pad, M_pad, ...], one bucket). A vmapped
    ``while_loop`` runs while any problem's condition holds and keeps each finished problem's state
    (a select per problem); the solvers' inner loops (Newton's CG) stop for a finished problem.
    Outputs are [S, K, ...]."""

    def one(padded, weight, lam, alpha0):
        return _solve_problem(solver, dataclasses.replace(padded, weight=weight), lam, gamma, eps, tol, alpha0,
                              scaled=True)

    return jax.vmap(jax.vmap(one, in_axes=(None, 0, 0, 0)))(padded, weight, lam, alpha0)


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


# ----------------------------------------------------------------------------------------------
# the one path of fit and fit_many: pad, solve, check, certify, report
# ----------------------------------------------------------------------------------------------

def _pad(sets: list[LabelledDecisions], k: int, weights: list[np.ndarray] | None, dt, mesh, split: str
         ) -> tuple[list, np.ndarray]:
    """(the S padded sets, the decision weights [S, K, N_pad]): the sets share the bucket of the
    largest (one program), N_pad a multiple of the mesh's size when the decisions are split."""
    n_pad = padded_size(bucket_size(max(d.n_decisions for d in sets)), mesh if split == "decisions" else 1)
    m_pad = bucket_size(max(int(d.set_sizes.max()) for d in sets))
    padded = [to_padded(d, dtype=np.dtype(dt.name), n_pad=n_pad, m_pad=m_pad) for d in sets]
    weight = np.zeros((len(sets), k, n_pad), np.dtype(dt.name))
    for s, d in enumerate(sets):
        weight[s, :, : d.n_decisions] = 1.0 if weights is None else weights[s]
    return padded, weight


#: per split, the axis over the mesh of the stacked sets [S, N_pad, ...], the weights [S, K, N_pad]
#: and lam [S, K] (and init [S, K, m]); None: whole on every device
_AXES = {"problems": (None, 1, 1), "decisions": (1, 2, None)}


def _run(solver: Solver, padded: list, weight: np.ndarray, lam: np.ndarray, scalars: tuple,
         init: np.ndarray | None, mesh, split: str) -> tuple[SolverOutput, np.ndarray]:
    """(the solver's output, [S, K, N_pad] finite hidden states) as numpy [S, K, ...], the inputs
    laid out over ``mesh`` (:data:`_AXES`): one problem runs :func:`_solve` (the program
    :func:`fit` always ran), more :func:`_solve_many`."""
    dt = weight.dtype
    blank = (SolverOutput(*[0] * 6), 0)
    sets_axis, weight_axis, problem_axis = _AXES[split]
    scalars = put(scalars, mesh)
    if weight.shape[0] * weight.shape[1] > 1:
        stacked = jax.tree_util.tree_map(lambda *x: np.stack(x), *padded)
        args = ((put(stacked, mesh, sets_axis), put(weight, mesh, weight_axis), put(lam.astype(dt), mesh, problem_axis))
                + scalars + (() if init is None else (put(init, mesh, problem_axis),)))
        out, finite = call_compiled("fit_many", _solve_many, (solver,), args, blank)
        return SolverOutput(*(np.asarray(x) for x in out)), np.asarray(finite)
    one = put(dataclasses.replace(padded[0], weight=weight[0, 0]), mesh, 0 if split == "decisions" else None)
    args = (one, put(np.asarray(lam[0, 0], dt), mesh)) + scalars + (() if init is None else (put(init[0, 0], mesh),))
    out, finite = call_compiled("fit", _solve, (solver,), args, blank)
    return SolverOutput(*(np.asarray(x)[None, None] for x in out)), np.asarray(finite)[None, None]


def _eig_ranges(certify: str, out: SolverOutput, padded: list, weight: np.ndarray, lam: np.ndarray,
                scalars: tuple, mesh, split: str) -> dict | None:
    """(s, q) -> (smallest, largest) Hessian eigenvalue of each problem, or None when not measured
    (``certify``: "exact" always, "auto" when min(T_pad, m) <= :data:`EXACT_EIG_MAX_DIM`); the
    decisions split over ``mesh`` as in the fit when it split them."""
    m = out.alpha.shape[-1]
    if not (certify == "exact" or (certify == "auto" and min(padded[0].mask.size, m) <= EXACT_EIG_MAX_DIM)):
        return None
    ranges, axis = {}, 0 if split == "decisions" else None
    placed, scalars = [put(p, mesh, axis) for p in padded], put(scalars[:2], mesh)
    for (s, q), lam_q in np.ndenumerate(lam):
        one = dataclasses.replace(placed[s], weight=put(weight[s, q], mesh, axis))
        gram = call_compiled("gram", _gram, (), (put(out.alpha[s, q], mesh), one, *scalars), 0)
        ranges[s, q] = _hessian_eig_range(gram, float(lam_q), m)
    return ranges


def _result(out: SolverOutput, s: int, q: int, lam: float, ranges: dict | None, settings: dict,
            n_decisions: int, hidden_size: int, seconds: float) -> FitResult:
    """Problem (s, q)'s :class:`FitResult` and its :class:`Certificate`."""
    gnorm, tol, dt = float(out.grad_norm[s, q]), settings["tol"], jnp.dtype(settings["dtype"])
    if ranges is not None:
        low, high = ranges[s, q]
        rounding = math.sqrt(float(jnp.finfo(dt).eps)) * max(1.0, high)
        min_eig, strongly_convex = low, low >= lam - rounding
    else:
        min_eig, strongly_convex = None, True
    cert = Certificate(grad_norm=gnorm, lam=lam, gap_bound=gnorm**2 / (2 * lam), distance_bound=gnorm / lam,
                       min_hessian_eig=min_eig, strongly_convex=strongly_convex,
                       eig_method="gram" if ranges is not None else "structural")
    n_passes = int(out.n_passes[s, q])
    return FitResult(alpha=np.array(out.alpha[s, q]), loss=float(out.value[s, q]), grad_norm=gnorm,
                     n_iter=int(out.n_iter[s, q]), converged=bool(gnorm <= tol), method=settings["method"],
                     certificate=cert, n_decisions=n_decisions, hidden_size=hidden_size, seconds=seconds,
                     settings={"lam": lam, **settings}, n_hvp=int(out.n_hvp[s, q]),
                     n_passes=n_passes if n_passes >= 0 else None)


def _fit_problems(sets: list[LabelledDecisions], originals: Sequence[LabelledDecisions], solver: Solver, lam: np.ndarray,
                  weights: list[np.ndarray] | None, gamma: float, eps: float, dt, tol: float, certify: str,
                  init: np.ndarray | None, start: float, mesh) -> list[list[FitResult]]:
    """The fit of S x K problems (the one path of :func:`fit` and :func:`fit_many`).

    sets: S validated decision sets of one hidden width (``originals``: as given, for naming a
    non-finite hidden state); lam [S, K] float64; weights: S arrays [K, N_s] (None: all 1); init
    [S, K, m] or None; mesh: the devices (:func:`cb_core.mesh.device_mesh`), which share the
    problems (K padded by copies of problem 0) or the decisions. Returns S lists of K results.
    """
    check_lam_dtype(lam, dt)
    k = lam.shape[1]
    split = "problems" if 2 * k > mesh.size else "decisions"  # the rule of fit_many's docstring
    padded, weight = _pad(sets, k, weights, dt, mesh, split)
    size = padded_size(k, mesh if split == "problems" else 1)
    scalars = tuple(np.asarray(x, dt) for x in (gamma, eps, tol))
    with _x64_context(dt):
        out, finite = _run(solver, padded, repeat_first(weight, size), repeat_first(lam, size), scalars,
                           repeat_first(init, size), mesh, split)
        out, finite = SolverOutput(*(x[:, :k] for x in out)), finite[:, :k]
        check_finite_fit(out.value, out.grad_norm, finite, sets, originals, dt)
        ranges = _eig_ranges(certify, out, padded, weight, lam, scalars, mesh, split)
    seconds = time.perf_counter() - start
    settings = dict(gamma=gamma, eps=eps, tol=tol, dtype=dt.name, method=solver.name, warm_start=init is not None,
                    **solver_settings(solver))
    return [[_result(out, s, q, float(lam[s, q]), ranges, settings, int(np.count_nonzero(weight[s, q])),
                     d.hidden_size, seconds) for q in range(lam.shape[1])] for s, d in enumerate(sets)]


def fit(
    decisions: LabelledDecisions,
    solver: Solver = DEFAULT_SOLVER,
    *,
    lam: float = 1.0,
    gamma: float = 0.8,
    eps: float = 1e-6,
    dtype: DTypeLike = jnp.float32,
    certify: Literal["auto", "exact", "structural"] = "auto",
    init: ArrayLike | None = None,
    devices: Devices = None,
) -> FitResult:
    """Fit the concept alpha by minimising Eq. 6 (strongly convex; unique optimum).

    The one-problem case of :func:`fit_many` (the same path, one problem: its compiled program is
    the one problem's, without the batch axes).

    Args:
        decisions: ragged decisions (validated here).
        solver: any :class:`~cb_core.solver_protocol.Solver`: :class:`Subspace`, :class:`Newton`,
            :class:`LBFGS`, :class:`Adam` or one of your own (hyperparameters, tolerance and
            iteration cap); default :data:`DEFAULT_SOLVER` (``Newton()``). A solver's ``tol=None``
            means 1e-3 in float32 (certified objective gap <= 5e-7 / lam) and 1e-7 in float64.
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
        devices: where the fit runs: None (the default device), a count n (the first n of
            ``jax.devices()``), a sequence of ``jax.Device`` or a ``jax.sharding.Mesh``; on more
            than one, the decisions are split over them (as :func:`fit_many`'s).

    Returns:
        FitResult with alpha [d + 1] (numpy, ``dtype``) and its :class:`Certificate`.

    Raises:
        ValueError: lam <= 0, non-finite or outside ``dtype``'s normal range (1e39 or 1e-46 in
            float32), gamma/eps/tol/max_iter invalid, a setting the solver's
            ``check`` refuses, an ``init`` that is not a finite [d + 1] vector, an object that is no
            solver, an unknown dtype, or bad decisions (naming the decision at fault; a non-finite
            hidden state is found by the compiled fit's first pass); a fit whose loss or gradient is
            not finite although its inputs are (finite features too large for ``dtype``: naming the
            first decision whose standardisation overflows); ``devices`` as :func:`fit_many` refuses.
    """
    lam = check_number("lam", lam, 0.0, strict=True)
    gamma, eps, dt, tol = check_shared(gamma, eps, dtype, certify, solver)
    if not isinstance(decisions, LabelledDecisions):
        raise ValueError(f"decisions must be a cb_core.LabelledDecisions, got {type(decisions).__name__}")
    mesh, start = device_mesh(devices), time.perf_counter()
    dec = validate_decisions(decisions, finite_hidden=False)  # checked in the compiled fit
    alpha0 = None if init is None else check_init(init, dec.hidden_size + 1, dt)[None, None]
    return _fit_problems([dec], [decisions], solver, np.full((1, 1), lam), None, gamma, eps, dt, tol, certify,
                         alpha0, start, mesh)[0][0]


def fit_many(
    decisions: LabelledDecisions | Sequence[LabelledDecisions],
    solver: Solver = DEFAULT_SOLVER,
    *,
    lam: float | ArrayLike = 1.0,
    weights: ArrayLike | Sequence[ArrayLike] | None = None,
    gamma: float = 0.8,
    eps: float = 1e-6,
    dtype: DTypeLike = jnp.float32,
    certify: Literal["auto", "exact", "structural"] = "auto",
    init: ArrayLike | None = None,
    devices: Devices = None,
) -> list[list[FitResult]]:
    """Fit many concepts in one compiled program: K problems on each of S decision sets.

    Each problem minimises the weighted Eq. 6 objective (strongly convex; unique optimum)

        L_k(alpha) = sum_i w_ki nll_i(alpha) / sum_i w_ki + lam_k / 2 ||alpha||^2,

    nll_i = -log P_alpha(a*_i | x_i) (Eq. 3), in nats per weighted decision; with every w_ki = 1
    it is :func:`fit`'s objective. The features are standardised per candidate set (App. B),
    whatever the weights. Typical problems: the strengths of a path (``lam`` [K]), cross-validation
    folds (``weights`` [K, N] of 0/1: a problem with weights w is the fit of the decisions with w = 1)
    and task types (a sequence of decision sets of one hidden width d), or all three at once.

    The S sets are padded into one shared bucket (N_pad, M_pad: :func:`cb_core.decisions.bucket_size`
    of the largest N and M) and the solver runs ``jax.vmap``-ped over sets and problems inside one
    ``lax.while_loop``: a problem that has converged stops moving (its state is kept) while the
    others iterate, until all have stopped or reached ``max_iter``; each keeps its own iteration
    count. The K problems of a set share its hidden states: every pass reads them once for all K
    (a matrix-matrix product). Newton-CG (the default) masks its conjugate-gradient loop per
    problem; L-BFGS and Adam iterate each problem with its own optax state; a solver whose
    ``batchable`` is False (:class:`Subspace`: its vmapped inner loops do not terminate on every
    batch) is refused. One problem in all runs :func:`fit`'s program, so :func:`fit` is this
    function's K = S = 1 case.

    On several devices (``devices``) the same program runs with its inputs laid out over a 1-D
    mesh (:mod:`cb_core.mesh`) and XLA partitions it: when 2 K > n (n devices), each device fits
    its share of the K problems of every set (K padded to a multiple of n by repeats of problem 0,
    whose results are dropped; the sets whole on every device), else each holds its share of every
    set's decisions (N_pad a multiple of n; the objective's sums all-reduced), so a decision set
    larger than one device's memory fits. The results equal one device's within the certificates'
    bounds (another summation order).

    Args:
        decisions: one :class:`LabelledDecisions` (S = 1), or a non-empty sequence of S of them sharing
            one hidden width d.
        solver: a batchable solver (:class:`Newton`, the default, :class:`LBFGS`, :class:`Adam`, or
            your own), as for :func:`fit` (one solver, one tolerance for all problems).
        lam: L2 strengths > 0: a number (every problem), [K] (problem k of every set) or, for a
            sequence, [S, K].
        weights: decision weights >= 0 (float, typically 0/1 fold masks), each problem's row with
            a positive entry: [K, N] (or [N]) for one set; for a sequence, a sequence of S arrays
            [K, N_s] (or None: all 1). K is the length of ``lam``'s last axis and of the weights'
            first (they must agree where both are given); neither given: K = 1.
        gamma, eps, dtype, certify: as for :func:`fit`, shared by all problems.
        init: warm starts broadcastable to [S, K, d + 1] ([d + 1], [K, d + 1] or [S, K, d + 1]);
            None: alpha = 0 for every problem.
        devices: as for :func:`fit`: None (the default device), a count, a sequence of
            ``jax.Device`` or a ``jax.sharding.Mesh``.

    Returns:
        S lists of K :class:`FitResult` (``result[s][k]``; one :class:`LabelledDecisions` is S = 1:
        ``fit_many(dec, lam=lams)[0]`` are its K results), each with alpha [d + 1] numpy ``dtype``
        and its :class:`Certificate`, exactly as :func:`fit` returns. ``n_decisions`` is the
        problem's count of decisions with a positive weight; ``seconds`` is the whole call's
        (shared); ``n_passes`` counts the passes the problem's own iterations need (problems of one
        set share them).

    Raises:
        ValueError: anything :func:`fit` refuses; a solver that is not ``batchable``; an empty
            sequence or one holding something else than LabelledDecisions; sets of different hidden
            widths; ``lam`` not finite and > 0 or of a bad shape; ``weights`` of a bad shape,
            negative, non-finite or a problem weighting no decision; K disagreeing between ``lam``
            and ``weights``; ``init`` not broadcastable to [S, K, d + 1] or non-finite (each naming
            the argument, set or problem at fault); ``devices`` asking for more devices than are
            present, or naming one twice.
    """
    gamma, eps, dt, tol = check_shared(gamma, eps, dtype, certify, solver, batched=True)
    mesh = device_mesh(devices)
    given, sets = check_sets(decisions)
    start = time.perf_counter()
    lam, weights = check_problems(lam, weights, sets, isinstance(decisions, LabelledDecisions))
    alpha0 = None if init is None else check_inits(init, lam.shape + (sets[0].hidden_size + 1,), dt)
    return _fit_problems(sets, given, solver, lam, weights, gamma, eps, dt, tol, certify, alpha0, start, mesh)
