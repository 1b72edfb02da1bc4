"""The one environment protocol every benchmark adapter implements.

An episode is: ``reset(task_id)`` -> :class:`TaskStart`, then ``step(action)`` -> :class:`StepResult`
until ``done`` or the step budget is spent. ``candidates()`` is the environment-supplied candidate
set (ALFWorld's admissible commands, ScienceWorld's valid action-object combinations, TextWorld's
admissible commands) in the current state. Think steps are handled by :class:`envs.episode.Episode`
and never reach an adapter (seed Sec. 2.3).

Success is the benchmark's own definition (``won`` for ALFWorld and TextWorld, score 100 for
ScienceWorld), never ``done``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class TaskStart:
    """What the agent sees when a task begins.

    Attributes:
        task_id: the adapter's stable name of the task (a game path, a task/variation pair).
        task_type: the task family a concept is fitted for (ALFWorld: one of six types).
        instruction: the goal in words ("Your task is to: put a clean mug in coffeemachine.").
        observation: the initial observation o0 (without the instruction where the engine
            lets us separate them).
    """

    task_id: str
    task_type: str
    instruction: str
    observation: str


@dataclass(frozen=True)
class StepResult:
    """The engine's answer to one environment action.

    Attributes:
        observation: the feedback text.
        done: the episode is over (won, lost, or the engine stopped it).
        won: the benchmark's success criterion is met.
        score: the engine's score (ScienceWorld: 0..100, -100 after a wrong ``focus on``).
        info: adapter-specific extras (JSON-serialisable).
    """

    observation: str
    done: bool
    won: bool
    score: float = 0.0
    info: dict = field(default_factory=dict)


@runtime_checkable
class Environment(Protocol):
    """A text benchmark, one task at a time. Adapters are not thread-safe."""

    name: str  # "alfworld", "scienceworld", "textworld"

    def tasks(self, split: str) -> list[str]:
        """Task ids of a split (e.g. "train", "valid_unseen"); raises ValueError for an unknown split."""
        ...

    def reset(self, task_id: str) -> TaskStart:
        """Start ``task_id``; raises ValueError for an unknown task."""
        ...

    def step(self, action: str) -> StepResult:
        """Execute one environment action (never a think step)."""
        ...

    def candidates(self) -> list[str]:
        """The environment-supplied candidate actions in the current state (may be empty)."""
        ...

    def expert_action(self) -> str | None:
        """The expert's next action in the current state, or None when the adapter has no expert."""
        ...

    def close(self) -> None:
        """Release the engine (processes, JVMs, files)."""
        ...
