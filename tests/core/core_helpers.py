"""Shared helpers for the cb_core tests (imported by name; not a conftest): random ragged decision sets (numpy, seeded)."""

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

