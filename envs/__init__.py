"""envs: one adapter per benchmark (ALFWorld, ScienceWorld, TextWorld) behind one protocol.

``make_env(name)`` builds an adapter (its engine is imported only then); :class:`Episode` plays one
task with think steps and a step budget; :mod:`envs.trajectory` stores expert trajectories and
turns them into decision examples; :mod:`envs.collect` collects expert trajectories.

Imports nothing else of this project.
"""

from envs.episode import Episode, EpisodeOver, check_tasks, is_think
from envs.protocol import EngineError, Environment, StepResult, TaskStart, one_line
from envs.registry import ENVIRONMENTS, make_env
from envs.trajectory import (
    SCHEMA_VERSION,
    DecisionExample,
    Step,
    Trajectory,
    append_jsonl,
    completed_task_ids,
    decision_examples,
    drop_actions,
    read_trajectories,
)

__all__ = [
    "ENVIRONMENTS",
    "SCHEMA_VERSION",
    "DecisionExample",
    "EngineError",
    "Environment",
    "Episode",
    "EpisodeOver",
    "Step",
    "StepResult",
    "TaskStart",
    "Trajectory",
    "append_jsonl",
    "check_tasks",
    "completed_task_ids",
    "decision_examples",
    "drop_actions",
    "is_think",
    "make_env",
    "one_line",
    "read_trajectories",
]
