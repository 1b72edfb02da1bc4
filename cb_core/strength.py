"""The L2 strength chosen by cross-validation: folds by trajectory, a log-spaced grid, one batched fit.

Eq. 6's strength lam trades the expert decisions' likelihood against ||alpha||^2; a fixed lam = 1
serves 2 demonstrations and 20 alike. :func:`select_strengths` chooses it per decision set (one set
per task type) from the held-out expert-choice log-likelihood:

1. the decisions of one set are split into folds **by trajectory** (``groups``: the trajectory of
   each decision; a trajectory's decisions are never split), ``n_folds`` folds or one per
   trajectory when there are fewer;
2. for every fold f and strength lam_l of the grid, the concept is fitted on the other folds'
   decisions (0/1 decision weights, :func:`cb_core.fit_many`): every fold x strength x set is one
   problem of **one** batched fit;
3. each decision is scored once, held out: its expert action's log-probability under the concept
   fitted without its fold (Eq. 3: log P_alpha(a*|x) = s(a*) - logsumexp_a s(a),
   s(a) = log Qbar(a|x) + alpha . phi(x, a));
4. the curve is the mean held-out log-likelihood per strength (nats per decision) with its
   standard error over folds (the std of the F fold means over sqrt(F));
5. the rule: ``"one-se"`` (default) takes the **largest** strength whose mean lies within one
   standard error of the best mean (the simplest concept the data cannot tell from the best: with
   2 to 5 trajectories a type the curve is noisy and the best point overfits its folds);
   ``"best"`` takes the maximiser.

Imports nothing of this project outside :mod:`cb_core`; no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Literal

import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike, DTypeLike

from cb_core.decisions import Decisions
from cb_core.fit import DEFAULT_SOLVER, fit_many
from cb_core.model import features, prior_log_probs
from cb_core.solvers import Solver

__all__ = ["DEFAULT_GRID", "DEFAULT_FOLDS", "RULES", "StrengthCurve", "fold_of", "held_out_log_likelihood",
           "select_strengths"]

#: the default grid: 10 strengths log-spaced at half decades, 10**-2.5 to 10**2 (lam = 1 among them)
DEFAULT_GRID: tuple[float, ...] = tuple(float(10.0 ** (k / 2)) for k in range(-5, 5))
#: the default number of folds (fewer when a set has fewer trajectories: one per trajectory)
DEFAULT_FOLDS = 5
#: the rules that pick a strength from the curve
RULES = ("one-se", "best")


@dataclasses.dataclass(frozen=True)
class StrengthCurve:
    """The cross-validation curve of one decision set and the strength chosen from it.

    Attributes:
        lams: [L] the grid (ascending).
        fold_means: [F, L] float64, each fold's mean held-out expert log-likelihood (nats per decision).
        mean: [L] float64, the mean over all decisions, each held out once (nats per decision).
        se: [L] float64, the standard error over folds: std(fold_means, ddof=1) / sqrt(F).
        chosen: the strength the rule picks.
        best: the strength of the largest mean.
        rule: ``"one-se"`` or ``"best"``.
        n_folds, n_trajectories, n_decisions: the split's sizes.
    """

    lams: tuple[float, ...]
    fold_means: np.ndarray
    mean: np.ndarray
    se: np.ndarray
    chosen: float
    best: float
    rule: str
    n_folds: int
    n_trajectories: int
    n_decisions: int

    def to_dict(self) -> dict:
        """A JSON-ready record (plain floats and lists): the concept's provenance."""
        return {"rule": self.rule, "chosen": self.chosen, "best": self.best, "lams": list(self.lams),
                "mean": self.mean.tolist(), "se": self.se.tolist(), "fold_means": self.fold_means.tolist(),
                "n_folds": self.n_folds, "n_trajectories": self.n_trajectories, "n_decisions": self.n_decisions}


def fold_of(groups: ArrayLike, n_folds: int = DEFAULT_FOLDS) -> tuple[np.ndarray, int]:
    """The fold of each decision: trajectories (in order of first appearance) dealt round-robin
    into min(n_folds, #trajectories) folds.

    Args:
        groups: [N] hashable-valued (int or str) trajectory label of each decision.
        n_folds: the most folds, >= 2.

    Returns:
        ([N] int64 fold index, F the number of folds).

    Raises:
        ValueError: fewer than two trajectories (nothing to hold out) or ``n_folds`` < 2.
    """
    if not (isinstance(n_folds, (int, np.integer)) and n_folds >= 2):
        raise ValueError(f"n_folds must be an int >= 2, got {n_folds!r}")
    labels = list(np.asarray(groups).tolist())
    order = list(dict.fromkeys(labels))
    if len(order) < 2:
        raise ValueError(f"cross-validation needs decisions of at least 2 trajectories, got {len(order)} "
                         "(collect more demonstrations, or pass a fixed strength)")
    n = min(int(n_folds), len(order))
    index = {g: i % n for i, g in enumerate(order)}
    return np.array([index[g] for g in labels], dtype=np.int64), n


def held_out_log_likelihood(alphas: ArrayLike, decisions: Decisions, gamma: float = 0.8,
                            eps: float = 1e-6) -> np.ndarray:
    """[K, N] float64: log P_alpha_k(a*_i | x_i) (Eq. 3) of every decision's expert action under each of
    K concepts ``alphas`` [K, d + 1]; the features and the prior computed once, the K concepts' scores
    in one matrix product, the per-set log-softmax in float64."""
    phi = np.asarray(features(decisions, eps), np.float64)  # [T, m]
    prior = np.asarray(prior_log_probs(decisions, gamma), np.float64)  # [T]
    s = prior[:, None] + phi @ np.asarray(alphas, np.float64).T  # [T, K]
    starts = np.asarray(decisions.offsets)[:-1]
    top = np.maximum.reduceat(s, starts, axis=0)  # [N, K]
    seg = np.asarray(decisions.segment_ids)
    lse = np.log(np.add.reduceat(np.exp(s - top[seg]), starts, axis=0)) + top
    expert_rows = starts + np.asarray(decisions.expert)
    return (s[expert_rows] - lse).T


def _pick(lams: np.ndarray, mean: np.ndarray, se: np.ndarray, rule: str) -> tuple[float, float]:
    best = int(np.argmax(mean))
    if rule == "best":
        return float(lams[best]), float(lams[best])
    within = np.flatnonzero(mean >= mean[best] - se[best])
    return float(lams[within.max()]), float(lams[best])


def select_strengths(
    decision_sets: Sequence[Decisions],
    groups: Sequence[ArrayLike],
    *,
    lams: Sequence[float] = DEFAULT_GRID,
    n_folds: int = DEFAULT_FOLDS,
    rule: Literal["one-se", "best"] = "one-se",
    solver: Solver = DEFAULT_SOLVER,
    gamma: float = 0.8,
    eps: float = 1e-6,
    dtype: DTypeLike = jnp.float32,
) -> list[StrengthCurve]:
    """Choose each decision set's L2 strength by cross-validation over trajectories, all sets,
    folds and strengths in one :func:`cb_core.fit_many` call.

    Args:
        decision_sets: S decision sets of one hidden width d (one per task type).
        groups: S arrays [N_s], the trajectory of each decision (folds never split a trajectory).
        lams: the grid, > 0 (default :data:`DEFAULT_GRID`: 10 strengths, 10**-2.5 to 10**2).
        n_folds: folds per set (default 5; a set with fewer trajectories gets one fold each).
        rule: ``"one-se"`` (the largest strength within one standard error of the best) or ``"best"``.
        solver, gamma, eps, dtype: as for :func:`cb_core.fit`.

    Returns:
        S :class:`StrengthCurve`, in the order of ``decision_sets``.

    Raises:
        ValueError: an unknown rule, an empty or non-positive grid, ``groups`` that do not match the
            sets' sizes, a set with fewer than 2 trajectories, and whatever :func:`cb_core.fit_many`
            refuses.
    """
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    grid = np.asarray(sorted(float(x) for x in lams), np.float64)
    if grid.size == 0 or not np.all(np.isfinite(grid) & (grid > 0)):
        raise ValueError(f"lams must be a non-empty grid of finite strengths > 0, got {list(lams)!r}")
    sets = list(decision_sets)
    if len(groups) != len(sets):
        raise ValueError(f"groups: {len(groups)} label arrays for {len(sets)} decision sets")
    folds = []
    for s, (dec, g) in enumerate(zip(sets, groups)):
        if np.shape(g) != (dec.n_decisions,):
            raise ValueError(f"groups[{s}] has shape {np.shape(g)}, its decision set holds {dec.n_decisions} decisions")
        folds.append((*fold_of(g, n_folds), len(set(np.asarray(g).tolist()))))
    n_max = max(f for _, f, _ in folds)
    # problem (f, l) of a set fits on the decisions outside fold f at strength l; a set with fewer
    # folds repeats its last fold's problems (their results are not read)
    weights = [np.repeat(np.stack([(fold != min(f, n - 1)).astype(np.float64) for f in range(n_max)]), grid.size, axis=0)
               for fold, n, _ in folds]
    lam = np.broadcast_to(np.tile(grid, n_max), (len(sets), n_max * grid.size))
    results = fit_many(sets, solver, lam=lam, weights=weights, gamma=gamma, eps=eps, dtype=dtype, certify="structural")
    curves = []
    for dec, (fold, n, n_groups), res in zip(sets, folds, results):
        alphas = np.stack([r.alpha for r in res[:n * grid.size]])  # [F L, m]: the set's own folds
        # each decision held out once: scored by the concepts fitted without its fold (the features
        # and the prior computed once for all F x L concepts)
        ll = held_out_log_likelihood(alphas, dec, gamma, eps).reshape(n, grid.size, -1)  # [F, L, N]
        own = ll[fold, :, np.arange(dec.n_decisions)]  # [N, L]
        fold_means = np.stack([own[fold == f].mean(axis=0) for f in range(n)])
        mean = own.mean(axis=0)
        se = fold_means.std(axis=0, ddof=1) / np.sqrt(n)
        chosen, best = _pick(grid, mean, se, rule)
        curves.append(StrengthCurve(tuple(grid.tolist()), fold_means, mean, se, chosen, best, rule, n, n_groups,
                                    dec.n_decisions))
    return curves
