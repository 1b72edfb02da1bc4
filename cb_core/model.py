"""The concept model as one set of pure JAX kernels on the padded layout.

Seed paper notation: decision i has candidate set A_i of M_i actions; m = d + 1 is the feature
size. The kernels compute on :class:`cb_core.decisions.PaddedLabelledDecisions` ([N, M, .] + mask;
acting on one candidate set is N = 1), prepared once into a :class:`Problem`:

* Features (seed App. B):   phi(x, a; A)_k = (h_ak - mean_A h_k) / max(std_A h_k, eps),  k < d,
                            phi_d = M_i ** -0.5  (the bias coordinate).
* Prior (Eq. 3, App. B):    log Qbar(a|x) = log q(a|x) / n_tokens(a) ** gamma, log-normalised
                            over A_i.
* Action law (Eq. 3):       log P_alpha(a|x) = log-softmax over A_i of (log Qbar + alpha . phi).
* Objective (Eq. 6):        L(alpha) = (1/N) sum_i -log P_alpha(a*_i|x_i) + lam/2 ||alpha||^2
                            (with decision weights w_i: sum_i w_i nll_i / sum_i w_i in place of the mean).
* Gradient:                 (1/N) sum_i (E_{P_i}[phi] - phi(a*_i)) + lam alpha.
* Hessian:                  H = (1/N) sum_i Cov_{P_i}(phi) + lam I  (so H >= lam I: strongly
                            convex, unique optimum); :func:`hvp` applies it in two passes.

The features are never materialised by the fitter: a score is ``h . (alpha / scale) - mean .
(alpha / scale)`` per decision, so every pass reads the [N, M, d] hidden states once (the fit is
memory-bound). :func:`features` materialises them for inspection and tests.

The public functions at the bottom take ragged :class:`cb_core.decisions.LabelledDecisions` (concrete
numpy), pad them once with :func:`cb_core.decisions.to_padded` and call one jit-compiled kernel;
``alpha`` may be traced (``jax.grad`` / ``jax.hessian`` work). Inside your own jit, call the
kernels on a :class:`Problem` instead. No I/O. Imports nothing else of this project except
:mod:`cb_core.decisions`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
from jax.typing import ArrayLike
import jax.numpy as jnp
import numpy as np
from jax import lax

from cb_core.decisions import LabelledDecisions, PaddedLabelledDecisions, to_padded

__all__ = [
    "MATMUL_PRECISION", "compiled",
    "Problem", "prepare", "masked_logsumexp", "phi_matvec", "phi_rmatvec", "scores", "set_log_softmax", "expert_nll",
    "problem_log_probs", "problem_objective", "value_and_grad", "value_and_grad_at", "hvp", "problem_features",
    "hessian_factor", "problem_hessian", "features", "prior_log_probs",
    "log_probs", "objective", "gradient", "hessian", "Terms", "problem_terms", "terms", "DeviceDecision",
    "decide_padded",
]


def masked_logsumexp(x, mask):
    """log sum exp of ``x`` over the last axis where ``mask`` (0 where nothing is masked in).

    x, mask: [..., M] float / bool -> [...]. Max-shifted (stable); masked entries contribute
    nothing, also to the gradient.
    """
    x = jnp.where(mask, x, -jnp.inf)
    mx = lax.stop_gradient(jnp.max(x, axis=-1, keepdims=True))
    mx = jnp.where(jnp.isfinite(mx), mx, 0.0)
    s = jnp.sum(jnp.exp(x - mx), axis=-1)
    return jnp.log(jnp.where(s > 0, s, 1.0)) + mx[..., 0]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Problem:
    """A padded decision set prepared for the kernels (arrays only; a pytree). Built by
    :func:`prepare` once per fit or act call.

    Attributes:
        hidden: [N, M, d] hidden states, shifted per set (see ``PaddedLabelledDecisions.hidden``).
        mean: [N, d] mean of ``hidden`` over each candidate set.
        inv_scale: [N, d] 1 / max(std over the set, eps) (App. B).
        bias: [N] the bias feature M_i ** -0.5 (0 for padded decisions).
        prior: [N, M] normalised log Qbar (0 in padded slots).
        mask: [N, M] bool, real candidates.
        expert: [N] int32 local expert index.
        weight: [N] w_i / sum_j w_j, the decision weights normalised (``PaddedLabelledDecisions.weight``: 1 for
            real decisions, 0 for padded ones, so 1 / N by default: the objective's average).
        scaled: static layout flag. False: ``hidden`` and ``mean`` as above, each pass a product
            per decision with alpha / scale ([M, d] x [d] for each of the N). True: ``hidden`` and
            ``mean`` are multiplied by ``inv_scale`` (phi = hidden - mean), so each pass is one
            [N M, d] x [d] product, and under ``jax.vmap`` over K concepts one [N M, d] x [d, K]
            matrix-matrix product (the batched fit's layout; per decision is faster for one concept
            on the CPU: benchmarks/fit_speed.py).
    """

    hidden: ArrayLike
    mean: ArrayLike
    inv_scale: ArrayLike
    bias: ArrayLike
    prior: ArrayLike
    mask: ArrayLike
    expert: ArrayLike
    weight: ArrayLike
    scaled: bool = dataclasses.field(default=False, metadata=dict(static=True))


def prepare(padded: PaddedLabelledDecisions, gamma, eps, scaled: bool = False) -> Problem:
    """Features' statistics and the prior of a padded decision set (App. B, Eq. 3); jittable.

    gamma: prior length-normalisation exponent; eps: floor of the per-coordinate std; scaled: the
    layout of :class:`Problem` (True: the hidden states scaled once here, for batched concepts).
    """
    h = jnp.asarray(padded.hidden)
    dtype = h.dtype
    mask = jnp.asarray(padded.mask)
    w = mask.astype(dtype)
    count = jnp.sum(w, axis=-1)  # [N]
    safe = jnp.maximum(count, 1.0)
    # one pass for both sums (a variadic reduction; the mask fuses into it)
    zero = jnp.zeros((), dtype)
    hm = jnp.where(mask[..., None], h, zero)
    total, squares = lax.reduce((hm, hm * hm), (zero, zero),
                                lambda a, b: (a[0] + b[0], a[1] + b[1]), (1,))
    mean = total / safe[:, None]
    # E[h^2] - mean^2 is well conditioned here: rows are shifted by their set's first row, so
    # |mean| is of the order of the spread (and a constant coordinate gives exactly 0)
    var = jnp.maximum(squares / safe[:, None] - mean * mean, 0.0)
    inv_scale = 1.0 / jnp.maximum(jnp.sqrt(var), jnp.asarray(eps, dtype))
    bias = jnp.where(count > 0, lax.rsqrt(safe), 0.0)
    lq = jnp.asarray(padded.log_q, dtype) / jnp.asarray(padded.n_tokens).astype(dtype) ** gamma
    prior = jnp.where(mask, lq - masked_logsumexp(lq, mask)[:, None], 0.0)
    weight = jnp.asarray(padded.weight, dtype)
    total = jnp.sum(weight)
    weight = weight / jnp.where(total > 0, total, 1.0)
    if scaled:  # one write here; every pass is then one [N M, d] product
        h, mean = jnp.where(mask[..., None], h * inv_scale[:, None, :], zero), mean * inv_scale
    return Problem(h, mean, inv_scale, bias, prior, mask, jnp.asarray(padded.expert), weight, scaled)


# ----------------------------------------------------------------------------------------------
# the two passes over the hidden states: Phi v and Phi^T r
# ----------------------------------------------------------------------------------------------

def phi_matvec(v, p: Problem):
    """[N, M] = Phi v for v [m] (the per-set mean term included; 0 in padded slots)."""
    if p.scaled:  # one [N M, d] x [d] product ([N M, d] x [d, K] under jax.vmap over concepts)
        u = jnp.einsum("nmd,d->nm", p.hidden, v[:-1]) - (p.mean @ v[:-1])[:, None]
    else:
        a = p.inv_scale * v[:-1]  # [N, d]
        u = jnp.einsum("nmd,nd->nm", p.hidden, a) - jnp.sum(p.mean * a, axis=-1)[:, None]
    return jnp.where(p.mask, u + (p.bias * v[-1])[:, None], 0.0)


def phi_rmatvec(r, p: Problem):
    """[m] = Phi^T r for r [N, M] that sums to 0 over each candidate set (zero in padded slots).

    Every r here is a centred softmax residual (P - onehot, P (u - E_P u)), so the per-set mean
    and the bias coordinate (both constant within a set) drop out exactly instead of leaving
    rounding noise: the bias entry of the gradient is exactly lam * alpha_d.
    """
    if p.scaled:
        g = jnp.einsum("nm,nmd->d", r, p.hidden)
    else:
        g = jnp.sum(jnp.einsum("nm,nmd->nd", r, p.hidden) * p.inv_scale, axis=0)
    return jnp.concatenate([g, jnp.zeros((1,), r.dtype)])


# ----------------------------------------------------------------------------------------------
# kernels on a Problem (pure, jittable)
# ----------------------------------------------------------------------------------------------

def scores(alpha, p: Problem):
    """[N, M] log Qbar + alpha . phi (Eq. 3 logits); 0 in padded slots."""
    return jnp.where(p.mask, p.prior + phi_matvec(alpha, p), 0.0)


def set_log_softmax(s, p: Problem):
    """[N, M] the log-softmax of scores ``s`` [N, M] over each candidate set; -inf in padded slots."""
    return jnp.where(p.mask, s - masked_logsumexp(s, p.mask)[:, None], -jnp.inf)


def problem_log_probs(alpha, p: Problem):
    """[N, M] log P_alpha over each candidate set (Eq. 3); -inf in padded slots."""
    return set_log_softmax(scores(alpha, p), p)


class Terms(NamedTuple):
    """The terms of Eq. 3 over candidate sets, each shaped like the decisions' candidates.

    Attributes:
        log_p: log P_alpha(a | x), the log-softmax over each set of ``prior + concept_term``.
        prior: the prior term log Qbar(a | x) (length-normalised, log-normalised over the set).
        concept_term: alpha . phi(x, a; A) (standardised features and the bias coordinate).
    """

    log_p: ArrayLike
    prior: ArrayLike
    concept_term: ArrayLike


def problem_terms(alpha, p: Problem) -> Terms:
    """[N, M] each: log P, the prior and the concept term of Eq. 3 from one pass (0 in padded
    slots, log P there -inf); ``log_p`` is :func:`problem_log_probs`."""
    term = phi_matvec(alpha, p)
    s = jnp.where(p.mask, p.prior + term, 0.0)
    return Terms(set_log_softmax(s, p), p.prior, term)


def expert_nll(s, p: Problem):
    """[] sum_i w_i -log softmax(s_i)[a*_i]: the weighted expert NLL (Eq. 6 without the
    regulariser) given the scores ``s`` [N, M]; no pass over the hidden states."""
    chosen = jnp.take_along_axis(s, p.expert[:, None], axis=1)[:, 0]
    return jnp.sum(p.weight * (masked_logsumexp(s, p.mask) - chosen))


@jax.custom_jvp
def problem_objective(alpha, p: Problem, lam):
    """Eq. 6 (nats per decision): weighted mean expert NLL + lam/2 ||alpha||^2.

    Differentiable in alpha and lam with the analytic gradient of :func:`value_and_grad` (two
    passes over hidden, also under ``jax.grad``); the data ``p`` are not differentiated.
    """
    return expert_nll(scores(alpha, p), p) + 0.5 * lam * jnp.vdot(alpha, alpha)


@problem_objective.defjvp
def _objective_jvp(primals, tangents):
    alpha, p, lam = primals
    d_alpha, _, d_lam = tangents
    value, grad = value_and_grad(alpha, p, lam)
    return value, jnp.vdot(grad, d_alpha) + 0.5 * jnp.vdot(alpha, alpha) * d_lam


def _residual(s, p: Problem):
    """[N, M] w_i (P_i - onehot(a*_i)): the gradient of the weighted NLL in the scores."""
    prob = jnp.exp(set_log_softmax(s, p))
    onehot = jnp.arange(s.shape[1])[None, :] == p.expert[:, None]
    return p.weight[:, None] * (prob - onehot.astype(s.dtype)) * p.mask


def value_and_grad_at(alpha, s, p: Problem, lam):
    """(L(alpha), grad L(alpha) [m]) given the scores s = :func:`scores` (alpha, p) [N, M]:
    one pass over hidden (a solver that tracks the scores saves the other)."""
    value = expert_nll(s, p) + 0.5 * lam * jnp.vdot(alpha, alpha)
    return value, phi_rmatvec(_residual(s, p), p) + lam * alpha


def value_and_grad(alpha, p: Problem, lam):
    """(L(alpha), grad L(alpha) [m]) with the analytic gradient: two passes over hidden."""
    return value_and_grad_at(alpha, scores(alpha, p), p, lam)


def hvp(alpha, v, p: Problem, lam):
    """[m] H(alpha) v = (1/N) sum_i Cov_{P_i}(phi) v + lam v: two passes over hidden."""
    prob = jnp.exp(problem_log_probs(alpha, p))
    u = phi_matvec(v, p)
    z = prob * (u - jnp.sum(prob * u, axis=-1, keepdims=True))
    return phi_rmatvec(p.weight[:, None] * z, p) + lam * v


def problem_features(p: Problem):
    """[N, M, m] materialised features phi (App. B); 0 in padded slots."""
    phi = p.hidden - p.mean[:, None, :]
    if not p.scaled:
        phi = phi * p.inv_scale[:, None, :]
    bias = jnp.broadcast_to(p.bias[:, None, None], phi.shape[:2] + (1,))
    return jnp.where(p.mask[..., None], jnp.concatenate([phi, bias], axis=-1), 0.0)


def hessian_factor(alpha, p: Problem):
    """B [N * M, m] with H = B^T B + lam I: rows sqrt(w_i P) (phi - E_{P_i}[phi])."""
    phi = problem_features(p)
    prob = jnp.exp(problem_log_probs(alpha, p))
    centred = phi - jnp.einsum("nm,nmk->nk", prob, phi)[:, None, :]
    b = jnp.sqrt(p.weight[:, None] * prob)[..., None] * centred
    return b.reshape(-1, b.shape[-1])


def problem_hessian(alpha, p: Problem, lam):
    """Explicit [m, m] Hessian (1/N) sum_i Cov_{P_i}(phi) + lam I."""
    b = hessian_factor(alpha, p)
    return b.T @ b + lam * jnp.eye(b.shape[1], dtype=b.dtype)


#: Precision of the dot products in every compiled cb_core program: full float32. JAX's default
#: is TF32 on recent NVIDIA GPUs (a 10-bit mantissa), which the fit's float32 gradient tolerance
#: (1e-3) and agreement with a CPU fit do not survive; CPUs compute full float32 either way.
MATMUL_PRECISION = "highest"


def compiled(fn=None, **jit_kwargs):
    """``jax.jit(fn, **jit_kwargs)`` whose dot products run at :data:`MATMUL_PRECISION` (the
    lowered program carries ``precision = [HIGHEST, HIGHEST]`` on each ``dot_general``), whatever
    the caller's ``jax.default_matmul_precision``. Usable as ``@compiled`` or
    ``@compiled(static_argnums=0)``."""
    if fn is None:
        return functools.partial(compiled, **jit_kwargs)

    @functools.wraps(fn)
    def precise(*args, **kwargs):
        with jax.default_matmul_precision(MATMUL_PRECISION):
            return fn(*args, **kwargs)

    return jax.jit(precise, **jit_kwargs)


# ----------------------------------------------------------------------------------------------
# public functions on ragged LabelledDecisions: pad once on the host, one jit-compiled kernel
# ----------------------------------------------------------------------------------------------

@compiled
def _k_features(padded, eps):
    return problem_features(prepare(padded, 0.0, eps))


@compiled
def _k_prior(padded, gamma):
    return prepare(padded, gamma, 1.0).prior


@compiled
def _k_log_probs(alpha, padded, gamma, eps):
    return problem_log_probs(alpha, prepare(padded, gamma, eps))


@compiled
def _k_terms(alpha, padded, gamma, eps):
    return problem_terms(alpha, prepare(padded, gamma, eps))


class DeviceDecision(NamedTuple):
    """One candidate set decided where its arrays live (:func:`_k_decide`); nothing fetched.

    Attributes:
        terms: :class:`Terms`, each [M_pad] (padded slots: log P -inf, prior and concept term 0).
        chosen: [] int32, the argmax of log P over the real candidates (the lowest index on ties).
        finite: [] bool, every real candidate's hidden state and log q are finite (when False the
            terms are meaningless: the caller names the culprit from the fetched inputs).
    """

    terms: Terms
    chosen: jax.Array
    finite: jax.Array

    @property
    def log_p(self) -> jax.Array:
        """[M_pad] log P (the :attr:`terms`' first)."""
        return self.terms.log_p

    @property
    def prior(self) -> jax.Array:
        """[M_pad] the prior term."""
        return self.terms.prior

    @property
    def concept_term(self) -> jax.Array:
        """[M_pad] the concept term."""
        return self.terms.concept_term


@compiled
def _k_decide(alpha, hidden, log_q, n_tokens, count, gamma, eps) -> DeviceDecision:
    """:func:`_k_terms` of one candidate set padded to M_pad slots whose first ``count`` are real,
    padded here (the host's :func:`cb_core.decisions.to_padded` in the graph: each hidden state
    minus the first one's, zeros, ones and the mask in the padded slots), then the argmax."""
    mask = jnp.arange(hidden.shape[0]) < count
    h = jnp.where(mask[:, None], hidden - hidden[0], 0.0)
    padded = PaddedLabelledDecisions(h[None], jnp.where(mask, log_q, 0.0)[None], jnp.where(mask, n_tokens, 1)[None],
                                     mask[None], jnp.zeros(1, jnp.int32), jnp.ones(1, hidden.dtype))
    t = Terms(*(x[0] for x in problem_terms(alpha, prepare(padded, gamma, eps))))
    finite = jnp.all(jnp.isfinite(jnp.where(mask[:, None], hidden, 0.0))) & jnp.all(jnp.isfinite(jnp.where(mask, log_q, 0.0)))
    chosen = jnp.argmax(jnp.where(mask, t.log_p, -jnp.inf)).astype(jnp.int32)
    return DeviceDecision(t, chosen, finite)


#: The decision kernel of one padded candidate set (:func:`_k_decide`, a compiled function), for a
#: program that takes its decision inside itself (an LM backend's scoring pass, then the decision).
decide_padded = _k_decide


@compiled
def _k_objective(alpha, padded, lam, gamma, eps):
    return problem_objective(alpha, prepare(padded, gamma, eps), lam)


@compiled
def _k_value_and_grad(alpha, padded, lam, gamma, eps):
    return value_and_grad(alpha, prepare(padded, gamma, eps), lam)


@compiled
def _k_hessian(alpha, padded, lam, gamma, eps):
    return problem_hessian(alpha, prepare(padded, gamma, eps), lam)


def _pad(decisions: LabelledDecisions, alpha=None) -> tuple[PaddedLabelledDecisions, np.dtype]:
    if not isinstance(decisions, LabelledDecisions):
        raise TypeError(f"expected cb_core.LabelledDecisions, got {type(decisions).__name__}")
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(decisions)):
        raise TypeError("decisions are traced: pad them outside jit (cb_core.decisions.to_padded) "
                        "and call the kernels of cb_core.model on prepare(padded, gamma, eps)")
    wide = jnp.result_type(decisions.hidden if alpha is None else jnp.result_type(decisions.hidden,
                                                                                  alpha))
    dtype = np.dtype(np.float64) if wide == jnp.float64 else np.dtype(np.float32)
    return to_padded(decisions, dtype=dtype), dtype


def features(decisions: LabelledDecisions, eps: float = 1e-6):
    """[T, m] seed App. B features (standardised hidden states, then the bias M_i ** -0.5)."""
    padded, dtype = _pad(decisions)
    return padded.unpad(_k_features(padded, dtype.type(eps)))


def prior_log_probs(decisions: LabelledDecisions, gamma: float = 0.8):
    """[T] normalised length-corrected prior log Qbar (Eq. 3, App. B); logsumexp per set is 0."""
    padded, dtype = _pad(decisions)
    return padded.unpad(_k_prior(padded, dtype.type(gamma)))


def log_probs(alpha, decisions: LabelledDecisions, gamma: float = 0.8, eps: float = 1e-6):
    """[T] log P_alpha(a|x) over each candidate set (Eq. 3). alpha: [m] float."""
    padded, dtype = _pad(decisions, alpha)
    out = _k_log_probs(jnp.asarray(alpha, dtype), padded, dtype.type(gamma), dtype.type(eps))
    return padded.unpad(out)


def terms(alpha, decisions: LabelledDecisions, gamma: float = 0.8, eps: float = 1e-6) -> Terms:
    """The three terms of Eq. 3 for every candidate of a ragged set, each [T], from one kernel
    (one padding, one compiled call): ``log_p`` equals :func:`log_probs`, ``prior``
    :func:`prior_log_probs`, ``concept_term`` ``features(decisions, eps) @ alpha``. alpha: [m] float."""
    padded, dtype = _pad(decisions, alpha)
    out = _k_terms(jnp.asarray(alpha, dtype), padded, dtype.type(gamma), dtype.type(eps))
    return Terms(*(padded.unpad(x) for x in out))


def objective(alpha, decisions: LabelledDecisions, lam: float = 1.0, gamma: float = 0.8,
              eps: float = 1e-6):
    """Eq. 6: mean negative log-likelihood of the expert actions + lam/2 ||alpha||^2 (nats)."""
    padded, dtype = _pad(decisions, alpha)
    return _k_objective(jnp.asarray(alpha, dtype), padded,
                        *(dtype.type(x) for x in (lam, gamma, eps)))


def gradient(alpha, decisions: LabelledDecisions, lam: float = 1.0, gamma: float = 0.8,
             eps: float = 1e-6):
    """[m] analytic gradient of :func:`objective`: (1/N) sum_i (E_{P_i}[phi] - phi(a*_i)) +
    lam alpha."""
    padded, dtype = _pad(decisions, alpha)
    return _k_value_and_grad(jnp.asarray(alpha, dtype), padded,
                             *(dtype.type(x) for x in (lam, gamma, eps)))[1]


def hessian(alpha, decisions: LabelledDecisions, lam: float = 1.0, gamma: float = 0.8,
            eps: float = 1e-6):
    """[m, m] explicit Hessian of :func:`objective`: (1/N) sum_i Cov_{P_i}(phi) + lam I."""
    padded, dtype = _pad(decisions, alpha)
    return _k_hessian(jnp.asarray(alpha, dtype), padded,
                      *(dtype.type(x) for x in (lam, gamma, eps)))
