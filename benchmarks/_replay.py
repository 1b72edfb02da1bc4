"""What the replaying benchmarks share (``routing_speed.py``, ``sampling_speed.py``): the recorded
episodes of a results file, demonstrations for them, a recorded trajectory's task start, and
the figures printed and written as JSON. Not a benchmark itself (no ``main``)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path


def recorded_episodes(results: str, episodes: int, tiny: bool) -> tuple[list[dict], list, list]:
    """The first ``episodes`` records of ``results`` (a ``cb-agent run`` JSONL), their first trials'
    trajectories, and rendered demonstrations: the train split's expert trajectories of the
    records' task types, or with ``tiny`` the recorded trajectories themselves (no environment is
    started). Raises SystemExit on a file without records."""
    from agent_shell.demos import expert_demos, rendered_demos
    from agent_shell.results import read_results
    from cb_io.records import Trajectory
    from envs import make_env

    records = read_results(results)[:episodes]
    if not records:
        raise SystemExit(f"no episode records in {results}")
    trajectories = [Trajectory.from_record(rec["trials"][0]["trajectory"]) for rec in records]
    if tiny:  # won or not, each recorded trajectory serves as a demonstration of its type
        return records, trajectories, rendered_demos([replace(t, won=True) for t in trajectories])
    env = make_env(records[0]["env"])
    try:
        demos = expert_demos(env, int(records[0].get("demos_per_type", 2)), split="train",
                             task_types={rec["task_type"] for rec in records})
    finally:
        env.close()
    return records, trajectories, rendered_demos(demos)


def task_start(traj):
    """The :class:`cb_io.records.TaskStart` of a recorded trajectory."""
    from cb_io.records import TaskStart

    return TaskStart(traj.task_id, traj.task_type, traj.instruction, traj.observation)


def emit(result: dict, out: str | None) -> int:
    """Print ``result`` as JSON, write it to ``out`` too if given; 0 (the exit status)."""
    text = json.dumps(result, indent=1)
    print(text)
    if out:
        Path(out).write_text(text)
    return 0
