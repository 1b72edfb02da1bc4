"""cb_core: the concept model of CB-Agent as pure JAX functions (no I/O in the maths, no LM, no env).

Public API (seed paper notation; see each docstring for shapes and the equation implemented):

* the labelled decision set (the data a concept is fitted on): :class:`LabelledDecisions` (ragged
  pytree; ``Decisions`` is its deprecated alias), :func:`decisions_from_lists`,
  :func:`load_decisions` / :func:`write_decisions` (the ``.npz`` file, :mod:`cb_core.decision_file`);
  padding, validation and shape buckets in :mod:`cb_core.decisions`.
* the model (Eq. 3, Eq. 6, App. B): :func:`features`, :func:`prior_log_probs`, :func:`terms` (log P,
  the prior and the concept term from one kernel),
  :func:`log_probs`, :func:`objective`, :func:`gradient`, :func:`hessian`; the padded kernels
  they call in :mod:`cb_core.model`.
* the fit: :func:`fit` ``(decisions, solver=Subspace() | Newton() | LBFGS() | Adam(), lam=,
  gamma=, eps=)``
  -> :class:`FitResult` with its :class:`Certificate` (:mod:`cb_core.fit`; the solvers in
  :mod:`cb_core.solvers`, any other implementing :class:`Solver`, :mod:`cb_core.solver_protocol`);
  :func:`fit_many` ``(decisions or a sequence of them, lam=[K], weights=[K, N])``: many problems
  (strengths, fold weights, task types) in one compiled program, S lists of K :class:`FitResult`
  (``fit`` is its one-problem case). Both take ``devices``: on several, the problems (or one large
  set's decisions) split over a one-axis mesh (:mod:`cb_core.mesh`).
* the property-test kit: :mod:`cb_core.testing` (hypothesis strategies and derivative checks;
  imported on demand, it needs hypothesis).
* the strength: :func:`select_strengths` chooses lam by cross-validation over trajectories
  (:class:`StrengthCurve`, :mod:`cb_core.strength`).
* the concept: :class:`Concept` (alpha, gamma, eps, metadata; ``log_probs`` / ``choose`` on one
  candidate set, Eq. 7; ``to_bytes`` / ``load``: the safetensors file).

Other helpers stay importable from their modules (:mod:`cb_core.cache`,
:mod:`cb_core.synthetic`, ...). Imports nothing else of this project, and writes no files: the
file formats are serialised here and written by the caller (the agent shell through
:mod:`cb_io.storage`, the project's one atomic writer).

On a GPU the fit shares the device with the PyTorch LM: JAX would otherwise reserve 75% of the
GPU's memory when it first runs, and the LM would run out. Importing cb_core therefore sets
``XLA_PYTHON_CLIENT_PREALLOCATE=false`` (allocate on demand) unless the variable is already set;
to cap JAX at a fixed share instead, set ``XLA_PYTHON_CLIENT_PREALLOCATE=true`` and
``XLA_PYTHON_CLIENT_MEM_FRACTION=0.2`` (say) before starting. XLA reads both when its backend
starts (the first JAX computation), so this holds as long as no JAX computation ran before.
"""

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

from cb_core.concept import Concept
from cb_core.decision_file import load_decisions, write_decisions
from cb_core.decisions import LabelledDecisions, decisions_from_lists
from cb_core.fit import Certificate, FitResult, fit, fit_many
from cb_core.model import Terms, features, gradient, hessian, log_probs, objective, prior_log_probs, terms
from cb_core.solver_protocol import SOLVERS, Solver, SolverOutput, register_solver
from cb_core.solvers import LBFGS, Adam, Newton, Subspace
from cb_core.strength import StrengthCurve, select_strengths


def __getattr__(name: str):
    """``cb_core.Decisions``: the deprecated name of :class:`LabelledDecisions` (a DeprecationWarning)."""
    if name == "Decisions":
        from cb_core.decisions import _deprecated

        return _deprecated(name, __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Adam", "Certificate", "Concept", "FitResult", "LBFGS", "LabelledDecisions", "Newton", "SOLVERS", "Solver",
    "SolverOutput", "Subspace", "Terms", "register_solver",
    "decisions_from_lists", "features", "fit", "fit_many", "gradient", "hessian", "load_decisions",
    "log_probs", "objective", "prior_log_probs", "select_strengths", "StrengthCurve", "terms", "write_decisions",
]
