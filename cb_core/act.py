"""Act-time scoring of one candidate set: log P over the candidates and the choice (Eq. 3, Eq. 7).

Called once per agent step, so it must be fast: the candidate count M is padded to a bucket
(:func:`cb_core.decisions.bucket_size`, minimum 8) with masked slots, and the jitted kernel is
compiled once per (bucket, d, dtype) instead of once per step. Pure maths, no I/O.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cb_core.decisions import bucket_size
from cb_core.model import _masked_features, _masked_prior

__all__ = ["candidate_log_probs", "choose"]


@jax.jit
def _kernel(hidden, log_q, n_tokens, mask, alpha, gamma, eps):
    phi, bias = _masked_features(hidden, mask, eps)
    prior = _masked_prior(log_q, n_tokens, mask, gamma)
    s = jnp.where(mask, prior + phi @ alpha[:-1] + bias * alpha[-1], -jnp.inf)
    mx = jnp.max(s)
    lse = jnp.log(jnp.sum(jnp.exp(s - mx))) + mx
    return jnp.where(mask, s - lse, -jnp.inf)


def _check(hidden, log_q, n_tokens, alpha):
    hidden = np.asarray(hidden)
    if hidden.ndim != 2:
        raise ValueError(f"hidden must be [M, d], got shape {hidden.shape}")
    m, d = hidden.shape
    if m < 1:
        raise ValueError("empty candidate set (M = 0)")
    log_q = np.asarray(log_q).reshape(-1)
    n_tokens = np.asarray(n_tokens).reshape(-1)
    if log_q.shape != (m,) or n_tokens.shape != (m,):
        raise ValueError(f"log_q {log_q.shape} and n_tokens {n_tokens.shape} must be [M] = [{m}]")
    if not np.isfinite(hidden).all():
        raise ValueError(f"non-finite hidden in candidate {np.flatnonzero(~np.isfinite(hidden).all(1))[0]}")
    if not np.isfinite(log_q).all():
        raise ValueError(f"non-finite log_q in candidate {np.flatnonzero(~np.isfinite(log_q))[0]}")
    if (n_tokens < 1).any():
        raise ValueError(f"n_tokens < 1 in candidate {np.flatnonzero(n_tokens < 1)[0]}")
    if alpha is None:
        alpha = np.zeros(d + 1, np.float32)
    else:
        alpha = np.asarray(alpha)
        if alpha.shape != (d + 1,):
            raise ValueError(f"alpha must be [d + 1] = [{d + 1}], got shape {alpha.shape}")
        if not np.isfinite(alpha).all():
            raise ValueError("alpha has non-finite entries")
    return hidden, log_q, n_tokens, alpha


def candidate_log_probs(
    hidden: Any,
    log_q: Any,
    n_tokens: Any,
    alpha: Any | None,
    gamma: float = 0.8,
    eps: float = 1e-6,
) -> np.ndarray:
    """log P_alpha(a | x) over one candidate set (Eq. 3), as numpy [M] (float32).

    Args:
        hidden: [M, d] raw hidden states of the M candidates.
        log_q: [M] summed action-token log-probabilities (nats).
        n_tokens: [M] action token counts (>= 1).
        alpha: [d + 1] concept, or None for the prior-only control (alpha = 0).
        gamma, eps: as in :func:`cb_core.fit` (use the concept's own values).

    Raises:
        ValueError: empty set, shape mismatch, non-finite input, n_tokens < 1.
    """
    hidden, log_q, n_tokens, alpha = _check(hidden, log_q, n_tokens, alpha)
    m, d = hidden.shape
    mp = bucket_size(m)
    h = np.zeros((mp, d), np.float32)
    h[:m] = hidden
    q = np.zeros(mp, np.float32)
    q[:m] = log_q
    nt = np.ones(mp, np.int32)
    nt[:m] = n_tokens
    mask = np.zeros(mp, bool)
    mask[:m] = True
    out = _kernel(h, q, nt, mask, alpha.astype(np.float32), np.float32(gamma), np.float32(eps))
    return np.asarray(out)[:m]


def choose(hidden: Any, log_q: Any, n_tokens: Any, alpha: Any | None, gamma: float = 0.8,
           eps: float = 1e-6) -> int:
    """The chosen candidate (Eq. 7): argmax of :func:`candidate_log_probs`.

    Tie rule (deterministic): among candidates with exactly equal log P, the lowest index wins.
    """
    return int(np.argmax(candidate_log_probs(hidden, log_q, n_tokens, alpha, gamma, eps)))
