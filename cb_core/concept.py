"""The fitted concept: alpha with the gamma and eps it was fitted with, acting on one candidate
set (Eq. 3, Eq. 7), and its file: alpha with the metadata needed to use it again, in one
safetensors file.

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

A third header string, ``digest``, is the SHA-256 of alpha's bytes (little-endian) followed by
the ``metadata`` string; :meth:`Concept.load` recomputes it and refuses a file whose content no
longer matches (a flipped bit in alpha or the metadata). Files written before the digest load
unchecked.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import weakref
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import jax
import numpy as np
from jax.typing import ArrayLike

from cb_core.cache import digest
from cb_core.decisions import LabelledDecisions, bucket_size, to_padded
from cb_core.model import DeviceDecision, Terms, _k_decide, _k_terms

if TYPE_CHECKING:
    from cb_core.fit import FitResult

__all__ = ["Concept", "ConceptHead", "HeadParameters", "DecisionKernel", "DECISION_KERNEL", "REQUIRED_FIELDS",
           "library_versions", "FORMAT"]

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


def _header_metadata(header: dict, where: str) -> dict:
    """The concept's metadata object from a safetensors header's ``__metadata__`` strings."""
    if header.get("format") != FORMAT:
        raise ValueError(f"{where}: header field 'format' must be {FORMAT!r}, "
                         f"got {header.get('format')!r}")
    if "metadata" not in header:
        raise ValueError(f"{where}: header field 'metadata' is missing")
    try:
        meta = json.loads(header["metadata"])
    except json.JSONDecodeError as err:
        raise ValueError(f"{where}: header field 'metadata' is not JSON ({err})") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{where}: header field 'metadata' must be a JSON object")
    return meta


def _check_metadata(n_alpha: int, metadata: dict, where: str) -> None:
    """The file format's metadata fields (see the module docstring); alpha has ``n_alpha``
    entries."""
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
    if metadata["hidden_size"] != n_alpha - 1:
        raise ValueError(f"{where}: metadata field 'hidden_size' = {metadata['hidden_size']} but "
                         f"alpha has {n_alpha} = d + 1 entries")


def _check_candidate_set(hidden: ArrayLike, log_q: ArrayLike, n_tokens: ArrayLike, d: int):
    """One decision's candidate set as float32 / int32 numpy, or ValueError naming the culprit."""
    hidden = np.asarray(hidden, np.float32)
    if hidden.ndim != 2:
        raise ValueError(f"hidden must be [M, d], got shape {hidden.shape}")
    m = hidden.shape[0]
    if m < 1:
        raise ValueError("empty candidate set (M = 0)")
    if hidden.shape[1] != d:
        raise ValueError(f"hidden size {hidden.shape[1]} differs from the concept's d = {d}")
    log_q = np.asarray(log_q, np.float32).reshape(-1)
    n_tokens = np.asarray(n_tokens).reshape(-1)
    if log_q.shape != (m,) or n_tokens.shape != (m,):
        raise ValueError(f"log_q {log_q.shape} and n_tokens {n_tokens.shape} must be [M] = [{m}]")
    bad = np.flatnonzero(~np.isfinite(hidden).all(axis=1))
    if bad.size:
        raise ValueError(f"non-finite hidden in candidate {bad[0]}")
    bad = np.flatnonzero(~np.isfinite(log_q))
    if bad.size:
        raise ValueError(f"non-finite log_q in candidate {bad[0]}")
    bad = np.flatnonzero(n_tokens < 1)
    if bad.size:
        raise ValueError(f"n_tokens < 1 in candidate {bad[0]}")
    return hidden, log_q, n_tokens.astype(np.int32)


class _Metadata:
    """The metadata dict as hashable pytree auxiliary data (compared by value)."""

    __slots__ = ("value", "_key")

    def __init__(self, value: dict):
        self.value = value
        self._key = json.dumps(value, sort_keys=True, default=repr)

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Metadata) and self._key == other._key


@dataclasses.dataclass(frozen=True, eq=False)
class Concept:
    """A fitted concept: alpha with the gamma and eps it was fitted with, and its metadata.

    A frozen JAX pytree (leaves alpha, gamma, eps; the metadata is static), validated on
    construction. Act with :meth:`log_probs` / :meth:`choose` on one decision's candidate set;
    :meth:`from_fit` builds one from a :class:`cb_core.fit.FitResult`, :meth:`prior_only` the
    alpha = 0 control; :meth:`to_bytes` / :meth:`load` the file (format in the module docstring).

    Attributes:
        alpha: [d + 1] read-only numpy float32 or float64, last entry the bias weight.
        gamma: prior length-normalisation exponent (App. B), >= 0.
        eps: std floor of the features (App. B), > 0.
        metadata: JSON-serialisable dict (the file's fields; ``gamma``, ``eps`` and
            ``hidden_size``, when present, must agree with the concept).
    """

    alpha: np.ndarray
    gamma: float
    eps: float
    metadata: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        alpha = np.array(self.alpha, copy=True)
        alpha.setflags(write=False)
        object.__setattr__(self, "alpha", alpha)
        if alpha.ndim != 1 or alpha.shape[0] < 2:
            raise ValueError(f"concept: alpha must be [d + 1] with d >= 1, got shape {alpha.shape}")
        if alpha.dtype not in (np.float32, np.float64):
            raise ValueError(f"concept: alpha must be float32 or float64, got {alpha.dtype}")
        if not np.isfinite(alpha).all():
            raise ValueError("concept: alpha has non-finite entries")
        for name, low in (("gamma", 0.0), ("eps", None)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or (value < low if low is not None else value <= 0):
                raise ValueError(f"concept: {name} must be a finite number "
                                 f"{'>= 0' if low is not None else '> 0'}, got {value!r}")
            object.__setattr__(self, name, float(value))
        if not isinstance(self.metadata, dict):
            raise ValueError(f"concept: metadata must be a dict, got {type(self.metadata).__name__}")
        for name in ("gamma", "eps"):
            if name in self.metadata and self.metadata[name] != getattr(self, name):
                raise ValueError(f"concept: metadata field {name!r} = {self.metadata[name]!r} "
                                 f"disagrees with {name} = {getattr(self, name)!r}")
        if self.metadata.get("hidden_size", self.hidden_size) != self.hidden_size:
            raise ValueError(f"concept: metadata field 'hidden_size' = "
                             f"{self.metadata['hidden_size']} but alpha has "
                             f"{alpha.shape[0]} = d + 1 entries")

    @property
    def hidden_size(self) -> int:
        """d (alpha has d + 1 entries)."""
        return int(self.alpha.shape[0]) - 1

    # ------------------------------------------------------------------------------ acting
    def terms(self, hidden: ArrayLike, log_q: ArrayLike, n_tokens: ArrayLike) -> Terms:
        """The terms of Eq. 3 over one candidate set, each numpy float32 [M]: ``log_p`` = log
        P_alpha(a | x), ``prior`` = log Qbar(a | x) and ``concept_term`` = alpha . phi(x, a; A).

        One decision, one kernel: the set is validated once, padded once (the candidate count to
        a bucket, :func:`cb_core.decisions.bucket_size`, so it compiles once per (bucket, d)) and
        scored by one compiled call, the N = 1 case of :func:`cb_core.model.problem_terms`, whose
        ``log_p`` is the fit's :func:`cb_core.model.problem_log_probs`.

        Args:
            hidden: [M, d] raw hidden states (features) of the M candidates.
            log_q: [M] summed action-token log-probabilities (nats).
            n_tokens: [M] action token counts (>= 1).

        Raises:
            ValueError: empty set, shape mismatch (also d against the concept), non-finite
                input, n_tokens < 1.
        """
        hidden, log_q, n_tokens = _check_candidate_set(hidden, log_q, n_tokens, self.hidden_size)
        m = hidden.shape[0]
        one = LabelledDecisions(hidden, log_q, n_tokens, np.array([0, m]), np.zeros(m, np.int32),
                                np.zeros(1, np.int32))
        padded = to_padded(one, dtype=np.float32, n_pad=1, m_pad=bucket_size(m))
        out = _k_terms(self.alpha.astype(np.float32), padded, np.float32(self.gamma), np.float32(self.eps))
        return Terms(*(np.asarray(x)[0, :m] for x in out))

    def decide(self, hidden: ArrayLike, log_q: ArrayLike, n_tokens: ArrayLike, count: int) -> DeviceDecision:
        """:meth:`terms` and the chosen candidate (Eq. 7) of one candidate set that already lies
        where it is computed, padded: one compiled call, no value fetched (the result's arrays stay
        on the inputs' device until the caller fetches them, after the argmax).

        The inputs' first ``count`` slots are the candidates; the rest is padding, ignored
        (:func:`cb_core.decisions.bucket_size` of ``count`` slots compiles once per (bucket, d)).
        The terms equal :meth:`terms`' on the real candidates (the same kernel, padded in the
        graph instead of on the host).

        Args:
            hidden: [M_pad, d] float32 features (e.g. a JAX backend's hidden states on its device).
            log_q: [M_pad] float32 summed action-token log-probabilities (nats).
            n_tokens: [M_pad] int32 action token counts (>= 1 in the first ``count`` slots).
            count: M, 1 <= M <= M_pad.

        Returns:
            :class:`cb_core.model.DeviceDecision`: the terms [M_pad], ``chosen`` [] int32 and
            ``finite`` [] bool (False: a non-finite input; the terms are then meaningless).

        Raises:
            ValueError: shapes that disagree with each other or with the concept's d, or ``count``
                outside [1, M_pad] (checked on the shapes alone).
        """
        shape = tuple(np.shape(hidden))
        if len(shape) != 2 or shape[1] != self.hidden_size:
            raise ValueError(f"hidden must be [M_pad, d = {self.hidden_size}], got shape {shape}")
        if tuple(np.shape(log_q)) != shape[:1] or tuple(np.shape(n_tokens)) != shape[:1]:
            raise ValueError(f"log_q {np.shape(log_q)} and n_tokens {np.shape(n_tokens)} must be [M_pad] = [{shape[0]}]")
        if not 1 <= int(count) <= shape[0]:
            raise ValueError(f"count = {count} must be in [1, M_pad = {shape[0]}]")
        return _k_decide(self.alpha.astype(np.float32), hidden, log_q, n_tokens, np.int32(count),
                         np.float32(self.gamma), np.float32(self.eps))

    @property
    def decision_head(self) -> ConceptHead:
        """This concept as the head an LM backend runs after its scoring pass (its decision fused
        into the backend's own program): :class:`ConceptHead`."""
        return ConceptHead(self)

    def log_probs(self, hidden: ArrayLike, log_q: ArrayLike, n_tokens: ArrayLike) -> np.ndarray:
        """log P_alpha(a | x) over one candidate set (Eq. 3), as numpy float32 [M]: the ``log_p``
        of :meth:`terms` (same arguments, same errors)."""
        return self.terms(hidden, log_q, n_tokens).log_p

    def choose(self, hidden: ArrayLike, log_q: ArrayLike, n_tokens: ArrayLike) -> int:
        """The chosen candidate (Eq. 7): argmax of :meth:`log_probs`.

        Tie rule (deterministic): among candidates with exactly equal log P, the lowest index
        wins.
        """
        return int(np.argmax(self.log_probs(hidden, log_q, n_tokens)))

    # ------------------------------------------------------------------------------ building
    @classmethod
    def prior_only(cls, hidden_size: int, gamma: float = 0.8, eps: float = 1e-6,
                   metadata: dict | None = None) -> Concept:
        """The alpha = 0 control (acts on the length-normalised prior alone)."""
        return cls(np.zeros(int(hidden_size) + 1, np.float32), gamma, eps,
                   dict(metadata or {}, prior_only=True))

    @classmethod
    def from_fit(cls, result: FitResult, *, backbone: str, features: str | dict, task_type: str,
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
                             tol=s["tol"], dtype=s["dtype"],
                             **({"warm_start": True} if s.get("warm_start") else {})))
        if extra:
            meta.update(extra)
        return cls(np.asarray(result.alpha), s["gamma"], s["eps"], meta)

    # ------------------------------------------------------------------------------ the file
    def to_bytes(self) -> bytes:
        """The concept file's content (format in the module docstring): safetensors + JSON
        metadata. cb_core writes no files: the caller writes these bytes (the agent shell through
        :func:`cb_io.storage.write_bytes_atomic`), and :meth:`load` reads them back.

        Raises:
            ValueError: the metadata lacks a field of the file format (naming it).
        """
        from safetensors.numpy import save

        meta = dict(self.metadata, gamma=self.gamma, eps=self.eps, hidden_size=self.hidden_size)
        _check_metadata(self.alpha.shape[0], meta, "concept")
        text = json.dumps(meta)
        return save({"alpha": np.ascontiguousarray(self.alpha)},
                    metadata={"format": FORMAT, "metadata": text, "digest": _digest(self.alpha, text)})

    @classmethod
    def load(cls, path: str | os.PathLike) -> Concept:
        """Read and validate a concept file (every file written since format 1 loads).

        Raises:
            FileNotFoundError: no such file.
            ValueError: not a concept file, naming the missing or malformed field, or a damaged
                file (its ``digest`` does not match alpha and the metadata: refit it).
        """
        from safetensors import SafetensorError
        from safetensors.numpy import safe_open

        path = os.fspath(path)
        if not os.path.exists(path):
            raise FileNotFoundError(path)
        try:
            with safe_open(path, framework="np") as f:
                header_strings = f.metadata() or {}
                meta = _header_metadata(header_strings, path)
                keys = list(f.keys())
                if "alpha" not in keys:
                    raise ValueError(f"{path}: tensor 'alpha' is missing (has {keys})")
                header = f.get_slice("alpha")  # the header's shape and dtype: nothing read yet
                shape, dtype = header.get_shape(), header.get_dtype()
                if len(shape) != 1 or dtype not in ("F32", "F64"):
                    raise ValueError(f"{path}: alpha must be [d + 1] float32 or float64, got "
                                     f"{dtype} {shape}")
                _check_metadata(shape[0], meta, path)  # before the tensor is read
                alpha = f.get_tensor("alpha")
        except SafetensorError as err:
            raise ValueError(f"{path}: not a safetensors concept file ({err})") from None
        digest = header_strings.get("digest")
        if digest is not None and digest != _digest(alpha, header_strings["metadata"]):
            raise ValueError(f"{path}: damaged concept file (its content no longer matches its SHA-256 digest); "
                             "refit it (cb-agent fit-concepts, or cb-agent fit on its decisions) or delete it")
        try:
            return cls(alpha, meta["gamma"], meta["eps"], meta)
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from None


class HeadParameters(NamedTuple):
    """A concept's parameters as a head reads them (a pytree): ``alpha`` float32 [d + 1], ``gamma``
    and ``eps`` float32 []."""

    alpha: jax.Array
    gamma: jax.Array
    eps: jax.Array


@functools.cache
def _kernel_source() -> str:
    """SHA-256 (hex, 16) of the modules the decision kernel traces: part of its name."""
    here = Path(__file__).parent
    return digest(b"".join((here / name).read_bytes() for name in ("model.py", "decisions.py"))).hex()[:16]


@dataclasses.dataclass(frozen=True)
class DecisionKernel:
    """The traceable decision of Eq. 3 and Eq. 7 on one padded candidate set
    (:data:`cb_core.model.decide_padded`), called as ``kernel(parameters, hidden, log_q, n_tokens,
    count)``: ``parameters`` a :class:`HeadParameters`, ``hidden`` [M_pad, d] float32, ``log_q``
    [M_pad] float32, ``n_tokens`` [M_pad] int32 (>= 1 in the first ``count`` slots), ``count`` []
    int32; returns a :class:`cb_core.model.DeviceDecision` (``log_p``, ``prior``, ``concept_term``
    [M_pad] float32, ``chosen`` [] int32, ``finite`` [] bool).

    One kernel serves every concept (the parameters are arguments): instances are equal and hash
    alike, and the repr names the kernel's source, so a program that traces it is stored under a
    name that changes with the kernel's code."""

    def __call__(self, parameters: HeadParameters, hidden: ArrayLike, log_q: ArrayLike, n_tokens: ArrayLike,
                 count: ArrayLike) -> DeviceDecision:
        return _k_decide(parameters.alpha, hidden, log_q, n_tokens, count, parameters.gamma, parameters.eps)

    def __repr__(self) -> str:
        return f"cb_core.DecisionKernel({_kernel_source()})"


#: The decision kernel every :class:`ConceptHead` carries.
DECISION_KERNEL = DecisionKernel()

_PLACED: "weakref.WeakKeyDictionary[Concept, dict]" = weakref.WeakKeyDictionary()


@dataclasses.dataclass(frozen=True, eq=False)
class ConceptHead:
    """A concept as the head of an LM backend's scoring pass: what a backend needs to take the
    decision inside its own program, without knowing what a concept is (it reads ``width``,
    ``kernel``, :meth:`parameters` and :meth:`check`; see :class:`agent_shell.lm.protocol.DecisionHead`).

    Attributes:
        concept: the concept.
        kernel: :data:`DECISION_KERNEL`.
    """

    concept: Concept
    kernel: ClassVar[DecisionKernel] = DECISION_KERNEL

    @property
    def width(self) -> int:
        """d, the features' width the head reads."""
        return self.concept.hidden_size

    def parameters(self, device: Any = None) -> HeadParameters:
        """The concept's alpha, gamma and eps as float32 arrays on ``device`` (a JAX device or a
        sharding, e.g. a mesh's replicated one; default JAX's default device), put there once per
        concept and device."""
        device = jax.local_devices()[0] if device is None else device
        placed = _PLACED.setdefault(self.concept, {})
        if device not in placed:
            c = self.concept
            placed[device] = HeadParameters(*(jax.device_put(np.asarray(v, np.float32), device)
                                              for v in (c.alpha, c.gamma, c.eps)))
        return placed[device]

    def check(self, hidden: ArrayLike, log_q: ArrayLike, n_tokens: ArrayLike) -> None:
        """The host's checks of one candidate set's scores (the unpadded [M, d], [M], [M]).

        Raises:
            ValueError: naming the candidate whose scores are not finite, or a shape at fault.
        """
        _check_candidate_set(hidden, log_q, n_tokens, self.width)


def _digest(alpha: np.ndarray, metadata: str) -> str:
    """SHA-256 (hex) of alpha's little-endian bytes and the metadata string of a concept file: the
    stored executables' digest (:func:`cb_core.cache.digest`)."""
    data = np.ascontiguousarray(alpha, dtype=np.asarray(alpha).dtype.newbyteorder("<")).tobytes()
    return digest(data + metadata.encode()).hex()


def _flatten(c: Concept):
    return (c.alpha, c.gamma, c.eps), _Metadata(c.metadata)


def _unflatten(aux: _Metadata, leaves) -> Concept:
    c = object.__new__(Concept)  # leaves may be tracers or placeholders: no validation
    for name, value in zip(("alpha", "gamma", "eps"), leaves):
        object.__setattr__(c, name, value)
    object.__setattr__(c, "metadata", aux.value)
    return c


jax.tree_util.register_pytree_node(Concept, _flatten, _unflatten)
