"""Feature blocks from the backbone's own states: ``lm-hidden`` (the seed's) and ``lm-layer:K``.

* ``lm-hidden``: the last-layer hidden state at each candidate's final action token, exactly the
  vector the LM head reads there (after the final norm), as returned by
  :meth:`LanguageModel.score` (seed App. B). Costs nothing beyond the prior's scoring pass. The
  default, and what every concept file written before feature extractors existed holds.
* ``lm-layer:K`` / ``lm-layer:K:mean``: the output of decoder layer K (K = 1..L; 0 = the token
  embeddings; negative K counts from the end, -1 = layer L, before the final norm) at the final
  action token (``last``, the default) or averaged over the action's tokens (``mean``). Needs a
  backend with :meth:`candidate_states` (the HuggingFace backend has it). The states come from
  the scoring pass itself when the decision scorer asked for them there
  (:class:`agent_shell.decision_scorer.DecisionRequest`: ``scores.layers``); otherwise (scores
  read from the features cache, or a backend without ``score_with_layers``) the candidates' pass
  is rerun over the cached context.

Must not import the agents, the environments or cb_core.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

from agent_shell.features.protocol import DecisionInput

if TYPE_CHECKING:
    from agent_shell.lm.protocol import CandidateScores, Context, LanguageModel

POOLS = ("last", "mean")


@runtime_checkable
class LayerStatesModel(Protocol):
    """A backend that returns an inner layer's states at the candidates' action tokens."""

    def candidate_states(self, context: Context, candidates: Sequence[str], action_prefix: str, layer: int,
                         pool: str = "last") -> np.ndarray:
        """float32 [M, hidden_size]: layer ``layer``'s output (0 = embeddings, negative from the
        end) at each candidate's final action token (``pool="last"``) or averaged over its action
        tokens (``"mean"``), with the same token accounting as :meth:`score`.

        Raises:
            ValueError: a layer outside [-L, L], an unknown pool, or what :meth:`score` raises.
        """
        ...


class LMHidden:
    """``lm-hidden``: the seed's feature block, ``scores.hidden`` [M, d]."""

    name = "lm-hidden"

    def __init__(self, arg: str | None = None):
        if arg:
            raise ValueError(f"feature extractor 'lm-hidden' takes no argument, got {arg!r} "
                             f"(another layer or pooling: lm-layer:K or lm-layer:K:mean)")

    @property
    def metadata(self) -> Mapping[str, Any]:
        return {"state": "last-layer state read by the LM head (after the final norm) at the final action token"}

    def size(self, lm: LanguageModel) -> int:
        return int(lm.hidden_size)

    def extract(self, decision: DecisionInput, lm: LanguageModel, scores: CandidateScores) -> np.ndarray:
        return np.asarray(scores.hidden, np.float32)


class LMLayer:
    """``lm-layer:K[:last|mean]``: decoder layer K's output at the action's final token or averaged
    over its tokens.

    Raises:
        ValueError: a missing or non-integer K, or an unknown pooling.
    """

    def __init__(self, arg: str | None = None):
        layer, _, pool = (arg or "").partition(":")
        try:
            self.layer = int(layer)
        except ValueError:
            raise ValueError(f"feature extractor 'lm-layer' needs an integer layer, as in lm-layer:6 or "
                             f"lm-layer:-2:mean; got {arg!r}") from None
        self.pool = pool or "last"
        if self.pool not in POOLS:
            raise ValueError(f"feature extractor 'lm-layer': pooling {self.pool!r} is not one of {list(POOLS)}")
        self.name = f"lm-layer:{self.layer}" + (":mean" if self.pool == "mean" else "")

    @property
    def metadata(self) -> Mapping[str, Any]:
        return {"layer": self.layer, "pool": self.pool,
                "state": "decoder layer output (0 = token embeddings, negative from the end), before the final norm"}

    def size(self, lm: LanguageModel) -> int:
        return int(lm.hidden_size)

    def extract(self, decision: DecisionInput, lm: LanguageModel, scores: CandidateScores) -> np.ndarray:
        states = getattr(scores, "layers", {}).get((self.layer, self.pool))
        if states is not None:  # taken from the scoring pass
            return np.asarray(states, np.float32)
        if not isinstance(lm, LayerStatesModel):
            raise ValueError(f"feature extractor {self.name!r} needs a backend with candidate_states(); "
                             f"{getattr(lm, 'name', type(lm).__name__)!r} has none")
        return np.asarray(lm.candidate_states(decision.context, list(decision.candidates), decision.action_prefix,
                                              self.layer, self.pool), np.float32)


__all__ = ["LMHidden", "LMLayer", "LayerStatesModel", "POOLS"]
