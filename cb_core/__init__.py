"""cb_core: the concept model of CB-Agent as pure JAX functions (no I/O in the maths, no LM, no env).

Public API (seed paper notation; see each docstring for shapes and the equation implemented):

* data: :class:`Decisions` (ragged pytree), :func:`decisions_from_lists`, :func:`to_padded`,
  :func:`load_decisions` / :func:`save_decisions` (the ``.npz`` decision-set file).
* model: :func:`features` (App. B), :func:`prior_log_probs` (Eq. 3), :func:`log_probs` (Eq. 3),
  :func:`objective` (Eq. 6), :func:`gradient`, :func:`hessian`.
* fitting: :func:`fit` -> :class:`FitResult` with its :class:`Certificate`.
* acting: :func:`candidate_log_probs`, :func:`choose` (Eq. 7).
* the concept file: :class:`Concept`; :func:`atomic_path`, the one-rename file replacement
  its writers (and the agent shell's result files) use.

Imports nothing else of this project.
"""

from cb_core._atomic import atomic_path
from cb_core.act import candidate_log_probs, choose
from cb_core.cache import cache_dir, enable_persistent_cache
from cb_core.concept import Concept, library_versions
from cb_core.decisions import (Decisions, PaddedDecisions, bucket_size, decisions_from_lists,
                               load_decisions, load_decisions_metadata, save_decisions,
                               to_padded, validate_decisions)
from cb_core.fit import Certificate, FitResult, fit
from cb_core.model import (features, gradient, hessian, log_probs, objective, padded_features,
                           padded_log_probs, padded_objective, prior_log_probs)

__all__ = [
    "Certificate", "Concept", "Decisions", "FitResult", "PaddedDecisions", "atomic_path", "bucket_size",
    "cache_dir", "candidate_log_probs", "choose", "decisions_from_lists",
    "enable_persistent_cache", "features", "fit", "gradient", "hessian", "library_versions",
    "load_decisions", "load_decisions_metadata", "log_probs", "objective", "padded_features",
    "padded_log_probs", "padded_objective", "prior_log_probs", "save_decisions", "to_padded",
    "validate_decisions",
]
