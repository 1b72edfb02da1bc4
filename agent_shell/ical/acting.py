"""Acting with ICAL's memory: retrieved examples replace the fixed per-type demonstrations.

For each episode the top-K examples for its instruction (and initial observation, with
``lambda_text``) are retrieved from the memory and rendered as ReAct demonstrations with
:func:`agent_shell.context.render_demo`: a kept example is a won trajectory whose annotations are
think steps (``> think: Subgoal: ...`` / ``OK.``), so the demonstrations show thoughts, which the
fixed expert demonstrations never do. Examples of the very task being played are left out.

The same examples can be CB-Agent's concept fitting data (:func:`examples_by_type`): they are
won trajectories with candidate sets recorded at every environment step, thoughts included.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent_shell.ical.memory import Example, Lambdas, Memory

if TYPE_CHECKING:
    from cb_io.records import TaskStart

#: Acting retrieves by instruction only by default (the source's evaluation setting).
ACTING_LAMBDAS = Lambdas(instruction=1.0, text=0.0)


class RetrievedDemos:
    """Demonstrations per episode, retrieved from an ICAL memory (duck-typed ``for_task(start)``).

    Args:
        memory: a :class:`Memory` with an embedder.
        k: demonstrations per prompt.
        rendering: the history rendering of the demonstrations (as for the fixed ones).
        lambdas: retrieval weights.
        thoughts: show the examples' annotations as ``think:`` steps (False: their actions and
            observations only, e.g. when the annotations a small backbone wrote are noise the
            actor would copy).

    Attributes:
        retrieved: task id -> [(example id, score)] of every retrieval made (for the records).

    Raises:
        ValueError: an empty memory, or k < 1.
    """

    def __init__(self, memory: Memory, k: int = 2, rendering: str = "raw", lambdas: Lambdas = ACTING_LAMBDAS,
                 thoughts: bool = True):
        if not len(memory):
            raise ValueError(f"the ICAL memory at {memory.folder} holds no examples")
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self.memory = memory
        self.k = k
        self.rendering = rendering
        self.lambdas = lambdas
        self.thoughts = thoughts
        self.retrieved: dict[str, list[tuple[str, float]]] = {}
        self._cache: dict[str, list[str]] = {}

    def for_task(self, start: TaskStart) -> list[str]:
        """The rendered demonstrations for a task (a :class:`cb_io.records.TaskStart`), cached."""
        from agent_shell.context import render_demo

        if start.task_id not in self._cache:
            got = self.memory.retrieve(start.instruction, start.observation, self.k, self.lambdas,
                                       exclude_task_ids=[start.task_id])
            self.retrieved[start.task_id] = [(e.example_id, round(s, 5)) for e, s in got]
            t = [e.trajectory for e, _ in got]
            self._cache[start.task_id] = [
                render_demo(x.instruction, x.observation, [s for s in x.steps if self.thoughts or s.kind != "think"],
                            self.rendering) for x in t]
        return list(self._cache[start.task_id])


def examples_by_type(memory: Memory) -> dict[str, list[Example]]:
    """The memory's examples grouped by task type (memory order)."""
    out: dict[str, list[Example]] = {}
    for e in memory.examples:
        out.setdefault(e.task_type, []).append(e)
    return out
