"""Expert trajectory collection: play each task with the adapter's expert and append it to JSONL.

Each finished task becomes one :class:`~cb_io.records.Trajectory` line, appended atomically
(:func:`~cb_io.storage.append_jsonl`) as soon as the task ends, so an interrupted collection
loses at most the task in flight; with ``resume=True`` the tasks already stored are skipped.
Every environment step keeps the full candidate set the expert chose from (seed Sec. 3.2), and every
trajectory's ``meta`` records its split. Only collection runs an adapter's expert (``Episode(...,
expert=True)``).
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

from cb_io.records import Trajectory, completed_task_ids, one_line
from cb_io.storage import append_jsonl
from envs.episode import Episode
from envs.episode import time_limit as limit
from envs.protocol import Environment


@dataclass
class CollectSummary:
    """What a collection run did.

    Attributes:
        collected: trajectories appended in this run; won: how many of them the expert won.
        skipped: task ids skipped because ``out_path`` already held them (resume).
        failed: task id -> one-line error message for tasks whose engine raised (nothing appended;
            a resumed run retries them).
        n_env_steps: environment steps played; seconds: wall time of the run.
        candidate_set_sizes: size of every saved candidate set (for reporting).
    """

    collected: int = 0
    won: int = 0
    skipped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    n_env_steps: int = 0
    seconds: float = 0.0
    candidate_set_sizes: list[int] = field(default_factory=list)


def select_tasks(env: Environment, split: str, n_per_type: int | None = None) -> list[str]:
    """The split's task ids, or the first ``n_per_type`` of each task type (ids in sorted order).

    Raises:
        ValueError: ``n_per_type < 1`` or an unknown split (from the adapter).
    """
    ids = list(env.tasks(split))
    if n_per_type is None:
        return ids
    if n_per_type < 1:
        raise ValueError(f"n_per_type must be >= 1, got {n_per_type}")
    type_of = getattr(env, "task_type_of", None)
    if type_of is None:
        raise ValueError(f"{type(env).__name__} cannot tell a task's type before reset; pass task ids instead")
    per_type: dict[str, list[str]] = defaultdict(list)
    for tid in ids:
        bucket = per_type[type_of(tid)]
        if len(bucket) < n_per_type:
            bucket.append(tid)
    chosen = {tid for bucket in per_type.values() for tid in bucket}
    return [tid for tid in ids if tid in chosen]


def play_expert(env: Environment, task_id: str, max_steps: int | None = None, split: str | None = None,
                ) -> Trajectory:
    """Play ``task_id`` with the adapter's expert until done, the budget, or the expert stops.

    ``split``: the split the task must belong to (ValueError otherwise, see :class:`Episode`).

    The expert's action must be in the candidate set of its state (seed Sec. 3.2). When it is not:
    for an adapter whose sets are complete (ALFWorld, TextWorld) the episode stops there and
    ``meta["expert_stopped"]`` says why; for one with ``complete_candidates = False`` (ScienceWorld,
    whose valid-combination list misses many valid actions) the expert action is appended to the
    saved set and the step is flagged ``info["expert_appended"] = True``.
    """
    episode = Episode(env, task_id, max_steps, split=split, expert=True)
    stopped = None
    while not episode.done:
        action = episode.expert_action()
        if action is None:
            gave_up = getattr(env, "expert_gave_up", None)
            stopped = f"expert gave up: {gave_up}" if gave_up else "expert has no action"
            break
        appended = action not in episode.candidates()
        if appended and getattr(env, "complete_candidates", True):
            stopped = f"expert action {action!r} not in the candidate set"
            break
        episode.act(action)
        if appended:  # incomplete engine set (ScienceWorld): save the expert action with it, flagged
            last = episode.steps[-1]
            episode.steps[-1] = replace(
                last, candidates=[*last.candidates, action], info={**last.info, "expert_appended": True}
            )
    meta = {"expert": getattr(env, "expert_name", "expert")}
    if stopped is not None:
        meta["expert_stopped"] = stopped
    config = getattr(env, "config", None)
    if callable(config):
        meta["env_config"] = config()
    return episode.trajectory(meta=meta)


#: Why :func:`expert_answers` has no label for a state.
GAVE_UP, NO_ANSWER, NOT_A_CANDIDATE, REPLAY_DIFFERS = "expert gave up", "no answer", "not a candidate", "replay differs"


def expert_answers(env: Environment, trajectory: Trajectory) -> list[tuple[str | None, str | None]]:
    """The adapter's expert asked in every state of ``trajectory`` (an agent's episode, won or
    lost): per environment step, ``(expert action, None)`` or ``(None, why)``.

    The episode is replayed action for action in a fresh episode reset with its expert
    (``Episode(..., expert=True)``; the engines offer no state cloning), and before each recorded
    action the expert is asked what it would do there; the expert runs along the replayed
    actions, so an adapter with ``expert_labels_any_state`` answers off its own path too. Why a
    state has no label: :data:`GAVE_UP` (ALFWorld's ``expert_gave_up``), :data:`NO_ANSWER` (the
    expert answered nothing: game over or lost, no policy), :data:`NOT_A_CANDIDATE` (its action is
    outside the state's saved candidate set) or :data:`REPLAY_DIFFERS` (a replayed observation
    differed from the recorded one: this state and every later one).

    Raises:
        ValueError: ``trajectory`` is not a game of ``env``.
        cb_io.records.EngineError: the engine failed during the replay.
    """
    steps = [s for s in trajectory.steps if s.kind == "env"]
    episode = Episode(env, trajectory.task_id, len(steps) + 1, expert=True)
    out: list[tuple[str | None, str | None]] = []
    for step in steps:
        if episode.done:  # the replay went elsewhere and ended early
            out.append((None, REPLAY_DIFFERS))
            continue
        action = episode.expert_action()
        if action is None:
            out.append((None, GAVE_UP if getattr(env, "expert_gave_up", None) else NO_ANSWER))
        else:
            out.append((action, None) if action in (step.candidates or []) else (None, NOT_A_CANDIDATE))
        episode.act(step.action)
        if episode.steps[-1].observation.strip() != step.observation.strip():
            out += [(None, REPLAY_DIFFERS)] * (len(steps) - len(out))  # the later states are not the recorded ones
            break
    return out


def collect_expert_trajectories(
    env: Environment,
    task_ids: Sequence[str],
    out_path: str | os.PathLike,
    resume: bool = True,
    max_steps: int | None = None,
    on_task: Callable[[str, Trajectory | None, CollectSummary], None] | None = None,
    split: str | None = None,
    time_limit: float | None = None,
) -> CollectSummary:
    """Collect one expert trajectory per task into ``out_path`` (JSONL, appended atomically).

    Args:
        task_ids: tasks to play, in order (duplicates are played once).
        resume: skip tasks already stored in ``out_path``; with ``False`` a file that already holds
            one of ``task_ids`` is refused (ValueError; nothing is removed or duplicated).
        max_steps: the step budget per task (default: the adapter's ``default_max_steps``).
        on_task: called after each task with (task_id, trajectory or None if skipped/failed,
            summary so far), e.g. to advance a progress bar.
        split: the split every task must belong to (checked per task; recorded in ``meta``).
        time_limit: wall-clock seconds of one task's episode (:func:`envs.episode.time_limit`);
            past it the task is recorded in ``failed`` like an engine error. None: no limit.

    Returns:
        A :class:`CollectSummary`. Engine errors on one task are recorded in ``failed`` and the
        run goes on; ``KeyboardInterrupt`` stops it with everything finished so far on disk.
    """
    out_path = Path(out_path)
    stored = completed_task_ids(out_path)
    if not resume and stored & set(task_ids):
        raise ValueError(f"{out_path} already holds {len(stored & set(task_ids))} of these tasks; pass --resume "
                         "to continue it, or choose another output file")
    summary = CollectSummary()
    start = time.perf_counter()
    for task_id in dict.fromkeys(task_ids):
        if task_id in stored:
            summary.skipped.append(task_id)
            if on_task:
                on_task(task_id, None, summary)
            continue
        try:
            with limit(time_limit):
                traj = play_expert(env, task_id, max_steps, split)
        except (KeyboardInterrupt, ValueError):
            raise
        except Exception as err:  # an engine crash on one task must not end the collection
            summary.failed[task_id] = one_line(err)
            if on_task:
                on_task(task_id, None, summary)
            continue
        append_jsonl(out_path, traj)
        summary.collected += 1
        summary.won += int(traj.won)
        for s in traj.steps:
            if s.kind == "env":
                summary.n_env_steps += 1
                summary.candidate_set_sizes.append(len(s.candidates or ()))
        if on_task:
            on_task(task_id, traj, summary)
    summary.seconds = time.perf_counter() - start
    return summary
