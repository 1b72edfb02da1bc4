"""The feature-extractor protocol: what the concept sees of a decision (seed App. B, generalised).

A concept scores candidate ``a`` of a decision as ``log Qbar(a|x) + alpha . phi(x, a; A)``. The
seed's ``phi`` is the LM's last-layer hidden state at ``a``'s final token, standardised across
the candidate set A, plus a bias coordinate. Here ``phi`` is built from *blocks*: each chosen
:class:`FeatureExtractor` returns a raw block [M, k_j] for the M candidates of one decision; the
blocks are concatenated into [M, k] (k = sum k_j) and handed to cb_core in the place of the
hidden states, where every column is standardised across the candidate set and the bias
coordinate ``M ** -0.5`` is appended (:func:`cb_core.standardized_features`). So cb_core is
unchanged and the objective (seed Eq. 6) stays strongly convex (Hessian >= lam I) whatever the
blocks are; a column that is constant within a candidate set contributes exactly 0 there.

An extractor reads a :class:`DecisionInput` (the scoring context the LM reads, the task
instruction, the initial observation, the *true* history of steps before the decision and the
candidate set) and the LM's :class:`~agent_shell.lm.protocol.CandidateScores` of that decision
(computed once per decision for the prior, so the LM's own hidden state costs nothing extra).
The history is the executed one even under the diagnostic renderings (``shuffle-all``, ...),
which change only what the LM reads.

Must not import the agents, the environments or cb_core.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    import numpy.typing as npt

    from agent_shell.lm.protocol import CandidateScores, Context, LanguageModel

#: The kind of a think step (:class:`cb_io.records.Step`); think steps are no transitions.
_THINK = "think"


@dataclass(frozen=True)
class DecisionInput:
    """One decision as the feature extractors see it.

    Attributes:
        context: the scoring context x the LM scores the candidates after (text, or chat
            messages; :func:`agent_shell.context.scoring_context`).
        instruction: the task instruction (e.g. ``"Your task is to: put a clean mug in ..."``).
        observation: the initial observation o0.
        history: the executed steps before this decision, thoughts included (objects with
            ``kind`` "think"/"env", ``action``, ``observation``).
        candidates: the candidate set A (M >= 1 non-empty strings), in scoring order.
        action_prefix: what the LM puts between the context and a candidate (layout's prefix).
    """

    context: Context
    instruction: str
    observation: str
    history: tuple
    candidates: tuple[str, ...]
    action_prefix: str = "\n> "

    def __post_init__(self) -> None:
        object.__setattr__(self, "history", tuple(self.history))
        object.__setattr__(self, "candidates", tuple(self.candidates))
        if not self.candidates:
            raise ValueError("DecisionInput: empty candidate set")
        for i, c in enumerate(self.candidates):
            if not isinstance(c, str) or not c:
                raise ValueError(f"DecisionInput: candidate {i} is {c!r}, not a non-empty string")

    @property
    def env_steps(self) -> list:
        """The environment steps of the history (think steps dropped), in order."""
        return [s for s in self.history if s.kind != _THINK]

    @property
    def latest_observation(self) -> str:
        """The observation after the latest environment step, or o0 before the first one."""
        steps = self.env_steps
        return steps[-1].observation if steps else self.observation


@runtime_checkable
class FeatureExtractor(Protocol):
    """One block of the concept's features.

    Attributes:
        name: the spec that selects it (``"lm-hidden"``, ``"lm-layer:6"``, ...), recorded in the
            concept's metadata and compared when acting.
        metadata: JSON-serialisable description of how the block is computed (model names and
            versions, column names, ...); recorded in the concept and compared when acting, so
            put in it everything a block of another construction would differ by.
        version: optional (a string or number): the version of the extractor's code. The block
            cache keys a block by the extractor's name, width, metadata and this version, not by
            its code: after changing what ``extract`` computes, change ``version`` (or the
            metadata), or the cached blocks of the old code are read back.

    ``extract`` gets the LM's scores of the decision (``scores``: a
    :class:`agent_shell.lm.scores.CandidateScores`, ``.log_q`` [M], ``.n_tokens`` [M] and
    ``.hidden`` [M, d], the LM head's input at each candidate's final action token) and the
    backbone itself (``lm.hidden_size`` is d; ``lm.score``, ``lm.generate`` are there too).
    A complete example is :mod:`agent_shell.features.examples`.
    """

    name: str

    @property
    def metadata(self) -> Mapping[str, Any]: ...

    def size(self, lm: LanguageModel) -> int:
        """k, the block's width, for backbone ``lm`` (e.g. ``lm.hidden_size``)."""
        ...

    def extract(self, decision: DecisionInput, lm: LanguageModel, scores: CandidateScores) -> np.ndarray:
        """The raw block for the decision's M candidates: float32 [M, k], finite.

        Args:
            decision: the decision.
            lm: the backbone that scored it (a :class:`agent_shell.lm.protocol.LanguageModel`).
            scores: ``lm.score(decision.context, decision.candidates, decision.action_prefix)``.
        """
        ...


def check_block(name: str, block: npt.ArrayLike, m: int, k: int) -> np.ndarray:
    """``block`` as float32 [m, k]; ValueError naming extractor ``name`` when it is not that."""
    arr = np.asarray(block, dtype=np.float32)
    if arr.shape != (m, k):
        raise ValueError(f"feature extractor {name!r} returned shape {arr.shape}, expected [M, k] = [{m}, {k}]")
    if not np.isfinite(arr).all():
        bad = int(np.flatnonzero(~np.isfinite(arr).all(axis=1))[0])
        raise ValueError(f"feature extractor {name!r} returned a non-finite value for candidate {bad}")
    return arr


__all__ = ["DecisionInput", "FeatureExtractor", "check_block"]
