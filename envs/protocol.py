"""The one environment protocol every benchmark adapter implements, on the records of
:mod:`cb_io.records`.

An episode is: ``reset(task_id)`` -> :class:`~cb_io.records.TaskStart`, then ``step(action)`` ->
:class:`~cb_io.records.StepResult` until ``done`` or the step budget is spent. ``candidates()`` is
the environment-supplied candidate set (ALFWorld's admissible commands, ScienceWorld's valid
action-object combinations, TextWorld's admissible commands) in the current state. Think steps
are handled by :class:`envs.episode.Episode` and never reach an adapter (seed Sec. 2.3).

Success is the benchmark's own definition (``won`` for ALFWorld and TextWorld, score 100 for
ScienceWorld), never ``done``.

The expert is computed only where it is used: ``reset(task_id, expert=True)`` (expert collection)
turns it on for that episode; an agent's episode (``expert=False``) never runs it, so an expert's
own faults (ALFWorld's handcoded expert gives up after 200 steps) cannot end an agent's episode.
An adapter whose class attribute ``expert_labels_any_state`` is True (absent: False) answers ``expert_action()`` from any state the
episode reaches, off the expert's own path too (ALFWorld's handcoded expert runs along whatever is
played; TextWorld's winning policy is computed from the current state): an agent's episode replayed
with the expert on is labelled step by step (:func:`envs.collect.expert_answers`, the relabelled
rounds of ``cb-agent improve --labels expert``). An adapter without it (ScienceWorld's gold path)
answers only along its own path.

One input is one command: an input that the engine would split into several commands (TextWorld's
``go south then go east``) is answered as an invalid command and never reaches the engine, so one
step never spends one unit of budget on two engine commands and the candidate set stays the
engine's (see each adapter's docstring for its grammar).

Task ids, splits and task types can be checked without starting the engine (``tasks``,
``split_of``, ``task_type_of``); bad ones raise ValueError with a one-line message naming the id and
what is valid. Engine failures inside an episode surface as :class:`~cb_io.records.EngineError`, an
environment that cannot start as :class:`~cb_io.records.SetupError`.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from cb_io.records import StepResult, TaskStart


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
