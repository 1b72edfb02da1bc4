"""Versioned expert-trajectory schema, atomic JSONL storage, and decision examples (seed Eq. 5).

A :class:`Trajectory` is one played task: the instruction, the initial observation o0, and every
step in order. A :class:`Step` is either a think step (``kind="think"``, feedback ``OK.``, no
candidates) or an environment step (``kind="env"``) that carries the *full* environment-supplied
candidate set the action was chosen from, saved with the step (seed Sec. 3.2).

Storage is JSON Lines, one trajectory per line (:mod:`cb_io.storage`): :func:`~cb_io.storage.append_jsonl`
makes a record durable before it returns, and a crash can leave at most one torn *final* line,
which the reader reports by line number.

:func:`agent_shell.expert_decisions.decision_examples` (the concept's data, in the agent shell)
turns a trajectory into the decisions of seed Eq. (5).

This module imports no game engine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

from cb_io.storage import MalformedLine, iter_jsonl

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
