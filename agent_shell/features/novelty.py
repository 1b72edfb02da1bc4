"""``novelty``: what the episode's own history says about each candidate (seed 002's evidence).

Columns (per candidate a; only environment steps of the executed history count, thoughts not):

0. ``log_times_taken``: log(1 + number of earlier steps whose action was exactly a);
1. ``log_object_taken``: log(1 + number of earlier steps whose action had a's object, e.g.
   ``open drawer 1`` and ``close drawer 1``; 0 when a has no object);
2. ``taken_last_step``: 1 when a is the latest environment action (an immediate repeat);
3. ``last_outcome_nothing``: 1 when a's latest execution answered ``Nothing happens.``;
4. ``last_outcome_unchanged``: 1 when a's latest execution left the observation as it was (its
   observation equals the one before it: the previous step's, or o0).

Pure function of the decision; imports nothing of the agents, the environments or cb_core.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from agent_shell.features.actions import split_action
from agent_shell.features.protocol import DecisionInput

if TYPE_CHECKING:
    from agent_shell.lm.protocol import CandidateScores, LanguageModel

COLUMNS = ("log_times_taken", "log_object_taken", "taken_last_step", "last_outcome_nothing",
           "last_outcome_unchanged")
#: The engines' answer to an action that changed nothing (ALFWorld, ScienceWorld's invalid steps).
NOTHING_HAPPENS = "Nothing happens."


class Novelty:
    """The ``novelty`` block [M, 5] (see the module docstring for the columns)."""

    name = "novelty"

    def __init__(self, arg: str | None = None):
        if arg:
            raise ValueError(f"feature extractor 'novelty' takes no argument, got {arg!r}")

    @property
    def metadata(self) -> Mapping[str, Any]:
        return {"columns": list(COLUMNS), "nothing_happens": NOTHING_HAPPENS}

    def size(self, lm: LanguageModel) -> int:
        return len(COLUMNS)

    def extract(self, decision: DecisionInput, lm: LanguageModel, scores: CandidateScores) -> np.ndarray:
        steps = decision.env_steps
        taken: Counter = Counter()
        objects: Counter = Counter()
        last_outcome: dict[str, tuple[bool, bool]] = {}
        before = decision.observation
        for s in steps:
            taken[s.action] += 1
            obj = split_action(s.action).obj
            if obj:
                objects[obj] += 1
            last_outcome[s.action] = (s.observation.strip() == NOTHING_HAPPENS,
                                      s.observation.strip() == before.strip())
            before = s.observation
        latest = steps[-1].action if steps else None
        out = np.zeros((len(decision.candidates), len(COLUMNS)), np.float32)
        for i, c in enumerate(decision.candidates):
            obj = split_action(c).obj
            nothing, unchanged = last_outcome.get(c, (False, False))
            out[i] = (np.log1p(taken[c]), np.log1p(objects[obj]) if obj else 0.0, c == latest, nothing, unchanged)
        return out


__all__ = ["COLUMNS", "NOTHING_HAPPENS", "Novelty"]
