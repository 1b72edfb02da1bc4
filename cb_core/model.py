"""The concept model as pure JAX functions: features, prior, action distribution, objective.

Seed paper notation: decision i has candidate set A_i of M_i actions; row t of the ragged layout
is candidate a of decision i = segment_ids[t]; m = d + 1 is the feature size.

* Features (seed App. B):   phi(x, a; A)_k = (h_ak - mean_A h_k) / max(std_A h_k, eps),  k < d,
                            phi_d = M_i ** -0.5  (the bias coordinate).
* Prior (Eq. 3, App. B):    log Qbar(a|x) = log q(a|x) / n_tokens(a) ** gamma, log-normalised
                            over A_i.
* Action law (Eq. 3):       log P_alpha(a|x) = log-softmax over A_i of (log Qbar + alpha . phi).
* Objective (Eq. 6):        L(alpha) = (1/N) sum_i -log P_alpha(a*_i|x_i) + lam/2 ||alpha||^2.
* Hessian:                  H = (1/N) sum_i Cov_{P_i}(phi) + lam I  (so H >= lam I: strongly
                            convex, unique optimum).

Everything here is jit-compatible and does no I/O. The number of decisions (segments) is read
from array *shapes* (``offsets`` is [N+1]), so it is static under jit. Imports nothing else of
this project except :mod:`cb_core.decisions`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from cb_core.decisions import Decisions, PaddedDecisions

__all__ = [
    "segment_logsumexp",
    "standardized_features",
    "features",
    "prior_log_probs",
    "log_probs",
    "objective",
    "gradient",
    "hessian",
    "padded_features",
    "padded_log_probs",
    "padded_objective",
]


# ----------------------------------------------------------------------------------------------
# ragged primitives
# ----------------------------------------------------------------------------------------------

def _segment_sum(x, segment_ids, num_segments):
    return jax.ops.segment_sum(x, segment_ids, num_segments, indices_are_sorted=True)


def segment_logsumexp(x, segment_ids, num_segments: int):
    """Log-sum-exp of ``x`` [T] within each segment -> [num_segments] (empty segments give 0).

    Stable (max-shifted); rows equal to -inf contribute nothing.
    """
    mx = jax.ops.segment_max(x, segment_ids, num_segments, indices_are_sorted=True)
    mx = lax.stop_gradient(jnp.where(jnp.isfinite(mx), mx, 0.0))
    s = _segment_sum(jnp.exp(x - mx[segment_ids]), segment_ids, num_segments)
    return jnp.log(jnp.where(s > 0, s, 1.0)) + mx


def standardized_features(hidden, segment_ids, num_segments: int, eps: float = 1e-6):
    """Seed App. B features in two parts: ([T, d] standardised hidden, [T] bias M_i ** -0.5).

    Per decision and coordinate: subtract the mean across candidates and divide by
    max(population std, eps). Rows are first shifted by their decision's first row (exact for
    constant coordinates, which therefore get feature exactly 0, and better conditioned).
    Kept as two arrays so the fit never copies [T, d] into [T, d + 1].
    """
    t = hidden.shape[0]
    ones = jnp.ones((t,), hidden.dtype)
    counts = _segment_sum(ones, segment_ids, num_segments)  # [S]
    safe = jnp.maximum(counts, 1.0)
    # first row of each segment (rows are sorted by segment)
    first = jnp.searchsorted(segment_ids, jnp.arange(num_segments, dtype=segment_ids.dtype))
    first = jnp.clip(first, 0, t - 1)
    shifted = hidden - hidden[first][segment_ids]
    mean = _segment_sum(shifted, segment_ids, num_segments) / safe[:, None]
    centred = shifted - mean[segment_ids]
    var = _segment_sum(centred * centred, segment_ids, num_segments) / safe[:, None]
    scale = jnp.maximum(jnp.sqrt(var), eps)
    phi = centred / scale[segment_ids]
    bias = lax.rsqrt(safe)[segment_ids]
    return phi, bias


def _prior(log_q, n_tokens, segment_ids, num_segments, gamma):
    lq = log_q / n_tokens.astype(log_q.dtype) ** gamma
    return lq - segment_logsumexp(lq, segment_ids, num_segments)[segment_ids]


# ----------------------------------------------------------------------------------------------
# the prepared problem (shared by the public functions and the fitter)
# ----------------------------------------------------------------------------------------------

@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Problem:
    """Everything the objective needs, precomputed once per fit (arrays only; a pytree).

    phi [T, d], bias [T], prior [T], segment_ids [T], expert_rows [S] (global row of each
    expert action), weight [S] (1 for real decisions, 0 for padding), n_real [] (N).
    """

    phi: Any
    bias: Any
    prior: Any
    segment_ids: Any
    expert_rows: Any
    weight: Any
    n_real: Any

    @property
    def num_segments(self) -> int:
        return int(self.weight.shape[0])


def make_problem(decisions: Decisions, gamma=0.8, eps=1e-6, weight=None, n_real=None) -> Problem:
    """Precompute features and prior for ``decisions`` (jit-compatible)."""
    s = decisions.offsets.shape[0] - 1
    seg = jnp.asarray(decisions.segment_ids)
    hidden = jnp.asarray(decisions.hidden)
    phi, bias = standardized_features(hidden, seg, s, eps)
    prior = _prior(jnp.asarray(decisions.log_q), jnp.asarray(decisions.n_tokens), seg, s, gamma)
    offsets = jnp.asarray(decisions.offsets)
    rows = jnp.clip(offsets[:-1] + jnp.asarray(decisions.expert), 0, hidden.shape[0] - 1)
    if weight is None:
        weight = jnp.ones((s,), hidden.dtype)
    if n_real is None:
        n_real = jnp.asarray(s, hidden.dtype)
    return Problem(phi, bias, prior, seg, rows.astype(jnp.int32), weight, n_real)


def _scores(alpha, p: Problem):
    return p.prior + p.phi @ alpha[:-1] + p.bias * alpha[-1]


def problem_log_probs(alpha, p: Problem):
    """[T] log P_alpha over each candidate set (Eq. 3)."""
    s = _scores(alpha, p)
    return s - segment_logsumexp(s, p.segment_ids, p.num_segments)[p.segment_ids]


def problem_objective(alpha, p: Problem, lam):
    """Eq. 6: weighted mean expert NLL + lam/2 ||alpha||^2."""
    s = _scores(alpha, p)
    lse = segment_logsumexp(s, p.segment_ids, p.num_segments)
    nll = jnp.sum(p.weight * (lse - s[p.expert_rows])) / p.n_real
    return nll + 0.5 * lam * jnp.vdot(alpha, alpha)


def problem_hessian_factor(alpha, p: Problem):
    """B [T, m] with H = B^T B + lam I: rows sqrt(w P / N) (phi - E_P[phi]) (covariance factor)."""
    logp = problem_log_probs(alpha, p)
    prob = jnp.exp(logp)
    full = jnp.concatenate([p.phi, p.bias[:, None]], axis=1)
    mean = _segment_sum(prob[:, None] * full, p.segment_ids, p.num_segments)
    centred = full - mean[p.segment_ids]
    row_w = prob * p.weight[p.segment_ids] / p.n_real
    return jnp.sqrt(row_w)[:, None] * centred


def problem_hessian(alpha, p: Problem, lam):
    """Explicit [m, m] Hessian (1/N) sum_i Cov_{P_i}(phi) + lam I."""
    b = problem_hessian_factor(alpha, p)
    return b.T @ b + lam * jnp.eye(b.shape[1], dtype=b.dtype)


# ----------------------------------------------------------------------------------------------
# public functions on Decisions (ragged layout)
# ----------------------------------------------------------------------------------------------
# With concrete (numpy) decisions these pad to shape buckets with zero-weight rows and call one
# jit-compiled kernel, so calls on nearby shapes reuse compiled code; with traced decisions
# (inside a user's jit) they trace straight through.

def _is_concrete(decisions: Decisions) -> bool:
    return not any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(decisions))


def _bucketed(decisions: Decisions, alpha=None):
    """(padded decisions, weight, n_real, T) for concrete input, else None."""
    if not _is_concrete(decisions):
        return None
    from cb_core.fit import pad_to_buckets  # local: fit imports this module

    hidden = decisions.hidden
    dtype = jnp.result_type(hidden if alpha is None else jnp.result_type(hidden, alpha))
    dtype = jnp.dtype(jnp.float64) if dtype == jnp.float64 else jnp.dtype(jnp.float32)
    t = int(hidden.shape[0])
    import numpy as np

    padded, weight = pad_to_buckets(decisions, np.dtype(dtype.name))
    return padded, weight, np.asarray(decisions.offsets.shape[0] - 1, dtype.name), t


@jax.jit
def _k_features(dec, weight, n_real, eps):
    p = make_problem(dec, 0.0, eps, weight, n_real)
    return jnp.concatenate([p.phi, p.bias[:, None]], axis=1)


@jax.jit
def _k_prior(dec, weight, n_real, gamma):
    return make_problem(dec, gamma, 1e-6, weight, n_real).prior


@jax.jit
def _k_log_probs(alpha, dec, weight, n_real, gamma, eps):
    return problem_log_probs(alpha, make_problem(dec, gamma, eps, weight, n_real))


@jax.jit
def _k_objective(alpha, dec, weight, n_real, lam, gamma, eps):
    return problem_objective(alpha, make_problem(dec, gamma, eps, weight, n_real), lam)


@jax.jit
def _k_hessian(alpha, dec, weight, n_real, lam, gamma, eps):
    return problem_hessian(alpha, make_problem(dec, gamma, eps, weight, n_real), lam)


def features(decisions: Decisions, eps: float = 1e-6):
    """Seed App. B features phi [T, m = d + 1] (standardised hidden states, then bias M_i**-0.5)."""
    b = _bucketed(decisions)
    if b is None:
        p = make_problem(decisions, 0.0, eps)
        return jnp.concatenate([p.phi, p.bias[:, None]], axis=1)
    dec, w, n, t = b
    return _k_features(dec, w, n, jnp.asarray(eps, w.dtype))[:t]


def prior_log_probs(decisions: Decisions, gamma: float = 0.8):
    """[T] normalised length-corrected prior log Qbar (Eq. 3, App. B); logsumexp per set is 0."""
    b = _bucketed(decisions)
    if b is None:
        return make_problem(decisions, gamma).prior
    dec, w, n, t = b
    return _k_prior(dec, w, n, jnp.asarray(gamma, w.dtype))[:t]


def log_probs(alpha, decisions: Decisions, gamma: float = 0.8, eps: float = 1e-6):
    """[T] log P_alpha(a|x) over each candidate set (Eq. 3). alpha: [m] float."""
    alpha = jnp.asarray(alpha)
    b = _bucketed(decisions, alpha)
    if b is None:
        return problem_log_probs(alpha, make_problem(decisions, gamma, eps))
    dec, w, n, t = b
    return _k_log_probs(alpha.astype(w.dtype), dec, w, n, *(jnp.asarray(x, w.dtype)
                                                             for x in (gamma, eps)))[:t]


def objective(alpha, decisions: Decisions, lam: float = 1.0, gamma: float = 0.8,
              eps: float = 1e-6):
    """Eq. 6: mean negative log-likelihood of the expert actions + lam/2 ||alpha||^2 (nats)."""
    alpha = jnp.asarray(alpha)
    b = _bucketed(decisions, alpha)
    if b is None:
        return problem_objective(alpha, make_problem(decisions, gamma, eps), lam)
    dec, w, n, _ = b
    return _k_objective(alpha.astype(w.dtype), dec, w, n,
                        *(jnp.asarray(x, w.dtype) for x in (lam, gamma, eps)))


def gradient(alpha, decisions: Decisions, lam: float = 1.0, gamma: float = 0.8,
             eps: float = 1e-6):
    """[m] gradient of :func:`objective`: (1/N) sum_i (E_{P_i}[phi] - phi(a*_i)) + lam alpha."""
    return jax.grad(objective)(jnp.asarray(alpha), decisions, lam, gamma, eps)


def hessian(alpha, decisions: Decisions, lam: float = 1.0, gamma: float = 0.8,
            eps: float = 1e-6):
    """[m, m] explicit Hessian of :func:`objective`: (1/N) sum_i Cov_{P_i}(phi) + lam I."""
    alpha = jnp.asarray(alpha)
    b = _bucketed(decisions, alpha)
    if b is None:
        return problem_hessian(alpha, make_problem(decisions, gamma, eps), lam)
    dec, w, n, _ = b
    return _k_hessian(alpha.astype(w.dtype), dec, w, n,
                      *(jnp.asarray(x, w.dtype) for x in (lam, gamma, eps)))


# ----------------------------------------------------------------------------------------------
# padded layout ([N, M, .] + mask), used at act time and as a cross-check of the ragged code
# ----------------------------------------------------------------------------------------------

def _masked_features(hidden, mask, eps):
    """hidden [..., M, d], mask [..., M] -> (phi [..., M, d], bias [..., M]); zero where masked."""
    w = mask.astype(hidden.dtype)[..., None]
    count = jnp.maximum(jnp.sum(w, axis=-2, keepdims=True), 1.0)  # [..., 1, 1]
    shifted = (hidden - hidden[..., :1, :]) * w
    mean = jnp.sum(shifted, axis=-2, keepdims=True) / count
    centred = (shifted - mean) * w
    var = jnp.sum(centred * centred, axis=-2, keepdims=True) / count
    phi = centred / jnp.maximum(jnp.sqrt(var), eps)
    bias = jnp.broadcast_to(lax.rsqrt(count[..., 0]), mask.shape) * mask
    return phi, bias


def _masked_prior(log_q, n_tokens, mask, gamma):
    lq = jnp.where(mask, log_q / n_tokens.astype(log_q.dtype) ** gamma, -jnp.inf)
    mx = lax.stop_gradient(jnp.max(lq, axis=-1, keepdims=True))
    mx = jnp.where(jnp.isfinite(mx), mx, 0.0)
    lse = jnp.log(jnp.sum(jnp.exp(lq - mx), axis=-1, keepdims=True)) + mx
    return jnp.where(mask, lq - lse, -jnp.inf)


@jax.jit
def padded_features(padded: PaddedDecisions, eps: float = 1e-6):
    """[N_pad, M_pad, m] features of the padded layout (zero in padded slots)."""
    phi, bias = _masked_features(jnp.asarray(padded.hidden), jnp.asarray(padded.mask), eps)
    return jnp.concatenate([phi, bias[..., None]], axis=-1)


@jax.jit
def padded_log_probs(alpha, padded: PaddedDecisions, gamma: float = 0.8, eps: float = 1e-6):
    """[N_pad, M_pad] log P_alpha per candidate set (-inf in padded slots)."""
    alpha = jnp.asarray(alpha)
    mask = jnp.asarray(padded.mask)
    phi, bias = _masked_features(jnp.asarray(padded.hidden), mask, eps)
    prior = _masked_prior(jnp.asarray(padded.log_q), jnp.asarray(padded.n_tokens), mask, gamma)
    s = jnp.where(mask, prior + phi @ alpha[:-1] + bias * alpha[-1], -jnp.inf)
    mx = lax.stop_gradient(jnp.max(s, axis=-1, keepdims=True))
    mx = jnp.where(jnp.isfinite(mx), mx, 0.0)
    lse = jnp.log(jnp.sum(jnp.exp(s - mx), axis=-1, keepdims=True)) + mx
    return jnp.where(mask, s - lse, -jnp.inf)


@jax.jit
def padded_objective(alpha, padded: PaddedDecisions, lam: float = 1.0, gamma: float = 0.8,
                     eps: float = 1e-6):
    """Eq. 6 on the padded layout (padded decisions carry no weight)."""
    logp = padded_log_probs(alpha, padded, gamma, eps)
    dmask = jnp.asarray(padded.decision_mask)
    ll = jnp.take_along_axis(logp, jnp.asarray(padded.expert)[:, None], axis=1)[:, 0]
    nll = -jnp.sum(jnp.where(dmask, ll, 0.0)) / jnp.sum(dmask)
    alpha = jnp.asarray(alpha)
    return nll + 0.5 * lam * jnp.vdot(alpha, alpha)
