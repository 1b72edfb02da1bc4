"""envs: one adapter per benchmark (ALFWorld, ScienceWorld, TextWorld) behind one protocol.

``make_env(name)`` builds an adapter (its engine is imported only then); :class:`Episode` plays one
task with think steps and a step budget; :mod:`envs.collect` collects expert trajectories.

The games are implemented on the records of :mod:`cb_io.records` (task start, step result, step,
trajectory, the think vocabulary and the faults of a game), which the agents read without importing
this package; their files go through :mod:`cb_io.storage` (cache root: :mod:`cb_io.paths`).
Imports nothing else of this project but :mod:`cb_io`.
"""

from cb_io.records import EPISODE_TIMEOUT_S
from envs.episode import Episode, EpisodeOver, check_tasks, play_within, time_limit
from envs.protocol import Environment
from envs.registry import ENVIRONMENTS, default_split, make_env

__all__ = [
    "ENVIRONMENTS",
    "EPISODE_TIMEOUT_S",
    "Environment",
    "Episode",
    "EpisodeOver",
    "check_tasks",
    "default_split",
    "make_env",
    "play_within",
    "time_limit",
]
