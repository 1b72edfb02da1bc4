"""One task played through an :class:`~envs.protocol.Environment`, with think steps and a step budget.

The seed's ReAct loop (Sec. 2.3) lets the agent either think or act. A think step (text starting
with ``think:``) never reaches the engine: its feedback is ``OK.``, but it is still an interaction
step and uses one unit of the step budget (the vocabulary, :data:`~cb_io.records.THINK_PREFIX` and
:data:`~cb_io.records.THINK_FEEDBACK`, is defined with the records). Every step is recorded as a
:class:`~cb_io.records.Step`; environment steps carry the full candidate set of the state they
were taken from, so a finished episode converts losslessly into a :class:`~cb_io.records.Trajectory`.

Every engine call (reset, step, candidates, expert) that raises anything but ValueError (bad input)
is re-raised as :class:`~cb_io.records.EngineError` with a one-line message naming the step, so a
caller that plays many episodes can record the fault and go on. :func:`time_limit` bounds an
episode's wall-clock time the same way (:class:`~cb_io.records.EpisodeTimeout`): ALFWorld's and
TextWorld's engines run in the caller's process with no limit of their own. :func:`play_within`
is the rule of every such caller: play within the limit, else the caller's failure record.
"""

from __future__ import annotations

import contextlib
import importlib
import random
import signal
import threading
from types import FrameType
from typing import Callable, Iterable, Iterator, TypeVar

from cb_io.records import (THINK_FEEDBACK, EngineError, EpisodeTimeout, Step, StepResult, TaskStart, Trajectory,
                           is_think, one_line)
from envs.protocol import Environment

#: The key of an environment step's ``info`` holding the agent's own choice when the expert's action
#: was executed in its place (``Episode(..., expert_mix=beta)``); the step's ``action`` is the one executed.
AGENT_ACTION = "agent_action"


@contextlib.contextmanager
def time_limit(seconds: float | None, what: str = "episode") -> Iterator[None]:
    """Raise :class:`~cb_io.records.EpisodeTimeout` in the ``with`` block once it has run
    ``seconds`` of wall-clock time (None or 0: no limit), and again every second until the block
    is left (a broad ``except`` inside cannot swallow it for good).

    A real-time interval timer (``SIGALRM``) interrupts Python code and blocking waits (sleeps,
    locks, sockets) of the main thread, where both of the scheduler's executors play episodes (a
    Ray actor's methods run on its main thread too). A native call that never returns to Python
    cannot be interrupted in-process. The limit is never raised inside an import: a module
    interrupted half-way would stay broken for the rest of the process (``partially initialized
    module``), so an expiry that finds an import running waits for the next second's tick
    (:func:`import_engines` imports the engines before the clock starts).

    Raises:
        ValueError: a limit asked for off the main thread or without ``SIGALRM`` (Windows).
    """
    if not seconds:
        yield
        return
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        raise ValueError(f"an {what} time limit needs the main thread and SIGALRM (POSIX)")
    armed = True

    def expire(signum, frame):
        if armed and not _importing(frame):
            raise EpisodeTimeout(f"{what} ran past its wall-clock limit of {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds, 1.0)
    try:
        yield
    finally:
        armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _importing(frame: FrameType | None) -> bool:
    """Whether ``frame`` or a caller of it runs the import machinery (a module being imported)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def import_engines(env: object) -> None:
    """Import the game engine's modules an adapter names in ``ENGINE_MODULES`` (a tuple of module
    names; none: nothing), so that an episode's clock (:func:`time_limit`) never starts inside
    their first import."""
    for name in getattr(env, "ENGINE_MODULES", ()):
        importlib.import_module(name)


T = TypeVar("T")


def play_within(seconds: float | None, play: Callable[[], T], on_fault: Callable[[EngineError], T],
                what: str = "episode") -> T:
    """``play()`` within ``seconds`` of wall-clock time (:func:`time_limit`; None or 0: no limit),
    or ``on_fault(err)`` when it raises an :class:`~cb_io.records.EngineError`: an engine fault,
    or the limit passed (:class:`~cb_io.records.EpisodeTimeout`). The one rule of every caller that
    plays many episodes: a faulty or hung episode becomes that caller's failure record (an error
    record, a skipped item) and the caller goes on with the next. Any other exception propagates.

    Raises:
        ValueError: a limit asked for off the main thread (:func:`time_limit`).
    """
    try:
        with time_limit(seconds, what):
            return play()
    except EngineError as err:
        return on_fault(err)


def check_tasks(env: Environment, split: str, task_ids: Iterable[str]) -> list[str]:
    """``task_ids`` (duplicates dropped, order kept) after checking, without starting the engine, that
    ``split`` exists and each id is a task of that split.

    Raises:
        ValueError: one line: an unknown split (the adapter lists the known ones), an unknown id
            (what ids look like, the closest one), or an id of another split (data leakage: a test
            variation collected as train, a valid_unseen game played under ``train``).
    """
    env.tasks(split)
    ids = list(dict.fromkeys(task_ids))
    for task_id in ids:
        _check_split(env, task_id, split)
    return ids


def _check_split(env: Environment, task_id: str, split: str | None) -> str | None:
    """The split of ``task_id`` (None when the adapter cannot tell); ValueError when it is not ``split``."""
    split_of = getattr(env, "split_of", None)
    actual = split_of(task_id) if callable(split_of) else None
    if split is not None and actual is not None and actual != split:
        raise ValueError(f"{env.name} task {task_id!r} belongs to split {actual!r}, not {split!r}: "
                         "refusing to mix splits")
    return actual


class EpisodeOver(RuntimeError):
    """``act`` was called after the episode ended (engine done or budget spent)."""


class Episode:
    """Wraps ``env`` for one task.

    Args:
        env: any adapter implementing the protocol.
        task_id: one of ``env.tasks(split)``.
        max_steps: the step budget (think and env steps together); defaults to the adapter's
            ``default_max_steps`` (ALFWorld 50). Must be >= 1.
        split: the split the caller means to play; the task must belong to it (a task of another
            split is refused: no train game in an evaluation, no test variation in a collection).
        expert: compute the adapter's expert for this episode (expert collection); agents' episodes
            leave it off, so the expert costs nothing and its faults cannot end them.
        expert_mix: DAgger's mixing probability beta (Ross, Gordon and Bagnell 2011, Sec. 3): at each
            environment step, with probability ``expert_mix`` the expert's action is executed instead
            of the one given to :meth:`act` (when the expert answers an action of the state's candidate
            set; otherwise the given one stands), and the given one is kept in the step's ``info``
            under :data:`AGENT_ACTION`. Needs ``expert``. 0: every action is the caller's.
        mix_seed: with ``task_id``, seeds the draws (one per environment step, whether or not it
            substitutes), so the same episode played again draws the same.

    Attributes:
        start: the :class:`TaskStart` of the task.
        steps: the recorded steps, in order.
        split: the task's split (from the adapter's ``split_of``, else ``split``; None if neither);
            recorded in the trajectory's ``meta``.

    Raises:
        ValueError: ``max_steps < 1``, an unknown task, a task of another split than ``split``, or
            ``expert_mix`` outside [0, 1] or given without ``expert``.
        EngineError: the engine failed while starting the task.
    """

    def __init__(self, env: Environment, task_id: str, max_steps: int | None = None, split: str | None = None,
                 expert: bool = False, expert_mix: float = 0.0, mix_seed: int | str = 0):
        if max_steps is None:
            max_steps = getattr(env, "default_max_steps", None)
            if max_steps is None:
                raise ValueError(f"{type(env).__name__} has no default_max_steps: pass max_steps")
        if int(max_steps) < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        if not 0.0 <= expert_mix <= 1.0:
            raise ValueError(f"expert_mix must be a probability in [0, 1], got {expert_mix}")
        if expert_mix and not expert:
            raise ValueError("expert_mix needs the episode's expert: Episode(..., expert=True)")
        actual = _check_split(env, task_id, split)
        self.env = env
        self.task_id = task_id
        self.split = actual if actual is not None else split
        self.expert = bool(expert)
        self.expert_mix = float(expert_mix)
        self._draws = random.Random(f"{task_id}\0{mix_seed}") if expert_mix else None
        self.max_steps = int(max_steps)
        self.steps: list[Step] = []
        self._engine_done = False
        self.won = False
        self.score = 0.0
        self._candidates: list[str] | None = None
        self.start: TaskStart = self._engine(
            "reset", lambda: env.reset(task_id, expert=True) if expert else env.reset(task_id), ValueError)

    def _engine(self, what: str, call, bad_input: type[Exception] | tuple = ()):
        """``call()``; any exception but ``bad_input`` is re-raised as a one-line :class:`EngineError`."""
        try:
            return call()
        except bad_input:
            raise
        except EngineError:  # a time limit (EpisodeTimeout) as it is
            raise
        except Exception as err:
            raise EngineError(f"{self.env.name} engine failed in {what} at step {len(self.steps) + 1} of "
                              f"{self.task_id!r}: {one_line(err)}") from err

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
            self._candidates = list(self._engine("candidates", self.env.candidates))
        return list(self._candidates)

    def expert_action(self) -> str | None:
        """The adapter's expert action in the current state (None when it has none or gave up).

        Raises:
            RuntimeError: the episode was started without ``expert=True``.
        """
        if not self.expert:
            raise RuntimeError(f"the episode of {self.task_id!r} was started without its expert: "
                               "Episode(..., expert=True)")
        return self._engine("expert", self.env.expert_action)

    def think(self, thought: str) -> StepResult:
        """Take a think step: ``thought`` is recorded as it is (with or without the ``think:``
        prefix), the engine is not called, the feedback is ``OK.``, and it spends one unit of the
        budget (``done`` is True only when it spent the last one).

        Raises:
            EpisodeOver: the episode is already done.
            ValueError: ``thought`` is empty.
        """
        self._check_step(thought)
        self.steps.append(Step("think", thought, THINK_FEEDBACK, None, False, self.won, self.score))
        return StepResult(THINK_FEEDBACK, done=self.done, won=self.won, score=self.score)

    def act(self, text: str) -> StepResult:
        """Take one step from text: a think step when ``text`` starts with ``think:``
        (:meth:`think`), else an environment action (with ``expert_mix``, possibly the expert's in
        its place: the step records which). A caller that knows the step's kind (an agent's
        decision) calls :meth:`think` for a thought instead of writing it as text.

        Returns:
            The :class:`StepResult`; for a think step ``observation == "OK."`` and ``done`` is
            True only when the thought spent the last unit of the budget.

        Raises:
            EpisodeOver: the episode is already done.
            ValueError: ``text`` is empty.
            EngineError: the engine failed on this step (nothing is recorded for it).
        """
        if is_think(text):
            return self.think(text)
        self._check_step(text)
        candidates = self.candidates()
        info = {}
        if self._draws is not None and self._draws.random() < self.expert_mix:
            expert = self.expert_action()
            if expert is not None and expert != text and expert in candidates:
                info, text = {AGENT_ACTION: text}, expert
        result = self._engine(f"step {text!r}", lambda: self.env.step(text))
        self._candidates = None
        self._engine_done = bool(result.done)
        self.won = bool(result.won)
        self.score = float(result.score)
        self.steps.append(
            Step("env", text, result.observation, candidates, self._engine_done, self.won, self.score,
                 {**result.info, **info})
        )
        if self.done and not result.done:
            return StepResult(result.observation, done=True, won=result.won, score=result.score, info=result.info)
        return result

    def _check_step(self, text: str) -> None:
        if self.done:
            raise EpisodeOver(f"episode of {self.task_id!r} is over ({len(self.steps)} steps, won={self.won})")
        if not text.strip():
            raise ValueError("an action must be non-empty text")

    def trajectory(self, meta: dict | None = None) -> Trajectory:
        """The episode so far as a :class:`Trajectory` (``meta`` gets ``max_steps`` and ``split`` added)."""
        return Trajectory(
            env=self.env.name,
            task_id=self.start.task_id,
            task_type=self.start.task_type,
            instruction=self.start.instruction,
            observation=self.start.observation,
            steps=list(self.steps),
            won=self.won,
            score=self.score,
            meta={"max_steps": self.max_steps, **({"split": self.split} if self.split else {}), **(meta or {})},
        )
