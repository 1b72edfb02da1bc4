"""envs: one adapter per benchmark (ALFWorld, ScienceWorld, TextWorld) behind one protocol.

``make_env(name)`` builds an adapter (its engine is imported only then); :class:`Episode` plays one
task with think steps and a step budget; :mod:`envs.trajectory` stores trajectories (:mod:`envs.storage`:
the project's JSONL and atomic files; :mod:`envs.paths`: its cache root); :mod:`envs.collect`
collects expert trajectories.

Imports nothing else of this project.
"""

from envs.episode import Episode, EpisodeOver, check_tasks, is_think
from envs.protocol import EngineError, Environment, StepResult, TaskStart, one_line
from envs.registry import ENVIRONMENTS, make_env
from envs.storage import append_jsonl
from envs.trajectory import (
    SCHEMA_VERSION,
    Step,
    Trajectory,
    completed_task_ids,
    read_trajectories,
)

__all__ = [
    "ENVIRONMENTS",
    "SCHEMA_VERSION",
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
    "is_think",
    "make_env",
    "one_line",
    "read_trajectories",
]
