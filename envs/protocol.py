"""The one environment protocol every benchmark adapter implements.

An episode is: ``reset(task_id)`` -> :class:`TaskStart`, then ``step(action)`` -> :class:`StepResult`
until ``done`` or the step budget is spent. ``candidates()`` is the environment-supplied candidate
set (ALFWorld's admissible commands, ScienceWorld's valid action-object combinations, TextWorld's
admissible commands) in the current state. Think steps are handled by :class:`envs.episode.Episode`
and never reach an adapter (seed Sec. 2.3).

Success is the benchmark's own definition (``won`` for ALFWorld and TextWorld, score 100 for
ScienceWorld), never ``done``.

The expert is computed only where it is used: ``reset(task_id, expert=True)`` (expert collection)
turns it on for that episode; an agent's episode (``expert=False``) never runs it, so an expert's
own faults (ALFWorld's handcoded expert gives up after 200 steps) cannot end an agent's episode.

One input is one command: an input that the engine would split into several commands (TextWorld's
``go south then go east``) is answered as an invalid command and never reaches the engine, so one
step never spends one unit of budget on two engine commands and the candidate set stays the
engine's (see each adapter's docstring for its grammar).

Task ids, splits and task types can be checked without starting the engine (``tasks``,
``split_of``, ``task_type_of``); bad ones raise ValueError with a one-line message naming the id and
what is valid. Engine failures inside an episode surface as :class:`EngineError`.
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


class EngineError(RuntimeError):
    """A third-party engine (simulator, interpreter, JVM) failed inside an episode.

    The message is one line (the engine's own first line, e.g. a Java exception's class and
    message, never its stack trace); the original exception is ``__cause__``. Callers that play many
    episodes record it and go on (``cb-agent run`` writes an error episode, ``collect`` a failed task).
    """


class SetupError(FileNotFoundError):
    """An environment cannot start where it is installed: what it needs (its game files, an engine
    program) is not found. The message is one line that says what to set; the command line prints it
    as that one line (no traceback)."""


class EpisodeTimeout(EngineError):
    """An episode ran past its wall-clock limit (:func:`envs.episode.time_limit`): an engine step
    that never returns, or an episode far slower than any other; recorded like an engine fault."""


def one_line(err: BaseException, limit: int = 300) -> str:
    """``"<Type>: <message>"`` of ``err`` on one line: stack-trace lines (``at ...``, ``File ...``) and
    blank lines dropped, the rest joined, cut at ``limit`` characters."""
    kept = []
    for raw in str(err).splitlines():
        line = raw.strip(" \t:")
        if line and not line.startswith(("at ", "File ", "Traceback", "^")):
            kept.append(line)
    text = " ".join(kept) or "(no message)"
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return text if isinstance(err, EngineError) else f"{type(err).__name__}: {text}"


@runtime_checkable
class Environment(Protocol):
    """A text benchmark, one task at a time. Adapters are not thread-safe."""

    name: str  # "alfworld", "scienceworld", "textworld"
    splits: tuple[str, ...]  # the split names the adapter knows (ALFWorld: those present on disk)

    def tasks(self, split: str) -> list[str]:
        """Task ids of a split (e.g. "train", "valid_unseen"); raises ValueError for an unknown split."""
        ...

    def split_of(self, task_id: str) -> str:
        """The split that holds ``task_id``, without starting the engine; raises ValueError (one line:
        the id and what is valid) for an id of no split."""
        ...

    def task_type_of(self, task_id: str) -> str:
        """The task type of ``task_id``, without starting the engine; raises ValueError like ``split_of``."""
        ...

    def reset(self, task_id: str, expert: bool = False) -> TaskStart:
        """Start ``task_id``; raises ValueError for an unknown task. ``expert=True`` computes the
        adapter's expert for this episode (else ``expert_action()`` is None and the expert costs nothing)."""
        ...

    def step(self, action: str) -> StepResult:
        """Execute one environment action (never a think step): exactly one engine command, or none
        when ``action`` chains several (answered as an invalid command, ``info["chained"]``)."""
        ...

    def candidates(self) -> list[str]:
        """The environment-supplied candidate actions in the current state (may be empty)."""
        ...

    def expert_action(self) -> str | None:
        """The expert's next action in the current state, or None when the adapter has no expert,
        the episode was reset without it, or the expert gave up."""
        ...

    def close(self) -> None:
        """Release the engine (processes, JVMs, files)."""
        ...
