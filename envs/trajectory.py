"""Versioned expert-trajectory schema, atomic JSONL storage, and decision examples (seed Eq. 5).

A :class:`Trajectory` is one played task: the instruction, the initial observation o0, and every
step in order. A :class:`Step` is either a think step (``kind="think"``, feedback ``OK.``, no
candidates) or an environment step (``kind="env"``) that carries the *full* environment-supplied
candidate set the action was chosen from, saved with the step (seed Sec. 3.2).

Storage is JSON Lines, one trajectory per line (:mod:`envs.storage`): :func:`~envs.storage.append_jsonl`
makes a record durable before it returns, and a crash can leave at most one torn *final* line,
which the reader reports by line number.

:func:`decision_examples` turns a trajectory into the decisions of seed Eq. (5): one example per
environment step, whose context is built only from what precedes the action.

This module imports no game engine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Sequence

from envs.storage import MalformedLine, append_jsonl, iter_jsonl  # noqa: F401 (append_jsonl: re-exported by envs)

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


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {type(value).__name__}")
    return value


# --------------------------------------------------------------------------------------------
# JSONL storage (:mod:`envs.storage`)


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


# --------------------------------------------------------------------------------------------
# Decision examples (seed Eq. 5)


@dataclass(frozen=True)
class DecisionExample:
    """One expert decision: choose ``candidates[expert_index]`` after ``history``.

    Attributes:
        task_id, task_type, instruction, observation: from the trajectory (o0 = observation).
        history: the steps strictly before this action (thoughts included); the context of seed
            Eq. (5) is built only from these, never from the action's own feedback.
        candidates: the (filtered) candidate set A_t, order preserved.
        expert_index: index of the expert action a_t in ``candidates``.
        step_index: position of the action in ``trajectory.steps``.
    """

    task_id: str
    task_type: str
    instruction: str
    observation: str
    history: tuple[Step, ...]
    candidates: list[str]
    expert_index: int
    step_index: int

    @property
    def expert_action(self) -> str:
        return self.candidates[self.expert_index]


def drop_actions(actions: Iterable[str]) -> Callable[[Sequence[str]], list[str]]:
    """A candidate filter that removes exact ``actions`` (e.g. ALFWorld's look/inventory/help)."""
    banned = frozenset(actions)

    def candidate_filter(candidates: Sequence[str]) -> list[str]:
        return [c for c in candidates if c not in banned]

    return candidate_filter


def decision_examples(
    trajectory: Trajectory,
    candidate_filter: Callable[[Sequence[str]], list[str]] | None = None,
    skip_expert_appended: bool = False,
) -> tuple[list[DecisionExample], int]:
    """One decision example per environment step of ``trajectory`` (seed Eq. 5).

    An expert action that the optional ``candidate_filter`` removed from its set (ALFWorld's
    expert ``look`` steps when look/inventory/help are filtered) yields no example and is counted
    in ``n_skipped``; its step still appears in later examples' histories. With
    ``skip_expert_appended`` a step whose expert action the collector had to append to an
    incomplete engine set (ScienceWorld, ``info["expert_appended"]``) is skipped and counted too.

    Returns:
        (examples, n_skipped).

    Raises:
        ValueError: an env step whose action is not in its saved (unfiltered) candidate set,
            naming the trajectory and the step; a candidate set with duplicates that would make
            ``expert_index`` ambiguous is deduplicated (first occurrence kept) instead.
    """
    examples: list[DecisionExample] = []
    skipped = 0
    for i, step in enumerate(trajectory.steps):
        if step.kind != "env":
            continue
        assert step.candidates is not None
        if step.action not in step.candidates:
            raise ValueError(
                f"trajectory {trajectory.task_id!r} ({trajectory.env}), step {i}: expert action "
                f"{step.action!r} is not in its saved candidate set of {len(step.candidates)}"
            )
        candidates = list(dict.fromkeys(step.candidates))
        if candidate_filter is not None:
            candidates = list(dict.fromkeys(candidate_filter(candidates)))
        if step.action not in candidates or (skip_expert_appended and step.info.get("expert_appended")):
            skipped += 1
            continue
        examples.append(
            DecisionExample(
                task_id=trajectory.task_id,
                task_type=trajectory.task_type,
                instruction=trajectory.instruction,
                observation=trajectory.observation,
                history=tuple(trajectory.steps[:i]),
                candidates=candidates,
                expert_index=candidates.index(step.action),
                step_index=i,
            )
        )
    return examples, skipped
