"""What a backend's scores are: a candidate set's numbers on the host (:class:`CandidateScores`), on
the backend's device (:class:`DeviceScores`), and a decision under a concept as fetched to the host
(:class:`Decided`). Plain data (numpy only), shared by the protocol
(:mod:`agent_shell.lm.protocol`, which names them too) and the decision
(:mod:`agent_shell.lm.decision`).

Must not import the agents, the environments, torch or JAX.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping

import numpy as np

if TYPE_CHECKING:
    import jax


def fetch(array: object) -> np.ndarray:
    """A device array's values on this host, as numpy: a program's replicated output over several
    hosts (a JAX array that is not fully addressable from one) is read from this host's copy."""
    if getattr(array, "is_fully_addressable", True) is False:
        array = array.addressable_data(0)  # type: ignore[attr-defined]
    return np.asarray(array)


@dataclass(frozen=True)
class CandidateScores:
    """Scores of M candidate actions after one context.

    Attributes:
        log_q: [M] float32, summed natural-log probabilities of each action's tokens (nats).
        n_tokens: [M] int32, number of action tokens counted (>= 1).
        hidden: [M, d] float32, last-layer hidden state at each action's final token.
        layers: (layer, pool) -> [M, d] float32, inner-layer states taken from the same forward
            pass when they were asked for (:meth:`agent_shell.lm.hf.HFLanguageModel.score_with_layers`;
            feature blocks ``lm-layer:K[:pool]``); empty otherwise.
    """

    log_q: np.ndarray
    n_tokens: np.ndarray
    hidden: np.ndarray
    layers: Mapping[tuple[int, str], np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True)
class DeviceScores:
    """A candidate set's scores where the decision kernel reads them, padded to M_pad slots
    (:func:`agent_shell.lm.buckets.slots` of M, so one program serves every set of a size bucket)
    of which the first ``count`` are the candidates.

    Attributes:
        log_q: [M_pad] float32, summed action-token log-probabilities (nats; 0 in padded slots): a
            JAX array on the backend's device, or numpy on the host.
        hidden: [M_pad, D] float32, the features (the LM head input at each final action token), alike.
        n_tokens: [M_pad] int32 numpy, action token counts (1 in padded slots).
        count: M.
    """

    log_q: jax.Array | np.ndarray
    hidden: jax.Array | np.ndarray
    n_tokens: np.ndarray
    count: int

    @classmethod
    def from_host(cls, scores: CandidateScores, hidden: np.ndarray | None = None) -> "DeviceScores":
        """Host ``scores`` in :func:`agent_shell.lm.buckets.slots` slots (``hidden``: features to decide
        on in the place of the hidden states)."""
        from agent_shell.lm.buckets import slots

        features = np.asarray(scores.hidden if hidden is None else hidden, np.float32)
        m = int(features.shape[0])
        m_pad = slots(m)
        log_q, n_tokens = np.zeros(m_pad, np.float32), np.ones(m_pad, np.int32)
        log_q[:m], n_tokens[:m] = scores.log_q, scores.n_tokens
        wide = np.zeros((m_pad, features.shape[1]), np.float32)
        wide[:m] = features
        return cls(log_q, wide, n_tokens, m)

    def fetched(self) -> CandidateScores:
        """The scores on the host, unpadded (as :meth:`LanguageModel.score` returns them)."""
        m = self.count
        return CandidateScores(log_q=np.array(fetch(self.log_q), np.float32)[:m], n_tokens=self.n_tokens[:m].copy(),
                               hidden=np.array(fetch(self.hidden), np.float32)[:m])


@dataclass(frozen=True)
class Decided:
    """A candidate set decided under a concept (:func:`agent_shell.lm.decision.decide`), as fetched to the host.

    Attributes:
        chosen: the argmax of ``log_p`` (Eq. 7; the lowest index on ties).
        log_p: [M] float32, log P(a | x) (Eq. 3).
        prior: [M] float32, the prior term log Qbar(a | x) (length-normalised, normalised over the set).
        concept_term: [M] float32, alpha . phi(x, a; A) (standardised features, bias coordinate).
    """

    chosen: int
    log_p: np.ndarray
    prior: np.ndarray
    concept_term: np.ndarray


__all__ = ["CandidateScores", "Decided", "DeviceScores"]
