"""The concept's data: expert decisions of won trajectories (seed Eq. 5).

Each environment step of an expert trajectory is one decision: the history strictly before the
action (its context is built from nothing later, never from the action's own feedback), the
saved candidate set of the state (filtered as the acting agent filters it), and the index of the
expert's action in it. :mod:`agent_shell.concepts` turns these into features and fits a concept.

Imports no LM, no game engine and not cb_core.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass
from typing import Callable, Sequence

from cb_io.records import Step, Trajectory


#: The key of a step's ``info`` that holds the expert's action in that state, on an agent's
#: episode the expert relabelled (:mod:`agent_shell.improve_labels`).
EXPERT_LABEL = "expert_action"


@dataclass(frozen=True)
class DecisionExample:
    """One expert decision: choose ``candidates[expert_index]`` after ``history``.

    Attributes:
        task_id, task_type, instruction, observation: from the trajectory (o0 = observation).
        history: the steps strictly before this action (thoughts included); the context of seed
            Eq. (5) is built only from these, never from the action's own feedback.
        candidates: the (filtered) candidate set A_t, order preserved.
        expert_index: index of the expert action a_t in ``candidates``.
        step_index: position of the action in ``trajectory.steps``.
    """

    task_id: str
    task_type: str
    instruction: str
    observation: str
    history: tuple[Step, ...]
    candidates: list[str]
    expert_index: int
    step_index: int

    @property
    def expert_action(self) -> str:
        return self.candidates[self.expert_index]


def capped_candidates(candidates: Sequence[str], expert: str, limit: int, key: str) -> list[str]:
    """At most ``limit`` of ``candidates``: the ``expert`` action and ``limit - 1`` others drawn
    uniformly without replacement, in their original order; all of them when ``limit`` is 0 or not
    smaller than the set. The draw is seeded by ``key`` (the trajectory and step), so every run,
    process and machine fits on the same subsets."""
    if limit <= 0 or len(candidates) <= limit:
        return list(candidates)
    others = [i for i, c in enumerate(candidates) if c != expert]
    chosen = set(random.Random(zlib.crc32(key.encode())).sample(others, limit - 1))
    return [c for i, c in enumerate(candidates) if c == expert or i in chosen]


def decision_examples(
    trajectory: Trajectory,
    candidate_filter: Callable[[Sequence[str]], list[str]] | None = None,
    skip_expert_appended: bool = False,
    max_candidates: int = 0,
    relabelled: bool = False,
) -> tuple[list[DecisionExample], int]:
    """One decision example per environment step of ``trajectory`` (seed Eq. 5).

    ``max_candidates`` (0: no cap) caps each candidate set after filtering, the expert action
    kept (:func:`capped_candidates`): ScienceWorld's valid action-object combinations run to about
    1,000 a state, which would cost the concept's fit minutes of LM time per decision.

    An expert action that the optional ``candidate_filter`` removed from its set (ALFWorld's
    expert ``look`` steps when look/inventory/help are filtered) yields no example and is counted
    in ``n_skipped``; its step still appears in later examples' histories. With
    ``skip_expert_appended`` a step whose expert action the collector had to append to an
    incomplete engine set (ScienceWorld, ``info["expert_appended"]``) is skipped and counted too.

    ``relabelled``: the trajectory is an agent's episode labelled by the expert (:data:`EXPERT_LABEL`
    in a step's ``info``, :mod:`agent_shell.improve_labels`): the target is that label, not the
    action taken (which stays in later histories); a step without a label yields no example and is
    not counted (the labeller counts why).

    Returns:
        (examples, n_skipped).

    Raises:
        ValueError: an env step whose action is not in its saved (unfiltered) candidate set,
            naming the trajectory and the step; a candidate set with duplicates that would make
            ``expert_index`` ambiguous is deduplicated (first occurrence kept) instead.
    """
    examples: list[DecisionExample] = []
    skipped = 0
    for i, step in enumerate(trajectory.steps):
        if step.kind != "env":
            continue
        assert step.candidates is not None
        target = step.info.get(EXPERT_LABEL) if relabelled else step.action
        if target is None:
            continue
        if target not in step.candidates:
            raise ValueError(
                f"trajectory {trajectory.task_id!r} ({trajectory.env}), step {i}: expert action "
                f"{target!r} is not in its saved candidate set of {len(step.candidates)}"
            )
        candidates = list(dict.fromkeys(step.candidates))
        if candidate_filter is not None:
            candidates = list(dict.fromkeys(candidate_filter(candidates)))
        if target not in candidates or (skip_expert_appended and step.info.get("expert_appended")):
            skipped += 1
            continue
        candidates = capped_candidates(candidates, target, max_candidates, f"{trajectory.task_id}\0{i}")
        examples.append(
            DecisionExample(
                task_id=trajectory.task_id,
                task_type=trajectory.task_type,
                instruction=trajectory.instruction,
                observation=trajectory.observation,
                history=tuple(trajectory.steps[:i]),
                candidates=candidates,
                expert_index=candidates.index(target),
                step_index=i,
            )
        )
    return examples, skipped


__all__ = ["EXPERT_LABEL", "DecisionExample", "capped_candidates", "decision_examples"]
