"""A decision of Eq. 3 taken where its scores lie, and fetched to the host once.

cb_core's decision kernel (:data:`cb_core.model.decide_padded`: the standardised features, the
prior and concept terms, log P and the argmax of one padded candidate set) runs on the scores of
:class:`agent_shell.lm.protocol.DeviceScores` where they are (a JAX device, or the host), and its
outputs are packed into one float32 array (:func:`packed`): the one array fetched to the host,
after the argmax, holding what the results record (:func:`unpacked`). The JAX backend traces the
same kernel and packing into its scoring program
(:meth:`agent_shell.lm.jax_backend.JaxLanguageModel.decide`); the PyTorch backend hands its
scores to it through DLPack (:meth:`agent_shell.lm.hf.HFLanguageModel.decide`).

Imports JAX and cb_core only when a decision is taken; must not import the agents, the
environments or torch.
"""

from __future__ import annotations

import functools
import weakref
from typing import TYPE_CHECKING, Callable

import numpy as np

from agent_shell.lm.scores import CandidateScores, Decided, DeviceScores

if TYPE_CHECKING:
    import jax
    import torch

    from cb_core import Concept
    from cb_core.model import DeviceDecision


def packed(decision: DeviceDecision) -> jax.Array:
    """float32 [3 * M_pad + 2]: log P, the prior and the concept term (each [M_pad]), then the chosen
    index and 1.0 when every real candidate's inputs are finite (else 0.0). Traceable."""
    import jax.numpy as jnp

    t = decision.terms
    flags = jnp.stack([decision.chosen.astype(jnp.float32), decision.finite.astype(jnp.float32)])
    return jnp.concatenate([t.log_p.astype(jnp.float32), t.prior.astype(jnp.float32),
                            t.concept_term.astype(jnp.float32), flags])


def unpacked(record: np.ndarray, count: int, culprit: Callable[[], CandidateScores], concept: Concept) -> Decided:
    """The :class:`Decided` of a fetched :func:`packed` record over ``count`` candidates.

    Raises:
        ValueError: the record says an input was not finite: the scores (``culprit()``, fetched only
            then) go through the host's checks, which name the candidate.
    """
    m_pad = (record.shape[0] - 2) // 3
    if record[-1] != 1.0:
        scores = culprit()
        concept.terms(scores.hidden, scores.log_q, scores.n_tokens)  # names the culprit
        raise ValueError("non-finite scores from the backend's device")
    log_p, prior, term = (record[k * m_pad:k * m_pad + count] for k in range(3))
    return Decided(int(record[-2]), log_p.copy(), prior.copy(), term.copy())


def decision(vector: jax.Array, hidden: jax.Array, log_q: jax.Array, ints: jax.Array) -> DeviceDecision:
    """cb_core's decision kernel on one padded candidate set, traceable: ``vector`` the concept's
    alpha, gamma and eps (:func:`concept_vector`), ``hidden`` [M_pad, d], ``log_q`` [M_pad], ``ints``
    int32 [M_pad + 1] the token counts and then M."""
    from cb_core.model import decide_padded

    m_pad, d = hidden.shape
    return decide_padded(vector[:d + 1], hidden, log_q, ints[:m_pad], ints[m_pad], vector[d + 1], vector[d + 2])


@functools.cache
def _program() -> Callable:
    import jax

    return jax.jit(lambda vector, hidden, log_q, ints: packed(decision(vector, hidden, log_q, ints)))


_VECTORS: "weakref.WeakKeyDictionary[Concept, dict]" = weakref.WeakKeyDictionary()


def concept_vector(concept: Concept, width: int, device: jax.Device | None = None) -> jax.Array:
    """float32 [d + 3] on ``device`` (default JAX's default device): ``concept``'s alpha, then gamma
    and eps, put there once per concept and device, for a decision on features of ``width`` columns.

    Raises:
        ValueError: ``width`` differs from the concept's d.
    """
    import jax

    if width != concept.hidden_size:
        raise ValueError(f"features of width {width} differ from the concept's d = {concept.hidden_size}")
    device = jax.devices()[0] if device is None else device
    on = _VECTORS.setdefault(concept, {})
    if device not in on:
        values = np.concatenate([np.asarray(concept.alpha, np.float32), [concept.gamma, concept.eps]])
        on[device] = jax.device_put(values.astype(np.float32), device)
    return on[device]


def decide_scores(concept: Concept, scores: DeviceScores) -> Decided:
    """The decision of Eq. 3 under ``concept`` on padded ``scores`` (features = ``scores.hidden``),
    computed where they lie: one compiled call, one array fetched.

    Raises:
        ValueError: features whose width differs from the concept's d; non-finite scores (naming
            the candidate).
    """
    devices = getattr(scores.hidden, "devices", None)
    vector = concept_vector(concept, int(scores.hidden.shape[1]), next(iter(devices())) if devices else None)
    ints = np.append(np.asarray(scores.n_tokens, np.int32), np.int32(scores.count))
    record = _program()(vector, scores.hidden, scores.log_q, ints)
    return unpacked(np.asarray(record), scores.count, scores.fetched, concept)


def as_jax(array: torch.Tensor | np.ndarray) -> jax.Array | np.ndarray:
    """A torch tensor as a JAX array on the matching device without a copy (DLPack), a numpy array as
    it is; a tensor on a device JAX does not see here comes to the host first. A tensor that
    requires grad is detached (DLPack refuses it) and a strided one made contiguous (a copy) first;
    bfloat16 stays bfloat16 (through the host: ml_dtypes' bfloat16, bit for bit)."""
    import jax

    if isinstance(array, np.ndarray):
        return array
    array = array.detach()
    if not array.is_contiguous():
        array = array.contiguous()
    try:
        return jax.dlpack.from_dlpack(array)
    except (RuntimeError, TypeError, ValueError, BufferError):  # no JAX device of its kind: through the host
        host = array.cpu()
        if str(host.dtype) == "torch.bfloat16":  # numpy has no bfloat16: the same bits, as ml_dtypes'
            import ml_dtypes
            import torch

            return host.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return host.numpy()


__all__ = ["as_jax", "concept_vector", "decide_scores", "decision", "packed", "unpacked"]
