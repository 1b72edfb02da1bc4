"""The concept file: alpha with the metadata needed to use it again, in one safetensors file.

Format (``*.safetensors``, no pickle): one tensor ``alpha`` [d + 1] (float32 or float64, last
entry the bias weight) and the safetensors header's ``__metadata__`` holding two strings:
``format`` = ``"cb-agent-concept/1"`` and ``metadata`` = a JSON object with at least

================  ==========  ===========================================================
field             type        meaning
================  ==========  ===========================================================
backbone          str         LM the features came from (name or path)
features          str | dict  feature construction and prompt formatting (layer, token, ...)
gamma             float       prior length-normalisation exponent (App. B)
lam               float       L2 strength of the fit (Eq. 6)
eps               float       std floor of the features (App. B)
task_type         str         the task type the concept belongs to
trajectories      list[str]   identifiers of the expert trajectories it was fitted on
versions          dict        library versions (cb-agent, jax, optax, numpy, ...)
hidden_size       int         d (must equal len(alpha) - 1)
================  ==========  ===========================================================

Other fields (e.g. ``fit``: the fit summary) are kept as they are.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from importlib import metadata as importlib_metadata
from typing import Any

import numpy as np

from cb_core._atomic import atomic_path

__all__ = ["Concept", "REQUIRED_FIELDS", "library_versions", "FORMAT"]

FORMAT = "cb-agent-concept/1"

#: field -> accepted Python types
REQUIRED_FIELDS: dict[str, tuple[type, ...]] = {
    "backbone": (str,),
    "features": (str, dict),
    "gamma": (int, float),
    "lam": (int, float),
    "eps": (int, float),
    "task_type": (str,),
    "trajectories": (list,),
    "versions": (dict,),
    "hidden_size": (int,),
}


def library_versions() -> dict[str, str]:
    """Installed versions of the libraries a concept depends on ("missing" when absent)."""
    out = {}
    for name in ("cb-agent", "jax", "jaxlib", "optax", "numpy", "safetensors", "torch",
                 "transformers"):
        try:
            out[name] = importlib_metadata.version(name)
        except importlib_metadata.PackageNotFoundError:
            out[name] = "missing"
    return out


def _check(alpha: np.ndarray, metadata: dict, where: str) -> None:
    if alpha.ndim != 1 or alpha.shape[0] < 2:
        raise ValueError(f"{where}: alpha must be [d + 1] with d >= 1, got shape {alpha.shape}")
    if alpha.dtype not in (np.float32, np.float64):
        raise ValueError(f"{where}: alpha must be float32 or float64, got {alpha.dtype}")
    if not np.isfinite(alpha).all():
        raise ValueError(f"{where}: alpha has non-finite entries")
    if not isinstance(metadata, dict):
        raise ValueError(f"{where}: metadata must be a dict, got {type(metadata).__name__}")
    for field, types in REQUIRED_FIELDS.items():
        if field not in metadata:
            raise ValueError(f"{where}: metadata field {field!r} is missing")
        value = metadata[field]
        if isinstance(value, bool) or not isinstance(value, types):
            raise ValueError(f"{where}: metadata field {field!r} must be "
                             f"{' or '.join(t.__name__ for t in types)}, got {value!r}")
    for field in ("gamma", "lam", "eps"):
        if not math.isfinite(metadata[field]):
            raise ValueError(f"{where}: metadata field {field!r} must be finite")
    if metadata["lam"] <= 0 or metadata["eps"] <= 0:
        raise ValueError(f"{where}: metadata fields 'lam' and 'eps' must be > 0")
    if not all(isinstance(t, str) for t in metadata["trajectories"]):
        raise ValueError(f"{where}: metadata field 'trajectories' must be a list of str")
    if metadata["hidden_size"] != alpha.shape[0] - 1:
        raise ValueError(f"{where}: metadata field 'hidden_size' = {metadata['hidden_size']} but "
                         f"alpha has {alpha.shape[0]} = d + 1 entries")


@dataclasses.dataclass(frozen=True, eq=False)
class Concept:
    """A fitted concept: alpha [d + 1] and its metadata (see the module docstring).

    Validated on construction. ``Concept.from_fit`` builds one from a :class:`cb_core.FitResult`.
    """

    alpha: np.ndarray
    metadata: dict

    def __post_init__(self):
        alpha = np.array(self.alpha, copy=True)
        alpha.setflags(write=False)
        object.__setattr__(self, "alpha", alpha)
        _check(alpha, self.metadata, "concept")

    @property
    def hidden_size(self) -> int:
        return int(self.alpha.shape[0]) - 1

    @classmethod
    def from_fit(cls, result: Any, *, backbone: str, features: str | dict, task_type: str,
                 trajectories: list[str], extra: dict | None = None) -> Concept:
        """Concept from a FitResult; gamma, lam, eps and the fit summary come from the result."""
        s = result.settings
        meta = dict(backbone=backbone, features=features, gamma=s["gamma"], lam=s["lam"],
                    eps=s["eps"], task_type=task_type, trajectories=list(trajectories),
                    versions=library_versions(), hidden_size=int(result.hidden_size),
                    fit=dict(method=result.method, loss=result.loss, grad_norm=result.grad_norm,
                             n_iter=result.n_iter, converged=result.converged,
                             n_decisions=result.n_decisions,
                             gap_bound=result.certificate.gap_bound,
                             min_hessian_eig=result.certificate.min_hessian_eig,
                             tol=s["tol"], dtype=s["dtype"]))
        if extra:
            meta.update(extra)
        return cls(np.asarray(result.alpha), meta)

    def save(self, path: str | os.PathLike) -> None:
        """Write the concept atomically (temp file + rename) as safetensors + JSON metadata."""
        from safetensors.numpy import save_file

        with atomic_path(path) as tmp:
            save_file({"alpha": np.ascontiguousarray(self.alpha)}, tmp,
                      metadata={"format": FORMAT, "metadata": json.dumps(self.metadata)})

    @classmethod
    def load(cls, path: str | os.PathLike) -> Concept:
        """Read and validate a concept file.

        Raises:
            FileNotFoundError: no such file.
            ValueError: not a concept file, or naming the missing or malformed field.
        """
        from safetensors import SafetensorError
        from safetensors.numpy import safe_open

        path = os.fspath(path)
        if not os.path.exists(path):
            raise FileNotFoundError(path)
        try:
            with safe_open(path, framework="np") as f:
                header = f.metadata() or {}
                keys = list(f.keys())
                if "alpha" not in keys:
                    raise ValueError(f"{path}: tensor 'alpha' is missing (has {keys})")
                alpha = f.get_tensor("alpha")
        except SafetensorError as err:
            raise ValueError(f"{path}: not a safetensors concept file ({err})") from None
        if header.get("format") != FORMAT:
            raise ValueError(f"{path}: header field 'format' must be {FORMAT!r}, "
                             f"got {header.get('format')!r}")
        if "metadata" not in header:
            raise ValueError(f"{path}: header field 'metadata' is missing")
        try:
            meta = json.loads(header["metadata"])
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: header field 'metadata' is not JSON ({err})") from None
        _check(alpha, meta, path)
        return cls(alpha, meta)
