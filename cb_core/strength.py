"""The L2 strength chosen by cross-validation: folds by trajectory, a log-spaced grid, one batched fit.

Eq. 6's strength lam trades the expert decisions' likelihood against ||alpha||^2; a fixed lam = 1
serves 2 demonstrations and 20 alike. :func:`select_strengths` chooses it per decision set (one set
per task type) from held-out expert decisions:

1. the decisions of one set are split into folds **by trajectory** (``groups``: the trajectory of
   each decision; a trajectory's decisions are never split), ``n_folds`` folds or one per
   trajectory when there are fewer;
2. for every fold f and strength lam_l of the grid, the concept is fitted on the other folds'
   decisions (0/1 decision weights, :func:`cb_core.fit_many`): every fold x strength x set is one
   problem of **one** batched fit (:func:`cross_validate`);
3. each decision is scored once, held out, under the concept fitted without its fold: its expert
   action's log-probability (Eq. 3: log P_alpha(a*|x) = s(a*) - logsumexp_a s(a),
   s(a) = log Qbar(a|x) + alpha . phi(x, a)), whether the expert's action is the concept's top
   choice (top-1: what the agent does with it), and its rank (:class:`HeldOut`);
4. the curve is the mean held-out score per strength (``criterion``: top-1 by default, or the
   log-likelihood in nats per decision) with its standard error over folds (the std of the F fold
   means over sqrt(F)), and each strength's **paired** difference from the default strength
   (lam = 1) on the same decisions, with its standard error over folds (:func:`strength_curve`);
5. the rule picks a strength from the curve:

   - ``"default-se"`` (the default): keep the default strength unless some strength's mean beats
     the default's by more than ``z`` paired standard errors (:data:`DEFAULT_Z`) and, with a
     ``guard`` criterion (:data:`DEFAULT_GUARD`: the log-likelihood), its ``guard`` mean is not
     below the default's; then the best of those. A curve flat within its noise, which is what 2
     to 5 trajectories a type give, keeps the default;
   - ``"one-se"``: the **largest** strength whose mean lies within one standard error of the best
     mean (the simplest concept the data cannot tell from the best);
   - ``"best"``: the maximiser.

   Under every rule a curve on which no strength beats the default by more than ``z`` paired
   standard errors (and holds the guard) is **flat** (:attr:`StrengthCurve.flat`) and keeps the
   default; the best mean's ties go to the strength nearest the default.

The default rule, criterion and guard were chosen on held-out expert decisions
(``benchmarks/strength_rules.py``, docs/concept.md): the log-likelihood curve of a type with few
trajectories favours strong strengths that give the choice back to the prior, and the rules that
follow it lost top-1 where lam = 1 did not; top-1 alone, with 10 trajectories a type, chose weak
strengths whose concepts were right more often but confidently wrong where they were wrong, and
lost top-1 on other games; the guard (not less likely than the default on the held-out
decisions) removed those choices and no gain.

Imports nothing of this project outside :mod:`cb_core`; no I/O.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Sequence
from typing import Literal

import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike, DTypeLike

from cb_core.decisions import LabelledDecisions
from cb_core.fit import DEFAULT_SOLVER, fit_many
from cb_core.mesh import Devices
from cb_core.model import features, prior_log_probs
from cb_core.solvers import Solver

__all__ = ["CRITERIA", "DEFAULT_CRITERION", "DEFAULT_GRID", "DEFAULT_FOLDS", "DEFAULT_RULE", "DEFAULT_STRENGTH",
           "DEFAULT_GUARD", "DEFAULT_Z", "HeldOut", "RULES", "StrengthCurve", "cross_validate", "fold_of",
           "held_out_log_likelihood", "held_out_scores", "select_strengths", "strength_curve"]

#: the default grid: 10 strengths log-spaced at half decades, 10**-2.5 to 10**2 (lam = 1 among them)
DEFAULT_GRID: tuple[float, ...] = tuple(float(10.0 ** (k / 2)) for k in range(-5, 5))
#: the default number of folds (fewer when a set has fewer trajectories: one per trajectory)
DEFAULT_FOLDS = 5
#: the strength a flat curve keeps (the fixed default of ``--lam``)
DEFAULT_STRENGTH = 1.0
#: the rules that pick a strength from the curve
RULES = ("default-se", "one-se", "best")
#: the rule of :func:`select_strengths` and ``--lam auto``
DEFAULT_RULE = "default-se"
#: the held-out scores a curve can average: the expert action's log-likelihood, or whether it is the top choice
CRITERIA = ("log-lik", "top-1")
#: the criterion of :func:`select_strengths` and ``--lam auto``
DEFAULT_CRITERION = "top-1"
#: paired standard errors a strength must beat the default by (the ``"default-se"`` rule, flatness)
DEFAULT_Z = 2.0
#: the second criterion a strength must not do worse on than the default (None: no guard)
DEFAULT_GUARD = "log-lik"


@dataclasses.dataclass(frozen=True)
class HeldOut:
    """Every decision of one set scored held out (by the concepts fitted without its fold) at every
    strength of the grid.

    Attributes:
        lams: [L] the grid (ascending).
        fold: [N] int64, the fold of each decision (:func:`fold_of`).
        n_folds, n_trajectories: the split's sizes.
        log_lik: [N, L] float64, log P(a*_i | x_i) of the expert's action (nats).
        top1: [N, L] float64, 1 where no candidate scores above the expert's action, else 0.
        rank: [N, L] float64, the number of candidates scored above the expert's action (0 = top).
    """

    lams: tuple[float, ...]
    fold: np.ndarray
    n_folds: int
    n_trajectories: int
    log_lik: np.ndarray
    top1: np.ndarray
    rank: np.ndarray

    @property
    def n_decisions(self) -> int:
        return int(self.fold.size)

    def values(self, criterion: str) -> np.ndarray:
        """[N, L] float64 the per-decision score ``criterion`` (one of :data:`CRITERIA`) averages."""
        if criterion not in CRITERIA:
            raise ValueError(f"criterion must be one of {CRITERIA}, got {criterion!r}")
        return self.log_lik if criterion == "log-lik" else self.top1


@dataclasses.dataclass(frozen=True)
class StrengthCurve:
    """The cross-validation curve of one decision set (or of several pooled) and the strength chosen from it.

    Attributes:
        lams: [L] the grid (ascending).
        fold_means: [F, L] float64, each fold's mean held-out score (log-likelihood: nats per decision).
        mean: [L] float64, the mean over all decisions, each held out once.
        se: [L] float64, the standard error over folds: std(fold_means, ddof=1) / sqrt(F).
        diff: [L] float64, mean - mean at the default strength (paired: the same decisions).
        diff_se: [L] float64, the paired difference's standard error over folds (0 at the default).
        chosen: the strength the rule picks (the default on a flat curve).
        best: the strength of the largest mean (ties: the one nearest the default).
        flat: no strength's mean beats the default's by more than ``z`` paired standard errors
            while holding the guard (the curve is flat within its noise, and the default is kept).
        z: the paired standard errors a strength had to beat the default by.
        guard: the criterion a strength's mean had to be no lower on than the default's (None:
            none); guard_diff: [L] float64, that criterion's mean minus the default's (None
            without a guard).
        default: the strength a flat curve keeps.
        rule: one of :data:`RULES`; criterion: one of :data:`CRITERIA`.
        n_folds, n_trajectories, n_decisions: the split's sizes.
    """

    lams: tuple[float, ...]
    fold_means: np.ndarray
    mean: np.ndarray
    se: np.ndarray
    diff: np.ndarray
    diff_se: np.ndarray
    chosen: float
    best: float
    flat: bool
    default: float
    z: float
    rule: str
    criterion: str
    n_folds: int
    n_trajectories: int
    n_decisions: int
    guard: str | None = None
    guard_diff: np.ndarray | None = None

    def to_dict(self) -> dict:
        """A JSON-ready record (plain floats and lists): the concept's provenance."""
        return {"rule": self.rule, "criterion": self.criterion, "chosen": self.chosen, "best": self.best,
                "flat": self.flat, "default": self.default, "z": self.z, "lams": list(self.lams),
                "mean": self.mean.tolist(),
                "se": self.se.tolist(), "diff": self.diff.tolist(), "diff_se": self.diff_se.tolist(),
                "fold_means": self.fold_means.tolist(), "n_folds": self.n_folds,
                "n_trajectories": self.n_trajectories, "n_decisions": self.n_decisions, "guard": self.guard,
                "guard_diff": None if self.guard_diff is None else self.guard_diff.tolist()}


def _labels(groups: ArrayLike) -> list:
    """The trajectory labels as Python values; labels of mixed kinds (``1`` and ``"1"``) are refused."""
    labels = np.asarray(groups, dtype=object).ravel().tolist() if not isinstance(groups, np.ndarray) \
        else groups.ravel().tolist()
    kinds = {"str" if isinstance(x, str) else "int" if isinstance(x, numbers.Integral) else type(x).__name__
             for x in labels}
    if len(kinds) > 1:
        raise ValueError(f"groups mixes trajectory label types ({', '.join(sorted(kinds))}): 1 and '1' would name "
                         "one trajectory or two; label every decision's trajectory with one type")
    return labels


def fold_of(groups: ArrayLike, n_folds: int = DEFAULT_FOLDS) -> tuple[np.ndarray, int]:
    """The fold of each decision: trajectories (in order of first appearance) dealt round-robin
    into min(n_folds, #trajectories) folds.

    Args:
        groups: [N] hashable-valued trajectory label of each decision, all int or all str.
        n_folds: the most folds, >= 2.

    Returns:
        ([N] int64 fold index, F the number of folds).

    Raises:
        ValueError: fewer than two trajectories (nothing to hold out), ``n_folds`` < 2, or labels of
            mixed types (``1`` and ``"1"``).
    """
    if not (isinstance(n_folds, (int, np.integer)) and n_folds >= 2):
        raise ValueError(f"n_folds must be an int >= 2, got {n_folds!r}")
    labels = _labels(groups)
    order = list(dict.fromkeys(labels))
    if len(order) < 2:
        raise ValueError(f"cross-validation needs decisions of at least 2 trajectories, got {len(order)} "
                         "(collect more demonstrations, or pass a fixed strength)")
    n = min(int(n_folds), len(order))
    index = {g: i % n for i, g in enumerate(order)}
    return np.array([index[g] for g in labels], dtype=np.int64), n


def held_out_scores(alphas: ArrayLike, decisions: LabelledDecisions, gamma: float = 0.8,
                    eps: float = 1e-6) -> tuple[np.ndarray, np.ndarray]:
    """([K, N] float64 log P_alpha_k(a*_i | x_i) (Eq. 3), [K, N] float64 rank: the number of candidates
    scored above the expert's action) of every decision under each of K concepts ``alphas``
    [K, d + 1]; the features and the prior computed once, the K concepts' scores in one matrix
    product, the per-set log-softmax in float64."""
    phi = np.asarray(features(decisions, eps), np.float64)  # [T, m]
    prior = np.asarray(prior_log_probs(decisions, gamma), np.float64)  # [T]
    s = prior[:, None] + phi @ np.asarray(alphas, np.float64).T  # [T, K]
    starts = np.asarray(decisions.offsets)[:-1]
    top = np.maximum.reduceat(s, starts, axis=0)  # [N, K]
    seg = np.asarray(decisions.segment_ids)
    lse = np.log(np.add.reduceat(np.exp(s - top[seg]), starts, axis=0)) + top
    expert = s[starts + np.asarray(decisions.expert)]  # [N, K]
    rank = np.add.reduceat((s > expert[seg]).astype(np.float64), starts, axis=0)
    return (expert - lse).T, rank.T


def held_out_log_likelihood(alphas: ArrayLike, decisions: LabelledDecisions, gamma: float = 0.8,
                            eps: float = 1e-6) -> np.ndarray:
    """[K, N] float64: log P_alpha_k(a*_i | x_i) (Eq. 3) of every decision's expert action under each of
    K concepts ``alphas`` [K, d + 1] (the first part of :func:`held_out_scores`)."""
    return held_out_scores(alphas, decisions, gamma, eps)[0]


def _grid(lams: Sequence[float]) -> np.ndarray:
    grid = np.asarray(sorted(float(x) for x in lams), np.float64)
    if grid.size == 0 or not np.all(np.isfinite(grid) & (grid > 0)):
        raise ValueError(f"lams must be a non-empty grid of finite strengths > 0, got {list(lams)!r}")
    return grid


def cross_validate(
    decision_sets: Sequence[LabelledDecisions],
    groups: Sequence[ArrayLike],
    *,
    lams: Sequence[float] = DEFAULT_GRID,
    n_folds: int = DEFAULT_FOLDS,
    solver: Solver = DEFAULT_SOLVER,
    gamma: float = 0.8,
    eps: float = 1e-6,
    dtype: DTypeLike = jnp.float32,
    devices: Devices = None,
) -> list[HeldOut]:
    """Every decision of every set scored held out at every strength: all sets, folds and strengths
    in one :func:`cb_core.fit_many` call.

    Args:
        decision_sets: S decision sets of one hidden width d (one per task type).
        groups: S arrays [N_s], the trajectory of each decision (folds never split a trajectory).
        lams: the grid, > 0 (default :data:`DEFAULT_GRID`: 10 strengths, 10**-2.5 to 10**2).
        n_folds: folds per set (default 5; a set with fewer trajectories gets one fold each).
        solver, gamma, eps, dtype: as for :func:`cb_core.fit`.
        devices: where the fit runs, as for :func:`cb_core.fit_many` (None: the default device;
            on several, the F x L problems or the decisions split over them as it says).

    Returns:
        S :class:`HeldOut`, in the order of ``decision_sets``.

    Raises:
        ValueError: an empty or non-positive grid, ``groups`` that do not match the sets' sizes or
            mix label types, a set with fewer than 2 trajectories, and whatever
            :func:`cb_core.fit_many` refuses.
    """
    grid = _grid(lams)
    sets = list(decision_sets)
    if len(groups) != len(sets):
        raise ValueError(f"groups: {len(groups)} label arrays for {len(sets)} decision sets")
    folds = []
    for s, (dec, g) in enumerate(zip(sets, groups)):
        if np.shape(g) != (dec.n_decisions,):
            raise ValueError(f"groups[{s}] has shape {np.shape(g)}, its decision set holds {dec.n_decisions} decisions")
        folds.append((*fold_of(g, n_folds), len(set(_labels(g)))))
    n_max = max(f for _, f, _ in folds)
    # problem (f, l) of a set fits on the decisions outside fold f at strength l; a set with fewer
    # folds repeats its last fold's problems (their results are not read)
    weights = [np.repeat(np.stack([(fold != min(f, n - 1)).astype(np.float64) for f in range(n_max)]), grid.size, axis=0)
               for fold, n, _ in folds]
    lam = np.broadcast_to(np.tile(grid, n_max), (len(sets), n_max * grid.size))
    results = fit_many(sets, solver, lam=lam, weights=weights, gamma=gamma, eps=eps, dtype=dtype, certify="structural",
                       devices=devices)
    out = []
    for dec, (fold, n, n_groups), res in zip(sets, folds, results):
        alphas = np.stack([r.alpha for r in res[:n * grid.size]])  # [F L, m]: the set's own folds
        # each decision held out once: scored by the concepts fitted without its fold (the features
        # and the prior computed once for all F x L concepts)
        ll, rank = (x.reshape(n, grid.size, -1)[fold, :, np.arange(dec.n_decisions)]  # [N, L]
                    for x in held_out_scores(alphas, dec, gamma, eps))
        out.append(HeldOut(tuple(grid.tolist()), fold, n, n_groups, ll, (rank == 0).astype(np.float64), rank))
    return out


def _nearest(lams: np.ndarray, candidates: np.ndarray, default: float) -> int:
    """The index among ``candidates`` whose strength is nearest ``default`` on the log scale."""
    return int(candidates[np.argmin(np.abs(np.log(lams[candidates] / default)))])


def strength_curve(held: HeldOut | Sequence[HeldOut], rule: str = DEFAULT_RULE, *, criterion: str = DEFAULT_CRITERION,
                   default: float = DEFAULT_STRENGTH, z: float = DEFAULT_Z,
                   guard: str | None = DEFAULT_GUARD) -> StrengthCurve:
    """The curve of one set's held-out scores, or of several sets' pooled into one curve (every
    set's folds are folds of the pooled curve), and the strength ``rule`` picks from it.

    Args:
        held: one :class:`HeldOut`, or several on one grid (one strength for all of them).
        rule: one of :data:`RULES` (module docstring).
        criterion: one of :data:`CRITERIA`.
        default: the strength a flat curve keeps; must be on the grid.
        z: how many paired standard errors a strength must beat the default by (``"default-se"``
            and the flatness test); ``-inf``: no flat-curve guard (every rule as it picks from the
            means alone, for comparisons; the ``guard`` is not applied either).
        guard: a second criterion (:data:`CRITERIA`) on which a strength's mean must be no lower
            than the default's to beat it (default :data:`DEFAULT_GUARD`); None: none.

    Raises:
        ValueError: an unknown rule, criterion or guard, a default off the grid, sets on different
            grids.
    """
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    if guard is not None and guard not in CRITERIA:
        raise ValueError(f"guard must be one of {CRITERIA} or None, got {guard!r}")
    sets = [held] if isinstance(held, HeldOut) else list(held)
    lams = np.asarray(sets[0].lams)
    if any(h.lams != sets[0].lams for h in sets):
        raise ValueError("strength_curve: the held-out scores were computed on different grids")
    at = np.flatnonzero(np.isclose(lams, default, rtol=1e-9))
    if at.size == 0:
        raise ValueError(f"the default strength {default!r} is not on the grid {lams.tolist()!r}")
    d = int(at[0])
    values = np.concatenate([h.values(criterion) for h in sets])  # [N, L]
    fold_means = np.concatenate([np.stack([h.values(criterion)[h.fold == f].mean(axis=0) for f in range(h.n_folds)])
                                 for h in sets])  # [F, L]
    n = fold_means.shape[0]
    mean = values.mean(axis=0)
    se = fold_means.std(axis=0, ddof=1) / np.sqrt(n)
    diff = mean - mean[d]
    diff_se = (fold_means - fold_means[:, [d]]).std(axis=0, ddof=1) / np.sqrt(n)
    guard = guard if np.isfinite(z) else None  # no flat-curve guard: no guard either
    guard_diff = None
    if guard is None:
        better = np.flatnonzero(diff > z * diff_se) if np.isfinite(z) else np.arange(lams.size)
    else:
        guard_mean = np.concatenate([h.values(guard) for h in sets]).mean(axis=0)
        guard_diff = guard_mean - guard_mean[d]
        better = np.flatnonzero((diff > z * diff_se) & (guard_diff >= 0))
    best = _nearest(lams, np.flatnonzero(mean == mean.max()), default)
    flat = better.size == 0
    if flat:
        chosen = d
    elif rule == "default-se":
        chosen = _nearest(lams, better[mean[better] == mean[better].max()], default)  # ties: nearest the default
    elif rule == "best":
        chosen = best
    else:
        chosen = int(np.flatnonzero(mean >= mean[best] - se[best]).max())
    return StrengthCurve(tuple(lams.tolist()), fold_means, mean, se, diff, diff_se, float(lams[chosen]),
                         float(lams[best]), bool(flat), float(lams[d]), float(z), rule, criterion, n,
                         sum(h.n_trajectories for h in sets), sum(h.n_decisions for h in sets), guard, guard_diff)


def select_strengths(
    decision_sets: Sequence[LabelledDecisions],
    groups: Sequence[ArrayLike],
    *,
    lams: Sequence[float] = DEFAULT_GRID,
    n_folds: int = DEFAULT_FOLDS,
    rule: Literal["default-se", "one-se", "best"] = DEFAULT_RULE,
    criterion: Literal["log-lik", "top-1"] = DEFAULT_CRITERION,
    default: float = DEFAULT_STRENGTH,
    z: float = DEFAULT_Z,
    guard: Literal["log-lik", "top-1"] | None = DEFAULT_GUARD,
    solver: Solver = DEFAULT_SOLVER,
    gamma: float = 0.8,
    eps: float = 1e-6,
    dtype: DTypeLike = jnp.float32,
    devices: Devices = None,
) -> list[StrengthCurve]:
    """Choose each decision set's L2 strength by cross-validation over trajectories, all sets,
    folds and strengths in one :func:`cb_core.fit_many` call (:func:`cross_validate`, then
    :func:`strength_curve` per set).

    Args:
        decision_sets: S decision sets of one hidden width d (one per task type).
        groups: S arrays [N_s], the trajectory of each decision (folds never split a trajectory;
            all int or all str labels).
        lams: the grid, > 0 (default :data:`DEFAULT_GRID`: 10 strengths, 10**-2.5 to 10**2).
        n_folds: folds per set (default 5; a set with fewer trajectories gets one fold each).
        rule: one of :data:`RULES` (default ``"default-se"``: the default strength unless another
            beats it by more than ``z`` paired standard errors).
        criterion: the held-out score the curve averages (:data:`CRITERIA`; default top-1).
        default: the strength a flat curve keeps (on the grid; default 1.0).
        z: the paired standard errors a strength must beat the default by (default :data:`DEFAULT_Z`).
        guard: the criterion a strength must not do worse on than the default (default
            :data:`DEFAULT_GUARD`, the log-likelihood; None: none).
        solver, gamma, eps, dtype: as for :func:`cb_core.fit`.
        devices: as for :func:`cb_core.fit_many`.

    Returns:
        S :class:`StrengthCurve`, in the order of ``decision_sets``.

    Raises:
        ValueError: an unknown rule, criterion or guard, an empty or non-positive grid, a default off it,
            ``groups`` that do not match the sets' sizes or mix label types, a set with fewer than
            2 trajectories, and whatever :func:`cb_core.fit_many` refuses.
    """
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    if criterion not in CRITERIA:
        raise ValueError(f"criterion must be one of {CRITERIA}, got {criterion!r}")
    if guard is not None and guard not in CRITERIA:
        raise ValueError(f"guard must be one of {CRITERIA} or None, got {guard!r}")
    if not np.any(np.isclose(_grid(lams), default, rtol=1e-9)):
        raise ValueError(f"the default strength {default!r} is not on the grid {sorted(lams)!r}")
    held = cross_validate(decision_sets, groups, lams=lams, n_folds=n_folds, solver=solver, gamma=gamma, eps=eps,
                          dtype=dtype, devices=devices)
    return [strength_curve(h, rule, criterion=criterion, default=default, z=z, guard=guard) for h in held]
