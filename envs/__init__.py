"""envs: one adapter per benchmark (ALFWorld, ScienceWorld, TextWorld) behind one protocol.

``make_env(name)`` builds an adapter (its engine is imported only then); :class:`Episode` plays one
task with think steps and a step budget; :mod:`envs.trajectory` stores trajectories (through
:mod:`cb_io.storage`, the project's JSONL and atomic files; :mod:`cb_io.paths`: its cache root);
:mod:`envs.collect` collects expert trajectories.

Imports nothing else of this project but :mod:`cb_io`.
"""

from envs.episode import EPISODE_TIMEOUT_S, Episode, EpisodeOver, check_tasks, is_think, play_within, time_limit
from envs.protocol import EngineError, Environment, EpisodeTimeout, SetupError, StepResult, TaskStart, one_line
from envs.registry import ENVIRONMENTS, default_split, make_env
from envs.trajectory import (
    SCHEMA_VERSION,
    Step,
    Trajectory,
    completed_task_ids,
    read_trajectories,
)

__all__ = [
    "ENVIRONMENTS",
    "EPISODE_TIMEOUT_S",
    "SCHEMA_VERSION",
    "EngineError",
    "Environment",
    "Episode",
    "EpisodeOver",
    "EpisodeTimeout",
    "SetupError",
    "Step",
    "StepResult",
    "TaskStart",
    "Trajectory",
    "check_tasks",
    "completed_task_ids",
    "default_split",
    "is_think",
    "make_env",
    "one_line",
    "play_within",
    "read_trajectories",
    "time_limit",
]
