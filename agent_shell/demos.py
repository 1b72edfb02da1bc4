"""Expert demonstrations: won expert trajectories per task type, collected once into the cache.

The same trajectories serve as ReAct demonstrations (rendered with
:func:`agent_shell.context.render_demo`) and as CB-Agent's fitting data (seed main ALFWorld
table: two per task type from the training split). Collection walks each type's training
tasks in sorted order and stops once ``per_type`` of them are won (ALFWorld's handcoded expert
can lose pick_two games), storing every played trajectory in
``<cache>/expert/<env>/<split>.jsonl`` so the next run plays nothing.
"""

from __future__ import annotations

import os
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Callable, Collection, Sequence

from agent_shell.context import render_demo
from cb_io.paths import cache_dir
from cb_io.records import Trajectory
from envs.protocol import Environment


def tasks_by_type(env: Environment, split: str) -> dict[str, list[str]]:
    """Task ids of ``split`` grouped by task type, each list sorted.

    Needs the adapter's ``task_type_of(task_id)``; raises ValueError if it has none.
    """
    type_of = getattr(env, "task_type_of", None)
    if type_of is None:
        raise ValueError(f"{type(env).__name__} cannot tell a task's type before reset "
                         "(no task_type_of); pass explicit task ids")
    groups: dict[str, list[str]] = defaultdict(list)
    for tid in sorted(env.tasks(split)):
        groups[type_of(tid)].append(tid)
    return dict(sorted(groups.items()))


def expert_demos(env: Environment, per_type: int, split: str = "train", path: str | os.PathLike | None = None,
                 max_steps: int | None = None, max_tries_per_type: int | None = None,
                 task_types: Collection[str] | None = None,
                 on_task: Callable[[str], None] | None = None,
                 time_limit: float | None = None) -> list[Trajectory]:
    """``per_type`` won expert trajectories of every task type of ``split`` (fewer if the expert
    keeps losing: at most ``max_tries_per_type`` tasks are played per type, default
    ``max(10, 2 * per_type)``), or only of ``task_types`` when given. A task whose episode runs
    past ``time_limit`` seconds (None: no limit) or whose engine fails counts as one the expert lost.

    Returns the chosen trajectories, grouped by type in sorted order. Raises ValueError for
    ``per_type < 1``.
    """
    from cb_io.records import read_trajectories
    from cb_io.storage import repair_jsonl
    from envs.collect import collect_expert_trajectories

    if per_type < 1:
        raise ValueError(f"per_type must be >= 1, got {per_type}")
    path = Path(path) if path is not None else cache_dir("expert", env.name) / f"{split}.jsonl"
    for line in repair_jsonl(path):  # an interrupted collection's torn line: aside, not warned about forever
        warnings.warn(f"{path}: line {line.line_number} ({line.error}) moved to {path}.torn", stacklevel=2)
    stored = {t.task_id: t for t in read_trajectories(path, on_error="skip")} if path.exists() else {}
    chosen: list[Trajectory] = []
    for task_type, ids in tasks_by_type(env, split).items():
        if task_types is not None and task_type not in task_types:
            continue
        won: list[Trajectory] = []
        for tid in ids[:max_tries_per_type if max_tries_per_type is not None else max(10, 2 * per_type)]:
            if len(won) == per_type:
                break
            if tid not in stored:
                if on_task is not None:
                    on_task(tid)
                summary = collect_expert_trajectories(
                    env, [tid], path, resume=True, max_steps=max_steps, split=split, time_limit=time_limit,
                    on_task=lambda t_id, traj, _summary: traj is not None and stored.update({t_id: traj}))
                for failed, why in summary.failed.items():
                    warnings.warn(f"expert trajectory {failed} not collected ({why}); the next task of its type "
                                  "is tried", stacklevel=2)
                if tid in summary.skipped:  # another process stored it after this one read the file
                    stored.update((t.task_id, t) for t in read_trajectories(path, on_error="skip") if t.task_id == tid)
            traj = stored.get(tid)
            if traj is not None and traj.won:
                won.append(traj)
        chosen.extend(won)
    return chosen


def rendered_demos(trajectories: Sequence[Trajectory], rendering: str = "raw",
                   experiences_of: Callable[[Trajectory], dict | None] | None = None) -> dict[str, list[str]]:
    """Task type -> rendered demonstrations of the won trajectories (for the ReAct prompt).

    ``experiences_of(trajectory)``: its reviewed experiences (rendering "experience").
    """
    demos: dict[str, list[str]] = defaultdict(list)
    for t in trajectories:
        if t.won:
            experiences = experiences_of(t) if experiences_of is not None else None
            demos[t.task_type].append(render_demo(t.instruction, t.observation, t.steps, rendering, experiences))
    return dict(demos)
