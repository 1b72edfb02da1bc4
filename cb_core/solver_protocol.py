"""What a solver of :func:`cb_core.fit` is: the :class:`Solver` protocol, its output, the registry.

A solver is a frozen (hashable) object holding hyperparameters only; it is a static argument of
the compiled fit. It says

* its ``name`` (a class attribute: the registry's key, the CLI's ``--method`` value and
  ``FitResult.method``),
* whether it can be ``batchable`` (a class attribute: :func:`cb_core.fit_many` runs it
  ``jax.vmap``-ped over problems; False refuses it there with the reason :meth:`Solver.check`'s
  docstring gives),
* its ``tol`` (gradient-norm tolerance; None: :func:`default_tol` of the fit's dtype) and
  ``max_iter``,
* :meth:`Solver.check`: ValueError (one line naming the hyperparameter) for a bad setting,
* :meth:`Solver.minimise` ``(problem, lam, tol, alpha0=None) -> SolverOutput``: traceable JAX
  minimising Eq. 6 on the padded :class:`cb_core.model.Problem` the fit prepared, from alpha = 0
  or the warm start ``alpha0`` [m], using the model's public kernels (:mod:`cb_core.model`).

A new solver is one file: a frozen dataclass with these members, decorated with
:func:`register_solver` (which makes it known by name, e.g. to ``cb-agent fit --method``, once its
module is imported). :func:`cb_core.fit` and :func:`cb_core.fit_many` take any object with these
members, registered or not.

Imports nothing of this project outside :mod:`cb_core`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, NamedTuple, Protocol, runtime_checkable

import jax
import jax.numpy as jnp

from cb_core.model import Problem, scores

__all__ = ["SOLVERS", "Progress", "Solver", "SolverOutput", "check_int", "default_tol", "register_solver",
           "first_iterate", "solver_settings"]


class SolverOutput(NamedTuple):
    """What a solver's compiled loop returns (arrays)."""

    alpha: jax.Array  # [m]
    value: jax.Array  # [] Eq. 6 at alpha
    grad_norm: jax.Array  # [] ||grad|| at alpha
    n_iter: jax.Array  # [] int32
    n_hvp: jax.Array  # [] int32, Hessian-vector products (0 if none)
    n_passes: jax.Array  # [] int32, passes over the hidden states (-1: not counted)


@runtime_checkable
class Solver(Protocol):
    """The members :func:`cb_core.fit` and :func:`cb_core.fit_many` use (see the module's docstring)."""

    name: ClassVar[str]
    batchable: ClassVar[bool]
    tol: float | None
    max_iter: int

    def check(self) -> None:
        """Raise ValueError (one line naming the hyperparameter) for a bad setting."""

    def minimise(self, p: Problem, lam: Any, tol: Any, alpha0: Any = None) -> SolverOutput:
        """Minimise Eq. 6 on ``p`` with strength ``lam`` to gradient norm ``tol`` (traceable)."""


#: Solver classes by name (:func:`register_solver`): the CLI's ``--method`` choices.
SOLVERS: dict[str, type] = {}


def register_solver(cls: type) -> type:
    """Class decorator: ``cls`` known by its ``name`` in :data:`SOLVERS`.

    Raises:
        ValueError: ``cls`` lacks a member of :class:`Solver`, or another class has its name.
    """
    missing = [m for m in ("name", "batchable", "check", "minimise") if not hasattr(cls, m)]
    if missing:
        raise ValueError(f"solver {cls.__name__} lacks {', '.join(missing)} (cb_core.solver_protocol.Solver)")
    if SOLVERS.get(cls.name, cls) is not cls:
        raise ValueError(f"solver name {cls.name!r} is taken by {SOLVERS[cls.name].__name__}")
    SOLVERS[cls.name] = cls
    return cls


def default_tol(dtype) -> float:
    """The gradient-norm tolerance of a solver whose ``tol`` is None: 1e-3 in float32 (the
    rounding floor is near 1e-4..1e-3 at d ~ 5k; it certifies an objective gap <= 5e-7 / lam),
    1e-7 in float64."""
    return 1e-3 if jnp.dtype(dtype) == jnp.float32 else 1e-7


def check_int(solver: object, name: str, low: int) -> None:
    """ValueError (one line) unless ``solver.<name>`` is an int >= ``low``."""
    value = getattr(solver, name)
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= low):
        raise ValueError(f"{type(solver).__name__} {name} must be an int >= {low}, got {value!r}")


def solver_settings(solver: object) -> dict:
    """The solver's hyperparameters (a dataclass's fields), ``tol`` left out (the fit records the one used)."""
    fields = dataclasses.asdict(solver) if dataclasses.is_dataclass(solver) else {}
    return {k: v for k, v in fields.items() if k != "tol"}


def first_iterate(alpha0, p: Problem, m: int, dtype):
    """(the first iterate [m], the scores at it [N, M]): alpha = 0 (cold start; its scores are the
    prior, no pass) or the given ``alpha0`` (warm start: one pass for its scores)."""
    if alpha0 is None:
        return jnp.zeros(m, dtype), jnp.where(p.mask, p.prior, 0.0)
    alpha0 = jnp.asarray(alpha0, dtype)
    return alpha0, scores(alpha0, p)


class Progress(NamedTuple):
    """Best iterate so far: a float32 fit near the optimum stalls at the rounding floor, where
    the objective's noise exceeds its decrease while the gradient norm stays informative."""

    alpha: jax.Array
    grad_norm: jax.Array
    value: jax.Array
    stalled: jax.Array  # steps with neither a smaller gradient norm nor a decrease beyond noise

    @classmethod
    def start(cls, alpha, grad_norm, value):
        return cls(alpha, grad_norm, value, jnp.asarray(0, jnp.int32))

    def update(self, alpha, grad_norm, value):
        noise = 8 * jnp.finfo(alpha.dtype).eps
        finite = jnp.isfinite(value) & jnp.isfinite(grad_norm)
        better_g = finite & (grad_norm < self.grad_norm)
        better_v = finite & (value < self.value - noise * jnp.abs(self.value))
        return Progress(jnp.where(better_g, alpha, self.alpha),
                        jnp.where(better_g, grad_norm, self.grad_norm),
                        jnp.where(better_v, value, self.value),
                        jnp.where(better_g | better_v, 0, self.stalled + 1))
