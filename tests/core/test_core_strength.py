"""The L2 strength by cross-validation (cb_core.strength), checked against a fit-by-fit loop of
cb_core.fit on each fold's own decisions and cb_core.log_probs on the held-out ones."""

from __future__ import annotations

import numpy as np
import pytest

import cb_core
from cb_core.strength import (DEFAULT_GRID, RULES, HeldOut, fold_of, held_out_log_likelihood, select_strengths,
                              strength_curve)
from cb_core.testing import random_lists


def _subset(lists, keep):
    return cb_core.decisions_from_lists(*([part[i] for i in keep] for part in lists))


def _sizes(seed, n):
    return list(np.random.default_rng(seed).integers(2, 9, size=n))


def test_folds_never_split_a_trajectory_and_are_dealt_in_order():
    groups = ["a", "a", "b", "c", "c", "c", "d", "e", "f", "a"]
    fold, n = fold_of(groups, n_folds=3)
    assert n == 3
    assert fold.tolist() == [0, 0, 1, 2, 2, 2, 0, 1, 2, 0]
    assert fold_of([7, 7, 9], n_folds=5)[1] == 2  # fewer trajectories than folds: one fold each
    with pytest.raises(ValueError, match="at least 2 trajectories"):
        fold_of([3, 3, 3])


def test_held_out_log_likelihood_is_the_expert_row_of_log_probs():
    lists = random_lists(1, _sizes(1, 7), 6)
    dec = cb_core.decisions_from_lists(*lists)
    alphas = np.random.default_rng(2).standard_normal((3, 7)) * 0.3
    got = held_out_log_likelihood(alphas, dec)
    rows = np.asarray(dec.offsets)[:-1] + np.asarray(dec.expert)
    for k, alpha in enumerate(alphas):
        np.testing.assert_allclose(got[k], np.asarray(cb_core.log_probs(alpha, dec))[rows], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rule", ["default-se", "one-se", "best"])
def test_the_curve_equals_one_fit_per_fold_and_strength(rule):
    """Two task types (5 and 3 trajectories), every fold x strength x type in one batched fit, against
    cb_core.fit on each training fold's own decisions and log_probs on the held-out fold's."""
    lams = (0.1, 1.0, 10.0)
    sets, groups, lists_of = [], [], []
    for seed, n_traj in ((3, 5), (4, 3)):
        g = np.repeat(np.arange(n_traj), 3)  # 3 decisions a trajectory
        lists = random_lists(seed, _sizes(seed, g.size), 5)
        # an informative expert: the candidate with the largest first hidden coordinate
        lists = (lists[0], lists[1], lists[2], [int(np.argmax(h[:, 0])) for h in lists[0]])
        sets.append(cb_core.decisions_from_lists(*lists))
        groups.append(g)
        lists_of.append(lists)
    curves = select_strengths(sets, groups, lams=lams, n_folds=4, rule=rule, criterion="log-lik", z=1.0,
                              dtype=np.float64)
    for curve, lists, g in zip(curves, lists_of, groups):
        fold, n = fold_of(g, 4)
        assert curve.n_folds == n and curve.lams == lams and curve.n_decisions == g.size
        held = np.zeros((len(lams), g.size))
        for f in range(n):
            train, test = np.flatnonzero(fold != f), np.flatnonzero(fold == f)
            test_dec = _subset(lists, test)
            rows = np.asarray(test_dec.offsets)[:-1] + np.asarray(test_dec.expert)
            for l, lam in enumerate(lams):
                alpha = cb_core.fit(_subset(lists, train), lam=lam, dtype=np.float64).alpha
                held[l, test] = np.asarray(cb_core.log_probs(alpha, test_dec))[rows]
        mean = held.mean(axis=1)
        np.testing.assert_allclose(curve.mean, mean, rtol=1e-6, atol=1e-6)
        fold_means = np.array([[held[l, fold == f].mean() for l in range(len(lams))] for f in range(n)])
        np.testing.assert_allclose(curve.fold_means, fold_means, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(curve.se, fold_means.std(axis=0, ddof=1) / np.sqrt(n), rtol=1e-6, atol=1e-9)
        # the paired difference from the default (lam = 1, index 1) and its standard error over folds
        np.testing.assert_allclose(curve.diff, mean - mean[1], atol=1e-6)
        paired = [fold_means[:, l] - fold_means[:, 1] for l in range(len(lams))]
        np.testing.assert_allclose(curve.diff_se, [np.std(p, ddof=1) / np.sqrt(n) for p in paired], atol=1e-6)
        best = lams[int(np.argmax(mean))]
        assert curve.best == best
        better = [l for l in range(len(lams)) if mean[l] - mean[1] > np.std(paired[l], ddof=1) / np.sqrt(n)]
        assert curve.flat == (not better)
        if not better:
            assert curve.chosen == 1.0
        elif rule == "best":
            assert curve.chosen == best
        elif rule == "default-se":
            assert curve.chosen == lams[max(better, key=lambda l: mean[l])]
        else:
            b = int(np.argmax(curve.mean))
            ok = [lam for lam, m in zip(lams, curve.mean) if m >= curve.mean[b] - curve.se[b]]
            assert curve.chosen == max(ok) and curve.chosen >= best


def _held(values, fold, lams=(0.1, 1.0, 10.0, 100.0)):
    """HeldOut scores [N, L] given directly (both criteria the same numbers)."""
    values = np.asarray(values, np.float64)
    fold = np.asarray(fold)
    return HeldOut(lams, fold, int(fold.max()) + 1, int(fold.max()) + 1, values, values, np.zeros_like(values))


@pytest.mark.parametrize("criterion", ["log-lik", "top-1"])
def test_an_exactly_flat_curve_keeps_the_default_under_every_rule(criterion):
    """Every strength scores every decision alike: no rule may pick the largest strength, nor call
    another one best."""
    per_decision = np.random.default_rng(0).normal(size=12)
    held = _held(np.repeat(per_decision[:, None], 4, axis=1), np.arange(12) % 4)
    for rule in RULES:
        curve = strength_curve(held, rule, criterion=criterion)
        assert curve.flat and curve.chosen == 1.0 and curve.best == 1.0, (rule, curve.chosen, curve.best)
        assert curve.to_dict()["flat"] is True and curve.to_dict()["criterion"] == criterion


def test_the_default_gives_way_only_to_a_strength_better_in_every_fold_beyond_noise():
    fold = np.arange(16) % 4
    rng = np.random.default_rng(1)
    base = rng.normal(size=16)
    # 0.1 better by 0.5 on every decision; 100 better on average by 0.2 but with a spread of 2 across folds
    swing = np.array([2.0, -2.0, 2.0, -1.2])[fold]
    values = np.stack([base + 0.5, base, base - 0.1, base + swing], axis=1)
    curve = strength_curve(_held(values, fold), "default-se")
    assert not curve.flat and curve.chosen == 0.1
    np.testing.assert_allclose(curve.diff, [0.5, 0.0, -0.1, 0.2])
    # the raw maximiser would be 0.1 too; without 0.1's gain the noisy 100 does not count: flat
    curve = strength_curve(_held(values[:, 1:], fold, (1.0, 10.0, 100.0)), "default-se")
    assert curve.flat and curve.chosen == 1.0 and curve.best == 100.0
    assert curve.diff_se[2] == pytest.approx(np.std([2.0, -2.0, 2.0, -1.2], ddof=1) / 2)


def test_a_strength_better_on_top_1_but_less_likely_held_out_does_not_replace_the_default():
    """0.1 wins top-1 on every fold beyond noise but its held-out log-likelihood is lower than the
    default's (confidently wrong where it is wrong): the guarded rule keeps 1.0; 10, a smaller
    top-1 gain with a likelihood no lower, is taken instead when it clears the bar; without the
    guard 0.1 is taken."""
    fold = np.arange(16) % 4
    j = np.arange(16) // 4  # the decision's place within its fold
    top1 = np.zeros((16, 4))
    top1[:, 1] = j < 2  # lam = 1 right on half of every fold's decisions
    top1[:, 0] = j < 3  # 0.1 right on three quarters of every fold's
    top1[:, 2] = top1[:, 1]
    top1[:, 3] = top1[:, 1]
    log_lik = np.full((16, 4), -1.0)
    log_lik[:, 0] = np.where(top1[:, 0] > 0, -0.5, -6.0)  # mean -1.875 < -1.0
    held = HeldOut((0.1, 1.0, 10.0, 100.0), fold, 4, 4, log_lik, top1, np.zeros_like(top1))
    unguarded = strength_curve(held, "default-se", criterion="top-1", guard=None)
    assert unguarded.chosen == 0.1 and not unguarded.flat and unguarded.guard is None
    guarded = strength_curve(held, "default-se", criterion="top-1", guard="log-lik")
    assert guarded.chosen == 1.0 and guarded.flat
    np.testing.assert_allclose(guarded.guard_diff, [np.mean(log_lik[:, 0]) + 1.0, 0.0, 0.0, 0.0])
    assert guarded.to_dict()["guard"] == "log-lik" and guarded.to_dict()["guard_diff"][0] == pytest.approx(-0.875)
    # 10 gains top-1 as 0.1 does, as likely as the default: it clears both
    held.top1[:, 2] = j < 3
    assert strength_curve(held, "default-se", criterion="top-1", guard="log-lik").chosen == 10.0
    # on a grid (0.01, 0.1, 1, 10), 0.01 and 0.1 tie on top-1 and both clear the bar: the tie goes
    # to the strength nearer 1.0 (0.1), not to the first on the grid
    tied = np.stack([j < 3, j < 3, j < 2, j < 2], axis=1).astype(np.float64)
    held = HeldOut((0.01, 0.1, 1.0, 10.0), fold, 4, 4, np.full((16, 4), -1.0), tied, np.zeros_like(tied))
    curve = strength_curve(held, "default-se", criterion="top-1", guard="log-lik")
    assert curve.chosen == 0.1 and curve.best == 0.1
    with pytest.raises(ValueError, match="guard must be one of"):
        strength_curve(held, guard="auc")


def test_pooled_sets_make_one_curve_of_all_their_folds():
    fold_a, fold_b = np.arange(10) % 5, np.arange(6) % 2
    va, vb = np.random.default_rng(2).normal(size=(10, 4)), np.random.default_rng(3).normal(size=(6, 4))
    curve = strength_curve([_held(va, fold_a), _held(vb, fold_b)], "best")
    assert curve.n_folds == 7 and curve.n_decisions == 16
    np.testing.assert_allclose(curve.mean, np.concatenate([va, vb]).mean(axis=0))
    np.testing.assert_allclose(curve.fold_means[5], vb[fold_b == 0].mean(axis=0))


def test_trajectory_labels_of_mixed_types_are_refused():
    """1 and "1" are one label once numpy turns them into strings: refused, not merged."""
    with pytest.raises(ValueError, match=r"mixes trajectory label types \(int, str\)") as err:
        fold_of([1, 1, "1", 2])
    assert "\n" not in str(err.value)
    dec = cb_core.decisions_from_lists(*random_lists(5, [3, 4, 2, 3], 4))
    with pytest.raises(ValueError, match="mixes trajectory label types"):
        select_strengths([dec], [[1, "1", 2, 2]])
    # one type, as a list or an array, is dealt as before
    assert fold_of(np.array(["1", "1", "2"]))[0].tolist() == fold_of([1, 1, 2])[0].tolist() == [0, 0, 1]


def test_the_default_grid_is_log_spaced_and_holds_the_fixed_default():
    grid = np.log10(DEFAULT_GRID)
    assert len(DEFAULT_GRID) == 10 and np.allclose(np.diff(grid), 0.5) and 1.0 in DEFAULT_GRID


def test_bad_input_is_one_line_naming_it():
    dec = cb_core.decisions_from_lists(*random_lists(5, [3, 4, 2], 4))
    with pytest.raises(ValueError, match="rule must be"):
        select_strengths([dec], [[0, 1, 2]], rule="median")
    with pytest.raises(ValueError, match=r"groups\[0\] has shape"):
        select_strengths([dec], [[0, 1]])
    with pytest.raises(ValueError, match="lams must be"):
        select_strengths([dec], [[0, 1, 2]], lams=(1.0, -1.0))
    with pytest.raises(ValueError, match="at least 2 trajectories"):
        select_strengths([dec], [[0, 0, 0]])
    with pytest.raises(ValueError, match="default strength 1.0 is not on the grid"):
        select_strengths([dec], [[0, 1, 2]], lams=(0.1, 10.0))
    with pytest.raises(ValueError, match="criterion must be"):
        select_strengths([dec], [[0, 1, 2]], criterion="auc")


@pytest.mark.slow  # one batched fit of 5 folds x 10 strengths: a compile
def test_five_noisy_trajectories_and_a_flat_curve_keep_the_default():
    """Five trajectories whose expert actions are drawn at random, unrelated to the hidden states:
    no strength does better held out than the default beyond the folds' noise, so the default rule
    keeps lam = 1 and says the curve is flat, where the means alone would move (the curve's own
    best is not 1)."""
    groups = np.repeat(np.arange(5), 4)  # 5 trajectories of 4 decisions
    dec = cb_core.decisions_from_lists(*random_lists(8, _sizes(8, groups.size), 6))
    (curve,) = select_strengths([dec], [groups])
    assert curve.n_folds == 5 and curve.lams == DEFAULT_GRID
    assert curve.rule == "default-se" and curve.criterion == "top-1" and curve.z == 2.0
    # the flatness, from the fold means: no strength beats lam = 1 by two paired standard errors
    d = DEFAULT_GRID.index(1.0)
    paired = curve.fold_means - curve.fold_means[:, [d]]
    assert np.all(curve.mean - curve.mean[d] <= 2 * paired.std(axis=0, ddof=1) / np.sqrt(5) + 1e-12)
    assert curve.flat and curve.chosen == 1.0 and curve.default == 1.0
    assert curve.best != 1.0  # what a rule on the means alone would have taken
