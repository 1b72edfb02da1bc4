"""History renderings: how the interaction history is shown to the LM (action-calibration study).

Agents often fail to connect a past action with its outcome and repeat what already failed. A
*rendering* decides how the history of a trajectory is shown; every agent context (ReAct routing
prompt, CB-Agent's scoring context, Reflexion's reflection prompt, concept fitting) goes through
one, so fitting and acting see the same text.

Each rendering is a small pure function ``(steps, experiences, seed) -> HistoryView`` of the
steps (objects with ``kind`` / ``action`` / ``observation``, e.g. :class:`cb_io.records.Step`):

* ``raw`` - the ordinary alternating action / observation history.
* ``causal`` - each returned observation is labelled as the outcome of the action that preceded
  it (``Result of "open drawer 1": ...``); same observations, same order, no new information
  and no advice. Think steps (feedback ``OK.``) are not transitions and stay as they are.
* ``check`` - raw plus :data:`CHECK_REMINDER` after the history, right before the next action.
* ``experience`` - raw plus, beside each transition, the experience an LM review call kept for
  it (see :mod:`agent_shell.experience`); a transition reviewed as ``NO UPDATE`` shows nothing.
* ``calibrator`` - shown as ``experience``, but the experiences are written by the learned
  calibrator (:mod:`agent_shell.calibration`: sampled candidates, the calibrator chooses one or
  NO UPDATE).
* Interventions (diagnostics): ``recent3`` (only the three latest steps, with a count of the
  hidden ones), ``obs-only`` (observations of environment steps only; actions and thoughts
  removed), ``shuffle-all`` (the environment-action strings reassigned by a random permutation
  while observations stay in order) and ``shuffle-old`` (as shuffle-all, the three latest steps
  intact). The permutation is drawn from ``numpy.random.default_rng([seed, len(steps)])``:
  reproducible, and fresh as the history grows. Think steps never move.

A :class:`HistoryView` is layout-free; :mod:`agent_shell.context` lays it out as one text
prompt (``"> action\\nobservation"`` lines) or as alternating assistant / user chat messages.
This module imports nothing from the LM, cb_core or the games; of the records
(:mod:`cb_io.records`) only the think-step prefix (:data:`~cb_io.records.THINK_PREFIX`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Protocol, Sequence

import numpy as np

from cb_io.records import THINK_PREFIX
#: The Check rendering's reminder, shown after the history (no advice on what to do).
CHECK_REMINDER = ("Before the next action, check the history above again: what did each earlier "
                  "action actually lead to?")
#: Label of an experience shown beside its source transition.
EXPERIENCE_LABEL = "Experience:"
#: How many latest steps ``recent3`` shows and ``shuffle-old`` leaves intact.
RECENT = 3


class StepLike(Protocol):
    """What a rendering reads from a step (duck-typed; :class:`cb_io.records.Step` fits)."""

    kind: str  # "think" or "env"
    action: str
    observation: str


@dataclass(frozen=True)
class Entry:
    """One rendered step.

    Attributes:
        step: index of the source step in the trajectory.
        action: transcript action text (``think: ...`` for thoughts), or None when hidden.
        observation: the observation text as shown (possibly labelled).
        experience: the experience shown beside this transition, or None.
    """

    step: int
    action: str | None
    observation: str
    experience: str | None = None


@dataclass(frozen=True)
class HistoryView:
    """A rendered history: its entries in order, and what surrounds them.

    Attributes:
        entries: the shown steps.
        hidden_before: number of earlier steps left out (``recent3``), announced in the text.
        reminder: text shown after the history (``check``), or None.
    """

    entries: tuple[Entry, ...]
    hidden_before: int = 0
    reminder: str | None = None


def action_line(step: StepLike) -> str:
    """The transcript text of a step's action: ``think: ...`` for a think step, else the action.

    Think steps may store their text with or without the ``think:`` prefix; both render the same.
    """
    action = step.action.strip()
    if step.kind == "think" and not action.lower().startswith(THINK_PREFIX):
        action = f"{THINK_PREFIX} {action}"
    return action


def _raw_entries(steps: Sequence[StepLike], experiences: Mapping[int, str] | None = None) -> list[Entry]:
    experiences = experiences or {}
    return [Entry(i, action_line(s), s.observation.strip(), experiences.get(i)) for i, s in enumerate(steps)]


def render_raw(steps: Sequence[StepLike], experiences: Mapping[int, str] | None = None,
               seed: int = 0) -> HistoryView:
    """Raw: the ordinary alternating action / observation history."""
    return HistoryView(tuple(_raw_entries(steps)))


def causal_label(action: str) -> str:
    """The label of an observation returned by ``action``: ``Result of "<action>":``."""
    return f'Result of "{action}":'


def render_causal(steps: Sequence[StepLike], experiences: Mapping[int, str] | None = None,
                  seed: int = 0) -> HistoryView:
    """Causal transition: each environment observation labelled as the outcome of its action."""
    entries = [e if steps[e.step].kind == "think" else
               Entry(e.step, e.action, f"{causal_label(e.action)} {e.observation}")
               for e in _raw_entries(steps)]
    return HistoryView(tuple(entries))


def render_check(steps: Sequence[StepLike], experiences: Mapping[int, str] | None = None,
                 seed: int = 0) -> HistoryView:
    """Check: raw plus :data:`CHECK_REMINDER` after the history (only when there is a history)."""
    return HistoryView(tuple(_raw_entries(steps)), reminder=CHECK_REMINDER if steps else None)


def render_experience(steps: Sequence[StepLike], experiences: Mapping[int, str] | None = None,
                      seed: int = 0) -> HistoryView:
    """Experience: raw plus each kept experience beside its source transition (step index)."""
    return HistoryView(tuple(_raw_entries(steps, experiences)))


def render_recent3(steps: Sequence[StepLike], experiences: Mapping[int, str] | None = None,
                   seed: int = 0) -> HistoryView:
    """Recent-3-Only: the three latest steps; the number of hidden earlier steps is stated."""
    entries = _raw_entries(steps)
    return HistoryView(tuple(entries[-RECENT:]), hidden_before=max(0, len(entries) - RECENT))


def render_obs_only(steps: Sequence[StepLike], experiences: Mapping[int, str] | None = None,
                    seed: int = 0) -> HistoryView:
    """Observation-Only: the observations of environment steps, in order, without actions."""
    return HistoryView(tuple(Entry(i, None, s.observation.strip()) for i, s in enumerate(steps)
                             if s.kind != "think"))


def shuffled_actions(steps: Sequence[StepLike], seed: int, keep_recent: int = 0) -> list[str]:
    """The action texts after reassigning environment actions by a seeded random permutation.

    Only environment steps before the ``keep_recent`` latest steps take part; thoughts and the
    kept steps keep their own action. Deterministic in (``seed``, ``len(steps)``).
    """
    actions = [action_line(s) for s in steps]
    cut = max(0, len(steps) - keep_recent)
    movable = [i for i, s in enumerate(steps[:cut]) if s.kind != "think"]
    perm = np.random.default_rng([seed, len(steps)]).permutation(len(movable))
    shuffled = list(actions)
    for dst, src in zip(movable, perm):
        shuffled[dst] = actions[movable[src]]
    return shuffled


def _shuffled(steps: Sequence[StepLike], seed: int, keep_recent: int) -> HistoryView:
    actions = shuffled_actions(steps, seed, keep_recent)
    return HistoryView(tuple(Entry(i, a, s.observation.strip()) for i, (a, s) in enumerate(zip(actions, steps))))


def render_shuffle_all(steps: Sequence[StepLike], experiences: Mapping[int, str] | None = None,
                       seed: int = 0) -> HistoryView:
    """Shuffle-All: environment-action strings permuted at random; observations stay in order."""
    return _shuffled(steps, seed, keep_recent=0)


def render_shuffle_old(steps: Sequence[StepLike], experiences: Mapping[int, str] | None = None,
                       seed: int = 0) -> HistoryView:
    """Shuffle-Old: as Shuffle-All, but the three latest steps keep their own actions."""
    return _shuffled(steps, seed, keep_recent=RECENT)


Rendering = Callable[..., HistoryView]

#: name -> rendering; the names of ``cb-agent run --history``.
RENDERINGS: dict[str, Rendering] = {
    "raw": render_raw,
    "causal": render_causal,
    "check": render_check,
    "experience": render_experience,
    "calibrator": render_experience,
    "recent3": render_recent3,
    "obs-only": render_obs_only,
    "shuffle-all": render_shuffle_all,
    "shuffle-old": render_shuffle_old,
}

#: Renderings whose experiences come from a review of each transition (plain LM review, or the
#: learned calibrator): agents review after every non-terminal environment step.
REVIEWED = frozenset({"experience", "calibrator"})

#: Renderings that are diagnostics of the agent's own history: demonstrations stay raw.
INTERVENTIONS = frozenset({"recent3", "obs-only", "shuffle-all", "shuffle-old"})

#: Renderings that read the run's seed (the permutation of the shuffled actions): the only ones
#: whose contexts, and so whose features, change with it.
SEEDED_RENDERINGS = frozenset({"shuffle-all", "shuffle-old"})


def check_rendering(rendering: str) -> str:
    """Return ``rendering`` if known; raise ValueError naming it and the known ones otherwise."""
    if rendering not in RENDERINGS:
        raise ValueError(f"unknown history rendering {rendering!r}; known: {sorted(RENDERINGS)}")
    return rendering


def render(steps: Sequence[StepLike], rendering: str = "raw", experiences: Mapping[int, str] | None = None,
           seed: int = 0) -> HistoryView:
    """The :class:`HistoryView` of ``steps`` under ``rendering`` (ValueError if unknown)."""
    return RENDERINGS[check_rendering(rendering)](steps, experiences, seed)


def demo_rendering(rendering: str) -> str:
    """The rendering of demonstrations: the same one, except ``raw`` for the interventions."""
    return "raw" if check_rendering(rendering) in INTERVENTIONS else rendering
