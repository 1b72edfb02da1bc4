"""Shared helpers for the cb_core tests (imported by name; not a conftest): random ragged decision
sets and their strategy (from the public kit, :mod:`cb_core.testing`), decision-set files and an
independent numpy reference of the model."""

from __future__ import annotations

import numpy as np
import cb_core
from cb_core.testing import ragged, random_decisions, random_lists  # noqa: F401 (the tests' names)


def save_decisions(path, dec: cb_core.LabelledDecisions, metadata: dict | None = None) -> None:
    """Write a decision-set file at ``path`` (plainly: cb_core writes to an open file)."""
    with open(path, "wb") as f:
        cb_core.write_decisions(f, dec, metadata)


def as_float64(dec: cb_core.LabelledDecisions) -> cb_core.LabelledDecisions:
    return cb_core.LabelledDecisions(np.asarray(dec.hidden, np.float64), np.asarray(dec.log_q, np.float64),
                                     dec.n_tokens, dec.offsets, dec.segment_ids, dec.expert)


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
