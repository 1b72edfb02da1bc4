"""Shared helpers for the cb_core tests (imported by name; not a conftest): random ragged decision
sets (numpy, seeded) and an independent numpy reference of the model."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

import cb_core


def random_lists(seed: int, sizes, d: int, scale: float = 1.0):
    rng = np.random.default_rng(seed)
    hidden = [rng.standard_normal((m, d)) * scale + rng.standard_normal(d) for m in sizes]
    n_tokens = [rng.integers(1, 9, size=m) for m in sizes]
    log_q = [-rng.gamma(2.0, 1.5, size=m) * nt ** 0.5 for m, nt in zip(sizes, n_tokens)]
    expert = [int(rng.integers(0, m)) for m in sizes]
    return hidden, log_q, n_tokens, expert


def random_decisions(seed: int, sizes, d: int, scale: float = 1.0) -> cb_core.Decisions:
    return cb_core.decisions_from_lists(*random_lists(seed, sizes, d, scale))


def save_decisions(path, dec: cb_core.Decisions, metadata: dict | None = None) -> None:
    """Write a decision-set file at ``path`` (plainly: cb_core writes to an open file)."""
    with open(path, "wb") as f:
        cb_core.write_decisions(f, dec, metadata)


def as_float64(dec: cb_core.Decisions) -> cb_core.Decisions:
    return cb_core.Decisions(np.asarray(dec.hidden, np.float64), np.asarray(dec.log_q, np.float64),
                             dec.n_tokens, dec.offsets, dec.segment_ids, dec.expert)


@st.composite
def ragged(draw, max_n: int = 6, max_m: int = 6, min_d: int = 3, max_d: int = 4):
    """(seed, sizes, d) of a random ragged decision set."""
    n = draw(st.integers(1, max_n))
    sizes = draw(st.lists(st.integers(1, max_m), min_size=n, max_size=n))
    d = draw(st.integers(min_d, max_d))
    seed = draw(st.integers(0, 2**31 - 1))
    return seed, sizes, d



def reference_model(hidden, log_q, n_tokens, expert, lam=1.0, gamma=0.8, eps=1e-6):
    """The concept model in plain numpy float64, written from the seed's equations (Eq. 3, Eq. 6,
    App. B) and not from cb_core, as lists of per-decision arrays:

    * log Qbar(a) = log q(a) / L(a) ** gamma, normalised over the candidate set;
    * phi(a)_k = (h_ak - mean over the set of h_k) / max(population std over the set of h_k, eps),
      plus the bias coordinate M ** -0.5;
    * log P(a) = log-softmax over the set of log Qbar(a) + alpha . phi(a);
    * L(alpha) = mean over decisions of -log P(expert) + lam / 2 ||alpha||^2, and its gradient
      mean over decisions of (sum_a P(a) phi(a) - phi(expert)) + lam alpha.

    Returns (log_p, objective, gradient): functions of alpha [d + 1] giving a list of [M_i]
    arrays, a float and a [d + 1] array.
    """
    from scipy.special import logsumexp

    phis, priors = [], []
    for h, lq, nt in zip(hidden, log_q, n_tokens):
        h = np.asarray(h, np.float64)
        standardised = (h - h.mean(axis=0)) / np.maximum(h.std(axis=0), eps)
        phis.append(np.hstack([standardised, np.full((len(h), 1), len(h) ** -0.5)]))
        lq_bar = np.asarray(lq, np.float64) / np.asarray(nt, np.float64) ** gamma
        priors.append(lq_bar - logsumexp(lq_bar))

    def log_p(alpha):
        alpha = np.asarray(alpha, np.float64)
        out = []
        for phi, prior in zip(phis, priors):
            s = prior + phi @ alpha
            out.append(s - logsumexp(s))
        return out

    def objective(alpha):
        alpha = np.asarray(alpha, np.float64)
        nll = [-lp[e] for lp, e in zip(log_p(alpha), expert)]
        return float(np.mean(nll) + 0.5 * lam * alpha @ alpha)

    def gradient(alpha):
        alpha = np.asarray(alpha, np.float64)
        terms = [np.exp(lp) @ phi - phi[e] for lp, phi, e in zip(log_p(alpha), phis, expert)]
        return np.mean(terms, axis=0) + lam * alpha

    return log_p, objective, gradient
