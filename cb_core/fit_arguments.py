"""The arguments of :func:`cb_core.fit.fit` and :func:`cb_core.fit.fit_many` checked: each bad one
is refused with one line (ValueError) naming it, before anything is padded or compiled; and the
compiled fit's output checked (:func:`check_finite_fit`: a non-finite one named by its culprit).

Imports nothing of this project outside :mod:`cb_core`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike, DTypeLike

from cb_core.decisions import LabelledDecisions, validate_decisions
from cb_core.solver_protocol import SOLVERS, Solver, check_int, default_tol

__all__ = ["check_dtype", "check_finite_fit",
           "check_init", "check_inits", "check_number", "check_problems", "check_sets", "check_shared",
           "check_solver", "check_weights"]


def check_number(name: str, value: object, low: float, strict: bool) -> float:
    """``value`` as a float; ValueError (one line naming ``name``) unless finite and > (``strict``) or >= ``low``."""
    ok = isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool)
    if ok:
        value = float(value)
        ok = math.isfinite(value) and (value > low if strict else value >= low)
    if not ok:
        raise ValueError(f"{name} must be a finite number {'>' if strict else '>='} {low:g}, "
                         f"got {value!r}")
    return value


def check_lam_dtype(lam: np.ndarray, dt) -> None:
    """Refuse strengths the fit's dtype cannot hold: past its largest value (inf) or below its
    smallest normal number (0 or a subnormal, and a certificate gap ||g||^2 / (2 lam) for a lam
    that is not the one fitted). ValueError, one line naming lam."""
    info = np.finfo(np.dtype(dt.name))
    for value in np.unique(lam):
        if not info.tiny <= value <= info.max:
            fix = " or fit in float64 (dtype='float64', `--float64`)" if dt == jnp.float32 else ""
            raise ValueError(f"lam={value:g} {'overflows' if value > info.max else 'underflows'} {dt.name} (it holds "
                             f"{info.tiny:.4g} to {info.max:.4g}): choose a strength in that range{fix}")


def check_init(init: ArrayLike, m: int, dt) -> np.ndarray:
    """``init`` as a [m] array of ``dt``; ValueError (one line) for another shape or a non-finite entry."""
    alpha0 = np.asarray(init, dtype=np.dtype(dt.name))
    if alpha0.shape != (m,):
        raise ValueError(f"init must be alpha [d + 1] = [{m}] for these decisions, got shape {alpha0.shape}")
    if not np.isfinite(alpha0).all():
        raise ValueError("init has non-finite entries")
    return alpha0


def solver_names(batchable: bool = False) -> str:
    """The registered solvers (:data:`~cb_core.solver_protocol.SOLVERS`; the batchable ones only), for a message."""
    return ", ".join(f"{c.__name__}()" for c in SOLVERS.values() if c.batchable or not batchable)


def check_solver(solver: Solver, dt) -> float:
    """The solver's tolerance (its default for ``dt`` when None); ValueError (one line) for an object
    that is no :class:`~cb_core.solver_protocol.Solver` or whose settings its own ``check`` refuses."""
    if isinstance(solver, type) or not isinstance(solver, Solver):  # a class is no solver: Newton(), not Newton
        raise ValueError(f"solver must be a cb_core solver ({solver_names()} or any "
                         f"cb_core.solver_protocol.Solver), got {solver!r}")
    try:
        hash(solver)
    except TypeError:
        raise ValueError(f"solver {solver!r} must be hashable (a frozen dataclass): the compiled fit "
                         "takes it as a static argument") from None
    tol = check_number("tol", default_tol(dt) if solver.tol is None else solver.tol, 0.0, strict=False)
    check_int(solver, "max_iter", 0)
    solver.check()
    return tol


def check_dtype(dtype: DTypeLike, certify: str):
    """``dtype`` as a jnp dtype; ValueError (one line) for another than float32/float64 or an unknown ``certify``."""
    if certify not in ("auto", "exact", "structural"):
        raise ValueError(f"certify must be 'auto', 'exact' or 'structural', got {certify!r}")
    dt = jnp.dtype(dtype)
    if dt not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.float64)):
        raise ValueError(f"dtype must be float32 or float64, got {dt}")
    return dt


def check_shared(gamma, eps, dtype, certify, solver, batched: bool = False) -> tuple[float, float, Any, float]:
    """(gamma, eps, dtype, tol) checked: the arguments :func:`cb_core.fit` and :func:`cb_core.fit_many`
    share (``batched``: a solver that is not ``batchable`` is refused)."""
    dt = check_dtype(dtype, certify)
    values = (check_number("gamma", gamma, 0.0, strict=False), check_number("eps", eps, 0.0, strict=True), dt,
              check_solver(solver, dt))
    if batched and not solver.batchable:
        raise ValueError(f"fit_many supports the solvers {solver_names(batchable=True)}, got {solver!r}, which "
                         "cannot be batched: fit its problems one by one with fit()")
    return values


def check_sets(decisions: LabelledDecisions | Sequence[LabelledDecisions]
               ) -> tuple[list[LabelledDecisions], list[LabelledDecisions]]:
    """(the sets as given, validated) of :func:`fit_many`; ValueError (one line) naming the set at fault."""
    single = isinstance(decisions, LabelledDecisions)
    given = [decisions] if single else list(decisions) if isinstance(decisions, Sequence) else None
    if not given or not all(isinstance(d, LabelledDecisions) for d in given):
        raise ValueError("decisions must be a cb_core.LabelledDecisions or a non-empty sequence of them, got "
                         f"{type(decisions).__name__}")
    sets = []
    for s, d in enumerate(given):
        try:
            sets.append(validate_decisions(d, finite_hidden=False))  # hidden checked in the compiled fit
        except ValueError as err:
            raise ValueError(f"decision set {s}: {err}" if not single else str(err)) from None
        if sets[-1].hidden_size != sets[0].hidden_size:
            raise ValueError(f"decision sets must share one hidden width d: set 0 has d = {sets[0].hidden_size}, "
                             f"set {s} has d = {sets[-1].hidden_size}")
    return given, sets


def check_weights(weights: ArrayLike, n: int, where: str) -> np.ndarray:
    """``weights`` as a float64 [K, n] array (a [n] vector: K = 1); ValueError (one line) naming
    ``where`` for another shape, a negative or non-finite entry, or a row without a positive one."""
    w = np.asarray(weights, np.float64)
    if w.ndim == 1:
        w = w[None]
    if w.ndim != 2 or w.shape[1] != n:
        raise ValueError(f"{where} must be [K, N] = [K, {n}] decision weights, got shape {w.shape}")
    if not np.isfinite(w).all() or (w < 0).any():
        raise ValueError(f"{where} must be finite and >= 0")
    empty = np.flatnonzero(w.sum(axis=1) <= 0)
    if empty.size:
        raise ValueError(f"{where}: problem {int(empty[0])} weights no decision (every weight 0)")
    return w


def check_problems(lam, weights, sets: list[LabelledDecisions], single: bool
                    ) -> tuple[np.ndarray, list[np.ndarray] | None]:
    """(lam [S, K] float64, S weights [K, N_s] or None) of :func:`fit_many`; K from ``lam``'s last
    axis and the weights' first. ValueError (one line) naming the argument at fault."""
    n_sets = len(sets)
    lam = np.asarray(lam, np.float64) if not isinstance(lam, bool) else np.asarray(np.nan)
    if lam.ndim > (1 if single else 2) or (lam.ndim == 2 and lam.shape[0] != n_sets):
        raise ValueError(f"lam must be a number, [K]{'' if single else ' or [S, K] = [' + str(n_sets) + ', K]'}, "
                         f"got shape {lam.shape}")
    if lam.size == 0 or not (np.isfinite(lam).all() and (lam > 0).all()):
        raise ValueError(f"lam must be finite numbers > 0, got {lam.tolist()!r}")
    if weights is not None:
        if single:
            weights = [weights]
        elif not isinstance(weights, Sequence) or len(weights) != n_sets:
            raise ValueError(f"weights for {n_sets} decision sets must be a sequence of {n_sets} arrays [K, N_s]")
        weights = [None if w is None else check_weights(w, d.n_decisions, "weights" if single else f"weights[{s}]")
                   for s, (w, d) in enumerate(zip(weights, sets))]
    ks = {w.shape[0] for w in weights or [] if w is not None} | ({lam.shape[-1]} if lam.ndim else set())
    if len(ks) > 1:
        raise ValueError(f"lam and weights give different numbers of problems per set: {sorted(ks)}")
    k = ks.pop() if ks else 1
    if weights is not None:
        weights = [np.ones((k, d.n_decisions)) if w is None else np.broadcast_to(w, (k, d.n_decisions))
                   for w, d in zip(weights, sets)]
    return np.broadcast_to(lam, (n_sets, k)).copy(), weights


def check_inits(init: ArrayLike, shape: tuple[int, int, int], dt) -> np.ndarray:
    """``init`` broadcast to ``shape`` [S, K, m] of ``dt``; ValueError (one line) when it does not
    broadcast or has a non-finite entry."""
    alpha0 = np.asarray(init, np.dtype(dt.name))
    try:
        alpha0 = np.ascontiguousarray(np.broadcast_to(alpha0, shape))
    except ValueError:
        raise ValueError(f"init must broadcast to [S, K, d + 1] = {list(shape)}, got shape {alpha0.shape}") from None
    if not np.isfinite(alpha0).all():
        raise ValueError("init has non-finite entries")
    return alpha0


def _diverged(dec: LabelledDecisions, dt, value: float, gnorm: float) -> str:
    """One line for a fit whose loss or gradient is not finite although every input is: which
    decision's features overflow ``dt`` when standardised (their squared deviations), and the fix."""
    offsets, hidden = np.asarray(dec.offsets), np.asarray(dec.hidden)
    culprit = ""
    with np.errstate(over="ignore", invalid="ignore"):
        for i, (a, b) in enumerate(zip(offsets[:-1], offsets[1:])):
            x = hidden[a:b].astype(dt.name)
            if not np.isfinite(np.square(x - x.mean(axis=0)).sum(axis=0)).all():
                culprit = (f"decision {i}'s features overflow {dt.name} when standardised (largest |feature| "
                           f"{float(np.abs(hidden[a:b]).max()):.3g}); ")
                break
    return (f"the {dt.name} fit diverged (loss {value}, gradient norm {gnorm}) and nothing is saved: {culprit}"
            "fit in float64 (dtype=float64, `cb-agent fit --float64`) or standardise the features first")


def check_finite_fit(value: np.ndarray, grad_norm: np.ndarray, finite: np.ndarray, sets: list[LabelledDecisions],
                     originals: Sequence[LabelledDecisions], dt) -> None:
    """ValueError (one line) naming a non-finite hidden state (``finite`` [S, K, N_pad]: found by
    the compiled fit's first pass) or, with finite inputs, the decision whose features overflow
    ``dt`` (a ``value`` or ``grad_norm`` [S, K] that is not finite)."""
    for s, d in enumerate(sets):
        if not np.all(finite[s, :, : d.n_decisions]):
            try:
                validate_decisions(originals[s])  # names the decision with a non-finite hidden state
            except ValueError as err:
                raise ValueError(f"decision set {s}: {err}" if len(sets) > 1 else str(err)) from None
    values, gnorms = value.astype(np.float64), grad_norm.astype(np.float64)
    for s, q in zip(*np.nonzero(~(np.isfinite(values) & np.isfinite(gnorms)))):
        where = f"problem ({s}, {q}): " if values.size > 1 else ""
        raise ValueError(where + _diverged(sets[s], dt, float(values[s, q]), float(gnorms[s, q])))
