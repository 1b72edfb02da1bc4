"""Synthetic decision sets shaped like the seed's settings (for tests and benchmarks only).

Hidden states are low-rank plus noise (LM hidden states are strongly correlated), log-probs are
negative, and the expert is sampled from the concept model with a planted alpha, so the fit has
signal to find.
"""

from __future__ import annotations

import numpy as np

from cb_core.decisions import LabelledDecisions, decisions_from_lists

__all__ = ["synthetic_decisions"]


def synthetic_decisions(n: int, d: int, m_mean: int = 25, m_spread: int = 6, seed: int = 0,
                        rank: int = 16, min_m: int = 1) -> LabelledDecisions:
    """N decisions with M_i uniform in [m_mean - m_spread, m_mean + m_spread] (at least min_m).

    Returns validated float32 :class:`LabelledDecisions`.
    """
    rng = np.random.default_rng(seed)
    basis = rng.standard_normal((rank, d)).astype(np.float32) * 2.0
    planted = rng.standard_normal(d).astype(np.float32) / np.sqrt(d) * 3.0
    hs, lqs, nts, ex = [], [], [], []
    for _ in range(n):
        m = int(max(min_m, rng.integers(m_mean - m_spread, m_mean + m_spread + 1)))
        h = (rng.standard_normal((m, rank)).astype(np.float32) @ basis
             + rng.standard_normal((m, d)).astype(np.float32) + rng.standard_normal(d).astype(np.float32) * 3)
        nt = rng.integers(1, 12, size=m)
        lq = -rng.gamma(2.0, 2.0, size=m).astype(np.float32) * nt ** 0.5
        z = (h - h.mean(0)) / np.maximum(h.std(0), 1e-6)
        s = lq / nt ** 0.8 + z @ planted
        p = np.exp(s - s.max())
        p /= p.sum()
        ex.append(int(rng.choice(m, p=p)))
        hs.append(h)
        lqs.append(lq)
        nts.append(nt)
    return decisions_from_lists(hs, lqs, nts, ex)
