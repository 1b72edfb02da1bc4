"""ICAL's execution of a program in the real game, and the feedback H it yields for revision.

:func:`execute` runs a :class:`agent_shell.ical.program.Program` (annotations as think steps) in a
fresh game; where it fails (an action outside the state's candidate set, an action the engine
answers with its invalid feedback, a finished program that did not reach the goal, or a person's
comment through :class:`HumanFeedback`) it stops and returns an :class:`Execution` whose
``feedback`` is the text given back to the LM (:mod:`agent_shell.ical.learn`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

from agent_shell.ical.program import Program
from cb_io.records import Trajectory

if TYPE_CHECKING:
    from envs.protocol import Environment

#: Observations that mean the engine did not execute an action (ALFWorld, TextWorld, ScienceWorld).
INVALID_FEEDBACK = ("Nothing happens.", "I don't understand that", "No known action matches that input.")
#: Valid actions listed in feedback at most (the rest is counted).
FEEDBACK_CANDIDATES = 40


class Feedback(Protocol):
    """Who comments on an execution besides the environment (a person at a terminal, or nobody)."""

    def on_step(self, index: int, action: str, observation: str) -> str | None:
        """After an executed action: None accepts it, a text is feedback (execution stops)."""
        ...

    def on_end(self, won: bool, last_observation: str) -> str | None:
        """After the last action: None accepts the outcome, a text is feedback (not kept)."""
        ...


class EnvFeedback:
    """Feedback from the environment only (the default): accepts every step and outcome."""

    def on_step(self, index: int, action: str, observation: str) -> str | None:
        return None

    def on_end(self, won: bool, last_observation: str) -> str | None:
        return None


class HumanFeedback:
    """A person at a terminal: each executed step is shown; Enter accepts, a typed line is feedback.

    Args:
        ask: reads one line after showing a prompt (default :func:`input`).
        show: prints a line (default :func:`print`).
    """

    def __init__(self, ask: Callable[[str], str] = input, show: Callable[[str], None] = print):
        self.ask = ask
        self.show = show

    def on_step(self, index: int, action: str, observation: str) -> str | None:
        self.show(f"step {index + 1}: > {action}\n  {observation.strip()}")
        line = self.ask("feedback (Enter = accept)> ").strip()
        return line or None

    def on_end(self, won: bool, last_observation: str) -> str | None:
        self.show("goal reached" if won else "goal NOT reached")
        line = self.ask("feedback on the whole example (Enter = accept)> ").strip()
        return line or None


@dataclass
class Execution:
    """A program run in the real game.

    Attributes:
        trajectory: what was executed (annotations as think steps), up to the failure.
        won: the goal was reached.
        failure: None when won and accepted, else ``{"reason", "step", "action", "observation"}``;
            reasons: "not a candidate", "invalid action", "goal not reached", "human feedback".
        feedback: H, the text given to the LM for revision ("" when none).
    """

    trajectory: Trajectory
    won: bool
    failure: dict | None
    feedback: str = ""


def _valid_list(candidates: Sequence[str]) -> str:
    shown = list(candidates)[:FEEDBACK_CANDIDATES]
    more = len(candidates) - len(shown)
    return ", ".join(shown) + (f" (and {more} more)" if more > 0 else "")


def execute(env: Environment, task_id: str, program: Program, feedback: Feedback | None = None) -> Execution:
    """Run ``program`` in a fresh game of ``task_id`` (think steps for annotations; budget = its length).

    An action not in the state's candidate set is not sent to the engine: the execution stops
    there with feedback naming the valid actions. Stops early, won, when the engine reports
    success before the program ends (the rest is dropped from the trajectory).
    """
    from envs.episode import Episode

    feedback = feedback or EnvFeedback()
    items = program.items()
    episode = Episode(env, task_id, max_steps=max(1, len(items)))
    n_actions = 0
    last_obs = episode.start.observation
    for kind, text in items:
        if episode.done:
            break
        if kind == "think":
            episode.act(text)
            continue
        candidates = episode.candidates()
        if candidates and text not in candidates:
            h = (f"Action {n_actions + 1} '{text}' is not possible in that state. Valid actions there: "
                 f"{_valid_list(candidates)}. The goal was not reached.")
            return Execution(episode.trajectory(), False,
                             {"reason": "not a candidate", "step": n_actions, "action": text,
                              "observation": last_obs}, h)
        result = episode.act(text)
        last_obs = result.observation
        n_actions += 1
        if result.observation.strip() in INVALID_FEEDBACK or (result.info or {}).get("invalid"):
            h = (f"Action {n_actions} '{text}' failed: the game answered '{result.observation.strip()}'. "
                 f"Valid actions there: {_valid_list(candidates)}. The goal was not reached.")
            return Execution(episode.trajectory(), False,
                             {"reason": "invalid action", "step": n_actions - 1, "action": text,
                              "observation": result.observation}, h)
        said = feedback.on_step(n_actions - 1, text, result.observation)
        if said is not None:
            return Execution(episode.trajectory(), False,
                             {"reason": "human feedback", "step": n_actions - 1, "action": text,
                              "observation": result.observation},
                             f"After action {n_actions} '{text}' a person said: {said}")
    won = episode.won
    said = feedback.on_end(won, last_obs)
    if won and said is None:
        return Execution(episode.trajectory(), True, None)
    if not won:
        h = (f"All {n_actions} actions ran, but the goal was not reached. The last observation was: "
             f"'{last_obs.strip()}'. Valid actions then: {_valid_list(episode.candidates())}.")
        if said:
            h += f" A person said: {said}"
        return Execution(episode.trajectory(), False,
                         {"reason": "goal not reached", "step": n_actions, "action": None, "observation": last_obs}, h)
    return Execution(episode.trajectory(), False,
                     {"reason": "human feedback", "step": n_actions, "action": None, "observation": last_obs},
                     f"The goal was reached, but a person said: {said}")


__all__ = ["FEEDBACK_CANDIDATES", "INVALID_FEEDBACK", "EnvFeedback", "Execution", "Feedback", "HumanFeedback",
           "execute"]
