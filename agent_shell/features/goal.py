"""``goal-similarity``: how close each candidate is to the task and to what the agent just saw.

Columns (per candidate a of decision x):

0. ``cos_instruction``: cosine of a's sentence embedding with the task instruction's;
1. ``cos_observation``: cosine of a's embedding with the latest observation's
   (:attr:`DecisionInput.latest_observation`: after the latest environment step, o0 before any);
2. ``object_in_instruction``: 1 when a's object (``mug`` of ``take mug 2 from countertop 1``)
   is named by the instruction, else 0;
3. ``receptacle_in_instruction``: the same for a's second argument (``countertop``).

Embeddings come from the offline all-MiniLM-L6-v2 (:class:`agent_shell.embeddings.SentenceEmbedder`,
L2-normalised, so a cosine is a dot product), loaded on first use and shared by every
``goal-similarity`` extractor of the process; texts already embedded are reused (a candidate
set repeats from step to step). The embedder's metadata (model, package version, pooling) is the
block's metadata, so concepts fitted under another embedder are refused.

Must not import the agents, the environments or cb_core.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Mapping, Protocol, Sequence

import numpy as np

from agent_shell.features.actions import head_words, names_in, split_action
from agent_shell.features.protocol import DecisionInput

if TYPE_CHECKING:
    from agent_shell.embeddings import SentenceEmbedder
    from agent_shell.lm.protocol import CandidateScores, LanguageModel

COLUMNS = ("cos_instruction", "cos_observation", "object_in_instruction", "receptacle_in_instruction")
#: Texts kept in an extractor's embedding memo before it is cleared (bounds memory in long runs).
MEMO_LIMIT = 50_000


@functools.lru_cache(maxsize=1)
def shared_embedder() -> SentenceEmbedder:
    """The process's one offline :class:`~agent_shell.embeddings.SentenceEmbedder` (loaded once)."""
    from agent_shell.embeddings import SentenceEmbedder

    return SentenceEmbedder()


class Embedder(Protocol):
    """What the block needs of a sentence embedder: unit rows float32 [n, D] and a JSON ``metadata``."""

    @property
    def metadata(self) -> Mapping[str, Any]: ...

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


class GoalSimilarity:
    """The ``goal-similarity`` block [M, 4] (see the module docstring for the columns).

    Args:
        arg: must be None (the spec takes no argument).
        embedder: anything with ``embed(texts) -> float32 [n, D]`` (unit rows) and a ``metadata``
            dict; default :func:`shared_embedder`.
    """

    name = "goal-similarity"

    def __init__(self, arg: str | None = None, embedder: Embedder | None = None):
        if arg:
            raise ValueError(f"feature extractor 'goal-similarity' takes no argument, got {arg!r}")
        self._embedder = embedder
        self._memo: dict[str, np.ndarray] = {}

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            self._embedder = shared_embedder()
        return self._embedder

    @property
    def metadata(self) -> Mapping[str, Any]:
        return {"columns": list(COLUMNS), "embedder": dict(self.embedder.metadata)}

    def size(self, lm: LanguageModel) -> int:
        return len(COLUMNS)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Unit embeddings [n, D] of ``texts``, each distinct text embedded once per extractor."""
        new = [t for t in dict.fromkeys(texts) if t not in self._memo]
        if new:
            if len(self._memo) + len(new) > MEMO_LIMIT:
                self._memo.clear()
            for t, v in zip(new, np.asarray(self.embedder.embed(new), np.float32)):
                self._memo[t] = v
        return np.stack([self._memo[t] for t in texts])

    def extract(self, decision: DecisionInput, lm: LanguageModel, scores: CandidateScores) -> np.ndarray:
        cands = list(decision.candidates)
        vec = self.embed(cands + [decision.instruction, decision.latest_observation])
        cand, instr, obs = vec[:-2], vec[-2], vec[-1]
        task_words = head_words(decision.instruction)
        parts = [split_action(c) for c in cands]
        out = np.zeros((len(cands), len(COLUMNS)), np.float32)
        out[:, 0] = cand @ instr
        out[:, 1] = cand @ obs
        out[:, 2] = [names_in(p.obj, task_words) for p in parts]
        out[:, 3] = [names_in(p.receptacle, task_words) for p in parts]
        return out


__all__ = ["COLUMNS", "Embedder", "GoalSimilarity", "shared_embedder"]
