"""One task played through an :class:`~envs.protocol.Environment`, with think steps and a step budget.

The seed's ReAct loop (Sec. 2.3) lets the agent either think or act. A think step (text starting
with ``think:``) never reaches the engine: its feedback is ``OK.``, but it is still an interaction
step and uses one unit of the step budget. Every step is recorded as a
:class:`~envs.trajectory.Step`; environment steps carry the full candidate set of the state they
were taken from, so a finished episode converts losslessly into a :class:`~envs.trajectory.Trajectory`.
"""

from __future__ import annotations

from envs.protocol import Environment, StepResult, TaskStart
from envs.trajectory import Step, Trajectory

THINK_PREFIX = "think:"
THINK_FEEDBACK = "OK."


def is_think(text: str) -> bool:
    """True when ``text`` is a think step (``think:`` prefix, case-insensitive, leading blanks ignored)."""
    return text.lstrip().lower().startswith(THINK_PREFIX)


class EpisodeOver(RuntimeError):
    """``act`` was called after the episode ended (engine done or budget spent)."""


class Episode:
    """Wraps ``env`` for one task.

    Args:
        env: any adapter implementing the protocol.
        task_id: one of ``env.tasks(split)``.
        max_steps: the step budget (think and env steps together); defaults to the adapter's
            ``default_max_steps`` (ALFWorld 50). Must be >= 1.

    Attributes:
        start: the :class:`TaskStart` of the task.
        steps: the recorded steps, in order.

    Raises:
        ValueError: ``max_steps < 1`` or an unknown task (from the adapter).
    """

    def __init__(self, env: Environment, task_id: str, max_steps: int | None = None):
        if max_steps is None:
            max_steps = getattr(env, "default_max_steps", None)
            if max_steps is None:
                raise ValueError(f"{type(env).__name__} has no default_max_steps: pass max_steps")
        if int(max_steps) < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        self.env = env
        self.task_id = task_id
        self.max_steps = int(max_steps)
        self.steps: list[Step] = []
        self._engine_done = False
        self.won = False
        self.score = 0.0
        self._candidates: list[str] | None = None
        self.start: TaskStart = env.reset(task_id)

    @property
    def budget_left(self) -> int:
        return self.max_steps - len(self.steps)

    @property
    def done(self) -> bool:
        """The engine ended the episode or the step budget is spent."""
        return self._engine_done or self.budget_left <= 0

    def candidates(self) -> list[str]:
        """The environment-supplied candidate set in the current state (cached until the next env step)."""
        if self._candidates is None:
            self._candidates = list(self.env.candidates())
        return list(self._candidates)

    def expert_action(self) -> str | None:
        """The adapter's expert action in the current state (None when it has none)."""
        return self.env.expert_action()

    def act(self, text: str) -> StepResult:
        """Take one step: a think step (``think: ...``) or an environment action.

        Returns:
            The :class:`StepResult`; for a think step ``observation == "OK."`` and ``done`` is
            True only when the thought spent the last unit of the budget.

        Raises:
            EpisodeOver: the episode is already done.
            ValueError: ``text`` is empty.
        """
        if self.done:
            raise EpisodeOver(f"episode of {self.task_id!r} is over ({len(self.steps)} steps, won={self.won})")
        if not text.strip():
            raise ValueError("an action must be non-empty text")
        if is_think(text):
            self.steps.append(Step("think", text, THINK_FEEDBACK, None, False, self.won, self.score))
            return StepResult(THINK_FEEDBACK, done=self.done, won=self.won, score=self.score)
        candidates = self.candidates()
        result = self.env.step(text)
        self._candidates = None
        self._engine_done = bool(result.done)
        self.won = bool(result.won)
        self.score = float(result.score)
        self.steps.append(
            Step("env", text, result.observation, candidates, self._engine_done, self.won, self.score, dict(result.info))
        )
        if self.done and not result.done:
            return StepResult(result.observation, done=True, won=result.won, score=result.score, info=result.info)
        return result

    def trajectory(self, meta: dict | None = None) -> Trajectory:
        """The episode so far as a :class:`Trajectory` (``meta`` gets ``max_steps`` added)."""
        return Trajectory(
            env=self.env.name,
            task_id=self.start.task_id,
            task_type=self.start.task_type,
            instruction=self.start.instruction,
            observation=self.start.observation,
            steps=list(self.steps),
            won=self.won,
            score=self.score,
            meta={"max_steps": self.max_steps, **(meta or {})},
        )
