"""``novelty``: what the episode's own history says about each candidate (seed 002's evidence).

Columns (per candidate a; only environment steps of the executed history count, thoughts not):

0-4. ``taken_ge_1`` .. ``taken_ge_16``: 1 when a was taken at least 1, 2, 4, 8, 16 times before
     (:data:`THRESHOLDS`; the count, in indicator columns, see below);
5-9. ``object_taken_ge_1`` .. ``object_taken_ge_16``: the same for earlier steps whose action had
     a's object (``open drawer 1`` and ``close drawer 1``; all 0 when a has no object);
10. ``taken_last_step``: 1 when a is the latest environment action (an immediate repeat);
11. ``last_outcome_nothing``: 1 when a's latest execution got the engine's "nothing happened"
    (:func:`cb_io.feedback.is_nothing`: ALFWorld ``Nothing happens.``, TextWorld's parser refusals,
    ScienceWorld's ``No known action matches that input.``, ``The door is already open.``, ...);
12. ``last_outcome_unchanged``: 1 when a's latest execution left the observation as it was: its
    observation equals the one before it (the previous step's, or o0) once both are
    :func:`cb_io.feedback.normalise`\\ d (TextWorld's status line with its move counter cut).

Why indicator columns. cb_core standardises every column within the candidate set before the
concept reads it (seed App. B, Eq. for phi):

    phi(x, a; A)_k = (h_ak - mean_A h_k) / max(std_A h_k, eps),   phi_d = M ** -0.5,

so one count column loses its magnitude: in a set where one candidate was taken 19 times and the
rest never, and in a set where it was taken once, ``log(1 + count)`` standardises to the same
values. Indicator columns (a thermometer code of the count) keep it: 19 fires ``taken_ge_2`` ..
``taken_ge_16`` as well, which a count of 1 leaves constant (0) across the set, so those
coordinates of phi differ (and alpha weighs each threshold on its own). Exempting columns from
the standardisation would change cb_core's features, its kernels, and every concept's
description; the indicators change this block alone, and the default ``lm-hidden`` features
and their cache keys stay as they were.

The decision does not say its engine, so every engine's rule of :data:`cb_io.feedback.ENGINE_FEEDBACK`
applies (their wordings are disjoint). Pure function of the decision; imports nothing of the
agents, the environments or cb_core.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from agent_shell.features.actions import split_action
from agent_shell.features.protocol import DecisionInput
from cb_io.feedback import ENGINE_FEEDBACK, is_nothing, normalise

if TYPE_CHECKING:
    from agent_shell.lm.protocol import CandidateScores, LanguageModel

#: The count thresholds of the indicator columns.
THRESHOLDS = (1, 2, 4, 8, 16)
COLUMNS = (*(f"taken_ge_{t}" for t in THRESHOLDS), *(f"object_taken_ge_{t}" for t in THRESHOLDS),
           "taken_last_step", "last_outcome_nothing", "last_outcome_unchanged")
#: The block's construction; part of its metadata (a concept of another version is refused, and
#: its cached blocks are not reused).
VERSION = 2


def thermometer(count: int) -> list[float]:
    """[len(THRESHOLDS)] 1.0 where ``count >= threshold``, else 0.0."""
    return [float(count >= t) for t in THRESHOLDS]


class Novelty:
    """The ``novelty`` block [M, 13] (see the module docstring for the columns)."""

    name = "novelty"

    def __init__(self, arg: str | None = None):
        if arg:
            raise ValueError(f"feature extractor 'novelty' takes no argument, got {arg!r}")

    @property
    def metadata(self) -> Mapping[str, Any]:
        return {"version": VERSION, "columns": list(COLUMNS), "thresholds": list(THRESHOLDS),
                "feedback": {env: {"nothing": list(r.nothing), "counters": list(r.counters)}
                             for env, r in ENGINE_FEEDBACK.items()}}

    def size(self, lm: LanguageModel) -> int:
        return len(COLUMNS)

    def extract(self, decision: DecisionInput, lm: LanguageModel, scores: CandidateScores) -> np.ndarray:
        steps = decision.env_steps
        taken: Counter = Counter()
        objects: Counter = Counter()
        last_outcome: dict[str, tuple[bool, bool]] = {}
        before = normalise(decision.observation)
        for s in steps:
            taken[s.action] += 1
            obj = split_action(s.action).obj
            if obj:
                objects[obj] += 1
            after = normalise(s.observation)
            last_outcome[s.action] = (is_nothing(s.observation), after == before)
            before = after
        latest = steps[-1].action if steps else None
        out = np.zeros((len(decision.candidates), len(COLUMNS)), np.float32)
        for i, c in enumerate(decision.candidates):
            obj = split_action(c).obj
            nothing, unchanged = last_outcome.get(c, (False, False))
            out[i] = (*thermometer(taken[c]), *thermometer(objects[obj] if obj else 0), c == latest, nothing,
                      unchanged)
        return out


__all__ = ["COLUMNS", "THRESHOLDS", "VERSION", "Novelty", "thermometer"]
