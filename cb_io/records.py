"""The records of a played task, beneath both the games (:mod:`envs`) and the agents (:mod:`agent_shell`).

What crosses between a game and whoever plays it is plain data, defined here once:

* the ReAct think vocabulary (seed Sec. 2.3): :data:`THINK_PREFIX` marks a think step in an
  agent's text and in the transcript, :data:`THINK_FEEDBACK` is its feedback, :func:`is_think`
  tells one;
* :class:`TaskStart` (what a task shows when it begins) and :class:`StepResult` (the engine's
  answer to one environment action);
* :class:`Step` and :class:`Trajectory`, the versioned schema of a played task
  (:data:`SCHEMA_VERSION`), stored as JSON Lines, one trajectory per line, and read back with
  :func:`read_trajectories` and :func:`completed_task_ids`;
* the faults a caller of a game sees and records: :class:`EngineError` (with
  :class:`EpisodeTimeout`), :class:`SetupError`, and :func:`one_line`, the one-line message an
  error record keeps.

A :class:`Step` is either a think step (``kind="think"``, feedback ``OK.``, no candidates) or an
environment step (``kind="env"``) that carries the *full* environment-supplied candidate set the
action was chosen from, saved with the step (seed Sec. 3.2). Storage goes through
:mod:`cb_io.storage`: :func:`~cb_io.storage.append_jsonl` makes a record durable before it
returns, and a crash can leave at most one torn *final* line, which the reader reports by line
number.

The games (:mod:`envs`) implement their protocol (:class:`envs.protocol.Environment`) and the
episode runner (:class:`envs.episode.Episode`) on these records; the agents, the renderings, the
concept's data (:func:`agent_shell.expert_decisions.decision_examples`, seed Eq. 5), the results
and the studies read them without importing the games.

Why in :mod:`cb_io`: the records are what the project's files hold (a trajectory file is these
records, an episode's results line carries its trajectory and names its fault), and they must sit
beneath both the games and the agents; :mod:`cb_io` already sits beneath every layer and imports
nothing else of the project, and :mod:`cb_core` is the numerical core (no records, no I/O), so
the records need no layer of their own. Imports :mod:`cb_io.storage` and the standard library only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

from cb_io.storage import MalformedLine, iter_jsonl

# --------------------------------------------------------------------------------------------
# the think vocabulary

#: Prefix that marks a think step (seed Sec. 2.3), in an agent's text and in the transcript; the
#: one definition of the project (the games' episodes, the renderings and reply parsing use it).
THINK_PREFIX = "think:"
#: Feedback of a think step; it never reaches the engine.
THINK_FEEDBACK = "OK."


def is_think(text: str) -> bool:
    """True when ``text`` is a think step (``think:`` prefix, case-insensitive, leading blanks ignored)."""
    return text.lstrip().lower().startswith(THINK_PREFIX)


# --------------------------------------------------------------------------------------------
# a task's start, a step's result, and the faults of a game


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


#: Default wall-clock limit of one episode, seconds (``--episode-timeout`` of every command that
#: plays episodes): far above a slow CPU backbone's 50-step ALFWorld episode, far below a night.
EPISODE_TIMEOUT_S = 3600.0


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


# --------------------------------------------------------------------------------------------
# steps and trajectories

#: Bumped whenever a field changes meaning or is removed; readers reject newer versions.
SCHEMA_VERSION = 1

StepKind = Literal["think", "env"]


@dataclass(frozen=True)
class Step:
    """One interaction step.

    Attributes:
        kind: ``"think"`` (never reached the engine; feedback ``OK.``) or ``"env"``.
        action: the text the agent emitted (for think steps including the ``think:`` prefix).
        observation: the feedback (``"OK."`` for think steps).
        candidates: for env steps, the full environment-supplied candidate set in the state the
            action was taken from (ordered as the engine gave it); ``None`` for think steps.
        done, won, score: the episode's status after this step.
        info: adapter extras (JSON-serialisable), e.g. ScienceWorld's recorded ambiguity answer.
    """

    kind: StepKind
    action: str
    observation: str
    candidates: list[str] | None
    done: bool
    won: bool
    score: float
    info: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in ("think", "env"):
            raise ValueError(f"Step.kind must be 'think' or 'env', got {self.kind!r}")
        if self.kind == "think" and self.candidates is not None:
            raise ValueError(f"think step {self.action!r} must not carry candidates")
        if self.kind == "env" and self.candidates is None:
            raise ValueError(f"env step {self.action!r} must carry its candidate set")


@dataclass(frozen=True)
class Trajectory:
    """One played task.

    Attributes:
        env: the benchmark name ("alfworld", "scienceworld", "textworld").
        task_id: the adapter's task id.
        task_type: the task family (ALFWorld type prefix, ScienceWorld task name, TextWorld kind).
        instruction: the goal text.
        observation: the initial observation o0.
        steps: every step in order, thoughts included.
        won: the benchmark's success (ALFWorld/TextWorld ``won``, ScienceWorld score 100).
        score: the final engine score.
        meta: provenance (expert name, step limit, engine version, ...), JSON-serialisable.
    """

    env: str
    task_id: str
    task_type: str
    instruction: str
    observation: str
    steps: list[Step]
    won: bool
    score: float
    meta: dict = field(default_factory=dict)

    @property
    def n_env_steps(self) -> int:
        return sum(1 for s in self.steps if s.kind == "env")

    def to_record(self) -> dict[str, Any]:
        """The JSON object stored on one line (with ``schema_version``)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "env": self.env,
            "task_id": self.task_id,
            "task_type": self.task_type,
            "instruction": self.instruction,
            "observation": self.observation,
            "steps": [
                {
                    "kind": s.kind,
                    "action": s.action,
                    "observation": s.observation,
                    "candidates": s.candidates,
                    "done": s.done,
                    "won": s.won,
                    "score": s.score,
                    "info": s.info,
                }
                for s in self.steps
            ],
            "won": self.won,
            "score": self.score,
            "meta": self.meta,
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> "Trajectory":
        """Inverse of :meth:`to_record`.

        Raises:
            ValueError: missing fields, a wrong type, or a schema version newer than this code.
        """
        if not isinstance(record, dict):
            raise ValueError(f"a trajectory record must be a JSON object, got {type(record).__name__}")
        version = record.get("schema_version")
        if not isinstance(version, int) or not 1 <= version <= SCHEMA_VERSION:
            raise ValueError(f"unsupported trajectory schema_version {version!r} (this code reads 1..{SCHEMA_VERSION})")
        try:
            steps = [
                Step(
                    kind=s["kind"],
                    action=_str(s["action"], "action"),
                    observation=_str(s["observation"], "observation"),
                    candidates=None if s["candidates"] is None else [_str(c, "candidate") for c in s["candidates"]],
                    done=bool(s["done"]),
                    won=bool(s["won"]),
                    score=float(s["score"]),
                    info=dict(s.get("info") or {}),
                )
                for s in record["steps"]
            ]
            return cls(
                env=_str(record["env"], "env"),
                task_id=_str(record["task_id"], "task_id"),
                task_type=_str(record["task_type"], "task_type"),
                instruction=_str(record["instruction"], "instruction"),
                observation=_str(record["observation"], "observation"),
                steps=steps,
                won=bool(record["won"]),
                score=float(record["score"]),
                meta=dict(record.get("meta") or {}),
            )
        except KeyError as err:
            raise ValueError(f"trajectory record lacks field {err.args[0]!r}") from None
        except TypeError as err:
            raise ValueError(f"malformed trajectory record: {err}") from None


def _str(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {type(value).__name__}")
    return value


# --------------------------------------------------------------------------------------------
# JSONL storage (:mod:`cb_io.storage`)


def read_trajectories(
    path: str | os.PathLike,
    on_error: Literal["raise", "skip"] = "raise",
    report: Callable[[MalformedLine], None] | None = None,
) -> list[Trajectory]:
    """Read every trajectory of a JSONL file (blank lines are ignored).

    Args:
        on_error: ``"raise"`` (default) raises on the first malformed or truncated line;
            ``"skip"`` leaves it out but still reports it through ``report`` (default: a
            ``warnings.warn`` naming the line), so nothing is dropped silently.

    Raises:
        FileNotFoundError: no such file.
        ValueError: ``"path:LINE: why"`` for a malformed line when ``on_error="raise"``.
    """
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    out: list[Trajectory] = []
    for number, traj, err in iter_jsonl(path, Trajectory.from_record):
        if err is None:
            out.append(traj)
            continue
        if on_error == "raise":
            raise ValueError(f"{path}:{number}: malformed trajectory line: {err}")
        if report is None:
            import warnings

            warnings.warn(f"{path}:{number}: skipped malformed trajectory line: {err}", stacklevel=2)
        else:
            report(MalformedLine(number, err))
    return out


def completed_task_ids(path: str | os.PathLike) -> set[str]:
    """Task ids already stored in ``path`` (empty when the file does not exist), for resuming.

    Malformed lines are skipped with a warning naming their line number (the task is redone).
    """
    if not Path(path).exists():
        return set()
    return {t.task_id for t in read_trajectories(path, on_error="skip")}
